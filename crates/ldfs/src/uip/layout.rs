//! uip's on-disk format (docs/FORMAT.md, "uip"): a superblock, a table of
//! list records, then groups, each a descriptor area followed by its data
//! units. All integers little-endian.
//!
//! ```text
//! superblock (512 B at 0)   magic u64 | version u32 | unit_bytes u32 | groups u32 |
//!                           units_per_group u32 | list_slots u32 | pad | crc u32 at 508
//! list table (at 4096)      list_slots × 32 B: id u64 (0 = empty) | kind u8 | temp u8 |
//!                           compress u8 | has_near u8 | near u64 | pad | crc u32 at 28
//! group g                   descriptors: units_per_group × 32 B, padded to 4096;
//!                           then units_per_group units of unit_bytes
//! descriptor (32 B)         list u64 (0 = free) | index u64 | seq u64 | len u32 | crc u32
//! ```
//!
//! A descriptor sits beside the unit where a block's extent starts; the
//! extent is `ceil(len / unit_bytes)` units. `seq` grows with every
//! descriptor write, so when a crash leaves two descriptors for one key (or
//! overlapping extents) the newer wins.

use crate::ld::{Compression, CorruptReason, Corruption, ListHints, ListId, ListKind, Temperature};

pub const MAGIC: u64 = u64::from_le_bytes(*b"LDFSUIP1");
pub const VERSION: u32 = 1;
pub const SUPER_BYTES: usize = 512;
pub const LIST_TABLE_OFFSET: u64 = 4096;
pub const LIST_RECORD_BYTES: usize = 32;
pub const DESC_BYTES: usize = 32;
pub const ALIGN: u64 = 4096;

fn crc(b: &[u8]) -> u32 {
    crc32c::crc32c(b)
}

fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().unwrap())
}

fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().unwrap())
}

/// The geometry a superblock records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    pub unit_bytes: u32,
    pub groups: u32,
    pub units_per_group: u32,
    pub list_slots: u32,
}

impl Geometry {
    /// The largest geometry fitting `size` bytes.
    pub fn for_size(size: u64, unit_bytes: u32, units_per_group: u32) -> Option<Geometry> {
        assert!(unit_bytes >= 512 && unit_bytes.is_power_of_two());
        // A list slot per four units: every file and directory is a list.
        let est_units = size / u64::from(unit_bytes);
        let list_slots = (est_units / 4).clamp(16, u64::from(u32::MAX)) as u32;
        let mut g = Geometry {
            unit_bytes,
            groups: 0,
            units_per_group,
            list_slots,
        };
        let room = size.checked_sub(g.first_group())?;
        g.groups = (room / g.group_bytes()) as u32;
        (g.groups > 0).then_some(g)
    }

    pub fn first_group(&self) -> u64 {
        let end = LIST_TABLE_OFFSET + u64::from(self.list_slots) * LIST_RECORD_BYTES as u64;
        end.div_ceil(ALIGN) * ALIGN
    }

    pub fn desc_area_bytes(&self) -> u64 {
        (u64::from(self.units_per_group) * DESC_BYTES as u64).div_ceil(ALIGN) * ALIGN
    }

    pub fn group_bytes(&self) -> u64 {
        self.desc_area_bytes() + u64::from(self.units_per_group) * u64::from(self.unit_bytes)
    }

    pub fn units(&self) -> u32 {
        self.groups * self.units_per_group
    }

    /// Byte offset of unit `u`'s data.
    pub fn unit_offset(&self, u: u32) -> u64 {
        let (g, i) = (u / self.units_per_group, u % self.units_per_group);
        self.first_group()
            + u64::from(g) * self.group_bytes()
            + self.desc_area_bytes()
            + u64::from(i) * u64::from(self.unit_bytes)
    }

    /// Byte offset of unit `u`'s descriptor.
    pub fn desc_offset(&self, u: u32) -> u64 {
        let (g, i) = (u / self.units_per_group, u % self.units_per_group);
        self.first_group() + u64::from(g) * self.group_bytes() + u64::from(i) * DESC_BYTES as u64
    }

    pub fn list_offset(&self, slot: u32) -> u64 {
        LIST_TABLE_OFFSET + u64::from(slot) * LIST_RECORD_BYTES as u64
    }

