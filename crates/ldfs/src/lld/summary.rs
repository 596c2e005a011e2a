//! Partial-segment summaries (docs/FORMAT.md, "Partial segment").
//!
//! A partial segment is `summary_pages` pages of summary followed by
//! `data_pages` pages of block data. The summary names every block in the
//! data area with its crc32c (kept outside the block, STYLE 10), every
//! deletion, every ARU end and every map page, in log order. It carries the
//! file system id, the epoch and a sequence number that is exactly one more
//! than the previous partial segment's, so stale or foreign summaries are
//! rejected during roll-forward (BSD-LFS 3.3, NetBSD `lfs_rfw.c`).
//!
//! Decoding bounds every count and offset before use and reports why it
//! rejected the bytes (STYLE 9, 12); it never panics.

use super::codec::{crc_with_hole, get_u32, get_u64, put_u32, put_u64, Reader, Writer};
use super::types::{Key, MAX_COUNTER, PAGE_BYTES};
use crate::ld::{CorruptReason, Corruption};

pub const SUMMARY_MAGIC: u64 = u64::from_le_bytes(*b"LDFSPSEG");
pub const SUMMARY_VERSION: u32 = 1;
/// Limit on summary size; a partial segment is sealed before it would exceed it.
pub const MAX_SUMMARY_PAGES: u32 = 16;
pub const MAX_RECORDS: u32 = (MAX_SUMMARY_PAGES as usize * PAGE_BYTES / 9) as u32;

// Header byte offsets.
const H_MAGIC: usize = 0;
const H_VERSION: usize = 8;
const H_SUMMARY_PAGES: usize = 12;
const H_FS_ID: usize = 16;
const H_EPOCH: usize = 24;
const H_SEQ: usize = 32;
const H_SEGMENT: usize = 40;
const H_PAGE: usize = 44;
const H_NEXT_SEGMENT: usize = 48;
const H_DATA_PAGES: usize = 52;
const H_RECORD_COUNT: usize = 56;
const H_RECORDS_BYTES: usize = 60;
const H_CRC: usize = 64;
pub const HEADER_BYTES: usize = 72;

const K_WRITE: u8 = 1;
const K_DELETE: u8 = 2;
const K_DELETE_RANGE: u8 = 3;
const K_DELETE_LIST: u8 = 4;
const K_ARU_END: u8 = 5;
const K_MAP_PAGE: u8 = 6;

/// One logged operation. `aru` 0 means "not in an ARU" (commits at once).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    /// A block of `len` stored bytes at `data_off` in the data area.
    Write {
        aru: u64,
        key: Key,
        data_off: u32,
        len: u32,
        crc: u32,
        flags: u8,
    },
    Delete {
        aru: u64,
        key: Key,
    },
    /// Deletes indices `from..to` of `list`.
    DeleteRange {
        aru: u64,
        list: u64,
        from: u64,
        to: u64,
    },
    DeleteList {
        aru: u64,
        list: u64,
    },
    AruEnd {
        aru: u64,
    },
    /// A 4096-byte map page at `data_off` (map level and first key, for the cleaner).
    MapPage {
        level: u8,
        first_key: Key,
        data_off: u32,
        crc: u32,
    },
}

impl Record {
    /// Encoded size in bytes.
    pub fn encoded_len(&self) -> usize {
        match self {
            Record::Write { .. } => 38,
            Record::Delete { .. } => 25,
            Record::DeleteRange { .. } => 33,
            Record::DeleteList { .. } => 17,
            Record::AruEnd { .. } => 9,
            Record::MapPage { .. } => 26,
        }
    }

    /// The ARU the record belongs to (0 = none).
    pub fn aru(&self) -> u64 {
        match *self {
            Record::Write { aru, .. }
            | Record::Delete { aru, .. }
            | Record::DeleteRange { aru, .. }
            | Record::DeleteList { aru, .. }
            | Record::AruEnd { aru } => aru,
            Record::MapPage { .. } => 0,
        }
    }

