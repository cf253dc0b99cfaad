//! Inodes and directories, in memory. Every change is an [`Op`] applied by [`apply`] —
//! the same function serves live operations (after the op is journaled) and replay, so a
//! recovered volume is exactly the one that was acknowledged.

mod op;
mod touched;

pub use op::{apply, DataOp, Freed, NamespaceOp, Op};
pub(crate) use touched::Touched;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use crate::map::{FileMap, RangeLock};

/// Longest name in a directory, in bytes (POSIX NAME_MAX).
pub const MAX_NAME_BYTES: usize = 255;
/// Longest symbolic link target, in bytes (PATH_MAX).
pub const MAX_SYMLINK_BYTES: usize = 4096;
/// Longest extended attribute name.
pub const XATTR_NAME_MAX: usize = 255;
/// Largest extended attribute value: one journal record must hold it even on the smallest
/// fast tier (64 KiB of journal).
pub const XATTR_VALUE_MAX: usize = 16 * 1024;
/// Most bytes of names plus values one inode may hold.
pub const XATTR_TOTAL_MAX: usize = 64 * 1024;

/// An inode number. 1 is the root directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ino(pub u64);

impl Ino {
    pub const ROOT: Ino = Ino(1);
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileKind {
    File = 1,
    Dir = 2,
    Symlink = 3,
    Fifo = 4,
    Socket = 5,
    CharDevice = 6,
    BlockDevice = 7,
}

impl FileKind {
    pub fn from_code(code: u8) -> Option<FileKind> {
        Some(match code {
            1 => FileKind::File,
            2 => FileKind::Dir,
            3 => FileKind::Symlink,
            4 => FileKind::Fifo,
            5 => FileKind::Socket,
            6 => FileKind::CharDevice,
            7 => FileKind::BlockDevice,
            _ => return None,
        })
    }
}

/// Nanoseconds since the Unix epoch.
pub type TimeNs = i64;

pub fn now_ns() -> TimeNs {
    let d = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

/// What `stat` reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attr {
    pub ino: Ino,
    pub kind: FileKind,
    /// Permission bits (mode & 0o7777).
    pub perm: u16,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    pub size: u64,
    pub rdev: u32,
    pub atime: TimeNs,
    pub mtime: TimeNs,
    pub ctime: TimeNs,
}

/// The mutable, non-map part of an inode.
#[derive(Clone, Debug)]
pub struct InodeData {
    pub attr: Attr,
    /// Directory entries (directories only), ordered so readdir offsets are stable.
    pub entries: BTreeMap<Vec<u8>, Ino>,
    /// The parent directory (directories only).
    pub parent: Ino,
    /// Symlink target (symlinks only).
    pub target: Vec<u8>,
    /// Extended attributes, name → value.
    pub xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
}

pub struct Inode {
    pub ino: Ino,
    pub kind: FileKind,
    pub data: Mutex<InodeData>,
    pub map: Mutex<FileMap>,
    pub range: RangeLock,
    /// Open handles (live only): an unlinked file keeps its data until the last closes.
    pub opens: AtomicU32,
    /// What the application asked of this object since the volume opened (live only).
    pub io: ObjectIo,
    /// Created in the volume's scratch directory and named nowhere else (live only):
    /// a crash may lose any change to it (see `Volume::set_scratch_dir`).
    pub scratch: AtomicBool,
    /// Its SSD blocks may hold bytes past EOF that a crash cut off (a volume whose residue
    /// is volatile, opened after a crash: a merge wrote them, the crash kept a smaller
    /// size). The first change that grows the file clears them (live only).
    pub stale_tail: AtomicBool,
    /// Holds an SSD block overwritten in place that no flush has covered yet (profiles
    /// durable on sync): the file's next fsync flushes the SSD (live only).
    pub unflushed_overwrite: AtomicBool,
}

/// Per-object IO counters: what a personality's callers read and wrote.
#[derive(Debug, Default)]
pub struct ObjectIo {
    pub writes: AtomicU64,
    pub write_bytes: AtomicU64,
    pub reads: AtomicU64,
    pub read_bytes: AtomicU64,
}

impl ObjectIo {
    pub fn wrote(&self, bytes: u64) {
        self.writes.fetch_add(1, Ordering::Relaxed);
        self.write_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    pub fn read(&self, bytes: u64) {
        self.reads.fetch_add(1, Ordering::Relaxed);
        self.read_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// (writes, bytes written, reads, bytes read).
    pub fn snapshot(&self) -> (u64, u64, u64, u64) {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        (get(&self.writes), get(&self.write_bytes), get(&self.reads), get(&self.read_bytes))
    }
}

impl Inode {
    pub fn new(data: InodeData, map: FileMap) -> Inode {
        Inode {
            ino: data.attr.ino,
            kind: data.attr.kind,
            data: Mutex::new(data),
            map: Mutex::new(map),
            range: RangeLock::default(),
            opens: AtomicU32::new(0),
            io: ObjectIo::default(),
            scratch: AtomicBool::new(false),
            stale_tail: AtomicBool::new(false),
            unflushed_overwrite: AtomicBool::new(false),
        }
    }

    pub fn attr(&self) -> Attr {
        self.data.lock().attr.clone()
    }

    pub fn size(&self) -> u64 {
        self.data.lock().attr.size
    }
}

/// Every inode of the volume.
#[derive(Default)]
pub struct MetaState {
    pub inodes: RwLock<HashMap<Ino, Arc<Inode>>>,
    pub next_ino: AtomicU64,
}

impl MetaState {
    pub fn get(&self, ino: Ino) -> Option<Arc<Inode>> {
        self.inodes.read().get(&ino).cloned()
    }

    /// The inode `name` names in directory `dir`, if both exist.
    pub fn child(&self, dir: Ino, name: &[u8]) -> Option<Ino> {
        self.get(dir).and_then(|d| d.data.lock().entries.get(name).copied())
    }

    pub fn insert(&self, inode: Inode) {
        let ino = inode.ino;
        self.next_ino.fetch_max(ino.0 + 1, Ordering::SeqCst);
        let previous = self.inodes.write().insert(ino, Arc::new(inode));
        debug_assert!(previous.is_none(), "inode {} created twice", ino.0);
    }

    /// A fresh volume: the root directory only.
    pub fn fresh(uid: u32, gid: u32, now: TimeNs) -> MetaState {
        let state = MetaState { inodes: RwLock::default(), next_ino: AtomicU64::new(2) };
        let attr = Attr {
            ino: Ino::ROOT,
            kind: FileKind::Dir,
            perm: 0o755,
            uid,
            gid,
            nlink: 2,
            size: 0,
            rdev: 0,
            atime: now,
            mtime: now,
            ctime: now,
        };
        let data = InodeData { attr, entries: BTreeMap::new(), parent: Ino::ROOT, target: Vec::new(), xattrs: BTreeMap::new() };
        state.insert(Inode::new(data, FileMap::new()));
        state
    }

    /// All inodes, sorted by number (checkpoints and scans).
    pub fn snapshot(&self) -> Vec<Arc<Inode>> {
        let mut all: Vec<_> = self.inodes.read().values().cloned().collect();
        all.sort_by_key(|i| i.ino);
        all
    }
}
