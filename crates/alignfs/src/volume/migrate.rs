//! Migration: merge blocks' residue into whole SSD blocks, new ones (out of place) or their
//! own (in place, by sector where the volume allows: `sector_plan`); in batches, either
//! holding the blocks (a writer's own merges) or watching them (background work).

use std::sync::Arc;

use super::block_store::{wait_all, Placement, Target};
use super::{read, Engine};
use crate::device::{AlignedBuf, IoOp, IoRequest};
use crate::error::{Error, Result};
use crate::map::{BlockEntry, SsdBlock};
use crate::meta::{DataOp, FileKind, Ino, Inode, Op};
use crate::stats::Counter;

mod sector_plan;
use sector_plan::SectorPlan;

/// Merge one block's residue into its SSD block. The caller holds the block's range
/// lock. Returns whether anything moved.
pub(crate) fn merge_block_locked(engine: &Engine, inode: &Arc<Inode>, lblock: u64, cause: Counter) -> Result<bool> {
    Ok(merge_blocks_locked(engine, vec![(Arc::clone(inode), lblock)], cause)? > 0)
}

/// Merge the residue of several blocks into SSD blocks ([`write_staged`]), with
/// one flush and one journal record for all. The caller holds every block's range lock.
/// Returns how many blocks moved.
pub(crate) fn merge_blocks_locked(engine: &Engine, blocks: Vec<(Arc<Inode>, u64)>, cause: Counter) -> Result<u64> {
    let mut staged = Vec::with_capacity(blocks.len());
    for (inode, lblock) in blocks {
        match stage(engine, inode, lblock) {
            Ok(Some(one)) => staged.push(one),
            Ok(None) => {}
            Err(e) => {
                engine.blocks.buffers.give(staged.into_iter().map(|(_, image)| image));
                return Err(e);
            }
        }
    }
    let (work, images): (Vec<Staged>, Vec<AlignedBuf>) = staged.into_iter().unzip();
    if work.is_empty() {
        return Ok(0);
    }
    let targets = write_staged(engine, &work, images)?;
    commit_merged(engine, work, targets, cause)
}

/// Merge every block of `inode` that holds residue, a batch at a time. The caller holds
/// the whole file's range lock.
pub(crate) fn merge_file_locked(engine: &Engine, inode: &Arc<Inode>, cause: Counter) -> Result<()> {
    let held: Vec<u64> = inode.map.lock().iter().filter(|(_, e)| e.fast_page_count() > 0).map(|(&lb, _)| lb).collect();
    for batch in held.chunks(blocks_per_merge(engine)) {
        merge_blocks_locked(engine, batch.iter().map(|&lb| (Arc::clone(inode), lb)).collect(), cause)?;
    }
    Ok(())
}

/// [`merge_blocks_locked`] for blocks the caller does not hold. Each block is
/// locked only while its residue is copied out and while its merge is committed, so
/// writers are not held up by the IO and the flush in between. A block a writer holds
/// at either moment, or locks in between, keeps its residue (its new SSD block is freed
/// unused; a block to be merged in place is not written): those blocks are returned with
/// the count of blocks that moved.
pub(crate) fn merge_blocks_watched(engine: &Engine, blocks: Vec<(Arc<Inode>, u64)>, cause: Counter) -> Result<(u64, Vec<(Ino, u64)>)> {
    engine.migrator.merge_started();
    let result = start_watched_merge(engine, blocks).and_then(|merging| finish_watched_merge(engine, merging, cause));
    engine.migrator.merge_ended();
    result
}

