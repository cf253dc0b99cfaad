//! Counters (DESIGN.md §10). Flow counters are cumulative over the volume's life: they are
//! saved in every checkpoint and restored at open, so an offline `alignfs stat` shows them
//! as of the last checkpoint.

use std::sync::atomic::{AtomicU64, Ordering};

macro_rules! counters {
    ($($name:ident: $doc:literal,)*) => {
        /// One flow counter.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        #[allow(non_camel_case_types)]
        pub enum Counter { $($name,)* }

        impl Counter {
            pub const ALL: &'static [Counter] = &[$(Counter::$name,)*];
            pub fn name(self) -> &'static str {
                match self { $(Counter::$name => stringify!($name),)* }
            }
            pub fn doc(self) -> &'static str {
                match self { $(Counter::$name => $doc,)* }
            }
        }
    };
}

counters! {
    app_writes: "write calls",
    app_write_bytes: "bytes written by the application",
    app_reads: "read calls",
    app_read_bytes: "bytes read by the application",
    ssd_write_bytes: "bytes written to the SSD",
    ssd_write_ios: "SSD write IOs",
    ssd_read_bytes: "bytes read from the SSD",
    ssd_io_le_4k: "SSD write IOs of at most 4 KiB",
    ssd_io_le_32k: "SSD write IOs of 4–32 KiB",
    ssd_io_le_128k: "SSD write IOs of 32–128 KiB",
    ssd_io_le_1m: "SSD write IOs of 128 KiB–1 MiB",
    ssd_io_gt_1m: "SSD write IOs above 1 MiB",
    page_write_bytes: "residue bytes written to fast pages",
    upage_write_bytes: "residue bytes written as upage chunks",
    fg_rmw_reads: "foreground read-modify-write reads (slow path; 0 in normal operation)",
    fg_rmw_read_bytes: "bytes read by foreground read-modify-writes",
    migrations_watermark: "blocks migrated because the fast tier passed its high watermark",
    migrations_header_full: "blocks migrated because an upage header was full",
    migrations_fast_full: "blocks migrated by a writer waiting for fast pages",
    migration_read_bytes: "bytes read by migration",
    migration_write_bytes: "bytes written to the SSD by migration",
    ssd_flushes: "SSD cache flushes",
    ssd_flushes_skipped: "flushes asked for (write, fsync) but not needed: covered already, or a write-through device",
    journal_records: "journal records committed",
    journal_bytes: "journal payload bytes committed",
    checkpoints: "checkpoints written",
    migrations_full: "blocks merged as soon as their residue unit became full (scrap: stage 2; nvstore: a completed fragment page)",
    migrations_sync: "blocks flushed by fsync or unmount (scrap)",
    migrations_idle: "blocks merged while the volume was idle (scrap: stage 1, filled from the SSD; uhs: the NVM buffer drained)",
    migrations_dropped: "merges dropped because a writer changed the block meanwhile (a new SSD block it took is freed unused)",
    namespace_records: "journal records holding a namespace op (create, link, rename, attributes); the rest hold data ops only",
    checksum_errors: "SSD blocks read back with a checksum that does not match their record (nvstore)",
    pages_merged_by_reads: "fragment pages a read filled from their SSD block, so their sync reads nothing (nvstore: FP -> DP)",
    clean_page_hits: "SSD blocks a read or merge found among the clean pages, so it read nothing from the device (nvstore: CP; byte: the host's cache)",
    pages_dirtied_from_clean: "unaligned writes whose block was a clean page: its page filled from it at once (nvstore: CP -> DP)",
    kv_block_bytes: "flattened block-map records written to the KV store, keys and values (nvstore)",
    kv_fragment_bytes: "fragment records written to the KV store, one per unaligned piece (nvstore)",
    kv_onode_bytes: "onode records written, only when an object's size changes (nvstore)",
    kv_attr_bytes: "attribute records written, by namespace operations (nvstore)",
    kv_name_bytes: "name records written (nvstore)",
    kv_batches: "KV batches committed, one per metadata commit (nvstore)",
    kv_syncs: "KV journal syncs; fewer than kv_batches when commits shared one (nvstore: group commit, staged objects)",
    ssd_overwrites_in_place: "whole blocks a write replaced where they were (scrap: flushed by the next fsync; uhs: before the write returns)",
    write_back_blocks_by_line: "blocks a page cache wrote back with few 64-byte lines changed: only those lines were written (byte: modified ratio <= 1/8)",
    write_back_blocks_unchanged: "blocks a page cache wrote back unchanged: nothing was written (byte)",
    page_cache_fill_bytes: "bytes read back after a file's last close to put in the kernel's page cache (mount --fill-on-close)",
    meta_lines_stored: "64-byte lines of in-place metadata a commit changed (byte: stored through the byte interface; block-only: written in the 4 KiB sectors that hold them, to the redo area and in place)",
    meta_transactions: "device transactions (byte interface) or redo writes (block-only) committed by the in-place metadata (byte)",
    migrations_in_place: "blocks merged over their own SSD block, only the 4 KiB sectors their residue touched written (scrap: fsync, a writer's own merges and the flushers; uhs: at home)",
    migration_sector_read_bytes: "bytes of sectors a merge in place read because its residue covered them only in part (included in migration_read_bytes)",
    migration_sector_write_bytes: "bytes of sectors a merge in place wrote (included in migration_write_bytes)",
    stale_tails_cleared: "files whose bytes past EOF a crash had left on the SSD were cleared before they grew (scrap)",
    namespace_ops_deferred: "namespace ops applied at once and journaled with a later record (scrap: made durable by fsync, a data commit or the commit interval)",
    deferred_namespace_commits: "journal records that carried deferred namespace ops (scrap: one sync for many creates, renames, unlinks)",
}

