//! `nvstore`'s residue store: NVStore's fragment pages (FP). One unit is one block's page
//! in DRAM, where reads find the block's unaligned bytes; each persisted piece is one
//! fragment put into the KV store ([`FragmentLog`]), which is what a crash keeps and what
//! the volume rebuilds its pages from at open.

use std::sync::Arc;

use super::{PmemPages, ResidueStore, UnitRequest};
use crate::device::PmemRegion;
use crate::error::{Error, Result};
use crate::kv::records::BlockKey;
use crate::kv::{FragmentBlock, FragmentLog};
use crate::map::{BlockEntry, Chunks, Overlay, PageNo};
use crate::meta::{Ino, MetaState};

pub struct KvFragments {
    pages: PmemPages,
    log: Arc<FragmentLog>,
}

impl KvFragments {
    /// Fragment pages of `page_bytes` in at most `cap_bytes` of memory, never fewer than
    /// `at_least` (the pages the store holds fragments for at open) plus two.
    pub fn new(log: Arc<FragmentLog>, cap_bytes: u64, page_bytes: u32, at_least: u64) -> Result<KvFragments> {
        let count = (cap_bytes / u64::from(page_bytes)).max(at_least + 2);
        let bytes = count.checked_mul(u64::from(page_bytes)).ok_or_else(|| Error::InvalidArgument("fragment memory overflows".into()))?;
        let region = Arc::new(PmemRegion::anonymous(bytes)?);
        Ok(KvFragments { pages: PmemPages::new(region, 0, count, page_bytes), log })
    }
}

impl ResidueStore for KvFragments {
    fn name(&self) -> &'static str {
        "fragments"
    }

    fn describe(&self) -> String {
        format!("{} fragment pages of {} KiB in DRAM, their fragments in the KV store", self.capacity_units(), self.unit_bytes() / 1024)
    }
    fn unit_bytes(&self) -> u32 {
        self.pages.unit_bytes()
    }
    fn capacity_units(&self) -> u64 {
        self.pages.capacity_units()
    }
    fn used_units(&self) -> u64 {
        self.pages.used_units()
    }
    fn peak_used_units(&self) -> u64 {
        self.pages.peak_used_units()
    }
    fn allocate(&self, requests: &[UnitRequest]) -> Option<Vec<PageNo>> {
        let units = self.pages.allocate(requests)?;
        for (unit, request) in units.iter().zip(requests) {
            self.log.register(*unit, BlockKey { object: request.object, lblock: request.lblock }, None);
        }
        Some(units)
    }
    fn free(&self, units: &[PageNo]) {
        for unit in units {
            self.log.release(*unit);
        }
        self.pages.free(units);
    }
    /// The log learnt the unit's fragments when the volume rebuilt its page from them.
    fn claim(&self, unit: PageNo, object: Ino, lblock: u64) -> bool {
        self.pages.claim(unit, object, lblock)
    }
    fn write(&self, unit: PageNo, offset: u32, data: &[u8]) {
        self.pages.write(unit, offset, data);
    }
    fn zero(&self, unit: PageNo, offset: u32, len: u32) {
        self.pages.zero(unit, offset, len);
    }
    fn read(&self, unit: PageNo, offset: u32, out: &mut [u8]) -> Result<()> {
        self.pages.read(unit, offset, out)
    }
    /// One fragment put of the range as the page holds it now.
    fn persist(&self, unit: PageNo, offset: u32, len: u32) {
        let mut bytes = vec![0u8; len as usize];
        self.pages.copy_out(unit, offset, &mut bytes);
        self.log.put(unit, offset, &bytes);
    }
}

/// Rebuild the fragment pages at open: block `i` of `blocks` gets unit `i`, its fragments
/// laid over zeros in order, and its map entry in `meta` (over its SSD block when the
/// record names one). The engine then claims the units like any other.
pub fn restore_fragment_pages(meta: &MetaState, residue: &dyn ResidueStore, log: &FragmentLog, blocks: &[FragmentBlock], page_bytes: u32) {
    let mut page = vec![0u8; page_bytes as usize];
    for (i, block) in blocks.iter().enumerate() {
        let unit = PageNo(i as u64);
        let (Some(inode), Some(first), Some(last)) = (meta.get(block.key.object), block.fragments.first(), block.fragments.last()) else {
            continue; // `load` gives only blocks of live objects with fragments
        };
        page.fill(0);
        let mut chunks = Chunks::default();
        for (_, fragment) in &block.fragments {
            fragment.lay_over(&mut page);
            let (start, end) = fragment.range();
            chunks = chunks.with(start, end);
        }
        residue.write(unit, 0, &page);
        log.register(unit, block.key, Some(first.0..last.0 + 1));
        let entry = match block.value.block {
            Some(ssd) => {
                let overlay = if chunks.covers_whole(page_bytes) { Overlay::Page(unit) } else { Overlay::Upage { page: unit, chunks } };
                BlockEntry::Ssd { block: ssd, overlays: vec![(0, overlay)], shared: block.value.shared }
            }
            None => BlockEntry::Fast { pages: vec![(0, unit)] },
        };
        inode.map.lock().insert(block.key.lblock, entry);
    }
}
