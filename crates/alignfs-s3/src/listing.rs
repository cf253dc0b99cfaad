//! Listings: ListObjects (v1 and v2) and ListMultipartUploads, paged and rolled up by a
//! delimiter into common prefixes, with keys URL-encoded in the response when the
//! request asks for `encoding-type=url` (as boto3, awscli and rclone do: they decode
//! what comes back, so a key sent as it is would be decoded a second time).

use alignfs::personality::ObjectStore;
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use s3s::dto::*;
use s3s::{s3_error, S3Result};

use crate::errors::storage_error;
use crate::gateway::Gateway;
use crate::record::{self, ObjectRecord, UploadRecord};
use crate::store::{bucket, quoted, timestamp, uploads};

/// Bytes a URL-encoded listing leaves as they are: RFC 3986's unreserved characters and
/// `/`. Everything else, `+` and space included, is percent-encoded: clients decode
/// with `+` meaning a space.
const KEPT: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'_').remove(b'.').remove(b'~').remove(b'/');

/// How the names in a listing's response are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Names {
    url_encoded: bool,
}

impl Names {
    fn of(encoding: Option<&EncodingType>) -> Names {
        Names { url_encoded: encoding.is_some_and(|e| e.as_str() == EncodingType::URL) }
    }

    fn write(self, name: String) -> String {
        if self.url_encoded {
            utf8_percent_encode(&name, KEPT).to_string()
        } else {
            name
        }
    }

    fn write_opt(self, name: Option<String>) -> Option<String> {
        name.map(|n| self.write(n))
    }
}

/// The common prefix `key` rolls up into in a listing of `prefix` by `delimiter`: `key` up
/// to the first delimiter after the prefix, included. None without a delimiter (or an
/// empty one).
fn common_prefix(key: &str, prefix: &str, delimiter: Option<&str>) -> Option<String> {
    let d = delimiter.filter(|d| !d.is_empty())?;
    let rest = key.strip_prefix(prefix)?;
    rest.find(d).map(|at| key[..prefix.len() + at + d.len()].to_string())
}

/// Objects read from the store at a time when listing: small enough that the keys under
/// a common prefix read before skipping past them cost little.
const LIST_BATCH: usize = 128;

/// One page of a listing with `delimiter` rolled up into common prefixes.
struct Page {
    objects: Vec<(String, u64, i64, String)>,
    prefixes: Vec<String>,
    truncated: bool,
    /// The last key or common prefix returned: where the next page starts after.
    last: Option<String>,
}

fn list_page(
    store: &ObjectStore,
    bucket_name: &str,
    prefix: &str,
    delimiter: Option<&str>,
    after: Option<String>,
    max: usize,
) -> S3Result<Page> {
    let bucket = bucket(store, bucket_name)?;
    let mut page = Page { objects: Vec::new(), prefixes: Vec::new(), truncated: false, last: None };
    let roll_up = |key: &str| common_prefix(key, prefix, delimiter);
    // A page that ended on a common prefix resumes past every key under it.
    let mut skip_past = after.as_deref().and_then(|a| roll_up(a).filter(|c| c == a));
    let mut cursor = after.map(String::into_bytes);
    loop {
        // Past a common prefix, the next batch starts after every key under it: a name
        // is UTF-8, so no key under it sorts after the prefix followed by 0xFF.
        if let Some(skip) = &skip_past {
            if cursor.as_deref().is_none_or(|c| c.starts_with(skip.as_bytes())) {
                cursor = Some([skip.as_bytes(), &[0xFF]].concat());
            }
        }
        let batch = bucket.list(prefix.as_bytes(), cursor.as_deref(), LIST_BATCH).map_err(|e| storage_error(e, bucket_name))?;
        if batch.is_empty() {
            return Ok(page);
        }
        for object in batch {
            let key = String::from_utf8_lossy(&object.name).into_owned();
            cursor = Some(object.name.clone());
            if skip_past.as_deref().is_some_and(|skip| key.starts_with(skip)) {
                continue;
            }
            if page.objects.len() + page.prefixes.len() == max {
                page.truncated = true;
                return Ok(page);
            }
            match roll_up(&key) {
                Some(common) => {
                    page.prefixes.push(common.clone());
                    page.last = Some(common.clone());
                    skip_past = Some(common);
                }
                None => {
                    let etag = bucket
                        .attribute(&object.name)
                        .ok()
                        .flatten()
                        .and_then(|a| record::decode::<ObjectRecord>(&a, &key).ok())
                        .map(|r| r.etag);
                    page.last = Some(key.clone());
                    page.objects.push((key, object.size, object.mtime_ns, etag.unwrap_or_default()));
                }
            }
        }
    }
}

