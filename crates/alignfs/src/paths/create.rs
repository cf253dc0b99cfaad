//! Formatting by path: the devices checked, created when sized, formatted, and removed
//! again if the format fails.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::{default_kv_dir, join_members, ssd_options, DeviceSpec};
use crate::device::mssd::{MemorySemanticSsd, MssdConfig, MssdOptions};
use crate::device::{BlockDevice, ByteTier, DeviceSet, FileSsd, IoBackend, PmemRegion};
use crate::error::{DeviceProblem, Error, Result};
use crate::geometry::MIB;
use crate::kv::KvMeta;
use crate::layout::Superblock;
use crate::options::{FormatOptions, VolumeOptions};
use crate::personality::{BlockLayout, BlockVolume, ObjectStore};
use crate::profile::DeviceKind;
use crate::volume::{Devices, Volume};

/// Create (when sized) and format the devices the profile takes: a fast tier and one SSD
/// (`orch`), one or more SSDs alone (`scrap`; `fast` must then be `None`), or one SSD and
/// a KV store directory (`nvstore`; `kv`, by default beside the SSD). Refuses devices a
/// process holds, and devices that hold any alignfs structure unless `options.force`
/// ([`super::probe`]); a format that fails removes the files it created.
pub fn format_paths(
    fast: Option<&DeviceSpec>,
    ssds: &[DeviceSpec],
    kv: Option<&Path>,
    options: &FormatOptions,
    backend: Option<IoBackend>,
) -> Result<(Superblock, Volume)> {
    formatting(fast, ssds, kv, options, |created| {
        let devices = create_devices(fast, ssds, kv, options, backend, created)?;
        let superblock = Volume::format(&devices, options)?;
        Ok((superblock, Volume::open(devices, quiet())?))
    })
}

/// [`format_paths`] for a block volume (the `uhs` profile's personality).
pub fn format_block_paths(
    fast: Option<&DeviceSpec>,
    ssds: &[DeviceSpec],
    options: &FormatOptions,
    layout: BlockLayout,
    backend: Option<IoBackend>,
) -> Result<(Superblock, BlockVolume)> {
    formatting(fast, ssds, None, options, |created| {
        let devices = create_devices(fast, ssds, None, options, backend, created)?;
        let superblock = BlockVolume::format(&devices, options, layout)?;
        Ok((superblock, BlockVolume::open(devices, quiet())?))
    })
}

/// [`format_paths`] for an object store (the `nvstore` profile's personality).
pub fn format_object_paths(
    ssds: &[DeviceSpec],
    kv: Option<&Path>,
    options: &FormatOptions,
    backend: Option<IoBackend>,
) -> Result<(Superblock, ObjectStore)> {
    formatting(None, ssds, kv, options, |created| {
        let devices = create_devices(None, ssds, kv, options, backend, created)?;
        let superblock = ObjectStore::format(&devices, options)?;
        Ok((superblock, ObjectStore::open(devices, quiet())?))
    })
}

/// A freshly formatted volume is opened without background workers.
fn quiet() -> VolumeOptions {
    VolumeOptions { background: false, ..VolumeOptions::default() }
}

/// The paths a format created, removed again unless it succeeds.
#[derive(Default)]
struct Created(Vec<PathBuf>);

impl Created {
    /// Note that `path` is about to be created, if it does not exist yet.
    fn note(&mut self, path: &Path) {
        if !path.exists() {
            self.0.push(path.to_path_buf());
        }
    }

    fn remove(&mut self) {
        for path in self.0.drain(..).rev() {
            let removed = if path.is_dir() { std::fs::remove_dir_all(&path) } else { std::fs::remove_file(&path) };
            if let Err(e) = removed.or_else(|e| if e.kind() == std::io::ErrorKind::NotFound { Ok(()) } else { Err(e) }) {
                tracing::warn!("remove {} after a failed format: {e}", path.display());
            }
        }
    }
}

