//! Compression through a real mount (issue 17): `setfattr -n
//! user.ldfs.compress` on a directory makes the files written there stored
//! compressed (`ldfs stats` shows fewer bytes stored than written; `ldfs
//! inspect --path` shows each block's form), files read back equal, a bad
//! value is EINVAL, and `-o compress=` does the same for a whole mount.

mod common;

use std::fs;
use std::path::Path;
use std::process::Command;

use common::{cstr, errno, fuse_usable, ldfs, mkfs, Mount, Succeeds};

/// Source-like text that compresses (varied, so every block differs).
fn source(i: usize, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 100);
    let mut k = 0usize;
    while out.len() < len {
        out.extend_from_slice(
            format!(
                "fn item_{i}_{k}(x: u64) -> u64 {{ x.wrapping_mul({}) + {k} }}\n",
                k * 31 + i
            )
            .as_bytes(),
        );
        k += 1;
    }
    out.truncate(len);
    out
}

/// Sets an extended attribute as a user would (setfattr, from the attr
/// package), or through setxattr(2) where the tool is missing.
fn setfattr(path: &Path, name: &str, value: &str) -> Result<(), i32> {
    if Command::new("setfattr").arg("--version").output().is_ok() {
        let out = Command::new("setfattr")
            .args(["-n", name, "-v", value])
            .arg(path)
            .output()
            .unwrap();
        if out.status.success() {
            return Ok(());
        }
        let msg = String::from_utf8_lossy(&out.stderr);
        return Err(if msg.contains("Invalid argument") {
            libc::EINVAL
        } else {
            panic!("setfattr: {msg}")
        });
    }
    let (p, n) = (cstr(path), std::ffi::CString::new(name).unwrap());
    let r = unsafe {
        libc::setxattr(
            p.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(errno())
    }
}

/// `user.ldfs.compress` of `path` (getxattr(2)), if it has one.
fn policy(path: &Path) -> Option<String> {
    let (p, n) = (
        cstr(path),
        std::ffi::CString::new("user.ldfs.compress").unwrap(),
    );
    let mut buf = [0u8; 64];
    let r = unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), 64) };
    (r >= 0).then(|| String::from_utf8_lossy(&buf[..r as usize]).into_owned())
}

/// `ldfs stats` figures of compressing lists: (logical, stored).
fn compression_stats(mnt: &Path) -> (u64, u64) {
    let out = ldfs().arg("stats").arg(mnt).succeeds();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let line = text
        .lines()
        .find(|l| l.starts_with("compression since mount:"))
        .unwrap_or_else(|| panic!("no compression line in:\n{text}"));
    let nums: Vec<u64> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|w| w.parse().ok())
        .collect();
    (nums[0], nums[1])
}

#[test]
fn a_directorys_policy_compresses_what_is_written_there() {
    if !fuse_usable() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let img = t.path().join("c.img");
    mkfs(&img, "128M");
    let mnt = t.path().join("mnt");
    let m = Mount::new(&img, &mnt, &[]);
    fs::create_dir(mnt.join("src")).unwrap();
    fs::create_dir(mnt.join("plain")).unwrap();
    assert_eq!(
        setfattr(&mnt.join("src"), "user.ldfs.compress", "zstd:5"),
        Ok(())
    );
    assert_eq!(
        setfattr(&mnt.join("src"), "user.ldfs.compress", "zstd:99"),
        Err(libc::EINVAL)
    );
    assert_eq!(
        setfattr(&mnt.join("src"), "user.ldfs.compress", "gzip"),
        Err(libc::EINVAL)
    );
    fs::create_dir(mnt.join("src/sub")).unwrap();
    let mut written = 0u64;
    for i in 0..16 {
        let b = source(i, 64 << 10);
        written += b.len() as u64;
        fs::write(mnt.join(format!("src/sub/f{i}.rs")), &b).unwrap();
        fs::write(mnt.join(format!("plain/f{i}.rs")), &b).unwrap();
    }
    ldfs().arg("sync").arg(&mnt).succeeds();
    let (logical, stored) = compression_stats(&mnt);
    // Only src/ compresses: its bytes, written through the page cache,
    // may reach ldfs in pieces, but all of them.
    assert!(logical >= written, "{logical} logical of {written}");
    assert!(stored * 3 < logical, "{stored} stored of {logical}");
    for i in 0..16 {
        let b = source(i, 64 << 10);
        assert!(fs::read(mnt.join(format!("src/sub/f{i}.rs"))).unwrap() == b);
        assert!(fs::read(mnt.join(format!("plain/f{i}.rs"))).unwrap() == b);
    }
    assert_eq!(
        policy(&mnt.join("src/sub/f3.rs")).as_deref(),
        Some("zstd:5")
    );
    m.unmount();

    // After the unmount: inspect shows the blocks' forms and totals, and
    // the files read back through a new mount.
    let out = ldfs()
        .args(["inspect", "--json", "--path", "/src/sub/f0.rs"])
        .arg(&img)
        .succeeds();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let ino = &v["inode"];
    assert_eq!(ino["compress"], "zstd:5", "{ino}");
    assert_eq!(ino["logical_bytes"], 64 << 10, "{ino}");
    assert!(
        ino["stored_bytes"].as_u64().unwrap() * 3 < 64 << 10,
        "{ino}"
    );
    for b in ino["blocks"].as_array().unwrap() {
        assert_eq!(b["compression"], "zstd", "{b}");
        assert_eq!(b["logical_length"], 4096, "{b}");
    }
    let out = ldfs()
        .args(["inspect", "--path", "/plain/f0.rs"])
        .arg(&img)
        .succeeds();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("compress     off"), "{text}");
    assert!(!text.contains("zstd"), "{text}");
    let m = Mount::new(&img, &mnt, &[]);
    for i in 0..16 {
        assert!(fs::read(mnt.join(format!("src/sub/f{i}.rs"))).unwrap() == source(i, 64 << 10));
    }
    m.unmount();
}

