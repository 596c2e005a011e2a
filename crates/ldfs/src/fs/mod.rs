//! POSIX file system over any `LogicalDisk` (LD section 4.1: MINIX over LLD).
//!
//! Lists (docs/FORMAT.md, "File system"): list 1 holds the file-system record
//! at index 0; list 2 the inode records (index = inode number); list 3 the
//! orphans (inodes unlinked while open, index = inode number). Each directory
//! and each regular file too large to live inline in its inode has a list of
//! its own: directory buckets (`dir`) or 4 KiB file blocks (index = offset /
//! 4096; holes are absent blocks; a block may be short, the rest reads as
//! zeros).
//!
//! Invariants:
//! - every operation is one ARU, so after a crash it is wholly present or
//!   wholly absent, and what survives is a prefix of what was done (the LD
//!   log is one sequence);
//! - space is reserved before an operation changes anything, so it never
//!   fails half-way for lack of space; checks come before changes;
//! - inode numbers come from a persistent counter and are never reused;
//! - an inode with no links lives on while open (recorded in the orphan
//!   list in the unlinking ARU) and is destroyed at its last release, or at
//!   the next mount after a crash;
//! - metadata found corrupt while mounted (an inode record or directory
//!   bucket that fails its checksum or does not decode) fails the operation
//!   with `Io` and turns the file system read-only (`Fs::damaged`; every
//!   modifying operation then fails with `ReadOnly`), so nothing is written
//!   from a wrong view of the tree; a bad data block fails only the reads
//!   that need it.
//!
//! errno exists only in the FUSE adapter; this layer returns `FsError`.

pub mod check;
pub mod dir;
pub mod inode;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::ld::{AruId, LdError, ListHints, ListId, ListKind, LogicalDisk, Temperature};
use inode::{Inode, Kind, Time, INLINE_MAX, XATTR_MAX, XATTR_NAME_MAX};

pub const ROOT_INO: u64 = 1;
pub const BLOCK_BYTES: u64 = 4096;
/// Largest file size (bytes): the largest offset Linux accepts.
pub const MAX_FILE_BYTES: u64 = i64::MAX as u64;
pub const LINK_MAX: u32 = 65_000;
const META_LIST: ListId = ListId(1);
const INODE_LIST: ListId = ListId(2);
const ORPHAN_LIST: ListId = ListId(3);
const FS_MAGIC: &[u8; 8] = b"LDFS-FS1";
const INO_BATCH: u64 = 1024;
/// Space reserved for the metadata an operation may write (inode records,
/// buckets, the file-system record).
const META_RESERVE: u64 = 256 << 10;
const INODE_CACHE_MAX: usize = 1 << 16;

#[derive(Debug, thiserror::Error)]
pub enum FsError {
    #[error("no such file or directory")]
    NotFound,
    #[error("file exists")]
    Exists,
    #[error("not a directory")]
    NotDir,
    #[error("is a directory")]
    IsDir,
    #[error("directory not empty")]
    NotEmpty,
    #[error("name longer than 255 bytes")]
    NameTooLong,
    #[error("no space left on device")]
    NoSpace,
    #[error("read-only file system")]
    ReadOnly,
    #[error("too many links")]
    TooManyLinks,
    #[error("file too large")]
    FileTooBig,
    #[error("no such attribute")]
    NoAttr,
    #[error("attribute value too large")]
    Range,
    #[error("operation not supported")]
    NotSupported,
    #[error("operation not permitted")]
    Perm,
    #[error("no data or hole at or after the offset")]
    NoOffset,
    #[error("invalid argument: {0}")]
    Invalid(String),
    #[error("I/O error: {0}")]
    Io(String),
}

pub type FsResult<T> = Result<T, FsError>;

impl From<LdError> for FsError {
    fn from(e: LdError) -> FsError {
        match e {
            LdError::NoSpace { .. } => FsError::NoSpace,
            LdError::ReadOnly(_) => FsError::ReadOnly,
            LdError::BadBlockLength { .. } | LdError::InvalidArgument(_) => {
                FsError::Io(e.to_string())
            }
            other => {
                eprintln!("ldfs: {other}");
                FsError::Io(other.to_string())
            }
        }
    }
}

/// Who is asking (for ownership of new inodes).
#[derive(Clone, Copy, Debug)]
pub struct Ctx {
    pub uid: u32,
    pub gid: u32,
}

/// What `getattr` reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attr {
    pub ino: u64,
    pub generation: u64,
    pub size: u64,
    /// 512-byte blocks allocated.
    pub blocks: u64,
    pub atime: Time,
    pub mtime: Time,
    pub ctime: Time,
    pub kind: Kind,
    /// Permission bits (mode & 0o7777).
    pub perm: u16,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
}

#[derive(Clone, Copy, Debug)]
pub enum TimeSet {
    Now,
    At(Time),
}

/// A setattr request: `None` leaves a field alone.
#[derive(Clone, Copy, Debug, Default)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    /// Clear set-user-ID, and set-group-ID if group-executable, as a
    /// truncation by a caller without CAP_FSETID does (the mount tells).
    pub kill_suidgid: bool,
    pub atime: Option<TimeSet>,
    pub mtime: Option<TimeSet>,
}

#[derive(Clone, Copy, Debug, Default)]
pub struct RenameFlags {
    pub noreplace: bool,
    pub exchange: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XattrMode {
    Any,
    Create,
    Replace,
}

/// fallocate modes the fs implements; anything else is `NotSupported`.
#[derive(Clone, Copy, Debug, Default)]
pub struct FallocMode {
    pub keep_size: bool,
    pub punch_hole: bool,
    pub zero_range: bool,
}

#[derive(Clone, Copy, Debug)]
pub enum Whence {
    Data,
    Hole,
}

#[derive(Clone, Debug)]
pub struct DirEntry {
    pub ino: u64,
    /// Offset to pass to continue after this entry.
    pub next: i64,
    pub kind: Kind,
    pub name: Vec<u8>,
}

#[derive(Clone, Copy, Debug)]
pub struct StatFs {
    pub block_bytes: u64,
    pub blocks: u64,
    pub blocks_free: u64,
    pub files: u64,
    pub name_max: u32,
}

pub struct FsOptions {
    pub read_only: bool,
    /// Wall clock; tests can pass a fixed one.
    pub clock: Box<dyn Fn() -> Time + Send + Sync>,
}

impl Default for FsOptions {
    fn default() -> Self {
        FsOptions {
            read_only: false,
            clock: Box::new(system_time),
        }
    }
}

pub fn system_time() -> Time {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    Time {
        secs: d.as_secs() as i64,
        nsecs: d.subsec_nanos(),
    }
}

struct State {
    inodes: HashMap<u64, Inode>,
    /// References per inode: open handles, or the kernel's lookups.
    open: HashMap<u64, u64>,
    next_ino: u64,
    /// Persisted bound: inode numbers below it may have been handed out.
    ino_reserved: u64,
}

pub struct Fs {
    ld: Arc<dyn LogicalDisk>,
    state: Mutex<State>,
    opts: FsOptions,
    /// Set when metadata (an inode record or a directory bucket) was found
    /// corrupt: from then on every modifying operation fails with
    /// `ReadOnly`, so the damage cannot spread; reads go on.
    damaged: std::sync::OnceLock<String>,
    /// `Fs::repair` is running: corruption it meets is what it repairs.
    repairing: std::sync::atomic::AtomicBool,
}

/// One operation's ARU.
struct Tx<'a> {
    fs: &'a Fs,
    aru: AruId,
    st: MutexGuard<'a, State>,
}

