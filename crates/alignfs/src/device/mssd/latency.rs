//! An optional timing model of the device, with the ByteFS paper's emulator settings
//! (its Table 4). Off by default: the flash image then runs at the speed of the disk
//! under it. On, each operation takes at least the modelled time (the real IO counts
//! toward it), so a byte-interface store is cheaper than a 4 KiB block write by what the
//! paper measured rather than by what this machine's page cache happens to do.

use std::time::{Duration, Instant};

use super::layout::{LINE, PAGE};
use crate::error::{Error, Result};

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LatencyModel {
    pub flash_read: Duration,
    pub flash_write: Duration,
    /// Flash channels working in parallel.
    pub channels: u32,
    pub read_bytes_per_sec: f64,
    pub write_bytes_per_sec: f64,
    /// A cache-line load over PCIe (a non-posted read: a round trip).
    pub line_read: Duration,
    /// A cache-line store (posted).
    pub line_write: Duration,
    /// An FTL write buffer for block writes (ByteFS's prototype has 16 MB, §5.1): a
    /// block write is acknowledged once transferred into it and programmed while later
    /// requests run, so it waits for the flash only when the buffer is full. 0, Table 4's
    /// emulated device, makes every block write wait for its program.
    pub write_buffer_bytes: u64,
}

impl LatencyModel {
    /// Table 4 of the ByteFS paper: 40/60 µs flash reads/writes, 8 channels,
    /// 3.5/2.5 GB/s, 4.8/0.6 µs cache-line reads/writes.
    pub fn bytefs_table4() -> LatencyModel {
        LatencyModel {
            flash_read: Duration::from_micros(40),
            flash_write: Duration::from_micros(60),
            channels: 8,
            read_bytes_per_sec: 3.5e9,
            write_bytes_per_sec: 2.5e9,
            line_read: Duration::from_nanos(4800),
            line_write: Duration::from_nanos(600),
            write_buffer_bytes: 0,
        }
    }

    /// Table 4 with its flash read and program latencies times `scale`, 0.01–100 (ByteFS's
    /// sensitivity runs vary them; the bus and the bandwidth stay).
    pub fn bytefs_table4_flash_scaled(scale: f64) -> Result<LatencyModel> {
        if !(0.01..=100.0).contains(&scale) {
            return Err(Error::InvalidArgument(format!("a flash latency scale of {scale}: use 0.01–100 (1 is Table 4's)")));
        }
        let table = LatencyModel::bytefs_table4();
        Ok(LatencyModel { flash_read: table.flash_read.mul_f64(scale), flash_write: table.flash_write.mul_f64(scale), ..table })
    }

    /// A block-interface transfer of `pages` pages: the flash latency per round of the
    /// channels, or the bandwidth, whichever is slower.
    pub fn block(&self, write: bool, pages: u64) -> Duration {
        let (latency, rate) = if write { (self.flash_write, self.write_bytes_per_sec) } else { (self.flash_read, self.read_bytes_per_sec) };
        let rounds = pages.div_ceil(u64::from(self.channels.max(1))) as u32;
        let transfer = Duration::from_secs_f64((pages * PAGE) as f64 / rate);
        (latency * rounds).max(transfer)
    }

    /// Bytes per second the channels program together.
    fn program_bytes_per_sec(&self) -> f64 {
        let per_round = f64::from(self.channels.max(1)) * PAGE as f64 / self.flash_write.as_secs_f64();
        per_round.min(self.write_bytes_per_sec)
    }

    /// Stores of `bytes` through the byte interface.
    pub fn store(&self, bytes: u64) -> Duration {
        self.line_write * bytes.div_ceil(LINE) as u32
    }

    /// The zero-byte write-verify read that makes posted stores durable.
    pub fn verify(&self) -> Duration {
        self.line_read
    }

    /// Loads of `bytes` through the byte interface, one round trip per line.
    pub fn load(&self, bytes: u64) -> Duration {
        self.line_read * bytes.div_ceil(LINE) as u32
    }
}

/// The modelled fill of the FTL's write buffer: block writes add to it, the flash
/// drains it at its program rate.
#[derive(Debug)]
pub(super) struct WriteBuffer {
    fill: parking_lot::Mutex<Fill>,
}

