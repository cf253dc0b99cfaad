//! The data path: write, read, truncate, fallocate, fsync, and migration.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use super::{Inner, ReadMode, Volume};
use crate::device::{AlignedBuf, IoOp, IoRequest, IoTicket};
use crate::error::{Error, Result};
use crate::geometry::IO_ALIGN;
use crate::layout::Profile;
use crate::map::{BlockEntry, Overlay, PageNo, SsdBlock};
use crate::meta::{now_ns, FileKind, Ino, Inode, Op};
use crate::partition::{next_entry, partition, BlockAction, PageTarget, Plan, Residue, Rules};
use crate::stats::Counter;

/// In-flight SSD bytes at which the SSD counts as busy (WSBuffer's threshold).
const SSD_BUSY_BYTES: u64 = 4 << 20;
/// How long a block keeps volatile residue before an idle SSD takes it (scrap's stage 1).
const IDLE_FLUSH_AGE: std::time::Duration = std::time::Duration::from_millis(500);

/// Largest file offset: keeps every block index and byte position far from overflow.
pub const MAX_FILE_BYTES: u64 = 1 << 52;

/// `fallocate` modes the volume implements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FallocateMode {
    /// Allocate (zero-fill holes) and extend the size unless `keep_size`.
    Allocate { keep_size: bool },
    /// Deallocate and zero the range; the size never changes.
    PunchHole,
}

/// What `seek` looks for (SEEK_DATA / SEEK_HOLE).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SeekTarget {
    Data,
    Hole,
}

impl Volume {
    /// The first offset at or after `offset` that starts data or a hole, at block
    /// granularity; the end of the file counts as a hole. `BeyondEnd` past EOF.
    pub fn seek(&self, ino: Ino, offset: u64, target: SeekTarget) -> Result<u64> {
        let inode = self.inner.file(ino)?;
        let size = inode.size();
        if offset >= size {
            return Err(Error::BeyondEnd);
        }
        let block = self.inner.geometry.block();
        let map = inode.map.lock();
        match target {
            SeekTarget::Data => {
                let first = map.range(offset / block..).map(|(&lb, _)| lb * block).next().filter(|&start| start < size);
                first.map(|start| start.max(offset)).ok_or(Error::BeyondEnd)
            }
            SeekTarget::Hole => {
                let mut lb = offset / block;
                while lb * block < size && map.contains_key(&lb) {
                    lb += 1;
                }
                Ok((lb * block).clamp(offset, size))
            }
        }
    }

    /// Write `data` at `offset`. Returns when the write is durable per the `orch` promise:
    /// residue persisted, SSD IOs completed, map edit journaled.
    pub fn write(&self, ino: Ino, offset: u64, data: &[u8]) -> Result<usize> {
        let inode = self.inner.file(ino)?;
        self.inner.check_writable()?;
        if data.is_empty() {
            return Ok(0);
        }
        let end = offset.checked_add(data.len() as u64).filter(|&e| e <= MAX_FILE_BYTES).ok_or(Error::FileTooLarge)?;
        let block = self.inner.geometry.block();
        // The block holding EOF joins the lock when the write leaves a gap after it, so a
        // failed write can clean that block (see `write_locked`).
        loop {
            let size = inode.size();
            let first = if offset > size { (size / block).min(offset / block) } else { offset / block };
            let _guard = inode.range.write(first, (end - 1) / block);
            if inode.size() != size {
                continue;
            }
            self.inner.write_locked(&inode, offset, data, true)?;
            self.inner.stats.add(Counter::app_writes, 1);
            self.inner.stats.add(Counter::app_write_bytes, data.len() as u64);
            return Ok(data.len());
        }
    }

    /// Read into `buf` from `offset`; returns the bytes read (short at EOF).
    pub fn read(&self, ino: Ino, offset: u64, buf: &mut [u8]) -> Result<usize> {
        let inode = self.inner.file(ino)?;
        let n = self.inner.read_file(&inode, offset, buf)?;
        self.inner.stats.add(Counter::app_reads, 1);
        self.inner.stats.add(Counter::app_read_bytes, n as u64);
        Ok(n)
    }

    /// Set the size; shrinking frees whole blocks and zeroes the tail of the last one.
    pub fn truncate(&self, ino: Ino, size: u64) -> Result<()> {
        let inode = self.inner.file(ino)?;
        self.inner.check_writable()?;
        if size > MAX_FILE_BYTES {
            return Err(Error::FileTooLarge);
        }
        let _guard = inode.range.write(0, u64::MAX);
        self.inner.truncate_locked(&inode, size)
    }

    /// Make the file durable. With a persistent residue store every acknowledged write
    /// already is (its SSD blocks were flushed before its map edit was journaled), so this
    /// only retries a flush that failed. With a volatile one (`scrap`) it first flushes
    /// the file's scrap pages to the SSD and journals its size.
    ///
    /// It does not flush SSD writes nobody acknowledged yet: fsync would then wait for
    /// background migration's writes and flush.
    pub fn fsync(&self, ino: Ino) -> Result<()> {
        let inode = self.inner.get(ino)?;
        if !self.inner.residue.durable() && inode.kind == FileKind::File && !self.inner.options.read_only {
            let _guard = inode.range.write(0, u64::MAX);
            self.inner.sync_file_locked(&inode)?;
        }
        if self.inner.ssd_flush_failed.load(Ordering::SeqCst) {
            self.inner.flush_ssd()
        } else {
            self.inner.stats.add(Counter::ssd_flushes_skipped, 1);
            Ok(())
        }
    }

    pub fn fallocate(&self, ino: Ino, offset: u64, len: u64, mode: FallocateMode) -> Result<()> {
        let inode = self.inner.file(ino)?;
        self.inner.check_writable()?;
        if len == 0 {
            return Err(Error::InvalidArgument("fallocate of zero bytes".into()));
        }
        let end = offset.checked_add(len).filter(|&e| e <= MAX_FILE_BYTES).ok_or(Error::FileTooLarge)?;
        let block = self.inner.geometry.block();
        let _guard = inode.range.write(0, u64::MAX);
        let size = inode.size();
        match mode {
            FallocateMode::Allocate { keep_size } => {
                // Zero-fill the holes so later writes to the range cannot run out of space.
                let holes: Vec<u64> = {
                    let map = inode.map.lock();
                    (offset / block..=(end - 1) / block).filter(|lb| !map.contains_key(lb)).collect()
                };
                // Consecutive holes go as one write (up to 2 MiB): coalesced SSD IO and one
                // journal record, instead of a commit per block.
                let max_run = ((2 << 20) / block).max(1);
                let mut runs: Vec<(u64, u64)> = Vec::new();
                for lb in holes {
                    match runs.last_mut() {
                        Some((first, last)) if *last + 1 == lb && lb - *first < max_run => *last = lb,
                        _ => runs.push((lb, lb)),
                    }
                }
                for (first, last) in runs {
                    let (start, stop) = ((first * block).max(offset), ((last + 1) * block).min(end));
                    self.inner.write_locked(&inode, start, &vec![0u8; (stop - start) as usize], false)?;
                }
                if !keep_size && end > size {
                    self.inner.release_freed(self.inner.commit(&[Op::Extend { ino, size: end, mtime: now_ns() }])?);
                }
            }
            FallocateMode::PunchHole => {
                let end = end.min(size);
                if offset >= end {
                    return Ok(());
                }
                let (first_whole, last_whole) = (offset.div_ceil(block), end / block);
                let drops: Vec<Op> = if first_whole < last_whole {
                    let map = inode.map.lock();
                    map.range(first_whole..last_whole).map(|(&lblock, _)| Op::Map { ino, lblock, entry: None }).collect()
                } else {
                    Vec::new()
                };
                if !drops.is_empty() {
                    self.inner.release_freed(self.inner.commit(&drops)?);
                }
                let edges = [(offset, (first_whole * block).min(end)), ((last_whole * block).max(offset), end)];
                for (start, stop) in edges {
                    let is_hole = !inode.map.lock().contains_key(&(start / block));
                    if start < stop && !is_hole {
                        self.inner.write_locked(&inode, start, &vec![0u8; (stop - start) as usize], false)?;
                    }
                }
            }
        }
        Ok(())
    }
}