/// Check the devices, run `format`, and remove what it created if it fails.
fn formatting<T>(
    fast: Option<&DeviceSpec>,
    ssds: &[DeviceSpec],
    kv: Option<&Path>,
    options: &FormatOptions,
    format: impl FnOnce(&mut Created) -> Result<T>,
) -> Result<T> {
    check_format_devices(fast, ssds, kv, options)?;
    let mut created = Created::default();
    let result = format(&mut created);
    if result.is_err() {
        created.remove();
    }
    result
}

/// The checks a format runs before it creates or writes anything: the geometry, whether
/// the profile takes these devices, and that none is held by a process or (unless
/// `options.force`) holds an alignfs structure. Reads only; a caller that must read a
/// device before formatting (to size a block volume) runs it first.
pub fn check_format_devices(fast: Option<&DeviceSpec>, ssds: &[DeviceSpec], kv: Option<&Path>, options: &FormatOptions) -> Result<()> {
    options.profile.validate_geometry(&options.geometry)?;
    let kind = options.profile.devices();
    check_device_set(kind, fast.is_some(), ssds.len(), kv.is_some(), options.profile.name())?;
    let kv = (kind == DeviceKind::SsdAndKvStore).then(|| kv.map_or_else(|| default_kv_dir(&ssds[0].path), Path::to_path_buf));
    let mut targets: Vec<&Path> = fast.iter().map(|f| f.path.as_path()).chain(ssds.iter().map(|s| s.path.as_path())).collect();
    targets.extend(kv.as_deref());
    super::probe::check_targets(&targets, options.force)
}

/// Whether a profile whose volumes are made of `kind` takes these devices: a fast tier
/// (or the device's DRAM), how many SSDs, a KV directory.
fn check_device_set(kind: DeviceKind, fast: bool, ssds: usize, kv: bool, name: &'static str) -> Result<()> {
    let refuse = |rule: &'static str| Err(Error::WrongDevices(DeviceProblem::Profile { profile: name, rule }));
    let max = kind.max_ssds();
    match (kind, fast) {
        _ if ssds == 0 => Err(Error::WrongDevices(DeviceProblem::NoSsd)),
        (DeviceKind::FastTierAndSsd, false) => refuse("needs a fast tier"),
        (DeviceKind::MemorySemanticSsd, false) => refuse("needs the device's DRAM file (--fast)"),
        (DeviceKind::Ssds { .. } | DeviceKind::SsdAndKvStore, true) => refuse("has no fast tier; name only the SSDs"),
        _ if kv && kind != DeviceKind::SsdAndKvStore => refuse("keeps no KV store; drop the KV directory"),
        _ if ssds > max as usize => Err(Error::WrongDevices(DeviceProblem::TooManySsds { profile: name, max, given: ssds })),
        _ => Ok(()),
    }
}

/// The devices of a volume about to be formatted (checked by [`formatting`]), created
/// when sized.
fn create_devices(
    fast: Option<&DeviceSpec>,
    ssds: &[DeviceSpec],
    kv: Option<&Path>,
    options: &FormatOptions,
    backend: Option<IoBackend>,
    created: &mut Created,
) -> Result<Devices> {
    let kind = options.profile.devices();
    if kind == DeviceKind::MemorySemanticSsd {
        let dram = fast.expect("checked: a memory-semantic SSD has its DRAM named");
        let device = create_memory_semantic(dram, &ssds[0], options, MssdOptions::default(), backend, created)?;
        return Ok(Devices::memory_semantic(Arc::new(device)));
    }
    let kv = (kind == DeviceKind::SsdAndKvStore).then(|| kv.map_or_else(|| default_kv_dir(&ssds[0].path), Path::to_path_buf));
    if let Some(dir) = &kv {
        // Before any device file is created: a refused directory leaves nothing behind.
        KvMeta::check_dir(dir, options.force)?;
        created.note(dir);
    }
    let mut members: Vec<Arc<dyn BlockDevice>> = Vec::with_capacity(ssds.len());
    for ssd in ssds {
        created.note(&ssd.path);
        members.push(Arc::new(FileSsd::open(&ssd.path, &ssd_options(&options.geometry, ssd.size, backend, false))?));
    }
    let split = u64::from(options.geometry.split_bytes);
    let ssd = join_members(members, |m| DeviceSet::common_bytes(m, split))?;
    Ok(match (fast, kv) {
        (Some(fast), _) => Devices::new(Arc::new(create_region(fast, fast.size, created)?) as Arc<dyn ByteTier>, ssd),
        (None, Some(dir)) => Devices::with_kv(ssd, dir),
        (None, None) => Devices::ssd_only(ssd),
    })
}

