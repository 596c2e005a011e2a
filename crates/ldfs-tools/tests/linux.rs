//! The conventions Linux tools rely on (issue 13), each through a real
//! mount: the mount's type and remounts, what st_blocks counts, and the
//! other places where ldfs must behave as a kernel file system does.

mod common;

use std::fs;
use std::path::Path;
use std::sync::Arc;

use common::{fuse_usable, mkfs, Mount, Succeeds};

fn err_of<T: std::fmt::Debug>(r: std::io::Result<T>) -> i32 {
    r.expect_err("expected an error").raw_os_error().unwrap()
}

/// The type and options of the mount at `dir`, from /proc/self/mounts.
fn mount_entry(dir: &Path) -> (String, String) {
    let canon = dir.canonicalize().unwrap();
    fs::read_to_string("/proc/self/mounts")
        .unwrap()
        .lines()
        .rev()
        .find_map(|l| {
            let w: Vec<&str> = l.split(' ').collect();
            (w[1] == canon.to_str().unwrap()).then(|| (w[2].to_string(), w[3].to_string()))
        })
        .expect("mounted")
}

/// Runs the mount helper as mount(8) does (`mount.fuse.ldfs IMAGE DIR -o
/// OPTIONS`, found by its name).
fn helper(t: &Path, img: &Path, dir: &Path, opts: &str) -> std::process::Output {
    let h = t.join("mount.fuse.ldfs");
    if !h.exists() {
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_ldfs"), &h).unwrap();
    }
    std::process::Command::new(&h)
        .arg(img)
        .arg(dir)
        .args(["-o", opts])
        .output()
        .unwrap()
}

/// Whether opening the image had to roll the log forward (nothing after a
/// checkpoint that holds everything).
fn rolled_forward(img: &Path) -> u64 {
    let dev: Arc<dyn ldfs::device::Device> =
        Arc::new(ldfs::device::FileDevice::open_read_only(img).unwrap());
    let lld = ldfs::lld::Lld::open(
        dev,
        ldfs::lld::LldOptions {
            read_only: true,
            ..Default::default()
        },
    )
    .unwrap();
    lld.open_report().rolled_forward
}

