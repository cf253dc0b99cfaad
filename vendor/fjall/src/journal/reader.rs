// Copyright (c) 2024-present, fjall-rs
// This source code is licensed under both the Apache 2.0 and MIT License
// (found in the LICENSE-* files in the repository)

use super::entry::{sync_marker, sync_marker_len, Entry, Tag, JOURNAL_PAGE};
use super::writer::journal_number;
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
    /// alignfs: the journal's number, from its file name: the salt its header must carry.
    number: Option<u64>,
    /// alignfs: the salt of the header this journal starts with; `None` for a journal an
    /// older build wrote (no header) or one whose first entry is still to be read.
    pub(crate) salt: Option<u64>,
    header_read: bool,
}

impl JournalReader {
    pub fn new<P: AsRef<Path>>(path: P) -> crate::Result<Self> {
        let file = OpenOptions::new().read(true).write(true).open(&path)?;

        let number = journal_number(path.as_ref());
        Ok(Self {
            path: path.as_ref().into(),
            reader: BufReader::new(file),
            last_valid_pos: 0,
            number,
            salt: None,
            header_read: false,
        })
    }

    /// alignfs: the seed of this journal's batch checksums (0 without a header).
    pub(crate) fn checksum_seed(&self) -> u64 {
        self.salt.unwrap_or(0)
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
        let tag = match self.salt {
            None => Tag::Synced as u8,
            Some(_) => Tag::SaltedSynced as u8,
        };
        let marker_len = sync_marker_len(self.salt);
        let mut chunk = vec![0u8; MARKER_SEARCH_CHUNK + marker_len];
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
            let found = bytes.windows(marker_len).enumerate().any(|(i, window)| {
                window[0] == tag && window == sync_marker(at + i as u64, self.salt)
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

impl JournalReader {
    /// alignfs: the journal's first entry. A header names the journal it was written for:
    /// this one's, or, in a recycled file a crash left before its new header was durable,
    /// the one the file held before, whose entries are not this journal's.
    fn read_header(&mut self) -> Option<crate::Result<()>> {
        self.header_read = true;
        match Entry::decode_from(&mut self.reader) {
            Ok(Entry::Header { salt }) if self.number.is_none_or(|number| number == salt) => {
                self.salt = Some(salt);
                self.last_valid_pos = fail_iter!(self.reader.stream_position());
                Some(Ok(()))
            }
            Ok(Entry::Header { .. }) => {
                log::debug!("Journal {} starts with another journal's header", self.path.display());
                self.salt = self.number;
                self.end_here().map(|error| error.map(drop))
            }
            // Written by an older build, or empty: read from the start. Unless a marker
            // of this journal's follows: then its header was durable and is damaged.
            _ => {
                self.salt = self.number;
                let damaged = self.number.is_some() && fail_iter!(self.synced_after(0));
                self.salt = None;
                if damaged {
                    log::error!("Journal {} has a damaged header", self.path.display());
                    return Some(Err(crate::Error::JournalRecovery(
                        JournalRecoveryError::DamagedBeforeSync,
                    )));
                }
                fail_iter!(self.reader.seek(std::io::SeekFrom::Start(0)));
                Some(Ok(()))
            }
        }
    }

    /// alignfs: skip the zeros after a pad entry, to the page boundary.
    fn skip_pad(&mut self) -> crate::Result<bool> {
        let at = self.reader.stream_position()?;
        let boundary = at.next_multiple_of(JOURNAL_PAGE);
        #[expect(clippy::cast_possible_truncation, reason = "less than a page")]
        let mut zeros = vec![0u8; (boundary - at) as usize];
        if std::io::Read::read_exact(&mut self.reader, &mut zeros).is_err() || zeros.iter().any(|&b| b != 0) {
            return Ok(false);
        }
        self.last_valid_pos = boundary;
        Ok(true)
    }
}

impl Iterator for JournalReader {
    type Item = crate::Result<Entry>;

    fn next(&mut self) -> Option<Self::Item> {
        if !self.header_read {
            match self.read_header()? {
                Ok(()) => {}
                Err(e) => return Some(Err(e)),
            }
        }
        loop {
            return match Entry::decode_from(&mut self.reader) {
                // alignfs: a marker is valid only at the position it names, with the
                // journal's salt.
                Ok(Entry::Synced { offset, salt })
                    if offset != self.last_valid_pos || salt != self.salt =>
                {
                    self.end_here()
                }
                // alignfs: a header is valid only at the start (`read_header`).
                Ok(Entry::Header { .. }) => self.end_here(),
                Ok(Entry::Pad) => match self.skip_pad() {
                    Ok(true) => continue,
                    Ok(false) => self.end_here(),
                    Err(e) => Some(Err(e)),
                },
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
            };
        }
    }
}
