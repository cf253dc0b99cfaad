//! Profiles: each seed design is one policy over the shared engine.
//!
//! A profile has two halves:
//! - a [`ProfileSpec`], static: its name and on-media code, the devices it takes, its
//!   geometry defaults and rules, its crash promise, the options it reads, and how to
//!   build its residue store and its runtime policy;
//! - a [`Policy`], built once when a volume opens: the hooks the data path calls instead
//!   of asking which profile it runs (write rules, what a commit journals, what fsync and
//!   close do, background workers, commit batching).
//!
//! Adding a profile is a new module here that implements both, plus its line in
//! [`REGISTRY`]. Nothing outside this module matches on a profile.

mod byte;
mod engine;
mod nvstore;
mod orch;
mod scrap;
mod superblock;
mod uhs;

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::device::mssd::MemorySemanticSsd;
use crate::device::ByteTier;
use crate::error::{DeviceProblem, Error, Result};
use crate::geometry::{Geometry, MetaLayout, MetaPlacement};
use crate::journal::{checkpoint_payload, AsIs};
use crate::kv::FragmentLog;
use crate::meta::{Freed, Inode, Op};
use crate::partition::{Plan, Rules};
use crate::residue::ResidueStore;
use crate::stats::Counter;

use crate::options::{MetaStoreChoice, VolumeOptions};
pub(crate) use engine::{EngineApi, FullBlocks};

/// Every profile this build implements, in the order `--help` lists them. The one line a
/// new profile adds.
const REGISTRY: &[&dyn ProfileSpec] = &[&orch::Orch, &scrap::Scrap, &uhs::Uhs, &nvstore::NvStore, &byte::Byte];

/// The named configuration a volume was formatted with: a registered profile's on-media
/// code. Only registered codes can be held, so [`Profile::spec`] always finds one.
pub use crate::layout::Profile;

impl std::fmt::Debug for Profile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl Profile {
    /// The profile with on-media code `code`, if this build has it.
    pub fn from_code(code: u32) -> Option<Profile> {
        REGISTRY.iter().map(|spec| spec.profile()).find(|p| p.0 == code)
    }

    pub(crate) fn spec(self) -> &'static dyn ProfileSpec {
        *REGISTRY.iter().find(|spec| spec.profile() == self).expect("a Profile holds only registered codes")
    }

    pub fn name(self) -> &'static str {
        self.spec().name()
    }

    /// Every profile this build implements.
    pub fn all() -> impl Iterator<Item = Profile> {
        REGISTRY.iter().map(|spec| spec.profile())
    }

    pub fn parse(name: &str) -> Result<Profile> {
        if let Some(profile) = Profile::all().find(|p| p.name() == name) {
            return Ok(profile);
        }
        let known = Profile::all().map(|p| format!("{:?}", p.name())).collect::<Vec<_>>().join(" or ");
        Err(Error::UnknownProfile(format!("unknown profile {name:?} (known: {known})")))
    }

    /// One line for `--help`: the seed design and where its residue lives.
    pub fn summary(self) -> &'static str {
        self.spec().summary()
    }

    /// The volume options this profile reads.
    pub fn tunables(self) -> &'static [Tunable] {
        self.spec().tunables()
    }

    /// Most segments (upage chunks, scrap segments) one residue unit's header holds.
    pub fn max_segments(self) -> usize {
        self.spec().max_segments()
    }

    /// The front end its volumes are made for.
    pub fn personality(self) -> Personality {
        self.spec().personality()
    }

    /// The devices a volume of this profile is made of.
    pub fn devices(self) -> DeviceKind {
        self.spec().devices()
    }

    /// What a crash keeps.
    pub fn promise(self) -> Promise {
        self.spec().promise()
    }

    pub fn default_geometry(self) -> Geometry {
        self.spec().default_geometry()
    }

    /// The rules every geometry obeys, then this profile's own.
    pub fn validate_geometry(self, geometry: &Geometry) -> Result<()> {
        self.spec().validate_geometry(geometry)?;
        geometry.validate()
    }

    /// How a volume of this profile formatted with `choice` keeps its metadata.
    pub fn metadata_store(self, choice: MetaStoreChoice) -> Result<MetaStore> {
        let kind = self.devices();
        match (kind, choice) {
            (DeviceKind::SsdAndKvStore, _) => Ok(MetaStore::Kv),
            (DeviceKind::MemorySemanticSsd, MetaStoreChoice::ProfileDefault | MetaStoreChoice::InPlace) => Ok(MetaStore::InPlaceLines),
            (_, MetaStoreChoice::ProfileDefault | MetaStoreChoice::Journal) => Ok(MetaStore::Journal),
            (_, MetaStoreChoice::InPlace) => Err(Error::WrongDevices(DeviceProblem::Profile {
                profile: self.name(),
                rule: "cannot keep metadata in place: that needs a memory-semantic SSD",
            })),
        }
    }

    /// Refuse a volume of this profile unless it is `wanted` (what the caller serves), with
    /// the command that serves it instead.
    pub fn check_served_by(self, wanted: Personality) -> Result<()> {
        let personality = self.personality();
        if personality == wanted {
            return Ok(());
        }
        Err(Error::WrongPersonality(format!(
            "the volume is {} ({} profile), not {}: serve it with `{}`",
            personality.noun(),
            self.name(),
            wanted.noun(),
            personality.served_by()
        )))
    }
}

