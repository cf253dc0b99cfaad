//! How requests travel between the kernel and the daemon: FUSE over io_uring where the
//! kernel offers it, `/dev/fuse` reads and writes otherwise. The choice and its
//! measurements are in docs/FUSE.md ("Transport").

use std::fmt;
use std::str::FromStr;

use fuser::TransportStats;

/// Which transport a mount asks for (`alignfs mount --transport`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// io_uring if the kernel offers it (Linux 6.14+, `enable_uring` set), else `/dev/fuse`.
    Auto,
    /// io_uring or no mount.
    IoUring,
    /// `/dev/fuse` even where io_uring is offered.
    DevFuse,
}

impl Transport {
    pub const NAMES: [&'static str; 3] = ["auto", "io-uring", "dev-fuse"];

    /// Set up a session's configuration for this transport.
    pub fn configure(self, config: &mut fuser::Config) {
        config.io_uring = self != Transport::DevFuse;
    }

    /// After mounting: whether the session got what was asked for.
    pub fn check(self, stats: &TransportStats) -> Result<(), String> {
        if self == Transport::IoUring && !stats.io_uring() {
            return Err(format!("FUSE over io_uring was required, but the transport is {}", stats.summary()));
        }
        Ok(())
    }
}

impl FromStr for Transport {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Transport::Auto),
            "io-uring" => Ok(Transport::IoUring),
            "dev-fuse" => Ok(Transport::DevFuse),
            _ => Err(format!("unknown transport {s:?}: one of {}", Transport::NAMES.join(", "))),
        }
    }
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Transport::Auto => "auto",
            Transport::IoUring => "io-uring",
            Transport::DevFuse => "dev-fuse",
        })
    }
}

/// Where a mount's io_uring request threads run (`alignfs mount --ring-threads`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RingThreads {
    /// Each only on the CPU of its queue, the CPU its requests' callers ran on.
    Pinned,
    /// Wherever the scheduler puts them.
    Unpinned,
}

impl RingThreads {
    pub const NAMES: [&'static str; 2] = ["pinned", "unpinned"];

    /// Set up a session's configuration for this placement.
    pub fn configure(self, config: &mut fuser::Config) {
        config.pin_ring_threads = self == RingThreads::Pinned;
    }
}

impl FromStr for RingThreads {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "pinned" => Ok(RingThreads::Pinned),
            "unpinned" => Ok(RingThreads::Unpinned),
            _ => Err(format!("unknown ring thread placement {s:?}: one of {}", RingThreads::NAMES.join(", "))),
        }
    }
}

impl fmt::Display for RingThreads {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if *self == RingThreads::Pinned { "pinned" } else { "unpinned" })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transports_parse_and_print_their_names() {
        for name in Transport::NAMES {
            assert_eq!(name.parse::<Transport>().map(|t| t.to_string()).as_deref(), Ok(name));
        }
        let err = "uring".parse::<Transport>().err().unwrap_or_default();
        assert!(err.contains("auto, io-uring, dev-fuse"), "{err}");
    }

    #[test]
    fn ring_thread_placements_parse_print_and_configure() {
        for name in RingThreads::NAMES {
            let placement = name.parse::<RingThreads>();
            assert_eq!(placement.as_ref().map(|p| p.to_string()).as_deref(), Ok(name));
            let mut config = fuser::Config::default();
            placement.unwrap_or(RingThreads::Unpinned).configure(&mut config);
            assert_eq!(config.pin_ring_threads, name == "pinned");
        }
        let err = "pin".parse::<RingThreads>().err().unwrap_or_default();
        assert!(err.contains("pinned, unpinned"), "{err}");
    }

    #[test]
    fn only_dev_fuse_leaves_io_uring_off() {
        for (t, on) in [(Transport::Auto, true), (Transport::IoUring, true), (Transport::DevFuse, false)] {
            let mut config = fuser::Config::default();
            t.configure(&mut config);
            assert_eq!(config.io_uring, on, "{t}");
        }
    }

    #[test]
    fn a_required_io_uring_that_was_not_agreed_is_an_error() {
        let stats = TransportStats::default();
        assert!(Transport::Auto.check(&stats).is_ok());
        assert!(Transport::DevFuse.check(&stats).is_ok());
        let err = Transport::IoUring.check(&stats).err().unwrap_or_default();
        assert!(err.contains("/dev/fuse"), "{err}");
    }
}
