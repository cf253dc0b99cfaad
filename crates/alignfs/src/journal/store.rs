//! The metadata-store seam: where a commit's ops become durable.
//!
//! The engine commits every metadata change as a list of ops under its commit lock and
//! hands them to the volume's [`MetaStore`], which decides when they apply relative to
//! their persistence. [`JournalStore`] (`orch`, `scrap`, `uhs`) appends a redo record
//! first and applies after, and keeps the journal short with checkpoints; a KV metadata
//! store (`nvstore`, docs/NVSTORE.md) writes the records of the keys the ops touched.

use std::sync::Arc;

use super::{encode_ops, CheckpointSlots, Journal};
use crate::error::{Error, Result};
use crate::meta::{Freed, MetaState, Op};
use crate::stats::{Counter, Stats};

/// What the engine lends a commit or a checkpoint.
pub(crate) struct CommitContext<'a> {
    pub stats: &'a Stats,
    /// The state the ops apply to.
    pub meta: &'a MetaState,
    /// The state a checkpoint records, as the profile says a crash keeps it.
    pub checkpoint_payload: &'a dyn Fn() -> Vec<u8>,
    /// The SSD blocks' checksums, where the profile keeps them.
    pub checksums: Option<&'a crate::layout::BlockChecksums>,
    /// Debug builds check that a journal record decodes to the ops it holds.
    #[cfg(debug_assertions)]
    pub pages_per_block: usize,
    #[cfg(debug_assertions)]
    pub page_bytes: u32,
}

/// Space the metadata takes, for `alignfs stat`.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct MetaUsage {
    pub log_used_bytes: u64,
    pub log_capacity_bytes: u64,
    pub checkpoint_generation: u64,
    pub checkpoint_used_bytes: u64,
    pub checkpoint_capacity_bytes: u64,
}

pub(crate) trait MetaStore: Send {
    /// Make `ops` durable as one atomic unit and apply them by calling `apply` exactly
    /// once; returns what the ops released. An empty `ops` (a commit the profile's crash
    /// projection reduced to nothing) still applies.
    fn commit(&mut self, cx: &CommitContext<'_>, ops: &[Op], apply: &mut dyn FnMut() -> Freed) -> Result<Freed>;
    /// Whether the background should call [`MetaStore::checkpoint`] soon.
    fn wants_checkpoint(&self) -> bool;
    /// Fold what was committed so far into the store's compact form.
    fn checkpoint(&mut self, cx: &CommitContext<'_>) -> Result<()>;
    fn usage(&self) -> MetaUsage;
    /// What a volume's report calls the store: "journal", "in place", "KV store".
    fn name(&self) -> &'static str;
    /// Where commits are ordered under the commit lock but made durable after it
    /// (group commit): the engine then waits with [`GroupSync::sync_through`] before a
    /// commit returns. `None`: [`MetaStore::commit`] is durable when it returns.
    fn group_sync(&self) -> Option<Arc<dyn GroupSync>> {
        None
    }
}

/// Shares one sync between the commits that were ordered while another sync ran.
pub(crate) trait GroupSync: Send + Sync {
    /// How many commits are ordered so far: a commit's ticket, read under the commit lock.
    fn ordered(&self) -> u64;
    /// Return once the commits up to `ticket` are durable; `true` if this call ran the
    /// sync. `commits_waiting` says whether another commit is being ordered right now; a
    /// sync about to start lets it in first, so that it covers that one too.
    fn sync_through(&self, ticket: u64, commits_waiting: &dyn Fn() -> bool) -> Result<bool>;
}

/// A redo journal plus A/B checkpoints, each on a [`super::MetaMedium`].
pub(crate) struct JournalStore {
    journal: Journal,
    checkpoints: CheckpointSlots,
}

impl JournalStore {
    pub fn new(journal: Journal, checkpoints: CheckpointSlots) -> JournalStore {
        JournalStore { journal, checkpoints }
    }

    /// Append one record holding `ops`, checkpointing first when the journal is full.
    fn append_record(&mut self, cx: &CommitContext<'_>, ops: &[Op]) -> Result<()> {
        let payload = encode_ops(ops);
        // Replay must read back exactly these ops under this geometry's rules (a segment
        // limit or a page index the decoder refuses would make the volume unopenable).
        // Checked in debug builds, where every test runs: decoding costs a tenth of a
        // durable 4 KiB write.
        #[cfg(debug_assertions)]
        {
            let decoded = super::decode_ops(&payload, cx.pages_per_block, cx.page_bytes);
            assert!(decoded.as_deref() == Ok(ops), "journal record does not read back: {decoded:?} for {ops:?}");
        }
        // The journal's last eighth is kept for records that only release space, so that
        // when the state has outgrown its checkpoint slot (nothing new fits) files can
        // still be deleted and truncated until a checkpoint fits again.
        let reserve = if ops.iter().all(Op::releases_space) { 0 } else { self.journal.capacity_bytes() / 8 };
        if !self.journal.fits_when_empty(payload.len(), reserve) {
            return Err(Error::MetadataFull(format!("one journal record of {} bytes exceeds the journal", payload.len())));
        }
        if !self.journal.append(&payload, reserve)? {
            self.checkpoint(cx)?;
            let appended = self.journal.append(&payload, reserve)?;
            assert!(appended, "a record that fits an empty journal fits after a checkpoint");
        }
        cx.stats.add(Counter::journal_records, 1);
        if ops.iter().any(|op| matches!(op, Op::Namespace(_))) {
            cx.stats.add(Counter::namespace_records, 1);
        }
        cx.stats.add(Counter::journal_bytes, payload.len() as u64);
        Ok(())
    }
}

impl MetaStore for JournalStore {
    fn name(&self) -> &'static str {
        "journal"
    }

    /// Journal first, then apply: journal order is apply order, and a failed append
    /// leaves the state unchanged.
    fn commit(&mut self, cx: &CommitContext<'_>, ops: &[Op], apply: &mut dyn FnMut() -> Freed) -> Result<Freed> {
        if !ops.is_empty() {
            self.append_record(cx, ops)?;
        }
        Ok(apply())
    }

    fn wants_checkpoint(&self) -> bool {
        self.journal.used_bytes() * 2 > self.journal.capacity_bytes()
    }

    fn checkpoint(&mut self, cx: &CommitContext<'_>) -> Result<()> {
        cx.stats.add(Counter::checkpoints, 1);
        let payload = (cx.checkpoint_payload)();
        let next_seq = self.journal.next_seq();
        self.checkpoints.write(&payload, next_seq)?;
        self.journal.reset(next_seq);
        Ok(())
    }

    fn usage(&self) -> MetaUsage {
        MetaUsage {
            log_used_bytes: self.journal.used_bytes(),
            log_capacity_bytes: self.journal.capacity_bytes(),
            checkpoint_generation: self.checkpoints.generation(),
            checkpoint_used_bytes: self.checkpoints.used_bytes(),
            checkpoint_capacity_bytes: self.checkpoints.capacity_bytes(),
        }
    }
}
