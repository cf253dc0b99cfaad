//! The devices of a volume, as its profile's [`DeviceKind`] has them: one value, matched
//! once where a volume is built, instead of optional fields asked about everywhere.

use std::path::PathBuf;
use std::sync::Arc;

use crate::device::mssd::MemorySemanticSsd;
use crate::device::power_loss::PowerLog;
use crate::device::{BlockDevice, ByteTier};
use crate::profile::DeviceKind;

#[derive(Clone)]
pub enum Devices {
    /// A fast tier, holding residue and metadata, and one SSD (`orch`, `uhs`).
    FastTierAndSsd { fast: Arc<dyn ByteTier>, ssd: Arc<dyn BlockDevice> },
    /// One SSD, or several joined in a [`crate::device::DeviceSet`]; the metadata at the
    /// start of the first (`scrap`).
    Ssds { ssd: Arc<dyn BlockDevice> },
    /// One SSD and the directory of the KV store that holds the metadata (`nvstore`).
    /// `syncs`: power-loss tests record the directory each time the store syncs it
    /// ([`crate::device::power_loss::RecordedDir`]), as a `RecordedSsd` records its writes.
    SsdAndKvStore { ssd: Arc<dyn BlockDevice>, dir: PathBuf, syncs: Option<Arc<PowerLog>> },
    /// A memory-semantic SSD: its block interface is the volume's SSD, its byte interface
    /// takes residue and metadata (`byte`).
    MemorySemanticSsd { device: Arc<MemorySemanticSsd> },
}

impl Devices {
    pub fn new(fast: Arc<dyn ByteTier>, ssd: Arc<dyn BlockDevice>) -> Devices {
        Devices::FastTierAndSsd { fast, ssd }
    }

    pub fn ssd_only(ssd: Arc<dyn BlockDevice>) -> Devices {
        Devices::Ssds { ssd }
    }

    pub fn memory_semantic(device: Arc<MemorySemanticSsd>) -> Devices {
        Devices::MemorySemanticSsd { device }
    }

    /// One SSD and the directory of the volume's KV metadata store.
    pub fn with_kv(ssd: Arc<dyn BlockDevice>, dir: impl Into<PathBuf>) -> Devices {
        Devices::SsdAndKvStore { ssd, dir: dir.into(), syncs: None }
    }

    /// [`Devices::with_kv`], recording each sync of the KV directory in `log`.
    pub fn with_recorded_kv(ssd: Arc<dyn BlockDevice>, dir: impl Into<PathBuf>, log: Arc<PowerLog>) -> Devices {
        Devices::SsdAndKvStore { ssd, dir: dir.into(), syncs: Some(log) }
    }

    /// The SSD data blocks live on (a memory-semantic SSD's block interface).
    pub fn ssd(&self) -> Arc<dyn BlockDevice> {
        match self {
            Devices::FastTierAndSsd { ssd, .. } | Devices::Ssds { ssd } | Devices::SsdAndKvStore { ssd, .. } => Arc::clone(ssd),
            Devices::MemorySemanticSsd { device } => Arc::clone(device) as Arc<dyn BlockDevice>,
        }
    }

    /// The fast tier, where there is one.
    pub fn fast(&self) -> Option<&Arc<dyn ByteTier>> {
        match self {
            Devices::FastTierAndSsd { fast, .. } => Some(fast),
            _ => None,
        }
    }

    /// Whether these are the devices a profile of `kind` takes.
    pub fn are(&self, kind: DeviceKind) -> bool {
        matches!(
            (self, kind),
            (Devices::FastTierAndSsd { .. }, DeviceKind::FastTierAndSsd)
                | (Devices::Ssds { .. }, DeviceKind::Ssds { .. })
                | (Devices::SsdAndKvStore { .. }, DeviceKind::SsdAndKvStore)
                | (Devices::MemorySemanticSsd { .. }, DeviceKind::MemorySemanticSsd)
        )
    }

    /// What these devices are, for a refusal.
    pub fn describe_kind(&self) -> &'static str {
        match self {
            Devices::FastTierAndSsd { .. } => "a fast tier and an SSD",
            Devices::Ssds { .. } => "SSDs alone",
            Devices::SsdAndKvStore { .. } => "an SSD and a KV store",
            Devices::MemorySemanticSsd { .. } => "a memory-semantic SSD",
        }
    }
}
