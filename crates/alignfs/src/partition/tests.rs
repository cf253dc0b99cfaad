#![allow(clippy::unwrap_used)]
//! The partitioner against a model: random file states (fast blocks, SSD blocks with page
//! and upage overlays, holes) and random writes; the plan is executed on an in-memory store
//! and the resulting file bytes are compared with a reference.

use std::collections::{BTreeMap, HashMap};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;
use crate::geometry::{SCRAP_MAX_SEGMENTS, UPAGE_MAX_CHUNKS};
use crate::test_support::{scaled, seed};

#[derive(Default)]
struct Store {
    pages: HashMap<PageNo, Vec<u8>>,
    blocks: HashMap<SsdBlock, Vec<u8>>,
    next: u64,
}

impl Store {
    fn fresh_page(&mut self, g: &Geometry, rng: &mut StdRng) -> PageNo {
        self.next += 1;
        let p = PageNo(self.next);
        self.pages.insert(p, (0..g.page_bytes).map(|_| rng.random()).collect());
        p
    }
    fn fresh_block(&mut self, g: &Geometry, rng: &mut StdRng) -> SsdBlock {
        self.next += 1;
        let b = SsdBlock(self.next);
        self.blocks.insert(b, (0..g.block_bytes).map(|_| rng.random()).collect());
        b
    }

    fn materialize(&self, entry: Option<&BlockEntry>, g: &Geometry) -> Vec<u8> {
        let page = g.page_bytes as usize;
        let mut out = vec![0u8; g.block_bytes as usize];
        match entry {
            None => {}
            Some(BlockEntry::Fast { pages }) => {
                for (i, p) in pages {
                    let at = *i as usize * page;
                    out[at..at + page].copy_from_slice(&self.pages[p]);
                }
            }
            Some(BlockEntry::Ssd { block, overlays, .. }) => {
                out.copy_from_slice(&self.blocks[block]);
                for (i, o) in overlays {
                    let at = *i as usize * page;
                    let data = &self.pages[&o.page()];
                    match o {
                        Overlay::Page(_) => out[at..at + page].copy_from_slice(data),
                        Overlay::Upage { chunks, .. } => {
                            for &(s, e) in chunks.ranges() {
                                let (s, e) = (s as usize, e as usize);
                                out[at + s..at + e].copy_from_slice(&data[s..e]);
                            }
                        }
                    }
                }
            }
        }
        out
    }
}

fn random_chunks(rng: &mut StdRng, page: u32) -> Chunks {
    let mut chunks = Chunks::default();
    for _ in 0..rng.random_range(1..=6) {
        let s = rng.random_range(0..page - 1);
        let e = rng.random_range(s + 1..=page.min(s + page / 4 + 1));
        let next = chunks.with(s, e);
        if next.len() <= UPAGE_MAX_CHUNKS && !next.covers_whole(page) {
            chunks = next;
        }
    }
    if chunks.is_empty() {
        chunks = Chunks::single(0, 1);
    }
    chunks
}

fn random_entry(rng: &mut StdRng, store: &mut Store, g: &Geometry) -> Option<BlockEntry> {
    let ppb = g.pages_per_block() as u8;
    match rng.random_range(0..3) {
        0 => None,
        1 => {
            let mut pages = Vec::new();
            for i in 0..ppb {
                if rng.random_bool(0.5) {
                    pages.push((i, store.fresh_page(g, rng)));
                }
            }
            Some(BlockEntry::Fast { pages })
        }
        _ => {
            let block = store.fresh_block(g, rng);
            let mut overlays = Vec::new();
            for i in 0..ppb {
                match rng.random_range(0..4) {
                    0 => overlays.push((i, Overlay::Page(store.fresh_page(g, rng)))),
                    1 => {
                        let chunks = random_chunks(rng, g.page_bytes);
                        overlays.push((i, Overlay::Upage { page: store.fresh_page(g, rng), chunks }));
                    }
                    _ => {}
                }
            }
            Some(BlockEntry::Ssd { block, overlays, shared: false })
        }
    }
}

