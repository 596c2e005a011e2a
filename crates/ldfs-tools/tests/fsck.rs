//! `ldfs fsck` from outside, on real image files: for every kind of damage
//! fsck claims to repair, the damage is made in an image written with the
//! library (targeted writes through the engine, or bytes flipped on the
//! file), then `fsck -n` must exit 4 naming it and change no byte, `fsck -y`
//! must exit 1, a second `fsck -n` must exit 0, and the data that was
//! recoverable must be there. Also: exit codes for a fresh image, usage
//! errors and garbage, and the `fsck.ldfs` name.

use std::path::{Path, PathBuf};
use std::process::Command;

mod common;
use common::{ldfs, Succeeds};
use std::sync::Arc;

use ldfs::device::{Device, FileDevice, FileDeviceOptions};
use ldfs::fs::dir;
use ldfs::fs::inode::Inode;
use ldfs::fs::{Ctx, Fs, FsOptions, ROOT_INO};
use ldfs::ld::{ListId, LogicalDisk};
use ldfs::lld::layout::MkfsOptions;
use ldfs::lld::summary::Record;
use ldfs::lld::{Lld, LldOptions, SegmentId};

/// The inode list (docs/FORMAT.md, "File system").
const INODE_LIST: ListId = ListId(2);
const CTX: Ctx = Ctx {
    uid: 0,
    gid: 0,
    umask: 0,
};

/// Runs `ldfs fsck ARGS IMAGE`; returns (exit code, stdout + stderr).
fn fsck(args: &[&str], img: &Path) -> (i32, String) {
    let out = ldfs().arg("fsck").args(args).arg(img).output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

/// Changes the image's bytes at `at` as `f` says (damage for a test).
fn damage(img: &Path, at: u64, len: usize, f: impl FnOnce(&mut [u8])) {
    let dev = FileDevice::open(img, FileDeviceOptions::default()).unwrap();
    let mut b = vec![0u8; len];
    dev.read_at(&mut b, at).unwrap();
    f(&mut b);
    dev.write_at(&b, at).unwrap();
    dev.flush().unwrap();
}

fn digest(img: &Path) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    std::fs::read(img).unwrap().hash(&mut h);
    h.finish()
}

fn open(img: &Path) -> (Arc<Lld>, Fs) {
    let dev: Arc<dyn Device> =
        Arc::new(FileDevice::open(img, FileDeviceOptions::default()).unwrap());
    let lld = Arc::new(Lld::open(dev, LldOptions::default()).unwrap());
    let ld: Arc<dyn LogicalDisk> = lld.clone();
    let fs = Fs::mount(ld, FsOptions::default()).unwrap();
    (lld, fs)
}

fn close(lld: Arc<Lld>, fs: Fs) {
    drop(fs);
    lld.close().unwrap();
}

/// The contents every image starts with: /d/f<i> (200 files, some large),
/// /keep (10 KiB) and a hard link /d/link to /keep.
fn content(i: usize) -> Vec<u8> {
    let n = if i.is_multiple_of(10) { 6000 } else { 100 + i };
    (0..n).map(|k| (k * 7 + i) as u8).collect()
}

fn make_image(dir: &Path) -> PathBuf {
    let img = dir.join("t.img");
    let dev: Arc<dyn Device> =
        Arc::new(FileDevice::create(&img, 32 << 20, FileDeviceOptions::default()).unwrap());
    let lld = Arc::new(
        Lld::create(
            dev,
            &MkfsOptions {
                segment_bytes: 256 << 10,
                max_block_bytes: 64 << 10,
                reserved_segments: None,
                fs_id: 0,
                max_bytes: None,
                kept_pages: 0,
            },
            LldOptions::default(),
        )
        .unwrap(),
    );
    Fs::format(&*lld, CTX).unwrap();
    let ld: Arc<dyn LogicalDisk> = lld.clone();
    let fs = Fs::mount(ld, FsOptions::default()).unwrap();
    let d = fs.mkdir(CTX, ROOT_INO, b"d", 0o755).unwrap().ino;
    for i in 0..200 {
        let a = fs
            .mknod(CTX, d, format!("f{i}").as_bytes(), 0o100644, 0)
            .unwrap();
        fs.write(a.ino, 0, &content(i)).unwrap();
    }
    let keep = fs.mknod(CTX, ROOT_INO, b"keep", 0o100644, 0).unwrap().ino;
    fs.write(keep, 0, &vec![0x5a; 10 << 10]).unwrap();
    fs.link(keep, d, b"link").unwrap();
    lld.checkpoint_now().unwrap();
    // Some more after the checkpoint, so both slots and roll-forward matter.
    fs.write(keep, 10 << 10, b"tail").unwrap();
    close(lld, fs);
    img
}

