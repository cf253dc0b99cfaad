// Copyright (c) 2024-present, fjall-rs
// This source code is licensed under both the Apache 2.0 and MIT License
// (found in the LICENSE-* files in the repository)

use super::reader::JournalReader;
use crate::{journal::entry::Entry, keyspace::InternalKeyspaceId, JournalRecoveryError};
use lsm_tree::{SeqNo, UserKey, UserValue, ValueType};
use std::{fs::OpenOptions, hash::Hasher};

#[derive(Debug)]
pub struct ReadBatchItem {
    pub keyspace_id: InternalKeyspaceId,
    pub key: UserKey,
    pub value: UserValue,
    pub value_type: ValueType,
}

#[derive(Debug)]
pub struct Batch {
    pub(crate) seqno: SeqNo,
    pub(crate) items: Vec<ReadBatchItem>,
    pub(crate) cleared_keyspaces: Vec<InternalKeyspaceId>,
}

#[expect(clippy::module_name_repetitions)]
pub struct JournalBatchReader {
    reader: JournalReader,
    items: Vec<ReadBatchItem>,
    cleared_keyspaces: Vec<InternalKeyspaceId>,
    is_in_batch: bool,
    batch_counter: u32,
    batch_seqno: SeqNo,
    last_valid_pos: u64,
    checksum_builder: xxhash_rust::xxh3::Xxh3,
}

impl JournalBatchReader {
    pub fn new(reader: JournalReader) -> Self {
        Self {
            reader,
            items: Vec::with_capacity(10),
            cleared_keyspaces: Vec::new(),
            checksum_builder: xxhash_rust::xxh3::Xxh3::new(),
            is_in_batch: false,
            batch_seqno: 0,
            last_valid_pos: 0,
            batch_counter: 0,
        }
    }

    /// alignfs: whether the journal starts with this journal's header (see
    /// `Entry::Header`), as every journal this build writes does.
    pub fn has_header(&self) -> bool {
        self.reader.salt.is_some()
    }

    // TODO: reallocate space
    fn truncate_to(&self, last_valid_pos: u64) -> crate::Result<()> {
        log::trace!("Truncating journal to {last_valid_pos}");

        // TODO: on windows, reading file probably needs to be closed first...?

        let file = OpenOptions::new().write(true).open(&self.reader.path)?;
        file.set_len(last_valid_pos)?;
        file.sync_all()?;

        Ok(())
    }

    /// alignfs: the batch that started at `last_valid_pos` is broken (`reason`). If a
    /// completed sync's marker lies after its start, a sync had made it durable and the
    /// journal is damaged: an error. Otherwise it, and all after it, was written after the
    /// last completed sync and never acknowledged (a crash tore it): dropped, as upstream
    /// drops a batch missing its end marker. Upstream errors for some broken batches and
    /// drops others, whatever follows them.
    fn broken_batch(&mut self, reason: JournalRecoveryError) -> Option<crate::Result<Batch>> {
        if fail_iter!(self.reader.synced_after(self.last_valid_pos)) {
            log::error!("Invalid batch ({reason:?}) before a completed sync: the journal is damaged");
            return Some(Err(crate::Error::JournalRecovery(reason)));
        }
        log::debug!("Invalid batch ({reason:?}) after the last completed sync, torn by a crash: discarding it and the rest of the journal");
        self.is_in_batch = false;
        fail_iter!(self.truncate_to(self.last_valid_pos));
        None
    }

    fn on_close(&self) -> crate::Result<()> {
        if self.is_in_batch {
            log::debug!("Invalid batch: missing terminator, but last batch, so probably incomplete, discarding to keep atomicity");

            // Discard batch
            self.truncate_to(self.last_valid_pos)?;
        }

        Ok(())
    }
}

impl Iterator for JournalBatchReader {
    type Item = crate::Result<Batch>;

    #[expect(clippy::too_many_lines)]
    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let Some(item) = self.reader.next() else {
                fail_iter!(self.on_close());
                return None;
            };
            let item = fail_iter!(item);

            let journal_file_pos = self.reader.last_valid_pos;

