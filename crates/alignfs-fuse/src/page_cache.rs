//! Which opens read through the kernel's page cache, and how a write that bypasses it keeps
//! what it caches current. The rule and its proof are in docs/FUSE.md ("Page cache").

use std::collections::HashSet;
use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, OnceLock};

use fuser::{FopenFlags, INodeNo, Notifier, ReplyWrite};
use parking_lot::Mutex;

/// How opened files use the kernel page cache (`alignfs mount --cache`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheMode {
    /// Every open bypasses the page cache (FOPEN_DIRECT_IO).
    Direct,
    /// Read-only opens read through the page cache; opens that can write bypass it, so
    /// every write reaches the engine with its own offset and length.
    Reads,
    /// Every open uses the page cache and writes go through it to the engine
    /// (write-through: one copy more per write, and one writer per file at a time).
    All,
}

impl CacheMode {
    pub const NAMES: [&'static str; 3] = ["direct", "reads", "all"];

    /// Whether an open with these `open(2)` flags reads through the page cache.
    pub fn caches(self, open_flags: i32) -> bool {
        match self {
            CacheMode::Direct => false,
            CacheMode::Reads => open_flags & libc::O_ACCMODE == libc::O_RDONLY,
            CacheMode::All => true,
        }
    }

    /// What the reply to an open with these `open(2)` flags tells the kernel.
    pub fn fopen_flags(self, open_flags: i32) -> FopenFlags {
        // Cached pages stay valid across opens: every change comes through this mount,
        // and [`Coherence`] drops what a bypassing write makes stale.
        let mut flags = FopenFlags::FOPEN_KEEP_CACHE;
        if !self.caches(open_flags) {
            // The engine's per-file range lock orders overlapping writes, so the kernel need
            // not hold the inode lock across a whole direct write: writers of one file run
            // in parallel (the kernel still serializes writes that extend the file, and all
            // writes while a cached open of the file exists).
            flags |= FopenFlags::FOPEN_DIRECT_IO | FopenFlags::FOPEN_PARALLEL_DIRECT_WRITES;
        }
        flags
    }

    /// Whether some opens bypass the page cache, so that their writes need [`Coherence`]
    /// and their shared mappings need `FUSE_DIRECT_IO_ALLOW_MMAP`.
    pub fn has_direct_opens(self) -> bool {
        self != CacheMode::All
    }
}

impl FromStr for CacheMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "direct" => Ok(CacheMode::Direct),
            "reads" => Ok(CacheMode::Reads),
            "all" => Ok(CacheMode::All),
            _ => Err(format!("unknown cache mode {s:?}: one of {}", CacheMode::NAMES.join(", "))),
        }
    }
}

impl fmt::Display for CacheMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CacheMode::Direct => "direct",
            CacheMode::Reads => "reads",
            CacheMode::All => "all",
        })
    }
}

/// The kernel fills its page cache in whole pages; 4 KiB divides every page size Linux has.
const PAGE: u64 = 4096;

/// Keeps the kernel's cached pages of a file current when a write bypasses them.
///
/// The kernel drops the cached pages a direct write covers *before* it sends the write. A
/// reader (a cached open, or a mapping of any open) that misses in between refills the page
/// from the engine, which does not have the write yet, and would keep the old bytes cached
/// after the write returns. Every refill reaches the daemon as a page-aligned READ, so an
/// inode that has had one gets the written range invalidated once more after the engine has
/// applied the write and before it is acknowledged. A refill whose READ began before that
/// holds its page locked until it is answered, so the invalidation waits for it and then
/// removes it.
///
/// Invalidating can wait for a READ, which needs a free request thread. At most
/// `threads - 1` request threads invalidate at once; the rest hand the invalidation, and
/// the reply, to a thread of its own.
///
/// Over io_uring the daemon leaves it to the kernel, which drops a direct write's pages
/// again after the write (6.18, checked; docs/FUSE.md). A reply can only leave through its
/// request's ring entry, whose thread would have to wait for a handed-off invalidation
/// while the READ it waits for may be queued behind that very entry.
#[derive(Clone)]
pub struct Coherence {
    inner: Arc<Inner>,
}

