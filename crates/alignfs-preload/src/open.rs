//! `open`, `openat`, `creat` and `close`: paths under the prefix open engine files.

use std::ffi::{c_char, c_int};

use crate::route::{at_path, is_ours, map_c_path, Target};
use crate::{int, real, with};
use libc::mode_t;

// --- open and close --------------------------------------------------------------------

fn open_ours(path: &str, flags: c_int, mode: mode_t) -> c_int {
    int(with(|s| s.open_file(path, flags, mode).map(i64::from)))
}

/// # Safety
/// libc's contract for `open`.
#[no_mangle]
pub unsafe extern "C" fn open(path: *const c_char, flags: c_int, mode: mode_t) -> c_int {
    // SAFETY: `path` is a NUL-terminated path, by libc's contract for this call.
    match unsafe { map_c_path(path) } {
        Some(p) => open_ours(&p, flags, mode),
        // SAFETY: the caller's arguments, unchanged, to libc's own `open`: it has the same contract as this function.
        None => unsafe { real!(open: fn(*const c_char, c_int, mode_t) -> c_int)(path, flags, mode) },
    }
}

/// # Safety
/// libc's contract for `open64`.
#[no_mangle]
pub unsafe extern "C" fn open64(path: *const c_char, flags: c_int, mode: mode_t) -> c_int {
    // SAFETY: `path` is a NUL-terminated path, by libc's contract for this call.
    match unsafe { map_c_path(path) } {
        Some(p) => open_ours(&p, flags, mode),
        // SAFETY: the caller's arguments, unchanged, to libc's own `open64`: it has the same contract as this function.
        None => unsafe { real!(open64: fn(*const c_char, c_int, mode_t) -> c_int)(path, flags, mode) },
    }
}

/// The fortified `open` (`_FORTIFY_SOURCE`), without a mode.
///
/// # Safety
/// libc's contract for `__open_2`.
#[no_mangle]
pub unsafe extern "C" fn __open_2(path: *const c_char, flags: c_int) -> c_int {
    // SAFETY: `path` is a NUL-terminated path, by libc's contract for this call.
    match unsafe { map_c_path(path) } {
        Some(p) => open_ours(&p, flags, 0),
        // SAFETY: the caller's arguments, unchanged, to libc's own `__open_2`: it has the same contract as this function.
        None => unsafe { real!(__open_2: fn(*const c_char, c_int) -> c_int)(path, flags) },
    }
}

/// # Safety
/// libc's contract for `__open64_2`.
#[no_mangle]
pub unsafe extern "C" fn __open64_2(path: *const c_char, flags: c_int) -> c_int {
    // SAFETY: `path` is a NUL-terminated path, by libc's contract for this call.
    match unsafe { map_c_path(path) } {
        Some(p) => open_ours(&p, flags, 0),
        // SAFETY: the caller's arguments, unchanged, to libc's own `__open64_2`: it has the same contract as this function.
        None => unsafe { real!(__open64_2: fn(*const c_char, c_int) -> c_int)(path, flags) },
    }
}

/// # Safety
/// libc's contract for `openat`.
#[no_mangle]
pub unsafe extern "C" fn openat(dirfd: c_int, path: *const c_char, flags: c_int, mode: mode_t) -> c_int {
    // SAFETY: `path` is a NUL-terminated path, by libc's contract for this call.
    match unsafe { at_path(dirfd, path) } {
        Ok(Target::Ours(p)) => open_ours(&p, flags, mode),
        Err(e) => int(Err(e)),
        // SAFETY: the caller's arguments, unchanged, to libc's own `openat`: it has the same contract as this function.
        Ok(Target::Real) => unsafe { real!(openat: fn(c_int, *const c_char, c_int, mode_t) -> c_int)(dirfd, path, flags, mode) },
    }
}

/// # Safety
/// libc's contract for `openat64`.
#[no_mangle]
pub unsafe extern "C" fn openat64(dirfd: c_int, path: *const c_char, flags: c_int, mode: mode_t) -> c_int {
    // SAFETY: `path` is a NUL-terminated path, by libc's contract for this call.
    match unsafe { at_path(dirfd, path) } {
        Ok(Target::Ours(p)) => open_ours(&p, flags, mode),
        Err(e) => int(Err(e)),
        // SAFETY: the caller's arguments, unchanged, to libc's own `openat64`: it has the same contract as this function.
        Ok(Target::Real) => unsafe { real!(openat64: fn(c_int, *const c_char, c_int, mode_t) -> c_int)(dirfd, path, flags, mode) },
    }
}

/// # Safety
/// libc's contract for `creat`.
#[no_mangle]
pub unsafe extern "C" fn creat(path: *const c_char, mode: mode_t) -> c_int {
    // SAFETY: `creat` is `open` with these flags, under the same contract.
    unsafe { open(path, libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC, mode) }
}

/// # Safety
/// libc's contract for `creat64`.
#[no_mangle]
pub unsafe extern "C" fn creat64(path: *const c_char, mode: mode_t) -> c_int {
    // SAFETY: `creat` is `open` with these flags, under the same contract.
    unsafe { open64(path, libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC, mode) }
}

/// # Safety
/// libc's contract for `close`.
#[no_mangle]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    if is_ours(fd) {
        return int(with(|s| s.close_fd(fd).map(|()| 0)));
    }
    // SAFETY: the caller's arguments, unchanged, to libc's own `close`: it has the same contract as this function.
    unsafe { real!(close: fn(c_int) -> c_int)(fd) }
}