/// The front end a profile's volumes are made for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Personality {
    /// Files and directories: the mount, the C API, the shim.
    Files,
    /// One fixed-size block volume ([`crate::personality::BlockVolume`]), served over NBD.
    Block,
    /// Named objects ([`crate::personality::ObjectStore`]), served over S3.
    Objects,
}

impl Personality {
    /// What such a volume is, with its article: "a file system".
    pub fn noun(self) -> &'static str {
        match self {
            Personality::Files => "a file system",
            Personality::Block => "a block volume",
            Personality::Objects => "an object store",
        }
    }

    /// The command that serves such a volume.
    pub fn served_by(self) -> &'static str {
        match self {
            Personality::Files => "alignfs mount",
            Personality::Block => "alignfs nbd",
            Personality::Objects => "alignfs s3",
        }
    }
}

/// The devices a profile's volume is made of, and so where its metadata lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceKind {
    /// A byte-addressable persistent tier (`--fast`) holding the residue, the journal and
    /// checkpoints, and one SSD (`orch`, `uhs`).
    FastTierAndSsd,
    /// Up to `max` SSDs; the metadata in an area at the start of the first (`scrap`).
    Ssds { max: u32 },
    /// One SSD; the metadata in a KV store in a directory of its own (`nvstore`).
    SsdAndKvStore,
    /// An emulated memory-semantic SSD (`byte`, docs/BYTE.md): a flash image (`--ssd`) and
    /// the device's DRAM (`--fast`), with a byte interface beside the block one; the
    /// metadata at the start of the device.
    MemorySemanticSsd,
}

impl DeviceKind {
    /// Most SSDs one volume may span.
    pub fn max_ssds(self) -> u32 {
        match self {
            DeviceKind::Ssds { max } => max,
            _ => 1,
        }
    }

    /// Whether the volume takes a `--fast` path: its fast tier, or its memory-semantic
    /// SSD's DRAM.
    pub fn names_fast(self) -> bool {
        matches!(self, DeviceKind::FastTierAndSsd | DeviceKind::MemorySemanticSsd)
    }

    /// What a volume of this kind is made of, for a refusal.
    pub fn describe(self) -> &'static str {
        match self {
            DeviceKind::FastTierAndSsd => "a fast tier (--fast) and an SSD",
            DeviceKind::Ssds { .. } => "SSDs alone (no --fast)",
            DeviceKind::SsdAndKvStore => "an SSD and a KV store directory (--kv)",
            DeviceKind::MemorySemanticSsd => "a memory-semantic SSD (its flash image --ssd, its DRAM --fast)",
        }
    }

    /// Where the metadata area is on these devices.
    pub fn meta_placement(self) -> MetaPlacement {
        match self {
            DeviceKind::FastTierAndSsd => MetaPlacement::FastTier,
            DeviceKind::Ssds { .. } => MetaPlacement::Ssd,
            DeviceKind::SsdAndKvStore => MetaPlacement::SuperblockOnly,
            DeviceKind::MemorySemanticSsd => MetaPlacement::MemorySemanticSsd,
        }
    }
}

/// Where a volume's metadata becomes durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetaStore {
    /// A redo journal and two checkpoint slots (crate::journal).
    Journal,
    /// ByteFS's in-place 64-byte lines, one device transaction per commit (crate::lines).
    InPlaceLines,
    /// Records in a KV store (crate::kv).
    Kv,
}

/// What a crash (of the process, or power) keeps of acknowledged work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Promise {
    /// Every write is durable when it returns (`orch`).
    OnWrite,
    /// Writes are durable after fsync (or close, unmount); a crash may lose writes since
    /// the last sync, each byte then reading as its synced value, a value written since,
    /// or zero — never other data (`scrap`, like a page cache).
    OnSync,
}

