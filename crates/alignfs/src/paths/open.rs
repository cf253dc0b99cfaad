//! Opening by path: a formatted volume's devices, found and opened as its superblock (or
//! a memory-semantic SSD's DRAM) says.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::{default_kv_dir, join_members, ssd_options};
use crate::device::mssd::{LatencyModel, MemorySemanticSsd, MssdOptions};
use crate::device::{BlockDevice, FaultPlan, FaultyDevice, FileSsd, IoBackend, PmemRegion};
use crate::error::{DeviceProblem, Error, Result};
use crate::geometry::{Geometry, SUPERBLOCK_BYTES};
use crate::layout::Superblock;
use crate::options::VolumeOptions;
use crate::personality::{BlockVolume, ObjectStore};
use crate::profile::DeviceKind;
use crate::volume::{Devices, Volume};

/// The superblock of the volume on an SSD; `None` if it holds no volume (or a damaged
/// superblock, which opening reports in full).
pub fn ssd_superblock(ssd: &Path) -> Result<Option<Superblock>> {
    let file = std::fs::File::open(ssd).map_err(|e| Error::io(format!("open {}", ssd.display()), e))?;
    let mut head = vec![0u8; SUPERBLOCK_BYTES as usize];
    let n = std::os::unix::fs::FileExt::read_at(&file, &mut head, 0).map_err(|e| Error::io(format!("read {}", ssd.display()), e))?;
    Ok(Superblock::decode(&head[..n], &ssd.display().to_string()).ok())
}

/// Open a formatted volume by path, with the IO shape its superblock records. `fast` is
/// not used when the SSD holds a volume of a profile without a fast tier.
pub fn open_paths(fast: &Path, ssd: &Path, options: VolumeOptions, backend: Option<IoBackend>) -> Result<Volume> {
    open_paths_with_faults(fast, &[ssd.to_path_buf()], None, options, backend, None)
}

/// [`open_paths`] for any number of SSDs (in any order), the KV store's directory when it
/// is not beside the SSD, with the SSDs behind a [`FaultyDevice`] when a plan is given
/// (the suites' `alignfs mount --inject-faults`).
pub fn open_paths_with_faults(
    fast: &Path,
    ssds: &[PathBuf],
    kv: Option<&Path>,
    options: VolumeOptions,
    backend: Option<IoBackend>,
    faults: Option<Arc<FaultPlan>>,
) -> Result<Volume> {
    Volume::open(open_devices(fast, ssds, kv, &options, backend, faults)?, options)
}

/// Open a formatted block volume by path (`alignfs nbd`).
pub fn open_block_paths(fast: &Path, ssds: &[PathBuf], options: VolumeOptions, backend: Option<IoBackend>) -> Result<BlockVolume> {
    BlockVolume::open(open_devices(fast, ssds, None, &options, backend, None)?, options)
}

/// Open a formatted object store by path: its SSD and its KV store (`kv`, by default
/// beside the SSD).
pub fn open_object_paths(ssd: &Path, kv: Option<&Path>, options: VolumeOptions, backend: Option<IoBackend>) -> Result<ObjectStore> {
    match ssd_superblock(ssd)? {
        None => return Err(Error::NotFormatted(ssd.display().to_string())),
        Some(superblock) if superblock.profile.devices() != DeviceKind::SsdAndKvStore => {
            let profile = superblock.profile.name();
            return Err(Error::WrongPersonality(format!("{} holds an {profile} volume, not an nvstore object store", ssd.display())));
        }
        Some(_) => {}
    }
    ObjectStore::open(open_devices(Path::new(""), &[ssd.to_path_buf()], kv, &options, backend, None)?, options)
}

/// The devices of a formatted volume, with the IO shape its superblock records.
fn open_devices(
    fast: &Path,
    ssds: &[PathBuf],
    kv: Option<&Path>,
    options: &VolumeOptions,
    backend: Option<IoBackend>,
    faults: Option<Arc<FaultPlan>>,
) -> Result<Devices> {
    let read_only = options.read_only;
    let missing = |path: &Path| Error::BadPath(path.into(), "does not exist (format it with `alignfs mkfs`)".into());
    if let Some(absent) = ssds.iter().find(|p| !p.exists()) {
        return Err(missing(absent));
    }
    let Some(first) = ssds.first() else { return Err(Error::WrongDevices(DeviceProblem::NoSsd)) };
    let with_faults = |device: Arc<dyn BlockDevice>| -> Arc<dyn BlockDevice> {
        match &faults {
            Some(plan) => Arc::new(FaultyDevice::new(device, Arc::clone(plan))),
            None => device,
        }
    };
    let raw = ssd_superblock(first)?;
    // A memory-semantic SSD's flash image holds pages where its FTL put them; its DRAM
    // (named as the fast tier) says what it is.
    let kind = raw.as_ref().map(|sb| sb.profile.devices());
    if kind.is_none_or(|k| k == DeviceKind::MemorySemanticSsd) && fast.exists() && ssds.len() == 1 {
        let region = Arc::new(open_region(fast, read_only)?);
        if MemorySemanticSsd::is_formatted(region.as_ref()) {
            if faults.is_some() {
                return Err(Error::InvalidArgument("fault injection does not cover a memory-semantic SSD".into()));
            }
            // The IO shape of the flash image: the profile's default (its superblock is
            // behind the FTL).
            let geometry = crate::Profile::BYTE.default_geometry();
            return open_memory_semantic(region, first, &geometry, backend, options);
        }
    }
    if let Some(superblock) = raw.filter(|sb| sb.profile.devices() != DeviceKind::FastTierAndSsd) {
        let ordered = order_members(ssds, &superblock)?;
        let mut members: Vec<Arc<dyn BlockDevice>> = Vec::with_capacity(ordered.len());
        for path in &ordered {
            members.push(Arc::new(FileSsd::open(path, &ssd_options(&superblock.geometry, None, backend, read_only))?));
        }
        let device = join_members(members, |_| superblock.member_bytes())?;
        if superblock.profile.devices() == DeviceKind::SsdAndKvStore {
            return Ok(Devices::with_kv(with_faults(device), kv.map_or_else(|| default_kv_dir(first), Path::to_path_buf)));
        }
        return Ok(Devices::ssd_only(with_faults(device)));
    }
    if ssds.len() > 1 {
        return Err(Error::WrongDevices(DeviceProblem::NotMultiSsd { path: first.clone() }));
    }
    if !fast.exists() {
        return Err(missing(fast));
    }
    let region = Arc::new(open_region(fast, read_only)?);
    let mut head = vec![0u8; SUPERBLOCK_BYTES.min(region.len_bytes()) as usize];
    region.read(0, &mut head);
    let geometry = Superblock::decode(&head, &fast.display().to_string()).map(|sb| sb.geometry).unwrap_or_default();
    let device: Arc<dyn BlockDevice> = Arc::new(FileSsd::open(first, &ssd_options(&geometry, None, backend, read_only))?);
    Ok(Devices::new(region, with_faults(device)))
}

