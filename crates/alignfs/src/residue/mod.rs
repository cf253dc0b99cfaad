//! The residue-store seam: where the unaligned remainder of writes lives until migration
//! merges it into whole SSD blocks.
//!
//! A residue store hands out units, named by a number the map records, for the pieces a
//! write asks for ([`UnitRequest`]: the block a unit will belong to and the bytes the
//! write puts in it), stores bytes into them at any offset, and makes them durable
//! according to its profile's promise. The stores so far hand out numbered units of
//! `unit_bytes` and ignore both hints; `uhs`'s hashed segments place a unit by its block,
//! an append-only log sizes it by its bytes. The map
//! records which unit holds which part of which block, so every store shares the
//! partitioner, the map, the journal and migration. `orch` keeps units in persistent
//! memory ([`PmemPages`]); the DRAM scrap buffer of `scrap`, the in-SSD byte log of
//! `byte`, the hashed segments of `uhs` and the KV fragments of `nvstore` implement the
//! same trait.

mod byte_log;
mod hashed_segments;
mod kv_fragments;
mod pmem_pages;
mod scrap_pages;

pub use byte_log::ByteLogPages;
pub use hashed_segments::HashedSegments;
pub use kv_fragments::{restore_fragment_pages, KvFragments};
pub use pmem_pages::PmemPages;
pub use scrap_pages::ScrapPages;

use crate::map::PageNo;
use crate::meta::Ino;

/// One unit a write asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnitRequest {
    /// The file (object) and logical block the unit will hold residue of.
    pub object: Ino,
    pub lblock: u64,
    /// Bytes the write puts in it: a whole page, or one chunk of an upage.
    pub bytes: u32,
}

pub trait ResidueStore: Send + Sync {
    fn describe(&self) -> String;
    /// What the store is called in a volume's report: "fast tier", "scrap mem", …
    fn name(&self) -> &'static str;
    fn unit_bytes(&self) -> u32;
    fn capacity_units(&self) -> u64;
    fn used_units(&self) -> u64;
    /// The most units in use at once since the volume opened.
    fn peak_used_units(&self) -> u64;
    /// A unit for each request, in order; all or none.
    fn allocate(&self, requests: &[UnitRequest]) -> Option<Vec<PageNo>>;
    fn free(&self, units: &[PageNo]);
    /// Mark a unit that the map names for `object`'s block `lblock` while rebuilding at
    /// open; `false` if it is out of range or already claimed (corrupt metadata).
    fn claim(&self, unit: PageNo, object: Ino, lblock: u64) -> bool;
    /// Whether a unit [`ResidueStore::allocate`] returns reads as zeros until written,
    /// durably once its first write is persisted: a new page of a file's tail then needs
    /// no zero fill around its bytes.
    fn fresh_units_read_zero(&self) -> bool {
        false
    }
    /// Store bytes; durable only after [`ResidueStore::persist`].
    fn write(&self, unit: PageNo, offset: u32, data: &[u8]);
    fn zero(&self, unit: PageNo, offset: u32, len: u32);
    /// Fails only for a store on a device that could not read.
    fn read(&self, unit: PageNo, offset: u32, out: &mut [u8]) -> crate::error::Result<()>;
    /// Make `offset..offset+len` of `unit` durable per the profile's promise.
    fn persist(&self, unit: PageNo, offset: u32, len: u32);
    /// Drop the copies of units the host keeps to spare device reads, if any (a
    /// benchmark's cold reads).
    fn drop_copies(&self) {}
    /// After [`ResidueStore::allocate`] refused `requests`: the blocks whose migration
    /// would make room for them, when room is not just any free unit (a full segment);
    /// empty to let the engine choose.
    fn blocks_to_drain(&self, _requests: &[UnitRequest]) -> Vec<(Ino, u64)> {
        Vec::new()
    }
}
