//! Receiving a request body into a staged object: the bytes are written as they arrive,
//! in block-aligned pieces (so the object store sees whole blocks, not the network's
//! chunk boundaries), while their MD5 and the checksum the client declared are computed.
//! Only a body that arrived whole, within the size limit and matching every digest the
//! client sent, reaches the closure that publishes it; anything else drops the staged
//! object and changes nothing.

use std::sync::Arc;

use alignfs::personality::{ObjectStore, Staged};
use bytes::Bytes;
use futures::StreamExt;
use md5::{Digest as _, Md5};
use s3s::dto::StreamingBlob;
use s3s::{s3_error, S3Error, S3ErrorCode, S3Result};
use tokio::sync::mpsc;

use crate::errors::storage_error;

/// Bytes written to the staged object at a time: a multiple of every block size.
const WRITE_BYTES: usize = 1 << 20;

/// A checksum algorithm of S3's `x-amz-checksum-*` headers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Algorithm {
    Crc32,
    Crc32c,
    Crc64Nvme,
    Sha1,
    Sha256,
}

impl Algorithm {
    pub const ALL: [Algorithm; 5] = [Algorithm::Crc32, Algorithm::Crc32c, Algorithm::Crc64Nvme, Algorithm::Sha1, Algorithm::Sha256];

    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Crc32 => "CRC32",
            Algorithm::Crc32c => "CRC32C",
            Algorithm::Crc64Nvme => "CRC64NVME",
            Algorithm::Sha1 => "SHA1",
            Algorithm::Sha256 => "SHA256",
        }
    }

    /// The header (or trailer) carrying this checksum.
    pub fn header(self) -> String {
        format!("x-amz-checksum-{}", self.name().to_ascii_lowercase())
    }

    pub fn from_name(name: &str) -> Option<Algorithm> {
        Algorithm::ALL.into_iter().find(|a| a.name().eq_ignore_ascii_case(name))
    }

    fn hasher(self) -> Hasher {
        match self {
            Algorithm::Crc32 => Hasher::Crc(crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc32IsoHdlc), 4),
            Algorithm::Crc32c => Hasher::Crc(crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc32Iscsi), 4),
            Algorithm::Crc64Nvme => Hasher::Crc(crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc64Nvme), 8),
            Algorithm::Sha1 => Hasher::Sha1(sha1::Sha1::new()),
            Algorithm::Sha256 => Hasher::Sha256(sha2::Sha256::new()),
        }
    }
}

enum Hasher {
    /// A CRC digest and its width in bytes.
    Crc(crc_fast::Digest, usize),
    Sha1(sha1::Sha1),
    Sha256(sha2::Sha256),
}

impl Hasher {
    fn update(&mut self, data: &[u8]) {
        match self {
            Hasher::Crc(digest, _) => digest.update(data),
            Hasher::Sha1(digest) => digest.update(data),
            Hasher::Sha256(digest) => digest.update(data),
        }
    }

    /// The value as S3 sends it: base64 of the big-endian bytes.
    fn finish(self) -> String {
        let bytes = match self {
            Hasher::Crc(digest, width) => digest.finalize().to_be_bytes()[8 - width..].to_vec(),
            Hasher::Sha1(digest) => digest.finalize().to_vec(),
            Hasher::Sha256(digest) => digest.finalize().to_vec(),
        };
        base64_simd::STANDARD.encode_to_string(bytes)
    }
}

/// What the client said the body would be.
#[derive(Clone, Debug, Default)]
pub struct Declared {
    /// `Content-MD5`, base64.
    pub md5: Option<String>,
    /// The checksum algorithm, and its value if it came in a header (a trailer brings it
    /// after the body).
    pub checksum: Option<(Algorithm, Option<String>)>,
    /// `Content-Length`, if given.
    pub length: Option<u64>,
}

/// A body received whole and checked.
#[derive(Clone, Debug)]
pub struct Received {
    pub md5: [u8; 16],
    /// The verified checksum: algorithm name and base64 value.
    pub checksum: Option<(String, String)>,
}

