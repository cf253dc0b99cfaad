//! Opening volumes by path: the front ends' entry points.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::{Devices, FormatOptions, Volume, VolumeOptions};
use crate::device::mssd::{LatencyModel, MemorySemanticSsd, MssdConfig, MssdOptions, MssdRecovery};
use crate::device::{BlockDevice, ByteTier, DeviceSet, FaultPlan, FaultyDevice, FileSsd, IoBackend, PmemRegion, SsdOptions};
use crate::error::{Error, Result};
use crate::geometry::{parse_size, Geometry, MIB, SUPERBLOCK_BYTES};
use crate::kv::KvMeta;
use crate::layout::Superblock;
use crate::personality::{BlockLayout, BlockVolume, ObjectStore};

/// The embedded default fast tier: a file on tmpfs.
pub const DEFAULT_FAST_PATH: &str = "/dev/shm/alignfs/fast";

/// Where the default SSD image (`ssd.img`) and logs live: `$ALIGNFS_DATA_DIR`, else
/// `/var/tmp/alignfs`.
pub fn default_data_dir() -> PathBuf {
    std::env::var_os("ALIGNFS_DATA_DIR").map_or_else(|| PathBuf::from("/var/tmp/alignfs"), PathBuf::from)
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

fn ssd_options(geometry: &Geometry, create_len: Option<u64>, backend: Option<IoBackend>, shared: bool) -> SsdOptions {
    SsdOptions { create_len, io_workers: geometry.io_workers as usize, split_bytes: u64::from(geometry.split_bytes), backend, shared }
}

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
    options.geometry.validate(options.profile)?;
    check_device_set(fast.is_some(), ssds.len(), kv.is_some(), options.profile)?;
    let kv = options.profile.devices().kv_store.then(|| kv.map_or_else(|| default_kv_dir(&ssds[0].path), Path::to_path_buf));
    let mut targets: Vec<&Path> = fast.iter().map(|f| f.path.as_path()).chain(ssds.iter().map(|s| s.path.as_path())).collect();
    targets.extend(kv.as_deref());
    super::probe::check_targets(&targets, options.force)
}

