//! The line store: images round trip, commits and the redo area.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

pub use records::{Key, Part, Record};

use super::image::*;
use super::*;
use crate::device::SimSsd;
use crate::device::{run_batch, AlignedBuf, BlockDevice, IoOp, IoRequest};
use crate::error::Error;
use crate::geometry::MetaLayout;
use crate::map::SsdBlock;
use crate::map::{BlockEntry, FileMap};
use crate::meta::Attr;
use crate::meta::{FileKind, Ino, Inode, InodeData, MetaState};

const UUID: [u8; 16] = [3; 16];

fn add(state: &MetaState, ino: u64, kind: FileKind, parent: Ino, name: &[u8]) -> Arc<Inode> {
    let attr = Attr { ino: Ino(ino), kind, perm: 0o640, uid: 7, gid: 8, nlink: 1, size: 0, rdev: 0, atime: 1, mtime: 2, ctime: 3 };
    let data = InodeData { attr, entries: BTreeMap::new(), parent, target: Vec::new(), xattrs: BTreeMap::new() };
    state.insert(Inode::new(data, FileMap::new()));
    state.get(parent).unwrap().data.lock().entries.insert(name.to_vec(), Ino(ino));
    state.get(Ino(ino)).unwrap()
}

fn sample() -> MetaState {
    let state = MetaState::fresh(0, 0, 5);
    add(&state, 2, FileKind::Dir, Ino::ROOT, b"dir");
    let file = add(&state, 3, FileKind::File, Ino(2), &[b'f'; 255]);
    for lblock in [0, 1, 2, 3, 4, 9, 1000] {
        file.map.lock().insert(lblock, BlockEntry::Ssd { block: SsdBlock(100 + lblock), overlays: vec![], shared: false });
    }
    file.data.lock().attr.size = 1001 * 4096;
    file.data.lock().xattrs.insert(b"user.a".to_vec(), vec![9; 3000]);
    add(&state, 4, FileKind::Symlink, Ino::ROOT, b"link").data.lock().target = b"dir/ffff".to_vec();
    state
}

fn describe(state: &MetaState) -> Vec<String> {
    state
        .snapshot()
        .iter()
        .map(|i| {
            let d = i.data.lock();
            format!("{:?} {:?} {:?} {:?} {:?} {:?}", d.attr, d.parent, d.entries, d.target, d.xattrs, i.map.lock())
        })
        .collect()
}

#[test]
fn an_image_reads_back_its_state() {
    let state = sample();
    let image = LineStore::image_of(&state, UUID, 64 << 10).unwrap();
    let loaded = parse_image(&image, UUID, 1, 4096).unwrap();
    assert_eq!(describe(&loaded.state), describe(&state));
    assert_eq!(loaded.state.next_ino.load(Ordering::SeqCst), 5);
    assert!(loaded.orphans.is_empty());
    assert!(matches!(parse_image(&image, [4; 16], 1, 4096), Err(Error::Corrupt { .. })), "another volume's area");
}

/// A used line no record covers, or a record with a line marked free, is refused.
#[test]
fn the_bitmap_and_the_records_must_agree() {
    let image = LineStore::image_of(&sample(), UUID, 64 << 10).unwrap();
    let shape = Shape::of(image.len() as u64);
    let used: Vec<u64> = (shape.first_record..shape.total_lines).filter(|&l| shape.is_used(&image, l)).collect();
    let last = *used.last().unwrap();
    for (line, set) in [(last + 1, true), (used[1], false)] {
        let mut bad = image.clone();
        let (byte, mask) = shape.bit(line);
        bad[byte] = if set { bad[byte] | mask } else { bad[byte] & !mask };
        assert!(matches!(parse_image(&bad, UUID, 1, 4096), Err(Error::Corrupt { .. })), "line {line} set {set}");
    }
}

/// A commit of more than 119 sectors has a sector list past the header sector's first
/// 512 bytes. A header torn there (new count and checksum, an older commit's list) is
/// ignored, not replayed into the wrong sectors.
#[test]
fn a_redo_header_torn_inside_its_list_is_ignored() {
    const AREA: u64 = 2 << 20;
    let layout = MetaLayout {
        checkpoint_bytes: AREA / 2,
        checkpoint_a_offset: 0,
        checkpoint_b_offset: AREA / 2,
        journal_offset: AREA,
        journal_bytes: AREA,
        pages_offset: 2 * AREA,
        page_count: 0,
    };
    let ssd: Arc<dyn BlockDevice> = Arc::new(SimSsd::new(2 * AREA));
    let mut store = LineStore::empty(Arc::clone(&ssd), None, &layout, UUID, "test".into());
    let evens: Vec<u64> = (0..200).map(|i| 2 * i).collect();
    let odds: Vec<u64> = (0..200).map(|i| 2 * i + 1).collect();
    let header = |ssd: &Arc<dyn BlockDevice>| {
        let request = IoRequest { op: IoOp::Read, offset_bytes: AREA, buf: AlignedBuf::zeroed(SECTOR) };
        run_batch(ssd.as_ref(), vec![request]).unwrap().pop().unwrap()
    };
    store.mirror.fill(1);
    store.write_through_redo(&evens).unwrap();
    let older = header(&ssd);
    store.mirror.fill(2);
    store.write_through_redo(&odds).unwrap();
    let newer = header(&ssd);

    let replayed_after = |head: &[u8]| {
        let mut buf = AlignedBuf::zeroed(SECTOR);
        buf.copy_from_slice(head);
        run_batch(ssd.as_ref(), vec![IoRequest { op: IoOp::Write, offset_bytes: AREA, buf }]).unwrap();
        let mut fresh = LineStore::empty(Arc::clone(&ssd), None, &layout, UUID, "test".into());
        fresh.replay_redo(true).unwrap().into_iter().collect::<Vec<_>>()
    };
    assert_eq!(replayed_after(&newer), odds, "a whole header replays");
    let torn = [&newer[..512], &older[512..]].concat();
    assert!(replayed_after(&torn).is_empty(), "a header torn inside its list is not replayed");
}

/// Allocation takes the first free run after the last one, wraps around once, and says
/// when nothing fits.
#[test]
fn allocation_wraps_and_reports_a_full_area() {
    let layout = MetaLayout {
        checkpoint_bytes: 4096,
        checkpoint_a_offset: 0,
        checkpoint_b_offset: 4096,
        journal_offset: 8192,
        journal_bytes: 8192,
        pages_offset: 16384,
        page_count: 0,
    };
    let mut store = LineStore::empty(Arc::new(SimSsd::new(16384)), None, &layout, UUID, "test".into());
    let record_lines = store.shape.total_lines - store.shape.first_record;
    let target = |ino: u64, len: usize| Record::Target { ino: Ino(ino), target: vec![b'x'; len] };
    // Two-line records until the area is full.
    let mut ino = 1;
    while store.put(target(ino, 100)).is_ok() {
        ino += 1;
    }
    assert_eq!(ino - 1, record_lines / 2);
    assert!(matches!(store.put(target(ino, 100)), Err(Error::MetadataFull(_))));
    // Free two neighbours and one elsewhere: a three-line record takes the pair's room.
    for i in [3, 4, 10] {
        store.remove(&Key::Object(Ino(i), Part::Target));
    }
    store.put(target(1000, 150)).unwrap();
    assert_eq!(store.index[&Key::Object(Ino(1000), Part::Target)].line, store.shape.first_record + 4);
    assert_eq!(store.used_lines, record_lines - 2 - 1);
}
