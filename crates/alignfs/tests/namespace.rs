#![allow(clippy::unwrap_used)]
//! Namespace semantics and their durability across clean remounts and crashes.

mod common;

use alignfs::meta::XATTR_VALUE_MAX;
use alignfs::volume::{RenameFlags, XattrSet};
use alignfs::{Error, FileKind, Geometry, Ino, Volume, VolumeOptions};
use common::Devices;

fn names(volume: &Volume, dir: Ino) -> Vec<String> {
    volume.readdir(dir).unwrap().into_iter().map(|e| String::from_utf8(e.name).unwrap()).collect()
}

fn setup() -> (Devices, Volume) {
    let devices = Devices::new(8 << 20, 32 << 20);
    devices.format(Geometry::default());
    let volume = devices.open(VolumeOptions::default()).unwrap();
    (devices, volume)
}

#[test]
fn create_link_rename_unlink_survive_crash_and_remount() {
    let (devices, volume) = setup();
    let d = volume.mkdir(Ino::ROOT, b"d", 0o755, 1, 2).unwrap();
    let f = volume.create_file(d.ino, b"f", 0o600, 1, 2).unwrap();
    volume.write(f.ino, 0, b"payload").unwrap();
    volume.link(f.ino, Ino::ROOT, b"hard").unwrap();
    volume.symlink(Ino::ROOT, b"sym", b"d/f", 0, 0).unwrap();
    volume.mknod(Ino::ROOT, b"fifo", FileKind::Fifo, 0o644, 0, 0, 0).unwrap();
    volume.rename(d.ino, b"f", Ino::ROOT, b"moved", RenameFlags::default()).unwrap();
    assert_eq!(volume.getattr(f.ino).unwrap().nlink, 2);
    assert_eq!(volume.getattr(Ino::ROOT).unwrap().nlink, 3);
    // One checkpoint in the middle: recovery then combines a checkpoint and a replay.
    volume.checkpoint().unwrap();
    volume.write(f.ino, 7, b"").unwrap();
    volume.simulate_crash();
    let volume = devices.open(VolumeOptions::default()).unwrap();
    assert_eq!(names(&volume, Ino::ROOT), ["d", "fifo", "hard", "moved", "sym"]);
    assert!(names(&volume, volume.resolve("/d").unwrap()).is_empty());
    let moved = volume.resolve("/moved").unwrap();
    assert_eq!(moved, volume.resolve("/hard").unwrap());
    let attr = volume.getattr(moved).unwrap();
    assert_eq!((attr.perm, attr.uid, attr.gid, attr.nlink, attr.size), (0o600, 1, 2, 2, 7));
    assert_eq!(volume.readlink(volume.resolve("/sym").unwrap()).unwrap(), b"d/f");
    assert_eq!(volume.getattr(volume.resolve("/fifo").unwrap()).unwrap().kind, FileKind::Fifo);
    volume.unlink(Ino::ROOT, b"hard").unwrap();
    volume.close().unwrap();
    let volume = devices.open(VolumeOptions::default()).unwrap();
    assert_eq!(volume.getattr(moved).unwrap().nlink, 1);
}

