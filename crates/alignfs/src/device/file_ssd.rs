//! The SSD as a block device or a preallocated image file: writes with O_DIRECT through
//! the IO engine; reads either O_DIRECT (through the engine) or buffered through the
//! kernel's cache of the backing file (a second, cached descriptor; the kernel keeps
//! direct writes and cached reads coherent).

use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom};
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustix::io::ReadWriteFlags;

pub use super::io_engine::IoBackend;
use super::io_engine::IoEngine;
use super::{BlockDevice, IoRequest, IoTicket};
use crate::error::{Error, Result};

/// How to open an SSD.
#[derive(Clone, Debug)]
pub struct SsdOptions {
    /// Create (or grow) an image file of this many bytes, preallocated with fallocate.
    pub create_len: Option<u64>,
    pub io_workers: usize,
    pub split_bytes: u64,
    /// `None` = io_uring when available, else the thread pool.
    pub backend: Option<IoBackend>,
    /// Readers (`stat`, `fsck`) share the device; a writer holds it alone, so two daemons
    /// can never serve one volume.
    pub shared: bool,
}

pub struct FileSsd {
    path: PathBuf,
    direct: Arc<File>,
    cached: File,
    len: u64,
    /// `None` for an image in memory, whose IO runs in the caller's thread.
    engine: Option<IoEngine>,
    write_through: bool,
    is_block_device: bool,
    /// An image on tmpfs: the kernel's cache is the image, so every read is a copy.
    in_memory: bool,
}

impl FileSsd {
    pub fn open(path: &Path, options: &SsdOptions) -> Result<FileSsd> {
        let name = path.display().to_string();
        if path.is_dir() {
            return Err(Error::BadPath(path.into(), "is a directory; an SSD is a block device or an image file".into()));
        }
        if options.create_len.is_some() {
            if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
                std::fs::create_dir_all(parent).map_err(|e| Error::io(format!("create directory {}", parent.display()), e))?;
            }
        }
        let mut cached = OpenOptions::new()
            .read(true)
            .write(true)
            .create(options.create_len.is_some())
            .truncate(false)
            .open(path)
            .map_err(|e| Error::io(format!("open SSD {name}"), e))?;
        let metadata = cached.metadata().map_err(|e| Error::io(format!("stat SSD {name}"), e))?;
        let is_block_device = metadata.file_type().is_block_device();
        if !is_block_device && !metadata.is_file() {
            return Err(Error::BadPath(path.into(), "the SSD must be a block device or a regular file".into()));
        }
        // Locked before anything grows it: a device another process holds is left as it is.
        super::claim::hold(&cached, path, options.shared)?;
        if let Some(len) = options.create_len {
            preallocate(&cached, path, len)?;
        }
        let direct = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
            .map_err(|e| Error::io(format!("open SSD {name} with O_DIRECT"), e))?;
        let len = cached.seek(SeekFrom::End(0)).map_err(|e| Error::io(format!("size SSD {name}"), e))?;
        let write_through = is_block_device && cache_is_write_through(metadata.rdev());
        let in_memory = rustix::fs::fstatfs(&cached).is_ok_and(|fs| fs.f_type as u64 == libc::TMPFS_MAGIC as u64);
        let direct = Arc::new(direct);
        let engine = (!in_memory).then(|| IoEngine::start(Arc::clone(&direct), options.io_workers, options.split_bytes, options.backend));
        Ok(FileSsd { path: path.into(), direct, cached, len, engine, write_through, is_block_device, in_memory })
    }
}

/// Create or grow an image file, reserve its blocks and write the new part once with
/// zeros. Reserving alone (fallocate) leaves *unwritten* extents, and the first O_DIRECT
/// write to each would make the host file system convert it and commit that change at the
/// next fdatasync: a metadata commit on every durable write to fresh space. Writing the
/// image once (about 1.5 GiB/s here) takes that off the fast path for good.
fn preallocate(file: &File, path: &Path, len: u64) -> Result<()> {
    let name = path.display().to_string();
    let metadata = file.metadata().map_err(|e| Error::io(format!("stat {name}"), e))?;
    if metadata.file_type().is_block_device() {
        return Ok(());
    }
    let old_len = metadata.len();
    if old_len >= len {
        return Ok(());
    }
    rustix::fs::fallocate(file, rustix::fs::FallocateFlags::empty(), 0, len)
        .map_err(|e| Error::io(format!("preallocate {len} bytes for {name}"), e.into()))?;
    initialize(path, old_len / 4096 * 4096, len)
}

