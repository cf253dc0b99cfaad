//! The NBD wire protocol, fixed-newstyle negotiation and simple replies
//! (<https://github.com/NetworkBlockDevice/nbd/blob/master/doc/proto.md>): constants, and
//! the parsing of what a client sends. Parsing never trusts a length: every one is
//! checked against a limit before anything is allocated.

use std::io::{self, Read, Write};

pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
pub const IHAVEOPT: u64 = 0x4948_4156_454F_5054;
pub const REPLY_MAGIC_OPTION: u64 = 0x0003_e889_0455_65a9;
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;

// Handshake flags (server) and client flags.
pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
pub const FLAG_NO_ZEROES: u16 = 1 << 1;
pub const CLIENT_FIXED_NEWSTYLE: u32 = 1 << 0;
pub const CLIENT_NO_ZEROES: u32 = 1 << 1;

// Options.
pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_ABORT: u32 = 2;
pub const OPT_LIST: u32 = 3;
pub const OPT_STARTTLS: u32 = 5;
pub const OPT_INFO: u32 = 6;
pub const OPT_GO: u32 = 7;

// Option replies.
pub const REP_ACK: u32 = 1;
pub const REP_SERVER: u32 = 2;
pub const REP_INFO: u32 = 3;
pub const REP_ERR_UNSUP: u32 = (1 << 31) + 1;
pub const REP_ERR_POLICY: u32 = (1 << 31) + 2;
pub const REP_ERR_INVALID: u32 = (1 << 31) + 3;
pub const REP_ERR_TLS_REQD: u32 = (1 << 31) + 5;
pub const REP_ERR_UNKNOWN: u32 = (1 << 31) + 6;
pub const REP_ERR_TOO_BIG: u32 = (1 << 31) + 9;

// Information types of NBD_REP_INFO.
pub const INFO_EXPORT: u16 = 0;
pub const INFO_NAME: u16 = 1;
pub const INFO_DESCRIPTION: u16 = 2;
pub const INFO_BLOCK_SIZE: u16 = 3;

// Transmission flags.
pub const TFLAG_HAS_FLAGS: u16 = 1 << 0;
pub const TFLAG_READ_ONLY: u16 = 1 << 1;
pub const TFLAG_SEND_FLUSH: u16 = 1 << 2;
pub const TFLAG_SEND_FUA: u16 = 1 << 3;
pub const TFLAG_SEND_TRIM: u16 = 1 << 5;
pub const TFLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const TFLAG_CAN_MULTI_CONN: u16 = 1 << 8;

// Commands and command flags.
pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_TRIM: u16 = 4;
pub const CMD_WRITE_ZEROES: u16 = 6;
pub const CMD_FLAG_FUA: u16 = 1 << 0;
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;

// Errors.
pub const EPERM: u32 = 1;
pub const EIO: u32 = 5;
pub const ENOMEM: u32 = 12;
pub const EINVAL: u32 = 22;
pub const ENOSPC: u32 = 28;
pub const ENOTSUP: u32 = 95;

/// Longest option payload accepted; a longer one ends the connection (it cannot be a
/// legitimate option of those this server knows: names are at most 4 KiB).
pub const MAX_OPTION_BYTES: u32 = 64 * 1024;
/// Longest export name (the protocol's limit).
pub const MAX_NAME_BYTES: usize = 4096;

/// One option a client sent during negotiation.
#[derive(Debug, PartialEq, Eq)]
pub struct OptionRequest {
    pub option: u32,
    pub data: Vec<u8>,
}

/// Why a connection must end during negotiation or transmission.
#[derive(Debug)]
pub enum Hangup {
    /// The socket failed or closed.
    Io(io::Error),
    /// The client broke the protocol: what it did.
    Protocol(String),
}

impl From<io::Error> for Hangup {
    fn from(e: io::Error) -> Self {
        Hangup::Io(e)
    }
}

impl std::fmt::Display for Hangup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Hangup::Io(e) => write!(f, "connection: {e}"),
            Hangup::Protocol(what) => write!(f, "protocol violation: {what}"),
        }
    }
}

pub fn read_u16(r: &mut impl Read) -> io::Result<u16> {
    let mut b = [0u8; 2];
    r.read_exact(&mut b)?;
    Ok(u16::from_be_bytes(b))
}

pub fn read_u32(r: &mut impl Read) -> io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_be_bytes(b))
}

pub fn read_u64(r: &mut impl Read) -> io::Result<u64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_be_bytes(b))
}

/// Read one option header and its payload.
pub fn read_option(r: &mut impl Read) -> Result<OptionRequest, Hangup> {
    let magic = read_u64(r)?;
    if magic != IHAVEOPT {
        return Err(Hangup::Protocol(format!("option magic {magic:#x} is not IHAVEOPT")));
    }
    let option = read_u32(r)?;
    let len = read_u32(r)?;
    if len > MAX_OPTION_BYTES {
        return Err(Hangup::Protocol(format!("option {option} carries {len} bytes (at most {MAX_OPTION_BYTES})")));
    }
    let mut data = vec![0u8; len as usize];
    r.read_exact(&mut data)?;
    Ok(OptionRequest { option, data })
}