/// What opening a memory-semantic SSD found in its write log, and what recovering it
/// took (the paper's recovery time: scanning the log and TxLogs, then writing the log
/// back to flash).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MssdRecovery {
    /// Committed entries replayed onto flash.
    pub replayed: u64,
    /// Entries of transactions that never committed, dropped.
    pub dropped_uncommitted: u64,
    /// Entries older than the flash page they belong to.
    pub stale: u64,
    /// Bytes of write log between the head and the first position holding no entry.
    pub log_bytes: u64,
    /// Reading the page map, the TxLogs and the log's entry headers.
    pub scan_us: u64,
    /// Rebuilding the index and writing every page with log entries back to flash…
    pub clean_us: u64,
    /// …of which rebuilding the index.
    pub index_us: u64,
    /// Pages the write-back programmed, and old pages it read to merge partial updates.
    pub pages_written: u64,
    pub base_reads: u64,
    /// The whole open, from reading the header to an empty log.
    pub total_us: u64,
}

impl MssdRecovery {
    /// Whether the log held anything to recover.
    pub fn found_entries(&self) -> bool {
        self.replayed + self.dropped_uncommitted + self.stale > 0
    }
}

/// "recovered in … s: …", as the mount log, `alignfs stat` and `alignfs export-device`
/// report it.
impl std::fmt::Display for MssdRecovery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let seconds = |us: u64| us as f64 / 1e6;
        write!(
            f,
            "recovered in {:.3} s: {} KiB of write log scanned in {:.3} s, {} pages written back ({} old pages read) in \
             {:.3} s; {} entries replayed, {} uncommitted dropped, {} stale",
            seconds(self.total_us),
            self.log_bytes.div_ceil(1024),
            seconds(self.scan_us),
            self.pages_written,
            self.base_reads,
            seconds(self.clean_us),
            self.replayed,
            self.dropped_uncommitted,
            self.stale
        )
    }
}

/// What opening the volume took.
#[derive(Clone, Debug, Default)]
pub struct RecoveryReport {
    pub duration: std::time::Duration,
    pub checkpoint_generation: u64,
    pub records_replayed: u64,
    pub torn_tail_dropped: bool,
    pub orphans_dropped: u64,
    pub clean: bool,
}

#[derive(Default)]
pub struct Stats {
    values: Vec<AtomicU64>,
}

impl Stats {
    pub fn new(saved: &[u64]) -> Stats {
        let values = Counter::ALL.iter().enumerate().map(|(i, _)| AtomicU64::new(saved.get(i).copied().unwrap_or(0))).collect();
        Stats { values }
    }

    pub fn add(&self, counter: Counter, n: u64) {
        self.values[counter as usize].fetch_add(n, Ordering::Relaxed);
    }