/// The type is `fuse.ldfs` (mount(8) then runs mount.fuse.ldfs, not the
/// generic fuse helper, for a remount); `remount,ro` refuses changes with
/// EROFS and checkpoints at the switch (the image needs no roll-forward if
/// the daemon dies right after), `remount,rw` makes it writable again.
#[test]
fn type_is_fuse_ldfs_and_remounts_switch_ro_and_rw() {
    if !fuse_usable() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let img = t.path().join("r.img");
    mkfs(&img, "64M");
    let mnt = t.path().join("mnt");
    let m = Mount::new(&img, &mnt, &[]);
    assert_eq!(mount_entry(&mnt).0, "fuse.ldfs");
    // What mount(8) passes for `mount -o remount,ro DIR`.
    let from_table = "nosuid,nodev,relatime,remount,user_id=0,group_id=0,default_permissions";
    fs::write(m.path("a"), b"before").unwrap();
    let out = helper(t.path(), &img, &mnt, &format!("ro,{from_table}"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (_, opts) = mount_entry(&mnt);
    assert!(opts.starts_with("ro,") && opts.contains("nosuid"), "{opts}");
    assert_eq!(err_of(fs::write(m.path("b"), b"x")), libc::EROFS);
    assert_eq!(err_of(fs::remove_file(m.path("a"))), libc::EROFS);
    assert_eq!(fs::read(m.path("a")).unwrap(), b"before");
    let out = helper(t.path(), &img, &mnt, &format!("rw,{from_table}"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(mount_entry(&mnt).1.starts_with("rw,"));
    fs::write(m.path("b"), b"after").unwrap();
    // The switch to read-only writes a checkpoint: killed right after, the
    // image opens without rolling anything forward.
    common::ldfs()
        .args(["mount", "-o", "remount,ro"])
        .arg(&img)
        .arg(&mnt)
        .succeeds();
    m.kill();
    assert_eq!(rolled_forward(&img), 0, "no checkpoint at the remount");
    let m = Mount::new(&img, &mnt, &["ro"]);
    assert_eq!(fs::read(m.path("b")).unwrap(), b"after");
    // Opened read-only, the image cannot turn writable: the remount says
    // so and the mount stays read-only.
    let out = helper(t.path(), &img, &mnt, "remount,rw");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("refused"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(mount_entry(&mnt).1.starts_with("ro,"));
    assert_eq!(err_of(fs::write(m.path("c"), b"x")), libc::EROFS);
    m.unmount();
}

/// st_blocks counts what a file holds (4 KiB per stored block), not its
/// size: `du` of a 1 GiB sparse file holding 4 KiB says 4 KiB.
#[test]
fn st_blocks_counts_stored_blocks_not_the_size() {
    use std::os::unix::fs::{FileExt, MetadataExt};
    if !fuse_usable() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let img = t.path().join("b.img");
    mkfs(&img, "64M");
    let m = Mount::new(&img, &t.path().join("mnt"), &[]);
    let f = fs::File::create(m.path("sparse")).unwrap();
    f.set_len(1 << 30).unwrap();
    f.write_all_at(&[7u8; 4096], 512 << 20).unwrap();
    let blocks = || fs::metadata(m.path("sparse")).unwrap().blocks();
    assert_eq!(blocks(), 8, "1 GiB sparse file holding 4 KiB");
    let du = std::process::Command::new("du")
        .arg("-k")
        .arg(m.path("sparse"))
        .succeeds();
    assert!(
        String::from_utf8_lossy(&du.stdout).starts_with("4\t"),
        "du: {}",
        String::from_utf8_lossy(&du.stdout)
    );
    f.write_all_at(&[1u8; 3 * 4096], 0).unwrap();
    assert_eq!(blocks(), 32);
    // A punched hole holds nothing again.
    let r = unsafe {
        libc::fallocate(
            std::os::unix::io::AsRawFd::as_raw_fd(&f),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            0,
            8192,
        )
    };
    assert_eq!(r, 0);
    assert_eq!(blocks(), 16);
    assert_eq!(fs::metadata(m.path("sparse")).unwrap().len(), 1 << 30);
    drop(f);
    m.unmount();
}

/// A file handle (name_to_handle_at) as the kernel encodes it, in a
/// buffer with room for any FUSE handle.
#[repr(C)]
struct Handle {
    bytes: u32,
    kind: i32,
    data: [u8; 64],
}

fn handle_of(path: &Path) -> Handle {
    let mut h = Handle {
        bytes: 64,
        kind: 0,
        data: [0; 64],
    };
    let mut mount_id = 0;
    let c = common::cstr(path);
    let r = unsafe {
        libc::name_to_handle_at(
            libc::AT_FDCWD,
            c.as_ptr(),
            (&mut h as *mut Handle).cast(),
            &mut mount_id,
            0,
        )
    };
    assert_eq!(
        r,
        0,
        "name_to_handle_at {}: errno {}",
        path.display(),
        common::errno()
    );
    h
}

/// open_by_handle_at on the mount at `dir`: the open file, or the errno.
fn open_handle(dir: &Path, h: &mut Handle) -> Result<fs::File, i32> {
    use std::os::unix::io::{AsRawFd, FromRawFd};
    let mnt = fs::File::open(dir).unwrap();
    let fd = unsafe {
        libc::open_by_handle_at(mnt.as_raw_fd(), (h as *mut Handle).cast(), libc::O_RDONLY)
    };
    if fd < 0 {
        return Err(common::errno());
    }
    Ok(unsafe { fs::File::from_raw_fd(fd) })
}

/// File handles outlive the kernel's inode cache (FUSE export support):
/// after a remount, which empties it, open_by_handle_at finds linked
/// files and directories again; a deleted file's handle is stale (ldfs
/// no longer has the inode; a kernel that still caches it may open it,
/// as ext4 opens an unlinked file that is still open).
#[test]
fn file_handles_survive_remounts_and_go_stale_when_deleted() {
    use std::io::Read;
    if !fuse_usable() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let img = t.path().join("h.img");
    mkfs(&img, "64M");
    let mnt = t.path().join("mnt");
    let m = Mount::new(&img, &mnt, &[]);
    fs::create_dir(m.path("d")).unwrap();
    fs::write(m.path("d/f"), b"by handle").unwrap();
    fs::write(m.path("gone"), b"x").unwrap();
    let mut hf = handle_of(&m.path("d/f"));
    let mut hd = handle_of(&m.path("d"));
    let mut hg = handle_of(&m.path("gone"));
    m.unmount();
    let m = Mount::new(&img, &mnt, &[]);
    let mut text = String::new();
    open_handle(&mnt, &mut hf)
        .expect("a linked file by its handle after a remount")
        .read_to_string(&mut text)
        .unwrap();
    assert_eq!(text, "by handle");
    let d = open_handle(&mnt, &mut hd).expect("a directory by its handle");
    assert!(d.metadata().unwrap().is_dir());
    fs::remove_file(m.path("gone")).unwrap();
    drop(d);
    // Remounted, so the kernel's inode cache cannot still hold it: ldfs
    // answers for the deleted inode.
    m.unmount();
    let m = Mount::new(&img, &mnt, &[]);
    assert_eq!(open_handle(&mnt, &mut hg).unwrap_err(), libc::ESTALE);
    m.unmount();
}

/// On a read-only mount, errors come in the kernel's order: an existing
/// name is EEXIST, as on ext4, before the mount is EROFS.
#[test]
fn read_only_mounts_say_eexist_before_erofs() {
    use std::os::unix::fs::OpenOptionsExt;
    if !fuse_usable() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let img = t.path().join("e.img");
    mkfs(&img, "64M");
    let mnt = t.path().join("mnt");
    let m = Mount::new(&img, &mnt, &[]);
    fs::create_dir(m.path("d")).unwrap();
    fs::write(m.path("f"), b"x").unwrap();
    m.unmount();
    let m = Mount::new(&img, &mnt, &["ro"]);
    assert_eq!(err_of(fs::create_dir(m.path("d"))), libc::EEXIST);
    assert_eq!(err_of(fs::create_dir(m.path("f"))), libc::EEXIST);
    let excl = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(m.path("f"));
    assert_eq!(err_of(excl), libc::EEXIST);
    assert_eq!(
        err_of(std::os::unix::fs::symlink("x", m.path("f"))),
        libc::EEXIST
    );
    assert_eq!(
        err_of(fs::hard_link(m.path("f"), m.path("d"))),
        libc::EEXIST
    );
    assert_eq!(err_of(fs::create_dir(m.path("new"))), libc::EROFS);
    assert_eq!(err_of(fs::write(m.path("f"), b"y")), libc::EROFS);
    m.unmount();
}

/// Mounting an image that is already mounted gives the same tree at the
/// second mount point (as a kernel file system's second mount shares its
/// superblock), read-only there if asked; unmounting it leaves the first.
/// The daemon's end (SIGTERM) unmounts both.
#[test]
fn a_second_mount_of_a_mounted_image_shows_the_same_tree() {
    if !fuse_usable() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let img = t.path().join("s.img");
    mkfs(&img, "64M");
    let (mnt, mnt2, mnt3) = (
        t.path().join("mnt"),
        t.path().join("mnt2"),
        t.path().join("mnt3"),
    );
    let m = Mount::new(&img, &mnt, &[]);
    fs::write(m.path("one"), b"1").unwrap();
    for d in [&mnt2, &mnt3] {
        fs::create_dir(d).unwrap();
    }
    common::ldfs().arg("mount").arg(&img).arg(&mnt2).succeeds();
    assert_eq!(fs::read(mnt2.join("one")).unwrap(), b"1");
    fs::write(mnt2.join("two"), b"2").unwrap();
    assert_eq!(fs::read(m.path("two")).unwrap(), b"2");
    let out = helper(t.path(), &img, &mnt3, "ro");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(fs::read(mnt3.join("two")).unwrap(), b"2");
    assert_eq!(err_of(fs::write(mnt3.join("three"), b"3")), libc::EROFS);
    let st = std::process::Command::new("umount")
        .arg(&mnt2)
        .status()
        .unwrap();
    assert!(st.success());
    assert_eq!(fs::read(m.path("one")).unwrap(), b"1");
    // SIGTERM ends the daemon, with every mount of its file system.
    let st = m.signal(libc::SIGTERM);
    assert!(st.success(), "{st}");
    assert!(
        !common::is_mounted(&mnt3),
        "the bind mount outlived the daemon"
    );
}

/// Device nodes work where the mount allows them: root mounting through
/// mount(8) (the helper) gets `dev`, as for kernel file systems; `nodev`
/// and a plain `ldfs mount` (FUSE's default) refuse to open them.
#[test]
fn device_nodes_open_on_dev_mounts_only() {
    use std::io::{Read, Write};
    if !fuse_usable() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let img = t.path().join("n.img");
    mkfs(&img, "64M");
    let mnt = t.path().join("mnt");
    let m = Mount::new(&img, &mnt, &[]);
    let null = common::cstr(&m.path("null"));
    let r = unsafe { libc::mknod(null.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, 3)) };
    assert_eq!(r, 0, "mknod: errno {}", common::errno());
    assert_eq!(err_of(fs::File::open(m.path("null"))), libc::EACCES);
    m.unmount();
    let umount = || {
        let st = std::process::Command::new("umount")
            .arg(&mnt)
            .status()
            .unwrap();
        assert!(st.success());
    };
    let out = helper(t.path(), &img, &mnt, "rw");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !mount_entry(&mnt).1.contains("nodev"),
        "{:?}",
        mount_entry(&mnt)
    );
    let mut f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(mnt.join("null"))
        .expect("a device node on a dev mount");
    f.write_all(b"into the void").unwrap();
    let mut buf = Vec::new();
    assert_eq!(f.read_to_end(&mut buf).unwrap(), 0);
    drop(f);
    umount();
    let out = helper(t.path(), &img, &mnt, "rw,nodev");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(err_of(fs::File::open(mnt.join("null"))), libc::EACCES);
    umount();
}

/// Timestamps never run backwards between operations: with the writeback
/// cache the kernel stamps mtime at write and ctime at rename itself, with
/// its coarse clock; ldfs stamps with the same clock, so a file changed
/// after another was created never shows an earlier time.
#[test]
fn timestamps_never_run_backwards_between_operations() {
    use std::os::unix::fs::MetadataExt;
    if !fuse_usable() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let img = t.path().join("t.img");
    mkfs(&img, "64M");
    let m = Mount::new(&img, &t.path().join("mnt"), &["writeback_cache"]);
    let ns = |md: &fs::Metadata, c: bool| {
        if c {
            md.ctime() as i128 * 1_000_000_000 + md.ctime_nsec() as i128
        } else {
            md.mtime() as i128 * 1_000_000_000 + md.mtime_nsec() as i128
        }
    };
    let mut back = Vec::new();
    for i in 0..200 {
        let (a, b) = (m.path(&format!("a{i}")), m.path(&format!("b{i}")));
        fs::write(&a, b"").unwrap();
        let created = ns(&fs::metadata(&a).unwrap(), false);
        fs::write(&b, b"x").unwrap();
        let written = ns(&fs::metadata(&b).unwrap(), false);
        let c = m.path(&format!("c{i}"));
        fs::rename(&b, &c).unwrap();
        let renamed = ns(&fs::metadata(&c).unwrap(), true);
        if written < created || renamed < created {
            back.push((i, created, written, renamed));
        }
    }
    assert!(
        back.is_empty(),
        "times before an earlier creation: {back:?}"
    );
    m.unmount();
}

/// Sets atime and mtime of `p` (seconds since the epoch).
fn set_times(p: &Path, atime: i64, mtime: i64) {
    let ts = [
        libc::timespec {
            tv_sec: atime,
            tv_nsec: 0,
        },
        libc::timespec {
            tv_sec: mtime,
            tv_nsec: 0,
        },
    ];
    let c = common::cstr(p);
    assert_eq!(
        unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), ts.as_ptr(), 0) },
        0
    );
}

