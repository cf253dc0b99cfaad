//! Reproducible randomized tests, shared by the unit and integration tests, and the
//! `scrap` crash rule they and the kill -9 harness check against.

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

/// What a crash may leave of a file whose residue is volatile (`scrap`): its bytes as of
/// its last sync, and everything changed since. After a crash each byte must read as its
/// synced value, as a value written there since, or as zero; a byte nobody touched since
/// the sync must be exactly as synced.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Unsynced {
    synced: Vec<u8>,
    /// Bytes touched since the sync (writes, holes, truncates, fallocate).
    touched: Vec<bool>,
    pub writes: Vec<(usize, Vec<u8>)>,
    min_size: usize,
    max_size: usize,
}

impl Unsynced {
    pub fn synced(content: &[u8]) -> Unsynced {
        Unsynced {
            synced: content.to_vec(),
            touched: vec![false; content.len()],
            writes: Vec::new(),
            min_size: content.len(),
            max_size: content.len(),
        }
    }

    /// Bytes `start..end` changed, and the file's size became `new_size`.
    pub fn touch(&mut self, start: usize, end: usize, new_size: usize) {
        let len = end.max(new_size).max(self.touched.len());
        self.touched.resize(len, true);
        self.touched[start.min(end)..end].fill(true);
        self.min_size = self.min_size.min(new_size);
        self.max_size = self.max_size.max(new_size);
    }

    /// Whether `after` (what a crash left) is something a crash may leave.
    pub fn check(&self, after: &[u8]) -> Result<(), String> {
        self.check_at(after).map_err(|(_, problem)| problem)
    }

    /// [`Unsynced::check`], naming the offending byte's offset where one byte is at fault
    /// (not for a wrong size).
    pub fn check_at(&self, after: &[u8]) -> Result<(), (Option<usize>, String)> {
        let n = after.len();
        if n < self.min_size.min(self.synced.len()) || n > self.max_size {
            return Err((None, format!("size {n} after a crash, expected {}..={}", self.min_size.min(self.synced.len()), self.max_size)));
        }
        for (i, &b) in after.iter().enumerate() {
            let synced = self.synced.get(i).copied();
            if !self.touched.get(i).copied().unwrap_or(true) && i < self.min_size {
                if Some(b) != synced {
                    return Err((Some(i), format!("synced byte {i} changed in a crash")));
                }
                continue;
            }
            let written = || self.writes.iter().any(|(at, data)| i >= *at && i < at + data.len() && data[i - at] == b);
            if b != 0 && Some(b) != synced && !written() {
                return Err((Some(i), format!("byte {i} = {b:#04x} after a crash was never written there")));
            }
        }
        Ok(())
    }
}
