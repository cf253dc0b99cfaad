#![allow(clippy::unwrap_used)]
//! The KV store's journal as vendor/fjall writes it for nvstore: each sync writes whole
//! pages of its own, flushed journals are reused for new ones, and a reused journal never
//! reads its earlier life's entries as its own, whether it was closed cleanly or a crash
//! stopped it before its new header was durable.

use std::path::{Path, PathBuf};

use fjall::{Database, Keyspace, KeyspaceCreateOptions, PersistMode};

/// tmpfs where there is one: these tests write journals of 64 MB.
fn scratch() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    tempfile::tempdir_in(if shm.is_dir() { shm } else { Path::new("/tmp") }).expect("a scratch directory")
}

fn open(dir: &Path) -> (Database, Keyspace) {
    let db = Database::builder(dir).open().expect("the store opens");
    let keyspace = db.keyspace("data", KeyspaceCreateOptions::default).expect("a keyspace");
    (db, keyspace)
}

fn files_with_extension(dir: &Path, extension: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("the store's directory")
        .map(|entry| entry.expect("an entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == extension))
        .collect();
    files.sort();
    files
}

fn journal_number(path: &Path) -> u64 {
    path.file_stem().and_then(|stem| stem.to_str()).and_then(|stem| stem.parse().ok()).expect("a numbered journal")
}

/// Fills the active journal past fjall's rotation point (64 MB) and flushes the
/// memtable: the flush seals the journal, and once it is flushed it is evicted.
fn fill_and_flush(keyspace: &Keyspace, round: u8) {
    for i in 0..260u32 {
        keyspace.insert(format!("big-{i:04}"), big_value(round, i)).expect("an insert");
    }
    // The memtable may have just been flushed by itself: the flush that seals the
    // journal needs one that is not empty.
    keyspace.insert("last", [round]).expect("an insert");
    keyspace.rotate_memtable_and_wait().expect("a flush");
}

/// 256 KiB that do not compress (the journal compresses values with LZ4).
fn big_value(round: u8, i: u32) -> Vec<u8> {
    let mut state = u64::from(round) << 32 | u64::from(i) | 1;
    (0..256 * 1024)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

/// The positions of the salted sync markers (tag 8, naming their own position) in a
/// journal's bytes.
fn sync_marker_positions(bytes: &[u8]) -> Vec<usize> {
    (0..bytes.len().saturating_sub(17))
        .filter(|&at| bytes[at] == 8 && u64::from_le_bytes(bytes[at + 1..at + 9].try_into().unwrap()) == at as u64)
        .collect()
}

#[test]
fn every_sync_starts_on_a_page_of_its_own() {
    let dir = scratch();
    let (db, keyspace) = open(dir.path());
    for i in 0..20u32 {
        keyspace.insert(format!("key-{i}"), &big_value(3, i)[..1000 + 300 * i as usize]).expect("an insert");
        db.persist(PersistMode::SyncData).expect("a sync");
    }
    let journal = files_with_extension(dir.path(), "jnl").pop().expect("a journal");
    let markers = sync_marker_positions(&std::fs::read(&journal).expect("the journal"));
    // Each sync leaves a marker where the next one's bytes start: on a page boundary.
    assert!(markers.len() >= 19, "{} sync markers found", markers.len());
    assert!(markers.iter().all(|at| at % 4096 == 0), "markers off a page boundary: {markers:?}");
    drop(keyspace);
    drop(db);

    let (_db, keyspace) = open(dir.path());
    for i in 0..20u32 {
        assert_eq!(keyspace.get(format!("key-{i}")).unwrap().as_deref(), Some(&big_value(3, i)[..1000 + 300 * i as usize]));
    }
}

#[test]
fn a_flushed_journal_is_reused_and_its_old_entries_are_not_read_again() {
    let dir = scratch();
    let (db, keyspace) = open(dir.path());
    fill_and_flush(&keyspace, 1);
    let recycled = wait_for_kept_journals(dir.path(), 1);
    assert_eq!(recycled.len(), 1, "the flushed journal is kept for reuse: {recycled:?}");
    let reused_len = std::fs::metadata(&recycled[0]).unwrap().len();
    // `alignfs stat` reports the store's disk space: the kept journal holds its blocks.
    let active: u64 = files_with_extension(dir.path(), "jnl").iter().map(|p| std::fs::metadata(p).unwrap().len()).sum();
    assert_eq!(db.journal_disk_space().unwrap(), active + reused_len, "the kept journal is counted");

    fill_and_flush(&keyspace, 2);
    // The second journal was written into the first one's file (same length), and is
    // itself kept now: the flush evicts it in the background, so wait for that.
    let active = wait_for_active_journals(dir.path(), 1);
    assert_eq!(active.len(), 1, "{active:?}");
    assert!(!recycled[0].exists(), "the kept journal was reused");
    assert_eq!(wait_for_kept_journals(dir.path(), 1).len(), 1);

    // A few small synced batches at the start of the reused file, over the old entries.
    for i in 0..5u32 {
        keyspace.insert(format!("small-{i}"), format!("new-{i}")).expect("an insert");
        keyspace.insert("big-0000", format!("overwritten-{i}")).expect("an insert");
        db.persist(PersistMode::SyncData).expect("a sync");
    }
    let journal = active[0].clone();
    assert!(std::fs::metadata(&journal).unwrap().len() >= reused_len.min(64_000_000));
    drop(keyspace);
    drop(db);

    let (db, keyspace) = open(dir.path());
    for i in 0..5u32 {
        assert_eq!(keyspace.get(format!("small-{i}")).unwrap().as_deref(), Some(format!("new-{i}").as_bytes()));
    }
    assert_eq!(keyspace.get("big-0000").unwrap().as_deref(), Some(&b"overwritten-4"[..]));
    assert_eq!(keyspace.get("big-0259").unwrap().as_deref(), Some(&big_value(2, 259)[..]));
    // Recovery cut the journal after its own entries (the last of round 2's values and
    // the small batches), dropping the earlier journal's that followed them in the file.
    let len = std::fs::metadata(&journal).unwrap().len();
    assert!(len < reused_len / 2, "journal cut to {len} bytes of {reused_len}");
    keyspace.insert("after", "reopen").unwrap();
    db.persist(PersistMode::SyncData).unwrap();
    drop(keyspace);
    drop(db);
    let (_db, keyspace) = open(dir.path());
    assert_eq!(keyspace.get("after").unwrap().as_deref(), Some(&b"reopen"[..]));
}

/// A store's journal holding `count` batches of one 3000-byte value each, each synced.
fn write_synced(dir: &Path, count: u32, round: u8) {
    let (db, keyspace) = open(dir);
    for i in 0..count {
        keyspace.insert(format!("key-{i}"), big_value(round, i)[..3000].to_vec()).expect("an insert");
        db.persist(PersistMode::SyncData).expect("a sync");
    }
}

/// Renames the store's (only) journal to the next number, as a rotation does with a kept
/// file; returns its new path and number.
fn rename_to_next_journal(dir: &Path) -> (PathBuf, u64) {
    let old = files_with_extension(dir, "jnl").pop().expect("a journal");
    let number = journal_number(&old) + 1;
    let renamed = old.with_file_name(format!("{number}.jnl"));
    std::fs::rename(&old, &renamed).unwrap();
    (renamed, number)
}

#[test]
fn a_reused_journal_whose_header_a_crash_lost_reads_as_empty() {
    let dir = scratch();
    write_synced(dir.path(), 50, 7);
    // As if this journal had been flushed, kept, and renamed to the next number by a
    // rotation, and a crash came before the new journal's first sync: the file holds the
    // old journal whole, under the new name.
    let (renamed, _) = rename_to_next_journal(dir.path());

    let (db, keyspace) = open(dir.path());
    assert_eq!(keyspace.get("key-0").unwrap(), None, "an earlier journal's entries were replayed");
    assert_eq!(std::fs::metadata(&renamed).unwrap().len(), 0, "the journal was not cut at its start");
    keyspace.insert("fresh", "entry").unwrap();
    db.persist(PersistMode::SyncData).unwrap();
    drop(keyspace);
    drop(db);
    let (_db, keyspace) = open(dir.path());
    assert_eq!(keyspace.get("fresh").unwrap().as_deref(), Some(&b"entry"[..]));
}

#[test]
fn a_reused_journal_whose_new_header_alone_was_durable_reads_as_empty() {
    let dir = scratch();
    write_synced(dir.path(), 50, 7);
    // As above, but the new header reached the disk: the old journal's batches follow
    // it where the new journal's would, whole, with their checksums and markers.
    let (renamed, number) = rename_to_next_journal(dir.path());
    let mut bytes = std::fs::read(&renamed).unwrap();
    assert_eq!(bytes[0], 6, "the journal starts with a header");
    bytes[1..9].copy_from_slice(&number.to_le_bytes());
    std::fs::write(&renamed, &bytes).unwrap();

    let (_db, keyspace) = open(dir.path());
    assert_eq!(keyspace.get("key-0").unwrap(), None, "an earlier journal's batches were replayed");
}

#[test]
fn a_reused_journal_with_a_damaged_synced_batch_is_refused() {
    let dir = scratch();
    {
        let (db, keyspace) = open(dir.path());
        fill_and_flush(&keyspace, 1);
        fill_and_flush(&keyspace, 2);
        for i in 0..5u32 {
            keyspace.insert(format!("small-{i}"), big_value(9, i)[..5000].to_vec()).expect("an insert");
            db.persist(PersistMode::SyncData).expect("a sync");
        }
    }
    // Damage the first synced batch's value: later sync markers of this journal say
    // it was durable, so recovery must refuse rather than drop it with what follows.
    let journal = files_with_extension(dir.path(), "jnl").pop().expect("a journal");
    let mut bytes = std::fs::read(&journal).unwrap();
    let value = &big_value(9, 0)[..5000];
    let at = bytes.windows(5000).position(|w| w == value).expect("the value");
    bytes[at + 100] ^= 0xff;
    std::fs::write(&journal, &bytes).unwrap();
    assert!(Database::builder(dir.path()).open().is_err(), "a damaged durable batch was dropped");
}

#[test]
fn a_journal_sealed_before_a_restart_is_reused_once_flushed() {
    let dir = scratch();
    let first_len;
    {
        let (db, keyspace) = open(dir.path());
        // A second keyspace with an entry in the first journal, never flushed: the
        // journal is sealed but cannot be evicted before the store closes.
        let other = db.keyspace("other", KeyspaceCreateOptions::default).unwrap();
        other.insert("pinned", "in the first journal").unwrap();
        fill_and_flush(&keyspace, 1);
        let journals = files_with_extension(dir.path(), "jnl");
        assert_eq!(journals.len(), 2, "the first journal is sealed");
        assert!(files_with_extension(dir.path(), "recycled").is_empty());
        first_len = std::fs::metadata(journals.iter().min_by_key(|p| journal_number(p)).unwrap()).unwrap().len();
    }
    // Reopened: recovery flushes what it read from the sealed journal, in the
    // background; the flushed journal is then reused at once to seal the reopened one,
    // which holds entries, so that the store goes on in written blocks.
    let (db, _keyspace) = open(dir.path());
    let other = db.keyspace("other", KeyspaceCreateOptions::default).unwrap();
    assert_eq!(other.get("pinned").unwrap().as_deref(), Some(&b"in the first journal"[..]));
    let mut journals = Vec::new();
    for _ in 0..500 {
        journals = files_with_extension(dir.path(), "jnl");
        if journals.iter().any(|path| journal_number(path) == 2) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let numbers: Vec<u64> = journals.iter().map(|path| journal_number(path)).collect();
    assert_eq!(numbers, vec![1, 2], "the first journal flushed and reused for the third");
    let newest = journals.iter().max_by_key(|path| journal_number(path)).unwrap();
    assert_eq!(std::fs::metadata(newest).unwrap().len(), first_len, "the new journal is the first one's file");
    other.insert("after", "reopen").unwrap();
    db.persist(PersistMode::SyncData).unwrap();
    drop(other);
    drop(_keyspace);
    drop(db);
    let (db, _keyspace) = open(dir.path());
    let other = db.keyspace("other", KeyspaceCreateOptions::default).unwrap();
    assert_eq!(other.get("pinned").unwrap().as_deref(), Some(&b"in the first journal"[..]));
    assert_eq!(other.get("after").unwrap().as_deref(), Some(&b"reopen"[..]));
}

/// The journals kept for reuse, once there are `count` (flushes run in the background).
fn wait_for_active_journals(dir: &Path, count: usize) -> Vec<PathBuf> {
    for _ in 0..500 {
        let active = files_with_extension(dir, "jnl");
        if active.len() <= count {
            return active;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    files_with_extension(dir, "jnl")
}

fn wait_for_kept_journals(dir: &Path, count: usize) -> Vec<PathBuf> {
    for _ in 0..500 {
        let kept = files_with_extension(dir, "recycled");
        if kept.len() >= count {
            return kept;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    files_with_extension(dir, "recycled")
}

/// An nvstore KV store that alignfs cf09844 (before journal headers, pads and reuse)
/// formatted and wrote three objects of 2 KiB appends into: its journal has sync
/// markers, no header and no pads (trailing zeros trimmed).
const OLDER_STORE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/kv-before-journal-headers");

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

#[test]
fn a_store_an_older_build_wrote_opens_and_takes_new_commits() {
    let dir = scratch();
    copy_tree(Path::new(OLDER_STORE), dir.path());
    let volume = std::fs::read_to_string(dir.path().join("ALIGNFS-KV")).unwrap();
    let uuid = *uuid::Uuid::parse_str(volume.trim()).unwrap().as_bytes();
    let loaded = |dir: &Path| {
        let mut store = alignfs::kv::KvMeta::open(dir, uuid, None).expect("the older store opens");
        store.load(4096).expect("its records load");
    };
    loaded(dir.path());

    let count = |db: &Database, name: &str| db.keyspace(name, KeyspaceCreateOptions::default).unwrap().iter().count();
    let (names, fragments) = {
        let (db, keyspace) = open(dir.path());
        let before = (count(&db, "names"), count(&db, "fragments"));
        assert!(before.0 >= 3 && before.1 > 0, "the older journal's records: {before:?}");
        keyspace.insert("new", "commit").unwrap();
        db.persist(PersistMode::SyncData).unwrap();
        before
    };
    let journal = files_with_extension(dir.path(), "jnl").pop().unwrap();
    assert_eq!(std::fs::read(&journal).unwrap()[0], 1, "the older journal goes on without a header");

    let (db, keyspace) = open(dir.path());
    assert_eq!(keyspace.get("new").unwrap().as_deref(), Some(&b"commit"[..]));
    assert_eq!((count(&db, "names"), count(&db, "fragments")), (names, fragments));
    drop(keyspace);
    drop(db);
    loaded(dir.path());
}

#[test]
fn a_journal_whose_durable_header_is_damaged_is_refused() {
    let dir = scratch();
    write_synced(dir.path(), 5, 5);
    let journal = files_with_extension(dir.path(), "jnl").pop().expect("a journal");
    let mut bytes = std::fs::read(&journal).unwrap();
    bytes[0] = 0;
    std::fs::write(&journal, &bytes).unwrap();
    assert!(Database::builder(dir.path()).open().is_err(), "synced batches were dropped with the header");
}

#[test]
fn a_journal_is_sealed_when_full_even_without_a_flush() {
    let dir = scratch();
    let db = Database::builder(dir.path()).open().expect("the store opens");
    // A memtable large enough that nothing is flushed while the journal fills.
    let keyspace = db.keyspace("data", || KeyspaceCreateOptions::default().max_memtable_size(256 << 20)).expect("a keyspace");
    for i in 0..260u32 {
        keyspace.insert(format!("big-{i:04}"), big_value(4, i)).expect("an insert");
    }
    let journals = files_with_extension(dir.path(), "jnl");
    assert_eq!(journals.len(), 2, "the full journal was sealed by the write that filled it: {journals:?}");
    let sealed = journals.iter().min_by_key(|path| journal_number(path)).unwrap();
    assert!(std::fs::metadata(sealed).unwrap().len() < 66_000_000, "the sealed journal grew on");
    drop(keyspace);
    drop(db);
    let (_db, keyspace) = open(dir.path());
    assert_eq!(keyspace.get("big-0259").unwrap().as_deref(), Some(&big_value(4, 259)[..]));
}
