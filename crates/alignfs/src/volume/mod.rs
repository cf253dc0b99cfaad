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
mod committer;
mod devices;
mod engine;
mod engine_api;
mod eof;
mod maintenance;
mod migrate;
mod migrator;
mod namespace;
mod open;
mod read;
mod recover;
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

use std::sync::Arc;
use std::thread::JoinHandle;

use crate::error::{Error, Result};
use crate::geometry::Geometry;
use crate::layout::Superblock;
use crate::meta::{Attr, FileKind, Ino};
use crate::stats::{Counter, DeviceCounter, StatsSnapshot, Usage, VolumeReport};
pub(crate) use engine::Engine;

/// Map edits per journal record for operations that edit a block range at once (clone,
/// fallocate): up to this many blocks they are atomic across a crash.
const MAP_OPS_PER_RECORD: usize = 4096;

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
    inner: Arc<Engine>,
    /// The profile's background threads.
    workers: Vec<JoinHandle<()>>,
    closed: bool,
}

impl Volume {
    /// A regular file, for a personality that keeps one open as its object.
    pub(crate) fn object(&self, ino: Ino) -> Result<Arc<crate::meta::Inode>> {
        self.inner.file(ino)
    }

    /// Write into `object` within its size (a block volume's object: its size is fixed,
    /// and a write journals map edits alone).
    pub(crate) fn write_within(&self, object: &Arc<crate::meta::Inode>, offset: u64, data: &[u8]) -> Result<usize> {
        write::write_object(&self.inner, object, offset, data, false)
    }

    /// Whether a write of `len` bytes goes whole to the residue tier (a scheduling hint).
    pub(crate) fn write_goes_to_residue(&self, len: u64) -> bool {
        self.inner.write_goes_to_residue(len)
    }

    /// Whether an fsync would return without touching the SSD.
    pub(crate) fn fsync_is_free(&self) -> bool {
        self.inner.fsync_is_free()
    }

    pub(crate) fn check_writable(&self) -> Result<()> {
        self.inner.check_writable()
    }

    #[cfg(test)]
    pub(crate) fn inner(&self) -> &Arc<Engine> {
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
        self.inner.blocks.drop_copies();
        self.inner.residue.drop_copies();
    }

    pub fn describe_devices(&self) -> (String, String, String) {
        let fast = match (&self.inner.fast, &self.inner.device) {
            (Some(fast), _) => fast.describe(),
            (None, Some(device)) => device.describe_dram(),
            (None, None) => "none".to_string(),
        };
        (fast, self.inner.blocks.describe(), self.inner.residue.describe())
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
        self.inner.committer.set_scratch_dir(dir)
    }

    /// Write a checkpoint now (the journal restarts empty).
    pub fn checkpoint(&self) -> Result<()> {
        self.inner.checkpoint()
    }

    /// Wait until no background merge is in flight, so space counters show only blocks
    /// the maps hold (tests and benchmarks that compare them). Returns at once when no
    /// background work runs.
    pub fn settle(&self) {
        self.inner.migrator.settle();
    }

    /// Migrate every block that holds fast pages (tests, `alignfs` maintenance).
    pub fn migrate_all(&self) -> Result<u64> {
        migrate::merge_some(&self.inner, u64::MAX, Counter::migrations_watermark)
    }

    pub fn stats(&self) -> StatsSnapshot {
        let inner = &self.inner;
        let meta = inner.committer.usage();
        StatsSnapshot {
            counters: Counter::ALL.iter().map(|&c| (c, inner.stats.get(c))).collect(),
            usage: Usage {
                fast_pages_used: inner.residue.used_units(),
                fast_pages_total: inner.residue.capacity_units(),
                fast_page_bytes: u64::from(inner.residue.unit_bytes()),
                ssd_blocks_used: inner.blocks.refs.used_count(),
                ssd_blocks_promised: inner.blocks.refs.promised_count(),
                ssd_blocks_total: inner.blocks.refs.capacity(),
                ssd_block_bytes: inner.geometry.block(),
                journal_used_bytes: meta.log_used_bytes,
                journal_capacity_bytes: meta.log_capacity_bytes,
                checkpoint_generation: meta.checkpoint_generation,
                checkpoint_used_bytes: meta.checkpoint_used_bytes,
                checkpoint_capacity_bytes: meta.checkpoint_capacity_bytes,
                fast_pages_peak: inner.residue.peak_used_units(),
                namespace_ops_waiting: meta.deferred_ops,
            },
            recovery: inner.recovery.clone(),
            io_backend: inner.blocks.describe(),
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
            metadata_store: self.inner.committer.store_name().to_string(),
            counters: s.counters.iter().map(|(c, v)| (c.name().to_string(), *v)).collect(),
            ssd_share: s.ssd_share(),
            usage: s.usage,
            ssd_cached_bytes: self.inner.blocks.cached_bytes(),
            recovery_us: u64::try_from(s.recovery.duration.as_micros()).unwrap_or(u64::MAX),
            records_replayed: s.recovery.records_replayed,
            torn_tail_dropped: s.recovery.torn_tail_dropped,
            device_counters: self.device_counters(),
            device_recovery: self.inner.device.as_ref().map(|device| device.recovery()),
            daemon: None,
        }
    }

