//! The `ldfs` binary from outside: mkfs an image file, inspect it, and refuse bad input.

use std::process::Command;

fn ldfs() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ldfs"))
}

#[test]
fn mkfs_then_inspect() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("t.img");
    let out = ldfs()
        .args(["mkfs", "--size", "64M", "--segment-size", "1M"])
        .arg(&img)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::metadata(&img).unwrap().len(), 64 << 20);
    let out = ldfs()
        .arg("inspect")
        .arg(&img)
        .args(["--segment", "0"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
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

#[test]
fn mkfs_preallocate_writes_the_whole_image() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("pre.img");
    let out = ldfs()
        .arg("mkfs")
        .arg("--preallocate")
        .args(["--size", "32M"])
        .arg(&img)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
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
