//! A volume: the two devices, the metadata, and the operations the front ends call.
//!
//! Locking, outermost first: a file's range lock → the namespace lock → the commit lock
//! (the metadata store; every metadata change is made durable and applied under it, so
//! durable order is apply order) → an inode's `data`/`map` mutexes (leaf locks, never held
//! across a call into the commit lock).

mod block_store;
mod check;
mod clean_pages;
mod clone;
mod devices;
mod migrate;
mod namespace;
mod open;
mod read;
mod resize;
mod write;

pub use crate::stats::RecoveryReport;
pub use check::Problem;
pub use devices::Devices;
pub use namespace::{
    DirEntry, NamespaceChange, RenameFlags, SetAttrRequest, StatFs, XattrSet, MAX_CHANGES, MAX_NAME_BYTES, MAX_SYMLINK_BYTES,
};
pub use read::SeekTarget;
pub use resize::FallocateMode;
pub use write::MAX_FILE_BYTES;

pub use crate::options::{FormatOptions, MetaStoreChoice, ReadMode, VolumeOptions};

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::Mutex;

use crate::background::Wakeup;

use crate::device::mssd::MemorySemanticSsd;
use crate::device::{BlockDevice, BufferPool, ByteTier};
use crate::error::{Error, Result};
use crate::geometry::Geometry;
use crate::journal::{CommitContext, MetaStore};
use crate::layout::{BlockChecksums, BlockRefs, Superblock};
use crate::map::{PageNo, SsdBlock};
use crate::meta::{apply, DataOp, FileKind, Freed, Ino, MetaState, NamespaceOp, Op};
use crate::profile::Policy;
use crate::residue::ResidueStore;
use crate::stats::{Counter, DeviceCounter, Stats, StatsSnapshot, Usage, VolumeReport};
use clean_pages::CleanPages;

/// Map edits per journal record for operations that edit a block range at once (clone,
/// fallocate): up to this many blocks they are atomic across a crash.
const MAP_OPS_PER_RECORD: usize = 4096;

pub(crate) struct Inner {
    superblock: Superblock,
    pub(crate) geometry: Geometry,
    /// `None` for profiles without a fast tier.
    fast: Option<Arc<dyn ByteTier>>,
    ssd: Arc<dyn BlockDevice>,
    /// The byte interface of a memory-semantic SSD (`byte`; `ssd` is its block interface).
    byte: Option<Arc<MemorySemanticSsd>>,
    residue: Arc<dyn ResidueStore>,
    /// The profile's answers to the data path's questions.
    policy: Box<dyn Policy>,
    blocks: BlockRefs,
    /// Under [`Policy::keeps_blocks_home`] (one SSD): the SSD block that logical block 0
    /// of a file calls home, the first one not reserved. Block `n`'s home is this plus `n`.
    home_base: Option<u64>,
    /// Every SSD block's CRC32C, where the profile verifies reads (`nvstore`).
    checksums: Option<BlockChecksums>,
    /// Copies of SSD blocks, where the profile keeps clean pages (`nvstore`, `byte`).
    clean: Option<CleanPages>,
    pub(crate) meta: MetaState,
    /// The commit lock and the store it guards: where metadata becomes durable.
    committer: Mutex<Box<dyn MetaStore>>,
    /// Commits that want the commit lock or hold it: a group sync about to start lets
    /// them in first. The lock's own state is not enough: between one holder and the
    /// next it reads free, and syncs that started then covered 2.3 commits each with 8
    /// writers, against 3.5 counting these.
    committing: AtomicUsize,
    namespace: Mutex<()>,
    stats: Stats,
    options: VolumeOptions,
    /// SSD writes completed so far, and how many of them the last completed flush covers:
    /// a commit that makes a map point at new SSD blocks waits until they are flushed.
    ssd_writes_done: AtomicU64,
    ssd_writes_flushed: Mutex<u64>,
    /// The last SSD flush failed: writes that needed it failed too, and the next fsync
    /// retries it.
    ssd_flush_failed: AtomicBool,
    buffers: BufferPool,
    /// Wakes the maintenance thread (migration, checkpoints).
    maintenance_due: Wakeup,
    shutdown: AtomicBool,
    /// Background merges between their first allocation and their commit.
    merges_in_flight: AtomicU64,
    /// The directory whose files a crash may lose whole ([`Volume::set_scratch_dir`]).
    scratch_dir: std::sync::OnceLock<Ino>,
    recovery: RecoveryReport,
    /// SSD bytes submitted and not yet complete, per SSD (the flusher's busyness gauge).
    ssd_in_flight: Vec<AtomicU64>,
    /// Debug builds check that no SSD write shares its range with another IO in flight.
    #[cfg(debug_assertions)]
    io_ranges: block_store::InFlightRanges,
}

