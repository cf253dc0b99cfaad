//! The block store: the SSDs of a volume and what is kept about their blocks — which are
//! used or shared ([`BlockRefs`]), where a block's next image goes ([`BlockPlacement`]),
//! their checksums and DRAM copies where the profile keeps them — with IO submission,
//! in-flight accounting, and shared (group) flushes.

#[cfg(debug_assertions)]
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use super::clean_pages::CleanPages;
use crate::device::{AlignedBuf, BlockDevice, BufferPool, IoOp, IoRequest, IoTicket};
use crate::error::{Error, Result};
use crate::geometry::{Geometry, IO_ALIGN};
use crate::layout::{BlockChecksums, BlockRefs};
use crate::map::{BlockEntry, SsdBlock};
use crate::stats::{Counter, Stats};

/// Where the next SSD image of one logical block goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Placement {
    /// Over the block's current SSD block.
    InPlace(SsdBlock),
    /// A new SSD block: `home` if that is free when allocated, any other otherwise.
    New { home: Option<u64> },
}

/// An SSD block a merge or write sends an image to, and whether it was allocated for it
/// (so an undo frees it) or is the block's own, rewritten in place.
#[derive(Clone, Copy, Debug)]
pub(super) struct Target {
    pub block: SsdBlock,
    pub new: bool,
}

/// How a volume places the blocks it rewrites: chosen once, at open, from its profile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BlockPlacement {
    /// Every rewrite takes a new block, so a crash finds the old image or the new one
    /// (profiles durable on every write).
    OutOfPlace,
    /// A block the file owns alone is overwritten where it is: a crash may leave any mix
    /// of its old and new bytes, which a promise of durability only on sync allows, and
    /// the map edit, its journal record and a flush are spared (`scrap`).
    InPlaceUntilSync,
    /// Logical block `n` of a file lives at SSD block `base + n` where that was free, and
    /// every rewrite and merge goes there, as on the disk a block volume stands for
    /// (`uhs`, one SSD).
    AtHome { base: u64 },
}

/// What the block store holds.
pub(crate) struct BlockStore {
    ssd: Arc<dyn BlockDevice>,
    geometry: Geometry,
    /// Bytes of each SSD of the set.
    member_bytes: u64,
    /// Which blocks are used, shared, pinned or promised.
    pub(super) refs: BlockRefs,
    placement: BlockPlacement,
    /// Every SSD block's CRC32C, where the profile verifies reads (`nvstore`).
    checksums: Option<BlockChecksums>,
    /// Copies of SSD blocks, where the profile keeps clean pages (`nvstore`, `byte`).
    clean: Option<CleanPages>,
    /// Aligned buffers for block images.
    pub(super) buffers: BufferPool,
    stats: Arc<Stats>,
    /// SSD writes completed so far, and how many of them the last completed flush covers:
    /// a commit that makes a map point at new SSD blocks waits until they are flushed.
    writes_done: AtomicU64,
    writes_flushed: Mutex<u64>,
    /// The last SSD flush failed: writes that needed it failed too, and the next fsync
    /// retries it.
    flush_failed: AtomicBool,
    /// SSD bytes submitted and not yet complete, per SSD (the flusher's busyness gauge).
    in_flight: Vec<AtomicU64>,
    /// Debug builds check that no SSD write shares its range with another IO in flight.
    #[cfg(debug_assertions)]
    io_ranges: InFlightRanges,
}

/// In-flight SSD bytes at which the SSD counts as busy (WSBuffer's threshold).
const SSD_BUSY_BYTES: u64 = 4 << 20;

/// What a block store is built from at open.
pub(crate) struct BlockStoreParts {
    pub ssd: Arc<dyn BlockDevice>,
    pub geometry: Geometry,
    pub member_bytes: u64,
    pub ssd_count: usize,
    pub refs: BlockRefs,
    pub placement: BlockPlacement,
    pub checksums: Option<BlockChecksums>,
    pub clean: Option<CleanPages>,
    pub stats: Arc<Stats>,
}

