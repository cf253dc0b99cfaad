// Copyright (c) 2024-present, fjall-rs
// This source code is licensed under both the Apache 2.0 and MIT License
// (found in the LICENSE-* files in the repository)

use super::entry::{
    header, serialize_marker_item, sync_marker, Entry, Tag, HEADER_LEN, JOURNAL_PAGE,
};
use crate::{
    batch::item::Item as BatchItem, file::fsync_directory, journal::recovery::JournalId,
    keyspace::InternalKeyspaceId,
};
use lsm_tree::{CompressionType, SeqNo, ValueType};
use std::{
    fs::{File, OpenOptions},
    hash::Hasher,
    io::{BufWriter, Seek, SeekFrom, Write},
    os::unix::fs::FileExt,
    path::{Path, PathBuf},
};

// TODO: this should be a database configuration
pub const PRE_ALLOCATED_BYTES: u64 = 64 * 1_024 * 1_024;

pub const JOURNAL_BUFFER_BYTES: usize = 8 * 1_024;

/// How long the active journal grows before it is sealed and the next one started.
pub const ROTATION_BYTES: u64 = 64_000_000;

/// alignfs: how far past its end the journal keeps blocks of written zeros. `fdatasync`
/// into blocks a file system must allocate, convert from unwritten, or record a new size
/// for, commits the file system's own journal after the data; into written blocks it
/// writes the data alone, about twice the syncs per second on XFS and ext4
/// (alignfs bench/journal-sync.py). The zeros are written, and made durable by the sync
/// that follows, once per this many bytes; recovery reads them as the journal's end, as
/// it reads the sparse preallocation's.
const ZERO_AHEAD_BYTES: u64 = 1_024 * 1_024;

pub struct Writer {
    pub(crate) path: PathBuf,
    file: BufWriter<File>,
    buf: Vec<u8>,
    is_buffer_dirty: bool,

    compression: CompressionType,
    compression_threshold: usize,

    /// alignfs: the end of the zeros written ahead of the journal's data.
    zeroed_to: u64,
    /// alignfs: the file was opened at an existing journal, which recovery may still
    /// truncate to its last whole entry: the first write goes to the end it has then.
    seek_to_end: bool,
    /// alignfs: entries were written since the last sync marker (`Entry::Synced`).
    unmarked: bool,
    /// alignfs: the salt of the journal's header (its number); `None` for a journal an
    /// older build wrote, which has no header and is never recycled.
    salt: Option<u64>,
    /// alignfs: the journal was reopened, not started by this process (see
    /// `better_sealed_on_reopen`).
    reopened: bool,
}

/// alignfs: the extension of a sealed journal kept for reuse instead of deleted.
pub const RECYCLED_EXTENSION: &str = "recycled";

/// alignfs: the number in a journal's file name (`N.jnl`).
pub(crate) fn journal_number(path: &Path) -> Option<u64> {
    path.file_name()?.to_str()?.strip_suffix(".jnl")?.parse().ok()
}

/// alignfs: the sealed journals kept for reuse beside `journal`.
pub(crate) fn recycled_journals(journal: &Path) -> std::io::Result<Vec<PathBuf>> {
    let Some(folder) = journal.parent() else {
        return Ok(Vec::new());
    };
    let mut kept = Vec::new();
    for entry in std::fs::read_dir(folder)? {
        let path = entry?.path();
        if path.extension().is_some_and(|ext| ext == RECYCLED_EXTENSION) && path.is_file() {
            kept.push(path);
        }
    }
    Ok(kept)
}

/// alignfs: the bytes of the sealed journals kept for reuse beside `journal`.
pub fn recycled_bytes(journal: &Path) -> std::io::Result<u64> {
    recycled_journals(journal)?
        .iter()
        .try_fold(0, |bytes, path| Ok(bytes + path.metadata()?.len()))
}

/// The persist mode allows setting the durability guarantee of previous writes
#[derive(Copy, Clone, Debug, Eq, PartialEq)]
pub enum PersistMode {
    /// Flushes data to OS buffers. This allows the OS to write out data in case of an
    /// application crash.
    ///
    /// When this function returns, data is **not** guaranteed to be persisted in case
    /// of a power loss event or OS crash.
    Buffer,

    /// Flushes data using `fdatasync`.
    ///
    /// Use if you know that `fdatasync` is sufficient for your file system and/or operating system.
    SyncData,

