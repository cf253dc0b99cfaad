//! Injected device faults: a plan of one-shot faults, and a wrapper that applies it to any
//! SSD. The simulated SSD reads the same plan; `alignfs mount --inject-faults` wraps the
//! real device so the suites can fail IOs under a live mount.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::{AlignedBuf, BlockDevice, IoOp, IoRequest, IoTicket};
use crate::error::{Error, Result};
use crate::geometry::IO_ALIGN;

/// Faults to inject: each counter, when non-zero, fails the n-th next operation of its kind
/// (1 = the next one) and then disarms. A *short* fault lets the device complete the first
/// half of the IO before it fails, as a device that dies mid-transfer would.
#[derive(Default)]
pub struct FaultPlan {
    pub fail_write_in: AtomicU64,
    pub fail_read_in: AtomicU64,
    pub fail_flush_in: AtomicU64,
    pub short_write_in: AtomicU64,
    pub short_read_in: AtomicU64,
}

impl std::fmt::Debug for FaultPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FaultPlan({})", self.describe())
    }
}

/// What happens to one IO.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    None,
    Fail,
    Short,
}

impl FaultPlan {
    /// Count down one counter; true when it reaches its target.
    pub fn fires(counter: &AtomicU64) -> bool {
        counter
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| if n == 0 { None } else { Some(n - 1) })
            .map(|previous| previous == 1)
            .unwrap_or(false)
    }

    /// Every armed counter moves by one IO of this kind; a plain failure wins over a short one.
    pub fn next(&self, op: IoOp) -> Fault {
        let (fail, short) = match op {
            IoOp::Write => (&self.fail_write_in, &self.short_write_in),
            IoOp::Read => (&self.fail_read_in, &self.short_read_in),
        };
        match (Self::fires(fail), Self::fires(short)) {
            (true, _) => Fault::Fail,
            (false, true) => Fault::Short,
            _ => Fault::None,
        }
    }

    fn counters(&self) -> [(&'static str, &AtomicU64); 5] {
        [
            ("write", &self.fail_write_in),
            ("read", &self.fail_read_in),
            ("flush", &self.fail_flush_in),
            ("short-write", &self.short_write_in),
            ("short-read", &self.short_read_in),
        ]
    }

    /// Arm faults from text such as `write=1 flush=2` (fail the next write and the second
    /// flush from now), or disarm everything with `clear`.
    pub fn arm(&self, spec: &str) -> Result<()> {
        let counters = self.counters();
        let mut settings = Vec::new();
        for word in spec.split_whitespace() {
            if word == "clear" {
                settings.extend(counters.iter().map(|(_, counter)| (*counter, 0)));
                continue;
            }
            let bad = || {
                Error::InvalidArgument(format!(
                    "fault `{word}`: expected KIND=N with KIND one of write, read, flush, short-write, short-read, or `clear`"
                ))
            };
            let (kind, n) = word.split_once('=').ok_or_else(bad)?;
            let n: u64 = n.parse().map_err(|_| bad())?;
            let counter = counters.iter().find(|(name, _)| *name == kind).ok_or_else(bad)?.1;
            settings.push((counter, n));
        }
        if settings.is_empty() {
            return Err(Error::InvalidArgument("no fault given (e.g. `write=1`, or `clear`)".into()));
        }
        // Checked first, applied after: a bad word arms nothing.
        for (counter, n) in settings {
            counter.store(n, Ordering::SeqCst);
        }
        Ok(())
    }

    /// The armed counters, as `arm` reads them (`none` when nothing is armed).
    pub fn describe(&self) -> String {
        let armed: Vec<String> = self
            .counters()
            .iter()
            .filter_map(|(name, c)| {
                let n = c.load(Ordering::SeqCst);
                (n > 0).then(|| format!("{name}={n}"))
            })
            .collect();
        if armed.is_empty() {
            "none".into()
        } else {
            armed.join(" ")
        }
    }
}

/// Any SSD with a [`FaultPlan`] in front of it.
pub struct FaultyDevice {
    inner: Arc<dyn BlockDevice>,
    plan: Arc<FaultPlan>,
}

impl FaultyDevice {
    pub fn new(inner: Arc<dyn BlockDevice>, plan: Arc<FaultPlan>) -> FaultyDevice {
        FaultyDevice { inner, plan }
    }

    /// One IO through the plan. Faulted IOs run alone, so the rest of a batch keeps the
    /// inner device's parallelism.
    fn faulted(&self, request: IoRequest, fault: Fault) -> Result<AlignedBuf> {
        let write = request.op == IoOp::Write;
        if fault != Fault::Short {
            return Err(Error::Injected(if write { "SSD write" } else { "SSD read" }));
        }
        let half = (request.buf.len() / 2 / IO_ALIGN) * IO_ALIGN;
        if half > 0 {
            let mut part = AlignedBuf::zeroed(half);
            part.copy_from_slice(&request.buf[..half]);
            let partial = IoRequest { op: request.op, offset_bytes: request.offset_bytes, buf: part };
            self.inner.submit(vec![partial]).wait()?;
        }
        Err(Error::Injected(if write { "short SSD write" } else { "short SSD read" }))
    }
}

