//! Power-loss simulation (DESIGN.md §8).
//!
//! `kill -9` keeps every store the daemon made, so it cannot show what a power cut does:
//! drop fast-tier stores that were never persisted (or keep some of them: caches write
//! lines back whenever they like) and drop SSD writes still in the device's volatile cache.
//! In this mode the fast tier ([`PmemRegion::recorded`](super::PmemRegion::recorded)) and
//! the SSD ([`RecordedSsd`]) append every store, persist, write and flush to one
//! [`PowerLog`], in the order they happened. [`Replay`] walks that log and, at any point,
//! builds a crash image: what the media could hold had the power failed there.
//!
//! The model, per medium:
//! - fast tier: `persist` writes back the 64-byte lines it covers and fences. A store not
//!   yet written back may or may not have reached the media, independently per aligned
//!   8-byte word (the largest store the media is assumed to keep atomic);
//! - SSD: a completed write sits in the volatile cache until the next flush. At a power
//!   cut each of its 4 KiB sectors may or may not have reached the flash, independently
//!   (the device reorders freely within a flush epoch);
//! - a KV store's directory (`nvstore`): the store records a [`DirSnapshot`] each time one
//!   of its syncs returns, and the log takes one of the files as written (not synced) at
//!   every other persistence point ([`PowerLog::kv_written_at`]). A power cut keeps the
//!   last sync's; of the bytes the store had written to its files since then, when the
//!   power failed, some may have reached the disk: a prefix
//!   ([`DirSnapshot::torn_toward`]), or any of their sectors
//!   ([`DirSnapshot::torn_by_sectors`]). Never bytes written after the cut: an image that
//!   holds a record the engine wrote only after an SSD flush would blame the engine for an
//!   order it kept. What the KV store does inside a sync (its own flushes and compactions)
//!   is its business: the images test the engine's ordering around the syncs, not the
//!   store's.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;

use super::{BlockDevice, IoOp, IoRequest, IoTicket};
use crate::error::{Error, Result};
use crate::geometry::IO_ALIGN;

const WORD: u64 = 8;
const LINE: u64 = 64;

/// One recorded event.
#[derive(Clone, Debug)]
pub enum Event {
    FastStore {
        offset: u64,
        bytes: Vec<u8>,
    },
    FastPersist {
        offset: u64,
        len: u64,
    },
    SsdWrite {
        offset: u64,
        bytes: Vec<u8>,
    },
    SsdFlush,
    /// A KV store's sync returned; its directory as it then was.
    KvSync(Arc<DirSnapshot>),
}

impl Event {
    /// Whether a power cut just before this event can differ from one just after the
    /// previous persistence point: these are the points worth crashing at.
    pub fn is_persistence_point(&self) -> bool {
        matches!(self, Event::FastPersist { .. } | Event::SsdFlush | Event::KvSync(_))
    }
}

/// The shared, ordered record of both devices' events.
#[derive(Default)]
pub struct PowerLog {
    events: Mutex<Vec<Event>>,
    /// The KV store's directory, once one records into this log.
    kv_dir: Mutex<Option<PathBuf>>,
    /// The KV store's files as written when each persistence point other than a sync was
    /// recorded, by the event's position.
    kv_written: Mutex<BTreeMap<usize, Arc<DirSnapshot>>>,
}

impl PowerLog {
    pub fn new() -> Arc<PowerLog> {
        Arc::new(PowerLog::default())
    }

    /// Record `event`. At a persistence point, with a KV directory attached, also take
    /// the directory as written so far: all that a power cut just before this event can
    /// find there. A directory that cannot be read records nothing more (the images then
    /// tear toward the next sync, as before any was taken).
    pub(crate) fn record(&self, event: Event) {
        let mut events = self.events.lock();
        if event.is_persistence_point() && !matches!(event, Event::KvSync(_)) {
            let dir = self.kv_dir.lock().clone();
            if let Some(Ok(written)) = dir.map(|dir| DirSnapshot::take(&dir)) {
                self.kv_written.lock().insert(events.len(), Arc::new(written));
            }
        }
        events.push(event);
    }

