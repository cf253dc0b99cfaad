//! The committer: where metadata becomes durable. It owns the volume's metadata store
//! (journal, in-place lines or KV store) behind the commit lock, orders commits, lets
//! them share syncs (group commit), and knows the scratch directory whose files a crash
//! may lose.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

use parking_lot::Mutex;

use super::migrator::Migrator;
use crate::error::{Error, Result};
#[cfg(debug_assertions)]
use crate::geometry::Geometry;
use crate::journal::{CommitContext, MetaStore, MetaUsage};
use crate::layout::BlockChecksums;
use crate::meta::{apply, DataOp, FileKind, Freed, Ino, MetaState, NamespaceOp, Op};
use crate::profile::{EngineApi, Policy};
use crate::stats::{Counter, Stats};

/// What a commit borrows from the engine it runs in.
pub(super) struct CommitEnv<'a> {
    /// The engine, as the profile's commit hooks see it.
    pub api: &'a dyn EngineApi,
    pub policy: &'a dyn Policy,
    pub meta: &'a MetaState,
    pub stats: &'a Stats,
    pub checksums: Option<&'a BlockChecksums>,
    /// For the debug checks of what a commit writes.
    #[cfg(debug_assertions)]
    pub geometry: Geometry,
    /// Woken when the store wants a checkpoint.
    pub migrator: &'a Migrator,
}

pub(crate) struct Committer {
    /// The commit lock and the store it guards.
    store: Mutex<Box<dyn MetaStore>>,
    /// Commits that want the commit lock or hold it: a group sync about to start lets
    /// them in first. The lock's own state is not enough: between one holder and the
    /// next it reads free, and syncs that started then covered 2.3 commits each with 8
    /// writers, against 3.5 counting these.
    committing: AtomicUsize,
    /// The directory whose files a crash may lose whole ([`Committer::set_scratch_dir`]).
    scratch_dir: OnceLock<Ino>,
    /// Whether the store holds namespace ops back: otherwise an fsync and the maintenance
    /// thread have nothing to ask it, and do not wait for the commit lock.
    store_defers: bool,
}

impl Committer {
    pub(super) fn new(store: Box<dyn MetaStore>) -> Committer {
        let store_defers = store.defers();
        Committer { store: Mutex::new(store), committing: AtomicUsize::new(0), scratch_dir: OnceLock::new(), store_defers }
    }

    /// Make `ops` durable as one unit in the metadata store and apply them. Returns the
    /// units they released, which the caller frees (after waiting out users of removed
    /// inodes). The profile may persist less than `ops`: what a crash would keep of them,
    /// and nothing at all when that is nothing.
    pub(super) fn commit(&self, engine: &CommitEnv<'_>, ops: &[Op]) -> Result<Freed> {
        let committing = Committing::enter(&self.committing);
        let mut store = self.store.lock();
        for op in ops {
            if let Op::Data(DataOp::Map { ino, .. })
            | Op::Data(DataOp::Extend { ino, .. })
            | Op::Data(DataOp::SetSize { ino, .. })
            | Op::Namespace(NamespaceOp::SetAttr { ino, .. })
            | Op::Namespace(NamespaceOp::SetXattr { ino, .. }) = op
            {
                if engine.meta.get(*ino).is_none() {
                    return Err(Error::NotFound);
                }
            }
        }
        let scratch_only = self.scratch_only(engine, ops);
        let projection = engine.policy.project(engine.api, ops);
        let journaled = projection.as_ref().map_or(ops, |p| p.journal.as_slice());
        let mut apply_all = || {
            let mut freed = Freed::default();
            for op in ops {
                let released = apply(engine.meta, op).unwrap_or_else(|e| panic!("validated op failed to apply: {} ({op:?})", e.0));
                freed.extend(released);
            }
            freed
        };
        let freed = with_commit_context(engine, |cx| store.commit(cx, journaled, &mut apply_all))?;
        if let Some(projection) = projection {
            engine.policy.committed(engine.api, projection, &freed);
        }
        self.track_scratch(engine, ops);
        if store.wants_checkpoint() {
            engine.migrator.wake();
        }
        // A commit that changes only scratch files is ordered in the store but not synced
        // on its own: the next synced commit covers it.
        let group = store.group_sync().filter(|_| !scratch_only).map(|group| {
            let ticket = group.ordered();
            (group, ticket)
        });
        drop(store);
        drop(committing);
        // Group commit: durable before returning, so that what the commit freed is reused
        // only once no crash can bring back the state that used it.
        if let Some((group, ticket)) = group {
            if group.sync_through(ticket, &|| self.committing.load(Ordering::SeqCst) > 0)? {
                engine.stats.add(Counter::kv_syncs, 1);
            }
        }
        Ok(freed)
    }