struct Inner {
    enabled: bool,
    notifier: OnceLock<Notifier>,
    /// Requests come through io_uring: the kernel alone keeps the cache coherent.
    kernel_only: AtomicBool,
    /// Inodes that had a page-aligned READ: the kernel may hold pages of them.
    filled: Mutex<HashSet<u64>>,
    /// Request threads that may still invalidate themselves.
    inline_permits: AtomicUsize,
    handoff: Mutex<Option<Sender<Pending>>>,
}

struct Pending {
    ino: u64,
    offset: u64,
    written: u32,
    reply: ReplyWrite,
}

impl Coherence {
    /// For a mount in `mode` served by `threads` request threads. Inactive until
    /// [`Coherence::attach`] gives it the session's notifier.
    pub fn new(mode: CacheMode, threads: usize) -> Coherence {
        Coherence {
            inner: Arc::new(Inner {
                enabled: mode.has_direct_opens(),
                notifier: OnceLock::new(),
                kernel_only: AtomicBool::new(false),
                filled: Mutex::new(HashSet::new()),
                inline_permits: AtomicUsize::new(threads.saturating_sub(1)),
                handoff: Mutex::new(None),
            }),
        }
    }

    /// Start keeping the page cache coherent through the mounted session's notifier;
    /// `io_uring` tells whether its requests come through io_uring.
    pub fn attach(&self, notifier: Notifier, io_uring: bool) {
        self.inner.kernel_only.store(io_uring, Ordering::Release);
        let _ = self.inner.notifier.set(notifier);
    }

    /// The session's notifier, once mounted.
    pub fn notifier(&self) -> Option<&Notifier> {
        self.inner.notifier.get()
    }

    /// The kernel may hold pages of `ino` from now on: it sent a page-aligned READ, or the
    /// daemon stored pages itself (`FUSE_NOTIFY_STORE`).
    pub fn cached(&self, ino: u64) {
        if self.inner.enabled {
            self.inner.filled.lock().insert(ino);
        }
    }

    /// Called before the engine serves a READ.
    pub fn reading(&self, ino: u64, offset: u64, size: u32) {
        if offset % PAGE == 0 && u64::from(size) % PAGE == 0 {
            self.cached(ino);
        }
    }

    /// Acknowledge a write the engine has applied: `written` bytes at `offset`.
    /// `from_page_cache` marks a write-back of the kernel's own pages (FUSE_WRITE_CACHE):
    /// those pages are the new bytes, and they stay under write-back until this reply, so
    /// invalidating them would wait for itself.
    pub fn written(&self, ino: u64, offset: u64, written: u32, from_page_cache: bool, reply: ReplyWrite) {
        let inner = &self.inner;
        let Some(notifier) = inner.notifier.get() else {
            return reply.written(written);
        };
        if !inner.enabled
            || inner.kernel_only.load(Ordering::Acquire)
            || from_page_cache
            || written == 0
            || !inner.filled.lock().contains(&ino)
        {
            return reply.written(written);
        }
        let permit = inner.inline_permits.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1)).is_ok();
        if permit {
            invalidate(notifier, ino, offset, written);
            inner.inline_permits.fetch_add(1, Ordering::AcqRel);
            reply.written(written);
        } else {
            self.hand_off(Pending { ino, offset, written, reply });
        }
    }

    /// Make the kernel drop its cached attributes of `ino` (not its pages), so that the next
    /// stat fetches them. Never waits for a page lock, so any request thread may call it.
    pub fn attributes_changed(&self, ino: u64) {
        if let Some(notifier) = self.inner.notifier.get() {
            if let Err(e) = notifier.inval_inode(INodeNo(ino), -1, 0) {
                if e.raw_os_error() != Some(libc::ENOENT) {
                    tracing::warn!("invalidating cached attributes of inode {ino}: {e}");
                }
            }
        }
    }

    fn hand_off(&self, pending: Pending) {
        let mut handoff = self.inner.handoff.lock();
        let sender = handoff.get_or_insert_with(|| {
            let (sender, receiver) = channel::<Pending>();
            let inner = Arc::clone(&self.inner);
            let spawned = std::thread::Builder::new().name("alignfs-inval".into()).spawn(move || {
                for p in receiver {
                    if let Some(notifier) = inner.notifier.get() {
                        invalidate(notifier, p.ino, p.offset, p.written);
                    }
                    p.reply.written(p.written);
                }
            });
            if let Err(e) = spawned {
                tracing::error!("cannot start the page-cache invalidation thread: {e}");
            }
            sender
        });
        if let Err(failed) = sender.send(pending) {
            // No thread to hand to: invalidate here, at the risk of waiting longer.
            let p = failed.0;
            if let Some(notifier) = self.inner.notifier.get() {
                invalidate(notifier, p.ino, p.offset, p.written);
            }
            p.reply.written(p.written);
        }
    }
}

