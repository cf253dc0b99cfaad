//! `alignfs-coherence`: checks that a mount never returns a stale byte when one file is
//! open several ways at once. With `alignfs mount --cache reads` (the default) a read-only
//! open reads through the kernel's page cache while a read-write open bypasses it, and a
//! shared mapping of either lives in that page cache; docs/FUSE.md states the rule.
//!
//! Two checks on one file of fixed size:
//! - `model`: random writes through the read-write open and through a shared writable
//!   mapping, each followed by reads through every view (both opens, both mappings), all
//!   compared byte for byte with a model; the read-only open is closed and reopened now
//!   and then, so that pages kept across opens are checked too.
//! - `race`: one writer and several readers that keep refilling the page cache of a small
//!   region. After each write returns, the writer reads the range back through the cached
//!   open and through a mapping; a reader's refill that raced the write and was kept shows
//!   up as old bytes there.
//! - `close`: the file is closed by every open again and again, which lets the mount put
//!   what was written back into the page cache (`--fill-on-close`) while the next open
//!   writes, truncates or maps it. Each round reads the whole file through a fresh
//!   read-only open and compares it with the model.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::Parser;
use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};

#[derive(Parser)]
#[command(version, about = "Check that cached reads, direct writes and mappings of one file on a mount agree")]
struct Args {
    /// The file to create (on the mount under test); removed at the end.
    file: PathBuf,
    /// Operations of the model check.
    #[arg(long, default_value_t = 4000)]
    ops: u64,
    /// Writes of the race check.
    #[arg(long, default_value_t = 4000)]
    race_writes: u64,
    /// Reader threads of the race check.
    #[arg(long, default_value_t = 3)]
    readers: usize,
    /// File size in bytes.
    #[arg(long, default_value_t = 2 << 20)]
    size: usize,
    /// Rounds of the close check.
    #[arg(long, default_value_t = 1500)]
    close_rounds: u64,
    /// Seed (default: random, printed).
    #[arg(long)]
    seed: Option<u64>,
}

const PAGE: usize = 4096;