impl BlockStore {
    pub(crate) fn new(parts: BlockStoreParts) -> BlockStore {
        let BlockStoreParts { ssd, geometry, member_bytes, ssd_count, refs, placement, checksums, clean, stats } = parts;
        BlockStore {
            ssd,
            geometry,
            member_bytes,
            refs,
            placement,
            checksums,
            clean,
            buffers: BufferPool::new(64 << 20),
            stats,
            writes_done: AtomicU64::new(0),
            writes_flushed: Mutex::new(0),
            flush_failed: AtomicBool::new(false),
            in_flight: (0..ssd_count).map(|_| AtomicU64::new(0)).collect(),
            #[cfg(debug_assertions)]
            io_ranges: InFlightRanges::default(),
        }
    }

    /// The SSD (or set) itself.
    pub(crate) fn ssd(&self) -> &Arc<dyn BlockDevice> {
        &self.ssd
    }

    /// How many SSDs the volume spans.
    pub(crate) fn ssd_count(&self) -> usize {
        self.in_flight.len()
    }

    pub(crate) fn checksums(&self) -> Option<&BlockChecksums> {
        self.checksums.as_ref()
    }

    /// Whether the last SSD flush failed (the next fsync retries it).
    pub(crate) fn flush_failed(&self) -> bool {
        self.flush_failed.load(Ordering::SeqCst)
    }

    /// Count completed SSD writes; [`BlockStore::flush`] makes them durable.
    pub(super) fn written(&self) {
        self.writes_done.fetch_add(1, Ordering::SeqCst);
    }

    /// Flush the SSD's volatile cache so that every write completed before this call is
    /// durable. Concurrent callers share flushes: one whose writes a flush that ran while
    /// it waited already covered returns at once (group commit).
    pub(crate) fn flush(&self) -> Result<()> {
        let wanted = self.writes_done.load(Ordering::SeqCst);
        if !self.ssd.needs_flush() {
            self.stats.add(Counter::ssd_flushes_skipped, 1);
            return Ok(());
        }
        let mut flushed = self.writes_flushed.lock();
        if *flushed >= wanted {
            self.stats.add(Counter::ssd_flushes_skipped, 1);
            return Ok(());
        }
        let covered = self.writes_done.load(Ordering::SeqCst);
        if let Err(e) = self.ssd.flush() {
            self.flush_failed.store(true, Ordering::SeqCst);
            return Err(e);
        }
        self.flush_failed.store(false, Ordering::SeqCst);
        *flushed = covered;
        self.stats.add(Counter::ssd_flushes, 1);
        Ok(())
    }

    /// Whether blocks keep their homes ([`BlockPlacement::AtHome`]).
    pub(super) fn keeps_blocks_home(&self) -> bool {
        matches!(self.placement, BlockPlacement::AtHome { .. })
    }

    /// Whether a write may overwrite a block the file owns alone where it is.
    pub(super) fn rewrites_in_place(&self) -> bool {
        self.placement != BlockPlacement::OutOfPlace
    }

    /// Whether a write that only overwrote blocks in place leaves them unflushed until the
    /// file's next sync (the promise is durability on sync).
    pub(super) fn flushes_on_sync(&self) -> bool {
        self.placement == BlockPlacement::InPlaceUntilSync
    }

    /// Where block `lblock`'s next image goes, its entry being `current`. `in_place`:
    /// whether this write may rewrite an unshared SSD block where it is (no merge reads it
    /// unlocked, and the placement allows it). A block that keeps a home but sits
    /// elsewhere (its home was taken when it moved) goes back as soon as the home is free;
    /// otherwise it stays where it is.
    pub(super) fn placement(&self, lblock: u64, current: Option<&BlockEntry>, in_place: bool) -> Placement {
        let home = match self.placement {
            BlockPlacement::AtHome { base } => Some(base + lblock).filter(|&h| h < self.refs.capacity()),
            _ => None,
        };
        match current {
            Some(BlockEntry::Ssd { block, shared: false, .. }) if in_place => match home {
                Some(h) if h != block.0 && !self.refs.is_used(h) => Placement::New { home },
                _ => Placement::InPlace(*block),
            },
            _ => Placement::New { home },
        }
    }

