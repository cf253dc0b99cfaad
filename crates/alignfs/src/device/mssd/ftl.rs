//! The flash translation layer: a page map from logical to physical flash pages, written
//! out of place at a write frontier, with greedy garbage collection.
//!
//! The map has two copies. The live one (atomics, read without a lock) names what a
//! read sees; the persisted one, in device DRAM, names what survives a power cut, and
//! moves forward only at a flush, after the flash writes it points at are durable: until
//! then a page a persisted entry still names stays valid, so it cannot be collected.
//! Each physical page's out-of-band bytes (its logical page and the version of its
//! contents) are written before the persisted entry that points at it, so recovery
//! knows which log entries a page already holds.

use std::collections::{HashMap, HashSet, VecDeque};
use std::ops::Range;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use super::layout::{Layout, PAGE};
use super::Counters;
use crate::device::{run_batch, AlignedBuf, BlockDevice, ByteTier, IoOp, IoRequest};
use crate::error::{Error, Result};

const NO_PAGE: u32 = u32::MAX;
/// Erase blocks collection keeps free beyond what the request at hand needs.
const FREE_LOW: u64 = 3;

pub struct FtlState {
    /// The DRAM copy of the map, mirrored (physical page + 1; 0 unmapped).
    persisted: Vec<u32>,
    /// The version of each logical page's live contents: the store sequence number of
    /// the block write, cleaning or deallocation that produced it.
    version: Vec<u64>,
    owner: Vec<u32>,
    valid: Vec<u32>,
    /// Pages allocated to block writes still in flight, per erase block.
    in_flight: Vec<u32>,
    /// Block writes in flight per logical page: cleaning leaves such pages alone.
    writing: HashMap<u32, u32>,
    free: VecDeque<u32>,
    frontier: Option<(u32, u32)>,
    dirty: HashSet<u32>,
}

pub struct Ftl {
    pub layout: Layout,
    pub flash: Arc<dyn BlockDevice>,
    dram: Arc<dyn ByteTier>,
    /// The live map, physical page + 1 (0: unmapped).
    live: Vec<AtomicU32>,
    pub state: Mutex<FtlState>,
    counters: Arc<Counters>,
    free_blocks: AtomicU64,
    /// Logical pages whose flash traffic the counters also count as metadata, sorted and
    /// disjoint ([`Ftl::count_as_metadata`]).
    metadata: RwLock<Vec<Range<u32>>>,
}

impl Ftl {
    /// The map as the DRAM holds it; every erase block without a mapped page is free.
    pub fn load(layout: Layout, flash: Arc<dyn BlockDevice>, dram: Arc<dyn ByteTier>, counters: Arc<Counters>) -> Result<(Ftl, u64)> {
        let pages = layout.logical_pages as usize;
        let mut raw = vec![0u8; pages * 4];
        dram.read(layout.l2p(0), &mut raw);
        let persisted: Vec<u32> = raw.chunks_exact(4).map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes"))).collect();
        let mut owner = vec![NO_PAGE; layout.flash_pages as usize];
        let mut valid = vec![0u32; layout.erase_blocks() as usize];
        let mut version = vec![0u64; pages];
        for (lpa, &mapped) in persisted.iter().enumerate() {
            if mapped == 0 {
                continue;
            }
            let ppa = mapped - 1;
            if ppa >= layout.flash_pages || owner[ppa as usize] != NO_PAGE {
                return Err(Error::Corrupt {
                    structure: "memory-semantic SSD page map",
                    device: dram.describe(),
                    offset: layout.l2p(lpa as u32),
                    problem: format!("logical page {lpa} maps to flash page {ppa}, out of range or mapped twice"),
                });
            }
            owner[ppa as usize] = lpa as u32;
            valid[(ppa / layout.pages_per_erase_block) as usize] += 1;
            let mut oob = [0u8; 16];
            dram.read(layout.oob(ppa), &mut oob);
            version[lpa] = u64::from_le_bytes(oob[8..16].try_into().expect("8 bytes"));
        }
        let max_version = version.iter().copied().max().unwrap_or(0);
        let free: VecDeque<u32> = (0..layout.erase_blocks()).filter(|&b| valid[b as usize] == 0).collect();
        let ftl = Ftl {
            live: persisted.iter().map(|&p| AtomicU32::new(p)).collect(),
            free_blocks: AtomicU64::new(free.len() as u64),
            state: Mutex::new(FtlState {
                persisted,
                version,
                owner,
                in_flight: vec![0; valid.len()],
                valid,
                writing: HashMap::new(),
                free,
                frontier: None,
                dirty: HashSet::new(),
            }),
            layout,
            flash,
            dram,
            counters,
            metadata: RwLock::new(Vec::new()),
        };
        Ok((ftl, max_version))
    }

