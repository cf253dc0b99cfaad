//! Loading a KV store at open: the engine's state rebuilt from its records, with what a
//! crash left behind (objects without a name, fragments no record names) found.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;

use super::fragments::FragmentBlock;
use super::kv_error;
use super::records::{
    decode_name_key, decode_object_id, decode_object_key, object_prefix, AttrRecord, BlockKey, BlockValue, FragmentKey, FragmentValue,
    Onode,
};
use crate::codec::Short;
use crate::error::Result;
use crate::map::{BlockEntry, FileMap};
use crate::meta::{FileKind, Ino, Inode, InodeData, MetaState};

use super::store::*;

/// Fragment records by the block they belong to, with their order.
type FragmentsByBlock = BTreeMap<BlockKey, Vec<(u32, FragmentValue)>>;

/// (SSD block, checksum) pairs.
type BlockChecksums = Vec<(u64, u32)>;

/// What [`KvMeta::load`] rebuilt.
pub struct Loaded {
    pub state: MetaState,
    /// Blocks with fragments. Their entries in `state` are not set: the fragment residue
    /// store rebuilds them.
    pub fragment_blocks: Vec<FragmentBlock>,
    /// The checksum of every SSD block a record names.
    pub checksums: BlockChecksums,
    /// Objects a crash left without a name (unlinked while open), dropped from `state`;
    /// [`KvMeta::forget`] deletes their records.
    pub orphans: Vec<Ino>,
    /// Fragments no record names (put by writes a crash interrupted before their commit).
    pub stray_fragments: Vec<FragmentKey>,
}

impl KvMeta {
    /// Rebuild the state from the records: every object with its attributes, size, names
    /// and whole-block entries. Checks that the namespace hangs together.
    pub fn load(&mut self, block_bytes: u32) -> Result<Loaded> {
        let read = |e| kv_error(&self.dir, "read", e);
        let next_ino = match self.volume.get(NEXT_INO_KEY).map_err(read)? {
            Some(v) => decode_object_id(&v).map_err(|s| self.corrupt("volume", NEXT_INO_KEY, s))?,
            None => return Err(self.corrupt("volume", NEXT_INO_KEY, Short { at: 0, what: "missing".into() })),
        };
        let mut sizes = HashMap::new();
        for item in self.onodes.iter() {
            let (key, value) = item.into_inner().map_err(read)?;
            let ino = decode_object_key(&key).map_err(|s| self.corrupt("onodes", &key, s))?;
            sizes.insert(ino, Onode::decode(&value).map_err(|s| self.corrupt("onodes", &key, s))?.size);
        }
        let state = self.load_objects(next_ino, &sizes)?;
        self.load_names(&state)?;
        let orphans: Vec<Ino> =
            state.snapshot().iter().filter(|i| i.ino != Ino::ROOT && i.data.lock().attr.nlink == 0).map(|i| i.ino).collect();
        for ino in &orphans {
            state.inodes.write().remove(ino);
        }
        let mut fragments = self.load_fragments(block_bytes)?;
        let (fragment_blocks, checksums) = self.load_blocks(&state, &orphans, &mut fragments)?;
        let stray_fragments = fragments
            .into_iter()
            .filter(|(block, _)| !orphans.contains(&block.object))
            .flat_map(|(block, list)| list.into_iter().map(move |(order, _)| FragmentKey { block, order }))
            .collect();
        self.durable_sizes = sizes;
        self.durable_next_ino = next_ino.0;
        Ok(Loaded { state, fragment_blocks, checksums, orphans, stray_fragments })
    }

