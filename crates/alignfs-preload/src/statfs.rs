//! `statfs` and `statvfs` on paths and descriptors under the prefix.

use std::ffi::{c_char, c_int};

use crate::route::{is_ours, map_c_path};
use crate::{int, real, with};
use alignfs_c::Session;

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
            // SAFETY: `path` is a NUL-terminated path, by libc's contract for this call.
            match unsafe { map_c_path(path) } {
                Some(p) => fs_stats(Some(&p), out.cast(), |s, o| $fill(s, o)),
                // SAFETY: the caller's arguments, unchanged, to libc's own definition of this call: it has the same contract as this function.
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
            // SAFETY: the caller's arguments, unchanged, to libc's own definition of this call: it has the same contract as this function.
            unsafe { real!($fd_call: fn(c_int, *mut $buf) -> c_int)(fd, out) }
        }
    };
}
statfs_calls!(statfs, fstatfs, libc::statfs, fill_statfs);
statfs_calls!(statfs64, fstatfs64, libc::statfs64, fill_statfs);
statfs_calls!(statvfs, fstatvfs, libc::statvfs, fill_statvfs);
statfs_calls!(statvfs64, fstatvfs64, libc::statvfs64, fill_statvfs);
