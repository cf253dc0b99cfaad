//! How much of a file the kernel's page cache holds, by cachestat(2) (Linux 6.5+): the
//! SSD image's share of the host's memory, which `alignfs stat` reports beside the
//! profile's own memory (issue 65: the scrap buffer and the read cache share the RAM).

use std::fs::File;
use std::os::fd::AsRawFd;

/// cachestat's number; system calls added since 5.x have the same number on every
/// architecture but alpha, and the `libc` crate names it only for some.
const SYS_CACHESTAT: libc::c_long = 451;

#[repr(C)]
struct CachestatRange {
    off: u64,
    /// 0: to the end of the file.
    len: u64,
}

#[repr(C)]
#[derive(Default)]
struct Cachestat {
    nr_cache: u64,
    nr_dirty: u64,
    nr_writeback: u64,
    nr_evicted: u64,
    nr_recently_evicted: u64,
}

/// Bytes of `file` in the kernel's page cache; `None` where the kernel cannot say (before
/// 6.5, or a file system that refuses: hugetlbfs).
pub(crate) fn cached_bytes(file: &File) -> Option<u64> {
    let range = CachestatRange { off: 0, len: 0 };
    let mut stat = Cachestat::default();
    // SAFETY: cachestat reads `range` and writes one `struct cachestat` into `stat`; both
    // are live, properly laid out (#[repr(C)], the kernel's u64 fields) and outlive the call.
    let rc = unsafe { libc::syscall(SYS_CACHESTAT, file.as_raw_fd(), &range as *const CachestatRange, &mut stat as *mut Cachestat, 0u32) };
    (rc == 0).then(|| stat.nr_cache.saturating_mul(rustix::param::page_size() as u64))
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};

    #[test]
    fn counts_the_pages_a_read_brought_into_the_cache() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::File::create(&path).unwrap().write_all(&vec![7u8; 1 << 20]).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        file.sync_all().unwrap();
        // Drop the file's pages, then read half of it back.
        rustix::fs::fadvise(&file, 0, None, rustix::fs::Advice::DontNeed).unwrap();
        let Some(after_drop) = super::cached_bytes(&file) else { return }; // kernel before 6.5
        let mut half = vec![0u8; 512 << 10];
        (&file).read_exact(&mut half).unwrap();
        let after_read = super::cached_bytes(&file).unwrap();
        assert!(after_read >= after_drop + (256 << 10) && after_read <= 1 << 20, "{after_drop} then {after_read}");
    }
}
