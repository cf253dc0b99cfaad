//! The embedded default devices: a fast-tier file on tmpfs and a preallocated SSD image.

use std::path::{Path, PathBuf};

use alignfs::geometry::GIB;
use alignfs::paths::DeviceSpec;
use anyhow::Result;

pub use alignfs::paths::DEFAULT_FAST_PATH as DEFAULT_FAST;
pub const DEFAULT_FAST_BYTES: u64 = GIB;
pub const DEFAULT_SSD_BYTES: u64 = 8 * GIB;

pub fn data_dir(explicit: Option<&Path>) -> PathBuf {
    explicit.map_or_else(alignfs::paths::default_data_dir, Path::to_path_buf)
}

/// The devices named on the command line, or the defaults (sized for creation only when
/// they do not exist yet). Several SSDs only for a `scrap` volume.
pub fn device_specs(fast: Option<&str>, ssds: &[String], data: Option<&Path>) -> Result<(DeviceSpec, Vec<DeviceSpec>)> {
    let default = |path: PathBuf, size: u64| DeviceSpec { size: (!path.exists()).then_some(size), path };
    let fast = match fast {
        Some(text) => DeviceSpec::parse(text)?,
        None => default(PathBuf::from(DEFAULT_FAST), DEFAULT_FAST_BYTES),
    };
    let ssds = if ssds.is_empty() {
        vec![default(data_dir(data).join("ssd.img"), DEFAULT_SSD_BYTES)]
    } else {
        ssds.iter().map(|text| DeviceSpec::parse(text)).collect::<alignfs::Result<Vec<_>>>()?
    };
    Ok((fast, ssds))
}
