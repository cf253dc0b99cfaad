//! Units of storage and the layout of both devices, fixed at format time.
//!
//! Invariants (checked by [`Geometry::validate`]):
//! - each profile's own rules on the page (its `ProfileSpec::validate_geometry`: `orch`'s
//!   fast pages are 512 B–64 KiB, `scrap`'s residue unit is one whole block).
//! - `block_bytes` is a power-of-two multiple of `page_bytes`, at most 64 pages (a block's
//!   page set is a u64 mask).
//! - `split_bytes` is a multiple of `block_bytes`.

use crate::error::{Error, Result};

pub const KIB: u64 = 1024;
pub const MIB: u64 = 1024 * KIB;
pub const GIB: u64 = 1024 * MIB;

/// Chunks an upage header can hold (OrchFS: 14 × (u16 offset, u16 length) in 56 bytes).
pub const UPAGE_MAX_CHUNKS: usize = 14;
/// Segments a scrap page header can hold (WSBuffer: 15 × (offset, length)).
pub const SCRAP_MAX_SEGMENTS: usize = 15;
/// The size of a superblock; also the O_DIRECT alignment of every buffer.
pub const SUPERBLOCK_BYTES: u64 = 4 * KIB;
pub const IO_ALIGN: usize = 4096;
pub const MAX_PAGES_PER_BLOCK: u64 = 64;

const _: () = assert!(SUPERBLOCK_BYTES as usize % IO_ALIGN == 0);

/// Units and IO shape chosen at format time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    pub block_bytes: u32,
    pub page_bytes: u32,
    pub split_bytes: u32,
    pub io_workers: u32,
}

/// The smallest IO size files advertise to applications (`st_blksize`).
pub const PREFERRED_IO_BYTES: u64 = 1 << 20;

impl Default for Geometry {
    fn default() -> Self {
        Geometry { block_bytes: 32 * 1024, page_bytes: 4 * 1024, split_bytes: 256 * 1024, io_workers: 2 }
    }
}

impl Geometry {
    /// The rules every geometry obeys (a profile adds its own: `Profile::validate_geometry`).
    pub fn validate(&self) -> Result<()> {
        let (b, p, s) = (u64::from(self.block_bytes), u64::from(self.page_bytes), u64::from(self.split_bytes));
        let fail = |m: String| Err(Error::Geometry(m));
        if p == 0 {
            return fail("the page size must not be 0".into());
        }
        if !b.is_power_of_two() || b < p || b / p > MAX_PAGES_PER_BLOCK || (b as usize) % IO_ALIGN != 0 {
            return fail(format!(
                "block size {b} must be a power of two, a multiple of 4 KiB and of the page size ({p}), and at most {MAX_PAGES_PER_BLOCK} pages"
            ));
        }
        if s == 0 || s % b != 0 {
            return fail(format!("split size {s} must be a non-zero multiple of the block size {b}"));
        }
        if self.io_workers == 0 || self.io_workers > 256 {
            return fail(format!("io workers {} must be between 1 and 256", self.io_workers));
        }
        Ok(())
    }

    pub fn block(&self) -> u64 {
        u64::from(self.block_bytes)
    }
    /// What `stat` reports as a file's preferred IO size: a whole number of blocks, at
    /// least [`PREFERRED_IO_BYTES`]. `cp` copies in pieces of max(st_blksize, 128 KiB) and
    /// stdio buffers st_blksize bytes, so a small one turns a stream into many writes the
    /// engine makes durable one by one: with the 32 KiB block, `cp` of 1 GiB and `sync` on
    /// the mount ran at 0.42-0.49× ext4's speed in 8192 writes, and at 0.96-1.17× in 1024
    /// with 1 MiB.
    pub fn preferred_io(&self) -> u64 {
        PREFERRED_IO_BYTES.next_multiple_of(self.block().max(1))
    }
    pub fn page(&self) -> u64 {
        u64::from(self.page_bytes)
    }
    pub fn pages_per_block(&self) -> usize {
        (self.block_bytes / self.page_bytes) as usize
    }
}

