//! The KV store: reopening, group sync, crash images of its journal, damage.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use fjall::PersistMode;

use super::records::{encode_name_key, encode_object_id, object_prefix, BlockKey, FragmentKey, FragmentValue};
use crate::error::{Error, Result};
use crate::journal::{CommitContext, GroupSync, MetaStore};
use crate::map::BlockEntry;
use crate::meta::{FileKind, Freed, Ino, MetaState, Op};
use crate::stats::Counter;

use super::store::*;
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
                        let rename =
                            NamespaceOp::Rename { from_parent, from_name, to_parent: Ino::ROOT, to_name: name, exchange: false, time: 12 };
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
    commit(&mut store, &meta, &[DataOp::Map { ino, lblock: 0, entry: fast(0) }.into(), DataOp::Extend { ino, size: 13, mtime: 6 }.into()]);
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
