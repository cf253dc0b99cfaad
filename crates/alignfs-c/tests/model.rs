#![allow(clippy::unwrap_used)]
//! The model-based test through the C functions: random writes (1 B–2 MiB, vectored too),
//! reads, truncates, fsyncs, descriptor reopens and volume reopens, compared byte for
//! byte with an in-memory reference.

use std::ffi::CString;
use std::ptr;

use alignfs::paths::{format_paths, DeviceSpec};
use alignfs::test_support::{scaled, seed};
use alignfs::FormatOptions;
use alignfs_c::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

struct Devices {
    _dirs: (tempfile::TempDir, tempfile::TempDir),
    fast: CString,
    ssd: CString,
}

fn devices() -> Devices {
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let shm = tempfile::tempdir_in("/dev/shm").unwrap();
    let fast = DeviceSpec { path: shm.path().join("fast"), size: Some(8 << 20) };
    let ssd = DeviceSpec { path: dir.path().join("ssd.img"), size: Some(128 << 20) };
    let (_, volume) = format_paths(Some(&fast), std::slice::from_ref(&ssd), None, &FormatOptions::default(), None).unwrap();
    volume.close().unwrap();
    let c = |p: &std::path::Path| CString::new(p.to_str().unwrap()).unwrap();
    Devices { fast: c(&fast.path), ssd: c(&ssd.path), _dirs: (dir, shm) }
}

fn open_volume(d: &Devices) -> *mut AlignfsVolume {
    let mut volume = ptr::null_mut();
    // SAFETY: valid C strings and out pointer.
    assert_eq!(unsafe { alignfs_volume_open(d.fast.as_ptr(), d.ssd.as_ptr(), &mut volume) }, 0);
    volume
}

fn open_file(volume: *mut AlignfsVolume, path: &CString) -> i32 {
    // SAFETY: a live volume and a C string.
    let fd = unsafe { alignfs_open(volume, path.as_ptr(), libc::O_RDWR | libc::O_CREAT, 0o644) };
    assert!(fd >= FD_BASE, "open: {fd}");
    fd
}

fn size_of(volume: *mut AlignfsVolume, fd: i32) -> u64 {
    // SAFETY: zeroed stat is valid; live volume.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { alignfs_fstat(volume, fd, &mut st) }, 0);
    st.st_size as u64
}

#[test]
fn random_operations_through_the_c_api_match_the_model() {
    let seed = seed("alignfs-c model");
    let mut rng = StdRng::seed_from_u64(seed);
    let d = devices();
    let mut volume = open_volume(&d);
    let paths: Vec<CString> = (0..3).map(|i| CString::new(format!("/f{i}")).unwrap()).collect();
    let mut fds: Vec<i32> = paths.iter().map(|p| open_file(volume, p)).collect();
    let mut model: Vec<Vec<u8>> = vec![Vec::new(); 3];
    for step in 0..scaled(300) {
        let f = rng.random_range(0..3);
        let (fd, reference) = (fds[f], &mut model[f]);
        match rng.random_range(0..100) {
            0..=49 => {
                let len = match rng.random_range(0..4) {
                    0 => rng.random_range(1..=100),
                    1 => rng.random_range(1..=8192),
                    2 => 32 << 10,
                    _ => rng.random_range(1..=2 << 20),
                };
                let offset = rng.random_range(0..=reference.len() as u64 + 70_000);
                let data: Vec<u8> = (0..len).map(|_| rng.random()).collect();
                let written = if rng.random_bool(0.3) {
                    let (a, b) = data.split_at(len / 2);
                    let iov = [
                        libc::iovec { iov_base: a.as_ptr() as *mut _, iov_len: a.len() },
                        libc::iovec { iov_base: b.as_ptr() as *mut _, iov_len: b.len() },
                    ];
                    // SAFETY: the iovecs name live buffers.
                    unsafe { alignfs_pwritev(volume, fd, iov.as_ptr(), 2, offset as i64) }
                } else {
                    // SAFETY: a live buffer of `len` bytes.
                    unsafe { alignfs_pwrite(volume, fd, data.as_ptr().cast(), len, offset as i64) }
                };
                assert_eq!(written, len as isize, "step {step}: pwrite");
                let end = offset as usize + len;
                if reference.len() < end {
                    reference.resize(end, 0);
                }
                reference[offset as usize..end].copy_from_slice(&data);
            }
            50..=69 => {
                let offset = rng.random_range(0..=reference.len() as u64 + 10);
                let mut buf = vec![0u8; rng.random_range(1..300_000)];
                // SAFETY: a live buffer.
                let n = unsafe { alignfs_pread(volume, fd, buf.as_mut_ptr().cast(), buf.len(), offset as i64) };
                let expected = reference.get(offset as usize..).map_or(&[][..], |r| &r[..r.len().min(buf.len())]);
                assert_eq!(&buf[..n as usize], expected, "step {step}: pread at {offset}");
            }
            70..=77 => {
                let size = rng.random_range(0..=reference.len() as u64 + 50_000);
                // SAFETY: live volume.
                assert_eq!(unsafe { alignfs_ftruncate(volume, fd, size as i64) }, 0);
                reference.resize(size as usize, 0);
            }
            // SAFETY: live volume.
            78..=85 => assert_eq!(unsafe { alignfs_fsync(volume, fd) }, 0),
            86..=93 => {
                // SAFETY: live volume.
                assert_eq!(unsafe { alignfs_close(volume, fd) }, 0);
                fds[f] = open_file(volume, &paths[f]);
            }
            _ => {
                // SAFETY: the handle is not used after close.
                assert_eq!(unsafe { alignfs_volume_close(volume) }, 0);
                volume = open_volume(&d);
                fds = paths.iter().map(|p| open_file(volume, p)).collect();
            }
        }
        assert_eq!(size_of(volume, fds[f]), model[f].len() as u64, "step {step}: size");
    }
    for (fd, reference) in fds.iter().zip(&model) {
        let mut whole = vec![0u8; reference.len()];
        // SAFETY: a live buffer.
        let n = unsafe { alignfs_pread(volume, *fd, whole.as_mut_ptr().cast(), whole.len(), 0) };
        assert_eq!(n as usize, reference.len());
        assert!(whole == *reference, "final contents differ");
    }
    // SAFETY: not used afterwards.
    assert_eq!(unsafe { alignfs_volume_close(volume) }, 0);
}