fn encode_fs_record(ino_reserved: u64) -> Vec<u8> {
    let mut b = FS_MAGIC.to_vec();
    b.extend_from_slice(&ino_reserved.to_le_bytes());
    b
}

fn check_block_size(ld: &dyn LogicalDisk) -> FsResult<()> {
    if ld.max_block_bytes() < inode::RECORD_MAX {
        return Err(FsError::Invalid(format!(
            "the logical disk's largest block is {} bytes; the file system needs {} (mkfs --max-block 64K)",
            ld.max_block_bytes(),
            inode::RECORD_MAX
        )));
    }
    Ok(())
}

fn check_name(name: &[u8]) -> FsResult<()> {
    if name.len() > dir::NAME_MAX {
        return Err(FsError::NameTooLong);
    }
    if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') || name.contains(&0)
    {
        return Err(FsError::Invalid(format!(
            "bad name {:?}",
            String::from_utf8_lossy(name)
        )));
    }
    Ok(())
}

impl Fs {
    /// Creates an empty file system (root directory only) on a fresh LD.
    pub fn format(ld: &dyn LogicalDisk, ctx: Ctx) -> FsResult<()> {
        check_block_size(ld)?;
        let aru = ld.begin_aru()?;
        let meta = ListHints {
            kind: ListKind::Metadata,
            temperature: Temperature::Hot,
            ..Default::default()
        };
        for want in [META_LIST, INODE_LIST, ORPHAN_LIST] {
            let got = ld.create_list(Some(aru), meta)?;
            if got != want {
                return Err(FsError::Invalid(format!(
                    "the logical disk is not empty (got {got}, expected {want})"
                )));
            }
        }
        let root_list = ld.create_list(Some(aru), meta)?;
        let root = empty_root(root_list, ctx);
        ld.write(Some(aru), INODE_LIST, ROOT_INO, &root.encode())?;
        ld.write(Some(aru), META_LIST, 0, &encode_fs_record(ROOT_INO + 1))?;
        ld.end_aru(aru)?;
        ld.flush()?;
        Ok(())
    }

    /// Mounts the file system on `ld`; reclaims inodes orphaned by a crash.
    pub fn mount(ld: Arc<dyn LogicalDisk>, opts: FsOptions) -> FsResult<Fs> {
        check_block_size(&*ld)?;
        let rec = ld
            .read(META_LIST, 0)
            .map_err(|e| match e {
                LdError::NoSuchList(_) => {
                    FsError::Invalid("no ldfs file system here (run ldfs mkfs)".into())
                }
                e => e.into(),
            })?
            .ok_or_else(|| FsError::Invalid("file-system record missing".into()))?;
        if rec.len() != 16 || &rec[..8] != FS_MAGIC {
            return Err(FsError::Io(format!(
                "corrupt file-system record ({} bytes)",
                rec.len()
            )));
        }
        let reserved = u64::from_le_bytes(rec[8..16].try_into().unwrap());
        let fs = Fs {
            ld,
            state: Mutex::new(State {
                inodes: HashMap::new(),
                open: HashMap::new(),
                next_ino: reserved,
                ino_reserved: reserved,
            }),
            opts,
            damaged: std::sync::OnceLock::new(),
            repairing: std::sync::atomic::AtomicBool::new(false),
        };
        fs.get_inode(&mut fs.lock(), ROOT_INO)?;
        if !fs.opts.read_only {
            let orphans = fs.ld.indices(ORPHAN_LIST, 0, usize::MAX)?;
            for ino in orphans {
                let mut tx = fs.begin_free()?;
                let r = tx.destroy(ino);
                tx.end()?;
                r?;
            }
        }
        Ok(fs)
    }

    pub fn logical_disk(&self) -> &Arc<dyn LogicalDisk> {
        &self.ld
    }

    /// Why the file system turned read-only while mounted (metadata found
    /// corrupt), if it did.
    pub fn damaged(&self) -> Option<String> {
        self.damaged.get().cloned()
    }

    /// Metadata was found corrupt (`what` says where): logs it, turns the
    /// file system read-only (outside a repair) and returns the error for
    /// the operation that found it.
    fn metadata_corrupt(&self, what: String) -> FsError {
        if !self.repairing.load(std::sync::atomic::Ordering::Relaxed) {
            if self.damaged.set(what.clone()).is_ok() {
                eprintln!(
                    "ldfs: metadata corruption: {what}; the file system is now read-only (run ldfs fsck)"
                );
            } else {
                eprintln!("ldfs: metadata corruption: {what}");
            }
        }
        FsError::Io(what)
    }

    /// Fails with `ReadOnly` once metadata was found corrupt (a lock-free
    /// check: it runs before every modifying operation).
    fn check_writable(&self) -> FsResult<()> {
        if self.opts.read_only {
            return Err(FsError::ReadOnly);
        }
        if self.damaged.get().is_some()
            && !self.repairing.load(std::sync::atomic::Ordering::Relaxed)
        {
            return Err(FsError::ReadOnly);
        }
        Ok(())
    }

    /// Reads a metadata block (an inode record or a directory bucket): a
    /// block failing its checksum is metadata corruption.
    fn read_meta(&self, list: ListId, index: u64, what: &str) -> FsResult<Option<Vec<u8>>> {
        match self.ld.read(list, index) {
            Ok(b) => Ok(b),
            Err(LdError::Corrupt(c)) => Err(self.metadata_corrupt(format!("{what}: {c}"))),
            Err(e) => Err(e.into()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .expect("fs state poisoned by an earlier panic")
    }

    fn now(&self) -> Time {
        (self.opts.clock)()
    }

    /// Starts an operation that frees space (unlink, rmdir, rename over a
    /// name, attribute changes and truncation, removing an attribute,
    /// destroying an orphan). It writes only metadata (records that replace
    /// others, small marks, deletes), and reserves room for them with
    /// `reserve_freeing`, which may use the LD's metadata share: it works on
    /// a full file system and cannot run out half-way.
    fn begin_free(&self) -> FsResult<Tx<'_>> {
        self.check_writable()?;
        let st = self.lock();
        let aru = self.ld.begin_aru()?;
        // Space for its metadata records from the LD's metadata share, so
        // it works on a full device yet cannot fail half-way (the ARU would
        // commit half an operation): either this succeeds, or nothing
        // changed.
        if let Err(e) = self.ld.reserve_freeing(aru, META_RESERVE) {
            let _ = self.ld.end_aru(aru);
            return Err(e.into());
        }
        Ok(Tx { fs: self, aru, st })
    }

    /// Starts an operation: takes the fs lock, opens an ARU and reserves the
    /// space it may write (`data` bytes of file data plus metadata).
    fn begin(&self, data: u64) -> FsResult<Tx<'_>> {
        self.check_writable()?;
        let st = self.lock();
        let aru = self.ld.begin_aru()?;
        let tx = Tx { fs: self, aru, st };
        let need = data
            .saturating_add(data / BLOCK_BYTES * 64)
            .saturating_add(META_RESERVE);
        if let Err(e) = self.ld.reserve(aru, need) {
            let _ = self.ld.end_aru(aru);
            return Err(e.into());
        }
        Ok(tx)
    }

