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

mod attrs;
mod data;
mod descriptors;
mod dirs;
mod names;
mod open;
mod route;
mod statfs;
mod stdio;

use std::ffi::{c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};

use alignfs_c::Session;
use libc::{off_t, size_t, ssize_t};
use route::{session, set_errno};

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
    u64::try_from(off).map_err(|_| alignfs::Error::NegativeOffset(off))
}

/// # Safety
/// `buf` points to `len` bytes (or `len` is 0).
unsafe fn bytes<'a>(buf: *const c_void, len: size_t) -> &'a [u8] {
    if len == 0 || buf.is_null() {
        return &[];
    }
    // SAFETY: this function's contract: `buf` holds `len` readable bytes, and it is not null (checked above).
    unsafe { std::slice::from_raw_parts(buf.cast(), len) }
}

/// # Safety
/// `buf` points to `len` writable bytes (or `len` is 0).
unsafe fn bytes_mut<'a>(buf: *mut c_void, len: size_t) -> &'a mut [u8] {
    if len == 0 || buf.is_null() {
        return &mut [];
    }
    // SAFETY: this function's contract: `buf` holds `len` writable bytes, and it is not null (checked above).
    unsafe { std::slice::from_raw_parts_mut(buf.cast(), len) }
}

pub use attrs::*;
pub use data::*;
pub use descriptors::*;
pub use dirs::*;
pub use names::*;
pub use open::*;
pub use statfs::*;
pub use stdio::*;
