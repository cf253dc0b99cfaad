#![allow(clippy::unwrap_used)]
//! Power-loss images (DESIGN.md §8, docs/CRASH-CONSISTENCY.md).
//!
//! A workload runs on a volume whose fast tier and SSD record every store, persist, write
//! and flush. Afterwards, at every persistence point of that record, crash images are
//! built: what is durable there plus some of what was still volatile (unpersisted
//! fast-tier words, unflushed SSD sectors). Each image must open (recovery), pass fsck,
//! and hold exactly the acknowledged operations, with the one in flight either landed or
//! not (a write in flight may have landed byte by byte).
//!
//! Two drivers: random workloads, and an ACE-style enumeration of every sequence of one
//! or two operations (three with `ALIGNFS_EXHAUSTIVE_DEPTH=3`, the soak). Both run on an
//! `orch` volume, on a `scrap` volume (journal on the SSD, residue in DRAM), where the
//! rule is `scrap`'s: the names after some prefix of the operations no shorter than the
//! last sync's, every synced byte, and no byte that was never written, and on a
//! `byte` volume, whose memory-semantic SSD's DRAM (write log, TxLogs, map) and flash are
//! both recorded: every image first runs the device's recovery, then the volume's.

use std::collections::BTreeMap;
use std::sync::Arc;

use alignfs::device::mssd::{MemorySemanticSsd, MssdConfig, MssdOptions};
use alignfs::device::power_loss::{Event, PowerLog, RecordedSsd, Replay, Survival};
use alignfs::device::{BlockDevice, ByteTier, PmemRegion, SimSsd};
use alignfs::profile::DeviceKind;
use alignfs::profile::Promise;
use alignfs::test_support::Unsynced;
use alignfs::test_support::{scaled, seed};
use alignfs::volume::{FallocateMode, RenameFlags};
use alignfs::{Devices, FormatOptions, Geometry, Ino, Profile, Volume, VolumeOptions};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const FAST_BYTES: u64 = 512 << 10;
const SSD_BYTES: u64 = 8 << 20;
const BLOCK: u64 = 32 << 10;

/// A profile under test, and for `byte` whether its byte interface is on.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Case {
    profile: Profile,
    byte_interface: bool,
}

impl Case {
    const ORCH: Case = Case { profile: Profile::ORCH, byte_interface: true };
    const SCRAP: Case = Case { profile: Profile::SCRAP, byte_interface: true };
    const BYTE: Case = Case { profile: Profile::BYTE, byte_interface: true };
    /// The paper's baseline: the same volume on the block interface alone.
    const BLOCK_ONLY: Case = Case { profile: Profile::BYTE, byte_interface: false };

    fn name(&self) -> String {
        let suffix = if self.byte_interface { "" } else { " (block interface only)" };
        format!("{}{suffix}", self.profile.name())
    }

    fn options(&self) -> VolumeOptions {
        // 16 scrap pages of 64 KiB: writers of a `scrap` volume merge blocks to make room.
        // Writes of 96 KiB or more send their whole blocks straight to the SSD (in place
        // where the file owns them), so the workloads' larger writes take that path.
        VolumeOptions {
            background: false,
            scrap_mem_bytes: 1 << 20,
            request_threshold: (self.profile == Profile::SCRAP).then_some(96 << 10),
            byte_interface: self.byte_interface,
            ..VolumeOptions::default()
        }
    }

    fn geometry(&self) -> Geometry {
        if self.profile == Profile::SCRAP {
            Geometry { block_bytes: 64 << 10, page_bytes: 64 << 10, split_bytes: 64 << 10, io_workers: 2 }
        } else {
            self.profile.default_geometry()
        }
    }

    fn memory_semantic(&self) -> bool {
        self.profile.devices() == DeviceKind::MemorySemanticSsd
    }

