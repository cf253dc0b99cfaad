//! `stat` in its forms, `statx`, `access`, `chmod` and `chown` on our files.

use std::ffi::{c_char, c_int, c_uint};

use crate::route::{at_path, is_ours, map_c_path, Target};
use crate::{int, real, with};
use alignfs::volume::SetAttrRequest;
use alignfs_c::{fill_stat, Session};
use libc::mode_t;

// --- attributes ------------------------------------------------------------------------

// The two layouts are the same on 64-bit Linux; the 64 variants share the code.
const _: () = assert!(std::mem::size_of::<libc::stat>() == std::mem::size_of::<libc::stat64>());

fn stat_into(attr: alignfs::Result<alignfs::Attr>, s: &Session, out: *mut libc::stat) -> alignfs::Result<i64> {
    let attr = attr?;
    // SAFETY: the caller passes a writable struct stat (libc's contract), or null.
    let out = unsafe { out.as_mut() }.ok_or_else(|| alignfs::Error::InvalidArgument("null stat buffer".into()))?;
    fill_stat(&attr, s.volume().geometry().preferred_io(), out);
    Ok(0)
}

fn stat_path(path: &str, out: *mut libc::stat) -> c_int {
    int(with(|s| stat_into(s.stat(path), s, out)))
}

fn stat_fd(fd: c_int, out: *mut libc::stat) -> c_int {
    int(with(|s| stat_into(s.fstat(fd), s, out)))
}

macro_rules! stat_calls {
    ($stat:ident, $lstat:ident, $fstat:ident, $fstatat:ident, $buf:ty) => {
        /// # Safety
        /// libc's contract for `stat`.
        #[no_mangle]
        pub unsafe extern "C" fn $stat(path: *const c_char, out: *mut $buf) -> c_int {
            // SAFETY: `path` is a NUL-terminated path, by libc's contract for this call.
            match unsafe { map_c_path(path) } {
                Some(p) => stat_path(&p, out.cast()),
                // SAFETY: the caller's arguments, unchanged, to libc's own definition of this call: it has the same contract as this function.
                None => unsafe { real!($stat: fn(*const c_char, *mut $buf) -> c_int)(path, out) },
            }
        }

        /// Symbolic links are not followed on our files, so this is `stat`.
        ///
        /// # Safety
        /// libc's contract for `lstat`.
        #[no_mangle]
        pub unsafe extern "C" fn $lstat(path: *const c_char, out: *mut $buf) -> c_int {
            // SAFETY: `path` is a NUL-terminated path, by libc's contract for this call.
            match unsafe { map_c_path(path) } {
                Some(p) => stat_path(&p, out.cast()),
                // SAFETY: the caller's arguments, unchanged, to libc's own definition of this call: it has the same contract as this function.
                None => unsafe { real!($lstat: fn(*const c_char, *mut $buf) -> c_int)(path, out) },
            }
        }

        /// # Safety
        /// libc's contract for `fstat`.
        #[no_mangle]
        pub unsafe extern "C" fn $fstat(fd: c_int, out: *mut $buf) -> c_int {
            if is_ours(fd) {
                return stat_fd(fd, out.cast());
            }
            // SAFETY: the caller's arguments, unchanged, to libc's own definition of this call: it has the same contract as this function.
            unsafe { real!($fstat: fn(c_int, *mut $buf) -> c_int)(fd, out) }
        }

        /// # Safety
        /// libc's contract for `fstatat`.
        #[no_mangle]
        pub unsafe extern "C" fn $fstatat(dirfd: c_int, path: *const c_char, out: *mut $buf, flags: c_int) -> c_int {
            let empty = !path.is_null() && unsafe { *path } == 0;
            if empty && flags & libc::AT_EMPTY_PATH != 0 && is_ours(dirfd) {
                return stat_fd(dirfd, out.cast());
            }
            // SAFETY: `path` is a NUL-terminated path, by libc's contract for this call.
            match unsafe { at_path(dirfd, path) } {
                Ok(Target::Ours(p)) => stat_path(&p, out.cast()),
                Err(e) => int(Err(e)),
                // SAFETY: the caller's arguments, unchanged, to libc's own definition of this call: it has the same contract as this function.
                Ok(Target::Real) => unsafe { real!($fstatat: fn(c_int, *const c_char, *mut $buf, c_int) -> c_int)(dirfd, path, out, flags) },
            }
        }
    };
}
stat_calls!(stat, lstat, fstat, fstatat, libc::stat);
stat_calls!(stat64, lstat64, fstat64, fstatat64, libc::stat64);

fn fill_statx(attr: &alignfs::Attr, io_bytes: u64, out: &mut libc::statx) {
    // SAFETY: zeroed stat is valid plain data.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    fill_stat(attr, io_bytes, &mut st);
    // SAFETY: zeroed statx is valid plain data.
    *out = unsafe { std::mem::zeroed() };
    out.stx_mask = libc::STATX_BASIC_STATS;
    out.stx_blksize = st.st_blksize as u32;
    out.stx_nlink = st.st_nlink as u32;
    out.stx_uid = st.st_uid;
    out.stx_gid = st.st_gid;
    out.stx_mode = st.st_mode as u16;
    out.stx_ino = st.st_ino;
    out.stx_size = st.st_size as u64;
    out.stx_blocks = st.st_blocks as u64;
    let time = |sec: i64, nsec: i64| {
        // SAFETY: plain data; all-zero is valid.
        let mut t: libc::statx_timestamp = unsafe { std::mem::zeroed() };
        (t.tv_sec, t.tv_nsec) = (sec, nsec as u32);
        t
    };
    out.stx_atime = time(st.st_atime, st.st_atime_nsec);
    out.stx_mtime = time(st.st_mtime, st.st_mtime_nsec);
    out.stx_ctime = time(st.st_ctime, st.st_ctime_nsec);
}

