//! `scrap` — WSBuffer: residue in DRAM scrap pages (one SSD block each), metadata on the
//! SSD, one or more SSDs; writes are durable after fsync, like a page cache. Two flush
//! stages write scrap pages back (docs/SCRAP.md).

mod durable;
mod flush;

use std::collections::HashMap;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::{DeviceKind, EngineApi, FullBlocks, Policy, Profile, ProfileSpec, Projection, Promise, ResidueSetup, Tunable};
use crate::background::{spawn, Wakeup};
use crate::error::{Error, Result};
use crate::geometry::{Geometry, IO_ALIGN, KIB, MIB, SCRAP_MAX_SEGMENTS};
use crate::journal::checkpoint_payload;
use crate::layout::MAX_SSDS;
use crate::meta::{DataOp, Freed, Ino, Inode, Op};
use crate::options::VolumeOptions;
use crate::partition::{Plan, Residue, Rules};
use crate::residue::{ResidueStore, ScrapPages};
use crate::stats::Counter;

impl Profile {
    pub const SCRAP: Profile = Profile(2);
}

// Scrap page headers hold one more segment than the journal's upage encoding; they never
// reach the journal, whose records carry only what a crash keeps (durable::durable_entry).

/// WSBuffer's request-size threshold: below 1 MiB, a write is buffered whole.
const DEFAULT_REQUEST_THRESHOLD: u64 = MIB;

pub(super) struct Scrap;

impl ProfileSpec for Scrap {
    fn profile(&self) -> Profile {
        Profile::SCRAP
    }
    fn name(&self) -> &'static str {
        "scrap"
    }
    fn summary(&self) -> &'static str {
        "WSBuffer: residue in DRAM scrap pages (--scrap-mem), SSDs only, durable on fsync"
    }
    fn devices(&self) -> DeviceKind {
        DeviceKind::Ssds { max: MAX_SSDS }
    }
    fn promise(&self) -> Promise {
        Promise::OnSync
    }
    fn tunables(&self) -> &'static [Tunable] {
        &[Tunable::Watermarks, Tunable::ResidueMemory, Tunable::RequestThreshold, Tunable::FlushWorkers, Tunable::CommitInterval]
    }
    /// The block is one scrap page of 256 KiB.
    fn default_geometry(&self) -> Geometry {
        Geometry { block_bytes: 256 * 1024, page_bytes: 256 * 1024, ..Geometry::default() }
    }
    fn validate_geometry(&self, geometry: &Geometry) -> Result<()> {
        let (b, p) = (geometry.block(), geometry.page());
        if p != b || !p.is_power_of_two() || !(64 * KIB..=16 * MIB).contains(&p) {
            return Err(Error::Geometry(format!(
                "the scrap page is one block: block and page size ({b}, {p}) must be equal, a power of two between 64 KiB and 16 MiB"
            )));
        }
        Ok(())
    }
    fn max_segments(&self) -> usize {
        SCRAP_MAX_SEGMENTS
    }
    fn residue_store(&self, setup: &ResidueSetup<'_>) -> Result<Arc<dyn ResidueStore>> {
        Ok(Arc::new(ScrapPages::new(setup.options.scrap_mem_bytes, setup.geometry.page_bytes)?))
    }
    fn policy(&self, options: &VolumeOptions) -> Box<dyn Policy> {
        Box::new(ScrapPolicy(Arc::new(ScrapState {
            request_threshold: options.request_threshold.unwrap_or(DEFAULT_REQUEST_THRESHOLD),
            flush_workers: options.flush_workers.max(1),
            unsynced_sizes: Mutex::new(HashMap::new()),
            full_units: FullBlocks::default(),
            dirty_since: Mutex::new(HashMap::new()),
            flush_due: Wakeup::default(),
        })))
    }
}

/// What the scrap policy tracks beside the engine's state.
pub(crate) struct ScrapState {
    /// Writes this large or larger send their whole blocks straight to the SSD; smaller
    /// ones go whole to the scrap buffer (WSBuffer's request-size threshold).
    request_threshold: u64,
    flush_workers: usize,
    /// Files whose size a crash would not keep: ino → the size last journaled.
    unsynced_sizes: Mutex<HashMap<Ino, u64>>,
    /// Blocks whose scrap page became full, for stage 2.
    full_units: FullBlocks,
    /// Blocks holding residue, and since when (stage 1 takes the oldest).
    dirty_since: Mutex<HashMap<(Ino, u64), Instant>>,
    /// Wakes the flushers.
    flush_due: Wakeup,
}

