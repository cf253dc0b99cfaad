//! `fcntl`, `flock`, `dup` in its forms, and `mmap`, which our descriptors refuse.

use std::ffi::{c_int, c_void};

use crate::route::{is_ours, set_errno};
use crate::{int, real, with};
use libc::{off_t, size_t};

// --- descriptors -----------------------------------------------------------------------

/// On our descriptors: `F_GETFL`/`F_SETFL` (flags kept as opened), `F_GETFD`/`F_SETFD`
/// (close-on-exec is moot: our descriptors never reach a new program), `F_DUPFD*`, and
/// record locks, which succeed without locking (one process owns the volume; see
/// docs/PRELOAD.md). Anything else is EINVAL.
fn fcntl_ours(fd: c_int, cmd: c_int, arg: usize) -> c_int {
    int(with(|s| {
        let flags = s.open_flags(fd)?;
        Ok(match cmd {
            libc::F_GETFL => i64::from(flags & !(libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC)),
            libc::F_SETFL | libc::F_SETFD => 0,
            libc::F_GETFD => i64::from(libc::FD_CLOEXEC),
            libc::F_DUPFD | libc::F_DUPFD_CLOEXEC => i64::from(s.dup(fd)?),
            libc::F_GETLK | libc::F_OFD_GETLK => {
                // SAFETY: for these commands the argument is a struct flock pointer.
                if let Some(lock) = unsafe { (arg as *mut libc::flock).as_mut() } {
                    lock.l_type = libc::F_UNLCK as i16;
                }
                0
            }
            libc::F_SETLK | libc::F_SETLKW | libc::F_OFD_SETLK | libc::F_OFD_SETLKW => 0,
            _ => return Err(alignfs::Error::InvalidArgument(format!("fcntl command {cmd} on an alignfs file"))),
        })
    }))
}

/// # Safety
/// libc's contract for `fcntl`.
#[no_mangle]
pub unsafe extern "C" fn fcntl(fd: c_int, cmd: c_int, arg: usize) -> c_int {
    if is_ours(fd) {
        return fcntl_ours(fd, cmd, arg);
    }
    // SAFETY: the caller's arguments, unchanged, to libc's own `fcntl`: it has the same contract as this function.
    unsafe { real!(fcntl: fn(c_int, c_int, usize) -> c_int)(fd, cmd, arg) }
}

/// # Safety
/// libc's contract for `fcntl64`.
#[no_mangle]
pub unsafe extern "C" fn fcntl64(fd: c_int, cmd: c_int, arg: usize) -> c_int {
    if is_ours(fd) {
        return fcntl_ours(fd, cmd, arg);
    }
    // SAFETY: the caller's arguments, unchanged, to libc's own `fcntl64`: it has the same contract as this function.
    unsafe { real!(fcntl64: fn(c_int, c_int, usize) -> c_int)(fd, cmd, arg) }
}

/// # Safety
/// libc's contract for `flock`.
#[no_mangle]
pub unsafe extern "C" fn flock(fd: c_int, operation: c_int) -> c_int {
    if is_ours(fd) {
        return int(with(|s| s.open_flags(fd).map(|_| 0)));
    }
    // SAFETY: the caller's arguments, unchanged, to libc's own `flock`: it has the same contract as this function.
    unsafe { real!(flock: fn(c_int, c_int) -> c_int)(fd, operation) }
}

/// # Safety
/// libc's contract for `dup`.
#[no_mangle]
pub unsafe extern "C" fn dup(fd: c_int) -> c_int {
    if is_ours(fd) {
        return int(with(|s| s.dup(fd).map(i64::from)));
    }
    // SAFETY: the caller's arguments, unchanged, to libc's own `dup`: it has the same contract as this function.
    unsafe { real!(dup: fn(c_int) -> c_int)(fd) }
}

/// A kernel descriptor cannot be made to name one of our files (a shell's `>` redirect
/// into the prefix, for one): that is EINVAL, with a message.
fn dup_to(old: c_int, new: c_int) -> Option<c_int> {
    if !is_ours(old) && !is_ours(new) {
        return None;
    }
    if old == new {
        return Some(int(with(|s| s.open_flags(old).map(|_| i64::from(new)))));
    }
    eprintln!("alignfs-preload: dup2/dup3 onto a chosen descriptor is not supported for alignfs files");
    Some(int(Err(libc::EINVAL)))
}

/// # Safety
/// libc's contract for `dup2`.
#[no_mangle]
pub unsafe extern "C" fn dup2(old: c_int, new: c_int) -> c_int {
    // SAFETY: the caller's arguments, unchanged, to libc's own `dup2`: it has the same contract as this function.
    dup_to(old, new).unwrap_or_else(|| unsafe { real!(dup2: fn(c_int, c_int) -> c_int)(old, new) })
}

/// # Safety
/// libc's contract for `dup3`.
#[no_mangle]
pub unsafe extern "C" fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int {
    // SAFETY: the caller's arguments, unchanged, to libc's own `dup3`: it has the same contract as this function.
    dup_to(old, new).unwrap_or_else(|| unsafe { real!(dup3: fn(c_int, c_int, c_int) -> c_int)(old, new, flags) })
}

macro_rules! map_call {
    ($name:ident) => {
        /// Mapping one of our files is refused (ENODEV): its bytes live in two tiers, and a
        /// mapping could not see later writes. Everything else maps as usual.
        ///
        /// # Safety
        /// libc's contract for `mmap`.
        #[no_mangle]
        pub unsafe extern "C" fn $name(addr: *mut c_void, len: size_t, prot: c_int, flags: c_int, fd: c_int, off: off_t) -> *mut c_void {
            if is_ours(fd) && flags & libc::MAP_ANONYMOUS == 0 {
                static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
                if !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    eprintln!("alignfs-preload: mmap of an alignfs file is not supported (ENODEV)");
                }
                set_errno(libc::ENODEV);
                return libc::MAP_FAILED;
            }
            // SAFETY: the caller's arguments, unchanged, to libc's own definition of this call: it has the same contract as this function.
            unsafe { real!($name: fn(*mut c_void, size_t, c_int, c_int, c_int, off_t) -> *mut c_void)(addr, len, prot, flags, fd, off) }
        }
    };
}
map_call!(mmap);
map_call!(mmap64);