impl Received {
    pub fn md5_hex(&self) -> String {
        hex(&self.md5)
    }
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

enum Message {
    Data(Bytes),
    /// The body ended; the checksum value that came in a trailer, if any.
    End(Option<String>),
}

/// Receive `body` (at most `limit` bytes) into a new staged object, then hand it to
/// `publish` with what was received. `trailers` gives the trailing headers once the
/// body is read.
pub async fn receive<T, F>(
    store: Arc<ObjectStore>,
    body: Option<StreamingBlob>,
    declared: Declared,
    limit: u64,
    trailers: Option<s3s::TrailingHeaders>,
    publish: F,
) -> S3Result<T>
where
    T: Send + 'static,
    F: for<'a> FnOnce(&'a ObjectStore, Staged<'a>, Received) -> S3Result<T> + Send + 'static,
{
    if let Some(length) = declared.length {
        if length > limit {
            return Err(S3Error::with_message(
                S3ErrorCode::EntityTooLarge,
                format!("{length} bytes is over this gateway's limit of {limit}"),
            ));
        }
    }
    let (sender, receiver) = mpsc::channel::<Message>(4);
    let expected = declared.clone();
    let writer = tokio::task::spawn_blocking(move || write_staged(&store, receiver, expected, publish));
    let (received, mut failure) = match body {
        Some(body) => forward(body, &sender, limit).await,
        None => (0, None),
    };
    if failure.is_none() {
        if let Some(length) = declared.length {
            if received != length {
                failure = Some(S3Error::with_message(
                    S3ErrorCode::IncompleteBody,
                    format!("Content-Length said {length} bytes, the body held {received}"),
                ));
            }
        }
    }
    if failure.is_none() {
        let _ = sender.send(Message::End(trailer_checksum(&declared, trailers))).await;
    }
    drop(sender);
    let written = writer.await.map_err(|e| S3Error::with_message(S3ErrorCode::InternalError, format!("the writer stopped: {e}")))?;
    match failure {
        Some(error) => Err(error),
        None => written,
    }
}

/// Sends `body`'s chunks to the writer until it ends, breaks off, passes `limit`, or the
/// writer stops (its error is then the answer). Returns the bytes received and why the
/// body was refused, if it was.
async fn forward(mut body: StreamingBlob, sender: &mpsc::Sender<Message>, limit: u64) -> (u64, Option<S3Error>) {
    let mut received = 0u64;
    while let Some(chunk) = body.next().await {
        let chunk = match chunk {
            Ok(chunk) => chunk,
            Err(e) => return (received, Some(broken_body(e))),
        };
        received += chunk.len() as u64;
        if received > limit {
            let error =
                S3Error::with_message(S3ErrorCode::EntityTooLarge, format!("the body is over this gateway's limit of {limit} bytes"));
            return (received, Some(error));
        }
        if sender.send(Message::Data(chunk)).await.is_err() {
            break;
        }
    }
    (received, None)
}

/// The answer to a body that broke off: s3s reports a payload whose signature or hash
/// does not match this way, and the body timeout too.
fn broken_body(e: s3s::StdError) -> S3Error {
    match e.downcast::<S3Error>() {
        Ok(e) => *e,
        Err(e) if crate::timeouts::BodyTimedOut::caused(e.as_ref()) => S3Error::with_message(S3ErrorCode::RequestTimeout, e.to_string()),
        Err(e) => S3Error::with_message(S3ErrorCode::IncompleteBody, format!("the request body broke off: {e}")),
    }
}

/// The checksum a trailer carried, when the request said one would follow the body.
fn trailer_checksum(declared: &Declared, trailers: Option<s3s::TrailingHeaders>) -> Option<String> {
    let Some((algorithm, None)) = &declared.checksum else { return None };
    let header = algorithm.header();
    trailers.and_then(|t| t.read(|headers| headers.get(&header).and_then(|v| v.to_str().ok()).map(str::to_string))).flatten()
}

fn write_staged<T, F>(store: &ObjectStore, mut receiver: mpsc::Receiver<Message>, declared: Declared, publish: F) -> S3Result<T>
where
    F: for<'a> FnOnce(&'a ObjectStore, Staged<'a>, Received) -> S3Result<T>,
{
    let staged = store.stage().map_err(|e| storage_error(e, "a staged object"))?;
    let mut md5 = Md5::new();
    let mut checksum = declared.checksum.as_ref().map(|(algorithm, _)| algorithm.hasher());
    let mut pending: Vec<u8> = Vec::with_capacity(WRITE_BYTES);
    let mut offset = 0u64;
    let trailer = loop {
        match receiver.blocking_recv() {
            Some(Message::Data(chunk)) => {
                md5.update(&chunk);
                if let Some(hasher) = &mut checksum {
                    hasher.update(&chunk);
                }
                let mut rest = &chunk[..];
                while !rest.is_empty() {
                    let take = rest.len().min(WRITE_BYTES - pending.len());
                    pending.extend_from_slice(&rest[..take]);
                    rest = &rest[take..];
                    if pending.len() == WRITE_BYTES {
                        staged.write(offset, &pending).map_err(|e| storage_error(e, "a staged object"))?;
                        offset += WRITE_BYTES as u64;
                        pending.clear();
                    }
                }
            }
            Some(Message::End(trailer)) => break trailer,
            // The request failed; the receiving side has the error.
            None => return Err(s3_error!(IncompleteBody)),
        }
    };
    if !pending.is_empty() {
        staged.write(offset, &pending).map_err(|e| storage_error(e, "a staged object"))?;
    }
    let md5: [u8; 16] = md5.finalize().into();
    if let Some(expected) = &declared.md5 {
        let given =
            base64_simd::STANDARD.decode_to_vec(expected.trim()).map_err(|_| s3_error!(InvalidDigest, "Content-MD5 is not base64"))?;
        if given != md5 {
            return Err(S3Error::with_message(S3ErrorCode::BadDigest, "the Content-MD5 you specified did not match what was received"));
        }
    }
    let checksum = match (declared.checksum, checksum) {
        (Some((algorithm, header)), Some(hasher)) => {
            let computed = hasher.finish();
            let Some(expected) = header.or(trailer) else {
                return Err(S3Error::with_message(
                    S3ErrorCode::InvalidRequest,
                    format!("the {} checksum was announced but never sent", algorithm.name()),
                ));
            };
            if expected.trim() != computed {
                return Err(S3Error::with_message(
                    S3ErrorCode::BadDigest,
                    format!("the {} checksum you specified did not match the calculated checksum", algorithm.name()),
                ));
            }
            Some((algorithm.name().to_string(), computed))
        }
        _ => None,
    };
    publish(store, staged, Received { md5, checksum })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksums_match_the_published_test_values() {
        // "123456789", the CRC catalogue's check input.
        let check = |algorithm: Algorithm| {
            let mut hasher = algorithm.hasher();
            hasher.update(b"12345");
            hasher.update(b"6789");
            base64_simd::STANDARD.decode_to_vec(hasher.finish()).unwrap_or_default()
        };
        assert_eq!(check(Algorithm::Crc32), 0xCBF4_3926u32.to_be_bytes());
        assert_eq!(check(Algorithm::Crc32c), 0xE306_9283u32.to_be_bytes());
        assert_eq!(check(Algorithm::Crc64Nvme), 0xAE8B_1486_0A79_9888u64.to_be_bytes());
        assert_eq!(hex(&check(Algorithm::Sha1)), "f7c3bc1d808e04732adf679965ccc34ca7ae3441");
        assert_eq!(Algorithm::from_name("crc32c"), Some(Algorithm::Crc32c));
        assert_eq!(Algorithm::Crc64Nvme.header(), "x-amz-checksum-crc64nvme");
    }
}
