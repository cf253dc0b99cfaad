//! `uhs`'s residue store: UHS's NVM buffer, a set of segments in the fast tier whose
//! units are placed by a hash of the block they buffer.
//!
//! Every block hashes to one segment (UHS §III-C: "an NVM-segment buffers the SSD blocks of
//! a predefined range"), so a block's buffered units, and the units of the blocks around
//! it in the hash, live together and migrate together. Each segment keeps its information
//! (UHS's SI): which of its slots are used (the shared bitmap, by range), which block each
//! used slot buffers, and an index from block to slots (a hash table; the paper chains its
//! buckets, std's table probes instead). The SI's migrating flag is the engine's: a block
//! being merged is pinned, and a write to it waits for the merge (`volume/migrate.rs`).
//!
//! The SI is rebuilt, not stored twice: the map entries that name each unit are journaled
//! in the same NVM as the slots, synchronously, before a write is acknowledged, and
//! opening a volume claims every unit with its block ([`ResidueStore::claim`]), which is
//! exactly the information a scan of persisted SIs would give. A slot allocated by a write
//! that crashed before its journal record is free after recovery, as UHS's invalid SI.
//!
//! Readers never come here: they find a block's units in its map entry, under the map's
//! short lock. Writers take one segment's lock for a few table operations.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use smallvec::SmallVec;

use super::{PmemPages, ResidueStore, UnitRequest};
use crate::device::ByteTier;
use crate::layout::BitmapAllocator;
use crate::map::PageNo;
use crate::meta::Ino;

/// A buffered block: its object and logical block.
type BlockKey = (Ino, u64);

/// One segment's information (UHS's SI), in DRAM.
#[derive(Default)]
struct SegmentInfo {
    /// The block each used slot buffers.
    owner: HashMap<u64, BlockKey>,
    /// The slots each buffered block uses.
    slots: HashMap<BlockKey, SmallVec<[u64; 1]>>,
}

pub struct HashedSegments {
    slots: PmemPages,
    /// Used slots, searched by segment range.
    bitmap: BitmapAllocator,
    slots_per_segment: u64,
    segments: Vec<Mutex<SegmentInfo>>,
}

impl HashedSegments {
    /// The page zone of `region` (`page_count` slots of `page_bytes` at `zone_offset`) cut
    /// into segments of `segment_bytes` (fewer bytes when the zone holds fewer than four
    /// segments of that size, so the hash still spreads).
    pub fn new(region: Arc<dyn ByteTier>, zone_offset: u64, page_count: u64, page_bytes: u32, segment_bytes: u64) -> HashedSegments {
        let wanted = (segment_bytes / u64::from(page_bytes)).max(1);
        let slots_per_segment = wanted.min((page_count / 4).max(1));
        let count = page_count.div_ceil(slots_per_segment);
        let segments = (0..count).map(|_| Mutex::default()).collect();
        HashedSegments {
            slots: PmemPages::new(region, zone_offset, page_count, page_bytes),
            bitmap: BitmapAllocator::new(page_count, &[]),
            slots_per_segment,
            segments,
        }
    }

    pub fn segment_count(&self) -> usize {
        self.segments.len()
    }

    pub fn segment_bytes(&self) -> u64 {
        self.slots_per_segment * u64::from(self.slots.unit_bytes())
    }

    /// The segment a block hashes to (Fibonacci hashing of object and block).
    fn segment_of(&self, (object, lblock): BlockKey) -> usize {
        let mixed = (lblock ^ object.0.rotate_left(32)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        ((u128::from(mixed) * self.segments.len() as u128) >> 64) as usize
    }

    fn segment_range(&self, segment: usize) -> std::ops::Range<u64> {
        let start = segment as u64 * self.slots_per_segment;
        start..(start + self.slots_per_segment).min(self.bitmap.capacity())
    }

    fn record(&self, unit: u64, key: BlockKey) {
        let mut info = self.segments[(unit / self.slots_per_segment) as usize].lock();
        info.owner.insert(unit, key);
        info.slots.entry(key).or_default().push(unit);
    }

    /// Blocks buffered in `segment`.
    fn blocks_in(&self, segment: usize) -> Vec<BlockKey> {
        self.segments[segment].lock().slots.keys().copied().collect()
    }
}

impl ResidueStore for HashedSegments {
    fn name(&self) -> &'static str {
        "NVM buffer"
    }

