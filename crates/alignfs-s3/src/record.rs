//! What the gateway keeps beside an object's bytes, in the attribute the object store
//! publishes with it (JSON: small, and readable in a dump), and the multipart uploads in
//! progress, kept as objects of a bucket S3 cannot name.

use s3s::dto::{ContentType, Metadata};

use crate::body::Received;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// An object's S3 attributes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectRecord {
    /// The ETag without quotes: the MD5 in hex, or for a multipart upload the MD5 of its
    /// parts' MD5s followed by `-` and the number of parts.
    pub etag: String,
    #[serde(default, skip_serializing_if = "Headers::is_empty")]
    pub headers: Headers,
    /// User metadata (`x-amz-meta-*`), names in lower case.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
    /// A checksum the client sent and the gateway verified: algorithm and base64 value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checksum: Option<(String, String)>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parts: Option<u32>,
}

/// The standard headers a client sets on an object and gets back with it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Headers {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_encoding: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_disposition: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_language: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_control: Option<String>,
}

impl Headers {
    fn is_empty(&self) -> bool {
        *self == Headers::default()
    }
}

/// A multipart upload in progress: where its object will go and with what attributes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UploadRecord {
    pub bucket: String,
    pub key: String,
    pub record: ObjectRecord,
    pub initiated_ns: i64,
}

/// One uploaded part.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartRecord {
    /// The part's MD5 in hex.
    pub etag: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checksum: Option<(String, String)>,
}

/// Encode a record for the object store.
pub fn encode<T: Serialize>(record: &T) -> Vec<u8> {
    // Serializing these plain structs cannot fail (no maps with non-string keys).
    serde_json::to_vec(record).unwrap_or_default()
}

/// Decode a record; a damaged one is an error naming what it belongs to.
pub fn decode<T: for<'de> Deserialize<'de>>(bytes: &[u8], what: &str) -> Result<T, String> {
    serde_json::from_slice(bytes).map_err(|e| format!("the S3 attributes of {what} are damaged: {e}"))
}

/// User metadata as kept: names in lower case, as S3 returns them.
pub(crate) fn user_metadata(metadata: Option<Metadata>) -> BTreeMap<String, String> {
    metadata.unwrap_or_default().into_iter().map(|(k, v)| (k.to_ascii_lowercase(), v)).collect()
}

pub(crate) fn object_record(headers: Headers, metadata: Option<Metadata>, received: &Received) -> ObjectRecord {
    ObjectRecord { etag: received.md5_hex(), headers, metadata: user_metadata(metadata), checksum: received.checksum.clone(), parts: None }
}

pub(crate) fn headers_of(
    content_type: Option<ContentType>,
    content_encoding: Option<String>,
    content_disposition: Option<String>,
    content_language: Option<String>,
    cache_control: Option<String>,
) -> Headers {
    Headers { content_type, content_encoding, content_disposition, content_language, cache_control }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_damage_is_an_error() {
        let record = ObjectRecord {
            etag: "abc".into(),
            headers: Headers { content_type: Some("text/plain".into()), ..Headers::default() },
            metadata: [("color".to_string(), "blue".to_string())].into(),
            checksum: Some(("CRC32".into(), "AAAAAA==".into())),
            parts: Some(3),
        };
        assert_eq!(decode::<ObjectRecord>(&encode(&record), "x").unwrap(), record);
        let plain = ObjectRecord { etag: "e".into(), ..ObjectRecord::default() };
        assert_eq!(encode(&plain), br#"{"etag":"e"}"#);
        assert!(decode::<ObjectRecord>(b"{\"etag\":", "bucket/key").unwrap_err().contains("bucket/key"));
    }
}