/// An open alignfs volume.
///
/// ```
/// use std::sync::Arc;
/// use alignfs::device::{PmemRegion, SimSsd};
/// use alignfs::{Devices, FormatOptions, Ino, Volume, VolumeOptions};
///
/// let fast = Arc::new(PmemRegion::anonymous(4 << 20).unwrap());
/// let devices = Devices::new(fast, Arc::new(SimSsd::new(16 << 20)));
/// Volume::format(&devices, &FormatOptions::default()).unwrap();
/// let volume = Volume::open(devices, VolumeOptions::default()).unwrap();
/// let file = volume.create_file(Ino::ROOT, b"hello", 0o644, 0, 0).unwrap();
/// volume.write(file.ino, 0, b"hello, world").unwrap();
/// let mut out = [0u8; 12];
/// assert_eq!(volume.read(file.ino, 0, &mut out).unwrap(), 12);
/// assert_eq!(&out, b"hello, world");
/// volume.close().unwrap();
/// ```
pub struct Volume {
    inner: Arc<Inner>,
    /// The profile's background threads.
    workers: Vec<JoinHandle<()>>,
    closed: bool,
}

impl Volume {
    /// The engine, for the other personalities.
    pub(crate) fn inner(&self) -> &Arc<Inner> {
        &self.inner
    }

    pub fn superblock(&self) -> &Superblock {
        &self.inner.superblock
    }

    pub fn geometry(&self) -> Geometry {
        self.inner.geometry
    }

    pub fn recovery(&self) -> &RecoveryReport {
        &self.inner.recovery
    }

    /// Drop the copies of SSD blocks (clean pages) and of residue units the volume keeps
    /// in DRAM, so that the next reads go to the device: a benchmark's cold reads. The kernel's cache of the
    /// devices is the caller's to drop.
    pub fn drop_clean_pages(&self) {
        if let Some(clean) = &self.inner.clean {
            clean.clear();
        }
        self.inner.residue.drop_copies();
    }

    pub fn describe_devices(&self) -> (String, String, String) {
        let fast = match (&self.inner.fast, &self.inner.byte) {
            (Some(fast), _) => fast.describe(),
            (None, Some(device)) => device.describe_dram(),
            (None, None) => "none".to_string(),
        };
        (fast, self.inner.ssd.describe(), self.inner.residue.describe())
    }

    /// Make `dir` the scratch directory: the caller promises to empty it at every open,
    /// so a crash may lose any change to a file created there. Commits that change only
    /// such files (until one gains a name elsewhere) are then not synced on their own;
    /// the next synced commit, which follows them in the metadata store, makes them
    /// durable with it. The object store stages objects there: a PUT syncs once, when
    /// it publishes. Set once per open.
    pub fn set_scratch_dir(&self, dir: Ino) -> Result<()> {
        if self.inner.get(dir)?.kind != FileKind::Dir {
            return Err(Error::NotDir);
        }
        self.inner.scratch_dir.set(dir).map_err(|_| Error::InvalidArgument("the scratch directory is set already".into()))
    }

    /// Write a checkpoint now (the journal restarts empty).
    pub fn checkpoint(&self) -> Result<()> {
        self.inner.checkpoint()
    }

