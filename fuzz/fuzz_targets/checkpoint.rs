//! A checkpoint slot decoder on arbitrary bytes, for a geometry planned
//! from the input: an error or a header and usage table, never a panic.
#![no_main]
use ldfs::lld::checkpoint;
use ldfs::lld::layout::{Geometry, MkfsOptions};
use ldfs::lld::PAGE_BYTES;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    // 4 MiB .. 1 GiB devices of 128 KiB segments.
    let size = (4u64 << 20) << (data[0] % 9);
    let opts = MkfsOptions {
        segment_bytes: 128 << 10,
        max_block_bytes: 16 << 10,
        reserved_segments: None,
        fs_id: data[1] as u64,
        max_bytes: None,
        kept_pages: 0,
    };
    let Ok(g) = Geometry::plan(size, &opts) else {
        return;
    };
    let mut slot = data[2..].to_vec();
    slot.resize(g.checkpoint_pages as usize * PAGE_BYTES, 0);
    let _ = checkpoint::decode(&g, &slot, 0);
});
