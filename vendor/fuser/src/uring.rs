//! alignfs: FUSE over io_uring (Linux 6.14+, with `/sys/module/fuse/parameters/enable_uring`
//! set).
//!
//! Once `FUSE_INIT` has agreed on `FUSE_OVER_IO_URING`, each worker thread owns one ring
//! entry of one per-CPU queue: a 288-byte header and a payload buffer, handed to the kernel
//! with `FUSE_IO_URING_CMD_REGISTER`. The kernel puts a request into the entry and completes
//! the command; the worker lays the request out as `/dev/fuse` would have delivered it,
//! dispatches it through the same code as the `/dev/fuse` loop, writes the reply into the
//! entry and returns it with `FUSE_IO_URING_CMD_COMMIT_AND_FETCH`, which also waits for the
//! next request: one system call per request instead of a read and a write.
//!
//! A worker owns a single entry so that it is only given a request when it is free to serve
//! it; a queue has as many entries as the session has threads per CPU. The kernel sends
//! requests through the rings only once every CPU's queue has an entry; until then, and for
//! FORGET and INTERRUPT always, they keep coming through `/dev/fuse`, whose threads run as
//! before.

use std::io;
use std::io::IoSlice;
use std::os::fd::AsFd;
use std::os::fd::AsRawFd;
use std::os::fd::RawFd;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;

use io_uring::IoUring;
use io_uring::cqueue;
use io_uring::opcode;
use io_uring::squeue;
use io_uring::types;
use log::error;
use log::info;
use log::warn;
use parking_lot::Condvar;
use parking_lot::Mutex;

use crate::Filesystem;
use crate::channel::Channel;
use crate::channel::ChannelSender;
use crate::passthrough::BackingId;
use crate::request::ReplyTo;
use crate::request::RequestWithSender;
use crate::session::FilesystemHolder;
use crate::session::SessionACL;
use crate::session::SessionEventLoop;

const CMD_REGISTER: u32 = 1;
const CMD_COMMIT_AND_FETCH: u32 = 2;
/// `struct fuse_uring_req_header`: the in/out header (128 bytes), the operation's own header
/// (128 bytes) and `struct fuse_uring_ent_in_out` (32 bytes).
const HEADER_LEN: usize = 288;
const OP_HEADER_AT: usize = 128;
const OP_HEADER_MAX: usize = 128;
const COMMIT_ID_AT: usize = 264;
const PAYLOAD_SIZE_AT: usize = 272;
/// `struct fuse_in_header` and `struct fuse_out_header`.
const IN_HEADER_LEN: usize = 40;
const OUT_HEADER_LEN: usize = 16;
/// The payload starts one page into an entry's memory, after the kernel's header. A request
/// whose payload is large (a WRITE) gets its two headers copied just before the payload, so
/// it is one slice as `/dev/fuse` delivers it and its data is never moved.
const PAYLOAD_AT: usize = 4096;
/// Requests with at most this much payload are copied out of the entry before dispatch, so
/// that their reply can be written straight into the payload buffer.
const COPY_REQUEST_MAX: usize = 4096;
const FUSE_FORGET: u32 = 2;
const FUSE_INTERRUPT: u32 = 36;
const FUSE_BATCH_FORGET: u32 = 42;
/// The module parameter that offers the transport once root writes `Y` to it; off after
/// every boot.
pub const IO_URING_PARAMETER: &str = "/sys/module/fuse/parameters/enable_uring";

/// Which transport serves the session's requests, and how many each has served.
#[derive(Debug, Default)]
pub struct TransportStats {
    requested: AtomicBool,
    agreed: AtomicBool,
    queues: AtomicUsize,
    entries: AtomicUsize,
    pinned: AtomicBool,
    /// Ring threads that were to be pinned but could not be.
    unpinned: AtomicUsize,
    ring_requests: AtomicU64,
    dev_fuse_requests: AtomicU64,
    trouble: Mutex<Option<String>>,
    by_opcode: OpcodeCounts,
    latency: OpcodeLatency,
}

/// alignfs: upper bounds, in seconds, of the buckets of the request service times
/// [`TransportStats::latency_by_kind`] reports (a last bucket takes the rest).
pub const LATENCY_BOUNDS_S: [f64; 14] =
    [10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 100e-3, 1.0, 10.0];

