//! `alignfs bench`: the OrchFS paper's single-threaded write workloads (random overwrites
//! of a prefilled file) on these systems, interleaved in one run with the same offsets and
//! sizes from one seed:
//! - one per profile asked for (`--profiles`, `orch` by default): the engine in-process
//!   through its file API, on a fresh volume of that profile (fast tier, NVM or device DRAM
//!   on tmpfs; SSD image on the disk under test; `nvstore`'s KV store beside it). The file
//!   API is the engine's object operations, so every profile runs the same workload
//!   without its front end (FUSE, NBD, S3);
//! - `plain`: a plain file on the same disk, buffered `pwrite` (+ `fdatasync`);
//! - `limit`: the device limit, O_DIRECT writes rounded out to 4 KiB on a preallocated
//!   file (+ `fdatasync`).
//!
//! Durable variants sync after every write; the others sync once at the end of the cell,
//! inside the timed interval (fio's `end_fsync=1`), so every system pays to reach the disk.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use alignfs::device::{AlignedBuf, IoBackend};
use alignfs::geometry::parse_size;
use alignfs::paths::{format_paths, open_paths, DeviceSpec};
use alignfs::profile::DeviceKind;
use alignfs::stats::Counter;
use alignfs::{FormatOptions, Geometry, Ino, Profile, ReadMode, Volume, VolumeOptions};
use anyhow::{bail, Context, Result};
use clap::Args;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

#[derive(Args)]
pub struct BenchArgs {
    /// Directory on the disk under test (SSD image, plain file, device-limit file).
    /// Default: DATA_DIR/bench (see `alignfs mkfs --help`).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Directory on tmpfs for the benchmark's fast tier.
    #[arg(long, default_value = "/dev/shm/alignfs-bench")]
    fast_dir: PathBuf,
    /// Fast-tier size.
    #[arg(long, default_value = "1G")]
    fast_size: String,
    /// Size of the prefilled file each system overwrites.
    #[arg(long, default_value = "256M")]
    size: String,
    /// Seconds per (workload, system) cell and round.
    #[arg(long, default_value_t = 1.2)]
    duration: f64,
    /// Rounds; each round runs every system once per workload, interleaved.
    #[arg(long, default_value_t = 2)]
    rounds: u32,
    /// Only these workloads (comma-separated names, e.g. `4KiB±10%,32KiB`).
    #[arg(long)]
    workloads: Option<String>,
    /// Skip the read-mode comparison.
    #[arg(long)]
    no_reads: bool,
    /// Profiles to run, comma-separated, or `all`: each gets a fresh volume of its own.
    #[arg(long, default_value = "orch")]
    profiles: String,
    /// alignfs split size (largest SSD write; larger runs go out in pieces of this size).
    #[arg(long, default_value = "256K")]
    split_size: String,
    /// alignfs SSD IO threads when io_uring is unavailable.
    #[arg(long, default_value_t = 2)]
    io_workers: u32,
    /// Seed for offsets and sizes.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Write results as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Tiny sizes and durations: a smoke test that the harness works.
    #[arg(long)]
    quick: bool,
}

#[derive(Clone, Copy)]
struct Workload {
    name: &'static str,
    min: u64,
    max: u64,
}

const WORKLOADS: [Workload; 5] = [
    Workload { name: "1B-2MiB", min: 1, max: 2 << 20 },
    Workload { name: "4KiB±10%", min: 3686, max: 4506 },
    Workload { name: "1MiB±10%", min: 943_718, max: 1_153_434 },
    Workload { name: "32KiB", min: 32768, max: 32768 },
    Workload { name: "64KiB", min: 65536, max: 65536 },
];

