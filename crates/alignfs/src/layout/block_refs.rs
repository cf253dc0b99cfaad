//! Who holds each SSD block: the bitmap of used blocks, plus a count of the extra
//! references to the blocks a clone shares. Like the bitmap, rebuilt from the maps at
//! open: map entries that share a block are marked (`BlockEntry::Ssd { shared: true }`),
//! so a block named twice by unmarked entries is still corrupt metadata.

use std::collections::{HashMap, HashSet};

use parking_lot::Mutex;

use super::BitmapAllocator;

pub struct BlockRefs {
    bitmap: BitmapAllocator,
    counts: Mutex<Counts>,
}

#[derive(Default)]
struct Counts {
    /// Blocks referenced by entries marked shared → references beyond the first.
    shared: HashMap<u64, u32>,
    /// Blocks a merge reads without holding their file's lock → pins.
    pinned: HashMap<u64, u32>,
    /// Pinned blocks whose last reference went: free when the last pin goes.
    unreferenced: HashSet<u64>,
}

impl BlockRefs {
    /// `capacity` blocks, all free except `reserved`.
    pub fn new(capacity: u64, reserved: &[u64]) -> BlockRefs {
        BlockRefs { bitmap: BitmapAllocator::new(capacity, reserved), counts: Mutex::new(Counts::default()) }
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

    /// `n` free blocks, all or none; `redeem` of them from promises the caller holds.
    pub fn allocate(&self, n: usize, redeem: u64) -> Option<Vec<u64>> {
        self.bitmap.allocate_redeeming(n, redeem)
    }

    /// One block per entry of `preferred`: that block where it is free, any other
    /// otherwise; all or none, `redeem` as in [`BlockRefs::allocate`].
    pub fn allocate_preferring(&self, preferred: &[Option<u64>], redeem: u64) -> Option<Vec<u64>> {
        self.bitmap.allocate_preferring(preferred, redeem)
    }

    /// One free block in `range`, from a promise the caller holds if `redeem`.
    pub fn allocate_in(&self, range: std::ops::Range<u64>, redeem: bool) -> Option<u64> {
        self.bitmap.allocate_in(range, redeem)
    }

    /// Hold `n` free blocks for map entries that take them later (`fallocate`'s zero
    /// blocks). `false`, and nothing held, if fewer are free.
    pub fn promise(&self, n: u64) -> bool {
        self.bitmap.promise(n)
    }

    /// Promises made earlier: counted at open from the maps, or put back for zero blocks
    /// whose write failed after redeeming them.
    pub fn restore_promises(&self, n: u64) {
        self.bitmap.restore_promises(n)
    }

    pub fn release_promises(&self, n: u64) {
        self.bitmap.release_promises(n)
    }

    /// Free blocks held by promises.
    pub fn promised_count(&self) -> u64 {
        self.bitmap.promised_count()
    }

    /// Free blocks no promise holds.
    pub fn available_count(&self) -> u64 {
        self.bitmap.available_count()
    }

    pub fn is_used(&self, id: u64) -> bool {
        self.bitmap.is_used(id)
    }

    /// One more reference to an allocated block (a clone).
    pub fn share(&self, id: u64) {
        *self.counts.lock().shared.entry(id).or_insert(0) += 1;
    }

    /// Drop one reference to each block; a block is free when its last reference goes
    /// and no merge has it pinned.
    pub fn release(&self, ids: impl IntoIterator<Item = u64>) {
        let mut counts = self.counts.lock();
        let mut last = Vec::new();
        for id in ids {
            match counts.shared.get_mut(&id) {
                Some(extra) if *extra > 0 => {
                    *extra -= 1;
                    if *extra == 0 {
                        counts.shared.remove(&id);
                    }
                }
                _ => {
                    counts.shared.remove(&id);
                    if counts.pinned.contains_key(&id) {
                        counts.unreferenced.insert(id);
                    } else {
                        last.push(id);
                    }
                }
            }
        }
        drop(counts);
        self.bitmap.free(last);
    }

    /// Keep an allocated block from being freed (and so rewritten) while a merge reads it
    /// without holding its file's lock: a writer may replace it meanwhile.
    pub fn pin(&self, id: u64) {
        *self.counts.lock().pinned.entry(id).or_insert(0) += 1;
    }

    /// Whether a merge is reading the block without its file's lock: nothing may write it.
    pub fn is_pinned(&self, id: u64) -> bool {
        self.counts.lock().pinned.contains_key(&id)
    }

    /// Undo one [`BlockRefs::pin`] of each block, freeing those no entry references any more.
    pub fn unpin(&self, ids: impl IntoIterator<Item = u64>) {
        let mut counts = self.counts.lock();
        let mut last = Vec::new();
        for id in ids {
            let pins = counts.pinned.get_mut(&id).expect("unpin of a block that is not pinned");
            *pins -= 1;
            if *pins == 0 {
                counts.pinned.remove(&id);
                if counts.unreferenced.remove(&id) {
                    last.push(id);
                }
            }
        }
        drop(counts);
        self.bitmap.free(last);
    }

    /// Count a map entry's reference while rebuilding at open. `false` if the block is out
    /// of range, or referenced again where either entry is not marked shared.
    pub fn claim(&self, id: u64, marked_shared: bool) -> bool {
        let mut counts = self.counts.lock();
        if self.bitmap.claim(id) {
            if marked_shared {
                counts.shared.insert(id, 0);
            }
            return true;
        }
        match counts.shared.get_mut(&id) {
            Some(extra) if marked_shared => {
                *extra += 1;
                true
            }
            _ => false,
        }
    }

    /// How many map entries reference the block (0 if none does).
    pub fn references(&self, id: u64) -> u32 {
        let counts = self.counts.lock();
        if !self.bitmap.is_used(id) || counts.unreferenced.contains(&id) {
            return 0;
        }
        1 + counts.shared.get(&id).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_blocks_are_freed_by_their_last_reference() {
        let refs = BlockRefs::new(16, &[0]);
        let [a, b] = refs.allocate(2, 0).unwrap()[..] else { panic!() };
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

    #[test]
    fn a_pinned_block_outlives_its_last_reference() {
        let refs = BlockRefs::new(16, &[0]);
        let a = refs.allocate(1, 0).unwrap()[0];
        refs.pin(a);
        refs.release([a]);
        assert_eq!(refs.references(a), 0);
        assert_eq!(refs.used_count(), 2, "still allocated while pinned");
        refs.unpin([a]);
        assert_eq!(refs.used_count(), 1);
        let b = refs.allocate(1, 0).unwrap()[0];
        refs.pin(b);
        refs.unpin([b]);
        assert_eq!(refs.references(b), 1, "a pin alone frees nothing");
    }
}