/// alignfs: one kind of request's service times, from its arrival at the daemon to its
/// reply: how many fell in each bucket of [`LATENCY_BOUNDS_S`] (not cumulative; the last
/// count is those above the last bound), and their sum in seconds.
#[derive(Clone, Debug, PartialEq)]
pub struct KindLatency {
    /// The request kind ("LOOKUP", "WRITE", ...).
    pub kind: String,
    /// Requests per bucket of [`LATENCY_BOUNDS_S`], then those above its last bound.
    pub counts: Vec<u64>,
    /// The service times' sum, in seconds.
    pub sum_s: f64,
}

/// Service times by FUSE opcode: a histogram and a sum (nanoseconds) per opcode.
#[derive(Debug)]
struct OpcodeLatency(Vec<[AtomicU64; LATENCY_BOUNDS_S.len() + 2]>);

impl Default for OpcodeLatency {
    fn default() -> Self {
        OpcodeLatency((0..64).map(|_| std::array::from_fn(|_| AtomicU64::new(0))).collect())
    }
}

/// Requests dispatched, by FUSE opcode (both transports).
#[derive(Debug)]
struct OpcodeCounts([AtomicU64; 64]);

impl Default for OpcodeCounts {
    fn default() -> Self {
        OpcodeCounts(std::array::from_fn(|_| AtomicU64::new(0)))
    }
}

impl TransportStats {
    /// Whether requests are served through io_uring: agreed at `FUSE_INIT` and every
    /// queue's entries registered.
    pub fn io_uring(&self) -> bool {
        self.agreed.load(Ordering::Acquire) && self.trouble.lock().is_none()
    }

    /// Requests served through the io_uring entries.
    pub fn ring_requests(&self) -> u64 {
        self.ring_requests.load(Ordering::Relaxed)
    }

    /// Requests read from `/dev/fuse`.
    pub fn dev_fuse_requests(&self) -> u64 {
        self.dev_fuse_requests.load(Ordering::Relaxed)
    }

    /// One line for status reports, e.g. "io_uring, 2 queues x 2 entries, threads on
    /// their queue's CPU".
    pub fn summary(&self) -> String {
        let trouble = self.trouble.lock().clone();
        if !self.requested.load(Ordering::Acquire) {
            return "/dev/fuse".to_string();
        }
        match trouble {
            Some(why) => format!("/dev/fuse; io_uring {why}"),
            None => {
                let queues = self.queues.load(Ordering::Relaxed);
                let entries = self.entries.load(Ordering::Relaxed);
                let placement = match (self.pinned.load(Ordering::Relaxed), self.unpinned.load(Ordering::Relaxed)) {
                    (false, _) => "threads on any CPU".to_string(),
                    (true, 0) => "threads on their queue's CPU".to_string(),
                    (true, n) => format!("threads on their queue's CPU ({n} of {entries} could not be pinned)"),
                };
                format!("io_uring, {queues} queues x {} entries, {placement}", entries / queues.max(1))
            }
        }
    }

    pub(crate) fn note_requested(&self) {
        self.requested.store(true, Ordering::Release);
    }

    pub(crate) fn note_trouble(&self, why: String) {
        let mut trouble = self.trouble.lock();
        if trouble.is_none() {
            warn!("FUSE over io_uring {why}; requests go through /dev/fuse");
            *trouble = Some(why);
        }
    }

    /// Requests dispatched so far by kind ("LOOKUP", "WRITE", ...), most frequent first;
    /// kinds never seen are left out.
    pub fn requests_by_kind(&self) -> Vec<(String, u64)> {
        let mut kinds: Vec<(String, u64)> = (0..self.by_opcode.0.len() as u32)
            .filter_map(|opcode| {
                let n = self.by_opcode.0[opcode as usize].load(Ordering::Relaxed);
                (n > 0).then(|| (opcode_name(opcode), n))
            })
            .collect();
        kinds.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        kinds
    }

    /// Service times so far by kind, in the order of [`Self::requests_by_kind`]'s names
    /// sorted by name; kinds never seen are left out.
    pub fn latency_by_kind(&self) -> Vec<KindLatency> {
        let buckets = LATENCY_BOUNDS_S.len() + 1;
        let mut kinds: Vec<KindLatency> = (0..self.latency.0.len() as u32)
            .filter_map(|opcode| {
                let slots = &self.latency.0[opcode as usize];
                let counts: Vec<u64> = slots[..buckets].iter().map(|c| c.load(Ordering::Relaxed)).collect();
                if counts.iter().all(|&n| n == 0) {
                    return None;
                }
                let sum_s = slots[buckets].load(Ordering::Relaxed) as f64 / 1e9;
                Some(KindLatency { kind: opcode_name(opcode), counts, sum_s })
            })
            .collect();
        kinds.sort_by(|a, b| a.kind.cmp(&b.kind));
        kinds
    }