/// Checkpoint bytes a slot on an SSD allows for each of its blocks, beyond `ssd/512` for
/// the rest of the state: a checkpoint takes 18 bytes per mapped block (its logical and
/// SSD block numbers, a tag, an overlay count) and about 100 per file (`tests/capacity.rs`
/// checks both). With `ssd/512` alone, a volume of 4 KiB blocks (`byte`) could not
/// checkpoint once about 40 % of its blocks were mapped, and writes failed with ENOSPC.
pub const CHECKPOINT_BYTES_PER_BLOCK: u64 = 24;

/// Where a volume's metadata area is, which its profile's devices decide.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetaPlacement {
    /// On the fast tier, with the residue pages.
    FastTier,
    /// At the start of the (first) SSD.
    Ssd,
    /// At the start of a memory-semantic SSD, with a residue zone after it.
    MemorySemanticSsd,
    /// Elsewhere (a KV store): the SSD holds its superblock alone.
    SuperblockOnly,
}

/// Where the superblock, checkpoints, journal and residue pages live: on the fast tier
/// (`orch`), or at the start of the SSD for profiles without one (`scrap`, no page zone).
/// All offsets in bytes from the start of that device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MetaLayout {
    pub checkpoint_bytes: u64,
    pub checkpoint_a_offset: u64,
    pub checkpoint_b_offset: u64,
    pub journal_offset: u64,
    pub journal_bytes: u64,
    pub pages_offset: u64,
    pub page_count: u64,
}

impl MetaLayout {
    /// Checkpoint bytes that the maps of an SSD of `ssd_bytes` take when every block is
    /// mapped: `ssd/512` for the files, [`CHECKPOINT_BYTES_PER_BLOCK`] for each block.
    pub fn full_map_bytes(ssd_bytes: u64, geometry: &Geometry) -> u64 {
        ssd_bytes / 512 + ssd_bytes / geometry.block() * CHECKPOINT_BYTES_PER_BLOCK
    }

    /// The smallest fast tier whose checkpoint slots hold the maps of the full SSD: both
    /// slots may take half of it.
    pub fn fast_bytes_for_full_map(ssd_bytes: u64, geometry: &Geometry) -> u64 {
        4 * MetaLayout::full_map_bytes(ssd_bytes, geometry)
    }

    /// Carve a fast tier of `fast_bytes` for an SSD of `ssd_bytes`: superblock, two
    /// checkpoint slots, journal, pages. A slot is `fast/16` (64 KiB–256 MiB), or, when that
    /// is too small for the maps of the full SSD, as large as they are if both slots still
    /// fit in half the fast tier. Otherwise the slots stay at `fast/16` and the volume can
    /// map only part of its SSD ([`MetaLayout::full_map_bytes`]; mkfs says so).
    pub fn on_fast_tier(fast_bytes: u64, ssd_bytes: u64, geometry: &Geometry) -> Result<MetaLayout> {
        MetaLayout::on_fast_tier_allowing(fast_bytes, ssd_bytes, geometry, CHECKPOINT_BYTES_PER_BLOCK)
    }

    /// [`MetaLayout::on_fast_tier`]; volumes formatted before slots grew with the SSD have
    /// `per_block` 0 (always `fast/16`).
    fn on_fast_tier_allowing(fast_bytes: u64, ssd_bytes: u64, geometry: &Geometry, per_block: u64) -> Result<MetaLayout> {
        let page = geometry.page().max(SUPERBLOCK_BYTES);
        let round = |x: u64| x.div_ceil(page) * page;
        let usual = (fast_bytes / 16).clamp(64 * KIB, 256 * MIB);
        let full_map = MetaLayout::full_map_bytes(ssd_bytes, geometry);
        let grown = per_block > 0 && full_map > usual && fast_bytes >= MetaLayout::fast_bytes_for_full_map(ssd_bytes, geometry);
        let checkpoint_bytes = round(if grown { full_map } else { usual });
        let journal_bytes = round((fast_bytes / 32).clamp(64 * KIB, 64 * MIB));
        let layout = MetaLayout::carve(round(SUPERBLOCK_BYTES), checkpoint_bytes, journal_bytes);
        let page_count = fast_bytes.saturating_sub(layout.pages_offset) / geometry.page();
        if page_count < 2 * geometry.pages_per_block() as u64 {
            return Err(Error::Geometry(format!(
                "fast tier of {fast_bytes} bytes leaves {page_count} data pages after metadata ({} bytes); need at least two blocks' worth",
                layout.pages_offset
            )));
        }
        Ok(MetaLayout { page_count, ..layout })
    }

