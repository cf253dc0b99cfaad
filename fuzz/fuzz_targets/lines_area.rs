//! `byte`'s in-place metadata (crate::lines): any bytes as one record give a record or an
//! error, and what decodes encodes to a record that decodes the same; any bytes as an
//! area image (header, bitmap, records) give a state or an error, never a panic.
#![no_main]
use alignfs::lines::{parse_image, Record};
use libfuzzer_sys::fuzz_target;

/// The volume the seeds' areas belong to (crates/alignfs/examples/fuzz_seeds.rs).
const UUID: [u8; 16] = [0x42; 16];

fuzz_target!(|data: &[u8]| {
    if let Ok(record) = Record::decode(data, 8, 4096) {
        let again = record.encode().expect("a decoded record encodes");
        assert_eq!(Record::decode(&again, 8, 4096).expect("a re-encoded record decodes"), record);
    }
    let mut image = data.to_vec();
    image.resize(data.len().div_ceil(4096).max(2) * 4096, 0);
    let _ = parse_image(&image, UUID, 8, 4096);
});
