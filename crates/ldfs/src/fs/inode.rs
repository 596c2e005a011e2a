//! Inode records: one block per inode in the inode list, at index = inode
//! number (docs/FORMAT.md, "Inode record"). Small files and symlink targets
//! live inline in the record; extended attributes too, but for values over
//! 4 KiB, which live in a list of their own (named by the record). Decoding
//! bounds every length before use and never panics.

use crate::ld::{CorruptReason, Corruption};

pub const INODE_MAGIC: u16 = 0x4e49; // "IN"
pub const INODE_VERSION: u8 = 1;
/// Files up to this size keep their data in the inode record.
pub const INLINE_MAX: usize = 2048;
/// Bytes of extended attribute names and inline values per inode (a value
/// kept in a list of its own counts its list's 8 bytes).
pub const XATTR_MAX: usize = 32 * 1024;
/// Largest value kept in the record; a longer one gets a list of its own.
pub const XATTR_INLINE_VALUE_MAX: usize = 4096;
/// Largest value of an extended attribute (Linux's XATTR_SIZE_MAX).
pub const XATTR_VALUE_MAX: usize = 64 * 1024;
/// Bytes per block of a value kept in a list of its own (fits in any LD
/// the fs mounts: those take at least `RECORD_MAX`).
pub const XATTR_CHUNK: usize = 32 * 1024;
/// The value length's top bit in the record: the value lives in a list.
const XATTR_IN_LIST: u32 = 1 << 31;
pub const XATTR_NAME_MAX: usize = 255;
/// Extended attributes per inode.
pub const XATTR_COUNT_MAX: usize = 1024;
/// Largest encoded record: header, a symlink target of 4095 bytes or inline
/// data, and the attributes with 5 bytes of lengths each.
pub const RECORD_MAX: usize = HEADER_BYTES + 4096 + XATTR_MAX + XATTR_COUNT_MAX * 5;
const HEADER_BYTES: usize = 112;

/// What an inode is (the `S_IFMT` part of the mode).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
    Symlink,
    Fifo,
    Socket,
    CharDev,
    BlockDev,
}

impl Kind {
    pub fn from_mode(mode: u32) -> Option<Kind> {
        Some(match mode & 0o170000 {
            0o100000 => Kind::File,
            0o040000 => Kind::Dir,
            0o120000 => Kind::Symlink,
            0o010000 => Kind::Fifo,
            0o140000 => Kind::Socket,
            0o020000 => Kind::CharDev,
            0o060000 => Kind::BlockDev,
            _ => return None,
        })
    }
    pub fn mode_bits(self) -> u32 {
        match self {
            Kind::File => 0o100000,
            Kind::Dir => 0o040000,
            Kind::Symlink => 0o120000,
            Kind::Fifo => 0o010000,
            Kind::Socket => 0o140000,
            Kind::CharDev => 0o020000,
            Kind::BlockDev => 0o060000,
        }
    }
    pub fn code(self) -> u8 {
        self as u8
    }
    pub fn from_code(c: u8) -> Option<Kind> {
        Some(match c {
            0 => Kind::File,
            1 => Kind::Dir,
            2 => Kind::Symlink,
            3 => Kind::Fifo,
            4 => Kind::Socket,
            5 => Kind::CharDev,
            6 => Kind::BlockDev,
            _ => return None,
        })
    }
}

/// Seconds and nanoseconds since the epoch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Time {
    pub secs: i64,
    pub nsecs: u32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inode {
    pub ino: u64,
    pub generation: u64,
    /// Full mode: type bits and permission bits.
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    /// Bytes for files and symlinks; entries for directories.
    pub size: u64,
    /// The list holding the file's blocks or the directory's buckets (0: none).
    pub list: u64,
    pub rdev: u64,
    /// A directory's parent (for `..`).
    pub parent: u64,
    pub atime: Time,
    pub mtime: Time,
    pub ctime: Time,
    /// Data of a small file, or a symlink's target.
    pub inline: Vec<u8>,
    /// Extended attributes, sorted by name.
    pub xattrs: Vec<(Vec<u8>, XattrValue)>,
}

/// Where an extended attribute's value is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum XattrValue {
    /// In the inode record.
    Inline(Vec<u8>),
    /// In list `list`, `XATTR_CHUNK` bytes per block from index 0; `len`
    /// bytes in all (more than `XATTR_INLINE_VALUE_MAX`).
    List { list: u64, len: u32 },
}

