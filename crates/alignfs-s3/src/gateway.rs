//! The S3 operations, over an [`ObjectStore`]. Every store call is blocking, so each
//! runs on tokio's blocking pool; bodies stream through [`crate::body`].

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use alignfs::personality::{Bucket, ObjectHandle, ObjectStore};
use alignfs::Error;
use bytes::Bytes;
use md5::{Digest as _, Md5};
use s3s::dto::*;
use s3s::{s3_error, S3Error, S3ErrorCode, S3Request, S3Response, S3Result, S3};

use crate::body::{self, hex, Algorithm, Declared, Received};
use crate::listing;
use crate::record::{self, Headers, ObjectRecord, PartRecord, UploadRecord};

/// The bucket holding multipart uploads in progress: a name S3 cannot address (bucket
/// names start with a letter or digit), so no client can list or overwrite it.
const UPLOADS: &[u8] = b".uploads";

/// Bytes read from the store per piece of a GET's body.
const READ_BYTES: usize = 1 << 20;

/// What the gateway accepts.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Largest object a PUT may write, and largest part (S3: 5 GiB).
    pub max_object_bytes: u64,
    /// Smallest part of a multipart upload but the last (S3: 5 MiB).
    pub min_part_bytes: u64,
    /// Most parts of an upload (S3: 10 000).
    pub max_parts: u32,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits { max_object_bytes: 5 << 30, min_part_bytes: 5 << 20, max_parts: 10_000 }
    }
}

#[derive(Clone)]
pub struct Gateway {
    store: Arc<ObjectStore>,
    limits: Limits,
    next_upload: Arc<AtomicU64>,
}

impl Gateway {
    /// Serve `store`; creates the uploads bucket if the store has none.
    pub fn new(store: Arc<ObjectStore>, limits: Limits) -> alignfs::Result<Gateway> {
        match store.create_bucket(UPLOADS) {
            Ok(()) | Err(Error::Exists) | Err(Error::ReadOnly) => {}
            Err(e) => return Err(e),
        }
        Ok(Gateway { store, limits, next_upload: Arc::new(AtomicU64::new(0)) })
    }

    /// Run `f` on the blocking pool with the store.
    pub(crate) async fn blocking<T: Send + 'static>(&self, f: impl FnOnce(&ObjectStore) -> S3Result<T> + Send + 'static) -> S3Result<T> {
        let store = Arc::clone(&self.store);
        tokio::task::spawn_blocking(move || f(&store))
            .await
            .map_err(|e| S3Error::with_message(S3ErrorCode::InternalError, format!("a store task stopped: {e}")))?
    }
}

/// An engine error as S3 says it; `what` names the bucket or object concerned.
pub fn storage_error(error: Error, what: &str) -> S3Error {
    let (code, message) = match &error {
        Error::NotFound => (S3ErrorCode::NoSuchKey, format!("{what} does not exist")),
        Error::NameTooLong => {
            (S3ErrorCode::KeyTooLongError, format!("{what}: the key is too long (at most 255 bytes, each '/' counting twice)"))
        }
        Error::InvalidName(m) => (S3ErrorCode::InvalidArgument, m.clone()),
        Error::NoSpace | Error::MetadataFull(_) => (S3ErrorCode::ServiceUnavailable, format!("{what}: the volume is full ({error})")),
        Error::ReadOnly => (S3ErrorCode::AccessDenied, "the gateway serves this store read-only".to_string()),
        _ => (S3ErrorCode::InternalError, format!("{what}: {error}")),
    };
    // A client asking for what is not there is no event; the gateway failing is.
    match &code {
        S3ErrorCode::InternalError => tracing::error!(%error, what, "S3 request failed"),
        S3ErrorCode::ServiceUnavailable => tracing::warn!(%error, what, "S3 request failed"),
        _ => tracing::debug!(%error, what, "S3 request refused"),
    }
    S3Error::with_message(code, message)
}

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
fn check_new_key(key: &str) -> S3Result<()> {
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

fn now_ns() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as i64)
}

pub(crate) fn quoted(etag: &str) -> ETag {
    ETag::Strong(etag.to_string())
}