    /// The home of logical block `lblock`, where blocks keep homes.
    #[cfg(test)]
    pub(super) fn home_of(&self, lblock: u64) -> Option<u64> {
        match self.placement {
            BlockPlacement::AtHome { base } => Some(base + lblock),
            _ => None,
        }
    }

    /// The SSD blocks `placements` name, allocating the new ones (at their homes where
    /// free; otherwise on `members`, one per new block, as [`BlockStore::allocate`]);
    /// `None`, and nothing taken, if the SSD is full.
    pub(super) fn place(&self, placements: &[Placement], members: &[usize], redeem: u64) -> Option<Vec<Target>> {
        let new_blocks = if self.keeps_blocks_home() {
            let homes: Vec<Option<u64>> =
                placements.iter().filter_map(|p| if let Placement::New { home } = p { Some(*home) } else { None }).collect();
            self.refs.allocate_preferring(&homes, redeem)?.into_iter().map(SsdBlock).collect()
        } else {
            self.allocate(members, redeem)?
        };
        let mut next_new = new_blocks.into_iter();
        Some(
            placements
                .iter()
                .map(|p| match p {
                    Placement::InPlace(block) => Target { block: *block, new: false },
                    Placement::New { .. } => Target { block: next_new.next().expect("a new block for every new placement"), new: true },
                })
                .collect(),
        )
    }

    /// Free the blocks of `targets` that were allocated for them.
    pub(super) fn release_new(&self, targets: &[Target]) {
        let new: Vec<SsdBlock> = targets.iter().filter(|t| t.new).map(|t| t.block).collect();
        self.release(&new);
    }

    /// Return blocks to the allocator, and drop their copies.
    pub(crate) fn release(&self, blocks: &[SsdBlock]) {
        if blocks.is_empty() {
            return;
        }
        self.refs.release(blocks.iter().map(|b| b.0));
        if let Some(clean) = &self.clean {
            clean.forget(blocks);
        }
    }

    /// Split `(block, tag)` pairs into runs of physically consecutive blocks of at most
    /// `split_bytes` that do not cross a split boundary (so each run still belongs to one
    /// IO worker): fewer, larger IOs, as many in flight as before.
    pub(super) fn runs<'t, T>(&self, targets: &'t [(SsdBlock, T)]) -> Vec<Vec<&'t (SsdBlock, T)>> {
        let per_run = self.blocks_per_run();
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

    /// The runs that `blocks` blocks take when they are consecutive: as many as split
    /// units they fill, one more where they start inside one.
    pub(super) fn runs_when_consecutive(&self, blocks: usize) -> usize {
        blocks.div_ceil(self.blocks_per_run() as usize) + 1
    }

    fn blocks_per_run(&self) -> u64 {
        (u64::from(self.geometry.split_bytes) / self.geometry.block()).max(1)
    }
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

