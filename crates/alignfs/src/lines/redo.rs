//! Block-only commits (`--no-byte-interface`): changed sectors to the redo area under a
//! checksummed header, then in place, each step flushed; a writable open replays a valid
//! redo area.

use std::collections::BTreeSet;

pub use records::LINE;

use crate::codec::{crc32c, Decoder, Encoder};
use crate::device::{run_batch, AlignedBuf, IoOp, IoRequest};
use crate::error::{Error, Result};
use crate::stats::Counter;

use super::*;

impl LineStore {
    /// Make the dirty lines durable as one atomic unit.
    pub(super) fn persist(&mut self, stats: Option<&crate::stats::Stats>) -> Result<()> {
        if self.dirty.is_empty() {
            return Ok(());
        }
        let dirty = std::mem::take(&mut self.dirty);
        if let Some(stats) = stats {
            stats.add(Counter::meta_lines_stored, dirty.len() as u64);
            stats.add(Counter::meta_transactions, 1);
        }
        match &self.byte {
            Some(byte) => {
                let tx = byte.begin();
                let lines: Vec<u64> = dirty.into_iter().collect();
                for run in lines.chunk_by(|a, b| b - a == 1) {
                    let (first, n) = (run[0] as usize, run.len());
                    byte.store(Some(tx), self.base + (first * LINE) as u64, &self.mirror[first * LINE..(first + n) * LINE])?;
                }
                byte.commit(tx)
            }
            None => {
                let sectors: BTreeSet<u64> = dirty.iter().map(|l| l / LINES_PER_SECTOR).collect();
                self.write_through_redo(&sectors.into_iter().collect::<Vec<_>>())
            }
        }
    }

    /// Block-only: `sectors` of the area to the redo area, then in place.
    pub(super) fn write_through_redo(&self, sectors: &[u64]) -> Result<()> {
        let room = ((self.redo.1 as usize / SECTOR) - 1).min((SECTOR - REDO_HEADER_BYTES) / 4);
        if sectors.len() > room {
            return Err(Error::MetadataFull(format!(
                "one metadata commit changes {} sectors; the block-only redo area holds {room}",
                sectors.len()
            )));
        }
        let mut images = AlignedBuf::zeroed((sectors.len() + 1) * SECTOR);
        for (i, &s) in sectors.iter().enumerate() {
            images[(i + 1) * SECTOR..(i + 2) * SECTOR].copy_from_slice(&self.mirror[s as usize * SECTOR..(s as usize + 1) * SECTOR]);
        }
        let mut e = Encoder::new();
        e.raw(REDO_MAGIC).raw(&self.uuid).u32(sectors.len() as u32).u32(crc32c(&images[SECTOR..]));
        let mut list = Encoder::new();
        for &s in sectors {
            list.u32(s as u32);
        }
        let crc = redo_header_crc(&e.bytes, &list.bytes);
        e.u32(crc).raw(&list.bytes);
        images[..e.bytes.len()].copy_from_slice(&e.bytes);
        run_batch(self.ssd.as_ref(), vec![IoRequest { op: IoOp::Write, offset_bytes: self.redo.0, buf: images }])?;
        self.ssd.flush()?;
        self.write_in_place(sectors)
    }

    pub(super) fn write_in_place(&self, sectors: &[u64]) -> Result<()> {
        let writes = sectors
            .chunk_by(|a, b| b - a == 1)
            .map(|run| IoRequest {
                op: IoOp::Write,
                offset_bytes: self.base + run[0] * SECTOR as u64,
                buf: self.sectors_from_mirror(run[0], run[run.len() - 1] + 1),
            })
            .collect();
        run_batch(self.ssd.as_ref(), writes)?;
        self.ssd.flush()
    }

    /// Lay a valid redo area over the mirror; unless `read_only`, write it in place and
    /// clear it. Returns the sectors it held (none if there was no valid one).
    pub(super) fn replay_redo(&mut self, read_only: bool) -> Result<BTreeSet<u64>> {
        let request = IoRequest { op: IoOp::Read, offset_bytes: self.redo.0, buf: AlignedBuf::zeroed(SECTOR) };
        let head = run_batch(self.ssd.as_ref(), vec![request])?.pop().expect("one buffer per request");
        let mut d = Decoder::new(&head);
        let parsed = (|| {
            let (magic, uuid, count, images_crc) = (d.take(8)?, d.take(16)?, d.u32()? as usize, d.u32()?);
            let fields = d.position();
            let crc = d.u32()?;
            let list = d.position();
            let sectors = (0..count).map(|_| d.u32().map(u64::from)).collect::<Result<Vec<_>, _>>()?;
            let valid = magic == REDO_MAGIC && uuid == self.uuid && crc == redo_header_crc(&head[..fields], &head[list..d.position()]);
            Ok::<_, crate::codec::Short>(valid.then_some((sectors, images_crc)))
        })();
        let Ok(Some((sectors, images_crc))) = parsed else { return Ok(BTreeSet::new()) };
        let area_sectors = self.mirror.len() as u64 / SECTOR as u64;
        if sectors.is_empty() || sectors.iter().any(|&s| s >= area_sectors) || (sectors.len() + 1) * SECTOR > self.redo.1 as usize {
            return Ok(BTreeSet::new());
        }
        let request =
            IoRequest { op: IoOp::Read, offset_bytes: self.redo.0 + SECTOR as u64, buf: AlignedBuf::zeroed(sectors.len() * SECTOR) };
        let images = run_batch(self.ssd.as_ref(), vec![request])?.pop().expect("one buffer per request");
        if crc32c(&images) != images_crc {
            // Torn while being written: its commit never reached the area.
            return Ok(BTreeSet::new());
        }
        for (i, &s) in sectors.iter().enumerate() {
            self.mirror[s as usize * SECTOR..(s as usize + 1) * SECTOR].copy_from_slice(&images[i * SECTOR..(i + 1) * SECTOR]);
        }
        if !read_only {
            self.write_in_place(&sectors)?;
            self.clear_redo()?;
        }
        Ok(sectors.into_iter().collect())
    }

    pub(super) fn clear_redo(&self) -> Result<()> {
        run_batch(self.ssd.as_ref(), vec![IoRequest { op: IoOp::Write, offset_bytes: self.redo.0, buf: AlignedBuf::zeroed(SECTOR) }])?;
        self.ssd.flush()
    }
}

/// The redo header's checksum covers its fields and the sector list: a header sector torn
/// past its first 512 bytes must not pair a new count with an old commit's list.
pub(super) fn redo_header_crc(fields: &[u8], list: &[u8]) -> u32 {
    crc32c(&[fields, list].concat())
}
