//! The `alignfs` command: format, mount, inspect, check and benchmark volumes.

mod bench;
mod bench_objects;
mod defaults;
mod export_device;
mod exposure;
mod health;
mod holder;
mod logging;
mod metrics;
mod mount;
mod mount_helper;
mod nbd;
mod prometheus;
mod report;
mod s3;
mod sync;
mod systemd;
mod umount;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use alignfs::device::IoBackend;
use alignfs::geometry::MIB;
use alignfs::paths::{check_format_devices, format_block_paths, format_object_paths, format_paths, open_paths_with_faults, DeviceSpec};
use alignfs::personality::BlockLayout;
use alignfs::profile::{DeviceKind, MetaStore, Personality};
use alignfs::{FormatOptions, Geometry, MetaStoreChoice, Profile, ReadMode, VolumeOptions};
use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};

/// alignfs: split every write into SSD-aligned IO and a small byte-addressable residue.
#[derive(Parser)]
#[command(name = "alignfs", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Format a new volume: a fast tier and an SSD (`orch`, `uhs`), SSDs alone (`scrap`), an
    /// SSD and a KV store directory (`nvstore`), or an emulated memory-semantic SSD (`byte`).
    Mkfs(MkfsArgs),
    /// Mount a volume through FUSE (the default devices are formatted on first use).
    Mount(mount::MountArgs),
    /// Unmount: the daemon flushes, writes a checkpoint and exits.
    Umount(umount::UmountArgs),
    /// Print a volume's counters and space usage: live from a mount point, or offline from
    /// its devices (replays the journal in memory; writes nothing).
    Stat(StatArgs),
    /// Check an unmounted volume: superblocks, checkpoint, journal, maps against allocators,
    /// namespace connectivity and link counts. Reports problems; writes nothing.
    Fsck(FsckArgs),
    /// Serve a block volume (`uhs`) over NBD until interrupted: qemu, nbdinfo, nbdcopy,
    /// nbdfuse, fio's nbd engine or the kernel's nbd module can use it.
    Nbd(nbd::NbdArgs),
    /// Serve an emulated memory-semantic SSD's block interface as the file MOUNTPOINT/disk
    /// until interrupted, for a loop device and a kernel file system on it (ext4 or F2FS
    /// on the same device as a `byte` volume: ByteFS's baselines).
    ExportDevice(export_device::ExportDeviceArgs),
    /// Serve an object store (`nvstore`) over S3 until interrupted: awscli, boto3, s3cmd,
    /// rclone and other S3 clients can use it.
    S3(s3::S3Args),
    /// Benchmark alignfs against a plain file and the device limit, in-process.
    Bench(bench::BenchArgs),
    /// Run one cell of NVStore's object workloads on an object store (`nvstore`),
    /// in-process, and print it as JSON (bench/nvstore.py compares it with Ceph BlueStore).
    BenchObjects(bench_objects::BenchObjectsArgs),
    /// Probe a mount: exit 0 if its daemon answers, 1 if it died or hangs (for watchdogs).
    Health(health::HealthArgs),
    /// Make everything on a mount durable: every file's data and every namespace change
    /// (`sync` and `syncfs(2)` do not reach a FUSE daemon; a `scrap` mount otherwise
    /// commits namespace changes at fsync or within --commit-interval).
    Sync(sync::SyncArgs),
}

/// Where the volume's devices are.
#[derive(Args, Clone)]
struct DeviceArgs {
    /// Fast tier (persistent memory): a DAX or tmpfs file, `PATH[:SIZE]`.
    /// Default: /dev/shm/alignfs/fast (1G when created).
    #[arg(long, value_name = "PATH[:SIZE]")]
    fast: Option<String>,
    /// SSD: a block device or an image file, `PATH[:SIZE]` (image files are preallocated).
    /// Repeat it for a `scrap` volume on several SSDs. Default: DATA_DIR/ssd.img (8G when
    /// created).
    #[arg(long, value_name = "PATH[:SIZE]")]
    ssd: Vec<String>,
    /// Directory for the default SSD image (env ALIGNFS_DATA_DIR; default /var/tmp/alignfs).
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// The KV store of an `nvstore` volume: a directory, on this disk or another
    /// (default: beside the SSD, SSD.kv).
    #[arg(long, value_name = "DIR")]
    kv: Option<PathBuf>,
    /// SSD IO backend (default: io_uring when the kernel allows it).
    #[arg(long, value_enum)]
    io_backend: Option<BackendArg>,
}

