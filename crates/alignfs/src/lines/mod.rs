//! In-place metadata for a memory-semantic SSD (`byte`; docs/BYTE.md, "Metadata in
//! place"): ByteFS's layout of the volume's state as records of 64-byte lines, each
//! changed line stored through the byte interface, a commit's stores in one device
//! transaction. No journal and no checkpoint. Byte table: docs/format/lines.md.
//!
//! The area (the space the journal store gives its two checkpoint slots) is mirrored in
//! memory, read once at open through the block interface. Line 0 is a header; then a
//! bitmap with one bit per record line; then the records. A record is a run of lines
//! whose bits are set; lines whose bits are clear are free, whatever they hold.
//!
//! A commit finds the keys its ops touch before they apply ([`Touched`]), encodes each
//! key's record again after, and writes into the mirror only what differs: a record of
//! the same length in place, line by line; any other in a newly allocated run, with the
//! old run's bits cleared. The changed lines then reach the device:
//! - with the byte interface: as stores in one transaction (`begin`, stores, `COMMIT`),
//!   which the device's recovery keeps whole or drops whole;
//! - block-only (`--no-byte-interface`): the 4 KiB sectors holding them, first to a redo
//!   area (the journal store's space) under a checksummed header, then in place, each
//!   followed by a flush, as ext4's journal does. A writable open replays a valid redo
//!   area and clears it.

mod commit;
mod image;
mod records;
mod redo;
#[cfg(test)]
mod tests;

pub use image::parse_image;
use image::{Image, Parsed, Shape};

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;

pub use records::{Key, Part, Record, LINE, MAP_CHUNK};

use crate::codec::{crc32c, Encoder};
use crate::device::mssd::MemorySemanticSsd;
use crate::device::{run_batch, AlignedBuf, BlockDevice, IoOp, IoRequest};
use crate::error::{Error, Result};
use crate::geometry::{MetaLayout, IO_ALIGN};
use crate::meta::{Ino, MetaState};

const MAGIC: &[u8; 8] = b"ALNLINES";
const REDO_MAGIC: &[u8; 8] = b"ALNREDO1";
const SECTOR: usize = IO_ALIGN;
const LINES_PER_SECTOR: u64 = (SECTOR / LINE) as u64;
/// Record lines per bitmap line.
const BITS_PER_LINE: u64 = LINE as u64 * 8;
/// Header of the redo area: magic | uuid | count u32 | images crc u32 | header crc u32
/// (of the fields before it and the list), then the sector numbers (u32 each).
const REDO_HEADER_BYTES: usize = 8 + 16 + 4 + 4 + 4;

/// Where a record lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Run {
    line: u64,
    lines: u64,
}

/// What opening the area rebuilt.
pub struct LoadedLines {
    pub state: MetaState,
    pub counters: Vec<u64>,
    /// Objects a crash left without a name (unlinked while open), dropped from `state`;
    /// a writable open deletes their records.
    pub orphans: Vec<Ino>,
    /// Whether a block-only commit was replayed from the redo area.
    pub redo_replayed: bool,
}

pub struct LineStore {
    ssd: Arc<dyn BlockDevice>,
    /// The byte interface; `None` on the block interface alone.
    byte: Option<Arc<MemorySemanticSsd>>,
    /// The area's byte offset on the device, and the redo area's.
    base: u64,
    redo: (u64, u64),
    uuid: [u8; 16],
    device: String,
    mirror: Vec<u8>,
    shape: Shape,
    index: BTreeMap<Key, Run>,
    dirty: BTreeSet<u64>,
    /// Where the next allocation starts looking.
    hint: u64,
    used_lines: u64,
    durable_next_ino: u64,
    /// A commit failed after it applied: memory is ahead of the device.
    failed: bool,
}

impl LineStore {
    fn empty(
        ssd: Arc<dyn BlockDevice>,
        byte: Option<Arc<MemorySemanticSsd>>,
        layout: &MetaLayout,
        uuid: [u8; 16],
        device: String,
    ) -> LineStore {
        let area_bytes = 2 * layout.checkpoint_bytes;
        assert_eq!(layout.checkpoint_b_offset, layout.checkpoint_a_offset + layout.checkpoint_bytes, "the slots are one area");
        let shape = Shape::of(area_bytes);
        LineStore {
            ssd,
            byte,
            base: layout.checkpoint_a_offset,
            redo: (layout.journal_offset, layout.journal_bytes),
            uuid,
            device,
            mirror: vec![0; area_bytes as usize],
            shape,
            index: BTreeMap::new(),
            dirty: BTreeSet::new(),
            hint: shape.first_record,
            used_lines: 0,
            durable_next_ino: 0,
            failed: false,
        }
    }

