//! The write path: partition a write, bind it to new units, send whole blocks to the SSD
//! and the residue to the residue store while they are in flight, then commit the map edits.

use super::{eof, migrate, read};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::block_store::{wait_all, InFlight, Placement};
use super::Engine;
use crate::device::{IoOp, IoRequest};
use crate::error::{Error, Result};
use crate::map::{BlockEntry, PageNo, SsdBlock};
use crate::meta::{now_ns, DataOp, FileKind, Ino, Inode, Op};
use crate::partition::{next_entry, partition, BlockAction, PageTarget, Plan, Residue};
use crate::residue::UnitRequest;
use crate::stats::Counter;
use smallvec::SmallVec;

/// Largest file offset: keeps every block index and byte position far from overflow.
pub const MAX_FILE_BYTES: u64 = 1 << 52;

/// Write `data` at `offset`. Returns when the write is as durable as the profile
/// promises ([`crate::profile::Promise`]): for `orch`, residue persisted, SSD IOs
/// completed and flushed, map edit journaled; for `scrap`, after the next fsync.
pub(super) fn write(engine: &Engine, ino: Ino, offset: u64, data: &[u8]) -> Result<usize> {
    let inode = engine.file(ino)?;
    write_object(engine, &inode, offset, data, true)
}

/// Write back pages a page cache held (FUSE's write-back of cached pages, a shared
/// mapping's stores). Where the profile picks the interface by a page's modified ratio
/// (`byte`: [`crate::profile::Policy::write_back_line_share`]), each whole block inside
/// the file is compared, 64 bytes at a time, with the block as the volume holds it:
/// an unchanged block is not written, one with few changed lines sends each run of
/// them as a small write, and the rest go whole. Otherwise the same as
/// [`Volume::write`].
pub(super) fn write_back(engine: &Engine, ino: Ino, offset: u64, data: &[u8]) -> Result<usize> {
    let inode = engine.file(ino)?;
    match engine.policy.write_back_line_share() {
        Some(share) => write_back_by_lines(engine, &inode, offset, data, share),
        None => write_object(engine, &inode, offset, data, true),
    }
}

/// Make the file durable. Where the profile makes every write durable when it
/// returns (`orch`: its SSD blocks were flushed before its map edit was journaled), this
/// only retries a flush that failed. Where writes are durable on fsync (`scrap`), the
/// profile first writes the file's residue to the SSD and journals its size.
///
/// It flushes the SSD only for the file's own blocks overwritten in place, not for SSD
/// writes nobody acknowledged yet: fsync would then wait for background migration's
/// writes and flush.
pub(super) fn fsync(engine: &Engine, ino: Ino) -> Result<()> {
    let inode = engine.get(ino)?;
    if inode.kind == FileKind::File && !engine.options.read_only {
        engine.policy.fsync(engine, &inode)?;
    }
    // Namespace ops still held back go with it, as a file system's log commits whole:
    // the file's name and directory, and everything that returned before them.
    engine.sync_deferred()?;
    if inode.unflushed_overwrite.swap(false, Ordering::SeqCst) {
        engine.blocks.flush().inspect_err(|_| inode.unflushed_overwrite.store(true, Ordering::SeqCst))
    } else if engine.blocks.flush_failed() {
        engine.blocks.flush()
    } else {
        engine.stats.add(Counter::ssd_flushes_skipped, 1);
        Ok(())
    }
}