#[derive(Clone, Copy, ValueEnum)]
enum BackendArg {
    Uring,
    Threads,
}

impl DeviceArgs {
    fn specs(&self) -> Result<(DeviceSpec, Vec<DeviceSpec>)> {
        defaults::device_specs(self.fast.as_deref(), &self.ssd, self.data_dir.as_deref())
    }

    /// The SSD paths, for opening.
    fn ssd_paths(ssds: &[DeviceSpec]) -> Vec<PathBuf> {
        ssds.iter().map(|s| s.path.clone()).collect()
    }

    /// The device options as they would be typed again (for hints).
    fn as_args(&self) -> String {
        let mut out: Vec<String> = Vec::new();
        if let Some(fast) = &self.fast {
            out.push(format!(
                "--fast {}",
                fast.rsplit_once(':').filter(|(_, s)| alignfs::geometry::parse_size(s).is_ok()).map_or(fast.as_str(), |(p, _)| p)
            ));
        }
        for ssd in &self.ssd {
            out.push(format!(
                "--ssd {}",
                ssd.rsplit_once(':').filter(|(_, s)| alignfs::geometry::parse_size(s).is_ok()).map_or(ssd.as_str(), |(p, _)| p)
            ));
        }
        out.join(" ")
    }

    fn backend(&self) -> Option<IoBackend> {
        self.io_backend.map(|b| match b {
            BackendArg::Uring => IoBackend::Uring,
            BackendArg::Threads => IoBackend::ThreadPool,
        })
    }
}

#[derive(Args)]
struct MkfsArgs {
    #[command(flatten)]
    devices: DeviceArgs,
    /// Profile: `orch` (OrchFS: persistent fast tier + SSD, durable on every write),
    /// `scrap` (WSBuffer: SSDs only, residue in DRAM scrap pages, durable on fsync),
    /// `uhs` (UHS: a block volume over NVM + SSD, served with `alignfs nbd`), `nvstore`
    /// (NVStore: an object store, unaligned pieces as fragments in a KV store, `--kv`) or
    /// `byte` (ByteFS: an emulated SSD with a byte interface; `--ssd` is its flash, `--fast`
    /// its DRAM, docs/BYTE.md).
    #[arg(long, default_value = "orch")]
    profile: String,
    /// Block volumes (`uhs`): the volume's size (default: as large as the SSD allows).
    #[arg(long, value_name = "SIZE")]
    size: Option<String>,
    /// Block volumes: the logical block size clients must align to, 512 or 4096.
    #[arg(long, value_name = "BYTES", default_value = "512")]
    sector_size: u32,
    /// Block volumes: keep bytes START..END of the volume in the NVM zone for good (UHS's
    /// static map, e.g. a file system's metadata; END exclusive; sizes like 64M). Repeat
    /// for several ranges.
    #[arg(long, value_name = "START-END")]
    nvm_range: Vec<String>,
    /// SSD block size: the unit of every SSD write (default 32K; for `scrap` it is the
    /// scrap page, default 256K).
    #[arg(long)]
    block_size: Option<String>,
    /// Fast-tier page size (default 4K; for `scrap` it equals the block size).
    #[arg(long)]
    page_size: Option<String>,
    /// Largest SSD write (large runs are cut into pieces of this size, in flight together),
    /// a multiple of the block size (default 256K, or the block size when that is larger).
    #[arg(long)]
    split_size: Option<String>,
    /// SSD IO threads when io_uring is unavailable (with io_uring, each thread that does IO
    /// submits to its own ring).
    #[arg(long, default_value_t = 2)]
    io_workers: u32,
    /// Overwrite devices that already hold an alignfs volume.
    #[arg(long)]
    force: bool,
    /// `byte`: keep the metadata `in-place` (ByteFS's layout: 128-byte inodes, entries
    /// and bitmap words as 64-byte lines, each commit one device transaction; the
    /// default) or in the `journal` and checkpoints the other profiles use.
    #[arg(long, value_name = "STORE", value_parser = ["in-place", "journal"])]
    meta_store: Option<String>,
    /// `byte`: the memory-semantic SSD's write log, 1M–4G (default 1/32 of the device,
    /// 1M–256M); a smaller log is cleaned to flash more often (ByteFS's sensitivity runs
    /// use 16M, 64M and 256M).
    #[arg(long, value_name = "SIZE")]
    device_log: Option<String>,
}