#[test]
fn bad_arguments_are_errors_not_crashes() {
    let d = devices();
    let volume = open_volume(&d);
    let path = CString::new("/f").unwrap();
    // SAFETY: each call passes what the contract allows (nulls included: checked).
    unsafe {
        assert_eq!(alignfs_open(ptr::null(), path.as_ptr(), libc::O_RDONLY, 0), -libc::EFAULT);
        assert_eq!(alignfs_open(volume, ptr::null(), libc::O_RDONLY, 0), -libc::EFAULT);
        let fd = alignfs_open(volume, path.as_ptr(), libc::O_RDWR | libc::O_CREAT, 0o600);
        assert_eq!(alignfs_pwrite(volume, fd, ptr::null(), 10, 0), -libc::EFAULT as isize);
        assert_eq!(alignfs_pwrite(volume, fd, ptr::null(), 0, 0), 0);
        assert_eq!(alignfs_pwrite(volume, fd, b"x".as_ptr().cast(), 1, -1), -libc::EINVAL as isize);
        assert_eq!(alignfs_lseek(volume, fd, -1, libc::SEEK_SET), -i64::from(libc::EINVAL));
        assert_eq!(alignfs_lseek(volume, fd, 0, 99), -i64::from(libc::EINVAL));
        assert_eq!(alignfs_preadv(volume, fd, ptr::null(), -1, 0), -libc::EINVAL as isize);
        assert_eq!(alignfs_open(volume, path.as_ptr(), libc::O_RDWR | libc::O_CREAT | libc::O_EXCL, 0o600), -libc::EEXIST);
        let dir = CString::new("/f/sub").unwrap();
        assert_eq!(alignfs_mkdir(volume, dir.as_ptr(), 0o755), -libc::ENOTDIR);
        let root = CString::new("/").unwrap();
        assert_eq!(alignfs_unlink(volume, root.as_ptr()), -libc::EINVAL);
        let bad = [0xffu8, 0];
        assert_eq!(alignfs_unlink(volume, bad.as_ptr().cast()), -libc::EINVAL);
        assert_eq!(alignfs_readdir(ptr::null_mut(), ptr::null_mut()), -libc::EFAULT);
        alignfs_closedir(ptr::null_mut());
        assert_eq!(alignfs_volume_close(ptr::null_mut()), -libc::EFAULT);
        assert_eq!(alignfs_volume_close(volume), 0);
    }
}