    /// Wait until no background merge is in flight, so space counters show only blocks
    /// the maps hold (tests and benchmarks that compare them). Returns at once when no
    /// background work runs.
    pub fn settle(&self) {
        while self.inner.merges_in_flight.load(Ordering::SeqCst) > 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Migrate every block that holds fast pages (tests, `alignfs` maintenance).
    pub fn migrate_all(&self) -> Result<u64> {
        self.inner.migrate_some(u64::MAX, Counter::migrations_watermark)
    }

    pub fn stats(&self) -> StatsSnapshot {
        let inner = &self.inner;
        let meta = inner.committer.lock().usage();
        StatsSnapshot {
            counters: Counter::ALL.iter().map(|&c| (c, inner.stats.get(c))).collect(),
            usage: Usage {
                fast_pages_used: inner.residue.used_units(),
                fast_pages_total: inner.residue.capacity_units(),
                fast_page_bytes: u64::from(inner.residue.unit_bytes()),
                ssd_blocks_used: inner.blocks.used_count(),
                ssd_blocks_promised: inner.blocks.promised_count(),
                ssd_blocks_total: inner.blocks.capacity(),
                ssd_block_bytes: inner.geometry.block(),
                journal_used_bytes: meta.log_used_bytes,
                journal_capacity_bytes: meta.log_capacity_bytes,
                checkpoint_generation: meta.checkpoint_generation,
                checkpoint_used_bytes: meta.checkpoint_used_bytes,
                checkpoint_capacity_bytes: meta.checkpoint_capacity_bytes,
                fast_pages_peak: inner.residue.peak_used_units(),
            },
            recovery: inner.recovery.clone(),
            io_backend: inner.ssd.describe(),
        }
    }

    /// Counters, space and devices, as `alignfs stat` prints them.
    pub fn report(&self) -> VolumeReport {
        let s = self.stats();
        let (fast_device, ssd_device, residue) = self.describe_devices();
        VolumeReport {
            uuid: self.superblock().uuid_string(),
            profile: self.superblock().profile.name().to_string(),
            format_version: self.superblock().version,
            in_place_meta: self.superblock().in_place_meta,
            fast_device,
            ssd_device,
            residue,
            residue_name: self.inner.residue.name().to_string(),
            metadata_store: self.inner.committer.lock().name().to_string(),
            counters: s.counters.iter().map(|(c, v)| (c.name().to_string(), *v)).collect(),
            ssd_share: s.ssd_share(),
            usage: s.usage,
            recovery_us: u64::try_from(s.recovery.duration.as_micros()).unwrap_or(u64::MAX),
            records_replayed: s.recovery.records_replayed,
            torn_tail_dropped: s.recovery.torn_tail_dropped,
            device_counters: self.device_counters(),
            daemon: None,
        }
    }

    /// The counters of the SSD itself, where it keeps any (the memory-semantic SSD's
    /// traffic per interface, flash programs, cleanings; docs/BYTE.md).
    pub fn device_counters(&self) -> Vec<DeviceCounter> {
        let Some(byte) = &self.inner.byte else { return Vec::new() };
        let stats = byte.stats();
        stats
            .named()
            .into_iter()
            .map(|(name, value, meaning)| DeviceCounter { name: name.into(), value, meaning: meaning.into() })
            .collect()
    }

    /// Clean shutdown: stop background work, flush the SSD, write a checkpoint.
    pub fn close(mut self) -> Result<()> {
        self.shutdown(true)
    }

    /// [`Volume::close`] for an owner that cannot give the volume up (a FUSE `destroy`
    /// callback). The volume must not be used afterwards.
    pub fn close_in_place(&mut self) -> Result<()> {
        self.shutdown(true)
    }

    /// Stop without flushing or checkpointing, as a crash would (tests).
    pub fn simulate_crash(mut self) {
        let _ = self.shutdown(false);
    }

    fn shutdown(&mut self, clean: bool) -> Result<()> {
        if self.closed {
            return Ok(());
        }
        self.closed = true;
        self.inner.shutdown.store(true, Ordering::SeqCst);
        self.inner.notify_maintenance();
        self.inner.policy.wake_workers();
        for handle in self.workers.drain(..) {
            let _ = handle.join();
        }
        if clean && !self.inner.options.read_only {
            self.inner.policy.before_close(self.inner.as_ref())?;
            self.inner.ssd.flush()?;
            self.inner.checkpoint()?;
        }
        // The emulated device's firmware runs in this process: it stops with the volume.
        if let Some(byte) = &self.inner.byte {
            byte.halt();
        }
        Ok(())
    }
}

impl Drop for Volume {
    fn drop(&mut self) {
        if let Err(e) = self.shutdown(true) {
            tracing::error!("closing the volume: {e}");
        }
    }
}

impl Inner {
    pub(crate) fn check_writable(&self) -> Result<()> {
        if self.options.read_only {
            return Err(Error::ReadOnly);
        }
        Ok(())
    }

