//! What the mount must hold: the acknowledged files and directories of one directory,
//! plus the one operation that was in flight when the daemon died.
//!
//! With a volatile residue store (`scrap`) file data is durable only once fsynced: after
//! a crash each file must hold its synced bytes, and every byte changed since its last
//! sync may read as its synced value, as any value written there since, or as zero.
//! Names and directories follow buffered I/O's promise there: after a crash they are as
//! after some prefix of the acknowledged operations, no shorter than the last fsync's
//! (of a file, or of the directory after a rename). `orch` journals them before the call
//! returns.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use alignfs::test_support::Unsynced;
use anyhow::{bail, Result};
use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};

const FILE_NAMES: usize = 24;
const DIR_NAMES: usize = 4;
const MAX_FILE: u64 = 6 << 20;

#[derive(Clone, Debug)]
enum Pending {
    Write { name: String, offset: u64, data: Vec<u8> },
    Truncate { name: String, size: u64 },
    Create { name: String },
    Unlink { name: String },
    Rename { from: String, to: String },
    Mkdir { name: String },
    Rmdir { name: String },
}

#[derive(Default)]
pub struct Model {
    files: BTreeMap<String, Vec<u8>>,
    dirs: BTreeSet<String>,
    pending: Option<Pending>,
    /// `scrap`: what each file may hold after a crash (`None`: every acknowledged byte).
    unsynced: Option<BTreeMap<String, Unsynced>>,
    /// `scrap`: the names after each operation since the last fsync; a crash keeps one.
    since_sync: Vec<Names>,
    /// `scrap`: the histories of files unlinked since the last fsync, in case a crash
    /// brings one back.
    unlinked: BTreeMap<String, Unsynced>,
    /// Every operation so far, for the report of a failure.
    history: History,
}

/// What ran, kept to explain a failure: a line per operation and crash, and the bytes of
/// recent small writes, so that bytes found where nobody wrote them can be traced to the
/// write that made them.
#[derive(Default)]
struct History {
    lines: Vec<String>,
    small_writes: std::collections::VecDeque<(usize, String, u64, Vec<u8>)>,
}

/// Small writes whose bytes the history keeps.
const KEPT_WRITES: usize = 20_000;

impl History {
    fn note(&mut self, line: String) {
        self.lines.push(line);
    }

    fn wrote(&mut self, name: &str, offset: u64, data: &[u8]) {
        if data.len() <= 4096 {
            if self.small_writes.len() == KEPT_WRITES {
                self.small_writes.pop_front();
            }
            self.small_writes.push_back((self.lines.len(), name.to_string(), offset, data.to_vec()));
        }
    }

    /// Where the bytes `found` (read from `file`) came from, and what happened to the
    /// files involved since.
    fn explain(&self, file: &str, found: &[u8]) -> String {
        let mut out = String::new();
        let mut names = vec![file.to_string()];
        let mut since = self.lines.len().saturating_sub(40);
        if found.len() >= 8 {
            for (op, name, offset, data) in &self.small_writes {
                if let Some(pos) = data.windows(found.len()).position(|w| w == found) {
                    let into = *offset as usize + pos;
                    out += &format!("\n  those bytes were written to {name} at {into} by operation {op} (of {})", self.lines.len());
                    if !names.contains(name) {
                        names.push(name.clone());
                    }
                    since = since.min(*op);
                }
            }
            if out.is_empty() {
                out += &format!("\n  no small write of the last {} held those bytes", self.small_writes.len());
            }
        }
        // A name a file was renamed to names its earlier history too.
        for line in self.lines[since..].iter().rev() {
            let words: Vec<&str> = line.split_whitespace().collect();
            if let ["rename", from, "->", to] = words[..] {
                if names.iter().any(|n| n == to) && !names.iter().any(|n| n == from) {
                    names.push(from.to_string());
                }
            }
        }
        out += &format!("\n  operations since {since} on {} and crashes:", names.join(", "));
        for (i, line) in self.lines.iter().enumerate().skip(since) {
            if line.starts_with("crash") || names.iter().any(|n| line.split_whitespace().any(|w| w == n)) {
                out += &format!("\n    {i}: {line}");
            }
        }
        out
    }
}

