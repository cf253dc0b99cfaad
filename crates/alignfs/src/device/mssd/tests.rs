use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;
use crate::device::power_loss::{PowerLog, RecordedSsd, Replay, Survival};
use crate::device::{run_batch, PmemRegion, SimSsd};
use crate::geometry::MIB;

const LOGICAL: u64 = MIB;

fn config() -> MssdConfig {
    MssdConfig { log_bytes: MIB, txlog_bytes: 16 * 1024, pages_per_erase_block: 16, ..MssdConfig::new(LOGICAL) }
}

fn options() -> MssdOptions {
    MssdOptions { background_cleaning: false, ..MssdOptions::default() }
}

struct Media {
    flash: Arc<dyn BlockDevice>,
    dram: Arc<dyn ByteTier>,
}

fn media() -> Media {
    let (dram, flash) = MemorySemanticSsd::sizes(&config()).unwrap();
    Media { flash: Arc::new(SimSsd::new(flash)), dram: Arc::new(PmemRegion::anonymous(dram).unwrap()) }
}

fn write_block(ssd: &MemorySemanticSsd, lpa: u64, data: &[u8]) {
    let mut buf = AlignedBuf::zeroed(data.len());
    buf.copy_from_slice(data);
    run_batch(ssd, vec![IoRequest { op: IoOp::Write, offset_bytes: lpa * PAGE, buf }]).unwrap();
}

fn read_block(ssd: &MemorySemanticSsd, lpa: u64, pages: u64) -> Vec<u8> {
    let buf = AlignedBuf::zeroed((pages * PAGE) as usize);
    run_batch(ssd, vec![IoRequest { op: IoOp::Read, offset_bytes: lpa * PAGE, buf }]).unwrap().remove(0).to_vec()
}

fn read_all(ssd: &MemorySemanticSsd) -> Vec<u8> {
    let buf = AlignedBuf::zeroed(LOGICAL as usize);
    let mut out = run_batch(ssd, vec![IoRequest { op: IoOp::Read, offset_bytes: 0, buf }]).unwrap();
    out.remove(0).to_vec()
}

/// Every change, in order, with the transaction it belongs to (0: none).
#[derive(Clone)]
enum Change {
    Bytes { txid: u32, addr: u64, data: Vec<u8> },
    Trim { addr: u64, len: u64 },
}

fn apply(image: &mut [u8], change: &Change) {
    match change {
        Change::Bytes { addr, data, .. } => image[*addr as usize..*addr as usize + data.len()].copy_from_slice(data),
        Change::Trim { addr, len } => image[*addr as usize..(*addr + *len) as usize].fill(0),
    }
}

fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter().zip(b).position(|(x, y)| x != y)
}

/// Compare the whole device with the model; on a difference, name the changes that
/// touched the byte.
fn check(ssd: &MemorySemanticSsd, image: &[u8], changes: &[Change], when: &str) {
    let contents = read_all(ssd);
    let Some(at) = first_difference(&contents, image) else { return };
    let at64 = at as u64;
    let history: Vec<String> = changes
        .iter()
        .enumerate()
        .filter_map(|(i, change)| match change {
            Change::Bytes { txid, addr, data } if (*addr..addr + data.len() as u64).contains(&at64) => {
                Some(format!("#{i} tx {txid}: {} bytes at {addr}", data.len()))
            }
            Change::Trim { addr, len } if (*addr..addr + len).contains(&at64) => Some(format!("#{i} trim")),
            _ => None,
        })
        .collect();
    panic!("{when}: byte {at} is {} on the device, {} in the model; changes there: {history:?}", contents[at], image[at]);
}

