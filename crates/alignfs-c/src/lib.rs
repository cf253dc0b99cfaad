//! The alignfs C API (`include/alignfs.h`): a program opens a volume in its own process
//! and calls the engine directly, with no FUSE round trip per request.
//!
//! Every function returns a non-negative value on success and `-errno` on failure;
//! `alignfs_last_error()` then holds a message for the calling thread. A null pointer
//! where one is required is `-EFAULT`. A panic inside the engine is caught here and
//! reported as `-EIO` (it is a bug, but it must not unwind into C).

pub mod block;
mod session;

use std::cell::RefCell;
use std::ffi::{c_char, c_int, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;

use alignfs::volume::DirEntry;
use alignfs::{Attr, Error, FileKind};
pub use block::*;
pub use session::{Session, FD_BASE};

/// An open volume, as C sees it.
pub struct AlignfsVolume(Session);

/// A directory listing being read (`alignfs_opendir`).
pub struct AlignfsDir {
    entries: Vec<DirEntry>,
    next: usize,
}

/// One directory entry (`struct alignfs_dirent`).
#[repr(C)]
pub struct AlignfsDirent {
    pub ino: u64,
    /// `DT_REG`, `DT_DIR`, … as in `<dirent.h>`.
    pub kind: u8,
    /// NUL-terminated.
    pub name: [c_char; 256],
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn remember(message: String) {
    let message = CString::new(message.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|last| *last.borrow_mut() = message);
}

fn failure(e: &Error) -> i64 {
    remember(e.to_string());
    -i64::from(e.errno())
}

/// Run `f`, turning its error (or a panic) into `-errno` and remembering the message.
fn call(f: impl FnOnce() -> alignfs::Result<i64>) -> i64 {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(value)) => value,
        Ok(Err(e)) => failure(&e),
        Err(_) => {
            remember("internal error: the engine panicked (a bug; please report it)".into());
            -i64::from(libc::EIO)
        }
    }
}

fn call_int(f: impl FnOnce() -> alignfs::Result<i64>) -> c_int {
    c_int::try_from(call(f)).unwrap_or(-libc::EOVERFLOW)
}

fn fault(what: &'static str) -> Error {
    Error::BadAddress(what)
}

/// # Safety
/// `p` is null or points to a NUL-terminated string that outlives the call.
unsafe fn text<'a>(p: *const c_char, what: &'static str) -> alignfs::Result<&'a str> {
    if p.is_null() {
        return Err(fault(what));
    }
    // SAFETY: non-null, and the caller promises a NUL-terminated string.
    let bytes = unsafe { CStr::from_ptr(p) };
    bytes.to_str().map_err(|_| Error::InvalidArgument(format!("{what} is not UTF-8")))
}

/// # Safety
/// `v` is null or a pointer returned by `alignfs_volume_open` and not yet closed.
unsafe fn session<'a>(v: *const AlignfsVolume) -> alignfs::Result<&'a Session> {
    // SAFETY: the caller promises a live volume or null.
    unsafe { v.as_ref() }.map(|v| &v.0).ok_or_else(|| fault("volume"))
}

/// Open the volume on these devices (formatted with `alignfs mkfs`). Stores the handle
/// in `*out`. A volume a mount or another process holds gives `-EBUSY`.
///
/// # Safety
/// `fast` and `ssd` are NUL-terminated paths; `out` points to writable storage.
#[no_mangle]
pub unsafe extern "C" fn alignfs_volume_open(fast: *const c_char, ssd: *const c_char, out: *mut *mut AlignfsVolume) -> c_int {
    call_int(|| {
        // SAFETY: forwarded from this function's contract.
        let (fast, ssd) = unsafe { (text(fast, "fast")?, text(ssd, "ssd")?) };
        if out.is_null() {
            return Err(fault("out"));
        }
        let volume = Box::new(AlignfsVolume(Session::open(Path::new(fast), Path::new(ssd))?));
        // SAFETY: `out` is non-null and writable (contract).
        unsafe { *out = Box::into_raw(volume) };
        Ok(0)
    })
}

