//! A block's stored bytes under each compression flag (none, lz4, zstd,
//! both), and list 0's hint blocks: contents of at most max_block_bytes or
//! `Corrupt`, never a panic or an allocation a corrupt header asks for
//! (`-rss_limit_mb` catches one).
#![no_main]
use ldfs::lld::{decode_list_hints, decode_stored_block};
use libfuzzer_sys::fuzz_target;

const MAX_BLOCK: u32 = 64 << 10;

fuzz_target!(|data: &[u8]| {
    if data.is_empty() {
        return;
    }
    let flags = data[0] & 3;
    if let Ok(out) = decode_stored_block(flags, data[1..].to_vec(), MAX_BLOCK) {
        assert!(out.len() <= MAX_BLOCK as usize);
    }
    let _ = decode_list_hints(&data[1..]);
});
