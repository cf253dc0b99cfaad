//! The block interface: reads that lay the log's newer bytes over flash, and block
//! writes that void what the log held for their pages.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::ftl::runs;
use super::index::{covers, merge};
use super::latency::settle;
use super::layout::ENTRY_HEADER;
use crate::device::{AlignedBuf, BlockDevice, IoOp, IoOutcome, IoRequest, IoTicket};
use crate::error::{Error, Result};

use super::*;

impl Inner {
    /// Bytes at `addr` as a read sees them: flash (or zeros) with the log's newer bytes
    /// over it. A byte-interface load skips the flash when the log covers the range.
    pub(super) fn read_range(&self, addr: u64, out: &mut [u8], load: bool) -> Result<()> {
        self.check_range(addr, out.len() as u64)?;
        let _media = self.media.read();
        // Every flash page the range needs in one batch (adjacent pages in one IO), as a
        // device reads a multi-page command; then each page with its log chunks merged.
        let pieces = pieces(addr, out.len());
        let mut needs = Vec::with_capacity(pieces.len());
        let (mut lpas, mut ppas) = (Vec::with_capacity(pieces.len()), Vec::with_capacity(pieces.len()));
        for (lpa, offset, range) in &pieces {
            let chunks = self.index.chunks(*lpa);
            let from_log_only = load && covers(&chunks, *offset..*offset + range.len());
            let ppa = if from_log_only { None } else { self.ftl.lookup(*lpa) };
            if let Some(ppa) = ppa {
                lpas.push(*lpa);
                ppas.push(ppa);
            }
            needs.push((chunks, ppa.is_some()));
        }
        let flash = self.ftl.read_pages(&lpas, &ppas)?;
        let mut flash = flash.pages();
        let mut page = AlignedBuf::zeroed(PAGE as usize);
        for ((_, offset, range), (chunks, mapped)) in pieces.into_iter().zip(needs) {
            if mapped {
                page.copy_from_slice(flash.next().expect("one page per mapped page"));
            } else {
                page.fill(0);
            }
            merge(&mut page, &chunks, &mut |chunk, bytes| self.read_log(chunk.pos + ENTRY_HEADER, bytes));
            out[range.clone()].copy_from_slice(&page[offset..offset + range.len()]);
        }
        Ok(())
    }

    pub(super) fn read_blocks(&self, requests: Vec<(usize, IoRequest)>) -> Vec<IoOutcome> {
        let start = Instant::now();
        let _media = self.media.read();
        let (mut mapped_lpas, mut mapped) = (Vec::new(), Vec::new());
        let mut outcomes = Vec::with_capacity(requests.len());
        let mut pending = Vec::new();
        for (index, request) in requests {
            if let Err(e) = self.check_range(request.offset_bytes, request.buf.len() as u64) {
                outcomes.push((index, Err(e)));
                continue;
            }
            let first = (request.offset_bytes / PAGE) as u32;
            let pages = (request.buf.len() as u64 / PAGE) as u32;
            let lookups: Vec<Option<u32>> = (first..first + pages).map(|lpa| self.ftl.lookup(lpa)).collect();
            for (lpa, ppa) in (first..).zip(&lookups) {
                if let Some(ppa) = ppa {
                    mapped_lpas.push(lpa);
                    mapped.push(*ppa);
                }
            }
            pending.push((index, request, first, lookups));
        }
        let flash = match self.ftl.read_pages(&mapped_lpas, &mapped) {
            Ok(pages) => pages,
            Err(e) => {
                let message = e.to_string();
                outcomes.extend(
                    pending.into_iter().map(|(index, ..)| (index, Err(Error::io("flash read", std::io::Error::other(message.clone()))))),
                );
                return outcomes;
            }
        };
        let mut flash = flash.pages();
        let mut total_pages = 0u64;
        for (index, mut request, first, lookups) in pending {
            for (i, ppa) in lookups.iter().enumerate() {
                let page = &mut request.buf[i * PAGE as usize..(i + 1) * PAGE as usize];
                match ppa {
                    Some(_) => page.copy_from_slice(flash.next().expect("one page per mapped page")),
                    None => page.fill(0),
                }
                let chunks = self.index.chunks(first + i as u32);
                merge(page, &chunks, &mut |chunk, bytes| self.read_log(chunk.pos + ENTRY_HEADER, bytes));
            }
            total_pages += lookups.len() as u64;
            outcomes.push((index, Ok(request.buf)));
        }
        self.counters.block_read_bytes.fetch_add(total_pages * PAGE, Ordering::Relaxed);
        if let Some(model) = self.options.latency {
            settle(start, model.block(false, total_pages));
        }
        outcomes
    }

