//! How FUSE requests reach a file system and its replies go back: the
//! kernel's /dev/fuse (fuser's session: `dev.rs`) or FUSE over io_uring
//! (`uring.rs`, decoding and encoding with `proto.rs`). Both transports
//! call the same [`FuseOps`] methods, which take plain numbers and bytes and
//! return plain data or an errno, so a file system (`fuse::FuseFs`,
//! `memfs::MemFs`) is written once and cannot tell the transports apart.
//!
//! Invariants: a request is answered exactly once, on the transport it came
//! from; an op that hands the kernel a lookup reference (an entry, a
//! READDIRPLUS entry) takes it before its reply is sent, and only for what
//! the reply carries (a directory listing hands its entries to the
//! transport one by one, which says when the reply is full).

pub mod dev;
pub mod proto;
pub mod uring;

use std::time::Duration;

pub use fuser::{Errno, FileAttr, FileType, KernelConfig, TimeOrNow};

/// Whom a request comes from (the FUSE request header).
#[derive(Clone, Copy, Debug, Default)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
}

/// An entry reply: the kernel now holds one lookup reference to it.
#[derive(Clone, Debug)]
pub struct Entry {
    pub attr: FileAttr,
    pub generation: u64,
    /// How long the kernel may keep the attributes.
    pub ttl: Duration,
    /// How long the kernel may keep the name (the dentry, a negative one
    /// too) without looking it up again. fuser's CREATE and READDIRPLUS
    /// replies carry one timeout: on /dev/fuse those take `ttl` for both.
    pub entry_ttl: Duration,
}

/// What SETATTR asks to change (FATTR_* in the request).
#[derive(Clone, Copy, Debug, Default)]
pub struct SetattrIn {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<TimeOrNow>,
    pub mtime: Option<TimeOrNow>,
}

/// An opened file: handle and FOPEN_* flags.
#[derive(Clone, Copy, Debug, Default)]
pub struct Opened {
    pub fh: u64,
    pub flags: u32,
}

#[derive(Clone, Copy, Debug, Default)]
pub struct Statfs {
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    pub bsize: u32,
    pub namelen: u32,
    pub frsize: u32,
}

/// One directory entry of a READDIR reply.
#[derive(Clone, Debug)]
pub struct DirEntry {
    pub ino: u64,
    /// The offset of the entry after this one.
    pub next: u64,
    pub kind: FileType,
    pub name: Vec<u8>,
}

/// One entry of a READDIRPLUS reply (a lookup reference for all but . and ..).
#[derive(Clone, Debug)]
pub struct DirEntryPlus {
    pub dirent: DirEntry,
    pub entry: Entry,
}

/// A GETXATTR or LISTXATTR answer: the size asked for (size 0), or the bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Xattr {
    Size(u32),
    Data(Vec<u8>),
}

/// Bytes one READDIR entry takes in a reply (fuse_dirent, padded to 8).
pub fn dirent_bytes(name_len: usize) -> usize {
    (proto::DIRENT_NAME_OFFSET + name_len).next_multiple_of(8)
}

/// Bytes one READDIRPLUS entry takes (fuse_entry_out + fuse_dirent).
pub fn direntplus_bytes(name_len: usize) -> usize {
    proto::ENTRY_OUT_BYTES + dirent_bytes(name_len)
}

pub type OpResult<T> = Result<T, Errno>;

fn nosys<T>() -> OpResult<T> {
    Err(Errno::from_i32(libc::ENOSYS))
}