/// The checksum a request declares: an algorithm with its value in a header, or an
/// algorithm whose value a trailer brings.
fn declared_checksum(
    algorithm: Option<&ChecksumAlgorithm>,
    values: [(Algorithm, Option<&String>); 5],
    headers: &hyper::HeaderMap,
) -> S3Result<Option<(Algorithm, Option<String>)>> {
    let given: Vec<(Algorithm, &String)> = values.iter().filter_map(|(a, v)| v.map(|v| (*a, v))).collect();
    if given.len() > 1 {
        return Err(s3_error!(InvalidRequest, "more than one checksum header"));
    }
    if let Some((algorithm, value)) = given.first() {
        return Ok(Some((*algorithm, Some((*value).clone()))));
    }
    let trailer = headers.get("x-amz-trailer").and_then(|v| v.to_str().ok()).map(str::to_ascii_lowercase);
    if let Some(trailer) = trailer {
        if let Some(algorithm) = Algorithm::ALL.into_iter().find(|a| a.header() == trailer) {
            return Ok(Some((algorithm, None)));
        }
    }
    match algorithm {
        Some(name) => match Algorithm::from_name(name.as_str()) {
            // Announced but neither in a header nor a trailer: nothing to verify against.
            Some(_) => Ok(None),
            None => Err(S3Error::with_message(S3ErrorCode::InvalidRequest, format!("unknown checksum algorithm {}", name.as_str()))),
        },
        None => Ok(None),
    }
}

/// What a PUT or UploadPart request says its body will be. (The two inputs are distinct
/// types with the same field names.)
macro_rules! declared_body {
    ($input:expr, $headers:expr) => {{
        let input = &$input;
        let checksum = declared_checksum(
            input.checksum_algorithm.as_ref(),
            [
                (Algorithm::Crc32, input.checksum_crc32.as_ref()),
                (Algorithm::Crc32c, input.checksum_crc32c.as_ref()),
                (Algorithm::Crc64Nvme, input.checksum_crc64nvme.as_ref()),
                (Algorithm::Sha1, input.checksum_sha1.as_ref()),
                (Algorithm::Sha256, input.checksum_sha256.as_ref()),
            ],
            $headers,
        )?;
        Declared { md5: input.content_md5.clone(), checksum, length: input.content_length.map(|l| l.max(0) as u64) }
    }};
}

/// `$output { fields, the checksum_* fields from $checksum, ..default }`: the responses
/// that carry checksums are distinct types with the same field names.
macro_rules! with_checksums {
    ($output:ident, $checksum:expr, { $($field:ident: $value:expr),* $(,)? }) => {{
        let [crc32, crc32c, crc64nvme, sha1, sha256] = checksum_fields($checksum).map(|(_, v)| v);
        $output {
            $($field: $value,)*
            checksum_crc32: crc32,
            checksum_crc32c: crc32c,
            checksum_crc64nvme: crc64nvme,
            checksum_sha1: sha1,
            checksum_sha256: sha256,
            ..$output::default()
        }
    }};
}

/// The fields a GET and a HEAD answer both with, from the object's record and time; the
/// checksum only when `$whole` object is sent.
macro_rules! object_output {
    ($output:ident, $record:expr, $mtime:expr, $whole:expr, { $($field:ident: $value:expr),* $(,)? }) => {{
        let record: ObjectRecord = $record;
        let checksum = if $whole { record.checksum.clone() } else { None };
        with_checksums!($output, &checksum, {
            $($field: $value,)*
            accept_ranges: Some("bytes".into()),
            last_modified: Some(timestamp($mtime)),
            e_tag: Some(quoted(&record.etag)),
            metadata: Some(record.metadata.into_iter().collect()),
            content_type: record.headers.content_type,
            content_encoding: record.headers.content_encoding,
            content_disposition: record.headers.content_disposition,
            content_language: record.headers.content_language,
            cache_control: record.headers.cache_control,
            parts_count: record.parts.map(|p| p as i32),
        })
    }};
}

fn checksum_fields(record: &Option<(String, String)>) -> [(Algorithm, Option<String>); 5] {
    Algorithm::ALL.map(|a| (a, record.as_ref().filter(|(name, _)| name == a.name()).map(|(_, v)| v.clone())))
}

/// User metadata as kept: names in lower case, as S3 returns them.
fn user_metadata(metadata: Option<Metadata>) -> BTreeMap<String, String> {
    metadata.unwrap_or_default().into_iter().map(|(k, v)| (k.to_ascii_lowercase(), v)).collect()
}

/// A record that does not decode: the store holds damage, not a client error.
fn damaged(message: String) -> S3Error {
    S3Error::with_message(S3ErrorCode::InternalError, message)
}

fn object_record(headers: Headers, metadata: Option<Metadata>, received: &Received) -> ObjectRecord {
    ObjectRecord { etag: received.md5_hex(), headers, metadata: user_metadata(metadata), checksum: received.checksum.clone(), parts: None }
}

fn read_record(handle: &ObjectHandle, what: &str) -> S3Result<ObjectRecord> {
    match &handle.attribute {
        Some(bytes) => record::decode(bytes, what).map_err(damaged),
        // An object written through the library, not the gateway.
        None => Ok(ObjectRecord::default()),
    }
}

