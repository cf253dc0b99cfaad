//! The KV metadata of the `nvstore` profile (docs/NVSTORE.md): NVStore's records and
//! the store that keeps them in fjall.

pub mod records;
mod store;

pub use store::{Fragment, KvMeta, KvTraffic, Loaded};