    /// A small write log (1 MiB for 8 MiB of capacity), so that workloads clean it.
    fn mssd_config() -> MssdConfig {
        MssdConfig { log_bytes: 1 << 20, txlog_bytes: 16 << 10, pages_per_erase_block: 16, ..MssdConfig::new(SSD_BYTES) }
    }

    /// Cleaning runs on the storing thread, so each run records the same events, and
    /// starts as early as the device allows (a sixteenth of the log, 64 KiB), so that
    /// workloads of 60 operations clean it now and then.
    fn mssd_options() -> MssdOptions {
        MssdOptions { background_cleaning: false, clean_at_percent: 0, ..MssdOptions::default() }
    }

    /// (fast tier or device DRAM, SSD or flash) sizes in bytes.
    fn media_bytes(&self) -> (u64, u64) {
        if self.memory_semantic() {
            MemorySemanticSsd::sizes(&Case::mssd_config()).unwrap()
        } else {
            (FAST_BYTES, SSD_BYTES)
        }
    }
}

/// What a power cut leaves: the fast tier (for `byte`, the device's DRAM) and the SSD
/// (for `byte`, its flash).
struct Media {
    fast: Arc<PmemRegion>,
    ssd: Arc<dyn BlockDevice>,
}

impl Media {
    /// The volume's devices; for `byte`, the device opened (and recovered) on the media.
    fn devices(&self, case: Case) -> alignfs::Result<Devices> {
        let dram = Arc::clone(&self.fast) as Arc<dyn ByteTier>;
        if case.memory_semantic() {
            let (device, _) = MemorySemanticSsd::open(Arc::clone(&self.ssd), dram, Case::mssd_options())?;
            return Ok(Devices::memory_semantic(Arc::new(device)));
        }
        Ok(match case.profile.devices() {
            DeviceKind::FastTierAndSsd => Devices::new(dram, Arc::clone(&self.ssd)),
            _ => Devices::ssd_only(Arc::clone(&self.ssd)),
        })
    }

    fn format(&self, case: Case) {
        let format = FormatOptions { geometry: case.geometry(), profile: case.profile, ..FormatOptions::default() };
        if case.memory_semantic() {
            let dram = Arc::clone(&self.fast) as Arc<dyn ByteTier>;
            let device = MemorySemanticSsd::format(Arc::clone(&self.ssd), dram, &Case::mssd_config(), Case::mssd_options()).unwrap();
            Volume::format(&Devices::memory_semantic(Arc::new(device)), &format).unwrap();
        } else {
            Volume::format(&self.devices(case).unwrap(), &format).unwrap();
        }
    }

    fn open(&self, case: Case) -> alignfs::Result<Volume> {
        Volume::open(self.devices(case)?, case.options())
    }
}

