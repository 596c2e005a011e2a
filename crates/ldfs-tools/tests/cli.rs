//! The `ldfs` binary from outside: mkfs an image file, inspect it, and refuse bad input.

mod common;

use common::{ldfs, mkfs, Succeeds};

#[test]
fn mkfs_then_inspect() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("t.img");
    ldfs()
        .args(["mkfs", "--size", "64M", "--segment-size", "1M"])
        .arg(&img)
        .succeeds();
    assert_eq!(std::fs::metadata(&img).unwrap().len(), 64 << 20);
    let out = ldfs()
        .arg("inspect")
        .arg(&img)
        .args(["--segment", "0"])
        .succeeds();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("copy 0: ok") && text.contains("copy 1: ok"),
        "{text}"
    );
    // mkfs formats the engine, then creates the file system's root through
    // it: both slots hold checkpoints, the newer one naming the map.
    assert!(
        text.contains("checkpoint slot 0: serial 2 epoch 2"),
        "{text}"
    );
    assert!(
        text.contains("checkpoint slot 1: serial 3 epoch 2"),
        "{text}"
    );
    assert!(text.contains("map root at byte"), "{text}");
    assert!(
        text.contains("segments           63 x 256 pages") || text.contains(" x 256 pages"),
        "{text}"
    );
}

#[test]
fn inspect_of_garbage_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("junk.img");
    std::fs::write(&img, vec![0x5au8; 1 << 20]).unwrap();
    let out = ldfs().arg("inspect").arg(&img).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("corrupt superblock") && err.contains("bad magic"),
        "{err}"
    );
}

#[test]
fn mkfs_refuses_a_too_small_image_and_bad_sizes() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("small.img");
    let out = ldfs()
        .args(["mkfs", "--size", "1M"])
        .arg(&img)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("segments"));
    let out = ldfs()
        .args(["mkfs", "--size", "12Q"])
        .arg(&img)
        .output()
        .unwrap();
    assert!(!out.status.success());
}

/// `ldfs clean IMAGE` empties segments of an image left with dead space and
/// `inspect` reports the write cost.
#[test]
fn clean_an_unmounted_image_then_inspect() {
    use ldfs::device::{Device, FileDevice, FileDeviceOptions};
    use ldfs::ld::{ListHints, LogicalDisk};
    use ldfs::lld::{Lld, LldOptions};
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("c.img");
    ldfs()
        .args(["mkfs", "--size", "32M", "--segment-size", "256K"])
        .arg(&img)
        .succeeds();
    let l = {
        let dev: Arc<dyn Device> =
            Arc::new(FileDevice::open(&img, FileDeviceOptions::default()).unwrap());
        let lld = Lld::open(dev, LldOptions::default()).unwrap();
        let l = lld.create_list(None, ListHints::default()).unwrap();
        for round in 0..3u8 {
            for i in 0..1000u64 {
                if round == 0 || i % 3 != 0 {
                    lld.write(None, l, i, &[round; 4096]).unwrap();
                }
            }
        }
        lld.close().unwrap();
        l
    };
    let out = ldfs()
        .arg("clean")
        .arg(&img)
        .args(["--policy", "greedy", "--max-utilization", "90"])
        .succeeds();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("with greedy") && text.contains("segments released"),
        "{text}"
    );
    let released: u64 = text
        .split(": ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{text}"));
    assert!(released > 0, "{text}");
    let out = ldfs().arg("inspect").arg(&img).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("write cost (user + moved) / user = 1."),
        "{text}"
    );
    assert!(text.contains("dirty segments by utilization"), "{text}");
    let out = ldfs()
        .arg("clean")
        .arg(&img)
        .args(["--policy", "lru"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    // The data survived the cleaning.
    let dev: Arc<dyn Device> =
        Arc::new(FileDevice::open(&img, FileDeviceOptions::default()).unwrap());
    let lld = Lld::open(dev, LldOptions::default()).unwrap();
    for i in 0..1000u64 {
        let want = if i % 3 == 0 { 0u8 } else { 2 };
        assert_eq!(
            lld.read(l, i).unwrap().unwrap(),
            vec![want; 4096],
            "block {i}"
        );
    }
}

#[test]
fn mkfs_preallocate_writes_the_whole_image() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("pre.img");
    ldfs()
        .arg("mkfs")
        .arg("--preallocate")
        .args(["--size", "32M"])
        .arg(&img)
        .succeeds();
    let md = std::fs::metadata(&img).unwrap();
    assert_eq!(md.len(), 32 << 20);
    assert!(md.blocks() * 512 >= 32 << 20, "image is still sparse");
    let out = ldfs()
        .arg("mkfs")
        .arg("--preallocate")
        .arg(&img)
        .output()
        .unwrap();
    assert!(!out.status.success());
}

