//! Seed inputs for the `nbd_connection` fuzz target: whole client conversations, from the
//! protocol's own constants and request encoder. `cargo run -p alignfs-nbd --example
//! fuzz_seeds -- DIR` writes `DIR/nbd_connection/seed-N`; `scripts/fuzz.sh` runs it, so
//! the fuzzer starts past the magic numbers and mutates real conversations.

use std::path::Path;

use alignfs_nbd::protocol::*;

fn option(option: u32, data: &[u8]) -> Vec<u8> {
    let mut bytes = IHAVEOPT.to_be_bytes().to_vec();
    bytes.extend_from_slice(&option.to_be_bytes());
    bytes.extend_from_slice(&(data.len() as u32).to_be_bytes());
    bytes.extend_from_slice(data);
    bytes
}

/// INFO/GO's payload: the export's name and the information items asked for.
fn go(name: &[u8], items: &[u16]) -> Vec<u8> {
    let mut data = (name.len() as u32).to_be_bytes().to_vec();
    data.extend_from_slice(name);
    data.extend_from_slice(&(items.len() as u16).to_be_bytes());
    for item in items {
        data.extend_from_slice(&item.to_be_bytes());
    }
    data
}

fn request(command: u16, flags: u16, offset: u64, length: u32) -> Vec<u8> {
    Request { flags, command, cookie: offset ^ u64::from(command), offset, length }.encode().to_vec()
}

/// Reads, writes (with and without FUA), zeroes, trims and flushes, then a disconnect.
fn requests() -> Vec<u8> {
    let mut bytes = request(CMD_WRITE, 0, 4096, 512);
    bytes.extend(std::iter::repeat_n(0xab, 512));
    bytes.extend(request(CMD_WRITE, CMD_FLAG_FUA, 8192, 4096));
    bytes.extend(std::iter::repeat_n(0x5c, 4096));
    bytes.extend(request(CMD_READ, 0, 4096, 512));
    bytes.extend(request(CMD_WRITE_ZEROES, CMD_FLAG_NO_HOLE, 0, 4096));
    bytes.extend(request(CMD_TRIM, 0, 65536, 65536));
    bytes.extend(request(CMD_FLUSH, 0, 0, 0));
    bytes.extend(request(CMD_DISC, 0, 0, 0));
    bytes
}

fn main() {
    let Some(dir) = std::env::args_os().nth(1) else {
        eprintln!("usage: fuzz_seeds DIR (writes DIR/nbd_connection/seed-*)");
        std::process::exit(2);
    };
    let dir = Path::new(&dir).join("nbd_connection");
    std::fs::create_dir_all(&dir).expect("the seed directory");
    let flags = (CLIENT_FIXED_NEWSTYLE | CLIENT_NO_ZEROES).to_be_bytes();
    let mut conversations: Vec<Vec<u8>> = Vec::new();
    // LIST, INFO, then GO and requests.
    let mut c = flags.to_vec();
    c.extend(option(OPT_LIST, &[]));
    c.extend(option(OPT_INFO, &go(b"fuzz", &[INFO_NAME, INFO_DESCRIPTION, INFO_BLOCK_SIZE])));
    c.extend(option(OPT_GO, &go(b"", &[])));
    c.extend(requests());
    conversations.push(c);
    // The old EXPORT_NAME with zero padding, then requests.
    let mut c = CLIENT_FIXED_NEWSTYLE.to_be_bytes().to_vec();
    c.extend(option(OPT_EXPORT_NAME, b"fuzz"));
    c.extend(requests());
    conversations.push(c);
    // An unknown option and STARTTLS (5), then ABORT.
    let mut c = flags.to_vec();
    c.extend(option(99, b"x"));
    c.extend(option(5, &[]));
    c.extend(option(OPT_ABORT, &[]));
    conversations.push(c);
    for (i, bytes) in conversations.iter().enumerate() {
        std::fs::write(dir.join(format!("seed-{i}")), bytes).expect("a seed file");
    }
}
