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

mod records;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;

pub use records::{Key, Part, Record, LINE, MAP_CHUNK};

use crate::codec::{crc32c, Decoder, Encoder};
use crate::device::mssd::MemorySemanticSsd;
use crate::device::{run_batch, AlignedBuf, BlockDevice, IoOp, IoRequest};
use crate::error::{Error, Result};
use crate::geometry::{MetaLayout, IO_ALIGN};
use crate::journal::{CommitContext, MetaStore, MetaUsage};
use crate::map::{BlockEntry, FileMap};
use crate::meta::{DataOp, FileKind, Freed, Ino, Inode, InodeData, MetaState, NamespaceOp, Op, Touched};
use crate::stats::Counter;

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

    /// The image of a new area of `area_bytes` holding `state`, for fuzzing seeds and
    /// tests.
    pub fn image_of(state: &MetaState, uuid: [u8; 16], area_bytes: u64) -> Result<Vec<u8>> {
        let layout = MetaLayout {
            checkpoint_bytes: area_bytes / 2,
            checkpoint_a_offset: 0,
            checkpoint_b_offset: area_bytes / 2,
            journal_offset: area_bytes,
            journal_bytes: SECTOR as u64,
            pages_offset: area_bytes + SECTOR as u64,
            page_count: 0,
        };
        let device = Arc::new(crate::device::SimSsd::new(area_bytes + SECTOR as u64));
        let mut store = LineStore::empty(device, None, &layout, uuid, "image".into());
        store.put_state(state)?;
        Ok(store.mirror)
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

    /// Encode again every record the ops touched, as `meta` now holds it.
    fn write_touched(&mut self, meta: &MetaState, touched: &Touched) -> Result<()> {
        for &ino in touched.objects.union(&touched.sizes) {
            let Some(inode) = meta.get(ino) else {
                self.remove_object(ino);
                continue;
            };
            let data = inode.data.lock();
            self.put(Record::Inode { attr: data.attr.clone(), parent: data.parent })?;
            if !touched.objects.contains(&ino) {
                continue;
            }
            if data.target.is_empty() {
                self.remove(&Key::Object(ino, Part::Target));
            } else {
                self.put(Record::Target { ino, target: data.target.clone() })?;
            }
            let stored: Vec<Vec<u8>> = self
                .index
                .range(Key::Object(ino, Part::Xattr(Vec::new()))..Key::Object(ino, Part::Map(0)))
                .filter_map(|(k, _)| match k {
                    Key::Object(_, Part::Xattr(name)) => Some(name.clone()),
                    _ => None,
                })
                .collect();
            for name in stored.into_iter().filter(|n| !data.xattrs.contains_key(n)) {
                self.remove(&Key::Object(ino, Part::Xattr(name)));
            }
            for (name, value) in &data.xattrs {
                self.put(Record::Xattr { ino, name: name.clone(), value: value.clone() })?;
            }
        }
        for (parent, name) in &touched.names {
            match meta.child(*parent, name) {
                Some(child) => self.put(Record::Name { parent: *parent, name: name.clone(), child })?,
                None => self.remove(&Key::Object(*parent, Part::Name(name.clone()))),
            }
        }
        for (ino, chunk) in touched_chunks(touched) {
            let Some(inode) = meta.get(ino) else { continue };
            let entries: Vec<_> = chunk_entries(&inode.map.lock(), chunk).collect();
            if entries.is_empty() {
                self.remove(&Key::Object(ino, Part::Map(chunk)));
            } else {
                self.put(Record::Map { ino, chunk, entries })?;
            }
        }
        let next_ino = meta.next_ino.load(Ordering::SeqCst);
        if next_ino != self.durable_next_ino {
            self.set_header(next_ino);
        }
        Ok(())
    }

    // --- persistence

    /// Make the dirty lines durable as one atomic unit.
    fn persist(&mut self, stats: Option<&crate::stats::Stats>) -> Result<()> {
        if self.dirty.is_empty() {
            return Ok(());
        }
        let dirty = std::mem::take(&mut self.dirty);
        if let Some(stats) = stats {
            stats.add(Counter::meta_lines_stored, dirty.len() as u64);
            stats.add(Counter::meta_transactions, 1);
        }
        match &self.byte {
            Some(byte) => {
                let tx = byte.begin();
                let lines: Vec<u64> = dirty.into_iter().collect();
                for run in lines.chunk_by(|a, b| b - a == 1) {
                    let (first, n) = (run[0] as usize, run.len());
                    byte.store(Some(tx), self.base + (first * LINE) as u64, &self.mirror[first * LINE..(first + n) * LINE])?;
                }
                byte.commit(tx)
            }
            None => {
                let sectors: BTreeSet<u64> = dirty.iter().map(|l| l / LINES_PER_SECTOR).collect();
                self.write_through_redo(&sectors.into_iter().collect::<Vec<_>>())
            }
        }
    }

    /// Block-only: `sectors` of the area to the redo area, then in place.
    fn write_through_redo(&self, sectors: &[u64]) -> Result<()> {
        let room = ((self.redo.1 as usize / SECTOR) - 1).min((SECTOR - REDO_HEADER_BYTES) / 4);
        if sectors.len() > room {
            return Err(Error::MetadataFull(format!(
                "one metadata commit changes {} sectors; the block-only redo area holds {room}",
                sectors.len()
            )));
        }
        let mut images = AlignedBuf::zeroed((sectors.len() + 1) * SECTOR);
        for (i, &s) in sectors.iter().enumerate() {
            images[(i + 1) * SECTOR..(i + 2) * SECTOR].copy_from_slice(&self.mirror[s as usize * SECTOR..(s as usize + 1) * SECTOR]);
        }
        let mut e = Encoder::new();
        e.raw(REDO_MAGIC).raw(&self.uuid).u32(sectors.len() as u32).u32(crc32c(&images[SECTOR..]));
        let mut list = Encoder::new();
        for &s in sectors {
            list.u32(s as u32);
        }
        let crc = redo_header_crc(&e.bytes, &list.bytes);
        e.u32(crc).raw(&list.bytes);
        images[..e.bytes.len()].copy_from_slice(&e.bytes);
        run_batch(self.ssd.as_ref(), vec![IoRequest { op: IoOp::Write, offset_bytes: self.redo.0, buf: images }])?;
        self.ssd.flush()?;
        self.write_in_place(sectors)
    }

    fn write_in_place(&self, sectors: &[u64]) -> Result<()> {
        let writes = sectors
            .chunk_by(|a, b| b - a == 1)
            .map(|run| IoRequest {
                op: IoOp::Write,
                offset_bytes: self.base + run[0] * SECTOR as u64,
                buf: self.sectors_from_mirror(run[0], run[run.len() - 1] + 1),
            })
            .collect();
        run_batch(self.ssd.as_ref(), writes)?;
        self.ssd.flush()
    }

    /// Lay a valid redo area over the mirror; unless `read_only`, write it in place and
    /// clear it. Returns the sectors it held (none if there was no valid one).
    fn replay_redo(&mut self, read_only: bool) -> Result<BTreeSet<u64>> {
        let request = IoRequest { op: IoOp::Read, offset_bytes: self.redo.0, buf: AlignedBuf::zeroed(SECTOR) };
        let head = run_batch(self.ssd.as_ref(), vec![request])?.pop().expect("one buffer per request");
        let mut d = Decoder::new(&head);
        let parsed = (|| {
            let (magic, uuid, count, images_crc) = (d.take(8)?, d.take(16)?, d.u32()? as usize, d.u32()?);
            let fields = d.position();
            let crc = d.u32()?;
            let list = d.position();
            let sectors = (0..count).map(|_| d.u32().map(u64::from)).collect::<Result<Vec<_>, _>>()?;
            let valid = magic == REDO_MAGIC && uuid == self.uuid && crc == redo_header_crc(&head[..fields], &head[list..d.position()]);
            Ok::<_, crate::codec::Short>(valid.then_some((sectors, images_crc)))
        })();
        let Ok(Some((sectors, images_crc))) = parsed else { return Ok(BTreeSet::new()) };
        let area_sectors = self.mirror.len() as u64 / SECTOR as u64;
        if sectors.is_empty() || sectors.iter().any(|&s| s >= area_sectors) || (sectors.len() + 1) * SECTOR > self.redo.1 as usize {
            return Ok(BTreeSet::new());
        }
        let request =
            IoRequest { op: IoOp::Read, offset_bytes: self.redo.0 + SECTOR as u64, buf: AlignedBuf::zeroed(sectors.len() * SECTOR) };
        let images = run_batch(self.ssd.as_ref(), vec![request])?.pop().expect("one buffer per request");
        if crc32c(&images) != images_crc {
            // Torn while being written: its commit never reached the area.
            return Ok(BTreeSet::new());
        }
        for (i, &s) in sectors.iter().enumerate() {
            self.mirror[s as usize * SECTOR..(s as usize + 1) * SECTOR].copy_from_slice(&images[i * SECTOR..(i + 1) * SECTOR]);
        }
        if !read_only {
            self.write_in_place(&sectors)?;
            self.clear_redo()?;
        }
        Ok(sectors.into_iter().collect())
    }

    fn clear_redo(&self) -> Result<()> {
        run_batch(self.ssd.as_ref(), vec![IoRequest { op: IoOp::Write, offset_bytes: self.redo.0, buf: AlignedBuf::zeroed(SECTOR) }])?;
        self.ssd.flush()
    }
}

