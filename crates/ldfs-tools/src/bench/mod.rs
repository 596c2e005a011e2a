//! The benchmarks of `ldfs bench`, one module each, the report they write
//! (`report`: BENCHMARKS.md and its charts), and memfs, the in-memory FUSE
//! ceiling they measure against; `s3`, the S3 gateway of `bench fs`'s ldfs-s3 target
//! (and of `store_cold`, the cold mount of a store-backed file system).

pub mod apps;
pub mod cleaner;
pub mod compress;
pub mod dual;
pub mod engine;
pub mod fs;
pub mod fsck;
pub mod memfs;
pub mod ops;
pub mod profile;
pub mod report;
pub mod s3;
pub mod store_cold;
pub mod vld;
pub mod writedel;