/// Write `data` at `offset` of an object: lock its range, run the write path, count
/// it. `extend` journals the new size and mtime with the map edits (a file); without
/// it the write journals map edits alone and must stay within the size (a block
/// volume).
pub(super) fn write_object(engine: &Engine, inode: &Arc<Inode>, offset: u64, data: &[u8], extend: bool) -> Result<usize> {
    engine.check_writable()?;
    if data.is_empty() {
        return Ok(0);
    }
    let end = offset.checked_add(data.len() as u64).filter(|&e| e <= MAX_FILE_BYTES).ok_or(Error::FileTooLarge)?;
    let block = engine.geometry.block();
    // The block holding EOF joins the lock when the write leaves a gap after it, so a
    // failed write can clean that block (see `write_locked`).
    loop {
        let size = inode.size();
        if !extend && end > size {
            return Err(Error::OutOfRange { offset, len: data.len() as u64, size });
        }
        if end > size && inode.stale_tail.load(Ordering::SeqCst) {
            let _whole = inode.range.write(0, u64::MAX);
            eof::clear_stale_tail(engine, inode)?;
            continue;
        }
        let first = if offset > size { (size / block).min(offset / block) } else { offset / block };
        let _guard = inode.range.write(first, (end - 1) / block);
        if inode.size() != size {
            continue;
        }
        write_locked(engine, inode, offset, data, extend)?;
        count_app_write(engine, inode, data.len());
        return Ok(data.len());
    }
}

/// [`Volume::write_back`] where the profile writes back by modified ratio: whole
/// blocks inside the file, under their range lock, by line; anything else (a partial
/// block, a page past the end) as an ordinary write.
pub(super) fn write_back_by_lines(engine: &Engine, inode: &Arc<Inode>, offset: u64, data: &[u8], share: f64) -> Result<usize> {
    engine.check_writable()?;
    let block = engine.geometry.block();
    let end = offset.checked_add(data.len() as u64).ok_or(Error::FileTooLarge)?;
    if data.is_empty() || offset % block != 0 || end % block != 0 {
        return write_object(engine, inode, offset, data, true);
    }
    let guard = inode.range.write(offset / block, (end - 1) / block);
    if end > inode.size() {
        drop(guard);
        return write_object(engine, inode, offset, data, true);
    }
    let block_bytes = block as usize;
    let most_lines = ((block_bytes / WRITE_BACK_LINE) as f64 * share) as usize;
    let mut current = vec![0u8; block_bytes];
    // Consecutive blocks that go whole are written together.
    let mut whole: Option<std::ops::Range<usize>> = None;
    let write_whole = |blocks: std::ops::Range<usize>| {
        let bytes = blocks.start * block_bytes..blocks.end * block_bytes;
        write_locked(engine, inode, offset + bytes.start as u64, &data[bytes], true)
    };
    for (i, page) in data.chunks(block_bytes).enumerate() {
        let entry = inode.map.lock().get(&(offset / block + i as u64)).cloned();
        read::materialize(engine, entry.as_ref(), &mut current)?;
        let changed = changed_line_runs(&current, page);
        let lines: usize = changed.iter().map(|run| run.len() / WRITE_BACK_LINE).sum();
        if lines > most_lines {
            whole = Some(whole.map_or(i..i + 1, |run| run.start..i + 1));
            continue;
        }
        if let Some(blocks) = whole.take() {
            write_whole(blocks)?;
        }
        let at = offset + (i * block_bytes) as u64;
        for run in &changed {
            write_locked(engine, inode, at + run.start as u64, &page[run.clone()], true)?;
        }
        let counter = if changed.is_empty() { Counter::write_back_blocks_unchanged } else { Counter::write_back_blocks_by_line };
        engine.stats.add(counter, 1);
    }
    if let Some(blocks) = whole {
        write_whole(blocks)?;
    }
    count_app_write(engine, inode, data.len());
    Ok(data.len())
}

/// One write the application made, of `bytes`, in the volume's and the object's counters.
pub(super) fn count_app_write(engine: &Engine, inode: &Inode, bytes: usize) {
    inode.io.wrote(bytes as u64);
    engine.stats.add(Counter::app_writes, 1);
    engine.stats.add(Counter::app_write_bytes, bytes as u64);
}

