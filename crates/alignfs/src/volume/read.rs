//! The read path: assemble a range from its SSD blocks and the residue laid over them.

use std::ops::Range;
use std::sync::Arc;

use super::{Engine, ReadMode};
use crate::device::{IoOp, IoRequest};
use crate::error::{Error, Result};
use crate::geometry::IO_ALIGN;
use crate::map::{BlockEntry, Chunks, Overlay, PageNo, SsdBlock};
use crate::meta::{Ino, Inode};
use crate::stats::Counter;

/// Whether a read may wait for the SSD.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wait {
    ForDevice,
    /// Fail with [`Error::WouldBlock`] instead.
    Never,
}

/// What `seek` looks for (SEEK_DATA / SEEK_HOLE).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SeekTarget {
    Data,
    Hole,
}

/// The first offset at or after `offset` that starts data or a hole, at block
/// granularity; the end of the file counts as a hole, and so does a zero block
/// (`fallocate`'s, like ext4's unwritten extents). `BeyondEnd` past EOF.
pub(super) fn seek(engine: &Engine, ino: Ino, offset: u64, target: SeekTarget) -> Result<u64> {
    let inode = engine.file(ino)?;
    let size = inode.size();
    if offset >= size {
        return Err(Error::BeyondEnd);
    }
    let block = engine.geometry.block();
    let map = inode.map.lock();
    match target {
        SeekTarget::Data => {
            let first = map.range(offset / block..).find(|(_, e)| !e.is_zeros()).map(|(&lb, _)| lb * block).filter(|&start| start < size);
            first.map(|start| start.max(offset)).ok_or(Error::BeyondEnd)
        }
        SeekTarget::Hole => {
            let mut lb = offset / block;
            while lb * block < size && map.get(&lb).is_some_and(|e| !e.is_zeros()) {
                lb += 1;
            }
            Ok((lb * block).clamp(offset, size))
        }
    }
}

/// What has been read from and written to a file (object) since the volume opened:
/// (writes, bytes written, reads, bytes read).
pub(super) fn object_io(engine: &Engine, ino: Ino) -> Result<(u64, u64, u64, u64)> {
    Ok(engine.get(ino)?.io.snapshot())
}

/// Read into `buf` from `offset`; returns the bytes read (short at EOF).
pub(super) fn read(engine: &Engine, ino: Ino, offset: u64, buf: &mut [u8]) -> Result<usize> {
    read_with(engine, ino, offset, buf, Wait::ForDevice, engine.options.read_mode)
}

/// [`Volume::read`] for a reader that keeps the bytes (the kernel's page cache of a
/// mounted file): the SSD is read directly, so that the host's cache of it does not
/// hold the same bytes a second time.
pub(super) fn read_kept_by_reader(engine: &Engine, ino: Ino, offset: u64, buf: &mut [u8]) -> Result<usize> {
    read_with(engine, ino, offset, buf, Wait::ForDevice, ReadMode::Direct)
}

/// [`Volume::read`] only if no byte has to come from the device: the residue tier,
/// clean pages or the kernel's cache of the SSD (buffered read mode) hold them all.
/// [`Error::WouldBlock`] otherwise, with nothing counted, so the caller can read
/// again, waiting, on a thread where that is cheap.
pub(super) fn read_if_cached(engine: &Engine, ino: Ino, offset: u64, buf: &mut [u8]) -> Result<usize> {
    read_with(engine, ino, offset, buf, Wait::Never, engine.options.read_mode)
}

/// [`Volume::read`] on behalf of no application: what a mount reads to fill the
/// kernel's page cache, counted apart from the application's reads; the kernel keeps the
/// bytes, so the SSD is read directly.
pub(super) fn read_for_page_cache(engine: &Engine, ino: Ino, offset: u64, buf: &mut [u8]) -> Result<usize> {
    let inode = engine.file(ino)?;
    let n = read_file(engine, &inode, offset, buf, Wait::ForDevice, ReadMode::Direct)?;
    engine.stats.add(Counter::page_cache_fill_bytes, n as u64);
    Ok(n)
}

pub(super) fn read_with(engine: &Engine, ino: Ino, offset: u64, buf: &mut [u8], wait: Wait, mode: ReadMode) -> Result<usize> {
    let inode = engine.file(ino)?;
    let n = read_file(engine, &inode, offset, buf, wait, mode)?;
    inode.io.read(n as u64);
    engine.stats.add(Counter::app_reads, 1);
    engine.stats.add(Counter::app_read_bytes, n as u64);
    Ok(n)
}

