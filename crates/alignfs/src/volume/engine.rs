//! The engine of an open volume: its owned parts and the state they share. Each part
//! keeps its own state and methods in its own module:
//!
//! | part | module | what it owns |
//! | --- | --- | --- |
//! | [`BlockStore`] | `block_store` | the SSDs, block allocation and placement, checksums, copies, IO, flushes |
//! | [`Committer`] | `committer` | the metadata store, commit ordering and group sync, scratch files |
//! | [`Migrator`] | `migrate` | merges of residue into blocks, the maintenance thread |
//! | residue tier | [`crate::residue`] | the profile's [`ResidueStore`] |
//!
//! The data path (`write`, `read`, `resize`, `clone`, `namespace`) is functions over an
//! `&Engine`; the profile's [`Policy`] reaches the engine only through
//! [`crate::profile::EngineApi`], implemented here.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use super::block_store::BlockStore;
use super::committer::{CommitEnv, Committer};
use super::migrator::Migrator;
use crate::device::mssd::MemorySemanticSsd;
use crate::device::ByteTier;
use crate::error::{Error, Result};
use crate::geometry::Geometry;
use crate::layout::Superblock;
use crate::map::{PageNo, SsdBlock};
use crate::meta::{FileKind, Freed, Ino, Inode, MetaState, Op};
use crate::options::VolumeOptions;
use crate::profile::{EngineApi, Policy, Promise};
use crate::residue::ResidueStore;
use crate::stats::{Counter, RecoveryReport, Stats};

pub(crate) struct Engine {
    pub(super) superblock: Superblock,
    pub(crate) geometry: Geometry,
    pub(super) options: VolumeOptions,
    pub(crate) meta: MetaState,
    pub(super) stats: Arc<Stats>,
    /// The profile's answers to the data path's questions.
    pub(super) policy: Box<dyn Policy>,
    pub(super) blocks: BlockStore,
    pub(super) committer: Committer,
    pub(super) migrator: Migrator,
    pub(super) residue: Arc<dyn ResidueStore>,
    /// The fast tier, where the volume has one (for its report).
    pub(super) fast: Option<Arc<dyn ByteTier>>,
    /// The memory-semantic SSD, where the volume is on one: its counters, and its firmware,
    /// which runs in this process and stops with the volume.
    pub(super) device: Option<Arc<MemorySemanticSsd>>,
    /// Serializes namespace changes that read before they commit.
    pub(super) namespace: Mutex<()>,
    shutdown: AtomicBool,
    pub(super) recovery: RecoveryReport,
}

/// What an engine is assembled from at open.
pub(super) struct EngineParts {
    pub superblock: Superblock,
    pub options: VolumeOptions,
    pub meta: MetaState,
    pub stats: Arc<Stats>,
    pub policy: Box<dyn Policy>,
    pub blocks: BlockStore,
    pub committer: Committer,
    pub residue: Arc<dyn ResidueStore>,
    pub fast: Option<Arc<dyn ByteTier>>,
    pub device: Option<Arc<MemorySemanticSsd>>,
    pub recovery: RecoveryReport,
}

impl Engine {
    pub(super) fn new(parts: EngineParts) -> Engine {
        let EngineParts { superblock, options, meta, stats, policy, blocks, committer, residue, fast, device, recovery } = parts;
        Engine {
            geometry: superblock.geometry,
            superblock,
            options,
            meta,
            stats,
            policy,
            blocks,
            committer,
            migrator: Migrator::default(),
            residue,
            fast,
            device,
            namespace: Mutex::new(()),
            shutdown: AtomicBool::new(false),
            recovery,
        }
    }

    pub(crate) fn check_writable(&self) -> Result<()> {
        if self.options.read_only {
            return Err(Error::ReadOnly);
        }
        Ok(())
    }

    pub(crate) fn get(&self, ino: Ino) -> Result<Arc<Inode>> {
        self.meta.get(ino).ok_or(Error::NotFound)
    }

