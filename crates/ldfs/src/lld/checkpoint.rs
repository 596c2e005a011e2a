//! Checkpoints (docs/FORMAT.md, "Checkpoint slot"; BSD-LFS 3.3, STYLE 8).
//!
//! Two fixed slots are written alternately; each holds a header page and the
//! segment usage table, all under one crc32c. The newest slot whose checksum
//! holds wins (by `serial`, a counter, never a clock). A torn checkpoint
//! write therefore leaves the other slot, one checkpoint older, intact.

use super::codec::{crc_with_hole, get_u32, get_u64, put_u32, put_u64};
use super::layout::{checkpoint_pages_for, Geometry, USAGE_ENTRY_BYTES};
use super::snapshot::{self, SnapshotRecord};
use super::types::{PagePtr, MAX_COUNTER, PAGE_BYTES};
use super::usage::{SegmentState, Usage};
use crate::ld::{CorruptReason, Corruption};

pub const CHECKPOINT_MAGIC: u64 = u64::from_le_bytes(*b"LDFSCKPT");
pub const CHECKPOINT_VERSION: u32 = 1;
/// A slot holding snapshots: older binaries, which know no pins and would
/// reuse pinned segments, refuse it.
pub const CHECKPOINT_VERSION_SNAPSHOTS: u32 = 2;

const C_MAGIC: usize = 0;
const C_VERSION: usize = 8;
const C_PAGES: usize = 12;
const C_FS_ID: usize = 16;
const C_SERIAL: usize = 24;
const C_EPOCH: usize = 32;
const C_NEXT_SEQ: usize = 40;
const C_LOG_SEGMENT: usize = 48;
const C_LOG_PAGE: usize = 52;
const C_NEXT_SEGMENT: usize = 56;
const C_SEGMENT_COUNT: usize = 60;
const C_MAP_ADDR: usize = 64;
const C_MAP_CRC: usize = 72;
const C_MAP_HEIGHT: usize = 76;
const C_MAP_ENTRIES: usize = 80;
const C_NEXT_LIST: usize = 88;
const C_USER_BYTES: usize = 96;
const C_MOVED_BYTES: usize = 104;
const C_CRC: usize = 112;

/// Everything a checkpoint records.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointHeader {
    pub serial: u64,
    /// Incremented on every open for writing: summaries of another epoch are
    /// not part of this checkpoint's log, even if their sequence matches.
    pub epoch: u64,
    /// Sequence of the first partial segment after the checkpoint.
    pub next_seq: u64,
    /// Where that partial segment starts.
    pub log_segment: u32,
    pub log_page: u32,
    /// The segment the log moves to after `log_segment`.
    pub next_segment: u32,
    /// Map root; `None` for an empty map.
    pub map_root: Option<(PagePtr, u8, u64)>,
    pub next_list: u64,
    /// Bytes of blocks written by users since mkfs (for write cost).
    pub user_bytes: u64,
    /// Bytes moved by the cleaner since mkfs.
    pub moved_bytes: u64,
    /// The kept checkpoints (docs/DESIGN.md "Snapshots"), by number.
    pub snapshots: Vec<SnapshotRecord>,
}

