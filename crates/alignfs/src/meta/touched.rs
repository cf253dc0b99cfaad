//! The keys a commit changes, for metadata stores that write records per key (the KV
//! store, in-place metadata) rather than a log of ops.

use std::collections::{BTreeMap, BTreeSet};

use smallvec::SmallVec;

use super::{DataOp, Ino, MetaState, NamespaceOp, Op};
use crate::map::{BlockEntry, PageNo};

/// The keys a commit's ops change, found before they apply (an unlink's or a rename's
/// object is known only then).
#[derive(Default)]
pub(crate) struct Touched {
    /// Blocks whose entry changes, with the units they held before (found only by
    /// [`Touched::with_units`]).
    pub blocks: BTreeMap<(Ino, u64), SmallVec<[PageNo; 1]>>,
    /// The units of objects the ops free (found only by [`Touched::with_units`]).
    pub freed_units: Vec<(Ino, PageNo)>,
    /// Objects whose attribute record changes, or which go away.
    pub objects: BTreeSet<Ino>,
    /// Objects whose size may change.
    pub sizes: BTreeSet<Ino>,
    pub names: BTreeSet<(Ino, Vec<u8>)>,
}

impl Touched {
    /// The keys alone.
    pub fn keys(meta: &MetaState, ops: &[Op]) -> Touched {
        Touched::of(meta, ops, false)
    }

    /// The keys, and the residue units each touched block and each freed object held:
    /// what a store that files residue under its units (the KV store) must let go of.
    pub fn with_units(meta: &MetaState, ops: &[Op]) -> Touched {
        Touched::of(meta, ops, true)
    }

    fn of(meta: &MetaState, ops: &[Op], units: bool) -> Touched {
        let mut t = Touched::default();
        for op in ops {
            match op {
                Op::Data(DataOp::Map { ino, lblock, .. }) => {
                    t.blocks.entry((*ino, *lblock)).or_insert_with(|| {
                        let before = units.then(|| meta.get(*ino)).flatten();
                        before.and_then(|i| i.map.lock().get(lblock).map(|e| e.fast_pages().collect())).unwrap_or_default()
                    });
                }
                Op::Data(DataOp::Extend { ino, .. }) | Op::Data(DataOp::SetSize { ino, .. }) => {
                    t.sizes.insert(*ino);
                }
                Op::Namespace(NamespaceOp::Create { parent, name, attr, .. }) => {
                    t.names.insert((*parent, name.clone()));
                    t.objects.extend([*parent, attr.ino]);
                }
                Op::Namespace(NamespaceOp::Link { parent, name, ino, .. }) => {
                    t.names.insert((*parent, name.clone()));
                    t.objects.extend([*parent, *ino]);
                }
                Op::Namespace(NamespaceOp::Unlink { parent, name, .. }) => {
                    t.objects.extend(meta.child(*parent, name));
                    t.names.insert((*parent, name.clone()));
                    t.objects.insert(*parent);
                }
                Op::Namespace(NamespaceOp::Rename { from_parent, from_name, to_parent, to_name, .. }) => {
                    t.objects.extend(meta.child(*from_parent, from_name));
                    t.objects.extend(meta.child(*to_parent, to_name));
                    t.names.insert((*from_parent, from_name.clone()));
                    t.names.insert((*to_parent, to_name.clone()));
                    t.objects.extend([*from_parent, *to_parent]);
                }
                Op::Namespace(NamespaceOp::SetAttr { ino, .. }) | Op::Namespace(NamespaceOp::SetXattr { ino, .. }) => {
                    t.objects.insert(*ino);
                }
                Op::Namespace(NamespaceOp::Free { ino }) => {
                    t.objects.insert(*ino);
                    if let Some(inode) = units.then(|| meta.get(*ino)).flatten() {
                        t.freed_units.extend(inode.map.lock().values().flat_map(BlockEntry::fast_pages).map(|u| (*ino, u)));
                    }
                }
            }
        }
        t
    }
}