/// One piece of a read served from a fast page: (page, offset in page, offset in output, length).
type PageCopy = (PageNo, u32, usize, usize);

impl Inner {
    pub(crate) fn get(&self, ino: Ino) -> Result<Arc<Inode>> {
        self.meta.get(ino).ok_or(Error::NotFound)
    }

    pub(crate) fn file(&self, ino: Ino) -> Result<Arc<Inode>> {
        let inode = self.get(ino)?;
        match inode.kind {
            FileKind::File => Ok(inode),
            FileKind::Dir => Err(Error::IsDir),
            _ => Err(Error::InvalidArgument("not a regular file".into())),
        }
    }

    /// Count completed SSD writes; [`Inner::flush_ssd`] makes them durable.
    fn ssd_written(&self) {
        self.ssd_writes_done.fetch_add(1, Ordering::SeqCst);
    }

    /// Flush the SSD's volatile cache so that every write completed before this call is
    /// durable. Concurrent callers share flushes: one whose writes a flush that ran while
    /// it waited already covered returns at once (group commit).
    pub(crate) fn flush_ssd(&self) -> Result<()> {
        let wanted = self.ssd_writes_done.load(Ordering::SeqCst);
        if !self.ssd.needs_flush() {
            self.stats.add(Counter::ssd_flushes_skipped, 1);
            return Ok(());
        }
        let mut flushed = self.ssd_writes_flushed.lock();
        if *flushed >= wanted {
            self.stats.add(Counter::ssd_flushes_skipped, 1);
            return Ok(());
        }
        let covered = self.ssd_writes_done.load(Ordering::SeqCst);
        if let Err(e) = self.ssd.flush() {
            self.ssd_flush_failed.store(true, Ordering::SeqCst);
            return Err(e);
        }
        self.ssd_flush_failed.store(false, Ordering::SeqCst);
        *flushed = covered;
        self.stats.add(Counter::ssd_flushes, 1);
        Ok(())
    }

    /// The write path. The caller holds the range lock over the written blocks (and the
    /// block holding EOF when the write starts past it).
    pub(crate) fn write_locked(&self, inode: &Arc<Inode>, offset: u64, data: &[u8], extend: bool) -> Result<()> {
        let old_size = inode.size();
        let (plan, pages, entries) = self.plan_write(inode, offset, data.len() as u64, old_size)?;
        let result = self.execute(inode, &plan, pages, &entries, data);
        if result.is_err() && offset + data.len() as u64 > old_size {
            // In-place residue writes may have landed past EOF (the caller holds the EOF
            // block's lock when the write extends the file): keep those bytes zero.
            self.zero_beyond_eof(inode, old_size);
        }
        let mut ops = result?;
        if extend {
            ops.push(Op::Extend { ino: inode.ino, size: plan.new_size, mtime: now_ns() });
        }
        let freed = self.commit(&ops)?;
        self.release_freed(freed);
        Ok(())
    }

    /// Partition, merging overflowing upages first and making room in the fast tier; with
    /// no room at all, fall back to the read-modify-write plan. Returns the plan, its new
    /// pages and the current entry of each planned block (stable: the caller holds the
    /// range lock).
    fn plan_write(&self, inode: &Arc<Inode>, offset: u64, len: u64, size: u64) -> Result<(Plan, Vec<PageNo>, Vec<Option<BlockEntry>>)> {
        let profile = self.superblock.profile;
        // WSBuffer's buffer-minimized writes: below the request threshold, all of it. The
        // threshold allows one page less: the kernel cuts a FUSE write whose buffer does not
        // start on a page boundary into a piece one page short and a small tail.
        let small = len + IO_ALIGN as u64 <= self.options.request_threshold;
        let mut residue = if profile == Profile::Scrap && small { Residue::All } else { Residue::Partial };
        loop {
            let rules = Rules { residue, max_segments: profile.max_segments() };
            let (plan, entries) = {
                let map = inode.map.lock();
                let plan = partition(offset, len, size, &self.geometry, rules, |lb| map.get(&lb));
                let entries: Vec<Option<BlockEntry>> = plan.blocks.iter().map(|b| map.get(&b.lblock).cloned()).collect();
                (plan, entries)
            };
            if !plan.merge_first.is_empty() {
                for &lblock in &plan.merge_first {
                    self.migrate_block_locked(inode, lblock, Counter::migrations_header_full)?;
                }
                continue;
            }
            let needed: usize = plan.blocks.iter().map(|b| b.new_pages_needed()).sum();
            if needed == 0 {
                return Ok((plan, Vec::new(), entries));
            }
            match self.reserve_pages(needed) {
                Some(pages) => return Ok((plan, pages, entries)),
                // No room even after migrating: whole blocks go direct, then nothing is
                // residue (the slow path).
                None if residue == Residue::All => residue = Residue::Partial,
                None => residue = Residue::Forbidden,
            }
        }
    }

    /// Fast pages for a write: free ones, or ones the writer frees by migrating other
    /// blocks (it waits for migration); `None` if even that finds nothing.
    fn reserve_pages(&self, n: usize) -> Option<Vec<PageNo>> {
        if let Some(pages) = self.residue.allocate(n) {
            if self.residue.used_units() as f64 > self.options.migrate_high * self.residue.capacity_units() as f64 {
                self.notify_maintenance();
            }
            return Some(pages);
        }
        self.notify_maintenance();
        let target = n as u64 + self.residue.capacity_units() / 8;
        if let Err(e) = self.migrate_some(target, Counter::migrations_fast_full) {
            tracing::warn!("migration for a waiting writer: {e}");
        }
        self.residue.allocate(n)
    }