    fn describe(&self) -> String {
        format!(
            "NVM buffer of {} segments of {} KiB ({} slots of {} bytes)",
            self.segments.len(),
            self.segment_bytes() / 1024,
            self.bitmap.capacity(),
            self.slots.unit_bytes(),
        )
    }
    fn unit_bytes(&self) -> u32 {
        self.slots.unit_bytes()
    }
    fn capacity_units(&self) -> u64 {
        self.bitmap.capacity()
    }
    fn used_units(&self) -> u64 {
        self.bitmap.used_count()
    }
    fn peak_used_units(&self) -> u64 {
        self.bitmap.peak_used_count()
    }
    /// Each request takes a slot of the segment its block hashes to; if one of them is
    /// full, nothing is taken.
    fn allocate(&self, requests: &[UnitRequest]) -> Option<Vec<PageNo>> {
        let mut taken: SmallVec<[u64; 4]> = SmallVec::new();
        for request in requests {
            let key = (request.object, request.lblock);
            match self.bitmap.allocate_in(self.segment_range(self.segment_of(key)), false) {
                Some(unit) => taken.push(unit),
                None => {
                    self.bitmap.free(taken);
                    return None;
                }
            }
        }
        for (request, &unit) in requests.iter().zip(&taken) {
            self.record(unit, (request.object, request.lblock));
        }
        Some(taken.into_iter().map(PageNo).collect())
    }
    fn free(&self, units: &[PageNo]) {
        for unit in units {
            let mut info = self.segments[(unit.0 / self.slots_per_segment) as usize].lock();
            if let Some(key) = info.owner.remove(&unit.0) {
                if let Some(slots) = info.slots.get_mut(&key) {
                    slots.retain(|s| *s != unit.0);
                    if slots.is_empty() {
                        info.slots.remove(&key);
                    }
                }
            }
        }
        self.bitmap.free(units.iter().map(|p| p.0));
    }
    fn claim(&self, unit: PageNo, object: Ino, lblock: u64) -> bool {
        if !self.bitmap.claim(unit.0) {
            return false;
        }
        self.record(unit.0, (object, lblock));
        true
    }
    fn write(&self, unit: PageNo, offset: u32, data: &[u8]) {
        self.slots.write(unit, offset, data);
    }
    fn zero(&self, unit: PageNo, offset: u32, len: u32) {
        self.slots.zero(unit, offset, len);
    }
    fn read(&self, unit: PageNo, offset: u32, out: &mut [u8]) -> crate::error::Result<()> {
        self.slots.read(unit, offset, out)
    }
    fn persist(&self, unit: PageNo, offset: u32, len: u32) {
        self.slots.persist(unit, offset, len);
    }
    /// The blocks of every full segment a request hashes to: migrating them frees the
    /// segment (UHS Algorithm 1, line 10).
    fn blocks_to_drain(&self, requests: &[UnitRequest]) -> Vec<(Ino, u64)> {
        let mut segments: SmallVec<[usize; 2]> = requests.iter().map(|r| self.segment_of((r.object, r.lblock))).collect();
        segments.sort_unstable();
        segments.dedup();
        let mut blocks = Vec::new();
        for segment in segments {
            let range = self.segment_range(segment);
            if range.clone().all(|slot| self.bitmap.is_used(slot)) {
                blocks.extend(self.blocks_in(segment));
            }
        }
        blocks
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::PmemRegion;

    fn store(slots: u64, segment_slots: u64) -> HashedSegments {
        let region = Arc::new(PmemRegion::anonymous(slots * 4096).unwrap());
        HashedSegments::new(region, 0, slots, 4096, segment_slots * 4096)
    }

    fn request(lblock: u64) -> UnitRequest {
        UnitRequest { object: Ino(7), lblock, bytes: 4096 }
    }

    #[test]
    fn a_block_lands_in_the_segment_it_hashes_to() {
        let s = store(64, 16);
        assert_eq!(s.segment_count(), 4);
        for lblock in 0..20 {
            let unit = s.allocate(&[request(lblock)]).unwrap()[0];
            assert_eq!((unit.0 / 16) as usize, s.segment_of((Ino(7), lblock)));
        }
    }

    #[test]
    fn a_full_segment_refuses_and_names_its_blocks() {
        let s = store(64, 16);
        let target = s.segment_of((Ino(7), 0));
        let same: Vec<u64> = (0..10_000).filter(|&lb| s.segment_of((Ino(7), lb)) == target).take(17).collect();
        let mut units = Vec::new();
        for &lb in &same[..16] {
            units.extend(s.allocate(&[request(lb)]).unwrap());
        }
        assert!(s.allocate(&[request(same[16])]).is_none(), "the segment is full");
        assert_eq!(s.used_units(), 16, "a refused request takes nothing");
        let mut drain = s.blocks_to_drain(&[request(same[16])]);
        drain.sort_unstable();
        assert_eq!(drain, same[..16].iter().map(|&lb| (Ino(7), lb)).collect::<Vec<_>>());
        s.free(&units[..1]);
        assert!(s.blocks_to_drain(&[request(same[16])]).is_empty(), "a segment with room needs no drain");
        assert!(s.allocate(&[request(same[16])]).is_some());
    }

    #[test]
    fn claims_rebuild_the_index() {
        let s = store(64, 16);
        assert!(s.claim(PageNo(5), Ino(3), 9));
        assert!(!s.claim(PageNo(5), Ino(3), 9), "a unit is claimed once");
        assert!(!s.claim(PageNo(64), Ino(3), 9), "out of range");
        assert_eq!(s.blocks_in(0), vec![(Ino(3), 9)]);
        s.free(&[PageNo(5)]);
        assert!(s.blocks_in(0).is_empty());
        assert_eq!(s.used_units(), 0);
    }

    #[test]
    fn a_small_zone_still_has_several_segments() {
        let s = store(16, 1024);
        assert_eq!(s.segment_count(), 4);
        assert_eq!(s.segment_bytes(), 4 * 4096);
    }
}
