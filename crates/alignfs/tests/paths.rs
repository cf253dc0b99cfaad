#![allow(clippy::unwrap_used)]
//! Targeted tests for the paths the random model rarely reaches: upage header overflow,
//! the fast-tier-full slow path, concurrency, fallocate, and device faults.

mod common;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use alignfs::device::{BlockDevice, FaultPlan, FaultyDevice};
use alignfs::stats::Counter;
use alignfs::volume::FallocateMode;
use alignfs::{Error, Geometry, Ino, Profile, Volume, VolumeOptions};
use common::Devices;

fn quiet() -> VolumeOptions {
    VolumeOptions { background: false, ..VolumeOptions::default() }
}

fn read_all(volume: &alignfs::Volume, ino: Ino) -> Vec<u8> {
    let size = volume.getattr(ino).unwrap().size as usize;
    let mut out = vec![0u8; size];
    assert_eq!(volume.read(ino, 0, &mut out).unwrap(), size);
    out
}

#[test]
fn full_upage_header_merges_the_block() {
    let devices = Devices::new(8 << 20, 16 << 20);
    devices.format(Geometry::default());
    let volume = devices.open(quiet()).unwrap();
    let ino = volume.create_file(Ino::ROOT, b"f", 0o644, 0, 0).unwrap().ino;
    let mut model = vec![7u8; 32768];
    volume.write(ino, 0, &model).unwrap();
    // Fifteen disjoint 10-byte chunks in page 0: the fifteenth overflows the header.
    for i in 0..15u64 {
        let data = vec![i as u8 + 100; 10];
        volume.write(ino, i * 200, &data).unwrap();
        model[(i * 200) as usize..(i * 200 + 10) as usize].copy_from_slice(&data);
    }
    let stats = volume.stats();
    assert_eq!(stats.get(Counter::migrations_header_full), 1);
    assert_eq!(stats.get(Counter::fg_rmw_reads), 0);
    assert_eq!(read_all(&volume, ino), model);
    volume.simulate_crash();
    let volume = devices.open(quiet()).unwrap();
    assert_eq!(read_all(&volume, ino), model);
}

#[test]
fn full_fast_tier_takes_the_slow_path_and_loses_nothing() {
    // Exactly 16 fast pages (two blocks' worth) after the metadata areas.
    let devices = Devices::new(266_240, 16 << 20);
    devices.format(Geometry::default());
    let volume = devices.open(quiet()).unwrap();
    assert_eq!(volume.stats().usage.fast_pages_total, 16);
    let ino = volume.create_file(Ino::ROOT, b"f", 0o644, 0, 0).unwrap().ino;
    let mut model = vec![1u8; 3 * 32768];
    volume.write(ino, 0, &model).unwrap();
    // Cover blocks 0 and 1 with full-page overlays: all 16 pages in use.
    for page in 0..16u64 {
        let data = vec![page as u8 + 10; 4096];
        volume.write(ino, page * 4096, &data).unwrap();
        model[(page * 4096) as usize..((page + 1) * 4096) as usize].copy_from_slice(&data);
    }
    assert_eq!(volume.stats().usage.fast_pages_used, 16);
    // Partial in blocks 0 and 2 and whole over block 1: the pages it needs are held by
    // blocks its own lock covers, so migration cannot help; it rewrites whole blocks.
    let data = vec![99u8; 2 * 32768];
    volume.write(ino, 100, &data).unwrap();
    model[100..100 + data.len()].copy_from_slice(&data);
    let stats = volume.stats();
    assert!(stats.get(Counter::fg_rmw_reads) >= 1, "the slow path ran");
    assert_eq!(read_all(&volume, ino), model);
    volume.close().unwrap();
    let volume = devices.open(quiet()).unwrap();
    assert_eq!(read_all(&volume, ino), model);
}

