//! The block holding a file's end: the bytes past EOF kept zero, in the fast tier and
//! (after a crash of a volume whose residue is volatile) on the SSD, and a block image
//! written to a fresh SSD block, as truncation rewrites that block.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::{read, Engine};
use crate::device::{AlignedBuf, IoOp, IoRequest};
use crate::error::{Error, Result};
use crate::map::{BlockEntry, Overlay, PageNo, SsdBlock};
use crate::meta::{DataOp, Inode, Op};
use crate::stats::Counter;

/// Zero the fast-tier bytes of the block holding EOF that lie past `size` (they are
/// invisible, so this is safe in place). SSD bytes past EOF are zero by construction,
/// except those a crash left on a volume with volatile residue ([`clear_stale_tail`]).
pub(super) fn zero_beyond_eof(engine: &Engine, inode: &Inode, size: u64) {
    let (block, page) = (engine.geometry.block(), engine.geometry.page_bytes);
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
            engine.residue.zero(unit, from, page - from);
            engine.residue.persist(unit, from, page - from);
        }
    }
}

/// Clear the bytes a crash left past EOF ([`Inode::stale_tail`]) before the file grows
/// over them: blocks wholly past EOF that hold SSD bytes are unmapped, and a block holding
/// EOF with bytes past it goes to a new block with them zeroed, both in one record. The
/// caller holds the whole file's range lock.
pub(super) fn clear_stale_tail(engine: &Engine, inode: &Arc<Inode>) -> Result<()> {
    if !inode.stale_tail.load(Ordering::SeqCst) {
        return Ok(());
    }
    let block = engine.geometry.block();
    let (ino, size) = (inode.ino, inode.size());
    let (mut ops, tail): (Vec<Op>, Option<BlockEntry>) = {
        let map = inode.map.lock();
        let beyond = map
            .range(size.div_ceil(block)..)
            .filter(|(_, entry)| !entry.is_zeros())
            .map(|(&lblock, _)| Op::Data(DataOp::Map { ino, lblock, entry: None }))
            .collect();
        let tail = map.get(&(size / block)).filter(|e| size % block != 0 && !e.is_zeros()).cloned();
        (beyond, tail)
    };
    let mut fresh = None;
    if let Some(entry) = tail {
        let mut image = AlignedBuf::zeroed(block as usize);
        read::materialize(engine, Some(&entry), &mut image)?;
        let within = (size % block) as usize;
        if image[within..].iter().any(|&b| b != 0) {
            image[within..].fill(0);
            let new_block = write_new_block(engine, image)?;
            fresh = Some(new_block);
            ops.push(Op::Data(DataOp::Map { ino, lblock: size / block, entry: Some(BlockEntry::whole(new_block)) }));
        }
    }
    if !ops.is_empty() {
        match engine.commit(&ops) {
            Ok(freed) => engine.release_freed(freed),
            Err(e) => {
                engine.release(&[], &fresh.into_iter().collect::<Vec<_>>());
                return Err(e);
            }
        }
        engine.stats.add(Counter::stale_tails_cleared, 1);
    }
    inode.stale_tail.store(false, Ordering::SeqCst);
    Ok(())
}

/// Write one block image to a freshly allocated SSD block (not yet referenced by any
/// map; the allocation is undone if the write fails).
pub(super) fn write_new_block(engine: &Engine, image: AlignedBuf) -> Result<SsdBlock> {
    let target = engine.blocks.allocate(&[0], 0).ok_or(Error::NoSpace)?[0];
    let write = IoRequest { op: IoOp::Write, offset_bytes: target.0 * engine.geometry.block(), buf: image };
    match engine.blocks.submit(vec![write]).wait() {
        Ok(buffers) => {
            engine.blocks.buffers.give(buffers);
            engine.blocks.written();
            engine.stats.ssd_write(engine.geometry.block());
            // The caller journals a map edit pointing here next: flush first.
            if let Err(e) = engine.blocks.flush() {
                engine.release(&[], &[target]);
                return Err(e);
            }
            Ok(target)
        }
        Err(e) => {
            engine.release(&[], &[target]);
            Err(e)
        }
    }
}