    /// The KV store's files as written when the event at `position` was recorded: what a
    /// power cut just before that event may find there, at most. `None` for a position
    /// that is not a persistence point, or before a KV store was attached.
    pub fn kv_written_at(&self, position: usize) -> Option<Arc<DirSnapshot>> {
        if let Some(Event::KvSync(snapshot)) = self.events.lock().get(position) {
            return Some(Arc::clone(snapshot));
        }
        self.kv_written.lock().get(&position).cloned()
    }

    /// Events so far; a test notes this after each acknowledged operation.
    pub fn position(&self) -> usize {
        self.events.lock().len()
    }

    /// A copy of every event so far.
    pub fn events(&self) -> Vec<Event> {
        self.events.lock().clone()
    }
}

/// A block device whose completed writes and flushes are recorded in a [`PowerLog`].
pub struct RecordedSsd {
    inner: Arc<dyn BlockDevice>,
    log: Arc<PowerLog>,
}

impl RecordedSsd {
    pub fn new(inner: Arc<dyn BlockDevice>, log: Arc<PowerLog>) -> RecordedSsd {
        RecordedSsd { inner, log }
    }
}

impl BlockDevice for RecordedSsd {
    fn len_bytes(&self) -> u64 {
        self.inner.len_bytes()
    }

    /// Writes are recorded once the whole batch completed; a batch that failed records
    /// nothing (the failing device decides what landed, and the crash images only model
    /// healthy devices).
    fn submit(&self, batch: Vec<IoRequest>) -> IoTicket {
        let ops: Vec<(IoOp, u64)> = batch.iter().map(|r| (r.op, r.offset_bytes)).collect();
        let (tx, ticket) = IoTicket::channel(batch.len());
        match self.inner.submit(batch).wait() {
            Ok(buffers) => {
                for (index, ((op, offset), buf)) in ops.into_iter().zip(buffers).enumerate() {
                    if op == IoOp::Write {
                        self.log.record(Event::SsdWrite { offset, bytes: buf.to_vec() });
                    }
                    tx.send((index, Ok(buf))).expect("ticket holds the receiver");
                }
            }
            // The ticket reports the first error; dropping the sender ends its wait.
            Err(e) => tx.send((0, Err(e))).expect("ticket holds the receiver"),
        }
        ticket
    }

    fn read_buffered(&self, offset_bytes: u64, buf: &mut [u8]) -> Result<()> {
        self.inner.read_buffered(offset_bytes, buf)
    }

    fn read_cached(&self, offset_bytes: u64, buf: &mut [u8]) -> Result<bool> {
        self.inner.read_cached(offset_bytes, buf)
    }

    fn prefetch(&self, offset_bytes: u64, len: u64) {
        self.inner.prefetch(offset_bytes, len);
    }

    fn flush(&self) -> Result<()> {
        self.inner.flush()?;
        self.log.record(Event::SsdFlush);
        Ok(())
    }

    fn describe(&self) -> String {
        format!("{}, recorded for power-loss simulation", self.inner.describe())
    }
}

/// The files of a directory tree, by path relative to it. A file's trailing zeros are
/// not kept (the KV store preallocates its journal), only its length.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DirSnapshot {
    files: BTreeMap<PathBuf, (u64, Vec<u8>)>,
}

impl DirSnapshot {
    pub fn take(dir: &Path) -> Result<DirSnapshot> {
        let mut snapshot = DirSnapshot::default();
        let mut pending = vec![dir.to_path_buf()];
        while let Some(at) = pending.pop() {
            let entries = std::fs::read_dir(&at).map_err(|e| Error::io(format!("snapshot {}", at.display()), e))?;
            for entry in entries {
                let path = entry.map_err(|e| Error::io(format!("snapshot {}", at.display()), e))?.path();
                if path.is_dir() {
                    pending.push(path);
                    continue;
                }
                let mut bytes = std::fs::read(&path).map_err(|e| Error::io(format!("snapshot {}", path.display()), e))?;
                let len = bytes.len() as u64;
                trim_zeros(&mut bytes);
                let relative = path.strip_prefix(dir).expect("found under dir").to_path_buf();
                snapshot.files.insert(relative, (len, bytes));
            }
        }
        Ok(snapshot)
    }

