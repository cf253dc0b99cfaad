//! Personalities: protocols over the one data engine. Each translates its operations to
//! the engine's object operations (write, read, truncate, punch, clone, fsync — keyed by
//! an object's inode number) and maps errors at its boundary; none holds partitioning, IO
//! or journaling logic.
//!
//! - the POSIX namespace: `Volume`'s namespace operations (`volume/namespace.rs`), which
//!   the mount, the C API and the LD_PRELOAD shim speak;
//! - [`BlockVolume`]: one fixed-size object, no namespace on its data path, and UHS's
//!   static NVM zone beside it (the `uhs` profile; `alignfs nbd` serves it);
//! - [`ObjectStore`]: named objects with clones (the `nvstore` profile serves it over S3).

mod block;
mod nvm_zone;
mod object;

pub use block::BlockVolume;
pub use nvm_zone::{BlockLayout, MAX_NVM_RANGES};
pub use object::{decode_name, encode_name, Bucket, BucketInfo, ObjectHandle, ObjectInfo, ObjectStore, Staged, Transaction};
