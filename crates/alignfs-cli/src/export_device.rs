//! `alignfs export-device`: the emulated memory-semantic SSD's block interface as one
//! file, `MOUNTPOINT/disk`, until SIGINT or SIGTERM. A loop device over that file lets
//! any kernel file system run on the same device as a `byte` volume does (ByteFS's
//! baselines: ext4 and F2FS on the device's block interface; docs/BYTE.md, "Baselines on
//! the same device").
//!
//! The file's bytes are the device's logical pages. Reads and writes go straight to the
//! device (every open is `FOPEN_DIRECT_IO`, so the kernel keeps no cache of the file
//! apart from the loop device's and the file system's own); a write that covers pages
//! only in part reads them first. fsync flushes the device: a loop device turns the file
//! system's flushes and FUA writes into fsyncs of the file. `MOUNTPOINT/stats` holds the
//! device's counters (host traffic per interface, flash programs, cleanings) and its write
//! log's use as JSON.

use std::ffi::OsStr;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use alignfs::device::mssd::{MemorySemanticSsd, MssdOptions, PAGE};
use alignfs::device::{run_batch, AlignedBuf, BlockDevice, IoOp, IoRequest};
use alignfs::layout::Superblock;
use alignfs::paths::probe::{probe, Found};
use alignfs::paths::{format_memory_semantic_ssd, open_memory_semantic_ssd, DeviceSpec};
use anyhow::{bail, Context, Result};
use clap::Args;
use fuser::{
    Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, LockOwner, MountOption, OpenFlags,
    ReplyAttr, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow,
    WriteFlags,
};
use parking_lot::RwLock;

#[derive(Args)]
pub struct ExportDeviceArgs {
    /// The device's flash image, `PATH[:SIZE]`. With SIZE and nothing at either path yet,
    /// a new device of that capacity is made (its write log 1/32 of it, at most 256 MiB).
    #[arg(long, value_name = "PATH[:SIZE]")]
    ssd: String,
    /// The device's DRAM: a file on tmpfs (sized by the device when created).
    #[arg(long, value_name = "PATH")]
    fast: String,
    /// The write log of a new device, 1M–4G (default 1/32 of its capacity, 1M–256M).
    #[arg(long, value_name = "SIZE")]
    device_log: Option<String>,
    /// Send block writes straight to flash. By default they land in the device's DRAM, in
    /// its write log, and reach flash when it is cleaned: the data cache ByteFS gives its
    /// baselines (as large as `byte`'s write log).
    #[arg(long)]
    no_block_cache: bool,
    /// The device takes the times of ByteFS's Table 4 (as `alignfs mount --device-latency`);
    /// `--device-latency=SCALE` multiplies its flash latencies.
    #[arg(long, value_name = "SCALE", num_args = 0..=1, require_equals = true, default_missing_value = "1")]
    device_latency: Option<f64>,
    /// With `--device-latency`: the FTL's write buffer for block writes that bypass the
    /// block cache (`--no-block-cache`), as `alignfs mount --device-write-buffer`.
    #[arg(long, value_name = "SIZE", requires = "device_latency")]
    device_write_buffer: Option<String>,
    /// A file of byte ranges, `START END` (end exclusive) per line, whose flash reads and
    /// programs the device's counters also count as metadata (`flash_program_metadata_bytes`):
    /// a client file system's superblocks, bitmaps, inode tables and journal, say. The
    /// device cannot tell what a block holds; `bench/byte.py` writes this file for ext4.
    #[arg(long, value_name = "FILE")]
    metadata_ranges: Option<PathBuf>,
    /// Start cleaning the write log when it is this full, percent (the paper's 85; 100
    /// cleans only when a write finds no room, which lets a benchmark fill it).
    #[arg(long, value_name = "PERCENT", default_value_t = 85, value_parser = clap::value_parser!(u32).range(1..=100))]
    clean_at: u32,
    /// Make a new device even where the paths hold an alignfs structure (a volume, or
    /// another device), destroying it.
    #[arg(long)]
    force: bool,
    /// FUSE request threads.
    #[arg(long, default_value_t = 4)]
    threads: usize,
    /// Directory to serve the device in, as the file `disk`.
    mountpoint: PathBuf,
}

const ROOT: INodeNo = INodeNo(1);
const DISK: INodeNo = INodeNo(2);
const DISK_NAME: &str = "disk";
/// The device's counters as JSON (name → value), read afresh by every read: what a
/// benchmark reads before and after a cell.
const STATS: INodeNo = INodeNo(3);
const STATS_NAME: &str = "stats";
const TTL: Duration = Duration::from_secs(1);