/// NVStore's read of a fragment page (Table 2, FP -> DP): the SSD block just read
/// fills the page around its fragments, and the entry names the whole page, so later
/// reads and the sync read nothing from the device. The caller holds the block's read
/// lock, so no writer or merge changes it; the page's fragment bytes are left alone,
/// and what a crash keeps (the fragments) is unchanged.
pub(super) fn keep_merged(engine: &Engine, inode: &Inode, lblock: u64, entry: &BlockEntry, disk: &[u8]) {
    let BlockEntry::Ssd { overlays, .. } = entry else { return };
    let [(0, Overlay::Upage { page: unit, chunks })] = overlays.as_slice() else { return };
    if engine.geometry.pages_per_block() != 1 {
        return;
    }
    fill_around(engine, *unit, chunks, disk);
    let mut map = inode.map.lock();
    if let Some(BlockEntry::Ssd { overlays, .. }) = map.get_mut(&lblock) {
        if let [(0, overlay @ Overlay::Upage { .. })] = overlays.as_mut_slice() {
            if overlay.page() == *unit {
                *overlay = Overlay::Page(*unit);
                engine.stats.add(Counter::pages_merged_by_reads, 1);
            }
        }
    }
}

/// Write the block's bytes into a fragment page's unit wherever its chunks leave a gap.
pub(super) fn fill_around(engine: &Engine, unit: PageNo, chunks: &Chunks, block: &[u8]) {
    let page = engine.geometry.page_bytes;
    let mut at = 0u32;
    for &(start, end) in chunks.ranges().iter().chain(std::iter::once(&(page, page))) {
        if at < start {
            engine.residue.write(unit, at, &block[at as usize..start as usize]);
        }
        at = end;
    }
}

/// NVStore's unaligned write to a clean page (Table 2, CP → DP): the fragment page a
/// write leaves over a cached block is filled from the copy and becomes a whole dirty
/// page, so its reads and its sync need no device read. The copy leaves the clean
/// pages. Only memory changes: the fragments remain what a crash keeps. The caller
/// holds the block's write lock.
pub(super) fn dirty_from_clean(engine: &Engine, entry: &mut BlockEntry) {
    if !engine.policy.dirties_clean_pages() {
        return;
    }
    let BlockEntry::Ssd { block, overlays, .. } = entry else { return };
    let [(0, overlay @ Overlay::Upage { .. })] = overlays.as_mut_slice() else { return };
    if engine.geometry.pages_per_block() != 1 {
        return;
    }
    let Some(copy) = engine.blocks.take_copy(*block) else { return };
    if let Overlay::Upage { page: unit, chunks } = overlay {
        fill_around(engine, *unit, chunks, &copy);
        *overlay = Overlay::Page(*unit);
        engine.stats.add(Counter::pages_dirtied_from_clean, 1);
    }
}

/// After a block came from the device: a fragment page over it merges with it (Table
/// 2's FP → DP) where the profile keeps that; otherwise the block becomes a clean page
/// where the profile keeps those (its residue stays where it is and is laid over the
/// copy on every read).
pub(super) fn keep_block_read(engine: &Engine, inode: &Inode, lblock: u64, entry: &BlockEntry, block: SsdBlock, image: &[u8]) {
    let has_residue = matches!(entry, BlockEntry::Ssd { overlays, .. } if !overlays.is_empty());
    if has_residue && engine.policy.keep_merged_on_read() {
        keep_merged(engine, inode, lblock, entry, image);
    } else {
        engine.blocks.keep_read(block, image);
    }
}

/// Bytes of a read that come from the SSD with O_DIRECT: the aligned extent `at..at +
/// extent` of the device holds them `skip` bytes in; `len` of them go to `dest` in the
/// output. `whole` names the logical and SSD block when the extent is that whole block,
/// read so to be checked against its checksum or kept as a clean page.
struct DirectPiece {
    at: u64,
    extent: usize,
    skip: usize,
    dest: usize,
    len: usize,
    whole: Option<(u64, SsdBlock)>,
}

/// One O_DIRECT read: the pieces whose extents follow one another on the device, each
/// with where its extent starts in the read.
struct DirectRead {
    at: u64,
    len: usize,
    pieces: Vec<(usize, DirectPiece)>,
}

