//! Small value types shared by the engine's modules.

use crate::ld::ListId;

/// The unit of device I/O and of map pages; partial segments start on it.
pub const PAGE_BYTES: usize = 4096;

/// Counters read from the device (sequence numbers, epochs, checkpoint
/// serials, the next list id, byte totals) must be below this, or the
/// structure holding them is refused as corrupt: no device lives to count
/// 2^62 of anything, and it keeps every `+ 1` and `+= len` after open from
/// overflowing (overflow checks are on in release builds).
pub const MAX_COUNTER: u64 = 1 << 62;

/// A block's logical address: `(list, index)`, ordered list-major.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Key {
    pub list: u64,
    pub index: u64,
}

impl Key {
    pub const MIN: Key = Key { list: 0, index: 0 };
    pub const MAX: Key = Key {
        list: u64::MAX,
        index: u64::MAX,
    };

    pub fn new(list: ListId, index: u64) -> Key {
        Key {
            list: list.0,
            index,
        }
    }
}

/// `MapEntry::flags` bits.
pub mod entry_flags {
    /// The stored bytes are LZ4-compressed (size-prepended block format).
    pub const COMPRESSED: u8 = 1 << 0;
    /// The stored bytes are one Zstandard frame that records its content
    /// size. Never set together with `COMPRESSED`.
    pub const ZSTD: u8 = 1 << 1;
    /// In memory only, never on disk: the block is in the open partial
    /// segment and `addr` is its record slot there.
    pub const BUFFERED: u8 = 1 << 7;
    /// Bits that may appear on disk.
    pub const ON_DISK_MASK: u8 = COMPRESSED | ZSTD;
}

/// Where a block lives: `(list, index) -> MapEntry` is the block-number map.
///
/// `addr` is a byte address: bits 56..64 name the device (0 = the log device;
/// DualFS puts file data on device 1), bits 0..56 the byte offset on it.
/// `crc` is the crc32c of the stored bytes, kept outside the block (STYLE 10).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapEntry {
    pub addr: u64,
    /// Stored length in bytes (after compression), at most 2^24 - 1.
    pub len: u32,
    pub crc: u32,
    pub flags: u8,
}

impl MapEntry {
    pub const ADDR_OFFSET_MASK: u64 = (1 << 56) - 1;

    pub fn is_buffered(&self) -> bool {
        self.flags & entry_flags::BUFFERED != 0
    }
    pub fn device(&self) -> u8 {
        (self.addr >> 56) as u8
    }
    pub fn offset(&self) -> u64 {
        self.addr & Self::ADDR_OFFSET_MASK
    }
}

/// A pointer to one map page on the log device: byte offset and the crc32c
/// of the page's 4096 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PagePtr {
    pub addr: u64,
    pub crc: u32,
}

/// Segment number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SegmentId(pub u32);
