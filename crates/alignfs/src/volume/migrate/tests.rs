use std::sync::Arc;

use crate::stats::Counter;
use crate::volume::test_volume as volume;
use crate::{Ino, Volume};

/// A `scrap` volume formatted on `ssd` with 64 KiB blocks, no background work and 2 MiB
/// of scrap memory, and the options that reopen it.
fn scrap_volume(ssd: &Arc<dyn crate::device::BlockDevice>) -> (Volume, crate::VolumeOptions) {
    use crate::{Devices, FormatOptions, Geometry, Profile, VolumeOptions};
    let geometry = Geometry { block_bytes: 64 << 10, page_bytes: 64 << 10, split_bytes: 64 << 10, io_workers: 1 };
    Volume::format(&Devices::ssd_only(Arc::clone(ssd)), &FormatOptions { geometry, profile: Profile::SCRAP, ..Default::default() })
        .unwrap();
    let options = VolumeOptions { scrap_mem_bytes: 2 << 20, background: false, ..VolumeOptions::default() };
    (Volume::open(Devices::ssd_only(Arc::clone(ssd)), options.clone()).unwrap(), options)
}

fn read_all(v: &Volume, f: Ino, len: usize) -> Vec<u8> {
    let mut out = vec![0; len];
    assert_eq!(v.read(f, 0, &mut out).unwrap(), len);
    out
}

/// A write that lands between a merge's copy and its commit must win; a block nobody
/// touched must move.
#[test]
fn a_write_during_a_watched_merge_is_kept() {
    let v = volume();
    let f = v.create_file(Ino::ROOT, b"f", 0o644, 0, 0).unwrap().ino;
    let block = v.inner.geometry.block() as usize;
    let mut expect: Vec<u8> = (0..4 * block).map(|i| (i % 251) as u8).collect();
    v.write(f, 0, &expect).unwrap();
    v.migrate_all().unwrap();
    // Residue in blocks 1 and 2: upage chunks over SSD blocks.
    for at in [block + 100, 2 * block + 100] {
        v.write(f, at as u64, b"before").unwrap();
        expect[at..at + 6].copy_from_slice(b"before");
    }
    let inode = v.inner.file(f).unwrap();
    let merging = super::start_watched_merge(&v.inner, vec![(Arc::clone(&inode), 1), (Arc::clone(&inode), 2)]).unwrap();
    assert_eq!(merging.work.len(), 2);
    // Block 1 is written meanwhile, in place in the same upage.
    v.write(f, (block + 102) as u64, b"AFTER").unwrap();
    expect[block + 102..block + 107].copy_from_slice(b"AFTER");
    let used_before = v.inner.blocks.refs.used_count();
    let (moved, left) = super::finish_watched_merge(&v.inner, merging, Counter::migrations_watermark).unwrap();
    assert_eq!((moved, left), (1, vec![(f, 1)]));
    assert_eq!(v.inner.stats.get(Counter::migrations_dropped), 1);
    // Block 2 moved (its old SSD block freed), block 1's unused new block was freed.
    assert_eq!(v.inner.blocks.refs.used_count(), used_before - 2);
    assert!(inode.map.lock()[&1].fast_page_count() > 0);
    assert_eq!(inode.map.lock()[&2].fast_page_count(), 0);
    assert_eq!(read_all(&v, f, expect.len()), expect);
    v.migrate_all().unwrap();
    assert_eq!(read_all(&v, f, expect.len()), expect);
    assert_eq!(v.check(), []);
}

