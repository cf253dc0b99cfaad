//! On-media layout: superblocks and the unit allocators.

mod alloc;
mod superblock;

pub use alloc::BitmapAllocator;
pub use superblock::{DeviceRole, Profile, Superblock, MAX_SSDS};
