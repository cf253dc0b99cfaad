//! Which 4 KiB sectors of a block a merge in place writes, and which it reads first.

use std::ops::Range;

use super::super::{read, Engine};
use crate::geometry::IO_ALIGN;
use crate::map::BlockEntry;

/// Which 4 KiB sectors of a block its residue touches (`dirty`, in runs) and which of
/// those it covers only in part (`partial`, in runs: they must be read before written).
#[derive(Debug, PartialEq)]
pub(super) struct SectorPlan {
    pub dirty: Vec<Range<usize>>,
    pub partial: Vec<Range<usize>>,
    /// The bytes of the block the residue covers.
    pub pieces: Vec<Range<usize>>,
}

impl SectorPlan {
    pub(super) fn new(engine: &Engine, entry: &BlockEntry) -> SectorPlan {
        let mut pieces = Vec::new();
        read::residue_pieces(engine, entry, |range, _, _| pieces.push(range));
        SectorPlan::of_pieces(pieces, engine.geometry.block() as usize)
    }

    fn of_pieces(mut pieces: Vec<Range<usize>>, block: usize) -> SectorPlan {
        pieces.sort_by_key(|r| r.start);
        let mut covered = vec![0usize; block.div_ceil(IO_ALIGN)];
        for piece in &pieces {
            let mut at = piece.start;
            while at < piece.end {
                let sector = at / IO_ALIGN;
                let next = ((sector + 1) * IO_ALIGN).min(piece.end);
                covered[sector] += next - at;
                at = next;
            }
        }
        let runs = |keep: &dyn Fn(usize) -> bool| {
            let mut runs: Vec<Range<usize>> = Vec::new();
            for sector in (0..covered.len()).filter(|&k| keep(covered[k])) {
                let (start, end) = (sector * IO_ALIGN, (sector + 1) * IO_ALIGN);
                match runs.last_mut() {
                    Some(last) if last.end == start => last.end = end,
                    _ => runs.push(start..end),
                }
            }
            runs
        };
        SectorPlan { dirty: runs(&|c| c > 0), partial: runs(&|c| c > 0 && c < IO_ALIGN), pieces }
    }
}

#[cfg(test)]
mod tests {
    use super::SectorPlan;

    /// Which sectors a merge in place writes and reads: touched ones written, in runs;
    /// only those covered in part read.
    #[test]
    #[allow(clippy::single_range_in_vec_init)] // lists of byte ranges, one of them
    fn a_sector_plan_reads_only_sectors_covered_in_part() {
        let plan = |pieces: &[std::ops::Range<usize>]| SectorPlan::of_pieces(pieces.to_vec(), 64 << 10);
        let p = plan(&[6000..10096]);
        assert_eq!((p.dirty, p.partial), (vec![4096..12288], vec![4096..12288]));
        let p = plan(&[8192..12288, 20000..20010, 20100..20110]);
        assert_eq!((p.dirty, p.partial), (vec![8192..12288, 16384..20480], vec![16384..20480]));
        // Two pieces that cover a sector between them need no read.
        let p = plan(&[0..100, 100..4096, 4096..8191]);
        assert_eq!((p.dirty, p.partial), (vec![0..8192], vec![4096..8192]));
        let p = plan(&[0..65536]);
        assert_eq!((p.dirty, p.partial), (vec![0..65536], vec![]));
        assert_eq!(plan(&[]).dirty, vec![]);
    }
}