/// Close the volume: every descriptor still open is closed, the SSD flushed, a
/// checkpoint written. The handle is gone afterwards, even on error.
///
/// # Safety
/// `volume` came from `alignfs_volume_open` and is not used after this call.
#[no_mangle]
pub unsafe extern "C" fn alignfs_volume_close(volume: *mut AlignfsVolume) -> c_int {
    if volume.is_null() {
        return call_int(|| Err(fault("volume")));
    }
    // SAFETY: the pointer came from Box::into_raw in alignfs_volume_open (contract).
    let volume = unsafe { Box::from_raw(volume) };
    call_int(|| volume.0.close().map(|()| 0))
}

/// The message for this thread's last failure ("" if none).
#[no_mangle]
pub extern "C" fn alignfs_last_error() -> *const c_char {
    LAST_ERROR.with(|last| last.borrow().as_ptr())
}

macro_rules! on_session {
    ($v:expr, |$s:ident| $body:expr) => {
        call(|| {
            // SAFETY: the caller passes a live volume handle or null (checked).
            let $s = unsafe { session($v) }?;
            $body
        })
    };
}

/// Like `open(2)` on a path inside the volume. Returns a descriptor ≥ `ALIGNFS_FD_BASE`.
///
/// # Safety
/// `volume` is a live handle; `path` a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn alignfs_open(volume: *const AlignfsVolume, path: *const c_char, flags: c_int, mode: libc::mode_t) -> c_int {
    let result = on_session!(volume, |s| {
        // SAFETY: NUL-terminated (contract).
        let path = unsafe { text(path, "path") }?;
        s.open_file(path, flags, mode).map(i64::from)
    });
    c_int::try_from(result).unwrap_or(-libc::EOVERFLOW)
}

/// # Safety
/// `volume` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn alignfs_close(volume: *const AlignfsVolume, fd: c_int) -> c_int {
    on_session!(volume, |s| s.close_fd(fd).map(|()| 0)) as c_int
}

/// A new descriptor sharing `fd`'s open file (position, flags).
///
/// # Safety
/// `volume` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn alignfs_dup(volume: *const AlignfsVolume, fd: c_int) -> c_int {
    c_int::try_from(on_session!(volume, |s| s.dup(fd).map(i64::from))).unwrap_or(-libc::EOVERFLOW)
}

/// # Safety
/// `buf` is null only when `len` is 0, else points to `len` writable bytes.
unsafe fn out_buffer<'a>(buf: *mut libc::c_void, len: usize) -> alignfs::Result<&'a mut [u8]> {
    if len == 0 {
        return Ok(&mut []);
    }
    if buf.is_null() {
        return Err(fault("buf"));
    }
    // SAFETY: non-null with `len` writable bytes (contract).
    Ok(unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), len) })
}

/// # Safety
/// `buf` is null only when `len` is 0, else points to `len` readable bytes.
unsafe fn in_buffer<'a>(buf: *const libc::c_void, len: usize) -> alignfs::Result<&'a [u8]> {
    if len == 0 {
        return Ok(&[]);
    }
    if buf.is_null() {
        return Err(fault("buf"));
    }
    // SAFETY: non-null with `len` readable bytes (contract).
    Ok(unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), len) })
}

fn offset(off: libc::off_t) -> alignfs::Result<u64> {
    u64::try_from(off).map_err(|_| Error::NegativeOffset(off))
}

/// # Safety
/// `volume` is a live handle; `buf` holds `len` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn alignfs_read(volume: *const AlignfsVolume, fd: c_int, buf: *mut libc::c_void, len: usize) -> isize {
    on_session!(volume, |s| {
        // SAFETY: `buf` is null only when `len` is 0, else holds `len` writable bytes, by the C API's contract for this call (alignfs.h).
        let buf = unsafe { out_buffer(buf, len) }?;
        s.read(fd, buf).map(|n| n as i64)
    }) as isize
}

/// # Safety
/// `volume` is a live handle; `buf` holds `len` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn alignfs_write(volume: *const AlignfsVolume, fd: c_int, buf: *const libc::c_void, len: usize) -> isize {
    on_session!(volume, |s| {
        // SAFETY: `buf` is null only when `len` is 0, else holds `len` readable bytes, by the C API's contract for this call (alignfs.h).
        let data = unsafe { in_buffer(buf, len) }?;
        s.write(fd, data).map(|n| n as i64)
    }) as isize
}

