//! How a volume is formatted and opened: the choices its callers make, shared by the
//! engine and the profiles that read them.

use std::time::Duration;

use crate::device::mssd::LatencyModel;
use crate::geometry::Geometry;
use crate::layout::Profile;

/// How SSD data is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadMode {
    /// O_DIRECT into aligned buffers through the IO engine.
    Direct,
    /// Through the kernel's cache of the backing file (pread on a cached descriptor).
    Buffered,
}

#[derive(Clone, Debug)]
pub struct VolumeOptions {
    pub read_mode: ReadMode,
    /// Replay in memory and refuse every change: nothing is written to the devices.
    pub read_only: bool,
    /// Migration starts when this share of fast pages is used…
    pub migrate_high: f64,
    /// …and stops when usage falls to this share.
    pub migrate_low: f64,
    /// Run the background maintenance thread (migration, checkpoints).
    pub background: bool,
    /// `scrap`: the most memory its scrap pages may take (`--scrap-mem`); `nvstore`: its
    /// fragment pages.
    pub scrap_mem_bytes: u64,
    /// `nvstore`, `byte`: the most memory their clean pages (copies of SSD blocks) may
    /// take; 0 keeps none.
    pub clean_cache_bytes: u64,
    /// `scrap`, `uhs`: writes below this size go whole to the residue store (WSBuffer's
    /// request-size threshold, UHS's small-write threshold); larger ones send their whole
    /// blocks straight to the SSD. `None`: the profile's default.
    pub request_threshold: Option<u64>,
    /// `scrap`: threads writing scrap pages back (WSBuffer runs two).
    pub flush_workers: usize,
    /// `uhs`: bytes of one NVM buffer segment (UHS: 4 MiB).
    pub segment_bytes: u64,
    /// `uhs`: `false` runs without the NVM buffer (the paper's UHS-NB): whole blocks go to
    /// the SSD and a partly written block is read, merged and rewritten.
    pub nvm_buffer: bool,
    /// `byte`: `false` uses the memory-semantic SSD's block interface alone (the paper's
    /// block-only baseline): metadata written in whole sectors, partly written blocks
    /// read, merged and rewritten.
    pub byte_interface: bool,
    /// `byte`: the memory-semantic SSD takes at least the time this model gives each
    /// operation (ByteFS's Table 4: flash 40/60 µs, 8 channels, cache-line loads 4.8 µs,
    /// stores 0.6 µs), so that throughput reflects that device rather than the image's
    /// disk; `None` lets it run at the image's speed.
    pub device_latency: Option<LatencyModel>,
    /// `scrap`: the longest a namespace op (create, rename, unlink…) waits to become
    /// durable when no fsync comes first, as a file system under a page cache commits its
    /// log; zero makes every namespace op durable before it returns.
    pub commit_interval: Duration,
}

impl Default for VolumeOptions {
    fn default() -> Self {
        VolumeOptions {
            read_mode: ReadMode::Buffered,
            read_only: false,
            migrate_high: 0.8,
            migrate_low: 0.6,
            background: true,
            scrap_mem_bytes: 1 << 30,
            clean_cache_bytes: 256 << 20,
            request_threshold: None,
            flush_workers: 2,
            segment_bytes: 4 << 20,
            nvm_buffer: true,
            byte_interface: true,
            device_latency: None,
            commit_interval: Duration::from_secs(5),
        }
    }
}

#[derive(Clone, Debug)]
pub struct FormatOptions {
    pub geometry: Geometry,
    pub profile: Profile,
    /// Overwrite devices that already hold a volume.
    pub force: bool,
    pub meta_store: MetaStoreChoice,
    /// `byte`: the memory-semantic SSD's write log in bytes (1 MiB–4 GiB in 64-byte lines);
    /// `None` makes it 1/32 of the capacity, 1–256 MiB.
    pub device_log_bytes: Option<u64>,
}

impl Default for FormatOptions {
    fn default() -> Self {
        FormatOptions {
            geometry: Geometry::default(),
            profile: Profile::ORCH,
            force: false,
            meta_store: MetaStoreChoice::default(),
            device_log_bytes: None,
        }
    }
}

/// How a new volume keeps its metadata, where the profile offers a choice: `byte` stores
/// it in place by default (ByteFS's layout, docs/BYTE.md) or in the journal and
/// checkpoints the other profiles use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MetaStoreChoice {
    #[default]
    ProfileDefault,
    Journal,
    InPlace,
}