/// One page of ListMultipartUploads.
struct UploadsPage {
    uploads: Vec<(String, UploadRecord)>,
    prefixes: Vec<String>,
    truncated: bool,
    /// Where the next page starts after: the last key or common prefix returned, and the
    /// last upload's id if it was an upload.
    next: Option<(String, Option<String>)>,
}

/// The page of `found` (uploads by id, all under `prefix`) after the markers, in key
/// order and, for one key, in id order (an id starts with its initiation time), with
/// `delimiter` rolled up into common prefixes.
fn uploads_page(
    mut found: Vec<(String, UploadRecord)>,
    prefix: &str,
    delimiter: Option<&str>,
    (key_marker, id_marker): (Option<&str>, Option<&str>),
    max: usize,
) -> UploadsPage {
    found.sort_by(|a, b| (&a.1.key, &a.0).cmp(&(&b.1.key, &b.0)));
    let roll_up = |key: &str| common_prefix(key, prefix, delimiter);
    // A page that ended on a common prefix resumes past every key under it.
    let skip = key_marker.and_then(|m| roll_up(m).filter(|c| c == m));
    let after_markers = |key: &str, id: &str| match (key_marker, id_marker) {
        _ if skip.as_deref().is_some_and(|s| key.starts_with(s)) => false,
        (None, _) => true,
        (Some(marker), None) => key > marker,
        (Some(marker), Some(id_marker)) => key > marker || (key == marker && id > id_marker),
    };
    let mut page = UploadsPage { uploads: Vec::new(), prefixes: Vec::new(), truncated: false, next: None };
    for (id, upload) in found.into_iter().filter(|(id, upload)| after_markers(&upload.key, id)) {
        let common = roll_up(&upload.key);
        if common.is_some() && common == page.prefixes.last().cloned() {
            continue;
        }
        if page.uploads.len() + page.prefixes.len() == max {
            page.truncated = true;
            break;
        }
        match common {
            Some(common) => {
                page.next = Some((common.clone(), None));
                page.prefixes.push(common);
            }
            None => {
                page.next = Some((upload.key.clone(), Some(id.clone())));
                page.uploads.push((id, upload));
            }
        }
    }
    if !page.truncated {
        page.next = None;
    }
    page
}

fn page_contents(page: Page, names: Names) -> (Option<ObjectList>, Option<CommonPrefixList>) {
    let contents = page
        .objects
        .into_iter()
        .map(|(key, size, mtime, etag)| Object {
            key: Some(names.write(key)),
            size: Some(size as i64),
            last_modified: Some(timestamp(mtime)),
            e_tag: Some(quoted(&etag)),
            storage_class: Some(ObjectStorageClass::from_static(ObjectStorageClass::STANDARD)),
            ..Object::default()
        })
        .collect();
    let prefixes = page.prefixes.into_iter().map(|p| CommonPrefix { prefix: Some(names.write(p)) }).collect();
    (Some(contents), Some(prefixes))
}

fn max_keys(given: Option<i32>) -> S3Result<usize> {
    match given {
        None => Ok(1000),
        Some(n) if n < 0 => Err(s3_error!(InvalidArgument, "max-keys must not be negative")),
        Some(n) => Ok((n as usize).min(1000)),
    }
}

/// ListObjectsV2. The continuation token is the last key or common prefix returned, in
/// base64 (never URL-encoded: it is opaque to the client).
pub(crate) async fn objects_v2(gateway: &Gateway, input: ListObjectsV2Input) -> S3Result<ListObjectsV2Output> {
    let max = max_keys(input.max_keys)?;
    let names = Names::of(input.encoding_type.as_ref());
    let prefix = input.prefix.clone().unwrap_or_default();
    let delimiter = input.delimiter.clone();
    let after = match &input.continuation_token {
        Some(token) => Some(
            base64_simd::URL_SAFE_NO_PAD
                .decode_to_vec(token)
                .ok()
                .and_then(|b| String::from_utf8(b).ok())
                .ok_or_else(|| s3_error!(InvalidArgument, "the continuation token is not one this gateway gave"))?,
        ),
        None => input.start_after.clone(),
    };
    let bucket_name = input.bucket.clone();
    let page = {
        let (prefix, delimiter) = (prefix.clone(), delimiter.clone());
        gateway.blocking(move |store| list_page(store, &bucket_name, &prefix, delimiter.as_deref(), after, max)).await?
    };
    let next = page.truncated.then(|| page.last.as_ref().map(|l| base64_simd::URL_SAFE_NO_PAD.encode_to_string(l))).flatten();
    let (count, truncated) = ((page.objects.len() + page.prefixes.len()) as i32, page.truncated);
    let (contents, common_prefixes) = page_contents(page, names);
    Ok(ListObjectsV2Output {
        name: Some(input.bucket),
        prefix: Some(names.write(prefix)),
        delimiter: names.write_opt(delimiter),
        max_keys: Some(max as i32),
        key_count: Some(count),
        is_truncated: Some(truncated),
        continuation_token: input.continuation_token,
        next_continuation_token: next,
        start_after: names.write_opt(input.start_after),
        contents,
        common_prefixes,
        encoding_type: input.encoding_type,
        ..ListObjectsV2Output::default()
    })
}