fn read_all(fs: &Fs, ino: u64) -> Vec<u8> {
    let size = fs.getattr(ino).unwrap().size;
    fs.read(ino, 0, size as u32).unwrap()
}

/// The data every repaired image must still hold (`lost` names files that
/// the damage unlinked: they must be found in /lost+found instead).
fn assert_content(img: &Path, lost: &[&str]) {
    let (lld, fs) = open(img);
    let d = fs.lookup(ROOT_INO, b"d").unwrap().ino;
    let lf = fs.lookup(ROOT_INO, b"lost+found").ok().map(|a| a.ino);
    for i in 0..200 {
        let name = format!("f{i}");
        let ino = match fs.lookup(d, name.as_bytes()) {
            Ok(a) => a.ino,
            Err(e) => {
                assert!(lost.contains(&name.as_str()), "/d/{name}: {e}");
                let lf = lf.expect("lost+found exists");
                let entries = fs.readdir(lf, 0, 10_000).unwrap();
                let e = entries
                    .iter()
                    .find(|e| e.name.starts_with(b"#") && read_all(&fs, e.ino) == content(i))
                    .unwrap_or_else(|| panic!("{name} is not in lost+found"));
                e.ino
            }
        };
        assert!(
            read_all(&fs, ino) == content(i),
            "/d/{name}: wrong contents"
        );
    }
    let keep = fs.lookup(ROOT_INO, b"keep").unwrap();
    let mut want = vec![0x5a; 10 << 10];
    want.extend_from_slice(b"tail");
    let got = read_all(&fs, keep.ino);
    assert!(
        got == want,
        "/keep: {} bytes, expected {}; first difference at {:?}",
        got.len(),
        want.len(),
        got.iter().zip(&want).position(|(a, b)| a != b)
    );
    assert_eq!(fs.lookup(d, b"link").unwrap().ino, keep.ino);
    assert!(fs.check().unwrap().problems.is_empty());
    close(lld, fs);
}

/// The damage cycle: -n reports `needle` (exit 4, nothing written), -y
/// repairs (exit 1), -n is then clean (exit 0), the data is there.
fn cycle(img: &Path, needle: &str, lost: &[&str]) {
    let before = digest(img);
    let (code, text) = fsck(&["-n"], img);
    assert_eq!(code, 4, "fsck -n on damage ({needle}):\n{text}");
    assert!(
        text.contains(needle),
        "fsck -n should name {needle:?}:\n{text}"
    );
    assert_eq!(digest(img), before, "fsck -n wrote to the image");
    let (code, text) = fsck(&["-y"], img);
    assert_eq!(code, 1, "fsck -y ({needle}):\n{text}");
    let (code, text2) = fsck(&["-n"], img);
    assert_eq!(
        code, 0,
        "fsck -n after -y ({needle}):\n{text}\n---\n{text2}"
    );
    assert_content(img, lost);
}

fn inode_of(fs: &Fs, path: &[&[u8]]) -> u64 {
    let mut ino = ROOT_INO;
    for p in path {
        ino = fs.lookup(ino, p).unwrap().ino;
    }
    ino
}

fn read_inode(ld: &dyn LogicalDisk, ino: u64) -> Inode {
    Inode::decode(ino, &ld.read(INODE_LIST, ino).unwrap().unwrap(), 0).unwrap()
}

#[test]
fn fresh_image_is_clean_and_n_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("fresh.img");
    ldfs()
        .args(["mkfs", "--size", "64M", "--segment-size", "1M"])
        .arg(&img)
        .succeeds();
    let before = digest(&img);
    let (code, text) = fsck(&["-n"], &img);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("0 problems found"), "{text}");
    assert_eq!(digest(&img), before);
    let (code, text) = fsck(&["-y", "-f"], &img);
    assert_eq!(code, 0, "{text}");
    // Invoked as fsck.ldfs (what `fsck -t ldfs` runs).
    let link = dir.path().join("fsck.ldfs");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_ldfs"), &link).unwrap();
    let out = Command::new(&link).arg("-n").arg(&img).output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let img2 = make_image(dir.path());
    let (code, text) = fsck(&["-n"], &img2);
    assert_eq!(code, 0, "{text}");
}

