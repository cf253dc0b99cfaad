//! `byte`'s residue store: units in a zone of the memory-semantic SSD's address space,
//! written through its byte interface. A store lands in the device's write log (its
//! battery-backed DRAM), so a unit costs the host only the cache lines it changes; the
//! device's log cleaning, not the host, moves those lines to flash. Allocating a unit
//! trims its page (a posted trim, durable with the unit's first write), so a new unit
//! reads as zeros without a page of zero stores; freeing one trims it too, so cleaning
//! never writes a dead unit's lines.
//!
//! The host keeps copies of whole units, as ByteFS's page cache keeps the pages it wrote
//! through the byte interface: a read of a copied unit asks the device for nothing.

use std::sync::Arc;

use parking_lot::Mutex;
use quick_cache::sync::Cache;

use super::{ResidueStore, UnitRequest};
use crate::device::mssd::MemorySemanticSsd;
use crate::device::BlockDevice;
use crate::error::Result;
use crate::layout::BitmapAllocator;
use crate::map::PageNo;
use crate::meta::Ino;

/// Residue reads of at most this many bytes are cache-line loads; larger ones read the page
/// through the block interface. At ByteFS's Table 4 prices, 8 loads (4.8 µs each) cost
/// about one flash page read (40 µs).
pub const BYTE_READ_MAX: u64 = 512;

pub struct ByteLogPages {
    device: Arc<MemorySemanticSsd>,
    zone_offset: u64,
    page_bytes: u32,
    allocator: BitmapAllocator,
    copies: Option<UnitCopies>,
}

/// The host's copies of whole units. Every store to a unit also changes its copy, so a
/// copy is always the unit's bytes as the device will return them. Nothing here is
/// durable: a crash loses the copies and nothing else.
struct UnitCopies {
    cache: Cache<u64, Arc<[u8]>>,
    /// Counts changes to units. Reading a unit from the device happens outside this lock,
    /// so a store may land meanwhile; the copy read is kept only if no change came
    /// between the read and the keep (changes and keeps are ordered by the lock).
    changes: Mutex<u64>,
}

impl UnitCopies {
    /// `data` was stored at `offset` of `unit`: its copy gets the same bytes.
    fn stored(&self, unit: PageNo, offset: usize, data: &[u8]) {
        let mut changes = self.changes.lock();
        *changes += 1;
        if let Some(copy) = self.cache.get(&unit.0) {
            let mut page = copy.to_vec();
            page[offset..offset + data.len()].copy_from_slice(data);
            self.cache.insert(unit.0, Arc::from(page));
        }
    }

    /// `unit` was freed, or the device refused a store to it: it has no copy any more.
    fn forget(&self, unit: PageNo) {
        let mut changes = self.changes.lock();
        *changes += 1;
        self.cache.remove(&unit.0);
    }

    /// Keep `page`, read from the device when the change count was `seen`.
    fn keep(&self, unit: PageNo, page: Vec<u8>, seen: u64) {
        let changes = self.changes.lock();
        if *changes == seen {
            self.cache.insert(unit.0, Arc::from(page));
        }
    }
}

impl ByteLogPages {
    /// `page_count` units of `page_bytes` at byte `zone_offset` of the device; the host
    /// keeps copies of at most `copied_units` of them.
    pub fn new(device: Arc<MemorySemanticSsd>, zone_offset: u64, page_count: u64, page_bytes: u32, copied_units: u64) -> ByteLogPages {
        assert!(zone_offset + page_count * u64::from(page_bytes) <= device.len_bytes(), "the residue zone fits the device");
        let copied_units = copied_units.min(page_count);
        let copies = (copied_units > 0).then(|| UnitCopies { cache: Cache::new(copied_units as usize), changes: Mutex::new(0) });
        ByteLogPages { device, zone_offset, page_bytes, allocator: BitmapAllocator::new(page_count, &[]), copies }
    }

    fn at(&self, unit: PageNo, offset: u32, len: usize) -> u64 {
        assert!(offset as usize + len <= self.page_bytes as usize, "access within one unit");
        self.zone_offset + unit.0 * u64::from(self.page_bytes) + u64::from(offset)
    }

    /// Store `data` at `offset` of `unit`, and into its copy.
    fn store(&self, unit: PageNo, offset: u32, data: &[u8]) {
        let taken = self.device.post(self.at(unit, offset, data.len()), data);
        match &self.copies {
            Some(copies) if taken => copies.stored(unit, offset as usize, data),
            Some(copies) => copies.forget(unit),
            None => {}
        }
    }