    fn get_inode(&self, st: &mut State, ino: u64) -> FsResult<Inode> {
        if let Some(i) = st.inodes.get(&ino) {
            return Ok(i.clone());
        }
        let b = self
            .read_meta(INODE_LIST, ino, &format!("inode {ino}"))?
            .ok_or(FsError::NotFound)?;
        let i = Inode::decode(ino, &b, ino)
            .map_err(|c| self.metadata_corrupt(format!("inode {ino}: {c}")))?;
        if st.inodes.len() >= INODE_CACHE_MAX {
            let open = &st.open;
            st.inodes
                .retain(|k, _| open.contains_key(k) || *k == ROOT_INO);
        }
        st.inodes.insert(ino, i.clone());
        Ok(i)
    }

    fn attr(&self, i: &Inode) -> Attr {
        let blocks = match i.kind() {
            Kind::File if i.list != 0 => i.size.div_ceil(512),
            Kind::File | Kind::Symlink => (i.inline.len() as u64).div_ceil(512),
            _ => 0,
        };
        Attr {
            ino: i.ino,
            generation: i.generation,
            size: if i.kind() == Kind::Dir {
                i.size * 32
            } else {
                i.size
            },
            blocks,
            atime: i.atime,
            mtime: i.mtime,
            ctime: i.ctime,
            kind: i.kind(),
            perm: (i.mode & 0o7777) as u16,
            nlink: i.nlink,
            uid: i.uid,
            gid: i.gid,
            rdev: i.rdev as u32,
        }
    }

    // ---- reading ------------------------------------------------------------

    pub fn getattr(&self, ino: u64) -> FsResult<Attr> {
        let mut st = self.lock();
        let i = self.get_inode(&mut st, ino)?;
        Ok(self.attr(&i))
    }

    pub fn lookup(&self, parent: u64, name: &[u8]) -> FsResult<Attr> {
        if name.len() > dir::NAME_MAX {
            return Err(FsError::NameTooLong);
        }
        let mut st = self.lock();
        let p = self.get_inode(&mut st, parent)?;
        if p.kind() != Kind::Dir {
            return Err(FsError::NotDir);
        }
        let ino = match name {
            b"." => parent,
            b".." => p.parent,
            _ => self.find(&p, name)?.ok_or(FsError::NotFound)?.ino,
        };
        let i = self.get_inode(&mut st, ino)?;
        Ok(self.attr(&i))
    }

    fn bucket(&self, d: &Inode, name: &[u8]) -> FsResult<(u64, Vec<dir::Entry>)> {
        let idx = dir::bucket(name);
        let what = || format!("directory {} bucket {idx}", d.ino);
        let entries = match self.read_meta(ListId(d.list), idx, &what())? {
            None => Vec::new(),
            Some(b) => dir::decode(&b, d.ino, idx)
                .map_err(|c| self.metadata_corrupt(format!("{}: {c}", what())))?,
        };
        Ok((idx, entries))
    }

    fn find(&self, d: &Inode, name: &[u8]) -> FsResult<Option<dir::Entry>> {
        let (_, entries) = self.bucket(d, name)?;
        Ok(entries.into_iter().find(|e| e.name == name))
    }

    /// The decoded inode record (`ldfs inspect --inode`): every field,
    /// including the list that holds the file's blocks or the buckets.
    pub fn inode_record(&self, ino: u64) -> FsResult<inode::Inode> {
        let mut st = self.lock();
        self.get_inode(&mut st, ino)
    }

    pub fn readlink(&self, ino: u64) -> FsResult<Vec<u8>> {
        let mut st = self.lock();
        let i = self.get_inode(&mut st, ino)?;
        if i.kind() != Kind::Symlink {
            return Err(FsError::Invalid("not a symlink".into()));
        }
        Ok(i.inline)
    }

    /// Reads up to `size` bytes at `offset`.
    pub fn read(&self, ino: u64, offset: u64, size: u32) -> FsResult<Vec<u8>> {
        let i = {
            let mut st = self.lock();
            self.get_inode(&mut st, ino)?
        };
        match i.kind() {
            Kind::File => {}
            Kind::Dir => return Err(FsError::IsDir),
            _ => return Err(FsError::Invalid("not a regular file".into())),
        }
        if offset >= i.size {
            return Ok(Vec::new());
        }
        let end = (offset + size as u64).min(i.size);
        if i.list == 0 {
            return Ok(i.inline[offset as usize..end as usize].to_vec());
        }
        let mut out = vec![0u8; (end - offset) as usize];
        let list = ListId(i.list);
        let first = offset / BLOCK_BYTES;
        let last = (end - 1) / BLOCK_BYTES;
        // The present blocks, read in runs by the LD (holes stay zero).
        let mut from = first;
        while from <= last {
            let blocks = match self.ld.read_range(list, from..last + 1, 256) {
                Ok(b) => b,
                Err(e) => {
                    // Name the block that failed: read them one by one.
                    for b in self.ld.indices(list, from, 256)? {
                        if b > last {
                            break;
                        }
                        if let Err(e) = self.ld.read(list, b) {
                            eprintln!("ldfs: inode {ino} offset {}: {e}", b * BLOCK_BYTES);
                            return Err(e.into());
                        }
                    }
                    eprintln!("ldfs: inode {ino} offset {}: {e}", from * BLOCK_BYTES);
                    return Err(e.into());
                }
            };
            let Some(&(next, _)) = blocks.last() else {
                break;
            };
            for (b, data) in blocks {
                let bstart = b * BLOCK_BYTES;
                let lo = offset.max(bstart);
                let hi = end.min(bstart + data.len() as u64);
                if lo < hi {
                    out[(lo - offset) as usize..(hi - offset) as usize]
                        .copy_from_slice(&data[(lo - bstart) as usize..(hi - bstart) as usize]);
                }
            }
            from = next + 1;
        }
        Ok(out)
    }

    /// Directory entries after `offset` (0 = from the start), at most `max`.
    pub fn readdir(&self, ino: u64, offset: i64, max: usize) -> FsResult<Vec<DirEntry>> {
        let mut st = self.lock();
        let d = self.get_inode(&mut st, ino)?;
        if d.kind() != Kind::Dir {
            return Err(FsError::NotDir);
        }
        let mut out = Vec::new();
        if offset < 1 {
            out.push(DirEntry {
                ino,
                next: 1,
                kind: Kind::Dir,
                name: b".".to_vec(),
            });
        }
        if offset < 2 {
            out.push(DirEntry {
                ino: d.parent,
                next: 2,
                kind: Kind::Dir,
                name: b"..".to_vec(),
            });
        }
        let (mut bucket, mut slot) = if offset < 3 {
            (0, 0)
        } else {
            dir::resume(offset)
        };
        let list = ListId(d.list);
        while out.len() < max {
            let idx = self.ld.indices(list, bucket, 64)?;
            if idx.is_empty() {
                break;
            }
            for b in idx {
                let what = || format!("directory {ino} bucket {b}");
                let Some(raw) = self.read_meta(list, b, &what())? else {
                    continue;
                };
                let entries = dir::decode(&raw, ino, b)
                    .map_err(|c| self.metadata_corrupt(format!("{}: {c}", what())))?;
                let skip = if b == bucket { slot } else { 0 };
                for (s, e) in entries.into_iter().enumerate().skip(skip) {
                    out.push(DirEntry {
                        ino: e.ino,
                        next: dir::cookie(b, s),
                        kind: Kind::from_code(e.kind).unwrap_or(Kind::File),
                        name: e.name,
                    });
                }
                bucket = b + 1;
                slot = 0;
                if out.len() >= max {
                    break;
                }
            }
        }
        Ok(out)
    }

