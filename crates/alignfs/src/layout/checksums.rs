//! A CRC32C for every SSD block, for profiles that verify what they read (`nvstore`:
//! docs/NVSTORE.md). Set when a block image is submitted for writing, persisted by the
//! profile's metadata store beside the record naming the block, and checked on every
//! read of the block, so damaged media reads as an error, never as wrong data.
//!
//! Indexed by SSD block: 4 bytes of memory per block (1 MiB per 1 GiB of 4 KiB blocks).
//! A block is written once per allocation (copy-on-write), so its sum only changes while
//! no record names it yet.

use std::sync::atomic::{AtomicU32, Ordering};

use crate::codec::crc32c;
use crate::map::SsdBlock;

pub struct BlockChecksums {
    sums: Vec<AtomicU32>,
}

/// A block whose bytes do not match their checksum.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mismatch {
    pub block: SsdBlock,
    pub expected: u32,
    pub found: u32,
}

impl BlockChecksums {
    pub fn new(blocks: u64) -> BlockChecksums {
        BlockChecksums { sums: (0..blocks).map(|_| AtomicU32::new(0)).collect() }
    }

    pub fn get(&self, block: SsdBlock) -> u32 {
        self.sums.get(block.0 as usize).map_or(0, |s| s.load(Ordering::Acquire))
    }

    /// Record a sum read back from the metadata; `false` if the block is out of range.
    pub fn set(&self, block: SsdBlock, sum: u32) -> bool {
        self.sums.get(block.0 as usize).map(|s| s.store(sum, Ordering::Release)).is_some()
    }

    /// Record the sums of `image`, whole blocks of `block_bytes` starting at `first`.
    pub fn record(&self, first: SsdBlock, image: &[u8], block_bytes: usize) {
        for (i, block) in image.chunks_exact(block_bytes).enumerate() {
            self.set(SsdBlock(first.0 + i as u64), crc32c(block));
        }
    }

    /// Check whole blocks of `image` read from `first` on.
    pub fn verify(&self, first: SsdBlock, image: &[u8], block_bytes: usize) -> Result<(), Mismatch> {
        for (i, bytes) in image.chunks_exact(block_bytes).enumerate() {
            let block = SsdBlock(first.0 + i as u64);
            let (expected, found) = (self.get(block), crc32c(bytes));
            if expected != found {
                return Err(Mismatch { block, expected, found });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_changed_byte_is_a_mismatch_naming_its_block() {
        let sums = BlockChecksums::new(8);
        let mut image = vec![7u8; 3 * 4096];
        sums.record(SsdBlock(2), &image, 4096);
        assert_eq!(sums.verify(SsdBlock(2), &image, 4096), Ok(()));
        image[4096 + 100] ^= 1;
        let mismatch = sums.verify(SsdBlock(2), &image, 4096).unwrap_err();
        assert_eq!(mismatch.block, SsdBlock(3));
        assert_ne!(mismatch.expected, mismatch.found);
        assert!(!sums.set(SsdBlock(8), 1), "out of range");
    }
}
