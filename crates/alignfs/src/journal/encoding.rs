//! Encoding of ops and map entries (shared by journal records and checkpoints).

use crate::codec::{Decoder, Encoder, Short};
use crate::map::{BlockEntry, Chunks, Overlay, PageNo, SsdBlock};
use crate::meta::{Attr, DataOp, FileKind, Ino, NamespaceOp, Op, XATTR_NAME_MAX, XATTR_VALUE_MAX};

/// Most chunks an encoded upage holds (OrchFS's header). A profile whose upages are
/// journaled must not make larger ones; its module asserts so at compile time.
pub const MAX_ENCODED_SEGMENTS: usize = 14;

const MAX_NAME: usize = 255;

/// Map entry tags: an SSD block owned by one entry, and one a clone shares.
const SSD_TAG: u8 = 2;
const SHARED_SSD_TAG: u8 = 3;
const MAX_TARGET: usize = 4096;

pub fn encode_entry(e: &mut Encoder, entry: &BlockEntry) {
    match entry {
        BlockEntry::Fast { pages } => {
            e.u8(1).u8(pages.len() as u8);
            for (index, page) in pages {
                e.u8(*index).u64(page.0);
            }
        }
        BlockEntry::Ssd { block, overlays, shared } => {
            e.u8(if *shared { SHARED_SSD_TAG } else { SSD_TAG }).u64(block.0).u8(overlays.len() as u8);
            for (index, overlay) in overlays {
                match overlay {
                    Overlay::Page(p) => {
                        e.u8(*index).u8(0).u64(p.0);
                    }
                    Overlay::Upage { page, chunks } => {
                        e.u8(*index).u8(1).u64(page.0).u8(chunks.len() as u8);
                        for &(s, end) in chunks.ranges() {
                            e.u32(s).u32(end);
                        }
                    }
                }
            }
        }
    }
}

/// Decode an entry, checking it against the geometry (`pages_per_block`, `page_bytes`).
pub fn decode_entry(d: &mut Decoder<'_>, pages_per_block: usize, page_bytes: u32) -> Result<BlockEntry, Short> {
    let tag = d.u8()?;
    let index_ok = |i: u8, previous: Option<u8>| (i as usize) < pages_per_block && previous.is_none_or(|p| p < i);
    match tag {
        1 => {
            let n = d.u8()? as usize;
            let mut pages = Vec::with_capacity(n.min(pages_per_block));
            for _ in 0..n {
                let index = d.u8()?;
                if !index_ok(index, pages.last().map(|(i, _)| *i)) {
                    return d.fail(format!("page index {index} out of order or beyond the block"));
                }
                pages.push((index, PageNo(d.u64()?)));
            }
            Ok(BlockEntry::Fast { pages })
        }
        SSD_TAG | SHARED_SSD_TAG => {
            let block = SsdBlock(d.u64()?);
            let n = d.u8()? as usize;
            let mut overlays: Vec<(u8, Overlay)> = Vec::with_capacity(n.min(pages_per_block));
            for _ in 0..n {
                let index = d.u8()?;
                if !index_ok(index, overlays.last().map(|(i, _)| *i)) {
                    return d.fail(format!("overlay index {index} out of order or beyond the block"));
                }
                let overlay = match d.u8()? {
                    0 => Overlay::Page(PageNo(d.u64()?)),
                    1 => {
                        let page = PageNo(d.u64()?);
                        let count = d.u8()? as usize;
                        if count == 0 || count > MAX_ENCODED_SEGMENTS {
                            return d.fail(format!("upage with {count} chunks"));
                        }
                        let mut ranges = Vec::with_capacity(count);
                        for _ in 0..count {
                            ranges.push((d.u32()?, d.u32()?));
                        }
                        match Chunks::from_ranges(ranges, page_bytes) {
                            Some(chunks) => Overlay::Upage { page, chunks },
                            None => return d.fail("upage chunks overlap, are unordered or leave the page"),
                        }
                    }
                    kind => return d.fail(format!("unknown overlay kind {kind}")),
                };
                overlays.push((index, overlay));
            }
            Ok(BlockEntry::Ssd { block, overlays, shared: tag == SHARED_SSD_TAG })
        }
        other => d.fail(format!("unknown map entry tag {other}")),
    }
}

pub fn encode_attr(e: &mut Encoder, a: &Attr) {
    e.u64(a.ino.0).u8(a.kind as u8).u16(a.perm).u32(a.uid).u32(a.gid).u32(a.nlink).u64(a.size).u32(a.rdev);
    e.i64(a.atime).i64(a.mtime).i64(a.ctime);
}

pub fn decode_attr(d: &mut Decoder<'_>) -> Result<Attr, Short> {
    let ino = Ino(d.u64()?);
    let code = d.u8()?;
    let Some(kind) = FileKind::from_code(code) else { return d.fail(format!("unknown file kind {code}")) };
    Ok(Attr {
        ino,
        kind,
        perm: d.u16()?,
        uid: d.u32()?,
        gid: d.u32()?,
        nlink: d.u32()?,
        size: d.u64()?,
        rdev: d.u32()?,
        atime: d.i64()?,
        mtime: d.i64()?,
        ctime: d.i64()?,
    })
}

