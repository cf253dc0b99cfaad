//! `alignfs bench-objects`: one cell of NVStore's object workloads on an object store,
//! in-process, printed as JSON. `bench/nvstore.py` runs the same workloads on Ceph
//! BlueStore and on plain files, measures each system's devices around each cell, and
//! writes the report (docs/NVSTORE.md, "Figures").

use std::time::{Duration, Instant};

use alignfs::paths::open_object_paths;
use alignfs::personality::{Bucket, ObjectStore};
use alignfs::stats::Counter;
use alignfs::VolumeOptions;
use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::DeviceArgs;

/// The write patterns, after the NVStore paper's evaluation (§4.2, §4.3), scaled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Pattern {
    /// 2 KiB appends: every write within one block, unaligned at one end.
    Append2k,
    /// 4 KiB appends at offset 2 KiB: every write across two blocks, unaligned at both ends.
    Cross4k,
    /// 2 KiB overwrites at random 2 KiB-aligned offsets of filled objects.
    Overwrite2k,
    /// Overwrites of 512 B–64 KiB at random byte offsets of filled objects.
    Random,
    /// 1 MiB appends, block-aligned.
    Aligned1m,
    /// filebench's fileserver flow on each writer's own objects: create one (gamma
    /// sizes, mean 128 KiB), append to one (mean 16 KiB), read one whole, stat one,
    /// remove one beyond 32. Bytes are those created and appended.
    Fileserver,
}

impl Pattern {
    /// Whether the objects must be filled before the cell (overwrites).
    fn overwrites(self) -> bool {
        matches!(self, Pattern::Overwrite2k | Pattern::Random)
    }
}

#[derive(Args)]
pub struct BenchObjectsArgs {
    #[command(flatten)]
    devices: DeviceArgs,
    /// The write pattern.
    #[arg(long, value_enum)]
    pattern: Pattern,
    /// Objects are named PREFIX-0 … PREFIX-(N-1) in the bucket `bench`.
    #[arg(long, default_value = "cell")]
    prefix: String,
    /// How many objects the cell writes.
    #[arg(long, default_value_t = 16)]
    objects: u64,
    /// Writers at once, each on its own share of the objects (the IO depth).
    #[arg(long, default_value_t = 1)]
    jobs: u64,
    /// Object size (appends stop there; overwrites stay below it).
    #[arg(long, default_value = "4M")]
    object_size: String,
    /// Stop after this many seconds…
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// …or after this many bytes written, whichever comes first.
    #[arg(long, default_value = "256M")]
    max_bytes: String,
    /// Only create and fill the objects (aligned 1 MiB writes), for a later overwrite cell.
    #[arg(long)]
    prefill: bool,
    /// After the cell, sync every fragment page into whole blocks (NVStore-Sync), timed
    /// and counted apart.
    #[arg(long)]
    sync: bool,
    /// Remove the cell's objects at the end (after the figures are taken).
    #[arg(long)]
    remove: bool,
    /// Memory for clean pages (NVStore's CP); 0 keeps none.
    #[arg(long, default_value = "256M")]
    clean_cache: String,
    #[arg(long, default_value_t = 42)]
    seed: u64,
}

/// The writes of a cell: (object, offset, length), in order.
struct Writes {
    pattern: Pattern,
    objects: u64,
    object_size: u64,
    position: u64,
    rng: StdRng,
}

impl Iterator for Writes {
    type Item = (u64, u64, u64);

    fn next(&mut self) -> Option<(u64, u64, u64)> {
        let size = self.object_size;
        let sequential = |position: &mut u64, start: u64, len: u64| {
            let per_object = (size - start) / len;
            let (object, k) = (*position / per_object, *position % per_object);
            *position += 1;
            Some((object, start + k * len, len)).filter(|(object, _, _)| *object < self.objects)
        };
        match self.pattern {
            Pattern::Append2k => sequential(&mut self.position, 0, 2048),
            Pattern::Cross4k => sequential(&mut self.position, 2048, 4096),
            Pattern::Aligned1m => sequential(&mut self.position, 0, 1 << 20),
            Pattern::Overwrite2k => {
                let object = self.rng.random_range(0..self.objects);
                Some((object, self.rng.random_range(0..size / 2048) * 2048, 2048))
            }
            Pattern::Random => {
                let len = self.rng.random_range(512..=65536u64).min(size);
                Some((self.rng.random_range(0..self.objects), self.rng.random_range(0..=size - len), len))
            }
            // Not a stream of writes to fixed objects: see `fileserver`.
            Pattern::Fileserver => None,
        }
    }
}

