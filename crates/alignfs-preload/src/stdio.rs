//! `fopen` and friends on our files. glibc's stdio calls the kernel directly, not the
//! symbols above, so our files get a `FILE *` from `fopencookie` whose callbacks call
//! the engine; `fread`, `fwrite`, `fseek`, `fgets`, `fflush`, `fclose` … then just work.

use std::ffi::{c_char, c_int, c_void, CStr};

use libc::{size_t, ssize_t};

use crate::route::{is_ours, map_c_path, set_errno};
use crate::{real, with};

#[repr(C)]
struct CookieIo {
    read: Option<unsafe extern "C" fn(*mut c_void, *mut c_char, size_t) -> ssize_t>,
    write: Option<unsafe extern "C" fn(*mut c_void, *const c_char, size_t) -> ssize_t>,
    seek: Option<unsafe extern "C" fn(*mut c_void, *mut i64, c_int) -> c_int>,
    close: Option<unsafe extern "C" fn(*mut c_void) -> c_int>,
}

extern "C" {
    fn fopencookie(cookie: *mut c_void, mode: *const c_char, io: CookieIo) -> *mut libc::FILE;
}

fn fd_of(cookie: *mut c_void) -> c_int {
    cookie as usize as c_int
}

unsafe extern "C" fn cookie_read(cookie: *mut c_void, buf: *mut c_char, len: size_t) -> ssize_t {
    // SAFETY: stdio passes a buffer of `len` bytes.
    let buf = unsafe { crate::bytes_mut(buf.cast(), len) };
    crate::size(with(|s| s.read(fd_of(cookie), buf)))
}

unsafe extern "C" fn cookie_write(cookie: *mut c_void, buf: *const c_char, len: size_t) -> ssize_t {
    // SAFETY: stdio passes `len` bytes.
    let data = unsafe { crate::bytes(buf.cast(), len) };
    match with(|s| s.write(fd_of(cookie), data)) {
        Ok(n) => n as ssize_t,
        Err(e) => {
            set_errno(e);
            0
        }
    }
}

unsafe extern "C" fn cookie_seek(cookie: *mut c_void, offset: *mut i64, whence: c_int) -> c_int {
    // SAFETY: stdio passes a valid offset pointer.
    let Some(offset) = (unsafe { offset.as_mut() }) else { return -1 };
    match with(|s| s.lseek(fd_of(cookie), *offset, whence)) {
        Ok(position) => {
            *offset = position as i64;
            0
        }
        Err(e) => {
            set_errno(e);
            -1
        }
    }
}

unsafe extern "C" fn cookie_close(cookie: *mut c_void) -> c_int {
    match with(|s| s.close_fd(fd_of(cookie))) {
        Ok(()) => 0,
        Err(e) => {
            set_errno(e);
            libc::EOF
        }
    }
}

/// `fopen` mode letters as `open` flags.
fn mode_flags(mode: &[u8]) -> Option<c_int> {
    let plus = mode.contains(&b'+');
    let mut flags = match (mode.first()?, plus) {
        (b'r', false) => libc::O_RDONLY,
        (b'r', true) => libc::O_RDWR,
        (b'w', false) => libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC,
        (b'w', true) => libc::O_RDWR | libc::O_CREAT | libc::O_TRUNC,
        (b'a', false) => libc::O_WRONLY | libc::O_CREAT | libc::O_APPEND,
        (b'a', true) => libc::O_RDWR | libc::O_CREAT | libc::O_APPEND,
        _ => return None,
    };
    if mode.contains(&b'x') {
        flags |= libc::O_EXCL;
    }
    Some(flags)
}

/// A stream over our descriptor `fd` (closed with the stream).
///
/// # Safety
/// `mode` is a NUL-terminated string.
unsafe fn stream(fd: c_int, mode: *const c_char) -> *mut libc::FILE {
    let io = CookieIo { read: Some(cookie_read), write: Some(cookie_write), seek: Some(cookie_seek), close: Some(cookie_close) };
    // SAFETY: the cookie is the descriptor number; the callbacks match glibc's types.
    let file = unsafe { fopencookie(fd as usize as *mut c_void, mode, io) };
    if file.is_null() {
        let _ = with(|s| s.close_fd(fd));
    }
    file
}

/// # Safety
/// `path` and `mode` are NUL-terminated strings.
unsafe fn open_stream(path: &str, mode: *const c_char) -> *mut libc::FILE {
    // SAFETY: `mode` is a NUL-terminated string, by libc's contract for this call.
    let Some(flags) = mode_flags(unsafe { CStr::from_ptr(mode) }.to_bytes()) else {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    };
    match with(|s| s.open_file(path, flags, 0o666)) {
        // SAFETY: `mode` is a NUL-terminated string, by libc's contract for this call.
        Ok(fd) => unsafe { stream(fd, mode) },
        Err(e) => {
            set_errno(e);
            std::ptr::null_mut()
        }
    }
}

/// # Safety
/// libc's contract for `fopen`.
#[no_mangle]
pub unsafe extern "C" fn fopen(path: *const c_char, mode: *const c_char) -> *mut libc::FILE {
    // SAFETY: `path` is a NUL-terminated path, by libc's contract for this call.
    match unsafe { map_c_path(path) } {
        // SAFETY: `mode` is a NUL-terminated string, by libc's contract for this call.
        Some(p) if !mode.is_null() => unsafe { open_stream(&p, mode) },
        // SAFETY: the caller's arguments, unchanged, to libc's own `fopen`: it has the same contract as this function.
        _ => unsafe { real!(fopen: fn(*const c_char, *const c_char) -> *mut libc::FILE)(path, mode) },
    }
}

/// # Safety
/// libc's contract for `fopen64`.
#[no_mangle]
pub unsafe extern "C" fn fopen64(path: *const c_char, mode: *const c_char) -> *mut libc::FILE {
    // SAFETY: `path` is a NUL-terminated path, by libc's contract for this call.
    match unsafe { map_c_path(path) } {
        // SAFETY: `mode` is a NUL-terminated string, by libc's contract for this call.
        Some(p) if !mode.is_null() => unsafe { open_stream(&p, mode) },
        // SAFETY: the caller's arguments, unchanged, to libc's own `fopen64`: it has the same contract as this function.
        _ => unsafe { real!(fopen64: fn(*const c_char, *const c_char) -> *mut libc::FILE)(path, mode) },
    }
}

/// # Safety
/// libc's contract for `fdopen`.
#[no_mangle]
pub unsafe extern "C" fn fdopen(fd: c_int, mode: *const c_char) -> *mut libc::FILE {
    if is_ours(fd) && !mode.is_null() {
        // SAFETY: `mode` is a NUL-terminated string, by libc's contract for this call.
        return unsafe { stream(fd, mode) };
    }
    // SAFETY: the caller's arguments, unchanged, to libc's own `fdopen`: it has the same contract as this function.
    unsafe { real!(fdopen: fn(c_int, *const c_char) -> *mut libc::FILE)(fd, mode) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fopen_modes() {
        assert_eq!(mode_flags(b"r"), Some(libc::O_RDONLY));
        assert_eq!(mode_flags(b"rb+"), Some(libc::O_RDWR));
        assert_eq!(mode_flags(b"wx"), Some(libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_EXCL));
        assert_eq!(mode_flags(b"a+e"), Some(libc::O_RDWR | libc::O_CREAT | libc::O_APPEND));
        assert_eq!(mode_flags(b"q"), None);
        assert_eq!(mode_flags(b""), None);
    }
}