/// A volume option a profile reads; the CLI refuses the ones a volume's profile ignores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tunable {
    /// `--migrate-high` / `--migrate-low`: the residue store's watermarks.
    Watermarks,
    /// `--scrap-mem`: the most memory the residue store may take.
    ResidueMemory,
    /// `--request-threshold`: writes below it go to the residue store whole.
    RequestThreshold,
    /// `--flush-workers`: threads writing residue back.
    FlushWorkers,
    /// `--commit-interval`: how long namespace ops may wait for a sync.
    CommitInterval,
    /// `--segment-size`: bytes of one NVM buffer segment.
    SegmentSize,
    /// `--no-nvm-buffer`: run without the residue store (UHS-NB).
    NvmBuffer,
    /// `--no-byte-interface`: use the memory-semantic SSD's block interface alone.
    ByteInterface,
    /// `--device-latency`: model the memory-semantic SSD's latencies and bandwidths.
    DeviceLatency,
    /// `--clean-cache`: DRAM for copies of SSD blocks (clean pages).
    CleanCache,
}

/// The static half of a profile.
pub(crate) trait ProfileSpec: Sync {
    fn profile(&self) -> Profile;
    /// The name on the command line and in `alignfs stat`.
    fn name(&self) -> &'static str;
    /// One line for `--help`: the seed design and where its residue lives.
    fn summary(&self) -> &'static str;
    fn personality(&self) -> Personality {
        Personality::Files
    }
    fn devices(&self) -> DeviceKind;
    fn promise(&self) -> Promise;
    /// The options this profile reads.
    fn tunables(&self) -> &'static [Tunable];
    fn default_geometry(&self) -> Geometry;
    /// The profile's own rules on top of [`Geometry::validate`]'s common ones.
    fn validate_geometry(&self, geometry: &Geometry) -> Result<()>;
    /// Most segments one residue unit's header holds.
    fn max_segments(&self) -> usize;
    /// The residue store of an opening volume.
    fn residue_store(&self, setup: &ResidueSetup<'_>) -> Result<Arc<dyn ResidueStore>>;
    /// The runtime policy of an opening volume.
    fn policy(&self, options: &VolumeOptions) -> Box<dyn Policy>;
}

/// What an opening volume offers its residue store.
pub(crate) struct ResidueSetup<'a> {
    /// The fast tier, when the profile takes one.
    pub fast: Option<&'a Arc<dyn ByteTier>>,
    /// Where the fast tier's page zone is.
    pub layout: &'a MetaLayout,
    pub geometry: &'a Geometry,
    pub options: &'a VolumeOptions,
    /// The memory-semantic SSD, when the profile takes one.
    pub byte: Option<&'a Arc<MemorySemanticSsd>>,
    /// The KV store's fragment records, when the metadata lives in one.
    pub fragments: Option<&'a Arc<FragmentLog>>,
    /// Units the volume will restore residue into at open (the KV store's fragment
    /// pages), numbered from 0.
    pub units_to_restore: u64,
}

/// What a commit journals when it is not its ops as they are: their crash projection,
/// and state the policy keeps once they applied.
pub(crate) struct Projection {
    pub journal: Vec<Op>,
    pub sizes: Vec<(crate::meta::Ino, u64)>,
}

/// The runtime half of a profile: the data path's questions, answered once per profile.
/// Hooks receive the engine they run in, through its narrow [`EngineApi`] interface.
pub(crate) trait Policy: Send + Sync {
    /// Partition rules for a write of `len` bytes.
    fn write_rules(&self, len: u64) -> Rules;

    /// What the journal records for `ops` (under the commit lock, before they apply):
    /// `None` to journal them as they are (a persistent residue store: the live state is
    /// what a crash keeps).
    fn project(&self, _engine: &dyn EngineApi, _ops: &[Op]) -> Option<Projection> {
        None
    }

    /// After a projected commit applied.
    fn committed(&self, _engine: &dyn EngineApi, _projection: Projection, _freed: &Freed) {}

    /// A checkpoint's payload: the state as a crash would keep it (by default the live
    /// state, as it is).
    fn checkpoint_payload(&self, engine: &dyn EngineApi) -> Vec<u8> {
        checkpoint_payload(engine.meta(), &engine.counters(), &AsIs)
    }

    /// A write stored residue for `plan`'s blocks of `inode`; `full` names the blocks one
    /// of whose units the write filled to its end.
    fn residue_stored(&self, _engine: &dyn EngineApi, _inode: &Inode, _plan: &Plan, _full: &[u64]) {}