pub struct Outcome {
    pub pending_landed: bool,
    /// `scrap`: files that came back without some unsynced bytes (allowed).
    pub files_with_unsynced_loss: u64,
    /// `scrap`: the crash kept an older namespace than the acknowledged one.
    pub older_namespace: bool,
}

/// Directories and file names.
type Names = (BTreeSet<String>, BTreeSet<String>);

fn names(s: &Snapshot) -> Names {
    (s.dirs.clone(), s.files.keys().cloned().collect())
}

/// Files and directories actually in `root`.
#[derive(PartialEq, Eq)]
struct Snapshot {
    files: BTreeMap<String, Vec<u8>>,
    dirs: BTreeSet<String>,
}

fn snapshot(root: &Path) -> Result<Snapshot> {
    let mut files = BTreeMap::new();
    let mut dirs = BTreeSet::new();
    if !root.exists() {
        return Ok(Snapshot { files, dirs });
    }
    for entry in fs::read_dir(root)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if entry.file_type()?.is_dir() {
            dirs.insert(name);
        } else {
            let mut bytes = Vec::new();
            File::open(entry.path())?.read_to_end(&mut bytes)?;
            files.insert(name, bytes);
        }
    }
    Ok(Snapshot { files, dirs })
}

fn describe_difference(expected: &BTreeMap<String, Vec<u8>>, actual: &BTreeMap<String, Vec<u8>>) -> String {
    for (name, want) in expected {
        match actual.get(name) {
            None => return format!("file {name} ({} bytes) is missing", want.len()),
            Some(got) if got.len() != want.len() => return format!("file {name} has {} bytes, expected {}", got.len(), want.len()),
            Some(got) if got != want => {
                let at = got.iter().zip(want).position(|(a, b)| a != b).unwrap_or(0);
                return format!("file {name} differs first at byte {at}");
            }
            Some(_) => {}
        }
    }
    match actual.keys().find(|n| !expected.contains_key(*n)) {
        Some(extra) => format!("unexpected file {extra}"),
        None => "directories differ".into(),
    }
}

fn describe_op(op: &Pending) -> String {
    match op {
        Pending::Write { name, offset, data } => format!("write {name} {offset}+{}", data.len()),
        other => format!("{other:?}"),
    }
}

impl Model {
    /// A model for a volume whose unsynced data may be lost in a crash (`scrap`).
    pub fn volatile() -> Model {
        Model { unsynced: Some(BTreeMap::new()), since_sync: vec![Names::default()], ..Model::default() }
    }

    /// After `op` was acknowledged: the namespace states a crash may keep. Creates and
    /// renames end with an fsync (of the file, of the directory), and so do some writes.
    fn note_namespace(&mut self, op: &Pending, synced: bool) {
        if self.unsynced.is_none() {
            return;
        }
        let now = names(&self.state());
        if synced || matches!(op, Pending::Create { .. } | Pending::Rename { .. }) {
            self.since_sync = vec![now];
            self.unlinked.clear();
        } else if self.since_sync.last() != Some(&now) {
            self.since_sync.push(now);
        }
    }

    /// Before running `op`: what it may change in a crash-volatile file.
    fn record(&mut self, op: &Pending) {
        let Some(unsynced) = &mut self.unsynced else { return };
        match op {
            Pending::Write { name, offset, data } => {
                let size = self.files.get(name).map_or(0, Vec::len).max(*offset as usize + data.len());
                let history = unsynced.entry(name.clone()).or_default();
                history.touch(*offset as usize, *offset as usize + data.len(), size);
                history.writes.push((*offset as usize, data.clone()));
            }
            Pending::Truncate { name, size } => {
                let old = self.files.get(name).map_or(0, Vec::len);
                let size = *size as usize;
                unsynced.entry(name.clone()).or_default().touch(old.min(size), old.max(size), size);
            }
            _ => {}
        }
    }

