//! The segment usage table decoder on arbitrary bytes (the count comes from
//! a validated superblock, so it is bounded here as it is there).
#![no_main]
use ldfs::lld::usage::Usage;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let count = u16::from_le_bytes([data[0], data[1]]) as u32;
    let _ = Usage::decode(&data[2..], count, 128 << 10, 0);
});