/// ListObjects (v1): markers are keys, URL-encoded like them when asked.
pub(crate) async fn objects_v1(gateway: &Gateway, input: ListObjectsInput) -> S3Result<ListObjectsOutput> {
    let max = max_keys(input.max_keys)?;
    let names = Names::of(input.encoding_type.as_ref());
    let prefix = input.prefix.clone().unwrap_or_default();
    let delimiter = input.delimiter.clone();
    let bucket_name = input.bucket.clone();
    let page = {
        let (prefix, delimiter, marker) = (prefix.clone(), delimiter.clone(), input.marker.clone());
        gateway.blocking(move |store| list_page(store, &bucket_name, &prefix, delimiter.as_deref(), marker, max)).await?
    };
    let truncated = page.truncated;
    let next_marker = if truncated { names.write_opt(page.last.clone()) } else { None };
    let (contents, common_prefixes) = page_contents(page, names);
    Ok(ListObjectsOutput {
        name: Some(input.bucket),
        prefix: Some(names.write(prefix)),
        marker: names.write_opt(input.marker),
        delimiter: names.write_opt(delimiter),
        max_keys: Some(max as i32),
        is_truncated: Some(truncated),
        next_marker,
        contents,
        common_prefixes,
        encoding_type: input.encoding_type,
        ..ListObjectsOutput::default()
    })
}

