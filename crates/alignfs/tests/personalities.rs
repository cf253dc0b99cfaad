#![allow(clippy::unwrap_used)]
//! The block-volume and object-store personalities on simulated devices: written, read
//! back against a model, reopened, checked clean by fsck, for both profiles.

mod common;

use alignfs::device::mssd::{MemorySemanticSsd, MssdConfig, MssdOptions};
use alignfs::profile::DeviceKind;
use std::sync::Arc;

use alignfs::device::{BlockDevice, SimSsd};
use alignfs::personality::{BlockLayout, BlockVolume, ObjectStore};
use alignfs::stats::Counter;
use alignfs::test_support::seed;
use alignfs::{Devices, Error, FormatOptions, Geometry, Profile, VolumeOptions};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const VOLUME_BYTES: u64 = 4 << 20;

/// Fresh simulated devices for a profile, the options to open them with, and the
/// directory of its KV store when it keeps one (removed when dropped).
fn devices(profile: Profile) -> (Devices, FormatOptions, VolumeOptions, Option<tempfile::TempDir>) {
    let ssd = Arc::new(SimSsd::new(32 << 20)) as Arc<dyn BlockDevice>;
    let mut kv_dir = None;
    let devices = if profile.devices() == DeviceKind::FastTierAndSsd {
        Devices::new(Arc::new(alignfs::device::PmemRegion::anonymous(8 << 20).unwrap()), ssd)
    } else if profile.devices() == DeviceKind::MemorySemanticSsd {
        let config = MssdConfig { log_bytes: 2 << 20, ..MssdConfig::new(32 << 20) };
        let (dram, flash) = MemorySemanticSsd::sizes(&config).unwrap();
        let dram = Arc::new(alignfs::device::PmemRegion::anonymous(dram).unwrap());
        let device = MemorySemanticSsd::format(Arc::new(SimSsd::new(flash)), dram, &config, MssdOptions::default()).unwrap();
        Devices::memory_semantic(Arc::new(device))
    } else if profile.devices() == DeviceKind::SsdAndKvStore {
        let dir = kv_dir.insert(tempfile::tempdir().unwrap());
        Devices::with_kv(ssd, dir.path())
    } else {
        Devices::ssd_only(ssd)
    };
    let geometry = if profile == Profile::SCRAP {
        Geometry { block_bytes: 64 << 10, page_bytes: 64 << 10, split_bytes: 64 << 10, io_workers: 1 }
    } else {
        profile.default_geometry()
    };
    let options = VolumeOptions { scrap_mem_bytes: 1 << 20, ..VolumeOptions::default() };
    (devices, FormatOptions { geometry, profile, force: false, ..Default::default() }, options, kv_dir)
}

