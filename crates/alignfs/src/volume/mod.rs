//! A volume: the two devices, the metadata, and the operations the front ends call.
//!
//! Locking, outermost first: a file's range lock → the namespace lock → the commit lock
//! (journal + checkpoints; every metadata change is journaled and applied under it, so
//! journal order is apply order) → an inode's `data`/`map` mutexes (leaf locks, never held
//! across a call into the commit lock).

mod block_store;
mod check;
mod durable;
mod migrate;
mod namespace;
mod paths;
mod read;
mod resize;
mod scrap_flush;
mod write;

pub use check::Problem;
pub use namespace::{DirEntry, RenameFlags, SetAttrRequest, StatFs, XattrSet};
pub use paths::{default_data_dir, format_paths, open_paths, open_paths_with_faults, ssd_superblock, DeviceSpec, DEFAULT_FAST_PATH};
pub use read::SeekTarget;
pub use resize::FallocateMode;
pub use write::MAX_FILE_BYTES;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::device::{run_batch, AlignedBuf, BlockDevice, BufferPool, IoOp, IoRequest, PmemRegion};
use crate::error::{Error, Result};
use crate::geometry::{Geometry, MetaLayout, SUPERBLOCK_BYTES};
use crate::journal::{checkpoint_payload, decode_ops, encode_ops, AsIs, CheckpointSlots, Journal, MetaMedium, PmemWindow, SsdWindow};
use crate::layout::{BitmapAllocator, DeviceRole, Profile, Superblock};
use crate::map::{PageNo, SsdBlock};
use crate::meta::{apply, now_ns, FileKind, Freed, Ino, MetaState, Op};
use crate::residue::{PmemPages, ResidueStore, ScrapPages};
use crate::stats::{Counter, Stats, StatsSnapshot, Usage, VolumeReport};

/// How SSD data is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadMode {
    /// O_DIRECT into aligned buffers through the IO engine.
    Direct,
    /// Through the kernel's cache of the backing file (pread on a cached descriptor).
    Buffered,
}

#[derive(Clone, Debug)]
pub struct VolumeOptions {
    pub read_mode: ReadMode,
    /// Replay in memory and refuse every change: nothing is written to the devices.
    pub read_only: bool,
    /// Migration starts when this share of fast pages is used…
    pub migrate_high: f64,
    /// …and stops when usage falls to this share.
    pub migrate_low: f64,
    /// Run the background maintenance thread (migration, checkpoints).
    pub background: bool,
    /// `scrap`: the most memory its scrap pages may take (`--scrap-mem`).
    pub scrap_mem_bytes: u64,
    /// `scrap`: writes this large or larger send their whole blocks straight to the SSD;
    /// smaller ones go whole to the scrap buffer (WSBuffer's request-size threshold).
    pub request_threshold: u64,
    /// `scrap`: threads writing scrap pages back (WSBuffer runs two).
    pub flush_workers: usize,
}

impl Default for VolumeOptions {
    fn default() -> Self {
        VolumeOptions {
            read_mode: ReadMode::Buffered,
            read_only: false,
            migrate_high: 0.8,
            migrate_low: 0.6,
            background: true,
            scrap_mem_bytes: 1 << 30,
            request_threshold: 1 << 20,
            flush_workers: 2,
        }
    }
}

#[derive(Clone, Debug)]
pub struct FormatOptions {
    pub geometry: Geometry,
    pub profile: Profile,
    /// Overwrite devices that already hold a volume.
    pub force: bool,
}

impl Default for FormatOptions {
    fn default() -> Self {
        FormatOptions { geometry: Geometry::default(), profile: Profile::Orch, force: false }
    }
}

/// What opening the volume took.
#[derive(Clone, Debug, Default)]
pub struct RecoveryReport {
    pub duration: Duration,
    pub checkpoint_generation: u64,
    pub records_replayed: u64,
    pub torn_tail_dropped: bool,
    pub orphans_dropped: u64,
    pub clean: bool,
}

/// A wake-up for a background thread: `notify` makes the next (or current) `wait` return.
#[derive(Default)]
struct Wakeup {
    due: Mutex<bool>,
    cond: Condvar,
}

impl Wakeup {
    fn notify(&self) {
        *self.due.lock() = true;
        self.cond.notify_all();
    }