/// Random block writes, stores in and out of transactions, trims, loads, flushes,
/// cleanings and reopenings, checked byte for byte against a list of every change. A
/// reopening drops the open transaction's stores and nothing else.
#[test]
fn the_device_reads_back_what_a_list_of_changes_says() {
    for seed in 0..6u64 {
        let mut rng = StdRng::seed_from_u64(seed);
        let media = media();
        // The last two with block writes cached in the DRAM (the baselines' device).
        let options = || MssdOptions { block_cache: seed >= 4, ..options() };
        let mut ssd = MemorySemanticSsd::format(media.flash.clone(), media.dram.clone(), &config(), options()).unwrap();
        let mut changes: Vec<Change> = Vec::new();
        let mut image = vec![0u8; LOGICAL as usize];
        let mut open: Option<TxId> = None;
        let (mut cleanings, mut collections) = (0, 0);
        for step in 0..600 {
            match rng.random_range(0..100) {
                0..=24 => {
                    let pages = rng.random_range(1..4u64);
                    let lpa = rng.random_range(0..LOGICAL / PAGE - pages);
                    let data: Vec<u8> = (0..pages * PAGE).map(|_| rng.random()).collect();
                    write_block(&ssd, lpa, &data);
                    let change = Change::Bytes { txid: 0, addr: lpa * PAGE, data };
                    apply(&mut image, &change);
                    changes.push(change);
                }
                25..=64 => {
                    let len = if rng.random_bool(0.1) { rng.random_range(1..6000) } else { rng.random_range(1..300) };
                    let addr = rng.random_range(0..LOGICAL - len);
                    let data: Vec<u8> = (0..len).map(|_| rng.random()).collect();
                    let tx = if rng.random_bool(0.5) { open } else { None };
                    ssd.store(tx, addr, &data).unwrap();
                    let change = Change::Bytes { txid: tx.map_or(0, |t| t.0), addr, data };
                    apply(&mut image, &change);
                    changes.push(change);
                }
                65..=72 => match open.take() {
                    Some(tx) => {
                        ssd.commit(tx).unwrap();
                        // TxIDs start again after a reopening: the model forgets this one.
                        for change in &mut changes {
                            if let Change::Bytes { txid, .. } = change {
                                if *txid == tx.0 {
                                    *txid = 0;
                                }
                            }
                        }
                    }
                    None => open = Some(ssd.begin()),
                },
                73..=76 => {
                    let lpa = rng.random_range(0..LOGICAL / PAGE - 2);
                    let change = Change::Trim { addr: lpa * PAGE, len: 2 * PAGE };
                    if let Change::Trim { addr, len } = change {
                        ssd.trim(addr, len).unwrap();
                    }
                    apply(&mut image, &change);
                    changes.push(change);
                }
                77..=84 => {
                    let len = rng.random_range(1..9000);
                    let addr = rng.random_range(0..LOGICAL - len);
                    let mut out = vec![0u8; len as usize];
                    ssd.load(addr, &mut out).unwrap();
                    assert_eq!(
                        first_difference(&out, &image[addr as usize..(addr + len) as usize]),
                        None,
                        "seed {seed} step {step}: load at {addr}"
                    );
                }
                85..=89 => ssd.flush().unwrap(),
                90..=93 => ssd.clean().unwrap(),
                _ => {
                    ssd.flush().unwrap();
                    cleanings += ssd.stats().log_cleanings;
                    collections += ssd.stats().gc_runs;
                    drop(ssd);
                    let (reopened, recovery) = MemorySemanticSsd::open(media.flash.clone(), media.dram.clone(), options()).unwrap();
                    ssd = reopened;
                    if let Some(tx) = open.take() {
                        changes.retain(|c| !matches!(c, Change::Bytes { txid, .. } if *txid == tx.0));
                        image.fill(0);
                        changes.iter().for_each(|c| apply(&mut image, c));
                    } else {
                        assert_eq!(recovery.dropped_uncommitted, 0);
                    }
                }
            }
            if step % 50 == 49 {
                check(&ssd, &image, &changes, &format!("seed {seed} step {step}"));
            }
        }
        check(&ssd, &image, &changes, &format!("seed {seed} at the end"));
        cleanings += ssd.stats().log_cleanings;
        collections += ssd.stats().gc_runs;
        assert!(cleanings > 5 && collections > 0, "seed {seed}: the run should clean and collect: {cleanings} {collections}");
    }
}

