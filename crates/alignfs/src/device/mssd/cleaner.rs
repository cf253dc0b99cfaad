//! The firmware's log cleaning (ByteFS Algorithm 1): the newest committed version of each
//! page merged onto flash, grouped, uncommitted entries carried forward.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::index::{covers, merge, Chunk};
use super::layout::{EntryHeader, EntryKind, Layout, ENTRY_HEADER};
use crate::error::{Error, Result};

use super::*;

impl Inner {
    /// Write back the log: merge each page's committed entries into a fresh flash page
    /// (reading the old one only if the entries leave part of it uncovered), in batches;
    /// move entries of open transactions (and of pages with a block write in flight) to
    /// the head of the new region; then flush, free the old region and its TxLog.
    pub(super) fn clean(&self) -> Result<()> {
        self.clean_log(true)
    }

    /// `switch`: commits during the cleaning go to the other TxLog. Recovery cleans
    /// without switching (nothing commits meanwhile, and after a crash in a cleaning
    /// both TxLogs may hold TxIDs that must stay until the log is written back).
    ///
    /// The head follows the cleaning in steps of an eighth of the log, so that a store
    /// waiting for room waits for one step rather than the whole log. A step writes back
    /// every page with an entry below the step's end, and with it all of that page's
    /// entries below the cut: a page is still written once per cleaning, however many
    /// steps its entries span, and recovery skips the entries its flash page holds.
    pub(super) fn clean_log(&self, switch: bool) -> Result<()> {
        let _one = self.cleaning.lock();
        let started = Instant::now();
        let (cut, old) = {
            let mut st = self.log.lock();
            st.cleaning = true;
            let old = st.active;
            if switch {
                debug_assert!(st.txlogs[old ^ 1].is_empty(), "the TxLog cleaning switches to is empty");
                st.active ^= 1;
                self.dram.write_persist(Layout::active_txlog_at(), &(st.active as u64).to_le_bytes());
            }
            (st.tail, old)
        };
        let cleaned = self.clean_steps(cut, old);
        let mut st = self.log.lock();
        st.cleaning = false;
        self.room.notify_all();
        drop(st);
        self.counters.log_cleaning_us.fetch_add(started.elapsed().as_micros() as u64, Ordering::Relaxed);
        cleaned
    }

    fn clean_steps(&self, cut: u64, old: usize) -> Result<()> {
        // A batch's new pages need free flash until the flush that releases the pages
        // they replace; on a small device the spare flash bounds the batch.
        let batch_pages = CLEAN_BATCH.min(self.ftl.spare_pages() as usize / 2).max(1);
        let step = (self.layout.log_bytes / CLEAN_STEPS).max(LINE);
        loop {
            let head = self.log.lock().head;
            let step_end = cut.min(head + step);
            for batch in self.index.pages_before(step_end).chunks(batch_pages) {
                self.clean_batch(batch, cut)?;
            }
            let _media = self.media.write();
            let mut st = self.log.lock();
            self.ftl.flush(&mut self.ftl.state.lock())?;
            st.head = step_end;
            self.dram.write_persist(Layout::head_at(), &step_end.to_le_bytes());
            self.room.notify_all();
            if step_end == cut {
                let (at, _) = self.layout.txlog_range(old);
                let used = st.txlogs[old].len() * 4;
                self.dram.zero(at, used);
                self.dram.persist(at, used);
                for txid in std::mem::take(&mut st.txlogs[old]) {
                    st.committed.remove(&txid);
                }
                st.residual = st.used();
                self.counters.log_cleanings.fetch_add(1, Ordering::Relaxed);
                return Ok(());
            }
        }
    }