    /// Whether the profile sends a write of `len` bytes whole to its residue tier, so
    /// that it takes no SSD IO unless the tier is full (a scheduling hint).
    pub(crate) fn write_goes_to_residue(&self, len: u64) -> bool {
        self.policy.write_rules(len).residue == crate::partition::Residue::All
    }

    /// Whether the profile makes every write durable before it returns.
    pub(crate) fn durable_when_written(&self) -> bool {
        self.superblock.profile.promise() == crate::profile::Promise::OnWrite
    }

    /// Whether an fsync returns without touching the SSD: the profile makes every write
    /// durable before it returns, and no earlier SSD flush failed (which an fsync retries).
    pub(crate) fn fsync_is_free(&self) -> bool {
        self.durable_when_written() && !self.ssd_flush_failed.load(Ordering::SeqCst)
    }

    /// Make `ops` durable as one unit in the metadata store and apply them. Returns the
    /// units they released, which the caller frees (after waiting out users of removed
    /// inodes). The profile may persist less than `ops`: what a crash would keep of them,
    /// and nothing at all when that is nothing.
    pub(crate) fn commit(&self, ops: &[Op]) -> Result<Freed> {
        self.check_writable()?;
        let committing = Committing::enter(&self.committing);
        let mut committer = self.committer.lock();
        for op in ops {
            if let Op::Data(DataOp::Map { ino, .. })
            | Op::Data(DataOp::Extend { ino, .. })
            | Op::Data(DataOp::SetSize { ino, .. })
            | Op::Namespace(NamespaceOp::SetAttr { ino, .. })
            | Op::Namespace(NamespaceOp::SetXattr { ino, .. }) = op
            {
                if self.meta.get(*ino).is_none() {
                    return Err(Error::NotFound);
                }
            }
        }
        let scratch_only = self.scratch_only(ops);
        let projection = self.policy.project(self, ops);
        let journaled = projection.as_ref().map_or(ops, |p| p.journal.as_slice());
        let mut apply_all = || {
            let mut freed = Freed::default();
            for op in ops {
                let released = apply(&self.meta, op).unwrap_or_else(|e| panic!("validated op failed to apply: {} ({op:?})", e.0));
                freed.extend(released);
            }
            freed
        };
        let freed = self.with_commit_context(|cx| committer.commit(cx, journaled, &mut apply_all))?;
        if let Some(projection) = projection {
            self.policy.committed(self, projection, &freed);
        }
        self.track_scratch(ops);
        if committer.wants_checkpoint() {
            self.notify_maintenance();
        }
        // A commit that changes only scratch files is ordered in the store but not synced
        // on its own: the next synced commit covers it.
        let group = committer.group_sync().filter(|_| !scratch_only).map(|group| {
            let ticket = group.ordered();
            (group, ticket)
        });
        drop(committer);
        drop(committing);
        // Group commit: durable before returning, so that what the commit freed is reused
        // only once no crash can bring back the state that used it.
        if let Some((group, ticket)) = group {
            if group.sync_through(ticket, &|| self.committing.load(Ordering::SeqCst) > 0)? {
                self.stats.add(Counter::kv_syncs, 1);
            }
        }
        Ok(freed)
    }

