//! Consistency checks beyond what open verifies (`alignfs fsck`).
//!
//! Open already refuses a volume with a bad superblock, checkpoint or journal record, or
//! with a unit that is out of range or referenced twice. What it does not look at is the
//! namespace as a whole and the maps against the sizes; that is here.

use super::{read, Engine};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use crate::device::AlignedBuf;
use crate::map::BlockEntry;
use crate::meta::{FileKind, Ino, Inode};

/// One thing wrong with a volume.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    pub ino: Ino,
    pub what: String,
}

/// Check the namespace (every inode reachable from the root, link counts, directory
/// parents) and the maps (blocks past the end of a file hold only zeros). Empty =
/// consistent.
pub(super) fn check(engine: &Engine) -> Vec<Problem> {
    let inodes = engine.meta.snapshot();
    let by_ino: HashMap<Ino, _> = inodes.iter().map(|i| (i.ino, i)).collect();
    let mut problems = Vec::new();
    let mut report = |ino: Ino, what: String| problems.push(Problem { ino, what });
    // Names pointing at each inode, and subdirectories of each directory.
    let mut names: HashMap<Ino, u32> = HashMap::new();
    let mut subdirs: HashMap<Ino, u32> = HashMap::new();
    for dir in inodes.iter().filter(|i| i.kind == FileKind::Dir) {
        for (name, child) in &dir.data.lock().entries {
            let Some(inode) = by_ino.get(child) else {
                report(dir.ino, format!("entry {:?} names missing inode {}", String::from_utf8_lossy(name), child.0));
                continue;
            };
            *names.entry(*child).or_default() += 1;
            if inode.kind == FileKind::Dir {
                *subdirs.entry(dir.ino).or_default() += 1;
                let parent = inode.data.lock().parent;
                if parent != dir.ino {
                    report(*child, format!("directory is named in {} but its parent is {}", dir.ino.0, parent.0));
                }
            }
        }
    }
    let reachable = reachable_from_root(&by_ino);
    let block = engine.geometry.block();
    for inode in &inodes {
        let data = inode.data.lock();
        let named = names.get(&inode.ino).copied().unwrap_or(0);
        let expected_nlink = match inode.kind {
            FileKind::Dir => 2 + subdirs.get(&inode.ino).copied().unwrap_or(0),
            _ => named,
        };
        if data.attr.nlink != expected_nlink {
            report(inode.ino, format!("link count {} but {} expected", data.attr.nlink, expected_nlink));
        }
        if inode.kind == FileKind::Dir && inode.ino != Ino::ROOT && named != 1 {
            report(inode.ino, format!("directory has {named} names"));
        }
        if !reachable.contains(&inode.ino) {
            report(inode.ino, "not reachable from the root directory".into());
        }
        if inode.kind == FileKind::Symlink && data.attr.size != data.target.len() as u64 {
            report(inode.ino, format!("symlink size {} but its target has {} bytes", data.attr.size, data.target.len()));
        }
        let size = data.attr.size;
        drop(data);
        // Blocks past the end are legitimate preallocation (fallocate with
        // FALLOC_FL_KEEP_SIZE), but they must read as zeros: a later extension of the
        // file exposes them.
        let beyond: Vec<(u64, BlockEntry)> = inode.map.lock().range(size.div_ceil(block)..).map(|(&lb, e)| (lb, e.clone())).collect();
        for (lblock, entry) in beyond {
            let mut image = AlignedBuf::zeroed(block as usize);
            match read::materialize(engine, Some(&entry), &mut image) {
                Ok(_) if image.iter().all(|&b| b == 0) => {}
                Ok(_) => report(inode.ino, format!("block {lblock}, past the end of the file ({size} bytes), holds data")),
                Err(e) => report(inode.ino, format!("block {lblock}, past the end of the file: {e}")),
            }
        }
    }
    check_block_references(engine, &inodes, &mut problems);
    problems
}

