#![allow(clippy::unwrap_used)]
//! `alignfs mkfs` never formats over a device that holds an alignfs structure (without
//! `--force`) or that a process holds open (even with `--force`): every profile's mkfs,
//! tried on every device of a volume of every profile, in every part that device could be
//! named for. A refused mkfs changes no byte of any device and creates no file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Output;

use alignfs::paths::open_paths_with_faults;
use alignfs::VolumeOptions;

/// Throwaway directories: images on disk, fast tiers and DRAM on tmpfs.
struct Scratch {
    disk: tempfile::TempDir,
    shm: tempfile::TempDir,
}

impl Scratch {
    fn new() -> Scratch {
        Scratch { disk: tempfile::tempdir().unwrap(), shm: tempfile::tempdir_in("/dev/shm").unwrap() }
    }

    fn disk(&self, name: &str) -> PathBuf {
        self.disk.path().join(name)
    }

    fn shm(&self, name: &str) -> PathBuf {
        self.shm.path().join(name)
    }
}

fn alignfs(args: &[String]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_alignfs")).args(args).output().unwrap()
}

fn run_ok(args: &[String]) {
    let out = alignfs(args);
    assert!(out.status.success(), "alignfs {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
}

fn words(text: &str) -> Vec<String> {
    text.split_whitespace().map(String::from).collect()
}

/// One volume of a profile, and the devices it lives on by the part each plays.
struct Volume {
    profile: &'static str,
    /// (part, path): "fast" (fast tier or device DRAM), "ssd", "kv".
    devices: Vec<(&'static str, PathBuf)>,
}

impl Volume {
    fn args(&self) -> Vec<String> {
        self.devices.iter().flat_map(|(part, path)| [format!("--{part}"), path.display().to_string()]).collect()
    }

    /// Open it writable in this process, as a daemon serving it would.
    fn hold(&self) -> alignfs::Volume {
        let fast = self.devices.iter().find(|(p, _)| *p == "fast").map_or_else(PathBuf::new, |(_, path)| path.clone());
        let ssds: Vec<PathBuf> = self.devices.iter().filter(|(p, _)| *p == "ssd").map(|(_, path)| path.clone()).collect();
        let kv = self.devices.iter().find(|(p, _)| *p == "kv").map(|(_, path)| path.clone());
        let options = VolumeOptions { background: false, ..VolumeOptions::default() };
        open_paths_with_faults(&fast, &ssds, kv.as_deref(), options, None, None).unwrap()
    }
}

fn make_volumes(s: &Scratch) -> Vec<Volume> {
    let volumes = vec![
        Volume { profile: "orch", devices: vec![("fast", s.shm("orch.fast")), ("ssd", s.disk("orch.img"))] },
        Volume { profile: "scrap", devices: vec![("ssd", s.disk("scrap-a.img")), ("ssd", s.disk("scrap-b.img"))] },
        Volume { profile: "uhs", devices: vec![("fast", s.shm("uhs.fast")), ("ssd", s.disk("uhs.img"))] },
        Volume { profile: "nvstore", devices: vec![("ssd", s.disk("nv.img")), ("kv", s.disk("nv.kv"))] },
        Volume { profile: "byte", devices: vec![("fast", s.shm("byte.dram")), ("ssd", s.disk("byte.img"))] },
    ];
    for v in &volumes {
        let sized: Vec<String> = v
            .devices
            .iter()
            .flat_map(|(part, path)| {
                let size = match (*part, v.profile) {
                    ("kv", _) | ("fast", "byte") => String::new(),
                    ("fast", _) => ":16M".into(),
                    _ => ":64M".into(),
                };
                [format!("--{part}"), format!("{}{size}", path.display())]
            })
            .collect();
        let mut args = words(&format!("mkfs --profile {}", v.profile));
        args.extend(sized);
        run_ok(&args);
    }
    volumes
}

/// Every file's bytes under both scratch directories (a KV store's files too).
fn snapshot(s: &Scratch) -> BTreeMap<PathBuf, Vec<u8>> {
    fn walk(dir: &Path, out: &mut BTreeMap<PathBuf, Vec<u8>>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else {
                out.insert(path.clone(), std::fs::read(&path).unwrap());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(s.disk.path(), &mut out);
    walk(s.shm.path(), &mut out);
    out
}

/// Each way a profile's mkfs can be given `target`, with fresh devices for its other parts.
fn attempts(s: &Scratch, target: &Path) -> Vec<Vec<String>> {
    let t = target.display().to_string();
    let (fresh_fast, fresh_ssd, fresh_kv) = (s.shm("fresh.fast"), s.disk("fresh.img"), s.disk("fresh.kv"));
    let (ff, fs, fk) = (fresh_fast.display(), fresh_ssd.display(), fresh_kv.display());
    [
        format!("--profile orch --fast {t} --ssd {fs}:64M"),
        format!("--profile orch --fast {ff}:16M --ssd {t}"),
        format!("--profile scrap --ssd {t}"),
        format!("--profile scrap --ssd {fs}:64M --ssd {t}"),
        format!("--profile uhs --fast {t} --ssd {fs}:64M"),
        format!("--profile uhs --fast {ff}:16M --ssd {t}"),
        format!("--profile nvstore --ssd {t} --kv {fk}"),
        format!("--profile nvstore --ssd {fs}:64M --kv {t}"),
        format!("--profile byte --fast {t} --ssd {fs}:64M"),
        format!("--profile byte --fast {ff} --ssd {t}"),
    ]
    .iter()
    .map(|a| words(&format!("mkfs {a}")))
    .collect()
}

fn fsck_clean(v: &Volume) {
    let mut args = vec!["fsck".to_string()];
    args.extend(v.args());
    let out = alignfs(&args);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.trim_end().ends_with(": clean"), "fsck of the {} volume: {text}", v.profile);
}

/// Run every attempt on every device; each must fail saying `why`, and leave every file
/// as it was.
fn refuse_all(s: &Scratch, volumes: &[Volume], force: bool, why: &str) -> usize {
    let before = snapshot(s);
    let mut tried = 0;
    for v in volumes {
        for (part, target) in &v.devices {
            for mut args in attempts(s, target) {
                if force {
                    args.push("--force".into());
                }
                let out = alignfs(&args);
                let err = String::from_utf8_lossy(&out.stderr);
                let context = format!("{part} of the {} volume: alignfs {}", v.profile, args.join(" "));
                assert!(!out.status.success(), "{context} succeeded");
                assert!(err.contains(why), "{context} said: {err}");
                assert!(err.contains(&target.display().to_string()), "{context} did not name the device: {err}");
                assert!(!err.contains("panicked"), "{context}: {err}");
                tried += 1;
            }
        }
    }
    assert!(snapshot(s) == before, "a refused mkfs changed or created a file");
    tried
}

#[test]
fn every_mkfs_refuses_every_alignfs_device() {
    let s = Scratch::new();
    let volumes = make_volumes(&s);
    let tried = refuse_all(&s, &volumes, false, "already holds");
    assert_eq!(tried, 10 * 10);
    for v in &volumes {
        fsck_clean(v);
    }
}

#[test]
fn a_device_in_use_is_refused_even_with_force() {
    let s = Scratch::new();
    let volumes = make_volumes(&s);
    let held: Vec<alignfs::Volume> = volumes.iter().map(Volume::hold).collect();
    refuse_all(&s, &volumes, true, "is in use");
    // The holder is named: this test's process.
    let out =
        alignfs(&words(&format!("mkfs --force --fast {} --ssd {}", volumes[0].devices[0].1.display(), s.disk("x.img:64M").display())));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("process {} (`", std::process::id())), "{err}");
    for volume in held {
        volume.close().unwrap();
    }
    for v in &volumes {
        fsck_clean(v);
    }
}

#[test]
fn force_formats_over_a_volume_nobody_holds() {
    let s = Scratch::new();
    let volumes = make_volumes(&s);
    // A byte device over the orch volume's fast tier and SSD (the first try a new user made).
    let (orch_fast, orch_ssd) = (volumes[0].devices[0].1.display().to_string(), volumes[0].devices[1].1.display().to_string());
    run_ok(&words(&format!("mkfs --force --profile byte --fast {orch_fast} --ssd {orch_ssd}")));
    let byte = Volume { profile: "byte", devices: vec![("fast", orch_fast.clone().into()), ("ssd", orch_ssd.into())] };
    fsck_clean(&byte);
    // And an orch volume over the byte device's DRAM and flash.
    let (dram, flash) = (volumes[4].devices[0].1.display().to_string(), volumes[4].devices[1].1.display().to_string());
    run_ok(&words(&format!("mkfs --force --fast {dram} --ssd {flash}")));
    fsck_clean(&Volume { profile: "orch", devices: vec![("fast", dram.into()), ("ssd", flash.into())] });
}

#[test]
fn a_failed_mkfs_removes_what_it_created() {
    let s = Scratch::new();
    let cases = [
        // An SSD too small for two blocks.
        (format!("mkfs --fast {}:16M --ssd {}:4K", s.shm("a.fast").display(), s.disk("a.img").display()), "fewer than two"),
        // A fast tier of no bytes.
        (format!("mkfs --fast {}:0 --ssd {}:64M", s.shm("b.fast").display(), s.disk("b.img").display()), "0 bytes"),
        // A flash image too small for any device.
        (format!("mkfs --profile byte --fast {} --ssd {}:1M", s.shm("c.dram").display(), s.disk("c.img").display()), ""),
    ];
    for (args, why) in cases {
        let out = alignfs(&words(&args));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args} succeeded");
        assert!(err.contains(why), "{args}: {err}");
        assert!(snapshot(&s).is_empty(), "{args} left files behind: {:?}", snapshot(&s).keys().collect::<Vec<_>>());
    }
}
