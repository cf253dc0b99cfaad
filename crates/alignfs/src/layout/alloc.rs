//! A bitmap allocator of numbered units (SSD blocks, fast pages), next-fit so consecutive
//! allocations tend to be contiguous. Not persisted: rebuilt from the maps at open.

use parking_lot::Mutex;

struct Bits {
    words: Vec<u64>,
    capacity: u64,
    free: u64,
    cursor: u64,
    /// The most units ever in use at once.
    peak_used: u64,
    /// Free units promised to holders that take them later (blocks `fallocate` reserved):
    /// no other allocation may take them.
    promised: u64,
}

impl Bits {
    fn used(&self, id: u64) -> bool {
        self.words[(id / 64) as usize] & (1 << (id % 64)) != 0
    }
    /// Free units no promise holds, counting `redeem` promises the caller gives up.
    fn available(&self, redeem: u64) -> u64 {
        assert!(redeem <= self.promised, "redeeming {redeem} of {} promises", self.promised);
        self.free.saturating_sub(self.promised - redeem)
    }
    fn set(&mut self, id: u64, used: bool) {
        let (word, bit) = ((id / 64) as usize, 1u64 << (id % 64));
        if used {
            self.words[word] |= bit;
        } else {
            self.words[word] &= !bit;
        }
    }
}

pub struct BitmapAllocator {
    bits: Mutex<Bits>,
}

impl BitmapAllocator {
    /// `capacity` units, all free except `reserved` (e.g. the superblock's block).
    pub fn new(capacity: u64, reserved: &[u64]) -> BitmapAllocator {
        let words = vec![0u64; capacity.div_ceil(64) as usize];
        let mut bits = Bits { words, capacity, free: capacity, cursor: 0, peak_used: 0, promised: 0 };
        for &id in reserved {
            if id < capacity && !bits.used(id) {
                bits.set(id, true);
                bits.free -= 1;
            }
        }
        BitmapAllocator { bits: Mutex::new(bits) }
    }

    pub fn capacity(&self) -> u64 {
        self.bits.lock().capacity
    }

    pub fn free_count(&self) -> u64 {
        self.bits.lock().free
    }

    pub fn used_count(&self) -> u64 {
        let bits = self.bits.lock();
        bits.capacity - bits.free
    }

    /// `n` free units, or `None` (and nothing taken) if fewer are free and unpromised.
    pub fn allocate(&self, n: usize) -> Option<Vec<u64>> {
        self.allocate_redeeming(n, 0)
    }

    /// `n` free units, `redeem` of them taken from promises the caller holds (and which it
    /// gives up), or `None` and nothing taken.
    pub fn allocate_redeeming(&self, n: usize, redeem: u64) -> Option<Vec<u64>> {
        let mut bits = self.bits.lock();
        if (n as u64) > bits.available(redeem) {
            return None;
        }
        bits.promised -= redeem;
        let mut out = Vec::with_capacity(n);
        let mut id = bits.cursor;
        while out.len() < n {
            if id >= bits.capacity {
                id = 0;
            }
            let word = bits.words[(id / 64) as usize];
            if id % 64 == 0 && word == u64::MAX {
                id += 64;
                continue;
            }
            if !bits.used(id) {
                bits.set(id, true);
                out.push(id);
            }
            id += 1;
        }
        bits.free -= n as u64;
        bits.cursor = id;
        bits.peak_used = bits.peak_used.max(bits.capacity - bits.free);
        Some(out)
    }

    /// One free unit in `range` (the first from its start), or `None`. With `redeem`, the
    /// unit is taken from a promise the caller holds.
    pub fn allocate_in(&self, range: std::ops::Range<u64>, redeem: bool) -> Option<u64> {
        let mut bits = self.bits.lock();
        if bits.available(u64::from(redeem)) == 0 {
            return None;
        }
        let end = range.end.min(bits.capacity);
        let mut id = range.start;
        while id < end {
            if id % 64 == 0 && bits.words[(id / 64) as usize] == u64::MAX {
                id += 64;
                continue;
            }
            if !bits.used(id) {
                bits.set(id, true);
                bits.free -= 1;
                bits.promised -= u64::from(redeem);
                bits.peak_used = bits.peak_used.max(bits.capacity - bits.free);
                return Some(id);
            }
            id += 1;
        }
        None
    }

