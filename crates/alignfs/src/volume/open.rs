//! Formatting and opening: superblocks, the metadata area, checkpoints and replay,
//! allocators rebuilt from the maps, then the profile's policy and workers.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use super::block_store::{BlockPlacement, BlockStore, BlockStoreParts};
use super::clean_pages::CleanPages;
use super::committer::Committer;
use super::engine::{Engine, EngineParts};
use super::recover::{recover_metadata, windows, MetaDevice, Recovered};
use super::{eof, maintenance, Devices, FormatOptions, Volume, VolumeOptions};
use crate::device::power_loss::PowerLog;
use crate::device::{run_batch, AlignedBuf, BlockDevice, ByteTier, IoOp, IoRequest};
use crate::error::{DeviceProblem, Error, Result};
use crate::geometry::{Geometry, MetaLayout, SUPERBLOCK_BYTES};
use crate::journal::{checkpoint_payload, AsIs, CheckpointSlots};
use crate::kv::KvMeta;
use crate::layout::{BlockRefs, DeviceRole, Superblock, FORMAT_VERSION};
use crate::lines::LineStore;
use crate::meta::{now_ns, FileKind, Ino, MetaState};
use crate::profile::{MetaStore as MetaStoreKind, Promise, ResidueSetup};
use crate::residue::{restore_fragment_pages, ResidueStore};
use crate::stats::Stats;

/// The superblock sector of SSD `member` of `ssd` (a device set has one per member).
pub(super) fn read_ssd_superblock(ssd: &dyn BlockDevice, member: u64) -> Result<Vec<u8>> {
    if ssd.len_bytes() < SUPERBLOCK_BYTES {
        return Ok(Vec::new());
    }
    let at = member * ssd.member_bytes();
    let request = IoRequest { op: IoOp::Read, offset_bytes: at, buf: AlignedBuf::zeroed(SUPERBLOCK_BYTES as usize) };
    Ok(run_batch(ssd, vec![request])?.remove(0).to_vec())
}

fn read_fast_superblock(fast: &dyn ByteTier) -> Vec<u8> {
    let mut bytes = vec![0u8; SUPERBLOCK_BYTES.min(fast.len_bytes()) as usize];
    fast.read(0, &mut bytes);
    bytes
}

/// `AlreadyFormatted` if any of `(superblock bytes, device)` holds a volume: the check
/// [`Volume::format`] runs on devices it is handed open (the front ends' paths are
/// checked in full before: `crate::paths::probe`).
fn refuse_superblocks(existing: &[(Vec<u8>, String)]) -> Result<()> {
    for (bytes, device) in existing {
        if Superblock::has_magic(bytes) {
            let found =
                Superblock::decode(bytes, device).map_or_else(|_| "an alignfs superblock that does not decode".into(), |sb| sb.describe());
            return Err(Error::AlreadyFormatted { device: device.clone(), found });
        }
    }
    Ok(())
}

/// The usable bytes of an SSD (or of every member of a device set): whole blocks, and
/// whole split units when there are several SSDs, so no IO straddles two.
fn usable_ssd_bytes(ssd: &dyn BlockDevice, geometry: &Geometry) -> u64 {
    match ssd.member_count() as u64 {
        1 => ssd.len_bytes() / geometry.block() * geometry.block(),
        n => ssd.member_bytes() / u64::from(geometry.split_bytes) * u64::from(geometry.split_bytes) * n,
    }
}

/// The superblock of a new volume (role fast, SSD 0; callers adjust it per device).
fn new_superblock(options: &FormatOptions, fast_bytes: u64, ssd: &dyn BlockDevice, layout: MetaLayout) -> Result<Superblock> {
    let geometry = options.geometry;
    let ssd_bytes = usable_ssd_bytes(ssd, &geometry);
    let ssd_count = u32::try_from(ssd.member_count()).unwrap_or(u32::MAX);
    let max_ssds = options.profile.devices().max_ssds();
    if ssd_count > max_ssds {
        return Err(Error::WrongDevices(DeviceProblem::TooManySsds {
            profile: options.profile.name(),
            max: max_ssds,
            given: ssd_count as usize,
        }));
    }
    if ssd_bytes / geometry.block() < 2 {
        return Err(Error::Geometry(format!("SSD of {} bytes holds fewer than two {}-byte blocks", ssd.len_bytes(), geometry.block())));
    }
    Ok(Superblock {
        version: FORMAT_VERSION,
        role: DeviceRole::Fast,
        profile: options.profile,
        uuid: *uuid::Uuid::new_v4().as_bytes(),
        geometry,
        fast_bytes,
        ssd_bytes,
        layout,
        created_unix_ns: now_ns(),
        ssd_count,
        ssd_index: 0,
        in_place_meta: options.profile.metadata_store(options.meta_store)? == MetaStoreKind::InPlaceLines,
    })
}