/// The redo header's checksum covers its fields and the sector list: a header sector torn
/// past its first 512 bytes must not pair a new count with an old commit's list.
fn redo_header_crc(fields: &[u8], list: &[u8]) -> u32 {
    crc32c(&[fields, list].concat())
}

/// Where the bitmap and the records are in an area of a given size.
#[derive(Clone, Copy, Debug)]
struct Shape {
    total_lines: u64,
    first_record: u64,
}

impl Shape {
    fn of(area_bytes: u64) -> Shape {
        let total_lines = area_bytes / LINE as u64;
        // Line 0 is the header; each bitmap line covers BITS_PER_LINE record lines.
        Shape { total_lines, first_record: 1 + (total_lines - 1).div_ceil(BITS_PER_LINE + 1) }
    }

    /// The byte of the mirror holding `line`'s bit, and the bit.
    fn bit(&self, line: u64) -> (usize, u8) {
        let i = line - self.first_record;
        (LINE + (i / 8) as usize, 1 << (i % 8))
    }

    fn is_used(&self, mirror: &[u8], line: u64) -> bool {
        let (byte, mask) = self.bit(line);
        mirror[byte] & mask != 0
    }
}

/// Parse an area image (`uuid`'s volume; its length gives its shape), as an open does,
/// without a device: for the fuzz target and tests.
pub fn parse_image(image: &[u8], uuid: [u8; 16], pages_per_block: usize, page_bytes: u32) -> Result<LoadedLines> {
    if image.len() < 2 * SECTOR || image.len() % SECTOR != 0 {
        return Err(Error::corrupt("in-place metadata", "image", 0, "an area is whole sectors, at least two"));
    }
    let image = Image { mirror: image, shape: Shape::of(image.len() as u64), uuid, device: "image", base: 0 };
    Ok(image.parse(pages_per_block, page_bytes)?.loaded)
}