    /// Flushes data + metadata using `fsync`.
    SyncAll,
}

impl Writer {
    pub fn set_compression(&mut self, comp: CompressionType, threshold: usize) {
        self.compression = comp;
        self.compression_threshold = threshold;
    }

    pub fn pos(&mut self) -> crate::Result<u64> {
        self.position_at_end()?;
        self.file.stream_position().map_err(Into::into)
    }

    /// Whether the journal is past [`ROTATION_BYTES`]. alignfs: counts the bytes still
    /// buffered without flushing them (a write path calls this after each write).
    pub fn past_rotation_point(&mut self) -> std::io::Result<bool> {
        self.position_at_end()?;
        let flushed = self.file.get_mut().stream_position()?;
        Ok(flushed + self.file.buffer().len() as u64 > ROTATION_BYTES)
    }

    /// alignfs: see `seek_to_end`. Recovery has read the journal by now, and cut it
    /// where it ends: an empty one starts with a header, one that has this journal's
    /// header keeps its salt, and one without (an older build's) goes on without.
    fn position_at_end(&mut self) -> std::io::Result<()> {
        if self.seek_to_end {
            let end = self.file.seek(SeekFrom::End(0))?;
            self.seek_to_end = false;
            if end == 0 {
                self.start_with_header()?;
            } else if let Some(number) = journal_number(&self.path) {
                let mut first = [0; HEADER_LEN];
                let read = self.file.get_ref().read_at(&mut first, 0)?;
                if first[..read] == header(number)[..] {
                    self.salt = Some(number);
                }
            }
        }
        Ok(())
    }

    pub fn len(&self) -> crate::Result<u64> {
        Ok(self.file.get_ref().metadata()?.len())
    }

    /// Seals the journal and starts the next one. alignfs: also says whether the sealed
    /// journal may be recycled once flushed (it has a header).
    pub fn rotate(&mut self) -> crate::Result<(PathBuf, PathBuf, bool)> {
        // alignfs: positioned, so that a journal sealed right after it was reopened is
        // padded like any other.
        self.position_at_end()?;
        self.persist_keeping_zeros_ahead(PersistMode::SyncAll, false)?;
        // alignfs: and once more for the marker that sync wrote, so that the sealed
        // journal ends in a durable one: damage anywhere in it is then refused.
        self.persist_keeping_zeros_ahead(PersistMode::SyncAll, false)?;
        // alignfs: a journal that may be recycled drops the sparse preallocation past
        // its written zeros, so that its length is what it has written: a recycled file
        // is then written into without the file system allocating anything.
        let recyclable = self.salt.is_some();
        if recyclable {
            let written = self.zeroed_to.max(self.pos()?);
            let file = self.file.get_mut();
            if file.metadata()?.len() > written {
                file.set_len(written)?;
                file.sync_all()?;
            }
        }

        log::debug!(
            "Sealing active journal at {}, len={}B",
            self.path.display(),
            self.path
                .metadata()
                .inspect_err(|e| {
                    log::error!(
                        "Failed to get file metadata of journal file at {}: {e:?}",
                        self.path.display()
                    );
                })?
                .len(),
        );

        let prev_path = self.path.clone();

        let folder = self
            .path
            .parent()
            .expect("should have parent")
            .to_path_buf();

        let Some(basename) = self
            .path
            .file_name()
            .expect("should be valid file name")
            .to_str()
            .expect("should be valid utf-8")
            .strip_suffix(".jnl")
        else {
            log::error!("Invalid journal file name: {}", self.path.display());
            return Err(crate::Error::JournalRecovery(
                crate::JournalRecoveryError::InvalidFileName,
            ));
        };

        let journal_id = basename.parse::<JournalId>().map_err(|_| {
            log::error!("Invalid journal file name: {}", self.path.display());
            crate::Error::JournalRecovery(crate::JournalRecoveryError::InvalidFileName)
        })?;

        let new_path = folder.join(format!("{}.jnl", journal_id + 1));
        log::debug!("Rotating active journal to {}", new_path.display());

        let comp = self.compression;
        let compt = self.compression_threshold;
        *self = match recycled_journals(&new_path)?.first() {
            Some(recycled) => Self::recycle(recycled, new_path.clone())?,
            None => Self::create_new(new_path.clone())?,
        };
        self.set_compression(comp, compt);

        // IMPORTANT: fsync folder on Unix
        fsync_directory(&folder)?;

        Ok((prev_path, new_path, recyclable))
    }

