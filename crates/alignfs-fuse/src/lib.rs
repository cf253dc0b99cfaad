//! The FUSE front end: a POSIX file system served from an alignfs [`Volume`].
//!
//! Every request maps onto one engine call; this layer only translates types, picks
//! owners and modes for new files, and keeps open-directory listings stable. Choices and
//! their measurements are in `docs/FUSE.md`.

mod attr;
mod fill_on_close;
mod handles;
mod page_cache;
mod requests;
mod transport;
mod unserved;

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use alignfs::device::FaultPlan;
use alignfs::meta::TimeNs;
use alignfs::stats::{DaemonInfo, RequestLatency};
use alignfs::volume::{DirEntry, SetAttrRequest};
use alignfs::{Error, FileKind, Ino, Volume};
use fuser::{Errno, FileHandle, Filesystem, Generation, INodeNo, KernelConfig, ReplyEntry, ReplyXattr, Request, TimeOrNow, TransportStats};

use attr::{file_attr, time_ns};
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

/// The root attribute whose write makes the whole volume durable (`alignfs sync`): what
/// `syncfs(2)` would do if the kernel sent it to a FUSE daemon.
pub const SYNC_XATTR: &str = "user.alignfs.sync";

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
    report: ReportSource,
    unserved: Unserved,
}

/// What the daemon's status report is made of. A clone taken before the session owns the
/// file system lets other threads (the metrics endpoint) build the same report.
#[derive(Clone)]
pub struct ReportSource {
    /// Emptied when the file system closes the volume, which needs the only reference
    /// (a `Weak` would stop `Arc::get_mut` too).
    volume: Arc<parking_lot::Mutex<Option<Arc<Volume>>>>,
    transport: Arc<OnceLock<Arc<TransportStats>>>,
    mountpoint: String,
    front_end: String,
    started: Instant,
}

impl ReportSource {
    /// The volume's report with the serving daemon's part; `None` once it is closed.
    pub fn report(&self) -> Option<alignfs::stats::VolumeReport> {
        // Held while the report is made, so that `release_volume` waits for it.
        let volume = self.volume.lock();
        let mut report = volume.as_ref()?.report();
        drop(volume);
        let transport = self.transport.get();
        report.daemon = Some(DaemonInfo {
            pid: std::process::id(),
            mountpoint: self.mountpoint.clone(),
            uptime_s: self.started.elapsed().as_secs_f64(),
            front_end: self.front_end.clone(),
            transport: transport.map(|t| t.summary()).unwrap_or_default(),
            io_uring_requests: transport.map_or(0, |t| t.ring_requests()),
            dev_fuse_requests: transport.map_or(0, |t| t.dev_fuse_requests()),
            requests_by_kind: transport.map(|t| t.requests_by_kind()).unwrap_or_default(),
            request_latency: transport.map(|t| request_latency(t)).unwrap_or_default(),
            resident_bytes: alignfs::stats::resident_bytes(),
        });
        Some(report)
    }

    /// Lets go of the volume, once a report in progress is done, so that the file system
    /// can close it.
    fn release_volume(&self) {
        self.volume.lock().take();
    }
}

fn request_latency(transport: &TransportStats) -> Vec<RequestLatency> {
    let bounds_s = fuser::LATENCY_BOUNDS_S.to_vec();
    transport
        .latency_by_kind()
        .into_iter()
        .map(|k| RequestLatency { kind: k.kind, bounds_s: bounds_s.clone(), counts: k.counts, sum_s: k.sum_s })
        .collect()
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
        let session: Arc<OnceLock<Arc<TransportStats>>> = Arc::default();
        let report = ReportSource {
            volume: Arc::new(parking_lot::Mutex::new(Some(Arc::clone(&volume)))),
            transport: Arc::clone(&session),
            mountpoint: options.mountpoint.display().to_string(),
            front_end: format!("page cache: {}{}, {} request threads", options.cache, fills.describe(), options.threads),
            started: Instant::now(),
        };
        AlignFs { volume, options, handles: Handles::default(), coherence, fills, session, report, unserved: Unserved::default() }
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
        reply.entry(&self.options.ttl, &file_attr(attr, self.volume.geometry().preferred_io()), Generation(0));
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
        self.report.report().and_then(|report| serde_json::to_vec(&report).ok()).unwrap_or_default()
    }

    /// The source of the daemon's report, for threads outside the session.
    pub fn report_source(&self) -> ReportSource {
        self.report.clone()
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

#[cfg(test)]
mod tests {
    #[test]
    fn fuse_requests_are_timed_in_the_engines_buckets() {
        assert_eq!(fuser::LATENCY_BOUNDS_S, alignfs::stats::LATENCY_BOUNDS_S);
    }
}
