//! The redo log: records appended at `head`, each `[header 24 B][payload][padding]`,
//! padded to the medium's write unit (8 B in persistent memory, a sector on an SSD).
//!
//! Header: magic u32 | seq u64 | payload_len u32 | payload_crc u32 | header_crc u32 (of the
//! first 20 bytes). Sequence numbers continue across checkpoints; after one the log
//! restarts at offset 0 and older records (smaller seq) stop being valid, so it never
//! needs erasing.

use super::MetaMedium;
use crate::codec::{crc32c, Decoder, Encoder};
use crate::error::{Error, Result};

const MAGIC: u32 = u32::from_le_bytes(*b"AJRN");
pub const HEADER_BYTES: u64 = 24;

/// Bytes a record with `len` payload bytes takes on a medium writing `unit`-sized units.
fn padded(len: u64, unit: u64) -> u64 {
    (HEADER_BYTES + len).div_ceil(unit) * unit
}

pub struct Journal {
    medium: Box<dyn MetaMedium>,
    /// The medium's write unit: every record starts on its boundary.
    unit: u64,
    head: u64,
    next_seq: u64,
}

/// What replay found.
pub struct Replay {
    /// (offset in the log, payload) of each valid record, in order.
    pub payloads: Vec<(u64, Vec<u8>)>,
    /// Where the next record goes.
    pub end: u64,
    pub next_seq: u64,
    /// Offset of a torn (unacknowledged, partly written) last record that was dropped.
    pub torn_tail: Option<u64>,
}

struct Header {
    seq: u64,
    len: u64,
    crc: u32,
}

impl Journal {
    /// Continue appending at `head` with sequence number `next_seq` (from [`Journal::replay`]).
    pub fn resume(medium: Box<dyn MetaMedium>, head: u64, next_seq: u64) -> Journal {
        let unit = unit_of(medium.as_ref());
        debug_assert!(head % unit == 0, "a record starts on a write unit");
        Journal { medium, unit, head, next_seq }
    }

    pub fn used_bytes(&self) -> u64 {
        self.head
    }

    pub fn capacity_bytes(&self) -> u64 {
        self.medium.len_bytes()
    }

    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Whether a record with this payload length could ever fit (in an empty log), with
    /// `reserve` bytes kept free.
    pub fn fits_when_empty(&self, payload_len: usize, reserve: u64) -> bool {
        padded(payload_len as u64, self.unit) + reserve <= self.capacity_bytes()
    }

    /// Append one record and make it durable, leaving the last `reserve` bytes free.
    /// `Ok(false)` if it does not fit (take a checkpoint and retry).
    pub fn append(&mut self, payload: &[u8], reserve: u64) -> Result<bool> {
        let size = padded(payload.len() as u64, self.unit);
        if self.head + size + reserve > self.capacity_bytes() {
            return Ok(false);
        }
        let mut e = Encoder::with_capacity(size as usize);
        e.u32(MAGIC).u64(self.next_seq).u32(payload.len() as u32).u32(crc32c(payload));
        let header_crc = crc32c(&e.bytes);
        e.u32(header_crc).raw(payload);
        e.bytes.resize(size as usize, 0);
        self.medium.write_durable(self.head, &e.bytes)?;
        self.head += size;
        self.next_seq += 1;
        Ok(true)
    }

    /// Start over at offset 0 after a checkpoint that covers everything up to `next_seq`.
    pub fn reset(&mut self, next_seq: u64) {
        self.head = 0;
        self.next_seq = next_seq;
    }

    fn header_at(medium: &dyn MetaMedium, at: u64) -> Option<Header> {
        if at + HEADER_BYTES > medium.len_bytes() {
            return None;
        }
        let mut raw = [0u8; HEADER_BYTES as usize];
        medium.read(at, &mut raw);
        let mut d = Decoder::new(&raw);
        let (magic, seq, len, crc) = (d.u32().ok()?, d.u64().ok()?, d.u32().ok()?, d.u32().ok()?);
        let header_crc = d.u32().ok()?;
        let len = u64::from(len);
        let valid = magic == MAGIC && header_crc == crc32c(&raw[..20]) && at + padded(len, unit_of(medium)) <= medium.len_bytes();
        valid.then_some(Header { seq, len, crc })
    }

    /// Is there a valid record with a sequence number ≥ `seq` anywhere after `from`?
    /// (Then the bad record before it was acknowledged once: corruption, not a torn tail.)
    fn later_record(medium: &dyn MetaMedium, from: u64, seq: u64) -> Option<u64> {
        let unit = unit_of(medium);
        let mut at = from.div_ceil(unit) * unit;
        while at + HEADER_BYTES <= medium.len_bytes() {
            if let Some(h) = Self::header_at(medium, at) {
                if h.seq >= seq {
                    return Some(at);
                }
            }
            at += unit;
        }
        None
    }

