#![allow(clippy::unwrap_used)]
//! The `nvstore` profile: objects kept as NVStore keeps them (unaligned pieces as KV
//! fragments, whole blocks on the SSD with checksums), checked against a model across
//! clean closes and crashes, with damaged blocks detected on read.

use std::collections::BTreeMap;
use std::sync::Arc;

use alignfs::device::power_loss::{DirSnapshot, Event, PowerLog, RecordedSsd, Replay, Survival};
use alignfs::device::{BlockDevice, SimSsd};
use alignfs::layout::{Superblock, FORMAT_VERSION};
use alignfs::personality::{Bucket, ObjectStore};
use alignfs::stats::Counter;
use alignfs::test_support::{scaled, seed};
use alignfs::{Devices, Error, FormatOptions, Geometry, Profile, VolumeOptions};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

struct Fixture {
    ssd: Arc<SimSsd>,
    kv: tempfile::TempDir,
}

impl Fixture {
    fn new(geometry: Geometry) -> Fixture {
        let fixture = Fixture { ssd: Arc::new(SimSsd::new(64 << 20)), kv: tempfile::tempdir().unwrap() };
        let format = FormatOptions { geometry, profile: Profile::NVSTORE, force: false, ..Default::default() };
        ObjectStore::format(&fixture.devices(), &format).unwrap();
        let store = fixture.open(&quiet());
        store.create_bucket(b"b").unwrap();
        store.close().unwrap();
        fixture
    }

    fn devices(&self) -> Devices {
        Devices::with_kv(Arc::clone(&self.ssd) as Arc<dyn BlockDevice>, self.kv.path())
    }

    fn open(&self, options: &VolumeOptions) -> ObjectStore {
        open_waiting(|| self.devices(), options).unwrap()
    }
}

/// `ObjectStore::open`, waiting while the store directory's lock is still held by a child
/// that `acknowledged_operations_survive_kill_9` is starting in another thread: a child
/// holds copies of this process's descriptors from fork until exec, so the lock of a
/// store a test just closed can outlive the close by that long.
fn open_waiting(devices: impl Fn() -> Devices, options: &VolumeOptions) -> alignfs::Result<ObjectStore> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        match ObjectStore::open(devices(), options.clone()) {
            Err(Error::InUse { .. }) if std::time::Instant::now() < deadline => std::thread::sleep(std::time::Duration::from_millis(10)),
            result => return result,
        }
    }
}

fn quiet() -> VolumeOptions {
    VolumeOptions { background: false, scrap_mem_bytes: 4 << 20, ..VolumeOptions::default() }
}

/// Without clean pages: every unaligned write makes a fragment page (FP).
fn no_clean_pages() -> VolumeOptions {
    VolumeOptions { clean_cache_bytes: 0, ..quiet() }
}

/// The bucket every test uses.
fn b(store: &ObjectStore) -> Bucket<'_> {
    store.bucket(b"b").unwrap()
}

fn counter(store: &ObjectStore, which: Counter) -> u64 {
    store.volume().stats().counters.iter().find(|(c, _)| *c == which).map_or(0, |(_, v)| *v)
}

fn check_model(store: &ObjectStore, model: &BTreeMap<Vec<u8>, Vec<u8>>, context: &str) {
    let names: Vec<Vec<u8>> = b(store).list(b"", None, usize::MAX).unwrap().into_iter().map(|o| o.name).collect();
    assert_eq!(names, model.keys().cloned().collect::<Vec<_>>(), "{context}: names");
    for (name, data) in model {
        let got = b(store).get(name).unwrap();
        assert!(got == *data, "{context}: {} differs ({} bytes, model {})", String::from_utf8_lossy(name), got.len(), data.len());
    }
}

/// Random object operations (unaligned writes, appends, truncates, clones, removes,
/// syncs of fragment pages), with clean closes and crashes between rounds: every
/// acknowledged operation is there after each reopen, byte for byte. With clean pages
/// (plenty, and so few that they are evicted all the time) and without.
#[test]
fn objects_match_a_model_across_closes_and_crashes() {
    let (small, large) = (Profile::NVSTORE.default_geometry(), Geometry { block_bytes: 8192, page_bytes: 8192, ..Geometry::default() });
    for (geometry, clean_cache_bytes) in [(small, 256 << 20), (large, 16 * 8192), (small, 0)] {
        let fixture = Fixture::new(geometry);
        let mut rng = StdRng::seed_from_u64(seed(&format!("nvstore::model::{}::{clean_cache_bytes}", geometry.block_bytes)));
        let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
        let options = VolumeOptions { clean_cache_bytes, ..quiet() };
        for round in 0..6 {
            let store = fixture.open(&options);
            check_model(&store, &model, &format!("round {round} opening"));
            for step in 0..150 {
                let name = format!("obj{}", rng.random_range(0..8)).into_bytes();
                match rng.random_range(0..20) {
                    0..=9 => {
                        let data = model.entry(name.clone()).or_default();
                        if data.is_empty() && b(&store).stat(&name).is_err() {
                            b(&store).create(&name).unwrap();
                        }
                        let offset = match rng.random_range(0..3) {
                            0 => data.len(),
                            _ => rng.random_range(0..data.len() + 1),
                        };
                        let len = match rng.random_range(0..4) {
                            0 => 2048,
                            1 => rng.random_range(1..600),
                            2 => rng.random_range(1..20_000),
                            _ => geometry.block_bytes as usize * rng.random_range(1..4),
                        };
                        let bytes: Vec<u8> = (0..len).map(|_| rng.random_range(1..=255)).collect();
                        b(&store).write(&name, offset as u64, &bytes).unwrap();
                        if data.len() < offset + len {
                            data.resize(offset + len, 0);
                        }
                        data[offset..offset + len].copy_from_slice(&bytes);
                    }
                    10 | 11 if model.contains_key(&name) => {
                        let size = rng.random_range(0..40_000);
                        b(&store).truncate(&name, size as u64).unwrap();
                        model.get_mut(&name).unwrap().resize(size, 0);
                    }
                    12 if model.contains_key(&name) => {
                        let target = format!("copy{}", rng.random_range(0..3)).into_bytes();
                        b(&store).clone_object(&b(&store), &name, &target).unwrap();
                        let copy = model[&name].clone();
                        model.insert(target, copy);
                    }
                    13 if model.contains_key(&name) => {
                        b(&store).remove(&name).unwrap();
                        model.remove(&name);
                    }
                    14 => {
                        store.volume().migrate_all().unwrap();
                    }
                    15 => {
                        let data: Vec<u8> = (0..rng.random_range(0..9000)).map(|_| rng.random()).collect();
                        b(&store).put(&name, &data).unwrap();
                        model.insert(name, data);
                    }
                    _ => {}
                }
                if step % 50 == 49 {
                    check_model(&store, &model, &format!("round {round} step {step}"));
                }
            }
            if round % 2 == 0 {
                store.simulate_crash();
            } else {
                store.close().unwrap();
            }
        }
        let store = fixture.open(&options);
        check_model(&store, &model, "last open");
        assert_eq!(store.volume().check(), []);
        assert!(counter(&store, Counter::app_writes) > 100, "counters are kept across clean closes");
        store.close().unwrap();
    }
}

