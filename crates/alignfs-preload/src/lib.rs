//! `LD_PRELOAD=libalignfs_preload.so ALIGNFS_PREFIX=/some/dir program …`: the program's
//! libc file calls on paths under the prefix (and on the descriptors they return) go to
//! an alignfs engine inside the process; every other call goes to libc untouched.
//!
//! The volume is opened on the first call that needs it, from `ALIGNFS_FAST` and
//! `ALIGNFS_SSD` (default: the embedded default devices). Descriptors the shim hands out
//! start at 2^30, beyond any kernel descriptor, so a descriptor's number says whose it is.
//! docs/PRELOAD.md lists the calls covered and what they do differently.
//!
//! `open`, `openat` and `fcntl` are variadic in C. They are defined here with the optional
//! argument as an ordinary one, which is how the x86-64 and AArch64 Linux calling
//! conventions pass it (and how other preload shims do it).

mod dirs;
mod route;
mod stdio;

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};

use alignfs::volume::SetAttrRequest;
use alignfs_c::{fill_stat, Session};
use libc::{iovec, mode_t, off_t, size_t, ssize_t};
use route::{at_path, is_ours, map_c_path, session, set_errno, Target};

/// The next definition of a libc function (libc's own). Expands to the function pointer;
/// call it inside an `unsafe` block.
macro_rules! real {
    ($name:ident: fn($($arg:ty),*) -> $ret:ty) => {{
        static ADDRESS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
        let address = *ADDRESS.get_or_init(|| $crate::lookup(concat!(stringify!($name), "\0")));
        $crate::as_fn::<unsafe extern "C" fn($($arg),*) -> $ret>(address, stringify!($name))
    }};
}
pub(crate) use real;

/// The address of the next definition of `name` (NUL-terminated) after this library.
fn lookup(name: &str) -> usize {
    // SAFETY: dlsym with a NUL-terminated name; RTLD_NEXT skips this library.
    unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr().cast()) as usize }
}

/// # Safety
/// `F` is the function pointer type of the symbol at `address`.
unsafe fn as_fn<F: Copy>(address: usize, name: &str) -> F {
    assert!(address != 0, "libc has no {name}");
    assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<usize>());
    // SAFETY: a non-null code address of the promised type (contract).
    unsafe { std::mem::transmute_copy(&address) }
}

