//! Device layout and the superblock (docs/FORMAT.md, "Layout", "Superblock").
//!
//! ```text
//! page 0                      superblock copy 0
//! pages 1 ..                  checkpoint slot 0, then slot 1 (checkpoint_pages each)
//! first_segment_page ..       segment_count segments of segment_pages pages
//! page total_pages - 1        superblock copy 1
//! ```
//!
//! The superblock is written by mkfs and rewritten only by a resize
//! (`lld::resize`): everything else that changes lives in the checkpoints
//! and the log. Two copies sit at the two ends of the device so one damaged
//! region cannot take both. With [`INCOMPAT_RESIZE`] the segment count is the
//! newest checkpoint's (the commit point of a resize; docs/DESIGN.md
//! "Resize"): the superblock's count and total pages are those of mkfs or
//! of the last resize, and copy 1 is at the device's last page.

use super::codec::{crc_with_hole, get_u32, get_u64, put_u32, put_u64};
use super::types::{SegmentId, PAGE_BYTES};
use crate::ld::{CorruptReason, Corruption, LdError, LdResult};

pub const SUPERBLOCK_MAGIC: u64 = u64::from_le_bytes(*b"LDFS-SB\0");
pub const FORMAT_VERSION: u32 = 1;
/// Incompatible feature flag: the segment count is the newest checkpoint
/// slot's, which may differ from the superblock's (a resize commits by
/// writing a slot), and a slot's crc covers only the pages its header
/// names (the table for its count, not every page mkfs set aside for
/// growth). Older binaries refuse such an image rather than misread it.
pub const INCOMPAT_RESIZE: u32 = 1;
/// Incompatible feature flag: each checkpoint slot has `kept_pages` pages
/// of room for the kept-checkpoint table (protected checkpoints, one record
/// each, docs/DESIGN.md "Snapshots") after the usage table, protected
/// checkpoints of one generation share a pin bit, and a slot's crc covers
/// the pages its header names (as with [`INCOMPAT_RESIZE`]). Older binaries
/// would read a shared pin bit as corruption: they refuse the image.
pub const INCOMPAT_KEPT_TABLE: u32 = 2;
/// Incompatible feature flags this build understands.
pub const INCOMPAT_SUPPORTED: u32 = INCOMPAT_RESIZE | INCOMPAT_KEPT_TABLE;
/// The most kept-table pages a slot may have (a limit on a value read
/// from the superblock).
pub const MAX_KEPT_PAGES: u32 = 256;

// Superblock byte offsets.
const SB_MAGIC: usize = 0;
const SB_VERSION: usize = 8;
const SB_INCOMPAT: usize = 12;
const SB_FS_ID: usize = 16;
const SB_PAGE_BYTES: usize = 24;
const SB_SEGMENT_PAGES: usize = 28;
const SB_TOTAL_PAGES: usize = 32;
const SB_CHECKPOINT_PAGES: usize = 40;
const SB_SLOT0_PAGE: usize = 48;
const SB_SLOT1_PAGE: usize = 56;
const SB_FIRST_SEGMENT_PAGE: usize = 64;
const SB_SEGMENT_COUNT: usize = 72;
const SB_MAX_BLOCK_BYTES: usize = 76;
const SB_RESERVED_SEGMENTS: usize = 80;
const SB_COPY: usize = 84;
const SB_KEPT_PAGES: usize = 88;
const SB_CACHE_ID: usize = 92;
const SB_CRC: usize = PAGE_BYTES - 4;

/// Limits on geometry; every value read from a superblock is checked against them.
pub const MIN_SEGMENT_PAGES: u32 = 8;
/// The fewest reserved segments mkfs accepts: half the reserve holds the
/// next checkpoint's map pages, the other half is the cleaner's room to
/// empty a victim (DESIGN, space accounting). With two, a full device
/// reaches a state where the cleaner's half cannot take a victim's live
/// blocks and writers get NoSpace while dead space waits (a review probe,
/// tests/cleaner.rs). Images written before this limit still open.
pub const MIN_RESERVED_SEGMENTS: u32 = 4;
pub const MAX_SEGMENT_PAGES: u32 = 16384; // 64 MiB
pub const MAX_SEGMENTS: u32 = 1 << 24;
pub const MAX_BLOCK_BYTES_LIMIT: u32 = 1 << 20;
/// Bytes per usage-table entry in a checkpoint.
pub const USAGE_ENTRY_BYTES: usize = 16;