#[derive(Clone, Debug)]
enum Op {
    Create(&'static str),
    Write {
        name: &'static str,
        offset: u64,
        len: u64,
        salt: u64,
    },
    Truncate {
        name: &'static str,
        size: u64,
    },
    /// Preallocate: zero blocks over the holes, and the size extended unless `keep_size`.
    Fallocate {
        name: &'static str,
        offset: u64,
        len: u64,
        keep_size: bool,
    },
    Link {
        from: &'static str,
        to: &'static str,
    },
    Unlink(&'static str),
    Rename {
        from: &'static str,
        to: &'static str,
    },
    Fsync(&'static str),
    Fdatasync(&'static str),
    Migrate,
    Checkpoint,
    /// Clean the memory-semantic SSD's write log (`byte`; nothing on other devices).
    CleanDeviceLog,
}

/// Bytes a write stores: distinct per write and never all zero.
fn payload(salt: u64, len: u64) -> Vec<u8> {
    let mut x = salt.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x as u8) | 1
        })
        .collect()
}

/// The namespace (one directory) and the files' contents the operations imply.
#[derive(Clone, Debug, Default, PartialEq)]
struct Model {
    names: BTreeMap<&'static str, u32>,
    files: BTreeMap<u32, Vec<u8>>,
    next_id: u32,
    /// What a crash may leave of each file when residue is volatile (`scrap`).
    unsynced: BTreeMap<u32, Unsynced>,
}

impl Model {
    /// Apply `op`; false if the file system must refuse it.
    fn apply(&mut self, op: &Op) -> bool {
        match *op {
            Op::Create(name) => {
                if self.names.contains_key(name) {
                    return false;
                }
                self.names.insert(name, self.next_id);
                self.files.insert(self.next_id, Vec::new());
                self.unsynced.insert(self.next_id, Unsynced::default());
                self.next_id += 1;
            }
            Op::Write { name, offset, len, salt } => {
                let Some(id) = self.names.get(name) else { return false };
                let file = self.files.get_mut(id).unwrap();
                let end = (offset + len) as usize;
                if file.len() < end {
                    file.resize(end, 0);
                }
                file[offset as usize..end].copy_from_slice(&payload(salt, len));
                let history = self.unsynced.get_mut(id).unwrap();
                history.touch(offset as usize, end, file.len());
                history.writes.push((offset as usize, payload(salt, len)));
            }
            Op::Truncate { name, size } => {
                let Some(id) = self.names.get(name) else { return false };
                let file = self.files.get_mut(id).unwrap();
                let old = file.len();
                file.resize(size as usize, 0);
                self.unsynced.get_mut(id).unwrap().touch(old.min(size as usize), old.max(size as usize), size as usize);
            }
            Op::Fallocate { name, offset, len, keep_size } => {
                let Some(id) = self.names.get(name) else { return false };
                let file = self.files.get_mut(id).unwrap();
                let (old, end) = (file.len(), (offset + len) as usize);
                if !keep_size && end > old {
                    file.resize(end, 0);
                    self.unsynced.get_mut(id).unwrap().touch(old, end, end);
                }
            }
            Op::Link { from, to } => {
                let Some(&id) = self.names.get(from) else { return false };
                if self.names.contains_key(to) {
                    return false;
                }
                self.names.insert(to, id);
            }
            Op::Unlink(name) => {
                let Some(id) = self.names.remove(name) else { return false };
                self.forget_if_unnamed(id);
            }
            Op::Rename { from, to } => {
                let Some(&id) = self.names.get(from) else { return false };
                if from == to || self.names.get(to) == Some(&id) {
                    return true;
                }
                self.names.remove(from);
                if let Some(replaced) = self.names.insert(to, id) {
                    self.forget_if_unnamed(replaced);
                }
            }
            Op::Fsync(name) | Op::Fdatasync(name) => {
                let Some(id) = self.names.get(name) else { return false };
                self.unsynced.insert(*id, Unsynced::synced(&self.files[id]));
            }
            Op::Migrate | Op::Checkpoint | Op::CleanDeviceLog => {}
        }
        true
    }

