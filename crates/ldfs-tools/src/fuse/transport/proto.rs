//! The FUSE wire protocol for the io_uring transport: requests decoded from
//! the bytes the kernel puts in a ring entry, replies encoded into it, and
//! [`serve`], which calls the [`FuseOps`] method a request names.
//!
//! A ring entry carries a request in three parts (kernel
//! `fuse_uring_args_to_ring`): the `fuse_in_header` (40 bytes at the start of
//! the entry's 128-byte `in_out`), the operation's own header — the kernel's
//! first argument, `fuse_*_in` — in the 128-byte `op_in` (nothing for
//! operations without one: LOOKUP, UNLINK, RMDIR, SYMLINK, READLINK,
//! STATFS), and the remaining arguments, as /dev/fuse would carry them after
//! that header, in the payload (`payload_sz` bytes: names ending in NUL,
//! written data, attribute values). A reply is a `fuse_out_header` in
//! `in_out` and its data in the payload.
//!
//! Every decoder bounds what it reads by the bytes it was given and answers
//! a malformed request (short, a name without its NUL, a length beyond the
//! payload) with [`Malformed`], never a panic: the caller replies EINVAL.
//! All integers little-endian, as the kernel writes them on x86-64 and arm64
//! (offsets below are `include/uapi/linux/fuse.h`'s, protocol 7.42).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::{
    Caller, DirEntry, Entry, Errno, FileAttr, FileType, FuseOps, SetattrIn, TimeOrNow, Xattr,
};

/// `fuse_in_header`: len u32 @0, opcode u32 @4, unique u64 @8, nodeid u64
/// @16, uid u32 @24, gid u32 @28, pid u32 @32, total_extlen u16 @36.
pub const IN_HEADER_BYTES: usize = 40;
/// `fuse_out_header`: len u32 @0, error i32 @4, unique u64 @8.
pub const OUT_HEADER_BYTES: usize = 16;
/// `fuse_attr`.
pub const ATTR_BYTES: usize = 88;
/// `fuse_entry_out`: nodeid, generation, entry_valid, attr_valid (u64 each),
/// entry_valid_nsec, attr_valid_nsec (u32), fuse_attr.
pub const ENTRY_OUT_BYTES: usize = 40 + ATTR_BYTES;
/// `fuse_dirent`: ino u64, off u64, namelen u32, type u32, then the name.
pub const DIRENT_NAME_OFFSET: usize = 24;

pub mod opcode {
    pub const LOOKUP: u32 = 1;
    pub const FORGET: u32 = 2;
    pub const GETATTR: u32 = 3;
    pub const SETATTR: u32 = 4;
    pub const READLINK: u32 = 5;
    pub const SYMLINK: u32 = 6;
    pub const MKNOD: u32 = 8;
    pub const MKDIR: u32 = 9;
    pub const UNLINK: u32 = 10;
    pub const RMDIR: u32 = 11;
    pub const RENAME: u32 = 12;
    pub const LINK: u32 = 13;
    pub const OPEN: u32 = 14;
    pub const READ: u32 = 15;
    pub const WRITE: u32 = 16;
    pub const STATFS: u32 = 17;
    pub const RELEASE: u32 = 18;
    pub const FSYNC: u32 = 20;
    pub const SETXATTR: u32 = 21;
    pub const GETXATTR: u32 = 22;
    pub const LISTXATTR: u32 = 23;
    pub const REMOVEXATTR: u32 = 24;
    pub const FLUSH: u32 = 25;
    pub const INIT: u32 = 26;
    pub const OPENDIR: u32 = 27;
    pub const READDIR: u32 = 28;
    pub const RELEASEDIR: u32 = 29;
    pub const FSYNCDIR: u32 = 30;
    pub const ACCESS: u32 = 34;
    pub const CREATE: u32 = 35;
    pub const INTERRUPT: u32 = 36;
    pub const DESTROY: u32 = 38;
    pub const IOCTL: u32 = 39;
    pub const BATCH_FORGET: u32 = 42;
    pub const FALLOCATE: u32 = 43;
    pub const READDIRPLUS: u32 = 44;
    pub const RENAME2: u32 = 45;
    pub const LSEEK: u32 = 46;
}

// SETATTR's `valid` bits.
const FATTR_MODE: u32 = 1 << 0;
const FATTR_UID: u32 = 1 << 1;
const FATTR_GID: u32 = 1 << 2;
const FATTR_SIZE: u32 = 1 << 3;
const FATTR_ATIME: u32 = 1 << 4;
const FATTR_MTIME: u32 = 1 << 5;
const FATTR_ATIME_NOW: u32 = 1 << 7;
const FATTR_MTIME_NOW: u32 = 1 << 8;

/// A request the decoder refused: too short, or lengths that disagree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Malformed(pub String);

fn short(what: &str, need: usize, got: usize) -> Malformed {
    Malformed(format!("{what}: {need} bytes needed, {got} given"))
}

/// Little-endian reads bounded by the slice (a short slice is `Malformed`).
struct Reader<'a> {
    what: &'static str,
    b: &'a [u8],
}

