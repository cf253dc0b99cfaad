//! `alignfs health`: is a mount served? For supervisors (a GlusterFS brick watchdog,
//! systemd, a load balancer) that must take a dead or hung volume out of service.
//!
//! A mount whose daemon died answers every request with ENOTCONN at once; a hung daemon
//! does not answer at all. So each probe runs in a child process and counts as failed when
//! it has not answered within the timeout. Not a thread: once the daemon has read a
//! request, the kernel waits for its answer uninterruptibly, and a process cannot exit
//! before all its threads have. A stuck child is left behind, killed, to die when the
//! daemon answers or the mount is aborted.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
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
    /// Internal: run one probe in this process and print its answer for the parent.
    #[arg(long, hide = true)]
    probe_child: bool,
}

/// Exit status 0: the daemon answered; 1: it did not (the reason is printed).
pub fn run(args: &HealthArgs) -> Result<bool> {
    if args.probe_child {
        match probe_here(&args.mountpoint) {
            Ok(pid) => println!("ok {pid}"),
            Err(reason) => println!("err {reason:#}"),
        }
        return Ok(true);
    }
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
fn probe_here(mountpoint: &Path) -> Result<u32> {
    let report = mount::live_report(mountpoint)?;
    rustix::fs::statfs(mountpoint).map_err(|e| anyhow!("statfs: {e}"))?;
    report.daemon.map(|d| d.pid).ok_or_else(|| anyhow!("the report names no daemon"))
}

/// [`probe_here`] in a child process, given `timeout` to answer.
pub(crate) fn probe(mountpoint: &Path, timeout: Duration) -> Result<u32> {
    let exe = std::env::current_exe().map_err(|e| anyhow!("find this program to run the probe: {e}"))?;
    let mut child = Command::new(exe)
        .arg("health")
        .arg("--probe-child")
        .arg(mountpoint)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| anyhow!("start the probe: {e}"))?;
    let mut out = child.stdout.take().expect("stdout is piped");
    let (tx, rx) = mpsc::channel();
    // A pipe read is interruptible: this thread never holds up the exit.
    std::thread::spawn(move || {
        let mut answer = String::new();
        let _ = out.read_to_string(&mut answer);
        let _ = tx.send(answer);
    });
    let Ok(answer) = rx.recv_timeout(timeout) else {
        let _ = child.kill();
        return Err(anyhow!("the daemon did not answer within {:.1} s (hung?)", timeout.as_secs_f64()));
    };
    let _ = child.wait();
    match answer.trim_end().split_once(' ') {
        Some(("ok", pid)) => pid.parse().map_err(|_| anyhow!("the probe answered {answer:?}")),
        Some(("err", reason)) => Err(anyhow!("{reason}")),
        _ => Err(anyhow!("the probe exited without an answer")),
    }
}
