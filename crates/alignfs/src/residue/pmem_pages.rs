//! `orch`'s residue store: fixed-size pages in the fast tier's page zone, persisted on
//! every write (write returns only after its residue is durable).

use std::sync::Arc;

use super::{ResidueStore, UnitRequest};
use crate::device::ByteTier;
use crate::layout::BitmapAllocator;
use crate::map::PageNo;
use crate::meta::Ino;

pub struct PmemPages {
    region: Arc<dyn ByteTier>,
    zone_offset: u64,
    page_bytes: u32,
    allocator: BitmapAllocator,
}

impl PmemPages {
    pub fn new(region: Arc<dyn ByteTier>, zone_offset: u64, page_count: u64, page_bytes: u32) -> PmemPages {
        PmemPages::with_allocator(region, zone_offset, page_bytes, BitmapAllocator::new(page_count, &[]))
    }

    /// Pages in memory the kernel backs on first touch, taken warm first
    /// ([`BitmapAllocator::warm_first`]).
    pub fn warm_first(region: Arc<dyn ByteTier>, zone_offset: u64, page_count: u64, page_bytes: u32) -> PmemPages {
        PmemPages::with_allocator(region, zone_offset, page_bytes, BitmapAllocator::warm_first(page_count))
    }

    fn with_allocator(region: Arc<dyn ByteTier>, zone_offset: u64, page_bytes: u32, allocator: BitmapAllocator) -> PmemPages {
        let end = zone_offset + allocator.capacity() * u64::from(page_bytes);
        assert!(end <= region.len_bytes(), "page zone fits the region");
        PmemPages { region, zone_offset, page_bytes, allocator }
    }

    /// Memory reads cannot fail: [`ResidueStore::read`] without the `Result`.
    pub fn copy_out(&self, unit: PageNo, offset: u32, out: &mut [u8]) {
        self.region.read(self.at(unit, offset, out.len()), out);
    }

    fn at(&self, unit: PageNo, offset: u32, len: usize) -> u64 {
        assert!(offset as usize + len <= self.page_bytes as usize, "access within one page");
        self.zone_offset + unit.0 * u64::from(self.page_bytes) + u64::from(offset)
    }
}

impl ResidueStore for PmemPages {
    fn name(&self) -> &'static str {
        "fast tier"
    }

    fn describe(&self) -> String {
        format!("{} fast pages of {} bytes in {}", self.allocator.capacity(), self.page_bytes, self.region.describe())
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
    /// Numbered pages: the hints do not matter.
    fn allocate(&self, requests: &[UnitRequest]) -> Option<Vec<PageNo>> {
        self.allocator.allocate(requests.len()).map(|ids| ids.into_iter().map(PageNo).collect())
    }
    fn free(&self, units: &[PageNo]) {
        self.allocator.free(units.iter().map(|p| p.0));
    }
    fn claim(&self, unit: PageNo, _object: Ino, _lblock: u64) -> bool {
        self.allocator.claim(unit.0)
    }
    fn write(&self, unit: PageNo, offset: u32, data: &[u8]) {
        self.region.write(self.at(unit, offset, data.len()), data);
    }
    fn zero(&self, unit: PageNo, offset: u32, len: u32) {
        self.region.zero(self.at(unit, offset, len as usize), len as usize);
    }
    fn read(&self, unit: PageNo, offset: u32, out: &mut [u8]) -> crate::error::Result<()> {
        self.copy_out(unit, offset, out);
        Ok(())
    }
    fn persist(&self, unit: PageNo, offset: u32, len: u32) {
        self.region.persist(self.at(unit, offset, len as usize), len as usize);
    }
}
