//! `scrap`'s residue store: WSBuffer's scrap pages, in DRAM.
//!
//! A scrap page is one SSD block's worth of memory (the volume's block is the scrap page).
//! Its header, the valid segments, is the block's map entry (`map::Chunks`), so headers and
//! data zones live apart as in the paper. The zones come from one anonymous mapping of
//! `--scrap-mem` bytes that the kernel backs lazily, so resident memory never exceeds the
//! cap. Nothing here survives the process: the store is volatile and the volume journals a
//! block only once it has been flushed to the SSD.

use super::{PmemPages, ResidueStore, UnitRequest};
use crate::device::PmemRegion;
use crate::error::{Error, Result};
use crate::map::PageNo;
use crate::meta::Ino;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

pub struct ScrapPages {
    zones: PmemPages,
    warmer: Warmer,
}

impl ScrapPages {
    /// Scrap pages of `page_bytes` in at most `cap_bytes` of memory (at least two pages).
    pub fn new(cap_bytes: u64, page_bytes: u32) -> Result<ScrapPages> {
        let count = cap_bytes / u64::from(page_bytes);
        if count < 2 {
            return Err(Error::InvalidArgument(format!(
                "scrap memory of {cap_bytes} bytes holds fewer than two {page_bytes}-byte scrap pages"
            )));
        }
        let region = Arc::new(PmemRegion::anonymous(count * u64::from(page_bytes))?);
        let warmer = Warmer::start(region.clone(), count, page_bytes)?;
        Ok(ScrapPages { zones: PmemPages::warm_first(region, 0, count, page_bytes), warmer })
    }

    /// Bytes of scrap memory touched ahead of the writers so far.
    pub fn warmed_bytes(&self) -> u64 {
        self.warmer.shared.warmed.load(Ordering::Acquire) * self.warmer.shared.page_bytes
    }
}

/// Touches scrap memory on a thread of its own, a window ahead of the highest scrap page
/// ever allocated, in batches of 32 pages (WSBuffer's allocation batch).
///
/// The kernel backs anonymous memory on first touch: a fault, zeroing and a mapping per
/// 4 KiB, about 3 µs each here. A writer that met them itself ran its first pass over a
/// fresh mount at half the speed of later passes (docs/SCRAP.md). The allocator takes
/// freed pages first ([`crate::layout::BitmapAllocator::warm_first`]), so the pages in
/// use stay below the high-water mark, and resident memory stays within a window of the
/// most pages ever in use.
struct Warmer {
    shared: Arc<WarmerShared>,
    thread: Option<JoinHandle<()>>,
}

struct WarmerShared {
    region: Arc<PmemRegion>,
    page_bytes: u64,
    capacity: u64,
    /// Pages kept warm beyond the high-water mark.
    window: u64,
    /// One past the highest page ever allocated.
    high_water: AtomicU64,
    /// Pages below this are backed by memory.
    warmed: AtomicU64,
    stop: AtomicBool,
}

/// Pages touched per batch.
const WARM_BATCH_PAGES: u64 = 32;

impl Warmer {
    fn start(region: Arc<PmemRegion>, capacity: u64, page_bytes: u32) -> Result<Warmer> {
        let page_bytes = u64::from(page_bytes);
        // An eighth of the memory, within 8–256 MiB: a writer at memory speed stays
        // behind it, and an idle volume holds at most this much more than it used.
        let window_bytes = (capacity * page_bytes / 8).clamp(8 << 20, 256 << 20);
        let shared = Arc::new(WarmerShared {
            region,
            page_bytes,
            capacity,
            window: window_bytes.div_ceil(page_bytes).min(capacity),
            high_water: AtomicU64::new(0),
            warmed: AtomicU64::new(0),
            stop: AtomicBool::new(false),
        });
        let worker = shared.clone();
        let thread = std::thread::Builder::new()
            .name("scrap-warmer".into())
            .spawn(move || worker.run())
            .map_err(|e| Error::io("start the scrap memory warmer", e))?;
        Ok(Warmer { shared, thread: Some(thread) })
    }

    /// `top` is one past the highest page just allocated.
    fn allocated_up_to(&self, top: u64) {
        let shared = &self.shared;
        let before = shared.high_water.fetch_max(top, Ordering::AcqRel);
        if top > before && top + shared.window / 2 > shared.warmed.load(Ordering::Acquire) {
            if let Some(thread) = &self.thread {
                thread.thread().unpark();
            }
        }
    }
}

