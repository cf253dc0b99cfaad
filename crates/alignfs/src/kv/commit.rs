//! Committing to a KV store: one batch of the current record of every key a commit
//! touched, and the deletes of objects a crash orphaned.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use fjall::{Keyspace, OwnedWriteBatch, PersistMode};

use super::kv_error;
use super::records::{
    decode_name_key, encode_name_key, encode_object_id, object_prefix, AttrRecord, BlockKey, BlockValue, FragmentKey, Onode,
};
use crate::error::{Error, Result};
use crate::journal::{CommitContext, GroupSync, MetaStore, MetaUsage};
use crate::layout::BlockChecksums;
use crate::map::BlockEntry;
use crate::meta::{Freed, Ino, Op, Touched};
use crate::stats::Counter;

use super::store::*;

impl KvMeta {
    /// Delete every record of `objects` (orphans found by [`KvMeta::load`]) and the
    /// `stray` fragments.
    pub fn forget(&mut self, objects: &[Ino], stray: &[FragmentKey]) -> Result<()> {
        if objects.is_empty() && stray.is_empty() {
            return Ok(());
        }
        let mut batch = self.db.batch().durability(Some(PersistMode::SyncData));
        for &ino in objects {
            self.remove_object(&mut batch, ino)?;
        }
        for key in stray {
            batch.remove(&self.fragments, key.encode().to_vec());
        }
        batch.commit().map_err(|e| kv_error(&self.dir, "delete orphans", e))?;
        self.group.synced_dir()?;
        for ino in objects {
            self.durable_sizes.remove(ino);
        }
        Ok(())
    }

    /// Put the deletion of every record of `object` into `batch`.
    fn remove_object(&self, batch: &mut OwnedWriteBatch, object: Ino) -> Result<()> {
        let key = object_prefix(object);
        batch.remove(&self.attrs, key.to_vec());
        batch.remove(&self.onodes, key.to_vec());
        self.delete_prefix(batch, &self.blocks, &key)?;
        self.delete_prefix(batch, &self.fragments, &key)
    }

    /// Delete every record under `prefix` in `keyspace` (the paper's prefix delete).
    fn delete_prefix(&self, batch: &mut OwnedWriteBatch, keyspace: &Keyspace, prefix: &[u8]) -> Result<()> {
        for item in keyspace.prefix(prefix) {
            let key = item.key().map_err(|e| kv_error(&self.dir, "read", e))?;
            batch.remove(keyspace, key);
        }
        Ok(())
    }

    /// Write the current record of every key `touched` names; `meta` is applied.
    fn write_touched(&mut self, cx: &CommitContext<'_>, touched: &Touched) -> Result<()> {
        // Durable through the group sync that follows the commit.
        let mut batch = self.db.batch().durability(None);
        self.batch_blocks(cx, touched, &mut batch);
        let mut sizes = self.batch_objects(cx, touched, &mut batch)?;
        sizes.extend(self.batch_sizes(cx, touched, &mut batch));
        self.batch_names(cx, touched, &mut batch);
        let next_ino = cx.meta.next_ino.load(Ordering::SeqCst);
        if next_ino != self.durable_next_ino {
            batch.insert(&self.volume, NEXT_INO_KEY, encode_object_id(Ino(next_ino)).to_vec());
        }
        batch.commit().map_err(|e| kv_error(&self.dir, "commit", e))?;
        self.group.ordered.fetch_add(1, Ordering::SeqCst);
        cx.stats.add(Counter::kv_batches, 1);
        cx.stats.add(Counter::kv_fragment_bytes, self.log.take_put_bytes());
        self.durable_next_ino = next_ino;
        for (ino, size) in sizes {
            match size {
                Some(size) => self.durable_sizes.insert(ino, size),
                None => self.durable_sizes.remove(&ino),
            };
        }
        Ok(())
    }

    /// Each touched block's record, and the fragment records its change maps or drops.
    fn batch_blocks(&self, cx: &CommitContext<'_>, touched: &Touched, batch: &mut OwnedWriteBatch) {
        for ((ino, lblock), before) in &touched.blocks {
            let key = BlockKey { object: *ino, lblock: *lblock }.encode();
            let entry = cx.meta.get(*ino).and_then(|i| i.map.lock().get(lblock).cloned());
            // The fragments of a unit the block no longer holds go in the batch that stops
            // its record naming them (a synced block's, a replaced page's).
            for unit in before.iter().filter(|u| !entry.as_ref().is_some_and(|e| e.fast_pages().any(|p| p == **u))) {
                self.log.drop_into(*unit, batch);
            }
            match entry {
                Some(entry) => {
                    for unit in entry.fast_pages() {
                        self.log.mapped_into(unit, batch);
                    }
                    let value = block_value(&entry, cx.checksums);
                    debug_assert!(BlockValue::decode(&value).is_ok_and(|v| v.block == entry.ssd_block()), "a block record round-trips");
                    count(cx, Counter::kv_block_bytes, key.len(), value.len());
                    batch.insert(&self.blocks, key.to_vec(), value.to_vec());
                }
                None => batch.remove(&self.blocks, key.to_vec()),
            }
        }
    }

