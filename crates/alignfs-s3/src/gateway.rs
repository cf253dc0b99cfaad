//! The gateway: an [`ObjectStore`] and the limits it serves it with. Every store call is
//! blocking, so each runs on tokio's blocking pool ([`Gateway::blocking`]); bodies
//! stream through [`crate::body`]; the operations are in `service.rs`.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use alignfs::personality::ObjectStore;
use alignfs::Error;
use s3s::{S3Error, S3ErrorCode, S3Result};

use crate::store::UPLOADS;

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
    pub(crate) store: Arc<ObjectStore>,
    pub(crate) limits: Limits,
    pub(crate) next_upload: Arc<AtomicU64>,
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