    pub fn encode(&self) -> [u8; SUPER_BYTES] {
        let mut b = [0u8; SUPER_BYTES];
        b[0..8].copy_from_slice(&MAGIC.to_le_bytes());
        b[8..12].copy_from_slice(&VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&self.unit_bytes.to_le_bytes());
        b[16..20].copy_from_slice(&self.groups.to_le_bytes());
        b[20..24].copy_from_slice(&self.units_per_group.to_le_bytes());
        b[24..28].copy_from_slice(&self.list_slots.to_le_bytes());
        let c = crc(&b[..508]);
        b[508..].copy_from_slice(&c.to_le_bytes());
        b
    }

    /// Decode and bound-check a superblock against a device of `size` bytes.
    pub fn decode(b: &[u8], size: u64) -> Result<Geometry, Corruption> {
        let bad = |reason| Corruption {
            what: "uip superblock",
            offset: 0,
            reason,
        };
        let magic = u64_at(b, 0);
        if magic != MAGIC {
            return Err(bad(CorruptReason::BadMagic { got: magic }));
        }
        let (expected, got) = (u32_at(b, 508), crc(&b[..508]));
        if expected != got {
            return Err(bad(CorruptReason::BadChecksum { expected, got }));
        }
        let version = u32_at(b, 8);
        if version != VERSION {
            return Err(bad(CorruptReason::BadVersion { got: version }));
        }
        let g = Geometry {
            unit_bytes: u32_at(b, 12),
            groups: u32_at(b, 16),
            units_per_group: u32_at(b, 20),
            list_slots: u32_at(b, 24),
        };
        if !(512..=1 << 20).contains(&g.unit_bytes) || !g.unit_bytes.is_power_of_two() {
            return Err(bad(CorruptReason::OutOfBounds {
                field: "unit_bytes",
                value: u64::from(g.unit_bytes),
                limit: 1 << 20,
            }));
        }
        if g.units_per_group == 0 || g.list_slots == 0 {
            return Err(bad(CorruptReason::Inconsistent("empty geometry".into())));
        }
        let end = g.first_group() + u64::from(g.groups) * g.group_bytes();
        if end > size {
            return Err(bad(CorruptReason::OutOfBounds {
                field: "groups",
                value: end,
                limit: size,
            }));
        }
        Ok(g)
    }
}

/// A block's descriptor.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Desc {
    /// 0: the unit starts no block.
    pub list: u64,
    pub index: u64,
    pub seq: u64,
    pub len: u32,
}

impl Desc {
    pub fn encode(&self) -> [u8; DESC_BYTES] {
        let mut b = [0u8; DESC_BYTES];
        if self.list == 0 {
            return b; // a free unit: all zeros
        }
        b[0..8].copy_from_slice(&self.list.to_le_bytes());
        b[8..16].copy_from_slice(&self.index.to_le_bytes());
        b[16..24].copy_from_slice(&self.seq.to_le_bytes());
        b[24..28].copy_from_slice(&self.len.to_le_bytes());
        let c = crc(&b[..28]);
        b[28..].copy_from_slice(&c.to_le_bytes());
        b
    }

    /// `None` for a free unit; an error for a descriptor that fails its crc.
    pub fn decode(b: &[u8], offset: u64) -> Result<Option<Desc>, Corruption> {
        if b.iter().all(|&x| x == 0) {
            return Ok(None);
        }
        let (expected, got) = (u32_at(b, 28), crc(&b[..28]));
        if expected != got {
            return Err(Corruption {
                what: "uip descriptor",
                offset,
                reason: CorruptReason::BadChecksum { expected, got },
            });
        }
        Ok(Some(Desc {
            list: u64_at(b, 0),
            index: u64_at(b, 8),
            seq: u64_at(b, 16),
            len: u32_at(b, 24),
        }))
    }
}