/// The write path. The caller holds the range lock over the written blocks (and the
/// block holding EOF when the write starts past it).
pub(super) fn write_locked(engine: &Engine, inode: &Arc<Inode>, offset: u64, data: &[u8], extend: bool) -> Result<()> {
    let old_size = inode.size();
    let (plan, pages, entries) = plan_write(engine, inode, offset, data.len() as u64, old_size)?;
    let result = execute(engine, inode, &plan, pages, &entries, data);
    if result.is_err() && offset + data.len() as u64 > old_size {
        // In-place residue writes may have landed past EOF (the caller holds the EOF
        // block's lock when the write extends the file): keep those bytes zero.
        eof::zero_beyond_eof(engine, inode, old_size);
    }
    let (mut ops, redeemed) = result?;
    if extend {
        ops.push(Op::Data(DataOp::Extend { ino: inode.ino, size: plan.new_size, mtime: now_ns() }));
    }
    let mut freed = match engine.commit(&ops) {
        Ok(freed) => freed,
        Err(e) => {
            // Zero blocks the commit did not replace keep the promises redeemed for them.
            let map = inode.map.lock();
            let kept = plan.blocks.iter().filter(|b| b.needs_ssd_block() && map.get(&b.lblock).is_some_and(BlockEntry::is_zeros));
            engine.blocks.refs.restore_promises(kept.count() as u64);
            return Err(e);
        }
    };
    // The zero blocks whose promises the allocation redeemed hold none any more.
    freed.promises -= redeemed;
    engine.release_freed(freed);
    Ok(())
}

/// Partition, merging overflowing upages first and making room in the fast tier; with
/// no room at all, fall back to the read-modify-write plan. Returns the plan, its new
/// pages and the current entry of each planned block (stable: the caller holds the
/// range lock).
pub(super) fn plan_write(
    engine: &Engine,
    inode: &Arc<Inode>,
    offset: u64,
    len: u64,
    size: u64,
) -> Result<(Plan, Vec<PageNo>, Vec<Option<BlockEntry>>)> {
    let mut rules = engine.policy.write_rules(len);
    loop {
        let (plan, entries) = {
            let map = inode.map.lock();
            let plan = partition(offset, len, size, &engine.geometry, rules, |lb| map.get(&lb));
            let entries: Vec<Option<BlockEntry>> = plan.blocks.iter().map(|b| map.get(&b.lblock).cloned()).collect();
            (plan, entries)
        };
        if !plan.merge_first.is_empty() {
            for &lblock in &plan.merge_first {
                migrate::merge_block_locked(engine, inode, lblock, Counter::migrations_header_full)?;
            }
            continue;
        }
        let requests = unit_requests(inode.ino, &plan, engine.geometry.page_bytes);
        if requests.is_empty() {
            return Ok((plan, Vec::new(), entries));
        }
        match reserve_pages(engine, &requests) {
            Some(pages) => return Ok((plan, pages, entries)),
            // No room even after migrating: whole blocks go direct, then nothing is
            // residue (the slow path).
            None if rules.residue == Residue::All => rules.residue = Residue::Partial,
            None => rules.residue = Residue::Forbidden,
        }
    }
}

/// Fast pages for a write: free ones, or ones the writer frees by migrating other
/// blocks (it waits for migration); `None` if even that finds nothing.
pub(super) fn reserve_pages(engine: &Engine, requests: &[UnitRequest]) -> Option<Vec<PageNo>> {
    if let Some(pages) = engine.residue.allocate(requests) {
        if engine.residue.used_units() as f64 > engine.options.migrate_high * engine.residue.capacity_units() as f64 {
            engine.migrator.wake();
        }
        return Some(pages);
    }
    engine.migrator.wake();
    let drain: Vec<(Arc<Inode>, u64)> =
        engine.residue.blocks_to_drain(requests).into_iter().filter_map(|(ino, lblock)| Some((engine.meta.get(ino)?, lblock))).collect();
    let migrated = if drain.is_empty() {
        let target = requests.len() as u64 + engine.residue.capacity_units() / 8;
        migrate::merge_some(engine, target, Counter::migrations_fast_full)
    } else {
        migrate::merge_blocks_watched(engine, drain, Counter::migrations_fast_full).map(|(moved, _)| moved)
    };
    if let Err(e) = migrated {
        tracing::warn!("migration for a waiting writer: {e}");
    }
    engine.residue.allocate(requests)
}