/// A pinned object that unpins itself when the response body is done with it.
struct Pinned {
    store: Arc<ObjectStore>,
    handle: Option<ObjectHandle>,
}

impl Drop for Pinned {
    fn drop(&mut self) {
        if let Some(handle) = self.handle.take() {
            let _ = self.store.release(handle);
        }
    }
}

/// The body of a GET: `range` of a pinned object, read a piece at a time on the
/// blocking pool.
fn object_body(pinned: Pinned, range: std::ops::Range<u64>, what: String) -> StreamingBlob {
    let pinned = Arc::new(pinned);
    let stream = futures::stream::try_unfold(range.start, move |offset| {
        let (pinned, what) = (Arc::clone(&pinned), what.clone());
        let end = range.end;
        async move {
            if offset >= end {
                return Ok::<_, std::io::Error>(None);
            }
            let len = (end - offset).min(READ_BYTES as u64) as usize;
            let piece = tokio::task::spawn_blocking(move || {
                let mut buf = vec![0u8; len];
                let handle = pinned.handle.as_ref().ok_or_else(|| std::io::Error::other("object released"))?;
                let got = pinned.store.read_pinned(handle, offset, &mut buf).map_err(|e| std::io::Error::other(format!("{what}: {e}")))?;
                if got < len {
                    return Err(std::io::Error::other(format!("{what}: ended {} bytes early", len - got)));
                }
                Ok::<_, std::io::Error>(Bytes::from(buf))
            })
            .await
            .map_err(std::io::Error::other)??;
            Ok(Some((piece, offset + len as u64)))
        }
    });
    StreamingBlob::wrap(stream)
}

fn headers_of(
    content_type: Option<ContentType>,
    content_encoding: Option<String>,
    content_disposition: Option<String>,
    content_language: Option<String>,
    cache_control: Option<String>,
) -> Headers {
    Headers { content_type, content_encoding, content_disposition, content_language, cache_control }
}

fn check_conditions(etag: &str, if_match: Option<&ETagCondition>, if_none_match: Option<&ETagCondition>) -> S3Result<()> {
    let current = ETag::Strong(etag.to_string());
    if let Some(condition) = if_match {
        let matches = match condition {
            ETagCondition::Any => true,
            ETagCondition::ETag(tag) => tag.strong_cmp(&current),
        };
        if !matches {
            return Err(s3_error!(PreconditionFailed));
        }
    }
    if let Some(condition) = if_none_match {
        let matches = match condition {
            ETagCondition::Any => true,
            ETagCondition::ETag(tag) => tag.weak_cmp(&current),
        };
        if matches {
            let mut error = S3Error::new(S3ErrorCode::NotModified);
            error.set_status_code(hyper::StatusCode::NOT_MODIFIED);
            return Err(error);
        }
    }
    Ok(())
}

fn upload_what(upload_id: &str) -> String {
    format!("upload {upload_id}")
}

/// The upload's record, checked against the bucket and key the request names.
fn load_upload(store: &ObjectStore, upload_id: &str, bucket_name: &str, key: &str) -> S3Result<UploadRecord> {
    if upload_id.is_empty() || !upload_id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(s3_error!(NoSuchUpload));
    }
    let uploads = uploads(store)?;
    let attribute = match uploads.attribute(upload_id.as_bytes()) {
        Ok(Some(attribute)) => attribute,
        Ok(None) | Err(Error::NotFound) => return Err(s3_error!(NoSuchUpload)),
        Err(e) => return Err(storage_error(e, &upload_what(upload_id))),
    };
    let upload: UploadRecord = record::decode(&attribute, &upload_what(upload_id)).map_err(damaged)?;
    if upload.bucket != bucket_name || upload.key != key {
        return Err(s3_error!(NoSuchUpload, "the upload belongs to another object"));
    }
    Ok(upload)
}

fn part_name(upload_id: &str, part: u32) -> String {
    format!("{upload_id}/{part:05}")
}

/// Every part of an upload: number, size, record.
fn upload_parts(store: &ObjectStore, upload_id: &str) -> S3Result<Vec<(u32, u64, i64, PartRecord)>> {
    let uploads = uploads(store)?;
    let prefix = format!("{upload_id}/");
    let mut out = Vec::new();
    for object in uploads.list(prefix.as_bytes(), None, usize::MAX).map_err(|e| storage_error(e, &upload_what(upload_id)))? {
        let name = String::from_utf8_lossy(&object.name).into_owned();
        let Ok(number) = name[prefix.len()..].parse::<u32>() else { continue };
        let attribute = uploads.attribute(&object.name).map_err(|e| storage_error(e, &name))?.unwrap_or_default();
        let part: PartRecord = record::decode(&attribute, &name).map_err(damaged)?;
        out.push((number, object.size, object.mtime_ns, part));
    }
    Ok(out)
}