#[test]
fn usage_and_operational_errors() {
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk.img");
    std::fs::write(&junk, vec![0x33u8; 1 << 20]).unwrap();
    assert_eq!(fsck(&["-n"], &junk).0, 8);
    assert_eq!(fsck(&["-n"], &dir.path().join("missing.img")).0, 8);
    assert_eq!(fsck(&["-n", "-y"], &junk).0, 16);
    assert_eq!(fsck(&["--bogus"], &junk).0, 16);
    let out = ldfs().arg("fsck").output().unwrap();
    assert_eq!(out.status.code(), Some(16));
}

#[test]
fn wrong_link_count() {
    let dir = tempfile::tempdir().unwrap();
    let img = make_image(dir.path());
    let (lld, fs) = open(&img);
    let ino = inode_of(&fs, &[b"d", b"f3"]);
    let mut i = read_inode(&*lld, ino);
    i.nlink = 5;
    lld.write(None, INODE_LIST, ino, &i.encode()).unwrap();
    close(lld, fs);
    cycle(&img, "wrong link count", &[]);
}

#[test]
fn unreachable_inode_goes_to_lost_found() {
    let dir = tempfile::tempdir().unwrap();
    let img = make_image(dir.path());
    let (lld, fs) = open(&img);
    let d = read_inode(&*lld, inode_of(&fs, &[b"d"]));
    // Drop the entry f7 from its bucket, leaving its inode behind.
    let idx = dir::bucket(b"f7");
    let raw = lld.read(ListId(d.list), idx).unwrap().unwrap();
    let mut entries = dir::decode(&raw, d.ino, idx).unwrap();
    entries.retain(|e| e.name != b"f7");
    if entries.is_empty() {
        lld.delete(None, ListId(d.list), idx).unwrap();
    } else {
        lld.write(None, ListId(d.list), idx, &dir::encode(&entries))
            .unwrap();
    }
    close(lld, fs);
    cycle(&img, "unreachable", &["f7"]);
}

#[test]
fn dangling_directory_entry_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let img = make_image(dir.path());
    let (lld, fs) = open(&img);
    let d = read_inode(&*lld, inode_of(&fs, &[b"d"]));
    let idx = dir::bucket(b"ghost");
    assert!(lld.read(ListId(d.list), idx).unwrap().is_none());
    let e = dir::Entry {
        name: b"ghost".to_vec(),
        ino: 999_999,
        kind: 0,
    };
    lld.write(None, ListId(d.list), idx, &dir::encode(&[e]))
        .unwrap();
    close(lld, fs);
    cycle(&img, "dangling entry", &[]);
    let (lld, fs) = open(&img);
    assert!(fs.lookup(inode_of(&fs, &[b"d"]), b"ghost").is_err());
    close(lld, fs);
}

#[test]
fn corrupt_directory_index_is_rebuilt() {
    let dir = tempfile::tempdir().unwrap();
    let img = make_image(dir.path());
    let (lld, fs) = open(&img);
    let d = read_inode(&*lld, inode_of(&fs, &[b"d"]));
    // A bucket moved to the wrong index: every entry in it hashes elsewhere.
    let idx = dir::bucket(b"f11");
    let raw = lld.read(ListId(d.list), idx).unwrap().unwrap();
    lld.delete(None, ListId(d.list), idx).unwrap();
    assert!(lld.read(ListId(d.list), idx + 1).unwrap().is_none());
    lld.write(None, ListId(d.list), idx + 1, &raw).unwrap();
    // And a bucket of garbage: f12's entry is lost, its inode is not.
    let idx = dir::bucket(b"f12");
    lld.write(None, ListId(d.list), idx, b"\x02\x00garbage")
        .unwrap();
    close(lld, fs);
    cycle(&img, "damaged directory index", &["f12"]);
}

/// Finds a live leaf page of the map (on disk: a MapPage record of level 0
/// that the map still uses).
fn live_map_leaf(lld: &Lld) -> u64 {
    let g = lld.geometry();
    for s in 0..g.segment_count {
        for (h, recs) in lld.segment_summaries(SegmentId(s)).unwrap() {
            for r in recs {
                if let Record::MapPage {
                    level: 0, data_off, ..
                } = r
                {
                    let addr = g.page_addr(SegmentId(h.segment), h.page + h.summary_pages)
                        + data_off as u64;
                    if lld.map_page_is_live(addr) {
                        return addr;
                    }
                }
            }
        }
    }
    panic!("no live map leaf on the device");
}