#[test]
fn cleaning_starts_at_85_percent_and_reads_old_pages_only_for_partial_updates() {
    let media = media();
    let ssd = MemorySemanticSsd::format(media.flash.clone(), media.dram.clone(), &config(), options()).unwrap();
    write_block(&ssd, 0, &[7u8; PAGE as usize]);
    ssd.flush().unwrap();
    // Page 0 gets a partial update; page 1 is covered whole by its stores.
    ssd.store(None, 100, &[1u8; 50]).unwrap();
    for line in 0..PAGE / LINE {
        ssd.store(None, PAGE + line * LINE, &[2u8; LINE as usize]).unwrap();
    }
    ssd.clean().unwrap();
    let stats = ssd.stats();
    assert_eq!((stats.log_cleaned_pages, stats.log_base_reads), (2, 1));
    assert_eq!(ssd.log_usage().0, 0);

    // Fill the log with stores to one page until cleaning runs by itself.
    let before = ssd.stats().log_cleanings;
    let mut stored = 0;
    while ssd.stats().log_cleanings == before {
        ssd.store(None, 8 * PAGE + (stored % 64) * LINE, &[3u8; LINE as usize]).unwrap();
        stored += 1;
        assert!(stored < MIB / LINE, "cleaning never started");
    }
    // Each 64-byte store takes 128 bytes of log (a 32-byte header, in whole lines).
    let at_clean = stored * 2 * LINE;
    assert!(at_clean * 100 >= 85 * MIB && at_clean * 100 < 87 * MIB, "cleaned at {at_clean} bytes of {MIB}");
    let mut out = vec![0u8; 64];
    ssd.load(8 * PAGE, &mut out).unwrap();
    assert_eq!(out, vec![3u8; 64]);
}

#[test]
fn flash_traffic_to_named_metadata_pages_is_counted_on_every_path() {
    let media = media();
    let ssd = MemorySemanticSsd::format(media.flash.clone(), media.dram.clone(), &config(), options()).unwrap();
    // Pages 1 and 2 (any range overlapping a page names it), and 6; overlaps merge.
    ssd.count_as_metadata(&[PAGE + 100..2 * PAGE + 1, 2 * PAGE..2 * PAGE + 8, 6 * PAGE..7 * PAGE, 9 * PAGE..9 * PAGE]);
    let start = ssd.stats();
    write_block(&ssd, 0, &[1u8; 4 * PAGE as usize]);
    let stats = ssd.stats();
    assert_eq!(stats.flash_program_bytes - start.flash_program_bytes, 4 * PAGE);
    assert_eq!(stats.flash_program_metadata_bytes - start.flash_program_metadata_bytes, 2 * PAGE, "block writes: pages 1 and 2");
    read_block(&ssd, 0, 4);
    let read = ssd.stats();
    assert_eq!(read.flash_read_metadata_bytes - stats.flash_read_metadata_bytes, 2 * PAGE, "block reads: pages 1 and 2");
    // Cleaning writes back page 6 (metadata, whole) and page 1 (metadata, partial: its base
    // is read) and page 8 (data).
    for line in 0..PAGE / LINE {
        ssd.store(None, 6 * PAGE + line * LINE, &[2u8; LINE as usize]).unwrap();
    }
    ssd.store(None, PAGE + 64, &[3u8; 64]).unwrap();
    ssd.store(None, 8 * PAGE, &[4u8; 64]).unwrap();
    ssd.clean().unwrap();
    let cleaned = ssd.stats();
    assert_eq!(cleaned.log_cleaned_pages - read.log_cleaned_pages, 3);
    assert_eq!(cleaned.flash_program_metadata_bytes - read.flash_program_metadata_bytes, 2 * PAGE, "cleaning: pages 1 and 6");
    assert_eq!(cleaned.flash_read_metadata_bytes - read.flash_read_metadata_bytes, PAGE, "cleaning read page 1's base");
    // Replacing the ranges with none stops the counting.
    ssd.count_as_metadata(&[]);
    write_block(&ssd, 1, &[5u8; PAGE as usize]);
    assert_eq!(ssd.stats().flash_program_metadata_bytes, cleaned.flash_program_metadata_bytes);
}

