//! Changing a file's size or allocation: truncate, fallocate, hole punching.

use super::eof;
use super::read;
use super::write;
use std::sync::Arc;

use super::write::MAX_FILE_BYTES;
use super::{Engine, MAP_OPS_PER_RECORD};
use crate::device::AlignedBuf;
use crate::error::{Error, Result};
use crate::map::BlockEntry;
use crate::meta::{now_ns, DataOp, Ino, Inode, Op};
use crate::residue::UnitRequest;

/// `fallocate` modes the volume implements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FallocateMode {
    /// Allocate the holes and extend the size unless `keep_size`. A hole becomes a zero
    /// block: it reads as zeros and costs no SSD write, and it holds a promise of the SSD
    /// block that the first whole-block write to it takes, so that write cannot run out of
    /// space. A smaller write to it goes to the residue tier like any other and gives the
    /// promise up.
    Allocate { keep_size: bool },
    /// Deallocate and zero the range; the size never changes.
    PunchHole,
}

/// Set the size; shrinking frees whole blocks and zeroes the tail of the last one.
pub(super) fn truncate(engine: &Engine, ino: Ino, size: u64) -> Result<()> {
    let inode = engine.file(ino)?;
    engine.check_writable()?;
    if size > MAX_FILE_BYTES {
        return Err(Error::FileTooLarge);
    }
    let _guard = inode.range.write(0, u64::MAX);
    truncate_locked(engine, &inode, size)
}

pub(super) fn fallocate(engine: &Engine, ino: Ino, offset: u64, len: u64, mode: FallocateMode) -> Result<()> {
    let inode = engine.file(ino)?;
    engine.check_writable()?;
    if len == 0 {
        return Err(Error::InvalidArgument("fallocate of zero bytes".into()));
    }
    let end = offset.checked_add(len).filter(|&e| e <= MAX_FILE_BYTES).ok_or(Error::FileTooLarge)?;
    let block = engine.geometry.block();
    let _guard = inode.range.write(0, u64::MAX);
    let size = inode.size();
    match mode {
        FallocateMode::Allocate { keep_size } => {
            eof::clear_stale_tail(engine, &inode)?;
            let holes: Vec<u64> = {
                let map = inode.map.lock();
                (offset / block..=(end - 1) / block).filter(|lb| !map.contains_key(lb)).collect()
            };
            fill_with_zero_blocks(engine, &inode, &holes)?;
            if !keep_size && end > size {
                engine.release_freed(engine.commit(&[Op::Data(DataOp::Extend { ino, size: end, mtime: now_ns() })])?);
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
                map.range(first_whole..last_whole).map(|(&lblock, _)| Op::Data(DataOp::Map { ino, lblock, entry: None })).collect()
            } else {
                Vec::new()
            };
            if !drops.is_empty() {
                engine.release_freed(engine.commit(&drops)?);
            }
            let edges = [(offset, (first_whole * block).min(end)), ((last_whole * block).max(offset), end)];
            for (start, stop) in edges {
                let reads_zero = inode.map.lock().get(&(start / block)).is_none_or(BlockEntry::is_zeros);
                if start < stop && !reads_zero {
                    write::write_locked(engine, &inode, start, &vec![0u8; (stop - start) as usize], false)?;
                }
            }
        }
    }
    Ok(())
}

/// Map each of `holes` (logical blocks of `ino` with no entry) to a zero block, holding
/// one SSD block for each. With `NoSpace` nothing changes; other errors may leave the
/// first records committed.
pub(super) fn fill_with_zero_blocks(engine: &Engine, inode: &Inode, holes: &[u64]) -> Result<()> {
    if !engine.blocks.refs.promise(holes.len() as u64) {
        return Err(Error::NoSpace);
    }
    let ino = inode.ino;
    let mut unmapped = holes.len() as u64;
    for run in holes.chunks(MAP_OPS_PER_RECORD) {
        let ops: Vec<Op> = run.iter().map(|&lblock| Op::Data(DataOp::Map { ino, lblock, entry: Some(BlockEntry::zeros()) })).collect();
        if let Err(e) = engine.commit(&ops) {
            // A commit can fail after applying its edits (its sync): those keep theirs.
            let map = inode.map.lock();
            let applied = run.iter().filter(|lb| map.get(lb).is_some_and(BlockEntry::is_zeros)).count() as u64;
            engine.blocks.refs.release_promises(unmapped - applied);
            return Err(e);
        }
        unmapped -= run.len() as u64;
    }
    Ok(())
}

/// Truncate with the whole file locked. The new last block, if partial, is rewritten
/// with a zeroed tail into fresh units, in the same journal record as the size.
pub(super) fn truncate_locked(engine: &Engine, inode: &Arc<Inode>, size: u64) -> Result<()> {
    let block = engine.geometry.block();
    let old = inode.size();
    let ino = inode.ino;
    let time = now_ns();
    if size >= old {
        if size > old {
            eof::clear_stale_tail(engine, inode)?;
        }
        eof::zero_beyond_eof(engine, inode, old);
        return engine.commit(&[Op::Data(DataOp::SetSize { ino, size, time })]).map(|f| engine.release_freed(f));
    }
    let mut ops: Vec<Op> = {
        let map = inode.map.lock();
        map.range(size.div_ceil(block)..).map(|(&lblock, _)| Op::Data(DataOp::Map { ino, lblock, entry: None })).collect()
    };
    let mut fresh_units = (Vec::new(), Vec::new());
    let within = size % block;
    let tail = inode.map.lock().get(&(size / block)).cloned();
    // A zero block needs no zeroed tail.
    if let (true, Some(entry)) = (within != 0, tail.filter(|e| !e.is_zeros())) {
        let mut image = AlignedBuf::zeroed(block as usize);
        read::materialize(engine, Some(&entry), &mut image)?;
        image[within as usize..].fill(0);
        let page = u64::from(engine.geometry.page_bytes);
        let npages = within.div_ceil(page) as usize;
        let requests: Vec<UnitRequest> =
            (0..npages).map(|_| UnitRequest { object: ino, lblock: size / block, bytes: page as u32 }).collect();
        let fast_pages = matches!(entry, BlockEntry::Fast { .. }).then(|| engine.residue.allocate(&requests)).flatten();
        let new_entry = match fast_pages {
            Some(units) => {
                for (i, &unit) in units.iter().enumerate() {
                    let at = i * page as usize;
                    write::store_residue(engine, unit, 0, &image[at..at + page as usize], false);
                }
                fresh_units.0 = units.clone();
                BlockEntry::Fast { pages: units.into_iter().enumerate().map(|(i, u)| (i as u8, u)).collect() }
            }
            None => {
                let new_block = eof::write_new_block(engine, image)?;
                fresh_units.1 = vec![new_block];
                BlockEntry::whole(new_block)
            }
        };
        ops.push(Op::Data(DataOp::Map { ino, lblock: size / block, entry: Some(new_entry) }));
    }
    ops.push(Op::Data(DataOp::SetSize { ino, size, time }));
    match engine.commit(&ops) {
        Ok(freed) => {
            engine.release_freed(freed);
            Ok(())
        }
        Err(e) => {
            engine.release(&fresh_units.0, &fresh_units.1);
            Err(e)
        }
    }
}
