#![allow(clippy::unwrap_used)]
//! Model-based end-to-end test: random operations on a volume compared byte for byte with
//! an in-memory reference, across geometries, read modes and fast-tier sizes (a tiny one
//! keeps migration and the fast-tier-full path busy), with clean remounts, simulated
//! crashes and forced migrations in between. `scrap` cases keep residue in DRAM: after a
//! crash every synced byte must be back, and every other byte must hold a value it held
//! since the last sync (or zero, where a block was never flushed).

mod common;

use alignfs::profile::DeviceKind;
use alignfs::profile::Promise;
use alignfs::stats::Counter;
use alignfs::test_support::Unsynced;
use alignfs::test_support::{scaled, seed};
use alignfs::volume::{FallocateMode, SeekTarget};
use alignfs::{Error, FormatOptions, Geometry, Ino, MetaStoreChoice, Profile, ReadMode, Volume, VolumeOptions};
use common::Devices;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const MAX_FILE: u64 = 6 << 20;

struct Case {
    name: &'static str,
    profile: Profile,
    geometry: Geometry,
    /// The fast tier (`orch`) or the scrap memory (`scrap`).
    fast_bytes: u64,
    read_mode: ReadMode,
    /// Whether the fast tier is big enough that no write ever needs the slow path.
    roomy: bool,
    /// `byte`: `false` runs on the device's block interface alone.
    byte_interface: bool,
    meta_store: MetaStoreChoice,
}

fn write_size(rng: &mut StdRng, g: &Geometry) -> u64 {
    match rng.random_range(0..8) {
        0 => rng.random_range(1..=64),
        1 => rng.random_range(1..=4096),
        2 => rng.random_range(3686..=4506),
        3 => g.block(),
        4 => 2 * g.block(),
        5 => rng.random_range(943_718..=1_153_433),
        _ => rng.random_range(1..=2 << 20),
    }
}

fn write_offset(rng: &mut StdRng, g: &Geometry, size: u64) -> u64 {
    match rng.random_range(0..5) {
        0 => size,
        1 => rng.random_range(0..=size / g.block()) * g.block(),
        2 => size + rng.random_range(0..3 * g.block()),
        _ => rng.random_range(0..=size),
    }
}

fn check_file(volume: &Volume, ino: Ino, reference: &[u8], rng: &mut StdRng) {
    assert_eq!(volume.getattr(ino).unwrap().size, reference.len() as u64, "size of inode {}", ino.0);
    let mut whole = vec![0xAAu8; reference.len() + 100];
    let n = volume.read(ino, 0, &mut whole).unwrap();
    assert_eq!(n, reference.len());
    if whole[..n] != *reference {
        let at = whole.iter().zip(reference).position(|(a, b)| a != b).unwrap();
        panic!("inode {} differs from the model at byte {at} (of {})", ino.0, reference.len());
    }
    for _ in 0..3 {
        let offset = rng.random_range(0..=reference.len() as u64 + 10);
        let mut part = vec![0u8; rng.random_range(1..70_000)];
        let n = volume.read(ino, offset, &mut part).unwrap();
        let expected = reference.get(offset as usize..).map_or(&[][..], |r| &r[..r.len().min(part.len())]);
        assert_eq!(&part[..n], expected, "read at {offset}");
    }
    // SEEK_DATA skips only zeros; SEEK_HOLE lands inside the file or at its end.
    let size = reference.len() as u64;
    if size > 0 {
        let offset = rng.random_range(0..size);
        match volume.seek(ino, offset, SeekTarget::Data) {
            Ok(data) => {
                assert!(data >= offset && data < size, "SEEK_DATA {offset} -> {data} (size {size})");
                assert!(reference[offset as usize..data as usize].iter().all(|&b| b == 0), "SEEK_DATA skipped data");
            }
            Err(Error::BeyondEnd) => assert!(reference[offset as usize..].iter().all(|&b| b == 0), "no data after {offset}"),
            Err(e) => panic!("SEEK_DATA: {e}"),
        }
        let hole = volume.seek(ino, offset, SeekTarget::Hole).unwrap();
        assert!(hole >= offset && hole <= size, "SEEK_HOLE {offset} -> {hole} (size {size})");
    }
    assert!(matches!(volume.seek(ino, size, SeekTarget::Data), Err(Error::BeyondEnd)));
}

