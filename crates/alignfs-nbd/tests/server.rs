#![allow(clippy::unwrap_used)]
//! The NBD server over Unix socket pairs: negotiation paths, every command, the errors the
//! protocol asks for, request ordering across workers, TLS (STARTTLS with pre-shared
//! keys, what a server that requires it answers), and a corpus of malformed and random
//! input that must end a connection cleanly and leave the export unchanged.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::thread::JoinHandle;

use alignfs_nbd::protocol::*;
use alignfs_nbd::server::serve_connection;
use alignfs_nbd::{Export, ExportEntry, ExportError, ServerConfig, ServerStats, TlsConfig, TlsPolicy};
use openssl::ssl::{SslConnector, SslMethod, SslStream, SslVersion};
use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// An export in memory that counts flushes. A `quick` one calls writes of up to 4 KiB
/// quick and says that reads of even sectors are cached, as `alignfs nbd`'s volumes do for
/// NVM-buffered writes and pages in the kernel's cache.
struct Memory {
    bytes: Mutex<Vec<u8>>,
    flushes: Mutex<u64>,
    quick: bool,
}

impl Memory {
    fn new(size: usize) -> Arc<Memory> {
        Arc::new(Memory { bytes: Mutex::new(vec![0; size]), flushes: Mutex::new(0), quick: false })
    }

    fn quick(size: usize) -> Arc<Memory> {
        Arc::new(Memory { bytes: Mutex::new(vec![0; size]), flushes: Mutex::new(0), quick: true })
    }
}

impl Export for Memory {
    fn size(&self) -> u64 {
        self.bytes.lock().len() as u64
    }
    fn block_size(&self) -> u32 {
        512
    }
    fn preferred_block_size(&self) -> u32 {
        4096
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), ExportError> {
        buf.copy_from_slice(&self.bytes.lock()[offset as usize..offset as usize + buf.len()]);
        Ok(())
    }
    fn read_if_cached(&self, offset: u64, buf: &mut [u8]) -> Option<Result<(), ExportError>> {
        (self.quick && (offset / 512) % 2 == 0).then(|| self.read(offset, buf))
    }
    fn write_is_quick(&self, _offset: u64, len: u64) -> bool {
        self.quick && len <= 4096
    }
    fn flush_is_quick(&self) -> bool {
        self.quick
    }
    fn write(&self, offset: u64, data: &[u8], _fua: bool) -> Result<(), ExportError> {
        // Slow enough that workers overlap; beside quick ones, slow enough that the reading
        // thread answers the quick ones first even on a loaded machine.
        if !self.write_is_quick(offset, data.len() as u64) {
            std::thread::sleep(std::time::Duration::from_micros(if self.quick { 20_000 } else { 200 }));
        }
        self.bytes.lock()[offset as usize..offset as usize + data.len()].copy_from_slice(data);
        Ok(())
    }
    fn flush(&self) -> Result<(), ExportError> {
        *self.flushes.lock() += 1;
        Ok(())
    }
    fn trim(&self, offset: u64, len: u64, _fua: bool) -> Result<(), ExportError> {
        self.bytes.lock()[offset as usize..(offset + len) as usize].fill(0);
        Ok(())
    }
    fn write_zeroes(&self, offset: u64, len: u64, _no_hole: bool, fua: bool) -> Result<(), ExportError> {
        self.trim(offset, len, fua)
    }
}

const SIZE: usize = 1 << 20;

/// A server thread on one end of a socket pair; the other end for the test.
fn connect(memory: &Arc<Memory>, read_only: bool) -> (UnixStream, JoinHandle<()>) {
    let (client, handle, _) = connect_counted(memory, read_only);
    (client, handle)
}

/// [`connect`], with the server's counters.
fn connect_counted(memory: &Arc<Memory>, read_only: bool) -> (UnixStream, JoinHandle<()>, Arc<ServerStats>) {
    let (client, server) = UnixStream::pair().unwrap();
    let export = Arc::clone(memory) as Arc<dyn Export>;
    let mut config = ServerConfig::new(vec![ExportEntry { name: "disk".into(), description: "test".into(), export, read_only }]);
    // Four, whatever this machine's CPU count: the ordering test needs workers to overlap.
    config.workers_per_connection = 4;
    let stats = Arc::new(ServerStats::default());
    let counted = Arc::clone(&stats);
    let handle = std::thread::spawn(move || serve_connection(server, &config, &counted));
    (client, handle, stats)
}

