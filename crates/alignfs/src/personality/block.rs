//! The block-volume personality: a volume holding one object of a fixed size, read and
//! written at byte offsets. Its writes journal map edits only (no size, no inode record),
//! its flush is the engine's fsync, and trimmed ranges become holes. Ranges of UHS's
//! static map bypass the engine for the NVM zone (`nvm_zone.rs`).
//!
//! ```
//! use std::sync::Arc;
//! use alignfs::device::{PmemRegion, SimSsd};
//! use alignfs::personality::{BlockLayout, BlockVolume};
//! use alignfs::{Devices, FormatOptions, VolumeOptions};
//!
//! let devices = Devices::new(Arc::new(PmemRegion::anonymous(4 << 20).unwrap()), Arc::new(SimSsd::new(32 << 20)));
//! BlockVolume::format(&devices, &FormatOptions::default(), BlockLayout::new(8 << 20)).unwrap();
//! let disk = BlockVolume::open(devices, VolumeOptions::default()).unwrap();
//! disk.write(4096, b"sector").unwrap();
//! let mut out = [0u8; 6];
//! disk.read(4096, &mut out).unwrap();
//! assert_eq!(&out, b"sector");
//! disk.close().unwrap();
//! ```

use std::sync::Arc;

use super::nvm_zone::{BlockLayout, NvmZone, Place, LAYOUT_XATTR};
use crate::device::TierPrefix;
use crate::error::{DeviceProblem, Error, Result};
use crate::geometry::MetaLayout;
use crate::layout::Superblock;
use crate::meta::{Ino, Inode};
use crate::volume::{Devices, FallocateMode, FormatOptions, Volume, VolumeOptions, XattrSet};

/// The object's name in the volume's root directory: how `open` finds it. Nothing on the
/// block data path touches the namespace.
const OBJECT_NAME: &[u8] = b"volume";

pub struct BlockVolume {
    volume: Volume,
    object: Arc<Inode>,
    layout: BlockLayout,
    zone: NvmZone,
}

impl BlockVolume {
    /// Format the devices as a block volume. The static ranges' NVM zone takes the end of
    /// the fast tier; the engine formats the rest.
    pub fn format(devices: &Devices, options: &FormatOptions, mut layout: BlockLayout) -> Result<Superblock> {
        layout.validate()?;
        let zone_bytes = layout.zone_bytes();
        let engine_devices = match (devices, zone_bytes) {
            (_, 0) => devices.clone(),
            (Devices::FastTierAndSsd { fast, .. }, _) if fast.len_bytes() <= zone_bytes => {
                return Err(Error::WrongDevices(DeviceProblem::NvmRangesFillFastTier { ranges: zone_bytes, fast: fast.len_bytes() }))
            }
            (Devices::FastTierAndSsd { fast, ssd }, _) => {
                Devices::new(Arc::new(TierPrefix::new(Arc::clone(fast), fast.len_bytes() - zone_bytes)), Arc::clone(ssd))
            }
            _ => return Err(Error::WrongDevices(DeviceProblem::NvmRangesWithoutFastTier)),
        };
        let block = options.geometry.block();
        let ssd_bytes = devices.ssd().len_bytes();
        let reserved = match devices.fast() {
            Some(_) => 1,
            None => MetaLayout::on_ssd(ssd_bytes, &options.geometry)?.reserved_ssd_blocks(&options.geometry),
        };
        let room = (ssd_bytes / block).saturating_sub(reserved) * block;
        // Out of place: an overwrite takes a new block before the old one is freed.
        let needed = layout.engine_bytes() + (room / 32).max(64 * block);
        if needed > room {
            return Err(Error::InvalidArgument(format!(
                "a block volume of {} bytes needs {needed} bytes of SSD data space (its data plus 1/32 for out-of-place writes); the SSD holds {room}",
                layout.size
            )));
        }
        let superblock = Volume::format(&engine_devices, options)?;
        let volume = Volume::open(engine_devices, VolumeOptions { background: false, ..VolumeOptions::default() })?;
        let object = volume.create_file(Ino::ROOT, OBJECT_NAME, 0o600, 0, 0)?;
        volume.setxattr(object.ino, LAYOUT_XATTR, &layout.encode(superblock.fast_bytes), XattrSet::CreateOnly)?;
        volume.truncate(object.ino, layout.size)?;
        volume.close()?;
        Ok(superblock)
    }