    fn encode(&self, w: &mut Writer) {
        match *self {
            Record::Write {
                aru,
                key,
                data_off,
                len,
                crc,
                flags,
            } => {
                w.u8(K_WRITE);
                w.u8(flags);
                w.u64(aru);
                w.u64(key.list);
                w.u64(key.index);
                w.u32(data_off);
                w.u32(len);
                w.u32(crc);
            }
            Record::Delete { aru, key } => {
                w.u8(K_DELETE);
                w.u64(aru);
                w.u64(key.list);
                w.u64(key.index);
            }
            Record::DeleteRange {
                aru,
                list,
                from,
                to,
            } => {
                w.u8(K_DELETE_RANGE);
                w.u64(aru);
                w.u64(list);
                w.u64(from);
                w.u64(to);
            }
            Record::DeleteList { aru, list } => {
                w.u8(K_DELETE_LIST);
                w.u64(aru);
                w.u64(list);
            }
            Record::AruEnd { aru } => {
                w.u8(K_ARU_END);
                w.u64(aru);
            }
            Record::MapPage {
                level,
                first_key,
                data_off,
                crc,
            } => {
                w.u8(K_MAP_PAGE);
                w.u8(level);
                w.u64(first_key.list);
                w.u64(first_key.index);
                w.u32(data_off);
                w.u32(crc);
            }
        }
    }

    fn decode(r: &mut Reader) -> Option<Record> {
        let kind = r.u8()?;
        Some(match kind {
            K_WRITE => {
                let flags = r.u8()?;
                let aru = r.u64()?;
                let key = Key {
                    list: r.u64()?,
                    index: r.u64()?,
                };
                Record::Write {
                    aru,
                    key,
                    data_off: r.u32()?,
                    len: r.u32()?,
                    crc: r.u32()?,
                    flags,
                }
            }
            K_DELETE => {
                let aru = r.u64()?;
                Record::Delete {
                    aru,
                    key: Key {
                        list: r.u64()?,
                        index: r.u64()?,
                    },
                }
            }
            K_DELETE_RANGE => Record::DeleteRange {
                aru: r.u64()?,
                list: r.u64()?,
                from: r.u64()?,
                to: r.u64()?,
            },
            K_DELETE_LIST => Record::DeleteList {
                aru: r.u64()?,
                list: r.u64()?,
            },
            K_ARU_END => Record::AruEnd { aru: r.u64()? },
            K_MAP_PAGE => {
                let level = r.u8()?;
                let first_key = Key {
                    list: r.u64()?,
                    index: r.u64()?,
                };
                Record::MapPage {
                    level,
                    first_key,
                    data_off: r.u32()?,
                    crc: r.u32()?,
                }
            }
            _ => return None,
        })
    }
}

/// The decoded header of a partial segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SummaryHeader {
    pub fs_id: u64,
    pub epoch: u64,
    pub seq: u64,
    pub segment: u32,
    /// First page of this partial segment within its segment.
    pub page: u32,
    /// The segment the log continues in once this one is full.
    pub next_segment: u32,
    pub summary_pages: u32,
    pub data_pages: u32,
}

impl SummaryHeader {
    pub fn total_pages(&self) -> u32 {
        self.summary_pages + self.data_pages
    }
}

/// Summary pages needed for records totalling `records_bytes`.
pub fn summary_pages_for(records_bytes: usize) -> u32 {
    (HEADER_BYTES + records_bytes).div_ceil(PAGE_BYTES).max(1) as u32
}

