//! The fast persistent tier: a byte-addressable mapping.
//!
//! Three backings, one interface:
//! - a DAX file or device mapped with `MAP_SHARED_VALIDATE | MAP_SYNC`: stores are made
//!   durable with `clwb` (or `clflushopt`/`clflush`) per 64-byte line and an `sfence`;
//! - a file on tmpfs or any page-cache file system (`MAP_SYNC` refused): a process crash
//!   keeps every completed store, so persisting only has to stop the compiler reordering
//!   stores (a compiler fence);
//! - anonymous memory, for tests and simulation; optionally with every store and persist
//!   recorded in a [`PowerLog`], from which power-loss images are built.
//!
//! Assumption about the media (as for every pmem file system): aligned 8-byte stores are
//! atomic; nothing larger is. Callers guarantee that no two threads touch overlapping
//! bytes at once (page ownership, the journal mutex, the per-file range locks).

use std::fs::OpenOptions;
use std::path::Path;
#[cfg(not(target_arch = "x86_64"))]
use std::sync::atomic::fence;
use std::sync::atomic::{compiler_fence, Ordering};
use std::sync::Arc;

use memmap2::{MmapOptions, MmapRaw};

use super::power_loss::{Event, PowerLog};
use crate::error::{Error, Result};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PersistMode {
    /// DAX with MAP_SYNC: cache-line write-back + fence.
    CacheLineFlush,
    /// Page-cache-backed (tmpfs): a process crash keeps the stores; compiler fence only.
    StoreOrder,
    /// Anonymous memory: gone with the process.
    Volatile,
}

enum Mapping {
    Raw(MmapRaw),
    Sync { ptr: *mut u8, len: usize },
}

pub struct PmemRegion {
    mapping: Mapping,
    len: usize,
    mode: PersistMode,
    line_flush: LineFlush,
    name: String,
    recorder: Option<Arc<PowerLog>>,
    /// The open file whose lock says this process uses the region.
    lock: Option<std::fs::File>,
    /// A page-cache mapping of a file on tmpfs (rather than on a disk's file system).
    on_tmpfs: bool,
}

// SAFETY: the mapping is plain shared memory; concurrent access to disjoint bytes is
// sound, and callers exclude overlapping access (module docs).
unsafe impl Send for PmemRegion {}
// SAFETY: as above.
unsafe impl Sync for PmemRegion {}

impl PmemRegion {
    /// Map `path` (created, or grown, to `create_len` bytes when given), held alone for as
    /// long as the region lives.
    pub fn open(path: &Path, create_len: Option<u64>) -> Result<PmemRegion> {
        PmemRegion::open_locked(path, create_len, false)
    }

    /// Map `path` beside other readers ([`super::claim`]): a writer holds it alone.
    pub fn open_shared(path: &Path) -> Result<PmemRegion> {
        PmemRegion::open_locked(path, None, true)
    }

