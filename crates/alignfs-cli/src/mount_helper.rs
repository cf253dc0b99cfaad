//! `mount -t fuse.alignfs SPEC DIR -o OPTIONS`, and so `/etc/fstab` lines of type
//! `fuse.alignfs`. mount(8) runs the helper `/sbin/mount.fuse.alignfs` (a link to this
//! binary, made by `scripts/install.sh`) as `mount.fuse.alignfs SPEC DIR [-sfnv] [-o
//! OPTIONS]`; this turns that into the `alignfs mount` command line it means.
//!
//! SPEC is the volume's SSD (`alignfs` or `none` for the default devices). Each option
//! is one of: a kernel mount option `alignfs mount -o` takes; a flag of `alignfs mount`
//! spelt without its dashes (`fast=/dev/shm/alignfs/fast`, `scrap_mem=2G`,
//! `inject_faults`); or an option only mount(8) and systemd read (`defaults`, `nofail`,
//! `_netdev`, `noauto`, `x-systemd.*` …), which is dropped. Anything else is refused.

use std::path::Path;

use anyhow::{bail, Result};
use clap::{CommandFactory, Parser};

use crate::Cli;

/// The helper's name; mount(8) finds it in /sbin for file systems of type `fuse.alignfs`.
pub const HELPER: &str = "mount.fuse.alignfs";

/// Options only mount(8), fstab and systemd act on; they never reach a file system.
const USERSPACE_ONLY: &[&str] = &["defaults", "auto", "noauto", "nofail", "_netdev", "user", "users", "nouser", "owner", "group"];

/// Kernel options that say what is already the default.
const DEFAULT_KERNEL_OPTIONS: &[&str] = &["async", "dev", "suid", "exec"];

/// Kernel options `alignfs mount -o` takes (see `mount::parse_options`).
const KERNEL_OPTIONS: &[&str] =
    &["allow_other", "allow_root", "ro", "rw", "default_permissions", "noatime", "nodev", "nosuid", "noexec", "dirsync", "sync"];

/// mount(8)'s exit status for a usage error, which its helpers return too.
pub const EXIT_MOUNT_USAGE: u8 = 1;

/// Under the mount helper, the `alignfs mount` arguments its own translate to.
static HELPER_COMMAND: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();

/// The arguments this process was started with, as `alignfs` would take them: under the
/// mount helper, the `alignfs mount` command it runs (for the daemon a mount starts).
pub(crate) fn command_args() -> Vec<std::ffi::OsString> {
    match HELPER_COMMAND.get() {
        Some(words) => words.iter().map(Into::into).collect(),
        None => std::env::args_os().skip(1).collect(),
    }
}

/// The command line mount(8) means when it runs this binary as its helper for
/// `fuse.alignfs`; `None` when run as `alignfs`.
pub fn as_mount_helper() -> Result<Option<Cli>> {
    let mut args = std::env::args_os();
    let called = args.next().map(|a| Path::new(&a).file_name().unwrap_or_default().to_string_lossy().into_owned());
    if called.as_deref() != Some(HELPER) {
        return Ok(None);
    }
    let args: Vec<String> =
        args.map(|a| a.into_string().map_err(|a| anyhow::anyhow!("argument {a:?} is not UTF-8"))).collect::<Result<_>>()?;
    let command = Cli::command();
    let mount = command.find_subcommand("mount").expect("alignfs has a mount command");
    match translate(&args, mount)? {
        Request::Fake => std::process::exit(0),
        Request::Mount(words) => {
            let words: Vec<String> = ["mount".to_string()].into_iter().chain(words).collect();
            let cli = Cli::try_parse_from(["alignfs".to_string()].iter().chain(&words))?;
            HELPER_COMMAND.set(words).expect("translated once");
            Ok(Some(cli))
        }
    }
}

/// What the helper was asked to do.
#[derive(Debug, PartialEq, Eq)]
pub enum Request {
    /// Mount: the `alignfs mount` arguments (without the program name).
    Mount(Vec<String>),
    /// `-f`: go through the motions without mounting (mount(8)'s "fake" mode).
    Fake,
}

