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
//! - an operation commits whole or not at all, while mounted too: it reads
//!   and checks everything first (namespace operations build a `Plan` of
//!   the records they change, each written once), then reserves exactly
//!   the blocks it will write (so it does not run out of space half-way;
//!   operations that free space reserve from the LD's metadata share and
//!   work on a full file system), then writes. One that fails after its
//!   first change anyway (an I/O error) aborts its ARU: the LD takes the
//!   changes back and the inode cache and inode counter forget them;
//! - inode numbers come from a persistent counter and are never reused;
//! - an inode with no links lives on while open (recorded in the orphan
//!   list in the unlinking ARU) and is destroyed after its last release:
//!   at once if it holds blocks, else with others in one ARU (a batch of
//!   `RELEASED_BATCH`, the next flush, remount read-only or unmount); it
//!   stays on the orphan list until then, so a crash first reclaims it at
//!   the next mount;
//! - metadata found corrupt while mounted (an inode record or directory
//!   bucket that fails its checksum or does not decode) fails the operation
//!   with `Io` and turns the file system read-only (`Fs::damaged`; every
//!   modifying operation then fails with `ReadOnly`), so nothing is written
//!   from a wrong view of the tree; a bad data block fails only the reads
//!   that need it.
//!
//! errno exists only in the FUSE adapter; this layer returns `FsError`.

pub mod acl;
pub mod check;
pub mod dir;
pub mod inode;
pub mod scrub;

use std::collections::BTreeMap;

use rustc_hash::{FxHashMap, FxHashSet};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::ld::{
    AruId, Compression, LdError, ListHints, ListId, ListKind, LogicalDisk, Temperature,
};
use inode::{
    Inode, Kind, Time, XattrValue, INLINE_MAX, XATTR_CHUNK, XATTR_INLINE_VALUE_MAX, XATTR_MAX,
    XATTR_NAME_MAX, XATTR_VALUE_MAX,
};

pub const ROOT_INO: u64 = 1;
pub const BLOCK_BYTES: u64 = 4096;
/// Largest file size (bytes): the largest offset Linux accepts.
pub const MAX_FILE_BYTES: u64 = i64::MAX as u64;
pub const LINK_MAX: u32 = 65_000;
const META_LIST: ListId = ListId(1);
const INODE_LIST: ListId = ListId(2);
const ORPHAN_LIST: ListId = ListId(3);
const FS_MAGIC: &[u8; 8] = b"LDFS-FS1";
/// A file's or directory's compression policy (`off`, `lz4`, `zstd`,
/// `zstd:LEVEL`): an ordinary attribute in the inode record, validated
/// when set; a directory's is copied to what is created in it.
pub const COMPRESS_XATTR: &[u8] = b"user.ldfs.compress";
const INO_BATCH: u64 = 1024;
const INODE_CACHE_MAX: usize = 1 << 16;
/// Directory buckets kept decoded (`State::buckets`): with 55-bit name
/// hashes nearly every name has a bucket of its own, so this is about the
/// number of names whose lookups skip the LD (about 150 bytes each).
const BUCKET_CACHE_MAX: usize = 1 << 16;
/// Atimes kept in memory (`State::atime_dirty`) before they are written
/// together in one ARU.
const ATIME_BATCH: usize = 1024;
/// Released orphans (`State::released`) destroyed together in one ARU.
const RELEASED_BATCH: usize = 64;

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
    /// `short`: the bytes the device lacked, when more space (history
    /// given back, a cleaner pass) could cure it; `None` when no space can
    /// (a full directory bucket, an inode's attributes at their limit).
    #[error("no space left on device")]
    NoSpace { short: Option<u64> },
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
    #[error("attribute value longer than 65536 bytes")]
    ValueTooBig,
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
            LdError::NoSpace { needed, available } => FsError::NoSpace {
                short: Some(needed.saturating_sub(available).max(1)),
            },
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
    /// The caller's umask: it limits a new inode's mode unless the
    /// directory has a default ACL, which does instead (as on Linux).
    pub umask: u32,
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

/// The set-ID bits a write, truncation or chown clears: the kernel's
/// `setattr_should_drop_suidgid`, worked out by the mount, which knows the
/// caller's credentials. Only a regular file's bits are cleared.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kill {
    /// None (a write or truncation by a caller with CAP_FSETID).
    #[default]
    Nothing,
    /// Set-user-ID, and set-group-ID where the group may execute (without
    /// it the bit marks mandatory locking, and stays).
    SuidAndExecSgid,
    /// Both (a caller neither in the file's group nor with CAP_FSETID).
    SuidAndSgid,
}

/// A setattr request: `None` leaves a field alone.
#[derive(Clone, Copy, Debug, Default)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    /// The set-ID bits a truncation clears (`Kill::Nothing` for a caller
    /// with CAP_FSETID), and a chown beyond the least it always clears.
    pub kill: Kill,
    pub atime: Option<TimeSet>,
    pub mtime: Option<TimeSet>,
    /// A chown that keeps both owner and group (chown(path, -1, -1)): ctime
    /// and the set-ID bits change as for any chown, within the operation.
    pub chown: bool,
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
    /// How new file data lists store their blocks when the file has no
    /// `user.ldfs.compress` of its own (mount option `compress=`).
    pub compress: Compression,
    /// Wall clock; tests can pass a fixed one.
    pub clock: Box<dyn Fn() -> Time + Send + Sync>,
}

impl Default for FsOptions {
    fn default() -> Self {
        FsOptions {
            read_only: false,
            compress: Compression::Off,
            clock: Box::new(system_time),
        }
    }
}

/// The wall clock the kernel stamps inodes with (CLOCK_REALTIME_COARSE,
/// as `current_time()`): times ldfs sets and times the kernel sets in its
/// own cache (with the writeback cache: mtime at write, ctime at rename)
/// then come from one clock, so a later operation never shows an earlier
/// time than ldfs gave before (a finer clock runs up to a tick ahead).
pub fn system_time() -> Time {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    if unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut ts) } == 0 {
        return Time {
            secs: ts.tv_sec,
            nsecs: ts.tv_nsec as u32,
        };
    }
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    Time {
        secs: d.as_secs() as i64,
        nsecs: d.subsec_nanos(),
    }
}

struct State {
    /// Shared, so a read of a cached inode copies nothing (its inline data
    /// and xattrs were cloned on every hit: 5.7% of an operation); a
    /// change writes a new record and caches a new `Arc` (`Tx::put`).
    inodes: FxHashMap<u64, Arc<Inode>>,
    /// Directory buckets as the LD holds them, keyed by (list, index); an
    /// empty one is an absent bucket (a name looked up and not found, so
    /// the create that follows does not ask the LD again). Written through
    /// by every operation that changes a bucket (`Tx::put_bucket`) and
    /// forgotten by its abort; a deleted list's are forgotten with it
    /// (`Tx::delete_blocks`: uip may give its number to a new list). Saves
    /// each lookup the map walk, read, crc and decode of its bucket (issue
    /// 16: about 6% of the daemon's time in a metadata workload).
    buckets: BTreeMap<(u64, u64), Arc<Vec<dir::Entry>>>,
    /// Inodes whose cached record has an atime the LD does not have yet
    /// (`Fs::accessed`): written with the inode's next change, or all
    /// together at the next flush, remount read-only or unmount, or when
    /// `ATIME_BATCH` are waiting (`Fs::write_atimes`). Kept in the cache
    /// until then.
    atime_dirty: FxHashSet<u64>,
    /// References per inode: open handles, or the kernel's lookups.
    open: FxHashMap<u64, u64>,
    /// Orphans whose last reference went (`Fs::unpin`) and that hold no
    /// blocks, waiting to be destroyed together in one ARU
    /// (`Fs::destroy_released`): the FORGET that follows every unlink of a
    /// file the kernel had looked up otherwise costs an ARU of its own
    /// (issue 16: 35% of the daemon's user time deleting small files).
    /// They stay on the orphan list meanwhile, so a crash reclaims them.
    released: Vec<u64>,
    next_ino: u64,
    /// Persisted bound: inode numbers below it may have been handed out.
    ino_reserved: u64,
}

pub struct Fs {
    ld: Arc<dyn LogicalDisk>,
    state: Mutex<State>,
    opts: FsOptions,
    /// The policy of new files without their own (`compress=`; starts as
    /// `opts.compress`, changed by `mount -o remount,compress=`).
    compress: Mutex<Compression>,
    /// Set when metadata (an inode record or a directory bucket) was found
    /// corrupt: from then on every modifying operation fails with
    /// `ReadOnly`, so the damage cannot spread; reads go on.
    damaged: std::sync::OnceLock<String>,
    /// `Fs::repair` is running: corruption it meets is what it repairs.
    repairing: std::sync::atomic::AtomicBool,
    /// Remounted read-only (`Fs::set_read_only`): modifying operations fail
    /// with `ReadOnly` until it is cleared.
    remounted_ro: std::sync::atomic::AtomicBool,
    /// Blocks present in large files' lists (st_blocks), counted once per
    /// version of the file: dropped after a write or fallocate, and valid
    /// only while its list, size, mtime and ctime are the same.
    block_counts: Mutex<FxHashMap<u64, (BlockCountKey, u64)>>,
    /// The latest time `now` gave.
    last_time: Mutex<Time>,
    /// `State::atime_dirty` may be non-empty: set with it under the lock,
    /// read without it (`write_atimes`).
    atimes_kept: std::sync::atomic::AtomicBool,
    /// Atimes were dropped and it was said (once per mount).
    atimes_dropped_said: std::sync::atomic::AtomicBool,
    /// `State::released` may be non-empty: set with it under the lock,
    /// read without it (`write_kept`).
    released_kept: std::sync::atomic::AtomicBool,
}

type BlockCountKey = (u64, u64, Time, Time);