    pub fn statfs(&self) -> StatFs {
        let s = self.ld.space();
        StatFs {
            block_bytes: BLOCK_BYTES,
            blocks: s.capacity_bytes / BLOCK_BYTES,
            blocks_free: s.available_bytes / BLOCK_BYTES,
            files: self.lock().next_ino,
            name_max: dir::NAME_MAX as u32,
        }
    }

    pub fn getxattr(&self, ino: u64, name: &[u8]) -> FsResult<Vec<u8>> {
        let mut st = self.lock();
        let i = self.get_inode(&mut st, ino)?;
        i.xattrs
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
            .ok_or(FsError::NoAttr)
    }

    pub fn listxattr(&self, ino: u64) -> FsResult<Vec<Vec<u8>>> {
        let mut st = self.lock();
        let i = self.get_inode(&mut st, ino)?;
        Ok(i.xattrs.iter().map(|(n, _)| n.clone()).collect())
    }

    /// The next offset `>= offset` holding data (`Data`) or a hole (`Hole`).
    pub fn lseek(&self, ino: u64, offset: u64, whence: Whence) -> FsResult<u64> {
        let i = {
            let mut st = self.lock();
            self.get_inode(&mut st, ino)?
        };
        if offset >= i.size {
            return Err(FsError::NoOffset);
        }
        if i.list == 0 {
            return Ok(match whence {
                Whence::Data => offset,
                Whence::Hole => i.size,
            });
        }
        let list = ListId(i.list);
        let mut b = offset / BLOCK_BYTES;
        match whence {
            Whence::Data => {
                let next = self.ld.indices(list, b, 1)?;
                match next.first() {
                    Some(&n) if n * BLOCK_BYTES < i.size => Ok((n * BLOCK_BYTES).max(offset)),
                    _ => Err(FsError::NoOffset),
                }
            }
            Whence::Hole => loop {
                let run = self.ld.indices(list, b, 256)?;
                let mut expect = b;
                for n in &run {
                    if *n != expect {
                        break;
                    }
                    expect += 1;
                }
                if expect * BLOCK_BYTES >= i.size {
                    return Ok(i.size);
                }
                if expect < b + run.len() as u64 || run.len() < 256 {
                    return Ok((expect * BLOCK_BYTES).max(offset));
                }
                b = expect;
            },
        }
    }

    // ---- open handles -------------------------------------------------------

    /// Counts an open handle (file or directory): `pin(ino, 1)`.
    pub fn open(&self, ino: u64) -> FsResult<Attr> {
        let mut st = self.lock();
        let i = self.get_inode(&mut st, ino)?;
        *st.open.entry(ino).or_insert(0) += 1;
        Ok(self.attr(&i))
    }

    /// Keeps `ino` alive for `n` more references (open handles, or the
    /// kernel's lookup references when FUSE tracks lifetime by FORGET).
    pub fn pin(&self, ino: u64, n: u64) {
        *self.lock().open.entry(ino).or_insert(0) += n;
    }

    /// The last release of an unlinked inode destroys it: `unpin(ino, 1)`.
    pub fn release(&self, ino: u64) -> FsResult<()> {
        self.unpin(ino, 1)
    }

    /// Drops `n` references; an unlinked inode whose last reference goes is
    /// destroyed (with its orphan record) in one ARU.
    pub fn unpin(&self, ino: u64, n: u64) -> FsResult<()> {
        let last = {
            let mut st = self.lock();
            let Some(count) = st.open.get_mut(&ino) else {
                return Ok(()); // never pinned (e.g. pinned before a remount)
            };
            *count = count.saturating_sub(n);
            if *count == 0 {
                st.open.remove(&ino);
                match self.get_inode(&mut st, ino) {
                    Ok(i) => i.nlink == 0,
                    Err(_) => false,
                }
            } else {
                false
            }
        };
        if last && !self.opts.read_only {
            let mut tx = self.begin_free()?;
            let r = tx.destroy(ino);
            tx.end()?;
            r?;
        }
        Ok(())
    }

    pub fn fsync(&self) -> FsResult<()> {
        Ok(self.ld.flush()?)
    }

    // ---- changing ---------------------------------------------------------

    pub fn setattr(&self, ino: u64, sa: &SetAttr) -> FsResult<Attr> {
        // Attribute changes rewrite the inode record in place; truncation
        // frees blocks (a grown file is sparse). Neither needs a reservation.
        let mut tx = self.begin_free()?;
        let r = tx.setattr(ino, sa);
        tx.end()?;
        r
    }

    pub fn mknod(
        &self,
        ctx: Ctx,
        parent: u64,
        name: &[u8],
        mode: u32,
        rdev: u64,
    ) -> FsResult<Attr> {
        let kind =
            Kind::from_mode(mode).ok_or_else(|| FsError::Invalid(format!("mode {mode:o}")))?;
        if kind == Kind::Dir || kind == Kind::Symlink {
            return Err(FsError::Invalid("mknod of a directory or symlink".into()));
        }
        let mut tx = self.begin(0)?;
        let r = tx.create(ctx, parent, name, mode, rdev, &[]);
        tx.end()?;
        r
    }

    pub fn mkdir(&self, ctx: Ctx, parent: u64, name: &[u8], mode: u32) -> FsResult<Attr> {
        let mut tx = self.begin(0)?;
        let r = tx.create(
            ctx,
            parent,
            name,
            Kind::Dir.mode_bits() | (mode & 0o7777),
            0,
            &[],
        );
        tx.end()?;
        r
    }

    pub fn symlink(&self, ctx: Ctx, parent: u64, name: &[u8], target: &[u8]) -> FsResult<Attr> {
        if target.is_empty() || target.len() > 4095 {
            return Err(FsError::NameTooLong);
        }
        let mut tx = self.begin(0)?;
        let r = tx.create(
            ctx,
            parent,
            name,
            Kind::Symlink.mode_bits() | 0o777,
            0,
            target,
        );
        tx.end()?;
        r
    }

    pub fn unlink(&self, parent: u64, name: &[u8]) -> FsResult<()> {
        let mut tx = self.begin_free()?;
        let r = tx.remove(parent, name, false);
        tx.end()?;
        r
    }

    pub fn rmdir(&self, parent: u64, name: &[u8]) -> FsResult<()> {
        let mut tx = self.begin_free()?;
        let r = tx.remove(parent, name, true);
        tx.end()?;
        r
    }

    pub fn link(&self, ino: u64, parent: u64, name: &[u8]) -> FsResult<Attr> {
        let mut tx = self.begin(0)?;
        let r = tx.link(ino, parent, name);
        tx.end()?;
        r
    }

    pub fn rename(
        &self,
        parent: u64,
        name: &[u8],
        newparent: u64,
        newname: &[u8],
        flags: RenameFlags,
    ) -> FsResult<()> {
        let mut tx = self.begin_free()?;
        let r = tx.rename(parent, name, newparent, newname, flags);
        tx.end()?;
        r
    }

    /// Writes `data` at `offset`. Like the kernel's `file_remove_privs`, a
    /// write drops the file's `security.capability` attribute; the caller
    /// says whether it also clears set-user-ID and set-group-ID (a writer
    /// without CAP_FSETID): see `write_killing_suidgid`.
    pub fn write(&self, ino: u64, offset: u64, data: &[u8]) -> FsResult<usize> {
        self.write_killing_suidgid(ino, offset, data, false)
    }

