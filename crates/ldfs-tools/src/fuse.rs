//! The FUSE adapter: request -> `ldfs::fs::Fs` call -> reply, nothing else
//! (STYLE 15). errno lives here and only here. How requests arrive (fuser's
//! /dev/fuse session today, FUSE over io_uring later) is the session's
//! business (`mount.rs`); this file only dispatches them.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    AccessFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation,
    INodeNo, InitFlags, KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate,
    ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyLseek, ReplyOpen,
    ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use ldfs::fs::inode::{Kind, Time};
use ldfs::fs::{self, Attr, Ctx, Fs, FsError, Kill, SetAttr, TimeSet, XattrMode};

/// How long the kernel may cache attributes and entries. Every change goes
/// through this process, and the kernel invalidates what it changes itself.
const TTL: Duration = Duration::from_secs(1);

pub struct FuseFs {
    pub fs: Arc<Fs>,
    /// The kernel accepted FUSE_NO_OPEN_SUPPORT: OPEN and OPENDIR are
    /// answered ENOSYS once and never sent again, saving two round trips per
    /// file opened. Inode lifetime then follows the kernel's lookup
    /// references (pinned on every entry reply, released by FORGET), which
    /// the kernel holds for as long as any open file needs the inode.
    pub no_open: bool,
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
}

impl FuseFs {
    /// The set-ID bits a change of `ino` by `req` clears (the kernel's
    /// `setattr_should_drop_suidgid`; chown always clears some): both if
    /// the file's set-group-ID goes without group execute, which happens
    /// when an `unprivileged` caller (without CAP_FSETID) is not in the
    /// file's group.
    fn kill(&self, req: &Request, ino: INodeNo, unprivileged: bool) -> Kill {
        match self.fs.getattr(ino.0) {
            Ok(a) if a.perm & 0o2010 == 0o2000 && unprivileged && !in_group(req, a.gid) => {
                Kill::SuidAndSgid
            }
            _ => Kill::SuidAndExecSgid,
        }
    }

