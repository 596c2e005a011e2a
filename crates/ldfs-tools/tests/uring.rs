//! FUSE over io_uring (`-o transport=uring`) through a real mount: the
//! operations ldfs serves travel over the ring (`ldfs stats` names the
//! transport and counts what the ring served), and unmount and SIGTERM end
//! the daemon cleanly. Needs root, a kernel with CONFIG_FUSE_IO_URING and
//! /dev/fuse; skips loudly otherwise. As root with the fuse module's
//! `enable_uring` off, `transport=uring` turns it on (as the option
//! promises): the test puts the parameter back as it found it.

mod common;

use std::fs::{self, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use common::{fuse_usable, ldfs, mkfs, Mount};

fn errno<T: std::fmt::Debug>(r: std::io::Result<T>) -> i32 {
    r.expect_err("expected an error").raw_os_error().unwrap()
}

const PARAM: &str = "/sys/module/fuse/parameters/enable_uring";

/// The tests here share the kernel parameter: one at a time.
static PARAM_LOCK: Mutex<()> = Mutex::new(());

/// Puts `enable_uring` back as it was when dropped.
struct Restore(String);

impl Drop for Restore {
    fn drop(&mut self) {
        let _ = fs::write(PARAM, self.0.trim());
    }
}

fn usable() -> Option<Restore> {
    if !fuse_usable() {
        return None;
    }
    let Ok(was) = fs::read_to_string(PARAM) else {
        eprintln!("\n*** SKIPPING FUSE-OVER-IO_URING TEST: {PARAM} missing (no CONFIG_FUSE_IO_URING) ***\n");
        return None;
    };
    if unsafe { libc::geteuid() } != 0 && was.trim() != "Y" {
        eprintln!("\n*** SKIPPING FUSE-OVER-IO_URING TEST: {PARAM} is off and only root may turn it on ***\n");
        return None;
    }
    Some(Restore(was))
}

/// A fresh image of `size` mounted with `transport=uring`, with the
/// parameter lock held and the parameter put back afterwards; None (the
/// test skips) where the ring cannot be had.
fn ring_mount(
    size: &str,
) -> Option<(
    std::sync::MutexGuard<'static, ()>,
    Restore,
    tempfile::TempDir,
    Mount,
)> {
    let g = PARAM_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let restore = usable()?;
    let t = tempfile::tempdir().unwrap();
    let img = t.path().join("u.img");
    mkfs(&img, size);
    let m = Mount::new(&img, &t.path().join("mnt"), &["transport=uring"]);
    Some((g, restore, t, m))
}

fn stats(mnt: &Path) -> String {
    let out = ldfs().arg("stats").arg(mnt).output().unwrap();
    assert!(out.status.success(), "ldfs stats: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The number of requests `ldfs stats` says the ring served.
fn ring_served(mnt: &Path) -> u64 {
    let s = stats(mnt);
    let line = s
        .lines()
        .find(|l| l.starts_with("transport: "))
        .unwrap_or_else(|| panic!("no transport line in stats:\n{s}"));
    assert!(line.contains("io_uring ("), "not over io_uring: {line}");
    line.split(", ")
        .find_map(|x| x.strip_suffix(" requests served over io_uring"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count in {line}"))
}

#[test]
fn operations_over_io_uring() {
    let Some((_g, _restore, t, m)) = ring_mount("256M") else {
        return;
    };
    let p = |s: &str| m.path(s);
    let before = ring_served(&m.dir);

    // create, write, read, fsync
    let mut f = OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(p("f"))
        .unwrap();
    f.write_all(b"hello over the ring").unwrap();
    f.sync_all().unwrap();
    let big: Vec<u8> = (0..3 << 20)
        .map(|i: u32| (i * 7 + i / 4096) as u8)
        .collect();
    f.seek(SeekFrom::Start(4096)).unwrap();
    f.write_all(&big).unwrap();
    f.sync_data().unwrap();
    drop(f);
    let back = fs::read(p("f")).unwrap();
    assert_eq!(&back[..19], b"hello over the ring");
    assert_eq!(&back[4096..], &big[..]);
    assert_eq!(fs::metadata(p("f")).unwrap().len(), 4096 + (3 << 20));

    // directories, rename, link, symlink, unlink, readdir
    fs::create_dir(p("d")).unwrap();
    for i in 0..300 {
        fs::write(p(&format!("d/file-with-a-longish-name-{i:04}")), [i as u8]).unwrap();
    }
    fs::rename(p("f"), p("d/g")).unwrap();
    fs::hard_link(p("d/g"), p("h")).unwrap();
    assert_eq!(fs::metadata(p("h")).unwrap().nlink(), 2);
    std::os::unix::fs::symlink("d/g", p("s")).unwrap();
    assert_eq!(fs::read_link(p("s")).unwrap().to_str(), Some("d/g"));
    let mut names: Vec<String> = fs::read_dir(p("d"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names.len(), 301);
    assert_eq!(names[300], "g");
    for i in 0..300 {
        fs::remove_file(p(&format!("d/file-with-a-longish-name-{i:04}"))).unwrap();
    }
    fs::remove_file(p("h")).unwrap();
    assert_eq!(
        errno(fs::remove_dir(p("d"))),
        libc::ENOTEMPTY,
        "rmdir of a non-empty directory"
    );
    assert_eq!(errno(fs::metadata(p("nothing"))), libc::ENOENT);

    // attributes and extended attributes
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(p("d/g"), fs::Permissions::from_mode(0o640)).unwrap();
    assert_eq!(fs::metadata(p("d/g")).unwrap().mode() & 0o7777, 0o640);
    let g = common::cstr(&p("d/g"));
    let set = |name: &std::ffi::CStr, v: &[u8], flags| unsafe {
        libc::setxattr(g.as_ptr(), name.as_ptr(), v.as_ptr().cast(), v.len(), flags)
    };
    assert_eq!(set(c"user.a", b"value-a", 0), 0);
    assert_eq!(set(c"user.b", &[7u8; 10000], 0), 0);
    assert_eq!(set(c"user.a", b"x", libc::XATTR_CREATE), -1);
    let mut buf = vec![0u8; 20000];
    let n = unsafe {
        libc::getxattr(
            g.as_ptr(),
            c"user.b".as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    assert_eq!(n, 10000);
    assert!(buf[..10000].iter().all(|&b| b == 7));
    let n = unsafe { libc::getxattr(g.as_ptr(), c"user.a".as_ptr(), std::ptr::null_mut(), 0) };
    assert_eq!(n, 7, "the size of user.a");
    let n = unsafe { libc::listxattr(g.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    assert_eq!(&buf[..n as usize], b"user.a\0user.b\0");
    assert_eq!(
        unsafe { libc::removexattr(g.as_ptr(), c"user.a".as_ptr()) },
        0
    );
    let n = unsafe { libc::getxattr(g.as_ptr(), c"user.a".as_ptr(), std::ptr::null_mut(), 0) };
    assert_eq!(n, -1);

    // truncate, then statfs
    OpenOptions::new()
        .write(true)
        .open(p("d/g"))
        .unwrap()
        .set_len(10)
        .unwrap();
    let mut s = String::new();
    fs::File::open(p("d/g"))
        .unwrap()
        .read_to_string(&mut s)
        .unwrap();
    assert_eq!(s, "hello over");
    let st = unsafe {
        let mut st: libc::statvfs = std::mem::zeroed();
        assert_eq!(libc::statvfs(common::cstr(&m.dir).as_ptr(), &mut st), 0);
        st
    };
    assert!(st.f_blocks > 0);

    let after = ring_served(&m.dir);
    assert!(
        after > before + 300,
        "only {} requests over the ring",
        after - before
    );
    m.unmount();

    // What was written over the ring is on the image: remount over /dev/fuse.
    let m = Mount::new(
        &t.path().join("u.img"),
        &t.path().join("mnt"),
        &["transport=dev"],
    );
    assert_eq!(fs::read(m.path("d/g")).unwrap(), b"hello over");
    assert_eq!(fs::read_link(m.path("s")).unwrap().to_str(), Some("d/g"));
    assert!(stats(&m.dir).contains("transport: /dev/fuse"));
    m.unmount();
}

#[test]
fn sigterm_ends_an_io_uring_mount_cleanly() {
    let Some((_g, _restore, t, mut m)) = ring_mount("128M") else {
        return;
    };
    assert!(ring_served(&m.dir) < u64::MAX);
    fs::write(m.path("kept"), b"after sigterm").unwrap();
    let st = m
        .signal_within(libc::SIGTERM, Duration::from_secs(20))
        .expect("the daemon did not end within 20 s of SIGTERM");
    assert!(st.success(), "daemon exit: {st}");
    let m = Mount::new(
        &t.path().join("u.img"),
        &t.path().join("mnt"),
        &["transport=dev"],
    );
    assert_eq!(fs::read(m.path("kept")).unwrap(), b"after sigterm");
    m.unmount();
}

#[test]
fn transport_option_is_checked() {
    let t = tempfile::tempdir().unwrap();
    let img = t.path().join("u.img");
    mkfs(&img, "64M");
    fs::create_dir(t.path().join("mnt")).unwrap();
    let out = ldfs()
        .args(["mount", "-f", "-o", "transport=carrier-pigeon"])
        .arg(&img)
        .arg(t.path().join("mnt"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("transport=carrier-pigeon: auto, uring or dev"),
        "{err}"
    );
}

/// Mounts `img` on `mnt` with `opts` through `ldfs mount -f`, its stderr
/// kept; returns the daemon and what it said before the mount appeared.
fn mount_saying(img: &Path, mnt: &Path, opts: &str) -> (std::process::Child, String) {
    use std::io::BufRead;
    fs::create_dir_all(mnt).unwrap();
    let mut child = ldfs()
        .args(["mount", "-f", "-o", opts])
        .arg(img)
        .arg(mnt)
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let t = std::time::Instant::now();
    while !common::is_mounted(mnt) {
        assert!(child.try_wait().unwrap().is_none(), "ldfs mount exited");
        assert!(t.elapsed() < Duration::from_secs(20), "mount timed out");
        std::thread::sleep(Duration::from_millis(20));
    }
    // The transport is chosen before the mount: its line is written.
    let err = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for l in std::io::BufReader::new(err).lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    let mut said = String::new();
    while let Ok(l) = rx.recv_timeout(Duration::from_millis(300)) {
        said += &l;
        said += "\n";
    }
    (child, said)
}

fn end(mut child: std::process::Child, mnt: &Path) {
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let st = child.wait().unwrap();
    assert!(st.success(), "daemon exit: {st}");
    assert!(!common::is_mounted(mnt));
}

#[test]
fn auto_takes_io_uring_only_when_the_kernel_offers_it_and_says_why_not() {
    let _g = PARAM_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let Some(_restore) = usable() else {
        return;
    };
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("\n*** SKIPPING: switching {PARAM} needs root ***\n");
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let img = t.path().join("u.img");
    mkfs(&img, "64M");
    let mnt = t.path().join("mnt");

    fs::write(PARAM, "N").unwrap();
    let (child, said) = mount_saying(&img, &mnt, "transport=auto");
    assert!(
        said.contains("transport /dev/fuse: FUSE over io_uring is off in this kernel")
            && said.contains("enable_uring"),
        "auto with the parameter off said: {said:?}"
    );
    assert_eq!(
        fs::read_to_string(PARAM).unwrap().trim(),
        "N",
        "auto changed it"
    );
    assert!(stats(&mnt).contains("transport: /dev/fuse"));
    end(child, &mnt);

    fs::write(PARAM, "Y").unwrap();
    let (child, said) = mount_saying(&img, &mnt, "transport=auto");
    assert!(
        !said.contains("transport"),
        "auto over io_uring said: {said:?}"
    );
    fs::write(mnt.join("x"), b"y").unwrap();
    assert!(ring_served(&mnt) > 0);
    end(child, &mnt);

    // dev stays on /dev/fuse whatever the kernel offers.
    let (child, _) = mount_saying(&img, &mnt, "transport=dev");
    assert!(stats(&mnt).contains("transport: /dev/fuse"));
    end(child, &mnt);
}

#[test]
fn a_background_mount_says_ready_once_the_ring_serves() {
    let _g = PARAM_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let Some(_restore) = usable() else {
        return;
    };
    let t = tempfile::tempdir().unwrap();
    let img = t.path().join("u.img");
    mkfs(&img, "64M");
    let mnt = t.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    // `ldfs mount` returns once the daemon serves: over the ring already.
    let out = ldfs()
        .args(["mount", "-o", "transport=uring"])
        .arg(&img)
        .arg(&mnt)
        .output()
        .unwrap();
    assert!(out.status.success(), "ldfs mount: {out:?}");
    let s = stats(&mnt);
    assert!(s.contains("transport: io_uring ("), "{s}");
    fs::write(mnt.join("f"), b"x").unwrap();
    let st = std::process::Command::new("fusermount3")
        .arg("-u")
        .arg(&mnt)
        .status()
        .unwrap();
    assert!(st.success());
    // The daemon ends after its final checkpoint; the image reopens.
    let t0 = std::time::Instant::now();
    loop {
        let m = ldfs().args(["fsck", "-n"]).arg(&img).output().unwrap();
        if m.status.success() {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "fsck: {m:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn auto_falls_back_to_dev_fuse_when_the_ring_cannot_be_set_up_halfway() {
    let _g = PARAM_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let Some(_restore) = usable() else {
        return;
    };
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("\n*** SKIPPING: switching {PARAM} needs root ***\n");
        return;
    }
    fs::write(PARAM, "Y").unwrap();
    let t = tempfile::tempdir().unwrap();
    let img = t.path().join("u.img");
    mkfs(&img, "64M");
    let mnt = t.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    // 16 descriptors: the mount is made and INIT grants io_uring, but a
    // ring entry's /dev/fuse cannot be duplicated after a few queues'.
    let mut cmd = ldfs();
    cmd.args(["mount", "-f", "-o", "transport=auto"])
        .arg(&img)
        .arg(&mnt)
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(|| {
            let l = libc::rlimit {
                rlim_cur: 16,
                rlim_max: 16,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &l) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().unwrap();
    let t0 = std::time::Instant::now();
    while !common::is_mounted(&mnt) {
        assert!(child.try_wait().unwrap().is_none(), "ldfs mount exited");
        assert!(t0.elapsed() < Duration::from_secs(20), "mount timed out");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Requests are served (over /dev/fuse), not held for a ring.
    let (tx, rx) = std::sync::mpsc::channel();
    let p = mnt.join("missing");
    std::thread::spawn(move || {
        let _ = tx.send(fs::symlink_metadata(&p).map_err(|e| e.raw_os_error()));
    });
    let r = rx.recv_timeout(Duration::from_secs(15));
    if r.is_err() {
        // Unblock the hung request before failing: abort the connection.
        let c = common::cstr(&mnt);
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_FORCE | libc::MNT_DETACH) };
        let _ = child.kill();
        let _ = child.wait();
        panic!("a lookup hung: the kernel still waits for the ring");
    }
    assert_eq!(r.unwrap().unwrap_err(), Some(libc::ENOENT));
    fs::write(mnt.join("f"), b"over /dev/fuse").unwrap();
    assert_eq!(fs::read(mnt.join("f")).unwrap(), b"over /dev/fuse");
    let st = std::process::Command::new("fusermount3")
        .arg("-u")
        .arg(&mnt)
        .status()
        .unwrap();
    assert!(st.success());
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "daemon exit: {}: {err}", out.status);
    assert!(
        err.contains("transport /dev/fuse: registering the io_uring queues"),
        "{err}"
    );
}

/// What a small-file create (open O_CREAT, write 1 KiB, close) costs in
/// round trips with the defaults (no writeback cache): LOOKUP, CREATE,
/// GETXATTR (the kernel's file-capability check on write), WRITE, GETATTR,
/// RELEASE. No FLUSH: ldfs answers the first one ENOSYS and the kernel
/// sends no more. Counted by the ring (every request but FORGET travels
/// over it), less what `ldfs stats` itself costs.
#[test]
fn a_small_file_create_costs_six_round_trips() {
    let Some((_g, _restore, _t, m)) = ring_mount("256M") else {
        return;
    };
    fs::create_dir(m.path("d")).unwrap();
    fs::write(m.path("d/warm"), b"x").unwrap();
    let a = ring_served(&m.dir);
    let stats_cost = ring_served(&m.dir) - a;
    let before = ring_served(&m.dir);
    const N: u64 = 200;
    for i in 0..N {
        let mut f = fs::File::create(m.path(&format!("d/f{i}"))).unwrap();
        f.write_all(&[7u8; 1024]).unwrap();
    }
    let after = ring_served(&m.dir);
    let per = (after - before - stats_cost) as f64 / N as f64;
    assert!(
        per <= 6.05,
        "{per:.2} requests per small-file create (stats costs {stats_cost})"
    );
    m.unmount();
}

/// A name that does not exist is answered with a negative entry, which the
/// kernel keeps for the entry timeout: 100 stats of the same missing name
/// cost one LOOKUP (a few if the timeout runs out on a slow machine), not
/// 100. Creating the name afterwards sees it at once.
#[test]
fn a_missing_name_is_looked_up_once() {
    let Some((_g, _restore, _t, m)) = ring_mount("256M") else {
        return;
    };
    fs::create_dir(m.path("d")).unwrap();
    let a = ring_served(&m.dir);
    let stats_cost = ring_served(&m.dir) - a;
    let before = ring_served(&m.dir);
    for _ in 0..100 {
        let e = fs::metadata(m.path("d/absent")).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::NotFound);
    }
    let after = ring_served(&m.dir);
    let lookups = after - before - stats_cost;
    assert!(
        lookups <= 5,
        "{lookups} requests for 100 stats of one missing name"
    );
    fs::write(m.path("d/absent"), b"here").unwrap();
    assert_eq!(fs::read(m.path("d/absent")).unwrap(), b"here");
    fs::remove_file(m.path("d/absent")).unwrap();
    assert!(fs::metadata(m.path("d/absent")).is_err());
    m.unmount();
}

/// Names are kept by the kernel for the entry timeout (30 s), longer than
/// attributes (1 s): a file made more than a second ago is unlinked
/// without a LOOKUP first. Two requests each: UNLINK, and a GETATTR of the
/// directory (the kernel checks permissions itself, and the unlink before
/// dropped the directory's cached attributes); with a 1 s entry timeout a
/// LOOKUP came first (three).
#[test]
fn an_unlink_seconds_after_the_create_needs_no_lookup() {
    let Some((_g, _restore, _t, m)) = ring_mount("256M") else {
        return;
    };
    fs::create_dir(m.path("d")).unwrap();
    const N: u64 = 50;
    for i in 0..N {
        fs::write(m.path(&format!("d/f{i}")), b"x").unwrap();
    }
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let a = ring_served(&m.dir);
    let stats_cost = ring_served(&m.dir) - a;
    let before = ring_served(&m.dir);
    for i in 0..N {
        fs::remove_file(m.path(&format!("d/f{i}"))).unwrap();
    }
    let after = ring_served(&m.dir);
    let per = (after - before - stats_cost) as f64 / N as f64;
    assert!(per <= 2.2, "{per:.2} requests per unlink");
    m.unmount();
}

/// `chattr +c` and `lsattr` over the ring: FUSE_IOCTL decoded, answered
/// and its output sent back (FS_IOC_GETFLAGS, SETFLAGS); an unkept flag is
/// EOPNOTSUPP. The full behaviour is in compress_mount.rs (over /dev/fuse).
#[test]
fn chattr_and_lsattr_over_the_ring() {
    let Some((_g, _restore, _t, m)) = ring_mount("256M") else {
        return;
    };
    let d = m.path("d");
    fs::create_dir(&d).unwrap();
    assert_eq!(common::get_flags(&d), Ok(0));
    common::set_flags(&d, 0x4).unwrap();
    assert_eq!(common::get_flags(&d), Ok(0x4));
    fs::write(d.join("f"), b"inherits").unwrap();
    assert_eq!(common::get_flags(&d.join("f")), Ok(0x4));
    assert_eq!(common::set_flags(&d.join("f"), 0x10), Err(libc::EOPNOTSUPP));
    common::set_flags(&d.join("f"), 0).unwrap();
    assert_eq!(common::get_flags(&d.join("f")), Ok(0));
    assert_eq!(fs::read(d.join("f")).unwrap(), b"inherits");
    m.unmount();
}
