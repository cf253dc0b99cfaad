//! Superblock decoding: any bytes give a superblock or an error, never a panic.
//!
//! Half of the inputs get the magic and a correct checksum patched in, so the fuzzer
//! reaches the field checks (version, role, profile, geometry, layout) instead of
//! stopping at the checksum.
#![no_main]
use alignfs::codec::crc32c;
use alignfs::layout::Superblock;
use libfuzzer_sys::fuzz_target;

/// Bytes covered by the checksum, which follows them (see docs/format/superblock.md).
const COVERED: usize = 132;

fuzz_target!(|data: &[u8]| {
    let mut bytes = data.to_vec();
    if bytes.len() >= COVERED + 4 && bytes[COVERED] % 2 == 0 {
        bytes[..8].copy_from_slice(b"ALIGNFS\x01");
        let crc = crc32c(&bytes[..COVERED]);
        bytes[COVERED..COVERED + 4].copy_from_slice(&crc.to_le_bytes());
    }
    if let Ok(sb) = Superblock::decode(&bytes, "fuzz") {
        // What decodes must encode back to bytes that decode to the same superblock.
        let again = Superblock::decode(&sb.encode(), "fuzz").expect("re-encoded superblock decodes");
        assert_eq!(again.uuid, sb.uuid);
        assert_eq!(again.geometry, sb.geometry);
    }
});
