//! A bitmap allocator of numbered units (SSD blocks, fast pages): next-fit, so consecutive
//! allocations tend to be contiguous, and a multi-unit allocation looks for long free runs.
//! Not persisted: rebuilt from the maps at open.

use parking_lot::Mutex;

/// Free runs this long (or as long as the whole allocation, if shorter) are what a
/// multi-unit allocation looks for: 256 KiB of 4 KiB blocks, a full IO.
const RUN_GOAL: u64 = 64;

/// How far an allocation searches for such runs before it takes whatever is free: at most
/// this many shorter runs passed over, and units searched (one pass over a volume of up to
/// 4 GiB of 4 KiB blocks), so that on a volume whose free space is all in short runs an
/// allocation costs little more than plain next-fit.
const SHORT_RUNS_SKIPPED: u32 = 256;
const UNITS_SEARCHED: u64 = 1 << 20;

struct Bits {
    words: Vec<u64>,
    capacity: u64,
    free: u64,
    cursor: u64,
    /// Move the cursor back to a freed unit below it (see [`BitmapAllocator::warm_first`]).
    rewind_on_free: bool,
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
    /// The first run of free units at or after `from` (not wrapping), as (start, length),
    /// its length capped at `cap` (which also bounds the search for its end).
    fn free_run_from(&self, from: u64, cap: u64) -> Option<(u64, u64)> {
        let start = self.next_where(from, self.capacity, |word| !word)?;
        let until = start.saturating_add(cap).min(self.capacity);
        let end = self.next_where(start, until, |word| word).unwrap_or(until);
        Some((start, end - start))
    }

    /// The first unit in `from..until` whose bit is set in `view` of its word (the word
    /// itself for a used unit, its complement for a free one).
    fn next_where(&self, from: u64, until: u64, view: impl Fn(u64) -> u64) -> Option<u64> {
        if from >= until {
            return None;
        }
        let mut word = from / 64;
        let mut bits = view(self.words[word as usize]) & (u64::MAX << (from % 64));
        while word * 64 < until {
            if bits != 0 {
                let id = word * 64 + u64::from(bits.trailing_zeros());
                return (id < until).then_some(id);
            }
            word += 1;
            bits = self.words.get(word as usize).map_or(0, |&w| view(w));
        }
        None
    }

    /// Mark `n` free units used, next-fit from the cursor in runs of at least
    /// `min(n, RUN_GOAL)` (see [`BitmapAllocator::allocate_redeeming`]); the caller has
    /// checked that `n` are available and counts them with [`Bits::taken`].
    fn take_runs(&mut self, n: usize) -> Vec<u64> {
        let mut out = Vec::with_capacity(n);
        let mut goal = (n as u64).min(RUN_GOAL);
        let search_limit = UNITS_SEARCHED.min(self.capacity);
        let (mut id, mut skipped, mut searched) = (self.cursor, 0u32, 0u64);
        while out.len() < n {
            let wanted = (n - out.len()) as u64;
            match self.free_run_from(id, wanted) {
                None => {
                    searched += self.capacity - id;
                    id = 0;
                }
                Some((start, len)) => {
                    if len >= goal.min(wanted) {
                        for unit in start..start + len {
                            self.set(unit, true);
                            out.push(unit);
                        }
                    } else {
                        skipped += 1;
                    }
                    searched += start + len - id;
                    id = start + len;
                }
            }
            if skipped >= SHORT_RUNS_SKIPPED || searched >= search_limit {
                goal = 1;
            }
        }
        self.cursor = id;
        out
    }

    fn taken(&mut self, n: u64) {
        self.free -= n;
        self.peak_used = self.peak_used.max(self.capacity - self.free);
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
        let mut bits = Bits { words, capacity, free: capacity, cursor: 0, rewind_on_free: false, peak_used: 0, promised: 0 };
        for &id in reserved {
            if id < capacity && !bits.used(id) {
                bits.set(id, true);
                bits.free -= 1;
            }
        }
        BitmapAllocator { bits: Mutex::new(bits) }
    }