/// # Safety
/// `volume` is a live handle; `buf` holds `len` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn alignfs_pread(
    volume: *const AlignfsVolume,
    fd: c_int,
    buf: *mut libc::c_void,
    len: usize,
    off: libc::off_t,
) -> isize {
    on_session!(volume, |s| {
        // SAFETY: `buf` is null only when `len` is 0, else holds `len` writable bytes, by the C API's contract for this call (alignfs.h).
        let buf = unsafe { out_buffer(buf, len) }?;
        s.pread(fd, buf, offset(off)?).map(|n| n as i64)
    }) as isize
}

/// # Safety
/// `volume` is a live handle; `buf` holds `len` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn alignfs_pwrite(
    volume: *const AlignfsVolume,
    fd: c_int,
    buf: *const libc::c_void,
    len: usize,
    off: libc::off_t,
) -> isize {
    on_session!(volume, |s| {
        // SAFETY: `buf` is null only when `len` is 0, else holds `len` readable bytes, by the C API's contract for this call (alignfs.h).
        let data = unsafe { in_buffer(buf, len) }?;
        s.pwrite(fd, data, offset(off)?).map(|n| n as i64)
    }) as isize
}

/// # Safety
/// `iov` points to `count` iovecs (count 0..=IOV_MAX), each valid as its buffer says.
unsafe fn iovecs<'a>(iov: *const libc::iovec, count: c_int) -> alignfs::Result<&'a [libc::iovec]> {
    let count = usize::try_from(count).ok().filter(|&c| c <= 1024).ok_or_else(|| Error::InvalidArgument(format!("iovcnt {count}")))?;
    if count == 0 {
        return Ok(&[]);
    }
    if iov.is_null() {
        return Err(fault("iov"));
    }
    // SAFETY: `count` iovecs at `iov` (contract).
    Ok(unsafe { std::slice::from_raw_parts(iov, count) })
}

/// Vectored `pread`: fills the buffers in order, stopping at end of file.
///
/// # Safety
/// `volume` is a live handle; `iov` holds `count` iovecs naming writable buffers.
#[no_mangle]
pub unsafe extern "C" fn alignfs_preadv(
    volume: *const AlignfsVolume,
    fd: c_int,
    iov: *const libc::iovec,
    count: c_int,
    off: libc::off_t,
) -> isize {
    on_session!(volume, |s| {
        // SAFETY: `iov` holds `count` valid iovecs, by the C API's contract for this call (alignfs.h).
        let iov = unsafe { iovecs(iov, count) }?;
        let mut at = offset(off)?;
        let mut total = 0i64;
        for v in iov {
            // SAFETY: each iovec names `iov_len` writable bytes (contract).
            let buf = unsafe { out_buffer(v.iov_base, v.iov_len) }?;
            let n = s.pread(fd, buf, at)?;
            total += n as i64;
            at += n as u64;
            if n < buf.len() {
                break;
            }
        }
        Ok(total)
    }) as isize
}

/// Vectored `pwrite`: the buffers are gathered into one write.
///
/// # Safety
/// `volume` is a live handle; `iov` holds `count` iovecs naming readable buffers.
#[no_mangle]
pub unsafe extern "C" fn alignfs_pwritev(
    volume: *const AlignfsVolume,
    fd: c_int,
    iov: *const libc::iovec,
    count: c_int,
    off: libc::off_t,
) -> isize {
    on_session!(volume, |s| {
        // SAFETY: `iov` holds `count` valid iovecs, by the C API's contract for this call (alignfs.h).
        let iov = unsafe { iovecs(iov, count) }?;
        let mut data = Vec::new();
        for v in iov {
            // SAFETY: each iovec names `iov_len` readable bytes (contract).
            data.extend_from_slice(unsafe { in_buffer(v.iov_base, v.iov_len) }?);
        }
        s.pwrite(fd, &data, offset(off)?).map(|n| n as i64)
    }) as isize
}

/// # Safety
/// `volume` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn alignfs_lseek(volume: *const AlignfsVolume, fd: c_int, off: libc::off_t, whence: c_int) -> libc::off_t {
    on_session!(volume, |s| s.lseek(fd, off, whence).map(|p| p as i64))
}

/// # Safety
/// `volume` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn alignfs_fsync(volume: *const AlignfsVolume, fd: c_int) -> c_int {
    on_session!(volume, |s| s.fsync(fd).map(|()| 0)) as c_int
}

