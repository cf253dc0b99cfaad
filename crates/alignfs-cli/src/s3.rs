//! `alignfs s3`: serve an object store over S3 until SIGINT or SIGTERM, then close it
//! cleanly.

use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use alignfs::paths::{open_object_paths, ssd_superblock};
use alignfs::personality::ObjectStore;
use alignfs::profile::Personality;
use alignfs::VolumeOptions;
use alignfs_s3::{ConnectionLimits, Gateway, Limits, ServerConfig};
use anyhow::{bail, Context, Result};
use clap::Args;

use crate::DeviceArgs;

#[derive(Args)]
pub struct S3Args {
    #[command(flatten)]
    devices: DeviceArgs,
    /// TCP address to listen on (loopback unless you say otherwise).
    #[arg(long, value_name = "ADDR:PORT", default_value = "127.0.0.1:9000")]
    listen: String,
    /// The access keys accepted (SigV4): a file of `ACCESS_KEY SECRET_KEY` lines, readable
    /// by its owner alone.
    #[arg(long, value_name = "FILE", required_unless_present = "anonymous")]
    keys: Option<PathBuf>,
    /// Accept unsigned requests from anyone who can reach the address (tests on loopback).
    #[arg(long, conflicts_with = "keys")]
    anonymous: bool,
    /// Serve HTTPS with this certificate chain (PEM, the server's certificate first).
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert's certificate.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Listen beyond loopback without HTTPS or without keys: anyone who can reach the
    /// port can read, or read and change, the store.
    #[arg(long)]
    insecure_listen: bool,
    /// Serve read-only: every write gets AccessDenied.
    #[arg(long)]
    read_only: bool,
    /// Largest object a PUT, or a part an UploadPart, may carry.
    #[arg(long, value_name = "SIZE", default_value = "5G")]
    max_object_size: String,
    /// Memory for fragment pages: the blocks holding unaligned pieces not yet synced
    /// (NVStore's FP and DP). When they fill it, the oldest are synced.
    #[arg(long, value_name = "SIZE", default_value = "1G")]
    fragment_mem: String,
    /// Longest a client may take to send a request's head (and a kept-alive connection
    /// may wait for its next request); then the connection is closed.
    #[arg(long, value_name = "SECS", default_value_t = 30.0)]
    header_timeout: f64,
    /// Longest wait for the next piece of a request body; then the request fails with
    /// RequestTimeout and the connection is closed.
    #[arg(long, value_name = "SECS", default_value_t = 60.0)]
    body_timeout: f64,
    /// Connections served at once; more wait in the listen queue until one closes.
    #[arg(long, value_name = "N", default_value_t = 1024)]
    max_connections: usize,
    /// Memory for clean pages: copies of SSD blocks that reads, and unaligned writes
    /// turning them into dirty pages, find without the device (NVStore's CP); 0 keeps none.
    #[arg(long, value_name = "SIZE", default_value = "256M")]
    clean_cache: String,
    /// Serve Prometheus metrics at http://ADDR/metrics (e.g. 127.0.0.1:9464): the
    /// volume's counters and space as `alignfs stat --prometheus` prints them.
    /// docs/OPERATING.md.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<String>,
}

