//! Metadata on an SSD, for profiles without persistent memory (`scrap`; docs/SCRAP.md).
//!
//! The window is mirrored in memory, read once at open. Reads never touch the device, and
//! a write covering part of a sector rewrites that whole sector from the mirror, with no
//! read before the write. `write_durable` writes the sectors, then flushes the device's
//! cache, so it returns only when the bytes are on the flash. A sector is the unit the
//! device may tear at. The journal starts every record on a fresh sector
//! ([`MetaMedium::write_unit`]), so an append never rewrites a sector that holds an
//! acknowledged record.
//!
//! On a memory-semantic SSD (`byte`) a page program is atomic (the FTL maps the old page
//! or the new one), so records start on 64-byte lines, and with its byte interface on, a
//! write of less than a sector goes as cache-line stores made durable by one write-verify
//! read, not as a sector write and a flush.

use std::sync::Arc;

use parking_lot::Mutex;

use super::MetaMedium;
use crate::device::mssd::{MemorySemanticSsd, LINE};
use crate::device::{run_batch, AlignedBuf, BlockDevice, IoOp, IoRequest};
use crate::error::Result;
use crate::geometry::IO_ALIGN;

const SECTOR: u64 = IO_ALIGN as u64;

pub struct SsdWindow {
    device: Arc<dyn BlockDevice>,
    offset: u64,
    len: u64,
    mirror: Mutex<Vec<u8>>,
    /// `SECTOR`, except on a memory-semantic SSD (a line) and in the test that shows why
    /// it must be a sector elsewhere.
    unit: u64,
    /// The byte interface small writes go through.
    byte: Option<Arc<MemorySemanticSsd>>,
}

impl SsdWindow {
    /// The `len` bytes at `offset` of `device` (both whole sectors), read into memory.
    pub fn open(device: Arc<dyn BlockDevice>, offset: u64, len: u64) -> Result<SsdWindow> {
        assert!(offset % SECTOR == 0 && len % SECTOR == 0 && len > 0, "an SSD window covers whole sectors");
        assert!(offset + len <= device.len_bytes(), "the window lies inside the device");
        let mut mirror = vec![0u8; len as usize];
        // Read in pieces, so a large window needs no single huge buffer.
        const PIECE: u64 = 1 << 20;
        let mut at = 0;
        while at < len {
            let n = PIECE.min(len - at);
            let request = IoRequest { op: IoOp::Read, offset_bytes: offset + at, buf: AlignedBuf::zeroed(n as usize) };
            let buf = run_batch(device.as_ref(), vec![request])?.pop().expect("one buffer per request");
            mirror[at as usize..(at + n) as usize].copy_from_slice(&buf);
            at += n;
        }
        Ok(SsdWindow { device, offset, len, mirror: Mutex::new(mirror), unit: SECTOR, byte: None })
    }

    /// The window on a memory-semantic SSD (`device` is its block interface), writing
    /// through `byte` when given.
    pub fn on_memory_semantic(
        device: Arc<dyn BlockDevice>,
        byte: Option<Arc<MemorySemanticSsd>>,
        offset: u64,
        len: u64,
    ) -> Result<SsdWindow> {
        Ok(SsdWindow { unit: LINE, byte, ..SsdWindow::open(device, offset, len)? })
    }
}

impl MetaMedium for SsdWindow {
    fn len_bytes(&self) -> u64 {
        self.len
    }

    fn write_unit(&self) -> u64 {
        self.unit
    }

    fn read(&self, offset: u64, out: &mut [u8]) {
        let mirror = self.mirror.lock();
        out.copy_from_slice(&mirror[offset as usize..offset as usize + out.len()]);
    }