    /// Until notified or `timeout` passed; clears the notification.
    fn wait(&self, timeout: Duration) {
        let mut due = self.due.lock();
        if !*due {
            self.cond.wait_for(&mut due, timeout);
        }
        *due = false;
    }
}

struct Committer {
    journal: Journal,
    checkpoints: CheckpointSlots,
}

pub(crate) struct Inner {
    superblock: Superblock,
    geometry: Geometry,
    /// `None` for profiles without a fast tier.
    fast: Option<Arc<PmemRegion>>,
    ssd: Arc<dyn BlockDevice>,
    residue: Arc<dyn ResidueStore>,
    blocks: BitmapAllocator,
    meta: MetaState,
    committer: Mutex<Committer>,
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
    /// Wakes `scrap`'s flushers.
    flush_due: Wakeup,
    shutdown: AtomicBool,
    recovery: RecoveryReport,
    /// Files whose size a crash would not keep (volatile residue only): ino → the size
    /// last journaled.
    unsynced_sizes: Mutex<HashMap<Ino, u64>>,
    /// Blocks whose volatile residue unit became full, for the flusher.
    full_units: Mutex<Vec<(Ino, u64)>>,
    /// SSD bytes submitted and not yet complete, per SSD (the flusher's busyness gauge).
    ssd_in_flight: Vec<AtomicU64>,
    /// Debug builds check that no SSD write shares its range with another IO in flight.
    #[cfg(debug_assertions)]
    io_ranges: block_store::InFlightRanges,
    /// Blocks holding volatile residue, and since when (the idle flusher takes the oldest).
    dirty_since: Mutex<HashMap<(Ino, u64), Instant>>,
}

/// An open alignfs volume.
///
/// ```
/// use std::sync::Arc;
/// use alignfs::device::{PmemRegion, SimSsd};
/// use alignfs::{FormatOptions, Ino, Volume, VolumeOptions};
///
/// let fast = Arc::new(PmemRegion::anonymous(4 << 20).unwrap());
/// let ssd = Arc::new(SimSsd::new(16 << 20));
/// Volume::format(&fast, ssd.as_ref(), &FormatOptions::default()).unwrap();
/// let volume = Volume::open(fast, ssd, VolumeOptions::default()).unwrap();
/// let file = volume.create_file(Ino::ROOT, b"hello", 0o644, 0, 0).unwrap();
/// volume.write(file.ino, 0, b"hello, world").unwrap();
/// let mut out = [0u8; 12];
/// assert_eq!(volume.read(file.ino, 0, &mut out).unwrap(), 12);
/// assert_eq!(&out, b"hello, world");
/// volume.close().unwrap();
/// ```
pub struct Volume {
    inner: Arc<Inner>,
    maintenance: Option<JoinHandle<()>>,
    /// `scrap`'s flusher threads.
    flushers: Vec<JoinHandle<()>>,
    closed: bool,
}

/// The superblock sector of SSD `member` of `ssd` (a device set has one per member).
fn read_ssd_superblock(ssd: &dyn BlockDevice, member: u64) -> Result<Vec<u8>> {
    if ssd.len_bytes() < SUPERBLOCK_BYTES {
        return Ok(Vec::new());
    }
    let at = member * ssd.member_bytes();
    let request = IoRequest { op: IoOp::Read, offset_bytes: at, buf: AlignedBuf::zeroed(SUPERBLOCK_BYTES as usize) };
    Ok(run_batch(ssd, vec![request])?.remove(0).to_vec())
}

fn read_fast_superblock(fast: &PmemRegion) -> Vec<u8> {
    let mut bytes = vec![0u8; SUPERBLOCK_BYTES.min(fast.len_bytes()) as usize];
    fast.read(0, &mut bytes);
    bytes
}