    /// After `op` was acknowledged (or found landed after a crash): names move.
    fn settle(&mut self, op: &Pending, synced: bool) {
        let Some(unsynced) = &mut self.unsynced else { return };
        match op {
            Pending::Create { name } => {
                unsynced.insert(name.clone(), Unsynced::default());
            }
            Pending::Unlink { name } => {
                unsynced.remove(name);
            }
            Pending::Rename { from, to } => {
                if let Some(history) = unsynced.remove(from) {
                    unsynced.insert(to.clone(), history);
                }
            }
            Pending::Write { name, .. } if synced => {
                unsynced.insert(name.clone(), Unsynced::synced(&self.files[name]));
            }
            _ => {}
        }
    }

    fn state(&self) -> Snapshot {
        Snapshot { files: self.files.clone(), dirs: self.dirs.clone() }
    }

    /// The state with the pending operation applied.
    fn with_pending(&self) -> Option<Snapshot> {
        let mut s = self.state();
        match self.pending.as_ref()? {
            Pending::Write { name, offset, data } => {
                let file = s.files.entry(name.clone()).or_default();
                let end = *offset as usize + data.len();
                if file.len() < end {
                    file.resize(end, 0);
                }
                file[*offset as usize..end].copy_from_slice(data);
            }
            Pending::Truncate { name, size } => {
                s.files.entry(name.clone()).or_default().resize(*size as usize, 0);
            }
            Pending::Create { name } => {
                s.files.insert(name.clone(), Vec::new());
            }
            Pending::Unlink { name } => {
                s.files.remove(name);
            }
            Pending::Rename { from, to } => {
                if let Some(data) = s.files.remove(from) {
                    s.files.insert(to.clone(), data);
                }
            }
            Pending::Mkdir { name } => {
                s.dirs.insert(name.clone());
            }
            Pending::Rmdir { name } => {
                s.dirs.remove(name);
            }
        }
        Some(s)
    }

    /// Whether `actual` is the state before the pending write with any subset of its
    /// bytes landed (and the size anywhere from old to new).
    fn partial_write_matches(&self, actual: &Snapshot, after: &Snapshot) -> bool {
        let Some(Pending::Write { name, offset, data }) = &self.pending else { return false };
        if actual.dirs != self.dirs || actual.files.len() != after.files.len() {
            return false;
        }
        let others_match = actual.files.iter().all(|(n, bytes)| n == name || self.files.get(n) == Some(bytes));
        let (Some(got), Some(new)) = (actual.files.get(name), after.files.get(name)) else { return false };
        let old = self.files.get(name).cloned().unwrap_or_default();
        // The kernel splits a large write into several requests, so the size may have
        // grown by any of them.
        if !others_match || got.len() < old.len().min(new.len()) || got.len() > old.len().max(new.len()) {
            return false;
        }
        let range = *offset as usize..*offset as usize + data.len();
        got.iter().enumerate().all(|(i, &b)| {
            let before = old.get(i).copied().unwrap_or(0);
            b == before || (range.contains(&i) && b == new[i])
        })
    }

    /// Check the mount against the model and adopt what is there.
    pub fn verify(&mut self, root: &Path) -> Result<Outcome> {
        if self.unsynced.is_some() {
            return self.verify_volatile(root);
        }
        let actual = snapshot(root)?;
        let before = self.state();
        let after = self.with_pending();
        let landed = if actual == before {
            false
        } else if after.as_ref().is_some_and(|a| *a == actual || self.partial_write_matches(&actual, a)) {
            true
        } else {
            bail!(
                "{} (in flight at the crash: {:?})",
                if actual.dirs != before.dirs { "directories differ".into() } else { describe_difference(&before.files, &actual.files) },
                self.pending.as_ref().map(describe_op)
            );
        };
        self.files = actual.files;
        self.dirs = actual.dirs;
        self.pending = None;
        Ok(Outcome { pending_landed: landed, files_with_unsynced_loss: 0, older_namespace: false })
    }

