//! Filebench-style macro workloads (fileserver, webproxy, varmail, webserver, createfiles)
//! for bench/run.py, bench/uhs.py and bench/byte.py.
//!
//! Filebench is not packaged for this machine, so this program replays its personalities'
//! flow operations with the file counts, sizes and read/write IO sizes of the OrchFS
//! paper's Table 3 (scaled by `--files`), and createfiles with the UHS paper's Table III
//! shape (16 KiB files written whole, no reads; the file set starts empty and the run ends
//! early once every file exists). Webserver is filebench's (ByteFS's Table 5): ten whole
//! files read, then one append to a shared log file. As in the OrchFS paper, every write phase is made
//! durable at once (fsync). `prepare` builds the file set; `run` times the flow for
//! `--seconds` (or `--flows` of them, if sooner) and prints one JSON object. The two are separate so caches can be dropped in
//! between.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};

#[derive(Parser)]
#[command(about = "Filebench-style fileserver / webproxy / varmail / webserver workloads (OrchFS paper, Table 3)")]
struct Args {
    #[command(subcommand)]
    phase: Phase,
}

#[derive(Subcommand)]
enum Phase {
    /// Create the file set (80 % of the files, filled) under DIR.
    Prepare(Common),
    /// Run the flow on a prepared file set and print the result as JSON.
    Run {
        #[command(flatten)]
        common: Common,
        /// How long to run.
        #[arg(long, default_value_t = 10.0)]
        seconds: f64,
        /// Stop after this many flows, if sooner: the same work on every system, for
        /// traffic per operation.
        #[arg(long)]
        flows: Option<usize>,
    },
}

#[derive(clap::Args)]
struct Common {
    #[arg(long, value_enum)]
    workload: Workload,
    /// Directory that holds the file set.
    #[arg(long)]
    dir: PathBuf,
    /// Number of files (the paper uses 10,000).
    #[arg(long, default_value_t = 1000)]
    files: usize,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Mean file size in bytes, instead of Table 3's (ByteFS uses filebench's own:
    /// 16 KiB for varmail and webproxy, 128 KiB for fileserver).
    #[arg(long)]
    mean_file: Option<u64>,
    /// Bytes of one write IO (an append's upper bound), instead of Table 3's.
    #[arg(long)]
    write_io: Option<usize>,
}

impl Common {
    fn check(&self) -> Result<()> {
        if self.files < 2 {
            bail!("--files must be at least 2");
        }
        if self.mean_file == Some(0) || self.write_io == Some(0) {
            bail!("--mean-file and --write-io must be at least 1 byte");
        }
        Ok(())
    }
}

#[derive(Clone, Copy, ValueEnum)]
enum Workload {
    Fileserver,
    Webproxy,
    Varmail,
    Webserver,
    Createfiles,
}

/// One personality's shape, from Table 3.
struct Shape {
    mean_file: u64,
    read_io: usize,
    write_io: usize,
    /// Files per directory (filebench's meandirwidth; the flat ones use one directory).
    dir_width: usize,
    /// Share of the file set `prepare` creates: filebench preallocates 80 %, the rest is
    /// for creates to use; createfiles starts empty, creating is the whole workload.
    preallocate: f64,
}

impl Workload {
    fn shape(self) -> Shape {
        const K: u64 = 1024;
        match self {
            Workload::Fileserver => Shape { mean_file: 256 * K, read_io: 1 << 20, write_io: 256 << 10, dir_width: 20, preallocate: 0.8 },
            Workload::Webproxy => {
                Shape { mean_file: 2048 * K, read_io: 1 << 20, write_io: 256 << 10, dir_width: usize::MAX, preallocate: 0.8 }
            }
            Workload::Varmail => Shape { mean_file: 64 * K, read_io: 1 << 20, write_io: 64 << 10, dir_width: usize::MAX, preallocate: 0.8 },
            Workload::Createfiles => Shape { mean_file: 16 * K, read_io: 1 << 20, write_io: 16 << 10, dir_width: 100, preallocate: 0.0 },
            // Filebench's webserver.f: 16 KiB files 20 to a directory, all preallocated, and
            // 16 KiB appends to the log.
            Workload::Webserver => Shape { mean_file: 16 * K, read_io: 1 << 20, write_io: 16 << 10, dir_width: 20, preallocate: 1.0 },
        }
    }
}

struct FileSet {
    dir: PathBuf,
    workload: Workload,
    shape: Shape,
    present: Vec<bool>,
    rng: StdRng,
    data: Vec<u8>,
    read_buf: Vec<u8>,
    counts: Counts,
}

#[derive(Default)]
struct Counts {
    ops: u64,
    read_bytes: u64,
    write_bytes: u64,
    fsyncs: u64,
    /// Wall time of each flow iteration (one pass over the personality's operations).
    flow_latencies: Vec<Duration>,
}

