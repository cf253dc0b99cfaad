//! An area image read back: its header, bitmap and records parsed into the state they hold.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

pub use records::{Key, Record, LINE};

use crate::codec::{crc32c, Decoder};
use crate::error::{Error, Result};
use crate::geometry::MetaLayout;
use crate::map::FileMap;
use crate::meta::{FileKind, Ino, Inode, InodeData, MetaState};

use super::*;

impl LineStore {
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
}

/// Where the bitmap and the records are in an area of a given size.
#[derive(Clone, Copy, Debug)]
pub(super) struct Shape {
    pub(super) total_lines: u64,
    pub(super) first_record: u64,
}

impl Shape {
    pub(super) fn of(area_bytes: u64) -> Shape {
        let total_lines = area_bytes / LINE as u64;
        // Line 0 is the header; each bitmap line covers BITS_PER_LINE record lines.
        Shape { total_lines, first_record: 1 + (total_lines - 1).div_ceil(BITS_PER_LINE + 1) }
    }

    /// The byte of the mirror holding `line`'s bit, and the bit.
    pub(super) fn bit(&self, line: u64) -> (usize, u8) {
        let i = line - self.first_record;
        (LINE + (i / 8) as usize, 1 << (i % 8))
    }

    pub(super) fn is_used(&self, mirror: &[u8], line: u64) -> bool {
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
pub(super) struct Image<'a> {
    pub(super) mirror: &'a [u8],
    pub(super) shape: Shape,
    pub(super) uuid: [u8; 16],
    pub(super) device: &'a str,
    pub(super) base: u64,
}

/// What parsing an area found.
pub(super) struct Parsed {
    pub(super) index: BTreeMap<Key, Run>,
    pub(super) used_lines: u64,
    pub(super) next_ino: u64,
    pub(super) loaded: LoadedLines,
}

impl Image<'_> {
    pub(super) fn corrupt(&self, line: u64, problem: impl Into<String>) -> Error {
        Error::corrupt("in-place metadata", self.device, self.base + line * LINE as u64, problem)
    }

    /// The next inode number the header holds, once it checks out.
    pub(super) fn header(&self) -> Result<u64> {
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
    pub(super) fn parse(&self, pages_per_block: usize, page_bytes: u32) -> Result<Parsed> {
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

    pub(super) fn build(&self, records: Vec<(u64, Record)>, next_ino: u64) -> Result<LoadedLines> {
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
