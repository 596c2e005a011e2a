//! lld: the log-structured Logical Disk (the engine).
//!
//! Built so far: the on-disk format — layout and superblock (`layout`),
//! partial-segment summaries (`summary`), checkpoints (`checkpoint`), the
//! segment usage table (`usage`) — and the persistent paged block-number map
//! (`map`). The writer, recovery and the `LogicalDisk` implementation stand on
//! these (issue 2, in progress).

pub mod checkpoint;
mod codec;
pub mod layout;
pub mod map;
pub mod mkfs;
pub mod summary;
pub mod types;
pub mod usage;

pub use types::{Key, MapEntry, PagePtr, SegmentId, PAGE_BYTES};
