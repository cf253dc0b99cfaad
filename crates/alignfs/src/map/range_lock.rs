//! A readers-writer lock over ranges of logical blocks: writers to disjoint ranges of one
//! file, and any readers of a range, proceed together.
//!
//! A small list of held ranges under a mutex: a file rarely has more than a handful of
//! requests in flight, so a linear scan beats any tree here.
//!
//! A block can also be *watched*: every writer that locks it afterwards marks it changed.
//! Migration uses this to copy a block's residue under the lock, merge it into a new SSD
//! block without the lock (so writers are not held up by its IO and flush), and then
//! commit only the blocks nobody wrote meanwhile.

use std::collections::BTreeMap;

use parking_lot::{Condvar, Mutex};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    Shared,
    Exclusive,
}

struct Held {
    id: u64,
    first: u64,
    last: u64,
    mode: Mode,
}

#[derive(Default)]
struct State {
    next_id: u64,
    held: Vec<Held>,
    /// Watched block → whether a writer locked it since the watch began.
    watched: BTreeMap<u64, bool>,
}

#[derive(Default)]
pub struct RangeLock {
    state: Mutex<State>,
    released: Condvar,
}

/// Releases its range when dropped.
pub struct RangeGuard<'a> {
    lock: &'a RangeLock,
    id: u64,
}

impl RangeLock {
    /// Lock blocks `first..=last` for reading.
    pub fn read(&self, first: u64, last: u64) -> RangeGuard<'_> {
        self.acquire(first, last, Mode::Shared, true).expect("blocking acquire succeeds")
    }

    /// Lock blocks `first..=last` for writing.
    pub fn write(&self, first: u64, last: u64) -> RangeGuard<'_> {
        self.acquire(first, last, Mode::Exclusive, true).expect("blocking acquire succeeds")
    }

    /// Lock for writing only if that needs no waiting.
    pub fn try_write(&self, first: u64, last: u64) -> Option<RangeGuard<'_>> {
        self.acquire(first, last, Mode::Exclusive, false)
    }

    /// Lock `lblock` for writing and start watching it, if that needs no waiting and
    /// nobody watches it yet.
    pub fn try_write_and_watch(&self, lblock: u64) -> Option<RangeGuard<'_>> {
        let mut state = self.state.lock();
        if state.watched.contains_key(&lblock) {
            return None;
        }
        let guard = self.try_lock_in(&mut state, lblock, lblock, Mode::Exclusive)?;
        state.watched.insert(lblock, false);
        Some(guard)
    }

    /// End the watch of `lblock` and lock it for writing, if that needs no waiting.
    /// Returns the guard and whether a writer locked the block while it was watched;
    /// `None` (watch ended too) if the block is held now.
    pub fn try_write_watched(&self, lblock: u64) -> Option<(RangeGuard<'_>, bool)> {
        let mut state = self.state.lock();
        let changed = state.watched.remove(&lblock).expect("the block is watched");
        let guard = self.try_lock_in(&mut state, lblock, lblock, Mode::Exclusive)?;
        Some((guard, changed))
    }

    /// End the watch of `lblock` without locking it.
    pub fn unwatch(&self, lblock: u64) {
        self.state.lock().watched.remove(&lblock);
    }

    fn acquire(&self, first: u64, last: u64, mode: Mode, wait: bool) -> Option<RangeGuard<'_>> {
        debug_assert!(first <= last);
        let mut state = self.state.lock();
        loop {
            if let Some(guard) = self.try_lock_in(&mut state, first, last, mode) {
                return Some(guard);
            }
            if !wait {
                return None;
            }
            self.released.wait(&mut state);
        }
    }

    fn try_lock_in(&self, state: &mut State, first: u64, last: u64, mode: Mode) -> Option<RangeGuard<'_>> {
        let conflict =
            state.held.iter().any(|h| h.first <= last && first <= h.last && (mode == Mode::Exclusive || h.mode == Mode::Exclusive));
        if conflict {
            return None;
        }
        if mode == Mode::Exclusive {
            for (_, changed) in state.watched.range_mut(first..=last) {
                *changed = true;
            }
        }
        state.next_id += 1;
        let id = state.next_id;
        state.held.push(Held { id, first, last, mode });
        Some(RangeGuard { lock: self, id })
    }
}

impl Drop for RangeGuard<'_> {
    fn drop(&mut self) {
        let mut state = self.lock.state.lock();
        state.held.retain(|h| h.id != self.id);
        drop(state);
        self.lock.released.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    #[test]
    fn disjoint_writers_and_shared_readers_coexist() {
        let lock = RangeLock::default();
        let _a = lock.write(0, 3);
        let _b = lock.write(4, 9);
        assert!(lock.try_write(3, 4).is_none());
        let _r1 = lock.read(10, 20);
        let _r2 = lock.read(15, 30);
        assert!(lock.try_write(20, 20).is_none());
        assert!(lock.try_write(31, 40).is_some());
    }

    #[test]
    fn a_watched_block_reports_writers_and_nothing_else() {
        let lock = RangeLock::default();
        for lblock in [3, 7] {
            drop(lock.try_write_and_watch(lblock).unwrap());
            assert!(lock.try_write_and_watch(lblock).is_none(), "one watch per block");
        }
        drop(lock.read(0, 10));
        drop(lock.write(4, 6));
        drop(lock.write(0, 3));
        let (guard, changed) = lock.try_write_watched(3).unwrap();
        assert!(changed, "a writer locked block 3");
        drop(guard);
        let (guard, changed) = lock.try_write_watched(7).unwrap();
        assert!(!changed, "only a reader and writers of other blocks came by block 7");
        drop(guard);

        // A block held when the watch ends is not locked, and its watch is over.
        drop(lock.try_write_and_watch(9).unwrap());
        let reader = lock.read(9, 9);
        assert!(lock.try_write_watched(9).is_none());
        drop(reader);
        assert!(lock.try_write_and_watch(9).is_some(), "the watch ended, so a new one may start");
        lock.unwatch(9);
        drop(lock.write(9, 9));
        assert!(lock.try_write_and_watch(9).is_some());
    }

    #[test]
    fn writer_waits_for_overlapping_reader() {
        let lock = Arc::new(RangeLock::default());
        let entered = Arc::new(AtomicBool::new(false));
        let reader = lock.read(5, 5);
        let (l, e) = (Arc::clone(&lock), Arc::clone(&entered));
        let writer = std::thread::spawn(move || {
            let _w = l.write(0, 10);
            e.store(true, Ordering::SeqCst);
        });
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!entered.load(Ordering::SeqCst));
        drop(reader);
        writer.join().unwrap();
        assert!(entered.load(Ordering::SeqCst));
    }
}
