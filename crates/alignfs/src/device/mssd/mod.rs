//! An emulated memory-semantic SSD (ByteFS, ASPLOS '25): one device with a block
//! interface (4 KiB pages through a page-mapped FTL over flash) and a byte interface
//! (stores of any length, durable in a write log in the device's battery-backed DRAM).
//! docs/BYTE.md describes the model; docs/format/mssd.md the bytes.
//!
//! The flash is any [`BlockDevice`] (an image file on the real SSD); the device DRAM is
//! any [`ByteTier`] (a file on tmpfs, so a process crash keeps it, or the power-loss
//! recorder). What a real device's firmware does, this module does on the caller's
//! thread, plus one background thread that cleans the log when it is 85 % full.
//!
//! Promises, as a host sees them:
//! - a block write is durable after the next [`BlockDevice::flush`] (until then a crash
//!   leaves the old or the new page);
//! - a byte store is durable after [`MemorySemanticSsd::verify`] (the write-verify read);
//!   a store of one page or less outside a transaction is atomic;
//! - a transaction's stores become visible to recovery together, at
//!   [`MemorySemanticSsd::commit`]; a crash before it drops all of them.
//!
//! Reads see the newest bytes, committed or not, as a CPU sees its own stores.

mod ftl;
mod index;
mod latency;
mod layout;

pub use latency::LatencyModel;
pub use layout::{dram_label, flash_label, MssdConfig, LINE, PAGE};

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, MutexGuard, RwLock};

use super::{AlignedBuf, BlockDevice, ByteTier, IoOp, IoOutcome, IoRequest, IoTicket};
use crate::error::{Error, Result};
use ftl::{runs, Ftl};
use index::{covers, merge, Chunk, Index};
use latency::settle;
use layout::{EntryHeader, EntryKind, Layout, ENTRY_HEADER};