    /// `write`, also clearing set-user-ID, and set-group-ID if the group may
    /// execute, when `kill_suidgid` (FUSE_WRITE_KILL_SUIDGID: the file
    /// system owns privilege killing under FUSE_HANDLE_KILLPRIV_V2).
    pub fn write_killing_suidgid(
        &self,
        ino: u64,
        offset: u64,
        data: &[u8],
        kill_suidgid: bool,
    ) -> FsResult<usize> {
        let mut tx = self.begin(data.len() as u64)?;
        let r = tx.write(ino, offset, data, kill_suidgid);
        tx.end()?;
        r
    }

    pub fn setxattr(&self, ino: u64, name: &[u8], value: &[u8], mode: XattrMode) -> FsResult<()> {
        let mut tx = self.begin(0)?;
        let r = tx.setxattr(ino, name, value, mode);
        tx.end()?;
        r
    }

    pub fn removexattr(&self, ino: u64, name: &[u8]) -> FsResult<()> {
        let mut tx = self.begin_free()?;
        let r = tx.removexattr(ino, name);
        tx.end()?;
        r
    }

    pub fn fallocate(&self, ino: u64, offset: u64, len: u64, mode: FallocMode) -> FsResult<()> {
        let data = if mode.punch_hole || mode.zero_range {
            0
        } else {
            len
        };
        let mut tx = self.begin(data)?;
        let r = tx.fallocate(ino, offset, len, mode);
        tx.end()?;
        r
    }
}