/// Reads `p` so that the read reaches ldfs (the page cache is dropped
/// first: a read it serves never reaches a FUSE daemon).
fn read_through(p: &Path) {
    use std::io::Read;
    use std::os::unix::io::AsRawFd;
    let mut f = fs::File::open(p).unwrap();
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    let mut buf = Vec::new();
    f.read_to_end(&mut buf).unwrap();
}

/// atime as Linux keeps it, for every read that reaches ldfs: relatime by
/// default (updated when not after mtime/ctime, or a day old), noatime,
/// strictatime (every read), nodiratime (listing a directory does not).
#[test]
fn atime_follows_the_mount_mode() {
    use std::os::unix::fs::MetadataExt;
    if !fuse_usable() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let img = t.path().join("a.img");
    mkfs(&img, "64M");
    let mnt = t.path().join("mnt");
    let atime = |p: &Path| {
        let md = fs::metadata(p).unwrap();
        (md.atime(), md.atime_nsec())
    };
    let day_ago = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
        - 2 * 86400;
    let m = Mount::new(&img, &mnt, &[]);
    let f = m.path("f");
    fs::write(&f, vec![1u8; 10000]).unwrap();
    fs::create_dir(m.path("d")).unwrap();
    // Relatime: an atime older than mtime is updated by a read, then left.
    set_times(&f, day_ago, day_ago + 10);
    // Past the clock tick of that change (ctime): an atime equal to ctime
    // is updated again, as by the kernel.
    std::thread::sleep(std::time::Duration::from_millis(20));
    read_through(&f);
    let first = atime(&f);
    assert!(first.0 > day_ago + 86400, "relatime: no update {first:?}");
    std::thread::sleep(std::time::Duration::from_millis(20));
    read_through(&f);
    assert_eq!(atime(&f), first, "relatime: updated again");
    set_times(&m.path("d"), day_ago, day_ago);
    fs::read_dir(m.path("d")).unwrap().for_each(drop);
    let dir_read = atime(&m.path("d"));
    assert!(dir_read.0 > day_ago + 86400, "readdir: no update");
    m.unmount();
    // Kept in memory while mounted (no write per read), written by the
    // unmount: the next mount has them.
    let m = Mount::new(&img, &mnt, &["noatime"]);
    assert_eq!(atime(&f), first, "the file's atime after a remount");
    assert_eq!(
        atime(&m.path("d")),
        dir_read,
        "the directory's after a remount"
    );
    m.unmount();

    let m = Mount::new(&img, &mnt, &["noatime"]);
    set_times(&f, day_ago, day_ago + 10);
    read_through(&f);
    assert_eq!(atime(&f).0, day_ago, "noatime: updated");
    m.unmount();

    let m = Mount::new(&img, &mnt, &["strictatime,nodiratime"]);
    read_through(&f);
    let a1 = atime(&f);
    std::thread::sleep(std::time::Duration::from_millis(20));
    read_through(&f);
    let a2 = atime(&f);
    assert!(
        a1.0 > day_ago + 86400 && a2 > a1,
        "strictatime: {a1:?} {a2:?}"
    );
    set_times(&m.path("d"), day_ago, day_ago);
    fs::read_dir(m.path("d")).unwrap().for_each(drop);
    assert_eq!(atime(&m.path("d")).0, day_ago, "nodiratime: updated");
    m.unmount();
}