/// A formatted volume's fast tier or device DRAM: held alone by a writer, shared by readers.
fn open_region(path: &Path, read_only: bool) -> Result<PmemRegion> {
    if read_only {
        PmemRegion::open_shared(path)
    } else {
        PmemRegion::open(path, None)
    }
}

/// The SSD paths in the volume's order (by each one's `ssd_index`), checking that they
/// are all of this volume and all there.
fn order_members(ssds: &[PathBuf], first: &Superblock) -> Result<Vec<PathBuf>> {
    let count = first.ssd_count as usize;
    if ssds.len() != count {
        return Err(Error::WrongDevices(DeviceProblem::SsdCount {
            volume: first.ssd_count,
            named: ssds.len(),
            first_index: first.ssd_index,
        }));
    }
    let mut ordered: Vec<Option<PathBuf>> = vec![None; count];
    for path in ssds {
        let name = path.display();
        match ssd_superblock(path)? {
            Some(sb) if sb.uuid != first.uuid => {
                return Err(Error::VolumeMismatch { fast: first.uuid_string(), ssd: format!("{} on {name}", sb.uuid_string()) })
            }
            Some(sb) if ordered.get(sb.ssd_index as usize).is_some_and(Option::is_none) => {
                ordered[sb.ssd_index as usize] = Some(path.clone())
            }
            Some(sb) => return Err(Error::WrongDevices(DeviceProblem::SsdNamedTwice { path: path.clone(), index: sb.ssd_index })),
            None => return Err(Error::BadPath(path.clone(), format!("holds no readable superblock of volume {}", first.uuid_string()))),
        }
    }
    Ok(ordered.into_iter().map(|p| p.expect("as many distinct places as paths")).collect())
}

/// A formatted memory-semantic SSD by its DRAM file and flash image, recovered, with the
/// runtime `options`: the device alone, for a kernel file system on its block interface
/// (`alignfs export-device`). Refused when the DRAM file holds no such device.
pub fn open_memory_semantic_ssd(
    dram: &Path,
    flash: &Path,
    options: MssdOptions,
    backend: Option<IoBackend>,
) -> Result<(MemorySemanticSsd, crate::device::mssd::MssdRecovery)> {
    let region = Arc::new(PmemRegion::open(dram, None)?);
    if !MemorySemanticSsd::is_formatted(region.as_ref()) {
        return Err(Error::BadPath(dram.into(), "holds no memory-semantic SSD (create one with --ssd PATH:SIZE)".into()));
    }
    let geometry = crate::Profile::BYTE.default_geometry();
    let flash: Arc<dyn BlockDevice> = Arc::new(FileSsd::open(flash, &ssd_options(&geometry, None, backend, false))?);
    MemorySemanticSsd::open(flash, region, options)
}

/// A formatted memory-semantic SSD: its DRAM (`dram`) and flash image (`flash`), after the
/// device's own recovery; with the latency model `options.device_latency` names.
fn open_memory_semantic(
    dram: Arc<PmemRegion>,
    flash: &Path,
    geometry: &Geometry,
    backend: Option<IoBackend>,
    options: &VolumeOptions,
) -> Result<Devices> {
    let flash: Arc<dyn BlockDevice> = Arc::new(FileSsd::open(flash, &ssd_options(geometry, None, backend, options.read_only))?);
    let latency = options.device_latency;
    let (device, recovery) = MemorySemanticSsd::open(flash, dram, MssdOptions { latency, ..MssdOptions::default() })?;
    if let Some(model) = latency {
        // "ByteFS Table 4" alone for the paper's times: scripts and readers look for it.
        let which = if model == LatencyModel::bytefs_table4() { "ByteFS Table 4" } else { "ByteFS Table 4, changed" };
        tracing::info!("memory-semantic SSD: latency model on ({which}): {model:?}");
    }
    if recovery.found_entries() {
        tracing::info!("memory-semantic SSD {recovery}");
    }
    Ok(Devices::memory_semantic(Arc::new(device)))
}