    fn forget_if_unnamed(&mut self, id: u32) {
        if !self.names.values().any(|&i| i == id) {
            self.files.remove(&id);
            self.unsynced.remove(&id);
        }
    }
}

fn lookup(volume: &Volume, name: &str) -> alignfs::Result<Ino> {
    volume.lookup(Ino::ROOT, name.as_bytes()).map(|a| a.ino)
}

fn run_op(volume: &Volume, device: Option<&MemorySemanticSsd>, op: &Op) -> alignfs::Result<()> {
    match *op {
        Op::Create(name) => volume.create_file(Ino::ROOT, name.as_bytes(), 0o644, 0, 0).map(drop),
        Op::Write { name, offset, len, salt } => volume.write(lookup(volume, name)?, offset, &payload(salt, len)).map(drop),
        Op::Truncate { name, size } => volume.truncate(lookup(volume, name)?, size),
        Op::Fallocate { name, offset, len, keep_size } => {
            volume.fallocate(lookup(volume, name)?, offset, len, FallocateMode::Allocate { keep_size })
        }
        Op::Link { from, to } => volume.link(lookup(volume, from)?, Ino::ROOT, to.as_bytes()).map(drop),
        Op::Unlink(name) => volume.unlink(Ino::ROOT, name.as_bytes()),
        Op::Rename { from, to } => volume.rename(Ino::ROOT, from.as_bytes(), Ino::ROOT, to.as_bytes(), RenameFlags::default()),
        Op::Fsync(name) | Op::Fdatasync(name) => volume.fsync(lookup(volume, name)?),
        Op::Migrate => volume.migrate_all().map(drop),
        Op::Checkpoint => volume.checkpoint(),
        Op::CleanDeviceLog => device.map_or(Ok(()), MemorySemanticSsd::clean),
    }
}

/// A recorded run: the events, where each operation started and ended in them, and the
/// model after each acknowledged operation (`models[k]` = after the first `k`).
struct Trace {
    events: Vec<Event>,
    setup_end: usize,
    ops: Vec<(Op, usize, usize)>,
    models: Vec<Model>,
    /// `k` for each `models[k]` that a sync made durable (an fsync, fdatasync or
    /// checkpoint that succeeded): where a store defers namespace ops, a crash after it
    /// keeps at least that state.
    synced: Vec<usize>,
    /// Write-log cleanings the memory-semantic SSD ran during the workload (`byte`).
    log_cleanings: u64,
}

fn record(case: Case, setup: &[Op], workload: &[Op]) -> Trace {
    let log = PowerLog::new();
    let (fast_bytes, ssd_bytes) = case.media_bytes();
    let media = Media {
        fast: Arc::new(PmemRegion::recorded(fast_bytes, Arc::clone(&log)).unwrap()),
        ssd: Arc::new(RecordedSsd::new(Arc::new(SimSsd::new(ssd_bytes)), Arc::clone(&log))),
    };
    media.format(case);
    let devices = media.devices(case).unwrap();
    let device = match &devices {
        Devices::MemorySemanticSsd { device } => Some(Arc::clone(device)),
        _ => None,
    };
    let volume = Volume::open(devices, case.options()).unwrap();
    let mut model = Model::default();
    for op in setup {
        assert!(model.apply(op));
        run_op(&volume, device.as_deref(), op).unwrap();
    }
    // The setup's namespace ops are durable before the workload starts, in every profile.
    volume.fsync(Ino::ROOT).unwrap();
    let setup_end = log.position();
    let cleanings_before = log_cleanings(&volume);
    let (mut ops, mut models, mut synced) = (Vec::new(), vec![model.clone()], Vec::new());
    for op in workload {
        let start = log.position();
        let expected = model.apply(op);
        let outcome = run_op(&volume, device.as_deref(), op);
        assert_eq!(outcome.is_ok(), expected, "{op:?}: the volume said {outcome:?}");
        ops.push((op.clone(), start, log.position()));
        models.push(model.clone());
        if outcome.is_ok() && matches!(op, Op::Fsync(_) | Op::Fdatasync(_) | Op::Checkpoint) {
            synced.push(models.len() - 1);
        }
    }
    let log_cleanings = log_cleanings(&volume) - cleanings_before;
    volume.simulate_crash();
    Trace { events: log.events(), setup_end, ops, models, synced, log_cleanings }
}

/// Cleanings of the memory-semantic SSD's write log so far (0 on other devices).
fn log_cleanings(volume: &Volume) -> u64 {
    volume.device_counters().iter().find(|c| c.name == "log_cleanings").map_or(0, |c| c.value)
}

/// What a recovered volume holds: name → (inode, contents).
type Observed = BTreeMap<String, (Ino, Vec<u8>)>;

fn observe(volume: &Volume) -> Result<Observed, String> {
    let mut seen = Observed::new();
    for entry in volume.readdir(Ino::ROOT).map_err(|e| format!("readdir: {e}"))? {
        let name = String::from_utf8_lossy(&entry.name).into_owned();
        if name == "." || name == ".." {
            continue;
        }
        let size = volume.getattr(entry.ino).map_err(|e| format!("getattr {name}: {e}"))?.size;
        let mut data = vec![0u8; size as usize];
        let n = volume.read(entry.ino, 0, &mut data).map_err(|e| format!("read {name}: {e}"))?;
        if n as u64 != size {
            return Err(format!("{name}: read {n} bytes of {size}"));
        }
        seen.insert(name, (entry.ino, data));
    }
    Ok(seen)
}

/// Decides whether the bytes found for a model file (by id) are right.
type ContentCheck<'a> = dyn Fn(u32, &[u8]) -> Result<(), String> + 'a;

/// Same names, same link structure; `content` decides whether a file's bytes are right.
fn compare(seen: &Observed, model: &Model, content: &ContentCheck) -> Result<(), String> {
    let expected: Vec<&str> = model.names.keys().copied().collect();
    let found: Vec<&str> = seen.keys().map(String::as_str).collect();
    if expected != found {
        return Err(format!("names {found:?}, expected {expected:?}"));
    }
    for (name, (ino, data)) in seen {
        let id = model.names[name.as_str()];
        content(id, data).map_err(|e| format!("{name}: {e}"))?;
        for (other, (other_ino, _)) in seen {
            if (ino == other_ino) != (model.names[other.as_str()] == id) {
                return Err(format!("{name} and {other}: links differ from the model"));
            }
        }
    }
    Ok(())
}

fn exact(model: &Model) -> impl Fn(u32, &[u8]) -> Result<(), String> + '_ {
    move |id, data| {
        let want = &model.files[&id];
        match data.iter().zip(want.iter()).position(|(a, b)| a != b) {
            _ if data.len() != want.len() => Err(format!("size {}, expected {}", data.len(), want.len())),
            Some(at) => Err(format!("byte {at} of {} differs", want.len())),
            None => Ok(()),
        }
    }
}

