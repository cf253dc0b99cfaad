//! `alignfs bench`: the OrchFS paper's single-threaded write workloads (random overwrites
//! of a prefilled file) on three systems, interleaved in one run with the same offsets and
//! sizes from one seed:
//! - `alignfs`: the engine in-process, on a fresh volume (fast tier on tmpfs, SSD image on
//!   the disk under test);
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
use alignfs::stats::{Counter, StatsSnapshot};
use alignfs::volume::{format_paths, open_paths, DeviceSpec};
use alignfs::{FormatOptions, Ino, ReadMode, Volume, VolumeOptions};
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
    fn name(&self) -> &'static str;
    fn write(&mut self, offset: u64, data: &[u8]) -> Result<()>;
    fn read(&mut self, offset: u64, out: &mut [u8]) -> Result<()>;
    fn sync(&mut self) -> Result<()>;
    /// Drop cached copies of this system's data before a cell.
    fn drop_caches(&mut self) {}
    /// The engine's tracked counters (alignfs only).
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

struct AlignfsSystem {
    volume: Option<Volume>,
    ino: Ino,
    fast: PathBuf,
    ssd: PathBuf,
}

impl AlignfsSystem {
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
    fn name(&self) -> &'static str {
        "alignfs"
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
        drop_file_cache(&self.ssd);
    }
    fn counters(&self) -> Option<Vec<u64>> {
        Some(tracked(&self.volume().stats()))
    }
}

/// The three systems, alignfs first.
struct Systems {
    alignfs: AlignfsSystem,
    plain: PlainFile,
    limit: DeviceLimit,
}

impl Systems {
    fn all(&mut self) -> [&mut dyn System; 3] {
        [&mut self.alignfs, &mut self.plain, &mut self.limit]
    }
}

struct PlainFile {
    file: File,
    path: PathBuf,
}

impl System for PlainFile {
    fn name(&self) -> &'static str {
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
    fn name(&self) -> &'static str {
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
    alignfs_counters: Option<serde_json::Value>,
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
            alignfs_counters: counters,
        }
    }
}

const TRACKED: [Counter; 9] = [
    Counter::app_write_bytes,
    Counter::ssd_write_bytes,
    Counter::page_write_bytes,
    Counter::upage_write_bytes,
    Counter::fg_rmw_reads,
    Counter::migrations_watermark,
    Counter::migrations_header_full,
    Counter::migrations_fast_full,
    Counter::migration_write_bytes,
];

fn tracked(stats: &StatsSnapshot) -> Vec<u64> {
    TRACKED.iter().map(|&c| stats.get(c)).collect()
}