/// The fewest reads that cover `pieces`: a piece whose extent begins where the previous
/// one ends joins its read. (Blocks written together lie together on the SSD, so a range
/// written in one go is read in one IO.)
fn direct_reads(pieces: Vec<DirectPiece>) -> Vec<DirectRead> {
    let mut reads: Vec<DirectRead> = Vec::new();
    for piece in pieces {
        match reads.last_mut() {
            Some(read) if read.at + read.len as u64 == piece.at => {
                let in_read = read.len;
                read.len += piece.extent;
                read.pieces.push((in_read, piece));
            }
            _ => reads.push(DirectRead { at: piece.at, len: piece.extent, pieces: vec![(0, piece)] }),
        }
    }
    reads
}

/// A checksum error of a block read for `inode`, naming the object and the offset.
fn damaged_object(e: Error, inode: &Inode, offset: u64) -> Error {
    match e {
        Error::Corrupt { structure, device, offset: at, problem } => {
            Error::Corrupt { structure, device, offset: at, problem: format!("object {} at byte {offset}: {problem}", inode.ino.0) }
        }
        other => other,
    }
}

/// Reads through the kernel's cache of the SSD, as runs of (device offset, offset in the
/// output, length): a piece that continues the last run on the device and in the output
/// extends it.
#[derive(Default)]
struct Runs(Vec<(u64, usize, usize)>);

impl Runs {
    fn push(&mut self, device_at: u64, dest: usize, len: usize) {
        match self.0.last_mut() {
            Some((at, to, run)) if *at + *run as u64 == device_at && *to + *run == dest => *run += len,
            _ => self.0.push((device_at, dest, len)),
        }
    }
}

/// One piece of a read served from a fast page: (page, offset in page, offset in output, length).
type PageCopy = (PageNo, u32, usize, usize);

/// The bytes of one logical block: SSD block (if any) with overlays, or fast pages.
/// Returns the bytes read from the SSD.
pub(super) fn materialize(engine: &Engine, entry: Option<&BlockEntry>, image: &mut [u8]) -> Result<u64> {
    image.fill(0);
    let Some(entry) = entry else { return Ok(0) };
    let mut read = 0;
    if let (Some(block), true) = (entry.ssd_block(), needs_fill(engine, entry)) {
        if let Some(copy) = engine.blocks.copy_of(block) {
            image.copy_from_slice(&copy);
            engine.stats.add(Counter::clean_page_hits, 1);
            lay_residue(engine, entry, image)?;
            return Ok(0);
        }
        let request =
            IoRequest { op: IoOp::Read, offset_bytes: block.0 * engine.geometry.block(), buf: engine.blocks.buffers.take(image.len()) };
        let buf = engine.blocks.submit(vec![request]).wait()?.remove(0);
        if let Err(e) = engine.blocks.verify_read(block, &buf) {
            engine.blocks.buffers.give([buf]);
            return Err(e);
        }
        image.copy_from_slice(&buf);
        read = buf.len() as u64;
        engine.blocks.buffers.give([buf]);
        engine.stats.add(Counter::ssd_read_bytes, read);
    }
    lay_residue(engine, entry, image)?;
    Ok(read)
}

/// Whether merging `entry`'s residue needs its SSD copy: some page of the block is not
/// replaced whole by a residue page (WSBuffer's "unfilled" scrap page).
pub(super) fn needs_fill(engine: &Engine, entry: &BlockEntry) -> bool {
    match entry {
        BlockEntry::Fast { .. } => false,
        BlockEntry::Ssd { overlays, .. } => {
            overlays.iter().filter(|(_, o)| matches!(o, Overlay::Page(_))).count() < engine.geometry.pages_per_block()
        }
    }
}

/// Copy an entry's residue over `image` (which holds its SSD copy, or zeros).
pub(super) fn lay_residue(engine: &Engine, entry: &BlockEntry, image: &mut [u8]) -> Result<()> {
    let mut result = Ok(());
    residue_pieces(engine, entry, |range, unit, offset| {
        if result.is_ok() {
            result = engine.residue.read(unit, offset, &mut image[range]);
        }
    });
    result
}

