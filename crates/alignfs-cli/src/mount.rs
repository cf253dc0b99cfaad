//! `alignfs mount` and `alignfs umount`: serve a volume through FUSE.
//!
//! Without `-f` the command starts itself again in the foreground as a daemon (new process
//! group, output to the log file) and returns once that daemon reports the mount ready
//! on its stdout, or prints why it failed.

use alignfs::profile::Tunable;
use alignfs::Profile;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use alignfs::device::mssd::LatencyModel;
use alignfs::device::FaultPlan;
use alignfs::paths::{format_paths, open_paths_with_faults, ssd_superblock, DeviceSpec};
use alignfs::{Error, FormatOptions, VolumeOptions};
use alignfs_fuse::{AlignFs, CacheMode, FuseOptions, RingThreads, Transport, STATS_XATTR};
use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use fuser::{Config, MountOption, SessionACL, IO_URING_PARAMETER};

use crate::holder::{self, Holder, Process};
use crate::{defaults, DeviceArgs};

/// Set in the daemon's environment: report readiness on stdout, then detach from it.
const DAEMON_ENV: &str = "ALIGNFS_DAEMON";
const READY: &str = "ready";

pub const DEFAULT_MOUNTPOINT: &str = "/mnt/alignfs";

#[derive(Args, Clone)]
pub struct MountArgs {
    #[command(flatten)]
    devices: DeviceArgs,
    /// Where to mount (created if missing).
    #[arg(default_value = DEFAULT_MOUNTPOINT)]
    mountpoint: PathBuf,
    /// Stay in the foreground (log to stderr) instead of starting a daemon.
    #[arg(short, long)]
    foreground: bool,
    /// The daemon's log file (default DATA_DIR/mount.log).
    #[arg(long, value_name = "FILE")]
    log: Option<PathBuf>,
    /// Mount options, comma-separated: allow_other, allow_root, ro, default_permissions
    /// (always on), noatime, nodev, nosuid, noexec, dirsync, sync.
    #[arg(short = 'o', value_name = "OPTIONS", value_delimiter = ',')]
    options: Vec<String>,
    /// Threads serving FUSE requests (each with its own /dev/fuse descriptor, and over
    /// io_uring each with one ring entry; at least one per CPU).
    #[arg(long, default_value_t = 4)]
    threads: usize,
    /// How requests travel: `auto` (FUSE over io_uring where the kernel offers it, with
    /// `/sys/module/fuse/parameters/enable_uring` set; /dev/fuse otherwise), `io-uring`
    /// (or no mount) or `dev-fuse`. `alignfs stat` shows which one serves. docs/FUSE.md.
    #[arg(long, value_name = "TRANSPORT", default_value = "auto")]
    transport: Transport,
    /// Where the io_uring request threads run: `pinned` (each only on the CPU of its queue,
    /// as libfuse does; the kernel queues a request on the CPU its caller runs on) or
    /// `unpinned` (wherever the scheduler puts them). Pinned ran RocksDB's synchronous
    /// writes 2.5–3.6× faster here, and one fio thread's synchronous requests at
    /// 0.6–0.85×. docs/FUSE.md.
    #[arg(long, value_name = "PLACEMENT", default_value = "pinned")]
    ring_threads: RingThreads,
    /// Seconds the kernel may cache attributes and names.
    #[arg(long, default_value_t = 1.0)]
    attr_ttl: f64,
    /// Which opens use the kernel page cache: `reads` (read-only opens read through it;
    /// opens that can write bypass it, and every write keeps it current), `direct` (no open
    /// uses it) or `all` (writes too go through it, write-through: reads of what was
    /// written through the mount, such as RocksDB's, find it cached, but a write crossing
    /// an uncached page costs two requests and a large one a copy). docs/FUSE.md.
    #[arg(long, value_name = "MODE", default_value = "reads")]
    cache: CacheMode,
    /// Under `--cache reads`, after the last close of a file written through the mount over
    /// at most SIZE bytes, read those bytes back into the kernel's page cache, as a kernel
    /// file system's writes leave them (RocksDB then reads its new tables from memory).
    /// `0` turns it off. docs/FUSE.md.
    #[arg(long, value_name = "SIZE", default_value = "64M")]
    fill_on_close: String,
    /// Leave `fs.fuse.max_pages_limit` as it is. By default a mount run as root raises it
    /// to 8 MiB worth of pages, so that writes of up to 8 MiB reach the engine whole.
    #[arg(long)]
    keep_fuse_limit: bool,
    /// Put the SSD behind a fault injector armed through the root's `user.alignfs.inject`
    /// attribute (e.g. `setfattr -n user.alignfs.inject -v write=1 MOUNTPOINT` fails the
    /// next SSD write). For testing error paths; docs/CRASH-CONSISTENCY.md.
    #[arg(long)]
    inject_faults: bool,
    /// `scrap` volumes: the most DRAM the scrap pages may take (default 1G). Writers wait
    /// for the flusher when it is reached.
    #[arg(long, value_name = "SIZE")]
    scrap_mem: Option<String>,
    /// `scrap` volumes: writes this large or larger send their whole blocks straight to the
    /// SSD; smaller writes go whole to the scrap buffer (default 1M).
    #[arg(long, value_name = "SIZE")]
    request_threshold: Option<String>,
    /// `scrap` volumes: threads writing scrap pages back to the SSD (default 2).
    #[arg(long)]
    flush_workers: Option<usize>,
    /// `scrap` volumes: namespace changes (create, rename, unlink, mkdir, chmod…) become
    /// durable at the next fsync of a file or directory, or at the latest this many seconds
    /// after they return (default 5, as ext4 commits its journal); 0 makes each durable
    /// before it returns.
    #[arg(long, value_name = "SECONDS")]
    commit_interval: Option<f64>,
    /// `byte` volumes: use the memory-semantic SSD's block interface alone (the paper's
    /// block-only baseline: metadata in whole sectors, partial blocks read and rewritten).
    #[arg(long)]
    no_byte_interface: bool,
    /// `byte` volumes: the emulated device takes at least the time ByteFS's Table 4 gives
    /// each operation (flash 40/60 µs read/write over 8 channels, cache-line loads 4.8 µs,
    /// stores 0.6 µs); the IO on the flash image counts toward it, so flash on a disk slower
    /// than the model takes the disk's time (docs/BYTE.md). `--device-latency=SCALE`
    /// multiplies the flash latencies (ByteFS's sensitivity runs use 0.5 and 2).
    #[arg(long, value_name = "SCALE", num_args = 0..=1, require_equals = true, default_missing_value = "1")]
    device_latency: Option<f64>,
    /// `byte` volumes, with `--device-latency`: the device's FTL acknowledges block writes
    /// once they are in a write buffer of this size (ByteFS's prototype has 16M) and
    /// programs them while later requests run; by default every block write waits for
    /// its program, as on Table 4's emulated device.
    #[arg(long, value_name = "SIZE", requires = "device_latency")]
    device_write_buffer: Option<String>,
    /// `byte` volumes: DRAM for copies of the device's blocks that reads find without the
    /// device, the host's cache of it (default 256M; 0 keeps none), and as much again, at
    /// most the residue zone, for copies of residue units.
    #[arg(long, value_name = "SIZE")]
    clean_cache: Option<String>,
    /// Serve Prometheus metrics at http://ADDR/metrics (e.g. 127.0.0.1:9464): the
    /// volume's counters and space as `alignfs stat --prometheus` prints them, with the
    /// FUSE requests served and their service times by kind.
    /// docs/OPERATING.md.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<String>,
}

