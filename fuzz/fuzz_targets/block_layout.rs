//! A block volume's layout attribute: any bytes give a layout or an error, never a panic,
//! and what decodes encodes back to the same bytes.
#![no_main]
use alignfs::personality::BlockLayout;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok((layout, zone_offset)) = BlockLayout::decode(data) {
        let again = BlockLayout::decode(&layout.encode(zone_offset)).expect("a re-encoded layout decodes");
        assert_eq!(again, (layout, zone_offset));
    }
});