/// The state a crash at this point may leave: every acknowledged operation, and the one
/// in flight either applied or not; a write in flight may have landed in part.
fn acceptable(seen: &Observed, before: &Model, after: &Model, in_flight: Option<&Op>) -> Result<(), String> {
    let as_before = compare(seen, before, &exact(before));
    if as_before.is_ok() || compare(seen, after, &exact(after)).is_ok() {
        return Ok(());
    }
    let Some(Op::Write { name, .. }) = in_flight else { return as_before };
    let written = before.names[name];
    compare(seen, before, &|id, data: &[u8]| {
        if id != written {
            return exact(before)(id, data);
        }
        let (old, new) = (&before.files[&id], &after.files[&id]);
        if data.len() < old.len().min(new.len()) || data.len() > old.len().max(new.len()) {
            return Err(format!("size {} outside {}..={}", data.len(), old.len(), new.len()));
        }
        let old_at = |i: usize| old.get(i).copied().unwrap_or(0);
        match (0..data.len()).find(|&i| data[i] != old_at(i) && data[i] != new[i]) {
            Some(at) => Err(format!("byte {at} is neither old nor new (write in flight)")),
            None => Ok(()),
        }
    })
}

/// `scrap`'s rule: the names after some prefix of the operations no shorter than the last
/// sync's (`prefixes`, from the state that sync left to the acknowledged one; the
/// operation in flight landed or not), and each file's bytes within what its last sync
/// and the writes since allow.
fn acceptable_unsynced(seen: &Observed, prefixes: &[Model], after: &Model) -> Result<(), String> {
    let before = prefixes.last().expect("the acknowledged state");
    let check = |model: &Model| {
        compare(seen, model, &|id, data: &[u8]| {
            // The file's newest history; an fsync in flight may not have finished, so the
            // acknowledged state's looser one applies too. A file an older prefix still
            // names has its history there.
            let mut histories = [after, before, model].into_iter().filter_map(|m| m.unsynced.get(&id));
            let first = histories.next().map_or(Err("no history".to_string()), |h| h.check(data));
            histories.fold(first, |verdict, h| verdict.or_else(|_| h.check(data)))
        })
    };
    let newest = check(after);
    if newest.is_ok() {
        return newest;
    }
    prefixes.iter().rev().map(check).find(Result::is_ok).unwrap_or(newest)
}

