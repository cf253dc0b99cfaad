#![allow(clippy::unwrap_used)]
//! `scrap` on several SSDs: blocks spread over every member, a volume reopens from its
//! members, and a missing or foreign member is refused by name.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use alignfs::device::{BlockDevice, DeviceSet, SimSsd};
use alignfs::stats::Counter;
use alignfs::test_support::seed;
use alignfs::{Devices, Error, FormatOptions, Geometry, Ino, Profile, Volume, VolumeOptions};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const MEMBER: u64 = 32 << 20;

fn set_of(members: &[Arc<SimSsd>]) -> Arc<dyn BlockDevice> {
    Arc::new(DeviceSet::new(members.iter().map(|m| Arc::clone(m) as Arc<dyn BlockDevice>).collect(), MEMBER).unwrap())
}

fn options() -> VolumeOptions {
    VolumeOptions { scrap_mem_bytes: 2 << 20, ..VolumeOptions::default() }
}

#[test]
fn a_volume_on_three_ssds_uses_them_all_and_reopens() {
    let mut rng = StdRng::seed_from_u64(seed("scrap::a_volume_on_three_ssds_uses_them_all_and_reopens"));
    let members: Vec<Arc<SimSsd>> = (0..3).map(|_| Arc::new(SimSsd::new(MEMBER))).collect();
    let geometry = Geometry { block_bytes: 64 << 10, page_bytes: 64 << 10, split_bytes: 64 << 10, io_workers: 1 };
    let format = FormatOptions { geometry, profile: Profile::SCRAP, force: false, ..Default::default() };
    Volume::format(&Devices::ssd_only(set_of(&members)), &format).unwrap();
    let before: Vec<u64> = members.iter().map(|m| m.writes.load(Ordering::Relaxed)).collect();
    let volume = Volume::open(Devices::ssd_only(set_of(&members)), options()).unwrap();
    let ino = volume.create_file(Ino::ROOT, b"f", 0o644, 0, 0).unwrap().ino;
    let mut model = vec![0u8; 24 << 20];
    let mut size = 0;
    for _ in 0..300 {
        // Large writes go straight to the SSDs; small ones through scrap pages.
        let len = if rng.random_bool(0.3) { rng.random_range(1 << 20..=3 << 20) } else { rng.random_range(1..=200_000) };
        let offset = rng.random_range(0..model.len() - len);
        let data: Vec<u8> = (0..len).map(|_| rng.random()).collect();
        volume.write(ino, offset as u64, &data).unwrap();
        model[offset..offset + len].copy_from_slice(&data);
        size = size.max(offset + len);
    }
    model.truncate(size);
    volume.fsync(ino).unwrap();
    for (i, m) in members.iter().enumerate() {
        assert!(m.writes.load(Ordering::Relaxed) > before[i] + 20, "SSD {i} took part in the writes");
    }
    volume.close().unwrap();
    let volume = Volume::open(Devices::ssd_only(set_of(&members)), options()).unwrap();
    let mut out = vec![0u8; model.len()];
    assert_eq!(volume.read(ino, 0, &mut out).unwrap(), model.len());
    assert!(out == model, "data read back after reopening on three SSDs");
    assert!(volume.check().is_empty());
    volume.close().unwrap();

    // Two of the three members: refused, naming the count.
    let two = Arc::new(DeviceSet::new(members[..2].iter().map(|m| Arc::clone(m) as Arc<dyn BlockDevice>).collect(), MEMBER).unwrap());
    assert!(matches!(
        Volume::open(Devices::ssd_only(two), options()),
        Err(Error::WrongDevices(alignfs::DeviceProblem::SsdCount { volume: 3, .. }))
    ));
    // A blank third member: refused, naming which SSD.
    let blank = [Arc::clone(&members[0]), Arc::clone(&members[1]), Arc::new(SimSsd::new(MEMBER))];
    match Volume::open(Devices::ssd_only(set_of(&blank)), options()) {
        Err(e) => assert!(e.to_string().contains("SSD 2 of 3"), "{e}"),
        Ok(_) => panic!("a blank member must be refused"),
    }
}

