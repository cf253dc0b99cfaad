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
}

impl Bits {
    fn used(&self, id: u64) -> bool {
        self.words[(id / 64) as usize] & (1 << (id % 64)) != 0
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
        let mut bits = Bits { words, capacity, free: capacity, cursor: 0, peak_used: 0 };
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

    /// `n` free units, or `None` (and nothing taken) if fewer are free.
    pub fn allocate(&self, n: usize) -> Option<Vec<u64>> {
        let mut bits = self.bits.lock();
        if (n as u64) > bits.free {
            return None;
        }
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

    /// One free unit in `range` (the first from its start), or `None`.
    pub fn allocate_in(&self, range: std::ops::Range<u64>) -> Option<u64> {
        let mut bits = self.bits.lock();
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
                bits.peak_used = bits.peak_used.max(bits.capacity - bits.free);
                return Some(id);
            }
            id += 1;
        }
        None
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
        assert_eq!(b.allocate_in(100..200), Some(101));
        assert_eq!(b.allocate_in(0..100), Some(1));
        assert_eq!(b.allocate_in(150..151), Some(150));
        assert_eq!(b.allocate_in(150..151), None);
    }
}
