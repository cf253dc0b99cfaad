//! Volumes by path: the front ends' way in. Devices named on a command line (created and
//! sized when asked), checked before a format writes anything ([`probe`]), opened as the
//! volume on them needs, and handed to the engine or a personality.

mod create;
mod open;
pub mod probe;
#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use create::{check_format_devices, format_block_paths, format_memory_semantic_ssd, format_object_paths, format_paths};
pub use open::{open_block_paths, open_memory_semantic_ssd, open_object_paths, open_paths, open_paths_with_faults, ssd_superblock};

use crate::device::{BlockDevice, DeviceSet, IoBackend, SsdOptions};
use crate::error::{Error, Result};
use crate::geometry::{parse_size, Geometry};

/// The embedded default fast tier: a file on tmpfs.
pub const DEFAULT_FAST_PATH: &str = "/dev/shm/alignfs/fast";

/// Where the default SSD image (`ssd.img`) and logs live: `$ALIGNFS_DATA_DIR`, else
/// `/var/tmp/alignfs`.
pub fn default_data_dir() -> PathBuf {
    std::env::var_os("ALIGNFS_DATA_DIR").map_or_else(|| PathBuf::from("/var/tmp/alignfs"), PathBuf::from)
}

/// The text of a key file (the S3 gateway's access keys, NBD's pre-shared keys), refused
/// while anyone but its owner may read or write it, as ssh treats private keys. Errors
/// name the file and say how to fix its mode.
pub fn read_private_file(path: &Path) -> std::result::Result<String, String> {
    use std::os::unix::fs::PermissionsExt;
    let shown = path.display();
    let metadata = std::fs::metadata(path).map_err(|e| format!("cannot read the key file {shown}: {e}"))?;
    let mode = metadata.permissions().mode();
    if mode & 0o077 != 0 {
        return Err(format!("the key file {shown} is readable or writable by others (mode {:o}); run `chmod 600 {shown}`", mode & 0o777));
    }
    std::fs::read_to_string(path).map_err(|e| format!("cannot read the key file {shown}: {e}"))
}

/// Where a volume's KV store lives unless named: beside its (first) SSD, `SSD.kv`.
pub fn default_kv_dir(ssd: &Path) -> PathBuf {
    let mut dir = ssd.as_os_str().to_owned();
    dir.push(".kv");
    PathBuf::from(dir)
}

/// A device named on the command line: `PATH` or `PATH:SIZE` (size used when creating).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceSpec {
    pub path: PathBuf,
    pub size: Option<u64>,
}

impl DeviceSpec {
    pub fn parse(text: &str) -> Result<DeviceSpec> {
        if text.is_empty() {
            return Err(Error::InvalidArgument("empty device path".into()));
        }
        if let Some((path, size)) = text.rsplit_once(':') {
            match parse_size(size) {
                Ok(_) if path.is_empty() => return Err(Error::InvalidArgument(format!("no path before the size in {text:?}"))),
                Ok(bytes) => return Ok(DeviceSpec { path: path.into(), size: Some(bytes) }),
                // `PATH:SIZE` with a size that does not parse, unless a file has that name.
                Err(e) if size.starts_with(|c: char| c.is_ascii_digit()) && !Path::new(text).exists() => {
                    return Err(Error::InvalidArgument(format!("{text:?}: {e}")))
                }
                Err(_) => {}
            }
        }
        Ok(DeviceSpec { path: text.into(), size: None })
    }
}

pub(crate) fn ssd_options(geometry: &Geometry, create_len: Option<u64>, backend: Option<IoBackend>, shared: bool) -> SsdOptions {
    SsdOptions { create_len, io_workers: geometry.io_workers as usize, split_bytes: u64::from(geometry.split_bytes), backend, shared }
}

/// One SSD as it is, or several as a [`DeviceSet`] of `member_bytes(members)` each.
pub(crate) fn join_members(
    mut members: Vec<Arc<dyn BlockDevice>>,
    member_bytes: impl Fn(&[Arc<dyn BlockDevice>]) -> u64,
) -> Result<Arc<dyn BlockDevice>> {
    if members.len() == 1 {
        return Ok(members.remove(0));
    }
    let bytes = member_bytes(&members);
    Ok(Arc::new(DeviceSet::new(members, bytes)?))
}