pub fn encode(
    g: &Geometry,
    h: &CheckpointHeader,
    usage: &Usage,
    released: &[super::types::SegmentId],
) -> Vec<u8> {
    let pages = slot_pages_for(g);
    assert_eq!(usage.len(), g.segment_count, "usage table of another size");
    let mut b = vec![0u8; PAGE_BYTES];
    put_u64(&mut b, C_MAGIC, CHECKPOINT_MAGIC);
    let version = if h.snapshots.is_empty() {
        CHECKPOINT_VERSION
    } else {
        CHECKPOINT_VERSION_SNAPSHOTS
    };
    put_u32(&mut b, C_VERSION, version);
    put_u32(&mut b, C_PAGES, pages as u32);
    put_u64(&mut b, C_FS_ID, g.fs_id);
    put_u64(&mut b, C_SERIAL, h.serial);
    put_u64(&mut b, C_EPOCH, h.epoch);
    put_u64(&mut b, C_NEXT_SEQ, h.next_seq);
    put_u32(&mut b, C_LOG_SEGMENT, h.log_segment);
    put_u32(&mut b, C_LOG_PAGE, h.log_page);
    put_u32(&mut b, C_NEXT_SEGMENT, h.next_segment);
    put_u32(&mut b, C_SEGMENT_COUNT, g.segment_count);
    if let Some((ptr, height, entries)) = h.map_root {
        assert!(ptr.addr != 0 && height >= 1);
        put_u64(&mut b, C_MAP_ADDR, ptr.addr);
        put_u32(&mut b, C_MAP_CRC, ptr.crc);
        b[C_MAP_HEIGHT] = height;
        put_u64(&mut b, C_MAP_ENTRIES, entries);
    }
    put_u64(&mut b, C_NEXT_LIST, h.next_list);
    put_u64(&mut b, C_USER_BYTES, h.user_bytes);
    put_u64(&mut b, C_MOVED_BYTES, h.moved_bytes);
    snapshot::encode_table(&mut b, &h.snapshots, h.serial, g.kept_pages);
    // Only kept snapshots' bits may pin segments (a stray bit would hold
    // its segments for ever).
    let kept = h.snapshots.iter().fold(0u32, |m, s| m | 1 << s.pin);
    assert_eq!(
        usage.pin_mask() & !kept,
        0,
        "segments pinned by no snapshot"
    );
    usage.encode(released, &mut b);
    b.resize(pages * PAGE_BYTES, 0);
    if g.kept_table() {
        // The kept table follows the usage table; the slot names (and its
        // crc covers) exactly the pages it fills.
        let table = snapshot::encode_kept(&mut b[..PAGE_BYTES], &h.snapshots);
        b.extend_from_slice(&table);
        let all = pages + snapshot::kept_pages_for(table.len() / snapshot::KEPT_RECORD_BYTES);
        assert!(
            all <= g.checkpoint_pages as usize,
            "kept table past the slot"
        );
        b.resize(all * PAGE_BYTES, 0);
        put_u32(&mut b, C_PAGES, all as u32);
    }
    let crc = crc_with_hole(&b, C_CRC);
    put_u32(&mut b, C_CRC, crc);
    b
}

/// Pages a slot written for `g` covers: with [`INCOMPAT_RESIZE`] only the
/// header and the table of the current segment count (the slot's room for
/// a larger table stays unwritten), else every page of the slot, as
/// images before resize were written.
///
/// [`INCOMPAT_RESIZE`]: super::layout::INCOMPAT_RESIZE
pub fn slot_pages_for(g: &Geometry) -> usize {
    if g.named_slot() {
        checkpoint_pages_for(g.segment_count) as usize
    } else {
        g.checkpoint_pages as usize
    }
}

/// How many pages to read for the slot whose header page is `header`: the
/// pages it names if that is a possible count for `g`, else the whole slot
/// (the decode then fails on its length or crc). Untrusted bytes, bounded.
pub fn slot_pages_named(g: &Geometry, header: &[u8]) -> usize {
    let named = get_u32(header, C_PAGES);
    if g.named_slot() && (2..=g.checkpoint_pages).contains(&named) {
        named as usize
    } else {
        g.checkpoint_pages as usize
    }
}