pub fn encode_list(id: ListId, h: &ListHints) -> [u8; LIST_RECORD_BYTES] {
    let mut b = [0u8; LIST_RECORD_BYTES];
    b[0..8].copy_from_slice(&id.0.to_le_bytes());
    b[8] = match h.kind {
        ListKind::Data => 0,
        ListKind::Metadata => 1,
    };
    b[9] = match h.temperature {
        Temperature::Warm => 0,
        Temperature::Hot => 1,
        Temperature::Cold => 2,
    };
    // 0 off, 1 lz4 (the old `true`), 2 zstd with its level in byte 20.
    (b[10], b[20]) = match h.compress {
        Compression::Off => (0, 0),
        Compression::Lz4 => (1, 0),
        Compression::Zstd { level } => (2, level),
    };
    b[11] = u8::from(h.near.is_some());
    b[12..20].copy_from_slice(&h.near.map_or(0, |l| l.0).to_le_bytes());
    let c = crc(&b[..28]);
    b[28..].copy_from_slice(&c.to_le_bytes());
    b
}

pub fn decode_list(b: &[u8], offset: u64) -> Result<Option<(ListId, ListHints)>, Corruption> {
    if b.iter().all(|&x| x == 0) {
        return Ok(None);
    }
    let bad = |reason| Corruption {
        what: "uip list record",
        offset,
        reason,
    };
    let (expected, got) = (u32_at(b, 28), crc(&b[..28]));
    if expected != got {
        return Err(bad(CorruptReason::BadChecksum { expected, got }));
    }
    let kind = match b[8] {
        0 => ListKind::Data,
        1 => ListKind::Metadata,
        v => return Err(bad(CorruptReason::Inconsistent(format!("list kind {v}")))),
    };
    let temperature = match b[9] {
        0 => Temperature::Warm,
        1 => Temperature::Hot,
        2 => Temperature::Cold,
        v => return Err(bad(CorruptReason::Inconsistent(format!("temperature {v}")))),
    };
    let compress = match (b[10], b[20]) {
        (0, 0) => Compression::Off,
        (1, 0) => Compression::Lz4,
        (2, l) if (Compression::ZSTD_LEVEL_MIN..=Compression::ZSTD_LEVEL_MAX).contains(&l) => {
            Compression::Zstd { level: l }
        }
        (c, l) => {
            return Err(bad(CorruptReason::Inconsistent(format!(
                "compression {c} level {l}"
            ))))
        }
    };
    let near = (b[11] != 0).then(|| ListId(u64_at(b, 12)));
    Ok(Some((
        ListId(u64_at(b, 0)),
        ListHints {
            kind,
            temperature,
            compress,
            near,
        },
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn superblock_round_trips_and_rejects_every_flipped_byte() {
        let g = Geometry::for_size(64 << 20, 1024, 1024).unwrap();
        let b = g.encode();
        assert_eq!(Geometry::decode(&b, 64 << 20).unwrap(), g);
        for i in 0..SUPER_BYTES {
            let mut c = b;
            c[i] ^= 0x10;
            assert!(Geometry::decode(&c, 64 << 20).is_err(), "byte {i}");
        }
        assert!(Geometry::decode(&b, 1 << 20).is_err());
        // Regions do not overlap and fit.
        let last = g.unit_offset(g.units() - 1) + u64::from(g.unit_bytes);
        assert!(last <= 64 << 20);
        assert!(g.desc_offset(g.units_per_group) > g.unit_offset(g.units_per_group - 1));
    }

    #[test]
    fn descriptors_and_list_records_round_trip_and_reject_flips() {
        let d = Desc {
            list: 7,
            index: u64::MAX - 3,
            seq: 99,
            len: 4096,
        };
        let b = d.encode();
        assert_eq!(Desc::decode(&b, 0).unwrap(), Some(d));
        assert_eq!(Desc::decode(&[0u8; 32], 0).unwrap(), None);
        for i in 0..DESC_BYTES {
            let mut c = b;
            c[i] ^= 1;
            assert!(Desc::decode(&c, 0).is_err(), "byte {i}");
        }
        let h = ListHints {
            kind: ListKind::Metadata,
            temperature: Temperature::Cold,
            compress: Compression::Zstd { level: 7 },
            near: Some(ListId(3)),
        };
        let b = encode_list(ListId(5), &h);
        assert_eq!(decode_list(&b, 0).unwrap(), Some((ListId(5), h)));
        for i in 0..LIST_RECORD_BYTES {
            let mut c = b;
            c[i] ^= 4;
            assert!(decode_list(&c, 0).is_err(), "byte {i}");
        }
    }
}
