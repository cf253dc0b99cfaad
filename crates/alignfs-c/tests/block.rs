#![allow(clippy::unwrap_used)]
//! The block half of the C API on a `uhs` volume with an NVM range: random writes, reads,
//! trims and flushes through the C functions against an in-memory model, across a
//! reopen; read-only opens; bad arguments; each kind of volume refused by the other
//! kind's open.

use std::ffi::CString;
use std::ptr;

use alignfs::paths::{format_block_paths, format_paths, DeviceSpec};
use alignfs::personality::BlockLayout;
use alignfs::test_support::seed;
use alignfs::{FormatOptions, Profile};
use alignfs_c::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const VOLUME_BYTES: u64 = 16 << 20;
/// Kept in the NVM zone: requests below cross its edge.
const NVM_RANGE: std::ops::Range<u64> = 0..(1 << 20);

struct Devices {
    _dirs: (tempfile::TempDir, tempfile::TempDir),
    fast: CString,
    ssd: CString,
}

fn devices(block: bool) -> Devices {
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let shm = tempfile::tempdir_in("/dev/shm").unwrap();
    let fast = DeviceSpec { path: shm.path().join("fast"), size: Some(8 << 20) };
    let ssd = DeviceSpec { path: dir.path().join("ssd.img"), size: Some(64 << 20) };
    let ssds = std::slice::from_ref(&ssd);
    if block {
        let format = FormatOptions { profile: Profile::UHS, geometry: Profile::UHS.default_geometry(), force: false, ..Default::default() };
        let layout = BlockLayout { nvm_ranges: vec![NVM_RANGE], ..BlockLayout::new(VOLUME_BYTES) };
        format_block_paths(Some(&fast), ssds, &format, layout, None).unwrap().1.close().unwrap();
    } else {
        format_paths(Some(&fast), ssds, None, &FormatOptions::default(), None).unwrap().1.close().unwrap();
    }
    let c = |p: &std::path::Path| CString::new(p.to_str().unwrap()).unwrap();
    Devices { fast: c(&fast.path), ssd: c(&ssd.path), _dirs: (dir, shm) }
}

fn open(d: &Devices, flags: i32) -> *mut AlignfsBlock {
    let mut volume = ptr::null_mut();
    // SAFETY: valid C strings and out pointer.
    let rc = unsafe { alignfs_block_open(d.fast.as_ptr(), d.ssd.as_ptr(), flags, &mut volume) };
    assert_eq!(rc, 0);
    volume
}

fn read_all(volume: *mut AlignfsBlock) -> Vec<u8> {
    let mut out = vec![0u8; VOLUME_BYTES as usize];
    // SAFETY: a live handle and a buffer of the length given.
    assert_eq!(unsafe { alignfs_block_read(volume, out.as_mut_ptr().cast(), out.len(), 0) }, 0);
    out
}