fn invalidate(notifier: &Notifier, ino: u64, offset: u64, len: u32) {
    let (Ok(offset), len) = (i64::try_from(offset), i64::from(len)) else { return };
    // ENOENT means the kernel holds no inode, and so no pages, for it.
    if let Err(e) = notifier.inval_inode(INodeNo(ino), offset, len) {
        if e.raw_os_error() != Some(libc::ENOENT) {
            tracing::warn!("invalidating cached pages of inode {ino} after a write: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_mode_caches_read_only_opens_and_bypasses_for_writable_ones() {
        let reads = CacheMode::Reads;
        assert!(reads.caches(libc::O_RDONLY));
        assert!(reads.caches(libc::O_RDONLY | libc::O_NOATIME));
        assert!(!reads.caches(libc::O_WRONLY));
        assert!(!reads.caches(libc::O_RDWR | libc::O_APPEND));
        assert!(reads.fopen_flags(libc::O_RDWR).contains(FopenFlags::FOPEN_DIRECT_IO));
        assert!(!reads.fopen_flags(libc::O_RDONLY).contains(FopenFlags::FOPEN_DIRECT_IO));
        assert!(CacheMode::Direct.fopen_flags(libc::O_RDONLY).contains(FopenFlags::FOPEN_DIRECT_IO));
        assert!(!CacheMode::All.fopen_flags(libc::O_RDWR).contains(FopenFlags::FOPEN_DIRECT_IO));
        for flags in [CacheMode::Direct.fopen_flags(0), CacheMode::Reads.fopen_flags(0), CacheMode::All.fopen_flags(0)] {
            assert!(flags.contains(FopenFlags::FOPEN_KEEP_CACHE));
        }
    }

    #[test]
    fn cache_modes_parse_and_print_their_names() {
        for name in CacheMode::NAMES {
            assert_eq!(name.parse::<CacheMode>().map(|m| m.to_string()).as_deref(), Ok(name));
        }
        let err = "page".parse::<CacheMode>().err().unwrap_or_default();
        assert!(err.contains("direct, reads, all"), "{err}");
    }

    #[test]
    fn only_page_aligned_reads_mark_an_inode_as_cached() {
        let c = Coherence::new(CacheMode::Reads, 4);
        c.reading(7, 4096, 100);
        c.reading(8, 100, 4096);
        assert!(c.inner.filled.lock().is_empty());
        c.reading(9, 8192, 65536);
        assert!(c.inner.filled.lock().contains(&9));
        let all = Coherence::new(CacheMode::All, 4);
        all.reading(9, 0, 4096);
        assert!(all.inner.filled.lock().is_empty(), "write-through mounts are coherent in the kernel");
    }
}
