//! One map entry: fast pages, or an SSD block with page and upage overlays (the upage
//! header's chunk list included).
#![no_main]
use alignfs::codec::Decoder;
use alignfs::journal::{decode_entry, encode_entry};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut d = Decoder::new(data);
    if let Ok(entry) = decode_entry(&mut d, 8, 4096) {
        let mut e = alignfs::codec::Encoder::new();
        encode_entry(&mut e, &entry);
        let again = decode_entry(&mut Decoder::new(&e.bytes), 8, 4096).expect("re-encoded entry decodes");
        assert_eq!(again, entry);
    }
});