#[test]
fn a_block_volume_reads_back_what_was_written_across_reopen() {
    for profile in Profile::all() {
        let mut rng = StdRng::seed_from_u64(seed(&format!("personalities::block_volume::{}", profile.name())));
        let (devices, format, options, _kv) = devices(profile);
        // uhs keeps two static ranges in its NVM zone: requests cross their edges.
        let nvm_ranges = if profile == Profile::UHS { vec![0..65536, (1 << 20) + 512..(1 << 20) + 40960] } else { Vec::new() };
        let layout = BlockLayout { nvm_ranges: nvm_ranges.clone(), ..BlockLayout::new(VOLUME_BYTES) };
        BlockVolume::format(&devices, &format, layout).unwrap();
        let disk = BlockVolume::open(devices.clone(), options.clone()).unwrap();
        assert_eq!(disk.layout().nvm_ranges, nvm_ranges);
        assert_eq!(disk.size(), VOLUME_BYTES);
        let mtime = disk.volume().getattr(disk.volume().lookup(alignfs::Ino::ROOT, b"volume").unwrap().ino).unwrap().mtime;
        let namespace_records = || disk.volume().stats().counters.iter().find(|(c, _)| *c == Counter::namespace_records).map(|(_, v)| *v);
        let before = namespace_records();
        let mut model = vec![0u8; VOLUME_BYTES as usize];
        let (mut writes, mut written, mut reads, mut read_bytes, mut cached_reads) = (0, 0, 0, 0, 0);
        for _ in 0..300 {
            let len = if rng.random_bool(0.5) { rng.random_range(1..8192) } else { 4096 * rng.random_range(1..64) };
            let offset = rng.random_range(0..VOLUME_BYTES - len);
            match rng.random_range(0..11) {
                0 => {
                    disk.trim(offset, len).unwrap();
                    model[offset as usize..(offset + len) as usize].fill(0);
                }
                1 => disk.flush().unwrap(),
                // A read that must not wait for the device: the model's bytes, or nothing.
                2 => {
                    let mut out = vec![0u8; len as usize];
                    match disk.read_if_cached(offset, &mut out) {
                        Ok(()) => {
                            assert!(out == model[offset as usize..(offset + len) as usize], "{}: a cached read differs", profile.name());
                            cached_reads += 1;
                        }
                        Err(Error::WouldBlock) => continue,
                        Err(e) => panic!("{}: {e}", profile.name()),
                    }
                    // The NVM zone's pieces are not the engine's reads.
                    if !nvm_ranges.iter().any(|r| r.start < offset + len && offset < r.end) {
                        (reads, read_bytes) = (reads + 1, read_bytes + len);
                    }
                }
                _ => {
                    let data: Vec<u8> = (0..len).map(|_| rng.random()).collect();
                    disk.write(offset, &data).unwrap();
                    model[offset as usize..(offset + len) as usize].copy_from_slice(&data);
                    (writes, written) = (writes + 1, written + len);
                }
            }
        }
        let mut out = vec![0u8; VOLUME_BYTES as usize];
        disk.read(0, &mut out).unwrap();
        assert!(out == model, "{}: contents differ from the model", profile.name());
        if nvm_ranges.is_empty() {
            assert_eq!(disk.io(), (writes, written, reads + 1, read_bytes + VOLUME_BYTES), "{}: the object's own counters", profile.name());
        }
        // On a simulated SSD (memory) every read can be served without waiting, except
        // where blocks carry checksums or come through a memory-semantic SSD's firmware.
        if profile.devices() == DeviceKind::FastTierAndSsd || profile == Profile::SCRAP {
            assert!(cached_reads > 0, "{}: no read was served from memory", profile.name());
        }
        // Writes journal data records only (map edits): no namespace record, and the
        // object's size and times stay as formatted.
        assert_eq!(namespace_records(), before);
        let attr = disk.volume().getattr(disk.volume().lookup(alignfs::Ino::ROOT, b"volume").unwrap().ino).unwrap();
        assert_eq!((attr.size, attr.mtime), (VOLUME_BYTES, mtime));
        // Out of range is refused and changes nothing.
        assert!(matches!(disk.write(VOLUME_BYTES - 1, b"xy"), Err(Error::OutOfRange { .. })));
        assert!(matches!(disk.read(u64::MAX, &mut [0u8; 1]), Err(Error::OutOfRange { .. })));
        disk.close().unwrap();

        let disk = BlockVolume::open(devices.clone(), options.clone()).unwrap();
        disk.read(0, &mut out).unwrap();
        assert!(out == model, "{}: contents differ after reopening", profile.name());
        assert_eq!(disk.volume().check(), [], "{}", profile.name());
        disk.close().unwrap();

        // Read-only refuses writes and trims everywhere, the NVM zone included.
        let disk = BlockVolume::open(devices, VolumeOptions { read_only: true, ..options }).unwrap();
        assert!(matches!(disk.write(0, b"zone"), Err(Error::ReadOnly)));
        assert!(matches!(disk.write(VOLUME_BYTES / 2, b"engine"), Err(Error::ReadOnly)));
        assert!(matches!(disk.trim(0, 4096), Err(Error::ReadOnly)));
        disk.read(0, &mut out).unwrap();
        assert!(out == model, "{}: a read-only open changed the contents", profile.name());
        disk.close().unwrap();
    }
}