/// Checkpoint generation 1: the root directory alone, owned by the formatting user.
fn write_fresh_checkpoint(slots: &mut CheckpointSlots) -> Result<()> {
    slots.clear()?;
    slots.write(&checkpoint_payload(&fresh_state(), &[], &AsIs), 1)
}

/// A new volume's state: the root directory alone, owned by the formatting user.
fn fresh_state() -> MetaState {
    MetaState::fresh(rustix::process::getuid().as_raw(), rustix::process::getgid().as_raw(), now_ns())
}

/// `superblock`, raised to this build's format version on every SSD first if it is older.
/// A KV store opened writable may start a journal with a header, which an older build
/// would read as the journal's end; it refuses the raised version instead.
fn raise_format_version(ssd: &dyn BlockDevice, superblock: Superblock) -> Result<Superblock> {
    if superblock.version == FORMAT_VERSION {
        return Ok(superblock);
    }
    let raised = Superblock { version: FORMAT_VERSION, ..superblock };
    for member in 0..raised.ssd_count {
        write_ssd_superblock(ssd, u64::from(member), &Superblock { ssd_index: member, ..raised.clone() }.encode())?;
    }
    Ok(raised)
}

/// Write (and flush) the superblock sector of SSD `member`.
fn write_ssd_superblock(ssd: &dyn BlockDevice, member: u64, image: &[u8]) -> Result<()> {
    let mut buf = AlignedBuf::zeroed(SUPERBLOCK_BYTES as usize);
    buf.copy_from_slice(image);
    run_batch(ssd, vec![IoRequest { op: IoOp::Write, offset_bytes: member * ssd.member_bytes(), buf }])?;
    ssd.flush()
}

/// Format the devices as one new volume of `options.profile`, which decides whether
/// they include a fast tier. Refuses devices that already hold a volume unless
/// `options.force`.
pub(super) fn format(devices: &Devices, options: &FormatOptions) -> Result<Superblock> {
    let profile = options.profile;
    profile.validate_geometry(&options.geometry)?;
    let kind = profile.devices();
    if !devices.are(kind) {
        return Err(Error::WrongDevices(DeviceProblem::Kind {
            profile: profile.name(),
            needs: kind.describe(),
            given: devices.describe_kind(),
        }));
    }
    match devices {
        Devices::FastTierAndSsd { fast, ssd } => format_with_fast_tier(fast, ssd.as_ref(), options),
        Devices::Ssds { ssd } => format_on_ssd(ssd, MetaDevice::Ssd(ssd), options),
        Devices::SsdAndKvStore { ssd, dir, syncs } => format_with_kv(ssd.as_ref(), dir, syncs.as_ref(), options),
        Devices::MemorySemanticSsd { device } => {
            let ssd = devices.ssd();
            format_on_ssd(&ssd, MetaDevice::MemorySemantic { ssd: &ssd, byte: Some(device) }, options)
        }
    }
}

/// Open a formatted volume: check the superblocks, load the newest checkpoint, replay
/// the journal, rebuild the allocators, start the profile's workers. Nothing is
/// written before every check passed, except that a KV store's own open may seal a
/// journal, and so an older `nvstore` volume opened writable has its superblocks
/// raised to this build's format version first.
pub(super) fn open(devices: Devices, options: VolumeOptions) -> Result<Volume> {
    let started = Instant::now();
    let ssd = devices.ssd();
    let (superblock, meta_name) = match devices.fast() {
        Some(fast) => check_with_fast_tier(fast.as_ref(), ssd.as_ref())?,
        None => check_on_ssd(ssd.as_ref())?,
    };
    let kind = superblock.profile.devices();
    if !devices.are(kind) {
        let profile = superblock.profile.name();
        return Err(Error::WrongDevices(DeviceProblem::Kind { profile, needs: kind.describe(), given: devices.describe_kind() }));
    }
    let superblock = match &devices {
        Devices::SsdAndKvStore { dir, .. } if !options.read_only => {
            // A directory of another volume, or none, is refused before anything is written.
            KvMeta::check_owner(dir, superblock.uuid)?;
            raise_format_version(ssd.as_ref(), superblock)?
        }
        _ => superblock,
    };
    assemble(devices, superblock, meta_name, options, started)
}

