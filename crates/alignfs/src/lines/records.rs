//! In-place metadata records: each one a run of 64-byte lines. Byte table:
//! docs/format/lines.md.
//!
//! A record starts with a 5-byte header (tag u8 | lines u16 | payload length u16), then its
//! payload; the rest of its last line is zeros. An inode's record is two lines: the first
//! (the hot half) holds what a write changes (size, times, mode, link count), so that a
//! write stores that one line.

use crate::codec::{Decoder, Encoder, Short};
use crate::journal::{decode_entry, encode_entry};
use crate::map::BlockEntry;
use crate::meta::{Attr, FileKind, Ino, XATTR_NAME_MAX, XATTR_VALUE_MAX};

pub const LINE: usize = 64;
pub const HEADER_BYTES: usize = 5;
/// Logical blocks per map record: four entries without residue fit one line.
pub const MAP_CHUNK: u64 = 4;
/// Payload bytes of an inode record's first line.
const HOT_BYTES: usize = LINE - HEADER_BYTES;

const TAG_INODE: u8 = 1;
const TAG_NAME: u8 = 2;
const TAG_MAP: u8 = 3;
const TAG_TARGET: u8 = 4;
const TAG_XATTR: u8 = 5;
const TAG_COUNTERS: u8 = 6;

/// What a record is about. Ordered so that an object's records are one range.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Key {
    Object(Ino, Part),
    Counters,
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Part {
    Inode,
    Target,
    Xattr(Vec<u8>),
    /// Logical blocks `chunk * MAP_CHUNK ..` of a file.
    Map(u64),
    /// An entry of this directory.
    Name(Vec<u8>),
}

/// A decoded record.
#[derive(Clone, Debug, PartialEq)]
pub enum Record {
    Inode { attr: Attr, parent: Ino },
    Name { parent: Ino, name: Vec<u8>, child: Ino },
    Map { ino: Ino, chunk: u64, entries: Vec<(u64, BlockEntry)> },
    Target { ino: Ino, target: Vec<u8> },
    Xattr { ino: Ino, name: Vec<u8>, value: Vec<u8> },
    Counters(Vec<u64>),
}

impl Record {
    pub fn key(&self) -> Key {
        match self {
            Record::Inode { attr, .. } => Key::Object(attr.ino, Part::Inode),
            Record::Name { parent, name, .. } => Key::Object(*parent, Part::Name(name.clone())),
            Record::Map { ino, chunk, .. } => Key::Object(*ino, Part::Map(*chunk)),
            Record::Target { ino, .. } => Key::Object(*ino, Part::Target),
            Record::Xattr { ino, name, .. } => Key::Object(*ino, Part::Xattr(name.clone())),
            Record::Counters(_) => Key::Counters,
        }
    }

    /// The most lines a record can have: its length is a `u16` count of payload bytes.
    pub const MAX_LINES: u64 = (HEADER_BYTES + u16::MAX as usize).div_ceil(LINE) as u64;

    /// The record's lines, header first, zero-padded to whole lines. `None` if it is
    /// longer than a record may be (only a map chunk whose blocks all carry many residue
    /// units comes near; its limit is 64 KiB).
    pub fn encode(&self) -> Option<Vec<u8>> {
        let mut e = Encoder::new();
        let tag = match self {
            Record::Inode { attr, parent } => {
                e.u64(attr.ino.0).u64(attr.size).i64(attr.atime).i64(attr.mtime).i64(attr.ctime).u16(attr.perm).u32(attr.nlink);
                e.bytes.resize(HOT_BYTES, 0);
                e.u8(attr.kind as u8).u32(attr.uid).u32(attr.gid).u32(attr.rdev).u64(parent.0);
                TAG_INODE
            }
            Record::Name { parent, name, child } => {
                e.u64(parent.0).u64(child.0).u8(u8::try_from(name.len()).ok()?).raw(name);
                TAG_NAME
            }
            Record::Map { ino, chunk, entries } => {
                e.u64(ino.0).u64(*chunk);
                let mut mask = 0u8;
                for (lblock, _) in entries {
                    let at = lblock.checked_sub(chunk * MAP_CHUNK).filter(|&i| i < MAP_CHUNK)?;
                    mask |= 1 << at;
                }
                e.u8(mask);
                for (_, entry) in entries {
                    encode_entry(&mut e, entry);
                }
                TAG_MAP
            }
            Record::Target { ino, target } => {
                e.u64(ino.0).raw(target);
                TAG_TARGET
            }
            Record::Xattr { ino, name, value } => {
                e.u64(ino.0).u8(u8::try_from(name.len()).ok()?).raw(name).raw(value);
                TAG_XATTR
            }
            Record::Counters(values) => {
                for v in values {
                    e.u64(*v);
                }
                TAG_COUNTERS
            }
        };
        let payload = u16::try_from(e.bytes.len()).ok()?;
        let lines = (HEADER_BYTES + e.bytes.len()).div_ceil(LINE);
        let mut out = Vec::with_capacity(lines * LINE);
        out.push(tag);
        out.extend_from_slice(&u16::try_from(lines).ok()?.to_le_bytes());
        out.extend_from_slice(&payload.to_le_bytes());
        out.extend_from_slice(&e.bytes);
        out.resize(lines * LINE, 0);
        Some(out)
    }