#[test]
fn writers_wait_for_migration_when_the_fast_tier_fills() {
    let devices = Devices::new(300 << 10, 64 << 20);
    devices.format(Geometry::default());
    let volume = devices.open(quiet()).unwrap();
    let ino = volume.create_file(Ino::ROOT, b"f", 0o644, 0, 0).unwrap().ino;
    let mut model = vec![0u8; 64 * 32768];
    volume.write(ino, 0, &model).unwrap();
    for i in 0..200u64 {
        let offset = (i * 7919 * 13) % (model.len() as u64 - 5000);
        let data = vec![(i % 251) as u8; 3000];
        volume.write(ino, offset, &data).unwrap();
        model[offset as usize..offset as usize + 3000].copy_from_slice(&data);
    }
    let stats = volume.stats();
    assert!(stats.get(Counter::migrations_fast_full) > 0, "writers migrated to make room");
    assert_eq!(stats.get(Counter::fg_rmw_reads), 0);
    assert_eq!(read_all(&volume, ino), model);
}

#[test]
fn concurrent_writers_and_readers_of_one_file() {
    let devices = Devices::new(32 << 20, 64 << 20);
    devices.format(Geometry::default());
    let volume = Arc::new(devices.open(VolumeOptions::default()).unwrap());
    let ino = volume.create_file(Ino::ROOT, b"shared", 0o644, 0, 0).unwrap().ino;
    let region = 300_000u64;
    volume.truncate(ino, 4 * region).unwrap();
    let writers: Vec<_> = (0..4u64)
        .map(|t| {
            let volume = Arc::clone(&volume);
            std::thread::spawn(move || {
                for round in 0..40u64 {
                    let len = 1000 + (round * 7717 + t * 131) % 60_000;
                    let offset = t * region + (round * 4099) % (region - len);
                    volume.write(ino, offset, &vec![(t * 50 + round) as u8; len as usize]).unwrap();
                }
                // The final write of each thread fixes its region's content.
                volume.write(ino, t * region, &vec![t as u8 + 1; region as usize]).unwrap();
            })
        })
        .collect();
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let volume = Arc::clone(&volume);
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 100_000];
                for i in 0..100u64 {
                    volume.read(ino, (i * 11_939) % (4 * region), &mut buf).unwrap();
                }
            })
        })
        .collect();
    for t in writers.into_iter().chain(readers) {
        t.join().unwrap();
    }
    let content = read_all(&volume, ino);
    for t in 0..4u64 {
        let part = &content[(t * region) as usize..((t + 1) * region) as usize];
        assert!(part.iter().all(|&b| b == t as u8 + 1), "region {t}");
    }
}

/// Small writes racing migrations that run beside them (the background thread on a tiny
/// fast tier, and a thread migrating everything in a loop): every byte must end up as the
/// last write to it left it. Merges that a writer overtook must be dropped, not committed.
#[test]
fn small_writes_race_background_migration() {
    use rand::{Rng, SeedableRng};
    let devices = Devices::new(1 << 20, 64 << 20);
    devices.format(Geometry::default());
    let volume = Arc::new(devices.open(VolumeOptions::default()).unwrap());
    let ino = volume.create_file(Ino::ROOT, b"f", 0o644, 0, 0).unwrap().ino;
    let region = 256 * 1024usize;
    volume.write(ino, 0, &vec![0u8; 2 * region]).unwrap();
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let passes = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let migrator = {
        let (volume, done, passes) = (Arc::clone(&volume), Arc::clone(&done), Arc::clone(&passes));
        std::thread::spawn(move || {
            while !done.load(Ordering::SeqCst) {
                volume.migrate_all().unwrap();
                passes.fetch_add(1, Ordering::SeqCst);
            }
        })
    };
    let writers: Vec<_> = (0..2usize)
        .map(|t| {
            let volume = Arc::clone(&volume);
            std::thread::spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(t as u64);
                let mut model = vec![0u8; region];
                for i in 0..3000u32 {
                    let len = rng.random_range(1..9000usize);
                    let at = rng.random_range(0..region - len);
                    let byte = (i % 250) as u8 + 1;
                    volume.write(ino, (t * region + at) as u64, &vec![byte; len]).unwrap();
                    model[at..at + len].fill(byte);
                }
                model
            })
        })
        .collect();
    let models: Vec<Vec<u8>> = writers.into_iter().map(|w| w.join().unwrap()).collect();
    // One whole pass after the writers: whatever residue they left is merged too.
    let seen = passes.load(Ordering::SeqCst);
    while passes.load(Ordering::SeqCst) < seen + 2 {
        std::thread::yield_now();
    }
    done.store(true, Ordering::SeqCst);
    migrator.join().unwrap();
    let stats = volume.stats();
    assert!(stats.get(Counter::migrations_watermark) > 0, "blocks were merged");
    let content = read_all(&volume, ino);
    for (t, model) in models.iter().enumerate() {
        assert!(content[t * region..(t + 1) * region] == model[..], "region {t} differs from its writer's model");
    }
    assert_eq!(volume.check(), []);
    Arc::into_inner(volume).unwrap().close().unwrap();
    let volume = devices.open(quiet()).unwrap();
    assert_eq!(read_all(&volume, ino), models.concat());
}

