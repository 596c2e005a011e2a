//! The block-map page decoder on arbitrary bytes at every level.
#![no_main]
use ldfs::lld::map::validate_page;
use ldfs::lld::PAGE_BYTES;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.is_empty() {
        return;
    }
    let level = data[0] % 8;
    let mut page = data[1..].to_vec();
    page.resize(PAGE_BYTES, 0);
    let _ = validate_page(&page, 0, 0, level);
    // A page of the wrong length is an error too.
    let _ = validate_page(&data[1..], 0, 0, level);
});