/// The SSD offset where `pattern` starts (it is written whole-block aligned).
fn find_on_ssd(ssd: &SimSsd, pattern: &[u8]) -> u64 {
    let image = ssd.peek(0, ssd.len_bytes() as usize);
    image.windows(pattern.len()).step_by(512).position(|w| w == pattern).map(|i| i as u64 * 512).expect("the pattern is on the SSD")
}

/// A flipped bit in an object's block is an error naming the object and offset, never
/// wrong data; other objects still read; a damaged block is not merged into a new one.
#[test]
fn a_damaged_block_is_an_error_naming_the_object() {
    let fixture = Fixture::new(Profile::NVSTORE.default_geometry());
    let store = fixture.open(&quiet());
    let pattern: Vec<u8> = (0..8192u32).map(|i| (i * 7 % 251) as u8 + 1).collect();
    b(&store).put(b"victim", &pattern).unwrap();
    b(&store).put(b"bystander", &[5u8; 8192]).unwrap();
    store.close().unwrap();
    let at = find_on_ssd(&fixture.ssd, &pattern[4096..]);
    fixture.ssd.poke(at + 100, &[pattern[4196] ^ 0x10]);

    let store = fixture.open(&quiet());
    assert_eq!(b(&store).get(b"bystander").unwrap(), [5u8; 8192]);
    let mut head = [0u8; 4096];
    assert_eq!(b(&store).read(b"victim", 0, &mut head).unwrap(), 4096, "the undamaged block reads");
    match b(&store).read(b"victim", 4096, &mut [0u8; 10]) {
        Err(Error::Corrupt { problem, .. }) => {
            assert!(problem.contains("at byte 4096") && problem.contains("checksum"), "{problem}");
        }
        other => panic!("a damaged block read as {other:?}"),
    }
    assert!(b(&store).get(b"victim").is_err());
    assert_eq!(counter(&store, Counter::checksum_errors), 2);
    // A fragment over the damaged block: syncing it must fail, not launder the damage.
    b(&store).write(b"victim", 5000, b"fragment").unwrap();
    assert!(matches!(store.volume().migrate_all(), Err(Error::Corrupt { .. })));
    assert!(b(&store).read(b"victim", 4096, &mut [0u8; 10]).is_err());
    store.close().unwrap();
}

/// An unaligned write inside an existing block is one fragment put and one block-map
/// record: no SSD write, no read, no onode. A sync writes the block once and deletes the
/// fragments, so the next open restores no fragment page.
#[test]
fn an_unaligned_write_is_one_fragment_put_and_a_sync_deletes_it() {
    let fixture = Fixture::new(Profile::NVSTORE.default_geometry());
    let store = fixture.open(&quiet());
    b(&store).put(b"obj", &vec![1u8; 16384]).unwrap();
    let (ssd_before, reads_before) = (counter(&store, Counter::ssd_write_bytes), counter(&store, Counter::ssd_read_bytes));
    let kv = |store: &ObjectStore| {
        [Counter::kv_fragment_bytes, Counter::kv_block_bytes, Counter::kv_onode_bytes, Counter::kv_batches].map(|c| counter(store, c))
    };
    let kv_before = kv(&store);
    for block in 0..4u64 {
        b(&store).write(b"obj", block * 4096 + 2048, &[9u8; 2048]).unwrap();
    }
    assert_eq!(counter(&store, Counter::ssd_write_bytes), ssd_before, "fragments are not SSD writes");
    assert_eq!(counter(&store, Counter::ssd_read_bytes), reads_before, "no read before an unaligned write");
    assert_eq!(store.volume().stats().usage.fast_pages_used, 4, "one fragment page per block");
    let kv_after = kv(&store);
    let traffic: Vec<u64> = kv_after.iter().zip(kv_before).map(|(after, before)| after - before).collect();
    // Per write: a fragment (key 20 B, value 6 B + the bytes), a block record (16 + 13 B),
    // no onode (the size did not change), one synced batch.
    assert_eq!(traffic, [4 * (20 + 6 + 2048), 4 * (16 + 13), 0, 4]);
    store.close().unwrap();
    let store = fixture.open(&quiet());
    assert_eq!(kv(&store), kv_after, "the KV traffic counters are kept across a clean close");
    store.simulate_crash();

    let store = fixture.open(&quiet());
    let mut expected = vec![1u8; 16384];
    for block in 0..4 {
        expected[block * 4096 + 2048..(block + 1) * 4096].fill(9);
    }
    assert_eq!(store.volume().stats().usage.fast_pages_used, 4, "fragment pages come back from the KV store");
    assert_eq!(store.volume().migrate_all().unwrap(), 4);
    assert_eq!(counter(&store, Counter::migration_read_bytes), 4 * 4096, "each block is read once to merge its fragments");
    assert_eq!(b(&store).get(b"obj").unwrap(), expected);
    store.close().unwrap();
    let store = fixture.open(&quiet());
    assert_eq!(store.volume().stats().usage.fast_pages_used, 0, "the synced blocks' fragments are gone");
    assert_eq!(b(&store).get(b"obj").unwrap(), expected);
    store.close().unwrap();
}