fn read_exact(s: &mut (impl Read + Write), n: usize) -> Vec<u8> {
    let mut b = vec![0u8; n];
    s.read_exact(&mut b).unwrap();
    b
}

fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes(b.try_into().unwrap())
}

fn hello(s: &mut (impl Read + Write), client_flags: u32) {
    let h = read_exact(s, 18);
    assert_eq!(&h[..8], b"NBDMAGIC");
    assert_eq!(u64::from_be_bytes(h[8..16].try_into().unwrap()), IHAVEOPT);
    s.write_all(&client_flags.to_be_bytes()).unwrap();
}

fn send_option(s: &mut (impl Read + Write), option: u32, data: &[u8]) {
    let mut b = IHAVEOPT.to_be_bytes().to_vec();
    b.extend_from_slice(&option.to_be_bytes());
    b.extend_from_slice(&(data.len() as u32).to_be_bytes());
    b.extend_from_slice(data);
    s.write_all(&b).unwrap();
}

/// One option reply: (reply type, data).
fn option_reply(s: &mut (impl Read + Write)) -> (u32, Vec<u8>) {
    let h = read_exact(s, 20);
    assert_eq!(u64::from_be_bytes(h[..8].try_into().unwrap()), REPLY_MAGIC_OPTION);
    let len = be32(&h[16..20]) as usize;
    (be32(&h[12..16]), read_exact(s, len))
}

fn go_payload(name: &[u8], wanted: &[u16]) -> Vec<u8> {
    let mut d = (name.len() as u32).to_be_bytes().to_vec();
    d.extend_from_slice(name);
    d.extend_from_slice(&(wanted.len() as u16).to_be_bytes());
    for w in wanted {
        d.extend_from_slice(&w.to_be_bytes());
    }
    d
}

/// Negotiate with GO; returns the transmission flags.
fn go(s: &mut (impl Read + Write)) -> u16 {
    hello(s, CLIENT_FIXED_NEWSTYLE | CLIENT_NO_ZEROES);
    send_option(s, OPT_GO, &go_payload(b"disk", &[INFO_BLOCK_SIZE]));
    let (kind, export) = option_reply(s);
    assert_eq!(kind, REP_INFO);
    assert_eq!(u64::from_be_bytes(export[2..10].try_into().unwrap()), SIZE as u64);
    let flags = u16::from_be_bytes([export[10], export[11]]);
    let (kind, sizes) = option_reply(s);
    assert_eq!((kind, be32(&sizes[2..6]), be32(&sizes[6..10])), (REP_INFO, 512, 4096));
    assert_eq!(option_reply(s).0, REP_ACK);
    flags
}

fn request(s: &mut (impl Read + Write), command: u16, flags: u16, cookie: u64, offset: u64, length: u32, payload: &[u8]) {
    let r = Request { flags, command, cookie, offset, length };
    let mut b = r.encode().to_vec();
    b.extend_from_slice(payload);
    s.write_all(&b).unwrap();
}

/// One simple reply: (error, cookie).
fn reply(s: &mut (impl Read + Write)) -> (u32, u64) {
    let h = read_exact(s, 16);
    assert_eq!(be32(&h[..4]), SIMPLE_REPLY_MAGIC);
    (be32(&h[4..8]), u64::from_be_bytes(h[8..16].try_into().unwrap()))
}

fn disconnect(mut s: UnixStream, server: JoinHandle<()>) {
    request(&mut s, CMD_DISC, 0, 0, 0, 0, &[]);
    server.join().unwrap();
    assert_eq!(s.read(&mut [0u8; 1]).unwrap(), 0, "the server hangs up after DISC");
}