    /// Block writes into the DRAM cache ([`MssdOptions::block_cache`]): each page one log
    /// entry, which voids the older entries it covers as a block write voids them; the
    /// transfer is charged at the interface's bandwidth, the flash program comes at
    /// cleaning.
    pub(super) fn cache_blocks(&self, requests: Vec<(usize, IoRequest)>, mut done: Vec<IoOutcome>) -> Vec<IoOutcome> {
        let start = Instant::now();
        let mut bytes = 0u64;
        for (index, request) in requests {
            match self.log_entries(0, request.offset_bytes, &request.buf) {
                Ok(_) => {
                    bytes += request.buf.len() as u64;
                    done.push((index, Ok(request.buf)));
                }
                Err(e) => done.push((index, Err(e))),
            }
        }
        self.counters.block_write_bytes.fetch_add(bytes, Ordering::Relaxed);
        if let Some(model) = self.options.latency {
            settle(start, Duration::from_secs_f64(bytes as f64 / model.write_bytes_per_sec));
        }
        done
    }

    pub(super) fn write_blocks(self: &Arc<Inner>, requests: Vec<(usize, IoRequest)>, mut done: Vec<IoOutcome>) -> IoTicket {
        let start = Instant::now();
        let mut accepted = Vec::with_capacity(requests.len());
        for (index, request) in requests {
            match self.check_range(request.offset_bytes, request.buf.len() as u64) {
                Ok(()) => accepted.push((index, request)),
                Err(e) => done.push((index, Err(e))),
            }
        }
        let requests = accepted;
        let lpas: Vec<u32> = requests
            .iter()
            .flat_map(|(_, r)| {
                let first = (r.offset_bytes / PAGE) as u32;
                first..first + (r.buf.len() as u64 / PAGE) as u32
            })
            .collect();
        if self.ftl.needs_collection(lpas.len()) {
            let _media = self.media.write();
            let mut f = self.ftl.state.lock();
            if let Err(e) = self.ftl.collect(&mut f, lpas.len()) {
                tracing::error!("memory-semantic SSD garbage collection failed: {e}");
            }
        }
        let first_seq = self.seq.fetch_add(lpas.len() as u64, Ordering::Relaxed);
        let ppas = match self.ftl.allocate(&mut self.ftl.state.lock(), &lpas, true) {
            Ok(ppas) => ppas,
            Err(_) => {
                done.extend(requests.into_iter().map(|(index, _)| (index, Err(Error::NoSpace))));
                return IoTicket::done(done);
            }
        };
        let (batch, kept) = flash_batch(requests, &ppas);
        let bytes = lpas.len() as u64 * PAGE;
        self.counters.block_write_bytes.fetch_add(bytes, Ordering::Relaxed);
        self.ftl.count_programs(&lpas);
        let inner = Arc::clone(self);
        self.ftl.flash.submit(batch).then(move |outcome| {
            inner.install_written(&lpas, &ppas, first_seq, outcome.is_ok());
            if let Some(model) = inner.options.latency {
                settle(start, inner.write_buffer.write(&model, lpas.len() as u64));
            }
            let mut buffers: Vec<Option<AlignedBuf>> = match outcome {
                Ok(buffers) => buffers.into_iter().map(Some).collect(),
                Err(e) => return Err(e),
            };
            for (index, own, slot) in kept {
                let buf = match own {
                    Some(buf) => buf,
                    None => buffers[slot].take().expect("each passed-through buffer comes back once"),
                };
                done.push((index, Ok(buf)));
            }
            done.sort_unstable_by_key(|(index, _)| *index);
            done.into_iter().map(|(_, outcome)| outcome).collect()
        })
    }

