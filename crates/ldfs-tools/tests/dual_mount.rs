//! `ldfs mkfs --meta META DATA` and mounting the pair: data survives an
//! unmount, META is found by the path recorded at mkfs or by `-o meta=`,
//! and a missing or mismatched META is refused, never mounted.

mod common;

use std::fs;

use common::{fuse_usable, ldfs, mkfs_dual, Mount};

fn mount_fails(data: &std::path::Path, dir: &std::path::Path, opts: &[&str]) -> String {
    let mut cmd = ldfs();
    cmd.arg("mount").arg("-f");
    for o in opts {
        cmd.args(["-o", o]);
    }
    let out = cmd.arg(data).arg(dir).output().unwrap();
    assert!(!out.status.success(), "mounted {opts:?}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn dual_pair_mounts_and_refuses_a_wrong_meta() {
    if !fuse_usable() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let (data, meta) = (t.path().join("data.img"), t.path().join("meta.img"));
    mkfs_dual(&data, &meta, "128M");
    assert_eq!(fs::metadata(&meta).unwrap().len(), 64 << 20, "at least 64M");
    let mnt = t.path().join("mnt");
    let m = Mount::new(&data, &mnt, &[]);
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i * 31 % 251) as u8).collect();
    fs::write(m.path("big"), &big).unwrap();
    fs::create_dir(m.path("d")).unwrap();
    fs::write(m.path("d/small"), b"small").unwrap();
    m.unmount();
    // The file's bytes are on the data image.
    assert!(fs::read(&data)
        .unwrap()
        .windows(64)
        .any(|w| w == &big[4096..4160]));

    let m = Mount::new(&data, &mnt, &[]);
    assert_eq!(fs::read(m.path("big")).unwrap(), big);
    assert_eq!(fs::read(m.path("d/small")).unwrap(), b"small");
    // `ldfs stats` shows the data device: its groups and bitmap, beside
    // the log's segments.
    let out = ldfs().arg("stats").arg(&mnt).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("segments:"), "{text}");
    assert!(text.contains("data device (dual):"), "{text}");
    assert!(text.contains("bitmap: 733 blocks allocated"), "{text}");
    assert!(text.contains("group 0: "), "{text}");
    m.unmount();

    // fsck finds META as mount does: clean, then a damaged data block.
    let fsck = |extra: &[&str]| {
        let out = ldfs().arg("fsck").args(extra).arg(&data).output().unwrap();
        (
            out.status.code().unwrap(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let (code, text) = fsck(&["-n"]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("dual file system"), "{text}");
    let mut img = fs::read(&data).unwrap();
    let at = img.windows(64).position(|w| w == &big[4096..4160]).unwrap();
    img[at] ^= 0xff;
    fs::write(&data, &img).unwrap();
    let (code, text) = fsck(&["-n"]);
    assert_eq!(code, 4, "{text}");
    assert!(text.contains("checksum mismatch"), "{text}");
    img[at] ^= 0xff;
    fs::write(&data, &img).unwrap();

    // inspect shows the groups, then the metadata log; it writes nothing.
    let before = fs::read(&data).unwrap();
    let out = ldfs().arg("inspect").arg(&data).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("groups of 32768 blocks"), "{text}");
    assert!(text.contains("group 0:"), "{text}");
    assert!(text.contains("metadata log:\nsuperblock"), "{text}");
    assert!(text.contains("bitmap: 733 blocks allocated"), "{text}");
    assert!(fs::read(&data).unwrap() == before);
    // ... and as JSON: the log's report with a `dual` member.
    let out = ldfs()
        .arg("inspect")
        .arg("--json")
        .arg(&data)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let d = &v["dual"];
    let groups = d["groups"].as_array().unwrap();
    assert_eq!(
        groups.len() as u64,
        d["blocks"].as_u64().unwrap().div_ceil(32768)
    );
    let free: u64 = groups.iter().map(|g| g["free"].as_u64().unwrap()).sum();
    assert_eq!(free, d["free_blocks"].as_u64().unwrap());
    assert_eq!(d["bitmap"]["allocated"].as_u64().unwrap(), 733);
    assert_eq!(
        free + 733,
        d["blocks"].as_u64().unwrap(),
        "every block free or allocated"
    );
    assert!(v["checkpoints"].as_array().is_some_and(|c| c.len() == 2));
    assert!(v["superblock"]["segment_count"].as_u64().unwrap() > 0);
    assert!(fs::read(&data).unwrap() == before);
    // --path: a file's data blocks on the data device, each in its group,
    // holding the file's bytes; a directory's blocks in the metadata log.
    let out = ldfs()
        .args(["inspect", "--json", "--path", "/big"])
        .arg(&data)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let blocks = v["inode"]["blocks"].as_array().unwrap();
    assert_eq!(blocks.len(), big.len().div_ceil(4096));
    let b1 = &blocks[1];
    assert_eq!(b1["index"].as_u64(), Some(1));
    let at = b1["data_block"].as_u64().unwrap();
    assert_eq!(b1["group"].as_u64(), Some(at / 32768));
    let off = b1["offset"].as_u64().unwrap() as usize;
    assert!(
        before[off..off + 4096] == big[4096..8192],
        "block 1 of /big is not at data block {at}"
    );
    let out = ldfs()
        .args(["inspect", "--path", "/d"])
        .arg(&data)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("kind         Dir"), "{text}");
    assert!(text.contains("segment"), "{text}");
    assert!(fs::read(&data).unwrap() == before);

    // Another pair's metadata: refused, and the images are untouched.
    let (data2, meta2) = (t.path().join("data2.img"), t.path().join("meta2.img"));
    mkfs_dual(&data2, &meta2, "128M");
    let before = fs::read(&meta2).unwrap();
    let opt = format!("meta={}", meta2.display());
    let err = mount_fails(&data, &mnt, &[&opt]);
    assert!(err.contains("belongs to file system"), "{err}");
    assert!(fs::read(&meta2).unwrap() == before);

    // Moved away: a clear error; found again with meta=.
    let moved = t.path().join("moved.img");
    fs::rename(&meta, &moved).unwrap();
    let err = mount_fails(&data, &mnt, &[]);
    assert!(err.contains("meta.img"), "{err}");
    let opt = format!("meta={}", moved.display());
    let m = Mount::new(&data, &mnt, &[&opt]);
    assert_eq!(fs::read(m.path("big")).unwrap(), big);
    m.unmount();
}