impl FileSet {
    fn new(common: &Common) -> FileSet {
        let defaults = common.workload.shape();
        let shape = Shape {
            mean_file: common.mean_file.unwrap_or(defaults.mean_file),
            write_io: common.write_io.unwrap_or(defaults.write_io),
            ..defaults
        };
        let mut rng = StdRng::seed_from_u64(common.seed);
        let mut data = vec![0u8; shape.write_io.max(shape.mean_file as usize * 2)];
        rng.fill_bytes(&mut data);
        FileSet {
            dir: common.dir.clone(),
            workload: common.workload,
            read_buf: vec![0u8; shape.read_io],
            shape,
            present: vec![false; common.files],
            rng,
            data,
            counts: Counts::default(),
        }
    }

    /// Webserver's log file, beside the file set's directories.
    fn log_path(&self) -> PathBuf {
        self.dir.join("log")
    }

    fn path(&self, i: usize) -> PathBuf {
        let width = self.shape.dir_width.min(self.present.len());
        self.dir.join(format!("d{}", i / width)).join(format!("f{i}"))
    }

    /// Filebench draws sizes from a gamma distribution around the mean; a uniform draw
    /// over [mean/2, 3·mean/2] keeps the mean and the spread of sizes without the tail.
    fn file_size(&mut self) -> u64 {
        let mean = self.shape.mean_file;
        self.rng.random_range(mean / 2..=mean + mean / 2)
    }

    /// A random file that exists (`present`) or a free slot for a new one.
    fn pick(&mut self, present: bool) -> Result<usize> {
        let n = self.present.len();
        let start = self.rng.random_range(0..n);
        (0..n).map(|k| (start + k) % n).find(|&i| self.present[i] == present).context("the file set is empty or full; run `prepare` first")
    }

    fn write_in_pieces(&mut self, file: &mut File, mut len: u64) -> Result<()> {
        while len > 0 {
            let n = len.min(self.shape.write_io as u64) as usize;
            let at = self.rng.random_range(0..=self.data.len() - n);
            file.write_all(&self.data[at..at + n])?;
            self.counts.write_bytes += n as u64;
            self.counts.ops += 1;
            len -= n as u64;
        }
        Ok(())
    }

    fn fsync(&mut self, file: &File) -> Result<()> {
        file.sync_all()?;
        self.counts.fsyncs += 1;
        self.counts.ops += 1;
        Ok(())
    }

    /// createfile + writewholefile + fsync + closefile.
    fn create(&mut self, i: usize) -> Result<()> {
        let path = self.path(i);
        let mut file = File::create(&path).with_context(|| format!("create {}", path.display()))?;
        let size = self.file_size();
        self.write_in_pieces(&mut file, size)?;
        self.fsync(&file)?;
        self.present[i] = true;
        self.counts.ops += 2;
        Ok(())
    }

    /// openfile + appendfilerand (one write IO, random length up to the IO size) + fsync + closefile.
    fn append(&mut self, i: usize) -> Result<()> {
        self.append_to(self.path(i))
    }

    fn append_to(&mut self, path: PathBuf) -> Result<()> {
        let mut file = OpenOptions::new().append(true).open(&path).with_context(|| format!("append to {}", path.display()))?;
        let len = self.rng.random_range(1..=self.shape.write_io as u64);
        self.write_in_pieces(&mut file, len)?;
        self.fsync(&file)?;
        self.counts.ops += 2;
        Ok(())
    }

    /// openfile + readwholefile + closefile.
    fn read_whole(&mut self, i: usize) -> Result<()> {
        let mut file = File::open(self.path(i))?;
        loop {
            let n = file.read(&mut self.read_buf)?;
            if n == 0 {
                break;
            }
            self.counts.read_bytes += n as u64;
            self.counts.ops += 1;
        }
        self.counts.ops += 2;
        Ok(())
    }

    fn delete(&mut self, i: usize) -> Result<()> {
        std::fs::remove_file(self.path(i))?;
        self.present[i] = false;
        self.counts.ops += 1;
        Ok(())
    }

    fn stat(&mut self, i: usize) -> Result<()> {
        std::fs::metadata(self.path(i))?;
        self.counts.ops += 1;
        Ok(())
    }

    fn prepare(&mut self) -> Result<()> {
        let width = self.shape.dir_width.min(self.present.len());
        for d in 0..self.present.len().div_ceil(width) {
            std::fs::create_dir_all(self.dir.join(format!("d{d}")))?;
        }
        if matches!(self.workload, Workload::Webserver) {
            File::create(self.log_path()).with_context(|| format!("create {}", self.log_path().display()))?;
        }
        for i in 0..self.present.len() {
            if self.rng.random_bool(self.shape.preallocate) {
                let path = self.path(i);
                let mut file = File::create(&path).with_context(|| format!("create {}", path.display()))?;
                let size = self.file_size();
                self.write_in_pieces(&mut file, size)?;
            }
        }
        Ok(())
    }

