//! The emulated memory-semantic SSD's log cleaning under sustained byte-interface stores
//! (ByteFS Algorithm 1; issue 67, item 3): how long stores wait on a full log, how fast
//! cleaning writes the log back, and how much it coalesces.
//!
//! For each write-log size and thread count the program formats a fresh device (flash
//! image and DRAM on tmpfs, as FEMU keeps its flash in DRAM; ByteFS's Table 4 latency
//! model on unless `--no-latency`), then runs that many threads storing random pieces of
//! 64 B–1 KiB to random addresses of a working set for `--seconds`, each verifying every
//! `--verify-every` stores. A store that takes longer than `--stall-ms` waited on a full
//! log; the program times each store itself, so builds without the device's own stall
//! counters measure the same way. It prints one row per cell and, with `--json`, the rows.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use alignfs::device::mssd::{LatencyModel, MemorySemanticSsd, MssdConfig, MssdOptions};
use alignfs::device::{BlockDevice, ByteTier, FileSsd, PmemRegion, SsdOptions};
use anyhow::{Context, Result};
use clap::Parser;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const MIB: u64 = 1 << 20;

#[derive(Parser)]
#[command(about = "memory-semantic SSD: store stalls and cleaning throughput under sustained byte-interface stores")]
struct Args {
    /// Write-log sizes, MiB.
    #[arg(long, value_delimiter = ',', default_value = "16,64")]
    logs: Vec<u64>,
    /// Storing threads.
    #[arg(long, value_delimiter = ',', default_value = "1,4")]
    threads: Vec<usize>,
    /// Seconds each cell stores for.
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// The device's logical size, MiB.
    #[arg(long, default_value_t = 1024)]
    device: u64,
    /// The addresses stores go to: the first this many MiB of the device.
    #[arg(long, default_value_t = 64)]
    working_set: u64,
    /// A verify (the write-verify read that makes stores durable) after this many stores
    /// of a thread.
    #[arg(long, default_value_t = 16)]
    verify_every: u64,
    /// A store that takes longer than this waited on a full log.
    #[arg(long, default_value_t = 2.0)]
    stall_ms: f64,
    /// Run the device without its latency model (at the speed of tmpfs).
    #[arg(long)]
    no_latency: bool,
    /// Directory for the flash image and the DRAM file (tmpfs).
    #[arg(long, default_value = "/dev/shm")]
    dir: PathBuf,
    /// Write the rows as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(Default)]
struct ThreadResult {
    stores: u64,
    payload: u64,
    stalls: u64,
    stalled: Duration,
    longest: Duration,
}

struct Row {
    log_mib: u64,
    threads: usize,
    seconds: f64,
    stores: u64,
    payload: u64,
    stalls: u64,
    stalled: Duration,
    longest: Duration,
    cleanings: u64,
    cleaned_pages: u64,
    base_reads: u64,
    flash_program_bytes: u64,
}

impl Row {
    fn stall_share(&self) -> f64 {
        self.stalled.as_secs_f64() / (self.seconds * self.threads as f64)
    }

    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "log_mib": self.log_mib,
            "threads": self.threads,
            "seconds": self.seconds,
            "stores": self.stores,
            "stores_per_s": self.stores as f64 / self.seconds,
            "payload_bytes": self.payload,
            "stalls": self.stalls,
            "stall_share": self.stall_share(),
            "longest_stall_ms": self.longest.as_secs_f64() * 1e3,
            "cleanings": self.cleanings,
            "cleaned_pages": self.cleaned_pages,
            "base_reads": self.base_reads,
            "flash_program_bytes": self.flash_program_bytes,
        })
    }
}

