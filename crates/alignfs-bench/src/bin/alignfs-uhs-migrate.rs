//! UHS migration time against NVM buffer size (the paper's Fig. 11), in-process on real
//! device files: the NVM buffer on tmpfs, the SSD an image file on this disk.
//!
//! For each buffer size the program formats a fresh `uhs` volume, fills the buffer to
//! `--fill` of its slots with 4 KiB random writes (background migration off, so nothing
//! drains it meanwhile except a segment that fills up), then times one drain of the whole
//! buffer to the SSD. It prints a table (buffer, blocks drained, total ms, ms per 4 MiB
//! segment, MiB/s) and, with `--json`, one object per size.

use std::path::PathBuf;
use std::time::Instant;

use alignfs::paths::{format_block_paths, open_block_paths, DeviceSpec};
use alignfs::personality::BlockLayout;
use alignfs::stats::Counter;
use alignfs::{FormatOptions, Profile, VolumeOptions};
use anyhow::{Context, Result};
use clap::Parser;
use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};

const MIB: u64 = 1 << 20;
const BLOCK: u64 = 4096;
/// The default segment (`alignfs nbd --segment-size`).
const SEGMENT: u64 = 4 * MIB;

#[derive(Parser)]
#[command(about = "uhs: time to drain the NVM buffer to the SSD, against the buffer's size")]
struct Args {
    /// NVM buffer sizes (the fast device at mkfs), MiB.
    #[arg(long, value_delimiter = ',', default_value = "16,64,256")]
    buffers: Vec<u64>,
    /// Share of the buffer's slots to fill before draining.
    #[arg(long, default_value_t = 0.75)]
    fill: f64,
    /// Volume size, MiB (the SSD image is 1.25 times this).
    #[arg(long, default_value_t = 1024)]
    volume: u64,
    /// Directory for the SSD images (on the disk being measured).
    #[arg(long, default_value = "/var/tmp")]
    dir: PathBuf,
    /// Directory for the NVM devices (tmpfs).
    #[arg(long, default_value = "/dev/shm")]
    fast_dir: PathBuf,
    /// Write the rows as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

struct Row {
    buffer_mib: u64,
    /// Slots the buffer holds (the NVM device less the volume's metadata).
    slots: u64,
    blocks: u64,
    fill_s: f64,
    drain_ms: f64,
}

fn measure(args: &Args, buffer_mib: u64, rng: &mut StdRng) -> Result<Row> {
    let work = tempfile_dir(&args.dir)?;
    let shm = tempfile_dir(&args.fast_dir)?;
    let fast = DeviceSpec { path: shm.join("nvm"), size: Some(buffer_mib * MIB) };
    let ssd = DeviceSpec { path: work.join("ssd.img"), size: Some(args.volume * MIB * 5 / 4) };
    let format = FormatOptions { profile: Profile::UHS, geometry: Profile::UHS.default_geometry(), force: false, ..Default::default() };
    let (_, volume) = format_block_paths(Some(&fast), std::slice::from_ref(&ssd), &format, BlockLayout::new(args.volume * MIB), None)
        .context("format")?;
    volume.close()?;
    let options = VolumeOptions { background: false, ..VolumeOptions::default() };
    let disk = open_block_paths(&fast.path, std::slice::from_ref(&ssd.path), options, None).context("open")?;
    let total = disk.volume().stats().usage.fast_pages_total;
    let target = (total as f64 * args.fill) as u64;
    let mut block = vec![0u8; BLOCK as usize];
    let blocks = args.volume * MIB / BLOCK;
    let started = Instant::now();
    // Distinct blocks, so every write takes a slot (an overwrite reuses its own). The
    // usage is read every 64 writes: a stats snapshot takes the commit lock.
    let mut written = std::collections::HashSet::new();
    while disk.volume().stats().usage.fast_pages_used < target {
        for _ in 0..64 {
            let b = rng.random_range(0..blocks);
            if written.insert(b) {
                rng.fill_bytes(&mut block);
                disk.write(b * BLOCK, &block)?;
            }
        }
    }
    let fill_s = started.elapsed().as_secs_f64();
    let before = disk.volume().stats().get(Counter::migrations_watermark);
    let started = Instant::now();
    disk.volume().migrate_all()?;
    let drain_ms = started.elapsed().as_secs_f64() * 1e3;
    let drained = disk.volume().stats().get(Counter::migrations_watermark) - before;
    anyhow::ensure!(disk.volume().stats().usage.fast_pages_used == 0, "the drain left slots in the buffer");
    disk.close()?;
    std::fs::remove_dir_all(&work).ok();
    std::fs::remove_dir_all(&shm).ok();
    Ok(Row { buffer_mib, slots: total, blocks: drained, fill_s, drain_ms })
}

fn tempfile_dir(parent: &std::path::Path) -> Result<PathBuf> {
    let dir = parent.join(format!("alignfs-uhs-migrate.{}.{}", std::process::id(), rand::random::<u32>()));
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    Ok(dir)
}

fn main() -> Result<()> {
    let args = Args::parse();
    anyhow::ensure!(args.fill > 0.0 && args.fill <= 0.95, "--fill must be in (0, 0.95]");
    let mut rng = StdRng::seed_from_u64(7);
    let mut rows = Vec::new();
    println!("| NVM device | buffer slots | blocks drained | fill (s) | drain (ms) | ms per 4 MiB segment | drain MiB/s |");
    println!("|---|---|---|---|---|---|---|");
    for &buffer in &args.buffers {
        let row = measure(&args, buffer, &mut rng).with_context(|| format!("buffer {buffer} MiB"))?;
        let mib = row.blocks as f64 * BLOCK as f64 / MIB as f64;
        println!(
            "| {} MiB | {} | {} | {:.2} | {:.1} | {:.2} | {:.0} |",
            row.buffer_mib,
            row.slots,
            row.blocks,
            row.fill_s,
            row.drain_ms,
            row.drain_ms / (row.slots as f64 * BLOCK as f64 / SEGMENT as f64),
            mib / (row.drain_ms / 1e3)
        );
        rows.push(row);
    }
    if let Some(path) = &args.json {
        let json: Vec<serde_json::Value> = rows
            .iter()
            .map(|r| serde_json::json!({"buffer_mib": r.buffer_mib, "slots": r.slots, "blocks": r.blocks, "fill_s": r.fill_s, "drain_ms": r.drain_ms}))
            .collect();
        std::fs::write(path, serde_json::to_string_pretty(&json)?).with_context(|| format!("write {}", path.display()))?;
    }
    Ok(())
}
