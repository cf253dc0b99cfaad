//! NVStore's clean pages (CP, Table 2): copies of SSD blocks in DRAM, so that a read finds
//! a block without the device, and an unaligned write to a cached block makes a whole
//! dirty page at once (CP -> DP) whose read and sync then need no device read either.
//!
//! Pages are keyed by SSD block, not by object and offset. Blocks are written out of place
//! and every data write passes [`CleanPages::wrote`] on its way to the device, so the copy
//! of a block number is always that block's bytes: a freed block holds a stale copy only
//! until it is written again, and nothing names a freed block meanwhile. Nothing here is
//! durable: a crash loses the cache and nothing else.

use std::sync::Arc;

use quick_cache::sync::Cache;

use crate::map::SsdBlock;

pub(crate) struct CleanPages {
    cache: Cache<u64, Arc<[u8]>>,
    block_bytes: usize,
}

impl CleanPages {
    /// At most `bytes` of blocks of `block_bytes`; `None` when that is not one block.
    pub(crate) fn new(bytes: u64, block_bytes: u64) -> Option<CleanPages> {
        let blocks = bytes / block_bytes;
        (blocks > 0).then(|| CleanPages { cache: Cache::new(blocks as usize), block_bytes: block_bytes as usize })
    }

    pub(crate) fn get(&self, block: SsdBlock) -> Option<Arc<[u8]>> {
        self.cache.get(&block.0)
    }

    /// The block's page leaves the clean set (it became a dirty page).
    pub(crate) fn take(&self, block: SsdBlock) -> Option<Arc<[u8]>> {
        self.cache.remove(&block.0).map(|(_, page)| page)
    }

    /// Whole blocks from `first` on are being written with `image`: their pages are
    /// these bytes now (an aligned write or a sync makes a clean page).
    pub(crate) fn wrote(&self, first: SsdBlock, image: &[u8]) {
        for (k, bytes) in image.chunks_exact(self.block_bytes).enumerate() {
            self.cache.insert(first.0 + k as u64, Arc::from(bytes));
        }
    }

    /// A block read and verified: its page becomes clean (a read miss makes a clean page).
    pub(crate) fn read(&self, block: SsdBlock, image: &[u8]) {
        self.cache.insert(block.0, Arc::from(image));
    }

    /// Freed blocks: their copies would only take room.
    pub(crate) fn forget(&self, blocks: &[SsdBlock]) {
        for block in blocks {
            self.cache.remove(&block.0);
        }
    }

    /// Drop every copy (a benchmark's cold reads).
    pub(crate) fn clear(&self) {
        self.cache.clear();
    }

    #[cfg(test)]
    pub(crate) fn pages(&self) -> usize {
        self.cache.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_replaces_the_copy_and_a_free_drops_it() {
        let clean = CleanPages::new(16 * 4096, 4096).unwrap();
        let image: Vec<u8> = (0..2 * 4096).map(|i| (i / 4096 + 1) as u8).collect();
        clean.wrote(SsdBlock(7), &image);
        assert_eq!(clean.get(SsdBlock(8)).unwrap()[..], image[4096..]);
        clean.wrote(SsdBlock(8), &[9u8; 4096]);
        assert_eq!(clean.get(SsdBlock(8)).unwrap()[0], 9);
        clean.forget(&[SsdBlock(7)]);
        assert!(clean.get(SsdBlock(7)).is_none());
        assert_eq!(clean.take(SsdBlock(8)).unwrap()[0], 9);
        assert!(clean.get(SsdBlock(8)).is_none());
        assert!(CleanPages::new(4095, 4096).is_none());
    }

    #[test]
    fn the_cache_holds_no_more_than_its_size() {
        let clean = CleanPages::new(8 * 4096, 4096).unwrap();
        for block in 0..64 {
            clean.read(SsdBlock(block), &[block as u8; 4096]);
        }
        assert!(clean.pages() <= 8, "{} pages", clean.pages());
    }
}