/// A watched merge (the flushers') on a volume that rewrites blocks in place writes
/// them only once it holds their locks again, and then only the sectors touched:
/// nothing before that, and nothing at all over a block a writer took meanwhile.
#[test]
fn a_watched_merge_writes_in_place_only_under_the_lock() {
    use crate::device::{BlockDevice, SimSsd};
    use crate::Devices;
    let ssd: Arc<dyn BlockDevice> = Arc::new(SimSsd::new(32 << 20));
    let (v, options) = scrap_volume(&ssd);
    let counter = |c: Counter| v.inner.stats.get(c);
    let f = v.create_file(Ino::ROOT, b"f", 0o644, 0, 0).unwrap().ino;
    let block = v.inner.geometry.block() as usize;
    let mut expect: Vec<u8> = (0..4 * block).map(|i| (i % 251) as u8).collect();
    v.write(f, 0, &expect).unwrap();
    v.fsync(f).unwrap();
    for at in [block + 100, 2 * block + 100] {
        v.write(f, at as u64, b"residue").unwrap();
        expect[at..at + 7].copy_from_slice(b"residue");
    }
    let inode = v.inner.file(f).unwrap();
    let written = counter(Counter::ssd_write_bytes);
    let merging = super::start_watched_merge(&v.inner, vec![(Arc::clone(&inode), 1), (Arc::clone(&inode), 2)]).unwrap();
    assert_eq!(merging.work.len(), 2);
    assert_eq!(counter(Counter::ssd_write_bytes), written, "nothing written while the blocks are unlocked");
    // Block 1 is written meanwhile.
    v.write(f, block as u64, &vec![9; block]).unwrap();
    expect[block..2 * block].fill(9);
    let used = v.inner.blocks.refs.used_count();
    let sectors = counter(Counter::migration_sector_write_bytes);
    let (moved, left) = super::finish_watched_merge(&v.inner, merging, Counter::migrations_watermark).unwrap();
    assert_eq!((moved, left), (1, vec![(f, 1)]));
    assert_eq!(counter(Counter::migration_sector_write_bytes) - sectors, 4096, "block 2's one sector, block 1 untouched");
    assert_eq!(v.inner.blocks.refs.used_count(), used, "no new block");
    assert_eq!(read_all(&v, f, expect.len()), expect);
    v.fsync(f).unwrap();
    assert_eq!(v.check(), []);
    v.simulate_crash();
    let v = Volume::open(Devices::ssd_only(ssd), options).unwrap();
    assert_eq!(read_all(&v, f, expect.len()), expect, "what the merge and fsync wrote in place survived a crash");
}

/// Where the profile keeps blocks at home (`uhs`), writes and merges rewrite each
/// block where its first write put it, at its home, so a large write after any history
/// of small ones is as few IOs as on a fresh volume. A block a merge has pinned is
/// written elsewhere, and goes home again at its next write once the merge is done.
#[test]
fn blocks_kept_home_stay_there_through_writes_and_merges() {
    let fast = Arc::new(crate::device::PmemRegion::anonymous(8 << 20).unwrap());
    let devices = crate::Devices::new(fast, Arc::new(crate::device::SimSsd::new(32 << 20)));
    let profile = crate::Profile::UHS;
    Volume::format(&devices, &crate::FormatOptions { geometry: profile.default_geometry(), profile, force: false, ..Default::default() })
        .unwrap();
    let v = Volume::open(devices, crate::VolumeOptions { background: false, ..crate::VolumeOptions::default() }).unwrap();
    let f = v.create_file(Ino::ROOT, b"volume", 0o644, 0, 0).unwrap().ino;
    let inode = v.inner.file(f).unwrap();
    let block = v.inner.geometry.block() as usize;
    let blocks = 1024usize;
    let mut expect = vec![0u8; blocks * block];
    fn write(v: &Volume, f: Ino, expect: &mut [u8], at: usize, data: &[u8]) {
        v.write(f, at as u64, data).unwrap();
        expect[at..at + data.len()].copy_from_slice(data);
    }
    let home = |lblock: u64| v.inner.blocks.home_of(lblock).unwrap();
    let at_home = |lblock: u64| inode.map.lock()[&lblock].ssd_block().map(|b| b.0) == Some(home(lblock));
    // Small writes first (buffered, merged to their homes), then large ones over them.
    let mut random = 7u64;
    let mut next = move |bound: usize| {
        random ^= random << 13;
        random ^= random >> 7;
        random ^= random << 17;
        random as usize % bound
    };
    for k in 0..600 {
        write(&v, f, &mut expect, next(blocks) * block, &[(k % 250) as u8 + 1; 4096]);
        if k % 100 == 99 {
            v.migrate_all().unwrap();
        }
    }
    v.migrate_all().unwrap();
    let large = 256 * block;
    for k in 0..8u8 {
        let start = next(blocks - 256) * block;
        let before = v.inner.stats.get(Counter::ssd_write_ios);
        write(&v, f, &mut expect, start, &vec![0xA0 + k; large]);
        let ios = v.inner.stats.get(Counter::ssd_write_ios) - before;
        assert!(ios <= v.inner.blocks.runs_when_consecutive(256) as u64, "a 1 MiB write took {ios} IOs");
        for _ in 0..20 {
            write(&v, f, &mut expect, next(blocks) * block + next(4000), b"residue");
        }
        v.migrate_all().unwrap();
    }
    let mapped: Vec<u64> = inode.map.lock().keys().copied().collect();
    assert!(mapped.len() > 600);
    assert!(mapped.iter().all(|&lb| at_home(lb)), "a block left its home");
    assert_eq!(read_all(&v, f, expect.len()), expect);

    // Block 5 is rewritten in place by a watched merge while a writer replaces it whole:
    // the writer takes another block, the merge is dropped, the data is the writer's.
    write(&v, f, &mut expect, 5 * block + 10, b"residue");
    let merging = super::start_watched_merge(&v.inner, vec![(Arc::clone(&inode), 5)]).unwrap();
    v.inner.blocks.refs.pin(home(5));
    write(&v, f, &mut expect, 4 * block, &vec![0x55; 128 * block]);
    v.inner.blocks.refs.unpin([home(5)]);
    assert!(!at_home(5) && at_home(4) && at_home(6));
    assert_eq!(super::finish_watched_merge(&v.inner, merging, Counter::migrations_watermark).unwrap(), (0, vec![(f, 5)]));
    assert_eq!(read_all(&v, f, expect.len()), expect);
    assert_eq!(v.check(), []);
    // Its home is free again: the next write of the block takes it back.
    write(&v, f, &mut expect, 4 * block, &vec![0x66; 128 * block]);
    assert!(at_home(5));
    assert_eq!(read_all(&v, f, expect.len()), expect);
    assert_eq!(v.check(), []);
}

