//! A FUSE file system that forwards every request to a directory of the host, with the same
//! front-end settings as `alignfs mount` (threads, page-cache mode and its coherence,
//! request sizes, TTL).
//! bench/run.py measures it next to alignfs and the host file system so the cost of FUSE
//! itself is visible apart from the engine's.
//!
//! It serves what the benchmarks use: files, directories, reads, writes, fsync,
//! fallocate, rename, statfs. Other requests (links, symlinks, xattrs, device nodes)
//! return ENOSYS. Inode numbers are the host's; the path of an inode is remembered from
//! the last lookup that reached it, which is enough for a benchmark's tree and is not
//! meant as a general-purpose passthrough.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::{File, Metadata, OpenOptions};
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use alignfs_fuse::{CacheMode, Coherence, RingThreads, Transport};
use anyhow::Context;
use clap::Parser;
use fuser::{
    Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, KernelConfig, LockOwner, MountOption,
    OpenFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request,
    TimeOrNow, WriteFlags,
};
use parking_lot::Mutex;

#[derive(Parser)]
#[command(about = "FUSE passthrough with alignfs's front-end settings, for measuring the FUSE tax")]
struct Args {
    /// Directory of the host whose contents the mount shows.
    #[arg(long)]
    source: PathBuf,
    /// FUSE request threads (as `alignfs mount --threads`).
    #[arg(long, default_value_t = 4)]
    threads: usize,
    /// Which opens use the kernel page cache (as `alignfs mount --cache`).
    #[arg(long, value_name = "MODE", default_value = "reads")]
    cache: CacheMode,
    /// How requests travel (as `alignfs mount --transport`).
    #[arg(long, value_name = "TRANSPORT", default_value = "auto")]
    transport: Transport,
    /// Where the io_uring request threads run (as `alignfs mount --ring-threads`).
    #[arg(long, value_name = "PLACEMENT", default_value = "pinned")]
    ring_threads: RingThreads,
    mountpoint: PathBuf,
}

const TTL: Duration = Duration::from_secs(1);

struct Passthrough {
    source: PathBuf,
    cache: CacheMode,
    coherence: Coherence,
    paths: Mutex<HashMap<u64, PathBuf>>,
    files: Mutex<HashMap<u64, Arc<File>>>,
    next_fh: AtomicU64,
}

fn io_errno(e: &std::io::Error) -> Errno {
    Errno::from_i32(e.raw_os_error().unwrap_or(libc::EIO))
}

macro_rules! try_io {
    ($reply:expr, $result:expr) => {
        match $result {
            Ok(v) => v,
            Err(e) => {
                $reply.error(io_errno(&e));
                return;
            }
        }
    };
}

fn file_type(meta: &Metadata) -> FileType {
    let t = meta.file_type();
    if t.is_dir() {
        FileType::Directory
    } else if t.is_symlink() {
        FileType::Symlink
    } else {
        FileType::RegularFile
    }
}

fn system_time(secs: i64, nsecs: i64) -> SystemTime {
    let d = Duration::new(secs.unsigned_abs(), u32::try_from(nsecs).unwrap_or(0));
    if secs >= 0 {
        UNIX_EPOCH + d
    } else {
        UNIX_EPOCH.checked_sub(d).unwrap_or(UNIX_EPOCH)
    }
}

impl Passthrough {
    fn fuse_ino(&self, meta: &Metadata, path: &Path) -> u64 {
        if path == self.source {
            1
        } else {
            meta.ino()
        }
    }

    fn attr(&self, meta: &Metadata, path: &Path) -> FileAttr {
        FileAttr {
            ino: INodeNo(self.fuse_ino(meta, path)),
            size: meta.size(),
            blocks: meta.blocks(),
            atime: system_time(meta.atime(), meta.atime_nsec()),
            mtime: system_time(meta.mtime(), meta.mtime_nsec()),
            ctime: system_time(meta.ctime(), meta.ctime_nsec()),
            crtime: system_time(meta.ctime(), meta.ctime_nsec()),
            kind: file_type(meta),
            perm: (meta.mode() & 0o7777) as u16,
            nlink: u32::try_from(meta.nlink()).unwrap_or(u32::MAX),
            uid: meta.uid(),
            gid: meta.gid(),
            rdev: u32::try_from(meta.rdev()).unwrap_or(0),
            blksize: u32::try_from(meta.blksize()).unwrap_or(4096),
            flags: 0,
        }
    }