    pub(crate) fn file(&self, ino: Ino) -> Result<Arc<Inode>> {
        let inode = self.get(ino)?;
        match inode.kind {
            FileKind::File => Ok(inode),
            FileKind::Dir => Err(Error::IsDir),
            _ => Err(Error::NotAFile),
        }
    }

    /// Whether the profile sends a write of `len` bytes whole to its residue tier, so
    /// that it takes no SSD IO unless the tier is full (a scheduling hint).
    pub(crate) fn write_goes_to_residue(&self, len: u64) -> bool {
        self.policy.write_rules(len).residue == crate::partition::Residue::All
    }

    /// Whether the profile makes every write durable before it returns.
    pub(crate) fn durable_when_written(&self) -> bool {
        self.superblock.profile.promise() == Promise::OnWrite
    }

    /// Whether an fsync returns without touching the SSD: the profile makes every write
    /// durable before it returns, and no earlier SSD flush failed (which an fsync retries).
    pub(crate) fn fsync_is_free(&self) -> bool {
        self.durable_when_written() && !self.blocks.flush_failed()
    }

    /// Make `ops` durable as one unit in the metadata store and apply them ([`Committer`]).
    /// Returns the units they released, which the caller frees with
    /// [`Engine::release_freed`].
    pub(crate) fn commit(&self, ops: &[Op]) -> Result<Freed> {
        self.check_writable()?;
        self.committer.commit(&self.commit_env(), ops)
    }

    /// What the committer borrows for a commit or a checkpoint.
    fn commit_env(&self) -> CommitEnv<'_> {
        CommitEnv {
            api: self as &dyn EngineApi,
            policy: self.policy.as_ref(),
            meta: &self.meta,
            stats: &self.stats,
            checksums: self.blocks.checksums(),
            #[cfg(debug_assertions)]
            geometry: self.geometry,
            migrator: &self.migrator,
        }
    }

    /// Return units to their allocators.
    pub(super) fn release(&self, pages: &[PageNo], blocks: &[SsdBlock]) {
        if !pages.is_empty() {
            self.residue.free(pages);
        }
        self.blocks.release(blocks);
    }

    /// Free what a commit released; removed inodes' units wait until no reader or writer
    /// of that inode is left.
    pub(crate) fn release_freed(&self, freed: Freed) {
        for inode in &freed.removed {
            drop(inode.range.write(0, u64::MAX));
        }
        if freed.promises > 0 {
            self.blocks.refs.release_promises(freed.promises);
        }
        self.release(&freed.pages, &freed.blocks);
    }

    /// Make the namespace ops the metadata store holds back durable (`scrap`: at fsync
    /// and the commit interval).
    pub(super) fn sync_deferred(&self) -> Result<()> {
        if self.options.read_only {
            return Ok(());
        }
        self.committer.sync_deferred(&self.commit_env())
    }

    /// Write a checkpoint now (the metadata store's log restarts empty).
    pub(super) fn checkpoint(&self) -> Result<()> {
        self.check_writable()?;
        self.committer.checkpoint(&self.commit_env())
    }

    /// Every counter's value, in [`Counter::ALL`] order.
    pub(crate) fn counters(&self) -> Vec<u64> {
        self.stats.all()
    }

    /// Whether the volume is closing: background workers stop.
    pub(crate) fn shutting_down(&self) -> bool {
        self.shutdown.load(Ordering::SeqCst)
    }

    /// Tell the workers to stop.
    pub(super) fn begin_shutdown(&self) {
        self.shutdown.store(true, Ordering::SeqCst);
        self.migrator.wake();
        self.policy.wake_workers();
    }

    /// Writes the volume's callers made since it opened: unchanged means idle.
    pub(crate) fn writes_so_far(&self) -> u64 {
        self.stats.get(Counter::app_writes)
    }
}
