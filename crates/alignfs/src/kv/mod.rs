//! The KV metadata of the `nvstore` profile (docs/NVSTORE.md): NVStore's records, and
//! (next) the store that keeps them.

pub mod records;
