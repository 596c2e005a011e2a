//! The FUSE adapter: request -> `ldfs::fs::Fs` call -> reply, nothing else
//! (STYLE 15). errno lives here and only here. How requests arrive (fuser's
//! /dev/fuse session or FUSE over io_uring) is the transport's business
//! (`transport/`): each operation here is a `FuseOps` method taking plain
//! numbers and bytes and returning plain data, which both transports call.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{Errno, FileAttr, FileType, INodeNo, InitFlags, KernelConfig, TimeOrNow, WriteFlags};
use ldfs::fs::inode::{Kind, Time};
use ldfs::fs::{self, Attr, Ctx, Fs, FsError, Kill, SetAttr, TimeSet, XattrMode};

use crate::fuse::transport::{
    Caller, DirEntry, DirEntryPlus, Entry, FuseOps, OpResult, Opened, SetattrIn, Statfs, Xattr,
};

/// The largest write (and read-ahead) asked of the kernel; a ring entry's
/// payload buffer holds this much.
pub const MAX_WRITE_BYTES: usize = 1 << 20;

/// How long the kernel may cache attributes. Every change goes through
/// this process, and the kernel invalidates what it changes itself, except
/// the atime a read through to ldfs sets: a stat sees that after this.
pub(crate) const TTL: Duration = Duration::from_secs(1);

/// How long the kernel may keep a name (and a missing one) without asking
/// again. Names change only through this mount (the image's lock makes it
/// the only one) and the kernel updates its dentries at each change it
/// makes, so this can be long: a file created or looked up once is then
/// opened, renamed or unlinked without a LOOKUP first, even seconds later
/// (with 1 s, a phase of a benchmark longer than that paid one per file).
pub const ENTRY_TTL: Duration = Duration::from_secs(30);

pub struct FuseFs {
    pub fs: Arc<Fs>,
    /// The kernel accepted FUSE_NO_OPEN_SUPPORT: OPEN and OPENDIR are
    /// answered ENOSYS once and never sent again, saving two round trips per
    /// file opened. Inode lifetime then follows the kernel's lookup
    /// references (pinned on every entry reply, released by FORGET), which
    /// the kernel holds for as long as any open file needs the inode.
    pub no_open: AtomicBool,
    /// Commands for the daemon itself (`ldfs stats`, `ldfs clean` on a
    /// mount point): extended attributes named `trusted.ldfs.*` on the root.
    pub control: Option<Arc<dyn Control>>,
    /// Ask for the kernel's writeback cache (`-o writeback_cache`): write(2)
    /// then returns once the data is in the page cache and ldfs sees it only
    /// at writeback, so a full file system fails writeback, not write(2).
    /// Off by default: every write(2) reaches ldfs, which refuses it with
    /// ENOSPC before anything is accepted.
    pub writeback_cache: bool,
    /// When reads update atime (`noatime`, `relatime`, `strictatime`).
    /// FUSE marks its inodes S_NOATIME: the kernel leaves atime to ldfs.
    pub atime: fs::AtimeMode,
    /// `nodiratime`: listing a directory never updates its atime.
    pub nodiratime: bool,
    /// FORGETs served so far (see `room`).
    pub forgets: AtomicU64,
    /// Gives space back when an operation finds none (`-o protect=`:
    /// deletes the oldest protected checkpoint).
    pub yield_space: Option<Arc<dyn GiveBack>>,
    /// Holds writes back while something behind the file system is behind (a store-backed
    /// mount's upload backlog over its bound): called before each write.
    pub write_gate: Option<Arc<dyn WriteGate>>,
}

/// See `FuseFs::write_gate`.
pub trait WriteGate: Send + Sync {
    /// Returns when the write may go on (it waits, it does not fail).
    fn before_write(&self);
    /// The mount is ending (a signal came, or the session ended): writers waiting now go
    /// on, and later ones do not wait. Called before the FUSE threads are joined: the
    /// session's end joins every one, a writer's waiting in the gate too (review 32 finding 7).
    fn let_go(&self);
}

/// Space held by history that yields when a write needs it (`-o protect=`;
/// DESIGN "Snapshots"). Giving back is serialised through a count of the
/// times it happened, so operations failing at once take one deletion
/// between them, not one each.
pub trait GiveBack: Send + Sync {
    /// How many times space has been given back so far.
    fn given(&self) -> u64;
    /// An operation tried when `given()` was `seen` lacked `short` bytes.
    /// True if it should be tried again: space was given back since `seen`,
    /// or is now (the oldest protected checkpoint deleted). False when
    /// history cannot cover `short` even whole: nothing is deleted for a
    /// request that cannot fit.
    fn give_back(&self, short: u64, seen: u64) -> bool;
}

/// How long an operation that found no space waits for a FORGET to free
/// some (see `FuseFs::room`).
const FORGET_WAIT: Duration = Duration::from_millis(50);
/// The longest an operation that found no space goes on retrying while
/// FORGETs keep coming: FORGETs of unrelated inodes (a `find` elsewhere,
/// the kernel shrinking its caches) must not hold a real ENOSPC back.
const FORGET_WAIT_TOTAL: Duration = Duration::from_secs(1);