fn run(case: &Case, operations: u64, rng: &mut StdRng) {
    let g = case.geometry;
    let volatile = case.profile.promise() == Promise::OnSync;
    let devices = if volatile || case.profile.devices() != DeviceKind::FastTierAndSsd {
        Devices::ssd_only(case.profile, 96 << 20)
    } else {
        Devices::new(case.fast_bytes, 96 << 20)
    };
    devices.format_with(FormatOptions {
        geometry: g,
        profile: case.profile,
        meta_store: case.meta_store,
        force: false,
        ..FormatOptions::default()
    });
    let options = VolumeOptions {
        read_mode: case.read_mode,
        scrap_mem_bytes: case.fast_bytes,
        byte_interface: case.byte_interface,
        ..VolumeOptions::default()
    };
    let mut volume = devices.open(options.clone()).unwrap();
    let in_place = case.profile == Profile::BYTE && case.meta_store != MetaStoreChoice::Journal;
    assert_eq!(volume.superblock().in_place_meta, in_place, "{}", case.name);
    let files: Vec<Ino> = (0..3).map(|i| volume.create_file(Ino::ROOT, format!("f{i}").as_bytes(), 0o644, 0, 0).unwrap().ino).collect();
    // `scrap` commits namespace ops at the next sync: the files exist after any crash from here.
    volume.fsync(Ino::ROOT).unwrap();
    let mut model: Vec<Vec<u8>> = vec![Vec::new(); files.len()];
    let mut unsynced: Vec<Unsynced> = vec![Unsynced::default(); files.len()];
    let mut crashes_checked = 0;
    for step in 0..operations {
        let f = rng.random_range(0..files.len());
        let (ino, reference, pending) = (files[f], &mut model[f], &mut unsynced[f]);
        match rng.random_range(0..100) {
            0..=59 => {
                let size = reference.len() as u64;
                let offset = write_offset(rng, &g, size).min(MAX_FILE - 1);
                let len = write_size(rng, &g).min(MAX_FILE - offset);
                let data: Vec<u8> = (0..len).map(|_| rng.random()).collect();
                assert_eq!(volume.write(ino, offset, &data).unwrap(), data.len());
                let end = (offset + len) as usize;
                if reference.len() < end {
                    reference.resize(end, 0);
                }
                reference[offset as usize..end].copy_from_slice(&data);
                pending.touch(offset as usize, end, reference.len());
                pending.writes.push((offset as usize, data));
            }
            60..=63 => {
                let size = reference.len() as u64;
                let offset = write_offset(rng, &g, size).min(MAX_FILE - 1);
                let len = (write_size(rng, &g) / 2 + 1).min(MAX_FILE - offset);
                let end = (offset + len) as usize;
                match rng.random_range(0..3) {
                    0 => {
                        volume.fallocate(ino, offset, len, FallocateMode::PunchHole).unwrap();
                        let stop = end.min(reference.len());
                        if (offset as usize) < stop {
                            reference[offset as usize..stop].fill(0);
                            pending.touch(offset as usize, stop, reference.len());
                        }
                    }
                    keep => {
                        let keep_size = keep == 1;
                        volume.fallocate(ino, offset, len, FallocateMode::Allocate { keep_size }).unwrap();
                        if !keep_size && reference.len() < end {
                            reference.resize(end, 0);
                        }
                        let stop = end.min(reference.len());
                        pending.touch((offset as usize).min(stop), stop, reference.len());
                    }
                }
            }
            64..=67 => {
                let size = reference.len() as u64;
                let new_size = match rng.random_range(0..3) {
                    0 => rng.random_range(0..=size),
                    1 => size + rng.random_range(0..100_000),
                    _ => rng.random_range(0..=size / g.block() + 1) * g.block(),
                }
                .min(MAX_FILE);
                volume.truncate(ino, new_size).unwrap();
                let old = reference.len();
                reference.resize(new_size as usize, 0);
                pending.touch(old.min(new_size as usize), old.max(new_size as usize), new_size as usize);
            }
            68..=81 => check_file(&volume, ino, reference, rng),
            82..=87 => {
                volume.fsync(ino).unwrap();
                *pending = Unsynced::synced(reference);
            }
            88..=90 => {
                volume.close().unwrap();
                volume = devices.open(options.clone()).unwrap();
                assert!(volume.recovery().clean, "a clean close leaves nothing to replay");
                unsynced = model.iter().map(|r| Unsynced::synced(r)).collect();
            }
            91..=94 => {
                volume.simulate_crash();
                volume = devices.open(options.clone()).unwrap();
                if volatile {
                    // Adopt what survived, after checking it could have.
                    for ((ino, reference), pending) in files.iter().zip(model.iter_mut()).zip(unsynced.iter_mut()) {
                        let size = volume.getattr(*ino).unwrap().size as usize;
                        let mut after = vec![0u8; size];
                        assert_eq!(volume.read(*ino, 0, &mut after).unwrap(), size);
                        if let Err(e) = pending.check(&after) {
                            panic!("inode {} after a crash: {e}", ino.0);
                        }
                        *reference = after;
                        *pending = Unsynced::synced(reference);
                    }
                    crashes_checked += 1;
                }
            }
            95..=97 => {
                volume.migrate_all().unwrap();
            }
            _ => volume.checkpoint().unwrap(),
        }
        if step % 50 == 49 {
            for (ino, reference) in files.iter().zip(&model) {
                check_file(&volume, *ino, reference, rng);
            }
        }
    }
    for (ino, reference) in files.iter().zip(&model) {
        check_file(&volume, *ino, reference, rng);
        // Nothing left in a volatile store, so the allocators compare after reopening.
        volume.fsync(*ino).unwrap();
    }
    // A background merge in flight holds blocks no map names yet.
    volume.settle();
    let stats = volume.stats();
    // Every SSD write is whole blocks, but a merge's write over a block in place, whole 4 KiB sectors.
    let sectors = stats.get(Counter::migration_sector_write_bytes);
    assert_eq!((stats.get(Counter::ssd_write_bytes) - sectors) % g.block(), 0, "every other SSD write is whole blocks");
    assert_eq!(sectors % 4096, 0, "a merge in place writes whole sectors");
    if case.roomy {
        assert_eq!(stats.get(Counter::fg_rmw_reads), 0, "{}: no foreground read-modify-write", case.name);
    }
    assert!(stats.usage.fast_pages_peak <= stats.usage.fast_pages_total, "{}: residue above its cap", case.name);
    eprintln!(
        "{}: {} ops, ssd share {:.2}, migrations {}+{}+{}+{}+{}, rmw {}, crashes checked {crashes_checked}",
        case.name,
        operations,
        stats.ssd_share(),
        stats.get(Counter::migrations_watermark),
        stats.get(Counter::migrations_header_full),
        stats.get(Counter::migrations_fast_full),
        stats.get(Counter::migrations_full),
        stats.get(Counter::migrations_sync),
        stats.get(Counter::fg_rmw_reads)
    );
    volume.close().unwrap();
    // The allocators rebuilt at open agree with what was in use.
    let reopened = devices.open(options).unwrap();
    let after = reopened.stats();
    let usage = |u: &alignfs::stats::Usage| (u.fast_pages_used, u.ssd_blocks_used, u.ssd_blocks_promised);
    assert_eq!(usage(&after.usage), usage(&stats.usage));
    assert_eq!(reopened.check(), [], "{}", case.name);
}

