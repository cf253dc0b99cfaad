//! What an NBD client sends: option headers, INFO/GO payloads and request headers. Any
//! bytes parse or give an error, never a panic or an allocation of an unchecked length.
#![no_main]
use alignfs_nbd::protocol::{read_option, InfoRequest, Request};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = InfoRequest::parse(data);
    let mut stream = data;
    while let Ok(option) = read_option(&mut stream) {
        let _ = InfoRequest::parse(&option.data);
    }
    let mut stream = data;
    while let Ok(request) = Request::read(&mut stream) {
        assert_eq!(Request::read(&mut &request.encode()[..]).expect("re-encoded request parses"), request);
    }
});