    /// Whether every op changes only scratch files (or the scratch directory's entries
    /// for them). Decided before the ops apply; false whenever in doubt.
    fn scratch_only(&self, ops: &[Op]) -> bool {
        let Some(&dir) = self.scratch_dir.get() else { return false };
        let scratch = |ino: &Ino| self.meta.get(*ino).is_some_and(|inode| inode.scratch.load(Ordering::SeqCst));
        !ops.is_empty()
            && ops.iter().all(|op| match op {
                Op::Namespace(NamespaceOp::Create { parent, attr, .. }) => *parent == dir && attr.kind == FileKind::File,
                Op::Namespace(NamespaceOp::Unlink { parent, name, .. }) => {
                    *parent == dir && self.meta.child(dir, name).is_some_and(|i| scratch(&i))
                }
                Op::Namespace(NamespaceOp::Free { ino })
                | Op::Namespace(NamespaceOp::SetAttr { ino, .. })
                | Op::Namespace(NamespaceOp::SetXattr { ino, .. })
                | Op::Data(DataOp::Map { ino, .. })
                | Op::Data(DataOp::Extend { ino, .. })
                | Op::Data(DataOp::SetSize { ino, .. }) => scratch(ino),
                Op::Namespace(NamespaceOp::Link { .. }) | Op::Namespace(NamespaceOp::Rename { .. }) => false,
            })
    }

    /// After `ops` applied: a file created in the scratch directory is scratch; one that
    /// gains a name elsewhere is not any more.
    fn track_scratch(&self, ops: &[Op]) {
        let Some(&dir) = self.scratch_dir.get() else { return };
        let set = |ino: Ino, scratch: bool| {
            if let Some(inode) = self.meta.get(ino) {
                inode.scratch.store(scratch, Ordering::SeqCst);
            }
        };
        for op in ops {
            match op {
                Op::Namespace(NamespaceOp::Create { parent, attr, .. }) if *parent == dir => set(attr.ino, true),
                Op::Namespace(NamespaceOp::Link { ino, .. }) => set(*ino, false),
                Op::Namespace(NamespaceOp::Rename { from_parent, from_name, to_parent, to_name, .. })
                    if *from_parent == dir || *to_parent == dir =>
                {
                    // Both names, whatever moved where (an exchange swaps them).
                    for ino in [self.meta.child(*from_parent, from_name), self.meta.child(*to_parent, to_name)].into_iter().flatten() {
                        set(ino, false);
                    }
                }
                _ => {}
            }
        }
    }

