//! POSIX behaviour through a real FUSE mount of ldfs, with the error codes
//! Linux programs expect. Skips, loudly, only where /dev/fuse is unusable.

mod common;

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::io::AsRawFd;

use common::{cstr, errno, fuse_usable, mkfs, mkfs_dual, mkfs_store, Mount, MountExtra};

/// Where a test's file system lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Layout {
    OneLog,
    /// The dual layout: its metadata log on a second image.
    Dual,
    /// A store-backed file system (issue 20): its durable home a bucket of the tests' S3
    /// gateway, the mount's cache an image (skipped, loudly, without a gateway).
    Store,
}

/// Runs a test body on one log, on the dual layout and on a store-backed file system.
macro_rules! on_every_layout {
    ($body:ident, $log:ident, $dual:ident, $store:ident) => {
        #[test]
        fn $log() {
            $body(Layout::OneLog);
        }
        #[test]
        fn $dual() {
            $body(Layout::Dual);
        }
        #[test]
        fn $store() {
            $body(Layout::Store);
        }
    };
}

/// A test's file system: how to mount it again.
struct Made {
    t: tempfile::TempDir,
    /// The image, or a store's `s3://` URL.
    img: std::path::PathBuf,
    extra: MountExtra,
    layout: Layout,
}

impl Made {
    fn mount(&self, opts: &[&str]) -> Mount {
        Mount::new_with(&self.img, &self.t.path().join("mnt"), opts, &self.extra)
    }

    /// A read-only mount: a store-backed file system's on a cache of its own (a writer's
    /// cache is refused read-only), showing the last uploaded checkpoint.
    fn mount_ro(&self) -> Mount {
        let mut extra = self.extra.clone();
        if self.layout == Layout::Store {
            extra.args = vec!["--cache".into(), self.t.path().join("ro-cache.img").into()];
        }
        Mount::new_with(&self.img, &self.t.path().join("mnt"), &["ro"], &extra)
    }
}

/// A fresh mount on `layout`.
fn setup(name: &str, layout: Layout) -> Option<(Made, Mount)> {
    if !fuse_usable() {
        return None;
    }
    let t = tempfile::tempdir().unwrap();
    let img = t.path().join(format!("{name}.img"));
    let (img, extra) = match layout {
        Layout::OneLog => {
            mkfs(&img, "256M");
            (img, MountExtra::default())
        }
        Layout::Dual => {
            mkfs_dual(&img, &t.path().join(format!("{name}-meta.img")), "256M");
            (img, MountExtra::default())
        }
        Layout::Store => mkfs_store(&format!("posix-{name}"), &img, "256M")?,
    };
    let made = Made {
        t,
        img,
        extra,
        layout,
    };
    let m = made.mount(&[]);
    Some((made, m))
}

fn err_of<T: std::fmt::Debug>(r: std::io::Result<T>) -> i32 {
    r.expect_err("expected an error").raw_os_error().unwrap()
}

