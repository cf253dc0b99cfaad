//! The write log in device DRAM: byte-interface stores appended as entries, verified,
//! committed by transaction, trimmed.

use std::sync::atomic::Ordering;
use std::time::Instant;

use parking_lot::MutexGuard;

use super::index::Chunk;
use super::latency::settle;
use super::layout::{EntryHeader, EntryKind, Layout};
use super::ByteTier;
use crate::error::{Error, Result};

use super::*;

impl Inner {
    pub(super) fn check_range(&self, addr: u64, len: u64) -> Result<()> {
        let size = u64::from(self.layout.logical_pages) * PAGE;
        if addr.checked_add(len).is_none_or(|end| end > size) {
            return Err(Error::OutOfRange { offset: addr, len, size });
        }
        Ok(())
    }

    pub(super) fn read_log(&self, pos: u64, out: &mut [u8]) {
        read_log(&self.layout, self.dram.as_ref(), pos, out);
    }

    pub(super) fn store(&self, txid: u32, addr: u64, data: &[u8]) -> Result<()> {
        let start = Instant::now();
        let lines = self.log_entries(txid, addr, data)?;
        self.counters.byte_store_payload.fetch_add(data.len() as u64, Ordering::Relaxed);
        self.counters.byte_store_bytes.fetch_add(lines, Ordering::Relaxed);
        if let Some(model) = self.options.latency {
            settle(start, model.store(lines));
        }
        Ok(())
    }

    /// Append `data`'s entries at `addr` (one per page it spans) and index them; wake the
    /// cleaner when the log is due. Returns the cache lines they span.
    pub(super) fn log_entries(&self, txid: u32, addr: u64, data: &[u8]) -> Result<u64> {
        self.check_range(addr, data.len() as u64)?;
        let pieces = pieces(addr, data.len());
        let sizes: Vec<u64> = pieces.iter().map(|(_, _, r)| EntryHeader::footprint(r.len())).collect();
        let limit = self.layout.log_bytes - self.layout.log_bytes / RESERVE_DIVISOR;
        let mut st = self.log_with_room(&sizes, limit, |st| {
            if txid != 0 && !st.open.contains_key(&txid) {
                return Err(Error::NoSuchTransaction(txid));
            }
            Ok(())
        })?;
        for (lpa, offset, range) in &pieces {
            let seq = self.seq.fetch_add(1, Ordering::Relaxed);
            let header = EntryHeader { kind: EntryKind::Data, txid, seq, lpa: *lpa, offset: *offset as u16, len: range.len() as u16 };
            let pos = self.append(&mut st, &header, &data[range.clone()])?;
            self.index.insert(*lpa, Chunk { offset: header.offset, len: header.len, pos, seq, txid });
            if txid == 0 {
                let committed = &st.committed;
                self.index.prune(*lpa, |t| t == 0 || committed.contains(&t));
            } else {
                let pages = st.open.get_mut(&txid).expect("checked open");
                if pages.last() != Some(lpa) {
                    pages.push(*lpa);
                }
            }
        }
        let over_threshold = self.over_threshold(&st);
        drop(st);
        if over_threshold {
            self.wake_cleaner()?;
        }
        Ok(pieces.iter().map(|(lpa, offset, range)| line_span(u64::from(*lpa) * PAGE + *offset as u64, range.len())).sum())
    }