    /// Write the tree under `dir` (which must not hold it yet).
    pub fn restore(&self, dir: &Path) -> Result<()> {
        for (relative, (len, bytes)) in &self.files {
            let path = dir.join(relative);
            let io = |e| Error::io(format!("restore {}", path.display()), e);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).map_err(io)?;
            }
            std::fs::write(&path, bytes).map_err(io)?;
            std::fs::OpenOptions::new().write(true).open(&path).and_then(|f| f.set_len(*len)).map_err(io)?;
        }
        Ok(())
    }

    /// This snapshot with part of what `next` added. A file `next` extended (the store's
    /// journal, appended to in order) keeps a prefix of the new bytes, cut `fraction` of
    /// the way through them; a file `next` created is there, cut the same way from empty.
    /// A file rewritten otherwise (the store replaces those by renaming a new one over
    /// them) is old or new whole: new from `fraction` 0.5 on. A file `next` removed stays.
    pub fn torn_toward(&self, next: &DirSnapshot, fraction: f64) -> DirSnapshot {
        let fraction = fraction.clamp(0.0, 1.0);
        self.torn(next, |old, new| new[..old.len() + ((new.len() - old.len()) as f64 * fraction) as usize].to_vec(), || fraction >= 0.5)
    }

    /// This snapshot with some of the sectors `next` wrote: a power cut during a sync may
    /// keep any of the 512-byte sectors (by file offset) written since the last one, not
    /// only a prefix. In a file `next` appended to (or created), each sector holding
    /// appended bytes is taken from `next` where `keep()` says so and left as it was
    /// otherwise; a file rewritten otherwise is old or new whole, by one `keep()`. A file
    /// `next` removed stays.
    pub fn torn_by_sectors(&self, next: &DirSnapshot, keep: &mut dyn FnMut() -> bool) -> DirSnapshot {
        const SECTOR: usize = 512;
        // Both closures draw from `keep`.
        let keep = std::cell::RefCell::new(keep);
        let appended = |old: &[u8], new: &[u8]| {
            let mut bytes = new.to_vec();
            for at in (old.len() / SECTOR * SECTOR..new.len()).step_by(SECTOR) {
                if !(keep.borrow_mut())() {
                    let end = (at + SECTOR).min(new.len());
                    // Old bytes up to where the old file ended, zeros after.
                    let old_end = old.len().clamp(at, end);
                    if old_end > at {
                        bytes[at..old_end].copy_from_slice(&old[at..old_end]);
                    }
                    bytes[old_end..end].fill(0);
                }
            }
            bytes
        };
        self.torn(next, appended, || (keep.borrow_mut())())
    }

    /// This snapshot with, for each file `next` changed, what `appended(old, new)` keeps of
    /// a file `next` appended to (or created: `old` empty), or the new file whole where
    /// `rewritten()` says so for one it replaced otherwise.
    fn torn(
        &self,
        next: &DirSnapshot,
        mut appended: impl FnMut(&[u8], &[u8]) -> Vec<u8>,
        mut rewritten: impl FnMut() -> bool,
    ) -> DirSnapshot {
        let mut torn = self.clone();
        for (path, (next_len, new)) in &next.files {
            let (len, old) = self.files.get(path).map_or((0, &[][..]), |(len, bytes)| (*len, bytes.as_slice()));
            if new == old {
                continue;
            }
            let file = if new.starts_with(old) {
                let mut bytes = appended(old, new);
                trim_zeros(&mut bytes);
                (len.max(bytes.len() as u64), bytes)
            } else if rewritten() {
                (*next_len, new.clone())
            } else {
                continue;
            };
            torn.files.insert(path.clone(), file);
        }
        torn
    }

    /// Bytes kept (after trimming).
    pub fn bytes(&self) -> u64 {
        self.files.values().map(|(_, b)| b.len() as u64).sum()
    }
}

/// Drop a file image's trailing zeros (its length is kept apart).
fn trim_zeros(bytes: &mut Vec<u8>) {
    bytes.truncate(bytes.iter().rposition(|&b| b != 0).map_or(0, |last| last + 1));
}

/// Records a [`DirSnapshot`] of a KV store's directory in a [`PowerLog`] after each of
/// the store's syncs.
pub struct RecordedDir {
    dir: PathBuf,
    log: Arc<PowerLog>,
}

impl RecordedDir {
    pub fn new(dir: &Path, log: Arc<PowerLog>) -> RecordedDir {
        *log.kv_dir.lock() = Some(dir.to_path_buf());
        RecordedDir { dir: dir.to_path_buf(), log }
    }