/// Whether a profile takes these devices: a fast tier (or the device's DRAM), how many
/// SSDs, a KV directory.
fn check_device_set(fast: bool, ssds: usize, kv: bool, profile: crate::Profile) -> Result<()> {
    let (name, needs) = (profile.name(), profile.devices());
    match (fast, needs.fast_tier, ssds) {
        (_, _, 0) => Err(Error::WrongDevices("no SSD named".into())),
        (false, true, _) => Err(Error::WrongDevices(format!("profile {name} needs a fast tier"))),
        (false, _, _) if needs.memory_semantic => Err(Error::WrongDevices(format!("profile {name} needs the device's DRAM file (--fast)"))),
        (true, false, _) if !needs.memory_semantic => {
            Err(Error::WrongDevices(format!("profile {name} has no fast tier; name only the SSDs")))
        }
        _ if kv && !needs.kv_store => Err(Error::WrongDevices(format!("profile {name} keeps no KV store; drop the KV directory"))),
        (_, _, n) if n as u64 > u64::from(needs.max_ssds) => {
            let most = if needs.max_ssds == 1 { "one SSD".to_string() } else { format!("{} SSDs at most", needs.max_ssds) };
            Err(Error::WrongDevices(format!("profile {name} takes {most}, not {n}")))
        }
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
    let needs = options.profile.devices();
    if needs.memory_semantic {
        let dram = fast.expect("checked: a memory-semantic SSD has its DRAM named");
        return create_memory_semantic(dram, &ssds[0], options, backend, created);
    }
    let kv = needs.kv_store.then(|| kv.map_or_else(|| default_kv_dir(&ssds[0].path), Path::to_path_buf));
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
    let fast = match fast {
        Some(fast) => Some(Arc::new(create_region(fast, fast.size, created)?) as Arc<dyn ByteTier>),
        None => None,
    };
    Ok(Devices { fast, ssd, kv, kv_syncs: None, byte: None })
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

/// A new memory-semantic SSD: its flash image (`ssd`; the size names the capacity the
/// block interface offers, the image is created larger by the over-provisioning and a
/// label page) and its DRAM file (`dram`).
fn create_memory_semantic(
    dram: &DeviceSpec,
    ssd: &DeviceSpec,
    options: &FormatOptions,
    backend: Option<IoBackend>,
    created: &mut Created,
) -> Result<Devices> {
    let config = match ssd.size {
        Some(bytes) => MssdConfig { log_bytes: device_log_bytes(bytes), ..MssdConfig::new(bytes / MIB * MIB) },
        None => {
            let len = std::fs::metadata(&ssd.path).map_err(|e| Error::io(format!("stat {}", ssd.path.display()), e))?.len();
            MssdConfig::fitting(len, device_log_bytes(len))?
        }
    };
    let (dram_bytes, image_bytes) = MemorySemanticSsd::sizes(&config)?;
    created.note(&ssd.path);
    let image_len = ssd.size.map(|_| image_bytes);
    let flash: Arc<dyn BlockDevice> = Arc::new(FileSsd::open(&ssd.path, &ssd_options(&options.geometry, image_len, backend, false))?);
    let region = Arc::new(create_region(dram, Some(dram.size.unwrap_or(dram_bytes).max(dram_bytes)), created)?);
    let device = MemorySemanticSsd::format(flash, region, &config, MssdOptions::default())?;
    Ok(Devices::memory_semantic(Arc::new(device)))
}

/// A formatted memory-semantic SSD: its DRAM (`dram`) and flash image (`flash`), after the
/// device's own recovery; with ByteFS's latency model when `options.device_latency`.
fn open_memory_semantic(
    dram: Arc<PmemRegion>,
    flash: &Path,
    geometry: &Geometry,
    backend: Option<IoBackend>,
    options: &VolumeOptions,
) -> Result<Devices> {
    let flash: Arc<dyn BlockDevice> = Arc::new(FileSsd::open(flash, &ssd_options(geometry, None, backend, options.read_only))?);
    let latency = options.device_latency.then(LatencyModel::bytefs_table4);
    let (device, recovery) = MemorySemanticSsd::open(flash, dram, MssdOptions { latency, ..MssdOptions::default() })?;
    if let Some(model) = latency {
        tracing::info!("memory-semantic SSD: latency model on (ByteFS Table 4): {model:?}");
    }
    if recovery != MssdRecovery::default() {
        tracing::info!("memory-semantic SSD recovered: {recovery:?}");
    }
    Ok(Devices::memory_semantic(Arc::new(device)))
}

/// One SSD as it is, or several as a [`DeviceSet`] of `member_bytes(members)` each.
fn join_members(
    mut members: Vec<Arc<dyn BlockDevice>>,
    member_bytes: impl Fn(&[Arc<dyn BlockDevice>]) -> u64,
) -> Result<Arc<dyn BlockDevice>> {
    if members.len() == 1 {
        return Ok(members.remove(0));
    }
    let bytes = member_bytes(&members);
    Ok(Arc::new(DeviceSet::new(members, bytes)?))
}

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
        Some(superblock) if !superblock.profile.devices().kv_store => {
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
    let Some(first) = ssds.first() else { return Err(Error::WrongDevices("no SSD named".into())) };
    let with_faults = |device: Arc<dyn BlockDevice>| -> Arc<dyn BlockDevice> {
        match &faults {
            Some(plan) => Arc::new(FaultyDevice::new(device, Arc::clone(plan))),
            None => device,
        }
    };
    let raw = ssd_superblock(first)?;
    // A memory-semantic SSD's flash image holds pages where its FTL put them; its DRAM
    // (named as the fast tier) says what it is.
    if raw.as_ref().is_none_or(|sb| sb.profile.devices().memory_semantic) && fast.exists() && ssds.len() == 1 {
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
    if let Some(superblock) = raw.filter(|sb| !sb.profile.devices().fast_tier) {
        let ordered = order_members(ssds, &superblock)?;
        let mut members: Vec<Arc<dyn BlockDevice>> = Vec::with_capacity(ordered.len());
        for path in &ordered {
            members.push(Arc::new(FileSsd::open(path, &ssd_options(&superblock.geometry, None, backend, read_only))?));
        }
        let device = join_members(members, |_| superblock.member_bytes())?;
        if superblock.profile.devices().kv_store {
            return Ok(Devices::with_kv(with_faults(device), kv.map_or_else(|| default_kv_dir(first), Path::to_path_buf)));
        }
        return Ok(Devices::ssd_only(with_faults(device)));
    }
    if ssds.len() > 1 {
        return Err(Error::WrongDevices(format!("{} holds no multi-SSD volume; name one SSD", first.display())));
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
        return Err(Error::WrongDevices(format!("the volume spans {count} SSDs, not {}; name each once", ssds.len())));
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
            Some(sb) => return Err(Error::WrongDevices(format!("{name} is SSD {} of the volume, which was named twice", sb.ssd_index))),
            None => return Err(Error::BadPath(path.clone(), format!("holds no readable superblock of volume {}", first.uuid_string()))),
        }
    }
    Ok(ordered.into_iter().map(|p| p.expect("as many distinct places as paths")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_specs() {
        assert_eq!(DeviceSpec::parse("/dev/shm/f:1G").unwrap(), DeviceSpec { path: "/dev/shm/f".into(), size: Some(1 << 30) });
        assert_eq!(DeviceSpec::parse("/a/b").unwrap(), DeviceSpec { path: "/a/b".into(), size: None });
        assert_eq!(DeviceSpec::parse("/a:b").unwrap(), DeviceSpec { path: "/a:b".into(), size: None });
        assert!(DeviceSpec::parse(":1G").is_err());
        assert!(matches!(DeviceSpec::parse("x.img:8Q"), Err(Error::InvalidArgument(m)) if m.contains("8Q")));
        assert_eq!(DeviceSpec::parse("/a:b1").unwrap().path, Path::new("/a:b1"));
        assert!(DeviceSpec::parse("").is_err());
    }

    /// A 2 MiB fast tier on tmpfs and an 8 MiB SSD image, in directories removed on drop.
    fn scratch_devices() -> (tempfile::TempDir, tempfile::TempDir, DeviceSpec, DeviceSpec) {
        let dir = tempfile::tempdir().unwrap();
        let shm = tempfile::tempdir_in("/dev/shm").unwrap();
        let fast = DeviceSpec { path: shm.path().join("fast"), size: Some(2 << 20) };
        let ssd = DeviceSpec { path: dir.path().join("ssd.img"), size: Some(8 << 20) };
        (dir, shm, fast, ssd)
    }

    #[test]
    fn format_and_open_real_files() {
        let (dir, _shm, fast, ssd) = scratch_devices();
        let (superblock, volume) = format_paths(Some(&fast), std::slice::from_ref(&ssd), None, &FormatOptions::default(), None).unwrap();
        let f = volume.create_file(crate::Ino::ROOT, b"f", 0o644, 0, 0).unwrap().ino;
        let data: Vec<u8> = (0..300_000u32).map(|i| (i % 253) as u8).collect();
        volume.write(f, 1234, &data).unwrap();
        volume.fsync(f).unwrap();
        volume.close().unwrap();
        for mode in [crate::ReadMode::Direct, crate::ReadMode::Buffered] {
            let volume = open_paths(&fast.path, &ssd.path, VolumeOptions { read_mode: mode, ..VolumeOptions::default() }, None).unwrap();
            assert_eq!(volume.superblock().uuid, superblock.uuid);
            let mut out = vec![0u8; data.len()];
            assert_eq!(volume.read(f, 1234, &mut out).unwrap(), data.len());
            assert!(out == data);
        }
        // Formatting again without force names the existing volume.
        assert!(matches!(
            format_paths(Some(&fast), std::slice::from_ref(&ssd), None, &FormatOptions::default(), None),
            Err(Error::AlreadyFormatted { .. })
        ));
        assert!(matches!(open_paths(&dir.path().join("missing"), &ssd.path, VolumeOptions::default(), None), Err(Error::BadPath(..))));
    }

    #[test]
    fn scrap_volume_on_an_ssd_alone() {
        let (dir, _shm, fast, _) = scratch_devices();
        let ssd = DeviceSpec { path: dir.path().join("scrap.img"), size: Some(16 << 20) };
        let geometry = Geometry::for_profile(crate::Profile::SCRAP);
        let options = FormatOptions { geometry, profile: crate::Profile::SCRAP, force: false, ..Default::default() };
        assert!(matches!(format_paths(Some(&fast), std::slice::from_ref(&ssd), None, &options, None), Err(Error::WrongDevices(_))));
        let (superblock, volume) = format_paths(None, std::slice::from_ref(&ssd), None, &options, None).unwrap();
        let f = volume.create_file(crate::Ino::ROOT, b"f", 0o644, 0, 0).unwrap().ino;
        let data: Vec<u8> = (0..700_000u32).map(|i| (i % 251) as u8).collect();
        volume.write(f, 777, &data).unwrap();
        volume.close().unwrap();
        assert_eq!(ssd_superblock(&ssd.path).unwrap().map(|sb| sb.uuid), Some(superblock.uuid));
        // The fast-tier path is not used (nor created) for a scrap volume.
        let volume = open_paths(&dir.path().join("no-fast-tier"), &ssd.path, VolumeOptions::default(), None).unwrap();
        let mut out = vec![0u8; data.len()];
        assert_eq!(volume.read(f, 777, &mut out).unwrap(), data.len());
        assert!(out == data);
        assert!(volume.recovery().clean);
    }

    #[test]
    fn byte_volume_on_a_memory_semantic_ssd() {
        let (dir, shm, _, _) = scratch_devices();
        let ssd = DeviceSpec { path: dir.path().join("flash.img"), size: Some(16 << 20) };
        let dram = DeviceSpec { path: shm.path().join("dram"), size: None };
        let options = FormatOptions {
            geometry: Geometry::for_profile(crate::Profile::BYTE),
            profile: crate::Profile::BYTE,
            force: false,
            ..Default::default()
        };
        assert!(matches!(format_paths(None, std::slice::from_ref(&ssd), None, &options, None), Err(Error::WrongDevices(_))));
        let (superblock, volume) = format_paths(Some(&dram), std::slice::from_ref(&ssd), None, &options, None).unwrap();
        let f = volume.create_file(crate::Ino::ROOT, b"f", 0o644, 0, 0).unwrap().ino;
        let data: Vec<u8> = (0..70_000u32).map(|i| (i % 249) as u8).collect();
        volume.write(f, 100, &data).unwrap();
        volume.write(f, 5, b"small").unwrap();
        let payload = |volume: &Volume| volume.device_counters().iter().find(|c| c.name == "byte_store_payload").unwrap().value;
        let byte_stores = payload(&volume);
        assert!(byte_stores >= 5 + 100, "residue and the small write went through the byte interface ({byte_stores})");
        // A new file's first 100 bytes cost their own lines and a journal record, not a
        // page of zeros around them.
        let g = volume.create_file(crate::Ino::ROOT, b"g", 0o644, 0, 0).unwrap().ino;
        let before = payload(&volume);
        volume.write(g, 0, &[9; 100]).unwrap();
        let spent = payload(&volume) - before;
        assert!(spent < 512, "a 100-byte write to a new file stored {spent} bytes through the byte interface");
        volume.close().unwrap();
        let mut expected = vec![0u8; 100 + data.len()];
        expected[100..].copy_from_slice(&data);
        expected[5..10].copy_from_slice(b"small");
        for byte_interface in [false, true] {
            let options = VolumeOptions { byte_interface, ..VolumeOptions::default() };
            let volume = open_paths(&dram.path, &ssd.path, options, None).unwrap();
            assert_eq!(volume.superblock().uuid, superblock.uuid);
            let mut out = vec![0u8; expected.len()];
            assert_eq!(volume.read(f, 0, &mut out).unwrap(), expected.len());
            assert!(out == expected);
            volume.write(f, 3, b"xy").unwrap();
            expected[3..5].copy_from_slice(b"xy");
            volume.close().unwrap();
        }
        assert!(matches!(format_paths(Some(&dram), std::slice::from_ref(&ssd), None, &options, None), Err(Error::AlreadyFormatted { .. })));
    }

    /// A new `byte` volume on a 16 MiB flash image; the scratch directories live as
    /// long as the first value.
    fn format_byte() -> ((tempfile::TempDir, tempfile::TempDir), DeviceSpec, DeviceSpec, Volume) {
        let (dir, shm, _, _) = scratch_devices();
        let ssd = DeviceSpec { path: dir.path().join("flash.img"), size: Some(16 << 20) };
        let dram = DeviceSpec { path: shm.path().join("dram"), size: None };
        let options = FormatOptions {
            geometry: Geometry::for_profile(crate::Profile::BYTE),
            profile: crate::Profile::BYTE,
            force: false,
            ..Default::default()
        };
        let (_, volume) = format_paths(Some(&dram), std::slice::from_ref(&ssd), None, &options, None).unwrap();
        ((dir, shm), dram, ssd, volume)
    }

    /// ByteFS's write-back by modified ratio: a page written back with at most 1/8 of its
    /// 64-byte lines changed sends those lines through the byte interface and no block;
    /// an unchanged page sends nothing; a page changed more goes whole through the block
    /// interface. Block-only, every page goes whole.
    #[test]
    fn byte_writes_back_pages_by_their_modified_ratio() {
        let (_scratch, dram, ssd, volume) = format_byte();
        let f = volume.create_file(crate::Ino::ROOT, b"f", 0o644, 0, 0).unwrap().ino;
        let mut pages: Vec<u8> = (0..4 * 4096u32).map(|i| (i % 251) as u8).collect();
        volume.write(f, 0, &pages).unwrap();
        let device = |volume: &Volume, name: &str| volume.device_counters().iter().find(|c| c.name == name).unwrap().value;
        let counter = |volume: &Volume, c: crate::stats::Counter| volume.stats().get(c);
        let (blocks, stores) = (device(&volume, "block_write_bytes"), device(&volume, "byte_store_payload"));
        // Two lines of page 1 change (128 bytes), the other pages not at all.
        pages[4096 + 100] ^= 0xff;
        pages[4096 + 3000] ^= 0xff;
        volume.write_back(f, 0, &pages).unwrap();
        assert_eq!(device(&volume, "block_write_bytes"), blocks, "no block went through the block interface");
        let stored = device(&volume, "byte_store_payload") - stores;
        assert!((128..1024).contains(&stored), "the two changed lines and their records went as byte stores ({stored} bytes)");
        assert_eq!(counter(&volume, crate::stats::Counter::write_back_blocks_by_line), 1);
        assert_eq!(counter(&volume, crate::stats::Counter::write_back_blocks_unchanged), 3);
        // Half of page 2 changes: whole, through the block interface.
        pages[8192..8192 + 2048].fill(7);
        volume.write_back(f, 0, &pages).unwrap();
        assert!(device(&volume, "block_write_bytes") >= blocks + 4096, "a page changed more went whole");
        let mut out = vec![0u8; pages.len()];
        volume.read(f, 0, &mut out).unwrap();
        assert!(out == pages);
        // Past the largest file, or past the end of the offset space: refused, nothing written.
        assert!(matches!(volume.write_back(f, 1 << 60, &pages[..4096]), Err(Error::FileTooLarge)));
        assert!(matches!(volume.write_back(f, u64::MAX - 4095, &pages[..4096]), Err(Error::FileTooLarge)));
        assert_eq!(volume.getattr(f).unwrap().size, pages.len() as u64);
        volume.close().unwrap();
        // Block-only: the same write-back goes whole.
        let block_only = VolumeOptions { byte_interface: false, ..VolumeOptions::default() };
        let volume = open_paths(&dram.path, &ssd.path, block_only.clone(), None).unwrap();
        volume.read(f, 0, &mut out).unwrap();
        assert!(out == pages);
        pages[100] ^= 0xff;
        let blocks = device(&volume, "block_write_bytes");
        volume.write_back(f, 0, &pages).unwrap();
        assert!(device(&volume, "block_write_bytes") >= blocks + 4 * 4096, "block-only writes back every page whole");
        volume.close().unwrap();
        let volume = open_paths(&dram.path, &ssd.path, VolumeOptions::default(), None).unwrap();
        volume.read(f, 0, &mut out).unwrap();
        assert!(out == pages, "read back after reopening");
        assert!(volume.check().is_empty());
    }

    /// A `byte` volume keeps the blocks and residue units it read or wrote in DRAM, as the
    /// host's cache of a device no kernel cache stands in front of: a second read of a
    /// block asks the device for nothing, every write (whole blocks, residue, truncation)
    /// is seen at once, and dropping the copies sends reads to the device again.
    /// Block-only too.
    #[test]
    fn byte_reads_again_from_the_hosts_cache() {
        let (_scratch, dram, ssd, volume) = format_byte();
        let device = |volume: &Volume| volume.device_counters().iter().find(|c| c.name == "block_read_bytes").unwrap().value;
        let loads = |volume: &Volume| volume.device_counters().iter().find(|c| c.name == "byte_load_bytes").unwrap().value;
        let hits = |volume: &Volume| volume.stats().get(crate::stats::Counter::clean_page_hits);
        let read_all = |volume: &Volume, f: crate::Ino, len: usize| {
            let mut out = vec![0u8; len];
            assert_eq!(volume.read(f, 0, &mut out).unwrap(), len);
            out
        };
        let f = volume.create_file(crate::Ino::ROOT, b"f", 0o644, 0, 0).unwrap().ino;
        let mut expected: Vec<u8> = (0..4 * 4096u32).map(|i| (i % 251) as u8).collect();
        volume.write(f, 0, &expected).unwrap();
        volume.drop_clean_pages();
        let before = device(&volume);
        assert!(read_all(&volume, f, expected.len()) == expected);
        assert!(device(&volume) >= before + 4 * 4096, "the first read went to the device");
        let (before, hits_before) = (device(&volume), hits(&volume));
        assert!(read_all(&volume, f, expected.len()) == expected);
        assert_eq!(device(&volume), before, "the second read asked the device for nothing");
        assert_eq!(hits(&volume), hits_before + 4);
        // A whole block, a small write into another (byte-interface residue) and a
        // truncation that cuts the last block: each read back at once.
        expected[4096..8192].fill(9);
        volume.write(f, 4096, &[9; 4096]).unwrap();
        expected[9000..9100].fill(3);
        volume.write(f, 9000, &[3; 100]).unwrap();
        let loads_before = loads(&volume);
        assert!(read_all(&volume, f, expected.len()) == expected);
        volume.truncate(f, 14000).unwrap();
        volume.truncate(f, expected.len() as u64).unwrap();
        expected[14000..].fill(0);
        assert!(read_all(&volume, f, expected.len()) == expected);
        // Residue larger than loads would fetch: 2,000 bytes of a partial block.
        expected[12388..14388].fill(4);
        volume.write(f, 12388, &[4; 2000]).unwrap();
        assert!(read_all(&volume, f, expected.len()) == expected);
        assert_eq!(device(&volume), before, "writes leave their blocks' and units' copies current");
        assert_eq!(loads(&volume), loads_before, "residue the host wrote is read from its copy");
        volume.drop_clean_pages();
        assert!(read_all(&volume, f, expected.len()) == expected);
        assert!(device(&volume) >= before + 5 * 4096, "dropped copies (four blocks, a unit) are read from the device again");
        let before = device(&volume);
        assert!(read_all(&volume, f, expected.len()) == expected);
        assert_eq!(device(&volume), before, "and kept again");
        volume.close().unwrap();
        let block_only = VolumeOptions { byte_interface: false, ..VolumeOptions::default() };
        let volume = open_paths(&dram.path, &ssd.path, block_only, None).unwrap();
        assert!(read_all(&volume, f, expected.len()) == expected);
        let before = device(&volume);
        assert!(read_all(&volume, f, expected.len()) == expected);
        assert_eq!(device(&volume), before, "block-only reads again from the host's cache too");
        volume.close().unwrap();
        // None kept (`--clean-cache 0`): every read goes to the device.
        let no_cache = VolumeOptions { clean_cache_bytes: 0, ..VolumeOptions::default() };
        let volume = open_paths(&dram.path, &ssd.path, no_cache, None).unwrap();
        assert!(read_all(&volume, f, expected.len()) == expected);
        let (before, hits_before) = (device(&volume), hits(&volume));
        assert!(read_all(&volume, f, expected.len()) == expected);
        assert!(device(&volume) >= before + 3 * 4096, "without copies the second read went to the device");
        assert_eq!(hits(&volume), hits_before);
        volume.close().unwrap();
    }

    #[test]
    fn one_writer_or_many_readers() {
        let (_dir, _shm, fast, ssd) = scratch_devices();
        let (_, formatted) = format_paths(Some(&fast), std::slice::from_ref(&ssd), None, &FormatOptions::default(), None).unwrap();
        assert!(matches!(
            format_paths(Some(&fast), std::slice::from_ref(&ssd), None, &FormatOptions { force: true, ..FormatOptions::default() }, None),
            Err(Error::InUse { .. })
        ));
        formatted.close().unwrap();
        let reader = VolumeOptions { read_only: true, ..VolumeOptions::default() };
        let writer = open_paths(&fast.path, &ssd.path, VolumeOptions::default(), None).unwrap();
        assert!(matches!(open_paths(&fast.path, &ssd.path, VolumeOptions::default(), None), Err(Error::InUse { .. })));
        assert!(matches!(open_paths(&fast.path, &ssd.path, reader.clone(), None), Err(Error::InUse { .. })));
        writer.close().unwrap();
        let a = open_paths(&fast.path, &ssd.path, reader.clone(), None).unwrap();
        let b = open_paths(&fast.path, &ssd.path, reader, None).unwrap();
        assert!(matches!(open_paths(&fast.path, &ssd.path, VolumeOptions::default(), None), Err(Error::InUse { .. })));
        drop((a, b));
        open_paths(&fast.path, &ssd.path, VolumeOptions::default(), None).unwrap().close().unwrap();
    }
}