#[test]
fn fallocate_allocates_and_punches() {
    let devices = Devices::new(8 << 20, 32 << 20);
    devices.format(Geometry::default());
    let volume = devices.open(quiet()).unwrap();
    let ino = volume.create_file(Ino::ROOT, b"f", 0o644, 0, 0).unwrap().ino;
    let free_before = volume.statfs().blocks_free;
    volume.fallocate(ino, 0, 10 * 32768 + 500, FallocateMode::Allocate { keep_size: false }).unwrap();
    assert_eq!(volume.getattr(ino).unwrap().size, 10 * 32768 + 500);
    assert_eq!(free_before - volume.statfs().blocks_free, 11, "every block the range touches is held on the SSD");
    assert!(read_all(&volume, ino).iter().all(|&b| b == 0));
    let mut model = vec![5u8; 10 * 32768 + 500];
    volume.write(ino, 0, &model).unwrap();
    volume.fallocate(ino, 1000, 3 * 32768, FallocateMode::PunchHole).unwrap();
    model[1000..1000 + 3 * 32768].fill(0);
    assert_eq!(read_all(&volume, ino), model);
    assert_eq!(volume.getattr(ino).unwrap().size, model.len() as u64, "punching keeps the size");
    volume.fallocate(ino, 0, 100, FallocateMode::Allocate { keep_size: true }).unwrap();
    assert_eq!(read_all(&volume, ino), model);
    // A hole inside one block, and the errors POSIX names for bad ranges.
    volume.fallocate(ino, 40_000, 10, FallocateMode::PunchHole).unwrap();
    model[40_000..40_010].fill(0);
    assert_eq!(read_all(&volume, ino), model);
    assert!(matches!(volume.fallocate(ino, 0, 0, FallocateMode::PunchHole), Err(Error::InvalidArgument(_))));
    assert!(matches!(volume.fallocate(ino, u64::MAX - 1, 10, FallocateMode::Allocate { keep_size: false }), Err(Error::FileTooLarge)));
    assert!(matches!(volume.fallocate(ino, 1 << 60, 1, FallocateMode::Allocate { keep_size: false }), Err(Error::FileTooLarge)));
}

