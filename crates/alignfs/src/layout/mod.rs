//! On-media layout: superblocks and the unit allocators.

mod alloc;
mod superblock;

pub use crate::profile::Profile;
pub use alloc::BitmapAllocator;
pub use superblock::{DeviceRole, Superblock, MAX_SSDS};
