//! `byte`'s in-place metadata (docs/BYTE.md, "Metadata in place"): random namespace and
//! data operations, then a clean close or a crash and a reopen on either interface; the
//! reopened volume must hold exactly what was acknowledged (every `byte` operation is
//! durable when it returns) and pass fsck. Plus what a commit stores, and a damaged area.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;

use alignfs::stats::Counter;
use alignfs::test_support::{scaled, seed};
use alignfs::volume::{RenameFlags, XattrSet};
use alignfs::{Error, FileKind, Ino, Profile, Volume, VolumeOptions};
use common::Devices;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn options(byte_interface: bool) -> VolumeOptions {
    VolumeOptions { background: false, byte_interface, ..VolumeOptions::default() }
}

fn devices() -> Devices {
    let devices = Devices::ssd_only(Profile::BYTE, 96 << 20);
    devices.format(Profile::BYTE.default_geometry());
    devices
}

/// Everything a path shows: attributes (but access times), link target, attributes,
/// contents.
type Dump = BTreeMap<Vec<u8>, String>;

fn dump(volume: &Volume) -> Dump {
    let mut out = Dump::new();
    let mut stack = vec![(Ino::ROOT, b"/".to_vec())];
    while let Some((dir, path)) = stack.pop() {
        for entry in volume.readdir(dir).unwrap() {
            if entry.name == b"." || entry.name == b".." {
                continue;
            }
            let mut child = path.clone();
            child.extend_from_slice(&entry.name);
            let a = volume.getattr(entry.ino).unwrap();
            let mut line =
                format!("{} {:?} {:o} {} {} {} {} {} {}", a.ino.0, a.kind, a.perm, a.uid, a.gid, a.nlink, a.size, a.mtime, a.ctime);
            for name in volume.listxattr(entry.ino).unwrap() {
                let value = volume.getxattr(entry.ino, &name).unwrap();
                line += &format!(" x:{}={}:{:x}", String::from_utf8_lossy(&name), value.len(), crc32fast_like(&value));
            }
            match entry.kind {
                FileKind::Symlink => line += &format!(" -> {}", String::from_utf8_lossy(&volume.readlink(entry.ino).unwrap())),
                FileKind::File => {
                    let mut data = vec![0u8; a.size as usize];
                    assert_eq!(volume.read(entry.ino, 0, &mut data).unwrap(), data.len());
                    line += &format!(" data:{:x}", crc32fast_like(&data));
                }
                FileKind::Dir => {
                    child.push(b'/');
                    stack.push((entry.ino, child.clone()));
                }
                _ => {}
            }
            out.insert(child, line);
        }
    }
    out
}

/// A checksum for the dump (FNV-1a; no need for a crate).
fn crc32fast_like(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
}

fn name(rng: &mut StdRng) -> Vec<u8> {
    let len = if rng.random_bool(0.2) { rng.random_range(60..=255) } else { rng.random_range(1..=12) };
    (0..len).map(|_| b'a' + rng.random_range(0..4u8)).collect()
}

/// Entries of `dir` of a kind.
fn entries(volume: &Volume, dir: Ino, kind: Option<FileKind>) -> Vec<(Vec<u8>, Ino)> {
    volume
        .readdir(dir)
        .unwrap()
        .into_iter()
        .filter(|e| e.name != b"." && e.name != b".." && kind.is_none_or(|k| k == e.kind))
        .map(|e| (e.name, e.ino))
        .collect()
}

fn pick<T: Clone>(rng: &mut StdRng, items: &[T]) -> Option<T> {
    (!items.is_empty()).then(|| items[rng.random_range(0..items.len())].clone())
}