/// A fresh `scrap` volume of 64 KiB scrap pages on one SSD, with SSD IOs of up to `split_bytes`.
fn one_ssd_volume(ssd: &Arc<SimSsd>, split_bytes: u32) -> Volume {
    let geometry = Geometry { block_bytes: 64 << 10, page_bytes: 64 << 10, split_bytes, io_workers: 1 };
    let format = FormatOptions { geometry, profile: Profile::SCRAP, force: false, ..Default::default() };
    Volume::format(&Devices::ssd_only(Arc::clone(ssd) as Arc<dyn BlockDevice>), &format).unwrap();
    Volume::open(Devices::ssd_only(Arc::clone(ssd) as Arc<dyn BlockDevice>), options()).unwrap()
}

/// Durable only on sync, a write replaces the whole blocks a file owns where they are:
/// no new block, no journal record, no flush until the file's fsync. A block shared with
/// a clone is still written out of place, and the clone keeps its bytes.
#[test]
fn overwrites_of_owned_blocks_go_in_place_and_fsync_flushes_them() {
    let ssd = Arc::new(SimSsd::new(MEMBER));
    let volume = one_ssd_volume(&ssd, 64 << 10);
    let f = volume.create_file(Ino::ROOT, b"f", 0o644, 0, 0).unwrap().ino;
    let counter = |c: Counter| volume.stats().get(c);
    let fill = |byte: u8| vec![byte; 2 << 20];
    volume.write(f, 0, &fill(1)).unwrap();
    volume.fsync(f).unwrap();

    let (records, flushes, in_place) =
        (counter(Counter::journal_records), ssd.flushes.load(Ordering::SeqCst), counter(Counter::ssd_overwrites_in_place));
    volume.write(f, 0, &fill(2)).unwrap();
    assert_eq!(counter(Counter::ssd_overwrites_in_place) - in_place, 32, "every block of the 2 MiB overwrite went in place");
    assert_eq!(counter(Counter::journal_records), records, "an overwrite in place changes no metadata");
    assert_eq!(ssd.flushes.load(Ordering::SeqCst), flushes, "nor flushes the SSD");
    volume.fsync(f).unwrap();
    assert!(ssd.flushes.load(Ordering::SeqCst) > flushes, "the file's fsync flushed its overwrites");
    let flushed = ssd.flushes.load(Ordering::SeqCst);
    volume.fsync(f).unwrap();
    assert_eq!(ssd.flushes.load(Ordering::SeqCst), flushed, "a second fsync has nothing to flush");

    // A clone shares the blocks: the next overwrite of either goes out of place.
    let g = volume.create_file(Ino::ROOT, b"g", 0o644, 0, 0).unwrap().ino;
    volume.clone_file(f, g).unwrap();
    let in_place = counter(Counter::ssd_overwrites_in_place);
    volume.write(f, 0, &fill(3)).unwrap();
    assert_eq!(counter(Counter::ssd_overwrites_in_place), in_place, "shared blocks are never written in place");
    volume.fsync(f).unwrap();
    let mut out = vec![0u8; 2 << 20];
    volume.read(g, 0, &mut out).unwrap();
    assert!(out == fill(2), "the clone kept the bytes it shared");
    // The overwrite gave f blocks of its own again.
    volume.write(f, 0, &fill(4)).unwrap();
    assert_eq!(counter(Counter::ssd_overwrites_in_place) - in_place, 32);
    volume.fsync(f).unwrap();
    assert!(volume.check().is_empty());
    volume.simulate_crash();

    let volume = Volume::open(Devices::ssd_only(Arc::clone(&ssd) as Arc<dyn BlockDevice>), options()).unwrap();
    for (ino, byte) in [(f, 4), (g, 2)] {
        volume.read(ino, 0, &mut out).unwrap();
        assert!(out == fill(byte), "what fsync made durable survived a crash");
    }
    assert!(volume.check().is_empty());
}

