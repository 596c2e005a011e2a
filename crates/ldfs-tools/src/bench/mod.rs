//! The benchmarks of `ldfs bench`, one module each, the report they write
//! (`report`: BENCHMARKS.md and its charts), and memfs, the in-memory FUSE
//! ceiling they measure against.

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
pub mod vld;
pub mod writedel;