/// The first half of [`merge_blocks_watched`]: copy out, read what the residue leaves
/// uncovered, write the blocks going to new places and flush.
fn start_watched_merge(engine: &Engine, blocks: Vec<(Arc<Inode>, u64)>) -> Result<WatchedMerge> {
    let mut merging = WatchedMerge::default();
    let mut images = Vec::new();
    let mut failed = None;
    for (inode, lblock) in blocks {
        // A block a writer is in, or another migration has, is left alone.
        let Some(guard) = inode.range.try_write_and_watch(lblock) else {
            merging.left.push((inode.ino, lblock));
            continue;
        };
        match stage(engine, Arc::clone(&inode), lblock) {
            Ok(Some((staged, image))) => {
                // The merge reads this SSD block after the lock is dropped; a writer
                // may then replace and free it. The pin keeps it allocated (so never
                // rewritten under the read) until the reads are done.
                if let Some(block) = staged.entry.ssd_block() {
                    engine.blocks.refs.pin(block.0);
                }
                merging.work.push(staged);
                images.push(image);
            }
            Ok(None) => inode.range.unwatch(lblock),
            Err(e) => {
                inode.range.unwatch(lblock);
                failed = Some(e);
                break;
            }
        }
        drop(guard);
    }
    let planned = match failed {
        Some(e) => {
            engine.blocks.buffers.give(images);
            Err(e)
        }
        None if merging.work.is_empty() => return Ok(merging),
        None => plan_writes(engine, &merging.work, images, true).and_then(|(targets, writes)| {
            // Writes to new blocks go out now, unlocked. A write over a block where it is
            // waits until the finish holds the block's lock again and knows nobody took
            // it meanwhile: then no reader, fsync or writer is in the block while it
            // changes. Blocks kept at home (uhs) are the exception: their writers do not
            // wait for a merge but write a pinned block elsewhere, and holding the lock
            // through the write and flush cost bench/uhs.py's mixed 4 KiB + 64 KiB writes
            // at queue depth 8 about a quarter of their throughput. A reader may read
            // such a block while it is rewritten; it lays the residue over what it reads.
            let now_in_place = engine.blocks.keeps_blocks_home();
            let (mut now, mut later) = (Vec::new(), Vec::new());
            for (write, target) in writes.into_iter().zip(&targets) {
                if target.new || now_in_place {
                    now.push((write, target.block));
                    later.push(None);
                } else {
                    later.push(Some(write));
                }
            }
            match write_out(engine, now) {
                Ok(()) => Ok((targets, later)),
                Err(e) => {
                    engine.blocks.release_new(&targets);
                    engine.blocks.buffers.give(later.into_iter().flatten().flat_map(BlockWrite::buffers));
                    Err(e)
                }
            }
        }),
    };
    engine.blocks.refs.unpin(merging.work.iter().filter_map(|s| s.entry.ssd_block()).map(|b| b.0));
    match planned {
        Ok((targets, in_place)) => {
            merging.targets = targets;
            merging.in_place = in_place;
        }
        Err(e) => {
            for staged in &merging.work {
                staged.inode.range.unwatch(staged.lblock);
            }
            return Err(e);
        }
    }
    Ok(merging)
}

/// The second half: write the blocks merged in place and commit those nobody wrote
/// meanwhile, a few at a time, holding their locks.
fn finish_watched_merge(engine: &Engine, merging: WatchedMerge, cause: Counter) -> Result<(u64, Vec<(Ino, u64)>)> {
    let WatchedMerge { work, targets, in_place, mut left } = merging;
    // How many blocks one record commits is the profile's: with a cheap journal, a few
    // at a time, so writers wait for the journal, and for these blocks, only as long as
    // one small record (or a few sectors' writes and a flush) takes.
    let chunk = engine.policy.merge_commit_batch();
    let mut rest = work.into_iter().zip(targets).zip(in_place);
    let mut moved = 0;
    loop {
        let part: Vec<((Staged, Target), Option<BlockWrite>)> = rest.by_ref().take(chunk).collect();
        if part.is_empty() {
            return Ok((moved, left));
        }
        let inodes: Vec<Arc<Inode>> = part.iter().map(|((s, _), _)| Arc::clone(&s.inode)).collect();
        let mut guards = Vec::with_capacity(part.len());
        let (mut kept, mut kept_targets, mut writes) = (Vec::new(), Vec::new(), Vec::new());
        for (((staged, target), write), inode) in part.into_iter().zip(&inodes) {
            match inode.range.try_write_watched(staged.lblock) {
                Some((guard, false)) => {
                    guards.push(guard);
                    writes.extend(write.map(|w| (w, target.block)));
                    kept.push(staged);
                    kept_targets.push(target);
                }
                _ => {
                    // Never journaled, so free at once; a block to be written in place
                    // was not touched.
                    engine.blocks.release_new(&[target]);
                    engine.blocks.buffers.give(write.into_iter().flat_map(BlockWrite::buffers));
                    engine.stats.add(Counter::migrations_dropped, 1);
                    left.push((staged.inode.ino, staged.lblock));
                }
            }
        }
        if kept.is_empty() {
            continue;
        }
        let committed = match write_out(engine, writes) {
            Ok(()) => commit_merged(engine, kept, kept_targets, cause),
            Err(e) => {
                engine.blocks.release_new(&kept_targets);
                Err(e)
            }
        };
        match committed {
            Ok(n) => moved += n,
            Err(e) => {
                drop(guards);
                for ((staged, target), write) in rest {
                    staged.inode.range.unwatch(staged.lblock);
                    engine.blocks.release_new(&[target]);
                    engine.blocks.buffers.give(write.into_iter().flat_map(BlockWrite::buffers));
                }
                return Err(e);
            }
        }
    }
}