    /// The superblock, the checkpoint slots (or in-place metadata lines) and the journal
    /// (or redo area): from the start of the device to the journal's end.
    pub fn metadata_area(&self) -> std::ops::Range<u64> {
        0..self.journal_offset + self.journal_bytes
    }

    /// Two checkpoint slots and a journal one after the other from `start`; the page zone
    /// (empty) right after them.
    fn carve(start: u64, checkpoint_bytes: u64, journal_bytes: u64) -> MetaLayout {
        let checkpoint_b_offset = start + checkpoint_bytes;
        let journal_offset = checkpoint_b_offset + checkpoint_bytes;
        MetaLayout {
            checkpoint_bytes,
            checkpoint_a_offset: start,
            checkpoint_b_offset,
            journal_offset,
            journal_bytes,
            pages_offset: journal_offset + journal_bytes,
            page_count: 0,
        }
    }

    /// The metadata area at the start of an SSD of `ssd_bytes`: superblock, two checkpoint
    /// slots of `clamp(ssd/512 + 24 B per block, 1 MiB, 1 GiB)`, a journal of
    /// `clamp(ssd/1024, 1 MiB, 64 MiB)`; `pages_offset` is the first byte of block-aligned
    /// data after it. The volume mirrors the area in memory (16.75 + 16.75 + 8 MiB for an
    /// 8 GiB SSD of 256 KiB blocks, 64 + 64 + 8 MiB for 4 KiB blocks).
    pub fn on_ssd(ssd_bytes: u64, geometry: &Geometry) -> Result<MetaLayout> {
        MetaLayout::on_ssd_allowing(ssd_bytes, geometry, CHECKPOINT_BYTES_PER_BLOCK)
    }

    /// [`MetaLayout::on_ssd`] with `per_block` checkpoint bytes for each block; volumes
    /// formatted before the slot was sized per block have 0 (and a 256 MiB cap).
    fn on_ssd_allowing(ssd_bytes: u64, geometry: &Geometry, per_block: u64) -> Result<MetaLayout> {
        let round = |x: u64| x.div_ceil(SUPERBLOCK_BYTES) * SUPERBLOCK_BYTES;
        let cap = if per_block == 0 { 256 * MIB } else { 1024 * MIB };
        let checkpoint_bytes = round((ssd_bytes / 512 + ssd_bytes / geometry.block() * per_block).clamp(MIB, cap));
        let journal_bytes = round((ssd_bytes / 1024).clamp(MIB, 64 * MIB));
        let layout = MetaLayout::carve(SUPERBLOCK_BYTES, checkpoint_bytes, journal_bytes);
        let pages_offset = layout.pages_offset.div_ceil(geometry.block()) * geometry.block();
        if ssd_bytes < pages_offset + 2 * geometry.block() {
            return Err(Error::Geometry(format!(
                "SSD of {ssd_bytes} bytes leaves fewer than two {}-byte blocks after {pages_offset} bytes of metadata",
                geometry.block()
            )));
        }
        Ok(MetaLayout { pages_offset, ..layout })
    }