/// Where a volume's journal and checkpoints live.
#[derive(Clone, Copy)]
enum MetaDevice<'a> {
    Fast(&'a Arc<PmemRegion>),
    /// The metadata area at the start of the SSD, for profiles without a fast tier.
    Ssd(&'a Arc<dyn BlockDevice>),
}

/// The journal and checkpoint slots on their device.
fn windows(device: MetaDevice<'_>, layout: &MetaLayout, name: &str) -> Result<(Box<dyn MetaMedium>, CheckpointSlots)> {
    let window = |offset: u64, len: u64| -> Result<Box<dyn MetaMedium>> {
        Ok(match device {
            MetaDevice::Fast(fast) => Box::new(PmemWindow::new(Arc::clone(fast), offset, len)),
            MetaDevice::Ssd(ssd) => Box::new(SsdWindow::open(Arc::clone(ssd), offset, len)?),
        })
    };
    let journal = window(layout.journal_offset, layout.journal_bytes)?;
    let a = window(layout.checkpoint_a_offset, layout.checkpoint_bytes)?;
    let b = window(layout.checkpoint_b_offset, layout.checkpoint_bytes)?;
    let slots = CheckpointSlots::new(a, b, [layout.checkpoint_a_offset, layout.checkpoint_b_offset], name.to_string());
    Ok((journal, slots))
}

/// `AlreadyFormatted` if any of `(superblock bytes, device)` holds a volume.
fn refuse_existing(existing: &[(Vec<u8>, String)]) -> Result<()> {
    for (bytes, device) in existing {
        if Superblock::has_magic(bytes) {
            let uuid = Superblock::decode(bytes, device).map_or("unreadable".into(), |sb| sb.uuid_string());
            return Err(Error::AlreadyFormatted { device: device.clone(), uuid });
        }
    }
    Ok(())
}

/// The usable bytes of an SSD (or of every member of a device set): whole blocks, and
/// whole split units when there are several SSDs, so no IO straddles two.
fn usable_ssd_bytes(ssd: &dyn BlockDevice, geometry: &Geometry) -> u64 {
    match ssd.member_count() as u64 {
        1 => ssd.len_bytes() / geometry.block() * geometry.block(),
        n => ssd.member_bytes() / u64::from(geometry.split_bytes) * u64::from(geometry.split_bytes) * n,
    }
}

/// The superblock of a new volume (role fast, SSD 0; callers adjust it per device).
fn new_superblock(options: &FormatOptions, fast_bytes: u64, ssd: &dyn BlockDevice, layout: MetaLayout) -> Result<Superblock> {
    let geometry = options.geometry;
    let ssd_bytes = usable_ssd_bytes(ssd, &geometry);
    let ssd_count = u32::try_from(ssd.member_count()).unwrap_or(u32::MAX);
    if ssd_count > 1 && (options.profile.has_fast_tier() || ssd_count > crate::layout::MAX_SSDS) {
        return Err(Error::InvalidArgument(format!(
            "profile {} takes {} SSDs at most, not {ssd_count}",
            options.profile.name(),
            if options.profile.has_fast_tier() { 1 } else { crate::layout::MAX_SSDS }
        )));
    }
    if ssd_bytes / geometry.block() < 2 {
        return Err(Error::Geometry(format!("SSD of {} bytes holds fewer than two {}-byte blocks", ssd.len_bytes(), geometry.block())));
    }
    Ok(Superblock {
        role: DeviceRole::Fast,
        profile: options.profile,
        uuid: *uuid::Uuid::new_v4().as_bytes(),
        geometry,
        fast_bytes,
        ssd_bytes,
        layout,
        created_unix_ns: now_ns(),
        ssd_count,
        ssd_index: 0,
    })
}

/// Checkpoint generation 1: the root directory alone, owned by the formatting user.
fn write_fresh_checkpoint(slots: &mut CheckpointSlots) -> Result<()> {
    slots.clear()?;
    let fresh = MetaState::fresh(rustix::process::getuid().as_raw(), rustix::process::getgid().as_raw(), now_ns());
    slots.write(&checkpoint_payload(&fresh, &[], &AsIs), 1)
}

/// Write (and flush) the superblock sector of SSD `member`.
fn write_ssd_superblock(ssd: &dyn BlockDevice, member: u64, image: &[u8]) -> Result<()> {
    let mut buf = AlignedBuf::zeroed(SUPERBLOCK_BYTES as usize);
    buf.copy_from_slice(image);
    run_batch(ssd, vec![IoRequest { op: IoOp::Write, offset_bytes: member * ssd.member_bytes(), buf }])?;
    ssd.flush()
}

impl Volume {
    /// Format both devices as one new `orch` volume. Refuses devices that already hold a
    /// volume unless `options.force`.
    pub fn format(fast: &Arc<PmemRegion>, ssd: &dyn BlockDevice, options: &FormatOptions) -> Result<Superblock> {
        if !options.profile.has_fast_tier() {
            return Err(Error::InvalidArgument(format!(
                "profile {} has no fast tier: format it with Volume::format_ssd",
                options.profile.name()
            )));
        }
        let geometry = options.geometry;
        geometry.validate(options.profile)?;
        if !options.force {
            refuse_existing(&[(read_fast_superblock(fast), fast.describe()), (read_ssd_superblock(ssd, 0)?, ssd.describe())])?;
        }
        let layout = MetaLayout::compute(fast.len_bytes(), &geometry)?;
        let superblock = new_superblock(options, fast.len_bytes(), ssd, layout)?;
        // Invalidate what a previous volume left: its superblock first, so a crash during
        // format never leaves a half-new volume that opens.
        fast.write_persist(0, &[0u8; SUPERBLOCK_BYTES as usize]);
        fast.zero(layout.journal_offset, layout.journal_bytes as usize);
        fast.persist(layout.journal_offset, layout.journal_bytes as usize);
        let (_, mut slots) = windows(MetaDevice::Fast(fast), &layout, "fast tier")?;
        write_fresh_checkpoint(&mut slots)?;
        write_ssd_superblock(ssd, 0, &Superblock { role: DeviceRole::Ssd, ..superblock.clone() }.encode())?;
        fast.write_persist(0, &superblock.encode());
        Ok(superblock)
    }

    /// Format an SSD as one new volume of a profile without a fast tier (`scrap`): the
    /// superblock, checkpoints and journal go to a metadata area at its start.
    pub fn format_ssd(ssd: &Arc<dyn BlockDevice>, options: &FormatOptions) -> Result<Superblock> {
        if options.profile.has_fast_tier() {
            return Err(Error::InvalidArgument(format!("profile {} needs a fast tier", options.profile.name())));
        }
        let geometry = options.geometry;
        geometry.validate(options.profile)?;
        let members = ssd.member_count() as u64;
        if !options.force {
            let existing: Vec<(Vec<u8>, String)> =
                (0..members).map(|m| Ok((read_ssd_superblock(ssd.as_ref(), m)?, ssd.describe()))).collect::<Result<_>>()?;
            refuse_existing(&existing)?;
        }
        let layout = MetaLayout::on_ssd(usable_ssd_bytes(ssd.as_ref(), &geometry) / members, &geometry)?;
        let superblock = Superblock { role: DeviceRole::Ssd, ..new_superblock(options, 0, ssd.as_ref(), layout)? };
        // As for `orch`: the old superblocks go first, the new ones last.
        for member in 0..members {
            write_ssd_superblock(ssd.as_ref(), member, &[0u8; SUPERBLOCK_BYTES as usize])?;
        }
        let (journal, mut slots) = windows(MetaDevice::Ssd(ssd), &layout, &ssd.describe())?;
        journal.write_durable(0, &vec![0u8; layout.journal_bytes as usize])?;
        write_fresh_checkpoint(&mut slots)?;
        for member in (0..members).rev() {
            let copy = Superblock { ssd_index: member as u32, ..superblock.clone() };
            write_ssd_superblock(ssd.as_ref(), member, &copy.encode())?;
        }
        Ok(superblock)
    }

    /// Open a formatted `orch` volume: check both superblocks, load the newest checkpoint,
    /// replay the journal, rebuild the allocators. Nothing is written before every check
    /// passed.
    pub fn open(fast: Arc<PmemRegion>, ssd: Arc<dyn BlockDevice>, options: VolumeOptions) -> Result<Volume> {
        let started = Instant::now();
        let fast_name = format!("fast tier {}", fast.describe());
        let ssd_name = format!("SSD {}", ssd.describe());
        let superblock = Superblock::decode(&read_fast_superblock(&fast), &fast_name)?;
        let ssd_superblock = Superblock::decode(&read_ssd_superblock(ssd.as_ref(), 0)?, &ssd_name)?;
        if superblock.role != DeviceRole::Fast {
            return Err(Error::corrupt("superblock", &fast_name, 0, "this is an SSD superblock; the devices are swapped"));
        }
        if ssd_superblock.role != DeviceRole::Ssd {
            return Err(Error::corrupt("superblock", &ssd_name, 0, "this is a fast-tier superblock; the devices are swapped"));
        }
        if superblock.uuid != ssd_superblock.uuid {
            return Err(Error::VolumeMismatch { fast: superblock.uuid_string(), ssd: ssd_superblock.uuid_string() });
        }
        if (Superblock { role: DeviceRole::Ssd, ..superblock.clone() }) != ssd_superblock {
            return Err(Error::corrupt("superblock", &ssd_name, 0, "geometry disagrees with the fast tier's superblock"));
        }
        if fast.len_bytes() < superblock.fast_bytes {
            return Err(Error::corrupt(
                "superblock",
                &fast_name,
                0,
                format!("device is {} bytes, the volume needs {}", fast.len_bytes(), superblock.fast_bytes),
            ));
        }
        Self::assemble(Some(fast), ssd, superblock, fast_name, options, started)
    }

    /// Open a formatted volume of a profile without a fast tier (`scrap`).
    pub fn open_ssd(ssd: Arc<dyn BlockDevice>, options: VolumeOptions) -> Result<Volume> {
        let started = Instant::now();
        let ssd_name = format!("SSD {}", ssd.describe());
        let superblock = Superblock::decode(&read_ssd_superblock(ssd.as_ref(), 0)?, &ssd_name)?;
        if superblock.profile.has_fast_tier() {
            return Err(Error::InvalidArgument(format!(
                "{ssd_name} holds an {} volume, which needs its fast tier too (--fast)",
                superblock.profile.name()
            )));
        }
        if ssd.member_count() != superblock.ssd_count as usize || superblock.ssd_index != 0 {
            return Err(Error::InvalidArgument(format!(
                "the volume spans {} SSDs; name them all, in any order ({} given, the first holding SSD {})",
                superblock.ssd_count,
                ssd.member_count(),
                superblock.ssd_index
            )));
        }
        for member in 1..u64::from(superblock.ssd_count) {
            let name = format!("SSD {member} of {}", superblock.ssd_count);
            let copy = Superblock::decode(&read_ssd_superblock(ssd.as_ref(), member)?, &name)?;
            if copy.uuid != superblock.uuid {
                return Err(Error::VolumeMismatch { fast: superblock.uuid_string(), ssd: copy.uuid_string() });
            }
            if (Superblock { ssd_index: 0, ..copy.clone() }) != superblock || copy.ssd_index != member as u32 {
                return Err(Error::corrupt("superblock", &name, 0, "its copy disagrees with SSD 0's"));
            }
        }
        Self::assemble(None, ssd, superblock, ssd_name, options, started)
    }

    /// The rest of opening, once the superblocks agree: metadata, allocators, threads.
    fn assemble(
        fast: Option<Arc<PmemRegion>>,
        ssd: Arc<dyn BlockDevice>,
        superblock: Superblock,
        meta_name: String,
        options: VolumeOptions,
        started: Instant,
    ) -> Result<Volume> {
        if ssd.len_bytes() < superblock.ssd_bytes {
            return Err(Error::corrupt(
                "superblock",
                &format!("SSD {}", ssd.describe()),
                0,
                format!("device is {} bytes, the volume needs {}", ssd.len_bytes(), superblock.ssd_bytes),
            ));
        }
        let geometry = superblock.geometry;
        let layout = superblock.layout;
        let (ppb, page_bytes) = (geometry.pages_per_block(), geometry.page_bytes);
        let meta_device = match &fast {
            Some(fast) => MetaDevice::Fast(fast),
            None => MetaDevice::Ssd(&ssd),
        };
        let (journal_window, mut checkpoints) = windows(meta_device, &layout, &meta_name)?;
        let checkpoint = checkpoints.load(ppb, page_bytes)?;
        let replay = Journal::replay(journal_window.as_ref(), checkpoint.next_seq, &meta_name)?;
        let meta = checkpoint.state;
        for (offset, payload) in &replay.payloads {
            let at = layout.journal_offset + offset;
            let ops = decode_ops(payload, ppb, page_bytes).map_err(|s| Error::corrupt("journal record", &meta_name, at, s.to_string()))?;
            for op in &ops {
                apply(&meta, op).map_err(|e| Error::corrupt("journal record", &meta_name, at, e.0))?;
            }
        }
        let orphans: Vec<Ino> = meta.snapshot().iter().filter(|i| i.data.lock().attr.nlink == 0).map(|i| i.ino).collect();
        for ino in &orphans {
            meta.inodes.write().remove(ino);
        }
        let residue: Arc<dyn ResidueStore> = match &fast {
            Some(fast) => Arc::new(PmemPages::new(Arc::clone(fast), layout.pages_offset, layout.page_count, page_bytes)),
            None => Arc::new(ScrapPages::new(options.scrap_mem_bytes, page_bytes)?),
        };
        let blocks = BitmapAllocator::new(superblock.ssd_blocks(), &superblock.reserved_ssd_blocks());
        claim_units(&meta, residue.as_ref(), &blocks, &meta_name)?;
        let journal = Journal::resume(journal_window, replay.end, replay.next_seq);
        let recovery = RecoveryReport {
            duration: started.elapsed(),
            checkpoint_generation: checkpoint.generation,
            records_replayed: replay.payloads.len() as u64,
            torn_tail_dropped: replay.torn_tail.is_some(),
            orphans_dropped: orphans.len() as u64,
            clean: replay.payloads.is_empty(),
        };
        let superblock_ssds = superblock.ssd_count as usize;
        let inner = Arc::new(Inner {
            superblock,
            geometry,
            fast,
            ssd,
            residue,
            blocks,
            meta,
            committer: Mutex::new(Committer { journal, checkpoints }),
            namespace: Mutex::new(()),
            stats: Stats::new(&checkpoint.counters),
            options,
            ssd_writes_done: AtomicU64::new(0),
            ssd_writes_flushed: Mutex::new(0),
            ssd_flush_failed: AtomicBool::new(false),
            buffers: BufferPool::new(64 << 20),
            maintenance_due: Wakeup::default(),
            flush_due: Wakeup::default(),
            shutdown: AtomicBool::new(false),
            recovery,
            unsynced_sizes: Mutex::new(HashMap::new()),
            full_units: Mutex::new(Vec::new()),
            ssd_in_flight: (0..superblock_ssds).map(|_| AtomicU64::new(0)).collect(),
            #[cfg(debug_assertions)]
            io_ranges: block_store::InFlightRanges::default(),
            dirty_since: Mutex::new(HashMap::new()),
        });
        if !inner.options.read_only {
            // Bytes past EOF in fast pages may hold an unacknowledged append: zero them so
            // a later extension exposes zeros (never-acknowledged data stays invisible).
            for inode in inner.meta.snapshot().iter().filter(|i| i.kind == FileKind::File) {
                inner.zero_beyond_eof(inode, inode.size());
            }
        }
        let background = inner.options.background && !inner.options.read_only;
        let maintenance = background.then(|| {
            let worker = Arc::clone(&inner);
            std::thread::Builder::new()
                .name("alignfs-maint".into())
                .spawn(move || {
                    lower_priority();
                    worker.maintenance_loop()
                })
                .expect("spawn maintenance thread")
        });
        let flush_workers = if background && !inner.residue.durable() { inner.options.flush_workers.max(1) } else { 0 };
        let flushers = (0..flush_workers)
            .map(|id| {
                let worker = Arc::clone(&inner);
                std::thread::Builder::new()
                    .name(format!("alignfs-flush{id}"))
                    .spawn(move || worker.flusher_loop())
                    .expect("spawn flusher thread")
            })
            .collect();
        Ok(Volume { inner, maintenance, flushers, closed: false })
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

    pub fn describe_devices(&self) -> (String, String, String) {
        let fast = self.inner.fast.as_ref().map_or_else(|| "none".to_string(), |f| f.describe());
        (fast, self.inner.ssd.describe(), self.inner.residue.describe())
    }

    /// Write a checkpoint now (the journal restarts empty).
    pub fn checkpoint(&self) -> Result<()> {
        self.inner.checkpoint()
    }

    /// Migrate every block that holds fast pages (tests, `alignfs` maintenance).
    pub fn migrate_all(&self) -> Result<u64> {
        self.inner.migrate_some(u64::MAX, Counter::migrations_watermark)
    }

    pub fn stats(&self) -> StatsSnapshot {
        let inner = &self.inner;
        let committer = inner.committer.lock();
        StatsSnapshot {
            counters: Counter::ALL.iter().map(|&c| (c, inner.stats.get(c))).collect(),
            usage: Usage {
                fast_pages_used: inner.residue.used_units(),
                fast_pages_total: inner.residue.capacity_units(),
                fast_page_bytes: u64::from(inner.residue.unit_bytes()),
                ssd_blocks_used: inner.blocks.used_count(),
                ssd_blocks_total: inner.blocks.capacity(),
                ssd_block_bytes: inner.geometry.block(),
                journal_used_bytes: committer.journal.used_bytes(),
                journal_capacity_bytes: committer.journal.capacity_bytes(),
                checkpoint_generation: committer.checkpoints.generation(),
                checkpoint_used_bytes: committer.checkpoints.used_bytes(),
                checkpoint_capacity_bytes: committer.checkpoints.capacity_bytes(),
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
            fast_device,
            ssd_device,
            residue,
            counters: s.counters.iter().map(|(c, v)| (c.name().to_string(), *v)).collect(),
            ssd_share: s.ssd_share(),
            usage: s.usage,
            recovery_us: u64::try_from(s.recovery.duration.as_micros()).unwrap_or(u64::MAX),
            records_replayed: s.recovery.records_replayed,
            torn_tail_dropped: s.recovery.torn_tail_dropped,
            daemon: None,
        }
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
        self.inner.notify_flushers();
        if let Some(handle) = self.maintenance.take() {
            let _ = handle.join();
        }
        for handle in self.flushers.drain(..) {
            let _ = handle.join();
        }
        if clean && !self.inner.options.read_only {
            if !self.inner.residue.durable() {
                self.inner.sync_all()?;
            }
            self.inner.ssd.flush()?;
            self.inner.checkpoint()?;
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

/// Mark every unit the maps reference as used; a unit out of range or referenced twice
/// means corrupt metadata.
fn claim_units(meta: &MetaState, residue: &dyn ResidueStore, blocks: &BitmapAllocator, device: &str) -> Result<()> {
    for inode in meta.snapshot() {
        for (lblock, entry) in inode.map.lock().iter() {
            let problem = |what: String| Error::corrupt("map", device, 0, format!("inode {} block {lblock}: {what}", inode.ino.0));
            for page in entry.fast_pages() {
                if !residue.claim(page) {
                    return Err(problem(format!("fast page {} is out of range or used twice", page.0)));
                }
            }
            if let Some(block) = entry.ssd_block() {
                if !blocks.claim(block.0) {
                    return Err(problem(format!("SSD block {} is out of range or used twice", block.0)));
                }
            }
        }
    }
    Ok(())
}

impl Inner {
    fn check_writable(&self) -> Result<()> {
        if self.options.read_only {
            return Err(Error::ReadOnly);
        }
        Ok(())
    }

    /// Journal `ops` as one record and apply them. Returns the units they released, which
    /// the caller frees (after waiting out users of removed inodes). With a volatile
    /// residue store, the record holds what a crash would keep of `ops` (see `durable`),
    /// and no record at all when that is nothing.
    fn commit(&self, ops: &[Op]) -> Result<Freed> {
        self.check_writable()?;
        let mut committer = self.committer.lock();
        for op in ops {
            if let Op::Map { ino, .. }
            | Op::Extend { ino, .. }
            | Op::SetSize { ino, .. }
            | Op::SetAttr { ino, .. }
            | Op::SetXattr { ino, .. } = op
            {
                if self.meta.get(*ino).is_none() {
                    return Err(Error::NotFound);
                }
            }
        }
        let durable = (!self.residue.durable()).then(|| self.durable_ops(ops));
        let journaled = durable.as_ref().map_or(ops, |d| d.journal.as_slice());
        if !journaled.is_empty() {
            self.append_record(&mut committer, journaled)?;
        }
        let mut freed = Freed::default();
        for op in ops {
            let released = apply(&self.meta, op).unwrap_or_else(|e| panic!("validated op failed to apply: {} ({op:?})", e.0));
            freed.extend(released);
        }
        if let Some(durable) = durable {
            self.note_durable_sizes(&durable.sizes);
            let mut unsynced = self.unsynced_sizes.lock();
            for inode in &freed.removed {
                unsynced.remove(&inode.ino);
            }
        }
        if committer.journal.used_bytes() * 2 > committer.journal.capacity_bytes() {
            self.notify_maintenance();
        }
        Ok(freed)
    }

    /// Append one record holding `ops`, checkpointing first when the journal is full.
    fn append_record(&self, committer: &mut Committer, ops: &[Op]) -> Result<()> {
        let payload = encode_ops(ops);
        // The journal's last eighth is kept for records that only release space, so that
        // when the state has outgrown its checkpoint slot (nothing new fits) files can
        // still be deleted and truncated until a checkpoint fits again.
        let reserve = if ops.iter().all(Op::releases_space) { 0 } else { committer.journal.capacity_bytes() / 8 };
        if !committer.journal.fits_when_empty(payload.len(), reserve) {
            return Err(Error::MetadataFull(format!("one journal record of {} bytes exceeds the journal", payload.len())));
        }
        if !committer.journal.append(&payload, reserve)? {
            self.checkpoint_locked(committer)?;
            let appended = committer.journal.append(&payload, reserve)?;
            assert!(appended, "a record that fits an empty journal fits after a checkpoint");
        }
        self.stats.add(Counter::journal_records, 1);
        self.stats.add(Counter::journal_bytes, payload.len() as u64);
        Ok(())
    }

    /// Return units to their allocators.
    fn release(&self, pages: &[PageNo], blocks: &[SsdBlock]) {
        if !pages.is_empty() {
            self.residue.free(pages);
        }
        if !blocks.is_empty() {
            self.blocks.free(blocks.iter().map(|b| b.0));
        }
    }

    /// Free what a commit released; removed inodes' units wait until no reader or writer
    /// of that inode is left.
    fn release_freed(&self, freed: Freed) {
        for inode in &freed.removed {
            drop(inode.range.write(0, u64::MAX));
        }
        self.release(&freed.pages, &freed.blocks);
    }

    fn checkpoint(&self) -> Result<()> {
        self.check_writable()?;
        let mut committer = self.committer.lock();
        self.checkpoint_locked(&mut committer)
    }

    fn checkpoint_locked(&self, committer: &mut Committer) -> Result<()> {
        self.stats.add(Counter::checkpoints, 1);
        let payload = if self.residue.durable() {
            checkpoint_payload(&self.meta, &self.stats.all(), &AsIs)
        } else {
            checkpoint_payload(&self.meta, &self.stats.all(), &durable::AfterCrash(self))
        };
        let next_seq = committer.journal.next_seq();
        committer.checkpoints.write(&payload, next_seq)?;
        committer.journal.reset(next_seq);
        Ok(())
    }

    fn notify_maintenance(&self) {
        self.maintenance_due.notify();
    }

    fn notify_flushers(&self) {
        self.flush_due.notify();
    }

    /// A `scrap` flusher: full scrap pages as they come (stage 2), then blocks that have
    /// waited while the SSD is idle (stage 1). Workers take disjoint batches.
    fn flusher_loop(&self) {
        while !self.shutdown.load(Ordering::SeqCst) {
            self.flush_due.wait(Duration::from_millis(100));
            if self.shutdown.load(Ordering::SeqCst) {
                break;
            }
            if let Err(e) = self.flush_full_units().and_then(|_| self.flush_when_idle()) {
                tracing::warn!("flushing scrap pages: {e}");
            }
        }
    }

    fn maintenance_loop(&self) {
        while !self.shutdown.load(Ordering::SeqCst) {
            self.maintenance_due.wait(Duration::from_millis(200));
            if self.shutdown.load(Ordering::SeqCst) {
                break;
            }
            let capacity = self.residue.capacity_units();
            let used = self.residue.used_units();
            if used as f64 > self.options.migrate_high * capacity as f64 {
                let target_free = capacity - (self.options.migrate_low * capacity as f64) as u64;
                if let Err(e) = self.migrate_some(target_free, Counter::migrations_watermark) {
                    tracing::warn!("background migration: {e}");
                }
            }
            let half_full = {
                let committer = self.committer.lock();
                committer.journal.used_bytes() * 2 > committer.journal.capacity_bytes()
            };
            if half_full {
                if let Err(e) = self.checkpoint() {
                    tracing::error!("background checkpoint: {e}");
                }
            }
        }
    }
}

/// Background merging gives way to the application's threads when CPUs are short (nice
/// 10, this thread only): if it falls behind, writers that find the fast tier full merge
/// for themselves, so it cannot starve.
fn lower_priority() {
    // SAFETY: plain syscalls on the calling thread; failure only leaves the priority as is.
    unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 10);
    }
}

/// A small `orch` volume on anonymous memory and a simulated SSD, without background
/// threads, for the volume's own tests.
#[cfg(test)]
pub(crate) fn test_volume() -> Volume {
    let fast = Arc::new(PmemRegion::anonymous(8 << 20).unwrap());
    let ssd: Arc<dyn BlockDevice> = Arc::new(crate::device::SimSsd::new(32 << 20));
    Volume::format(&fast, ssd.as_ref(), &FormatOptions::default()).unwrap();
    Volume::open(fast, ssd, VolumeOptions { background: false, ..VolumeOptions::default() }).unwrap()
}
