//! The KV metadata of the `nvstore` profile (docs/NVSTORE.md): NVStore's records and
//! the store that keeps them in fjall.

mod commit;
mod fragments;
mod group;
mod load;
pub mod records;
mod store;
#[cfg(test)]
mod tests;

pub use fragments::{FragmentBlock, FragmentLog};
pub use load::Loaded;
pub use store::KvMeta;

use std::path::Path;

use crate::error::Error;

/// A fjall error as an IO error naming the store and what failed.
pub(crate) fn kv_error(dir: &Path, what: &str, e: fjall::Error) -> Error {
    Error::io(format!("KV store {}: {what}", dir.display()), std::io::Error::other(e.to_string()))
}