fn assemble(devices: Devices, superblock: Superblock, meta_name: String, options: VolumeOptions, started: Instant) -> Result<Volume> {
    let ssd = devices.ssd();
    if ssd.len_bytes() < superblock.ssd_bytes {
        return Err(Error::corrupt(
            "superblock",
            &format!("SSD {}", ssd.describe()),
            0,
            format!("device is {} bytes, the volume needs {}", ssd.len_bytes(), superblock.ssd_bytes),
        ));
    }
    let geometry = superblock.geometry;
    let layout = superblock.layout;
    let (fast, byte) = match &devices {
        Devices::FastTierAndSsd { fast, .. } => (Some(Arc::clone(fast)), None),
        Devices::MemorySemanticSsd { device } => (None, Some(Arc::clone(device))),
        _ => (None, None),
    };
    if let Some(device) = &byte {
        device.count_as_metadata(&[layout.metadata_area()]);
    }
    let recovered = recover_metadata(&devices, &superblock, &meta_name, &options, started)?;
    let Recovered { meta, store, counters, recovery, fragments, checksums } = recovered;
    let spec = superblock.profile.spec();
    let residue = spec.residue_store(&ResidueSetup {
        fast: fast.as_ref(),
        byte: byte.as_ref(),
        layout: &layout,
        geometry: &geometry,
        options: &options,
        fragments: fragments.as_ref().map(|(log, _)| log),
        units_to_restore: fragments.as_ref().map_or(0, |(_, blocks)| blocks.len() as u64),
    })?;
    if let Some((log, blocks)) = &fragments {
        restore_fragment_pages(&meta, residue.as_ref(), log, blocks, geometry.page_bytes);
    }
    let policy = spec.policy(&options);
    let clean = if policy.keeps_clean_pages() { CleanPages::new(options.clean_cache_bytes, geometry.block()) } else { None };
    let reserved = superblock.reserved_ssd_blocks();
    let refs = BlockRefs::new(superblock.ssd_blocks(), &reserved);
    claim_units(&meta, residue.as_ref(), &refs, &meta_name)?;
    let ssd_count = superblock.ssd_count as usize;
    let placement = match (policy.keeps_blocks_home(), superblock.profile.promise()) {
        // With one SSD the reserved blocks are the first ones: homes start after them.
        (true, _) if ssd_count == 1 => BlockPlacement::AtHome { base: reserved.len() as u64 },
        (_, Promise::OnSync) => BlockPlacement::InPlaceUntilSync,
        _ => BlockPlacement::OutOfPlace,
    };
    let stats = Arc::new(Stats::new(&counters));
    let blocks = BlockStore::new(BlockStoreParts {
        ssd: devices.ssd(),
        geometry,
        member_bytes: superblock.member_bytes(),
        ssd_count,
        refs,
        placement,
        checksums,
        clean,
        stats: Arc::clone(&stats),
    });
    let inner = Arc::new(Engine::new(EngineParts {
        superblock,
        options,
        meta,
        stats,
        policy,
        blocks,
        committer: Committer::new(store),
        residue,
        fast,
        device: byte,
        recovery,
    }));
    start(inner)
}

/// Readies an assembled engine for use and starts its background work.
fn start(inner: Arc<Engine>) -> Result<Volume> {
    if !inner.options.read_only {
        // Bytes past EOF in fast pages may hold an unacknowledged append: zero them so
        // a later extension exposes zeros (never-acknowledged data stays invisible).
        // Where residue is volatile, a crash can keep a smaller size than blocks merged
        // before it reach: such files clear those bytes before they grow again.
        let stale_tails = !inner.recovery.clean && inner.superblock.profile.promise() == Promise::OnSync;
        let block = inner.geometry.block();
        for inode in inner.meta.snapshot().iter().filter(|i| i.kind == FileKind::File) {
            let size = inode.size();
            eof::zero_beyond_eof(&inner, inode, size);
            if stale_tails {
                // The block holding EOF, and every block after it, if it has SSD bytes.
                let past_eof = inode.map.lock().range(size / block..).any(|(_, entry)| !entry.is_zeros());
                inode.stale_tail.store(past_eof, Ordering::SeqCst);
            }
        }
    }
    let background = inner.options.background && !inner.options.read_only;
    let workers = if background {
        let engine: Arc<dyn crate::profile::EngineApi> = Arc::clone(&inner) as _;
        let mut workers = vec![maintenance::start(&inner)?];
        workers.extend(inner.policy.start_workers(&engine)?);
        workers
    } else {
        Vec::new()
    };
    Ok(Volume { inner, workers, closed: false })
}

