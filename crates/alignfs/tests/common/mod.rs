//! Shared helpers for the integration tests.
#![allow(dead_code)]

use std::sync::Arc;

use alignfs::device::mssd::{MemorySemanticSsd, MssdConfig, MssdOptions};
use alignfs::device::{BlockDevice, ByteTier, PmemRegion, SimSsd};
use alignfs::layout::Profile;
use alignfs::profile::DeviceKind;
use alignfs::{FormatOptions, Geometry, Volume, VolumeOptions};

/// Simulated devices that outlive any volume opened on them: a fast tier and an SSD, or
/// (for profiles without a fast tier) the SSD alone, or (`byte`) a memory-semantic SSD
/// whose flash is `ssd` and whose DRAM is `fast`.
pub struct Devices {
    pub fast: Arc<PmemRegion>,
    pub ssd: Arc<SimSsd>,
    pub profile: Profile,
    /// The memory-semantic SSD's shape, for `byte`.
    pub memory_semantic: Option<MssdConfig>,
}

impl Devices {
    pub fn new(fast_bytes: u64, ssd_bytes: u64) -> Devices {
        Devices {
            fast: Arc::new(PmemRegion::anonymous(fast_bytes).unwrap()),
            ssd: Arc::new(SimSsd::new(ssd_bytes)),
            profile: Profile::ORCH,
            memory_semantic: None,
        }
    }

    /// An SSD for a profile without a fast tier (a memory-semantic one for `byte`, with a
    /// 2 MiB write log so that the device cleans it often).
    pub fn ssd_only(profile: Profile, ssd_bytes: u64) -> Devices {
        if profile.devices() == DeviceKind::MemorySemanticSsd {
            let config = MssdConfig { log_bytes: 2 << 20, ..MssdConfig::new(ssd_bytes) };
            let (dram, flash) = MemorySemanticSsd::sizes(&config).unwrap();
            let (fast, ssd) = (Arc::new(PmemRegion::anonymous(dram).unwrap()), Arc::new(SimSsd::new(flash)));
            return Devices { fast, ssd, profile, memory_semantic: Some(config) };
        }
        Devices {
            fast: Arc::new(PmemRegion::anonymous(4096).unwrap()),
            ssd: Arc::new(SimSsd::new(ssd_bytes)),
            profile,
            memory_semantic: None,
        }
    }

    pub fn format(&self, geometry: Geometry) {
        self.format_with(FormatOptions { geometry, profile: self.profile, ..FormatOptions::default() });
    }

    pub fn format_with(&self, options: FormatOptions) {
        if let Some(config) = &self.memory_semantic {
            let flash = Arc::clone(&self.ssd) as Arc<dyn BlockDevice>;
            let device = MemorySemanticSsd::format(flash, Arc::clone(&self.fast) as Arc<dyn ByteTier>, config, MssdOptions::default());
            Volume::format(&alignfs::Devices::memory_semantic(Arc::new(device.unwrap())), &options).unwrap();
            return;
        }
        Volume::format(&self.devices(), &options).unwrap();
    }

    pub fn open(&self, options: VolumeOptions) -> alignfs::Result<Volume> {
        Volume::open(self.devices(), options)
    }

    /// The memory-semantic SSD on the media, recovered (`byte`).
    pub fn open_device(&self) -> Arc<MemorySemanticSsd> {
        let ssd = Arc::clone(&self.ssd) as Arc<dyn BlockDevice>;
        Arc::new(MemorySemanticSsd::open(ssd, Arc::clone(&self.fast) as Arc<dyn ByteTier>, MssdOptions::default()).unwrap().0)
    }

    /// The devices the profile takes.
    pub fn devices(&self) -> alignfs::Devices {
        let ssd = Arc::clone(&self.ssd) as Arc<dyn BlockDevice>;
        if self.memory_semantic.is_some() {
            let (device, _) = MemorySemanticSsd::open(ssd, Arc::clone(&self.fast) as Arc<dyn ByteTier>, MssdOptions::default()).unwrap();
            return alignfs::Devices::memory_semantic(Arc::new(device));
        }
        match self.profile.devices() {
            DeviceKind::FastTierAndSsd => alignfs::Devices::new(Arc::clone(&self.fast) as Arc<dyn ByteTier>, ssd),
            _ => alignfs::Devices::ssd_only(ssd),
        }
    }

    pub fn fast_bytes(&self) -> Vec<u8> {
        let mut out = vec![0u8; self.fast.len_bytes() as usize];
        self.fast.read(0, &mut out);
        out
    }
}
