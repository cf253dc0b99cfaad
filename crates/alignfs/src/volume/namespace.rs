//! Namespace operations: validated under the namespace lock, then committed as ops.

use super::resize;
use std::sync::atomic::Ordering;

use super::Engine;
use crate::error::{Error, Result, TransactionProblem};
use crate::meta::{now_ns, Attr, FileKind, Ino, Inode, NamespaceOp, Op, TimeNs, XATTR_NAME_MAX, XATTR_TOTAL_MAX, XATTR_VALUE_MAX};

pub use crate::meta::{MAX_NAME_BYTES, MAX_SYMLINK_BYTES};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    pub name: Vec<u8>,
    pub ino: Ino,
    pub kind: FileKind,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RenameFlags {
    /// Fail with `Exists` if the target exists (RENAME_NOREPLACE).
    pub no_replace: bool,
    /// Swap source and target, which must both exist (RENAME_EXCHANGE).
    pub exchange: bool,
}

/// Attribute changes; `None` leaves a field alone.
#[derive(Clone, Debug, Default)]
pub struct SetAttrRequest {
    pub perm: Option<u16>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<TimeNs>,
    pub mtime: Option<TimeNs>,
}

/// How `setxattr` treats an existing attribute (XATTR_CREATE / XATTR_REPLACE).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum XattrSet {
    #[default]
    CreateOrReplace,
    /// Fail with `Exists` if the attribute exists.
    CreateOnly,
    /// Fail with `NoAttribute` unless the attribute exists.
    ReplaceOnly,
}

/// Most changes one [`Volume::commit_changes`] takes: they go in one metadata record.
pub const MAX_CHANGES: usize = 4096;

/// One change of a namespace transaction ([`Volume::commit_changes`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NamespaceChange {
    /// Move a name, replacing what the target names (a rename without flags).
    Rename { from_parent: Ino, from_name: Vec<u8>, to_parent: Ino, to_name: Vec<u8> },
    /// Remove a non-directory's name.
    Unlink { parent: Ino, name: Vec<u8> },
    /// Set an extended attribute (create or replace).
    SetXattr { ino: Ino, name: Vec<u8>, value: Vec<u8> },
}

#[derive(Clone, Debug)]
pub struct StatFs {
    pub block_bytes: u64,
    pub blocks_total: u64,
    pub blocks_free: u64,
    pub fast_pages_total: u64,
    pub fast_pages_free: u64,
    pub inodes: u64,
    pub max_name_bytes: u64,
}

fn check_name(name: &[u8]) -> Result<()> {
    if name.len() > MAX_NAME_BYTES {
        return Err(Error::NameTooLong);
    }
    if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') || name.contains(&0) {
        return Err(Error::InvalidName(format!("invalid file name {:?}", String::from_utf8_lossy(name))));
    }
    Ok(())
}

/// May `inode` go away as a directory (`as_dir`) or as a non-directory? (unlink/rmdir,
/// and the target a rename replaces.)
fn check_replaceable(inode: &Inode, as_dir: bool) -> Result<()> {
    match (as_dir, inode.kind == FileKind::Dir) {
        (true, false) => Err(Error::NotDir),
        (false, true) => Err(Error::IsDir),
        (true, true) if !inode.data.lock().entries.is_empty() => Err(Error::NotEmpty),
        _ => Ok(()),
    }
}

/// The `Free` that must go in the same record as the op dropping one name of `inode`, if
/// that is its last name and no handle holds it open. (Replay cannot see open handles, so
/// the decision is journaled, never re-derived.)
fn free_if_last_name(inode: &Inode) -> Option<Op> {
    let last = inode.kind == FileKind::Dir || inode.data.lock().attr.nlink <= 1;
    (last && inode.opens.load(Ordering::SeqCst) == 0).then_some(Op::Namespace(NamespaceOp::Free { ino: inode.ino }))
}

pub(super) fn dir(engine: &Engine, ino: Ino) -> Result<std::sync::Arc<Inode>> {
    let inode = engine.get(ino)?;
    if inode.kind != FileKind::Dir {
        return Err(Error::NotDir);
    }
    Ok(inode)
}

pub(super) fn child(engine: &Engine, parent: Ino, name: &[u8]) -> Result<Option<Ino>> {
    Ok(dir(engine, parent)?.data.lock().entries.get(name).copied())
}

