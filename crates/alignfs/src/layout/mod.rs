//! On-media layout: superblocks and the unit allocators.

mod alloc;
mod block_refs;
mod superblock;

pub use crate::profile::Profile;
pub use alloc::BitmapAllocator;
pub use block_refs::BlockRefs;
pub use superblock::{DeviceRole, Superblock, MAX_SSDS};