#[async_trait::async_trait]
impl S3 for Gateway {
    async fn list_buckets(&self, _req: S3Request<ListBucketsInput>) -> S3Result<S3Response<ListBucketsOutput>> {
        self.blocking(|store| {
            let buckets = store.buckets().map_err(|e| storage_error(e, "the bucket list"))?;
            let buckets = buckets
                .into_iter()
                .filter(|b| b.name != UPLOADS)
                .map(|b| s3s::dto::Bucket {
                    name: Some(String::from_utf8_lossy(&b.name).into_owned()),
                    creation_date: Some(timestamp(b.created_ns)),
                    ..s3s::dto::Bucket::default()
                })
                .collect();
            Ok(S3Response::new(ListBucketsOutput { buckets: Some(buckets), ..ListBucketsOutput::default() }))
        })
        .await
    }

    async fn create_bucket(&self, req: S3Request<CreateBucketInput>) -> S3Result<S3Response<CreateBucketOutput>> {
        let name = req.input.bucket;
        self.blocking(move |store| match store.create_bucket(name.as_bytes()) {
            Ok(()) => Ok(S3Response::new(CreateBucketOutput { location: Some(format!("/{name}")) })),
            Err(Error::Exists) => Err(s3_error!(BucketAlreadyOwnedByYou)),
            Err(e) => Err(storage_error(e, &name)),
        })
        .await
    }

    async fn delete_bucket(&self, req: S3Request<DeleteBucketInput>) -> S3Result<S3Response<DeleteBucketOutput>> {
        let name = req.input.bucket;
        self.blocking(move |store| {
            bucket(store, &name)?;
            match store.remove_bucket(name.as_bytes()) {
                Ok(()) => Ok(S3Response::new(DeleteBucketOutput {})),
                Err(Error::NotEmpty) => Err(s3_error!(BucketNotEmpty)),
                Err(e) => Err(storage_error(e, &name)),
            }
        })
        .await
    }

    async fn head_bucket(&self, req: S3Request<HeadBucketInput>) -> S3Result<S3Response<HeadBucketOutput>> {
        let name = req.input.bucket;
        self.blocking(move |store| bucket(store, &name).map(|_| S3Response::new(HeadBucketOutput::default()))).await
    }

    async fn get_bucket_location(&self, req: S3Request<GetBucketLocationInput>) -> S3Result<S3Response<GetBucketLocationOutput>> {
        let name = req.input.bucket;
        self.blocking(move |store| bucket(store, &name).map(|_| S3Response::new(GetBucketLocationOutput::default()))).await
    }

    async fn put_object(&self, req: S3Request<PutObjectInput>) -> S3Result<S3Response<PutObjectOutput>> {
        let input = req.input;
        check_new_key(&input.key)?;
        let declared = declared_body!(input, &req.headers);
        let (bucket_name, key) = (input.bucket.clone(), input.key.clone());
        let (if_match, if_none_match) = (input.if_match.clone(), input.if_none_match.clone());
        let headers =
            headers_of(input.content_type, input.content_encoding, input.content_disposition, input.content_language, input.cache_control);
        let metadata = input.metadata;
        // Refuse a missing bucket or a bad key before reading the body.
        {
            let (bucket_name, key) = (bucket_name.clone(), key.clone());
            self.blocking(move |store| {
                bucket(store, &bucket_name)?;
                alignfs::personality::encode_name(key.as_bytes()).map_err(|e| storage_error(e, &key)).map(drop)
            })
            .await?;
        }
        let limit = self.limits.max_object_bytes;
        let published = body::receive(
            Arc::clone(&self.store),
            input.body,
            declared,
            limit,
            req.trailing_headers,
            move |store, mut staged, received| {
                let target = bucket(store, &bucket_name)?;
                if if_match.is_some() || if_none_match.is_some() {
                    let current = match target.attribute(key.as_bytes()) {
                        Ok(attribute) => {
                            Some(attribute.and_then(|a| record::decode::<ObjectRecord>(&a, &key).ok()).unwrap_or_default().etag)
                        }
                        Err(Error::NotFound) => None,
                        Err(e) => return Err(storage_error(e, &key)),
                    };
                    match current {
                        Some(etag) => {
                            check_conditions(&etag, if_match.as_ref(), if_none_match.as_ref()).map_err(|_| s3_error!(PreconditionFailed))?
                        }
                        None if if_match.is_some() => return Err(s3_error!(NoSuchKey)),
                        None => {}
                    }
                }
                let record = object_record(headers, metadata, &received);
                staged.set_attribute(&record::encode(&record));
                let mut transaction = store.transaction();
                transaction.publish(staged, &target, key.as_bytes()).map_err(|e| storage_error(e, &key))?;
                transaction.commit().map_err(|e| storage_error(e, &key))?;
                Ok(record)
            },
        )
        .await?;
        Ok(S3Response::new(with_checksums!(PutObjectOutput, &published.checksum, { e_tag: Some(quoted(&published.etag)) })))
    }

