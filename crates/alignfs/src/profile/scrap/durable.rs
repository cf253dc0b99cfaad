//! What a crash keeps when residue is volatile (docs/SCRAP.md).
//!
//! The live map names DRAM scrap pages; the journal and the checkpoints must not, since
//! those pages are gone after a crash. So a commit journals each op as a crash would see
//! it: a block's entry without its residue (its SSD block alone, or a hole), and a file's
//! size only as far as its data is durable. An op that changes nothing durable is not
//! journaled at all, so a write that stays in the scrap buffer costs no SSD IO.
//!
//! After a crash every byte of a file reads as its last flushed value, or as zero where a
//! block had never been flushed: unsynced bytes are lost, never replaced by other data.

use std::collections::HashMap;

use super::ScrapState;
use crate::journal::DurableView;
use crate::map::BlockEntry;
use crate::meta::{DataOp, Ino, Op};
use crate::profile::{EngineApi, Projection};

/// A block's entry as a crash leaves it: its SSD block without overlays, a zero block
/// (`fallocate`: no residue, so nothing to lose), or a hole.
pub(super) fn durable_entry(entry: &BlockEntry) -> Option<BlockEntry> {
    match entry {
        BlockEntry::Ssd { block, shared, .. } => Some(BlockEntry::Ssd { block: *block, overlays: Vec::new(), shared: *shared }),
        BlockEntry::Fast { .. } if entry.is_zeros() => Some(BlockEntry::zeros()),
        BlockEntry::Fast { .. } => None,
    }
}

impl ScrapState {
    /// The size of `ino` that a crash keeps, given its live `size`. The caller holds the
    /// commit lock.
    pub(super) fn durable_size(&self, ino: Ino, size: u64) -> u64 {
        self.unsynced_sizes.lock().get(&ino).copied().map_or(size, |durable| durable.min(size))
    }

    /// `ops` as a crash would keep them. The caller holds the commit lock and has not
    /// applied `ops` yet.
    pub(super) fn durable_ops(&self, engine: &dyn EngineApi, ops: &[Op]) -> Projection {
        let block = engine.geometry().block();
        let mut journal = Vec::new();
        // Projections already journaled by this commit (a block edited twice).
        let mut projected: HashMap<(Ino, u64), Option<BlockEntry>> = HashMap::new();
        // Per file: the end of the last block this commit makes durable.
        let mut durable_end: HashMap<Ino, u64> = HashMap::new();
        let mut sizes: Vec<(Ino, u64)> = Vec::new();
        for op in ops {
            match op {
                Op::Data(DataOp::Map { ino, lblock, entry }) => {
                    let before = match projected.get(&(*ino, *lblock)) {
                        Some(p) => p.clone(),
                        None => engine.meta().get(*ino).and_then(|i| i.map.lock().get(lblock).and_then(durable_entry)),
                    };
                    let after = entry.as_ref().and_then(durable_entry);
                    if before != after {
                        if after.is_some() {
                            let end = durable_end.entry(*ino).or_default();
                            *end = (*end).max((lblock + 1) * block);
                        }
                        journal.push(Op::Data(DataOp::Map { ino: *ino, lblock: *lblock, entry: after.clone() }));
                        projected.insert((*ino, *lblock), after);
                    }
                }
                Op::Data(DataOp::SetSize { ino, size, .. }) => {
                    sizes.push((*ino, *size));
                    journal.push(op.clone());
                }
                Op::Data(DataOp::Extend { .. }) => {}
                other => journal.push(other.clone()),
            }
        }
        // Sizes last: they depend on every block edit of the commit.
        for op in ops {
            let Op::Data(DataOp::Extend { ino, size, mtime }) = op else { continue };
            let Some(inode) = engine.meta().get(*ino) else { continue };
            let before = match sizes.iter().rev().find(|(i, _)| i == ino) {
                Some(&(_, size)) => size,
                None => self.durable_size(*ino, inode.size()),
            };
            let reach = durable_end.get(ino).copied().unwrap_or(0).max(self.first_volatile_byte(engine, *ino, ops, before));
            let floor = (*size).min(reach);
            if floor > before {
                journal.push(Op::Data(DataOp::Extend { ino: *ino, size: floor, mtime: *mtime }));
            }
            sizes.push((*ino, floor.max(before)));
        }
        Projection { journal, sizes }
    }

    /// Where, at or after `from`, the first block holding residue starts once `ops` apply
    /// (`u64::MAX` if none): every byte of `ino` between `from` and there is durable.
    fn first_volatile_byte(&self, engine: &dyn EngineApi, ino: Ino, ops: &[Op], from: u64) -> u64 {
        let block = engine.geometry().block();
        let from_block = from / block;
        let mut first = u64::MAX;
        let mut edited = Vec::new();
        for op in ops {
            if let Op::Data(DataOp::Map { ino: i, lblock, entry }) = op {
                if *i == ino {
                    edited.push(*lblock);
                    if entry.as_ref().is_some_and(|e| e.fast_page_count() > 0) && *lblock >= from_block {
                        first = first.min(*lblock);
                    }
                }
            }
        }
        if first > from_block {
            if let Some(inode) = engine.meta().get(ino) {
                let map = inode.map.lock();
                let held = map.range(from_block..first).find(|(lb, e)| e.fast_page_count() > 0 && !edited.contains(lb));
                if let Some((&lb, _)) = held {
                    first = lb;
                }
            }
        }
        first.saturating_mul(block)
    }

    /// After a commit applied: remember which files' live sizes run ahead of the journal.
    pub(super) fn note_durable_sizes(&self, engine: &dyn EngineApi, sizes: &[(Ino, u64)]) {
        let mut unsynced = self.unsynced_sizes.lock();
        for &(ino, durable) in sizes {
            match engine.meta().get(ino) {
                Some(inode) if durable < inode.size() => unsynced.insert(ino, durable),
                _ => unsynced.remove(&ino),
            };
        }
    }
}

/// The live state as a crash would leave it: what a checkpoint records.
pub(super) struct AfterCrash<'a> {
    pub state: &'a ScrapState,
}

impl DurableView for AfterCrash<'_> {
    fn entry(&self, entry: &BlockEntry) -> Option<BlockEntry> {
        durable_entry(entry)
    }
    fn size(&self, ino: Ino, size: u64) -> u64 {
        self.state.durable_size(ino, size)
    }
}