struct DeviceFile {
    device: Arc<MemorySemanticSsd>,
    /// Writes of whole pages share it; a write that reads pages to merge takes it alone,
    /// so no write lands between its read and its write.
    merging: RwLock<()>,
    uid: u32,
    gid: u32,
    since: SystemTime,
}

impl DeviceFile {
    fn attr(&self, ino: INodeNo) -> FileAttr {
        let (kind, perm, size, nlink) = match ino {
            ROOT => (FileType::Directory, 0o755, 0, 2),
            DISK => (FileType::RegularFile, 0o600, self.device.len_bytes(), 1),
            _ => (FileType::RegularFile, 0o444, 0, 1),
        };
        FileAttr {
            ino,
            size,
            blocks: size / 512,
            atime: self.since,
            mtime: self.since,
            ctime: self.since,
            crtime: self.since,
            kind,
            perm,
            nlink,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: PAGE as u32,
            flags: 0,
        }
    }

    /// Write `data` at `offset` (inside the device): whole pages as they are, pages
    /// covered in part merged with what they hold.
    fn write_at(&self, offset: u64, data: &[u8]) -> alignfs::Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        let end = offset + data.len() as u64;
        let (first, last) = (offset / PAGE * PAGE, end.div_ceil(PAGE) * PAGE);
        let mut buf = AlignedBuf::zeroed((last - first) as usize);
        let whole = offset == first && end == last;
        let _shared = whole.then(|| self.merging.read());
        let _alone = (!whole).then(|| self.merging.write());
        if whole {
            buf.copy_from_slice(data);
        } else {
            self.device.read_buffered(first, &mut buf)?;
            buf[(offset - first) as usize..(end - first) as usize].copy_from_slice(data);
        }
        run_batch(self.device.as_ref(), vec![IoRequest { op: IoOp::Write, offset_bytes: first, buf }]).map(drop)
    }

    /// Zeros from `offset` to `end`: the whole pages trimmed, the partial ones written.
    fn zero(&self, offset: u64, end: u64) -> alignfs::Result<()> {
        let (first_whole, last_whole) = (offset.div_ceil(PAGE) * PAGE, end / PAGE * PAGE);
        if first_whole >= last_whole {
            return self.write_at(offset, &vec![0u8; (end - offset) as usize]);
        }
        self.write_at(offset, &vec![0u8; (first_whole - offset) as usize])?;
        self.write_at(last_whole, &vec![0u8; (end - last_whole) as usize])?;
        let _alone = self.merging.write();
        self.device.trim(first_whole, last_whole - first_whole)
    }
}

fn errno(e: &alignfs::Error) -> Errno {
    match e {
        alignfs::Error::NoSpace => Errno::ENOSPC,
        _ => Errno::EIO,
    }
}

impl Filesystem for DeviceFile {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match name.to_str() {
            Some(DISK_NAME) if parent == ROOT => reply.entry(&TTL, &self.attr(DISK), Generation(0)),
            Some(STATS_NAME) if parent == ROOT => reply.entry(&TTL, &self.attr(STATS), Generation(0)),
            _ => reply.error(Errno::ENOENT),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match ino {
            ROOT | DISK | STATS => reply.attr(&TTL, &self.attr(ino)),
            _ => reply.error(Errno::ENOENT),
        }
    }