    async fn get_object(&self, req: S3Request<GetObjectInput>) -> S3Result<S3Response<GetObjectOutput>> {
        let input = req.input;
        let (bucket_name, key) = (input.bucket.clone(), input.key.clone());
        let what = format!("{bucket_name}/{key}");
        let store = Arc::clone(&self.store);
        let (handle, record) = self
            .blocking({
                let what = what.clone();
                move |store| {
                    let target = bucket(store, &bucket_name)?;
                    let handle = target.open(key.as_bytes()).map_err(|e| storage_error(e, &what))?;
                    match read_record(&handle, &what) {
                        Ok(record) => Ok((handle, record)),
                        Err(e) => {
                            let _ = store.release(handle);
                            Err(e)
                        }
                    }
                }
            })
            .await?;
        let pinned = Pinned { store, handle: Some(handle) };
        let (size, mtime) = pinned.handle.as_ref().map_or((0, 0), |h| (h.size, h.mtime_ns));
        check_conditions(&record.etag, input.if_match.as_ref(), input.if_none_match.as_ref())?;
        let range = match &input.range {
            None => 0..size,
            Some(range) => range.check(size).map_err(|_| {
                S3Error::with_message(S3ErrorCode::InvalidRange, format!("the range is not satisfiable for an object of {size} bytes"))
            })?,
        };
        let content_range = input.range.as_ref().map(|_| format!("bytes {}-{}/{size}", range.start, range.end.saturating_sub(1)));
        let whole = input.range.is_none();
        let length = range.end - range.start;
        let output = object_output!(GetObjectOutput, record, mtime, whole, {
            body: Some(object_body(pinned, range, what)),
            content_length: Some(length as i64),
            content_range: content_range,
        });
        let status = if whole { None } else { Some(hyper::StatusCode::PARTIAL_CONTENT) };
        let mut response = S3Response::new(output);
        response.status = status;
        Ok(response)
    }

    async fn head_object(&self, req: S3Request<HeadObjectInput>) -> S3Result<S3Response<HeadObjectOutput>> {
        let input = req.input;
        let (bucket_name, key) = (input.bucket.clone(), input.key.clone());
        let (size, mtime, record) = self
            .blocking(move |store| {
                let what = format!("{bucket_name}/{key}");
                let target = bucket(store, &bucket_name)?;
                let handle = target.open(key.as_bytes()).map_err(|e| storage_error(e, &what))?;
                let record = read_record(&handle, &what);
                let (size, mtime) = (handle.size, handle.mtime_ns);
                let _ = store.release(handle);
                Ok((size, mtime, record?))
            })
            .await?;
        check_conditions(&record.etag, input.if_match.as_ref(), input.if_none_match.as_ref())?;
        Ok(S3Response::new(object_output!(HeadObjectOutput, record, mtime, true, { content_length: Some(size as i64) })))
    }

    async fn delete_object(&self, req: S3Request<DeleteObjectInput>) -> S3Result<S3Response<DeleteObjectOutput>> {
        let (bucket_name, key) = (req.input.bucket, req.input.key);
        self.blocking(move |store| {
            let target = bucket(store, &bucket_name)?;
            match target.remove(key.as_bytes()) {
                // S3 answers a delete of a missing key with success.
                Ok(()) | Err(Error::NotFound) => Ok(S3Response::new(DeleteObjectOutput::default())),
                Err(e) => Err(storage_error(e, &key)),
            }
        })
        .await
    }

    async fn delete_objects(&self, req: S3Request<DeleteObjectsInput>) -> S3Result<S3Response<DeleteObjectsOutput>> {
        let (bucket_name, delete) = (req.input.bucket, req.input.delete);
        if delete.objects.len() > 1000 {
            return Err(s3_error!(MalformedXML, "at most 1000 keys per DeleteObjects"));
        }
        self.blocking(move |store| {
            let target = bucket(store, &bucket_name)?;
            let (mut deleted, mut errors) = (Vec::new(), Vec::new());
            for object in delete.objects {
                match target.remove(object.key.as_bytes()) {
                    Ok(()) | Err(Error::NotFound) => deleted.push(DeletedObject { key: Some(object.key), ..DeletedObject::default() }),
                    Err(e) => {
                        let error = storage_error(e, &object.key);
                        errors.push(s3s::dto::Error {
                            code: Some(error.code().as_str().to_string()),
                            key: Some(object.key),
                            message: error.message().map(str::to_string),
                            ..s3s::dto::Error::default()
                        });
                    }
                }
            }
            let quiet = delete.quiet.unwrap_or(false);
            Ok(S3Response::new(DeleteObjectsOutput {
                deleted: if quiet { None } else { Some(deleted) },
                errors: Some(errors),
                ..DeleteObjectsOutput::default()
            }))
        })
        .await
    }