/// Commands that only read a volume name its devices without sizes.
fn existing_fast(arg: clap::Arg) -> clap::Arg {
    arg.value_name("PATH").help("Fast tier (or a `byte` device's DRAM) [default: /dev/shm/alignfs/fast]")
}

fn existing_ssd(arg: clap::Arg) -> clap::Arg {
    arg.value_name("PATH").help("SSD (or a `byte` device's flash image); once per SSD of a set [default: DATA_DIR/ssd.img]")
}

#[derive(Args)]
#[command(mut_arg("fast", existing_fast), mut_arg("ssd", existing_ssd))]
struct StatArgs {
    /// A mount point of a running volume (instead of device paths).
    #[arg(conflicts_with_all = ["fast", "ssd", "data_dir"])]
    mountpoint: Option<PathBuf>,
    #[command(flatten)]
    devices: DeviceArgs,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Print the Prometheus text format instead of a table, for node_exporter's textfile
    /// collector (docs/OPERATING.md).
    #[arg(long, conflicts_with = "json")]
    prometheus: bool,
}

#[derive(Args)]
#[command(mut_arg("fast", existing_fast), mut_arg("ssd", existing_ssd))]
struct FsckArgs {
    #[command(flatten)]
    devices: DeviceArgs,
}

/// The bytes of a size option (`16M`, `1G`, …), the flag named in its error.
pub(crate) fn byte_size(flag: &str, text: &str) -> Result<u64> {
    alignfs::geometry::parse_size(text).with_context(|| format!("{flag} {text}"))
}

fn size_arg(text: &str, what: &str) -> Result<u32> {
    let bytes = alignfs::geometry::parse_size(text).with_context(|| format!("--{what}"))?;
    u32::try_from(bytes).with_context(|| format!("--{what} {text} is too large"))
}

fn mkfs(args: &MkfsArgs) -> Result<()> {
    let profile = Profile::parse(&args.profile)?;
    let geometry = geometry_arg(args, profile)?;
    let (fast, ssds) = args.devices.specs()?;
    let kind = profile.devices();
    let fast = match kind {
        // The device's DRAM: sized for the device unless named with a size.
        DeviceKind::MemorySemanticSsd => Some(DeviceSpec { size: args.devices.fast.as_ref().and(fast.size), ..fast }),
        DeviceKind::FastTierAndSsd => Some(fast),
        _ if args.devices.fast.is_some() => anyhow::bail!("profile {} keeps no data in a fast tier; drop --fast", profile.name()),
        _ => None,
    };
    let meta_store = match args.meta_store.as_deref() {
        None => MetaStoreChoice::ProfileDefault,
        Some("journal") => MetaStoreChoice::Journal,
        Some(_) => MetaStoreChoice::InPlace,
    };
    // Refused before any device file is created.
    let store = profile.metadata_store(meta_store)?;
    let device_log_bytes = match &args.device_log {
        None => None,
        Some(_) if kind != DeviceKind::MemorySemanticSsd => {
            anyhow::bail!("profile {} has no memory-semantic SSD; drop --device-log", profile.name())
        }
        Some(text) => Some(byte_size("--device-log", text)?),
    };
    let options = FormatOptions { geometry, profile, force: args.force, meta_store, device_log_bytes };
    // Before anything reads a device to size the volume.
    check_format_devices(fast.as_ref(), &ssds, args.devices.kv.as_deref(), &options).map_err(|e| named_defaults(e, &args.devices))?;
    let block_layout = block_layout(args, profile)?;
    let (sb, volume, block) = match block_layout {
        Some(layout) => {
            let (sb, block) = format_block_paths(fast.as_ref(), &ssds, &options, layout, args.devices.backend())?;
            let layout = block.layout().clone();
            (sb, block.into_volume(), Some(layout))
        }
        None if profile.personality() == Personality::Objects => {
            let (sb, store) = format_object_paths(&ssds, args.devices.kv.as_deref(), &options, args.devices.backend())?;
            (sb, store.into_volume(), None)
        }
        None => {
            let (sb, volume) = format_paths(fast.as_ref(), &ssds, args.devices.kv.as_deref(), &options, args.devices.backend())?;
            (sb, volume, None)
        }
    };
    print_formatted(args, &sb, &volume, store, block.as_ref(), &ssds[0].path);
    volume.close()?;
    Ok(())
}

