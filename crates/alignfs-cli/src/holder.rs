//! Who holds a device another command wants: the process's command line, read back from
//! `/proc`, so that a refusal names the mount point or server rather than a pid. What a
//! command's arguments mean is its own module's business (`mount::holder_of`).

use std::fmt;
use std::path::{Path, PathBuf};

/// A running process, as `/proc` shows it.
#[derive(Debug)]
pub struct Process {
    args: Vec<String>,
    cwd: Option<PathBuf>,
}

impl Process {
    /// `None` once it has exited.
    pub fn of(pid: u32) -> Option<Process> {
        let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        let args = raw.split(|&b| b == 0).filter(|a| !a.is_empty()).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
        Some(Process { args, cwd: std::fs::read_link(format!("/proc/{pid}/cwd")).ok() })
    }

    #[cfg(test)]
    fn from_parts(command: &str, cwd: Option<&Path>) -> Process {
        Process { args: command.split(' ').map(String::from).collect(), cwd: cwd.map(Path::to_path_buf) }
    }

    /// The `alignfs` command it runs (`mount`, `nbd`, …) and that command's arguments;
    /// `None` for another program.
    pub fn alignfs_command(&self) -> Option<(&str, &[String])> {
        let program = self.args.first()?;
        if Path::new(program).file_name()? != "alignfs" {
            return None;
        }
        Some((self.args.get(1)?.as_str(), self.args.get(2..).unwrap_or_default()))
    }

    /// `path` as the process reads it (relative to its working directory).
    pub fn resolve(&self, path: &Path) -> PathBuf {
        match &self.cwd {
            Some(cwd) if path.is_relative() => cwd.join(path),
            _ => path.to_path_buf(),
        }
    }

    pub fn command_line(&self) -> String {
        self.args.join(" ")
    }
}

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

/// `error` as a user reads it: its chain, and who holds the device (told by `holder_of`)
/// when that is why it failed.
pub fn message(error: &anyhow::Error, holder_of: impl Fn(u32) -> Option<Holder>) -> String {
    let text = format!("{error:#}");
    let held = error.chain().find_map(|cause| match cause.downcast_ref::<alignfs::Error>() {
        Some(alignfs::Error::InUse { holder: Some(pid), .. }) => holder_of(*pid).map(|holder| (*pid, holder)),
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

    #[test]
    fn command_lines_are_read_back() {
        let cwd = Path::new("/srv");
        let mount = Process::from_parts("/usr/bin/alignfs mount --fast /f mnt/a", Some(cwd));
        let (command, args) = mount.alignfs_command().unwrap();
        assert_eq!((command, args.len()), ("mount", 3));
        assert_eq!(mount.resolve(Path::new("mnt/a")), Path::new("/srv/mnt/a"));
        assert_eq!(mount.resolve(Path::new("/abs")), Path::new("/abs"));
        assert!(Process::from_parts("python3 x.py", None).alignfs_command().is_none());
        assert!(Process::from_parts("alignfs", None).alignfs_command().is_none());
        assert!(Process::of(std::process::id()).unwrap().command_line().contains("alignfs"));
        assert!(Process::of(u32::MAX).is_none());
    }

    #[test]
    fn an_in_use_error_names_its_holder() {
        let error = anyhow::Error::new(alignfs::Error::InUse { path: "/d".into(), holder: Some(42) });
        let holder = |pid| Some(Holder::Server { pid, command: "alignfs nbd" });
        assert_eq!(message(&error, holder), "/d is in use: `alignfs nbd` (pid 42) serves the volume; stop it first");
        assert_eq!(message(&error, |_| None), "/d is in use by process 42");
    }
}
