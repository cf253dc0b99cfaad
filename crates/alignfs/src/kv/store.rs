//! The KV metadata store (docs/NVSTORE.md): the engine's state kept as NVStore's records
//! in fjall, one keyspace per record class, all sharing fjall's journal so a batch is
//! atomic across them.
//!
//! A commit applies its ops first, then writes the current record of every key they
//! touched in one batch, synced before the commit returns. The engine's commit lock
//! orders commits, so batch order is apply order. A batch that fails leaves memory ahead
//! of the disk: the store refuses every later commit and the volume must be reopened.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;

use fjall::{CompressionType, Database, Keyspace, KeyspaceCreateOptions, KvSeparationOptions, PersistMode};
use parking_lot::{Condvar, Mutex};

use super::fragments::FragmentLog;
use super::group::{KvGroupSync, SyncState};
use super::kv_error;
use super::records::{encode_object_id, object_prefix, AttrRecord, Onode};
use crate::codec::Short;
use crate::device::power_loss::{PowerLog, RecordedDir};
use crate::error::{DeviceProblem, Error, Result};
use crate::meta::{Ino, Inode};

/// The file that marks a directory as an alignfs KV store (it holds the volume's uuid), so
/// that formatting with `force` replaces only a store, never other files.
pub(super) const MARKER: &str = "ALIGNFS-KV";

/// The fragments' memtable (fjall's default is 64 MiB; BlueStore runs its RocksDB with
/// 256 MiB write buffers). Fragments that an idle sync or a merge deletes while their
/// memtable still holds them are never flushed; the larger it is, the more writes an
/// idle period can catch. Kept in the store's keyspace config when it is created.
pub(super) const FRAGMENT_MEMTABLE_BYTES: u64 = 256 << 20;

/// The `volume` keyspace's keys.
pub(super) const UUID_KEY: &[u8] = b"uuid";
pub(super) const NEXT_INO_KEY: &[u8] = b"next-ino";
/// The counters as of the last clean close (little-endian u64s, in `Counter::ALL` order).
pub(super) const COUNTERS_KEY: &[u8] = b"counters";

pub struct KvMeta {
    pub(super) dir: PathBuf,
    pub(super) db: Database,
    pub(super) blocks: Keyspace,
    pub(super) fragments: Keyspace,
    pub(super) onodes: Keyspace,
    pub(super) attrs: Keyspace,
    pub(super) names: Keyspace,
    pub(super) volume: Keyspace,
    /// The size each object's onode holds: a commit writes an onode only when it changes.
    pub(super) durable_sizes: HashMap<Ino, u64>,
    pub(super) durable_next_ino: u64,
    /// A batch failed: memory is ahead of the disk.
    pub(super) failed: bool,
    /// Batches are ordered under the commit lock and synced together after it.
    pub(super) group: Arc<KvGroupSync>,
    pub(super) log: Arc<FragmentLog>,
    /// The directory, open and locked for as long as the store is open
    /// ([`crate::device::claim`]): one process at a time.
    pub(super) _claim: std::fs::File,
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
        batch.insert(&store.attrs, object_prefix(root.ino).to_vec(), AttrRecord::of(&root.data.lock()).encode());
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
            None => Err(Error::WrongDevices(DeviceProblem::NotAKvStore { dir: dir.to_path_buf() })),
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

    pub(super) fn corrupt(&self, keyspace: &str, key: &[u8], short: Short) -> Error {
        Error::corrupt("KV record", &self.dir.display().to_string(), 0, format!("{keyspace} key {}: {short}", hex(key)))
    }

    /// The counters saved by the last clean close; empty if there is none.
    pub fn counters(&self) -> Result<Vec<u64>> {
        let saved = self.volume.get(COUNTERS_KEY).map_err(|e| kv_error(&self.dir, "read", e))?;
        Ok(saved.map_or_else(Vec::new, |v| v.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes"))).collect()))
    }
}

pub(super) fn require_store_dir(dir: &Path) -> Result<()> {
    if dir.is_dir() {
        Ok(())
    } else {
        Err(Error::BadPath(dir.to_path_buf(), "holds no KV store (name the volume's with --kv)".into()))
    }
}

pub(super) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
