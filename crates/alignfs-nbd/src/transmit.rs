//! Transmission: requests read in order, served by a connection's workers, replies sent
//! as they finish; overlapping requests keep their arrival order.

use std::collections::VecDeque;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::sync::atomic::Ordering;
use std::time::Instant;

use parking_lot::{Condvar, Mutex};

use crate::config::{ExportEntry, ServerConfig, ServerStats, Stream};
use crate::protocol::*;
use crate::ExportError;

/// The bytes a request touches and whether it changes them; `None`: no data.
type Footprint = Option<(u64, u64, bool)>;

/// A request waiting for, or being served by, a worker.
struct Job {
    seq: u64,
    request: Request,
    payload: Vec<u8>,
    /// Decided while reading: the error to return without touching the export.
    refused: Option<u32>,
    /// When its header was read, for the service-time histograms.
    arrived: Instant,
}

impl Job {
    /// The byte range it touches and whether it changes it; `None` touches no data.
    fn footprint(&self) -> Footprint {
        let r = &self.request;
        let end = r.offset.saturating_add(u64::from(r.length));
        match r.command {
            _ if self.refused.is_some() => None,
            CMD_READ => Some((r.offset, end, false)),
            CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES => Some((r.offset, end, true)),
            _ => None,
        }
    }
}

fn conflicts(a: Footprint, b: Footprint) -> bool {
    match (a, b) {
        (Some((s1, e1, w1)), Some((s2, e2, w2))) => (w1 || w2) && s1 < e2 && s2 < e1,
        _ => false,
    }
}

/// The connection's queue: a job runs once no earlier job it conflicts with is waiting or
/// running, so overlapping requests keep their arrival order (RAW, WAW, WAR) whichever
/// worker serves them.
#[derive(Default)]
struct Queue {
    waiting: VecDeque<Job>,
    running: Vec<(u64, Footprint)>,
    /// Payload bytes held by waiting and running jobs.
    held_bytes: u64,
    closed: bool,
}

impl Queue {
    /// Whether a job with footprint `f` behind the first `ahead` waiting jobs may run:
    /// nothing it overlaps is running or waiting ahead of it.
    fn clear_for(&self, f: Footprint, ahead: usize) -> bool {
        !self.running.iter().any(|(_, r)| conflicts(*r, f)) && !self.waiting.iter().take(ahead).any(|e| conflicts(e.footprint(), f))
    }

    fn take_runnable(&mut self) -> Option<Job> {
        let index = (0..self.waiting.len()).find(|&i| self.clear_for(self.waiting[i].footprint(), i))?;
        let job = self.waiting.remove(index)?;
        self.running.push((job.seq, job.footprint()));
        Some(job)
    }
}

struct Connection<'e, S: Stream> {
    entry: &'e ExportEntry,
    queue: Mutex<Queue>,
    /// A job may have become runnable, or the queue closed (workers wait on it).
    work: Condvar,
    /// Held payload bytes went down (the reader waits on it).
    room: Condvar,
    writer: Mutex<BufWriter<S>>,
    stats: &'e ServerStats,
}

/// When a reply goes out: at once (a worker's), or with the next send of the thread that
/// reads requests (its own, while more requests wait in its buffer).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Delivery {
    Now,
    Held,
}

/// Most payload bytes a connection holds before the reader waits for workers.
const MAX_HELD_BYTES: u64 = 128 << 20;

pub(crate) fn transmit<S: Stream>(
    stream: S,
    mut reader: BufReader<S>,
    entry: &ExportEntry,
    config: &ServerConfig,
    stats: &ServerStats,
) -> Result<(), Hangup> {
    let connection = Connection {
        entry,
        queue: Mutex::default(),
        work: Condvar::new(),
        room: Condvar::new(),
        writer: Mutex::new(BufWriter::with_capacity(256 << 10, stream)),
        stats,
    };
    std::thread::scope(|scope| {
        for _ in 0..config.workers_per_connection.max(1) {
            scope.spawn(|| connection.work());
        }
        let result = connection.read_requests(&mut reader, config);
        connection.send_held_replies();
        let mut queue = connection.queue.lock();
        queue.closed = true;
        connection.work.notify_all();
        drop(queue);
        result
    })
}

