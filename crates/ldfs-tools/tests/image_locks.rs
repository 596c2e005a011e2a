//! Review 21: the 30 s entry timeout and negative entries (a067e1b,
//! 32dd4f2) rest on "every name changes through this mount, which the
//! image's lock makes the only one". These check the commands that open an
//! image for writing while it may be mounted.

mod common;

use std::fs;

use common::{fuse_usable, ldfs, mkfs, Mount};

/// `ldfs clean IMAGE` (an image path, not a mount point) opens the image
/// read-write and cleans it: while a daemon has it mounted that is a
/// second writer behind the daemon's back (and behind the kernel's dentry
/// cache). It must be refused like a second mount or `fsck`.
#[test]
fn offline_clean_of_a_mounted_image_is_refused() {
    if !fuse_usable() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let img = t.path().join("c.img");
    mkfs(&img, "64M");
    let mnt = t.path().join("mnt");
    let m = Mount::new(&img, &mnt, &[]);
    // Dead space for the cleaner to find, made durable.
    for round in 0..3u8 {
        for i in 0..40 {
            fs::write(m.path(&format!("f{i}")), vec![round; 256 << 10]).unwrap();
        }
    }
    ldfs().arg("sync").arg(&mnt).output().unwrap();
    ldfs().args(["checkpoint"]).arg(&mnt).output().unwrap();
    let out = ldfs()
        .arg("clean")
        .arg(&img)
        .args(["--policy", "greedy", "--max-utilization", "90"])
        .output()
        .unwrap();
    let ran = out.status.success();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // Whatever happened, the daemon goes on and ends.
    for i in 0..40 {
        let _ = fs::write(m.path(&format!("g{i}")), vec![7u8; 256 << 10]);
    }
    m.unmount();
    let fsck = ldfs().args(["fsck", "-n"]).arg(&img).output().unwrap();
    let fsck_text = format!(
        "{}{}",
        String::from_utf8_lossy(&fsck.stdout),
        String::from_utf8_lossy(&fsck.stderr)
    );
    assert!(
        !ran,
        "`ldfs clean IMAGE` ran on a mounted image: {text}\nfsck -n after: ok={} {fsck_text}",
        fsck.status.success()
    );
}

/// `ldfs mkfs IMAGE` (no --size: an existing file formatted as it is)
/// while the image is mounted formats it under the daemon.
#[test]
fn mkfs_of_a_mounted_image_is_refused() {
    if !fuse_usable() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let img = t.path().join("m.img");
    mkfs(&img, "64M");
    let mnt = t.path().join("mnt");
    let m = Mount::new(&img, &mnt, &[]);
    fs::write(m.path("keep"), b"kept").unwrap();
    ldfs().arg("sync").arg(&mnt).output().unwrap();
    let out = ldfs().arg("mkfs").arg(&img).output().unwrap();
    let ran = out.status.success();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    m.unmount();
    assert!(!ran, "`ldfs mkfs IMAGE` formatted a mounted image: {text}");
}