    /// The counters of the SSD itself, where it keeps any (the memory-semantic SSD's
    /// traffic per interface, flash programs, cleanings; docs/BYTE.md).
    pub fn device_counters(&self) -> Vec<DeviceCounter> {
        let Some(byte) = &self.inner.device else { return Vec::new() };
        let stats = byte.stats();
        stats
            .named()
            .into_iter()
            .map(|(name, value, meaning)| DeviceCounter { name: name.into(), value, meaning: meaning.into() })
            .collect()
    }

    /// What `syncfs(2)` promises, which the kernel does not forward to a FUSE daemon:
    /// every file's data written back (`scrap`), every namespace op journaled, the SSD
    /// flushed.
    pub fn sync_all(&self) -> Result<()> {
        self.inner.check_writable()?;
        self.inner.policy.before_close(self.inner.as_ref())?;
        self.inner.sync_deferred()?;
        self.inner.blocks.flush()
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
        self.inner.begin_shutdown();
        for handle in self.workers.drain(..) {
            let _ = handle.join();
        }
        if clean && !self.inner.options.read_only {
            self.inner.policy.before_close(self.inner.as_ref())?;
            self.inner.blocks.ssd().flush()?;
            self.inner.checkpoint()?;
        }
        // The emulated device's firmware runs in this process: it stops with the volume.
        if let Some(device) = &self.inner.device {
            device.halt();
        }
        Ok(())
    }

    /// Write `data` at `offset`. Returns when the write is as durable as the profile
    /// promises ([`crate::profile::Promise`]): for `orch`, residue persisted, SSD IOs
    /// completed and flushed, map edit journaled; for `scrap`, after the next fsync.
    pub fn write(&self, ino: Ino, offset: u64, data: &[u8]) -> Result<usize> {
        write::write(&self.inner, ino, offset, data)
    }

    /// Write back pages a page cache held (FUSE's write-back of cached pages, a shared
    /// mapping's stores). Where the profile picks the interface by a page's modified ratio
    /// (`byte`: [`crate::profile::Policy::write_back_line_share`]), each whole block inside
    /// the file is compared, 64 bytes at a time, with the block as the volume holds it:
    /// an unchanged block is not written, one with few changed lines sends each run of
    /// them as a small write, and the rest go whole. Otherwise the same as
    /// [`Volume::write`].
    pub fn write_back(&self, ino: Ino, offset: u64, data: &[u8]) -> Result<usize> {
        write::write_back(&self.inner, ino, offset, data)
    }

    /// Whether every write is durable when it returns, so that an fsync after it has
    /// nothing to add (`orch`, and every profile whose promise is
    /// [`crate::profile::Promise::OnWrite`]).
    pub fn durable_when_written(&self) -> bool {
        self.inner.durable_when_written()
    }

    /// Make the file durable. Where the profile makes every write durable when it
    /// returns (`orch`: its SSD blocks were flushed before its map edit was journaled), this
    /// only retries a flush that failed. Where writes are durable on fsync (`scrap`), the
    /// profile first writes the file's residue to the SSD and journals its size.
    ///
    /// It flushes the SSD only for the file's own blocks overwritten in place, not for SSD
    /// writes nobody acknowledged yet: fsync would then wait for background migration's
    /// writes and flush.
    pub fn fsync(&self, ino: Ino) -> Result<()> {
        write::fsync(&self.inner, ino)
    }

    /// The first offset at or after `offset` that starts data or a hole, at block
    /// granularity; the end of the file counts as a hole, and so does a zero block
    /// (`fallocate`'s, like ext4's unwritten extents). `BeyondEnd` past EOF.
    pub fn seek(&self, ino: Ino, offset: u64, target: SeekTarget) -> Result<u64> {
        read::seek(&self.inner, ino, offset, target)
    }

    /// What has been read from and written to a file (object) since the volume opened:
    /// (writes, bytes written, reads, bytes read).
    pub fn object_io(&self, ino: Ino) -> Result<(u64, u64, u64, u64)> {
        read::object_io(&self.inner, ino)
    }

    /// Read into `buf` from `offset`; returns the bytes read (short at EOF).
    pub fn read(&self, ino: Ino, offset: u64, buf: &mut [u8]) -> Result<usize> {
        read::read(&self.inner, ino, offset, buf)
    }

