//! Connections: negotiation, then requests served by a few worker threads per
//! connection, overlapping requests in the order they arrived.

use std::collections::{HashMap, VecDeque};
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use crate::protocol::*;
use crate::{Export, ExportError};

/// One export a server offers.
pub struct ExportEntry {
    pub name: String,
    pub description: String,
    pub export: Arc<dyn Export>,
    pub read_only: bool,
}

/// Workers per connection unless told otherwise: one per CPU, 2 to 16. More than the CPUs
/// only add wake-ups: on two CPUs, eight workers served 4 KiB requests at queue depth 8
/// 15–21 % slower than two (fio's nbd engine over a Unix socket, 3 alternating rounds).
pub fn default_workers() -> usize {
    std::thread::available_parallelism().map_or(4, |n| n.get()).clamp(2, 16)
}

/// What a server serves and how.
pub struct ServerConfig {
    pub exports: Vec<ExportEntry>,
    /// Threads serving one connection's requests ([`default_workers`]).
    pub workers_per_connection: usize,
    /// Largest READ or WRITE accepted; larger ones get `NBD_EINVAL`.
    pub max_request_bytes: u32,
    /// A client has this long for each step of negotiation.
    pub handshake_timeout: Duration,
}

impl ServerConfig {
    pub fn new(exports: Vec<ExportEntry>) -> ServerConfig {
        ServerConfig {
            exports,
            workers_per_connection: default_workers(),
            max_request_bytes: 32 << 20,
            handshake_timeout: Duration::from_secs(30),
        }
    }
}

/// A connected socket of either family.
pub trait Stream: Read + Write + Send + Sync + 'static {
    fn try_clone_stream(&self) -> io::Result<Self>
    where
        Self: Sized;
    fn shutdown_both(&self);
    fn set_timeout(&self, timeout: Option<Duration>) -> io::Result<()>;
    fn peer(&self) -> String;
}

impl Stream for TcpStream {
    fn try_clone_stream(&self) -> io::Result<Self> {
        self.try_clone()
    }
    fn shutdown_both(&self) {
        let _ = self.shutdown(std::net::Shutdown::Both);
    }
    fn set_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        self.set_read_timeout(timeout)
    }
    fn peer(&self) -> String {
        self.peer_addr().map_or_else(|_| "tcp peer".into(), |a| a.to_string())
    }
}

impl Stream for UnixStream {
    fn try_clone_stream(&self) -> io::Result<Self> {
        self.try_clone()
    }
    fn shutdown_both(&self) {
        let _ = self.shutdown(std::net::Shutdown::Both);
    }
    fn set_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        self.set_read_timeout(timeout)
    }
    fn peer(&self) -> String {
        "unix socket peer".into()
    }
}

/// What the server did, for logs and tests.
#[derive(Default)]
pub struct ServerStats {
    pub connections: AtomicU64,
    pub refused_handshakes: AtomicU64,
    pub requests: AtomicU64,
    /// Requests the connection's reading thread served itself, without a worker.
    pub served_by_reader: AtomicU64,
    pub errors_returned: AtomicU64,
}

/// Hangs up one connection.
type HangUp = Box<dyn Fn() + Send>;

/// The bytes a request touches and whether it changes them; `None`: no data.
type Footprint = Option<(u64, u64, bool)>;

/// A running server: listeners and connections, until [`Server::shutdown`].
pub struct Server {
    config: Arc<ServerConfig>,
    stop: Arc<AtomicBool>,
    /// Each open connection's way to hang it up, by connection number.
    live: Arc<Mutex<HashMap<u64, HangUp>>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    pub stats: Arc<ServerStats>,
}

impl Server {
    pub fn new(config: ServerConfig) -> Server {
        Server {
            config: Arc::new(config),
            stop: Arc::new(AtomicBool::new(false)),
            live: Arc::default(),
            threads: Mutex::default(),
            stats: Arc::default(),
        }
    }

    /// Accept TCP connections on `listener` in a background thread.
    pub fn listen_tcp(&self, listener: TcpListener) -> io::Result<()> {
        listener.set_nonblocking(true)?;
        // Replies are written whole; Nagle would only hold one back behind an earlier one.
        self.accept_loop(move || listener.accept().and_then(|(s, _)| s.set_nodelay(true).map(|()| s)))
    }

    /// Accept Unix-socket connections on `listener` in a background thread.
    pub fn listen_unix(&self, listener: UnixListener) -> io::Result<()> {
        listener.set_nonblocking(true)?;
        self.accept_loop(move || listener.accept().map(|(s, _)| s))
    }