            match item {
                Entry::Start { item_count, seqno } => {
                    if self.is_in_batch {
                        log::debug!("Invalid batch: found batch start inside batch");
                        return self.broken_batch(JournalRecoveryError::InsufficientLength);
                    }

                    self.is_in_batch = true;
                    self.batch_counter = item_count;
                    self.batch_seqno = seqno;
                    // alignfs: seeded with the journal's salt (see `Entry::Header`).
                    self.checksum_builder =
                        xxhash_rust::xxh3::Xxh3::with_seed(self.reader.checksum_seed());
                }
                Entry::End(expected_checksum) => {
                    if self.batch_counter > 0 {
                        log::debug!("Invalid batch: insufficient length");
                        return self.broken_batch(JournalRecoveryError::InsufficientLength);
                    }

                    if !self.is_in_batch {
                        log::debug!("Invalid batch: found end marker without start marker");
                        return self.broken_batch(JournalRecoveryError::TooManyItems);
                    }

                    let got_checksum = self.checksum_builder.finish();
                    self.checksum_builder = xxhash_rust::xxh3::Xxh3::new();

                    if got_checksum != expected_checksum {
                        // alignfs: a crash during a sync may keep some of a batch's
                        // sectors and not others, and a later batch whole.
                        log::debug!("Invalid batch: checksum check failed, expected: {expected_checksum}, got: {got_checksum}");
                        return self.broken_batch(JournalRecoveryError::ChecksumMismatch);
                    }

                    // Reset all variables
                    self.is_in_batch = false;
                    self.batch_counter = 0;

                    self.last_valid_pos = journal_file_pos;

                    let items = std::mem::take(&mut self.items);
                    let cleared_keyspaces = std::mem::take(&mut self.cleared_keyspaces);
                    return Some(Ok(Batch {
                        seqno: self.batch_seqno,
                        items,
                        cleared_keyspaces,
                    }));
                }
                Entry::Item {
                    keyspace_id,
                    key,
                    value,
                    value_type,
                    compression,
                } => {
                    let item = Entry::Item {
                        keyspace_id,
                        key: key.clone(),
                        value: value.clone(),
                        value_type,
                        compression,
                    };
                    let mut bytes = Vec::with_capacity(100);
                    fail_iter!(item.encode_into(&mut bytes));

                    self.checksum_builder.update(&bytes);

                    if !self.is_in_batch {
                        log::debug!("Invalid batch: found item without start marker");
                        return self.broken_batch(JournalRecoveryError::TooManyItems);
                    }

                    if self.batch_counter == 0 {
                        log::debug!("Invalid batch: Expected end marker (too many items in batch)");
                        return self.broken_batch(JournalRecoveryError::TooManyItems);
                    }

                    self.batch_counter -= 1;

                    self.items.push(ReadBatchItem {
                        keyspace_id,
                        key,
                        value,
                        value_type,
                    });
                }
                Entry::Clear { keyspace_id } => {
                    let entry = Entry::Clear { keyspace_id };
                    let mut bytes = Vec::with_capacity(16);
                    fail_iter!(entry.encode_into(&mut bytes));

                    self.checksum_builder.update(&bytes);

                    if !self.is_in_batch {
                        log::debug!("Invalid batch: found clear marker without start marker");
                        return self.broken_batch(JournalRecoveryError::TooManyItems);
                    }

                    if self.batch_counter == 0 {
                        log::debug!("Invalid batch: Expected end marker (too many items in batch)");
                        return self.broken_batch(JournalRecoveryError::TooManyItems);
                    }

                    self.batch_counter -= 1;

                    self.cleared_keyspaces.push(keyspace_id);
                }
                // alignfs: written between batches only.
                Entry::Synced { .. } => {
                    if self.is_in_batch {
                        log::debug!("Invalid batch: found a sync marker inside a batch");
                        return self.broken_batch(JournalRecoveryError::InsufficientLength);
                    }
                    self.last_valid_pos = journal_file_pos;
                }
                // alignfs: the journal reader consumes these itself.
                Entry::Header { .. } | Entry::Pad => {
                    return self.broken_batch(JournalRecoveryError::InsufficientLength);
                }
            }
        }
    }
}