/// Runs `f`, and again while it fails with NoSpace and FORGETs (counted
/// by `forgets`) keep coming within `wait` of each failure, for at most
/// `total` after the first failure.
fn retry_while_forgets<T>(
    forgets: &AtomicU64,
    wait: Duration,
    total: Duration,
    f: impl Fn() -> Result<T, FsError>,
) -> Result<T, FsError> {
    let mut first: Option<std::time::Instant> = None;
    loop {
        let seen = forgets.load(Ordering::Acquire);
        match f() {
            // Only space the device lacked can be freed by a FORGET.
            Err(FsError::NoSpace { short: Some(s) }) => {
                let began = *first.get_or_insert_with(std::time::Instant::now);
                let t = std::time::Instant::now();
                while forgets.load(Ordering::Acquire) == seen {
                    if t.elapsed() >= wait {
                        return Err(FsError::NoSpace { short: Some(s) });
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
                if began.elapsed() >= total {
                    return Err(FsError::NoSpace { short: Some(s) });
                }
            }
            r => return r,
        }
    }
}

/// Runs `f`, and again while it lacks space that `history` gives back.
fn give_back_while_short<T>(
    history: Option<&dyn GiveBack>,
    f: impl Fn() -> Result<T, FsError>,
) -> Result<T, FsError> {
    let Some(h) = history else {
        return f();
    };
    loop {
        let seen = h.given();
        match f() {
            Err(FsError::NoSpace { short: Some(s) }) if h.give_back(s, seen) => {}
            r => return r,
        }
    }
}

impl FuseFs {
    /// Runs `f`, and again while it fails with NoSpace and FORGETs keep
    /// coming within `FORGET_WAIT`. An unlinked file's space is freed only
    /// when the kernel's FORGET of it arrives (its lookup reference pins it),
    /// and the kernel queues that FORGET before unlink(2) returns; over
    /// /dev/fuse it is read before later requests, but over io_uring it
    /// still travels on /dev/fuse while the next write comes on the ring, so
    /// `rm big; write` on a full file system would see ENOSPC the unlink
    /// was about to cure. A real ENOSPC costs at most `FORGET_WAIT` more
    /// when no FORGET comes, and at most about `FORGET_WAIT_TOTAL` while
    /// unrelated ones keep coming.
    ///
    /// First, while protected checkpoints hold space, the oldest is given
    /// up and the operation tried again (DESIGN "Snapshots": protection
    /// yields before a write fails); before that, the unlinked inodes whose
    /// destroys wait for a batch (`Fs::destroy_released`) are destroyed and
    /// the operation tried again, so `rm small*; write` on a full file
    /// system neither fails nor costs a protected checkpoint.
    fn room<T>(&self, f: impl Fn() -> Result<T, FsError>) -> Result<T, FsError> {
        let f = || match f() {
            Err(FsError::NoSpace { .. }) if self.fs.destroy_released()? => f(),
            r => r,
        };
        retry_while_forgets(&self.forgets, FORGET_WAIT, FORGET_WAIT_TOTAL, || {
            give_back_while_short(self.yield_space.as_deref(), f)
        })
    }

    /// The set-ID bits a change of `ino` by `req` clears (the kernel's
    /// `setattr_should_drop_suidgid`; chown always clears some): both if
    /// the file's set-group-ID goes without group execute, which happens
    /// when an `unprivileged` caller (without CAP_FSETID) is not in the
    /// file's group.
    fn kill(&self, c: &Caller, ino: u64, unprivileged: bool) -> Kill {
        match self.fs.getattr(ino) {
            Ok(a) if a.perm & 0o2010 == 0o2000 && unprivileged && !in_group(c, a.gid) => {
                Kill::SuidAndSgid
            }
            _ => Kill::SuidAndExecSgid,
        }
    }

    /// A read reached ldfs: atime per the mount's mode. A failure (a full
    /// file system) does not fail the read.
    fn accessed(&self, ino: u64, dir: bool) {
        if dir && self.nodiratime {
            return;
        }
        if let Err(e) = self.fs.accessed(ino, self.atime) {
            if !matches!(e, FsError::NoSpace { .. } | FsError::ReadOnly) {
                eprintln!("ldfs: updating the atime of inode {ino}: {e}");
            }
        }
    }
}

/// The daemon's control interface, reached through `trusted.ldfs.<name>`
/// attributes of the mount's root (root only: trusted.* needs
/// CAP_SYS_ADMIN). `get` answers a query; `set` runs a command.
pub trait Control: Send + Sync {
    fn get(&self, name: &str) -> Result<Vec<u8>, String>;
    fn set(&self, name: &str, value: &[u8]) -> Result<(), String>;
}

const CONTROL_PREFIX: &str = "trusted.ldfs.";

/// include/uapi/linux/fs.h: `_IOR('f', 1, long)`, `_IOW('f', 2, long)`
/// and `_IOR('X', 31, struct fsxattr)` on 64-bit Linux (the kernel passes
/// the command as the caller gave it; its argument is an int).
const FS_IOC_GETFLAGS: u32 = 0x8008_6601;
const FS_IOC_SETFLAGS: u32 = 0x4008_6602;
const FS_IOC_FSGETXATTR: u32 = 0x801c_581f;
/// `struct fsxattr`'s size.
const FSXATTR_BYTES: usize = 28;
/// The `c` and `m` flags of chattr(1).
const FS_COMPR_FL: u32 = 0x0000_0004;
const FS_NOCOMP_FL: u32 = 0x0000_0400;

/// `FOPEN_KEEP_CACHE` of include/uapi/linux/fuse.h: the kernel keeps the
/// file's cached pages at this open.
const FOPEN_KEEP_CACHE: u32 = 1 << 1;

fn control_name(ino: u64, name: &[u8]) -> Option<&str> {
    if ino != fs::ROOT_INO {
        return None;
    }
    std::str::from_utf8(name).ok()?.strip_prefix(CONTROL_PREFIX)
}

/// Whether the process behind `req` is in group `gid`: its file-system
/// group, or one of its supplementary groups (FUSE passes only the first;
/// the rest are in /proc, read only for the rare set-group-ID file).
fn in_group(c: &Caller, gid: u32) -> bool {
    if c.gid == gid {
        return true;
    }
    let status = std::fs::read_to_string(format!("/proc/{}/status", c.pid)).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("Groups:"))
        .is_some_and(|g| g.split_whitespace().any(|x| x.parse() == Ok(gid)))
}

fn errno(e: &FsError) -> Errno {
    Errno::from_i32(match e {
        FsError::NotFound => libc::ENOENT,
        FsError::Exists => libc::EEXIST,
        FsError::NotDir => libc::ENOTDIR,
        FsError::IsDir => libc::EISDIR,
        FsError::NotEmpty => libc::ENOTEMPTY,
        FsError::NameTooLong => libc::ENAMETOOLONG,
        FsError::NoSpace { .. } => libc::ENOSPC,
        FsError::ReadOnly => libc::EROFS,
        FsError::TooManyLinks => libc::EMLINK,
        FsError::FileTooBig => libc::EFBIG,
        FsError::NoAttr => libc::ENODATA,
        FsError::Range => libc::ERANGE,
        FsError::ValueTooBig => libc::E2BIG,
        FsError::NotSupported => libc::EOPNOTSUPP,
        FsError::Perm => libc::EPERM,
        FsError::NoOffset => libc::ENXIO,
        FsError::Invalid(_) => libc::EINVAL,
        FsError::Io(_) => libc::EIO,
    })
}

fn time(t: Time) -> SystemTime {
    if t.secs >= 0 {
        UNIX_EPOCH + Duration::new(t.secs as u64, t.nsecs)
    } else {
        UNIX_EPOCH - Duration::from_secs(t.secs.unsigned_abs())
            + Duration::from_nanos(t.nsecs as u64)
    }
}

fn from_system(t: SystemTime) -> Time {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => Time {
            secs: d.as_secs() as i64,
            nsecs: d.subsec_nanos(),
        },
        Err(e) => {
            let d = e.duration();
            let (mut secs, mut nsecs) = (-(d.as_secs() as i64), d.subsec_nanos());
            if nsecs > 0 {
                secs -= 1;
                nsecs = 1_000_000_000 - nsecs;
            }
            Time { secs, nsecs }
        }
    }
}

