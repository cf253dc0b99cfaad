//! Durable metadata: a checksummed, sequence-numbered redo journal of [`crate::meta::Op`]
//! records plus A/B checkpoints of the whole state. Byte tables: docs/format/journal.md.

mod checkpoint;
mod encoding;
mod log;

pub use checkpoint::{decode_state, encode_state as checkpoint_payload, CheckpointSlots, LoadedCheckpoint};
pub use encoding::{decode_entry, decode_ops, encode_entry, encode_ops};
pub use log::{Journal, Replay};

use std::sync::Arc;

use crate::device::PmemRegion;

/// The medium metadata lives on: a window of the fast tier for `orch`; an SSD log area
/// for profiles without persistent memory.
pub trait MetaMedium: Send + Sync {
    fn len_bytes(&self) -> u64;
    fn read(&self, offset: u64, out: &mut [u8]);
    /// Write and make durable before returning.
    fn write_durable(&self, offset: u64, data: &[u8]);
}

/// `len` bytes of a fast-tier region starting at `offset`.
pub struct PmemWindow {
    region: Arc<PmemRegion>,
    offset: u64,
    len: u64,
}

impl PmemWindow {
    pub fn new(region: Arc<PmemRegion>, offset: u64, len: u64) -> PmemWindow {
        assert!(offset + len <= region.len_bytes(), "window inside the region");
        PmemWindow { region, offset, len }
    }

    fn at(&self, offset: u64, len: usize) -> u64 {
        assert!(offset + len as u64 <= self.len, "access inside the window");
        self.offset + offset
    }
}

impl MetaMedium for PmemWindow {
    fn len_bytes(&self) -> u64 {
        self.len
    }
    fn read(&self, offset: u64, out: &mut [u8]) {
        self.region.read(self.at(offset, out.len()), out);
    }
    fn write_durable(&self, offset: u64, data: &[u8]) {
        self.region.write_persist(self.at(offset, data.len()), data);
    }
}