impl WarmerShared {
    fn run(&self) {
        while !self.stop.load(Ordering::Acquire) {
            // Nothing before the first page is taken: a volume that holds no scrap pages
            // (idle, read-only) holds no scrap memory.
            let high_water = self.high_water.load(Ordering::Acquire);
            let target = if high_water == 0 { 0 } else { (high_water + self.window).min(self.capacity) };
            let warmed = self.warmed.load(Ordering::Acquire);
            if warmed >= target {
                std::thread::park();
                continue;
            }
            let end = target.min(warmed + WARM_BATCH_PAGES);
            // Touching is only a head start: a kernel without MADV_POPULATE_WRITE leaves
            // the faults to the writers, as before.
            if let Err(e) = self.region.prefault(warmed * self.page_bytes, (end - warmed) * self.page_bytes) {
                tracing::debug!("scrap memory is not touched ahead: {e}");
                return;
            }
            self.warmed.store(end, Ordering::Release);
        }
    }
}

impl Drop for Warmer {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(thread) = self.thread.take() {
            thread.thread().unpark();
            let _ = thread.join();
        }
    }
}

impl ResidueStore for ScrapPages {
    fn name(&self) -> &'static str {
        "scrap mem"
    }

    fn describe(&self) -> String {
        format!("{} DRAM scrap pages of {} KiB (volatile)", self.capacity_units(), self.unit_bytes() / 1024)
    }
    fn unit_bytes(&self) -> u32 {
        self.zones.unit_bytes()
    }
    fn capacity_units(&self) -> u64 {
        self.zones.capacity_units()
    }
    fn used_units(&self) -> u64 {
        self.zones.used_units()
    }
    fn peak_used_units(&self) -> u64 {
        self.zones.peak_used_units()
    }
    fn allocate(&self, requests: &[UnitRequest]) -> Option<Vec<PageNo>> {
        let units = self.zones.allocate(requests)?;
        if let Some(top) = units.iter().map(|unit| unit.0 + 1).max() {
            self.warmer.allocated_up_to(top);
        }
        Some(units)
    }
    fn free(&self, units: &[PageNo]) {
        self.zones.free(units);
    }
    fn claim(&self, unit: PageNo, object: Ino, lblock: u64) -> bool {
        self.zones.claim(unit, object, lblock)
    }
    fn write(&self, unit: PageNo, offset: u32, data: &[u8]) {
        self.zones.write(unit, offset, data);
    }
    fn zero(&self, unit: PageNo, offset: u32, len: u32) {
        self.zones.zero(unit, offset, len);
    }
    fn read(&self, unit: PageNo, offset: u32, out: &mut [u8]) -> crate::error::Result<()> {
        self.zones.read(unit, offset, out)
    }
    /// Volatile: nothing to do; durability comes from flushing the block to the SSD.
    fn persist(&self, _unit: PageNo, _offset: u32, _len: u32) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    const PAGE: u32 = 256 * 1024;

    fn wait_for(what: &str, done: impl Fn() -> bool) {
        let start = Instant::now();
        while !done() {
            assert!(start.elapsed() < Duration::from_secs(20), "{what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn memory_is_touched_a_window_ahead_of_the_highest_page_and_never_past_the_end() {
        // 64 pages of 256 KiB: the window is its 8 MiB floor, 32 pages.
        let pages = ScrapPages::new(64 * u64::from(PAGE), PAGE).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(pages.warmed_bytes(), 0, "nothing is touched before a page is taken");

        let request = UnitRequest { object: Ino(2), lblock: 0, bytes: PAGE };
        let units = pages.allocate(&[request]).unwrap();
        assert_eq!(units, [PageNo(0)]);
        wait_for("a window past the first page", || pages.warmed_bytes() == (1 + 32) * u64::from(PAGE));
        let units = pages.allocate(&[request; 7]).unwrap();
        assert_eq!(units.last(), Some(&PageNo(7)));
        pages.write(units[6], 100, b"kept");
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(pages.warmed_bytes(), 33 * u64::from(PAGE), "more than half a window ahead still: no batch yet");
        let more = pages.allocate(&[request; 12]).unwrap();
        assert_eq!(more.last(), Some(&PageNo(19)));
        wait_for("a window past page 19", || pages.warmed_bytes() == (20 + 32) * u64::from(PAGE));
        let more = pages.allocate(&[request; 28]).unwrap();
        assert_eq!(more.last(), Some(&PageNo(47)));
        wait_for("up to the end of the memory", || pages.warmed_bytes() == 64 * u64::from(PAGE));
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(pages.warmed_bytes(), 64 * u64::from(PAGE), "never past the end");

        // Touching keeps what was written and reads as zeros where nothing was.
        let mut out = [0u8; 4];
        pages.read(units[6], 100, &mut out).unwrap();
        assert_eq!(&out, b"kept");
        pages.read(more[27], 0, &mut out).unwrap();
        assert_eq!(out, [0; 4]);
    }
}