    /// alignfs: whether this journal was reopened (recovery read it), holds entries, and
    /// a flushed journal is kept for reuse: then it is better sealed now
    /// (`Supervisor::seal_reopened_journal`). Recovery cut it where its entries end, so
    /// the rest of its life would be written into blocks the file system allocates anew,
    /// each sync after zeros written ahead; a kept journal's blocks are written already.
    pub fn better_sealed_on_reopen(&mut self) -> crate::Result<bool> {
        if !self.reopened || recycled_journals(&self.path)?.is_empty() {
            return Ok(false);
        }
        let end = self.pos()?;
        let header_len = if self.salt.is_some() { HEADER_LEN as u64 } else { 0 };
        Ok(end > header_len)
    }

    /// alignfs: starts journal `path` in a recycled one's file: renamed, and written
    /// from its start over what it held, which the new header's salt tells apart from
    /// this journal's entries. Its blocks are already written, so appends and syncs into
    /// them change nothing else in the file system, as into the zeros written ahead.
    fn recycle(recycled: &Path, path: PathBuf) -> crate::Result<Self> {
        std::fs::rename(recycled, &path).inspect_err(|e| {
            log::error!("Failed to reuse journal file {} as {}: {e:?}", recycled.display(), path.display());
        })?;
        let file = OpenOptions::new().write(true).open(&path)?;
        let written = file.metadata()?.len();
        log::debug!("Recycled {} as {}", recycled.display(), path.display());
        let mut writer = Self::over(path, file, written);
        writer.start_with_header()?;
        Ok(writer)
    }

    /// alignfs: a writer at the start of `file`, whose first `zeroed_to` bytes are written.
    fn over(path: PathBuf, file: File, zeroed_to: u64) -> Self {
        Self {
            path,
            file: BufWriter::with_capacity(JOURNAL_BUFFER_BYTES, file),
            buf: Vec::new(),
            is_buffer_dirty: false,
            compression: CompressionType::None,
            compression_threshold: 0,
            zeroed_to,
            seek_to_end: false,
            unmarked: false,
            salt: None,
            reopened: false,
        }
    }

    /// alignfs: writes the header of a journal at its start (see `Entry::Header`); it is
    /// made durable by the first sync, with the first entries.
    fn start_with_header(&mut self) -> std::io::Result<()> {
        if let Some(number) = journal_number(&self.path) {
            self.file.write_all(&header(number))?;
            self.is_buffer_dirty = true;
            self.salt = Some(number);
        }
        Ok(())
    }

    pub fn create_new<P: Into<PathBuf>>(path: P) -> crate::Result<Self> {
        let path = path.into();

        let file = File::create_new(&path).inspect_err(|e| {
            log::error!("Failed to create journal file at {}: {e:?}", path.display());
        })?;

        file.set_len(PRE_ALLOCATED_BYTES).inspect_err(|e| {
            log::error!(
                "Failed to set journal file size to {PRE_ALLOCATED_BYTES}B at {}: {e:?}",
                path.display(),
            );
        })?;

        file.sync_all().inspect_err(|e| {
            log::error!("Failed to fsync journal file at {}: {e:?}", path.display());
        })?;

        let mut writer = Self::over(path, file, 0);
        writer.start_with_header()?;
        Ok(writer)
    }

    pub fn from_file<P: AsRef<Path>>(path: P) -> crate::Result<Self> {
        let path = path.as_ref();

        if !path.try_exists()? {
            let file = OpenOptions::new()
                .create_new(true)
                .write(true)
                .open(path)
                .inspect_err(|e| {
                    log::error!("Failed to create journal file at {}: {e:?}", path.display());
                })?;

            file.set_len(PRE_ALLOCATED_BYTES).inspect_err(|e| {
                log::error!(
                    "Failed to set journal file size to {PRE_ALLOCATED_BYTES}B at {}: {e:?}",
                    path.display(),
                );
            })?;

            file.sync_all().inspect_err(|e| {
                log::error!("Failed to fsync journal file at {}: {e:?}", path.display());
            })?;

            let mut writer = Self::over(path.into(), file, 0);
            writer.start_with_header()?;
            return Ok(writer);
        }

        // alignfs: positioned writes from the end (`seek_to_end`) instead of O_APPEND, so
        // that zeros written ahead of the end do not move where the next entry goes.
        // alignfs: and read, for its header (`position_at_end`).
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .inspect_err(|e| {
                log::error!("Failed to open journal file at {}: {e:?}", path.display());
            })?;

        Ok(Self {
            seek_to_end: true,
            reopened: true,
            ..Self::over(path.into(), file, 0)
        })
    }