/// Fragment pages are synced once the volume has been idle for a while.
#[test]
fn fragment_pages_are_synced_when_the_volume_is_idle() {
    let fixture = Fixture::new(Profile::NVSTORE.default_geometry());
    let store = fixture.open(&VolumeOptions { background: true, ..quiet() });
    b(&store).put(b"obj", &vec![3u8; 8192]).unwrap();
    b(&store).write(b"obj", 100, b"unaligned").unwrap();
    assert_eq!(store.volume().stats().usage.fast_pages_used, 1);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while store.volume().stats().usage.fast_pages_used > 0 {
        assert!(std::time::Instant::now() < deadline, "the idle sync never came");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!(counter(&store, Counter::migrations_idle), 1);
    let mut out = [0u8; 9];
    b(&store).read(b"obj", 100, &mut out).unwrap();
    assert_eq!(&out, b"unaligned");
    store.close().unwrap();
}

/// A fragment page that an append completed is merged without waiting for the volume to
/// be idle, in runs of 256; a page that overwrites completed waits for the idle sync.
#[test]
fn pages_appends_complete_are_merged_while_writes_go_on() {
    let fixture = Fixture::new(Profile::NVSTORE.default_geometry());
    let store = fixture.open(&VolumeOptions { background: true, ..no_clean_pages() });
    b(&store).put(b"rewritten", &vec![1u8; 128 * 4096]).unwrap();
    for block in 0..128u64 {
        b(&store).write(b"rewritten", block * 4096, &[2u8; 2048]).unwrap();
        b(&store).write(b"rewritten", block * 4096 + 2048, &[3u8; 2048]).unwrap();
    }
    b(&store).put(b"log", b"").unwrap();
    let piece: Vec<u8> = (0..2048u32).map(|i| (i % 251) as u8).collect();
    let mut expected = Vec::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    // Appends go on (so the volume is never idle) until the merger has taken a run.
    while counter(&store, Counter::migrations_full) < 64 {
        assert!(std::time::Instant::now() < deadline, "pages appends completed were never merged");
        b(&store).write(b"log", expected.len() as u64, &piece).unwrap();
        expected.extend_from_slice(&piece);
    }
    assert!(expected.len() >= 256 * 4096, "merged before 256 pages were complete");
    assert_eq!(counter(&store, Counter::migrations_idle), 0, "the volume was never idle");
    let pages = store.volume().stats().usage.fast_pages_used;
    assert!(pages >= 128, "the pages overwrites completed wait for the idle sync ({pages} pages left)");
    assert!(pages < 128 + (expected.len() / 4096) as u64, "the merged pages' fragments are gone");
    assert_eq!(b(&store).get(b"log").unwrap(), expected);
    let rewritten: Vec<u8> = (0..128).flat_map(|_| [[2u8; 2048], [3u8; 2048]].concat()).collect();
    assert_eq!(b(&store).get(b"rewritten").unwrap(), rewritten);
    store.close().unwrap();
    let store = fixture.open(&quiet());
    assert_eq!(b(&store).get(b"log").unwrap(), expected);
    assert_eq!(b(&store).get(b"rewritten").unwrap(), rewritten);
    store.close().unwrap();
}

/// The KV directory is part of the volume: missing, foreign or reused directories are
/// clear errors that change nothing.
#[test]
fn the_kv_directory_is_checked() {
    let ssd = || Arc::new(SimSsd::new(16 << 20)) as Arc<dyn BlockDevice>;
    let format =
        FormatOptions { geometry: Profile::NVSTORE.default_geometry(), profile: Profile::NVSTORE, force: false, ..Default::default() };
    let refused = alignfs::Volume::format(&Devices::ssd_only(ssd()), &format);
    assert!(matches!(refused, Err(Error::WrongDevices(m)) if m.to_string().contains("KV store")));

    let first = Fixture::new(Profile::NVSTORE.default_geometry());
    let second = Fixture::new(Profile::NVSTORE.default_geometry());
    let opened = alignfs::Volume::open(Devices::ssd_only(Arc::clone(&first.ssd) as Arc<dyn BlockDevice>), quiet());
    assert!(matches!(opened, Err(Error::WrongDevices(m)) if m.to_string().contains("KV store")));
    let crossed = alignfs::Volume::open(Devices::with_kv(Arc::clone(&first.ssd) as Arc<dyn BlockDevice>, second.kv.path()), quiet());
    assert!(matches!(crossed, Err(Error::VolumeMismatch { .. })), "another volume's KV store");

    // Formatting over a store needs force; over other files it is refused even then.
    let again = alignfs::Volume::format(&Devices::with_kv(ssd(), first.kv.path()), &format);
    assert!(matches!(again, Err(Error::AlreadyFormatted { .. })));
    let foreign = tempfile::tempdir().unwrap();
    std::fs::write(foreign.path().join("notes.txt"), b"keep me").unwrap();
    let forced = FormatOptions { force: true, ..format.clone() };
    assert!(matches!(alignfs::Volume::format(&Devices::with_kv(ssd(), foreign.path()), &forced), Err(Error::WrongDevices(_))));
    assert_eq!(std::fs::read(foreign.path().join("notes.txt")).unwrap(), b"keep me");
    let store = first.open(&quiet());
    b(&store).put(b"kept", b"yes").unwrap();
    store.close().unwrap();
    let replacement = ssd();
    ObjectStore::format(&Devices::with_kv(Arc::clone(&replacement), first.kv.path()), &forced).unwrap();
    let old = alignfs::Volume::open(first.devices(), quiet());
    assert!(matches!(old, Err(Error::VolumeMismatch { .. })), "the old SSD no longer matches the store");
    let store = open_waiting(|| Devices::with_kv(Arc::clone(&replacement), first.kv.path()), &quiet()).unwrap();
    assert!(store.buckets().unwrap().is_empty(), "a forced format starts empty");
    store.close().unwrap();
}

/// A volume an older build formatted (format version 3) opens as it is when read-only;
/// opened writable, it is raised to version 4 before its KV store is opened, since a
/// journal this build starts has a header that a version-3 build would read as the
/// journal's end. A version-3 build refuses version 4; this one refuses what it does not
/// know.
#[test]
fn an_older_volume_is_raised_to_this_format_version_before_its_kv_store_is_written() {
    let fixture = Fixture::new(Profile::NVSTORE.default_geometry());
    let store = fixture.open(&quiet());
    b(&store).put(b"kept", b"across versions").unwrap();
    store.close().unwrap();
    let on_disk = || Superblock::decode(&fixture.ssd.peek(0, 4096), "ssd").unwrap();
    assert_eq!(on_disk().version, FORMAT_VERSION, "a new volume has this build's version");
    fixture.ssd.poke(0, &Superblock { version: 3, ..on_disk() }.encode());

    // Another volume's KV directory, or none, is refused before the raise.
    let other = Fixture::new(Profile::NVSTORE.default_geometry());
    let wrong_kv = Devices::with_kv(Arc::clone(&fixture.ssd) as Arc<dyn BlockDevice>, other.kv.path());
    let refused = alignfs::Volume::open(wrong_kv, quiet());
    assert!(matches!(refused, Err(Error::VolumeMismatch { .. })), "{:?}", refused.err());
    let no_kv = alignfs::Volume::open(Devices::ssd_only(Arc::clone(&fixture.ssd) as Arc<dyn BlockDevice>), quiet());
    assert!(matches!(no_kv, Err(Error::WrongDevices(_))), "{:?}", no_kv.err());
    assert_eq!(on_disk().version, 3, "a refused open writes nothing");

    let read_only = fixture.open(&VolumeOptions { read_only: true, ..quiet() });
    assert_eq!(read_only.volume().superblock().version, 3);
    assert_eq!(b(&read_only).get(b"kept").unwrap(), b"across versions");
    read_only.close().unwrap();
    assert_eq!(on_disk().version, 3, "a read-only open writes nothing");

    let store = fixture.open(&quiet());
    assert_eq!((store.volume().superblock().version, on_disk().version), (FORMAT_VERSION, FORMAT_VERSION));
    b(&store).put(b"new", b"after the raise").unwrap();
    store.close().unwrap();
    let store = fixture.open(&quiet());
    assert_eq!(b(&store).get(b"kept").unwrap(), b"across versions");
    assert_eq!(b(&store).get(b"new").unwrap(), b"after the raise");
    store.close().unwrap();

    let current = on_disk();
    for unknown in [2, FORMAT_VERSION + 1] {
        fixture.ssd.poke(0, &Superblock { version: unknown, ..current.clone() }.encode());
        let refused = alignfs::Volume::open(fixture.devices(), quiet());
        assert!(
            matches!(&refused, Err(Error::Corrupt { problem, .. }) if problem.contains(&format!("format version {unknown}"))),
            "version {unknown}: {:?}",
            refused.err()
        );
    }
}

/// NVStore's Table 2 for reads: a read that hits a fragment page merges it with its block
/// (FP -> DP), so the sync writes the block without reading it; a crash still keeps the
/// fragments, and the block reads the same.
#[test]
fn a_read_turns_a_fragment_page_into_a_dirty_page() {
    let fixture = Fixture::new(Profile::NVSTORE.default_geometry());
    let store = fixture.open(&no_clean_pages());
    b(&store).put(b"obj", &vec![1u8; 8192]).unwrap();
    b(&store).write(b"obj", 100, b"fragment one").unwrap();
    b(&store).write(b"obj", 4096 + 10, b"fragment two").unwrap();
    let mut expected = vec![1u8; 8192];
    expected[100..112].copy_from_slice(b"fragment one");
    expected[4106..4118].copy_from_slice(b"fragment two");
    let mut head = vec![0u8; 4096];
    b(&store).read(b"obj", 0, &mut head).unwrap();
    assert_eq!(head, expected[..4096]);
    assert_eq!(counter(&store, Counter::pages_merged_by_reads), 1, "the first block's page is now dirty");
    b(&store).write(b"obj", 200, b"after the merge").unwrap();
    expected[200..215].copy_from_slice(b"after the merge");
    assert_eq!(b(&store).get(b"obj").unwrap(), expected);
    assert_eq!(counter(&store, Counter::pages_merged_by_reads), 2, "get read both blocks");
    store.simulate_crash();

    // Reopened, both are fragment pages again; a read makes the second one dirty.
    let store = fixture.open(&no_clean_pages());
    let mut tail = vec![0u8; 4096];
    b(&store).read(b"obj", 4096, &mut tail).unwrap();
    assert_eq!(tail, expected[4096..], "the fragments rebuild the same bytes");
    assert_eq!(store.volume().migrate_all().unwrap(), 2);
    assert_eq!(counter(&store, Counter::migration_read_bytes), 4096, "only the fragment page is read to sync; the dirty one is not");
    assert_eq!(b(&store).get(b"obj").unwrap(), expected);
    store.close().unwrap();
}

/// NVStore's Table 2 for clean pages: an aligned write makes clean pages that reads hit;
/// an unaligned write to one makes a dirty page with no device read (CP -> DP), whose
/// read and sync read nothing either, and the sync leaves a clean page again. After a
/// crash the cache is empty: a read fetches the block once and keeps it.
#[test]
fn clean_pages_serve_reads_and_turn_dirty_on_an_unaligned_write() {
    let fixture = Fixture::new(Profile::NVSTORE.default_geometry());
    let store = fixture.open(&quiet());
    let device_reads = |store: &ObjectStore| counter(store, Counter::ssd_read_bytes);
    b(&store).put(b"obj", &vec![1u8; 8192]).unwrap();
    assert_eq!(b(&store).get(b"obj").unwrap(), vec![1u8; 8192]);
    assert_eq!((device_reads(&store), counter(&store, Counter::clean_page_hits)), (0, 2), "both blocks read from clean pages");

    b(&store).write(b"obj", 100, b"dirty").unwrap();
    let mut expected = vec![1u8; 8192];
    expected[100..105].copy_from_slice(b"dirty");
    assert_eq!(counter(&store, Counter::pages_dirtied_from_clean), 1);
    assert_eq!(b(&store).get(b"obj").unwrap(), expected);
    assert_eq!(store.volume().migrate_all().unwrap(), 1);
    assert_eq!(counter(&store, Counter::migration_read_bytes), 0, "a dirty page is synced without a read");
    assert_eq!(b(&store).get(b"obj").unwrap(), expected);
    assert_eq!(device_reads(&store), 0, "the synced block is a clean page");
    b(&store).write(b"obj", 5000, b"fragment").unwrap();
    expected[5000..5008].copy_from_slice(b"fragment");
    store.simulate_crash();

    let store = fixture.open(&quiet());
    let mut head = vec![0u8; 4096];
    b(&store).read(b"obj", 0, &mut head).unwrap();
    assert_eq!(device_reads(&store), 4096, "a read miss fetches the block");
    b(&store).read(b"obj", 0, &mut head).unwrap();
    assert_eq!(device_reads(&store), 4096, "and keeps it as a clean page");
    assert_eq!(head, expected[..4096]);
    b(&store).write(b"obj", 10, b"after the crash").unwrap();
    expected[10..25].copy_from_slice(b"after the crash");
    // Counters restart from the last clean close after a crash.
    assert_eq!(counter(&store, Counter::pages_dirtied_from_clean), 1, "the read's clean page became dirty");
    assert_eq!(b(&store).get(b"obj").unwrap(), expected, "the fragments rebuilt the second block");
    store.close().unwrap();
    let store = fixture.open(&quiet());
    assert_eq!(b(&store).get(b"obj").unwrap(), expected);
    store.close().unwrap();
}

/// Group commit: writers at once share the KV store's syncs (one sync covers every
/// batch appended before it started), and every write acknowledged to any of them is
/// there after a crash.
#[test]
fn concurrent_writers_share_syncs() {
    let fixture = Fixture::new(Profile::NVSTORE.default_geometry());
    let store = fixture.open(&quiet());
    let names: Vec<Vec<u8>> = (0..8).map(|t| format!("writer{t}").into_bytes()).collect();
    for name in &names {
        b(&store).create(name).unwrap();
    }
    let before = [Counter::kv_batches, Counter::kv_syncs].map(|c| counter(&store, c));
    std::thread::scope(|scope| {
        for (t, name) in names.iter().enumerate() {
            let bucket = b(&store);
            scope.spawn(move || {
                for i in 0..40u64 {
                    bucket.write(name, i * 2048, &[t as u8 + 1; 2048]).unwrap();
                }
            });
        }
    });
    let [batches, syncs] = [Counter::kv_batches, Counter::kv_syncs].map(|c| counter(&store, c));
    let (batches, syncs) = (batches - before[0], syncs - before[1]);
    assert_eq!(batches, 8 * 40, "one batch per write");
    assert!(syncs > 0 && syncs < batches, "{syncs} syncs for {batches} batches");
    store.simulate_crash();

    let store = fixture.open(&quiet());
    for (t, name) in names.iter().enumerate() {
        assert!(b(&store).get(name).unwrap() == vec![t as u8 + 1; 40 * 2048], "writer {t}");
    }
    store.close().unwrap();
}

/// A multipart upload's assembly: parts at block boundaries are shared, not written
/// again; a part after an unaligned one is copied. The object reads back whole after the
/// parts go, and across a reopen.
#[test]
fn parts_appended_at_block_boundaries_share_their_blocks() {
    let fixture = Fixture::new(Profile::NVSTORE.default_geometry());
    let store = fixture.open(&quiet());
    let block = Profile::NVSTORE.default_geometry().block_bytes as usize;
    let sizes = [64 * block, 32 * block + 100, 5000];
    let parts: Vec<Vec<u8>> = sizes.iter().enumerate().map(|(i, &len)| (0..len).map(|j| (j * 31 + i) as u8).collect()).collect();
    for (i, part) in parts.iter().enumerate() {
        b(&store).put(format!("part{i}").as_bytes(), part).unwrap();
    }
    store.volume().migrate_all().unwrap();
    let written = counter(&store, Counter::ssd_write_bytes);
    let staged = store.stage().unwrap();
    let mut offset = 0;
    for i in 0..parts.len() {
        offset += staged.append_from(&b(&store), format!("part{i}").as_bytes(), offset).unwrap();
    }
    let mut transaction = store.transaction();
    transaction.publish(staged, &b(&store), b"whole").unwrap();
    for i in 0..parts.len() {
        transaction.remove(&b(&store), format!("part{i}").as_bytes()).unwrap();
    }
    transaction.commit().unwrap();
    let copied = counter(&store, Counter::ssd_write_bytes) - written;
    // Only the third part, after the unaligned second, is copied.
    assert!(copied < 4 * block as u64, "{copied} bytes written to assemble {} bytes of parts", sizes.iter().sum::<usize>());
    let whole = parts.concat();
    assert!(b(&store).get(b"whole").unwrap() == whole);
    assert_eq!(store.volume().check(), []);
    store.close().unwrap();
    let store = fixture.open(&quiet());
    assert!(b(&store).get(b"whole").unwrap() == whole);
    assert_eq!(b(&store).list(b"", None, 10).unwrap().len(), 1);
    assert_eq!(store.volume().check(), []);
    store.close().unwrap();
}

/// A put syncs the KV store once, when it publishes: the staged object's own commits
/// (its creation, its data) ride in that sync (`Volume::set_scratch_dir`).
#[test]
fn a_put_syncs_once() {
    let fixture = Fixture::new(Profile::NVSTORE.default_geometry());
    let store = fixture.open(&quiet());
    for size in [2048, 6000, 70_000, 1 << 20] {
        let syncs = counter(&store, Counter::kv_syncs);
        b(&store).put(format!("o{size}").as_bytes(), &vec![3u8; size]).unwrap();
        assert_eq!(counter(&store, Counter::kv_syncs) - syncs, 1, "a put of {size} bytes");
    }
    // A published object's writes are synced as before.
    let syncs = counter(&store, Counter::kv_syncs);
    b(&store).write(b"o2048", 100, b"abc").unwrap();
    assert_eq!(counter(&store, Counter::kv_syncs) - syncs, 1);
    store.simulate_crash();
    let store = fixture.open(&quiet());
    for size in [2048, 6000, 70_000, 1 << 20] {
        let mut want = vec![3u8; size];
        if size == 2048 {
            want[100..103].copy_from_slice(b"abc");
        }
        assert!(b(&store).get(format!("o{size}").as_bytes()).unwrap() == want, "o{size} after a crash");
    }
    assert_eq!(store.volume().check(), []);
    store.close().unwrap();
}

/// One object operation of the crash tests, derived from a seed and the objects so far.
enum ObjectOp {
    Write {
        name: Vec<u8>,
        offset: usize,
        data: Vec<u8>,
    },
    Truncate {
        name: Vec<u8>,
        size: usize,
    },
    Put {
        name: Vec<u8>,
        data: Vec<u8>,
    },
    Remove {
        name: Vec<u8>,
    },
    Clone {
        from: Vec<u8>,
        to: Vec<u8>,
    },
    /// Staged objects published under distinct names and an object removed, atomically.
    Transaction {
        publish: Vec<(Vec<u8>, Vec<u8>)>,
        remove: Option<Vec<u8>>,
    },
    /// Merge every fragment page into whole blocks now.
    Sync,
}

type Objects = BTreeMap<Vec<u8>, Vec<u8>>;

impl ObjectOp {
    fn describe(&self) -> String {
        let name = |n: &[u8]| String::from_utf8_lossy(n).into_owned();
        match self {
            ObjectOp::Write { name: n, offset, data } => format!("write {} bytes at {offset} of {}", data.len(), name(n)),
            ObjectOp::Truncate { name: n, size } => format!("truncate {} to {size}", name(n)),
            ObjectOp::Put { name: n, data } => format!("put {} bytes as {}", data.len(), name(n)),
            ObjectOp::Remove { name: n } => format!("remove {}", name(n)),
            ObjectOp::Clone { from, to } => format!("clone {} to {}", name(from), name(to)),
            ObjectOp::Transaction { publish, remove } => {
                let published: Vec<String> = publish.iter().map(|(n, data)| format!("{} ({} bytes)", name(n), data.len())).collect();
                format!("transaction: publish {}, remove {}", published.join(", "), remove.as_deref().map_or("nothing".into(), name))
            }
            ObjectOp::Sync => "sync fragment pages".into(),
        }
    }
}

fn next_op(rng: &mut StdRng, model: &Objects) -> ObjectOp {
    let name = format!("o{}", rng.random_range(0..6)).into_bytes();
    let exists = model.contains_key(&name);
    match rng.random_range(0..12) {
        10 => {
            let mut publish = vec![(name, (0..rng.random_range(0..9000)).map(|_| rng.random()).collect())];
            let second = format!("o{}", rng.random_range(0..6)).into_bytes();
            if publish[0].0 != second {
                publish.push((second, (0..rng.random_range(1..3000)).map(|_| rng.random()).collect()));
            }
            let candidates: Vec<&Vec<u8>> = model.keys().filter(|n| publish.iter().all(|(p, _)| p != *n)).collect();
            let remove =
                (!candidates.is_empty() && rng.random_bool(0.7)).then(|| candidates[rng.random_range(0..candidates.len())].clone());
            ObjectOp::Transaction { publish, remove }
        }
        11 => ObjectOp::Sync,
        0 if exists => ObjectOp::Truncate { name, size: rng.random_range(0..30_000) },
        1 if exists => ObjectOp::Remove { name },
        2 if exists => ObjectOp::Clone { from: name, to: format!("c{}", rng.random_range(0..2)).into_bytes() },
        0..=3 => ObjectOp::Put { name, data: (0..rng.random_range(0..20_000)).map(|_| rng.random()).collect() },
        _ if !exists => ObjectOp::Put { name, data: vec![rng.random(); rng.random_range(1..5000)] },
        _ => {
            let len = model[&name].len();
            let offset = rng.random_range(0..len + 1);
            let size = if rng.random_bool(0.6) { rng.random_range(1..3000) } else { rng.random_range(1..12_000) };
            ObjectOp::Write { name, offset, data: (0..size).map(|_| rng.random()).collect() }
        }
    }
}

fn apply_to_model(model: &mut Objects, op: &ObjectOp) {
    match op {
        ObjectOp::Write { name, offset, data } => {
            let object = model.get_mut(name).expect("writes go to existing objects");
            if object.len() < offset + data.len() {
                object.resize(offset + data.len(), 0);
            }
            object[*offset..offset + data.len()].copy_from_slice(data);
        }
        ObjectOp::Truncate { name, size } => model.get_mut(name).expect("exists").resize(*size, 0),
        ObjectOp::Put { name, data } => drop(model.insert(name.clone(), data.clone())),
        ObjectOp::Remove { name } => drop(model.remove(name)),
        ObjectOp::Clone { from, to } => {
            let copy = model[from].clone();
            model.insert(to.clone(), copy);
        }
        ObjectOp::Transaction { publish, remove } => {
            model.extend(publish.iter().cloned());
            if let Some(name) = remove {
                model.remove(name);
            }
        }
        ObjectOp::Sync => {}
    }
}

fn apply_to_store(store: &ObjectStore, op: &ObjectOp) -> alignfs::Result<()> {
    match op {
        ObjectOp::Write { name, offset, data } => b(store).write(name, *offset as u64, data),
        ObjectOp::Truncate { name, size } => b(store).truncate(name, *size as u64),
        ObjectOp::Put { name, data } => b(store).put(name, data),
        ObjectOp::Remove { name } => b(store).remove(name),
        ObjectOp::Clone { from, to } => b(store).clone_object(&b(store), from, to),
        ObjectOp::Transaction { publish, remove } => {
            let bucket = b(store);
            let mut transaction = store.transaction();
            for (name, data) in publish {
                let staged = store.stage()?;
                staged.write(0, data)?;
                transaction.publish(staged, &bucket, name)?;
            }
            if let Some(name) = remove {
                transaction.remove(&bucket, name)?;
            }
            transaction.commit()
        }
        ObjectOp::Sync => store.volume().migrate_all().map(drop),
    }
}

fn read_all(store: &ObjectStore) -> Objects {
    try_read_all(store).unwrap()
}

fn try_read_all(store: &ObjectStore) -> alignfs::Result<Objects> {
    b(store).list(b"", None, usize::MAX)?.into_iter().map(|o| Ok((o.name.clone(), b(store).get(&o.name)?))).collect()
}

/// What a crash may leave: the objects as acknowledged (`before`), or with the operation
/// in flight applied (`after`); a write in flight may have landed in part, each byte of
/// its object old or new.
fn recovered_as_acknowledged(found: &Objects, before: &Objects, after: &Objects, in_flight: &ObjectOp) -> Result<(), String> {
    if found == before || found == after {
        return Ok(());
    }
    let lengths = |name: &Vec<u8>| {
        format!(
            "found {:?}, acknowledged {:?}, in flight {:?}",
            found.get(name).map(Vec::len),
            before.get(name).map(Vec::len),
            after.get(name).map(Vec::len)
        )
    };
    let differing =
        found.keys().chain(before.keys()).find(|name| found.get(*name) != before.get(*name)).expect("found differs from before");
    let ObjectOp::Write { name, .. } = in_flight else {
        return Err(format!(
            "{} is neither as acknowledged nor as the operation in flight left it ({})",
            String::from_utf8_lossy(differing),
            lengths(differing)
        ));
    };
    let others_unchanged = found.keys().chain(before.keys()).all(|n| n == name || found.get(n) == before.get(n));
    let (got, old, new) = (found.get(name), before.get(name), after.get(name));
    let byte = |v: Option<&Vec<u8>>, i: usize| v.and_then(|v| v.get(i)).copied().unwrap_or(0);
    let blend = got.is_some_and(|g| {
        [old, new].iter().any(|v| v.is_some_and(|v| v.len() == g.len()))
            && g.iter().enumerate().all(|(i, b)| *b == byte(old, i) || *b == byte(new, i))
    });
    match (others_unchanged, blend) {
        (true, true) => Ok(()),
        (false, _) => {
            Err(format!("{} changed, but only {} was being written", String::from_utf8_lossy(differing), String::from_utf8_lossy(name)))
        }
        (true, false) => Err(format!("{} holds bytes neither old nor new ({})", String::from_utf8_lossy(name), lengths(name))),
    }
}

const CHILD_ENV: &str = "ALIGNFS_NVSTORE_KILL_CHILD";

/// The child of the kill -9 test: run operations from a seed until killed, printing
/// `ack N` once operation N returned.
fn kill_child(spec: &str) {
    use std::io::Write;
    let mut parts = spec.split('|');
    let (ssd, kv, seed) = (parts.next().unwrap(), parts.next().unwrap(), parts.next().unwrap().parse::<u64>().unwrap());
    let options = VolumeOptions { background: true, ..quiet() };
    let store = alignfs::paths::open_object_paths(std::path::Path::new(ssd), Some(std::path::Path::new(kv)), options, None).unwrap();
    let mut model = read_all(&store);
    let mut rng = StdRng::seed_from_u64(seed);
    let mut out = std::io::stdout().lock();
    for n in 1.. {
        let op = next_op(&mut rng, &model);
        apply_to_store(&store, &op).unwrap();
        apply_to_model(&mut model, &op);
        writeln!(out, "ack {n}").unwrap();
        out.flush().unwrap();
    }
}

/// A process writing objects is killed with SIGKILL at random moments: after each kill,
/// every acknowledged operation is there, and the one in flight is there or not (each
/// byte of its object old or new), never anything else.
#[test]
fn acknowledged_operations_survive_kill_9() {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        kill_child(&spec);
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (ssd, kv) = (dir.path().join("ssd.img"), dir.path().join("kv"));
    let spec = alignfs::paths::DeviceSpec { path: ssd.clone(), size: Some(96 << 20) };
    let format =
        FormatOptions { geometry: Profile::NVSTORE.default_geometry(), profile: Profile::NVSTORE, force: false, ..Default::default() };
    let store = alignfs::paths::format_object_paths(&[spec], Some(&kv), &format, None).unwrap().1;
    store.create_bucket(b"b").unwrap();
    store.close().unwrap();
    let mut rng = StdRng::seed_from_u64(seed("nvstore::kill_9"));
    let mut model = Objects::new();
    let mut total = 0;
    for round in 0..6 {
        let child_seed: u64 = rng.random();
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "acknowledged_operations_survive_kill_9", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, format!("{}|{}|{child_seed}", ssd.display(), kv.display()))
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(rng.random_range(150..700)));
        child.kill().unwrap();
        let output = child.wait_with_output().unwrap();
        let acked = String::from_utf8_lossy(&output.stdout)
            .lines()
            .filter_map(|l| l.strip_prefix("ack ").and_then(|n| n.parse::<usize>().ok()))
            .max()
            .unwrap_or(0);
        total += acked;
        let mut ops = StdRng::seed_from_u64(child_seed);
        for _ in 0..acked {
            let op = next_op(&mut ops, &model);
            apply_to_model(&mut model, &op);
        }
        let mut after = model.clone();
        let in_flight = next_op(&mut ops, &model);
        apply_to_model(&mut after, &in_flight);

        let options = VolumeOptions { background: false, ..quiet() };
        let store = alignfs::paths::open_object_paths(&ssd, Some(&kv), options, None).unwrap();
        let found = read_all(&store);
        if let Err(e) = recovered_as_acknowledged(&found, &model, &after, &in_flight) {
            panic!("round {round}, {acked} acknowledged, in flight {}: {e}", in_flight.describe());
        }
        assert_eq!(store.volume().check(), [], "round {round}");
        model = found;
        store.close().unwrap();
    }
    eprintln!("kill -9: 6 rounds, {total} operations acknowledged");
    assert!(total > 30, "the children acknowledged only {total} operations");
}