#[derive(Default)]
struct Tally {
    points: u64,
    images: u64,
    in_flight: u64,
    log_cleanings: u64,
}

/// Check crash images at every persistence point after the setup; `survivals` lists the
/// images per point.
fn verify(case: Case, trace: &Trace, survivals: &[Survival], rng: &mut StdRng, what: &str) -> Tally {
    let (fast_bytes, ssd_bytes) = case.media_bytes();
    let mut replay = Replay::new(fast_bytes, ssd_bytes);
    let mut tally = Tally::default();
    let points = trace.events.iter().enumerate().filter(|(_, e)| e.is_persistence_point()).map(|(i, _)| i).chain([trace.events.len()]);
    for point in points.filter(|&p| p >= trace.setup_end) {
        while replay.position() < point {
            replay.apply(&trace.events[replay.position()]);
        }
        let acked = trace.ops.iter().take_while(|(_, _, end)| *end <= point).count();
        let in_flight = trace.ops.get(acked).filter(|(_, start, _)| *start < point).map(|(op, _, _)| op);
        let after = if in_flight.is_some() { &trace.models[acked + 1] } else { &trace.models[acked] };
        tally.points += 1;
        tally.in_flight += u64::from(in_flight.is_some());
        for &survival in survivals {
            let image = replay.image(survival, &mut |p| rng.random_bool(p));
            let media =
                Media { fast: Arc::new(PmemRegion::anonymous(fast_bytes).unwrap()), ssd: Arc::new(SimSsd::with_contents(image.ssd)) };
            media.fast.write(0, &image.fast);
            let context = || {
                format!(
                    "{what}: crash before event {point} of {}, {acked} ops acknowledged, in flight {in_flight:?}, survival {survival:?}",
                    trace.events.len()
                )
            };
            let volume = media.open(case).unwrap_or_else(|e| panic!("{}: recovery failed: {e}", context()));
            let problems = volume.check();
            assert!(problems.is_empty(), "{}: fsck found {problems:?}", context());
            let seen = observe(&volume).unwrap_or_else(|e| panic!("{}: {e}", context()));
            let verdict = match case.profile.promise() {
                Promise::OnWrite => acceptable(&seen, &trace.models[acked], after, in_flight),
                Promise::OnSync => {
                    let synced = trace.synced.iter().copied().filter(|&k| k <= acked).max().unwrap_or(0);
                    acceptable_unsynced(&seen, &trace.models[synced..=acked], after)
                }
            };
            if let Err(e) = verdict {
                panic!("{}: {e}", context());
            }
            tally.images += 1;
            // Now and then, keep using the recovered volume: its allocators must agree
            // with what the maps hold, so new writes land and a clean reopen matches.
            if tally.images % 16 == 0 {
                let file = volume.create_file(Ino::ROOT, b"after-recovery", 0o644, 0, 0).unwrap().ino;
                volume.write(file, 5, &payload(7, 3 * BLOCK)).unwrap();
                let before_close = observe(&volume).unwrap();
                volume.close().unwrap();
                let reopened = media.open(case).unwrap();
                assert!(reopened.check().is_empty(), "{}: fsck after reuse", context());
                assert!(observe(&reopened).unwrap() == before_close, "{}: reopen after reuse differs", context());
            } else {
                volume.simulate_crash();
            }
        }
    }
    tally
}

const NAMES: [&str; 4] = ["a", "b", "c", "d"];

