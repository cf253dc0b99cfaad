//! Formatting and opening real files of every device kind.

use std::path::Path;

use super::*;
use crate::error::Error;
use crate::options::{FormatOptions, VolumeOptions};
use crate::volume::Volume;

#[test]
fn device_specs() {
    assert_eq!(DeviceSpec::parse("/dev/shm/f:1G").unwrap(), DeviceSpec { path: "/dev/shm/f".into(), size: Some(1 << 30) });
    assert_eq!(DeviceSpec::parse("/a/b").unwrap(), DeviceSpec { path: "/a/b".into(), size: None });
    assert_eq!(DeviceSpec::parse("/a:b").unwrap(), DeviceSpec { path: "/a:b".into(), size: None });
    assert!(DeviceSpec::parse(":1G").is_err());
    assert!(matches!(DeviceSpec::parse("x.img:8Q"), Err(Error::InvalidArgument(m)) if m.contains("8Q")));
    assert_eq!(DeviceSpec::parse("/a:b1").unwrap().path, Path::new("/a:b1"));
    assert!(DeviceSpec::parse("").is_err());
}

/// A 2 MiB fast tier on tmpfs and an 8 MiB SSD image, in directories removed on drop.
fn scratch_devices() -> (tempfile::TempDir, tempfile::TempDir, DeviceSpec, DeviceSpec) {
    let dir = tempfile::tempdir().unwrap();
    let shm = tempfile::tempdir_in("/dev/shm").unwrap();
    let fast = DeviceSpec { path: shm.path().join("fast"), size: Some(2 << 20) };
    let ssd = DeviceSpec { path: dir.path().join("ssd.img"), size: Some(8 << 20) };
    (dir, shm, fast, ssd)
}

#[test]
fn format_and_open_real_files() {
    let (dir, _shm, fast, ssd) = scratch_devices();
    let (superblock, volume) = format_paths(Some(&fast), std::slice::from_ref(&ssd), None, &FormatOptions::default(), None).unwrap();
    let f = volume.create_file(crate::Ino::ROOT, b"f", 0o644, 0, 0).unwrap().ino;
    let data: Vec<u8> = (0..300_000u32).map(|i| (i % 253) as u8).collect();
    volume.write(f, 1234, &data).unwrap();
    volume.fsync(f).unwrap();
    volume.close().unwrap();
    for mode in [crate::ReadMode::Direct, crate::ReadMode::Buffered] {
        let volume = open_paths(&fast.path, &ssd.path, VolumeOptions { read_mode: mode, ..VolumeOptions::default() }, None).unwrap();
        assert_eq!(volume.superblock().uuid, superblock.uuid);
        let mut out = vec![0u8; data.len()];
        assert_eq!(volume.read(f, 1234, &mut out).unwrap(), data.len());
        assert!(out == data);
    }
    // Formatting again without force names the existing volume.
    assert!(matches!(
        format_paths(Some(&fast), std::slice::from_ref(&ssd), None, &FormatOptions::default(), None),
        Err(Error::AlreadyFormatted { .. })
    ));
    assert!(matches!(open_paths(&dir.path().join("missing"), &ssd.path, VolumeOptions::default(), None), Err(Error::BadPath(..))));
}

/// A reader that keeps what it reads (a mount's page cache) gets the same bytes without
/// the SSD image's pages staying in the host's cache; an ordinary buffered read leaves them.
#[test]
fn reads_kept_by_their_reader_bypass_the_host_cache_of_the_ssd() {
    let (_dir, _shm, fast, ssd) = scratch_devices();
    let (_, volume) = format_paths(Some(&fast), std::slice::from_ref(&ssd), None, &FormatOptions::default(), None).unwrap();
    let f = volume.create_file(crate::Ino::ROOT, b"f", 0o644, 0, 0).unwrap().ino;
    // Whole SSD blocks with unaligned residue at both ends.
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 241) as u8).collect();
    volume.write(f, 999, &data).unwrap();
    volume.fsync(f).unwrap();
    let image = std::fs::File::open(&ssd.path).unwrap();
    rustix::fs::fadvise(&image, 0, None, rustix::fs::Advice::DontNeed).unwrap();
    let mut kept = vec![0u8; data.len()];
    assert_eq!(volume.read_kept_by_reader(f, 999, &mut kept).unwrap(), data.len());
    assert!(kept == data);
    let Some(after_kept) = volume.report().ssd_cached_bytes else { return }; // kernel before 6.5
    let mut read = vec![0u8; data.len()];
    assert_eq!(volume.read(f, 999, &mut read).unwrap(), data.len());
    assert!(read == data);
    let after_read = volume.report().ssd_cached_bytes.unwrap();
    assert!(
        after_kept < 1 << 20 && after_read >= 2 << 20,
        "cached after the kept read: {after_kept}, after the buffered one: {after_read}"
    );
}

