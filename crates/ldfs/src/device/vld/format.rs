//! The VLD's on-disk records, one 512-byte sector each (docs/FORMAT.md,
//! "VLD"). Little-endian; a crc32c over the sector with the crc field
//! zeroed. Space is allocated in physical blocks of `block_sectors`
//! sectors (8 by default: 4 KiB); a map sector is the first sector of a
//! block of its own.
//!
//! ```text
//! tail   (sector 0)   0 magic "VLDT" | 4 crc | 8 disk_id u64 | 16 root lba u64 | 24 root seq u64
//! label  (sector 1)   0 magic "VLDL" | 4 crc | 8 disk_id u64 | 16 logical blocks u64 |
//!                     24 block_sectors u32
//! map sector          0 magic "VLDM" | 4 crc | 8 disk_id u64 | 16 seq u64 | 24 index u32 |
//!                     28 nptr u16 | 30 pad | 32 ptrs: 16 × (lba u32, pad u32, seq u64) |
//!                     288 entries: 56 × u32 (physical block + 1; 0 = unmapped)
//! ```

use crate::ld::{CorruptReason, Corruption};

pub const SECTOR: usize = 512;
pub const MAX_PTRS: usize = 16;
pub const ENTRIES: usize = 56;
const PTRS_AT: usize = 32;
const ENTRIES_AT: usize = PTRS_AT + MAX_PTRS * 16;
const TAIL_MAGIC: u32 = u32::from_le_bytes(*b"VLDT");
const LABEL_MAGIC: u32 = u32::from_le_bytes(*b"VLDL");
const MAP_MAGIC: u32 = u32::from_le_bytes(*b"VLDM");

/// A pointer from one map sector version to an older one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ptr {
    pub lba: u64,
    pub seq: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MapSector {
    pub seq: u64,
    pub index: u32,
    pub ptrs: Vec<Ptr>,
    /// Physical block of each logical block of this map sector's range.
    pub entries: [Option<u32>; ENTRIES],
}

fn seal(b: &mut [u8; SECTOR]) {
    b[4..8].fill(0);
    let c = crc32c::crc32c(b);
    b[4..8].copy_from_slice(&c.to_le_bytes());
}

fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().unwrap())
}

fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().unwrap())
}

/// Checks magic, crc and disk id; the reason when they fail.
fn check(
    b: &[u8],
    magic: u32,
    disk_id: Option<u64>,
    what: &'static str,
    offset: u64,
) -> Result<(), Corruption> {
    let bad = |reason| Corruption {
        what,
        offset,
        reason,
    };
    let m = u32_at(b, 0);
    if m != magic {
        return Err(bad(CorruptReason::BadMagic { got: u64::from(m) }));
    }
    let mut c = [0u8; SECTOR];
    c.copy_from_slice(&b[..SECTOR]);
    c[4..8].fill(0);
    let (expected, got) = (u32_at(b, 4), crc32c::crc32c(&c));
    if expected != got {
        return Err(bad(CorruptReason::BadChecksum { expected, got }));
    }
    if let Some(id) = disk_id {
        if u64_at(b, 8) != id {
            return Err(bad(CorruptReason::WrongFileSystem {
                expected: id,
                got: u64_at(b, 8),
            }));
        }
    }
    Ok(())
}

pub fn encode_tail(disk_id: u64, root: Ptr) -> [u8; SECTOR] {
    let mut b = [0u8; SECTOR];
    b[0..4].copy_from_slice(&TAIL_MAGIC.to_le_bytes());
    b[8..16].copy_from_slice(&disk_id.to_le_bytes());
    b[16..24].copy_from_slice(&root.lba.to_le_bytes());
    b[24..32].copy_from_slice(&root.seq.to_le_bytes());
    seal(&mut b);
    b
}

pub fn decode_tail(b: &[u8], disk_id: u64) -> Result<Ptr, Corruption> {
    check(b, TAIL_MAGIC, Some(disk_id), "vld tail", 0)?;
    Ok(Ptr {
        lba: u64_at(b, 16),
        seq: u64_at(b, 24),
    })
}

/// What the label records: the disk id and the geometry the map is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Label {
    pub disk_id: u64,
    pub logical_blocks: u64,
    pub block_sectors: u32,
}

pub fn encode_label(l: Label) -> [u8; SECTOR] {
    let mut b = [0u8; SECTOR];
    b[0..4].copy_from_slice(&LABEL_MAGIC.to_le_bytes());
    b[8..16].copy_from_slice(&l.disk_id.to_le_bytes());
    b[16..24].copy_from_slice(&l.logical_blocks.to_le_bytes());
    b[24..28].copy_from_slice(&l.block_sectors.to_le_bytes());
    seal(&mut b);
    b
}

pub fn decode_label(b: &[u8]) -> Result<Label, Corruption> {
    check(b, LABEL_MAGIC, None, "vld label", SECTOR as u64)?;
    Ok(Label {
        disk_id: u64_at(b, 8),
        logical_blocks: u64_at(b, 16),
        block_sectors: u32_at(b, 24),
    })
}