fn file_type(k: Kind) -> FileType {
    match k {
        Kind::File => FileType::RegularFile,
        Kind::Dir => FileType::Directory,
        Kind::Symlink => FileType::Symlink,
        Kind::Fifo => FileType::NamedPipe,
        Kind::Socket => FileType::Socket,
        Kind::CharDev => FileType::CharDevice,
        Kind::BlockDev => FileType::BlockDevice,
    }
}

fn file_attr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: a.blocks,
        atime: time(a.atime),
        mtime: time(a.mtime),
        ctime: time(a.ctime),
        crtime: time(a.ctime),
        kind: file_type(a.kind),
        perm: a.perm,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        blksize: fs::BLOCK_BYTES as u32,
        flags: 0,
    }
}

/// A negative entry: the kernel caches the miss for `ENTRY_TTL` (see
/// `lookup`; memfs answers the same, so the ceiling takes the same trips).
pub(crate) fn negative_entry() -> Entry {
    Entry {
        attr: negative_attr(),
        generation: 0,
        ttl: TTL,
        entry_ttl: ENTRY_TTL,
    }
}

/// The attributes of a negative entry: node id 0, nothing else read.
fn negative_attr() -> FileAttr {
    FileAttr {
        ino: INodeNo(0),
        size: 0,
        blocks: 0,
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind: FileType::RegularFile,
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 0,
        flags: 0,
    }
}

