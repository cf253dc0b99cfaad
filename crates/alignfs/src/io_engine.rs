//! How bytes move to the SSD: `workers` threads, each owning a queue and (normally) an
//! io_uring. An IO at SSD address `a` goes to worker `(a / split) % workers`, so large runs,
//! cut at `split` boundaries by the caller, spread across workers and sit in their rings
//! together: depth in the ring, not thread count, is what fills the device.
//!
//! Ordering: a worker submits everything it has queued at once, so IOs in one ring may
//! complete in any order. The volume never has two IOs in flight to overlapping SSD
//! ranges (blocks are written out of place and freed only after their last reader is
//! gone), so no order is needed; debug builds check that within each ring batch.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender};

use crate::device::{IoOp, IoOutcome, IoRequest, IoTicket};
use crate::error::Error;

/// Which mechanism moves the bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoBackend {
    /// io_uring, many IOs in flight per worker.
    Uring,
    /// Synchronous pread/pwrite on each worker thread (io_uring unavailable or refused).
    ThreadPool,
}

const RING_ENTRIES: u32 = 128;

struct Job {
    index: usize,
    request: IoRequest,
    reply: Sender<IoOutcome>,
}

pub(crate) struct IoEngine {
    /// One queue per worker; a message is that worker's whole share of one batch, so the
    /// worker puts all of it in its ring at once.
    queues: Vec<Sender<Vec<Job>>>,
    workers: Vec<JoinHandle<()>>,
    split_bytes: u64,
    backend: IoBackend,
}

impl IoEngine {
    /// Start `workers` threads over `file`. `want` = `None` picks io_uring when the kernel
    /// allows it and falls back to the thread pool otherwise.
    pub fn start(file: Arc<File>, workers: usize, split_bytes: u64, want: Option<IoBackend>) -> IoEngine {
        let backend = match want {
            Some(IoBackend::ThreadPool) => IoBackend::ThreadPool,
            _ if io_uring::IoUring::new(RING_ENTRIES).is_ok() => IoBackend::Uring,
            _ => IoBackend::ThreadPool,
        };
        let mut queues = Vec::with_capacity(workers);
        let mut handles = Vec::with_capacity(workers);
        for id in 0..workers.max(1) {
            let (tx, rx) = crossbeam_channel::unbounded::<Vec<Job>>();
            let file = Arc::clone(&file);
            let handle = std::thread::Builder::new()
                .name(format!("alignfs-io{id}"))
                .spawn(move || match backend {
                    IoBackend::Uring => uring_worker(&file, &rx),
                    IoBackend::ThreadPool => sync_worker(&file, &rx),
                })
                .expect("spawn IO worker thread");
            queues.push(tx);
            handles.push(handle);
        }
        IoEngine { queues, workers: handles, split_bytes, backend }
    }

    pub fn backend(&self) -> IoBackend {
        self.backend
    }

    pub fn submit(&self, batch: Vec<IoRequest>) -> IoTicket {
        let (reply, ticket) = IoTicket::channel(batch.len());
        let mut shares: Vec<Vec<Job>> = (0..self.queues.len()).map(|_| Vec::new()).collect();
        for (index, request) in batch.into_iter().enumerate() {
            request.assert_aligned();
            let worker = ((request.offset_bytes / self.split_bytes) % self.queues.len() as u64) as usize;
            shares[worker].push(Job { index, request, reply: reply.clone() });
        }
        for (queue, share) in self.queues.iter().zip(shares).filter(|(_, s)| !s.is_empty()) {
            if let Err(rejected) = queue.send(share) {
                for job in rejected.into_inner() {
                    let _ = job.reply.send((job.index, Err(worker_gone())));
                }
            }
        }
        ticket
    }
}

impl Drop for IoEngine {
    fn drop(&mut self) {
        self.queues.clear();
        for handle in self.workers.drain(..) {
            let _ = handle.join();
        }
    }
}

fn worker_gone() -> Error {
    Error::io("SSD IO", std::io::Error::other("IO worker stopped"))
}

/// Finish (or entirely perform) a request synchronously, from byte `done` on.
fn finish_sync(file: &File, request: &mut IoRequest, done: usize) -> Result<(), Error> {
    let offset = request.offset_bytes + done as u64;
    let result = match request.op {
        IoOp::Write => file.write_all_at(&request.buf[done..], offset),
        IoOp::Read => file.read_exact_at(&mut request.buf[done..], offset),
    };
    result.map_err(|e| Error::io(format!("SSD {:?} of {} bytes at {}", request.op, request.buf.len(), request.offset_bytes), e))
}

fn complete(job: Job, outcome: Result<(), Error>) {
    let Job { index, request, reply } = job;
    let _ = reply.send((index, outcome.map(|()| request.buf)));
}