    /// Write a new area holding `state` (a fresh volume's root), through the block
    /// interface, and clear the redo area.
    pub fn format(ssd: Arc<dyn BlockDevice>, layout: &MetaLayout, uuid: [u8; 16], device: String, state: &MetaState) -> Result<()> {
        let mut store = LineStore::empty(ssd, None, layout, uuid, device);
        store.put_state(state)?;
        // The whole bitmap, whatever an earlier volume left there, and the records.
        let lines = store.dirty.last().map_or(0, |l| l + 1).max(store.shape.first_record);
        let writes = vec![
            IoRequest { op: IoOp::Write, offset_bytes: store.base, buf: store.sectors_from_mirror(0, lines.div_ceil(LINES_PER_SECTOR)) },
            IoRequest { op: IoOp::Write, offset_bytes: store.redo.0, buf: AlignedBuf::zeroed(SECTOR) },
        ];
        run_batch(store.ssd.as_ref(), writes)?;
        store.ssd.flush()
    }

    /// Open the area: replay a valid redo area (and clear it unless `read_only`), read the
    /// lines, rebuild the state, and with `read_only` unset delete what orphans left.
    #[allow(clippy::too_many_arguments)]
    pub fn open(
        ssd: Arc<dyn BlockDevice>,
        byte: Option<Arc<MemorySemanticSsd>>,
        layout: &MetaLayout,
        uuid: [u8; 16],
        device: String,
        pages_per_block: usize,
        page_bytes: u32,
        read_only: bool,
    ) -> Result<(LineStore, LoadedLines)> {
        let mut store = LineStore::empty(ssd, byte, layout, uuid, device);
        let redo_replayed = store.read_area(read_only)?;
        let image = Image { mirror: &store.mirror, shape: store.shape, uuid: store.uuid, device: &store.device, base: store.base };
        let Parsed { index, used_lines, next_ino, mut loaded } = image.parse(pages_per_block, page_bytes)?;
        (store.index, store.used_lines, store.durable_next_ino) = (index, used_lines, next_ino);
        loaded.redo_replayed = redo_replayed;
        if !read_only && !loaded.orphans.is_empty() {
            for &ino in &loaded.orphans {
                store.remove_object(ino);
            }
            store.persist(None)?;
        }
        Ok((store, loaded))
    }

    /// Read the header and the bitmap, lay a valid redo area over them (see
    /// [`LineStore::replay_redo`]), then read the sectors holding used lines, all in flight
    /// at once. Free lines stay zeros in the mirror, whatever the device holds there: they
    /// are never compared, since a record put on new lines stores them whole. Returns
    /// whether a redo area was replayed.
    fn read_area(&mut self, read_only: bool) -> Result<bool> {
        let head = (self.shape.first_record * LINE as u64).div_ceil(SECTOR as u64);
        self.read_sectors(&(0..head).collect::<Vec<_>>())?;
        let replayed = self.replay_redo(read_only)?;
        let mut wanted = BTreeSet::new();
        for (i, &bits) in self.mirror[LINE..self.shape.first_record as usize * LINE].iter().enumerate() {
            for bit in (0..8).filter(|b| bits & (1 << b) != 0) {
                let line = self.shape.first_record + (i * 8 + bit) as u64;
                if line < self.shape.total_lines {
                    wanted.insert(line / LINES_PER_SECTOR);
                }
            }
        }
        let wanted: Vec<u64> = wanted.into_iter().filter(|s| *s >= head && !replayed.contains(s)).collect();
        self.read_sectors(&wanted)?;
        Ok(!replayed.is_empty())
    }

    /// Read `sectors` (ascending) of the area into the mirror, runs of them as one request.
    fn read_sectors(&mut self, sectors: &[u64]) -> Result<()> {
        const MAX_RUN: usize = (1 << 20) / SECTOR;
        let runs: Vec<&[u64]> = sectors.chunk_by(|a, b| b - a == 1).flat_map(|run| run.chunks(MAX_RUN)).collect();
        for batch in runs.chunks(64) {
            let requests = batch
                .iter()
                .map(|run| IoRequest {
                    op: IoOp::Read,
                    offset_bytes: self.base + run[0] * SECTOR as u64,
                    buf: AlignedBuf::zeroed(run.len() * SECTOR),
                })
                .collect();
            for (run, buf) in batch.iter().zip(run_batch(self.ssd.as_ref(), requests)?) {
                let at = run[0] as usize * SECTOR;
                self.mirror[at..at + buf.len()].copy_from_slice(&buf);
            }
        }
        Ok(())
    }

    /// Sectors `first..end` of the area as the mirror holds them.
    fn sectors_from_mirror(&self, first: u64, end: u64) -> AlignedBuf {
        let mut buf = AlignedBuf::zeroed(((end - first) as usize) * SECTOR);
        buf.copy_from_slice(&self.mirror[first as usize * SECTOR..end as usize * SECTOR]);
        buf
    }

    // --- the header and the bitmap

    fn set_header(&mut self, next_ino: u64) {
        let mut e = Encoder::new();
        e.raw(MAGIC).raw(&self.uuid).u64(self.shape.total_lines).u64(next_ino);
        let crc = crc32c(&e.bytes);
        e.u32(crc);
        e.bytes.resize(LINE, 0);
        if self.mirror[..LINE] != e.bytes[..] {
            self.mirror[..LINE].copy_from_slice(&e.bytes);
            self.dirty.insert(0);
        }
        self.durable_next_ino = next_ino;
    }

