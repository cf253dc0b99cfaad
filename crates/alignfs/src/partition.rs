//! The write partitioner: a pure function from (write range, file size, the map entries
//! the write touches) to a [`Plan`]. It does no IO and allocates nothing; the volume binds
//! the plan to fresh units, moves the bytes and commits [`next_entry`] for each block.
//!
//! Policies (OrchFS §3.4, applied block by block — see docs/ARCHITECTURE.md):
//! - *alignment first*: every logical block the write covers whole goes to a new SSD block;
//! - *fewest fragments*: a partly covered block keeps its residue in the unit already
//!   holding it — pages of a `Fast` block; page or upage overlays of an `Ssd` block; a hole
//!   becomes a `Fast` block (so an append fills the partial tail block, then whole blocks
//!   go to the SSD, then the remainder to fast pages).
//!
//! - `scrap` (WSBuffer's buffer-minimized writes): a write smaller than the request-size
//!   threshold goes to the residue store whole, blocks it covers whole included
//!   ([`Residue::All`]).
//!
//! Guarantees (property-tested in this module): the plan covers every byte of the write
//! exactly once; every SSD write is a whole block; a plan that allows residue never
//! contains [`BlockAction::Rewrite`], the only action that needs a read.

use crate::geometry::Geometry;
use crate::map::{BlockEntry, Chunks, Overlay, PageNo, SsdBlock};

/// Where one page's share of the write goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PageTarget {
    /// Overwrite this existing full page in place (a `Fast` page or a `Page` overlay).
    InPlace(PageNo),
    /// Write the chunk in place into this upage; its header becomes `chunks`.
    InPlaceUpage { page: PageNo, chunks: Chunks },
    /// The write covers this upage whole (alone or with its chunks): it becomes a page.
    UpageToPage(PageNo),
    /// A new page; `zero_fill` = the rest of the page must read as zeros.
    NewPage { zero_fill: bool },
    /// A new upage holding one chunk.
    NewUpage,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PagePlan {
    /// Page index within the block.
    pub index: u8,
    /// Byte range within the page.
    pub start: u32,
    pub end: u32,
    /// Offset of the page's first written byte in the write's data.
    pub src: usize,
    pub target: PageTarget,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BlockAction {
    /// The whole block goes to a new SSD block.
    Ssd,
    /// Residue into the pages of a `Fast` block (or a hole that becomes one).
    Fast(Vec<PagePlan>),
    /// Residue as overlays on an `Ssd` block.
    Overlay(Vec<PagePlan>),
    /// Slow path, only without residue: read the block, merge, write a new SSD block.
    Rewrite,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockPlan {
    pub lblock: u64,
    /// Byte range of the block the write covers.
    pub start: u32,
    pub end: u32,
    /// Offset of the block's first written byte in the write's data.
    pub src: usize,
    pub action: BlockAction,
}

impl BlockPlan {
    pub fn new_pages_needed(&self) -> usize {
        match &self.action {
            BlockAction::Fast(pages) | BlockAction::Overlay(pages) => {
                pages.iter().filter(|p| matches!(p.target, PageTarget::NewPage { .. } | PageTarget::NewUpage)).count()
            }
            BlockAction::Ssd | BlockAction::Rewrite => 0,
        }
    }

    pub fn needs_ssd_block(&self) -> bool {
        matches!(self.action, BlockAction::Ssd | BlockAction::Rewrite)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    pub blocks: Vec<BlockPlan>,
    /// Blocks whose upage header would overflow: migrate them, then partition again.
    pub merge_first: Vec<u64>,
    /// File size after the write (writes only extend).
    pub new_size: u64,
}

/// Which parts of a write may become residue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Residue {
    /// Partly covered blocks; whole blocks go to the SSD.
    Partial,
    /// Every block, whole ones included (`scrap` writes below the request threshold).
    All,
    /// None: partly covered blocks are rewritten whole after a read (the slow path taken
    /// when the residue store is full).
    Forbidden,
}

/// The profile's partitioning rules for one write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rules {
    pub residue: Residue,
    /// Most segments a unit's header holds (14 in an `orch` upage, 15 in a scrap page).
    pub max_segments: usize,
}

/// Partition a write of `len` bytes at `offset`. `entry(lblock)` returns the current map
/// entry of a block (`None` = hole).
pub fn partition<'m>(
    offset: u64,
    len: u64,
    file_size: u64,
    geometry: &Geometry,
    rules: Rules,
    entry: impl Fn(u64) -> Option<&'m BlockEntry>,
) -> Plan {
    let block = geometry.block();
    let mut plan = Plan { blocks: Vec::new(), merge_first: Vec::new(), new_size: file_size.max(offset + len) };
    let end = offset + len;
    let mut position = offset;
    while position < end {
        let lblock = position / block;
        let block_start = lblock * block;
        let start = (position - block_start) as u32;
        let stop = ((end - block_start).min(block)) as u32;
        let src = (position - offset) as usize;
        let whole = start == 0 && stop == geometry.block_bytes;
        let action = match rules.residue {
            Residue::Partial | Residue::Forbidden if whole => Some(BlockAction::Ssd),
            Residue::Forbidden => Some(BlockAction::Rewrite),
            Residue::Partial | Residue::All => residue_action(entry(lblock), start, stop, src, geometry, rules.max_segments),
        };
        match action {
            Some(action) => plan.blocks.push(BlockPlan { lblock, start, end: stop, src, action }),
            None => plan.merge_first.push(lblock),
        }
        position = block_start + u64::from(stop);
    }
    plan
}

