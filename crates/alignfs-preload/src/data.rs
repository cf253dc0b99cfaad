//! Reads and writes, positioned and vectored, `lseek`, `fsync` and friends, `ftruncate`
//! and `fallocate` on our descriptors.

use std::ffi::{c_char, c_int, c_uint, c_void};

use crate::route::{is_ours, map_c_path, set_errno};
use crate::{bytes, bytes_mut, int, offset, real, size, with};
use libc::{iovec, off_t, size_t, ssize_t};

// --- data ------------------------------------------------------------------------------

/// # Safety
/// libc's contract for `read`.
#[no_mangle]
pub unsafe extern "C" fn read(fd: c_int, buf: *mut c_void, len: size_t) -> ssize_t {
    if is_ours(fd) {
        // SAFETY: `buf` holds `len` writable bytes, by libc's contract for this call.
        let buf = unsafe { bytes_mut(buf, len) };
        return size(with(|s| s.read(fd, buf)));
    }
    // SAFETY: the caller's arguments, unchanged, to libc's own `read`: it has the same contract as this function.
    unsafe { real!(read: fn(c_int, *mut c_void, size_t) -> ssize_t)(fd, buf, len) }
}

/// # Safety
/// libc's contract for `write`.
#[no_mangle]
pub unsafe extern "C" fn write(fd: c_int, buf: *const c_void, len: size_t) -> ssize_t {
    if is_ours(fd) {
        // SAFETY: `buf` holds `len` readable bytes, by libc's contract for this call.
        let data = unsafe { bytes(buf, len) };
        return size(with(|s| s.write(fd, data)));
    }
    // SAFETY: the caller's arguments, unchanged, to libc's own `write`: it has the same contract as this function.
    unsafe { real!(write: fn(c_int, *const c_void, size_t) -> ssize_t)(fd, buf, len) }
}

macro_rules! positional {
    ($read:ident, $write:ident) => {
        /// # Safety
        /// libc's contract for `pread`.
        #[no_mangle]
        pub unsafe extern "C" fn $read(fd: c_int, buf: *mut c_void, len: size_t, off: off_t) -> ssize_t {
            if is_ours(fd) {
                // SAFETY: `buf` holds `len` writable bytes, by libc's contract for this call.
                let buf = unsafe { bytes_mut(buf, len) };
                return size(with(|s| s.pread(fd, buf, offset(off)?)));
            }
            // SAFETY: the caller's arguments, unchanged, to libc's own definition of this call: it has the same contract as this function.
            unsafe { real!($read: fn(c_int, *mut c_void, size_t, off_t) -> ssize_t)(fd, buf, len, off) }
        }

        /// # Safety
        /// libc's contract for `pwrite`.
        #[no_mangle]
        pub unsafe extern "C" fn $write(fd: c_int, buf: *const c_void, len: size_t, off: off_t) -> ssize_t {
            if is_ours(fd) {
                // SAFETY: `buf` holds `len` readable bytes, by libc's contract for this call.
                let data = unsafe { bytes(buf, len) };
                return size(with(|s| s.pwrite(fd, data, offset(off)?)));
            }
            // SAFETY: the caller's arguments, unchanged, to libc's own definition of this call: it has the same contract as this function.
            unsafe { real!($write: fn(c_int, *const c_void, size_t, off_t) -> ssize_t)(fd, buf, len, off) }
        }
    };
}
positional!(pread, pwrite);
positional!(pread64, pwrite64);

/// # Safety
/// `iov` holds `count` valid iovecs.
unsafe fn iovecs<'a>(iov: *const iovec, count: c_int) -> Result<&'a [iovec], c_int> {
    let count = usize::try_from(count).ok().filter(|&c| c <= 1024).ok_or(libc::EINVAL)?;
    if count == 0 || iov.is_null() {
        return Ok(&[]);
    }
    // SAFETY: this function's contract: `iov` holds `count` iovecs, and `count` is positive (checked above).
    Ok(unsafe { std::slice::from_raw_parts(iov, count) })
}

