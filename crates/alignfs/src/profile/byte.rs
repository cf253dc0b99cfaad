//! `byte` — ByteFS (ASPLOS'25) on the emulated memory-semantic SSD (docs/BYTE.md). Whole
//! blocks go through the block interface, out of place; the unaligned residue of a write,
//! and every write of at most 512 bytes whole, goes through the byte interface into the
//! device's write log; metadata records are cache-line stores too. Every write is durable
//! when it returns. With the byte interface off (`--no-byte-interface`), the same volume
//! runs on the block interface alone: the paper's block-only baseline.

use std::sync::Arc;

use super::{DeviceKind, Policy, Profile, ProfileSpec, Promise, ResidueSetup, Tunable};
use crate::error::{DeviceProblem, Error, Result};
use crate::geometry::{Geometry, KIB, UPAGE_MAX_CHUNKS};
use crate::options::VolumeOptions;
use crate::partition::{Residue, Rules};
use crate::residue::{ByteLogPages, ResidueStore};

impl Profile {
    pub const BYTE: Profile = Profile(5);
}

/// Direct writes of at most this many bytes go through the byte interface whole (ByteFS's
/// direct-access rule: below it, cache-line stores beat persisting a whole 4 KiB page).
pub const BYTE_WRITE_MAX: u64 = 512;

/// A page written back with at most this share of its 64-byte lines changed sends just
/// those lines through the byte interface; more, and it goes whole through the block
/// interface (ByteFS's buffered-I/O rule: a modified ratio of 1/8, 512 bytes of 4 KiB).
pub const MODIFIED_RATIO_MAX: f64 = 1.0 / 8.0;

pub(super) struct Byte;

impl ProfileSpec for Byte {
    fn profile(&self) -> Profile {
        Profile::BYTE
    }
    fn name(&self) -> &'static str {
        "byte"
    }
    fn summary(&self) -> &'static str {
        "ByteFS: an emulated memory-semantic SSD (--ssd flash image, --fast its DRAM); residue and metadata as byte stores, durable on every write"
    }
    fn devices(&self) -> DeviceKind {
        DeviceKind::MemorySemanticSsd
    }
    fn promise(&self) -> Promise {
        Promise::OnWrite
    }
    fn tunables(&self) -> &'static [Tunable] {
        &[Tunable::Watermarks, Tunable::ByteInterface, Tunable::DeviceLatency, Tunable::CleanCache]
    }
    /// The device's page is 4 KiB, and so are ByteFS's blocks.
    fn default_geometry(&self) -> Geometry {
        Geometry { block_bytes: 4 * 1024, page_bytes: 4 * 1024, ..Geometry::default() }
    }
    fn validate_geometry(&self, geometry: &Geometry) -> Result<()> {
        let (b, p) = (geometry.block(), geometry.page());
        if p != 4 * KIB || !(b == 4 * KIB || b == 8 * KIB || b == 16 * KIB) {
            return Err(Error::Geometry(format!(
                "a byte volume's page is the device's 4 KiB page (not {p}), its block 4, 8 or 16 KiB (not {b})"
            )));
        }
        Ok(())
    }
    fn max_segments(&self) -> usize {
        UPAGE_MAX_CHUNKS
    }
    fn residue_store(&self, setup: &ResidueSetup<'_>) -> Result<Arc<dyn ResidueStore>> {
        let device =
            setup.byte.ok_or(Error::WrongDevices(DeviceProblem::Profile { profile: "byte", rule: "needs a memory-semantic SSD" }))?;
        let layout = setup.layout;
        let page_bytes = setup.geometry.page_bytes;
        // The host's cache of the device holds residue units as well as SSD blocks.
        let copied_units = setup.options.clean_cache_bytes / u64::from(page_bytes);
        Ok(Arc::new(ByteLogPages::new(Arc::clone(device), layout.pages_offset, layout.page_count, page_bytes, copied_units)))
    }
    fn policy(&self, options: &VolumeOptions) -> Box<dyn Policy> {
        Box::new(BytePolicy { byte_interface: options.byte_interface })
    }
}

struct BytePolicy {
    /// `false`: the block-only baseline.
    byte_interface: bool,
}

impl Policy for BytePolicy {
    /// ByteFS's direct-write rule: at most 512 bytes through the byte interface, larger
    /// writes through the block interface, whose partial blocks are byte stores too (never
    /// a read before a write). Block-only: partial blocks are read, merged and rewritten.
    fn write_rules(&self, len: u64) -> Rules {
        let residue = match (self.byte_interface, len <= BYTE_WRITE_MAX) {
            (false, _) => Residue::Forbidden,
            (true, true) => Residue::All,
            (true, false) => Residue::Partial,
        };
        Rules { residue, max_segments: UPAGE_MAX_CHUNKS }
    }

    fn write_back_line_share(&self) -> Option<f64> {
        self.byte_interface.then_some(MODIFIED_RATIO_MAX)
    }

    /// The host's cache of the device's blocks, in both modes: ByteFS and its ext4
    /// baseline read through the kernel's page cache, and the emulated device has no
    /// kernel cache in front of it (docs/BYTE.md, "Host cache").
    fn keeps_clean_pages(&self) -> bool {
        true
    }

    fn merge_commit_batch(&self) -> usize {
        32
    }
}