    /// The disk's size is the device's: a truncate to any other size is refused; times
    /// and modes are not kept.
    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        _kill_suidgid: bool,
        reply: ReplyAttr,
    ) {
        if size.is_some_and(|size| ino != DISK || size != self.device.len_bytes()) {
            reply.error(Errno::EPERM);
            return;
        }
        reply.attr(&TTL, &self.attr(ino));
    }

    /// Direct, so that the disk is read and written as the device holds it, and the stats
    /// are read whole whatever size they are.
    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        match ino {
            DISK => reply.opened(FileHandle(0), FopenFlags::FOPEN_DIRECT_IO),
            STATS if flags.0 & libc::O_ACCMODE == libc::O_RDONLY => reply.opened(FileHandle(0), FopenFlags::FOPEN_DIRECT_IO),
            STATS => reply.error(Errno::EACCES),
            _ => reply.error(Errno::EISDIR),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        if ino == STATS {
            let stats = self.device.stats();
            let mut counters: serde_json::Map<String, serde_json::Value> =
                stats.named().into_iter().map(|(name, value, _)| (name.to_string(), value.into())).collect();
            let (used, capacity) = self.device.log_usage();
            counters.insert("log_used_bytes".into(), used.into());
            counters.insert("log_capacity_bytes".into(), capacity.into());
            let text = serde_json::Value::Object(counters).to_string() + "\n";
            let start = (offset as usize).min(text.len());
            reply.data(&text.as_bytes()[start..(start + size as usize).min(text.len())]);
            return;
        }
        let len = self.device.len_bytes().saturating_sub(offset).min(u64::from(size));
        let mut buf = vec![0u8; len as usize];
        match self.device.read_buffered(offset, &mut buf) {
            Ok(()) => reply.data(&buf),
            Err(e) => {
                tracing::error!("read of {len} bytes at {offset}: {e}");
                reply.error(errno(&e));
            }
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        if ino != DISK {
            reply.error(Errno::EBADF);
            return;
        }
        if offset.checked_add(data.len() as u64).is_none_or(|end| end > self.device.len_bytes()) {
            reply.error(Errno::ENOSPC);
            return;
        }
        match self.write_at(offset, data) {
            Ok(()) => reply.written(data.len() as u32),
            Err(e) => {
                tracing::error!("write of {} bytes at {offset}: {e}", data.len());
                reply.error(errno(&e));
            }
        }
    }

    fn flush(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _lock_owner: LockOwner, reply: ReplyEmpty) {
        reply.ok();
    }

    fn fsync(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        match self.device.flush() {
            Ok(()) => reply.ok(),
            Err(e) => {
                tracing::error!("flush: {e}");
                reply.error(errno(&e));
            }
        }
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        if ino != ROOT {
            reply.error(Errno::ENOTDIR);
            return;
        }
        let entries = [
            (ROOT, FileType::Directory, "."),
            (ROOT, FileType::Directory, ".."),
            (DISK, FileType::RegularFile, DISK_NAME),
            (STATS, FileType::RegularFile, STATS_NAME),
        ];
        for (i, (ino, kind, name)) in entries.iter().enumerate().skip(offset as usize) {
            if reply.add(*ino, i as u64 + 1, *kind, name) {
                break;
            }
        }
        reply.ok();
    }

    /// A loop device passes discards on as hole punches and write-zeroes as zeroing: whole
    /// pages are trimmed (they read as zeros, and cleaning never writes them back), the
    /// parts of pages at the ends written with zeros. Allocation has nothing to do.
    fn fallocate(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, offset: u64, length: u64, mode: i32, reply: ReplyEmpty) {
        let zeroing = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_ZERO_RANGE;
        if mode & !(zeroing | libc::FALLOC_FL_KEEP_SIZE) != 0 {
            reply.error(Errno::EOPNOTSUPP);
            return;
        }
        let Some(end) = offset.checked_add(length).filter(|&end| end <= self.device.len_bytes()) else {
            reply.error(Errno::EINVAL);
            return;
        };
        if mode & zeroing == 0 || length == 0 {
            reply.ok();
            return;
        }
        match self.zero(offset, end) {
            Ok(()) => reply.ok(),
            Err(e) => {
                tracing::error!("zeroing {length} bytes at {offset}: {e}");
                reply.error(errno(&e));
            }
        }
    }

    /// No extended attributes: the kernel stops asking after the first ENOSYS.
    fn getxattr(&self, _req: &Request, _ino: INodeNo, _name: &OsStr, _size: u32, reply: ReplyXattr) {
        reply.error(Errno::ENOSYS);
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let pages = self.device.len_bytes() / PAGE;
        reply.statfs(pages, 0, 0, 2, 0, PAGE as u32, 255, PAGE as u32);
    }
}

/// Open the device the paths hold, or make one where they hold nothing (or `--force`).
fn open_device(args: &ExportDeviceArgs, options: MssdOptions) -> Result<MemorySemanticSsd> {
    let (ssd, dram) = (DeviceSpec::parse(&args.ssd)?, DeviceSpec::parse(&args.fast)?);
    let found = (probe(&dram.path)?, probe(&ssd.path)?);
    let existing = matches!(found, (Some(Found::DeviceDram(a)), Some(Found::DeviceFlash(b))) if a == b);
    if existing && !args.force {
        if ssd.size.is_some() {
            bail!(
                "{} already holds a memory-semantic SSD; name it without a size to export it, or add --force to make a new one",
                ssd.path.display()
            );
        }
        if args.device_log.is_some() {
            bail!(
                "{} already holds a memory-semantic SSD, whose write log was sized when it was made; drop --device-log",
                ssd.path.display()
            );
        }
        let (device, recovery) = open_memory_semantic_ssd(&dram.path, &ssd.path, options, None)?;
        if recovery.found_entries() {
            eprintln!("device {recovery}");
        }
        return Ok(device);
    }
    if ssd.size.is_none() {
        bail!(
            "{} holds no memory-semantic SSD with {} as its DRAM; give a size (--ssd PATH:SIZE) to make one",
            ssd.path.display(),
            dram.path.display()
        );
    }
    let log_bytes = args.device_log.as_deref().map(|text| crate::byte_size("--device-log", text)).transpose()?;
    Ok(format_memory_semantic_ssd(&dram, &ssd, args.force, log_bytes, options, None)?)
}

