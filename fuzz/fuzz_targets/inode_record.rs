//! The inode record decoder (inline data, symlink targets, xattrs) on
//! arbitrary bytes.
#![no_main]
use ldfs::fs::inode::Inode;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = Inode::decode(42, data, 0);
});