#[test]
fn every_command_and_its_errors() {
    let memory = Memory::new(SIZE);
    let (mut s, server) = connect(&memory, false);
    let flags = go(&mut s);
    for f in [TFLAG_HAS_FLAGS, TFLAG_SEND_FLUSH, TFLAG_SEND_FUA, TFLAG_SEND_TRIM, TFLAG_SEND_WRITE_ZEROES, TFLAG_CAN_MULTI_CONN] {
        assert_ne!(flags & f, 0, "flag {f:#x}");
    }
    let data: Vec<u8> = (0..4096u32).map(|i| (i % 251) as u8).collect();
    request(&mut s, CMD_WRITE, CMD_FLAG_FUA, 1, 8192, 4096, &data);
    assert_eq!(reply(&mut s), (0, 1));
    request(&mut s, CMD_READ, 0, 2, 8192, 4096, &[]);
    assert_eq!(reply(&mut s), (0, 2));
    assert_eq!(read_exact(&mut s, 4096), data);
    request(&mut s, CMD_FLUSH, 0, 3, 0, 0, &[]);
    assert_eq!(reply(&mut s), (0, 3));
    assert_eq!(*memory.flushes.lock(), 1);
    request(&mut s, CMD_TRIM, 0, 4, 8192, 512, &[]);
    request(&mut s, CMD_WRITE_ZEROES, CMD_FLAG_NO_HOLE, 5, 8704, 512, &[]);
    assert_eq!(reply(&mut s).0, 0);
    assert_eq!(reply(&mut s).0, 0);
    assert!(memory.bytes.lock()[8192..9216].iter().all(|&b| b == 0));
    // Errors: misaligned, out of range, oversized, unknown; a refused write's payload is
    // skipped and the stream stays in step.
    request(&mut s, CMD_WRITE, 0, 6, 100, 512, &[7u8; 512]);
    assert_eq!(reply(&mut s), (EINVAL, 6));
    request(&mut s, CMD_READ, 0, 7, SIZE as u64 - 512, 1024, &[]);
    assert_eq!(reply(&mut s), (EINVAL, 7));
    request(&mut s, CMD_READ, 0, 8, u64::MAX - 511, 512, &[]);
    assert_eq!(reply(&mut s), (EINVAL, 8));
    request(&mut s, CMD_READ, 0, 9, 0, 64 << 20, &[]);
    assert_eq!(reply(&mut s), (EINVAL, 9));
    request(&mut s, 42, 0, 10, 0, 0, &[]);
    assert_eq!(reply(&mut s), (EINVAL, 10));
    request(&mut s, CMD_WRITE, 0, 11, SIZE as u64, 512, &[9u8; 512]);
    assert_eq!(reply(&mut s), (EINVAL, 11));
    assert!(memory.bytes.lock()[..8192].iter().all(|&b| b == 0), "refused writes changed nothing");
    disconnect(s, server);
}

#[test]
fn a_read_only_export_refuses_changes() {
    let memory = Memory::new(SIZE);
    let (mut s, server) = connect(&memory, true);
    assert_ne!(go(&mut s) & TFLAG_READ_ONLY, 0);
    request(&mut s, CMD_WRITE, 0, 1, 0, 512, &[1u8; 512]);
    request(&mut s, CMD_TRIM, 0, 2, 0, 512, &[]);
    assert_eq!(reply(&mut s), (EPERM, 1));
    assert_eq!(reply(&mut s), (EPERM, 2));
    request(&mut s, CMD_READ, 0, 3, 0, 512, &[]);
    assert_eq!(reply(&mut s), (0, 3));
    assert_eq!(read_exact(&mut s, 512), vec![0u8; 512]);
    disconnect(s, server);
}