/// # Safety
/// libc's contract for `statx`.
#[no_mangle]
pub unsafe extern "C" fn statx(dirfd: c_int, path: *const c_char, flags: c_int, mask: c_uint, out: *mut libc::statx) -> c_int {
    let empty = !path.is_null() && unsafe { *path } == 0;
    let attr = if empty && flags & libc::AT_EMPTY_PATH != 0 && is_ours(dirfd) {
        Some(with(|s| s.fstat(dirfd).map(|a| (a, s.volume().geometry().preferred_io()))))
    } else {
        // SAFETY: `path` is a NUL-terminated path, by libc's contract for this call.
        match unsafe { at_path(dirfd, path) } {
            Ok(Target::Ours(p)) => Some(with(|s| s.stat(&p).map(|a| (a, s.volume().geometry().preferred_io())))),
            Err(e) => Some(Err(e)),
            Ok(Target::Real) => None,
        }
    };
    match attr {
        Some(Ok((attr, io_bytes))) => match unsafe { out.as_mut() } {
            Some(out) => {
                fill_statx(&attr, io_bytes, out);
                0
            }
            None => int(Err(libc::EFAULT)),
        },
        Some(Err(e)) => int(Err(e)),
        // SAFETY: the caller's arguments, unchanged, to libc's own `statx`: it has the same contract as this function.
        None => unsafe { real!(statx: fn(c_int, *const c_char, c_int, c_uint, *mut libc::statx) -> c_int)(dirfd, path, flags, mask, out) },
    }
}

/// The process owns the volume, so any existing file is accessible.
///
/// # Safety
/// libc's contract for `access`.
#[no_mangle]
pub unsafe extern "C" fn access(path: *const c_char, mode: c_int) -> c_int {
    // SAFETY: `path` is a NUL-terminated path, by libc's contract for this call.
    match unsafe { map_c_path(path) } {
        Some(p) => int(with(|s| s.stat(&p).map(|_| 0))),
        // SAFETY: the caller's arguments, unchanged, to libc's own `access`: it has the same contract as this function.
        None => unsafe { real!(access: fn(*const c_char, c_int) -> c_int)(path, mode) },
    }
}

/// # Safety
/// libc's contract for `faccessat`.
#[no_mangle]
pub unsafe extern "C" fn faccessat(dirfd: c_int, path: *const c_char, mode: c_int, flags: c_int) -> c_int {
    // SAFETY: `path` is a NUL-terminated path, by libc's contract for this call.
    match unsafe { at_path(dirfd, path) } {
        Ok(Target::Ours(p)) => int(with(|s| s.stat(&p).map(|_| 0))),
        Err(e) => int(Err(e)),
        // SAFETY: the caller's arguments, unchanged, to libc's own `faccessat`: it has the same contract as this function.
        Ok(Target::Real) => unsafe { real!(faccessat: fn(c_int, *const c_char, c_int, c_int) -> c_int)(dirfd, path, mode, flags) },
    }
}

/// # Safety
/// libc's contract for `fchmod`.
#[no_mangle]
pub unsafe extern "C" fn fchmod(fd: c_int, mode: mode_t) -> c_int {
    if is_ours(fd) {
        let request = SetAttrRequest { perm: Some((mode & 0o7777) as u16), ..SetAttrRequest::default() };
        return int(with(|s| s.set_attr_fd(fd, &request).map(|()| 0)));
    }
    // SAFETY: the caller's arguments, unchanged, to libc's own `fchmod`: it has the same contract as this function.
    unsafe { real!(fchmod: fn(c_int, mode_t) -> c_int)(fd, mode) }
}

/// # Safety
/// libc's contract for `chmod`.
#[no_mangle]
pub unsafe extern "C" fn chmod(path: *const c_char, mode: mode_t) -> c_int {
    // SAFETY: `path` is a NUL-terminated path, by libc's contract for this call.
    match unsafe { map_c_path(path) } {
        Some(p) => {
            let request = SetAttrRequest { perm: Some((mode & 0o7777) as u16), ..SetAttrRequest::default() };
            int(with(|s| s.set_attr(&p, &request).map(|()| 0)))
        }
        // SAFETY: the caller's arguments, unchanged, to libc's own `chmod`: it has the same contract as this function.
        None => unsafe { real!(chmod: fn(*const c_char, mode_t) -> c_int)(path, mode) },
    }
}

/// # Safety
/// libc's contract for `fchown`.
#[no_mangle]
pub unsafe extern "C" fn fchown(fd: c_int, uid: libc::uid_t, gid: libc::gid_t) -> c_int {
    if is_ours(fd) {
        let keep = |id: u32| (id != u32::MAX).then_some(id);
        let request = SetAttrRequest { uid: keep(uid), gid: keep(gid), ..SetAttrRequest::default() };
        return int(with(|s| s.set_attr_fd(fd, &request).map(|()| 0)));
    }
    // SAFETY: the caller's arguments, unchanged, to libc's own `fchown`: it has the same contract as this function.
    unsafe { real!(fchown: fn(c_int, libc::uid_t, libc::gid_t) -> c_int)(fd, uid, gid) }
}
