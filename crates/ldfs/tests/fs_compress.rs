//! The file system's compression policy, in-process: the mount's
//! `compress=` for new file data, `user.ldfs.compress` on files and
//! directories (validated, inherited at creation, winning over the mount's
//! choice, switching a file's list for new writes), and layouts that do not
//! compress (dual's data device, uip) taking the policy without storing
//! anything compressed.

use std::sync::Arc;

use ldfs::device::{Device, MemoryDevice};
use ldfs::dual::{Dual, DualMkfsOptions};
use ldfs::fs::{Ctx, Fs, FsError, FsOptions, XattrMode, COMPRESS_XATTR, ROOT_INO};
use ldfs::ld::{Compression, ListId, LogicalDisk};
use ldfs::lld::layout::MkfsOptions;
use ldfs::lld::{Key, Lld, LldOptions};
use ldfs::uip::{Uip, UipOptions};

const CTX: Ctx = Ctx {
    uid: 0,
    gid: 0,
    umask: 0o022,
};
const FILE: u32 = 0o100644;
const DIR: u32 = 0o040755;

fn text(len: usize) -> Vec<u8> {
    b"#include <stdio.h>\nint main(void) { return puts(\"log-structured\"); }\n"
        .iter()
        .cycle()
        .take(len)
        .copied()
        .collect()
}

/// A fresh file system on one log with `compress` as the mount option.
fn fresh(dev: &Arc<MemoryDevice>, compress: Compression) -> (Arc<Lld>, Fs) {
    let lld = Arc::new(
        Lld::create(
            dev.clone() as Arc<dyn Device>,
            &MkfsOptions::default(),
            LldOptions::default(),
        )
        .unwrap(),
    );
    Fs::format(&*lld, CTX).unwrap();
    let fs = mount(&lld, compress);
    (lld, fs)
}

fn mount(lld: &Arc<Lld>, compress: Compression) -> Fs {
    Fs::mount(
        lld.clone() as Arc<dyn LogicalDisk>,
        FsOptions {
            compress,
            ..Default::default()
        },
    )
    .unwrap()
}

/// A file of 16 KiB of text in `parent`; its inode.
fn file_with_data(fs: &Fs, parent: u64, name: &str) -> u64 {
    let a = fs.mknod(CTX, parent, name.as_bytes(), FILE, 0).unwrap();
    fs.write(a.ino, 0, &text(16 << 10)).unwrap();
    a.ino
}

fn list_of(fs: &Fs, ino: u64) -> ListId {
    let l = fs.inode_record(ino).unwrap().list;
    assert_ne!(l, 0, "inode {ino} has no list");
    ListId(l)
}

fn choice(fs: &Fs, ino: u64) -> Compression {
    fs.logical_disk()
        .list_hints(list_of(fs, ino))
        .unwrap()
        .unwrap()
        .compress
}

fn stored(lld: &Lld, fs: &Fs, ino: u64, index: u64) -> u32 {
    lld.map_entry(Key::new(list_of(fs, ino), index))
        .unwrap()
        .unwrap()
        .len
}

fn set(fs: &Fs, ino: u64, v: &str) -> Result<(), FsError> {
    fs.setxattr(ino, COMPRESS_XATTR, v.as_bytes(), XattrMode::Any)
}

#[test]
fn the_mount_option_sets_new_file_data_lists() {
    for (c, compresses) in [
        (Compression::Off, false),
        (Compression::Lz4, true),
        (Compression::Zstd { level: 3 }, true),
    ] {
        let dev = Arc::new(MemoryDevice::new(128 << 20));
        let (lld, fs) = fresh(&dev, c);
        let ino = file_with_data(&fs, ROOT_INO, "f");
        assert_eq!(choice(&fs, ino), c);
        let len = stored(&lld, &fs, ino, 0);
        assert_eq!(len < 2048, compresses, "{c}: block stored as {len} bytes");
        assert_eq!(fs.read(ino, 0, 16 << 10).unwrap(), text(16 << 10), "{c}");
        // Metadata lists are never compressed.
        let root = fs.inode_record(ROOT_INO).unwrap().list;
        assert_eq!(
            lld.list_hints(ListId(root)).unwrap().unwrap().compress,
            Compression::Off
        );
    }
}

#[test]
fn a_directorys_policy_is_inherited_and_wins_over_the_mount_option() {
    let dev = Arc::new(MemoryDevice::new(128 << 20));
    let (lld, fs) = fresh(&dev, Compression::Zstd { level: 3 });
    let d = fs.mkdir(CTX, ROOT_INO, b"src", DIR).unwrap().ino;
    set(&fs, d, "lz4").unwrap();
    let sub = fs.mkdir(CTX, d, b"sub", DIR).unwrap().ino;
    assert_eq!(fs.getxattr(sub, COMPRESS_XATTR).unwrap(), b"lz4");
    let f = file_with_data(&fs, sub, "a.c");
    assert_eq!(fs.getxattr(f, COMPRESS_XATTR).unwrap(), b"lz4");
    assert_eq!(choice(&fs, f), Compression::Lz4);
    // A file's own value wins over the directory's and the mount's.
    let g = fs.mknod(CTX, d, b"plain", FILE, 0).unwrap().ino;
    set(&fs, g, "off").unwrap();
    fs.write(g, 0, &text(16 << 10)).unwrap();
    assert_eq!(choice(&fs, g), Compression::Off);
    assert_eq!(stored(&lld, &fs, g, 0), 4096);
    // Outside the directory: the mount's choice, and no attribute.
    let h = file_with_data(&fs, ROOT_INO, "h");
    assert!(matches!(
        fs.getxattr(h, COMPRESS_XATTR),
        Err(FsError::NoAttr)
    ));
    assert_eq!(choice(&fs, h), Compression::Zstd { level: 3 });
    // Symlinks and special files get nothing.
    let s = fs.symlink(CTX, d, b"link", b"a.c").unwrap().ino;
    assert!(matches!(
        fs.getxattr(s, COMPRESS_XATTR),
        Err(FsError::NoAttr)
    ));
    // The policy is an ordinary attribute: it survives a remount, and so
    // does its inheritance.
    drop(fs);
    let fs = mount(&lld, Compression::Off);
    let f2 = file_with_data(&fs, sub, "b.c");
    assert_eq!(choice(&fs, f2), Compression::Lz4);
    assert_eq!(fs.read(f, 0, 16 << 10).unwrap(), text(16 << 10));
    assert_eq!(choice(&fs, h), Compression::Zstd { level: 3 });
}

