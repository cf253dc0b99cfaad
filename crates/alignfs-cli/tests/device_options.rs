#![allow(clippy::unwrap_used)]
//! The memory-semantic SSD's format option (`mkfs --device-log`): it sizes the new
//! device's write log, is refused for profiles without that device, and a refused size
//! creates no file.

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
