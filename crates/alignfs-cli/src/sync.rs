//! `alignfs sync`: make everything on a mount durable, as `syncfs(2)` would if the kernel
//! forwarded it to a FUSE daemon (it forwards it to virtiofs only). On a `scrap` mount
//! that writes back every file's scrap pages and journals the namespace changes still
//! waiting for an fsync or the commit interval; elsewhere it flushes the SSD.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{anyhow, Result};
use clap::Args;

use crate::mount::{live_report, DEFAULT_MOUNTPOINT};

#[derive(Args)]
pub struct SyncArgs {
    /// The mount point.
    #[arg(default_value = DEFAULT_MOUNTPOINT)]
    mountpoint: PathBuf,
}

pub fn run(args: &SyncArgs) -> Result<()> {
    let mountpoint = &args.mountpoint;
    // Says clearly when the path is not an alignfs mount or its daemon is gone.
    let waiting = live_report(mountpoint)?.usage.namespace_ops_waiting;
    let started = Instant::now();
    rustix::fs::setxattr(mountpoint, alignfs_fuse::SYNC_XATTR, b"1", rustix::fs::XattrFlags::empty())
        .map_err(|e| anyhow!("{}: sync: {e}", mountpoint.display()))?;
    println!(
        "{}: durable ({waiting} namespace operations were waiting) in {:.1} ms",
        mountpoint.display(),
        started.elapsed().as_secs_f64() * 1000.0
    );
    Ok(())
}
