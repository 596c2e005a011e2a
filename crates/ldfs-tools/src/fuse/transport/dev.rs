//! /dev/fuse through fuser's session: each `fuser::Filesystem` method calls
//! the [`FuseOps`] method of the same name and turns its result into the
//! reply, nothing else. Over io_uring this session still carries what the
//! kernel sends before the ring is registered (INIT first of all) and what
//! it never sends on the ring (FORGET, INTERRUPT).

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

use fuser::{
    AccessFlags, Errno, FileHandle, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyLseek, ReplyOpen, ReplyStatfs,
    ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};

use super::uring::Start;
use super::{Caller, DirEntry, DirEntryPlus, Entry, FuseOps, SetattrIn, Xattr};

/// The fuser side of a mount: the file system, and the io_uring start-up
/// to tell at INIT whether the kernel granted FUSE_OVER_IO_URING.
pub struct Dev<F: FuseOps> {
    pub fs: Arc<F>,
    pub uring: Option<Arc<Start>>,
}

fn caller(req: &Request) -> Caller {
    Caller {
        uid: req.uid(),
        gid: req.gid(),
        pid: req.pid(),
    }
}

fn entry(reply: ReplyEntry, r: Result<Entry, Errno>) {
    match r {
        Ok(e) => reply.entry_with_ttls(&e.ttl, &e.entry_ttl, &e.attr, Generation(e.generation)),
        Err(e) => reply.error(e),
    }
}

fn empty(reply: ReplyEmpty, r: Result<(), Errno>) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(e),
    }
}

fn xattr(reply: ReplyXattr, r: Result<Xattr, Errno>) {
    match r {
        Ok(Xattr::Size(n)) => reply.size(n),
        Ok(Xattr::Data(d)) => reply.data(&d),
        Err(e) => reply.error(e),
    }
}

fn opened(reply: ReplyOpen, r: Result<super::Opened, Errno>) {
    match r {
        Ok(o) => reply.opened(FileHandle(o.fh), FopenFlags::from_bits_retain(o.flags)),
        Err(e) => reply.error(e),
    }
}

impl<F: FuseOps> Filesystem for Dev<F> {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        self.fs.init(config);
        if let Some(start) = &self.uring {
            let granted = config
                .add_capabilities(InitFlags::FUSE_OVER_IO_URING)
                .is_ok();
            start.init_done(granted);
        }
        Ok(())
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.fs.forget(ino.0, nlookup);
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        entry(
            reply,
            self.fs.lookup(&caller(req), parent.0, name.as_bytes()),
        );
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.fs.getattr(ino.0) {
            Ok((a, ttl)) => reply.attr(&ttl, &a),
            Err(e) => reply.error(e),
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
        let sa = SetattrIn {
            mode,
            uid,
            gid,
            size,
            atime,
            mtime,
        };
        match self.fs.setattr(&caller(req), ino.0, &sa) {
            Ok((a, ttl)) => reply.attr(&ttl, &a),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.fs.readlink(ino.0) {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(e),
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
        let r = self
            .fs
            .mknod(&caller(req), parent.0, name.as_bytes(), mode, umask, rdev);
        entry(reply, r);
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
        let r = self
            .fs
            .mkdir(&caller(req), parent.0, name.as_bytes(), mode, umask);
        entry(reply, r);
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
        let r = self.fs.symlink(
            &caller(req),
            parent.0,
            link_name.as_bytes(),
            target.as_os_str().as_bytes(),
        );
        entry(reply, r);
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
        let r = self.fs.rename(
            parent.0,
            name.as_bytes(),
            newparent.0,
            newname.as_bytes(),
            flags.bits(),
        );
        empty(reply, r);
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        entry(reply, self.fs.link(ino.0, newparent.0, newname.as_bytes()));
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        opened(reply, self.fs.open(ino.0, flags.0));
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match self.fs.read(ino.0, fh.0, offset, size) {
            Ok(d) => reply.data(&d),
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        match self
            .fs
            .write(&caller(req), ino.0, fh.0, offset, data, write_flags.bits())
        {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(e),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        empty(reply, self.fs.flush(ino.0, fh.0));
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        empty(reply, self.fs.release(ino.0, fh.0));
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        empty(reply, self.fs.fsync(ino.0, fh.0, datasync));
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        opened(reply, self.fs.opendir(ino.0, flags.0));
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let mut add =
            |e: DirEntry| !reply.add(INodeNo(e.ino), e.next, e.kind, OsStr::from_bytes(&e.name));
        match self.fs.readdir(ino.0, fh.0, offset, &mut add) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let mut add = |e: DirEntryPlus| {
            !reply.add(
                INodeNo(e.dirent.ino),
                e.dirent.next,
                OsStr::from_bytes(&e.dirent.name),
                &e.entry.ttl,
                &e.entry.attr,
                Generation(e.entry.generation),
            )
        };
        match self.fs.readdirplus(ino.0, fh.0, offset, &mut add) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn releasedir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        empty(reply, self.fs.releasedir(ino.0, fh.0));
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        empty(reply, self.fs.fsyncdir(ino.0, fh.0, datasync));
    }

    fn statfs(&self, _req: &Request, ino: INodeNo, reply: ReplyStatfs) {
        match self.fs.statfs(ino.0) {
            Ok(s) => reply.statfs(
                s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.frsize,
            ),
            Err(e) => reply.error(e),
        }
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
        let r = self
            .fs
            .setxattr(&caller(req), ino.0, name.as_bytes(), value, flags);
        empty(reply, r);
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        xattr(
            reply,
            self.fs.getxattr(&caller(req), ino.0, name.as_bytes(), size),
        );
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        xattr(reply, self.fs.listxattr(ino.0, size));
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(reply, self.fs.removexattr(ino.0, name.as_bytes()));
    }

    fn access(&self, _req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        empty(reply, self.fs.access(ino.0, mask.bits()));
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        match self
            .fs
            .create(&caller(req), parent.0, name.as_bytes(), mode, umask, flags)
        {
            Ok((e, o)) => reply.created(
                &e.ttl,
                &e.attr,
                Generation(e.generation),
                FileHandle(o.fh),
                FopenFlags::from_bits_retain(o.flags),
            ),
            Err(e) => reply.error(e),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        empty(reply, self.fs.fallocate(ino.0, fh.0, offset, length, mode));
    }

    fn lseek(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        match self.fs.lseek(ino.0, fh.0, offset, whence) {
            Ok(o) => reply.offset(o),
            Err(e) => reply.error(e),
        }
    }

    fn ioctl(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: fuser::IoctlFlags,
        cmd: u32,
        in_data: &[u8],
        out_size: u32,
        reply: fuser::ReplyIoctl,
    ) {
        match self
            .fs
            .ioctl(&caller(req), ino.0, fh.0, cmd, in_data, out_size)
        {
            Ok(d) => reply.ioctl(0, &d),
            Err(e) => reply.error(e),
        }
    }
}
