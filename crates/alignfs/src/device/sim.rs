//! A simulated SSD in memory, with injectable faults. Most tests run on it: fast,
//! deterministic, and it survives "crashes" (dropping the volume) because the test keeps
//! the `Arc`.

use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use super::faults::FaultPlan;
use super::{BlockDevice, IoOp, IoRequest, IoTicket};
use crate::error::{Error, Result};

pub struct SimSsd {
    bytes: Mutex<Vec<u8>>,
    pub faults: FaultPlan,
    pub writes: AtomicU64,
    pub reads: AtomicU64,
    pub flushes: AtomicU64,
}

impl SimSsd {
    pub fn new(len_bytes: u64) -> SimSsd {
        SimSsd {
            bytes: Mutex::new(vec![0; len_bytes as usize]),
            faults: FaultPlan::default(),
            writes: AtomicU64::new(0),
            reads: AtomicU64::new(0),
            flushes: AtomicU64::new(0),
        }
    }

    /// A device holding `bytes` (a crash image, say).
    pub fn with_contents(bytes: Vec<u8>) -> SimSsd {
        SimSsd { bytes: Mutex::new(bytes), ..SimSsd::new(0) }
    }

    /// Overwrite raw bytes, bypassing the volume (tests corrupt media with this).
    pub fn poke(&self, offset: u64, data: &[u8]) {
        let mut bytes = self.bytes.lock();
        bytes[offset as usize..offset as usize + data.len()].copy_from_slice(data);
    }

    pub fn peek(&self, offset: u64, len: usize) -> Vec<u8> {
        self.bytes.lock()[offset as usize..offset as usize + len].to_vec()
    }

    fn range(&self, offset: u64, len: usize) -> Result<std::ops::Range<usize>> {
        let end = offset.checked_add(len as u64).filter(|&e| e <= self.len_bytes());
        match end {
            Some(end) => Ok(offset as usize..end as usize),
            None => Err(Error::io("simulated SSD", std::io::Error::from_raw_os_error(libc::EINVAL))),
        }
    }

    fn execute(&self, request: &mut IoRequest) -> Result<()> {
        request.assert_aligned();
        let range = self.range(request.offset_bytes, request.buf.len())?;
        match request.op {
            IoOp::Write => {
                if FaultPlan::fires(&self.faults.fail_write_in) {
                    return Err(Error::Injected("SSD write"));
                }
                self.writes.fetch_add(1, Ordering::Relaxed);
                self.bytes.lock()[range].copy_from_slice(&request.buf);
            }
            IoOp::Read => {
                if FaultPlan::fires(&self.faults.fail_read_in) {
                    return Err(Error::Injected("SSD read"));
                }
                self.reads.fetch_add(1, Ordering::Relaxed);
                request.buf.copy_from_slice(&self.bytes.lock()[range]);
            }
        }
        Ok(())
    }
}

impl BlockDevice for SimSsd {
    fn len_bytes(&self) -> u64 {
        self.bytes.lock().len() as u64
    }

    fn submit(&self, batch: Vec<IoRequest>) -> IoTicket {
        let (tx, ticket) = IoTicket::channel(batch.len());
        for (index, mut request) in batch.into_iter().enumerate() {
            let outcome = self.execute(&mut request).map(|()| request.buf);
            tx.send((index, outcome)).expect("ticket holds the receiver");
        }
        ticket
    }

    fn read_buffered(&self, offset_bytes: u64, buf: &mut [u8]) -> Result<()> {
        if FaultPlan::fires(&self.faults.fail_read_in) {
            return Err(Error::Injected("SSD read"));
        }
        let range = self.range(offset_bytes, buf.len())?;
        self.reads.fetch_add(1, Ordering::Relaxed);
        buf.copy_from_slice(&self.bytes.lock()[range]);
        Ok(())
    }

    /// The simulation lives in memory: every read is a cached one.
    fn read_cached(&self, offset_bytes: u64, buf: &mut [u8]) -> Result<bool> {
        self.read_buffered(offset_bytes, buf).map(|()| true)
    }

    fn flush(&self) -> Result<()> {
        if FaultPlan::fires(&self.faults.fail_flush_in) {
            return Err(Error::Injected("SSD flush"));
        }
        self.flushes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn describe(&self) -> String {
        format!("simulated SSD, {} bytes in memory", self.len_bytes())
    }
}