    fn accept_loop<S: Stream>(&self, mut accept: impl FnMut() -> io::Result<S> + Send + 'static) -> io::Result<()> {
        let (config, stop, live, stats) =
            (Arc::clone(&self.config), Arc::clone(&self.stop), Arc::clone(&self.live), Arc::clone(&self.stats));
        let handle = std::thread::Builder::new().name("nbd-accept".into()).spawn(move || {
            let mut connections: Vec<JoinHandle<()>> = Vec::new();
            while !stop.load(Ordering::SeqCst) {
                match accept() {
                    Ok(stream) => {
                        connections.retain(|c| !c.is_finished());
                        let Ok(closer) = stream.try_clone_stream() else { continue };
                        let id = stats.connections.fetch_add(1, Ordering::Relaxed);
                        live.lock().insert(id, Box::new(move || closer.shutdown_both()));
                        let (config, stats, live) = (Arc::clone(&config), Arc::clone(&stats), Arc::clone(&live));
                        let serve = move || {
                            serve_connection(stream, &config, &stats);
                            // Hang up: the closer's descriptor would keep the socket open.
                            if let Some(close) = live.lock().remove(&id) {
                                close();
                            }
                        };
                        match std::thread::Builder::new().name("nbd-conn".into()).spawn(serve) {
                            Ok(c) => connections.push(c),
                            Err(e) => tracing::error!("start a connection thread: {e}"),
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(20)),
                    Err(e) => {
                        tracing::warn!("accept: {e}");
                        std::thread::sleep(Duration::from_millis(100));
                    }
                }
            }
            for c in connections {
                let _ = c.join();
            }
        })?;
        self.threads.lock().push(handle);
        Ok(())
    }

    /// Stop accepting, disconnect every client (requests in progress finish first), and
    /// wait for every thread.
    pub fn shutdown(&self) {
        self.stop.store(true, Ordering::SeqCst);
        for (_, close) in self.live.lock().drain() {
            close();
        }
        for t in self.threads.lock().drain(..) {
            let _ = t.join();
        }
    }
}

/// Serve one connection to its end; every way it can end is logged, none panics.
pub fn serve_connection<S: Stream>(stream: S, config: &ServerConfig, stats: &ServerStats) {
    let peer = stream.peer();
    // One buffered reader from the first byte to the last: a client may send its first
    // requests right behind its last option.
    let mut reader = match stream.try_clone_stream() {
        Ok(clone) => BufReader::with_capacity(256 << 10, clone),
        Err(e) => return tracing::warn!("{peer}: {e}"),
    };
    match negotiate(&stream, &mut reader, config) {
        Ok(Some((entry, no_zeroes))) => {
            tracing::info!("{peer}: serving export {:?}{}", entry.name, if no_zeroes { "" } else { " (old-style zero padding)" });
            match transmit(stream, reader, entry, config, stats) {
                Ok(()) => tracing::info!("{peer}: disconnected"),
                Err(e) => tracing::warn!("{peer}: {e}"),
            }
        }
        Ok(None) => tracing::info!("{peer}: ended negotiation"),
        Err(e) => {
            stats.refused_handshakes.fetch_add(1, Ordering::Relaxed);
            tracing::warn!("{peer}: closed during negotiation: {e}");
        }
    }
}

/// Fixed-newstyle negotiation. `Ok(None)`: the client aborted or chose no export.
fn negotiate<'c, S: Stream>(stream: &S, r: &mut BufReader<S>, config: &'c ServerConfig) -> Result<Option<(&'c ExportEntry, bool)>, Hangup> {
    stream.set_timeout(Some(config.handshake_timeout))?;
    let mut w = stream.try_clone_stream()?;
    let mut hello = NBDMAGIC.to_be_bytes().to_vec();
    hello.extend_from_slice(&IHAVEOPT.to_be_bytes());
    hello.extend_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
    w.write_all(&hello)?;
    let client_flags = read_u32(r)?;
    if client_flags & CLIENT_FIXED_NEWSTYLE == 0 {
        return Err(Hangup::Protocol(format!("client flags {client_flags:#x} lack FIXED_NEWSTYLE")));
    }
    if client_flags & !(CLIENT_FIXED_NEWSTYLE | CLIENT_NO_ZEROES) != 0 {
        return Err(Hangup::Protocol(format!("unknown client flags {client_flags:#x}")));
    }
    let no_zeroes = client_flags & CLIENT_NO_ZEROES != 0;
    let find = |name: &[u8]| {
        if name.is_empty() {
            config.exports.first()
        } else {
            config.exports.iter().find(|e| e.name.as_bytes() == name)
        }
    };
    loop {
        let request = read_option(r)?;
        let option = request.option;
        match option {
            OPT_EXPORT_NAME => {
                let Some(entry) = find(&request.data) else {
                    return Err(Hangup::Protocol(format!("unknown export {:?} (EXPORT_NAME)", String::from_utf8_lossy(&request.data))));
                };
                let mut reply = entry.export.size().to_be_bytes().to_vec();
                reply.extend_from_slice(&transmission_flags(entry).to_be_bytes());
                if !no_zeroes {
                    reply.extend_from_slice(&[0u8; 124]);
                }
                w.write_all(&reply)?;
                stream.set_timeout(None)?;
                return Ok(Some((entry, no_zeroes)));
            }
            OPT_ABORT => {
                let _ = option_reply(&mut w, option, REP_ACK, &[]);
                return Ok(None);
            }
            OPT_LIST => {
                if !request.data.is_empty() {
                    option_reply(&mut w, option, REP_ERR_INVALID, b"LIST takes no data")?;
                    continue;
                }
                for e in &config.exports {
                    let mut data = (e.name.len() as u32).to_be_bytes().to_vec();
                    data.extend_from_slice(e.name.as_bytes());
                    data.extend_from_slice(e.description.as_bytes());
                    option_reply(&mut w, option, REP_SERVER, &data)?;
                }
                option_reply(&mut w, option, REP_ACK, &[])?;
            }
            OPT_INFO | OPT_GO => {
                let Some(info) = InfoRequest::parse(&request.data) else {
                    option_reply(&mut w, option, REP_ERR_INVALID, b"malformed INFO/GO request")?;
                    continue;
                };
                let Some(entry) = find(&info.name) else {
                    option_reply(&mut w, option, REP_ERR_UNKNOWN, b"no such export")?;
                    continue;
                };
                send_info(&mut w, option, entry, &info.wanted, config)?;
                option_reply(&mut w, option, REP_ACK, &[])?;
                if option == OPT_GO {
                    stream.set_timeout(None)?;
                    return Ok(Some((entry, no_zeroes)));
                }
            }
            5 => option_reply(&mut w, option, REP_ERR_POLICY, b"TLS is not offered")?,
            _ => option_reply(&mut w, option, REP_ERR_UNSUP, b"option not supported")?,
        }
    }
}