/// `fallocate` writes nothing: each hole becomes a zero block holding one SSD block, which
/// no other file can take and which the first whole-block write to it uses.
#[test]
fn fallocated_blocks_are_held_not_written() {
    let devices = Devices::new(8 << 20, 32 << 20);
    devices.format(Geometry::default());
    let mut volume = devices.open(quiet()).unwrap();
    let block = Geometry::default().block();
    let a = volume.create_file(Ino::ROOT, b"a", 0o644, 0, 0).unwrap().ino;
    let b = volume.create_file(Ino::ROOT, b"b", 0o644, 0, 0).unwrap().ino;
    let held = volume.statfs().blocks_free - 2;
    let ssd_writes = volume.stats().get(Counter::ssd_write_bytes);
    volume.fallocate(a, 0, held * block, FallocateMode::Allocate { keep_size: true }).unwrap();
    assert_eq!(volume.stats().get(Counter::ssd_write_bytes), ssd_writes, "no zeros written");
    assert_eq!((volume.statfs().blocks_free, volume.stats().usage.ssd_blocks_promised), (2, held));
    assert_eq!(volume.getattr(a).unwrap().size, 0, "KEEP_SIZE");
    assert!(matches!(volume.fallocate(b, 0, 3 * block, FallocateMode::Allocate { keep_size: false }), Err(Error::NoSpace)));
    assert!(matches!(volume.write(b, 0, &vec![1u8; 3 * block as usize]), Err(Error::NoSpace)), "held blocks are not taken");
    assert_eq!(volume.stats().usage.ssd_blocks_promised, held, "a refused fallocate holds nothing");
    assert_eq!(volume.check(), []);
    // A crash keeps the promises: they are rebuilt from the maps.
    volume.simulate_crash();
    volume = devices.open(quiet()).unwrap();
    assert_eq!((volume.statfs().blocks_free, volume.stats().usage.ssd_blocks_promised), (2, held));
    // A small write to a zero block gives its promise up (its residue merges later, like
    // any other); the owner's whole-block writes take the held blocks.
    volume.write(a, 10, b"small").unwrap();
    assert_eq!(volume.stats().usage.ssd_blocks_promised, held - 1);
    let data: Vec<u8> = (0..(held - 1) * block).map(|i| (i % 251) as u8).collect();
    volume.write(a, block, &data).unwrap();
    assert_eq!(volume.stats().usage.ssd_blocks_promised, 0);
    let mut model = vec![0u8; block as usize];
    model[10..15].copy_from_slice(b"small");
    model.extend_from_slice(&data);
    assert_eq!(read_all(&volume, a), model);
    assert_eq!(volume.check(), []);
    // Punching and truncating give promises back; unlinking too.
    volume.truncate(b, 0).unwrap();
    volume.unlink(Ino::ROOT, b"a").unwrap();
    volume.fallocate(b, 0, 8 * block + 1, FallocateMode::Allocate { keep_size: false }).unwrap();
    volume.fallocate(b, block, 2 * block, FallocateMode::PunchHole).unwrap();
    assert_eq!(volume.stats().usage.ssd_blocks_promised, 7);
    volume.truncate(b, 4 * block + 100).unwrap();
    assert_eq!(volume.stats().usage.ssd_blocks_promised, 3);
    assert!(read_all(&volume, b).iter().all(|&x| x == 0));
    assert_eq!(volume.check(), []);
    volume.close().unwrap();
    let volume = devices.open(quiet()).unwrap();
    assert_eq!(volume.stats().usage.ssd_blocks_promised, 3);
    volume.unlink(Ino::ROOT, b"b").unwrap();
    assert_eq!(volume.stats().usage.ssd_blocks_promised, 0);
    assert_eq!(volume.check(), []);
}

#[test]
fn ssd_faults_surface_as_errors_and_change_nothing() {
    let devices = Devices::new(8 << 20, 32 << 20);
    devices.format(Geometry::default());
    let volume = devices.open(quiet()).unwrap();
    let ino = volume.create_file(Ino::ROOT, b"f", 0o644, 0, 0).unwrap().ino;
    let model = vec![3u8; 100_000];
    volume.write(ino, 0, &model).unwrap();
    let blocks_used = volume.stats().usage.ssd_blocks_used;
    devices.ssd.faults.fail_write_in.store(1, Ordering::SeqCst);
    let failed = volume.write(ino, 0, &vec![9u8; 200_000]);
    assert!(matches!(failed, Err(Error::Injected(_))), "{failed:?}");
    assert_eq!(failed.unwrap_err().errno(), libc::EIO);
    assert_eq!(volume.getattr(ino).unwrap().size, 100_000, "a failed write does not extend the file");
    assert_eq!(volume.stats().usage.ssd_blocks_used, blocks_used, "the failed write's blocks were returned");
    devices.ssd.faults.fail_read_in.store(1, Ordering::SeqCst);
    let mut buf = vec![0u8; 50_000];
    assert_eq!(volume.read(ino, 0, &mut buf).unwrap_err().errno(), libc::EIO);
    volume.write(ino, 100_000, b"tail").unwrap();
    // A write flushes its SSD blocks before journaling them: a failed flush fails the
    // write and leaves the file as it was; the next fsync retries the flush.
    devices.ssd.faults.fail_flush_in.store(1, Ordering::SeqCst);
    let flushes = devices.ssd.flushes.load(Ordering::SeqCst);
    assert_eq!(volume.write(ino, 0, &vec![7u8; 64 << 10]).unwrap_err().errno(), libc::EIO);
    volume.fsync(ino).unwrap();
    assert_eq!(devices.ssd.flushes.load(Ordering::SeqCst), flushes + 1, "fsync retried the failed flush");
    volume.fsync(ino).unwrap();
    assert_eq!(devices.ssd.flushes.load(Ordering::SeqCst), flushes + 1, "nothing left to flush");
    let mut expected = model.clone();
    expected.extend_from_slice(b"tail");
    // Whole blocks are written out of place, so the failed write left the old data.
    assert_eq!(read_all(&volume, ino), expected);
    volume.close().unwrap();
    let volume = devices.open(quiet()).unwrap();
    let content = read_all(&volume, ino);
    assert_eq!(content.len(), expected.len());
    assert_eq!(&content[100_000..], b"tail");
}