/// Run a plan's IOs and return its map edits, and how many of the SSD blocks it took
/// were promised to the zero blocks it replaces. SSD writes are in flight while the
/// residue is copied into the residue store on this thread.
pub(super) fn execute(
    engine: &Engine,
    inode: &Arc<Inode>,
    plan: &Plan,
    pages: Vec<PageNo>,
    entries: &[Option<BlockEntry>],
    data: &[u8],
) -> Result<(Vec<Op>, u64)> {
    let Placements { placements, members, redeem } = choose_placements(engine, plan, entries);
    let Some(placed) = engine.blocks.place(&placements, &members, redeem) else {
        engine.release(&pages, &[]);
        return Err(Error::NoSpace);
    };
    let undo = |e: Error| {
        engine.release(&pages, &[]);
        engine.blocks.release_new(&placed);
        engine.blocks.refs.restore_promises(redeem);
        e
    };
    let targets: Vec<SsdBlock> = placed.iter().map(|t| t.block).collect();
    let moved = placed.iter().filter(|t| t.new).count();
    let in_flight = submit_block_images(engine, plan, entries, &targets, data).map_err(&undo)?;
    let (bound_pages, mut full) = store_plan_residue(engine, plan, &pages, data);
    if !in_flight.is_empty() {
        let written = wait_all(in_flight).map_err(&undo)?;
        engine.blocks.written();
        written.iter().for_each(|buf| engine.stats.ssd_write(buf.len() as u64));
        engine.blocks.buffers.give(written);
        if moved == 0 && engine.blocks.flushes_on_sync() {
            // Only overwrites in place: the file's next fsync flushes them.
            inode.unflushed_overwrite.store(true, Ordering::SeqCst);
        } else {
            // Data before metadata: the map edit must not outlive a power cut that the
            // blocks it points at did not (and a write durable on return is flushed).
            engine.blocks.flush().map_err(&undo)?;
        }
        engine.stats.add(Counter::ssd_overwrites_in_place, (targets.len() - moved) as u64);
    }
    let ops = map_ops(engine, inode, plan, entries, &bound_pages, &targets);
    full.dedup();
    engine.policy.residue_stored(engine, inode, plan, &full);
    Ok((ops, redeem))
}

/// Where the plan's SSD blocks go, which SSD each new one is on, and how many of them
/// take the place of zero blocks (whose promised space they redeem).
struct Placements {
    placements: Vec<Placement>,
    members: Vec<usize>,
    redeem: u64,
}

fn choose_placements(engine: &Engine, plan: &Plan, entries: &[Option<BlockEntry>]) -> Placements {
    // Where a write need only be durable after a sync, a block the file owns alone is
    // overwritten where it is: a crash may then leave any mix of its old and new bytes,
    // which that promise allows, and the map edit, its journal record and the flush are
    // spared. So is it where the profile keeps blocks at home (a block volume, which
    // promises no more than a disk), flushed before the write returns. Not a block a
    // merge is still reading (pinned after it dropped the lock we hold).
    let in_place = engine.blocks.rewrites_in_place();
    let mut placements: Vec<(u64, Placement)> = plan
        .blocks
        .iter()
        .zip(entries)
        .filter(|(b, _)| b.needs_ssd_block())
        .map(|(b, e)| {
            let may_rewrite =
                in_place && e.as_ref().and_then(BlockEntry::ssd_block).is_none_or(|block| !engine.blocks.refs.is_pinned(block.0));
            (b.lblock, engine.blocks.placement(b.lblock, e.as_ref(), may_rewrite))
        })
        .collect();
    // Blocks that earlier merges moved elsewhere would cut the write into many small
    // IOs: then it takes a long run of new blocks instead, as out of place always does.
    // (Blocks kept at home are not moved by merges.)
    let rewritten: Vec<(SsdBlock, ())> =
        placements.iter().filter_map(|(_, p)| if let Placement::InPlace(b) = p { Some((*b, ())) } else { None }).collect();
    if !engine.blocks.keeps_blocks_home()
        && rewritten.len() > 1
        && engine.blocks.runs(&rewritten).len() > engine.blocks.runs_when_consecutive(rewritten.len())
    {
        placements.iter_mut().for_each(|(_, p)| *p = Placement::New { home: None });
    }
    // New blocks spread over the SSDs by logical block.
    let members: Vec<usize> = placements
        .iter()
        .filter(|(_, p)| matches!(p, Placement::New { .. }))
        .map(|(lblock, _)| (lblock % engine.blocks.ssd_count() as u64) as usize)
        .collect();
    let redeem =
        plan.blocks.iter().zip(entries).filter(|(b, e)| b.needs_ssd_block() && e.as_ref().is_some_and(BlockEntry::is_zeros)).count() as u64;
    Placements { placements: placements.into_iter().map(|(_, p)| p).collect(), members, redeem }
}

