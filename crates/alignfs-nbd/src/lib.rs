//! An NBD server (fixed-newstyle negotiation, simple replies) for alignfs block volumes.
//!
//! No well-kept NBD server crate exists (`../shared/DEPENDENCIES.md`), so this is ours:
//! [`protocol`] holds the wire format and its parsing, [`server`] the listeners and the
//! per-connection request scheduling. The server serves anything that implements
//! [`Export`]; [`BlockVolume`] does, mapping engine errors to NBD errors in one place.

mod config;
mod negotiate;
pub mod protocol;
pub mod server;
mod tls;
mod transmit;

use alignfs::personality::BlockVolume;
use alignfs::Error;

pub use server::{default_workers, ExportEntry, Server, ServerConfig, ServerStats};
pub use tls::{TlsConfig, TlsPolicy};

/// An error to return to the client, as an NBD errno.
#[derive(Debug)]
pub struct ExportError(u32);

impl ExportError {
    pub fn nbd_errno(&self) -> u32 {
        self.0
    }
}

impl From<Error> for ExportError {
    fn from(e: Error) -> Self {
        use protocol::*;
        let errno = match &e {
            Error::OutOfRange { .. } | Error::InvalidArgument(_) => EINVAL,
            Error::NoSpace | Error::MetadataFull(_) => ENOSPC,
            Error::ReadOnly => EPERM,
            _ => EIO,
        };
        if errno == EIO {
            tracing::error!("request failed: {e}");
        }
        ExportError(errno)
    }
}

/// What an NBD export needs from a block device.
pub trait Export: Send + Sync {
    fn size(&self) -> u64;
    /// The smallest request unit: offsets and lengths must be multiples of it.
    fn block_size(&self) -> u32;
    /// The unit requests should preferably come in (no read-modify-write below it).
    fn preferred_block_size(&self) -> u32;
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), ExportError>;
    /// Serve a read now if its bytes are all in memory; `None` when it would wait for the
    /// device (the server then hands it to a worker thread that may block).
    fn read_if_cached(&self, _offset: u64, _buf: &mut [u8]) -> Option<Result<(), ExportError>> {
        None
    }
    /// Whether a write of this range (without FUA) lands in memory-speed storage, so a
    /// server may serve it on the thread that reads requests. Only a hint.
    fn write_is_quick(&self, _offset: u64, _len: u64) -> bool {
        false
    }
    /// Whether [`Export::flush`] returns without waiting for a device. Only a hint.
    fn flush_is_quick(&self) -> bool {
        false
    }
    /// `fua`: durable when this returns.
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), ExportError>;
    fn flush(&self) -> Result<(), ExportError>;
    fn trim(&self, offset: u64, len: u64, fua: bool) -> Result<(), ExportError>;
    /// `no_hole`: the zeros must be allocated, not a hole.
    fn write_zeroes(&self, offset: u64, len: u64, no_hole: bool, fua: bool) -> Result<(), ExportError>;
}

impl Export for BlockVolume {
    fn size(&self) -> u64 {
        BlockVolume::size(self)
    }
    fn block_size(&self) -> u32 {
        self.layout().sector_bytes
    }
    fn preferred_block_size(&self) -> u32 {
        self.volume().geometry().block_bytes
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), ExportError> {
        Ok(BlockVolume::read(self, offset, buf)?)
    }
    fn read_if_cached(&self, offset: u64, buf: &mut [u8]) -> Option<Result<(), ExportError>> {
        match BlockVolume::read_if_cached(self, offset, buf) {
            Err(Error::WouldBlock) => None,
            done => Some(done.map_err(ExportError::from)),
        }
    }
    fn write_is_quick(&self, offset: u64, len: u64) -> bool {
        BlockVolume::write_is_quick(self, offset, len)
    }
    fn flush_is_quick(&self) -> bool {
        BlockVolume::flush_is_quick(self)
    }
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), ExportError> {
        BlockVolume::write(self, offset, data)?;
        durable_if(self, fua)
    }
    fn flush(&self) -> Result<(), ExportError> {
        Ok(BlockVolume::flush(self)?)
    }
    fn trim(&self, offset: u64, len: u64, fua: bool) -> Result<(), ExportError> {
        BlockVolume::trim(self, offset, len)?;
        durable_if(self, fua)
    }
    fn write_zeroes(&self, offset: u64, len: u64, no_hole: bool, fua: bool) -> Result<(), ExportError> {
        if !no_hole {
            return Export::trim(self, offset, len, fua);
        }
        const CHUNK: u64 = 1 << 20;
        let zeros = vec![0u8; CHUNK.min(len) as usize];
        let mut at = offset;
        while at < offset + len {
            let n = CHUNK.min(offset + len - at);
            BlockVolume::write(self, at, &zeros[..n as usize])?;
            at += n;
        }
        durable_if(self, fua)
    }
}

/// FUA: a profile whose writes are durable on return has nothing left to do.
fn durable_if(volume: &BlockVolume, fua: bool) -> Result<(), ExportError> {
    if fua && !volume.volume().durable_when_written() {
        volume.flush()?;
    }
    Ok(())
}