const COUNTERS: [Counter; 13] = [
    Counter::app_write_bytes,
    Counter::ssd_write_bytes,
    Counter::ssd_read_bytes,
    Counter::migration_write_bytes,
    Counter::migration_read_bytes,
    Counter::clean_page_hits,
    Counter::pages_dirtied_from_clean,
    Counter::kv_block_bytes,
    Counter::kv_fragment_bytes,
    Counter::kv_onode_bytes,
    Counter::kv_attr_bytes,
    Counter::kv_batches,
    Counter::kv_syncs,
];

fn counters(store: &ObjectStore) -> Vec<u64> {
    let stats = store.volume().stats();
    COUNTERS.iter().map(|&c| stats.get(c)).collect()
}

fn delta_json(before: &[u64], after: &[u64]) -> serde_json::Value {
    COUNTERS.iter().zip(before.iter().zip(after)).map(|(c, (b, a))| (c.name().to_string(), serde_json::json!(a - b))).collect()
}

pub fn run(args: &BenchObjectsArgs) -> Result<()> {
    let (_, ssds) = args.devices.specs()?;
    let object_size = alignfs::geometry::parse_size(&args.object_size).context("--object-size")?;
    let max_bytes = alignfs::geometry::parse_size(&args.max_bytes).context("--max-bytes")?;
    let clean_cache_bytes = alignfs::geometry::parse_size(&args.clean_cache).context("--clean-cache")?;
    if object_size < (1 << 20) || object_size % 4096 != 0 {
        bail!("--object-size must be a multiple of 4 KiB, at least 1 MiB");
    }
    if args.jobs == 0 || args.objects % args.jobs != 0 {
        bail!("--objects must be a multiple of --jobs (each writer has its own objects)");
    }
    let options = VolumeOptions { clean_cache_bytes, ..VolumeOptions::default() };
    let store = open_object_paths(&ssds[0].path, args.devices.kv.as_deref(), options, args.devices.backend())?;
    let result = run_cell(&store, args, object_size, max_bytes);
    store.close()?;
    println!("{}", serde_json::to_string_pretty(&result?)?);
    Ok(())
}

fn run_cell(store: &ObjectStore, args: &BenchObjectsArgs, object_size: u64, max_bytes: u64) -> Result<serde_json::Value> {
    if store.bucket(b"bench").is_err() {
        store.create_bucket(b"bench")?;
    }
    let bucket = store.bucket(b"bench")?;
    let names: Vec<Vec<u8>> = (0..args.objects).map(|i| format!("{}-{i}", args.prefix).into_bytes()).collect();
    let mut rng = StdRng::seed_from_u64(args.seed);
    let payload: Vec<u8> = (0..(1 << 20) + 65536).map(|_| rng.random()).collect();
    if args.prefill {
        prefill(&bucket, &names, object_size, &payload)?;
        return Ok(serde_json::json!({ "prefilled": args.objects, "object_size": object_size }));
    }
    prepare(&bucket, &names, args)?;
    let before = counters(store);
    let (started, limit) = (Instant::now(), Duration::from_secs_f64(args.seconds));
    let (ops, bytes) = write_for(&bucket, &names, &payload, args, object_size, max_bytes, started + limit)?;
    let seconds = started.elapsed().as_secs_f64();
    let written = counters(store);
    let mut report = serde_json::json!({
        "pattern": format!("{:?}", args.pattern),
        "jobs": args.jobs,
        "ops": ops,
        "bytes": bytes,
        "seconds": seconds,
        "counters": delta_json(&before, &written),
    });
    if args.sync {
        let started = Instant::now();
        let synced = store.volume().migrate_all()?;
        report["sync"] = serde_json::json!({ "blocks": synced, "seconds": started.elapsed().as_secs_f64(), "counters": delta_json(&written, &counters(store)) });
    }
    if args.remove {
        remove(&bucket, &names, args)?;
    }
    Ok(report)
}

