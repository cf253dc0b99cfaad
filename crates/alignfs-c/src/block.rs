//! The block-volume half of the C API (`alignfs_block_*`): a `uhs` volume (or any block
//! volume `alignfs mkfs --size` made) read and written at byte offsets in-process, the
//! same volume `alignfs nbd` serves, without the protocol round trip.

use std::ffi::{c_char, c_int};
use std::path::{Path, PathBuf};

use alignfs::paths::open_block_paths;
use alignfs::personality::BlockVolume;
use alignfs::VolumeOptions;

use crate::{call, call_int, fault, in_buffer, out_buffer, text};

/// An open block volume, as C sees it.
pub struct AlignfsBlock(BlockVolume);

/// `alignfs_block_open` flag: refuse writes and trims (`-EROFS`).
pub const BLOCK_READ_ONLY: c_int = 1;

/// # Safety
/// `b` is null or a pointer returned by `alignfs_block_open` and not yet closed.
unsafe fn block<'a>(b: *const AlignfsBlock) -> alignfs::Result<&'a BlockVolume> {
    // SAFETY: the caller promises a live block handle or null.
    unsafe { b.as_ref() }.map(|b| &b.0).ok_or_else(|| fault("block"))
}

macro_rules! on_block {
    ($b:expr, |$v:ident| $body:expr) => {
        call(|| {
            // SAFETY: the caller passes a live block handle or null (checked).
            let $v = unsafe { block($b) }?;
            $body
        })
    };
}

/// Open the block volume on these devices. `flags` is 0 or `ALIGNFS_BLOCK_READ_ONLY`.
///
/// # Safety
/// `fast` and `ssd` are NUL-terminated paths; `out` points to writable storage.
#[no_mangle]
pub unsafe extern "C" fn alignfs_block_open(fast: *const c_char, ssd: *const c_char, flags: c_int, out: *mut *mut AlignfsBlock) -> c_int {
    call_int(|| {
        // SAFETY: forwarded from this function's contract.
        let (fast, ssd) = unsafe { (text(fast, "fast")?, text(ssd, "ssd")?) };
        if out.is_null() {
            return Err(fault("out"));
        }
        if flags & !BLOCK_READ_ONLY != 0 {
            return Err(alignfs::Error::InvalidArgument(format!("unknown flags {flags:#x}")));
        }
        let options = VolumeOptions { read_only: flags & BLOCK_READ_ONLY != 0, ..VolumeOptions::default() };
        let volume = open_block_paths(Path::new(fast), &[PathBuf::from(ssd)], options, None)?;
        // SAFETY: `out` is non-null and writable (contract).
        unsafe { *out = Box::into_raw(Box::new(AlignfsBlock(volume))) };
        Ok(0)
    })
}

/// Flush and close. The handle is gone afterwards, even on error.
///
/// # Safety
/// `volume` came from `alignfs_block_open` and is not used after this call.
#[no_mangle]
pub unsafe extern "C" fn alignfs_block_close(volume: *mut AlignfsBlock) -> c_int {
    if volume.is_null() {
        return call_int(|| Err(fault("block")));
    }
    // SAFETY: the pointer came from Box::into_raw in alignfs_block_open (contract).
    let volume = unsafe { Box::from_raw(volume) };
    call_int(|| volume.0.close().map(|()| 0))
}

/// The volume's size in bytes.
///
/// # Safety
/// `volume` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn alignfs_block_size(volume: *const AlignfsBlock) -> i64 {
    on_block!(volume, |v| i64::try_from(v.size()).map_err(|_| alignfs::Error::FileTooLarge))
}

/// The logical sector size (512 or 4096) the volume was formatted with: what `alignfs nbd`
/// advertises as its minimum block size.
///
/// # Safety
/// `volume` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn alignfs_block_sector_size(volume: *const AlignfsBlock) -> c_int {
    on_block!(volume, |v| Ok(i64::from(v.layout().sector_bytes))) as c_int
}

/// Read `len` bytes at `offset`, all of them or none (`-EINVAL` past the end).
///
/// # Safety
/// `volume` is a live handle; `buf` holds `len` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn alignfs_block_read(volume: *const AlignfsBlock, buf: *mut libc::c_void, len: usize, offset: u64) -> c_int {
    on_block!(volume, |v| {
        // SAFETY: `buf` is null only when `len` is 0, else holds `len` writable bytes, by the C API's contract for this call (alignfs.h).
        let buf = unsafe { out_buffer(buf, len) }?;
        v.read(offset, buf).map(|()| 0)
    }) as c_int
}

/// Write `len` bytes at `offset`, durable as the profile promises (a `uhs` volume: on
/// return).
///
/// # Safety
/// `volume` is a live handle; `buf` holds `len` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn alignfs_block_write(volume: *const AlignfsBlock, buf: *const libc::c_void, len: usize, offset: u64) -> c_int {
    on_block!(volume, |v| {
        // SAFETY: `buf` is null only when `len` is 0, else holds `len` readable bytes, by the C API's contract for this call (alignfs.h).
        let data = unsafe { in_buffer(buf, len) }?;
        v.write(offset, data).map(|()| 0)
    }) as c_int
}

/// Make every write that returned durable.
///
/// # Safety
/// `volume` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn alignfs_block_flush(volume: *const AlignfsBlock) -> c_int {
    on_block!(volume, |v| v.flush().map(|()| 0)) as c_int
}

/// Drop a range: it reads as zeros and its whole blocks are freed.
///
/// # Safety
/// `volume` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn alignfs_block_trim(volume: *const AlignfsBlock, offset: u64, len: u64) -> c_int {
    on_block!(volume, |v| v.trim(offset, len).map(|()| 0)) as c_int
}