/// `alignfs mount`'s arguments alone, to read back a running mount's command line.
#[derive(clap::Parser)]
#[command(name = "alignfs mount")]
struct MountCommand {
    #[command(flatten)]
    args: MountArgs,
}

/// What process `pid`, which holds a device, is: for a mount, where it is mounted.
pub fn holder_of(pid: u32) -> Option<Holder> {
    let process = Process::of(pid)?;
    Some(match process.alignfs_command() {
        Some(("mount", args)) => {
            match <MountCommand as clap::Parser>::try_parse_from(std::iter::once("mount").chain(args.iter().map(String::as_str))) {
                Ok(mount) => {
                    let mountpoint = process.resolve(&mount.args.mountpoint);
                    Holder::Mount { pid, mounted: is_alignfs_mount(&mountpoint), mountpoint }
                }
                Err(_) => Holder::Other { pid, command: process.command_line() },
            }
        }
        Some(("nbd", _)) => Holder::Server { pid, command: "alignfs nbd" },
        Some(("s3", _)) => Holder::Server { pid, command: "alignfs s3" },
        _ => Holder::Other { pid, command: process.command_line() },
    })
}

/// Options for the kernel and for the volume, parsed from `-o`.
struct ParsedOptions {
    mount: Vec<MountOption>,
    acl: SessionACL,
    read_only: bool,
}