    /// The log, locked, once entries of `sizes` fit below `limit` bytes of use: waiting
    /// for a running cleaning's steps, or after one cleaning of its own if they do not
    /// yet. `check` runs first, each time the lock is taken.
    pub(super) fn log_with_room(
        &self,
        sizes: &[u64],
        limit: u64,
        check: impl Fn(&LogState) -> Result<()>,
    ) -> Result<MutexGuard<'_, LogState>> {
        let mut cleaned = false;
        let mut waiting: Option<Instant> = None;
        let waited = |since: Option<Instant>| {
            if let Some(since) = since {
                self.counters.log_full_waits.fetch_add(1, Ordering::Relaxed);
                self.counters.log_full_wait_us.fetch_add(since.elapsed().as_micros() as u64, Ordering::Relaxed);
            }
        };
        loop {
            let mut st = self.log.lock();
            check(&st)?;
            if self.fits(&st, sizes, limit) {
                waited(waiting);
                return Ok(st);
            }
            waiting.get_or_insert_with(Instant::now);
            if st.cleaning {
                self.room.wait(&mut st);
                continue;
            }
            drop(st);
            if cleaned {
                waited(waiting);
                return Err(Error::NoSpace);
            }
            self.clean()?;
            cleaned = true;
        }
    }

    /// Whether entries of `sizes` fit below `limit` bytes of use, pads included.
    pub(super) fn fits(&self, st: &LogState, sizes: &[u64], limit: u64) -> bool {
        let mut tail = st.tail;
        for &size in sizes {
            let room = self.layout.log_bytes - tail % self.layout.log_bytes;
            if room < size {
                tail += room;
            }
            tail += size;
        }
        tail - st.head <= limit
    }

    pub(super) fn over_threshold(&self, st: &LogState) -> bool {
        let threshold = self.layout.log_bytes * u64::from(self.options.clean_at_percent) / 100;
        // What the last cleaning could not free (open transactions) does not count again.
        st.used() >= threshold && st.used() >= st.residual + self.layout.log_bytes / RESERVE_DIVISOR
    }

    /// Append one entry at the tail (after a pad to the next lap if it would wrap).
    pub(super) fn append(&self, st: &mut LogState, header: &EntryHeader, data: &[u8]) -> Result<u64> {
        let size = EntryHeader::footprint(data.len());
        let room = self.layout.log_bytes - st.tail % self.layout.log_bytes;
        let pad = if room < size { room } else { 0 };
        if st.used() + pad + size > self.layout.log_bytes {
            return Err(Error::NoSpace);
        }
        if pad > 0 {
            let filler = EntryHeader { kind: EntryKind::Pad, txid: 0, seq: 0, lpa: 0, offset: 0, len: 0 };
            self.dram.write(self.layout.log(st.tail), &filler.encode(st.tail, self.layout.incarnation, &[]));
            st.tail += pad;
        }
        let pos = st.tail;
        self.dram.write(self.layout.log(pos), &header.encode(pos, self.layout.incarnation, data));
        st.tail += size;
        Ok(pos)
    }

    pub(super) fn verify(&self, st: &mut LogState) {
        let (from, to) = (st.verified, st.tail);
        if to > from {
            let split = self.layout.log_bytes - from % self.layout.log_bytes;
            let first = (to - from).min(split);
            self.dram.persist(self.layout.log(from), first as usize);
            if to - from > first {
                self.dram.persist(self.layout.log(from + first), (to - from - first) as usize);
            }
        }
        st.verified = to;
        self.counters.verifies.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn commit(&self, txid: u32) -> Result<()> {
        let start = Instant::now();
        loop {
            let mut st = self.log.lock();
            if !st.open.contains_key(&txid) {
                return Err(Error::NoSuchTransaction(txid));
            }
            let active = st.active;
            let count = st.txlogs[active].len() as u64;
            if count >= self.layout.txlog_entries {
                drop(st);
                self.clean()?;
                continue;
            }
            self.verify(&mut st);
            self.dram.write_persist(self.layout.txlog(active, count), &txid.to_le_bytes());
            st.txlogs[active].push(txid);
            st.committed.insert(txid);
            let pages = st.open.remove(&txid).expect("checked open");
            let committed = &st.committed;
            for lpa in pages {
                self.index.prune(lpa, |t| t == 0 || committed.contains(&t));
            }
            break;
        }
        self.counters.commits.fetch_add(1, Ordering::Relaxed);
        if let Some(model) = self.options.latency {
            // The COMMIT command is one more posted write, ordered by its own verify.
            settle(start, model.verify() * 2 + model.store(LINE));
        }
        Ok(())
    }

    pub(super) fn trim(&self, addr: u64, len: u64) -> Result<()> {
        if addr % PAGE != 0 || len % PAGE != 0 {
            return Err(Error::Unaligned { what: "a trim", offset: addr, len, unit: PAGE });
        }
        self.check_range(addr, len)?;
        for lpa in (addr / PAGE) as u32..((addr + len) / PAGE) as u32 {
            let mut st = self.log_with_room(&[EntryHeader::footprint(0)], self.layout.log_bytes, |_| Ok(()))?;
            let seq = self.seq.fetch_add(1, Ordering::Relaxed);
            let header = EntryHeader { kind: EntryKind::Trim, txid: 0, seq, lpa, offset: 0, len: 0 };
            self.append(&mut st, &header, &[])?;
            self.index.retain(lpa, |_| false);
            self.ftl.unmap(&mut self.ftl.state.lock(), lpa, seq);
            self.counters.trimmed_pages.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }
}

/// Whole cache lines a byte range touches, in bytes.
pub(super) fn line_span(addr: u64, len: usize) -> u64 {
    if len == 0 {
        return 0;
    }
    let first = addr / LINE;
    let last = (addr + len as u64 - 1) / LINE;
    (last - first + 1) * LINE
}

/// `addr..addr + len` cut at page boundaries: (page, offset in page, range in the input).
pub(super) fn pieces(addr: u64, len: usize) -> Vec<(u32, usize, std::ops::Range<usize>)> {
    let mut out = Vec::new();
    let mut done = 0;
    while done < len {
        let at = addr + done as u64;
        let offset = (at % PAGE) as usize;
        let take = (PAGE as usize - offset).min(len - done);
        out.push(((at / PAGE) as u32, offset, done..done + take));
        done += take;
    }
    out
}

/// Read log bytes at position `pos`; an entry never wraps, so neither does a read of one.
pub(super) fn read_log(layout: &Layout, dram: &dyn ByteTier, pos: u64, out: &mut [u8]) {
    dram.read(layout.log(pos), out);
}
