//! WSBuffer's two flush stages and its fsync: scrap pages go back to the SSD when a unit
//! is full (stage 2, no read needed), when the SSD is idle and a block has waited (stage
//! 1), and for every block of a file on fsync.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::ScrapState;
use crate::error::Result;
use crate::map::BlockEntry;
use crate::meta::{DataOp, FileKind, Ino, Inode, Op};
use crate::profile::EngineApi;
use crate::stats::Counter;

/// How long a block keeps volatile residue before an idle SSD takes it (stage 1).
const IDLE_FLUSH_AGE: Duration = Duration::from_millis(500);

impl ScrapState {
    /// WSBuffer's stage 1 when the SSDs are idle: merge the blocks that have held residue
    /// for at least [`IDLE_FLUSH_AGE`] (so a block still being filled is left alone), oldest
    /// first, a batch at a time. A block whose SSD is busy waits for a later round.
    pub(crate) fn flush_when_idle(&self, engine: &dyn EngineApi) -> Result<u64> {
        let due: Vec<(Instant, Ino, u64)> = {
            let dirty = self.dirty_since.lock();
            let mut due: Vec<(Instant, Ino, u64)> =
                dirty.iter().filter(|(_, since)| since.elapsed() >= IDLE_FLUSH_AGE).map(|(&(ino, lb), &t)| (t, ino, lb)).collect();
            due.sort_unstable();
            due
        };
        let mut moved = 0;
        for batch in due.chunks(engine.merge_batch()) {
            if engine.shutting_down() || (0..engine.ssd_count()).all(|m| engine.ssd_busy(m)) {
                break;
            }
            let mut files = Vec::new();
            let mut since = HashMap::new();
            for &(t, ino, lblock) in batch {
                let Some(inode) = engine.meta().get(ino) else { continue };
                let home = inode.map.lock().get(&lblock).and_then(BlockEntry::ssd_block).map(|b| engine.ssd_of(b));
                // A block whose SSD is busy stays due.
                if !home.is_some_and(|m| engine.ssd_busy(m)) {
                    files.push((inode, lblock));
                    since.insert((ino, lblock), t);
                }
            }
            {
                let mut dirty = self.dirty_since.lock();
                for key in since.keys() {
                    dirty.remove(key);
                }
            }
            let (n, left) = engine.merge_blocks(files, Counter::migrations_idle)?;
            moved += n;
            // Blocks a writer was in stay due, as old as they were.
            let mut dirty = self.dirty_since.lock();
            for key in left {
                let t = since[&key];
                dirty.entry(key).and_modify(|e| *e = (*e).min(t)).or_insert(t);
            }
        }
        Ok(moved)
    }

    /// Flush every block of `inode` that holds residue, then journal its size and mtime:
    /// afterwards a crash keeps the file as it is. The caller holds the whole file's range
    /// lock.
    pub(crate) fn sync_file_locked(&self, engine: &dyn EngineApi, inode: &Arc<Inode>) -> Result<()> {
        engine.merge_file_locked(inode, Counter::migrations_sync)?;
        let attr = inode.attr();
        if self.durable_size(inode.ino, attr.size) < attr.size {
            engine.commit(&[Op::Data(DataOp::Extend { ino: inode.ino, size: attr.size, mtime: attr.mtime })])?;
        }
        Ok(())
    }

    /// [`ScrapState::sync_file_locked`] for every file (unmount).
    pub(crate) fn sync_all(&self, engine: &dyn EngineApi) -> Result<()> {
        for inode in engine.meta().snapshot().into_iter().filter(|i| i.kind == FileKind::File) {
            let _guard = inode.range.write(0, u64::MAX);
            if engine.meta().get(inode.ino).is_some() {
                self.sync_file_locked(engine, &inode)?;
            }
        }
        Ok(())
    }
}
