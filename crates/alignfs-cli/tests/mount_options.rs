#![allow(clippy::unwrap_used)]
//! `alignfs mount` refuses option values it cannot honour before it opens the volume or
//! mounts anything, and says which value and why.

use std::process::Output;

fn alignfs(args: &[&str]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_alignfs")).args(args).output().unwrap()
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

#[test]
fn a_commit_interval_outside_0_to_3600_seconds_is_refused_first() {
    let dir = tempfile::tempdir().unwrap();
    let mountpoint = dir.path().join("mnt");
    std::fs::create_dir(&mountpoint).unwrap();
    let (mnt, ssd) = (mountpoint.to_str().unwrap(), dir.path().join("none.img"));
    let ssd = ssd.to_str().unwrap();
    let log = dir.path().join("mount.log");
    let log = log.to_str().unwrap();
    let cases = [
        ("9999", "--commit-interval 9999: give seconds from 0"),
        ("-1", "--commit-interval -1: give seconds from 0"),
        ("abc", "invalid value 'abc' for '--commit-interval"),
    ];
    for (value, why) in cases {
        let interval = format!("--commit-interval={value}");
        let out = alignfs(&["mount", "--ssd", ssd, "--log", log, &interval, mnt]);
        // Refused for the value, not for the missing SSD image the volume would need next.
        assert!(!out.status.success() && text(&out).contains(why), "{value}: {}", text(&out));
        assert!(!std::path::Path::new(ssd).exists(), "{value}: the refused mount created the SSD image");
    }
}
