//! Logical metadata operations: the journal's vocabulary.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::{Attr, FileKind, Ino, Inode, InodeData, MetaState, TimeNs};
use crate::map::{BlockEntry, FileMap, PageNo, SsdBlock};

/// One journal record's op: a namespace record or a data record. A personality without a
/// namespace (a block volume) journals data records alone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    Namespace(NamespaceOp),
    Data(DataOp),
}

/// Names, links, attributes and the life of inodes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NamespaceOp {
    /// A new inode linked at `parent/name`.
    Create {
        parent: Ino,
        name: Vec<u8>,
        attr: Attr,
        target: Vec<u8>,
    },
    /// Another name for an existing inode.
    Link {
        parent: Ino,
        name: Vec<u8>,
        ino: Ino,
        time: TimeNs,
    },
    /// Remove `parent/name`; the inode goes when no name and no handle remains.
    Unlink {
        parent: Ino,
        name: Vec<u8>,
        time: TimeNs,
    },
    /// Move `from` to `to`, replacing `to` (or swapping both when `exchange`).
    Rename {
        from_parent: Ino,
        from_name: Vec<u8>,
        to_parent: Ino,
        to_name: Vec<u8>,
        exchange: bool,
        time: TimeNs,
    },
    SetAttr {
        ino: Ino,
        perm: Option<u16>,
        uid: Option<u32>,
        gid: Option<u32>,
        atime: Option<TimeNs>,
        mtime: Option<TimeNs>,
        ctime: TimeNs,
    },
    /// Set (`Some`) or remove (`None`) one extended attribute.
    SetXattr {
        ino: Ino,
        name: Vec<u8>,
        value: Option<Vec<u8>>,
        ctime: TimeNs,
    },
    /// Drop an inode that has no name left (its last handle closed).
    Free {
        ino: Ino,
    },
}

/// An object's bytes: where its blocks live and how large it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DataOp {
    /// Truncate or extend to exactly `size` (the map edits ride in the same record).
    SetSize { ino: Ino, size: u64, time: TimeNs },
    /// A write: size grows to at least `size`, mtime to at least `mtime`. Commutative, so
    /// writes to disjoint blocks of one file may commit in any order.
    Extend { ino: Ino, size: u64, mtime: TimeNs },
    /// One block of a file's map (`None` = hole).
    Map { ino: Ino, lblock: u64, entry: Option<BlockEntry> },
}

impl From<NamespaceOp> for Op {
    fn from(op: NamespaceOp) -> Op {
        Op::Namespace(op)
    }
}

impl From<DataOp> for Op {
    fn from(op: DataOp) -> Op {
        Op::Data(op)
    }
}

impl Op {
    /// Whether this op can only shrink the state (and so may use the journal's reserve).
    pub fn releases_space(&self) -> bool {
        match self {
            Op::Namespace(NamespaceOp::Unlink { .. }) | Op::Namespace(NamespaceOp::Free { .. }) | Op::Data(DataOp::SetSize { .. }) => true,
            Op::Data(DataOp::Map { entry, .. }) => entry.is_none(),
            Op::Namespace(NamespaceOp::SetXattr { value, .. }) => value.is_none(),
            Op::Namespace(NamespaceOp::Create { .. })
            | Op::Namespace(NamespaceOp::Link { .. })
            | Op::Namespace(NamespaceOp::Rename { .. })
            | Op::Namespace(NamespaceOp::SetAttr { .. })
            | Op::Data(DataOp::Extend { .. }) => false,
        }
    }
}

/// Units an applied op released; the live volume frees them after the commit.
#[derive(Default)]
pub struct Freed {
    pub pages: Vec<PageNo>,
    pub blocks: Vec<SsdBlock>,
    /// Inodes dropped from the table; their units are in `pages`/`blocks`.
    pub removed: Vec<Arc<Inode>>,
    /// Zero blocks dropped or replaced: each held a promise of an SSD block.
    pub promises: u64,
}

impl Freed {
    pub fn add_entry(&mut self, entry: &BlockEntry) {
        self.pages.extend(entry.fast_pages());
        self.blocks.extend(entry.ssd_block());
        self.promises += u64::from(entry.is_zeros());
    }

    fn add_map(&mut self, map: &FileMap) {
        for entry in map.values() {
            self.add_entry(entry);
        }
    }

