//! The in-memory FUSE ceiling for benchmarks (issue 5): a tiny file system
//! that keeps everything in a HashMap and does no storage work at all, mounted
//! with the same FUSE options and thread count as ldfs, so the cost of a FUSE
//! round trip on this machine is measured in the same run as ldfs.

use std::collections::{BTreeMap, HashMap};
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use fuser::{
    Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    InitFlags, KernelConfig, LockOwner, MountOption, OpenFlags, RenameFlags, ReplyAttr,
    ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyOpen,
    ReplyStatfs, ReplyWrite, Request, Session, TimeOrNow, WriteFlags,
};

const TTL: Duration = Duration::from_secs(1);

struct Node {
    attr: FileAttr,
    data: Vec<u8>,
    children: BTreeMap<OsString, u64>,
    target: PathBuf,
}

struct State {
    nodes: HashMap<u64, Node>,
    next: u64,
}

pub struct MemFs {
    st: Mutex<State>,
    no_open: bool,
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

    fn reply(flush: &Option<FlushFile>, reply: ReplyEmpty) {
        match flush.as_ref().map_or(Ok(()), FlushFile::flush) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
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

fn new_attr(ino: u64, kind: FileType, perm: u16, req: &Request) -> FileAttr {
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
        uid: req.uid(),
        gid: req.gid(),
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
        };
        MemFs {
            st: Mutex::new(State {
                nodes: HashMap::from([(1, root)]),
                next: 2,
            }),
            no_open: false,
            writeback_cache: false,
            flush: None,
        }
    }

