//! Block devices: the bottom layer.
//!
//! A [`Device`] is a byte-addressed array of fixed size with four operations
//! (read, write, flush, size) — STYLE.md practice 1. Every layer above is
//! generic over it, so the test doubles are small:
//!
//! - [`FileDevice`]: a regular file or a block device (pread/pwrite, fdatasync
//!   on flush, optional O_DIRECT with aligned bounce buffers).
//! - [`MemoryDevice`]: a `Vec<u8>`.
//! - [`CrashDevice`]: keeps what was written apart from what the last completed
//!   flush made durable; a crash yields the durable image plus a seeded subset
//!   of the unflushed writes, optionally torn at 512-byte granularity.
//! - [`FaultDevice`]: wraps another device and injects EIO on the Nth read,
//!   write or flush, bit flips on read, and misdirected writes.
//! - [`sim::SimDisk`]: the HP 97560 or Seagate ST19101 of the virtual-log
//!   paper, in memory, with a simulated clock (seek, rotation, head switch,
//!   transfer, command overhead); its writes are durable on return.
//! - [`vld::Vld`]: the virtual-log disk over a `SimDisk`: eager writing, an
//!   indirection map kept as a virtual log, a compactor.
//!
//! Invariant: a write that returned `Ok` is visible to every later read on the
//! same device; it is durable only after a later `flush` returned `Ok`.

mod crash;
mod fault;
mod file;
mod memory;
pub mod sim;
pub mod vld;

pub use crash::{CrashDevice, CrashOptions, CrashStats};
pub use fault::{FaultDevice, FaultPlan};
pub use file::{FileDevice, FileDeviceOptions};
pub use memory::MemoryDevice;

use std::fmt;
use std::sync::Arc;

/// The size of a sector: the granularity at which a torn write may cut data.
pub const SECTOR_BYTES: u64 = 512;

/// Which device operation failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceOp {
    Read,
    Write,
    Flush,
    Open,
    Discard,
}

impl fmt::Display for DeviceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            DeviceOp::Read => "read",
            DeviceOp::Write => "write",
            DeviceOp::Flush => "flush",
            DeviceOp::Open => "open",
            DeviceOp::Discard => "discard",
        };
        f.write_str(s)
    }
}

/// A device error carries the operation, the byte range and the cause.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error("device {op} of {len} bytes at offset {offset} failed: {source}")]
    Io {
        op: DeviceOp,
        offset: u64,
        len: u64,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "device {op} of {len} bytes at offset {offset} is beyond the device end ({size} bytes)"
    )]
    OutOfRange {
        op: DeviceOp,
        offset: u64,
        len: u64,
        size: u64,
    },
    #[error("injected {op} error (operation #{n}) at offset {offset}")]
    Injected { op: DeviceOp, n: u64, offset: u64 },
}

/// The device trait: everything above talks to storage through these four calls.
pub trait Device: Send + Sync {
    /// Read exactly `buf.len()` bytes at `offset`.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), DeviceError>;
    /// Write all of `buf` at `offset`. Not durable until `flush` returns.
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), DeviceError>;
    /// Make every write that returned before this call durable.
    fn flush(&self) -> Result<(), DeviceError>;
    /// The device size in bytes; changes only through `resize`.
    fn size_bytes(&self) -> u64;
    /// A hint: these byte ranges (offset, length) will be read soon. A
    /// device behind a page cache starts reading them in the background;
    /// one without (memory, O_DIRECT) has nothing to do. Never fails.
    fn will_need(&self, _ranges: &[(u64, u64)]) {}
    /// A hint: the write granularity the device prefers (a power of two,
    /// at least 512). A write of whole aligned units costs no read; a
    /// smaller one the device merges with what is there, reading it first
    /// (the VLD's physical block: read-modify-write). Like a drive's
    /// physical block size under 512-byte logical sectors.
    fn write_unit_bytes(&self) -> u64 {
        512
    }
    /// Gives `len` bytes at `offset` back to the storage (TRIM): a hole
    /// punched in an image file, BLKDISCARD on a block device. Afterwards
    /// they read as zeros or as before, so a caller discards only what
    /// nothing reads until it is written again (lld: segments a durable
    /// checkpoint released). Returns whether the device did anything
    /// (`false`: it cannot discard, which is not an error).
    fn discard(&self, _offset: u64, _len: u64) -> Result<bool, DeviceError> {
        Ok(false)
    }
    /// Makes the device `bytes` long (`ldfs resize`): an image file is
    /// extended (reading zeros) or truncated, and the new length is durable
    /// when this returns, with every write before it (it flushes). Returns
    /// whether the device did; `false`: its size is not ldfs's to set (a
    /// block device, which `size_bytes` then reports as it is now, after
    /// the storage grew it).
    fn resize(&self, _bytes: u64) -> Result<bool, DeviceError> {
        Ok(false)
    }
}

impl<D: Device + ?Sized> Device for Arc<D> {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), DeviceError> {
        (**self).read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), DeviceError> {
        (**self).write_at(buf, offset)
    }
    fn flush(&self) -> Result<(), DeviceError> {
        (**self).flush()
    }
    fn size_bytes(&self) -> u64 {
        (**self).size_bytes()
    }
    fn will_need(&self, ranges: &[(u64, u64)]) {
        (**self).will_need(ranges)
    }
    fn write_unit_bytes(&self) -> u64 {
        (**self).write_unit_bytes()
    }
    fn discard(&self, offset: u64, len: u64) -> Result<bool, DeviceError> {
        (**self).discard(offset, len)
    }
    fn resize(&self, bytes: u64) -> Result<bool, DeviceError> {
        (**self).resize(bytes)
    }
}

impl<D: Device + ?Sized> Device for Box<D> {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), DeviceError> {
        (**self).read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), DeviceError> {
        (**self).write_at(buf, offset)
    }
    fn flush(&self) -> Result<(), DeviceError> {
        (**self).flush()
    }
    fn size_bytes(&self) -> u64 {
        (**self).size_bytes()
    }
    fn will_need(&self, ranges: &[(u64, u64)]) {
        (**self).will_need(ranges)
    }
    fn write_unit_bytes(&self) -> u64 {
        (**self).write_unit_bytes()
    }
    fn discard(&self, offset: u64, len: u64) -> Result<bool, DeviceError> {
        (**self).discard(offset, len)
    }
    fn resize(&self, bytes: u64) -> Result<bool, DeviceError> {
        (**self).resize(bytes)
    }
}

/// Checks that `[offset, offset+len)` lies inside a device of `size` bytes.
pub(crate) fn check_range(
    op: DeviceOp,
    offset: u64,
    len: usize,
    size: u64,
) -> Result<(), DeviceError> {
    let len = len as u64;
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(DeviceError::OutOfRange {
            op,
            offset,
            len,
            size,
        }),
    }
}
