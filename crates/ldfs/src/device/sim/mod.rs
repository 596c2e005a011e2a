//! Simulated disks (virtual-log-1999 Section 4.1): the HP 97560 and the
//! Seagate ST19101 of Table 1 as [`crate::device::Device`]s with a simulated
//! clock, and the analytical models of eager writing (Section 2).
//!
//! - [`params`]: Table 1 and the seek curves.
//! - [`disk`]: the mechanics, the clock, per-request breakdowns, power cuts.
//! - [`buffer`]: the drive's track buffer and read-ahead policies.
//! - [`model`]: equations 1, 4 and 10, computed exactly.

pub mod buffer;
pub mod disk;
pub mod model;
pub mod params;

pub use buffer::ReadAhead;
pub use disk::{
    Breakdown, Chs, HeadPos, PowerCut, SimDisk, SimStats, TracedAccess, TracedRequest, TRACE_LIMIT,
};
pub use params::{DiskParams, Host, PaperDisk, SeekCurve};