/// The fixed geometry of a formatted device: the superblock's contents.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    pub fs_id: u64,
    pub total_pages: u64,
    pub segment_pages: u32,
    pub segment_count: u32,
    pub first_segment_page: u64,
    /// Pages per checkpoint slot: one header page plus the usage table.
    pub checkpoint_pages: u32,
    pub slot_pages: [u64; 2],
    pub max_block_bytes: u32,
    /// Clean segments user writes may not consume: they belong to the
    /// checkpoint (map pages) and the cleaner, so both can always progress.
    pub reserved_segments: u32,
    /// Incompatible feature flags ([`INCOMPAT_RESIZE`], [`INCOMPAT_KEPT_TABLE`]).
    pub incompat: u32,
    /// Pages per slot for the kept-checkpoint table (with
    /// [`INCOMPAT_KEPT_TABLE`]; else 0), part of `checkpoint_pages`.
    pub kept_pages: u32,
    /// A store cache's identity (random, nonzero; 0: none, any image that is not a store
    /// cache, or one made before it): written by `ldfs mkfs --store` and by every rebuild
    /// from the store into both copies, and recorded in the cache's note, so a note found by
    /// the cache's path vouches only for the cache it was written for (docs/DESIGN.md
    /// "Rebuilding a cache"). lld never changes it (resize and fsck re-encode it).
    pub cache_id: u64,
}

/// Options for formatting.
#[derive(Clone, Copy, Debug)]
pub struct MkfsOptions {
    pub segment_bytes: u64,
    pub max_block_bytes: u32,
    /// `None` chooses 1/16 of the segments, clamped to 4..=64; at least
    /// [`MIN_RESERVED_SEGMENTS`].
    pub reserved_segments: Option<u32>,
    pub fs_id: u64,
    /// The largest size the image may be grown to (`ldfs resize`): the
    /// checkpoint slots get room for its usage table. `None` (the library's
    /// default) sizes them for the device alone; `ldfs mkfs` asks for 16
    /// times the size. Room beyond the device's own table sets
    /// [`INCOMPAT_RESIZE`].
    pub max_bytes: Option<u64>,
    /// Pages per checkpoint slot for the kept-checkpoint table (`protect=`
    /// keeps one record of 48 bytes per checkpoint there); nonzero sets
    /// [`INCOMPAT_KEPT_TABLE`]. The library's default is 0 (protected
    /// checkpoints then live in the slot header, 24 at most, as before);
    /// `ldfs mkfs` asks for 16 (1365 records).
    pub kept_pages: u32,
}

impl Default for MkfsOptions {
    fn default() -> Self {
        MkfsOptions {
            segment_bytes: 2 << 20,
            max_block_bytes: 64 << 10,
            reserved_segments: None,
            fs_id: 0,
            max_bytes: None,
            kept_pages: 0,
        }
    }
}

fn invalid(msg: String) -> LdError {
    LdError::InvalidArgument(msg)
}

