//! The emulated memory-semantic SSD (`byte`) opened over damaged device DRAM: its header,
//! mapping table, TxLogs and write log as damage may leave them. A small device gets a
//! few stores, some in committed transactions, some in open ones, and whole-page
//! writes; the input then overwrites DRAM bytes where it says. Opening may refuse the
//! device, but must not panic or loop; a device that opens must read, take a
//! transaction, and open again.
#![no_main]
use std::sync::Arc;

use alignfs::device::mssd::{MemorySemanticSsd, MssdConfig, MssdOptions, PAGE};
use alignfs::device::{run_batch, AlignedBuf, BlockDevice, ByteTier, IoOp, IoRequest, PmemRegion, SimSsd};
use libfuzzer_sys::fuzz_target;

const LOGICAL: u64 = 1 << 20;

fn config() -> MssdConfig {
    MssdConfig { log_bytes: 1 << 20, txlog_bytes: 16 << 10, pages_per_erase_block: 16, ..MssdConfig::new(LOGICAL) }
}

fn options() -> MssdOptions {
    MssdOptions { background_cleaning: false, ..MssdOptions::default() }
}

/// A device whose DRAM holds every kind of state: mapped pages, log entries of committed,
/// open and untransacted stores, and a TxLog record.
fn populated() -> (Arc<SimSsd>, Arc<PmemRegion>) {
    let (dram_bytes, flash_bytes) = MemorySemanticSsd::sizes(&config()).expect("a valid config");
    let flash = Arc::new(SimSsd::new(flash_bytes));
    let dram = Arc::new(PmemRegion::anonymous(dram_bytes).expect("anonymous DRAM"));
    let ssd = MemorySemanticSsd::format(flash.clone(), dram.clone(), &config(), options()).expect("format");
    let mut page = AlignedBuf::zeroed(PAGE as usize);
    page.fill(0x5a);
    run_batch(&ssd, vec![IoRequest { op: IoOp::Write, offset_bytes: 3 * PAGE, buf: page }]).expect("block write");
    let committed = ssd.begin();
    ssd.store(Some(committed), 3 * PAGE + 64, &[1; 100]).expect("store");
    ssd.store(Some(committed), 9 * PAGE, &[2; 64]).expect("store");
    ssd.commit(committed).expect("commit");
    let open = ssd.begin();
    ssd.store(Some(open), 5 * PAGE + 128, &[3; 200]).expect("store");
    ssd.store(None, 7 * PAGE + 8, &[4; 30]).expect("store");
    ssd.verify();
    ssd.halt();
    (flash, dram)
}

fn read_all(ssd: &MemorySemanticSsd) {
    let buf = AlignedBuf::zeroed(LOGICAL as usize);
    let _ = run_batch(ssd, vec![IoRequest { op: IoOp::Read, offset_bytes: 0, buf }]);
    let mut bytes = [0u8; 300];
    let _ = ssd.load(3 * PAGE + 10, &mut bytes);
}

fuzz_target!(|data: &[u8]| {
    let (flash, dram) = populated();
    let dram_bytes = dram.len_bytes();
    // Patches: a u32 offset (into DRAM, wrapping), a length byte, then that many bytes.
    let mut rest = data;
    while rest.len() >= 5 {
        let at = u64::from(u32::from_le_bytes(rest[..4].try_into().expect("4 bytes"))) % dram_bytes;
        let len = (rest[4] as usize).min(rest.len() - 5).min((dram_bytes - at) as usize);
        dram.write(at, &rest[5..5 + len]);
        rest = &rest[5 + len..];
    }
    let flash: Arc<dyn BlockDevice> = flash;
    let dram: Arc<dyn ByteTier> = dram;
    let Ok((ssd, _recovery)) = MemorySemanticSsd::open(flash.clone(), dram.clone(), options()) else { return };
    read_all(&ssd);
    let tx = ssd.begin();
    if ssd.store(Some(tx), 11 * PAGE + 64, &[6; 64]).is_ok() {
        let _ = ssd.commit(tx);
    }
    ssd.halt();
    drop(ssd);
    if let Ok((again, _)) = MemorySemanticSsd::open(flash, dram, options()) {
        read_all(&again);
        again.halt();
    }
});