/// A shared mapping of a whole file. Bytes are only ever copied in and out through the raw
/// pointer, never borrowed: other opens change them underneath.
struct Mapping {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping stays valid until drop, and it is only accessed by copying bytes
// through the raw pointer (see `read` and `write`), which any thread may do.
unsafe impl Send for Mapping {}
// SAFETY: as for Send; concurrent copies race only on plain bytes, as file IO would.
unsafe impl Sync for Mapping {}

impl Mapping {
    fn new(file: &File, len: usize, writable: bool) -> Result<Mapping> {
        let prot = if writable { libc::PROT_READ | libc::PROT_WRITE } else { libc::PROT_READ };
        // SAFETY: a fresh mapping at an address of the kernel's choosing, of an open file;
        // the result is checked before use.
        let ptr = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, libc::MAP_SHARED, file.as_raw_fd(), 0) };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error()).context("mmap");
        }
        Ok(Mapping { ptr: ptr.cast(), len })
    }

    fn read(&self, offset: usize, buf: &mut [u8]) {
        assert!(offset + buf.len() <= self.len);
        // SAFETY: the range lies inside the mapping (asserted), and `buf` is ours.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(offset), buf.as_mut_ptr(), buf.len()) }
    }

    fn write(&self, offset: usize, data: &[u8]) {
        assert!(offset + data.len() <= self.len);
        // SAFETY: the range lies inside the mapping (asserted), which is writable: only
        // `new(.., writable: true)` mappings are written.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.add(offset), data.len()) }
    }

    fn sync(&self) -> Result<()> {
        // SAFETY: the whole mapping, which is valid.
        if unsafe { libc::msync(self.ptr.cast(), self.len, libc::MS_SYNC) } != 0 {
            return Err(std::io::Error::last_os_error()).context("msync");
        }
        Ok(())
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what `new` mapped; no pointer into it outlives self.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

fn open_ro(path: &PathBuf) -> Result<File> {
    File::open(path).with_context(|| format!("open {} read-only", path.display()))
}

fn pread(file: &File, offset: usize, len: usize) -> Result<Vec<u8>> {
    let mut buf = vec![0; len];
    file.read_exact_at(&mut buf, offset as u64).context("pread")?;
    Ok(buf)
}

/// Where `got` first differs from `want`, as a message.
fn mismatch(view: &str, offset: usize, got: &[u8], want: &[u8]) -> Option<String> {
    let i = got.iter().zip(want).position(|(a, b)| a != b)?;
    Some(format!("{view}: byte {} reads {:#04x}, expected {:#04x}", offset + i, got[i], want[i]))
}

/// An offset and length inside the file: sometimes page-aligned, sometimes not.
fn range(rng: &mut StdRng, size: usize, max_len: usize) -> (usize, usize) {
    let len = if rng.random_bool(0.3) { PAGE * rng.random_range(1..=max_len / PAGE) } else { rng.random_range(1..=max_len) };
    let mut offset = rng.random_range(0..=size - len);
    if rng.random_bool(0.3) {
        offset -= offset % PAGE;
    }
    (offset, len)
}

fn model_check(args: &Args, rng: &mut StdRng) -> Result<u64> {
    let size = args.size;
    let rw = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&args.file).context("create the file")?;
    let mut model = vec![0u8; size];
    rng.fill_bytes(&mut model);
    rw.write_all_at(&model, 0).context("prefill")?;
    let mut ro = open_ro(&args.file)?;
    let map_rw = Mapping::new(&rw, size, true)?;
    let mut map_ro = Mapping::new(&ro, size, false)?;
    let mut reads = 0;
    for op in 0..args.ops {
        match rng.random_range(0..100) {
            0..35 => {
                let (offset, len) = range(rng, size, 64 << 10);
                let mut data = vec![0; len];
                rng.fill_bytes(&mut data);
                rw.write_all_at(&data, offset as u64).context("pwrite")?;
                model[offset..offset + len].copy_from_slice(&data);
            }
            35..50 => {
                let (offset, len) = range(rng, size, 16 << 10);
                let mut data = vec![0; len];
                rng.fill_bytes(&mut data);
                map_rw.write(offset, &data);
                model[offset..offset + len].copy_from_slice(&data);
                if rng.random_bool(0.2) {
                    map_rw.sync()?;
                }
            }
            50..52 => {
                // Reopen: pages kept across opens (FOPEN_KEEP_CACHE) must still be current.
                drop(map_ro);
                ro = open_ro(&args.file)?;
                map_ro = Mapping::new(&ro, size, false)?;
            }
            52..54 => rw.sync_data().context("fdatasync")?,
            _ => {
                let (offset, len) = range(rng, size, 64 << 10);
                let want = &model[offset..offset + len];
                let mut from_ro_map = vec![0; len];
                map_ro.read(offset, &mut from_ro_map);
                let mut from_rw_map = vec![0; len];
                map_rw.read(offset, &mut from_rw_map);
                let views = [
                    ("read-only open (page cache)", pread(&ro, offset, len)?),
                    ("read-write open (direct)", pread(&rw, offset, len)?),
                    ("mapping of the read-only open", from_ro_map),
                    ("mapping of the read-write open", from_rw_map),
                ];
                for (view, got) in &views {
                    if let Some(m) = mismatch(view, offset, got, want) {
                        bail!("model check, operation {op}: {m}");
                    }
                }
                reads += 1;
            }
        }
    }
    for (view, got) in [("read-only open (page cache)", pread(&ro, 0, size)?), ("read-write open (direct)", pread(&rw, 0, size)?)] {
        if let Some(m) = mismatch(view, 0, &got, &model) {
            bail!("model check, final comparison: {m}");
        }
    }
    Ok(reads)
}