/// The map edits that point the plan's blocks at their new homes and residue.
fn map_ops(
    engine: &Engine,
    inode: &Inode,
    plan: &Plan,
    entries: &[Option<BlockEntry>],
    bound_pages: &[Vec<PageNo>],
    targets: &[SsdBlock],
) -> Vec<Op> {
    let mut next_block = targets.iter();
    plan.blocks
        .iter()
        .zip(entries)
        .zip(bound_pages)
        .map(|((bp, current), bound)| {
            let block = bp.needs_ssd_block().then(|| *next_block.next().expect("bound block"));
            let mut entry = next_entry(current.as_ref(), bp, block, bound).entry;
            read::dirty_from_clean(engine, &mut entry);
            Op::Data(DataOp::Map { ino: inode.ino, lblock: bp.lblock, entry: Some(entry) })
        })
        .collect()
}

/// Build the SSD image of every block the plan sends to the SSD (whole blocks, and on
/// the slow path merged partial ones) straight into IO-sized runs of consecutive target
/// blocks (`targets`, in plan order: new blocks, or blocks overwritten in place), and
/// submit each run as soon as it is filled, so the device works on it while the next
/// is copied. On error nothing is left in flight.
pub(super) fn submit_block_images<'e>(
    engine: &'e Engine,
    plan: &Plan,
    entries: &[Option<BlockEntry>],
    targets: &[SsdBlock],
    data: &[u8],
) -> Result<Vec<InFlight<'e>>> {
    let block = engine.geometry.block() as usize;
    let targets: Vec<(SsdBlock, usize)> = {
        let mut next_block = targets.iter();
        plan.blocks
            .iter()
            .enumerate()
            .filter(|(_, b)| b.needs_ssd_block())
            .map(|(i, _)| (*next_block.next().expect("bound block"), i))
            .collect()
    };
    let mut in_flight = Vec::new();
    for run in engine.blocks.runs(&targets) {
        let mut buf = engine.blocks.buffers.take(run.len() * block);
        for (k, &&(_, i)) in run.iter().enumerate() {
            let (bp, image) = (&plan.blocks[i], &mut buf[k * block..(k + 1) * block]);
            if bp.action == BlockAction::Rewrite {
                match read::materialize(engine, entries[i].as_ref(), image) {
                    Ok(read) => {
                        engine.stats.add(Counter::fg_rmw_reads, u64::from(read > 0));
                        engine.stats.add(Counter::fg_rmw_read_bytes, read);
                    }
                    Err(e) => {
                        // The caller frees these blocks: nothing may still write to them.
                        let _ = wait_all(in_flight);
                        return Err(e);
                    }
                }
            }
            image[bp.start as usize..bp.end as usize].copy_from_slice(&data[bp.src..bp.src + (bp.end - bp.start) as usize]);
        }
        let offset_bytes = run[0].0 .0 * block as u64;
        in_flight.push(engine.blocks.submit(vec![IoRequest { op: IoOp::Write, offset_bytes, buf }]));
    }
    Ok(in_flight)
}