trait System {
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

fn drop_file_cache(path: &Path) {
    if let Ok(file) = File::open(path) {
        let _ = fadvise_dontneed(&file);
    }
}

fn fadvise_dontneed(file: &File) -> std::io::Result<()> {
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
struct Placement {
    dir: PathBuf,
    fast_dir: PathBuf,
    ssd_bytes: u64,
    fast_bytes: u64,
    split_bytes: u32,
    io_workers: u32,
}

/// A volume of one profile, in-process. Its files: the SSD image in `--dir`, the fast
/// tier (or NVM, or the device's DRAM) in `--fast-dir`, the KV store beside the image.
struct AlignfsSystem {
    profile: Profile,
    volume: Option<Volume>,
    ino: Ino,
    fast: PathBuf,
    ssd: PathBuf,
}

impl AlignfsSystem {
    fn format(profile: Profile, at: &Placement) -> Result<Self> {
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
    fn remove(mut self) -> Result<()> {
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

    fn volume(&self) -> &Volume {
        self.volume.as_ref().expect("volume is open")
    }

    fn reopen(&mut self, read_mode: ReadMode) -> Result<()> {
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
struct Systems {
    volumes: Vec<AlignfsSystem>,
    plain: PlainFile,
    limit: DeviceLimit,
}

impl Systems {
    fn all(&mut self) -> Vec<&mut dyn System> {
        let mut all: Vec<&mut dyn System> = self.volumes.iter_mut().map(|v| v as &mut dyn System).collect();
        all.push(&mut self.plain);
        all.push(&mut self.limit);
        all
    }

    fn count(&self) -> usize {
        self.volumes.len() + 2
    }
}

struct PlainFile {
    file: File,
    path: PathBuf,
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

struct DeviceLimit {
    file: File,
    buf: AlignedBuf,
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

#[derive(Serialize, Clone)]
struct CellResult {
    workload: String,
    durable: bool,
    system: String,
    mib_s: f64,
    mean_us: f64,
    p99_us: f64,
    ops: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    counters: Option<serde_json::Value>,
}

#[derive(Default)]
struct Accumulator {
    bytes: u64,
    elapsed: Duration,
    latencies_ns: Vec<u64>,
    counters: Vec<u64>,
}

impl Accumulator {
    fn result(&self, workload: &str, durable: bool, system: &str, counters: Option<serde_json::Value>) -> CellResult {
        let mut sorted = self.latencies_ns.clone();
        sorted.sort_unstable();
        let mean = sorted.iter().sum::<u64>() as f64 / sorted.len().max(1) as f64;
        let p99 = sorted.get((sorted.len() as f64 * 0.99) as usize).or(sorted.last()).copied().unwrap_or(0);
        CellResult {
            workload: workload.into(),
            durable,
            system: system.into(),
            mib_s: self.bytes as f64 / (1 << 20) as f64 / self.elapsed.as_secs_f64().max(1e-9),
            mean_us: mean / 1000.0,
            p99_us: p99 as f64 / 1000.0,
            ops: sorted.len() as u64,
            counters,
        }
    }
}

const TRACKED: [Counter; 17] = [
    Counter::app_write_bytes,
    Counter::ssd_write_bytes,
    Counter::page_write_bytes,
    Counter::upage_write_bytes,
    Counter::fg_rmw_reads,
    Counter::migrations_watermark,
    Counter::migrations_header_full,
    Counter::migrations_fast_full,
    Counter::migration_write_bytes,
    Counter::migrations_full,
    Counter::migrations_sync,
    Counter::migrations_idle,
    Counter::kv_block_bytes,
    Counter::kv_fragment_bytes,
    Counter::kv_onode_bytes,
    Counter::kv_attr_bytes,
    Counter::kv_name_bytes,
];

/// Every cause of a block migration, each counted by the profiles that have it.
const MIGRATIONS: [&str; 6] =
    ["migrations_watermark", "migrations_header_full", "migrations_fast_full", "migrations_full", "migrations_sync", "migrations_idle"];

/// Write traffic below the engine's own counters: the memory-semantic SSD's flash
/// programs and byte-interface stores (`byte`).
const DEVICE: [&str; 2] = ["flash_program_bytes", "byte_store_bytes"];

fn tracked(volume: &Volume) -> Vec<u64> {
    let stats = volume.stats();
    let device = volume.device_counters();
    let own = TRACKED.iter().map(|&c| stats.get(c));
    own.chain(DEVICE.iter().map(|name| device.iter().find(|c| c.name == *name).map_or(0, |c| c.value))).collect()
}

fn counters_json(delta: &[u64]) -> serde_json::Value {
    let mut map = serde_json::Map::new();
    let names = TRACKED.iter().map(|c| c.name()).chain(DEVICE);
    for (name, v) in names.zip(delta) {
        map.insert(name.into(), (*v).into());
    }
    let to_ssd = delta[1].saturating_sub(delta[8]) as f64;
    let residue = (delta[2] + delta[3]) as f64;
    map.insert("ssd_share".into(), (if to_ssd + residue > 0.0 { to_ssd / (to_ssd + residue) } else { 0.0 }).into());
    serde_json::Value::Object(map)
}

/// What one timed cell runs.
#[derive(Clone, Copy)]
struct Cell {
    workload: Workload,
    durable: bool,
    file_size: u64,
    duration: Duration,
    seed: u64,
}

/// One timed cell: writes of the workload's sizes at random offsets.
fn run_cell(system: &mut dyn System, cell: Cell, data: &[u8], acc: &mut Accumulator) -> Result<()> {
    let Cell { workload, durable, file_size, duration, seed } = cell;
    let mut rng = StdRng::seed_from_u64(seed);
    system.drop_caches();
    let started = Instant::now();
    while started.elapsed() < duration {
        let len = rng.random_range(workload.min..=workload.max);
        let offset = rng.random_range(0..=file_size - len);
        let skew = rng.random_range(0..4096usize);
        let op_start = Instant::now();
        system.write(offset, &data[skew..skew + len as usize])?;
        if durable {
            system.sync()?;
        }
        acc.latencies_ns.push(op_start.elapsed().as_nanos() as u64);
        acc.bytes += len;
    }
    if !durable {
        system.sync()?;
    }
    acc.elapsed += started.elapsed();
    Ok(())
}

/// One timed cell of cold random reads: no read finds a byte in a cache. The file is cut
/// into slots of the read size plus 4 KiB and each slot is read once, in a random order,
/// at a random skew inside its 4 KiB margin; when every slot has been read, caches are
/// dropped with the clock stopped and a new order begins. (Reading at any offset instead
/// let the file fill the cache within the cell: the plain file, whose blocks lie in
/// order, then served most of its reads from memory.)
fn run_cold_read_cell(system: &mut dyn System, cell: Cell, acc: &mut Accumulator) -> Result<()> {
    use rand::seq::SliceRandom;
    let Cell { workload, file_size, duration, seed, .. } = cell;
    let len = workload.max;
    let stride = len + 4096;
    let mut slots: Vec<u64> = (0..(file_size - len) / stride + 1).collect();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut out = vec![0u8; len as usize];
    let mut timed = Duration::ZERO;
    while timed < duration {
        system.drop_caches();
        slots.shuffle(&mut rng);
        let started = Instant::now();
        for &slot in &slots {
            let offset = (slot * stride + rng.random_range(0..4096)).min(file_size - len);
            let op_start = Instant::now();
            system.read(offset, &mut out)?;
            acc.latencies_ns.push(op_start.elapsed().as_nanos() as u64);
            acc.bytes += len;
            if timed + started.elapsed() >= duration {
                break;
            }
        }
        timed += started.elapsed();
    }
    acc.elapsed += timed;
    Ok(())
}

fn prefill(system: &mut dyn System, file_size: u64, data: &[u8]) -> Result<()> {
    let chunk = 1 << 20;
    let mut offset = 0;
    while offset < file_size {
        let len = chunk.min(file_size - offset);
        system.write(offset, &data[..len as usize])?;
        offset += len;
    }
    system.sync()
}

/// The profiles `--profiles` names, in the registry's order.
fn parse_profiles(list: &str) -> Result<Vec<Profile>> {
    if list.trim() == "all" {
        return Ok(Profile::all().collect());
    }
    let mut wanted = Vec::new();
    for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let profile = Profile::parse(name)?;
        if !wanted.contains(&profile) {
            wanted.push(profile);
        }
    }
    if wanted.is_empty() {
        bail!("--profiles names no profile");
    }
    Ok(Profile::all().filter(|p| wanted.contains(p)).collect())
}

pub fn run(args: &BenchArgs) -> Result<()> {
    let (file_size, duration, rounds, fast_size) = if args.quick {
        (8 << 20, Duration::from_millis(100), 1, 64 << 20)
    } else {
        (parse_size(&args.size)?, Duration::from_secs_f64(args.duration), args.rounds.max(1), parse_size(&args.fast_size)?)
    };
    if file_size < 4 << 20 {
        bail!("--size must be at least 4M (the largest write is 2 MiB)");
    }
    let profiles = parse_profiles(&args.profiles)?;
    let workloads: Vec<Workload> = match &args.workloads {
        None => WORKLOADS.to_vec(),
        Some(list) => {
            let wanted: Vec<&str> = list.split(',').map(str::trim).collect();
            if let Some(bad) = wanted.iter().find(|w| !WORKLOADS.iter().any(|x| x.name == **w)) {
                bail!("unknown workload {bad:?}; known: {}", WORKLOADS.map(|w| w.name).join(", "));
            }
            WORKLOADS.iter().copied().filter(|w| wanted.contains(&w.name)).collect()
        }
    };
    let dir = args.dir.clone().unwrap_or_else(|| crate::defaults::data_dir(None).join("bench"));
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    std::fs::create_dir_all(&args.fast_dir).with_context(|| format!("create {}", args.fast_dir.display()))?;
    let plain_path = dir.join("plain.dat");
    let limit_path = dir.join("limit.dat");
    for p in [&plain_path, &limit_path] {
        let _ = std::fs::remove_file(p);
    }
    let placement = Placement {
        dir: dir.clone(),
        fast_dir: args.fast_dir.clone(),
        ssd_bytes: file_size * 3 + (256 << 20),
        fast_bytes: fast_size,
        split_bytes: u32::try_from(parse_size(&args.split_size)?).context("--split-size")?,
        io_workers: args.io_workers,
    };
    eprintln!(
        "alignfs bench: {} file per system in {} ({}), fast tiers {} in {}",
        bytesize::ByteSize(file_size),
        dir.display(),
        profiles.iter().map(|p| p.name()).collect::<Vec<_>>().join(", "),
        bytesize::ByteSize(fast_size),
        args.fast_dir.display()
    );

    let mut volumes = Vec::with_capacity(profiles.len());
    for &profile in &profiles {
        volumes.push(AlignfsSystem::format(profile, &placement)?);
    }
    let plain = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&plain_path)?;
    let limit = OpenOptions::new().read(true).write(true).create(true).truncate(true).custom_flags(libc::O_DIRECT).open(&limit_path)?;
    preallocate(&limit, file_size)?;
    let mut systems = Systems {
        volumes,
        plain: PlainFile { file: plain, path: plain_path.clone() },
        limit: DeviceLimit { file: limit, buf: AlignedBuf::zeroed((4 << 20) + 8192) },
    };
    let mut rng = StdRng::seed_from_u64(args.seed);
    let data: Vec<u8> = (0..(2 << 20) + 8192).map(|_| rng.random()).collect();
    for system in systems.all() {
        let started = Instant::now();
        prefill(system, file_size, &data)?;
        eprintln!("  prefilled {} in {:.1?}", system.name(), started.elapsed());
    }

    let n = systems.count();
    let cells = (workloads.len() * 2 * n) as u64 * u64::from(rounds);
    let progress = indicatif::ProgressBar::new(cells);
    progress.set_style(indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} cells  {msg}").expect("valid template"));
    let mut accs: Vec<Accumulator> = (0..workloads.len() * 2 * n).map(|_| Accumulator::default()).collect();
    for round in 0..rounds {
        for (w, workload) in workloads.iter().enumerate() {
            for (d, durable) in [true, false].into_iter().enumerate() {
                let seed = args.seed ^ ((w as u64) << 8) ^ ((d as u64) << 4) ^ (u64::from(round) << 20);
                // The systems take turns, and who goes first rotates every round.
                let mut order: Vec<(usize, &mut dyn System)> = systems.all().into_iter().enumerate().collect();
                order.rotate_left(round as usize % n);
                for (s, system) in order {
                    progress.set_message(format!("{} {} {}", workload.name, if durable { "fsync" } else { "no-sync" }, system.name()));
                    let acc = &mut accs[(w * 2 + d) * n + s];
                    let before = system.counters();
                    let cell = Cell { workload: *workload, durable, file_size, duration, seed };
                    run_cell(system, cell, &data, acc)?;
                    if let (Some(before), Some(after)) = (before, system.counters()) {
                        let delta: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
                        if acc.counters.is_empty() {
                            acc.counters = delta;
                        } else {
                            acc.counters.iter_mut().zip(&delta).for_each(|(a, d)| *a += d);
                        }
                    }
                    progress.inc(1);
                }
            }
        }
    }
    progress.finish_and_clear();

    let mut results = Vec::new();
    for (w, workload) in workloads.iter().enumerate() {
        for (d, durable) in [true, false].into_iter().enumerate() {
            for (s, system) in systems.all().into_iter().enumerate() {
                let acc = &accs[(w * 2 + d) * n + s];
                let counters = system.counters().is_some().then(|| counters_json(&acc.counters));
                results.push(acc.result(workload.name, durable, system.name(), counters));
            }
        }
    }
    if !args.no_reads {
        results.extend(read_phase(&mut systems, file_size, if args.quick { duration } else { duration / 2 }, args.seed, rounds)?);
    }
    print_report(&results);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&results)?).with_context(|| format!("write {}", path.display()))?;
        eprintln!("results written to {}", path.display());
    }
    for volume in std::mem::take(&mut systems.volumes) {
        volume.remove()?;
    }
    drop(systems);
    for p in [&plain_path, &limit_path] {
        let _ = std::fs::remove_file(p);
    }
    // The directories too, if nothing else is in them (remove_dir leaves a full one alone).
    let _ = std::fs::remove_dir(&args.fast_dir);
    let _ = std::fs::remove_dir(&dir);
    Ok(())
}

/// Random reads with cold caches: each volume with each read mode, and the plain file.
/// The write phase leaves part of the file in the residue store; it is merged to the SSD
/// first, so that the cells measure the SSD read path.
fn read_phase(systems: &mut Systems, file_size: u64, duration: Duration, seed: u64, rounds: u32) -> Result<Vec<CellResult>> {
    for volume in &systems.volumes {
        volume.volume().migrate_all()?;
    }
    let sizes = [
        Workload { name: "read 4KiB", min: 4096, max: 4096 },
        Workload { name: "read 128KiB", min: 128 << 10, max: 128 << 10 },
        Workload { name: "read 1MiB", min: 1 << 20, max: 1 << 20 },
    ];
    let modes = [(ReadMode::Direct, "direct"), (ReadMode::Buffered, "buffered")];
    let mut results = Vec::new();
    for workload in sizes {
        let mut volume_accs: Vec<[Accumulator; 2]> = systems.volumes.iter().map(|_| Default::default()).collect();
        let mut plain = Accumulator::default();
        for round in 0..rounds {
            let cell = Cell { workload, durable: false, file_size, duration, seed: seed ^ 0xfeed ^ u64::from(round) };
            for (volume, accs) in systems.volumes.iter_mut().zip(&mut volume_accs) {
                for ((mode, _), acc) in modes.iter().zip(accs.iter_mut()) {
                    volume.reopen(*mode)?;
                    run_cold_read_cell(volume, cell, acc)?;
                }
            }
            run_cold_read_cell(&mut systems.plain, cell, &mut plain)?;
        }
        for (volume, accs) in systems.volumes.iter().zip(&volume_accs) {
            for ((_, mode), acc) in modes.iter().zip(accs) {
                results.push(acc.result(workload.name, false, &format!("{}-{mode}", volume.name()), None));
            }
        }
        results.push(plain.result(workload.name, false, "plain", None));
    }
    Ok(results)
}

fn preallocate(file: &File, len: u64) -> Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: plain syscall on a descriptor we own; no memory is passed.
    let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len as libc::off_t) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error()).context("preallocate the device-limit file");
    }
    Ok(())
}

