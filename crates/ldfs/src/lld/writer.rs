//! The open partial segment: operations accepted but not yet written.
//!
//! Operations are kept in log order. A block written again while its earlier
//! version is still here replaces it in place of being logged twice, but only
//! when that cannot change what recovery may see: the new write is outside any
//! ARU, or in the same ARU as the old one (see `docs/DESIGN.md`, invariant 4).
//!
//! Sealing lays the data area out as LFS does for file data (Sprite LFS 3.2,
//! LD 3.5): blocks whose length is a page multiple first, sorted by key so a
//! list's blocks come back contiguous, then the small blocks packed byte by
//! byte. The summary keeps the records in log order.

use super::summary::{self, Record, SummaryHeader, HEADER_BYTES, MAX_RECORDS, MAX_SUMMARY_PAGES};
use super::types::{Key, PAGE_BYTES};

/// Largest summary record area.
pub const MAX_RECORD_BYTES: usize = MAX_SUMMARY_PAGES as usize * PAGE_BYTES - HEADER_BYTES;
/// Encoded size of a write record.
pub const WRITE_RECORD_BYTES: usize = 38;

/// A buffered block write.
pub struct PendingWrite {
    pub aru: u64,
    pub key: Key,
    /// Stored bytes (compressed if `flags` says so).
    pub data: Vec<u8>,
    pub crc: u32,
    pub flags: u8,
    /// Sequence number of the partial segment the data was first written
    /// in, for a block the cleaner moves (its age survives the move); 0 for
    /// data written now.
    pub age: u64,
}

enum Op {
    Write(PendingWrite),
    /// A write replaced before it was written.
    Dropped,
    Other(Record),
}

/// A write's place in a sealed partial segment.
pub struct Placed {
    pub slot: usize,
    pub key: Key,
    /// Byte offset within the data area.
    pub data_off: u32,
    pub len: u32,
    pub crc: u32,
    pub flags: u8,
    /// As `PendingWrite::age`.
    pub age: u64,
}

/// A sealed partial segment, ready to be written at one address.
pub struct Sealed {
    /// Summary pages followed by data pages.
    pub bytes: Vec<u8>,
    pub summary_pages: u32,
    pub placed: Vec<Placed>,
}

#[derive(Default)]
pub struct Pending {
    ops: Vec<Op>,
    records: usize,
    record_bytes: usize,
    data_bytes: usize,
    /// Holds something written now (not only blocks the cleaner moved):
    /// the segment's age becomes the partial's sequence number.
    fresh: bool,
}

/// Pages a partial segment with these totals occupies.
pub fn pages_for(record_bytes: usize, data_bytes: usize) -> u32 {
    summary::summary_pages_for(record_bytes) + data_bytes.div_ceil(PAGE_BYTES) as u32
}

impl Pending {
    pub fn is_empty(&self) -> bool {
        self.records == 0
    }
    pub fn data_bytes(&self) -> usize {
        self.data_bytes
    }
    /// Pages the partial would occupy if sealed now (0 if empty).
    pub fn pages(&self) -> u32 {
        if self.is_empty() {
            0
        } else {
            pages_for(self.record_bytes, self.data_bytes)
        }
    }
    /// Pages it would occupy with one more operation.
    pub fn pages_with(&self, record_bytes: usize, data_bytes: usize) -> u32 {
        pages_for(
            self.record_bytes + record_bytes,
            self.data_bytes + data_bytes,
        )
    }
    /// Whether one more operation keeps the summary within its limits.
    pub fn summary_has_room(&self, record_bytes: usize) -> bool {
        self.record_bytes + record_bytes <= MAX_RECORD_BYTES && self.records < MAX_RECORDS as usize
    }

    /// Whether anything but moved blocks was added since the last clear.
    pub fn is_fresh(&self) -> bool {
        self.fresh
    }

    pub fn add_write(&mut self, w: PendingWrite) -> usize {
        self.fresh |= w.age == 0;
        self.records += 1;
        self.record_bytes += WRITE_RECORD_BYTES;
        self.data_bytes += w.data.len();
        self.ops.push(Op::Write(w));
        self.ops.len() - 1
    }

    pub fn add_record(&mut self, r: Record) {
        assert!(!matches!(r, Record::Write { .. } | Record::MapPage { .. }));
        self.fresh = true;
        self.records += 1;
        self.record_bytes += r.encoded_len();
        self.ops.push(Op::Other(r));
    }

    /// The buffered write in `slot`, if it has not been dropped.
    pub fn write_at(&self, slot: usize) -> Option<&PendingWrite> {
        match self.ops.get(slot) {
            Some(Op::Write(w)) => Some(w),
            _ => None,
        }
    }

    /// Empties the partial after it was written.
    pub fn clear(&mut self) {
        *self = Pending::default();
    }

    /// Forgets the write in `slot`: a later operation replaced it.
    pub fn drop_write(&mut self, slot: usize) {
        let op = std::mem::replace(&mut self.ops[slot], Op::Dropped);
        let Op::Write(w) = op else {
            panic!("slot {slot} holds no buffered write");
        };
        self.records -= 1;
        self.record_bytes -= WRITE_RECORD_BYTES;
        self.data_bytes -= w.data.len();
    }

    /// Forgets every write of `aru` still here (an aborted ARU: its writes
    /// never commit, so they need not reach the log). Returns how many.
    pub fn drop_aru_writes(&mut self, aru: u64) -> usize {
        let slots: Vec<usize> = self
            .ops
            .iter()
            .enumerate()
            .filter(|(_, op)| matches!(op, Op::Write(w) if w.aru == aru))
            .map(|(i, _)| i)
            .collect();
        for &slot in &slots {
            self.drop_write(slot);
        }
        slots.len()
    }

