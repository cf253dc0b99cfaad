//! What a profile's policy and its workers may ask of the engine they run in: the narrow
//! interface the policy side defines, and the engine implements. A policy sees no field
//! of the engine, only these operations.

use std::sync::Arc;

use parking_lot::Mutex;

use crate::error::Result;
use crate::geometry::Geometry;
use crate::map::SsdBlock;
use crate::meta::{Ino, Inode, MetaState, Op};
use crate::stats::Counter;

pub(crate) trait EngineApi: Send + Sync {
    fn geometry(&self) -> Geometry;
    /// The metadata as it is in memory (a projection reads files' maps and sizes).
    fn meta(&self) -> &MetaState;
    /// Every counter's value, for a checkpoint.
    fn counters(&self) -> Vec<u64>;
    /// The volume is closing: workers stop.
    fn shutting_down(&self) -> bool;
    /// Writes the volume's callers made since it opened: unchanged means idle.
    fn writes_so_far(&self) -> u64;
    /// How many SSDs the volume spans.
    fn ssd_count(&self) -> usize;
    /// Whether SSD `member` has enough IO in flight that background writes should wait.
    fn ssd_busy(&self, member: usize) -> bool;
    /// The SSD (member of the set) that holds `block`.
    fn ssd_of(&self, block: SsdBlock) -> usize;
    /// Blocks one merge batch takes.
    fn merge_batch(&self) -> usize;
    /// Merge `blocks`' residue into SSD blocks, watching them rather than holding their
    /// locks: blocks a writer is in are left out and returned. Returns how many merged.
    fn merge_blocks(&self, blocks: Vec<(Arc<Inode>, u64)>, cause: Counter) -> Result<(u64, Vec<(Ino, u64)>)>;
    /// Merge every block of `inode` holding residue; the caller holds its whole range.
    fn merge_file_locked(&self, inode: &Arc<Inode>, cause: Counter) -> Result<()>;
    /// Merge every block holding residue.
    fn drain_residue(&self, cause: Counter) -> Result<u64>;
    /// Make `ops` durable and apply them, freeing what they release.
    fn commit(&self, ops: &[Op]) -> Result<()>;
}

/// Blocks one of whose residue units was written to its end, so that merging them needs
/// no read of the SSD: WSBuffer's stage 2, and `nvstore`'s fragment pages that an append
/// completed.
#[derive(Default)]
pub(crate) struct FullBlocks(Mutex<Vec<(Ino, u64)>>);

impl FullBlocks {
    /// Queue `lblocks` of `ino`. Returns how many blocks are queued, repeats included.
    pub(crate) fn push(&self, ino: Ino, lblocks: &[u64]) -> usize {
        let mut queue = self.0.lock();
        queue.extend(lblocks.iter().map(|&lblock| (ino, lblock)));
        queue.len()
    }

    /// How many blocks are queued, repeats included.
    pub(crate) fn len(&self) -> usize {
        self.0.lock().len()
    }

    /// Merge the queued blocks a batch at a time until the queue is empty; blocks a writer
    /// holds meanwhile are queued again for the next call. A queued block that no longer
    /// holds residue (merged since, or removed) is skipped. Returns how many moved.
    pub(crate) fn merge(&self, engine: &dyn EngineApi, cause: Counter) -> Result<u64> {
        let mut moved = 0;
        let mut busy = Vec::new();
        let result = loop {
            let batch: Vec<(Ino, u64)> = {
                let mut queue = self.0.lock();
                queue.sort_unstable();
                queue.dedup();
                let n = queue.len().min(engine.merge_batch());
                queue.drain(..n).collect()
            };
            if batch.is_empty() {
                break Ok(moved);
            }
            let blocks: Vec<(Arc<Inode>, u64)> =
                batch.into_iter().filter_map(|(ino, lblock)| Some((engine.meta().get(ino)?, lblock))).collect();
            match engine.merge_blocks(blocks, cause) {
                Ok((n, mut left)) => {
                    moved += n;
                    busy.append(&mut left);
                }
                Err(e) => break Err(e),
            }
        };
        self.0.lock().extend(busy);
        result
    }
}