    /// Persists the journal file.
    pub(crate) fn persist(&mut self, mode: PersistMode) -> std::io::Result<()> {
        self.persist_keeping_zeros_ahead(mode, true)
    }

    /// alignfs: `persist`, writing zeros ahead of the end only if `zeros_ahead` (not for
    /// a journal being sealed, which is cut where it ends).
    fn persist_keeping_zeros_ahead(&mut self, mode: PersistMode, zeros_ahead: bool) -> std::io::Result<()> {
        log::trace!(
            "Persisting journal at {} with mode={mode:?}",
            self.path.display(),
        );

        if mode != PersistMode::Buffer {
            self.pad_to_page().inspect_err(|e| {
                log::error!("Failed to pad journal at {}: {e:?}", self.path.display());
            })?;
        }

        if self.is_buffer_dirty {
            self.file.flush().inspect_err(|e| {
                log::error!(
                    "Failed to flush journal IO buffers at {}: {e:?}",
                    self.path.display(),
                );
            })?;
            self.is_buffer_dirty = false;
        }

        if mode != PersistMode::Buffer && zeros_ahead {
            self.zero_ahead().inspect_err(|e| {
                log::error!(
                    "Failed to write zeros ahead of journal at {}: {e:?}",
                    self.path.display(),
                );
            })?;
        }

        match mode {
            PersistMode::SyncAll => self.file.get_mut().sync_all().inspect_err(|e| {
                log::error!(
                    "Failed to fsync journal file at {}: {e:?}",
                    self.path.display(),
                );
            })?,
            PersistMode::SyncData => self.file.get_mut().sync_data().inspect_err(|e| {
                log::error!(
                    "Failed to fsyncdata journal file at {}: {e:?}",
                    self.path.display(),
                );
            })?,
            PersistMode::Buffer => return Ok(()),
        }
        self.mark_synced()
    }

    /// alignfs: after a completed sync, append a marker saying everything before it is
    /// durable (made durable itself by the next sync). Recovery drops a broken batch with
    /// no marker after it (a crash tore it) and refuses one with a marker after it.
    fn mark_synced(&mut self) -> std::io::Result<()> {
        if !self.unmarked {
            return Ok(());
        }
        let offset = self.file.stream_position()?;
        self.file.write_all(&sync_marker(offset, self.salt))?;
        self.is_buffer_dirty = true;
        self.unmarked = false;
        Ok(())
    }

    /// alignfs: fills the journal with a pad entry to the next page boundary, so that
    /// the sync about to be made writes whole pages, and the next one starts on a page of
    /// its own instead of writing this one's last page again (see `Entry::Pad`).
    fn pad_to_page(&mut self) -> std::io::Result<()> {
        if self.seek_to_end {
            // Nothing written since the journal was opened.
            return Ok(());
        }
        let at = self.file.stream_position()?;
        let boundary = at.next_multiple_of(JOURNAL_PAGE);
        if boundary == at {
            return Ok(());
        }
        #[expect(clippy::cast_possible_truncation, reason = "less than a page")]
        let mut pad = vec![0; (boundary - at) as usize];
        pad[0] = Tag::Pad as u8;
        self.file.write_all(&pad)?;
        self.is_buffer_dirty = true;
        Ok(())
    }

    /// alignfs: keep at least half of [`ZERO_AHEAD_BYTES`] of written zeros past the
    /// journal's end, which is the file position once the buffer is flushed. Nothing past
    /// the end holds an entry, so the zeros never cover one.
    fn zero_ahead(&mut self) -> std::io::Result<()> {
        if self.seek_to_end {
            // Nothing written since the journal was opened.
            return Ok(());
        }
        let file = self.file.get_mut();
        let end = file.stream_position()?;
        if self.zeroed_to >= end + ZERO_AHEAD_BYTES / 2 {
            return Ok(());
        }
        let zeros = vec![0; ZERO_AHEAD_BYTES as usize];
        let from = self.zeroed_to.max(end);
        let to = end + ZERO_AHEAD_BYTES;
        #[expect(clippy::cast_possible_truncation)]
        file.write_all_at(&zeros[..(to - from) as usize], from)?;
        self.zeroed_to = to;
        Ok(())
    }