fn print_report(results: &[CellResult]) {
    let find = |w: &str, d: bool, s: &str| results.iter().find(|r| r.workload == w && r.durable == d && r.system == s);
    let mut table = comfy_table::Table::new();
    table.load_preset(comfy_table::presets::UTF8_BORDERS_ONLY);
    table.set_header(["workload", "sync", "system", "MiB/s", "mean µs", "p99 µs", "ops", "÷ plain", "÷ limit", "to SSD", "rmw", "migr."]);
    for r in results {
        let ratio = |other: &str| {
            find(&r.workload, r.durable, other).filter(|o| o.mib_s > 0.0).map_or("".into(), |o| format!("{:.2}", r.mib_s / o.mib_s))
        };
        let counters = r.counters.as_ref();
        let get = |k: &str| counters.and_then(|c| c.get(k)).and_then(|v| v.as_f64()).unwrap_or(0.0);
        let (share, rmw, migr) = match counters {
            Some(_) => (
                format!("{:.0}%", 100.0 * get("ssd_share")),
                format!("{}", get("fg_rmw_reads")),
                format!("{}", MIGRATIONS.iter().map(|k| get(k)).sum::<f64>()),
            ),
            None => Default::default(),
        };
        let is_volume = r.system != "plain" && r.system != "limit";
        table.add_row([
            r.workload.clone(),
            if r.workload.starts_with("read") {
                "-".into()
            } else if r.durable {
                "fsync".into()
            } else {
                "end".into()
            },
            r.system.clone(),
            format!("{:.1}", r.mib_s),
            format!("{:.1}", r.mean_us),
            format!("{:.1}", r.p99_us),
            r.ops.to_string(),
            if is_volume { ratio("plain") } else { String::new() },
            if is_volume { ratio("limit") } else { String::new() },
            share,
            rmw,
            migr,
        ]);
    }
    println!("{table}");
    println!("÷ plain / ÷ limit: a volume's MiB/s over the plain file's / the device limit's in the same run.");
    println!("to SSD: share of written bytes that went straight to the SSD; rmw: foreground read-modify-writes; migr.: blocks migrated.");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_parse_in_registry_order_and_refuse_unknown_names() {
        assert_eq!(parse_profiles("all").unwrap(), Profile::all().collect::<Vec<_>>());
        assert_eq!(parse_profiles(" scrap, orch,scrap ").unwrap(), vec![Profile::ORCH, Profile::SCRAP]);
        let unknown = parse_profiles("orch,ext4").unwrap_err().to_string();
        assert!(unknown.contains("\"ext4\"") && unknown.contains("\"nvstore\""), "{unknown}");
        assert!(parse_profiles(" , ").is_err());
    }
}
