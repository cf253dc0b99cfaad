//! Map entries and their storage units.

use smallvec::{smallvec, SmallVec};

/// A fast-tier page number (index into the residue store's pages).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PageNo(pub u64);

/// An SSD block number (block 0 holds the superblock and is never allocated).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SsdBlock(pub u64);

/// The valid byte ranges of an upage, as sorted, disjoint, non-adjacent `(start, end)`
/// offsets within the page. At most [`crate::geometry::UPAGE_MAX_CHUNKS`] ranges.
///
/// Most upages hold one or two ranges, kept inline: a block entry is cloned several times
/// per write, and these lists were the main source of the malloc and free calls that took
/// about a quarter of a durable 4 KiB write's CPU.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Chunks(SmallVec<[(u32, u32); 2]>);

impl Chunks {
    pub fn single(start: u32, end: u32) -> Chunks {
        Chunks(smallvec![(start, end)])
    }

    /// Ranges as stored: `(start, end)` pairs.
    pub fn ranges(&self) -> &[(u32, u32)] {
        &self.0
    }

    /// Build from decoded pairs; `None` if they are not sorted, disjoint, non-adjacent,
    /// non-empty and within `page_bytes`.
    pub fn from_ranges(ranges: Vec<(u32, u32)>, page_bytes: u32) -> Option<Chunks> {
        let ordered = ranges.iter().all(|&(s, e)| s < e && e <= page_bytes) && ranges.windows(2).all(|w| w[0].1 < w[1].0);
        ordered.then_some(Chunks(ranges.into()))
    }

    /// The ranges after inserting `start..end`, merged with every range it overlaps or
    /// touches (the header's merge-on-insert).
    pub fn with(&self, start: u32, end: u32) -> Chunks {
        let (mut s, mut e) = (start, end);
        let mut out = SmallVec::with_capacity(self.0.len() + 1);
        let mut placed = false;
        for &(cs, ce) in &self.0 {
            if ce < s {
                out.push((cs, ce));
            } else if cs > e {
                if !placed {
                    out.push((s, e));
                    placed = true;
                }
                out.push((cs, ce));
            } else {
                s = s.min(cs);
                e = e.max(ce);
            }
        }
        if !placed {
            out.push((s, e));
        }
        Chunks(out)
    }

    /// The ranges clipped to `..limit`.
    pub fn clipped(&self, limit: u32) -> Chunks {
        Chunks(self.0.iter().filter(|&&(s, _)| s < limit).map(|&(s, e)| (s, e.min(limit))).collect())
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn covers_whole(&self, page_bytes: u32) -> bool {
        self.0.as_slice() == [(0, page_bytes)]
    }
}

/// Newer bytes laid over one page of an SSD block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Overlay {
    /// A full fast page replaces the page.
    Page(PageNo),
    /// Only the chunks' bytes of this fast page are valid (stored at their own offsets).
    Upage { page: PageNo, chunks: Chunks },
}

impl Overlay {
    pub fn page(&self) -> PageNo {
        match self {
            Overlay::Page(p) | Overlay::Upage { page: p, .. } => *p,
        }
    }
}

/// Where one logical block's bytes live.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BlockEntry {
    /// The block lives only in fast pages (small files, tails); a missing page is zeros.
    /// `pages` is sorted by page index within the block. Without pages it is a zero block
    /// that `fallocate` made: it holds a promise of one SSD block
    /// ([`crate::layout::BlockRefs::promise`]) until a write replaces it.
    Fast { pages: Vec<(u8, PageNo)> },
    /// An SSD block plus newer overlays, sorted by page index within the block. `shared`
    /// marks a block a clone made: other entries may reference it too (the allocator
    /// counts them), and every entry that does is marked. No write changes a shared block
    /// in place (only an unshared one, where writes are durable on sync), so sharing needs
    /// nothing more.
    Ssd { block: SsdBlock, overlays: Vec<(u8, Overlay)>, shared: bool },
}

impl BlockEntry {
    /// Every fast page this entry holds.
    pub fn fast_pages(&self) -> impl Iterator<Item = PageNo> + '_ {
        let (fast, over) = match self {
            BlockEntry::Fast { pages } => (pages.as_slice(), &[][..]),
            BlockEntry::Ssd { overlays, .. } => (&[][..], overlays.as_slice()),
        };
        fast.iter().map(|&(_, p)| p).chain(over.iter().map(|(_, o)| o.page()))
    }

    pub fn fast_page_count(&self) -> usize {
        match self {
            BlockEntry::Fast { pages } => pages.len(),
            BlockEntry::Ssd { overlays, .. } => overlays.len(),
        }
    }

    /// Whether this entry's SSD block may be referenced by other entries (a clone).
    pub fn shared(&self) -> bool {
        matches!(self, BlockEntry::Ssd { shared: true, .. })
    }

    /// A block of zeros holding a promise of one SSD block (`fallocate`).
    pub fn zeros() -> BlockEntry {
        BlockEntry::Fast { pages: Vec::new() }
    }

    pub fn is_zeros(&self) -> bool {
        matches!(self, BlockEntry::Fast { pages } if pages.is_empty())
    }

    /// A whole SSD block with no overlays, owned by this entry alone.
    pub fn whole(block: SsdBlock) -> BlockEntry {
        BlockEntry::Ssd { block, overlays: Vec::new(), shared: false }
    }

    pub fn ssd_block(&self) -> Option<SsdBlock> {
        match self {
            BlockEntry::Ssd { block, .. } => Some(*block),
            BlockEntry::Fast { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_insert_merges_overlapping_and_adjacent() {
        let c = Chunks::single(100, 200).with(300, 400);
        assert_eq!(c.ranges(), &[(100, 200), (300, 400)]);
        assert_eq!(c.with(200, 300).ranges(), &[(100, 400)]);
        assert_eq!(c.with(150, 350).ranges(), &[(100, 400)]);
        assert_eq!(c.with(0, 10).ranges(), &[(0, 10), (100, 200), (300, 400)]);
        assert_eq!(c.with(500, 600).ranges(), &[(100, 200), (300, 400), (500, 600)]);
        assert_eq!(c.with(0, 4096).ranges(), &[(0, 4096)]);
        assert!(c.with(0, 4096).covers_whole(4096));
        assert_eq!(c.clipped(350).ranges(), &[(100, 200), (300, 350)]);
        assert_eq!(c.clipped(100).ranges(), &[] as &[(u32, u32)]);
    }

    #[test]
    fn chunk_validation() {
        assert!(Chunks::from_ranges(vec![(0, 10), (11, 20)], 4096).is_some());
        assert!(Chunks::from_ranges(vec![(0, 10), (10, 20)], 4096).is_none());
        assert!(Chunks::from_ranges(vec![(5, 5)], 4096).is_none());
        assert!(Chunks::from_ranges(vec![(0, 5000)], 4096).is_none());
    }
}