    fn bit(&self, line: u64) -> (usize, u8) {
        self.shape.bit(line)
    }

    fn is_used(&self, line: u64) -> bool {
        self.shape.is_used(&self.mirror, line)
    }

    fn set_used(&mut self, run: Run, used: bool) {
        for line in run.line..run.line + run.lines {
            let (byte, mask) = self.bit(line);
            if used {
                self.mirror[byte] |= mask;
            } else {
                self.mirror[byte] &= !mask;
            }
            self.dirty.insert(byte as u64 / LINE as u64);
        }
        if used {
            self.used_lines += run.lines;
        } else {
            self.used_lines -= run.lines;
        }
    }

    /// The first free run of `lines` lines at or after the hint, wrapping once.
    fn allocate(&mut self, lines: u64) -> Option<Run> {
        let end = self.shape.total_lines;
        let search = |from: u64, to: u64| {
            let (mut start, mut line) = (from, from);
            while line < to {
                let (byte, _) = self.bit(line);
                if (line - self.shape.first_record) % 8 == 0 && self.mirror[byte] == 0xFF {
                    (line, start) = (line + 8, line + 8);
                } else if self.is_used(line) {
                    (line, start) = (line + 1, line + 1);
                } else if line + 1 - start == lines {
                    return Some(Run { line: start, lines });
                } else {
                    line += 1;
                }
            }
            None
        };
        let found = search(self.hint, end).or_else(|| search(self.shape.first_record, self.hint.min(end)));
        if let Some(run) = found {
            self.hint = run.line + run.lines;
        }
        found
    }

    // --- records

    fn free_lines(&self) -> u64 {
        self.shape.total_lines - self.shape.first_record - self.used_lines
    }

    /// Every record of `state`, into a new area.
    fn put_state(&mut self, state: &MetaState) -> Result<()> {
        for inode in state.snapshot() {
            let ino = inode.ino;
            let data = inode.data.lock();
            self.put(Record::Inode { attr: data.attr.clone(), parent: data.parent })?;
            if !data.target.is_empty() {
                self.put(Record::Target { ino, target: data.target.clone() })?;
            }
            for (name, value) in &data.xattrs {
                self.put(Record::Xattr { ino, name: name.clone(), value: value.clone() })?;
            }
            for (name, &child) in &data.entries {
                self.put(Record::Name { parent: ino, name: name.clone(), child })?;
            }
            let map = inode.map.lock();
            let chunks: BTreeSet<u64> = map.keys().map(|l| l / MAP_CHUNK).collect();
            for chunk in chunks {
                let first = chunk * MAP_CHUNK;
                let entries = map.range(first..first + MAP_CHUNK).map(|(l, e)| (*l, e.clone())).collect();
                self.put(Record::Map { ino, chunk, entries })?;
            }
        }
        self.set_header(state.next_ino.load(Ordering::SeqCst));
        Ok(())
    }

    /// Make `record` the one its key holds, writing into the mirror only lines that change.
    fn put(&mut self, record: Record) -> Result<()> {
        let key = record.key();
        let bytes = record.encode().ok_or_else(|| Error::MetadataFull(format!("a metadata record for {key:?} exceeds 65,535 bytes")))?;
        let lines = (bytes.len() / LINE) as u64;
        let (run, fresh) = match self.index.get(&key) {
            Some(&run) if run.lines == lines => (run, false),
            old => {
                if let Some(old) = old.copied() {
                    self.set_used(old, false);
                }
                let Some(run) = self.allocate(lines) else {
                    self.index.remove(&key);
                    return Err(Error::MetadataFull(format!("no run of {lines} free lines in the metadata area")));
                };
                self.set_used(run, true);
                self.index.insert(key, run);
                (run, true)
            }
        };
        // A record on new lines is stored whole (the mirror's free lines are not what the
        // device holds, [`LineStore::read_area`]); one in place, only where it changed.
        for (i, line) in bytes.chunks(LINE).enumerate() {
            let at = (run.line as usize + i) * LINE;
            if fresh || self.mirror[at..at + LINE] != *line {
                self.mirror[at..at + LINE].copy_from_slice(line);
                self.dirty.insert(run.line + i as u64);
            }
        }
        Ok(())
    }

    fn remove(&mut self, key: &Key) {
        if let Some(run) = self.index.remove(key) {
            self.set_used(run, false);
        }
    }

    /// Remove every record of `ino` (its inode, target, attributes, map, entries).
    fn remove_object(&mut self, ino: Ino) {
        let keys: Vec<Key> =
            self.index.range(Key::Object(ino, Part::Inode)..Key::Object(Ino(ino.0 + 1), Part::Inode)).map(|(k, _)| k.clone()).collect();
        for key in keys {
            self.remove(&key);
        }
    }

    // --- persistence
}
