//! Recovery time of a `byte` volume after a power cut with a full write log (ByteFS §5.5:
//! 4.2 s after YCSB, of which 0.9 s loading the device's DRAM and 2.7 s scanning the log
//! and TxLog and writing the committed entries to flash; issue 67, item 4).
//!
//! The program formats a `byte` volume on a fresh emulated memory-semantic SSD (flash image
//! and DRAM on tmpfs), fills `--files` files of the data set with whole blocks, then
//! updates them in place with random writes of `--write-min`..`--write-max` bytes (small
//! updates go to the device's write log as byte-interface stores) until the log is
//! `--fill`% full. The device's background cleaning is held back (it would start at 85 %),
//! so the log is as full as the paper's device is when the power fails. Then it cuts the
//! power: the volume stops without closing (`simulate_crash`), and the device's DRAM stays
//! as its battery keeps it. It times reopening the device (the firmware's recovery: scan
//! the log and TxLogs, write every logged page back to flash, with ByteFS's Table 4
//! latencies unless `--no-latency`) and then the volume, and checks that every file reads
//! back as written.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use alignfs::device::mssd::{LatencyModel, MemorySemanticSsd, MssdConfig, MssdOptions, MssdRecovery};
use alignfs::device::{BlockDevice, ByteTier, FileSsd, PmemRegion, SsdOptions};
use alignfs::meta::Ino;
use alignfs::{Devices, FormatOptions, Profile, Volume, VolumeOptions};
use anyhow::{Context, Result};
use clap::Parser;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const MIB: u64 = 1 << 20;

#[derive(Parser)]
#[command(about = "byte volume: time to recover after a power cut with a full device write log")]
struct Args {
    /// The write log, MiB (the paper's device: 256).
    #[arg(long, default_value_t = 256)]
    log: u64,
    /// The device's logical size, MiB.
    #[arg(long, default_value_t = 8192)]
    device: u64,
    /// The data set the updates go to, MiB, spread over `--files` files.
    #[arg(long, default_value_t = 1024)]
    data_set: u64,
    #[arg(long, default_value_t = 16)]
    files: u64,
    /// Update sizes, bytes (YCSB's records are 1 KiB).
    #[arg(long, default_value_t = 64)]
    write_min: usize,
    #[arg(long, default_value_t = 1024)]
    write_max: usize,
    /// Cut the power once the write log is this full, percent (stores may use at most
    /// 15/16 of it: the rest is kept for cleaning).
    #[arg(long, default_value_t = 90)]
    fill: u64,
    /// Run the device without its latency model (at the speed of tmpfs).
    #[arg(long)]
    no_latency: bool,
    /// Rounds (each on a fresh device).
    #[arg(long, default_value_t = 1)]
    rounds: u32,
    /// Directory for the flash image and the DRAM file (tmpfs).
    #[arg(long, default_value = "/dev/shm")]
    dir: PathBuf,
    /// Write the rounds as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

struct Media {
    flash: Arc<dyn BlockDevice>,
    dram: Arc<dyn ByteTier>,
}

impl Media {
    fn open(dir: &Path, config: &MssdConfig) -> Result<Media> {
        let (dram_bytes, image_bytes) = MemorySemanticSsd::sizes(config)?;
        let flash_options = SsdOptions { create_len: Some(image_bytes), io_workers: 2, split_bytes: 1 << 20, backend: None, shared: false };
        let flash: Arc<dyn BlockDevice> = Arc::new(FileSsd::open(&dir.join("flash.img"), &flash_options)?);
        let dram: Arc<dyn ByteTier> = Arc::new(PmemRegion::open(&dir.join("dram"), Some(dram_bytes))?);
        Ok(Media { flash, dram })
    }
}

struct Round {
    updates: u64,
    update_bytes: u64,
    fill_seconds: f64,
    log_used: u64,
    log_capacity: u64,
    device: MssdRecovery,
    volume_open_s: f64,
}

impl Round {
    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "updates": self.updates,
            "update_bytes": self.update_bytes,
            "fill_seconds": self.fill_seconds,
            "log_used_bytes": self.log_used,
            "log_capacity_bytes": self.log_capacity,
            "device_recovery": self.device,
            "volume_open_seconds": self.volume_open_s,
            "total_seconds": self.device.total_us as f64 / 1e6 + self.volume_open_s,
        })
    }
}

fn device_options(latency: bool) -> MssdOptions {
    // Cleaning never starts on its own: only a store that finds the log full cleans.
    MssdOptions { latency: latency.then(LatencyModel::bytefs_table4), clean_at_percent: 100, ..MssdOptions::default() }
}