    fn write_durable(&self, offset: u64, data: &[u8]) -> Result<()> {
        // Held across the IO: writes to one window are ordered, and a sector is never
        // written from a mirror another writer is changing.
        let mut mirror = self.mirror.lock();
        let end = offset + data.len() as u64;
        assert!(end <= self.len, "write inside the window");
        mirror[offset as usize..end as usize].copy_from_slice(data);
        if let Some(byte) = self.byte.as_ref().filter(|_| data.len() < SECTOR as usize) {
            byte.store(None, self.offset + offset, data)?;
            return byte.verify_posted();
        }
        let (first, last) = (offset / SECTOR * SECTOR, end.div_ceil(SECTOR) * SECTOR);
        let mut buf = AlignedBuf::zeroed((last - first) as usize);
        buf.copy_from_slice(&mirror[first as usize..last as usize]);
        run_batch(self.device.as_ref(), vec![IoRequest { op: IoOp::Write, offset_bytes: self.offset + first, buf }])?;
        if self.device.needs_flush() {
            self.device.flush()?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::power_loss::{PowerLog, RecordedSsd, Replay, Survival};
    use crate::device::{FaultPlan, FaultyDevice, SimSsd};
    use crate::journal::{CheckpointSlots, Journal};
    use crate::test_support::seed;
    use rand::rngs::StdRng;
    use rand::{Rng, RngCore, SeedableRng};

    const DEVICE: u64 = 512 * 1024;
    const WINDOW: u64 = 480 * 1024;
    // The window sits past the first sectors, as it will behind a superblock.
    const AT: u64 = 16 * 1024;

    fn window_on(device: Arc<dyn BlockDevice>) -> SsdWindow {
        SsdWindow::open(device, AT, WINDOW).unwrap()
    }

    #[test]
    fn reads_what_was_written_after_reopening() {
        let ssd: Arc<dyn BlockDevice> = Arc::new(SimSsd::new(DEVICE));
        let w = window_on(Arc::clone(&ssd));
        w.write_durable(100, b"first").unwrap();
        w.write_durable(4090, b"across a sector boundary").unwrap();
        let again = window_on(ssd);
        let mut out = [0u8; 24];
        again.read(4090, &mut out);
        assert_eq!(&out, b"across a sector boundary");
        let mut out = [0u8; 5];
        again.read(100, &mut out);
        assert_eq!(&out, b"first");
    }

    #[test]
    fn a_failed_write_or_flush_is_an_error() {
        let plan = Arc::new(FaultPlan::default());
        let w = window_on(Arc::new(FaultyDevice::new(Arc::new(SimSsd::new(DEVICE)), plan.clone())));
        plan.arm("write=1").unwrap();
        assert!(w.write_durable(0, b"x").is_err());
        plan.arm("flush=1").unwrap();
        assert!(w.write_durable(0, b"x").is_err());
        w.write_durable(0, b"x").unwrap();
    }

    /// Append records to a journal on a recorded SSD; at every point a power cut could
    /// hit, replay each crash image. Returns how many images lost an acknowledged record
    /// or failed to replay.
    fn journal_crash_images(unit: u64, seed: u64) -> (usize, usize) {
        let mut rng = StdRng::seed_from_u64(seed);
        let log = PowerLog::new();
        let ssd: Arc<dyn BlockDevice> = Arc::new(RecordedSsd::new(Arc::new(SimSsd::new(DEVICE)), Arc::clone(&log)));
        let mut window = window_on(Arc::clone(&ssd));
        window.unit = unit;
        let mut journal = Journal::resume(Box::new(window), 0, 1);
        let mut records = Vec::new();
        // The log position when each append returned: from there on it is acknowledged.
        let mut acknowledged_at = Vec::new();
        for _ in 0..40 {
            let mut payload = vec![0u8; rng.random_range(1..6000)];
            rng.fill_bytes(&mut payload);
            if !journal.append(&payload, 0).unwrap() {
                break;
            }
            records.push(payload);
            acknowledged_at.push(log.position());
        }
        let events = log.events();
        let mut replay = Replay::new(0, DEVICE);
        let (mut images, mut bad) = (0, 0);
        for (i, event) in events.iter().enumerate() {
            if event.is_persistence_point() || i + 1 == events.len() {
                for survival in [0.0, 1.0, 0.5] {
                    let image = replay.image(Survival { fast_word: 0.0, ssd_sector: survival }, &mut |p| rng.random_bool(p));
                    images += 1;
                    let medium = SsdWindow::open(Arc::new(SimSsd::with_contents(image.ssd)), AT, WINDOW).unwrap();
                    let acknowledged = acknowledged_at.iter().filter(|&&at| at <= replay.position()).count();
                    let ok = match Journal::replay(&medium, 1, "journal") {
                        Ok(r) => {
                            r.payloads.len() >= acknowledged
                                && r.payloads.len() <= acknowledged + 1
                                && r.payloads.iter().zip(&records).all(|((_, got), want)| got == want)
                        }
                        Err(_) => false,
                    };
                    bad += usize::from(!ok);
                }
            }
            replay.apply(event);
        }
        (images, bad)
    }

    #[test]
    fn a_power_cut_never_loses_an_acknowledged_journal_record() {
        let (images, bad) = journal_crash_images(SECTOR, seed("ssd_window::journal_power_cut"));
        assert!(images > 100, "{images} crash images");
        assert_eq!(bad, 0, "{bad} of {images} crash images lost an acknowledged record");
    }

    /// Why records start on a fresh sector: packed 8-byte-aligned, an append rewrites the
    /// sector holding the previous record, and a power cut during that rewrite tears it.
    #[test]
    fn packed_records_would_lose_acknowledged_ones() {
        let (images, bad) = journal_crash_images(8, seed("ssd_window::packed_records"));
        assert!(bad > 0, "packed records survived all {images} images: the crash test would not catch the bug");
    }

    #[test]
    fn a_power_cut_during_a_checkpoint_keeps_the_newest_complete_one() {
        let mut rng = StdRng::seed_from_u64(seed("ssd_window::checkpoint_power_cut"));
        let log = PowerLog::new();
        let ssd: Arc<dyn BlockDevice> = Arc::new(RecordedSsd::new(Arc::new(SimSsd::new(DEVICE)), Arc::clone(&log)));
        let half = WINDOW / 2;
        let slots = |ssd: Arc<dyn BlockDevice>| {
            let a = SsdWindow::open(Arc::clone(&ssd), AT, half).unwrap();
            let b = SsdWindow::open(ssd, AT + half, half).unwrap();
            CheckpointSlots::new(Box::new(a), Box::new(b), [AT, AT + half], "ssd".into())
        };
        let mut live = slots(Arc::clone(&ssd));
        live.clear().unwrap();
        let state = |generation: u64| {
            let state = crate::meta::MetaState::fresh(0, 0, 0);
            state.next_ino.store(1000 + generation, std::sync::atomic::Ordering::SeqCst);
            crate::journal::checkpoint_payload(&state, &[generation], &crate::journal::AsIs)
        };
        let cleared_at = log.position();
        let mut written_at = Vec::new();
        for generation in 1..=6u64 {
            live.write(&state(generation), generation * 10).unwrap();
            written_at.push(log.position());
        }
        let events = log.events();
        let mut replay = Replay::new(0, DEVICE);
        let mut images = 0;
        for (i, event) in events.iter().enumerate() {
            if replay.position() >= cleared_at && (event.is_persistence_point() || i + 1 == events.len()) {
                for survival in [0.0, 1.0, 0.5] {
                    let image = replay.image(Survival { fast_word: 0.0, ssd_sector: survival }, &mut |p| rng.random_bool(p));
                    let done = written_at.iter().filter(|&&at| at <= replay.position()).count() as u64;
                    let mut reopened = slots(Arc::new(SimSsd::with_contents(image.ssd)));
                    match reopened.load(8, 4096) {
                        Ok(loaded) => {
                            assert!(
                                loaded.generation >= done && loaded.generation <= done + 1,
                                "generation {} after {done}",
                                loaded.generation
                            );
                            assert_eq!(loaded.counters, vec![loaded.generation]);
                            assert_eq!(loaded.next_seq, loaded.generation * 10);
                        }
                        Err(e) => assert_eq!(done, 0, "a completed checkpoint was lost: {e}"),
                    }
                    images += 1;
                }
            }
            replay.apply(event);
        }
        assert!(images > 30, "{images} crash images");
    }
}