    async fn copy_object(&self, req: S3Request<CopyObjectInput>) -> S3Result<S3Response<CopyObjectOutput>> {
        let input = req.input;
        check_new_key(&input.key)?;
        let CopySource::Bucket { bucket: source_bucket, key: source_key, version_id } = &input.copy_source else {
            return Err(s3_error!(NotImplemented, "copies from access points"));
        };
        if version_id.is_some() {
            return Err(s3_error!(NotImplemented, "this store keeps no versions"));
        }
        let (source_bucket, source_key) = (source_bucket.to_string(), source_key.to_string());
        let replace = input.metadata_directive.as_ref().is_some_and(|d| d.as_str() == MetadataDirective::REPLACE);
        let (bucket_name, key) = (input.bucket.clone(), input.key.clone());
        if !replace && source_bucket == bucket_name && source_key == key {
            return Err(s3_error!(InvalidRequest, "copying an object onto itself needs the REPLACE metadata directive"));
        }
        let headers =
            headers_of(input.content_type, input.content_encoding, input.content_disposition, input.content_language, input.cache_control);
        let metadata = input.metadata;
        let (if_match, if_none_match) = (input.copy_source_if_match, input.copy_source_if_none_match);
        let (etag, mtime) = self
            .blocking(move |store| {
                let what = format!("{source_bucket}/{source_key}");
                let source = bucket(store, &source_bucket)?;
                let target = bucket(store, &bucket_name)?;
                let source_record = match source.attribute(source_key.as_bytes()) {
                    Ok(attribute) => {
                        attribute.map(|a| record::decode::<ObjectRecord>(&a, &what)).transpose().map_err(damaged)?.unwrap_or_default()
                    }
                    Err(e) => return Err(storage_error(e, &what)),
                };
                check_conditions(&source_record.etag, if_match.as_ref(), if_none_match.as_ref())
                    .map_err(|_| s3_error!(PreconditionFailed))?;
                let record =
                    if replace { ObjectRecord { headers, metadata: user_metadata(metadata), ..source_record } } else { source_record };
                let mut staged = store.stage().map_err(|e| storage_error(e, "a staged object"))?;
                staged.clone_from(&source, source_key.as_bytes()).map_err(|e| storage_error(e, &what))?;
                staged.set_attribute(&record::encode(&record));
                let mut transaction = store.transaction();
                transaction.publish(staged, &target, key.as_bytes()).map_err(|e| storage_error(e, &key))?;
                transaction.commit().map_err(|e| storage_error(e, &key))?;
                Ok((record.etag, now_ns()))
            })
            .await?;
        Ok(S3Response::new(CopyObjectOutput {
            copy_object_result: Some(CopyObjectResult {
                e_tag: Some(quoted(&etag)),
                last_modified: Some(timestamp(mtime)),
                ..CopyObjectResult::default()
            }),
            ..CopyObjectOutput::default()
        }))
    }

    async fn list_objects_v2(&self, req: S3Request<ListObjectsV2Input>) -> S3Result<S3Response<ListObjectsV2Output>> {
        listing::objects_v2(self, req.input).await.map(S3Response::new)
    }

    async fn list_objects(&self, req: S3Request<ListObjectsInput>) -> S3Result<S3Response<ListObjectsOutput>> {
        listing::objects_v1(self, req.input).await.map(S3Response::new)
    }