impl Geometry {
    /// Lays out a device of `size_bytes`.
    pub fn plan(size_bytes: u64, opts: &MkfsOptions) -> LdResult<Geometry> {
        let page = PAGE_BYTES as u64;
        if !opts.segment_bytes.is_multiple_of(page) {
            return Err(invalid(format!(
                "segment size {} is not a multiple of {page}",
                opts.segment_bytes
            )));
        }
        let segment_pages = (opts.segment_bytes / page) as u32;
        if !(MIN_SEGMENT_PAGES..=MAX_SEGMENT_PAGES).contains(&segment_pages) {
            return Err(invalid(format!(
                "segment size {} outside {}..={} bytes",
                opts.segment_bytes,
                MIN_SEGMENT_PAGES as u64 * page,
                MAX_SEGMENT_PAGES as u64 * page
            )));
        }
        let max_block = opts.max_block_bytes;
        if max_block == 0
            || max_block > MAX_BLOCK_BYTES_LIMIT
            || max_block as u64 > (segment_pages as u64 - 2) * page / 2
        {
            return Err(invalid(format!(
                "max block size {max_block} must be 1..={MAX_BLOCK_BYTES_LIMIT} and at most half a segment"
            )));
        }
        let total_pages = size_bytes / page;
        // First guess of the segment count, then size the checkpoint slots for it.
        let rough = total_pages.saturating_sub(2) / segment_pages as u64;
        let rough = rough.min(MAX_SEGMENTS as u64) as u32;
        // Slots sized for the largest size asked for (room to grow).
        let max_pages = opts.max_bytes.unwrap_or(size_bytes).max(size_bytes) / page;
        let most = (max_pages.saturating_sub(2) / segment_pages as u64).min(MAX_SEGMENTS as u64);
        if opts.kept_pages > MAX_KEPT_PAGES {
            return Err(invalid(format!(
                "{} kept-table pages per slot (at most {MAX_KEPT_PAGES})",
                opts.kept_pages
            )));
        }
        let checkpoint_pages = checkpoint_pages_for(rough.max(most as u32)) + opts.kept_pages;
        let meta_end = 1 + 2 * checkpoint_pages as u64;
        // Segments start on a segment-size boundary (aligned large writes).
        let first_segment_page = meta_end.div_ceil(segment_pages as u64) * segment_pages as u64;
        let room = total_pages.saturating_sub(first_segment_page + 1);
        let segment_count = (room / segment_pages as u64).min(rough as u64) as u32;
        let reserved = opts
            .reserved_segments
            .unwrap_or_else(|| (segment_count / 16).clamp(MIN_RESERVED_SEGMENTS, 64));
        if reserved < MIN_RESERVED_SEGMENTS {
            return Err(invalid(format!(
                "{reserved} reserved segments: at least {MIN_RESERVED_SEGMENTS} are needed (half for the next checkpoint, half for the cleaner to empty a segment on a full device)"
            )));
        }
        if segment_count < reserved + 4 {
            return Err(invalid(format!(
                "device of {size_bytes} bytes holds {segment_count} segments of {} bytes; at least {} are needed",
                opts.segment_bytes,
                reserved + 4
            )));
        }
        Ok(Geometry {
            fs_id: opts.fs_id,
            total_pages,
            segment_pages,
            segment_count,
            first_segment_page,
            checkpoint_pages,
            slot_pages: [1, 1 + checkpoint_pages as u64],
            max_block_bytes: max_block,
            reserved_segments: reserved,
            // Flagged only when the slots were sized for growth (`max_bytes`
            // past the size): slots a page larger than the final count needs
            // (the rough count above crossed a table page) are covered
            // whole, as every unflagged image's are, and older binaries read
            // them.
            incompat: if most > rough as u64
                && checkpoint_pages - opts.kept_pages > checkpoint_pages_for(segment_count)
            {
                INCOMPAT_RESIZE
            } else {
                0
            } | if opts.kept_pages > 0 {
                INCOMPAT_KEPT_TABLE
            } else {
                0
            },
            kept_pages: opts.kept_pages,
            cache_id: 0,
        })
    }

    /// Whether the slots hold a kept-checkpoint table: see
    /// [`INCOMPAT_KEPT_TABLE`].
    pub fn kept_table(&self) -> bool {
        self.incompat & INCOMPAT_KEPT_TABLE != 0
    }

    /// Whether a slot's crc covers only the pages its header names (the
    /// usage table of its count, then its kept table) rather than every
    /// page of the slot.
    pub fn named_slot(&self) -> bool {
        self.resizable() || self.kept_table()
    }

    /// Whether the segment count may change (a resize happened or mkfs
    /// set room aside): see [`INCOMPAT_RESIZE`].
    pub fn resizable(&self) -> bool {
        self.incompat & INCOMPAT_RESIZE != 0
    }