    /// fsync of a regular file, beyond retrying a failed SSD flush. The volume is
    /// writable.
    fn fsync(&self, _engine: &dyn EngineApi, _inode: &Arc<Inode>) -> Result<()> {
        Ok(())
    }

    /// A clean close, before the final SSD flush and checkpoint.
    fn before_close(&self, _engine: &dyn EngineApi) -> Result<()> {
        Ok(())
    }

    /// Start the profile's own background threads (a writable volume with background work
    /// on), beside the engine's maintenance thread (watermark merges, checkpoints).
    fn start_workers(&self, _engine: &Arc<dyn EngineApi>) -> Result<Vec<JoinHandle<()>>> {
        Ok(Vec::new())
    }

    /// Wake the profile's workers (shutdown, or work queued).
    fn wake_workers(&self) {}

    /// Whether a read that fetched a block under partial residue keeps the merged page as
    /// the block's residue (NVStore's FP → DP: the sync then needs no device read).
    fn keep_merged_on_read(&self) -> bool {
        false
    }

    /// For blocks a page cache writes back whole: the share of their 64-byte lines at or
    /// below which only the changed lines are written, each run a small write (ByteFS's
    /// write-back by modified ratio), the change found against the block as the volume
    /// holds it. `None`: such blocks are written whole, as any write.
    fn write_back_line_share(&self) -> Option<f64> {
        None
    }

    /// Whether each logical block of a file keeps one SSD block, at its home (the block
    /// its number names) where that was free when first written, and every later write
    /// and merge rewrites it in place: a block volume laid out like the disk it stands
    /// for (UHS addresses its SSD zone directly), so a large write stays one IO after any
    /// history of small ones. A write in flight at a crash may then land in part, which a
    /// disk allows. `false`: blocks move on every rewrite (out of place), except where
    /// writes are durable only on sync.
    fn keeps_blocks_home(&self) -> bool {
        false
    }

    /// Whether the volume keeps copies of SSD blocks in DRAM, which reads and merges hit
    /// instead of the device (NVStore's clean pages; the host's cache of a device that
    /// has no kernel cache in front of it).
    fn keeps_clean_pages(&self) -> bool {
        false
    }

    /// Whether an unaligned write to a block with a clean page fills the write's residue
    /// page from the copy, so that the page is whole (NVStore's CP → DP).
    fn dirties_clean_pages(&self) -> bool {
        false
    }

    /// Blocks a background merge commits per journal record.
    fn merge_commit_batch(&self) -> usize;

    /// Ops a merge of `files`' blocks commits beside their new map entries.
    fn merge_ops(&self, _files: &[&Arc<Inode>], _ops: &mut Vec<Op>) {}
}

/// Drain the residue store whenever no write came for `idle` (UHS's "under light load",
/// NVStore's lazy sync when the device is idle).
fn drain_when_idle(engine: &dyn EngineApi, idle: Duration) {
    let mut writes = engine.writes_so_far();
    let mut quiet_since = Instant::now();
    while !engine.shutting_down() {
        std::thread::sleep(idle / 4);
        let now = engine.writes_so_far();
        if now != writes {
            (writes, quiet_since) = (now, Instant::now());
        } else if quiet_since.elapsed() >= idle {
            if let Err(e) = engine.drain_residue(Counter::migrations_idle) {
                tracing::warn!("idle migration: {e}");
            }
            quiet_since = Instant::now();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_codes_and_names_are_unique() {
        let all: Vec<Profile> = Profile::all().collect();
        for (i, a) in all.iter().enumerate() {
            for b in &all[i + 1..] {
                assert_ne!(a.code(), b.code());
                assert_ne!(a.name(), b.name());
            }
            assert_eq!(Profile::parse(a.name()).unwrap(), *a);
            assert_eq!(Profile::from_code(a.code()), Some(*a));
            a.validate_geometry(&a.default_geometry()).unwrap();
        }
        assert!(Profile::from_code(0).is_none());
        // Each profile's own rules, beyond the common ones.
        let scrap = Profile::SCRAP.default_geometry();
        assert!(Profile::SCRAP.validate_geometry(&Geometry::default()).is_err(), "a scrap page is one block");
        assert!(Profile::ORCH.validate_geometry(&scrap).is_err(), "fast pages are at most 64 KiB");
        assert!(Profile::ORCH.validate_geometry(&Geometry { page_bytes: 3000, ..Geometry::default() }).is_err());
        assert!(matches!(Profile::parse("ext4"), Err(Error::UnknownProfile(m)) if m.contains("unknown")));
    }
}