/// The FUSE operations a file system serves, one method per request kind,
/// transport-free. Unimplemented ones answer ENOSYS.
#[allow(unused_variables)]
pub trait FuseOps: Send + Sync + 'static {
    /// INIT: the capabilities to ask for (FUSE_OVER_IO_URING is the
    /// transport's business, not the file system's).
    fn init(&self, config: &mut KernelConfig) {}
    fn forget(&self, ino: u64, nlookup: u64) {}
    fn lookup(&self, c: &Caller, parent: u64, name: &[u8]) -> OpResult<Entry> {
        nosys()
    }
    fn getattr(&self, ino: u64) -> OpResult<(FileAttr, Duration)> {
        nosys()
    }
    fn setattr(&self, c: &Caller, ino: u64, sa: &SetattrIn) -> OpResult<(FileAttr, Duration)> {
        nosys()
    }
    fn readlink(&self, ino: u64) -> OpResult<Vec<u8>> {
        nosys()
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
        nosys()
    }
    fn mkdir(
        &self,
        c: &Caller,
        parent: u64,
        name: &[u8],
        mode: u32,
        umask: u32,
    ) -> OpResult<Entry> {
        nosys()
    }
    fn unlink(&self, parent: u64, name: &[u8]) -> OpResult<()> {
        nosys()
    }
    fn rmdir(&self, parent: u64, name: &[u8]) -> OpResult<()> {
        nosys()
    }
    fn symlink(&self, c: &Caller, parent: u64, name: &[u8], target: &[u8]) -> OpResult<Entry> {
        nosys()
    }
    /// `flags`: RENAME_NOREPLACE, RENAME_EXCHANGE, RENAME_WHITEOUT bits.
    fn rename(
        &self,
        parent: u64,
        name: &[u8],
        newparent: u64,
        newname: &[u8],
        flags: u32,
    ) -> OpResult<()> {
        nosys()
    }
    fn link(&self, ino: u64, newparent: u64, newname: &[u8]) -> OpResult<Entry> {
        nosys()
    }
    fn open(&self, ino: u64, flags: i32) -> OpResult<Opened> {
        nosys()
    }
    fn read(&self, ino: u64, fh: u64, offset: u64, size: u32) -> OpResult<Vec<u8>> {
        nosys()
    }
    /// `write_flags`: FUSE_WRITE_* bits (FUSE_WRITE_KILL_SUIDGID).
    fn write(
        &self,
        c: &Caller,
        ino: u64,
        fh: u64,
        offset: u64,
        data: &[u8],
        write_flags: u32,
    ) -> OpResult<u32> {
        nosys()
    }
    /// Nothing to do at close(2) for ldfs or memfs (data reaches the daemon
    /// with each WRITE or, with the writeback cache, before the kernel sends
    /// FLUSH; POSIX locks are the kernel's own). ENOSYS makes the kernel
    /// stop sending FLUSH at all (`fc->no_flush`), a round trip less per
    /// close; close(2) still returns writeback errors, which the kernel
    /// takes before it would send FLUSH.
    fn flush(&self, ino: u64, fh: u64) -> OpResult<()> {
        nosys()
    }
    fn release(&self, ino: u64, fh: u64) -> OpResult<()> {
        Ok(())
    }
    fn fsync(&self, ino: u64, fh: u64, datasync: bool) -> OpResult<()> {
        nosys()
    }
    fn opendir(&self, ino: u64, flags: i32) -> OpResult<Opened> {
        nosys()
    }
    /// Hands the entries after `offset` to `add` until it says the reply
    /// is full (false: that entry was not taken).
    fn readdir(
        &self,
        ino: u64,
        fh: u64,
        offset: u64,
        add: &mut dyn FnMut(DirEntry) -> bool,
    ) -> OpResult<()> {
        nosys()
    }
    /// As `readdir`; an entry the reply took (all but . and ..) gives the
    /// kernel a lookup reference, taken after `add` accepted it.
    fn readdirplus(
        &self,
        ino: u64,
        fh: u64,
        offset: u64,
        add: &mut dyn FnMut(DirEntryPlus) -> bool,
    ) -> OpResult<()> {
        nosys()
    }
    fn releasedir(&self, ino: u64, fh: u64) -> OpResult<()> {
        Ok(())
    }
    fn fsyncdir(&self, ino: u64, fh: u64, datasync: bool) -> OpResult<()> {
        nosys()
    }
    fn statfs(&self, ino: u64) -> OpResult<Statfs> {
        nosys()
    }
    fn setxattr(
        &self,
        c: &Caller,
        ino: u64,
        name: &[u8],
        value: &[u8],
        flags: i32,
    ) -> OpResult<()> {
        nosys()
    }
    fn getxattr(&self, c: &Caller, ino: u64, name: &[u8], size: u32) -> OpResult<Xattr> {
        nosys()
    }
    fn listxattr(&self, ino: u64, size: u32) -> OpResult<Xattr> {
        nosys()
    }
    fn removexattr(&self, ino: u64, name: &[u8]) -> OpResult<()> {
        nosys()
    }
    fn access(&self, ino: u64, mask: i32) -> OpResult<()> {
        nosys()
    }
    fn create(
        &self,
        c: &Caller,
        parent: u64,
        name: &[u8],
        mode: u32,
        umask: u32,
        flags: i32,
    ) -> OpResult<(Entry, Opened)> {
        nosys()
    }
    fn fallocate(&self, ino: u64, fh: u64, offset: u64, length: u64, mode: i32) -> OpResult<()> {
        nosys()
    }
    fn lseek(&self, ino: u64, fh: u64, offset: i64, whence: i32) -> OpResult<i64> {
        nosys()
    }
    /// A restricted ioctl (the kernel sends the file-attribute ones,
    /// FS_IOC_GETFLAGS and FS_IOC_SETFLAGS, for `lsattr` and `chattr`):
    /// `input` is the argument's `in_size` bytes; the reply is at most
    /// `out_size` bytes, the ioctl's result 0.
    fn ioctl(
        &self,
        c: &Caller,
        ino: u64,
        fh: u64,
        cmd: u32,
        input: &[u8],
        out_size: u32,
    ) -> OpResult<Vec<u8>> {
        nosys()
    }
}