/// Writes every object whole, 1 MiB at a time, for the overwrite patterns to find.
fn prefill(bucket: &Bucket<'_>, names: &[Vec<u8>], object_size: u64, payload: &[u8]) -> Result<()> {
    for name in names {
        bucket.create(name)?;
        for offset in (0..object_size).step_by(1 << 20) {
            let len = (1 << 20).min(object_size - offset) as usize;
            bucket.write(name, offset, &payload[..len])?;
        }
    }
    Ok(())
}

/// Checks that an overwrite pattern's objects were prefilled, or creates the objects a
/// writing pattern starts from (fileserver makes its own).
fn prepare(bucket: &Bucket<'_>, names: &[Vec<u8>], args: &BenchObjectsArgs) -> Result<()> {
    if args.pattern.overwrites() {
        if let Some(missing) = names.iter().find(|name| bucket.stat(name).is_err()) {
            bail!(
                "--pattern {} overwrites filled objects, and {} is not there: fill them first with --prefill (same --objects, --object-size and --prefix)",
                args.pattern.to_possible_value().map_or_else(String::new, |v| v.get_name().to_string()),
                String::from_utf8_lossy(missing)
            );
        }
    } else if args.pattern != Pattern::Fileserver {
        for name in names {
            bucket.create(name)?;
        }
    }
    Ok(())
}

/// Runs `--jobs` writers, each over its own objects, until `max_bytes` in all or the time
/// limit; returns the operations and bytes written.
fn write_for(
    bucket: &Bucket<'_>,
    names: &[Vec<u8>],
    payload: &[u8],
    args: &BenchObjectsArgs,
    object_size: u64,
    max_bytes: u64,
    deadline: Instant,
) -> Result<(u64, u64)> {
    let per_job = args.objects / args.jobs;
    std::thread::scope(|scope| -> Result<(u64, u64)> {
        let workers: Vec<_> = (0..args.jobs)
            .map(|job| {
                let (bucket, names, payload) = (&bucket, &names[(job * per_job) as usize..((job + 1) * per_job) as usize], &payload);
                let rng = StdRng::seed_from_u64(args.seed + job);
                let writes = Writes { pattern: args.pattern, objects: per_job, object_size, position: 0, rng };
                let job_bytes = max_bytes / args.jobs;
                scope.spawn(move || -> Result<(u64, u64)> {
                    if args.pattern == Pattern::Fileserver {
                        let prefix = format!("{}-f{job}", args.prefix);
                        return fileserver(bucket, &prefix, object_size, payload, writes.rng, || Instant::now() >= deadline, job_bytes);
                    }
                    let (mut ops, mut bytes) = (0u64, 0u64);
                    for (object, offset, len) in writes {
                        let at = (ops as usize * 4099) % (payload.len() - len as usize);
                        bucket.write(&names[object as usize], offset, &payload[at..at + len as usize])?;
                        ops += 1;
                        bytes += len;
                        if bytes >= max_bytes / args.jobs || Instant::now() >= deadline {
                            break;
                        }
                    }
                    Ok((ops, bytes))
                })
            })
            .collect();
        workers.into_iter().try_fold((0, 0), |(ops, bytes), worker| {
            let (o, b) = worker.join().map_err(|_| anyhow::anyhow!("a writer panicked"))??;
            Ok((ops + o, bytes + b))
        })
    })
}

/// Removes the cell's objects, and the files a fileserver cell left.
fn remove(bucket: &Bucket<'_>, names: &[Vec<u8>], args: &BenchObjectsArgs) -> Result<()> {
    for name in names {
        match bucket.remove(name) {
            Err(alignfs::Error::NotFound) if args.pattern == Pattern::Fileserver => {}
            other => other?,
        }
    }
    let left = format!("{}-f", args.prefix).into_bytes();
    for object in bucket.list(&left, None, usize::MAX)? {
        bucket.remove(&object.name)?;
    }
    Ok(())
}