fn random_op(rng: &mut StdRng, salt: u64) -> Op {
    let name = NAMES[rng.random_range(0..NAMES.len())];
    let other = NAMES[rng.random_range(0..NAMES.len())];
    let len = match rng.random_range(0..5) {
        0 => rng.random_range(1..=100),
        1 => rng.random_range(1..=8192),
        2 => BLOCK,
        3 => rng.random_range(BLOCK - 100..=2 * BLOCK + 100),
        _ => rng.random_range(1..=200_000),
    };
    let offset = match rng.random_range(0..3) {
        0 => rng.random_range(0..8) * BLOCK,
        _ => rng.random_range(0..300_000),
    };
    match rng.random_range(0..100) {
        0..=44 => Op::Write { name, offset, len, salt },
        45..=54 => Op::Create(name),
        55..=58 => Op::Truncate { name, size: rng.random_range(0..300_000) },
        59..=61 => Op::Fallocate { name, offset, len, keep_size: rng.random() },
        62..=66 => Op::Link { from: name, to: other },
        67..=73 => Op::Unlink(name),
        74..=81 => Op::Rename { from: name, to: other },
        82..=87 => Op::Fsync(name),
        88..=91 => Op::Fdatasync(name),
        92..=95 => Op::Migrate,
        96..=97 => Op::Checkpoint,
        _ => Op::CleanDeviceLog,
    }
}

#[test]
fn random_workloads_survive_every_power_loss_image() {
    let seed = seed("power_loss::random_workloads_survive_every_power_loss_image");
    let mut rng = StdRng::seed_from_u64(seed);
    let survivals = [
        Survival { fast_word: 0.0, ssd_sector: 0.0 },
        Survival { fast_word: 0.5, ssd_sector: 0.5 },
        Survival { fast_word: 1.0, ssd_sector: 1.0 },
    ];
    for case in [Case::ORCH, Case::SCRAP, Case::BYTE, Case::BLOCK_ONLY] {
        let mut total = Tally::default();
        // Writes that stay in DRAM leave no persistence point: `scrap` needs more rounds;
        // `byte` fills its device's write log about once in two rounds.
        let rounds = match case {
            Case::SCRAP => scaled(12),
            Case::BYTE => scaled(8),
            _ => scaled(4),
        };
        for round in 0..rounds {
            let setup = [Op::Create("a"), Op::Create("b")];
            let workload: Vec<Op> = (0..60).map(|i| random_op(&mut rng, round * 1000 + i)).collect();
            let trace = record(case, &setup, &workload);
            let tally = verify(case, &trace, &survivals, &mut rng, &format!("{} round {round} (seed {seed})", case.name()));
            total.points += tally.points;
            total.images += tally.images;
            total.in_flight += tally.in_flight;
            total.log_cleanings += trace.log_cleanings;
        }
        eprintln!(
            "power loss, random workloads, {}: {} crash points, {} images ({} with an operation in flight, {} device log cleanings), all recovered and checked",
            case.name(),
            total.points,
            total.images,
            total.in_flight,
            total.log_cleanings
        );
        assert!(total.images >= 500, "too few images ({}) to mean much", total.images);
        if case == Case::BYTE {
            assert!(total.log_cleanings > 0, "the workloads never cleaned the device's write log: crashes during cleaning are untested");
        }
    }
}

/// `scrap` overwrites a file's own blocks in place and flushes them at its fsync: a
/// crash before the fsync may leave any mix of old and new bytes, one after it the new.
#[test]
fn overwrites_in_place_survive_power_loss_once_synced() {
    let seed = seed("power_loss::overwrites_in_place_survive_power_loss_once_synced");
    let mut rng = StdRng::seed_from_u64(seed);
    let survivals = [
        Survival { fast_word: 0.0, ssd_sector: 0.0 },
        Survival { fast_word: 1.0, ssd_sector: 1.0 },
        Survival { fast_word: 0.5, ssd_sector: 0.5 },
    ];
    // Four whole blocks, on the SSD and synced; then the same range again, in place.
    let setup = [Op::Create("a"), Op::Write { name: "a", offset: 0, len: 256 << 10, salt: 1 }, Op::Fsync("a")];
    let workload = [
        Op::Write { name: "a", offset: 0, len: 256 << 10, salt: 2 },
        Op::Fsync("a"),
        Op::Write { name: "a", offset: 64 << 10, len: 128 << 10, salt: 3 },
        Op::Fdatasync("a"),
    ];
    let trace = record(Case::SCRAP, &setup, &workload);
    let tally = verify(Case::SCRAP, &trace, &survivals, &mut rng, &format!("scrap overwrites in place (seed {seed})"));
    assert!(tally.images > 0);
}