    fn open_locked(path: &Path, create_len: Option<u64>, shared: bool) -> Result<PmemRegion> {
        let name = path.display().to_string();
        if path.is_dir() {
            return Err(Error::BadPath(path.into(), "is a directory; a fast tier is a file on tmpfs or a DAX file system".into()));
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(create_len.is_some())
            .truncate(false)
            .open(path)
            .map_err(|e| Error::io(format!("open {name}"), e))?;
        if !file.metadata().map_err(|e| Error::io(format!("stat {name}"), e))?.is_file() {
            return Err(Error::BadPath(path.into(), "is not a regular file; a fast tier is a file on tmpfs or a DAX file system".into()));
        }
        // Locked before anything grows it: a region another process holds is left as it is.
        super::claim::hold(&file, path, shared)?;
        if let Some(len) = create_len {
            let current = file.metadata().map_err(|e| Error::io(format!("stat {name}"), e))?.len();
            if current < len {
                file.set_len(len).map_err(|e| Error::io(format!("size fast tier {name}"), e))?;
            }
        }
        let len = file.metadata().map_err(|e| Error::io(format!("stat {name}"), e))?.len();
        let len = usize::try_from(len).map_err(|_| Error::InvalidArgument(format!("{name} is too large to map")))?;
        if len == 0 {
            return Err(Error::InvalidArgument(format!("fast tier {name} is empty")));
        }
        let mut region = match map_sync(&file, len) {
            Some(ptr) => PmemRegion::new(Mapping::Sync { ptr, len }, len, PersistMode::CacheLineFlush, name),
            None => {
                let raw = MmapOptions::new().len(len).map_raw(&file).map_err(|e| Error::io(format!("mmap {name}"), e))?;
                let mut region = PmemRegion::new(Mapping::Raw(raw), len, PersistMode::StoreOrder, name);
                region.on_tmpfs = rustix::fs::fstatfs(&file).is_ok_and(|fs| fs.f_type as u64 == libc::TMPFS_MAGIC as u64);
                region
            }
        };
        region.lock = Some(file);
        Ok(region)
    }

    /// Anonymous, zeroed memory (tests, simulation).
    pub fn anonymous(len_bytes: u64) -> Result<PmemRegion> {
        let len = len_bytes as usize;
        let map = MmapOptions::new().len(len).map_anon().map_err(|e| Error::io("mmap anonymous fast tier", e))?;
        Ok(PmemRegion::new(Mapping::Raw(MmapRaw::from(map)), len, PersistMode::Volatile, "anonymous".into()))
    }

    /// Back `len` bytes at `offset` with memory now, as writes to them would (anonymous
    /// memory reads as zeros either way; bytes already written are kept). The caller
    /// touches ahead of where it will write, so that its writes do not take the page
    /// faults. Fails where the kernel lacks `MADV_POPULATE_WRITE` (before 5.14).
    pub fn prefault(&self, offset: u64, len: u64) -> std::io::Result<()> {
        assert!(offset + len <= self.len as u64, "prefault inside the region");
        match &self.mapping {
            Mapping::Raw(raw) => raw.advise_range(memmap2::Advice::PopulateWrite, offset as usize, len as usize),
            Mapping::Sync { .. } => Ok(()),
        }
    }

    /// Anonymous memory whose stores and persists are recorded in `log`, in the same order
    /// as the SSD's writes and flushes, for power-loss simulation.
    pub fn recorded(len_bytes: u64, log: Arc<PowerLog>) -> Result<PmemRegion> {
        let mut region = PmemRegion::anonymous(len_bytes)?;
        region.name = "anonymous, recorded for power-loss simulation".into();
        region.recorder = Some(log);
        Ok(region)
    }

    fn new(mapping: Mapping, len: usize, mode: PersistMode, name: String) -> PmemRegion {
        PmemRegion { mapping, len, mode, line_flush: LineFlush::detect(), name, recorder: None, lock: None, on_tmpfs: false }
    }

    pub fn len_bytes(&self) -> u64 {
        self.len as u64
    }

    pub fn mode(&self) -> PersistMode {
        self.mode
    }

    pub fn describe(&self) -> String {
        let how = match self.mode {
            PersistMode::CacheLineFlush => format!("DAX MAP_SYNC, persist by {:?}", self.line_flush),
            PersistMode::StoreOrder if self.on_tmpfs => "page-cache mapping (tmpfs), persist by store ordering".into(),
            PersistMode::StoreOrder => "page-cache mapping of a file on disk, persist by store ordering".into(),
            PersistMode::Volatile => "anonymous memory (volatile)".into(),
        };
        format!("{} ({} bytes, {how})", self.name, self.len)
    }

    fn base(&self) -> *mut u8 {
        match &self.mapping {
            Mapping::Raw(raw) => raw.as_mut_ptr(),
            Mapping::Sync { ptr, .. } => *ptr,
        }
    }

    fn check(&self, offset: u64, len: usize) -> usize {
        let end = offset.checked_add(len as u64).expect("fast-tier offset overflow");
        assert!(end <= self.len as u64, "fast-tier access {offset}+{len} beyond {}", self.len);
        offset as usize
    }

    /// Copy `data` to `offset`. Not yet persistent: call [`PmemRegion::persist`].
    pub fn write(&self, offset: u64, data: &[u8]) {
        let start = self.check(offset, data.len());
        // SAFETY: the range is inside the mapping (checked) and callers own it exclusively.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.base().add(start), data.len()) }
        if let Some(log) = &self.recorder {
            log.record(Event::FastStore { offset, bytes: data.to_vec() });
        }
    }

    /// Fill `len` bytes at `offset` with zeros. Not yet persistent.
    pub fn zero(&self, offset: u64, len: usize) {
        let start = self.check(offset, len);
        // SAFETY: as in `write`.
        unsafe { std::ptr::write_bytes(self.base().add(start), 0, len) }
        if let Some(log) = &self.recorder {
            log.record(Event::FastStore { offset, bytes: vec![0; len] });
        }
    }

    pub fn read(&self, offset: u64, out: &mut [u8]) {
        let start = self.check(offset, out.len());
        // SAFETY: the range is inside the mapping; no writer overlaps (module docs).
        unsafe { std::ptr::copy_nonoverlapping(self.base().add(start), out.as_mut_ptr(), out.len()) }
    }

    /// Make the bytes written to `offset..offset+len` durable, and order them before any
    /// later store.
    pub fn persist(&self, offset: u64, len: usize) {
        if let Some(log) = &self.recorder {
            log.record(Event::FastPersist { offset, len: len as u64 });
        }
        match self.mode {
            PersistMode::CacheLineFlush => {
                if len > 0 {
                    let start = self.check(offset, len);
                    let mut line = start & !63;
                    while line < start + len {
                        // SAFETY: `line` lies within the mapping (rounded down from a checked start).
                        unsafe { self.line_flush.flush(self.base().add(line)) };
                        line += 64;
                    }
                }
                #[cfg(target_arch = "x86_64")]
                // SAFETY: sfence has no preconditions.
                unsafe {
                    std::arch::x86_64::_mm_sfence()
                };
                #[cfg(not(target_arch = "x86_64"))]
                fence(Ordering::SeqCst);
            }
            // A process crash cannot undo a store that has executed: the store buffer
            // drains into the page cache whatever happens to the process. So only the
            // compiler may reorder stores here, and a compiler fence stops it; a CPU fence
            // would add nothing to what a crash keeps.
            PersistMode::StoreOrder | PersistMode::Volatile => compiler_fence(Ordering::SeqCst),
        }
    }

    /// `write` + `persist`.
    pub fn write_persist(&self, offset: u64, data: &[u8]) {
        self.write(offset, data);
        self.persist(offset, data.len());
    }
}

impl super::ByteTier for PmemRegion {
    fn len_bytes(&self) -> u64 {
        PmemRegion::len_bytes(self)
    }
    fn describe(&self) -> String {
        PmemRegion::describe(self)
    }
    fn write(&self, offset: u64, data: &[u8]) {
        PmemRegion::write(self, offset, data)
    }
    fn zero(&self, offset: u64, len: usize) {
        PmemRegion::zero(self, offset, len)
    }
    fn read(&self, offset: u64, out: &mut [u8]) {
        PmemRegion::read(self, offset, out)
    }
    fn persist(&self, offset: u64, len: usize) {
        PmemRegion::persist(self, offset, len)
    }
    fn write_persist(&self, offset: u64, data: &[u8]) {
        PmemRegion::write_persist(self, offset, data)
    }
}

impl Drop for PmemRegion {
    fn drop(&mut self) {
        if let Mapping::Sync { ptr, len } = self.mapping {
            // SAFETY: ptr/len came from a successful mmap in `map_sync` and are unmapped once.
            let _ = unsafe { rustix::mm::munmap(ptr.cast(), len) };
        }
    }
}

/// Try a `MAP_SYNC` mapping; `None` where the file system is not DAX (tmpfs, ext4).
fn map_sync(file: &std::fs::File, len: usize) -> Option<*mut u8> {
    use rustix::mm::{mmap, MapFlags, ProtFlags};
    // SAFETY: a fresh shared mapping of a file we hold open; no existing memory is replaced.
    let mapped =
        unsafe { mmap(std::ptr::null_mut(), len, ProtFlags::READ | ProtFlags::WRITE, MapFlags::SHARED_VALIDATE | MapFlags::SYNC, file, 0) };
    mapped.ok().map(|p| p.cast::<u8>())
}

/// The best cache-line write-back instruction this CPU has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LineFlush {
    Clwb,
    ClflushOpt,
    Clflush,
}