pub fn run(args: &ExportDeviceArgs) -> Result<()> {
    if args.threads == 0 || args.threads > 64 {
        bail!("--threads must be between 1 and 64");
    }
    let metadata = args.metadata_ranges.as_deref().map(read_metadata_ranges).transpose()?;
    let options = MssdOptions {
        latency: crate::mount::device_latency(args.device_latency, args.device_write_buffer.as_deref())?,
        block_cache: !args.no_block_cache,
        clean_at_percent: args.clean_at,
        ..MssdOptions::default()
    };
    let device = Arc::new(open_device(args, options)?);
    // A byte volume's device exported as a disk would be formatted over by the first mkfs.
    let mut head = vec![0u8; PAGE as usize];
    device.read_buffered(0, &mut head)?;
    if Superblock::has_magic(&head) {
        device.halt();
        bail!(
            "the device holds an alignfs volume (byte profile); exporting it as a disk would let a file system be made over it. \
             Mount it with `alignfs mount --ssd {} --fast {}`",
            args.ssd,
            args.fast
        );
    }
    if let Some(ranges) = metadata {
        // Said, not refused: the device is open (perhaps just made) and the ranges only
        // label its counters.
        if let Some(beyond) = ranges.iter().find(|r| r.end > device.len_bytes()) {
            eprintln!(
                "note: --metadata-ranges: {}–{} reaches beyond the device's {} bytes; the part beyond counts nothing",
                beyond.start,
                beyond.end,
                device.len_bytes()
            );
        }
        device.count_as_metadata(&ranges);
    }
    std::fs::create_dir_all(&args.mountpoint).with_context(|| format!("create {}", args.mountpoint.display()))?;
    let (uid, gid) = (rustix::process::getuid().as_raw(), rustix::process::getgid().as_raw());
    let fs = DeviceFile { device: Arc::clone(&device), merging: RwLock::new(()), uid, gid, since: SystemTime::now() };
    let mut config = Config::default();
    config.mount_options = vec![MountOption::FSName("alignfs-device".into()), MountOption::DefaultPermissions];
    config.n_threads = Some(args.threads);
    config.clone_fd = true;
    let mut session =
        fuser::Session::new(fs, &args.mountpoint, &config).with_context(|| format!("mount at {}", args.mountpoint.display()))?;
    crate::mount::unmount_on_signals(session.unmount_callable(), args.mountpoint.clone())?;
    eprintln!(
        "{} ({} MiB, block writes {}) served as {}/{DISK_NAME}; e.g. `losetup --find --show --direct-io=on {}/{DISK_NAME}`, \
         then mkfs and mount the loop device. Ctrl-C or SIGTERM stops serving (detach the loop device first)",
        device.describe(),
        device.len_bytes() >> 20,
        if options.block_cache { "cached in the device's DRAM" } else { "straight to flash" },
        args.mountpoint.display(),
        args.mountpoint.display()
    );
    let served = session.run().context("serve FUSE requests");
    let flushed = device.flush().context("flush the device");
    device.halt();
    served?;
    flushed?;
    let stats = device.stats();
    eprintln!(
        "stopped: {} MiB written and {} MiB read through the block interface, {} MiB programmed to flash, {} log cleanings",
        stats.block_write_bytes >> 20,
        stats.block_read_bytes >> 20,
        stats.flash_program_bytes >> 20,
        stats.log_cleanings
    );
    Ok(())
}

/// The byte ranges of a `--metadata-ranges` file: `START END` per line, end exclusive;
/// blank lines and `#` comments are skipped.
fn read_metadata_ranges(path: &Path) -> Result<Vec<Range<u64>>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("--metadata-ranges: read {}", path.display()))?;
    let mut ranges = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let at = || format!("--metadata-ranges {}, line {}", path.display(), number + 1);
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [start, end] = fields[..] else { bail!("{}: expected `START END` in bytes, found {line:?}", at()) };
        let start: u64 = start.parse().with_context(|| format!("{}: start {start:?} is not a byte offset", at()))?;
        let end: u64 = end.parse().with_context(|| format!("{}: end {end:?} is not a byte offset", at()))?;
        if start >= end {
            bail!("{}: the range {start}–{end} is empty (the end is exclusive)", at());
        }
        ranges.push(start..end);
    }
    Ok(ranges)
}
