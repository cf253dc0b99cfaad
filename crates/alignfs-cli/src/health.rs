//! `alignfs health`: is a mount served? For supervisors (a GlusterFS brick watchdog,
//! systemd, a load balancer) that must take a dead or hung volume out of service.
//!
//! A mount whose daemon died answers every request with ENOTCONN at once; a hung daemon
//! does not answer at all. So each probe runs on its own thread and counts as failed when
//! it has not answered within the timeout. A thread stuck in a FUSE request is killable,
//! so exiting the process never waits for it.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Result};
use clap::Args;

use crate::mount;

#[derive(Args)]
pub struct HealthArgs {
    /// The mount point to probe.
    #[arg(default_value = mount::DEFAULT_MOUNTPOINT)]
    mountpoint: PathBuf,
    /// Seconds a probe may take before the mount counts as hung.
    #[arg(long, default_value_t = 5.0)]
    timeout: f64,
    /// Probe every SECS seconds and return only when the mount fails (exit status 1).
    /// Without it, probe once.
    #[arg(long, value_name = "SECS")]
    watch: Option<f64>,
    /// Print nothing when healthy.
    #[arg(short, long)]
    quiet: bool,
}

/// Exit status 0: the daemon answered; 1: it did not (the reason is printed).
pub fn run(args: &HealthArgs) -> Result<bool> {
    let timeout = seconds(args.timeout, "--timeout")?;
    let interval = args.watch.map(|s| seconds(s, "--watch")).transpose()?;
    loop {
        let started = Instant::now();
        match probe(&args.mountpoint, timeout) {
            Ok(pid) if interval.is_none() => {
                if !args.quiet {
                    println!("{}: healthy (daemon {pid}, answered in {:.1} ms)", args.mountpoint.display(), ms(started));
                }
                return Ok(true);
            }
            Ok(_) => {}
            Err(reason) => {
                println!("{}: unhealthy: {reason:#}", args.mountpoint.display());
                return Ok(false);
            }
        }
        std::thread::sleep(interval.unwrap_or_default().saturating_sub(started.elapsed()));
    }
}

fn seconds(value: f64, flag: &str) -> Result<Duration> {
    if !(value > 0.0 && value <= 3600.0) {
        bail!("{flag} must be between 0 and 3600 seconds");
    }
    Ok(Duration::from_secs_f64(value))
}

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1e3
}

/// Both probes reach the daemon: the stats attribute (never cached by the kernel) names
/// the serving process, and statfs exercises the volume's space accounting.
fn probe(mountpoint: &Path, timeout: Duration) -> Result<u32> {
    let path = mountpoint.to_path_buf();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let answer = mount::live_report(&path).and_then(|report| {
            rustix::fs::statfs(&path).map_err(|e| anyhow!("statfs: {e}"))?;
            report.daemon.map(|d| d.pid).ok_or_else(|| anyhow!("the report names no daemon"))
        });
        let _ = tx.send(answer);
    });
    match rx.recv_timeout(timeout) {
        Ok(answer) => answer,
        Err(_) => Err(anyhow!("the daemon did not answer within {:.1} s (hung?)", timeout.as_secs_f64())),
    }
}