/// One operation's ARU (`Fs::begin`, `Tx::finish`).
struct Tx<'a> {
    fs: &'a Fs,
    aru: AruId,
    st: MutexGuard<'a, State>,
    /// `next_ino` and `ino_reserved` when the operation began: an abort
    /// puts them back.
    inos: (u64, u64),
    /// Inodes whose records this operation wrote (cached as written): an
    /// abort evicts them, and only them.
    put_inos: Vec<u64>,
    /// The same for directory buckets, by (list, index).
    put_buckets: Vec<(u64, u64)>,
    /// Finished (committed or aborted); a `Tx` dropped unfinished aborts.
    done: bool,
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
        Fs::format_at(ld, ctx, system_time())
    }

    /// `format` with the root's times given (tests that replay a seed
    /// byte for byte).
    pub fn format_at(ld: &dyn LogicalDisk, ctx: Ctx, now: Time) -> FsResult<()> {
        check_block_size(ld)?;
        let aru = ld.begin_aru()?;
        let meta = ListHints {
            kind: ListKind::Metadata,
            temperature: Temperature::Hot,
            ..Default::default()
        };
        let r = (|| -> FsResult<()> {
            for want in [META_LIST, INODE_LIST, ORPHAN_LIST] {
                let got = ld.create_list(Some(aru), meta)?;
                if got != want {
                    return Err(FsError::Invalid(format!(
                        "the logical disk is not empty (got {got}, expected {want})"
                    )));
                }
            }
            let root_list = ld.create_list(Some(aru), meta)?;
            let root = empty_root(root_list, ctx, now);
            ld.write(Some(aru), INODE_LIST, ROOT_INO, &root.encode())?;
            ld.write(Some(aru), META_LIST, 0, &encode_fs_record(ROOT_INO + 1))?;
            Ok(())
        })();
        if let Err(e) = r {
            let _ = ld.abort_aru(aru);
            return Err(e);
        }
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
                inodes: FxHashMap::default(),
                buckets: BTreeMap::new(),
                atime_dirty: FxHashSet::default(),
                open: FxHashMap::default(),
                released: Vec::new(),
                next_ino: reserved,
                ino_reserved: reserved,
            }),
            compress: Mutex::new(opts.compress),
            opts,
            damaged: std::sync::OnceLock::new(),
            repairing: std::sync::atomic::AtomicBool::new(false),
            remounted_ro: std::sync::atomic::AtomicBool::new(false),
            block_counts: Mutex::new(FxHashMap::default()),
            last_time: Mutex::new(Time::default()),
            atimes_kept: std::sync::atomic::AtomicBool::new(false),
            atimes_dropped_said: std::sync::atomic::AtomicBool::new(false),
            released_kept: std::sync::atomic::AtomicBool::new(false),
        };
        fs.get_inode(&mut fs.lock(), ROOT_INO)?;
        if !fs.opts.read_only {
            let orphans = fs.ld.indices(ORPHAN_LIST, 0, usize::MAX)?;
            for batch in orphans.chunks(RELEASED_BATCH) {
                let mut tx = fs.begin()?;
                let r = batch.iter().try_for_each(|&ino| tx.destroy(ino));
                tx.finish(r)?;
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
        if self.opts.read_only || self.remounted_ro.load(std::sync::atomic::Ordering::Acquire) {
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
    /// `what` names the block in an error; it is called only then (a
    /// string formatted for every read was 1.4% of a metadata workload).
    fn read_meta(
        &self,
        list: ListId,
        index: u64,
        what: impl FnOnce() -> String,
    ) -> FsResult<Option<Vec<u8>>> {
        match self.ld.read(list, index) {
            Ok(b) => Ok(b),
            Err(LdError::Corrupt(c)) => Err(self.metadata_corrupt(format!("{}: {c}", what()))),
            Err(e) => Err(e.into()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .expect("fs state poisoned by an earlier panic")
    }

    /// The time for an operation: never earlier than one given before (a
    /// wall-clock step back does not make a newer file look older).
    fn now(&self) -> Time {
        let t = (self.opts.clock)();
        let mut last = self.last_time.lock().expect("last_time poisoned");
        *last = (*last).max(t);
        *last
    }

    /// Starts an operation: takes the fs lock and opens an ARU. Nothing is
    /// reserved yet: the operation reads and checks everything it needs,
    /// then reserves exactly the blocks it is about to write
    /// (`Tx::reserve`, or `Tx::reserve_freeing` for an operation that frees
    /// at least as much as it writes, so that it works on a full file
    /// system), then writes. `Tx::finish` commits it, or aborts its ARU if
    /// it failed, so an operation commits whole or not at all.
    fn begin(&self) -> FsResult<Tx<'_>> {
        self.check_writable()?;
        let st = self.lock();
        // Again under the lock: `set_read_only` waits for the lock after
        // setting its flag, so an operation that passed the check above
        // just before the switch but got the lock after it must see it.
        self.check_writable()?;
        self.begin_locked(st)
    }

    /// `begin` with the lock held, no writable check (the caller's).
    fn begin_locked<'a>(&'a self, st: MutexGuard<'a, State>) -> FsResult<Tx<'a>> {
        let aru = self.ld.begin_aru()?;
        let inos = (st.next_ino, st.ino_reserved);
        Ok(Tx {
            fs: self,
            aru,
            st,
            inos,
            put_inos: Vec::new(),
            put_buckets: Vec::new(),
            done: false,
        })
    }

    fn get_inode(&self, st: &mut State, ino: u64) -> FsResult<Arc<Inode>> {
        if let Some(i) = st.inodes.get(&ino) {
            return Ok(Arc::clone(i));
        }
        let b = self
            .read_meta(INODE_LIST, ino, || format!("inode {ino}"))?
            .ok_or(FsError::NotFound)?;
        let i = Inode::decode(ino, &b, ino)
            .map_err(|c| self.metadata_corrupt(format!("inode {ino}: {c}")))?;
        if st.inodes.len() >= INODE_CACHE_MAX {
            let (open, dirty) = (&st.open, &st.atime_dirty);
            st.inodes
                .retain(|k, _| open.contains_key(k) || dirty.contains(k) || *k == ROOT_INO);
        }
        let i = Arc::new(i);
        st.inodes.insert(ino, Arc::clone(&i));
        Ok(i)
    }

    /// 512-byte units a large file holds: 4 KiB per present block (holes
    /// hold nothing), as `du` expects.
    fn file_blocks(&self, i: &Inode) -> u64 {
        if let Some(n) = self.counted_blocks(i) {
            return n;
        }
        let mut present = 0u64;
        let mut from = 0;
        loop {
            match self.ld.indices(ListId(i.list), from, 1 << 16) {
                Ok(idx) => {
                    present += idx.len() as u64;
                    match idx.last() {
                        Some(&l) if idx.len() == 1 << 16 => from = l + 1,
                        _ => break,
                    }
                }
                Err(e) => {
                    // stat must still answer: the size stands in.
                    eprintln!("ldfs: counting the blocks of inode {}: {e}", i.ino);
                    return i.size.div_ceil(512);
                }
            }
        }
        let n = present * (BLOCK_BYTES / 512);
        self.count_blocks(i, n);
        n
    }

    /// `file_blocks`' count for `i` if it is known and `i` is as it was
    /// counted. Callers hold the state lock (so does every change).
    fn counted_blocks(&self, i: &Inode) -> Option<u64> {
        let counts = self.block_counts.lock().expect("block_counts poisoned");
        match counts.get(&i.ino) {
            Some((k, n)) if *k == (i.list, i.size, i.mtime, i.ctime) => Some(*n),
            _ => None,
        }
    }

    fn count_blocks(&self, i: &Inode, n: u64) {
        let mut counts = self.block_counts.lock().expect("block_counts poisoned");
        if counts.len() >= INODE_CACHE_MAX {
            counts.clear();
        }
        counts.insert(i.ino, ((i.list, i.size, i.mtime, i.ctime), n));
    }

    /// The blocks of `ino` changed (after the operation): its count is
    /// stale even if its times are not (two changes in one clock tick).
    fn blocks_changed(&self, ino: u64) {
        self.block_counts
            .lock()
            .expect("block_counts poisoned")
            .remove(&ino);
    }

    fn attr(&self, i: &Inode) -> Attr {
        let blocks = match i.kind() {
            Kind::File if i.list != 0 => self.file_blocks(i),
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
        // "." of any inode is itself: the kernel looks a file handle's
        // inode up this way (FUSE export support, open_by_handle_at).
        // An orphan no one references any more is gone, though its destroy
        // may wait for its batch (`State::released`): a handle to it is
        // stale, as it was when the last FORGET destroyed it at once
        // (review 35 finding 1).
        if name == b"." {
            if p.nlink == 0 && !st.open.contains_key(&parent) {
                return Err(FsError::NotFound);
            }
            return Ok(self.attr(&p));
        }
        if p.kind() != Kind::Dir {
            return Err(FsError::NotDir);
        }
        let ino = match name {
            b"." => parent,
            b".." => p.parent,
            _ => self.find(&mut st, &p, name)?.ok_or(FsError::NotFound)?.ino,
        };
        let i = self.get_inode(&mut st, ino)?;
        Ok(self.attr(&i))
    }

    /// The bucket of directory `d` that `name` hashes to, and its index:
    /// from the cache, else read, decoded and cached.
    fn bucket(
        &self,
        st: &mut State,
        d: &Inode,
        name: &[u8],
    ) -> FsResult<(u64, Arc<Vec<dir::Entry>>)> {
        let idx = dir::bucket(name);
        let key = (d.list, idx);
        if let Some(b) = st.buckets.get(&key) {
            return Ok((idx, Arc::clone(b)));
        }
        let what = || format!("directory {} bucket {idx}", d.ino);
        let entries = match self.read_meta(ListId(d.list), idx, what)? {
            None => Vec::new(),
            Some(b) => dir::decode(&b, d.ino, idx)
                .map_err(|c| self.metadata_corrupt(format!("{}: {c}", what())))?,
        };
        let entries = Arc::new(entries);
        cache_bucket(st, key, Arc::clone(&entries));
        Ok((idx, entries))
    }

    fn find(&self, st: &mut State, d: &Inode, name: &[u8]) -> FsResult<Option<dir::Entry>> {
        let (_, entries) = self.bucket(st, d, name)?;
        Ok(entries.iter().find(|e| e.name == name).cloned())
    }

    /// The decoded inode record (`ldfs inspect --inode`): every field,
    /// including the list that holds the file's blocks or the buckets.
    pub fn inode_record(&self, ino: u64) -> FsResult<inode::Inode> {
        let mut st = self.lock();
        self.get_inode(&mut st, ino).map(Arc::unwrap_or_clone)
    }

    pub fn readlink(&self, ino: u64) -> FsResult<Vec<u8>> {
        let mut st = self.lock();
        let i = self.get_inode(&mut st, ino)?;
        if i.kind() != Kind::Symlink {
            return Err(FsError::Invalid("not a symlink".into()));
        }
        Ok(i.inline.clone())
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
                let Some(raw) = self.read_meta(list, b, what)? else {
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

    /// How `ino`'s new blocks (a directory's: its new files') are stored:
    /// a file with data, as its data list's hints say; else its
    /// `user.ldfs.compress`, else the mount's `compress=` (what `lsattr`
    /// shows as `c`).
    pub fn compression(&self, ino: u64) -> FsResult<Compression> {
        // A file whose data has its list: how that list stores new blocks
        // (set when it was made, or by the attribute since).
        let list = {
            let mut st = self.lock();
            let i = self.get_inode(&mut st, ino)?;
            (i.kind() == Kind::File && i.list != 0).then_some(ListId(i.list))
        };
        if let Some(l) = list {
            if let Some(h) = self.ld.list_hints(l)? {
                return Ok(h.compress);
            }
        }
        match self.getxattr(ino, COMPRESS_XATTR) {
            Ok(v) => Ok(parse_compress_value(&v).unwrap_or(self.default_compression())),
            Err(FsError::NoAttr) => Ok(self.default_compression()),
            Err(e) => Err(e),
        }
    }

    /// The mount's `compress=` (the policy of files without their own).
    pub fn default_compression(&self) -> Compression {
        *self.compress.lock().expect("compress poisoned")
    }

    /// `mount -o remount,compress=`: new files without a policy of their
    /// own (or inherited) are stored so from now on; written blocks keep
    /// their form, and a file whose data already has its list keeps that
    /// list's policy.
    pub fn set_default_compression(&self, c: Compression) {
        *self.compress.lock().expect("compress poisoned") = c;
    }

    pub fn getxattr(&self, ino: u64, name: &[u8]) -> FsResult<Vec<u8>> {
        let mut st = self.lock();
        let i = self.get_inode(&mut st, ino)?;
        let v = i
            .xattrs
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
            .ok_or(FsError::NoAttr)?;
        // Under the lock: a concurrent change may delete the value's list.
        self.xattr_value(ino, &v)
    }

    /// The bytes of a value, read from its list if it has one.
    fn xattr_value(&self, ino: u64, v: &XattrValue) -> FsResult<Vec<u8>> {
        let (list, len) = match v {
            XattrValue::Inline(v) => return Ok(v.clone()),
            XattrValue::List { list, len } => (ListId(*list), *len as usize),
        };
        let mut out = Vec::with_capacity(len);
        for k in 0..len.div_ceil(XATTR_CHUNK) as u64 {
            let want = XATTR_CHUNK.min(len - out.len());
            match self.ld.read(list, k)? {
                Some(b) if b.len() == want => out.extend_from_slice(&b),
                got => {
                    return Err(FsError::Io(format!(
                        "inode {ino}: xattr list {}: block {k} holds {:?} bytes, not {want}",
                        list.0,
                        got.map(|b| b.len())
                    )))
                }
            }
        }
        Ok(out)
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

    /// The inodes referenced (`pin`) and how many times: through FUSE, the inodes the kernel
    /// holds (a read-only mount moving to a newer tree tells the kernel which of them changed).
    pub fn pinned(&self) -> Vec<(u64, u64)> {
        self.lock().open.iter().map(|(&i, &n)| (i, n)).collect()
    }

    /// The last release of an unlinked inode destroys it: `unpin(ino, 1)`.
    pub fn release(&self, ino: u64) -> FsResult<()> {
        self.unpin(ino, 1)
    }

    /// Drops `n` references; an unlinked inode whose last reference goes is
    /// destroyed (with its orphan record): at once, in an ARU of its own,
    /// if it holds blocks (a large file's or an attribute's list: the space
    /// `rm big; write` expects back), else with other released orphans in
    /// one ARU once `RELEASED_BATCH` wait or at the next `write_kept`.
    /// Deferring only deletes is safe (DESIGN "The file system": the
    /// orphan mark, written in the unlink's ARU, stays until the destroy,
    /// so a crash meanwhile reclaims the inode at the next mount). One ARU
    /// may hold any number of independent changes (logical-disk-1993,
    /// section 2.1), and batching metadata updates into one log write is
    /// what DualFS's meta-data device does (dualfs-2002, section 3.2).
    pub fn unpin(&self, ino: u64, n: u64) -> FsResult<()> {
        let mut st = self.lock();
        let Some(count) = st.open.get_mut(&ino) else {
            return Ok(()); // never pinned (e.g. pinned before a remount)
        };
        *count = count.saturating_sub(n);
        if *count > 0 {
            return Ok(());
        }
        st.open.remove(&ino);
        let holds_blocks = match self.get_inode(&mut st, ino) {
            Ok(i) if i.nlink == 0 => holds_blocks(&i),
            _ => return Ok(()),
        };
        if self.opts.read_only {
            return Ok(());
        }
        st.released.push(ino);
        self.released_kept
            .store(true, std::sync::atomic::Ordering::Release);
        if holds_blocks || st.released.len() >= RELEASED_BATCH {
            self.check_writable()?;
            self.destroy_released_locked(st)?;
        }
        Ok(())
    }

    /// Destroys the released orphans (`State::released`) in one ARU; those
    /// referenced again since are left alone (their next last release
    /// releases them again). On an error they stay orphans on the device,
    /// reclaimed by the next mount (as an unpin's own destroy failing
    /// always left them).
    fn destroy_released_locked(&self, st: MutexGuard<'_, State>) -> FsResult<()> {
        let mut tx = self.begin_locked(st)?;
        let mut inos = std::mem::take(&mut tx.st.released);
        self.released_kept
            .store(false, std::sync::atomic::Ordering::Release);
        // In key order: neighbours share map leaves.
        inos.sort_unstable();
        inos.dedup();
        let r = inos.iter().try_for_each(|&ino| {
            if tx.st.open.contains_key(&ino) {
                return Ok(());
            }
            tx.destroy(ino)
        });
        tx.finish(r)
    }

    /// `destroy_released_locked` where a failure is said, not returned:
    /// the orphans stay on the orphan list, reclaimed by the next mount.
    fn destroy_released_or_say(&self, st: MutexGuard<'_, State>) {
        let n = st.released.len();
        if let Err(e) = self.destroy_released_locked(st) {
            eprintln!(
                "ldfs: destroying {n} unlinked inodes: {e}; they are reclaimed at the next mount"
            );
        }
    }

    /// Destroys the released orphans now (an operation found no space:
    /// theirs may be what it needs). Whether there were any.
    pub fn destroy_released(&self) -> FsResult<bool> {
        if !self
            .released_kept
            .load(std::sync::atomic::Ordering::Acquire)
        {
            return Ok(false);
        }
        let st = self.lock();
        if st.released.is_empty() {
            return Ok(false);
        }
        // Under the lock: an operation that held it may have found metadata
        // corrupt and turned the file system read-only (review 38 finding 1).
        self.check_writable()?;
        self.destroy_released_locked(st)?;
        Ok(true)
    }

    /// Makes everything done so far durable, what is kept in memory too
    /// (`write_kept`).
    pub fn fsync(&self) -> FsResult<()> {
        self.write_kept();
        Ok(self.ld.flush()?)
    }

    /// Writes what the file system keeps in memory: destroys the released
    /// orphans (`State::released`) and writes the atimes `accessed` kept
    /// (`write_atimes`). Called at every flush, checkpoint, snapshot and
    /// unmount. Failures are said, not returned: the orphans stay on the
    /// orphan list for the next mount, and atimes are best effort.
    pub fn write_kept(&self) {
        if self
            .released_kept
            .load(std::sync::atomic::Ordering::Acquire)
        {
            // A poisoned lock: as in `write_atimes`. Writable is checked
            // under the lock: an operation that held it may have found
            // metadata corrupt and turned the file system read-only
            // (review 38 finding 1).
            if let Ok(st) = self.state.lock() {
                if !st.released.is_empty() && self.check_writable().is_ok() {
                    self.destroy_released_or_say(st);
                }
            }
        }
        self.write_atimes();
    }

    /// Writes the atimes `accessed` kept in memory, in one ARU. They are
    /// best effort, as the update itself is: on a full or read-only file
    /// system (or any error) they are dropped, said once, and the flush
    /// that follows is not failed for them.
    fn write_atimes(&self) {
        // Read without the lock: a flush with nothing kept must not wait
        // behind a running operation (review 29), as before lazy atimes.
        if !self.atimes_kept.load(std::sync::atomic::Ordering::Acquire) {
            return;
        }
        // A poisoned lock (an operation panicked holding it) must not stop
        // the daemon's end from writing its final checkpoint.
        let Ok(st) = self.state.lock() else {
            return;
        };
        if let Err(e) = self.check_writable() {
            self.drop_atimes(st, &e);
            return;
        }
        self.write_atimes_locked(st);
    }

    /// `write_atimes` with the lock held and the writable check done (or,
    /// for `set_read_only`, deliberately skipped: its own last write).
    fn write_atimes_locked(&self, st: MutexGuard<'_, State>) {
        if st.atime_dirty.is_empty() {
            self.atimes_kept
                .store(false, std::sync::atomic::Ordering::Release);
            return;
        }
        let aru = match self.ld.begin_aru() {
            Ok(a) => a,
            Err(e) => return self.drop_atimes(st, &e.into()),
        };
        let inos = (st.next_ino, st.ino_reserved);
        let mut tx = Tx {
            fs: self,
            aru,
            st,
            inos,
            put_inos: Vec::new(),
            put_buckets: Vec::new(),
            done: false,
        };
        let kept: Vec<u64> = tx.st.atime_dirty.drain().collect();
        self.atimes_kept
            .store(false, std::sync::atomic::Ordering::Release);
        let r = (|| {
            let recs: Vec<Arc<Inode>> = kept
                .iter()
                .filter_map(|ino| tx.st.inodes.get(ino).cloned())
                .collect();
            tx.reserve(recs.iter().map(|i| i.encoded_len() as u64).sum())?;
            for i in recs {
                tx.put_cached(&i)?;
            }
            Ok(())
        })();
        if let Err(e) = tx.finish(r) {
            self.said_atimes_dropped(kept.len(), &e);
        }
    }

    /// Forgets the kept atimes (read-only, or no ARU to be had).
    fn drop_atimes(&self, mut st: MutexGuard<'_, State>, e: &FsError) {
        let n = st.atime_dirty.len();
        st.atime_dirty.clear();
        self.atimes_kept
            .store(false, std::sync::atomic::Ordering::Release);
        drop(st);
        if n > 0 && !matches!(e, FsError::ReadOnly) {
            self.said_atimes_dropped(n, e);
        }
    }

    /// Said once per mount (a full file system would say it at every
    /// flush: review 29).
    fn said_atimes_dropped(&self, n: usize, e: &FsError) {
        if !self
            .atimes_dropped_said
            .swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            eprintln!(
                "ldfs: {n} access times not written ({e}); atimes are best effort, and later ones that cannot be written are dropped without a word"
            );
        }
    }

    /// Remount read-only (`ro`) or writable again: from return on, every
    /// modifying operation fails with `ReadOnly` (or works again). Returns
    /// once the operations already under way have finished, so a
    /// checkpoint taken next holds all of them. A file system opened
    /// read-only (`FsOptions::read_only`) cannot be made writable.
    pub fn set_read_only(&self, ro: bool) -> FsResult<()> {
        if !ro && self.opts.read_only {
            return Err(FsError::ReadOnly);
        }
        self.remounted_ro
            .store(ro, std::sync::atomic::Ordering::Release);
        // Operations hold the state lock from begin to finish: once it is
        // had, none is under way and none can start. The atimes reads kept
        // until now are the remount's to write (a read that raced the flag
        // kept one after an earlier write: review 29); later reads keep
        // none (`accessed` checks under the lock).
        let mut st = self.lock();
        if ro && !self.opts.read_only && self.damaged.get().is_none() {
            // Its own last writes, past the flag: no operation can start
            // between them (each checks the flag under the lock).
            if !st.released.is_empty() {
                self.destroy_released_or_say(st);
                st = self.lock();
            }
            self.write_atimes_locked(st);
        }
        Ok(())
    }

    /// Whether modifying operations are refused (opened or remounted
    /// read-only, or turned read-only by metadata corruption).
    pub fn is_read_only(&self) -> bool {
        self.check_writable().is_err()
    }

    // ---- changing ---------------------------------------------------------

    pub fn setattr(&self, ino: u64, sa: &SetAttr) -> FsResult<Attr> {
        let mut tx = self.begin()?;
        let r = tx.setattr(ino, sa);
        tx.finish(r)
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
        let mut tx = self.begin()?;
        let r = tx.create(ctx, parent, name, mode, rdev, &[]);
        tx.finish(r)
    }

    pub fn mkdir(&self, ctx: Ctx, parent: u64, name: &[u8], mode: u32) -> FsResult<Attr> {
        let mut tx = self.begin()?;
        let r = tx.create(
            ctx,
            parent,
            name,
            Kind::Dir.mode_bits() | (mode & 0o7777),
            0,
            &[],
        );
        tx.finish(r)
    }

    pub fn symlink(&self, ctx: Ctx, parent: u64, name: &[u8], target: &[u8]) -> FsResult<Attr> {
        if target.is_empty() || target.len() > 4095 {
            return Err(FsError::NameTooLong);
        }
        let mut tx = self.begin()?;
        let r = tx.create(
            ctx,
            parent,
            name,
            Kind::Symlink.mode_bits() | 0o777,
            0,
            target,
        );
        tx.finish(r)
    }

    pub fn unlink(&self, parent: u64, name: &[u8]) -> FsResult<()> {
        let mut tx = self.begin()?;
        let r = tx.remove(parent, name, false);
        tx.finish(r)
    }

    pub fn rmdir(&self, parent: u64, name: &[u8]) -> FsResult<()> {
        let mut tx = self.begin()?;
        let r = tx.remove(parent, name, true);
        tx.finish(r)
    }

    pub fn link(&self, ino: u64, parent: u64, name: &[u8]) -> FsResult<Attr> {
        let mut tx = self.begin()?;
        let r = tx.link(ino, parent, name);
        tx.finish(r)
    }

    pub fn rename(
        &self,
        parent: u64,
        name: &[u8],
        newparent: u64,
        newname: &[u8],
        flags: RenameFlags,
    ) -> FsResult<()> {
        let mut tx = self.begin()?;
        let r = tx.rename(parent, name, newparent, newname, flags);
        tx.finish(r)
    }

    /// Writes `data` at `offset`. Like the kernel's `file_remove_privs`, a
    /// write drops the file's `security.capability` attribute; the caller
    /// says whether it also clears set-user-ID and set-group-ID (a writer
    /// without CAP_FSETID): see `write_killing_suidgid`.
    pub fn write(&self, ino: u64, offset: u64, data: &[u8]) -> FsResult<usize> {
        self.write_killing_suidgid(ino, offset, data, Kill::Nothing)
    }

    /// `write`, also clearing the set-ID bits `kill` says (the file system
    /// owns privilege killing under FUSE_HANDLE_KILLPRIV_V2).
    pub fn write_killing_suidgid(
        &self,
        ino: u64,
        offset: u64,
        data: &[u8],
        kill: Kill,
    ) -> FsResult<usize> {
        let mut tx = self.begin()?;
        let r = tx.write(ino, offset, data, kill);
        // The write keeps its file's block count exact (or an abort drops
        // it): a stat after every write would rescan the whole file.
        tx.finish(r)
    }

    pub fn setxattr(&self, ino: u64, name: &[u8], value: &[u8], mode: XattrMode) -> FsResult<()> {
        self.setxattr_killing_sgid(ino, name, value, mode, false)
    }

    /// `setxattr`; an access ACL set by a caller neither in the inode's
    /// group nor with CAP_FSETID (`kill_sgid`, the mount tells) also
    /// clears set-group-ID, as Linux's `posix_acl_update_mode` does.
    pub fn setxattr_killing_sgid(
        &self,
        ino: u64,
        name: &[u8],
        value: &[u8],
        mode: XattrMode,
        kill_sgid: bool,
    ) -> FsResult<()> {
        let mut tx = self.begin()?;
        let r = tx.setxattr(ino, name, value, mode, kill_sgid);
        tx.finish(r)
    }

    pub fn removexattr(&self, ino: u64, name: &[u8]) -> FsResult<()> {
        let mut tx = self.begin()?;
        let r = tx.removexattr(ino, name);
        tx.finish(r)
    }

    pub fn fallocate(&self, ino: u64, offset: u64, len: u64, mode: FallocMode) -> FsResult<()> {
        let mut tx = self.begin()?;
        let r = tx.fallocate(ino, offset, len, mode);
        let r = tx.finish(r);
        self.blocks_changed(ino);
        r
    }
}

/// Bytes of a list's hints block, which `set_compression` rewrites.
const LIST_HINTS_BYTES: u64 = 16;

/// Parses a `user.ldfs.compress` value (`off`, `lz4`, `zstd`, `zstd:N`);
/// the error names the attribute and what it accepts.
pub fn parse_compress_value(v: &[u8]) -> Result<Compression, String> {
    let name = String::from_utf8_lossy(COMPRESS_XATTR);
    let s = std::str::from_utf8(v).map_err(|_| format!("{name}: not text"))?;
    Compression::parse(s).map_err(|e| format!("{name}: {e}"))
}

/// Bytes of the file-system record (list 1, index 0).
const FS_RECORD_BYTES: u64 = 16;
/// An orphan list entry's block.
const ORPHAN_MARK: &[u8] = &[1];

/// Whether destroying `i` frees blocks beyond its records: a regular
/// file's list of data blocks, or a long attribute value's list. (A
/// directory's list is empty by the time it is destroyed: rmdir and a
/// rename over it need it so.)
fn holds_blocks(i: &Inode) -> bool {
    (i.kind() == Kind::File && i.list != 0) || i.xattrs.iter().any(|(_, v)| v.list().is_some())
}

/// What a namespace operation writes, built in memory from what it read:
/// each inode record and directory bucket it changes (once, however many
/// times the operation changes it), the orphans it marks and the inodes it
/// destroys. `Tx::apply` writes it after every read and check, and the
/// operation reserves exactly `bytes()` first.
#[derive(Default)]
struct Plan {
    inodes: Few<u64, Inode>,
    /// (directory inode, bucket index) -> its list and its new entries
    /// (none: the bucket is deleted).
    buckets: Few<(u64, u64), (ListId, Vec<dir::Entry>)>,
    orphans: Vec<u64>,
    destroyed: Vec<Inode>,
}

/// A map of a few entries in key order, kept in a vector: a plan holds one
/// to four inodes and buckets, and a `BTreeMap`'s first insert allocates a
/// node for eleven (an `Inode` is ~170 bytes) and moves values into it: 17%
/// of an unlink's time in the daemon (issue 16).
struct Few<K, V>(Vec<(K, V)>);

impl<K, V> Default for Few<K, V> {
    fn default() -> Self {
        Few(Vec::new())
    }
}

impl<K: Ord + Copy, V> Few<K, V> {
    fn position(&self, k: K) -> Result<usize, usize> {
        self.0.binary_search_by(|(x, _)| x.cmp(&k))
    }

    /// The value of `k`, made by `f` first if there is none.
    fn get_or_try_insert<E>(
        &mut self,
        k: K,
        f: impl FnOnce() -> Result<V, E>,
    ) -> Result<&mut V, E> {
        let at = match self.position(k) {
            Ok(at) => at,
            Err(at) => {
                let v = f()?;
                self.0.insert(at, (k, v));
                at
            }
        };
        Ok(&mut self.0[at].1)
    }

    fn insert(&mut self, k: K, v: V) {
        match self.position(k) {
            Ok(at) => self.0[at].1 = v,
            Err(at) => self.0.insert(at, (k, v)),
        }
    }

    fn get(&self, k: K) -> Option<&V> {
        self.position(k).ok().map(|at| &self.0[at].1)
    }

    fn get_mut(&mut self, k: K) -> Option<&mut V> {
        self.position(k).ok().map(|at| &mut self.0[at].1)
    }

    fn remove(&mut self, k: K) -> Option<V> {
        self.position(k).ok().map(|at| self.0.remove(at).1)
    }

    fn values(&self) -> impl Iterator<Item = &V> {
        self.0.iter().map(|(_, v)| v)
    }
}

impl<K, V> IntoIterator for Few<K, V> {
    type Item = (K, V);
    type IntoIter = std::vec::IntoIter<(K, V)>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

impl Plan {
    /// Bytes of the blocks `apply` writes.
    fn bytes(&self) -> u64 {
        let inodes: usize = self.inodes.values().map(Inode::encoded_len).sum();
        let buckets: usize = self
            .buckets
            .values()
            .map(|(_, e)| dir::encoded_len(e))
            .sum();
        (inodes + buckets + self.orphans.len() * ORPHAN_MARK.len()) as u64
    }
}

/// A size change of a regular file, worked out (and its reads done) before
/// anything is written: `Tx::plan_resize`, then `Tx::apply_resize`.
#[derive(Default)]
struct Resize {
    /// Inline data moving into a new list of blocks (the file outgrew its
    /// inode).
    spill: Option<Vec<u8>>,
    /// Blocks from this index on go.
    cut_from: Option<u64>,
    /// The new last block, shortened.
    tail: Option<(u64, Vec<u8>)>,
}

impl Resize {
    fn bytes(&self) -> u64 {
        (self.spill.as_ref().map_or(0, |d| d.len()) + self.tail.as_ref().map_or(0, |t| t.1.len()))
            as u64
    }
}

/// Zeroing a range of a file's blocks: whole blocks deleted, the partial
/// ones at its edges rewritten (read and zeroed before anything is written).
#[derive(Default)]
struct Zeroing {
    cut: Option<std::ops::Range<u64>>,
    edges: Vec<(u64, Vec<u8>)>,
}

fn stamp(i: &mut Inode, now: Time, m: bool, c: bool) {
    if m {
        i.mtime = now;
    }
    if c {
        i.ctime = now;
    }
}

/// Takes the entry `name` out of `entries` (a bucket of directory `dir`),
/// which must hold it exactly once: a bucket on disk that names it twice
/// is an error, not a panic.
fn take_entry(entries: &mut Vec<dir::Entry>, name: &[u8], dir: u64) -> FsResult<dir::Entry> {
    let at: Vec<usize> = (0..entries.len())
        .filter(|&k| entries[k].name == name)
        .collect();
    match at.as_slice() {
        [k] => Ok(entries.remove(*k)),
        [] => Err(FsError::NotFound),
        _ => Err(FsError::Io(format!(
            "directory {dir} bucket {}: {} entries named {:?}",
            dir::bucket(name),
            at.len(),
            String::from_utf8_lossy(name)
        ))),
    }
}

impl Tx<'_> {
    /// Reserves `bytes` of blocks for this operation (it may grow the file
    /// system): fails with NoSpace before anything is written.
    fn reserve(&mut self, bytes: u64) -> FsResult<()> {
        if bytes > 0 {
            self.fs.ld.reserve(self.aru, bytes)?;
        }
        Ok(())
    }

    /// Reserves `bytes` for an operation that frees at least as much as it
    /// writes (unlink, rmdir, rename, truncation, attribute changes, hole
    /// punching): it may use the LD's metadata share, so it works on a
    /// full file system.
    fn reserve_freeing(&mut self, bytes: u64) -> FsResult<()> {
        if bytes > 0 {
            self.fs.ld.reserve_freeing(self.aru, bytes)?;
        }
        Ok(())
    }

    /// Ends the operation with its result: commits it if it succeeded,
    /// else takes back whatever it changed before it failed.
    fn finish<T>(mut self, r: FsResult<T>) -> FsResult<T> {
        self.done = true;
        let r = r.and_then(|v| {
            self.fs
                .ld
                .end_aru(self.aru)
                .map(|()| v)
                .map_err(FsError::from)
        });
        // A record written carried its cached atime; one aborted was
        // evicted with it (an atime is not worth failing for).
        if !self.st.atime_dirty.is_empty() {
            for ino in &self.put_inos {
                self.st.atime_dirty.remove(ino);
            }
        }
        if r.is_err() {
            self.abort();
        }
        r
    }

    /// Aborts the ARU (the LD forgets every change of the operation, for
    /// reads now and after a crash) and forgets what the operation may
    /// have changed in the caches.
    fn abort(&mut self) {
        if let Err(e) = self.fs.ld.abort_aru(self.aru) {
            eprintln!("ldfs: a failed operation could not be taken back: {e}");
        }
        // Only records this operation wrote can be stale in the cache (a
        // failed check writes none, so EEXIST keeps the cache warm).
        for ino in std::mem::take(&mut self.put_inos) {
            self.st.inodes.remove(&ino);
            self.fs.blocks_changed(ino);
        }
        for key in std::mem::take(&mut self.put_buckets) {
            self.st.buckets.remove(&key);
        }
        (self.st.next_ino, self.st.ino_reserved) = self.inos;
    }

    fn ld(&self) -> &dyn LogicalDisk {
        &*self.fs.ld
    }

    /// The cached inode, to read (a shared reference: cloning a record,
    /// inline data and attributes with it, for every inode an operation
    /// looks at was a tenth of an unlink, issue 16).
    fn inode(&mut self, ino: u64) -> FsResult<Arc<Inode>> {
        self.fs.get_inode(&mut self.st, ino)
    }

    /// The inode to change: a copy of the cached one.
    fn inode_mut(&mut self, ino: u64) -> FsResult<Inode> {
        let i = self.fs.get_inode(&mut self.st, ino)?;
        Ok(Inode::clone(&i))
    }

    fn dir_inode(&mut self, ino: u64) -> FsResult<Arc<Inode>> {
        let d = self.inode(ino)?;
        if d.kind() != Kind::Dir {
            return Err(FsError::NotDir);
        }
        Ok(d)
    }

    /// The directory to change: a copy of the cached one.
    fn dir_inode_mut(&mut self, ino: u64) -> FsResult<Inode> {
        Ok(Inode::clone(&*self.dir_inode(ino)?))
    }

    fn put(&mut self, i: &Inode) -> FsResult<()> {
        self.put_owned(i.clone()).map(drop)
    }

    /// `put` of an inode the caller is done with: cached without a copy.
    /// Writes the record of an inode the cache holds as it is (the atimes
    /// `accessed` kept): no copy, and the cache keeps its `Arc`.
    fn put_cached(&mut self, i: &Arc<Inode>) -> FsResult<()> {
        // Noted first, as in `put_owned`: an abort evicts it.
        self.put_inos.push(i.ino);
        self.ld()
            .write(Some(self.aru), INODE_LIST, i.ino, &i.encode())?;
        Ok(())
    }

    fn put_owned(&mut self, i: Inode) -> FsResult<Arc<Inode>> {
        // Noted first: an abort must forget the cached record even if the
        // write itself failed after changing the LD's view.
        self.put_inos.push(i.ino);
        self.ld()
            .write(Some(self.aru), INODE_LIST, i.ino, &i.encode())?;
        let i = Arc::new(i);
        self.st.inodes.insert(i.ino, Arc::clone(&i));
        Ok(i)
    }

    /// Bytes `alloc_ino` writes next (the file-system record, once per
    /// batch of inode numbers).
    fn alloc_bytes(&self) -> u64 {
        if self.st.next_ino >= self.st.ino_reserved {
            FS_RECORD_BYTES
        } else {
            0
        }
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

    fn write_bucket(&mut self, d: &Inode, idx: u64, entries: Vec<dir::Entry>) -> FsResult<()> {
        self.put_bucket(ListId(d.list), idx, entries)
    }

    /// Writes (or, empty, deletes) bucket `idx` of `list` and caches it as
    /// written.
    fn put_bucket(&mut self, list: ListId, idx: u64, entries: Vec<dir::Entry>) -> FsResult<()> {
        // Noted first, as in `put_owned`: an abort must forget it even if
        // the write failed after changing the LD's view.
        self.put_buckets.push((list.0, idx));
        if entries.is_empty() {
            self.ld().delete(Some(self.aru), list, idx)?;
        } else {
            self.ld()
                .write(Some(self.aru), list, idx, &dir::encode(&entries))?;
        }
        cache_bucket(&mut self.st, (list.0, idx), Arc::new(entries));
        Ok(())
    }

    /// A bucket changed behind the cache (fsck's repair deleting a damaged
    /// one): the next read goes to the LD.
    fn forget_bucket(&mut self, list: ListId, idx: u64) {
        // Noted too: what is read back before an abort is not the old one.
        self.put_buckets.push((list.0, idx));
        self.st.buckets.remove(&(list.0, idx));
    }

    /// The bucket of `d` that `name` hashes to, to be changed.
    fn bucket_to_change(&mut self, d: &Inode, name: &[u8]) -> FsResult<(u64, Vec<dir::Entry>)> {
        let (idx, entries) = self.fs.bucket(&mut self.st, d, name)?;
        Ok((idx, Vec::clone(&entries)))
    }

    /// Reads the bucket `name` goes to and checks, before anything changes,
    /// that the name is new and the bucket has room.
    fn bucket_for_new(&mut self, d: &Inode, name: &[u8]) -> FsResult<(u64, Vec<dir::Entry>)> {
        let (idx, entries) = self.bucket_to_change(d, name)?;
        if entries.iter().any(|e| e.name == name) {
            return Err(FsError::Exists);
        }
        if entries.len() >= dir::BUCKET_MAX {
            return Err(FsError::NoSpace { short: None });
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
        push_entry(&mut entries, name, ino, kind)?;
        self.write_bucket(d, idx, entries)?;
        d.size += 1;
        Ok(())
    }

    fn remove_entry(&mut self, d: &mut Inode, name: &[u8]) -> FsResult<()> {
        let (idx, mut entries) = self.bucket_to_change(d, name)?;
        take_entry(&mut entries, name, d.ino)?;
        self.write_bucket(d, idx, entries)?;
        d.size = d.size.saturating_sub(1);
        Ok(())
    }

    // ---- plans ------------------------------------------------------------

    /// Inode `ino` as `plan` has it, read into the plan first if need be.
    fn planned<'p>(&mut self, plan: &'p mut Plan, ino: u64) -> FsResult<&'p mut Inode> {
        plan.inodes.get_or_try_insert(ino, || self.inode_mut(ino))
    }

    /// The bucket of directory `d` that `name` hashes to, as `plan` has it,
    /// read into the plan first if need be.
    fn planned_bucket<'p>(
        &mut self,
        plan: &'p mut Plan,
        d: &Inode,
        name: &[u8],
    ) -> FsResult<&'p mut Vec<dir::Entry>> {
        let key = (d.ino, dir::bucket(name));
        let b = plan.buckets.get_or_try_insert(key, || -> FsResult<_> {
            Ok((ListId(d.list), self.bucket_to_change(d, name)?.1))
        })?;
        Ok(&mut b.1)
    }

    /// Adds `name` -> `ino` to directory `d` in `plan`; the name must be new
    /// and its bucket have room.
    fn plan_add(
        &mut self,
        plan: &mut Plan,
        d: &Inode,
        name: &[u8],
        ino: u64,
        kind: Kind,
    ) -> FsResult<()> {
        let entries = self.planned_bucket(plan, d, name)?;
        if entries.iter().any(|e| e.name == name) {
            return Err(FsError::Exists);
        }
        push_entry(entries, name, ino, kind)?;
        self.planned(plan, d.ino)?.size += 1;
        Ok(())
    }

    /// Takes `name` out of directory `d` in `plan`; returns its entry.
    fn plan_remove(&mut self, plan: &mut Plan, d: &Inode, name: &[u8]) -> FsResult<dir::Entry> {
        let e = take_entry(self.planned_bucket(plan, d, name)?, name, d.ino)?;
        let d = self.planned(plan, d.ino)?;
        d.size = d.size.saturating_sub(1);
        Ok(e)
    }

    /// Drops one link of inode `ino` in `plan` (its entry is already gone):
    /// it keeps the others, or goes to the orphan list if open, or is
    /// destroyed.
    fn plan_unlink(&mut self, plan: &mut Plan, ino: u64, now: Time) -> FsResult<()> {
        let i = self.planned(plan, ino)?;
        i.nlink = if i.kind() == Kind::Dir {
            0
        } else {
            i.nlink.saturating_sub(1)
        };
        stamp(i, now, false, true);
        if i.nlink > 0 {
            return Ok(());
        }
        if self.st.open.contains_key(&ino) {
            plan.orphans.push(ino);
        } else {
            let i = plan.inodes.remove(ino).expect("planned above");
            plan.destroyed.push(i);
        }
        Ok(())
    }

    /// Writes `plan` (after the operation reserved `plan.bytes()`).
    fn apply(&mut self, plan: Plan) -> FsResult<()> {
        let Plan {
            inodes,
            buckets,
            orphans,
            destroyed,
        } = plan;
        for ((_, idx), (list, entries)) in buckets {
            self.put_bucket(list, idx, entries)?;
        }
        for (_, i) in inodes {
            self.put_owned(i)?;
        }
        for &ino in &orphans {
            self.ld()
                .write(Some(self.aru), ORPHAN_LIST, ino, ORPHAN_MARK)?;
        }
        for i in &destroyed {
            self.forget_inode(i)?;
        }
        // Last: nothing after them can fail, so an abort never has to put
        // back a bulk removal (on a full device that leaves deletes short
        // of room until a checkpoint).
        for i in &destroyed {
            self.delete_blocks(i)?;
        }
        Ok(())
    }

    // ---- namespace --------------------------------------------------------

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
        let p = self.dir_inode(parent)?;
        if p.nlink == 0 {
            return Err(FsError::NotFound);
        }
        if kind == Kind::Dir && p.nlink >= LINK_MAX {
            return Err(FsError::TooManyLinks);
        }
        let mut plan = Plan::default();
        // The number the inode gets; taken (and the record written) below.
        let ino = self.st.next_ino;
        self.plan_add(&mut plan, &p, name, ino, kind)?;
        // The directory's default ACL becomes the new inode's access ACL
        // (limited by the create mode, and limiting it) and a new
        // directory's default ACL; without one, the umask limits the mode
        // (`posix_acl_create`).
        let mut mode = mode;
        let mut xattrs = Vec::new();
        let default = match p
            .xattrs
            .binary_search_by(|(n, _)| n.as_slice().cmp(acl::DEFAULT))
        {
            Ok(k) if kind != Kind::Symlink => Some(self.fs.xattr_value(parent, &p.xattrs[k].1)?)
                .filter(|d| d.len() <= XATTR_INLINE_VALUE_MAX),
            _ => None,
        };
        match default.as_deref().and_then(acl::Acl::parse) {
            Some(mut a) => {
                if a.create_masq(&mut mode) {
                    xattrs.push((acl::ACCESS.to_vec(), XattrValue::Inline(a.encode())));
                }
                if kind == Kind::Dir {
                    let d = default.expect("parsed above");
                    xattrs.push((acl::DEFAULT.to_vec(), XattrValue::Inline(d)));
                }
            }
            None if kind != Kind::Symlink => mode &= !(ctx.umask & 0o777),
            None => {}
        }
        // The directory's compression policy goes to the files and
        // directories made in it (as btrfs's `compression` property).
        if matches!(kind, Kind::File | Kind::Dir) {
            if let Ok(k) = p
                .xattrs
                .binary_search_by(|(n, _)| n.as_slice().cmp(COMPRESS_XATTR))
            {
                let v = self.fs.xattr_value(parent, &p.xattrs[k].1)?;
                if v.len() <= XATTR_INLINE_VALUE_MAX {
                    xattrs.push((COMPRESS_XATTR.to_vec(), XattrValue::Inline(v)));
                    xattrs.sort_by(|a, b| a.0.cmp(&b.0));
                }
            }
        }
        // BSD semantics for setgid directories: the group comes from the
        // directory, and subdirectories inherit the bit.
        let gid = if p.mode & 0o2000 != 0 {
            if kind == Kind::Dir {
                mode |= 0o2000;
            }
            p.gid
        } else {
            ctx.gid
        };
        let now = self.fs.now();
        let pp = self.planned(&mut plan, parent)?;
        if kind == Kind::Dir {
            pp.nlink += 1;
        }
        stamp(pp, now, true, true);
        plan.inodes.insert(
            ino,
            Inode {
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
                list: 0, // a directory's is created below (a fixed-size field)
                rdev,
                // A regular file keeps the directory it was made in: the
                // list it gets when it outgrows its record is placed near
                // that directory's (`spill`).
                parent: if kind == Kind::Dir || kind == Kind::File {
                    parent
                } else {
                    0
                },
                atime: now,
                mtime: now,
                ctime: now,
                inline: target.to_vec(),
                xattrs,
            },
        );
        self.reserve(plan.bytes() + self.alloc_bytes())?;
        let got = self.alloc_ino()?;
        assert_eq!(got, ino, "inode number changed under the fs lock");
        if kind == Kind::Dir {
            let list = self.ld().create_list(
                Some(self.aru),
                ListHints {
                    kind: ListKind::Metadata,
                    near: Some(ListId(p.list)),
                    ..Default::default()
                },
            )?;
            plan.inodes.get_mut(ino).expect("planned above").list = list.0;
        }
        let attr = self.fs.attr(plan.inodes.get(ino).expect("planned above"));
        self.apply(plan)?;
        Ok(attr)
    }

    /// Deletes a destroyed inode's record (`delete_blocks` deletes its
    /// blocks, as the operation's last step).
    fn forget_inode(&mut self, i: &Inode) -> FsResult<()> {
        self.ld().delete(Some(self.aru), INODE_LIST, i.ino)?;
        self.st.inodes.remove(&i.ino);
        self.st.atime_dirty.remove(&i.ino);
        Ok(())
    }

    /// Deletes a destroyed inode's list of blocks (or entries), and the
    /// lists of its long attribute values. A list already gone (lost to
    /// damage; the check reports it) is as deleting it leaves it: the inode
    /// still goes, or an orphan's missing list would fail every mount, and
    /// fsck's repair, which mounts the same way.
    fn delete_blocks(&mut self, i: &Inode) -> FsResult<()> {
        let lists = i.xattrs.iter().filter_map(|(_, v)| v.list());
        for l in (i.list != 0).then_some(i.list).into_iter().chain(lists) {
            // uip gives freed list numbers out again (once its table's ran
            // out): a later list must not find these buckets.
            let gone: Vec<_> = self
                .st
                .buckets
                .range((l, 0)..=(l, u64::MAX))
                .map(|(k, _)| *k)
                .collect();
            for k in gone {
                self.st.buckets.remove(&k);
            }
            match self.ld().delete_list(Some(self.aru), ListId(l)) {
                Ok(()) | Err(LdError::NoSuchList(_)) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Stores an attribute value: in the record up to
    /// `XATTR_INLINE_VALUE_MAX` bytes, else in a new list of its own.
    fn store_xattr_value(&mut self, value: &[u8]) -> FsResult<XattrValue> {
        if value.len() <= XATTR_INLINE_VALUE_MAX {
            return Ok(XattrValue::Inline(value.to_vec()));
        }
        let list = self.ld().create_list(
            Some(self.aru),
            ListHints {
                kind: ListKind::Metadata,
                near: Some(INODE_LIST),
                ..Default::default()
            },
        )?;
        for (k, chunk) in value.chunks(XATTR_CHUNK).enumerate() {
            self.ld().write(Some(self.aru), list, k as u64, chunk)?;
        }
        Ok(XattrValue::List {
            list: list.0,
            len: value.len() as u32,
        })
    }

    /// Deletes the list of a value that is no longer named.
    fn drop_xattr_value(&mut self, v: &XattrValue) -> FsResult<()> {
        if let Some(l) = v.list() {
            self.ld().delete_list(Some(self.aru), ListId(l))?;
        }
        Ok(())
    }

    /// What a write, truncation or chown does to privileges (Linux's
    /// `file_remove_privs`): the file capability always goes; the set-ID
    /// bits `kill` says go (never a directory's: there they mean something
    /// else).
    fn drop_privileges(&mut self, i: &mut Inode, kill: Kill) -> FsResult<()> {
        if let Ok(k) = i
            .xattrs
            .binary_search_by(|(n, _)| n.as_slice().cmp(b"security.capability"))
        {
            let (_, v) = i.xattrs.remove(k);
            self.drop_xattr_value(&v)?;
        }
        if kill != Kill::Nothing && i.kind() != Kind::Dir {
            i.mode &= !0o4000;
            if i.mode & 0o010 != 0 || kill == Kill::SuidAndSgid {
                i.mode &= !0o2000;
            }
        }
        Ok(())
    }

    /// Destroys an orphan (last close, or mount after a crash). Writes
    /// nothing but deletes, so it needs no reservation. The blocks go
    /// last, as in `apply`.
    fn destroy(&mut self, ino: u64) -> FsResult<()> {
        let i = match self.inode(ino) {
            Ok(i) if i.nlink == 0 => Some(i),
            Ok(_) | Err(FsError::NotFound) => None,
            Err(e) => return Err(e),
        };
        self.ld().delete(Some(self.aru), ORPHAN_LIST, ino)?;
        if let Some(i) = i {
            self.forget_inode(&i)?;
            self.delete_blocks(&i)?;
        }
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
        let p = self.dir_inode(parent)?;
        let mut plan = Plan::default();
        let e = self.plan_remove(&mut plan, &p, name)?;
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
        let now = self.fs.now();
        let pp = self.planned(&mut plan, parent)?;
        if i.kind() == Kind::Dir {
            pp.nlink = pp.nlink.saturating_sub(1);
        }
        stamp(pp, now, true, true);
        self.plan_unlink(&mut plan, i.ino, now)?;
        self.reserve_freeing(plan.bytes())?;
        self.apply(plan)
    }

    fn link(&mut self, ino: u64, parent: u64, name: &[u8]) -> FsResult<Attr> {
        check_name(name)?;
        let i = self.inode(ino)?;
        if i.kind() == Kind::Dir {
            return Err(FsError::Perm);
        }
        if i.nlink >= LINK_MAX {
            return Err(FsError::TooManyLinks);
        }
        if i.nlink == 0 {
            return Err(FsError::NotFound);
        }
        let p = self.dir_inode(parent)?;
        let mut plan = Plan::default();
        self.plan_add(&mut plan, &p, name, ino, i.kind())?;
        let now = self.fs.now();
        stamp(self.planned(&mut plan, parent)?, now, true, true);
        let i = self.planned(&mut plan, ino)?;
        i.nlink += 1;
        stamp(i, now, false, true);
        let attr = self.fs.attr(i);
        self.reserve(plan.bytes())?;
        self.apply(plan)?;
        Ok(attr)
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

    /// Reads every inode and bucket it changes and checks everything
    /// first; then writes each changed record once.
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
        let np = self.dir_inode(newparent)?;
        let mut plan = Plan::default();
        let find = |entries: &[dir::Entry], name: &[u8]| -> Option<dir::Entry> {
            entries.iter().find(|e| e.name == name).cloned()
        };
        let src = find(self.planned_bucket(&mut plan, &p, name)?, name).ok_or(FsError::NotFound)?;
        let dst = find(self.planned_bucket(&mut plan, &np, newname)?, newname);
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
        let now = self.fs.now();
        if flags.exchange {
            let d = dst.expect("checked above");
            let di = self.inode(d.ino)?;
            if di.kind() == Kind::Dir && self.is_ancestor(d.ino, parent)? {
                return Err(FsError::Invalid(
                    "a directory cannot move into itself".into(),
                ));
            }
            return self.exchange(plan, (&p, name, si), (&np, newname, di), now);
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
        let is_dir = si.kind() == Kind::Dir;
        if is_dir && parent != newparent && replaced.is_none() && np.nlink >= LINK_MAX {
            return Err(FsError::TooManyLinks);
        }
        self.plan_remove(&mut plan, &p, name)?;
        if let Some(di) = &replaced {
            self.plan_remove(&mut plan, &np, newname)?;
            if di.kind() == Kind::Dir {
                let npp = self.planned(&mut plan, newparent)?;
                npp.nlink = npp.nlink.saturating_sub(1);
            }
            self.plan_unlink(&mut plan, di.ino, now)?;
        }
        self.plan_add(&mut plan, &np, newname, src.ino, si.kind())?;
        if is_dir && parent != newparent {
            let pp = self.planned(&mut plan, parent)?;
            pp.nlink = pp.nlink.saturating_sub(1);
            self.planned(&mut plan, newparent)?.nlink += 1;
        }
        stamp(self.planned(&mut plan, parent)?, now, true, true);
        stamp(self.planned(&mut plan, newparent)?, now, true, true);
        let s = self.planned(&mut plan, src.ino)?;
        if is_dir || s.kind() == Kind::File {
            s.parent = newparent;
        }
        stamp(s, now, false, true);
        self.reserve_freeing(plan.bytes())?;
        self.apply(plan)
    }

    /// RENAME_EXCHANGE: the two entries swap the inodes they name (in
    /// place, so readdir positions stay).
    fn exchange(
        &mut self,
        mut plan: Plan,
        (p, name, a): (&Inode, &[u8], Arc<Inode>),
        (np, newname, b): (&Inode, &[u8], Arc<Inode>),
        now: Time,
    ) -> FsResult<()> {
        for (d, n, to) in [(p, name, &b), (np, newname, &a)] {
            let e = self
                .planned_bucket(&mut plan, d, n)?
                .iter_mut()
                .find(|e| e.name == n)
                .ok_or(FsError::NotFound)?;
            e.ino = to.ino;
            e.kind = to.kind().code();
        }
        stamp(self.planned(&mut plan, p.ino)?, now, true, true);
        stamp(self.planned(&mut plan, np.ino)?, now, true, true);
        let (ad, bd) = (a.kind() == Kind::Dir, b.kind() == Kind::Dir);
        if p.ino != np.ino && ad != bd {
            // A directory moved from one parent to the other.
            let (from, to) = if ad { (p.ino, np.ino) } else { (np.ino, p.ino) };
            let f = self.planned(&mut plan, from)?;
            f.nlink = f.nlink.saturating_sub(1);
            self.planned(&mut plan, to)?.nlink += 1;
        }
        for (ino, newp) in [(a.ino, np.ino), (b.ino, p.ino)] {
            let i = self.planned(&mut plan, ino)?;
            if matches!(i.kind(), Kind::Dir | Kind::File) {
                i.parent = newp;
            }
            stamp(i, now, false, true);
        }
        self.reserve_freeing(plan.bytes())?;
        self.apply(plan)
    }

    // ---- attributes and data ----------------------------------------------

    fn setattr(&mut self, ino: u64, sa: &SetAttr) -> FsResult<Attr> {
        let mut i = self.inode_mut(ino)?;
        let now = self.fs.now();
        let mut resize = Resize::default();
        let grows = sa.size.is_some_and(|s| s > i.size);
        if let Some(size) = sa.size {
            match i.kind() {
                Kind::File => {}
                Kind::Dir => return Err(FsError::IsDir),
                _ => return Err(FsError::Invalid("truncate of a special file".into())),
            }
            if size > MAX_FILE_BYTES {
                return Err(FsError::FileTooBig);
            }
            resize = self.plan_resize(&mut i, size)?;
            self.drop_privileges(&mut i, sa.kill)?;
            stamp(&mut i, now, true, true);
        }
        if let Some(mode) = sa.mode {
            i.mode = (i.mode & 0o170000) | (mode & 0o7777);
            // chmod rewrites the access ACL's owner, group class and other
            // entries (`posix_acl_chmod`).
            if let Ok(k) = i
                .xattrs
                .binary_search_by(|(n, _)| n.as_slice().cmp(acl::ACCESS))
            {
                let old = self.fs.xattr_value(ino, &i.xattrs[k].1)?;
                if let Some(mut a) = acl::Acl::parse(&old) {
                    a.chmod(mode);
                    let v = self.store_xattr_value(&a.encode())?;
                    let was = std::mem::replace(&mut i.xattrs[k].1, v);
                    self.drop_xattr_value(&was)?;
                }
            }
            stamp(&mut i, now, false, true);
        }
        if sa.uid.is_some() || sa.gid.is_some() || sa.chown {
            if let Some(u) = sa.uid {
                i.uid = u;
            }
            if let Some(g) = sa.gid {
                i.gid = g;
            }
            // chown clears set-user-ID, and set-group-ID when the group
            // can execute or `kill` says so, and the file capability, even
            // to the same owner (Linux's chown_common).
            self.drop_privileges(&mut i, sa.kill.max(Kill::SuidAndExecSgid))?;
            stamp(&mut i, now, false, true);
        }
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
        // Attribute changes rewrite the record in place; truncation frees
        // blocks. Growing frees nothing (it may move inline data to a
        // block of its own): on a full file system it gets ENOSPC like a
        // write, and leaves the reserve to operations that free.
        let bytes = i.encoded_len() as u64 + resize.bytes();
        if grows {
            self.reserve(bytes)?;
        } else {
            self.reserve_freeing(bytes)?;
        }
        // The blocks cut go last (see `apply`).
        let cut = resize.cut_from.take();
        self.apply_resize(&mut i, resize)?;
        self.put(&i)?;
        if let Some(from) = cut {
            self.ld()
                .delete_range(Some(self.aru), ListId(i.list), from..u64::MAX)?;
        }
        Ok(self.fs.attr(&i))
    }

    /// Sets `i`'s size in memory and works out (reading what it needs) the
    /// blocks the change writes; `apply_resize` writes them.
    fn plan_resize(&mut self, i: &mut Inode, size: u64) -> FsResult<Resize> {
        let mut r = Resize::default();
        if i.list == 0 {
            if size as usize <= INLINE_MAX {
                i.inline.resize(size as usize, 0);
            } else {
                r.spill = Some(std::mem::take(&mut i.inline));
            }
            i.size = size;
            return Ok(r);
        }
        if size < i.size {
            r.cut_from = Some(size.div_ceil(BLOCK_BYTES));
            let tail = size % BLOCK_BYTES;
            if tail != 0 {
                let b = size / BLOCK_BYTES;
                if let Some(mut data) = self.ld().read(ListId(i.list), b)? {
                    if data.len() as u64 > tail {
                        data.truncate(tail as usize);
                        r.tail = Some((b, data));
                    }
                }
            }
        }
        i.size = size;
        Ok(r)
    }

    /// Writes what `plan_resize` worked out; the caller deletes the blocks
    /// cut (`cut_from`, taken out first), as its last step.
    fn apply_resize(&mut self, i: &mut Inode, r: Resize) -> FsResult<()> {
        assert!(
            r.cut_from.is_none(),
            "blocks cut are the caller's last step"
        );
        if let Some(data) = r.spill {
            self.spill(i, &data, true)?;
        }
        let list = ListId(i.list);
        if let Some((b, data)) = r.tail {
            self.ld().write(Some(self.aru), list, b, &data)?;
        }
        Ok(())
    }

    /// The list a file's new list is placed near: that of the directory
    /// the file was made in (or last moved to), so an LD that places data
    /// by directory can keep a directory's files together (DualFS 3.1:
    /// files take their blocks from their directory's group). A hint
    /// only: none if that directory is gone or its record unreadable.
    /// How `i`'s data list stores blocks: its `user.ldfs.compress` (its
    /// own, or inherited at creation), else the mount's `compress=`. A
    /// value that does not parse (set before validation, or damaged) is
    /// ignored: it steers storage, never correctness.
    fn compression_of(&self, i: &Inode) -> FsResult<Compression> {
        match i
            .xattrs
            .binary_search_by(|(n, _)| n.as_slice().cmp(COMPRESS_XATTR))
        {
            Ok(k) => {
                let v = self.fs.xattr_value(i.ino, &i.xattrs[k].1)?;
                Ok(parse_compress_value(&v).unwrap_or(self.fs.default_compression()))
            }
            Err(_) => Ok(self.fs.default_compression()),
        }
    }

    fn near_dir(&mut self, i: &Inode) -> Option<ListId> {
        if i.parent == 0 || i.kind() != Kind::File {
            return None;
        }
        let p = match self.st.inodes.get(&i.parent) {
            Some(p) => Inode::clone(p),
            None => {
                let b = self.ld().read(INODE_LIST, i.parent).ok()??;
                Inode::decode(i.parent, &b, i.parent).ok()?
            }
        };
        (p.kind() == Kind::Dir && p.list != 0).then_some(ListId(p.list))
    }

    /// Gives an inline file (its data taken out as `data`) a list of
    /// blocks, writing `data` there if `write` (not when the caller
    /// rewrites those bytes itself).
    fn spill(&mut self, i: &mut Inode, data: &[u8], write: bool) -> FsResult<()> {
        let hints = ListHints {
            kind: ListKind::Data,
            near: self.near_dir(i),
            compress: self.compression_of(i)?,
            ..Default::default()
        };
        let list = match self.ld().create_list(Some(self.aru), hints) {
            // The directory's list went meanwhile (damage): no hint then.
            Err(LdError::NoSuchList(_)) if hints.near.is_some() => self.ld().create_list(
                Some(self.aru),
                ListHints {
                    near: None,
                    ..hints
                },
            )?,
            r => r?,
        };
        if write {
            for (k, chunk) in data.chunks(BLOCK_BYTES as usize).enumerate() {
                self.ld().write(Some(self.aru), list, k as u64, chunk)?;
            }
        }
        i.list = list.0;
        Ok(())
    }

    fn write(&mut self, ino: u64, offset: u64, data: &[u8], kill: Kill) -> FsResult<usize> {
        let mut i = self.inode_mut(ino)?;
        match i.kind() {
            Kind::File => {}
            Kind::Dir => return Err(FsError::IsDir),
            _ => return Err(FsError::Invalid("write to a special file".into())),
        }
        if data.is_empty() {
            return Ok(0);
        }
        let counted = self.fs.counted_blocks(&i);
        let end = offset
            .checked_add(data.len() as u64)
            .filter(|&e| e <= MAX_FILE_BYTES)
            .ok_or(FsError::FileTooBig)?;
        let now = self.fs.now();
        if i.list == 0 && end as usize <= INLINE_MAX {
            if i.inline.len() < end as usize {
                i.inline.resize(end as usize, 0);
            }
            i.inline[offset as usize..end as usize].copy_from_slice(data);
            i.size = i.size.max(end);
            self.drop_privileges(&mut i, kill)?;
            stamp(&mut i, now, true, true);
            self.reserve(i.encoded_len() as u64)?;
            self.put_owned(i)?;
            return Ok(data.len());
        }
        // Reads first: the blocks the write covers in part (at most the
        // first and the last), merged with the new bytes. An inline file's
        // data becomes block 0.
        let spill = (i.list == 0).then(|| std::mem::take(&mut i.inline));
        let (first, last) = (offset / BLOCK_BYTES, (end - 1) / BLOCK_BYTES);
        let mut edges: Vec<(u64, Vec<u8>)> = Vec::new();
        for b in [first, last] {
            let bstart = b * BLOCK_BYTES;
            let lo = (offset.max(bstart) - bstart) as usize;
            let hi = (end.min(bstart + BLOCK_BYTES) - bstart) as usize;
            if (lo == 0 && hi == BLOCK_BYTES as usize) || edges.iter().any(|e| e.0 == b) {
                continue;
            }
            let mut block = match &spill {
                Some(inline) if b == 0 => inline.clone(),
                Some(_) => Vec::new(),
                None => self.ld().read(ListId(i.list), b)?.unwrap_or_default(),
            };
            // Bytes of the block beyond the old size read as zeros.
            let valid = i.size.saturating_sub(bstart).min(BLOCK_BYTES) as usize;
            block.truncate(valid);
            if block.len() < hi {
                block.resize(hi, 0);
            }
            let at = (bstart + lo as u64 - offset) as usize;
            block[lo..hi].copy_from_slice(&data[at..at + (hi - lo)]);
            edges.push((b, block));
        }
        // The inline data is written as block 0 unless the write rewrites it.
        let spill_bytes = spill
            .as_ref()
            .filter(|_| first > 0)
            .map_or(0, |d| d.len() as u64);
        let covered: u64 = edges
            .iter()
            .map(|(b, _)| {
                let bstart = b * BLOCK_BYTES;
                end.min(bstart + BLOCK_BYTES) - offset.max(bstart)
            })
            .sum();
        let edge_bytes: u64 = edges.iter().map(|e| e.1.len() as u64).sum();
        i.size = i.size.max(end);
        self.drop_privileges(&mut i, kill)?;
        stamp(&mut i, now, true, true);
        self.reserve(
            spill_bytes + edge_bytes + (data.len() as u64 - covered) + i.encoded_len() as u64,
        )?;
        if let Some(inline) = spill {
            self.spill(&mut i, &inline, first > 0)?;
        }
        let list = ListId(i.list);
        // A counted file stays counted: the blocks this write adds are those
        // of first..=last not there before (one range lookup, not a scan).
        let counted = match counted {
            Some(n) => {
                let span = last - first + 1;
                let there = self.ld().indices(list, first, span as usize)?;
                let there = there.iter().filter(|&&x| x <= last).count() as u64;
                Some(n + (span - there) * (BLOCK_BYTES / 512))
            }
            _ => None,
        };
        for b in first..=last {
            if let Some((_, block)) = edges.iter().find(|e| e.0 == b) {
                self.ld().write(Some(self.aru), list, b, block)?;
            } else {
                let at = (b * BLOCK_BYTES - offset) as usize;
                self.ld().write(
                    Some(self.aru),
                    list,
                    b,
                    &data[at..at + BLOCK_BYTES as usize],
                )?;
            }
        }
        let i = self.put_owned(i)?;
        if let Some(n) = counted {
            self.fs.count_blocks(&i, n);
        }
        Ok(data.len())
    }

    fn setxattr(
        &mut self,
        ino: u64,
        name: &[u8],
        value: &[u8],
        mode: XattrMode,
        kill_sgid: bool,
    ) -> FsResult<()> {
        if name.is_empty() || name.len() > XATTR_NAME_MAX {
            return Err(FsError::Range);
        }
        if value.len() > XATTR_VALUE_MAX {
            return Err(FsError::ValueTooBig);
        }
        let mut i = self.inode_mut(ino)?;
        let pos = i.xattrs.binary_search_by(|(n, _)| n.as_slice().cmp(name));
        match (pos, mode) {
            (Ok(_), XattrMode::Create) => return Err(FsError::Exists),
            (Err(_), XattrMode::Replace) => return Err(FsError::NoAttr),
            _ => {}
        }
        // The compression policy: checked before anything is written; a
        // file with data switches its list for new writes.
        let recompress = if name == COMPRESS_XATTR {
            let c = parse_compress_value(value).map_err(FsError::Invalid)?;
            if !matches!(i.kind(), Kind::File | Kind::Dir) {
                return Err(FsError::Invalid(format!(
                    "{}: only files and directories have a compression policy",
                    String::from_utf8_lossy(COMPRESS_XATTR)
                )));
            }
            (i.kind() == Kind::File && i.list != 0).then_some(c)
        } else {
            None
        };
        let in_record = |v: &[u8]| {
            if v.len() <= XATTR_INLINE_VALUE_MAX {
                v.len()
            } else {
                8
            }
        };
        let old = pos.map_or(0, |k| i.xattrs[k].0.len() + i.xattrs[k].1.record_bytes());
        if i.xattr_bytes() - old + name.len() + in_record(value) > XATTR_MAX
            || (pos.is_err() && i.xattrs.len() >= inode::XATTR_COUNT_MAX)
        {
            return Err(FsError::NoSpace { short: None });
        }
        self.reserve(
            (i.encoded_len() + name.len() + value.len()) as u64
                + if recompress.is_some() {
                    LIST_HINTS_BYTES
                } else {
                    0
                },
        )?;
        if let Some(c) = recompress {
            self.ld()
                .set_compression(Some(self.aru), ListId(i.list), c)?;
        }
        // An access ACL sets the mode bits (`posix_acl_update_mode`); one
        // that says no more than they do is not kept (no `+` in ls -l).
        let mut keep = true;
        if name == acl::ACCESS || name == acl::DEFAULT {
            // Linux takes ACLs of at most a page through FUSE; so they
            // always live in the record, where creates copy them from.
            if value.len() > XATTR_INLINE_VALUE_MAX {
                return Err(FsError::ValueTooBig);
            }
            let (bits, extended) = acl::Acl::parse(value)
                .and_then(|a| a.mode())
                .ok_or_else(|| FsError::Invalid("not a POSIX ACL".into()))?;
            if name == acl::ACCESS {
                i.mode = (i.mode & !0o777) | bits;
                if kill_sgid {
                    i.mode &= !0o2000;
                }
                keep = extended;
            }
        }
        match (pos, keep) {
            (Ok(k), true) => {
                let v = self.store_xattr_value(value)?;
                let was = std::mem::replace(&mut i.xattrs[k].1, v);
                self.drop_xattr_value(&was)?;
            }
            (Err(k), true) => {
                let v = self.store_xattr_value(value)?;
                i.xattrs.insert(k, (name.to_vec(), v));
            }
            (Ok(k), false) => {
                let (_, was) = i.xattrs.remove(k);
                self.drop_xattr_value(&was)?;
            }
            (Err(_), false) => {}
        }
        stamp(&mut i, self.fs.now(), false, true);
        self.put(&i)
    }

    fn removexattr(&mut self, ino: u64, name: &[u8]) -> FsResult<()> {
        let mut i = self.inode_mut(ino)?;
        let k = i
            .xattrs
            .binary_search_by(|(n, _)| n.as_slice().cmp(name))
            .map_err(|_| FsError::NoAttr)?;
        let (_, v) = i.xattrs.remove(k);
        stamp(&mut i, self.fs.now(), false, true);
        // Without its own policy a file's new writes follow the mount's.
        let recompress = name == COMPRESS_XATTR && i.kind() == Kind::File && i.list != 0;
        self.reserve_freeing(
            i.encoded_len() as u64 + if recompress { LIST_HINTS_BYTES } else { 0 },
        )?;
        if recompress {
            self.ld().set_compression(
                Some(self.aru),
                ListId(i.list),
                self.fs.default_compression(),
            )?;
        }
        self.drop_xattr_value(&v)?;
        self.put(&i)
    }

    fn fallocate(&mut self, ino: u64, offset: u64, len: u64, mode: FallocMode) -> FsResult<()> {
        let mut i = self.inode_mut(ino)?;
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
        let now = self.fs.now();
        if mode.punch_hole || mode.zero_range {
            // Frees blocks: deletes the whole ones, rewrites at most two
            // partial ones no longer than they were, so it works on a full
            // file system (unless it also extends the file).
            let zero_to = end.min(i.size);
            let zeroing = if offset < zero_to {
                self.plan_zero(&mut i, offset, zero_to)?
            } else {
                Zeroing::default()
            };
            let grows = mode.zero_range && !mode.keep_size && end > i.size;
            let grow = if grows {
                self.plan_resize(&mut i, end)?
            } else {
                Resize::default()
            };
            stamp(&mut i, now, true, true);
            let edges: u64 = zeroing.edges.iter().map(|e| e.1.len() as u64).sum();
            let bytes = i.encoded_len() as u64 + edges + grow.bytes();
            // Extending the file frees nothing: as in `setattr`.
            if grows {
                self.reserve(bytes)?;
            } else {
                self.reserve_freeing(bytes)?;
            }
            let list = ListId(i.list);
            for (b, block) in &zeroing.edges {
                self.ld().write(Some(self.aru), list, *b, block)?;
            }
            self.apply_resize(&mut i, grow)?;
            self.put(&i)?;
            // The blocks cut go last (see `apply`).
            if let Some(cut) = zeroing.cut {
                self.ld().delete_range(Some(self.aru), list, cut)?;
            }
            return Ok(());
        }
        // Allocate: every hole in the range becomes a written block of
        // zeros, so the space is taken now (ENOSPC here, not later).
        let mut grow = if !mode.keep_size && end > i.size {
            self.plan_resize(&mut i, end)?
        } else {
            Resize::default()
        };
        if i.list == 0 && end as usize > INLINE_MAX && grow.spill.is_none() {
            grow.spill = Some(std::mem::take(&mut i.inline));
        }
        let holes = self.holes(&i, grow.spill.as_deref(), offset, end)?;
        // Within the size, a block is as long as the file lets it be;
        // beyond it (KEEP_SIZE), a full block.
        let size = i.size;
        let hole_len = |h: u64| {
            let start = h * BLOCK_BYTES;
            if start < size {
                (size - start).min(BLOCK_BYTES)
            } else {
                BLOCK_BYTES
            }
        };
        let zeros: u64 = holes.iter().flat_map(|r| r.clone()).map(hole_len).sum();
        stamp(&mut i, now, true, true);
        self.reserve(i.encoded_len() as u64 + grow.bytes() + zeros)?;
        self.apply_resize(&mut i, grow)?;
        let list = ListId(i.list);
        for h in holes.into_iter().flatten() {
            let zero = vec![0u8; hole_len(h) as usize];
            self.ld().write(Some(self.aru), list, h, &zero)?;
        }
        self.put(&i)
    }

    /// The absent blocks of `i` covering `[offset, end)`, as runs; `spill`
    /// is inline data about to become block 0 of a new list. None for a
    /// file that stays inline.
    fn holes(
        &self,
        i: &Inode,
        spill: Option<&[u8]>,
        offset: u64,
        end: u64,
    ) -> FsResult<Vec<std::ops::Range<u64>>> {
        let (first, last) = (offset / BLOCK_BYTES, end.div_ceil(BLOCK_BYTES));
        let mut out = Vec::new();
        if let Some(inline) = spill {
            let from = if inline.is_empty() {
                first
            } else {
                first.max(1)
            };
            if from < last {
                out.push(from..last);
            }
            return Ok(out);
        }
        if i.list == 0 {
            return Ok(out);
        }
        let list = ListId(i.list);
        let mut b = first;
        while b < last {
            let present = self.ld().indices(list, b, 1)?;
            let next = present.first().copied().unwrap_or(u64::MAX).min(last);
            if b < next {
                out.push(b..next);
            }
            b = next.saturating_add(1);
        }
        Ok(out)
    }

    /// Zeros `[from, to)` of `i` (within its size): whole blocks become
    /// holes, partial ones are read and zeroed here, written by the caller.
    fn plan_zero(&mut self, i: &mut Inode, from: u64, to: u64) -> FsResult<Zeroing> {
        let mut z = Zeroing::default();
        if i.list == 0 {
            i.inline[from as usize..to as usize].fill(0);
            return Ok(z);
        }
        let list = ListId(i.list);
        let first_full = from.div_ceil(BLOCK_BYTES);
        let last_full = to / BLOCK_BYTES;
        if first_full < last_full {
            z.cut = Some(first_full..last_full);
        }
        for b in [from / BLOCK_BYTES, to / BLOCK_BYTES] {
            let bstart = b * BLOCK_BYTES;
            if (b >= first_full && b < last_full) || z.edges.iter().any(|e| e.0 == b) {
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
                    z.edges.push((b, block));
                }
            }
        }
        Ok(z)
    }
}

/// A file system dropped with atimes still in memory writes them (the LD's
/// close, which follows, then makes them durable).
impl Drop for Fs {
    fn drop(&mut self) {
        // Not while unwinding: a panic here would abort the process.
        if !std::thread::panicking() {
            self.write_kept();
        }
    }
}

impl Drop for Tx<'_> {
    /// An operation dropped without `finish` (an early return, a panic)
    /// is taken back rather than left open: an open ARU would hold back
    /// every checkpoint.
    fn drop(&mut self) {
        // Not while panicking: the engine's lock may be poisoned, and a
        // second panic would abort the process before its final checkpoint.
        if !self.done && !std::thread::panicking() {
            self.done = true;
            self.abort();
        }
    }
}

/// Caches a bucket as the LD now holds it; a full cache drops its absent
/// buckets, or starts over (as the inode cache does: simpler than an LRU,
/// and refilled by lookups).
fn cache_bucket(st: &mut State, key: (u64, u64), entries: Arc<Vec<dir::Entry>>) {
    if st.buckets.len() >= BUCKET_CACHE_MAX {
        // Absent buckets go first: lookups of missing names (a build
        // probing include paths) must not push out the names that exist
        // (review 28, F3). Clearing frees at least a quarter either way.
        st.buckets.retain(|_, e| !e.is_empty());
        if st.buckets.len() >= BUCKET_CACHE_MAX / 4 * 3 {
            st.buckets.clear();
        }
    }
    st.buckets.insert(key, entries);
}

/// Appends an entry to a bucket, which holds at most `dir::BUCKET_MAX`.
fn push_entry(entries: &mut Vec<dir::Entry>, name: &[u8], ino: u64, kind: Kind) -> FsResult<()> {
    if entries.len() >= dir::BUCKET_MAX {
        return Err(FsError::NoSpace { short: None });
    }
    entries.push(dir::Entry {
        name: name.to_vec(),
        ino,
        kind: kind.code(),
    });
    Ok(())
}

/// A new, empty root directory whose buckets live in `list` (mkfs, and
/// fsck when the root's record is lost).
fn empty_root(list: ListId, ctx: Ctx, now: Time) -> Inode {
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

/// When a read that reaches ldfs updates atime (the mount's `noatime`,
/// `relatime`, `strictatime`; Linux's rules).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AtimeMode {
    /// Never.
    NoAtime,
    /// When atime is not after mtime or ctime, or is a day old (the
    /// kernel's default).
    #[default]
    Relatime,
    /// Every read.
    StrictAtime,
}

impl Fs {
    /// Inode `ino` was read (a file's data, a directory's entries): updates
    /// its atime as `mode` says. Does nothing on a read-only file system.
    pub fn accessed(&self, ino: u64, mode: AtimeMode) -> FsResult<()> {
        if mode == AtimeMode::NoAtime || self.is_read_only() {
            return Ok(());
        }
        let now = self.now();
        // Kept in memory, not written (an ARU per file read was most of a
        // read-only workload's log writes): Sprite LFS kept the access
        // time in its inode map so that reading never rewrote an inode
        // (BSD-LFS section 4 recalls why). The record goes out with the
        // inode's next change or the next flush (`write_atimes`), so
        // after a crash an atime may be older than operations that
        // survived it, as under Linux's `lazytime`.
        let full = {
            let mut st = self.lock();
            // Again under the lock, as `begin` does: `set_read_only`
            // writes what is kept before its flag, then waits for the lock.
            if self.is_read_only() {
                return Ok(());
            }
            let i = self.get_inode(&mut st, ino)?;
            if !atime_needs_update(&i, mode, now) {
                return Ok(());
            }
            drop(i);
            // In place unless an operation holds the record now: a copy
            // of the record (inline data too) and a new Arc for every
            // small file read was a fifth of a read's time (issue 16).
            let cached = st.inodes.get_mut(&ino).expect("cached by get_inode");
            Arc::make_mut(cached).atime = now;
            st.atime_dirty.insert(ino);
            self.atimes_kept
                .store(true, std::sync::atomic::Ordering::Release);
            st.atime_dirty.len() >= ATIME_BATCH
        };
        if full {
            self.write_atimes();
        }
        Ok(())
    }
}

impl Fs {
    /// Whether a read of `ino` now would update its atime under `mode`
    /// (`accessed` would write). The FUSE adapter lets the kernel keep a
    /// file's cached pages across opens only when it would not, so every
    /// read that must update atime still reaches ldfs.
    pub fn atime_due(&self, ino: u64, mode: AtimeMode) -> FsResult<bool> {
        if mode == AtimeMode::NoAtime || self.is_read_only() {
            return Ok(false);
        }
        let now = self.now();
        let mut st = self.lock();
        Ok(match st.inodes.get(&ino) {
            Some(i) => atime_needs_update(i, mode, now),
            None => atime_needs_update(&*self.get_inode(&mut st, ino)?, mode, now),
        })
    }
}

fn atime_needs_update(i: &Inode, mode: AtimeMode, now: Time) -> bool {
    match mode {
        AtimeMode::NoAtime => false,
        AtimeMode::StrictAtime => i.atime != now,
        // relatime_need_update() in fs/inode.c.
        AtimeMode::Relatime => {
            i.mtime >= i.atime || i.ctime >= i.atime || now.secs - i.atime.secs >= 24 * 3600
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::MemoryDevice;
    use crate::lld::layout::MkfsOptions;
    use crate::lld::{Lld, LldOptions};
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    const ROOT: Ctx = Ctx {
        uid: 0,
        gid: 0,
        umask: 0,
    };

    fn fresh() -> Arc<Fs> {
        let dev = Arc::new(MemoryDevice::new(32 << 20));
        let mkfs = MkfsOptions {
            segment_bytes: 512 << 10,
            max_block_bytes: 64 << 10,
            reserved_segments: Some(4),
            fs_id: 5,
            max_bytes: None,
            kept_pages: 0,
        };
        let lld = Lld::create(dev, &mkfs, LldOptions::default()).unwrap();
        Fs::format(&lld, ROOT).unwrap();
        Arc::new(Fs::mount(Arc::new(lld), FsOptions::default()).unwrap())
    }

    /// A fresh file system (64 MiB) whose clock is `clock`, in seconds
    /// from 1,000,000, and its engine.
    fn clocked() -> (Arc<Lld>, Arc<std::sync::atomic::AtomicI64>, Fs) {
        let dev = Arc::new(MemoryDevice::new(64 << 20));
        let mkfs = MkfsOptions {
            segment_bytes: 512 << 10,
            max_block_bytes: 64 << 10,
            reserved_segments: Some(4),
            fs_id: 5,
            max_bytes: None,
            kept_pages: 0,
        };
        let lld = Arc::new(Lld::create(dev, &mkfs, LldOptions::default()).unwrap());
        let clock = Arc::new(std::sync::atomic::AtomicI64::new(1_000_000));
        let c = clock.clone();
        let opts = FsOptions {
            clock: Box::new(move || Time {
                secs: c.load(Ordering::Relaxed),
                nsecs: 0,
            }),
            ..Default::default()
        };
        Fs::format_at(&*lld, ROOT, (opts.clock)()).unwrap();
        let fs = Fs::mount(lld.clone(), opts).unwrap();
        (lld, clock, fs)
    }

    /// `atime_due` says whether a read would update atime, as `accessed`
    /// decides it: under relatime a file written since its last read is
    /// due, one read since is not (a day later it is again); strictatime
    /// is due whenever the clock moved; noatime never.
    #[test]
    fn atime_due_agrees_with_what_accessed_writes() {
        let (_, clock, fs) = clocked();
        let f = fs.mknod(ROOT, ROOT_INO, b"f", 0o100644, 0).unwrap().ino;
        fs.write(f, 0, b"data").unwrap();
        let tick = |s: i64| clock.fetch_add(s, Ordering::Relaxed);
        tick(1);
        assert!(fs.atime_due(f, AtimeMode::Relatime).unwrap());
        assert!(!fs.atime_due(f, AtimeMode::NoAtime).unwrap());
        fs.accessed(f, AtimeMode::Relatime).unwrap();
        assert!(!fs.atime_due(f, AtimeMode::Relatime).unwrap());
        tick(60);
        assert!(!fs.atime_due(f, AtimeMode::Relatime).unwrap());
        assert!(fs.atime_due(f, AtimeMode::StrictAtime).unwrap());
        fs.write(f, 0, b"more").unwrap();
        assert!(
            fs.atime_due(f, AtimeMode::Relatime).unwrap(),
            "written since"
        );
        fs.accessed(f, AtimeMode::Relatime).unwrap();
        tick(24 * 3600);
        assert!(fs.atime_due(f, AtimeMode::Relatime).unwrap(), "a day old");
    }

    /// An access time is kept in memory: the read that updates it writes
    /// nothing to the LD; the inode's next change, a flush, a remount
    /// read-only, a batch of `ATIME_BATCH`, or dropping the file system
    /// writes it; a destroyed inode's is forgotten.
    #[test]
    fn access_times_are_written_lazily() {
        let (lld, clock, fs) = clocked();
        let on_ld = |ino: u64| {
            let b = lld.read(INODE_LIST, ino).unwrap().unwrap();
            Inode::decode(ino, &b, ino).unwrap().atime.secs
        };
        let files: Vec<u64> = (0..ATIME_BATCH as u64 + 5)
            .map(|k| {
                let f = fs.mknod(ROOT, ROOT_INO, format!("f{k}").as_bytes(), 0o100644, 0);
                f.unwrap().ino
            })
            .collect();
        clock.fetch_add(10, Ordering::Relaxed);
        let (a, b, c, d) = (files[0], files[1], files[2], files[3]);
        for &f in &[a, b, c, d] {
            fs.accessed(f, AtimeMode::Relatime).unwrap();
            assert_eq!(fs.getattr(f).unwrap().atime.secs, 1_000_010);
            assert_eq!(on_ld(f), 1_000_000, "a read wrote inode {f}");
        }
        // The next change of b carries it; unlinking c forgets it.
        fs.setxattr(b, b"user.x", b"1", XattrMode::Any).unwrap();
        assert_eq!(on_ld(b), 1_000_010);
        fs.unlink(ROOT_INO, b"f2").unwrap();
        assert!(!fs.lock().atime_dirty.contains(&c));
        // A flush writes the rest.
        fs.fsync().unwrap();
        assert_eq!(on_ld(a), 1_000_010);
        assert_eq!(on_ld(d), 1_000_010);
        assert!(fs.lock().atime_dirty.is_empty());
        // A batch goes out on its own, without a flush.
        clock.fetch_add(10, Ordering::Relaxed);
        for &f in &files[4..4 + ATIME_BATCH] {
            fs.accessed(f, AtimeMode::StrictAtime).unwrap();
        }
        assert_eq!(on_ld(files[4]), 1_000_020, "a full batch was not written");
        // A remount read-only writes what is kept before refusing writes.
        clock.fetch_add(10, Ordering::Relaxed);
        let last = files[4 + ATIME_BATCH];
        fs.accessed(last, AtimeMode::StrictAtime).unwrap();
        assert_eq!(on_ld(last), 1_000_000);
        fs.set_read_only(true).unwrap();
        assert_eq!(on_ld(last), 1_000_030);
        fs.set_read_only(false).unwrap();
        // And so does dropping the file system.
        clock.fetch_add(10, Ordering::Relaxed);
        fs.accessed(a, AtimeMode::StrictAtime).unwrap();
        assert_eq!(on_ld(a), 1_000_010);
        drop(fs);
        assert_eq!(on_ld(a), 1_000_040);
    }

    /// A plan's small map keeps its keys in order (apply writes in key
    /// order, as the BTreeMap it replaced did), makes a value once, and
    /// finds, changes and removes by key.
    #[test]
    fn few_keeps_key_order() {
        let mut f: Few<u64, &str> = Few::default();
        let mut made = 0;
        for k in [5, 1, 9, 5, 3] {
            let v = f.get_or_try_insert(k, || {
                made += 1;
                Ok::<_, ()>("new")
            });
            *v.unwrap() = "seen";
        }
        assert_eq!(made, 4, "a value made twice");
        f.insert(7, "seven");
        f.insert(7, "7");
        assert_eq!(f.get(7), Some(&"7"));
        *f.get_mut(1).unwrap() = "one";
        assert_eq!(f.remove(9), Some("seen"));
        assert_eq!(f.remove(9), None);
        assert_eq!(f.values().count(), 4);
        let keys: Vec<u64> = f.into_iter().map(|(k, _)| k).collect();
        assert_eq!(keys, vec![1, 3, 5, 7]);
        let mut f: Few<u64, u8> = Few::default();
        assert_eq!(f.get_or_try_insert(2, || Err("failed")), Err("failed"));
        assert!(f.get(2).is_none(), "a failed make inserted");
    }

    /// Unlinked inodes whose last reference goes (`unpin`, the FUSE
    /// FORGET) and that hold no blocks are destroyed together: once
    /// `RELEASED_BATCH` wait, at a flush, or when the file system is
    /// dropped; one holding blocks at once. Until then they stay on the
    /// orphan list (a crash reclaims them); one referenced again is not
    /// destroyed; an open unlinked file keeps its data through the
    /// batches; and nothing is left behind.
    #[test]
    fn released_orphans_are_destroyed_in_batches_and_none_leak() {
        let (lld, _clock, fs) = clocked();
        let orphans = || lld.indices(ORPHAN_LIST, 0, usize::MAX).unwrap();
        let records = || lld.indices(INODE_LIST, 0, usize::MAX).unwrap();
        let small = |k: usize| {
            let f = fs.mknod(ROOT, ROOT_INO, format!("s{k}").as_bytes(), 0o100644, 0);
            let f = f.unwrap().ino;
            fs.write(f, 0, format!("small {k}").as_bytes()).unwrap();
            fs.pin(f, 1); // the kernel's lookup reference
            fs.unlink(ROOT_INO, format!("s{k}").as_bytes()).unwrap();
            f
        };
        // An open unlinked file, kept open throughout.
        let held = fs.mknod(ROOT, ROOT_INO, b"held", 0o100644, 0).unwrap().ino;
        fs.write(held, 0, b"still here").unwrap();
        fs.open(held).unwrap();
        fs.unlink(ROOT_INO, b"held").unwrap();
        let files: Vec<u64> = (0..RELEASED_BATCH + 5).map(small).collect();
        assert_eq!(orphans().len(), RELEASED_BATCH + 6);
        for &f in &files[..RELEASED_BATCH - 1] {
            fs.unpin(f, 1).unwrap();
        }
        assert_eq!(
            orphans().len(),
            RELEASED_BATCH + 6,
            "destroyed before a batch"
        );
        assert!(fs.lock().inodes.contains_key(&files[0]));
        fs.unpin(files[RELEASED_BATCH - 1], 1).unwrap();
        assert_eq!(orphans().len(), 6, "a full batch was not destroyed");
        assert!(lld.read(INODE_LIST, files[0]).unwrap().is_none());
        // Referenced again before its batch: not destroyed.
        let rest = &files[RELEASED_BATCH..];
        for &f in rest {
            fs.unpin(f, 1).unwrap();
        }
        fs.pin(rest[0], 1);
        fs.fsync().unwrap();
        assert_eq!(orphans(), vec![held, rest[0]]);
        assert_eq!(fs.getattr(rest[0]).unwrap().nlink, 0);
        assert_eq!(fs.read(held, 0, 100).unwrap(), b"still here");
        // One holding blocks goes at once, taking those waiting with it.
        fs.unpin(rest[0], 1).unwrap();
        let big = fs.mknod(ROOT, ROOT_INO, b"big", 0o100644, 0).unwrap().ino;
        fs.write(big, 0, &vec![7u8; 3 * INLINE_MAX]).unwrap();
        let list = fs.lock().inodes[&big].list;
        assert_ne!(list, 0, "not a file with blocks");
        fs.pin(big, 1);
        fs.unlink(ROOT_INO, b"big").unwrap();
        fs.unpin(big, 1).unwrap();
        assert_eq!(orphans(), vec![held]);
        assert!(
            !matches!(lld.read(ListId(list), 0), Ok(Some(_))),
            "its blocks are still there"
        );
        // The last ones go when the file system is dropped.
        let last = small(1000);
        fs.unpin(last, 1).unwrap();
        fs.release(held).unwrap();
        assert_eq!(orphans(), vec![held, last]);
        drop(fs);
        assert!(orphans().is_empty(), "left on the orphan list");
        assert_eq!(records(), vec![ROOT_INO], "inode records left behind");
    }

    /// Review probe: `set_read_only(true)` stores the flag, then waits for
    /// the state lock so the operations under way finish first; an
    /// operation that passed its writable check before the store but
    /// takes the lock only after `set_read_only` returned must still be
    /// refused (the remount's checkpoint, taken next, would miss it). Here
    /// the operation waits at the lock (the test holds it) when the flag
    /// is stored: the state it is in between its check and its lock.
    #[test]
    fn an_operation_that_gets_the_lock_after_a_remount_read_only_is_refused() {
        let fs = fresh();
        let held = fs.lock();
        let op = {
            let fs = fs.clone();
            std::thread::spawn(move || fs.mkdir(ROOT, ROOT_INO, b"late", 0o755))
        };
        // Time for the operation to pass its check and wait at the lock.
        std::thread::sleep(Duration::from_millis(200));
        fs.remounted_ro.store(true, Ordering::Release);
        drop(held);
        let res = op.join().unwrap();
        assert!(
            matches!(res, Err(FsError::ReadOnly)),
            "an operation locked after the switch to read-only ran: {res:?}"
        );
        assert!(matches!(
            fs.lookup(ROOT_INO, b"late"),
            Err(FsError::NotFound)
        ));
        fs.set_read_only(false).unwrap();
        fs.mkdir(ROOT, ROOT_INO, b"late", 0o755).unwrap();
    }

    /// Review 29 probe: with no atime kept, fsync is the LD's flush and
    /// nothing else, as before lazy atimes: it does not wait for the state
    /// lock, which an operation holds from begin to finish (a long one: a
    /// large file's truncation, a write of many blocks, an operation
    /// waiting for space). `write_atimes` takes the lock only to see that
    /// its set is empty; the commit thread and every FSYNC then queue
    /// behind whatever operation runs.
    #[test]
    fn review29_fsync_with_no_kept_atime_does_not_wait_for_the_state_lock() {
        let fs = fresh();
        assert!(fs.lock().atime_dirty.is_empty());
        let (tx, rx) = std::sync::mpsc::channel();
        let holder = {
            let fs = fs.clone();
            std::thread::spawn(move || {
                let _held = fs.lock();
                tx.send(()).unwrap();
                std::thread::sleep(Duration::from_millis(600));
            })
        };
        rx.recv().unwrap();
        let t = std::time::Instant::now();
        fs.fsync().unwrap();
        let waited = t.elapsed();
        holder.join().unwrap();
        assert!(
            waited < Duration::from_millis(300),
            "fsync with nothing kept waited {waited:?} for an operation holding the state lock"
        );
    }

    /// Review 29 probe: an operation that panicked with the state lock held
    /// (a bug) poisons it. Before lazy atimes, fsync (an LD flush) and the
    /// daemon's end (drop the fs, then the LD's close and final checkpoint)
    /// never took that lock; now `write_kept`, which both call, and
    /// `Drop for Fs` do, and `lock()` panics on a poisoned lock: the
    /// daemon's end panics before its final checkpoint (and a drop during
    /// unwinding aborts the process). They must not panic.
    #[test]
    fn review29_a_poisoned_state_lock_does_not_panic_write_kept_fsync_or_drop() {
        let fs = fresh();
        let f = fs.mknod(ROOT, ROOT_INO, b"f", 0o100644, 0).unwrap().ino;
        fs.accessed(f, AtimeMode::StrictAtime).unwrap();
        // And an unlinked inode whose destroy waits for its batch.
        let g = fs.mknod(ROOT, ROOT_INO, b"g", 0o100644, 0).unwrap().ino;
        fs.pin(g, 1);
        fs.unlink(ROOT_INO, b"g").unwrap();
        fs.unpin(g, 1).unwrap();
        assert_eq!(fs.lock().released, vec![g]);
        {
            let fs = fs.clone();
            let _ = std::thread::spawn(move || {
                let _held = fs.lock();
                panic!("review29: an operation panics with the lock held");
            })
            .join();
        }
        assert!(fs.state.is_poisoned());
        // Every result first, then the asserts: a failing assert with the
        // file system still alive would drop it while unwinding, and its
        // drop panicking then aborts the whole test binary.
        let quiet =
            |f: &mut dyn FnMut()| std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).is_ok();
        let write_ok = quiet(&mut || fs.write_kept());
        let fsync_ok = quiet(&mut || {
            let _ = fs.fsync();
        });
        let mut fs = Some(fs);
        let drop_ok = quiet(&mut || drop(fs.take()));
        assert!(
            write_ok,
            "write_kept (the daemon's last call before its final checkpoint) panicked"
        );
        assert!(fsync_ok, "fsync panicked");
        assert!(drop_ok, "dropping the file system panicked");
    }
}