impl Tx<'_> {
    fn end(self) -> FsResult<()> {
        let Tx { fs, aru, st } = self;
        let r = fs.ld.end_aru(aru);
        drop(st);
        Ok(r?)
    }

    fn ld(&self) -> &dyn LogicalDisk {
        &*self.fs.ld
    }

    fn inode(&mut self, ino: u64) -> FsResult<Inode> {
        self.fs.get_inode(&mut self.st, ino)
    }

    fn dir_inode(&mut self, ino: u64) -> FsResult<Inode> {
        let d = self.inode(ino)?;
        if d.kind() != Kind::Dir {
            return Err(FsError::NotDir);
        }
        Ok(d)
    }

    fn put(&mut self, i: &Inode) -> FsResult<()> {
        self.ld()
            .write(Some(self.aru), INODE_LIST, i.ino, &i.encode())?;
        self.st.inodes.insert(i.ino, i.clone());
        Ok(())
    }

    fn alloc_ino(&mut self) -> FsResult<u64> {
        let ino = self.st.next_ino;
        if ino >= self.st.ino_reserved {
            let reserved = ino + INO_BATCH;
            self.ld()
                .write(Some(self.aru), META_LIST, 0, &encode_fs_record(reserved))?;
            self.st.ino_reserved = reserved;
        }
        self.st.next_ino += 1;
        Ok(ino)
    }

    fn write_bucket(&mut self, d: &Inode, idx: u64, entries: &[dir::Entry]) -> FsResult<()> {
        let list = ListId(d.list);
        if entries.is_empty() {
            self.ld().delete(Some(self.aru), list, idx)?;
        } else {
            self.ld()
                .write(Some(self.aru), list, idx, &dir::encode(entries))?;
        }
        Ok(())
    }

    fn add_entry(&mut self, d: &mut Inode, name: &[u8], ino: u64, kind: Kind) -> FsResult<()> {
        let (idx, entries) = self.fs.bucket(d, name)?;
        self.add_found(d, idx, entries, name, ino, kind)
    }

    /// Reads the bucket `name` goes to and checks, before anything changes,
    /// that the name is new and the bucket has room.
    fn bucket_for_new(&self, d: &Inode, name: &[u8]) -> FsResult<(u64, Vec<dir::Entry>)> {
        let (idx, entries) = self.fs.bucket(d, name)?;
        if entries.iter().any(|e| e.name == name) {
            return Err(FsError::Exists);
        }
        if entries.len() >= dir::BUCKET_MAX {
            return Err(FsError::NoSpace);
        }
        Ok((idx, entries))
    }

    /// Adds an entry to a bucket already read (by `bucket_for_new`).
    fn add_found(
        &mut self,
        d: &mut Inode,
        idx: u64,
        mut entries: Vec<dir::Entry>,
        name: &[u8],
        ino: u64,
        kind: Kind,
    ) -> FsResult<()> {
        if entries.len() >= dir::BUCKET_MAX {
            return Err(FsError::NoSpace);
        }
        entries.push(dir::Entry {
            name: name.to_vec(),
            ino,
            kind: kind.code(),
        });
        self.write_bucket(d, idx, &entries)?;
        d.size += 1;
        Ok(())
    }

    fn remove_entry(&mut self, d: &mut Inode, name: &[u8]) -> FsResult<()> {
        let (idx, mut entries) = self.fs.bucket(d, name)?;
        let before = entries.len();
        entries.retain(|e| e.name != name);
        // Callers found the name first, so exactly one goes unless the
        // bucket on disk lies (a duplicated name): an error, not a panic.
        if before != entries.len() + 1 {
            return Err(FsError::Io(format!(
                "directory {} bucket {idx}: {} entries named {:?}",
                d.ino,
                before - entries.len(),
                String::from_utf8_lossy(name)
            )));
        }
        self.write_bucket(d, idx, &entries)?;
        d.size = d.size.saturating_sub(1);
        Ok(())
    }

    fn touch(&self, i: &mut Inode, m: bool, c: bool) {
        let now = self.fs.now();
        if m {
            i.mtime = now;
        }
        if c {
            i.ctime = now;
        }
    }

    fn create(
        &mut self,
        ctx: Ctx,
        parent: u64,
        name: &[u8],
        mode: u32,
        rdev: u64,
        target: &[u8],
    ) -> FsResult<Attr> {
        check_name(name)?;
        let kind =
            Kind::from_mode(mode).ok_or_else(|| FsError::Invalid(format!("mode {mode:o}")))?;
        let mut p = self.dir_inode(parent)?;
        if p.nlink == 0 {
            return Err(FsError::NotFound);
        }
        let (idx, entries) = self.bucket_for_new(&p, name)?;
        if kind == Kind::Dir && p.nlink >= LINK_MAX {
            return Err(FsError::TooManyLinks);
        }
        let ino = self.alloc_ino()?;
        // BSD semantics for setgid directories: the group comes from the
        // directory, and subdirectories inherit the bit.
        let mut mode = mode;
        let gid = if p.mode & 0o2000 != 0 {
            if kind == Kind::Dir {
                mode |= 0o2000;
            }
            p.gid
        } else {
            ctx.gid
        };
        let list = if kind == Kind::Dir {
            self.ld()
                .create_list(
                    Some(self.aru),
                    ListHints {
                        kind: ListKind::Metadata,
                        near: Some(ListId(p.list)),
                        ..Default::default()
                    },
                )?
                .0
        } else {
            0
        };
        let now = self.fs.now();
        let i = Inode {
            ino,
            generation: 1,
            mode,
            uid: ctx.uid,
            gid,
            nlink: if kind == Kind::Dir { 2 } else { 1 },
            size: if kind == Kind::Symlink {
                target.len() as u64
            } else {
                0
            },
            list,
            rdev,
            parent: if kind == Kind::Dir { parent } else { 0 },
            atime: now,
            mtime: now,
            ctime: now,
            inline: target.to_vec(),
            xattrs: Vec::new(),
        };
        self.put(&i)?;
        self.add_found(&mut p, idx, entries, name, ino, kind)?;
        if kind == Kind::Dir {
            p.nlink += 1;
        }
        self.touch(&mut p, true, true);
        self.put(&p)?;
        Ok(self.fs.attr(&i))
    }

    /// Drops one link of `i` (already removed from its directory); the
    /// inode goes to the orphan list if open, else is destroyed.
    fn drop_link(&mut self, mut i: Inode) -> FsResult<()> {
        i.nlink = if i.kind() == Kind::Dir {
            0
        } else {
            i.nlink.saturating_sub(1)
        };
        self.touch(&mut i, false, true);
        if i.nlink > 0 {
            return self.put(&i);
        }
        if self.st.open.contains_key(&i.ino) {
            self.put(&i)?;
            self.ld().write(Some(self.aru), ORPHAN_LIST, i.ino, &[1])?;
            Ok(())
        } else {
            self.destroy_inode(&i)
        }
    }

    fn destroy_inode(&mut self, i: &Inode) -> FsResult<()> {
        if i.list != 0 {
            self.ld().delete_list(Some(self.aru), ListId(i.list))?;
        }
        self.ld().delete(Some(self.aru), INODE_LIST, i.ino)?;
        self.st.inodes.remove(&i.ino);
        Ok(())
    }

    /// Destroys an orphan (last close, or mount after a crash).
    fn destroy(&mut self, ino: u64) -> FsResult<()> {
        match self.inode(ino) {
            Ok(i) if i.nlink == 0 => self.destroy_inode(&i)?,
            Ok(_) | Err(FsError::NotFound) => {}
            Err(e) => return Err(e),
        }
        self.ld().delete(Some(self.aru), ORPHAN_LIST, ino)?;
        Ok(())
    }

    fn remove(&mut self, parent: u64, name: &[u8], want_dir: bool) -> FsResult<()> {
        if name.len() > dir::NAME_MAX {
            return Err(FsError::NameTooLong);
        }
        if name == b"." || name == b".." {
            return Err(if want_dir {
                FsError::Invalid("rmdir of . or ..".into())
            } else {
                FsError::IsDir
            });
        }
        let mut p = self.dir_inode(parent)?;
        let e = self.fs.find(&p, name)?.ok_or(FsError::NotFound)?;
        let i = self.inode(e.ino)?;
        if want_dir {
            if i.kind() != Kind::Dir {
                return Err(FsError::NotDir);
            }
            if i.size != 0 {
                return Err(FsError::NotEmpty);
            }
        } else if i.kind() == Kind::Dir {
            return Err(FsError::IsDir);
        }
        self.remove_entry(&mut p, name)?;
        if i.kind() == Kind::Dir {
            p.nlink = p.nlink.saturating_sub(1);
        }
        self.touch(&mut p, true, true);
        self.put(&p)?;
        self.drop_link(i)
    }

    fn link(&mut self, ino: u64, parent: u64, name: &[u8]) -> FsResult<Attr> {
        check_name(name)?;
        let mut i = self.inode(ino)?;
        if i.kind() == Kind::Dir {
            return Err(FsError::Perm);
        }
        if i.nlink >= LINK_MAX {
            return Err(FsError::TooManyLinks);
        }
        if i.nlink == 0 {
            return Err(FsError::NotFound);
        }
        let mut p = self.dir_inode(parent)?;
        let (idx, entries) = self.bucket_for_new(&p, name)?;
        self.add_found(&mut p, idx, entries, name, ino, i.kind())?;
        self.touch(&mut p, true, true);
        self.put(&p)?;
        i.nlink += 1;
        self.touch(&mut i, false, true);
        self.put(&i)?;
        Ok(self.fs.attr(&i))
    }

    /// Whether `ancestor` is `ino` or one of its ancestors.
    fn is_ancestor(&mut self, ancestor: u64, mut ino: u64) -> FsResult<bool> {
        for _ in 0..100_000 {
            if ino == ancestor {
                return Ok(true);
            }
            if ino == ROOT_INO {
                return Ok(false);
            }
            ino = self.inode(ino)?.parent;
        }
        Err(FsError::Io("directory tree has a cycle".into()))
    }

    fn rename(
        &mut self,
        parent: u64,
        name: &[u8],
        newparent: u64,
        newname: &[u8],
        flags: RenameFlags,
    ) -> FsResult<()> {
        check_name(newname)?;
        if name.len() > dir::NAME_MAX {
            return Err(FsError::NameTooLong);
        }
        if flags.noreplace && flags.exchange {
            return Err(FsError::Invalid(
                "RENAME_NOREPLACE with RENAME_EXCHANGE".into(),
            ));
        }
        let p = self.dir_inode(parent)?;
        let src = self.fs.find(&p, name)?.ok_or(FsError::NotFound)?;
        let np = self.dir_inode(newparent)?;
        let dst = self.fs.find(&np, newname)?;
        let si = self.inode(src.ino)?;
        if si.kind() == Kind::Dir && self.is_ancestor(src.ino, newparent)? {
            return Err(FsError::Invalid(
                "a directory cannot move into itself".into(),
            ));
        }
        if let Some(d) = &dst {
            if d.ino == src.ino {
                return Ok(()); // same inode: POSIX says do nothing
            }
            if flags.noreplace {
                return Err(FsError::Exists);
            }
        } else if flags.exchange {
            return Err(FsError::NotFound);
        }
        if flags.exchange {
            let d = dst.expect("checked above");
            let di = self.inode(d.ino)?;
            if di.kind() == Kind::Dir && self.is_ancestor(d.ino, parent)? {
                return Err(FsError::Invalid(
                    "a directory cannot move into itself".into(),
                ));
            }
            return self.exchange(parent, name, si, newparent, newname, di);
        }
        let replaced = match &dst {
            Some(d) => {
                let di = self.inode(d.ino)?;
                match (si.kind() == Kind::Dir, di.kind() == Kind::Dir) {
                    (true, false) => return Err(FsError::NotDir),
                    (false, true) => return Err(FsError::IsDir),
                    (true, true) if di.size != 0 => return Err(FsError::NotEmpty),
                    _ => {}
                }
                Some(di)
            }
            None => None,
        };
        if replaced.is_none() && !(parent == newparent && dir::bucket(name) == dir::bucket(newname))
        {
            // The new name needs a slot; check now, before anything changes.
            self.bucket_for_new(&np, newname)?;
        }
        let is_dir = si.kind() == Kind::Dir;
        if is_dir && parent != newparent && replaced.is_none() && np.nlink >= LINK_MAX {
            return Err(FsError::TooManyLinks);
        }
        // Checks done; now change, each step re-reading what the last wrote.
        if let Some(di) = replaced {
            let mut np = self.inode(newparent)?;
            self.remove_entry(&mut np, newname)?;
            if di.kind() == Kind::Dir {
                np.nlink = np.nlink.saturating_sub(1);
            }
            self.put(&np)?;
            self.drop_link(di)?;
        }
        let mut p = self.inode(parent)?;
        self.remove_entry(&mut p, name)?;
        if is_dir && parent != newparent {
            p.nlink = p.nlink.saturating_sub(1);
        }
        self.touch(&mut p, true, true);
        self.put(&p)?;
        let mut np = self.inode(newparent)?;
        self.add_entry(&mut np, newname, src.ino, si.kind())?;
        if is_dir && parent != newparent {
            np.nlink += 1;
        }
        self.touch(&mut np, true, true);
        self.put(&np)?;
        let mut si = self.inode(src.ino)?;
        if is_dir {
            si.parent = newparent;
        }
        self.touch(&mut si, false, true);
        self.put(&si)
    }

    fn exchange(
        &mut self,
        parent: u64,
        name: &[u8],
        a: Inode,
        newparent: u64,
        newname: &[u8],
        b: Inode,
    ) -> FsResult<()> {
        // Swap the inode numbers the two entries name.
        let mut p = self.inode(parent)?;
        self.remove_entry(&mut p, name)?;
        self.add_entry(&mut p, name, b.ino, b.kind())?;
        self.touch(&mut p, true, true);
        self.put(&p)?;
        let mut np = self.inode(newparent)?;
        self.remove_entry(&mut np, newname)?;
        self.add_entry(&mut np, newname, a.ino, a.kind())?;
        self.touch(&mut np, true, true);
        self.put(&np)?;
        if parent != newparent {
            let (ad, bd) = (a.kind() == Kind::Dir, b.kind() == Kind::Dir);
            if ad != bd {
                let mut p = self.inode(parent)?;
                let mut np = self.inode(newparent)?;
                if ad {
                    np.nlink += 1;
                    p.nlink = p.nlink.saturating_sub(1);
                } else {
                    p.nlink += 1;
                    np.nlink = np.nlink.saturating_sub(1);
                }
                self.put(&p)?;
                self.put(&np)?;
            }
        }
        for (ino, newp) in [(a.ino, newparent), (b.ino, parent)] {
            let mut i = self.inode(ino)?;
            if i.kind() == Kind::Dir {
                i.parent = newp;
            }
            self.touch(&mut i, false, true);
            self.put(&i)?;
        }
        Ok(())
    }

    fn setattr(&mut self, ino: u64, sa: &SetAttr) -> FsResult<Attr> {
        let mut i = self.inode(ino)?;
        if let Some(size) = sa.size {
            match i.kind() {
                Kind::File => {}
                Kind::Dir => return Err(FsError::IsDir),
                _ => return Err(FsError::Invalid("truncate of a special file".into())),
            }
            if size > MAX_FILE_BYTES {
                return Err(FsError::FileTooBig);
            }
            self.truncate(&mut i, size)?;
            drop_privileges(&mut i, sa.kill_suidgid);
            self.touch(&mut i, true, true);
        }
        if let Some(mode) = sa.mode {
            i.mode = (i.mode & 0o170000) | (mode & 0o7777);
            self.touch(&mut i, false, true);
        }
        if sa.uid.is_some() || sa.gid.is_some() {
            let changes = sa.uid.is_some_and(|u| u != i.uid) || sa.gid.is_some_and(|g| g != i.gid);
            if let Some(u) = sa.uid {
                i.uid = u;
            }
            if let Some(g) = sa.gid {
                i.gid = g;
            }
            // chown clears set-user-ID, and set-group-ID when the group
            // can execute (POSIX chown(2)), and the file capability.
            if changes {
                drop_privileges(&mut i, true);
            }
            self.touch(&mut i, false, true);
        }
        let now = self.fs.now();
        if let Some(t) = sa.atime {
            i.atime = match t {
                TimeSet::Now => now,
                TimeSet::At(t) => t,
            };
            i.ctime = now;
        }
        if let Some(t) = sa.mtime {
            i.mtime = match t {
                TimeSet::Now => now,
                TimeSet::At(t) => t,
            };
            i.ctime = now;
        }
        self.put(&i)?;
        Ok(self.fs.attr(&i))
    }

    /// Moves inline data into a list of blocks.
    fn spill(&mut self, i: &mut Inode) -> FsResult<()> {
        if i.list != 0 {
            return Ok(());
        }
        let list = self.ld().create_list(
            Some(self.aru),
            ListHints {
                kind: ListKind::Data,
                ..Default::default()
            },
        )?;
        let data = std::mem::take(&mut i.inline);
        for (k, chunk) in data.chunks(BLOCK_BYTES as usize).enumerate() {
            self.ld().write(Some(self.aru), list, k as u64, chunk)?;
        }
        i.list = list.0;
        Ok(())
    }

    fn truncate(&mut self, i: &mut Inode, size: u64) -> FsResult<()> {
        if i.list == 0 {
            if size as usize <= INLINE_MAX {
                i.inline.resize(size as usize, 0);
                i.size = size;
                return Ok(());
            }
            self.spill(i)?;
        }
        let list = ListId(i.list);
        if size < i.size {
            let keep_blocks = size.div_ceil(BLOCK_BYTES);
            self.ld()
                .delete_range(Some(self.aru), list, keep_blocks..u64::MAX)?;
            let tail = size % BLOCK_BYTES;
            if tail != 0 {
                let b = size / BLOCK_BYTES;
                if let Some(mut data) = self.ld().read(list, b)? {
                    if data.len() as u64 > tail {
                        data.truncate(tail as usize);
                        self.ld().write(Some(self.aru), list, b, &data)?;
                    }
                }
            }
        }
        i.size = size;
        Ok(())
    }

    fn write(&mut self, ino: u64, offset: u64, data: &[u8], kill_suidgid: bool) -> FsResult<usize> {
        let mut i = self.inode(ino)?;
        match i.kind() {
            Kind::File => {}
            Kind::Dir => return Err(FsError::IsDir),
            _ => return Err(FsError::Invalid("write to a special file".into())),
        }
        if data.is_empty() {
            return Ok(0);
        }
        let end = offset
            .checked_add(data.len() as u64)
            .filter(|&e| e <= MAX_FILE_BYTES)
            .ok_or(FsError::FileTooBig)?;
        if i.list == 0 && end as usize <= INLINE_MAX {
            if i.inline.len() < end as usize {
                i.inline.resize(end as usize, 0);
            }
            i.inline[offset as usize..end as usize].copy_from_slice(data);
            i.size = i.size.max(end);
        } else {
            self.spill(&mut i)?;
            let list = ListId(i.list);
            let mut pos = offset;
            while pos < end {
                let b = pos / BLOCK_BYTES;
                let bstart = b * BLOCK_BYTES;
                let lo = (pos - bstart) as usize;
                let hi = ((end - bstart).min(BLOCK_BYTES)) as usize;
                let chunk = &data[(pos - offset) as usize..(pos - offset) as usize + (hi - lo)];
                if lo == 0 && hi == BLOCK_BYTES as usize {
                    self.ld().write(Some(self.aru), list, b, chunk)?;
                } else {
                    let mut block = self.ld().read(list, b)?.unwrap_or_default();
                    // Bytes of the block beyond the old size read as zeros.
                    let valid = i.size.saturating_sub(bstart).min(BLOCK_BYTES) as usize;
                    block.truncate(valid);
                    if block.len() < hi {
                        block.resize(hi, 0);
                    }
                    block[lo..hi].copy_from_slice(chunk);
                    self.ld().write(Some(self.aru), list, b, &block)?;
                }
                pos = bstart + hi as u64;
            }
            i.size = i.size.max(end);
        }
        drop_privileges(&mut i, kill_suidgid);
        self.touch(&mut i, true, true);
        self.put(&i)?;
        Ok(data.len())
    }

    fn setxattr(&mut self, ino: u64, name: &[u8], value: &[u8], mode: XattrMode) -> FsResult<()> {
        if name.is_empty() || name.len() > XATTR_NAME_MAX {
            return Err(FsError::Range);
        }
        let mut i = self.inode(ino)?;
        let pos = i.xattrs.binary_search_by(|(n, _)| n.as_slice().cmp(name));
        match (pos, mode) {
            (Ok(_), XattrMode::Create) => return Err(FsError::Exists),
            (Err(_), XattrMode::Replace) => return Err(FsError::NoAttr),
            _ => {}
        }
        let old = pos.map_or(0, |k| i.xattrs[k].0.len() + i.xattrs[k].1.len());
        if i.xattr_bytes() - old + name.len() + value.len() > XATTR_MAX
            || (pos.is_err() && i.xattrs.len() >= inode::XATTR_COUNT_MAX)
        {
            return Err(FsError::NoSpace);
        }
        match pos {
            Ok(k) => i.xattrs[k].1 = value.to_vec(),
            Err(k) => i.xattrs.insert(k, (name.to_vec(), value.to_vec())),
        }
        if name == b"system.posix_acl_access" {
            // The ACL's owner/group/other entries are the mode bits.
            if let Some(bits) = acl_mode_bits(value) {
                i.mode = (i.mode & !0o777) | bits;
            }
        }
        self.touch(&mut i, false, true);
        self.put(&i)
    }

    fn removexattr(&mut self, ino: u64, name: &[u8]) -> FsResult<()> {
        let mut i = self.inode(ino)?;
        let k = i
            .xattrs
            .binary_search_by(|(n, _)| n.as_slice().cmp(name))
            .map_err(|_| FsError::NoAttr)?;
        i.xattrs.remove(k);
        self.touch(&mut i, false, true);
        self.put(&i)
    }

    fn fallocate(&mut self, ino: u64, offset: u64, len: u64, mode: FallocMode) -> FsResult<()> {
        let mut i = self.inode(ino)?;
        if i.kind() != Kind::File {
            return Err(if i.kind() == Kind::Dir {
                FsError::IsDir
            } else {
                FsError::Invalid("fallocate of a special file".into())
            });
        }
        if len == 0 {
            return Err(FsError::Invalid("fallocate of 0 bytes".into()));
        }
        let end = offset
            .checked_add(len)
            .filter(|&e| e <= MAX_FILE_BYTES)
            .ok_or(FsError::FileTooBig)?;
        if mode.punch_hole && !mode.keep_size {
            // Linux requires KEEP_SIZE with PUNCH_HOLE.
            return Err(FsError::NotSupported);
        }
        if mode.punch_hole || mode.zero_range {
            let zero_to = end.min(i.size);
            if offset < zero_to {
                self.zero(&mut i, offset, zero_to)?;
            }
            if mode.zero_range && !mode.keep_size && end > i.size {
                self.truncate(&mut i, end)?;
            }
        } else {
            // Allocate: every hole in the range becomes a written block of
            // zeros, so the space is taken now (ENOSPC here, not later).
            if !mode.keep_size && end > i.size {
                self.truncate(&mut i, end)?;
            }
            if i.list == 0 && end as usize > INLINE_MAX {
                self.spill(&mut i)?;
            }
            if i.list != 0 {
                let list = ListId(i.list);
                let last = end.div_ceil(BLOCK_BYTES);
                let mut b = offset / BLOCK_BYTES;
                while b < last {
                    let present = self.ld().indices(list, b, 1)?;
                    let next = present.first().copied().unwrap_or(u64::MAX).min(last);
                    for h in b..next {
                        let start = h * BLOCK_BYTES;
                        // Within the size, a block is as long as the file
                        // lets it be; beyond it (KEEP_SIZE), a full block.
                        let blen = if start < i.size {
                            (i.size - start).min(BLOCK_BYTES)
                        } else {
                            BLOCK_BYTES
                        };
                        self.ld()
                            .write(Some(self.aru), list, h, &vec![0u8; blen as usize])?;
                    }
                    b = next.saturating_add(1);
                }
            }
        }
        self.touch(&mut i, true, true);
        self.put(&i)
    }

    /// Zeros `[from, to)` of a file (within its size): whole blocks become
    /// holes, partial ones are rewritten.
    fn zero(&mut self, i: &mut Inode, from: u64, to: u64) -> FsResult<()> {
        if i.list == 0 {
            i.inline[from as usize..to as usize].fill(0);
            return Ok(());
        }
        let list = ListId(i.list);
        let first_full = from.div_ceil(BLOCK_BYTES);
        let last_full = to / BLOCK_BYTES;
        if first_full < last_full {
            self.ld()
                .delete_range(Some(self.aru), list, first_full..last_full)?;
        }
        for b in [from / BLOCK_BYTES, to / BLOCK_BYTES] {
            let bstart = b * BLOCK_BYTES;
            if b >= first_full && b < last_full {
                continue;
            }
            let lo = from.max(bstart) - bstart;
            let hi = to.min(bstart + BLOCK_BYTES) - bstart;
            if lo >= hi {
                continue;
            }
            if let Some(mut block) = self.ld().read(list, b)? {
                let hi = (hi as usize).min(block.len());
                if (lo as usize) < hi {
                    block[lo as usize..hi].fill(0);
                    self.ld().write(Some(self.aru), list, b, &block)?;
                }
            }
        }
        Ok(())
    }
}