    pub fn extend(&mut self, other: Freed) {
        self.pages.extend(other.pages);
        self.blocks.extend(other.blocks);
        self.removed.extend(other.removed);
        self.promises += other.promises;
    }
}

/// Why an op could not be applied: the journal names something that does not exist.
/// Live operations validate first, so this only happens on corrupt media.
#[derive(Debug)]
pub struct Inapplicable(pub String);

fn need(state: &MetaState, ino: Ino) -> Result<Arc<Inode>, Inapplicable> {
    state.get(ino).ok_or_else(|| Inapplicable(format!("inode {} does not exist", ino.0)))
}

fn need_dir(state: &MetaState, ino: Ino) -> Result<Arc<Inode>, Inapplicable> {
    let inode = need(state, ino)?;
    if inode.kind != FileKind::Dir {
        return Err(Inapplicable(format!("inode {} is not a directory", ino.0)));
    }
    Ok(inode)
}

/// Drop one name of `inode` (already removed from its directory). An inode left without a
/// name stays until an explicit `Free`: whether a handle still holds it open is live state
/// that replay cannot see, so the caller decides and journals that decision.
fn drop_link(inode: &Inode, parent: &Inode, time: TimeNs) {
    let mut data = inode.data.lock();
    if inode.kind == FileKind::Dir {
        data.attr.nlink = 0;
        parent.data.lock().attr.nlink -= 1;
    } else {
        data.attr.nlink = data.attr.nlink.saturating_sub(1);
    }
    data.attr.ctime = time;
}

fn remove_inode(state: &MetaState, inode: &Arc<Inode>, freed: &mut Freed) {
    state.inodes.write().remove(&inode.ino);
    freed.add_map(&inode.map.lock());
    freed.removed.push(Arc::clone(inode));
}

fn touch_dir(dir: &Inode, time: TimeNs) {
    let mut data = dir.data.lock();
    data.attr.mtime = time;
    data.attr.ctime = time;
}

/// Apply one op to the in-memory state. One arm per op kind, longer than 80 lines on
/// purpose: the journal's whole vocabulary reads in one place.
pub fn apply(state: &MetaState, op: &Op) -> Result<Freed, Inapplicable> {
    let mut freed = Freed::default();
    match op {
        Op::Namespace(NamespaceOp::Create { parent, name, attr, target }) => {
            let dir = need_dir(state, *parent)?;
            if dir.data.lock().entries.contains_key(name) {
                return Err(Inapplicable(format!("create: name exists in directory {}", parent.0)));
            }
            let data = InodeData {
                attr: attr.clone(),
                entries: BTreeMap::new(),
                parent: *parent,
                target: target.clone(),
                xattrs: BTreeMap::new(),
            };
            state.insert(Inode::new(data, FileMap::new()));
            let mut d = dir.data.lock();
            d.entries.insert(name.clone(), attr.ino);
            if attr.kind == FileKind::Dir {
                d.attr.nlink += 1;
            }
            d.attr.mtime = attr.ctime;
            d.attr.ctime = attr.ctime;
        }
        Op::Namespace(NamespaceOp::Link { parent, name, ino, time }) => {
            let dir = need_dir(state, *parent)?;
            let inode = need(state, *ino)?;
            dir.data.lock().entries.insert(name.clone(), *ino);
            touch_dir(&dir, *time);
            let mut data = inode.data.lock();
            data.attr.nlink += 1;
            data.attr.ctime = *time;
        }
        Op::Namespace(NamespaceOp::Unlink { parent, name, time }) => {
            let dir = need_dir(state, *parent)?;
            let removed = dir.data.lock().entries.remove(name);
            let ino = removed.ok_or_else(|| Inapplicable(format!("unlink: no such name in directory {}", parent.0)))?;
            touch_dir(&dir, *time);
            if let Some(inode) = state.get(ino) {
                drop_link(&inode, &dir, *time);
            }
        }
        Op::Namespace(NamespaceOp::Rename { from_parent, from_name, to_parent, to_name, exchange, time }) => {
            apply_rename(state, *from_parent, from_name, *to_parent, to_name, *exchange, *time)?;
        }
        Op::Namespace(NamespaceOp::SetAttr { ino, perm, uid, gid, atime, mtime, ctime }) => {
            let inode = need(state, *ino)?;
            let mut data = inode.data.lock();
            let a = &mut data.attr;
            a.perm = perm.unwrap_or(a.perm);
            a.uid = uid.unwrap_or(a.uid);
            a.gid = gid.unwrap_or(a.gid);
            a.atime = atime.unwrap_or(a.atime);
            a.mtime = mtime.unwrap_or(a.mtime);
            a.ctime = *ctime;
        }
        Op::Data(DataOp::SetSize { ino, size, time }) => {
            let inode = need(state, *ino)?;
            let mut data = inode.data.lock();
            data.attr.size = *size;
            data.attr.mtime = *time;
            data.attr.ctime = *time;
        }
        Op::Data(DataOp::Extend { ino, size, mtime }) => {
            let inode = need(state, *ino)?;
            let mut data = inode.data.lock();
            data.attr.size = data.attr.size.max(*size);
            data.attr.mtime = data.attr.mtime.max(*mtime);
            data.attr.ctime = data.attr.ctime.max(*mtime);
        }
        Op::Data(DataOp::Map { ino, lblock, entry }) => {
            let inode = need(state, *ino)?;
            let mut map = inode.map.lock();
            let old = match entry {
                Some(e) => map.insert(*lblock, e.clone()),
                None => map.remove(lblock),
            };
            // The caller frees exactly what the new entry no longer references.
            if let Some(old) = old {
                let keep: Vec<PageNo> = entry.iter().flat_map(|e| e.fast_pages()).collect();
                freed.pages.extend(old.fast_pages().filter(|p| !keep.contains(p)));
                let keep_block = entry.as_ref().and_then(BlockEntry::ssd_block);
                freed.blocks.extend(old.ssd_block().filter(|b| Some(*b) != keep_block));
                freed.promises += u64::from(old.is_zeros() && !entry.as_ref().is_some_and(BlockEntry::is_zeros));
            }
        }
        Op::Namespace(NamespaceOp::SetXattr { ino, name, value, ctime }) => {
            let inode = need(state, *ino)?;
            let mut data = inode.data.lock();
            match value {
                Some(value) => data.xattrs.insert(name.clone(), value.clone()),
                None => data.xattrs.remove(name),
            };
            data.attr.ctime = *ctime;
        }
        Op::Namespace(NamespaceOp::Free { ino }) => {
            if let Some(inode) = state.get(*ino) {
                if inode.data.lock().attr.nlink == 0 {
                    remove_inode(state, &inode, &mut freed);
                }
            }
        }
    }
    Ok(freed)
}