impl<'a> Reader<'a> {
    fn need(&self, n: usize) -> Result<(), Malformed> {
        if self.b.len() < n {
            return Err(short(self.what, n, self.b.len()));
        }
        Ok(())
    }
    fn u16(&self, at: usize) -> Result<u16, Malformed> {
        self.need(at + 2)?;
        Ok(u16::from_le_bytes(self.b[at..at + 2].try_into().unwrap()))
    }
    fn u32(&self, at: usize) -> Result<u32, Malformed> {
        self.need(at + 4)?;
        Ok(u32::from_le_bytes(self.b[at..at + 4].try_into().unwrap()))
    }
    fn u64(&self, at: usize) -> Result<u64, Malformed> {
        self.need(at + 8)?;
        Ok(u64::from_le_bytes(self.b[at..at + 8].try_into().unwrap()))
    }
}

/// The NUL-terminated name at the start of `b`, and what follows it.
fn name(b: &[u8]) -> Result<(&[u8], &[u8]), Malformed> {
    match b.iter().position(|&c| c == 0) {
        Some(0) => Err(Malformed("an empty name".into())),
        Some(n) => Ok((&b[..n], &b[n + 1..])),
        None => Err(Malformed(format!(
            "a name without its NUL in {} bytes",
            b.len()
        ))),
    }
}

/// `fuse_in_header`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InHeader {
    pub len: u32,
    pub opcode: u32,
    pub unique: u64,
    pub nodeid: u64,
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
    pub total_extlen: u16,
}

impl InHeader {
    pub fn decode(b: &[u8]) -> Result<InHeader, Malformed> {
        let r = Reader {
            what: "fuse_in_header",
            b,
        };
        r.need(IN_HEADER_BYTES)?;
        Ok(InHeader {
            len: r.u32(0)?,
            opcode: r.u32(4)?,
            unique: r.u64(8)?,
            nodeid: r.u64(16)?,
            uid: r.u32(24)?,
            gid: r.u32(28)?,
            pid: r.u32(32)?,
            total_extlen: r.u16(36)?,
        })
    }

    pub fn caller(&self) -> Caller {
        Caller {
            uid: self.uid,
            gid: self.gid,
            pid: self.pid,
        }
    }
}

/// A decoded request (names and data borrow the entry's buffers).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op<'a> {
    Lookup {
        name: &'a [u8],
    },
    Forget {
        nlookup: u64,
    },
    BatchForget {
        forgets: Vec<(u64, u64)>,
    },
    Getattr,
    Setattr {
        sa: SetattrDecoded,
    },
    Readlink,
    Symlink {
        name: &'a [u8],
        target: &'a [u8],
    },
    Mknod {
        mode: u32,
        rdev: u32,
        umask: u32,
        name: &'a [u8],
    },
    Mkdir {
        mode: u32,
        umask: u32,
        name: &'a [u8],
    },
    Unlink {
        name: &'a [u8],
    },
    Rmdir {
        name: &'a [u8],
    },
    Rename {
        newdir: u64,
        flags: u32,
        name: &'a [u8],
        newname: &'a [u8],
    },
    Link {
        oldnodeid: u64,
        name: &'a [u8],
    },
    Open {
        flags: u32,
    },
    Read {
        fh: u64,
        offset: u64,
        size: u32,
    },
    Write {
        fh: u64,
        offset: u64,
        write_flags: u32,
        data: &'a [u8],
    },
    Statfs,
    Release {
        fh: u64,
    },
    Fsync {
        fh: u64,
        datasync: bool,
    },
    Setxattr {
        flags: u32,
        name: &'a [u8],
        value: &'a [u8],
    },
    Getxattr {
        size: u32,
        name: &'a [u8],
    },
    Listxattr {
        size: u32,
    },
    Removexattr {
        name: &'a [u8],
    },
    Flush {
        fh: u64,
    },
    Opendir {
        flags: u32,
    },
    Readdir {
        fh: u64,
        offset: u64,
        size: u32,
    },
    Readdirplus {
        fh: u64,
        offset: u64,
        size: u32,
    },
    Releasedir {
        fh: u64,
    },
    Fsyncdir {
        fh: u64,
        datasync: bool,
    },
    Access {
        mask: u32,
    },
    Create {
        flags: u32,
        mode: u32,
        umask: u32,
        name: &'a [u8],
    },
    Fallocate {
        fh: u64,
        offset: u64,
        length: u64,
        mode: u32,
    },
    Lseek {
        fh: u64,
        offset: u64,
        whence: u32,
    },
    Ioctl {
        fh: u64,
        cmd: u32,
        out_size: u32,
        input: &'a [u8],
    },
    Interrupt,
    Destroy,
    Init,
    /// An opcode ldfs does not serve: answered ENOSYS.
    Unknown(u32),
}

/// SETATTR's fields as the wire has them (`valid` says which count).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SetattrDecoded {
    pub valid: u32,
    pub size: u64,
    pub atime: (u64, u32),
    pub mtime: (u64, u32),
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
}

