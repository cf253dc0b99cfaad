//! Shared helpers for the integration tests.
#![allow(dead_code)]

use std::sync::Arc;

use alignfs::device::{BlockDevice, ByteTier, PmemRegion, SimSsd};
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
            profile: Profile::ORCH,
        }
    }

    /// An SSD for a profile without a fast tier.
    pub fn ssd_only(profile: Profile, ssd_bytes: u64) -> Devices {
        Devices { fast: Arc::new(PmemRegion::anonymous(4096).unwrap()), ssd: Arc::new(SimSsd::new(ssd_bytes)), profile }
    }

    pub fn format(&self, geometry: Geometry) {
        let options = FormatOptions { geometry, profile: self.profile, ..FormatOptions::default() };
        Volume::format(&self.devices(), &options).unwrap();
    }

    pub fn open(&self, options: VolumeOptions) -> alignfs::Result<Volume> {
        Volume::open(self.devices(), options)
    }

    /// The devices the profile takes.
    pub fn devices(&self) -> alignfs::Devices {
        let ssd = Arc::clone(&self.ssd) as Arc<dyn BlockDevice>;
        let fast = self.profile.devices().fast_tier.then(|| Arc::clone(&self.fast) as Arc<dyn ByteTier>);
        alignfs::Devices { fast, ssd, kv: None, kv_syncs: None }
    }

    pub fn fast_bytes(&self) -> Vec<u8> {
        let mut out = vec![0u8; self.fast.len_bytes() as usize];
        self.fast.read(0, &mut out);
        out
    }
}