/// Each piece of a block's residue: the bytes of the block it covers, and the unit and
/// offset in the unit that hold them.
pub(super) fn residue_pieces(engine: &Engine, entry: &BlockEntry, mut piece: impl FnMut(Range<usize>, PageNo, u32)) {
    let page = engine.geometry.page_bytes as usize;
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

pub(super) fn read_file(engine: &Engine, inode: &Arc<Inode>, offset: u64, buf: &mut [u8], wait: Wait, mode: ReadMode) -> Result<usize> {
    let block = engine.geometry.block();
    if buf.is_empty() || offset >= inode.size() {
        return Ok(0);
    }
    // No read without waiting where none could finish without the device or without
    // side effects: clean pages count their hits and merge on read (a read that gave
    // up halfway would count twice when repeated), checksummed blocks are read whole
    // into buffers, and direct reads bypass the kernel's cache.
    if wait == Wait::Never && (engine.blocks.keeps_copies() || engine.blocks.verifies_reads() || mode == ReadMode::Direct) {
        return Err(Error::WouldBlock);
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
    let ReadPlan { direct, cached, copies } = plan_read(engine, inode, &entries, offset, out, mode);
    // Blocks that lie one after another on the SSD are one read: a fresh file's blocks
    // mostly do, and the kernel reads ahead within one call, not across calls.
    read_cached_runs(engine, &cached, out, wait)?;
    let cached_bytes: usize = cached.0.iter().map(|&(_, _, len)| len).sum();
    let direct_bytes: usize = direct.iter().map(|piece| piece.len).sum();
    engine.stats.add(Counter::ssd_read_bytes, (cached_bytes + direct_bytes) as u64);
    if !direct.is_empty() {
        read_direct(engine, inode, &entries, offset, direct, out)?;
    }
    for (unit, in_page, dest, len) in copies {
        engine.residue.read(unit, in_page, &mut out[dest..dest + len])?;
    }
    Ok(n)
}

/// Where each byte of a read comes from: the device through the kernel's cache
/// (`cached`), the device directly (`direct`), or the residue tier (`copies`, applied
/// last because they overlay the SSD's bytes). Holes and clean copies are filled while
/// planning.
#[derive(Default)]
struct ReadPlan {
    direct: Vec<DirectPiece>,
    cached: Runs,
    copies: Vec<PageCopy>,
}

/// The plan for reading `out.len()` bytes at `offset`, whose blocks map as `entries`.
fn plan_read(
    engine: &Engine,
    inode: &Arc<Inode>,
    entries: &[(u64, Option<BlockEntry>)],
    offset: u64,
    out: &mut [u8],
    mode: ReadMode,
) -> ReadPlan {
    let (block, page) = (engine.geometry.block(), u64::from(engine.geometry.page_bytes));
    let n = out.len();
    let verified = engine.blocks.verifies_reads();
    let ReadPlan { mut direct, mut cached, mut copies } = ReadPlan::default();
    for (lb, entry) in entries {
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
            Some(whole @ BlockEntry::Ssd { block: ssd_block, overlays, .. }) => {
                let covered = |index: u64| overlays.iter().any(|(i, o)| u64::from(*i) == index && matches!(o, Overlay::Page(_)));
                let uncovered: Vec<u64> = (s / page..e.div_ceil(page)).filter(|&i| !covered(i)).collect();
                if let (Some(&lo), Some(&hi)) = (uncovered.first(), uncovered.last()) {
                    let (rs, re) = ((lo * page).max(s), ((hi + 1) * page).min(e));
                    let device_at = ssd_block.0 * block + rs;
                    let dest = out_at + (rs - s) as usize;
                    if let Some(copy) = engine.blocks.copy_of(*ssd_block) {
                        // A clean page: the block's bytes without the device.
                        engine.stats.add(Counter::clean_page_hits, 1);
                        out[dest..dest + (re - rs) as usize].copy_from_slice(&copy[rs as usize..re as usize]);
                        if engine.policy.keep_merged_on_read() {
                            keep_merged(engine, inode, *lb, whole, &copy);
                        }
                    } else {
                        let (rs, re) = (rs as usize, re as usize);
                        match mode {
                            // Read whole, to check against its checksum or to keep.
                            _ if verified || engine.blocks.keeps_copies() => {
                                let at = ssd_block.0 * block;
                                let whole = Some((*lb, *ssd_block));
                                direct.push(DirectPiece { at, extent: block as usize, skip: rs, dest, len: re - rs, whole });
                            }
                            ReadMode::Buffered => cached.push(device_at, dest, re - rs),
                            ReadMode::Direct => {
                                let align = IO_ALIGN as u64;
                                let (a0, a1) = (device_at / align * align, (device_at + (re - rs) as u64).div_ceil(align) * align);
                                let (skip, extent) = ((device_at - a0) as usize, (a1 - a0) as usize);
                                direct.push(DirectPiece { at: a0, extent, skip, dest, len: re - rs, whole: None });
                            }
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
    ReadPlan { direct, cached, copies }
}

/// Reads the runs that go through the kernel's cache. Several runs are prefetched
/// together first, so that scattered blocks the cache lacks are read from the device in
/// parallel, not one after another. (Probing the cache with a non-blocking read first
/// measured slower: it upsets the kernel's readahead.)
fn read_cached_runs(engine: &Engine, cached: &Runs, out: &mut [u8], wait: Wait) -> Result<()> {
    match wait {
        Wait::Never => {
            for &(device_at, dest, len) in &cached.0 {
                if !engine.blocks.ssd().read_cached(device_at, &mut out[dest..dest + len])? {
                    return Err(Error::WouldBlock);
                }
            }
        }
        Wait::ForDevice => {
            if cached.0.len() > 1 {
                cached.0.iter().for_each(|&(device_at, _, len)| engine.blocks.ssd().prefetch(device_at, len as u64));
            }
            for &(device_at, dest, len) in &cached.0 {
                engine.blocks.ssd().read_buffered(device_at, &mut out[dest..dest + len])?;
            }
        }
    }
    Ok(())
}

/// Reads the direct pieces in as few device reads as they allow, checks whole blocks
/// against their checksums and keeps the copies the profile keeps.
fn read_direct(
    engine: &Engine,
    inode: &Arc<Inode>,
    entries: &[(u64, Option<BlockEntry>)],
    offset: u64,
    direct: Vec<DirectPiece>,
    out: &mut [u8],
) -> Result<()> {
    let block = engine.geometry.block();
    let reads = direct_reads(direct);
    let requests = reads.iter().map(|read| IoRequest { op: IoOp::Read, offset_bytes: read.at, buf: engine.blocks.buffers.take(read.len) });
    let buffers = engine.blocks.submit(requests.collect()).wait()?;
    let mut damaged = None;
    for (buf, read) in buffers.iter().zip(reads) {
        for (in_read, DirectPiece { extent, skip, dest, len, whole, .. }) in read.pieces {
            let image = &buf[in_read..in_read + extent];
            if let Some((lb, ssd_block)) = whole {
                if let Err(e) = engine.blocks.verify_read(ssd_block, image) {
                    damaged.get_or_insert(damaged_object(e, inode, lb * block));
                    continue;
                }
                // `entries` holds the read's blocks in order, from its first.
                if let Some(entry) = &entries[(lb - offset / block) as usize].1 {
                    keep_block_read(engine, inode, lb, entry, ssd_block, image);
                }
            }
            out[dest..dest + len].copy_from_slice(&image[skip..skip + len]);
        }
    }
    // Only single blocks go back: reads of other sizes would fill the pool with
    // buffers the write path never asks for.
    engine.blocks.buffers.give(buffers.into_iter().filter(|buf| buf.len() == block as usize));
    damaged.map_or(Ok(()), Err)
}

#[cfg(test)]
mod tests {
    use super::{direct_reads, DirectPiece, Runs};
    use crate::map::SsdBlock;

    #[test]
    fn direct_pieces_that_follow_on_the_device_are_one_read() {
        let piece = |at: u64, extent: usize, skip: usize, dest: usize, len: usize| DirectPiece { at, extent, skip, dest, len, whole: None };
        let reads = direct_reads(vec![
            piece(32768, 32768, 100, 0, 32668),
            piece(65536, 32768, 0, 32668, 32768), // continues the first extent
            piece(98304, 4096, 0, 65436, 4000),   // and again
            piece(8192, 4096, 0, 69436, 4096),    // elsewhere
            piece(16384, 4096, 0, 73532, 4096),   // a gap of 4 KiB before it: a read of its own
        ]);
        let shape: Vec<(u64, usize, Vec<usize>)> =
            reads.iter().map(|r| (r.at, r.len, r.pieces.iter().map(|(in_read, _)| *in_read).collect())).collect();
        assert_eq!(shape, vec![(32768, 69632, vec![0, 32768, 65536]), (8192, 4096, vec![0]), (16384, 4096, vec![0])]);
        let verified = DirectPiece { at: 0, extent: 32768, skip: 0, dest: 0, len: 1, whole: Some((0, SsdBlock(0))) };
        assert_eq!(direct_reads(vec![verified]).len(), 1);
    }

    #[test]
    fn runs_join_pieces_that_continue_on_the_device_and_in_the_output() {
        let mut runs = Runs::default();
        runs.push(8192, 0, 4096);
        runs.push(12288, 4096, 4096); // continues both: one run
        runs.push(40960, 8192, 4096); // elsewhere on the device
        runs.push(45056, 16384, 4096); // next on the device, but a gap in the output
        assert_eq!(runs.0, vec![(8192, 0, 8192), (40960, 8192, 4096), (45056, 16384, 4096)]);
    }
}