fn parse_options(options: &[String]) -> Result<ParsedOptions> {
    // Permission checks happen in the kernel against the attributes we return.
    let mut parsed = ParsedOptions { mount: vec![MountOption::DefaultPermissions], acl: SessionACL::Owner, read_only: false };
    for option in options.iter().map(|o| o.trim()).filter(|o| !o.is_empty()) {
        match option {
            "allow_other" => parsed.acl = SessionACL::All,
            "allow_root" => parsed.acl = SessionACL::RootAndOwner,
            "ro" => {
                parsed.read_only = true;
                parsed.mount.push(MountOption::RO);
            }
            "rw" | "default_permissions" => {}
            "noatime" => parsed.mount.push(MountOption::NoAtime),
            "nodev" => parsed.mount.push(MountOption::NoDev),
            "nosuid" => parsed.mount.push(MountOption::NoSuid),
            "noexec" => parsed.mount.push(MountOption::NoExec),
            "dirsync" => parsed.mount.push(MountOption::DirSync),
            "sync" => parsed.mount.push(MountOption::Sync),
            other => bail!("unsupported mount option {other:?} (see `alignfs mount --help`)"),
        }
    }
    Ok(parsed)
}

/// Detach `path` if it is a mount whose daemon died. The test is statfs, which always
/// reaches the daemon (stat may be answered from the kernel's attribute cache). A request
/// caught by the kernel aborting the connection fails with ECONNABORTED, later ones with
/// ENOTCONN. Over io_uring the abort comes a moment after the daemon's death (the kernel
/// tears its rings down in the background), so the first statfs may see the former.
pub(crate) fn detach_if_stale(path: &Path) -> Result<bool> {
    if !matches!(rustix::fs::statfs(path), Err(rustix::io::Errno::NOTCONN | rustix::io::Errno::CONNABORTED)) {
        return Ok(false);
    }
    rustix::mount::unmount(path, rustix::mount::UnmountFlags::DETACH)
        .with_context(|| format!("detach the stale mount at {}", path.display()))?;
    Ok(true)
}

/// Whether `path` is the mount point of a live alignfs mount.
fn is_alignfs_mount(path: &Path) -> bool {
    let Ok(canonical) = std::fs::canonicalize(path) else { return false };
    let Ok(mountinfo) = std::fs::read_to_string("/proc/self/mountinfo") else { return false };
    mountinfo.lines().any(|line| {
        let fields: Vec<&str> = line.split(' ').collect();
        let source = line.split(" - ").nth(1).and_then(|rest| rest.split(' ').nth(1));
        fields.get(4) == Some(&canonical.to_string_lossy().as_ref()) && source.is_some_and(|s| s.starts_with("alignfs"))
    })
}

