//! `opendir`/`readdir` on our directories: a `DIR *` that is really one of these, told
//! apart from libc's by a registry of the pointers we handed out.

use std::collections::HashSet;
use std::ffi::{c_char, c_int};

use alignfs::volume::DirEntry;
use alignfs_c::dirent_type;
use parking_lot::Mutex;

use crate::route::{is_ours, map_c_path, set_errno};
use crate::{real, with};

struct OurDir {
    fd: c_int,
    entries: Vec<DirEntry>,
    next: usize,
    entry: libc::dirent64,
}

static OURS: Mutex<Option<HashSet<usize>>> = Mutex::new(None);

fn is_our_dir(dir: *mut libc::DIR) -> bool {
    OURS.lock().as_ref().is_some_and(|set| set.contains(&(dir as usize)))
}

/// A listing of the directory open as `fd` (which the stream then owns).
fn stream(fd: c_int) -> *mut libc::DIR {
    match with(|s| s.list_dir(&s.dir_path(fd)?)) {
        Ok(entries) => {
            // SAFETY: dirent64 is plain data; all-zero is valid.
            let entry = unsafe { std::mem::zeroed() };
            let dir = Box::into_raw(Box::new(OurDir { fd, entries, next: 0, entry })).cast::<libc::DIR>();
            OURS.lock().get_or_insert_with(HashSet::new).insert(dir as usize);
            dir
        }
        Err(e) => {
            set_errno(e);
            std::ptr::null_mut()
        }
    }
}

/// # Safety
/// libc's contract for `opendir`.
#[no_mangle]
pub unsafe extern "C" fn opendir(path: *const c_char) -> *mut libc::DIR {
    // SAFETY: `path` is a NUL-terminated path, by libc's contract for this call.
    let Some(p) = (unsafe { map_c_path(path) }) else {
        // SAFETY: the caller's arguments, unchanged, to libc's own `opendir`: it has the same contract as this function.
        return unsafe { real!(opendir: fn(*const c_char) -> *mut libc::DIR)(path) };
    };
    match with(|s| s.open_file(&p, libc::O_RDONLY | libc::O_DIRECTORY, 0)) {
        Ok(fd) => stream(fd),
        Err(e) => {
            set_errno(e);
            std::ptr::null_mut()
        }
    }
}

/// # Safety
/// libc's contract for `fdopendir`.
#[no_mangle]
pub unsafe extern "C" fn fdopendir(fd: c_int) -> *mut libc::DIR {
    if is_ours(fd) {
        return stream(fd);
    }
    // SAFETY: the caller's arguments, unchanged, to libc's own `fdopendir`: it has the same contract as this function.
    unsafe { real!(fdopendir: fn(c_int) -> *mut libc::DIR)(fd) }
}

/// # Safety
/// `dir` is one of ours.
unsafe fn next_entry(dir: *mut libc::DIR) -> *mut libc::dirent64 {
    // SAFETY: registered pointers are live OurDir boxes (contract).
    let dir = unsafe { &mut *dir.cast::<OurDir>() };
    let Some(next) = dir.entries.get(dir.next) else { return std::ptr::null_mut() };
    dir.next += 1;
    let entry = &mut dir.entry;
    entry.d_ino = next.ino.0;
    entry.d_off = dir.next as i64;
    entry.d_reclen = std::mem::size_of::<libc::dirent64>() as u16;
    entry.d_type = dirent_type(next.kind);
    entry.d_name = [0; 256];
    for (slot, &byte) in entry.d_name.iter_mut().zip(next.name.iter().take(255)) {
        *slot = byte as c_char;
    }
    entry
}

// dirent and dirent64 have one layout on 64-bit Linux.
const _: () = assert!(std::mem::size_of::<libc::dirent>() == std::mem::size_of::<libc::dirent64>());

/// # Safety
/// libc's contract for `readdir`.
#[no_mangle]
pub unsafe extern "C" fn readdir(dir: *mut libc::DIR) -> *mut libc::dirent {
    if is_our_dir(dir) {
        // SAFETY: ours.
        return unsafe { next_entry(dir) }.cast();
    }
    // SAFETY: the caller's arguments, unchanged, to libc's own `readdir`: it has the same contract as this function.
    unsafe { real!(readdir: fn(*mut libc::DIR) -> *mut libc::dirent)(dir) }
}

/// # Safety
/// libc's contract for `readdir64`.
#[no_mangle]
pub unsafe extern "C" fn readdir64(dir: *mut libc::DIR) -> *mut libc::dirent64 {
    if is_our_dir(dir) {
        // SAFETY: ours.
        return unsafe { next_entry(dir) };
    }
    // SAFETY: the caller's arguments, unchanged, to libc's own `readdir64`: it has the same contract as this function.
    unsafe { real!(readdir64: fn(*mut libc::DIR) -> *mut libc::dirent64)(dir) }
}

/// # Safety
/// libc's contract for `rewinddir`.
#[no_mangle]
pub unsafe extern "C" fn rewinddir(dir: *mut libc::DIR) {
    if is_our_dir(dir) {
        // SAFETY: registered pointers are live OurDir boxes.
        unsafe { (*dir.cast::<OurDir>()).next = 0 };
        return;
    }
    // SAFETY: the caller's arguments, unchanged, to libc's own `rewinddir`: it has the same contract as this function.
    unsafe { real!(rewinddir: fn(*mut libc::DIR) -> ())(dir) }
}

/// # Safety
/// libc's contract for `dirfd`.
#[no_mangle]
pub unsafe extern "C" fn dirfd(dir: *mut libc::DIR) -> c_int {
    if is_our_dir(dir) {
        // SAFETY: registered pointers are live OurDir boxes.
        return unsafe { (*dir.cast::<OurDir>()).fd };
    }
    // SAFETY: the caller's arguments, unchanged, to libc's own `dirfd`: it has the same contract as this function.
    unsafe { real!(dirfd: fn(*mut libc::DIR) -> c_int)(dir) }
}

/// # Safety
/// libc's contract for `closedir`.
#[no_mangle]
pub unsafe extern "C" fn closedir(dir: *mut libc::DIR) -> c_int {
    let ours = OURS.lock().as_mut().is_some_and(|set| set.remove(&(dir as usize)));
    if ours {
        // SAFETY: it was registered, so it came from Box::into_raw in `stream`.
        let dir = unsafe { Box::from_raw(dir.cast::<OurDir>()) };
        return crate::int(with(|s| s.close_fd(dir.fd).map(|()| 0)));
    }
    // SAFETY: the caller's arguments, unchanged, to libc's own `closedir`: it has the same contract as this function.
    unsafe { real!(closedir: fn(*mut libc::DIR) -> c_int)(dir) }
}
