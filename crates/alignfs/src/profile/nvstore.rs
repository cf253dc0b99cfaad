//! `nvstore` — NVStore (TPDS'20): an object store on one SSD whose metadata is a KV store.
//! The aligned middle of a write goes to new SSD blocks; each unaligned piece is one
//! fragment put into the KV store, kept as the block's fragment page in DRAM; when the
//! device is idle, a background sync merges fragment pages into whole blocks and deletes
//! their fragments; so does a merger, at once, for fragment pages that appends
//! completed. Every SSD block carries a CRC32C verified on every read. Every
//! write is durable when it returns (docs/NVSTORE.md).

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use super::{
    drain_when_idle, DeviceKind, EngineApi, FullBlocks, Personality, Policy, Profile, ProfileSpec, Promise, ResidueSetup, Tunable,
};
use crate::background::{spawn, Wakeup};
use crate::error::{DeviceProblem, Error, Result};
use crate::geometry::{Geometry, KIB, UPAGE_MAX_CHUNKS};
use crate::meta::Inode;
use crate::options::VolumeOptions;
use crate::partition::{Plan, Residue, Rules};
use crate::residue::{KvFragments, ResidueStore};
use crate::stats::Counter;

impl Profile {
    pub const NVSTORE: Profile = Profile(4);
}

/// How long the volume must see no write before fragment pages are synced (NVStore's
/// lazy sync "when the system I/O is idle").
const IDLE_BEFORE_SYNC: Duration = Duration::from_millis(500);

/// How many completed fragment pages the merger waits for (1 MiB of 4 KiB blocks). Each
/// merge costs one flush of the SSD and a synced KV record per 32 blocks; on one disk,
/// the flushes slow the KV store's syncs. 8 writers of 2 KiB appends ran at 26-28 MiB/s
/// with runs of 256 against 21-24 with runs of 64, for the same device traffic. Fewer
/// wait for the idle sync.
const FULL_PAGES_PER_MERGE: usize = 256;

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
    fn devices(&self) -> DeviceKind {
        DeviceKind::SsdAndKvStore
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
        let log = setup
            .fragments
            .ok_or(Error::WrongDevices(DeviceProblem::Profile { profile: "nvstore", rule: "keeps its fragments in a KV store" }))?;
        let (memory, page) = (setup.options.scrap_mem_bytes, setup.geometry.page_bytes);
        Ok(Arc::new(KvFragments::new(Arc::clone(log), memory, page, setup.units_to_restore)?))
    }
    fn policy(&self, _options: &VolumeOptions) -> Box<dyn Policy> {
        Box::new(NvStorePolicy(Arc::default()))
    }
}

/// A fragment page that an append completed (an append fills a block in pieces) is
/// merged soon after, not when the device is next idle: beyond the paper's lazy sync, so
/// that its fragments are deleted while the KV store's memtable still holds them and
/// never reach its tables. Every other page waits for the idle sync, which is what
/// coalesces overwrites: an overwrite may come back to the same block.
#[derive(Default)]
struct CompletedPages {
    blocks: FullBlocks,
    due: Wakeup,
}

struct NvStorePolicy(Arc<CompletedPages>);

impl Policy for NvStorePolicy {
    /// Aligned blocks go to the SSD, unaligned pieces become fragments (never a read
    /// before a write). A block whose fragments no longer fit one page header is synced
    /// first.
    fn write_rules(&self, _len: u64) -> Rules {
        Rules { residue: Residue::Partial, max_segments: UPAGE_MAX_CHUNKS }
    }

    /// Queue the pages an append completed. The write is not committed yet, so the
    /// object's size is still the one before it.
    fn residue_stored(&self, _engine: &dyn EngineApi, inode: &Inode, plan: &Plan, full: &[u64]) {
        if full.is_empty() || plan.new_size <= inode.attr().size {
            return;
        }
        if self.0.blocks.push(inode.ino, full) >= FULL_PAGES_PER_MERGE {
            self.0.due.notify();
        }
    }

    /// The idle sync, and the merger of completed fragment pages (the engine's watermark
    /// merges bound the fragment pages' memory).
    fn start_workers(&self, engine: &Arc<dyn EngineApi>) -> Result<Vec<JoinHandle<()>>> {
        let worker = Arc::clone(engine);
        let sync = spawn("alignfs-nvstore-sync".into(), move || drain_when_idle(worker.as_ref(), IDLE_BEFORE_SYNC))?;
        let (worker, pages) = (Arc::clone(engine), Arc::clone(&self.0));
        let merger = spawn("alignfs-nvstore-merge".into(), move || {
            while !worker.shutting_down() {
                pages.due.wait(Duration::from_millis(100));
                if worker.shutting_down() {
                    break;
                }
                // Woken by the timeout with fewer queued: those wait for the idle sync.
                if pages.blocks.len() < FULL_PAGES_PER_MERGE {
                    continue;
                }
                if let Err(e) = pages.blocks.merge(worker.as_ref(), Counter::migrations_full) {
                    tracing::warn!("merging completed fragment pages: {e}");
                }
            }
        })?;
        Ok(vec![sync, merger])
    }

    fn wake_workers(&self) {
        self.0.due.notify();
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