pub fn mount(args: &MountArgs) -> Result<()> {
    let parsed = parse_options(&args.options)?;
    if args.threads == 0 || args.threads > 64 {
        bail!("--threads must be between 1 and 64");
    }
    if args.flush_workers.is_some_and(|n| n == 0 || n > 64) {
        bail!("--flush-workers must be between 1 and 64");
    }
    if !(args.attr_ttl >= 0.0 && args.attr_ttl <= 3600.0) {
        bail!("--attr-ttl must be between 0 and 3600 seconds");
    }
    if !args.foreground && std::env::var_os(DAEMON_ENV).is_none() {
        return spawn_daemon(args);
    }
    let daemon = std::env::var_os(DAEMON_ENV).is_some();
    match serve(args, &parsed, daemon) {
        Ok(()) => Ok(()),
        Err(e) if daemon => {
            // The parent prints this; the log keeps a copy.
            println!("error: {}", holder::message(&e, holder_of));
            Err(e)
        }
        Err(e) => Err(e),
    }
}

/// Start `alignfs mount -f …` in the background and wait for it to report.
fn spawn_daemon(args: &MountArgs) -> Result<()> {
    let log_path = args.log.clone().unwrap_or_else(|| defaults::data_dir(args.devices.data_dir.as_deref()).join("mount.log"));
    if let Some(dir) = log_path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    }
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .with_context(|| format!("open log {}", log_path.display()))?;
    let exe = std::env::current_exe().context("find the alignfs executable")?;
    let mut command = Command::new(exe);
    command.args(crate::mount_helper::command_args()).env(DAEMON_ENV, "1").env(crate::logging::LOG_FILE_ENV, &log_path);
    if std::env::var_os("ALIGNFS_LOG").is_none() {
        command.env("ALIGNFS_LOG", "info");
    }
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    let mut child =
        command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::from(log)).spawn().context("start the alignfs daemon")?;
    let stdout = child.stdout.take().ok_or_else(|| anyhow!("daemon stdout missing"))?;
    for line in BufReader::new(stdout).lines() {
        let line = line.context("read the daemon's report")?;
        if line == READY {
            println!("mounted at {} (daemon pid {}, log {})", args.mountpoint.display(), child.id(), log_path.display());
            println!(
                "  use it like any directory; `alignfs stat {0}` shows the counters; `alignfs umount {0}` unmounts",
                args.mountpoint.display()
            );
            return Ok(());
        }
        if let Some(error) = line.strip_prefix("error: ") {
            let _ = child.wait();
            bail!("{error} (log: {})", log_path.display());
        }
        println!("{line}");
    }
    let status = child.wait().context("wait for the daemon")?;
    bail!("the daemon exited ({status}) before the mount was ready; see {}", log_path.display())
}

/// The kernel's cap on one FUSE request, in pages, system-wide.
const MAX_PAGES_LIMIT: &str = "/proc/sys/fs/fuse/max_pages_limit";

/// Raise `fs.fuse.max_pages_limit` so that a request can carry [`alignfs_fuse::MAX_WRITE`]
/// bytes. `Ok(Some(what changed))`; `Ok(None)` when nothing needed changing; `Err(why
/// not)` when the limit stays too low (not root, `--keep-fuse-limit`, an older kernel).
fn raise_fuse_request_limit(keep: bool) -> std::result::Result<Option<String>, String> {
    let Some(pages) = std::fs::read_to_string(MAX_PAGES_LIMIT).ok().and_then(|t| t.trim().parse::<u64>().ok()) else {
        return Ok(None);
    };
    // In 4 KiB pages: on a kernel with larger pages this asks for more than needed, which
    // only allows larger requests.
    let page = 4096;
    let wanted = u64::from(alignfs_fuse::MAX_WRITE) / page;
    if pages >= wanted {
        return Ok(None);
    }
    let low = format!("the kernel cuts writes into pieces of {} KiB (fs.fuse.max_pages_limit = {pages})", pages * page / 1024);
    if keep {
        return Err(format!("{low}; left so by --keep-fuse-limit"));
    }
    let mib = alignfs_fuse::MAX_WRITE >> 20;
    match std::fs::write(MAX_PAGES_LIMIT, format!("{wanted}\n")) {
        Ok(()) => Ok(Some(format!(
            "raised fs.fuse.max_pages_limit from {pages} to {wanted} pages (system-wide), so writes of up to {mib} MiB reach the volume whole; \
             --keep-fuse-limit leaves it"
        ))),
        Err(e) => Err(format!("{low}; raising it failed ({e}): `sysctl fs.fuse.max_pages_limit={wanted}` as root lets writes of up to {mib} MiB arrive whole")),
    }
}