#[test]
fn opening_reports_what_recovery_scanned_and_wrote_back() {
    let media = media();
    let ssd = MemorySemanticSsd::format(media.flash.clone(), media.dram.clone(), &config(), options()).unwrap();
    write_block(&ssd, 2, &[9u8; PAGE as usize]);
    ssd.flush().unwrap();
    ssd.store(None, 10, &[1u8; 100]).unwrap();
    ssd.store(None, 2 * PAGE + 64, &[2u8; 64]).unwrap();
    ssd.store(None, 7 * PAGE, &[3u8; 64]).unwrap();
    ssd.verify();
    drop(ssd);
    let (ssd, recovery) = MemorySemanticSsd::open(media.flash.clone(), media.dram.clone(), options()).unwrap();
    assert_eq!(recovery.replayed, 3);
    // Each entry is a 32-byte header and its bytes, in whole 64-byte lines.
    assert_eq!(recovery.log_bytes, 3 * LINE + 2 * LINE + 2 * LINE);
    assert_eq!(recovery.pages_written, 3, "one page per page with entries");
    assert_eq!(recovery.base_reads, 1, "only the page with flash data under a partial update is read");
    assert!(recovery.total_us >= recovery.clean_us && recovery.total_us >= recovery.scan_us);
    let mut out = [0u8; 128];
    ssd.load(2 * PAGE, &mut out).unwrap();
    assert_eq!(&out[..64], &[9u8; 64]);
    assert_eq!(&out[64..], &[2u8; 64]);
    drop(ssd);
    let (_, again) = MemorySemanticSsd::open(media.flash.clone(), media.dram.clone(), options()).unwrap();
    assert!(!again.found_entries() && again.log_bytes == 0 && again.pages_written == 0, "{again:?}");
}

#[test]
fn cached_block_writes_wait_in_the_dram_until_cleaning() {
    let media = media();
    let options = MssdOptions { block_cache: true, ..options() };
    let ssd = MemorySemanticSsd::format(media.flash.clone(), media.dram.clone(), &config(), options).unwrap();
    let programmed = ssd.stats().flash_program_bytes;
    write_block(&ssd, 3, &[5u8; 2 * PAGE as usize]);
    write_block(&ssd, 3, &[6u8; PAGE as usize]);
    ssd.flush().unwrap();
    let stats = ssd.stats();
    assert_eq!(stats.flash_program_bytes, programmed, "nothing reaches flash before cleaning");
    assert_eq!(stats.block_write_bytes, 3 * PAGE, "host traffic is counted as block writes");
    assert_eq!(stats.byte_store_bytes, 0);
    let out = read_block(&ssd, 3, 2);
    assert!(out[..PAGE as usize].iter().all(|&b| b == 6) && out[PAGE as usize..].iter().all(|&b| b == 5));
    drop(ssd);
    // Reopened (as after a power cut: the DRAM kept what the flush verified), recovery
    // replays the three entries and writes each page to flash once, newest bytes on top.
    let (ssd, recovery) = MemorySemanticSsd::open(media.flash.clone(), media.dram.clone(), options).unwrap();
    assert_eq!((recovery.replayed, recovery.pages_written), (3, 2), "{recovery:?}");
    assert_eq!(read_block(&ssd, 3, 2), out);
}