/// Execute one block plan on the store, the way the volume does.
fn execute(store: &mut Store, rng: &mut StdRng, g: &Geometry, current: Option<&BlockEntry>, plan: &BlockPlan, data: &[u8]) -> NextEntry {
    let block_data = &data[plan.src..plan.src + (plan.end - plan.start) as usize];
    let new_block = plan.needs_ssd_block().then(|| store.fresh_block(g, rng));
    if let Some(b) = new_block {
        let mut bytes =
            if plan.action == BlockAction::Rewrite { store.materialize(current, g) } else { vec![0xEE; g.block_bytes as usize] };
        bytes[plan.start as usize..plan.end as usize].copy_from_slice(block_data);
        store.blocks.insert(b, bytes);
    }
    let mut new_pages = Vec::new();
    if let BlockAction::Fast(pages) | BlockAction::Overlay(pages) = &plan.action {
        for p in pages {
            let bytes = &data[p.src..p.src + (p.end - p.start) as usize];
            let target = match &p.target {
                PageTarget::InPlace(x) | PageTarget::UpageToPage(x) | PageTarget::InPlaceUpage { page: x, .. } => *x,
                PageTarget::NewPage { zero_fill } => {
                    let x = store.fresh_page(g, rng);
                    if *zero_fill {
                        store.pages.get_mut(&x).unwrap().fill(0);
                    }
                    new_pages.push(x);
                    x
                }
                PageTarget::NewUpage => {
                    let x = store.fresh_page(g, rng);
                    new_pages.push(x);
                    x
                }
            };
            store.pages.get_mut(&target).unwrap()[p.start as usize..p.end as usize].copy_from_slice(bytes);
        }
    }
    next_entry(current, plan, new_block, &new_pages)
}