impl<S: Stream> Connection<'_, S> {
    fn read_requests<R: Read>(&self, r: &mut BufReader<R>, config: &ServerConfig) -> Result<(), Hangup> {
        let block = u64::from(self.entry.export.block_size());
        let size = self.entry.export.size();
        for seq in 0.. {
            // Replies of requests served here wait in the writer while more requests are
            // already buffered: one send then carries several. Before this thread can
            // block on the socket, they go out.
            if r.buffer().len() < Request::BYTES {
                self.send_held_replies();
            }
            let request = match Request::read(r) {
                Ok(request) => request,
                // A client that closes instead of sending DISC has still left.
                Err(Hangup::Io(e)) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
                Err(e) => return Err(e),
            };
            let arrived = Instant::now();
            self.stats.requests.fetch_add(1, Ordering::Relaxed);
            if request.command == CMD_DISC {
                return Ok(());
            }
            let length = u64::from(request.length);
            let too_big = request.length > config.max_request_bytes && matches!(request.command, CMD_READ | CMD_WRITE);
            let out_of_range = request.offset.checked_add(length).is_none_or(|end| end > size);
            let misaligned = request.offset % block != 0 || length % block != 0;
            let writes = matches!(request.command, CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES);
            let refused = match request.command {
                CMD_READ | CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES | CMD_FLUSH => None,
                _ => Some(EINVAL),
            }
            .or_else(|| (writes && self.entry.read_only).then_some(EPERM))
            .or_else(|| (request.command != CMD_FLUSH && (too_big || out_of_range || misaligned)).then_some(EINVAL));
            let mut payload = Vec::new();
            if request.command == CMD_WRITE {
                if refused.is_none() {
                    payload = vec![0u8; request.length as usize];
                    r.read_exact(&mut payload)?;
                } else {
                    // The payload follows the header whatever we answer: skip it.
                    io::copy(&mut r.take(length), &mut io::sink())?;
                }
            }
            let job = Job { seq, request, payload, refused, arrived };
            let mut queue = self.queue.lock();
            // A client waiting for this reply before it sends more (queue depth 1, or the
            // last of a burst) gets it from this thread: a hand-off to a worker and back
            // would cost two wake-ups. Nothing else runs, so no order can be broken.
            if queue.waiting.is_empty() && queue.running.is_empty() && r.buffer().is_empty() {
                drop(queue);
                self.stats.served_by_reader.fetch_add(1, Ordering::Relaxed);
                self.execute(&job, Delivery::Held);
                continue;
            }
            // So does a request that needs no device IO (a cached read, a write into NVM)
            // and overlaps nothing waiting or running: on a busy connection the hand-offs
            // cost more than the request. Only this thread adds jobs, so the check holds
            // while it serves.
            if self.may_be_quick(&job) && queue.clear_for(job.footprint(), queue.waiting.len()) {
                drop(queue);
                if self.execute_if_quick(&job) {
                    self.stats.served_by_reader.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                queue = self.queue.lock();
            }
            while queue.held_bytes > MAX_HELD_BYTES {
                self.room.wait(&mut queue);
            }
            queue.held_bytes += job.payload.len() as u64;
            queue.waiting.push_back(job);
            self.work.notify_one();
        }
        Ok(())
    }

    /// Serve a job (or answer its refusal) and send the reply.
    fn execute(&self, job: &Job, send: Delivery) {
        let result = match job.refused {
            Some(errno) => Err(ExportError(errno)),
            None => self.serve(job),
        };
        self.answer(job, result, send);
    }

    /// Reply with a request's data, or its error (counted).
    fn answer(&self, job: &Job, result: Result<Vec<u8>, ExportError>, send: Delivery) {
        let cookie = job.request.cookie;
        match result {
            Ok(data) => self.reply(cookie, 0, &data, send),
            Err(e) => {
                self.stats.errors_returned.fetch_add(1, Ordering::Relaxed);
                self.reply(cookie, e.nbd_errno(), &[], send);
            }
        }
        self.stats.record(job.request.command, job.arrived.elapsed());
    }

    /// Whether `job` might be served without waiting for a device: refusals, writes and
    /// flushes the export calls quick, and reads (which find out by trying).
    fn may_be_quick(&self, job: &Job) -> bool {
        let (export, r) = (&self.entry.export, &job.request);
        job.refused.is_some()
            || match r.command {
                CMD_READ => true,
                CMD_WRITE => {
                    export.write_is_quick(r.offset, u64::from(r.length)) && (r.flags & CMD_FLAG_FUA == 0 || export.flush_is_quick())
                }
                CMD_FLUSH => export.flush_is_quick(),
                _ => false,
            }
    }

    /// Serve a job [`Self::may_be_quick`] allowed, unless it is a read whose bytes are not
    /// in memory: `false` then, and nothing was sent.
    fn execute_if_quick(&self, job: &Job) -> bool {
        let r = &job.request;
        if job.refused.is_none() && r.command == CMD_READ {
            let mut data = vec![0u8; r.length as usize];
            let Some(result) = self.entry.export.read_if_cached(r.offset, &mut data) else { return false };
            self.answer(job, result.map(|()| data), Delivery::Held);
            return true;
        }
        self.execute(job, Delivery::Held);
        true
    }

    fn work(&self) {
        loop {
            let job = {
                let mut queue = self.queue.lock();
                loop {
                    if let Some(job) = queue.take_runnable() {
                        // Chain the wake-ups: one more worker for each job still waiting.
                        if !queue.waiting.is_empty() {
                            self.work.notify_one();
                        }
                        break job;
                    }
                    if queue.closed && queue.waiting.is_empty() {
                        return;
                    }
                    self.work.wait(&mut queue);
                }
            };
            self.execute(&job, Delivery::Now);
            let mut queue = self.queue.lock();
            queue.running.retain(|(seq, _)| *seq != job.seq);
            queue.held_bytes -= job.payload.len() as u64;
            // Jobs that waited behind this one may run now.
            if !queue.waiting.is_empty() || queue.closed {
                self.work.notify_one();
            }
            self.room.notify_one();
        }
    }

    fn serve(&self, job: &Job) -> Result<Vec<u8>, ExportError> {
        let export = &self.entry.export;
        let r = &job.request;
        let fua = r.flags & CMD_FLAG_FUA != 0;
        match r.command {
            CMD_READ => {
                let mut data = vec![0u8; r.length as usize];
                export.read(r.offset, &mut data)?;
                Ok(data)
            }
            CMD_WRITE => export.write(r.offset, &job.payload, fua).map(|()| Vec::new()),
            CMD_FLUSH => export.flush().map(|()| Vec::new()),
            CMD_TRIM => export.trim(r.offset, u64::from(r.length), fua).map(|()| Vec::new()),
            CMD_WRITE_ZEROES => {
                export.write_zeroes(r.offset, u64::from(r.length), r.flags & CMD_FLAG_NO_HOLE != 0, fua).map(|()| Vec::new())
            }
            other => unreachable!("command {other} is refused while reading"),
        }
    }

    /// Send a reply; a client that went away no longer needs it (its acknowledged writes
    /// are already stored), so a failed send is only logged.
    fn reply(&self, cookie: u64, error: u32, data: &[u8], send: Delivery) {
        let mut w = self.writer.lock();
        let sent = w.write_all(&simple_reply(error, cookie)).and_then(|()| if error == 0 { w.write_all(data) } else { Ok(()) });
        let sent = sent.and_then(|()| if send == Delivery::Now { w.flush() } else { Ok(()) });
        if let Err(e) = sent {
            tracing::debug!("reply to request {cookie:#x} not delivered: {e}");
        }
    }

    fn send_held_replies(&self) {
        if let Err(e) = self.writer.lock().flush() {
            tracing::debug!("replies not delivered: {e}");
        }
    }
}