fn initialize(path: &Path, from: u64, to: u64) -> Result<()> {
    let name = path.display().to_string();
    let direct = OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .map_err(|e| Error::io(format!("open {name} with O_DIRECT"), e))?;
    let zeros = super::AlignedBuf::zeroed(4 << 20);
    let mut at = from;
    while at < to {
        let len = (zeros.len() as u64).min(to - at) as usize;
        let len = len.div_ceil(4096) * 4096;
        direct.write_all_at(&zeros[..len], at).map_err(|e| Error::io(format!("initialize {name} at {at}"), e))?;
        at += len as u64;
    }
    direct.sync_all().map_err(|e| Error::io(format!("sync {name}"), e))
}

/// `/sys/dev/block/MAJ:MIN/queue/write_cache` (or the parent's, for a partition).
fn cache_is_write_through(rdev: u64) -> bool {
    let (major, minor) = (libc::major(rdev), libc::minor(rdev));
    let base = PathBuf::from(format!("/sys/dev/block/{major}:{minor}"));
    [base.join("queue/write_cache"), base.join("../queue/write_cache")]
        .iter()
        .find_map(|p| std::fs::read_to_string(p).ok())
        .is_some_and(|mode| mode.trim() == "write through")
}

impl BlockDevice for FileSsd {
    fn len_bytes(&self) -> u64 {
        self.len
    }

    fn submit(&self, batch: Vec<IoRequest>) -> IoTicket {
        match &self.engine {
            Some(engine) => engine.submit(batch),
            None => super::io_engine::perform_inline(&self.direct, batch),
        }
    }

    fn read_buffered(&self, offset_bytes: u64, buf: &mut [u8]) -> Result<()> {
        self.cached
            .read_exact_at(buf, offset_bytes)
            .map_err(|e| Error::io(format!("read {} bytes at {offset_bytes} of {}", buf.len(), self.path.display()), e))
    }

    fn read_cached(&self, offset_bytes: u64, buf: &mut [u8]) -> Result<bool> {
        // tmpfs refuses RWF_NOWAIT, and never waits for a device.
        if self.in_memory {
            return self.read_buffered(offset_bytes, buf).map(|()| true);
        }
        // RWF_NOWAIT: the kernel copies what its cache holds and stops at the first byte
        // it would have to fetch. A short read counts as a miss; the caller reads again,
        // blocking.
        let len = buf.len();
        match rustix::io::preadv2(&self.cached, &mut [std::io::IoSliceMut::new(buf)], offset_bytes, ReadWriteFlags::NOWAIT) {
            Ok(n) => Ok(n == len),
            Err(rustix::io::Errno::AGAIN | rustix::io::Errno::OPNOTSUPP | rustix::io::Errno::INTR) => Ok(false),
            Err(e) => Err(Error::io(format!("read {len} bytes at {offset_bytes} of {}", self.path.display()), e.into())),
        }
    }

    fn prefetch(&self, offset_bytes: u64, len: u64) {
        // WILLNEED queues the reads and returns; a failure only loses the head start.
        if let Err(e) = rustix::fs::fadvise(&self.cached, offset_bytes, std::num::NonZeroU64::new(len), rustix::fs::Advice::WillNeed) {
            tracing::debug!("prefetch {len} bytes at {offset_bytes} of {}: {e}", self.path.display());
        }
    }

    fn flush(&self) -> Result<()> {
        if !self.needs_flush() {
            return Ok(());
        }
        // fdatasync on the O_DIRECT descriptor: for an image file it also commits the
        // file system's metadata for blocks written for the first time.
        self.direct.sync_data().map_err(|e| Error::io(format!("flush {}", self.path.display()), e))
    }

    fn needs_flush(&self) -> bool {
        !self.write_through
    }

    fn cached_bytes(&self) -> Option<u64> {
        // A tmpfs image is memory, not a cache of the device.
        if self.in_memory {
            return None;
        }
        super::cachestat::cached_bytes(&self.cached)
    }