    fn path(&self, ino: INodeNo) -> Result<PathBuf, std::io::Error> {
        self.paths.lock().get(&ino.0).cloned().ok_or_else(|| std::io::Error::from_raw_os_error(libc::ESTALE))
    }

    fn child(&self, parent: INodeNo, name: &OsStr) -> Result<PathBuf, std::io::Error> {
        Ok(self.path(parent)?.join(name))
    }

    /// Stat `path` and remember it as the path of its inode.
    fn remember(&self, path: PathBuf) -> Result<FileAttr, std::io::Error> {
        let meta = std::fs::symlink_metadata(&path)?;
        let attr = self.attr(&meta, &path);
        self.paths.lock().insert(attr.ino.0, path);
        Ok(attr)
    }

    fn open_file(&self, file: File, reply_flags: FopenFlags) -> (FileHandle, FopenFlags) {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.files.lock().insert(fh, Arc::new(file));
        (FileHandle(fh), reply_flags)
    }

    fn file(&self, fh: FileHandle) -> Result<Arc<File>, std::io::Error> {
        self.files.lock().get(&fh.0).cloned().ok_or_else(|| std::io::Error::from_raw_os_error(libc::EBADF))
    }

    fn fopen_flags(&self, open_flags: i32) -> FopenFlags {
        // pwrite on the host file is safe from many threads, so the same flags as alignfs.
        self.cache.fopen_flags(open_flags)
    }
}

fn open_options(flags: i32) -> OpenOptions {
    let mut options = OpenOptions::new();
    match flags & libc::O_ACCMODE {
        libc::O_RDONLY => options.read(true),
        libc::O_WRONLY => options.write(true),
        _ => options.read(true).write(true),
    };
    // O_APPEND is left out: the kernel sends appends with their offset.
    options.custom_flags(flags & (libc::O_SYNC | libc::O_DSYNC | libc::O_NOATIME));
    options
}

fn to_system_time(t: TimeOrNow) -> SystemTime {
    match t {
        TimeOrNow::SpecificTime(t) => t,
        TimeOrNow::Now => SystemTime::now(),
    }
}