#[test]
fn the_mount_option_compresses_every_new_file() {
    if !fuse_usable() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let img = t.path().join("o.img");
    mkfs(&img, "64M");
    let mnt = t.path().join("mnt");
    let out = ldfs()
        .args(["mount", "-o", "compress=zstd:42"])
        .arg(&img)
        .arg(&mnt)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("compress=zstd:42"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let m = Mount::new(&img, &mnt, &["compress=lz4"]);
    let b = source(1, 256 << 10);
    fs::write(mnt.join("f"), &b).unwrap();
    // Bytes that compress poorly read back as well.
    let noise: Vec<u8> = (0..64u32 << 10)
        .map(|k| (k.wrapping_mul(2_654_435_761) >> 13) as u8 ^ (k >> 3) as u8)
        .collect();
    fs::write(mnt.join("noise"), &noise).unwrap();
    ldfs().arg("sync").arg(&mnt).succeeds();
    let (logical, stored) = compression_stats(&mnt);
    assert!(logical >= (b.len() + noise.len()) as u64, "{logical}");
    assert!(stored < logical / 2, "{stored} of {logical}");
    assert!(fs::read(mnt.join("f")).unwrap() == b);
    assert!(fs::read(mnt.join("noise")).unwrap() == noise);
    m.unmount();
}

/// `chattr +c` / `-c` / `lsattr` through FS_IOC_SETFLAGS and GETFLAGS, on
/// `mnt`: `c` on a directory sets its policy (the mount's, zstd when that
/// is off), files made there inherit it and are stored compressed; `-c` on
/// one file turns it off (`user.ldfs.compress` = off); a flag ldfs does
/// not keep (`+i`) is EOPNOTSUPP and changes nothing.
pub fn chattr_c_sets_the_compression_policy(mnt: &Path) {
    const COMPR: u32 = 0x4;
    const IMMUTABLE: u32 = 0x10;
    let d = mnt.join("cdir");
    fs::create_dir(&d).unwrap();
    assert_eq!(common::get_flags(&d), Ok(0));
    common::set_flags(&d, COMPR).unwrap();
    assert_eq!(common::get_flags(&d), Ok(COMPR));
    assert_eq!(policy(&d).as_deref(), Some("zstd:3"));
    let (l0, s0) = compression_stats(mnt);
    let b = source(7, 256 << 10);
    fs::write(d.join("f.rs"), &b).unwrap();
    ldfs().arg("sync").arg(mnt).succeeds();
    let (l1, s1) = compression_stats(mnt);
    assert!(l1 - l0 >= b.len() as u64, "{l0} -> {l1} logical");
    assert!((s1 - s0) * 3 < l1 - l0, "{s0} -> {s1} stored");
    assert_eq!(common::get_flags(&d.join("f.rs")), Ok(COMPR));
    common::set_flags(&d.join("f.rs"), 0).unwrap();
    assert_eq!(common::get_flags(&d.join("f.rs")), Ok(0));
    assert_eq!(policy(&d.join("f.rs")).as_deref(), Some("off"));
    assert_eq!(common::get_flags(&d), Ok(COMPR), "the directory kept c");
    assert_eq!(
        common::set_flags(&d.join("f.rs"), IMMUTABLE),
        Err(libc::EOPNOTSUPP)
    );
    assert_eq!(common::get_flags(&d.join("f.rs")), Ok(0));
    assert!(fs::read(d.join("f.rs")).unwrap() == b);
    // The tools, where e2fsprogs is installed.
    if Command::new("lsattr").arg("-v").output().is_ok() {
        Command::new("chattr")
            .arg("+c")
            .arg(d.join("f.rs"))
            .succeeds();
        let out = Command::new("lsattr").arg(d.join("f.rs")).succeeds();
        let text = String::from_utf8_lossy(&out.stdout);
        let flags = text.split_whitespace().next().unwrap_or("");
        assert!(flags.contains('c'), "{text}");
        assert_eq!(policy(&d.join("f.rs")).as_deref(), Some("zstd:3"));
    }
}

#[test]
fn chattr_c_over_dev_fuse() {
    if !fuse_usable() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let img = t.path().join("c.img");
    mkfs(&img, "128M");
    let mnt = t.path().join("mnt");
    let m = Mount::new(&img, &mnt, &["transport=dev"]);
    chattr_c_sets_the_compression_policy(&mnt);
    m.unmount();
    // With compress=lz4, +c takes the mount's policy.
    let m = Mount::new(&img, &mnt, &["transport=dev", "compress=lz4"]);
    fs::create_dir(mnt.join("x")).unwrap();
    assert_eq!(
        common::get_flags(&mnt.join("x")),
        Ok(0x4),
        "compress=lz4 shows c"
    );
    common::set_flags(&mnt.join("x"), 0).unwrap();
    common::set_flags(&mnt.join("x"), 0x4).unwrap();
    assert_eq!(policy(&mnt.join("x")).as_deref(), Some("lz4"));
    m.unmount();
}

/// `mount -o remount,compress=V` changes the policy of new files on a live
/// mount: a file written after `remount,compress=zstd` is stored
/// compressed and shows `c`, one written after `remount,compress=off` is
/// stored plain; files already written keep their form. `compress_cold=`
/// is still refused at a remount.
#[test]
fn a_remount_changes_the_policy_of_new_files() {
    if !fuse_usable() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let img = t.path().join("r.img");
    mkfs(&img, "128M");
    let mnt = t.path().join("mnt");
    let m = Mount::new(&img, &mnt, &[]);
    let remount = |opt: &str| {
        ldfs()
            .args(["mount", "-o", &format!("remount,{opt}")])
            .arg(&img)
            .arg(&mnt)
            .output()
            .unwrap()
    };
    let b = source(3, 256 << 10);
    fs::write(mnt.join("before.rs"), &b).unwrap();
    assert_eq!(common::get_flags(&mnt.join("before.rs")), Ok(0));
    let out = remount("compress=zstd");
    assert!(out.status.success(), "{out:?}");
    let (l0, s0) = compression_stats(&mnt);
    fs::write(mnt.join("after.rs"), &b).unwrap();
    ldfs().arg("sync").arg(&mnt).succeeds();
    let (l1, s1) = compression_stats(&mnt);
    assert!(l1 - l0 >= b.len() as u64, "{l0} -> {l1} logical");
    assert!((s1 - s0) * 3 < l1 - l0, "{s0} -> {s1} stored");
    assert_eq!(common::get_flags(&mnt.join("after.rs")), Ok(0x4));
    assert_eq!(
        common::get_flags(&mnt.join("before.rs")),
        Ok(0),
        "a file with data keeps its list's policy"
    );
    let out = remount("compress=off");
    assert!(out.status.success(), "{out:?}");
    let (l2, s2) = compression_stats(&mnt);
    fs::write(mnt.join("plain.rs"), &b).unwrap();
    ldfs().arg("sync").arg(&mnt).succeeds();
    let (l3, s3) = compression_stats(&mnt);
    assert_eq!(
        (l3, s3),
        (l2, s2),
        "compress=off still compressed new files"
    );
    assert_eq!(common::get_flags(&mnt.join("plain.rs")), Ok(0));
    let out = remount("compress=gzip");
    assert!(!out.status.success(), "a bad value accepted at a remount");
    let out = remount("compress_cold=zstd:9");
    assert!(!out.status.success());
    for f in ["before.rs", "after.rs", "plain.rs"] {
        assert!(fs::read(mnt.join(f)).unwrap() == b, "{f}");
    }
    m.unmount();
}
