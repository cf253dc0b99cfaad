//! Multipart uploads: initiate, upload parts, complete (atomically, sharing the parts'
//! blocks where they are block-aligned), abort, list parts.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use alignfs::personality::ObjectStore;
use alignfs::Error;
use md5::{Digest as _, Md5};
use s3s::dto::*;
use s3s::{s3_error, S3Error, S3ErrorCode, S3Request, S3Response, S3Result};

use crate::body::{self, hex};
use crate::checksums::{declared_body, with_checksums};
use crate::errors::{damaged, storage_error};
use crate::gateway::Gateway;
use crate::record::{self, ObjectRecord, PartRecord, UploadRecord};
use crate::record::{headers_of, user_metadata};
use crate::store::*;

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

pub(crate) async fn create_multipart_upload(
    gateway: &Gateway,
    req: S3Request<CreateMultipartUploadInput>,
) -> S3Result<S3Response<CreateMultipartUploadOutput>> {
    let input = req.input;
    check_new_key(&input.key)?;
    let (bucket_name, key) = (input.bucket.clone(), input.key.clone());
    let headers =
        headers_of(input.content_type, input.content_encoding, input.content_disposition, input.content_language, input.cache_control);
    let metadata: BTreeMap<String, String> = user_metadata(input.metadata);
    // Unique across restarts: the time, and a counter for uploads in the same tick.
    let upload_id = format!("{:016x}{:08x}", now_ns(), gateway.next_upload.fetch_add(1, Ordering::Relaxed) as u32);
    let id = upload_id.clone();
    gateway
        .blocking(move |store| {
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

pub(crate) async fn upload_part(gateway: &Gateway, req: S3Request<UploadPartInput>) -> S3Result<S3Response<UploadPartOutput>> {
    let input = req.input;
    let number = input.part_number;
    if number < 1 || number as u32 > gateway.limits.max_parts {
        return Err(S3Error::with_message(
            S3ErrorCode::InvalidArgument,
            format!("part numbers run from 1 to {}", gateway.limits.max_parts),
        ));
    }
    let declared = declared_body!(input, &req.headers);
    let (bucket_name, key, upload_id) = (input.bucket.clone(), input.key.clone(), input.upload_id.clone());
    {
        let (bucket_name, key, upload_id) = (bucket_name.clone(), key.clone(), upload_id.clone());
        gateway.blocking(move |store| load_upload(store, &upload_id, &bucket_name, &key).map(drop)).await?;
    }
    let limit = gateway.limits.max_object_bytes;
    let part =
        body::receive(Arc::clone(&gateway.store), input.body, declared, limit, req.trailing_headers, move |store, mut staged, received| {
            // The upload may have been completed or aborted while the part arrived.
            load_upload(store, &upload_id, &bucket_name, &key)?;
            let part = PartRecord { etag: received.md5_hex(), checksum: received.checksum.clone() };
            staged.set_attribute(&record::encode(&part));
            let name = part_name(&upload_id, number as u32);
            let mut transaction = store.transaction();
            transaction.publish(staged, &uploads(store)?, name.as_bytes()).map_err(|e| storage_error(e, &name))?;
            transaction.commit().map_err(|e| storage_error(e, &name))?;
            Ok(part)
        })
        .await?;
    Ok(S3Response::new(with_checksums!(UploadPartOutput, &part.checksum, { e_tag: Some(quoted(&part.etag)) })))
}

pub(crate) async fn complete_multipart_upload(
    gateway: &Gateway,
    req: S3Request<CompleteMultipartUploadInput>,
) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
    let input = req.input;
    let (bucket_name, key, upload_id) = (input.bucket.clone(), input.key.clone(), input.upload_id.clone());
    let listed: Vec<CompletedPart> = input.multipart_upload.and_then(|m| m.parts).unwrap_or_default();
    let limits = gateway.limits.clone();
    let etag = gateway
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
                let digest =
                    (0..part.etag.len() / 2).filter_map(|i| u8::from_str_radix(&part.etag[2 * i..2 * i + 2], 16).ok()).collect::<Vec<u8>>();
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

pub(crate) async fn abort_multipart_upload(
    gateway: &Gateway,
    req: S3Request<AbortMultipartUploadInput>,
) -> S3Result<S3Response<AbortMultipartUploadOutput>> {
    let input = req.input;
    let (bucket_name, key, upload_id) = (input.bucket, input.key, input.upload_id);
    gateway
        .blocking(move |store| {
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

pub(crate) async fn list_parts(gateway: &Gateway, req: S3Request<ListPartsInput>) -> S3Result<S3Response<ListPartsOutput>> {
    let input = req.input;
    let (bucket_name, key, upload_id) = (input.bucket.clone(), input.key.clone(), input.upload_id.clone());
    let marker = input.part_number_marker.unwrap_or(0).max(0) as u32;
    let max = input.max_parts.unwrap_or(1000).clamp(0, 1000) as usize;
    let (parts, truncated) = gateway
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