/// An overwrite whose blocks lie apart on the SSD (two files whose small writes were
/// merged in turn) would take more IOs in place than a run of new blocks: it goes out of
/// place, and the range is one run again.
#[test]
fn an_overwrite_of_scattered_blocks_takes_a_new_run() {
    let ssd = Arc::new(SimSsd::new(MEMBER));
    // IOs of up to 256 KiB: a run of four blocks is one IO.
    let volume = one_ssd_volume(&ssd, 256 << 10);
    let f = volume.create_file(Ino::ROOT, b"f", 0o644, 0, 0).unwrap().ino;
    let h = volume.create_file(Ino::ROOT, b"h", 0o644, 0, 0).unwrap().ino;
    let counter = |c: Counter| volume.stats().get(c);
    let fill = |byte: u8| vec![byte; 2 << 20];
    // Each block of f, then of h, merged in turn: f's blocks end up every other one.
    for k in 0..32u64 {
        for ino in [f, h] {
            volume.write(ino, k * (64 << 10) + 100, b"apart").unwrap();
            volume.fsync(ino).unwrap();
        }
    }
    let (in_place, ios) = (counter(Counter::ssd_overwrites_in_place), counter(Counter::ssd_write_ios));
    volume.write(f, 0, &fill(3)).unwrap();
    assert_eq!(counter(Counter::ssd_overwrites_in_place), in_place, "scattered blocks are not rewritten in place");
    assert!(counter(Counter::ssd_write_ios) - ios <= 9, "the overwrite went out in long runs");
    // Now in order: the next overwrite goes in place.
    volume.write(f, 0, &fill(4)).unwrap();
    assert_eq!(counter(Counter::ssd_overwrites_in_place) - in_place, 32);
    volume.fsync(f).unwrap();
    let mut out = vec![0u8; 2 << 20];
    volume.read(f, 0, &mut out).unwrap();
    assert!(out == fill(4));
    assert!(volume.check().is_empty());
}

/// fsync writes a block's residue back over the block where the file owns it alone: only
/// the 4 KiB sectors it touches, reading only those it covers in part, with no new block
/// and no journal record. A block shared with a clone still goes to a new block, whole.
#[test]
fn fsync_writes_residue_back_in_place_by_sector() {
    let ssd = Arc::new(SimSsd::new(MEMBER));
    let volume = one_ssd_volume(&ssd, 64 << 10);
    let f = volume.create_file(Ino::ROOT, b"f", 0o644, 0, 0).unwrap().ino;
    let counter = |c: Counter| volume.stats().get(c);
    let mut model = vec![1u8; 1 << 20];
    volume.write(f, 0, &model).unwrap();
    volume.fsync(f).unwrap();
    let used = volume.stats().usage.ssd_blocks_used;

    let watched = || -> Vec<u64> {
        [
            Counter::journal_records,
            Counter::migration_read_bytes,
            Counter::migration_sector_write_bytes,
            Counter::migrations_in_place,
            Counter::ssd_write_bytes,
        ]
        .map(counter)
        .to_vec()
    };
    let before = watched();
    // Block 1: 4 KiB across a sector boundary (two sectors, both in part). Block 3: one
    // whole sector. Block 5: two pieces in one sector.
    for (at, len, byte) in [(65536 + 6000, 4096, 2u8), (3 * 65536 + 8192, 4096, 3), (5 * 65536 + 10, 10, 4), (5 * 65536 + 100, 10, 5)] {
        volume.write(f, at as u64, &vec![byte; len]).unwrap();
        model[at..at + len].fill(byte);
    }
    volume.fsync(f).unwrap();
    let delta: Vec<u64> = watched().iter().zip(&before).map(|(after, b)| after - b).collect();
    assert_eq!(delta[0], 0, "no journal record: the blocks stayed where they were");
    assert_eq!(delta[1], 3 * 4096, "only the sectors covered in part were read");
    assert_eq!(delta[2], 4 * 4096, "only the sectors touched were written");
    assert_eq!(delta[3], 3, "three blocks merged in place");
    assert_eq!(delta[4], 4 * 4096);
    assert_eq!(volume.stats().usage.ssd_blocks_used, used, "no new block");
    let mut out = vec![0u8; model.len()];
    volume.read(f, 0, &mut out).unwrap();
    assert!(out == model);

    // Shared with a clone: out of place, whole.
    let g = volume.create_file(Ino::ROOT, b"g", 0o644, 0, 0).unwrap().ino;
    volume.clone_file(f, g).unwrap();
    let cloned = model.clone();
    let (records, in_place) = (counter(Counter::journal_records), counter(Counter::migrations_in_place));
    volume.write(f, 65536 + 100, b"shared").unwrap();
    model[65536 + 100..65536 + 106].copy_from_slice(b"shared");
    volume.fsync(f).unwrap();
    assert_eq!(counter(Counter::migrations_in_place), in_place);
    assert!(counter(Counter::journal_records) > records, "the new block is journaled");
    assert!(volume.check().is_empty());
    volume.simulate_crash();

    let volume = Volume::open(Devices::ssd_only(Arc::clone(&ssd) as Arc<dyn BlockDevice>), options()).unwrap();
    volume.read(f, 0, &mut out).unwrap();
    assert!(out == model, "what fsync wrote in place survived a crash");
    volume.read(g, 0, &mut out).unwrap();
    assert!(out == cloned, "the clone kept its bytes");
    assert!(volume.check().is_empty());
}