/// What to tell a user whose `auto` mount fell back to /dev/fuse because the kernel has
/// FUSE over io_uring turned off; `None` where it has no such transport at all. The
/// parameter is off after every boot until root (or `scripts/setup.sh`) turns it on, and
/// the mount gives no other sign than its speed.
fn io_uring_off_note() -> Option<String> {
    let value = std::fs::read_to_string(IO_URING_PARAMETER).ok()?;
    (value.trim() != "Y").then(|| {
        format!(
            "requests go through /dev/fuse: this kernel has FUSE over io_uring, but {IO_URING_PARAMETER} is {}; \
             `echo Y > {IO_URING_PARAMETER}` as root (scripts/setup.sh does) makes later mounts use it \
             (a webproxy flow took 0.6x as long over it on the test machine; docs/FUSE.md, \"Transport\")",
            value.trim()
        )
    })
}

/// Open (formatting the default devices on first use), mount, and serve until unmounted.
fn serve(args: &MountArgs, parsed: &ParsedOptions, daemon: bool) -> Result<()> {
    let mountpoint = &args.mountpoint;
    if detach_if_stale(mountpoint)? {
        println!("detached a stale mount at {} (its daemon had died)", mountpoint.display());
    }
    if is_alignfs_mount(mountpoint) {
        bail!("{} is already an alignfs mount (`alignfs umount` it first)", mountpoint.display());
    }
    std::fs::create_dir_all(mountpoint).with_context(|| format!("create mount point {}", mountpoint.display()))?;
    let faults = args.inject_faults.then(|| Arc::new(FaultPlan::default()));
    let fill_on_close = alignfs::geometry::parse_size(&args.fill_on_close).context("--fill-on-close")?;
    let volume = open_volume(&args.devices, volume_options(args, parsed)?, faults.clone())?;
    let profile = volume.superblock().profile;
    if let Err(e) = profile.check_served_by(alignfs::profile::Personality::Files) {
        volume.close()?;
        return Err(e.into());
    }
    warn_unused_options(args, profile);
    let recovery = volume.recovery().clone();
    tracing::info!(
        "volume {} opened in {:?}: {} journal records replayed{}",
        volume.superblock().uuid_string(),
        recovery.duration,
        recovery.records_replayed,
        if recovery.clean { "" } else { " (it was not closed cleanly)" }
    );
    let options = FuseOptions {
        ttl: Duration::from_secs_f64(args.attr_ttl),
        cache: args.cache,
        threads: args.threads,
        transport: args.transport,
        mountpoint: std::fs::canonicalize(mountpoint).unwrap_or_else(|_| mountpoint.clone()),
        faults,
        fill_on_close,
    };
    let config = fuse_config(args, parsed, profile);
    // The kernel fixes a mount's request size when it mounts: raise the limit first.
    note_request_limit(raise_fuse_request_limit(args.keep_fuse_limit));
    let fs = AlignFs::new(volume, options);
    let link = fs.session_link();
    let report = fs.report_source();
    let mut session = fuser::Session::new(fs, mountpoint, &config).with_context(|| format!("mount at {}", mountpoint.display()))?;
    let transport = session.transport();
    if let Err(e) = args.transport.check(&transport) {
        // Dropping the session unmounts and closes the volume.
        drop(session);
        bail!("{e}");
    }
    if args.transport == Transport::Auto && !transport.io_uring() {
        if let Some(note) = io_uring_off_note() {
            tracing::info!("{note}");
            println!("{note}");
        }
    }
    link.attach(&session);
    // Stopped when the session ends, before the volume closes.
    let _metrics = args.metrics.as_deref().map(|addr| serve_metrics(addr, report)).transpose()?;
    unmount_on_signals(session.unmount_callable(), mountpoint.clone())?;
    tracing::info!(
        "mounted at {} (page cache: {}, {} request threads, transport: {})",
        mountpoint.display(),
        args.cache,
        args.threads,
        transport.summary()
    );
    announce(daemon, mountpoint)?;
    crate::systemd::notify("READY=1");
    // Under a systemd watchdog: ping it while a probe through the mount (a child process,
    // as `alignfs health` runs it) answers in time.
    let probed = mountpoint.clone();
    crate::systemd::keep_watchdog(move || crate::health::probe(&probed, Duration::from_secs(5)).is_ok());
    session.run().context("serve FUSE requests")?;
    tracing::info!("unmounted {}", mountpoint.display());
    Ok(())
}

