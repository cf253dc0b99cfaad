//! Who holds each SSD block: the bitmap of used blocks, plus a count of the extra
//! references to the blocks a clone shares. Like the bitmap, rebuilt from the maps at
//! open: map entries that share a block are marked (`BlockEntry::Ssd { shared: true }`),
//! so a block named twice by unmarked entries is still corrupt metadata.

use std::collections::HashMap;

use parking_lot::Mutex;

use super::BitmapAllocator;

pub struct BlockRefs {
    bitmap: BitmapAllocator,
    /// Blocks referenced by entries marked shared → references beyond the first.
    shared: Mutex<HashMap<u64, u32>>,
}

impl BlockRefs {
    /// `capacity` blocks, all free except `reserved`.
    pub fn new(capacity: u64, reserved: &[u64]) -> BlockRefs {
        BlockRefs { bitmap: BitmapAllocator::new(capacity, reserved), shared: Mutex::new(HashMap::new()) }
    }

    pub fn capacity(&self) -> u64 {
        self.bitmap.capacity()
    }

    pub fn free_count(&self) -> u64 {
        self.bitmap.free_count()
    }

    pub fn used_count(&self) -> u64 {
        self.bitmap.used_count()
    }

    /// `n` free blocks, all or none.
    pub fn allocate(&self, n: usize) -> Option<Vec<u64>> {
        self.bitmap.allocate(n)
    }

    /// One free block in `range`.
    pub fn allocate_in(&self, range: std::ops::Range<u64>) -> Option<u64> {
        self.bitmap.allocate_in(range)
    }

    /// One more reference to an allocated block (a clone).
    pub fn share(&self, id: u64) {
        *self.shared.lock().entry(id).or_insert(0) += 1;
    }

    /// Drop one reference to each block; a block is free when its last reference goes.
    pub fn release(&self, ids: impl IntoIterator<Item = u64>) {
        let mut shared = self.shared.lock();
        let last: Vec<u64> = ids
            .into_iter()
            .filter(|id| match shared.get_mut(id) {
                Some(extra) if *extra > 0 => {
                    *extra -= 1;
                    false
                }
                Some(_) => {
                    shared.remove(id);
                    true
                }
                None => true,
            })
            .collect();
        drop(shared);
        self.bitmap.free(last);
    }

    /// Count a map entry's reference while rebuilding at open. `false` if the block is out
    /// of range, or referenced again where either entry is not marked shared.
    pub fn claim(&self, id: u64, marked_shared: bool) -> bool {
        let mut shared = self.shared.lock();
        if self.bitmap.claim(id) {
            if marked_shared {
                shared.insert(id, 0);
            }
            return true;
        }
        match shared.get_mut(&id) {
            Some(extra) if marked_shared => {
                *extra += 1;
                true
            }
            _ => false,
        }
    }

    /// How many map entries reference the block (0 if it is free).
    pub fn references(&self, id: u64) -> u32 {
        if id >= self.bitmap.capacity() || !self.bitmap.is_used(id) {
            return 0;
        }
        1 + self.shared.lock().get(&id).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_blocks_are_freed_by_their_last_reference() {
        let refs = BlockRefs::new(16, &[0]);
        let [a, b] = refs.allocate(2).unwrap()[..] else { panic!() };
        refs.share(a);
        refs.share(a);
        assert_eq!(refs.references(a), 3);
        refs.release([a, b]);
        assert_eq!((refs.references(a), refs.references(b)), (2, 0));
        refs.release([a]);
        refs.release([a]);
        assert_eq!(refs.references(a), 0);
        assert_eq!(refs.used_count(), 1, "only the reserved block");
    }

    #[test]
    fn claims_accept_marked_sharing_only() {
        let refs = BlockRefs::new(16, &[0]);
        assert!(refs.claim(3, true));
        assert!(refs.claim(3, true));
        assert!(!refs.claim(3, false), "an unmarked entry may not share a block");
        assert_eq!(refs.references(3), 2);
        assert!(refs.claim(4, false));
        assert!(!refs.claim(4, true), "a block first claimed unshared stays single");
        assert!(!refs.claim(99, false));
    }
}
