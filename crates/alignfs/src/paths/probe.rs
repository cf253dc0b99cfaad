//! What a device path holds, read before `mkfs` writes anything: the one check every
//! profile's format runs on every device it is given, whatever part that device is to
//! play. It recognises each alignfs structure in each place one lives:
//!
//! | structure | where |
//! | --- | --- |
//! | a volume's superblock (fast tier, SSD, each SSD of a set) | the first sector |
//! | a memory-semantic SSD's DRAM header | the first 64 bytes |
//! | a memory-semantic SSD's flash label | the last page |
//! | a KV store's marker | `ALIGNFS-KV` in the directory |
//!
//! A device another process holds open ([`crate::device::claim`]) is refused even with
//! `force`; one that holds a structure is refused unless `force`.

use std::fmt;
use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::device::claim;
use crate::device::mssd::{dram_label, flash_label, PAGE};
use crate::error::{Error, Result};
use crate::geometry::SUPERBLOCK_BYTES;
use crate::kv::KvMeta;
use crate::layout::Superblock;

/// An alignfs structure found on a device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Found {
    /// A volume's superblock: the fast tier or one of the SSDs of that volume.
    Volume(Box<Superblock>),
    /// Superblock magic whose sector does not decode.
    DamagedSuperblock,
    /// The DRAM of an emulated memory-semantic SSD (`byte`), by the device's id.
    DeviceDram(u64),
    /// The flash image of an emulated memory-semantic SSD, by the device's id.
    DeviceFlash(u64),
    /// The KV store of an `nvstore` volume, by the volume's uuid as its marker names it.
    KvStore(String),
}

impl fmt::Display for Found {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Found::Volume(sb) => f.write_str(&sb.describe()),
            Found::DamagedSuperblock => write!(f, "an alignfs superblock that does not decode"),
            Found::DeviceDram(id) => write!(f, "the DRAM of memory-semantic SSD {id:016x} (a byte volume's device)"),
            Found::DeviceFlash(id) => write!(f, "the flash image of memory-semantic SSD {id:016x} (a byte volume's device)"),
            Found::KvStore(uuid) => write!(f, "the KV store of nvstore volume {uuid}"),
        }
    }
}

/// The structure `path` holds; `None` when it is missing, empty or foreign.
pub fn probe(path: &Path) -> Result<Option<Found>> {
    let metadata = match std::fs::metadata(path) {
        Ok(metadata) => metadata,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(format!("stat {}", path.display()), e)),
    };
    if metadata.is_dir() {
        return Ok(KvMeta::marker(path)?.map(Found::KvStore));
    }
    let file = std::fs::File::open(path).map_err(|e| Error::io(format!("open {}", path.display()), e))?;
    let len = device_len(&file, path)?;
    let read = |at: u64, len: u64| -> Result<Vec<u8>> {
        let mut bytes = vec![0u8; len as usize];
        let n = file.read_at(&mut bytes, at).map_err(|e| Error::io(format!("read {}", path.display()), e))?;
        bytes.truncate(n);
        Ok(bytes)
    };
    let head = read(0, SUPERBLOCK_BYTES.min(len))?;
    if Superblock::has_magic(&head) {
        return Ok(Some(
            Superblock::decode(&head, &path.display().to_string()).map_or(Found::DamagedSuperblock, |sb| Found::Volume(Box::new(sb))),
        ));
    }
    if let Some(id) = dram_label(&head) {
        return Ok(Some(Found::DeviceDram(id)));
    }
    if len >= PAGE {
        if let Some(id) = flash_label(&read((len / PAGE - 1) * PAGE, PAGE)?) {
            return Ok(Some(Found::DeviceFlash(id)));
        }
    }
    Ok(None)
}

/// A block device's size or a file's length.
fn device_len(file: &std::fs::File, path: &Path) -> Result<u64> {
    use std::io::{Seek, SeekFrom};
    let mut file = file;
    file.seek(SeekFrom::End(0)).map_err(|e| Error::io(format!("size {}", path.display()), e))
}

/// Refuse to format `paths` (every device of the new volume, in any part): `InUse` when
/// a process holds one open, even with `force`; `AlreadyFormatted` when one holds an
/// alignfs structure, unless `force`. Reads only.
pub fn check_targets(paths: &[&Path], force: bool) -> Result<()> {
    for path in paths {
        claim::check_free(path)?;
    }
    if force {
        return Ok(());
    }
    for path in paths {
        if let Some(found) = probe(path)? {
            return Err(Error::AlreadyFormatted { device: path.display().to_string(), found: found.to_string() });
        }
    }
    Ok(())
}