    /// Which files exist is read back from the directory, so `run` follows `prepare`.
    fn scan(&mut self) {
        for i in 0..self.present.len() {
            self.present[i] = self.path(i).exists();
        }
    }

    fn flow(&mut self, workload: Workload) -> Result<()> {
        match workload {
            Workload::Fileserver => {
                let new = self.pick(false)?;
                self.create(new)?;
                let old = self.pick(true)?;
                self.append(old)?;
                let old = self.pick(true)?;
                self.read_whole(old)?;
                let old = self.pick(true)?;
                self.delete(old)?;
                let old = self.pick(true)?;
                self.stat(old)?;
            }
            Workload::Webproxy => {
                let old = self.pick(true)?;
                self.delete(old)?;
                let new = self.pick(false)?;
                self.create(new)?;
                for _ in 0..5 {
                    let old = self.pick(true)?;
                    self.read_whole(old)?;
                }
            }
            Workload::Createfiles => {
                let new = self.pick(false)?;
                self.create(new)?;
            }
            Workload::Webserver => {
                for _ in 0..10 {
                    let old = self.pick(true)?;
                    self.read_whole(old)?;
                }
                self.append_to(self.log_path())?;
            }
            Workload::Varmail => {
                let old = self.pick(true)?;
                self.delete(old)?;
                let new = self.pick(false)?;
                self.create(new)?;
                let old = self.pick(true)?;
                self.read_whole(old)?;
                self.append(old)?;
                let old = self.pick(true)?;
                self.read_whole(old)?;
            }
        }
        Ok(())
    }
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i].as_secs_f64() * 1e6
}

fn main() -> Result<()> {
    match Args::parse().phase {
        Phase::Prepare(common) => {
            common.check()?;
            FileSet::new(&common).prepare()
        }
        Phase::Run { common, seconds, flows } => {
            common.check()?;
            if !common.dir.is_dir() {
                bail!("{} is not a prepared file set (run `prepare` first)", common.dir.display());
            }
            let mut set = FileSet::new(&common);
            set.scan();
            let start = Instant::now();
            let limit = Duration::from_secs_f64(seconds);
            while start.elapsed() < limit && flows.is_none_or(|n| set.counts.flow_latencies.len() < n) {
                if matches!(common.workload, Workload::Createfiles) && set.present.iter().all(|&p| p) {
                    break; // every file exists: createfiles is done
                }
                let t = Instant::now();
                set.flow(common.workload)?;
                set.counts.flow_latencies.push(t.elapsed());
            }
            let elapsed = start.elapsed().as_secs_f64();
            let c = &mut set.counts;
            c.flow_latencies.sort();
            let mean_us = c.flow_latencies.iter().sum::<Duration>().as_secs_f64() * 1e6 / c.flow_latencies.len().max(1) as f64;
            let mib = (c.read_bytes + c.write_bytes) as f64 / f64::from(1 << 20);
            let cdf = [0.01, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 0.999].map(|p| [p * 100.0, percentile(&c.flow_latencies, p)]);
            let result = serde_json::json!({
                "seconds": elapsed,
                "ops": c.ops,
                "ops_per_s": c.ops as f64 / elapsed,
                "flows": c.flow_latencies.len(),
                "read_bytes": c.read_bytes,
                "write_bytes": c.write_bytes,
                "fsyncs": c.fsyncs,
                "mib_per_s": mib / elapsed,
                "flow_mean_us": mean_us,
                "flow_p99_us": percentile(&c.flow_latencies, 0.99),
                "flow_percentiles_us": cdf,
            });
            println!("{result}");
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn every_personality_runs_on_a_prepared_set() {
        for workload in [Workload::Fileserver, Workload::Webproxy, Workload::Varmail, Workload::Webserver] {
            let dir = std::env::temp_dir().join(format!("alignfs-macro-test-{}-{}", std::process::id(), workload as u8));
            let common = Common { workload, dir: dir.clone(), files: 20, seed: 7, mean_file: Some(8192), write_io: Some(4096) };
            let mut set = FileSet::new(&common);
            assert_eq!((set.shape.mean_file, set.shape.write_io), (8192, 4096));
            set.prepare().unwrap();
            set.scan();
            for _ in 0..10 {
                set.flow(workload).unwrap();
            }
            assert!(set.counts.write_bytes > 0 && set.counts.read_bytes > 0);
            assert!(set.counts.fsyncs >= 10);
            std::fs::remove_dir_all(&dir).unwrap();
        }
    }

    #[test]
    fn paths_spread_over_directories_of_the_given_width() {
        let common =
            Common { workload: Workload::Fileserver, dir: PathBuf::from("/x"), files: 100, seed: 1, mean_file: None, write_io: None };
        let set = FileSet::new(&common);
        assert_eq!(set.path(19), Path::new("/x/d0/f19"));
        assert_eq!(set.path(20), Path::new("/x/d1/f20"));
    }
}