    pub fn open(devices: Devices, options: VolumeOptions) -> Result<BlockVolume> {
        let fast = devices.fast().cloned();
        let volume = Volume::open(devices, options)?;
        let attr = volume.lookup(Ino::ROOT, OBJECT_NAME).map_err(|e| match e {
            Error::NotFound => Error::WrongPersonality("the volume holds no block volume (format it with BlockVolume::format)".into()),
            other => other,
        })?;
        let object = volume.object(attr.ino)?;
        let device = volume.superblock().uuid_string();
        let (layout, zone_offset) = match volume.getxattr(attr.ino, LAYOUT_XATTR) {
            Ok(bytes) => BlockLayout::decode(&bytes).map_err(|e| Error::corrupt("block layout", &device, 0, e))?,
            Err(Error::NoAttribute) => (BlockLayout::new(attr.size), 0),
            Err(e) => return Err(e),
        };
        if layout.size != attr.size {
            return Err(Error::corrupt(
                "block layout",
                &device,
                0,
                format!("the layout says {} bytes, the object holds {}", layout.size, attr.size),
            ));
        }
        let zone = NvmZone::new(&layout, fast, zone_offset)?;
        Ok(BlockVolume { volume, object, layout, zone })
    }

    /// Bytes the volume holds.
    pub fn size(&self) -> u64 {
        self.layout.size
    }

    /// What the volume was formatted with.
    pub fn layout(&self) -> &BlockLayout {
        &self.layout
    }

    fn check_range(&self, offset: u64, len: u64) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.layout.size => Ok(()),
            _ => Err(Error::OutOfRange { offset, len, size: self.layout.size }),
        }
    }

    /// Read `buf.len()` bytes at `offset`; never-written ranges read as zeros.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.read_pieces(offset, buf, Volume::read)
    }

    /// [`Self::read`] only if no byte has to come from the SSD: [`Error::WouldBlock`]
    /// when one does (see [`Volume::read_if_cached`]), and `buf` is unspecified. The NVM
    /// zone is memory.
    pub fn read_if_cached(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.read_pieces(offset, buf, Volume::read_if_cached)
    }

    /// Each piece of a read from the NVM zone or, through `engine_read`, the engine.
    fn read_pieces(&self, offset: u64, buf: &mut [u8], engine_read: impl Fn(&Volume, Ino, u64, &mut [u8]) -> Result<usize>) -> Result<()> {
        self.check_range(offset, buf.len() as u64)?;
        for (place, at, len) in self.zone.pieces(offset, buf.len() as u64) {
            let out = &mut buf[(at - offset) as usize..(at - offset + len) as usize];
            match place {
                Place::Engine => {
                    let n = engine_read(&self.volume, self.object.ino, at, out)?;
                    debug_assert_eq!(n, out.len(), "the object's size is the volume's");
                }
                Place::Zone(z) => self.zone.read(z, out),
            }
        }
        Ok(())
    }

    /// Whether a write of `len` bytes at `offset` lands in memory-speed storage (the NVM
    /// zone, or the profile's residue tier for a write this small) without SSD IO. A
    /// scheduling hint for servers: a full buffer still makes such a write wait.
    pub fn write_is_quick(&self, offset: u64, len: u64) -> bool {
        self.zone.pieces(offset, len).into_iter().all(|(place, _, len)| match place {
            Place::Engine => self.volume.write_goes_to_residue(len),
            Place::Zone(_) => true,
        })
    }

    /// Whether [`Self::flush`] returns without touching the SSD (a profile durable on
    /// every write).
    pub fn flush_is_quick(&self) -> bool {
        self.volume.fsync_is_free()
    }

    /// Write `data` at `offset`, durable as the profile promises (until [`Self::flush`]
    /// where it promises less); the NVM zone's pieces are durable on return.
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<()> {
        // The NVM zone bypasses the engine, so the engine's read-only check runs here first.
        self.volume.check_writable()?;
        self.check_range(offset, data.len() as u64)?;
        for (place, at, len) in self.zone.pieces(offset, data.len() as u64) {
            let piece = &data[(at - offset) as usize..(at - offset + len) as usize];
            match place {
                Place::Engine => {
                    self.volume.write_within(&self.object, at, piece)?;
                }
                Place::Zone(z) => self.zone.write(z, piece),
            }
        }
        Ok(())
    }

    /// Make every acknowledged write durable (NBD `FLUSH`).
    pub fn flush(&self) -> Result<()> {
        self.volume.fsync(self.object.ino)
    }

    /// Drop a range's data: it reads as zeros and its whole blocks are freed (NBD `TRIM`,
    /// `WRITE_ZEROES`).
    pub fn trim(&self, offset: u64, len: u64) -> Result<()> {
        self.volume.check_writable()?;
        self.check_range(offset, len)?;
        for (place, at, len) in self.zone.pieces(offset, len) {
            match place {
                Place::Engine => self.volume.fallocate(self.object.ino, at, len, FallocateMode::PunchHole)?,
                Place::Zone(z) => self.zone.zero(z, len),
            }
        }
        Ok(())
    }

    /// What this volume's callers did since it opened: (writes, bytes written, reads,
    /// bytes read) through the engine (the NVM zone's requests are not counted).
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

    /// The engine underneath, to close or inspect as a plain volume.
    pub fn into_volume(self) -> Volume {
        self.volume
    }
}