#[test]
fn negotiation_options() {
    let memory = Memory::new(SIZE);
    // LIST, INFO, an unknown export, an unsupported option, then EXPORT_NAME with the
    // old zero padding.
    let (mut s, server) = connect(&memory, false);
    hello(&mut s, CLIENT_FIXED_NEWSTYLE);
    send_option(&mut s, OPT_LIST, &[]);
    let (kind, data) = option_reply(&mut s);
    assert_eq!((kind, &data[4..8]), (REP_SERVER, &b"disk"[..]));
    assert_eq!(option_reply(&mut s).0, REP_ACK);
    send_option(&mut s, OPT_INFO, &go_payload(b"disk", &[]));
    assert_eq!(option_reply(&mut s).0, REP_INFO);
    assert_eq!(option_reply(&mut s).0, REP_ACK);
    send_option(&mut s, OPT_GO, &go_payload(b"nope", &[]));
    assert_eq!(option_reply(&mut s).0, REP_ERR_UNKNOWN);
    send_option(&mut s, OPT_GO, b"\x00\x00\x00\x09disk");
    assert_eq!(option_reply(&mut s).0, REP_ERR_INVALID);
    send_option(&mut s, 8, &[]);
    assert_eq!(option_reply(&mut s).0, REP_ERR_UNSUP);
    send_option(&mut s, OPT_EXPORT_NAME, b"");
    let reply = read_exact(&mut s, 8 + 2 + 124);
    assert_eq!(u64::from_be_bytes(reply[..8].try_into().unwrap()), SIZE as u64);
    assert!(reply[10..].iter().all(|&b| b == 0));
    disconnect(s, server);

    // ABORT ends negotiation with an ACK.
    let (mut s, server) = connect(&memory, false);
    hello(&mut s, CLIENT_FIXED_NEWSTYLE | CLIENT_NO_ZEROES);
    send_option(&mut s, OPT_ABORT, &[]);
    assert_eq!(option_reply(&mut s).0, REP_ACK);
    server.join().unwrap();
}

/// Writes and reads to overlapping ranges, pipelined without waiting for replies, come
/// back as if served one at a time, although four workers serve them.
#[test]
fn overlapping_requests_keep_their_order() {
    pipelined_overlaps_keep_their_order(Memory::new(SIZE));
}

/// The same when the reading thread serves quick writes and cached reads itself, between
/// the workers' slow ones.
#[test]
fn requests_served_without_a_worker_keep_their_order() {
    let served_by_reader = pipelined_overlaps_keep_their_order(Memory::quick(SIZE));
    assert!(served_by_reader > 0, "no request took the quick path");
}

/// Behind a slow write, quick requests that do not overlap it are answered by the reading
/// thread, before the slow one; an overlapping read waits for it.
#[test]
fn quick_requests_pass_a_slow_one() {
    let memory = Memory::quick(SIZE);
    let (mut s, server, stats) = connect_counted(&memory, false);
    go(&mut s);
    // One send, so the server finds them all buffered behind the first.
    let mut burst = Vec::new();
    let mut add = |command: u16, cookie: u64, offset: u64, payload: &[u8], length: u32| {
        burst.extend_from_slice(&Request { flags: 0, command, cookie, offset, length }.encode());
        burst.extend_from_slice(payload);
    };
    add(CMD_WRITE, 1, 0, &[7; 8192], 8192);
    for cookie in 2..22u64 {
        add(CMD_WRITE, cookie, 8192 * cookie, &[cookie as u8; 1024], 1024);
    }
    add(CMD_READ, 100, 0, &[], 512);
    s.write_all(&burst).unwrap();
    let mut order = Vec::new();
    for _ in 0..22 {
        let (error, cookie) = reply(&mut s);
        assert_eq!(error, 0);
        if cookie == 100 {
            assert_eq!(read_exact(&mut s, 512), vec![7; 512], "the read overtook the write it overlaps");
        }
        order.push(cookie);
    }
    let slow = order.iter().position(|&c| c == 1).unwrap();
    assert!(slow > 0, "no quick request was answered before the slow write: {order:?}");
    assert!(order.iter().position(|&c| c == 100).unwrap() > slow);
    assert!(stats.served_by_reader.load(std::sync::atomic::Ordering::Relaxed) >= 20);
    disconnect(s, server);
}