    /// Promise `n` free units to a holder that takes them later. `false`, and nothing
    /// promised, if fewer are free and unpromised.
    pub fn promise(&self, n: u64) -> bool {
        let mut bits = self.bits.lock();
        if n > bits.available(0) {
            return false;
        }
        bits.promised += n;
        true
    }

    /// Promises made earlier, taken up again without a check: rebuilt at open from the maps
    /// that hold them, or given back to zero blocks whose write failed after redeeming
    /// them.
    pub fn restore_promises(&self, n: u64) {
        self.bits.lock().promised += n;
    }

    /// Give back `n` promises whose holders no longer need them.
    pub fn release_promises(&self, n: u64) {
        let mut bits = self.bits.lock();
        assert!(n <= bits.promised, "releasing {n} of {} promises", bits.promised);
        bits.promised -= n;
    }

    pub fn promised_count(&self) -> u64 {
        self.bits.lock().promised
    }

    /// Free units no promise holds: what a new allocation may take.
    pub fn available_count(&self) -> u64 {
        self.bits.lock().available(0)
    }

    pub fn free(&self, ids: impl IntoIterator<Item = u64>) {
        let mut bits = self.bits.lock();
        for id in ids {
            assert!(id < bits.capacity && bits.used(id), "freeing unit {id} that is not allocated");
            bits.set(id, false);
            bits.free += 1;
        }
    }

    /// Mark `id` used while rebuilding from the maps. `false` if it is out of range or
    /// already used: two owners of one unit, i.e. corrupt metadata.
    pub fn claim(&self, id: u64) -> bool {
        let mut bits = self.bits.lock();
        if id >= bits.capacity || bits.used(id) {
            return false;
        }
        bits.set(id, true);
        bits.free -= 1;
        bits.peak_used = bits.peak_used.max(bits.capacity - bits.free);
        true
    }

    pub fn is_used(&self, id: u64) -> bool {
        let bits = self.bits.lock();
        id < bits.capacity && bits.used(id)
    }

    /// The most units in use at any moment since the allocator was built.
    pub fn peak_used_count(&self) -> u64 {
        self.bits.lock().peak_used
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocate_free_claim() {
        let a = BitmapAllocator::new(130, &[0]);
        assert_eq!(a.free_count(), 129);
        let first = a.allocate(3).unwrap();
        assert_eq!(first, vec![1, 2, 3]);
        assert!(a.allocate(127).is_none());
        assert_eq!(a.free_count(), 126);
        let all = a.allocate(126).unwrap();
        assert_eq!(all.len(), 126);
        assert_eq!(a.free_count(), 0);
        a.free([2]);
        assert_eq!(a.allocate(1).unwrap(), vec![2]);
        assert!(!a.claim(2));
        assert!(!a.claim(500));
        a.free([5]);
        assert!(a.claim(5));
        assert_eq!(a.peak_used_count(), 130);
        let b = BitmapAllocator::new(200, &[0, 100]);
        assert_eq!(b.allocate_in(100..200, false), Some(101));
        assert_eq!(b.allocate_in(0..100, false), Some(1));
        assert_eq!(b.allocate_in(150..151, false), Some(150));
        assert_eq!(b.allocate_in(150..151, false), None);
    }

    #[test]
    fn promised_units_go_only_to_their_holders() {
        let a = BitmapAllocator::new(11, &[0]);
        assert!(a.promise(6));
        assert!(!a.promise(5), "4 free units are left unpromised");
        assert!(a.allocate(5).is_none());
        assert_eq!(a.allocate(4).unwrap().len(), 4);
        assert!(a.allocate(1).is_none() && a.allocate_in(0..11, false).is_none());
        assert_eq!(a.allocate_redeeming(2, 2).unwrap().len(), 2);
        assert!(a.allocate_in(0..11, true).is_some());
        assert_eq!((a.free_count(), a.promised_count()), (3, 3));
        a.release_promises(3);
        assert_eq!(a.allocate(3).unwrap().len(), 3);
    }
}