#[test]
fn flipped_byte_in_a_map_page_is_rebuilt_from_the_summaries() {
    let dir = tempfile::tempdir().unwrap();
    let img = make_image(dir.path());
    let addr = {
        let (lld, fs) = open(&img);
        let a = live_map_leaf(&lld);
        close(lld, fs);
        a
    };
    damage(&img, addr + 200, 1, |b| b[0] ^= 0x10);
    cycle(&img, "the map cannot be read", &[]);
}

#[test]
fn lost_checkpoint_slot_is_rewritten() {
    let dir = tempfile::tempdir().unwrap();
    let img = make_image(dir.path());
    let dev = FileDevice::open(&img, FileDeviceOptions::default()).unwrap();
    let g = ldfs::lld::mkfs::read_superblock(&dev).unwrap().0;
    drop(dev);
    damage(&img, g.slot_addr(1) + 16, 64, |b| b.fill(0xee));
    cycle(&img, "checkpoint slot 1", &[]);
}

#[test]
fn damaged_superblock_copy_is_rewritten() {
    let dir = tempfile::tempdir().unwrap();
    let img = make_image(dir.path());
    damage(&img, 0, 8, |b| b.fill(0xee));
    cycle(&img, "superblock copy 0", &[]);
}

#[test]
fn a_mounted_image_is_checked_read_only() {
    let dir = tempfile::tempdir().unwrap();
    let img = make_image(dir.path());
    // The mount's exclusive lock stands for a mount (the FUSE tests cover
    // the mount itself).
    let f = std::fs::File::open(&img).unwrap();
    use std::os::fd::AsRawFd;
    let r = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    assert_eq!(r, 0, "could not take the lock");
    let before = digest(&img);
    let (code, text) = fsck(&["-y"], &img);
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains("WARNING") && text.contains("read-only"),
        "{text}"
    );
    assert_eq!(digest(&img), before);
    drop(f);
}

#[test]
fn a_list_no_inode_names_goes_to_lost_found_as_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let img = make_image(dir.path());
    let (lld, fs) = open(&img);
    // A data list with two blocks that no inode names (as when an inode
    // record is lost), and an empty one.
    let l = lld
        .create_list(None, ldfs::ld::ListHints::default())
        .unwrap();
    lld.write(None, l, 0, &[7u8; 4096]).unwrap();
    lld.write(None, l, 2, b"end").unwrap();
    let empty = lld
        .create_list(None, ldfs::ld::ListHints::default())
        .unwrap();
    close(lld, fs);
    cycle(&img, "is named by no inode", &[]);
    let (lld, fs) = open(&img);
    let lf = fs.lookup(ROOT_INO, b"lost+found").unwrap().ino;
    let a = fs.lookup(lf, format!("#list-{}", l.0).as_bytes()).unwrap();
    let got = read_all(&fs, a.ino);
    let mut want = vec![7u8; 4096];
    want.extend_from_slice(&[0u8; 4096]);
    want.extend_from_slice(b"end");
    assert!(got == want, "{} bytes", got.len());
    assert!(
        lld.list_hints(empty).unwrap().is_none(),
        "the empty list is deleted"
    );
    close(lld, fs);
}

#[test]
fn no_data_skips_data_checksums_only() {
    let dir = tempfile::tempdir().unwrap();
    let img = make_image(dir.path());
    // A data block of /keep with a flipped byte.
    let (lld, fs) = open(&img);
    let keep = read_inode(&*lld, inode_of(&fs, &[b"keep"]));
    let e = lld
        .map_entry(ldfs::lld::types::Key {
            list: keep.list,
            index: 1,
        })
        .unwrap()
        .unwrap();
    close(lld, fs);
    damage(&img, e.offset() + 100, 1, |b| b[0] ^= 1);
    let (code, text) = fsck(&["-n", "--no-data"], &img);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("metadata only"), "{text}");
    // Not a terminal: no progress line.
    assert!(!text.contains('\r'), "{text:?}");
    let (code, text) = fsck(&["-n"], &img);
    assert_eq!(code, 4, "{text}");
    assert!(text.contains("fails its checksum"), "{text}");
    // Metadata damage is still found without data checksums.
    let (lld, fs) = open(&img);
    let ino = inode_of(&fs, &[b"d", b"f3"]);
    let mut i = read_inode(&*lld, ino);
    i.nlink = 5;
    lld.write(None, INODE_LIST, ino, &i.encode()).unwrap();
    close(lld, fs);
    let (code, text) = fsck(&["-n", "--no-data"], &img);
    assert_eq!(code, 4, "{text}");
    assert!(text.contains("wrong link count"), "{text}");
}