/// Encodes a summary. Panics (an invariant, not input) if the records exceed
/// the limits: the writer seals partial segments before they do.
pub fn encode(h: &SummaryHeader, records: &[Record]) -> Vec<u8> {
    let records_bytes: usize = records.iter().map(Record::encoded_len).sum();
    assert_eq!(h.summary_pages, summary_pages_for(records_bytes));
    assert!(h.summary_pages <= MAX_SUMMARY_PAGES && records.len() as u32 <= MAX_RECORDS);
    let mut b = Vec::with_capacity(h.summary_pages as usize * PAGE_BYTES);
    b.resize(HEADER_BYTES, 0);
    {
        let mut w = Writer { buf: &mut b };
        for r in records {
            assert_record_fits(r, h.data_pages);
            r.encode(&mut w);
        }
    }
    b.resize(h.summary_pages as usize * PAGE_BYTES, 0);
    put_u64(&mut b, H_MAGIC, SUMMARY_MAGIC);
    put_u32(&mut b, H_VERSION, SUMMARY_VERSION);
    put_u32(&mut b, H_SUMMARY_PAGES, h.summary_pages);
    put_u64(&mut b, H_FS_ID, h.fs_id);
    put_u64(&mut b, H_EPOCH, h.epoch);
    put_u64(&mut b, H_SEQ, h.seq);
    put_u32(&mut b, H_SEGMENT, h.segment);
    put_u32(&mut b, H_PAGE, h.page);
    put_u32(&mut b, H_NEXT_SEGMENT, h.next_segment);
    put_u32(&mut b, H_DATA_PAGES, h.data_pages);
    put_u32(&mut b, H_RECORD_COUNT, records.len() as u32);
    put_u32(&mut b, H_RECORDS_BYTES, records_bytes as u32);
    let crc = crc_with_hole(&b, H_CRC);
    put_u32(&mut b, H_CRC, crc);
    // Pair assertion (STYLE 5): what we wrote decodes to what we meant.
    debug_assert_eq!(
        decode_records(&b, 0, h.summary_pages, h.data_pages).as_deref(),
        Ok(records)
    );
    b
}

fn assert_record_fits(r: &Record, data_pages: u32) {
    let data_bytes = data_pages as u64 * PAGE_BYTES as u64;
    match *r {
        Record::Write { data_off, len, .. } => {
            assert!(data_off as u64 + len as u64 <= data_bytes && len > 0)
        }
        Record::MapPage { data_off, .. } => {
            assert!(data_off as u64 + PAGE_BYTES as u64 <= data_bytes)
        }
        _ => {}
    }
}

/// What is known of where a summary is read from, to check against.
pub struct Expect {
    pub fs_id: u64,
    pub segment: u32,
    pub page: u32,
    /// Pages left in the segment from `page` on.
    pub pages_left: u32,
    pub segment_count: u32,
    pub max_block_bytes: u32,
}

/// Decodes the header in the first summary page (`first_page`, 4096 bytes)
/// and checks everything checkable without the rest: magic, version, fs id,
/// location, sizes. The checksum needs the whole summary: see `decode_records`.
pub fn decode_header(
    first_page: &[u8],
    offset: u64,
    ex: &Expect,
) -> Result<SummaryHeader, Corruption> {
    let bad = |reason| Corruption {
        what: "summary",
        offset,
        reason,
    };
    if first_page.len() < PAGE_BYTES {
        return Err(bad(CorruptReason::OutOfBounds {
            field: "length",
            value: first_page.len() as u64,
            limit: PAGE_BYTES as u64,
        }));
    }
    let magic = get_u64(first_page, H_MAGIC);
    if magic != SUMMARY_MAGIC {
        return Err(bad(CorruptReason::BadMagic { got: magic }));
    }
    let version = get_u32(first_page, H_VERSION);
    if version != SUMMARY_VERSION {
        return Err(bad(CorruptReason::BadVersion { got: version }));
    }
    let fs_id = get_u64(first_page, H_FS_ID);
    if fs_id != ex.fs_id {
        return Err(bad(CorruptReason::WrongFileSystem {
            expected: ex.fs_id,
            got: fs_id,
        }));
    }
    let segment = get_u32(first_page, H_SEGMENT);
    let page = get_u32(first_page, H_PAGE);
    if segment != ex.segment || page != ex.page {
        let here = ((ex.segment as u64) << 32) | ex.page as u64;
        let claims = ((segment as u64) << 32) | page as u64;
        return Err(bad(CorruptReason::WrongLocation {
            expected: here,
            got: claims,
        }));
    }
    let summary_pages = get_u32(first_page, H_SUMMARY_PAGES);
    let data_pages = get_u32(first_page, H_DATA_PAGES);
    if summary_pages == 0 || summary_pages > MAX_SUMMARY_PAGES {
        return Err(bad(CorruptReason::OutOfBounds {
            field: "summary pages",
            value: summary_pages as u64,
            limit: MAX_SUMMARY_PAGES as u64,
        }));
    }
    if summary_pages as u64 + data_pages as u64 > ex.pages_left as u64 {
        return Err(bad(CorruptReason::OutOfBounds {
            field: "partial segment pages",
            value: summary_pages as u64 + data_pages as u64,
            limit: ex.pages_left as u64,
        }));
    }
    let next_segment = get_u32(first_page, H_NEXT_SEGMENT);
    if next_segment >= ex.segment_count {
        return Err(bad(CorruptReason::OutOfBounds {
            field: "next segment",
            value: next_segment as u64,
            limit: ex.segment_count as u64,
        }));
    }
    let (epoch, seq) = (get_u64(first_page, H_EPOCH), get_u64(first_page, H_SEQ));
    for (field, value) in [("epoch", epoch), ("sequence", seq)] {
        if value >= MAX_COUNTER {
            return Err(bad(CorruptReason::OutOfBounds {
                field,
                value,
                limit: MAX_COUNTER,
            }));
        }
    }
    Ok(SummaryHeader {
        fs_id,
        epoch,
        seq,
        segment,
        page,
        next_segment,
        summary_pages,
        data_pages,
    })
}

