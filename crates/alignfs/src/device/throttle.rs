//! A device slowed to a fixed bandwidth, for measuring how throughput grows with the
//! number of SSDs when every image here shares one disk (`alignfs-ssd-scaling`). One
//! worker thread per device serves its requests in order, each taking at least
//! `bytes / bandwidth`, so two throttled devices move twice the bytes of one.

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;

use super::{BlockDevice, IoOutcome, IoRequest, IoTicket};
use crate::error::Result;

type Job = (Vec<IoRequest>, Sender<IoOutcome>);

pub struct Throttled {
    inner: Arc<dyn BlockDevice>,
    queue: Option<Sender<Job>>,
    worker: Option<JoinHandle<()>>,
    bytes_per_second: u64,
}

impl Throttled {
    pub fn new(inner: Arc<dyn BlockDevice>, bytes_per_second: u64) -> Throttled {
        let (queue, jobs) = crossbeam_channel::unbounded::<Job>();
        let device = Arc::clone(&inner);
        let worker = std::thread::Builder::new()
            .name("alignfs-throttle".into())
            .spawn(move || {
                let mut busy_until = Instant::now();
                for (batch, reply) in jobs {
                    for (index, request) in batch.into_iter().enumerate() {
                        let cost = Duration::from_secs_f64(request.buf.len() as f64 / bytes_per_second as f64);
                        busy_until = busy_until.max(Instant::now()) + cost;
                        let outcome = device.submit(vec![request]).wait().map(|mut b| b.remove(0));
                        std::thread::sleep(busy_until.saturating_duration_since(Instant::now()));
                        let _ = reply.send((index, outcome));
                    }
                }
            })
            .expect("spawn throttle thread");
        Throttled { inner, queue: Some(queue), worker: Some(worker), bytes_per_second }
    }
}

impl Drop for Throttled {
    fn drop(&mut self) {
        self.queue.take();
        if let Some(worker) = self.worker.take() {
            let _ = worker.join();
        }
    }
}

impl BlockDevice for Throttled {
    fn len_bytes(&self) -> u64 {
        self.inner.len_bytes()
    }

    fn submit(&self, batch: Vec<IoRequest>) -> IoTicket {
        let (reply, ticket) = IoTicket::channel(batch.len());
        if let Some(queue) = &self.queue {
            let _ = queue.send((batch, reply));
        }
        ticket
    }

    fn read_buffered(&self, offset_bytes: u64, buf: &mut [u8]) -> Result<()> {
        std::thread::sleep(Duration::from_secs_f64(buf.len() as f64 / self.bytes_per_second as f64));
        self.inner.read_buffered(offset_bytes, buf)
    }

    fn flush(&self) -> Result<()> {
        self.inner.flush()
    }

    fn needs_flush(&self) -> bool {
        self.inner.needs_flush()
    }

    fn describe(&self) -> String {
        format!("{} at {} MiB/s", self.inner.describe(), self.bytes_per_second >> 20)
    }

    fn cached_bytes(&self) -> Option<u64> {
        self.inner.cached_bytes()
    }
}