fn transmission_flags(entry: &ExportEntry) -> u16 {
    let mut flags = TFLAG_HAS_FLAGS | TFLAG_SEND_FLUSH | TFLAG_SEND_FUA | TFLAG_CAN_MULTI_CONN;
    if entry.read_only {
        flags |= TFLAG_READ_ONLY;
    } else {
        flags |= TFLAG_SEND_TRIM | TFLAG_SEND_WRITE_ZEROES;
    }
    flags
}

fn send_info(w: &mut impl Write, option: u32, entry: &ExportEntry, wanted: &[u16], config: &ServerConfig) -> io::Result<()> {
    let mut export = INFO_EXPORT.to_be_bytes().to_vec();
    export.extend_from_slice(&entry.export.size().to_be_bytes());
    export.extend_from_slice(&transmission_flags(entry).to_be_bytes());
    option_reply(w, option, REP_INFO, &export)?;
    for &kind in wanted {
        let mut data = kind.to_be_bytes().to_vec();
        match kind {
            INFO_NAME => data.extend_from_slice(entry.name.as_bytes()),
            INFO_DESCRIPTION => data.extend_from_slice(entry.description.as_bytes()),
            INFO_BLOCK_SIZE => {
                let min = entry.export.block_size();
                data.extend_from_slice(&min.to_be_bytes());
                data.extend_from_slice(&entry.export.preferred_block_size().max(min).to_be_bytes());
                data.extend_from_slice(&config.max_request_bytes.to_be_bytes());
            }
            _ => continue,
        }
        option_reply(w, option, REP_INFO, &data)?;
    }
    Ok(())
}

/// A request waiting for, or being served by, a worker.
struct Job {
    seq: u64,
    request: Request,
    payload: Vec<u8>,
    /// Decided while reading: the error to return without touching the export.
    refused: Option<u32>,
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

fn transmit<S: Stream>(
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
            let job = Job { seq, request, payload, refused };
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
        self.answer(job.request.cookie, result, send);
    }

    /// Reply with a request's data, or its error (counted).
    fn answer(&self, cookie: u64, result: Result<Vec<u8>, ExportError>, send: Delivery) {
        match result {
            Ok(data) => self.reply(cookie, 0, &data, send),
            Err(e) => {
                self.stats.errors_returned.fetch_add(1, Ordering::Relaxed);
                self.reply(cookie, e.nbd_errno(), &[], send);
            }
        }
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
            self.answer(r.cookie, result.map(|()| data), Delivery::Held);
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