/// Says what raising `fs.fuse.max_pages_limit` did: a change on stdout too, a reason it
/// could not in the log.
fn note_request_limit(raised: std::result::Result<Option<String>, String>) {
    match raised {
        Ok(Some(note)) => {
            tracing::info!("{note}");
            println!("{note}");
        }
        Ok(None) => {}
        Err(note) => tracing::info!("{note}"),
    }
}

/// `--metrics`: the daemon's report in the Prometheus text format, at `addr`.
fn serve_metrics(addr: &str, report: alignfs_fuse::ReportSource) -> Result<crate::metrics::MetricsServer> {
    let render = move || report.report().map(|r| crate::prometheus::render(&r)).unwrap_or_default();
    let server = crate::metrics::serve(addr, Arc::new(render))?;
    tracing::info!("metrics at http://{}/metrics", server.addr);
    Ok(server)
}

/// The volume options the mount's flags ask for.
fn volume_options(args: &MountArgs, parsed: &ParsedOptions) -> Result<VolumeOptions> {
    let defaults = VolumeOptions::default();
    let size = |given: &Option<String>, flag: &str, default: u64| -> Result<u64> {
        given.as_deref().map_or(Ok(default), |text| alignfs::geometry::parse_size(text).with_context(|| format!("--{flag}")))
    };
    let options = VolumeOptions {
        read_only: parsed.read_only,
        scrap_mem_bytes: size(&args.scrap_mem, "scrap-mem", defaults.scrap_mem_bytes)?,
        request_threshold: args
            .request_threshold
            .as_deref()
            .map(|t| alignfs::geometry::parse_size(t).context("--request-threshold"))
            .transpose()?,
        flush_workers: args.flush_workers.unwrap_or(defaults.flush_workers),
        commit_interval: args.commit_interval.map_or(Ok(defaults.commit_interval), commit_interval)?,
        byte_interface: !args.no_byte_interface,
        device_latency: device_latency(args.device_latency, args.device_write_buffer.as_deref())?,
        clean_cache_bytes: size(&args.clean_cache, "clean-cache", defaults.clean_cache_bytes)?,
        ..defaults
    };
    Ok(options)
}

/// The FUSE session's configuration: the mount options, threads and transport.
fn fuse_config(args: &MountArgs, parsed: &ParsedOptions, profile: Profile) -> Config {
    let mut config = Config::default();
    config.mount_options = parsed.mount.clone();
    config.mount_options.push(MountOption::FSName(format!("alignfs:{}", profile.name())));
    config.mount_options.push(MountOption::Subtype("alignfs".into()));
    config.acl = parsed.acl;
    config.n_threads = Some(args.threads);
    config.clone_fd = true;
    args.transport.configure(&mut config);
    args.ring_threads.configure(&mut config);
    config
}