#[test]
fn scrap_volume_on_an_ssd_alone() {
    let (dir, _shm, fast, _) = scratch_devices();
    let ssd = DeviceSpec { path: dir.path().join("scrap.img"), size: Some(16 << 20) };
    let geometry = crate::Profile::SCRAP.default_geometry();
    let options = FormatOptions { geometry, profile: crate::Profile::SCRAP, force: false, ..Default::default() };
    assert!(matches!(format_paths(Some(&fast), std::slice::from_ref(&ssd), None, &options, None), Err(Error::WrongDevices(_))));
    let (superblock, volume) = format_paths(None, std::slice::from_ref(&ssd), None, &options, None).unwrap();
    let f = volume.create_file(crate::Ino::ROOT, b"f", 0o644, 0, 0).unwrap().ino;
    let data: Vec<u8> = (0..700_000u32).map(|i| (i % 251) as u8).collect();
    volume.write(f, 777, &data).unwrap();
    volume.close().unwrap();
    assert_eq!(ssd_superblock(&ssd.path).unwrap().map(|sb| sb.uuid), Some(superblock.uuid));
    // The fast-tier path is not used (nor created) for a scrap volume.
    let volume = open_paths(&dir.path().join("no-fast-tier"), &ssd.path, VolumeOptions::default(), None).unwrap();
    let mut out = vec![0u8; data.len()];
    assert_eq!(volume.read(f, 777, &mut out).unwrap(), data.len());
    assert!(out == data);
    assert!(volume.recovery().clean);
}

#[test]
fn byte_volume_on_a_memory_semantic_ssd() {
    let (dir, shm, _, _) = scratch_devices();
    let ssd = DeviceSpec { path: dir.path().join("flash.img"), size: Some(16 << 20) };
    let dram = DeviceSpec { path: shm.path().join("dram"), size: None };
    let options = FormatOptions {
        geometry: crate::Profile::BYTE.default_geometry(),
        profile: crate::Profile::BYTE,
        force: false,
        ..Default::default()
    };
    assert!(matches!(format_paths(None, std::slice::from_ref(&ssd), None, &options, None), Err(Error::WrongDevices(_))));
    let (superblock, volume) = format_paths(Some(&dram), std::slice::from_ref(&ssd), None, &options, None).unwrap();
    let f = volume.create_file(crate::Ino::ROOT, b"f", 0o644, 0, 0).unwrap().ino;
    let data: Vec<u8> = (0..70_000u32).map(|i| (i % 249) as u8).collect();
    volume.write(f, 100, &data).unwrap();
    volume.write(f, 5, b"small").unwrap();
    let payload = |volume: &Volume| volume.device_counters().iter().find(|c| c.name == "byte_store_payload").unwrap().value;
    let byte_stores = payload(&volume);
    assert!(byte_stores >= 5 + 100, "residue and the small write went through the byte interface ({byte_stores})");
    // A new file's first 100 bytes cost their own lines and a journal record, not a
    // page of zeros around them.
    let g = volume.create_file(crate::Ino::ROOT, b"g", 0o644, 0, 0).unwrap().ino;
    let before = payload(&volume);
    volume.write(g, 0, &[9; 100]).unwrap();
    let spent = payload(&volume) - before;
    assert!(spent < 512, "a 100-byte write to a new file stored {spent} bytes through the byte interface");
    volume.close().unwrap();
    let mut expected = vec![0u8; 100 + data.len()];
    expected[100..].copy_from_slice(&data);
    expected[5..10].copy_from_slice(b"small");
    for byte_interface in [false, true] {
        let options = VolumeOptions { byte_interface, ..VolumeOptions::default() };
        let volume = open_paths(&dram.path, &ssd.path, options, None).unwrap();
        assert_eq!(volume.superblock().uuid, superblock.uuid);
        let mut out = vec![0u8; expected.len()];
        assert_eq!(volume.read(f, 0, &mut out).unwrap(), expected.len());
        assert!(out == expected);
        volume.write(f, 3, b"xy").unwrap();
        expected[3..5].copy_from_slice(b"xy");
        volume.close().unwrap();
    }
    assert!(matches!(format_paths(Some(&dram), std::slice::from_ref(&ssd), None, &options, None), Err(Error::AlreadyFormatted { .. })));
}