/// Returns how many requests the reading thread served.
fn pipelined_overlaps_keep_their_order(memory: Arc<Memory>) -> u64 {
    let (mut s, server, stats) = connect_counted(&memory, false);
    go(&mut s);
    let mut rng = StdRng::seed_from_u64(7);
    let mut model = vec![0u8; 64 * 1024];
    let mut expected_reads: Vec<(u64, Vec<u8>)> = Vec::new();
    let mut writer = s.try_clone().unwrap();
    let mut requests = Vec::new();
    for cookie in 0..400u64 {
        let offset = rng.random_range(0..112u64) * 512;
        let len = rng.random_range(1..=16u32) * 512;
        if rng.random_bool(0.6) {
            let byte = (cookie % 250 + 1) as u8;
            model[offset as usize..offset as usize + len as usize].fill(byte);
            requests.push((CMD_WRITE, cookie, offset, len, vec![byte; len as usize]));
        } else {
            expected_reads.push((cookie, model[offset as usize..offset as usize + len as usize].to_vec()));
            requests.push((CMD_READ, cookie, offset, len, Vec::new()));
        }
    }
    let sender = std::thread::spawn(move || {
        for (command, cookie, offset, len, payload) in requests {
            request(&mut writer, command, 0, cookie, offset, len, &payload);
        }
    });
    let mut reads = std::collections::HashMap::new();
    for _ in 0..400 {
        let (error, cookie) = reply(&mut s);
        assert_eq!(error, 0);
        if let Some((_, expected)) = expected_reads.iter().find(|(c, _)| *c == cookie) {
            reads.insert(cookie, read_exact(&mut s, expected.len()) == *expected);
        }
    }
    sender.join().unwrap();
    assert!(reads.values().all(|&ok| ok), "{} of {} reads saw another order", reads.values().filter(|&&ok| !ok).count(), reads.len());
    assert_eq!(memory.bytes.lock()[..model.len()], model[..]);
    disconnect(s, server);
    stats.served_by_reader.load(std::sync::atomic::Ordering::Relaxed)
}

/// Malformed handshakes and requests: each closes its connection (the server thread
/// returns), none panics, none changes the export.
#[test]
fn malformed_input_closes_the_connection_and_changes_nothing() {
    let memory = Memory::new(SIZE);
    let option = |option: u32, len: u32| {
        let mut b = IHAVEOPT.to_be_bytes().to_vec();
        b.extend_from_slice(&option.to_be_bytes());
        b.extend_from_slice(&len.to_be_bytes());
        b
    };
    let mut corpus: Vec<Vec<u8>> = vec![
        vec![],
        vec![0, 0],
        0u32.to_be_bytes().to_vec(),
        0xffu32.to_be_bytes().to_vec(),
        [&3u32.to_be_bytes()[..], b"NOTAMAGIC!!!"].concat(),
        [&3u32.to_be_bytes()[..], &option(OPT_GO, u32::MAX)].concat(),
        [&3u32.to_be_bytes()[..], &option(OPT_GO, 1000)[..], &[0u8; 10]].concat(),
        [&3u32.to_be_bytes()[..], &option(OPT_EXPORT_NAME, 4)[..], b"nope"].concat(),
    ];
    // After a good GO: a bad request magic, a truncated header, a write cut short.
    let mut go_bytes = 3u32.to_be_bytes().to_vec();
    go_bytes.extend_from_slice(&option(OPT_GO, 0)[..12]);
    let payload = go_payload(b"disk", &[]);
    go_bytes.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    go_bytes.extend_from_slice(&payload);
    let write = Request { flags: 0, command: CMD_WRITE, cookie: 1, offset: 0, length: 4096 }.encode();
    corpus.push([&go_bytes[..], &[0xde, 0xad, 0xbe, 0xef], &[0u8; 24]].concat());
    corpus.push([&go_bytes[..], &write[..10]].concat());
    corpus.push([&go_bytes[..], &write[..], &[5u8; 100]].concat());
    let mut rng = StdRng::seed_from_u64(11);
    for _ in 0..200 {
        let n = rng.random_range(0..200);
        let noise: Vec<u8> = (0..n).map(|_| rng.random()).collect();
        corpus.push(if rng.random_bool(0.5) { [&go_bytes[..], &noise[..]].concat() } else { noise });
    }
    for input in corpus {
        let (mut s, server) = connect(&memory, false);
        let _ = read_exact(&mut s, 18);
        let _ = s.write_all(&input);
        let _ = s.shutdown(std::net::Shutdown::Write);
        server.join().expect("the server thread ends without panicking");
    }
    assert!(memory.bytes.lock().iter().all(|&b| b == 0), "no malformed request changed the export");
}

const PSK_IDENTITY: &str = "alice";
const PSK: [u8; 32] = [7; 32];

