#![allow(clippy::unwrap_used)]
//! A volume can be filled: its checkpoint, which holds every file's map, still fits its
//! slot when nearly every block is mapped. The slot on an SSD is sized per block
//! (`geometry::CHECKPOINT_BYTES_PER_BLOCK`); this measures what a block and a file cost.

mod common;

use alignfs::geometry::CHECKPOINT_BYTES_PER_BLOCK;
use alignfs::{Ino, Profile, VolumeOptions};

/// What a file's inode, name and attributes may cost in a checkpoint, beyond its blocks.
const BYTES_PER_FILE: u64 = 128;

#[test]
fn a_checkpoint_of_a_nearly_full_volume_fits_in_what_its_slot_allows_per_block() {
    let devices = common::Devices::ssd_only(Profile::BYTE, 64 << 20);
    devices.format(Profile::BYTE.default_geometry());
    let volume = devices.open(VolumeOptions { background: false, ..VolumeOptions::default() }).unwrap();
    let block = volume.stats().usage.ssd_block_bytes;
    let free = |v: &alignfs::Volume| v.stats().usage.ssd_blocks_total - v.stats().usage.ssd_blocks_used;
    let free_at_start = free(&volume);
    // Files of 1 to 64 blocks, written whole, until 95 % of the data blocks are mapped.
    let (mut files, mut k) = (0u64, 0u64);
    while free(&volume) > free_at_start / 20 + 64 {
        let blocks = 1 + (k * 37) % 64;
        let ino = volume.create_file(Ino::ROOT, format!("file-{k:05}").as_bytes(), 0o644, 0, 0).unwrap().ino;
        volume.write(ino, 0, &vec![(k % 251) as u8 + 1; (blocks * block) as usize]).unwrap();
        volume.migrate_all().unwrap();
        files += 1;
        k += 1;
    }
    volume.checkpoint().unwrap();
    let stats = volume.stats().usage;
    let mapped = free_at_start - free(&volume);
    let allowed = mapped * CHECKPOINT_BYTES_PER_BLOCK + files * BYTES_PER_FILE;
    eprintln!(
        "{files} files, {mapped} blocks mapped: checkpoint of {} bytes ({:.1} per block with files at {BYTES_PER_FILE})",
        stats.checkpoint_used_bytes,
        (stats.checkpoint_used_bytes.saturating_sub(files * BYTES_PER_FILE)) as f64 / mapped as f64
    );
    assert!(
        stats.checkpoint_used_bytes <= allowed,
        "checkpoint of {} bytes, more than the {allowed} its slot sizing assumes",
        stats.checkpoint_used_bytes
    );
    assert!(stats.checkpoint_used_bytes <= stats.checkpoint_capacity_bytes);
    // The state is whole after a reopen from that checkpoint.
    volume.close().unwrap();
    let volume = devices.open(VolumeOptions::default()).unwrap();
    assert!(volume.check().is_empty());
    let mut out = vec![0u8; block as usize];
    volume.read(volume.lookup(Ino::ROOT, b"file-00003").unwrap().ino, 0, &mut out).unwrap();
    assert!(out.iter().all(|&b| b == 4));
}

/// A `uhs` volume of 4 KiB blocks maps every block of its SSD: the fast tier's checkpoint
/// slots grow past `fast/16` to hold them. With `fast/16` alone (256 KiB here) the full
/// volume's checkpoint (about 18 bytes per block) overflowed its slot, and writes failed
/// with ENOSPC long before the SSD was full.
#[test]
fn a_full_uhs_volume_checkpoints_its_whole_map() {
    use alignfs::device::{BlockDevice, PmemRegion, SimSsd};
    use alignfs::personality::{BlockLayout, BlockVolume};
    use std::sync::Arc;

    let ssd = Arc::new(SimSsd::new(64 << 20)) as Arc<dyn BlockDevice>;
    let devices = alignfs::Devices::new(Arc::new(PmemRegion::anonymous(4 << 20).unwrap()), ssd);
    let format =
        alignfs::FormatOptions { geometry: Profile::UHS.default_geometry(), profile: Profile::UHS, force: false, ..Default::default() };
    let size = 60 << 20;
    BlockVolume::format(&devices, &format, BlockLayout::new(size)).unwrap();
    let options = VolumeOptions { background: false, ..VolumeOptions::default() };
    let disk = BlockVolume::open(devices.clone(), options.clone()).unwrap();
    let capacity = disk.volume().stats().usage.checkpoint_capacity_bytes;
    assert!(capacity > 256 << 10, "slots of {capacity} bytes did not grow");
    // Every block written, each by its own 4 KiB write (one map entry each).
    let chunk: Vec<u8> = (0..1u64 << 20).map(|i| (i % 253) as u8 + 1).collect();
    for offset in (0..size).step_by(chunk.len()) {
        disk.write(offset, &chunk).unwrap();
    }
    disk.volume().migrate_all().unwrap();
    disk.volume().checkpoint().unwrap();
    let used = disk.volume().stats().usage.checkpoint_used_bytes;
    let blocks = size / 4096;
    eprintln!("uhs: {blocks} blocks mapped, checkpoint of {used} bytes in slots of {capacity}");
    assert!(used > 256 << 10, "the map ({used} bytes) would not have fit the old slot: the test proves nothing");
    drop(disk);
    let disk = BlockVolume::open(devices, options).unwrap();
    let mut out = vec![0u8; chunk.len()];
    disk.read(size - chunk.len() as u64, &mut out).unwrap();
    assert!(out == chunk);
}
