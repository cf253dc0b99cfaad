//! A readers-writer lock over ranges of logical blocks: writers to disjoint ranges of one
//! file, and any readers of a range, proceed together.
//!
//! A small list of held ranges under a mutex: a file rarely has more than a handful of
//! requests in flight, so a linear scan beats any tree here.

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
pub struct RangeLock {
    held: Mutex<(u64, Vec<Held>)>,
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

    fn acquire(&self, first: u64, last: u64, mode: Mode, wait: bool) -> Option<RangeGuard<'_>> {
        debug_assert!(first <= last);
        let mut state = self.held.lock();
        loop {
            let conflict =
                state.1.iter().any(|h| h.first <= last && first <= h.last && (mode == Mode::Exclusive || h.mode == Mode::Exclusive));
            if !conflict {
                state.0 += 1;
                let id = state.0;
                state.1.push(Held { id, first, last, mode });
                return Some(RangeGuard { lock: self, id });
            }
            if !wait {
                return None;
            }
            self.released.wait(&mut state);
        }
    }
}

impl Drop for RangeGuard<'_> {
    fn drop(&mut self) {
        let mut state = self.lock.held.lock();
        state.1.retain(|h| h.id != self.id);
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
