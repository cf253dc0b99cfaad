//! Journal record payloads: a list of ops.
#![no_main]
use alignfs::journal::{decode_ops, encode_ops};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(ops) = decode_ops(data, 8, 4096) {
        let again = decode_ops(&encode_ops(&ops), 8, 4096).expect("re-encoded ops decode");
        assert_eq!(again, ops);
    }
});
