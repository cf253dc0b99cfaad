//! Timed cells and what they add up to: throughput, latencies and the engine's counters.

use std::time::{Duration, Instant};

use anyhow::Result;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use super::systems::System;
use super::Workload;

#[derive(Serialize, Clone)]
pub(super) struct CellResult {
    pub(super) workload: String,
    pub(super) durable: bool,
    pub(super) system: String,
    pub(super) mib_s: f64,
    pub(super) mean_us: f64,
    pub(super) p99_us: f64,
    pub(super) ops: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) counters: Option<serde_json::Value>,
}

#[derive(Default)]
pub(super) struct Accumulator {
    pub(super) bytes: u64,
    pub(super) elapsed: Duration,
    pub(super) latencies_ns: Vec<u64>,
    pub(super) counters: Vec<u64>,
}

impl Accumulator {
    pub(super) fn result(&self, workload: &str, durable: bool, system: &str, counters: Option<serde_json::Value>) -> CellResult {
        let mut sorted = self.latencies_ns.clone();
        sorted.sort_unstable();
        let mean = sorted.iter().sum::<u64>() as f64 / sorted.len().max(1) as f64;
        let p99 = sorted.get((sorted.len() as f64 * 0.99) as usize).or(sorted.last()).copied().unwrap_or(0);
        CellResult {
            workload: workload.into(),
            durable,
            system: system.into(),
            mib_s: self.bytes as f64 / (1 << 20) as f64 / self.elapsed.as_secs_f64().max(1e-9),
            mean_us: mean / 1000.0,
            p99_us: p99 as f64 / 1000.0,
            ops: sorted.len() as u64,
            counters,
        }
    }
}

/// What one timed cell runs.
#[derive(Clone, Copy)]
pub(super) struct Cell {
    pub(super) workload: Workload,
    pub(super) durable: bool,
    pub(super) file_size: u64,
    pub(super) duration: Duration,
    pub(super) seed: u64,
}

/// One timed cell: writes of the workload's sizes at random offsets.
pub(super) fn run_cell(system: &mut dyn System, cell: Cell, data: &[u8], acc: &mut Accumulator) -> Result<()> {
    let Cell { workload, durable, file_size, duration, seed } = cell;
    let mut rng = StdRng::seed_from_u64(seed);
    system.drop_caches();
    let started = Instant::now();
    while started.elapsed() < duration {
        let len = rng.random_range(workload.min..=workload.max);
        let offset = rng.random_range(0..=file_size - len);
        let skew = rng.random_range(0..4096usize);
        let op_start = Instant::now();
        system.write(offset, &data[skew..skew + len as usize])?;
        if durable {
            system.sync()?;
        }
        acc.latencies_ns.push(op_start.elapsed().as_nanos() as u64);
        acc.bytes += len;
    }
    if !durable {
        system.sync()?;
    }
    acc.elapsed += started.elapsed();
    Ok(())
}

/// A write cell that also adds up the engine's counters (on volumes) over the cell.
pub(super) fn run_counted_cell(system: &mut dyn System, cell: Cell, data: &[u8], acc: &mut Accumulator) -> Result<()> {
    let before = system.counters();
    run_cell(system, cell, data, acc)?;
    if let (Some(before), Some(after)) = (before, system.counters()) {
        let delta = after.iter().zip(&before).map(|(a, b)| a - b);
        if acc.counters.is_empty() {
            acc.counters = delta.collect();
        } else {
            acc.counters.iter_mut().zip(delta).for_each(|(a, d)| *a += d);
        }
    }
    Ok(())
}

/// One timed cell of cold random reads: no read finds a byte in a cache. The file is cut
/// into slots of the read size plus 4 KiB and each slot is read once, in a random order,
/// at a random skew inside its 4 KiB margin; when every slot has been read, caches are
/// dropped with the clock stopped and a new order begins. (Reading at any offset instead
/// let the file fill the cache within the cell: the plain file, whose blocks lie in
/// order, then served most of its reads from memory.)
pub(super) fn run_cold_read_cell(system: &mut dyn System, cell: Cell, acc: &mut Accumulator) -> Result<()> {
    use rand::seq::SliceRandom;
    let Cell { workload, file_size, duration, seed, .. } = cell;
    let len = workload.max;
    let stride = len + 4096;
    let mut slots: Vec<u64> = (0..(file_size - len) / stride + 1).collect();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut out = vec![0u8; len as usize];
    let mut timed = Duration::ZERO;
    while timed < duration {
        system.drop_caches();
        slots.shuffle(&mut rng);
        let started = Instant::now();
        for &slot in &slots {
            let offset = (slot * stride + rng.random_range(0..4096)).min(file_size - len);
            let op_start = Instant::now();
            system.read(offset, &mut out)?;
            acc.latencies_ns.push(op_start.elapsed().as_nanos() as u64);
            acc.bytes += len;
            if timed + started.elapsed() >= duration {
                break;
            }
        }
        timed += started.elapsed();
    }
    acc.elapsed += timed;
    Ok(())
}

pub(super) fn prefill(system: &mut dyn System, file_size: u64, data: &[u8]) -> Result<()> {
    let chunk = 1 << 20;
    let mut offset = 0;
    while offset < file_size {
        let len = chunk.min(file_size - offset);
        system.write(offset, &data[..len as usize])?;
        offset += len;
    }
    system.sync()
}