    /// A sync of the store returned.
    pub fn synced(&self) -> Result<()> {
        self.log.record(Event::KvSync(Arc::new(DirSnapshot::take(&self.dir)?)));
        Ok(())
    }
}

/// How much of what was still volatile a crash image keeps.
#[derive(Clone, Copy, Debug)]
pub struct Survival {
    /// Chance that an unpersisted fast-tier word reached the media.
    pub fast_word: f64,
    /// Chance that an unflushed SSD sector reached the flash.
    pub ssd_sector: f64,
}

/// The two devices' contents after a simulated power cut.
pub struct CrashImage {
    pub fast: Vec<u8>,
    pub ssd: Vec<u8>,
    /// The KV store's directory as of its last sync, if one was recorded.
    pub kv: Option<Arc<DirSnapshot>>,
}

/// Walks a [`PowerLog`]'s events from blank devices, keeping what is durable apart from
/// what is still volatile.
pub struct Replay {
    fast_current: Vec<u8>,
    fast_durable: Vec<u8>,
    /// Words stored since they were last written back (their values are in
    /// `fast_current`).
    fast_unpersisted: BTreeSet<u64>,
    ssd_durable: Vec<u8>,
    /// Completed SSD writes since the last flush, in order.
    ssd_cached: Vec<(u64, Vec<u8>)>,
    kv_synced: Option<Arc<DirSnapshot>>,
    position: usize,
}

impl Replay {
    /// Start from zeroed devices of these sizes (what the recorded devices started as).
    pub fn new(fast_bytes: u64, ssd_bytes: u64) -> Replay {
        Replay {
            fast_current: vec![0; fast_bytes as usize],
            fast_durable: vec![0; fast_bytes as usize],
            fast_unpersisted: BTreeSet::new(),
            ssd_durable: vec![0; ssd_bytes as usize],
            ssd_cached: Vec::new(),
            kv_synced: None,
            position: 0,
        }
    }

    /// Events applied so far.
    pub fn position(&self) -> usize {
        self.position
    }

    pub fn apply(&mut self, event: &Event) {
        self.position += 1;
        match event {
            Event::FastStore { offset, bytes } => {
                let start = *offset as usize;
                self.fast_current[start..start + bytes.len()].copy_from_slice(bytes);
                let end = offset + bytes.len() as u64;
                for word in offset / WORD..end.div_ceil(WORD) {
                    self.fast_unpersisted.insert(word);
                }
            }
            Event::FastPersist { offset, len } => {
                if *len == 0 {
                    return;
                }
                let (first, last) = (offset / LINE * LINE, (offset + len).div_ceil(LINE) * LINE);
                let words: Vec<u64> = self.fast_unpersisted.range(first / WORD..last / WORD).copied().collect();
                for word in words {
                    self.write_back(word);
                }
            }
            Event::SsdWrite { offset, bytes } => self.ssd_cached.push((*offset, bytes.clone())),
            Event::SsdFlush => {
                for (offset, bytes) in std::mem::take(&mut self.ssd_cached) {
                    self.ssd_durable[offset as usize..offset as usize + bytes.len()].copy_from_slice(&bytes);
                }
            }
            Event::KvSync(snapshot) => self.kv_synced = Some(Arc::clone(snapshot)),
        }
    }

    fn write_back(&mut self, word: u64) {
        let at = (word * WORD) as usize;
        let end = (at + WORD as usize).min(self.fast_current.len());
        self.fast_durable[at..end].copy_from_slice(&self.fast_current[at..end]);
        self.fast_unpersisted.remove(&word);
    }

    /// Bytes still volatile: unpersisted fast-tier words and unflushed SSD writes.
    pub fn volatile_bytes(&self) -> (u64, u64) {
        (self.fast_unpersisted.len() as u64 * WORD, self.ssd_cached.iter().map(|(_, b)| b.len() as u64).sum())
    }