    /// `capacity` units of memory that the kernel backs on first touch (anonymous DRAM, a
    /// tmpfs file): next-fit, but a freed unit below the cursor brings the cursor back to
    /// it. Units used before are taken again before units never touched, each of which
    /// costs page faults and grows the resident set; so resident memory follows the most
    /// units ever in use, not every unit the cursor has passed over.
    pub fn warm_first(capacity: u64) -> BitmapAllocator {
        let allocator = BitmapAllocator::new(capacity, &[]);
        allocator.bits.lock().rewind_on_free = true;
        allocator
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
    ///
    /// Next-fit from a cursor, taking free runs of at least `min(n, RUN_GOAL)` units: the
    /// caller writes consecutive units with one IO, so a large allocation on a volume
    /// fragmented by small out-of-place writes skips the holes those left (small
    /// allocations fill them). After `SHORT_RUNS_SKIPPED` shorter runs, or a whole pass
    /// (at most `UNITS_SEARCHED` units), it takes any free unit.
    pub fn allocate_redeeming(&self, n: usize, redeem: u64) -> Option<Vec<u64>> {
        let mut bits = self.bits.lock();
        if (n as u64) > bits.available(redeem) {
            return None;
        }
        bits.promised -= redeem;
        let out = bits.take_runs(n);
        bits.taken(n as u64);
        Some(out)
    }

    /// One unit for each entry of `preferred`, in order: the preferred unit where it is
    /// free, otherwise one [`Self::allocate_redeeming`] would take. All or none; `redeem`
    /// as there.
    pub fn allocate_preferring(&self, preferred: &[Option<u64>], redeem: u64) -> Option<Vec<u64>> {
        let mut bits = self.bits.lock();
        let n = preferred.len();
        if (n as u64) > bits.available(redeem) {
            return None;
        }
        bits.promised -= redeem;
        let mut out: Vec<Option<u64>> = preferred
            .iter()
            .map(|&unit| {
                let unit = unit.filter(|&u| u < bits.capacity && !bits.used(u))?;
                bits.set(unit, true);
                Some(unit)
            })
            .collect();
        let mut others = bits.take_runs(out.iter().filter(|u| u.is_none()).count()).into_iter();
        for unit in out.iter_mut().filter(|u| u.is_none()) {
            *unit = others.next();
        }
        bits.taken(n as u64);
        Some(out.into_iter().map(|u| u.expect("a unit for every entry")).collect())
    }

    /// One free unit in `range` (the first from its start), or `None`. With `redeem`, the
    /// unit is taken from a promise the caller holds.
    pub fn allocate_in(&self, range: std::ops::Range<u64>, redeem: bool) -> Option<u64> {
        let mut bits = self.bits.lock();
        if bits.available(u64::from(redeem)) == 0 {
            return None;
        }
        let id = bits.next_where(range.start, range.end.min(bits.capacity), |word| !word)?;
        bits.set(id, true);
        bits.free -= 1;
        bits.promised -= u64::from(redeem);
        bits.peak_used = bits.peak_used.max(bits.capacity - bits.free);
        Some(id)
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
            if bits.rewind_on_free {
                bits.cursor = bits.cursor.min(id);
            }
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

    #[test]
    fn multi_unit_allocations_take_long_runs_and_single_units_fill_holes() {
        let a = BitmapAllocator::new(1000, &[]);
        let all = a.allocate(1000).unwrap();
        assert_eq!(all, (0..1000).collect::<Vec<_>>());
        // Holes of one unit in 0..400, a run of 100 at 500, then holes again.
        a.free((0..400).step_by(2));
        a.free(500..600);
        a.free((700..1000).step_by(3));
        let large = a.allocate(80).unwrap();
        assert_eq!(large, (500..580).collect::<Vec<_>>(), "the first run of 64 or more, whole");
        assert_eq!(a.allocate(20).unwrap(), (580..600).collect::<Vec<_>>(), "the rest of that run");
        assert_eq!(a.allocate(1).unwrap(), vec![700], "a single unit takes the next hole");
        // No run of 64 is left: a large allocation takes holes rather than fail.
        let scattered = a.allocate(150).unwrap();
        assert_eq!(scattered.len(), 150);
        assert!(scattered.iter().all(|&u| u % 2 == 0 || (700..1000).contains(&u)));
        assert_eq!(a.free_count(), 400 - 80 - 20 - 1 - 150);
    }

    #[test]
    fn warm_first_takes_freed_units_before_untouched_ones() {
        for (allocator, warm) in [(BitmapAllocator::new(1000, &[]), false), (BitmapAllocator::warm_first(1000), true)] {
            assert_eq!(allocator.allocate(300).unwrap(), (0..300).collect::<Vec<_>>());
            allocator.free(100..300);
            allocator.free([10]);
            let again = allocator.allocate(1).unwrap();
            assert_eq!(again, vec![if warm { 10 } else { 300 }]);
            let run = allocator.allocate(150).unwrap();
            assert_eq!(run, if warm { (100..250).collect::<Vec<_>>() } else { (301..451).collect() });
        }
    }

    #[test]
    fn a_search_through_many_short_runs_is_bounded() {
        let capacity = 64 * 64;
        let a = BitmapAllocator::new(capacity, &[]);
        a.allocate(capacity as usize).unwrap();
        // More short runs than the search passes over, then a long run at the end.
        let short_runs = u64::from(SHORT_RUNS_SKIPPED) + 10;
        a.free((0..short_runs).map(|k| k * 3));
        a.free(capacity - 100..capacity);
        let taken = a.allocate(64).unwrap();
        assert!(taken[0] < capacity - 100, "gave up the search and took short runs: {taken:?}");
        assert_eq!(taken.len(), 64);
        // Units past the capacity in the last word never count as free.
        let b = BitmapAllocator::new(70, &[]);
        assert_eq!(b.allocate(70).unwrap().len(), 70);
        assert!(b.allocate(1).is_none());
        b.free([69]);
        assert_eq!(b.allocate(1).unwrap(), vec![69]);
    }

    /// Preferred units are taken where free; the rest (taken, out of range, or none
    /// preferred) come from the usual next-fit, in order; a request larger than what is
    /// free takes nothing.
    #[test]
    fn allocate_preferring_takes_free_preferred_units_and_falls_back() {
        let a = BitmapAllocator::new(16, &[0]);
        assert_eq!(a.allocate_preferring(&[Some(5), Some(6)], 0).unwrap(), vec![5, 6]);
        let got = a.allocate_preferring(&[Some(5), Some(9), Some(99), None], 0).unwrap();
        assert_eq!(got[1], 9);
        assert!([got[0], got[2], got[3]].iter().all(|&u| u != 0 && u != 5 && u != 6 && u != 9 && u < 16));
        assert_eq!(a.free_count(), 15 - 6);
        assert!(a.allocate_preferring(&[None; 10], 0).is_none());
        assert_eq!(a.free_count(), 9, "a refused request takes nothing");
        assert!(a.promise(2));
        assert!(a.allocate_preferring(&[Some(15); 8], 0).is_none(), "promised units are not free to take");
        assert_eq!(a.allocate_preferring(&[Some(15)], 1).unwrap(), vec![15]);
        assert_eq!(a.promised_count(), 1);
    }
}