    /// Run a plan's IOs and return its map edits. SSD writes are in flight while the
    /// residue is copied into the fast tier on this thread.
    fn execute(&self, inode: &Arc<Inode>, plan: &Plan, pages: Vec<PageNo>, entries: &[Option<BlockEntry>], data: &[u8]) -> Result<Vec<Op>> {
        let block = self.geometry.block();
        // Direct writes spread over the SSDs by logical block.
        let members: Vec<usize> =
            plan.blocks.iter().filter(|b| b.needs_ssd_block()).map(|b| (b.lblock % self.ssd_in_flight.len() as u64) as usize).collect();
        let new_blocks: Vec<SsdBlock> = match self.allocate_blocks(&members) {
            Some(blocks) => blocks,
            None => {
                self.release(&pages, &[]);
                return Err(Error::NoSpace);
            }
        };
        let undo = |e: Error| {
            self.release(&pages, &new_blocks);
            e
        };
        // SSD images of whole blocks (and, on the slow path, merged partial blocks), built
        // straight into IO-sized runs of consecutive blocks.
        let targets: Vec<(SsdBlock, usize)> = {
            let mut next_block = new_blocks.iter();
            plan.blocks
                .iter()
                .enumerate()
                .filter(|(_, b)| b.needs_ssd_block())
                .map(|(i, _)| (*next_block.next().expect("bound block"), i))
                .collect()
        };
        // Each run goes out as soon as its buffer is filled, so the device works on it
        // while the next is copied.
        let mut in_flight = Vec::new();
        for run in self.runs(&targets) {
            let mut buf = self.buffers.take(run.len() * block as usize);
            for (k, &&(_, i)) in run.iter().enumerate() {
                let (bp, image) = (&plan.blocks[i], &mut buf[k * block as usize..(k + 1) * block as usize]);
                if bp.action == BlockAction::Rewrite {
                    let read = match self.materialize(entries[i].as_ref(), image) {
                        Ok(read) => read,
                        Err(e) => {
                            // Nothing may still be writing to the blocks `undo` frees.
                            let _ = wait_all(in_flight);
                            return Err(undo(e));
                        }
                    };
                    self.stats.add(Counter::fg_rmw_reads, u64::from(read > 0));
                    self.stats.add(Counter::fg_rmw_read_bytes, read);
                }
                image[bp.start as usize..bp.end as usize].copy_from_slice(&data[bp.src..bp.src + (bp.end - bp.start) as usize]);
            }
            in_flight.push(self.submit_ssd(vec![IoRequest { op: IoOp::Write, offset_bytes: run[0].0 .0 * block, buf }]));
        }
        // Residue, while the SSD works.
        let mut fresh = pages.iter();
        let mut bound_pages: Vec<Vec<PageNo>> = Vec::with_capacity(plan.blocks.len());
        let mut full: Vec<u64> = Vec::new();
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
                    self.store_residue(unit, p.start, bytes, zero_fill);
                    // A unit written to its end (a block's tail, or now whole) needs no
                    // read to flush: a volatile store queues it at once (WSBuffer's
                    // stage 2).
                    let whole = matches!(p.target, PageTarget::UpageToPage(_) | PageTarget::NewPage { zero_fill: false });
                    let to_end =
                        p.end == self.geometry.page_bytes && matches!(p.target, PageTarget::InPlace(_) | PageTarget::NewPage { .. });
                    if (whole || to_end) && !self.residue.durable() {
                        full.push(bp.lblock);
                    }
                    let counter = if matches!(p.target, PageTarget::NewUpage | PageTarget::InPlaceUpage { .. }) {
                        Counter::upage_write_bytes
                    } else {
                        Counter::page_write_bytes
                    };
                    self.stats.add(counter, bytes.len() as u64);
                }
            }
            bound_pages.push(bound);
        }
        if !in_flight.is_empty() {
            let written = wait_all(in_flight).map_err(&undo)?;
            self.ssd_written();
            written.iter().for_each(|buf| self.stats.ssd_write(buf.len() as u64));
            self.buffers.give(written);
            // Data before metadata: the map edit must not outlive a power cut that the
            // blocks it points at did not.
            self.flush_ssd().map_err(&undo)?;
        }
        let mut next_block = new_blocks.iter();
        let ops = plan
            .blocks
            .iter()
            .zip(entries)
            .zip(&bound_pages)
            .map(|((bp, current), bound)| {
                let block = bp.needs_ssd_block().then(|| *next_block.next().expect("bound block"));
                let next = next_entry(current.as_ref(), bp, block, bound);
                Op::Map { ino: inode.ino, lblock: bp.lblock, entry: Some(next.entry) }
            })
            .collect();
        if !self.residue.durable() {
            let mut dirty = self.dirty_since.lock();
            for bp in plan.blocks.iter().filter(|b| !b.needs_ssd_block()) {
                dirty.entry((inode.ino, bp.lblock)).or_insert_with(Instant::now);
            }
        }
        if !full.is_empty() {
            full.dedup();
            self.full_units.lock().extend(full.into_iter().map(|lb| (inode.ino, lb)));
            self.notify_flushers();
        }
        Ok(ops)
    }

    /// Split `(block, tag)` pairs into runs of physically consecutive blocks of at most
    /// `split_bytes` that do not cross a split boundary (so each run still belongs to one
    /// IO worker): fewer, larger IOs, as many in flight as before.
    fn runs<'t, T>(&self, targets: &'t [(SsdBlock, T)]) -> Vec<Vec<&'t (SsdBlock, T)>> {
        let per_run = (u64::from(self.geometry.split_bytes) / self.geometry.block()).max(1);
        let mut sorted: Vec<&(SsdBlock, T)> = targets.iter().collect();
        sorted.sort_by_key(|(b, _)| *b);
        let mut runs: Vec<Vec<&(SsdBlock, T)>> = Vec::new();
        for target in sorted {
            match runs.last_mut() {
                Some(run) if run.last().is_some_and(|last| last.0 .0 + 1 == target.0 .0) && target.0 .0 % per_run != 0 => run.push(target),
                _ => runs.push(vec![target]),
            }
        }
        runs
    }

    /// Copy residue bytes into a unit and persist them (zero-filling the rest of a new
    /// page of a fast block).
    fn store_residue(&self, unit: PageNo, start: u32, bytes: &[u8], zero_fill: bool) {
        let page = self.geometry.page_bytes;
        let end = start + bytes.len() as u32;
        if zero_fill {
            self.residue.zero(unit, 0, start);
            self.residue.zero(unit, end, page - end);
        }
        self.residue.write(unit, start, bytes);
        if zero_fill {
            self.residue.persist(unit, 0, page);
        } else {
            self.residue.persist(unit, start, bytes.len() as u32);
        }
    }

    /// The bytes of one logical block: SSD block (if any) with overlays, or fast pages.
    /// Returns the bytes read from the SSD.
    pub(crate) fn materialize(&self, entry: Option<&BlockEntry>, image: &mut [u8]) -> Result<u64> {
        image.fill(0);
        let Some(entry) = entry else { return Ok(0) };
        let mut read = 0;
        if let (Some(block), true) = (entry.ssd_block(), self.needs_fill(entry)) {
            let request = IoRequest { op: IoOp::Read, offset_bytes: block.0 * self.geometry.block(), buf: self.buffers.take(image.len()) };
            let buf = self.submit_ssd(vec![request]).wait()?.remove(0);
            image.copy_from_slice(&buf);
            read = buf.len() as u64;
            self.buffers.give([buf]);
            self.stats.add(Counter::ssd_read_bytes, read);
        }
        self.lay_residue(entry, image);
        Ok(read)
    }

    /// Whether merging `entry`'s residue needs its SSD copy: some page of the block is not
    /// replaced whole by a residue page (WSBuffer's "unfilled" scrap page).
    fn needs_fill(&self, entry: &BlockEntry) -> bool {
        match entry {
            BlockEntry::Fast { .. } => false,
            BlockEntry::Ssd { overlays, .. } => {
                overlays.iter().filter(|(_, o)| matches!(o, Overlay::Page(_))).count() < self.geometry.pages_per_block()
            }
        }
    }

    /// Copy an entry's residue over `image` (which holds its SSD copy, or zeros).
    fn lay_residue(&self, entry: &BlockEntry, image: &mut [u8]) {
        self.residue_pieces(entry, |range, unit, offset| self.residue.read(unit, offset, &mut image[range]));
    }

    /// Each piece of a block's residue: the bytes of the block it covers, and the unit and
    /// offset in the unit that hold them.
    fn residue_pieces(&self, entry: &BlockEntry, mut piece: impl FnMut(Range<usize>, PageNo, u32)) {
        let page = self.geometry.page_bytes as usize;
        match entry {
            BlockEntry::Fast { pages } => {
                for &(index, unit) in pages {
                    let at = index as usize * page;
                    piece(at..at + page, unit, 0);
                }
            }
            BlockEntry::Ssd { overlays, .. } => {
                for (index, overlay) in overlays {
                    let at = *index as usize * page;
                    match overlay {
                        Overlay::Page(unit) => piece(at..at + page, *unit, 0),
                        Overlay::Upage { page: unit, chunks } => {
                            for &(start, end) in chunks.ranges() {
                                piece(at + start as usize..at + end as usize, *unit, start);
                            }
                        }
                    }
                }
            }
        }
    }

    /// Zero the fast-tier bytes of the block holding EOF that lie past `size` (they are
    /// invisible, so this is safe in place). SSD bytes past EOF are zero by construction.
    pub(crate) fn zero_beyond_eof(&self, inode: &Inode, size: u64) {
        let (block, page) = (self.geometry.block(), self.geometry.page_bytes);
        let within = (size % block) as u32;
        if within == 0 {
            return;
        }
        let map = inode.map.lock();
        let units: Vec<(u8, PageNo)> = match map.get(&(size / block)) {
            Some(BlockEntry::Fast { pages }) => pages.clone(),
            Some(BlockEntry::Ssd { overlays, .. }) => {
                overlays.iter().filter_map(|(i, o)| matches!(o, Overlay::Page(_)).then_some((*i, o.page()))).collect()
            }
            None => Vec::new(),
        };
        for (index, unit) in units {
            let page_start = u32::from(index) * page;
            let from = within.saturating_sub(page_start);
            if from < page {
                self.residue.zero(unit, from, page - from);
                self.residue.persist(unit, from, page - from);
            }
        }
    }

    pub(crate) fn read_file(&self, inode: &Arc<Inode>, offset: u64, buf: &mut [u8]) -> Result<usize> {
        let (block, page) = (self.geometry.block(), u64::from(self.geometry.page_bytes));
        if buf.is_empty() || offset >= inode.size() {
            return Ok(0);
        }
        let last = (offset + buf.len() as u64 - 1) / block;
        let _guard = inode.range.read(offset / block, last);
        let size = inode.size();
        if offset >= size {
            return Ok(0);
        }
        let n = (buf.len() as u64).min(size - offset) as usize;
        let out = &mut buf[..n];
        let entries: Vec<(u64, Option<BlockEntry>)> = {
            let map = inode.map.lock();
            (offset / block..=(offset + n as u64 - 1) / block).map(|lb| (lb, map.get(&lb).cloned())).collect()
        };
        let mut direct: Vec<(IoRequest, usize, usize, usize)> = Vec::new();
        let mut copies: Vec<PageCopy> = Vec::new();
        for (lb, entry) in &entries {
            let block_start = lb * block;
            let (s, e) = (offset.max(block_start) - block_start, (offset + n as u64).min(block_start + block) - block_start);
            let out_at = (block_start + s - offset) as usize;
            out[out_at..out_at + (e - s) as usize].fill(0);
            // Overlay pieces are copied after the SSD data they cover has arrived.
            let mut overlay = |index: u8, unit: PageNo, range: (u64, u64)| {
                let (ps, pe) = (u64::from(index) * page + range.0, u64::from(index) * page + range.1);
                let (cs, ce) = (ps.max(s), pe.min(e));
                if cs < ce {
                    copies.push((unit, (cs - u64::from(index) * page) as u32, out_at + (cs - s) as usize, (ce - cs) as usize));
                }
            };
            match entry {
                None => {}
                Some(BlockEntry::Fast { pages }) => pages.iter().for_each(|&(i, unit)| overlay(i, unit, (0, page))),
                Some(BlockEntry::Ssd { block: ssd_block, overlays }) => {
                    let covered = |index: u64| overlays.iter().any(|(i, o)| u64::from(*i) == index && matches!(o, Overlay::Page(_)));
                    let uncovered: Vec<u64> = (s / page..e.div_ceil(page)).filter(|&i| !covered(i)).collect();
                    if let (Some(&lo), Some(&hi)) = (uncovered.first(), uncovered.last()) {
                        let (rs, re) = ((lo * page).max(s), ((hi + 1) * page).min(e));
                        let device_at = ssd_block.0 * block + rs;
                        let dest = out_at + (rs - s) as usize;
                        self.stats.add(Counter::ssd_read_bytes, re - rs);
                        match self.options.read_mode {
                            ReadMode::Buffered => self.ssd.read_buffered(device_at, &mut out[dest..dest + (re - rs) as usize])?,
                            ReadMode::Direct => {
                                let align = IO_ALIGN as u64;
                                let (a0, a1) = (device_at / align * align, (device_at + re - rs).div_ceil(align) * align);
                                let request = IoRequest { op: IoOp::Read, offset_bytes: a0, buf: AlignedBuf::zeroed((a1 - a0) as usize) };
                                direct.push((request, (device_at - a0) as usize, dest, (re - rs) as usize));
                            }
                        }
                    }
                    for (i, o) in overlays {
                        match o {
                            Overlay::Page(unit) => overlay(*i, *unit, (0, page)),
                            Overlay::Upage { page: unit, chunks } => {
                                chunks.ranges().iter().for_each(|&(cs, ce)| overlay(*i, *unit, (u64::from(cs), u64::from(ce))))
                            }
                        }
                    }
                }
            }
        }
        if !direct.is_empty() {
            let (requests, places): (Vec<IoRequest>, Vec<(usize, usize, usize)>) =
                direct.into_iter().map(|(r, skip, dest, len)| (r, (skip, dest, len))).unzip();
            let buffers = self.submit_ssd(requests).wait()?;
            for (buf, (skip, dest, len)) in buffers.iter().zip(places) {
                out[dest..dest + len].copy_from_slice(&buf[skip..skip + len]);
            }
        }
        for (unit, in_page, dest, len) in copies {
            self.residue.read(unit, in_page, &mut out[dest..dest + len]);
        }
        Ok(n)
    }

    /// Truncate with the whole file locked. The new last block, if partial, is rewritten
    /// with a zeroed tail into fresh units, in the same journal record as the size.
    pub(crate) fn truncate_locked(&self, inode: &Arc<Inode>, size: u64) -> Result<()> {
        let block = self.geometry.block();
        let old = inode.size();
        let ino = inode.ino;
        let time = now_ns();
        if size >= old {
            self.zero_beyond_eof(inode, old);
            return self.commit(&[Op::SetSize { ino, size, time }]).map(|f| self.release_freed(f));
        }
        let mut ops: Vec<Op> = {
            let map = inode.map.lock();
            map.range(size.div_ceil(block)..).map(|(&lblock, _)| Op::Map { ino, lblock, entry: None }).collect()
        };
        let mut fresh_units = (Vec::new(), Vec::new());
        let within = size % block;
        let tail = inode.map.lock().get(&(size / block)).cloned();
        if let (true, Some(entry)) = (within != 0, tail) {
            let mut image = AlignedBuf::zeroed(block as usize);
            self.materialize(Some(&entry), &mut image)?;
            image[within as usize..].fill(0);
            let page = u64::from(self.geometry.page_bytes);
            let npages = within.div_ceil(page) as usize;
            let fast_pages = matches!(entry, BlockEntry::Fast { .. }).then(|| self.residue.allocate(npages)).flatten();
            let new_entry = match fast_pages {
                Some(units) => {
                    for (i, &unit) in units.iter().enumerate() {
                        let at = i * page as usize;
                        self.store_residue(unit, 0, &image[at..at + page as usize], false);
                    }
                    fresh_units.0 = units.clone();
                    BlockEntry::Fast { pages: units.into_iter().enumerate().map(|(i, u)| (i as u8, u)).collect() }
                }
                None => {
                    let new_block = self.write_new_block(image)?;
                    fresh_units.1 = vec![new_block];
                    BlockEntry::Ssd { block: new_block, overlays: Vec::new() }
                }
            };
            ops.push(Op::Map { ino, lblock: size / block, entry: Some(new_entry) });
        }
        ops.push(Op::SetSize { ino, size, time });
        match self.commit(&ops) {
            Ok(freed) => {
                self.release_freed(freed);
                Ok(())
            }
            Err(e) => {
                self.release(&fresh_units.0, &fresh_units.1);
                Err(e)
            }
        }
    }

    /// Write one block image to a freshly allocated SSD block (not yet referenced by any
    /// map; the allocation is undone if the write fails).
    fn write_new_block(&self, image: AlignedBuf) -> Result<SsdBlock> {
        let target = SsdBlock(self.blocks.allocate(1).ok_or(Error::NoSpace)?[0]);
        let write = IoRequest { op: IoOp::Write, offset_bytes: target.0 * self.geometry.block(), buf: image };
        match self.submit_ssd(vec![write]).wait() {
            Ok(buffers) => {
                self.buffers.give(buffers);
                self.ssd_written();
                self.stats.ssd_write(self.geometry.block());
                // The caller journals a map edit pointing here next: flush first.
                if let Err(e) = self.flush_ssd() {
                    self.release(&[], &[target]);
                    return Err(e);
                }
                Ok(target)
            }
            Err(e) => {
                self.release(&[], &[target]);
                Err(e)
            }
        }
    }

    /// Merge one block's residue into a new SSD block. The caller holds the block's range
    /// lock. Returns whether anything moved.
    pub(crate) fn migrate_block_locked(&self, inode: &Arc<Inode>, lblock: u64, cause: Counter) -> Result<bool> {
        Ok(self.migrate_blocks_locked(vec![(Arc::clone(inode), lblock)], cause)? > 0)
    }

    /// Merge the residue of several blocks into new SSD blocks (out of place), with one
    /// flush and one journal record for all. The caller holds every block's range lock.
    /// Returns how many blocks moved.
    pub(crate) fn migrate_blocks_locked(&self, blocks: Vec<(Arc<Inode>, u64)>, cause: Counter) -> Result<u64> {
        let (work, images): (Vec<Staged>, Vec<AlignedBuf>) =
            blocks.into_iter().filter_map(|(inode, lblock)| self.stage(inode, lblock)).unzip();
        if work.is_empty() {
            return Ok(0);
        }
        let targets = self.write_staged(&work, images)?;
        self.commit_merged(work, targets, cause)
    }

    /// [`Inner::migrate_blocks_locked`] for blocks the caller does not hold. Each block is
    /// locked only while its residue is copied out and while its merge is committed, so
    /// writers are not held up by the IO and the flush in between. A block a writer holds
    /// at either moment, or locks in between, keeps its residue (its new SSD block is freed
    /// unused): those blocks are returned with the count of blocks that moved.
    pub(crate) fn migrate_blocks_watched(&self, blocks: Vec<(Arc<Inode>, u64)>, cause: Counter) -> Result<(u64, Vec<(Ino, u64)>)> {
        let merging = self.start_watched_merge(blocks)?;
        self.finish_watched_merge(merging, cause)
    }

    /// The first half of [`Inner::migrate_blocks_watched`]: copy out, write, flush.
    fn start_watched_merge(&self, blocks: Vec<(Arc<Inode>, u64)>) -> Result<WatchedMerge> {
        let mut merging = WatchedMerge::default();
        let mut images = Vec::new();
        for (inode, lblock) in blocks {
            // A block a writer is in, or another migration has, is left alone.
            let Some(guard) = inode.range.try_write_and_watch(lblock) else {
                merging.left.push((inode.ino, lblock));
                continue;
            };
            match self.stage(Arc::clone(&inode), lblock) {
                Some((staged, image)) => {
                    merging.work.push(staged);
                    images.push(image);
                }
                None => inode.range.unwatch(lblock),
            }
            drop(guard);
        }
        if merging.work.is_empty() {
            return Ok(merging);
        }
        match self.write_staged(&merging.work, images) {
            Ok(targets) => merging.targets = targets,
            Err(e) => {
                for staged in &merging.work {
                    staged.inode.range.unwatch(staged.lblock);
                }
                return Err(e);
            }
        }
        Ok(merging)
    }

    /// The second half: commit the blocks nobody wrote meanwhile.
    fn finish_watched_merge(&self, merging: WatchedMerge, cause: Counter) -> Result<(u64, Vec<(Ino, u64)>)> {
        let WatchedMerge { work, targets, mut left } = merging;
        // With the journal in the fast tier a record is cheap, so commit a few blocks at a
        // time: writers then wait for the journal, and for these blocks, only as long as
        // one small record takes. On the SSD every record costs a flush.
        let chunk = if self.fast.is_some() { 32 } else { usize::MAX };
        let mut rest = work.into_iter().zip(targets);
        let mut moved = 0;
        loop {
            let part: Vec<(Staged, SsdBlock)> = rest.by_ref().take(chunk).collect();
            if part.is_empty() {
                return Ok((moved, left));
            }
            let inodes: Vec<Arc<Inode>> = part.iter().map(|(s, _)| Arc::clone(&s.inode)).collect();
            let mut guards = Vec::with_capacity(part.len());
            let (mut kept, mut kept_targets) = (Vec::new(), Vec::new());
            for ((staged, target), inode) in part.into_iter().zip(&inodes) {
                match inode.range.try_write_watched(staged.lblock) {
                    Some((guard, false)) => {
                        guards.push(guard);
                        kept.push(staged);
                        kept_targets.push(target);
                    }
                    _ => {
                        // Never journaled, so free at once.
                        self.release(&[], &[target]);
                        self.stats.add(Counter::migrations_dropped, 1);
                        left.push((staged.inode.ino, staged.lblock));
                    }
                }
            }
            if kept.is_empty() {
                continue;
            }
            match self.commit_merged(kept, kept_targets, cause) {
                Ok(n) => moved += n,
                Err(e) => {
                    drop(guards);
                    for (staged, target) in rest {
                        staged.inode.range.unwatch(staged.lblock);
                        self.release(&[], &[target]);
                    }
                    return Err(e);
                }
            }
        }
    }

    /// Copy out a block's entry and its residue (laid over zeros). The caller holds the
    /// block's range lock. `None` if the block holds no residue.
    fn stage(&self, inode: Arc<Inode>, lblock: u64) -> Option<(Staged, AlignedBuf)> {
        let entry = inode.map.lock().get(&lblock).cloned().filter(|e| e.fast_page_count() > 0)?;
        let mut image = self.buffers.take(self.geometry.block() as usize);
        image.fill(0);
        self.lay_residue(&entry, &mut image);
        Some((Staged { inode, lblock, entry }, image))
    }

    /// Write each staged block to a new SSD block, its residue over its SSD copy where the
    /// residue does not cover it whole: the reads in flight together (WSBuffer's stage 1),
    /// then the writes (stage 2), then one flush, since the journal record that will point
    /// at the new blocks must not point at blocks a power cut could lose. Returns the new
    /// blocks, in order.
    fn write_staged(&self, work: &[Staged], mut images: Vec<AlignedBuf>) -> Result<Vec<SsdBlock>> {
        let block = self.geometry.block();
        let fills: Vec<usize> = (0..work.len()).filter(|&i| self.needs_fill(&work[i].entry)).collect();
        let reads: Vec<IoRequest> = fills
            .iter()
            .filter_map(|&i| work[i].entry.ssd_block())
            .map(|b| IoRequest { op: IoOp::Read, offset_bytes: b.0 * block, buf: self.buffers.take(block as usize) })
            .collect();
        let read_bytes = reads.len() as u64 * block;
        let filled = if reads.is_empty() {
            Vec::new()
        } else {
            match self.submit_ssd(reads).wait() {
                Ok(filled) => filled,
                Err(e) => {
                    self.buffers.give(images);
                    return Err(e);
                }
            }
        };
        self.stats.add(Counter::ssd_read_bytes, read_bytes);
        self.stats.add(Counter::migration_read_bytes, read_bytes);
        for (&i, mut disk) in fills.iter().zip(filled) {
            self.residue_pieces(&work[i].entry, |range, _, _| disk[range.clone()].copy_from_slice(&images[i][range]));
            std::mem::swap(&mut images[i], &mut disk);
            self.buffers.give([disk]);
        }
        // Delayed allocation: each block goes to the SSD least busy at this moment.
        let Some(targets) = self.allocate_blocks(&self.least_busy_members(work.len())) else {
            self.buffers.give(images);
            return Err(Error::NoSpace);
        };
        let writes =
            images.into_iter().zip(&targets).map(|(buf, t)| IoRequest { op: IoOp::Write, offset_bytes: t.0 * block, buf }).collect();
        match self.submit_ssd(writes).wait() {
            Ok(buffers) => self.buffers.give(buffers),
            Err(e) => {
                self.release(&[], &targets);
                return Err(e);
            }
        }
        self.ssd_written();
        for _ in &targets {
            self.stats.ssd_write(block);
        }
        self.stats.add(Counter::migration_write_bytes, block * targets.len() as u64);
        if let Err(e) = self.flush_ssd() {
            self.release(&[], &targets);
            return Err(e);
        }
        Ok(targets)
    }

    /// Journal the staged blocks as moved to `targets` (one record) and free their
    /// residue. The caller holds every block's range lock, and nothing wrote them since
    /// they were staged.
    fn commit_merged(&self, mut work: Vec<Staged>, mut targets: Vec<SsdBlock>, cause: Counter) -> Result<u64> {
        loop {
            let mut ops: Vec<Op> = work
                .iter()
                .zip(&targets)
                .map(|(staged, t)| Op::Map {
                    ino: staged.inode.ino,
                    lblock: staged.lblock,
                    entry: Some(BlockEntry::Ssd { block: *t, overlays: Vec::new() }),
                })
                .collect();
            if !self.residue.durable() {
                // Each file's size becomes durable as far as its data now is.
                let files: std::collections::BTreeMap<Ino, &Arc<Inode>> = work.iter().map(|s| (s.inode.ino, &s.inode)).collect();
                for inode in files.into_values() {
                    let attr = inode.attr();
                    ops.push(Op::Extend { ino: inode.ino, size: attr.size, mtime: attr.mtime });
                }
            }
            match self.commit(&ops) {
                Ok(freed) => {
                    self.release_freed(freed);
                    break;
                }
                // A file was removed while its blocks were being merged: drop them.
                Err(Error::NotFound) => {
                    let gone: Vec<usize> = (0..work.len()).filter(|&i| self.meta.get(work[i].inode.ino).is_none()).collect();
                    if gone.is_empty() {
                        self.release(&[], &targets);
                        return Err(Error::NotFound);
                    }
                    for &i in gone.iter().rev() {
                        work.remove(i);
                        self.release(&[], &[targets.remove(i)]);
                    }
                    if work.is_empty() {
                        return Ok(0);
                    }
                }
                Err(e) => {
                    self.release(&[], &targets);
                    return Err(e);
                }
            }
        }
        self.stats.add(cause, work.len() as u64);
        Ok(work.len() as u64)
    }

    /// Blocks one migration batch merges: 8 MiB of them.
    fn migration_batch(&self) -> usize {
        ((8 << 20) / self.geometry.block()).max(1) as usize
    }

    /// Migrate the blocks holding the most fast pages until `want_free` pages are free
    /// (or no candidate is left), a batch at a time. Blocks whose range is busy are
    /// skipped.
    pub(crate) fn migrate_some(&self, want_free: u64, cause: Counter) -> Result<u64> {
        let mut candidates: Vec<(usize, Arc<Inode>, u64)> = Vec::new();
        for inode in self.meta.snapshot().into_iter().filter(|i| i.kind == FileKind::File) {
            let blocks: Vec<(usize, u64)> =
                inode.map.lock().iter().filter(|(_, e)| e.fast_page_count() > 0).map(|(&lb, e)| (e.fast_page_count(), lb)).collect();
            candidates.extend(blocks.into_iter().map(|(count, lb)| (count, Arc::clone(&inode), lb)));
        }
        candidates.sort_by_key(|c| std::cmp::Reverse(c.0));
        let mut migrated = 0;
        let mut rest = candidates.as_slice();
        loop {
            let free = self.residue.capacity_units() - self.residue.used_units();
            if free >= want_free || rest.is_empty() {
                return Ok(migrated);
            }
            let (mut batch, mut units) = (Vec::new(), 0);
            while let Some(((count, inode, lblock), tail)) = rest.split_first() {
                rest = tail;
                batch.push((Arc::clone(inode), *lblock));
                units += *count as u64;
                if batch.len() >= self.migration_batch() || free + units >= want_free {
                    break;
                }
            }
            // Blocks a writer is in are skipped: the next round sees them again.
            migrated += self.migrate_blocks_watched(batch, cause)?.0;
        }
    }
}

