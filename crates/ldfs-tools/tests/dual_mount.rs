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