on_every_layout!(
    files_dirs_links_and_their_errors,
    files_dirs_links_and_their_errors_on_one_log,
    files_dirs_links_and_their_errors_on_dual,
    files_dirs_links_and_their_errors_on_store
);
fn files_dirs_links_and_their_errors(layout: Layout) {
    let Some((_t, m)) = setup("basic", layout) else {
        return;
    };
    let p = |s: &str| m.path(s);
    fs::write(p("a"), b"hello").unwrap();
    assert_eq!(fs::read(p("a")).unwrap(), b"hello");
    fs::create_dir(p("d")).unwrap();
    assert_eq!(err_of(fs::create_dir(p("d"))), libc::EEXIST);
    fs::write(p("d/x"), b"x").unwrap();
    assert_eq!(err_of(fs::remove_dir(p("d"))), libc::ENOTEMPTY);
    assert_eq!(err_of(fs::remove_file(p("d"))), libc::EISDIR);
    assert_eq!(err_of(fs::remove_dir(p("a"))), libc::ENOTDIR);
    assert_eq!(err_of(fs::read(p("nope"))), libc::ENOENT);
    let long = "n".repeat(256);
    assert_eq!(err_of(fs::write(p(&long), b"")), libc::ENAMETOOLONG);
    fs::write(p(&"m".repeat(255)), b"ok").unwrap();

    // Hard links and link counts.
    fs::hard_link(p("a"), p("a2")).unwrap();
    assert_eq!(fs::metadata(p("a")).unwrap().nlink(), 2);
    assert_eq!(fs::metadata(p("d")).unwrap().nlink(), 2);
    fs::create_dir(p("d/sub")).unwrap();
    assert_eq!(fs::metadata(p("d")).unwrap().nlink(), 3);
    fs::remove_file(p("a2")).unwrap();
    assert_eq!(fs::metadata(p("a")).unwrap().nlink(), 1);

    // Symlinks.
    std::os::unix::fs::symlink("a", p("s")).unwrap();
    assert_eq!(fs::read_link(p("s")).unwrap().to_str().unwrap(), "a");
    assert_eq!(fs::read(p("s")).unwrap(), b"hello");
    assert!(fs::symlink_metadata(p("s"))
        .unwrap()
        .file_type()
        .is_symlink());

    // Rename: plain, over a file, dir over empty dir, dir into itself.
    fs::rename(p("a"), p("b")).unwrap();
    assert_eq!(err_of(fs::metadata(p("a"))), libc::ENOENT);
    fs::write(p("c"), b"c").unwrap();
    fs::rename(p("b"), p("c")).unwrap();
    assert_eq!(fs::read(p("c")).unwrap(), b"hello");
    fs::create_dir(p("e")).unwrap();
    fs::create_dir(p("f")).unwrap();
    fs::rename(p("e"), p("f")).unwrap();
    assert!(fs::metadata(p("f")).unwrap().is_dir());
    fs::create_dir(p("full")).unwrap();
    fs::write(p("full/x"), b"").unwrap();
    assert_eq!(err_of(fs::rename(p("f"), p("full"))), libc::ENOTEMPTY);
    assert_eq!(err_of(fs::rename(p("d"), p("d/sub/inner"))), libc::EINVAL);
    assert_eq!(err_of(fs::rename(p("c"), p("d"))), libc::EISDIR);
    assert_eq!(err_of(fs::rename(p("d"), p("c"))), libc::ENOTDIR);

    // renameat2 flags.
    fs::write(p("r1"), b"1").unwrap();
    fs::write(p("r2"), b"2").unwrap();
    let rn = |a: &str, b: &str, flags: u32| unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            cstr(&p(a)).as_ptr(),
            libc::AT_FDCWD,
            cstr(&p(b)).as_ptr(),
            flags,
        )
    };
    assert_eq!(rn("r1", "r2", libc::RENAME_NOREPLACE), -1);
    assert_eq!(errno(), libc::EEXIST);
    assert_eq!(rn("r1", "r2", libc::RENAME_EXCHANGE), 0);
    assert_eq!(fs::read(p("r1")).unwrap(), b"2");
    assert_eq!(fs::read(p("r2")).unwrap(), b"1");
    assert_eq!(rn("r1", "r9", libc::RENAME_EXCHANGE), -1);
    assert_eq!(errno(), libc::ENOENT);
    m.unmount();
}