    /// Writes a batch start marker to the journal
    fn write_start(&mut self, item_count: u32, seqno: SeqNo) -> Result<usize, crate::Error> {
        debug_assert!(self.buf.is_empty());

        self.position_at_end()?;
        Entry::Start { item_count, seqno }.encode_into(&mut self.buf)?;

        self.file.write_all(&self.buf)?;

        Ok(self.buf.len())
    }

    /// Writes a batch end marker to the journal
    fn write_end(&mut self, checksum: u64) -> Result<usize, crate::Error> {
        debug_assert!(self.buf.is_empty());

        Entry::End(checksum).encode_into(&mut self.buf)?;

        self.file.write_all(&self.buf)?;

        Ok(self.buf.len())
    }

    pub(crate) fn write_raw(
        &mut self,
        keyspace_id: InternalKeyspaceId,
        key: &[u8],
        value: &[u8],
        value_type: ValueType,
        seqno: u64,
    ) -> crate::Result<usize> {
        self.is_buffer_dirty = true;
        self.unmarked = true;

        // alignfs: the salt of a reopened journal is known once it is positioned.
        self.position_at_end()?;
        let mut hasher = xxhash_rust::xxh3::Xxh3::with_seed(self.salt.unwrap_or(0));
        let mut byte_count = 0;

        self.buf.clear();
        byte_count += self.write_start(1, seqno)?;
        self.buf.clear();

        serialize_marker_item(
            &mut self.buf,
            keyspace_id,
            key,
            value,
            value_type,
            if self.compression_threshold > 0 && value.len() >= self.compression_threshold {
                self.compression
            } else {
                CompressionType::None
            },
        )?;

        self.file.write_all(&self.buf)?;

        hasher.update(&self.buf);
        byte_count += self.buf.len();

        self.buf.clear();
        let checksum = hasher.finish();
        byte_count += self.write_end(checksum)?;

        Ok(byte_count)
    }

    pub(crate) fn write_clear(
        &mut self,
        keyspace_id: InternalKeyspaceId,
        seqno: SeqNo,
    ) -> crate::Result<usize> {
        self.is_buffer_dirty = true;
        self.unmarked = true;

        // alignfs: the salt of a reopened journal is known once it is positioned.
        self.position_at_end()?;
        let mut hasher = xxhash_rust::xxh3::Xxh3::with_seed(self.salt.unwrap_or(0));
        let mut byte_count = 0;

        self.buf.clear();
        byte_count += self.write_start(1, seqno)?;
        self.buf.clear();

        Entry::Clear { keyspace_id }.encode_into(&mut self.buf)?;
        self.file.write_all(&self.buf)?;
        hasher.update(&self.buf);
        byte_count += self.buf.len();

        self.buf.clear();
        let checksum = hasher.finish();
        byte_count += self.write_end(checksum)?;

        Ok(byte_count)
    }

    pub fn write_batch<'a>(
        &mut self,
        items: impl Iterator<Item = &'a BatchItem>,
        batch_size: usize,
        seqno: SeqNo,
    ) -> crate::Result<usize> {
        if batch_size == 0 {
            return Ok(0);
        }

        self.is_buffer_dirty = true;
        self.unmarked = true;

        self.buf.clear();

        // NOTE: entries.len() is surely never > u32::MAX
        #[expect(clippy::cast_possible_truncation)]
        let item_count = batch_size as u32;

        // alignfs: the salt of a reopened journal is known once it is positioned.
        self.position_at_end()?;
        let mut hasher = xxhash_rust::xxh3::Xxh3::with_seed(self.salt.unwrap_or(0));
        let mut byte_count = 0;

        byte_count += self.write_start(item_count, seqno)?;
        self.buf.clear();

        for item in items {
            debug_assert!(self.buf.is_empty());

            serialize_marker_item(
                &mut self.buf,
                item.keyspace.id,
                &item.key,
                &item.value,
                item.value_type,
                if self.compression_threshold > 0 && item.value.len() >= self.compression_threshold
                {
                    self.compression
                } else {
                    CompressionType::None
                },
            )?;

            self.file.write_all(&self.buf)?;

            hasher.update(&self.buf);
            byte_count += self.buf.len();

            self.buf.clear();
        }

        let checksum = hasher.finish();
        byte_count += self.write_end(checksum)?;

        Ok(byte_count)
    }
}