    /// ByteFS's choice for reads: a few lines as loads, more as a block read of the page,
    /// which the device merges with its log (each load is a PCIe round trip).
    fn read_device(&self, unit: PageNo, offset: u32, out: &mut [u8]) -> Result<()> {
        let at = self.at(unit, offset, out.len());
        if out.len() as u64 <= BYTE_READ_MAX {
            self.device.load(at, out)
        } else {
            self.device.read_buffered(at, out)
        }
    }
}

impl ResidueStore for ByteLogPages {
    fn name(&self) -> &'static str {
        "byte log"
    }

    fn describe(&self) -> String {
        format!("{} units of {} bytes in the memory-semantic SSD's write log (byte interface)", self.allocator.capacity(), self.page_bytes)
    }
    fn unit_bytes(&self) -> u32 {
        self.page_bytes
    }
    fn capacity_units(&self) -> u64 {
        self.allocator.capacity()
    }
    fn used_units(&self) -> u64 {
        self.allocator.used_count()
    }
    fn peak_used_units(&self) -> u64 {
        self.allocator.peak_used_count()
    }
    /// Each unit's page is trimmed first: a crash between a free and its trim may have
    /// left a free unit holding old bytes. The trim is posted, so the verify that makes
    /// the unit's bytes durable makes it durable too, before any commit names the unit.
    fn allocate(&self, requests: &[UnitRequest]) -> Option<Vec<PageNo>> {
        let units: Vec<PageNo> = self.allocator.allocate(requests.len())?.into_iter().map(PageNo).collect();
        for unit in &units {
            self.device.post_trim(self.at(*unit, 0, 0), u64::from(self.page_bytes));
            if let Some(copies) = &self.copies {
                copies.cache.insert(unit.0, Arc::from(vec![0; self.page_bytes as usize]));
            }
        }
        Some(units)
    }
    fn fresh_units_read_zero(&self) -> bool {
        true
    }
    /// The units' pages are trimmed: their log entries are void and cleaning skips them.
    /// A unit is freed only after the commit that unmapped it, so a failed trim loses
    /// nothing; it only leaves the lines for cleaning to write.
    fn free(&self, units: &[PageNo]) {
        for unit in units {
            if let Some(copies) = &self.copies {
                copies.forget(*unit);
            }
            if let Err(e) = self.device.trim(self.at(*unit, 0, 0), u64::from(self.page_bytes)) {
                tracing::warn!("trim a freed residue unit: {e}");
            }
        }
        self.allocator.free(units.iter().map(|p| p.0));
    }
    fn claim(&self, unit: PageNo, _object: Ino, _lblock: u64) -> bool {
        self.allocator.claim(unit.0)
    }
    /// A posted store: a failure surfaces at the next verify, which the commit that would
    /// map the unit runs, so the write then fails unacknowledged.
    fn write(&self, unit: PageNo, offset: u32, data: &[u8]) {
        self.store(unit, offset, data);
    }
    fn zero(&self, unit: PageNo, offset: u32, len: u32) {
        if len > 0 {
            self.store(unit, offset, &vec![0u8; len as usize]);
        }
    }
    /// From the unit's copy, else from the device. A read too large for loads reads the
    /// whole unit (one page through the block interface, the same price as part of it)
    /// and keeps it.
    fn read(&self, unit: PageNo, offset: u32, out: &mut [u8]) -> Result<()> {
        let Some(copies) = &self.copies else { return self.read_device(unit, offset, out) };
        let at = offset as usize;
        if let Some(copy) = copies.cache.get(&unit.0) {
            out.copy_from_slice(&copy[at..at + out.len()]);
            return Ok(());
        }
        if out.len() as u64 <= BYTE_READ_MAX {
            return self.read_device(unit, offset, out);
        }
        let seen = *copies.changes.lock();
        let mut page = vec![0; self.page_bytes as usize];
        self.read_device(unit, 0, &mut page)?;
        out.copy_from_slice(&page[at..at + out.len()]);
        copies.keep(unit, page, seen);
        Ok(())
    }
    fn drop_copies(&self) {
        if let Some(copies) = &self.copies {
            copies.cache.clear();
        }
    }
    /// The write-verify read: every store so far is durable.
    fn persist(&self, _unit: PageNo, _offset: u32, _len: u32) {
        if let Err(e) = self.device.verify_posted() {
            tracing::error!("{e}");
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::device::mssd::{MssdConfig, MssdOptions};
    use crate::device::{ByteTier, PmemRegion, SimSsd};
    use crate::geometry::MIB;

    const PAGE: u32 = 4096;

    fn device() -> Arc<MemorySemanticSsd> {
        let config = MssdConfig { log_bytes: MIB, txlog_bytes: 16 << 10, pages_per_erase_block: 16, ..MssdConfig::new(MIB) };
        let (dram, flash) = MemorySemanticSsd::sizes(&config).unwrap();
        let dram = Arc::new(PmemRegion::anonymous(dram).unwrap()) as Arc<dyn ByteTier>;
        let options = MssdOptions { background_cleaning: false, ..MssdOptions::default() };
        Arc::new(MemorySemanticSsd::format(Arc::new(SimSsd::new(flash)), dram, &config, options).unwrap())
    }

    fn request() -> UnitRequest {
        UnitRequest { object: Ino(2), lblock: 0, bytes: PAGE }
    }

    /// A unit a crash freed without its trim (the freeing commit landed, the trim did not)
    /// still holds old bytes on the device; once allocated again it must read as zeros,
    /// since the write path then stores only the new bytes.
    #[test]
    fn a_unit_left_untrimmed_by_a_crash_reads_as_zeros_when_allocated_again() {
        let device = device();
        let before = ByteLogPages::new(Arc::clone(&device), 0, 4, PAGE, 0);
        let unit = before.allocate(&[request()]).unwrap()[0];
        before.write(unit, 0, &[0xAA; PAGE as usize]);
        before.persist(unit, 0, PAGE);
        // Reopened: nothing claims the unit, so it is free, with its bytes still there.
        let after = ByteLogPages::new(Arc::clone(&device), 0, 4, PAGE, 0);
        let again = after.allocate(&[request()]).unwrap()[0];
        assert_eq!(again, unit);
        assert!(after.fresh_units_read_zero());
        let mut out = vec![0xFF; PAGE as usize];
        after.read(again, 0, &mut out).unwrap();
        assert!(out.iter().all(|&b| b == 0), "a fresh unit read old bytes");
        after.write(again, 100, b"new");
        after.persist(again, 100, 3);
        after.read(again, 0, &mut out).unwrap();
        assert_eq!(&out[100..103], b"new");
        assert!(out[..100].iter().chain(&out[103..]).all(|&b| b == 0));
    }

    /// A fresh unit costs one trim, not a page of zero stores: a 100-byte piece is two
    /// cache lines through the byte interface.
    #[test]
    fn a_small_piece_in_a_fresh_unit_stores_only_its_own_lines() {
        let device = device();
        let pages = ByteLogPages::new(Arc::clone(&device), 0, 4, PAGE, 0);
        let unit = pages.allocate(&[request()]).unwrap()[0];
        let stored = device.stats().byte_store_bytes;
        pages.write(unit, 0, &[7; 100]);
        pages.persist(unit, 0, 100);
        assert_eq!(device.stats().byte_store_bytes - stored, 128);
        assert_eq!(device.stats().trimmed_pages, 1);
    }

    /// A read of a few lines is loads; a larger one is a block read of the page, which
    /// the device merges with its log: the same bytes either way.
    #[test]
    fn small_reads_are_loads_and_large_ones_block_reads() {
        let device = device();
        let pages = ByteLogPages::new(Arc::clone(&device), 0, 4, PAGE, 0);
        let unit = pages.allocate(&[request()]).unwrap()[0];
        let data: Vec<u8> = (0..3000u32).map(|i| (i % 253) as u8 + 1).collect();
        pages.write(unit, 50, &data);
        pages.persist(unit, 50, data.len() as u32);
        let before = device.stats();
        let mut small = vec![0u8; BYTE_READ_MAX as usize];
        pages.read(unit, 64, &mut small).unwrap();
        assert_eq!(small, data[14..14 + small.len()]);
        let after_small = device.stats();
        assert_eq!(after_small.byte_load_bytes - before.byte_load_bytes, BYTE_READ_MAX);
        assert_eq!(after_small.block_read_bytes, before.block_read_bytes);
        let mut whole = vec![0xFF; PAGE as usize];
        pages.read(unit, 0, &mut whole).unwrap();
        assert!(whole[..50].iter().chain(&whole[3050..]).all(|&b| b == 0));
        assert_eq!(&whole[50..3050], &data[..]);
        let after_large = device.stats();
        assert_eq!(after_large.byte_load_bytes, after_small.byte_load_bytes);
        assert_eq!(after_large.block_read_bytes - after_small.block_read_bytes, u64::from(PAGE));
    }

    fn device_reads(device: &MemorySemanticSsd) -> u64 {
        let stats = device.stats();
        stats.block_read_bytes + stats.byte_load_bytes
    }

    /// A unit the host wrote or read whole is read again from its copy; every store,
    /// zeroing and free follows the copy, and without copies every read asks the device.
    #[test]
    fn the_host_reads_a_unit_again_from_its_copy() {
        let device = device();
        let pages = ByteLogPages::new(Arc::clone(&device), 0, 4, PAGE, 4);
        let unit = pages.allocate(&[request()]).unwrap()[0];
        pages.write(unit, 100, &[5; 3000]);
        pages.zero(unit, 200, 10);
        pages.persist(unit, 0, PAGE);
        let mut expect = vec![0u8; PAGE as usize];
        expect[100..3100].fill(5);
        expect[200..210].fill(0);
        let mut out = vec![0xFF; PAGE as usize];
        let before = device_reads(&device);
        pages.read(unit, 0, &mut out).unwrap();
        assert_eq!(out, expect);
        let mut small = [0xFF; 64];
        pages.read(unit, 190, &mut small).unwrap();
        assert_eq!(small[..], expect[190..254]);
        assert_eq!(device_reads(&device), before, "a fresh unit's copy is zeros plus every store");

        // Dropped: a small read is loads and keeps nothing; a large one reads the page once.
        pages.drop_copies();
        pages.read(unit, 190, &mut small).unwrap();
        assert_eq!(small[..], expect[190..254]);
        pages.read(unit, 1000, &mut out[..1000]).unwrap();
        assert_eq!(out[..1000], expect[1000..2000]);
        let after_miss = device_reads(&device);
        // 64 bytes at 190 span two lines.
        assert_eq!(after_miss - before, 128 + u64::from(PAGE));
        pages.read(unit, 0, &mut out).unwrap();
        assert_eq!(out, expect);
        pages.write(unit, 4000, b"tail");
        expect[4000..4004].copy_from_slice(b"tail");
        pages.read(unit, 0, &mut out).unwrap();
        assert_eq!(out, expect);
        assert_eq!(device_reads(&device), after_miss);

        // Freed and allocated again: zeros, from the copy made at allocation.
        pages.free(&[unit]);
        let all = pages.allocate(&[request(), request(), request(), request()]).unwrap();
        let again = unit;
        assert!(all.contains(&again));
        pages.read(again, 0, &mut out).unwrap();
        assert!(out.iter().all(|&b| b == 0));
        assert_eq!(device_reads(&device), after_miss);

        // No copies: the same reads go to the device.
        let uncached = ByteLogPages::new(Arc::clone(&device), 0, 4, PAGE, 0);
        uncached.read(again, 0, &mut out).unwrap();
        uncached.read(again, 0, &mut out).unwrap();
        assert_eq!(device_reads(&device) - after_miss, 2 * u64::from(PAGE));
    }

    /// A page read from the device while a store landed may lack the store: it is not
    /// kept, and the next read sees the store.
    #[test]
    fn a_page_read_across_a_store_is_not_kept() {
        let device = device();
        let pages = ByteLogPages::new(Arc::clone(&device), 0, 4, PAGE, 4);
        let unit = pages.allocate(&[request()]).unwrap()[0];
        pages.drop_copies();
        let copies = pages.copies.as_ref().unwrap();
        let seen = *copies.changes.lock();
        let mut stale = vec![0u8; PAGE as usize];
        pages.read_device(unit, 0, &mut stale).unwrap();
        pages.write(unit, 0, b"new");
        copies.keep(unit, stale, seen);
        let mut out = [0u8; 3];
        pages.read(unit, 0, &mut out).unwrap();
        assert_eq!(&out, b"new");
    }

    proptest::proptest! {
        /// Against a plain array of the units' bytes, with room for one copy of two units:
        /// every read shows the newest bytes, whatever was copied, evicted or dropped.
        #[test]
        fn reads_with_copies_show_what_was_stored(
            ops in proptest::collection::vec((0u8..5, 0u32..2, 0u32..PAGE, 1u32..PAGE, proptest::prelude::any::<u8>()), 1..60)
        ) {
            let device = device();
            let pages = ByteLogPages::new(Arc::clone(&device), 0, 2, PAGE, 1);
            let units = pages.allocate(&[request(), request()]).unwrap();
            let mut model = vec![vec![0u8; PAGE as usize]; 2];
            for (kind, which, offset, len, byte) in ops {
                let (unit, len) = (units[which as usize], len.min(PAGE - offset));
                let range = offset as usize..(offset + len) as usize;
                match kind {
                    0 => {
                        pages.write(unit, offset, &vec![byte; len as usize]);
                        model[which as usize][range].fill(byte);
                    }
                    1 => {
                        pages.zero(unit, offset, len);
                        model[which as usize][range].fill(0);
                    }
                    2 => pages.drop_copies(),
                    _ => {
                        let mut out = vec![0xEE; len as usize];
                        pages.read(unit, offset, &mut out).unwrap();
                        proptest::prop_assert_eq!(&out[..], &model[which as usize][range]);
                    }
                }
            }
        }
    }
}