/// Translates the helper's arguments (after its name). `mount` is the `alignfs mount`
/// command, whose flags the options may name.
pub fn translate(args: &[String], mount: &clap::Command) -> Result<Request> {
    let mut positional = Vec::new();
    let mut options = Vec::new();
    let mut fake = false;
    let mut words = args.iter();
    while let Some(word) = words.next() {
        match word.as_str() {
            "-o" => match words.next() {
                Some(list) => options.extend(list.split(',').filter(|o| !o.is_empty()).map(str::to_string)),
                None => bail!("-o needs a list of options"),
            },
            // Type given again by mount(8) (`-t fuse.alignfs`): the helper's own.
            "-t" => {
                words.next();
            }
            "-f" => fake = true,
            // Sloppy, no mtab, verbose: nothing for a FUSE mount to change.
            "-s" | "-n" | "-v" => {}
            "-N" => bail!("-N (mount in another namespace) is not supported; run mount in that namespace instead"),
            flag if flag.starts_with('-') => bail!("unknown mount helper flag {flag}"),
            _ => positional.push(word.clone()),
        }
    }
    let [spec, dir] = &positional[..] else {
        bail!("usage: {HELPER} SPEC DIR [-o OPTIONS] (SPEC: the SSD, or `alignfs` for the default devices)");
    };
    if fake {
        return Ok(Request::Fake);
    }
    let mut command = Vec::new();
    if spec != "alignfs" && spec != "none" {
        command.extend(["--ssd".to_string(), spec.clone()]);
    }
    let mut kernel = Vec::new();
    for option in &options {
        let (key, value) = match option.split_once('=') {
            Some((key, value)) => (key, Some(value)),
            None => (option.as_str(), None),
        };
        if USERSPACE_ONLY.contains(&key) || key.starts_with("x-") || key == "comment" || DEFAULT_KERNEL_OPTIONS.contains(&key) {
            continue;
        }
        if key == "remount" {
            bail!("remount is not supported: unmount and mount again");
        }
        if value.is_none() && KERNEL_OPTIONS.contains(&key) {
            kernel.push(key.to_string());
            continue;
        }
        command.extend(flag_for(key, value, mount)?);
    }
    if !kernel.is_empty() {
        command.extend(["-o".to_string(), kernel.join(",")]);
    }
    command.push(dir.clone());
    Ok(Request::Mount(command))
}

/// The `alignfs mount` flag an option names: `key=value` for a flag that takes a value,
/// `key` alone for a switch.
fn flag_for(key: &str, value: Option<&str>, mount: &clap::Command) -> Result<Vec<String>> {
    let long = key.replace('_', "-");
    let Some(arg) = mount.get_arguments().find(|a| a.get_long() == Some(long.as_str())) else {
        bail!("unknown mount option {key:?}: see `alignfs mount --help` (flags are written without dashes, e.g. fast=PATH)");
    };
    if long == "foreground" || long == "help" {
        bail!("mount option {key:?} cannot be used through mount(8), which waits for the helper to return");
    }
    let takes_value = arg.get_action().takes_values();
    match (takes_value, value) {
        (true, Some(value)) => Ok(vec![format!("--{long}"), value.to_string()]),
        (true, None) => bail!("mount option {key} needs a value: {key}=..."),
        (false, None) => Ok(vec![format!("--{long}")]),
        (false, Some(_)) => bail!("mount option {key} takes no value"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{Arg, ArgAction};

    fn mount_command() -> clap::Command {
        clap::Command::new("mount")
            .arg(Arg::new("fast").long("fast"))
            .arg(Arg::new("ssd").long("ssd").action(ArgAction::Append))
            .arg(Arg::new("scrap_mem").long("scrap-mem"))
            .arg(Arg::new("inject_faults").long("inject-faults").action(ArgAction::SetTrue))
            .arg(Arg::new("foreground").long("foreground").action(ArgAction::SetTrue))
    }

    fn words(text: &str) -> Vec<String> {
        text.split_whitespace().map(str::to_string).collect()
    }

    fn translated(text: &str) -> Result<Request> {
        translate(&words(text), &mount_command())
    }

    #[test]
    fn an_fstab_line_becomes_the_mount_command() {
        let request = translated(
            "/var/tmp/ssd.img /mnt/a -o rw,fast=/dev/shm/f,nofail,_netdev,x-systemd.automount,noatime,scrap_mem=2G,inject_faults,defaults",
        );
        let expected = "--ssd /var/tmp/ssd.img --fast /dev/shm/f --scrap-mem 2G --inject-faults -o rw,noatime /mnt/a";
        assert_eq!(request.unwrap(), Request::Mount(words(expected)));
    }

    #[test]
    fn the_default_devices_and_mount_flags() {
        assert_eq!(translated("alignfs /mnt/a -n -v -t fuse.alignfs").unwrap(), Request::Mount(words("/mnt/a")));
        assert_eq!(translated("alignfs /mnt/a -f -o fast=x").unwrap(), Request::Fake);
    }

    #[test]
    fn bad_options_are_refused_with_what_is_wrong() {
        for (args, says) in [
            ("alignfs /mnt/a -o bogus", "unknown mount option \"bogus\""),
            ("alignfs /mnt/a -o fast", "needs a value"),
            ("alignfs /mnt/a -o inject_faults=1", "takes no value"),
            ("alignfs /mnt/a -o foreground", "cannot be used through mount(8)"),
            ("alignfs", "usage"),
            ("alignfs /mnt/a extra", "usage"),
            ("alignfs /mnt/a -o", "-o needs"),
            ("alignfs /mnt/a -N 1", "not supported"),
            ("alignfs /mnt/a -q", "unknown mount helper flag"),
        ] {
            let error = translated(args).unwrap_err().to_string();
            assert!(error.contains(says), "{args}: {error}");
        }
    }
}