    pub(crate) fn record_latency(&self, opcode: u32, took: std::time::Duration) {
        let Some(slots) = self.latency.0.get(opcode as usize) else { return };
        let seconds = took.as_secs_f64();
        let bucket = LATENCY_BOUNDS_S.iter().position(|&bound| seconds <= bound).unwrap_or(LATENCY_BOUNDS_S.len());
        slots[bucket].fetch_add(1, Ordering::Relaxed);
        slots[LATENCY_BOUNDS_S.len() + 1].fetch_add(took.as_nanos() as u64, Ordering::Relaxed);
    }

    pub(crate) fn count_operation(&self, opcode: u32) {
        if let Some(counter) = self.by_opcode.0.get(opcode as usize) {
            counter.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub(crate) fn count_dev_fuse_request(&self) {
        self.dev_fuse_requests.fetch_add(1, Ordering::Relaxed);
    }
}

/// The rings a session will register, decided at `FUSE_INIT`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RingPlan {
    queues: usize,
    entries_per_queue: usize,
    payload: usize,
    /// Each thread runs only on its queue's CPU (`Config::pin_ring_threads`).
    pinned: bool,
}

impl RingPlan {
    /// Called when the kernel offered `FUSE_OVER_IO_URING` and it has been requested.
    /// The kernel refuses an entry whose payload buffer is smaller than its largest request
    /// or reply.
    pub(crate) fn new(max_write: u32, max_pages: u16, threads: usize, pinned: bool, stats: &TransportStats) -> RingPlan {
        let page = page_size::get();
        let payload = (max_write as usize).max(usize::from(max_pages) * page).max(8192).next_multiple_of(page);
        let queues = possible_cpus();
        let plan = RingPlan { queues, entries_per_queue: threads.div_ceil(queues).max(1), payload, pinned };
        stats.agreed.store(true, Ordering::Release);
        stats.pinned.store(pinned, Ordering::Relaxed);
        stats.queues.store(queues, Ordering::Relaxed);
        stats.entries.store(queues * plan.entries_per_queue, Ordering::Relaxed);
        plan
    }