#[test]
fn a_block_volume_needs_a_sector_multiple_and_a_formatted_volume() {
    let (devices, format, options, _kv) = devices(Profile::ORCH);
    assert!(matches!(BlockVolume::format(&devices, &format, BlockLayout::new(1000)), Err(Error::InvalidArgument(_))));
    let too_big = BlockLayout::new(31 << 20);
    assert!(matches!(BlockVolume::format(&devices, &format, too_big), Err(Error::InvalidArgument(m)) if m.contains("SSD data space")));
    let beyond = BlockLayout { nvm_ranges: std::iter::once(0..(64 << 20)).collect(), ..BlockLayout::new(VOLUME_BYTES) };
    assert!(matches!(BlockVolume::format(&devices, &format, beyond), Err(Error::InvalidArgument(_))));
    let no_room = BlockLayout { nvm_ranges: std::iter::once(0..(8 << 20)).collect(), ..BlockLayout::new(16 << 20) };
    assert!(matches!(BlockVolume::format(&devices, &format, no_room), Err(Error::WrongDevices(_))));
    alignfs::Volume::format(&devices, &format).unwrap();
    assert!(matches!(BlockVolume::open(devices, options), Err(Error::WrongPersonality(m)) if m.contains("no block volume")));
}

#[test]
fn an_object_store_keeps_objects_and_clones_across_reopen() {
    for profile in Profile::all() {
        let (devices, format, options, _kv) = devices(profile);
        ObjectStore::format(&devices, &format).unwrap();
        let store = ObjectStore::open(devices.clone(), options.clone()).unwrap();
        store.create_bucket(b"logs").unwrap();
        store.create_bucket(b"other").unwrap();
        assert!(matches!(store.create_bucket(b"logs"), Err(Error::Exists)));
        let (logs, other) = (store.bucket(b"logs").unwrap(), store.bucket(b"other").unwrap());
        let big: Vec<u8> = (0..300_000u32).map(|i| (i % 253) as u8).collect();
        logs.put(b"2026/1", b"first").unwrap();
        logs.put(b"2026/2", &big).unwrap();
        logs.put(b"data", b"unrelated").unwrap();
        logs.put(b"2026/1", b"replaced").unwrap();
        logs.create(b"sparse").unwrap();
        assert!(matches!(logs.create(b"sparse"), Err(Error::Exists)));
        logs.write(b"sparse", 1 << 20, b"far out").unwrap();
        logs.truncate(b"data", 3).unwrap();
        other.clone_object(&logs, b"2026/2", b"2026/2.copy").unwrap();
        other.write(b"2026/2.copy", 10, b"changed in the copy only").unwrap();
        let mut copy = big.clone();
        copy[10..34].copy_from_slice(b"changed in the copy only");
        assert!(matches!(logs.put(b"..", b"x"), Err(Error::InvalidName(_))));
        assert!(matches!(logs.put(b"nul\0", b"x"), Err(Error::InvalidName(_))));
        assert!(matches!(logs.put(&[b'/'; 128], b"x"), Err(Error::NameTooLong)));
        assert!(matches!(logs.get(b"missing"), Err(Error::NotFound)));
        assert!(matches!(store.remove_bucket(b"logs"), Err(Error::NotEmpty)));
        logs.remove(b"2026/2").unwrap();
        drop((logs, other));
        store.close().unwrap();

        let store = ObjectStore::open(devices, options).unwrap();
        let names: Vec<Vec<u8>> = store.buckets().unwrap().into_iter().map(|b| b.name).collect();
        assert_eq!(names, [b"logs".to_vec(), b"other".to_vec()]);
        let (logs, other) = (store.bucket(b"logs").unwrap(), store.bucket(b"other").unwrap());
        let names: Vec<Vec<u8>> = logs.list(b"2026/", None, 10).unwrap().into_iter().map(|o| o.name).collect();
        assert_eq!(names, [b"2026/1".to_vec()], "{}", profile.name());
        assert_eq!(logs.get(b"2026/1").unwrap(), b"replaced");
        assert!(other.get(b"2026/2.copy").unwrap() == copy, "{}: the clone differs", profile.name());
        assert_eq!(logs.get(b"data").unwrap(), b"unr");
        assert_eq!(logs.stat(b"sparse").unwrap().size, (1 << 20) + 7);
        let mut out = [1u8; 16];
        assert_eq!(logs.read(b"sparse", 100, &mut out).unwrap(), 16);
        assert_eq!(out, [0u8; 16]);
        assert_eq!(store.volume().check(), [], "{}", profile.name());
        drop((logs, other));
        store.close().unwrap();
    }
}

