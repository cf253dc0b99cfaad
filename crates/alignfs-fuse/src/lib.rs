//! The FUSE front end: a POSIX file system served from an alignfs [`Volume`].
//!
//! Every request maps onto one engine call; this layer only translates types, picks
//! owners and modes for new files, and keeps open-directory listings stable. Choices and
//! their measurements are in `docs/FUSE.md`.

mod attr;
mod fill_on_close;
mod handles;
mod page_cache;
mod transport;
mod unserved;

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use alignfs::device::FaultPlan;
use alignfs::meta::TimeNs;
use alignfs::stats::DaemonInfo;
use alignfs::volume::{DirEntry, FallocateMode, RenameFlags, SeekTarget, SetAttrRequest, XattrSet};
use alignfs::{Error, FileKind, Ino, Volume};
use fuser::{
    AccessFlags, CopyFileRangeFlags, Errno, FileHandle, Filesystem, FopenFlags, Generation, INodeNo, IoctlFlags, KernelConfig, LockOwner,
    OpenFlags, PollEvents, PollFlags, PollNotifier, ReplyAttr, ReplyBmap, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus,
    ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyLock, ReplyLseek, ReplyOpen, ReplyPoll, ReplyStatfs, ReplyWrite, ReplyXattr, Request,
    TimeOrNow, TransportStats, WriteFlags,
};

use attr::{file_attr, kind_from_mode, time_ns};
use fill_on_close::FillOnClose;
use handles::Handles;
pub use page_cache::{CacheMode, Coherence};
pub use transport::RingThreads;
pub use transport::Transport;
use unserved::Unserved;

/// The read-only extended attribute of the root directory that carries the live report
/// (JSON) to `alignfs stat MOUNTPOINT`. It is not listed, so copying tools never see it.
pub const STATS_XATTR: &str = "user.alignfs.stats";

/// The root attribute that arms injected SSD faults on a mount started with
/// `--inject-faults` (write: a plan such as `write=1`; read: what is armed).
pub const INJECT_XATTR: &str = "user.alignfs.inject";

/// Largest write the kernel may send in one request. The kernel caps a request at
/// `/proc/sys/fs/fuse/max_pages_limit` pages (256 = 1 MiB by default); raising that limit
/// to 2048 lets writes of up to 8 MiB arrive whole instead of cut into 1 MiB pieces.
pub const MAX_WRITE: u32 = 8 << 20;
/// Kernel readahead per request.
const MAX_READAHEAD: u32 = 4 << 20;

/// How the mount behaves (`alignfs mount`'s options set it).
#[derive(Clone, Debug)]
pub struct FuseOptions {
    /// How long the kernel may cache attributes and names. Safe to be long: every change
    /// goes through this mount, and the kernel updates its copy on the way.
    pub ttl: Duration,
    /// Which opens read through the kernel page cache.
    pub cache: CacheMode,
    /// Request threads serving the mount.
    pub threads: usize,
    /// Which transport carries the requests.
    pub transport: Transport,
    /// Where the volume is mounted (reported by the stats attribute).
    pub mountpoint: PathBuf,
    /// The SSD's fault injector, when the mount was started with one.
    pub faults: Option<Arc<FaultPlan>>,
    /// After the last close of a file written over at most this many bytes, put them in
    /// the kernel's page cache (`reads` mode only; 0: never).
    pub fill_on_close: u64,
}

pub struct AlignFs {
    volume: Arc<Volume>,
    options: FuseOptions,
    handles: Handles,
    coherence: Coherence,
    fills: FillOnClose,
    session: Arc<OnceLock<Arc<TransportStats>>>,
    started: Instant,
    unserved: Unserved,
}

/// What the file system learns from its session once mounted: the notifier that keeps the
/// page cache coherent, and the transport's counters for the status report.
#[derive(Clone)]
pub struct SessionLink {
    coherence: Coherence,
    transport: Arc<OnceLock<Arc<TransportStats>>>,
}

impl SessionLink {
    pub fn attach<FS: Filesystem>(&self, session: &fuser::Session<FS>) {
        let transport = session.transport();
        self.coherence.attach(session.notifier(), transport.io_uring());
        let _ = self.transport.set(transport);
    }
}