    /// The bound on a summary's next-segment field: with the resize flag
    /// any segment the slots can describe (a summary written before a
    /// shrink may name one cut off since; readers never follow it), else
    /// the segment count.
    pub fn next_segment_bound(&self) -> u32 {
        if self.resizable() {
            self.max_segments().max(self.segment_count)
        } else {
            self.segment_count
        }
    }

    /// The most segments the checkpoint slots can describe.
    pub fn max_segments(&self) -> u32 {
        let entries = (self.checkpoint_pages as u64 - 1 - self.kept_pages as u64)
            * PAGE_BYTES as u64
            / USAGE_ENTRY_BYTES as u64;
        entries.min(MAX_SEGMENTS as u64) as u32
    }

    /// Segments a device of `device_bytes` holds with this layout (before
    /// the slots' limit): the segment area ends before the last page
    /// (superblock copy 1).
    pub fn segments_for(&self, device_bytes: u64) -> u64 {
        let pages = device_bytes / PAGE_BYTES as u64;
        pages.saturating_sub(self.first_segment_page + 1) / self.segment_pages as u64
    }

    /// This geometry with `count` segments on a device of `device_pages`
    /// pages (copy 1 at its last page), if the slots can describe them and
    /// they fit; a resizable geometry only, or `count` unchanged.
    pub fn with_segments(&self, count: u32, device_pages: u64) -> Option<Geometry> {
        if count == self.segment_count && !self.resizable() {
            return Some(*self);
        }
        let end = self.first_segment_page + count as u64 * self.segment_pages as u64;
        let ok = self.resizable()
            && count > self.reserved_segments
            && count <= self.max_segments()
            && end < device_pages;
        ok.then_some(Geometry {
            segment_count: count,
            total_pages: device_pages,
            ..*self
        })
    }

    pub fn segment_bytes(&self) -> u64 {
        self.segment_pages as u64 * PAGE_BYTES as u64
    }

    /// Byte address of a page within a segment.
    pub fn page_addr(&self, seg: SegmentId, page: u32) -> u64 {
        assert!(seg.0 < self.segment_count && page <= self.segment_pages);
        (self.first_segment_page + seg.0 as u64 * self.segment_pages as u64 + page as u64)
            * PAGE_BYTES as u64
    }

    /// The segment holding byte address `addr`, if it lies in the segment area.
    pub fn segment_of(&self, addr: u64) -> Option<SegmentId> {
        let page = addr / PAGE_BYTES as u64;
        let rel = page.checked_sub(self.first_segment_page)?;
        let seg = rel / self.segment_pages as u64;
        (seg < self.segment_count as u64).then_some(SegmentId(seg as u32))
    }

    /// Where mkfs and a resize put the copies: page 0 and this geometry's last page. On a
    /// device of exactly `total_pages` (mkfs's, or any resizable image's: its total is the
    /// device's) that is the device's last page, where readers look ([`copy1_addr`]).
    pub fn superblock_addrs(&self) -> [u64; 2] {
        [0, (self.total_pages - 1) * PAGE_BYTES as u64]
    }

    pub fn slot_addr(&self, slot: usize) -> u64 {
        self.slot_pages[slot] * PAGE_BYTES as u64
    }

