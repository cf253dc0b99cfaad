#![allow(clippy::unwrap_used)]
//! Power-loss images of a `uhs` block volume (the method of `power_loss.rs`): random
//! small, large and unaligned writes, trims and flushes, over a volume with a static NVM
//! range and an NVM buffer small enough that segments fill and drain. At every persistence
//! point, images built from what was durable (and some of what was not) must open, pass
//! fsck, and read back every acknowledged write; the request in flight may have landed
//! byte by byte, and nothing else may differ.

use std::sync::Arc;

use alignfs::device::power_loss::{PowerLog, RecordedSsd, Replay, Survival};
use alignfs::device::{BlockDevice, ByteTier, PmemRegion, SimSsd};
use alignfs::personality::{BlockLayout, BlockVolume};
use alignfs::test_support::{scaled, seed};
use alignfs::{Devices, FormatOptions, Profile, VolumeOptions};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const FAST_BYTES: u64 = 512 << 10;
const SSD_BYTES: u64 = 8 << 20;
const VOLUME_BYTES: u64 = 2 << 20;

#[derive(Clone, Debug)]
enum Op {
    Write { offset: u64, data: Vec<u8> },
    Trim { offset: u64, len: u64 },
    Flush,
}

fn random_op(rng: &mut StdRng) -> Op {
    let sectors = |rng: &mut StdRng, most: u64| rng.random_range(1..=most) * 512;
    match rng.random_range(0..10) {
        0 => Op::Flush,
        1 => {
            let len = sectors(rng, 32);
            Op::Trim { offset: rng.random_range(0..(VOLUME_BYTES - len) / 512) * 512, len }
        }
        _ => {
            let len = if rng.random_bool(0.7) { sectors(rng, 8) } else { sectors(rng, 96) };
            // A third of the writes go to the static range at the front.
            let top = if rng.random_bool(0.3) { 64 << 10 } else { VOLUME_BYTES };
            let offset = rng.random_range(0..(top - len.min(top)) / 512 + 1) * 512;
            let len = len.min(VOLUME_BYTES - offset);
            let fill: u8 = rng.random_range(1..=255);
            Op::Write { offset, data: (0..len).map(|i| fill.wrapping_add(i as u8) | 1).collect() }
        }
    }
}

fn apply(model: &mut [u8], op: &Op) {
    match op {
        Op::Write { offset, data } => model[*offset as usize..*offset as usize + data.len()].copy_from_slice(data),
        Op::Trim { offset, len } => model[*offset as usize..(*offset + *len) as usize].fill(0),
        Op::Flush => {}
    }
}

fn layout() -> BlockLayout {
    BlockLayout { nvm_ranges: vec![0..(48 << 10), (60 << 10)..(64 << 10)], ..BlockLayout::new(VOLUME_BYTES) }
}

fn options() -> VolumeOptions {
    // A threshold below the largest write (48 KiB), so both the buffer and the direct path
    // (whole blocks to the SSD, then a flush) are cut by power losses.
    VolumeOptions { background: false, request_threshold: Some(16 << 10), ..VolumeOptions::default() }
}

#[test]
fn a_uhs_block_volume_survives_every_power_loss_image() {
    let seed = seed("block_power_loss::a_uhs_block_volume_survives_every_power_loss_image");
    let mut rng = StdRng::seed_from_u64(seed);
    let survivals = [Survival { fast_word: 0.0, ssd_sector: 0.0 }, Survival { fast_word: 0.5, ssd_sector: 0.5 }];
    let (mut points, mut images) = (0, 0);
    for round in 0..scaled(3) {
        let log = PowerLog::new();
        let fast = Arc::new(PmemRegion::recorded(FAST_BYTES, Arc::clone(&log)).unwrap());
        let ssd: Arc<dyn BlockDevice> = Arc::new(RecordedSsd::new(Arc::new(SimSsd::new(SSD_BYTES)), Arc::clone(&log)));
        let devices = Devices::new(Arc::clone(&fast) as Arc<dyn ByteTier>, Arc::clone(&ssd));
        let format = FormatOptions { geometry: Profile::UHS.default_geometry(), profile: Profile::UHS, force: false, ..Default::default() };
        BlockVolume::format(&devices, &format, layout()).unwrap();
        let disk = BlockVolume::open(devices, options()).unwrap();
        let setup_end = log.position();
        let mut models = vec![vec![0u8; VOLUME_BYTES as usize]];
        let mut spans = Vec::new();
        for _ in 0..80 {
            let op = random_op(&mut rng);
            let start = log.position();
            match &op {
                Op::Write { offset, data } => disk.write(*offset, data).unwrap(),
                Op::Trim { offset, len } => disk.trim(*offset, *len).unwrap(),
                Op::Flush => disk.flush().unwrap(),
            }
            let mut next = models.last().unwrap().clone();
            apply(&mut next, &op);
            models.push(next);
            spans.push((start, log.position()));
        }
        disk.into_volume().simulate_crash();
        let events = log.events();
        let mut replay = Replay::new(FAST_BYTES, SSD_BYTES);
        let crash_points = events.iter().enumerate().filter(|(_, e)| e.is_persistence_point()).map(|(i, _)| i).chain([events.len()]);
        for point in crash_points.filter(|&p| p >= setup_end) {
            while replay.position() < point {
                replay.apply(&events[replay.position()]);
            }
            let acked = spans.iter().take_while(|(_, end)| *end <= point).count();
            let in_flight = spans.get(acked).is_some_and(|(start, _)| *start < point);
            let (before, after) = (&models[acked], &models[acked + usize::from(in_flight)]);
            points += 1;
            for &survival in &survivals {
                let image = replay.image(survival, &mut |p| rng.random_bool(p));
                let fast = Arc::new(PmemRegion::anonymous(FAST_BYTES).unwrap());
                fast.write(0, &image.fast);
                let ssd: Arc<dyn BlockDevice> = Arc::new(SimSsd::with_contents(image.ssd));
                let context = format!("round {round} (seed {seed}): crash before event {point}, {acked} ops acknowledged, in flight {in_flight}, {survival:?}");
                let disk =
                    BlockVolume::open(Devices::new(fast, ssd), options()).unwrap_or_else(|e| panic!("{context}: recovery failed: {e}"));
                assert_eq!(disk.volume().check(), [], "{context}");
                let mut seen = vec![0u8; VOLUME_BYTES as usize];
                disk.read(0, &mut seen).unwrap();
                if let Some(at) = (0..seen.len()).find(|&i| seen[i] != before[i] && seen[i] != after[i]) {
                    panic!(
                        "{context}: byte {at} is {:#x}, neither {:#x} (acknowledged) nor {:#x} (in flight)",
                        seen[at], before[at], after[at]
                    );
                }
                images += 1;
                disk.close().unwrap();
            }
        }
    }
    eprintln!("power loss, uhs block volume: {points} crash points, {images} images, all recovered and checked");
    assert!(images >= 100, "too few images ({images}) to mean much");
}
