//! Which calls are ours: the prefix, path mapping, the process's volume, and errno.

use std::ffi::{c_char, c_int, CStr};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use alignfs::device::mssd::LatencyModel;
use alignfs::paths::{default_data_dir, DEFAULT_FAST_PATH};
use alignfs::VolumeOptions;
use alignfs_c::{Session, FD_BASE};

pub struct Config {
    /// Normalized absolute prefix, as components.
    prefix: Vec<String>,
    fast: PathBuf,
    ssd: PathBuf,
    options: VolumeOptions,
}

fn say(message: &str) {
    eprintln!("alignfs-preload: {message}");
}

/// Lexically normalize an absolute path ("." and ".." resolved, no symlinks).
fn components(path: &Path) -> Vec<String> {
    let mut parts: Vec<String> = Vec::new();
    for component in path.components() {
        match component {
            Component::Normal(name) => parts.push(name.to_string_lossy().into_owned()),
            Component::ParentDir => {
                parts.pop();
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    parts
}

fn load_config() -> Option<Config> {
    let prefix = std::env::var_os("ALIGNFS_PREFIX")?;
    let prefix = PathBuf::from(prefix);
    if !prefix.is_absolute() {
        say(&format!("ALIGNFS_PREFIX={} is not an absolute path; the shim is off", prefix.display()));
        return None;
    }
    let fast = std::env::var_os("ALIGNFS_FAST").map_or_else(|| PathBuf::from(DEFAULT_FAST_PATH), PathBuf::from);
    let ssd = std::env::var_os("ALIGNFS_SSD").map_or_else(|| default_data_dir().join("ssd.img"), PathBuf::from);
    let defaults = VolumeOptions::default();
    let clean_cache_bytes = match std::env::var("ALIGNFS_CLEAN_CACHE") {
        Err(_) => defaults.clean_cache_bytes,
        Ok(text) => match alignfs::geometry::parse_size(&text) {
            Ok(bytes) => bytes,
            Err(e) => {
                say(&format!("ALIGNFS_CLEAN_CACHE={text}: {e}; the shim is off"));
                return None;
            }
        },
    };
    let options = VolumeOptions {
        byte_interface: !switch("ALIGNFS_NO_BYTE_INTERFACE")?,
        device_latency: device_latency()?,
        clean_cache_bytes,
        ..defaults
    };
    let prefix = components(&prefix);
    for device in [&fast, &ssd] {
        if device.is_absolute() && components(device).starts_with(&prefix) {
            say(&format!("device {} lies under ALIGNFS_PREFIX; the shim is off", device.display()));
            return None;
        }
    }
    Some(Config { prefix, fast, ssd, options })
}

/// A `byte` volume's switch, as `alignfs mount` has it (`--no-byte-interface`): unset or `0` is off, `1` is on; anything else turns the shim off.
fn switch(name: &str) -> Option<bool> {
    match std::env::var(name).as_deref() {
        Err(_) | Ok("0") => Some(false),
        Ok("1") => Some(true),
        Ok(other) => {
            say(&format!("{name}={other}: use 1 or 0; the shim is off"));
            None
        }
    }
}

/// `ALIGNFS_DEVICE_LATENCY`, as `alignfs mount --device-latency[=SCALE]`: unset or `0`
/// runs the device at the image's speed, `1` takes ByteFS's Table 4 times, another
/// number scales Table 4's flash latencies by it; `ALIGNFS_DEVICE_WRITE_BUFFER=SIZE`
/// adds the FTL's write buffer (`--device-write-buffer`). Anything else turns the shim off.
fn device_latency() -> Option<Option<LatencyModel>> {
    let text = match std::env::var("ALIGNFS_DEVICE_LATENCY") {
        Err(_) => return Some(None),
        Ok(text) if text == "0" => return Some(None),
        Ok(text) => text,
    };
    let model = text
        .parse::<f64>()
        .map_err(|_| "not a number".to_string())
        .and_then(|scale| LatencyModel::bytefs_table4_flash_scaled(scale).map_err(|e| e.to_string()))
        .map_err(|e| format!("ALIGNFS_DEVICE_LATENCY={text}: {e}; use 0, 1 or a flash latency scale"));
    let write_buffer = match std::env::var("ALIGNFS_DEVICE_WRITE_BUFFER") {
        Err(_) => Ok(0),
        Ok(size) => alignfs::geometry::parse_size(&size).map_err(|e| format!("ALIGNFS_DEVICE_WRITE_BUFFER={size}: {e}")),
    };
    match model.and_then(|model| Ok(LatencyModel { write_buffer_bytes: write_buffer?, ..model })) {
        Ok(model) => Some(Some(model)),
        Err(e) => {
            say(&format!("{e}; the shim is off"));
            None
        }
    }
}

pub fn config() -> Option<&'static Config> {
    static CONFIG: OnceLock<Option<Config>> = OnceLock::new();
    CONFIG.get_or_init(load_config).as_ref()
}

/// The volume path for a host path under the prefix (relative paths against the real
/// current directory); `None` for everything else.
pub fn map_path(path: &[u8]) -> Option<String> {
    let config = config()?;
    if path.is_empty() {
        return None;
    }
    let text = std::str::from_utf8(path).ok()?;
    let absolute = if text.starts_with('/') { PathBuf::from(text) } else { std::env::current_dir().ok()?.join(text) };
    let parts = components(&absolute);
    let rest = parts.strip_prefix(config.prefix.as_slice())?;
    Some(format!("/{}", rest.join("/")))
}

/// # Safety
/// `path` is null or a NUL-terminated string.
pub unsafe fn map_c_path(path: *const c_char) -> Option<String> {
    if path.is_null() {
        return None;
    }
    // SAFETY: non-null and NUL-terminated (contract).
    map_path(unsafe { CStr::from_ptr(path) }.to_bytes())
}

/// Where a `*at` call's path points.
pub enum Target {
    Ours(String),
    Real,
}

/// # Safety
/// `path` is null or a NUL-terminated string.
pub unsafe fn at_path(dirfd: c_int, path: *const c_char) -> Result<Target, c_int> {
    if path.is_null() {
        return Ok(Target::Real);
    }
    // SAFETY: non-null and NUL-terminated (contract).
    let bytes = unsafe { CStr::from_ptr(path) }.to_bytes();
    if bytes.first() == Some(&b'/') || dirfd == libc::AT_FDCWD {
        return Ok(map_path(bytes).map_or(Target::Real, Target::Ours));
    }
    if !is_ours(dirfd) {
        return Ok(Target::Real);
    }
    let base = session()?.dir_path(dirfd).map_err(|e| e.errno())?;
    let name = std::str::from_utf8(bytes).map_err(|_| libc::EINVAL)?;
    Ok(Target::Ours(if name.is_empty() { base } else { format!("{}/{name}", base.trim_end_matches('/')) }))
}

pub fn is_ours(fd: c_int) -> bool {
    fd >= FD_BASE
}

pub fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

static OWNER: OnceLock<u32> = OnceLock::new();

/// The process's volume, opened on first use. A child of `fork` does not own it (its
/// background threads stayed in the parent): its calls fail with EIO, said once.
pub fn session() -> Result<&'static Session, c_int> {
    static SESSION: OnceLock<Result<Session, c_int>> = OnceLock::new();
    let opened = SESSION.get_or_init(|| {
        let config = config().ok_or(libc::ENOENT)?;
        match Session::open_with(&config.fast, &config.ssd, config.options.clone()) {
            Ok(session) => {
                let _ = OWNER.set(std::process::id());
                // SAFETY: registering a plain extern "C" function.
                unsafe { libc::atexit(checkpoint_at_exit) };
                Ok(session)
            }
            Err(e) => {
                say(&format!("cannot open the volume ({} and {}): {e}", config.fast.display(), config.ssd.display()));
                Err(e.errno())
            }
        }
    });
    let session = opened.as_ref().map_err(|&e| e)?;
    if OWNER.get() != Some(&std::process::id()) {
        static SAID: AtomicBool = AtomicBool::new(false);
        if !SAID.swap(true, Ordering::Relaxed) {
            say("this process is a fork of the one that opened the volume; its alignfs files are unusable here (EIO)");
        }
        return Err(libc::EIO);
    }
    Ok(session)
}

/// Leave a checkpoint behind so the next opener replays nothing (data is durable either
/// way). Only the process that opened the volume does this.
extern "C" fn checkpoint_at_exit() {
    if OWNER.get() == Some(&std::process::id()) {
        if let Ok(session) = session() {
            if let Err(e) = session.volume().checkpoint() {
                say(&format!("checkpoint at exit: {e}"));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn components_resolve_dots_lexically() {
        assert_eq!(components(Path::new("/a/./b/../c/")), vec!["a", "c"]);
        assert_eq!(components(Path::new("/..")), Vec::<String>::new());
    }
}
