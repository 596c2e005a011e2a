//! The segment store layer's decoders on arbitrary bytes (issue 20): a checkpoint object and
//! a cache's residency map, for a geometry planned from the input: an error or a decoded
//! value, never a panic.
#![no_main]
use ldfs::lld::layout::{Geometry, MkfsOptions};
use ldfs::store::cache::decode_map;
use ldfs::store::segments::decode_checkpoint_object;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
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
    let _ = decode_map("fuzz", &g, &data[2..]);
    let _ = decode_checkpoint_object("ckpt/0000000000000001-0000000000000001", &data[2..]);
});