    /// The number of lines the record starting with `head` (its first line) says it has.
    pub fn lines_of(head: &[u8]) -> Result<usize, Short> {
        let mut d = Decoder::new(head);
        let tag = d.u8()?;
        let lines = usize::from(d.u16()?);
        if !(TAG_INODE..=TAG_COUNTERS).contains(&tag) {
            return d.fail(format!("unknown record tag {tag}"));
        }
        if lines == 0 {
            return d.fail("a record of no lines");
        }
        Ok(lines)
    }

    /// Decode the record in `bytes` (exactly its lines), checking it against the geometry.
    pub fn decode(bytes: &[u8], pages_per_block: usize, page_bytes: u32) -> Result<Record, Short> {
        let mut d = Decoder::new(bytes);
        let tag = d.u8()?;
        let lines = usize::from(d.u16()?);
        let len = usize::from(d.u16()?);
        if lines * LINE != bytes.len() || (HEADER_BYTES + len).div_ceil(LINE) != lines {
            return d.fail(format!("{len} payload bytes do not fill {lines} lines"));
        }
        let payload = &bytes[HEADER_BYTES..HEADER_BYTES + len];
        if bytes[HEADER_BYTES + len..].iter().any(|&b| b != 0) {
            return Decoder::new(bytes).fail("bytes after the payload are not zeros");
        }
        let mut d = Decoder::new(payload);
        let record = match tag {
            TAG_INODE => {
                let (ino, size, atime, mtime, ctime, perm, nlink) = (d.u64()?, d.u64()?, d.i64()?, d.i64()?, d.i64()?, d.u16()?, d.u32()?);
                if d.take(HOT_BYTES - d.position())?.iter().any(|&b| b != 0) {
                    return d.fail("the hot line's padding is not zeros");
                }
                let code = d.u8()?;
                let Some(kind) = FileKind::from_code(code) else { return d.fail(format!("unknown file kind {code}")) };
                let (uid, gid, rdev, parent) = (d.u32()?, d.u32()?, d.u32()?, Ino(d.u64()?));
                let attr = Attr { ino: Ino(ino), kind, perm, uid, gid, nlink, size, rdev, atime, mtime, ctime };
                Record::Inode { attr, parent }
            }
            TAG_NAME => {
                let (parent, child, n) = (Ino(d.u64()?), Ino(d.u64()?), usize::from(d.u8()?));
                let name = d.take(n)?.to_vec();
                if name.is_empty() || name.contains(&b'/') || name.contains(&0) {
                    return d.fail("not a file name");
                }
                Record::Name { parent, name, child }
            }
            TAG_MAP => {
                let (ino, chunk, mask) = (Ino(d.u64()?), d.u64()?, d.u8()?);
                if mask == 0 || u64::from(mask) >> MAP_CHUNK != 0 || chunk.checked_mul(MAP_CHUNK).is_none() {
                    return d.fail(format!("map chunk {chunk} with block mask {mask:#x}"));
                }
                let mut entries = Vec::new();
                for at in (0..MAP_CHUNK).filter(|at| mask & (1 << at) != 0) {
                    entries.push((chunk * MAP_CHUNK + at, decode_entry(&mut d, pages_per_block, page_bytes)?));
                }
                Record::Map { ino, chunk, entries }
            }
            TAG_TARGET => {
                let ino = Ino(d.u64()?);
                let target = d.take(d.remaining())?.to_vec();
                Record::Target { ino, target }
            }
            TAG_XATTR => {
                let (ino, n) = (Ino(d.u64()?), usize::from(d.u8()?));
                let name = d.take(n)?.to_vec();
                let value = d.take(d.remaining())?.to_vec();
                if name.is_empty() || name.len() > XATTR_NAME_MAX || value.len() > XATTR_VALUE_MAX {
                    return d.fail("an extended attribute beyond the limits");
                }
                Record::Xattr { ino, name, value }
            }
            TAG_COUNTERS => {
                if payload.len() % 8 != 0 {
                    return d.fail("counters are not whole u64s");
                }
                Record::Counters((0..payload.len() / 8).map(|_| d.u64()).collect::<Result<_, _>>()?)
            }
            other => return d.fail(format!("unknown record tag {other}")),
        };
        if d.remaining() != 0 {
            return d.fail(format!("{} bytes left over", d.remaining()));
        }
        Ok(record)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::map::{Overlay, PageNo, SsdBlock};

    fn attr(ino: u64) -> Attr {
        Attr {
            ino: Ino(ino),
            kind: FileKind::File,
            perm: 0o644,
            uid: 1000,
            gid: 100,
            nlink: 1,
            size: 12345,
            rdev: 0,
            atime: 1,
            mtime: 2,
            ctime: 3,
        }
    }

    fn round_trip(record: &Record) -> Vec<u8> {
        let bytes = record.encode().unwrap();
        assert_eq!(bytes.len() % LINE, 0);
        assert_eq!(Record::lines_of(&bytes[..LINE]).unwrap() * LINE, bytes.len());
        assert_eq!(&Record::decode(&bytes, 1, 4096).unwrap(), record);
        bytes
    }

    #[test]
    fn every_kind_reads_back() {
        round_trip(&Record::Name { parent: Ino(1), name: vec![b'n'; 255], child: Ino(9) });
        round_trip(&Record::Target { ino: Ino(4), target: b"../somewhere".to_vec() });
        round_trip(&Record::Xattr { ino: Ino(4), name: b"user.a".to_vec(), value: vec![7; XATTR_VALUE_MAX] });
        round_trip(&Record::Counters(vec![1, 2, 3]));
        let overlay = BlockEntry::Ssd { block: SsdBlock(9), overlays: vec![(0, Overlay::Page(PageNo(3)))], shared: false };
        round_trip(&Record::Map { ino: Ino(5), chunk: 3, entries: vec![(12, overlay), (15, BlockEntry::Fast { pages: vec![] })] });
    }

    /// A write changes an inode's size and mtime: only its first line.
    #[test]
    fn an_inode_keeps_what_a_write_changes_in_its_first_line() {
        let before = round_trip(&Record::Inode { attr: attr(7), parent: Ino(1) });
        assert_eq!(before.len(), 2 * LINE);
        let after = Record::Inode { attr: Attr { size: 99_999, mtime: 77, ctime: 78, ..attr(7) }, parent: Ino(1) }.encode().unwrap();
        assert_ne!(before[..LINE], after[..LINE]);
        assert_eq!(before[LINE..], after[LINE..]);
    }

    /// Four blocks without residue take one line.
    #[test]
    fn a_map_chunk_of_whole_blocks_is_one_line() {
        let entries = (8..12).map(|l| (l, BlockEntry::Ssd { block: SsdBlock(1000 + l), overlays: vec![], shared: l == 9 })).collect();
        assert_eq!(round_trip(&Record::Map { ino: Ino(u64::MAX / 2), chunk: 2, entries }).len(), LINE);
    }

    #[test]
    fn damaged_records_are_refused() {
        let good = Record::Name { parent: Ino(1), name: b"a".to_vec(), child: Ino(2) }.encode().unwrap();
        for (at, value) in [(0, 0u8), (0, 99), (1, 2), (3, 200), (22, b'/'), (40, 1)] {
            let mut bad = good.clone();
            bad[at] = value;
            assert!(Record::decode(&bad, 1, 4096).is_err(), "byte {at} = {value}");
        }
        let outside = Record::Map { ino: Ino(2), chunk: 1, entries: vec![(0, BlockEntry::Fast { pages: vec![] })] };
        assert!(outside.encode().is_none(), "a block outside its chunk");
    }
}
