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
    let got = Command::new("getfattr")
        .args(["--only-values", "-n", "user.ldfs.compress"])
        .arg(mnt.join("src/sub/f3.rs"))
        .output();
    if let Ok(o) = got {
        assert_eq!(String::from_utf8_lossy(&o.stdout), "zstd:5");
    }
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