on_every_layout!(
    attributes_times_and_special_files,
    attributes_times_and_special_files_on_one_log,
    attributes_times_and_special_files_on_dual,
    attributes_times_and_special_files_on_store
);
fn attributes_times_and_special_files(layout: Layout) {
    let Some((_t, m)) = setup("attr", layout) else {
        return;
    };
    let p = |s: &str| m.path(s);
    fs::write(p("f"), b"data").unwrap();
    fs::set_permissions(p("f"), fs::Permissions::from_mode(0o4751)).unwrap();
    assert_eq!(fs::metadata(p("f")).unwrap().mode() & 0o7777, 0o4751);
    // chown clears set-user-ID.
    std::os::unix::fs::chown(p("f"), Some(1234), Some(5678)).unwrap();
    let md = fs::metadata(p("f")).unwrap();
    assert_eq!((md.uid(), md.gid()), (1234, 5678));
    assert_eq!(md.mode() & 0o4000, 0);

    // utimensat with nanoseconds and UTIME_OMIT.
    let ts = [
        libc::timespec {
            tv_sec: 1_000_000_000,
            tv_nsec: 123_456_789,
        },
        libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
    ];
    let before = fs::metadata(p("f")).unwrap();
    assert_eq!(
        unsafe { libc::utimensat(libc::AT_FDCWD, cstr(&p("f")).as_ptr(), ts.as_ptr(), 0) },
        0
    );
    let md = fs::metadata(p("f")).unwrap();
    assert_eq!((md.atime(), md.atime_nsec()), (1_000_000_000, 123_456_789));
    assert_eq!(
        (md.mtime(), md.mtime_nsec()),
        (before.mtime(), before.mtime_nsec())
    );

    // FIFO, socket and device nodes.
    assert_eq!(unsafe { libc::mkfifo(cstr(&p("fifo")).as_ptr(), 0o644) }, 0);
    assert!(fs::metadata(p("fifo")).unwrap().file_type().is_fifo());
    let dev = libc::makedev(1, 3);
    assert_eq!(
        unsafe { libc::mknod(cstr(&p("null")).as_ptr(), libc::S_IFCHR | 0o666, dev) },
        0
    );
    let md = fs::metadata(p("null")).unwrap();
    assert!(md.file_type().is_char_device());
    assert_eq!(md.rdev(), dev);

    // setgid directories pass their group and bit on.
    fs::create_dir(p("g")).unwrap();
    std::os::unix::fs::chown(p("g"), None, Some(4242)).unwrap();
    fs::set_permissions(p("g"), fs::Permissions::from_mode(0o2775)).unwrap();
    fs::write(p("g/file"), b"").unwrap();
    fs::create_dir(p("g/sub")).unwrap();
    assert_eq!(fs::metadata(p("g/file")).unwrap().gid(), 4242);
    assert_eq!(fs::metadata(p("g/sub")).unwrap().mode() & 0o2000, 0o2000);

    // statfs reports real space.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(cstr(&m.dir).as_ptr(), &mut st) }, 0);
    assert!(st.f_bavail > 0 && st.f_blocks > st.f_bavail);
    assert_eq!(st.f_namemax, 255);
    m.unmount();
}