fn run_cell(args: &Args, log_mib: u64, threads: usize) -> Result<Row> {
    let dir = tempdir_in(&args.dir)?;
    let config = MssdConfig { log_bytes: log_mib * MIB, ..MssdConfig::new(args.device * MIB) };
    let (dram_bytes, image_bytes) = MemorySemanticSsd::sizes(&config)?;
    let flash_options = SsdOptions { create_len: Some(image_bytes), io_workers: 2, split_bytes: 1 << 20, backend: None, shared: false };
    let flash: Arc<dyn BlockDevice> = Arc::new(FileSsd::open(&dir.join("flash.img"), &flash_options)?);
    let dram: Arc<dyn ByteTier> = Arc::new(PmemRegion::open(&dir.join("dram"), Some(dram_bytes))?);
    let latency = (!args.no_latency).then(LatencyModel::bytefs_table4);
    let device = Arc::new(MemorySemanticSsd::format(flash, dram, &config, MssdOptions { latency, ..MssdOptions::default() })?);
    let stop = Arc::new(AtomicBool::new(false));
    let span = args.working_set.min(args.device) * MIB;
    let stall = Duration::from_secs_f64(args.stall_ms / 1e3);
    let started = Instant::now();
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let (device, stop) = (Arc::clone(&device), Arc::clone(&stop));
            let verify_every = args.verify_every.max(1);
            std::thread::spawn(move || -> Result<ThreadResult> {
                let mut rng = StdRng::seed_from_u64(0x6c6f67 + t as u64);
                let mut data = vec![0u8; 1024];
                let mut result = ThreadResult::default();
                while !stop.load(Ordering::Relaxed) {
                    let len = rng.random_range(64..=1024usize);
                    let addr = rng.random_range(0..span - len as u64);
                    rng.fill(&mut data[..len]);
                    let at = Instant::now();
                    device.store(None, addr, &data[..len])?;
                    let took = at.elapsed();
                    if took > stall {
                        result.stalls += 1;
                        result.stalled += took;
                    }
                    result.longest = result.longest.max(took);
                    result.stores += 1;
                    result.payload += len as u64;
                    if result.stores % verify_every == 0 {
                        device.verify_posted()?;
                    }
                }
                Ok(result)
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs_f64(args.seconds));
    stop.store(true, Ordering::Relaxed);
    let mut total = ThreadResult::default();
    for worker in workers {
        let r = worker.join().map_err(|_| anyhow::anyhow!("a storing thread panicked"))??;
        total.stores += r.stores;
        total.payload += r.payload;
        total.stalls += r.stalls;
        total.stalled += r.stalled;
        total.longest = total.longest.max(r.longest);
    }
    let seconds = started.elapsed().as_secs_f64();
    let stats = device.stats();
    drop(device);
    std::fs::remove_dir_all(&dir).ok();
    Ok(Row {
        log_mib,
        threads,
        seconds,
        stores: total.stores,
        payload: total.payload,
        stalls: total.stalls,
        stalled: total.stalled,
        longest: total.longest,
        cleanings: stats.log_cleanings,
        cleaned_pages: stats.log_cleaned_pages,
        base_reads: stats.log_base_reads,
        flash_program_bytes: stats.flash_program_bytes,
    })
}

fn tempdir_in(parent: &std::path::Path) -> Result<PathBuf> {
    let dir = parent.join(format!("alignfs-mssd-cleaning.{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    Ok(dir)
}

fn main() -> Result<()> {
    let args = Args::parse();
    anyhow::ensure!(args.working_set >= 1, "--working-set must be at least 1 MiB");
    anyhow::ensure!(args.threads.iter().all(|&t| t > 0), "--threads takes counts of at least 1");
    anyhow::ensure!(args.seconds > 0.0, "--seconds must be more than 0");
    println!(
        "| log MiB | threads | stores/s | payload MiB/s | cleanings | pages cleaned | stores per cleaned page | old pages read | stalls | stalled, % of thread time | longest store ms |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    let mut rows = Vec::new();
    for &log in &args.logs {
        for &threads in &args.threads {
            let row = run_cell(&args, log, threads).with_context(|| format!("log {log} MiB, {threads} threads"))?;
            println!(
                "| {} | {} | {:.0} | {:.1} | {} | {} | {:.2} | {} | {} | {:.2} | {:.1} |",
                row.log_mib,
                row.threads,
                row.stores as f64 / row.seconds,
                row.payload as f64 / row.seconds / MIB as f64,
                row.cleanings,
                row.cleaned_pages,
                row.stores as f64 / row.cleaned_pages.max(1) as f64,
                row.base_reads,
                row.stalls,
                row.stall_share() * 100.0,
                row.longest.as_secs_f64() * 1e3,
            );
            rows.push(row);
        }
    }
    if let Some(path) = &args.json {
        let rows: Vec<_> = rows.iter().map(Row::json).collect();
        std::fs::write(path, serde_json::to_string_pretty(&rows)?).with_context(|| format!("write {}", path.display()))?;
    }
    Ok(())
}
