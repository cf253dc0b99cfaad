//! The metadata-store seam: where a commit's ops become durable.
//!
//! The engine commits every metadata change as a list of ops under its commit lock and
//! hands them to the volume's [`MetaStore`], which decides when they apply relative to
//! their persistence. [`JournalStore`] (`orch`, `scrap`, `uhs`) appends a redo record
//! first and applies after, and keeps the journal short with checkpoints; a KV metadata
//! store (`nvstore`, docs/NVSTORE.md) writes the records of the keys the ops touched.

use std::sync::Arc;
use std::time::Instant;

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
    /// Ops applied but held back from the log ([`JournalStore::deferring_namespace`]).
    pub deferred_ops: u64,
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
    /// Whether the store ever holds applied ops back ([`JournalStore::deferring_namespace`]).
    fn defers(&self) -> bool {
        false
    }
    /// Make durable the ops the store has applied but holds back
    /// ([`JournalStore::deferring_namespace`]); nothing to do in a store that holds none.
    fn sync_deferred(&mut self, _cx: &CommitContext<'_>) -> Result<()> {
        Ok(())
    }
    /// Since when the oldest op held back has waited, if any does.
    fn deferred_since(&self) -> Option<Instant> {
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
    /// Whether namespace ops wait for the next sync ([`JournalStore::deferring_namespace`]).
    defers_namespace: bool,
    /// Namespace ops applied but not journaled yet, in the order they returned.
    deferred: Vec<Op>,
    /// Their encoded size, and when the first of them was applied.
    deferred_bytes: usize,
    deferred_since: Option<Instant>,
}

impl JournalStore {
    pub fn new(journal: Journal, checkpoints: CheckpointSlots) -> JournalStore {
        JournalStore { journal, checkpoints, defers_namespace: false, deferred: Vec::new(), deferred_bytes: 0, deferred_since: None }
    }

    /// Buffered I/O's metadata promise (`scrap`, docs/SCRAP.md): a namespace op applies at
    /// once and is journaled with the next record: an fsync's, a data commit's, or the
    /// commit interval's ([`MetaStore::sync_deferred`]). One record carries them all, in
    /// order, so a crash keeps a prefix of the ops. A commit that releases SSD blocks is
    /// journaled before it returns: the blocks are reused only once no crash can bring
    /// back the file that held them.
    pub fn deferring_namespace(self) -> JournalStore {
        JournalStore { defers_namespace: true, ..self }
    }

    /// Journal `ops` after the deferred ones, in one record, checkpointing first when the
    /// journal is full. A checkpoint records the live state, so it covers the deferred ops
    /// (applied already) but not `ops` (applied after the record).
    fn append_record(&mut self, cx: &CommitContext<'_>, ops: &[Op]) -> Result<()> {
        if !self.deferred.is_empty() {
            let all = [self.deferred.as_slice(), ops].concat();
            if self.try_append(cx, &all)? {
                cx.stats.add(Counter::deferred_namespace_commits, 1);
                self.clear_deferred();
                return Ok(());
            }
            self.checkpoint(cx)?;
        }
        if ops.is_empty() {
            return Ok(());
        }
        if !self.try_append(cx, ops)? {
            let payload_len = encode_ops(ops).len();
            if !self.journal.fits_when_empty(payload_len, self.reserve_for(ops)) {
                return Err(Error::MetadataFull(format!("one journal record of {payload_len} bytes exceeds the journal")));
            }
            self.checkpoint(cx)?;
            let appended = self.try_append(cx, ops)?;
            assert!(appended, "a record that fits an empty journal fits after a checkpoint");
        }
        Ok(())
    }

    /// The journal's last eighth is kept for records that only release space, so that
    /// when the state has outgrown its checkpoint slot (nothing new fits) files can still
    /// be deleted and truncated until a checkpoint fits again.
    fn reserve_for(&self, ops: &[Op]) -> u64 {
        if ops.iter().all(Op::releases_space) {
            0
        } else {
            self.journal.capacity_bytes() / 8
        }
    }

    fn clear_deferred(&mut self) {
        self.deferred.clear();
        self.deferred_bytes = 0;
        self.deferred_since = None;
    }

    /// Append one record holding `ops`; `false` if it does not fit the journal now.
    fn try_append(&mut self, cx: &CommitContext<'_>, ops: &[Op]) -> Result<bool> {
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
        if !self.journal.append(&payload, self.reserve_for(ops))? {
            return Ok(false);
        }
        cx.stats.add(Counter::journal_records, 1);
        if ops.iter().any(|op| matches!(op, Op::Namespace(_))) {
            cx.stats.add(Counter::namespace_records, 1);
        }
        cx.stats.add(Counter::journal_bytes, payload.len() as u64);
        Ok(true)
    }

    /// Apply namespace-only `ops` now and journal them with the next record.
    fn defer(&mut self, cx: &CommitContext<'_>, ops: &[Op], apply: &mut dyn FnMut() -> Freed) -> Result<Freed> {
        let freed = apply();
        self.deferred.extend_from_slice(ops);
        self.deferred_bytes += encode_ops(ops).len();
        self.deferred_since.get_or_insert_with(Instant::now);
        cx.stats.add(Counter::namespace_ops_deferred, ops.len() as u64);
        // A long run of deferred ops goes out while one record still holds it easily.
        if !freed.blocks.is_empty() || self.deferred_bytes as u64 > self.journal.capacity_bytes() / 16 {
            // On failure the ops stay applied and deferred: the next sync retries them,
            // and the blocks they released stay unused until the volume reopens.
            self.append_record(cx, &[])?;
        }
        Ok(freed)
    }
}

impl MetaStore for JournalStore {
    fn name(&self) -> &'static str {
        "journal"
    }

    /// Journal first, then apply: journal order is apply order, and a failed append
    /// leaves the state unchanged. Namespace ops may wait ([`JournalStore::deferring_namespace`]).
    fn commit(&mut self, cx: &CommitContext<'_>, ops: &[Op], apply: &mut dyn FnMut() -> Freed) -> Result<Freed> {
        if self.defers_namespace && !ops.is_empty() && ops.iter().all(|op| matches!(op, Op::Namespace(_))) {
            return self.defer(cx, ops, apply);
        }
        if !ops.is_empty() {
            self.append_record(cx, ops)?;
        }
        Ok(apply())
    }

    fn defers(&self) -> bool {
        self.defers_namespace
    }

    fn sync_deferred(&mut self, cx: &CommitContext<'_>) -> Result<()> {
        self.append_record(cx, &[])
    }

    fn deferred_since(&self) -> Option<Instant> {
        self.deferred_since
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
        // The checkpoint recorded the live state, deferred ops included.
        self.clear_deferred();
        Ok(())
    }

    fn usage(&self) -> MetaUsage {
        MetaUsage {
            log_used_bytes: self.journal.used_bytes(),
            log_capacity_bytes: self.journal.capacity_bytes(),
            checkpoint_generation: self.checkpoints.generation(),
            checkpoint_used_bytes: self.checkpoints.used_bytes(),
            checkpoint_capacity_bytes: self.checkpoints.capacity_bytes(),
            deferred_ops: self.deferred.len() as u64,
        }
    }
}