/// A merge in place that a crash cuts between its write and its commit leaves bytes past
/// the size the crash keeps, in the block holding EOF. When the file grows again (by
/// truncate, by a write past EOF, by fallocate) those bytes read as zeros, and a crash
/// after that keeps them zero.
#[test]
fn bytes_an_interrupted_merge_left_past_eof_never_show() {
    use crate::device::{run_batch, AlignedBuf, BlockDevice, IoOp, IoRequest, SimSsd};
    use crate::volume::FallocateMode;
    use crate::Devices;
    for grow in ["truncate", "write", "fallocate", "clone"] {
        let ssd: Arc<dyn BlockDevice> = Arc::new(SimSsd::new(32 << 20));
        let (v, options) = scrap_volume(&ssd);
        let f = v.create_file(Ino::ROOT, b"f", 0o644, 0, 0).unwrap().ino;
        let block = v.inner.geometry.block() as usize;
        v.write(f, 0, &[1; 1000]).unwrap();
        v.fsync(f).unwrap();
        let home = v.inner.file(f).unwrap().map.lock()[&0].ssd_block().unwrap();
        // What the interrupted merge wrote: a sector past EOF, over the file's own block.
        let mut sector = AlignedBuf::zeroed(4096);
        sector[1000..1280].fill(0xAF);
        run_batch(ssd.as_ref(), vec![IoRequest { op: IoOp::Write, offset_bytes: home.0 * block as u64 + 4096, buf: sector }]).unwrap();
        v.simulate_crash();
        let v = Volume::open(Devices::ssd_only(Arc::clone(&ssd)), options.clone()).unwrap();
        assert_eq!(v.getattr(f).unwrap().size, 1000);
        let end = 3 * block;
        let mut want = vec![0u8; end];
        want[..1000].fill(1);
        match grow {
            "truncate" => v.truncate(f, end as u64).unwrap(),
            "write" => {
                assert_eq!(v.write(f, end as u64 - 1, &[2]).unwrap(), 1);
                want[end - 1] = 2;
            }
            "fallocate" => v.fallocate(f, 0, end as u64, FallocateMode::Allocate { keep_size: false }).unwrap(),
            _ => {
                // The copy grows instead: it must not carry the bytes past the original's EOF.
                let copy = v.create_file(Ino::ROOT, b"copy", 0o644, 0, 0).unwrap().ino;
                v.clone_file(f, copy).unwrap();
                v.truncate(copy, end as u64).unwrap();
                v.truncate(f, end as u64).unwrap();
                let differs = read_all(&v, copy, end).iter().zip(&want).position(|(a, b)| a != b);
                assert_eq!(differs, None, "the clone, grown");
            }
        }
        let differs = |got: Vec<u8>| got.iter().zip(&want).position(|(a, b)| a != b);
        assert_eq!(differs(read_all(&v, f, end)), None, "grown by {grow}");
        assert_eq!(v.inner.stats.get(Counter::stale_tails_cleared), 1, "{grow}");
        v.fsync(f).unwrap();
        assert_eq!(v.check(), []);
        v.simulate_crash();
        let v = Volume::open(Devices::ssd_only(Arc::clone(&ssd)), options).unwrap();
        assert_eq!(differs(read_all(&v, f, end)), None, "grown by {grow}, after another crash");
    }
}
