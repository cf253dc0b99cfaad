//! Shared helpers for the integration tests.
#![allow(dead_code)]

use std::sync::Arc;

use alignfs::device::{BlockDevice, PmemRegion, SimSsd};
use alignfs::layout::Profile;
use alignfs::{FormatOptions, Geometry, Volume, VolumeOptions};

/// Simulated devices that outlive any volume opened on them: a fast tier and an SSD, or
/// (for profiles without a fast tier) the SSD alone.
pub struct Devices {
    pub fast: Arc<PmemRegion>,
    pub ssd: Arc<SimSsd>,
    pub profile: Profile,
}

impl Devices {
    pub fn new(fast_bytes: u64, ssd_bytes: u64) -> Devices {
        Devices {
            fast: Arc::new(PmemRegion::anonymous(fast_bytes).unwrap()),
            ssd: Arc::new(SimSsd::new(ssd_bytes)),
            profile: Profile::Orch,
        }
    }

    /// An SSD for a profile without a fast tier.
    pub fn ssd_only(profile: Profile, ssd_bytes: u64) -> Devices {
        Devices { fast: Arc::new(PmemRegion::anonymous(4096).unwrap()), ssd: Arc::new(SimSsd::new(ssd_bytes)), profile }
    }

    pub fn format(&self, geometry: Geometry) {
        let options = FormatOptions { geometry, profile: self.profile, ..FormatOptions::default() };
        if self.profile.has_fast_tier() {
            Volume::format(&self.fast, self.ssd.as_ref(), &options).unwrap();
        } else {
            Volume::format_ssd(&(Arc::clone(&self.ssd) as Arc<dyn BlockDevice>), &options).unwrap();
        }
    }

    pub fn open(&self, options: VolumeOptions) -> alignfs::Result<Volume> {
        let ssd = Arc::clone(&self.ssd) as Arc<dyn BlockDevice>;
        if self.profile.has_fast_tier() {
            Volume::open(Arc::clone(&self.fast), ssd, options)
        } else {
            Volume::open_ssd(ssd, options)
        }
    }

    pub fn fast_bytes(&self) -> Vec<u8> {
        let mut out = vec![0u8; self.fast.len_bytes() as usize];
        self.fast.read(0, &mut out);
        out
    }
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
        let n = after.len();
        if n < self.min_size.min(self.synced.len()) || n > self.max_size {
            return Err(format!("size {n} after a crash, expected {}..={}", self.min_size.min(self.synced.len()), self.max_size));
        }
        for (i, &b) in after.iter().enumerate() {
            let synced = self.synced.get(i).copied();
            if !self.touched.get(i).copied().unwrap_or(true) && i < self.min_size {
                if Some(b) != synced {
                    return Err(format!("synced byte {i} changed in a crash"));
                }
                continue;
            }
            let written = || self.writes.iter().any(|(at, data)| i >= *at && i < at + data.len() && data[i - at] == b);
            if b != 0 && Some(b) != synced && !written() {
                return Err(format!("byte {i} = {b:#04x} after a crash was never written there"));
            }
        }
        Ok(())
    }
}
