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

mod block;
mod cleaner;
mod ftl;
mod index;
mod latency;
mod layout;
mod log;
mod recovery;

use cleaner::spawn_cleaner;
use log::{line_span, pieces, read_log};
use recovery::{read_txlog, scan};

pub use latency::LatencyModel;
pub use layout::{dram_label, flash_label, MssdConfig, LINE, PAGE};

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use parking_lot::{Condvar, Mutex, RwLock};

use super::{AlignedBuf, BlockDevice, ByteTier, IoOp, IoRequest};
use crate::error::{DeviceProblem, Error, Result};
use ftl::Ftl;
use index::Index;
use latency::settle;
use layout::Layout;

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
    flash_program_metadata_bytes: "of the bytes programmed, those of pages counted as metadata (the volume's metadata area, or an exported device's --metadata-ranges)",
    flash_read_bytes: "bytes read from flash",
    flash_read_metadata_bytes: "of the bytes read from flash, those of pages counted as metadata",
    flash_flushes: "flushes of the flash image",
    log_cleanings: "write-log cleanings",
    log_cleaning_us: "microseconds spent cleaning the write log",
    log_full_waits: "stores (and trims) that found the write log full and waited for cleaning to make room",
    log_full_wait_us: "microseconds those stores waited",
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
    /// Block-interface writes land in the device's DRAM, in the write log, and reach flash
    /// when cleaning writes the log back; a flush makes them durable as a verify does
    /// stores (the battery keeps the DRAM). ByteFS's baselines run on the device this way:
    /// without its log-structured byte interface, with a data cache as large as its log
    /// (§5.1). Reads merge the cached pages over flash as they do stores.
    pub block_cache: bool,
}

impl Default for MssdOptions {
    fn default() -> MssdOptions {
        MssdOptions { latency: None, background_cleaning: true, clean_at_percent: 85, block_cache: false }
    }
}

/// A transaction of byte-interface stores (its TxID).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TxId(u32);

/// What opening the device recovered; the type lives with the volume's other reports.
pub use crate::stats::MssdRecovery;

/// Stores keep this much of the log free for cleaning's migrations.
const RESERVE_DIVISOR: u64 = 16;
/// Pages cleaning merges and programs per batch (the paper's 16 MiB write buffer).
const CLEAN_BATCH: usize = 4096;
/// A cleaning moves the log's head in this many steps.
const CLEAN_STEPS: u64 = 8;

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
    /// A cleaning is running: a store short of room waits on [`Inner::room`] for its
    /// next step instead of starting another cleaning behind it.
    cleaning: bool,
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
    /// Signalled (with `log` held) when a cleaning moves the head or ends.
    room: Condvar,
    stop: AtomicBool,
    /// A posted store ([`MemorySemanticSsd::post`]) failed: every later verify reports it.
    posted_failure: Mutex<Option<String>>,
    /// The latency model's fill of the FTL's write buffer.
    write_buffer: latency::WriteBuffer,
}

pub struct MemorySemanticSsd {
    inner: Arc<Inner>,
    cleaner: Mutex<Option<JoinHandle<()>>>,
    /// What the open recovered, for the volume's report.
    recovered: MssdRecovery,
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
        let started = Instant::now();
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
                cleaning: false,
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
            room: Condvar::new(),
            stop: AtomicBool::new(false),
            posted_failure: Mutex::new(None),
            write_buffer: latency::WriteBuffer::new(),
        });
        let scanned = started.elapsed();
        let recovering = Instant::now();
        let mut recovery = inner.recover(entries)?;
        let counters = inner.counters.snapshot();
        recovery.log_bytes = tail - head;
        recovery.scan_us = micros(scanned);
        recovery.clean_us = micros(recovering.elapsed());
        recovery.pages_written = counters.log_cleaned_pages;
        recovery.base_reads = counters.log_base_reads;
        recovery.total_us = micros(started.elapsed());
        let cleaner = options.background_cleaning.then(|| spawn_cleaner(&inner));
        Ok((MemorySemanticSsd { inner, cleaner: Mutex::new(cleaner), recovered: recovery }, recovery))
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

    /// What opening the device recovered and how long it took.
    pub fn recovery(&self) -> MssdRecovery {
        self.recovered
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

    /// Count the flash traffic of the pages overlapping these byte ranges as metadata
    /// (`flash_program_metadata_bytes`, `flash_read_metadata_bytes`), replacing earlier
    /// ranges: the device cannot tell what a page holds, so whoever lays out its space
    /// names the metadata (a volume its metadata area, `export-device` a client's map).
    pub fn count_as_metadata(&self, ranges: &[std::ops::Range<u64>]) {
        self.inner.ftl.count_as_metadata(ranges);
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
        Some(id) if id != layout.incarnation => Err(Error::WrongDevices(DeviceProblem::MssdHalves {
            flash: flash.describe(),
            flash_device: id,
            dram: dram.describe(),
            dram_device: layout.incarnation,
        })),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests;

fn micros(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}
