//! Each thread that submits SSD IO owns one io_uring and submits to it itself. The write
//! path copies a run into its buffer, submits it and copies the next one while the first
//! is on its way, and no IO waits for a worker thread to wake up: on this machine's two
//! cores a hand-off to a worker and back cost about 40 µs per batch.
//!
//! A batch ([`RingBatch`]) must be waited for on the thread that submitted it (it is not
//! `Send`). Completions reaped while waiting for one batch that belong to another batch
//! of the same thread are kept for it. A batch dropped unwaited waits in its destructor:
//! the kernel may be using its buffers until then.

use std::cell::RefCell;
use std::collections::HashMap;
use std::fs::File;
use std::marker::PhantomData;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use io_uring::{opcode, types, IoUring};

use super::{finish_sync, io_error};
use crate::device::{AlignedBuf, IoOp, IoRequest};
use crate::error::{Error, Result};

/// Most IOs a thread has in flight at once. The completion queue holds twice as many, so
/// it never overflows.
const RING_ENTRIES: u32 = 128;

/// The batch index lives in the low bits of a completion's user data, the batch id above.
const INDEX_BITS: u32 = 24;

thread_local! {
    static RING: RefCell<Option<LocalRing>> = const { RefCell::new(None) };
    /// The kernel refused this thread a ring once: do not ask on every IO.
    static REFUSED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

struct LocalRing {
    ring: IoUring,
    /// A child after `fork` shares the parent's ring memory; it must build its own.
    pid: u32,
    /// Batches of an earlier ring of this thread (one that failed) are lost, not reaped.
    generation: u64,
    next_batch: u64,
    in_flight: usize,
    /// Completions of other batches, reaped while waiting for one: batch → (index, result).
    stash: HashMap<u64, Vec<(usize, i32)>>,
}

static GENERATION: AtomicU64 = AtomicU64::new(0);
static WARNED: AtomicBool = AtomicBool::new(false);

impl LocalRing {
    fn new() -> std::io::Result<LocalRing> {
        Ok(LocalRing {
            ring: IoUring::new(RING_ENTRIES)?,
            pid: std::process::id(),
            generation: GENERATION.fetch_add(1, Ordering::Relaxed),
            next_batch: 1,
            in_flight: 0,
            stash: HashMap::new(),
        })
    }

    /// Block until at least one completion arrives and file every completion present.
    fn reap(&mut self, mut own: impl FnMut(u64, usize, i32) -> bool) -> std::io::Result<()> {
        loop {
            match self.ring.submit_and_wait(1) {
                Ok(_) => break,
                Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR | libc::EAGAIN | libc::EBUSY)) => {
                    if !self.ring.completion().is_empty() {
                        break;
                    }
                }
                Err(e) => return Err(e),
            }
        }
        for cqe in self.ring.completion() {
            self.in_flight -= 1;
            let (batch, index) = (cqe.user_data() >> INDEX_BITS, (cqe.user_data() & ((1 << INDEX_BITS) - 1)) as usize);
            if !own(batch, index, cqe.result()) {
                self.stash.entry(batch).or_default().push((index, cqe.result()));
            }
        }
        Ok(())
    }
}

/// A batch submitted from this thread's ring.
pub(crate) struct RingBatch {
    id: u64,
    generation: u64,
    file: Arc<File>,
    /// `None` once abandoned: the ring failed and the buffer was leaked to the kernel.
    requests: Vec<Option<IoRequest>>,
    results: Vec<Option<i32>>,
    outstanding: usize,
    _same_thread: PhantomData<*const ()>,
}

pub(crate) enum Submitted {
    Ring(RingBatch),
    /// No ring on this thread (the kernel refused one): done synchronously already.
    Done(Vec<(usize, Result<AlignedBuf>)>),
}

/// Submit `batch` from the calling thread's ring.
pub(crate) fn submit(file: &Arc<File>, batch: Vec<IoRequest>) -> Submitted {
    let mut unsubmitted = Some(batch);
    let submitted = RING.try_with(|cell| {
        if REFUSED.get() {
            return None;
        }
        let mut slot = cell.borrow_mut();
        if slot.as_ref().is_none_or(|r| r.pid != std::process::id()) {
            // The parent's ring (after fork) is forgotten, not torn down: its memory is
            // shared with the parent.
            if let Some(stale) = slot.take() {
                std::mem::forget(stale);
            }
            match LocalRing::new() {
                Ok(ring) => *slot = Some(ring),
                Err(e) => {
                    REFUSED.set(true);
                    if !WARNED.swap(true, Ordering::Relaxed) {
                        tracing::warn!("io_uring unavailable on a thread ({e}); it uses pread/pwrite");
                    }
                    return None;
                }
            }
        }
        let batch = unsubmitted.take().expect("submitted once");
        let ring = slot.as_mut().expect("ring just built");
        let id = ring.next_batch;
        ring.next_batch += 1;
        let mut pending = RingBatch {
            id,
            generation: ring.generation,
            file: Arc::clone(file),
            results: vec![None; batch.len()],
            outstanding: 0,
            requests: batch.into_iter().map(Some).collect(),
            _same_thread: PhantomData,
        };
        if let Err(e) = pending.push_all(ring) {
            tracing::error!("io_uring failed with IOs in flight ({e}); building a new ring");
            *slot = None;
            pending.abandon(&e);
        }
        Some(pending)
    });
    match (submitted, unsubmitted) {
        (Ok(Some(batch)), _) => Submitted::Ring(batch),
        // No ring on this thread, or the thread is exiting.
        (_, batch) => Submitted::Done(
            batch
                .expect("a batch not on the ring is still here")
                .into_iter()
                .enumerate()
                .map(|(index, mut request)| (index, finish_sync(file, &mut request, 0).map(|()| request.buf)))
                .collect(),
        ),
    }
}