#[test]
fn rename_rules() {
    let (_devices, volume) = setup();
    let a = volume.mkdir(Ino::ROOT, b"a", 0o755, 0, 0).unwrap().ino;
    let b = volume.mkdir(a, b"b", 0o755, 0, 0).unwrap().ino;
    volume.create_file(Ino::ROOT, b"x", 0o644, 0, 0).unwrap();
    let y = volume.create_file(Ino::ROOT, b"y", 0o644, 0, 0).unwrap().ino;
    let none = RenameFlags::default();
    assert!(matches!(volume.rename(Ino::ROOT, b"a", b, b"loop", none), Err(Error::MoveIntoItself)));
    assert!(matches!(volume.rename(Ino::ROOT, b"x", Ino::ROOT, b"a", none), Err(Error::IsDir)));
    assert!(matches!(volume.rename(Ino::ROOT, b"a", Ino::ROOT, b"x", none), Err(Error::NotDir)));
    assert!(matches!(
        volume.rename(Ino::ROOT, b"x", Ino::ROOT, b"y", RenameFlags { no_replace: true, exchange: false }),
        Err(Error::Exists)
    ));
    assert!(matches!(volume.rename(Ino::ROOT, b"nope", Ino::ROOT, b"z", none), Err(Error::NotFound)));
    // Replace: y's inode goes away.
    volume.rename(Ino::ROOT, b"x", Ino::ROOT, b"y", none).unwrap();
    assert!(matches!(volume.getattr(y), Err(Error::NotFound)));
    // Exchange a file and a directory across directories.
    volume.rename(Ino::ROOT, b"y", a, b"b", RenameFlags { no_replace: false, exchange: true }).unwrap();
    assert_eq!(volume.lookup(Ino::ROOT, b"y").unwrap().ino, b);
    assert_eq!(volume.resolve("/y/..").unwrap(), Ino::ROOT);
    assert_eq!(volume.getattr(a).unwrap().nlink, 2);
    assert_eq!(volume.getattr(Ino::ROOT).unwrap().nlink, 4);
    // A directory replaces only an empty directory.
    volume.mkdir(Ino::ROOT, b"full", 0o755, 0, 0).unwrap();
    volume.create_file(volume.resolve("/full").unwrap(), b"in", 0o644, 0, 0).unwrap();
    assert!(matches!(volume.rename(Ino::ROOT, b"y", Ino::ROOT, b"full", none), Err(Error::NotEmpty)));
    assert!(matches!(volume.rmdir(Ino::ROOT, b"full"), Err(Error::NotEmpty)));
    assert!(matches!(volume.unlink(Ino::ROOT, b"full"), Err(Error::IsDir)));
    assert!(matches!(volume.rmdir(Ino::ROOT, b"a"), Err(Error::NotEmpty)));
    assert!(matches!(volume.create_file(Ino::ROOT, b"a", 0o644, 0, 0), Err(Error::Exists)));
    assert!(matches!(volume.create_file(Ino::ROOT, &[b'n'; 256], 0o644, 0, 0), Err(Error::NameTooLong)));
    assert!(matches!(volume.create_file(Ino::ROOT, b"a/b", 0o644, 0, 0), Err(Error::InvalidName(_))));
    assert!(matches!(volume.link(a, Ino::ROOT, b"dirlink"), Err(Error::NotPermitted(_))));
}

#[test]
fn unlinked_open_file_keeps_its_data_until_released() {
    let (devices, mut volume) = setup();
    let f = volume.create_file(Ino::ROOT, b"tmp", 0o644, 0, 0).unwrap().ino;
    volume.write(f, 0, &vec![4u8; 100_000]).unwrap();
    let used = volume.statfs().blocks_free;
    volume.open_handle(f).unwrap();
    volume.unlink(Ino::ROOT, b"tmp").unwrap();
    let mut buf = vec![0u8; 100_000];
    assert_eq!(volume.read(f, 0, &mut buf).unwrap(), 100_000);
    assert!(buf.iter().all(|&b| b == 4));
    assert_eq!(volume.statfs().blocks_free, used, "still allocated while open");
    volume.release_handle(f).unwrap();
    assert!(volume.getattr(f).is_err());
    assert!(volume.statfs().blocks_free > used);
    // An orphan left by a crash, in the journal or in a checkpoint, is dropped by the
    // sweep at the next open (no handle survives a crash).
    for checkpointed in [false, true] {
        let g = volume.create_file(Ino::ROOT, b"orphan", 0o644, 0, 0).unwrap().ino;
        volume.write(g, 0, &vec![1u8; 70_000]).unwrap();
        volume.open_handle(g).unwrap();
        volume.unlink(Ino::ROOT, b"orphan").unwrap();
        if checkpointed {
            volume.checkpoint().unwrap();
        }
        let free_with_orphan = volume.statfs().blocks_free;
        volume.simulate_crash();
        volume = devices.open(VolumeOptions::default()).unwrap();
        assert_eq!(volume.recovery().orphans_dropped, 1);
        assert!(volume.getattr(g).is_err());
        assert!(volume.statfs().blocks_free > free_with_orphan);
    }
}

#[test]
fn setattr_and_times() {
    let (devices, volume) = setup();
    let f = volume.create_file(Ino::ROOT, b"f", 0o644, 0, 0).unwrap().ino;
    let request = alignfs::volume::SetAttrRequest {
        perm: Some(0o4755),
        uid: Some(7),
        gid: Some(8),
        size: Some(12345),
        atime: Some(1_000),
        mtime: Some(2_000),
    };
    let attr = volume.setattr(f, &request).unwrap();
    assert_eq!((attr.perm, attr.uid, attr.gid, attr.size, attr.atime, attr.mtime), (0o4755, 7, 8, 12345, 1_000, 2_000));
    volume.simulate_crash();
    let volume = devices.open(VolumeOptions::default()).unwrap();
    let again = volume.getattr(f).unwrap();
    assert_eq!(again, attr);
}