    /// Count the flash reads and programs of the pages that overlap `ranges` (byte ranges
    /// of the logical space) as metadata from now on, replacing any earlier ranges. The
    /// device cannot tell what a page holds; whoever lays out the space can.
    pub fn count_as_metadata(&self, ranges: &[Range<u64>]) {
        let limit = u64::from(self.layout.logical_pages);
        let mut pages: Vec<Range<u32>> = ranges
            .iter()
            .filter(|r| r.start < r.end)
            .map(|r| (r.start / PAGE).min(limit) as u32..r.end.div_ceil(PAGE).min(limit) as u32)
            .filter(|r| !r.is_empty())
            .collect();
        pages.sort_unstable_by_key(|r| r.start);
        let mut merged: Vec<Range<u32>> = Vec::with_capacity(pages.len());
        for r in pages {
            match merged.last_mut() {
                Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
                _ => merged.push(r),
            }
        }
        *self.metadata.write() = merged;
    }

    /// How many of `lpas` are metadata pages.
    fn metadata_pages(&self, lpas: &[u32]) -> u64 {
        let metadata = self.metadata.read();
        if metadata.is_empty() {
            return 0;
        }
        let contains = |lpa: u32| {
            let at = metadata.partition_point(|r| r.end <= lpa);
            metadata.get(at).is_some_and(|r| r.start <= lpa)
        };
        lpas.iter().filter(|&&lpa| contains(lpa)).count() as u64
    }

    /// Count programs of `lpas`, whichever path writes them.
    pub fn count_programs(&self, lpas: &[u32]) {
        self.counters.flash_program_bytes.fetch_add(lpas.len() as u64 * PAGE, Ordering::Relaxed);
        self.counters.flash_program_metadata_bytes.fetch_add(self.metadata_pages(lpas) * PAGE, Ordering::Relaxed);
    }

    /// The flash page a read of `lpa` sees now.
    pub fn lookup(&self, lpa: u32) -> Option<u32> {
        self.live[lpa as usize].load(Ordering::Acquire).checked_sub(1)
    }

    /// Whether a write of `pages` should collect garbage first.
    pub fn needs_collection(&self, pages: usize) -> bool {
        let ppeb = u64::from(self.layout.pages_per_erase_block);
        self.free_blocks.load(Ordering::Relaxed) * ppeb < pages as u64 + FREE_LOW * ppeb
    }

    /// Flash beyond the logical size: the most a batch of new pages can take before the
    /// pages they replace are released (at the next flush).
    pub fn spare_pages(&self) -> u64 {
        u64::from(self.layout.flash_pages - self.layout.logical_pages)
    }

    fn available(&self, st: &FtlState) -> u64 {
        let ppeb = self.layout.pages_per_erase_block;
        let left_open = st.frontier.map_or(0, |(_, next)| ppeb - next);
        u64::from(left_open) + st.free.len() as u64 * u64::from(ppeb)
    }

    /// `n` fresh flash pages for `lpas`, in frontier order (so consecutive pages of a
    /// write are consecutive on flash unless an erase block ends between them).
    pub fn allocate(&self, st: &mut FtlState, lpas: &[u32], host_write: bool) -> Result<Vec<u32>> {
        let ppeb = self.layout.pages_per_erase_block;
        if lpas.len() as u64 > self.available(st) {
            return Err(Error::NoSpace);
        }
        let mut out = Vec::with_capacity(lpas.len());
        for &lpa in lpas {
            let (block, next) = match st.frontier {
                Some((block, next)) if next < ppeb => (block, next),
                closed => {
                    // A block emptied while it was the frontier is free once it closes.
                    if let Some((full, _)) = closed {
                        if st.valid[full as usize] == 0 {
                            st.free.push_back(full);
                        }
                    }
                    let block = st.free.pop_front().ok_or(Error::NoSpace)?;
                    self.free_blocks.store(st.free.len() as u64, Ordering::Relaxed);
                    self.counters.erases.fetch_add(1, Ordering::Relaxed);
                    (block, 0)
                }
            };
            st.frontier = Some((block, next + 1));
            let ppa = block * ppeb + next;
            st.owner[ppa as usize] = lpa;
            st.valid[block as usize] += 1;
            if host_write {
                st.in_flight[block as usize] += 1;
                *st.writing.entry(lpa).or_default() += 1;
            }
            out.push(ppa);
        }
        Ok(out)
    }