    /// Every object with its attributes, and the size its onode gives.
    fn load_objects(&self, next_ino: Ino, sizes: &HashMap<Ino, u64>) -> Result<MetaState> {
        let read = |e| kv_error(&self.dir, "read", e);
        let state = MetaState::default();
        state.next_ino.store(next_ino.0, Ordering::SeqCst);
        for item in self.attrs.iter() {
            let (key, value) = item.into_inner().map_err(read)?;
            let ino = decode_object_key(&key).map_err(|s| self.corrupt("attrs", &key, s))?;
            let record = AttrRecord::decode(&value).map_err(|s| self.corrupt("attrs", &key, s))?;
            if ino.0 == 0 || ino.0 >= next_ino.0 {
                return Err(self.corrupt(
                    "attrs",
                    &key,
                    Short { at: 0, what: format!("object {} is beyond the next id {}", ino.0, next_ino.0) },
                ));
            }
            let Some(&size) = sizes.get(&ino) else {
                return Err(self.corrupt("attrs", &key, Short { at: 0, what: "no onode".into() }));
            };
            let attr = crate::meta::Attr {
                ino,
                kind: record.kind,
                perm: record.perm,
                uid: record.uid,
                gid: record.gid,
                nlink: record.nlink,
                size,
                rdev: 0,
                atime: record.atime,
                mtime: record.mtime,
                ctime: record.ctime,
            };
            let data = InodeData { attr, entries: Default::default(), parent: record.parent, target: record.target, xattrs: record.xattrs };
            state.inodes.write().insert(ino, std::sync::Arc::new(Inode::new(data, FileMap::new())));
        }
        if state.get(Ino::ROOT).is_none_or(|root| root.kind != FileKind::Dir) {
            return Err(self.corrupt("attrs", &object_prefix(Ino::ROOT), Short { at: 0, what: "no root directory".into() }));
        }
        Ok(state)
    }

    /// Every name, into its directory; a name whose object or parent is missing is damage.
    fn load_names(&self, state: &MetaState) -> Result<()> {
        let read = |e| kv_error(&self.dir, "read", e);
        for item in self.names.iter() {
            let (key, value) = item.into_inner().map_err(read)?;
            let (parent, name) = decode_name_key(&key).map_err(|s| self.corrupt("names", &key, s))?;
            let ino = decode_object_id(&value).map_err(|s| self.corrupt("names", &key, s))?;
            let problem = match (state.get(parent), state.get(ino)) {
                (Some(dir), Some(_)) if dir.kind == FileKind::Dir => {
                    dir.data.lock().entries.insert(name.to_vec(), ino);
                    continue;
                }
                (Some(_), Some(_)) => format!("parent {} is not a directory", parent.0),
                _ => format!("names missing object {} or parent {}", ino.0, parent.0),
            };
            return Err(self.corrupt("names", &key, Short { at: 0, what: problem }));
        }
        Ok(())
    }

    /// Every fragment, by the block it belongs to, in its order.
    fn load_fragments(&self, block_bytes: u32) -> Result<FragmentsByBlock> {
        let read = |e| kv_error(&self.dir, "read", e);
        let mut fragments: FragmentsByBlock = BTreeMap::new();
        for item in self.fragments.iter() {
            let (key, value) = item.into_inner().map_err(read)?;
            let fragment = FragmentKey::decode(&key).map_err(|s| self.corrupt("fragments", &key, s))?;
            let value = FragmentValue::decode(&value, block_bytes).map_err(|s| self.corrupt("fragments", &key, s))?;
            fragments.entry(fragment.block).or_default().push((fragment.order, value));
        }
        Ok(fragments)
    }

    /// Every block record: whole blocks into their files' maps, blocks with fragments (taken
    /// out of `fragments`) for the residue store, and the checksum of each SSD block.
    fn load_blocks(
        &self,
        state: &MetaState,
        orphans: &[Ino],
        fragments: &mut FragmentsByBlock,
    ) -> Result<(Vec<FragmentBlock>, BlockChecksums)> {
        let read = |e| kv_error(&self.dir, "read", e);
        let (mut fragment_blocks, mut checksums) = (Vec::new(), Vec::new());
        for item in self.blocks.iter() {
            let (key, value) = item.into_inner().map_err(read)?;
            let block = BlockKey::decode(&key).map_err(|s| self.corrupt("blocks", &key, s))?;
            let value = BlockValue::decode(&value).map_err(|s| self.corrupt("blocks", &key, s))?;
            if orphans.contains(&block.object) {
                continue;
            }
            let Some(inode) = state.get(block.object).filter(|i| i.kind == FileKind::File) else {
                return Err(self.corrupt("blocks", &key, Short { at: 0, what: "the object is missing or not a file".into() }));
            };
            if let Some(ssd) = value.block {
                checksums.push((ssd.0, value.csum));
            }
            if value.fragments {
                let Some(fragments) = fragments.remove(&block) else {
                    return Err(self.corrupt("blocks", &key, Short { at: 0, what: "it names fragments, and there are none".into() }));
                };
                fragment_blocks.push(FragmentBlock { key: block, value, fragments });
            } else if let Some(ssd) = value.block {
                inode.map.lock().insert(block.lblock, BlockEntry::Ssd { block: ssd, overlays: Vec::new(), shared: value.shared });
            }
        }
        Ok((fragment_blocks, checksums))
    }
}
