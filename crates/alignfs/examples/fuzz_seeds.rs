//! Seed inputs for the fuzz targets (fuzz/fuzz_targets), made by the encoders the engine
//! itself writes with: `cargo run -p alignfs --example fuzz_seeds -- DIR` writes
//! `DIR/<target>/seed-N`. `scripts/fuzz.sh` runs it before fuzzing, so that each target
//! starts from inputs that decode (checksums, counts and cross-references right) and
//! mutates from there, instead of spending its time finding a valid header.
//!
//! Targets without seeds here: `superblock` patches the magic and checksum into its
//! inputs itself, `kv_journal` and `mssd_recovery` damage a valid store or device they
//! build, and `nbd_messages` parses plain fields.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use alignfs::codec::{Decoder, Encoder};
use alignfs::device::PmemRegion;
use alignfs::journal::{checkpoint_payload, decode_entry, decode_ops, decode_state, encode_entry, encode_ops, AsIs, Journal, PmemWindow};
use alignfs::kv::records::{encode_name_key, AttrRecord, BlockKey, BlockValue, FragmentKey, FragmentValue, Onode};
use alignfs::lines::{parse_image, LineStore};
use alignfs::map::{BlockEntry, Chunks, Overlay, PageNo, SsdBlock};
use alignfs::meta::{apply, Attr, DataOp, FileKind, Ino, MetaState, NamespaceOp, Op};
use alignfs::personality::BlockLayout;

/// The geometry the targets decode with: 8 pages of 4 KiB per block.
const PAGES_PER_BLOCK: usize = 8;
const PAGE_BYTES: u32 = 4096;
/// The volume of the `lines_area` seeds (fuzz/fuzz_targets/lines_area.rs).
const LINES_UUID: [u8; 16] = [0x42; 16];

fn attr(ino: u64, kind: FileKind, perm: u16, size: u64) -> Attr {
    let t = 1_700_000_000_000_000_000 + ino as i64;
    Attr { ino: Ino(ino), kind, perm, uid: 1000, gid: 100, nlink: 1, size, rdev: 0, atime: t, mtime: t, ctime: t }
}

/// Map entries of every shape: fast pages, an SSD block alone, shared, and with whole-page
/// and partial-page overlays.
fn entries() -> Vec<BlockEntry> {
    vec![
        BlockEntry::Fast { pages: vec![(0, PageNo(3)), (5, PageNo(4))] },
        BlockEntry::Fast { pages: Vec::new() },
        BlockEntry::Ssd { block: SsdBlock(17), overlays: Vec::new(), shared: false },
        BlockEntry::Ssd { block: SsdBlock(18), overlays: Vec::new(), shared: true },
        BlockEntry::Ssd {
            block: SsdBlock(19),
            overlays: vec![
                (1, Overlay::Page(PageNo(7))),
                (6, Overlay::Upage { page: PageNo(8), chunks: Chunks::single(100, 612).with(2000, 4096) }),
            ],
            shared: false,
        },
    ]
}

/// Op lists as the engine commits them: a tree of every kind of node, writes, renames,
/// links, attributes and removals.
fn op_lists() -> Vec<Vec<Op>> {
    let t = 1_700_000_000_000_000_100;
    let create = |parent: u64, name: &str, attr: Attr, target: &[u8]| -> Op {
        NamespaceOp::Create { parent: Ino(parent), name: name.into(), attr, target: target.to_vec() }.into()
    };
    let entries = entries();
    vec![
        vec![create(1, "dir", attr(2, FileKind::Dir, 0o755, 0), b"")],
        vec![
            create(2, "file", attr(3, FileKind::File, 0o644, 0), b""),
            DataOp::Map { ino: Ino(3), lblock: 0, entry: Some(entries[4].clone()) }.into(),
            DataOp::Map { ino: Ino(3), lblock: 1, entry: Some(entries[0].clone()) }.into(),
            DataOp::Extend { ino: Ino(3), size: 40_000, mtime: t }.into(),
        ],
        vec![
            create(1, "link", attr(4, FileKind::Symlink, 0o777, 8), b"dir/file"),
            create(2, "fifo", attr(5, FileKind::Fifo, 0o600, 0), b""),
            NamespaceOp::SetXattr { ino: Ino(3), name: b"user.tag".to_vec(), value: Some(b"seed".to_vec()), ctime: t }.into(),
        ],
        vec![
            DataOp::Map { ino: Ino(3), lblock: 2, entry: Some(entries[2].clone()) }.into(),
            DataOp::Map { ino: Ino(3), lblock: 1, entry: None }.into(),
            DataOp::SetSize { ino: Ino(3), size: 70_000, time: t }.into(),
            NamespaceOp::SetAttr { ino: Ino(3), perm: Some(0o600), uid: Some(0), gid: None, atime: None, mtime: Some(t), ctime: t }.into(),
        ],
        vec![
            NamespaceOp::Link { parent: Ino(1), name: b"hard".to_vec(), ino: Ino(3), time: t }.into(),
            NamespaceOp::Rename {
                from_parent: Ino(2),
                from_name: b"fifo".to_vec(),
                to_parent: Ino(1),
                to_name: b"pipe".to_vec(),
                exchange: false,
                time: t,
            }
            .into(),
            NamespaceOp::Unlink { parent: Ino(1), name: b"hard".to_vec(), time: t }.into(),
        ],
    ]
}

struct Seeds {
    dir: PathBuf,
    written: usize,
}

impl Seeds {
    fn put(&mut self, target: &str, name: &str, bytes: &[u8]) {
        let dir = self.dir.join(target);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
        let path = dir.join(format!("seed-{name}"));
        std::fs::write(&path, bytes).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        self.written += 1;
    }
}