    /// [`Model::verify`] for a volatile residue store: names exactly as acknowledged (the
    /// one in flight may have landed), file data within what a crash may leave.
    fn verify_volatile(&mut self, root: &Path) -> Result<Outcome> {
        let actual = snapshot(root)?;
        self.history.note(format!("crash (in flight: {:?})", self.pending.as_ref().map(describe_op)));
        let found = names(&actual);
        let mut older_namespace = false;
        let landed = if self.with_pending().is_some_and(|after| names(&after) == found) && names(&self.state()) != found {
            true
        } else if let Some(prefix) = self.since_sync.iter().rposition(|state| *state == found) {
            // An older prefix: the operations after it were not committed yet.
            older_namespace = prefix + 1 < self.since_sync.len();
            false
        } else {
            bail!(
                "names after the crash are none of the {} states since the last fsync: found {found:?}, acknowledged {:?} (in flight: {:?})",
                self.since_sync.len(),
                names(&self.state()),
                self.pending.as_ref().map(describe_op)
            );
        };
        if let (true, Some(op)) = (landed, self.pending.clone()) {
            self.settle(&op, false);
        }
        let acknowledged = if landed { self.with_pending().map(|s| s.files).unwrap_or_default() } else { self.files.clone() };
        let unsynced = self.unsynced.as_mut().expect("volatile model");
        // A file an older prefix still names is back with the history it had.
        for (name, history) in std::mem::take(&mut self.unlinked) {
            if actual.files.contains_key(&name) && !acknowledged.contains_key(&name) {
                unsynced.insert(name, history);
            }
        }
        let mut files_with_unsynced_loss = 0;
        for (name, got) in &actual.files {
            files_with_unsynced_loss += u64::from(acknowledged.get(name).is_some_and(|want| want != got));
            let history = unsynced.entry(name.clone()).or_default();
            if let Err((at, problem)) = history.check_at(got) {
                let explained = at.map(|at| self.history.explain(name, &got[at..got.len().min(at + 16)])).unwrap_or_default();
                bail!("file {name}: {problem} (in flight: {:?}){explained}", self.pending.as_ref().map(describe_op));
            }
            *history = Unsynced::synced(got);
        }
        self.since_sync = vec![names(&actual)];
        self.files = actual.files;
        self.dirs = actual.dirs;
        self.pending = None;
        Ok(Outcome { pending_landed: landed, files_with_unsynced_loss, older_namespace })
    }

    /// Run random operations until one fails (the daemon died) or `stop`. Returns how
    /// many were acknowledged; the failed one stays pending.
    pub fn run(&mut self, root: &Path, seed: u64, stop: &AtomicBool) -> u64 {
        let mut rng = StdRng::seed_from_u64(seed);
        if fs::create_dir_all(root).is_err() {
            return 0;
        }
        let mut acked = 0;
        while !stop.load(Ordering::SeqCst) {
            let Some(op) = self.next_op(&mut rng) else { continue };
            self.pending = Some(op.clone());
            self.record(&op);
            if let Pending::Write { name, offset, data } = &op {
                self.history.wrote(name, *offset, data);
            }
            match self.execute(root, &op, &mut rng) {
                Ok(synced) => {
                    let sized = |name: &str| self.files.get(name).map_or(0, Vec::len);
                    let line = match &op {
                        Pending::Write { name, .. } => {
                            format!("{} (size {} before){}", describe_op(&op), sized(name), if synced { ", fdatasync" } else { "" })
                        }
                        Pending::Truncate { name, size } => format!("truncate {name} {} -> {size}", sized(name)),
                        Pending::Create { name } => format!("create {name}"),
                        Pending::Unlink { name } => format!("unlink {name}"),
                        Pending::Rename { from, to } => format!("rename {from} -> {to}"),
                        Pending::Mkdir { name } => format!("mkdir {name}"),
                        Pending::Rmdir { name } => format!("rmdir {name}"),
                    };
                    self.history.note(line);
                    if let (Pending::Unlink { name }, Some(unsynced)) = (&op, &self.unsynced) {
                        if let Some(history) = unsynced.get(name) {
                            self.unlinked.insert(name.clone(), history.clone());
                        }
                    }
                    if let Some(after) = self.with_pending() {
                        self.files = after.files;
                        self.dirs = after.dirs;
                    }
                    self.settle(&op, synced);
                    self.note_namespace(&op, synced);
                    self.pending = None;
                    acked += 1;
                }
                Err(_) => return acked,
            }
        }
        acked
    }

