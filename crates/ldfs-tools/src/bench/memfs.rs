//! The in-memory FUSE ceiling for benchmarks (issue 5): a tiny file system
//! that keeps everything in a HashMap and does no storage work at all, mounted
//! with the same FUSE options and thread count as ldfs, so the cost of a FUSE
//! round trip on this machine is measured in the same run as ldfs.

use std::collections::{BTreeMap, HashMap};
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use fuser::{
    Config, Errno, FileAttr, FileType, INodeNo, InitFlags, KernelConfig, MountOption, Session,
    TimeOrNow,
};

use crate::fuse::transport::dev::Dev;
use crate::fuse::transport::{
    uring, Caller, DirEntry, DirEntryPlus, Entry, FuseOps, OpResult, Opened, SetattrIn, Statfs,
    Xattr,
};

use crate::fuse::adapter::TTL;

struct Node {
    attr: FileAttr,
    data: Vec<u8>,
    children: BTreeMap<OsString, u64>,
    target: PathBuf,
    /// Extended attributes: kept, as ldfs keeps them, so the kernel asks
    /// memfs what it asks ldfs (a file's first write(2) asks for
    /// `security.capability` of a file system that answers GETXATTR; one
    /// answering ENOSYS is never asked again, a round trip fewer per
    /// created file than ldfs takes).
    xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
}

struct State {
    nodes: HashMap<u64, Node>,
    next: u64,
}

pub struct MemFs {
    st: Mutex<State>,
    no_open: AtomicBool,
    /// As ldfs's `-o writeback_cache`, so the ceiling is measured with the
    /// same FUSE options as the ldfs it is compared with.
    pub writeback_cache: bool,
    /// `--flush-file`: every fsync writes one page to this file and
    /// fdatasyncs it, the least a file system that keeps its data on a
    /// device pays per fsync (the durable FUSE ceiling, `memfs-sync`).
    pub flush: Option<FlushFile>,
}

/// A preallocated host file that stands for the device of a durable
/// file system, written as ldfs writes its image (`FileDevice` with
/// `direct_writes` where the host allows it): each fsync writes the next
/// page of it and flushes it.
pub struct FlushFile {
    dev: ldfs::device::FileDevice,
    next: std::sync::atomic::AtomicU64,
}

/// Pages in the flush file: written once when it is made, then cycled, so
/// the host file system never allocates (and journals) under a flush.
const FLUSH_FILE_PAGES: u64 = 16384;

impl FlushFile {
    pub fn create(path: &Path) -> Result<FlushFile, String> {
        use ldfs::device::{Device, FileDevice, FileDeviceOptions};
        let err = |e: ldfs::device::DeviceError| format!("{}: {e}", path.display());
        let mut dev =
            FileDevice::create(path, FLUSH_FILE_PAGES * 4096, FileDeviceOptions::default())
                .map_err(err)?;
        let chunk = vec![0u8; 1 << 20];
        for i in 0..FLUSH_FILE_PAGES * 4096 / chunk.len() as u64 {
            dev.write_at(&chunk, i * chunk.len() as u64).map_err(err)?;
        }
        dev.flush().map_err(err)?;
        // As `ldfs mount` does by default; buffered where refused.
        let _ = dev.direct_writes();
        Ok(FlushFile {
            dev,
            next: std::sync::atomic::AtomicU64::new(0),
        })
    }

    fn flush(&self) -> Result<(), Errno> {
        use ldfs::device::Device;
        let n = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let page = [n as u8; 4096];
        self.dev
            .write_at(&page, n % FLUSH_FILE_PAGES * 4096)
            .and_then(|()| self.dev.flush())
            .map_err(|_| err(libc::EIO))
    }
}

/// A directory's entries after `offset`, in inode order, each with its
/// inode number as its readdir cookie: a cookie that stays valid when
/// entries are removed while a reader walks the directory (an index into
/// the name-sorted map would shift and skip names, and `rm -r` would then
/// find the directory not empty). Two names for one inode in one directory
/// share a cookie; the benchmarks make no such links.
fn by_inode(d: &Node, offset: u64) -> Vec<(&u64, &OsString)> {
    let mut v: Vec<(&u64, &OsString)> = d
        .children
        .iter()
        .map(|(name, ino)| (ino, name))
        .filter(|(ino, _)| **ino > offset)
        .collect();
    v.sort();
    v
}