/// `inspect --path` and `--inode` show an inode's record and where its
/// blocks lie; `--json` says the same for scripts; a bad path is an error.
#[test]
fn inspect_an_inode_by_path_and_as_json() {
    use ldfs::device::{Device, FileDevice, FileDeviceOptions};
    use ldfs::fs::{Ctx, Fs, FsOptions, XattrMode, ROOT_INO};
    use ldfs::ld::LogicalDisk;
    use ldfs::lld::{Lld, LldOptions};
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("i.img");
    mkfs(&img, "32M");
    let ino = {
        let dev: Arc<dyn Device> =
            Arc::new(FileDevice::open(&img, FileDeviceOptions::default()).unwrap());
        let lld = Arc::new(Lld::open(dev, LldOptions::default()).unwrap());
        let ld: Arc<dyn LogicalDisk> = lld.clone();
        let fs = Fs::mount(ld, FsOptions::default()).unwrap();
        let ctx = Ctx {
            uid: 0,
            gid: 0,
            umask: 0,
        };
        let d = fs.mkdir(ctx, ROOT_INO, b"src", 0o755).unwrap().ino;
        let f = fs.mknod(ctx, d, b"main.c", 0o100640, 0).unwrap().ino;
        fs.write(f, 0, &vec![7u8; 10_000]).unwrap();
        fs.setxattr(f, b"user.tag", b"v", XattrMode::Any).unwrap();
        drop(fs);
        lld.close().unwrap();
        f
    };
    let out = ldfs()
        .arg("inspect")
        .arg(&img)
        .args(["--path", "/src/main.c"])
        .succeeds();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(&format!("inode {ino}")), "{text}");
    assert!(text.contains("mode         100640"), "{text}");
    assert!(text.contains("xattr        user.tag (1 bytes)"), "{text}");
    assert_eq!(text.matches("    index ").count(), 3, "{text}");

    let out = ldfs()
        .arg("inspect")
        .arg(&img)
        .args(["--json", "--segment", "0", "--inode", &ino.to_string()])
        .succeeds();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["superblock"]["copies"][0], "ok");
    let partials = v["segment"]["partials"].as_array().unwrap();
    assert!(!partials.is_empty(), "{v}");
    assert!(
        partials[0]["records"]
            .as_array()
            .is_some_and(|r| !r.is_empty()),
        "{v}"
    );
    assert_eq!(v["inode"]["size"], 10_000);
    assert_eq!(v["inode"]["kind"], "File");
    let blocks = v["inode"]["blocks"].as_array().unwrap();
    assert_eq!(blocks.len(), 3);
    let seg_bytes = v["superblock"]["segment_pages"].as_u64().unwrap() * 4096;
    let first = v["superblock"]["first_segment_page"].as_u64().unwrap() * 4096;
    for b in blocks {
        let off = b["offset"].as_u64().unwrap();
        assert_eq!(
            b["segment"].as_u64().unwrap(),
            (off - first) / seg_bytes,
            "{b}"
        );
    }
    assert!(v["checkpoints"]
        .as_array()
        .unwrap()
        .iter()
        .any(|c| c["valid"] == true));

    let out = ldfs()
        .arg("inspect")
        .arg(&img)
        .args(["--path", "/src/missing.c"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("missing.c"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `ldfs bench ops` runs every phase and prints a positive cost for each.
#[test]
fn bench_ops_prints_every_phase() {
    let out = ldfs()
        .args(["bench", "ops", "--files", "200", "--device-size", "64M"])
        .args(["--rounds", "1"])
        .succeeds();
    let text = String::from_utf8_lossy(&out.stdout);
    for phase in [
        "create+write",
        "lookup",
        "getattr",
        "read",
        "rename",
        "unlink",
    ] {
        let line = text
            .lines()
            .find(|l| l.split_whitespace().next() == Some(phase))
            .unwrap_or_else(|| panic!("no {phase} line in:\n{text}"));
        let us: f64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
        assert!(us > 0.0, "{line}");
    }
}

/// Bytes the host file system has allocated to `p`.
fn allocated_bytes(p: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(p).unwrap().blocks() * 512
}

/// `mkfs --size` writes the whole image (and a META it creates), so the
/// host file system never allocates under ldfs's fsyncs; `--sparse` leaves
/// both sparse (issue 16: users get the figures `bench fs` measures).
#[test]
fn mkfs_preallocates_unless_sparse() {
    let dir = tempfile::tempdir().unwrap();
    let size: u64 = 32 << 20;
    let full = dir.path().join("full.img");
    ldfs().args(["mkfs", "--size", "32M"]).arg(&full).succeeds();
    assert!(
        allocated_bytes(&full) >= size,
        "{} of {size} bytes allocated",
        allocated_bytes(&full)
    );
    let sparse = dir.path().join("sparse.img");
    ldfs()
        .args(["mkfs", "--sparse", "--size", "32M"])
        .arg(&sparse)
        .succeeds();
    assert_eq!(std::fs::metadata(&sparse).unwrap().len(), size);
    assert!(
        allocated_bytes(&sparse) < size / 2,
        "{} of {size} bytes allocated",
        allocated_bytes(&sparse)
    );
    // The dual layout: data and metadata images alike.
    let (data, meta) = (dir.path().join("d.img"), dir.path().join("m.img"));
    ldfs()
        .args(["mkfs", "--size", "64M", "--meta-size", "64M", "--meta"])
        .arg(&meta)
        .arg(&data)
        .succeeds();
    assert!(allocated_bytes(&data) >= 64 << 20);
    assert!(allocated_bytes(&meta) >= 64 << 20);
    // --preallocate, the old spelling, still works; it needs --size and
    // contradicts --sparse.
    ldfs()
        .args(["mkfs", "--preallocate", "--size", "32M"])
        .arg(&full)
        .succeeds();
    for bad in [
        &["mkfs", "--preallocate"][..],
        &["mkfs", "--preallocate", "--sparse", "--size", "32M"][..],
    ] {
        let out = ldfs().args(bad).arg(&full).output().unwrap();
        assert!(!out.status.success(), "{bad:?} succeeded");
    }
}
