//! Recovery at open, as the firmware does after a power cut: committed log entries
//! replayed onto flash, uncommitted ones dropped, the log emptied.

use super::index::Chunk;
use super::layout::{EntryHeader, EntryKind, Layout};
use super::ByteTier;
use crate::error::Result;

use super::*;

impl Inner {
    /// Rebuild the index from the scanned log, keep what committed and is newer than its
    /// flash page, write it all back, and start with an empty log and TxLogs.
    pub(super) fn recover(&self, mut entries: Vec<(u64, EntryHeader)>) -> Result<MssdRecovery> {
        let mut report = MssdRecovery::default();
        let indexing = std::time::Instant::now();
        // Per page, in store order: a page's entries are independent of other pages'.
        entries.sort_unstable_by_key(|(_, e)| (e.lpa, e.seq));
        {
            let st = self.log.lock();
            let mut f = self.ftl.state.lock();
            for page in entries.chunk_by(|(_, a), (_, b)| a.lpa == b.lpa) {
                let lpa = page[0].1.lpa;
                let mut chunks = Vec::new();
                for &(pos, ref entry) in page {
                    match entry.kind {
                        EntryKind::Pad => {}
                        EntryKind::Trim => {
                            if entry.seq > self.ftl.version(&f, lpa) {
                                chunks.clear();
                                self.ftl.unmap(&mut f, lpa, entry.seq);
                            }
                        }
                        EntryKind::Data if entry.txid != 0 && !st.committed.contains(&entry.txid) => report.dropped_uncommitted += 1,
                        EntryKind::Data if entry.seq <= self.ftl.version(&f, lpa) => report.stale += 1,
                        EntryKind::Data => {
                            report.replayed += 1;
                            chunks.push(Chunk { offset: entry.offset, len: entry.len, pos, seq: entry.seq, txid: 0 });
                        }
                    }
                }
                self.index.insert_page(lpa, chunks);
            }
        }
        report.index_us = u64::try_from(indexing.elapsed().as_micros()).unwrap_or(u64::MAX);
        self.clean_log(false)?;
        let mut st = self.log.lock();
        // Whole: a crash while a cleaning zeroed one can leave stale TxIDs past a zero.
        for which in 0..2 {
            let (at, len) = self.layout.txlog_range(which);
            self.dram.zero(at, len as usize);
            self.dram.persist(at, len as usize);
            st.txlogs[which].clear();
        }
        st.committed.clear();
        st.residual = st.used();
        Ok(report)
    }
}

pub(super) fn read_txlog(layout: &Layout, dram: &dyn ByteTier, which: usize) -> Vec<u32> {
    let (at, len) = layout.txlog_range(which);
    let mut raw = vec![0u8; len as usize];
    dram.read(at, &mut raw);
    raw.chunks_exact(4).map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes"))).take_while(|&t| t != 0).collect()
}

/// The entries from `head` up to the first position that holds no valid entry of this lap.
pub(super) fn scan(layout: &Layout, dram: &dyn ByteTier, head: u64) -> (Vec<(u64, EntryHeader)>, u64) {
    let mut entries = Vec::new();
    let mut pos = head;
    let mut read = |at: u64, out: &mut [u8]| read_log(layout, dram, at, out);
    while pos - head < layout.log_bytes {
        let room = layout.log_bytes - pos % layout.log_bytes;
        let Some(entry) = EntryHeader::decode(pos, layout.incarnation, room, &mut read) else { break };
        if entry.kind == EntryKind::Pad {
            pos += room;
            continue;
        }
        entries.push((pos, entry));
        pos += EntryHeader::footprint(usize::from(entry.len));
    }
    (entries, pos)
}
