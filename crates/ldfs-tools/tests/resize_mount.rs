//! `ldfs resize` through the binary (issue 17): an unmounted image grown
//! (the file grows, `df` of the next mount shows it, writes fill it) and
//! shrunk (its files moved out of the cut segments, the file truncated,
//! fsck clean); a mounted ldfs grown online through its daemon (`df` shows
//! the new size at once and writes past the old size succeed; a shrink of
//! a mount is refused); refusals: past `--max-size`, a shrink the data
//! does not fit, a dual pair's data device.

mod common;

use std::fs;
use std::path::Path;

use common::{cstr, fuse_usable, ldfs, mkfs, Mount};

fn run(args: &[&str]) -> (i32, String) {
    let out = ldfs().args(args).output().unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), text)
}

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// `df`'s size and available bytes.
fn df(dir: &Path) -> (u64, u64) {
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(cstr(dir).as_ptr(), &mut st) }, 0);
    (
        st.f_blocks as u64 * st.f_frsize as u64,
        st.f_bavail as u64 * st.f_frsize as u64,
    )
}

fn data(i: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|k| (k * 13 + i * 101 + (k >> 12) * 7) as u8)
        .collect()
}

/// Writes files `{prefix}{i}` of 1 MiB, `n` of them, and syncs.
fn write(mnt: &Path, prefix: &str, n: usize) {
    for i in 0..n {
        fs::write(mnt.join(format!("{prefix}{i}")), data(i, 1 << 20)).unwrap();
    }
    let (code, text) = run(&["sync", p(mnt)]);
    assert_eq!(code, 0, "{text}");
}

fn check(mnt: &Path, prefix: &str, n: usize) {
    for i in 0..n {
        let got = fs::read(mnt.join(format!("{prefix}{i}"))).unwrap();
        assert!(got == data(i, 1 << 20), "{prefix}{i} differs");
    }
}

fn fsck_clean(img: &Path) {
    let (code, text) = run(&["fsck", "-n", p(img)]);
    assert_eq!(code, 0, "{text}");
}

#[test]
fn grow_and_shrink_an_unmounted_image() {
    let t = tempfile::tempdir().unwrap();
    let img = t.path().join("r.img");
    mkfs(&img, "64M");
    if fuse_usable() {
        let mnt = t.path().join("mnt");
        let m = Mount::new(&img, &mnt, &[]);
        write(&mnt, "a", 20);
        m.unmount();
    }
    let (code, text) = run(&["resize", p(&img), "256M"]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("30 -> 126 segments"), "{text}");
    assert_eq!(fs::metadata(&img).unwrap().len(), 256 << 20);
    fsck_clean(&img);
    if fuse_usable() {
        let mnt = t.path().join("mnt");
        let m = Mount::new(&img, &mnt, &[]);
        let (size, _) = df(&mnt);
        assert!(size > 200 << 20, "df says {size} bytes");
        check(&mnt, "a", 20);
        // More than the old image held.
        write(&mnt, "b", 80);
        m.unmount();
        // Make room for the shrink: the first files go.
        let m = Mount::new(&img, &mnt, &[]);
        for i in 0..80 {
            fs::remove_file(mnt.join(format!("b{i}"))).unwrap();
        }
        m.unmount();
    }
    let (code, text) = run(&["resize", p(&img), "-160M"]);
    assert_eq!(code, 0, "{text}");
    assert_eq!(fs::metadata(&img).unwrap().len(), 96 << 20);
    fsck_clean(&img);
    if fuse_usable() {
        let mnt = t.path().join("mnt");
        let m = Mount::new(&img, &mnt, &[]);
        check(&mnt, "a", 20);
        let (size, _) = df(&mnt);
        assert!(size < 96 << 20 && size > 64 << 20, "df says {size} bytes");
        m.unmount();
    }
    // Too small for what is there: refused, nothing changed.
    let (code, text) = run(&["resize", p(&img), "24M"]);
    assert_ne!(code, 0, "{text}");
    assert!(text.contains("live") && text.contains("fit"), "{text}");
    assert_eq!(fs::metadata(&img).unwrap().len(), 96 << 20);
    fsck_clean(&img);
}