impl RingBatch {
    fn push_all(&mut self, ring: &mut LocalRing) -> std::io::Result<()> {
        assert!(self.requests.len() < 1 << INDEX_BITS, "a batch of {} IOs", self.requests.len());
        let fd = types::Fd(self.file.as_raw_fd());
        for index in 0..self.requests.len() {
            while ring.in_flight >= RING_ENTRIES as usize {
                self.reap_into(ring)?;
            }
            let request = self.requests[index].as_mut().expect("not yet submitted");
            request.assert_aligned();
            let (len, offset) = (request.buf.len() as u32, request.offset_bytes);
            let entry = match request.op {
                IoOp::Write => opcode::Write::new(fd, request.buf.as_ptr(), len).offset(offset).build(),
                IoOp::Read => opcode::Read::new(fd, request.buf.as_mut_ptr(), len).offset(offset).build(),
            }
            .user_data(self.id << INDEX_BITS | index as u64);
            // SAFETY: the buffer belongs to this batch and is neither touched nor freed
            // until its completion is reaped (`wait`, or `Drop`), or it is leaked when the
            // ring fails. At most RING_ENTRIES are in flight, the submission queue's size,
            // and everything pushed is submitted before the next push can find it full.
            while unsafe { ring.ring.submission().push(&entry) }.is_err() {
                ring.ring.submit()?;
            }
            ring.in_flight += 1;
            self.outstanding += 1;
        }
        loop {
            match ring.ring.submit() {
                Ok(_) => return Ok(()),
                Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR)) => {}
                // Left in the queue; the next wait submits it.
                Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EBUSY)) => return Ok(()),
                Err(e) => return Err(e),
            }
        }
    }

    fn reap_into(&mut self, ring: &mut LocalRing) -> std::io::Result<()> {
        let (id, results, outstanding) = (self.id, &mut self.results, &mut self.outstanding);
        ring.reap(|batch, index, result| {
            if batch != id {
                return false;
            }
            results[index] = Some(result);
            *outstanding -= 1;
            true
        })
    }

    /// Reap every completion of this batch.
    fn reap_all(&mut self) {
        if self.outstanding == 0 {
            return;
        }
        let reaped = RING.try_with(|cell| {
            let mut slot = cell.borrow_mut();
            let Some(ring) = slot.as_mut().filter(|r| r.generation == self.generation) else {
                return Err(std::io::Error::other("the ring that ran this batch failed"));
            };
            for (index, result) in ring.stash.remove(&self.id).unwrap_or_default() {
                self.results[index] = Some(result);
                self.outstanding -= 1;
            }
            while self.outstanding > 0 {
                if let Err(e) = self.reap_into(ring) {
                    tracing::error!("io_uring failed with IOs in flight ({e}); building a new ring");
                    *slot = None;
                    return Err(e);
                }
            }
            Ok(())
        });
        match reaped {
            Ok(Ok(())) => {}
            Ok(Err(e)) => self.abandon(&e),
            Err(_) => self.abandon(&std::io::Error::other("thread is exiting")),
        }
    }

    /// The ring is gone with IOs of this batch in flight: fail them and leak their
    /// buffers, which the kernel may still be using.
    fn abandon(&mut self, cause: &std::io::Error) {
        for (request, result) in self.requests.iter_mut().zip(&mut self.results) {
            if result.is_none() {
                *result = Some(-cause.raw_os_error().unwrap_or(libc::EIO));
                if let Some(request) = request.take() {
                    std::mem::forget(request.buf);
                }
            }
        }
        self.outstanding = 0;
    }

    /// Wait for every IO of the batch: each buffer, or its error, by batch index.
    pub(crate) fn wait(mut self) -> Vec<(usize, Result<AlignedBuf>)> {
        self.reap_all();
        let requests = std::mem::take(&mut self.requests);
        let results = std::mem::take(&mut self.results);
        requests
            .into_iter()
            .zip(results)
            .enumerate()
            .map(|(index, (request, result))| {
                let outcome = match (request, result) {
                    (Some(mut request), Some(n)) => match n {
                        n if n < 0 => Err(io_error(&request, std::io::Error::from_raw_os_error(-n))),
                        n if (n as usize) < request.buf.len() => finish_sync(&self.file, &mut request, n as usize).map(|()| request.buf),
                        _ => Ok(request.buf),
                    },
                    (_, result) => Err(Error::io("SSD IO", std::io::Error::from_raw_os_error(result.map_or(libc::EIO, |n| -n).max(1)))),
                };
                (index, outcome)
            })
            .collect()
    }
}

