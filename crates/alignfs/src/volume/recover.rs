//! Recovering a volume's metadata at open: the newest checkpoint with the journal
//! replayed over it, the in-place lines with their redo area, or the KV store's records.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use super::{Devices, RecoveryReport, VolumeOptions};
use crate::device::mssd::MemorySemanticSsd;
use crate::device::power_loss::PowerLog;
use crate::device::{BlockDevice, ByteTier};
use crate::error::{Error, Result};
use crate::geometry::MetaLayout;
use crate::journal::{decode_ops, CheckpointSlots, Journal, JournalStore, MetaMedium, MetaStore, PmemWindow, Replay, SsdWindow};
use crate::kv::{FragmentBlock, FragmentLog, KvMeta};
use crate::layout::{BlockChecksums, Superblock};
use crate::lines::LineStore;
use crate::map::SsdBlock;
use crate::meta::{apply, Ino, MetaState};
use crate::profile::Promise;

/// Where a volume's journal and checkpoints live.
#[derive(Clone, Copy)]
pub(super) enum MetaDevice<'a> {
    Fast(&'a Arc<dyn ByteTier>),
    /// The metadata area at the start of the SSD, for profiles without a fast tier.
    Ssd(&'a Arc<dyn BlockDevice>),
    /// The metadata area at the start of a memory-semantic SSD (`ssd`, its block
    /// interface), small writes through `byte` when the byte interface is in use.
    MemorySemantic {
        ssd: &'a Arc<dyn BlockDevice>,
        byte: Option<&'a Arc<MemorySemanticSsd>>,
    },
}

/// The journal and checkpoint slots on their device.
pub(super) fn windows(device: MetaDevice<'_>, layout: &MetaLayout, name: &str) -> Result<(Box<dyn MetaMedium>, CheckpointSlots)> {
    let window = |offset: u64, len: u64| -> Result<Box<dyn MetaMedium>> {
        Ok(match device {
            MetaDevice::Fast(fast) => Box::new(PmemWindow::new(Arc::clone(fast), offset, len)),
            MetaDevice::Ssd(ssd) => Box::new(SsdWindow::open(Arc::clone(ssd), offset, len)?),
            MetaDevice::MemorySemantic { ssd, byte } => {
                Box::new(SsdWindow::on_memory_semantic(Arc::clone(ssd), byte.cloned(), offset, len)?)
            }
        })
    };
    let journal = window(layout.journal_offset, layout.journal_bytes)?;
    let a = window(layout.checkpoint_a_offset, layout.checkpoint_bytes)?;
    let b = window(layout.checkpoint_b_offset, layout.checkpoint_bytes)?;
    let slots = CheckpointSlots::new(a, b, [layout.checkpoint_a_offset, layout.checkpoint_b_offset], name.to_string());
    Ok((journal, slots))
}

/// The metadata as the store the profile keeps it in left it, replayed to its last
/// commit.
pub(super) fn recover_metadata(
    devices: &Devices,
    superblock: &Superblock,
    meta_name: &str,
    options: &VolumeOptions,
    started: Instant,
) -> Result<Recovered> {
    let ssd = devices.ssd();
    Ok(match (devices, superblock.in_place_meta) {
        (Devices::SsdAndKvStore { dir, syncs, .. }, _) => recover_kv(dir, syncs.clone(), superblock, options, started)?,
        (Devices::MemorySemanticSsd { device }, true) => {
            recover_lines(&ssd, Some(device).filter(|_| options.byte_interface), superblock, meta_name, options, started)?
        }
        (_, true) => recover_lines(&ssd, None, superblock, meta_name, options, started)?,
        (Devices::FastTierAndSsd { fast, .. }, _) => recover_journal(MetaDevice::Fast(fast), superblock, meta_name, options, started)?,
        (Devices::MemorySemanticSsd { device }, _) => {
            let meta_device = MetaDevice::MemorySemantic { ssd: &ssd, byte: options.byte_interface.then_some(device) };
            recover_journal(meta_device, superblock, meta_name, options, started)?
        }
        (Devices::Ssds { .. }, _) => recover_journal(MetaDevice::Ssd(&ssd), superblock, meta_name, options, started)?,
    })
}

/// The metadata as recovered from its store, and what the rest of opening needs of it.
pub(super) struct Recovered {
    pub meta: MetaState,
    pub store: Box<dyn MetaStore>,
    /// The counters as last persisted.
    pub counters: Vec<u64>,
    pub recovery: RecoveryReport,
    /// The KV store's fragment records, and the blocks whose pages are rebuilt from them.
    pub fragments: Option<(Arc<FragmentLog>, Vec<FragmentBlock>)>,
    pub checksums: Option<BlockChecksums>,
}

/// The newest checkpoint with the journal replayed over it.
fn recover_journal(
    device: MetaDevice<'_>,
    superblock: &Superblock,
    meta_name: &str,
    options: &VolumeOptions,
    started: Instant,
) -> Result<Recovered> {
    let geometry = superblock.geometry;
    let (journal_window, mut checkpoints) = windows(device, &superblock.layout, meta_name)?;
    let checkpoint = checkpoints.load(geometry.pages_per_block(), geometry.page_bytes)?;
    let replay = Journal::replay(journal_window.as_ref(), checkpoint.next_seq, meta_name)?;
    let meta = checkpoint.state;
    let orphans = apply_records(&meta, &replay, superblock, meta_name)?;
    let journal = Journal::resume(journal_window, replay.end, replay.next_seq);
    let recovery = RecoveryReport {
        duration: started.elapsed(),
        checkpoint_generation: checkpoint.generation,
        records_replayed: replay.payloads.len() as u64,
        torn_tail_dropped: replay.torn_tail.is_some(),
        orphans_dropped: orphans.len() as u64,
        clean: replay.payloads.is_empty(),
    };
    let mut store = JournalStore::new(journal, checkpoints);
    // Where writes are durable on fsync, namespace ops are too (buffered I/O's promise).
    if superblock.profile.promise() == Promise::OnSync && !options.commit_interval.is_zero() {
        store = store.deferring_namespace();
    }
    let store = Box::new(store);
    Ok(Recovered { meta, store, counters: checkpoint.counters, recovery, fragments: None, checksums: None })
}

/// The state the in-place records hold.
fn recover_lines(
    ssd: &Arc<dyn BlockDevice>,
    byte: Option<&Arc<MemorySemanticSsd>>,
    superblock: &Superblock,
    meta_name: &str,
    options: &VolumeOptions,
    started: Instant,
) -> Result<Recovered> {
    let geometry = superblock.geometry;
    let (store, loaded) = LineStore::open(
        Arc::clone(ssd),
        byte.cloned(),
        &superblock.layout,
        superblock.uuid,
        meta_name.to_string(),
        geometry.pages_per_block(),
        geometry.page_bytes,
        options.read_only,
    )?;
    let recovery = RecoveryReport {
        duration: started.elapsed(),
        checkpoint_generation: 0,
        records_replayed: u64::from(loaded.redo_replayed),
        torn_tail_dropped: false,
        orphans_dropped: loaded.orphans.len() as u64,
        clean: !loaded.redo_replayed,
    };
    Ok(Recovered { meta: loaded.state, store: Box::new(store), counters: loaded.counters, recovery, fragments: None, checksums: None })
}

/// The records of the volume's KV store, with what a crash left behind (objects without a
/// name, fragments no record names) deleted unless the volume opens read-only.
fn recover_kv(
    dir: &Path,
    syncs: Option<Arc<PowerLog>>,
    superblock: &Superblock,
    options: &VolumeOptions,
    started: Instant,
) -> Result<Recovered> {
    let mut store = KvMeta::open(dir, superblock.uuid, syncs)?;
    let loaded = store.load(superblock.geometry.block_bytes)?;
    if !options.read_only {
        store.forget(&loaded.orphans, &loaded.stray_fragments)?;
    }
    let checksums = BlockChecksums::new(superblock.ssd_blocks());
    for &(block, sum) in &loaded.checksums {
        if !checksums.set(SsdBlock(block), sum) {
            let problem = format!("a record names SSD block {block}, beyond the volume's {}", superblock.ssd_blocks());
            return Err(Error::corrupt("KV record", &dir.display().to_string(), 0, problem));
        }
    }
    let recovery = RecoveryReport {
        duration: started.elapsed(),
        checkpoint_generation: 0,
        records_replayed: 0,
        torn_tail_dropped: false,
        orphans_dropped: loaded.orphans.len() as u64,
        clean: loaded.orphans.is_empty() && loaded.stray_fragments.is_empty(),
    };
    let fragments = Some((store.fragment_log(), loaded.fragment_blocks));
    let counters = store.counters()?;
    Ok(Recovered { meta: loaded.state, store: Box::new(store), counters, recovery, fragments, checksums: Some(checksums) })
}

/// Apply the replayed journal records to the checkpoint's state, then drop the inodes a
/// crash left without a name. Returns those.
fn apply_records(meta: &MetaState, replay: &Replay, superblock: &Superblock, meta_name: &str) -> Result<Vec<Ino>> {
    let (ppb, page_bytes) = (superblock.geometry.pages_per_block(), superblock.geometry.page_bytes);
    for (offset, payload) in &replay.payloads {
        let at = superblock.layout.journal_offset + offset;
        let ops = decode_ops(payload, ppb, page_bytes).map_err(|s| Error::corrupt("journal record", meta_name, at, s.to_string()))?;
        for op in &ops {
            apply(meta, op).map_err(|e| Error::corrupt("journal record", meta_name, at, e.0))?;
        }
    }
    let orphans: Vec<Ino> = meta.snapshot().iter().filter(|i| i.data.lock().attr.nlink == 0).map(|i| i.ino).collect();
    for ino in &orphans {
        meta.inodes.write().remove(ino);
    }
    Ok(orphans)
}
