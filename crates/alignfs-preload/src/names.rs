//! `unlink`, `rename`, `mkdir` and `rmdir`: calls that change names under the prefix.

use std::ffi::{c_char, c_int, c_uint};

use crate::route::{at_path, map_c_path, Target};
use crate::{int, real, with};
use libc::mode_t;

// --- names -----------------------------------------------------------------------------

/// # Safety
/// libc's contract for `unlink`.
#[no_mangle]
pub unsafe extern "C" fn unlink(path: *const c_char) -> c_int {
    // SAFETY: `path` is a NUL-terminated path, by libc's contract for this call.
    match unsafe { map_c_path(path) } {
        Some(p) => int(with(|s| s.unlink(&p).map(|()| 0))),
        // SAFETY: the caller's arguments, unchanged, to libc's own `unlink`: it has the same contract as this function.
        None => unsafe { real!(unlink: fn(*const c_char) -> c_int)(path) },
    }
}

/// # Safety
/// libc's contract for `unlinkat`.
#[no_mangle]
pub unsafe extern "C" fn unlinkat(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int {
    // SAFETY: `path` is a NUL-terminated path, by libc's contract for this call.
    match unsafe { at_path(dirfd, path) } {
        Ok(Target::Ours(p)) if flags & libc::AT_REMOVEDIR != 0 => int(with(|s| s.rmdir(&p).map(|()| 0))),
        Ok(Target::Ours(p)) => int(with(|s| s.unlink(&p).map(|()| 0))),
        Err(e) => int(Err(e)),
        // SAFETY: the caller's arguments, unchanged, to libc's own `unlinkat`: it has the same contract as this function.
        Ok(Target::Real) => unsafe { real!(unlinkat: fn(c_int, *const c_char, c_int) -> c_int)(dirfd, path, flags) },
    }
}

/// Both names on the volume: a rename. Both elsewhere: libc's. One of each: EXDEV, as
/// between two file systems (`mv` then copies).
fn rename_between(from: Result<Target, c_int>, to: Result<Target, c_int>) -> Option<c_int> {
    match (from, to) {
        (Ok(Target::Ours(a)), Ok(Target::Ours(b))) => Some(int(with(|s| s.rename(&a, &b).map(|()| 0)))),
        (Ok(Target::Real), Ok(Target::Real)) => None,
        (Err(e), _) | (_, Err(e)) => Some(int(Err(e))),
        _ => Some(int(Err(libc::EXDEV))),
    }
}

/// # Safety
/// libc's contract for `rename`.
#[no_mangle]
pub unsafe extern "C" fn rename(from: *const c_char, to: *const c_char) -> c_int {
    // SAFETY: `from` and `to` are NUL-terminated paths, by libc's contract for this call.
    let (a, b) = unsafe { (at_path(libc::AT_FDCWD, from), at_path(libc::AT_FDCWD, to)) };
    // SAFETY: the caller's arguments, unchanged, to libc's own `rename`: it has the same contract as this function.
    rename_between(a, b).unwrap_or_else(|| unsafe { real!(rename: fn(*const c_char, *const c_char) -> c_int)(from, to) })
}

/// # Safety
/// libc's contract for `renameat`.
#[no_mangle]
pub unsafe extern "C" fn renameat(fromfd: c_int, from: *const c_char, tofd: c_int, to: *const c_char) -> c_int {
    // SAFETY: `from` is a NUL-terminated path, by libc's contract for this call.
    let (a, b) = unsafe { (at_path(fromfd, from), at_path(tofd, to)) };
    rename_between(a, b).unwrap_or_else(|| {
        // SAFETY: the caller's arguments, unchanged, to libc's own `renameat`: it has the same contract as this function.
        unsafe { real!(renameat: fn(c_int, *const c_char, c_int, *const c_char) -> c_int)(fromfd, from, tofd, to) }
    })
}

/// Flags other than 0 are refused (EINVAL) on our names.
///
/// # Safety
/// libc's contract for `renameat2`.
#[no_mangle]
pub unsafe extern "C" fn renameat2(fromfd: c_int, from: *const c_char, tofd: c_int, to: *const c_char, flags: c_uint) -> c_int {
    // SAFETY: `from` is a NUL-terminated path, by libc's contract for this call.
    let (a, b) = unsafe { (at_path(fromfd, from), at_path(tofd, to)) };
    if flags != 0 && matches!((&a, &b), (Ok(Target::Ours(_)), _) | (_, Ok(Target::Ours(_)))) {
        return int(Err(libc::EINVAL));
    }
    rename_between(a, b).unwrap_or_else(|| {
        // SAFETY: the caller's arguments, unchanged, to libc's own `renameat2`: it has the same contract as this function.
        unsafe { real!(renameat2: fn(c_int, *const c_char, c_int, *const c_char, c_uint) -> c_int)(fromfd, from, tofd, to, flags) }
    })
}

/// # Safety
/// libc's contract for `mkdir`.
#[no_mangle]
pub unsafe extern "C" fn mkdir(path: *const c_char, mode: mode_t) -> c_int {
    // SAFETY: `path` is a NUL-terminated path, by libc's contract for this call.
    match unsafe { map_c_path(path) } {
        Some(p) => int(with(|s| s.mkdir(&p, mode).map(|()| 0))),
        // SAFETY: the caller's arguments, unchanged, to libc's own `mkdir`: it has the same contract as this function.
        None => unsafe { real!(mkdir: fn(*const c_char, mode_t) -> c_int)(path, mode) },
    }
}

/// # Safety
/// libc's contract for `mkdirat`.
#[no_mangle]
pub unsafe extern "C" fn mkdirat(dirfd: c_int, path: *const c_char, mode: mode_t) -> c_int {
    // SAFETY: `path` is a NUL-terminated path, by libc's contract for this call.
    match unsafe { at_path(dirfd, path) } {
        Ok(Target::Ours(p)) => int(with(|s| s.mkdir(&p, mode).map(|()| 0))),
        Err(e) => int(Err(e)),
        // SAFETY: the caller's arguments, unchanged, to libc's own `mkdirat`: it has the same contract as this function.
        Ok(Target::Real) => unsafe { real!(mkdirat: fn(c_int, *const c_char, mode_t) -> c_int)(dirfd, path, mode) },
    }
}

/// # Safety
/// libc's contract for `rmdir`.
#[no_mangle]
pub unsafe extern "C" fn rmdir(path: *const c_char) -> c_int {
    // SAFETY: `path` is a NUL-terminated path, by libc's contract for this call.
    match unsafe { map_c_path(path) } {
        Some(p) => int(with(|s| s.rmdir(&p).map(|()| 0))),
        // SAFETY: the caller's arguments, unchanged, to libc's own `rmdir`: it has the same contract as this function.
        None => unsafe { real!(rmdir: fn(*const c_char) -> c_int)(path) },
    }
}