    /// Read every valid record from offset 0, starting at sequence number `first_seq`.
    ///
    /// The log ends at the first place that does not hold the next record: zeros, or a
    /// valid record with an older sequence number (left from before the last checkpoint).
    /// A damaged record there (bad header checksum, or the right header with a bad payload)
    /// is a torn, never-acknowledged tail, unless a valid later record follows: then a
    /// record that was once complete has been damaged, and replay refuses.
    pub fn replay(medium: &dyn MetaMedium, first_seq: u64, name: &str) -> Result<Replay> {
        let mut replay = Replay { payloads: Vec::new(), end: 0, next_seq: first_seq, torn_tail: None };
        loop {
            let at = replay.end;
            let damaged = match Self::header_at(medium, at) {
                Some(h) if h.seq == replay.next_seq => {
                    let mut payload = vec![0u8; h.len as usize];
                    medium.read(at + HEADER_BYTES, &mut payload);
                    if crc32c(&payload) == h.crc {
                        replay.payloads.push((at, payload));
                        replay.end += padded(h.len, unit_of(medium));
                        replay.next_seq += 1;
                        continue;
                    }
                    true
                }
                Some(_) => false,
                None => {
                    let mut magic = [0u8; 4];
                    if at + 4 <= medium.len_bytes() {
                        medium.read(at, &mut magic);
                    }
                    u32::from_le_bytes(magic) == MAGIC
                }
            };
            if damaged {
                if let Some(later) = Self::later_record(medium, at + 1, replay.next_seq + 1) {
                    return Err(Error::corrupt(
                        "journal record",
                        name,
                        at,
                        format!("record seq {} is damaged but a later record follows at {later}", replay.next_seq),
                    ));
                }
                replay.torn_tail = Some(at);
            }
            return Ok(replay);
        }
    }
}

/// Records are at least 8-byte aligned, whatever the medium.
fn unit_of(medium: &dyn MetaMedium) -> u64 {
    medium.write_unit().max(8)
}

#[cfg(test)]
mod tests {
    use super::*;
    use parking_lot::Mutex;
    use std::sync::Arc;

    #[derive(Clone)]
    struct Mem(Arc<Mutex<Vec<u8>>>);
    impl MetaMedium for Mem {
        fn len_bytes(&self) -> u64 {
            self.0.lock().len() as u64
        }
        fn write_unit(&self) -> u64 {
            8
        }
        fn read(&self, offset: u64, out: &mut [u8]) {
            out.copy_from_slice(&self.0.lock()[offset as usize..offset as usize + out.len()]);
        }
        fn write_durable(&self, offset: u64, data: &[u8]) -> Result<()> {
            self.0.lock()[offset as usize..offset as usize + data.len()].copy_from_slice(data);
            Ok(())
        }
    }

    fn filled(n: u64) -> (Mem, Vec<u64>) {
        let mem = Mem(Arc::new(Mutex::new(vec![0; 4096])));
        let mut j = Journal::resume(Box::new(mem.clone()), 0, 10);
        let mut offsets = Vec::new();
        for i in 0..n {
            offsets.push(j.used_bytes());
            assert!(j.append(&vec![i as u8; 10 + i as usize], 0).unwrap());
        }
        (mem, offsets)
    }

    #[test]
    fn replay_returns_what_was_appended() {
        let (mem, _) = filled(5);
        let r = Journal::replay(&mem, 10, "j").unwrap();
        assert_eq!(r.payloads.len(), 5);
        assert_eq!(r.next_seq, 15);
        assert_eq!(r.payloads[3].1, vec![3u8; 13]);
        assert!(r.torn_tail.is_none());
        // After a checkpoint at seq 15 the log restarts at offset 0: the old records there
        // are a clean end, not damage.
        let r = Journal::replay(&mem, 15, "j").unwrap();
        assert!(r.payloads.is_empty() && r.torn_tail.is_none());
        let mut j = Journal::resume(Box::new(mem.clone()), 0, 15);
        assert!(j.append(b"new round", 0).unwrap());
        let r = Journal::replay(&mem, 15, "j").unwrap();
        assert_eq!(r.payloads.len(), 1);
        assert!(r.torn_tail.is_none());
    }

    #[test]
    fn torn_tail_is_dropped_but_middle_damage_is_an_error() {
        let (mem, offsets) = filled(4);
        // Damage the last record's payload: a torn, never-acknowledged tail.
        mem.0.lock()[offsets[3] as usize + 30] ^= 1;
        let r = Journal::replay(&mem, 10, "j").unwrap();
        assert_eq!(r.payloads.len(), 3);
        assert_eq!(r.torn_tail, Some(offsets[3]));
        // Damage a middle record: corruption, named with its offset.
        let (mem, offsets) = filled(4);
        mem.0.lock()[offsets[1] as usize + 30] ^= 1;
        match Journal::replay(&mem, 10, "j") {
            Err(Error::Corrupt { structure: "journal record", offset, .. }) => assert_eq!(offset, offsets[1]),
            other => panic!("{:?}", other.map(|r| r.payloads.len())),
        }
        // Damage a middle record's header (its length): still found.
        let (mem, offsets) = filled(4);
        mem.0.lock()[offsets[1] as usize + 12] ^= 0x40;
        assert!(Journal::replay(&mem, 10, "j").is_err());
    }

    #[test]
    fn full_log_says_so() {
        let mem = Mem(Arc::new(Mutex::new(vec![0; 256])));
        let mut j = Journal::resume(Box::new(mem), 0, 1);
        let mut n = 0;
        while j.append(&[0; 40], 0).unwrap() {
            n += 1;
        }
        assert_eq!(n, 256 / 64);
        j.reset(j.next_seq());
        assert!(j.append(&[0; 40], 0).unwrap());
    }
}