fn wire_time((secs, nsecs): (u64, u32)) -> SystemTime {
    let secs = secs as i64;
    if secs >= 0 {
        UNIX_EPOCH + Duration::new(secs as u64, nsecs.min(999_999_999))
    } else {
        UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs())
            + Duration::from_nanos(nsecs.min(999_999_999) as u64)
    }
}

impl SetattrDecoded {
    pub fn to_setattr(self) -> SetattrIn {
        let v = self.valid;
        let time = |set: u32, now: u32, t: (u64, u32)| {
            if v & now != 0 {
                Some(TimeOrNow::Now)
            } else if v & set != 0 {
                Some(TimeOrNow::SpecificTime(wire_time(t)))
            } else {
                None
            }
        };
        SetattrIn {
            mode: (v & FATTR_MODE != 0).then_some(self.mode),
            uid: (v & FATTR_UID != 0).then_some(self.uid),
            gid: (v & FATTR_GID != 0).then_some(self.gid),
            size: (v & FATTR_SIZE != 0).then_some(self.size),
            atime: time(FATTR_ATIME, FATTR_ATIME_NOW, self.atime),
            mtime: time(FATTR_MTIME, FATTR_MTIME_NOW, self.mtime),
        }
    }
}

/// Decodes the operation of `h` from its header part `op_in` and its
/// `payload` (the entry's first `payload_sz` bytes).
pub fn decode<'a>(h: &InHeader, op_in: &'a [u8], payload: &'a [u8]) -> Result<Op<'a>, Malformed> {
    use opcode::*;
    let r = |what| Reader { what, b: op_in };
    Ok(match h.opcode {
        LOOKUP => Op::Lookup {
            name: name(payload)?.0,
        },
        FORGET => Op::Forget {
            nlookup: r("fuse_forget_in").u64(0)?,
        },
        BATCH_FORGET => {
            let count = r("fuse_batch_forget_in").u32(0)? as usize;
            let p = Reader {
                what: "fuse_forget_one",
                b: payload,
            };
            p.need(
                count
                    .checked_mul(16)
                    .ok_or_else(|| Malformed("count".into()))?,
            )?;
            let forgets = (0..count)
                .map(|i| Ok((p.u64(i * 16)?, p.u64(i * 16 + 8)?)))
                .collect::<Result<_, Malformed>>()?;
            Op::BatchForget { forgets }
        }
        GETATTR => {
            r("fuse_getattr_in").need(16)?;
            Op::Getattr
        }
        SETATTR => {
            let r = r("fuse_setattr_in");
            r.need(88)?;
            Op::Setattr {
                sa: SetattrDecoded {
                    valid: r.u32(0)?,
                    size: r.u64(16)?,
                    atime: (r.u64(32)?, r.u32(56)?),
                    mtime: (r.u64(40)?, r.u32(60)?),
                    mode: r.u32(68)?,
                    uid: r.u32(76)?,
                    gid: r.u32(80)?,
                },
            }
        }
        READLINK => Op::Readlink,
        SYMLINK => {
            let (n, rest) = name(payload)?;
            Op::Symlink {
                name: n,
                target: name(rest)?.0,
            }
        }
        MKNOD => {
            let r = r("fuse_mknod_in");
            Op::Mknod {
                mode: r.u32(0)?,
                rdev: r.u32(4)?,
                umask: r.u32(8)?,
                name: name(payload)?.0,
            }
        }
        MKDIR => {
            let r = r("fuse_mkdir_in");
            Op::Mkdir {
                mode: r.u32(0)?,
                umask: r.u32(4)?,
                name: name(payload)?.0,
            }
        }
        UNLINK => Op::Unlink {
            name: name(payload)?.0,
        },
        RMDIR => Op::Rmdir {
            name: name(payload)?.0,
        },
        RENAME | RENAME2 => {
            let (newdir, flags) = if h.opcode == RENAME {
                (r("fuse_rename_in").u64(0)?, 0)
            } else {
                let r = r("fuse_rename2_in");
                (r.u64(0)?, r.u32(8)?)
            };
            let (n, rest) = name(payload)?;
            Op::Rename {
                newdir,
                flags,
                name: n,
                newname: name(rest)?.0,
            }
        }
        LINK => Op::Link {
            oldnodeid: r("fuse_link_in").u64(0)?,
            name: name(payload)?.0,
        },
        OPEN | OPENDIR => {
            let flags = r("fuse_open_in").u32(0)?;
            if h.opcode == OPEN {
                Op::Open { flags }
            } else {
                Op::Opendir { flags }
            }
        }
        READ | READDIR | READDIRPLUS => {
            let r = r("fuse_read_in");
            r.need(40)?;
            let (fh, offset, size) = (r.u64(0)?, r.u64(8)?, r.u32(16)?);
            match h.opcode {
                READ => Op::Read { fh, offset, size },
                READDIR => Op::Readdir { fh, offset, size },
                _ => Op::Readdirplus { fh, offset, size },
            }
        }
        WRITE => {
            let r = r("fuse_write_in");
            r.need(40)?;
            let size = r.u32(16)? as usize;
            if payload.len() < size {
                return Err(short("WRITE data", size, payload.len()));
            }
            Op::Write {
                fh: r.u64(0)?,
                offset: r.u64(8)?,
                write_flags: r.u32(20)?,
                data: &payload[..size],
            }
        }
        STATFS => Op::Statfs,
        RELEASE | RELEASEDIR => {
            let r = r("fuse_release_in");
            r.need(24)?;
            let fh = r.u64(0)?;
            if h.opcode == RELEASE {
                Op::Release { fh }
            } else {
                Op::Releasedir { fh }
            }
        }
        FSYNC | FSYNCDIR => {
            let r = r("fuse_fsync_in");
            r.need(16)?;
            let (fh, datasync) = (r.u64(0)?, r.u32(8)? & 1 != 0);
            if h.opcode == FSYNC {
                Op::Fsync { fh, datasync }
            } else {
                Op::Fsyncdir { fh, datasync }
            }
        }
        SETXATTR => {
            let r = r("fuse_setxattr_in");
            let size = r.u32(0)? as usize;
            let (n, rest) = name(payload)?;
            if rest.len() < size {
                return Err(short("SETXATTR value", size, rest.len()));
            }
            Op::Setxattr {
                flags: r.u32(4)?,
                name: n,
                value: &rest[..size],
            }
        }
        GETXATTR => Op::Getxattr {
            size: r("fuse_getxattr_in").u32(0)?,
            name: name(payload)?.0,
        },
        LISTXATTR => Op::Listxattr {
            size: r("fuse_getxattr_in").u32(0)?,
        },
        REMOVEXATTR => Op::Removexattr {
            name: name(payload)?.0,
        },
        FLUSH => {
            let r = r("fuse_flush_in");
            r.need(24)?;
            Op::Flush { fh: r.u64(0)? }
        }
        ACCESS => Op::Access {
            mask: r("fuse_access_in").u32(0)?,
        },
        CREATE => {
            let r = r("fuse_create_in");
            r.need(16)?;
            Op::Create {
                flags: r.u32(0)?,
                mode: r.u32(4)?,
                umask: r.u32(8)?,
                name: name(payload)?.0,
            }
        }
        FALLOCATE => {
            let r = r("fuse_fallocate_in");
            r.need(32)?;
            Op::Fallocate {
                fh: r.u64(0)?,
                offset: r.u64(8)?,
                length: r.u64(16)?,
                mode: r.u32(24)?,
            }
        }
        LSEEK => {
            let r = r("fuse_lseek_in");
            r.need(24)?;
            Op::Lseek {
                fh: r.u64(0)?,
                offset: r.u64(8)?,
                whence: r.u32(16)?,
            }
        }
        IOCTL => {
            // fuse_ioctl_in: fh, flags, cmd, arg, in_size, out_size; then
            // in_size bytes of the argument.
            let r = r("fuse_ioctl_in");
            r.need(32)?;
            let in_size = r.u32(24)? as usize;
            if payload.len() < in_size {
                return Err(short("IOCTL argument", in_size, payload.len()));
            }
            Op::Ioctl {
                fh: r.u64(0)?,
                cmd: r.u32(12)?,
                out_size: r.u32(28)?,
                input: &payload[..in_size],
            }
        }
        INTERRUPT => Op::Interrupt,
        DESTROY => Op::Destroy,
        INIT => Op::Init,
        other => Op::Unknown(other),
    })
}

