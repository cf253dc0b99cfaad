//! The object store as the gateway sees it: buckets by name (the uploads bucket hidden),
//! new keys checked, times and ETags as S3 writes them.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use alignfs::personality::{Bucket, ObjectStore};
use alignfs::Error;
use s3s::dto::*;
use s3s::{s3_error, S3Error, S3ErrorCode, S3Result};

use crate::errors::storage_error;

/// The bucket holding multipart uploads in progress: a name S3 cannot address (bucket
/// names start with a letter or digit), so no client can list or overwrite it.
pub(crate) const UPLOADS: &[u8] = b".uploads";

pub(crate) fn bucket<'s>(store: &'s ObjectStore, name: &str) -> S3Result<Bucket<'s>> {
    if name.as_bytes() == UPLOADS {
        return Err(s3_error!(NoSuchBucket));
    }
    store.bucket(name.as_bytes()).map_err(|e| match e {
        Error::NotFound => S3Error::with_message(S3ErrorCode::NoSuchBucket, format!("bucket {name} does not exist")),
        other => storage_error(other, name),
    })
}

pub(crate) fn uploads(store: &ObjectStore) -> S3Result<Bucket<'_>> {
    store.bucket(UPLOADS).map_err(|e| storage_error(e, "the uploads bucket"))
}

/// Refuse a new object's key that an S3 response could not carry as it is: XML 1.0 has
/// no way to write most control characters (not even as references), and its parsers
/// turn a carriage return into a line feed. Such a key would make every listing of its
/// bucket unreadable to clients that do not ask for URL-encoded names (s3cmd), and come
/// back changed to the others.
pub(crate) fn check_new_key(key: &str) -> S3Result<()> {
    match key.chars().find(|&c| (c < ' ' && c != '\t' && c != '\n') || c == '\u{FFFE}' || c == '\u{FFFF}') {
        Some(c) => Err(S3Error::with_message(
            S3ErrorCode::InvalidArgument,
            format!("the key holds the character U+{:04X}, which S3's XML responses cannot carry", u32::from(c)),
        )),
        None => Ok(()),
    }
}

pub(crate) fn timestamp(ns: i64) -> Timestamp {
    let time = if ns >= 0 { UNIX_EPOCH + Duration::from_nanos(ns as u64) } else { UNIX_EPOCH };
    Timestamp::from(time)
}

pub(crate) fn now_ns() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as i64)
}

pub(crate) fn quoted(etag: &str) -> ETag {
    ETag::Strong(etag.to_string())
}