/// SIGTERM, SIGINT and SIGHUP unmount, which ends the session and closes the volume.
pub(crate) fn unmount_on_signals(mut unmounter: fuser::SessionUnmounter, mountpoint: PathBuf) -> Result<()> {
    let mut signals =
        signal_hook::iterator::Signals::new([libc::SIGTERM, libc::SIGINT, libc::SIGHUP]).context("install signal handlers")?;
    std::thread::Builder::new().name("alignfs-signals".into()).spawn(move || {
        for signal in signals.forever() {
            tracing::info!("signal {signal}: unmounting {}", mountpoint.display());
            match unmounter.unmount() {
                Ok(()) => break,
                Err(e) => tracing::error!("unmount {}: {e} (still mounted)", mountpoint.display()),
            }
        }
    })?;
    Ok(())
}

/// Tell whoever started the mount that it serves: the parent waiting on a daemon's
/// pipe, or the terminal.
fn announce(daemon: bool, mountpoint: &Path) -> Result<()> {
    if daemon {
        println!("{READY}");
        std::io::stdout().flush()?;
        // The parent stops reading once ready; nothing more goes to that pipe.
        let null = std::fs::File::options().write(true).open("/dev/null")?;
        rustix::stdio::dup2_stdout(&null)?;
    } else {
        eprintln!("mounted at {}; Ctrl-C or `alignfs umount {0}` unmounts", mountpoint.display());
    }
    Ok(())
}