/// An area as read from the device, to parse.
struct Image<'a> {
    mirror: &'a [u8],
    shape: Shape,
    uuid: [u8; 16],
    device: &'a str,
    base: u64,
}

/// What parsing an area found.
struct Parsed {
    index: BTreeMap<Key, Run>,
    used_lines: u64,
    next_ino: u64,
    loaded: LoadedLines,
}

impl Image<'_> {
    fn corrupt(&self, line: u64, problem: impl Into<String>) -> Error {
        Error::corrupt("in-place metadata", self.device, self.base + line * LINE as u64, problem)
    }

    /// The next inode number the header holds, once it checks out.
    fn header(&self) -> Result<u64> {
        let line = &self.mirror[..LINE];
        let mut d = Decoder::new(line);
        let short = |s: crate::codec::Short| self.corrupt(0, format!("header: {s}"));
        let magic = d.take(MAGIC.len()).map_err(short)?;
        let uuid = d.take(16).map_err(short)?;
        let (lines, next_ino) = (d.u64().map_err(short)?, d.u64().map_err(short)?);
        let covered = d.position();
        let crc = d.u32().map_err(short)?;
        if magic != MAGIC {
            return Err(self.corrupt(0, "no in-place metadata header (was the volume formatted with the journal?)"));
        }
        if crc != crc32c(&line[..covered]) {
            return Err(self.corrupt(0, "header checksum mismatch"));
        }
        if uuid != self.uuid {
            return Err(self.corrupt(0, "the header names another volume"));
        }
        if lines != self.shape.total_lines || next_ino < 2 {
            return Err(
                self.corrupt(0, format!("header: {lines} lines (the layout has {}), next inode {next_ino}", self.shape.total_lines))
            );
        }
        Ok(next_ino)
    }

    /// Every used run into the index, and the state rebuilt from the records. Every used
    /// line must belong to a record and every record's lines must be used.
    fn parse(&self, pages_per_block: usize, page_bytes: u32) -> Result<Parsed> {
        let next_ino = self.header()?;
        let (mut index, mut used_lines, mut records) = (BTreeMap::new(), 0, Vec::new());
        let shape = self.shape;
        let mut line = shape.first_record;
        while line < shape.total_lines {
            if !shape.is_used(self.mirror, line) {
                line += 1;
                continue;
            }
            let at = line as usize * LINE;
            let lines = Record::lines_of(&self.mirror[at..at + LINE]).map_err(|s| self.corrupt(line, s.to_string()))? as u64;
            if line + lines > shape.total_lines || (line..line + lines).any(|l| !shape.is_used(self.mirror, l)) {
                return Err(self.corrupt(line, format!("a record of {lines} lines whose lines are not all marked used")));
            }
            let bytes = &self.mirror[at..at + lines as usize * LINE];
            let record = Record::decode(bytes, pages_per_block, page_bytes).map_err(|s| self.corrupt(line, s.to_string()))?;
            let key = record.key();
            if index.insert(key.clone(), Run { line, lines }).is_some() {
                return Err(self.corrupt(line, format!("a second record for {key:?}")));
            }
            used_lines += lines;
            records.push((line, record));
            line += lines;
        }
        let loaded = self.build(records, next_ino)?;
        Ok(Parsed { index, used_lines, next_ino, loaded })
    }

    fn build(&self, records: Vec<(u64, Record)>, next_ino: u64) -> Result<LoadedLines> {
        let state = MetaState::default();
        state.next_ino.store(next_ino, Ordering::SeqCst);
        let mut counters = Vec::new();
        let mut rest = Vec::new();
        for (line, record) in records {
            match record {
                Record::Inode { attr, parent } => {
                    if attr.ino.0 == 0 || attr.ino.0 >= next_ino {
                        return Err(self.corrupt(line, format!("inode {} is beyond the next inode {next_ino}", attr.ino.0)));
                    }
                    let data = InodeData { attr, entries: BTreeMap::new(), parent, target: Vec::new(), xattrs: BTreeMap::new() };
                    state.inodes.write().insert(data.attr.ino, Arc::new(Inode::new(data, FileMap::new())));
                }
                Record::Counters(values) => counters = values,
                other => rest.push((line, other)),
            }
        }
        if state.get(Ino::ROOT).is_none_or(|root| root.kind != FileKind::Dir) {
            return Err(self.corrupt(0, "no root directory"));
        }
        let inode = |line: u64, ino: Ino, what: &str| {
            state.get(ino).ok_or_else(|| self.corrupt(line, format!("{what} of a missing inode {}", ino.0)))
        };
        for (line, record) in rest {
            match record {
                Record::Name { parent, name, child } => {
                    let dir = inode(line, parent, "a name")?;
                    inode(line, child, "a name")?;
                    if dir.kind != FileKind::Dir {
                        return Err(self.corrupt(line, format!("a name in {}, which is not a directory", parent.0)));
                    }
                    dir.data.lock().entries.insert(name, child);
                }
                Record::Map { ino, entries, .. } => {
                    let file = inode(line, ino, "a map")?;
                    if file.kind != FileKind::File {
                        return Err(self.corrupt(line, format!("a map of {}, which is not a file", ino.0)));
                    }
                    file.map.lock().extend(entries);
                }
                Record::Target { ino, target } => inode(line, ino, "a symlink target")?.data.lock().target = target,
                Record::Xattr { ino, name, value } => {
                    inode(line, ino, "an extended attribute")?.data.lock().xattrs.insert(name, value);
                }
                Record::Inode { .. } | Record::Counters(_) => unreachable!("taken above"),
            }
        }
        let orphans: Vec<Ino> =
            state.snapshot().iter().filter(|i| i.ino != Ino::ROOT && i.data.lock().attr.nlink == 0).map(|i| i.ino).collect();
        for ino in &orphans {
            state.inodes.write().remove(ino);
        }
        Ok(LoadedLines { state, counters, orphans, redo_replayed: false })
    }
}

