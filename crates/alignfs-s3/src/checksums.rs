//! The checksums a request declares (headers or a trailer) and a response carries.

use s3s::dto::*;
use s3s::{s3_error, S3Error, S3ErrorCode, S3Result};

use crate::body::Algorithm;

/// The checksum a request declares: an algorithm with its value in a header, or an
/// algorithm whose value a trailer brings.
pub(crate) fn declared_checksum(
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
        let checksum = $crate::checksums::declared_checksum(
            input.checksum_algorithm.as_ref(),
            [
                ($crate::body::Algorithm::Crc32, input.checksum_crc32.as_ref()),
                ($crate::body::Algorithm::Crc32c, input.checksum_crc32c.as_ref()),
                ($crate::body::Algorithm::Crc64Nvme, input.checksum_crc64nvme.as_ref()),
                ($crate::body::Algorithm::Sha1, input.checksum_sha1.as_ref()),
                ($crate::body::Algorithm::Sha256, input.checksum_sha256.as_ref()),
            ],
            $headers,
        )?;
        $crate::body::Declared { md5: input.content_md5.clone(), checksum, length: input.content_length.map(|l| l.max(0) as u64) }
    }};
}

/// `$output { fields, the checksum_* fields from $checksum, ..default }`: the responses
/// that carry checksums are distinct types with the same field names.
macro_rules! with_checksums {
    ($output:ident, $checksum:expr, { $($field:ident: $value:expr),* $(,)? }) => {{
        let [crc32, crc32c, crc64nvme, sha1, sha256] = $crate::checksums::checksum_fields($checksum).map(|(_, v)| v);
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

pub(crate) fn checksum_fields(record: &Option<(String, String)>) -> [(Algorithm, Option<String>); 5] {
    Algorithm::ALL.map(|a| (a, record.as_ref().filter(|(name, _)| name == a.name()).map(|(_, v)| v.clone())))
}

pub(crate) use {declared_body, with_checksums};
