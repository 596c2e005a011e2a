//! ldfs storage core.
//!
//! Layers, each knowing only the one below it (see `docs/DESIGN.md`):
//!
//! ```text
//! fs   POSIX files and directories over any LogicalDisk (no FUSE types)
//! ld   the Logical Disk interface: lists of variable-length blocks, ARUs, flush, reserve
//! lld  the log-structured Logical Disk (the engine)
//! store  object stores (memory, S3) for the segment store layer under lld (issue 20)
//! uip  the update-in-place Logical Disk (the papers' baseline)
//! device  block devices: file, memory, crash simulation, fault injection, simulated disks
//! ```
//!
//! `fsck` checks and repairs a whole image, using the engine's checks
//! (`lld::verify`) and the tree's (`fs::check`).
//!
//! Nothing in this crate knows about FUSE.

pub mod device;
pub mod dual;
pub mod fs;
pub mod fsck;
pub mod ld;
pub mod lld;
pub mod store;
pub mod testing;
pub mod uip;
