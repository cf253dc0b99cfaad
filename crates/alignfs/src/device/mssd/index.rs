//! The write log's three-layer index (ByteFS §4.3): the address space is cut into 16 MiB
//! partitions (layer 1, found by division); each partition has a skip list keyed by
//! logical page (layer 2); each page's entry is a chunk list ordered by in-page offset
//! (layer 3), every chunk naming where its bytes sit in the log.
//!
//! Chunks of one page may overlap: a newer store does not trim an older one, because
//! the older one may be the latest *committed* version of those bytes while the newer
//! one's transaction is open. Reads apply chunks in store order (`seq`), so the newest
//! wins; a committed chunk wholly covered by newer committed ones is dropped
//! ([`Index::prune`]), which keeps a hot page's list short.

use crossbeam_skiplist::SkipMap;
use parking_lot::Mutex;

use super::layout::{PAGE, PARTITION_BYTES};

/// One entry's bytes as the index knows them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chunk {
    pub offset: u16,
    pub len: u16,
    /// Log position of the entry (its data follows the header).
    pub pos: u64,
    pub seq: u64,
    pub txid: u32,
}

impl Chunk {
    fn range(&self) -> std::ops::Range<usize> {
        usize::from(self.offset)..usize::from(self.offset) + usize::from(self.len)
    }
}

type ChunkList = Mutex<Vec<Chunk>>;

pub struct Index {
    partitions: Vec<SkipMap<u32, ChunkList>>,
}

const PAGES_PER_PARTITION: u32 = (PARTITION_BYTES / PAGE) as u32;

/// Which bytes of a page a set of chunks covers, one bit per byte.
struct Coverage([u64; (PAGE / 64) as usize]);

impl Coverage {
    fn new() -> Coverage {
        Coverage([0; (PAGE / 64) as usize])
    }

    fn covers(&self, range: std::ops::Range<usize>) -> bool {
        Coverage::words(range).all(|(word, mask)| self.0[word] & mask == mask)
    }

    fn add(&mut self, range: std::ops::Range<usize>) {
        for (word, mask) in Coverage::words(range) {
            self.0[word] |= mask;
        }
    }

    /// The words `range` touches, each with the bits of its bytes: a word at a time, as
    /// pruning runs on every store and a byte at a time cost most of a commit's time.
    fn words(range: std::ops::Range<usize>) -> impl Iterator<Item = (usize, u64)> {
        let (start, end) = (range.start, range.end);
        (start / 64..end.div_ceil(64)).map(move |word| {
            let (lo, hi) = (start.max(word * 64) - word * 64, end.min(word * 64 + 64) - word * 64);
            let mask = if hi - lo == 64 { u64::MAX } else { ((1u64 << (hi - lo)) - 1) << lo };
            (word, mask)
        })
    }
}

impl Index {
    pub fn new(partitions: usize) -> Index {
        Index { partitions: (0..partitions).map(|_| SkipMap::new()).collect() }
    }

    fn partition(&self, lpa: u32) -> &SkipMap<u32, ChunkList> {
        &self.partitions[(lpa / PAGES_PER_PARTITION) as usize]
    }

    pub fn insert(&self, lpa: u32, chunk: Chunk) {
        let entry = self.partition(lpa).get_or_insert_with(lpa, || Mutex::new(Vec::new()));
        let mut list = entry.value().lock();
        let at = list.partition_point(|c| (c.offset, c.seq) < (chunk.offset, chunk.seq));
        list.insert(at, chunk);
    }

    /// Add a page's chunks at once (recovery rebuilds the index a page at a time: one
    /// skip-list insert per page rather than per entry).
    pub fn insert_page(&self, lpa: u32, mut chunks: Vec<Chunk>) {
        if chunks.is_empty() {
            return;
        }
        let entry = self.partition(lpa).get_or_insert_with(lpa, || Mutex::new(Vec::new()));
        let mut list = entry.value().lock();
        list.append(&mut chunks);
        list.sort_unstable_by_key(|c| (c.offset, c.seq));
    }