    /// A host write of `ppa` for `lpa` finished (successfully or not).
    pub fn write_done(&self, st: &mut FtlState, lpa: u32, ppa: u32) {
        st.in_flight[(ppa / self.layout.pages_per_erase_block) as usize] -= 1;
        if let Some(count) = st.writing.get_mut(&lpa) {
            *count -= 1;
            if *count == 0 {
                st.writing.remove(&lpa);
            }
        }
    }

    pub fn is_writing(&self, st: &FtlState, lpa: u32) -> bool {
        st.writing.contains_key(&lpa)
    }

    /// Make `ppa` the live copy of `lpa` at `version`, unless a newer version already
    /// is (two writes of a page in flight may finish in either order). False: `ppa` was
    /// not needed and is free again.
    pub fn install(&self, st: &mut FtlState, lpa: u32, ppa: u32, version: u64) -> bool {
        let current = self.live[lpa as usize].load(Ordering::Relaxed);
        if current != 0 && st.version[lpa as usize] > version {
            self.release(st, ppa);
            return false;
        }
        self.replace(st, lpa, ppa + 1, version);
        true
    }

    /// Deallocate `lpa` (TRIM): it reads as zeros from now on.
    pub fn unmap(&self, st: &mut FtlState, lpa: u32, version: u64) {
        self.replace(st, lpa, 0, version);
    }

    fn replace(&self, st: &mut FtlState, lpa: u32, mapped: u32, version: u64) {
        let current = self.live[lpa as usize].swap(mapped, Ordering::AcqRel);
        // A page that never reached the persisted map is nobody's any more.
        if current != 0 && current != st.persisted[lpa as usize] {
            self.release(st, current - 1);
        }
        st.version[lpa as usize] = version;
        st.dirty.insert(lpa);
    }

    /// Give back a page whose write failed.
    pub fn discard(&self, st: &mut FtlState, ppa: u32) {
        self.release(st, ppa);
    }

    fn release(&self, st: &mut FtlState, ppa: u32) {
        let block = ppa / self.layout.pages_per_erase_block;
        st.owner[ppa as usize] = NO_PAGE;
        st.valid[block as usize] -= 1;
        let open = st.frontier.is_some_and(|(open, _)| open == block);
        if st.valid[block as usize] == 0 && !open {
            st.free.push_back(block);
            self.free_blocks.store(st.free.len() as u64, Ordering::Relaxed);
        }
    }

    pub fn version(&self, st: &FtlState, lpa: u32) -> u64 {
        st.version[lpa as usize]
    }

    /// Make every finished write durable, then persist the map entries naming them.
    pub fn flush(&self, st: &mut FtlState) -> Result<()> {
        self.flash.flush()?;
        self.counters.flash_flushes.fetch_add(1, Ordering::Relaxed);
        let mut dirty: Vec<u32> = st.dirty.drain().collect();
        dirty.sort_unstable();
        for lpa in dirty {
            let live = self.live[lpa as usize].load(Ordering::Relaxed);
            let persisted = st.persisted[lpa as usize];
            if live == persisted {
                continue;
            }
            if live != 0 {
                let mut oob = [0u8; 16];
                oob[..4].copy_from_slice(&lpa.to_le_bytes());
                oob[8..].copy_from_slice(&st.version[lpa as usize].to_le_bytes());
                self.dram.write_persist(self.layout.oob(live - 1), &oob);
            }
            self.dram.write_persist(self.layout.l2p(lpa), &live.to_le_bytes());
            st.persisted[lpa as usize] = live;
            if persisted != 0 {
                self.release(st, persisted - 1);
            }
        }
        Ok(())
    }