/// Decodes a slot read at `offset`: `slot_pages_named` pages. With
/// [`INCOMPAT_RESIZE`] its segment count may differ from `g`'s (the usage
/// table's length is the slot's count; [`Geometry::with_segments`] gives the
/// geometry it implies), within what the slots hold and the device fits.
///
/// [`INCOMPAT_RESIZE`]: super::layout::INCOMPAT_RESIZE
pub fn decode(
    g: &Geometry,
    b: &[u8],
    offset: u64,
) -> Result<(CheckpointHeader, Usage), Corruption> {
    let bad = |reason| Corruption {
        what: "checkpoint",
        offset,
        reason,
    };
    let len = b.len();
    let whole = g.checkpoint_pages as usize * PAGE_BYTES;
    if len > whole
        || len < PAGE_BYTES
        || !len.is_multiple_of(PAGE_BYTES)
        || (!g.named_slot() && len != whole)
    {
        return Err(bad(CorruptReason::OutOfBounds {
            field: "length",
            value: len as u64,
            limit: whole as u64,
        }));
    }
    let magic = get_u64(b, C_MAGIC);
    if magic != CHECKPOINT_MAGIC {
        return Err(bad(CorruptReason::BadMagic { got: magic }));
    }
    let expected = get_u32(b, C_CRC);
    let got = crc_with_hole(b, C_CRC);
    if expected != got {
        return Err(bad(CorruptReason::BadChecksum { expected, got }));
    }
    let version = get_u32(b, C_VERSION);
    if version != CHECKPOINT_VERSION && version != CHECKPOINT_VERSION_SNAPSHOTS {
        return Err(bad(CorruptReason::BadVersion { got: version }));
    }
    let fs_id = get_u64(b, C_FS_ID);
    if fs_id != g.fs_id {
        return Err(bad(CorruptReason::WrongFileSystem {
            expected: g.fs_id,
            got: fs_id,
        }));
    }
    let check = |field: &'static str, value: u64, limit: u64| {
        if value >= limit {
            Err(bad(CorruptReason::OutOfBounds {
                field,
                value,
                limit,
            }))
        } else {
            Ok(value)
        }
    };
    let pages = check(
        "pages",
        get_u32(b, C_PAGES) as u64,
        g.checkpoint_pages as u64 + 1,
    )?;
    if g.named_slot() && pages as usize * PAGE_BYTES != len {
        return Err(bad(CorruptReason::Inconsistent(format!(
            "slot names {pages} pages, {} read",
            len / PAGE_BYTES
        ))));
    }
    let count = get_u32(b, C_SEGMENT_COUNT);
    // The slot's count is the truth with the resize flag (the commit point
    // of a resize); it must fit the slot, the slots' room and the device.
    let g = &match g.with_segments(count, g.total_pages) {
        Some(gs) if checkpoint_pages_for(count) as usize * PAGE_BYTES <= len => gs,
        _ => {
            return Err(bad(CorruptReason::Inconsistent(format!(
                "{count} segments, superblock says {} (slots hold {}, {} pages on the device)",
                g.segment_count,
                g.max_segments(),
                g.total_pages
            ))))
        }
    };
    let log_segment = check(
        "log segment",
        get_u32(b, C_LOG_SEGMENT) as u64,
        g.segment_count as u64,
    )? as u32;
    let log_page = check(
        "log page",
        get_u32(b, C_LOG_PAGE) as u64,
        g.segment_pages as u64,
    )? as u32;
    let next_segment = check(
        "next segment",
        get_u32(b, C_NEXT_SEGMENT) as u64,
        g.segment_count as u64,
    )? as u32;
    let map_addr = get_u64(b, C_MAP_ADDR);
    let map_root = if map_addr == 0 {
        None
    } else {
        let height = b[C_MAP_HEIGHT];
        check("map height", height as u64, 17)?;
        if height == 0
            || g.segment_of(map_addr).is_none()
            || !map_addr.is_multiple_of(PAGE_BYTES as u64)
        {
            return Err(bad(CorruptReason::Inconsistent(format!(
                "map root at byte {map_addr}, height {height}"
            ))));
        }
        Some((
            PagePtr {
                addr: map_addr,
                crc: get_u32(b, C_MAP_CRC),
            },
            height,
            get_u64(b, C_MAP_ENTRIES),
        ))
    };
    let usage = Usage::decode(
        &b[PAGE_BYTES..],
        count,
        g.segment_bytes() as u32,
        offset + PAGE_BYTES as u64,
    )?;
    debug_assert!(len >= PAGE_BYTES + count as usize * USAGE_ENTRY_BYTES);
    let active = usage.get(super::types::SegmentId(log_segment)).state;
    if active != SegmentState::Active {
        return Err(bad(CorruptReason::Inconsistent(format!(
            "log segment {log_segment} is {active:?}, not Active"
        ))));
    }
    let counter = |field: &'static str, at: usize| check(field, get_u64(b, at), MAX_COUNTER);
    let serial = counter("serial", C_SERIAL)?;
    let root_ok =
        |addr: u64| g.segment_of(addr).is_some() && addr.is_multiple_of(PAGE_BYTES as u64);
    let mut snapshots = snapshot::decode_table(b, offset, serial, g.kept_table(), root_ok)?;
    let kept_count = get_u32(b, snapshot::KEPT_COUNT_AT) as usize;
    if g.kept_table() {
        let capacity = snapshot::kept_capacity(g.kept_pages);
        if kept_count > capacity {
            return Err(bad(CorruptReason::OutOfBounds {
                field: "kept-table count",
                value: kept_count as u64,
                limit: capacity as u64 + 1,
            }));
        }
        let at = checkpoint_pages_for(count) as usize * PAGE_BYTES;
        let want = at + snapshot::kept_pages_for(kept_count) * PAGE_BYTES;
        if want != len {
            return Err(bad(CorruptReason::Inconsistent(format!(
                "{kept_count} kept-table records need {} pages, the slot names {}",
                want / PAGE_BYTES,
                len / PAGE_BYTES
            ))));
        }
        let kept =
            snapshot::decode_kept(&b[at..], kept_count, offset + at as u64, serial, root_ok)?;
        snapshots.extend(kept);
        snapshots.sort_by_key(|s| s.number);
        if snapshots.windows(2).any(|w| w[0].number == w[1].number) {
            return Err(bad(CorruptReason::Inconsistent(
                "a number in both the snapshot and the kept-checkpoint table".into(),
            )));
        }
    } else if kept_count != 0 || get_u32(b, snapshot::KEPT_COUNT_AT + 4) != 0 {
        return Err(bad(CorruptReason::Inconsistent(format!(
            "{kept_count} kept-table records in a slot without a kept table"
        ))));
    }
    if let Err(why) = snapshot::pins_ok(&snapshots, g.kept_table()) {
        return Err(bad(CorruptReason::Inconsistent(why)));
    }
    let kept = snapshots.iter().fold(0u32, |m, s| m | 1 << s.pin);
    if (version == CHECKPOINT_VERSION) != snapshots.is_empty() || usage.pin_mask() & !kept != 0 {
        return Err(bad(CorruptReason::Inconsistent(format!(
            "version {version} slot with {} snapshots, pins {:#x}",
            snapshots.len(),
            usage.pin_mask()
        ))));
    }
    let header = CheckpointHeader {
        serial,
        epoch: counter("epoch", C_EPOCH)?,
        next_seq: counter("next sequence", C_NEXT_SEQ)?,
        log_segment,
        log_page,
        next_segment,
        map_root,
        next_list: counter("next list", C_NEXT_LIST)?,
        user_bytes: counter("user bytes", C_USER_BYTES)?,
        moved_bytes: counter("moved bytes", C_MOVED_BYTES)?,
        snapshots,
    };
    Ok((header, usage))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lld::layout::MkfsOptions;
    use crate::lld::types::SegmentId;

    fn sample() -> (Geometry, CheckpointHeader, Usage) {
        let g = Geometry::plan(
            16 << 20,
            &MkfsOptions {
                segment_bytes: 64 << 10,
                max_block_bytes: 16 << 10,
                fs_id: 9,
                ..Default::default()
            },
        )
        .unwrap();
        let mut usage = Usage::new(g.segment_count, g.segment_bytes() as u32);
        usage.transition(SegmentId(2), SegmentState::Active);
        usage.add_live(SegmentId(2), 4096, 5);
        usage.transition(SegmentId(3), SegmentState::Next);
        let root = Some((
            PagePtr {
                addr: g.page_addr(SegmentId(2), 1),
                crc: 0x1234,
            },
            2,
            300,
        ));
        let h = CheckpointHeader {
            serial: 4,
            epoch: 2,
            next_seq: 77,
            log_segment: 2,
            log_page: 3,
            next_segment: 3,
            map_root: root,
            next_list: 12,
            user_bytes: 1 << 20,
            moved_bytes: 0,
            snapshots: Vec::new(),
        };
        (g, h, usage)
    }

    #[test]
    fn roundtrip() {
        let (g, h, usage) = sample();
        let b = encode(&g, &h, &usage, &[]);
        let (h2, u2) = decode(&g, &b, 0).unwrap();
        assert_eq!(h2, h);
        assert_eq!(u2.get(SegmentId(2)), usage.get(SegmentId(2)));
        assert_eq!(u2.clean_count(), usage.clean_count());
    }

    /// A well-formed slot (its crc is right) with a counter that would
    /// overflow after open is refused, naming the counter.
    #[test]
    fn counters_near_overflow_are_refused() {
        let (g, h, usage) = sample();
        for (field, set) in [
            (
                "serial",
                &(|h: &mut CheckpointHeader| h.serial = u64::MAX) as &dyn Fn(&mut _),
            ),
            ("epoch", &|h: &mut CheckpointHeader| h.epoch = MAX_COUNTER),
            ("next sequence", &|h: &mut CheckpointHeader| {
                h.next_seq = u64::MAX
            }),
            ("next list", &|h: &mut CheckpointHeader| {
                h.next_list = u64::MAX - 1
            }),
            ("user bytes", &|h: &mut CheckpointHeader| {
                h.user_bytes = u64::MAX
            }),
            ("moved bytes", &|h: &mut CheckpointHeader| {
                h.moved_bytes = MAX_COUNTER
            }),
        ] {
            let mut bad = h.clone();
            set(&mut bad);
            let err = decode(&g, &encode(&g, &bad, &usage, &[]), 0).unwrap_err();
            assert!(
                matches!(err.reason, CorruptReason::OutOfBounds { field: f, .. } if f == field),
                "{field}: {err}"
            );
        }
        let mut ok = h.clone();
        ok.next_seq = MAX_COUNTER - 1;
        assert!(decode(&g, &encode(&g, &ok, &usage, &[]), 0).is_ok());
    }

    #[test]
    fn a_slot_with_snapshots_is_version_2_and_roundtrips() {
        let (g, mut h, mut usage) = sample();
        usage.pin_live(3);
        h.snapshots.push(SnapshotRecord {
            number: 3,
            time_secs: 5,
            map_root: h.map_root,
            next_list: 11,
            pin: 3,
            name: "n".into(),
            protected: true,
        });
        let b = encode(&g, &h, &usage, &[]);
        assert_eq!(get_u32(&b, C_VERSION), CHECKPOINT_VERSION_SNAPSHOTS);
        let (h2, u2) = decode(&g, &b, 0).unwrap();
        assert_eq!(h2, h);
        assert_eq!(u2.get(SegmentId(2)).pins, 1 << 3);
        // A pin bit of no snapshot in the table is refused.
        let mut bad = b.clone();
        put_u32(&mut bad, snapshot::TABLE_COUNT_AT, 0);
        put_u32(&mut bad, C_VERSION, CHECKPOINT_VERSION);
        let crc = crc_with_hole(&bad, C_CRC);
        put_u32(&mut bad, C_CRC, crc);
        assert!(decode(&g, &bad, 0).is_err(), "a pin bit of no snapshot");
    }

    /// With a kept table the protected checkpoints' records follow the
    /// usage table (a generation sharing a pin bit), the slot names and
    /// covers exactly those pages, and a bit shared with a snapshot or a
    /// flipped byte anywhere is refused.
    #[test]
    fn a_kept_table_roundtrips_after_the_usage_table() {
        let (g0, mut h, mut usage) = sample();
        let g = Geometry::plan(
            16 << 20,
            &MkfsOptions {
                segment_bytes: 64 << 10,
                max_block_bytes: 16 << 10,
                fs_id: 9,
                kept_pages: 2,
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(g.segment_count, g0.segment_count);
        assert!(g.kept_table() && g.named_slot());
        assert_eq!(g.checkpoint_pages, g0.checkpoint_pages + 2);
        usage.pin_live(1);
        usage.pin_live(4);
        h.serial = 200;
        let rec = |number: u64, pin: u32, protected: bool| SnapshotRecord {
            number,
            time_secs: 1000 + number,
            map_root: h.map_root,
            next_list: 11,
            pin,
            name: if protected { String::new() } else { "s".into() },
            protected,
        };
        h.snapshots = vec![rec(3, 4, false)];
        // 100 records: two pages of the table (85 a page).
        h.snapshots.extend((10..110).map(|n| rec(n, 1, true)));
        let b = encode(&g, &h, &usage, &[]);
        assert_eq!(
            b.len(),
            (checkpoint_pages_for(g.segment_count) as usize + 2) * PAGE_BYTES
        );
        let (h2, _) = decode(&g, &b, 0).unwrap();
        assert_eq!(h2, h);
        // Fewer records, fewer pages.
        h.snapshots.truncate(2);
        let b1 = encode(&g, &h, &usage, &[]);
        assert_eq!(
            b1.len(),
            (checkpoint_pages_for(g.segment_count) as usize + 1) * PAGE_BYTES
        );
        assert_eq!(decode(&g, &b1, 0).unwrap().0, h);
        for i in 0..b1.len() {
            let mut c = b1.clone();
            c[i] ^= 0x40;
            assert!(decode(&g, &c, 0).is_err(), "byte {i}");
        }
        // A protected record on the snapshot's bit, crc made right: refused.
        let mut c = b1.clone();
        let at = checkpoint_pages_for(g.segment_count) as usize * PAGE_BYTES;
        c[at + 29] = 4;
        let crc = crc_with_hole(&c, C_CRC);
        put_u32(&mut c, C_CRC, crc);
        assert!(decode(&g, &c, 0).is_err(), "a snapshot's bit shared");
        // Without the flag the same table is corrupt.
        assert!(decode(&g0, &b1, 0).is_err());
    }

    #[test]
    fn every_flipped_byte_is_rejected() {
        let (g, h, usage) = sample();
        let good = encode(&g, &h, &usage, &[]);
        for i in 0..good.len() {
            let mut b = good.clone();
            b[i] ^= 0x80;
            let err = decode(&g, &b, 0).unwrap_err();
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