/// The caller, creating with `umask` (FUSE_DONT_MASK: ldfs applies it,
/// unless the directory's default ACL takes its place).
fn ctx(c: &Caller, umask: u32) -> Ctx {
    Ctx {
        uid: c.uid,
        gid: c.gid,
        umask,
    }
}

fn time_set(t: TimeOrNow) -> TimeSet {
    match t {
        TimeOrNow::Now => TimeSet::Now,
        TimeOrNow::SpecificTime(t) => TimeSet::At(from_system(t)),
    }
}

fn err(code: i32) -> Errno {
    Errno::from_i32(code)
}

impl FuseFs {
    /// An entry for the kernel, which now holds a lookup reference: the
    /// inode is pinned first (a FORGET may follow the reply at once).
    fn entry(&self, r: Result<Attr, FsError>) -> OpResult<Entry> {
        let a = r.map_err(|e| errno(&e))?;
        self.fs.pin(a.ino, 1);
        Ok(Entry {
            attr: file_attr(&a),
            generation: a.generation,
            ttl: TTL,
            entry_ttl: ENTRY_TTL,
        })
    }
}

impl FuseOps for FuseFs {
    fn init(&self, config: &mut KernelConfig) {
        // Best effort: each capability the kernel lacks is simply not used.
        if self.writeback_cache {
            let _ = config.add_capabilities(InitFlags::FUSE_WRITEBACK_CACHE);
        }
        let _ = config.add_capabilities(
            InitFlags::FUSE_DO_READDIRPLUS
                | InitFlags::FUSE_READDIRPLUS_AUTO
                | InitFlags::FUSE_PARALLEL_DIROPS
                | InitFlags::FUSE_ASYNC_READ
                | InitFlags::FUSE_MAX_PAGES
                // The kernel enforces ACLs; ldfs keeps them (the mode
                // follows the access ACL, chmod rewrites it, new inodes
                // inherit default ACLs: fs::acl) and applies the umask
                // itself, as a default ACL replaces it (FUSE_DONT_MASK).
                | InitFlags::FUSE_POSIX_ACL
                | InitFlags::FUSE_DONT_MASK
                // File handles (NFS, open_by_handle_at) outlive the
                // kernel's inode cache: it looks an inode up again as "."
                // of its node id, and ".." of a directory (Fs::lookup);
                // a deleted one is gone (ESTALE), a reused number has a
                // new generation.
                | InitFlags::FUSE_EXPORT_SUPPORT
                // ldfs clears set-user-ID/-group-ID and drops file
                // capabilities itself (Fs::write_killing_suidgid, setattr),
                // so the kernel need not ask for security.capability
                // before every write: one round trip fewer per write(2).
                | InitFlags::FUSE_HANDLE_KILLPRIV_V2,
        );
        let no_open = config
            .add_capabilities(InitFlags::FUSE_NO_OPEN_SUPPORT | InitFlags::FUSE_NO_OPENDIR_SUPPORT)
            .is_ok();
        self.no_open.store(no_open, Ordering::Relaxed);
        let _ = config.set_max_write(MAX_WRITE_BYTES as u32);
        let _ = config.set_max_readahead(MAX_WRITE_BYTES as u32);
    }

    fn forget(&self, ino: u64, nlookup: u64) {
        if let Err(e) = self.fs.unpin(ino, nlookup) {
            eprintln!("ldfs: reclaiming inode {ino}: {e}");
        }
        self.forgets.fetch_add(1, Ordering::Release);
    }

    fn lookup(&self, _c: &Caller, parent: u64, name: &[u8]) -> OpResult<Entry> {
        match self.fs.lookup(parent, name) {
            // A negative entry (node id 0: "the same as ENOENT, but with a
            // valid timeout", fs/fuse/dir.c): the kernel caches the miss
            // for TTL, so a name looked up again before it is made (stat
            // then create, a search path) costs no round trip. Safe for
            // the reason positive entries are: every name is made through
            // this mount, and the kernel drops the negative dentry when it
            // makes one. Not for "." and "..", which look up node ids
            // (export support), not names.
            Err(FsError::NotFound) if name != b"." && name != b".." => Ok(negative_entry()),
            r => self.entry(r),
        }
    }

    fn getattr(&self, ino: u64) -> OpResult<(FileAttr, Duration)> {
        let a = self.fs.getattr(ino).map_err(|e| errno(&e))?;
        Ok((file_attr(&a), TTL))
    }