    /// fsck, when both superblock copies fail: rebuilds one from the two.
    /// The padding after the fields is zero by format; where the copies'
    /// fields differ (at most 12 bytes, the copy number aside), every
    /// choice of byte from either copy is tried, and a candidate is taken
    /// if it matches the crc stored in a copy (encoded as that copy) and
    /// decodes. `None` unless exactly one geometry results.
    pub fn salvage_superblock(
        a: &[u8],
        b: &[u8],
        addrs: [u64; 2],
        device_bytes: u64,
    ) -> Option<Geometry> {
        const MAX_DIFF: usize = 12;
        if a.len() != PAGE_BYTES || b.len() != PAGE_BYTES {
            return None;
        }
        let fields = (0..SB_COPY).chain(SB_KEPT_PAGES..SB_CACHE_ID + 8);
        let diff: Vec<usize> = fields.filter(|&i| a[i] != b[i]).collect();
        if diff.len() > MAX_DIFF {
            return None;
        }
        let mut found: Option<Geometry> = None;
        for mask in 0u32..(1 << diff.len()) {
            let mut c = vec![0u8; PAGE_BYTES];
            c[..SB_COPY].copy_from_slice(&a[..SB_COPY]);
            c[SB_KEPT_PAGES..SB_CACHE_ID + 8].copy_from_slice(&a[SB_KEPT_PAGES..SB_CACHE_ID + 8]);
            for (k, &i) in diff.iter().enumerate() {
                if mask >> k & 1 == 1 {
                    c[i] = b[i];
                }
            }
            for (copy, stored) in [(0u32, a), (1, b)] {
                put_u32(&mut c, SB_COPY, copy);
                put_u32(&mut c, SB_CRC, 0);
                let crc = crc_with_hole(&c, SB_CRC);
                if crc != get_u32(stored, SB_CRC) {
                    continue;
                }
                put_u32(&mut c, SB_CRC, crc);
                if let Ok(g) = Geometry::decode_superblock(&c, addrs[copy as usize], device_bytes) {
                    match found {
                        None => found = Some(g),
                        Some(f) if f == g => {}
                        Some(_) => return None,
                    }
                }
            }
        }
        found
    }

    /// Encodes superblock copy `copy` (0 or 1).
    pub fn encode_superblock(&self, copy: u32) -> Vec<u8> {
        let mut b = vec![0u8; PAGE_BYTES];
        put_u64(&mut b, SB_MAGIC, SUPERBLOCK_MAGIC);
        put_u32(&mut b, SB_VERSION, FORMAT_VERSION);
        put_u32(&mut b, SB_INCOMPAT, self.incompat);
        put_u64(&mut b, SB_FS_ID, self.fs_id);
        put_u32(&mut b, SB_PAGE_BYTES, PAGE_BYTES as u32);
        put_u32(&mut b, SB_SEGMENT_PAGES, self.segment_pages);
        put_u64(&mut b, SB_TOTAL_PAGES, self.total_pages);
        put_u64(&mut b, SB_CHECKPOINT_PAGES, self.checkpoint_pages as u64);
        put_u64(&mut b, SB_SLOT0_PAGE, self.slot_pages[0]);
        put_u64(&mut b, SB_SLOT1_PAGE, self.slot_pages[1]);
        put_u64(&mut b, SB_FIRST_SEGMENT_PAGE, self.first_segment_page);
        put_u32(&mut b, SB_SEGMENT_COUNT, self.segment_count);
        put_u32(&mut b, SB_MAX_BLOCK_BYTES, self.max_block_bytes);
        put_u32(&mut b, SB_RESERVED_SEGMENTS, self.reserved_segments);
        put_u32(&mut b, SB_COPY, copy);
        put_u32(&mut b, SB_KEPT_PAGES, self.kept_pages);
        put_u64(&mut b, SB_CACHE_ID, self.cache_id);
        let crc = crc_with_hole(&b, SB_CRC);
        put_u32(&mut b, SB_CRC, crc);
        b
    }

