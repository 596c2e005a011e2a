//! lld: the log-structured Logical Disk (the engine).
//!
//! - `layout`, `summary`, `checkpoint`, `usage`: the on-disk format
//!   (docs/FORMAT.md) and the segment usage table;
//! - `map`: the persistent paged block-number map (copy-on-write B+tree);
//! - `writer`: the open partial segment and how it is laid out when sealed;
//! - `flight`: sealed partial segments on their way to the device;
//! - `checkpointer`: the part of a checkpoint that waits for the device,
//!   run beside operations, and its thread;
//! - `engine`: `Engine` and `Lld` (the engine plus its background cleaner
//!   thread), the `LogicalDisk` implementation: admission, the log head,
//!   group commit, checkpoints;
//! - `undo`: what open ARUs changed, so that one can be aborted;
//! - `recovery`: checkpoint + two-phase roll-forward, and the rebuild;
//! - `snapshot`: kept checkpoints (their records in the slot, the locks
//!   that keep a mounted one from being deleted);
//! - `cleaner`: the segment cleaner — `policy` (victim selection, pure
//!   functions of the usage table) and the mechanism and scheduling that
//!   move live blocks and release segments.
//!
//! Invariants and the crash model are in docs/DESIGN.md.

pub mod checkpoint;
mod checkpointer;
pub mod cleaner;
mod codec;
pub mod engine;
mod flight;
mod flushes;
pub mod layout;
pub mod map;
pub mod mkfs;
mod recovery;
pub mod resize;
pub mod snapshot;
pub mod summary;
pub mod types;
mod undo;
pub mod usage;
pub mod verify;
mod writer;

pub use cleaner::policy::PolicyKind;
pub use cleaner::{CleanReport, CleanSummary, CleanerOptions, CleanerStats};
pub use engine::{
    decode_list_hints, decode_stored_block, CheckpointHook, DurableCheckpoint, Engine, EngineStats,
    Lld, LldOptions, OpenReport, SegmentHook,
};
pub use recovery::{read_partial, ScannedPartial, Verify};
pub use resize::{resize_offline, ResizeReport};
pub use snapshot::{SnapshotInfo, SnapshotLock};
pub use types::{Key, MapEntry, PagePtr, SegmentId, PAGE_BYTES};