/// Is `ancestor` on the path from `ino` up to the root?
pub(super) fn is_ancestor(engine: &Engine, ancestor: Ino, mut ino: Ino) -> bool {
    loop {
        if ino == ancestor {
            return true;
        }
        if ino == Ino::ROOT {
            return false;
        }
        match engine.meta.get(ino) {
            Some(inode) => ino = inode.data.lock().parent,
            None => return false,
        }
    }
}

/// The ops of an unlink or rmdir, checked; the caller holds the namespace lock.
pub(super) fn plan_remove(engine: &Engine, parent: Ino, name: &[u8], directory: bool) -> Result<Vec<Op>> {
    if name == b"." {
        return Err(Error::InvalidArgument("cannot remove \".\"".into()));
    }
    if name == b".." {
        return Err(Error::NotEmpty);
    }
    let ino = child(engine, parent, name)?.ok_or(Error::NotFound)?;
    let inode = engine.get(ino)?;
    check_replaceable(&inode, directory)?;
    let unlink = Op::Namespace(NamespaceOp::Unlink { parent, name: name.to_vec(), time: now_ns() });
    Ok(std::iter::once(unlink).chain(free_if_last_name(&inode)).collect())
}

/// The ops of a rename, checked; the caller holds the namespace lock. Renaming a name
/// onto itself plans nothing.
pub(super) fn plan_rename(
    engine: &Engine,
    from_parent: Ino,
    from_name: &[u8],
    to_parent: Ino,
    to_name: &[u8],
    flags: RenameFlags,
) -> Result<Vec<Op>> {
    check_name(from_name)?;
    check_name(to_name)?;
    if flags.exchange && flags.no_replace {
        return Err(Error::InvalidArgument("RENAME_EXCHANGE with RENAME_NOREPLACE".into()));
    }
    let source = child(engine, from_parent, from_name)?.ok_or(Error::NotFound)?;
    let target = child(engine, to_parent, to_name)?;
    let source_dir = engine.get(source)?.kind == FileKind::Dir;
    if source_dir && is_ancestor(engine, source, to_parent) {
        return Err(Error::MoveIntoItself);
    }
    let mut free = None;
    if flags.exchange {
        let target = target.ok_or(Error::NotFound)?;
        if engine.get(target)?.kind == FileKind::Dir && is_ancestor(engine, target, from_parent) {
            return Err(Error::MoveIntoItself);
        }
    } else if let Some(target) = target {
        if flags.no_replace {
            return Err(Error::Exists);
        }
        if target == source {
            return Ok(Vec::new());
        }
        let replaced = engine.get(target)?;
        check_replaceable(&replaced, source_dir)?;
        free = free_if_last_name(&replaced);
    }
    let op = Op::Namespace(NamespaceOp::Rename {
        from_parent,
        from_name: from_name.to_vec(),
        to_parent,
        to_name: to_name.to_vec(),
        exchange: flags.exchange,
        time: now_ns(),
    });
    Ok(std::iter::once(op).chain(free).collect())
}

/// The op setting (`Some`) or removing (`None`) an extended attribute, checked; the
/// caller holds the namespace lock.
pub(super) fn plan_xattr(engine: &Engine, ino: Ino, name: &[u8], value: Option<&[u8]>, mode: XattrSet) -> Result<Op> {
    if name.is_empty() || name.contains(&0) {
        return Err(Error::InvalidName("an extended attribute name must be non-empty and hold no NUL byte".into()));
    }
    if name.len() > XATTR_NAME_MAX {
        return Err(Error::NameTooLong);
    }
    let inode = engine.get(ino)?;
    let data = inode.data.lock();
    let existing = data.xattrs.get(name);
    let Some(value) = value else {
        if existing.is_none() {
            return Err(Error::NoAttribute);
        }
        return Ok(Op::Namespace(NamespaceOp::SetXattr { ino, name: name.to_vec(), value: None, ctime: now_ns() }));
    };
    if value.len() > XATTR_VALUE_MAX {
        return Err(Error::TooLarge(format!("extended attribute values hold at most {XATTR_VALUE_MAX} bytes")));
    }
    match (mode, existing) {
        (XattrSet::CreateOnly, Some(_)) => return Err(Error::Exists),
        (XattrSet::ReplaceOnly, None) => return Err(Error::NoAttribute),
        _ => {}
    }
    let others: usize = data.xattrs.iter().filter(|(n, _)| n.as_slice() != name).map(|(n, v)| n.len() + v.len()).sum();
    if others + name.len() + value.len() > XATTR_TOTAL_MAX {
        return Err(Error::NoSpace);
    }
    Ok(Op::Namespace(NamespaceOp::SetXattr { ino, name: name.to_vec(), value: Some(value.to_vec()), ctime: now_ns() }))
}

