//! Who holds a device another command wants: the `alignfs` command a process runs, read
//! back from `/proc`, so that a refusal names the mount point or server rather than a pid.

use std::fmt;
use std::path::{Path, PathBuf};

use clap::Parser;

use crate::{Cli, Command};

/// A process holding a volume's device.
#[derive(Debug, PartialEq, Eq)]
pub enum Holder {
    /// `alignfs mount`: its mount point, and whether that is an alignfs mount right now
    /// (it is not while the daemon starts, or after an unmount while it writes its
    /// checkpoint).
    Mount { pid: u32, mountpoint: PathBuf, mounted: bool },
    /// `alignfs nbd` or `alignfs s3`.
    Server { pid: u32, command: &'static str },
    /// Any other process (another `alignfs` command, a program using the library).
    Other { pid: u32, command: String },
}

impl Holder {
    /// What `pid` runs; `None` once it has exited.
    pub fn of(pid: u32) -> Option<Holder> {
        let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        let args: Vec<String> = raw.split(|&b| b == 0).filter(|a| !a.is_empty()).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
        let cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).ok();
        Some(Holder::from_args(pid, &args, cwd.as_deref()))
    }

    fn from_args(pid: u32, args: &[String], cwd: Option<&Path>) -> Holder {
        let other = || Holder::Other { pid, command: args.join(" ") };
        let is_alignfs = args.first().is_some_and(|a| Path::new(a).file_name().is_some_and(|n| n == "alignfs"));
        if !is_alignfs {
            return other();
        }
        match Cli::try_parse_from(args).map(|cli| cli.command) {
            Ok(Command::Mount(mount)) => {
                let at = mount.mountpoint();
                let mountpoint = match cwd {
                    Some(cwd) if at.is_relative() => cwd.join(at),
                    _ => at.to_path_buf(),
                };
                let mounted = crate::mount::is_alignfs_mount(&mountpoint);
                Holder::Mount { pid, mountpoint, mounted }
            }
            Ok(Command::Nbd(_)) => Holder::Server { pid, command: "alignfs nbd" },
            Ok(Command::S3(_)) => Holder::Server { pid, command: "alignfs s3" },
            _ => other(),
        }
    }
}

impl fmt::Display for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Holder::Mount { pid, mountpoint, mounted: true } => write!(
                f,
                "the volume is mounted at {0} (daemon pid {pid}); `alignfs stat {0}` reads it live, `alignfs umount {0}` lets it go",
                mountpoint.display()
            ),
            Holder::Mount { pid, mountpoint, mounted: false } => {
                write!(f, "the mount daemon for {} (pid {pid}) holds the volume", mountpoint.display())
            }
            Holder::Server { pid, command } => write!(f, "`{command}` (pid {pid}) serves the volume; stop it first"),
            Holder::Other { pid, command } => write!(f, "process {pid} (`{command}`) has it open"),
        }
    }
}

/// `error` as a user reads it: its chain, and who holds the device when that is why it
/// failed.
pub fn message(error: &anyhow::Error) -> String {
    let text = format!("{error:#}");
    let held = error.chain().find_map(|cause| match cause.downcast_ref::<alignfs::Error>() {
        Some(alignfs::Error::InUse { holder: Some(pid), .. }) => Holder::of(*pid).map(|holder| (*pid, holder)),
        _ => None,
    });
    match held {
        Some((pid, holder)) => text.replacen(&format!("is in use by process {pid}"), &format!("is in use: {holder}"), 1),
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(text: &str) -> Vec<String> {
        text.split(' ').map(String::from).collect()
    }

    #[test]
    fn commands_are_read_back() {
        let cwd = Path::new("/srv");
        match Holder::from_args(7, &args("/usr/bin/alignfs mount --fast /f --ssd /s mnt/a"), Some(cwd)) {
            Holder::Mount { pid: 7, mountpoint, mounted: false } => assert_eq!(mountpoint, Path::new("/srv/mnt/a")),
            other => panic!("{other:?}"),
        }
        match Holder::from_args(7, &args("target/release/alignfs mount"), Some(cwd)) {
            Holder::Mount { mountpoint, .. } => assert_eq!(mountpoint, Path::new(crate::mount::DEFAULT_MOUNTPOINT)),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            Holder::from_args(8, &args("alignfs nbd --fast /f --ssd /s --listen 127.0.0.1:1"), None),
            Holder::Server { pid: 8, command: "alignfs nbd" }
        );
        assert_eq!(Holder::from_args(9, &args("alignfs s3 --ssd /s --keys /k"), None), Holder::Server { pid: 9, command: "alignfs s3" });
        assert_eq!(Holder::from_args(3, &args("python3 x.py"), None), Holder::Other { pid: 3, command: "python3 x.py".into() });
        assert!(matches!(Holder::from_args(3, &args("alignfs stat --fast /f"), None), Holder::Other { .. }));
        assert!(matches!(Holder::from_args(3, &args("alignfs mount --no-such-flag"), None), Holder::Other { .. }));
    }

    #[test]
    fn this_process_is_found() {
        assert!(matches!(Holder::of(std::process::id()), Some(Holder::Other { pid, .. }) if pid == std::process::id()));
        assert_eq!(Holder::of(u32::MAX), None);
    }
}