/// Copy out a block's entry and its residue (laid over zeros). The caller holds the
/// block's range lock. `None` if the block holds no residue.
fn stage(engine: &Engine, inode: Arc<Inode>, lblock: u64) -> Result<Option<(Staged, AlignedBuf)>> {
    let Some(entry) = inode.map.lock().get(&lblock).cloned().filter(|e| e.fast_page_count() > 0) else { return Ok(None) };
    let mut image = engine.blocks.buffers.take(engine.geometry.block() as usize);
    image.fill(0);
    if let Err(e) = read::lay_residue(engine, &entry, &mut image) {
        engine.blocks.buffers.give([image]);
        return Err(e);
    }
    Ok(Some((Staged { inode, lblock, entry }, image)))
}

/// Write each staged block back ([`plan_writes`], then [`write_out`]): over its own SSD
/// block where the profile rewrites blocks in place and the file owns it alone, otherwise
/// to a new block. The caller holds every block's lock. Returns the targets, in order.
fn write_staged(engine: &Engine, work: &[Staged], images: Vec<AlignedBuf>) -> Result<Vec<Target>> {
    let (targets, writes) = plan_writes(engine, work, images, false)?;
    if let Err(e) = write_out(engine, writes.into_iter().zip(&targets).map(|(w, t)| (w, t.block)).collect()) {
        engine.blocks.release_new(&targets);
        return Err(e);
    }
    Ok(targets)
}

/// What a merge writes for one block.
enum BlockWrite {
    /// The whole image, to its target (a new block, or its own where the volume does not
    /// write by sector).
    Whole(AlignedBuf),
    /// Runs of whole 4 KiB sectors of the image, over the block where it is.
    Sectors(Vec<IoRequest>),
}

impl BlockWrite {
    fn buffers(self) -> Vec<AlignedBuf> {
        match self {
            BlockWrite::Whole(image) => vec![image],
            BlockWrite::Sectors(runs) => runs.into_iter().map(|r| r.buf).collect(),
        }
    }
}