/// Verifies the checksum of the whole summary (`summary_pages` pages in `b`)
/// and decodes its records, bounding each against the data area.
pub fn decode_records(
    b: &[u8],
    offset: u64,
    summary_pages: u32,
    data_pages: u32,
) -> Result<Vec<Record>, Corruption> {
    decode_records_limited(b, offset, summary_pages, data_pages, u32::MAX)
}

pub fn decode_records_limited(
    b: &[u8],
    offset: u64,
    summary_pages: u32,
    data_pages: u32,
    max_block_bytes: u32,
) -> Result<Vec<Record>, Corruption> {
    let bad = |reason| Corruption {
        what: "summary",
        offset,
        reason,
    };
    let len = summary_pages as usize * PAGE_BYTES;
    if b.len() < len || len < PAGE_BYTES {
        return Err(bad(CorruptReason::OutOfBounds {
            field: "summary length",
            value: b.len() as u64,
            limit: len as u64,
        }));
    }
    let b = &b[..len];
    let expected = get_u32(b, H_CRC);
    let got = crc_with_hole(b, H_CRC);
    if expected != got {
        return Err(bad(CorruptReason::BadChecksum { expected, got }));
    }
    let count = get_u32(b, H_RECORD_COUNT);
    let records_bytes = get_u32(b, H_RECORDS_BYTES) as usize;
    if count > MAX_RECORDS {
        return Err(bad(CorruptReason::OutOfBounds {
            field: "record count",
            value: count as u64,
            limit: MAX_RECORDS as u64,
        }));
    }
    if HEADER_BYTES + records_bytes > len {
        return Err(bad(CorruptReason::OutOfBounds {
            field: "records bytes",
            value: records_bytes as u64,
            limit: (len - HEADER_BYTES) as u64,
        }));
    }
    let data_bytes = data_pages as u64 * PAGE_BYTES as u64;
    let mut r = Reader::new(&b[HEADER_BYTES..HEADER_BYTES + records_bytes]);
    let mut records = Vec::with_capacity(count as usize);
    for i in 0..count {
        let rec = Record::decode(&mut r).ok_or_else(|| {
            bad(CorruptReason::Inconsistent(format!(
                "record {i} is truncated or of unknown kind"
            )))
        })?;
        let ok = match rec {
            Record::Write {
                data_off,
                len,
                flags,
                ..
            } => {
                len > 0
                    && len <= max_block_bytes.saturating_add(64)
                    && data_off as u64 + len as u64 <= data_bytes
                    && flags & !super::types::entry_flags::ON_DISK_MASK == 0
            }
            Record::MapPage {
                data_off, level, ..
            } => {
                (data_off as usize).is_multiple_of(PAGE_BYTES)
                    && data_off as u64 + PAGE_BYTES as u64 <= data_bytes
                    && level < 16
            }
            Record::DeleteRange { from, to, .. } => from <= to,
            _ => true,
        };
        if !ok {
            return Err(bad(CorruptReason::Inconsistent(format!(
                "record {i} ({rec:?}) lies outside the data area or is malformed"
            ))));
        }
        records.push(rec);
    }
    if r.pos() != records_bytes {
        return Err(bad(CorruptReason::Inconsistent(format!(
            "{} trailing record bytes",
            records_bytes - r.pos()
        ))));
    }
    Ok(records)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> (SummaryHeader, Vec<Record>) {
        let records = vec![
            Record::Write {
                aru: 3,
                key: Key { list: 5, index: 9 },
                data_off: 0,
                len: 4096,
                crc: 0xdead,
                flags: 0,
            },
            Record::Write {
                aru: 0,
                key: Key { list: 5, index: 10 },
                data_off: 4096,
                len: 17,
                crc: 1,
                flags: 1,
            },
            Record::Delete {
                aru: 3,
                key: Key { list: 6, index: 1 },
            },
            Record::DeleteRange {
                aru: 0,
                list: 7,
                from: 3,
                to: 99,
            },
            Record::DeleteList { aru: 4, list: 8 },
            Record::AruEnd { aru: 3 },
            Record::MapPage {
                level: 1,
                first_key: Key { list: 2, index: 0 },
                data_off: 8192,
                crc: 77,
            },
        ];
        let bytes: usize = records.iter().map(Record::encoded_len).sum();
        let h = SummaryHeader {
            fs_id: 42,
            epoch: 2,
            seq: 100,
            segment: 3,
            page: 8,
            next_segment: 4,
            summary_pages: summary_pages_for(bytes),
            data_pages: 3,
        };
        (h, records)
    }

    fn expect() -> Expect {
        Expect {
            fs_id: 42,
            segment: 3,
            page: 8,
            pages_left: 100,
            segment_count: 10,
            max_block_bytes: 65536,
        }
    }

    #[test]
    fn roundtrip() {
        let (h, records) = sample();
        let b = encode(&h, &records);
        assert_eq!(decode_header(&b, 0, &expect()).unwrap(), h);
        assert_eq!(
            decode_records(&b, 0, h.summary_pages, h.data_pages).unwrap(),
            records
        );
    }

    /// Sequence numbers and epochs that would overflow after open are
    /// refused however well-formed the rest is.
    #[test]
    fn counters_near_overflow_are_refused() {
        let (h, records) = sample();
        for (field, seq, epoch) in [
            ("sequence", u64::MAX, 2),
            ("sequence", MAX_COUNTER, 2),
            ("epoch", 100, u64::MAX),
        ] {
            let b = encode(&SummaryHeader { seq, epoch, ..h }, &records);
            let err = decode_header(&b, 0, &expect()).unwrap_err();
            assert!(
                matches!(err.reason, CorruptReason::OutOfBounds { field: f, .. } if f == field),
                "{field}: {err}"
            );
        }
        let b = encode(
            &SummaryHeader {
                seq: MAX_COUNTER - 1,
                ..h
            },
            &records,
        );
        assert!(decode_header(&b, 0, &expect()).is_ok());
    }

    #[test]
    fn every_flipped_byte_is_rejected_with_a_reason() {
        let (h, records) = sample();
        let good = encode(&h, &records);
        for i in 0..good.len() {
            let mut b = good.clone();
            b[i] ^= 0x01;
            let header = decode_header(&b, 0, &expect());
            let rejected = match header {
                Err(_) => true,
                Ok(hh) => decode_records(&b, 0, hh.summary_pages, hh.data_pages).is_err(),
            };
            assert!(rejected, "flip of byte {i} was accepted");
        }
    }

    #[test]
    fn misplaced_summary_is_rejected() {
        let (h, records) = sample();
        let b = encode(&h, &records);
        let ex = Expect {
            page: 16,
            ..expect()
        };
        assert!(matches!(
            decode_header(&b, 0, &ex).unwrap_err().reason,
            CorruptReason::WrongLocation { .. }
        ));
        let ex = Expect {
            fs_id: 1,
            ..expect()
        };
        assert!(matches!(
            decode_header(&b, 0, &ex).unwrap_err().reason,
            CorruptReason::WrongFileSystem { .. }
        ));
    }
}