    /// [`Volume::read`] for a reader that keeps what it reads, as the kernel's page cache of
    /// a mounted file does: the SSD is read directly (O_DIRECT), so that the host's cache
    /// of it does not hold the same bytes a second time.
    pub fn read_kept_by_reader(&self, ino: Ino, offset: u64, buf: &mut [u8]) -> Result<usize> {
        read::read_kept_by_reader(&self.inner, ino, offset, buf)
    }

    /// [`Volume::read`] only if no byte has to come from the device: the residue tier,
    /// clean pages or the kernel's cache of the SSD (buffered read mode) hold them all.
    /// [`Error::WouldBlock`] otherwise, with nothing counted, so the caller can read
    /// again, waiting, on a thread where that is cheap.
    pub fn read_if_cached(&self, ino: Ino, offset: u64, buf: &mut [u8]) -> Result<usize> {
        read::read_if_cached(&self.inner, ino, offset, buf)
    }

    /// [`Volume::read`] on behalf of no application: what a mount reads to fill the
    /// kernel's page cache, counted apart from the application's reads. The SSD is read
    /// directly, as in [`Volume::read_kept_by_reader`].
    pub fn read_for_page_cache(&self, ino: Ino, offset: u64, buf: &mut [u8]) -> Result<usize> {
        read::read_for_page_cache(&self.inner, ino, offset, buf)
    }

    /// Set the size; shrinking frees whole blocks and zeroes the tail of the last one.
    pub fn truncate(&self, ino: Ino, size: u64) -> Result<()> {
        resize::truncate(&self.inner, ino, size)
    }

    pub fn fallocate(&self, ino: Ino, offset: u64, len: u64, mode: FallocateMode) -> Result<()> {
        resize::fallocate(&self.inner, ino, offset, len, mode)
    }

    /// Make `dst` a copy of `src` (size and data) that shares `src`'s SSD blocks. Both are
    /// regular files; `dst`'s old data is dropped. A clone of more than
    /// [`MAP_OPS_PER_RECORD`] blocks commits in several records, the target's size first,
    /// so a crash leaves it reading zeros where blocks were not shared yet.
    pub fn clone_file(&self, src: Ino, dst: Ino) -> Result<()> {
        clone::clone_file(&self.inner, src, dst)
    }

    /// Put a copy of `src` at `offset` of `dst`, sharing `src`'s SSD blocks: `dst` grows
    /// to `offset` + `src`'s size. `offset` must be a multiple of the block size, at or
    /// past the end of `dst` (nothing of `dst` is replaced). Returns the bytes cloned. A
    /// multipart upload's parts become its object this way.
    pub fn clone_into(&self, src: Ino, dst: Ino, offset: u64) -> Result<u64> {
        clone::clone_into(&self.inner, src, dst, offset)
    }

    pub fn getattr(&self, ino: Ino) -> Result<Attr> {
        namespace::getattr(&self.inner, ino)
    }

    pub fn lookup(&self, parent: Ino, name: &[u8]) -> Result<Attr> {
        namespace::lookup(&self.inner, parent, name)
    }

    /// A directory's parent (the root is its own parent).
    pub fn parent(&self, dir: Ino) -> Result<Ino> {
        namespace::parent(&self.inner, dir)
    }

    /// Resolve an absolute path (no symlinks followed).
    pub fn resolve(&self, path: &str) -> Result<Ino> {
        namespace::resolve(&self.inner, path)
    }

    pub fn create_file(&self, parent: Ino, name: &[u8], perm: u16, uid: u32, gid: u32) -> Result<Attr> {
        namespace::create_file(&self.inner, parent, name, perm, uid, gid)
    }

    pub fn mkdir(&self, parent: Ino, name: &[u8], perm: u16, uid: u32, gid: u32) -> Result<Attr> {
        namespace::mkdir(&self.inner, parent, name, perm, uid, gid)
    }

    pub fn symlink(&self, parent: Ino, name: &[u8], target: &[u8], uid: u32, gid: u32) -> Result<Attr> {
        namespace::symlink(&self.inner, parent, name, target, uid, gid)
    }

    /// A special file (FIFO, socket, device node) or a regular file.
    #[allow(clippy::too_many_arguments)]
    pub fn mknod(&self, parent: Ino, name: &[u8], kind: FileKind, perm: u16, rdev: u32, uid: u32, gid: u32) -> Result<Attr> {
        namespace::mknod(&self.inner, parent, name, kind, perm, rdev, uid, gid)
    }

    pub fn readlink(&self, ino: Ino) -> Result<Vec<u8>> {
        namespace::readlink(&self.inner, ino)
    }

    pub fn readdir(&self, ino: Ino) -> Result<Vec<DirEntry>> {
        namespace::readdir(&self.inner, ino)
    }