    fn setattr(&self, c: &Caller, ino: u64, s: &SetattrIn) -> OpResult<(FileAttr, Duration)> {
        // chown(path, -1, -1): the kernel sends no attribute (ctime only
        // with the writeback cache), nor when it leaves removing set-ID bits
        // to ldfs (file_remove_privs under FUSE_HANDLE_KILLPRIV_V2:
        // fallocate, and writes with the writeback cache). Linux changes
        // ctime and clears the set-ID bits as chown(2) does: a chown to the
        // same owner (`SetAttr::chown`, within the operation, so no race
        // with a concurrent chmod or chown).
        let nothing = [s.mode, s.uid, s.gid].iter().all(Option::is_none)
            && s.size.is_none()
            && s.atime.is_none()
            && s.mtime.is_none();
        // Under FUSE_HANDLE_KILLPRIV_V2 a truncation by a caller without
        // CAP_FSETID clears set-ID bits here (fuser does not pass
        // FATTR_KILL_SUIDGID on; non-root stands for it), and so does a
        // chown by anyone.
        let unprivileged = c.uid != 0;
        let kill = if nothing
            || s.uid.is_some()
            || s.gid.is_some()
            || (s.size.is_some() && unprivileged)
        {
            self.kill(c, ino, unprivileged)
        } else {
            Kill::Nothing
        };
        let sa = SetAttr {
            mode: s.mode,
            uid: s.uid,
            gid: s.gid,
            size: s.size,
            atime: s.atime.map(time_set),
            mtime: s.mtime.map(time_set),
            kill,
            chown: nothing,
        };
        let a = self
            .room(|| self.fs.setattr(ino, &sa))
            .map_err(|e| errno(&e))?;
        Ok((file_attr(&a), TTL))
    }

    fn readlink(&self, ino: u64) -> OpResult<Vec<u8>> {
        self.fs.readlink(ino).map_err(|e| errno(&e))
    }

    fn mknod(
        &self,
        c: &Caller,
        parent: u64,
        name: &[u8],
        mode: u32,
        umask: u32,
        rdev: u32,
    ) -> OpResult<Entry> {
        self.entry(self.room(|| {
            self.fs
                .mknod(ctx(c, umask), parent, name, mode, rdev as u64)
        }))
    }

    fn mkdir(
        &self,
        c: &Caller,
        parent: u64,
        name: &[u8],
        mode: u32,
        umask: u32,
    ) -> OpResult<Entry> {
        self.entry(self.room(|| self.fs.mkdir(ctx(c, umask), parent, name, mode)))
    }

    fn unlink(&self, parent: u64, name: &[u8]) -> OpResult<()> {
        self.fs.unlink(parent, name).map_err(|e| errno(&e))
    }

    fn rmdir(&self, parent: u64, name: &[u8]) -> OpResult<()> {
        self.fs.rmdir(parent, name).map_err(|e| errno(&e))
    }

    fn symlink(&self, c: &Caller, parent: u64, name: &[u8], target: &[u8]) -> OpResult<Entry> {
        self.entry(self.room(|| self.fs.symlink(ctx(c, 0), parent, name, target)))
    }

    fn rename(
        &self,
        parent: u64,
        name: &[u8],
        newparent: u64,
        newname: &[u8],
        flags: u32,
    ) -> OpResult<()> {
        if flags & libc::RENAME_WHITEOUT != 0 {
            return Err(err(libc::EINVAL));
        }
        let f = fs::RenameFlags {
            noreplace: flags & libc::RENAME_NOREPLACE != 0,
            exchange: flags & libc::RENAME_EXCHANGE != 0,
        };
        self.fs
            .rename(parent, name, newparent, newname, f)
            .map_err(|e| errno(&e))
    }

    fn link(&self, ino: u64, newparent: u64, newname: &[u8]) -> OpResult<Entry> {
        self.entry(self.room(|| self.fs.link(ino, newparent, newname)))
    }

    fn open(&self, ino: u64, _flags: i32) -> OpResult<Opened> {
        if self.no_open.load(Ordering::Relaxed) {
            return Err(err(libc::ENOSYS));
        }
        // The kernel's lookup reference keeps the inode; nothing to count.
        self.fs.getattr(ino).map_err(|e| errno(&e))?;
        // Every change of a file's data goes through this mount's page
        // cache (writes, truncation, hole punching, copy_file_range), so
        // its cached pages stay true across opens: keep them, unless a
        // read must reach ldfs to update atime (the kernel does not keep
        // atime for FUSE without the writeback cache).
        let keep = !self.fs.atime_due(ino, self.atime).map_err(|e| errno(&e))?;
        Ok(Opened {
            fh: ino,
            flags: if keep { FOPEN_KEEP_CACHE } else { 0 },
        })
    }