const POWER_LOSS_SSD_BYTES: u64 = 8 << 20;

/// A recorded run for the power-loss test: the events of the SSD and the KV directory,
/// where each operation started and ended in them, and the objects after each
/// acknowledged operation (`models[k]` = after the first `k`).
struct ObjectTrace {
    events: Vec<Event>,
    /// The KV store's files as written at each persistence point (`PowerLog::kv_written_at`).
    kv_written: BTreeMap<usize, Arc<DirSnapshot>>,
    setup_end: usize,
    ops: Vec<(ObjectOp, usize, usize)>,
    models: Vec<Objects>,
}

/// A new object store (bucket `b`) whose SSD and KV directory record into the log.
fn recorded_store() -> (Arc<PowerLog>, tempfile::TempDir, ObjectStore) {
    let log = PowerLog::new();
    let ssd: Arc<dyn BlockDevice> = Arc::new(RecordedSsd::new(Arc::new(SimSsd::new(POWER_LOSS_SSD_BYTES)), Arc::clone(&log)));
    let kv = tempfile::tempdir().unwrap();
    let devices = || Devices::with_recorded_kv(Arc::clone(&ssd), kv.path(), Arc::clone(&log));
    let format =
        FormatOptions { geometry: Profile::NVSTORE.default_geometry(), profile: Profile::NVSTORE, force: false, ..Default::default() };
    ObjectStore::format(&devices(), &format).unwrap();
    let store = open_waiting(devices, &no_clean_pages()).unwrap();
    store.create_bucket(b"b").unwrap();
    (log, kv, store)
}