/// A size from filebench's gamma distribution (shape 1.5) of mean `mean`, at most `cap`:
/// Gamma(1.5) is Exp(1) plus half a squared standard normal.
fn gamma_size(rng: &mut StdRng, mean: f64, cap: u64) -> u64 {
    let scale = mean / 1.5;
    let (u1, u2, u3): (f64, f64, f64) = (rng.random_range(f64::EPSILON..1.0), rng.random_range(f64::EPSILON..1.0), rng.random());
    let normal = (-2.0 * u2.ln()).sqrt() * (std::f64::consts::TAU * u3).cos();
    ((scale * (-u1.ln() + normal * normal / 2.0)) as u64).clamp(1, cap)
}

/// One writer of the fileserver cell, on objects `PREFIX-N`; returns (flow rounds, bytes
/// created and appended).
fn fileserver(
    bucket: &Bucket<'_>,
    prefix: &str,
    object_size: u64,
    payload: &[u8],
    mut rng: StdRng,
    out_of_time: impl Fn() -> bool,
    max_bytes: u64,
) -> Result<(u64, u64)> {
    let (mut rounds, mut bytes) = (0u64, 0u64);
    let mut live: Vec<(Vec<u8>, u64)> = Vec::new();
    let chunk = |rng: &mut StdRng, len: u64| {
        let at = rng.random_range(0..payload.len() - len as usize);
        &payload[at..at + len as usize]
    };
    while bytes < max_bytes && !out_of_time() {
        let name = format!("{prefix}-{rounds}").into_bytes();
        let size = gamma_size(&mut rng, 128.0 * 1024.0, 1 << 20);
        bucket.put(&name, chunk(&mut rng, size))?;
        live.push((name, size));
        bytes += size;
        let target = rng.random_range(0..live.len());
        let append = gamma_size(&mut rng, 16.0 * 1024.0, 1 << 20).min(object_size.saturating_sub(live[target].1));
        if append > 0 {
            bucket.write(&live[target].0, live[target].1, chunk(&mut rng, append))?;
            live[target].1 += append;
            bytes += append;
        }
        let read = &live[rng.random_range(0..live.len())].0;
        bucket.get(read)?;
        bucket.stat(&live[rng.random_range(0..live.len())].0)?;
        if live.len() > 32 {
            let (gone, _) = live.swap_remove(rng.random_range(0..live.len()));
            bucket.remove(&gone)?;
        }
        rounds += 1;
    }
    Ok((rounds, bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn writes(pattern: Pattern) -> Vec<(u64, u64, u64)> {
        Writes { pattern, objects: 2, object_size: 1 << 20, position: 0, rng: StdRng::seed_from_u64(1) }.take(2000).collect()
    }

    #[test]
    fn appends_fill_each_object_and_stop_after_the_last() {
        let append = writes(Pattern::Append2k);
        assert_eq!(append.len(), 2 * 512);
        assert_eq!((append[0], append[512]), ((0, 0, 2048), (1, 0, 2048)));
        let cross = writes(Pattern::Cross4k);
        assert_eq!(cross.len(), 2 * 255);
        assert!(cross.iter().all(|&(_, offset, len)| offset % 4096 == 2048 && offset + len <= 1 << 20));
        assert_eq!(writes(Pattern::Aligned1m), [(0, 0, 1 << 20), (1, 0, 1 << 20)]);
    }

    #[test]
    fn gamma_sizes_have_the_mean_asked_for_and_stay_under_the_cap() {
        let mut rng = StdRng::seed_from_u64(3);
        let sizes: Vec<u64> = (0..20_000).map(|_| gamma_size(&mut rng, 16384.0, 1 << 20)).collect();
        let mean = sizes.iter().sum::<u64>() as f64 / sizes.len() as f64;
        assert!((15_500.0..17_300.0).contains(&mean), "mean {mean}");
        assert!(sizes.iter().all(|&s| (1..=1 << 20).contains(&s)));
    }

    #[test]
    fn overwrites_stay_inside_the_objects() {
        for (_, offset, len) in writes(Pattern::Random).into_iter().chain(writes(Pattern::Overwrite2k)) {
            assert!((512..=65536).contains(&len) && offset + len <= 1 << 20);
        }
    }
}