    /// A read reached ldfs: atime per the mount's mode. A failure (a full
    /// file system) does not fail the read.
    fn accessed(&self, ino: INodeNo, dir: bool) {
        if dir && self.nodiratime {
            return;
        }
        if let Err(e) = self.fs.accessed(ino.0, self.atime) {
            if !matches!(e, FsError::NoSpace | FsError::ReadOnly) {
                eprintln!("ldfs: updating the atime of inode {}: {e}", ino.0);
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

fn control_name(ino: INodeNo, name: &OsStr) -> Option<&str> {
    if ino.0 != fs::ROOT_INO {
        return None;
    }
    name.to_str()?.strip_prefix(CONTROL_PREFIX)
}

/// Whether the process behind `req` is in group `gid`: its file-system
/// group, or one of its supplementary groups (FUSE passes only the first;
/// the rest are in /proc, read only for the rare set-group-ID file).
fn in_group(req: &Request, gid: u32) -> bool {
    if req.gid() == gid {
        return true;
    }
    let status = std::fs::read_to_string(format!("/proc/{}/status", req.pid())).unwrap_or_default();
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
        FsError::NoSpace => libc::ENOSPC,
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

/// The caller, creating with `umask` (FUSE_DONT_MASK: ldfs applies it,
/// unless the directory's default ACL takes its place).
fn ctx(req: &Request, umask: u32) -> Ctx {
    Ctx {
        uid: req.uid(),
        gid: req.gid(),
        umask,
    }
}

impl FuseFs {
    /// Replies with an entry; the kernel now holds a lookup reference, so
    /// the inode is pinned first (a FORGET may follow the reply at once).
    fn entry(&self, reply: ReplyEntry, r: Result<Attr, FsError>) {
        match r {
            Ok(a) => {
                self.fs.pin(a.ino, 1);
                reply.entry(&TTL, &file_attr(&a), Generation(a.generation))
            }
            Err(e) => reply.error(errno(&e)),
        }
    }
}

fn empty(reply: ReplyEmpty, r: Result<(), FsError>) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(errno(&e)),
    }
}

fn time_set(t: TimeOrNow) -> TimeSet {
    match t {
        TimeOrNow::Now => TimeSet::Now,
        TimeOrNow::SpecificTime(t) => TimeSet::At(from_system(t)),
    }
}

impl Filesystem for FuseFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
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
        self.no_open = config
            .add_capabilities(InitFlags::FUSE_NO_OPEN_SUPPORT | InitFlags::FUSE_NO_OPENDIR_SUPPORT)
            .is_ok();
        let _ = config.set_max_write(1 << 20);
        let _ = config.set_max_readahead(1 << 20);
        Ok(())
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        if let Err(e) = self.fs.unpin(ino.0, nlookup) {
            eprintln!("ldfs: reclaiming inode {}: {e}", ino.0);
        }
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        self.entry(reply, self.fs.lookup(parent.0, name.as_bytes()));
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.fs.getattr(ino.0) {
            Ok(a) => reply.attr(&TTL, &file_attr(&a)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        // chown(path, -1, -1): the kernel sends no attribute (ctime only
        // with the writeback cache), nor when it leaves removing set-ID bits
        // to ldfs (file_remove_privs under FUSE_HANDLE_KILLPRIV_V2:
        // fallocate, and writes with the writeback cache). Linux changes
        // ctime and clears the set-ID bits as chown(2) does: a chown to the
        // same owner (`SetAttr::chown`, within the operation, so no race
        // with a concurrent chmod or chown).
        let nothing = [mode, uid, gid].iter().all(Option::is_none)
            && size.is_none()
            && atime.is_none()
            && mtime.is_none();
        // Under FUSE_HANDLE_KILLPRIV_V2 a truncation by a caller without
        // CAP_FSETID clears set-ID bits here (fuser does not pass
        // FATTR_KILL_SUIDGID on; non-root stands for it), and so does a
        // chown by anyone.
        let unprivileged = req.uid() != 0;
        let kill = if nothing || uid.is_some() || gid.is_some() || (size.is_some() && unprivileged)
        {
            self.kill(req, ino, unprivileged)
        } else {
            Kill::Nothing
        };
        let sa = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime: atime.map(time_set),
            mtime: mtime.map(time_set),
            kill,
            chown: nothing,
        };
        match self.fs.setattr(ino.0, &sa) {
            Ok(a) => reply.attr(&TTL, &file_attr(&a)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.fs.readlink(ino.0) {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        self.entry(
            reply,
            self.fs.mknod(
                ctx(req, umask),
                parent.0,
                name.as_bytes(),
                mode,
                rdev as u64,
            ),
        );
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        self.entry(
            reply,
            self.fs
                .mkdir(ctx(req, umask), parent.0, name.as_bytes(), mode),
        );
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(reply, self.fs.unlink(parent.0, name.as_bytes()));
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(reply, self.fs.rmdir(parent.0, name.as_bytes()));
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        self.entry(
            reply,
            self.fs.symlink(
                ctx(req, 0),
                parent.0,
                link_name.as_bytes(),
                target.as_os_str().as_bytes(),
            ),
        );
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        if flags.contains(RenameFlags::RENAME_WHITEOUT) {
            return reply.error(Errno::from_i32(libc::EINVAL));
        }
        let f = fs::RenameFlags {
            noreplace: flags.contains(RenameFlags::RENAME_NOREPLACE),
            exchange: flags.contains(RenameFlags::RENAME_EXCHANGE),
        };
        empty(
            reply,
            self.fs.rename(
                parent.0,
                name.as_bytes(),
                newparent.0,
                newname.as_bytes(),
                f,
            ),
        );
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        self.entry(reply, self.fs.link(ino.0, newparent.0, newname.as_bytes()));
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        if self.no_open {
            return reply.error(Errno::from_i32(libc::ENOSYS));
        }
        // The kernel's lookup reference keeps the inode; nothing to count.
        match self.fs.getattr(ino.0) {
            Ok(_) => reply.opened(FileHandle(ino.0), FopenFlags::empty()),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match self.fs.read(ino.0, offset, size) {
            Ok(d) => {
                // Before the reply: the kernel's next stat sees it.
                self.accessed(ino, false);
                reply.data(&d);
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        // The kernel sets the flag for a writer without CAP_FSETID.
        let kill = if write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID) {
            self.kill(req, ino, true)
        } else {
            Kill::Nothing
        };
        match self.fs.write_killing_suidgid(ino.0, offset, data, kill) {
            Ok(n) => reply.written(n as u32),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let _ = ino;
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        empty(reply, self.fs.fsync());
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        if self.no_open {
            return reply.error(Errno::from_i32(libc::ENOSYS));
        }
        match self.fs.getattr(ino.0) {
            Ok(a) if a.kind == Kind::Dir => reply.opened(FileHandle(ino.0), FopenFlags::empty()),
            Ok(_) => reply.error(Errno::from_i32(libc::ENOTDIR)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        if offset == 0 {
            self.accessed(ino, true);
        }
        match self.fs.readdir(ino.0, offset as i64, 256) {
            Ok(entries) => {
                for e in entries {
                    if reply.add(
                        INodeNo(e.ino),
                        e.next as u64,
                        file_type(e.kind),
                        OsStr::from_bytes(&e.name),
                    ) {
                        break;
                    }
                }
                reply.ok();
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        if offset == 0 {
            self.accessed(ino, true);
        }
        match self.fs.readdir(ino.0, offset as i64, 128) {
            Ok(entries) => {
                for e in entries {
                    let attr = match self.fs.getattr(e.ino) {
                        Ok(a) => a,
                        Err(_) => continue,
                    };
                    if reply.add(
                        INodeNo(e.ino),
                        e.next as u64,
                        OsStr::from_bytes(&e.name),
                        &TTL,
                        &file_attr(&attr),
                        Generation(attr.generation),
                    ) {
                        break;
                    }
                    // Every entry but . and .. gives the kernel a lookup
                    // reference (FUSE protocol, READDIRPLUS).
                    if e.name != b"." && e.name != b".." {
                        self.fs.pin(e.ino, 1);
                    }
                }
                reply.ok();
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn releasedir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        let _ = ino;
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        empty(reply, self.fs.fsync());
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let s = self.fs.statfs();
        reply.statfs(
            s.blocks,
            s.blocks_free,
            s.blocks_free,
            s.files,
            u64::MAX / 2,
            s.block_bytes as u32,
            s.name_max,
            s.block_bytes as u32,
        );
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        if let (Some(c), Some(cmd)) = (&self.control, control_name(ino, name)) {
            return match c.set(cmd, value) {
                Ok(()) => reply.ok(),
                Err(e) => {
                    eprintln!("ldfs: control {cmd}: {e}");
                    reply.error(Errno::from_i32(libc::EINVAL))
                }
            };
        }
        let mode = match flags {
            0 => XattrMode::Any,
            libc::XATTR_CREATE => XattrMode::Create,
            libc::XATTR_REPLACE => XattrMode::Replace,
            _ => return reply.error(Errno::from_i32(libc::EINVAL)),
        };
        // Without FUSE_SETXATTR_EXT (which fuser cannot parse) the kernel
        // cannot say FUSE_SETXATTR_ACL_KILL_SGID: ldfs works it out.
        let kill_sgid = name.as_bytes() == fs::acl::ACCESS
            && req.uid() != 0
            && self
                .fs
                .getattr(ino.0)
                .is_ok_and(|a| a.perm & 0o2000 != 0 && !in_group(req, a.gid));
        empty(
            reply,
            self.fs
                .setxattr_killing_sgid(ino.0, name.as_bytes(), value, mode, kill_sgid),
        );
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let r = match (&self.control, control_name(ino, name)) {
            (Some(c), Some(q)) => c.get(q).map_err(|e| {
                eprintln!("ldfs: control {q}: {e}");
                FsError::NoAttr
            }),
            _ => self.fs.getxattr(ino.0, name.as_bytes()),
        };
        match r {
            Ok(v) if size == 0 => reply.size(v.len() as u32),
            Ok(v) if v.len() <= size as usize => reply.data(&v),
            Ok(_) => reply.error(Errno::from_i32(libc::ERANGE)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        match self.fs.listxattr(ino.0) {
            Ok(names) => {
                let mut buf = Vec::new();
                for n in names {
                    buf.extend_from_slice(&n);
                    buf.push(0);
                }
                if size == 0 {
                    reply.size(buf.len() as u32)
                } else if buf.len() <= size as usize {
                    reply.data(&buf)
                } else {
                    reply.error(Errno::from_i32(libc::ERANGE))
                }
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(reply, self.fs.removexattr(ino.0, name.as_bytes()));
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        // default_permissions: the kernel checks access itself.
        reply.ok();
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let mode = (mode & 0o7777) | Kind::File.mode_bits();
        match self
            .fs
            .mknod(ctx(req, umask), parent.0, name.as_bytes(), mode, 0)
        {
            Ok(a) => {
                self.fs.pin(a.ino, 1);
                reply.created(
                    &TTL,
                    &file_attr(&a),
                    Generation(a.generation),
                    FileHandle(a.ino),
                    FopenFlags::empty(),
                )
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let known =
            libc::FALLOC_FL_KEEP_SIZE | libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_ZERO_RANGE;
        if mode & !known != 0 {
            return reply.error(Errno::from_i32(libc::EOPNOTSUPP));
        }
        let m = fs::FallocMode {
            keep_size: mode & libc::FALLOC_FL_KEEP_SIZE != 0,
            punch_hole: mode & libc::FALLOC_FL_PUNCH_HOLE != 0,
            zero_range: mode & libc::FALLOC_FL_ZERO_RANGE != 0,
        };
        empty(reply, self.fs.fallocate(ino.0, offset, length, m));
    }

    fn lseek(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        let w = match whence {
            libc::SEEK_DATA => fs::Whence::Data,
            libc::SEEK_HOLE => fs::Whence::Hole,
            _ => return reply.error(Errno::from_i32(libc::EINVAL)),
        };
        if offset < 0 {
            return reply.error(Errno::from_i32(libc::ENXIO));
        }
        match self.fs.lseek(ino.0, offset as u64, w) {
            Ok(o) => reply.offset(o as i64),
            Err(e) => reply.error(errno(&e)),
        }
    }
}