fn cases() -> Vec<Case> {
    let default = Geometry::default();
    let small = Geometry { block_bytes: 8192, page_bytes: 4096, split_bytes: 16384, io_workers: 2 };
    let fine = Geometry { block_bytes: 16384, page_bytes: 1024, split_bytes: 16384, io_workers: 1 };
    let scrap = Profile::SCRAP.default_geometry();
    let scrap_small = Geometry { block_bytes: 64 << 10, page_bytes: 64 << 10, split_bytes: 128 << 10, io_workers: 2 };
    let orch = |name, geometry, fast_bytes, read_mode, roomy| Case {
        name,
        profile: Profile::ORCH,
        geometry,
        fast_bytes,
        read_mode,
        roomy,
        byte_interface: true,
        meta_store: MetaStoreChoice::ProfileDefault,
    };
    let scrap_case = |name, geometry, fast_bytes, read_mode, roomy| Case {
        name,
        profile: Profile::SCRAP,
        geometry,
        fast_bytes,
        read_mode,
        roomy,
        byte_interface: true,
        meta_store: MetaStoreChoice::ProfileDefault,
    };
    let byte = Profile::BYTE.default_geometry();
    let byte_case = |name, geometry, read_mode, byte_interface| Case {
        name,
        profile: Profile::BYTE,
        geometry,
        fast_bytes: 0,
        read_mode,
        roomy: byte_interface,
        byte_interface,
        meta_store: MetaStoreChoice::ProfileDefault,
    };
    vec![
        orch("default geometry, buffered reads", default, 64 << 20, ReadMode::Buffered, true),
        orch("default geometry, direct reads", default, 64 << 20, ReadMode::Direct, true),
        orch("8K blocks", small, 32 << 20, ReadMode::Direct, true),
        orch("1K pages", fine, 32 << 20, ReadMode::Buffered, true),
        orch("tiny fast tier", default, 384 << 10, ReadMode::Buffered, false),
        orch("tiny fast tier, 8K blocks", small, 300 << 10, ReadMode::Direct, false),
        scrap_case("scrap, 256K pages", scrap, 32 << 20, ReadMode::Buffered, true),
        scrap_case("scrap, 64K pages, direct reads", scrap_small, 16 << 20, ReadMode::Direct, true),
        scrap_case("scrap, 4 pages of scrap memory", scrap_small, 256 << 10, ReadMode::Buffered, false),
        byte_case("byte, buffered reads", byte, ReadMode::Buffered, true),
        byte_case("byte, 16K blocks, direct reads", Geometry { block_bytes: 16 << 10, ..byte }, ReadMode::Direct, true),
        byte_case("byte, block interface only", byte, ReadMode::Buffered, false),
        Case { meta_store: MetaStoreChoice::Journal, ..byte_case("byte, journal and checkpoints", byte, ReadMode::Direct, true) },
    ]
}

#[test]
fn random_operations_match_the_model() {
    let seed = seed("model::random_operations_match_the_model");
    let mut rng = StdRng::seed_from_u64(seed);
    for case in cases() {
        run(&case, scaled(400), &mut rng);
    }
}
