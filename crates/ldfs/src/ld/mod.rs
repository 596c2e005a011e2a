//! The Logical Disk interface (`logical-disk-1993.txt` section 2, with the
//! "offset addressing" and concurrent-ARU extensions of section 6).
//!
//! A *list* is a sparse array of blocks named by a [`ListId`]; a block is
//! addressed by `(list, index)`, so no layer above keeps physical addresses.
//! Blocks have any length from 1 byte to [`LogicalDisk::max_block_bytes`].
//!
//! An *atomic recovery unit* (ARU) groups operations that recovery treats as
//! one: after a crash all of them are present or none is. ARUs give recovery
//! atomicity only, not isolation: reads see every accepted write at once.
//! Several ARUs may be open at a time, each named by its [`AruId`]. An open
//! ARU is either ended (committed) or aborted: an operation that fails
//! half-way aborts its ARU, and the state becomes what it would be had the
//! ARU issued nothing, for reads at once and after any crash.
//!
//! Invariants the interface promises:
//! - A call that returns `Ok` has been accepted and will not later fail for
//!   lack of space (space is checked, or reserved, before acceptance).
//! - After `flush` returns `Ok`, every operation accepted before the call
//!   survives a crash, except those in ARUs that had not ended at the crash.
//! - After a crash the state equals the state after some prefix of the
//!   accepted operations, with operations of unfinished ARUs removed.
//! - An aborted ARU's operations are removed at once, and never come back.

use std::fmt;
use std::ops::Range;

use crate::device::DeviceError;

/// Names a list. List 0 is the engine's own list of lists; users get ids >= 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ListId(pub u64);

/// Names an atomic recovery unit while it is open.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AruId(pub u64);

impl fmt::Display for ListId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "list {}", self.0)
    }
}

impl fmt::Display for AruId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "aru {}", self.0)
    }
}

/// What the list holds; a placement and cleaning hint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ListKind {
    #[default]
    Data,
    Metadata,
}

/// How often the list's blocks are expected to change; a placement hint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Temperature {
    #[default]
    Warm,
    Hot,
    Cold,
}

/// A progress report callback (phase, done, total; a total of 0 means
/// unknown), as fsck's checks take it.
pub type Progress<'a> = &'a (dyn Fn(&str, u64, u64) + Sync);

/// Hints given when a list is created (LD Table 1, `NewList(PredLid, Hints)`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ListHints {
    pub kind: ListKind,
    pub temperature: Temperature,
    /// How to store the list's blocks: compressed when that makes a block
    /// at least a sixteenth smaller, plain otherwise (decided per block).
    pub compress: Compression,
    /// Place this list's blocks near those of another list.
    pub near: Option<ListId>,
}

/// A list's compression choice (a hint: layouts that do not compress,
/// such as the update-in-place LD and the dual layout's data device,
/// keep it and store plain). Written as `off`, `lz4`, `zstd` or
/// `zstd:LEVEL` (the mount option and `user.ldfs.compress`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Hash)]
pub enum Compression {
    #[default]
    Off,
    /// LZ4: fast, a modest ratio.
    Lz4,
    /// Zstandard at `level` (`ZSTD_LEVEL_MIN..=ZSTD_LEVEL_MAX`).
    Zstd { level: u8 },
}

impl Compression {
    pub const ZSTD_LEVEL_MIN: u8 = 1;
    pub const ZSTD_LEVEL_MAX: u8 = 19;
    /// `zstd` without a level: zstd's own default, a good ratio at a few
    /// hundred MB/s a core.
    pub const ZSTD_DEFAULT_LEVEL: u8 = 3;

    /// Parses `off`, `lz4`, `zstd` or `zstd:LEVEL`; the error says what is
    /// accepted.
    pub fn parse(s: &str) -> Result<Compression, String> {
        let usage = || {
            format!(
                "bad compression {s:?}: expected off, lz4, zstd or zstd:LEVEL with LEVEL from {} to {}",
                Self::ZSTD_LEVEL_MIN,
                Self::ZSTD_LEVEL_MAX
            )
        };
        match s {
            "off" => Ok(Compression::Off),
            "lz4" => Ok(Compression::Lz4),
            "zstd" => Ok(Compression::Zstd {
                level: Self::ZSTD_DEFAULT_LEVEL,
            }),
            _ => {
                let level = s.strip_prefix("zstd:").ok_or_else(usage)?;
                // Digits only: no sign, no spaces, no leading `+`.
                if level.is_empty() || level.len() > 2 || !level.bytes().all(|b| b.is_ascii_digit())
                {
                    return Err(usage());
                }
                let level: u8 = level.parse().map_err(|_| usage())?;
                if !(Self::ZSTD_LEVEL_MIN..=Self::ZSTD_LEVEL_MAX).contains(&level) {
                    return Err(usage());
                }
                Ok(Compression::Zstd { level })
            }
        }
    }