impl LineFlush {
    fn detect() -> LineFlush {
        #[cfg(target_arch = "x86_64")]
        {
            let ebx = std::arch::x86_64::__cpuid_count(7, 0).ebx;
            if ebx & (1 << 24) != 0 {
                return LineFlush::Clwb;
            }
            if ebx & (1 << 23) != 0 {
                return LineFlush::ClflushOpt;
            }
        }
        LineFlush::Clflush
    }

    /// # Safety
    /// `line` must point into mapped memory.
    unsafe fn flush(self, line: *mut u8) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the caller guarantees `line` is mapped; the instruction chosen was
        // detected by cpuid; none of them writes memory visible to Rust.
        unsafe {
            match self {
                LineFlush::Clwb => std::arch::asm!("clwb [{0}]", in(reg) line, options(nostack, preserves_flags)),
                LineFlush::ClflushOpt => {
                    std::arch::asm!("clflushopt [{0}]", in(reg) line, options(nostack, preserves_flags))
                }
                LineFlush::Clflush => std::arch::x86_64::_mm_clflush(line),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = line;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tmpfs_file_keeps_bytes_across_mappings() {
        let dir = tempfile::tempdir_in("/dev/shm").unwrap();
        let path = dir.path().join("fast");
        {
            let region = PmemRegion::open(&path, Some(1 << 20)).unwrap();
            assert_eq!(region.mode(), PersistMode::StoreOrder);
            region.write_persist(4096, b"durable");
        }
        let region = PmemRegion::open(&path, None).unwrap();
        let mut out = [0u8; 7];
        region.read(4096, &mut out);
        assert_eq!(&out, b"durable");
    }

    #[test]
    fn persist_with_line_flush_runs() {
        // Exercise the flush instruction on ordinary memory: it must not fault.
        let region = PmemRegion::anonymous(8192).unwrap();
        region.write(100, &[1; 300]);
        // SAFETY: the pointer lies inside the anonymous mapping.
        unsafe { region.line_flush.flush(region.base().add(64)) };
        region.persist(100, 300);
    }
}