/// One random case, checked step by step against the model; longer than 80 lines because
/// the steps read best as one sequence.
fn check_case(rng: &mut StdRng, g: &Geometry, rules: Rules) {
    let block = g.block();
    let nblocks = rng.random_range(1..=5u64);
    let mut store = Store::default();
    let mut map: BTreeMap<u64, BlockEntry> = BTreeMap::new();
    for lb in 0..nblocks {
        if let Some(e) = random_entry(rng, &mut store, g) {
            map.insert(lb, e);
        }
    }
    let file_size = rng.random_range(0..=nblocks * block);
    let span = (nblocks + 1) * block;
    let offset = rng.random_range(0..span);
    let len = match rng.random_range(0..4) {
        0 => rng.random_range(1..=64),
        1 => rng.random_range(1..=g.page()),
        2 => block * rng.random_range(1..=3),
        _ => rng.random_range(1..=span - offset),
    }
    .min(span + block - offset);
    let data: Vec<u8> = (0..len).map(|_| rng.random()).collect();

    let before: Vec<Vec<u8>> = (0..=span / block + 3).map(|lb| store.materialize(map.get(&lb), g)).collect();
    let mut plan = partition(offset, len, file_size, g, rules, |lb| map.get(&lb));
    if !plan.merge_first.is_empty() {
        assert_ne!(rules.residue, Residue::Forbidden, "only upages overflow");
        for lb in &plan.merge_first {
            let bytes = store.materialize(map.get(lb), g);
            let b = store.fresh_block(g, rng);
            store.blocks.insert(b, bytes);
            map.insert(*lb, BlockEntry::whole(b));
        }
        plan = partition(offset, len, file_size, g, rules, |lb| map.get(&lb));
        assert!(plan.merge_first.is_empty(), "a merged block never overflows again");
    }
    assert_eq!(plan.new_size, file_size.max(offset + len));

    // Coverage: every byte of the write exactly once, in order.
    let mut covered = 0u64;
    for bp in &plan.blocks {
        assert_eq!(bp.lblock * block + u64::from(bp.start), offset + covered, "contiguous coverage");
        assert_eq!(bp.src as u64, covered);
        match &bp.action {
            BlockAction::Ssd => {
                assert_eq!((bp.start, bp.end), (0, g.block_bytes), "SSD writes are whole blocks");
                assert_ne!(rules.residue, Residue::All, "a small scrap write stays in the buffer");
            }
            BlockAction::Rewrite => assert_eq!(rules.residue, Residue::Forbidden, "no read-before-write with residue allowed"),
            BlockAction::Fast(pages) | BlockAction::Overlay(pages) => {
                let mut inner = bp.start;
                for p in pages {
                    assert_eq!(u32::from(p.index) * g.page_bytes + p.start, inner);
                    assert_eq!(p.src, bp.src + (inner - bp.start) as usize);
                    assert!(p.start < p.end && p.end <= g.page_bytes);
                    inner = u32::from(p.index) * g.page_bytes + p.end;
                }
                assert_eq!(inner, bp.end);
            }
        }
        covered += u64::from(bp.end - bp.start);
    }
    assert_eq!(covered, len);

    // Execute and compare the bytes of every block with the reference.
    for bp in &plan.blocks {
        let next = execute(&mut store, rng, g, map.get(&bp.lblock), bp, &data);
        let referenced: Vec<PageNo> = next.entry.fast_pages().collect();
        assert!(next.freed_pages.iter().all(|p| !referenced.contains(p)), "freed pages stay unreferenced");
        let mut sorted = referenced.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), referenced.len(), "no page shared within a block");
        map.insert(bp.lblock, next.entry);
    }
    for (lb, old) in before.iter().enumerate() {
        let lb = lb as u64;
        let mut expected = old.clone();
        let (bs, be) = (lb * block, (lb + 1) * block);
        let (ws, we) = (offset.max(bs), (offset + len).min(be));
        if ws < we {
            expected[(ws - bs) as usize..(we - bs) as usize].copy_from_slice(&data[(ws - offset) as usize..(we - offset) as usize]);
        }
        assert!(store.materialize(map.get(&lb), g) == expected, "block {lb} differs after write {offset}+{len}");
    }
}

fn geometries() -> Vec<Geometry> {
    vec![
        Geometry::default(),
        Geometry { block_bytes: 4096, page_bytes: 512, split_bytes: 4096, io_workers: 1 },
        Geometry { block_bytes: 8192, page_bytes: 4096, split_bytes: 8192, io_workers: 1 },
        Geometry { block_bytes: 16384, page_bytes: 1024, split_bytes: 65536, io_workers: 1 },
        // A scrap page is one block.
        Geometry { block_bytes: 65536, page_bytes: 65536, split_bytes: 65536, io_workers: 1 },
    ]
}

/// `orch`'s rules, or the slow path's when residue is not allowed.
fn rules(allow_residue: bool) -> Rules {
    Rules { residue: if allow_residue { Residue::Partial } else { Residue::Forbidden }, max_segments: UPAGE_MAX_CHUNKS }
}

#[test]
fn random_writes_match_the_model() {
    let seed = seed("partition::random_writes_match_the_model");
    let mut rng = StdRng::seed_from_u64(seed);
    // Small geometries make a case cheap, so most of the million cases use them.
    let small = Geometry { block_bytes: 4096, page_bytes: 512, split_bytes: 4096, io_workers: 1 };
    let scrap = Geometry { block_bytes: 4096, page_bytes: 4096, split_bytes: 4096, io_workers: 1 };
    let all = geometries();
    for case in 0..scaled(1_000_000) {
        let g = match case % 50 {
            0 => all[(case / 50) as usize % all.len()],
            1..=10 => scrap,
            _ => small,
        };
        let rules = match case % 7 {
            0 => rules(false),
            1 | 2 => Rules { residue: Residue::All, max_segments: SCRAP_MAX_SEGMENTS },
            _ => rules(true),
        };
        check_case(&mut rng, &g, rules);
    }
}