fn opt<T: Copy>(e: &mut Encoder, v: Option<T>, put: impl Fn(&mut Encoder, T)) {
    match v {
        Some(v) => {
            e.u8(1);
            put(e, v);
        }
        None => {
            e.u8(0);
        }
    }
}

fn read_opt<T>(d: &mut Decoder<'_>, get: impl Fn(&mut Decoder<'_>) -> Result<T, Short>) -> Result<Option<T>, Short> {
    match d.u8()? {
        0 => Ok(None),
        1 => Ok(Some(get(d)?)),
        other => d.fail(format!("bad option tag {other}")),
    }
}

pub fn encode_ops(ops: &[Op]) -> Vec<u8> {
    // Enough for a write's ops (a map edit or two and a size) without growing.
    let mut e = Encoder::with_capacity(256);
    e.u32(ops.len() as u32);
    for op in ops {
        match op {
            Op::Namespace(NamespaceOp::Create { parent, name, attr, target }) => {
                e.u8(1).u64(parent.0).blob(name);
                encode_attr(&mut e, attr);
                e.blob(target);
            }
            Op::Namespace(NamespaceOp::Link { parent, name, ino, time }) => {
                e.u8(2).u64(parent.0).blob(name).u64(ino.0).i64(*time);
            }
            Op::Namespace(NamespaceOp::Unlink { parent, name, time }) => {
                e.u8(3).u64(parent.0).blob(name).i64(*time);
            }
            Op::Namespace(NamespaceOp::Rename { from_parent, from_name, to_parent, to_name, exchange, time }) => {
                e.u8(4).u64(from_parent.0).blob(from_name).u64(to_parent.0).blob(to_name).u8(u8::from(*exchange)).i64(*time);
            }
            Op::Namespace(NamespaceOp::SetAttr { ino, perm, uid, gid, atime, mtime, ctime }) => {
                e.u8(5).u64(ino.0);
                opt(&mut e, *perm, |e, v| {
                    e.u16(v);
                });
                opt(&mut e, *uid, |e, v| {
                    e.u32(v);
                });
                opt(&mut e, *gid, |e, v| {
                    e.u32(v);
                });
                opt(&mut e, *atime, |e, v| {
                    e.i64(v);
                });
                opt(&mut e, *mtime, |e, v| {
                    e.i64(v);
                });
                e.i64(*ctime);
            }
            Op::Data(DataOp::SetSize { ino, size, time }) => {
                e.u8(6).u64(ino.0).u64(*size).i64(*time);
            }
            Op::Data(DataOp::Extend { ino, size, mtime }) => {
                e.u8(7).u64(ino.0).u64(*size).i64(*mtime);
            }
            Op::Data(DataOp::Map { ino, lblock, entry }) => {
                e.u8(8).u64(ino.0).u64(*lblock);
                match entry {
                    Some(entry) => {
                        e.u8(1);
                        encode_entry(&mut e, entry);
                    }
                    None => {
                        e.u8(0);
                    }
                }
            }
            Op::Namespace(NamespaceOp::Free { ino }) => {
                e.u8(9).u64(ino.0);
            }
            Op::Namespace(NamespaceOp::SetXattr { ino, name, value, ctime }) => {
                e.u8(10).u64(ino.0).blob(name);
                match value {
                    Some(value) => e.u8(1).blob(value),
                    None => e.u8(0),
                };
                e.i64(*ctime);
            }
        }
    }
    e.bytes
}

fn name(d: &mut Decoder<'_>) -> Result<Vec<u8>, Short> {
    let n = d.blob(MAX_NAME)?;
    if n.is_empty() || n.contains(&b'/') || n.contains(&0) || n == b"." || n == b".." {
        return d.fail("invalid file name");
    }
    Ok(n.to_vec())
}

/// An extended attribute name: 1–255 bytes, no NUL.
pub fn xattr_name(d: &mut Decoder<'_>) -> Result<Vec<u8>, Short> {
    let n = d.blob(XATTR_NAME_MAX)?;
    if n.is_empty() || n.contains(&0) {
        return d.fail("invalid extended attribute name");
    }
    Ok(n.to_vec())
}