/// A block being merged: its entry when its residue was copied out.
struct Staged {
    inode: Arc<Inode>,
    lblock: u64,
    entry: BlockEntry,
}

/// Blocks written to new SSD blocks and watched until their merge is committed, and the
/// blocks left out.
#[derive(Default)]
struct WatchedMerge {
    work: Vec<Staged>,
    targets: Vec<SsdBlock>,
    left: Vec<(Ino, u64)>,
}

/// SSD IO the volume has submitted and not yet seen complete, per SSD: OTflush's busyness
/// gauge.
pub(crate) struct InFlight<'a> {
    gauges: &'a [AtomicU64],
    bytes: Vec<u64>,
    ticket: Option<IoTicket>,
    #[cfg(debug_assertions)]
    ranges: (&'a InFlightRanges, u64),
}

/// The SSD ranges of the batches in flight, by batch. Blocks are written out of place and
/// freed only after their last reader is gone, so no write may overlap another IO in
/// flight; the IO engine relies on that (it keeps no order between IOs).
#[cfg(debug_assertions)]
#[derive(Default)]
pub(crate) struct InFlightRanges(parking_lot::Mutex<RangesInFlight>);

/// The last batch number given out, and each IO in flight: (batch, SSD range, op).
#[cfg(debug_assertions)]
type RangesInFlight = (u64, Vec<(u64, Range<u64>, IoOp)>);

