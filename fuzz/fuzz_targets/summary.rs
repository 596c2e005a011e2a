//! The partial-segment summary decoders on arbitrary bytes: header, then
//! records bounded by the data area; errors, never panics.
#![no_main]
use ldfs::lld::summary::{decode_header, decode_records_limited, Expect};
use ldfs::lld::PAGE_BYTES;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 4 {
        return;
    }
    let ex = Expect {
        fs_id: 7,
        segment: data[0] as u32,
        page: data[1] as u32,
        pages_left: 1 + data[2] as u32,
        segment_count: 256,
        max_block_bytes: 64 << 10,
    };
    let mut b = data[4..].to_vec();
    let pages = b.len().div_ceil(PAGE_BYTES).max(1);
    b.resize(pages * PAGE_BYTES, 0);
    let Ok(h) = decode_header(&b, 0, &ex) else {
        return;
    };
    let n = (h.summary_pages as usize * PAGE_BYTES).min(b.len());
    let _ = decode_records_limited(
        &b[..n],
        0,
        h.summary_pages,
        h.data_pages,
        ex.max_block_bytes,
    );
});