    /// The page's chunks, in store order.
    pub fn chunks(&self, lpa: u32) -> Vec<Chunk> {
        let mut chunks = match self.partition(lpa).get(&lpa) {
            Some(entry) => entry.value().lock().clone(),
            None => return Vec::new(),
        };
        chunks.sort_unstable_by_key(|c| c.seq);
        chunks
    }

    /// Drop the chunks `remove` picks; a page left with none leaves the skip list.
    pub fn retain(&self, lpa: u32, mut keep: impl FnMut(&Chunk) -> bool) {
        let partition = self.partition(lpa);
        let Some(entry) = partition.get(&lpa) else { return };
        let mut list = entry.value().lock();
        list.retain(|c| keep(c));
        if list.is_empty() {
            drop(list);
            entry.remove();
        }
    }

    /// Move a chunk to a new log position (log cleaning migrated its entry).
    pub fn relocate(&self, lpa: u32, seq: u64, pos: u64, txid: u32) {
        if let Some(entry) = self.partition(lpa).get(&lpa) {
            for chunk in entry.value().lock().iter_mut().filter(|c| c.seq == seq) {
                chunk.pos = pos;
                chunk.txid = txid;
            }
        }
    }

    /// Drop committed chunks that newer committed chunks cover whole.
    pub fn prune(&self, lpa: u32, committed: impl Fn(u32) -> bool) {
        let mut newest_first = self.chunks(lpa);
        newest_first.reverse();
        let mut coverage = Coverage::new();
        let mut shadowed = Vec::new();
        for chunk in newest_first.iter().filter(|c| committed(c.txid)) {
            if coverage.covers(chunk.range()) {
                shadowed.push(chunk.seq);
            } else {
                coverage.add(chunk.range());
            }
        }
        if !shadowed.is_empty() {
            self.retain(lpa, |c| !shadowed.contains(&c.seq));
        }
    }

    /// Every page with a chunk whose entry sits before log position `pos`, in address
    /// order (layer 1, then layer 2).
    pub fn pages_before(&self, pos: u64) -> Vec<u32> {
        self.partitions
            .iter()
            .flat_map(|p| p.iter().filter(|e| e.value().lock().iter().any(|c| c.pos < pos)).map(|e| *e.key()).collect::<Vec<_>>())
            .collect()
    }
}

/// Lay `chunks` (in store order) over `page`; `read` fetches a chunk's bytes from the log.
pub fn merge(page: &mut [u8], chunks: &[Chunk], read: &mut dyn FnMut(&Chunk, &mut [u8])) {
    for chunk in chunks {
        read(chunk, &mut page[chunk.range()]);
    }
}