/// The geometry from `--block-size`, `--page-size` and `--split-size`, each defaulting
/// to the profile's.
fn geometry_arg(args: &MkfsArgs, profile: Profile) -> Result<Geometry> {
    let defaults = profile.default_geometry();
    let block_bytes = args.block_size.as_deref().map_or(Ok(defaults.block_bytes), |t| size_arg(t, "block-size"))?;
    // A profile whose residue unit is one whole block (a scrap page) keeps that when
    // only --block-size is given.
    let page_bytes = match &args.page_size {
        Some(text) => size_arg(text, "page-size")?,
        None if defaults.page_bytes == defaults.block_bytes => block_bytes,
        None => defaults.page_bytes,
    };
    let split_bytes = args.split_size.as_deref().map_or(Ok(defaults.split_bytes.max(block_bytes)), |t| size_arg(t, "split-size"))?;
    Ok(Geometry { block_bytes, page_bytes, split_bytes, io_workers: args.io_workers })
}

/// What mkfs made, and how to serve it.
fn print_formatted(
    args: &MkfsArgs,
    sb: &alignfs::layout::Superblock,
    volume: &alignfs::Volume,
    store: MetaStore,
    block: Option<&alignfs::personality::BlockLayout>,
    first_ssd: &std::path::Path,
) {
    let (fast_desc, ssd_desc, residue) = volume.describe_devices();
    println!("formatted alignfs volume {} (profile {})", sb.uuid_string(), sb.profile.name());
    println!("  fast tier: {fast_desc}");
    println!("  SSD:       {ssd_desc}");
    println!("  residue:   {residue}");
    println!(
        "  geometry:  {} blocks, {} pages, split {}, {} IO workers",
        bytesize::ByteSize(u64::from(sb.geometry.block_bytes)),
        bytesize::ByteSize(u64::from(sb.geometry.page_bytes)),
        bytesize::ByteSize(u64::from(sb.geometry.split_bytes)),
        sb.geometry.io_workers
    );
    match store {
        MetaStore::Kv => {
            let kv = args.devices.kv.clone().unwrap_or_else(|| alignfs::paths::default_kv_dir(first_ssd));
            println!("  metadata:  KV store {}", kv.display());
        }
        MetaStore::InPlaceLines => println!(
            "  metadata:  in place, {} of 64-byte lines; a {} redo area for the block interface alone",
            bytesize::ByteSize(2 * sb.layout.checkpoint_bytes),
            bytesize::ByteSize(sb.layout.journal_bytes)
        ),
        MetaStore::Journal => print_journal_layout(sb, sb.profile.devices()),
    }
    if let Some(layout) = block {
        println!("  block volume: {} bytes ({}), {}-byte sectors", layout.size, bytesize::ByteSize(layout.size), layout.sector_bytes);
        for r in &layout.nvm_ranges {
            println!("  NVM zone:  bytes {}-{} ({})", r.start, r.end, bytesize::ByteSize(r.end - r.start));
        }
        println!("  serve it:  alignfs nbd {}", args.devices.as_args());
    }
    if sb.profile.personality() == Personality::Objects {
        println!("  serve it:  alignfs s3 {} --keys FILE", args.devices.as_args());
    }
}

/// A journal's layout, and a warning when its checkpoint slots cannot map the whole SSD.
fn print_journal_layout(sb: &alignfs::layout::Superblock, kind: DeviceKind) {
    println!(
        "  metadata:  journal {}, checkpoint slots 2 x {}",
        bytesize::ByteSize(sb.layout.journal_bytes),
        bytesize::ByteSize(sb.layout.checkpoint_bytes)
    );
    let full_map = alignfs::geometry::MetaLayout::full_map_bytes(sb.ssd_bytes, &sb.geometry);
    if kind == DeviceKind::FastTierAndSsd && sb.layout.checkpoint_bytes < full_map {
        eprintln!(
            "warning: the checkpoint slots hold the maps of about {} of the SSD's {}; past that, writes fail with \
             ENOSPC. A fast tier of {} or more (--fast PATH:SIZE), or larger blocks (--block-size), maps all of it.",
            bytesize::ByteSize((u128::from(sb.ssd_bytes) * u128::from(sb.layout.checkpoint_bytes) / u128::from(full_map)) as u64),
            bytesize::ByteSize(sb.ssd_bytes),
            bytesize::ByteSize(alignfs::geometry::MetaLayout::fast_bytes_for_full_map(sb.ssd_bytes, &sb.geometry))
        );
    }
}

