//! `uhs` — UHS (DATE'23): a block volume over a persistent fast tier (NVM) and one SSD.
//! Small writes go whole to a hashed NVM buffer ([`HashedSegments`]), large ones send
//! their whole blocks straight to the SSD; ranges fixed at format time live in an NVM zone
//! (`personality::block`). Every write is durable when it returns (docs/UHS.md).

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use super::{drain_when_idle, DeviceKind, EngineApi, Personality, Policy, Profile, ProfileSpec, Promise, ResidueSetup, Tunable};
use crate::background::spawn;
use crate::error::{DeviceProblem, Error, Result};
use crate::geometry::{Geometry, KIB, UPAGE_MAX_CHUNKS};
use crate::options::VolumeOptions;
use crate::partition::{Residue, Rules};
use crate::residue::{HashedSegments, ResidueStore};

impl Profile {
    pub const UHS: Profile = Profile(3);
}

/// Writes below this go to the NVM buffer whole; larger ones send their whole blocks to
/// the SSD. Measured over NBD (docs/UHS.md): 128 KiB beat 16 and 64 KiB by 1.7-3.1x on
/// flushed 4k+64k and 16k+64k writes at queue depth 1, because each direct write waits
/// for an SSD flush, and tied them at depth 8 (with a longer p99.9 tail).
pub const DEFAULT_SMALL_WRITE: u64 = 128 * KIB;

/// How long the volume must see no write before migration drains the buffer ("under
/// light load").
const IDLE_BEFORE_DRAIN: Duration = Duration::from_millis(200);

pub(super) struct Uhs;

impl ProfileSpec for Uhs {
    fn profile(&self) -> Profile {
        Profile::UHS
    }
    fn name(&self) -> &'static str {
        "uhs"
    }
    fn summary(&self) -> &'static str {
        "UHS: a block volume (serve it with `alignfs nbd`); small writes in a hashed NVM buffer (--fast), durable on every write"
    }
    fn personality(&self) -> Personality {
        Personality::Block
    }
    fn devices(&self) -> DeviceKind {
        DeviceKind::FastTierAndSsd
    }
    fn promise(&self) -> Promise {
        Promise::OnWrite
    }
    fn tunables(&self) -> &'static [Tunable] {
        &[Tunable::Watermarks, Tunable::RequestThreshold, Tunable::SegmentSize, Tunable::NvmBuffer]
    }
    /// UHS buffers SSD blocks of 4 KiB, one slot each.
    fn default_geometry(&self) -> Geometry {
        Geometry { block_bytes: 4 * 1024, page_bytes: 4 * 1024, ..Geometry::default() }
    }
    fn validate_geometry(&self, geometry: &Geometry) -> Result<()> {
        let (b, p) = (geometry.block(), geometry.page());
        if p != b || !p.is_power_of_two() || !(4 * KIB..=64 * KIB).contains(&p) {
            return Err(Error::Geometry(format!(
                "a uhs buffer slot is one block: block and page size ({b}, {p}) must be equal, a power of two between 4 KiB and 64 KiB"
            )));
        }
        Ok(())
    }
    fn max_segments(&self) -> usize {
        UPAGE_MAX_CHUNKS
    }
    fn residue_store(&self, setup: &ResidueSetup<'_>) -> Result<Arc<dyn ResidueStore>> {
        let (layout, geometry, options) = (setup.layout, setup.geometry, setup.options);
        let fast =
            setup.fast.ok_or(Error::WrongDevices(DeviceProblem::Profile { profile: "uhs", rule: "needs an NVM device (--fast)" }))?;
        if options.segment_bytes < geometry.page() {
            return Err(Error::InvalidArgument(format!(
                "an NVM buffer segment of {} bytes holds no {}-byte slot",
                options.segment_bytes,
                geometry.page()
            )));
        }
        Ok(Arc::new(HashedSegments::new(
            Arc::clone(fast),
            layout.pages_offset,
            layout.page_count,
            geometry.page_bytes,
            options.segment_bytes,
        )))
    }
    fn policy(&self, options: &VolumeOptions) -> Box<dyn Policy> {
        Box::new(UhsPolicy { small_write: options.request_threshold.unwrap_or(DEFAULT_SMALL_WRITE), buffered: options.nvm_buffer })
    }
}

struct UhsPolicy {
    small_write: u64,
    /// `false`: UHS-NB.
    buffered: bool,
}

impl Policy for UhsPolicy {
    /// UHS Algorithm 1: a small write goes to the buffer whole; a large one sends its whole
    /// blocks to the SSD (the map edit invalidates what the buffer held for them) and its
    /// partial end blocks to the buffer. Without the buffer, partial blocks are rewritten.
    fn write_rules(&self, len: u64) -> Rules {
        let residue = match (self.buffered, len < self.small_write) {
            (false, _) => Residue::Forbidden,
            (true, true) => Residue::All,
            (true, false) => Residue::Partial,
        };
        Rules { residue, max_segments: UPAGE_MAX_CHUNKS }
    }

    /// UHS's light-load migration: once no write came for [`IDLE_BEFORE_DRAIN`], the
    /// buffer is drained.
    fn start_workers(&self, engine: &Arc<dyn EngineApi>) -> Result<Vec<JoinHandle<()>>> {
        let worker = Arc::clone(engine);
        Ok(vec![spawn("alignfs-uhs-drain".into(), move || drain_when_idle(worker.as_ref(), IDLE_BEFORE_DRAIN))?])
    }

    fn merge_commit_batch(&self) -> usize {
        32
    }

    /// UHS writes and migrates SSD blocks to their own addresses. Out of place, random
    /// small writes scattered the volume's blocks and free space, and a 1 MiB write after
    /// them went out as IOs of 9 KiB on average (docs/UHS.md).
    fn keeps_blocks_home(&self) -> bool {
        true
    }
}
