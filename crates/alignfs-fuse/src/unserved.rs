//! Requests the mount does not serve, answered as a local file system answers them and
//! logged once per kind: an application that asks on every `open()` (CPython sends the
//! terminal ioctl `TCGETS` to see whether a file is a tty) must not fill the log.

use std::collections::HashSet;

use parking_lot::Mutex;

#[derive(Default)]
pub struct Unserved {
    seen: Mutex<HashSet<(&'static str, u32)>>,
}

impl Unserved {
    /// Whether this is the first `kind` request (with `detail`, an ioctl's command) seen.
    fn first(&self, kind: &'static str, detail: u32) -> bool {
        self.seen.lock().insert((kind, detail))
    }

    /// An ioctl: a regular file or directory here has none, so every command gets ENOTTY
    /// (as on ext4 for a command it does not know). Logged at debug level, once per command.
    pub fn ioctl(&self, cmd: u32) {
        if self.first("ioctl", cmd) {
            tracing::debug!("ioctl {cmd:#x} answered ENOTTY (later ones are not logged)");
        }
    }

    /// A request kind the mount does not implement, answered ENOSYS (the kernel then falls
    /// back, and for most kinds stops asking). Logged once per kind.
    pub fn request(&self, kind: &'static str) {
        if self.first(kind, 0) {
            tracing::info!("{kind} requests are not served here (ENOSYS); later ones are not logged");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_is_first_once() {
        let unserved = Unserved::default();
        assert!(unserved.first("ioctl", 0x5401));
        assert!(!unserved.first("ioctl", 0x5401));
        assert!(unserved.first("ioctl", 0x5402));
        assert!(unserved.first("poll", 0));
        assert!(!unserved.first("poll", 0));
    }
}