#[derive(Debug)]
struct Fill {
    /// Bytes waiting for their program at `at`.
    bytes: f64,
    at: Instant,
}

impl WriteBuffer {
    pub fn new() -> WriteBuffer {
        WriteBuffer { fill: parking_lot::Mutex::new(Fill { bytes: 0.0, at: Instant::now() }) }
    }

    /// The time a block write of `pages` takes under `model`: with no buffer, the program
    /// itself ([`LatencyModel::block`]); with one, the transfer, plus the wait for the
    /// flash to drain what does not fit.
    pub fn write(&self, model: &LatencyModel, pages: u64) -> Duration {
        if model.write_buffer_bytes == 0 {
            return model.block(true, pages);
        }
        let bytes = (pages * PAGE) as f64;
        let drain = model.program_bytes_per_sec();
        let capacity = model.write_buffer_bytes as f64;
        let mut fill = self.fill.lock();
        let now = Instant::now();
        let held = (fill.bytes - now.duration_since(fill.at).as_secs_f64() * drain).max(0.0);
        let overflow = (held + bytes - capacity).max(0.0);
        *fill = Fill { bytes: held + bytes, at: now };
        Duration::from_secs_f64(bytes / model.write_bytes_per_sec + overflow / drain)
    }
}

/// Wait until `start + model` has passed: sleep for the bulk, spin for the last stretch
/// (a sleep overshoots by tens of microseconds, as long as a whole modelled store).
pub fn settle(start: Instant, model: Duration) {
    let deadline = start + model;
    loop {
        let now = Instant::now();
        if now >= deadline {
            return;
        }
        let left = deadline - now;
        if left > Duration::from_micros(200) {
            std::thread::sleep(left - Duration::from_micros(100));
        } else {
            std::hint::spin_loop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table4_prices_a_line_below_a_page() {
        let model = LatencyModel::bytefs_table4();
        assert_eq!(model.store(64) + model.verify(), Duration::from_nanos(5400));
        assert_eq!(model.block(true, 1), Duration::from_micros(60));
        assert_eq!(model.block(true, 8), Duration::from_micros(60), "eight channels in parallel");
        assert_eq!(model.block(true, 9), Duration::from_micros(120));
        assert!(model.block(false, 4096) > Duration::from_millis(4), "bandwidth bounds large reads");
    }

    #[test]
    fn the_write_buffer_absorbs_bursts_and_then_charges_the_flash() {
        let model = LatencyModel { write_buffer_bytes: 16 << 20, ..LatencyModel::bytefs_table4() };
        let buffer = WriteBuffer::new();
        // 8 channels x 4 KiB per 60 µs: about 546 MB/s of programs.
        let first = buffer.write(&model, 1);
        assert!(first < Duration::from_micros(2), "one page is a transfer into the buffer: {first:?}");
        let fill = model.write_buffer_bytes / PAGE;
        let filled = buffer.write(&model, fill);
        let program = model.block(true, fill);
        assert!(filled < program, "a burst as large as the buffer waits at most for the page over it: {filled:?}");
        let over = buffer.write(&model, 1024);
        assert!(over >= model.block(true, 1024).mul_f64(0.9), "a full buffer waits for the flash: {over:?}");
        let unbuffered = LatencyModel { write_buffer_bytes: 0, ..model };
        assert_eq!(WriteBuffer::new().write(&unbuffered, 8), Duration::from_micros(60));
    }

    #[test]
    fn a_flash_scale_changes_the_flash_alone_and_refuses_nonsense() {
        let half = LatencyModel::bytefs_table4_flash_scaled(0.5).unwrap();
        let table = LatencyModel::bytefs_table4();
        assert_eq!((half.flash_read, half.flash_write), (table.flash_read / 2, table.flash_write / 2));
        assert_eq!((half.line_read, half.line_write, half.channels), (table.line_read, table.line_write, table.channels));
        assert_eq!(LatencyModel::bytefs_table4_flash_scaled(1.0).unwrap(), table);
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY, 1000.0] {
            assert!(LatencyModel::bytefs_table4_flash_scaled(bad).is_err(), "{bad}");
        }
    }
}
