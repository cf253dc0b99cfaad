//! How bytes move to the SSD.
//!
//! With io_uring (the default) every thread that submits IO owns a ring and submits to it
//! itself ([`local_ring`]): a batch's IOs are all in flight at once, and large runs, cut at
//! `split` boundaries by the caller, sit in the ring together, so depth in the ring, not
//! thread count, fills the device. Without io_uring, `workers` threads run synchronous
//! pread/pwrite; an IO at SSD address `a` goes to worker `(a / split) % workers`, so a
//! large run still spreads over all of them.
//!
//! Ordering: IOs of a batch, and of batches in flight together, may complete in any
//! order. The volume never has two IOs in flight to overlapping SSD ranges (blocks are
//! written out of place and freed only after their last reader is gone), so no order is
//! needed.

mod local_ring;

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender};

use crate::device::{IoOp, IoOutcome, IoRequest, IoTicket};
use crate::error::Error;

pub(crate) use local_ring::RingBatch;

/// Which mechanism moves the bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoBackend {
    /// io_uring: each submitting thread's own ring, many IOs in flight.
    Uring,
    /// Synchronous pread/pwrite on worker threads (io_uring unavailable or refused).
    ThreadPool,
}

struct Job {
    index: usize,
    request: IoRequest,
    reply: Sender<IoOutcome>,
}

pub(crate) struct IoEngine {
    file: Arc<File>,
    /// Thread pool only: one queue per worker; a message is that worker's share of one
    /// batch.
    queues: Vec<Sender<Vec<Job>>>,
    workers: Vec<JoinHandle<()>>,
    split_bytes: u64,
    backend: IoBackend,
}

impl IoEngine {
    /// `want` = `None` picks io_uring when the kernel allows it and falls back to a pool
    /// of `workers` threads otherwise.
    pub fn start(file: Arc<File>, workers: usize, split_bytes: u64, want: Option<IoBackend>) -> IoEngine {
        let backend = match want {
            Some(IoBackend::ThreadPool) => IoBackend::ThreadPool,
            _ if io_uring::IoUring::new(8).is_ok() => IoBackend::Uring,
            _ => IoBackend::ThreadPool,
        };
        let (mut queues, mut handles) = (Vec::new(), Vec::new());
        if backend == IoBackend::ThreadPool {
            for id in 0..workers.max(1) {
                let (tx, rx) = crossbeam_channel::unbounded::<Vec<Job>>();
                let file = Arc::clone(&file);
                let handle = std::thread::Builder::new()
                    .name(format!("alignfs-io{id}"))
                    .spawn(move || sync_worker(&file, &rx))
                    .expect("spawn IO worker thread");
                queues.push(tx);
                handles.push(handle);
            }
        }
        IoEngine { file, queues, workers: handles, split_bytes, backend }
    }

    pub fn backend(&self) -> IoBackend {
        self.backend
    }

    pub fn submit(&self, batch: Vec<IoRequest>) -> IoTicket {
        if self.backend == IoBackend::Uring {
            return match local_ring::submit(&self.file, batch) {
                local_ring::Submitted::Ring(batch) => IoTicket::ring(batch),
                local_ring::Submitted::Done(outcomes) => IoTicket::done(outcomes),
            };
        }
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

/// Perform a batch in the caller's thread, one request after another: for a file in
/// memory, where each IO is a copy and handing it to a worker only adds a wake-up.
pub(crate) fn perform_inline(file: &File, batch: Vec<IoRequest>) -> IoTicket {
    let outcomes = batch
        .into_iter()
        .enumerate()
        .map(|(index, mut request)| (index, finish_sync(file, &mut request, 0).map(|()| request.buf)))
        .collect();
    IoTicket::done(outcomes)
}

/// Finish (or entirely perform) a request synchronously, from byte `done` on.
fn finish_sync(file: &File, request: &mut IoRequest, done: usize) -> Result<(), Error> {
    let offset = request.offset_bytes + done as u64;
    let result = match request.op {
        IoOp::Write => file.write_all_at(&request.buf[done..], offset),
        IoOp::Read => file.read_exact_at(&mut request.buf[done..], offset),
    };
    result.map_err(|e| io_error(request, e))
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

fn io_error(request: &IoRequest, source: std::io::Error) -> Error {
    Error::io(format!("SSD {:?} of {} bytes at {}", request.op, request.buf.len(), request.offset_bytes), source)
}