/// Names holding `/` list in the byte order of the names themselves (`a.b` < `a/b` <
/// `a0`), by prefix, a page at a time, whatever the encoding in the directory does.
#[test]
fn object_listings_follow_name_order_by_prefix_and_page() {
    let (devices, format, options, _kv) = devices(Profile::NVSTORE);
    ObjectStore::format(&devices, &format).unwrap();
    let store = ObjectStore::open(devices, options).unwrap();
    store.create_bucket(b"b").unwrap();
    let bucket = store.bucket(b"b").unwrap();
    let mut names: Vec<&[u8]> = vec![b"a", b"a.", b"a.b", b"a.\xc3\xa9", b"a/", b"a/b", b"a/b/c", b"a//", b"a0", b"b", b"\xe2\x82\xac"];
    for name in &names {
        bucket.put(name, name).unwrap();
    }
    names.sort();
    let list = |prefix: &[u8], after: Option<&[u8]>, limit: usize| -> Vec<Vec<u8>> {
        bucket.list(prefix, after, limit).unwrap().into_iter().map(|o| o.name).collect()
    };
    assert_eq!(list(b"", None, usize::MAX), names);
    for prefix in [&b""[..], b"a", b"a.", b"a/", b"a/b", b"z"] {
        let expected: Vec<Vec<u8>> = names.iter().filter(|n| n.starts_with(prefix)).map(|n| n.to_vec()).collect();
        assert_eq!(list(prefix, None, usize::MAX), expected, "prefix {:?}", String::from_utf8_lossy(prefix));
        let mut paged = Vec::new();
        let mut after: Option<Vec<u8>> = None;
        loop {
            let page = list(prefix, after.as_deref(), 2);
            if page.is_empty() {
                break;
            }
            after = page.last().cloned();
            paged.extend(page);
        }
        assert_eq!(paged, expected, "prefix {:?} in pages of 2", String::from_utf8_lossy(prefix));
    }
    for name in &names {
        assert_eq!(bucket.get(name).unwrap(), *name);
    }
    drop(bucket);
    store.close().unwrap();
}

/// A transaction's changes are checked before any applies, and a crash after the commit
/// keeps all of them: two objects published and one removed.
#[test]
fn object_transactions_apply_whole_or_not_at_all() {
    for profile in [Profile::NVSTORE, Profile::ORCH] {
        let (devices, format, options, _kv) = devices(profile);
        ObjectStore::format(&devices, &format).unwrap();
        let store = ObjectStore::open(devices.clone(), options.clone()).unwrap();
        store.create_bucket(b"b").unwrap();
        let bucket = store.bucket(b"b").unwrap();
        bucket.put(b"old", b"old bytes").unwrap();
        bucket.put(b"x", b"x bytes").unwrap();

        // A removal of a missing object fails the whole transaction: the staged object is
        // not published and "old" stays.
        let staged = store.stage().unwrap();
        staged.write(0, b"never").unwrap();
        let mut transaction = store.transaction();
        transaction.publish(staged, &bucket, b"new").unwrap();
        transaction.remove(&bucket, b"old").unwrap();
        transaction.remove(&bucket, b"missing").unwrap();
        assert!(matches!(transaction.commit(), Err(Error::NotFound)));
        let names: Vec<Vec<u8>> = bucket.list(b"", None, 10).unwrap().into_iter().map(|o| o.name).collect();
        assert_eq!(names, [b"old".to_vec(), b"x".to_vec()]);

        // One name twice is refused.
        let mut transaction = store.transaction();
        transaction.remove(&bucket, b"x").unwrap();
        let staged = store.stage().unwrap();
        transaction.publish(staged, &bucket, b"x").unwrap();
        assert!(matches!(transaction.commit(), Err(Error::BadTransaction(p)) if p.to_string().contains("twice")));

        let (mut a, b) = (store.stage().unwrap(), store.stage().unwrap());
        a.write(0, b"new a").unwrap();
        a.set_attribute(b"etag of a");
        b.write(100, b"new b").unwrap();
        let mut transaction = store.transaction();
        transaction.publish(a, &bucket, b"dir/a").unwrap();
        transaction.publish(b, &bucket, b"x").unwrap();
        transaction.remove(&bucket, b"old").unwrap();
        transaction.commit().unwrap();
        drop(bucket);
        store.simulate_crash();

        let store = ObjectStore::open(devices, options).unwrap();
        let bucket = store.bucket(b"b").unwrap();
        let names: Vec<Vec<u8>> = bucket.list(b"", None, 10).unwrap().into_iter().map(|o| o.name).collect();
        assert_eq!(names, [b"dir/a".to_vec(), b"x".to_vec()], "{}", profile.name());
        assert_eq!(bucket.get(b"dir/a").unwrap(), b"new a");
        assert_eq!(bucket.attribute(b"dir/a").unwrap().as_deref(), Some(&b"etag of a"[..]));
        assert_eq!(bucket.attribute(b"x").unwrap(), None);
        assert_eq!(&bucket.get(b"x").unwrap()[100..], b"new b");
        assert_eq!(store.volume().check(), [], "{}", profile.name());
        drop(bucket);
        store.close().unwrap();
    }
}

