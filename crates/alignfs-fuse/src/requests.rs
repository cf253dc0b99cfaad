//! The kernel's requests, each answered by one engine call through [`AlignFs`]'s helpers.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;

use alignfs::volume::{FallocateMode, RenameFlags, SeekTarget, SetAttrRequest, XattrSet};
use alignfs::{Error, FileKind};
use fuser::{
    AccessFlags, CopyFileRangeFlags, Errno, FileHandle, Filesystem, FopenFlags, Generation, INodeNo, IoctlFlags, KernelConfig, LockOwner,
    OpenFlags, PollEvents, PollFlags, PollNotifier, ReplyAttr, ReplyBmap, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus,
    ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyLock, ReplyLseek, ReplyOpen, ReplyPoll, ReplyStatfs, ReplyWrite, ReplyXattr, Request,
    TimeOrNow, WriteFlags,
};

use crate::attr::{absent, file_attr, kind_from_mode};
use crate::{configure_kernel, errno, name_bytes, reply_xattr, set_time, AlignFs, INJECT_XATTR, STATS_XATTR, SYNC_XATTR};

/// A READ at least this large, from an open through the page cache, is the kernel's
/// readahead of a stream: it reads the SSD directly.
const STREAM_READ: u32 = 256 << 10;

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

impl Filesystem for AlignFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        configure_kernel(config, self.options.cache);
        Ok(())
    }

    fn destroy(&mut self) {
        // The fill thread holds the volume; it stops first.
        self.fills.stop();
        self.report.release_volume();
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
        let attr = match self.volume.lookup(Self::ino(parent), name_bytes(name)) {
            // The kernel may remember a missing name as it remembers a present one (node 0
            // is "no such entry, for the TTL"): names only appear through this mount, which
            // replaces the negative entry on create, mkdir, link, symlink and rename.
            Err(Error::NotFound) => return reply.entry(&self.options.ttl, &absent(), Generation(0)),
            result => try_or_reply!(reply, result),
        };
        self.reply_entry(reply, &attr);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let attr = try_or_reply!(reply, self.volume.getattr(Self::ino(ino)));
        reply.attr(&self.options.ttl, &file_attr(&attr, self.volume.geometry().preferred_io()));
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
        reply.attr(&self.options.ttl, &file_attr(&attr, self.volume.geometry().preferred_io()));
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
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        self.coherence.reading(ino.0, offset, size);
        let mut buf = vec![0u8; size as usize];
        // What an open through the page cache reads, the kernel keeps: the host's copy of
        // the SSD pages it came from would hold the same bytes a second time. Large reads
        // (the kernel's readahead of a stream) go direct; small ones, random reads such as
        // RocksDB's, keep the host's readahead of the SSD, which their next reads hit.
        let read = if self.options.cache.caches(flags.0) && size >= STREAM_READ {
            self.volume.read_kept_by_reader(Self::ino(ino), offset, &mut buf)
        } else {
            self.volume.read(Self::ino(ino), offset, &mut buf)
        };
        let n = try_or_reply!(reply, read);
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
            if reply.add(INodeNo(entry.ino.0), next, crate::attr::file_type(entry.kind), OsStr::from_bytes(&entry.name)) {
                break;
            }
        }
        reply.ok();
    }

    fn readdirplus(&self, _req: &Request, ino: INodeNo, fh: FileHandle, offset: u64, mut reply: ReplyDirectoryPlus) {
        let listing = try_or_reply!(reply, self.listing(Self::ino(ino), fh, offset));
        let io_bytes = self.volume.geometry().preferred_io();
        for (next, entry) in listing {
            // An entry removed since the listing was taken is simply left out.
            let Ok(attr) = self.volume.getattr(entry.ino) else { continue };
            if reply.add(
                INodeNo(entry.ino.0),
                next,
                OsStr::from_bytes(&entry.name),
                &self.options.ttl,
                &file_attr(&attr, io_bytes),
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

    fn fsyncdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        if self.volume.durable_when_written() {
            // Namespace changes are journaled before they return: nothing is ever pending.
            // ENOSYS lets the kernel answer later directory fsyncs itself.
            reply.error(Errno::ENOSYS);
            return;
        }
        // `scrap` commits namespace changes as a page-cache file system commits its log.
        try_or_reply!(reply, self.volume.fsync(Self::ino(ino)));
        reply.ok();
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
        if name == SYNC_XATTR && ino == INodeNo::ROOT {
            try_or_reply!(reply, self.volume.sync_all());
            reply.ok();
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
        if crate::attr::may_access(&attr, req.uid(), req.gid(), mask.bits()) {
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
            &file_attr(&attr, self.volume.geometry().preferred_io()),
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