    pub fn get(&self, counter: Counter) -> u64 {
        self.values[counter as usize].load(Ordering::Relaxed)
    }

    pub fn all(&self) -> Vec<u64> {
        self.values.iter().map(|v| v.load(Ordering::Relaxed)).collect()
    }

    pub fn ssd_write(&self, bytes: u64) {
        self.add(Counter::ssd_write_ios, 1);
        self.add(Counter::ssd_write_bytes, bytes);
        let bucket = match bytes {
            0..=4096 => Counter::ssd_io_le_4k,
            4097..=32768 => Counter::ssd_io_le_32k,
            32769..=131072 => Counter::ssd_io_le_128k,
            131073..=1048576 => Counter::ssd_io_le_1m,
            _ => Counter::ssd_io_gt_1m,
        };
        self.add(bucket, 1);
    }
}

/// Space in use on each tier and in the metadata areas.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct Usage {
    pub fast_pages_used: u64,
    pub fast_pages_total: u64,
    pub fast_page_bytes: u64,
    pub ssd_blocks_used: u64,
    /// Free blocks held for `fallocate`d ranges not written yet (counted as used by statfs).
    #[serde(default)]
    pub ssd_blocks_promised: u64,
    pub ssd_blocks_total: u64,
    pub ssd_block_bytes: u64,
    pub journal_used_bytes: u64,
    pub journal_capacity_bytes: u64,
    pub checkpoint_generation: u64,
    /// Size of the newest checkpoint and of its slot: all metadata must fit one slot.
    #[serde(default)]
    pub checkpoint_used_bytes: u64,
    #[serde(default)]
    pub checkpoint_capacity_bytes: u64,
    /// The most residue units in use at once since the volume opened (`scrap`: never above
    /// `--scrap-mem`).
    #[serde(default)]
    pub fast_pages_peak: u64,
    /// Namespace ops applied but not journaled yet (`scrap`: until the next fsync, data
    /// commit or commit interval).
    #[serde(default)]
    pub namespace_ops_waiting: u64,
}

/// Counters plus gauges, as reported by [`crate::Volume::stats`].
#[derive(Clone, Debug)]
pub struct StatsSnapshot {
    pub counters: Vec<(Counter, u64)>,
    pub usage: Usage,
    pub recovery: RecoveryReport,
    pub io_backend: String,
}

impl StatsSnapshot {
    pub fn get(&self, counter: Counter) -> u64 {
        self.counters.iter().find(|(c, _)| *c == counter).map_or(0, |(_, v)| *v)
    }

    /// Share of the application's written bytes that went straight to the SSD (the rest
    /// went to the residue store; migration traffic is not counted).
    pub fn ssd_share(&self) -> f64 {
        let to_ssd = self.get(Counter::ssd_write_bytes).saturating_sub(self.get(Counter::migration_write_bytes)) as f64;
        let residue = (self.get(Counter::page_write_bytes) + self.get(Counter::upage_write_bytes)) as f64;
        if to_ssd + residue == 0.0 {
            0.0
        } else {
            to_ssd / (to_ssd + residue)
        }
    }
}

/// Everything `alignfs stat` shows, offline or from a mounted volume (which sends it as
/// JSON); one type so both paths print the same thing.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct VolumeReport {
    pub uuid: String,
    pub profile: String,
    /// The superblock's format version (`docs/format/superblock.md`).
    #[serde(default)]
    pub format_version: u32,
    /// The metadata is stored in place (`byte`), not in a journal and checkpoints.
    #[serde(default)]
    pub in_place_meta: bool,
    pub fast_device: String,
    pub ssd_device: String,
    pub residue: String,
    /// The residue store's short name ("fast tier", "scrap mem", "fragments", …).
    #[serde(default)]
    pub residue_name: String,
    /// Where the metadata becomes durable: "journal", "in place" or "KV store".
    #[serde(default)]
    pub metadata_store: String,
    /// Counter name → lifetime value.
    pub counters: std::collections::BTreeMap<String, u64>,
    pub ssd_share: f64,
    #[serde(flatten)]
    pub usage: Usage,
    /// Bytes of the SSD (an image file or block device) the host's page cache holds: what
    /// buffered reads keep in memory beside the residue tier. `None` where there is no
    /// such cache (an image in memory, an emulated device) or the kernel cannot say. In
    /// the report only, not in every stats snapshot: it walks the file's cached pages.
    #[serde(default)]
    pub ssd_cached_bytes: Option<u64>,
    pub recovery_us: u64,
    pub records_replayed: u64,
    pub torn_tail_dropped: bool,
    /// The SSD's own counters (a memory-semantic SSD's); empty for other devices.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub device_counters: Vec<DeviceCounter>,
    /// What the memory-semantic SSD's own recovery did when the volume was opened.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_recovery: Option<MssdRecovery>,
    /// Set by a mounted daemon.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub daemon: Option<DaemonInfo>,
}