/// Reply data, appended little-endian.
pub struct Out<'a>(pub &'a mut Vec<u8>);

impl Out<'_> {
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }

    fn time(t: SystemTime) -> (u64, u32) {
        match t.duration_since(UNIX_EPOCH) {
            Ok(d) => (d.as_secs(), d.subsec_nanos()),
            Err(e) => {
                let d = e.duration();
                let (mut s, mut n) = (-(d.as_secs() as i64), d.subsec_nanos());
                if n > 0 {
                    s -= 1;
                    n = 1_000_000_000 - n;
                }
                (s as u64, n)
            }
        }
    }

    /// `fuse_attr` (88 bytes).
    pub fn attr(&mut self, a: &FileAttr) {
        let start = self.0.len();
        let (at, an) = Self::time(a.atime);
        let (mt, mn) = Self::time(a.mtime);
        let (ct, cn) = Self::time(a.ctime);
        self.u64(a.ino.0);
        self.u64(a.size);
        self.u64(a.blocks);
        self.u64(at);
        self.u64(mt);
        self.u64(ct);
        self.u32(an);
        self.u32(mn);
        self.u32(cn);
        self.u32(mode_bits(a.kind) | u32::from(a.perm));
        self.u32(a.nlink);
        self.u32(a.uid);
        self.u32(a.gid);
        self.u32(a.rdev);
        self.u32(a.blksize);
        self.u32(a.flags);
        assert_eq!(self.0.len() - start, ATTR_BYTES);
    }

    /// `fuse_entry_out` (128 bytes).
    pub fn entry(&mut self, e: &Entry) {
        self.u64(e.attr.ino.0);
        self.u64(e.generation);
        // fuse_entry_out: entry_valid, attr_valid, then their nanoseconds.
        self.u64(e.entry_ttl.as_secs());
        self.u64(e.ttl.as_secs());
        self.u32(e.entry_ttl.subsec_nanos());
        self.u32(e.ttl.subsec_nanos());
        self.attr(&e.attr);
    }

    /// `fuse_attr_out` (104 bytes).
    pub fn attr_out(&mut self, a: &FileAttr, ttl: Duration) {
        self.u64(ttl.as_secs());
        self.u32(ttl.subsec_nanos());
        self.u32(0);
        self.attr(a);
    }

    /// `fuse_open_out` (16 bytes).
    pub fn open_out(&mut self, o: &super::Opened) {
        self.u64(o.fh);
        self.u32(o.flags);
        self.u32(0);
    }

    /// `fuse_dirent`, padded to 8 bytes.
    pub fn dirent(&mut self, d: &DirEntry) {
        let start = self.0.len();
        self.u64(d.ino);
        self.u64(d.next);
        self.u32(d.name.len() as u32);
        self.u32(mode_bits(d.kind) >> 12);
        self.0.extend_from_slice(&d.name);
        let padded = start + super::dirent_bytes(d.name.len());
        self.0.resize(padded, 0);
    }
}

