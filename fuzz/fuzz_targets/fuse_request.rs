//! A FUSE request as FUSE over io_uring hands it to the daemon (the in
//! header, the operation's fixed part, the payload) decoded and served by a
//! file system that answers every operation, so the decoder and the reply
//! encoder run on arbitrary bytes: a malformed request must be an error,
//! never a panic, and every reply must fit what it claims.
#![no_main]
use std::time::{Duration, UNIX_EPOCH};

use fuser::INodeNo;
use ldfs_tools::fuse::transport::proto::{self, InHeader, IN_HEADER_BYTES};
use ldfs_tools::fuse::transport::{
    Caller, DirEntry, DirEntryPlus, Entry, FileAttr, FileType, FuseOps, OpResult, Opened, Statfs,
    Xattr,
};
use libfuzzer_sys::fuzz_target;

/// The operation's fixed part is at most this long (`fuse_*_in`).
const OP_IN_BYTES: usize = 128;

struct Answers;

fn attr(ino: u64) -> FileAttr {
    FileAttr {
        ino: INodeNo(ino),
        size: ino.wrapping_mul(4097),
        blocks: 8,
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind: FileType::RegularFile,
        perm: 0o644,
        nlink: 1,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

fn entry(ino: u64) -> OpResult<Entry> {
    Ok(Entry {
        attr: attr(ino),
        generation: 1,
        ttl: Duration::from_secs(1),
        entry_ttl: Duration::from_secs(1),
    })
}

fn name(n: u64) -> Vec<u8> {
    vec![b'a' + (n % 26) as u8; 1 + (n % 255) as usize]
}

impl FuseOps for Answers {
    fn lookup(&self, _: &Caller, parent: u64, name: &[u8]) -> OpResult<Entry> {
        entry(parent ^ name.len() as u64)
    }
    fn getattr(&self, ino: u64) -> OpResult<(FileAttr, Duration)> {
        Ok((attr(ino), Duration::from_secs(1)))
    }
    fn readlink(&self, ino: u64) -> OpResult<Vec<u8>> {
        Ok(name(ino))
    }
    fn open(&self, ino: u64, _: i32) -> OpResult<Opened> {
        Ok(Opened { fh: ino, flags: 0 })
    }
    fn opendir(&self, ino: u64, _: i32) -> OpResult<Opened> {
        Ok(Opened { fh: ino, flags: 0 })
    }
    fn read(&self, _: u64, _: u64, offset: u64, size: u32) -> OpResult<Vec<u8>> {
        Ok(vec![offset as u8; size.min(1 << 17) as usize])
    }
    fn write(&self, _: &Caller, _: u64, _: u64, _: u64, data: &[u8], _: u32) -> OpResult<u32> {
        Ok(data.len() as u32)
    }
    fn readdir(
        &self,
        _: u64,
        _: u64,
        offset: u64,
        add: &mut dyn FnMut(DirEntry) -> bool,
    ) -> OpResult<()> {
        for n in offset..offset.saturating_add(4096) {
            let d = DirEntry {
                ino: n,
                next: n + 1,
                kind: FileType::RegularFile,
                name: name(n),
            };
            if !add(d) {
                break;
            }
        }
        Ok(())
    }
    fn readdirplus(
        &self,
        _: u64,
        _: u64,
        offset: u64,
        add: &mut dyn FnMut(DirEntryPlus) -> bool,
    ) -> OpResult<()> {
        for n in offset..offset.saturating_add(4096) {
            let d = DirEntryPlus {
                dirent: DirEntry {
                    ino: n,
                    next: n + 1,
                    kind: FileType::RegularFile,
                    name: name(n),
                },
                entry: entry(n)?,
            };
            if !add(d) {
                break;
            }
        }
        Ok(())
    }
    fn statfs(&self, _: u64) -> OpResult<Statfs> {
        Ok(Statfs {
            blocks: 1 << 20,
            bfree: 1 << 19,
            bavail: 1 << 19,
            files: 1 << 16,
            ffree: 1 << 15,
            bsize: 4096,
            namelen: 255,
            frsize: 4096,
        })
    }
    fn getxattr(&self, _: &Caller, _: u64, name: &[u8], size: u32) -> OpResult<Xattr> {
        let v = name.repeat(3);
        Ok(if size == 0 {
            Xattr::Size(v.len() as u32)
        } else {
            Xattr::Data(v[..v.len().min(size as usize)].to_vec())
        })
    }
    fn listxattr(&self, ino: u64, size: u32) -> OpResult<Xattr> {
        let v = name(ino);
        Ok(if size == 0 {
            Xattr::Size(v.len() as u32)
        } else {
            Xattr::Data(v[..v.len().min(size as usize)].to_vec())
        })
    }
}

fuzz_target!(|data: &[u8]| {
    if data.len() < IN_HEADER_BYTES + 1 {
        return;
    }
    // The opcode from one byte, so every operation is reached often.
    let mut header = data[..IN_HEADER_BYTES].to_vec();
    header[4..8].copy_from_slice(&(data[IN_HEADER_BYTES] as u32 % 64).to_le_bytes());
    let rest = &data[IN_HEADER_BYTES + 1..];
    let mut op_in = [0u8; OP_IN_BYTES];
    let n = rest.len().min(OP_IN_BYTES);
    op_in[..n].copy_from_slice(&rest[..n]);
    let payload = &rest[n..];
    let Ok(h) = InHeader::decode(&header) else {
        return;
    };
    let Ok(op) = proto::decode(&h, &op_in, payload) else {
        return;
    };
    let mut out = Vec::new();
    let _ = proto::serve(&Answers, &h, op, &mut out);
    let _ = proto::out_header(h.unique, None, out.len());
});