    /// The kernel did not offer the transport: say why, once.
    pub(crate) fn not_offered(stats: &TransportStats) {
        let why = match std::fs::read_to_string(IO_URING_PARAMETER) {
            Ok(v) if v.trim() == "Y" => "not offered by the kernel".to_string(),
            Ok(_) => format!("not enabled: {IO_URING_PARAMETER} is N"),
            Err(_) => "not in this kernel: Linux 6.14+ has it".to_string(),
        };
        stats.note_trouble(why);
    }
}

/// The number of per-CPU queues the kernel creates: one per possible CPU.
fn possible_cpus() -> usize {
    let count = |list: &str| -> Option<usize> {
        let mut n = 0;
        for part in list.trim().split(',').filter(|p| !p.is_empty()) {
            n += match part.split_once('-') {
                Some((a, b)) => b.parse::<usize>().ok()?.checked_sub(a.parse::<usize>().ok()?)? + 1,
                None => part.parse::<usize>().map(|_| 1).ok()?,
            };
        }
        Some(n)
    };
    std::fs::read_to_string("/sys/devices/system/cpu/possible")
        .ok()
        .and_then(|l| count(&l))
        .filter(|&n| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Run the calling thread on `cpu` only. False, with a log line, if the process may not
/// run there (a cpuset or `taskset` leaves it out) or the kernel refuses.
fn pin_to_cpu(cpu: usize) -> bool {
    let size = std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: cpu_set_t is plain bits and all zeroes is the empty set; the calls read and
    // write only the set passed by pointer, of the size given, and CPU_ISSET/CPU_SET are
    // given an index below CPU_SETSIZE.
    let refused = unsafe {
        let mut allowed: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, size, &mut allowed) != 0 {
            Some(io::Error::last_os_error().to_string())
        } else if cpu >= libc::CPU_SETSIZE as usize || !libc::CPU_ISSET(cpu, &allowed) {
            Some("the process may not run there".to_string())
        } else {
            let mut only: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut only);
            (libc::sched_setaffinity(0, size, &only) != 0).then(|| io::Error::last_os_error().to_string())
        }
    };
    if let Some(why) = &refused {
        warn!("FUSE ring thread of queue {cpu} left unpinned: {why}");
    }
    refused.is_none()
}

/// Start one worker per ring entry.
pub(crate) fn spawn_workers<FS: Filesystem>(
    plan: RingPlan,
    ch: &Channel,
    filesystem: &Arc<FilesystemHolder<FS>>,
    allowed: SessionACL,
    session_owner: nix::unistd::Uid,
    stats: &Arc<TransportStats>,
) -> Vec<JoinHandle<io::Result<()>>> {
    let mut workers = Vec::new();
    for qid in 0..plan.queues {
        for e in 0..plan.entries_per_queue {
            let name = format!("fuser-ring-{qid}.{e}");
            let event_loop = SessionEventLoop {
                thread_name: name.clone(),
                ch: ch.clone(),
                filesystem: Arc::clone(filesystem),
                allowed,
                session_owner,
                transport: Arc::clone(stats),
            };
            let entry = match EntryMemory::new(plan.payload) {
                Ok(memory) => Arc::new(RingEntry::new(memory, ch.sender())),
                Err(e) => {
                    stats.note_trouble(format!("failed: cannot allocate a ring entry: {e}"));
                    return workers;
                }
            };
            let worker_stats = Arc::clone(stats);
            let qid = qid as u16;
            let pinned = plan.pinned;
            let spawned = std::thread::Builder::new()
                .name(name)
                .spawn(move || serve(qid, pinned, &entry, &event_loop, &worker_stats));
            match spawned {
                Ok(handle) => workers.push(handle),
                Err(e) => {
                    stats.note_trouble(format!("failed: cannot start a ring thread: {e}"));
                    return workers;
                }
            }
        }
    }
    info!("FUSE over io_uring: {} queues x {} entries of {} KiB", plan.queues, plan.entries_per_queue, plan.payload >> 10);
    workers
}

/// One ring entry's memory: the kernel's header at the front, the payload from
/// [`PAYLOAD_AT`] on. A mapping of its own, so page-aligned, and the payload too.
struct EntryMemory {
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: the memory is plain bytes owned by this value. Who may touch it when is the
// entry protocol of `serve`: the kernel while a command is in flight, the worker (and, for
// the reply, whoever holds the request's reply object) between its completion and the next
// submission, serialized by `RingEntry::state`.
unsafe impl Send for EntryMemory {}
// SAFETY: as for `Send`.
unsafe impl Sync for EntryMemory {}

impl EntryMemory {
    fn new(payload: usize) -> io::Result<EntryMemory> {
        let len = PAYLOAD_AT + payload;
        // An anonymous mapping, not the allocator: its pages are zero and take memory only
        // once a request touches them (an aligned zeroed allocation writes all 8 MiB).
        // SAFETY: a new private anonymous mapping; no existing memory is involved.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base = NonNull::new(base.cast::<u8>()).ok_or_else(|| io::Error::from(io::ErrorKind::OutOfMemory))?;
        Ok(EntryMemory { base, len })
    }

    fn payload_capacity(&self) -> usize {
        self.len - PAYLOAD_AT
    }

    /// The two buffers `FUSE_IO_URING_CMD_REGISTER` takes: header, then payload.
    fn iovecs(&self) -> [libc::iovec; 2] {
        let base = self.base.as_ptr();
        [
            libc::iovec { iov_base: base.cast(), iov_len: HEADER_LEN },
            // SAFETY: PAYLOAD_AT is inside the allocation.
            libc::iovec { iov_base: unsafe { base.add(PAYLOAD_AT) }.cast(), iov_len: self.payload_capacity() },
        ]
    }

    /// The bytes at `range`. The caller must hold the entry (no command in flight) and
    /// must not write the same bytes while the slice lives.
    unsafe fn bytes(&self, at: usize, len: usize) -> &[u8] {
        assert!(at + len <= self.len);
        // SAFETY: in bounds (checked), initialized (zeroed at allocation); the caller
        // guarantees that nobody writes them meanwhile.
        unsafe { std::slice::from_raw_parts(self.base.as_ptr().add(at), len) }
    }