#[test]
fn an_open_transaction_survives_cleaning_and_stays_atomic() {
    let media = media();
    let ssd = MemorySemanticSsd::format(media.flash.clone(), media.dram.clone(), &config(), options()).unwrap();
    ssd.store(None, 0, b"committed").unwrap();
    let tx = ssd.begin();
    ssd.store(Some(tx), 3, b"OPEN").unwrap();
    ssd.store(Some(tx), 5 * PAGE, b"second page").unwrap();
    ssd.clean().unwrap();
    assert!(ssd.stats().log_migrated_bytes > 0, "the open transaction's entries moved");
    let mut out = [0u8; 9];
    ssd.load(0, &mut out).unwrap();
    assert_eq!(&out, b"comOPENed", "reads see the newest bytes");
    ssd.verify();
    drop(ssd);
    let (ssd, recovery) = MemorySemanticSsd::open(media.flash.clone(), media.dram.clone(), options()).unwrap();
    assert_eq!(recovery.dropped_uncommitted, 2);
    ssd.load(0, &mut out).unwrap();
    assert_eq!(&out, b"committed", "an uncommitted transaction is dropped whole");
    let mut second = [0u8; 11];
    ssd.load(5 * PAGE, &mut second).unwrap();
    assert_eq!(second, [0u8; 11]);

    let tx = ssd.begin();
    ssd.store(Some(tx), 3, b"DONE").unwrap();
    ssd.clean().unwrap();
    ssd.commit(tx).unwrap();
    drop(ssd);
    let (ssd, _) = MemorySemanticSsd::open(media.flash.clone(), media.dram.clone(), options()).unwrap();
    ssd.load(0, &mut out).unwrap();
    assert_eq!(&out, b"comDONEed", "committed after its entries were migrated");
}

#[test]
fn bad_requests_are_errors_that_change_nothing() {
    let media = media();
    let ssd = MemorySemanticSsd::format(media.flash.clone(), media.dram.clone(), &config(), options()).unwrap();
    assert!(matches!(ssd.store(None, LOGICAL - 2, b"abc"), Err(Error::OutOfRange { .. })));
    assert!(matches!(ssd.store(Some(TxId(99)), 0, b"abc"), Err(Error::NoSuchTransaction(99))));
    assert!(matches!(ssd.commit(TxId(99)), Err(Error::NoSuchTransaction(99))));
    assert!(matches!(ssd.trim(100, PAGE), Err(Error::Unaligned { .. })));
    let mut out = [0u8; 8];
    assert!(ssd.load(LOGICAL - 4, &mut out).is_err());
    let buf = AlignedBuf::zeroed(PAGE as usize);
    assert!(run_batch(&ssd, vec![IoRequest { op: IoOp::Write, offset_bytes: LOGICAL, buf }]).is_err());
    assert_eq!(ssd.log_usage().0, 0);
    assert_eq!(read_all(&ssd), vec![0u8; LOGICAL as usize]);

    let small = Arc::new(SimSsd::new(PAGE * 8));
    let err = MemorySemanticSsd::format(small, media.dram.clone(), &config(), options()).err().expect("a flash image too small");
    assert!(err.to_string().contains("flash image"), "{err}");
    let blank: Arc<dyn ByteTier> = Arc::new(PmemRegion::anonymous(1 << 20).unwrap());
    assert!(matches!(MemorySemanticSsd::open(media.flash.clone(), blank, options()), Err(Error::NotFormatted(_))));
}

/// The log head lives outside the header's checksum (it moves with every cleaning). One
/// that damage moved off a line made recovery read past the log and the DRAM (found by
/// the `mssd_recovery` fuzz target): it is a damaged header now.
#[test]
fn a_log_head_off_a_line_is_a_damaged_header() {
    let media = media();
    let ssd = MemorySemanticSsd::format(media.flash.clone(), media.dram.clone(), &config(), options()).unwrap();
    ssd.store(None, 100, b"before").unwrap();
    ssd.verify();
    ssd.halt();
    drop(ssd);
    let mut head = [0u8; 8];
    media.dram.read(Layout::head_at(), &mut head);
    let moved = u64::from_le_bytes(head) + 8;
    media.dram.write(Layout::head_at(), &moved.to_le_bytes());
    media.dram.persist(Layout::head_at(), 8);
    let err = MemorySemanticSsd::open(media.flash.clone(), media.dram.clone(), options()).err().expect("a damaged head");
    assert!(matches!(err, Error::Corrupt { .. }), "{err}");
}

