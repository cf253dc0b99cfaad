//! The KV metadata of the `nvstore` profile (docs/NVSTORE.md): NVStore's records and
//! the store that keeps them in fjall.

mod fragments;
pub mod records;
mod store;

pub use fragments::{restore_fragment_pages, FragmentLog};
pub use store::{FragmentBlock, KvMeta, Loaded};