/// Read what the staged blocks' residue leaves uncovered, lay the residue over it and
/// place each block. Returns the targets and what to write to each, in order; nothing is
/// written yet.
///
/// A block rewritten in place gets only the 4 KiB sectors its residue touches, and only
/// those the residue covers in part are read first ([`SectorPlan`]): a 4 KiB write costs
/// at most two sectors read and two written, not the whole block. A block going to a new
/// place is written whole, its residue over its SSD copy where the residue does not cover
/// it: the reads in flight together (WSBuffer's stage 1), then the writes (stage 2).
///
/// A block rewritten in place changes only under its residue, which stays valid until
/// the merge commits: a crash, or a reader that takes the block meanwhile, sees the
/// residue over whatever of the write landed. `pinned_here`: the caller pinned the
/// blocks' SSD copies (a watched merge, which writes blocks in place only once it holds
/// their locks again); otherwise a pinned copy is another merge's, which may be reading it
/// unlocked, and the block goes to a new one.
fn plan_writes(engine: &Engine, work: &[Staged], mut images: Vec<AlignedBuf>, pinned_here: bool) -> Result<(Vec<Target>, Vec<BlockWrite>)> {
    let block = engine.geometry.block();
    let may_rewrite = engine.blocks.rewrites_in_place();
    let placements: Vec<Placement> = work
        .iter()
        .map(|s| {
            let in_place = may_rewrite && (pinned_here || s.entry.ssd_block().is_none_or(|b| !engine.blocks.refs.is_pinned(b.0)));
            engine.blocks.placement(s.lblock, Some(&s.entry), in_place)
        })
        .collect();
    // Sector plans for blocks rewritten where they are.
    let by_sector = engine.blocks.writes_sectors();
    let sectors: Vec<Option<SectorPlan>> = work
        .iter()
        .zip(&placements)
        .map(|(s, p)| (by_sector && matches!(p, Placement::InPlace(_))).then(|| SectorPlan::new(engine, &s.entry)))
        .collect();
    // Reads: a whole block under residue that leaves part of it uncovered, or the sectors
    // a block rewritten in place has only partly covered.
    let mut reads = Vec::new();
    let mut read_for = Vec::new();
    for (i, s) in work.iter().enumerate() {
        let Some(ssd) = s.entry.ssd_block() else { continue };
        match &sectors[i] {
            Some(plan) => {
                for run in &plan.partial {
                    let buf = engine.blocks.buffers.take(run.len());
                    reads.push(IoRequest { op: IoOp::Read, offset_bytes: ssd.0 * block + run.start as u64, buf });
                    read_for.push((i, Some(run.start)));
                }
            }
            None if read::needs_fill(engine, &s.entry) => {
                reads.push(IoRequest { op: IoOp::Read, offset_bytes: ssd.0 * block, buf: engine.blocks.buffers.take(block as usize) });
                read_for.push((i, None));
            }
            None => {}
        }
    }
    let read_bytes: u64 = reads.iter().map(|r| r.buf.len() as u64).sum();
    let sector_read_bytes: u64 = read_for.iter().zip(&reads).filter(|((_, at), _)| at.is_some()).map(|(_, r)| r.buf.len() as u64).sum();
    let filled = if reads.is_empty() {
        Vec::new()
    } else {
        match engine.blocks.submit(reads).wait() {
            Ok(filled) => filled,
            Err(e) => {
                engine.blocks.buffers.give(images);
                return Err(e);
            }
        }
    };
    engine.stats.add(Counter::ssd_read_bytes, read_bytes);
    engine.stats.add(Counter::migration_read_bytes, read_bytes);
    engine.stats.add(Counter::migration_sector_read_bytes, sector_read_bytes);
    // A damaged block must not be merged into a new one with a fresh, valid checksum.
    let checked = read_for.iter().zip(&filled).try_for_each(|(&(i, at), disk)| match (work[i].entry.ssd_block(), at) {
        (Some(block), None) => engine.blocks.verify_read(block, disk),
        _ => Ok(()),
    });
    if let Err(e) = checked {
        engine.blocks.buffers.give(filled);
        engine.blocks.buffers.give(images);
        return Err(e);
    }
    for (&(i, at), mut disk) in read_for.iter().zip(filled) {
        match at {
            // The residue over the sectors read, back into the image.
            Some(start) => {
                let end = start + disk.len();
                for piece in &sectors[i].as_ref().expect("a sector read has a plan").pieces {
                    let (s, e) = (piece.start.max(start), piece.end.min(end));
                    if s < e {
                        disk[s - start..e - start].copy_from_slice(&images[i][s..e]);
                    }
                }
                images[i][start..end].copy_from_slice(&disk);
                engine.blocks.buffers.give([disk]);
            }
            None => {
                read::residue_pieces(engine, &work[i].entry, |range, _, _| disk[range.clone()].copy_from_slice(&images[i][range]));
                std::mem::swap(&mut images[i], &mut disk);
                engine.blocks.buffers.give([disk]);
            }
        }
    }
    // Delayed allocation: each new block goes to the SSD least busy at this moment.
    let new = placements.iter().filter(|p| matches!(p, Placement::New { .. })).count();
    let Some(targets) = engine.blocks.place(&placements, &engine.blocks.least_busy_members(new), 0) else {
        engine.blocks.buffers.give(images);
        return Err(Error::NoSpace);
    };
    let writes = images
        .into_iter()
        .zip(&sectors)
        .zip(&targets)
        .map(|((image, plan), target)| match plan {
            Some(plan) => {
                let runs = plan
                    .dirty
                    .iter()
                    .map(|run| {
                        let mut buf = engine.blocks.buffers.take(run.len());
                        buf.copy_from_slice(&image[run.clone()]);
                        IoRequest { op: IoOp::Write, offset_bytes: target.block.0 * block + run.start as u64, buf }
                    })
                    .collect();
                engine.blocks.buffers.give([image]);
                BlockWrite::Sectors(runs)
            }
            None => BlockWrite::Whole(image),
        })
        .collect();
    Ok((targets, writes))
}