/// Run an engine call for the process's volume; errors (and panics, which are bugs)
/// become errno values.
fn with<T>(f: impl FnOnce(&'static Session) -> alignfs::Result<T>) -> Result<T, c_int> {
    catch_unwind(AssertUnwindSafe(|| f(session()?).map_err(|e| e.errno()))).unwrap_or(Err(libc::EIO))
}

/// `-1` and errno on failure, as libc does.
fn int(result: Result<i64, c_int>) -> c_int {
    match result {
        Ok(v) => c_int::try_from(v).unwrap_or(c_int::MAX),
        Err(e) => {
            set_errno(e);
            -1
        }
    }
}

fn size(result: Result<usize, c_int>) -> ssize_t {
    match result {
        Ok(n) => n as ssize_t,
        Err(e) => {
            set_errno(e);
            -1
        }
    }
}

fn offset(off: off_t) -> alignfs::Result<u64> {
    u64::try_from(off).map_err(|_| alignfs::Error::InvalidArgument(format!("negative offset {off}")))
}

/// # Safety
/// `buf` points to `len` bytes (or `len` is 0).
unsafe fn bytes<'a>(buf: *const c_void, len: size_t) -> &'a [u8] {
    if len == 0 || buf.is_null() {
        return &[];
    }
    // SAFETY: contract.
    unsafe { std::slice::from_raw_parts(buf.cast(), len) }
}

/// # Safety
/// `buf` points to `len` writable bytes (or `len` is 0).
unsafe fn bytes_mut<'a>(buf: *mut c_void, len: size_t) -> &'a mut [u8] {
    if len == 0 || buf.is_null() {
        return &mut [];
    }
    // SAFETY: contract.
    unsafe { std::slice::from_raw_parts_mut(buf.cast(), len) }
}

// --- open and close --------------------------------------------------------------------

fn open_ours(path: &str, flags: c_int, mode: mode_t) -> c_int {
    int(with(|s| s.open_file(path, flags, mode).map(i64::from)))
}

/// # Safety
/// libc's contract for `open`.
#[no_mangle]
pub unsafe extern "C" fn open(path: *const c_char, flags: c_int, mode: mode_t) -> c_int {
    // SAFETY: contract.
    match unsafe { map_c_path(path) } {
        Some(p) => open_ours(&p, flags, mode),
        // SAFETY: contract.
        None => unsafe { real!(open: fn(*const c_char, c_int, mode_t) -> c_int)(path, flags, mode) },
    }
}

/// # Safety
/// libc's contract for `open64`.
#[no_mangle]
pub unsafe extern "C" fn open64(path: *const c_char, flags: c_int, mode: mode_t) -> c_int {
    // SAFETY: contract.
    match unsafe { map_c_path(path) } {
        Some(p) => open_ours(&p, flags, mode),
        // SAFETY: contract.
        None => unsafe { real!(open64: fn(*const c_char, c_int, mode_t) -> c_int)(path, flags, mode) },
    }
}

/// The fortified `open` (`_FORTIFY_SOURCE`), without a mode.
///
/// # Safety
/// libc's contract for `__open_2`.
#[no_mangle]
pub unsafe extern "C" fn __open_2(path: *const c_char, flags: c_int) -> c_int {
    // SAFETY: contract.
    match unsafe { map_c_path(path) } {
        Some(p) => open_ours(&p, flags, 0),
        // SAFETY: contract.
        None => unsafe { real!(__open_2: fn(*const c_char, c_int) -> c_int)(path, flags) },
    }
}

/// # Safety
/// libc's contract for `__open64_2`.
#[no_mangle]
pub unsafe extern "C" fn __open64_2(path: *const c_char, flags: c_int) -> c_int {
    // SAFETY: contract.
    match unsafe { map_c_path(path) } {
        Some(p) => open_ours(&p, flags, 0),
        // SAFETY: contract.
        None => unsafe { real!(__open64_2: fn(*const c_char, c_int) -> c_int)(path, flags) },
    }
}

/// # Safety
/// libc's contract for `openat`.
#[no_mangle]
pub unsafe extern "C" fn openat(dirfd: c_int, path: *const c_char, flags: c_int, mode: mode_t) -> c_int {
    // SAFETY: contract.
    match unsafe { at_path(dirfd, path) } {
        Ok(Target::Ours(p)) => open_ours(&p, flags, mode),
        Err(e) => int(Err(e)),
        // SAFETY: contract.
        Ok(Target::Real) => unsafe { real!(openat: fn(c_int, *const c_char, c_int, mode_t) -> c_int)(dirfd, path, flags, mode) },
    }
}

/// # Safety
/// libc's contract for `openat64`.
#[no_mangle]
pub unsafe extern "C" fn openat64(dirfd: c_int, path: *const c_char, flags: c_int, mode: mode_t) -> c_int {
    // SAFETY: contract.
    match unsafe { at_path(dirfd, path) } {
        Ok(Target::Ours(p)) => open_ours(&p, flags, mode),
        Err(e) => int(Err(e)),
        // SAFETY: contract.
        Ok(Target::Real) => unsafe { real!(openat64: fn(c_int, *const c_char, c_int, mode_t) -> c_int)(dirfd, path, flags, mode) },
    }
}

/// # Safety
/// libc's contract for `creat`.
#[no_mangle]
pub unsafe extern "C" fn creat(path: *const c_char, mode: mode_t) -> c_int {
    // SAFETY: contract.
    unsafe { open(path, libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC, mode) }
}

/// # Safety
/// libc's contract for `creat64`.
#[no_mangle]
pub unsafe extern "C" fn creat64(path: *const c_char, mode: mode_t) -> c_int {
    // SAFETY: contract.
    unsafe { open64(path, libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC, mode) }
}

/// # Safety
/// libc's contract for `close`.
#[no_mangle]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    if is_ours(fd) {
        return int(with(|s| s.close_fd(fd).map(|()| 0)));
    }
    // SAFETY: contract.
    unsafe { real!(close: fn(c_int) -> c_int)(fd) }
}

// --- data ------------------------------------------------------------------------------

