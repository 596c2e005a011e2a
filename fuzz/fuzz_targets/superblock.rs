//! The superblock decoder on arbitrary bytes: an error or a geometry that
//! fits the device, never a panic.
#![no_main]
use ldfs::lld::layout::Geometry;
use ldfs::lld::PAGE_BYTES;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 8 {
        return;
    }
    let device_bytes = u64::from_le_bytes(data[..8].try_into().unwrap());
    let mut page = data[8..].to_vec();
    page.resize(PAGE_BYTES, 0);
    if let Ok(g) = Geometry::decode_superblock(&page, 0, device_bytes) {
        // What the engine then relies on.
        assert!(g.total_pages * PAGE_BYTES as u64 <= device_bytes);
        assert!(g.segment_count > 0 && g.segment_pages > 0);
    }
});