/// Submit blocks' writes (whole images to `SsdBlock`s, coalesced into runs; sector runs as
/// they are), wait for all, then flush: the journal record that follows must not name
/// blocks, or a size over data, that a power cut could lose. On error the caller frees
/// any new blocks.
fn write_out(engine: &Engine, writes: Vec<(BlockWrite, SsdBlock)>) -> Result<()> {
    if writes.is_empty() {
        return Ok(());
    }
    let block = engine.geometry.block();
    let (mut whole_images, mut whole_blocks, mut sector_writes) = (Vec::new(), Vec::new(), Vec::new());
    let mut in_place_blocks = 0;
    for (write, target) in writes {
        match write {
            BlockWrite::Whole(image) => {
                whole_images.push(image);
                whole_blocks.push(target);
            }
            BlockWrite::Sectors(runs) => {
                in_place_blocks += 1;
                sector_writes.extend(runs);
            }
        }
    }
    let sector_write_bytes: u64 = sector_writes.iter().map(|w| w.buf.len() as u64).sum();
    let whole_bytes = block * whole_blocks.len() as u64;
    let writes = coalesce_writes(engine, whole_images, &whole_blocks);
    let mut batches = Vec::new();
    if !writes.is_empty() {
        batches.push(engine.blocks.submit(writes));
    }
    if !sector_writes.is_empty() {
        batches.push(engine.blocks.submit_sectors(sector_writes));
    }
    let buffers = wait_all(batches)?;
    buffers.iter().for_each(|buf| engine.stats.ssd_write(buf.len() as u64));
    engine.blocks.buffers.give(buffers);
    engine.blocks.written();
    engine.stats.add(Counter::migration_write_bytes, whole_bytes + sector_write_bytes);
    engine.stats.add(Counter::migration_sector_write_bytes, sector_write_bytes);
    engine.stats.add(Counter::migrations_in_place, in_place_blocks);
    engine.blocks.flush()
}

/// One write per run of consecutive new blocks (`images[i]` goes to `targets[i]`): the
/// allocator hands a batch long free runs, so a batch of small blocks goes out in a
/// few large IOs rather than one IO per block.
fn coalesce_writes(engine: &Engine, images: Vec<AlignedBuf>, targets: &[SsdBlock]) -> Vec<IoRequest> {
    let block = engine.geometry.block() as usize;
    let indexed: Vec<(SsdBlock, usize)> = targets.iter().copied().zip(0..).collect();
    let mut images: Vec<Option<AlignedBuf>> = images.into_iter().map(Some).collect();
    let writes = engine
        .blocks
        .runs(&indexed)
        .into_iter()
        .map(|run| {
            let buf = match run[..] {
                [&(_, i)] => images[i].take().expect("each image goes out once"),
                _ => {
                    let mut buf = engine.blocks.buffers.take(run.len() * block);
                    for (k, &&(_, i)) in run.iter().enumerate() {
                        buf[k * block..(k + 1) * block].copy_from_slice(images[i].as_ref().expect("each image goes out once"));
                    }
                    buf
                }
            };
            IoRequest { op: IoOp::Write, offset_bytes: run[0].0 .0 * block as u64, buf }
        })
        .collect();
    engine.blocks.buffers.give(images.into_iter().flatten());
    writes
}

