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

use std::path::PathBuf;
use std::time::{Duration, Instant};

use alignfs::geometry::parse_size;
use alignfs::{Profile, ReadMode};
use anyhow::{bail, Context, Result};
use clap::Args;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use cells::{prefill, run_cold_read_cell, run_counted_cell, Accumulator, Cell, CellResult};
use counters::counters_json;
use report::print_report;
use systems::{Placement, System, Systems};

mod cells;
mod counters;
mod report;
mod systems;

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
    let settings = Settings::from_args(args)?;
    let dir = args.dir.clone().unwrap_or_else(|| crate::defaults::data_dir(None).join("bench"));
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    std::fs::create_dir_all(&args.fast_dir).with_context(|| format!("create {}", args.fast_dir.display()))?;
    let placement = Placement {
        dir: dir.clone(),
        fast_dir: args.fast_dir.clone(),
        ssd_bytes: settings.file_size * 3 + (256 << 20),
        fast_bytes: settings.fast_size,
        split_bytes: u32::try_from(parse_size(&args.split_size)?).context("--split-size")?,
        io_workers: args.io_workers,
    };
    eprintln!(
        "alignfs bench: {} file per system in {} ({}), fast tiers {} in {}",
        bytesize::ByteSize(settings.file_size),
        dir.display(),
        settings.profiles.iter().map(|p| p.name()).collect::<Vec<_>>().join(", "),
        bytesize::ByteSize(settings.fast_size),
        args.fast_dir.display()
    );
    let mut systems = Systems::create(&settings.profiles, &placement, settings.file_size)?;
    let mut rng = StdRng::seed_from_u64(args.seed);
    let data: Vec<u8> = (0..(2 << 20) + 8192).map(|_| rng.random()).collect();
    for system in systems.all() {
        let started = Instant::now();
        prefill(system, settings.file_size, &data)?;
        eprintln!("  prefilled {} in {:.1?}", system.name(), started.elapsed());
    }

    let mut results = write_phase(&mut systems, &settings, args.seed, &data)?;
    if !args.no_reads {
        let duration = if args.quick { settings.duration } else { settings.duration / 2 };
        results.extend(read_phase(&mut systems, settings.file_size, duration, args.seed, settings.rounds)?);
    }
    print_report(&results);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&results)?).with_context(|| format!("write {}", path.display()))?;
        eprintln!("results written to {}", path.display());
    }
    systems.remove()?;
    // The directories too, if nothing else is in them (remove_dir leaves a full one alone).
    let _ = std::fs::remove_dir(&args.fast_dir);
    let _ = std::fs::remove_dir(&dir);
    Ok(())
}

/// What the arguments ask for, checked.
struct Settings {
    file_size: u64,
    fast_size: u64,
    duration: Duration,
    rounds: u32,
    profiles: Vec<Profile>,
    workloads: Vec<Workload>,
}

impl Settings {
    fn from_args(args: &BenchArgs) -> Result<Self> {
        let (file_size, duration, rounds, fast_size) = if args.quick {
            (8 << 20, Duration::from_millis(100), 1, 64 << 20)
        } else {
            (parse_size(&args.size)?, Duration::from_secs_f64(args.duration), args.rounds.max(1), parse_size(&args.fast_size)?)
        };
        if file_size < 4 << 20 {
            bail!("--size must be at least 4M (the largest write is 2 MiB)");
        }
        let workloads = match &args.workloads {
            None => WORKLOADS.to_vec(),
            Some(list) => {
                let wanted: Vec<&str> = list.split(',').map(str::trim).collect();
                if let Some(bad) = wanted.iter().find(|w| !WORKLOADS.iter().any(|x| x.name == **w)) {
                    bail!("unknown workload {bad:?}; known: {}", WORKLOADS.map(|w| w.name).join(", "));
                }
                WORKLOADS.iter().copied().filter(|w| wanted.contains(&w.name)).collect()
            }
        };
        Ok(Settings { file_size, fast_size, duration, rounds, profiles: parse_profiles(&args.profiles)?, workloads })
    }
}

/// Every workload, durable and not, on every system, `rounds` times over, the systems
/// taking turns; one result per (workload, durability, system).
fn write_phase(systems: &mut Systems, settings: &Settings, seed: u64, data: &[u8]) -> Result<Vec<CellResult>> {
    let Settings { file_size, duration, rounds, ref workloads, .. } = *settings;
    let n = systems.count();
    let progress = indicatif::ProgressBar::new((workloads.len() * 2 * n) as u64 * u64::from(rounds));
    progress.set_style(indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} cells  {msg}").expect("valid template"));
    let mut accs: Vec<Accumulator> = (0..workloads.len() * 2 * n).map(|_| Accumulator::default()).collect();
    for round in 0..rounds {
        for (w, workload) in workloads.iter().enumerate() {
            for (d, durable) in [true, false].into_iter().enumerate() {
                let seed = seed ^ ((w as u64) << 8) ^ ((d as u64) << 4) ^ (u64::from(round) << 20);
                // The systems take turns, and who goes first rotates every round.
                let mut order: Vec<(usize, &mut dyn System)> = systems.all().into_iter().enumerate().collect();
                order.rotate_left(round as usize % n);
                for (s, system) in order {
                    progress.set_message(format!("{} {} {}", workload.name, if durable { "fsync" } else { "no-sync" }, system.name()));
                    let cell = Cell { workload: *workload, durable, file_size, duration, seed };
                    run_counted_cell(system, cell, data, &mut accs[(w * 2 + d) * n + s])?;
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
    Ok(results)
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
