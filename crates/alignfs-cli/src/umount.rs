//! `alignfs umount`: unmount, then wait for the daemon to write its checkpoint and exit.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;

use crate::mount::{detach_if_stale, live_report, DEFAULT_MOUNTPOINT};

#[derive(Args)]
pub struct UmountArgs {
    /// The mount point.
    #[arg(default_value = DEFAULT_MOUNTPOINT)]
    mountpoint: PathBuf,
    /// Seconds to wait for the daemon to write its checkpoint and exit.
    #[arg(long, default_value_t = 120)]
    timeout: u64,
}

pub fn umount(args: &UmountArgs) -> Result<()> {
    let mountpoint = &args.mountpoint;
    if detach_if_stale(mountpoint)? {
        println!("detached a stale mount at {}; its daemon had died, so mounting again replays the journal", mountpoint.display());
        return Ok(());
    }
    let pid = live_report(mountpoint)?.daemon.map(|d| d.pid);
    match rustix::mount::unmount(mountpoint, rustix::mount::UnmountFlags::empty()) {
        Ok(()) => {}
        Err(rustix::io::Errno::PERM) => {
            let status = Command::new("fusermount3").arg("-u").arg(mountpoint).status().context("run fusermount3 -u")?;
            if !status.success() {
                bail!("fusermount3 -u {} failed ({status})", mountpoint.display());
            }
        }
        Err(rustix::io::Errno::BUSY) => bail!("{} is busy: close the files and directories open on it, then retry", mountpoint.display()),
        Err(e) => bail!("unmount {}: {e}", mountpoint.display()),
    }
    if let Some(pid) = pid {
        wait_for_exit(pid, Duration::from_secs(args.timeout))?;
    }
    println!("unmounted {}", mountpoint.display());
    Ok(())
}

/// Whether `pid` is still running. A zombie waiting for its new parent to reap it has
/// finished, but only once its last thread is gone: a killed process's leader turns
/// zombie while its other threads may still be closing files and dropping locks.
fn is_running(pid: u32) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else { return false };
    let field = |name: &str| status.lines().find_map(|l| l.strip_prefix(name)).map(str::trim);
    let zombie = field("State:").is_some_and(|s| s.starts_with('Z') || s.starts_with('X'));
    !(zombie && field("Threads:") == Some("1"))
}

/// Wait for the daemon to finish its checkpoint and exit.
fn wait_for_exit(pid: u32, timeout: Duration) -> Result<()> {
    let start = Instant::now();
    let mut told = false;
    while is_running(pid) {
        if start.elapsed() > timeout {
            bail!("the daemon (pid {pid}) has not exited after {timeout:?}");
        }
        if !told && start.elapsed() > Duration::from_secs(1) {
            eprintln!("waiting for the daemon (pid {pid}) to write its checkpoint and exit…");
            told = true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_running_and_a_missing_one_is_not() {
        assert!(is_running(std::process::id()));
        assert!(!is_running(u32::MAX));
    }
}
