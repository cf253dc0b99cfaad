//! On-media layout: superblocks and the unit allocators.

mod alloc;
mod block_refs;
mod checksums;
mod profile;
mod superblock;

pub use alloc::BitmapAllocator;
pub use block_refs::BlockRefs;
pub use checksums::{BlockChecksums, Mismatch};
pub use profile::Profile;
#[cfg(test)]
pub(crate) use superblock::tests::sample as sample_superblock;
pub use superblock::{DeviceRole, Superblock, FORMAT_VERSION, MAX_SSDS};