#[test]
fn short_ssd_ios_fail_the_call_and_leave_the_data_as_it_was() {
    let devices = Devices::new(8 << 20, 32 << 20);
    devices.format(Geometry::default());
    let plan = Arc::new(FaultPlan::default());
    let faulty: Arc<dyn BlockDevice> = Arc::new(FaultyDevice::new(Arc::clone(&devices.ssd) as Arc<dyn BlockDevice>, Arc::clone(&plan)));
    let volume = Volume::open(alignfs::Devices::new(devices.fast.clone(), Arc::clone(&faulty)), quiet()).unwrap();
    let ino = volume.create_file(Ino::ROOT, b"f", 0o644, 0, 0).unwrap().ino;
    let model: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    volume.write(ino, 0, &model).unwrap();
    for spec in ["short-write=1", "write=1"] {
        plan.arm(spec).unwrap();
        let failed = volume.write(ino, 0, &vec![7u8; 262_144]);
        assert_eq!(failed.map_err(|e| e.errno()), Err(libc::EIO), "{spec}");
        assert_eq!(read_all(&volume, ino), model, "{spec} changed acknowledged data");
    }
    for spec in ["short-read=1", "read=1"] {
        plan.arm(spec).unwrap();
        let mut buf = vec![0u8; 262_144];
        assert_eq!(volume.read(ino, 0, &mut buf).map_err(|e| e.errno()), Err(libc::EIO), "{spec}");
        assert_eq!(read_all(&volume, ino), model, "the read after {spec}");
    }
    volume.close().unwrap();
    let volume = Volume::open(alignfs::Devices::new(devices.fast.clone(), faulty), quiet()).unwrap();
    assert_eq!(read_all(&volume, ino), model);
    assert!(volume.check().is_empty());
}

#[test]
fn deleting_files_works_when_metadata_is_full() {
    // 2 MiB of fast tier: 128 KiB checkpoint slots hold the maps of only a few thousand
    // blocks, so the SSD outlasts the metadata.
    let devices = Devices::new(2 << 20, 512 << 20);
    devices.format(Geometry::default());
    let volume = devices.open(quiet()).unwrap();
    let chunk = vec![9u8; 1 << 20];
    // A preallocated file: once metadata is full, a write that would map its zero blocks
    // fails, and they keep the SSD blocks promised to them.
    let held = volume.create_file(Ino::ROOT, b"held", 0o644, 0, 0).unwrap().ino;
    volume.fallocate(held, 0, chunk.len() as u64, FallocateMode::Allocate { keep_size: false }).unwrap();
    let promised = volume.stats().usage.ssd_blocks_promised;
    let mut files = Vec::new();
    let full = 'fill: loop {
        let ino = volume.create_file(Ino::ROOT, format!("f{}", files.len()).as_bytes(), 0o644, 0, 0);
        let ino = match ino {
            Ok(attr) => attr.ino,
            Err(e) => break 'fill e,
        };
        files.push(ino);
        for i in 0..8 {
            if let Err(e) = volume.write(ino, i * chunk.len() as u64 + 1, &chunk) {
                break 'fill e;
            }
        }
    };
    assert!(matches!(full, Error::MetadataFull(_)), "{full}");
    assert!(files.len() > 2);
    let refused = volume.write(held, 0, &chunk);
    assert!(matches!(refused, Err(Error::MetadataFull(_))), "{refused:?}");
    assert_eq!(volume.stats().usage.ssd_blocks_promised, promised, "the refused write's promises are back");
    assert_eq!(volume.check(), []);
    for i in 1..files.len() {
        volume.unlink(Ino::ROOT, format!("f{i}").as_bytes()).unwrap_or_else(|e| panic!("unlink {i} of a full volume: {e}"));
    }
    // Space came back: new data and a checkpoint fit again, and survive a reopen.
    let g = volume.create_file(Ino::ROOT, b"after", 0o644, 0, 0).unwrap().ino;
    volume.write(g, 0, &chunk).unwrap();
    volume.checkpoint().unwrap();
    volume.close().unwrap();
    let volume = devices.open(quiet()).unwrap();
    let mut out = vec![0u8; chunk.len()];
    assert_eq!(volume.read(g, 0, &mut out).unwrap(), chunk.len());
    assert!(out == chunk);
}

