//! Where bytes live: the SSD seam ([`BlockDevice`]) and the byte-addressable tier seam
//! ([`ByteTier`], implemented by the persistent-memory region [`PmemRegion`]), the
//! emulated memory-semantic SSD ([`mssd`]), plus the test twins: a simulated SSD, fault
//! injection, and power-loss recording.
//!
//! A block device moves owned, aligned buffers and hands them back with the result
//! (the shape io_uring needs). Every request's offset and length are multiples of
//! [`IO_ALIGN`]; implementations assert it, because an unaligned request is a bug in
//! the caller, never bad input.

mod aligned;
mod cachestat;
pub mod claim;
mod faults;
mod file_ssd;
mod io_engine;
pub mod mssd;
mod pmem;
mod pool;
pub mod power_loss;
mod set;
mod sim;
mod throttle;

pub use aligned::AlignedBuf;
pub use faults::{Fault, FaultPlan, FaultyDevice};
pub use file_ssd::{FileSsd, IoBackend, SsdOptions};
pub use pmem::{PersistMode, PmemRegion};
pub use pool::BufferPool;
pub use set::DeviceSet;
pub use sim::SimSsd;
pub use throttle::Throttled;

use std::sync::Arc;

use crossbeam_channel::{Receiver, Sender};

use crate::error::{Error, Result};
use crate::geometry::IO_ALIGN;
use io_engine::RingBatch;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoOp {
    Read,
    Write,
}

/// One aligned IO: read into or write from `buf` at `offset_bytes`.
#[derive(Debug)]
pub struct IoRequest {
    pub op: IoOp,
    pub offset_bytes: u64,
    pub buf: AlignedBuf,
}

impl IoRequest {
    pub fn assert_aligned(&self) {
        assert!(
            self.offset_bytes % IO_ALIGN as u64 == 0 && self.buf.len() % IO_ALIGN == 0,
            "unaligned SSD IO at {} of {} bytes",
            self.offset_bytes,
            self.buf.len()
        );
    }
}

/// The outcome of one request, tagged with its index in the submitted batch.
pub(crate) type IoOutcome = (usize, Result<AlignedBuf>);

/// A batch in flight; [`IoTicket::wait`] returns the buffers in submission order.
pub struct IoTicket {
    pending: usize,
    results: Receiver<IoOutcome>,
    /// A batch split over several devices: each part's ticket, with the batch index of
    /// each of its requests.
    parts: Vec<(Vec<usize>, IoTicket)>,
    /// A batch on the calling thread's io_uring.
    ring: Option<RingBatch>,
    /// What the device does once the batch finished, on the waiting thread (a
    /// memory-semantic SSD installs its new mappings and hands back the caller's buffers).
    then: Option<Completion>,
}

type Completion = Box<dyn FnOnce(Result<Vec<AlignedBuf>>) -> Result<Vec<AlignedBuf>> + Send>;

impl IoTicket {
    pub(crate) fn channel(pending: usize) -> (Sender<IoOutcome>, IoTicket) {
        let (tx, rx) = crossbeam_channel::bounded(pending.max(1));
        (tx, IoTicket { pending, results: rx, parts: Vec::new(), ring: None, then: None })
    }

    pub(crate) fn ring(batch: RingBatch) -> IoTicket {
        let (_, mut ticket) = IoTicket::channel(0);
        ticket.ring = Some(batch);
        ticket
    }

    /// A batch that already finished.
    pub(crate) fn done(outcomes: Vec<IoOutcome>) -> IoTicket {
        let (tx, ticket) = IoTicket::channel(outcomes.len());
        for outcome in outcomes {
            tx.send(outcome).expect("the channel holds the whole batch");
        }
        ticket
    }

    /// One ticket for a batch whose requests went to several devices.
    pub(crate) fn join(parts: Vec<(Vec<usize>, IoTicket)>) -> IoTicket {
        let (_, mut ticket) = IoTicket::channel(0);
        ticket.parts = parts;
        ticket
    }

    /// Run `step` on the batch's outcome when it is waited for, before the caller sees it.
    pub(crate) fn then(mut self, step: impl FnOnce(Result<Vec<AlignedBuf>>) -> Result<Vec<AlignedBuf>> + Send + 'static) -> IoTicket {
        let step: Completion = match self.then.take() {
            Some(first) => Box::new(move |outcome| step(first(outcome))),
            None => Box::new(step),
        };
        self.then = Some(step);
        self
    }

    /// Wait for every IO of the batch. The first error wins, after all have finished,
    /// so no buffer is still in use by the device when this returns.
    pub fn wait(mut self) -> Result<Vec<AlignedBuf>> {
        let then = self.then.take();
        let outcome = self.wait_batch();
        match then {
            Some(step) => step(outcome),
            None => outcome,
        }
    }