    /// The metadata area of a memory-semantic SSD (`byte`): as [`MetaLayout::on_ssd`]
    /// with `per_block`, then a zone of `clamp(ssd/32, 1 MiB, 256 MiB)` that holds residue
    /// units, stored through the device's byte interface. Data blocks start after the zone.
    fn on_memory_semantic_ssd(ssd_bytes: u64, geometry: &Geometry, per_block: u64) -> Result<MetaLayout> {
        let area = MetaLayout::on_ssd_allowing(ssd_bytes, geometry, per_block)?;
        let zone = ((ssd_bytes / 32).clamp(MIB, 256 * MIB)).div_ceil(geometry.block()) * geometry.block();
        let layout = MetaLayout { page_count: zone / geometry.page(), ..area };
        let data_start = layout.reserved_ssd_blocks(geometry) * geometry.block();
        if ssd_bytes < data_start + 2 * geometry.block() {
            return Err(Error::Geometry(format!(
                "SSD of {ssd_bytes} bytes leaves fewer than two {}-byte blocks after {data_start} bytes of metadata and residue",
                geometry.block()
            )));
        }
        Ok(layout)
    }

    /// An SSD whose metadata lives elsewhere (`nvstore`'s KV store): the superblock's
    /// block alone, no journal, no checkpoint slots.
    pub fn superblock_only(ssd_bytes: u64, geometry: &Geometry) -> Result<MetaLayout> {
        let pages_offset = SUPERBLOCK_BYTES.div_ceil(geometry.block()) * geometry.block();
        if ssd_bytes < pages_offset + 2 * geometry.block() {
            return Err(Error::Geometry(format!("SSD of {ssd_bytes} bytes holds fewer than two {}-byte data blocks", geometry.block())));
        }
        Ok(MetaLayout { pages_offset, ..MetaLayout::carve(pages_offset, 0, 0) })
    }

    /// The layout of a metadata area at `placement` on these devices (`ssd_bytes` is one
    /// SSD's).
    pub fn at(placement: MetaPlacement, fast_bytes: u64, ssd_bytes: u64, geometry: &Geometry) -> Result<MetaLayout> {
        MetaLayout::at_allowing(placement, fast_bytes, ssd_bytes, geometry, CHECKPOINT_BYTES_PER_BLOCK)
    }

    /// [`MetaLayout::at`] with `per_block` checkpoint bytes per block for a layout on an
    /// SSD (a layout on the fast tier or beside a KV store ignores it).
    fn at_allowing(placement: MetaPlacement, fast_bytes: u64, ssd_bytes: u64, geometry: &Geometry, per_block: u64) -> Result<MetaLayout> {
        match placement {
            MetaPlacement::FastTier => MetaLayout::on_fast_tier_allowing(fast_bytes, ssd_bytes, geometry, per_block),
            MetaPlacement::SuperblockOnly => MetaLayout::superblock_only(ssd_bytes, geometry),
            MetaPlacement::MemorySemanticSsd => MetaLayout::on_memory_semantic_ssd(ssd_bytes, geometry, per_block),
            MetaPlacement::Ssd => MetaLayout::on_ssd_allowing(ssd_bytes, geometry, per_block),
        }
    }

