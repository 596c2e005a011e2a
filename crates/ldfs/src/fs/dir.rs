//! Directory index: a directory is a list whose block at index
//! `bucket(name)` holds every entry whose name hashes there
//! (docs/FORMAT.md, "Directory bucket"). Lookup, create and unlink read and
//! write one block whatever the directory's size; readdir walks the list in
//! index order, so its offsets (bucket and slot) stay valid while other
//! entries come and go — except that removing an entry from a bucket shared
//! by colliding names shifts the later ones in it (55-bit hashes make such
//! buckets rare).

use crate::ld::{CorruptReason, Corruption};

pub const NAME_MAX: usize = 255;
/// Entries one bucket may hold (names colliding on 55 bits of hash).
pub const BUCKET_MAX: usize = 64;
/// Bits of the bucket number: readdir cookies are `bucket << 8 | slot`, plus
/// 3 to keep 0, 1 and 2 for the start, `.` and `..`.
const BUCKET_BITS: u32 = 55;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub name: Vec<u8>,
    pub ino: u64,
    /// `inode::Kind` code, for readdir's d_type.
    pub kind: u8,
}

/// FNV-1a: stable across builds and platforms (unlike std's hasher).
pub fn bucket(name: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &c in name {
        h ^= c as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    // Fold the high bits in so the low 55 carry all of the hash.
    (h ^ (h >> BUCKET_BITS)) & ((1 << BUCKET_BITS) - 1)
}

/// The readdir offset of the entry after `(bucket, slot)`.
pub fn cookie(bucket: u64, slot: usize) -> i64 {
    ((bucket << 8) | slot as u64) as i64 + 3
}

/// Where to resume: entries at `(bucket, slot)` with slot `>= from_slot`.
pub fn resume(cookie: i64) -> (u64, usize) {
    let c = (cookie - 3) as u64;
    let (b, s) = (c >> 8, (c & 0xff) as usize);
    (b, s + 1)
}

/// Length of `encode(entries)`; 0 for no entries (the bucket is deleted).
pub fn encoded_len(entries: &[Entry]) -> usize {
    if entries.is_empty() {
        return 0;
    }
    2 + entries.iter().map(|e| 10 + e.name.len()).sum::<usize>()
}

pub fn encode(entries: &[Entry]) -> Vec<u8> {
    assert!(!entries.is_empty() && entries.len() <= BUCKET_MAX);
    let mut b = Vec::with_capacity(2 + entries.len() * 16);
    b.extend_from_slice(&(entries.len() as u16).to_le_bytes());
    for e in entries {
        assert!(!e.name.is_empty() && e.name.len() <= NAME_MAX);
        b.extend_from_slice(&e.ino.to_le_bytes());
        b.push(e.kind);
        b.push(e.name.len() as u8);
        b.extend_from_slice(&e.name);
    }
    debug_assert_eq!(b.len(), encoded_len(entries));
    b
}

pub fn decode(b: &[u8], dir: u64, index: u64) -> Result<Vec<Entry>, Corruption> {
    let bad = |why: String| Corruption {
        what: "directory bucket",
        offset: index,
        reason: CorruptReason::Inconsistent(format!("directory {dir} bucket {index}: {why}")),
    };
    if b.len() < 2 {
        return Err(bad("truncated".into()));
    }
    let n = u16::from_le_bytes([b[0], b[1]]) as usize;
    if n == 0 || n > BUCKET_MAX {
        return Err(bad(format!("{n} entries")));
    }
    let mut out = Vec::with_capacity(n);
    let mut pos = 2;
    for _ in 0..n {
        let head = b
            .get(pos..pos + 10)
            .ok_or_else(|| bad("truncated entry".into()))?;
        let ino = u64::from_le_bytes(head[..8].try_into().unwrap());
        let kind = head[8];
        let len = head[9] as usize;
        let name = b
            .get(pos + 10..pos + 10 + len)
            .ok_or_else(|| bad("truncated name".into()))?;
        if len == 0 || name.contains(&b'/') || name.contains(&0) || bucket(name) != index {
            return Err(bad(format!("bad name {:?}", String::from_utf8_lossy(name))));
        }
        if ino == 0 || super::inode::Kind::from_code(kind).is_none() {
            return Err(bad(format!("entry names inode {ino} kind {kind}")));
        }
        out.push(Entry {
            name: name.to_vec(),
            ino,
            kind,
        });
        pos += 10 + len;
    }
    if pos != b.len() {
        return Err(bad(format!("{} trailing bytes", b.len() - pos)));
    }
    Ok(out)
}

/// The entries that can still be read from a damaged bucket block (fsck's
/// directory-index repair): parses entries while they are whole, keeping
/// each one with a valid name, inode number and kind whatever bucket its
/// name hashes to; stops at the first that is not whole. Never panics.
pub fn salvage(b: &[u8]) -> Vec<Entry> {
    let mut out = Vec::new();
    if b.len() < 2 {
        return out;
    }
    let n = (u16::from_le_bytes([b[0], b[1]]) as usize).min(BUCKET_MAX);
    let mut pos = 2;
    for _ in 0..n {
        let Some(head) = b.get(pos..pos + 10) else {
            break;
        };
        let ino = u64::from_le_bytes(head[..8].try_into().unwrap());
        let (kind, len) = (head[8], head[9] as usize);
        let Some(name) = b.get(pos + 10..pos + 10 + len) else {
            break;
        };
        pos += 10 + len;
        let name_ok =
            len > 0 && !name.contains(&b'/') && !name.contains(&0) && name != b"." && name != b"..";
        if name_ok && ino != 0 && super::inode::Kind::from_code(kind).is_some() {
            out.push(Entry {
                name: name.to_vec(),
                ino,
                kind,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_and_cookies() {
        let name = b"hello.txt".to_vec();
        let idx = bucket(&name);
        let e = vec![Entry {
            name,
            ino: 9,
            kind: 0,
        }];
        assert_eq!(decode(&encode(&e), 1, idx).unwrap(), e);
        assert_eq!(encode(&e).len(), encoded_len(&e));
        assert_eq!(encoded_len(&[]), 0);
        assert!(decode(&encode(&e), 1, idx + 1).is_err());
        let c = cookie(idx, 0);
        assert!(c > 2);
        assert_eq!(resume(c), (idx, 1));
    }

    #[test]
    fn salvage_keeps_whole_entries_of_a_misplaced_or_truncated_bucket() {
        let e = vec![
            Entry {
                name: b"one".to_vec(),
                ino: 5,
                kind: 0,
            },
            Entry {
                name: b"two".to_vec(),
                ino: 6,
                kind: 1,
            },
        ];
        let b = encode(&e);
        // Both names hash elsewhere than bucket 7: decode refuses, salvage keeps.
        assert!(decode(&b, 1, 7).is_err());
        assert_eq!(salvage(&b), e);
        assert_eq!(salvage(&b[..b.len() - 1]), e[..1].to_vec());
        for k in 0..b.len() {
            let mut bad = b.clone();
            bad[k] ^= 0xa5;
            assert!(salvage(&bad).len() <= 2);
            let _ = salvage(&b[..k]);
        }
    }

    #[test]
    fn garbage_never_panics() {
        let good = encode(&[Entry {
            name: b"a".to_vec(),
            ino: 2,
            kind: 1,
        }]);
        for k in 0..good.len() {
            let mut b = good.clone();
            b[k] ^= 0xff;
            let _ = decode(&b, 1, bucket(b"a"));
            let _ = decode(&good[..k], 1, bucket(b"a"));
        }
    }
}