impl Filesystem for Passthrough {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        alignfs_fuse::configure_kernel(config, self.cache);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let path = try_io!(reply, self.child(parent, name));
        let attr = try_io!(reply, self.remember(path));
        reply.entry(&TTL, &attr, Generation(0));
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        let path = try_io!(reply, self.path(ino));
        let meta = match fh.map(|fh| self.file(fh)) {
            Some(Ok(file)) => file.metadata(),
            _ => std::fs::symlink_metadata(&path),
        };
        let meta = try_io!(reply, meta);
        reply.attr(&TTL, &self.attr(&meta, &path));
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        // Never set: this file system does not offer FUSE_HANDLE_KILLPRIV_V2, so the kernel
        // drops set-ID bits itself.
        _kill_suidgid: bool,
        reply: ReplyAttr,
    ) {
        let path = try_io!(reply, self.path(ino));
        if let Some(mode) = mode {
            try_io!(reply, std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode & 0o7777)));
        }
        if uid.is_some() || gid.is_some() {
            try_io!(reply, std::os::unix::fs::lchown(&path, uid, gid));
        }
        if size.is_some() || atime.is_some() || mtime.is_some() {
            let file = try_io!(reply, OpenOptions::new().write(size.is_some()).read(size.is_none()).open(&path));
            if let Some(size) = size {
                try_io!(reply, file.set_len(size));
            }
            let mut times = std::fs::FileTimes::new();
            if let Some(t) = atime {
                times = times.set_accessed(to_system_time(t));
            }
            if let Some(t) = mtime {
                times = times.set_modified(to_system_time(t));
            }
            try_io!(reply, file.set_times(times));
        }
        let meta = try_io!(reply, std::fs::symlink_metadata(&path));
        reply.attr(&TTL, &self.attr(&meta, &path));
    }

    fn mkdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        let path = try_io!(reply, self.child(parent, name));
        try_io!(reply, std::fs::DirBuilder::new().mode(mode & !umask).create(&path));
        let attr = try_io!(reply, self.remember(path));
        reply.entry(&TTL, &attr, Generation(0));
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let path = try_io!(reply, self.child(parent, name));
        try_io!(reply, std::fs::remove_file(&path));
        self.paths.lock().retain(|_, p| *p != path);
        reply.ok();
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let path = try_io!(reply, self.child(parent, name));
        try_io!(reply, std::fs::remove_dir(&path));
        self.paths.lock().retain(|_, p| *p != path);
        reply.ok();
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
        if !flags.is_empty() {
            reply.error(Errno::EINVAL);
            return;
        }
        let from = try_io!(reply, self.child(parent, name));
        let to = try_io!(reply, self.child(newparent, newname));
        try_io!(reply, std::fs::rename(&from, &to));
        // Everything at or below the old path now lives below the new one.
        let mut paths = self.paths.lock();
        paths.retain(|_, p| *p != to);
        for p in paths.values_mut() {
            if let Ok(rest) = p.strip_prefix(&from) {
                *p = if rest.as_os_str().is_empty() { to.clone() } else { to.join(rest) };
            }
        }
        reply.ok();
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let path = try_io!(reply, self.path(ino));
        let file = try_io!(reply, open_options(flags.0).open(&path));
        let (fh, flags) = self.open_file(file, self.fopen_flags(flags.0));
        reply.opened(fh, flags);
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        self.coherence.reading(ino.0, offset, size);
        let file = try_io!(reply, self.file(fh));
        let mut buf = vec![0u8; size as usize];
        let mut done = 0;
        while done < buf.len() {
            match file.read_at(&mut buf[done..], offset + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    reply.error(io_errno(&e));
                    return;
                }
            }
        }
        reply.data(&buf[..done]);
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let file = try_io!(reply, self.file(fh));
        try_io!(reply, file.write_all_at(data, offset));
        let from_page_cache = write_flags.contains(WriteFlags::FUSE_WRITE_CACHE);
        self.coherence.written(ino.0, offset, u32::try_from(data.len()).unwrap_or(u32::MAX), from_page_cache, reply);
    }

    fn flush(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _lock_owner: LockOwner, reply: ReplyEmpty) {
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.files.lock().remove(&fh.0);
        reply.ok();
    }

    fn fsync(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, datasync: bool, reply: ReplyEmpty) {
        let file = try_io!(reply, self.file(fh));
        try_io!(reply, if datasync { file.sync_data() } else { file.sync_all() });
        reply.ok();
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        try_io!(reply, self.path(ino));
        reply.opened(FileHandle(0), FopenFlags::empty());
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let path = try_io!(reply, self.path(ino));
        let entries = try_io!(reply, std::fs::read_dir(&path));
        let dots = [(ino.0, FileType::Directory, OsStr::new(".").to_owned()), (1, FileType::Directory, OsStr::new("..").to_owned())];
        let rest = entries.filter_map(Result::ok).filter_map(|e| {
            let meta = e.metadata().ok()?;
            Some((meta.ino(), file_type(&meta), e.file_name()))
        });
        for (i, (entry_ino, kind, name)) in dots.into_iter().chain(rest).enumerate().skip(offset as usize) {
            if reply.add(INodeNo(entry_ino), i as u64 + 1, kind, &name) {
                break;
            }
        }
        reply.ok();
    }

    fn readdirplus(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: fuser::ReplyDirectoryPlus) {
        let path = try_io!(reply, self.path(ino));
        let entries = try_io!(reply, std::fs::read_dir(&path));
        let names = [OsStr::new(".").to_owned(), OsStr::new("..").to_owned()]
            .into_iter()
            .chain(entries.filter_map(Result::ok).map(|e| e.file_name()));
        for (i, name) in names.enumerate().skip(offset as usize) {
            let entry_path = match name.to_str() {
                Some(".") => path.clone(),
                Some("..") => path.parent().filter(|_| path != self.source).map_or(path.clone(), Path::to_path_buf),
                _ => path.join(&name),
            };
            // An entry removed since the listing was read is left out.
            let Ok(meta) = std::fs::symlink_metadata(&entry_path) else { continue };
            let attr = self.attr(&meta, &entry_path);
            if name != "." && name != ".." {
                self.paths.lock().insert(attr.ino.0, entry_path);
            }
            if reply.add(attr.ino, i as u64 + 1, &name, &TTL, &attr, Generation(0)) {
                break;
            }
        }
        reply.ok();
    }

    fn fsyncdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        let path = try_io!(reply, self.path(ino));
        try_io!(reply, File::open(&path).and_then(|d| d.sync_all()));
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let s = try_io!(reply, host_statvfs(&self.source));
        reply.statfs(s.f_blocks, s.f_bfree, s.f_bavail, s.f_files, s.f_ffree, s.f_bsize as u32, s.f_namemax as u32, s.f_frsize as u32);
    }

    fn create(&self, _req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, flags: i32, reply: ReplyCreate) {
        let path = try_io!(reply, self.child(parent, name));
        let mut options = open_options(flags);
        options.create(true).mode(mode & !umask & 0o7777);
        if flags & libc::O_EXCL != 0 {
            options.create_new(true);
        }
        let file = try_io!(reply, options.open(&path));
        let attr = try_io!(reply, self.remember(path));
        let (fh, open_flags) = self.open_file(file, self.fopen_flags(flags));
        reply.created(&TTL, &attr, Generation(0), fh, open_flags);
    }

    fn fallocate(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, offset: u64, length: u64, mode: i32, reply: ReplyEmpty) {
        let file = try_io!(reply, self.file(fh));
        let (Ok(offset), Ok(length)) = (i64::try_from(offset), i64::try_from(length)) else {
            reply.error(Errno::EINVAL);
            return;
        };
        // SAFETY: fallocate(2) on a descriptor this process owns for the duration of the call.
        let rc = unsafe { libc::fallocate(file.as_raw_fd(), mode, offset, length) };
        if rc != 0 {
            reply.error(io_errno(&std::io::Error::last_os_error()));
            return;
        }
        reply.ok();
    }
}

