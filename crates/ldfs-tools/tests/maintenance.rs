//! Scrub and TRIM through a real mount (issue 17): `ldfs scrub MNT` reads
//! everything and exits 0 on a sound file system, and names a damaged
//! block by path and offset (exit 4); `ldfs trim MNT` and `-o discard` give
//! the segments deletes emptied back to the image file, which shrinks on
//! the host; `ldfs trim IMAGE` does the same unmounted.

mod common;

use std::fs;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;

use common::{fuse_usable, ldfs, mkfs, Mount};

fn run(args: &[&str], target: &Path) -> (i32, String) {
    let out = ldfs().args(args).arg(target).output().unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), text)
}

/// Bytes the host holds for `img`.
fn host_bytes(img: &Path) -> u64 {
    fs::metadata(img).unwrap().blocks() * 512
}

fn data(i: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|k| (k * 7 + i * 131 + k / 4096) as u8)
        .collect()
}

/// Writes 24 files of 1 MiB and syncs them.
fn fill(mnt: &Path) {
    for i in 0..24 {
        fs::write(mnt.join(format!("f{i}")), data(i, 1 << 20)).unwrap();
    }
    let (code, text) = run(&["sync"], mnt);
    assert_eq!(code, 0, "{text}");
}

fn delete_and_checkpoint(mnt: &Path) {
    for i in 0..24 {
        fs::remove_file(mnt.join(format!("f{i}"))).unwrap();
    }
    let (code, text) = run(&["sync"], mnt);
    assert_eq!(code, 0, "{text}");
    // The checkpoint releases the emptied segments.
    let (code, text) = run(&["checkpoint"], mnt);
    assert_eq!(code, 0, "{text}");
}

#[test]
fn scrub_a_mount_finds_nothing_then_the_damaged_block() {
    if !fuse_usable() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let img = t.path().join("s.img");
    mkfs(&img, "64M");
    let mnt = t.path().join("mnt");
    let m = Mount::new(&img, &mnt, &[]);
    fs::create_dir(mnt.join("d")).unwrap();
    let want = data(7, 40_000);
    fs::write(mnt.join("d/victim"), &want).unwrap();
    fs::write(mnt.join("small"), b"inline").unwrap();
    let (code, text) = run(&["scrub", "--rate", "64M"], &mnt);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("no damage"), "{text}");
    let (code, text) = run(&["scrub", "--json"], &mnt);
    assert_eq!(code, 0, "{text}");
    let v: serde_json::Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    assert_eq!(v["damaged"], 0, "{v}");
    assert!(v["bytes"].as_u64().unwrap() >= want.len() as u64, "{v}");
    m.unmount();

    // Damage block 3 of /d/victim in the image, then scrub the mount.
    let out = ldfs()
        .args(["inspect", "--json", "--path", "/d/victim"])
        .arg(&img)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let b3 = v["inode"]["blocks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["index"] == 3)
        .unwrap_or_else(|| panic!("no block 3 in {v}"))
        .clone();
    let off = b3["offset"].as_u64().unwrap();
    let f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&img)
        .unwrap();
    let mut byte = [0u8; 1];
    f.read_exact_at(&mut byte, off + 100).unwrap();
    f.write_all_at(&[byte[0] ^ 0x5a], off + 100).unwrap();
    drop(f);
    let m = Mount::new(&img, &mnt, &[]);
    let (code, text) = run(&["scrub"], &mnt);
    assert_eq!(code, 4, "{text}");
    assert!(text.contains("/d/victim"), "{text}");
    assert!(text.contains("offset 12288"), "{text}");
    assert!(text.contains("1 damaged blocks"), "{text}");
    // The rest of the file system is as it was, and still writable.
    assert_eq!(fs::read(mnt.join("small")).unwrap(), b"inline");
    fs::write(mnt.join("after"), b"x").unwrap();
    m.unmount();
    // Not a mount point: a clear error, exit 8.
    let (code, text) = run(&["scrub"], t.path());
    assert_eq!(code, 8, "{text}");
    assert!(text.contains("not a mounted ldfs"), "{text}");
}