    /// `lsattr` and `chattr`: the kernel turns FS_IOC_GETFLAGS and
    /// FS_IOC_SETFLAGS (and `FS_IOC_FSGETXATTR`) into these, after its own
    /// owner check. The one flag ldfs keeps is `c` (FS_COMPR_FL): on when
    /// the file's (a directory's: its new files') blocks are stored
    /// compressed, `user.ldfs.compress` or the mount's `compress=`.
    /// `chattr +c` sets that attribute to the mount's policy (zstd when the
    /// mount's is off), `chattr -c` to `off`; `m` (FS_NOCOMP_FL) is `-c`.
    /// Any other flag is EOPNOTSUPP, as on file systems without it.
    fn ioctl(
        &self,
        c: &Caller,
        ino: u64,
        _fh: u64,
        cmd: u32,
        input: &[u8],
        out_size: u32,
    ) -> OpResult<Vec<u8>> {
        use ldfs::ld::Compression;
        let compressed = || {
            self.fs
                .compression(ino)
                .map(|p| p != Compression::Off)
                .map_err(|e| errno(&e))
        };
        match cmd {
            FS_IOC_GETFLAGS => {
                let flags: u32 = if compressed()? { FS_COMPR_FL } else { 0 };
                let mut out = flags.to_le_bytes().to_vec();
                out.resize(out_size as usize, 0);
                Ok(out)
            }
            FS_IOC_SETFLAGS => {
                let Some(b) = input.get(..4) else {
                    return Err(err(libc::EINVAL));
                };
                // Kernels since 5.13 check ownership before sending this
                // (vfs_fileattr_set); older ones pass it on unchecked.
                if c.uid != 0 && self.fs.getattr(ino).map_err(|e| errno(&e))?.uid != c.uid {
                    return Err(err(libc::EPERM));
                }
                let flags = u32::from_le_bytes(b.try_into().expect("4 bytes"));
                if flags & !(FS_COMPR_FL | FS_NOCOMP_FL) != 0 {
                    return Err(err(libc::EOPNOTSUPP));
                }
                let want = flags & FS_COMPR_FL != 0 && flags & FS_NOCOMP_FL == 0;
                if want == compressed()? {
                    return Ok(Vec::new());
                }
                let policy = match (want, self.fs.default_compression()) {
                    (false, _) => Compression::Off,
                    (true, Compression::Off) => Compression::Zstd {
                        level: Compression::ZSTD_DEFAULT_LEVEL,
                    },
                    (true, mount) => mount,
                };
                let v = policy.to_string();
                self.room(|| {
                    self.fs
                        .setxattr(ino, fs::COMPRESS_XATTR, v.as_bytes(), XattrMode::Any)
                })
                .map(|()| Vec::new())
                .map_err(|e| errno(&e))
            }
            // No extended flags, extent size or project: all zero.
            FS_IOC_FSGETXATTR => Ok(vec![0; (out_size as usize).min(FSXATTR_BYTES)]),
            _ => Err(err(libc::ENOTTY)),
        }
    }

    fn read(&self, ino: u64, _fh: u64, offset: u64, size: u32) -> OpResult<Vec<u8>> {
        let d = self.fs.read(ino, offset, size).map_err(|e| errno(&e))?;
        // Before the reply: the kernel's next stat sees it.
        self.accessed(ino, false);
        Ok(d)
    }

    fn write(
        &self,
        c: &Caller,
        ino: u64,
        _fh: u64,
        offset: u64,
        data: &[u8],
        write_flags: u32,
    ) -> OpResult<u32> {
        // The kernel sets the flag for a writer without CAP_FSETID.
        let kill = if write_flags & WriteFlags::FUSE_WRITE_KILL_SUIDGID.bits() != 0 {
            self.kill(c, ino, true)
        } else {
            Kill::Nothing
        };
        if let Some(g) = &self.write_gate {
            g.before_write();
        }
        let n = self
            .room(|| self.fs.write_killing_suidgid(ino, offset, data, kill))
            .map_err(|e| errno(&e))?;
        Ok(n as u32)
    }

    fn fsync(&self, _ino: u64, _fh: u64, _datasync: bool) -> OpResult<()> {
        self.fs.fsync().map_err(|e| errno(&e))
    }

    fn opendir(&self, ino: u64, _flags: i32) -> OpResult<Opened> {
        if self.no_open.load(Ordering::Relaxed) {
            return Err(err(libc::ENOSYS));
        }
        match self.fs.getattr(ino) {
            Ok(a) if a.kind == Kind::Dir => Ok(Opened { fh: ino, flags: 0 }),
            Ok(_) => Err(err(libc::ENOTDIR)),
            Err(e) => Err(errno(&e)),
        }
    }

    fn readdir(
        &self,
        ino: u64,
        _fh: u64,
        offset: u64,
        add: &mut dyn FnMut(DirEntry) -> bool,
    ) -> OpResult<()> {
        if offset == 0 {
            self.accessed(ino, true);
        }
        let entries = self
            .fs
            .readdir(ino, offset as i64, 256)
            .map_err(|e| errno(&e))?;
        for e in entries {
            let d = DirEntry {
                ino: e.ino,
                next: e.next as u64,
                kind: file_type(e.kind),
                name: e.name,
            };
            if !add(d) {
                break;
            }
        }
        Ok(())
    }