/// The payload of `NBD_OPT_INFO` / `NBD_OPT_GO`: an export name and the information
/// types the client asks for.
#[derive(Debug, PartialEq, Eq)]
pub struct InfoRequest {
    pub name: Vec<u8>,
    pub wanted: Vec<u16>,
}

impl InfoRequest {
    pub fn parse(data: &[u8]) -> Option<InfoRequest> {
        let name_len = u32::from_be_bytes(data.get(..4)?.try_into().ok()?) as usize;
        if name_len > MAX_NAME_BYTES {
            return None;
        }
        let name = data.get(4..4 + name_len)?.to_vec();
        let rest = &data[4 + name_len..];
        let count = u16::from_be_bytes(rest.get(..2)?.try_into().ok()?) as usize;
        let list = &rest[2..];
        if list.len() != count * 2 {
            return None;
        }
        let wanted = list.chunks_exact(2).map(|c| u16::from_be_bytes([c[0], c[1]])).collect();
        Some(InfoRequest { name, wanted })
    }
}

/// An option reply header and its payload.
pub fn option_reply(w: &mut impl Write, option: u32, reply: u32, data: &[u8]) -> io::Result<()> {
    let mut out = Vec::with_capacity(20 + data.len());
    out.extend_from_slice(&REPLY_MAGIC_OPTION.to_be_bytes());
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&reply.to_be_bytes());
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(data);
    w.write_all(&out)
}

/// One transmission-phase request header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    pub flags: u16,
    pub command: u16,
    pub cookie: u64,
    pub offset: u64,
    pub length: u32,
}

impl Request {
    pub const BYTES: usize = 28;

    pub fn read(r: &mut impl Read) -> Result<Request, Hangup> {
        let mut b = [0u8; Self::BYTES];
        r.read_exact(&mut b)?;
        let magic = u32::from_be_bytes(b[0..4].try_into().expect("4 bytes"));
        if magic != REQUEST_MAGIC {
            return Err(Hangup::Protocol(format!("request magic {magic:#x} is not {REQUEST_MAGIC:#x}")));
        }
        Ok(Request {
            flags: u16::from_be_bytes([b[4], b[5]]),
            command: u16::from_be_bytes([b[6], b[7]]),
            cookie: u64::from_be_bytes(b[8..16].try_into().expect("8 bytes")),
            offset: u64::from_be_bytes(b[16..24].try_into().expect("8 bytes")),
            length: u32::from_be_bytes(b[24..28].try_into().expect("4 bytes")),
        })
    }

    pub fn encode(&self) -> [u8; Self::BYTES] {
        let mut b = [0u8; Self::BYTES];
        b[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        b[4..6].copy_from_slice(&self.flags.to_be_bytes());
        b[6..8].copy_from_slice(&self.command.to_be_bytes());
        b[8..16].copy_from_slice(&self.cookie.to_be_bytes());
        b[16..24].copy_from_slice(&self.offset.to_be_bytes());
        b[24..28].copy_from_slice(&self.length.to_be_bytes());
        b
    }
}

/// A simple reply's 16-byte header.
pub fn simple_reply(error: u32, cookie: u64) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    b[4..8].copy_from_slice(&error.to_be_bytes());
    b[8..16].copy_from_slice(&cookie.to_be_bytes());
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_requests_parse_and_malformed_ones_do_not() {
        let mut data = 5u32.to_be_bytes().to_vec();
        data.extend_from_slice(b"disk0");
        data.extend_from_slice(&2u16.to_be_bytes());
        data.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
        data.extend_from_slice(&INFO_NAME.to_be_bytes());
        assert_eq!(InfoRequest::parse(&data), Some(InfoRequest { name: b"disk0".to_vec(), wanted: vec![3, 1] }));
        for cut in 0..data.len() {
            assert_eq!(InfoRequest::parse(&data[..cut]), None, "cut at {cut}");
        }
        let mut huge = data.clone();
        huge[..4].copy_from_slice(&u32::MAX.to_be_bytes());
        assert_eq!(InfoRequest::parse(&huge), None);
    }

    #[test]
    fn requests_round_trip_and_bad_magic_hangs_up() {
        let request = Request { flags: CMD_FLAG_FUA, command: CMD_WRITE, cookie: 7, offset: 4096, length: 512 };
        assert_eq!(Request::read(&mut &request.encode()[..]).unwrap(), request);
        let mut bad = request.encode();
        bad[0] ^= 1;
        assert!(matches!(Request::read(&mut &bad[..]), Err(Hangup::Protocol(_))));
        assert!(matches!(Request::read(&mut &bad[..10]), Err(Hangup::Io(_))));
    }

    #[test]
    fn an_oversized_option_hangs_up_before_allocating() {
        let mut data = IHAVEOPT.to_be_bytes().to_vec();
        data.extend_from_slice(&OPT_GO.to_be_bytes());
        data.extend_from_slice(&u32::MAX.to_be_bytes());
        assert!(matches!(read_option(&mut &data[..]), Err(Hangup::Protocol(m)) if m.contains("at most")));
    }
}