#[test]
fn trim_and_discard_give_emptied_segments_back_to_the_image_file() {
    if !fuse_usable() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let mnt = t.path().join("mnt");

    // ldfs trim MNT, on a mount without `discard`.
    let img = t.path().join("t.img");
    mkfs(&img, "128M");
    let m = Mount::new(&img, &mnt, &[]);
    fill(&mnt);
    let full = host_bytes(&img);
    delete_and_checkpoint(&mnt);
    let (code, text) = run(&["trim"], &mnt);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("trimmed"), "{text}");
    let trimmed = host_bytes(&img);
    assert!(
        trimmed + (16 << 20) <= full,
        "{full} bytes on the host before the trim, {trimmed} after: {text}"
    );
    // Still a sound file system that takes new data.
    fs::write(mnt.join("new"), data(99, 300_000)).unwrap();
    m.unmount();
    let (code, text) = run(&["fsck", "-n"], &img);
    assert_eq!(code, 0, "{text}");

    // -o discard: the checkpoint that releases them gives them back.
    let img = t.path().join("d.img");
    mkfs(&img, "128M");
    let m = Mount::new(&img, &mnt, &["discard"]);
    fill(&mnt);
    let full = host_bytes(&img);
    delete_and_checkpoint(&mnt);
    let after = host_bytes(&img);
    assert!(
        after + (16 << 20) <= full,
        "{full} bytes on the host before the deletes, {after} after"
    );
    let (_, stats) = run(&["stats"], &mnt);
    assert!(!stats.contains("segments discarded: 0\n"), "{stats}");
    m.unmount();

    // ldfs trim IMAGE, unmounted.
    let img = t.path().join("u.img");
    mkfs(&img, "128M");
    let m = Mount::new(&img, &mnt, &[]);
    fill(&mnt);
    let full = host_bytes(&img);
    delete_and_checkpoint(&mnt);
    m.unmount();
    let (code, text) = run(&["trim"], &img);
    assert_eq!(code, 0, "{text}");
    assert!(host_bytes(&img) + (16 << 20) <= full, "{text}");
    let (code, text) = run(&["fsck", "-n"], &img);
    assert_eq!(code, 0, "{text}");
}

/// On a mounted dual pair `ldfs trim MNT` also gives the data device's
/// free blocks back: the data image, full of deleted files' blocks (mkfs
/// writes it whole), shrinks on the host by at least what was deleted,
/// the files kept read back, and fsck is clean.
#[test]
fn trim_on_a_dual_mount_gives_free_data_blocks_back() {
    if !fuse_usable() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let (img, meta, mnt) = (
        t.path().join("data.img"),
        t.path().join("meta.img"),
        t.path().join("mnt"),
    );
    common::mkfs_dual(&img, &meta, "128M");
    let m = Mount::new(&img, &mnt, &[]);
    fill(&mnt);
    let full = host_bytes(&img);
    for i in 0..20 {
        fs::remove_file(mnt.join(format!("f{i}"))).unwrap();
    }
    let (code, text) = run(&["sync"], &mnt);
    assert_eq!(code, 0, "{text}");
    let (code, text) = run(&["trim"], &mnt);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("the data device:"), "{text}");
    let after = host_bytes(&img);
    assert!(
        after + (20 << 20) <= full,
        "{full} bytes on the host before the trim, {after} after: {text}"
    );
    for i in 20..24 {
        assert!(fs::read(mnt.join(format!("f{i}"))).unwrap() == data(i, 1 << 20));
    }
    fs::write(mnt.join("new"), data(99, 3 << 20)).unwrap();
    m.unmount();
    let (code, text) = run(&["fsck", "-n"], &img);
    assert_eq!(code, 0, "{text}");

    // -o discard: the commit that makes the deletes durable gives their
    // blocks back.
    let m = Mount::new(&img, &mnt, &["discard"]);
    fill(&mnt);
    let full = host_bytes(&img);
    for i in 0..20 {
        fs::remove_file(mnt.join(format!("f{i}"))).unwrap();
    }
    let (code, text) = run(&["sync"], &mnt);
    assert_eq!(code, 0, "{text}");
    let after = host_bytes(&img);
    assert!(
        after + (20 << 20) <= full,
        "{full} bytes on the host before the deletes, {after} after"
    );
    let (_, stats) = run(&["stats"], &mnt);
    assert!(
        !stats.contains(" 0 blocks discarded since mount"),
        "{stats}"
    );
    for i in 20..24 {
        assert!(fs::read(mnt.join(format!("f{i}"))).unwrap() == data(i, 1 << 20));
    }
    m.unmount();
    let (code, text) = run(&["fsck", "-n"], &img);
    assert_eq!(code, 0, "{text}");
}