/// Same as `alignfs_fsync`: the engine journals a file's size with its data either way.
///
/// # Safety
/// `volume` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn alignfs_fdatasync(volume: *const AlignfsVolume, fd: c_int) -> c_int {
    on_session!(volume, |s| s.fsync(fd).map(|()| 0)) as c_int
}

/// # Safety
/// `volume` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn alignfs_ftruncate(volume: *const AlignfsVolume, fd: c_int, len: libc::off_t) -> c_int {
    on_session!(volume, |s| s.ftruncate(fd, offset(len)?).map(|()| 0)) as c_int
}

/// # Safety
/// `volume` is a live handle; `path` a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn alignfs_truncate(volume: *const AlignfsVolume, path: *const c_char, len: libc::off_t) -> c_int {
    on_session!(volume, |s| {
        // SAFETY: `path` is null or a NUL-terminated string, by the C API's contract for this call (alignfs.h).
        let path = unsafe { text(path, "path") }?;
        s.truncate(path, offset(len)?).map(|()| 0)
    }) as c_int
}

fn mode_bits(kind: FileKind) -> libc::mode_t {
    match kind {
        FileKind::File => libc::S_IFREG,
        FileKind::Dir => libc::S_IFDIR,
        FileKind::Symlink => libc::S_IFLNK,
        FileKind::Fifo => libc::S_IFIFO,
        FileKind::Socket => libc::S_IFSOCK,
        FileKind::CharDevice => libc::S_IFCHR,
        FileKind::BlockDevice => libc::S_IFBLK,
    }
}

/// `DT_*` of `<dirent.h>` for a file kind.
pub fn dirent_type(kind: FileKind) -> u8 {
    match kind {
        FileKind::File => libc::DT_REG,
        FileKind::Dir => libc::DT_DIR,
        FileKind::Symlink => libc::DT_LNK,
        FileKind::Fifo => libc::DT_FIFO,
        FileKind::Socket => libc::DT_SOCK,
        FileKind::CharDevice => libc::DT_CHR,
        FileKind::BlockDevice => libc::DT_BLK,
    }
}

/// `struct stat` for an engine attribute. `st_dev` is 0; `st_blocks` counts the size
/// rounded up to 4 KiB pages (the engine keeps no per-file allocation count).
pub fn fill_stat(attr: &Attr, io_bytes: u64, out: &mut libc::stat) {
    let split = |ns: i64| (ns.div_euclid(1_000_000_000), ns.rem_euclid(1_000_000_000));
    // SAFETY: `stat` is plain old data; all-zero is a valid value.
    *out = unsafe { std::mem::zeroed() };
    out.st_ino = attr.ino.0;
    out.st_mode = mode_bits(attr.kind) | libc::mode_t::from(attr.perm);
    out.st_nlink = attr.nlink.into();
    out.st_uid = attr.uid;
    out.st_gid = attr.gid;
    out.st_rdev = attr.rdev.into();
    out.st_size = attr.size as i64;
    out.st_blksize = io_bytes as _;
    out.st_blocks = if attr.kind == FileKind::File { (attr.size.div_ceil(4096) * 8) as i64 } else { 0 };
    (out.st_atime, out.st_atime_nsec) = split(attr.atime);
    (out.st_mtime, out.st_mtime_nsec) = split(attr.mtime);
    (out.st_ctime, out.st_ctime_nsec) = split(attr.ctime);
}

/// # Safety
/// `out` is null or points to a writable `struct stat`.
unsafe fn write_stat(s: &Session, attr: alignfs::Result<Attr>, out: *mut libc::stat) -> alignfs::Result<i64> {
    let attr = attr?;
    // SAFETY: this function's contract: `out` is null or a writable `struct stat`.
    let out = unsafe { out.as_mut() }.ok_or_else(|| fault("statbuf"))?;
    fill_stat(&attr, s.volume().geometry().preferred_io(), out);
    Ok(0)
}

/// # Safety
/// `volume` is a live handle; `path` a NUL-terminated string; `out` a writable `struct stat`.
#[no_mangle]
pub unsafe extern "C" fn alignfs_stat(volume: *const AlignfsVolume, path: *const c_char, out: *mut libc::stat) -> c_int {
    on_session!(volume, |s| {
        // SAFETY: `path` is null or a NUL-terminated string, by the C API's contract for this call (alignfs.h).
        let path = unsafe { text(path, "path") }?;
        // SAFETY: `path` is null or a writable `struct stat`, by the C API's contract for this call (alignfs.h).
        unsafe { write_stat(s, s.stat(path), out) }
    }) as c_int
}