pub(super) fn commit_namespace(engine: &Engine, ops: &[Op]) -> Result<()> {
    let freed = engine.commit(ops)?;
    engine.release_freed(freed);
    Ok(())
}

pub(super) fn getattr(engine: &Engine, ino: Ino) -> Result<Attr> {
    Ok(engine.get(ino)?.attr())
}

pub(super) fn lookup(engine: &Engine, parent: Ino, name: &[u8]) -> Result<Attr> {
    if name.len() > MAX_NAME_BYTES {
        return Err(Error::NameTooLong);
    }
    let ino = child(engine, parent, name)?.ok_or(Error::NotFound)?;
    getattr(engine, ino)
}

/// A directory's parent (the root is its own parent).
pub(super) fn parent(engine: &Engine, dir: Ino) -> Result<Ino> {
    Ok(self::dir(engine, dir)?.data.lock().parent)
}

/// Resolve an absolute path (no symlinks followed).
pub(super) fn resolve(engine: &Engine, path: &str) -> Result<Ino> {
    let mut ino = Ino::ROOT;
    for part in path.split('/').filter(|p| !p.is_empty() && *p != ".") {
        ino = if part == ".." {
            dir(engine, ino)?.data.lock().parent
        } else {
            child(engine, ino, part.as_bytes())?.ok_or(Error::NotFound)?
        };
    }
    Ok(ino)
}

#[allow(clippy::too_many_arguments)]
pub(super) fn make_node(
    engine: &Engine,
    parent: Ino,
    name: &[u8],
    kind: FileKind,
    perm: u16,
    uid: u32,
    gid: u32,
    rdev: u32,
    target: &[u8],
) -> Result<Attr> {
    engine.check_writable()?;
    check_name(name)?;
    if target.len() > MAX_SYMLINK_BYTES {
        return Err(Error::NameTooLong);
    }
    let _ns = engine.namespace.lock();
    if child(engine, parent, name)?.is_some() {
        return Err(Error::Exists);
    }
    let now = now_ns();
    let attr = Attr {
        ino: Ino(engine.meta.next_ino.fetch_add(1, Ordering::SeqCst)),
        kind,
        perm: perm & 0o7777,
        uid,
        gid,
        nlink: if kind == FileKind::Dir { 2 } else { 1 },
        size: if kind == FileKind::Symlink { target.len() as u64 } else { 0 },
        rdev,
        atime: now,
        mtime: now,
        ctime: now,
    };
    commit_namespace(
        engine,
        &[Op::Namespace(NamespaceOp::Create { parent, name: name.to_vec(), attr: attr.clone(), target: target.to_vec() })],
    )?;
    Ok(attr)
}

pub(super) fn create_file(engine: &Engine, parent: Ino, name: &[u8], perm: u16, uid: u32, gid: u32) -> Result<Attr> {
    make_node(engine, parent, name, FileKind::File, perm, uid, gid, 0, &[])
}

pub(super) fn mkdir(engine: &Engine, parent: Ino, name: &[u8], perm: u16, uid: u32, gid: u32) -> Result<Attr> {
    make_node(engine, parent, name, FileKind::Dir, perm, uid, gid, 0, &[])
}

pub(super) fn symlink(engine: &Engine, parent: Ino, name: &[u8], target: &[u8], uid: u32, gid: u32) -> Result<Attr> {
    if target.is_empty() {
        return Err(Error::InvalidArgument("empty symlink target".into()));
    }
    make_node(engine, parent, name, FileKind::Symlink, 0o777, uid, gid, 0, target)
}

/// A special file (FIFO, socket, device node) or a regular file.
#[allow(clippy::too_many_arguments)]
pub(super) fn mknod(engine: &Engine, parent: Ino, name: &[u8], kind: FileKind, perm: u16, rdev: u32, uid: u32, gid: u32) -> Result<Attr> {
    if matches!(kind, FileKind::Dir | FileKind::Symlink) {
        return Err(Error::InvalidArgument("mknod makes files, FIFOs, sockets and device nodes".into()));
    }
    make_node(engine, parent, name, kind, perm, uid, gid, rdev, &[])
}

pub(super) fn readlink(engine: &Engine, ino: Ino) -> Result<Vec<u8>> {
    let inode = engine.get(ino)?;
    if inode.kind != FileKind::Symlink {
        return Err(Error::InvalidArgument("not a symlink".into()));
    }
    let target = inode.data.lock().target.clone();
    Ok(target)
}