fn host_statvfs(path: &Path) -> Result<libc::statvfs, std::io::Error> {
    let c_path =
        std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    let mut out = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `c_path` is NUL-terminated and `out` is valid for one statvfs; the kernel fills
    // it completely when the call succeeds, which is checked before reading it.
    let rc = unsafe { libc::statvfs(c_path.as_ptr(), out.as_mut_ptr()) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: statvfs returned 0, so it initialised `out`.
    Ok(unsafe { out.assume_init() })
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let source = std::fs::canonicalize(&args.source).with_context(|| format!("source directory {}", args.source.display()))?;
    anyhow::ensure!(source.is_dir(), "{} is not a directory", source.display());
    let fs = Passthrough {
        paths: Mutex::new(HashMap::from([(1, source.clone())])),
        source,
        cache: args.cache,
        coherence: Coherence::new(args.cache, args.threads),
        files: Mutex::new(HashMap::new()),
        next_fh: AtomicU64::new(1),
    };
    let mut config = Config::default();
    config.mount_options = vec![MountOption::FSName("alignfs-passthrough".into()), MountOption::DefaultPermissions];
    config.n_threads = Some(args.threads);
    config.clone_fd = true;
    args.transport.configure(&mut config);
    args.ring_threads.configure(&mut config);
    let coherence = fs.coherence.clone();
    let session = fuser::Session::new(fs, &args.mountpoint, &config).with_context(|| format!("mount at {}", args.mountpoint.display()))?;
    let transport = session.transport();
    args.transport.check(&transport).map_err(anyhow::Error::msg)?;
    coherence.attach(session.notifier(), transport.io_uring());
    eprintln!("passthrough of {} mounted at {} (transport: {})", args.source.display(), args.mountpoint.display(), transport.summary());
    session.run().context("serve FUSE requests")?;
    Ok(())
}