    /// Lays the partial out. `header` supplies everything but the page
    /// counts, which are filled in here. The operations stay (readable) until
    /// `clear`, which the engine calls once the device write succeeded.
    pub fn seal(&self, mut header: SummaryHeader) -> Sealed {
        assert!(!self.is_empty());
        let ops = &self.ops;
        let data_pages = self.data_bytes.div_ceil(PAGE_BYTES) as u32;
        header.summary_pages = summary::summary_pages_for(self.record_bytes);
        header.data_pages = data_pages;
        let summary_bytes = header.summary_pages as usize * PAGE_BYTES;
        let mut bytes = vec![0u8; summary_bytes + data_pages as usize * PAGE_BYTES];

        // Page-multiple blocks first, in key order, then the rest packed.
        let mut big: Vec<usize> = Vec::new();
        let mut small: Vec<usize> = Vec::new();
        for (i, op) in ops.iter().enumerate() {
            if let Op::Write(w) = op {
                if w.data.len().is_multiple_of(PAGE_BYTES) {
                    big.push(i);
                } else {
                    small.push(i);
                }
            }
        }
        big.sort_by_key(|&i| match &ops[i] {
            Op::Write(w) => w.key,
            _ => unreachable!(),
        });
        let mut offsets = vec![0u32; ops.len()];
        let mut off = 0usize;
        for &i in big.iter().chain(small.iter()) {
            let Op::Write(w) = &ops[i] else {
                unreachable!()
            };
            offsets[i] = off as u32;
            bytes[summary_bytes + off..summary_bytes + off + w.data.len()].copy_from_slice(&w.data);
            off += w.data.len();
        }
        assert_eq!(off, self.data_bytes);

        let mut records = Vec::with_capacity(self.records);
        let mut placed = Vec::with_capacity(big.len() + small.len());
        for (i, op) in ops.iter().enumerate() {
            match op {
                Op::Write(w) => {
                    records.push(Record::Write {
                        aru: w.aru,
                        key: w.key,
                        data_off: offsets[i],
                        len: w.data.len() as u32,
                        crc: w.crc,
                        flags: w.flags,
                    });
                    placed.push(Placed {
                        slot: i,
                        key: w.key,
                        data_off: offsets[i],
                        len: w.data.len() as u32,
                        crc: w.crc,
                        flags: w.flags,
                        age: w.age,
                    });
                }
                Op::Dropped => {}
                Op::Other(r) => records.push(r.clone()),
            }
        }
        assert_eq!(records.len(), self.records);
        let summary = summary::encode(&header, &records);
        bytes[..summary_bytes].copy_from_slice(&summary);
        Sealed {
            bytes,
            summary_pages: header.summary_pages,
            placed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lld::summary::{decode_header, decode_records, Expect};

    fn header() -> SummaryHeader {
        SummaryHeader {
            fs_id: 5,
            epoch: 1,
            seq: 9,
            segment: 2,
            page: 0,
            next_segment: 3,
            summary_pages: 0,
            data_pages: 0,
        }
    }

    #[test]
    fn seal_places_page_blocks_first_in_key_order_and_keeps_record_order() {
        let mut p = Pending::default();
        let w = |index: u64, len: usize, fill: u8| PendingWrite {
            aru: 0,
            key: Key { list: 1, index },
            data: vec![fill; len],
            crc: crc32c::crc32c(&vec![fill; len]),
            flags: 0,
            age: 0,
        };
        p.add_write(w(3, 100, 1));
        let s_big = p.add_write(w(9, 4096, 2));
        p.add_write(w(4, 8192, 3));
        let dropped = p.add_write(w(5, 10, 4));
        p.drop_write(dropped);
        p.add_record(Record::Delete {
            aru: 0,
            key: Key { list: 1, index: 7 },
        });
        assert_eq!(p.data_bytes(), 100 + 4096 + 8192);
        let pages = p.pages();
        let sealed = p.seal(header());
        p.clear();
        assert!(p.is_empty());
        assert_eq!(sealed.bytes.len(), pages as usize * PAGE_BYTES);
        let by_index: std::collections::HashMap<u64, &Placed> =
            sealed.placed.iter().map(|pl| (pl.key.index, pl)).collect();
        assert_eq!(by_index[&4].data_off, 0);
        assert_eq!(by_index[&9].data_off, 8192);
        assert_eq!(by_index[&9].slot, s_big);
        assert_eq!(by_index[&3].data_off, 8192 + 4096);
        assert!(!by_index.contains_key(&5));
        let ex = Expect {
            fs_id: 5,
            segment: 2,
            page: 0,
            pages_left: 100,
            segment_count: 10,
            max_block_bytes: 65536,
        };
        let h = decode_header(&sealed.bytes, 0, &ex).unwrap();
        let recs = decode_records(&sealed.bytes, 0, h.summary_pages, h.data_pages).unwrap();
        let kinds: Vec<u64> = recs
            .iter()
            .map(|r| match r {
                Record::Write { key, .. } | Record::Delete { key, .. } => key.index,
                _ => 0,
            })
            .collect();
        assert_eq!(kinds, vec![3, 9, 4, 7]);
        let data0 = sealed.summary_pages as usize * PAGE_BYTES;
        assert_eq!(sealed.bytes[data0 + 8192 + 4096], 1);
        assert_eq!(sealed.bytes[data0], 3);
    }
}