impl Drop for RingBatch {
    fn drop(&mut self) {
        self.reap_all();
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::OpenOptionsExt;

    use super::*;

    fn direct_file(dir: &tempfile::TempDir, len: u64) -> Arc<File> {
        let path = dir.path().join("ssd.img");
        let file =
            std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).custom_flags(libc::O_DIRECT).open(path).unwrap();
        file.set_len(len).unwrap();
        Arc::new(file)
    }

    fn writes(first: u64, n: u64, fill: impl Fn(u64) -> u8) -> Vec<IoRequest> {
        (first..first + n)
            .map(|i| {
                let mut buf = AlignedBuf::zeroed(4096);
                buf.fill(fill(i));
                IoRequest { op: IoOp::Write, offset_bytes: i * 4096, buf }
            })
            .collect()
    }

    fn wait(submitted: Submitted) -> Vec<AlignedBuf> {
        let outcomes = match submitted {
            Submitted::Ring(batch) => batch.wait(),
            Submitted::Done(outcomes) => outcomes,
        };
        outcomes.into_iter().enumerate().map(|(i, (index, outcome))| (assert_eq!(i, index), outcome.unwrap()).1).collect()
    }

    fn read_back(file: &Arc<File>, n: u64) -> Vec<u8> {
        let reads = (0..n).map(|i| IoRequest { op: IoOp::Read, offset_bytes: i * 4096, buf: AlignedBuf::zeroed(4096) }).collect();
        wait(submit(file, reads)).iter().map(|buf| buf[0]).collect()
    }

    #[test]
    fn batches_waited_out_of_order_get_their_own_completions() {
        let dir = tempfile::tempdir().unwrap();
        let file = direct_file(&dir, 1 << 20);
        let first = submit(&file, writes(0, 16, |i| i as u8 + 1));
        let second = submit(&file, writes(16, 16, |i| i as u8 + 1));
        // The second batch's wait reaps the first batch's completions too and keeps them.
        assert_eq!(wait(second).len(), 16);
        assert_eq!(wait(first).len(), 16);
        assert_eq!(read_back(&file, 32), (1..=32).collect::<Vec<u8>>());
    }

    #[test]
    fn a_batch_larger_than_the_ring_completes() {
        let dir = tempfile::tempdir().unwrap();
        let file = direct_file(&dir, 4 << 20);
        let n = 3 * u64::from(RING_ENTRIES) + 5;
        assert_eq!(wait(submit(&file, writes(0, n, |i| (i % 251) as u8))).len(), n as usize);
        assert_eq!(read_back(&file, n), (0..n).map(|i| (i % 251) as u8).collect::<Vec<u8>>());
    }

    #[test]
    fn a_dropped_batch_is_finished_before_its_buffers_go() {
        let dir = tempfile::tempdir().unwrap();
        let file = direct_file(&dir, 1 << 20);
        drop(submit(&file, writes(0, 8, |_| 7)));
        assert_eq!(read_back(&file, 8), vec![7; 8]);
    }

    #[test]
    fn a_failed_io_is_an_error_and_the_ring_keeps_working() {
        let dir = tempfile::tempdir().unwrap();
        let file = direct_file(&dir, 64 << 10);
        // The second read starts past the end: a short (empty) read, finished
        // synchronously, which fails.
        let reads =
            [0u64, 1 << 20].iter().map(|&offset_bytes| IoRequest { op: IoOp::Read, offset_bytes, buf: AlignedBuf::zeroed(4096) }).collect();
        let outcomes = match submit(&file, reads) {
            Submitted::Ring(batch) => batch.wait(),
            Submitted::Done(outcomes) => outcomes,
        };
        assert!(outcomes[0].1.is_ok());
        assert!(outcomes[1].1.is_err());
        assert_eq!(wait(submit(&file, writes(0, 2, |_| 9))).len(), 2);
        assert_eq!(read_back(&file, 2), vec![9, 9]);
    }

    #[test]
    fn each_thread_uses_its_own_ring() {
        let dir = tempfile::tempdir().unwrap();
        let file = direct_file(&dir, 1 << 20);
        std::thread::scope(|s| {
            for t in 0..4u64 {
                let file = &file;
                s.spawn(move || {
                    for round in 0..20u64 {
                        wait(submit(file, writes(t * 8, 8, |i| (i + round) as u8)));
                    }
                });
            }
        });
        assert_eq!(read_back(&file, 32), (0..32).map(|i| i as u8 + 19).collect::<Vec<u8>>());
    }
}