    /// A crash image at the current position. `coin(p)` answers "did this survive?" with
    /// probability `p`; tests pass a seeded generator.
    pub fn image(&self, survival: Survival, coin: &mut dyn FnMut(f64) -> bool) -> CrashImage {
        let mut fast = self.fast_durable.clone();
        for &word in &self.fast_unpersisted {
            if coin(survival.fast_word) {
                let at = (word * WORD) as usize;
                let end = (at + WORD as usize).min(fast.len());
                fast[at..end].copy_from_slice(&self.fast_current[at..end]);
            }
        }
        let mut ssd = self.ssd_durable.clone();
        for (offset, bytes) in &self.ssd_cached {
            for (k, sector) in bytes.chunks(IO_ALIGN).enumerate() {
                if coin(survival.ssd_sector) {
                    let at = *offset as usize + k * IO_ALIGN;
                    ssd[at..at + sector.len()].copy_from_slice(sector);
                }
            }
        }
        CrashImage { fast, ssd, kv: self.kv_synced.clone() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{run_batch, AlignedBuf, PmemRegion, SimSsd};

    fn all(_: f64) -> bool {
        true
    }
    fn none(_: f64) -> bool {
        false
    }
    const EVERYTHING: Survival = Survival { fast_word: 1.0, ssd_sector: 1.0 };

    #[test]
    fn unpersisted_stores_and_unflushed_writes_are_volatile() {
        let log = PowerLog::new();
        let fast = PmemRegion::recorded(4096, Arc::clone(&log)).unwrap();
        let ssd = RecordedSsd::new(Arc::new(SimSsd::new(16384)), Arc::clone(&log));
        fast.write_persist(0, b"durable!");
        fast.write(128, b"volatile");
        let mut buf = AlignedBuf::zeroed(4096);
        buf[..5].copy_from_slice(b"block");
        run_batch(&ssd, vec![IoRequest { op: IoOp::Write, offset_bytes: 8192, buf }]).unwrap();

        let mut replay = Replay::new(4096, 16384);
        log.events().iter().for_each(|e| replay.apply(e));
        assert_eq!(replay.volatile_bytes(), (8, 4096));
        let lost = replay.image(EVERYTHING, &mut none);
        assert_eq!(&lost.fast[..8], b"durable!");
        assert_eq!(&lost.fast[128..136], &[0; 8]);
        assert_eq!(&lost.ssd[8192..8197], &[0; 5]);
        let kept = replay.image(EVERYTHING, &mut all);
        assert_eq!(&kept.fast[128..136], b"volatile");
        assert_eq!(&kept.ssd[8192..8197], b"block");

        ssd.flush().unwrap();
        fast.persist(130, 1);
        log.events()[replay.position()..].iter().for_each(|e| replay.apply(e));
        assert_eq!(replay.volatile_bytes(), (0, 0));
        let after = replay.image(EVERYTHING, &mut none);
        assert_eq!(&after.fast[128..136], b"volatile", "persist writes back the whole line");
        assert_eq!(&after.ssd[8192..8197], b"block");
    }

    #[test]
    fn a_persist_covers_only_its_lines() {
        let log = PowerLog::new();
        let fast = PmemRegion::recorded(4096, Arc::clone(&log)).unwrap();
        fast.write(0, &[1; 200]);
        fast.persist(64, 64);
        let mut replay = Replay::new(4096, 4096);
        log.events().iter().for_each(|e| replay.apply(e));
        let image = replay.image(EVERYTHING, &mut none);
        assert_eq!(&image.fast[..64], &[0; 64]);
        assert_eq!(&image.fast[64..128], &[1; 64]);
        assert_eq!(&image.fast[128..200], &[0; 72]);
    }

    #[test]
    fn a_flush_takes_the_kv_files_as_written_then_and_no_later() {
        let log = PowerLog::new();
        let ssd = RecordedSsd::new(Arc::new(SimSsd::new(4096)), Arc::clone(&log));
        ssd.flush().unwrap();
        assert!(log.kv_written_at(0).is_none(), "no KV store attached yet");
        let dir = tempfile::tempdir().unwrap();
        let recorded = RecordedDir::new(dir.path(), Arc::clone(&log));
        std::fs::write(dir.path().join("journal"), b"synced;").unwrap();
        recorded.synced().unwrap();
        std::fs::write(dir.path().join("journal"), b"synced;before the flush;").unwrap();
        ssd.flush().unwrap();
        std::fs::write(dir.path().join("journal"), b"synced;before the flush;after it").unwrap();
        recorded.synced().unwrap();
        let file = |at: usize| log.kv_written_at(at).unwrap().files[Path::new("journal")].1.clone();
        assert_eq!(file(1), b"synced;", "a sync's own snapshot");
        assert_eq!(file(2), b"synced;before the flush;", "a power cut before the flush finds no later bytes");
        assert_eq!(file(3), b"synced;before the flush;after it");
    }

    #[test]
    fn a_directory_snapshot_restores_and_tears_as_appends_do() {
        let dir = tempfile::tempdir().unwrap();
        let journal = dir.path().join("journals/1.jnl");
        std::fs::create_dir_all(journal.parent().unwrap()).unwrap();
        let file = std::fs::File::create(&journal).unwrap();
        file.set_len(1 << 20).unwrap();
        std::fs::write(dir.path().join("marker"), b"uuid").unwrap();
        use std::os::unix::fs::FileExt;
        file.write_all_at(b"first batch;", 0).unwrap();
        let synced = DirSnapshot::take(dir.path()).unwrap();
        assert_eq!(synced.bytes(), 12 + 4, "trailing zeros are not kept");
        file.write_all_at(b"second batch", 12).unwrap();
        std::fs::write(dir.path().join("new"), b"abcd").unwrap();
        let next = DirSnapshot::take(dir.path()).unwrap();

        let restored = tempfile::tempdir().unwrap();
        synced.torn_toward(&next, 0.5).restore(restored.path()).unwrap();
        let bytes = std::fs::read(restored.path().join("journals/1.jnl")).unwrap();
        assert_eq!(bytes.len(), 1 << 20, "the file keeps its length");
        assert_eq!(&bytes[..24], b"first batch;second\0\0\0\0\0\0");
        assert_eq!(std::fs::read(restored.path().join("new")).unwrap(), b"ab");
        assert_eq!(std::fs::read(restored.path().join("marker")).unwrap(), b"uuid");
        std::fs::write(dir.path().join("marker"), b"next").unwrap();
        let rewritten = DirSnapshot::take(dir.path()).unwrap();
        assert_eq!(std::fs::read(dir.path().join("marker")).unwrap(), b"next");
        assert_eq!(next.torn_toward(&rewritten, 0.4).files[Path::new("marker")].1, b"uuid", "a rewrite is whole: old");
        assert_eq!(next.torn_toward(&rewritten, 0.6).files[Path::new("marker")].1, b"next", "a rewrite is whole: new");
        let nothing = synced.torn_toward(&next, 0.0);
        assert_eq!(nothing.files[Path::new("journals/1.jnl")], synced.files[Path::new("journals/1.jnl")]);
        assert_eq!(nothing.files[Path::new("new")], (0, Vec::new()), "created, nothing written yet");
        assert_eq!(synced.torn_toward(&synced, 0.7), synced);
        assert_eq!(synced.torn_toward(&next, 1.0).files, next.files);
    }

    #[test]
    fn a_directory_snapshot_tears_by_sectors() {
        let dir = tempfile::tempdir().unwrap();
        let journal = dir.path().join("1.jnl");
        std::fs::write(&journal, [b'a'; 700]).unwrap();
        let synced = DirSnapshot::take(dir.path()).unwrap();
        std::fs::write(&journal, [[b'a'; 700].as_slice(), &[b'b'; 1200]].concat()).unwrap();
        let next = DirSnapshot::take(dir.path()).unwrap();
        // Sectors 512..1024 (old and new bytes), 1024..1536 and 1536..1900 hold appends.
        let mut pattern = [false, true, false].into_iter();
        let torn = synced.torn_by_sectors(&next, &mut || pattern.next().expect("one answer per sector"));
        let bytes = &torn.files[Path::new("1.jnl")].1;
        assert_eq!(bytes.len(), 1536, "the last sector lost, and the zeros before it trimmed");
        assert_eq!(&bytes[..700], &[b'a'; 700], "a sector lost keeps its old bytes");
        assert_eq!(&bytes[700..1024], &[0; 324]);
        assert_eq!(&bytes[1024..1536], &[b'b'; 512], "a later sector kept");
        assert_eq!(synced.torn_by_sectors(&next, &mut || false), synced);
        assert_eq!(synced.torn_by_sectors(&next, &mut || true).files, next.files);
    }
}