/// The residue plan for one block; `None` if an upage header overflows.
fn residue_action(
    current: Option<&BlockEntry>,
    start: u32,
    end: u32,
    src: usize,
    geometry: &Geometry,
    max_segments: usize,
) -> Option<BlockAction> {
    let page = geometry.page_bytes;
    let mut pages = Vec::new();
    let mut position = start;
    while position < end {
        let index = position / page;
        let (ps, pe) = (position - index * page, (end - index * page).min(page));
        let whole = ps == 0 && pe == page;
        let index = index as u8;
        let target = match current {
            None => PageTarget::NewPage { zero_fill: !whole },
            Some(BlockEntry::Fast { pages: held }) => match find(held, index) {
                Some(&p) => PageTarget::InPlace(p),
                None => PageTarget::NewPage { zero_fill: !whole },
            },
            Some(BlockEntry::Ssd { overlays, .. }) => match find(overlays, index) {
                Some(Overlay::Page(p)) => PageTarget::InPlace(*p),
                Some(Overlay::Upage { page: p, .. }) if whole => PageTarget::UpageToPage(*p),
                Some(Overlay::Upage { page: p, chunks }) => {
                    let merged = chunks.with(ps, pe);
                    if merged.covers_whole(page) {
                        PageTarget::UpageToPage(*p)
                    } else if merged.len() > max_segments {
                        return None;
                    } else {
                        PageTarget::InPlaceUpage { page: *p, chunks: merged }
                    }
                }
                None if whole => PageTarget::NewPage { zero_fill: false },
                None => PageTarget::NewUpage,
            },
        };
        pages.push(PagePlan { index, start: ps, end: pe, src: src + (position - start) as usize, target });
        position = u32::from(index) * page + pe;
    }
    Some(match current {
        Some(BlockEntry::Ssd { .. }) => BlockAction::Overlay(pages),
        _ => BlockAction::Fast(pages),
    })
}

fn find<T>(slots: &[(u8, T)], index: u8) -> Option<&T> {
    slots.binary_search_by_key(&index, |(i, _)| *i).ok().map(|at| &slots[at].1)
}

fn upsert<T>(slots: &mut Vec<(u8, T)>, index: u8, value: T) -> Option<T> {
    match slots.binary_search_by_key(&index, |(i, _)| *i) {
        Ok(at) => Some(std::mem::replace(&mut slots[at].1, value)),
        Err(at) => {
            slots.insert(at, (index, value));
            None
        }
    }
}

/// A block's entry after its plan ran, and the units it no longer uses.
#[derive(Debug, PartialEq, Eq)]
pub struct NextEntry {
    pub entry: BlockEntry,
    pub freed_pages: Vec<PageNo>,
    pub freed_block: Option<SsdBlock>,
}

/// The entry of `plan.lblock` once its IOs are done. `new_block` is the SSD block bound to
/// an `Ssd`/`Rewrite` action; `new_pages` the pages bound, in order, to its `NewPage` and
/// `NewUpage` targets.
pub fn next_entry(current: Option<&BlockEntry>, plan: &BlockPlan, new_block: Option<SsdBlock>, new_pages: &[PageNo]) -> NextEntry {
    let mut fresh = new_pages.iter().copied();
    let mut next_page = || fresh.next().expect("a page was bound to every new-page target");
    match &plan.action {
        BlockAction::Ssd | BlockAction::Rewrite => NextEntry {
            entry: BlockEntry::whole(new_block.expect("an SSD block was bound")),
            freed_pages: current.map(|e| e.fast_pages().collect()).unwrap_or_default(),
            freed_block: current.and_then(BlockEntry::ssd_block),
        },
        BlockAction::Fast(page_plans) => {
            let mut pages = match current {
                Some(BlockEntry::Fast { pages }) => pages.clone(),
                None => Vec::new(),
                Some(other) => panic!("fast-page plan over {other:?}"),
            };
            for p in page_plans {
                if let PageTarget::NewPage { .. } = p.target {
                    upsert(&mut pages, p.index, next_page());
                }
            }
            NextEntry { entry: BlockEntry::Fast { pages }, freed_pages: Vec::new(), freed_block: None }
        }
        BlockAction::Overlay(page_plans) => {
            let Some(BlockEntry::Ssd { block, overlays, shared }) = current else {
                panic!("overlay plan over {current:?}");
            };
            let mut overlays = overlays.clone();
            for p in page_plans {
                let overlay = match &p.target {
                    PageTarget::InPlace(_) => continue,
                    PageTarget::InPlaceUpage { page, chunks } => Overlay::Upage { page: *page, chunks: chunks.clone() },
                    PageTarget::UpageToPage(page) => Overlay::Page(*page),
                    PageTarget::NewPage { .. } => Overlay::Page(next_page()),
                    PageTarget::NewUpage => Overlay::Upage { page: next_page(), chunks: Chunks::single(p.start, p.end) },
                };
                upsert(&mut overlays, p.index, overlay);
            }
            NextEntry { entry: BlockEntry::Ssd { block: *block, overlays, shared: *shared }, freed_pages: Vec::new(), freed_block: None }
        }
    }
}

#[cfg(test)]
mod tests;