/// The kill -9 loop's workload in process, with the flushers running: files created,
/// written (small writes to scrap pages, large ones to the SSD), fsynced, truncated,
/// renamed over each other and unlinked, and crashes in between. After each crash the
/// names are those after some prefix of the operations, no shorter than the last fsync's
/// (buffered I/O's metadata promise: namespace ops are committed in order, at fsync or
/// with a data commit), and every file holds only what the scrap rule allows: its synced
/// bytes, bytes written since, or zeros.
#[test]
fn namespace_churn_with_crashes_keeps_the_scrap_rule() {
    use alignfs::test_support::{scaled, Unsynced};
    use alignfs::volume::RenameFlags;
    use std::collections::BTreeMap;
    const MAX_FILE: usize = 4 << 20;
    let seed = seed("scrap::namespace_churn_with_crashes_keeps_the_scrap_rule");
    let mut rng = StdRng::seed_from_u64(seed);
    let ssd = Arc::new(SimSsd::new(256 << 20));
    let format = FormatOptions { geometry: Profile::SCRAP.default_geometry(), profile: Profile::SCRAP, force: false, ..Default::default() };
    Volume::format(&Devices::ssd_only(Arc::clone(&ssd) as Arc<dyn BlockDevice>), &format).unwrap();
    let options = VolumeOptions { scrap_mem_bytes: 8 << 20, ..VolumeOptions::default() };
    let open = || Volume::open(Devices::ssd_only(Arc::clone(&ssd) as Arc<dyn BlockDevice>), options.clone()).unwrap();
    let mut volume = open();
    // Names point at file identities; a file's bytes and history stay after its last name
    // goes, since a crash may bring the name back.
    type Names = BTreeMap<String, usize>;
    let mut names = Names::new();
    let mut contents: Vec<(Vec<u8>, Unsynced)> = Vec::new();
    // The namespace after each operation since the last fsync: a crash keeps one of them.
    let mut since_sync: Vec<Names> = vec![names.clone()];
    let ino_of = |v: &Volume, name: &str| v.lookup(Ino::ROOT, name.as_bytes()).unwrap().ino;
    let (mut crashes, mut older_prefixes) = (0, 0);
    for step in 0..scaled(3000) {
        let name = format!("f{}", rng.random_range(0..12));
        let existing: Vec<String> = names.keys().cloned().collect();
        let pick = |rng: &mut StdRng| (!existing.is_empty()).then(|| existing[rng.random_range(0..existing.len())].clone());
        match rng.random_range(0..100) {
            0..=54 => {
                let Some(name) = pick(&mut rng) else { continue };
                let (content, unsynced) = &mut contents[names[&name]];
                let len = match rng.random_range(0..10) {
                    0..=4 => rng.random_range(1..=4096),
                    5..=7 => rng.random_range(4096..=256 << 10),
                    _ => rng.random_range(256 << 10..=2 << 20),
                };
                let offset = rng.random_range(0..=content.len() + (64 << 10)).min(MAX_FILE - len);
                let data: Vec<u8> = (0..len).map(|_| rng.random()).collect();
                let ino = ino_of(&volume, &name);
                assert_eq!(volume.write(ino, offset as u64, &data).unwrap(), len);
                if content.len() < offset + len {
                    content.resize(offset + len, 0);
                }
                content[offset..offset + len].copy_from_slice(&data);
                unsynced.touch(offset, offset + len, content.len());
                unsynced.writes.push((offset, data));
                if rng.random_range(0..4) == 0 {
                    volume.fsync(ino).unwrap();
                    *unsynced = Unsynced::synced(content);
                    since_sync.clear();
                }
            }
            55..=64 => {
                if names.contains_key(&name) {
                    continue;
                }
                volume.create_file(Ino::ROOT, name.as_bytes(), 0o644, 0, 0).unwrap();
                names.insert(name, contents.len());
                contents.push((Vec::new(), Unsynced::default()));
            }
            65..=72 => {
                let Some(name) = pick(&mut rng) else { continue };
                let (content, unsynced) = &mut contents[names[&name]];
                let size = rng.random_range(0..=content.len() + (100 << 10)).min(MAX_FILE);
                volume.truncate(ino_of(&volume, &name), size as u64).unwrap();
                let old = content.len();
                content.resize(size, 0);
                unsynced.touch(old.min(size), old.max(size), size);
            }
            73..=79 => {
                let Some(name) = pick(&mut rng) else { continue };
                volume.unlink(Ino::ROOT, name.as_bytes()).unwrap();
                names.remove(&name);
            }
            80..=94 => {
                let Some(from) = pick(&mut rng) else { continue };
                volume.rename(Ino::ROOT, from.as_bytes(), Ino::ROOT, name.as_bytes(), RenameFlags::default()).unwrap();
                let moved = names.remove(&from).unwrap();
                names.insert(name, moved);
            }
            _ => {
                volume.simulate_crash();
                volume = open();
                crashes += 1;
                let mut found: Vec<String> = volume
                    .readdir(Ino::ROOT)
                    .unwrap()
                    .into_iter()
                    .map(|e| String::from_utf8(e.name).unwrap())
                    .filter(|n| n != "." && n != "..")
                    .collect();
                found.sort();
                let Some(prefix) = since_sync.iter().rposition(|state| state.keys().eq(found.iter())) else {
                    panic!("seed {seed} step {step}: names after a crash {found:?}, none of the states since the last fsync {since_sync:?}")
                };
                older_prefixes += usize::from(prefix + 1 < since_sync.len());
                names = since_sync[prefix].clone();
                for (name, &id) in &names {
                    let (content, unsynced) = &mut contents[id];
                    let ino = ino_of(&volume, name);
                    let size = volume.getattr(ino).unwrap().size as usize;
                    let mut after = vec![0u8; size];
                    assert_eq!(volume.read(ino, 0, &mut after).unwrap(), size);
                    if let Err(e) = unsynced.check(&after) {
                        panic!("seed {seed} step {step}: {name} after a crash: {e}");
                    }
                    *content = after;
                    *unsynced = Unsynced::synced(content);
                }
                since_sync.clear();
            }
        }
        if since_sync.last() != Some(&names) {
            since_sync.push(names.clone());
        }
        if rng.random_range(0..8) == 0 {
            std::thread::sleep(std::time::Duration::from_micros(rng.random_range(0..2000)));
        }
    }
    eprintln!("{crashes} crashes, {older_prefixes} kept an older namespace than the last acknowledged");
    assert!(older_prefixes > 0, "no crash lost a deferred namespace operation: the rule was not exercised");
    assert!(crashes > 50, "{crashes} crashes");
    assert!(volume.check().is_empty());
}