/// A new `byte` volume on a 16 MiB flash image; the scratch directories live as
/// long as the first value.
fn format_byte() -> ((tempfile::TempDir, tempfile::TempDir), DeviceSpec, DeviceSpec, Volume) {
    let (dir, shm, _, _) = scratch_devices();
    let ssd = DeviceSpec { path: dir.path().join("flash.img"), size: Some(16 << 20) };
    let dram = DeviceSpec { path: shm.path().join("dram"), size: None };
    let options = FormatOptions {
        geometry: crate::Profile::BYTE.default_geometry(),
        profile: crate::Profile::BYTE,
        force: false,
        ..Default::default()
    };
    let (_, volume) = format_paths(Some(&dram), std::slice::from_ref(&ssd), None, &options, None).unwrap();
    ((dir, shm), dram, ssd, volume)
}

/// ByteFS's write-back by modified ratio: a page written back with at most 1/8 of its
/// 64-byte lines changed sends those lines through the byte interface and no block;
/// an unchanged page sends nothing; a page changed more goes whole through the block
/// interface. Block-only, every page goes whole.
#[test]
fn byte_writes_back_pages_by_their_modified_ratio() {
    let (_scratch, dram, ssd, volume) = format_byte();
    let f = volume.create_file(crate::Ino::ROOT, b"f", 0o644, 0, 0).unwrap().ino;
    let mut pages: Vec<u8> = (0..4 * 4096u32).map(|i| (i % 251) as u8).collect();
    volume.write(f, 0, &pages).unwrap();
    let device = |volume: &Volume, name: &str| volume.device_counters().iter().find(|c| c.name == name).unwrap().value;
    let counter = |volume: &Volume, c: crate::stats::Counter| volume.stats().get(c);
    let (blocks, stores) = (device(&volume, "block_write_bytes"), device(&volume, "byte_store_payload"));
    // Two lines of page 1 change (128 bytes), the other pages not at all.
    pages[4096 + 100] ^= 0xff;
    pages[4096 + 3000] ^= 0xff;
    volume.write_back(f, 0, &pages).unwrap();
    assert_eq!(device(&volume, "block_write_bytes"), blocks, "no block went through the block interface");
    let stored = device(&volume, "byte_store_payload") - stores;
    assert!((128..1024).contains(&stored), "the two changed lines and their records went as byte stores ({stored} bytes)");
    assert_eq!(counter(&volume, crate::stats::Counter::write_back_blocks_by_line), 1);
    assert_eq!(counter(&volume, crate::stats::Counter::write_back_blocks_unchanged), 3);
    // Half of page 2 changes: whole, through the block interface.
    pages[8192..8192 + 2048].fill(7);
    volume.write_back(f, 0, &pages).unwrap();
    assert!(device(&volume, "block_write_bytes") >= blocks + 4096, "a page changed more went whole");
    let mut out = vec![0u8; pages.len()];
    volume.read(f, 0, &mut out).unwrap();
    assert!(out == pages);
    // Past the largest file, or past the end of the offset space: refused, nothing written.
    assert!(matches!(volume.write_back(f, 1 << 60, &pages[..4096]), Err(Error::FileTooLarge)));
    assert!(matches!(volume.write_back(f, u64::MAX - 4095, &pages[..4096]), Err(Error::FileTooLarge)));
    assert_eq!(volume.getattr(f).unwrap().size, pages.len() as u64);
    volume.close().unwrap();
    // Block-only: the same write-back goes whole.
    let block_only = VolumeOptions { byte_interface: false, ..VolumeOptions::default() };
    let volume = open_paths(&dram.path, &ssd.path, block_only.clone(), None).unwrap();
    volume.read(f, 0, &mut out).unwrap();
    assert!(out == pages);
    pages[100] ^= 0xff;
    let blocks = device(&volume, "block_write_bytes");
    volume.write_back(f, 0, &pages).unwrap();
    assert!(device(&volume, "block_write_bytes") >= blocks + 4 * 4096, "block-only writes back every page whole");
    volume.close().unwrap();
    let volume = open_paths(&dram.path, &ssd.path, VolumeOptions::default(), None).unwrap();
    volume.read(f, 0, &mut out).unwrap();
    assert!(out == pages, "read back after reopening");
    assert!(volume.check().is_empty());
}