fn err(e: i32) -> Errno {
    Errno::from_i32(e)
}

fn new_attr(ino: u64, kind: FileType, perm: u16, c: &Caller) -> FileAttr {
    let now = SystemTime::now();
    FileAttr {
        ino: INodeNo(ino),
        size: 0,
        blocks: 0,
        atime: now,
        mtime: now,
        ctime: now,
        crtime: now,
        kind,
        perm,
        nlink: if kind == FileType::Directory { 2 } else { 1 },
        uid: c.uid,
        gid: c.gid,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

impl MemFs {
    pub fn new() -> MemFs {
        let now = SystemTime::now();
        let root = Node {
            attr: FileAttr {
                ino: INodeNo(1),
                size: 0,
                blocks: 0,
                atime: now,
                mtime: now,
                ctime: now,
                crtime: now,
                kind: FileType::Directory,
                perm: 0o755,
                nlink: 2,
                uid: 0,
                gid: 0,
                rdev: 0,
                blksize: 4096,
                flags: 0,
            },
            data: Vec::new(),
            children: BTreeMap::new(),
            target: PathBuf::new(),
            xattrs: BTreeMap::new(),
        };
        MemFs {
            st: Mutex::new(State {
                nodes: HashMap::from([(1, root)]),
                next: 2,
            }),
            no_open: AtomicBool::new(false),
            writeback_cache: false,
            flush: None,
        }
    }

    fn make(
        &self,
        c: &Caller,
        parent: u64,
        name: &[u8],
        kind: FileType,
        perm: u16,
        target: &Path,
    ) -> Result<FileAttr, Errno> {
        let name = OsStr::from_bytes(name);
        let mut st = self.st.lock().unwrap();
        let ino = st.next;
        let p = st.nodes.get_mut(&parent).ok_or(err(libc::ENOENT))?;
        if p.children.contains_key(name) {
            return Err(err(libc::EEXIST));
        }
        p.children.insert(name.to_owned(), ino);
        if kind == FileType::Directory {
            p.attr.nlink += 1;
        }
        st.next += 1;
        let mut attr = new_attr(ino, kind, perm, c);
        attr.size = target.as_os_str().len() as u64;
        st.nodes.insert(
            ino,
            Node {
                attr,
                data: Vec::new(),
                children: BTreeMap::new(),
                target: target.to_path_buf(),
                xattrs: BTreeMap::new(),
            },
        );
        Ok(attr)
    }
}

impl Default for MemFs {
    fn default() -> Self {
        MemFs::new()
    }
}

/// A GETXATTR or LISTXATTR answer for a buffer of `size` bytes (0: the
/// size it needs).
fn sized(v: Vec<u8>, size: u32) -> OpResult<Xattr> {
    if size == 0 {
        Ok(Xattr::Size(v.len() as u32))
    } else if v.len() <= size as usize {
        Ok(Xattr::Data(v))
    } else {
        Err(err(libc::ERANGE))
    }
}

fn entry(attr: FileAttr) -> Entry {
    Entry {
        attr,
        generation: 0,
        ttl: TTL,
        // As ldfs's (the ceiling must take the same round trips).
        entry_ttl: crate::fuse::adapter::ENTRY_TTL,
    }
}

impl FuseOps for MemFs {
    fn init(&self, config: &mut KernelConfig) {
        // The same capabilities ldfs asks for (crates/ldfs-tools/src/fuse/adapter.rs).
        if self.writeback_cache {
            let _ = config.add_capabilities(InitFlags::FUSE_WRITEBACK_CACHE);
        }
        let _ = config.add_capabilities(
            InitFlags::FUSE_DO_READDIRPLUS
                | InitFlags::FUSE_READDIRPLUS_AUTO
                | InitFlags::FUSE_PARALLEL_DIROPS
                | InitFlags::FUSE_ASYNC_READ
                | InitFlags::FUSE_MAX_PAGES
                // As ldfs asks; memfs keeps no set-id semantics, it is
                // only a ceiling.
                | InitFlags::FUSE_HANDLE_KILLPRIV_V2,
        );
        let no_open = config
            .add_capabilities(InitFlags::FUSE_NO_OPEN_SUPPORT | InitFlags::FUSE_NO_OPENDIR_SUPPORT)
            .is_ok();
        self.no_open.store(no_open, Ordering::Relaxed);
        let _ = config.set_max_write(crate::fuse::adapter::MAX_WRITE_BYTES as u32);
        let _ = config.set_max_readahead(crate::fuse::adapter::MAX_WRITE_BYTES as u32);
    }

    fn lookup(&self, _c: &Caller, parent: u64, name: &[u8]) -> OpResult<Entry> {
        let st = self.st.lock().unwrap();
        let p = st.nodes.get(&parent).ok_or(err(libc::ENOENT))?;
        match p.children.get(OsStr::from_bytes(name)) {
            Some(i) => st
                .nodes
                .get(i)
                .map(|n| entry(n.attr))
                .ok_or(err(libc::ENOENT)),
            // As ldfs answers a miss (a negative entry), so the ceiling
            // takes the same round trips.
            None if name != b"." && name != b".." => Ok(crate::fuse::adapter::negative_entry()),
            None => Err(err(libc::ENOENT)),
        }
    }

    fn getattr(&self, ino: u64) -> OpResult<(FileAttr, Duration)> {
        match self.st.lock().unwrap().nodes.get(&ino) {
            Some(n) => Ok((n.attr, TTL)),
            None => Err(err(libc::ENOENT)),
        }
    }

    fn setattr(&self, _c: &Caller, ino: u64, sa: &SetattrIn) -> OpResult<(FileAttr, Duration)> {
        let mut st = self.st.lock().unwrap();
        let Some(n) = st.nodes.get_mut(&ino) else {
            return Err(err(libc::ENOENT));
        };
        if let Some(m) = sa.mode {
            n.attr.perm = (m & 0o7777) as u16;
        }
        if let Some(u) = sa.uid {
            n.attr.uid = u;
        }
        if let Some(g) = sa.gid {
            n.attr.gid = g;
        }
        if let Some(s) = sa.size {
            n.data.resize(s as usize, 0);
            n.attr.size = s;
        }
        let t = |x: TimeOrNow| match x {
            TimeOrNow::Now => SystemTime::now(),
            TimeOrNow::SpecificTime(t) => t,
        };
        if let Some(a) = sa.atime {
            n.attr.atime = t(a);
        }
        if let Some(m) = sa.mtime {
            n.attr.mtime = t(m);
        }
        Ok((n.attr, TTL))
    }

    fn readlink(&self, ino: u64) -> OpResult<Vec<u8>> {
        match self.st.lock().unwrap().nodes.get(&ino) {
            Some(n) => Ok(n.target.as_os_str().as_bytes().to_vec()),
            None => Err(err(libc::ENOENT)),
        }
    }

    fn mknod(
        &self,
        c: &Caller,
        parent: u64,
        name: &[u8],
        mode: u32,
        _umask: u32,
        _rdev: u32,
    ) -> OpResult<Entry> {
        let perm = (mode & 0o7777) as u16;
        self.make(c, parent, name, FileType::RegularFile, perm, Path::new(""))
            .map(entry)
    }

    fn mkdir(
        &self,
        c: &Caller,
        parent: u64,
        name: &[u8],
        mode: u32,
        _umask: u32,
    ) -> OpResult<Entry> {
        let perm = (mode & 0o7777) as u16;
        self.make(c, parent, name, FileType::Directory, perm, Path::new(""))
            .map(entry)
    }

    fn symlink(&self, c: &Caller, parent: u64, name: &[u8], target: &[u8]) -> OpResult<Entry> {
        let target = Path::new(OsStr::from_bytes(target));
        self.make(c, parent, name, FileType::Symlink, 0o777, target)
            .map(entry)
    }

    fn unlink(&self, parent: u64, name: &[u8]) -> OpResult<()> {
        let mut st = self.st.lock().unwrap();
        let Some(ino) = st
            .nodes
            .get_mut(&parent)
            .and_then(|p| p.children.remove(OsStr::from_bytes(name)))
        else {
            return Err(err(libc::ENOENT));
        };
        st.nodes.remove(&ino);
        Ok(())
    }

    fn rmdir(&self, parent: u64, name: &[u8]) -> OpResult<()> {
        let name = OsStr::from_bytes(name);
        let mut st = self.st.lock().unwrap();
        let Some(&ino) = st.nodes.get(&parent).and_then(|p| p.children.get(name)) else {
            return Err(err(libc::ENOENT));
        };
        if st.nodes.get(&ino).is_some_and(|n| !n.children.is_empty()) {
            return Err(err(libc::ENOTEMPTY));
        }
        st.nodes.remove(&ino);
        let p = st.nodes.get_mut(&parent).expect("parent present");
        p.children.remove(name);
        p.attr.nlink -= 1;
        Ok(())
    }

    fn rename(
        &self,
        parent: u64,
        name: &[u8],
        newparent: u64,
        newname: &[u8],
        _flags: u32,
    ) -> OpResult<()> {
        let mut st = self.st.lock().unwrap();
        let Some(ino) = st
            .nodes
            .get_mut(&parent)
            .and_then(|p| p.children.remove(OsStr::from_bytes(name)))
        else {
            return Err(err(libc::ENOENT));
        };
        let old = st.nodes.get_mut(&newparent).and_then(|p| {
            p.children
                .insert(OsStr::from_bytes(newname).to_owned(), ino)
        });
        if let Some(o) = old {
            st.nodes.remove(&o);
        }
        Ok(())
    }

    fn open(&self, ino: u64, _flags: i32) -> OpResult<Opened> {
        if self.no_open.load(Ordering::Relaxed) {
            return Err(err(libc::ENOSYS));
        }
        Ok(Opened { fh: ino, flags: 0 })
    }

    fn opendir(&self, ino: u64, _flags: i32) -> OpResult<Opened> {
        if self.no_open.load(Ordering::Relaxed) {
            return Err(err(libc::ENOSYS));
        }
        Ok(Opened { fh: ino, flags: 0 })
    }

    fn read(&self, ino: u64, _fh: u64, offset: u64, size: u32) -> OpResult<Vec<u8>> {
        let st = self.st.lock().unwrap();
        let Some(n) = st.nodes.get(&ino) else {
            return Err(err(libc::ENOENT));
        };
        let lo = (offset as usize).min(n.data.len());
        let hi = (lo + size as usize).min(n.data.len());
        Ok(n.data[lo..hi].to_vec())
    }

    fn write(
        &self,
        _c: &Caller,
        ino: u64,
        _fh: u64,
        offset: u64,
        data: &[u8],
        _write_flags: u32,
    ) -> OpResult<u32> {
        let mut st = self.st.lock().unwrap();
        let Some(n) = st.nodes.get_mut(&ino) else {
            return Err(err(libc::ENOENT));
        };
        let end = offset as usize + data.len();
        if n.data.len() < end {
            n.data.resize(end, 0);
        }
        n.data[offset as usize..end].copy_from_slice(data);
        n.attr.size = n.data.len() as u64;
        n.attr.blocks = n.attr.size.div_ceil(512);
        Ok(data.len() as u32)
    }

    fn fsync(&self, _ino: u64, _fh: u64, _datasync: bool) -> OpResult<()> {
        self.flush.as_ref().map_or(Ok(()), FlushFile::flush)
    }

    fn fsyncdir(&self, _ino: u64, _fh: u64, _datasync: bool) -> OpResult<()> {
        self.flush.as_ref().map_or(Ok(()), FlushFile::flush)
    }

    fn readdir(
        &self,
        ino: u64,
        _fh: u64,
        offset: u64,
        add: &mut dyn FnMut(DirEntry) -> bool,
    ) -> OpResult<()> {
        let st = self.st.lock().unwrap();
        let Some(d) = st.nodes.get(&ino) else {
            return Err(err(libc::ENOENT));
        };
        for (child, name) in by_inode(d, offset) {
            let kind = st
                .nodes
                .get(child)
                .map_or(FileType::RegularFile, |n| n.attr.kind);
            let e = DirEntry {
                ino: *child,
                next: *child,
                kind,
                name: name.as_bytes().to_vec(),
            };
            if !add(e) {
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
        let st = self.st.lock().unwrap();
        let Some(d) = st.nodes.get(&ino) else {
            return Err(err(libc::ENOENT));
        };
        for (child, name) in by_inode(d, offset) {
            let Some(n) = st.nodes.get(child) else {
                continue;
            };
            let e = DirEntryPlus {
                dirent: DirEntry {
                    ino: *child,
                    next: *child,
                    kind: n.attr.kind,
                    name: name.as_bytes().to_vec(),
                },
                entry: entry(n.attr),
            };
            if !add(e) {
                break;
            }
        }
        Ok(())
    }

    fn statfs(&self, _ino: u64) -> OpResult<Statfs> {
        Ok(Statfs {
            blocks: 1 << 30,
            bfree: 1 << 29,
            bavail: 1 << 29,
            files: 1 << 20,
            ffree: 1 << 19,
            bsize: 4096,
            namelen: 255,
            frsize: 4096,
        })
    }

    fn setxattr(
        &self,
        _c: &Caller,
        ino: u64,
        name: &[u8],
        value: &[u8],
        flags: i32,
    ) -> OpResult<()> {
        let mut st = self.st.lock().unwrap();
        let n = st.nodes.get_mut(&ino).ok_or(err(libc::ENOENT))?;
        let exists = n.xattrs.contains_key(name);
        if flags & libc::XATTR_CREATE != 0 && exists {
            return Err(err(libc::EEXIST));
        }
        if flags & libc::XATTR_REPLACE != 0 && !exists {
            return Err(err(libc::ENODATA));
        }
        n.xattrs.insert(name.to_vec(), value.to_vec());
        Ok(())
    }

    fn getxattr(&self, _c: &Caller, ino: u64, name: &[u8], size: u32) -> OpResult<Xattr> {
        let st = self.st.lock().unwrap();
        let n = st.nodes.get(&ino).ok_or(err(libc::ENOENT))?;
        let v = n.xattrs.get(name).ok_or(err(libc::ENODATA))?;
        sized(v.clone(), size)
    }

    fn listxattr(&self, ino: u64, size: u32) -> OpResult<Xattr> {
        let st = self.st.lock().unwrap();
        let n = st.nodes.get(&ino).ok_or(err(libc::ENOENT))?;
        let mut names = Vec::new();
        for k in n.xattrs.keys() {
            names.extend_from_slice(k);
            names.push(0);
        }
        sized(names, size)
    }

    fn removexattr(&self, ino: u64, name: &[u8]) -> OpResult<()> {
        let mut st = self.st.lock().unwrap();
        let n = st.nodes.get_mut(&ino).ok_or(err(libc::ENOENT))?;
        n.xattrs.remove(name).map(drop).ok_or(err(libc::ENODATA))
    }

    fn access(&self, _ino: u64, _mask: i32) -> OpResult<()> {
        Ok(())
    }

    fn create(
        &self,
        c: &Caller,
        parent: u64,
        name: &[u8],
        mode: u32,
        _umask: u32,
        _flags: i32,
    ) -> OpResult<(Entry, Opened)> {
        let perm = (mode & 0o7777) as u16;
        let a = self.make(c, parent, name, FileType::RegularFile, perm, Path::new(""))?;
        Ok((
            entry(a),
            Opened {
                fh: a.ino.0,
                flags: 0,
            },
        ))
    }
}

/// Mounts the in-memory file system on `dir` in the foreground until
/// unmounted, with ldfs's mount options and thread count (and its
/// writeback cache when `writeback_cache`; a page written and flushed to
/// `flush_file` per fsync when given).
pub fn serve(
    dir: &Path,
    writeback_cache: bool,
    flush_file: Option<&Path>,
    uring: bool,
) -> Result<(), String> {
    let mut cfg = Config::default();
    cfg.mount_options = vec![
        MountOption::FSName("memfs".into()),
        MountOption::Subtype("ldfs-memfs".into()),
        MountOption::DefaultPermissions,
        MountOption::RW,
    ];
    // Like ldfs in the benchmark: other users (tpcb's postgres) may enter.
    cfg.acl = fuser::SessionACL::All;
    cfg.n_threads = Some(crate::fuse::FUSE_THREADS);
    let fs = Arc::new(MemFs {
        writeback_cache,
        flush: flush_file.map(FlushFile::create).transpose()?,
        ..MemFs::new()
    });
    if uring {
        crate::fuse::transport::choose(crate::fuse::transport::Transport::Uring)?;
    }
    let start = uring.then(|| Arc::new(uring::Start::default()));
    let session = Session::new(
        Dev {
            fs: fs.clone(),
            uring: start.clone(),
        },
        dir,
        &cfg,
    )
    .map_err(|e| format!("mounting memfs on {}: {e}", dir.display()))?;
    let rings = match start {
        Some(start) => {
            use std::os::fd::AsFd;
            let fd = session
                .as_fd()
                .try_clone_to_owned()
                .map_err(|e| format!("duplicating /dev/fuse: {e}"))?;
            Some(std::thread::spawn(move || {
                match start.wait(Duration::from_secs(60)) {
                    Some(true) => {}
                    other => {
                        eprintln!("memfs: io_uring not granted at INIT ({other:?}): /dev/fuse");
                        return None;
                    }
                }
                let per_queue = (crate::fuse::FUSE_THREADS / uring::queue_count()).max(2);
                let served = Arc::new(std::sync::atomic::AtomicUsize::new(0));
                match uring::start(
                    fs,
                    &fd,
                    per_queue,
                    crate::fuse::adapter::MAX_WRITE_BYTES,
                    served,
                ) {
                    Ok(r) => Some(r),
                    Err(f) => {
                        let now = if f.fell_back {
                            "serving over /dev/fuse"
                        } else {
                            "requests wait for the ring: unmount it"
                        };
                        eprintln!("memfs: io_uring: {}; {now}", f.why);
                        Some(f.rings)
                    }
                }
            }))
        }
        None => None,
    };
    let r = session.run().map_err(|e| e.to_string());
    if let Some(Ok(Some(rings))) = rings.map(|t| t.join()) {
        rings.join();
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Extended attributes are kept (so the kernel asks memfs for
    /// security.capability at a new file's first write, as it asks ldfs),
    /// with the flags and size queries of getxattr(2) and listxattr(2).
    #[test]
    fn xattrs_are_kept_as_ldfs_keeps_them() {
        let m = MemFs::new();
        let c = Caller {
            uid: 0,
            gid: 0,
            pid: 1,
        };
        let f = m
            .make(&c, 1, b"f", FileType::RegularFile, 0o644, Path::new(""))
            .unwrap();
        let ino = f.ino.0;
        let no = |r: OpResult<Xattr>| r.err().map(i32::from);
        assert_eq!(
            no(m.getxattr(&c, ino, b"security.capability", 0)),
            Some(libc::ENODATA)
        );
        m.setxattr(&c, ino, b"user.a", b"12345", 0).unwrap();
        assert_eq!(m.getxattr(&c, ino, b"user.a", 0).unwrap(), Xattr::Size(5));
        assert_eq!(
            m.getxattr(&c, ino, b"user.a", 5).unwrap(),
            Xattr::Data(b"12345".to_vec())
        );
        assert_eq!(no(m.getxattr(&c, ino, b"user.a", 4)), Some(libc::ERANGE));
        assert_eq!(
            m.setxattr(&c, ino, b"user.a", b"x", libc::XATTR_CREATE)
                .err()
                .map(i32::from),
            Some(libc::EEXIST)
        );
        assert_eq!(
            m.setxattr(&c, ino, b"user.b", b"x", libc::XATTR_REPLACE)
                .err()
                .map(i32::from),
            Some(libc::ENODATA)
        );
        m.setxattr(&c, ino, b"user.b", b"", 0).unwrap();
        assert_eq!(
            m.listxattr(ino, 64).unwrap(),
            Xattr::Data(b"user.a\0user.b\0".to_vec())
        );
        m.removexattr(ino, b"user.a").unwrap();
        assert_eq!(
            m.removexattr(ino, b"user.a").err().map(i32::from),
            Some(libc::ENODATA)
        );
        assert_eq!(m.listxattr(ino, 0).unwrap(), Xattr::Size(7));
    }

    /// A miss is a negative entry (node id 0), as ldfs answers it, so the
    /// ceiling takes the same round trips; "." and ".." and a missing
    /// parent are plain ENOENT; a name made afterwards is found.
    #[test]
    fn a_missing_name_is_a_negative_entry_as_in_ldfs() {
        let m = MemFs::new();
        let c = Caller {
            uid: 0,
            gid: 0,
            pid: 1,
        };
        let e = m.lookup(&c, 1, b"absent").unwrap();
        assert_eq!(e.attr.ino, INodeNo(0));
        assert_eq!(e.entry_ttl, crate::fuse::adapter::ENTRY_TTL);
        assert!(m.lookup(&c, 1, b"..").is_err());
        assert!(m.lookup(&c, 99, b"absent").is_err());
        let made = m.mkdir(&c, 1, b"absent", 0o755, 0).unwrap();
        let found = m.lookup(&c, 1, b"absent").unwrap();
        assert_eq!(found.attr.ino, made.attr.ino);
        assert_ne!(found.attr.ino, INodeNo(0));
    }
}