impl BlockDevice for FaultyDevice {
    fn len_bytes(&self) -> u64 {
        self.inner.len_bytes()
    }

    fn submit(&self, batch: Vec<IoRequest>) -> IoTicket {
        let (tx, ticket) = IoTicket::channel(batch.len());
        let mut passed = Vec::new();
        let mut passed_index = Vec::new();
        for (index, request) in batch.into_iter().enumerate() {
            match self.plan.next(request.op) {
                Fault::None => {
                    passed_index.push(index);
                    passed.push(request);
                }
                fault => {
                    let outcome = self.faulted(request, fault);
                    tx.send((index, outcome)).expect("ticket holds the receiver");
                }
            }
        }
        if !passed.is_empty() {
            match self.inner.submit(passed).wait() {
                Ok(buffers) => {
                    for (index, buf) in passed_index.into_iter().zip(buffers) {
                        tx.send((index, Ok(buf))).expect("ticket holds the receiver");
                    }
                }
                Err(e) => {
                    // The inner ticket reports one error for its whole batch; each IO of it
                    // fails with that error's text.
                    let context = e.to_string();
                    let mut first = Some(e);
                    for index in passed_index {
                        let error =
                            first.take().unwrap_or_else(|| Error::io(context.clone(), std::io::Error::from_raw_os_error(libc::EIO)));
                        tx.send((index, Err(error))).expect("ticket holds the receiver");
                    }
                }
            }
        }
        ticket
    }

    fn read_buffered(&self, offset_bytes: u64, buf: &mut [u8]) -> Result<()> {
        match self.plan.next(IoOp::Read) {
            Fault::None => self.inner.read_buffered(offset_bytes, buf),
            Fault::Fail => Err(Error::Injected("SSD read")),
            Fault::Short => {
                let half = buf.len() / 2;
                self.inner.read_buffered(offset_bytes, &mut buf[..half])?;
                Err(Error::Injected("short SSD read"))
            }
        }
    }

    fn flush(&self) -> Result<()> {
        if FaultPlan::fires(&self.plan.fail_flush_in) {
            return Err(Error::Injected("SSD flush"));
        }
        self.inner.flush()
    }

    fn needs_flush(&self) -> bool {
        self.inner.needs_flush()
    }

    fn member_count(&self) -> usize {
        self.inner.member_count()
    }

    fn member_bytes(&self) -> u64 {
        self.inner.member_bytes()
    }

    fn describe(&self) -> String {
        format!("{} (fault injection on)", self.inner.describe())
    }

    fn cached_bytes(&self) -> Option<u64> {
        self.inner.cached_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::SimSsd;

    #[test]
    fn arm_parses_counts_and_refuses_bad_words_without_arming_anything() {
        let plan = FaultPlan::default();
        plan.arm("write=2 short-read=1").unwrap();
        assert_eq!(plan.describe(), "write=2 short-read=1");
        assert!(plan.arm("flush=1 bogus=3").is_err());
        assert!(plan.arm("write").is_err());
        assert!(plan.arm("").is_err());
        assert_eq!(plan.describe(), "write=2 short-read=1");
        plan.arm("clear").unwrap();
        assert_eq!(plan.describe(), "none");
    }

    #[test]
    fn the_nth_io_fails_and_a_short_write_lands_only_its_first_half() {
        let sim = Arc::new(SimSsd::new(1 << 20));
        let plan = Arc::new(FaultPlan::default());
        let device = FaultyDevice::new(sim.clone(), plan.clone());
        let write = |at: u64, byte: u8| {
            let mut buf = AlignedBuf::zeroed(8192);
            buf.fill(byte);
            device.submit(vec![IoRequest { op: IoOp::Write, offset_bytes: at, buf }]).wait()
        };
        plan.arm("write=2").unwrap();
        assert!(write(0, 1).is_ok());
        assert!(matches!(write(8192, 2), Err(Error::Injected(_))));
        assert_eq!(sim.peek(8192, 1), [0]);
        assert!(write(8192, 3).is_ok());
        plan.arm("short-write=1").unwrap();
        assert!(write(16384, 4).is_err());
        assert_eq!(sim.peek(16384, 8192), [vec![4; 4096], vec![0; 4096]].concat());
        plan.arm("flush=1").unwrap();
        assert!(device.flush().is_err());
        assert!(device.flush().is_ok());
    }
}