#[test]
fn random_block_operations_through_the_c_api_match_the_model() {
    let mut rng = StdRng::seed_from_u64(seed("alignfs-c block model"));
    let d = devices(true);
    let mut volume = open(&d, 0);
    // SAFETY: a live handle.
    unsafe {
        assert_eq!(alignfs_block_size(volume), VOLUME_BYTES as i64);
        assert_eq!(alignfs_block_sector_size(volume), 512);
    }
    let mut model = vec![0u8; VOLUME_BYTES as usize];
    for step in 0..400 {
        let len = if rng.random_bool(0.5) { rng.random_range(1..20_000) } else { 4096 * rng.random_range(1..64) };
        let offset = rng.random_range(0..VOLUME_BYTES - len);
        // SAFETY: a live handle; buffers of the lengths given.
        match rng.random_range(0..20) {
            0 => {
                assert_eq!(unsafe { alignfs_block_trim(volume, offset, len) }, 0);
                model[offset as usize..(offset + len) as usize].fill(0);
            }
            1 => assert_eq!(unsafe { alignfs_block_flush(volume) }, 0),
            2..=4 => {
                let mut out = vec![0u8; len as usize];
                assert_eq!(unsafe { alignfs_block_read(volume, out.as_mut_ptr().cast(), out.len(), offset) }, 0);
                assert!(out == model[offset as usize..(offset + len) as usize], "step {step}: read {len} at {offset}");
            }
            _ => {
                let data: Vec<u8> = (0..len).map(|_| rng.random()).collect();
                assert_eq!(unsafe { alignfs_block_write(volume, data.as_ptr().cast(), data.len(), offset) }, 0);
                model[offset as usize..(offset + len) as usize].copy_from_slice(&data);
            }
        }
        if step == 200 {
            // SAFETY: not used again before being replaced.
            assert_eq!(unsafe { alignfs_block_close(volume) }, 0);
            volume = open(&d, 0);
        }
    }
    assert!(read_all(volume) == model, "contents differ from the model");
    // SAFETY: not used afterwards.
    assert_eq!(unsafe { alignfs_block_close(volume) }, 0);

    let volume = open(&d, BLOCK_READ_ONLY);
    // SAFETY: a live handle; buffers of the lengths given.
    unsafe {
        assert_eq!(alignfs_block_write(volume, b"zone".as_ptr().cast(), 4, 0), -libc::EROFS);
        assert_eq!(alignfs_block_write(volume, b"ssd".as_ptr().cast(), 3, VOLUME_BYTES / 2), -libc::EROFS);
        assert_eq!(alignfs_block_trim(volume, 0, 4096), -libc::EROFS);
    }
    assert!(read_all(volume) == model, "a read-only open changed the contents");
    // SAFETY: not used afterwards.
    assert_eq!(unsafe { alignfs_block_close(volume) }, 0);
}

#[test]
fn bad_block_arguments_are_errors_not_crashes() {
    let d = devices(true);
    let mut other = ptr::null_mut();
    // SAFETY: each call passes what the contract allows (nulls included: checked).
    unsafe {
        assert_eq!(alignfs_block_open(d.fast.as_ptr(), d.ssd.as_ptr(), 0x10, &mut other), -libc::EINVAL);
        assert_eq!(alignfs_block_open(ptr::null(), d.ssd.as_ptr(), 0, &mut other), -libc::EFAULT);
        assert_eq!(alignfs_block_open(d.fast.as_ptr(), d.ssd.as_ptr(), 0, ptr::null_mut()), -libc::EFAULT);
        // A file-system open of a block volume names the block open.
        let mut files = ptr::null_mut();
        assert_eq!(alignfs_volume_open(d.fast.as_ptr(), d.ssd.as_ptr(), &mut files), -libc::EINVAL);
        let message = std::ffi::CStr::from_ptr(alignfs_last_error()).to_str().unwrap();
        assert!(message.contains("alignfs_block_open"), "{message}");

        let volume = open(&d, 0);
        assert_eq!(alignfs_block_open(d.fast.as_ptr(), d.ssd.as_ptr(), 0, &mut other), -libc::EBUSY);
        let mut byte = [0u8; 2];
        assert_eq!(alignfs_block_read(volume, byte.as_mut_ptr().cast(), 2, VOLUME_BYTES - 1), -libc::EINVAL);
        assert_eq!(alignfs_block_read(volume, byte.as_mut_ptr().cast(), 1, u64::MAX), -libc::EINVAL);
        assert_eq!(alignfs_block_write(volume, ptr::null(), 10, 0), -libc::EFAULT);
        assert_eq!(alignfs_block_write(volume, ptr::null(), 0, 0), 0);
        assert_eq!(alignfs_block_trim(volume, VOLUME_BYTES, 1), -libc::EINVAL);
        assert_eq!(alignfs_block_size(ptr::null()), -i64::from(libc::EFAULT));
        assert_eq!(alignfs_block_flush(ptr::null()), -libc::EFAULT);
        assert_eq!(alignfs_block_close(ptr::null_mut()), -libc::EFAULT);
        assert_eq!(alignfs_block_close(volume), 0);
    }

    // A block open of a file system says there is no block volume.
    let files = devices(false);
    let mut volume = ptr::null_mut();
    // SAFETY: valid C strings and out pointer.
    unsafe {
        assert_eq!(alignfs_block_open(files.fast.as_ptr(), files.ssd.as_ptr(), 0, &mut volume), -libc::EINVAL);
        let message = std::ffi::CStr::from_ptr(alignfs_last_error()).to_str().unwrap();
        assert!(message.contains("no block volume"), "{message}");
    }
}