    /// Whether every op changes only scratch files (or the scratch directory's entries
    /// for them). Decided before the ops apply; false whenever in doubt.
    fn scratch_only(&self, engine: &CommitEnv<'_>, ops: &[Op]) -> bool {
        let Some(&dir) = self.scratch_dir.get() else { return false };
        let scratch = |ino: &Ino| engine.meta.get(*ino).is_some_and(|inode| inode.scratch.load(Ordering::SeqCst));
        !ops.is_empty()
            && ops.iter().all(|op| match op {
                Op::Namespace(NamespaceOp::Create { parent, attr, .. }) => *parent == dir && attr.kind == FileKind::File,
                Op::Namespace(NamespaceOp::Unlink { parent, name, .. }) => {
                    *parent == dir && engine.meta.child(dir, name).is_some_and(|i| scratch(&i))
                }
                Op::Namespace(NamespaceOp::Free { ino })
                | Op::Namespace(NamespaceOp::SetAttr { ino, .. })
                | Op::Namespace(NamespaceOp::SetXattr { ino, .. })
                | Op::Data(DataOp::Map { ino, .. })
                | Op::Data(DataOp::Extend { ino, .. })
                | Op::Data(DataOp::SetSize { ino, .. }) => scratch(ino),
                Op::Namespace(NamespaceOp::Link { .. }) | Op::Namespace(NamespaceOp::Rename { .. }) => false,
            })
    }

    /// After `ops` applied: a file created in the scratch directory is scratch; one that
    /// gains a name elsewhere is not any more.
    fn track_scratch(&self, engine: &CommitEnv<'_>, ops: &[Op]) {
        let Some(&dir) = self.scratch_dir.get() else { return };
        let set = |ino: Ino, scratch: bool| {
            if let Some(inode) = engine.meta.get(ino) {
                inode.scratch.store(scratch, Ordering::SeqCst);
            }
        };
        for op in ops {
            match op {
                Op::Namespace(NamespaceOp::Create { parent, attr, .. }) if *parent == dir => set(attr.ino, true),
                Op::Namespace(NamespaceOp::Link { ino, .. }) => set(*ino, false),
                Op::Namespace(NamespaceOp::Rename { from_parent, from_name, to_parent, to_name, .. })
                    if *from_parent == dir || *to_parent == dir =>
                {
                    // Both names, whatever moved where (an exchange swaps them).
                    for ino in [engine.meta.child(*from_parent, from_name), engine.meta.child(*to_parent, to_name)].into_iter().flatten() {
                        set(ino, false);
                    }
                }
                _ => {}
            }
        }
    }

    /// Write a checkpoint now (the store's log restarts empty).
    pub(super) fn checkpoint(&self, engine: &CommitEnv<'_>) -> Result<()> {
        let mut store = self.store.lock();
        with_commit_context(engine, |cx| store.checkpoint(cx))
    }

    /// Make durable the namespace ops the store holds back: an fsync's promise, and the
    /// commit interval's.
    pub(super) fn sync_deferred(&self, engine: &CommitEnv<'_>) -> Result<()> {
        if !self.store_defers {
            return Ok(());
        }
        let mut store = self.store.lock();
        with_commit_context(engine, |cx| store.sync_deferred(cx))
    }

    /// Since when the oldest namespace op held back has waited.
    pub(super) fn deferred_since(&self) -> Option<std::time::Instant> {
        if !self.store_defers {
            return None;
        }
        self.store.lock().deferred_since()
    }

    /// Whether the store's log is half full: the maintenance thread checkpoints.
    pub(super) fn wants_checkpoint(&self) -> bool {
        self.store.lock().wants_checkpoint()
    }

    pub(super) fn usage(&self) -> MetaUsage {
        self.store.lock().usage()
    }

    /// What a volume's report calls the store.
    pub(super) fn store_name(&self) -> &'static str {
        self.store.lock().name()
    }

    /// Make `dir` the scratch directory (once per open).
    pub(super) fn set_scratch_dir(&self, dir: Ino) -> Result<()> {
        self.scratch_dir.set(dir).map_err(|_| Error::InvalidArgument("the scratch directory is set already".into()))
    }

    /// Commits waiting for or holding the commit lock.
    #[cfg(test)]
    pub(super) fn committing(&self) -> usize {
        self.committing.load(Ordering::SeqCst)
    }
}

/// Run `f` with what the metadata store borrows from the engine.
fn with_commit_context<R>(engine: &CommitEnv<'_>, f: impl FnOnce(&CommitContext<'_>) -> R) -> R {
    let payload = || engine.policy.checkpoint_payload(engine.api);
    f(&CommitContext {
        stats: engine.stats,
        meta: engine.meta,
        checkpoint_payload: &payload,
        checksums: engine.checksums,
        #[cfg(debug_assertions)]
        pages_per_block: engine.geometry.pages_per_block(),
        #[cfg(debug_assertions)]
        page_bytes: engine.geometry.page_bytes,
    })
}

/// Counts a commit in [`Committer::committing`] from before it asks for the commit lock until
/// it has been ordered, whichever way it leaves.
struct Committing<'a>(&'a AtomicUsize);

impl<'a> Committing<'a> {
    fn enter(count: &'a AtomicUsize) -> Committing<'a> {
        count.fetch_add(1, Ordering::SeqCst);
        Committing(count)
    }
}

impl Drop for Committing<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}