fn errno(e: &Error) -> Errno {
    Errno::from_i32(e.errno())
}

/// Reply with the engine's error, logging the ones a user should hear about.
macro_rules! try_or_reply {
    ($reply:expr, $result:expr) => {
        match $result {
            Ok(v) => v,
            Err(e) => {
                if matches!(e, Error::Io { .. } | Error::Corrupt { .. } | Error::MetadataFull(_)) {
                    tracing::error!("{e}");
                }
                $reply.error(errno(&e));
                return;
            }
        }
    };
}

fn name_bytes(name: &OsStr) -> &[u8] {
    name.as_bytes()
}

impl AlignFs {
    pub fn new(volume: Volume, options: FuseOptions) -> AlignFs {
        let coherence = Coherence::new(options.cache, options.threads);
        let volume = Arc::new(volume);
        // Under `all` the writes themselves fill the cache; under `direct` nothing reads it.
        let limit = if options.cache == CacheMode::Reads { options.fill_on_close } else { 0 };
        let fills = FillOnClose::start(limit, Arc::clone(&volume), coherence.clone()).unwrap_or_else(|e| {
            tracing::error!("cannot start the page-cache fill thread, files are not cached after they are written: {e}");
            FillOnClose::off()
        });
        AlignFs {
            volume,
            options,
            handles: Handles::default(),
            coherence,
            fills,
            session: Arc::default(),
            started: Instant::now(),
            unserved: Unserved::default(),
        }
    }

    /// Attach the session to it once mounted.
    pub fn session_link(&self) -> SessionLink {
        SessionLink { coherence: self.coherence.clone(), transport: Arc::clone(&self.session) }
    }

    fn ino(ino: INodeNo) -> Ino {
        Ino(ino.0)
    }

    /// Count an open of `ino` in the engine and in the page-cache fills (`writable` if it
    /// can write); a refused open is counted in neither.
    fn open_handle(&self, ino: Ino, writable: bool) -> Result<alignfs::Attr, Error> {
        self.fills.opening(ino.0, writable);
        self.volume.open_handle(ino).inspect_err(|_| self.fills.closed(ino.0))
    }

    fn reply_entry(&self, reply: ReplyEntry, attr: &alignfs::Attr) {
        reply.entry(&self.options.ttl, &file_attr(attr, self.volume.geometry().block()), Generation(0));
    }

    /// Owner, group and mode of a new node in `parent`: a set-group-ID directory passes on
    /// its group (and, to subdirectories, the bit itself), as Linux file systems do.
    fn new_owner(&self, req: &Request, parent: Ino, mode: u32, is_dir: bool) -> Result<(u32, u32, u16), Error> {
        let dir = self.volume.getattr(parent)?;
        let mut perm = (mode & 0o7777) as u16;
        let gid = if dir.perm & 0o2000 != 0 {
            if is_dir {
                perm |= 0o2000;
            }
            dir.gid
        } else {
            req.gid()
        };
        Ok((req.uid(), gid, perm))
    }

    /// What a write or truncate by a process without CAP_FSETID, or a chown, does to a
    /// file (the kernel marks them FUSE_WRITE_KILL_SUIDGID or FATTR_KILL_SUIDGID and leaves
    /// it to us under FUSE_HANDLE_KILLPRIV_V2), as the kernel does it for local file
    /// systems: drop set-user-ID; drop set-group-ID where group execute is set, or where
    /// the caller is neither in the file's group nor `privileged` (without group execute
    /// the bit marks mandatory locking, which a member may keep); drop file capabilities.
    /// Costs nothing but a lookup when there is nothing to drop.
    fn drop_set_id_bits(&self, req: &Request, ino: Ino, privileged: bool) -> Result<(), Error> {
        let attr = self.volume.getattr(ino)?;
        let mut perm = attr.perm & !(libc::S_ISUID as u16);
        let keeps_sgid = privileged || in_group(req, attr.gid);
        if perm & libc::S_ISGID as u16 != 0 && (perm & libc::S_IXGRP as u16 != 0 || !keeps_sgid) {
            perm &= !(libc::S_ISGID as u16);
        }
        if perm != attr.perm {
            self.volume.setattr(ino, &SetAttrRequest { perm: Some(perm), ..SetAttrRequest::default() })?;
            // The kernel keeps the mode it cached; let it fetch the new one.
            self.coherence.attributes_changed(ino.0);
        }
        match self.volume.removexattr(ino, b"security.capability") {
            Ok(()) | Err(Error::NoAttribute) => Ok(()),
            Err(e) => Err(e),
        }
    }