fn record_objects(rng: &mut StdRng, count: usize) -> ObjectTrace {
    let (log, _kv, store) = recorded_store();
    let setup_end = log.position();
    let (mut model, mut ops) = (Objects::new(), Vec::new());
    let mut models = vec![model.clone()];
    for _ in 0..count {
        let op = next_op(rng, &model);
        let start = log.position();
        apply_to_store(&store, &op).unwrap_or_else(|e| panic!("{}: {e}", op.describe()));
        apply_to_model(&mut model, &op);
        ops.push((op, start, log.position()));
        models.push(model.clone());
    }
    store.simulate_crash();
    let events = log.events();
    let kv_written = (0..events.len()).filter_map(|at| Some((at, log.kv_written_at(at)?))).collect();
    ObjectTrace { events, kv_written, setup_end, ops, models }
}

/// Crash images of an `nvstore` volume at every persistence point of random object
/// workloads (unaligned writes, puts, truncates, clones, removes, transactions, fragment
/// syncs): each opens, passes fsck, reads back with every block's checksum verified, and
/// holds the acknowledged objects, with the operation in flight landed or not (a
/// transaction whole). Two images per point: only what was durable; and half of the
/// unflushed SSD sectors with the KV files torn part of the way to what the store had
/// written to them when the power failed (a prefix of those bytes, or any of their
/// sectors).
#[test]
fn object_workloads_survive_every_power_loss_image() {
    let seed = seed("nvstore::object_workloads_survive_every_power_loss_image");
    let mut rng = StdRng::seed_from_u64(seed);
    let (mut points, mut images, mut in_flight_images, mut torn, mut sector_torn) = (0u64, 0u64, 0u64, 0u64, 0u64);
    for round in 0..scaled(3) {
        let trace = record_objects(&mut rng, 40);
        let mut replay = Replay::new(0, POWER_LOSS_SSD_BYTES);
        let crash_points = (0..trace.events.len()).filter(|&i| trace.events[i].is_persistence_point()).chain([trace.events.len()]);
        for point in crash_points.filter(|&p| p >= trace.setup_end) {
            while replay.position() < point {
                replay.apply(&trace.events[replay.position()]);
            }
            let acked = trace.ops.iter().take_while(|(_, _, end)| *end <= point).count();
            // What the KV store had written to its files when the power failed.
            let written = trace.kv_written.get(&point);
            points += 1;
            for (survival, fraction) in [(0.0, None), (0.5, written.map(|_| rng.random_range(0.0..1.0)))] {
                let image = replay.image(Survival { fast_word: 0.0, ssd_sector: survival }, &mut |p| rng.random_bool(p));
                let synced = image.kv.expect("the format synced the KV store");
                let by_sectors = fraction.is_some() && rng.random_bool(0.5);
                let kv = match (fraction, written) {
                    (Some(fraction), Some(written)) if by_sectors => synced.torn_by_sectors(written, &mut || rng.random_bool(fraction)),
                    (Some(fraction), Some(written)) => synced.torn_toward(written, fraction),
                    _ => (*synced).clone(),
                };
                // The KV store's appends are not events: an operation that starts at
                // `point` may have appended before its first one, and a torn image holds
                // some of that.
                let in_flight = trace.ops.get(acked).filter(|(_, start, _)| *start < point || (fraction.is_some() && *start == point));
                let after = &trace.models[acked + usize::from(in_flight.is_some())];
                let dir = tempfile::tempdir().unwrap();
                kv.restore(dir.path()).unwrap();
                let context = || {
                    let op = in_flight.map_or("nothing".to_string(), |(op, _, _)| op.describe());
                    format!(
                        "round {round} (seed {seed}): crash before event {point} of {}, {acked} ops acknowledged, in flight {op}, \
                         SSD survival {survival}, KV torn {fraction:?} (by sectors: {by_sectors})",
                        trace.events.len()
                    )
                };
                let ssd = Arc::new(SimSsd::with_contents(image.ssd));
                let devices = Devices::with_kv(Arc::clone(&ssd) as Arc<dyn BlockDevice>, dir.path());
                let store = ObjectStore::open(devices, no_clean_pages()).unwrap_or_else(|e| panic!("{}: recovery failed: {e}", context()));
                let problems = store.volume().check();
                assert!(problems.is_empty(), "{}: fsck found {problems:?}", context());
                let found = try_read_all(&store).unwrap_or_else(|e| panic!("{}: reading the objects back failed: {e}", context()));
                let verdict = match in_flight {
                    Some((op, _, _)) => recovered_as_acknowledged(&found, &trace.models[acked], after, op),
                    None if found == trace.models[acked] => Ok(()),
                    None => Err("the objects differ from those acknowledged".to_string()),
                };
                if let Err(e) = verdict {
                    panic!("{}: {e}", context());
                }
                images += 1;
                in_flight_images += u64::from(in_flight.is_some());
                torn += u64::from(kv != *synced);
                sector_torn += u64::from(by_sectors && kv != *synced);
                // Now and then, keep using the recovered store: new objects land, and a
                // clean reopen reads back the same.
                if images % 16 == 0 {
                    b(&store).put(b"after-recovery", &[7u8; 10_000]).unwrap();
                    b(&store).write(b"after-recovery", 100, &[8u8; 300]).unwrap();
                    let before_close = read_all(&store);
                    store.close().unwrap();
                    let store =
                        open_waiting(|| Devices::with_kv(Arc::clone(&ssd) as Arc<dyn BlockDevice>, dir.path()), &no_clean_pages()).unwrap();
                    assert_eq!(store.volume().check(), [], "{}: fsck after reuse", context());
                    assert!(read_all(&store) == before_close, "{}: reopen after reuse differs", context());
                    store.close().unwrap();
                } else {
                    store.simulate_crash();
                }
            }
        }
    }
    eprintln!(
        "power loss, nvstore objects: {points} crash points, {images} images ({in_flight_images} with an operation in flight, \
         {torn} with KV files torn part of the way to what was written to them, {sector_torn} of them by sectors), all recovered and \
         checked"
    );
    assert!(images >= 200, "too few images ({images}) to mean much");
}