macro_rules! device_counters {
    ($($name:ident: $doc:literal,)*) => {
        #[derive(Default)]
        struct Counters { $($name: AtomicU64,)* }

        /// The device's counters since it was opened.
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct MssdStats { $(#[doc = $doc] pub $name: u64,)* }

        impl Counters {
            fn snapshot(&self) -> MssdStats {
                MssdStats { $($name: self.$name.load(Ordering::Relaxed),)* }
            }
        }

        impl MssdStats {
            /// Every counter with its name and meaning, for `alignfs stat` and reports.
            pub fn named(&self) -> Vec<(&'static str, u64, &'static str)> {
                vec![$((stringify!($name), self.$name, $doc),)*]
            }
        }
    };
}

device_counters! {
    block_read_bytes: "host reads through the block interface",
    block_write_bytes: "host writes through the block interface",
    byte_store_bytes: "host stores through the byte interface, in whole cache lines",
    byte_store_payload: "bytes the host stored through the byte interface",
    byte_load_bytes: "host loads through the byte interface, in whole cache lines",
    verifies: "write-verify reads",
    commits: "transactions committed",
    trimmed_pages: "pages deallocated by trims (no payload crosses the bus)",
    flash_program_bytes: "bytes programmed to flash (host writes, cleaning, garbage collection)",
    flash_read_bytes: "bytes read from flash",
    flash_flushes: "flushes of the flash image",
    log_cleanings: "write-log cleanings",
    log_cleaned_pages: "pages cleaning merged and wrote to flash",
    log_base_reads: "old pages cleaning read for partial updates",
    log_migrated_bytes: "log bytes cleaning moved to the new region (open transactions)",
    gc_runs: "erase blocks garbage collection emptied",
    gc_moves: "valid pages garbage collection moved",
    erases: "erase blocks opened for programming",
}

/// Runtime choices that are not part of the format.
#[derive(Clone, Copy, Debug)]
pub struct MssdOptions {
    pub latency: Option<LatencyModel>,
    /// Clean the log on a firmware thread; without it, the store that crosses the
    /// threshold cleans (tests use this to make cleaning deterministic).
    pub background_cleaning: bool,
    /// Log use, in percent, that starts a cleaning (the paper's 85).
    pub clean_at_percent: u32,
}

impl Default for MssdOptions {
    fn default() -> MssdOptions {
        MssdOptions { latency: None, background_cleaning: true, clean_at_percent: 85 }
    }
}

/// A transaction of byte-interface stores (its TxID).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TxId(u32);

/// What opening the device found in its log.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MssdRecovery {
    /// Committed entries replayed onto flash.
    pub replayed: u64,
    /// Entries of transactions that never committed, dropped.
    pub dropped_uncommitted: u64,
    /// Entries older than the flash page they belong to.
    pub stale: u64,
}

/// Stores keep this much of the log free for cleaning's migrations.
const RESERVE_DIVISOR: u64 = 16;
/// Pages cleaning merges and programs per batch (the paper's 16 MiB write buffer).
const CLEAN_BATCH: usize = 4096;

struct LogState {
    head: u64,
    tail: u64,
    verified: u64,
    /// Log use right after the last cleaning: what cleaning could not free.
    residual: u64,
    next_txid: u32,
    /// Open transactions and the pages they stored to.
    open: HashMap<u32, Vec<u32>>,
    committed: HashSet<u32>,
    /// The TxIDs in each TxLog, in commit order.
    txlogs: [Vec<u32>; 2],
    active: usize,
}

impl LogState {
    fn used(&self) -> u64 {
        self.tail - self.head
    }
}

struct Inner {
    layout: Layout,
    ftl: Ftl,
    dram: Arc<dyn ByteTier>,
    index: Index,
    log: Mutex<LogState>,
    /// Readers share it; what changes the flash under them (garbage collection, a
    /// cleaning's install, the log head moving) takes it alone. Taken before `log`,
    /// which is taken before the FTL's state.
    media: RwLock<()>,
    cleaning: Mutex<()>,
    seq: AtomicU64,
    counters: Arc<Counters>,
    options: MssdOptions,
    wake: Mutex<bool>,
    woken: Condvar,
    stop: AtomicBool,
    /// A posted store ([`MemorySemanticSsd::post`]) failed: every later verify reports it.
    posted_failure: Mutex<Option<String>>,
}

pub struct MemorySemanticSsd {
    inner: Arc<Inner>,
    cleaner: Mutex<Option<JoinHandle<()>>>,
}

impl MemorySemanticSsd {
    /// DRAM and flash-image bytes a device of `config` needs.
    pub fn sizes(config: &MssdConfig) -> Result<(u64, u64)> {
        let layout = Layout::new(config)?;
        Ok((layout.dram_bytes, layout.image_bytes()))
    }

    /// Write an empty device's DRAM state and its flash image's label, and open it. The
    /// label goes first: a DRAM header never names a flash image that does not name it back.
    pub fn format(
        flash: Arc<dyn BlockDevice>,
        dram: Arc<dyn ByteTier>,
        config: &MssdConfig,
        options: MssdOptions,
    ) -> Result<MemorySemanticSsd> {
        let mut layout = Layout::new(config)?;
        layout.incarnation = uuid::Uuid::new_v4().as_u64_pair().0;
        check_sizes(&layout, flash.as_ref(), dram.as_ref())?;
        if flash.len_bytes() < layout.image_bytes() {
            return Err(Error::BadSize(format!(
                "the flash image ({}) holds {} bytes; this device needs {} (its flash and a label page)",
                flash.describe(),
                flash.len_bytes(),
                layout.image_bytes()
            )));
        }
        let mut label = AlignedBuf::zeroed(PAGE as usize);
        label.copy_from_slice(&layout.encode_flash_label());
        super::run_batch(flash.as_ref(), vec![IoRequest { op: IoOp::Write, offset_bytes: label_at(flash.as_ref()), buf: label }])?;
        flash.flush()?;
        let state_bytes = layout.log(0) as usize;
        dram.zero(0, state_bytes);
        dram.write(0, &layout.encode_header());
        dram.persist(0, state_bytes);
        Ok(MemorySemanticSsd::open(flash, dram, options)?.0)
    }

    /// Open a formatted device and recover it as its firmware would after a power cut:
    /// replay committed log entries onto flash, drop uncommitted ones, empty the log.
    pub fn open(flash: Arc<dyn BlockDevice>, dram: Arc<dyn ByteTier>, options: MssdOptions) -> Result<(MemorySemanticSsd, MssdRecovery)> {
        let mut header = [0u8; 80];
        dram.read(0, &mut header);
        let layout = Layout::decode_header(&header, dram.len_bytes(), &dram.describe())?;
        check_sizes(&layout, flash.as_ref(), dram.as_ref())?;
        check_label(&layout, flash.as_ref(), dram.as_ref())?;
        let counters = Arc::new(Counters::default());
        let (ftl, max_version) = Ftl::load(layout, flash, dram.clone(), counters.clone())?;
        let word = |at: usize| u64::from_le_bytes(header[at..at + 8].try_into().expect("8 bytes"));
        let head = word(Layout::head_at() as usize);
        if head % LINE != 0 {
            let problem = format!("the write log's head ({head}) is not on a {LINE}-byte line");
            return Err(Error::Corrupt {
                structure: "memory-semantic SSD header",
                device: dram.describe(),
                offset: Layout::head_at(),
                problem,
            });
        }
        let active = (word(Layout::active_txlog_at() as usize) & 1) as usize;
        let txlogs = [0, 1].map(|which| read_txlog(&layout, dram.as_ref(), which));
        let committed: HashSet<u32> = txlogs.iter().flatten().copied().collect();
        let (entries, tail) = scan(&layout, dram.as_ref(), head);
        let inner = Arc::new(Inner {
            index: Index::new(layout.partitions()),
            log: Mutex::new(LogState {
                head,
                tail,
                verified: tail,
                residual: 0,
                next_txid: 1,
                open: HashMap::new(),
                committed,
                txlogs,
                active,
            }),
            media: RwLock::new(()),
            cleaning: Mutex::new(()),
            seq: AtomicU64::new(max_version.max(entries.iter().map(|(_, e)| e.seq).max().unwrap_or(0)) + 1),
            layout,
            ftl,
            dram,
            counters,
            options,
            wake: Mutex::new(false),
            woken: Condvar::new(),
            stop: AtomicBool::new(false),
            posted_failure: Mutex::new(None),
        });
        let recovery = inner.recover(entries)?;
        let cleaner = options.background_cleaning.then(|| spawn_cleaner(&inner));
        Ok((MemorySemanticSsd { inner, cleaner: Mutex::new(cleaner) }, recovery))
    }

    /// Start a transaction.
    pub fn begin(&self) -> TxId {
        let mut st = self.inner.log.lock();
        let txid = st.next_txid;
        st.next_txid = st.next_txid.checked_add(1).filter(|&t| t != 0).unwrap_or(1);
        st.open.insert(txid, Vec::new());
        TxId(txid)
    }

    /// Store `data` at byte address `addr` through the byte interface: posted, durable
    /// after [`verify`](Self::verify) (or the transaction's commit).
    pub fn store(&self, tx: Option<TxId>, addr: u64, data: &[u8]) -> Result<()> {
        self.inner.store(tx.map_or(0, |t| t.0), addr, data)
    }

    /// The write-verify read: every store so far is durable when it returns.
    pub fn verify(&self) {
        let start = Instant::now();
        self.inner.verify(&mut self.inner.log.lock());
        if let Some(model) = self.inner.options.latency {
            settle(start, model.verify());
        }
    }

    /// A posted store whose caller cannot take an error on the spot (a host cache-line
    /// write-back): a failure is kept, and every later [`verify_posted`](Self::verify_posted)
    /// reports it, as the device would on its write-verify read. Returns whether the device
    /// took the store.
    pub fn post(&self, addr: u64, data: &[u8]) -> bool {
        match self.store(None, addr, data) {
            Ok(()) => true,
            Err(e) => {
                self.keep_posted_failure(&format!("a posted store of {} bytes at {addr}", data.len()), &e);
                false
            }
        }
    }

    /// Log a posted operation's failure and keep the first one for
    /// [`verify_posted`](Self::verify_posted) to report.
    fn keep_posted_failure(&self, what: &str, e: &Error) {
        tracing::error!("memory-semantic SSD: {what} failed: {e}");
        self.inner.posted_failure.lock().get_or_insert_with(|| e.to_string());
    }

    /// [`verify`](Self::verify), failing if any posted store failed since the device opened.
    pub fn verify_posted(&self) -> Result<()> {
        self.verify();
        match self.inner.posted_failure.lock().as_ref() {
            Some(failure) => Err(Error::io("verify posted stores", std::io::Error::other(failure.clone()))),
            None => Ok(()),
        }
    }

    /// Stop the firmware's background cleaning (the host is done with the device, or a
    /// test cuts its power). Stores still clean when the log fills.
    pub fn halt(&self) {
        self.inner.stop.store(true, Ordering::Release);
        *self.inner.wake.lock() = true;
        self.inner.woken.notify_all();
        if let Some(cleaner) = self.cleaner.lock().take() {
            let _ = cleaner.join();
        }
    }

    /// The device's DRAM (write log, TxLogs, page map), for a volume's report.
    pub fn describe_dram(&self) -> String {
        format!(
            "the device's DRAM, {} (its {} MiB write log, TxLogs and page map)",
            self.inner.dram.describe(),
            self.inner.layout.log_bytes >> 20
        )
    }

    /// Whether `dram` holds a formatted device's state (its header's magic).
    pub fn is_formatted(dram: &dyn ByteTier) -> bool {
        let mut head = [0u8; 8];
        if dram.len_bytes() < head.len() as u64 {
            return false;
        }
        dram.read(0, &mut head);
        Layout::has_magic(&head)
    }

    /// Make a transaction's stores durable and atomic: after this, recovery keeps all of
    /// them; before it, none.
    pub fn commit(&self, tx: TxId) -> Result<()> {
        self.inner.commit(tx.0)
    }

    /// Load bytes through the byte interface.
    pub fn load(&self, addr: u64, out: &mut [u8]) -> Result<()> {
        let start = Instant::now();
        self.inner.read_range(addr, out, true)?;
        let lines = line_span(addr, out.len());
        self.inner.counters.byte_load_bytes.fetch_add(lines, Ordering::Relaxed);
        if let Some(model) = self.inner.options.latency {
            settle(start, model.load(lines));
        }
        Ok(())
    }

    /// Deallocate whole pages (NVMe deallocate / TRIM): they read as zeros afterwards,
    /// and the log entries for them are void. Durable when it returns.
    pub fn trim(&self, addr: u64, len: u64) -> Result<()> {
        self.inner.trim(addr, len)?;
        self.verify();
        Ok(())
    }

    /// [`trim`](Self::trim) posted like a store: durable at the next verify, with a
    /// failure reported by [`verify_posted`](Self::verify_posted).
    pub fn post_trim(&self, addr: u64, len: u64) {
        if let Err(e) = self.inner.trim(addr, len) {
            self.keep_posted_failure(&format!("a posted trim of {len} bytes at {addr}"), &e);
        }
    }

    /// Clean the whole log now (normally done at 85 % use).
    pub fn clean(&self) -> Result<()> {
        self.inner.clean()
    }

    pub fn stats(&self) -> MssdStats {
        self.inner.counters.snapshot()
    }

    /// Bytes of the write log in use, and its size.
    pub fn log_usage(&self) -> (u64, u64) {
        (self.inner.log.lock().used(), self.inner.layout.log_bytes)
    }
}

impl Drop for MemorySemanticSsd {
    fn drop(&mut self) {
        self.halt();
    }
}

fn check_sizes(layout: &Layout, flash: &dyn BlockDevice, dram: &dyn ByteTier) -> Result<()> {
    if flash.len_bytes() < layout.flash_bytes() {
        return Err(Error::BadSize(format!(
            "the flash image ({}) holds {} bytes; this device needs {}",
            flash.describe(),
            flash.len_bytes(),
            layout.flash_bytes()
        )));
    }
    if dram.len_bytes() < layout.dram_bytes {
        return Err(Error::BadSize(format!(
            "the device DRAM ({}) holds {} bytes; this device needs {}",
            dram.describe(),
            dram.len_bytes(),
            layout.dram_bytes
        )));
    }
    Ok(())
}

/// Where a flash image's label lives: its last whole page.
fn label_at(flash: &dyn BlockDevice) -> u64 {
    (flash.len_bytes() / PAGE - 1) * PAGE
}

/// Refuse a flash image whose label names another device: DRAM and flash of two devices
/// would read as one with the wrong pages. An image without a label (formatted before
/// labels, or its label page beyond an image exactly as large as its flash) is taken as
/// it is.
fn check_label(layout: &Layout, flash: &dyn BlockDevice, dram: &dyn ByteTier) -> Result<()> {
    if flash.len_bytes() < layout.image_bytes() {
        return Ok(());
    }
    let page =
        super::run_batch(flash, vec![IoRequest { op: IoOp::Read, offset_bytes: label_at(flash), buf: AlignedBuf::zeroed(PAGE as usize) }])?;
    match flash_label(&page[0]) {
        Some(id) if id != layout.incarnation => Err(Error::WrongDevices(format!(
            "the flash image {} belongs to memory-semantic SSD {id:016x}, the DRAM {} to {:016x}: name the DRAM and flash of one device",
            flash.describe(),
            dram.describe(),
            layout.incarnation
        ))),
        _ => Ok(()),
    }
}

fn read_txlog(layout: &Layout, dram: &dyn ByteTier, which: usize) -> Vec<u32> {
    let (at, len) = layout.txlog_range(which);
    let mut raw = vec![0u8; len as usize];
    dram.read(at, &mut raw);
    raw.chunks_exact(4).map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes"))).take_while(|&t| t != 0).collect()
}

/// The entries from `head` up to the first position that holds no valid entry of this lap.
fn scan(layout: &Layout, dram: &dyn ByteTier, head: u64) -> (Vec<(u64, EntryHeader)>, u64) {
    let mut entries = Vec::new();
    let mut pos = head;
    let mut read = |at: u64, out: &mut [u8]| read_log(layout, dram, at, out);
    while pos - head < layout.log_bytes {
        let room = layout.log_bytes - pos % layout.log_bytes;
        let Some(entry) = EntryHeader::decode(pos, layout.incarnation, room, &mut read) else { break };
        if entry.kind == EntryKind::Pad {
            pos += room;
            continue;
        }
        entries.push((pos, entry));
        pos += EntryHeader::footprint(usize::from(entry.len));
    }
    (entries, pos)
}

/// Read log bytes at position `pos`; an entry never wraps, so neither does a read of one.
fn read_log(layout: &Layout, dram: &dyn ByteTier, pos: u64, out: &mut [u8]) {
    dram.read(layout.log(pos), out);
}

/// Whole cache lines a byte range touches, in bytes.
fn line_span(addr: u64, len: usize) -> u64 {
    if len == 0 {
        return 0;
    }
    let first = addr / LINE;
    let last = (addr + len as u64 - 1) / LINE;
    (last - first + 1) * LINE
}

/// `addr..addr + len` cut at page boundaries: (page, offset in page, range in the input).
fn pieces(addr: u64, len: usize) -> Vec<(u32, usize, std::ops::Range<usize>)> {
    let mut out = Vec::new();
    let mut done = 0;
    while done < len {
        let at = addr + done as u64;
        let offset = (at % PAGE) as usize;
        let take = (PAGE as usize - offset).min(len - done);
        out.push(((at / PAGE) as u32, offset, done..done + take));
        done += take;
    }
    out
}

impl Inner {
    fn check_range(&self, addr: u64, len: u64) -> Result<()> {
        let size = u64::from(self.layout.logical_pages) * PAGE;
        if addr.checked_add(len).is_none_or(|end| end > size) {
            return Err(Error::InvalidArgument(format!("{len} bytes at {addr} lie beyond the device's {size} bytes")));
        }
        Ok(())
    }

    fn read_log(&self, pos: u64, out: &mut [u8]) {
        read_log(&self.layout, self.dram.as_ref(), pos, out);
    }

    fn store(&self, txid: u32, addr: u64, data: &[u8]) -> Result<()> {
        let start = Instant::now();
        self.check_range(addr, data.len() as u64)?;
        let pieces = pieces(addr, data.len());
        let sizes: Vec<u64> = pieces.iter().map(|(_, _, r)| EntryHeader::footprint(r.len())).collect();
        let limit = self.layout.log_bytes - self.layout.log_bytes / RESERVE_DIVISOR;
        let mut st = self.log_with_room(&sizes, limit, |st| {
            if txid != 0 && !st.open.contains_key(&txid) {
                return Err(Error::InvalidArgument(format!("transaction {txid} is not open")));
            }
            Ok(())
        })?;
        for (lpa, offset, range) in &pieces {
            let seq = self.seq.fetch_add(1, Ordering::Relaxed);
            let header = EntryHeader { kind: EntryKind::Data, txid, seq, lpa: *lpa, offset: *offset as u16, len: range.len() as u16 };
            let pos = self.append(&mut st, &header, &data[range.clone()])?;
            self.index.insert(*lpa, Chunk { offset: header.offset, len: header.len, pos, seq, txid });
            if txid == 0 {
                let committed = &st.committed;
                self.index.prune(*lpa, |t| t == 0 || committed.contains(&t));
            } else {
                let pages = st.open.get_mut(&txid).expect("checked open");
                if pages.last() != Some(lpa) {
                    pages.push(*lpa);
                }
            }
        }
        let over_threshold = self.over_threshold(&st);
        drop(st);
        self.counters.byte_store_payload.fetch_add(data.len() as u64, Ordering::Relaxed);
        let lines: u64 = pieces.iter().map(|(lpa, offset, range)| line_span(u64::from(*lpa) * PAGE + *offset as u64, range.len())).sum();
        self.counters.byte_store_bytes.fetch_add(lines, Ordering::Relaxed);
        if over_threshold {
            self.wake_cleaner()?;
        }
        if let Some(model) = self.options.latency {
            settle(start, model.store(lines));
        }
        Ok(())
    }

    /// The log, locked, once entries of `sizes` fit below `limit` bytes of use: after
    /// one cleaning if they do not yet. `check` runs first, each time the lock is taken.
    fn log_with_room(&self, sizes: &[u64], limit: u64, check: impl Fn(&LogState) -> Result<()>) -> Result<MutexGuard<'_, LogState>> {
        let mut cleaned = false;
        loop {
            let st = self.log.lock();
            check(&st)?;
            if self.fits(&st, sizes, limit) {
                return Ok(st);
            }
            drop(st);
            if cleaned {
                return Err(Error::NoSpace);
            }
            self.clean()?;
            cleaned = true;
        }
    }

    /// Whether entries of `sizes` fit below `limit` bytes of use, pads included.
    fn fits(&self, st: &LogState, sizes: &[u64], limit: u64) -> bool {
        let mut tail = st.tail;
        for &size in sizes {
            let room = self.layout.log_bytes - tail % self.layout.log_bytes;
            if room < size {
                tail += room;
            }
            tail += size;
        }
        tail - st.head <= limit
    }

    fn over_threshold(&self, st: &LogState) -> bool {
        let threshold = self.layout.log_bytes * u64::from(self.options.clean_at_percent) / 100;
        // What the last cleaning could not free (open transactions) does not count again.
        st.used() >= threshold && st.used() >= st.residual + self.layout.log_bytes / RESERVE_DIVISOR
    }

    /// Append one entry at the tail (after a pad to the next lap if it would wrap).
    fn append(&self, st: &mut LogState, header: &EntryHeader, data: &[u8]) -> Result<u64> {
        let size = EntryHeader::footprint(data.len());
        let room = self.layout.log_bytes - st.tail % self.layout.log_bytes;
        let pad = if room < size { room } else { 0 };
        if st.used() + pad + size > self.layout.log_bytes {
            return Err(Error::NoSpace);
        }
        if pad > 0 {
            let filler = EntryHeader { kind: EntryKind::Pad, txid: 0, seq: 0, lpa: 0, offset: 0, len: 0 };
            self.dram.write(self.layout.log(st.tail), &filler.encode(st.tail, self.layout.incarnation, &[]));
            st.tail += pad;
        }
        let pos = st.tail;
        self.dram.write(self.layout.log(pos), &header.encode(pos, self.layout.incarnation, data));
        st.tail += size;
        Ok(pos)
    }

    fn verify(&self, st: &mut LogState) {
        let (from, to) = (st.verified, st.tail);
        if to > from {
            let split = self.layout.log_bytes - from % self.layout.log_bytes;
            let first = (to - from).min(split);
            self.dram.persist(self.layout.log(from), first as usize);
            if to - from > first {
                self.dram.persist(self.layout.log(from + first), (to - from - first) as usize);
            }
        }
        st.verified = to;
        self.counters.verifies.fetch_add(1, Ordering::Relaxed);
    }

    fn commit(&self, txid: u32) -> Result<()> {
        let start = Instant::now();
        loop {
            let mut st = self.log.lock();
            if !st.open.contains_key(&txid) {
                return Err(Error::InvalidArgument(format!("transaction {txid} is not open")));
            }
            let active = st.active;
            let count = st.txlogs[active].len() as u64;
            if count >= self.layout.txlog_entries {
                drop(st);
                self.clean()?;
                continue;
            }
            self.verify(&mut st);
            self.dram.write_persist(self.layout.txlog(active, count), &txid.to_le_bytes());
            st.txlogs[active].push(txid);
            st.committed.insert(txid);
            let pages = st.open.remove(&txid).expect("checked open");
            let committed = &st.committed;
            for lpa in pages {
                self.index.prune(lpa, |t| t == 0 || committed.contains(&t));
            }
            break;
        }
        self.counters.commits.fetch_add(1, Ordering::Relaxed);
        if let Some(model) = self.options.latency {
            // The COMMIT command is one more posted write, ordered by its own verify.
            settle(start, model.verify() * 2 + model.store(LINE));
        }
        Ok(())
    }

    fn trim(&self, addr: u64, len: u64) -> Result<()> {
        if addr % PAGE != 0 || len % PAGE != 0 {
            return Err(Error::InvalidArgument(format!("a trim of {len} bytes at {addr} is not in whole 4 KiB pages")));
        }
        self.check_range(addr, len)?;
        for lpa in (addr / PAGE) as u32..((addr + len) / PAGE) as u32 {
            let mut st = self.log_with_room(&[EntryHeader::footprint(0)], self.layout.log_bytes, |_| Ok(()))?;
            let seq = self.seq.fetch_add(1, Ordering::Relaxed);
            let header = EntryHeader { kind: EntryKind::Trim, txid: 0, seq, lpa, offset: 0, len: 0 };
            self.append(&mut st, &header, &[])?;
            self.index.retain(lpa, |_| false);
            self.ftl.unmap(&mut self.ftl.state.lock(), lpa, seq);
            self.counters.trimmed_pages.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Bytes at `addr` as a read sees them: flash (or zeros) with the log's newer bytes
    /// over it. A byte-interface load skips the flash when the log covers the range.
    fn read_range(&self, addr: u64, out: &mut [u8], load: bool) -> Result<()> {
        self.check_range(addr, out.len() as u64)?;
        let _media = self.media.read();
        // Every flash page the range needs in one batch (adjacent pages in one IO), as a
        // device reads a multi-page command; then each page with its log chunks merged.
        let pieces = pieces(addr, out.len());
        let mut needs = Vec::with_capacity(pieces.len());
        let mut ppas = Vec::with_capacity(pieces.len());
        for (lpa, offset, range) in &pieces {
            let chunks = self.index.chunks(*lpa);
            let from_log_only = load && covers(&chunks, *offset..*offset + range.len());
            let ppa = if from_log_only { None } else { self.ftl.lookup(*lpa) };
            ppas.extend(ppa);
            needs.push((chunks, ppa.is_some()));
        }
        let flash = self.ftl.read_pages(&ppas)?;
        let mut flash = flash.pages();
        let mut page = AlignedBuf::zeroed(PAGE as usize);
        for ((_, offset, range), (chunks, mapped)) in pieces.into_iter().zip(needs) {
            if mapped {
                page.copy_from_slice(flash.next().expect("one page per mapped page"));
            } else {
                page.fill(0);
            }
            merge(&mut page, &chunks, &mut |chunk, bytes| self.read_log(chunk.pos + ENTRY_HEADER, bytes));
            out[range.clone()].copy_from_slice(&page[offset..offset + range.len()]);
        }
        Ok(())
    }

    fn read_blocks(&self, requests: Vec<(usize, IoRequest)>) -> Vec<IoOutcome> {
        let start = Instant::now();
        let _media = self.media.read();
        let mut mapped = Vec::new();
        let mut outcomes = Vec::with_capacity(requests.len());
        let mut pending = Vec::new();
        for (index, request) in requests {
            if let Err(e) = self.check_range(request.offset_bytes, request.buf.len() as u64) {
                outcomes.push((index, Err(e)));
                continue;
            }
            let first = (request.offset_bytes / PAGE) as u32;
            let pages = (request.buf.len() as u64 / PAGE) as u32;
            let lookups: Vec<Option<u32>> = (first..first + pages).map(|lpa| self.ftl.lookup(lpa)).collect();
            mapped.extend(lookups.iter().flatten());
            pending.push((index, request, first, lookups));
        }
        let flash = match self.ftl.read_pages(&mapped) {
            Ok(pages) => pages,
            Err(e) => {
                let message = e.to_string();
                outcomes.extend(
                    pending.into_iter().map(|(index, ..)| (index, Err(Error::io("flash read", std::io::Error::other(message.clone()))))),
                );
                return outcomes;
            }
        };
        let mut flash = flash.pages();
        let mut total_pages = 0u64;
        for (index, mut request, first, lookups) in pending {
            for (i, ppa) in lookups.iter().enumerate() {
                let page = &mut request.buf[i * PAGE as usize..(i + 1) * PAGE as usize];
                match ppa {
                    Some(_) => page.copy_from_slice(flash.next().expect("one page per mapped page")),
                    None => page.fill(0),
                }
                let chunks = self.index.chunks(first + i as u32);
                merge(page, &chunks, &mut |chunk, bytes| self.read_log(chunk.pos + ENTRY_HEADER, bytes));
            }
            total_pages += lookups.len() as u64;
            outcomes.push((index, Ok(request.buf)));
        }
        self.counters.block_read_bytes.fetch_add(total_pages * PAGE, Ordering::Relaxed);
        if let Some(model) = self.options.latency {
            settle(start, model.block(false, total_pages));
        }
        outcomes
    }

    fn write_blocks(self: &Arc<Inner>, requests: Vec<(usize, IoRequest)>, mut done: Vec<IoOutcome>) -> IoTicket {
        let start = Instant::now();
        let mut accepted = Vec::with_capacity(requests.len());
        for (index, request) in requests {
            match self.check_range(request.offset_bytes, request.buf.len() as u64) {
                Ok(()) => accepted.push((index, request)),
                Err(e) => done.push((index, Err(e))),
            }
        }
        let requests = accepted;
        let lpas: Vec<u32> = requests
            .iter()
            .flat_map(|(_, r)| {
                let first = (r.offset_bytes / PAGE) as u32;
                first..first + (r.buf.len() as u64 / PAGE) as u32
            })
            .collect();
        if self.ftl.needs_collection(lpas.len()) {
            let _media = self.media.write();
            let mut f = self.ftl.state.lock();
            if let Err(e) = self.ftl.collect(&mut f, lpas.len()) {
                tracing::error!("memory-semantic SSD garbage collection failed: {e}");
            }
        }
        let first_seq = self.seq.fetch_add(lpas.len() as u64, Ordering::Relaxed);
        let ppas = match self.ftl.allocate(&mut self.ftl.state.lock(), &lpas, true) {
            Ok(ppas) => ppas,
            Err(_) => {
                done.extend(requests.into_iter().map(|(index, _)| (index, Err(Error::NoSpace))));
                return IoTicket::done(done);
            }
        };
        // Each request's pages went to consecutive flash pages unless an erase block
        // ended inside it; only then is its buffer copied into pieces.
        let mut batch = Vec::new();
        let mut kept: Vec<(usize, Option<AlignedBuf>, usize)> = Vec::new();
        let mut at = 0;
        for (index, request) in requests {
            let pages = request.buf.len() / PAGE as usize;
            let mine = &ppas[at..at + pages];
            at += pages;
            let pieces = runs(mine);
            if pieces.len() == 1 {
                kept.push((index, None, batch.len()));
                batch.push(IoRequest { op: IoOp::Write, offset_bytes: u64::from(mine[0]) * PAGE, buf: request.buf });
            } else {
                kept.push((index, None, usize::MAX));
                let mut page = 0;
                for run in pieces {
                    let mut buf = AlignedBuf::zeroed(run.len() * PAGE as usize);
                    buf.copy_from_slice(&request.buf[page * PAGE as usize..(page + run.len()) * PAGE as usize]);
                    page += run.len();
                    batch.push(IoRequest { op: IoOp::Write, offset_bytes: u64::from(run[0]) * PAGE, buf });
                }
                kept.last_mut().expect("just pushed").1 = Some(request.buf);
            }
        }
        let bytes = lpas.len() as u64 * PAGE;
        self.counters.block_write_bytes.fetch_add(bytes, Ordering::Relaxed);
        self.counters.flash_program_bytes.fetch_add(bytes, Ordering::Relaxed);
        let inner = Arc::clone(self);
        self.ftl.flash.submit(batch).then(move |outcome| {
            let ok = outcome.is_ok();
            {
                let mut f = inner.ftl.state.lock();
                for (i, (&lpa, &ppa)) in lpas.iter().zip(&ppas).enumerate() {
                    inner.ftl.write_done(&mut f, lpa, ppa);
                    let version = first_seq + i as u64;
                    if !ok {
                        // A failed write leaves the page as it was.
                        inner.ftl.discard(&mut f, ppa);
                    } else if inner.ftl.install(&mut f, lpa, ppa, version) {
                        inner.index.retain(lpa, |c| c.seq > version);
                    }
                }
            }
            if let Some(model) = inner.options.latency {
                settle(start, model.block(true, lpas.len() as u64));
            }
            let mut buffers: Vec<Option<AlignedBuf>> = match outcome {
                Ok(buffers) => buffers.into_iter().map(Some).collect(),
                Err(e) => return Err(e),
            };
            for (index, own, slot) in kept {
                let buf = match own {
                    Some(buf) => buf,
                    None => buffers[slot].take().expect("each passed-through buffer comes back once"),
                };
                done.push((index, Ok(buf)));
            }
            done.sort_unstable_by_key(|(index, _)| *index);
            done.into_iter().map(|(_, outcome)| outcome).collect()
        })
    }

    /// Write back the log: merge each page's committed entries into a fresh flash page
    /// (reading the old one only if the entries leave part of it uncovered), in batches;
    /// move entries of open transactions (and of pages with a block write in flight) to
    /// the head of the new region; then flush, free the old region and its TxLog.
    fn clean(&self) -> Result<()> {
        self.clean_log(true)
    }

    /// `switch`: commits during the cleaning go to the other TxLog. Recovery cleans
    /// without switching (nothing commits meanwhile, and after a crash in a cleaning
    /// both TxLogs may hold TxIDs that must stay until the log is written back).
    fn clean_log(&self, switch: bool) -> Result<()> {
        let _one = self.cleaning.lock();
        let (cut, old) = {
            let mut st = self.log.lock();
            let old = st.active;
            if switch {
                debug_assert!(st.txlogs[old ^ 1].is_empty(), "the TxLog cleaning switches to is empty");
                st.active ^= 1;
                self.dram.write_persist(Layout::active_txlog_at(), &(st.active as u64).to_le_bytes());
            }
            (st.tail, old)
        };
        let pages = self.index.pages();
        // A batch's new pages need free flash until the flush that releases the pages
        // they replace; on a small device the spare flash bounds the batch.
        let batch_pages = CLEAN_BATCH.min(self.ftl.spare_pages() as usize / 2).max(1);
        for batch in pages.chunks(batch_pages) {
            self.clean_batch(batch, cut)?;
        }
        let _media = self.media.write();
        let mut st = self.log.lock();
        self.ftl.flush(&mut self.ftl.state.lock())?;
        st.head = cut;
        self.dram.write_persist(Layout::head_at(), &cut.to_le_bytes());
        let (at, _) = self.layout.txlog_range(old);
        let used = st.txlogs[old].len() * 4;
        self.dram.zero(at, used);
        self.dram.persist(at, used);
        for txid in std::mem::take(&mut st.txlogs[old]) {
            st.committed.remove(&txid);
        }
        st.residual = st.used();
        self.counters.log_cleanings.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn clean_batch(&self, batch: &[u32], cut: u64) -> Result<()> {
        let _media = self.media.write();
        let mut st = self.log.lock();
        let mut plan: Vec<(u32, Vec<Chunk>)> = Vec::new();
        for &lpa in batch {
            let chunks: Vec<Chunk> = self.index.chunks(lpa).into_iter().filter(|c| c.pos < cut).collect();
            if chunks.is_empty() {
                continue;
            }
            let committed = |t: u32| t == 0 || st.committed.contains(&t);
            let writing = self.ftl.is_writing(&self.ftl.state.lock(), lpa);
            if writing || chunks.iter().any(|c| !committed(c.txid)) {
                self.migrate(&mut st, lpa, &chunks)?;
            } else {
                plan.push((lpa, chunks));
            }
        }
        if plan.is_empty() {
            return Ok(());
        }
        let mut f = self.ftl.state.lock();
        let partial: Vec<(usize, u32)> = plan
            .iter()
            .enumerate()
            .filter(|(_, (_, chunks))| !covers(chunks, 0..PAGE as usize))
            .filter_map(|(i, (lpa, _))| self.ftl.lookup(*lpa).map(|ppa| (i, ppa)))
            .collect();
        let ppas: Vec<u32> = partial.iter().map(|&(_, ppa)| ppa).collect();
        let mut pages = vec![vec![0u8; PAGE as usize]; plan.len()];
        for ((i, _), base) in partial.iter().zip(self.ftl.read_pages(&ppas)?.pages()) {
            pages[*i].copy_from_slice(base);
        }
        self.counters.log_base_reads.fetch_add(partial.len() as u64, Ordering::Relaxed);
        for ((_, chunks), page) in plan.iter().zip(pages.iter_mut()) {
            merge(page, chunks, &mut |chunk, bytes| self.read_log(chunk.pos + ENTRY_HEADER, bytes));
        }
        let lpas: Vec<u32> = plan.iter().map(|(lpa, _)| *lpa).collect();
        if self.ftl.needs_collection(lpas.len()) {
            self.ftl.collect(&mut f, lpas.len())?;
        }
        let targets = self.ftl.allocate(&mut f, &lpas, false)?;
        self.ftl.program(&targets, &pages.iter().map(Vec::as_slice).collect::<Vec<_>>())?;
        for ((lpa, chunks), target) in plan.iter().zip(targets) {
            let version = chunks.iter().map(|c| c.seq).max().expect("a planned page has chunks");
            if self.ftl.install(&mut f, *lpa, target, version) {
                self.index.retain(*lpa, |c| c.pos >= cut);
            }
        }
        self.counters.log_cleaned_pages.fetch_add(plan.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Copy a page's entries to the tail, keeping their order (`seq`); those already
    /// committed lose their TxID, whose TxLog the cleaning is about to empty.
    fn migrate(&self, st: &mut LogState, lpa: u32, chunks: &[Chunk]) -> Result<()> {
        for chunk in chunks {
            let mut data = vec![0u8; usize::from(chunk.len)];
            self.read_log(chunk.pos + ENTRY_HEADER, &mut data);
            let txid = if chunk.txid == 0 || st.committed.contains(&chunk.txid) { 0 } else { chunk.txid };
            let header = EntryHeader { kind: EntryKind::Data, txid, seq: chunk.seq, lpa, offset: chunk.offset, len: chunk.len };
            let pos = self
                .append(st, &header, &data)
                .map_err(|_| Error::InvalidArgument("the device's write log is full of open transactions; commit them".into()))?;
            self.index.relocate(lpa, chunk.seq, pos, txid);
            self.counters.log_migrated_bytes.fetch_add(EntryHeader::footprint(data.len()), Ordering::Relaxed);
        }
        self.verify(st);
        Ok(())
    }

    /// Rebuild the index from the scanned log, keep what committed and is newer than its
    /// flash page, write it all back, and start with an empty log and TxLogs.
    fn recover(&self, mut entries: Vec<(u64, EntryHeader)>) -> Result<MssdRecovery> {
        let mut report = MssdRecovery::default();
        entries.sort_unstable_by_key(|(_, e)| e.seq);
        {
            let st = self.log.lock();
            let mut f = self.ftl.state.lock();
            for (pos, entry) in entries {
                match entry.kind {
                    EntryKind::Pad => {}
                    EntryKind::Trim => {
                        if entry.seq > self.ftl.version(&f, entry.lpa) {
                            self.index.retain(entry.lpa, |_| false);
                            self.ftl.unmap(&mut f, entry.lpa, entry.seq);
                        }
                    }
                    EntryKind::Data if entry.txid != 0 && !st.committed.contains(&entry.txid) => report.dropped_uncommitted += 1,
                    EntryKind::Data if entry.seq <= self.ftl.version(&f, entry.lpa) => report.stale += 1,
                    EntryKind::Data => {
                        report.replayed += 1;
                        let chunk = Chunk { offset: entry.offset, len: entry.len, pos, seq: entry.seq, txid: 0 };
                        self.index.insert(entry.lpa, chunk);
                    }
                }
            }
        }
        self.clean_log(false)?;
        let mut st = self.log.lock();
        // Whole: a crash while a cleaning zeroed one can leave stale TxIDs past a zero.
        for which in 0..2 {
            let (at, len) = self.layout.txlog_range(which);
            self.dram.zero(at, len as usize);
            self.dram.persist(at, len as usize);
            st.txlogs[which].clear();
        }
        st.committed.clear();
        st.residual = st.used();
        Ok(report)
    }

    fn wake_cleaner(&self) -> Result<()> {
        // Once halted, the store that needs room cleans.
        if self.options.background_cleaning && !self.stop.load(Ordering::Acquire) {
            *self.wake.lock() = true;
            self.woken.notify_one();
            Ok(())
        } else {
            self.clean()
        }
    }
}

fn spawn_cleaner(inner: &Arc<Inner>) -> JoinHandle<()> {
    let weak: Weak<Inner> = Arc::downgrade(inner);
    std::thread::Builder::new()
        .name("mssd-cleaner".into())
        .spawn(move || loop {
            let Some(inner) = weak.upgrade() else { return };
            let run = {
                let mut wake = inner.wake.lock();
                if !*wake {
                    inner.woken.wait_for(&mut wake, Duration::from_millis(200));
                }
                std::mem::take(&mut *wake)
            };
            if inner.stop.load(Ordering::Acquire) {
                return;
            }
            if run {
                if let Err(e) = inner.clean() {
                    tracing::error!("memory-semantic SSD log cleaning failed: {e}");
                }
            }
        })
        .expect("spawn the log cleaner")
}

impl BlockDevice for MemorySemanticSsd {
    fn len_bytes(&self) -> u64 {
        u64::from(self.inner.layout.logical_pages) * PAGE
    }

    fn submit(&self, batch: Vec<IoRequest>) -> IoTicket {
        let (reads, writes): (Vec<_>, Vec<_>) = batch.into_iter().enumerate().partition(|(_, r)| r.op == IoOp::Read);
        for (_, request) in reads.iter().chain(&writes) {
            request.assert_aligned();
        }
        let done = if reads.is_empty() { Vec::new() } else { self.inner.read_blocks(reads) };
        if writes.is_empty() {
            return IoTicket::done(done);
        }
        self.inner.write_blocks(writes, done)
    }

    /// A read of any range through the block interface: the device reads the pages it
    /// spans (and merges its log over them), and the latency model charges them as such.
    fn read_buffered(&self, offset_bytes: u64, buf: &mut [u8]) -> Result<()> {
        let start = Instant::now();
        self.inner.read_range(offset_bytes, buf, false)?;
        self.inner.counters.block_read_bytes.fetch_add(buf.len() as u64, Ordering::Relaxed);
        if let Some(model) = self.inner.options.latency {
            let pages = (offset_bytes + buf.len() as u64).div_ceil(PAGE) - offset_bytes / PAGE;
            settle(start, model.block(false, pages));
        }
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        self.inner.ftl.flush(&mut self.inner.ftl.state.lock())
    }

    fn describe(&self) -> String {
        format!(
            "memory-semantic SSD emulator: flash on {}, DRAM on {}, {} MiB write log",
            self.inner.ftl.flash.describe(),
            self.inner.dram.describe(),
            self.inner.layout.log_bytes >> 20
        )
    }
}

#[cfg(test)]
mod tests;
