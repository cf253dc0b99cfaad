//! Journal replay over an arbitrary journal region: records, sequence numbers, torn tails.
#![no_main]
use std::sync::Arc;

use alignfs::device::PmemRegion;
use alignfs::journal::{Journal, PmemWindow};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 8 {
        return;
    }
    let first_seq = u64::from_le_bytes(data[..8].try_into().expect("8 bytes"));
    let log = &data[8..];
    let len = (log.len() as u64).next_multiple_of(4096).max(4096);
    let region = Arc::new(PmemRegion::anonymous(len).expect("anonymous region"));
    region.write(0, log);
    let window = PmemWindow::new(region, 0, len);
    if let Ok(replay) = Journal::replay(&window, first_seq, "fuzz") {
        assert!(replay.end <= len);
    }
});