on_every_layout!(
    sparse_files_fallocate_and_seek,
    sparse_files_fallocate_and_seek_on_one_log,
    sparse_files_fallocate_and_seek_on_dual,
    sparse_files_fallocate_and_seek_on_store
);
fn sparse_files_fallocate_and_seek(layout: Layout) {
    let Some((_t, m)) = setup("sparse", layout) else {
        return;
    };
    let p = |s: &str| m.path(s);
    let f = OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(p("s"))
        .unwrap();
    // A very large sparse file.
    f.set_len(1 << 40).unwrap();
    assert_eq!(f.metadata().unwrap().len(), 1 << 40);
    let mut f = f;
    f.seek(SeekFrom::Start(1 << 30)).unwrap();
    f.write_all(&[7u8; 10000]).unwrap();
    f.sync_all().unwrap();
    let fd = f.as_raw_fd();
    let seek = |off: i64, whence: i32| unsafe { libc::lseek(fd, off, whence) };
    assert_eq!(seek(0, libc::SEEK_DATA), 1 << 30);
    assert_eq!(seek(1 << 30, libc::SEEK_HOLE), (1 << 30) + 12288);
    assert_eq!(seek(0, libc::SEEK_HOLE), 0);
    assert_eq!(seek((1 << 30) + 20000, libc::SEEK_DATA), -1);
    assert_eq!(errno(), libc::ENXIO);
    let mut buf = vec![1u8; 100];
    f.seek(SeekFrom::Start(5000)).unwrap();
    f.read_exact(&mut buf).unwrap();
    assert!(buf.iter().all(|&b| b == 0), "hole reads as zeros");

    // fallocate modes.
    let fa = |mode: i32, off: i64, len: i64| unsafe { libc::fallocate(fd, mode, off, len) };
    f.set_len(0).unwrap();
    assert_eq!(fa(0, 0, 100_000), 0);
    assert_eq!(f.metadata().unwrap().len(), 100_000);
    assert_eq!(fa(libc::FALLOC_FL_KEEP_SIZE, 100_000, 50_000), 0);
    assert_eq!(f.metadata().unwrap().len(), 100_000);
    f.seek(SeekFrom::Start(0)).unwrap();
    f.write_all(&vec![9u8; 100_000]).unwrap();
    assert_eq!(
        fa(
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            10_000,
            20_000
        ),
        0
    );
    let mut all = Vec::new();
    f.seek(SeekFrom::Start(0)).unwrap();
    f.read_to_end(&mut all).unwrap();
    assert_eq!(all.len(), 100_000);
    assert!(all[10_000..30_000].iter().all(|&b| b == 0));
    assert!(all[..10_000].iter().all(|&b| b == 9) && all[30_000..].iter().all(|&b| b == 9));
    assert_eq!(fa(libc::FALLOC_FL_ZERO_RANGE, 90_000, 20_000), 0);
    assert_eq!(f.metadata().unwrap().len(), 110_000);
    assert_eq!(fa(libc::FALLOC_FL_COLLAPSE_RANGE, 0, 4096), -1);
    assert_eq!(errno(), libc::EOPNOTSUPP);
    drop(f);

    // Truncation shrinks and zero-extends.
    fs::write(p("t"), vec![5u8; 9000]).unwrap();
    let f = OpenOptions::new().write(true).open(p("t")).unwrap();
    f.set_len(4500).unwrap();
    f.set_len(9000).unwrap();
    drop(f);
    let d = fs::read(p("t")).unwrap();
    assert!(d[..4500].iter().all(|&b| b == 5) && d[4500..].iter().all(|&b| b == 0));
    m.unmount();
}