    /// Decodes and validates a superblock read at byte `offset` of a device of
    /// `device_bytes`. Every field is bounded before use.
    pub fn decode_superblock(
        b: &[u8],
        offset: u64,
        device_bytes: u64,
    ) -> Result<Geometry, Corruption> {
        let bad = |reason| Corruption {
            what: "superblock",
            offset,
            reason,
        };
        if b.len() != PAGE_BYTES {
            return Err(bad(CorruptReason::OutOfBounds {
                field: "length",
                value: b.len() as u64,
                limit: PAGE_BYTES as u64,
            }));
        }
        let magic = get_u64(b, SB_MAGIC);
        if magic != SUPERBLOCK_MAGIC {
            return Err(bad(CorruptReason::BadMagic { got: magic }));
        }
        let expected = get_u32(b, SB_CRC);
        let got = crc_with_hole(b, SB_CRC);
        if expected != got {
            return Err(bad(CorruptReason::BadChecksum { expected, got }));
        }
        let version = get_u32(b, SB_VERSION);
        if version != FORMAT_VERSION {
            return Err(bad(CorruptReason::BadVersion { got: version }));
        }
        let incompat = get_u32(b, SB_INCOMPAT);
        if incompat & !INCOMPAT_SUPPORTED != 0 {
            return Err(bad(CorruptReason::Inconsistent(format!(
                "unsupported incompatible features {incompat:#x}"
            ))));
        }
        let bound = |field: &'static str, value: u64, lo: u64, hi: u64| {
            if value < lo || value > hi {
                Err(bad(CorruptReason::OutOfBounds {
                    field,
                    value,
                    limit: hi,
                }))
            } else {
                Ok(value)
            }
        };
        bound(
            "page size",
            get_u32(b, SB_PAGE_BYTES) as u64,
            PAGE_BYTES as u64,
            PAGE_BYTES as u64,
        )?;
        let segment_pages = bound(
            "segment pages",
            get_u32(b, SB_SEGMENT_PAGES) as u64,
            MIN_SEGMENT_PAGES as u64,
            MAX_SEGMENT_PAGES as u64,
        )? as u32;
        let device_pages = device_bytes / PAGE_BYTES as u64;
        // With the resize flag the device's own size is the total (below):
        // the stored one is only where copy 1 was last written, and may
        // exceed a device shrunk after an offline shrink of the file system
        // (a block device: `lld::resize`), which is no corruption as long
        // as the segments still fit.
        let resizable = incompat & INCOMPAT_RESIZE != 0;
        let total_pages = bound(
            "total pages",
            get_u64(b, SB_TOTAL_PAGES),
            2,
            if resizable {
                u64::MAX >> 12
            } else {
                device_pages
            },
        )?;
        let total_pages = if resizable { device_pages } else { total_pages };
        let segment_count = bound(
            "segment count",
            get_u32(b, SB_SEGMENT_COUNT) as u64,
            1,
            MAX_SEGMENTS as u64,
        )? as u32;
        let kept_pages = if incompat & INCOMPAT_KEPT_TABLE != 0 {
            bound(
                "kept-table pages",
                get_u32(b, SB_KEPT_PAGES) as u64,
                1,
                MAX_KEPT_PAGES as u64,
            )? as u32
        } else {
            bound("kept-table pages", get_u32(b, SB_KEPT_PAGES) as u64, 0, 0)? as u32
        };
        let checkpoint_pages = bound(
            "checkpoint pages",
            get_u64(b, SB_CHECKPOINT_PAGES),
            (checkpoint_pages_for(segment_count) + kept_pages) as u64,
            (checkpoint_pages_for(MAX_SEGMENTS) + kept_pages) as u64,
        )? as u32;
        let slot0 = get_u64(b, SB_SLOT0_PAGE);
        let slot1 = get_u64(b, SB_SLOT1_PAGE);
        let first_segment_page = get_u64(b, SB_FIRST_SEGMENT_PAGE);
        let max_block_bytes = bound(
            "max block bytes",
            get_u32(b, SB_MAX_BLOCK_BYTES) as u64,
            1,
            MAX_BLOCK_BYTES_LIMIT as u64,
        )? as u32;
        let reserved_segments = bound(
            "reserved segments",
            get_u32(b, SB_RESERVED_SEGMENTS) as u64,
            1,
            segment_count as u64,
        )? as u32;
        // The regions must be disjoint and inside the device.
        let cp = checkpoint_pages as u64;
        let seg_end =
            first_segment_page.saturating_add(segment_count as u64 * segment_pages as u64);
        let layout_ok = slot0 >= 1
            && slot1 >= slot0 + cp
            && first_segment_page >= slot1 + cp
            && seg_end < total_pages
            && (max_block_bytes as u64) <= (segment_pages as u64 - 2) * PAGE_BYTES as u64 / 2;
        if !layout_ok {
            return Err(bad(CorruptReason::Inconsistent(format!(
                "regions overlap or exceed the device: slots at pages {slot0} and {slot1} ({cp} pages), \
                 segments {first_segment_page}..{seg_end}, total {total_pages}"
            ))));
        }
        Ok(Geometry {
            incompat,
            fs_id: get_u64(b, SB_FS_ID),
            total_pages,
            segment_pages,
            segment_count,
            first_segment_page,
            checkpoint_pages,
            slot_pages: [slot0, slot1],
            max_block_bytes,
            reserved_segments,
            kept_pages,
            cache_id: get_u64(b, SB_CACHE_ID),
        })
    }
}