impl MapSector {
    pub fn encode(&self, disk_id: u64) -> [u8; SECTOR] {
        assert!(self.ptrs.len() <= MAX_PTRS);
        let mut b = [0u8; SECTOR];
        b[0..4].copy_from_slice(&MAP_MAGIC.to_le_bytes());
        b[8..16].copy_from_slice(&disk_id.to_le_bytes());
        b[16..24].copy_from_slice(&self.seq.to_le_bytes());
        b[24..28].copy_from_slice(&self.index.to_le_bytes());
        b[28..30].copy_from_slice(&(self.ptrs.len() as u16).to_le_bytes());
        for (i, p) in self.ptrs.iter().enumerate() {
            let o = PTRS_AT + i * 16;
            assert!(p.lba <= u64::from(u32::MAX), "map pointer past u32");
            b[o..o + 4].copy_from_slice(&(p.lba as u32).to_le_bytes());
            b[o + 8..o + 16].copy_from_slice(&p.seq.to_le_bytes());
        }
        for (i, e) in self.entries.iter().enumerate() {
            let o = ENTRIES_AT + i * 4;
            b[o..o + 4].copy_from_slice(&e.map_or(0, |p| p + 1).to_le_bytes());
        }
        seal(&mut b);
        b
    }

    /// Decode a map sector found at `lba`; pointers are bounded by
    /// `sectors` (physical), entries by `blocks` (physical), the index by
    /// `map_sectors`.
    pub fn decode(
        b: &[u8],
        disk_id: u64,
        lba: u64,
        (sectors, blocks, map_sectors): (u64, u64, u32),
    ) -> Result<MapSector, Corruption> {
        let offset = lba * SECTOR as u64;
        check(b, MAP_MAGIC, Some(disk_id), "vld map sector", offset)?;
        let bound = |field, value: u64, limit: u64| {
            if value >= limit {
                Err(Corruption {
                    what: "vld map sector",
                    offset,
                    reason: CorruptReason::OutOfBounds {
                        field,
                        value,
                        limit,
                    },
                })
            } else {
                Ok(value)
            }
        };
        let index = bound("index", u64::from(u32_at(b, 24)), u64::from(map_sectors))? as u32;
        let nptr = bound(
            "nptr",
            u64::from(u16::from_le_bytes([b[28], b[29]])),
            MAX_PTRS as u64 + 1,
        )? as usize;
        let mut ptrs = Vec::with_capacity(nptr);
        for i in 0..nptr {
            let o = PTRS_AT + i * 16;
            let lba = bound("ptr lba", u64::from(u32_at(b, o)), sectors)?;
            ptrs.push(Ptr {
                lba,
                seq: u64_at(b, o + 8),
            });
        }
        let mut entries = [None; ENTRIES];
        for (i, e) in entries.iter_mut().enumerate() {
            let v = u32_at(b, ENTRIES_AT + i * 4);
            if v != 0 {
                *e = Some(bound("entry", u64::from(v - 1), blocks)? as u32);
            }
        }
        Ok(MapSector {
            seq: u64_at(b, 16),
            index,
            ptrs,
            entries,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_reject_every_flipped_byte() {
        let mut entries = [None; ENTRIES];
        entries[0] = Some(0);
        entries[55] = Some(999);
        let m = MapSector {
            seq: 42,
            index: 3,
            ptrs: vec![Ptr { lba: 17, seq: 41 }, Ptr { lba: 900, seq: 7 }],
            entries,
        };
        let b = m.encode(5);
        let bounds = (8000, 1000, 4);
        assert_eq!(MapSector::decode(&b, 5, 10, bounds).unwrap(), m);
        assert!(MapSector::decode(&b, 6, 10, bounds).is_err());
        assert!(MapSector::decode(&b, 5, 10, (900, 1000, 4)).is_err());
        assert!(MapSector::decode(&b, 5, 10, (8000, 999, 4)).is_err());
        assert!(MapSector::decode(&b, 5, 10, (8000, 1000, 3)).is_err());
        for i in 0..SECTOR {
            let mut c = b;
            c[i] ^= 0x20;
            assert!(MapSector::decode(&c, 5, 10, bounds).is_err(), "byte {i}");
        }
        let t = encode_tail(5, Ptr { lba: 3, seq: 9 });
        assert_eq!(decode_tail(&t, 5).unwrap(), Ptr { lba: 3, seq: 9 });
        assert!(decode_tail(&t, 4).is_err());
        let label = Label {
            disk_id: 5,
            logical_blocks: 1234,
            block_sectors: 8,
        };
        let l = encode_label(label);
        assert_eq!(decode_label(&l).unwrap(), label);
        for i in 0..SECTOR {
            let (mut c, mut d) = (t, l);
            c[i] ^= 1;
            d[i] ^= 1;
            assert!(
                decode_tail(&c, 5).is_err() && decode_label(&d).is_err(),
                "byte {i}"
            );
        }
    }
}
