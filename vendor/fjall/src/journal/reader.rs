// Copyright (c) 2024-present, fjall-rs
// This source code is licensed under both the Apache 2.0 and MIT License
// (found in the LICENSE-* files in the repository)

use super::entry::{sync_marker, Entry, Tag, SYNC_MARKER_LEN};
use crate::JournalRecoveryError;
use std::{
    fs::{File, OpenOptions},
    io::{BufReader, Seek},
    os::unix::fs::FileExt,
    path::{Path, PathBuf},
};

/// alignfs: how much of the journal [`JournalReader::synced_after`] reads at a time. A
/// span this long that is all zeros holds no entry (no value the store writes is this
/// long and all zeros): it is the zeros written ahead of the journal's end, or its sparse
/// preallocation, and the search stops there.
const MARKER_SEARCH_CHUNK: usize = 1_024 * 1_024;

/// Reads and emits through the entries in a journal file, but doesn't
/// check the validity of batches
///
/// Will truncate the file to the last valid position to prevent corrupt
/// bytes at the end of the file, which would jeopardize future writes into the file.
#[expect(clippy::module_name_repetitions)]
pub struct JournalReader {
    pub(crate) path: PathBuf,
    pub(crate) reader: BufReader<File>,
    pub(crate) last_valid_pos: u64,
}

impl JournalReader {
    pub fn new<P: AsRef<Path>>(path: P) -> crate::Result<Self> {
        let file = OpenOptions::new().read(true).write(true).open(&path)?;

        Ok(Self {
            path: path.as_ref().into(),
            reader: BufReader::new(file),
            last_valid_pos: 0,
        })
    }

    fn truncate_file(&mut self, pos: u64) -> crate::Result<()> {
        log::debug!("truncating journal to {pos}");
        self.reader.get_mut().set_len(pos)?;
        self.reader.get_mut().sync_all()?;
        Ok(())
    }

    /// alignfs: whether a sync marker lies at or after `from`. The journal is read up to
    /// the first point where it cannot be; a marker after that point means a sync had made
    /// it durable, so it is damaged. Without one, everything from there on was written
    /// after the last completed sync, never acknowledged, and a crash may have kept any of
    /// it: it is dropped. The search is by bytes, since a torn journal cannot be read
    /// entry by entry past its tear; a marker names its own position, which random bytes
    /// do not. (A value crafted to read as a marker can only make recovery refuse to
    /// open, never drop what a sync made durable.)
    pub(crate) fn synced_after(&self, from: u64) -> std::io::Result<bool> {
        let file = self.reader.get_ref();
        let mut chunk = vec![0u8; MARKER_SEARCH_CHUNK + SYNC_MARKER_LEN];
        let mut at = from;
        loop {
            let mut filled = 0;
            while filled < chunk.len() {
                match file.read_at(&mut chunk[filled..], at + filled as u64)? {
                    0 => break,
                    n => filled += n,
                }
            }
            let bytes = &chunk[..filled];
            let found = bytes.windows(SYNC_MARKER_LEN).enumerate().any(|(i, window)| {
                window[0] == Tag::Synced as u8 && window == sync_marker(at + i as u64)
            });
            if found {
                return Ok(true);
            }
            if filled < chunk.len() || bytes[..MARKER_SEARCH_CHUNK].iter().all(|&b| b == 0) {
                return Ok(false);
            }
            at += MARKER_SEARCH_CHUNK as u64;
        }
    }

    /// alignfs: the journal cannot be read from `last_valid_pos` on: an error if a sync
    /// had made that part durable, else its end, cut there.
    fn end_here(&mut self) -> Option<crate::Result<Entry>> {
        if fail_iter!(self.synced_after(self.last_valid_pos)) {
            log::error!(
                "Journal {} is damaged at {}, before a completed sync",
                self.path.display(),
                self.last_valid_pos,
            );
            return Some(Err(crate::Error::JournalRecovery(
                JournalRecoveryError::DamagedBeforeSync,
            )));
        }
        fail_iter!(self.maybe_truncate_file_to_last_valid_pos());
        None
    }

    fn maybe_truncate_file_to_last_valid_pos(&mut self) -> crate::Result<()> {
        let stream_pos = self.reader.stream_position()?;

        if stream_pos > self.last_valid_pos {
            self.truncate_file(self.last_valid_pos)?;
        }

        Ok(())
    }
}

impl Iterator for JournalReader {
    type Item = crate::Result<Entry>;

    fn next(&mut self) -> Option<Self::Item> {
        match Entry::decode_from(&mut self.reader) {
            // alignfs: a marker is valid only at the position it names.
            Ok(Entry::Synced { offset }) if offset != self.last_valid_pos => self.end_here(),
            Ok(item) => {
                self.last_valid_pos = fail_iter!(self.reader.stream_position());
                Some(Ok(item))
            }
            Err(e) => {
                if let crate::Error::Io(e) = e {
                    match e.kind() {
                        std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::Other => {
                            self.end_here()
                        }
                        _ => Some(Err(crate::Error::Io(e))),
                    }
                } else {
                    self.end_here()
                }
            }
        }
    }
}