/// # Safety
/// libc's contract for `read`.
#[no_mangle]
pub unsafe extern "C" fn read(fd: c_int, buf: *mut c_void, len: size_t) -> ssize_t {
    if is_ours(fd) {
        // SAFETY: contract.
        let buf = unsafe { bytes_mut(buf, len) };
        return size(with(|s| s.read(fd, buf)));
    }
    // SAFETY: contract.
    unsafe { real!(read: fn(c_int, *mut c_void, size_t) -> ssize_t)(fd, buf, len) }
}

/// # Safety
/// libc's contract for `write`.
#[no_mangle]
pub unsafe extern "C" fn write(fd: c_int, buf: *const c_void, len: size_t) -> ssize_t {
    if is_ours(fd) {
        // SAFETY: contract.
        let data = unsafe { bytes(buf, len) };
        return size(with(|s| s.write(fd, data)));
    }
    // SAFETY: contract.
    unsafe { real!(write: fn(c_int, *const c_void, size_t) -> ssize_t)(fd, buf, len) }
}

macro_rules! positional {
    ($read:ident, $write:ident) => {
        /// # Safety
        /// libc's contract for `pread`.
        #[no_mangle]
        pub unsafe extern "C" fn $read(fd: c_int, buf: *mut c_void, len: size_t, off: off_t) -> ssize_t {
            if is_ours(fd) {
                // SAFETY: contract.
                let buf = unsafe { bytes_mut(buf, len) };
                return size(with(|s| s.pread(fd, buf, offset(off)?)));
            }
            // SAFETY: contract.
            unsafe { real!($read: fn(c_int, *mut c_void, size_t, off_t) -> ssize_t)(fd, buf, len, off) }
        }

        /// # Safety
        /// libc's contract for `pwrite`.
        #[no_mangle]
        pub unsafe extern "C" fn $write(fd: c_int, buf: *const c_void, len: size_t, off: off_t) -> ssize_t {
            if is_ours(fd) {
                // SAFETY: contract.
                let data = unsafe { bytes(buf, len) };
                return size(with(|s| s.pwrite(fd, data, offset(off)?)));
            }
            // SAFETY: contract.
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
    // SAFETY: contract.
    Ok(unsafe { std::slice::from_raw_parts(iov, count) })
}

/// Vectored IO on our descriptor: one gathered write, or reads in order until a short one.
///
/// # Safety
/// `iov` holds `count` valid iovecs.
unsafe fn vectored(fd: c_int, iov: *const iovec, count: c_int, at: Option<off_t>, writing: bool) -> ssize_t {
    // SAFETY: contract.
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
        // SAFETY: contract.
        return unsafe { vectored(fd, iov, count, None, false) };
    }
    // SAFETY: contract.
    unsafe { real!(readv: fn(c_int, *const iovec, c_int) -> ssize_t)(fd, iov, count) }
}

/// # Safety
/// libc's contract for `writev`.
#[no_mangle]
pub unsafe extern "C" fn writev(fd: c_int, iov: *const iovec, count: c_int) -> ssize_t {
    if is_ours(fd) {
        // SAFETY: contract.
        return unsafe { vectored(fd, iov, count, None, true) };
    }
    // SAFETY: contract.
    unsafe { real!(writev: fn(c_int, *const iovec, c_int) -> ssize_t)(fd, iov, count) }
}

macro_rules! positional_vectored {
    ($read:ident, $write:ident) => {
        /// # Safety
        /// libc's contract for `preadv`.
        #[no_mangle]
        pub unsafe extern "C" fn $read(fd: c_int, iov: *const iovec, count: c_int, off: off_t) -> ssize_t {
            if is_ours(fd) {
                // SAFETY: contract.
                return unsafe { vectored(fd, iov, count, Some(off), false) };
            }
            // SAFETY: contract.
            unsafe { real!($read: fn(c_int, *const iovec, c_int, off_t) -> ssize_t)(fd, iov, count, off) }
        }

        /// # Safety
        /// libc's contract for `pwritev`.
        #[no_mangle]
        pub unsafe extern "C" fn $write(fd: c_int, iov: *const iovec, count: c_int, off: off_t) -> ssize_t {
            if is_ours(fd) {
                // SAFETY: contract.
                return unsafe { vectored(fd, iov, count, Some(off), true) };
            }
            // SAFETY: contract.
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
            // SAFETY: contract.
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
            // SAFETY: contract.
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
    // SAFETY: contract.
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
            // SAFETY: contract.
            unsafe { real!($ftruncate: fn(c_int, off_t) -> c_int)(fd, len) }
        }

        /// # Safety
        /// libc's contract for `truncate`.
        #[no_mangle]
        pub unsafe extern "C" fn $truncate(path: *const c_char, len: off_t) -> c_int {
            // SAFETY: contract.
            match unsafe { map_c_path(path) } {
                Some(p) => int(with(|s| s.truncate(&p, offset(len)?).map(|()| 0))),
                // SAFETY: contract.
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
            // SAFETY: contract.
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
            // SAFETY: contract.
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
            // SAFETY: contract.
            unsafe { real!($fadvise: fn(c_int, off_t, off_t, c_int) -> c_int)(fd, off, len, advice) }
        }
    };
}
fallocate_calls!(fallocate, posix_fallocate, posix_fadvise);
fallocate_calls!(fallocate64, posix_fallocate64, posix_fadvise64);

// --- attributes ------------------------------------------------------------------------

// The two layouts are the same on 64-bit Linux; the 64 variants share the code.
const _: () = assert!(std::mem::size_of::<libc::stat>() == std::mem::size_of::<libc::stat64>());

fn stat_into(attr: alignfs::Result<alignfs::Attr>, s: &Session, out: *mut libc::stat) -> alignfs::Result<i64> {
    let attr = attr?;
    // SAFETY: the caller passes a writable struct stat (libc's contract), or null.
    let out = unsafe { out.as_mut() }.ok_or_else(|| alignfs::Error::InvalidArgument("null stat buffer".into()))?;
    fill_stat(&attr, s.volume().geometry().block(), out);
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
            // SAFETY: contract.
            match unsafe { map_c_path(path) } {
                Some(p) => stat_path(&p, out.cast()),
                // SAFETY: contract.
                None => unsafe { real!($stat: fn(*const c_char, *mut $buf) -> c_int)(path, out) },
            }
        }

        /// Symbolic links are not followed on our files, so this is `stat`.
        ///
        /// # Safety
        /// libc's contract for `lstat`.
        #[no_mangle]
        pub unsafe extern "C" fn $lstat(path: *const c_char, out: *mut $buf) -> c_int {
            // SAFETY: contract.
            match unsafe { map_c_path(path) } {
                Some(p) => stat_path(&p, out.cast()),
                // SAFETY: contract.
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
            // SAFETY: contract.
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
            // SAFETY: contract.
            match unsafe { at_path(dirfd, path) } {
                Ok(Target::Ours(p)) => stat_path(&p, out.cast()),
                Err(e) => int(Err(e)),
                // SAFETY: contract.
                Ok(Target::Real) => unsafe { real!($fstatat: fn(c_int, *const c_char, *mut $buf, c_int) -> c_int)(dirfd, path, out, flags) },
            }
        }
    };
}
stat_calls!(stat, lstat, fstat, fstatat, libc::stat);
stat_calls!(stat64, lstat64, fstat64, fstatat64, libc::stat64);

fn fill_statx(attr: &alignfs::Attr, block: u64, out: &mut libc::statx) {
    // SAFETY: zeroed stat is valid plain data.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    fill_stat(attr, block, &mut st);
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
        Some(with(|s| s.fstat(dirfd).map(|a| (a, s.volume().geometry().block()))))
    } else {
        // SAFETY: contract.
        match unsafe { at_path(dirfd, path) } {
            Ok(Target::Ours(p)) => Some(with(|s| s.stat(&p).map(|a| (a, s.volume().geometry().block())))),
            Err(e) => Some(Err(e)),
            Ok(Target::Real) => None,
        }
    };
    match attr {
        Some(Ok((attr, block))) => match unsafe { out.as_mut() } {
            Some(out) => {
                fill_statx(&attr, block, out);
                0
            }
            None => int(Err(libc::EFAULT)),
        },
        Some(Err(e)) => int(Err(e)),
        // SAFETY: contract.
        None => unsafe { real!(statx: fn(c_int, *const c_char, c_int, c_uint, *mut libc::statx) -> c_int)(dirfd, path, flags, mask, out) },
    }
}

