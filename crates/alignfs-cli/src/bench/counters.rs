//! The engine counters a benchmark cell reports: which it tracks, and how a cell's
//! difference of them becomes its JSON.

use alignfs::stats::Counter;
use alignfs::Volume;

/// The engine's own counters a cell tracks, in the order of a cell's deltas.
pub(super) const TRACKED: [Counter; 17] = [
    Counter::app_write_bytes,
    Counter::ssd_write_bytes,
    Counter::page_write_bytes,
    Counter::upage_write_bytes,
    Counter::fg_rmw_reads,
    Counter::migrations_watermark,
    Counter::migrations_header_full,
    Counter::migrations_fast_full,
    Counter::migration_write_bytes,
    Counter::migrations_full,
    Counter::migrations_sync,
    Counter::migrations_idle,
    Counter::kv_block_bytes,
    Counter::kv_fragment_bytes,
    Counter::kv_onode_bytes,
    Counter::kv_attr_bytes,
    Counter::kv_name_bytes,
];

/// Every cause of a block migration, each counted by the profiles that have it.
pub(super) const MIGRATIONS: [&str; 6] =
    ["migrations_watermark", "migrations_header_full", "migrations_fast_full", "migrations_full", "migrations_sync", "migrations_idle"];

/// Write traffic below the engine's own counters: the memory-semantic SSD's flash
/// programs and byte-interface stores (`byte`).
pub(super) const DEVICE: [&str; 2] = ["flash_program_bytes", "byte_store_bytes"];

pub(super) fn tracked(volume: &Volume) -> Vec<u64> {
    let stats = volume.stats();
    let device = volume.device_counters();
    let own = TRACKED.iter().map(|&c| stats.get(c));
    own.chain(DEVICE.iter().map(|name| device.iter().find(|c| c.name == *name).map_or(0, |c| c.value))).collect()
}

pub(super) fn counters_json(delta: &[u64]) -> serde_json::Value {
    let mut map = serde_json::Map::new();
    let names = TRACKED.iter().map(|c| c.name()).chain(DEVICE);
    for (name, v) in names.zip(delta) {
        map.insert(name.into(), (*v).into());
    }
    let to_ssd = delta[1].saturating_sub(delta[8]) as f64;
    let residue = (delta[2] + delta[3]) as f64;
    map.insert("ssd_share".into(), (if to_ssd + residue > 0.0 { to_ssd / (to_ssd + residue) } else { 0.0 }).into());
    serde_json::Value::Object(map)
}
