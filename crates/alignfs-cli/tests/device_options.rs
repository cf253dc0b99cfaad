#![allow(clippy::unwrap_used)]
//! The memory-semantic SSD's options: `mkfs --device-log` sizes the new device's write
//! log, is refused for profiles without that device, and a refused size creates no file;
//! a bad `export-device --metadata-ranges` file creates none either.

use std::path::Path;
use std::process::Output;

fn alignfs(args: &[&str]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_alignfs")).args(args).output().unwrap()
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

fn entries(dir: &Path) -> usize {
    std::fs::read_dir(dir).unwrap().count()
}

#[test]
fn device_log_sizes_the_write_log_of_a_byte_device() {
    let (disk, shm) = (tempfile::tempdir().unwrap(), tempfile::tempdir_in("/dev/shm").unwrap());
    let ssd = disk.path().join("byte.img");
    let dram = shm.path().join("byte.dram");
    let (ssd, dram) = (ssd.to_str().unwrap(), dram.to_str().unwrap());
    let out = alignfs(&["mkfs", "--profile", "byte", "--ssd", &format!("{ssd}:256M"), "--fast", dram, "--device-log", "8M"]);
    assert!(out.status.success(), "{}", text(&out));
    let stat = alignfs(&["stat", "--ssd", ssd, "--fast", dram]);
    assert!(stat.status.success(), "{}", text(&stat));
    assert!(text(&stat).contains("8 MiB write log"), "{}", text(&stat));
    assert!(text(&stat).contains("of 8.0 MiB"), "residue units sit in the 8 MiB log: {}", text(&stat));
}

#[test]
fn device_log_is_refused_where_it_cannot_apply_and_creates_nothing() {
    let (disk, shm) = (tempfile::tempdir().unwrap(), tempfile::tempdir_in("/dev/shm").unwrap());
    let ssd = format!("{}:256M", disk.path().join("v.img").display());
    let fast = shm.path().join("v.fast");
    let fast = fast.to_str().unwrap();
    let cases: [(&[&str], &str); 3] = [
        (&["--profile", "orch", "--device-log", "16M"], "profile orch has no memory-semantic SSD"),
        (&["--profile", "byte", "--device-log", "100K"], "the write log (102400 bytes) must be 1 MiB–4 GiB"),
        (&["--profile", "byte", "--device-log", "lots"], "--device-log lots"),
    ];
    for (extra, why) in cases {
        let mut args = vec!["mkfs", "--ssd", &ssd, "--fast", fast];
        args.extend_from_slice(extra);
        let out = alignfs(&args);
        assert!(!out.status.success() && text(&out).contains(why), "{args:?}: {}", text(&out));
        assert_eq!((entries(disk.path()), entries(shm.path())), (0, 0), "{args:?} left a file behind");
    }
}

/// `export-device --metadata-ranges`: a file that does not parse is refused before any
/// device is made.
#[test]
fn bad_metadata_ranges_are_refused_before_anything_is_made() {
    let (disk, shm) = (tempfile::tempdir().unwrap(), tempfile::tempdir_in("/dev/shm").unwrap());
    let ranges = tempfile::NamedTempFile::new().unwrap();
    let ssd = format!("{}:64M", disk.path().join("d.img").display());
    let dram = shm.path().join("d.dram");
    let mnt = tempfile::tempdir().unwrap();
    let export = |contents: &str| {
        std::fs::write(ranges.path(), contents).unwrap();
        alignfs(&[
            "export-device",
            "--ssd",
            &ssd,
            "--fast",
            dram.to_str().unwrap(),
            "--metadata-ranges",
            ranges.path().to_str().unwrap(),
            mnt.path().to_str().unwrap(),
        ])
    };
    for (contents, why) in [
        ("# superblock\n0 4096\n4096\n", "line 3: expected `START END` in bytes"),
        ("0 4k\n", "line 1: end \"4k\" is not a byte offset"),
        ("8192 4096\n", "line 1: the range 8192–4096 is empty"),
    ] {
        let out = export(contents);
        assert!(!out.status.success() && text(&out).contains(why), "{contents:?}: {}", text(&out));
        assert_eq!((entries(disk.path()), entries(shm.path())), (0, 0), "{contents:?} left a file behind");
    }
}