/// Buffered I/O's metadata promise: a namespace op is lost in a crash until an fsync (of
/// any file or directory), a commit that frees SSD blocks, the commit interval or
/// `sync_all` (`alignfs sync`) makes it durable; a zero interval makes every one durable
/// on return.
#[test]
fn namespace_ops_wait_for_fsync_the_commit_interval_or_a_release_of_blocks() {
    let ssd = Arc::new(SimSsd::new(64 << 20));
    let format = FormatOptions { geometry: Profile::SCRAP.default_geometry(), profile: Profile::SCRAP, force: false, ..Default::default() };
    Volume::format(&Devices::ssd_only(Arc::clone(&ssd) as Arc<dyn BlockDevice>), &format).unwrap();
    let open = |commit_interval: Duration, background: bool| {
        let options = VolumeOptions { scrap_mem_bytes: 8 << 20, commit_interval, background, ..VolumeOptions::default() };
        Volume::open(Devices::ssd_only(Arc::clone(&ssd) as Arc<dyn BlockDevice>), options).unwrap()
    };
    let exists = |v: &Volume, name: &str| v.lookup(Ino::ROOT, name.as_bytes()).is_ok();
    let long = Duration::from_secs(3600);

    let volume = open(long, false);
    volume.create_file(Ino::ROOT, b"lost", 0o644, 0, 0).unwrap();
    assert_eq!(volume.stats().get(Counter::namespace_ops_deferred), 1);
    assert_eq!(volume.stats().usage.namespace_ops_waiting, 1, "alignfs stat shows what waits");
    volume.simulate_crash();
    let volume = open(long, false);
    assert!(!exists(&volume, "lost"), "an unsynced create is lost in a crash");

    // An fsync of the directory commits it, and everything before it in order.
    volume.mkdir(Ino::ROOT, b"d", 0o755, 0, 0).unwrap();
    let kept = volume.create_file(Ino::ROOT, b"kept", 0o644, 0, 0).unwrap().ino;
    volume.fsync(Ino::ROOT).unwrap();
    assert_eq!(volume.stats().get(Counter::deferred_namespace_commits), 1);
    assert_eq!(volume.stats().usage.namespace_ops_waiting, 0, "the fsync left nothing waiting");
    // A file with a whole SSD block: its unlink frees it, so it is journaled at once.
    volume.write(kept, 0, &vec![7u8; 1 << 20]).unwrap();
    volume.fsync(kept).unwrap();
    volume.create_file(Ino::ROOT, b"before-unlink", 0o644, 0, 0).unwrap();
    volume.unlink(Ino::ROOT, b"kept").unwrap();
    volume.simulate_crash();
    let volume = open(long, false);
    assert!(exists(&volume, "d") && exists(&volume, "before-unlink"), "an fsync and a release of blocks commit what came before");
    assert!(!exists(&volume, "kept"), "the unlink that freed blocks was durable on return");
    assert!(volume.check().is_empty());
    volume.close().unwrap();

    // The maintenance thread commits what waited past the interval.
    let volume = open(Duration::from_millis(50), true);
    volume.create_file(Ino::ROOT, b"by-interval", 0o644, 0, 0).unwrap();
    let waited = std::time::Instant::now();
    while volume.stats().get(Counter::deferred_namespace_commits) == 0 {
        assert!(waited.elapsed() < Duration::from_secs(10), "the commit interval never committed");
        std::thread::sleep(Duration::from_millis(20));
    }
    volume.simulate_crash();
    let volume = open(Duration::ZERO, false);
    assert!(exists(&volume, "by-interval"));

    // `sync_all` (syncfs): the names and every file's scrap pages.
    let synced = volume.create_file(Ino::ROOT, b"synced", 0o644, 0, 0).unwrap().ino;
    volume.write(synced, 10, b"in a scrap page").unwrap();
    volume.sync_all().unwrap();
    volume.simulate_crash();
    let volume = open(Duration::from_secs(3600), false);
    let mut back = [0u8; 25];
    assert_eq!(volume.read(volume.lookup(Ino::ROOT, b"synced").unwrap().ino, 0, &mut back).unwrap(), 25);
    assert_eq!(&back[10..], b"in a scrap page");
    volume.close().unwrap();
    let volume = open(Duration::ZERO, false);

    // A zero interval: durable on return.
    volume.rename(Ino::ROOT, b"by-interval", Ino::ROOT, b"renamed", Default::default()).unwrap();
    assert_eq!(volume.stats().get(Counter::namespace_ops_deferred), 0);
    volume.simulate_crash();
    let volume = open(Duration::ZERO, false);
    assert!(exists(&volume, "renamed") && !exists(&volume, "by-interval"));
    assert!(volume.check().is_empty());
}
