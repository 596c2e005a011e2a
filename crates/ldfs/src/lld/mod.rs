//! lld: the log-structured Logical Disk (the engine).

pub mod map;
pub mod types;

pub use types::{Key, MapEntry, PagePtr, SegmentId, PAGE_BYTES};