/// Journal the staged blocks as moved to `targets` (one record) and free their
/// residue. The caller holds every block's range lock, and nothing wrote them since
/// they were staged.
fn commit_merged(engine: &Engine, mut work: Vec<Staged>, mut targets: Vec<Target>, cause: Counter) -> Result<u64> {
    loop {
        let mut ops: Vec<Op> = work
            .iter()
            .zip(&targets)
            .map(|(staged, t)| {
                Op::Data(DataOp::Map { ino: staged.inode.ino, lblock: staged.lblock, entry: Some(BlockEntry::whole(t.block)) })
            })
            .collect();
        let files: std::collections::BTreeMap<Ino, &Arc<Inode>> = work.iter().map(|s| (s.inode.ino, &s.inode)).collect();
        engine.policy.merge_ops(&files.into_values().collect::<Vec<_>>(), &mut ops);
        match engine.commit(&ops) {
            Ok(freed) => {
                engine.release_freed(freed);
                break;
            }
            // A file was removed while its blocks were being merged: drop them.
            Err(Error::NotFound) => {
                let gone: Vec<usize> = (0..work.len()).filter(|&i| engine.meta.get(work[i].inode.ino).is_none()).collect();
                if gone.is_empty() {
                    engine.blocks.release_new(&targets);
                    return Err(Error::NotFound);
                }
                for &i in gone.iter().rev() {
                    work.remove(i);
                    engine.blocks.release_new(&[targets.remove(i)]);
                }
                if work.is_empty() {
                    return Ok(0);
                }
            }
            Err(e) => {
                engine.blocks.release_new(&targets);
                return Err(e);
            }
        }
    }
    engine.stats.add(cause, work.len() as u64);
    Ok(work.len() as u64)
}

/// Migrate every block holding residue (UHS's light-load migration).
pub(crate) fn drain(engine: &Engine, cause: Counter) -> Result<u64> {
    if engine.residue.used_units() == 0 {
        return Ok(0);
    }
    merge_some(engine, engine.residue.capacity_units(), cause)
}

/// Blocks one migration batch merges: 8 MiB of them.
pub(crate) fn blocks_per_merge(engine: &Engine) -> usize {
    ((8 << 20) / engine.geometry.block()).max(1) as usize
}

/// Migrate the blocks holding the most fast pages until `want_free` pages are free
/// (or no candidate is left), a batch at a time. Blocks whose range is busy are
/// skipped.
pub(crate) fn merge_some(engine: &Engine, want_free: u64, cause: Counter) -> Result<u64> {
    let mut candidates: Vec<(usize, Arc<Inode>, u64)> = Vec::new();
    for inode in engine.meta.snapshot().into_iter().filter(|i| i.kind == FileKind::File) {
        let blocks: Vec<(usize, u64)> =
            inode.map.lock().iter().filter(|(_, e)| e.fast_page_count() > 0).map(|(&lb, e)| (e.fast_page_count(), lb)).collect();
        candidates.extend(blocks.into_iter().map(|(count, lb)| (count, Arc::clone(&inode), lb)));
    }
    candidates.sort_by_key(|c| std::cmp::Reverse(c.0));
    let mut migrated = 0;
    let mut rest = candidates.as_slice();
    loop {
        let free = engine.residue.capacity_units() - engine.residue.used_units();
        if free >= want_free || rest.is_empty() {
            return Ok(migrated);
        }
        let (mut batch, mut units) = (Vec::new(), 0);
        while let Some(((count, inode, lblock), tail)) = rest.split_first() {
            rest = tail;
            batch.push((Arc::clone(inode), *lblock));
            units += *count as u64;
            if batch.len() >= blocks_per_merge(engine) || free + units >= want_free {
                break;
            }
        }
        // Blocks a writer is in are skipped: the next round sees them again.
        migrated += merge_blocks_watched(engine, batch, cause)?.0;
    }
}

/// A block being merged: its entry when its residue was copied out.
struct Staged {
    inode: Arc<Inode>,
    lblock: u64,
    entry: BlockEntry,
}

/// Blocks being merged, watched until their merge is committed: where each goes, the
/// write still to make over those merged in place, and the blocks left out.
#[derive(Default)]
struct WatchedMerge {
    work: Vec<Staged>,
    targets: Vec<Target>,
    in_place: Vec<Option<BlockWrite>>,
    left: Vec<(Ino, u64)>,
}

#[cfg(test)]
mod tests;