pub fn run(args: &S3Args) -> Result<()> {
    let (_, ssds) = args.devices.specs()?;
    let ssd = &ssds[0].path;
    let Some(superblock) = ssd_superblock(ssd).ok().flatten() else {
        bail!("{} holds no alignfs volume; format one with `alignfs mkfs --profile nvstore`", ssd.display());
    };
    let profile = superblock.profile;
    if let Err(e) = profile.check_served_by(Personality::Objects) {
        bail!("{e}, or format one with `alignfs mkfs --profile nvstore`");
    }
    let missing = match (&args.tls_cert, args.anonymous) {
        (None, true) => Some("it would serve plain HTTP to anonymous clients"),
        (None, false) => Some("it would serve plain HTTP (keys and data readable on the wire)"),
        (Some(_), true) => Some("it would serve anonymous clients"),
        (Some(_), false) => None,
    };
    crate::exposure::check(&args.listen, missing, "Give --tls-cert FILE --tls-key FILE and --keys FILE", args.insecure_listen)?;
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(alignfs_s3::load_tls(cert, key).map_err(|e| anyhow::anyhow!("--tls-cert/--tls-key: {e}"))?),
        _ => None,
    };
    let auth = match &args.keys {
        Some(path) => Some(alignfs_s3::load_keys(path).map_err(anyhow::Error::msg)?),
        None => None,
    };
    let max_object_bytes = alignfs::geometry::parse_size(&args.max_object_size).context("--max-object-size")?;
    let limits = Limits { max_object_bytes, ..Limits::default() };
    let connections = connection_limits(args)?;
    let listener = TcpListener::bind(&args.listen).with_context(|| format!("listen on {}", args.listen))?;
    let options = VolumeOptions {
        read_only: args.read_only,
        scrap_mem_bytes: alignfs::geometry::parse_size(&args.fragment_mem).context("--fragment-mem")?,
        clean_cache_bytes: alignfs::geometry::parse_size(&args.clean_cache).context("--clean-cache")?,
        ..VolumeOptions::default()
    };
    let store = Arc::new(open_object_paths(ssd, args.devices.kv.as_deref(), options, args.devices.backend())?);
    let gateway = Gateway::new(Arc::clone(&store), limits)?;
    let request_stats = Arc::new(alignfs_s3::RequestStats::default());
    let metrics = match &args.metrics {
        Some(addr) => {
            let metrics = crate::metrics::serve(addr, metrics_render(Arc::clone(&store), Arc::clone(&request_stats)))?;
            println!("metrics at http://{}/metrics", metrics.addr);
            Some(metrics)
        }
        None => None,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("start the async runtime")?;
    println!(
        "serving alignfs {} object store {} on {}://{} ({}{})",
        profile.name(),
        superblock.uuid_string(),
        if tls.is_some() { "https" } else { "http" },
        listener.local_addr()?,
        if args.anonymous { "anonymous requests" } else { "SigV4, keys from the key file" },
        if args.read_only { ", read-only" } else { "" }
    );
    // The handlers are in place before systemd hears that the gateway is ready (it may
    // stop it at once).
    let stop_signals = stop_signals(&runtime);
    crate::systemd::notify("READY=1");
    let shutdown = async move {
        let [mut interrupt, mut term, mut hangup] = stop_signals;
        tokio::select! {
            _ = arrives(interrupt.as_mut()) => {}
            _ = arrives(term.as_mut()) => {}
            _ = arrives(hangup.as_mut()) => {}
        }
        println!("stopping: finishing requests in progress, then closing the store");
    };
    runtime.block_on(alignfs_s3::serve(gateway, ServerConfig { listener, tls, auth, connections, stats: request_stats }, shutdown))?;
    // Bodies still streaming hold the store; the runtime's end drops them.
    drop(runtime);
    // The endpoint holds the store: it stops first.
    drop(metrics);
    let store = Arc::try_unwrap(store).map_err(|_| anyhow::anyhow!("a request still holds the store"))?;
    store.close()?;
    println!("closed cleanly");
    Ok(())
}

/// The connection limits from `--header-timeout`, `--body-timeout` and `--max-connections`.
fn connection_limits(args: &S3Args) -> Result<ConnectionLimits> {
    let seconds = |value: f64, flag: &str| -> Result<Duration> {
        if !(value > 0.0 && value <= 86_400.0) {
            bail!("--{flag} must be more than 0 and at most 86400 seconds");
        }
        Ok(Duration::from_secs_f64(value))
    };
    if !(1..=1_000_000).contains(&args.max_connections) {
        bail!("--max-connections must be between 1 and 1000000");
    }
    Ok(ConnectionLimits {
        header_timeout: seconds(args.header_timeout, "header-timeout")?,
        body_idle_timeout: seconds(args.body_timeout, "body-timeout")?,
        max_connections: args.max_connections,
    })
}

/// What the metrics endpoint serves: the store's report, with the gateway's requests as
/// the daemon's part, and its error counts.
fn metrics_render(store: Arc<ObjectStore>, stats: Arc<alignfs_s3::RequestStats>) -> crate::metrics::Render {
    let started = std::time::Instant::now();
    Arc::new(move || {
        let (client, server) = stats.errors();
        crate::prometheus::render_server(store.volume().report(), "S3", started, stats.latency_by_operation())
            + &crate::prometheus::counter("alignfs_s3_client_errors_total", "requests answered 4xx", client)
            + &crate::prometheus::counter("alignfs_s3_server_errors_total", "requests answered 5xx", server)
            + &crate::prometheus::counter(
                "alignfs_s3_tls_handshake_failures_total",
                "connections whose TLS handshake failed or timed out",
                stats.tls_handshake_failures(),
            )
    })
}

/// The signals that stop the gateway, caught from now on. SIGHUP too: its default action
/// would end the gateway without closing the store.
fn stop_signals(runtime: &tokio::runtime::Runtime) -> [Option<tokio::signal::unix::Signal>; 3] {
    use tokio::signal::unix::{signal, SignalKind};
    let _runtime = runtime.enter();
    [SignalKind::interrupt(), SignalKind::terminate(), SignalKind::hangup()].map(|kind| signal(kind).ok())
}

/// Waits for a signal, or forever where its handler could not be installed.
async fn arrives(signal: Option<&mut tokio::signal::unix::Signal>) {
    match signal {
        Some(signal) => {
            signal.recv().await;
        }
        None => std::future::pending().await,
    }
}