    /// Up to `limit` entries of a directory from `start` on, in byte order of their names:
    /// one page of a large directory without copying the rest.
    pub fn readdir_from(&self, ino: Ino, start: std::ops::Bound<&[u8]>, limit: usize) -> Result<Vec<DirEntry>> {
        namespace::readdir_from(&self.inner, ino, start, limit)
    }

    pub fn link(&self, ino: Ino, parent: Ino, name: &[u8]) -> Result<Attr> {
        namespace::link(&self.inner, ino, parent, name)
    }

    pub fn unlink(&self, parent: Ino, name: &[u8]) -> Result<()> {
        namespace::unlink(&self.inner, parent, name)
    }

    pub fn rmdir(&self, parent: Ino, name: &[u8]) -> Result<()> {
        namespace::rmdir(&self.inner, parent, name)
    }

    pub fn rename(&self, from_parent: Ino, from_name: &[u8], to_parent: Ino, to_name: &[u8], flags: RenameFlags) -> Result<()> {
        namespace::rename(&self.inner, from_parent, from_name, to_parent, to_name, flags)
    }

    /// Apply `changes` as one transaction: every change is checked first, then all are
    /// committed in one metadata record, so a crash leaves all of them or none. Each is
    /// checked against the namespace as it was before the transaction, so a transaction
    /// is refused (`InvalidArgument`) unapplied if it touches a name twice, drops two
    /// names of one inode, sets an attribute of an inode it drops, or sets two
    /// attributes of one inode.
    pub fn commit_changes(&self, changes: &[NamespaceChange]) -> Result<()> {
        namespace::commit_changes(&self.inner, changes)
    }

    /// chmod / chown / utimens / truncate.
    pub fn setattr(&self, ino: Ino, request: &SetAttrRequest) -> Result<Attr> {
        namespace::setattr(&self.inner, ino, request)
    }

    /// Count an open handle: an unlinked file's data lives until its last handle closes.
    pub fn open_handle(&self, ino: Ino) -> Result<Attr> {
        namespace::open_handle(&self.inner, ino)
    }

    pub fn release_handle(&self, ino: Ino) -> Result<()> {
        namespace::release_handle(&self.inner, ino)
    }

    pub fn getxattr(&self, ino: Ino, name: &[u8]) -> Result<Vec<u8>> {
        namespace::getxattr(&self.inner, ino, name)
    }

    /// Attribute names, in byte order.
    pub fn listxattr(&self, ino: Ino) -> Result<Vec<Vec<u8>>> {
        namespace::listxattr(&self.inner, ino)
    }

    pub fn setxattr(&self, ino: Ino, name: &[u8], value: &[u8], mode: XattrSet) -> Result<()> {
        namespace::setxattr(&self.inner, ino, name, value, mode)
    }

    pub fn removexattr(&self, ino: Ino, name: &[u8]) -> Result<()> {
        namespace::removexattr(&self.inner, ino, name)
    }

    pub fn statfs(&self) -> StatFs {
        namespace::statfs(&self.inner)
    }

    /// Check the namespace (every inode reachable from the root, link counts, directory
    /// parents) and the maps (blocks past the end of a file hold only zeros). Empty =
    /// consistent.
    pub fn check(&self) -> Vec<Problem> {
        check::check(&self.inner)
    }

    /// Format the devices as one new volume of `options.profile`, which decides whether
    /// they include a fast tier. Refuses devices that already hold a volume unless
    /// `options.force`.
    pub fn format(devices: &Devices, options: &FormatOptions) -> Result<Superblock> {
        open::format(devices, options)
    }

    /// Open a formatted volume: check the superblocks, load the newest checkpoint, replay
    /// the journal, rebuild the allocators, start the profile's workers. Nothing is
    /// written before every check passed, except that a KV store's own open may seal a
    /// journal, and so an older `nvstore` volume opened writable has its superblocks
    /// raised to this build's format version first.
    pub fn open(devices: Devices, options: VolumeOptions) -> Result<Volume> {
        open::open(devices, options)
    }
}

impl Drop for Volume {
    fn drop(&mut self) {
        if let Err(e) = self.shutdown(true) {
            tracing::error!("closing the volume: {e}");
        }
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
    use crate::meta::{DataOp, Op};

    #[test]
    fn a_refused_commit_is_not_counted_as_waiting_for_the_commit_lock() {
        let volume = test_volume();
        let inner = volume.inner();
        let missing = Op::Data(DataOp::SetSize { ino: Ino(999), size: 1, time: 0 });
        assert!(matches!(inner.commit(&[missing]), Err(Error::NotFound)));
        assert_eq!(inner.committer.committing(), 0, "every group sync would wait out its deadline");
        inner.commit(&[]).unwrap();
        assert_eq!(inner.committer.committing(), 0);
    }
}