    fn make(
        &self,
        req: &Request,
        parent: u64,
        name: &OsStr,
        kind: FileType,
        perm: u16,
        target: &Path,
    ) -> Result<FileAttr, Errno> {
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
        let mut attr = new_attr(ino, kind, perm, req);
        attr.size = target.as_os_str().len() as u64;
        st.nodes.insert(
            ino,
            Node {
                attr,
                data: Vec::new(),
                children: BTreeMap::new(),
                target: target.to_path_buf(),
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

impl Filesystem for MemFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // The same capabilities ldfs asks for (crates/ldfs-tools/src/fuse.rs).
        if self.writeback_cache {
            let _ = config.add_capabilities(InitFlags::FUSE_WRITEBACK_CACHE);
        }
        let _ = config.add_capabilities(
            InitFlags::FUSE_DO_READDIRPLUS
                | InitFlags::FUSE_READDIRPLUS_AUTO
                | InitFlags::FUSE_PARALLEL_DIROPS
                | InitFlags::FUSE_ASYNC_READ
                | InitFlags::FUSE_MAX_PAGES
                // As ldfs asks (no security.capability lookup per write);
                // memfs keeps no set-id semantics, it is only a ceiling.
                | InitFlags::FUSE_HANDLE_KILLPRIV_V2,
        );
        self.no_open = config
            .add_capabilities(InitFlags::FUSE_NO_OPEN_SUPPORT | InitFlags::FUSE_NO_OPENDIR_SUPPORT)
            .is_ok();
        let _ = config.set_max_write(1 << 20);
        let _ = config.set_max_readahead(1 << 20);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let st = self.st.lock().unwrap();
        match st
            .nodes
            .get(&parent.0)
            .and_then(|p| p.children.get(name))
            .and_then(|i| st.nodes.get(i))
        {
            Some(n) => reply.entry(&TTL, &n.attr, Generation(0)),
            None => reply.error(err(libc::ENOENT)),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.st.lock().unwrap().nodes.get(&ino.0) {
            Some(n) => reply.attr(&TTL, &n.attr),
            None => reply.error(err(libc::ENOENT)),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
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
        let mut st = self.st.lock().unwrap();
        let Some(n) = st.nodes.get_mut(&ino.0) else {
            return reply.error(err(libc::ENOENT));
        };
        if let Some(m) = mode {
            n.attr.perm = (m & 0o7777) as u16;
        }
        if let Some(u) = uid {
            n.attr.uid = u;
        }
        if let Some(g) = gid {
            n.attr.gid = g;
        }
        if let Some(s) = size {
            n.data.resize(s as usize, 0);
            n.attr.size = s;
        }
        let t = |x: TimeOrNow| match x {
            TimeOrNow::Now => SystemTime::now(),
            TimeOrNow::SpecificTime(t) => t,
        };
        if let Some(a) = atime {
            n.attr.atime = t(a);
        }
        if let Some(m) = mtime {
            n.attr.mtime = t(m);
        }
        reply.attr(&TTL, &n.attr);
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.st.lock().unwrap().nodes.get(&ino.0) {
            Some(n) => reply.data(n.target.as_os_str().as_bytes()),
            None => reply.error(err(libc::ENOENT)),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        match self.make(
            req,
            parent.0,
            name,
            FileType::RegularFile,
            (mode & 0o7777) as u16,
            Path::new(""),
        ) {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        match self.make(
            req,
            parent.0,
            name,
            FileType::Directory,
            (mode & 0o7777) as u16,
            Path::new(""),
        ) {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        match self.make(req, parent.0, link_name, FileType::Symlink, 0o777, target) {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let mut st = self.st.lock().unwrap();
        let Some(ino) = st
            .nodes
            .get_mut(&parent.0)
            .and_then(|p| p.children.remove(name))
        else {
            return reply.error(err(libc::ENOENT));
        };
        st.nodes.remove(&ino);
        reply.ok();
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let mut st = self.st.lock().unwrap();
        let Some(&ino) = st.nodes.get(&parent.0).and_then(|p| p.children.get(name)) else {
            return reply.error(err(libc::ENOENT));
        };
        if st.nodes.get(&ino).is_some_and(|n| !n.children.is_empty()) {
            return reply.error(err(libc::ENOTEMPTY));
        }
        st.nodes.remove(&ino);
        let p = st.nodes.get_mut(&parent.0).expect("parent present");
        p.children.remove(name);
        p.attr.nlink -= 1;
        reply.ok();
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        _flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let mut st = self.st.lock().unwrap();
        let Some(ino) = st
            .nodes
            .get_mut(&parent.0)
            .and_then(|p| p.children.remove(name))
        else {
            return reply.error(err(libc::ENOENT));
        };
        let old = st
            .nodes
            .get_mut(&newparent.0)
            .and_then(|p| p.children.insert(newname.to_owned(), ino));
        if let Some(o) = old {
            st.nodes.remove(&o);
        }
        reply.ok();
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        if self.no_open {
            return reply.error(err(libc::ENOSYS));
        }
        reply.opened(FileHandle(ino.0), FopenFlags::empty());
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        if self.no_open {
            return reply.error(err(libc::ENOSYS));
        }
        reply.opened(FileHandle(ino.0), FopenFlags::empty());
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
        let st = self.st.lock().unwrap();
        let Some(n) = st.nodes.get(&ino.0) else {
            return reply.error(err(libc::ENOENT));
        };
        let lo = (offset as usize).min(n.data.len());
        let hi = (lo + size as usize).min(n.data.len());
        reply.data(&n.data[lo..hi]);
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let mut st = self.st.lock().unwrap();
        let Some(n) = st.nodes.get_mut(&ino.0) else {
            return reply.error(err(libc::ENOENT));
        };
        let end = offset as usize + data.len();
        if n.data.len() < end {
            n.data.resize(end, 0);
        }
        n.data[offset as usize..end].copy_from_slice(data);
        n.attr.size = n.data.len() as u64;
        n.attr.blocks = n.attr.size.div_ceil(512);
        reply.written(data.len() as u32);
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        FlushFile::reply(&self.flush, reply);
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        FlushFile::reply(&self.flush, reply);
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let st = self.st.lock().unwrap();
        let Some(d) = st.nodes.get(&ino.0) else {
            return reply.error(err(libc::ENOENT));
        };
        for (child, name) in by_inode(d, offset) {
            let kind = st
                .nodes
                .get(child)
                .map_or(FileType::RegularFile, |n| n.attr.kind);
            if reply.add(INodeNo(*child), *child, kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let st = self.st.lock().unwrap();
        let Some(d) = st.nodes.get(&ino.0) else {
            return reply.error(err(libc::ENOENT));
        };
        for (child, name) in by_inode(d, offset) {
            let Some(n) = st.nodes.get(child) else {
                continue;
            };
            if reply.add(INodeNo(*child), *child, name, &TTL, &n.attr, Generation(0)) {
                break;
            }
        }
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        reply.statfs(1 << 30, 1 << 29, 1 << 29, 1 << 20, 1 << 19, 4096, 255, 4096);
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        match self.make(
            req,
            parent.0,
            name,
            FileType::RegularFile,
            (mode & 0o7777) as u16,
            Path::new(""),
        ) {
            Ok(a) => reply.created(
                &TTL,
                &a,
                Generation(0),
                FileHandle(a.ino.0),
                FopenFlags::empty(),
            ),
            Err(e) => reply.error(e),
        }
    }
}

/// Mounts the in-memory file system on `dir` in the foreground until
/// unmounted, with ldfs's mount options and thread count (and its
/// writeback cache when `writeback_cache`; a page written and flushed to
/// `flush_file` per fsync when given).
pub fn serve(dir: &Path, writeback_cache: bool, flush_file: Option<&Path>) -> Result<(), String> {
    let mut cfg = Config::default();
    cfg.mount_options = vec![
        MountOption::FSName("memfs".into()),
        MountOption::Subtype("ldfs-memfs".into()),
        MountOption::DefaultPermissions,
        MountOption::RW,
    ];
    // Like ldfs in the benchmark: other users (tpcb's postgres) may enter.
    cfg.acl = fuser::SessionACL::All;
    cfg.n_threads = Some(crate::FUSE_THREADS);
    let fs = MemFs {
        writeback_cache,
        flush: flush_file.map(FlushFile::create).transpose()?,
        ..MemFs::new()
    };
    let session = Session::new(fs, dir, &cfg)
        .map_err(|e| format!("mounting memfs on {}: {e}", dir.display()))?;
    session.run().map_err(|e| e.to_string())
}