/// One random operation; failures the operation may rightly have (a name taken, a
/// directory not empty) are ignored, as long as they change nothing.
fn step(volume: &Volume, rng: &mut StdRng) {
    let mut dirs = vec![Ino::ROOT];
    dirs.extend(entries(volume, Ino::ROOT, Some(FileKind::Dir)).into_iter().map(|(_, i)| i));
    let dir = pick(rng, &dirs).unwrap();
    let files = entries(volume, dir, Some(FileKind::File));
    let any = entries(volume, dir, None);
    let result = match rng.random_range(0..100) {
        0..=14 => volume.create_file(dir, &name(rng), 0o644, 1, 2).map(drop),
        15..=18 if dirs.len() < 5 => volume.mkdir(Ino::ROOT, &name(rng), 0o755, 0, 0).map(drop),
        19..=23 => {
            let target: Vec<u8> = (0..rng.random_range(1..=1500)).map(|i| b'a' + (i % 26) as u8).collect();
            volume.symlink(dir, &name(rng), &target, 0, 0).map(drop)
        }
        24..=33 => match pick(rng, &any) {
            Some((n, ino)) if volume.getattr(ino).unwrap().kind == FileKind::Dir => volume.rmdir(dir, &n),
            Some((n, _)) => volume.unlink(dir, &n),
            None => Ok(()),
        },
        34..=41 => match pick(rng, &any) {
            Some((n, _)) => volume.rename(dir, &n, pick(rng, &dirs).unwrap(), &name(rng), RenameFlags::default()),
            None => Ok(()),
        },
        42..=45 => match pick(rng, &files) {
            Some((_, ino)) => volume.link(ino, pick(rng, &dirs).unwrap(), &name(rng)).map(drop),
            None => Ok(()),
        },
        46..=55 => match pick(rng, &any) {
            Some((_, ino)) => {
                let key = format!("user.k{}", rng.random_range(0..6));
                if rng.random_bool(0.25) {
                    volume.removexattr(ino, key.as_bytes())
                } else {
                    let value = vec![rng.random::<u8>(); rng.random_range(0..=3000)];
                    volume.setxattr(ino, key.as_bytes(), &value, XattrSet::CreateOrReplace)
                }
            }
            None => Ok(()),
        },
        56..=89 => match pick(rng, &files) {
            Some((_, ino)) => {
                let offset = rng.random_range(0..256 << 10);
                let data = vec![rng.random::<u8>(); rng.random_range(1..=20_000)];
                volume.write(ino, offset, &data).map(drop)
            }
            None => Ok(()),
        },
        _ => match pick(rng, &files) {
            Some((_, ino)) => volume.truncate(ino, rng.random_range(0..300 << 10)),
            None => Ok(()),
        },
    };
    if let Err(e) = result {
        let refusals = [libc::EEXIST, libc::ENOTEMPTY, libc::ENODATA, libc::EISDIR, libc::ENOTDIR, libc::EINVAL, libc::ENOENT];
        assert!(refusals.contains(&e.errno()), "{e:?}");
    }
}

/// A commit's lines: property test over reopen and crash, both interfaces, switching
/// between them.
#[test]
fn a_reopened_volume_holds_every_acknowledged_operation() {
    let mut rng = StdRng::seed_from_u64(seed("in_place_meta::a_reopened_volume_holds_every_acknowledged_operation"));
    let devices = devices();
    let mut byte_interface = true;
    let mut volume = devices.open(options(byte_interface)).unwrap();
    assert!(volume.superblock().in_place_meta, "a new byte volume keeps its metadata in place");
    let rounds = scaled(12);
    for round in 0..rounds {
        for _ in 0..40 {
            step(&volume, &mut rng);
        }
        let before = dump(&volume);
        let crash = rng.random_bool(0.5);
        if crash {
            volume.simulate_crash();
        } else {
            volume.close().unwrap();
        }
        byte_interface = rng.random_bool(0.6);
        volume = devices.open(options(byte_interface)).unwrap();
        if !crash {
            assert!(volume.recovery().clean, "round {round}: a clean close leaves nothing to replay");
        }
        let after = dump(&volume);
        let differ: Vec<_> =
            before.iter().filter(|(path, line)| after.get(*path) != Some(line)).map(|(p, _)| String::from_utf8_lossy(p)).collect();
        let extra: Vec<_> = after.keys().filter(|path| !before.contains_key(*path)).map(|p| String::from_utf8_lossy(p)).collect();
        assert!(
            differ.is_empty() && extra.is_empty(),
            "round {round} (crash {crash}, byte interface {byte_interface}): {differ:?} differ, {extra:?} appeared"
        );
        assert!(volume.check().is_empty(), "round {round}: fsck {:?}", volume.check());
    }
    let lines = volume.stats().counters.iter().find(|(c, _)| *c == Counter::meta_lines_stored).map_or(0, |(_, v)| *v);
    assert!(lines > 0, "commits stored lines");
    volume.close().unwrap();
}

fn counter(volume: &Volume, which: Counter) -> u64 {
    volume.stats().counters.iter().find(|(c, _)| *c == which).map_or(0, |(_, v)| *v)
}

/// ByteFS's promise for metadata: an overwrite of a whole block changes its inode's hot
/// line (mtime) and its map line, and stores just those, in one transaction.
#[test]
fn an_overwrite_stores_two_lines_in_one_transaction() {
    let devices = devices();
    let volume = devices.open(options(true)).unwrap();
    let ino = volume.create_file(Ino::ROOT, b"f", 0o644, 0, 0).unwrap().ino;
    volume.write(ino, 0, &[1u8; 16384]).unwrap();
    let (lines, transactions) = (counter(&volume, Counter::meta_lines_stored), counter(&volume, Counter::meta_transactions));
    volume.write(ino, 4096, &[2u8; 4096]).unwrap();
    assert_eq!(counter(&volume, Counter::meta_lines_stored) - lines, 2);
    assert_eq!(counter(&volume, Counter::meta_transactions) - transactions, 1);
    // A create: the new inode's two lines, its name's line, the parent's hot line, the
    // header (next inode number) and a bitmap line.
    let lines = counter(&volume, Counter::meta_lines_stored);
    volume.create_file(Ino::ROOT, b"g", 0o644, 0, 0).unwrap();
    assert_eq!(counter(&volume, Counter::meta_lines_stored) - lines, 6);
    volume.close().unwrap();
}

