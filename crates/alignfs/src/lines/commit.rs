//! A commit to the line store: the records of every key it touched, written again where
//! they changed, and the room it needs counted before its ops apply.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

pub use records::{Key, Part, Record, LINE, MAP_CHUNK};

use crate::error::{Error, Result};
use crate::journal::{CommitContext, MetaStore, MetaUsage};
use crate::map::{BlockEntry, FileMap};
use crate::meta::{DataOp, Freed, Ino, MetaState, NamespaceOp, Op, Touched};

use super::*;

impl LineStore {
    /// Encode again every record the ops touched, as `meta` now holds it.
    pub(super) fn write_touched(&mut self, meta: &MetaState, touched: &Touched) -> Result<()> {
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
}

/// The map records (chunks) holding the blocks a commit touches.
pub(super) fn touched_chunks(touched: &Touched) -> Vec<(Ino, u64)> {
    let mut chunks: Vec<(Ino, u64)> = touched.blocks.keys().map(|&(ino, lblock)| (ino, lblock / MAP_CHUNK)).collect();
    chunks.dedup();
    chunks
}

/// The entries of one map record.
pub(super) fn chunk_entries(map: &FileMap, chunk: u64) -> impl Iterator<Item = (u64, BlockEntry)> + '_ {
    let first = chunk * MAP_CHUNK;
    map.range(first..first + MAP_CHUNK).map(|(l, e)| (*l, e.clone()))
}

/// The most record lines a commit of `ops` can take from the free ones, found before the
/// ops apply, from each record it may write anew at its size after them (a record that
/// keeps its size is rewritten in place and takes none; counting it too over-counts,
/// which is safe). When even the largest record size for each fits in `room`, that bound
/// is returned without encoding anything, so commits far from full pay only for a count.
/// `None` if one of the records would be longer than a record may be.
pub(super) fn lines_wanted_at_most(meta: &MetaState, ops: &[Op], touched: &Touched, room: u64) -> Option<u64> {
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