/// A refusal to format the default devices, with how to keep what they hold.
fn named_defaults(e: alignfs::Error, devices: &DeviceArgs) -> anyhow::Error {
    let defaults = devices.fast.is_none() || devices.ssd.is_empty();
    match e {
        alignfs::Error::AlreadyFormatted { .. } if defaults => anyhow::anyhow!(
            "{e}, or keep it and name the new volume's own devices (--fast PATH[:SIZE], --ssd PATH[:SIZE]; a default is used for each one not named)"
        ),
        e => e.into(),
    }
}

/// The block layout `mkfs` formats a block-volume profile with; `None` for the others
/// (which refuse the block-volume options).
fn block_layout(args: &MkfsArgs, profile: Profile) -> Result<Option<BlockLayout>> {
    if profile.personality() != Personality::Block {
        if args.size.is_some() || !args.nvm_range.is_empty() || args.sector_size != 512 {
            anyhow::bail!("--size, --sector-size and --nvm-range format block volumes; profile {} is a file system", profile.name());
        }
        return Ok(None);
    }
    let mut nvm_ranges = Vec::new();
    for text in &args.nvm_range {
        let (start, end) = text.split_once('-').with_context(|| format!("--nvm-range {text}: expected START-END"))?;
        nvm_ranges.push(byte_size("--nvm-range", start)?..byte_size("--nvm-range", end)?);
    }
    let size = match &args.size {
        Some(text) => byte_size("--size", text)?,
        None => largest_block_volume(args)?,
    };
    // Checked before any device file is created; the SSD's room is checked at format.
    let mut layout = BlockLayout { size, sector_bytes: args.sector_size, nvm_ranges };
    layout.validate()?;
    Ok(Some(layout))
}

/// The largest volume the SSD holds with room for out-of-place writes, in whole MiB.
fn largest_block_volume(args: &MkfsArgs) -> Result<u64> {
    let (_, ssds) = args.devices.specs()?;
    let ssd = &ssds[0];
    let bytes = match ssd.size {
        Some(size) => size,
        None => std::fs::metadata(&ssd.path)
            .with_context(|| format!("{} (name its size: --ssd PATH:SIZE, or give --size)", ssd.path.display()))?
            .len(),
    };
    let room = bytes.saturating_sub(bytes / 32 + (2 << 20));
    Ok(room / MIB * MIB)
}