/// Where superblock copy 1 is read on a device of `device_bytes`: its last page
/// (`read_superblock`, `Lld::open`'s fallback, fsck's `check_superblocks`). mkfs plans for the
/// device's size, so its copy 1 is there; so is a resizable image's (the device's size is its
/// total). A file system on a device larger than its geometry without [`INCOMPAT_RESIZE`]
/// (a store cache rebuilt on a larger block device) keeps its copy 1 here too, not at the
/// geometry's last page, which no reader looks at (review 37 finding 1).
pub fn copy1_addr(device_bytes: u64) -> u64 {
    (device_bytes / PAGE_BYTES as u64).saturating_sub(1) * PAGE_BYTES as u64
}

/// A superblock page re-encoded as copy `copy` (its copy number and crc), every other byte
/// kept: page 0 restored from copy 1 keeps the total pages copy 1 records, which decoding a
/// resizable image replaces with the device's (a store cache's page 0 is uploaded, and a
/// rebuild sizes its cache by the total it records). Decode the result to check it.
pub fn superblock_as_copy(page: &[u8], copy: u32) -> Vec<u8> {
    assert_eq!(page.len(), PAGE_BYTES);
    assert!(copy < 2, "superblock copy {copy}");
    let mut b = page.to_vec();
    put_u32(&mut b, SB_COPY, copy);
    with_crc(b)
}

/// `b` with its crc set for what it now holds.
fn with_crc(mut b: Vec<u8>) -> Vec<u8> {
    let crc = crc_with_hole(&b, SB_CRC);
    put_u32(&mut b, SB_CRC, crc);
    b
}

/// The total pages a superblock page records, unchecked: with [`INCOMPAT_RESIZE`] the
/// device's size when copy 1 was last written (decoding takes the device's own size instead),
/// which is what a copy of the image elsewhere needs (the segment store's rebuild). Decode
/// with it to check it.
pub fn recorded_total_pages(page: &[u8]) -> u64 {
    get_u64(page, SB_TOTAL_PAGES)
}

/// A superblock page with its cache id set to `id` (its crc again), every other byte kept
/// ([`Geometry::cache_id`]): a rebuild writes the checkpoint object's page (the writer's
/// cache's) with its own id. Decode the result to check it.
pub fn superblock_with_cache_id(page: &[u8], id: u64) -> Vec<u8> {
    assert_eq!(page.len(), PAGE_BYTES);
    let mut b = page.to_vec();
    put_u64(&mut b, SB_CACHE_ID, id);
    with_crc(b)
}

/// A random nonzero cache id ([`Geometry::cache_id`]).
pub fn random_cache_id() -> u64 {
    rand::random::<u64>() | 1
}