/// A fast tier or a device's DRAM, created (with its directory) or grown to `len`.
fn create_region(spec: &DeviceSpec, len: Option<u64>, created: &mut Created) -> Result<PmemRegion> {
    if len == Some(0) {
        return Err(Error::BadSize(format!("{} is to be created with 0 bytes", spec.path.display())));
    }
    if let Some(parent) = spec.path.parent().filter(|p| !p.as_os_str().is_empty() && len.is_some()) {
        std::fs::create_dir_all(parent).map_err(|e| Error::io(format!("create {}", parent.display()), e))?;
    }
    created.note(&spec.path);
    PmemRegion::open(&spec.path, len)
}

/// The write log of a memory-semantic SSD of `logical_bytes`: the paper's 256 MiB for an
/// SSD of 8 GiB or more, 1/32 of a smaller one (at least 1 MiB).
fn device_log_bytes(logical_bytes: u64) -> u64 {
    (logical_bytes / 32).clamp(MIB, 256 * MIB) / MIB * MIB
}

/// A new memory-semantic SSD with no volume on it, for a kernel file system on its block
/// interface (`alignfs export-device`): its DRAM file (`dram`) and flash image (`ssd`,
/// whose size names the capacity), created or formatted after the same checks as `mkfs`
/// (refused if either holds an alignfs structure, unless `force`), its write log
/// `log_bytes` long (`None`: 1/32 of the capacity, 1–256 MiB).
pub fn format_memory_semantic_ssd(
    dram: &DeviceSpec,
    ssd: &DeviceSpec,
    force: bool,
    log_bytes: Option<u64>,
    options: MssdOptions,
    backend: Option<IoBackend>,
) -> Result<MemorySemanticSsd> {
    let format = FormatOptions {
        geometry: crate::Profile::BYTE.default_geometry(),
        profile: crate::Profile::BYTE,
        force,
        device_log_bytes: log_bytes,
        ..FormatOptions::default()
    };
    formatting(Some(dram), std::slice::from_ref(ssd), None, &format, |created| {
        create_memory_semantic(dram, ssd, &format, options, backend, created)
    })
}

/// A new memory-semantic SSD: its flash image (`ssd`; the size names the capacity the
/// block interface offers, the image is created larger by the over-provisioning and a
/// label page) and its DRAM file (`dram`), opened with the runtime `device` options.
fn create_memory_semantic(
    dram: &DeviceSpec,
    ssd: &DeviceSpec,
    options: &FormatOptions,
    device: MssdOptions,
    backend: Option<IoBackend>,
    created: &mut Created,
) -> Result<MemorySemanticSsd> {
    let log_bytes = |capacity: u64| options.device_log_bytes.unwrap_or_else(|| device_log_bytes(capacity));
    let config = match ssd.size {
        Some(bytes) => MssdConfig { log_bytes: log_bytes(bytes), ..MssdConfig::new(bytes / MIB * MIB) },
        None => {
            let len = std::fs::metadata(&ssd.path).map_err(|e| Error::io(format!("stat {}", ssd.path.display()), e))?.len();
            MssdConfig::fitting(len, log_bytes(len))?
        }
    };
    let (dram_bytes, image_bytes) = MemorySemanticSsd::sizes(&config)?;
    created.note(&ssd.path);
    let image_len = ssd.size.map(|_| image_bytes);
    let flash: Arc<dyn BlockDevice> = Arc::new(FileSsd::open(&ssd.path, &ssd_options(&options.geometry, image_len, backend, false))?);
    let region = Arc::new(create_region(dram, Some(dram.size.unwrap_or(dram_bytes).max(dram_bytes)), created)?);
    MemorySemanticSsd::format(flash, region, &config, device)
}
