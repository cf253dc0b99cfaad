//! `nvstore` — NVStore (TPDS'20): an object store on one SSD whose metadata is a KV store.
//! The aligned middle of a write goes to new SSD blocks; each unaligned piece is one
//! fragment put into the KV store, kept as the block's fragment page in DRAM; when the
//! device is idle, a background sync merges fragment pages into whole blocks and deletes
//! their fragments. Every SSD block carries a CRC32C verified on every read. Every write
//! is durable when it returns (docs/NVSTORE.md).

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use super::{drain_when_idle, spawn, DeviceNeeds, Personality, Policy, Profile, ProfileSpec, Promise, ResidueSetup, Tunable};
use crate::error::{Error, Result};
use crate::geometry::{Geometry, KIB, UPAGE_MAX_CHUNKS};
use crate::partition::{Residue, Rules};
use crate::residue::{KvFragments, ResidueStore};
use crate::volume::{Inner, VolumeOptions};

impl Profile {
    pub const NVSTORE: Profile = Profile(4);
}

/// How long the volume must see no write before fragment pages are synced (NVStore's
/// lazy sync "when the system I/O is idle").
const IDLE_BEFORE_SYNC: Duration = Duration::from_millis(500);

pub(super) struct NvStore;

impl ProfileSpec for NvStore {
    fn profile(&self) -> Profile {
        Profile::NVSTORE
    }
    fn name(&self) -> &'static str {
        "nvstore"
    }
    fn summary(&self) -> &'static str {
        "NVStore: an object store on one SSD; unaligned pieces are fragments in a KV store (--kv), durable on every write"
    }
    fn personality(&self) -> Personality {
        Personality::Objects
    }
    fn devices(&self) -> DeviceNeeds {
        DeviceNeeds { fast_tier: false, max_ssds: 1, kv_store: true, memory_semantic: false }
    }
    fn promise(&self) -> Promise {
        Promise::OnWrite
    }
    fn tunables(&self) -> &'static [Tunable] {
        &[Tunable::Watermarks, Tunable::ResidueMemory, Tunable::CleanCache]
    }
    /// NVStore's pages are its blocks, 4 KiB.
    fn default_geometry(&self) -> Geometry {
        Geometry { block_bytes: 4 * 1024, page_bytes: 4 * 1024, ..Geometry::default() }
    }
    fn validate_geometry(&self, geometry: &Geometry) -> Result<()> {
        let (b, p) = (geometry.block(), geometry.page());
        if p != b || !(b == 4 * KIB || b == 8 * KIB) {
            return Err(Error::Geometry(format!(
                "an nvstore fragment page is one block: block and page size ({b}, {p}) must be equal, 4 KiB or 8 KiB"
            )));
        }
        Ok(())
    }
    fn max_segments(&self) -> usize {
        UPAGE_MAX_CHUNKS
    }
    fn residue_store(&self, setup: &ResidueSetup<'_>) -> Result<Arc<dyn ResidueStore>> {
        let log = setup.fragments.ok_or_else(|| Error::WrongDevices("profile nvstore keeps its fragments in a KV store".into()))?;
        let (memory, page) = (setup.options.scrap_mem_bytes, setup.geometry.page_bytes);
        Ok(Arc::new(KvFragments::new(Arc::clone(log), memory, page, setup.units_to_restore)?))
    }
    fn policy(&self, _options: &VolumeOptions) -> Box<dyn Policy> {
        Box::new(NvStorePolicy)
    }
}

struct NvStorePolicy;

impl Policy for NvStorePolicy {
    /// Aligned blocks go to the SSD, unaligned pieces become fragments (never a read
    /// before a write). A block whose fragments no longer fit one page header is synced
    /// first.
    fn write_rules(&self, _len: u64) -> Rules {
        Rules { residue: Residue::Partial, max_segments: UPAGE_MAX_CHUNKS }
    }

    /// Watermark syncs (the fragment pages' memory) and the idle sync.
    fn start_workers(&self, engine: &Arc<Inner>) -> Result<Vec<JoinHandle<()>>> {
        let worker = Arc::clone(engine);
        let sync = spawn("alignfs-nvstore-sync".into(), move || drain_when_idle(&worker, IDLE_BEFORE_SYNC))?;
        Ok(vec![engine.start_maintenance()?, sync])
    }

    /// Table 2: a read that hits a fragment page merges it with the device block (FP → DP).
    fn keep_merged_on_read(&self) -> bool {
        true
    }

    /// Table 2's clean pages: aligned writes, reads and syncs make them; an unaligned
    /// write to one makes a dirty page (CP → DP) with no device read.
    fn keeps_clean_pages(&self) -> bool {
        true
    }

    fn dirties_clean_pages(&self) -> bool {
        true
    }

    fn merge_commit_batch(&self) -> usize {
        32
    }
}
