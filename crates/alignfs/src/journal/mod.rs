//! Durable metadata: a checksummed, sequence-numbered redo journal of [`crate::meta::Op`]
//! records plus A/B checkpoints of the whole state. Byte tables: docs/format/journal.md.

mod checkpoint;
mod encoding;
mod log;
mod ssd_window;
mod store;

pub use checkpoint::{decode_state, encode_state as checkpoint_payload, AsIs, CheckpointSlots, DurableView, LoadedCheckpoint};
pub use encoding::{decode_entry, decode_ops, encode_entry, encode_ops, MAX_ENCODED_SEGMENTS};
pub use log::{Journal, Replay};
pub use ssd_window::SsdWindow;
pub(crate) use store::{CommitContext, GroupSync, JournalStore, MetaStore, MetaUsage};

use std::sync::Arc;

use crate::device::ByteTier;
use crate::error::Result;

/// The medium metadata lives on: a window of the fast tier for `orch`; an SSD log area
/// ([`SsdWindow`]) for profiles without persistent memory.
pub trait MetaMedium: Send + Sync {
    fn len_bytes(&self) -> u64;
    /// The unit the medium writes whole (8 bytes of persistent memory, a 4 KiB SSD
    /// sector). Journal records start on its boundaries, so appending one never rewrites
    /// the unit holding an acknowledged record, and a torn write cannot damage one.
    fn write_unit(&self) -> u64;
    fn read(&self, offset: u64, out: &mut [u8]);
    /// Write and make durable before returning.
    fn write_durable(&self, offset: u64, data: &[u8]) -> Result<()>;
}

/// `len` bytes of a fast-tier region starting at `offset`.
pub struct PmemWindow {
    region: Arc<dyn ByteTier>,
    offset: u64,
    len: u64,
}

impl PmemWindow {
    pub fn new(region: Arc<dyn ByteTier>, offset: u64, len: u64) -> PmemWindow {
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
    fn write_unit(&self) -> u64 {
        8
    }
    fn read(&self, offset: u64, out: &mut [u8]) {
        self.region.read(self.at(offset, out.len()), out);
    }
    fn write_durable(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.region.write_persist(self.at(offset, data.len()), data);
        Ok(())
    }
}
