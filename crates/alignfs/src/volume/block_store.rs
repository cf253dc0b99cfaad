//! The block store: SSD IO submission and in-flight accounting, block allocation across
//! the SSDs of a volume, and shared (group) flushes.

#[cfg(debug_assertions)]
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};

use super::Inner;
use crate::device::{AlignedBuf, IoOp, IoRequest, IoTicket};
use crate::error::{Error, Result};
use crate::map::{BlockEntry, SsdBlock};
use crate::stats::Counter;

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

/// In-flight SSD bytes at which the SSD counts as busy (WSBuffer's threshold).
const SSD_BUSY_BYTES: u64 = 4 << 20;

impl Inner {
    /// Count completed SSD writes; [`Inner::flush_ssd`] makes them durable.
    pub(super) fn ssd_written(&self) {
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

    /// Whether the profile keeps blocks at their homes ([`crate::profile::Policy::keeps_blocks_home`]).
    pub(super) fn keeps_blocks_home(&self) -> bool {
        self.home_base.is_some()
    }

    /// Where block `lblock`'s next image goes, its entry being `current`. `in_place`:
    /// whether this write may rewrite an unshared SSD block where it is (no merge reads it
    /// unlocked, and the profile's promise allows a torn block). A block that keeps a home
    /// but sits elsewhere (its home was taken when it moved) goes back as soon as the home
    /// is free; otherwise it stays where it is.
    pub(super) fn placement(&self, lblock: u64, current: Option<&BlockEntry>, in_place: bool) -> Placement {
        let home = self.home_base.map(|base| base + lblock).filter(|&h| h < self.blocks.capacity());
        match current {
            Some(BlockEntry::Ssd { block, shared: false, .. }) if in_place => match home {
                Some(h) if h != block.0 && !self.blocks.is_used(h) => Placement::New { home },
                _ => Placement::InPlace(*block),
            },
            _ => Placement::New { home },
        }
    }

    /// The SSD blocks `placements` name, allocating the new ones (at their homes where
    /// free; otherwise on `members`, one per new block, as [`Inner::allocate_blocks`]);
    /// `None`, and nothing taken, if the SSD is full.
    pub(super) fn place(&self, placements: &[Placement], members: &[usize], redeem: u64) -> Option<Vec<Target>> {
        let new_blocks = if self.keeps_blocks_home() {
            let homes: Vec<Option<u64>> =
                placements.iter().filter_map(|p| if let Placement::New { home } = p { Some(*home) } else { None }).collect();
            self.blocks.allocate_preferring(&homes, redeem)?.into_iter().map(SsdBlock).collect()
        } else {
            self.allocate_blocks(members, redeem)?
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
        self.release(&[], &new);
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

impl Inner {
    /// Which SSD of the volume holds byte `offset` of the SSD address space.
    pub(crate) fn member_of(&self, offset: u64) -> usize {
        ((offset / self.superblock.member_bytes()) as usize).min(self.ssd_in_flight.len() - 1)
    }

    /// Submit a batch to the SSDs, counting its bytes as in flight until it is waited for.
    ///
    /// Every data write covers whole blocks (invariant 1: no read-modify-write in the SSD);
    /// checked in release builds too, as the test costs nothing beside the IO.
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
        InFlight {
            gauges: &self.ssd_in_flight,
            bytes,
            ticket: Some(self.ssd.submit(batch)),
            #[cfg(debug_assertions)]
            ranges,
        }
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
    pub(crate) fn ssd_busy(&self, member: usize) -> bool {
        self.ssd_in_flight[member].load(Ordering::Relaxed) >= SSD_BUSY_BYTES
    }

    /// For `n` new blocks, the SSD each should go to: the least loaded, counting the
    /// blocks already assigned (WSBuffer's delayed allocation).
    pub(super) fn least_busy_members(&self, n: usize) -> Vec<usize> {
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
    /// none. `redeem` of them come from promises the caller holds (zero blocks it
    /// replaces); on failure those promises are still held.
    pub(super) fn allocate_blocks(&self, members: &[usize], redeem: u64) -> Option<Vec<SsdBlock>> {
        if self.ssd_in_flight.len() == 1 {
            return self.blocks.allocate(members.len(), redeem).map(|ids| ids.into_iter().map(SsdBlock).collect());
        }
        let per_member = self.superblock.member_bytes() / self.geometry.block();
        let count = self.ssd_in_flight.len() as u64;
        let mut taken = Vec::with_capacity(members.len());
        for (i, &member) in members.iter().enumerate() {
            let redeeming = (i as u64) < redeem;
            let found = (0..count)
                .map(|k| (member as u64 + k) % count)
                .find_map(|m| self.blocks.allocate_in(m * per_member..(m + 1) * per_member, redeeming));
            match found {
                Some(id) => taken.push(SsdBlock(id)),
                None => {
                    self.release(&[], &taken);
                    self.blocks.restore_promises(redeem.min(taken.len() as u64));
                    return None;
                }
            }
        }
        Some(taken)
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
        let first = v.inner.submit_ssd(io(IoOp::Read, 1 << 20));
        let second = v.inner.submit_ssd(io(IoOp::Read, (1 << 20) + 4096));
        drop((first, second));
        let _reading = v.inner.submit_ssd(io(IoOp::Read, 1 << 20));
        let _writing = v.inner.submit_ssd(io(IoOp::Write, (1 << 20) + 4096));
    }

    /// A data write that does not cover whole blocks is refused in every build.
    #[test]
    #[should_panic(expected = "is not whole")]
    fn a_partial_block_write_is_caught() {
        use crate::device::{AlignedBuf, IoOp, IoRequest};
        let v = volume();
        let block = v.inner.geometry.block();
        let _writing = v.inner.submit_ssd(vec![IoRequest { op: IoOp::Write, offset_bytes: block, buf: AlignedBuf::zeroed(4096) }]);
    }
}