/// What one acknowledged operation of the power-loss workload did.
enum Op {
    Block { lpa: u64, data: Vec<u8> },
    Store { addr: u64, data: Vec<u8> },
    Transaction(Vec<(u64, Vec<u8>)>),
    Trim { lpa: u64 },
    Clean,
}

/// A power cut at any point of a workload leaves, after recovery, the device as it was
/// after the last acknowledged operation or after the one in progress; a transaction
/// is there whole or not at all.
#[test]
fn every_power_loss_image_recovers_to_an_acknowledged_state() {
    for seed in 0..4u64 {
        let mut rng = StdRng::seed_from_u64(100 + seed);
        // The last with block writes cached in the DRAM (the baselines' device).
        let options = || MssdOptions { block_cache: seed == 3, ..options() };
        let log = PowerLog::new();
        let (dram_bytes, flash_bytes) = MemorySemanticSsd::sizes(&config()).unwrap();
        let dram: Arc<dyn ByteTier> = Arc::new(PmemRegion::recorded(dram_bytes, log.clone()).unwrap());
        let flash: Arc<dyn BlockDevice> = Arc::new(RecordedSsd::new(Arc::new(SimSsd::new(flash_bytes)), log.clone()));
        let ssd = MemorySemanticSsd::format(flash, dram, &config(), options()).unwrap();
        let mut states = vec![vec![0u8; LOGICAL as usize]];
        let mut ends = vec![log.position()];
        let hot = |rng: &mut StdRng| rng.random_range(0..24u64);
        for _ in 0..150 {
            let op = match rng.random_range(0..10) {
                0..=2 => Op::Block { lpa: hot(&mut rng), data: (0..PAGE).map(|_| rng.random()).collect() },
                3..=5 => {
                    let len = rng.random_range(1..200);
                    let page = hot(&mut rng);
                    let addr = page * PAGE + rng.random_range(0..PAGE - len);
                    Op::Store { addr, data: (0..len).map(|_| rng.random()).collect() }
                }
                6..=7 => Op::Transaction(
                    (0..rng.random_range(2..5))
                        .map(|_| {
                            let len = rng.random_range(1..300);
                            (hot(&mut rng) * PAGE + rng.random_range(0..PAGE - len), (0..len).map(|_| rng.random()).collect())
                        })
                        .collect(),
                ),
                8 => Op::Trim { lpa: hot(&mut rng) },
                _ => Op::Clean,
            };
            let mut next = states.last().unwrap().clone();
            match &op {
                Op::Block { lpa, data } => {
                    write_block(&ssd, *lpa, data);
                    ssd.flush().unwrap();
                    apply(&mut next, &Change::Bytes { txid: 0, addr: lpa * PAGE, data: data.clone() });
                }
                Op::Store { addr, data } => {
                    ssd.store(None, *addr, data).unwrap();
                    ssd.verify();
                    apply(&mut next, &Change::Bytes { txid: 0, addr: *addr, data: data.clone() });
                }
                Op::Transaction(stores) => {
                    let tx = ssd.begin();
                    for (addr, data) in stores {
                        ssd.store(Some(tx), *addr, data).unwrap();
                        apply(&mut next, &Change::Bytes { txid: 0, addr: *addr, data: data.clone() });
                    }
                    ssd.commit(tx).unwrap();
                }
                Op::Trim { lpa } => {
                    ssd.trim(lpa * PAGE, PAGE).unwrap();
                    apply(&mut next, &Change::Trim { addr: lpa * PAGE, len: PAGE });
                }
                Op::Clean => ssd.clean().unwrap(),
            }
            states.push(next);
            ends.push(log.position());
        }
        let events = log.events();
        let mut replay = Replay::new(dram_bytes, flash_bytes);
        let mut coin_rng = StdRng::seed_from_u64(seed);
        let mut images = 0;
        for (at, event) in events.iter().enumerate().chain(std::iter::once((events.len(), &events[0]))) {
            if at < ends[0] || (at < events.len() && !event.is_persistence_point()) {
                replay.apply(event);
                continue;
            }
            let image = replay.image(Survival { fast_word: 0.5, ssd_sector: 0.5 }, &mut |p| coin_rng.random_bool(p));
            let done = ends.iter().filter(|&&end| end <= at).count() - 1;
            let dram = PmemRegion::anonymous(dram_bytes).unwrap();
            dram.write(0, &image.fast);
            let (recovered, _) = MemorySemanticSsd::open(Arc::new(SimSsd::with_contents(image.ssd)), Arc::new(dram), options())
                .unwrap_or_else(|e| panic!("seed {seed}: the image at event {at} does not open: {e}"));
            let contents = read_all(&recovered);
            let matches_done = contents == states[done];
            let matches_next = done + 1 < states.len() && contents == states[done + 1];
            assert!(
                matches_done || matches_next,
                "seed {seed}: the image at event {at} (after {done} operations) differs from both states at byte {:?}",
                first_difference(&contents, &states[done])
            );
            images += 1;
            if at < events.len() {
                replay.apply(event);
            }
        }
        eprintln!("seed {seed}: {images} power-loss images");
        assert!(images > 300, "seed {seed}: only {images} images");
    }
}