/// Pages of one checkpoint slot for `segments` segments: a header page plus
/// the usage table.
pub fn checkpoint_pages_for(segments: u32) -> u32 {
    1 + (segments as usize * USAGE_ENTRY_BYTES).div_ceil(PAGE_BYTES) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_is_disjoint_and_roundtrips() {
        let g = Geometry::plan(
            64 << 20,
            &MkfsOptions {
                fs_id: 7,
                ..Default::default()
            },
        )
        .unwrap();
        assert!(g.first_segment_page >= g.slot_pages[1] + g.checkpoint_pages as u64);
        assert!(
            g.page_addr(SegmentId(g.segment_count - 1), g.segment_pages) <= g.superblock_addrs()[1]
        );
        for copy in 0..2 {
            let b = g.encode_superblock(copy);
            assert_eq!(Geometry::decode_superblock(&b, 0, 64 << 20).unwrap(), g);
        }
    }

    #[test]
    fn both_superblock_copies_damaged_are_salvaged_from_the_two() {
        let size = 64 << 20;
        let g = Geometry::plan(
            size,
            &MkfsOptions {
                fs_id: 9,
                ..Default::default()
            },
        )
        .unwrap();
        let addrs = g.superblock_addrs();
        let (good_a, good_b) = (g.encode_superblock(0), g.encode_superblock(1));
        // Every pair of single-byte damages, one per copy, anywhere in the
        // fields, the padding or the crc: salvaged unless both hit the
        // same field byte or both crcs.
        let spots = [0usize, 17, 33, 80, 85, 200, 4000, SB_CRC + 1];
        for &i in &spots {
            for &j in &spots {
                let (mut a, mut b) = (good_a.clone(), good_b.clone());
                a[i] ^= 0x10;
                b[j] ^= 0x04;
                assert!(Geometry::decode_superblock(&a, addrs[0], size).is_err());
                assert!(Geometry::decode_superblock(&b, addrs[1], size).is_err());
                let got = Geometry::salvage_superblock(&a, &b, addrs, size);
                if (i == j && i < SB_COPY) || (i >= SB_CRC && j >= SB_CRC) {
                    // Neither copy holds the byte, or no stored crc is left
                    // to verify a candidate: no geometry, never a wrong one.
                    assert_eq!(got, None, "damage at {i} and {j}");
                } else {
                    assert_eq!(got, Some(g), "damage at {i} and {j}");
                }
            }
        }
        // Garbage in both: nothing.
        assert_eq!(
            Geometry::salvage_superblock(&[0xa5; PAGE_BYTES], &[0x5a; PAGE_BYTES], addrs, size),
            None
        );
    }

    /// The cache id (store5) round-trips in both copies, is set by `superblock_with_cache_id`
    /// without touching another field, and a salvage from two damaged copies keeps it.
    #[test]
    fn the_cache_id_round_trips_and_is_salvaged() {
        let size = 64 << 20;
        let g = Geometry {
            cache_id: 0x5105_0001,
            ..Geometry::plan(size, &MkfsOptions::default()).unwrap()
        };
        for copy in 0..2 {
            let b = g.encode_superblock(copy);
            assert_eq!(Geometry::decode_superblock(&b, 0, size).unwrap(), g);
        }
        let plain = Geometry { cache_id: 0, ..g };
        let stamped = superblock_with_cache_id(&plain.encode_superblock(0), g.cache_id);
        assert_eq!(stamped, g.encode_superblock(0));
        let one = superblock_as_copy(&stamped, 1);
        assert_eq!(one, g.encode_superblock(1));
        let (mut a, mut b) = (g.encode_superblock(0), g.encode_superblock(1));
        a[SB_CACHE_ID] ^= 1;
        b[SB_FS_ID] ^= 1;
        let addrs = g.superblock_addrs();
        assert_eq!(Geometry::salvage_superblock(&a, &b, addrs, size), Some(g));
    }

    #[test]
    fn too_small_device_is_refused() {
        assert!(matches!(
            Geometry::plan(1 << 20, &MkfsOptions::default()),
            Err(LdError::InvalidArgument(_))
        ));
    }

    #[test]
    fn every_flipped_byte_is_rejected() {
        let g = Geometry::plan(64 << 20, &MkfsOptions::default()).unwrap();
        let good = g.encode_superblock(0);
        for i in 0..PAGE_BYTES {
            let mut b = good.clone();
            b[i] ^= 0x40;
            let err = Geometry::decode_superblock(&b, 0, 64 << 20).unwrap_err();
            assert!(
                matches!(
                    err.reason,
                    CorruptReason::BadChecksum { .. } | CorruptReason::BadMagic { .. }
                ),
                "byte {i}: {err}"
            );
        }
    }
}