/// The volume names its metadata area to the device, so the device's flash counters
/// split metadata from data: block-only, a create's metadata sectors are programmed in
/// place, and whole data blocks land outside the area.
#[test]
fn byte_device_counts_its_metadata_area_apart() {
    let (_scratch, dram, ssd, volume) = format_byte();
    volume.close().unwrap();
    let block_only = VolumeOptions { byte_interface: false, ..VolumeOptions::default() };
    let volume = open_paths(&dram.path, &ssd.path, block_only, None).unwrap();
    let device = |name: &str| volume.device_counters().iter().find(|c| c.name == name).unwrap().value;
    let (programs, metadata) = (device("flash_program_bytes"), device("flash_program_metadata_bytes"));
    let f = volume.create_file(crate::Ino::ROOT, b"f", 0o644, 0, 0).unwrap().ino;
    let after_create = device("flash_program_metadata_bytes");
    assert!(after_create > metadata, "the create's metadata sectors count as metadata");
    let data = vec![7u8; 1 << 20];
    volume.write(f, 0, &data).unwrap();
    let data_programs = (device("flash_program_bytes") - programs) - (device("flash_program_metadata_bytes") - metadata);
    assert!(data_programs >= data.len() as u64, "whole data blocks count as data ({data_programs} bytes)");
    volume.close().unwrap();
}

