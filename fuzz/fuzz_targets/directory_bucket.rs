//! The directory bucket decoder on arbitrary bytes.
#![no_main]
use ldfs::fs::dir;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = dir::decode(data, 1, 0);
});