#[test]
fn extended_attributes_follow_set_flags_limits_and_survive_crashes() {
    let (devices, volume) = setup();
    let f = volume.create_file(Ino::ROOT, b"f", 0o644, 0, 0).unwrap().ino;
    volume.setxattr(f, b"user.a", b"1", XattrSet::CreateOrReplace).unwrap();
    volume.setxattr(f, b"user.b", b"", XattrSet::CreateOnly).unwrap();
    assert!(matches!(volume.setxattr(f, b"user.a", b"2", XattrSet::CreateOnly), Err(Error::Exists)));
    assert!(matches!(volume.setxattr(f, b"user.c", b"2", XattrSet::ReplaceOnly), Err(Error::NoAttribute)));
    volume.setxattr(f, b"user.a", b"22", XattrSet::ReplaceOnly).unwrap();
    assert!(matches!(volume.setxattr(f, &[b'n'; 256], b"", XattrSet::CreateOrReplace), Err(Error::NameTooLong)));
    assert!(matches!(volume.setxattr(f, b"user.big", &vec![0; XATTR_VALUE_MAX + 1], XattrSet::CreateOrReplace), Err(Error::TooLarge(_))));
    // The per-inode budget holds several full-size values, then refuses the next.
    let mut stored = 0;
    let result = loop {
        match volume.setxattr(f, format!("user.fill{stored}").as_bytes(), &vec![7; XATTR_VALUE_MAX], XattrSet::CreateOrReplace) {
            Ok(()) => stored += 1,
            Err(e) => break e,
        }
    };
    assert!(matches!(result, Error::NoSpace) && stored >= 3, "{result} after {stored}");
    for i in 0..stored {
        volume.removexattr(f, format!("user.fill{i}").as_bytes()).unwrap();
    }
    assert!(matches!(volume.removexattr(f, b"user.zzz"), Err(Error::NoAttribute)));
    volume.checkpoint().unwrap();
    volume.setxattr(Ino::ROOT, b"trusted.dir", b"on the root", XattrSet::CreateOrReplace).unwrap();
    volume.simulate_crash();
    let volume = devices.open(VolumeOptions::default()).unwrap();
    assert_eq!(volume.listxattr(f).unwrap(), [b"user.a".to_vec(), b"user.b".to_vec()]);
    assert_eq!(volume.getxattr(f, b"user.a").unwrap(), b"22");
    assert_eq!(volume.getxattr(f, b"user.b").unwrap(), b"");
    assert_eq!(volume.getxattr(Ino::ROOT, b"trusted.dir").unwrap(), b"on the root");
    assert!(matches!(volume.getxattr(f, b"user.c"), Err(Error::NoAttribute)));
    volume.close().unwrap();
    let volume = devices.open(VolumeOptions::default()).unwrap();
    assert_eq!(volume.getxattr(f, b"user.a").unwrap(), b"22");
}

#[test]
fn over_long_names_are_refused_by_every_lookup() {
    let (_devices, volume) = setup();
    assert!(matches!(volume.lookup(Ino::ROOT, &[b'x'; 256]), Err(Error::NameTooLong)));
    assert!(matches!(volume.lookup(Ino::ROOT, &[b'x'; 255]), Err(Error::NotFound)));
}

#[test]
fn writes_to_an_open_unlinked_file_replay_after_a_crash() {
    // Found by the SQLite kill -9 loop: replay must not need to know which files were open.
    let (devices, volume) = setup();
    let keep = volume.create_file(Ino::ROOT, b"keep", 0o644, 0, 0).unwrap().ino;
    let temp = volume.create_file(Ino::ROOT, b"temp", 0o644, 0, 0).unwrap().ino;
    volume.open_handle(temp).unwrap();
    volume.unlink(Ino::ROOT, b"temp").unwrap();
    volume.write(temp, 0, &[1u8; 50_000]).unwrap();
    volume.truncate(temp, 10).unwrap();
    let victim = volume.create_file(Ino::ROOT, b"victim", 0o644, 0, 0).unwrap().ino;
    volume.open_handle(victim).unwrap();
    volume.rename(Ino::ROOT, b"keep", Ino::ROOT, b"victim", RenameFlags::default()).unwrap();
    volume.write(victim, 0, b"still open").unwrap();
    volume.write(keep, 0, b"kept").unwrap();
    volume.simulate_crash();
    let volume = devices.open(VolumeOptions::default()).unwrap();
    assert_eq!(volume.recovery().orphans_dropped, 2);
    assert_eq!(names(&volume, Ino::ROOT), ["victim"]);
    let mut out = [0u8; 4];
    volume.read(volume.resolve("/victim").unwrap(), 0, &mut out).unwrap();
    assert_eq!(&out, b"kept");
    // The orphans' units were freed and are reused; a second crash must replay as well.
    let f = volume.create_file(Ino::ROOT, b"new", 0o644, 0, 0).unwrap().ino;
    volume.write(f, 0, &[2u8; 70_000]).unwrap();
    volume.simulate_crash();
    let volume = devices.open(VolumeOptions::default()).unwrap();
    assert_eq!(names(&volume, Ino::ROOT), ["new", "victim"]);
    assert!(volume.check().is_empty(), "{:?}", volume.check());
}