#[test]
fn orchfs_paper_example() {
    // Figure 8 of the paper: a 154 KiB file, a 105 KiB write at 89 KiB.
    let g = Geometry::default();
    let k = 1024u64;
    let mut map = BTreeMap::new();
    // Block 2 (64–96 KiB) is on the SSD with an upage over page 7 (92–96 KiB holds none),
    // block 3 (96–128 KiB) on the SSD with an upage on page 3 (the 109–110 KiB update),
    // block 4 (128–160 KiB) in fast pages (the partial tail).
    map.insert(
        2,
        BlockEntry::Ssd {
            shared: false,
            block: SsdBlock(1),
            overlays: vec![(5, Overlay::Upage { page: PageNo(9), chunks: Chunks::single(100, 200) })],
        },
    );
    map.insert(
        3,
        BlockEntry::Ssd {
            shared: false,
            block: SsdBlock(2),
            overlays: vec![(5, Overlay::Upage { page: PageNo(10), chunks: Chunks::single(0, 1024) })],
        },
    );
    map.insert(4, BlockEntry::Fast { pages: (0..7).map(|i| (i, PageNo(20 + u64::from(i)))).collect() });
    let plan = partition(89 * k, 105 * k, 154 * k, &g, rules(true), |lb| map.get(&lb));
    assert_eq!(plan.new_size, 194 * k);
    let kinds: Vec<(u64, &str)> = plan
        .blocks
        .iter()
        .map(|b| {
            (
                b.lblock,
                match b.action {
                    BlockAction::Ssd => "ssd",
                    BlockAction::Fast(_) => "fast",
                    BlockAction::Overlay(_) => "overlay",
                    BlockAction::Rewrite => "rewrite",
                },
            )
        })
        .collect();
    // 89–96 overlays block 2; 96–128 whole block to SSD (drops block 3's upage). The paper
    // splits at EOF and keeps 128–154 + 154–160 in NVM pages; per block, 128–160 is now
    // covered whole, so it goes to the SSD and frees the tail's pages (alignment first).
    // 160–192 whole block to SSD; 192–194 new fast pages.
    assert_eq!(kinds, vec![(2, "overlay"), (3, "ssd"), (4, "ssd"), (5, "ssd"), (6, "fast")]);
    let next = next_entry(map.get(&3), &plan.blocks[1], Some(SsdBlock(7)), &[]);
    assert_eq!(next.freed_pages, vec![PageNo(10)]);
    assert_eq!(next.freed_block, Some(SsdBlock(2)));
    let BlockAction::Fast(tail) = &plan.blocks[4].action else { unreachable!() };
    assert_eq!(tail.iter().map(|p| &p.target).collect::<Vec<_>>(), vec![&PageTarget::NewPage { zero_fill: true }]);
}

#[test]
fn header_overflow_asks_for_a_merge() {
    let g = Geometry::default();
    let mut chunks = Chunks::default();
    for i in 0..UPAGE_MAX_CHUNKS as u32 {
        chunks = chunks.with(i * 100, i * 100 + 10);
    }
    let map: BTreeMap<u64, BlockEntry> =
        [(0, BlockEntry::Ssd { shared: false, block: SsdBlock(1), overlays: vec![(0, Overlay::Upage { page: PageNo(1), chunks })] })]
            .into();
    let plan = partition(3000, 5, 32768, &g, rules(true), |lb| map.get(&lb));
    assert_eq!(plan.merge_first, vec![0]);
    assert!(plan.blocks.is_empty());
    // Touching an existing chunk merges instead of overflowing.
    let plan = partition(105, 20, 32768, &g, rules(true), |lb| map.get(&lb));
    assert!(plan.merge_first.is_empty());
}