/// A server with TLS-PSK (key [`PSK`] for [`PSK_IDENTITY`]) under `policy`, on a socket
/// pair; returns the client's end, the server thread and its counters.
fn connect_tls(memory: &Arc<Memory>, policy: TlsPolicy) -> (UnixStream, JoinHandle<()>, Arc<ServerStats>) {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys.psk");
    let hex: String = PSK.iter().map(|b| format!("{b:02x}")).collect();
    std::fs::write(&keys, format!("{PSK_IDENTITY}:{hex}\n")).unwrap();
    std::fs::set_permissions(&keys, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let (client, server) = UnixStream::pair().unwrap();
    let export = Arc::clone(memory) as Arc<dyn Export>;
    let mut config = ServerConfig::new(vec![ExportEntry { name: "disk".into(), description: "test".into(), export, read_only: false }]);
    config.tls = Some(TlsConfig::psk(&keys, policy).unwrap());
    config.handshake_timeout = std::time::Duration::from_secs(5);
    let stats = Arc::new(ServerStats::default());
    let counted = Arc::clone(&stats);
    let handle = std::thread::spawn(move || serve_connection(server, &config, &counted));
    (client, handle, stats)
}

/// The client's side of a TLS-PSK handshake, as a libnbd client runs it after STARTTLS.
fn tls_client(s: UnixStream, key: [u8; 32]) -> Result<SslStream<UnixStream>, String> {
    let mut builder = SslConnector::builder(SslMethod::tls_client()).unwrap();
    builder.set_min_proto_version(Some(SslVersion::TLS1_3)).unwrap();
    builder.set_psk_client_callback(move |_ssl, _hint, identity, psk| {
        identity[..PSK_IDENTITY.len()].copy_from_slice(PSK_IDENTITY.as_bytes());
        identity[PSK_IDENTITY.len()] = 0;
        psk[..key.len()].copy_from_slice(&key);
        Ok(key.len())
    });
    let config = builder.build().configure().unwrap().verify_hostname(false).use_server_name_indication(false);
    config.connect("localhost", s).map_err(|e| e.to_string())
}

#[test]
fn tls_required_answers_only_starttls_then_serves_over_tls() {
    let memory = Memory::new(SIZE);
    let (mut s, server, stats) = connect_tls(&memory, TlsPolicy::Require);
    hello(&mut s, CLIENT_FIXED_NEWSTYLE | CLIENT_NO_ZEROES);
    for option in [OPT_LIST, OPT_INFO, OPT_GO, 8] {
        send_option(&mut s, option, &go_payload(b"disk", &[]));
        assert_eq!(option_reply(&mut s).0, REP_ERR_TLS_REQD, "option {option} before STARTTLS");
    }
    send_option(&mut s, OPT_STARTTLS, b"x");
    assert_eq!(option_reply(&mut s).0, REP_ERR_INVALID, "STARTTLS takes no data");
    send_option(&mut s, OPT_STARTTLS, &[]);
    assert_eq!(option_reply(&mut s).0, REP_ACK);
    let mut tls = tls_client(s, PSK).unwrap();
    send_option(&mut tls, OPT_STARTTLS, &[]);
    assert_eq!(option_reply(&mut tls).0, REP_ERR_INVALID, "STARTTLS over TLS");
    // Negotiation goes on without a new greeting.
    send_option(&mut tls, OPT_GO, &go_payload(b"disk", &[INFO_BLOCK_SIZE]));
    while option_reply(&mut tls).0 == REP_INFO {}
    let data: Vec<u8> = (0..64 << 10).map(|i| (i % 251) as u8).collect();
    request(&mut tls, CMD_WRITE, CMD_FLAG_FUA, 1, 8192, data.len() as u32, &data);
    request(&mut tls, CMD_READ, 0, 2, 8192, data.len() as u32, &[]);
    assert_eq!(reply(&mut tls), (0, 1));
    assert_eq!(reply(&mut tls), (0, 2));
    assert_eq!(read_exact(&mut tls, data.len()), data);
    request(&mut tls, CMD_DISC, 0, 3, 0, 0, &[]);
    server.join().unwrap();
    assert_eq!(&memory.bytes.lock()[8192..8192 + data.len()], &data[..]);
    assert_eq!(stats.tls_sessions.load(std::sync::atomic::Ordering::Relaxed), 1);
}

#[test]
fn tls_required_hangs_up_on_export_name_and_a_wrong_key() {
    let memory = Memory::new(SIZE);
    // EXPORT_NAME has no error reply: the protocol says to hang up.
    let (mut s, server, stats) = connect_tls(&memory, TlsPolicy::Require);
    hello(&mut s, CLIENT_FIXED_NEWSTYLE | CLIENT_NO_ZEROES);
    send_option(&mut s, OPT_EXPORT_NAME, b"disk");
    server.join().unwrap();
    assert_eq!(s.read(&mut [0u8; 1]).unwrap(), 0);
    assert_eq!(stats.refused_handshakes.load(std::sync::atomic::Ordering::Relaxed), 1);

    let (mut s, server, stats) = connect_tls(&memory, TlsPolicy::Require);
    hello(&mut s, CLIENT_FIXED_NEWSTYLE | CLIENT_NO_ZEROES);
    send_option(&mut s, OPT_STARTTLS, &[]);
    assert_eq!(option_reply(&mut s).0, REP_ACK);
    assert!(tls_client(s, [8; 32]).is_err(), "a wrong key fails the handshake");
    server.join().unwrap();
    assert_eq!(stats.refused_handshakes.load(std::sync::atomic::Ordering::Relaxed), 1);
    assert_eq!(stats.tls_sessions.load(std::sync::atomic::Ordering::Relaxed), 0);
}

#[test]
fn tls_offered_serves_plaintext_and_off_refuses_starttls_by_policy() {
    let memory = Memory::new(SIZE);
    let (mut s, server, _) = connect_tls(&memory, TlsPolicy::On);
    go(&mut s);
    disconnect(s, server);

    let (mut s, server) = connect(&memory, false);
    hello(&mut s, CLIENT_FIXED_NEWSTYLE | CLIENT_NO_ZEROES);
    send_option(&mut s, OPT_STARTTLS, &[]);
    assert_eq!(option_reply(&mut s).0, REP_ERR_POLICY);
    send_option(&mut s, OPT_ABORT, &[]);
    assert_eq!(option_reply(&mut s).0, REP_ACK);
    server.join().unwrap();
}

/// Bytes that are not a TLS handshake after STARTTLS's acknowledgement, and bytes sent
/// before it: each closes the connection, none panics, the export is unchanged.
#[test]
fn malformed_tls_records_close_the_connection_and_change_nothing() {
    let memory = Memory::new(SIZE);
    let mut rng = StdRng::seed_from_u64(12);
    let client_hello_head = [0x16u8, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03];
    for round in 0..60 {
        let (mut s, server, stats) = connect_tls(&memory, TlsPolicy::Require);
        hello(&mut s, CLIENT_FIXED_NEWSTYLE | CLIENT_NO_ZEROES);
        let n = rng.random_range(0..600);
        let mut noise: Vec<u8> = (0..n).map(|_| rng.random()).collect();
        if round % 3 == 0 {
            // A record header that claims a handshake, then garbage.
            noise.splice(0..0, client_hello_head);
        }
        if round == 1 {
            // The handshake's first bytes right behind STARTTLS, before its reply.
            let mut both = IHAVEOPT.to_be_bytes().to_vec();
            both.extend_from_slice(&OPT_STARTTLS.to_be_bytes());
            both.extend_from_slice(&0u32.to_be_bytes());
            both.extend_from_slice(&client_hello_head);
            s.write_all(&both).unwrap();
        } else {
            send_option(&mut s, OPT_STARTTLS, &[]);
            assert_eq!(option_reply(&mut s).0, REP_ACK);
            let _ = s.write_all(&noise);
        }
        let _ = s.shutdown(std::net::Shutdown::Write);
        server.join().expect("the server thread ends without panicking");
        assert_eq!(stats.tls_sessions.load(std::sync::atomic::Ordering::Relaxed), 0);
    }
    assert!(memory.bytes.lock().iter().all(|&b| b == 0), "no malformed record changed the export");
}
