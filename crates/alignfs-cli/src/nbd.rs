//! `alignfs nbd`: serve a block volume over NBD until SIGINT or SIGTERM, then close it
//! cleanly (checkpoint, SSD flush).

use std::net::TcpListener;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use alignfs::paths::{open_block_paths, ssd_superblock};
use alignfs::profile::{Personality, Tunable};
use alignfs::Profile;
use alignfs::VolumeOptions;
use alignfs_nbd::{ExportEntry, Server, ServerConfig, ServerStats, TlsConfig, TlsPolicy};
use anyhow::{bail, Context, Result};
use clap::Args;

use crate::DeviceArgs;

#[derive(Args)]
pub struct NbdArgs {
    #[command(flatten)]
    devices: DeviceArgs,
    /// TCP address to listen on (loopback unless you say otherwise).
    #[arg(long, value_name = "ADDR:PORT", default_value = "127.0.0.1:10809")]
    listen: String,
    /// TLS (NBD_OPT_STARTTLS): `off`, `on` (offered; plaintext clients are served too) or
    /// `require` [default: require when --tls-certificates or --tls-psk is given, else off].
    #[arg(long, value_enum, value_name = "MODE")]
    tls: Option<TlsMode>,
    /// X.509 credentials: a directory holding server-cert.pem, server-key.pem and
    /// ca-cert.pem, laid out as qemu-nbd and nbdkit take them.
    #[arg(long, value_name = "DIR", conflicts_with = "tls_psk")]
    tls_certificates: Option<PathBuf>,
    /// TLS-PSK credentials: a private file of `identity:hexkey` lines (psktool's format).
    #[arg(long, value_name = "FILE")]
    tls_psk: Option<PathBuf>,
    /// Serve only clients whose certificate ca-cert.pem signed (X.509).
    #[arg(long, requires = "tls_certificates")]
    tls_verify_peer: bool,
    /// Listen beyond loopback without requiring TLS: anyone who can reach the port can
    /// read and change the volume.
    #[arg(long)]
    insecure_listen: bool,
    /// Also listen on this Unix socket (`nbd+unix:///NAME?socket=PATH`).
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
    /// Listen on the Unix socket only, not on TCP.
    #[arg(long, requires = "socket")]
    no_tcp: bool,
    /// The export's name (clients that name none get it too).
    #[arg(long, default_value = "alignfs")]
    export: String,
    /// Serve read-only: writes, trims and zeroing get EPERM.
    #[arg(long)]
    read_only: bool,
    /// Threads serving each connection's requests [default: one per CPU, 2 to 16].
    #[arg(long)]
    workers: Option<usize>,
    /// Serve Prometheus metrics at http://ADDR/metrics (e.g. 127.0.0.1:9464): the
    /// volume's counters and space as `alignfs stat --prometheus` prints them, with the
    /// NBD server's connection and request counts.
    /// docs/OPERATING.md.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<String>,
    /// Writes below this size go whole to the NVM buffer (uhs default 128K).
    #[arg(long, value_name = "SIZE")]
    request_threshold: Option<String>,
    /// Bytes of one NVM buffer segment (default 4M).
    #[arg(long, value_name = "SIZE")]
    segment_size: Option<String>,
    /// Run without the NVM buffer (the paper's UHS-NB, for comparison).
    #[arg(long)]
    no_nvm_buffer: bool,
}

/// `--tls`'s values.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum TlsMode {
    Off,
    On,
    Require,
}

