//! Reproducible randomized tests, shared by the unit and integration tests.

/// The seed for a randomized test: `ALIGNFS_SEED` if set, otherwise fresh. Printed, so a
/// failure can be replayed with `ALIGNFS_SEED=<seed> cargo test <name>`.
pub fn seed(test: &str) -> u64 {
    let fresh = || {
        let clock = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        (clock.as_nanos() as u64) ^ (u64::from(std::process::id()) << 32)
    };
    let seed = std::env::var("ALIGNFS_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(fresh);
    eprintln!("{test}: seed {seed} (replay with ALIGNFS_SEED={seed})");
    seed
}

/// A count scaled by `ALIGNFS_TEST_SCALE` (default 1.0) for longer soaks.
pub fn scaled(count: u64) -> u64 {
    let scale: f64 = std::env::var("ALIGNFS_TEST_SCALE").ok().and_then(|s| s.parse().ok()).unwrap_or(1.0);
    ((count as f64) * scale).max(1.0) as u64
}