/// One counter an SSD keeps of itself.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct DeviceCounter {
    pub name: String,
    pub value: u64,
    pub meaning: String,
}

/// The process serving a mounted volume.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct DaemonInfo {
    pub pid: u32,
    pub mountpoint: String,
    pub uptime_s: f64,
    /// How the front end serves requests, e.g. "page cache: reads, 4 request threads".
    #[serde(default)]
    pub front_end: String,
    /// Which transport carries FUSE requests, e.g. "io_uring, 2 queues x 2 entries".
    #[serde(default)]
    pub transport: String,
    /// Requests served through io_uring entries and read from /dev/fuse.
    #[serde(default)]
    pub io_uring_requests: u64,
    #[serde(default)]
    pub dev_fuse_requests: u64,
    /// Requests by kind ("LOOKUP", "WRITE", ...), most frequent first.
    #[serde(default)]
    pub requests_by_kind: Vec<(String, u64)>,
    /// Each kind's service times, from the request's arrival to its reply.
    #[serde(default)]
    pub request_latency: Vec<RequestLatency>,
    /// The daemon's resident memory: the residue store's pages in use and everything the
    /// daemon holds beside them (request and IO buffers, maps, code).
    #[serde(default)]
    pub resident_bytes: u64,
}

/// The calling process's resident memory (`/proc/self/statm`); 0 where it cannot be read.
pub fn resident_bytes() -> u64 {
    let pages = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|statm| statm.split_whitespace().nth(1)?.parse::<u64>().ok())
        .unwrap_or(0);
    // SAFETY: sysconf only reads a system constant.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    pages * u64::try_from(page).unwrap_or(4096)
}

/// Upper bounds, in seconds, of the buckets request service times are counted in (a last
/// bucket takes the rest). The vendored fuser counts FUSE requests with the same bounds.
pub const LATENCY_BOUNDS_S: [f64; 14] = [10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 100e-3, 1.0, 10.0];

/// One kind of request's service times, counted into [`LATENCY_BOUNDS_S`]'s buckets
/// without a lock.
#[derive(Debug, Default)]
pub struct LatencyCounter {
    counts: [AtomicU64; LATENCY_BOUNDS_S.len() + 1],
    sum_ns: AtomicU64,
}

impl LatencyCounter {
    pub fn record(&self, took: std::time::Duration) {
        let seconds = took.as_secs_f64();
        let bucket = LATENCY_BOUNDS_S.iter().position(|&bound| seconds <= bound).unwrap_or(LATENCY_BOUNDS_S.len());
        self.counts[bucket].fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(took.as_nanos() as u64, Ordering::Relaxed);
    }

    /// The histogram so far under the name `kind`; `None` before the first request.
    pub fn snapshot(&self, kind: &str) -> Option<RequestLatency> {
        let counts: Vec<u64> = self.counts.iter().map(|c| c.load(Ordering::Relaxed)).collect();
        (counts.iter().any(|&n| n > 0)).then(|| RequestLatency {
            kind: kind.to_string(),
            bounds_s: LATENCY_BOUNDS_S.to_vec(),
            counts,
            sum_s: self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9,
        })
    }
}

/// One kind of request's service times as a histogram: `counts[i]` fell at or below
/// `bounds_s[i]` and above the bound before it; the last count is those above every
/// bound.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RequestLatency {
    pub kind: String,
    pub bounds_s: Vec<f64>,
    pub counts: Vec<u64>,
    pub sum_s: f64,
}

impl VolumeReport {
    pub fn counter(&self, name: &str) -> u64 {
        self.counters.get(name).copied().unwrap_or(0)
    }
}
