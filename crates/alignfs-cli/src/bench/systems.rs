//! The systems a cell runs on: a volume of one profile in-process, a plain file, and the
//! device limit (O_DIRECT writes rounded out to 4 KiB).

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use alignfs::device::{AlignedBuf, IoBackend};
use alignfs::paths::{format_paths, open_paths, DeviceSpec};
use alignfs::profile::DeviceKind;
use alignfs::{FormatOptions, Geometry, Ino, Profile, ReadMode, Volume, VolumeOptions};
use anyhow::{Context, Result};

use super::counters::tracked;

pub(super) trait System {
    fn name(&self) -> &str;
    fn write(&mut self, offset: u64, data: &[u8]) -> Result<()>;
    fn read(&mut self, offset: u64, out: &mut [u8]) -> Result<()>;
    fn sync(&mut self) -> Result<()>;
    /// Drop cached copies of this system's data before a cell.
    fn drop_caches(&mut self) {}
    /// The engine's tracked counters (alignfs volumes only).
    fn counters(&self) -> Option<Vec<u64>> {
        None
    }
}

pub(super) fn drop_file_cache(path: &Path) {
    if let Ok(file) = File::open(path) {
        let _ = fadvise_dontneed(&file);
    }
}

pub(super) fn fadvise_dontneed(file: &File) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: plain syscall on a descriptor we own; no memory is passed.
    let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::from_raw_os_error(rc))
    }
}

/// Where and how large the benchmark's volumes are.
pub(super) struct Placement {
    pub(super) dir: PathBuf,
    pub(super) fast_dir: PathBuf,
    pub(super) ssd_bytes: u64,
    pub(super) fast_bytes: u64,
    pub(super) split_bytes: u32,
    pub(super) io_workers: u32,
}

/// A volume of one profile, in-process. Its files: the SSD image in `--dir`, the fast
/// tier (or NVM, or the device's DRAM) in `--fast-dir`, the KV store beside the image.
pub(super) struct AlignfsSystem {
    pub(super) profile: Profile,
    pub(super) volume: Option<Volume>,
    pub(super) ino: Ino,
    pub(super) fast: PathBuf,
    pub(super) ssd: PathBuf,
}

impl AlignfsSystem {
    pub(super) fn format(profile: Profile, at: &Placement) -> Result<Self> {
        let name = profile.name();
        let fast = at.fast_dir.join(format!("{name}-fast"));
        let ssd = at.dir.join(format!("{name}-ssd.img"));
        // The byte profile's device DRAM is sized by the device (its write log); the
        // others' fast tier by --fast-size.
        let fast_spec = match profile.devices() {
            DeviceKind::MemorySemanticSsd => Some(DeviceSpec { path: fast.clone(), size: None }),
            DeviceKind::FastTierAndSsd => Some(DeviceSpec { path: fast.clone(), size: Some(at.fast_bytes) }),
            _ => None,
        };
        let ssd_spec = DeviceSpec { path: ssd.clone(), size: Some(at.ssd_bytes) };
        let geometry = Geometry { split_bytes: at.split_bytes, io_workers: at.io_workers, ..profile.default_geometry() };
        let options = FormatOptions { geometry, profile, force: true, ..FormatOptions::default() };
        let (_, volume) = format_paths(fast_spec.as_ref(), std::slice::from_ref(&ssd_spec), None, &options, None::<IoBackend>)
            .with_context(|| format!("format a {name} volume in {}", at.dir.display()))?;
        volume.close()?;
        let mut system = AlignfsSystem { profile, volume: None, ino: Ino::ROOT, fast, ssd };
        system.reopen(ReadMode::Buffered)?;
        system.ino = system.volume().create_file(Ino::ROOT, b"bench.dat", 0o644, 0, 0)?.ino;
        Ok(system)
    }

    /// Close the volume and remove its files.
    pub(super) fn remove(mut self) -> Result<()> {
        if let Some(volume) = self.volume.take() {
            volume.close()?;
        }
        let _ = std::fs::remove_file(&self.fast);
        let _ = std::fs::remove_file(&self.ssd);
        let mut kv = self.ssd.clone().into_os_string();
        kv.push(".kv");
        let _ = std::fs::remove_dir_all(kv);
        Ok(())
    }

    pub(super) fn volume(&self) -> &Volume {
        self.volume.as_ref().expect("volume is open")
    }

    pub(super) fn reopen(&mut self, read_mode: ReadMode) -> Result<()> {
        if let Some(volume) = self.volume.take() {
            volume.close()?;
        }
        self.volume = Some(open_paths(&self.fast, &self.ssd, VolumeOptions { read_mode, ..VolumeOptions::default() }, None)?);
        Ok(())
    }
}