#[test]
fn bad_values_are_invalid_with_a_message() {
    let dev = Arc::new(MemoryDevice::new(64 << 20));
    let (_lld, fs) = fresh(&dev, Compression::Off);
    let f = fs.mknod(CTX, ROOT_INO, b"f", FILE, 0).unwrap().ino;
    for bad in [
        "", "gzip", "ZSTD", "zstd:", "zstd:0", "zstd:20", "zstd:-1", "zstd:+3", "zstd:3 ",
        "zstd: 3", "lz4\n", "zstd:003",
    ] {
        match set(&fs, f, bad) {
            Err(FsError::Invalid(m)) => {
                assert!(m.contains("user.ldfs.compress"), "{bad:?}: {m}");
                assert!(m.contains("zstd:LEVEL"), "{bad:?}: {m}");
            }
            r => panic!("{bad:?} gave {r:?}"),
        }
    }
    assert!(matches!(
        fs.setxattr(f, COMPRESS_XATTR, &[0xff, 0xfe], XattrMode::Any),
        Err(FsError::Invalid(_))
    ));
    assert!(matches!(
        fs.getxattr(f, COMPRESS_XATTR),
        Err(FsError::NoAttr)
    ));
    for good in ["off", "lz4", "zstd", "zstd:1", "zstd:19"] {
        set(&fs, f, good).unwrap();
        assert_eq!(fs.getxattr(f, COMPRESS_XATTR).unwrap(), good.as_bytes());
    }
    let s = fs.symlink(CTX, ROOT_INO, b"s", b"f").unwrap().ino;
    assert!(matches!(set(&fs, s, "lz4"), Err(FsError::Invalid(_))));
}

#[test]
fn setting_it_on_a_file_with_data_switches_new_writes() {
    let dev = Arc::new(MemoryDevice::new(128 << 20));
    let (lld, fs) = fresh(&dev, Compression::Off);
    let f = file_with_data(&fs, ROOT_INO, "f");
    assert_eq!(stored(&lld, &fs, f, 0), 4096);
    set(&fs, f, "zstd:7").unwrap();
    assert_eq!(choice(&fs, f), Compression::Zstd { level: 7 });
    fs.write(f, 16 << 10, &text(8192)).unwrap();
    assert_eq!(stored(&lld, &fs, f, 0), 4096, "old blocks are left alone");
    assert!(stored(&lld, &fs, f, 4) < 2048);
    // Rewriting an old block stores it the new way.
    fs.write(f, 0, &text(4096)).unwrap();
    assert!(stored(&lld, &fs, f, 0) < 2048);
    // Without its own value the file follows the mount's choice again.
    fs.removexattr(f, COMPRESS_XATTR).unwrap();
    assert_eq!(choice(&fs, f), Compression::Off);
    let mut want = text(16 << 10);
    want.extend(text(8192));
    assert_eq!(fs.read(f, 0, 24 << 10).unwrap(), want);
    // A directory's value does not reach files that exist already.
    let d = fs.mkdir(CTX, ROOT_INO, b"d", DIR).unwrap().ino;
    let old = file_with_data(&fs, d, "old");
    set(&fs, d, "lz4").unwrap();
    assert_eq!(choice(&fs, old), Compression::Off);
}

/// Dual keeps file data uncompressed on its data device and uip never
/// compresses: both take the policy, and data reads back.
#[test]
fn layouts_that_do_not_compress_take_the_policy() {
    let meta = Arc::new(MemoryDevice::new(64 << 20));
    let data = Arc::new(MemoryDevice::new(128 << 20));
    ldfs::dual::mkfs(meta.clone(), &*data, &DualMkfsOptions::default()).unwrap();
    let dual: Arc<dyn LogicalDisk> =
        Arc::new(Dual::open(meta, data, LldOptions::default()).unwrap());
    let uip: Arc<dyn LogicalDisk> = Arc::new(
        Uip::create(
            Arc::new(MemoryDevice::new(128 << 20)),
            UipOptions::default(),
        )
        .unwrap(),
    );
    for (name, ld) in [("dual", dual), ("uip", uip)] {
        Fs::format(&*ld, CTX).unwrap();
        let fs = Fs::mount(
            ld,
            FsOptions {
                compress: Compression::Zstd { level: 3 },
                ..Default::default()
            },
        )
        .unwrap();
        let d = fs.mkdir(CTX, ROOT_INO, b"d", DIR).unwrap().ino;
        set(&fs, d, "lz4").unwrap();
        let f = file_with_data(&fs, d, "f");
        set(&fs, f, "zstd:9").unwrap();
        fs.write(f, 16 << 10, &text(4096)).unwrap();
        let mut want = text(16 << 10);
        want.extend(text(4096));
        assert_eq!(fs.read(f, 0, 20 << 10).unwrap(), want, "{name}");
        if name == "dual" {
            assert_eq!(choice(&fs, f), Compression::Off, "dual's data list");
        }
    }
}
