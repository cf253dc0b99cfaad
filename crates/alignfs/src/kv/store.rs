//! The KV metadata store (docs/NVSTORE.md): the engine's state kept as NVStore's records
//! in fjall, one keyspace per record class, all sharing fjall's journal so a batch is
//! atomic across them.
//!
//! A commit applies its ops first, then writes the current record of every key they
//! touched in one batch, synced before the commit returns. The engine's commit lock
//! orders commits, so batch order is apply order. A batch that fails leaves memory ahead
//! of the disk: the store refuses every later commit and the volume must be reopened.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use fjall::{CompressionType, Database, Keyspace, KeyspaceCreateOptions, KvSeparationOptions, PersistMode};
use parking_lot::{Condvar, Mutex};

use super::fragments::{FragmentBlock, FragmentLog};
use super::kv_error;
use super::records::{
    decode_name_key, decode_object_id, decode_object_key, encode_name_key, encode_object_id, object_prefix, AttrRecord, BlockKey,
    BlockValue, FragmentKey, FragmentValue, Onode,
};
use crate::codec::Short;
use crate::device::power_loss::{PowerLog, RecordedDir};
use crate::error::{Error, Result};
use crate::journal::{CommitContext, GroupSync, MetaStore, MetaUsage};
use crate::layout::BlockChecksums;
use crate::map::{BlockEntry, FileMap};
use crate::meta::{FileKind, Freed, Ino, Inode, InodeData, MetaState, Op, Touched};
use crate::stats::Counter;

/// The file that marks a directory as an alignfs KV store (it holds the volume's uuid), so
/// that formatting with `force` replaces only a store, never other files.
const MARKER: &str = "ALIGNFS-KV";

/// The fragments' memtable (fjall's default is 64 MiB; BlueStore runs its RocksDB with
/// 256 MiB write buffers). Fragments that an idle sync or a merge deletes while their
/// memtable still holds them are never flushed; the larger it is, the more writes an
/// idle period can catch. Kept in the store's keyspace config when it is created.
const FRAGMENT_MEMTABLE_BYTES: u64 = 256 << 20;

/// The `volume` keyspace's keys.
const UUID_KEY: &[u8] = b"uuid";
const NEXT_INO_KEY: &[u8] = b"next-ino";
/// The counters as of the last clean close (little-endian u64s, in `Counter::ALL` order).
const COUNTERS_KEY: &[u8] = b"counters";

/// What [`KvMeta::load`] rebuilt.
pub struct Loaded {
    pub state: MetaState,
    /// Blocks with fragments. Their entries in `state` are not set: the fragment residue
    /// store rebuilds them.
    pub fragment_blocks: Vec<FragmentBlock>,
    /// The checksum of every SSD block a record names.
    pub checksums: Vec<(u64, u32)>,
    /// Objects a crash left without a name (unlinked while open), dropped from `state`;
    /// [`KvMeta::forget`] deletes their records.
    pub orphans: Vec<Ino>,
    /// Fragments no record names (put by writes a crash interrupted before their commit).
    pub stray_fragments: Vec<FragmentKey>,
}

pub struct KvMeta {
    dir: PathBuf,
    db: Database,
    blocks: Keyspace,
    fragments: Keyspace,
    onodes: Keyspace,
    attrs: Keyspace,
    names: Keyspace,
    volume: Keyspace,
    /// The size each object's onode holds: a commit writes an onode only when it changes.
    durable_sizes: HashMap<Ino, u64>,
    durable_next_ino: u64,
    /// A batch failed: memory is ahead of the disk.
    failed: bool,
    /// Batches are ordered under the commit lock and synced together after it.
    group: Arc<KvGroupSync>,
    log: Arc<FragmentLog>,
    /// The directory, open and locked for as long as the store is open
    /// ([`crate::device::claim`]): one process at a time.
    _claim: std::fs::File,
}

impl KvMeta {
    /// A new, empty store in `dir` for the volume `uuid`: the root directory alone.
    /// Refuses a directory that already holds a store.
    pub fn create(dir: &Path, uuid: [u8; 16], root: &Inode, syncs: Option<Arc<PowerLog>>) -> Result<KvMeta> {
        let mut store = KvMeta::open_dir(dir, syncs)?;
        if store.volume.get(UUID_KEY).map_err(|e| kv_error(dir, "read", e))?.is_some() {
            return Err(Error::AlreadyFormatted { device: dir.display().to_string(), found: "a KV store".into() });
        }
        let mut batch = store.db.batch().durability(Some(PersistMode::SyncAll));
        batch.insert(&store.volume, UUID_KEY, uuid.to_vec());
        batch.insert(&store.volume, NEXT_INO_KEY, encode_object_id(Ino(root.ino.0 + 1)).to_vec());
        batch.insert(&store.attrs, object_prefix(root.ino).to_vec(), attr_record(&root.data.lock()).encode());
        batch.insert(&store.onodes, object_prefix(root.ino).to_vec(), Onode { size: 0, flags: 0 }.encode().to_vec());
        batch.commit().map_err(|e| kv_error(dir, "format", e))?;
        let marker = dir.join(MARKER);
        std::fs::write(&marker, format!("{}\n", uuid::Uuid::from_bytes(uuid)))
            .map_err(|e| Error::io(format!("write {}", marker.display()), e))?;
        store.group.synced_dir()?;
        store.durable_next_ino = root.ino.0 + 1;
        store.durable_sizes.insert(root.ino, 0);
        Ok(store)
    }