/// A fast tier and one SSD: the superblock, checkpoints, journal and residue pages on the
/// fast tier, a copy of the superblock on the SSD.
fn format_with_fast_tier(fast: &Arc<dyn ByteTier>, ssd: &dyn BlockDevice, options: &FormatOptions) -> Result<Superblock> {
    let geometry = options.geometry;
    if !options.force {
        refuse_superblocks(&[(read_fast_superblock(fast.as_ref()), fast.describe()), (read_ssd_superblock(ssd, 0)?, ssd.describe())])?;
    }
    let layout = MetaLayout::on_fast_tier(fast.len_bytes(), ssd.len_bytes(), &geometry)?;
    let superblock = new_superblock(options, fast.len_bytes(), ssd, layout)?;
    // Invalidate what a previous volume left: its superblock first, so a crash during
    // format never leaves a half-new volume that opens.
    fast.write_persist(0, &[0u8; SUPERBLOCK_BYTES as usize]);
    fast.zero(layout.journal_offset, layout.journal_bytes as usize);
    fast.persist(layout.journal_offset, layout.journal_bytes as usize);
    let (_, mut slots) = windows(MetaDevice::Fast(fast), &layout, "fast tier")?;
    write_fresh_checkpoint(&mut slots)?;
    write_ssd_superblock(ssd, 0, &Superblock { role: DeviceRole::Ssd, ..superblock.clone() }.encode())?;
    fast.write_persist(0, &superblock.encode());
    Ok(superblock)
}

/// SSDs alone: the superblock, checkpoints and journal in a metadata area at the start of
/// the first (written through `meta`), a superblock copy on each.
fn format_on_ssd(ssd: &Arc<dyn BlockDevice>, meta: MetaDevice<'_>, options: &FormatOptions) -> Result<Superblock> {
    let geometry = options.geometry;
    let members = ssd.member_count() as u64;
    if !options.force {
        let existing: Vec<(Vec<u8>, String)> =
            (0..members).map(|m| Ok((read_ssd_superblock(ssd.as_ref(), m)?, ssd.describe()))).collect::<Result<_>>()?;
        refuse_superblocks(&existing)?;
    }
    let placement = options.profile.devices().meta_placement();
    let layout = MetaLayout::at(placement, 0, usable_ssd_bytes(ssd.as_ref(), &geometry) / members, &geometry)?;
    let superblock = Superblock { role: DeviceRole::Ssd, ..new_superblock(options, 0, ssd.as_ref(), layout)? };
    // As with a fast tier: the old superblocks go first, the new ones last.
    for member in 0..members {
        write_ssd_superblock(ssd.as_ref(), member, &[0u8; SUPERBLOCK_BYTES as usize])?;
    }
    if superblock.in_place_meta {
        LineStore::format(Arc::clone(ssd), &layout, superblock.uuid, ssd.describe(), &fresh_state())?;
    } else {
        let (journal, mut slots) = windows(meta, &layout, &ssd.describe())?;
        journal.write_durable(0, &vec![0u8; layout.journal_bytes as usize])?;
        write_fresh_checkpoint(&mut slots)?;
    }
    for member in (0..members).rev() {
        let copy = Superblock { ssd_index: member as u32, ..superblock.clone() };
        write_ssd_superblock(ssd.as_ref(), member, &copy.encode())?;
    }
    Ok(superblock)
}

/// One SSD and a KV store: the superblock alone on the SSD, the metadata in the store.
/// The store is checked before anything is written, and the superblock goes last.
fn format_with_kv(ssd: &dyn BlockDevice, dir: &Path, syncs: Option<&Arc<PowerLog>>, options: &FormatOptions) -> Result<Superblock> {
    if !options.force {
        refuse_superblocks(&[(read_ssd_superblock(ssd, 0)?, ssd.describe())])?;
    }
    let layout = MetaLayout::superblock_only(usable_ssd_bytes(ssd, &options.geometry), &options.geometry)?;
    let superblock = Superblock { role: DeviceRole::Ssd, ..new_superblock(options, 0, ssd, layout)? };
    KvMeta::clear_dir(dir, options.force)?;
    write_ssd_superblock(ssd, 0, &[0u8; SUPERBLOCK_BYTES as usize])?;
    let fresh = fresh_state();
    drop(KvMeta::create(dir, superblock.uuid, &fresh.get(Ino::ROOT).expect("a fresh state has its root"), syncs.cloned())?);
    write_ssd_superblock(ssd, 0, &superblock.encode())?;
    Ok(superblock)
}

