//! Objects: PUT, GET (ranges, conditions), HEAD, DELETE (one or many), and CopyObject as a
//! clone that copies no data.

use std::sync::Arc;

use alignfs::personality::{ObjectHandle, ObjectStore};
use alignfs::Error;
use bytes::Bytes;
use s3s::dto::*;
use s3s::{s3_error, S3Error, S3ErrorCode, S3Request, S3Response, S3Result};

use crate::body::{self};
use crate::checksums::{declared_body, with_checksums};
use crate::errors::{damaged, storage_error};
use crate::gateway::Gateway;
use crate::record::{self, ObjectRecord};
use crate::record::{headers_of, object_record, user_metadata};
use crate::store::*;

/// Bytes read from the store per piece of a GET's body.
const READ_BYTES: usize = 1 << 20;

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

pub(crate) fn read_record(handle: &ObjectHandle, what: &str) -> S3Result<ObjectRecord> {
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

pub(crate) async fn put_object(gateway: &Gateway, req: S3Request<PutObjectInput>) -> S3Result<S3Response<PutObjectOutput>> {
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
        gateway
            .blocking(move |store| {
                bucket(store, &bucket_name)?;
                alignfs::personality::encode_name(key.as_bytes()).map_err(|e| storage_error(e, &key)).map(drop)
            })
            .await?;
    }
    let limit = gateway.limits.max_object_bytes;
    let published =
        body::receive(Arc::clone(&gateway.store), input.body, declared, limit, req.trailing_headers, move |store, mut staged, received| {
            let target = bucket(store, &bucket_name)?;
            if if_match.is_some() || if_none_match.is_some() {
                let current = match target.attribute(key.as_bytes()) {
                    Ok(attribute) => Some(attribute.and_then(|a| record::decode::<ObjectRecord>(&a, &key).ok()).unwrap_or_default().etag),
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
        })
        .await?;
    Ok(S3Response::new(with_checksums!(PutObjectOutput, &published.checksum, { e_tag: Some(quoted(&published.etag)) })))
}

pub(crate) async fn get_object(gateway: &Gateway, req: S3Request<GetObjectInput>) -> S3Result<S3Response<GetObjectOutput>> {
    let input = req.input;
    let (bucket_name, key) = (input.bucket.clone(), input.key.clone());
    let what = format!("{bucket_name}/{key}");
    let store = Arc::clone(&gateway.store);
    let (handle, record) = gateway
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

pub(crate) async fn head_object(gateway: &Gateway, req: S3Request<HeadObjectInput>) -> S3Result<S3Response<HeadObjectOutput>> {
    let input = req.input;
    let (bucket_name, key) = (input.bucket.clone(), input.key.clone());
    let (size, mtime, record) = gateway
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

pub(crate) async fn delete_object(gateway: &Gateway, req: S3Request<DeleteObjectInput>) -> S3Result<S3Response<DeleteObjectOutput>> {
    let (bucket_name, key) = (req.input.bucket, req.input.key);
    gateway
        .blocking(move |store| {
            let target = bucket(store, &bucket_name)?;
            match target.remove(key.as_bytes()) {
                // S3 answers a delete of a missing key with success.
                Ok(()) | Err(Error::NotFound) => Ok(S3Response::new(DeleteObjectOutput::default())),
                Err(e) => Err(storage_error(e, &key)),
            }
        })
        .await
}

pub(crate) async fn delete_objects(gateway: &Gateway, req: S3Request<DeleteObjectsInput>) -> S3Result<S3Response<DeleteObjectsOutput>> {
    let (bucket_name, delete) = (req.input.bucket, req.input.delete);
    if delete.objects.len() > 1000 {
        return Err(s3_error!(MalformedXML, "at most 1000 keys per DeleteObjects"));
    }
    gateway
        .blocking(move |store| {
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

pub(crate) async fn copy_object(gateway: &Gateway, req: S3Request<CopyObjectInput>) -> S3Result<S3Response<CopyObjectOutput>> {
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
    let (etag, mtime) = gateway
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
            check_conditions(&source_record.etag, if_match.as_ref(), if_none_match.as_ref()).map_err(|_| s3_error!(PreconditionFailed))?;
            let record = if replace { ObjectRecord { headers, metadata: user_metadata(metadata), ..source_record } } else { source_record };
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