    /// Run `f` with what the metadata store borrows from the engine.
    fn with_commit_context<R>(&self, f: impl FnOnce(&CommitContext<'_>) -> R) -> R {
        let payload = || self.policy.checkpoint_payload(self);
        f(&CommitContext {
            stats: &self.stats,
            meta: &self.meta,
            checkpoint_payload: &payload,
            checksums: self.checksums.as_ref(),
            #[cfg(debug_assertions)]
            pages_per_block: self.geometry.pages_per_block(),
            #[cfg(debug_assertions)]
            page_bytes: self.geometry.page_bytes,
        })
    }

    /// Return units to their allocators.
    fn release(&self, pages: &[PageNo], blocks: &[SsdBlock]) {
        if !pages.is_empty() {
            self.residue.free(pages);
        }
        if !blocks.is_empty() {
            self.blocks.release(blocks.iter().map(|b| b.0));
            if let Some(clean) = &self.clean {
                clean.forget(blocks);
            }
        }
    }

    /// Free what a commit released; removed inodes' units wait until no reader or writer
    /// of that inode is left.
    pub(crate) fn release_freed(&self, freed: Freed) {
        for inode in &freed.removed {
            drop(inode.range.write(0, u64::MAX));
        }
        if freed.promises > 0 {
            self.blocks.release_promises(freed.promises);
        }
        self.release(&freed.pages, &freed.blocks);
    }

    fn checkpoint(&self) -> Result<()> {
        self.check_writable()?;
        let mut committer = self.committer.lock();
        self.with_commit_context(|cx| committer.checkpoint(cx))
    }

    fn notify_maintenance(&self) {
        self.maintenance_due.notify();
    }

    /// Every counter's value, in [`Counter::ALL`] order.
    pub(crate) fn counters(&self) -> Vec<u64> {
        self.stats.all()
    }

    /// Whether the volume is closing: background workers stop.
    pub(crate) fn shutting_down(&self) -> bool {
        self.shutdown.load(Ordering::SeqCst)
    }

    /// How many SSDs the volume spans.
    pub(crate) fn ssd_count(&self) -> usize {
        self.ssd_in_flight.len()
    }
}

impl crate::profile::Engine for Inner {
    fn geometry(&self) -> Geometry {
        self.geometry
    }
    fn meta(&self) -> &MetaState {
        &self.meta
    }
    fn counters(&self) -> Vec<u64> {
        Inner::counters(self)
    }
    fn shutting_down(&self) -> bool {
        Inner::shutting_down(self)
    }
    fn writes_so_far(&self) -> u64 {
        Inner::writes_so_far(self)
    }
    fn ssd_count(&self) -> usize {
        Inner::ssd_count(self)
    }
    fn ssd_busy(&self, member: usize) -> bool {
        Inner::ssd_busy(self, member)
    }
    fn ssd_of(&self, block: SsdBlock) -> usize {
        self.member_of(block.0 * self.geometry.block())
    }
    fn merge_batch(&self) -> usize {
        self.migration_batch()
    }
    fn merge_blocks(&self, blocks: Vec<(Arc<crate::meta::Inode>, u64)>, cause: Counter) -> Result<(u64, Vec<(Ino, u64)>)> {
        self.migrate_blocks_watched(blocks, cause)
    }
    fn merge_file_locked(&self, inode: &Arc<crate::meta::Inode>, cause: Counter) -> Result<()> {
        Inner::merge_file_locked(self, inode, cause)
    }
    fn drain_residue(&self, cause: Counter) -> Result<u64> {
        Inner::drain_residue(self, cause)
    }
    fn commit(&self, ops: &[Op]) -> Result<()> {
        let freed = Inner::commit(self, ops)?;
        self.release_freed(freed);
        Ok(())
    }
}

/// Counts a commit in [`Inner::committing`] from before it asks for the commit lock until
/// it has been ordered, whichever way it leaves.
struct Committing<'a>(&'a AtomicUsize);

impl<'a> Committing<'a> {
    fn enter(count: &'a AtomicUsize) -> Committing<'a> {
        count.fetch_add(1, Ordering::SeqCst);
        Committing(count)
    }
}

impl Drop for Committing<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A small `orch` volume on anonymous memory and a simulated SSD, without background
/// threads, for the volume's own tests.
#[cfg(test)]
pub(crate) fn test_volume() -> Volume {
    let fast = Arc::new(crate::device::PmemRegion::anonymous(8 << 20).unwrap());
    let devices = Devices::new(fast, Arc::new(crate::device::SimSsd::new(32 << 20)));
    Volume::format(&devices, &FormatOptions::default()).unwrap();
    Volume::open(devices, VolumeOptions { background: false, ..VolumeOptions::default() }).unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_commit_is_not_counted_as_waiting_for_the_commit_lock() {
        let volume = test_volume();
        let inner = volume.inner();
        let missing = Op::Data(DataOp::SetSize { ino: Ino(999), size: 1, time: 0 });
        assert!(matches!(inner.commit(&[missing]), Err(Error::NotFound)));
        assert_eq!(inner.committing.load(Ordering::SeqCst), 0, "every group sync would wait out its deadline");
        inner.commit(&[]).unwrap();
        assert_eq!(inner.committing.load(Ordering::SeqCst), 0);
    }
}