pub(super) fn readdir(engine: &Engine, ino: Ino) -> Result<Vec<DirEntry>> {
    readdir_from(engine, ino, std::ops::Bound::Unbounded, usize::MAX)
}

/// Up to `limit` entries of a directory from `start` on, in byte order of their names:
/// one page of a large directory without copying the rest.
pub(super) fn readdir_from(engine: &Engine, ino: Ino, start: std::ops::Bound<&[u8]>, limit: usize) -> Result<Vec<DirEntry>> {
    let dir = dir(engine, ino)?;
    let entries: Vec<(Vec<u8>, Ino)> =
        dir.data.lock().entries.range::<[u8], _>((start, std::ops::Bound::Unbounded)).take(limit).map(|(n, i)| (n.clone(), *i)).collect();
    Ok(entries.into_iter().filter_map(|(name, ino)| engine.meta.get(ino).map(|i| DirEntry { name, ino, kind: i.kind })).collect())
}

pub(super) fn link(engine: &Engine, ino: Ino, parent: Ino, name: &[u8]) -> Result<Attr> {
    engine.check_writable()?;
    check_name(name)?;
    let _ns = engine.namespace.lock();
    let inode = engine.get(ino)?;
    if inode.kind == FileKind::Dir {
        return Err(Error::NotPermitted("hard links to directories".into()));
    }
    if child(engine, parent, name)?.is_some() {
        return Err(Error::Exists);
    }
    commit_namespace(engine, &[Op::Namespace(NamespaceOp::Link { parent, name: name.to_vec(), ino, time: now_ns() })])?;
    Ok(inode.attr())
}

pub(super) fn unlink(engine: &Engine, parent: Ino, name: &[u8]) -> Result<()> {
    remove(engine, parent, name, false)
}

pub(super) fn rmdir(engine: &Engine, parent: Ino, name: &[u8]) -> Result<()> {
    remove(engine, parent, name, true)
}

pub(super) fn remove(engine: &Engine, parent: Ino, name: &[u8], directory: bool) -> Result<()> {
    engine.check_writable()?;
    let _ns = engine.namespace.lock();
    let ops = plan_remove(engine, parent, name, directory)?;
    commit_namespace(engine, &ops)
}

pub(super) fn rename(
    engine: &Engine,
    from_parent: Ino,
    from_name: &[u8],
    to_parent: Ino,
    to_name: &[u8],
    flags: RenameFlags,
) -> Result<()> {
    engine.check_writable()?;
    let _ns = engine.namespace.lock();
    let ops = plan_rename(engine, from_parent, from_name, to_parent, to_name, flags)?;
    commit_namespace(engine, &ops)
}

/// Apply `changes` as one transaction: every change is checked first, then all are
/// committed in one metadata record, so a crash leaves all of them or none. Each is
/// checked against the namespace as it was before the transaction, so a transaction
/// is refused (`BadTransaction`) unapplied if it touches a name twice, drops two
/// names of one inode, sets an attribute of an inode it drops, or sets two
/// attributes of one inode.
pub(super) fn commit_changes(engine: &Engine, changes: &[NamespaceChange]) -> Result<()> {
    engine.check_writable()?;
    if changes.len() > MAX_CHANGES {
        return Err(Error::BadTransaction(TransactionProblem::TooManyChanges { max: MAX_CHANGES, given: changes.len() }));
    }
    let _ns = engine.namespace.lock();
    let mut names = std::collections::HashSet::new();
    let mut dropped = std::collections::HashSet::new();
    let mut touch_name = |parent: Ino, name: &[u8]| {
        if names.insert((parent, name.to_vec())) {
            Ok(())
        } else {
            Err(Error::BadTransaction(TransactionProblem::NameChangedTwice(name.to_vec())))
        }
    };
    let mut ops = Vec::new();
    let mut xattrs = Vec::new();
    for change in changes {
        let (replaced, planned) = match change {
            NamespaceChange::Rename { from_parent, from_name, to_parent, to_name } => {
                touch_name(*from_parent, from_name)?;
                touch_name(*to_parent, to_name)?;
                let planned = plan_rename(engine, *from_parent, from_name, *to_parent, to_name, RenameFlags::default())?;
                (child(engine, *to_parent, to_name)?, planned)
            }
            NamespaceChange::Unlink { parent, name } => {
                touch_name(*parent, name)?;
                let planned = plan_remove(engine, *parent, name, false)?;
                (child(engine, *parent, name)?, planned)
            }
            NamespaceChange::SetXattr { ino, name, value } => {
                if xattrs.iter().any(|(other, _)| other == ino) {
                    return Err(Error::BadTransaction(TransactionProblem::AttributesSetTwice(ino.0)));
                }
                xattrs.push((*ino, plan_xattr(engine, *ino, name, Some(value), XattrSet::CreateOrReplace)?));
                continue;
            }
        };
        if let Some(ino) = replaced {
            if !dropped.insert(ino) {
                return Err(Error::BadTransaction(TransactionProblem::NamesDroppedTwice(ino.0)));
            }
        }
        ops.extend(planned);
    }
    if let Some((ino, _)) = xattrs.iter().find(|(ino, _)| dropped.contains(ino)) {
        return Err(Error::BadTransaction(TransactionProblem::AttributeOfRemoved(ino.0)));
    }
    // Attributes first, before any op of the record frees an inode.
    let ops: Vec<Op> = xattrs.into_iter().map(|(_, op)| op).chain(ops).collect();
    if ops.is_empty() {
        return Ok(());
    }
    commit_namespace(engine, &ops)
}

