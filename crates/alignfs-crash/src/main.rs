//! `alignfs-crash`: the process-crash loop. Each round mounts a volume, checks every file
//! against what was acknowledged before the last crash, runs a mixed workload, and
//! `kill -9`s the daemon at a random moment. The model lives here, outside the mount.
//!
//! The `orch` promise makes every completed write durable when it returns, and a process
//! crash loses no persisted fast-tier store. So every acknowledged operation must survive,
//! fsync or not. The one operation in flight at the kill may land or not; a write in
//! flight may land in part, byte by byte (the kernel splits it into requests of at most
//! `fs.fuse.max_pages_limit` pages).
//!
//! With `--profile scrap` only fsynced data must survive: see `model.rs`.

mod model;

use alignfs::profile::{Promise, Tunable};
use alignfs::Profile;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use model::{Model, Outcome};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Kill the alignfs daemon at random moments of a workload and check that nothing
/// acknowledged is lost.
#[derive(Parser)]
#[command(version, about)]
struct Args {
    /// Crash rounds.
    #[arg(long, default_value_t = 200)]
    rounds: u32,
    /// Seed (default: random, printed).
    #[arg(long)]
    seed: Option<u64>,
    /// The alignfs binary.
    #[arg(long, default_value = "target/release/alignfs")]
    alignfs: PathBuf,
    /// Working directory for the devices, the mount point and logs (default: a new one
    /// under /var/tmp, removed on success).
    #[arg(long)]
    work: Option<PathBuf>,
    /// Fast-tier size, or for `scrap` the scrap memory (small keeps migration running).
    #[arg(long, default_value = "8M")]
    fast_size: String,
    /// The profile to format: `orch` or `scrap`.
    #[arg(long, default_value = "orch")]
    profile: String,
    /// Longest workload stretch before the kill, in milliseconds.
    #[arg(long, default_value_t = 400)]
    max_run_ms: u64,
    /// How the mount's requests travel (`alignfs mount --transport`).
    #[arg(long, default_value = "auto")]
    transport: String,
}

struct Harness {
    alignfs: PathBuf,
    /// `None` for a profile without a fast tier.
    fast: Option<PathBuf>,
    /// `--scrap-mem` for the mount, for a profile whose residue lives in memory.
    scrap_mem: Option<String>,
    ssd: PathBuf,
    mnt: PathBuf,
    log: PathBuf,
    transport: String,
}

impl Harness {
    fn alignfs(&self) -> Command {
        let mut c = Command::new(&self.alignfs);
        c.env_remove("ALIGNFS_DAEMON");
        c
    }

    fn devices(&self) -> Vec<String> {
        let mut args = vec!["--ssd".to_string(), self.ssd.display().to_string()];
        if let Some(fast) = &self.fast {
            args.extend(["--fast".to_string(), fast.display().to_string()]);
        }
        args
    }

    fn run(&self, mut command: Command, what: &str) -> Result<String> {
        let out = command.output().with_context(|| format!("run {what}"))?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
        if !out.status.success() {
            bail!("{what} failed ({}):\n{text}", out.status);
        }
        Ok(text)
    }

    fn mount(&self) -> Result<()> {
        let mut c = self.alignfs();
        c.arg("mount").args(self.devices()).args(["--transport", &self.transport]).arg("--log").arg(&self.log).arg(&self.mnt);
        if let Some(bytes) = &self.scrap_mem {
            c.args(["--scrap-mem", bytes]);
        }
        self.run(c, "alignfs mount").map(drop)
    }

    fn stat(&self) -> Result<serde_json::Value> {
        let mut c = self.alignfs();
        c.arg("stat").arg(&self.mnt).arg("--json");
        Ok(serde_json::from_str(&self.run(c, "alignfs stat")?)?)
    }

    fn fsck(&self) -> Result<()> {
        let mut c = self.alignfs();
        c.arg("fsck").args(self.devices());
        self.run(c, "alignfs fsck").map(drop)
    }
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

impl Harness {
    fn new(args: &Args, profile: Profile, work: &Path, shm: &Path) -> Result<Harness> {
        Ok(Harness {
            alignfs: std::fs::canonicalize(&args.alignfs).with_context(|| format!("{} (build it first)", args.alignfs.display()))?,
            // A memory-semantic SSD's DRAM is named as the fast tier, and sized by mkfs.
            fast: profile.devices().names_fast().then(|| shm.join("fast")),
            scrap_mem: profile.tunables().contains(&Tunable::ResidueMemory).then(|| args.fast_size.clone()),
            transport: args.transport.clone(),
            ssd: work.join("ssd.img"),
            mnt: work.join("mnt"),
            log: work.join("mount.log"),
        })
    }

