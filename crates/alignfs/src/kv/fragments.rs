//! NVStore's fragment records, shared by the residue store that writes them (one put per
//! unaligned piece, [`crate::residue::KvFragments`]) and the metadata store that deletes
//! them in the batch that stops a block's record naming them ([`super::KvMeta`]).
//!
//! Orders are per block and only grow while the block has fragments, so a block's
//! fragments replay oldest first. Each residue unit holds one block's fragment page; the
//! log remembers which orders each unit put, so that dropping a unit deletes exactly its
//! keys (NVStore's prefix delete, without the scan) and never a newer unit's.
//!
//! A new unit's puts wait in memory for the commit that first maps it, and go in its
//! batch: until that commit, no record names the unit, yet its block's record may name
//! fragments (an older unit's), and recovery would lay the new ones over them. So an
//! operation that gives a block a new page (a truncate's zeroed tail, a write's new page)
//! lands whole or not at all. Puts into a unit already mapped go to the store at once.

use std::collections::HashMap;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use fjall::{Keyspace, OwnedWriteBatch};
use parking_lot::Mutex;

use super::kv_error;
use super::records::{BlockKey, BlockValue, FragmentKey, FragmentValue};
use crate::error::{Error, Result};
use crate::map::PageNo;

/// The orders one unit put for its block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct UnitOrders {
    block: BlockKey,
    orders: (u32, u32),
}

/// One fragment record, encoded.
type Put = (Vec<u8>, Vec<u8>);

#[derive(Default)]
struct Registry {
    units: HashMap<PageNo, UnitOrders>,
    /// The puts of units no commit has mapped yet.
    unmapped: HashMap<PageNo, Vec<Put>>,
    /// The next order of each block that has units, and how many it has.
    blocks: HashMap<BlockKey, (u32, usize)>,
}

pub struct FragmentLog {
    dir: PathBuf,
    fragments: Keyspace,
    /// Fragment bytes (keys + values) put since the last commit counted them.
    put_bytes: AtomicU64,
    /// A put failed: the next commit must fail rather than acknowledge the write.
    failed: AtomicBool,
    registry: Mutex<Registry>,
}

impl FragmentLog {
    pub(super) fn new(dir: PathBuf, fragments: Keyspace) -> FragmentLog {
        FragmentLog { dir, fragments, put_bytes: AtomicU64::new(0), failed: AtomicBool::new(false), registry: Mutex::default() }
    }

    /// Fragment bytes put since the last call, for the commit to count.
    pub(super) fn take_put_bytes(&self) -> u64 {
        self.put_bytes.swap(0, Ordering::Relaxed)
    }

    /// `unit` now holds `block`'s fragment page; with `orders`, the ones it holds already
    /// (rebuilt at open).
    pub fn register(&self, unit: PageNo, block: BlockKey, restored: Option<Range<u32>>) {
        let mut registry = self.registry.lock();
        let fresh = restored.is_none();
        let (next, units) = registry.blocks.entry(block).or_insert((0, 0));
        let orders = match restored {
            Some(range) => {
                *next = (*next).max(range.end);
                (range.start, range.end)
            }
            None => (*next, *next),
        };
        *units += 1;
        registry.units.insert(unit, UnitOrders { block, orders });
        if fresh {
            registry.unmapped.insert(unit, Vec::new());
        }
    }

    /// Put `data`, the bytes at `inoff` of `unit`'s block, as the block's next fragment.
    /// Durable with the next synced batch (the commit that acknowledges the write); held
    /// for that batch while no commit has mapped the unit.
    pub fn put(&self, unit: PageNo, inoff: u32, data: &[u8]) {
        let value = FragmentValue::of(inoff as u16, data).encode();
        let key = {
            let mut registry = self.registry.lock();
            let Registry { units, blocks, unmapped } = &mut *registry;
            let entry = units.get_mut(&unit).expect("a unit is registered before it is written");
            let next = &mut blocks.get_mut(&entry.block).expect("a registered unit's block").0;
            let key = FragmentKey { block: entry.block, order: *next }.encode();
            *next += 1;
            entry.orders.1 = *next;
            self.put_bytes.fetch_add((key.len() + value.len()) as u64, Ordering::Relaxed);
            if let Some(held) = unmapped.get_mut(&unit) {
                held.push((key.to_vec(), value));
                return;
            }
            key
        };
        if let Err(e) = self.fragments.insert(key, value) {
            tracing::error!("{}", kv_error(&self.dir, "write a fragment", e));
            self.failed.store(true, Ordering::SeqCst);
        }
    }

    /// `unit` is mapped by the commit whose batch this is: its held puts go in it.
    pub(super) fn mapped_into(&self, unit: PageNo, batch: &mut OwnedWriteBatch) {
        for (key, value) in self.registry.lock().unmapped.remove(&unit).unwrap_or_default() {
            batch.insert(&self.fragments, key, value);
        }
    }

    /// Forget `unit`; its fragments' keys, for the caller to delete.
    /// (A unit no commit mapped has nothing in the store: `None`.)
    fn take(&self, unit: PageNo) -> Option<(BlockKey, (u32, u32))> {
        let mut registry = self.registry.lock();
        let orders = registry.units.remove(&unit)?;
        let unmapped = registry.unmapped.remove(&unit).is_some();
        if let Some((_, units)) = registry.blocks.get_mut(&orders.block) {
            *units -= 1;
            if *units == 0 {
                // Every older key of the block is deleted before any newer put: orders
                // may start again.
                registry.blocks.remove(&orders.block);
            }
        }
        (!unmapped).then_some((orders.block, orders.orders))
    }

    /// Delete `unit`'s fragments in `batch` (the commit that drops it from its block).
    pub(super) fn drop_into(&self, unit: PageNo, batch: &mut OwnedWriteBatch) {
        if let Some((block, (first, end))) = self.take(unit) {
            for order in first..end {
                batch.remove(&self.fragments, FragmentKey { block, order }.encode().to_vec());
            }
        }
    }

    /// Forget `unit` without deleting its keys (its object's records are deleted whole).
    pub(super) fn forget(&self, unit: PageNo) {
        self.take(unit);
    }

    /// A unit goes back to the free pool: delete what it put unless a commit did (a write
    /// that failed before its commit leaves fragments no record names).
    pub fn release(&self, unit: PageNo) {
        if let Some((block, (first, end))) = self.take(unit) {
            for order in first..end {
                if let Err(e) = self.fragments.remove(FragmentKey { block, order }.encode()) {
                    tracing::warn!("{}", kv_error(&self.dir, "delete a fragment", e));
                }
            }
        }
    }

    /// Whether a put failed since the store opened.
    pub(super) fn check(&self) -> Result<()> {
        if self.failed.load(Ordering::SeqCst) {
            return Err(Error::io(
                format!("KV store {}", self.dir.display()),
                std::io::Error::other("a fragment could not be written; reopen the volume"),
            ));
        }
        Ok(())
    }
}

/// A block whose record says it has fragments: the record's value, and the fragments by
/// order, oldest first.
pub struct FragmentBlock {
    pub key: BlockKey,
    pub value: BlockValue,
    pub fragments: Vec<(u32, FragmentValue)>,
}