    fn next_op(&self, rng: &mut StdRng) -> Option<Pending> {
        let file = |rng: &mut StdRng| format!("f{}", rng.random_range(0..FILE_NAMES));
        let existing = |rng: &mut StdRng| {
            let names: Vec<&String> = self.files.keys().collect();
            (!names.is_empty()).then(|| names[rng.random_range(0..names.len())].clone())
        };
        Some(match rng.random_range(0..100) {
            0..=54 => {
                let name = existing(rng)?;
                let len = self.files[&name].len() as u64;
                let size = match rng.random_range(0..10) {
                    0..=4 => rng.random_range(1..=4096),
                    5..=7 => rng.random_range(4096..=256 << 10),
                    _ => rng.random_range(256 << 10..=2 << 20),
                };
                let offset = rng.random_range(0..=len + (64 << 10)).min(MAX_FILE - size);
                let mut data = vec![0u8; size as usize];
                rng.fill_bytes(&mut data);
                Pending::Write { name, offset, data }
            }
            55..=64 => {
                let name = file(rng);
                if self.files.contains_key(&name) {
                    return None;
                }
                Pending::Create { name }
            }
            65..=72 => {
                let name = existing(rng)?;
                let len = self.files[&name].len() as u64;
                Pending::Truncate { name, size: rng.random_range(0..=len + (100 << 10)).min(MAX_FILE) }
            }
            73..=79 => Pending::Unlink { name: existing(rng)? },
            80..=91 => Pending::Rename { from: existing(rng)?, to: file(rng) },
            _ => {
                let name = format!("d{}", rng.random_range(0..DIR_NAMES));
                if self.dirs.contains(&name) {
                    Pending::Rmdir { name }
                } else {
                    Pending::Mkdir { name }
                }
            }
        })
    }