pub fn run(args: &NbdArgs) -> Result<()> {
    let tls = tls_config(args)?;
    if !args.no_tcp {
        let missing = match &tls {
            Some(tls) if tls.policy == TlsPolicy::Require => None,
            Some(_) => Some("--tls on still serves plaintext clients"),
            None => Some("TLS is off"),
        };
        let how = "Give --tls-certificates DIR or --tls-psk FILE (then --tls require is the default)";
        crate::exposure::check(&args.listen, missing, how, args.insecure_listen)?;
    }
    let (fast, ssds) = args.devices.specs()?;
    let Some(superblock) = ssd_superblock(&ssds[0].path).ok().flatten() else {
        bail!("{} holds no alignfs volume; format one with `alignfs mkfs --profile uhs`", ssds[0].path.display());
    };
    let profile = superblock.profile;
    profile.check_served_by(Personality::Block)?;
    let options = volume_options(args, profile)?;
    let ssd_paths: Vec<PathBuf> = ssds.iter().map(|s| s.path.clone()).collect();
    let volume = Arc::new(open_block_paths(&fast.path, &ssd_paths, options, args.devices.backend())?);
    let (_, _, residue) = volume.volume().describe_devices();
    let description = format!("alignfs {} volume {}", profile.name(), superblock.uuid_string());
    let mut config = ServerConfig::new(vec![ExportEntry {
        name: args.export.clone(),
        description,
        export: Arc::clone(&volume) as Arc<dyn alignfs_nbd::Export>,
        read_only: args.read_only,
    }]);
    config.workers_per_connection = args.workers.unwrap_or_else(alignfs_nbd::default_workers).max(1);
    let tls_said =
        tls.as_ref().map(|tls| format!(", TLS {} ({})", tls.kind, if tls.policy == TlsPolicy::Require { "required" } else { "offered" }));
    config.tls = tls;
    let server = Arc::new(Server::new(config));
    let metrics = match &args.metrics {
        Some(addr) => {
            let (volume, server, started) = (Arc::clone(&volume), Arc::clone(&server), std::time::Instant::now());
            let render = move || {
                let report = volume.volume().report();
                crate::prometheus::render_server(report, "NBD", started, server.stats.latency_by_command()) + &nbd_metrics(&server.stats)
            };
            let metrics = crate::metrics::serve(addr, Arc::new(render))?;
            println!("metrics at http://{}/metrics", metrics.addr);
            Some(metrics)
        }
        None => None,
    };
    listen(&server, args, tls_said.as_deref().unwrap_or(""))?;
    println!(
        "  {} bytes in {}-byte sectors, {} NVM ranges; residue: {residue}{}",
        volume.size(),
        volume.layout().sector_bytes,
        volume.layout().nvm_ranges.len(),
        if args.no_nvm_buffer { " (not used: --no-nvm-buffer)" } else { "" }
    );
    // The handlers are in place before systemd hears that the server is ready.
    let stop = stop_on_signals()?;
    crate::systemd::notify("READY=1");
    while !stop.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(100));
    }
    println!("stopping: finishing requests in progress, then closing the volume");
    server.shutdown();
    print_served(&server.stats);
    // The endpoint holds the volume and the server: it stops first.
    drop(metrics);
    drop(server);
    if let Some(path) = &args.socket {
        let _ = std::fs::remove_file(path);
    }
    let volume = Arc::try_unwrap(volume).map_err(|_| anyhow::anyhow!("a connection still holds the volume"))?;
    volume.close()?;
    println!("closed cleanly");
    Ok(())
}

/// The volume's options from the command line; a flag the profile does not use is
/// noted, not refused.
fn volume_options(args: &NbdArgs, profile: Profile) -> Result<VolumeOptions> {
    let size = |text: &Option<String>, flag: &str| -> Result<Option<u64>> {
        text.as_deref().map(|t| alignfs::geometry::parse_size(t).with_context(|| format!("--{flag}"))).transpose()
    };
    let defaults = VolumeOptions::default();
    for (given, tunable, flag) in [
        (args.request_threshold.is_some(), Tunable::RequestThreshold, "--request-threshold"),
        (args.segment_size.is_some(), Tunable::SegmentSize, "--segment-size"),
        (args.no_nvm_buffer, Tunable::NvmBuffer, "--no-nvm-buffer"),
    ] {
        if given && !profile.tunables().contains(&tunable) {
            println!("note: {flag} has no effect: profile {} does not use it", profile.name());
        }
    }
    Ok(VolumeOptions {
        read_only: args.read_only,
        request_threshold: size(&args.request_threshold, "request-threshold")?,
        segment_bytes: size(&args.segment_size, "segment-size")?.unwrap_or(defaults.segment_bytes),
        nvm_buffer: !args.no_nvm_buffer,
        ..defaults
    })
}