fn stat(args: &StatArgs) -> Result<()> {
    let report = match &args.mountpoint {
        Some(mountpoint) => mount::live_report(mountpoint)?,
        None => {
            let (fast, ssds) = args.devices.specs()?;
            let options = VolumeOptions { read_only: true, background: false, read_mode: ReadMode::Buffered, ..VolumeOptions::default() };
            let kv = args.devices.kv.as_deref();
            open_paths_with_faults(&fast.path, &DeviceArgs::ssd_paths(&ssds), kv, options, args.devices.backend(), None)?.report()
        }
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else if args.prometheus {
        print!("{}", prometheus::render(&report));
    } else {
        report::print_report(&report);
    }
    Ok(())
}

/// Exit status: 0 clean, 1 problems found, 2 the volume cannot be opened at all.
fn fsck(args: &FsckArgs) -> Result<ExitCode> {
    let (fast, ssds) = args.devices.specs()?;
    let options = VolumeOptions { read_only: true, background: false, ..VolumeOptions::default() };
    let kind = alignfs::paths::ssd_superblock(&ssds[0].path).ok().flatten().map(|sb| sb.profile.devices());
    let kv = args.devices.kv.as_deref();
    let mut devices: Vec<String> = ssds.iter().map(|s| s.path.display().to_string()).collect();
    let what = match kind {
        Some(DeviceKind::SsdAndKvStore) => {
            devices.push(kv.map_or_else(|| alignfs::paths::default_kv_dir(&ssds[0].path), Path::to_path_buf).display().to_string());
            "the superblock, the KV records"
        }
        Some(DeviceKind::Ssds { .. }) => "superblocks, checkpoint, journal",
        // A byte device's flash shows no superblock: its DRAM is named as --fast.
        _ => {
            devices.insert(0, fast.path.display().to_string());
            "superblocks, checkpoint, journal"
        }
    };
    println!("checking {what} and unit references of {}", devices.join(" + "));
    let volume = match open_paths_with_faults(&fast.path, &DeviceArgs::ssd_paths(&ssds), kv, options, args.devices.backend(), None) {
        Ok(volume) => volume,
        Err(e) => {
            println!("FAILED: {e}");
            println!("the volume cannot be opened; repair is not attempted (nothing was written)");
            return Ok(ExitCode::from(2));
        }
    };
    let recovery = volume.recovery();
    let orphans =
        if recovery.orphans_dropped > 0 { format!(", {} orphaned inodes would be freed", recovery.orphans_dropped) } else { String::new() };
    if kind == Some(DeviceKind::SsdAndKvStore) {
        println!("  ok: every KV record decodes and the namespace hangs together{orphans}");
    } else {
        println!(
            "  ok: checkpoint generation {}, {} journal records replayed{}{}",
            recovery.checkpoint_generation,
            recovery.records_replayed,
            if recovery.torn_tail_dropped { ", a torn unacknowledged tail record would be dropped" } else { "" },
            orphans
        );
    }
    println!("checking namespace connectivity, link counts and maps");
    let problems = volume.check();
    for p in &problems {
        println!("  inode {}: {}", p.ino.0, p.what);
    }
    let s = volume.statfs();
    println!(
        "{} inodes, {} of {} SSD blocks and {} of {} fast pages in use: {}",
        s.inodes,
        s.blocks_total - s.blocks_free,
        s.blocks_total,
        s.fast_pages_total - s.fast_pages_free,
        s.fast_pages_total,
        if problems.is_empty() { "clean".to_string() } else { format!("{} problems (repair is not implemented)", problems.len()) }
    );
    Ok(if problems.is_empty() { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

fn main() -> ExitCode {
    let cli = match mount_helper::as_mount_helper() {
        Ok(Some(cli)) => cli,
        Ok(None) => Cli::parse(),
        Err(e) => {
            eprintln!("{}: {e:#}", mount_helper::HELPER);
            return ExitCode::from(mount_helper::EXIT_MOUNT_USAGE);
        }
    };
    // A command exits quietly when the reader of its output goes away (`alignfs stat |
    // head`), as command-line tools do, instead of panicking on EPIPE. A daemon must not:
    // a client that hangs up while a reply is written (writev and TLS alerts raise
    // SIGPIPE) would end it without closing its volume.
    let daemon = matches!(cli.command, Command::Mount(_) | Command::Nbd(_) | Command::S3(_) | Command::ExportDevice(_));
    // SAFETY: called before any thread is started; the disposition is a plain constant.
    unsafe {
        libc::signal(libc::SIGPIPE, if daemon { libc::SIG_IGN } else { libc::SIG_DFL });
    }
    logging::init();
    let result = match &cli.command {
        Command::Mkfs(args) => mkfs(args),
        Command::Mount(args) => mount::mount(args),
        Command::Umount(args) => umount::umount(args),
        Command::Stat(args) => stat(args),
        Command::Fsck(args) => match fsck(args) {
            Ok(code) => return code,
            Err(e) => Err(e),
        },
        Command::Nbd(args) => nbd::run(args),
        Command::ExportDevice(args) => export_device::run(args),
        Command::S3(args) => s3::run(args),
        Command::Bench(args) => bench::run(args),
        Command::BenchObjects(args) => bench_objects::run(args),
        Command::Sync(args) => sync::run(args),
        Command::Health(args) => match health::run(args) {
            Ok(true) => return ExitCode::SUCCESS,
            Ok(false) => return ExitCode::FAILURE,
            // Not 1: a watchdog must not read a usage mistake as a dead mount.
            Err(e) => {
                eprintln!("alignfs: {e:#}");
                return ExitCode::from(2);
            }
        },
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("alignfs: {}", holder::message(&e, mount::holder_of));
            ExitCode::FAILURE
        }
    }
}
