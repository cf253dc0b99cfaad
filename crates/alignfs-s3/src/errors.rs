//! Engine errors as S3 answers them, logged at their weight.

use alignfs::Error;
use s3s::{S3Error, S3ErrorCode};

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

/// A record that does not decode: the store holds damage, not a client error.
pub(crate) fn damaged(message: String) -> S3Error {
    S3Error::with_message(S3ErrorCode::InternalError, message)
}