/// A `byte` volume keeps the blocks and residue units it read or wrote in DRAM, as the
/// host's cache of a device no kernel cache stands in front of: a second read of a
/// block asks the device for nothing, every write (whole blocks, residue, truncation)
/// is seen at once, and dropping the copies sends reads to the device again.
/// Block-only too.
#[test]
fn byte_reads_again_from_the_hosts_cache() {
    let (_scratch, dram, ssd, volume) = format_byte();
    let device = |volume: &Volume| volume.device_counters().iter().find(|c| c.name == "block_read_bytes").unwrap().value;
    let loads = |volume: &Volume| volume.device_counters().iter().find(|c| c.name == "byte_load_bytes").unwrap().value;
    let hits = |volume: &Volume| volume.stats().get(crate::stats::Counter::clean_page_hits);
    let read_all = |volume: &Volume, f: crate::Ino, len: usize| {
        let mut out = vec![0u8; len];
        assert_eq!(volume.read(f, 0, &mut out).unwrap(), len);
        out
    };
    let f = volume.create_file(crate::Ino::ROOT, b"f", 0o644, 0, 0).unwrap().ino;
    let mut expected: Vec<u8> = (0..4 * 4096u32).map(|i| (i % 251) as u8).collect();
    volume.write(f, 0, &expected).unwrap();
    volume.drop_clean_pages();
    let before = device(&volume);
    assert!(read_all(&volume, f, expected.len()) == expected);
    assert!(device(&volume) >= before + 4 * 4096, "the first read went to the device");
    let (before, hits_before) = (device(&volume), hits(&volume));
    assert!(read_all(&volume, f, expected.len()) == expected);
    assert_eq!(device(&volume), before, "the second read asked the device for nothing");
    assert_eq!(hits(&volume), hits_before + 4);
    // A whole block, a small write into another (byte-interface residue) and a
    // truncation that cuts the last block: each read back at once.
    expected[4096..8192].fill(9);
    volume.write(f, 4096, &[9; 4096]).unwrap();
    expected[9000..9100].fill(3);
    volume.write(f, 9000, &[3; 100]).unwrap();
    let loads_before = loads(&volume);
    assert!(read_all(&volume, f, expected.len()) == expected);
    volume.truncate(f, 14000).unwrap();
    volume.truncate(f, expected.len() as u64).unwrap();
    expected[14000..].fill(0);
    assert!(read_all(&volume, f, expected.len()) == expected);
    // Residue larger than loads would fetch: 2,000 bytes of a partial block.
    expected[12388..14388].fill(4);
    volume.write(f, 12388, &[4; 2000]).unwrap();
    assert!(read_all(&volume, f, expected.len()) == expected);
    assert_eq!(device(&volume), before, "writes leave their blocks' and units' copies current");
    assert_eq!(loads(&volume), loads_before, "residue the host wrote is read from its copy");
    volume.drop_clean_pages();
    assert!(read_all(&volume, f, expected.len()) == expected);
    assert!(device(&volume) >= before + 5 * 4096, "dropped copies (four blocks, a unit) are read from the device again");
    let before = device(&volume);
    assert!(read_all(&volume, f, expected.len()) == expected);
    assert_eq!(device(&volume), before, "and kept again");
    volume.close().unwrap();
    let block_only = VolumeOptions { byte_interface: false, ..VolumeOptions::default() };
    let volume = open_paths(&dram.path, &ssd.path, block_only, None).unwrap();
    assert!(read_all(&volume, f, expected.len()) == expected);
    let before = device(&volume);
    assert!(read_all(&volume, f, expected.len()) == expected);
    assert_eq!(device(&volume), before, "block-only reads again from the host's cache too");
    volume.close().unwrap();
    // None kept (`--clean-cache 0`): every read goes to the device.
    let no_cache = VolumeOptions { clean_cache_bytes: 0, ..VolumeOptions::default() };
    let volume = open_paths(&dram.path, &ssd.path, no_cache, None).unwrap();
    assert!(read_all(&volume, f, expected.len()) == expected);
    let (before, hits_before) = (device(&volume), hits(&volume));
    assert!(read_all(&volume, f, expected.len()) == expected);
    assert!(device(&volume) >= before + 3 * 4096, "without copies the second read went to the device");
    assert_eq!(hits(&volume), hits_before);
    volume.close().unwrap();
}

#[test]
fn one_writer_or_many_readers() {
    let (_dir, _shm, fast, ssd) = scratch_devices();
    let (_, formatted) = format_paths(Some(&fast), std::slice::from_ref(&ssd), None, &FormatOptions::default(), None).unwrap();
    assert!(matches!(
        format_paths(Some(&fast), std::slice::from_ref(&ssd), None, &FormatOptions { force: true, ..FormatOptions::default() }, None),
        Err(Error::InUse { .. })
    ));
    formatted.close().unwrap();
    let reader = VolumeOptions { read_only: true, ..VolumeOptions::default() };
    let writer = open_paths(&fast.path, &ssd.path, VolumeOptions::default(), None).unwrap();
    assert!(matches!(open_paths(&fast.path, &ssd.path, VolumeOptions::default(), None), Err(Error::InUse { .. })));
    assert!(matches!(open_paths(&fast.path, &ssd.path, reader.clone(), None), Err(Error::InUse { .. })));
    writer.close().unwrap();
    let a = open_paths(&fast.path, &ssd.path, reader.clone(), None).unwrap();
    let b = open_paths(&fast.path, &ssd.path, reader, None).unwrap();
    assert!(matches!(open_paths(&fast.path, &ssd.path, VolumeOptions::default(), None), Err(Error::InUse { .. })));
    drop((a, b));
    open_paths(&fast.path, &ssd.path, VolumeOptions::default(), None).unwrap().close().unwrap();
}