    /// Maps each written page to its new flash page, or, if the write failed, leaves
    /// the page as it was. A page the block interface overwrote drops the log entries
    /// older than the write.
    fn install_written(&self, lpas: &[u32], ppas: &[u32], first_seq: u64, ok: bool) {
        let mut f = self.ftl.state.lock();
        for (i, (&lpa, &ppa)) in lpas.iter().zip(ppas).enumerate() {
            self.ftl.write_done(&mut f, lpa, ppa);
            let version = first_seq + i as u64;
            if !ok {
                self.ftl.discard(&mut f, ppa);
            } else if self.ftl.install(&mut f, lpa, ppa, version) {
                self.index.retain(lpa, |c| c.seq > version);
            }
        }
    }
}

/// A request's buffer, and where it comes back from: its own flash write (`None`, the
/// slot in the batch) or the pieces it was copied into (`Some`, kept here meanwhile).
type Kept = (usize, Option<AlignedBuf>, usize);

/// The flash writes for `requests`, whose pages go to `ppas` in order. Each request's
/// pages went to consecutive flash pages unless an erase block ended inside it; only
/// then is its buffer copied into pieces.
fn flash_batch(requests: Vec<(usize, IoRequest)>, ppas: &[u32]) -> (Vec<IoRequest>, Vec<Kept>) {
    let mut batch = Vec::new();
    let mut kept: Vec<Kept> = Vec::new();
    let mut at = 0;
    for (index, request) in requests {
        let pages = request.buf.len() / PAGE as usize;
        let mine = &ppas[at..at + pages];
        at += pages;
        let pieces = runs(mine);
        if pieces.len() == 1 {
            kept.push((index, None, batch.len()));
            batch.push(IoRequest { op: IoOp::Write, offset_bytes: u64::from(mine[0]) * PAGE, buf: request.buf });
            continue;
        }
        let mut page = 0;
        for run in pieces {
            let mut buf = AlignedBuf::zeroed(run.len() * PAGE as usize);
            buf.copy_from_slice(&request.buf[page * PAGE as usize..(page + run.len()) * PAGE as usize]);
            page += run.len();
            batch.push(IoRequest { op: IoOp::Write, offset_bytes: u64::from(run[0]) * PAGE, buf });
        }
        kept.push((index, Some(request.buf), usize::MAX));
    }
    (batch, kept)
}

impl BlockDevice for MemorySemanticSsd {
    fn len_bytes(&self) -> u64 {
        u64::from(self.inner.layout.logical_pages) * PAGE
    }

    fn submit(&self, batch: Vec<IoRequest>) -> IoTicket {
        let (reads, writes): (Vec<_>, Vec<_>) = batch.into_iter().enumerate().partition(|(_, r)| r.op == IoOp::Read);
        for (_, request) in reads.iter().chain(&writes) {
            request.assert_aligned();
        }
        let done = if reads.is_empty() { Vec::new() } else { self.inner.read_blocks(reads) };
        if writes.is_empty() {
            return IoTicket::done(done);
        }
        if self.inner.options.block_cache {
            return IoTicket::done(self.inner.cache_blocks(writes, done));
        }
        self.inner.write_blocks(writes, done)
    }

    /// A read of any range through the block interface: the device reads the pages it
    /// spans (and merges its log over them), and the latency model charges them as such.
    fn read_buffered(&self, offset_bytes: u64, buf: &mut [u8]) -> Result<()> {
        let start = Instant::now();
        self.inner.read_range(offset_bytes, buf, false)?;
        self.inner.counters.block_read_bytes.fetch_add(buf.len() as u64, Ordering::Relaxed);
        if let Some(model) = self.inner.options.latency {
            let pages = (offset_bytes + buf.len() as u64).div_ceil(PAGE) - offset_bytes / PAGE;
            settle(start, model.block(false, pages));
        }
        Ok(())
    }

    /// Block writes durable: on flash with their map entries persisted, or, cached in the
    /// DRAM, verified.
    fn flush(&self) -> Result<()> {
        if self.inner.options.block_cache {
            self.verify();
        }
        self.inner.ftl.flush(&mut self.inner.ftl.state.lock())
    }

    fn describe(&self) -> String {
        format!(
            "memory-semantic SSD emulator: flash on {}, DRAM on {}, {} MiB write log",
            self.inner.ftl.flash.describe(),
            self.inner.dram.describe(),
            self.inner.layout.log_bytes >> 20
        )
    }
}