fn race_check(args: &Args, rng: &mut StdRng) -> Result<u64> {
    // A small region, so that readers refill the pages a write has just dropped.
    let region = (256 * PAGE).min(args.size);
    let rw = OpenOptions::new().read(true).write(true).open(&args.file).context("open read-write")?;
    let mut model = pread(&rw, 0, region)?;
    let ro = Arc::new(open_ro(&args.file)?);
    let map = Arc::new(Mapping::new(&ro, region, false)?);
    let stop = Arc::new(AtomicBool::new(false));
    let refills = Arc::new(AtomicU64::new(0));
    let readers: Vec<_> = (0..args.readers)
        .map(|i| {
            let (ro, map, stop, refills) = (Arc::clone(&ro), Arc::clone(&map), Arc::clone(&stop), Arc::clone(&refills));
            let mut rng = StdRng::seed_from_u64(rng.random::<u64>() ^ i as u64);
            std::thread::spawn(move || {
                let mut buf = vec![0; PAGE];
                while !stop.load(Ordering::Relaxed) {
                    let offset = PAGE * rng.random_range(0..region / PAGE);
                    if i % 2 == 0 {
                        let _ = ro.read_at(&mut buf, offset as u64);
                    } else {
                        map.read(offset, &mut buf);
                    }
                    refills.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    let mut result = Ok(());
    for write in 0..args.race_writes {
        let (offset, len) = range(rng, region, 64 * PAGE);
        let mut data = vec![0; len];
        rng.fill_bytes(&mut data);
        if let Err(e) = rw.write_all_at(&data, offset as u64) {
            result = Err(e).context("pwrite");
            break;
        }
        model[offset..offset + len].copy_from_slice(&data);
        let mut from_map = vec![0; len];
        map.read(offset, &mut from_map);
        let cached = match pread(&ro, offset, len) {
            Ok(b) => b,
            Err(e) => {
                result = Err(e);
                break;
            }
        };
        let stale = mismatch("read-only open (page cache)", offset, &cached, &data)
            .or_else(|| mismatch("mapping of the read-only open", offset, &from_map, &data));
        if let Some(m) = stale {
            result = Err(anyhow::anyhow!("race check, write {write} ({len} bytes at {offset}) had returned: {m}"));
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        let _ = r.join();
    }
    result?;
    let all = pread(&ro, 0, region)?;
    if let Some(m) = mismatch("read-only open (page cache), at the end", 0, &all, &model) {
        bail!("race check: {m}");
    }
    Ok(refills.load(Ordering::Relaxed))
}

/// Each round: open the file one way, change it and close it; then either change it again
/// at once (a fill of what was written may be reading), or wait a moment or not and read
/// it whole through a fresh read-only open.
fn close_check(args: &Args, rng: &mut StdRng) -> Result<u64> {
    // Files of up to `--size`: a fill of more than one chunk (1 MiB) checks between chunks.
    let max = args.size;
    let mut model = vec![0u8; rng.random_range(1..=max)];
    rng.fill_bytes(&mut model);
    std::fs::write(&args.file, &model).context("create the file")?;
    let mut compared = 0;
    for round in 0..args.close_rounds {
        match rng.random_range(0..100) {
            0..50 => {
                // Writes through a read-write open, the file perhaps growing.
                let rw = OpenOptions::new().write(true).open(&args.file).context("open read-write")?;
                for _ in 0..rng.random_range(1..=4) {
                    let len = rng.random_range(1..=64 << 10);
                    let offset = rng.random_range(0..=model.len().min(max - len));
                    let mut data = vec![0; len];
                    rng.fill_bytes(&mut data);
                    rw.write_all_at(&data, offset as u64).context("pwrite")?;
                    if offset + len > model.len() {
                        model.resize(offset + len, 0);
                    }
                    model[offset..offset + len].copy_from_slice(&data);
                }
            }
            50..70 => {
                // Stores through a shared mapping, written back when it is unmapped.
                let rw = OpenOptions::new().read(true).write(true).open(&args.file).context("open read-write")?;
                let map = Mapping::new(&rw, model.len(), true)?;
                for _ in 0..rng.random_range(1..=4) {
                    let len = rng.random_range(1..=model.len().min(16 << 10));
                    let offset = rng.random_range(0..=model.len() - len);
                    let mut data = vec![0; len];
                    rng.fill_bytes(&mut data);
                    map.write(offset, &data);
                    model[offset..offset + len].copy_from_slice(&data);
                }
            }
            70..85 => {
                // Truncated by path, without an open.
                let len = rng.random_range(1..=max);
                std::fs::File::options().write(true).open(&args.file).and_then(|f| f.set_len(len as u64)).context("truncate")?;
                model.resize(len, 0);
            }
            _ => {
                // Rewritten whole through a new open that truncates.
                model = vec![0; rng.random_range(1..=max)];
                rng.fill_bytes(&mut model);
                std::fs::write(&args.file, &model).context("rewrite")?;
            }
        }
        // Often the next change follows the close at once, while its fill may be reading.
        if rng.random_bool(0.5) {
            continue;
        }
        if rng.random_bool(0.5) {
            std::thread::sleep(std::time::Duration::from_micros(rng.random_range(0..2000)));
        }
        let got = std::fs::read(&args.file).context("read back")?;
        if got.len() != model.len() {
            bail!("close check, round {round}: the file reads {} bytes long, expected {}", got.len(), model.len());
        }
        if let Some(m) = mismatch("a fresh read-only open (page cache)", 0, &got, &model) {
            bail!("close check, round {round}: {m}");
        }
        compared += 1;
    }
    Ok(compared)
}

fn main() -> Result<()> {
    let args = Args::parse();
    if args.size < 64 << 10 || args.size % PAGE != 0 {
        bail!("--size must be a multiple of {PAGE} and at least 64 KiB");
    }
    let seed = args.seed.unwrap_or_else(rand::random);
    println!("seed {seed}");
    let mut rng = StdRng::seed_from_u64(seed);
    let outcome = model_check(&args, &mut rng)
        .and_then(|reads| {
            println!("model check: {} operations, {reads} reads through 4 views each, all current", args.ops);
            race_check(&args, &mut rng)
        })
        .and_then(|refills| {
            println!(
                "race check: {} writes read back through the page cache and a mapping while {} readers refilled it ({refills} reads), all current",
                args.race_writes, args.readers
            );
            close_check(&args, &mut rng)
        });
    let _ = std::fs::remove_file(&args.file);
    let read_backs = outcome?;
    println!("close check: {} rounds of change and close, {read_backs} read back whole, all current", args.close_rounds);
    Ok(())
}