/// Vectored IO on our descriptor: one gathered write, or reads in order until a short one.
///
/// # Safety
/// `iov` holds `count` valid iovecs.
unsafe fn vectored(fd: c_int, iov: *const iovec, count: c_int, at: Option<off_t>, writing: bool) -> ssize_t {
    // SAFETY: `iov` holds `count` valid iovecs, by libc's contract for this call.
    let iov = match unsafe { iovecs(iov, count) } {
        Ok(iov) => iov,
        Err(e) => return size(Err(e)),
    };
    if writing {
        let mut data = Vec::with_capacity(iov.iter().map(|v| v.iov_len).sum());
        for v in iov {
            // SAFETY: each iovec names readable bytes (contract).
            data.extend_from_slice(unsafe { bytes(v.iov_base, v.iov_len) });
        }
        return size(with(|s| match at {
            Some(off) => s.pwrite(fd, &data, offset(off)?),
            None => s.write(fd, &data),
        }));
    }
    let mut total = 0usize;
    for v in iov {
        // SAFETY: each iovec names writable bytes (contract).
        let buf = unsafe { bytes_mut(v.iov_base, v.iov_len) };
        let want = buf.len();
        let got = with(|s| match at {
            Some(off) => s.pread(fd, buf, offset(off)? + total as u64),
            None => s.read(fd, buf),
        });
        match got {
            Ok(n) => {
                total += n;
                if n < want {
                    break;
                }
            }
            Err(e) if total == 0 => return size(Err(e)),
            Err(_) => break,
        }
    }
    total as ssize_t
}

/// # Safety
/// libc's contract for `readv`.
#[no_mangle]
pub unsafe extern "C" fn readv(fd: c_int, iov: *const iovec, count: c_int) -> ssize_t {
    if is_ours(fd) {
        // SAFETY: `iov` holds `count` valid iovecs, by libc's contract for this call.
        return unsafe { vectored(fd, iov, count, None, false) };
    }
    // SAFETY: the caller's arguments, unchanged, to libc's own `readv`: it has the same contract as this function.
    unsafe { real!(readv: fn(c_int, *const iovec, c_int) -> ssize_t)(fd, iov, count) }
}

/// # Safety
/// libc's contract for `writev`.
#[no_mangle]
pub unsafe extern "C" fn writev(fd: c_int, iov: *const iovec, count: c_int) -> ssize_t {
    if is_ours(fd) {
        // SAFETY: `iov` holds `count` valid iovecs, by libc's contract for this call.
        return unsafe { vectored(fd, iov, count, None, true) };
    }
    // SAFETY: the caller's arguments, unchanged, to libc's own `writev`: it has the same contract as this function.
    unsafe { real!(writev: fn(c_int, *const iovec, c_int) -> ssize_t)(fd, iov, count) }
}

macro_rules! positional_vectored {
    ($read:ident, $write:ident) => {
        /// # Safety
        /// libc's contract for `preadv`.
        #[no_mangle]
        pub unsafe extern "C" fn $read(fd: c_int, iov: *const iovec, count: c_int, off: off_t) -> ssize_t {
            if is_ours(fd) {
                // SAFETY: `iov` holds `count` valid iovecs, by libc's contract for this call.
                return unsafe { vectored(fd, iov, count, Some(off), false) };
            }
            // SAFETY: the caller's arguments, unchanged, to libc's own definition of this call: it has the same contract as this function.
            unsafe { real!($read: fn(c_int, *const iovec, c_int, off_t) -> ssize_t)(fd, iov, count, off) }
        }

        /// # Safety
        /// libc's contract for `pwritev`.
        #[no_mangle]
        pub unsafe extern "C" fn $write(fd: c_int, iov: *const iovec, count: c_int, off: off_t) -> ssize_t {
            if is_ours(fd) {
                // SAFETY: `iov` holds `count` valid iovecs, by libc's contract for this call.
                return unsafe { vectored(fd, iov, count, Some(off), true) };
            }
            // SAFETY: the caller's arguments, unchanged, to libc's own definition of this call: it has the same contract as this function.
            unsafe { real!($write: fn(c_int, *const iovec, c_int, off_t) -> ssize_t)(fd, iov, count, off) }
        }
    };
}
positional_vectored!(preadv, pwritev);
positional_vectored!(preadv64, pwritev64);

macro_rules! seek {
    ($name:ident) => {
        /// # Safety
        /// libc's contract for `lseek`.
        #[no_mangle]
        pub unsafe extern "C" fn $name(fd: c_int, off: off_t, whence: c_int) -> off_t {
            if is_ours(fd) {
                return match with(|s| s.lseek(fd, off, whence)) {
                    Ok(position) => position as off_t,
                    Err(e) => {
                        set_errno(e);
                        -1
                    }
                };
            }
            // SAFETY: the caller's arguments, unchanged, to libc's own definition of this call: it has the same contract as this function.
            unsafe { real!($name: fn(c_int, off_t, c_int) -> off_t)(fd, off, whence) }
        }
    };
}
seek!(lseek);
seek!(lseek64);