    pub fn is_off(&self) -> bool {
        *self == Compression::Off
    }
}

impl fmt::Display for Compression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Compression::Off => f.write_str("off"),
            Compression::Lz4 => f.write_str("lz4"),
            Compression::Zstd { level } => write!(f, "zstd:{level}"),
        }
    }
}

impl std::str::FromStr for Compression {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Compression::parse(s)
    }
}

/// Space as the LD sees it, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpaceStats {
    /// Capacity usable for blocks and their summaries.
    pub capacity_bytes: u64,
    /// Bytes a caller can still have accepted now.
    pub available_bytes: u64,
    /// Bytes of live blocks (after compression).
    pub live_bytes: u64,
}

/// Corruption found in bytes read from a device: what, where, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Corruption {
    /// The structure that failed to decode, e.g. "summary", "checkpoint slot 1".
    pub what: &'static str,
    /// Byte offset on the device of that structure.
    pub offset: u64,
    pub reason: CorruptReason,
}

/// Why bytes were rejected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CorruptReason {
    BadMagic {
        got: u64,
    },
    BadVersion {
        got: u32,
    },
    BadChecksum {
        expected: u32,
        got: u32,
    },
    WrongFileSystem {
        expected: u64,
        got: u64,
    },
    WrongSequence {
        expected: u64,
        got: u64,
    },
    WrongLocation {
        expected: u64,
        got: u64,
    },
    OutOfBounds {
        field: &'static str,
        value: u64,
        limit: u64,
    },
    Inconsistent(String),
}

impl fmt::Display for Corruption {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "corrupt {} at byte {}: ", self.what, self.offset)?;
        match &self.reason {
            CorruptReason::BadMagic { got } => write!(f, "bad magic {got:#x}"),
            CorruptReason::BadVersion { got } => write!(f, "unsupported version {got}"),
            CorruptReason::BadChecksum { expected, got } => {
                write!(
                    f,
                    "checksum mismatch (expected {expected:#010x}, got {got:#010x})"
                )
            }
            CorruptReason::WrongFileSystem { expected, got } => {
                write!(f, "belongs to file system {got:#x}, not {expected:#x}")
            }
            CorruptReason::WrongSequence { expected, got } => {
                write!(f, "sequence {got}, expected {expected}")
            }
            CorruptReason::WrongLocation { expected, got } => {
                write!(f, "claims location {got}, found at {expected}")
            }
            CorruptReason::OutOfBounds {
                field,
                value,
                limit,
            } => {
                write!(f, "{field} = {value} exceeds limit {limit}")
            }
            CorruptReason::Inconsistent(s) => f.write_str(s),
        }
    }
}

/// Errors of the LD layer. errno exists only at the FUSE boundary.
#[derive(Debug, thiserror::Error)]
pub enum LdError {
    #[error(transparent)]
    Device(#[from] DeviceError),
    #[error("{0}")]
    Corrupt(Corruption),
    #[error("no space: {needed} bytes needed, {available} available")]
    NoSpace { needed: u64, available: u64 },
    #[error("{0} does not exist")]
    NoSuchList(ListId),
    #[error("{0} is not open")]
    NoSuchAru(AruId),
    #[error("{aru} is too large: {ops} operations (limit {limit})")]
    AruTooLarge { aru: AruId, ops: u64, limit: u64 },
    #[error("block of {len} bytes is outside 1..={max}")]
    BadBlockLength { len: usize, max: usize },
    #[error("read-only: {0}")]
    ReadOnly(String),
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
}

impl From<Corruption> for LdError {
    fn from(c: Corruption) -> Self {
        LdError::Corrupt(c)
    }
}

pub type LdResult<T> = Result<T, LdError>;

/// The Logical Disk interface. Every method takes `&self`: implementations
/// are shared between threads.
pub trait LogicalDisk: Send + Sync {
    /// Largest block accepted by `write`.
    fn max_block_bytes(&self) -> usize;