/// Large writes mixed with small ones (UHS's 4 KiB + 1 MiB workload) keep going out in
/// few large IOs. Out of place (`orch`), the allocator gives a multi-block write long free
/// runs, so the one-block holes that merged small writes leave behind do not scatter it,
/// and migration writes the blocks it merges in runs too: before, on this volume, a 1 MiB
/// write took 6.5 IOs (5.6 now, 5 on a fresh volume) and migration wrote one block per IO
/// (31 now). `uhs` keeps every block at its home, so a 1 MiB write is 5 IOs as on a fresh
/// volume, and migration writes each block where it lives.
#[test]
fn large_writes_and_merges_go_out_in_long_runs() {
    for (profile, most_ios, fewest_blocks_per_migration_io) in [(Profile::ORCH, 6.0, 8.0), (Profile::UHS, 5.0, 1.0)] {
        mixed_large_and_small_writes(profile, most_ios, fewest_blocks_per_migration_io);
    }
}

fn mixed_large_and_small_writes(profile: Profile, most_ios: f64, fewest_blocks_per_migration_io: f64) {
    let mut devices = Devices::new(64 << 20, 256 << 20);
    devices.profile = profile;
    devices.format(profile.default_geometry());
    let volume = devices.open(quiet()).unwrap();
    let ino = volume.create_file(Ino::ROOT, b"f", 0o644, 0, 0).unwrap().ino;
    let size = 128u64 << 20;
    for offset in (0..size).step_by(1 << 20) {
        volume.write(ino, offset, &[7u8; 1 << 20]).unwrap();
    }
    let mut random = 42u64;
    let mut next = move |bound: u64| {
        random ^= random << 13;
        random ^= random >> 7;
        random ^= random << 17;
        random % bound
    };
    const ROUNDS: u32 = 1000;
    let (mut large_writes, mut large_ios, mut migration_ios, mut migrated_bytes) = (0u64, 0u64, 0u64, 0u64);
    for k in 0..ROUNDS {
        volume.write(ino, next(size - 4096) & !4095, &[k as u8; 4096]).unwrap();
        let before = volume.stats().get(Counter::ssd_write_ios);
        volume.write(ino, next(size - (1 << 20)) & !4095, &vec![k as u8; 1 << 20]).unwrap();
        if k >= ROUNDS / 2 {
            large_writes += 1;
            large_ios += volume.stats().get(Counter::ssd_write_ios) - before;
        }
        if k % 64 == 63 {
            let before = volume.stats();
            volume.migrate_all().unwrap();
            let after = volume.stats();
            migration_ios += after.get(Counter::ssd_write_ios) - before.get(Counter::ssd_write_ios);
            migrated_bytes += after.get(Counter::migration_write_bytes) - before.get(Counter::migration_write_bytes);
        }
    }
    let ios = large_ios as f64 / large_writes as f64;
    let blocks_per_migration_io = migrated_bytes as f64 / 4096.0 / migration_ios as f64;
    eprintln!("{profile:?}: {ios:.1} SSD write IOs per 1 MiB write, {blocks_per_migration_io:.1} blocks per migration IO");
    assert!(ios <= most_ios, "{profile:?}: {ios:.1} IOs per 1 MiB write: the allocator scattered it");
    assert!(
        blocks_per_migration_io >= fewest_blocks_per_migration_io,
        "{profile:?}: migration wrote {blocks_per_migration_io:.1} blocks per IO"
    );
    assert!(volume.check().is_empty());
}