    /// Copy `data` to `at`. The caller must hold the entry and no slice of these bytes.
    unsafe fn write(&self, at: usize, data: &[u8]) {
        assert!(at + data.len() <= self.len);
        // SAFETY: in bounds (checked); the caller guarantees exclusive access.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.base.as_ptr().add(at), data.len()) }
    }

    fn read_u32(&self, at: usize) -> u32 {
        // SAFETY: called by the worker holding the entry; four bytes in the header.
        let b = unsafe { self.bytes(at, 4) };
        u32::from_ne_bytes([b[0], b[1], b[2], b[3]])
    }

    fn read_u64(&self, at: usize) -> u64 {
        // SAFETY: as for `read_u32`.
        let b = unsafe { self.bytes(at, 8) };
        u64::from_ne_bytes(b.try_into().unwrap_or([0; 8]))
    }
}

impl Drop for EntryMemory {
    fn drop(&mut self) {
        // SAFETY: mapped in `new` with this size. The last owner drops it after its worker
        // has returned, and the worker's ring (closed on return) cancels any command the
        // kernel still held for it.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

/// A ring entry shared between its worker and the reply objects of the request it holds.
pub(crate) struct RingEntry {
    memory: EntryMemory,
    state: Mutex<ReplyState>,
    replied: Condvar,
    /// For passthrough backing files, which are registered on `/dev/fuse`.
    channel: ChannelSender,
}

impl std::fmt::Debug for RingEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RingEntry").field("state", &*self.state.lock()).finish_non_exhaustive()
    }
}

#[derive(Debug, Default)]
struct ReplyState {
    /// The request the entry holds.
    unique: u64,
    replied: bool,
    /// The request's bytes are still being read from the payload buffer: hold the reply's
    /// payload here until dispatch returns.
    request_in_payload: bool,
    staged: Vec<u8>,
}

impl RingEntry {
    fn new(memory: EntryMemory, channel: ChannelSender) -> RingEntry {
        RingEntry { memory, state: Mutex::new(ReplyState::default()), replied: Condvar::new(), channel }
    }