macro_rules! sync {
    ($name:ident) => {
        /// # Safety
        /// libc's contract for `fsync`.
        #[no_mangle]
        pub unsafe extern "C" fn $name(fd: c_int) -> c_int {
            if is_ours(fd) {
                return int(with(|s| s.fsync(fd).map(|()| 0)));
            }
            // SAFETY: the caller's arguments, unchanged, to libc's own definition of this call: it has the same contract as this function.
            unsafe { real!($name: fn(c_int) -> c_int)(fd) }
        }
    };
}
sync!(fsync);
sync!(fdatasync);

/// # Safety
/// libc's contract for `sync_file_range`.
#[no_mangle]
pub unsafe extern "C" fn sync_file_range(fd: c_int, off: off_t, len: off_t, flags: c_uint) -> c_int {
    if is_ours(fd) {
        return int(with(|s| s.fsync(fd).map(|()| 0)));
    }
    // SAFETY: the caller's arguments, unchanged, to libc's own `sync_file_range`: it has the same contract as this function.
    unsafe { real!(sync_file_range: fn(c_int, off_t, off_t, c_uint) -> c_int)(fd, off, len, flags) }
}

macro_rules! truncate_calls {
    ($ftruncate:ident, $truncate:ident) => {
        /// # Safety
        /// libc's contract for `ftruncate`.
        #[no_mangle]
        pub unsafe extern "C" fn $ftruncate(fd: c_int, len: off_t) -> c_int {
            if is_ours(fd) {
                return int(with(|s| s.ftruncate(fd, offset(len)?).map(|()| 0)));
            }
            // SAFETY: the caller's arguments, unchanged, to libc's own definition of this call: it has the same contract as this function.
            unsafe { real!($ftruncate: fn(c_int, off_t) -> c_int)(fd, len) }
        }

        /// # Safety
        /// libc's contract for `truncate`.
        #[no_mangle]
        pub unsafe extern "C" fn $truncate(path: *const c_char, len: off_t) -> c_int {
            // SAFETY: `path` is a NUL-terminated path, by libc's contract for this call.
            match unsafe { map_c_path(path) } {
                Some(p) => int(with(|s| s.truncate(&p, offset(len)?).map(|()| 0))),
                // SAFETY: the caller's arguments, unchanged, to libc's own definition of this call: it has the same contract as this function.
                None => unsafe { real!($truncate: fn(*const c_char, off_t) -> c_int)(path, len) },
            }
        }
    };
}
truncate_calls!(ftruncate, truncate);
truncate_calls!(ftruncate64, truncate64);

macro_rules! fallocate_calls {
    ($fallocate:ident, $posix:ident, $fadvise:ident) => {
        /// # Safety
        /// libc's contract for `fallocate`.
        #[no_mangle]
        pub unsafe extern "C" fn $fallocate(fd: c_int, mode: c_int, off: off_t, len: off_t) -> c_int {
            if is_ours(fd) {
                return int(with(|s| s.fallocate(fd, mode, offset(off)?, offset(len)?).map(|()| 0)));
            }
            // SAFETY: the caller's arguments, unchanged, to libc's own definition of this call: it has the same contract as this function.
            unsafe { real!($fallocate: fn(c_int, c_int, off_t, off_t) -> c_int)(fd, mode, off, len) }
        }

        /// Returns the error number instead of setting errno, as POSIX says.
        ///
        /// # Safety
        /// libc's contract for `posix_fallocate`.
        #[no_mangle]
        pub unsafe extern "C" fn $posix(fd: c_int, off: off_t, len: off_t) -> c_int {
            if is_ours(fd) {
                return match with(|s| s.fallocate(fd, 0, offset(off)?, offset(len)?)) {
                    Ok(()) => 0,
                    Err(e) => e,
                };
            }
            // SAFETY: the caller's arguments, unchanged, to libc's own definition of this call: it has the same contract as this function.
            unsafe { real!($posix: fn(c_int, off_t, off_t) -> c_int)(fd, off, len) }
        }

        /// Advice is accepted and ignored on our files: there is no page cache to steer.
        ///
        /// # Safety
        /// libc's contract for `posix_fadvise`.
        #[no_mangle]
        pub unsafe extern "C" fn $fadvise(fd: c_int, off: off_t, len: off_t, advice: c_int) -> c_int {
            if is_ours(fd) {
                return match with(|s| s.open_flags(fd)) {
                    Ok(_) => 0,
                    Err(e) => e,
                };
            }
            // SAFETY: the caller's arguments, unchanged, to libc's own definition of this call: it has the same contract as this function.
            unsafe { real!($fadvise: fn(c_int, off_t, off_t, c_int) -> c_int)(fd, off, len, advice) }
        }
    };
}
fallocate_calls!(fallocate, posix_fallocate, posix_fadvise);
fallocate_calls!(fallocate64, posix_fallocate64, posix_fadvise64);
