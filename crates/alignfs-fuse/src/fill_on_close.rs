//! After the last close of a file written through the mount, put what was written into the
//! kernel's page cache (`FUSE_NOTIFY_STORE`), as a kernel file system's writes leave their
//! data there. Under `--cache reads` writes bypass the cache, so without this a file's
//! first reads after it was written (RocksDB's tables) are all FUSE round trips.
//!
//! A store is safe only while nothing else can put bytes in those pages, so a fill runs
//! only while the file has no open at all: no write can arrive, no shared mapping can
//! dirty a page (a mapping holds its open), and no READ holds a page locked (a READ needs
//! an open), so a store never waits for a request thread. Opens and truncates that arrive
//! while a fill runs wait for it; that is what keeps it alone. A read-only open waits for
//! the whole fill, which it will read; an open that can write, or a truncate, waits only
//! for the chunk being stored and stops the rest. A fill still queued when the file is
//! opened again is run by a read-only open before it is answered (the open is then the
//! only one, and not yet usable), and dropped by an open that can write.

use std::collections::HashMap;
use std::sync::mpsc::{channel, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;

use alignfs::meta::Ino;
use alignfs::volume::Volume;
use fuser::INodeNo;
use parking_lot::{Condvar, Mutex, MutexGuard};

use crate::page_cache::Coherence;

/// Bytes read from the engine and stored in one notification.
const CHUNK: u64 = 1 << 20;
const PAGE: u64 = 4096;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum FillState {
    #[default]
    None,
    /// Waiting for the fill thread, or for the next open to take it.
    Queued { id: u64, start: u64, end: u64 },
    /// Storing: opens and truncates of the file wait; `cut_short` asks it to stop after
    /// the chunk being stored.
    Running { cut_short: bool },
}

/// What the mount knows about one file's opens and unfilled writes.
#[derive(Default)]
struct FileState {
    opens: u32,
    /// The span written since the file was last closed by every open.
    written: Option<(u64, u64)>,
    fill: FillState,
}

impl FileState {
    fn idle(&self) -> bool {
        self.opens == 0 && self.written.is_none() && self.fill == FillState::None
    }
}

#[derive(Default)]
struct Files {
    by_ino: HashMap<u64, FileState>,
    /// Numbers fills, so that the fill thread runs only the one it was sent.
    fills_queued: u64,
}

impl Files {
    fn forget_if_idle(&mut self, ino: u64) {
        if self.by_ino.get(&ino).is_some_and(FileState::idle) {
            self.by_ino.remove(&ino);
        }
    }

    fn filling(&self, ino: u64) -> bool {
        self.by_ino.get(&ino).is_some_and(|s| matches!(s.fill, FillState::Running { .. }))
    }

    /// A running fill of `ino` stops after its current chunk: what is about to change the
    /// file would make the rest useless, and should not wait for it.
    fn cut_short(&mut self, ino: u64) {
        if let Some(FileState { fill: FillState::Running { cut_short }, .. }) = self.by_ino.get_mut(&ino) {
            *cut_short = true;
        }
    }

    fn cut_short_asked(&self, ino: u64) -> bool {
        self.by_ino.get(&ino).is_some_and(|s| s.fill == FillState::Running { cut_short: true })
    }

    /// An open arrives (no fill running): the span a read-only open must fill first, the
    /// state then `Running`.
    fn open(&mut self, ino: u64, writable: bool) -> Option<(u64, u64)> {
        let state = self.by_ino.entry(ino).or_default();
        let take = match std::mem::replace(&mut state.fill, FillState::None) {
            FillState::Queued { start, end, .. } if !writable && state.opens == 0 => Some((start, end)),
            _ => None,
        };
        state.opens += 1;
        if take.is_some() {
            state.fill = FillState::Running { cut_short: false };
        }
        take
    }

    /// A truncate or fallocate arrives (no fill running): a queued fill is stale.
    fn change(&mut self, ino: u64) {
        if let Some(state) = self.by_ino.get_mut(&ino) {
            state.fill = FillState::None;
        }
        self.forget_if_idle(ino);
    }

    fn wrote(&mut self, ino: u64, offset: u64, end: u64) {
        let state = self.by_ino.entry(ino).or_default();
        state.written = Some(state.written.map_or((offset, end), |(s, e)| (s.min(offset), e.max(end))));
    }

    /// An open is released: after the last one, the number of the fill to queue.
    fn close(&mut self, ino: u64, limit: u64) -> Option<u64> {
        let state = self.by_ino.get_mut(&ino)?;
        state.opens = state.opens.saturating_sub(1);
        let mut queued = None;
        if state.opens == 0 {
            if let Some((start, end)) = state.written.take() {
                if end - start <= limit {
                    self.fills_queued += 1;
                    let id = self.fills_queued;
                    state.fill = FillState::Queued { id, start, end };
                    queued = Some(id);
                }
            }
        }
        self.forget_if_idle(ino);
        queued
    }

    /// The fill thread takes fill `id`: its span, unless an open took or dropped it.
    fn start(&mut self, ino: u64, id: u64) -> Option<(u64, u64)> {
        let state = self.by_ino.get_mut(&ino)?;
        match state.fill {
            FillState::Queued { id: queued, start, end } if queued == id && state.opens == 0 => {
                state.fill = FillState::Running { cut_short: false };
                Some((start, end))
            }
            _ => None,
        }
    }

    fn finish(&mut self, ino: u64) {
        if let Some(state) = self.by_ino.get_mut(&ino) {
            state.fill = FillState::None;
        }
        self.forget_if_idle(ino);
    }
}

struct Filler {
    files: Mutex<Files>,
    fill_done: Condvar,
    volume: Arc<Volume>,
    coherence: Coherence,
}

/// Fills the kernel's page cache with files written through the mount once they are
/// closed (`alignfs mount --fill-on-close`).
pub struct FillOnClose {
    filler: Option<Arc<Filler>>,
    /// The largest span one fill stores; a file written over more is left alone.
    limit: u64,
    queue: Option<Sender<(u64, u64)>>,
    thread: Option<JoinHandle<()>>,
}

impl FillOnClose {
    /// Off: nothing is tracked and nothing stored.
    pub fn off() -> FillOnClose {
        FillOnClose { filler: None, limit: 0, queue: None, thread: None }
    }

    /// Fills of at most `limit` bytes per file (0: off), read from `volume` and stored
    /// through the notifier `coherence` is attached to, on a thread of their own.
    pub fn start(limit: u64, volume: Arc<Volume>, coherence: Coherence) -> std::io::Result<FillOnClose> {
        if limit == 0 {
            return Ok(FillOnClose::off());
        }
        let filler = Arc::new(Filler { files: Mutex::default(), fill_done: Condvar::new(), volume, coherence });
        let (queue, receiver) = channel::<(u64, u64)>();
        let worker = Arc::clone(&filler);
        let thread = std::thread::Builder::new().name("alignfs-fill".into()).spawn(move || {
            for (ino, id) in receiver {
                let span = worker.files.lock().start(ino, id);
                if let Some((start, end)) = span {
                    worker.fill(ino, start, end);
                }
            }
        })?;
        Ok(FillOnClose { filler: Some(filler), limit, queue: Some(queue), thread: Some(thread) })
    }

    /// An open of `ino` is being served; `writable` if it can write. A read-only open waits
    /// for a running fill, and runs a queued one first; an open that can write cuts a
    /// running fill short (waiting for its current chunk) and drops a queued one. Pair
    /// with [`FillOnClose::closed`], also when the open fails.
    pub fn opening(&self, ino: u64, writable: bool) {
        let Some(filler) = &self.filler else { return };
        let mut files = filler.files.lock();
        if writable {
            files.cut_short(ino);
        }
        filler.wait_for_fill(&mut files, ino);
        if let Some((start, end)) = files.open(ino, writable) {
            drop(files);
            filler.fill(ino, start, end);
        }
    }

    /// The file's size or holes are about to change other than by a write (truncate,
    /// fallocate): cuts a running fill short and drops a queued one.
    pub fn changing(&self, ino: u64) {
        let Some(filler) = &self.filler else { return };
        let mut files = filler.files.lock();
        files.cut_short(ino);
        filler.wait_for_fill(&mut files, ino);
        files.change(ino);
    }

    /// `len` bytes at `offset` of `ino` were written.
    pub fn wrote(&self, ino: u64, offset: u64, len: u64) {
        let Some(filler) = &self.filler else { return };
        if len > 0 {
            filler.files.lock().wrote(ino, offset, offset.saturating_add(len));
        }
    }

    /// An open of `ino` was released: after the last one, queue a fill of what was written.
    pub fn closed(&self, ino: u64) {
        let (Some(filler), Some(queue)) = (&self.filler, &self.queue) else { return };
        let mut files = filler.files.lock();
        if let Some(id) = files.close(ino, self.limit) {
            if queue.send((ino, id)).is_err() {
                files.finish(ino);
            }
        }
    }

    /// For the status report: ` (filled on close up to 64 MiB)`, or nothing when off.
    pub fn describe(&self) -> String {
        if self.filler.is_none() {
            return String::new();
        }
        let limit = self.limit;
        if limit % (1 << 20) == 0 {
            format!(" (filled on close up to {} MiB)", limit >> 20)
        } else {
            format!(" (filled on close up to {limit} bytes)")
        }
    }

    /// Stop the fill thread (before the volume closes).
    pub fn stop(&mut self) {
        self.queue = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        self.filler = None;
    }
}

impl Drop for FillOnClose {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Filler {
    fn wait_for_fill(&self, files: &mut MutexGuard<'_, Files>, ino: u64) {
        while files.filling(ino) {
            self.fill_done.wait(files);
        }
    }

    /// Store `start..end` of `ino` (the file's state is `Running`), then let waiting opens in.
    fn fill(&self, ino: u64, start: u64, end: u64) {
        if let Err(e) = self.store(ino, start, end) {
            // ENOENT: the kernel has forgotten the inode, and so holds no pages of it.
            if e.raw_os_error() != Some(libc::ENOENT) {
                tracing::warn!("filling the page cache of inode {ino} after its last close: {e}");
            }
        }
        self.files.lock().finish(ino);
        self.fill_done.notify_all();
    }

    fn store(&self, ino: u64, start: u64, end: u64) -> std::io::Result<()> {
        let Some(notifier) = self.coherence.notifier() else { return Ok(()) };
        // A file removed meanwhile has nothing to fill.
        let Ok(attr) = self.volume.getattr(Ino(ino)) else { return Ok(()) };
        let size = attr.size;
        // Whole pages, and the last one up to the end of the file: the kernel keeps only
        // pages it can mark up to date.
        let end = end.div_ceil(PAGE).saturating_mul(PAGE).min(size);
        let mut at = start / PAGE * PAGE;
        // Later direct writes must drop what is stored (docs/FUSE.md, "Page cache").
        self.coherence.cached(ino);
        let mut buf = vec![0u8; end.saturating_sub(at).min(CHUNK) as usize];
        while at < end {
            let want = (end - at).min(CHUNK) as usize;
            match self.volume.read_for_page_cache(Ino(ino), at, &mut buf[..want]) {
                Ok(0) | Err(_) => return Ok(()),
                Ok(n) => {
                    notifier.store(INodeNo(ino), at, &buf[..n])?;
                    at += n as u64;
                }
            }
            if self.files.lock().cut_short_asked(ino) {
                return Ok(());
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMIT: u64 = 1 << 20;

    #[test]
    fn a_fill_is_queued_after_the_last_close_of_a_written_file_only() {
        let mut files = Files::default();
        assert_eq!(files.open(5, true), None);
        assert_eq!(files.open(5, false), None);
        files.wrote(5, 8192, 8292);
        files.wrote(5, 0, 10);
        assert_eq!(files.close(5, LIMIT), None, "another open remains");
        let id = files.close(5, LIMIT).expect("queued at the last close");
        assert_eq!(files.start(5, id), Some((0, 8292)));
        files.finish(5);
        assert!(files.by_ino.is_empty(), "state is dropped once the file is closed and filled");
        // Opened and closed without a write: nothing to fill.
        files.open(6, true);
        assert_eq!(files.close(6, LIMIT), None);
        // Written over more than the limit: left alone.
        files.open(7, true);
        files.wrote(7, 0, LIMIT + 1);
        assert_eq!(files.close(7, LIMIT), None);
        assert!(files.by_ino.is_empty());
    }

    #[test]
    fn the_next_open_takes_a_queued_fill_if_it_only_reads_and_drops_it_if_it_can_write() {
        let mut files = Files::default();
        files.open(5, true);
        files.wrote(5, 0, 4096);
        let id = files.close(5, LIMIT).unwrap();
        assert_eq!(files.open(5, false), Some((0, 4096)), "a read-only open fills before it is answered");
        assert!(files.filling(5), "other opens wait meanwhile");
        assert_eq!(files.start(5, id), None, "the fill thread finds it taken");
        files.finish(5);
        assert!(!files.filling(5));
        files.close(5, LIMIT);

        files.open(5, true);
        files.wrote(5, 0, 4096);
        let id = files.close(5, LIMIT).unwrap();
        assert_eq!(files.open(5, true), None, "an open that can write drops it");
        assert_eq!(files.start(5, id), None);
        files.close(5, LIMIT);
        assert!(files.by_ino.is_empty());
    }

    #[test]
    fn an_open_that_can_write_or_a_truncate_cuts_a_running_fill_short() {
        let mut files = Files::default();
        files.open(5, true);
        files.wrote(5, 0, 4 * CHUNK);
        let id = files.close(5, 8 * CHUNK).unwrap();
        assert_eq!(files.start(5, id), Some((0, 4 * CHUNK)));
        assert!(!files.cut_short_asked(5));
        files.cut_short(5);
        assert!(files.cut_short_asked(5) && files.filling(5), "it still runs until its chunk is stored");
        files.finish(5);
        assert!(!files.filling(5) && !files.cut_short_asked(5));
        files.cut_short(5);
        assert!(!files.cut_short_asked(5), "nothing runs, nothing to cut");
    }

    #[test]
    fn a_truncate_or_a_later_close_makes_a_queued_fill_stale() {
        let mut files = Files::default();
        files.open(5, true);
        files.wrote(5, 0, 4096);
        let id = files.close(5, LIMIT).unwrap();
        files.change(5);
        assert_eq!(files.start(5, id), None);

        files.open(5, true);
        files.wrote(5, 0, 4096);
        let first = files.close(5, LIMIT).unwrap();
        files.open(5, true);
        files.wrote(5, 0, 100);
        let second = files.close(5, LIMIT).unwrap();
        assert_eq!(files.start(5, first), None, "only the newest fill runs");
        assert_eq!(files.start(5, second), Some((0, 100)));
    }
}