    /// Whether a new store may be made in `dir`: missing or empty, or holding a previous
    /// store and `force`. Returns whether a previous store is there. Changes nothing.
    pub fn check_dir(dir: &Path, force: bool) -> Result<bool> {
        let mut entries = match std::fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(Error::io(format!("read the directory {}", dir.display()), e)),
        };
        if entries.next().is_none() {
            return Ok(false);
        }
        match KvMeta::marker(dir)? {
            Some(_) if force => Ok(true),
            Some(uuid) => {
                Err(Error::AlreadyFormatted { device: dir.display().to_string(), found: format!("the KV store of nvstore volume {uuid}") })
            }
            None => Err(Error::WrongDevices(format!(
                "{} is not empty and holds no alignfs KV store; name a new or empty directory",
                dir.display()
            ))),
        }
    }

    /// The volume `dir`'s marker names (as its text says it), if `dir` holds a store.
    pub fn marker(dir: &Path) -> Result<Option<String>> {
        let marker = dir.join(MARKER);
        match std::fs::read_to_string(&marker) {
            Ok(text) => Ok(Some(text.trim().to_string())),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory) => Ok(None),
            Err(e) => Err(Error::io(format!("read {}", marker.display()), e)),
        }
    }

    /// Make `dir` ready for a new store ([`KvMeta::check_dir`]), removing a previous one.
    pub fn clear_dir(dir: &Path, force: bool) -> Result<()> {
        if KvMeta::check_dir(dir, force)? {
            std::fs::remove_dir_all(dir).map_err(|e| Error::io(format!("remove the old KV store {}", dir.display()), e))?;
        }
        Ok(())
    }

    /// Check, without opening it, that `dir` holds the store of the volume `uuid`: its
    /// marker names that volume. Lets a caller refuse a wrong directory before writing
    /// anything else.
    pub fn check_owner(dir: &Path, uuid: [u8; 16]) -> Result<()> {
        require_store_dir(dir)?;
        let marker = dir.join(MARKER);
        let found = match std::fs::read_to_string(&marker) {
            Ok(found) => found,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(Error::BadPath(dir.to_path_buf(), "holds no alignfs KV store (no ALIGNFS-KV marker)".into()))
            }
            Err(e) => return Err(Error::io(format!("read {}", marker.display()), e)),
        };
        let ssd = uuid::Uuid::from_bytes(uuid);
        match uuid::Uuid::parse_str(found.trim()) {
            Ok(volume) if volume == ssd => Ok(()),
            Ok(volume) => {
                Err(Error::VolumeMismatch { fast: format!("KV store {} of volume {volume}", dir.display()), ssd: ssd.to_string() })
            }
            Err(_) => Err(Error::BadPath(dir.to_path_buf(), format!("its {MARKER} marker names no volume"))),
        }
    }

    /// The store in `dir`, which must belong to the volume `uuid`.
    pub fn open(dir: &Path, uuid: [u8; 16], syncs: Option<Arc<PowerLog>>) -> Result<KvMeta> {
        require_store_dir(dir)?;
        let store = KvMeta::open_dir(dir, syncs)?;
        match store.volume.get(UUID_KEY).map_err(|e| kv_error(dir, "read", e))? {
            Some(found) if *found == uuid => Ok(store),
            Some(found) => {
                let volume = uuid::Uuid::from_slice(&found).map_or_else(|_| "unreadable".to_string(), |u| u.to_string());
                let ssd = uuid::Uuid::from_bytes(uuid).to_string();
                Err(Error::VolumeMismatch { fast: format!("KV store {} of volume {volume}", dir.display()), ssd })
            }
            None => Err(Error::BadPath(dir.to_path_buf(), "holds a KV store of no volume (formatting was interrupted?)".into())),
        }
    }

    /// `syncs`: record the directory after each sync (power-loss tests).
    fn open_dir(dir: &Path, syncs: Option<Arc<PowerLog>>) -> Result<KvMeta> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(format!("create {}", dir.display()), e))?;
        let claim = std::fs::File::open(dir).map_err(|e| Error::io(format!("open {}", dir.display()), e))?;
        crate::device::claim::hold(&claim, dir, false)?;
        let db = Database::builder(dir).open().map_err(|e| kv_error(dir, "open", e))?;
        let keyspace = |name: &str| db.keyspace(name, KeyspaceCreateOptions::default).map_err(|e| kv_error(dir, "open a keyspace", e));
        // Fragment values live in blob files, so compaction moves only their keys: a
        // fragment is put once and deleted when its block is synced, and its bytes are
        // written once to the journal and once at flush instead of again at every level.
        let fragments = db
            .keyspace("fragments", || {
                KeyspaceCreateOptions::default()
                    .with_kv_separation(Some(KvSeparationOptions::default().compression(CompressionType::None)))
                    .max_memtable_size(FRAGMENT_MEMTABLE_BYTES)
            })
            .map_err(|e| kv_error(dir, "open a keyspace", e))?;
        let db_for_sync = db.clone();
        Ok(KvMeta {
            dir: dir.to_path_buf(),
            log: Arc::new(FragmentLog::new(dir.to_path_buf(), fragments.clone())),
            blocks: keyspace("blocks")?,
            fragments,
            onodes: keyspace("onodes")?,
            attrs: keyspace("attrs")?,
            names: keyspace("names")?,
            volume: keyspace("volume")?,
            db,
            durable_sizes: HashMap::new(),
            durable_next_ino: 0,
            failed: false,
            group: Arc::new(KvGroupSync {
                db: db_for_sync,
                dir: dir.to_path_buf(),
                ordered: AtomicU64::new(0),
                sync: Mutex::new(SyncState::default()),
                sync_done: Condvar::new(),
                failed: AtomicBool::new(false),
                recorder: syncs.map(|log| RecordedDir::new(dir, log)),
            }),
            _claim: claim,
        })
    }

    /// The fragment records, for the residue store that puts them.
    pub fn fragment_log(&self) -> Arc<FragmentLog> {
        Arc::clone(&self.log)
    }

    fn corrupt(&self, keyspace: &str, key: &[u8], short: Short) -> Error {
        Error::corrupt("KV record", &self.dir.display().to_string(), 0, format!("{keyspace} key {}: {short}", hex(key)))
    }

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
        let orphans: Vec<Ino> =
            state.snapshot().iter().filter(|i| i.ino != Ino::ROOT && i.data.lock().attr.nlink == 0).map(|i| i.ino).collect();
        for ino in &orphans {
            state.inodes.write().remove(ino);
        }
        let mut fragments: BTreeMap<BlockKey, Vec<(u32, FragmentValue)>> = BTreeMap::new();
        for item in self.fragments.iter() {
            let (key, value) = item.into_inner().map_err(read)?;
            let fragment = FragmentKey::decode(&key).map_err(|s| self.corrupt("fragments", &key, s))?;
            let value = FragmentValue::decode(&value, block_bytes).map_err(|s| self.corrupt("fragments", &key, s))?;
            fragments.entry(fragment.block).or_default().push((fragment.order, value));
        }
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
        let stray_fragments = fragments
            .into_iter()
            .filter(|(block, _)| !orphans.contains(&block.object))
            .flat_map(|(block, list)| list.into_iter().map(move |(order, _)| FragmentKey { block, order }))
            .collect();
        self.durable_sizes = sizes;
        self.durable_next_ino = next_ino.0;
        Ok(Loaded { state, fragment_blocks, checksums, orphans, stray_fragments })
    }

    /// The counters saved by the last clean close; empty if there is none.
    pub fn counters(&self) -> Result<Vec<u64>> {
        let saved = self.volume.get(COUNTERS_KEY).map_err(|e| kv_error(&self.dir, "read", e))?;
        Ok(saved.map_or_else(Vec::new, |v| v.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes"))).collect()))
    }

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
    fn remove_object(&self, batch: &mut fjall::OwnedWriteBatch, object: Ino) -> Result<()> {
        let key = object_prefix(object);
        batch.remove(&self.attrs, key.to_vec());
        batch.remove(&self.onodes, key.to_vec());
        self.delete_prefix(batch, &self.blocks, &key)?;
        self.delete_prefix(batch, &self.fragments, &key)
    }

    /// Delete every record under `prefix` in `keyspace` (the paper's prefix delete).
    fn delete_prefix(&self, batch: &mut fjall::OwnedWriteBatch, keyspace: &Keyspace, prefix: &[u8]) -> Result<()> {
        for item in keyspace.prefix(prefix) {
            let key = item.key().map_err(|e| kv_error(&self.dir, "read", e))?;
            batch.remove(keyspace, key);
        }
        Ok(())
    }

    /// Write the current record of every key `touched` names; `meta` is applied. The
    /// records' bytes (keys + values) are counted per class in `stats`: the metadata
    /// traffic NVStore's evaluation counts, before the KV store's own amplification.
    fn write_touched(&mut self, cx: &CommitContext<'_>, touched: &Touched) -> Result<()> {
        let (meta, checksums) = (cx.meta, cx.checksums);
        // Durable through the group sync that follows the commit.
        let mut batch = self.db.batch().durability(None);
        let count = |counter: Counter, key: usize, value: usize| cx.stats.add(counter, (key + value) as u64);
        for ((ino, lblock), before) in &touched.blocks {
            let key = BlockKey { object: *ino, lblock: *lblock }.encode();
            let entry = meta.get(*ino).and_then(|i| i.map.lock().get(lblock).cloned());
            // The fragments of a unit the block no longer holds go in the batch that stops
            // its record naming them (a synced block's, a replaced page's).
            for unit in before.iter().filter(|u| !entry.as_ref().is_some_and(|e| e.fast_pages().any(|p| p == **u))) {
                self.log.drop_into(*unit, &mut batch);
            }
            match entry {
                Some(entry) => {
                    for unit in entry.fast_pages() {
                        self.log.mapped_into(unit, &mut batch);
                    }
                    let value = block_value(&entry, checksums);
                    count(Counter::kv_block_bytes, key.len(), value.len());
                    batch.insert(&self.blocks, key.to_vec(), value.to_vec());
                }
                None => batch.remove(&self.blocks, key.to_vec()),
            }
        }
        // Each object's onode as this batch leaves it: `None` once the object is gone.
        let mut sizes = Vec::new();
        for &ino in &touched.objects {
            match meta.get(ino) {
                Some(inode) => {
                    let (key, record) = (object_prefix(ino), attr_record(&inode.data.lock()).encode());
                    count(Counter::kv_attr_bytes, key.len(), record.len());
                    batch.insert(&self.attrs, key.to_vec(), record);
                }
                None => {
                    self.remove_object(&mut batch, ino)?;
                    for unit in touched.freed_units.iter().filter(|(object, _)| *object == ino).map(|(_, unit)| *unit) {
                        self.log.forget(unit);
                    }
                    sizes.push((ino, None));
                }
            }
        }
        for &ino in touched.sizes.union(&touched.objects) {
            let Some(size) = meta.get(ino).map(|i| i.size()) else { continue };
            if self.durable_sizes.get(&ino) != Some(&size) {
                let (key, value) = (object_prefix(ino), Onode { size, flags: 0 }.encode());
                count(Counter::kv_onode_bytes, key.len(), value.len());
                batch.insert(&self.onodes, key.to_vec(), value.to_vec());
                sizes.push((ino, Some(size)));
            }
        }
        for (parent, name) in &touched.names {
            let key = encode_name_key(*parent, name);
            match meta.child(*parent, name) {
                Some(ino) => {
                    count(Counter::kv_name_bytes, key.len(), 8);
                    batch.insert(&self.names, key, encode_object_id(ino).to_vec());
                }
                None => batch.remove(&self.names, key),
            }
        }
        let next_ino = meta.next_ino.load(Ordering::SeqCst);
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

/// Group commit for the KV store: a batch is appended to its journal under the commit
/// lock without a sync; then one sync covers every batch appended before it started.
pub(crate) struct KvGroupSync {
    db: Database,
    dir: PathBuf,
    /// Batches appended to the journal.
    ordered: AtomicU64,
    /// Who runs the sync and how far the journal is durable. Never held through a sync:
    /// a commit that the running sync already covers must not wait behind the next one.
    sync: Mutex<SyncState>,
    /// Wakes the commits waiting for a running sync when it ends.
    sync_done: Condvar,
    /// A sync failed: memory and the journal are ahead of the disk.
    failed: AtomicBool,
    recorder: Option<RecordedDir>,
}

#[derive(Default)]
struct SyncState {
    /// Batches known durable.
    durable: u64,
    /// A commit is running a sync now.
    running: bool,
    /// Batches the last sync covered.
    last_group: u64,
}

impl KvGroupSync {
    /// A sync of the store returned: tell the power-loss recorder, if there is one.
    fn synced_dir(&self) -> Result<()> {
        self.recorder.as_ref().map_or(Ok(()), RecordedDir::synced)
    }
}

impl GroupSync for KvGroupSync {
    fn ordered(&self) -> u64 {
        self.ordered.load(Ordering::SeqCst)
    }

    fn sync_through(&self, ticket: u64, commits_waiting: &dyn Fn() -> bool) -> Result<bool> {
        let mut state = self.sync.lock();
        loop {
            if state.durable >= ticket {
                return Ok(false);
            }
            if self.failed.load(Ordering::SeqCst) {
                return Err(Error::io(
                    format!("KV store {}: sync the journal", self.dir.display()),
                    std::io::Error::other("an earlier sync failed; reopen the volume"),
                ));
            }
            if !state.running {
                break;
            }
            self.sync_done.wait(&mut state);
        }
        state.running = true;
        let (durable, expected) = (state.durable, state.last_group);
        drop(state);
        let running = RunningSync(self);
        // Let a commit being ordered now in, and as many as the last sync covered, for a
        // while: the journal's writer lock is held through the sync, so anything appended
        // after it starts waits a whole sync.
        let deadline = std::time::Instant::now() + std::time::Duration::from_micros(200);
        while (commits_waiting() || self.ordered.load(Ordering::SeqCst) - durable < expected) && std::time::Instant::now() < deadline {
            std::thread::yield_now();
        }
        let target = self.ordered.load(Ordering::SeqCst);
        let synced = match self.db.persist(PersistMode::SyncData) {
            Ok(()) => self.synced_dir(),
            Err(e) => Err(kv_error(&self.dir, "sync the journal", e)),
        };
        std::mem::forget(running);
        let mut state = self.sync.lock();
        state.running = false;
        match synced {
            Ok(()) => {
                state.last_group = target - state.durable;
                state.durable = target;
            }
            Err(_) => self.failed.store(true, Ordering::SeqCst),
        }
        drop(state);
        self.sync_done.notify_all();
        synced.map(|()| true)
    }
}

/// Held by the commit that runs a sync, and forgotten once it records the outcome. If the
/// sync unwinds instead (a panic in fjall or in the caller's check), dropping this marks
/// the store failed and wakes the commits waiting: they get an error rather than waiting
/// for a sync that never ends.
struct RunningSync<'a>(&'a KvGroupSync);

impl Drop for RunningSync<'_> {
    fn drop(&mut self) {
        self.0.failed.store(true, Ordering::SeqCst);
        self.0.sync.lock().running = false;
        self.0.sync_done.notify_all();
    }
}

fn require_store_dir(dir: &Path) -> Result<()> {
    if dir.is_dir() {
        Ok(())
    } else {
        Err(Error::BadPath(dir.to_path_buf(), "holds no KV store (name the volume's with --kv)".into()))
    }
}

/// A map entry as the flattened block map records it.
fn block_value(entry: &BlockEntry, checksums: Option<&BlockChecksums>) -> [u8; super::records::BLOCK_VALUE_BYTES] {
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

fn attr_record(data: &InodeData) -> AttrRecord {
    let a = &data.attr;
    AttrRecord {
        kind: a.kind,
        perm: a.perm,
        uid: a.uid,
        gid: a.gid,
        nlink: a.nlink,
        atime: a.atime,
        mtime: a.mtime,
        ctime: a.ctime,
        parent: data.parent,
        target: data.target.clone(),
        xattrs: data.xattrs.clone(),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::map::PageNo;
    use crate::map::SsdBlock;
    use crate::meta::{apply, Attr, DataOp, NamespaceOp};
    use crate::stats::Stats;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    /// Commit `ops`; returns the counters the commit added to.
    fn commit(store: &mut KvMeta, meta: &MetaState, ops: &[Op]) -> Stats {
        let stats = Stats::new(&[]);
        let cx = CommitContext {
            stats: &stats,
            meta,
            checkpoint_payload: &Vec::new,
            checksums: None,
            #[cfg(debug_assertions)]
            pages_per_block: 1,
            #[cfg(debug_assertions)]
            page_bytes: 4096,
        };
        let mut apply_all = || {
            let mut freed = Freed::default();
            for op in ops {
                freed.extend(apply(meta, op).expect("a generated op applies"));
            }
            freed
        };
        store.commit(&cx, ops, &mut apply_all).unwrap();
        stats
    }

    /// A new store holding the root alone, in a directory of its own (dropped after it).
    fn new_store() -> (tempfile::TempDir, MetaState, KvMeta) {
        new_store_in(&std::env::temp_dir())
    }

    /// [`new_store`] in a directory under `parent`.
    fn new_store_in(parent: &Path) -> (tempfile::TempDir, MetaState, KvMeta) {
        let dir = tempfile::tempdir_in(parent).unwrap();
        let meta = MetaState::fresh(0, 0, 5);
        let store = KvMeta::create(dir.path(), [1; 16], &meta.get(Ino::ROOT).unwrap(), None).unwrap();
        (dir, meta, store)
    }

    /// Commit the creation of a file `name` in the root; returns its number.
    fn create_file(store: &mut KvMeta, meta: &MetaState, rng: &mut StdRng, name: &[u8]) -> Ino {
        let attr = new_attr(meta, rng, FileKind::File);
        let ino = attr.ino;
        commit(store, meta, &[NamespaceOp::Create { parent: Ino::ROOT, name: name.to_vec(), attr, target: Vec::new() }.into()]);
        ino
    }

    /// The journal files of the store in `dir`.
    fn journals(dir: &Path) -> Vec<PathBuf> {
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).filter(|p| p.extension().is_some_and(|e| e == "jnl")).collect()
    }

    /// The names in the root of the store in `dir`, reopened and loaded.
    fn root_names(dir: &Path) -> Result<Vec<Vec<u8>>> {
        let mut store = KvMeta::open(dir, [1; 16], None)?;
        let loaded = store.load(4096)?;
        let root = loaded.state.get(Ino::ROOT).unwrap();
        let names = root.data.lock().entries.keys().cloned().collect();
        Ok(names)
    }

    /// What the records must keep of an inode: all but the times data ops change.
    fn durable_view(meta: &MetaState) -> Vec<String> {
        meta.snapshot()
            .iter()
            .filter(|i| i.ino == Ino::ROOT || i.data.lock().attr.nlink > 0)
            .map(|i| {
                let d = i.data.lock();
                let a = &d.attr;
                format!(
                    "{} {:?} {:o} {} {} {} size={} parent={} {:?} {:?} {:?} {:?}",
                    a.ino.0,
                    a.kind,
                    a.perm,
                    a.uid,
                    a.gid,
                    a.nlink,
                    a.size,
                    d.parent.0,
                    d.target,
                    d.xattrs,
                    d.entries,
                    i.map.lock()
                )
            })
            .collect()
    }

    fn new_attr(meta: &MetaState, rng: &mut StdRng, kind: FileKind) -> Attr {
        Attr {
            ino: Ino(meta.next_ino.load(Ordering::SeqCst)),
            kind,
            perm: rng.random_range(0..0o777),
            uid: rng.random_range(0..3),
            gid: 7,
            nlink: if kind == FileKind::Dir { 2 } else { 1 },
            size: 0,
            rdev: 0,
            atime: 1,
            mtime: 2,
            ctime: 3,
        }
    }

    /// Random namespace and data ops, committed through the store: the state loaded back
    /// from a reopened store is the live state.
    #[test]
    fn a_reopened_store_loads_what_was_committed() {
        let dir = tempfile::tempdir().unwrap();
        let uuid = [9u8; 16];
        let meta = MetaState::fresh(0, 0, 5);
        let mut store = KvMeta::create(dir.path(), uuid, &meta.get(Ino::ROOT).unwrap(), None).unwrap();
        let mut rng = StdRng::seed_from_u64(24);
        let mut dirs = vec![Ino::ROOT];
        let mut named_dirs: Vec<(Ino, Vec<u8>, Ino)> = Vec::new(); // (parent, name, ino)
        let mut files: Vec<(Ino, Vec<u8>, Ino)> = Vec::new(); // (parent, name, ino)
        let mut batches = 0;
        for step in 0..400u32 {
            let name = format!("n{step}").into_bytes();
            let parent = dirs[rng.random_range(0..dirs.len())];
            let ops: Vec<Op> = match rng.random_range(0..10) {
                0 => {
                    let attr = new_attr(&meta, &mut rng, FileKind::Dir);
                    dirs.push(attr.ino);
                    named_dirs.push((parent, name.clone(), attr.ino));
                    vec![NamespaceOp::Create { parent, name, attr, target: Vec::new() }.into()]
                }
                1 | 2 => {
                    let attr = new_attr(&meta, &mut rng, FileKind::File);
                    files.push((parent, name.clone(), attr.ino));
                    vec![NamespaceOp::Create { parent, name, attr, target: Vec::new() }.into()]
                }
                _ if files.is_empty() => continue,
                choice => {
                    let k = rng.random_range(0..files.len());
                    let (fparent, fname, ino) = files[k].clone();
                    let lblock = rng.random_range(0..6);
                    match choice {
                        3 | 4 => {
                            let entry = rng.random_bool(0.8).then(|| BlockEntry::Ssd {
                                block: SsdBlock(rng.random_range(1..1000)),
                                overlays: Vec::new(),
                                shared: rng.random_bool(0.2),
                            });
                            vec![
                                DataOp::Map { ino, lblock, entry }.into(),
                                DataOp::Extend { ino, size: (lblock + 1) * 4096 - rng.random_range(0..4096), mtime: 9 }.into(),
                            ]
                        }
                        5 => vec![DataOp::SetSize { ino, size: rng.random_range(0..30_000), time: 10 }.into()],
                        6 => {
                            let value = rng.random_bool(0.7).then(|| vec![step as u8; rng.random_range(0..40)]);
                            vec![NamespaceOp::SetXattr { ino, name: b"user.meta".to_vec(), value, ctime: 11 }.into()]
                        }
                        7 if !named_dirs.is_empty() && rng.random_bool(0.3) => {
                            // A directory moves to the root: its own record changes (its parent).
                            let d = rng.random_range(0..named_dirs.len());
                            let (from_parent, from_name, dir) = named_dirs[d].clone();
                            named_dirs[d] = (Ino::ROOT, name.clone(), dir);
                            let rename = NamespaceOp::Rename {
                                from_parent,
                                from_name,
                                to_parent: Ino::ROOT,
                                to_name: name,
                                exchange: false,
                                time: 12,
                            };
                            vec![rename.into()]
                        }
                        7 => {
                            files[k] = (parent, name.clone(), ino);
                            let rename = NamespaceOp::Rename {
                                from_parent: fparent,
                                from_name: fname,
                                to_parent: parent,
                                to_name: name,
                                exchange: false,
                                time: 12,
                            };
                            vec![rename.into()]
                        }
                        _ => {
                            files.swap_remove(k);
                            let unlink = NamespaceOp::Unlink { parent: fparent, name: fname, time: 13 }.into();
                            // Sometimes the object stays open: an orphan the next load drops.
                            if rng.random_bool(0.7) {
                                vec![unlink, NamespaceOp::Free { ino }.into()]
                            } else {
                                vec![unlink]
                            }
                        }
                    }
                }
            };
            batches += commit(&mut store, &meta, &ops).get(Counter::kv_batches);
        }
        let live = durable_view(&meta);

        drop(store);
        let mut store = KvMeta::open(dir.path(), uuid, None).unwrap();
        let loaded = store.load(4096).unwrap();
        assert!(loaded.fragment_blocks.is_empty());
        assert_eq!(durable_view(&loaded.state), live);
        assert_eq!(loaded.state.next_ino.load(Ordering::SeqCst), meta.next_ino.load(Ordering::SeqCst));
        assert!(batches > 300);
        // Orphans go for good.
        let orphans = loaded.orphans.clone();
        store.forget(&orphans, &[]).unwrap();
        drop(store);
        let mut store = KvMeta::open(dir.path(), uuid, None).unwrap();
        let again = store.load(4096).unwrap();
        assert!(again.orphans.is_empty());
        assert_eq!(durable_view(&again.state), live);
    }

    #[test]
    fn a_write_within_the_size_touches_no_onode() {
        let (_dir, meta, mut store) = new_store();
        let mut rng = StdRng::seed_from_u64(1);
        let ino = create_file(&mut store, &meta, &mut rng, b"obj");
        let map = |lblock: u64| Op::from(DataOp::Map { ino, lblock, entry: Some(BlockEntry::whole(SsdBlock(lblock + 10))) });
        commit(&mut store, &meta, &[map(0), DataOp::Extend { ino, size: 8192, mtime: 6 }.into()]);
        let traffic = commit(&mut store, &meta, &[map(1), DataOp::Extend { ino, size: 8000, mtime: 7 }.into()]);
        assert_eq!(traffic.get(Counter::kv_onode_bytes), 0, "an overwrite inside the size rewrites no onode");
        assert_eq!(traffic.get(Counter::kv_block_bytes), 16 + 13, "one flattened block-map record");
        assert_eq!(traffic.get(Counter::kv_batches), 1);
    }

    /// fjall panicked on a directory in its keyspaces folder not named by a number.
    #[test]
    fn a_stray_directory_among_the_keyspaces_is_skipped() {
        let (dir, meta, mut store) = new_store();
        let mut rng = StdRng::seed_from_u64(3);
        create_file(&mut store, &meta, &mut rng, b"kept");
        drop(store);
        std::fs::create_dir(dir.path().join("keyspaces").join("lost+found")).unwrap();
        assert_eq!(root_names(dir.path()).unwrap(), vec![b"kept".to_vec()]);
    }

    #[test]
    fn a_store_of_another_volume_or_none_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let meta = MetaState::fresh(0, 0, 5);
        assert!(matches!(KvMeta::open(&dir.path().join("missing"), [1; 16], None), Err(Error::BadPath(..))));
        drop(KvMeta::create(dir.path(), [1; 16], &meta.get(Ino::ROOT).unwrap(), None).unwrap());
        assert!(matches!(KvMeta::open(dir.path(), [2; 16], None), Err(Error::VolumeMismatch { .. })));
        assert!(matches!(KvMeta::create(dir.path(), [2; 16], &meta.get(Ino::ROOT).unwrap(), None), Err(Error::AlreadyFormatted { .. })));
    }

    /// Fragment values above the separation threshold go to blob files at a flush; they
    /// read back whole after it and after a reopen, and a deleted one stays deleted.
    #[test]
    fn fragments_flushed_to_blob_files_read_back() {
        let (dir, meta, mut store) = new_store();
        let ino = create_file(&mut store, &meta, &mut StdRng::seed_from_u64(3), b"obj");
        let log = store.fragment_log();
        let bytes = |lblock: u64| -> Vec<u8> { (0..2048u32).map(|i| (i as u64 * 31 + lblock) as u8).collect() };
        let fast = |unit: u64| Some(BlockEntry::Fast { pages: vec![(0, PageNo(unit))] });
        for lblock in 0..4u64 {
            log.register(PageNo(lblock), BlockKey { object: ino, lblock }, None);
            log.put(PageNo(lblock), 1024, &bytes(lblock));
            commit(&mut store, &meta, &[DataOp::Map { ino, lblock, entry: fast(lblock) }.into()]);
        }
        store.fragments.rotate_memtable_and_wait().unwrap();
        let blob_bytes: u64 = std::fs::read_dir(dir.path().join("keyspaces"))
            .unwrap()
            .filter_map(|keyspace| std::fs::read_dir(keyspace.unwrap().path().join("blobs")).ok())
            .flatten()
            .map(|blob| blob.unwrap().metadata().unwrap().len())
            .sum();
        assert!(blob_bytes >= 4 * 2048, "the flush put the fragments' bytes in blob files ({blob_bytes} bytes there)");
        commit(&mut store, &meta, &[DataOp::Map { ino, lblock: 3, entry: None }.into()]);
        drop((store, log));

        let mut store = KvMeta::open(dir.path(), [1; 16], None).unwrap();
        let loaded = store.load(4096).unwrap();
        let images: Vec<(u64, Vec<u8>)> = loaded
            .fragment_blocks
            .iter()
            .map(|b| {
                let mut image = vec![0u8; 4096];
                b.fragments.iter().for_each(|(_, f)| f.lay_over(&mut image));
                (b.key.lblock, image)
            })
            .collect();
        let expected: Vec<(u64, Vec<u8>)> = (0..3)
            .map(|lblock| {
                let mut image = vec![0u8; 4096];
                image[1024..3072].copy_from_slice(&bytes(lblock));
                (lblock, image)
            })
            .collect();
        assert_eq!(images, expected);
        assert!(loaded.stray_fragments.is_empty());
    }

    /// A crash may keep any of the journal's sectors written since its last completed
    /// sync: part of the last batch, or part of an earlier batch and a later one whole.
    /// None of those batches was acknowledged, so the store opens without them. A batch
    /// that a completed sync had made durable and that no longer reads back, whether its
    /// checksum fails or it no longer decodes, makes opening fail: it is damage, and
    /// opening past it would drop acknowledged commits.
    #[test]
    fn batches_a_crash_tore_are_dropped_and_damaged_durable_ones_are_refused() {
        /// The store's directory as a crash leaves it: the root holds `names`, one commit
        /// each, the store syncing after those marked; the journal holds every commit
        /// (written, not all synced); then `damaged`'s bytes in the journal, and `ahead`
        /// bytes before them, are zeroed, as sectors a crash did not keep.
        fn crashed(names: &[(&[u8], bool)], damaged: &[u8], ahead: usize) -> tempfile::TempDir {
            let (dir, meta, mut store) = new_store();
            let mut rng = StdRng::seed_from_u64(4);
            for &(name, sync) in names {
                create_file(&mut store, &meta, &mut rng, name);
                if sync {
                    store.group.sync_through(store.group.ordered(), &|| false).unwrap();
                }
            }
            store.db.persist(PersistMode::Buffer).unwrap();
            let image = crate::device::power_loss::DirSnapshot::take(dir.path()).unwrap();
            drop(store);
            let crashed = tempfile::tempdir().unwrap();
            image.restore(crashed.path()).unwrap();
            let (journal, mut bytes, at) = journals(crashed.path())
                .into_iter()
                .find_map(|p| {
                    let bytes = std::fs::read(&p).unwrap();
                    let at = bytes.windows(damaged.len()).position(|w| w == damaged)?;
                    Some((p, bytes, at))
                })
                .expect("the name is in a journal");
            bytes[at - ahead..at + damaged.len()].fill(0);
            std::fs::write(&journal, bytes).unwrap();
            crashed
        }
        let kept = || vec![b"kept".to_vec()];

        let torn = crashed(&[(b"kept", true), (b"torn-at-the-tail", false)], b"torn-at-the-tail", 0);
        assert_eq!(root_names(torn.path()).unwrap(), kept());
        assert_eq!(root_names(torn.path()).unwrap(), kept(), "and again after the tail was cut");

        let holed = crashed(&[(b"kept", true), (b"holed", false), (b"whole-after-it", false)], b"holed", 0);
        assert_eq!(root_names(holed.path()).unwrap(), kept(), "the batch after the hole was never synced either");

        for ahead in [0, 24] {
            let damaged = crashed(&[(b"damaged-first", true), (b"then-another", true)], b"damaged-first", ahead);
            assert!(root_names(damaged.path()).is_err(), "a synced batch damaged ({ahead} bytes ahead of its name) was skipped");
        }
    }

    /// A batch that reads whole, with a good checksum, but holds an item no journal
    /// writes (an indirection, which only flushes make) is damage: fjall's recovery
    /// stopped at it with `unreachable!()`. It is now a batch that does not decode.
    #[test]
    fn a_journaled_indirection_is_refused_not_a_panic() {
        let (dir, meta, mut store) = new_store();
        let mut rng = StdRng::seed_from_u64(5);
        create_file(&mut store, &meta, &mut rng, b"kept");
        store.group.sync_through(store.group.ordered(), &|| false).unwrap();
        drop(store);
        let journal = journals(dir.path()).pop().unwrap();
        const INDIRECTION: u8 = 4;
        // A sequence number past every commit.
        append_to_journal(&journal, &journal_batch(1 << 40, &journal_item(INDIRECTION, 1, b"k", &[7; 12])));
        // No sync marker follows it, so it is an unacknowledged tail, cut off.
        assert_eq!(root_names(dir.path()).unwrap(), vec![b"kept".to_vec()]);
    }

    /// A sealed journal whose batches clear a keyspace at a later sequence number than an
    /// item written after the clear (intact checksums, damaged numbers) is refused, where
    /// fjall asserted.
    #[test]
    fn a_sealed_journal_whose_numbers_run_backwards_is_refused_not_a_panic() {
        let (dir, meta, mut store) = new_store();
        create_file(&mut store, &meta, &mut StdRng::seed_from_u64(6), b"kept");
        drop(store);
        // fjall seals a journal past 64 MB; a new, empty journal after it seals it here.
        let sealed = journals(dir.path());
        assert_eq!(sealed.len(), 1);
        std::fs::File::create(dir.path().join("1.jnl")).unwrap();
        const CLEAR: u8 = 4;
        let mut clear = vec![CLEAR];
        clear.extend_from_slice(&1u64.to_le_bytes());
        const VALUE: u8 = 0;
        let item = journal_item(VALUE, 1, b"k", b"v");
        let mut batches = journal_batch((1 << 40) + 1, &clear);
        batches.extend(journal_batch(1 << 40, &item));
        append_to_journal(&sealed[0], &batches);
        let err = root_names(dir.path()).expect_err("a journal whose numbers run backwards opened");
        assert!(err.to_string().contains("SeqnoOutOfOrder"), "{err}");
    }

    /// A directory named like a journal is skipped, as a stray keyspace directory is.
    #[test]
    fn a_directory_named_like_a_journal_is_skipped() {
        let (dir, meta, mut store) = new_store();
        create_file(&mut store, &meta, &mut StdRng::seed_from_u64(7), b"kept");
        drop(store);
        std::fs::create_dir(dir.path().join("99.jnl")).unwrap();
        assert_eq!(root_names(dir.path()).unwrap(), vec![b"kept".to_vec()]);
    }

    /// One journal item as fjall encodes it: tag, value type, no compression, keyspace,
    /// the key's and the value's lengths (the value's twice), key, value.
    fn journal_item(value_type: u8, keyspace: u64, key: &[u8], value: &[u8]) -> Vec<u8> {
        let mut item = vec![2, value_type, 0];
        item.extend_from_slice(&keyspace.to_le_bytes());
        item.extend_from_slice(&(key.len() as u16).to_le_bytes());
        item.extend_from_slice(&(value.len() as u32).to_le_bytes());
        item.extend_from_slice(&(value.len() as u32).to_le_bytes());
        item.extend_from_slice(key);
        item.extend_from_slice(value);
        item
    }

    /// A batch of one entry with a checksum that holds: start (one entry, `seqno`), the
    /// entry, end (the entry's xxh3, then fjall's magic).
    fn journal_batch(seqno: u64, entry: &[u8]) -> Vec<u8> {
        let mut batch = vec![1];
        batch.extend_from_slice(&1u32.to_le_bytes());
        batch.extend_from_slice(&seqno.to_le_bytes());
        batch.extend_from_slice(entry);
        batch.push(3);
        batch.extend_from_slice(&xxhash_rust::xxh3::xxh3_64(entry).to_le_bytes());
        batch.extend_from_slice(b"FJL\x03");
        batch
    }

    /// Writes `bytes` over the journal right after its last written byte (into its zeros).
    fn append_to_journal(journal: &Path, bytes: &[u8]) {
        let mut image = std::fs::read(journal).unwrap();
        let end = image.iter().rposition(|&b| b != 0).unwrap() + 1;
        image.truncate(end);
        image.extend_from_slice(bytes);
        std::fs::write(journal, image).unwrap();
    }

    /// A power loss keeps any subset of the journal's sectors written after its last
    /// completed sync, each whole or not at all. Whatever it kept, the store opens with
    /// every commit that sync covered, and with no commit whose predecessor it lacks.
    #[test]
    fn a_store_opens_with_its_synced_commits_whatever_sectors_a_crash_kept() {
        const SECTOR: usize = 512;
        let journal_of = |dir: &Path| -> PathBuf {
            let mut journals = journals(dir);
            assert_eq!(journals.len(), 1, "one journal");
            journals.pop().unwrap()
        };
        // The journal's first MiB, which holds all this test writes to it (zeros follow).
        let head = |path: &Path| -> Vec<u8> {
            let mut head = Vec::new();
            std::io::Read::read_to_end(&mut std::io::Read::take(std::fs::File::open(path).unwrap(), 1 << 20), &mut head).unwrap();
            head
        };
        let written = |bytes: &[u8]| bytes.iter().rposition(|&b| b != 0).map_or(0, |last| last + 1);
        // On tmpfs: the test is of what recovery makes of the bytes, and a sync there
        // costs nothing.
        let shm = Path::new("/dev/shm");
        for seed in 0..100u64 {
            let mut rng = StdRng::seed_from_u64(seed);
            let (dir, meta, mut store) = new_store_in(shm);
            let names: Vec<Vec<u8>> = (0..rng.random_range(2..12)).map(|i| format!("file-{i:02}-{seed}").into_bytes()).collect();
            // The store's creation is synced.
            let (mut synced, mut durable_end) = (0, written(&head(&journal_of(dir.path()))));
            for (i, name) in names.iter().enumerate() {
                // Records from a few bytes to most of a page: a lost sector can then fall
                // inside one batch's record and leave the batch after it whole.
                let attr = Attr { size: 0, ..new_attr(&meta, &mut rng, FileKind::Symlink) };
                let target: Vec<u8> = (0..rng.random_range(1..4000)).map(|_| rng.random_range(b'a'..=b'z')).collect();
                let create = NamespaceOp::Create { parent: Ino::ROOT, name: name.clone(), attr, target };
                commit(&mut store, &meta, &[create.into()]);
                if rng.random_bool(0.3) {
                    store.group.sync_through(store.group.ordered(), &|| false).unwrap();
                    synced = i + 1;
                    durable_end = written(&head(&journal_of(dir.path())));
                }
            }
            store.db.persist(PersistMode::Buffer).unwrap();
            let image = crate::device::power_loss::DirSnapshot::take(dir.path()).unwrap();
            drop(store);
            let crashed = tempfile::tempdir_in(shm).unwrap();
            image.restore(crashed.path()).unwrap();
            let journal = journal_of(crashed.path());
            let mut bytes = head(&journal);
            let end = written(&bytes);
            let mut sector = durable_end / SECTOR * SECTOR;
            while sector < end {
                if rng.random_bool(0.5) {
                    let from = sector.max(durable_end);
                    let to = (sector + SECTOR).min(bytes.len());
                    bytes[from..to].fill(0);
                }
                sector += SECTOR;
            }
            std::os::unix::fs::FileExt::write_all_at(&std::fs::OpenOptions::new().write(true).open(&journal).unwrap(), &bytes, 0).unwrap();

            let found = root_names(crashed.path()).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
            assert!(found.len() >= synced, "seed {seed}: {} of {synced} synced commits", found.len());
            assert_eq!(found, names[..found.len()], "seed {seed}: the commits kept are not a prefix");
        }
    }

    /// Writers that share syncs: each returns only once a sync that started after its
    /// batch was ordered has ended, and while one writer syncs the others queue up for the
    /// next sync instead of each running their own.
    #[test]
    fn a_group_sync_returns_only_once_the_batch_is_durable_and_is_shared() {
        let (_dir, _meta, store) = new_store();
        let group = Arc::clone(&store.group);
        let (writers, batches) = (8, 100);
        let syncs: usize = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..writers)
                .map(|_| {
                    let group = &group;
                    scope.spawn(move || {
                        let mut ran = 0;
                        for _ in 0..batches {
                            let ticket = group.ordered.fetch_add(1, Ordering::SeqCst) + 1;
                            ran += usize::from(group.sync_through(ticket, &|| false).unwrap());
                            assert!(group.sync.lock().durable >= ticket, "returned before batch {ticket} was durable");
                        }
                        ran
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).sum()
        });
        let state = group.sync.lock();
        assert_eq!(state.durable, (writers * batches) as u64);
        assert!(!state.running);
        assert!(syncs < writers * batches, "{syncs} syncs for {} batches: none was shared", writers * batches);
    }

    /// A sync that unwinds leaves the store failed, not a sync marked running forever: a
    /// commit that waits for it gets an error at once.
    #[test]
    fn a_sync_that_panics_fails_the_store_instead_of_hanging_it() {
        let (_dir, _meta, store) = new_store();
        let group = Arc::clone(&store.group);
        let first = group.ordered.fetch_add(1, Ordering::SeqCst) + 1;
        let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            group.sync_through(first, &|| panic!("the caller's check panics mid-sync"))
        }));
        assert!(unwound.is_err());
        assert!(!group.sync.lock().running);
        let second = group.ordered.fetch_add(1, Ordering::SeqCst) + 1;
        let err = group.sync_through(second, &|| false).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("an earlier sync failed"), "{err}");
    }

    /// Records that do not check out make `load` fail with an error naming the record.
    #[test]
    fn a_damaged_record_is_an_error_naming_it() {
        type Damage = fn(&KvMeta);
        let cases: [(&str, Damage); 4] = [
            ("attrs", |s| s.attrs.insert(object_prefix(Ino::ROOT).to_vec(), vec![99u8; 5]).unwrap()),
            ("names", |s| s.names.insert(encode_name_key(Ino::ROOT, b"ghost"), encode_object_id(Ino(40)).to_vec()).unwrap()),
            ("blocks", |s| s.blocks.insert(BlockKey { object: Ino(40), lblock: 0 }.encode().to_vec(), vec![0u8; 13]).unwrap()),
            ("onodes", |s| s.onodes.insert(object_prefix(Ino::ROOT).to_vec(), vec![1u8; 3]).unwrap()),
        ];
        for (keyspace, damage) in cases {
            let (_dir, _meta, mut store) = new_store();
            damage(&store);
            match store.load(4096) {
                Err(Error::Corrupt { problem, .. }) => assert!(problem.starts_with(keyspace), "{keyspace}: {problem}"),
                Err(other) => panic!("{keyspace}: {other}"),
                Ok(_) => panic!("{keyspace}: a damaged record loaded"),
            }
        }
    }

    /// Fragments come back grouped by block, oldest first; those no record names are
    /// strays; a commit that drops a unit deletes exactly that unit's fragments; a unit
    /// no commit mapped leaves nothing behind.
    #[test]
    fn fragments_come_back_in_order_and_strays_are_found() {
        let (dir, meta, mut store) = new_store();
        let ino = create_file(&mut store, &meta, &mut StdRng::seed_from_u64(2), b"obj");
        let log = store.fragment_log();
        let (first, stray) = (BlockKey { object: ino, lblock: 0 }, BlockKey { object: ino, lblock: 1 });
        log.register(PageNo(0), first, None);
        log.put(PageNo(0), 0, b"abc");
        log.put(PageNo(0), 10, b"xyz");
        log.register(PageNo(1), stray, None);
        log.put(PageNo(1), 5, b"never mapped");
        // A stray as a crash in the middle of some older write could leave it.
        store.fragments.insert(FragmentKey { block: stray, order: 7 }.encode(), FragmentValue::of(5, b"lost").encode()).unwrap();
        let fast = |unit: u64| Some(BlockEntry::Fast { pages: vec![(0, PageNo(unit))] });
        commit(
            &mut store,
            &meta,
            &[DataOp::Map { ino, lblock: 0, entry: fast(0) }.into(), DataOp::Extend { ino, size: 13, mtime: 6 }.into()],
        );
        // The page is replaced by one that put a fragment of its own: only the old one's go.
        log.register(PageNo(2), first, None);
        log.put(PageNo(2), 1, b"new");
        commit(&mut store, &meta, &[DataOp::Map { ino, lblock: 0, entry: fast(2) }.into()]);
        drop((store, log));

        let mut store = KvMeta::open(dir.path(), [1; 16], None).unwrap();
        let loaded = store.load(4096).unwrap();
        assert_eq!(loaded.fragment_blocks.len(), 1);
        let block = &loaded.fragment_blocks[0];
        assert_eq!((block.key, block.value.block, block.value.fragments), (first, None, true));
        let orders: Vec<(u32, u16)> = block.fragments.iter().map(|(order, f)| (*order, f.inoff)).collect();
        assert_eq!(orders, [(2, 1)], "the replaced page's fragments are gone, the new one's stay");
        assert_eq!(loaded.stray_fragments, [FragmentKey { block: stray, order: 7 }], "nothing of the unit never mapped");
        store.forget(&[], &loaded.stray_fragments).unwrap();
        assert!(store.load(4096).unwrap().stray_fragments.is_empty());
    }
}
