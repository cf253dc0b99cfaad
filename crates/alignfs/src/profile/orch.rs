//! `orch` — OrchFS (FAST'25): residue in pages and upages of a persistent fast tier, the
//! journal beside them; every write is durable when it returns.

use std::sync::Arc;

use super::{DeviceKind, Policy, Profile, ProfileSpec, Promise, ResidueSetup, Tunable};
use crate::error::{DeviceProblem, Error, Result};
use crate::geometry::{Geometry, KIB, UPAGE_MAX_CHUNKS};
use crate::journal::MAX_ENCODED_SEGMENTS;
use crate::options::VolumeOptions;
use crate::partition::{Residue, Rules};
use crate::residue::{PmemPages, ResidueStore};

impl Profile {
    pub const ORCH: Profile = Profile(1);
}

// Upage headers are journaled as they are: the format must hold every one.
const _: () = assert!(UPAGE_MAX_CHUNKS <= MAX_ENCODED_SEGMENTS);

pub(super) struct Orch;

impl ProfileSpec for Orch {
    fn profile(&self) -> Profile {
        Profile::ORCH
    }
    fn name(&self) -> &'static str {
        "orch"
    }
    fn summary(&self) -> &'static str {
        "OrchFS: residue in persistent-memory pages and upages (--fast), durable on every write"
    }
    fn devices(&self) -> DeviceKind {
        DeviceKind::FastTierAndSsd
    }
    fn promise(&self) -> Promise {
        Promise::OnWrite
    }
    fn tunables(&self) -> &'static [Tunable] {
        &[Tunable::Watermarks]
    }
    fn default_geometry(&self) -> Geometry {
        Geometry::default()
    }
    fn validate_geometry(&self, geometry: &Geometry) -> Result<()> {
        let p = geometry.page();
        if !p.is_power_of_two() || !(512..=64 * KIB).contains(&p) {
            return Err(Error::Geometry(format!("page size {p} must be a power of two between 512 B and 64 KiB")));
        }
        Ok(())
    }
    fn max_segments(&self) -> usize {
        UPAGE_MAX_CHUNKS
    }
    fn residue_store(&self, setup: &ResidueSetup<'_>) -> Result<Arc<dyn ResidueStore>> {
        let fast = setup.fast.ok_or(Error::WrongDevices(DeviceProblem::Profile { profile: "orch", rule: "needs a fast tier (--fast)" }))?;
        let layout = setup.layout;
        Ok(Arc::new(PmemPages::new(Arc::clone(fast), layout.pages_offset, layout.page_count, setup.geometry.page_bytes)))
    }
    fn policy(&self, _options: &VolumeOptions) -> Box<dyn Policy> {
        Box::new(OrchPolicy)
    }
}

/// Residue is persistent, so the journal records the live state and nothing waits for
/// fsync; the one background worker migrates past the watermark and checkpoints.
struct OrchPolicy;

impl Policy for OrchPolicy {
    fn write_rules(&self, _len: u64) -> Rules {
        Rules { residue: Residue::Partial, max_segments: UPAGE_MAX_CHUNKS }
    }

    /// With the journal in the fast tier a record is cheap, so a merge commits a few blocks
    /// at a time: writers then wait for the journal, and for these blocks, only as long as
    /// one small record takes.
    fn merge_commit_batch(&self) -> usize {
        32
    }
}