/// A line marked used that no record starts, or a record on lines marked free, makes the
/// volume refuse to open, naming the in-place metadata.
#[test]
fn a_damaged_area_is_refused() {
    let devices = devices();
    let volume = devices.open(options(true)).unwrap();
    volume.create_file(Ino::ROOT, b"f", 0o644, 0, 0).unwrap();
    let layout = volume.superblock().layout;
    volume.close().unwrap();
    let ssd = devices.open_device();
    // Bitmap byte 100 covers record lines 800..808, which nothing uses yet.
    let bitmap = layout.checkpoint_a_offset + 64 + 100;
    let mut original = [0u8; 1];
    ssd.load(bitmap, &mut original).unwrap();
    ssd.store(None, bitmap, &[0xff]).unwrap();
    ssd.verify();
    drop(ssd);
    let refused = devices.open(options(true));
    assert!(matches!(&refused, Err(Error::Corrupt { structure: "in-place metadata", .. })), "{:?}", refused.err());
    let ssd = devices.open_device();
    ssd.store(None, bitmap, &original).unwrap();
    ssd.verify();
    drop(ssd);
    devices.open(options(false)).unwrap().close().unwrap();
}

/// Lines freed by a record keep their bytes on the device, and an open does not read
/// them; a record later put there is stored whole, zeros included.
#[test]
fn a_record_on_lines_freed_before_a_reopen_is_stored_whole() {
    let devices = devices();
    let volume = devices.open(options(true)).unwrap();
    let ino = volume.create_file(Ino::ROOT, b"f", 0o644, 0, 0).unwrap().ino;
    volume.setxattr(ino, b"user.a", &[0xab; 16384], XattrSet::CreateOrReplace).unwrap();
    volume.removexattr(ino, b"user.a").unwrap();
    volume.close().unwrap();
    let volume = devices.open(options(true)).unwrap();
    volume.setxattr(ino, b"user.b", &[0; 16384], XattrSet::CreateOrReplace).unwrap();
    volume.close().unwrap();
    let volume = devices.open(options(true)).unwrap();
    assert!(volume.getxattr(ino, b"user.b").unwrap() == [0; 16384], "the value reads back as zeros");
    volume.close().unwrap();
}

/// A commit that needs more lines than the area can give it is refused before its ops
/// apply (ENOSPC), however small the reserve kept for deletes: the volume keeps what it
/// had, goes on working, and reopens to the same state.
#[test]
fn a_commit_larger_than_the_free_lines_is_refused_before_it_applies() {
    let devices = devices();
    let volume = devices.open(options(true)).unwrap();
    let lines = |volume: &Volume| {
        let usage = volume.stats().usage;
        (usage.journal_used_bytes / 64, usage.journal_capacity_bytes / 64)
    };
    let (_, capacity) = lines(&volume);
    let reserve = capacity / 32;
    // 16 KiB attribute values (257 lines each), three to a file, until the area is within
    // two of the reserve.
    let mut values = 0;
    while lines(&volume).1 - lines(&volume).0 >= reserve + 2 * 257 {
        let holder = match volume.lookup(Ino::ROOT, format!("h{}", values / 3).as_bytes()) {
            Ok(attr) => attr.ino,
            Err(_) => volume.create_file(Ino::ROOT, format!("h{}", values / 3).as_bytes(), 0o644, 0, 0).unwrap().ino,
        };
        volume.setxattr(holder, format!("user.{values}").as_bytes(), &[values as u8; 16384], XattrSet::CreateOrReplace).unwrap();
        values += 1;
    }
    assert!(reserve > 2 * 257, "the area is large enough for the reserve to matter");
    // Writes whose maps need more lines than are free (a line per four blocks), and more
    // than are free above the reserve.
    let free = lines(&volume).1 - lines(&volume).0;
    let f = volume.create_file(Ino::ROOT, b"big", 0o644, 0, 0).unwrap().ino;
    let before = dump(&volume);
    for lines_wanted in [free + 64, free - reserve + 64] {
        let refused = volume.write(f, 0, &vec![5u8; 4 * lines_wanted as usize * 4096]);
        assert!(matches!(refused, Err(Error::MetadataFull(_))), "{lines_wanted} lines: {refused:?}");
        assert!(dump(&volume) == before, "the refused write of {lines_wanted} lines left something behind");
    }
    assert_eq!(volume.check(), []);
    // Still working: smaller writes fit, deletes free space.
    volume.write(f, 0, &[6u8; 3 * 4096]).unwrap();
    volume.removexattr(volume.lookup(Ino::ROOT, b"h0").unwrap().ino, b"user.0").unwrap();
    let after = dump(&volume);
    volume.close().unwrap();
    let volume = devices.open(options(true)).unwrap();
    assert_eq!(dump(&volume), after);
    volume.close().unwrap();
}