/// The SSD ranges of the batches in flight, by batch. Blocks are written out of place, or
/// in place only under their file's lock and never while a merge has them pinned, and
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
pub(super) fn wait_all(batches: Vec<InFlight<'_>>) -> Result<Vec<AlignedBuf>> {
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

impl BlockStore {
    /// Which SSD of the volume holds byte `offset` of the SSD address space.
    pub(crate) fn member_of(&self, offset: u64) -> usize {
        ((offset / self.member_bytes) as usize).min(self.in_flight.len() - 1)
    }

    /// Submit a batch to the SSDs, counting its bytes as in flight until it is waited for.
    ///
    /// Every data write covers whole blocks (invariant 1: no read-modify-write in the SSD;
    /// [`BlockStore::submit_sectors`] for a merge's sectors); checked in release builds
    /// too, as the test costs nothing beside the IO.
    pub(crate) fn submit(&self, batch: Vec<IoRequest>) -> InFlight<'_> {
        let block = self.geometry.block();
        for request in batch.iter().filter(|r| r.op == IoOp::Write) {
            let (at, len) = (request.offset_bytes, request.buf.len() as u64);
            assert!(at % block == 0 && len % block == 0, "SSD write of {len} bytes at {at} is not whole {block}-byte blocks");
            if let Some(checksums) = &self.checksums {
                checksums.record(SsdBlock(at / block), &request.buf, block as usize);
            }
            if let Some(clean) = &self.clean {
                clean.wrote(SsdBlock(at / block), &request.buf);
            }
        }
        self.submit_checked(batch)
    }

    /// Submit a batch whose writes were checked, counting its bytes as in flight.
    fn submit_checked(&self, batch: Vec<IoRequest>) -> InFlight<'_> {
        let mut bytes = vec![0u64; self.in_flight.len()];
        for request in &batch {
            bytes[self.member_of(request.offset_bytes)] += request.buf.len() as u64;
        }
        for (gauge, n) in self.in_flight.iter().zip(&bytes) {
            gauge.fetch_add(*n, Ordering::Relaxed);
        }
        #[cfg(debug_assertions)]
        let ranges = (&self.io_ranges, self.io_ranges.enter(&batch));
        InFlight {
            gauges: &self.in_flight,
            bytes,
            ticket: Some(self.ssd.submit(batch)),
            #[cfg(debug_assertions)]
            ranges,
        }
    }

    /// Whether a block may be rewritten by sector ([`BlockStore::submit_sectors`]): not
    /// where a checksum or a DRAM copy stands for the whole block.
    pub(crate) fn writes_sectors(&self) -> bool {
        self.checksums.is_none() && self.clean.is_none()
    }

    /// Submit writes of whole 4 KiB sectors over blocks rewritten in place (a merge that
    /// writes back only the sectors its residue touched). Sectors are the SSD's own unit,
    /// so the device still does no read-modify-write. Each write stays in one block.
    pub(crate) fn submit_sectors(&self, batch: Vec<IoRequest>) -> InFlight<'_> {
        assert!(self.writes_sectors(), "sector writes on a volume that keeps whole-block checksums or copies");
        let block = self.geometry.block();
        for request in &batch {
            let (at, len) = (request.offset_bytes, request.buf.len() as u64);
            assert!(request.op == IoOp::Write, "submit_sectors takes writes");
            assert!(
                at % IO_ALIGN as u64 == 0 && len % IO_ALIGN as u64 == 0 && len > 0 && at / block == (at + len - 1) / block,
                "SSD sector write of {len} bytes at {at} is not whole sectors of one block"
            );
        }
        self.submit_checked(batch)
    }

    /// Check whole blocks read from `first` on against their checksums, where the profile
    /// keeps them; a mismatch is corrupt data on the SSD, reported with its block.
    pub(crate) fn verify_read(&self, first: SsdBlock, image: &[u8]) -> Result<()> {
        let Some(checksums) = &self.checksums else { return Ok(()) };
        checksums.verify(first, image, self.geometry.block() as usize).map_err(|m| {
            self.stats.add(Counter::checksum_errors, 1);
            Error::corrupt(
                "data block",
                &self.ssd.describe(),
                m.block.0 * self.geometry.block(),
                format!("SSD block {} fails its checksum (recorded {:#010x}, read {:#010x})", m.block.0, m.expected, m.found),
            )
        })
    }

    /// Whether SSD `member` has at least the busy threshold of the volume's IO in flight
    /// (WSBuffer: 4 MiB); stage-1 flushing waits for it to calm down.
    pub(crate) fn busy(&self, member: usize) -> bool {
        self.in_flight[member].load(Ordering::Relaxed) >= SSD_BUSY_BYTES
    }

    /// For `n` new blocks, the SSD each should go to: the least loaded, counting the
    /// blocks already assigned (WSBuffer's delayed allocation).
    pub(super) fn least_busy_members(&self, n: usize) -> Vec<usize> {
        let block = self.geometry.block();
        let mut load: Vec<u64> = self.in_flight.iter().map(|g| g.load(Ordering::Relaxed)).collect();
        (0..n)
            .map(|_| {
                let member = (0..load.len()).min_by_key(|&m| load[m]).unwrap_or(0);
                load[member] += block;
                member
            })
            .collect()
    }

    /// One new SSD block on each SSD named (another SSD when that one is full); all or
    /// none. `redeem` of them come from promises the caller holds (zero blocks it
    /// replaces); on failure those promises are still held.
    pub(super) fn allocate(&self, members: &[usize], redeem: u64) -> Option<Vec<SsdBlock>> {
        if self.in_flight.len() == 1 {
            return self.refs.allocate(members.len(), redeem).map(|ids| ids.into_iter().map(SsdBlock).collect());
        }
        let per_member = self.member_bytes / self.geometry.block();
        let count = self.in_flight.len() as u64;
        let mut taken = Vec::with_capacity(members.len());
        for (i, &member) in members.iter().enumerate() {
            let redeeming = (i as u64) < redeem;
            let found = (0..count)
                .map(|k| (member as u64 + k) % count)
                .find_map(|m| self.refs.allocate_in(m * per_member..(m + 1) * per_member, redeeming));
            match found {
                Some(id) => taken.push(SsdBlock(id)),
                None => {
                    self.release(&taken);
                    self.refs.restore_promises(redeem.min(taken.len() as u64));
                    return None;
                }
            }
        }
        Some(taken)
    }
}