/// A full device whose every page has log entries still cleans: cleaning writes in
/// batches the over-provisioned space can take, collecting garbage between them.
#[test]
fn a_full_device_cleans_every_page() {
    let media = media();
    let ssd = MemorySemanticSsd::format(media.flash.clone(), media.dram.clone(), &config(), options()).unwrap();
    let mut image = vec![0u8; LOGICAL as usize];
    for (i, chunk) in image.chunks_mut(64 * 1024).enumerate() {
        chunk.fill(i as u8 + 1);
        write_block(&ssd, i as u64 * 16, chunk);
    }
    ssd.flush().unwrap();
    for lpa in 0..LOGICAL / PAGE {
        let addr = lpa * PAGE + (lpa % 60) * 64;
        ssd.store(None, addr, &[0xEE; 40]).unwrap();
        image[addr as usize..addr as usize + 40].fill(0xEE);
    }
    ssd.clean().unwrap();
    assert_eq!(ssd.stats().log_cleaned_pages, LOGICAL / PAGE);
    check(&ssd, &image, &[], "after cleaning a full device");
    // One write of an eighth of the device: less than the spare flash, more than the
    // garbage collector keeps free without being asked.
    let quarter = vec![0x5A; (LOGICAL / 8) as usize];
    write_block(&ssd, 0, &quarter);
    image[..quarter.len()].copy_from_slice(&quarter);
    ssd.flush().unwrap();
    check(&ssd, &image, &[], "after a large write");
}

/// A flash image carries a label naming its device: DRAM of one device with the flash of
/// another is refused, and each half is recognised alone (what `mkfs` checks before it
/// writes).
#[test]
fn a_flash_image_names_its_device() {
    let (a, b) = (media(), media());
    let first = MemorySemanticSsd::format(Arc::clone(&a.flash), Arc::clone(&a.dram), &config(), options()).unwrap();
    write_block(&first, 3, &[7; PAGE as usize]);
    first.flush().unwrap();
    drop(first);
    drop(MemorySemanticSsd::format(Arc::clone(&b.flash), Arc::clone(&b.dram), &config(), options()).unwrap());
    assert!(matches!(MemorySemanticSsd::open(Arc::clone(&a.flash), Arc::clone(&b.dram), options()), Err(Error::WrongDevices(_))));
    let mut head = [0u8; 64];
    a.dram.read(0, &mut head);
    let last = run_batch(
        a.flash.as_ref(),
        vec![IoRequest { op: IoOp::Read, offset_bytes: a.flash.len_bytes() - PAGE, buf: AlignedBuf::zeroed(PAGE as usize) }],
    )
    .unwrap();
    let id = dram_label(&head).expect("a formatted DRAM names its device");
    assert_eq!(flash_label(&last[0]), Some(id), "the flash names the same device");
    let mut other = [0u8; 64];
    b.dram.read(0, &mut other);
    assert_ne!(dram_label(&other), Some(id));
    assert_eq!(flash_label(&[0u8; PAGE as usize]), None);
    let (ssd, _) = MemorySemanticSsd::open(a.flash, a.dram, options()).unwrap();
    assert!(read_all(&ssd)[3 * PAGE as usize..4 * PAGE as usize].iter().all(|&b| b == 7), "its own pair opens with its data");
}