/// `ldfs fsck -y DATA` repairs a dual pair: a data block named by a file
/// but free in its group's bitmap, and a block allocated but named by
/// nothing (made through the library in a pair `ldfs mkfs --meta` made);
/// `-n` finds both (exit 4) and changes nothing, `-y` repairs (exit 1),
/// `-n` is then clean and the files read back.
#[test]
fn fsck_repairs_a_dual_pair() {
    use ldfs::device::{FileDevice, FileDeviceOptions};
    use ldfs::dual::{Dual, BITMAP_LIST, DESC_LIST};
    use ldfs::fs::{Ctx, Fs, FsOptions, ROOT_INO};
    use ldfs::ld::{ListId, LogicalDisk};
    use std::sync::Arc;
    let t = tempfile::tempdir().unwrap();
    let (data, meta) = (t.path().join("data.img"), t.path().join("meta.img"));
    mkfs_dual(&data, &meta, "128M");
    let open = || {
        let m = Arc::new(FileDevice::open(&meta, FileDeviceOptions::default()).unwrap());
        let d = Arc::new(FileDevice::open(&data, FileDeviceOptions::default()).unwrap());
        Arc::new(Dual::open(m, d, ldfs::lld::LldOptions::default()).unwrap())
    };
    let ctx = Ctx {
        uid: 0,
        gid: 0,
        umask: 0,
    };
    let bytes: Vec<u8> = (0..40_000u32).map(|i| (i % 253) as u8).collect();
    let dual = open();
    let ld: Arc<dyn LogicalDisk> = dual.clone();
    let fs = Fs::mount(ld, FsOptions::default()).unwrap();
    let f = fs.mknod(ctx, ROOT_INO, b"f", 0o100644, 0).unwrap().ino;
    fs.write(f, 0, &bytes).unwrap();
    let list = ListId(fs.inode_record(f).unwrap().list);
    let named = dual.data_block(list, 3).unwrap().unwrap();
    drop(fs);
    // The bitmap of its group: block `named` free, the group's last block
    // allocated; a descriptor to match.
    let g = named / 32768;
    let mut bm = dual.meta().read(BITMAP_LIST, g).unwrap().unwrap();
    let lo = g * 32768;
    let len = dual.stats().geo.group_len(g as u32) as u32;
    let leaked = lo + len as u64 - 1;
    bm[((named - lo) / 8) as usize] &= !(1 << ((named - lo) % 8));
    bm[((leaked - lo) / 8) as usize] |= 1 << ((leaked - lo) % 8);
    let used: u32 = bm.iter().map(|b| b.count_ones()).sum();
    dual.meta().write(None, BITMAP_LIST, g, &bm).unwrap();
    dual.meta()
        .write(
            None,
            DESC_LIST,
            g,
            &ldfs::dual::format::encode_desc(g as u32, len - used),
        )
        .unwrap();
    dual.close().unwrap();
    drop(dual);

    let fsck = |extra: &str| {
        let out = ldfs().arg("fsck").arg(extra).arg(&data).output().unwrap();
        (
            out.status.code().unwrap(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let before = (fs::read(&data).unwrap(), fs::read(&meta).unwrap());
    let (code, text) = fsck("-n");
    assert_eq!(code, 4, "{text}");
    assert!(
        text.contains(&format!("data block {named} is free in the bitmap")),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "data block {leaked} is allocated but named by nothing"
        )),
        "{text}"
    );
    assert!(
        before == (fs::read(&data).unwrap(), fs::read(&meta).unwrap()),
        "-n wrote"
    );
    let (code, text) = fsck("-y");
    assert_eq!(code, 1, "{text}");
    assert!(text.contains(&format!("FIXED: group {g}: bitmap and descriptor rewritten (1 named blocks that were free now allocated, 1 allocated blocks named by nothing freed)")), "{text}");
    let (code, text) = fsck("-n");
    assert_eq!(code, 0, "{text}");
    let dual = open();
    let ld: Arc<dyn LogicalDisk> = dual.clone();
    let fs = Fs::mount(ld, FsOptions::default()).unwrap();
    assert_eq!(fs.read(f, 0, 50_000).unwrap(), bytes);
    drop(fs);
    dual.close().unwrap();
}