    fn describe(&self) -> String {
        format!(
            "{} ({}, {} bytes, {} IO, cache {})",
            self.path.display(),
            if self.is_block_device {
                "block device"
            } else if self.in_memory {
                "image file in memory"
            } else {
                "image file"
            },
            self.len,
            self.engine.as_ref().map_or("inline".to_string(), |engine| format!("{:?}", engine.backend())),
            if self.write_through { "write-through: no flushes" } else { "write-back: flushed before metadata exposes new blocks" }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{run_batch, AlignedBuf, IoOp};

    fn round_trip(backend: IoBackend) {
        round_trip_in(&tempfile::tempdir().unwrap(), backend);
    }

    fn round_trip_in(dir: &tempfile::TempDir, backend: IoBackend) -> FileSsd {
        let path = dir.path().join("ssd.img");
        let options =
            SsdOptions { create_len: Some(1 << 20), io_workers: 2, split_bytes: 32 * 1024, backend: Some(backend), shared: false };
        let ssd = FileSsd::open(&path, &options).unwrap();
        let batch: Vec<IoRequest> = (0..8u8)
            .map(|i| {
                let mut buf = AlignedBuf::zeroed(32 * 1024);
                buf.fill(i + 1);
                IoRequest { op: IoOp::Write, offset_bytes: u64::from(i) * 32 * 1024, buf }
            })
            .collect();
        run_batch(&ssd, batch).unwrap();
        ssd.flush().unwrap();
        let reads =
            (0..8u64).map(|i| IoRequest { op: IoOp::Read, offset_bytes: i * 32 * 1024, buf: AlignedBuf::zeroed(32 * 1024) }).collect();
        for (i, buf) in run_batch(&ssd, reads).unwrap().iter().enumerate() {
            assert!(buf.iter().all(|&b| b == i as u8 + 1));
        }
        let mut cached = [0u8; 10];
        ssd.read_buffered(32 * 1024 + 5, &mut cached).unwrap();
        assert_eq!(cached, [2; 10]);
        // The page just read is in the kernel's cache; a read without waiting finds it.
        let mut again = [0u8; 10];
        assert!(ssd.read_cached(32 * 1024 + 5, &mut again).unwrap());
        assert_eq!(again, [2; 10]);
        // A direct write drops the cached page: the next cached read misses or sees the
        // new bytes, never the old ones.
        let mut buf = AlignedBuf::zeroed(32 * 1024);
        buf.fill(9);
        run_batch(&ssd, vec![IoRequest { op: IoOp::Write, offset_bytes: 32 * 1024, buf }]).unwrap();
        let mut after = [0u8; 10];
        if ssd.read_cached(32 * 1024 + 5, &mut after).unwrap() {
            assert_eq!(after, [9; 10]);
        }
        // Beyond the end: an error, not a panic or a hang.
        let past = vec![IoRequest { op: IoOp::Read, offset_bytes: 1 << 20, buf: AlignedBuf::zeroed(4096) }];
        assert!(run_batch(&ssd, past).is_err());
        ssd
    }

    /// An image on tmpfs: IO in the caller's thread, and every read counts as cached.
    #[test]
    fn in_memory_round_trip() {
        let dir = tempfile::tempdir_in("/dev/shm").unwrap();
        let ssd = round_trip_in(&dir, IoBackend::Uring);
        assert!(ssd.describe().contains("image file in memory") && ssd.describe().contains("inline IO"), "{}", ssd.describe());
        let mut cached = [0u8; 10];
        assert!(ssd.read_cached(7 * 32 * 1024, &mut cached).unwrap());
        assert_eq!(cached, [8; 10]);
        let on_disk = round_trip_in(&tempfile::tempdir().unwrap(), IoBackend::Uring);
        assert!(!on_disk.describe().contains("in memory"), "{}", on_disk.describe());
        // The image in memory is not a cache of the device; the one on disk has pages
        // cached by the buffered read above (kernels before 6.5 cannot say).
        assert_eq!(ssd.cached_bytes(), None);
        if let Some(cached) = on_disk.cached_bytes() {
            assert!(cached >= 4096, "{cached}");
        }
    }

    #[test]
    fn uring_round_trip() {
        round_trip(IoBackend::Uring);
    }

    #[test]
    fn thread_pool_round_trip() {
        round_trip(IoBackend::ThreadPool);
    }
}