/// # Safety
/// `volume` is a live handle; `out` a writable `struct stat`.
#[no_mangle]
pub unsafe extern "C" fn alignfs_fstat(volume: *const AlignfsVolume, fd: c_int, out: *mut libc::stat) -> c_int {
    // SAFETY: `fd` is null or a writable `struct stat`, by the C API's contract for this call (alignfs.h).
    on_session!(volume, |s| unsafe { write_stat(s, s.fstat(fd), out) }) as c_int
}

macro_rules! path_call {
    ($(#[$doc:meta])* $name:ident, |$s:ident, $p:ident $(, $arg:ident: $ty:ty)*| $body:expr) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// `volume` is a live handle; `path` a NUL-terminated string.
        #[no_mangle]
        pub unsafe extern "C" fn $name(volume: *const AlignfsVolume, path: *const c_char $(, $arg: $ty)*) -> c_int {
            on_session!(volume, |$s| {
                // SAFETY: `path` is null or a NUL-terminated string, by the C API's contract for this call (alignfs.h).
                let $p = unsafe { text(path, "path") }?;
                $body.map(|()| 0)
            }) as c_int
        }
    };
}

path_call!(alignfs_unlink, |s, path| s.unlink(path));
path_call!(alignfs_mkdir, |s, path, mode: libc::mode_t| s.mkdir(path, mode));
path_call!(alignfs_rmdir, |s, path| s.rmdir(path));

/// # Safety
/// `volume` is a live handle; `from` and `to` NUL-terminated strings.
#[no_mangle]
pub unsafe extern "C" fn alignfs_rename(volume: *const AlignfsVolume, from: *const c_char, to: *const c_char) -> c_int {
    on_session!(volume, |s| {
        // SAFETY: `from` is null or a NUL-terminated string, by the C API's contract for this call (alignfs.h).
        let (from, to) = unsafe { (text(from, "from")?, text(to, "to")?) };
        s.rename(from, to).map(|()| 0)
    }) as c_int
}

/// Start reading a directory (a snapshot of its entries, `.` and `..` first).
///
/// # Safety
/// `volume` is a live handle; `path` a NUL-terminated string; `out` writable.
#[no_mangle]
pub unsafe extern "C" fn alignfs_opendir(volume: *const AlignfsVolume, path: *const c_char, out: *mut *mut AlignfsDir) -> c_int {
    on_session!(volume, |s| {
        // SAFETY: `path` is null or a NUL-terminated string, by the C API's contract for this call (alignfs.h).
        let path = unsafe { text(path, "path") }?;
        if out.is_null() {
            return Err(fault("out"));
        }
        let dir = Box::new(AlignfsDir { entries: s.list_dir(path)?, next: 0 });
        // SAFETY: `out` is non-null and writable (contract).
        unsafe { *out = Box::into_raw(dir) };
        Ok(0)
    }) as c_int
}

/// The next entry into `*entry`: returns 1, or 0 at the end.
///
/// # Safety
/// `dir` came from `alignfs_opendir` and is not closed; `entry` is writable.
#[no_mangle]
pub unsafe extern "C" fn alignfs_readdir(dir: *mut AlignfsDir, entry: *mut AlignfsDirent) -> c_int {
    call_int(|| {
        // SAFETY: `dir` and `entry` are null or the handles `alignfs_opendir` and the caller gave, by the C API's contract for this call.
        let (dir, entry) = unsafe { (dir.as_mut().ok_or_else(|| fault("dir"))?, entry.as_mut().ok_or_else(|| fault("entry"))?) };
        let Some(next) = dir.entries.get(dir.next) else { return Ok(0) };
        dir.next += 1;
        entry.ino = next.ino.0;
        entry.kind = dirent_type(next.kind);
        entry.name = [0; 256];
        for (slot, &byte) in entry.name.iter_mut().zip(next.name.iter().take(255)) {
            *slot = byte as c_char;
        }
        Ok(1)
    })
}

/// # Safety
/// `dir` came from `alignfs_opendir` (or is null) and is not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn alignfs_closedir(dir: *mut AlignfsDir) {
    if !dir.is_null() {
        // SAFETY: from Box::into_raw in alignfs_opendir (contract).
        drop(unsafe { Box::from_raw(dir) });
    }
}