fn sync_worker(file: &File, queue: &Receiver<Vec<Job>>) {
    while let Ok(jobs) = queue.recv() {
        for mut job in jobs {
            let outcome = finish_sync(file, &mut job.request, 0);
            complete(job, outcome);
        }
    }
}

fn uring_worker(file: &File, queue: &Receiver<Vec<Job>>) {
    let mut ring = match io_uring::IoUring::new(RING_ENTRIES) {
        Ok(ring) => ring,
        Err(e) => {
            tracing::warn!("io_uring unavailable on this worker ({e}); using pread/pwrite");
            return sync_worker(file, queue);
        }
    };
    let mut pending: Vec<Job> = Vec::new();
    loop {
        if pending.is_empty() {
            match queue.recv() {
                Ok(share) => pending = share,
                Err(_) => return,
            }
        }
        while pending.len() < RING_ENTRIES as usize {
            match queue.try_recv() {
                Ok(share) => pending.extend(share),
                Err(_) => break,
            }
        }
        let take = pending.len().min(RING_ENTRIES as usize);
        let rest = pending.split_off(take);
        let mut jobs = std::mem::replace(&mut pending, rest);
        debug_assert!(no_overlap(&jobs), "overlapping SSD IOs in one ring batch");
        match run_ring(&mut ring, file, &mut jobs) {
            Ok(results) => {
                for (mut job, result) in jobs.into_iter().zip(results) {
                    let outcome = match result {
                        n if n < 0 => Err(io_error(&job.request, std::io::Error::from_raw_os_error(-n))),
                        n if (n as usize) < job.request.buf.len() => finish_sync(file, &mut job.request, n as usize),
                        _ => Ok(()),
                    };
                    complete(job, outcome);
                }
            }
            Err(e) => {
                tracing::error!("io_uring failed with IOs in flight ({e}); rebuilding the ring");
                for job in jobs {
                    let Job { index, request, reply } = job;
                    let error = io_error(&request, std::io::Error::new(e.kind(), e.to_string()));
                    // The kernel may still own the buffer: leak it rather than free it.
                    std::mem::forget(request.buf);
                    let _ = reply.send((index, Err(error)));
                }
                match io_uring::IoUring::new(RING_ENTRIES) {
                    Ok(fresh) => ring = fresh,
                    Err(_) => {
                        for mut job in pending.drain(..) {
                            let outcome = finish_sync(file, &mut job.request, 0);
                            complete(job, outcome);
                        }
                        return sync_worker(file, queue);
                    }
                }
            }
        }
    }
}

fn io_error(request: &IoRequest, source: std::io::Error) -> Error {
    Error::io(format!("SSD {:?} of {} bytes at {}", request.op, request.buf.len(), request.offset_bytes), source)
}

/// Submit every job to the ring and reap every completion, returning each job's result
/// (bytes moved, or a negative errno) in job order.
fn run_ring(ring: &mut io_uring::IoUring, file: &File, jobs: &mut [Job]) -> std::io::Result<Vec<i32>> {
    use io_uring::{opcode, types};
    let fd = types::Fd(file.as_raw_fd());
    {
        let mut submission = ring.submission();
        for (i, job) in jobs.iter_mut().enumerate() {
            let len = job.request.buf.len() as u32;
            let offset = job.request.offset_bytes;
            let entry = match job.request.op {
                IoOp::Write => opcode::Write::new(fd, job.request.buf.as_ptr(), len).offset(offset).build(),
                IoOp::Read => opcode::Read::new(fd, job.request.buf.as_mut_ptr(), len).offset(offset).build(),
            };
            // SAFETY: each buffer is owned by `jobs` and stays alive and untouched until
            // its completion is reaped below, or is leaked by the caller on failure. The
            // batch is at most RING_ENTRIES long, so the queue has room.
            unsafe { submission.push(&entry.user_data(i as u64)) }.expect("batch fits the submission queue");
        }
    }
    let mut results = vec![0i32; jobs.len()];
    let mut reaped = 0;
    while reaped < jobs.len() {
        match ring.submit_and_wait(1) {
            Ok(_) => {}
            Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR | libc::EAGAIN | libc::EBUSY)) => {}
            Err(e) => return Err(e),
        }
        for cqe in ring.completion() {
            results[cqe.user_data() as usize] = cqe.result();
            reaped += 1;
        }
    }
    Ok(results)
}

fn no_overlap(jobs: &[Job]) -> bool {
    let mut ranges: Vec<(u64, u64)> =
        jobs.iter().map(|j| (j.request.offset_bytes, j.request.offset_bytes + j.request.buf.len() as u64)).collect();
    ranges.sort_unstable();
    ranges.windows(2).all(|w| w[0].1 <= w[1].0)
}