struct ScrapPolicy(Arc<ScrapState>);

impl Policy for ScrapPolicy {
    /// WSBuffer's buffer-minimized writes: below the request threshold, all of a write is
    /// residue. The threshold allows one page less: the kernel cuts a FUSE write whose
    /// buffer does not start on a page boundary into a piece one page short and a small tail.
    fn write_rules(&self, len: u64) -> Rules {
        let small = len + IO_ALIGN as u64 <= self.0.request_threshold;
        Rules { residue: if small { Residue::All } else { Residue::Partial }, max_segments: SCRAP_MAX_SEGMENTS }
    }

    fn project(&self, engine: &dyn EngineApi, ops: &[Op]) -> Option<Projection> {
        Some(self.0.durable_ops(engine, ops))
    }

    fn committed(&self, engine: &dyn EngineApi, projection: Projection, freed: &Freed) {
        self.0.note_durable_sizes(engine, &projection.sizes);
        let mut unsynced = self.0.unsynced_sizes.lock();
        for inode in &freed.removed {
            unsynced.remove(&inode.ino);
        }
    }

    fn checkpoint_payload(&self, engine: &dyn EngineApi) -> Vec<u8> {
        checkpoint_payload(engine.meta(), &engine.counters(), &durable::AfterCrash { state: &self.0 })
    }

    fn residue_stored(&self, _engine: &dyn EngineApi, inode: &Inode, plan: &Plan, full: &[u64]) {
        {
            let mut dirty = self.0.dirty_since.lock();
            for bp in plan.blocks.iter().filter(|b| !b.needs_ssd_block()) {
                dirty.entry((inode.ino, bp.lblock)).or_insert_with(Instant::now);
            }
        }
        if !full.is_empty() {
            self.0.full_units.push(inode.ino, full);
            self.0.flush_due.notify();
        }
    }

    /// Flush the file's scrap pages to the SSD and journal its size.
    fn fsync(&self, engine: &dyn EngineApi, inode: &Arc<Inode>) -> Result<()> {
        let _guard = inode.range.write(0, u64::MAX);
        self.0.sync_file_locked(engine, inode)
    }

    fn before_close(&self, engine: &dyn EngineApi) -> Result<()> {
        self.0.sync_all(engine)
    }

    /// The flushers: full scrap pages as they come (stage 2), then blocks that have waited
    /// while the SSD is idle (stage 1). Flushers take disjoint batches.
    fn start_workers(&self, engine: &Arc<dyn EngineApi>) -> Result<Vec<JoinHandle<()>>> {
        let mut workers = Vec::new();
        for id in 0..self.0.flush_workers {
            let (engine, state) = (Arc::clone(engine), Arc::clone(&self.0));
            workers.push(spawn(format!("alignfs-flush{id}"), move || {
                while !engine.shutting_down() {
                    state.flush_due.wait(Duration::from_millis(100));
                    if engine.shutting_down() {
                        break;
                    }
                    if let Err(e) = state
                        .full_units
                        .merge(engine.as_ref(), Counter::migrations_full)
                        .and_then(|_| state.flush_when_idle(engine.as_ref()))
                    {
                        tracing::warn!("flushing scrap pages: {e}");
                    }
                }
            })?);
        }
        Ok(workers)
    }

    fn wake_workers(&self) {
        self.0.flush_due.notify();
    }

    /// On the SSD every journal record costs a flush: one record per merge batch.
    fn merge_commit_batch(&self) -> usize {
        usize::MAX
    }

    /// Each merged file's size becomes durable as far as its data now is.
    fn merge_ops(&self, files: &[&Arc<Inode>], ops: &mut Vec<Op>) {
        for inode in files {
            let attr = inode.attr();
            ops.push(Op::Data(DataOp::Extend { ino: inode.ino, size: attr.size, mtime: attr.mtime }));
        }
    }
}