/// A truncate into a block held as fragments gives the block a new fragment page (its
/// bytes up to the new size). Torn anywhere on the way to its sync, the KV store holds
/// the object as before the truncate or as after it: never the new page's zeros under
/// the old size (the page's put waits for the commit that maps it).
#[test]
fn a_truncate_torn_anywhere_is_whole_or_absent() {
    let (log, _kv, store) = recorded_store();
    let data: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8 + 1).collect();
    b(&store).put(b"o", &data).unwrap();
    b(&store).write(b"o", 9000, &[9; 700]).unwrap();
    let mut before = data.clone();
    before[9000..9700].fill(9);
    let start = log.position();
    b(&store).truncate(b"o", 8500).unwrap();
    let after = before[..8500].to_vec();
    store.simulate_crash();
    let events = log.events();
    let synced_at = |i: usize| match &events[i] {
        Event::KvSync(snapshot) => Some(Arc::clone(snapshot)),
        _ => None,
    };
    let last_before = (0..start).rev().find_map(synced_at).expect("the setup synced");
    let truncate_sync = (start..events.len()).find_map(synced_at).expect("the truncate synced");
    let mut replay = Replay::new(0, POWER_LOSS_SSD_BYTES);
    for event in &events {
        replay.apply(event);
    }
    let ssd_image = replay.image(Survival { fast_word: 0.0, ssd_sector: 1.0 }, &mut |_| true).ssd;
    let mut seen = std::collections::BTreeSet::new();
    let mut recover = |kv: DirSnapshot, tear: &str| {
        let dir = tempfile::tempdir().unwrap();
        kv.restore(dir.path()).unwrap();
        let devices = Devices::with_kv(Arc::new(SimSsd::with_contents(ssd_image.clone())) as Arc<dyn BlockDevice>, dir.path());
        let store = ObjectStore::open(devices, no_clean_pages()).unwrap_or_else(|e| panic!("torn {tear}: {e}"));
        let got = b(&store).get(b"o").unwrap();
        assert!(got == before || got == after, "torn {tear}: {} bytes, neither before nor after the truncate", got.len());
        seen.insert(got.len());
        assert_eq!(store.volume().check(), [], "torn {tear}");
        store.simulate_crash();
    };
    for step in 0..=40 {
        recover(last_before.torn_toward(&truncate_sync, f64::from(step) / 40.0), &format!("at {step}/40"));
    }
    // A power cut during the sync may keep any of the sectors it wrote.
    let mut rng = StdRng::seed_from_u64(seed("nvstore::a_truncate_torn_anywhere_is_whole_or_absent"));
    for tear in 0..40 {
        let keep = rng.random_range(0.0..1.0);
        recover(last_before.torn_by_sectors(&truncate_sync, &mut || rng.random_bool(keep)), &format!("by sectors, #{tear}"));
    }
    assert_eq!(seen.len(), 2, "both outcomes among the tears");
}