pub fn decode_ops(bytes: &[u8], pages_per_block: usize, page_bytes: u32) -> Result<Vec<Op>, Short> {
    let mut d = Decoder::new(bytes);
    let count = d.u32()? as usize;
    if count > bytes.len() {
        return d.fail(format!("{count} ops cannot fit in {} bytes", bytes.len()));
    }
    let mut ops = Vec::with_capacity(count);
    for _ in 0..count {
        let op = match d.u8()? {
            1 => Op::Namespace(NamespaceOp::Create {
                parent: Ino(d.u64()?),
                name: name(&mut d)?,
                attr: decode_attr(&mut d)?,
                target: d.blob(MAX_TARGET)?.to_vec(),
            }),
            2 => Op::Namespace(NamespaceOp::Link { parent: Ino(d.u64()?), name: name(&mut d)?, ino: Ino(d.u64()?), time: d.i64()? }),
            3 => Op::Namespace(NamespaceOp::Unlink { parent: Ino(d.u64()?), name: name(&mut d)?, time: d.i64()? }),
            4 => Op::Namespace(NamespaceOp::Rename {
                from_parent: Ino(d.u64()?),
                from_name: name(&mut d)?,
                to_parent: Ino(d.u64()?),
                to_name: name(&mut d)?,
                exchange: d.u8()? != 0,
                time: d.i64()?,
            }),
            5 => Op::Namespace(NamespaceOp::SetAttr {
                ino: Ino(d.u64()?),
                perm: read_opt(&mut d, |d| d.u16())?,
                uid: read_opt(&mut d, |d| d.u32())?,
                gid: read_opt(&mut d, |d| d.u32())?,
                atime: read_opt(&mut d, |d| d.i64())?,
                mtime: read_opt(&mut d, |d| d.i64())?,
                ctime: d.i64()?,
            }),
            6 => Op::Data(DataOp::SetSize { ino: Ino(d.u64()?), size: d.u64()?, time: d.i64()? }),
            7 => Op::Data(DataOp::Extend { ino: Ino(d.u64()?), size: d.u64()?, mtime: d.i64()? }),
            8 => {
                let ino = Ino(d.u64()?);
                let lblock = d.u64()?;
                let entry = read_opt(&mut d, |d| decode_entry(d, pages_per_block, page_bytes))?;
                Op::Data(DataOp::Map { ino, lblock, entry })
            }
            9 => Op::Namespace(NamespaceOp::Free { ino: Ino(d.u64()?) }),
            10 => Op::Namespace(NamespaceOp::SetXattr {
                ino: Ino(d.u64()?),
                name: xattr_name(&mut d)?,
                value: read_opt(&mut d, |d| Ok(d.blob(XATTR_VALUE_MAX)?.to_vec()))?,
                ctime: d.i64()?,
            }),
            other => return d.fail(format!("unknown op tag {other}")),
        };
        ops.push(op);
    }
    if d.remaining() != 0 {
        return d.fail(format!("{} trailing bytes after the ops", d.remaining()));
    }
    Ok(ops)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ops_round_trip() {
        let attr = Attr {
            ino: Ino(5),
            kind: FileKind::File,
            perm: 0o644,
            uid: 1,
            gid: 2,
            nlink: 1,
            size: 0,
            rdev: 0,
            atime: 1,
            mtime: 2,
            ctime: 3,
        };
        let ops = vec![
            Op::Namespace(NamespaceOp::Create { parent: Ino(1), name: b"a".to_vec(), attr, target: vec![] }),
            Op::Namespace(NamespaceOp::Link { parent: Ino(1), name: b"b".to_vec(), ino: Ino(5), time: 9 }),
            Op::Namespace(NamespaceOp::Rename {
                from_parent: Ino(1),
                from_name: b"b".to_vec(),
                to_parent: Ino(1),
                to_name: b"c".to_vec(),
                exchange: true,
                time: 10,
            }),
            Op::Namespace(NamespaceOp::SetAttr {
                ino: Ino(5),
                perm: Some(0o600),
                uid: None,
                gid: Some(7),
                atime: None,
                mtime: Some(4),
                ctime: 11,
            }),
            Op::Data(DataOp::Map {
                ino: Ino(5),
                lblock: 3,
                entry: Some(BlockEntry::Ssd {
                    shared: false,
                    block: SsdBlock(9),
                    overlays: vec![
                        (1, Overlay::Page(PageNo(3))),
                        (4, Overlay::Upage { page: PageNo(4), chunks: Chunks::single(10, 20).with(30, 40) }),
                    ],
                }),
            }),
            Op::Data(DataOp::Map { ino: Ino(5), lblock: 4, entry: Some(BlockEntry::Fast { pages: vec![(0, PageNo(1)), (7, PageNo(2))] }) }),
            Op::Data(DataOp::Map { ino: Ino(5), lblock: 5, entry: None }),
            Op::Data(DataOp::Extend { ino: Ino(5), size: 100, mtime: 12 }),
            Op::Data(DataOp::SetSize { ino: Ino(5), size: 50, time: 13 }),
            Op::Namespace(NamespaceOp::Unlink { parent: Ino(1), name: b"c".to_vec(), time: 14 }),
            Op::Namespace(NamespaceOp::Free { ino: Ino(5) }),
        ];
        let bytes = encode_ops(&ops);
        assert_eq!(decode_ops(&bytes, 8, 4096).unwrap(), ops);
        for cut in 0..bytes.len() {
            assert!(decode_ops(&bytes[..cut], 8, 4096).is_err(), "truncated at {cut}");
        }
    }
}
