//! Cloning a file's data by sharing its SSD blocks (no data copied): the object store's
//! CopyObject, and what a future FICLONE would use.
//!
//! The source's residue is merged into whole blocks first, since residue units belong to
//! one map entry; then every block is marked shared in both maps and counted once more in
//! the allocator. Writes never change a block in place, so either file's next write to a
//! shared block goes to a new block and drops one reference.

use std::sync::Arc;

use super::{Inner, Volume};
use crate::error::{Error, Result};
use crate::map::BlockEntry;
use crate::meta::{now_ns, DataOp, Ino, Inode, Op};
use crate::stats::Counter;

/// Map edits per journal record: a clone of up to this many blocks is atomic across a
/// crash; a larger one commits in several records (the target's size first, so a crash
/// leaves it consistent, reading zeros where blocks were not shared yet).
const CLONE_OPS_PER_RECORD: usize = 4096;

impl Volume {
    /// Make `dst` a copy of `src` (size and data) that shares `src`'s SSD blocks. Both are
    /// regular files; `dst`'s old data is dropped.
    pub fn clone_file(&self, src: Ino, dst: Ino) -> Result<()> {
        if src == dst {
            return Err(Error::InvalidArgument("a file cannot be cloned onto itself".into()));
        }
        let (source, target) = (self.inner.file(src)?, self.inner.file(dst)?);
        self.inner.check_writable()?;
        // Both whole files, the lower inode first, so two clones cannot deadlock.
        let (first, second) = if src < dst { (&source, &target) } else { (&target, &source) };
        let _first = first.range.write(0, u64::MAX);
        let _second = second.range.write(0, u64::MAX);
        self.inner.clone_locked(&source, &target)
    }
}

impl Inner {
    /// [`Volume::clone_file`] with both files' whole ranges locked.
    fn clone_locked(&self, source: &Arc<Inode>, target: &Arc<Inode>) -> Result<()> {
        self.merge_file_locked(source, Counter::migrations_sync)?;
        self.truncate_locked(target, 0)?;
        let blocks: Vec<(u64, BlockEntry)> = source.map.lock().iter().map(|(&lb, e)| (lb, e.clone())).collect();
        let time = now_ns();
        let mut ops = vec![Op::Data(DataOp::SetSize { ino: target.ino, size: source.size(), time })];
        let mut shared = Vec::new();
        for (lblock, entry) in blocks {
            let Some(block) = entry.ssd_block() else { continue };
            let marked = BlockEntry::Ssd { block, overlays: Vec::new(), shared: true };
            if !entry.shared() {
                ops.push(Op::Data(DataOp::Map { ino: source.ino, lblock, entry: Some(marked.clone()) }));
            }
            ops.push(Op::Data(DataOp::Map { ino: target.ino, lblock, entry: Some(marked) }));
            shared.push(block);
            if ops.len() >= CLONE_OPS_PER_RECORD {
                self.commit_shares(&mut ops, &mut shared)?;
            }
        }
        self.commit_shares(&mut ops, &mut shared)
    }

    /// Commit `ops` and count one more reference to each block in `shared`. Nothing else
    /// can free those blocks meanwhile: the caller holds both files.
    fn commit_shares(&self, ops: &mut Vec<Op>, shared: &mut Vec<crate::map::SsdBlock>) -> Result<()> {
        if ops.is_empty() {
            return Ok(());
        }
        let freed = self.commit(ops)?;
        for block in shared.drain(..) {
            self.blocks.share(block.0);
        }
        self.release_freed(freed);
        ops.clear();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
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
        let used = v.inner.blocks.used_count();
        assert!(matches!(v.clone_file(a, a), Err(crate::Error::InvalidArgument(_))));
        assert!(matches!(v.clone_file(a, Ino::ROOT), Err(crate::Error::IsDir)));
        v.clone_file(a, b).unwrap();
        // The tail block held only residue and became an SSD block; no data was copied.
        assert_eq!(v.inner.blocks.used_count(), used + 1);
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
        assert_eq!(v.inner.blocks.used_count(), 1, "every shared block freed by its last reference");
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
