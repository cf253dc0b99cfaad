//! Cloning a file's data by sharing its SSD blocks (no data copied): the object store's
//! CopyObject and multipart completion, and what a future FICLONE would use.
//!
//! The source's residue is merged into whole blocks first, since residue units belong to
//! one map entry; then every block is marked shared in both maps and counted once more in
//! the allocator. No write changes a shared block in place, so either file's next write
//! to a shared block goes to a new block and drops one reference.

use super::{eof, migrate, resize};
use std::sync::Arc;

use super::write::MAX_FILE_BYTES;
use super::{Engine, MAP_OPS_PER_RECORD};
use crate::error::{CloneProblem, Error, Result};
use crate::map::BlockEntry;
use crate::meta::{now_ns, DataOp, Ino, Inode, Op};
use crate::stats::Counter;

/// Make `dst` a copy of `src` (size and data) that shares `src`'s SSD blocks. Both are
/// regular files; `dst`'s old data is dropped. A clone of more than
/// [`MAP_OPS_PER_RECORD`] blocks commits in several records, the target's size first,
/// so a crash leaves it reading zeros where blocks were not shared yet.
pub(super) fn clone_file(engine: &Engine, src: Ino, dst: Ino) -> Result<()> {
    with_both_locked(engine, src, dst, |source, target| {
        resize::truncate_locked(engine, target, 0)?;
        clone_locked(engine, source, target, 0)
    })
}

/// Put a copy of `src` at `offset` of `dst`, sharing `src`'s SSD blocks: `dst` grows
/// to `offset` + `src`'s size. `offset` must be a multiple of the block size, at or
/// past the end of `dst` (nothing of `dst` is replaced). Returns the bytes cloned. A
/// multipart upload's parts become its object this way.
pub(super) fn clone_into(engine: &Engine, src: Ino, dst: Ino, offset: u64) -> Result<u64> {
    let block = engine.geometry.block();
    if offset % block != 0 {
        return Err(Error::BadClone(CloneProblem::Unaligned { offset, block }));
    }
    with_both_locked(engine, src, dst, |source, target| {
        if target.size() > offset || target.map.lock().range(offset / block..).next().is_some() {
            return Err(Error::BadClone(CloneProblem::WouldReplace(offset)));
        }
        if offset.checked_add(source.size()).is_none_or(|end| end > MAX_FILE_BYTES) {
            return Err(Error::FileTooLarge);
        }
        clone_locked(engine, source, target, offset)?;
        Ok(source.size())
    })
}

/// Run `f` on two distinct regular files with both their whole ranges locked.
pub(super) fn with_both_locked<R>(engine: &Engine, src: Ino, dst: Ino, f: impl FnOnce(&Arc<Inode>, &Arc<Inode>) -> Result<R>) -> Result<R> {
    if src == dst {
        return Err(Error::BadClone(CloneProblem::OntoItself));
    }
    let (source, target) = (engine.file(src)?, engine.file(dst)?);
    engine.check_writable()?;
    // The lower inode first, so two clones cannot deadlock.
    let (first, second) = if src < dst { (&source, &target) } else { (&target, &source) };
    let _first = first.range.write(0, u64::MAX);
    let _second = second.range.write(0, u64::MAX);
    f(&source, &target)
}

/// Share `source`'s blocks into `target` from `offset` (a block boundary past the
/// target's data), with both files' whole ranges locked.
pub(super) fn clone_locked(engine: &Engine, source: &Arc<Inode>, target: &Arc<Inode>, offset: u64) -> Result<()> {
    // Bytes a crash left past either file's EOF must not be shared, nor exposed as the
    // target grows.
    eof::clear_stale_tail(engine, source)?;
    eof::clear_stale_tail(engine, target)?;
    migrate::merge_file_locked(engine, source, Counter::migrations_sync)?;
    let first_lblock = offset / engine.geometry.block();
    let blocks: Vec<(u64, BlockEntry)> = source.map.lock().iter().map(|(&lb, e)| (lb, e.clone())).collect();
    let time = now_ns();
    let mut ops = vec![Op::Data(DataOp::SetSize { ino: target.ino, size: offset + source.size(), time })];
    let mut shared = Vec::new();
    for (lblock, entry) in blocks {
        let Some(block) = entry.ssd_block() else { continue };
        let marked = BlockEntry::Ssd { block, overlays: Vec::new(), shared: true };
        if !entry.shared() {
            ops.push(Op::Data(DataOp::Map { ino: source.ino, lblock, entry: Some(marked.clone()) }));
        }
        ops.push(Op::Data(DataOp::Map { ino: target.ino, lblock: first_lblock + lblock, entry: Some(marked) }));
        shared.push(block);
        if ops.len() >= MAP_OPS_PER_RECORD {
            commit_shares(engine, &mut ops, &mut shared)?;
        }
    }
    commit_shares(engine, &mut ops, &mut shared)
}