fn counters_json(delta: &[u64]) -> serde_json::Value {
    let mut map = serde_json::Map::new();
    for (c, v) in TRACKED.iter().zip(delta) {
        map.insert(c.name().into(), (*v).into());
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
    reads: bool,
    file_size: u64,
    duration: Duration,
    seed: u64,
}

/// One timed cell: writes (or reads) of the workload's sizes at random offsets.
fn run_cell(system: &mut dyn System, cell: Cell, data: &[u8], acc: &mut Accumulator) -> Result<()> {
    let Cell { workload, durable, reads, file_size, duration, seed } = cell;
    let mut rng = StdRng::seed_from_u64(seed);
    let mut out = vec![0u8; workload.max as usize];
    system.drop_caches();
    let started = Instant::now();
    while started.elapsed() < duration {
        let len = rng.random_range(workload.min..=workload.max);
        let offset = rng.random_range(0..=file_size - len);
        let skew = rng.random_range(0..4096usize);
        let op_start = Instant::now();
        if reads {
            system.read(offset, &mut out[..len as usize])?;
        } else {
            system.write(offset, &data[skew..skew + len as usize])?;
            if durable {
                system.sync()?;
            }
        }
        acc.latencies_ns.push(op_start.elapsed().as_nanos() as u64);
        acc.bytes += len;
    }
    if !reads && !durable {
        system.sync()?;
    }
    acc.elapsed += started.elapsed();
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

pub fn run(args: &BenchArgs) -> Result<()> {
    let (file_size, duration, rounds, fast_size) = if args.quick {
        (8 << 20, Duration::from_millis(100), 1, 64 << 20)
    } else {
        (parse_size(&args.size)?, Duration::from_secs_f64(args.duration), args.rounds.max(1), parse_size(&args.fast_size)?)
    };
    if file_size < 4 << 20 {
        bail!("--size must be at least 4M (the largest write is 2 MiB)");
    }
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
    let fast_path = args.fast_dir.join("fast");
    let ssd_path = dir.join("alignfs-ssd.img");
    let plain_path = dir.join("plain.dat");
    let limit_path = dir.join("limit.dat");
    for p in [&fast_path, &ssd_path, &plain_path, &limit_path] {
        let _ = std::fs::remove_file(p);
    }
    let ssd_bytes = file_size * 3 + (256 << 20);
    eprintln!(
        "alignfs bench: {} file per system in {}, fast tier {} in {}",
        bytesize::ByteSize(file_size),
        dir.display(),
        bytesize::ByteSize(fast_size),
        args.fast_dir.display()
    );

    let fast = DeviceSpec { path: fast_path.clone(), size: Some(fast_size) };
    let ssd = DeviceSpec { path: ssd_path.clone(), size: Some(ssd_bytes) };
    let split_bytes = u32::try_from(parse_size(&args.split_size)?).context("--split-size")?;
    let geometry = alignfs::Geometry { split_bytes, io_workers: args.io_workers, ..alignfs::Geometry::default() };
    let (_, volume) = format_paths(
        Some(&fast),
        std::slice::from_ref(&ssd),
        None,
        &FormatOptions { geometry, ..FormatOptions::default() },
        None::<IoBackend>,
    )?;
    volume.close()?;
    let mut alignfs = AlignfsSystem { volume: None, ino: Ino::ROOT, fast: fast_path.clone(), ssd: ssd_path.clone() };
    alignfs.reopen(ReadMode::Buffered)?;
    alignfs.ino = alignfs.volume().create_file(Ino::ROOT, b"bench.dat", 0o644, 0, 0)?.ino;
    let plain = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&plain_path)?;
    let limit = OpenOptions::new().read(true).write(true).create(true).truncate(true).custom_flags(libc::O_DIRECT).open(&limit_path)?;
    preallocate(&limit, file_size)?;
    let mut systems = Systems {
        alignfs,
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

    let cells = (workloads.len() * 2 * 3) as u64 * u64::from(rounds);
    let progress = indicatif::ProgressBar::new(cells);
    progress.set_style(indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} cells  {msg}").expect("valid template"));
    let mut accs: Vec<Accumulator> = (0..workloads.len() * 2 * 3).map(|_| Accumulator::default()).collect();
    for round in 0..rounds {
        for (w, workload) in workloads.iter().enumerate() {
            for (d, durable) in [true, false].into_iter().enumerate() {
                let seed = args.seed ^ ((w as u64) << 8) ^ ((d as u64) << 4) ^ (u64::from(round) << 20);
                for (s, system) in systems.all().into_iter().enumerate() {
                    progress.set_message(format!("{} {} {}", workload.name, if durable { "fsync" } else { "no-sync" }, system.name()));
                    let acc = &mut accs[(w * 2 + d) * 3 + s];
                    let before = system.counters();
                    let cell = Cell { workload: *workload, durable, reads: false, file_size, duration, seed };
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
                let acc = &accs[(w * 2 + d) * 3 + s];
                let counters = (s == 0).then(|| counters_json(&acc.counters));
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
    if let Some(volume) = systems.alignfs.volume.take() {
        volume.close()?;
    }
    drop(systems);
    for p in [&fast_path, &ssd_path, &plain_path, &limit_path] {
        let _ = std::fs::remove_file(p);
    }
    // The directories too, if nothing else is in them (remove_dir leaves a full one alone).
    let _ = std::fs::remove_dir(&args.fast_dir);
    let _ = std::fs::remove_dir(&dir);
    Ok(())
}

/// Random reads with cold caches: alignfs with each read mode, and the plain file. The
/// write phase leaves part of the file in the fast tier; it is merged to the SSD first,
/// so that the cells measure the SSD read path.
fn read_phase(systems: &mut Systems, file_size: u64, duration: Duration, seed: u64, rounds: u32) -> Result<Vec<CellResult>> {
    systems.alignfs.volume().migrate_all()?;
    let sizes = [
        Workload { name: "read 4KiB", min: 4096, max: 4096 },
        Workload { name: "read 128KiB", min: 128 << 10, max: 128 << 10 },
        Workload { name: "read 1MiB", min: 1 << 20, max: 1 << 20 },
    ];
    let mut results = Vec::new();
    for workload in sizes {
        let mut direct = Accumulator::default();
        let mut buffered = Accumulator::default();
        let mut plain = Accumulator::default();
        for round in 0..rounds {
            let cell = Cell { workload, durable: false, reads: true, file_size, duration, seed: seed ^ 0xfeed ^ u64::from(round) };
            for (mode, acc) in [(ReadMode::Direct, &mut direct), (ReadMode::Buffered, &mut buffered)] {
                systems.alignfs.reopen(mode)?;
                run_cell(&mut systems.alignfs, cell, &[], acc)?;
            }
            run_cell(&mut systems.plain, cell, &[], &mut plain)?;
        }
        results.push(direct.result(workload.name, false, "alignfs-direct", None));
        results.push(buffered.result(workload.name, false, "alignfs-buffered", None));
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
        let counters = r.alignfs_counters.as_ref();
        let get = |k: &str| counters.and_then(|c| c.get(k)).and_then(|v| v.as_f64()).unwrap_or(0.0);
        let (share, rmw, migr) = match counters {
            Some(_) => (
                format!("{:.0}%", 100.0 * get("ssd_share")),
                format!("{}", get("fg_rmw_reads")),
                format!("{}", get("migrations_watermark") + get("migrations_header_full") + get("migrations_fast_full")),
            ),
            None => Default::default(),
        };
        let is_alignfs = r.system.starts_with("alignfs");
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
            if is_alignfs { ratio("plain") } else { String::new() },
            if is_alignfs { ratio("limit") } else { String::new() },
            share,
            rmw,
            migr,
        ]);
    }
    println!("{table}");
    println!("÷ plain / ÷ limit: alignfs MiB/s over the plain file's / the device limit's in the same run.");
    println!("to SSD: share of written bytes that went straight to the SSD; rmw: foreground read-modify-writes; migr.: blocks migrated.");
}
