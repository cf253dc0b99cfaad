//! `byte`'s residue store: units in a zone of the memory-semantic SSD's address space,
//! written through its byte interface. A store lands in the device's write log (its
//! battery-backed DRAM), so a unit costs the host only the cache lines it changes; the
//! device's log cleaning, not the host, moves those lines to flash. Freeing a unit trims
//! its page, so cleaning never writes a dead unit's lines.

use std::sync::Arc;

use super::{ResidueStore, UnitRequest};
use crate::device::mssd::MemorySemanticSsd;
use crate::device::BlockDevice;
use crate::error::Result;
use crate::layout::BitmapAllocator;
use crate::map::PageNo;
use crate::meta::Ino;

pub struct ByteLogPages {
    device: Arc<MemorySemanticSsd>,
    zone_offset: u64,
    page_bytes: u32,
    allocator: BitmapAllocator,
}

impl ByteLogPages {
    /// `page_count` units of `page_bytes` at byte `zone_offset` of the device.
    pub fn new(device: Arc<MemorySemanticSsd>, zone_offset: u64, page_count: u64, page_bytes: u32) -> ByteLogPages {
        assert!(zone_offset + page_count * u64::from(page_bytes) <= device.len_bytes(), "the residue zone fits the device");
        ByteLogPages { device, zone_offset, page_bytes, allocator: BitmapAllocator::new(page_count, &[]) }
    }

    fn at(&self, unit: PageNo, offset: u32, len: usize) -> u64 {
        assert!(offset as usize + len <= self.page_bytes as usize, "access within one unit");
        self.zone_offset + unit.0 * u64::from(self.page_bytes) + u64::from(offset)
    }
}

impl ResidueStore for ByteLogPages {
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
    fn allocate(&self, requests: &[UnitRequest]) -> Option<Vec<PageNo>> {
        self.allocator.allocate(requests.len()).map(|ids| ids.into_iter().map(PageNo).collect())
    }
    /// The units' pages are trimmed: their log entries are void and cleaning skips them.
    /// A unit is freed only after the commit that unmapped it, so a failed trim loses
    /// nothing; it only leaves the lines for cleaning to write.
    fn free(&self, units: &[PageNo]) {
        for unit in units {
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
        self.device.post(self.at(unit, offset, data.len()), data);
    }
    fn zero(&self, unit: PageNo, offset: u32, len: u32) {
        if len > 0 {
            self.device.post(self.at(unit, offset, len as usize), &vec![0u8; len as usize]);
        }
    }
    fn read(&self, unit: PageNo, offset: u32, out: &mut [u8]) -> Result<()> {
        self.device.load(self.at(unit, offset, out.len()), out)
    }
    /// The write-verify read: every store so far is durable.
    fn persist(&self, _unit: PageNo, _offset: u32, _len: u32) {
        if let Err(e) = self.device.verify_posted() {
            tracing::error!("{e}");
        }
    }
}