    async fn create_multipart_upload(
        &self,
        req: S3Request<CreateMultipartUploadInput>,
    ) -> S3Result<S3Response<CreateMultipartUploadOutput>> {
        let input = req.input;
        check_new_key(&input.key)?;
        let (bucket_name, key) = (input.bucket.clone(), input.key.clone());
        let headers =
            headers_of(input.content_type, input.content_encoding, input.content_disposition, input.content_language, input.cache_control);
        let metadata: BTreeMap<String, String> = user_metadata(input.metadata);
        // Unique across restarts: the time, and a counter for uploads in the same tick.
        let upload_id = format!("{:016x}{:08x}", now_ns(), self.next_upload.fetch_add(1, Ordering::Relaxed) as u32);
        let id = upload_id.clone();
        self.blocking(move |store| {
            bucket(store, &bucket_name)?;
            alignfs::personality::encode_name(key.as_bytes()).map_err(|e| storage_error(e, &key))?;
            let upload = UploadRecord {
                bucket: bucket_name,
                key,
                record: ObjectRecord { headers, metadata, ..ObjectRecord::default() },
                initiated_ns: now_ns(),
            };
            let mut staged = store.stage().map_err(|e| storage_error(e, "a staged object"))?;
            staged.set_attribute(&record::encode(&upload));
            let mut transaction = store.transaction();
            transaction.publish(staged, &uploads(store)?, id.as_bytes()).map_err(|e| storage_error(e, &upload_what(&id)))?;
            transaction.commit().map_err(|e| storage_error(e, &upload_what(&id)))
        })
        .await?;
        Ok(S3Response::new(CreateMultipartUploadOutput {
            bucket: Some(input.bucket),
            key: Some(input.key),
            upload_id: Some(upload_id),
            ..CreateMultipartUploadOutput::default()
        }))
    }

    async fn upload_part(&self, req: S3Request<UploadPartInput>) -> S3Result<S3Response<UploadPartOutput>> {
        let input = req.input;
        let number = input.part_number;
        if number < 1 || number as u32 > self.limits.max_parts {
            return Err(S3Error::with_message(
                S3ErrorCode::InvalidArgument,
                format!("part numbers run from 1 to {}", self.limits.max_parts),
            ));
        }
        let declared = declared_body!(input, &req.headers);
        let (bucket_name, key, upload_id) = (input.bucket.clone(), input.key.clone(), input.upload_id.clone());
        {
            let (bucket_name, key, upload_id) = (bucket_name.clone(), key.clone(), upload_id.clone());
            self.blocking(move |store| load_upload(store, &upload_id, &bucket_name, &key).map(drop)).await?;
        }
        let limit = self.limits.max_object_bytes;
        let part = body::receive(
            Arc::clone(&self.store),
            input.body,
            declared,
            limit,
            req.trailing_headers,
            move |store, mut staged, received| {
                // The upload may have been completed or aborted while the part arrived.
                load_upload(store, &upload_id, &bucket_name, &key)?;
                let part = PartRecord { etag: received.md5_hex(), checksum: received.checksum.clone() };
                staged.set_attribute(&record::encode(&part));
                let name = part_name(&upload_id, number as u32);
                let mut transaction = store.transaction();
                transaction.publish(staged, &uploads(store)?, name.as_bytes()).map_err(|e| storage_error(e, &name))?;
                transaction.commit().map_err(|e| storage_error(e, &name))?;
                Ok(part)
            },
        )
        .await?;
        Ok(S3Response::new(with_checksums!(UploadPartOutput, &part.checksum, { e_tag: Some(quoted(&part.etag)) })))
    }