    fn readdirplus(
        &self,
        ino: u64,
        _fh: u64,
        offset: u64,
        add: &mut dyn FnMut(DirEntryPlus) -> bool,
    ) -> OpResult<()> {
        if offset == 0 {
            self.accessed(ino, true);
        }
        let entries = self
            .fs
            .readdir(ino, offset as i64, 128)
            .map_err(|e| errno(&e))?;
        for e in entries {
            let attr = match self.fs.getattr(e.ino) {
                Ok(a) => a,
                Err(_) => continue,
            };
            let dot = e.name == b"." || e.name == b"..";
            let d = DirEntryPlus {
                dirent: DirEntry {
                    ino: e.ino,
                    next: e.next as u64,
                    kind: file_type(e.kind),
                    name: e.name,
                },
                entry: Entry {
                    attr: file_attr(&attr),
                    generation: attr.generation,
                    ttl: TTL,
                    entry_ttl: ENTRY_TTL,
                },
            };
            if !add(d) {
                break;
            }
            // Every entry but . and .. gives the kernel a lookup
            // reference (FUSE protocol, READDIRPLUS); pinned before the
            // reply is sent, as the kernel may FORGET it at once.
            if !dot {
                self.fs.pin(e.ino, 1);
            }
        }
        Ok(())
    }

    fn fsyncdir(&self, _ino: u64, _fh: u64, _datasync: bool) -> OpResult<()> {
        self.fs.fsync().map_err(|e| errno(&e))
    }

    fn statfs(&self, _ino: u64) -> OpResult<Statfs> {
        let s = self.fs.statfs();
        Ok(Statfs {
            blocks: s.blocks,
            bfree: s.blocks_free,
            bavail: s.blocks_free,
            files: s.files,
            ffree: u64::MAX / 2,
            bsize: s.block_bytes as u32,
            namelen: s.name_max,
            frsize: s.block_bytes as u32,
        })
    }

    fn setxattr(
        &self,
        c: &Caller,
        ino: u64,
        name: &[u8],
        value: &[u8],
        flags: i32,
    ) -> OpResult<()> {
        if let (Some(ctl), Some(cmd)) = (&self.control, control_name(ino, name)) {
            return ctl.set(cmd, value).map_err(|e| {
                eprintln!("ldfs: control {cmd}: {e}");
                err(libc::EINVAL)
            });
        }
        let mode = match flags {
            0 => XattrMode::Any,
            libc::XATTR_CREATE => XattrMode::Create,
            libc::XATTR_REPLACE => XattrMode::Replace,
            _ => return Err(err(libc::EINVAL)),
        };
        // Without FUSE_SETXATTR_EXT (which fuser cannot parse) the kernel
        // cannot say FUSE_SETXATTR_ACL_KILL_SGID: ldfs works it out.
        let kill_sgid = name == fs::acl::ACCESS
            && c.uid != 0
            && self
                .fs
                .getattr(ino)
                .is_ok_and(|a| a.perm & 0o2000 != 0 && !in_group(c, a.gid));
        self.room(|| {
            self.fs
                .setxattr_killing_sgid(ino, name, value, mode, kill_sgid)
        })
        .map_err(|e| {
            // EINVAL alone does not say what a policy may be.
            if let (true, FsError::Invalid(why)) = (name == fs::COMPRESS_XATTR, &e) {
                eprintln!("ldfs: inode {ino}: {why}");
            }
            errno(&e)
        })
    }

    fn getxattr(&self, _c: &Caller, ino: u64, name: &[u8], size: u32) -> OpResult<Xattr> {
        let r = match (&self.control, control_name(ino, name)) {
            (Some(ctl), Some(q)) => ctl.get(q).map_err(|e| {
                eprintln!("ldfs: control {q}: {e}");
                FsError::NoAttr
            }),
            _ => self.fs.getxattr(ino, name),
        };
        sized(r.map_err(|e| errno(&e))?, size)
    }

    fn listxattr(&self, ino: u64, size: u32) -> OpResult<Xattr> {
        let names = self.fs.listxattr(ino).map_err(|e| errno(&e))?;
        let mut buf = Vec::new();
        for n in names {
            buf.extend_from_slice(&n);
            buf.push(0);
        }
        sized(buf, size)
    }

    fn removexattr(&self, ino: u64, name: &[u8]) -> OpResult<()> {
        self.fs.removexattr(ino, name).map_err(|e| errno(&e))
    }

    fn access(&self, _ino: u64, _mask: i32) -> OpResult<()> {
        // default_permissions: the kernel checks access itself.
        Ok(())
    }

    fn create(
        &self,
        c: &Caller,
        parent: u64,
        name: &[u8],
        mode: u32,
        umask: u32,
        _flags: i32,
    ) -> OpResult<(Entry, Opened)> {
        let mode = (mode & 0o7777) | Kind::File.mode_bits();
        let e = self.entry(self.room(|| self.fs.mknod(ctx(c, umask), parent, name, mode, 0)))?;
        let fh = e.attr.ino.0;
        Ok((e, Opened { fh, flags: 0 }))
    }