    fn report_json(&self) -> Vec<u8> {
        let mut report = self.volume.report();
        let transport = self.session.get();
        report.daemon = Some(DaemonInfo {
            pid: std::process::id(),
            mountpoint: self.options.mountpoint.display().to_string(),
            uptime_s: self.started.elapsed().as_secs_f64(),
            front_end: format!("page cache: {}{}, {} request threads", self.options.cache, self.fills.describe(), self.options.threads),
            transport: transport.map(|t| t.summary()).unwrap_or_default(),
            io_uring_requests: transport.map_or(0, |t| t.ring_requests()),
            dev_fuse_requests: transport.map_or(0, |t| t.dev_fuse_requests()),
            requests_by_kind: transport.map(|t| t.requests_by_kind()).unwrap_or_default(),
        });
        serde_json::to_vec(&report).unwrap_or_default()
    }

    /// The entries of an open directory from `offset` on, each with the offset of the
    /// entry after it: ".", "..", then the handle's snapshot.
    fn listing(&self, dir: Ino, fh: FileHandle, offset: u64) -> Result<Vec<(u64, DirEntry)>, Error> {
        if offset == 0 {
            // rewinddir: start over from the directory as it is now.
            self.handles.refresh_dir(fh.0, self.volume.readdir(dir)?);
        }
        let parent = self.volume.parent(dir)?;
        let dot = |name: &[u8], ino| DirEntry { name: name.to_vec(), ino, kind: FileKind::Dir };
        let snapshot = self.handles.dir_entries(fh.0);
        let all = [dot(b".", dir), dot(b"..", parent)].into_iter().chain(snapshot.iter().cloned());
        Ok(all.enumerate().skip(offset as usize).map(|(i, e)| (i as u64 + 1, e)).collect())
    }
}

/// Whether the process behind `req` has `gid` as its group or one of its supplementary
/// groups (read from /proc; a process that is gone counts as not a member).
fn in_group(req: &Request, gid: u32) -> bool {
    if req.gid() == gid {
        return true;
    }
    let Ok(status) = std::fs::read_to_string(format!("/proc/{}/status", req.pid())) else { return false };
    let groups = status.lines().find_map(|line| line.strip_prefix("Groups:")).unwrap_or("");
    groups.split_whitespace().any(|g| g.parse() == Ok(gid))
}

fn reply_xattr(reply: ReplyXattr, size: u32, data: &[u8]) {
    if size == 0 {
        reply.size(u32::try_from(data.len()).unwrap_or(u32::MAX));
    } else if data.len() > size as usize {
        reply.error(Errno::ERANGE);
    } else {
        reply.data(data);
    }
}

fn set_time(t: Option<TimeOrNow>) -> Option<TimeNs> {
    t.map(|t| match t {
        TimeOrNow::Now => alignfs::meta::now_ns(),
        TimeOrNow::SpecificTime(t) => time_ns(t),
    })
}