/// The mode bits an access ACL implies (its USER_OBJ, GROUP_OBJ or MASK,
/// and OTHER entries), if it parses.
fn acl_mode_bits(v: &[u8]) -> Option<u32> {
    if v.len() < 4 || !(v.len() - 4).is_multiple_of(8) || v[..4] != [2, 0, 0, 0] {
        return None;
    }
    let (mut user, mut group, mut mask, mut other) = (None, None, None, None);
    for e in v[4..].chunks(8) {
        let tag = u16::from_le_bytes([e[0], e[1]]);
        let perm = u16::from_le_bytes([e[2], e[3]]) as u32 & 7;
        match tag {
            0x01 => user = Some(perm),
            0x04 => group = Some(perm),
            0x10 => mask = Some(perm),
            0x20 => other = Some(perm),
            _ => {}
        }
    }
    Some((user? << 6) | (mask.or(group)? << 3) | other?)
}

/// A new, empty root directory whose buckets live in `list` (mkfs, and
/// fsck when the root's record is lost).
fn empty_root(list: ListId, ctx: Ctx) -> Inode {
    let now = system_time();
    Inode {
        ino: ROOT_INO,
        generation: 1,
        mode: Kind::Dir.mode_bits() | 0o755,
        uid: ctx.uid,
        gid: ctx.gid,
        nlink: 2,
        size: 0,
        list: list.0,
        rdev: 0,
        parent: ROOT_INO,
        atime: now,
        mtime: now,
        ctime: now,
        inline: Vec::new(),
        xattrs: Vec::new(),
    }
}

/// What a write, truncation or chown does to privileges (Linux's
/// `file_remove_privs`): the file capability always goes; set-user-ID, and
/// set-group-ID when the group may execute, go if `kill_suidgid` (never a
/// directory's: there they mean something else).
fn drop_privileges(i: &mut Inode, kill_suidgid: bool) {
    i.xattrs
        .retain(|(n, _)| n.as_slice() != b"security.capability");
    if kill_suidgid && i.kind() != Kind::Dir {
        i.mode &= !0o4000;
        if i.mode & 0o010 != 0 {
            i.mode &= !0o2000;
        }
    }
}