on_every_layout!(
    xattrs_and_open_unlinked_files,
    xattrs_and_open_unlinked_files_on_one_log,
    xattrs_and_open_unlinked_files_on_dual,
    xattrs_and_open_unlinked_files_on_store
);
fn xattrs_and_open_unlinked_files(layout: Layout) {
    let Some((_t, m)) = setup("xattr", layout) else {
        return;
    };
    let p = |s: &str| m.path(s);
    fs::write(p("x"), b"").unwrap();
    let set = |name: &str, val: &[u8], flags: i32| unsafe {
        let n = std::ffi::CString::new(name).unwrap();
        libc::setxattr(
            cstr(&p("x")).as_ptr(),
            n.as_ptr(),
            val.as_ptr().cast(),
            val.len(),
            flags,
        )
    };
    let get = |name: &str| -> Result<Vec<u8>, i32> {
        let n = std::ffi::CString::new(name).unwrap();
        let mut buf = vec![0u8; 1024];
        let r = unsafe {
            libc::getxattr(
                cstr(&p("x")).as_ptr(),
                n.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        };
        if r < 0 {
            Err(errno())
        } else {
            buf.truncate(r as usize);
            Ok(buf)
        }
    };
    assert_eq!(set("user.k", b"v1", 0), 0);
    assert_eq!(get("user.k"), Ok(b"v1".to_vec()));
    assert_eq!(set("user.k", b"v2", libc::XATTR_CREATE), -1);
    assert_eq!(errno(), libc::EEXIST);
    assert_eq!(set("user.other", b"v", libc::XATTR_REPLACE), -1);
    assert_eq!(errno(), libc::ENODATA);
    assert_eq!(set("trusted.t", b"t", 0), 0);
    assert_eq!(get("user.missing"), Err(libc::ENODATA));
    let mut names = vec![0u8; 256];
    let n = unsafe {
        libc::listxattr(
            cstr(&p("x")).as_ptr(),
            names.as_mut_ptr().cast(),
            names.len(),
        )
    };
    assert!(n > 0);
    let listed = String::from_utf8_lossy(&names[..n as usize]).to_string();
    assert!(
        listed.contains("user.k") && listed.contains("trusted.t"),
        "{listed}"
    );
    let rm = unsafe {
        libc::removexattr(
            cstr(&p("x")).as_ptr(),
            std::ffi::CString::new("user.k").unwrap().as_ptr(),
        )
    };
    assert_eq!(rm, 0);
    assert_eq!(get("user.k"), Err(libc::ENODATA));

    // An open file survives its unlink until closed; its directory can go.
    fs::create_dir(p("holder")).unwrap();
    let mut f = OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(p("holder/f"))
        .unwrap();
    f.write_all(&vec![3u8; 50_000]).unwrap();
    fs::remove_file(p("holder/f")).unwrap();
    fs::remove_dir(p("holder")).unwrap();
    let mut back = Vec::new();
    f.seek(SeekFrom::Start(0)).unwrap();
    f.read_to_end(&mut back).unwrap();
    assert_eq!(back, vec![3u8; 50_000]);
    drop(f);
    m.unmount();
}

on_every_layout!(
    big_directory_readdir_and_remount,
    big_directory_readdir_and_remount_on_one_log,
    big_directory_readdir_and_remount_on_dual,
    big_directory_readdir_and_remount_on_store
);
fn big_directory_readdir_and_remount(layout: Layout) {
    let Some((t, m)) = setup("dir", layout) else {
        return;
    };
    let p = |s: &str| m.path(s);
    fs::create_dir(p("many")).unwrap();
    for i in 0..3000 {
        File::create(p(&format!("many/file-{i:05}"))).unwrap();
    }
    let mut names: Vec<String> = fs::read_dir(p("many"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names.len(), 3000);
    assert_eq!(names[0], "file-00000");
    // readdir while the directory changes: every entry present throughout
    // is returned exactly once.
    let dir = fs::read_dir(p("many")).unwrap();
    let mut seen = std::collections::HashSet::new();
    for (k, e) in dir.enumerate() {
        if k == 100 {
            for i in 0..50 {
                File::create(p(&format!("many/new-{i}"))).unwrap();
            }
        }
        let n = e.unwrap().file_name().into_string().unwrap();
        assert!(seen.insert(n.clone()), "{n} returned twice");
    }
    assert!((0..3000).all(|i| seen.contains(&format!("file-{i:05}"))));
    fs::write(p("keep"), b"persistent").unwrap();
    m.unmount();
    let m = t.mount(&[]);
    assert_eq!(fs::read(m.path("keep")).unwrap(), b"persistent");
    assert_eq!(fs::read_dir(m.path("many")).unwrap().count(), 3050);
    m.unmount();
    // Read-only mounts refuse changes with EROFS.
    let m = t.mount_ro();
    assert_eq!(fs::read(m.path("keep")).unwrap(), b"persistent");
    assert_eq!(err_of(fs::write(m.path("new"), b"x")), libc::EROFS);
    m.unmount();
}

#[test]
fn mount_refuses_bad_input_clearly_and_works_as_a_mount_helper() {
    if !fuse_usable() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let img = t.path().join("ok.img");
    mkfs(&img, "128M");
    let mnt = t.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    let fail = |args: &[&std::ffi::OsStr], expect: &str| {
        let out = common::ldfs().arg("mount").args(args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(err.contains(expect), "{args:?}: {err:?} lacks {expect:?}");
    };
    let missing = t.path().join("missing.img");
    fail(&[missing.as_os_str(), mnt.as_os_str()], "No such file");
    let junk = t.path().join("junk.img");
    fs::write(&junk, vec![0x5au8; 8 << 20]).unwrap();
    fail(&[junk.as_os_str(), mnt.as_os_str()], "corrupt");
    let nodir = t.path().join("nodir");
    fail(&[img.as_os_str(), nodir.as_os_str()], "mount point");
    fail(
        &[
            "-o".as_ref(),
            "bogus".as_ref(),
            img.as_os_str(),
            mnt.as_os_str(),
        ],
        "unknown mount option",
    );
    let m = Mount::new(&img, &mnt, &[]);
    // The daemon answers `ldfs stats` and `ldfs checkpoint` on its mount.
    let out = common::ldfs().arg("stats").arg(&mnt).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success() && text.contains("segments:"), "{text}");
    assert!(common::ldfs()
        .arg("checkpoint")
        .arg(&mnt)
        .status()
        .unwrap()
        .success());
    let out = common::ldfs().arg("stats").arg(t.path()).output().unwrap();
    assert!(
        !out.status.success(),
        "stats of a directory that is not ldfs"
    );
    let other = t.path().join("other.img");
    mkfs(&other, "128M");
    fail(&[other.as_os_str(), mnt.as_os_str()], "busy");
    m.unmount();

    // mount(8) runs /sbin/mount.fuse.ldfs IMAGE DIR -o OPTIONS.
    let helper = t.path().join("mount.fuse.ldfs");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_ldfs"), &helper).unwrap();
    let st = std::process::Command::new(&helper)
        .arg(&img)
        .arg(&mnt)
        .args(["-o", "rw,noatime,nodev,commit=2,cache=16M"])
        .status()
        .unwrap();
    assert!(st.success());
    fs::write(mnt.join("via-helper"), b"yes").unwrap();
    let t0 = std::time::Instant::now();
    while !std::process::Command::new("fusermount3")
        .arg("-u")
        .arg(&mnt)
        .status()
        .unwrap()
        .success()
    {
        assert!(t0.elapsed().as_secs() < 5, "fusermount3 -u kept failing");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    // The mount waits for the daemon to finish its final checkpoint.
    let m = Mount::new(&img, &mnt, &[]);
    assert_eq!(fs::read(m.path("via-helper")).unwrap(), b"yes");
    m.unmount();
}

#[test]
fn full_device_corrupt_block_and_sigterm() {
    if !fuse_usable() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let img = t.path().join("full.img");
    mkfs(&img, "64M");
    let mnt = t.path().join("mnt");
    let m = Mount::new(&img, &mnt, &[]);
    // Fill: every file whose fsync succeeded must survive.
    let mut kept = 0;
    let chunk: Vec<u8> = (0..1 << 20).map(|k| (k * 31 % 251) as u8).collect();
    loop {
        let r = (|| -> std::io::Result<()> {
            let mut f = File::create(m.path(&format!("fill{kept}")))?;
            f.write_all(&chunk)?;
            f.sync_all()
        })();
        match r {
            Ok(()) => kept += 1,
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
                break;
            }
        }
        assert!(kept < 200, "a 64 MiB image never filled");
    }
    assert!(kept > 20, "only {kept} MiB fit");
    // Deleting frees nothing until the cleaner runs, but must work when full.
    fs::remove_file(m.path("fill0")).unwrap();
    fs::write(m.path("marker"), b"distinctive-marker-0123456789-abcdefghijklmnopqrstuvwxyz-0123456789-ABCDEFGHIJKLMNOPQRSTUVWXYZ-0123456789-marker-end-of-the-block").ok();
    m.unmount();
    let m = Mount::new(&img, &mnt, &[]);
    for i in 1..kept {
        assert!(
            fs::read(m.path(&format!("fill{i}"))).unwrap() == chunk,
            "fill{i} damaged"
        );
    }
    m.unmount();

    // A corrupt block fails only its reads, with EIO.
    let img2 = t.path().join("eio.img");
    mkfs(&img2, "128M");
    let m = Mount::new(&img2, &mnt, &[]);
    let victim: Vec<u8> = (0..20_000u32)
        .map(|k| (k.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    fs::write(m.path("victim"), &victim).unwrap();
    fs::write(m.path("bystander"), vec![1u8; 20_000]).unwrap();
    m.unmount();
    let mut raw = fs::read(&img2).unwrap();
    let at = raw
        .windows(64)
        .position(|w| w == &victim[8192..8192 + 64])
        .expect("victim's data on the image");
    raw[at + 10] ^= 0xff;
    fs::write(&img2, &raw).unwrap();
    let m = Mount::new(&img2, &mnt, &[]);
    let err = fs::read(m.path("victim")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    assert_eq!(fs::read(m.path("bystander")).unwrap(), vec![1u8; 20_000]);
    // SIGTERM unmounts cleanly, with the final checkpoint.
    fs::write(m.path("late"), b"written just before SIGTERM").unwrap();
    let st = m.signal(libc::SIGTERM);
    assert!(st.success(), "daemon exited with {st} on SIGTERM");
    let m = Mount::new(&img2, &mnt, &[]);
    assert_eq!(
        fs::read(m.path("late")).unwrap(),
        b"written just before SIGTERM"
    );
    m.unmount();
}

#[test]
fn deleted_inodes_are_reclaimed() {
    let Some((_t, m)) = setup("reclaim", Layout::OneLog) else {
        return;
    };
    // Files with blocks (destroyed at their FORGET) and small ones living
    // in their inodes (destroyed in batches, the last at unmount).
    for i in 0..200 {
        fs::write(m.path(&format!("f{i}")), vec![i as u8; 5000]).unwrap();
        fs::write(m.path(&format!("s{i}")), vec![i as u8; 100]).unwrap();
    }
    fs::create_dir(m.path("d")).unwrap();
    let held = File::open(m.path("f7")).unwrap();
    let held_small = File::open(m.path("s7")).unwrap();
    for i in 0..200 {
        fs::remove_file(m.path(&format!("f{i}"))).unwrap();
        fs::remove_file(m.path(&format!("s{i}"))).unwrap();
    }
    fs::remove_dir(m.path("d")).unwrap();
    let mut back = Vec::new();
    (&held).read_to_end(&mut back).unwrap();
    assert_eq!(back, vec![7u8; 5000], "open unlinked file unreadable");
    let mut back = Vec::new();
    (&held_small).read_to_end(&mut back).unwrap();
    assert_eq!(back, vec![7u8; 100], "open unlinked small file unreadable");
    drop(held);
    drop(held_small);
    let img = m.img.clone();
    m.unmount();
    // Read-only: this open reclaims no orphans, so what is left is what the
    // mount itself left behind (it reclaims on the kernel's FORGETs).
    let dev: std::sync::Arc<dyn ldfs::device::Device> = std::sync::Arc::new(
        ldfs::device::FileDevice::open(&img, ldfs::device::FileDeviceOptions::default()).unwrap(),
    );
    let ro = ldfs::lld::LldOptions {
        read_only: true,
        ..Default::default()
    };
    let lld = std::sync::Arc::new(ldfs::lld::Lld::open(dev, ro).unwrap());
    let ld: std::sync::Arc<dyn ldfs::ld::LogicalDisk> = lld.clone();
    let opts = ldfs::fs::FsOptions {
        read_only: true,
        ..Default::default()
    };
    let fs = ldfs::fs::Fs::mount(ld, opts).unwrap();
    let report = fs.check().unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    assert_eq!(report.inodes, 1, "inodes left behind by the mount");
}

/// ldfs owns privilege killing (FUSE_HANDLE_KILLPRIV_V2, which spares the
/// kernel a security.capability lookup before every write): a write or a
/// truncation by a user without CAP_FSETID clears set-user-ID and
/// set-group-ID (the latter only when group-executable or the writer is
/// not in the file's group); root keeps them;
/// any write drops a file capability.
#[test]
fn writes_and_truncation_clear_set_id_bits_and_capabilities() {
    use std::os::unix::process::CommandExt;
    if !fuse_usable() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    fs::set_permissions(t.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let img = t.path().join("k.img");
    mkfs(&img, "64M");
    let m = Mount::new(&img, &t.path().join("mnt"), &["allow_other"]);
    fs::set_permissions(&m.dir, fs::Permissions::from_mode(0o777)).unwrap();
    let as_nobody = |script: &str| {
        let st = std::process::Command::new("sh")
            .arg("-c")
            .arg(script)
            .current_dir(&m.dir)
            .uid(65534)
            .gid(65534)
            .status()
            .unwrap();
        assert!(st.success(), "as nobody: {script}");
    };
    // The kernel caches attributes for a second (TTL): wait it out.
    let mode_after = |name: &str| {
        std::thread::sleep(std::time::Duration::from_millis(1100));
        fs::metadata(m.path(name)).unwrap().mode() & 0o7777
    };
    fs::write(m.path("w"), b"data").unwrap();
    fs::set_permissions(m.path("w"), fs::Permissions::from_mode(0o6777)).unwrap();
    as_nobody("printf more >> w");
    assert_eq!(mode_after("w"), 0o0777, "write by nobody");
    // Set-group-ID without group execute stays for a writer in the file's
    // group only (the kernel's setattr_should_drop_sgid, as on ext4).
    fs::set_permissions(m.path("w"), fs::Permissions::from_mode(0o6767)).unwrap();
    as_nobody("printf more >> w");
    assert_eq!(
        mode_after("w"),
        0o0767,
        "sgid, no group exec, writer not in the group"
    );
    std::os::unix::fs::chown(m.path("w"), None, Some(65534)).unwrap();
    fs::set_permissions(m.path("w"), fs::Permissions::from_mode(0o6767)).unwrap();
    as_nobody("printf more >> w");
    assert_eq!(
        mode_after("w"),
        0o2767,
        "sgid, no group exec, writer in the group"
    );
    fs::set_permissions(m.path("w"), fs::Permissions::from_mode(0o6777)).unwrap();
    as_nobody("truncate -s 1 w");
    assert_eq!(mode_after("w"), 0o0777, "truncate by nobody");
    // Root (CAP_FSETID) keeps them.
    fs::set_permissions(m.path("w"), fs::Permissions::from_mode(0o6777)).unwrap();
    OpenOptions::new()
        .append(true)
        .open(m.path("w"))
        .unwrap()
        .write_all(b"root")
        .unwrap();
    assert_eq!(mode_after("w"), 0o6777, "write by root");
    // A file capability (v2: magic, then permitted/inheritable pairs) goes
    // with any write.
    let mut caps = Vec::new();
    caps.extend_from_slice(&0x0200_0000u32.to_le_bytes());
    caps.extend_from_slice(&[0u8; 16]);
    caps[4] = 1 << 2; // CAP_DAC_READ_SEARCH, permitted
    let name = std::ffi::CString::new("security.capability").unwrap();
    let path = cstr(&m.path("w"));
    let r = unsafe {
        libc::setxattr(
            path.as_ptr(),
            name.as_ptr(),
            caps.as_ptr().cast(),
            caps.len(),
            0,
        )
    };
    assert_eq!(r, 0, "setxattr security.capability: errno {}", errno());
    let has_caps = || {
        let mut buf = [0u8; 64];
        unsafe {
            libc::getxattr(
                path.as_ptr(),
                name.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            ) > 0
        }
    };
    assert!(has_caps());
    OpenOptions::new()
        .append(true)
        .open(m.path("w"))
        .unwrap()
        .write_all(b"again")
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1100));
    assert!(!has_caps(), "a write kept the file capability");
    assert_eq!(fs::read(m.path("w")).unwrap(), b"drootagain");
    m.unmount();
}