    fn wait_batch(self) -> Result<Vec<AlignedBuf>> {
        let mut outcomes: Vec<IoOutcome> = Vec::new();
        let total = if let Some(batch) = self.ring {
            outcomes = batch.wait();
            outcomes.len()
        } else if self.parts.is_empty() {
            for _ in 0..self.pending {
                match self.results.recv() {
                    Ok(outcome) => outcomes.push(outcome),
                    Err(_) => {
                        let gone = std::io::Error::other("IO worker exited with requests pending");
                        outcomes.push((usize::MAX, Err(Error::io("SSD IO worker", gone))));
                        break;
                    }
                }
            }
            self.pending
        } else {
            let total = self.parts.iter().map(|(indices, _)| indices.len()).sum();
            for (indices, part) in self.parts {
                match part.wait() {
                    Ok(buffers) => outcomes.extend(indices.into_iter().zip(buffers.into_iter().map(Ok))),
                    Err(e) => outcomes.push((usize::MAX, Err(e))),
                }
            }
            total
        };
        let mut slots: Vec<Option<AlignedBuf>> = (0..total).map(|_| None).collect();
        let mut first_error = None;
        for (index, outcome) in outcomes {
            match outcome {
                Ok(buf) => slots[index] = Some(buf),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(slots.into_iter().map(|s| s.expect("every slot completed")).collect()),
        }
    }
}

/// The SSD seam.
pub trait BlockDevice: Send + Sync {
    /// Bytes usable by the volume.
    fn len_bytes(&self) -> u64;
    /// Start a batch of aligned IOs; they may run in any order and concurrently.
    fn submit(&self, batch: Vec<IoRequest>) -> IoTicket;
    /// Read `buf.len()` bytes at any offset through the kernel's cache of the backing
    /// file (the buffered read mode). Devices without such a cache read directly.
    fn read_buffered(&self, offset_bytes: u64, buf: &mut [u8]) -> Result<()>;
    /// Read like [`BlockDevice::read_buffered`] only if every byte is already in memory
    /// (the kernel's cache): `Ok(false)`, with `buf` unspecified, when the read would wait
    /// for the device. Lets a server answer cached reads without handing them to a thread
    /// that may block. Devices without a cache always say `false`.
    fn read_cached(&self, _offset_bytes: u64, _buf: &mut [u8]) -> Result<bool> {
        Ok(false)
    }
    /// Start reading a range into the kernel's cache without waiting for it, so that the
    /// buffered reads that follow find their ranges in flight together instead of one
    /// after another. Only a hint: devices without such a cache ignore it.
    fn prefetch(&self, _offset_bytes: u64, _len: u64) {}
    /// Make completed writes durable (the device's volatile cache flush).
    fn flush(&self) -> Result<()>;
    /// Whether [`BlockDevice::flush`] does anything (false for write-through caches).
    fn needs_flush(&self) -> bool {
        true
    }
    /// One line for logs and `alignfs stat`: path, IO backend, cache mode.
    fn describe(&self) -> String;
    /// Bytes of the device the host's page cache holds (the buffered reads' cache); `None`
    /// for devices without one, or in memory already.
    fn cached_bytes(&self) -> Option<u64> {
        None
    }
    /// How many SSDs make up this device (a [`DeviceSet`] has several).
    fn member_count(&self) -> usize {
        1
    }
    /// Bytes of each member: member `i` holds `i * member_bytes ..`.
    fn member_bytes(&self) -> u64 {
        self.len_bytes()
    }
}

/// The byte-addressable persistent tier: loads and stores at any byte offset, durable
/// once persisted. `orch` keeps residue pages and its journal in one, a hybrid volume
/// (`uhs`) its buffer and NVM zone. (A memory-semantic SSD's byte interface is not one:
/// its stores belong to device transactions, [`mssd::MemorySemanticSsd`].)
///
/// Stores may be torn at 8-byte granularity by a power cut until persisted; callers keep
/// concurrent accesses to disjoint bytes.
pub trait ByteTier: Send + Sync {
    fn len_bytes(&self) -> u64;
    /// One line for logs and `alignfs stat`: path and persistence mode.
    fn describe(&self) -> String;
    fn write(&self, offset: u64, data: &[u8]);
    fn zero(&self, offset: u64, len: usize);
    fn read(&self, offset: u64, out: &mut [u8]);
    /// Make the bytes stored at `offset..offset + len` durable, ordered before any later
    /// store.
    fn persist(&self, offset: u64, len: usize);
    fn write_persist(&self, offset: u64, data: &[u8]) {
        self.write(offset, data);
        self.persist(offset, data.len());
    }
}

/// The first `len` bytes of a byte tier as a tier of its own: a block volume's engine
/// formats this much and leaves the rest to its NVM zone.
pub struct TierPrefix {
    tier: Arc<dyn ByteTier>,
    len: u64,
}

impl TierPrefix {
    pub fn new(tier: Arc<dyn ByteTier>, len: u64) -> TierPrefix {
        assert!(len <= tier.len_bytes(), "a prefix lies within its tier");
        TierPrefix { tier, len }
    }

    fn check(&self, offset: u64, len: usize) {
        assert!(offset + len as u64 <= self.len, "access at {offset}+{len} beyond the {}-byte prefix", self.len);
    }
}

impl ByteTier for TierPrefix {
    fn len_bytes(&self) -> u64 {
        self.len
    }
    fn describe(&self) -> String {
        format!("the first {} bytes of {}", self.len, self.tier.describe())
    }
    fn write(&self, offset: u64, data: &[u8]) {
        self.check(offset, data.len());
        self.tier.write(offset, data);
    }
    fn zero(&self, offset: u64, len: usize) {
        self.check(offset, len);
        self.tier.zero(offset, len);
    }
    fn read(&self, offset: u64, out: &mut [u8]) {
        self.check(offset, out.len());
        self.tier.read(offset, out);
    }
    fn persist(&self, offset: u64, len: usize) {
        self.check(offset, len);
        self.tier.persist(offset, len);
    }
}

/// Submit a batch and wait for it.
pub fn run_batch(device: &dyn BlockDevice, batch: Vec<IoRequest>) -> Result<Vec<AlignedBuf>> {
    device.submit(batch).wait()
}