/// The kernel-side settings every alignfs mount asks for. Public so the benchmark's FUSE
/// passthrough runs with exactly the same front end and measures only the FUSE tax.
pub fn configure_kernel(config: &mut KernelConfig, cache: CacheMode) {
    if let Err(nearest) = config.set_max_write(MAX_WRITE) {
        let _ = config.set_max_write(nearest);
    }
    // Readahead as large as one write: sequential readers get whole SSD runs.
    if let Err(nearest) = config.set_max_readahead(MAX_READAHEAD) {
        let _ = config.set_max_readahead(nearest);
    }
    if cache.has_direct_opens() {
        // Shared mappings stay possible with FOPEN_DIRECT_IO (kernel 6.6+).
        let _ = config.add_capabilities(fuser::InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP);
    }
    // `ls -l` and `find` get names and attributes in one request.
    let _ = config.add_capabilities(fuser::InitFlags::FUSE_DO_READDIRPLUS | fuser::InitFlags::FUSE_READDIRPLUS_AUTO);
    // One large direct write goes to the daemon as several requests at once, not one by one.
    let _ = config.add_capabilities(fuser::InitFlags::FUSE_ASYNC_DIO);
    // Dropping set-ID bits and file capabilities on write, truncate and chown is ours
    // (`drop_set_id_bits`), so the kernel need not ask for `security.capability` before
    // each write through the page cache: a GETXATTR round trip per write under
    // `--cache all` without it.
    let _ = config.add_capabilities(fuser::InitFlags::FUSE_HANDLE_KILLPRIV_V2);
    let _ = config.set_max_background(64);
    let _ = config.set_congestion_threshold(48);
}

