//! NVStore's KV records: any bytes give a record or an error, never a panic, and what
//! decodes encodes back to the same bytes.
#![no_main]
use alignfs::kv::records::{decode_name_key, AttrRecord, BlockKey, BlockValue, FragmentKey, FragmentValue, Onode};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(key) = BlockKey::decode(data) {
        assert_eq!(key.encode().as_slice(), data);
    }
    if let Ok(key) = FragmentKey::decode(data) {
        assert_eq!(key.encode().as_slice(), data);
    }
    if let Ok(value) = BlockValue::decode(data) {
        assert_eq!(value.encode().as_slice(), data);
    }
    if let Ok(onode) = Onode::decode(data) {
        assert_eq!(onode.encode().as_slice(), data);
    }
    if let Ok(fragment) = FragmentValue::decode(data, 8192) {
        assert_eq!(fragment.encode(), data);
        let mut block = vec![0u8; 8192];
        fragment.lay_over(&mut block);
    }
    if let Ok(record) = AttrRecord::decode(data) {
        assert_eq!(AttrRecord::decode(&record.encode()).expect("a re-encoded record decodes"), record);
    }
    let _ = decode_name_key(data);
});
