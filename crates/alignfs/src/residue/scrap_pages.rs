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
use std::sync::Arc;

pub struct ScrapPages {
    zones: PmemPages,
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
        Ok(ScrapPages { zones: PmemPages::warm_first(region, 0, count, page_bytes) })
    }
}

impl ResidueStore for ScrapPages {
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
        self.zones.allocate(requests)
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
