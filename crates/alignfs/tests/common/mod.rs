//! Shared helpers for the integration tests.
#![allow(dead_code)]

use std::sync::Arc;

use alignfs::device::{BlockDevice, PmemRegion, SimSsd};
use alignfs::{FormatOptions, Geometry, Volume, VolumeOptions};

/// A pair of simulated devices that outlive any volume opened on them.
pub struct Devices {
    pub fast: Arc<PmemRegion>,
    pub ssd: Arc<SimSsd>,
}

impl Devices {
    pub fn new(fast_bytes: u64, ssd_bytes: u64) -> Devices {
        Devices { fast: Arc::new(PmemRegion::anonymous(fast_bytes).unwrap()), ssd: Arc::new(SimSsd::new(ssd_bytes)) }
    }

    pub fn format(&self, geometry: Geometry) {
        Volume::format(&self.fast, self.ssd.as_ref(), &FormatOptions { geometry, ..FormatOptions::default() }).unwrap();
    }

    pub fn open(&self, options: VolumeOptions) -> alignfs::Result<Volume> {
        Volume::open(Arc::clone(&self.fast), Arc::clone(&self.ssd) as Arc<dyn BlockDevice>, options)
    }

    pub fn fast_bytes(&self) -> Vec<u8> {
        let mut out = vec![0u8; self.fast.len_bytes() as usize];
        self.fast.read(0, &mut out);
        out
    }
}