/// The operations the enumeration draws from, ACE's set on a small volume: writes that
/// are aligned, unaligned, appending and block-crossing; truncates down and up; and the
/// namespace operations, over two files that exist beforehand and one that does not.
fn alphabet() -> Vec<Op> {
    vec![
        Op::Write { name: "a", offset: 100, len: 5000, salt: 1 },
        Op::Write { name: "a", offset: BLOCK, len: BLOCK, salt: 2 },
        Op::Write { name: "a", offset: 70_000, len: 3000, salt: 3 },
        Op::Write { name: "b", offset: BLOCK - 10, len: BLOCK + 20, salt: 4 },
        Op::Truncate { name: "a", size: 1000 },
        Op::Truncate { name: "b", size: 100_000 },
        Op::Create("c"),
        Op::Link { from: "a", to: "c" },
        Op::Unlink("a"),
        Op::Rename { from: "a", to: "b" },
        Op::Rename { from: "b", to: "c" },
        Op::Fsync("a"),
        Op::Fdatasync("b"),
        Op::Migrate,
    ]
}

fn sequences(depth: usize) -> Vec<Vec<Op>> {
    let alphabet = alphabet();
    let mut all: Vec<Vec<Op>> = vec![Vec::new()];
    let mut frontier = all.clone();
    for _ in 0..depth {
        frontier = frontier.iter().flat_map(|s| alphabet.iter().map(move |op| [s.clone(), vec![op.clone()]].concat())).collect();
        all.extend(frontier.iter().cloned());
    }
    all.remove(0);
    all
}

#[test]
fn every_short_operation_sequence_survives_power_loss_at_every_point() {
    let depth: usize = std::env::var("ALIGNFS_EXHAUSTIVE_DEPTH").ok().and_then(|d| d.parse().ok()).unwrap_or(2);
    let seed = seed("power_loss::every_short_operation_sequence_survives_power_loss_at_every_point");
    let mut rng = StdRng::seed_from_u64(seed);
    // "a" has a whole SSD block and residue in fast pages; "b" only residue.
    let setup = [
        Op::Create("a"),
        Op::Write { name: "a", offset: 0, len: BLOCK + 6000, salt: 10 },
        Op::Create("b"),
        Op::Write { name: "b", offset: 0, len: 40_000, salt: 11 },
        Op::Checkpoint,
        Op::Write { name: "a", offset: 50, len: 300, salt: 12 },
    ];
    let survivals = [
        Survival { fast_word: 0.0, ssd_sector: 0.0 },
        Survival { fast_word: 1.0, ssd_sector: 1.0 },
        Survival { fast_word: 0.5, ssd_sector: 0.5 },
    ];
    let all = sequences(depth);
    for case in [Case::ORCH, Case::SCRAP, Case::BYTE] {
        let mut total = Tally::default();
        for (k, sequence) in all.iter().enumerate() {
            let trace = record(case, &setup, sequence);
            let tally = verify(case, &trace, &survivals, &mut rng, &format!("{} sequence {sequence:?} (seed {seed})", case.name()));
            total.points += tally.points;
            total.images += tally.images;
            if depth > 2 && k % 500 == 499 {
                eprintln!("  {}: {} of {} sequences, {} images", case.name(), k + 1, all.len(), total.images);
            }
        }
        eprintln!(
            "power loss, {}, every sequence of 1..={depth} operations from {} kinds: {} sequences, {} crash points, {} images, all recovered and checked",
            case.name(),
            alphabet().len(),
            all.len(),
            total.points,
            total.images
        );
    }
}
