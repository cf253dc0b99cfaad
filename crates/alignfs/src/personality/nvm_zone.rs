//! A block volume's layout (volume size, sector size, UHS's static address map) and the
//! NVM zone the static map sends ranges to.
//!
//! UHS §III-B: ranges named at format time (a file system's metadata) live in NVM for good,
//! like a device-mapper linear table; everything else goes through the engine. The zone
//! is the tail of the fast tier, after the bytes the engine formats; its ranges are packed
//! in address order. A zone write is stored and persisted before it returns.
//!
//! The layout is kept as an extended attribute of the volume's object (journaled with the
//! rest of the namespace at format time), encoded by [`BlockLayout::encode`].

use std::ops::Range;
use std::sync::Arc;

use crate::device::ByteTier;
use crate::error::{DeviceProblem, Error, Result};

/// The extended attribute holding a block volume's layout.
pub(super) const LAYOUT_XATTR: &[u8] = b"alignfs.block-layout";

const LAYOUT_VERSION: u32 = 1;

/// Most static ranges one volume may have.
pub const MAX_NVM_RANGES: usize = 64;

/// What a block volume is formatted with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockLayout {
    /// Bytes the volume holds.
    pub size: u64,
    /// The logical block: requests must be aligned to it (512 or 4096).
    pub sector_bytes: u32,
    /// UHS's static map: byte ranges of the volume kept in the NVM zone, sorted.
    pub nvm_ranges: Vec<Range<u64>>,
}

impl BlockLayout {
    /// A volume of `size` bytes with 512-byte sectors and no static ranges.
    pub fn new(size: u64) -> BlockLayout {
        BlockLayout { size, sector_bytes: 512, nvm_ranges: Vec::new() }
    }

    /// Check sizes and ranges; sorts the ranges.
    pub fn validate(&mut self) -> Result<()> {
        let bad = |m: String| Err(Error::InvalidArgument(m));
        if !matches!(self.sector_bytes, 512 | 4096) {
            return bad(format!("the logical block size must be 512 or 4096 bytes, not {}", self.sector_bytes));
        }
        let sector = u64::from(self.sector_bytes);
        if self.size == 0 || self.size % sector != 0 {
            return bad(format!("a block volume's size must be a non-zero multiple of {sector}, not {}", self.size));
        }
        if self.nvm_ranges.len() > MAX_NVM_RANGES {
            return bad(format!("at most {MAX_NVM_RANGES} NVM ranges, not {}", self.nvm_ranges.len()));
        }
        self.nvm_ranges.sort_by_key(|r| r.start);
        for (i, r) in self.nvm_ranges.iter().enumerate() {
            if r.start >= r.end || r.start % sector != 0 || r.end % sector != 0 || r.end > self.size {
                return bad(format!(
                    "NVM range {}-{} must be non-empty, aligned to {sector} bytes and within the volume's {} bytes",
                    r.start, r.end, self.size
                ));
            }
            if i > 0 && self.nvm_ranges[i - 1].end > r.start {
                return bad(format!("NVM ranges {:?} and {:?} overlap", self.nvm_ranges[i - 1], r));
            }
        }
        Ok(())
    }

    /// Bytes the NVM zone needs: the ranges packed, rounded up to 4 KiB.
    pub fn zone_bytes(&self) -> u64 {
        self.nvm_ranges.iter().map(|r| r.end - r.start).sum::<u64>().div_ceil(4096) * 4096
    }

    /// Bytes of the volume the engine (SSD zone) holds.
    pub fn engine_bytes(&self) -> u64 {
        self.size - self.nvm_ranges.iter().map(|r| r.end - r.start).sum::<u64>()
    }

    /// The attribute value: version, sector, size, zone start, then each range.
    pub fn encode(&self, zone_offset: u64) -> Vec<u8> {
        let mut out = Vec::with_capacity(28 + 16 * self.nvm_ranges.len());
        out.extend_from_slice(&LAYOUT_VERSION.to_le_bytes());
        out.extend_from_slice(&self.sector_bytes.to_le_bytes());
        out.extend_from_slice(&self.size.to_le_bytes());
        out.extend_from_slice(&zone_offset.to_le_bytes());
        out.extend_from_slice(&(self.nvm_ranges.len() as u32).to_le_bytes());
        for r in &self.nvm_ranges {
            out.extend_from_slice(&r.start.to_le_bytes());
            out.extend_from_slice(&r.end.to_le_bytes());
        }
        out
    }

    /// Parse an attribute value; returns the layout and where its zone starts in the fast
    /// tier. Anything malformed is an error naming the problem, never a panic.
    pub fn decode(bytes: &[u8]) -> std::result::Result<(BlockLayout, u64), String> {
        let mut rest = bytes;
        let mut take = |n: usize| -> std::result::Result<&[u8], String> {
            if rest.len() < n {
                return Err(format!("the layout record ends after {} of its bytes", bytes.len()));
            }
            let (head, tail) = rest.split_at(n);
            rest = tail;
            Ok(head)
        };
        let u32_at = |b: &[u8]| u32::from_le_bytes(b.try_into().expect("4 bytes"));
        let u64_at = |b: &[u8]| u64::from_le_bytes(b.try_into().expect("8 bytes"));
        let version = u32_at(take(4)?);
        if version != LAYOUT_VERSION {
            return Err(format!("layout version {version} is not {LAYOUT_VERSION}"));
        }
        let sector_bytes = u32_at(take(4)?);
        let size = u64_at(take(8)?);
        let zone_offset = u64_at(take(8)?);
        let count = u32_at(take(4)?) as usize;
        if count > MAX_NVM_RANGES {
            return Err(format!("{count} NVM ranges (at most {MAX_NVM_RANGES})"));
        }
        let mut nvm_ranges = Vec::with_capacity(count);
        for _ in 0..count {
            let start = u64_at(take(8)?);
            nvm_ranges.push(start..u64_at(take(8)?));
        }
        if !rest.is_empty() {
            return Err(format!("{} bytes after the layout record", rest.len()));
        }
        let mut layout = BlockLayout { size, sector_bytes, nvm_ranges };
        let sorted = layout.nvm_ranges.clone();
        layout.validate().map_err(|e| e.to_string())?;
        if layout.nvm_ranges != sorted {
            return Err("the NVM ranges are not in address order".into());
        }
        Ok((layout, zone_offset))
    }
}