    /// Run `op`; `true` if it ended with an fsync of the file it wrote.
    fn execute(&self, root: &Path, op: &Pending, rng: &mut StdRng) -> io::Result<bool> {
        match op {
            Pending::Write { name, offset, data } => {
                let file = OpenOptions::new().write(true).open(root.join(name))?;
                file.write_all_at(data, *offset)?;
                // Every few writes, an fsync: `orch` has nothing left to do, `scrap` makes
                // the file durable.
                let sync = rng.random_range(0..4) == 0;
                if sync {
                    file.sync_data()?;
                }
                Ok(sync)
            }
            Pending::Truncate { name, size } => OpenOptions::new().write(true).open(root.join(name))?.set_len(*size).map(|()| false),
            Pending::Create { name } => {
                OpenOptions::new().write(true).create_new(true).mode(0o644).open(root.join(name))?.sync_all().map(|()| false)
            }
            Pending::Unlink { name } => fs::remove_file(root.join(name)).map(|()| false),
            Pending::Rename { from, to } => {
                fs::rename(root.join(from), root.join(to))?;
                File::open(root)?.sync_all().map(|()| false)
            }
            Pending::Mkdir { name } => fs::create_dir(root.join(name)).map(|()| false),
            Pending::Rmdir { name } => fs::remove_dir(root.join(name)).map(|()| false),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model_with_pending_write() -> Model {
        let mut model = Model::default();
        model.files.insert("a".into(), vec![1; 10]);
        model.files.insert("b".into(), vec![7; 3]);
        model.pending = Some(Pending::Write { name: "a".into(), offset: 5, data: vec![2; 10] });
        model
    }

    fn check(files: &[(&str, Vec<u8>)]) -> Result<Outcome> {
        let dir = std::env::temp_dir().join(format!("alignfs-crash-model-{}-{}", std::process::id(), rand::random::<u32>()));
        fs::create_dir_all(&dir)?;
        for (name, bytes) in files {
            fs::write(dir.join(name), bytes)?;
        }
        let result = model_with_pending_write().verify(&dir);
        fs::remove_dir_all(&dir)?;
        result
    }

    #[test]
    fn a_failure_names_the_write_that_made_the_stray_bytes() {
        let mut history = History::default();
        history.note("create f1".into());
        history.wrote("f2", 100, b"0123456789abcdef");
        history.note("write f2 100+16".into());
        history.note("truncate f1 0 -> 50".into());
        history.note("crash (in flight: None)".into());
        history.note("rename f3 -> f1".into());
        let report = history.explain("f1", b"456789ab");
        assert!(report.contains("4: rename f3 -> f1"), "{report}");
        assert!(report.contains("written to f2 at 104 by operation 1"), "{report}");
        assert!(report.contains("2: truncate f1") && report.contains("1: write f2") && report.contains("3: crash"), "{report}");
        assert!(history.explain("f1", b"zzzzzzzz").contains("no small write"));
    }

    #[test]
    fn the_write_in_flight_may_land_wholly_partly_or_not_at_all() {
        let b = ("b", vec![7; 3]);
        assert!(!check(&[("a", vec![1; 10]), b.clone()]).unwrap().pending_landed);
        let mut after = vec![1; 5];
        after.extend([2; 10]);
        assert!(check(&[("a", after), b.clone()]).unwrap().pending_landed);
        // Bytes 5..8 landed and the size grew to 12 (a first request of a split write).
        let partial = [vec![1; 5], vec![2; 3], vec![1; 2], vec![0; 2]].concat();
        assert!(check(&[("a", partial), b.clone()]).is_ok());
    }

    #[test]
    fn unsynced_bytes_may_vanish_but_never_change_into_others() {
        let mut history = Unsynced::synced(&[1; 10]);
        history.touch(5, 15, 15);
        history.writes.push((5, vec![2; 10]));
        assert_eq!(history.check(&[1; 10]), Ok(()), "the unsynced write lost");
        assert_eq!(history.check(&[vec![1; 5], vec![2; 10]].concat()), Ok(()), "kept");
        assert_eq!(history.check(&[vec![1; 5], vec![0; 3], vec![2; 7]].concat()), Ok(()), "partly lost (zeros)");
        assert!(history.check(&[vec![1; 4], vec![0; 11]].concat()).is_err(), "a synced byte lost");
        assert!(history.check(&[vec![1; 5], vec![3; 10]].concat()).is_err(), "a byte nobody wrote");
        assert!(history.check(&[1; 16]).is_err(), "longer than ever written");
    }

    /// A crash of a `scrap` mount keeps the names after some prefix of the operations
    /// since the last fsync; names that no prefix had are an ordering bug.
    #[test]
    fn a_crash_keeps_a_prefix_of_the_namespace_since_the_last_fsync() {
        let verify = |dirs: &[&str]| {
            let mut model = Model::volatile();
            let set = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<BTreeSet<String>>();
            model.dirs = set(&["d0", "d1"]);
            model.since_sync = vec![Names::default(), (set(&["d0"]), BTreeSet::new()), (set(&["d0", "d1"]), BTreeSet::new())];
            let root = std::env::temp_dir().join(format!("alignfs-crash-prefix-{}-{}", std::process::id(), rand::random::<u32>()));
            for dir in dirs {
                fs::create_dir_all(root.join(dir))?;
            }
            fs::create_dir_all(&root)?;
            let outcome = model.verify(&root);
            fs::remove_dir_all(&root)?;
            outcome
        };
        assert!(!verify(&["d0", "d1"]).unwrap().older_namespace, "everything acknowledged");
        assert!(verify(&["d0"]).unwrap().older_namespace, "mkdir d1 lost");
        assert!(verify(&[]).unwrap().older_namespace, "both lost");
        assert!(verify(&["d1"]).is_err(), "mkdir d1 kept but the earlier mkdir d0 lost");
    }

    #[test]
    fn lost_or_invented_data_is_caught() {
        let b = ("b", vec![7; 3]);
        assert!(check(&[("a", vec![1; 4]), b.clone()]).is_err(), "acknowledged bytes lost");
        assert!(check(&[("a", vec![1; 10])]).is_err(), "acknowledged file lost");
        assert!(check(&[("a", [vec![1; 9], vec![3]].concat()), b.clone()]).is_err(), "a byte nobody wrote");
        assert!(check(&[("a", vec![1; 10]), b, ("c", vec![])]).is_err(), "a file nobody created");
    }
}