    /// Create a list and return its id.
    fn create_list(&self, aru: Option<AruId>, hints: ListHints) -> LdResult<ListId>;
    /// Delete a list and all its blocks.
    fn delete_list(&self, aru: Option<AruId>, list: ListId) -> LdResult<()>;
    /// The hints a list was created with, or `None` if it does not exist.
    fn list_hints(&self, list: ListId) -> LdResult<Option<ListHints>>;

    /// Write (create or replace) one block.
    fn write(&self, aru: Option<AruId>, list: ListId, index: u64, data: &[u8]) -> LdResult<()>;
    /// Read one block; `None` if no block is at that index.
    fn read(&self, list: ListId, index: u64) -> LdResult<Option<Vec<u8>>>;
    /// Read the present blocks with indices in `range`, ascending, at most
    /// `limit` of them. Implementations should read blocks that lie
    /// together on the device with one request (LD 3.5: the disk system
    /// knows the layout, so it is the one to cluster reads).
    fn read_range(
        &self,
        list: ListId,
        range: Range<u64>,
        limit: usize,
    ) -> LdResult<Vec<(u64, Vec<u8>)>> {
        let mut out = Vec::new();
        for i in self.indices(list, range.start, limit)? {
            if i >= range.end {
                break;
            }
            if let Some(b) = self.read(list, i)? {
                out.push((i, b));
            }
        }
        Ok(out)
    }
    /// Delete one block (no error if absent).
    fn delete(&self, aru: Option<AruId>, list: ListId, index: u64) -> LdResult<()>;
    /// Delete every block whose index lies in `range`.
    fn delete_range(&self, aru: Option<AruId>, list: ListId, range: Range<u64>) -> LdResult<()>;
    /// Indices of up to `limit` present blocks with index >= `from`, ascending.
    fn indices(&self, list: ListId, from: u64, limit: usize) -> LdResult<Vec<u64>>;
    /// Ids of up to `limit` existing lists with id >= `from`, ascending
    /// (fsck looks for lists nothing above the LD names).
    fn lists(&self, from: u64, limit: usize) -> LdResult<Vec<ListId>>;
    /// A hint: every block of `list` will be read soon (fsck's tree walk),
    /// so the device may start reading them, in address order, in the
    /// background. Changes nothing.
    fn prefetch(&self, list: ListId) -> LdResult<()>;

    /// Open an ARU.
    fn begin_aru(&self) -> LdResult<AruId>;
    /// Close an ARU; from here on its operations recover together.
    fn end_aru(&self, aru: AruId) -> LdResult<()>;
    /// Take an ARU back: the state becomes what it would be had the ARU
    /// issued none of its operations (every other operation, before or
    /// after, stands), at once for reads, and after a crash (the ARU never
    /// ends, so recovery drops it). Its reservation is released; its id is
    /// never reused. Writes nothing, so it also works on an LD that a device
    /// error turned read-only. For an operation that failed half-way.
    fn abort_aru(&self, aru: AruId) -> LdResult<()>;
    /// Guarantee that `bytes` more bytes of blocks written in `aru` will be
    /// accepted; fails with `NoSpace` before anything is accepted. The
    /// reservation is released when the ARU ends or is aborted.
    fn reserve(&self, aru: AruId, bytes: u64) -> LdResult<()>;
    /// Like `reserve`, for an operation that frees more than it writes (a
    /// delete, an unlink): it may use the part of the device kept back for
    /// metadata, so it succeeds on a full device, where `reserve` would
    /// not. Either way it fails before anything is accepted, never half-way
    /// through the operation.
    fn reserve_freeing(&self, aru: AruId, bytes: u64) -> LdResult<()> {
        self.reserve(aru, bytes)
    }

    /// Make every accepted operation durable.
    fn flush(&self) -> LdResult<()>;
    /// Make `list`'s accepted operations durable. The log is one sequence, so
    /// implementations may flush more than the list.
    fn flush_list(&self, list: ListId) -> LdResult<()>;

    /// Space figures.
    fn space(&self) -> SpaceStats;

    /// Changes how `list`'s blocks are stored from now on (blocks written
    /// before keep their form; reads never need the choice). A hint: the
    /// default, for layouts that do not compress, checks that the list
    /// exists and keeps nothing.
    fn set_compression(
        &self,
        aru: Option<AruId>,
        list: ListId,
        compression: Compression,
    ) -> LdResult<()> {
        let _ = (aru, compression);
        match self.list_hints(list)? {
            Some(_) => Ok(()),
            None => Err(LdError::NoSuchList(list)),
        }
    }
}
