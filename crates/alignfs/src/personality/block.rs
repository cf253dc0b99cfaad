//! The block-volume personality: a volume holding one object of a fixed size, read and
//! written at byte offsets. Its writes journal map edits only (no size, no inode record),
//! its flush is the engine's fsync, and trimmed ranges become holes.
//!
//! ```
//! use std::sync::Arc;
//! use alignfs::device::{PmemRegion, SimSsd};
//! use alignfs::personality::BlockVolume;
//! use alignfs::{Devices, FormatOptions, VolumeOptions};
//!
//! let devices = Devices::new(Arc::new(PmemRegion::anonymous(4 << 20).unwrap()), Arc::new(SimSsd::new(32 << 20)));
//! BlockVolume::format(&devices, &FormatOptions::default(), 8 << 20).unwrap();
//! let disk = BlockVolume::open(devices, VolumeOptions::default()).unwrap();
//! disk.write(4096, b"sector").unwrap();
//! let mut out = [0u8; 6];
//! disk.read(4096, &mut out).unwrap();
//! assert_eq!(&out, b"sector");
//! disk.close().unwrap();
//! ```

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::layout::Superblock;
use crate::meta::{Ino, Inode};
use crate::volume::{Devices, FallocateMode, FormatOptions, Volume, VolumeOptions};

/// The object's name in the volume's root directory: how `open` finds it. Nothing on the
/// block data path touches the namespace.
const OBJECT_NAME: &[u8] = b"volume";

/// The volume's logical sector: sizes are multiples of it.
pub const SECTOR_BYTES: u64 = 512;

pub struct BlockVolume {
    volume: Volume,
    object: Arc<Inode>,
    size: u64,
}

impl BlockVolume {
    /// Format the devices as a block volume of `size` bytes (a multiple of 512).
    pub fn format(devices: &Devices, options: &FormatOptions, size: u64) -> Result<Superblock> {
        if size == 0 || size % SECTOR_BYTES != 0 {
            return Err(Error::InvalidArgument(format!("a block volume's size must be a non-zero multiple of {SECTOR_BYTES}, not {size}")));
        }
        let superblock = Volume::format(devices, options)?;
        let volume = Volume::open(devices.clone(), VolumeOptions { background: false, ..VolumeOptions::default() })?;
        let object = volume.create_file(Ino::ROOT, OBJECT_NAME, 0o600, 0, 0)?;
        volume.truncate(object.ino, size)?;
        volume.close()?;
        Ok(superblock)
    }

    pub fn open(devices: Devices, options: VolumeOptions) -> Result<BlockVolume> {
        let volume = Volume::open(devices, options)?;
        let attr = volume.lookup(Ino::ROOT, OBJECT_NAME).map_err(|e| match e {
            Error::NotFound => Error::WrongPersonality("the volume holds no block volume (format it with BlockVolume::format)".into()),
            other => other,
        })?;
        let object = volume.inner().file(attr.ino)?;
        Ok(BlockVolume { volume, object, size: attr.size })
    }

    /// Bytes the volume holds.
    pub fn size(&self) -> u64 {
        self.size
    }

    fn check_range(&self, offset: u64, len: u64) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.size => Ok(()),
            _ => Err(Error::OutOfRange { offset, len, size: self.size }),
        }
    }

    /// Read `buf.len()` bytes at `offset`; never-written ranges read as zeros.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.check_range(offset, buf.len() as u64)?;
        let n = self.volume.read(self.object.ino, offset, buf)?;
        debug_assert_eq!(n, buf.len(), "the object's size is the volume's");
        Ok(())
    }

    /// Write `data` at `offset`, durable as the profile promises (until [`Self::flush`]
    /// where it promises less).
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.check_range(offset, data.len() as u64)?;
        self.volume.inner().write_object(&self.object, offset, data, false).map(drop)
    }

    /// Make every acknowledged write durable (NBD `FLUSH`).
    pub fn flush(&self) -> Result<()> {
        self.volume.fsync(self.object.ino)
    }

    /// Drop a range's data: it reads as zeros and its whole blocks are freed (NBD `TRIM`,
    /// `WRITE_ZEROES`).
    pub fn trim(&self, offset: u64, len: u64) -> Result<()> {
        self.check_range(offset, len)?;
        if len == 0 {
            return Ok(());
        }
        self.volume.fallocate(self.object.ino, offset, len, FallocateMode::PunchHole)
    }

    /// What this volume's callers did since it opened: (writes, bytes written, reads,
    /// bytes read).
    pub fn io(&self) -> (u64, u64, u64, u64) {
        self.object.io.snapshot()
    }

    /// The engine underneath: counters, `check`, `report`.
    pub fn volume(&self) -> &Volume {
        &self.volume
    }

    pub fn close(self) -> Result<()> {
        self.volume.close()
    }
}