    /// Each touched object's attributes, or its removal once it is gone. Returns the
    /// durable sizes the removals forget.
    fn batch_objects(&mut self, cx: &CommitContext<'_>, touched: &Touched, batch: &mut OwnedWriteBatch) -> Result<Vec<(Ino, Option<u64>)>> {
        let mut gone = Vec::new();
        for &ino in &touched.objects {
            match cx.meta.get(ino) {
                Some(inode) => {
                    let attr = AttrRecord::of(&inode.data.lock());
                    let (key, record) = (object_prefix(ino), attr.encode());
                    debug_assert_eq!(AttrRecord::decode(&record).as_ref(), Ok(&attr), "an attribute record round-trips");
                    count(cx, Counter::kv_attr_bytes, key.len(), record.len());
                    batch.insert(&self.attrs, key.to_vec(), record);
                }
                None => {
                    self.remove_object(batch, ino)?;
                    for unit in touched.freed_units.iter().filter(|(object, _)| *object == ino).map(|(_, unit)| *unit) {
                        self.log.forget(unit);
                    }
                    gone.push((ino, None));
                }
            }
        }
        Ok(gone)
    }

    /// An onode for each object whose size differs from its durable one. Returns the
    /// sizes written.
    fn batch_sizes(&self, cx: &CommitContext<'_>, touched: &Touched, batch: &mut OwnedWriteBatch) -> Vec<(Ino, Option<u64>)> {
        let mut written = Vec::new();
        for &ino in touched.sizes.union(&touched.objects) {
            let Some(size) = cx.meta.get(ino).map(|i| i.size()) else { continue };
            if self.durable_sizes.get(&ino) != Some(&size) {
                let (key, value) = (object_prefix(ino), Onode { size, flags: 0 }.encode());
                debug_assert_eq!(Onode::decode(&value).map(|o| o.size), Ok(size), "an onode round-trips");
                count(cx, Counter::kv_onode_bytes, key.len(), value.len());
                batch.insert(&self.onodes, key.to_vec(), value.to_vec());
                written.push((ino, Some(size)));
            }
        }
        written
    }

    /// Each touched name: its object, or its removal.
    fn batch_names(&self, cx: &CommitContext<'_>, touched: &Touched, batch: &mut OwnedWriteBatch) {
        for (parent, name) in &touched.names {
            let key = encode_name_key(*parent, name);
            debug_assert_eq!(decode_name_key(&key), Ok((*parent, &name[..])), "a name key round-trips");
            match cx.meta.child(*parent, name) {
                Some(ino) => {
                    count(cx, Counter::kv_name_bytes, key.len(), 8);
                    batch.insert(&self.names, key, encode_object_id(ino).to_vec());
                }
                None => batch.remove(&self.names, key),
            }
        }
    }
}

/// Counts a record's bytes (key + value) in its class: the metadata traffic NVStore's
/// evaluation counts, before the KV store's own amplification.
fn count(cx: &CommitContext<'_>, counter: Counter, key: usize, value: usize) {
    cx.stats.add(counter, (key + value) as u64);
}

impl MetaStore for KvMeta {
    fn name(&self) -> &'static str {
        "KV store"
    }

    fn commit(&mut self, cx: &CommitContext<'_>, ops: &[Op], apply: &mut dyn FnMut() -> Freed) -> Result<Freed> {
        if self.failed || self.group.failed.load(Ordering::SeqCst) {
            return Err(Error::io(
                format!("KV store {}", self.dir.display()),
                std::io::Error::other("an earlier commit failed; reopen the volume"),
            ));
        }
        self.log.check()?;
        let touched = Touched::with_units(cx.meta, ops);
        let freed = apply();
        if let Err(e) = self.write_touched(cx, &touched) {
            self.failed = true;
            return Err(e);
        }
        Ok(freed)
    }

    /// The KV store compacts itself; there is nothing to fold.
    fn wants_checkpoint(&self) -> bool {
        false
    }

    /// At a clean close: only the counters, which no commit writes.
    fn checkpoint(&mut self, cx: &CommitContext<'_>) -> Result<()> {
        cx.stats.add(Counter::kv_fragment_bytes, self.log.take_put_bytes());
        let counters: Vec<u8> = cx.stats.all().iter().flat_map(|v| v.to_le_bytes()).collect();
        self.volume.insert(COUNTERS_KEY, counters).map_err(|e| kv_error(&self.dir, "save the counters", e))?;
        self.db.persist(PersistMode::SyncData).map_err(|e| kv_error(&self.dir, "save the counters", e))?;
        self.group.synced_dir()
    }

    fn usage(&self) -> MetaUsage {
        MetaUsage { log_used_bytes: self.db.disk_space().unwrap_or(0), ..MetaUsage::default() }
    }

    fn group_sync(&self) -> Option<Arc<dyn GroupSync>> {
        Some(Arc::clone(&self.group) as Arc<dyn GroupSync>)
    }
}

/// A map entry as the flattened block map records it.
pub(super) fn block_value(entry: &BlockEntry, checksums: Option<&BlockChecksums>) -> [u8; super::records::BLOCK_VALUE_BYTES] {
    match entry {
        BlockEntry::Ssd { block, overlays, shared } => BlockValue {
            csum: checksums.map_or(0, |c| c.get(*block)),
            block: Some(*block),
            fragments: !overlays.is_empty(),
            shared: *shared,
        },
        BlockEntry::Fast { .. } => BlockValue { csum: 0, block: None, fragments: true, shared: false },
    }
    .encode()
}