/// The `transport=` mount option.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Transport {
    /// io_uring when the kernel offers it, else /dev/fuse (one log line).
    #[default]
    Auto,
    /// io_uring or a clear error.
    Uring,
    /// /dev/fuse only.
    Dev,
}

impl std::str::FromStr for Transport {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Transport::Auto),
            "uring" => Ok(Transport::Uring),
            "dev" => Ok(Transport::Dev),
            _ => Err(format!("transport={s}: auto, uring or dev")),
        }
    }
}

/// The fuse module's switch for FUSE over io_uring.
pub const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

/// How to turn the kernel's switch on, for messages.
pub const HOW_TO_ENABLE: &str =
    "as root: echo Y > /sys/module/fuse/parameters/enable_uring (or boot with fuse.enable_uring=1)";

/// Whether this kernel can carry FUSE over io_uring: `Ok(true)` if on,
/// `Ok(false)` if built in but off, `Err` (why) if absent.
pub fn kernel_uring() -> Result<bool, String> {
    match std::fs::read_to_string(ENABLE_URING) {
        Ok(s) => Ok(matches!(s.trim(), "Y" | "y" | "1")),
        Err(e) => Err(format!(
            "this kernel has no FUSE over io_uring ({ENABLE_URING}: {e}; Linux 6.14+ with CONFIG_FUSE_IO_URING)"
        )),
    }
}

/// Decides whether a mount uses io_uring: `auto` takes it when the kernel
/// offers it and says in one line why not otherwise; `uring` fails with the
/// reason, but as root turns the kernel's switch on (asked for by name, and
/// said on stderr).
pub fn choose(t: Transport) -> Result<bool, String> {
    let on = choose_kernel(t)?;
    if !on {
        return Ok(false);
    }
    match uring::probe() {
        Ok(()) => Ok(true),
        Err(e) if t == Transport::Auto => {
            eprintln!("ldfs: transport /dev/fuse: this process cannot use io_uring ({e})");
            Ok(false)
        }
        Err(e) => Err(format!(
            "transport=uring: this process cannot use io_uring ({e})"
        )),
    }
}

fn choose_kernel(t: Transport) -> Result<bool, String> {
    match t {
        Transport::Dev => Ok(false),
        Transport::Auto => match kernel_uring() {
            Ok(true) => Ok(true),
            Ok(false) => {
                eprintln!(
                    "ldfs: transport /dev/fuse: FUSE over io_uring is off in this kernel ({HOW_TO_ENABLE})"
                );
                Ok(false)
            }
            Err(e) => {
                eprintln!("ldfs: transport /dev/fuse: {e}");
                Ok(false)
            }
        },
        Transport::Uring => match kernel_uring()? {
            true => Ok(true),
            false if unsafe { libc::geteuid() } == 0 => {
                std::fs::write(ENABLE_URING, b"Y")
                    .map_err(|e| format!("transport=uring: turning on {ENABLE_URING}: {e}"))?;
                eprintln!("ldfs: transport=uring: turned FUSE over io_uring on ({ENABLE_URING} = Y; it stays on for every FUSE mount until set to N)");
                Ok(true)
            }
            false => Err(format!(
                "transport=uring: FUSE over io_uring is off in this kernel; {HOW_TO_ENABLE}"
            )),
        },
    }
}