/// The TLS settings from `--tls`, `--tls-certificates`, `--tls-psk` and
/// `--tls-verify-peer`; `None`: TLS off.
fn tls_config(args: &NbdArgs) -> Result<Option<TlsConfig>> {
    let has_credentials = args.tls_certificates.is_some() || args.tls_psk.is_some();
    let policy = match args.tls.unwrap_or(if has_credentials { TlsMode::Require } else { TlsMode::Off }) {
        TlsMode::Off if has_credentials => {
            bail!("--tls off with TLS credentials: drop --tls-certificates/--tls-psk, or choose --tls on or require")
        }
        TlsMode::Off => return Ok(None),
        _ if !has_credentials => bail!("--tls on and --tls require need credentials: --tls-certificates DIR or --tls-psk FILE"),
        TlsMode::On => TlsPolicy::On,
        TlsMode::Require => TlsPolicy::Require,
    };
    let config = match (&args.tls_certificates, &args.tls_psk) {
        (Some(dir), _) => TlsConfig::certificates(dir, args.tls_verify_peer, policy),
        (None, Some(file)) => TlsConfig::psk(file, policy),
        (None, None) => unreachable!("credentials were checked above"),
    };
    config.map(Some).map_err(|e| anyhow::anyhow!("--tls: {e}"))
}

/// Listens on TCP unless `--no-tcp`, and on the Unix socket if one is named.
fn listen(server: &Server, args: &NbdArgs, tls_said: &str) -> Result<()> {
    if !args.no_tcp {
        let listener = TcpListener::bind(&args.listen).with_context(|| format!("listen on {}", args.listen))?;
        server.listen_tcp(listener)?;
        let scheme = if tls_said.is_empty() { "nbd" } else { "nbds" };
        println!("serving export {:?} on {scheme}://{}/{}{tls_said}", args.export, args.listen, args.export);
    }
    if let Some(path) = &args.socket {
        if path.exists() {
            std::fs::remove_file(path).with_context(|| format!("remove the stale socket {}", path.display()))?;
        }
        let listener = UnixListener::bind(path).with_context(|| format!("listen on {}", path.display()))?;
        server.listen_unix(listener)?;
        let scheme = if tls_said.is_empty() { "nbd+unix" } else { "nbds+unix" };
        println!("serving export {:?} on {scheme}:///{}?socket={}{tls_said}", args.export, args.export, path.display());
    }
    Ok(())
}

/// A flag that SIGINT, SIGTERM or SIGHUP sets.
fn stop_on_signals() -> Result<Arc<AtomicBool>> {
    let stop = Arc::new(AtomicBool::new(false));
    // SIGHUP too: its default action would end the server without closing the volume.
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM, signal_hook::consts::SIGHUP] {
        signal_hook::flag::register(signal, Arc::clone(&stop)).context("install the signal handler")?;
    }
    Ok(stop)
}

fn print_served(stats: &ServerStats) {
    let count = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
    println!(
        "served {} requests on {} connections ({} over TLS): {} by a connection's reader without a hand-off, {} answered with an error; {} handshakes refused",
        count(&stats.requests),
        count(&stats.connections),
        count(&stats.tls_sessions),
        count(&stats.served_by_reader),
        count(&stats.errors_returned),
        count(&stats.refused_handshakes)
    );
}

/// The NBD server's own counters in the Prometheus text format.
fn nbd_metrics(stats: &ServerStats) -> String {
    let count = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
    [
        ("alignfs_nbd_connections_total", "client connections accepted", count(&stats.connections)),
        ("alignfs_nbd_requests_total", "transmission requests served", count(&stats.requests)),
        (
            "alignfs_nbd_requests_served_by_reader_total",
            "requests a connection's reader served without a hand-off",
            count(&stats.served_by_reader),
        ),
        ("alignfs_nbd_request_errors_total", "requests answered with an error", count(&stats.errors_returned)),
        ("alignfs_nbd_refused_handshakes_total", "handshakes refused", count(&stats.refused_handshakes)),
        ("alignfs_nbd_tls_sessions_total", "connections that completed a TLS handshake", count(&stats.tls_sessions)),
    ]
    .into_iter()
    .map(|(name, help, value)| crate::prometheus::counter(name, help, value))
    .collect()
}