fn open_volume(devices: &DeviceArgs, options: VolumeOptions, faults: Option<Arc<FaultPlan>>) -> Result<alignfs::Volume> {
    let (fast, ssds) = devices.specs()?;
    let ssd = &ssds[0];
    let defaults = devices.fast.is_none() && devices.ssd.is_empty();
    // A superblock that records a fast tier's size (or none at all: a byte device's flash).
    let needs_fast = || ssd_superblock(&ssd.path).map_or(true, |sb| sb.is_none_or(|sb| sb.fast_bytes > 0));
    if defaults && !fast.path.exists() && !ssd.path.exists() {
        format_defaults(&fast, ssd)?;
    } else if defaults && !fast.path.exists() && needs_fast() {
        bail!(
            "the default fast tier {} is gone (tmpfs does not survive a reboot), and the SSD image {} cannot be read without it; \
             `alignfs mkfs --force` starts a new, empty volume",
            fast.path.display(),
            ssd.path.display()
        );
    }
    // A daemon that was just told to unmount may still be writing its checkpoint: wait
    // for it to let go of the devices rather than fail. Any other holder (a live mount,
    // a server, another program) is named at once.
    let started = Instant::now();
    let mut told = false;
    loop {
        let kv = devices.kv.as_deref();
        match open_paths_with_faults(&fast.path, &DeviceArgs::ssd_paths(&ssds), kv, options.clone(), devices.backend(), faults.clone()) {
            Err(e @ Error::InUse { holder, .. }) => {
                let holder = holder.and_then(holder_of);
                let leaving = matches!(holder, None | Some(Holder::Mount { mounted: false, .. }));
                if !leaving || started.elapsed() >= Duration::from_secs(60) {
                    return Err(anyhow!(e));
                }
                if !told {
                    if let Some(holder) = &holder {
                        println!("waiting for {holder} to let go of it");
                    }
                    told = true;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e @ Error::NotFormatted(_)) => bail!("{e}; format it with `alignfs mkfs`"),
            Ok(volume) if devices.fast.is_some() && !volume.superblock().profile.devices().names_fast() => {
                bail!("{} holds a {} volume, which has no fast tier; drop --fast", ssd.path.display(), volume.superblock().profile.name())
            }
            result => return Ok(result?),
        }
    }
}

/// The device's latency model from `--device-latency[=SCALE]` and `--device-write-buffer`.
pub fn device_latency(scale: Option<f64>, write_buffer: Option<&str>) -> Result<Option<LatencyModel>> {
    let Some(scale) = scale else { return Ok(None) };
    let model = LatencyModel::bytefs_table4_flash_scaled(scale).context("--device-latency")?;
    let write_buffer_bytes = write_buffer.map(|text| crate::byte_size("--device-write-buffer", text)).transpose()?.unwrap_or(0);
    Ok(Some(LatencyModel { write_buffer_bytes, ..model }))
}

fn commit_interval(seconds: f64) -> Result<std::time::Duration> {
    if !(0.0..=3600.0).contains(&seconds) {
        anyhow::bail!("--commit-interval {seconds}: give seconds from 0 (every namespace change durable on return) to 3600");
    }
    Ok(std::time::Duration::from_secs_f64(seconds))
}

/// Say so when an option was given that the volume's profile does not read (on stdout,
/// which the parent of a daemon relays until the mount is ready).
fn warn_unused_options(args: &MountArgs, profile: Profile) {
    let given = [
        (args.scrap_mem.is_some(), Tunable::ResidueMemory, "--scrap-mem"),
        (args.request_threshold.is_some(), Tunable::RequestThreshold, "--request-threshold"),
        (args.flush_workers.is_some(), Tunable::FlushWorkers, "--flush-workers"),
        (args.commit_interval.is_some(), Tunable::CommitInterval, "--commit-interval"),
        (args.no_byte_interface, Tunable::ByteInterface, "--no-byte-interface"),
        (args.device_latency.is_some(), Tunable::DeviceLatency, "--device-latency"),
        (args.device_write_buffer.is_some(), Tunable::DeviceLatency, "--device-write-buffer"),
        (args.clean_cache.is_some(), Tunable::CleanCache, "--clean-cache"),
    ];
    for (_, _, flag) in given.iter().filter(|(set, tunable, _)| *set && !profile.tunables().contains(tunable)) {
        println!("note: {flag} has no effect: profile {} does not use it", profile.name());
        tracing::warn!("{flag} has no effect: profile {} does not use it", profile.name());
    }
}

fn format_defaults(fast: &DeviceSpec, ssd: &DeviceSpec) -> Result<()> {
    let (sb, volume) = format_paths(Some(fast), std::slice::from_ref(ssd), None, &FormatOptions::default(), None)?;
    volume.close()?;
    println!(
        "formatted a new default volume {}: fast tier {} ({}), SSD image {} ({})",
        sb.uuid_string(),
        fast.path.display(),
        bytesize::ByteSize(fast.size.unwrap_or(0)),
        ssd.path.display(),
        bytesize::ByteSize(ssd.size.unwrap_or(0))
    );
    Ok(())
}

/// The live report of a mounted volume, read from the root's stats attribute.
pub fn live_report(mountpoint: &Path) -> Result<alignfs::stats::VolumeReport> {
    let mut buf = vec![0u8; 1 << 16];
    let n = rustix::fs::getxattr(mountpoint, STATS_XATTR, &mut buf).map_err(|e| match e {
        rustix::io::Errno::NOTCONN => {
            anyhow!("{}: the alignfs daemon is gone (stale mount); `alignfs umount` clears it", mountpoint.display())
        }
        rustix::io::Errno::NODATA | rustix::io::Errno::NOTSUP => anyhow!("{} is not the root of an alignfs mount", mountpoint.display()),
        e => anyhow!("{}: read {STATS_XATTR}: {e}", mountpoint.display()),
    })?;
    serde_json::from_slice(&buf[..n]).with_context(|| format!("{}: unreadable report", mountpoint.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_holder_that_is_no_mount_is_named_by_its_command() {
        match holder_of(std::process::id()) {
            Some(Holder::Other { pid, command }) => assert!(pid == std::process::id() && command.contains("alignfs")),
            other => panic!("{other:?}"),
        }
        assert_eq!(holder_of(u32::MAX), None);
    }

    #[test]
    fn mount_options_parse_and_reject_unknown() {
        let parsed = parse_options(&["allow_other".into(), "ro".into(), "noatime".into()]).unwrap();
        assert_eq!(parsed.acl, SessionACL::All);
        assert!(parsed.read_only);
        assert!(parsed.mount.contains(&MountOption::RO));
        assert!(parsed.mount.contains(&MountOption::DefaultPermissions));
        let err = parse_options(&["writeback_cache".into()]).err().unwrap();
        assert!(err.to_string().contains("writeback_cache"));
    }
}