/// Whether `chunks` together cover `range` of their page: a load, or cleaning for the
/// whole page, can then skip the flash read.
pub fn covers(chunks: &[Chunk], range: std::ops::Range<usize>) -> bool {
    let mut coverage = Coverage::new();
    for chunk in chunks {
        coverage.add(chunk.range());
    }
    coverage.covers(range)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    fn chunk(offset: u16, len: u16, seq: u64, txid: u32) -> Chunk {
        Chunk { offset, len, pos: seq * 64, seq, txid }
    }

    proptest! {
        /// Coverage a word at a time says what a set of bytes says.
        #[test]
        fn coverage_agrees_with_a_set_of_bytes(ranges in prop::collection::vec((0usize..4096, 0usize..300), 0..8), probe in (0usize..4096, 0usize..300)) {
            let clip = |(start, len): (usize, usize)| start..(start + len).min(PAGE as usize);
            let mut coverage = Coverage::new();
            let mut bytes = std::collections::BTreeSet::new();
            for range in ranges.into_iter().map(clip) {
                coverage.add(range.clone());
                bytes.extend(range);
            }
            let probe = clip(probe);
            prop_assert_eq!(coverage.covers(probe.clone()), probe.clone().all(|b| bytes.contains(&b)));
        }
    }

    /// Bytes of a page after its chunks: each chunk's bytes are its seq, low byte.
    fn render(chunks: &[Chunk]) -> Vec<u8> {
        let mut page = vec![0u8; PAGE as usize];
        merge(&mut page, chunks, &mut |c, out| out.fill(c.seq as u8));
        page
    }

    #[derive(Clone, Debug)]
    enum Op {
        Store { lpa: u32, offset: u16, len: u16, tx: bool },
        Commit,
        Invalidate { lpa: u32 },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => (0u32..3, 0u16..4000, 1u16..96, any::<bool>()).prop_map(|(p, offset, len, tx)| Op::Store {
                // Pages in two partitions, to cross layer 1.
                lpa: if p == 2 { PAGES_PER_PARTITION + 5 } else { p },
                offset,
                len: len.min(4096 - offset),
                tx
            }),
            1 => Just(Op::Commit),
            1 => (0u32..2).prop_map(|lpa| Op::Invalidate { lpa }),
        ]
    }

    proptest! {
        /// Against a model that keeps every store: reads show the newest bytes, and
        /// pruning never drops bytes the committed view needs.
        #[test]
        fn the_index_shows_what_a_list_of_every_store_shows(ops in prop::collection::vec(op(), 1..80)) {
            let index = Index::new(2);
            let mut model: BTreeMap<u32, Vec<Chunk>> = BTreeMap::new();
            let mut seq = 0u64;
            let mut committed = vec![true];
            for op in ops {
                match op {
                    Op::Store { lpa, offset, len, tx } => {
                        seq += 1;
                        // Transaction 0 is "no transaction"; the last one is open until committed.
                        if tx && committed.last() == Some(&true) {
                            committed.push(false);
                        }
                        let txid = if tx { (committed.len() - 1) as u32 } else { 0 };
                        let c = chunk(offset, len, seq, txid);
                        index.insert(lpa, c);
                        model.entry(lpa).or_default().push(c);
                        if txid == 0 {
                            index.prune(lpa, |t| committed[t as usize]);
                        }
                    }
                    Op::Commit => {
                        if let Some(open @ false) = committed.last_mut() {
                            *open = true;
                            for lpa in model.keys() {
                                index.prune(*lpa, |t| committed[t as usize]);
                            }
                        }
                    }
                    Op::Invalidate { lpa } => {
                        seq += 1;
                        let cut = seq;
                        index.retain(lpa, |c| c.seq >= cut);
                        model.entry(lpa).or_default().retain(|c| c.seq >= cut);
                    }
                }
                for (lpa, all) in &model {
                    let kept = index.chunks(*lpa);
                    prop_assert_eq!(render(&kept), render(all), "newest view of page {}", lpa);
                    let is_committed = |c: &&Chunk| committed[c.txid as usize];
                    let kept_committed: Vec<Chunk> = kept.iter().filter(is_committed).copied().collect();
                    let all_committed: Vec<Chunk> = all.iter().filter(is_committed).copied().collect();
                    prop_assert_eq!(render(&kept_committed), render(&all_committed), "committed view of page {}", lpa);
                    prop_assert_eq!(index.pages_before(u64::MAX).contains(lpa), !kept.is_empty());
                }
            }
        }
    }

    #[test]
    fn a_page_rewritten_by_committed_stores_keeps_one_chunk() {
        let index = Index::new(1);
        for seq in 1..=1000 {
            index.insert(3, chunk(128, 64, seq, 0));
            index.prune(3, |_| true);
        }
        assert_eq!(index.chunks(3).len(), 1);
        assert!(covers(&index.chunks(3), 128..192));
        assert!(!covers(&index.chunks(3), 120..192));
    }
}