impl Filesystem for AlignFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        configure_kernel(config, self.options.cache);
        Ok(())
    }

    fn destroy(&mut self) {
        // The fill thread holds the volume; it stops first.
        self.fills.stop();
        let Some(volume) = Arc::get_mut(&mut self.volume) else {
            tracing::error!("closing the volume: still in use; its next open recovers it");
            return;
        };
        match volume.close_in_place() {
            Ok(()) => {
                let usage = self.volume.stats().usage;
                tracing::info!(
                    "volume closed cleanly: checkpoint generation {}, {} journal bytes after it",
                    usage.checkpoint_generation,
                    usage.journal_used_bytes
                );
            }
            Err(e) => tracing::error!("closing the volume: {e}"),
        }
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let attr = try_or_reply!(reply, self.volume.lookup(Self::ino(parent), name_bytes(name)));
        self.reply_entry(reply, &attr);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let attr = try_or_reply!(reply, self.volume.getattr(Self::ino(ino)));
        reply.attr(&self.options.ttl, &file_attr(&attr, self.volume.geometry().block()));
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<std::time::SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<std::time::SystemTime>,
        _chgtime: Option<std::time::SystemTime>,
        _bkuptime: Option<std::time::SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        kill_suidgid: bool,
        reply: ReplyAttr,
    ) {
        if kill_suidgid {
            // The kernel asks for a truncate only when the caller lacks CAP_FSETID, but for
            // every chown of a file; a chown by root keeps what CAP_FSETID keeps.
            let chown_by_root = (uid.is_some() || gid.is_some()) && req.uid() == 0;
            try_or_reply!(reply, self.drop_set_id_bits(req, Self::ino(ino), chown_by_root));
        }
        let request =
            SetAttrRequest { perm: mode.map(|m| (m & 0o7777) as u16), uid, gid, size, atime: set_time(atime), mtime: set_time(mtime) };
        if size.is_some() {
            self.fills.changing(ino.0);
        }
        let attr = try_or_reply!(reply, self.volume.setattr(Self::ino(ino), &request));
        reply.attr(&self.options.ttl, &file_attr(&attr, self.volume.geometry().block()));
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let target = try_or_reply!(reply, self.volume.readlink(Self::ino(ino)));
        reply.data(&target);
    }

    fn mknod(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, _umask: u32, rdev: u32, reply: ReplyEntry) {
        let Some(kind) = kind_from_mode(mode) else {
            reply.error(Errno::EINVAL);
            return;
        };
        if kind == FileKind::Dir || kind == FileKind::Symlink {
            reply.error(Errno::EINVAL);
            return;
        }
        let parent = Self::ino(parent);
        let (uid, gid, perm) = try_or_reply!(reply, self.new_owner(req, parent, mode, false));
        let attr = try_or_reply!(reply, self.volume.mknod(parent, name_bytes(name), kind, perm, rdev, uid, gid));
        self.reply_entry(reply, &attr);
    }

    fn mkdir(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, _umask: u32, reply: ReplyEntry) {
        let parent = Self::ino(parent);
        let (uid, gid, perm) = try_or_reply!(reply, self.new_owner(req, parent, mode, true));
        let attr = try_or_reply!(reply, self.volume.mkdir(parent, name_bytes(name), perm, uid, gid));
        self.reply_entry(reply, &attr);
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        try_or_reply!(reply, self.volume.unlink(Self::ino(parent), name_bytes(name)));
        reply.ok();
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        try_or_reply!(reply, self.volume.rmdir(Self::ino(parent), name_bytes(name)));
        reply.ok();
    }

    fn symlink(&self, req: &Request, parent: INodeNo, link_name: &OsStr, target: &Path, reply: ReplyEntry) {
        let parent = Self::ino(parent);
        let (uid, gid, _) = try_or_reply!(reply, self.new_owner(req, parent, 0o777, false));
        let attr = try_or_reply!(reply, self.volume.symlink(parent, name_bytes(link_name), target.as_os_str().as_bytes(), uid, gid));
        self.reply_entry(reply, &attr);
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: fuser::RenameFlags,
        reply: ReplyEmpty,
    ) {
        let known = fuser::RenameFlags::RENAME_NOREPLACE | fuser::RenameFlags::RENAME_EXCHANGE;
        if !known.contains(flags) {
            // RENAME_WHITEOUT is for overlay file systems' upper layers.
            reply.error(Errno::EINVAL);
            return;
        }
        let flags = RenameFlags {
            no_replace: flags.contains(fuser::RenameFlags::RENAME_NOREPLACE),
            exchange: flags.contains(fuser::RenameFlags::RENAME_EXCHANGE),
        };
        try_or_reply!(reply, self.volume.rename(Self::ino(parent), name_bytes(name), Self::ino(newparent), name_bytes(newname), flags));
        reply.ok();
    }

    fn link(&self, _req: &Request, ino: INodeNo, newparent: INodeNo, newname: &OsStr, reply: ReplyEntry) {
        let attr = try_or_reply!(reply, self.volume.link(Self::ino(ino), Self::ino(newparent), name_bytes(newname)));
        self.reply_entry(reply, &attr);
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let attr = try_or_reply!(reply, self.open_handle(Self::ino(ino), flags.0 & libc::O_ACCMODE != libc::O_RDONLY));
        reply.opened(FileHandle(attr.ino.0), self.options.cache.fopen_flags(flags.0));
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
        self.coherence.reading(ino.0, offset, size);
        let mut buf = vec![0u8; size as usize];
        let n = try_or_reply!(reply, self.volume.read(Self::ino(ino), offset, &mut buf));
        reply.data(&buf[..n]);
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        if write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID) {
            try_or_reply!(reply, self.drop_set_id_bits(req, Self::ino(ino), false));
        }
        // Pages the kernel's cache writes back go by modified ratio where the profile
        // chooses so (`byte`); every other write reaches the engine as it came.
        let from_page_cache = write_flags.contains(WriteFlags::FUSE_WRITE_CACHE);
        let written = if from_page_cache {
            self.volume.write_back(Self::ino(ino), offset, data)
        } else {
            self.volume.write(Self::ino(ino), offset, data)
        };
        let n = try_or_reply!(reply, written);
        self.fills.wrote(ino.0, offset, n as u64);
        self.coherence.written(ino.0, offset, u32::try_from(n).unwrap_or(u32::MAX), from_page_cache, reply);
    }

    fn flush(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _lock_owner: LockOwner, reply: ReplyEmpty) {
        // Nothing is buffered here: a write is as durable as the profile promises when it
        // returns, and the kernel writes back a mapping's dirty pages before it would send
        // FLUSH. ENOSYS tells the kernel so once for the whole mount: it stops sending FLUSH
        // on every close(2) and returns success itself, a round trip saved per close.
        reply.error(Errno::ENOSYS);
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let released = self.volume.release_handle(Self::ino(ino));
        self.fills.closed(ino.0);
        try_or_reply!(reply, released);
        reply.ok();
    }

    fn fsync(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        try_or_reply!(reply, self.volume.fsync(Self::ino(ino)));
        if self.volume.durable_when_written() {
            // Every write this mount acknowledges is already durable, and the kernel writes
            // back a mapping's dirty pages (and waits for them) before it would send FSYNC.
            // ENOSYS makes the kernel answer every later fsync(2) of the mount itself, with
            // success: a durable write costs one round trip instead of two.
            reply.error(Errno::ENOSYS);
        } else {
            reply.ok();
        }
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let entries = try_or_reply!(reply, self.volume.readdir(Self::ino(ino)));
        let fh = self.handles.open_dir(entries);
        reply.opened(FileHandle(fh), FopenFlags::empty());
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let listing = try_or_reply!(reply, self.listing(Self::ino(ino), fh, offset));
        for (next, entry) in listing {
            if reply.add(INodeNo(entry.ino.0), next, attr::file_type(entry.kind), OsStr::from_bytes(&entry.name)) {
                break;
            }
        }
        reply.ok();
    }

    fn readdirplus(&self, _req: &Request, ino: INodeNo, fh: FileHandle, offset: u64, mut reply: ReplyDirectoryPlus) {
        let listing = try_or_reply!(reply, self.listing(Self::ino(ino), fh, offset));
        let block = self.volume.geometry().block();
        for (next, entry) in listing {
            // An entry removed since the listing was taken is simply left out.
            let Ok(attr) = self.volume.getattr(entry.ino) else { continue };
            if reply.add(
                INodeNo(entry.ino.0),
                next,
                OsStr::from_bytes(&entry.name),
                &self.options.ttl,
                &file_attr(&attr, block),
                Generation(0),
            ) {
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, _flags: OpenFlags, reply: ReplyEmpty) {
        self.handles.close_dir(fh.0);
        reply.ok();
    }

    fn fsyncdir(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        // Namespace changes are journaled before they return in every profile; nothing is
        // ever pending. ENOSYS lets the kernel answer later directory fsyncs itself.
        reply.error(Errno::ENOSYS);
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let s = self.volume.statfs();
        // Free inodes are bounded by checkpoint space, not a table; report a large number.
        let files_free = u64::from(u32::MAX).saturating_sub(s.inodes);
        let bsize = u32::try_from(s.block_bytes).unwrap_or(u32::MAX);
        let namelen = u32::try_from(s.max_name_bytes).unwrap_or(255);
        reply.statfs(s.blocks_total, s.blocks_free, s.blocks_free, s.inodes + files_free, files_free, bsize, namelen, bsize);
    }

    fn setxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, value: &[u8], flags: i32, _position: u32, reply: ReplyEmpty) {
        if name == STATS_XATTR {
            reply.error(Errno::EPERM);
            return;
        }
        if name == INJECT_XATTR && ino == INodeNo::ROOT {
            let Some(faults) = &self.options.faults else {
                reply.error(Errno::EPERM);
                return;
            };
            let spec = String::from_utf8_lossy(value);
            try_or_reply!(reply, faults.arm(&spec));
            tracing::warn!("fault injection armed: {}", faults.describe());
            reply.ok();
            return;
        }
        let mode = match flags {
            0 => XattrSet::CreateOrReplace,
            libc::XATTR_CREATE => XattrSet::CreateOnly,
            libc::XATTR_REPLACE => XattrSet::ReplaceOnly,
            _ => {
                reply.error(Errno::EINVAL);
                return;
            }
        };
        try_or_reply!(reply, self.volume.setxattr(Self::ino(ino), name_bytes(name), value, mode));
        reply.ok();
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        if name == STATS_XATTR && ino == INodeNo::ROOT {
            reply_xattr(reply, size, &self.report_json());
            return;
        }
        let inject_plan = self.options.faults.as_ref().filter(|_| name == INJECT_XATTR && ino == INodeNo::ROOT);
        if let Some(faults) = inject_plan {
            reply_xattr(reply, size, faults.describe().as_bytes());
            return;
        }
        let value = try_or_reply!(reply, self.volume.getxattr(Self::ino(ino), name_bytes(name)));
        reply_xattr(reply, size, &value);
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let names = try_or_reply!(reply, self.volume.listxattr(Self::ino(ino)));
        let mut list = Vec::new();
        for name in names {
            list.extend_from_slice(&name);
            list.push(0);
        }
        reply_xattr(reply, size, &list);
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        try_or_reply!(reply, self.volume.removexattr(Self::ino(ino), name_bytes(name)));
        reply.ok();
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        let attr = try_or_reply!(reply, self.volume.getattr(Self::ino(ino)));
        if attr::may_access(&attr, req.uid(), req.gid(), mask.bits()) {
            reply.ok();
        } else {
            reply.error(Errno::EACCES);
        }
    }

    fn create(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, _umask: u32, flags: i32, reply: ReplyCreate) {
        let parent = Self::ino(parent);
        let (uid, gid, perm) = try_or_reply!(reply, self.new_owner(req, parent, mode, false));
        let attr = try_or_reply!(reply, self.volume.create_file(parent, name_bytes(name), perm, uid, gid));
        let attr = try_or_reply!(reply, self.open_handle(attr.ino, true));
        reply.created(
            &self.options.ttl,
            &file_attr(&attr, self.volume.geometry().block()),
            Generation(0),
            FileHandle(attr.ino.0),
            self.options.cache.fopen_flags(flags),
        );
    }

    fn fallocate(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, length: u64, mode: i32, reply: ReplyEmpty) {
        let mode = match mode {
            0 => FallocateMode::Allocate { keep_size: false },
            libc::FALLOC_FL_KEEP_SIZE => FallocateMode::Allocate { keep_size: true },
            m if m == libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE => FallocateMode::PunchHole,
            _ => {
                reply.error(Errno::EOPNOTSUPP);
                return;
            }
        };
        self.fills.changing(ino.0);
        try_or_reply!(reply, self.volume.fallocate(Self::ino(ino), offset, length, mode));
        reply.ok();
    }

    fn lseek(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: i64, whence: i32, reply: ReplyLseek) {
        let target = match whence {
            libc::SEEK_DATA => SeekTarget::Data,
            libc::SEEK_HOLE => SeekTarget::Hole,
            _ => {
                reply.error(Errno::EINVAL);
                return;
            }
        };
        let Ok(offset) = u64::try_from(offset) else {
            reply.error(Errno::ENXIO);
            return;
        };
        let found = try_or_reply!(reply, self.volume.seek(Self::ino(ino), offset, target));
        reply.offset(i64::try_from(found).unwrap_or(i64::MAX));
    }

    #[allow(clippy::too_many_arguments)] // the trait's signature
    fn ioctl(&self, _: &Request, _: INodeNo, _: FileHandle, _: IoctlFlags, cmd: u32, _: &[u8], _: u32, reply: ReplyIoctl) {
        self.unserved.ioctl(cmd);
        reply.error(Errno::ENOTTY);
    }

    #[allow(clippy::too_many_arguments)] // the trait's signature
    fn poll(&self, _: &Request, _: INodeNo, _: FileHandle, _: PollNotifier, _: PollEvents, _: PollFlags, reply: ReplyPoll) {
        self.unserved.request("poll");
        reply.error(Errno::ENOSYS);
    }

    #[allow(clippy::too_many_arguments)] // the trait's signature
    fn copy_file_range(
        &self,
        _: &Request,
        _: INodeNo,
        _: FileHandle,
        _: u64,
        _: INodeNo,
        _: FileHandle,
        _: u64,
        _: u64,
        _: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        self.unserved.request("copy_file_range");
        reply.error(Errno::ENOSYS);
    }

    #[allow(clippy::too_many_arguments)] // the trait's signature
    fn getlk(&self, _: &Request, _: INodeNo, _: FileHandle, _: LockOwner, _: u64, _: u64, _: i32, _: u32, reply: ReplyLock) {
        self.unserved.request("getlk");
        reply.error(Errno::ENOSYS);
    }

    #[allow(clippy::too_many_arguments)] // the trait's signature
    fn setlk(&self, _: &Request, _: INodeNo, _: FileHandle, _: LockOwner, _: u64, _: u64, _: i32, _: u32, _: bool, reply: ReplyEmpty) {
        self.unserved.request("setlk");
        reply.error(Errno::ENOSYS);
    }

    fn bmap(&self, _: &Request, _: INodeNo, _: u32, _: u64, reply: ReplyBmap) {
        self.unserved.request("bmap");
        reply.error(Errno::ENOSYS);
    }
}