    async fn complete_multipart_upload(
        &self,
        req: S3Request<CompleteMultipartUploadInput>,
    ) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
        let input = req.input;
        let (bucket_name, key, upload_id) = (input.bucket.clone(), input.key.clone(), input.upload_id.clone());
        let listed: Vec<CompletedPart> = input.multipart_upload.and_then(|m| m.parts).unwrap_or_default();
        let limits = self.limits.clone();
        let etag = self
            .blocking(move |store| {
                let upload = load_upload(store, &upload_id, &bucket_name, &key)?;
                if listed.is_empty() {
                    return Err(s3_error!(MalformedXML, "the upload lists no parts"));
                }
                let parts = upload_parts(store, &upload_id)?;
                let mut previous = 0;
                let mut chosen = Vec::new();
                for (index, wanted) in listed.iter().enumerate() {
                    let number = wanted.part_number.unwrap_or(0);
                    if number <= previous {
                        return Err(s3_error!(InvalidPartOrder));
                    }
                    previous = number;
                    let Some((_, size, _, part)) = parts.iter().find(|(n, ..)| *n as i32 == number) else {
                        return Err(S3Error::with_message(S3ErrorCode::InvalidPart, format!("part {number} was not uploaded")));
                    };
                    if wanted.e_tag.as_ref().is_some_and(|e| e.value() != part.etag) {
                        return Err(S3Error::with_message(S3ErrorCode::InvalidPart, format!("part {number} has another ETag")));
                    }
                    if index + 1 < listed.len() && *size < limits.min_part_bytes {
                        return Err(S3Error::with_message(
                            S3ErrorCode::EntityTooSmall,
                            format!("part {number} holds {size} bytes; every part but the last needs {}", limits.min_part_bytes),
                        ));
                    }
                    chosen.push((number as u32, part.clone()));
                }
                let uploads = uploads(store)?;
                let target = bucket(store, &bucket_name)?;
                let mut staged = store.stage().map_err(|e| storage_error(e, "a staged object"))?;
                let mut offset = 0u64;
                let mut md5s = Md5::new();
                for (number, part) in &chosen {
                    let name = part_name(&upload_id, *number);
                    offset += staged.append_from(&uploads, name.as_bytes(), offset).map_err(|e| storage_error(e, &name))?;
                    let digest = (0..part.etag.len() / 2)
                        .filter_map(|i| u8::from_str_radix(&part.etag[2 * i..2 * i + 2], 16).ok())
                        .collect::<Vec<u8>>();
                    md5s.update(&digest);
                }
                let etag = format!("{}-{}", hex(&md5s.finalize()), chosen.len());
                let record = ObjectRecord { etag: etag.clone(), parts: Some(chosen.len() as u32), ..upload.record };
                staged.set_attribute(&record::encode(&record));
                // The object appears, and the upload with every part goes, in one commit.
                let mut transaction = store.transaction();
                transaction.publish(staged, &target, key.as_bytes()).map_err(|e| storage_error(e, &key))?;
                transaction.remove(&uploads, upload_id.as_bytes()).map_err(|e| storage_error(e, &upload_what(&upload_id)))?;
                for (number, ..) in &parts {
                    transaction
                        .remove(&uploads, part_name(&upload_id, *number).as_bytes())
                        .map_err(|e| storage_error(e, &upload_what(&upload_id)))?;
                }
                transaction.commit().map_err(|e| storage_error(e, &key))?;
                Ok(etag)
            })
            .await?;
        Ok(S3Response::new(CompleteMultipartUploadOutput {
            bucket: Some(input.bucket),
            key: Some(input.key),
            e_tag: Some(quoted(&etag)),
            ..CompleteMultipartUploadOutput::default()
        }))
    }

    async fn abort_multipart_upload(&self, req: S3Request<AbortMultipartUploadInput>) -> S3Result<S3Response<AbortMultipartUploadOutput>> {
        let input = req.input;
        let (bucket_name, key, upload_id) = (input.bucket, input.key, input.upload_id);
        self.blocking(move |store| {
            load_upload(store, &upload_id, &bucket_name, &key)?;
            let parts = upload_parts(store, &upload_id)?;
            let uploads = uploads(store)?;
            let mut transaction = store.transaction();
            transaction.remove(&uploads, upload_id.as_bytes()).map_err(|e| storage_error(e, &upload_what(&upload_id)))?;
            for (number, ..) in &parts {
                transaction
                    .remove(&uploads, part_name(&upload_id, *number).as_bytes())
                    .map_err(|e| storage_error(e, &upload_what(&upload_id)))?;
            }
            transaction.commit().map_err(|e| storage_error(e, &upload_what(&upload_id)))?;
            Ok(S3Response::new(AbortMultipartUploadOutput::default()))
        })
        .await
    }

    async fn list_parts(&self, req: S3Request<ListPartsInput>) -> S3Result<S3Response<ListPartsOutput>> {
        let input = req.input;
        let (bucket_name, key, upload_id) = (input.bucket.clone(), input.key.clone(), input.upload_id.clone());
        let marker = input.part_number_marker.unwrap_or(0).max(0) as u32;
        let max = input.max_parts.unwrap_or(1000).clamp(0, 1000) as usize;
        let (parts, truncated) = self
            .blocking(move |store| {
                load_upload(store, &upload_id, &bucket_name, &key)?;
                let all: Vec<_> = upload_parts(store, &upload_id)?.into_iter().filter(|(n, ..)| *n > marker).collect();
                let truncated = all.len() > max;
                Ok((all.into_iter().take(max).collect::<Vec<_>>(), truncated))
            })
            .await?;
        let next = parts.last().map(|(n, ..)| *n as i32);
        let parts = parts
            .into_iter()
            .map(|(number, size, mtime, part)| Part {
                part_number: Some(number as i32),
                size: Some(size as i64),
                last_modified: Some(timestamp(mtime)),
                e_tag: Some(quoted(&part.etag)),
                ..Part::default()
            })
            .collect();
        Ok(S3Response::new(ListPartsOutput {
            bucket: Some(input.bucket),
            key: Some(input.key),
            upload_id: Some(input.upload_id),
            parts: Some(parts),
            is_truncated: Some(truncated),
            next_part_number_marker: if truncated { next } else { None },
            max_parts: Some(max as i32),
            ..ListPartsOutput::default()
        }))
    }

    async fn list_multipart_uploads(&self, req: S3Request<ListMultipartUploadsInput>) -> S3Result<S3Response<ListMultipartUploadsOutput>> {
        listing::multipart_uploads(self, req.input).await.map(S3Response::new)
    }
}