/// chown(2) with owner and group both -1 (the kernel sends ldfs only a
/// ctime): as on ext4, ctime changes and a file loses set-user-ID and
/// group-executable set-group-ID; a directory keeps its bits.
#[test]
fn chown_minus_one_changes_ctime_and_clears_set_id_bits_as_linux() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    if !fuse_usable() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let img = t.path().join("c.img");
    mkfs(&img, "64M");
    let m = Mount::new(&img, &t.path().join("mnt"), &[]);
    fs::write(m.path("f"), b"x").unwrap();
    fs::create_dir(m.path("d")).unwrap();
    let chown_keep = |p: &Path| {
        let c = common::cstr(p);
        assert_eq!(unsafe { libc::chown(c.as_ptr(), u32::MAX, u32::MAX) }, 0);
    };
    for (name, mode, after) in [
        ("f", 0o6755, 0o0755),
        ("f", 0o6745, 0o2745),
        ("d", 0o3755, 0o3755),
    ] {
        let p = m.path(name);
        fs::set_permissions(&p, fs::Permissions::from_mode(mode)).unwrap();
        let before = fs::metadata(&p).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(30));
        chown_keep(&p);
        let md = fs::metadata(&p).unwrap();
        assert_eq!(md.mode() & 0o7777, after, "{name} {mode:o}");
        assert!(
            (md.ctime(), md.ctime_nsec()) > (before.ctime(), before.ctime_nsec()),
            "{name}: ctime unchanged"
        );
    }
    m.unmount();
}

