//! `scrap`'s throughput against the number of SSDs (WSBuffer spreads its writes over
//! several). Every image on this machine shares one disk, so the SSDs here are simulated:
//! in-memory devices slowed to a fixed bandwidth each (`device::Throttled`), so N of them
//! can move N times the bytes of one. The engine runs in-process, without FUSE.
//!
//! For each SSD count the program formats a fresh `scrap` volume and runs two single-thread
//! workloads over a 256 MiB file, each for `--seconds` and then an fsync (counted):
//!   - `1 MiB ±10 %`: random writes whose whole blocks go straight to the SSDs;
//!   - `64 KiB ±10 %`: random partial writes into scrap pages, which the flushers merge
//!     into whole blocks (reading the SSD copy first) on the least busy SSD.
//!
//! It prints a table (MiB/s, speed-up over one SSD) and, with `--json`, one object per cell.

use std::sync::Arc;
use std::time::{Duration, Instant};

use alignfs::device::{BlockDevice, DeviceSet, SimSsd, Throttled};
use alignfs::{Devices, FormatOptions, Ino, Profile, Volume, VolumeOptions};
use anyhow::{Context, Result};
use clap::Parser;
use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};

const MIB: u64 = 1 << 20;

#[derive(Parser)]
#[command(about = "scrap throughput against the number of (simulated, throttled) SSDs")]
struct Args {
    /// SSD counts to measure.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    ssds: Vec<usize>,
    /// Bandwidth of each simulated SSD, MiB/s.
    #[arg(long, default_value_t = 200)]
    bandwidth: u64,
    /// Seconds of writing per cell (before the final fsync).
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Smoke run: 0.3 s cells.
    #[arg(long)]
    quick: bool,
    /// Write the cells as JSON here.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
}

const FILE_BYTES: u64 = 256 * MIB;
const MEMBER_BYTES: u64 = 512 * MIB;

struct Cell {
    ssds: usize,
    workload: &'static str,
    mib_s: f64,
}

fn volume(ssds: usize, bandwidth: u64) -> Result<Volume> {
    let members: Vec<Arc<dyn BlockDevice>> =
        (0..ssds).map(|_| Arc::new(Throttled::new(Arc::new(SimSsd::new(MEMBER_BYTES)), bandwidth * MIB)) as Arc<dyn BlockDevice>).collect();
    let device: Arc<dyn BlockDevice> = if ssds == 1 { Arc::clone(&members[0]) } else { Arc::new(DeviceSet::new(members, MEMBER_BYTES)?) };
    let format = FormatOptions { geometry: Profile::SCRAP.default_geometry(), profile: Profile::SCRAP, force: false, ..Default::default() };
    Volume::format(&Devices::ssd_only(Arc::clone(&device)), &format)?;
    Ok(Volume::open(Devices::ssd_only(device), VolumeOptions { scrap_mem_bytes: 64 * MIB, ..VolumeOptions::default() })?)
}

/// Random writes of `lo..=hi` bytes for `seconds`, then fsync; MiB/s over the whole.
fn run(volume: &Volume, ino: Ino, lo: u64, hi: u64, seconds: f64, seed: u64) -> Result<f64> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut data = vec![0u8; hi as usize];
    rng.fill_bytes(&mut data);
    let started = Instant::now();
    let mut written = 0u64;
    while started.elapsed() < Duration::from_secs_f64(seconds) {
        let len = rng.random_range(lo..=hi);
        let offset = rng.random_range(0..FILE_BYTES - len);
        volume.write(ino, offset, &data[..len as usize])?;
        written += len;
    }
    volume.fsync(ino)?;
    Ok(written as f64 / MIB as f64 / started.elapsed().as_secs_f64())
}

fn main() -> Result<()> {
    let args = Args::parse();
    let seconds = if args.quick { 0.3 } else { args.seconds };
    let mut cells = Vec::new();
    for &ssds in &args.ssds {
        let volume = volume(ssds, args.bandwidth).with_context(|| format!("a volume on {ssds} SSDs"))?;
        let ino = volume.create_file(Ino::ROOT, b"f", 0o644, 0, 0)?.ino;
        // Prefill whole blocks, so partial writes have SSD copies to fill from.
        let block = vec![0x5au8; MIB as usize];
        for at in (0..FILE_BYTES).step_by(MIB as usize) {
            volume.write(ino, at, &block)?;
        }
        volume.fsync(ino)?;
        for (workload, lo, hi) in [("1 MiB ±10 %", 943_718, 1_153_434), ("64 KiB ±10 %", 58_982, 72_090)] {
            let mib_s = run(&volume, ino, lo, hi, seconds, 42)?;
            eprintln!("{ssds} SSD(s), {workload}: {mib_s:.1} MiB/s");
            cells.push(Cell { ssds, workload, mib_s });
        }
        volume.close()?;
    }
    println!("| workload | SSDs | MiB/s | × one SSD |");
    println!("| --- | ---: | ---: | ---: |");
    for cell in &cells {
        let one = cells.iter().find(|c| c.workload == cell.workload && c.ssds == 1).map_or(f64::NAN, |c| c.mib_s);
        println!("| {} | {} | {:.1} | {:.2}× |", cell.workload, cell.ssds, cell.mib_s, cell.mib_s / one);
    }
    println!("\n(each SSD simulated at {} MiB/s; in-process, no FUSE; writes for {seconds} s then fsync)", args.bandwidth);
    if let Some(path) = &args.json {
        let json: Vec<serde_json::Value> = cells
            .iter()
            .map(|c| serde_json::json!({"ssds": c.ssds, "workload": c.workload, "mib_s": c.mib_s, "ssd_mib_s": args.bandwidth}))
            .collect();
        std::fs::write(path, serde_json::to_string_pretty(&json)?)?;
    }
    Ok(())
}