#[allow(clippy::too_many_arguments)]
fn apply_rename(
    state: &MetaState,
    from_parent: Ino,
    from_name: &[u8],
    to_parent: Ino,
    to_name: &[u8],
    exchange: bool,
    time: TimeNs,
) -> Result<(), Inapplicable> {
    let from_dir = need_dir(state, from_parent)?;
    let to_dir = need_dir(state, to_parent)?;
    let source = from_dir.data.lock().entries.get(from_name).copied();
    let source = source.ok_or_else(|| Inapplicable("rename: source name missing".into()))?;
    let target = to_dir.data.lock().entries.get(to_name).copied();
    let moved = need(state, source)?;
    // Re-parent a directory moving between directories.
    let reparent = |inode: &Inode, from: &Inode, to: &Inode| {
        if inode.kind == FileKind::Dir && from.ino != to.ino {
            inode.data.lock().parent = to.ino;
            from.data.lock().attr.nlink -= 1;
            to.data.lock().attr.nlink += 1;
        }
    };
    if exchange {
        let target = target.ok_or_else(|| Inapplicable("rename exchange: target name missing".into()))?;
        let other = need(state, target)?;
        from_dir.data.lock().entries.insert(from_name.to_vec(), target);
        to_dir.data.lock().entries.insert(to_name.to_vec(), source);
        reparent(&moved, &from_dir, &to_dir);
        reparent(&other, &to_dir, &from_dir);
        other.data.lock().attr.ctime = time;
    } else {
        from_dir.data.lock().entries.remove(from_name);
        if let Some(replaced) = target.filter(|&t| t != source) {
            to_dir.data.lock().entries.remove(to_name);
            if let Some(replaced) = state.get(replaced) {
                drop_link(&replaced, &to_dir, time);
            }
        }
        to_dir.data.lock().entries.insert(to_name.to_vec(), source);
        reparent(&moved, &from_dir, &to_dir);
    }
    moved.data.lock().attr.ctime = time;
    touch_dir(&from_dir, time);
    touch_dir(&to_dir, time);
    Ok(())
}
