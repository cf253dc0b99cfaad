#![allow(clippy::unwrap_used)]
//! Corrupt or mismatched media: every failure is a clear error naming the structure, never
//! a panic, and a failed open writes nothing.

mod common;

use alignfs::device::{BlockDevice, PmemRegion, SimSsd};
use alignfs::test_support::seed;
use alignfs::{Error, FormatOptions, Geometry, Ino, Volume, VolumeOptions};
use common::Devices;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::Arc;

fn populated() -> Devices {
    let devices = Devices::new(4 << 20, 16 << 20);
    devices.format(Geometry::default());
    let volume = devices.open(VolumeOptions::default()).unwrap();
    for i in 0..5 {
        let f = volume.create_file(Ino::ROOT, format!("f{i}").as_bytes(), 0o644, 0, 0).unwrap().ino;
        volume.write(f, 0, &vec![i as u8; 50_000 + i * 1000]).unwrap();
    }
    volume.checkpoint().unwrap();
    for i in 0..5 {
        volume.write(Ino(2 + i), 10, b"after the checkpoint").unwrap();
    }
    volume.simulate_crash();
    devices
}

/// Open must fail with a `Corrupt` error for `structure`, and leave both devices untouched.
fn expect_refusal(devices: &Devices, structure: &str) {
    let fast_before = devices.fast_bytes();
    let ssd_before = devices.ssd.peek(0, 16 << 20);
    match devices.open(VolumeOptions::default()) {
        Err(Error::Corrupt { structure: s, .. }) if s == structure => {}
        Err(other) => panic!("expected a {structure} error, got {other}"),
        Ok(_) => panic!("expected a {structure} error, the volume opened"),
    }
    assert!(devices.fast_bytes() == fast_before, "a refused open wrote to the fast tier");
    assert!(devices.ssd.peek(0, 16 << 20) == ssd_before, "a refused open wrote to the SSD");
}

#[test]
fn damaged_superblocks_are_refused() {
    let devices = populated();
    devices.fast.write(40, &[0xff]);
    expect_refusal(&devices, "superblock");
    let devices = populated();
    devices.ssd.poke(60, &[0xff]);
    expect_refusal(&devices, "superblock");
}

#[test]
fn damaged_checkpoint_is_refused() {
    let devices = populated();
    let sb = Volume::open(devices.devices(), VolumeOptions { read_only: true, ..VolumeOptions::default() }).unwrap().superblock().clone();
    // Both slots' headers destroyed.
    devices.fast.write(sb.layout.checkpoint_a_offset, &[0u8; 64]);
    devices.fast.write(sb.layout.checkpoint_b_offset, &[0u8; 64]);
    expect_refusal(&devices, "checkpoint");
}

#[test]
fn damaged_journal_middle_is_refused() {
    let devices = populated();
    let layout = devices.open(VolumeOptions { read_only: true, ..VolumeOptions::default() }).unwrap().superblock().layout;
    // The second record's payload.
    let mut header = [0u8; 24];
    devices.fast.read(layout.journal_offset, &mut header);
    let first_len = u32::from_le_bytes(header[12..16].try_into().unwrap()) as u64;
    let second = layout.journal_offset + (24 + first_len).div_ceil(8) * 8;
    devices.fast.write(second + 30, &[0x55; 4]);
    expect_refusal(&devices, "journal record");
}

#[test]
fn torn_journal_tail_is_dropped() {
    let devices = populated();
    let volume = devices.open(VolumeOptions { read_only: true, ..VolumeOptions::default() }).unwrap();
    let (layout, records) = (volume.superblock().layout, volume.recovery().records_replayed);
    drop(volume);
    // Walk to the last record and tear its payload, as a crash mid-append would.
    let mut at = layout.journal_offset;
    let mut last = at;
    for _ in 0..records {
        let mut header = [0u8; 24];
        devices.fast.read(at, &mut header);
        last = at;
        at += (24 + u64::from(u32::from_le_bytes(header[12..16].try_into().unwrap()))).div_ceil(8) * 8;
    }
    devices.fast.write(last + 26, &[0xAB; 2]);
    let volume = devices.open(VolumeOptions::default()).unwrap();
    assert!(volume.recovery().torn_tail_dropped);
    assert_eq!(volume.recovery().records_replayed, records - 1);
}

#[test]
fn random_damage_never_panics() {
    let mut rng = StdRng::seed_from_u64(seed("bad_input::random_damage_never_panics"));
    let devices = populated();
    let pristine = devices.fast_bytes();
    let layout = devices.open(VolumeOptions { read_only: true, ..VolumeOptions::default() }).unwrap().superblock().layout;
    let metadata_end = layout.pages_offset as usize;
    for _ in 0..300 {
        devices.fast.write(0, &pristine);
        for _ in 0..rng.random_range(1..8) {
            let at = rng.random_range(0..metadata_end.min(layout.journal_offset as usize + 4096));
            devices.fast.write(at as u64, &[rng.random()]);
        }
        // Any outcome but a panic is acceptable; a success must still be usable.
        if let Ok(volume) = devices.open(VolumeOptions { read_only: true, ..VolumeOptions::default() }) {
            for entry in volume.readdir(Ino::ROOT).unwrap() {
                let mut buf = vec![0u8; 70_000];
                let _ = volume.read(entry.ino, 0, &mut buf);
            }
        }
    }
}

#[test]
fn mismatched_swapped_and_unformatted_devices() {
    let a = Devices::new(4 << 20, 16 << 20);
    let b = Devices::new(4 << 20, 16 << 20);
    a.format(Geometry::default());
    b.format(Geometry::default());
    let mixed = Volume::open(alignfs::Devices::new(a.fast.clone(), Arc::clone(&b.ssd) as Arc<dyn BlockDevice>), VolumeOptions::default());
    assert!(matches!(mixed, Err(Error::VolumeMismatch { .. })));
    let blank = Devices::new(4 << 20, 16 << 20);
    assert!(matches!(blank.open(VolumeOptions::default()), Err(Error::NotFormatted(_))));
    // Format refuses to overwrite a volume without force, and names it.
    let again = Volume::format(&a.devices(), &FormatOptions::default());
    assert!(matches!(again, Err(Error::AlreadyFormatted { .. })), "{again:?}");
    Volume::format(&a.devices(), &FormatOptions { force: true, ..FormatOptions::default() }).unwrap();
    // Too small to hold a volume.
    let tiny_fast = Arc::new(PmemRegion::anonymous(64 << 10).unwrap());
    let tiny = alignfs::Devices::new(tiny_fast, Arc::new(SimSsd::new(1 << 20)));
    assert!(matches!(Volume::format(&tiny, &FormatOptions::default()), Err(Error::Geometry(_))));
}

#[test]
fn read_only_open_refuses_changes() {
    let devices = populated();
    let volume = devices.open(VolumeOptions { read_only: true, ..VolumeOptions::default() }).unwrap();
    assert!(volume.recovery().records_replayed > 0);
    assert!(matches!(volume.write(Ino(2), 0, b"x"), Err(Error::ReadOnly)));
    assert!(matches!(volume.create_file(Ino::ROOT, b"new", 0o644, 0, 0), Err(Error::ReadOnly)));
}
