//! The dual layout's on-disk records (docs/FORMAT.md, "Dual layout"):
//! the data device's label, the layout record kept in the metadata log,
//! the pointer record a data list's block holds in the log, and the group
//! descriptor. All little-endian and checksummed (the label itself; the
//! others are blocks of the metadata log, which checksums every block).

use crate::ld::{CorruptReason, Corruption, LdError, LdResult};

/// Bytes of a data block; the data device is cut into these.
pub const DATA_BLOCK_BYTES: u64 = 4096;
pub const LABEL_MAGIC: &[u8; 8] = b"LDFSDATA";
pub const INFO_MAGIC: &[u8; 8] = b"LDFSDUAL";
pub const VERSION: u32 = 1;
/// Longest metadata-device path the label records.
pub const MAX_META_PATH: usize = 1024;
/// Bytes of a pointer record.
pub const POINTER_BYTES: usize = 16;
/// Bytes of a group descriptor.
pub const DESC_BYTES: usize = 8;
/// Bytes of a directory's group tie.
pub const TIE_BYTES: usize = 4;

/// Where the data device's groups lie; identical in the label and in the
/// metadata log's layout record (mount compares them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DataGeometry {
    pub fs_id: u64,
    /// Blocks per group (a multiple of 64, so a group's bitmap is whole words).
    pub group_blocks: u32,
    pub groups: u32,
    /// Device block where group 0 begins (block 0 is the label).
    pub first_block: u64,
    /// Data blocks in all groups (the last group may be short).
    pub blocks: u64,
}

impl DataGeometry {
    /// Lays out a data device of `size_bytes`: the label in the first
    /// block, its copy in the last, groups of `group_blocks` between.
    pub fn plan(size_bytes: u64, group_blocks: u32, fs_id: u64) -> LdResult<DataGeometry> {
        if group_blocks == 0 || !group_blocks.is_multiple_of(64) || group_blocks > 8 * 64 * 1024 {
            return Err(LdError::InvalidArgument(format!(
                "group size {group_blocks} blocks: must be a multiple of 64, at most 524288"
            )));
        }
        let dev_blocks = size_bytes / DATA_BLOCK_BYTES;
        if dev_blocks < 2 + 64 {
            return Err(LdError::InvalidArgument(format!(
                "data device of {size_bytes} bytes is too small"
            )));
        }
        let blocks = dev_blocks - 2;
        let groups = blocks.div_ceil(group_blocks as u64);
        let groups = u32::try_from(groups)
            .map_err(|_| LdError::InvalidArgument("too many groups".into()))?;
        Ok(DataGeometry {
            fs_id,
            group_blocks,
            groups,
            first_block: 1,
            blocks,
        })
    }

    /// Blocks in group `g` (the last one may be short).
    pub fn group_len(&self, g: u32) -> u64 {
        let start = g as u64 * self.group_blocks as u64;
        (self.blocks - start).min(self.group_blocks as u64)
    }

    pub fn group_of(&self, block: u64) -> u32 {
        (block / self.group_blocks as u64) as u32
    }

    /// Byte offset on the data device of data block `block`.
    pub fn offset(&self, block: u64) -> u64 {
        (self.first_block + block) * DATA_BLOCK_BYTES
    }

    /// Byte offsets of the label and its copy.
    pub fn label_offsets(&self) -> [u64; 2] {
        [0, (self.first_block + self.blocks) * DATA_BLOCK_BYTES]
    }

    fn encode_into(&self, b: &mut Vec<u8>) {
        b.extend_from_slice(&self.fs_id.to_le_bytes());
        b.extend_from_slice(&self.group_blocks.to_le_bytes());
        b.extend_from_slice(&self.groups.to_le_bytes());
        b.extend_from_slice(&self.first_block.to_le_bytes());
        b.extend_from_slice(&self.blocks.to_le_bytes());
    }

    fn decode(b: &[u8], what: &'static str, offset: u64) -> LdResult<DataGeometry> {
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
        let geo = DataGeometry {
            fs_id: u64_at(0),
            group_blocks: u32_at(8),
            groups: u32_at(12),
            first_block: u64_at(16),
            blocks: u64_at(24),
        };
        let bad = |field, value, limit| {
            LdError::Corrupt(Corruption {
                what,
                offset,
                reason: CorruptReason::OutOfBounds {
                    field,
                    value,
                    limit,
                },
            })
        };
        if geo.group_blocks == 0
            || !geo.group_blocks.is_multiple_of(64)
            || geo.group_blocks > 8 * 65536
        {
            return Err(bad("group_blocks", geo.group_blocks as u64, 8 * 65536));
        }
        if geo.blocks.div_ceil(geo.group_blocks as u64) != geo.groups as u64 {
            return Err(bad(
                "groups",
                geo.groups as u64,
                geo.blocks.div_ceil(geo.group_blocks as u64),
            ));
        }
        if geo.first_block != 1 {
            return Err(bad("first_block", geo.first_block, 1));
        }
        Ok(geo)
    }
}

const GEO_BYTES: usize = 32;