/// UHS's buffer with a handful of tiny segments: small writes keep filling the segment
/// their block hashes to, the writer drains it, and every byte still matches the model,
/// before and after reopening. Without the buffer (UHS-NB) nothing is buffered.
#[test]
fn uhs_drains_full_segments_and_keeps_every_byte() {
    for buffered in [true, false] {
        let ssd = Arc::new(SimSsd::new(32 << 20)) as Arc<dyn BlockDevice>;
        let devices = Devices::new(Arc::new(alignfs::device::PmemRegion::anonymous(512 << 10).unwrap()), ssd);
        let format = FormatOptions { geometry: Profile::UHS.default_geometry(), profile: Profile::UHS, force: false, ..Default::default() };
        BlockVolume::format(&devices, &format, BlockLayout::new(VOLUME_BYTES)).unwrap();
        // 20 KiB writes cross the threshold: their whole blocks go direct and drop what
        // the buffer held for them, between the drains.
        let options =
            VolumeOptions { background: false, nvm_buffer: buffered, request_threshold: Some(16 << 10), ..VolumeOptions::default() };
        let disk = BlockVolume::open(devices.clone(), options.clone()).unwrap();
        let mut rng = StdRng::seed_from_u64(seed(&format!("personalities::uhs_drain::{buffered}")));
        let mut model = vec![0u8; VOLUME_BYTES as usize];
        for _ in 0..1500 {
            let len = [512, 4096, 1536, 20480][rng.random_range(0..4)];
            let offset = rng.random_range(0..(VOLUME_BYTES - len) / 512) * 512;
            let data: Vec<u8> = (0..len).map(|_| rng.random()).collect();
            disk.write(offset, &data).unwrap();
            model[offset as usize..(offset + len) as usize].copy_from_slice(&data);
        }
        let stats = disk.volume().stats();
        let counter = |c: Counter| stats.counters.iter().find(|(k, _)| *k == c).map_or(0, |(_, v)| *v);
        if buffered {
            assert!(counter(Counter::migrations_fast_full) > 0, "full segments were drained for writers");
        } else {
            assert_eq!(counter(Counter::page_write_bytes) + counter(Counter::upage_write_bytes), 0, "UHS-NB buffers nothing");
            assert!(counter(Counter::fg_rmw_reads) > 0, "UHS-NB rewrites partial blocks");
        }
        let mut out = vec![0u8; VOLUME_BYTES as usize];
        disk.read(0, &mut out).unwrap();
        assert!(out == model, "buffered={buffered}: contents differ from the model");
        disk.close().unwrap();
        let disk = BlockVolume::open(devices, options).unwrap();
        disk.read(0, &mut out).unwrap();
        assert!(out == model, "buffered={buffered}: contents differ after reopening");
        assert_eq!(disk.volume().check(), []);
        disk.close().unwrap();
    }
}