/// The map records (chunks) holding the blocks a commit touches.
fn touched_chunks(touched: &Touched) -> Vec<(Ino, u64)> {
    let mut chunks: Vec<(Ino, u64)> = touched.blocks.keys().map(|&(ino, lblock)| (ino, lblock / MAP_CHUNK)).collect();
    chunks.dedup();
    chunks
}

/// The entries of one map record.
fn chunk_entries(map: &FileMap, chunk: u64) -> impl Iterator<Item = (u64, BlockEntry)> + '_ {
    let first = chunk * MAP_CHUNK;
    map.range(first..first + MAP_CHUNK).map(|(l, e)| (*l, e.clone()))
}

/// The most record lines a commit of `ops` can take from the free ones, found before the
/// ops apply, from each record it may write anew at its size after them (a record that
/// keeps its size is rewritten in place and takes none; counting it too over-counts,
/// which is safe). When even the largest record size for each fits in `room`, that bound
/// is returned without encoding anything, so commits far from full pay only for a count.
/// `None` if one of the records would be longer than a record may be.
fn lines_wanted_at_most(meta: &MetaState, ops: &[Op], touched: &Touched, room: u64) -> Option<u64> {
    let chunks = touched_chunks(touched);
    let records: u64 = ops
        .iter()
        .map(|op| match op {
            Op::Namespace(NamespaceOp::Create { .. }) => 3,
            Op::Namespace(NamespaceOp::Rename { .. }) => 2,
            Op::Namespace(NamespaceOp::Link { .. }) | Op::Namespace(NamespaceOp::SetXattr { value: Some(_), .. }) => 1,
            _ => 0,
        })
        .sum::<u64>()
        + chunks.len() as u64;
    let bound = records * Record::MAX_LINES;
    if bound <= room {
        return Some(bound);
    }
    let lines = |record: Record| record.encode().map(|bytes| (bytes.len() / LINE) as u64);
    let name = |parent: Ino, name: &[u8], child: Ino| lines(Record::Name { parent, name: name.to_vec(), child });
    let mut wanted = 0;
    for op in ops {
        wanted += match op {
            Op::Namespace(NamespaceOp::Create { parent, name: n, attr, target }) => {
                let target = if target.is_empty() { 0 } else { lines(Record::Target { ino: attr.ino, target: target.clone() })? };
                lines(Record::Inode { attr: attr.clone(), parent: *parent })? + name(*parent, n, attr.ino)? + target
            }
            Op::Namespace(NamespaceOp::Link { parent, name: n, ino, .. }) => name(*parent, n, *ino)?,
            // Which inodes the names will hold is not known yet; the number does not change
            // a name record's size.
            Op::Namespace(NamespaceOp::Rename { from_parent, from_name, to_parent, to_name, .. }) => {
                name(*to_parent, to_name, Ino::ROOT)? + name(*from_parent, from_name, Ino::ROOT)?
            }
            Op::Namespace(NamespaceOp::SetXattr { ino, name: n, value: Some(value), .. }) => {
                lines(Record::Xattr { ino: *ino, name: n.clone(), value: value.clone() })?
            }
            _ => 0,
        };
    }
    // A chunk's entries after the ops: its blocks' map ops over the entries it has now.
    // A truncate only removes entries, so keeping the current ones over-counts it.
    let mut edits: BTreeMap<(Ino, u64), Option<&BlockEntry>> = BTreeMap::new();
    for op in ops {
        if let Op::Data(DataOp::Map { ino, lblock, entry }) = op {
            edits.insert((*ino, *lblock), entry.as_ref());
        }
    }
    for (ino, chunk) in chunks {
        let mut entries: BTreeMap<u64, BlockEntry> =
            meta.get(ino).map(|inode| chunk_entries(&inode.map.lock(), chunk).collect()).unwrap_or_default();
        let first = chunk * MAP_CHUNK;
        for (&(_, lblock), entry) in edits.range((ino, first)..(ino, first + MAP_CHUNK)) {
            match entry {
                Some(entry) => entries.insert(lblock, (*entry).clone()),
                None => entries.remove(&lblock),
            };
        }
        if !entries.is_empty() {
            wanted += lines(Record::Map { ino, chunk, entries: entries.into_iter().collect() })?;
        }
    }
    Some(wanted)
}