/// The S_IF* bits of a kind.
fn mode_bits(k: FileType) -> u32 {
    match k {
        FileType::NamedPipe => libc::S_IFIFO,
        FileType::CharDevice => libc::S_IFCHR,
        FileType::BlockDevice => libc::S_IFBLK,
        FileType::Directory => libc::S_IFDIR,
        FileType::RegularFile => libc::S_IFREG,
        FileType::Symlink => libc::S_IFLNK,
        FileType::Socket => libc::S_IFSOCK,
    }
}

/// What a request asks of the reply: none (FORGET), or an answer.
pub enum Answer {
    /// The request wants no reply.
    None,
    /// Success: the reply's data is in the buffer.
    Ok,
    Err(Errno),
}

fn answer(r: Result<(), Errno>) -> Answer {
    match r {
        Ok(()) => Answer::Ok,
        Err(e) => Answer::Err(e),
    }
}

/// Runs `op` on `fs`; a successful reply's data is appended to `out`.
pub fn serve<F: FuseOps>(fs: &F, h: &InHeader, op: Op<'_>, out: &mut Vec<u8>) -> Answer {
    let c = h.caller();
    let ino = h.nodeid;
    let mut o = Out(out);
    let r: Result<(), Errno> = match op {
        Op::Forget { nlookup } => {
            fs.forget(ino, nlookup);
            return Answer::None;
        }
        Op::BatchForget { forgets } => {
            for (n, l) in forgets {
                fs.forget(n, l);
            }
            return Answer::None;
        }
        Op::Interrupt => return Answer::None,
        Op::Lookup { name } => fs.lookup(&c, ino, name).map(|e| o.entry(&e)),
        Op::Getattr => fs.getattr(ino).map(|(a, t)| o.attr_out(&a, t)),
        Op::Setattr { sa } => fs
            .setattr(&c, ino, &sa.to_setattr())
            .map(|(a, t)| o.attr_out(&a, t)),
        Op::Readlink => fs.readlink(ino).map(|t| o.0.extend_from_slice(&t)),
        Op::Symlink { name, target } => fs.symlink(&c, ino, name, target).map(|e| o.entry(&e)),
        Op::Mknod {
            mode,
            rdev,
            umask,
            name,
        } => fs
            .mknod(&c, ino, name, mode, umask, rdev)
            .map(|e| o.entry(&e)),
        Op::Mkdir { mode, umask, name } => {
            fs.mkdir(&c, ino, name, mode, umask).map(|e| o.entry(&e))
        }
        Op::Unlink { name } => fs.unlink(ino, name),
        Op::Rmdir { name } => fs.rmdir(ino, name),
        Op::Rename {
            newdir,
            flags,
            name,
            newname,
        } => fs.rename(ino, name, newdir, newname, flags),
        Op::Link { oldnodeid, name } => fs.link(oldnodeid, ino, name).map(|e| o.entry(&e)),
        Op::Open { flags } => fs.open(ino, flags as i32).map(|x| o.open_out(&x)),
        Op::Opendir { flags } => fs.opendir(ino, flags as i32).map(|x| o.open_out(&x)),
        Op::Read { fh, offset, size } => fs
            .read(ino, fh, offset, size)
            .map(|d| o.0.extend_from_slice(&d[..d.len().min(size as usize)])),
        Op::Write {
            fh,
            offset,
            write_flags,
            data,
        } => fs.write(&c, ino, fh, offset, data, write_flags).map(|n| {
            o.u32(n);
            o.u32(0);
        }),
        Op::Statfs => fs.statfs(ino).map(|s| {
            for v in [s.blocks, s.bfree, s.bavail, s.files, s.ffree] {
                o.u64(v);
            }
            for v in [s.bsize, s.namelen, s.frsize, 0, 0, 0, 0, 0, 0, 0] {
                o.u32(v);
            }
        }),
        Op::Release { fh } => fs.release(ino, fh),
        Op::Releasedir { fh } => fs.releasedir(ino, fh),
        Op::Flush { fh } => fs.flush(ino, fh),
        Op::Fsync { fh, datasync } => fs.fsync(ino, fh, datasync),
        Op::Fsyncdir { fh, datasync } => fs.fsyncdir(ino, fh, datasync),
        Op::Setxattr { flags, name, value } => fs.setxattr(&c, ino, name, value, flags as i32),
        Op::Getxattr { size, name } => fs.getxattr(&c, ino, name, size).map(|x| xattr(&mut o, x)),
        Op::Listxattr { size } => fs.listxattr(ino, size).map(|x| xattr(&mut o, x)),
        Op::Removexattr { name } => fs.removexattr(ino, name),
        Op::Access { mask } => fs.access(ino, mask as i32),
        Op::Create {
            flags,
            mode,
            umask,
            name,
        } => fs
            .create(&c, ino, name, mode, umask, flags as i32)
            .map(|(e, x)| {
                o.entry(&e);
                o.open_out(&x);
            }),
        Op::Fallocate {
            fh,
            offset,
            length,
            mode,
        } => fs.fallocate(ino, fh, offset, length, mode as i32),
        Op::Lseek { fh, offset, whence } => fs
            .lseek(ino, fh, offset as i64, whence as i32)
            .map(|x| o.u64(x as u64)),
        // fuse_ioctl_out (result, flags, in_iovs, out_iovs), then the
        // output: a restricted ioctl never asks for a retry.
        Op::Ioctl {
            fh,
            cmd,
            out_size,
            input,
        } => fs.ioctl(&c, ino, fh, cmd, input, out_size).map(|d| {
            for v in [0, 0, 0, 0] {
                o.u32(v);
            }
            o.0.extend_from_slice(&d[..d.len().min(out_size as usize)]);
        }),
        Op::Readdir { fh, offset, size } => {
            let start = o.0.len();
            let mut add = |d: DirEntry| {
                if o.0.len() - start + super::dirent_bytes(d.name.len()) > size as usize {
                    return false;
                }
                o.dirent(&d);
                true
            };
            fs.readdir(ino, fh, offset, &mut add)
        }
        Op::Readdirplus { fh, offset, size } => {
            let start = o.0.len();
            let mut add = |d: super::DirEntryPlus| {
                let n = super::direntplus_bytes(d.dirent.name.len());
                if o.0.len() - start + n > size as usize {
                    return false;
                }
                o.entry(&d.entry);
                o.dirent(&d.dirent);
                true
            };
            fs.readdirplus(ino, fh, offset, &mut add)
        }
        Op::Destroy => Ok(()),
        // INIT comes over /dev/fuse, before any ring exists.
        Op::Init => Err(Errno::from_i32(libc::EIO)),
        Op::Unknown(_) => Err(Errno::from_i32(libc::ENOSYS)),
    };
    answer(r)
}