    /// Whether `self` is a layout at `placement` on these devices: the one
    /// [`MetaLayout::at`] computes, or the one it computed before checkpoint slots were
    /// sized per block (such volumes keep opening).
    pub fn is_valid_at(&self, placement: MetaPlacement, fast_bytes: u64, ssd_bytes: u64, geometry: &Geometry) -> Result<bool> {
        for per_block in [CHECKPOINT_BYTES_PER_BLOCK, 0] {
            if *self == MetaLayout::at_allowing(placement, fast_bytes, ssd_bytes, geometry, per_block)? {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// SSD blocks the metadata area (and a residue zone on the SSD) occupy, never
    /// allocated to data. Only for layouts on an SSD.
    pub fn reserved_ssd_blocks(&self, geometry: &Geometry) -> u64 {
        (self.pages_offset + self.page_count * geometry.page()).div_ceil(geometry.block())
    }
}

/// Parse a size such as `4096`, `32K`, `1.5G`, `8GiB` (binary units).
pub fn parse_size(text: &str) -> Result<u64> {
    let t = text.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let bad = || Error::BadSize(format!("cannot parse size {text:?} (examples: 4096, 32K, 8G)"));
    let value: f64 = number.parse().map_err(|_| bad())?;
    let multiplier = match unit.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 1,
        "K" | "KB" | "KIB" => KIB,
        "M" | "MB" | "MIB" => MIB,
        "G" | "GB" | "GIB" => GIB,
        "T" | "TB" | "TIB" => 1024 * GIB,
        _ => return Err(bad()),
    };
    let bytes = value * multiplier as f64;
    if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 || bytes.fract() != 0.0 {
        return Err(bad());
    }
    Ok(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The default geometries of `scrap` (a block is one scrap page), `byte` (4 KiB
    /// blocks) and `uhs`, as numbers: this module knows no profile.
    const SCRAP: Geometry = Geometry { block_bytes: 256 * 1024, page_bytes: 256 * 1024, split_bytes: 256 * 1024, io_workers: 2 };
    const BYTE: Geometry = Geometry { block_bytes: 4 * 1024, page_bytes: 4 * 1024, split_bytes: 256 * 1024, io_workers: 2 };
    const UHS: Geometry = BYTE;

    /// Fuzzing found a superblock whose page size was 0 dividing by zero here.

    #[test]
    fn the_preferred_io_size_is_whole_blocks_and_at_least_a_mebibyte() {
        for (block, preferred) in
            [(4 << 10, 1 << 20), (32 << 10, 1 << 20), (256 << 10, 1 << 20), (768 << 10, 1536 << 10), (4 << 20, 4 << 20)]
        {
            let geometry = Geometry { block_bytes: block, ..Geometry::default() };
            assert_eq!(geometry.preferred_io(), preferred, "block {block}");
        }
        assert_eq!(SCRAP.preferred_io(), PREFERRED_IO_BYTES);
        assert_eq!(BYTE.preferred_io(), PREFERRED_IO_BYTES);
    }
    #[test]
    fn a_geometry_with_a_zero_size_is_refused() {
        for zeroed in [
            Geometry { page_bytes: 0, ..Geometry::default() },
            Geometry { block_bytes: 0, ..Geometry::default() },
            Geometry { split_bytes: 0, ..Geometry::default() },
            Geometry { block_bytes: 0, page_bytes: 0, ..Geometry::default() },
        ] {
            assert!(matches!(zeroed.validate(), Err(Error::Geometry(_))), "{zeroed:?}");
        }
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("32K").unwrap(), 32 * KIB);
        assert_eq!(parse_size("8GiB").unwrap(), 8 * GIB);
        assert_eq!(parse_size("1.5M").unwrap(), 3 * MIB / 2);
        for bad in ["", "K", "12Q", "-1", "1.1", "abc"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn geometry_rules() {
        Geometry::default().validate().unwrap();
        SCRAP.validate().unwrap();
        let bad = [
            Geometry { block_bytes: 2048, ..Geometry::default() },
            Geometry { block_bytes: 512 * 1024, ..Geometry::default() },
            Geometry { split_bytes: 48 * 1024, ..Geometry::default() },
            Geometry { io_workers: 0, ..Geometry::default() },
        ];
        for g in bad {
            assert!(g.validate().is_err(), "{g:?}");
        }
    }

    /// Every block of an SSD volume can be mapped with room left in a checkpoint slot,
    /// whatever the block size (a `byte` volume has 4 KiB blocks).
    #[test]
    fn a_checkpoint_slot_on_an_ssd_has_room_for_every_block() {
        for g in [BYTE, SCRAP] {
            for ssd in [64 * MIB, 2 * GIB, 8 * GIB, 64 * GIB] {
                let l = MetaLayout::on_ssd(ssd, &g).unwrap();
                assert!(l.checkpoint_bytes >= ssd / g.block() * CHECKPOINT_BYTES_PER_BLOCK, "{g:?}, {ssd} bytes: {l:?}");
            }
        }
    }

    /// Volumes formatted before slots were sized per block keep opening; a layout that is
    /// neither the current nor the old one is refused.
    #[test]
    fn layouts_of_volumes_formatted_before_per_block_slots_are_still_valid() {
        for (placement, g) in [(MetaPlacement::MemorySemanticSsd, BYTE), (MetaPlacement::Ssd, SCRAP)] {
            let ssd = 8 * GIB;
            let current = MetaLayout::at(placement, 0, ssd, &g).unwrap();
            let old = MetaLayout::at_allowing(placement, 0, ssd, &g, 0).unwrap();
            assert_eq!(old.checkpoint_bytes, 16 * MIB, "{placement:?}: the old slot was ssd/512");
            assert!(current.checkpoint_bytes > old.checkpoint_bytes);
            assert!(current.is_valid_at(placement, 0, ssd, &g).unwrap());
            assert!(old.is_valid_at(placement, 0, ssd, &g).unwrap());
            let shifted = MetaLayout { journal_offset: old.journal_offset + SUPERBLOCK_BYTES, ..old };
            assert!(!shifted.is_valid_at(placement, 0, ssd, &g).unwrap());
        }
        let orch = Geometry::default();
        let old_style = MetaLayout::on_ssd_allowing(8 * GIB, &orch, 0).unwrap();
        assert!(!old_style.is_valid_at(MetaPlacement::FastTier, GIB, 8 * GIB, &orch).unwrap(), "orch's layout is on its fast tier");
    }

    /// A fast tier's checkpoint slots grow to hold the maps of a large SSD of small blocks
    /// (`uhs`) when half the fast tier allows it; the defaults keep `fast/16`, and volumes
    /// formatted with it keep opening.
    #[test]
    fn fast_tier_slots_grow_with_the_ssd() {
        let uhs = UHS;
        let usual = MetaLayout::on_fast_tier(GIB, 8 * GIB, &Geometry::default()).unwrap();
        assert_eq!(usual.checkpoint_bytes, 64 * MIB);
        let big = MetaLayout::on_fast_tier(GIB, 16 * GIB, &uhs).unwrap();
        assert!(big.checkpoint_bytes >= MetaLayout::full_map_bytes(16 * GIB, &uhs), "{big:?}");
        assert!(2 * big.checkpoint_bytes <= GIB / 2);
        let before = MetaLayout::on_fast_tier_allowing(GIB, 16 * GIB, &uhs, 0).unwrap();
        assert_eq!(before.checkpoint_bytes, 64 * MIB);
        assert!(before.is_valid_at(MetaPlacement::FastTier, GIB, 16 * GIB, &uhs).unwrap());
        assert!(big.is_valid_at(MetaPlacement::FastTier, GIB, 16 * GIB, &uhs).unwrap());
        let too_big = MetaLayout::on_fast_tier(GIB, 1024 * GIB, &uhs).unwrap();
        assert_eq!(too_big.checkpoint_bytes, 64 * MIB, "half the fast tier cannot hold them: the usual size");
    }

    #[test]
    fn layout_fits() {
        let g = Geometry::default();
        let l = MetaLayout::on_fast_tier(GIB, 8 * GIB, &g).unwrap();
        assert!(l.pages_offset + l.page_count * g.page() <= GIB);
        assert!(MetaLayout::on_fast_tier(64 * KIB, 8 * GIB, &g).is_err());
        let scrap = SCRAP;
        let l = MetaLayout::on_ssd(8 * GIB, &scrap).unwrap();
        assert_eq!(l.pages_offset % scrap.block(), 0);
        assert!(l.journal_offset + l.journal_bytes <= l.pages_offset);
        assert_eq!(l.reserved_ssd_blocks(&scrap), l.pages_offset / scrap.block());
        assert!(MetaLayout::on_ssd(3 * MIB, &scrap).is_err());
    }
}