/// chmod / chown / utimens / truncate.
pub(super) fn setattr(engine: &Engine, ino: Ino, request: &SetAttrRequest) -> Result<Attr> {
    engine.check_writable()?;
    if let Some(size) = request.size {
        resize::truncate(engine, ino, size)?;
    }
    let changes =
        request.perm.is_some() || request.uid.is_some() || request.gid.is_some() || request.atime.is_some() || request.mtime.is_some();
    if changes {
        let op = Op::Namespace(NamespaceOp::SetAttr {
            ino,
            perm: request.perm.map(|p| p & 0o7777),
            uid: request.uid,
            gid: request.gid,
            atime: request.atime,
            mtime: request.mtime,
            ctime: now_ns(),
        });
        commit_namespace(engine, &[op])?;
    }
    getattr(engine, ino)
}

/// Count an open handle: an unlinked file's data lives until its last handle closes.
pub(super) fn open_handle(engine: &Engine, ino: Ino) -> Result<Attr> {
    let inode = engine.get(ino)?;
    inode.opens.fetch_add(1, Ordering::SeqCst);
    Ok(inode.attr())
}

pub(super) fn release_handle(engine: &Engine, ino: Ino) -> Result<()> {
    let Some(inode) = engine.meta.get(ino) else { return Ok(()) };
    let previous = inode.opens.fetch_sub(1, Ordering::SeqCst);
    if previous == 1 && inode.data.lock().attr.nlink == 0 && !engine.options.read_only {
        let _ns = engine.namespace.lock();
        commit_namespace(engine, &[Op::Namespace(NamespaceOp::Free { ino })])?;
    }
    Ok(())
}

pub(super) fn getxattr(engine: &Engine, ino: Ino, name: &[u8]) -> Result<Vec<u8>> {
    let inode = engine.get(ino)?;
    let value = inode.data.lock().xattrs.get(name).cloned();
    value.ok_or(Error::NoAttribute)
}

/// Attribute names, in byte order.
pub(super) fn listxattr(engine: &Engine, ino: Ino) -> Result<Vec<Vec<u8>>> {
    let inode = engine.get(ino)?;
    let names = inode.data.lock().xattrs.keys().cloned().collect();
    Ok(names)
}

pub(super) fn setxattr(engine: &Engine, ino: Ino, name: &[u8], value: &[u8], mode: XattrSet) -> Result<()> {
    engine.check_writable()?;
    let _ns = engine.namespace.lock();
    let op = plan_xattr(engine, ino, name, Some(value), mode)?;
    commit_namespace(engine, &[op])
}

pub(super) fn removexattr(engine: &Engine, ino: Ino, name: &[u8]) -> Result<()> {
    engine.check_writable()?;
    let _ns = engine.namespace.lock();
    let op = plan_xattr(engine, ino, name, None, XattrSet::ReplaceOnly)?;
    commit_namespace(engine, &[op])
}

pub(super) fn statfs(engine: &Engine) -> StatFs {
    let inner = engine;
    StatFs {
        block_bytes: inner.geometry.block(),
        blocks_total: inner.blocks.refs.capacity() - 1,
        blocks_free: inner.blocks.refs.available_count(),
        fast_pages_total: inner.residue.capacity_units(),
        fast_pages_free: inner.residue.capacity_units() - inner.residue.used_units(),
        inodes: inner.meta.inodes.read().len() as u64,
        max_name_bytes: MAX_NAME_BYTES as u64,
    }
}