fn xattr(o: &mut Out<'_>, x: Xattr) {
    match x {
        Xattr::Size(n) => {
            o.u32(n);
            o.u32(0);
        }
        Xattr::Data(d) => o.0.extend_from_slice(&d),
    }
}

/// `fuse_out_header` for a reply of `data_len` bytes (error 0) or an error.
pub fn out_header(unique: u64, error: Option<Errno>, data_len: usize) -> [u8; OUT_HEADER_BYTES] {
    let mut b = [0u8; OUT_HEADER_BYTES];
    let (len, err) = match error {
        Some(e) => (OUT_HEADER_BYTES, -e.code()),
        None => (OUT_HEADER_BYTES + data_len, 0),
    };
    b[0..4].copy_from_slice(&(len as u32).to_le_bytes());
    b[4..8].copy_from_slice(&err.to_le_bytes());
    b[8..16].copy_from_slice(&unique.to_le_bytes());
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(opcode: u32) -> InHeader {
        InHeader {
            opcode,
            unique: 7,
            nodeid: 1,
            ..Default::default()
        }
    }

    #[test]
    fn in_header_round_trip_and_short() {
        let mut b = [0u8; IN_HEADER_BYTES];
        b[4..8].copy_from_slice(&opcode::WRITE.to_le_bytes());
        b[8..16].copy_from_slice(&99u64.to_le_bytes());
        b[16..24].copy_from_slice(&5u64.to_le_bytes());
        b[24..28].copy_from_slice(&1000u32.to_le_bytes());
        let h = InHeader::decode(&b).unwrap();
        assert_eq!((h.opcode, h.unique, h.nodeid, h.uid), (16, 99, 5, 1000));
        for n in 0..IN_HEADER_BYTES {
            assert!(InHeader::decode(&b[..n]).is_err(), "{n} bytes");
        }
    }

    #[test]
    fn names_need_their_nul() {
        let h = header(opcode::LOOKUP);
        assert_eq!(
            decode(&h, &[], b"abc\0").unwrap(),
            Op::Lookup { name: b"abc" }
        );
        assert!(decode(&h, &[], b"abc").is_err());
        assert!(decode(&h, &[], b"").is_err());
        assert!(decode(&h, &[], b"\0").is_err());
        let h = header(opcode::RENAME2);
        let mut op_in = [0u8; 16];
        op_in[..8].copy_from_slice(&3u64.to_le_bytes());
        op_in[8..12].copy_from_slice(&1u32.to_le_bytes());
        assert_eq!(
            decode(&h, &op_in, b"a\0b\0").unwrap(),
            Op::Rename {
                newdir: 3,
                flags: 1,
                name: b"a",
                newname: b"b"
            }
        );
        assert!(decode(&h, &op_in, b"a\0b").is_err());
        assert!(decode(&h, &op_in[..8], b"a\0b\0").is_err());
        assert!(decode(&header(opcode::SYMLINK), &[], b"l\0").is_err());
    }

    #[test]
    fn lengths_beyond_the_payload_are_refused() {
        let mut w = [0u8; 40];
        w[16..20].copy_from_slice(&10u32.to_le_bytes());
        let h = header(opcode::WRITE);
        assert!(decode(&h, &w, &[1; 9]).is_err());
        assert!(matches!(
            decode(&h, &w, &[1; 12]).unwrap(),
            Op::Write { data, .. } if data.len() == 10
        ));
        assert!(decode(&h, &w[..39], &[1; 12]).is_err());
        let h = header(opcode::SETXATTR);
        let mut s = [0u8; 8];
        s[..4].copy_from_slice(&5u32.to_le_bytes());
        assert!(decode(&h, &s, b"user.a\0abcd").is_err());
        assert!(decode(&h, &s, b"user.a\0abcde").is_ok());
        // IOCTL: in_size past the payload is refused; the argument is the
        // payload's first in_size bytes.
        let h = header(opcode::IOCTL);
        let mut io = [0u8; 32];
        io[12..16].copy_from_slice(&0x4008_6602u32.to_le_bytes());
        io[24..28].copy_from_slice(&4u32.to_le_bytes());
        io[28..32].copy_from_slice(&8u32.to_le_bytes());
        assert!(decode(&h, &io, &[1; 3]).is_err());
        assert_eq!(
            decode(&h, &io, &[1, 2, 3, 4, 5]).unwrap(),
            Op::Ioctl {
                fh: 0,
                cmd: 0x4008_6602,
                out_size: 8,
                input: &[1, 2, 3, 4]
            }
        );
        assert!(decode(&h, &io[..31], &[1; 4]).is_err());
        let h = header(opcode::BATCH_FORGET);
        let mut f = [0u8; 8];
        f[..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode(&h, &f, &[0; 32]).is_err());
    }

    #[test]
    fn every_opcode_survives_short_and_garbage_input() {
        // Every opcode ldfs serves, and some it does not, with every
        // length of op_in and payload up to a few bytes past its header:
        // an Ok or a Malformed, never a panic.
        let junk: Vec<u8> = (0..200u32).map(|i| (i * 37 + 11) as u8).collect();
        for opc in 0..60 {
            let h = header(opc);
            for n in [0, 1, 7, 8, 15, 16, 23, 24, 39, 40, 87, 88, 128] {
                for p in [0, 1, 5, 17, 64, 200] {
                    let _ = decode(&h, &junk[..n], &junk[..p]);
                }
            }
        }
    }

    #[test]
    fn out_header_and_dirent_layout() {
        let b = out_header(42, Some(Errno::from_i32(libc::ENOENT)), 100);
        assert_eq!(u32::from_le_bytes(b[0..4].try_into().unwrap()), 16);
        assert_eq!(
            i32::from_le_bytes(b[4..8].try_into().unwrap()),
            -libc::ENOENT
        );
        assert_eq!(u64::from_le_bytes(b[8..16].try_into().unwrap()), 42);
        let b = out_header(1, None, 100);
        assert_eq!(u32::from_le_bytes(b[0..4].try_into().unwrap()), 116);
        let mut v = Vec::new();
        Out(&mut v).dirent(&DirEntry {
            ino: 5,
            next: 6,
            kind: FileType::Directory,
            name: b"abc".to_vec(),
        });
        assert_eq!(v.len(), 32);
        assert_eq!(u32::from_le_bytes(v[20..24].try_into().unwrap()), 4);
    }

    /// A file system answering a few operations, to check what `serve`
    /// encodes.
    struct Fake;

    fn attr(ino: u64) -> FileAttr {
        FileAttr {
            ino: fuser::INodeNo(ino),
            size: 5,
            blocks: 1,
            atime: UNIX_EPOCH + Duration::new(10, 20),
            mtime: UNIX_EPOCH,
            ctime: UNIX_EPOCH,
            crtime: UNIX_EPOCH,
            kind: FileType::RegularFile,
            perm: 0o644,
            nlink: 1,
            uid: 3,
            gid: 4,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        }
    }

    impl FuseOps for Fake {
        fn readdir(
            &self,
            _ino: u64,
            _fh: u64,
            offset: u64,
            add: &mut dyn FnMut(DirEntry) -> bool,
        ) -> super::super::OpResult<()> {
            for i in offset + 1..offset + 100 {
                let d = DirEntry {
                    ino: i,
                    next: i,
                    kind: FileType::RegularFile,
                    name: format!("name-{i}").into_bytes(),
                };
                if !add(d) {
                    break;
                }
            }
            Ok(())
        }

        fn lookup(&self, _c: &Caller, parent: u64, name: &[u8]) -> super::super::OpResult<Entry> {
            if parent == 1 && name == b"a" {
                Ok(Entry {
                    attr: attr(9),
                    generation: 2,
                    ttl: Duration::from_millis(1500),
                    entry_ttl: Duration::from_secs(30),
                })
            } else {
                Err(Errno::from_i32(libc::ENOENT))
            }
        }
        fn getxattr(
            &self,
            _c: &Caller,
            _ino: u64,
            _name: &[u8],
            size: u32,
        ) -> super::super::OpResult<Xattr> {
            Ok(if size == 0 {
                Xattr::Size(3)
            } else {
                Xattr::Data(b"abc".to_vec())
            })
        }
    }

    #[test]
    fn serve_encodes_replies_and_errors() {
        let mut out = Vec::new();
        let h = header(opcode::LOOKUP);
        let op = decode(&h, &[], b"a\0").unwrap();
        assert!(matches!(serve(&Fake, &h, op, &mut out), Answer::Ok));
        assert_eq!(out.len(), ENTRY_OUT_BYTES);
        assert_eq!(u64::from_le_bytes(out[0..8].try_into().unwrap()), 9);
        assert_eq!(u64::from_le_bytes(out[8..16].try_into().unwrap()), 2);
        // entry_valid 30 s, attr_valid 1 s and 500 ms.
        assert_eq!(u64::from_le_bytes(out[16..24].try_into().unwrap()), 30);
        assert_eq!(u64::from_le_bytes(out[24..32].try_into().unwrap()), 1);
        assert_eq!(u32::from_le_bytes(out[32..36].try_into().unwrap()), 0);
        assert_eq!(
            u32::from_le_bytes(out[36..40].try_into().unwrap()),
            500_000_000
        );
        // fuse_attr at 40: size @8, atime @24, atimensec @48, mode @60.
        assert_eq!(u64::from_le_bytes(out[48..56].try_into().unwrap()), 5);
        assert_eq!(u64::from_le_bytes(out[64..72].try_into().unwrap()), 10);
        assert_eq!(u32::from_le_bytes(out[88..92].try_into().unwrap()), 20);
        assert_eq!(
            u32::from_le_bytes(out[100..104].try_into().unwrap()),
            libc::S_IFREG | 0o644
        );
        out.clear();
        let op = decode(&h, &[], b"b\0").unwrap();
        assert!(matches!(
            serve(&Fake, &h, op, &mut out),
            Answer::Err(e) if e.code() == libc::ENOENT
        ));
        // GETXATTR: the size asked with size 0, else the bytes.
        let h = header(opcode::GETXATTR);
        let op = decode(&h, &[0; 8], b"user.x\0").unwrap();
        out.clear();
        assert!(matches!(serve(&Fake, &h, op, &mut out), Answer::Ok));
        assert_eq!(out, [3, 0, 0, 0, 0, 0, 0, 0]);
        let op = decode(&h, &[8, 0, 0, 0, 0, 0, 0, 0], b"user.x\0").unwrap();
        out.clear();
        assert!(matches!(serve(&Fake, &h, op, &mut out), Answer::Ok));
        assert_eq!(out, b"abc");
        // What Fake does not serve, and opcodes nobody serves: ENOSYS.
        for opc in [opcode::MKDIR, 200] {
            let h = header(opc);
            let op = decode(&h, &[0; 8], b"d\0").unwrap();
            assert!(matches!(
                serve(&Fake, &h, op, &mut Vec::new()),
                Answer::Err(e) if e.code() == libc::ENOSYS
            ));
        }
        // READDIR takes what fits in the size asked, whole entries only:
        // 32 bytes per 6-letter name.
        let h = header(opcode::READDIR);
        let mut r = [0u8; 40];
        r[16..20].copy_from_slice(&100u32.to_le_bytes());
        let op = decode(&h, &r, &[]).unwrap();
        out.clear();
        assert!(matches!(serve(&Fake, &h, op, &mut out), Answer::Ok));
        assert_eq!(out.len(), 96);
        assert_eq!(&out[24..30], b"name-1");
        // FORGET wants no reply.
        let h = header(opcode::FORGET);
        let op = decode(&h, &[1, 0, 0, 0, 0, 0, 0, 0], &[]).unwrap();
        assert!(matches!(
            serve(&Fake, &h, op, &mut Vec::new()),
            Answer::None
        ));
    }
}