impl System for AlignfsSystem {
    fn name(&self) -> &str {
        self.profile.name()
    }
    fn write(&mut self, offset: u64, data: &[u8]) -> Result<()> {
        self.volume().write(self.ino, offset, data)?;
        Ok(())
    }
    fn read(&mut self, offset: u64, out: &mut [u8]) -> Result<()> {
        self.volume().read(self.ino, offset, out)?;
        Ok(())
    }
    fn sync(&mut self) -> Result<()> {
        self.volume().fsync(self.ino)?;
        Ok(())
    }
    fn drop_caches(&mut self) {
        self.volume().drop_clean_pages();
        drop_file_cache(&self.ssd);
    }
    fn counters(&self) -> Option<Vec<u64>> {
        Some(tracked(self.volume()))
    }
}

/// The systems: one volume per profile, then the plain file and the device limit.
pub(super) struct Systems {
    pub(super) volumes: Vec<AlignfsSystem>,
    pub(super) plain: PlainFile,
    pub(super) limit: DeviceLimit,
}

impl Systems {
    pub(super) fn all(&mut self) -> Vec<&mut dyn System> {
        let mut all: Vec<&mut dyn System> = self.volumes.iter_mut().map(|v| v as &mut dyn System).collect();
        all.push(&mut self.plain);
        all.push(&mut self.limit);
        all
    }

    /// A fresh volume per profile, a plain file and a preallocated device-limit file of
    /// `file_size` bytes, in `at.dir`.
    pub(super) fn create(profiles: &[Profile], at: &Placement, file_size: u64) -> Result<Self> {
        let mut volumes = Vec::with_capacity(profiles.len());
        for &profile in profiles {
            volumes.push(AlignfsSystem::format(profile, at)?);
        }
        let plain_path = at.dir.join("plain.dat");
        let plain = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&plain_path)?;
        let limit_path = at.dir.join("limit.dat");
        let limit = OpenOptions::new().read(true).write(true).create(true).truncate(true).custom_flags(libc::O_DIRECT).open(&limit_path)?;
        preallocate(&limit, file_size)?;
        Ok(Systems {
            volumes,
            plain: PlainFile { file: plain, path: plain_path },
            limit: DeviceLimit { file: limit, path: limit_path, buf: AlignedBuf::zeroed((4 << 20) + 8192) },
        })
    }

    /// Close the volumes and remove every file the systems made.
    pub(super) fn remove(mut self) -> Result<()> {
        for volume in std::mem::take(&mut self.volumes) {
            volume.remove()?;
        }
        let _ = std::fs::remove_file(&self.plain.path);
        let _ = std::fs::remove_file(&self.limit.path);
        Ok(())
    }

    pub(super) fn count(&self) -> usize {
        self.volumes.len() + 2
    }
}

pub(super) struct PlainFile {
    pub(super) file: File,
    pub(super) path: PathBuf,
}

impl System for PlainFile {
    fn name(&self) -> &str {
        "plain"
    }
    fn write(&mut self, offset: u64, data: &[u8]) -> Result<()> {
        Ok(self.file.write_all_at(data, offset)?)
    }
    fn read(&mut self, offset: u64, out: &mut [u8]) -> Result<()> {
        Ok(self.file.read_exact_at(out, offset)?)
    }
    fn sync(&mut self) -> Result<()> {
        Ok(self.file.sync_data()?)
    }
    fn drop_caches(&mut self) {
        let _ = self.file.sync_data();
        drop_file_cache(&self.path);
    }
}

pub(super) struct DeviceLimit {
    pub(super) file: File,
    pub(super) path: PathBuf,
    pub(super) buf: AlignedBuf,
}

impl DeviceLimit {
    fn span(offset: u64, len: usize) -> (u64, usize) {
        let start = offset / 4096 * 4096;
        let end = (offset + len as u64).div_ceil(4096) * 4096;
        (start, (end - start) as usize)
    }
}

impl System for DeviceLimit {
    fn name(&self) -> &str {
        "limit"
    }
    fn write(&mut self, offset: u64, data: &[u8]) -> Result<()> {
        let (start, len) = Self::span(offset, data.len());
        let skew = (offset - start) as usize;
        self.buf[skew..skew + data.len()].copy_from_slice(data);
        Ok(self.file.write_all_at(&self.buf[..len], start)?)
    }
    fn read(&mut self, offset: u64, out: &mut [u8]) -> Result<()> {
        let (start, len) = Self::span(offset, out.len());
        self.file.read_exact_at(&mut self.buf[..len], start)?;
        let skew = (offset - start) as usize;
        out.copy_from_slice(&self.buf[skew..skew + out.len()]);
        Ok(())
    }
    fn sync(&mut self) -> Result<()> {
        Ok(self.file.sync_data()?)
    }
}

pub(super) fn preallocate(file: &File, len: u64) -> Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: plain syscall on a descriptor we own; no memory is passed.
    let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len as libc::off_t) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error()).context("preallocate the device-limit file");
    }
    Ok(())
}
