//! One owner per device file: an advisory `flock` held for as long as a device is open.
//! A writer holds it alone, readers (`stat`, `fsck`) share it, so two processes never
//! serve one volume and no `mkfs` writes over a device a running process uses. The
//! process that holds a lock is found in `/proc/locks`, so a refusal can name it.

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use rustix::fs::FlockOperation;

use crate::error::{Error, Result};

/// Take the lock on `file` (opened from `path`) for as long as `file` stays open.
pub fn hold(file: &File, path: &Path, shared: bool) -> Result<()> {
    let operation = if shared { FlockOperation::NonBlockingLockShared } else { FlockOperation::NonBlockingLockExclusive };
    match rustix::fs::flock(file, operation) {
        Ok(()) => Ok(()),
        Err(rustix::io::Errno::WOULDBLOCK) => Err(Error::InUse { path: path.into(), holder: holder(path) }),
        Err(e) => Err(Error::io(format!("lock {}", path.display()), e.into())),
    }
}

/// `Err(InUse)` if another open of `path` holds its lock; `Ok` if nobody does or `path`
/// does not exist. Takes the lock and lets it go at once, so a caller that opens the
/// device next (and locks it then) must not hold this check's file.
pub fn check_free(path: &Path) -> Result<()> {
    let file = match File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(Error::io(format!("open {}", path.display()), e)),
    };
    hold(&file, path, false)
}

/// The pid of a process holding a lock on `path`, from `/proc/locks`; `None` where it
/// cannot be told (no such line, or a lock without an owner process).
pub fn holder(path: &Path) -> Option<u32> {
    let metadata = std::fs::metadata(path).ok()?;
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    holder_in(&locks, metadata.dev(), metadata.ino())
}

/// [`holder`] over the text of `/proc/locks`: lines such as
/// `3: FLOCK  ADVISORY  WRITE 4242 00:1b:1289 0 EOF`, the device in hex, the inode in
/// decimal; lines with `->` are waiters, not holders.
fn holder_in(locks: &str, dev: u64, ino: u64) -> Option<u32> {
    let wanted = format!("{:02x}:{:02x}:{ino}", libc::major(dev), libc::minor(dev));
    locks.lines().find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.get(1) == Some(&"->") {
            return None;
        }
        let at = fields.iter().position(|f| *f == wanted)?;
        fields.get(at.checked_sub(1)?)?.parse::<u32>().ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_is_found_with_its_owner_and_released_on_close() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("device");
        std::fs::write(&path, b"x").unwrap();
        check_free(&path).unwrap();
        check_free(&dir.path().join("missing")).unwrap();
        let held = File::open(&path).unwrap();
        hold(&held, &path, false).unwrap();
        match check_free(&path) {
            Err(Error::InUse { holder, .. }) => assert_eq!(holder, Some(std::process::id())),
            other => panic!("a held device must be refused, got {other:?}"),
        }
        let reader = File::open(&path).unwrap();
        assert!(matches!(hold(&reader, &path, true), Err(Error::InUse { .. })), "a reader waits for the writer");
        drop(held);
        hold(&reader, &path, true).unwrap();
        let second = File::open(&path).unwrap();
        hold(&second, &path, true).unwrap();
        assert!(matches!(check_free(&path), Err(Error::InUse { .. })), "readers hold it too");
        drop((reader, second));
        check_free(&path).unwrap();
    }

    #[test]
    fn proc_locks_lines() {
        let text = "1: FLOCK  ADVISORY  WRITE 4242 00:1b:1289 0 EOF\n\
                    1: -> FLOCK  ADVISORY  WRITE 77 00:1b:1289 0 EOF\n\
                    2: OFDLCK ADVISORY  READ  -1 08:01:99 0 EOF\n\
                    3: POSIX  ADVISORY  READ 55 fd:02:1289 0 EOF\n";
        let dev = |major: u32, minor: u32| libc::makedev(major, minor);
        assert_eq!(holder_in(text, dev(0, 0x1b), 1289), Some(4242));
        assert_eq!(holder_in(text, dev(8, 1), 99), None, "an OFD lock has no owner process");
        assert_eq!(holder_in(text, dev(0xfd, 2), 1289), Some(55));
        assert_eq!(holder_in(text, dev(0, 0x1b), 128), None);
        assert_eq!(holder_in("", dev(0, 0x1b), 1289), None);
    }
}