fn corrupt(what: &'static str, offset: u64, reason: CorruptReason) -> LdError {
    LdError::Corrupt(Corruption {
        what,
        offset,
        reason,
    })
}

/// The data device's label: which file system it belongs to, its groups,
/// and where the metadata device was at mkfs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DataLabel {
    pub geo: DataGeometry,
    pub meta_path: String,
}

impl DataLabel {
    /// One data block: magic, version, geometry, path, crc32c at the end.
    pub fn encode(&self) -> LdResult<Vec<u8>> {
        let path = self.meta_path.as_bytes();
        if path.len() > MAX_META_PATH {
            return Err(LdError::InvalidArgument(format!(
                "metadata device path longer than {MAX_META_PATH} bytes"
            )));
        }
        let mut b = Vec::with_capacity(DATA_BLOCK_BYTES as usize);
        b.extend_from_slice(LABEL_MAGIC);
        b.extend_from_slice(&VERSION.to_le_bytes());
        b.extend_from_slice(&(path.len() as u32).to_le_bytes());
        self.geo.encode_into(&mut b);
        b.extend_from_slice(path);
        b.resize(DATA_BLOCK_BYTES as usize - 4, 0);
        let crc = crc32c::crc32c(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        Ok(b)
    }

    pub fn decode(b: &[u8], offset: u64) -> LdResult<DataLabel> {
        const WHAT: &str = "data device label";
        if b.len() != DATA_BLOCK_BYTES as usize {
            return Err(corrupt(
                WHAT,
                offset,
                CorruptReason::Inconsistent(format!("{} bytes", b.len())),
            ));
        }
        let magic = u64::from_le_bytes(b[..8].try_into().unwrap());
        if &b[..8] != LABEL_MAGIC {
            return Err(corrupt(
                WHAT,
                offset,
                CorruptReason::BadMagic { got: magic },
            ));
        }
        let (body, tail) = b.split_at(b.len() - 4);
        let expected = u32::from_le_bytes(tail.try_into().unwrap());
        let got = crc32c::crc32c(body);
        if expected != got {
            return Err(corrupt(
                WHAT,
                offset,
                CorruptReason::BadChecksum { expected, got },
            ));
        }
        let version = u32::from_le_bytes(b[8..12].try_into().unwrap());
        if version != VERSION {
            return Err(corrupt(
                WHAT,
                offset,
                CorruptReason::BadVersion { got: version },
            ));
        }
        let plen = u32::from_le_bytes(b[12..16].try_into().unwrap()) as usize;
        if plen > MAX_META_PATH {
            return Err(corrupt(
                WHAT,
                offset,
                CorruptReason::OutOfBounds {
                    field: "meta path length",
                    value: plen as u64,
                    limit: MAX_META_PATH as u64,
                },
            ));
        }
        let geo = DataGeometry::decode(&b[16..16 + GEO_BYTES], WHAT, offset)?;
        let p = &b[16 + GEO_BYTES..16 + GEO_BYTES + plen];
        let meta_path = String::from_utf8(p.to_vec()).map_err(|_| {
            corrupt(
                WHAT,
                offset,
                CorruptReason::Inconsistent("metadata path is not UTF-8".into()),
            )
        })?;
        Ok(DataLabel { geo, meta_path })
    }
}

/// The layout record (block 0 of the info list in the metadata log).
pub fn encode_info(geo: &DataGeometry) -> Vec<u8> {
    let mut b = INFO_MAGIC.to_vec();
    b.extend_from_slice(&VERSION.to_le_bytes());
    geo.encode_into(&mut b);
    b
}

pub fn decode_info(b: &[u8]) -> LdResult<DataGeometry> {
    const WHAT: &str = "dual layout record";
    if b.len() != 12 + GEO_BYTES || &b[..8] != INFO_MAGIC {
        return Err(corrupt(
            WHAT,
            0,
            CorruptReason::Inconsistent(format!("{} bytes, not a layout record", b.len())),
        ));
    }
    let version = u32::from_le_bytes(b[8..12].try_into().unwrap());
    if version != VERSION {
        return Err(corrupt(WHAT, 0, CorruptReason::BadVersion { got: version }));
    }
    DataGeometry::decode(&b[12..], WHAT, 0)
}

/// What a data list's block in the metadata log holds: where the data is,
/// how long, and its checksum (verified on every read).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pointer {
    pub block: u64,
    pub len: u32,
    pub crc: u32,
}

impl Pointer {
    pub fn encode(&self) -> [u8; POINTER_BYTES] {
        let mut b = [0u8; POINTER_BYTES];
        b[..8].copy_from_slice(&self.block.to_le_bytes());
        b[8..12].copy_from_slice(&self.len.to_le_bytes());
        b[12..].copy_from_slice(&self.crc.to_le_bytes());
        b
    }