impl MetaStore for LineStore {
    fn name(&self) -> &'static str {
        "in place"
    }

    fn commit(&mut self, cx: &CommitContext<'_>, ops: &[Op], apply: &mut dyn FnMut() -> Freed) -> Result<Freed> {
        if self.failed {
            return Err(Error::io(
                format!("in-place metadata on {}", self.device),
                std::io::Error::other("an earlier commit failed; reopen the volume"),
            ));
        }
        // The records a commit writes must fit before its ops apply: applied ops cannot be
        // taken back, so a commit that ran out of lines halfway would leave the memory
        // ahead of the device. The last 1/32 of the area is kept for commits that only
        // release space.
        let touched = Touched::keys(cx.meta, ops);
        let reserve = if ops.iter().all(Op::releases_space) { 0 } else { (self.shape.total_lines - self.shape.first_record) / 32 };
        let room = self.free_lines().saturating_sub(reserve);
        let Some(wanted) = lines_wanted_at_most(cx.meta, ops, &touched, room) else {
            return Err(Error::MetadataFull("a metadata record of this commit would exceed 65,535 bytes".into()));
        };
        if wanted > room {
            return Err(Error::MetadataFull(format!(
                "a commit that may need {wanted} metadata lines, with {} free ({reserve} of them kept for deletes)",
                self.free_lines()
            )));
        }
        let freed = apply();
        let written = self.write_touched(cx.meta, &touched).and_then(|()| self.persist(Some(cx.stats)));
        if written.is_err() {
            self.failed = true;
        }
        written.map(|()| freed)
    }

    fn wants_checkpoint(&self) -> bool {
        false
    }

    /// Nothing to fold: the counters are saved, for the next open, and block-only the
    /// redo area is cleared (every commit in it is in place), so a clean close leaves
    /// nothing to replay.
    fn checkpoint(&mut self, cx: &CommitContext<'_>) -> Result<()> {
        if self.failed {
            return Ok(());
        }
        self.put(Record::Counters(cx.stats.all()))?;
        self.persist(None)?;
        if self.byte.is_none() {
            self.clear_redo()?;
        }
        Ok(())
    }

    fn usage(&self) -> MetaUsage {
        MetaUsage {
            log_used_bytes: self.used_lines * LINE as u64,
            log_capacity_bytes: (self.shape.total_lines - self.shape.first_record) * LINE as u64,
            ..MetaUsage::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::SimSsd;
    use crate::map::{BlockEntry, SsdBlock};
    use crate::meta::Attr;

    const UUID: [u8; 16] = [3; 16];

    fn add(state: &MetaState, ino: u64, kind: FileKind, parent: Ino, name: &[u8]) -> Arc<Inode> {
        let attr = Attr { ino: Ino(ino), kind, perm: 0o640, uid: 7, gid: 8, nlink: 1, size: 0, rdev: 0, atime: 1, mtime: 2, ctime: 3 };
        let data = InodeData { attr, entries: BTreeMap::new(), parent, target: Vec::new(), xattrs: BTreeMap::new() };
        state.insert(Inode::new(data, FileMap::new()));
        state.get(parent).unwrap().data.lock().entries.insert(name.to_vec(), Ino(ino));
        state.get(Ino(ino)).unwrap()
    }

    fn sample() -> MetaState {
        let state = MetaState::fresh(0, 0, 5);
        add(&state, 2, FileKind::Dir, Ino::ROOT, b"dir");
        let file = add(&state, 3, FileKind::File, Ino(2), &[b'f'; 255]);
        for lblock in [0, 1, 2, 3, 4, 9, 1000] {
            file.map.lock().insert(lblock, BlockEntry::Ssd { block: SsdBlock(100 + lblock), overlays: vec![], shared: false });
        }
        file.data.lock().attr.size = 1001 * 4096;
        file.data.lock().xattrs.insert(b"user.a".to_vec(), vec![9; 3000]);
        add(&state, 4, FileKind::Symlink, Ino::ROOT, b"link").data.lock().target = b"dir/ffff".to_vec();
        state
    }

    fn describe(state: &MetaState) -> Vec<String> {
        state
            .snapshot()
            .iter()
            .map(|i| {
                let d = i.data.lock();
                format!("{:?} {:?} {:?} {:?} {:?} {:?}", d.attr, d.parent, d.entries, d.target, d.xattrs, i.map.lock())
            })
            .collect()
    }

    #[test]
    fn an_image_reads_back_its_state() {
        let state = sample();
        let image = LineStore::image_of(&state, UUID, 64 << 10).unwrap();
        let loaded = parse_image(&image, UUID, 1, 4096).unwrap();
        assert_eq!(describe(&loaded.state), describe(&state));
        assert_eq!(loaded.state.next_ino.load(Ordering::SeqCst), 5);
        assert!(loaded.orphans.is_empty());
        assert!(matches!(parse_image(&image, [4; 16], 1, 4096), Err(Error::Corrupt { .. })), "another volume's area");
    }

    /// A used line no record covers, or a record with a line marked free, is refused.
    #[test]
    fn the_bitmap_and_the_records_must_agree() {
        let image = LineStore::image_of(&sample(), UUID, 64 << 10).unwrap();
        let shape = Shape::of(image.len() as u64);
        let used: Vec<u64> = (shape.first_record..shape.total_lines).filter(|&l| shape.is_used(&image, l)).collect();
        let last = *used.last().unwrap();
        for (line, set) in [(last + 1, true), (used[1], false)] {
            let mut bad = image.clone();
            let (byte, mask) = shape.bit(line);
            bad[byte] = if set { bad[byte] | mask } else { bad[byte] & !mask };
            assert!(matches!(parse_image(&bad, UUID, 1, 4096), Err(Error::Corrupt { .. })), "line {line} set {set}");
        }
    }

    /// A commit of more than 119 sectors has a sector list past the header sector's first
    /// 512 bytes. A header torn there (new count and checksum, an older commit's list) is
    /// ignored, not replayed into the wrong sectors.
    #[test]
    fn a_redo_header_torn_inside_its_list_is_ignored() {
        const AREA: u64 = 2 << 20;
        let layout = MetaLayout {
            checkpoint_bytes: AREA / 2,
            checkpoint_a_offset: 0,
            checkpoint_b_offset: AREA / 2,
            journal_offset: AREA,
            journal_bytes: AREA,
            pages_offset: 2 * AREA,
            page_count: 0,
        };
        let ssd: Arc<dyn BlockDevice> = Arc::new(SimSsd::new(2 * AREA));
        let mut store = LineStore::empty(Arc::clone(&ssd), None, &layout, UUID, "test".into());
        let evens: Vec<u64> = (0..200).map(|i| 2 * i).collect();
        let odds: Vec<u64> = (0..200).map(|i| 2 * i + 1).collect();
        let header = |ssd: &Arc<dyn BlockDevice>| {
            let request = IoRequest { op: IoOp::Read, offset_bytes: AREA, buf: AlignedBuf::zeroed(SECTOR) };
            run_batch(ssd.as_ref(), vec![request]).unwrap().pop().unwrap()
        };
        store.mirror.fill(1);
        store.write_through_redo(&evens).unwrap();
        let older = header(&ssd);
        store.mirror.fill(2);
        store.write_through_redo(&odds).unwrap();
        let newer = header(&ssd);

        let replayed_after = |head: &[u8]| {
            let mut buf = AlignedBuf::zeroed(SECTOR);
            buf.copy_from_slice(head);
            run_batch(ssd.as_ref(), vec![IoRequest { op: IoOp::Write, offset_bytes: AREA, buf }]).unwrap();
            let mut fresh = LineStore::empty(Arc::clone(&ssd), None, &layout, UUID, "test".into());
            fresh.replay_redo(true).unwrap().into_iter().collect::<Vec<_>>()
        };
        assert_eq!(replayed_after(&newer), odds, "a whole header replays");
        let torn = [&newer[..512], &older[512..]].concat();
        assert!(replayed_after(&torn).is_empty(), "a header torn inside its list is not replayed");
    }

    /// Allocation takes the first free run after the last one, wraps around once, and says
    /// when nothing fits.
    #[test]
    fn allocation_wraps_and_reports_a_full_area() {
        let layout = MetaLayout {
            checkpoint_bytes: 4096,
            checkpoint_a_offset: 0,
            checkpoint_b_offset: 4096,
            journal_offset: 8192,
            journal_bytes: 8192,
            pages_offset: 16384,
            page_count: 0,
        };
        let mut store = LineStore::empty(Arc::new(SimSsd::new(16384)), None, &layout, UUID, "test".into());
        let record_lines = store.shape.total_lines - store.shape.first_record;
        let target = |ino: u64, len: usize| Record::Target { ino: Ino(ino), target: vec![b'x'; len] };
        // Two-line records until the area is full.
        let mut ino = 1;
        while store.put(target(ino, 100)).is_ok() {
            ino += 1;
        }
        assert_eq!(ino - 1, record_lines / 2);
        assert!(matches!(store.put(target(ino, 100)), Err(Error::MetadataFull(_))));
        // Free two neighbours and one elsewhere: a three-line record takes the pair's room.
        for i in [3, 4, 10] {
            store.remove(&Key::Object(Ino(i), Part::Target));
        }
        store.put(target(1000, 150)).unwrap();
        assert_eq!(store.index[&Key::Object(Ino(1000), Part::Target)].line, store.shape.first_record + 4);
        assert_eq!(store.used_lines, record_lines - 2 - 1);
    }
}