#[test]
fn growth_past_max_size_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let img = t.path().join("m.img");
    ldfs()
        .args(["mkfs", "--size", "64M", "--max-size", "64M"])
        .arg(&img)
        .status()
        .unwrap();
    let (code, text) = run(&["resize", p(&img), "1G"]);
    assert_ne!(code, 0, "{text}");
    assert!(text.contains("--max-size"), "{text}");
    assert_eq!(fs::metadata(&img).unwrap().len(), 64 << 20);
    // A mounted image is refused unmounted: its lock.
    if fuse_usable() {
        let mnt = t.path().join("mnt");
        let m = Mount::new(&img, &mnt, &[]);
        let (code, text) = run(&["resize", p(&img), "+1M"]);
        assert_ne!(code, 0, "{text}");
        m.unmount();
    }
}

#[test]
fn grow_a_mounted_file_system_online() {
    if !fuse_usable() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let img = t.path().join("o.img");
    mkfs(&img, "64M");
    let mnt = t.path().join("mnt");
    let m = Mount::new(&img, &mnt, &[]);
    write(&mnt, "a", 30);
    let (size0, _) = df(&mnt);
    let (code, text) = run(&["resize", p(&mnt), "+192M"]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("30 -> 126 segments"), "{text}");
    assert_eq!(fs::metadata(&img).unwrap().len(), 256 << 20);
    let (size1, avail1) = df(&mnt);
    assert!(size1 > 3 * size0, "df: {size0} then {size1} bytes");
    assert!(avail1 > 150 << 20, "df: {avail1} bytes available");
    // Writes fill the new space: far more than the old image held.
    write(&mnt, "b", 150);
    check(&mnt, "a", 30);
    // Shrinking a mount is refused.
    let (code, text) = run(&["resize", p(&mnt), "-64M"]);
    assert_ne!(code, 0, "{text}");
    assert!(
        text.contains("not resized") && text.contains("unmounted"),
        "{text}"
    );
    m.unmount();
    fsck_clean(&img);
    let m = Mount::new(&img, &mnt, &[]);
    check(&mnt, "a", 30);
    check(&mnt, "b", 150);
    let (size2, _) = df(&mnt);
    assert_eq!(size2, size1);
    m.unmount();
}

/// A block device the storage grew (a loop device over a file extended,
/// its capacity read again): `ldfs resize DEV` with no size takes it all.
/// Root and losetup; skipped loudly otherwise.
#[test]
fn a_grown_block_device_is_taken_whole() {
    if unsafe { libc::geteuid() } != 0
        || std::process::Command::new("losetup")
            .arg("--version")
            .output()
            .is_err()
    {
        eprintln!("*** SKIPPING a_grown_block_device_is_taken_whole: needs root and losetup ***");
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let back = t.path().join("back.img");
    fs::File::create(&back).unwrap().set_len(64 << 20).unwrap();
    let out = std::process::Command::new("losetup")
        .args(["--find", "--show"])
        .arg(&back)
        .output()
        .unwrap();
    if !out.status.success() {
        eprintln!(
            "*** SKIPPING a_grown_block_device_is_taken_whole: losetup: {} ***",
            String::from_utf8_lossy(&out.stderr).trim()
        );
        return;
    }
    let loopdev = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let detach = || {
        let _ = std::process::Command::new("losetup")
            .args(["-d", &loopdev])
            .status();
    };
    let result = std::panic::catch_unwind(|| {
        let dev = Path::new(&loopdev);
        let (code, text) = run(&["mkfs", p(dev)]);
        assert_eq!(code, 0, "{text}");
        // Nothing to take yet.
        let (code, text) = run(&["resize", p(dev)]);
        assert_ne!(code, 0, "{text}");
        assert!(text.contains("nothing to do"), "{text}");
        fs::OpenOptions::new()
            .write(true)
            .open(&back)
            .unwrap()
            .set_len(192 << 20)
            .unwrap();
        let st = std::process::Command::new("losetup")
            .args(["-c", &loopdev])
            .status()
            .unwrap();
        assert!(st.success());
        let (code, text) = run(&["resize", p(dev)]);
        assert_eq!(code, 0, "{text}");
        assert!(text.contains("-> 201326592 bytes"), "{text}");
        let (code, text) = run(&["fsck", "-n", p(dev)]);
        assert_eq!(code, 0, "{text}");
        // A shrink of a block device leaves the device as it is.
        let (code, text) = run(&["resize", p(dev), "96M"]);
        assert_eq!(code, 0, "{text}");
        let (code, text) = run(&["fsck", "-n", p(dev)]);
        assert_eq!(code, 0, "{text}");
    });
    detach();
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}
