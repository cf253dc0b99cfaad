//! A small pool of aligned buffers, so the write path does not allocate and zero a fresh
//! buffer for every SSD IO. Buffers come back with stale (initialised) contents; callers
//! overwrite what they send.

use parking_lot::Mutex;

use super::AlignedBuf;

pub struct BufferPool {
    free: Mutex<Vec<AlignedBuf>>,
    max_pooled_bytes: usize,
}

impl BufferPool {
    pub fn new(max_pooled_bytes: usize) -> BufferPool {
        BufferPool { free: Mutex::new(Vec::new()), max_pooled_bytes }
    }

    /// A buffer of exactly `len` bytes (a multiple of 4 KiB).
    pub fn take(&self, len: usize) -> AlignedBuf {
        let mut free = self.free.lock();
        match free.iter().rposition(|b| b.len() == len) {
            Some(at) => free.swap_remove(at),
            None => {
                drop(free);
                AlignedBuf::zeroed(len)
            }
        }
    }

    pub fn give(&self, buffers: impl IntoIterator<Item = AlignedBuf>) {
        let mut free = self.free.lock();
        let mut pooled: usize = free.iter().map(|b| b.len()).sum();
        for buf in buffers {
            if pooled + buf.len() <= self.max_pooled_bytes {
                pooled += buf.len();
                free.push(buf);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reuses_by_size_and_bounds_itself() {
        let pool = BufferPool::new(16384);
        let a = pool.take(8192);
        let ptr = a.as_ptr();
        pool.give([a, AlignedBuf::zeroed(8192), AlignedBuf::zeroed(8192)]);
        assert_eq!(pool.free.lock().len(), 2);
        assert_eq!(pool.take(4096).len(), 4096);
        let reused = pool.take(8192);
        assert!(reused.as_ptr() == ptr || pool.free.lock().len() == 1);
    }
}