    /// Decodes and bounds a pointer read from the log.
    pub fn decode(b: &[u8], blocks: u64) -> LdResult<Pointer> {
        const WHAT: &str = "data pointer";
        if b.len() != POINTER_BYTES {
            return Err(corrupt(
                WHAT,
                0,
                CorruptReason::Inconsistent(format!("{} bytes, expected {POINTER_BYTES}", b.len())),
            ));
        }
        let p = Pointer {
            block: u64::from_le_bytes(b[..8].try_into().unwrap()),
            len: u32::from_le_bytes(b[8..12].try_into().unwrap()),
            crc: u32::from_le_bytes(b[12..].try_into().unwrap()),
        };
        if p.block >= blocks {
            return Err(corrupt(
                WHAT,
                0,
                CorruptReason::OutOfBounds {
                    field: "block",
                    value: p.block,
                    limit: blocks,
                },
            ));
        }
        if p.len == 0 || p.len as u64 > DATA_BLOCK_BYTES {
            return Err(corrupt(
                WHAT,
                0,
                CorruptReason::OutOfBounds {
                    field: "len",
                    value: p.len as u64,
                    limit: DATA_BLOCK_BYTES,
                },
            ));
        }
        Ok(p)
    }
}

/// A group descriptor (the paper's DGDT entry): the group's free blocks
/// as its bitmap in the same ARU says, and the group number (a misplaced
/// block is caught).
pub fn encode_desc(group: u32, free: u32) -> [u8; DESC_BYTES] {
    let mut b = [0u8; DESC_BYTES];
    b[..4].copy_from_slice(&group.to_le_bytes());
    b[4..].copy_from_slice(&free.to_le_bytes());
    b
}

pub fn decode_desc(b: &[u8], group: u32) -> LdResult<u32> {
    const WHAT: &str = "group descriptor";
    if b.len() != DESC_BYTES {
        return Err(corrupt(
            WHAT,
            group as u64,
            CorruptReason::Inconsistent(format!("{} bytes", b.len())),
        ));
    }
    let got = u32::from_le_bytes(b[..4].try_into().unwrap());
    if got != group {
        return Err(corrupt(
            WHAT,
            group as u64,
            CorruptReason::WrongLocation {
                expected: group as u64,
                got: got as u64,
            },
        ));
    }
    Ok(u32::from_le_bytes(b[4..].try_into().unwrap()))
}

/// A list's group tie (block `list` of the layout list, `list` being the
/// engine's id): the data-block group a directory was tied to when it was
/// created (DualFS section 3.1), where the files made in it take their
/// blocks.
pub fn encode_tie(group: u32) -> [u8; TIE_BYTES] {
    group.to_le_bytes()
}

/// Decodes and bounds a tie read from the log (`groups`: the device's).
pub fn decode_tie(b: &[u8], groups: u32, list: u64) -> LdResult<u32> {
    const WHAT: &str = "group tie";
    if b.len() != TIE_BYTES {
        return Err(corrupt(
            WHAT,
            list,
            CorruptReason::Inconsistent(format!("{} bytes, expected {TIE_BYTES}", b.len())),
        ));
    }
    let g = u32::from_le_bytes(b.try_into().unwrap());
    if g >= groups {
        return Err(corrupt(
            WHAT,
            list,
            CorruptReason::OutOfBounds {
                field: "group",
                value: g as u64,
                limit: groups as u64,
            },
        ));
    }
    Ok(g)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_round_trips_and_rejects_damage() {
        let geo = DataGeometry::plan(64 << 20, 1024, 0xabc).unwrap();
        assert_eq!(geo.blocks, (64 << 20) / 4096 - 2);
        assert_eq!(geo.groups, 16);
        assert_eq!(geo.group_len(15), geo.blocks - 15 * 1024);
        let l = DataLabel {
            geo,
            meta_path: "/tmp/meta.img".into(),
        };
        let mut b = l.encode().unwrap();
        assert_eq!(DataLabel::decode(&b, 0).unwrap(), l);
        b[20] ^= 1;
        assert!(matches!(
            DataLabel::decode(&b, 0),
            Err(LdError::Corrupt(Corruption {
                reason: CorruptReason::BadChecksum { .. },
                ..
            }))
        ));
        assert_eq!(decode_info(&encode_info(&geo)).unwrap(), geo);
    }

    #[test]
    fn pointer_bounds_are_checked() {
        let p = Pointer {
            block: 7,
            len: 4096,
            crc: 9,
        };
        assert_eq!(Pointer::decode(&p.encode(), 8).unwrap(), p);
        assert!(Pointer::decode(&p.encode(), 7).is_err());
        let z = Pointer { len: 0, ..p };
        assert!(Pointer::decode(&z.encode(), 8).is_err());
        assert!(Pointer::decode(&[0; 3], 8).is_err());
        assert_eq!(decode_desc(&encode_desc(3, 100), 3).unwrap(), 100);
        assert!(decode_desc(&encode_desc(3, 100), 4).is_err());
        assert_eq!(decode_tie(&encode_tie(5), 6, 9).unwrap(), 5);
        assert!(decode_tie(&encode_tie(6), 6, 9).is_err());
        assert!(decode_tie(&[0; 3], 6, 9).is_err());
    }
}