/// Every SSD block named by more than one entry is shared by all of them, and the
/// allocator counts exactly the references and the promises (zero blocks) the maps
/// hold.
pub(super) fn check_block_references(engine: &Engine, inodes: &[Arc<Inode>], problems: &mut Vec<Problem>) {
    let mut users: HashMap<u64, Vec<(Ino, u64, bool)>> = HashMap::new();
    let mut zero_blocks = 0u64;
    for inode in inodes {
        for (&lblock, entry) in inode.map.lock().iter() {
            zero_blocks += u64::from(entry.is_zeros());
            if let Some(block) = entry.ssd_block() {
                users.entry(block.0).or_default().push((inode.ino, lblock, entry.shared()));
            }
        }
    }
    for (block, users) in users {
        let &(ino, lblock, _) = &users[0];
        if users.len() > 1 && users.iter().any(|&(_, _, shared)| !shared) {
            let what = format!("SSD block {block} is named by {} entries, not all marked shared (first: block {lblock})", users.len());
            problems.push(Problem { ino, what });
        }
        let counted = engine.blocks.refs.references(block);
        if counted != users.len() as u32 {
            let what = format!("SSD block {block} has {} references in the maps but {counted} in the allocator", users.len());
            problems.push(Problem { ino, what });
        }
    }
    let promised = engine.blocks.refs.promised_count();
    if promised != zero_blocks {
        let what = format!("the maps hold {zero_blocks} zero blocks but the allocator holds {promised} SSD blocks for them");
        problems.push(Problem { ino: Ino::ROOT, what });
    }
}

/// Every inode some path from the root names.
fn reachable_from_root(by_ino: &HashMap<Ino, &Arc<Inode>>) -> HashSet<Ino> {
    let mut seen = HashSet::from([Ino::ROOT]);
    let mut stack = vec![Ino::ROOT];
    while let Some(dir) = stack.pop() {
        let Some(inode) = by_ino.get(&dir) else { continue };
        let children: Vec<Ino> = inode.data.lock().entries.values().copied().collect();
        for child in children {
            if seen.insert(child) && by_ino.get(&child).is_some_and(|c| c.kind == FileKind::Dir) {
                stack.push(child);
            }
        }
    }
    seen
}

#[cfg(test)]
mod tests {
    use crate::map::{BlockEntry, PageNo};
    use crate::volume::test_volume as volume;
    use crate::volume::RenameFlags;
    use crate::Ino;

    #[test]
    fn a_busy_namespace_checks_clean() {
        let v = volume();
        let a = v.mkdir(Ino::ROOT, b"a", 0o755, 0, 0).unwrap().ino;
        let b = v.mkdir(a, b"b", 0o755, 0, 0).unwrap().ino;
        let f = v.create_file(b, b"f", 0o644, 0, 0).unwrap().ino;
        v.write(f, 100_000, b"data").unwrap();
        v.link(f, Ino::ROOT, b"f2").unwrap();
        v.symlink(a, b"s", b"b/f", 0, 0).unwrap();
        v.rename(a, b"b", Ino::ROOT, b"b", RenameFlags::default()).unwrap();
        v.truncate(f, 10).unwrap();
        v.unlink(Ino::ROOT, b"f2").unwrap();
        assert_eq!(v.check(), []);
    }

    #[test]
    fn damage_is_named() {
        let v = volume();
        let d = v.mkdir(Ino::ROOT, b"d", 0o755, 0, 0).unwrap().ino;
        let f = v.create_file(d, b"f", 0o644, 0, 0).unwrap().ino;
        let inner = &v.inner;
        inner.meta.get(f).unwrap().data.lock().attr.nlink = 3;
        inner.residue.write(PageNo(1), 10, b"stray");
        inner.meta.get(f).unwrap().map.lock().insert(5, BlockEntry::Fast { pages: vec![(0, PageNo(1))] });
        inner.meta.get(Ino::ROOT).unwrap().data.lock().entries.remove(b"d".as_slice());
        inner.meta.get(Ino::ROOT).unwrap().data.lock().entries.insert(b"ghost".to_vec(), Ino(999));
        let problems: Vec<String> = v.check().into_iter().map(|p| format!("{}: {}", p.ino.0, p.what)).collect();
        let expect = |needle: &str| assert!(problems.iter().any(|p| p.contains(needle)), "{needle:?} not in {problems:?}");
        expect("link count 3 but 1 expected");
        expect("past the end of the file (0 bytes), holds data");
        expect("names missing inode 999");
        expect(&format!("{}: not reachable", d.0));
        expect(&format!("{}: directory has 0 names", d.0));
        // Do not checkpoint this state on the way out.
        v.simulate_crash();
    }
}