    pub(super) fn clean_batch(&self, batch: &[u32], cut: u64) -> Result<()> {
        let _media = self.media.write();
        let mut st = self.log.lock();
        let mut plan: Vec<(u32, Vec<Chunk>)> = Vec::new();
        for &lpa in batch {
            let chunks: Vec<Chunk> = self.index.chunks(lpa).into_iter().filter(|c| c.pos < cut).collect();
            if chunks.is_empty() {
                continue;
            }
            let committed = |t: u32| t == 0 || st.committed.contains(&t);
            let writing = self.ftl.is_writing(&self.ftl.state.lock(), lpa);
            if writing || chunks.iter().any(|c| !committed(c.txid)) {
                self.migrate(&mut st, lpa, &chunks)?;
            } else {
                plan.push((lpa, chunks));
            }
        }
        if plan.is_empty() {
            return Ok(());
        }
        let mut f = self.ftl.state.lock();
        let partial: Vec<(usize, u32)> = plan
            .iter()
            .enumerate()
            .filter(|(_, (_, chunks))| !covers(chunks, 0..PAGE as usize))
            .filter_map(|(i, (lpa, _))| self.ftl.lookup(*lpa).map(|ppa| (i, ppa)))
            .collect();
        let ppas: Vec<u32> = partial.iter().map(|&(_, ppa)| ppa).collect();
        let partial_lpas: Vec<u32> = partial.iter().map(|&(i, _)| plan[i].0).collect();
        let mut pages = vec![vec![0u8; PAGE as usize]; plan.len()];
        for ((i, _), base) in partial.iter().zip(self.ftl.read_pages(&partial_lpas, &ppas)?.pages()) {
            pages[*i].copy_from_slice(base);
        }
        self.counters.log_base_reads.fetch_add(partial.len() as u64, Ordering::Relaxed);
        for ((_, chunks), page) in plan.iter().zip(pages.iter_mut()) {
            merge(page, chunks, &mut |chunk, bytes| self.read_log(chunk.pos + ENTRY_HEADER, bytes));
        }
        let lpas: Vec<u32> = plan.iter().map(|(lpa, _)| *lpa).collect();
        if self.ftl.needs_collection(lpas.len()) {
            self.ftl.collect(&mut f, lpas.len())?;
        }
        let targets = self.ftl.allocate(&mut f, &lpas, false)?;
        self.ftl.program(&lpas, &targets, &pages.iter().map(Vec::as_slice).collect::<Vec<_>>())?;
        for ((lpa, chunks), target) in plan.iter().zip(targets) {
            let version = chunks.iter().map(|c| c.seq).max().expect("a planned page has chunks");
            if self.ftl.install(&mut f, *lpa, target, version) {
                self.index.retain(*lpa, |c| c.pos >= cut);
            }
        }
        self.counters.log_cleaned_pages.fetch_add(plan.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Copy a page's entries to the tail, keeping their order (`seq`); those already
    /// committed lose their TxID, whose TxLog the cleaning is about to empty.
    pub(super) fn migrate(&self, st: &mut LogState, lpa: u32, chunks: &[Chunk]) -> Result<()> {
        for chunk in chunks {
            let mut data = vec![0u8; usize::from(chunk.len)];
            self.read_log(chunk.pos + ENTRY_HEADER, &mut data);
            let txid = if chunk.txid == 0 || st.committed.contains(&chunk.txid) { 0 } else { chunk.txid };
            let header = EntryHeader { kind: EntryKind::Data, txid, seq: chunk.seq, lpa, offset: chunk.offset, len: chunk.len };
            let pos = self
                .append(st, &header, &data)
                .map_err(|_| Error::InvalidArgument("the device's write log is full of open transactions; commit them".into()))?;
            self.index.relocate(lpa, chunk.seq, pos, txid);
            self.counters.log_migrated_bytes.fetch_add(EntryHeader::footprint(data.len()), Ordering::Relaxed);
        }
        self.verify(st);
        Ok(())
    }

    pub(super) fn wake_cleaner(&self) -> Result<()> {
        // Once halted, the store that needs room cleans.
        if self.options.background_cleaning && !self.stop.load(Ordering::Acquire) {
            *self.wake.lock() = true;
            self.woken.notify_one();
            Ok(())
        } else {
            self.clean()
        }
    }
}

pub(super) fn spawn_cleaner(inner: &Arc<Inner>) -> JoinHandle<()> {
    let weak: Weak<Inner> = Arc::downgrade(inner);
    std::thread::Builder::new()
        .name("mssd-cleaner".into())
        .spawn(move || loop {
            let Some(inner) = weak.upgrade() else { return };
            let run = {
                let mut wake = inner.wake.lock();
                if !*wake {
                    inner.woken.wait_for(&mut wake, Duration::from_millis(200));
                }
                std::mem::take(&mut *wake)
            };
            if inner.stop.load(Ordering::Acquire) {
                return;
            }
            if run {
                if let Err(e) = inner.clean() {
                    tracing::error!("memory-semantic SSD log cleaning failed: {e}");
                }
            }
        })
        .expect("spawn the log cleaner")
}