/// The process owns the volume, so any existing file is accessible.
///
/// # Safety
/// libc's contract for `access`.
#[no_mangle]
pub unsafe extern "C" fn access(path: *const c_char, mode: c_int) -> c_int {
    // SAFETY: contract.
    match unsafe { map_c_path(path) } {
        Some(p) => int(with(|s| s.stat(&p).map(|_| 0))),
        // SAFETY: contract.
        None => unsafe { real!(access: fn(*const c_char, c_int) -> c_int)(path, mode) },
    }
}

/// # Safety
/// libc's contract for `faccessat`.
#[no_mangle]
pub unsafe extern "C" fn faccessat(dirfd: c_int, path: *const c_char, mode: c_int, flags: c_int) -> c_int {
    // SAFETY: contract.
    match unsafe { at_path(dirfd, path) } {
        Ok(Target::Ours(p)) => int(with(|s| s.stat(&p).map(|_| 0))),
        Err(e) => int(Err(e)),
        // SAFETY: contract.
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
    // SAFETY: contract.
    unsafe { real!(fchmod: fn(c_int, mode_t) -> c_int)(fd, mode) }
}

/// # Safety
/// libc's contract for `chmod`.
#[no_mangle]
pub unsafe extern "C" fn chmod(path: *const c_char, mode: mode_t) -> c_int {
    // SAFETY: contract.
    match unsafe { map_c_path(path) } {
        Some(p) => {
            let request = SetAttrRequest { perm: Some((mode & 0o7777) as u16), ..SetAttrRequest::default() };
            int(with(|s| s.set_attr(&p, &request).map(|()| 0)))
        }
        // SAFETY: contract.
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
    // SAFETY: contract.
    unsafe { real!(fchown: fn(c_int, libc::uid_t, libc::gid_t) -> c_int)(fd, uid, gid) }
}

// --- names -----------------------------------------------------------------------------

/// # Safety
/// libc's contract for `unlink`.
#[no_mangle]
pub unsafe extern "C" fn unlink(path: *const c_char) -> c_int {
    // SAFETY: contract.
    match unsafe { map_c_path(path) } {
        Some(p) => int(with(|s| s.unlink(&p).map(|()| 0))),
        // SAFETY: contract.
        None => unsafe { real!(unlink: fn(*const c_char) -> c_int)(path) },
    }
}

/// # Safety
/// libc's contract for `unlinkat`.
#[no_mangle]
pub unsafe extern "C" fn unlinkat(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int {
    // SAFETY: contract.
    match unsafe { at_path(dirfd, path) } {
        Ok(Target::Ours(p)) if flags & libc::AT_REMOVEDIR != 0 => int(with(|s| s.rmdir(&p).map(|()| 0))),
        Ok(Target::Ours(p)) => int(with(|s| s.unlink(&p).map(|()| 0))),
        Err(e) => int(Err(e)),
        // SAFETY: contract.
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
    // SAFETY: contract.
    let (a, b) = unsafe { (at_path(libc::AT_FDCWD, from), at_path(libc::AT_FDCWD, to)) };
    // SAFETY: contract.
    rename_between(a, b).unwrap_or_else(|| unsafe { real!(rename: fn(*const c_char, *const c_char) -> c_int)(from, to) })
}

/// # Safety
/// libc's contract for `renameat`.
#[no_mangle]
pub unsafe extern "C" fn renameat(fromfd: c_int, from: *const c_char, tofd: c_int, to: *const c_char) -> c_int {
    // SAFETY: contract.
    let (a, b) = unsafe { (at_path(fromfd, from), at_path(tofd, to)) };
    rename_between(a, b).unwrap_or_else(|| {
        // SAFETY: contract.
        unsafe { real!(renameat: fn(c_int, *const c_char, c_int, *const c_char) -> c_int)(fromfd, from, tofd, to) }
    })
}

/// Flags other than 0 are refused (EINVAL) on our names.
///
/// # Safety
/// libc's contract for `renameat2`.
#[no_mangle]
pub unsafe extern "C" fn renameat2(fromfd: c_int, from: *const c_char, tofd: c_int, to: *const c_char, flags: c_uint) -> c_int {
    // SAFETY: contract.
    let (a, b) = unsafe { (at_path(fromfd, from), at_path(tofd, to)) };
    if flags != 0 && matches!((&a, &b), (Ok(Target::Ours(_)), _) | (_, Ok(Target::Ours(_)))) {
        return int(Err(libc::EINVAL));
    }
    rename_between(a, b).unwrap_or_else(|| {
        // SAFETY: contract.
        unsafe { real!(renameat2: fn(c_int, *const c_char, c_int, *const c_char, c_uint) -> c_int)(fromfd, from, tofd, to, flags) }
    })
}

/// # Safety
/// libc's contract for `mkdir`.
#[no_mangle]
pub unsafe extern "C" fn mkdir(path: *const c_char, mode: mode_t) -> c_int {
    // SAFETY: contract.
    match unsafe { map_c_path(path) } {
        Some(p) => int(with(|s| s.mkdir(&p, mode).map(|()| 0))),
        // SAFETY: contract.
        None => unsafe { real!(mkdir: fn(*const c_char, mode_t) -> c_int)(path, mode) },
    }
}

/// # Safety
/// libc's contract for `mkdirat`.
#[no_mangle]
pub unsafe extern "C" fn mkdirat(dirfd: c_int, path: *const c_char, mode: mode_t) -> c_int {
    // SAFETY: contract.
    match unsafe { at_path(dirfd, path) } {
        Ok(Target::Ours(p)) => int(with(|s| s.mkdir(&p, mode).map(|()| 0))),
        Err(e) => int(Err(e)),
        // SAFETY: contract.
        Ok(Target::Real) => unsafe { real!(mkdirat: fn(c_int, *const c_char, mode_t) -> c_int)(dirfd, path, mode) },
    }
}

/// # Safety
/// libc's contract for `rmdir`.
#[no_mangle]
pub unsafe extern "C" fn rmdir(path: *const c_char) -> c_int {
    // SAFETY: contract.
    match unsafe { map_c_path(path) } {
        Some(p) => int(with(|s| s.rmdir(&p).map(|()| 0))),
        // SAFETY: contract.
        None => unsafe { real!(rmdir: fn(*const c_char) -> c_int)(path) },
    }
}

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
    // SAFETY: contract.
    unsafe { real!(fcntl: fn(c_int, c_int, usize) -> c_int)(fd, cmd, arg) }
}

/// # Safety
/// libc's contract for `fcntl64`.
#[no_mangle]
pub unsafe extern "C" fn fcntl64(fd: c_int, cmd: c_int, arg: usize) -> c_int {
    if is_ours(fd) {
        return fcntl_ours(fd, cmd, arg);
    }
    // SAFETY: contract.
    unsafe { real!(fcntl64: fn(c_int, c_int, usize) -> c_int)(fd, cmd, arg) }
}

/// # Safety
/// libc's contract for `flock`.
#[no_mangle]
pub unsafe extern "C" fn flock(fd: c_int, operation: c_int) -> c_int {
    if is_ours(fd) {
        return int(with(|s| s.open_flags(fd).map(|_| 0)));
    }
    // SAFETY: contract.
    unsafe { real!(flock: fn(c_int, c_int) -> c_int)(fd, operation) }
}

/// # Safety
/// libc's contract for `dup`.
#[no_mangle]
pub unsafe extern "C" fn dup(fd: c_int) -> c_int {
    if is_ours(fd) {
        return int(with(|s| s.dup(fd).map(i64::from)));
    }
    // SAFETY: contract.
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
    // SAFETY: contract.
    dup_to(old, new).unwrap_or_else(|| unsafe { real!(dup2: fn(c_int, c_int) -> c_int)(old, new) })
}

/// # Safety
/// libc's contract for `dup3`.
#[no_mangle]
pub unsafe extern "C" fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int {
    // SAFETY: contract.
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
            // SAFETY: contract.
            unsafe { real!($name: fn(*mut c_void, size_t, c_int, c_int, c_int, off_t) -> *mut c_void)(addr, len, prot, flags, fd, off) }
        }
    };
}
map_call!(mmap);
map_call!(mmap64);

pub use dirs::*;
pub use stdio::*;

// --- file system statistics ------------------------------------------------------------

/// `f_type` of our files: "ALGN". Not a kernel file system's magic, so programs that
/// special-case one (RocksDB and ZFS) take the generic path.
const ALIGNFS_MAGIC: i64 = 0x414c_474e;

fn fill_statfs(s: &Session, out: &mut libc::statfs) {
    let st = s.volume().statfs();
    let files_free = u64::from(u32::MAX).saturating_sub(st.inodes);
    // SAFETY: plain data; all-zero is valid.
    *out = unsafe { std::mem::zeroed() };
    out.f_type = ALIGNFS_MAGIC;
    out.f_bsize = st.block_bytes as i64;
    out.f_frsize = st.block_bytes as i64;
    out.f_blocks = st.blocks_total;
    out.f_bfree = st.blocks_free;
    out.f_bavail = st.blocks_free;
    out.f_files = st.inodes + files_free;
    out.f_ffree = files_free;
    out.f_namelen = st.max_name_bytes as i64;
}

fn fill_statvfs(s: &Session, out: &mut libc::statvfs) {
    // SAFETY: plain data; all-zero is valid.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    fill_statfs(s, &mut fs);
    // SAFETY: plain data; all-zero is valid.
    *out = unsafe { std::mem::zeroed() };
    out.f_bsize = fs.f_bsize as u64;
    out.f_frsize = fs.f_frsize as u64;
    out.f_blocks = fs.f_blocks;
    out.f_bfree = fs.f_bfree;
    out.f_bavail = fs.f_bavail;
    out.f_files = fs.f_files;
    out.f_ffree = fs.f_ffree;
    out.f_favail = fs.f_ffree;
    out.f_namemax = fs.f_namelen as u64;
}

const _: () = assert!(std::mem::size_of::<libc::statfs>() == std::mem::size_of::<libc::statfs64>());
const _: () = assert!(std::mem::size_of::<libc::statvfs>() == std::mem::size_of::<libc::statvfs64>());

/// Fill `out` for our volume (after checking that `path`, if any, exists).
fn fs_stats<T>(path: Option<&str>, out: *mut T, fill: impl FnOnce(&Session, &mut T)) -> c_int {
    int(with(|s| {
        if let Some(path) = path {
            s.stat(path)?;
        }
        // SAFETY: libc's contract: a writable structure, or null (refused).
        let out = unsafe { out.as_mut() }.ok_or_else(|| alignfs::Error::InvalidArgument("null buffer".into()))?;
        fill(s, out);
        Ok(0)
    }))
}

macro_rules! statfs_calls {
    ($path_call:ident, $fd_call:ident, $buf:ty, $fill:path) => {
        /// # Safety
        /// libc's contract for `statfs`/`statvfs`.
        #[no_mangle]
        pub unsafe extern "C" fn $path_call(path: *const c_char, out: *mut $buf) -> c_int {
            // SAFETY: contract.
            match unsafe { map_c_path(path) } {
                Some(p) => fs_stats(Some(&p), out.cast(), |s, o| $fill(s, o)),
                // SAFETY: contract.
                None => unsafe { real!($path_call: fn(*const c_char, *mut $buf) -> c_int)(path, out) },
            }
        }

        /// # Safety
        /// libc's contract for `fstatfs`/`fstatvfs`.
        #[no_mangle]
        pub unsafe extern "C" fn $fd_call(fd: c_int, out: *mut $buf) -> c_int {
            if is_ours(fd) {
                return fs_stats(None, out.cast(), |s, o| $fill(s, o));
            }
            // SAFETY: contract.
            unsafe { real!($fd_call: fn(c_int, *mut $buf) -> c_int)(fd, out) }
        }
    };
}
statfs_calls!(statfs, fstatfs, libc::statfs, fill_statfs);
statfs_calls!(statfs64, fstatfs64, libc::statfs64, fill_statfs);
statfs_calls!(statvfs, fstatvfs, libc::statvfs, fill_statvfs);
statfs_calls!(statvfs64, fstatvfs64, libc::statvfs64, fill_statvfs);