fn main() {
    let Some(dir) = std::env::args_os().nth(1) else {
        eprintln!("usage: fuzz_seeds DIR (writes DIR/<target>/seed-*)");
        std::process::exit(2);
    };
    let mut seeds = Seeds { dir: Path::new(&dir).to_path_buf(), written: 0 };

    let lists = op_lists();
    let state = MetaState::fresh(0, 0, 1_700_000_000_000_000_000);
    for (i, ops) in lists.iter().enumerate() {
        // Every seed is checked with the decoder its target runs: one that did not decode
        // would only send the fuzzer back to finding a valid header.
        let record = encode_ops(ops);
        assert_eq!(decode_ops(&record, PAGES_PER_BLOCK, PAGE_BYTES).as_ref(), Ok(ops), "op list {i} reads back");
        seeds.put("journal_ops", &i.to_string(), &record);
        for op in ops {
            apply(&state, op).unwrap_or_else(|e| panic!("op {op:?} does not apply: {e:?}"));
        }
        // The state after each commit, as a checkpoint records it.
        let checkpoint = checkpoint_payload(&state, &[i as u64, 7, 0], &AsIs);
        decode_state(&checkpoint, PAGES_PER_BLOCK, PAGE_BYTES).unwrap_or_else(|e| panic!("checkpoint {i}: {e:?}"));
        seeds.put("checkpoint", &i.to_string(), &checkpoint);
        // The same state as `byte`'s in-place metadata area.
        let area = LineStore::image_of(&state, LINES_UUID, 16 << 10).expect("the state fits 16 KiB of lines");
        parse_image(&area, LINES_UUID, PAGES_PER_BLOCK, PAGE_BYTES).unwrap_or_else(|e| panic!("lines area {i}: {e:?}"));
        seeds.put("lines_area", &i.to_string(), &area);
    }

    for (i, entry) in entries().iter().enumerate() {
        let mut e = Encoder::new();
        encode_entry(&mut e, entry);
        let decoded = decode_entry(&mut Decoder::new(&e.bytes), PAGES_PER_BLOCK, PAGE_BYTES);
        assert_eq!(decoded.as_ref(), Ok(entry), "map entry {i} reads back");
        seeds.put("map_entry", &i.to_string(), &e.bytes);
    }

    // A journal region holding every op list as a record, from sequence number 5; the
    // target reads its first 8 bytes as that number.
    let len = 16 * u64::from(PAGE_BYTES);
    let region = Arc::new(PmemRegion::anonymous(len).expect("an anonymous region"));
    let first_seq = 5;
    let mut journal = Journal::resume(Box::new(PmemWindow::new(region.clone(), 0, len)), 0, first_seq);
    for ops in &lists {
        assert!(journal.append(&encode_ops(ops), 0).expect("an append"), "the records fit the region");
    }
    let mut log = vec![0u8; journal.used_bytes() as usize];
    region.read(0, &mut log);
    let replay = Journal::replay(&PmemWindow::new(region, 0, len), first_seq, "seed").expect("the journal replays");
    assert_eq!(replay.payloads.len(), lists.len(), "every record replays");
    seeds.put("journal_replay", "0", &[&first_seq.to_le_bytes()[..], &log].concat());

    let mut layout = BlockLayout::new(1 << 30);
    for (i, zone_offset) in [(0, 1 << 20), (1, 4 << 20)] {
        let bytes = layout.encode(zone_offset);
        assert_eq!(BlockLayout::decode(&bytes).ok(), Some((layout.clone(), zone_offset)), "layout {i} reads back");
        seeds.put("block_layout", &i.to_string(), &bytes);
        layout.sector_bytes = 4096;
        layout.nvm_ranges = vec![0..(1 << 20), (8 << 20)..(9 << 20)];
    }

    let block = BlockKey { object: Ino(9), lblock: 3 };
    assert_eq!(BlockKey::decode(&block.encode()).ok(), Some(block));
    seeds.put("kv_records", "block-key", &block.encode());
    let fragment_key = FragmentKey { block, order: 2 };
    assert_eq!(FragmentKey::decode(&fragment_key.encode()).ok(), Some(fragment_key));
    seeds.put("kv_records", "fragment-key", &fragment_key.encode());
    let value = BlockValue { csum: 0xdead_beef, block: Some(SsdBlock(42)), fragments: true, shared: false };
    assert_eq!(BlockValue::decode(&value.encode()).ok(), Some(value));
    seeds.put("kv_records", "block-value", &value.encode());
    let onode = Onode { size: 4 << 20, flags: 0 };
    assert_eq!(Onode::decode(&onode.encode()).ok(), Some(onode));
    seeds.put("kv_records", "onode", &onode.encode());
    let fragment = FragmentValue::of(2048, &[0x5a; 2048]).encode();
    assert!(FragmentValue::decode(&fragment, 8192).is_ok());
    seeds.put("kv_records", "fragment", &fragment);
    let record = AttrRecord {
        kind: FileKind::File,
        perm: 0o644,
        uid: 1000,
        gid: 100,
        nlink: 1,
        atime: 1,
        mtime: 2,
        ctime: 3,
        parent: Ino(1),
        target: Vec::new(),
        xattrs: BTreeMap::from([(b"user.etag".to_vec(), b"0123456789abcdef".to_vec())]),
    };
    assert_eq!(AttrRecord::decode(&record.encode()).ok(), Some(record.clone()));
    seeds.put("kv_records", "attr", &record.encode());
    seeds.put("kv_records", "name", &encode_name_key(Ino(1), b"bucket/key"));

    println!("{} seeds in {}", seeds.written, seeds.dir.display());
}
