//! Checkpoint payload decoding (the whole namespace and every map), with its
//! cross-checks (root present, names point at inodes, kinds agree).
#![no_main]
use alignfs::journal::{checkpoint_payload, decode_state, AsIs};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok((state, counters)) = decode_state(data, 8, 4096) {
        let again = checkpoint_payload(&state, &counters, &AsIs);
        decode_state(&again, 8, 4096).expect("a re-encoded checkpoint decodes");
    }
});