#[cfg(debug_assertions)]
impl InFlightRanges {
    fn enter(&self, batch: &[IoRequest]) -> u64 {
        let mut guard = self.0.lock();
        let (next, ranges) = &mut *guard;
        *next += 1;
        for request in batch {
            let range = request.offset_bytes..request.offset_bytes + request.buf.len() as u64;
            for (_, other, op) in ranges.iter() {
                let overlaps = range.start < other.end && other.start < range.end;
                assert!(
                    !overlaps || (request.op == IoOp::Read && *op == IoOp::Read),
                    "SSD {:?} of {range:?} overlaps a {op:?} of {other:?} in flight",
                    request.op
                );
            }
            ranges.push((*next, range, request.op));
        }
        *next
    }

    fn leave(&self, batch: u64) {
        self.0.lock().1.retain(|(b, _, _)| *b != batch);
    }
}

impl InFlight<'_> {
    pub(crate) fn wait(mut self) -> Result<Vec<AlignedBuf>> {
        self.ticket.take().expect("a batch is waited for once").wait()
    }
}

/// Wait for every batch, even after one failed: a caller that frees blocks on error must
/// know no IO to them is still running.
fn wait_all(batches: Vec<InFlight<'_>>) -> Result<Vec<AlignedBuf>> {
    let mut buffers = Vec::new();
    let mut first_error = None;
    for batch in batches {
        match batch.wait() {
            Ok(done) => buffers.extend(done),
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    first_error.map_or(Ok(buffers), Err)
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        #[cfg(debug_assertions)]
        {
            // An unwaited ticket may still be running on a worker: wait before forgetting
            // its ranges.
            drop(self.ticket.take().map(IoTicket::wait));
            self.ranges.0.leave(self.ranges.1);
        }
        for (gauge, bytes) in self.gauges.iter().zip(&self.bytes) {
            gauge.fetch_sub(*bytes, Ordering::Relaxed);
        }
    }
}

/// SSDs, and flushing a volatile residue store (`scrap`).
impl Inner {
    /// Which SSD of the volume holds byte `offset` of the SSD address space.
    fn member_of(&self, offset: u64) -> usize {
        ((offset / self.superblock.member_bytes()) as usize).min(self.ssd_in_flight.len() - 1)
    }

    /// Submit a batch to the SSDs, counting its bytes as in flight until it is waited for.
    pub(crate) fn submit_ssd(&self, batch: Vec<IoRequest>) -> InFlight<'_> {
        let mut bytes = vec![0u64; self.ssd_in_flight.len()];
        for request in &batch {
            bytes[self.member_of(request.offset_bytes)] += request.buf.len() as u64;
        }
        for (gauge, n) in self.ssd_in_flight.iter().zip(&bytes) {
            gauge.fetch_add(*n, Ordering::Relaxed);
        }
        #[cfg(debug_assertions)]
        let ranges = (&self.io_ranges, self.io_ranges.enter(&batch));
        InFlight {
            gauges: &self.ssd_in_flight,
            bytes,
            ticket: Some(self.ssd.submit(batch)),
            #[cfg(debug_assertions)]
            ranges,
        }
    }

    /// Whether SSD `member` has at least the busy threshold of the volume's IO in flight
    /// (WSBuffer: 4 MiB); stage-1 flushing waits for it to calm down.
    pub(crate) fn ssd_busy(&self, member: usize) -> bool {
        self.ssd_in_flight[member].load(Ordering::Relaxed) >= SSD_BUSY_BYTES
    }

    /// For `n` new blocks, the SSD each should go to: the least loaded, counting the
    /// blocks already assigned (WSBuffer's delayed allocation).
    fn least_busy_members(&self, n: usize) -> Vec<usize> {
        let block = self.geometry.block();
        let mut load: Vec<u64> = self.ssd_in_flight.iter().map(|g| g.load(Ordering::Relaxed)).collect();
        (0..n)
            .map(|_| {
                let member = (0..load.len()).min_by_key(|&m| load[m]).unwrap_or(0);
                load[member] += block;
                member
            })
            .collect()
    }

    /// One new SSD block on each SSD named (another SSD when that one is full); all or
    /// none.
    fn allocate_blocks(&self, members: &[usize]) -> Option<Vec<SsdBlock>> {
        if self.ssd_in_flight.len() == 1 {
            return self.blocks.allocate(members.len()).map(|ids| ids.into_iter().map(SsdBlock).collect());
        }
        let per_member = self.superblock.member_bytes() / self.geometry.block();
        let count = self.ssd_in_flight.len() as u64;
        let mut taken = Vec::with_capacity(members.len());
        for &member in members {
            let found =
                (0..count).map(|k| (member as u64 + k) % count).find_map(|m| self.blocks.allocate_in(m * per_member..(m + 1) * per_member));
            match found {
                Some(id) => taken.push(SsdBlock(id)),
                None => {
                    self.release(&[], &taken);
                    return None;
                }
            }
        }
        Some(taken)
    }

    /// WSBuffer's stage 1 when the SSDs are idle: merge the blocks that have held residue
    /// for at least [`IDLE_FLUSH_AGE`] (so a block still being filled is left alone), oldest
    /// first, a batch at a time. A block whose SSD is busy waits for a later round.
    pub(crate) fn flush_when_idle(&self) -> Result<u64> {
        let due: Vec<(Instant, Ino, u64)> = {
            let dirty = self.dirty_since.lock();
            let mut due: Vec<(Instant, Ino, u64)> =
                dirty.iter().filter(|(_, since)| since.elapsed() >= IDLE_FLUSH_AGE).map(|(&(ino, lb), &t)| (t, ino, lb)).collect();
            due.sort_unstable();
            due
        };
        let mut moved = 0;
        for batch in due.chunks(self.migration_batch()) {
            if self.shutdown.load(Ordering::SeqCst) || (0..self.ssd_in_flight.len()).all(|m| self.ssd_busy(m)) {
                break;
            }
            let mut files = Vec::new();
            let mut since = HashMap::new();
            for &(t, ino, lblock) in batch {
                let Some(inode) = self.meta.get(ino) else { continue };
                let home =
                    inode.map.lock().get(&lblock).and_then(BlockEntry::ssd_block).map(|b| self.member_of(b.0 * self.geometry.block()));
                // A block whose SSD is busy stays due.
                if !home.is_some_and(|m| self.ssd_busy(m)) {
                    files.push((inode, lblock));
                    since.insert((ino, lblock), t);
                }
            }
            {
                let mut dirty = self.dirty_since.lock();
                for key in since.keys() {
                    dirty.remove(key);
                }
            }
            let (n, left) = self.migrate_blocks_watched(files, Counter::migrations_idle)?;
            moved += n;
            // Blocks a writer was in stay due, as old as they were.
            let mut dirty = self.dirty_since.lock();
            for key in left {
                let t = since[&key];
                dirty.entry(key).and_modify(|e| *e = (*e).min(t)).or_insert(t);
            }
        }
        Ok(moved)
    }

    /// Flush every block of `inode` that holds residue, then journal its size and mtime:
    /// afterwards a crash keeps the file as it is. The caller holds the whole file's range
    /// lock.
    pub(crate) fn sync_file_locked(&self, inode: &Arc<Inode>) -> Result<()> {
        let held: Vec<u64> = inode.map.lock().iter().filter(|(_, e)| e.fast_page_count() > 0).map(|(&lb, _)| lb).collect();
        for batch in held.chunks(self.migration_batch()) {
            self.migrate_blocks_locked(batch.iter().map(|&lb| (Arc::clone(inode), lb)).collect(), Counter::migrations_sync)?;
        }
        let attr = inode.attr();
        if self.durable_size(inode.ino, attr.size) < attr.size {
            let freed = self.commit(&[Op::Extend { ino: inode.ino, size: attr.size, mtime: attr.mtime }])?;
            self.release_freed(freed);
        }
        Ok(())
    }

    /// [`Inner::sync_file_locked`] for every file (unmount).
    pub(crate) fn sync_all(&self) -> Result<()> {
        for inode in self.meta.snapshot().into_iter().filter(|i| i.kind == FileKind::File) {
            let _guard = inode.range.write(0, u64::MAX);
            if self.meta.get(inode.ino).is_some() {
                self.sync_file_locked(&inode)?;
            }
        }
        Ok(())
    }

    /// Flush the blocks whose residue unit became full (WSBuffer's stage 2: no read
    /// needed), a batch at a time, until the queue is empty. Returns how many moved.
    pub(crate) fn flush_full_units(&self) -> Result<u64> {
        let mut moved = 0;
        // Blocks a writer holds wait for the next round.
        let mut busy = Vec::new();
        let result = loop {
            let batch: Vec<(Ino, u64)> = {
                let mut queue = self.full_units.lock();
                queue.sort_unstable();
                queue.dedup();
                let n = queue.len().min(self.migration_batch());
                queue.drain(..n).collect()
            };
            if batch.is_empty() {
                break Ok(moved);
            }
            let files: Vec<(Arc<Inode>, u64)> = batch.into_iter().filter_map(|(ino, lb)| Some((self.meta.get(ino)?, lb))).collect();
            match self.migrate_blocks_watched(files, Counter::migrations_full) {
                Ok((n, mut left)) => {
                    moved += n;
                    busy.append(&mut left);
                }
                Err(e) => break Err(e),
            }
        };
        self.full_units.lock().extend(busy);
        result
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use crate::stats::Counter;
    use crate::volume::test_volume as volume;
    use crate::{Ino, Volume};

    fn read_all(v: &Volume, f: Ino, len: usize) -> Vec<u8> {
        let mut out = vec![0; len];
        assert_eq!(v.read(f, 0, &mut out).unwrap(), len);
        out
    }

    /// Debug builds catch a write submitted over a range another IO has in flight; reads
    /// may share a range.
    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "overlaps a Read")]
    fn a_write_over_an_io_in_flight_is_caught() {
        use crate::device::{AlignedBuf, IoOp, IoRequest};
        let v = volume();
        let io = |op, offset_bytes| vec![IoRequest { op, offset_bytes, buf: AlignedBuf::zeroed(8192) }];
        let first = v.inner.submit_ssd(io(IoOp::Read, 1 << 20));
        let second = v.inner.submit_ssd(io(IoOp::Read, (1 << 20) + 4096));
        drop((first, second));
        let _reading = v.inner.submit_ssd(io(IoOp::Read, 1 << 20));
        let _writing = v.inner.submit_ssd(io(IoOp::Write, (1 << 20) + 4096));
    }

    /// A write that lands between a merge's copy and its commit must win; a block nobody
    /// touched must move.
    #[test]
    fn a_write_during_a_watched_merge_is_kept() {
        let v = volume();
        let f = v.create_file(Ino::ROOT, b"f", 0o644, 0, 0).unwrap().ino;
        let block = v.inner.geometry.block() as usize;
        let mut expect: Vec<u8> = (0..4 * block).map(|i| (i % 251) as u8).collect();
        v.write(f, 0, &expect).unwrap();
        v.migrate_all().unwrap();
        // Residue in blocks 1 and 2: upage chunks over SSD blocks.
        for at in [block + 100, 2 * block + 100] {
            v.write(f, at as u64, b"before").unwrap();
            expect[at..at + 6].copy_from_slice(b"before");
        }
        let inode = v.inner.file(f).unwrap();
        let merging = v.inner.start_watched_merge(vec![(Arc::clone(&inode), 1), (Arc::clone(&inode), 2)]).unwrap();
        assert_eq!(merging.work.len(), 2);
        // Block 1 is written meanwhile, in place in the same upage.
        v.write(f, (block + 102) as u64, b"AFTER").unwrap();
        expect[block + 102..block + 107].copy_from_slice(b"AFTER");
        let used_before = v.inner.blocks.used_count();
        let (moved, left) = v.inner.finish_watched_merge(merging, Counter::migrations_watermark).unwrap();
        assert_eq!((moved, left), (1, vec![(f, 1)]));
        assert_eq!(v.inner.stats.get(Counter::migrations_dropped), 1);
        // Block 2 moved (its old SSD block freed), block 1's unused new block was freed.
        assert_eq!(v.inner.blocks.used_count(), used_before - 2);
        assert!(inode.map.lock()[&1].fast_page_count() > 0);
        assert_eq!(inode.map.lock()[&2].fast_page_count(), 0);
        assert_eq!(read_all(&v, f, expect.len()), expect);
        v.migrate_all().unwrap();
        assert_eq!(read_all(&v, f, expect.len()), expect);
        assert_eq!(v.check(), []);
    }
}