/// ListMultipartUploads: keys, prefixes, the delimiter and the key markers URL-encoded
/// when asked; upload ids never (they are ours, and plain).
pub(crate) async fn multipart_uploads(gateway: &Gateway, input: ListMultipartUploadsInput) -> S3Result<ListMultipartUploadsOutput> {
    let max = max_keys(input.max_uploads)?;
    let names = Names::of(input.encoding_type.as_ref());
    let bucket_name = input.bucket.clone();
    let prefix = input.prefix.clone().unwrap_or_default();
    let found = gateway
        .blocking(move |store| {
            bucket(store, &bucket_name)?;
            let uploads = uploads(store)?;
            let mut found = Vec::new();
            // The uploads are named by id: every one in the store is read (they are
            // the uploads in progress, few next to the objects).
            for object in uploads.list(b"", None, usize::MAX).map_err(|e| storage_error(e, "the uploads"))? {
                if object.name.contains(&b'/') {
                    continue; // a part
                }
                let id = String::from_utf8_lossy(&object.name).into_owned();
                let Some(attribute) = uploads.attribute(&object.name).map_err(|e| storage_error(e, &id))? else { continue };
                let Ok(upload) = record::decode::<UploadRecord>(&attribute, &id) else { continue };
                if upload.bucket == bucket_name && upload.key.starts_with(&prefix) {
                    found.push((id, upload));
                }
            }
            Ok(found)
        })
        .await?;
    let markers = (input.key_marker.as_deref(), input.upload_id_marker.as_deref());
    let page = uploads_page(found, input.prefix.as_deref().unwrap_or(""), input.delimiter.as_deref(), markers, max);
    let uploads = page
        .uploads
        .into_iter()
        .map(|(id, upload)| MultipartUpload {
            key: Some(names.write(upload.key)),
            upload_id: Some(id),
            initiated: Some(timestamp(upload.initiated_ns)),
            ..MultipartUpload::default()
        })
        .collect();
    let common_prefixes = page.prefixes.into_iter().map(|p| CommonPrefix { prefix: Some(names.write(p)) }).collect();
    Ok(ListMultipartUploadsOutput {
        bucket: Some(input.bucket),
        prefix: names.write_opt(input.prefix),
        delimiter: names.write_opt(input.delimiter),
        key_marker: names.write_opt(input.key_marker),
        upload_id_marker: input.upload_id_marker,
        max_uploads: Some(max as i32),
        is_truncated: Some(page.truncated),
        next_key_marker: names.write_opt(page.next.as_ref().map(|(key, _)| key.clone())),
        next_upload_id_marker: page.next.and_then(|(_, id)| id),
        uploads: Some(uploads),
        common_prefixes: Some(common_prefixes),
        encoding_type: input.encoding_type,
        ..ListMultipartUploadsOutput::default()
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use alignfs::device::{BlockDevice, SimSsd};
    use alignfs::test_support::seed;
    use alignfs::{Devices, FormatOptions, Profile, VolumeOptions};
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;

    /// What a listing must return, computed from every key: the keys and common
    /// prefixes after `after`, in order, rolled up by `delimiter`.
    fn model_listing(keys: &[String], prefix: &str, delimiter: Option<&str>, after: Option<&str>) -> Vec<(bool, String)> {
        let mut out: Vec<(bool, String)> = Vec::new();
        for key in keys.iter().filter(|k| k.starts_with(prefix)) {
            let entry = match delimiter.and_then(|d| key[prefix.len()..].find(d).map(|at| key[..prefix.len() + at + d.len()].to_string())) {
                Some(common) => (true, common),
                None => (false, key.clone()),
            };
            if after.is_some_and(|a| entry.1.as_str() <= a) || out.last() == Some(&entry) {
                continue;
            }
            out.push(entry);
        }
        out
    }

    /// Listings page by page, with and without delimiters, against a model; the keys
    /// under a common prefix are many, so the listing skips past them in batches.
    #[test]
    fn listings_page_through_keys_and_common_prefixes_as_the_model_says() {
        let kv = tempfile::tempdir().unwrap();
        let ssd: Arc<dyn BlockDevice> = Arc::new(SimSsd::new(64 << 20));
        let format =
            FormatOptions { geometry: Profile::NVSTORE.default_geometry(), profile: Profile::NVSTORE, force: false, ..Default::default() };
        ObjectStore::format(&Devices::with_kv(Arc::clone(&ssd), kv.path()), &format).unwrap();
        let store =
            ObjectStore::open(Devices::with_kv(ssd, kv.path()), VolumeOptions { background: false, ..VolumeOptions::default() }).unwrap();
        store.create_bucket(b"b").unwrap();
        let mut rng = StdRng::seed_from_u64(seed("gateway::listings"));
        let mut keys: Vec<String> = (0..300).map(|i| format!("deep/{:04}", i * 7 % 300)).collect();
        for _ in 0..200 {
            let parts: Vec<String> =
                (0..rng.random_range(1..4)).map(|_| ["a", "b", "ab", "é", "z-", "a.b"][rng.random_range(0..6)].to_string()).collect();
            keys.push(parts.join(["/", "-"][rng.random_range(0..2)]));
        }
        keys.sort();
        keys.dedup();
        let bucket = store.bucket(b"b").unwrap();
        for key in &keys {
            bucket.put(key.as_bytes(), b"x").unwrap();
        }
        for round in 0..60 {
            let prefix = ["", "a", "a/", "deep/", "deep/00", "é", "z"][rng.random_range(0..7)];
            let delimiter = [None, Some("/"), Some("-"), Some("b/")][rng.random_range(0..4)];
            let max = [1, 7, 50, 1000][rng.random_range(0..4)];
            let mut after: Option<String> = None;
            let mut listed = Vec::new();
            loop {
                let page = list_page(&store, "b", prefix, delimiter, after.clone(), max).unwrap();
                let entries = page.objects.len() + page.prefixes.len();
                assert!(entries <= max, "round {round}: a page of {entries}, max {max}");
                let mut got: Vec<(bool, String)> =
                    page.objects.iter().map(|o| (false, o.0.clone())).chain(page.prefixes.iter().map(|p| (true, p.clone()))).collect();
                got.sort_by(|a, b| a.1.cmp(&b.1));
                listed.extend(got);
                if !page.truncated {
                    break;
                }
                assert_eq!(entries, max, "round {round}: a truncated page is full");
                after = page.last;
            }
            let expected = model_listing(&keys, prefix, delimiter, None);
            assert_eq!(listed, expected, "round {round}: prefix {prefix:?}, delimiter {delimiter:?}, pages of {max}");
        }
        store.close().unwrap();
    }

    /// ListMultipartUploads paged with markers, with and without a delimiter, returns
    /// what one unpaged listing returns, which is what the model says.
    /// Keys that clients decode from `+`, `%`, spaces, `..`, non-ASCII and control
    /// characters come back decodable to themselves: percent-decoding with `+` as a space
    /// (what botocore and rclone do) gives the key back.
    #[test]
    fn url_encoded_names_decode_to_themselves() {
        let names = Names { url_encoded: true };
        let plus_as_space_decode = |text: &str| {
            let spaced = text.replace('+', " ");
            percent_encoding::percent_decode_str(&spaced).decode_utf8().unwrap().into_owned()
        };
        for key in ["pct%41", "a+b c", "%2e%2e/%2e%2e/etc/passwd", "dir/é ü/日本", "tab\tnl\n\u{1}", "a~b_c-d.e/f", "(x)&y=z?#"] {
            let written = names.write(key.to_string());
            assert!(written.bytes().all(|b| b.is_ascii_graphic()), "{key:?} written as {written:?}");
            assert!(!written.contains('+') && !written.contains(' '), "{written}");
            assert_eq!(plus_as_space_decode(&written), key, "{key:?} written as {written:?}");
        }
        assert_eq!(names.write("a/b-c".into()), "a/b-c");
        assert_eq!(Names { url_encoded: false }.write("a+b c".into()), "a+b c");
        assert_eq!(Names::of(Some(&EncodingType::from_static(EncodingType::URL))), names);
        assert!(!Names::of(None).url_encoded);
    }

    #[test]
    fn upload_listings_page_by_key_and_upload_id() {
        let mut rng = StdRng::seed_from_u64(seed("gateway::upload_listings"));
        let upload = |key: &str| UploadRecord { bucket: "b".into(), key: key.into(), record: ObjectRecord::default(), initiated_ns: 0 };
        let mut found = Vec::new();
        for n in 0..150 {
            let key = ["a", "a/b", "a/c/d", "b", "b/x", "c-d", "c/e"][rng.random_range(0..7)];
            found.push((format!("{:016x}{n:08x}", rng.random_range(0..1000u64)), upload(key)));
        }
        for round in 0..200 {
            let prefix = ["", "a", "a/", "b", "c"][rng.random_range(0..5)];
            let mine: Vec<(String, UploadRecord)> = found.iter().filter(|(_, u)| u.key.starts_with(prefix)).cloned().collect();
            let delimiter = [None, Some("/"), Some("-")][rng.random_range(0..3)];
            let max = [1, 2, 5, 1000][rng.random_range(0..4)];
            let whole = uploads_page(mine.clone(), prefix, delimiter, (None, None), usize::MAX);
            assert!(!whole.truncated && whole.next.is_none());
            let mut keys: Vec<String> = mine.iter().map(|(_, u)| u.key.clone()).collect();
            keys.sort();
            let mut expected = model_listing(&keys, prefix, delimiter, None);
            expected.dedup();
            let mut keys_and_prefixes: Vec<(bool, String)> =
                whole.uploads.iter().map(|(_, u)| (false, u.key.clone())).chain(whole.prefixes.iter().map(|p| (true, p.clone()))).collect();
            keys_and_prefixes.sort_by(|a, b| a.1.cmp(&b.1));
            keys_and_prefixes.dedup();
            assert_eq!(keys_and_prefixes, expected, "round {round}");
            let rolled_up = |key: &str| delimiter.is_some_and(|d| key[prefix.len()..].contains(d));
            assert_eq!(whole.uploads.len(), mine.iter().filter(|(_, u)| !rolled_up(&u.key)).count(), "round {round}: every upload once");
            assert!(whole.uploads.windows(2).all(|w| (&w[0].1.key, &w[0].0) < (&w[1].1.key, &w[1].0)), "round {round}: in key, id order");
            let (mut uploads, mut prefixes, mut markers) = (Vec::new(), Vec::new(), (None::<String>, None::<String>));
            loop {
                let page = uploads_page(mine.clone(), prefix, delimiter, (markers.0.as_deref(), markers.1.as_deref()), max);
                assert!(page.uploads.len() + page.prefixes.len() <= max);
                uploads.extend(page.uploads.into_iter().map(|(id, _)| id));
                prefixes.extend(page.prefixes);
                match page.next {
                    Some((key, id)) => markers = (Some(key), id),
                    None => break,
                }
            }
            assert_eq!(uploads, whole.uploads.iter().map(|(id, _)| id.clone()).collect::<Vec<_>>(), "round {round}: pages of {max}");
            assert_eq!(prefixes, whole.prefixes, "round {round}: pages of {max}");
        }
    }
}