    /// Read whole flash pages (none of them unmapped; `lpas[i]` is the logical page
    /// `ppas[i]` holds), one IO per run of consecutive pages.
    pub fn read_pages(&self, lpas: &[u32], ppas: &[u32]) -> Result<FlashPages> {
        debug_assert_eq!(lpas.len(), ppas.len());
        let mut batch = Vec::new();
        for run in runs(ppas) {
            let len = run.len() * PAGE as usize;
            batch.push(IoRequest { op: IoOp::Read, offset_bytes: u64::from(run[0]) * PAGE, buf: AlignedBuf::zeroed(len) });
        }
        self.counters.flash_read_bytes.fetch_add(ppas.len() as u64 * PAGE, Ordering::Relaxed);
        self.counters.flash_read_metadata_bytes.fetch_add(self.metadata_pages(lpas) * PAGE, Ordering::Relaxed);
        Ok(FlashPages(run_batch(self.flash.as_ref(), batch)?))
    }

    /// Program `pages`, the contents of logical pages `lpas`, at `ppas` and wait.
    pub fn program(&self, lpas: &[u32], ppas: &[u32], pages: &[&[u8]]) -> Result<()> {
        let mut batch = Vec::new();
        let mut at = 0;
        for run in runs(ppas) {
            let mut buf = AlignedBuf::zeroed(run.len() * PAGE as usize);
            for (page, slot) in pages[at..at + run.len()].iter().zip(buf.chunks_mut(PAGE as usize)) {
                slot.copy_from_slice(page);
            }
            at += run.len();
            batch.push(IoRequest { op: IoOp::Write, offset_bytes: u64::from(run[0]) * PAGE, buf });
        }
        self.count_programs(lpas);
        run_batch(self.flash.as_ref(), batch).map(|_| ())
    }

    /// Garbage collection: flush (which releases the pages persisted entries no longer
    /// name), then move the valid pages of the erase blocks with the fewest until `want`
    /// pages and a few erase blocks more are free, or no block would give any back. The
    /// caller excludes readers.
    pub fn collect(&self, st: &mut FtlState, want: usize) -> Result<()> {
        self.flush(st)?;
        let ppeb = self.layout.pages_per_erase_block;
        while self.available(st) < want as u64 + FREE_LOW * u64::from(ppeb) {
            let open = st.frontier.map(|(block, _)| block);
            let candidate = (0..self.layout.erase_blocks())
                .filter(|&b| Some(b) != open && st.in_flight[b as usize] == 0 && !st.free.contains(&b))
                .filter(|&b| st.valid[b as usize] < ppeb)
                .min_by_key(|&b| st.valid[b as usize]);
            let Some(victim) = candidate else { break };
            let moving: Vec<u32> = (victim * ppeb..(victim + 1) * ppeb).filter(|&p| st.owner[p as usize] != NO_PAGE).collect();
            if moving.is_empty() {
                st.free.push_back(victim);
                continue;
            }
            let lpas: Vec<u32> = moving.iter().map(|&p| st.owner[p as usize]).collect();
            let pages = self.read_pages(&lpas, &moving)?;
            let targets = self.allocate(st, &lpas, false)?;
            self.program(&lpas, &targets, &pages.pages().collect::<Vec<_>>())?;
            for (&lpa, &target) in lpas.iter().zip(&targets) {
                let version = st.version[lpa as usize];
                self.replace(st, lpa, target + 1, version);
            }
            self.flush(st)?;
            self.counters.gc_moves.fetch_add(moving.len() as u64, Ordering::Relaxed);
            self.counters.gc_runs.fetch_add(1, Ordering::Relaxed);
            debug_assert_eq!(st.valid[victim as usize], 0, "a collected erase block holds no valid page");
        }
        Ok(())
    }
}

/// Flash pages as read: the run buffers, walked a page at a time.
pub struct FlashPages(Vec<AlignedBuf>);

impl FlashPages {
    pub fn pages(&self) -> impl Iterator<Item = &[u8]> {
        self.0.iter().flat_map(|run| run.chunks(PAGE as usize))
    }
}

/// `ppas` cut into runs of consecutive pages.
pub fn runs(ppas: &[u32]) -> Vec<&[u32]> {
    let mut out = Vec::new();
    let mut start = 0;
    for i in 1..=ppas.len() {
        if i == ppas.len() || ppas[i] != ppas[i - 1] + 1 {
            if i > start {
                out.push(&ppas[start..i]);
            }
            start = i;
        }
    }
    out
}
