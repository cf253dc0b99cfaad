//! The per-file map (the OrchFS paper's HRtree, in spirit): logical block → where its
//! bytes live, plus the per-file readers-writer range lock.
//!
//! An ordered map over block indexes gives the radix tree's lookups and the linked
//! leaves' range scans (`BTreeMap::range`) with far less code; holes are absent keys.

mod entry;
mod range_lock;

pub use entry::{BlockEntry, Chunks, Overlay, PageNo, SsdBlock};
pub use range_lock::{RangeGuard, RangeLock};

use std::collections::BTreeMap;

/// Logical block index → entry. Absent = hole.
pub type FileMap = BTreeMap<u64, BlockEntry>;