    fn fallocate(&self, ino: u64, _fh: u64, offset: u64, length: u64, mode: i32) -> OpResult<()> {
        let known =
            libc::FALLOC_FL_KEEP_SIZE | libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_ZERO_RANGE;
        if mode & !known != 0 {
            return Err(err(libc::EOPNOTSUPP));
        }
        let m = fs::FallocMode {
            keep_size: mode & libc::FALLOC_FL_KEEP_SIZE != 0,
            punch_hole: mode & libc::FALLOC_FL_PUNCH_HOLE != 0,
            zero_range: mode & libc::FALLOC_FL_ZERO_RANGE != 0,
        };
        self.room(|| self.fs.fallocate(ino, offset, length, m))
            .map_err(|e| errno(&e))
    }

    fn lseek(&self, ino: u64, _fh: u64, offset: i64, whence: i32) -> OpResult<i64> {
        let w = match whence {
            libc::SEEK_DATA => fs::Whence::Data,
            libc::SEEK_HOLE => fs::Whence::Hole,
            _ => return Err(err(libc::EINVAL)),
        };
        if offset < 0 {
            return Err(err(libc::ENXIO));
        }
        let o = self
            .fs
            .lseek(ino, offset as u64, w)
            .map_err(|e| errno(&e))?;
        Ok(o as i64)
    }
}

/// A GETXATTR/LISTXATTR answer for a buffer of `size` (0: the size only).
fn sized(v: Vec<u8>, size: u32) -> OpResult<Xattr> {
    if size == 0 {
        Ok(Xattr::Size(v.len() as u32))
    } else if v.len() <= size as usize {
        Ok(Xattr::Data(v))
    } else {
        Err(err(libc::ERANGE))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// A real ENOSPC while unrelated FORGETs keep arriving (every few ms)
    /// must still come back, within about the total bound: the retry loop
    /// used to go on for as long as the FORGETs did.
    #[test]
    fn no_space_returns_while_unrelated_forgets_keep_coming() {
        let forgets = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let ticker = {
            let (forgets, stop) = (forgets.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    forgets.fetch_add(1, Ordering::Release);
                    std::thread::sleep(Duration::from_millis(5));
                }
            })
        };
        let (tx, rx) = std::sync::mpsc::channel();
        {
            let forgets = forgets.clone();
            std::thread::spawn(move || {
                let calls = AtomicUsize::new(0);
                let r: Result<(), FsError> =
                    retry_while_forgets(&forgets, FORGET_WAIT, FORGET_WAIT_TOTAL, || {
                        calls.fetch_add(1, Ordering::Relaxed);
                        Err(FsError::NoSpace { short: Some(1) })
                    });
                let _ = tx.send((r, calls.load(Ordering::Relaxed)));
            });
        }
        let got = rx.recv_timeout(FORGET_WAIT_TOTAL * 5);
        stop.store(true, Ordering::Relaxed);
        ticker.join().unwrap();
        let (r, calls) = got.expect("ENOSPC held back while FORGETs keep coming");
        assert!(matches!(r, Err(FsError::NoSpace { .. })), "{r:?}");
        assert!(calls > 1, "retried on FORGETs: {calls} calls");
    }

    /// The case the retry is for: the FORGET that frees the space comes
    /// after the first attempt failed; the second attempt succeeds. With
    /// no FORGET at all, one attempt and ENOSPC after about FORGET_WAIT.
    #[test]
    fn a_forget_after_no_space_lets_the_retry_succeed() {
        let forgets = Arc::new(AtomicU64::new(0));
        let freed = Arc::new(AtomicBool::new(false));
        let t = {
            let (forgets, freed) = (forgets.clone(), freed.clone());
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(10));
                freed.store(true, Ordering::Release);
                forgets.fetch_add(1, Ordering::Release);
            })
        };
        let r = retry_while_forgets(&forgets, FORGET_WAIT * 10, FORGET_WAIT_TOTAL, || {
            if freed.load(Ordering::Acquire) {
                Ok(7)
            } else {
                Err(FsError::NoSpace { short: Some(1) })
            }
        });
        t.join().unwrap();
        assert!(matches!(r, Ok(7)), "{r:?}");
        let calls = AtomicUsize::new(0);
        let started = std::time::Instant::now();
        let r: Result<(), FsError> =
            retry_while_forgets(&AtomicU64::new(0), FORGET_WAIT, FORGET_WAIT_TOTAL, || {
                calls.fetch_add(1, Ordering::Relaxed);
                Err(FsError::NoSpace { short: Some(1) })
            });
        assert!(matches!(r, Err(FsError::NoSpace { .. })), "{r:?}");
        assert_eq!(calls.load(Ordering::Relaxed), 1);
        assert!(started.elapsed() < FORGET_WAIT_TOTAL);
        // Another error is returned at once, not retried.
        let calls = AtomicUsize::new(0);
        let r: Result<(), FsError> =
            retry_while_forgets(&AtomicU64::new(0), FORGET_WAIT, FORGET_WAIT_TOTAL, || {
                calls.fetch_add(1, Ordering::Relaxed);
                Err(FsError::ReadOnly)
            });
        assert!(matches!(r, Err(FsError::ReadOnly)), "{r:?}");
        assert_eq!(calls.load(Ordering::Relaxed), 1);
    }
}