    /// Reply to request `unique`: the out header into the kernel's header, the rest into
    /// the payload buffer.
    pub(crate) fn send(&self, unique: u64, data: &[IoSlice<'_>]) -> io::Result<()> {
        let mut state = self.state.lock();
        if state.unique != unique || state.replied {
            return Err(io::Error::other(format!("FUSE reply to request {unique}, which its ring entry no longer holds")));
        }
        let total: usize = data.iter().map(|s| s.len()).sum();
        let Some(mut payload_len) = total.checked_sub(OUT_HEADER_LEN) else {
            return Err(io::Error::other("FUSE reply shorter than its header"));
        };
        let mut header = [0u8; OUT_HEADER_LEN];
        let mut filled = 0;
        for slice in data {
            let n = (OUT_HEADER_LEN - filled).min(slice.len());
            header[filled..filled + n].copy_from_slice(&slice[..n]);
            filled += n;
        }
        if payload_len > self.memory.payload_capacity() {
            error!("FUSE reply of {payload_len} bytes does not fit its ring entry; answering EIO");
            header[4..8].copy_from_slice(&(-libc::EIO).to_ne_bytes());
            payload_len = 0;
        }
        let rest = data.iter().scan(OUT_HEADER_LEN, |skip, s| {
            let n = (*skip).min(s.len());
            *skip -= n;
            Some(&s[n..])
        });
        let ReplyState { request_in_payload, staged, .. } = &mut *state;
        staged.clear();
        let mut at = PAYLOAD_AT;
        for piece in rest.take_while(|_| payload_len > 0) {
            if *request_in_payload {
                staged.extend_from_slice(piece);
            } else {
                // SAFETY: the entry holds this request (checked under the state lock), which
                // is not read from the payload, and its worker touches neither until
                // `replied` is set.
                unsafe { self.memory.write(at, piece) };
                at += piece.len();
            }
        }
        // SAFETY: as above; the header's first bytes and the payload size are the reply's.
        unsafe {
            self.memory.write(0, &header);
            self.memory.write(PAYLOAD_SIZE_AT, &(payload_len as u32).to_ne_bytes());
        }
        state.replied = true;
        self.replied.notify_one();
        Ok(())
    }

    pub(crate) fn open_backing(&self, fd: std::os::fd::BorrowedFd<'_>) -> io::Result<BackingId> {
        self.channel.open_backing(fd)
    }

    pub(crate) unsafe fn wrap_backing(&self, id: u32) -> BackingId {
        // SAFETY: forwarded; the caller upholds `ChannelSender::wrap_backing`'s contract.
        unsafe { self.channel.wrap_backing(id) }
    }

    fn answer_error(&self, unique: u64, errno: i32) {
        let header = out_header(unique, -errno);
        let _ = self.send(unique, &[IoSlice::new(&header)]);
    }
}

fn out_header(unique: u64, error: i32) -> [u8; OUT_HEADER_LEN] {
    let mut h = [0u8; OUT_HEADER_LEN];
    h[0..4].copy_from_slice(&(OUT_HEADER_LEN as u32).to_ne_bytes());
    h[4..8].copy_from_slice(&error.to_ne_bytes());
    h[8..16].copy_from_slice(&unique.to_ne_bytes());
    h
}

/// The 80-byte command of a FUSE ring SQE: `struct fuse_uring_cmd_req`.
fn command(qid: u16, commit_id: u64) -> [u8; 80] {
    let mut cmd = [0u8; 80];
    cmd[8..16].copy_from_slice(&commit_id.to_ne_bytes());
    cmd[16..18].copy_from_slice(&qid.to_ne_bytes());
    cmd
}

fn register_entry(fd: RawFd, qid: u16, iovecs: &[libc::iovec; 2]) -> squeue::Entry128 {
    let mut sqe = opcode::UringCmd80::new(types::Fd(fd), CMD_REGISTER)
        .cmd(command(qid, 0))
        .addr(Some(iovecs.as_ptr() as u64))
        .build();
    // The kernel wants the number of iovecs in `sqe->len`, which the opcode builder does
    // not set; it sits 24 bytes into the SQE by the kernel ABI.
    const _: () = assert!(size_of::<squeue::Entry128>() == 128);
    // SAFETY: `Entry128` is `repr(C)` and starts with the 64-byte `io_uring_sqe`, whose
    // `len` field is the u32 at offset 24; the write stays inside the value.
    unsafe {
        std::ptr::from_mut(&mut sqe).cast::<u8>().add(24).cast::<u32>().write_unaligned(iovecs.len() as u32);
    }
    sqe
}

/// Serve one ring entry until the session ends.
fn serve<FS: Filesystem>(
    qid: u16,
    pinned: bool,
    entry: &Arc<RingEntry>,
    event_loop: &SessionEventLoop<FS>,
    stats: &TransportStats,
) -> io::Result<()> {
    let fd = event_loop.ch.as_fd().as_raw_fd();
    if pinned && !pin_to_cpu(usize::from(qid)) {
        stats.unpinned.fetch_add(1, Ordering::Relaxed);
    }
    // Only this thread uses its ring, and only while waiting for a request: the kernel may
    // then run the request's delivery in this thread when it waits (DEFER_TASKRUN) instead
    // of interrupting it. Kernels with the transport all have both flags; fall back anyway.
    let mut ring: IoUring<squeue::Entry128, cqueue::Entry> =
        match IoUring::builder().setup_single_issuer().setup_defer_taskrun().build(2) {
            Ok(ring) => ring,
            Err(_) => IoUring::builder().build(2)?,
        };
    let iovecs = entry.memory.iovecs();
    let mut next = register_entry(fd, qid, &iovecs);
    let mut request_copy = Vec::with_capacity(IN_HEADER_LEN + OP_HEADER_MAX + COPY_REQUEST_MAX);
    loop {
        // SAFETY: the iovecs live on this frame and the memory they describe in `entry`,
        // which the caller keeps alive past this function and so past `ring`, whose drop
        // cancels a command still in flight. The kernel reads the iovecs while submitting
        // and writes the memory only until the command completes, which the loop waits for
        // before touching it.
        unsafe { ring.submission().push(&next) }.map_err(|_| io::Error::other("io_uring submission queue full"))?;
        let cqe = loop {
            match ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
            if let Some(cqe) = ring.completion().next() {
                break cqe;
            }
        };
        if cqe.result() < 0 {
            let errno = -cqe.result();
            // The session ended (unmounted or aborted): the kernel cancels every entry.
            if matches!(errno, libc::ENOTCONN | libc::ENODEV | libc::ECANCELED) {
                return Ok(());
            }
            let e = io::Error::from_raw_os_error(errno);
            stats.note_trouble(format!("failed on queue {qid}: {e}"));
            return Err(e);
        }
        let commit_id = entry.memory.read_u64(COMMIT_ID_AT);
        serve_request(entry, event_loop, &mut request_copy);
        stats.ring_requests.fetch_add(1, Ordering::Relaxed);
        next = opcode::UringCmd80::new(types::Fd(fd), CMD_COMMIT_AND_FETCH).cmd(command(qid, commit_id)).build();
    }
}

/// Dispatch the request the entry holds and wait until it is answered.
fn serve_request<FS: Filesystem>(entry: &Arc<RingEntry>, event_loop: &SessionEventLoop<FS>, request_copy: &mut Vec<u8>) {
    let memory = &entry.memory;
    let len = memory.read_u32(0) as usize;
    let opcode = memory.read_u32(4);
    let unique = memory.read_u64(8);
    let payload = memory.read_u32(PAYLOAD_SIZE_AT) as usize;
    let op_header = len.checked_sub(IN_HEADER_LEN + payload).filter(|&n| n <= OP_HEADER_MAX);
    {
        let mut state = entry.state.lock();
        *state = ReplyState { unique, staged: std::mem::take(&mut state.staged), ..ReplyState::default() };
    }
    let Some(op_header) = op_header.filter(|_| payload <= memory.payload_capacity()) else {
        error!("FUSE ring request {unique} (opcode {opcode}) has inconsistent sizes: {len} bytes, payload {payload}");
        entry.answer_error(unique, libc::EIO);
        return;
    };
    // SAFETY (all slices below): the kernel has completed the command and gets the entry
    // back only at the next submission; replies write the header's first bytes, the
    // payload size and, unless the request is read from there, the payload.
    let in_header = unsafe { memory.bytes(0, IN_HEADER_LEN) };
    let op = unsafe { memory.bytes(OP_HEADER_AT, op_header) };
    let request: &[u8] = if payload <= COPY_REQUEST_MAX {
        request_copy.clear();
        request_copy.extend_from_slice(in_header);
        request_copy.extend_from_slice(op);
        request_copy.extend_from_slice(unsafe { memory.bytes(PAYLOAD_AT, payload) });
        request_copy
    } else {
        entry.state.lock().request_in_payload = true;
        let start = PAYLOAD_AT - IN_HEADER_LEN - op_header;
        let mut headers = [0u8; IN_HEADER_LEN + OP_HEADER_MAX];
        headers[..IN_HEADER_LEN].copy_from_slice(in_header);
        headers[IN_HEADER_LEN..IN_HEADER_LEN + op_header].copy_from_slice(op);
        // SAFETY: the bytes before the payload belong to no header and no reply.
        unsafe {
            memory.write(start, &headers[..IN_HEADER_LEN + op_header]);
            memory.bytes(start, IN_HEADER_LEN + op_header + payload)
        }
    };
    match RequestWithSender::new(ReplyTo::Ring { entry: Arc::clone(entry), unique }, request) {
        Some(req) => req.dispatch(event_loop),
        None => entry.answer_error(unique, libc::EIO),
    }
    if matches!(opcode, FUSE_FORGET | FUSE_BATCH_FORGET | FUSE_INTERRUPT) {
        // No reply is due (the kernel sends these through /dev/fuse; handled anyway).
        entry.answer_error(unique, libc::ENOSYS);
    }
    let mut state = entry.state.lock();
    // A reply handed to another thread arrives later; the entry waits for it.
    while !state.replied {
        entry.replied.wait(&mut state);
    }
    if state.request_in_payload {
        state.request_in_payload = false;
        // SAFETY: dispatch has returned, so the request's slice of the payload is dead.
        unsafe { memory.write(PAYLOAD_AT, &state.staged) };
    }
}

/// A FUSE opcode's name without its prefix ("LOOKUP", "WRITE", ...).
fn opcode_name(opcode: u32) -> String {
    match crate::ll::fuse_abi::fuse_opcode::try_from(opcode) {
        Ok(known) => format!("{known:?}").trim_start_matches("FUSE_").to_string(),
        Err(_) => format!("opcode {opcode}"),
    }
}