/// Commit `ops` and count one more reference to each block in `shared`. Nothing else
/// can free those blocks meanwhile: the caller holds both files.
pub(super) fn commit_shares(engine: &Engine, ops: &mut Vec<Op>, shared: &mut Vec<crate::map::SsdBlock>) -> Result<()> {
    if ops.is_empty() {
        return Ok(());
    }
    let freed = engine.commit(ops)?;
    for block in shared.drain(..) {
        engine.blocks.refs.share(block.0);
    }
    engine.release_freed(freed);
    ops.clear();
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::error::CloneProblem;
    use crate::volume::test_volume as volume;
    use crate::Ino;

    fn read_all(v: &crate::Volume, f: Ino) -> Vec<u8> {
        let mut out = vec![0; v.getattr(f).unwrap().size as usize];
        assert_eq!(v.read(f, 0, &mut out).unwrap(), out.len());
        out
    }

    #[test]
    fn a_clone_shares_blocks_and_each_side_writes_apart() {
        let v = volume();
        let block = v.geometry().block() as usize;
        let a = v.create_file(Ino::ROOT, b"a", 0o644, 0, 0).unwrap().ino;
        let b = v.create_file(Ino::ROOT, b"b", 0o644, 0, 0).unwrap().ino;
        let mut data: Vec<u8> = (0..5 * block + 100).map(|i| (i % 251) as u8).collect();
        v.write(a, 0, &data).unwrap();
        v.write(a, 7, b"residue").unwrap();
        data[7..14].copy_from_slice(b"residue");
        v.write(b, 0, b"old contents of b").unwrap();
        let used = v.inner.blocks.refs.used_count();
        assert!(matches!(v.clone_file(a, a), Err(crate::Error::BadClone(CloneProblem::OntoItself))));
        assert!(matches!(v.clone_file(a, Ino::ROOT), Err(crate::Error::IsDir)));
        v.clone_file(a, b).unwrap();
        // The tail block held only residue and became an SSD block; no data was copied.
        assert_eq!(v.inner.blocks.refs.used_count(), used + 1);
        assert_eq!(read_all(&v, b), data);
        let mut other = data.clone();
        v.write(b, block as u64, &vec![9u8; block]).unwrap();
        other[block..2 * block].fill(9);
        v.write(a, 3, b"A").unwrap();
        data[3] = b'A';
        assert_eq!(read_all(&v, a), data);
        assert_eq!(read_all(&v, b), other);
        assert_eq!(v.check(), []);
        v.migrate_all().unwrap();
        v.unlink(Ino::ROOT, b"a").unwrap();
        assert_eq!(read_all(&v, b), other);
        assert_eq!(v.check(), []);
        v.unlink(Ino::ROOT, b"b").unwrap();
        assert_eq!(v.inner.blocks.refs.used_count(), 1, "every shared block freed by its last reference");
    }

    #[test]
    fn parts_cloned_into_place_share_blocks_and_read_back_concatenated() {
        let v = volume();
        let block = v.geometry().block();
        let whole = v.create_file(Ino::ROOT, b"whole", 0o644, 0, 0).unwrap().ino;
        let mut expected = Vec::new();
        for (i, len) in [3 * block, 2 * block, block / 2 + 17].into_iter().enumerate() {
            let part = v.create_file(Ino::ROOT, format!("part{i}").as_bytes(), 0o644, 0, 0).unwrap().ino;
            let data: Vec<u8> = (0..len).map(|j| (j as usize * 7 + i) as u8).collect();
            v.write(part, 0, &data).unwrap();
            let used = v.inner.blocks.refs.used_count();
            v.clone_into(part, whole, expected.len() as u64).unwrap();
            // Only a partial block held in residue is merged into a block of its own.
            assert!(v.inner.blocks.refs.used_count() <= used + 1, "part {i}: no data copied");
            expected.extend_from_slice(&data);
            assert_eq!(read_all(&v, whole), expected, "after part {i}");
        }
        let end = expected.len() as u64;
        assert!(matches!(v.clone_into(whole, whole, 0), Err(crate::Error::BadClone(CloneProblem::OntoItself))));
        let part0 = v.lookup(Ino::ROOT, b"part0").unwrap().ino;
        assert!(matches!(v.clone_into(part0, whole, block), Err(crate::Error::BadClone(CloneProblem::WouldReplace(_)))));
        assert!(matches!(v.clone_into(part0, whole, end + 1), Err(crate::Error::BadClone(CloneProblem::Unaligned { .. }))));
        assert!(matches!(v.clone_into(part0, whole, u64::MAX - block + 1), Err(crate::Error::FileTooLarge)));
        assert_eq!(read_all(&v, whole), expected, "refused clones change nothing");
        // A hole before a clone past the end reads as zeros.
        let past = end.next_multiple_of(block) + block;
        v.clone_into(part0, whole, past).unwrap();
        expected.resize(past as usize, 0);
        expected.extend_from_slice(&read_all(&v, part0));
        assert_eq!(read_all(&v, whole), expected);
        assert_eq!(v.check(), []);
        for i in 0..3 {
            v.unlink(Ino::ROOT, format!("part{i}").as_bytes()).unwrap();
        }
        assert_eq!(read_all(&v, whole), expected, "the parts gone, their blocks stay with the whole");
        assert_eq!(v.check(), []);
    }

    #[test]
    fn a_block_named_twice_unshared_is_reported() {
        let v = volume();
        let block = v.geometry().block() as usize;
        let a = v.create_file(Ino::ROOT, b"a", 0o644, 0, 0).unwrap().ino;
        let b = v.create_file(Ino::ROOT, b"b", 0o644, 0, 0).unwrap().ino;
        v.write(a, 0, &vec![1u8; block]).unwrap();
        v.clone_file(a, b).unwrap();
        let inode = v.inner.file(b).unwrap();
        if let Some(crate::map::BlockEntry::Ssd { shared, .. }) = inode.map.lock().get_mut(&0) {
            *shared = false;
        }
        let problems = v.check();
        assert!(problems.iter().any(|p| p.what.contains("not all marked shared")), "{problems:?}");
    }
}
