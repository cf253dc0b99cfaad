//! Where the command logs: stderr, at `ALIGNFS_LOG`'s levels (default: warnings). A mount
//! daemon's stderr is its log file; that file is kept under a size by moving it aside
//! (`FILE.1`, the one before it dropped) when it grows past [`LOG_FILE_BYTES`].

use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use parking_lot::Mutex;

/// Set in a daemon's environment: the log file its stderr appends to.
pub const LOG_FILE_ENV: &str = "ALIGNFS_LOG_FILE";

/// A daemon's log file grows to this size before it is moved aside.
pub const LOG_FILE_BYTES: u64 = 16 << 20;

/// Log to stderr. The S3 protocol crate logs every refused request at error level; the
/// gateway logs them itself at their weight, so the crate is quiet unless `ALIGNFS_LOG`
/// names it. Colour only on a terminal.
pub fn init() {
    let given = std::env::var("ALIGNFS_LOG").ok();
    let mut directives = given.clone().unwrap_or_else(|| "warn".into());
    if !directives.contains("s3s") {
        directives.push_str(",s3s=off");
    }
    let filter = tracing_subscriber::EnvFilter::try_new(&directives).unwrap_or_else(|e| {
        eprintln!("alignfs: ALIGNFS_LOG={}: {e}; logging warnings only", given.as_deref().unwrap_or(""));
        tracing_subscriber::EnvFilter::new("warn,s3s=off")
    });
    let terminal = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_ansi(terminal);
    match std::env::var_os(LOG_FILE_ENV) {
        Some(path) => {
            let file = Box::leak(Box::new(CappedLog { path: PathBuf::from(path), cap: LOG_FILE_BYTES, lock: Mutex::new(()) }));
            builder.with_writer(move || file.writer()).init();
        }
        None => builder.with_writer(std::io::stderr).init(),
    }
}

/// Stderr, which is `path` opened for appending; past `cap` bytes `path` moves to
/// `path.1` and a new `path` takes stderr's place, so panics and log lines follow.
struct CappedLog {
    path: PathBuf,
    cap: u64,
    lock: Mutex<()>,
}

impl CappedLog {
    fn writer(&self) -> std::io::Stderr {
        let _one_at_a_time = self.lock.lock();
        let size = std::fs::metadata("/proc/self/fd/2").map(|m| m.size()).unwrap_or(0);
        if size > self.cap {
            match rotate(&self.path).and_then(|fresh| Ok(rustix::stdio::dup2_stderr(&fresh)?)) {
                // Written straight to the new file: a log line here would come back to this lock.
                Ok(()) => {
                    let _ = writeln!(
                        std::io::stderr(),
                        "alignfs: the log reached {} bytes; its earlier lines are in {}.1",
                        self.cap,
                        self.path.display()
                    );
                }
                Err(e) => {
                    let _ = writeln!(std::io::stderr(), "alignfs: cannot move the log aside: {e}");
                }
            }
        }
        std::io::stderr()
    }
}

/// Move `path` to `path.1` (replacing it); the new, empty `path`, open for appending.
fn rotate(path: &Path) -> std::io::Result<std::fs::File> {
    let mut old = path.as_os_str().to_owned();
    old.push(".1");
    std::fs::rename(path, &old)?;
    std::fs::OpenOptions::new().create(true).append(true).open(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_moves_aside_and_a_new_one_starts() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mount.log");
        std::fs::write(&path, b"old lines\n").unwrap();
        std::fs::write(dir.path().join("mount.log.1"), b"older\n").unwrap();
        let mut fresh = rotate(&path).unwrap();
        fresh.write_all(b"new line\n").unwrap();
        assert_eq!(std::fs::read(dir.path().join("mount.log.1")).unwrap(), b"old lines\n", "the one before is dropped");
        assert_eq!(std::fs::read(&path).unwrap(), b"new line\n");
        assert!(rotate(&dir.path().join("missing")).is_err());
    }
}