/// The superblock of a fast tier + SSD volume, once both copies agree; and the name of
/// the device its metadata is on.
fn check_with_fast_tier(fast: &dyn ByteTier, ssd: &dyn BlockDevice) -> Result<(Superblock, String)> {
    let fast_name = format!("fast tier {}", fast.describe());
    let ssd_name = format!("SSD {}", ssd.describe());
    let superblock = Superblock::decode(&read_fast_superblock(fast), &fast_name)?;
    let ssd_superblock = Superblock::decode(&read_ssd_superblock(ssd, 0)?, &ssd_name)?;
    if superblock.role != DeviceRole::Fast {
        return Err(Error::corrupt("superblock", &fast_name, 0, "this is an SSD superblock; the devices are swapped"));
    }
    if ssd_superblock.role != DeviceRole::Ssd {
        return Err(Error::corrupt("superblock", &ssd_name, 0, "this is a fast-tier superblock; the devices are swapped"));
    }
    if superblock.uuid != ssd_superblock.uuid {
        return Err(Error::VolumeMismatch { fast: superblock.uuid_string(), ssd: ssd_superblock.uuid_string() });
    }
    if (Superblock { role: DeviceRole::Ssd, ..superblock.clone() }) != ssd_superblock {
        return Err(Error::corrupt("superblock", &ssd_name, 0, "geometry disagrees with the fast tier's superblock"));
    }
    if fast.len_bytes() < superblock.fast_bytes {
        return Err(Error::corrupt(
            "superblock",
            &fast_name,
            0,
            format!("device is {} bytes, the volume needs {}", fast.len_bytes(), superblock.fast_bytes),
        ));
    }
    Ok((superblock, fast_name))
}

/// The superblock of a volume on SSDs alone, once every member's copy agrees.
fn check_on_ssd(ssd: &dyn BlockDevice) -> Result<(Superblock, String)> {
    let ssd_name = format!("SSD {}", ssd.describe());
    let superblock = Superblock::decode(&read_ssd_superblock(ssd, 0)?, &ssd_name)?;
    if superblock.fast_bytes > 0 {
        return Err(Error::WrongDevices(DeviceProblem::FastTierMissing { ssd: ssd_name, profile: superblock.profile.name() }));
    }
    if ssd.member_count() != superblock.ssd_count as usize || superblock.ssd_index != 0 {
        return Err(Error::WrongDevices(DeviceProblem::SsdCount {
            volume: superblock.ssd_count,
            named: ssd.member_count(),
            first_index: superblock.ssd_index,
        }));
    }
    for member in 1..u64::from(superblock.ssd_count) {
        let name = format!("SSD {member} of {}", superblock.ssd_count);
        let copy = Superblock::decode(&read_ssd_superblock(ssd, member)?, &name)?;
        if copy.uuid != superblock.uuid {
            return Err(Error::VolumeMismatch { fast: superblock.uuid_string(), ssd: copy.uuid_string() });
        }
        if (Superblock { ssd_index: 0, ..copy.clone() }) != superblock || copy.ssd_index != member as u32 {
            return Err(Error::corrupt("superblock", &name, 0, "its copy disagrees with SSD 0's"));
        }
    }
    Ok((superblock, ssd_name))
}

/// Mark every unit the maps reference as used, and hold a block for every zero block; a
/// unit out of range, or referenced twice other than by entries marked as sharing an SSD
/// block, means corrupt metadata.
fn claim_units(meta: &MetaState, residue: &dyn ResidueStore, blocks: &BlockRefs, device: &str) -> Result<()> {
    let mut zero_blocks = 0;
    for inode in meta.snapshot() {
        for (lblock, entry) in inode.map.lock().iter() {
            zero_blocks += u64::from(entry.is_zeros());
            let problem = |what: String| Error::corrupt("map", device, 0, format!("inode {} block {lblock}: {what}", inode.ino.0));
            for page in entry.fast_pages() {
                if !residue.claim(page, inode.ino, *lblock) {
                    return Err(problem(format!("fast page {} is out of range or used twice", page.0)));
                }
            }
            if let Some(block) = entry.ssd_block() {
                if !blocks.claim(block.0, entry.shared()) {
                    return Err(problem(format!("SSD block {} is out of range or used twice without being shared", block.0)));
                }
            }
        }
    }
    blocks.restore_promises(zero_blocks);
    Ok(())
}