fn run_round(args: &Args, round: u32) -> Result<Round> {
    let dir = args.dir.join(format!("alignfs-mssd-recovery.{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    let result = measure(args, round, &dir);
    std::fs::remove_dir_all(&dir).ok();
    result
}

fn measure(args: &Args, round: u32, dir: &Path) -> Result<Round> {
    let config = MssdConfig { log_bytes: args.log * MIB, ..MssdConfig::new(args.device * MIB) };
    let media = Media::open(dir, &config)?;
    let device = Arc::new(MemorySemanticSsd::format(media.flash.clone(), media.dram.clone(), &config, device_options(false))?);
    let format = FormatOptions { geometry: Profile::BYTE.default_geometry(), profile: Profile::BYTE, ..FormatOptions::default() };
    Volume::format(&Devices::memory_semantic(Arc::clone(&device)), &format)?;
    let volume = Volume::open(Devices::memory_semantic(Arc::clone(&device)), VolumeOptions::default())?;

    // The data set, written whole, so that the updates below change existing pages.
    let file_bytes = (args.data_set * MIB / args.files).max(1 << 16) / 4096 * 4096;
    let mut model: Vec<Vec<u8>> = Vec::new();
    let mut inos: Vec<Ino> = Vec::new();
    let mut rng = StdRng::seed_from_u64(0x7265636f76 + u64::from(round));
    for f in 0..args.files {
        let ino = volume.create_file(Ino::ROOT, format!("data{f}").as_bytes(), 0o644, 0, 0)?.ino;
        let mut bytes = vec![0u8; file_bytes as usize];
        rng.fill(&mut bytes[..]);
        for (k, chunk) in bytes.chunks(MIB as usize).enumerate() {
            volume.write(ino, k as u64 * MIB, chunk)?;
        }
        model.push(bytes);
        inos.push(ino);
    }
    volume.fsync(inos[0])?;
    let (_, capacity) = device.log_usage();
    let target = capacity * args.fill / 100;
    let (mut updates, mut update_bytes) = (0u64, 0u64);
    let mut data = vec![0u8; args.write_max];
    let started = Instant::now();
    while device.log_usage().0 < target {
        let f = rng.random_range(0..inos.len());
        let len = rng.random_range(args.write_min..=args.write_max);
        let offset = rng.random_range(0..file_bytes - len as u64) as usize;
        rng.fill(&mut data[..len]);
        volume.write(inos[f], offset as u64, &data[..len])?;
        model[f][offset..offset + len].copy_from_slice(&data[..len]);
        updates += 1;
        update_bytes += len as u64;
    }
    let fill_seconds = started.elapsed().as_secs_f64();
    let log_used = device.log_usage().0;

    // The power cut: the volume stops where it is; the device's DRAM keeps what it held.
    volume.simulate_crash();
    drop(device);
    drop(media);

    let media = Media::open(dir, &config)?;
    let (device, recovery) = MemorySemanticSsd::open(media.flash.clone(), media.dram.clone(), device_options(!args.no_latency))?;
    let device = Arc::new(device);
    let opening = Instant::now();
    let volume = Volume::open(Devices::memory_semantic(Arc::clone(&device)), VolumeOptions::default())?;
    let volume_open_s = opening.elapsed().as_secs_f64();

    let problems = volume.check();
    anyhow::ensure!(problems.is_empty(), "fsck after recovery found {problems:?}");
    let mut back = vec![0u8; file_bytes as usize];
    for (f, ino) in inos.iter().enumerate() {
        let n = volume.read(*ino, 0, &mut back)?;
        anyhow::ensure!(n == back.len() && back == model[f], "data{f} does not read back as written after recovery");
    }
    volume.close()?;
    Ok(Round { updates, update_bytes, fill_seconds, log_used, log_capacity: capacity, device: recovery, volume_open_s })
}

fn main() -> Result<()> {
    let args = Args::parse();
    anyhow::ensure!(args.files >= 1 && args.data_set >= 1, "--files and --data-set must be at least 1");
    anyhow::ensure!(args.write_min >= 1 && args.write_min <= args.write_max, "--write-min must be at least 1 and at most --write-max");
    anyhow::ensure!((1..=93).contains(&args.fill), "--fill takes 1 to 93 (percent of the log stores may use)");
    anyhow::ensure!(args.rounds >= 1, "--rounds must be at least 1");
    anyhow::ensure!((args.write_max as u64) < args.data_set * MIB / args.files, "--write-max must be smaller than a file of the data set");
    println!(
        "| round | log MiB | updates | log used MiB | device recovery s | of it scan s | index s | write-back s | pages written | old pages read | volume open s | total s |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    let mut rounds = Vec::new();
    for round in 0..args.rounds {
        let r = run_round(&args, round).with_context(|| format!("round {round}"))?;
        println!(
            "| {} | {} | {} | {:.1} | {:.3} | {:.3} | {:.3} | {:.3} | {} | {} | {:.3} | {:.3} |",
            round,
            args.log,
            r.updates,
            r.log_used as f64 / MIB as f64,
            r.device.total_us as f64 / 1e6,
            r.device.scan_us as f64 / 1e6,
            r.device.index_us as f64 / 1e6,
            (r.device.clean_us - r.device.index_us) as f64 / 1e6,
            r.device.pages_written,
            r.device.base_reads,
            r.volume_open_s,
            r.device.total_us as f64 / 1e6 + r.volume_open_s,
        );
        rounds.push(r);
    }
    if let Some(path) = &args.json {
        let rows: Vec<_> = rounds.iter().map(Round::json).collect();
        std::fs::write(path, serde_json::to_string_pretty(&rows)?).with_context(|| format!("write {}", path.display()))?;
    }
    Ok(())
}