    fn format(&self, args: &Args, profile: Profile) -> Result<()> {
        let mut mkfs = self.alignfs();
        mkfs.arg("mkfs").arg("--force").args(["--profile", &args.profile]).args(["--ssd", &format!("{}:1G", self.ssd.display())]);
        match &self.fast {
            Some(fast) if profile.devices() == alignfs::profile::DeviceKind::FastTierAndSsd => {
                mkfs.args(["--fast", &format!("{}:{}", fast.display(), args.fast_size)])
            }
            Some(fast) => mkfs.args(["--fast", &fast.display().to_string()]),
            None => &mut mkfs,
        };
        self.run(mkfs, "alignfs mkfs").map(drop)
    }
}

/// What the rounds add up to, for the closing line.
#[derive(Default)]
struct Tally {
    recovery_us: Vec<u64>,
    acknowledged: u64,
    in_flight_landed: u64,
    unsynced_losses: u64,
    older_namespaces: u64,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let seed = args.seed.unwrap_or_else(rand::random);
    println!("alignfs-crash: seed {seed} (replay with --seed {seed}), {} rounds", args.rounds);
    let mut rng = StdRng::seed_from_u64(seed);
    let (work, temporary) = match &args.work {
        Some(dir) => (dir.clone(), false),
        None => (tempdir()?, true),
    };
    let shm = PathBuf::from("/dev/shm").join(format!("alignfs-crash-{}", std::process::id()));
    std::fs::create_dir_all(&shm)?;
    let profile = Profile::parse(&args.profile)?;
    let harness = Harness::new(&args, profile, &work, &shm)?;
    harness.format(&args, profile)?;

    let mut model = if profile.promise() == Promise::OnSync { Model::volatile() } else { Model::default() };
    let mut tally = Tally::default();
    let started = Instant::now();
    for round in 0..args.rounds {
        crash_round(&harness, &mut model, &mut tally, rng.random(), rng.random_range(1..=args.max_run_ms))
            .with_context(|| format!("round {round} (seed {seed}; devices kept in {})", work.display()))?;
        if round % 20 == 19 {
            println!("  {} rounds, {} acknowledged operations, all present so far", round + 1, tally.acknowledged);
        }
    }
    harness.mount()?;
    model.verify(&harness.mnt.join("crash")).context("final check")?;
    let mut c = harness.alignfs();
    c.arg("umount").arg(&harness.mnt);
    harness.run(c, "alignfs umount")?;
    harness.fsck().context("fsck after the final clean unmount")?;
    let Tally { mut recovery_us, acknowledged, in_flight_landed, unsynced_losses, older_namespaces } = tally;
    recovery_us.sort_unstable();
    println!(
        "alignfs-crash: {} kill -9 rounds in {:.0} s: {acknowledged} acknowledged operations, 0 lost, 0 fsck errors; \
         {in_flight_landed} in-flight operations landed; {unsynced_losses} files came back without unsynced bytes \
         and {older_namespaces} crashes kept names from before unsynced namespace operations \
         (both allowed for scrap only, so always 0 for orch); recovery p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        args.rounds,
        started.elapsed().as_secs_f64(),
        percentile(&recovery_us, 0.5) as f64 / 1000.0,
        percentile(&recovery_us, 0.99) as f64 / 1000.0,
        recovery_us.last().copied().unwrap_or(0) as f64 / 1000.0
    );
    if temporary {
        let _ = std::fs::remove_dir_all(&work);
    }
    let _ = std::fs::remove_dir_all(&shm);
    Ok(())
}

/// One round: mount, check everything acknowledged before the last crash, run the
/// workload for `run_ms`, `kill -9` the daemon under it, and fsck what it left.
fn crash_round(harness: &Harness, model: &mut Model, tally: &mut Tally, worker_seed: u64, run_ms: u64) -> Result<()> {
    harness.mount()?;
    let stat = harness.stat()?;
    tally.recovery_us.push(stat["recovery_us"].as_u64().unwrap_or(0));
    let root = harness.mnt.join("crash");
    let Outcome { pending_landed, files_with_unsynced_loss, older_namespace } =
        model.verify(&root).context("acknowledged state lost after a crash")?;
    tally.in_flight_landed += u64::from(pending_landed);
    tally.unsynced_losses += files_with_unsynced_loss;
    tally.older_namespaces += u64::from(older_namespace);
    let pid = stat["daemon"]["pid"].as_u64().context("stat reports no daemon pid")? as i32;
    // Run the workload on its own thread; kill the daemon under it.
    let stop = Arc::new(AtomicBool::new(false));
    let worker = {
        let (stop, root) = (Arc::clone(&stop), root.clone());
        let mut worker_model = std::mem::take(model);
        std::thread::spawn(move || {
            let acked = worker_model.run(&root, worker_seed, &stop);
            (worker_model, acked)
        })
    };
    std::thread::sleep(Duration::from_millis(run_ms));
    // SAFETY: kill(2) with a pid we read from the daemon; no memory is involved.
    if unsafe { libc::kill(pid, libc::SIGKILL) } != 0 {
        bail!("kill -9 {pid}: {}", std::io::Error::last_os_error());
    }
    stop.store(true, Ordering::SeqCst);
    let (worker_model, acked) = worker.join().map_err(|_| anyhow::anyhow!("workload thread panicked"))?;
    *model = worker_model;
    tally.acknowledged += acked;
    wait_gone(pid)?;
    harness.fsck().context("fsck after the crash")
}

fn tempdir() -> Result<PathBuf> {
    let dir = PathBuf::from("/var/tmp").join(format!("alignfs-crash.{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// Wait until the killed daemon is gone: no /proc entry, or a zombie whose last thread
/// has exited (the leader turns zombie while other threads may still be closing files
/// and dropping the device lock).
fn wait_gone(pid: i32) -> Result<()> {
    let status = Path::new("/proc").join(pid.to_string()).join("status");
    for _ in 0..1000 {
        let Ok(text) = std::fs::read_to_string(&status) else { return Ok(()) };
        let field = |name: &str| text.lines().find_map(|l| l.strip_prefix(name)).map(str::trim);
        if field("State:").is_some_and(|s| s.starts_with('Z')) && field("Threads:") == Some("1") {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    bail!("daemon {pid} still running 10 s after kill -9")
}