/// setxattr(2) of `name` on `p`: Ok, or the errno.
fn set_xattr(p: &Path, name: &str, value: &[u8], flags: i32) -> Result<(), i32> {
    let (c, n) = (common::cstr(p), std::ffi::CString::new(name).unwrap());
    let r = unsafe {
        libc::setxattr(
            c.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            flags,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(common::errno())
    }
}

/// getxattr(2) of `name` on `p` (asking for its size first): the value,
/// or the errno.
fn get_xattr(p: &Path, name: &str) -> Result<Vec<u8>, i32> {
    let (c, n) = (common::cstr(p), std::ffi::CString::new(name).unwrap());
    let size = unsafe { libc::getxattr(c.as_ptr(), n.as_ptr(), std::ptr::null_mut(), 0) };
    if size < 0 {
        return Err(common::errno());
    }
    let mut buf = vec![0u8; size as usize];
    let got = unsafe { libc::getxattr(c.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if got < 0 {
        return Err(common::errno());
    }
    buf.truncate(got as usize);
    Ok(buf)
}

/// listxattr(2) of `p`: the names.
fn list_xattrs(p: &Path) -> Vec<String> {
    let c = common::cstr(p);
    let mut buf = vec![0u8; 1 << 16];
    let n = unsafe { libc::listxattr(c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    assert!(n >= 0, "listxattr: errno {}", common::errno());
    buf[..n as usize]
        .split(|&b| b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8(s.to_vec()).unwrap())
        .collect()
}

/// Extended attribute values up to XATTR_SIZE_MAX (65536 bytes) through
/// the mount: set, read back, listed, replaced, removed, still there after
/// a remount; one byte more is E2BIG, as on every Linux file system.
#[test]
fn xattr_values_up_to_64_kib() {
    if !fuse_usable() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let img = t.path().join("x.img");
    mkfs(&img, "64M");
    let mnt = t.path().join("mnt");
    let m = Mount::new(&img, &mnt, &[]);
    let f = m.path("f");
    fs::write(&f, b"x").unwrap();
    let value =
        |len: usize, seed: u8| -> Vec<u8> { (0..len).map(|k| (k % 253) as u8 ^ seed).collect() };
    set_xattr(&f, "user.max", &value(65536, 1), libc::XATTR_CREATE).expect("a 64 KiB value");
    set_xattr(&f, "user.mid", &value(40_000, 2), 0).expect("a 40000-byte value");
    assert_eq!(get_xattr(&f, "user.max").unwrap(), value(65536, 1));
    assert_eq!(get_xattr(&f, "user.mid").unwrap(), value(40_000, 2));
    assert_eq!(
        set_xattr(&f, "user.over", &value(65537, 3), 0),
        Err(libc::E2BIG)
    );
    set_xattr(&f, "user.mid", &value(65000, 4), libc::XATTR_REPLACE).unwrap();
    assert_eq!(get_xattr(&f, "user.mid").unwrap(), value(65000, 4));
    let mut names = list_xattrs(&f);
    names.sort();
    assert_eq!(names, ["user.max", "user.mid"]);
    // The setfattr/getfattr tools agree (hex, as getfattr -e hex prints).
    let out = std::process::Command::new("getfattr")
        .args(["--only-values", "-n", "user.max"])
        .arg(&f)
        .output();
    if let Ok(out) = out {
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(out.stdout, value(65536, 1));
    }
    m.unmount();
    let m = Mount::new(&img, &mnt, &[]);
    assert_eq!(get_xattr(&f, "user.max").unwrap(), value(65536, 1));
    assert_eq!(get_xattr(&f, "user.mid").unwrap(), value(65000, 4));
    let c = common::cstr(&f);
    let n = std::ffi::CString::new("user.max").unwrap();
    assert_eq!(unsafe { libc::removexattr(c.as_ptr(), n.as_ptr()) }, 0);
    assert_eq!(get_xattr(&f, "user.max"), Err(libc::ENODATA));
    assert_eq!(list_xattrs(&f), ["user.mid"]);
    m.unmount();
}

/// Whether `tool` runs here; if not, says so loudly (the comparisons
/// below need it).
fn have(tool: &str) -> bool {
    let ok = std::process::Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        eprintln!("\n*** SKIPPING: {tool} is not installed (apt-get install acl) ***\n");
    }
    ok
}

/// Runs `script` with `sh` in a new directory `name` under the mount and
/// in one on a kernel file system (the test's temporary directory: ext4 or
/// tmpfs), both open to every user; their outputs must be equal.
fn same_as_the_kernel(m: &Mount, name: &str, script: &str) -> String {
    use std::os::unix::fs::PermissionsExt;
    let reference = tempfile::tempdir().unwrap();
    let mut outs = Vec::new();
    for dir in [m.path(name), reference.path().join(name)] {
        fs::create_dir(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).unwrap();
        fs::set_permissions(dir.parent().unwrap(), fs::Permissions::from_mode(0o755)).unwrap();
        let out = std::process::Command::new("sh")
            .args(["-c", script])
            .current_dir(&dir)
            .output()
            .unwrap();
        outs.push(
            String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr),
        );
    }
    let kind = std::process::Command::new("stat")
        .args(["-f", "-c", "%T"])
        .arg(reference.path())
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    assert!(
        outs[0] == outs[1],
        "{name}: ldfs and {kind} differ\n--- ldfs:\n{}\n--- {kind}:\n{}",
        outs[0],
        outs[1]
    );
    outs.swap_remove(0)
}

/// Prints each path's mode and owners, its ACL and its extended
/// attributes (what `ls -l` shows as `+`).
const SHOW: &str = r#"show() { for p in "$@"; do echo "== $p $(stat -c '%A %u %g' $p)"; getfacl -cpn $p 2>&1; getfattr -m - -d --absolute-names $p 2>/dev/null | grep -v '^#' | sort; done; }
"#;

/// POSIX ACLs as on ext4/tmpfs: an ACL equal to the mode bits is not
/// stored (the mode changes instead: no `+` in ls -l), the mode follows the
/// mask, chmod rewrites the mask, default ACLs are inherited by new files
/// (masked by the create mode, the umask ignored) and directories (which
/// get both ACLs), and the umask applies where there is none; the kernel
/// enforces them (a named user reads until chmod narrows the mask).
#[test]
fn posix_acls_as_linux_keeps_them() {
    if !fuse_usable() || !have("setfacl") || !have("getfattr") || !have("setpriv") {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let img = t.path().join("acl.img");
    mkfs(&img, "64M");
    let m = Mount::new(&img, &t.path().join("mnt"), &["allow_other"]);
    let script = SHOW.to_string()
        + r#"umask 022
touch f; setfacl -m u::rwx f; show f
touch g; setfacl -m u:1000:rw g; show g
chmod 640 g; show g
setfacl -m m::rwx g; show g
chmod 600 g; show g
setfacl -b g; show g
mkdir d; setfacl -d -m u:1000:rwx d; setfacl -d -m g::r-x d; show d
touch d/nf; mkdir d/sub; mkdir -m 700 d/sub700; (umask 077; touch d/masked; mkdir d/mdir)
mkfifo d/p; ln -s nf d/sym
show d/nf d/sub d/sub700 d/masked d/mdir d/p
chmod 750 d/sub; show d/sub
mkdir e; setfacl -d -m u::rwx,g::r-x,o::r-x e; (umask 077; touch e/x; mkdir e/y); show e e/x e/y
(umask 077; touch plain; mkdir plaind); show plain plaind
R="setpriv --reuid=1001 --regid=1001 --clear-groups"
echo secret > s; chmod 600 s; $R cat s 2>&1
setfacl -m u:1001:r s; $R cat s 2>&1; setpriv --reuid=1002 --regid=1002 --clear-groups cat s 2>&1
chmod 600 s; $R cat s 2>&1; chmod 640 s; $R cat s 2>&1
"#;
    let out = same_as_the_kernel(&m, "acl", &script);
    // Not just equal: what the comparison stands for.
    assert!(out.contains("== f -rwxr--r-- 0 0\n"), "{out}");
    assert!(list_xattrs(&m.path("acl/f")).is_empty());
    assert!(out.contains("== d/nf -rw-rw-r-- 0 0\n"), "{out}");
    assert!(out.contains("secret\n"), "{out}");
    m.unmount();
}

/// Set-user-ID and set-group-ID as the kernel clears them, each case run
/// on the mount (with and without the writeback cache) and on ext4/tmpfs:
/// a write, truncation or fallocate by an unprivileged writer (uid 1000,
/// in the file's group, in none, or in it as a supplementary group) or by
/// root, and chown by either, even to the same owner; set-group-ID
/// without group execute stays for members and root only; an access ACL
/// set by a non-member clears set-group-ID (`posix_acl_update_mode`). Then setgid
/// directories: new inodes take the group, subdirectories the bit, also
/// with a default ACL, and a non-member's set-group-ID create loses it.
#[test]
fn set_id_bits_cleared_and_inherited_as_the_kernel_does() {
    if !fuse_usable() || !have("setpriv") || !have("setfacl") || !have("fallocate") {
        return;
    }
    let script = SHOW.to_string()
        + r#"W="setpriv --reuid=1000 --regid=1000 --clear-groups"
W2="setpriv --reuid=1000 --regid=1000 --groups=0"
mk() { rm -f f; touch f; chown 1000:$2 f; chmod $1 f; }
for mode in 6777 6767 4777 2777 2767 2757; do
  for grp in 1000 0; do
    r=""
    mk $mode $grp; $W sh -c 'echo x >> f'; r="$r w:$(stat -c %a f)"
    mk $mode $grp; $W sh -c 'dd if=/dev/zero of=f bs=1 count=1 seek=10 conv=notrunc 2>/dev/null'; r="$r dd:$(stat -c %a f)"
    mk $mode $grp; $W truncate -s 100 f; r="$r t:$(stat -c %a f)"
    mk $mode $grp; $W truncate -s 0 f; r="$r t0:$(stat -c %a f)"
    mk $mode $grp; $W fallocate -l 8192 f; r="$r fa:$(stat -c %a f)"
    mk $mode $grp; $W fallocate -n -l 8192 f; r="$r fak:$(stat -c %a f)"
    mk $mode $grp; echo x >> f; r="$r rootw:$(stat -c %a f)"
    mk $mode $grp; truncate -s 100 f; r="$r roott:$(stat -c %a f)"
    mk $mode $grp; chown 1000 f; r="$r rootchown-same:$(stat -c %a f)"
    mk $mode $grp; chown 1001 f; r="$r rootchown:$(stat -c %a f)"
    mk $mode $grp; chgrp 1000 f; r="$r rootchgrp:$(stat -c %a f)"
    mk $mode $grp; $W chown 1000 f; r="$r chown-same:$(stat -c %a f)"
    mk $mode $grp; $W chgrp 1000 f; r="$r chgrp:$(stat -c %a f)"
    mk $mode $grp; $W chmod $mode f 2>&1; r="$r chmod:$(stat -c %a f)"
    echo "$mode $grp:$r"
  done
done
for mode in 6767 2767 6777; do
  r=""
  mk $mode 0; $W2 sh -c 'echo x >> f'; r="$r w:$(stat -c %a f)"
  mk $mode 0; $W2 truncate -s 100 f; r="$r t:$(stat -c %a f)"
  mk $mode 0; $W2 fallocate -l 8192 f; r="$r fa:$(stat -c %a f)"
  mk $mode 0; $W2 chown 1000 f; r="$r chown-same:$(stat -c %a f)"
  echo "supplementary $mode 0:$r"
done
for g in 0 1000; do
  for mode in 2775 2765; do
    r=""
    mk $mode $g; $W setfacl -m u:1001:r f; r="$r named:$(stat -c %a f)"
    mk $mode $g; $W setfacl -m u::rwx,g::r-x,o::r-x f; r="$r equal:$(stat -c %a f)"
    mk $mode $g; setfacl -m u:1001:r f; r="$r root:$(stat -c %a f)"
    echo "acl $mode $g:$r"
  done
done
mkdir sd; chgrp 1000 sd; chmod 2777 sd
$W mkdir sd/sub; $W touch sd/f; $W mkdir -m 755 sd/m755; touch sd/rootf; mkdir sd/rootd
$W sh -c 'umask 0; install -m 2775 /dev/null sd/x; mkdir -m 2755 sd/y'
mkdir od; chmod 2777 od
$W sh -c 'umask 0; install -m 2775 /dev/null od/x; install -m 2765 /dev/null od/x2; mkdir -m 2755 od/y'
show sd/sub sd/f sd/m755 sd/rootf sd/rootd sd/x sd/y od/x od/x2 od/y
setfacl -d -m u:1000:rwx,g::rwx sd; $W mkdir sd/sub2; $W touch sd/f2
$W sh -c 'umask 0; install -m 2775 /dev/null sd/x3'
show sd/sub2 sd/f2 sd/x3
"#;
    let t = tempfile::tempdir().unwrap();
    let img = t.path().join("sid.img");
    mkfs(&img, "64M");
    let mnt = t.path().join("mnt");
    for (k, opts) in [["allow_other"], ["allow_other,writeback_cache"]]
        .iter()
        .enumerate()
    {
        let m = Mount::new(&img, &mnt, opts);
        let out = same_as_the_kernel(&m, &format!("sid{k}"), &script);
        // Not just equal: what the comparison stands for.
        assert!(out.contains("6767 0: w:767 "), "{out}");
        assert!(out.contains("6767 1000: w:2767 "), "{out}");
        assert!(out.contains("rootchown-same:777 "), "{out}");
        assert!(out.contains("acl 2775 0: named:775 "), "{out}");
        m.unmount();
    }
}

/// The README says what FUSE makes impossible, and it holds: under
/// `strictatime` a read the page cache serves leaves atime alone, and
/// FIEMAP finds no extents to report.
#[test]
fn readme_says_what_fuse_makes_impossible_and_it_holds() {
    use std::io::Read;
    use std::os::unix::fs::MetadataExt;
    use std::os::unix::io::AsRawFd;
    let readme =
        fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md")).unwrap();
    let section = readme
        .split("**What FUSE makes impossible.**")
        .nth(1)
        .expect("README: no paragraph on what FUSE makes impossible");
    let section = section.split("\n\n").next().unwrap();
    for claim in [
        "page cache",
        "atime",
        "supplementary groups",
        "remount",
        "swap",
        "FIEMAP",
    ] {
        assert!(
            section.contains(claim),
            "README's paragraph does not mention {claim}"
        );
    }
    if !fuse_usable() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let img = t.path().join("i.img");
    mkfs(&img, "64M");
    let m = Mount::new(&img, &t.path().join("mnt"), &["strictatime"]);
    let f = m.path("f");
    fs::write(&f, vec![5u8; 8192]).unwrap();
    read_through(&f);
    let atime = || {
        let md = fs::metadata(&f).unwrap();
        (md.atime(), md.atime_nsec())
    };
    // Past the kernel's attribute cache (TTL), so the atime is ldfs's.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let before = atime();
    let mut buf = Vec::new();
    fs::File::open(&f).unwrap().read_to_end(&mut buf).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1100));
    assert_eq!(atime(), before, "a read from the page cache reached ldfs");
    read_through(&f);
    std::thread::sleep(std::time::Duration::from_millis(1100));
    assert!(atime() > before, "a read through to ldfs left atime alone");
    // FS_IOC_FIEMAP with room for the header only (struct fiemap).
    let mut fiemap = [0u64; 4];
    fiemap[1] = u64::MAX; // fm_length
    let file = fs::File::open(&f).unwrap();
    let r = unsafe { libc::ioctl(file.as_raw_fd(), 0xC020_660B, fiemap.as_mut_ptr()) };
    assert!(r < 0 || fiemap[2] >> 32 == 0, "FIEMAP mapped extents");
    drop(file);
    m.unmount();
}

/// `mount -o remount,ro` that the kernel refuses (EBUSY: a file is open
/// for writing) leaves writers alone, as on ext4: the helper remounts the
/// kernel's mount first and tells the daemon only once that worked (it
/// used to tell the daemon first, and writes reaching it in between failed
/// with EROFS although the mount stayed read-write all along).
#[test]
fn a_refused_remount_ro_fails_no_write() {
    use std::os::unix::fs::FileExt;
    use std::sync::atomic::{AtomicBool, Ordering};
    if !fuse_usable() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let img = t.path().join("w.img");
    mkfs(&img, "64M");
    let mnt = t.path().join("mnt");
    let m = Mount::new(&img, &mnt, &[]);
    let f = Arc::new(
        fs::OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .open(m.path("busy"))
            .unwrap(),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (f, stop) = (f.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut failed = Vec::new();
            let mut n = 0u64;
            while !stop.load(Ordering::SeqCst) {
                if let Err(e) = f.write_all_at(&[n as u8; 4096], (n % 64) * 4096) {
                    failed.push(e.raw_os_error());
                }
                n += 1;
            }
            (n, failed)
        })
    };
    let mut refused = 0;
    for _ in 0..5 {
        let out = helper(t.path(), &img, &mnt, "remount,ro");
        if !out.status.success() {
            refused += 1;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    stop.store(true, Ordering::SeqCst);
    let (writes, failed) = writer.join().unwrap();
    assert!(
        mount_entry(&mnt).1.starts_with("rw,"),
        "remounted read-only"
    );
    assert_eq!(refused, 5, "the kernel let a file open for writing stay");
    assert!(
        failed.is_empty(),
        "{} of {writes} writes failed during refused remounts (errnos {:?}; EROFS is {})",
        failed.len(),
        &failed[..failed.len().min(5)],
        libc::EROFS
    );
    drop(f);
    m.unmount();
}

/// Review probe: a signal that ends `mount -o remount,ro` (Ctrl-C, a
/// shutdown's SIGTERM) between its two steps — the daemon told to refuse
/// changes, then the kernel's remount — must not leave the mount
/// read-write in the kernel with a daemon refusing every change. Signals
/// land at delays swept across the helper's run.
#[test]
fn a_remount_ro_ended_by_a_signal_leaves_kernel_and_daemon_agreeing() {
    if !fuse_usable() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let img = t.path().join("s.img");
    mkfs(&img, "64M");
    let mnt = t.path().join("mnt");
    let m = Mount::new(&img, &mnt, &[]);
    let h = t.path().join("mount.fuse.ldfs");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_ldfs"), &h).unwrap();
    let mut midway = 0;
    for attempt in 0..60u64 {
        let mut child = std::process::Command::new(&h)
            .arg(&img)
            .arg(&mnt)
            .args(["-o", "remount,ro"])
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_micros(attempt * 400));
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let status = child.wait().unwrap();
        if mount_entry(&mnt).1.starts_with("rw,") {
            let r = fs::write(m.path("probe"), attempt.to_le_bytes());
            assert!(
                r.is_ok(),
                "attempt {attempt} ({status}): the kernel's mount is rw, the daemon refuses: {r:?}"
            );
            if !status.success() {
                midway += 1;
            }
        } else {
            let out = helper(t.path(), &img, &mnt, "remount,rw");
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    println!("{midway} helpers ended by the signal with the mount rw");
    m.unmount();
}