/// Copy the plan's residue into its units (`pages` are the new ones, in plan order).
/// Returns the new units bound to each planned block, and the blocks one of whose
/// units was written to its end: whole, or a block's tail. Such a unit needs no read to
/// be merged (WSBuffer's stage 2 takes it at once).
pub(super) fn store_plan_residue(engine: &Engine, plan: &Plan, pages: &[PageNo], data: &[u8]) -> (Vec<Vec<PageNo>>, SmallVec<[u64; 4]>) {
    let mut fresh = pages.iter();
    let mut bound_pages: Vec<Vec<PageNo>> = Vec::with_capacity(plan.blocks.len());
    // Inline: most writes fill few units, and this runs on every small write.
    let mut full: SmallVec<[u64; 4]> = SmallVec::new();
    for bp in &plan.blocks {
        let mut bound = Vec::new();
        if let BlockAction::Fast(page_plans) | BlockAction::Overlay(page_plans) = &bp.action {
            for p in page_plans {
                let bytes = &data[p.src..p.src + (p.end - p.start) as usize];
                let (unit, zero_fill) = match &p.target {
                    PageTarget::InPlace(u) | PageTarget::UpageToPage(u) | PageTarget::InPlaceUpage { page: u, .. } => (*u, false),
                    PageTarget::NewPage { zero_fill } => (*fresh.next().expect("bound page"), *zero_fill),
                    PageTarget::NewUpage => (*fresh.next().expect("bound page"), false),
                };
                if matches!(p.target, PageTarget::NewPage { .. } | PageTarget::NewUpage) {
                    bound.push(unit);
                }
                store_residue(engine, unit, p.start, bytes, zero_fill);
                let whole = matches!(p.target, PageTarget::UpageToPage(_) | PageTarget::NewPage { zero_fill: false });
                let to_end = p.end == engine.geometry.page_bytes && matches!(p.target, PageTarget::InPlace(_) | PageTarget::NewPage { .. });
                if whole || to_end {
                    full.push(bp.lblock);
                }
                let counter = if matches!(p.target, PageTarget::NewUpage | PageTarget::InPlaceUpage { .. }) {
                    Counter::upage_write_bytes
                } else {
                    Counter::page_write_bytes
                };
                engine.stats.add(counter, bytes.len() as u64);
            }
        }
        bound_pages.push(bound);
    }
    (bound_pages, full)
}

/// Copy residue bytes into a unit and persist them (zero-filling the rest of a new
/// page of a fast block, unless new units read as zeros).
pub(super) fn store_residue(engine: &Engine, unit: PageNo, start: u32, bytes: &[u8], zero_fill: bool) {
    let page = engine.geometry.page_bytes;
    let end = start + bytes.len() as u32;
    let zero_fill = zero_fill && !engine.residue.fresh_units_read_zero();
    if zero_fill {
        engine.residue.zero(unit, 0, start);
        engine.residue.zero(unit, end, page - end);
    }
    engine.residue.write(unit, start, bytes);
    if zero_fill {
        engine.residue.persist(unit, 0, page);
    } else {
        engine.residue.persist(unit, start, bytes.len() as u32);
    }
}

/// The cache line: the unit in which a page written back is compared and sent.
const WRITE_BACK_LINE: usize = 64;

/// The byte ranges of `new` that differ from `old`, in whole 64-byte lines, adjacent
/// changed lines joined into one range.
fn changed_line_runs(old: &[u8], new: &[u8]) -> Vec<std::ops::Range<usize>> {
    let mut runs: Vec<std::ops::Range<usize>> = Vec::new();
    for (k, (a, b)) in old.chunks(WRITE_BACK_LINE).zip(new.chunks(WRITE_BACK_LINE)).enumerate() {
        if a == b {
            continue;
        }
        let line = k * WRITE_BACK_LINE..k * WRITE_BACK_LINE + b.len();
        match runs.last_mut() {
            Some(run) if run.end == line.start => run.end = line.end,
            _ => runs.push(line),
        }
    }
    runs
}

/// The new units a plan binds, in the order the write path fills them: a whole page for a
/// new page, the chunk's bytes for a new upage.
fn unit_requests(object: Ino, plan: &Plan, page_bytes: u32) -> SmallVec<[UnitRequest; 4]> {
    let mut requests = SmallVec::new();
    for bp in &plan.blocks {
        if let BlockAction::Fast(pages) | BlockAction::Overlay(pages) = &bp.action {
            for p in pages {
                let bytes = match p.target {
                    PageTarget::NewPage { .. } => page_bytes,
                    PageTarget::NewUpage => p.end - p.start,
                    _ => continue,
                };
                requests.push(UnitRequest { object, lblock: bp.lblock, bytes });
            }
        }
    }
    requests
}