/// Where one piece of a request lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Place {
    /// In the engine's object, at the volume offset.
    Engine,
    /// In the NVM zone, at this byte of the fast tier.
    Zone(u64),
}

/// The NVM zone: the static ranges, and where each starts in the fast tier.
pub(super) struct NvmZone {
    tier: Option<Arc<dyn ByteTier>>,
    /// (volume range, its first byte in the tier), sorted by range.
    ranges: Vec<(Range<u64>, u64)>,
}

impl NvmZone {
    pub(super) fn new(layout: &BlockLayout, tier: Option<Arc<dyn ByteTier>>, zone_offset: u64) -> Result<NvmZone> {
        let mut at = zone_offset;
        let mut ranges = Vec::with_capacity(layout.nvm_ranges.len());
        for r in &layout.nvm_ranges {
            ranges.push((r.clone(), at));
            at += r.end - r.start;
        }
        if !ranges.is_empty() {
            let len = tier.as_ref().map_or(0, |t| t.len_bytes());
            if at > len {
                return Err(Error::WrongDevices(DeviceProblem::NvmZoneBeyondFastTier { end: at, fast: len }));
            }
        }
        Ok(NvmZone { tier, ranges })
    }

    /// Cut `offset..offset+len` into pieces, each wholly in the engine or in the zone, in
    /// address order: (place, volume offset, length).
    pub(super) fn pieces(&self, offset: u64, len: u64) -> Vec<(Place, u64, u64)> {
        let end = offset + len;
        let mut out = Vec::with_capacity(1);
        let mut at = offset;
        for (range, base) in &self.ranges {
            if range.end <= at {
                continue;
            }
            if range.start >= end {
                break;
            }
            if range.start > at {
                out.push((Place::Engine, at, range.start - at));
                at = range.start;
            }
            let stop = range.end.min(end);
            out.push((Place::Zone(base + (at - range.start)), at, stop - at));
            at = stop;
        }
        if at < end {
            out.push((Place::Engine, at, end - at));
        }
        out
    }

    fn tier(&self) -> &dyn ByteTier {
        self.tier.as_deref().expect("a zone with ranges has a tier")
    }

    pub(super) fn read(&self, at: u64, out: &mut [u8]) {
        self.tier().read(at, out);
    }

    pub(super) fn write(&self, at: u64, data: &[u8]) {
        self.tier().write_persist(at, data);
    }

    pub(super) fn zero(&self, at: u64, len: u64) {
        self.tier().zero(at, len as usize);
        self.tier().persist(at, len as usize);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn zone(ranges: &[Range<u64>]) -> NvmZone {
        NvmZone {
            tier: None,
            ranges: ranges.iter().scan(1000, |at, r| Some((r.clone(), std::mem::replace(at, *at + r.end - r.start)))).collect(),
        }
    }

    #[test]
    fn pieces_cover_the_request_in_order() {
        let z = zone(&[4096..8192, 16384..20480]);
        assert_eq!(z.pieces(0, 4096), vec![(Place::Engine, 0, 4096)]);
        assert_eq!(
            z.pieces(2048, 16384),
            vec![
                (Place::Engine, 2048, 2048),
                (Place::Zone(1000), 4096, 4096),
                (Place::Engine, 8192, 8192),
                (Place::Zone(5096), 16384, 2048)
            ]
        );
        assert_eq!(z.pieces(5000, 10), vec![(Place::Zone(1904), 5000, 10)]);
    }

    #[test]
    fn layouts_round_trip_and_bad_records_are_errors() {
        let mut layout = BlockLayout { size: 1 << 20, sector_bytes: 4096, nvm_ranges: vec![8192..12288, 0..4096] };
        layout.validate().unwrap();
        assert_eq!(layout.nvm_ranges[0], 0..4096, "sorted");
        let bytes = layout.encode(777);
        assert_eq!(BlockLayout::decode(&bytes).unwrap(), (layout.clone(), 777));
        for cut in 0..bytes.len() {
            assert!(BlockLayout::decode(&bytes[..cut]).is_err());
        }
        let mut long = bytes.clone();
        long.push(0);
        assert!(BlockLayout::decode(&long).is_err());
        let mut huge = bytes.clone();
        huge[24..28].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(BlockLayout::decode(&huge).is_err());
        for bad in [
            BlockLayout { size: 1000, ..layout.clone() },
            BlockLayout { sector_bytes: 1024, ..layout.clone() },
            BlockLayout { nvm_ranges: vec![0..4096, 0..8192], ..layout.clone() },
            BlockLayout { nvm_ranges: std::iter::once(0..(2 << 20)).collect(), ..layout.clone() },
            BlockLayout { nvm_ranges: std::iter::once(100..4096).collect(), ..layout.clone() },
        ] {
            let mut b = bad;
            assert!(b.validate().is_err(), "{b:?}");
        }
    }

    #[test]
    fn any_bytes_decode_without_panicking() {
        use proptest::prelude::*;
        proptest!(|(bytes in proptest::collection::vec(any::<u8>(), 0..200))| {
            let _ = BlockLayout::decode(&bytes);
        });
    }
}
