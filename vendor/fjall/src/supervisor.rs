// Copyright (c) 2024-present, fjall-rs
// This source code is licensed under both the Apache 2.0 and MIT License
// (found in the LICENSE-* files in the repository)

use lsm_tree::SequenceNumberCounter;

use crate::{
    db::Keyspaces,
    flush::manager::FlushManager,
    journal::{manager::JournalManager, Journal},
    snapshot_tracker::SnapshotTracker,
    write_buffer_manager::WriteBufferManager,
};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

pub struct SupervisorInner {
    pub db_config: crate::Config,

    /// Dictionary of all keyspaces
    #[doc(hidden)]
    pub keyspaces: Arc<RwLock<Keyspaces>>,

    pub(crate) write_buffer_size: WriteBufferManager,
    pub(crate) flush_manager: FlushManager,

    pub seqno: SequenceNumberCounter,

    pub snapshot_tracker: SnapshotTracker,

    pub(crate) journal: Arc<Journal>,

    /// Tracks journal size and garbage collects sealed journals when possible
    pub(crate) journal_manager: Arc<RwLock<JournalManager>>,

    pub(crate) backpressure_lock: Mutex<()>,
}

#[derive(Clone)]
pub struct Supervisor(Arc<SupervisorInner>);

impl std::ops::Deref for Supervisor {
    type Target = SupervisorInner;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl Supervisor {
    pub fn new(inner: SupervisorInner) -> Self {
        Self(Arc::new(inner))
    }

    /// Seals the active journal once it is past its rotation point, and asks the
    /// keyspaces holding the oldest sealed one to flush once the sealed journals reach
    /// `max_journaling_size`. The caller holds the journal's writer, so the memtables
    /// hold every entry the journal does. Returns whether it rotated.
    ///
    /// alignfs: called after every write as well as before each flush (upstream rotated
    /// only before a flush). A journal left to grow until the next flush, which a single
    /// writer of small values may not cause for hundreds of MB, runs past the end of a
    /// reused journal's written blocks into blocks that need zeros written ahead.
    pub(crate) fn rotate_journal_if_full(
        &self,
        journal_writer: &mut MutexGuard<'_, crate::journal::writer::Writer>,
    ) -> crate::Result<bool> {
        if !journal_writer.past_rotation_point()? {
            return Ok(false);
        }
        self.rotate_journal(journal_writer)?;
        Ok(true)
    }

    /// alignfs: seals a reopened journal once a flushed one is kept for reuse (see
    /// `Writer::better_sealed_on_reopen`): at open, or after the flush of what recovery
    /// read from the sealed journals, which frees them.
    pub(crate) fn seal_reopened_journal(
        &self,
        journal_writer: &mut MutexGuard<'_, crate::journal::writer::Writer>,
    ) -> crate::Result<()> {
        if journal_writer.better_sealed_on_reopen()? {
            self.rotate_journal(journal_writer)?;
        }
        Ok(())
    }

    fn rotate_journal(
        &self,
        journal_writer: &mut MutexGuard<'_, crate::journal::writer::Writer>,
    ) -> crate::Result<()> {
        #[expect(clippy::expect_used)]
        let mut journal_manager = self.journal_manager.write().expect("lock is poisoned");

        let seqno_map = {
            #[expect(clippy::expect_used)]
            let keyspaces = self.keyspaces.write().expect("lock is poisoned");

            self.build_seqno_map(&keyspaces)
        };

        journal_manager.rotate_journal(journal_writer, seqno_map)?;

        if journal_manager.disk_space_used() >= self.db_config.max_journaling_size_in_bytes {
            let stragglers = journal_manager.get_keyspaces_to_flush_for_oldest_journal_eviction();

            for keyspace in stragglers {
                log::info!(
                    "Rotating {:?} to try to reduce journal size",
                    keyspace.name,
                );
                keyspace.request_rotation();
            }
        }
        Ok(())
    }

    pub fn build_seqno_map(
        &self,
        keyspaces: &Keyspaces,
    ) -> Vec<crate::journal::manager::EvictionWatermark> {
        use crate::AbstractTree;

        let mut seqnos = Vec::with_capacity(keyspaces.len());

        for keyspace in keyspaces.values() {
            if let Some(lsn) = keyspace.tree.get_highest_memtable_seqno() {
                seqnos.push(crate::journal::manager::EvictionWatermark {
                    lsn,
                    keyspace: keyspace.clone(),
                });
            }
        }

        seqnos
    }
}