impl BlockStore {
    /// A DRAM copy of `block`, where the store keeps them.
    pub(super) fn copy_of(&self, block: SsdBlock) -> Option<Arc<[u8]>> {
        self.clean.as_ref()?.get(block)
    }

    /// Take `block`'s copy out of the cache (a merge about to rewrite it).
    pub(super) fn take_copy(&self, block: SsdBlock) -> Option<Arc<[u8]>> {
        self.clean.as_ref()?.take(block)
    }

    /// Keep a copy of blocks read from `first` on, where the store keeps copies.
    pub(super) fn keep_read(&self, first: SsdBlock, image: &[u8]) {
        if let Some(clean) = &self.clean {
            clean.read(first, image);
        }
    }

    /// Whether the store keeps DRAM copies of blocks.
    pub(super) fn keeps_copies(&self) -> bool {
        self.clean.is_some()
    }

    /// Whether blocks are checked against checksums when read.
    pub(super) fn verifies_reads(&self) -> bool {
        self.checksums.is_some()
    }

    /// Drop every copy (the next reads go to the device).
    pub(crate) fn drop_copies(&self) {
        if let Some(clean) = &self.clean {
            clean.clear();
        }
    }

    pub(crate) fn describe(&self) -> String {
        self.ssd.describe()
    }

    /// Bytes of the SSD the host's page cache holds.
    pub(crate) fn cached_bytes(&self) -> Option<u64> {
        self.ssd.cached_bytes()
    }
}

#[cfg(test)]
mod tests {
    use crate::volume::test_volume as volume;

    /// Debug builds catch a write submitted over a range another IO has in flight; reads
    /// may share a range.
    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "overlaps a Read")]
    fn a_write_over_an_io_in_flight_is_caught() {
        use crate::device::{AlignedBuf, IoOp, IoRequest};
        let v = volume();
        let io = |op, offset_bytes| vec![IoRequest { op, offset_bytes, buf: AlignedBuf::zeroed(8192) }];
        let first = v.inner.blocks.submit(io(IoOp::Read, 1 << 20));
        let second = v.inner.blocks.submit(io(IoOp::Read, (1 << 20) + 4096));
        drop((first, second));
        let _reading = v.inner.blocks.submit(io(IoOp::Read, 1 << 20));
        // A merge's sector write, whole blocks apart, is checked as any other.
        let _writing = v.inner.blocks.submit_sectors(io(IoOp::Write, (1 << 20) + 4096));
    }

    /// A data write that does not cover whole blocks is refused in every build.
    #[test]
    #[should_panic(expected = "is not whole")]
    fn a_partial_block_write_is_caught() {
        use crate::device::{AlignedBuf, IoOp, IoRequest};
        let v = volume();
        let block = v.inner.geometry.block();
        let _writing = v.inner.blocks.submit(vec![IoRequest { op: IoOp::Write, offset_bytes: block, buf: AlignedBuf::zeroed(4096) }]);
    }
}