impl XattrValue {
    pub fn len(&self) -> usize {
        match self {
            XattrValue::Inline(v) => v.len(),
            XattrValue::List { len, .. } => *len as usize,
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Bytes it takes in the record (after the name).
    pub fn record_bytes(&self) -> usize {
        match self {
            XattrValue::Inline(v) => v.len(),
            XattrValue::List { .. } => 8,
        }
    }
    /// The list holding it, if it has one.
    pub fn list(&self) -> Option<u64> {
        match self {
            XattrValue::Inline(_) => None,
            XattrValue::List { list, .. } => Some(*list),
        }
    }
}

impl Inode {
    pub fn kind(&self) -> Kind {
        Kind::from_mode(self.mode).expect("inode mode checked at decode and create")
    }

    /// Bytes of names and values in the record (what `XATTR_MAX` bounds).
    pub fn xattr_bytes(&self) -> usize {
        self.xattrs
            .iter()
            .map(|(n, v)| n.len() + v.record_bytes())
            .sum()
    }

    /// Length of `encode()`'s record, without encoding it (what a write of
    /// the record reserves).
    pub fn encoded_len(&self) -> usize {
        HEADER_BYTES
            + self.inline.len()
            + self
                .xattrs
                .iter()
                .map(|(n, v)| 5 + n.len() + v.record_bytes())
                .sum::<usize>()
    }

    pub fn encode(&self) -> Vec<u8> {
        assert!(self.inline.len() <= INLINE_MAX.max(4096) && self.xattr_bytes() <= XATTR_MAX);
        let mut b = Vec::with_capacity(HEADER_BYTES + self.inline.len() + self.xattr_bytes());
        b.extend_from_slice(&INODE_MAGIC.to_le_bytes());
        b.push(INODE_VERSION);
        b.push(self.kind().code());
        b.extend_from_slice(&self.mode.to_le_bytes());
        b.extend_from_slice(&self.uid.to_le_bytes());
        b.extend_from_slice(&self.gid.to_le_bytes());
        b.extend_from_slice(&self.nlink.to_le_bytes());
        for v in [
            self.ino,
            self.generation,
            self.size,
            self.list,
            self.rdev,
            self.parent,
        ] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        for t in [self.atime, self.mtime, self.ctime] {
            b.extend_from_slice(&t.secs.to_le_bytes());
            b.extend_from_slice(&t.nsecs.to_le_bytes());
        }
        b.extend_from_slice(&(self.inline.len() as u32).to_le_bytes());
        b.extend_from_slice(&(self.xattrs.len() as u32).to_le_bytes());
        debug_assert_eq!(b.len(), HEADER_BYTES);
        b.extend_from_slice(&self.inline);
        for (n, v) in &self.xattrs {
            b.push(n.len() as u8);
            match v {
                XattrValue::Inline(v) => {
                    b.extend_from_slice(&(v.len() as u32).to_le_bytes());
                    b.extend_from_slice(n);
                    b.extend_from_slice(v);
                }
                XattrValue::List { list, len } => {
                    b.extend_from_slice(&(len | XATTR_IN_LIST).to_le_bytes());
                    b.extend_from_slice(n);
                    b.extend_from_slice(&list.to_le_bytes());
                }
            }
        }
        debug_assert_eq!(b.len(), self.encoded_len());
        b
    }

    /// Decodes the record of inode `ino` read at byte `offset` (for errors).
    pub fn decode(ino: u64, b: &[u8], offset: u64) -> Result<Inode, Corruption> {
        let bad = |why: String| Corruption {
            what: "inode record",
            offset,
            reason: CorruptReason::Inconsistent(format!("inode {ino}: {why}")),
        };
        let mut r = Cursor { b, pos: 0 };
        let magic = r.u16().ok_or_else(|| bad("truncated header".into()))?;
        if magic != INODE_MAGIC {
            return Err(Corruption {
                what: "inode record",
                offset,
                reason: CorruptReason::BadMagic { got: magic as u64 },
            });
        }
        let version = r.u8().ok_or_else(|| bad("truncated".into()))?;
        if version != INODE_VERSION {
            return Err(Corruption {
                what: "inode record",
                offset,
                reason: CorruptReason::BadVersion {
                    got: version as u32,
                },
            });
        }
        let short = || bad("truncated header".to_string());
        let code = r.u8().ok_or_else(short)?;
        let mode = r.u32().ok_or_else(short)?;
        let kind = Kind::from_mode(mode).ok_or_else(|| bad(format!("mode {mode:o}")))?;
        if Kind::from_code(code) != Some(kind) {
            return Err(bad(format!("kind {code} disagrees with mode {mode:o}")));
        }
        let uid = r.u32().ok_or_else(short)?;
        let gid = r.u32().ok_or_else(short)?;
        let nlink = r.u32().ok_or_else(short)?;
        let mut v = [0u64; 6];
        for x in &mut v {
            *x = r.u64().ok_or_else(short)?;
        }
        let [rino, generation, size, list, rdev, parent] = v;
        if rino != ino {
            return Err(bad(format!("record names inode {rino}")));
        }
        let mut times = [Time::default(); 3];
        for t in &mut times {
            let secs = r.u64().ok_or_else(short)? as i64;
            let nsecs = r.u32().ok_or_else(short)?;
            if nsecs >= 1_000_000_000 {
                return Err(bad(format!("nanoseconds {nsecs}")));
            }
            *t = Time { secs, nsecs };
        }
        let inline_len = r.u32().ok_or_else(short)? as usize;
        let xattr_count = r.u32().ok_or_else(short)? as usize;
        if inline_len > 4096 {
            return Err(bad(format!("inline length {inline_len}")));
        }
        if kind == Kind::File && list == 0 && inline_len as u64 != size {
            return Err(bad(format!("inline length {inline_len}, size {size}")));
        }
        let inline = r.take(inline_len).ok_or_else(short)?.to_vec();
        if xattr_count > XATTR_COUNT_MAX {
            return Err(bad(format!("{xattr_count} xattrs")));
        }
        let mut xattrs = Vec::with_capacity(xattr_count);
        let mut total = 0;
        for _ in 0..xattr_count {
            let nl = r.u8().ok_or_else(short)? as usize;
            let vl = r.u32().ok_or_else(short)?;
            let in_list = vl & XATTR_IN_LIST != 0;
            let len = (vl & !XATTR_IN_LIST) as usize;
            total += nl + if in_list { 8 } else { len };
            if nl == 0
                || total > XATTR_MAX
                || (in_list && !(XATTR_INLINE_VALUE_MAX < len && len <= XATTR_VALUE_MAX))
            {
                return Err(bad(format!("xattr of {nl}+{len} bytes")));
            }
            let n = r.take(nl).ok_or_else(short)?.to_vec();
            let val = if in_list {
                let list = r.u64().ok_or_else(short)?;
                if list == 0 {
                    return Err(bad("xattr in list 0".into()));
                }
                XattrValue::List {
                    list,
                    len: len as u32,
                }
            } else {
                XattrValue::Inline(r.take(len).ok_or_else(short)?.to_vec())
            };
            if let Some((prev, _)) = xattrs.last() {
                if *prev >= n {
                    return Err(bad("xattrs out of order".into()));
                }
            }
            xattrs.push((n, val));
        }
        if r.pos != b.len() {
            return Err(bad(format!("{} trailing bytes", b.len() - r.pos)));
        }
        let [atime, mtime, ctime] = times;
        Ok(Inode {
            ino,
            generation,
            mode,
            uid,
            gid,
            nlink,
            size,
            list,
            rdev,
            parent,
            atime,
            mtime,
            ctime,
            inline,
            xattrs,
        })
    }
}

struct Cursor<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let s = self.b.get(self.pos..self.pos.checked_add(n)?)?;
        self.pos += n;
        Some(s)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|s| s[0])
    }
    fn u16(&mut self) -> Option<u16> {
        self.take(2)
            .map(|s| u16::from_le_bytes(s.try_into().unwrap()))
    }
    fn u32(&mut self) -> Option<u32> {
        self.take(4)
            .map(|s| u32::from_le_bytes(s.try_into().unwrap()))
    }
    fn u64(&mut self) -> Option<u64> {
        self.take(8)
            .map(|s| u64::from_le_bytes(s.try_into().unwrap()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Inode {
        Inode {
            ino: 42,
            generation: 3,
            mode: 0o100644,
            uid: 1000,
            gid: 100,
            nlink: 1,
            size: 5,
            list: 0,
            rdev: 0,
            parent: 0,
            atime: Time { secs: 1, nsecs: 2 },
            mtime: Time {
                secs: -5,
                nsecs: 999_999_999,
            },
            ctime: Time { secs: 7, nsecs: 0 },
            inline: b"hello".to_vec(),
            xattrs: vec![
                (b"user.a".to_vec(), XattrValue::Inline(b"1".to_vec())),
                (b"user.b".to_vec(), XattrValue::Inline(vec![])),
                (
                    b"user.c".to_vec(),
                    XattrValue::List {
                        list: 77,
                        len: 65536,
                    },
                ),
            ],
        }
    }

    #[test]
    fn roundtrip() {
        let i = sample();
        assert_eq!(Inode::decode(42, &i.encode(), 0).unwrap(), i);
        assert_eq!(i.encode().len(), i.encoded_len());
        let mut big = sample();
        big.xattrs = (0..1024)
            .map(|k| {
                let v = XattrValue::Inline(vec![1; 22]);
                (format!("user.{k:04}").into_bytes(), v)
            })
            .collect();
        assert_eq!(big.encode().len(), big.encoded_len());
    }

    #[test]
    fn every_flipped_byte_and_truncation_is_handled() {
        let good = sample().encode();
        for k in 0..good.len() {
            let mut b = good.clone();
            b[k] ^= 0x81;
            let _ = Inode::decode(42, &b, 0); // must not panic
            let _ = Inode::decode(42, &good[..k], 0);
        }
        assert!(Inode::decode(43, &good, 0).is_err());
    }
}