/// Fill the log with one-line stores (two lines of log each) to pages 1..=`pages`, until
/// `room` more bytes of log would not fit below the stores' limit.
fn fill_log(ssd: &MemorySemanticSsd, pages: u64, room: u64) -> u64 {
    let limit = config().log_bytes - config().log_bytes / RESERVE_DIVISOR;
    let mut stored = 0;
    while ssd.log_usage().0 + room <= limit {
        ssd.store(None, (1 + stored % pages) * PAGE + (stored / pages % 64) * LINE, &[stored as u8; LINE as usize]).unwrap();
        stored += 1;
    }
    stored
}

/// A store that finds the log full while a cleaning runs waits for that cleaning to make
/// room instead of starting a second one behind it, and its wait is counted.
#[test]
fn a_store_on_a_full_log_waits_for_the_running_cleaning() {
    let media = media();
    let options = MssdOptions { clean_at_percent: 100, ..options() };
    let ssd = Arc::new(MemorySemanticSsd::format(media.flash.clone(), media.dram.clone(), &config(), options).unwrap());
    // The store below takes 256 bytes of log, which do not fit.
    fill_log(&ssd, 200, 2 * LINE);
    // Opening the device cleaned once (recovery).
    let before = ssd.stats().log_cleanings;
    // As a cleaning does when it starts, before its first step frees anything.
    ssd.inner.log.lock().cleaning = true;
    let done = Arc::new(AtomicBool::new(false));
    // The 100 ms count from when the store starts, not from the spawn: a thread started on
    // a busy machine may begin its store milliseconds late.
    let (starting, started) = std::sync::mpsc::channel();
    let store = {
        let (ssd, done) = (Arc::clone(&ssd), Arc::clone(&done));
        std::thread::spawn(move || {
            starting.send(()).unwrap();
            ssd.store(None, 0, &[9u8; 200]).unwrap();
            done.store(true, Ordering::SeqCst);
        })
    };
    started.recv().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert!(!done.load(Ordering::SeqCst), "the store went ahead on a full log");
    ssd.inner.clean_log(false).unwrap();
    store.join().unwrap();
    let stats = ssd.stats();
    assert_eq!(stats.log_cleanings, before + 1, "the waiting store cleaned again");
    assert_eq!(stats.log_full_waits, 1);
    assert!(stats.log_full_wait_us >= 100_000, "waited {} µs", stats.log_full_wait_us);
    let mut out = [0u8; 200];
    ssd.load(0, &mut out).unwrap();
    assert_eq!(out, [9u8; 200]);
}

/// The head moves in steps, but a page whose entries span several steps is written to
/// flash once per cleaning, with all its entries below the cut.
#[test]
fn a_cleaning_in_steps_writes_each_page_once() {
    let media = media();
    let options = MssdOptions { clean_at_percent: 100, ..options() };
    let ssd = MemorySemanticSsd::format(media.flash.clone(), media.dram.clone(), &config(), options).unwrap();
    // Page 0 gets a store at the log's start and one at its end.
    let before = ssd.stats().log_cleanings;
    ssd.store(None, 0, b"first").unwrap();
    fill_log(&ssd, 200, 4 * LINE);
    ssd.store(None, 64, b"last").unwrap();
    assert_eq!(ssd.stats().log_cleanings, before, "the last store fits");
    ssd.clean().unwrap();
    assert_eq!(ssd.stats().log_cleaned_pages, 201, "200 filled pages and page 0, each once");
    assert_eq!(ssd.log_usage().0, 0);
    let mut out = [0u8; 68];
    ssd.load(0, &mut out).unwrap();
    assert_eq!((&out[..5], &out[64..]), (&b"first"[..], &b"last"[..]));
}
