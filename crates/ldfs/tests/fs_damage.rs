//! Damage found while mounted (issue 4): a data block failing its checksum
//! fails only the reads that need it, with an I/O error, and the file
//! system stays writable; a corrupt inode record or directory bucket fails
//! the operations that need it with an I/O error and turns the file system
//! read-only — every later modifying operation fails with `ReadOnly` —
//! while reads of undamaged parts go on working.

use std::sync::Arc;

use ldfs::device::{Device, MemoryDevice};
use ldfs::fs::inode::Inode;
use ldfs::fs::{Ctx, Fs, FsError, FsOptions, SetAttr, ROOT_INO};
use ldfs::ld::{ListId, LogicalDisk};
use ldfs::lld::layout::MkfsOptions;
use ldfs::lld::types::Key;
use ldfs::lld::{Lld, LldOptions};

const CTX: Ctx = Ctx {
    uid: 0,
    gid: 0,
    umask: 0,
};
const INODE_LIST: u64 = 2;

struct Image {
    bytes: Vec<u8>,
    /// Inode numbers: directories `a` and `b`, `a/x` (damaged below),
    /// `b/y` and the big file `b/big` (16 blocks of 4 KiB, byte `k` of
    /// block `k`).
    a: u64,
    b: u64,
    x: u64,
    y: u64,
    big: u64,
}

fn build() -> Image {
    let dev = Arc::new(MemoryDevice::new(16 << 20));
    let lld = Arc::new(
        Lld::create(
            dev.clone(),
            &MkfsOptions {
                segment_bytes: 256 << 10,
                max_block_bytes: 64 << 10,
                reserved_segments: None,
                fs_id: 0x77,
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
    let a = fs.mkdir(CTX, ROOT_INO, b"a", 0o755).unwrap().ino;
    let b = fs.mkdir(CTX, ROOT_INO, b"b", 0o755).unwrap().ino;
    let x = fs.mknod(CTX, a, b"x", 0o100644, 0).unwrap().ino;
    fs.write(x, 0, b"x's bytes").unwrap();
    let y = fs.mknod(CTX, b, b"y", 0o100644, 0).unwrap().ino;
    fs.write(y, 0, b"y's bytes").unwrap();
    let big = fs.mknod(CTX, b, b"big", 0o100644, 0).unwrap().ino;
    let data: Vec<u8> = (0..16u8).flat_map(|k| vec![k; 4096]).collect();
    fs.write(big, 0, &data).unwrap();
    drop(fs);
    lld.close().unwrap();
    Image {
        bytes: dev.snapshot(),
        a,
        b,
        x,
        y,
        big,
    }
}

/// Opens `bytes` read-write and mounts it.
fn mount(bytes: Vec<u8>) -> (Arc<Lld>, Fs) {
    let dev: Arc<dyn Device> = Arc::new(MemoryDevice::from_vec(bytes));
    let lld = Arc::new(Lld::open(dev, LldOptions::default()).unwrap());
    let ld: Arc<dyn LogicalDisk> = lld.clone();
    let fs = Fs::mount(ld, FsOptions::default()).unwrap();
    (lld, fs)
}

/// The image with one byte of block `key` flipped.
fn flip(img: &Image, key: Key) -> Vec<u8> {
    let (lld, fs) = mount(img.bytes.clone());
    let e = lld.map_entry(key).unwrap().expect("the block exists");
    drop(fs);
    lld.close().unwrap();
    let mut bytes = img.bytes.clone();
    // The close above wrote a checkpoint but moved no block.
    bytes[e.offset() as usize + (e.len as usize / 2)] ^= 0x40;
    bytes
}

/// Inode `ino`'s list, from its record.
fn list_of(img: &Image, ino: u64) -> u64 {
    let (lld, fs) = mount(img.bytes.clone());
    let rec = lld.read(ListId(INODE_LIST), ino).unwrap().unwrap();
    drop(fs);
    lld.close().unwrap();
    Inode::decode(ino, &rec, ino).unwrap().list
}

fn assert_undamaged_parts_read(img: &Image, fs: &Fs) {
    let names: Vec<Vec<u8>> = fs
        .readdir(img.b, 0, 100)
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert!(names.contains(&b"y".to_vec()) && names.contains(&b"big".to_vec()));
    assert_eq!(fs.lookup(img.b, b"y").unwrap().ino, img.y);
    assert_eq!(fs.read(img.y, 0, 100).unwrap(), b"y's bytes");
    assert_eq!(fs.getattr(img.big).unwrap().size, 16 * 4096);
}

fn assert_read_only(fs: &Fs, img: &Image) {
    let ro = |r: Result<(), FsError>, what: &str| {
        assert!(
            matches!(r, Err(FsError::ReadOnly)),
            "{what} after metadata corruption: {r:?}"
        )
    };
    ro(
        fs.mknod(CTX, img.b, b"new", 0o100644, 0).map(|_| ()),
        "create",
    );
    ro(fs.mkdir(CTX, ROOT_INO, b"new", 0o755).map(|_| ()), "mkdir");
    ro(fs.write(img.y, 0, b"more").map(|_| ()), "write");
    ro(fs.unlink(img.b, b"y"), "unlink");
    ro(
        fs.setattr(
            img.y,
            &SetAttr {
                size: Some(1),
                ..Default::default()
            },
        )
        .map(|_| ()),
        "truncate",
    );
    // Nothing changed.
    assert_eq!(fs.read(img.y, 0, 100).unwrap(), b"y's bytes");
}

#[test]
fn a_bad_data_block_fails_only_its_reads() {
    let img = build();
    let list = list_of(&img, img.big);
    let (_lld, fs) = mount(flip(&img, Key { list, index: 5 }));
    // The damaged block: EIO (the engine logs the block's address, fs the
    // inode and offset).
    assert!(matches!(
        fs.read(img.big, 5 * 4096, 10),
        Err(FsError::Io(_))
    ));
    assert!(matches!(
        fs.read(img.big, 0, 16 * 4096),
        Err(FsError::Io(_))
    ));
    // The rest of the file and the file system.
    assert_eq!(fs.read(img.big, 4 * 4096, 4096).unwrap(), vec![4u8; 4096]);
    assert_eq!(fs.read(img.big, 6 * 4096, 4096).unwrap(), vec![6u8; 4096]);
    assert_undamaged_parts_read(&img, &fs);
    // Data damage does not stop writes.
    assert!(fs.damaged().is_none());
    fs.mknod(CTX, img.b, b"new", 0o100644, 0).unwrap();
    fs.write(img.y, 0, b"Y").unwrap();
    // Overwriting the whole damaged block replaces it.
    fs.write(img.big, 5 * 4096, &[9u8; 4096]).unwrap();
    assert_eq!(fs.read(img.big, 5 * 4096, 4096).unwrap(), vec![9u8; 4096]);
}

#[test]
fn a_corrupt_inode_record_turns_the_mount_read_only() {
    let img = build();
    let (_lld, fs) = mount(flip(
        &img,
        Key {
            list: INODE_LIST,
            index: img.x,
        },
    ));
    assert!(fs.damaged().is_none());
    // Writes work until the damage is met.
    fs.mknod(CTX, img.b, b"before", 0o100644, 0).unwrap();
    let r = fs.getattr(img.x);
    assert!(matches!(r, Err(FsError::Io(_))), "{r:?}");
    let why = fs
        .damaged()
        .expect("metadata corruption turns the fs read-only");
    assert!(why.contains(&format!("inode {}", img.x)), "{why}");
    assert_read_only(&fs, &img);
    // Lookups that do not need inode x, and reads, still work.
    assert!(fs.lookup(ROOT_INO, b"a").is_ok());
    assert_undamaged_parts_read(&img, &fs);
    assert_eq!(fs.read(img.big, 0, 4096).unwrap(), vec![0u8; 4096]);
    assert_eq!(
        fs.lookup(img.b, b"before").unwrap().kind,
        ldfs::fs::inode::Kind::File
    );
}

#[test]
fn a_corrupt_directory_bucket_turns_the_mount_read_only() {
    let img = build();
    let list = list_of(&img, img.a);
    let (_lld, fs) = mount(flip(
        &img,
        Key {
            list,
            index: ldfs::fs::dir::bucket(b"x"),
        },
    ));
    let r = fs.lookup(img.a, b"x");
    assert!(matches!(r, Err(FsError::Io(_))), "{r:?}");
    let why = fs
        .damaged()
        .expect("metadata corruption turns the fs read-only");
    assert!(why.contains(&format!("directory {}", img.a)), "{why}");
    assert!(matches!(fs.readdir(img.a, 0, 100), Err(FsError::Io(_))));
    assert_read_only(&fs, &img);
    assert_undamaged_parts_read(&img, &fs);
    // The inode below the damaged bucket is still readable by number.
    assert_eq!(fs.read(img.x, 0, 100).unwrap(), b"x's bytes");
}

/// The dual layout (issue 14): a file's data block on the data device
/// failing its checksum (held in the pointer in the metadata log) fails
/// only the reads that need it, the file system stays writable, and
/// overwriting the block replaces it.
#[test]
fn on_the_dual_layout_a_bad_data_block_fails_only_its_reads() {
    use ldfs::dual::{Dual, DualMkfsOptions};
    let meta = Arc::new(MemoryDevice::new(16 << 20));
    let data = Arc::new(MemoryDevice::new(16 << 20));
    let opts = DualMkfsOptions {
        lld: MkfsOptions {
            segment_bytes: 256 << 10,
            max_block_bytes: 64 << 10,
            reserved_segments: None,
            fs_id: 0x78,
            max_bytes: None,
            kept_pages: 0,
        },
        group_blocks: 256,
        meta_path: String::new(),
    };
    ldfs::dual::mkfs(meta.clone(), &*data, &opts).unwrap();
    let open = |meta: Arc<MemoryDevice>, data: Arc<MemoryDevice>| {
        let d = Arc::new(Dual::open(meta, data, LldOptions::default()).unwrap());
        let ld: Arc<dyn LogicalDisk> = d.clone();
        (d, Fs::mount(ld, FsOptions::default()).unwrap())
    };
    let d = Dual::open(meta.clone(), data.clone(), LldOptions::default()).unwrap();
    Fs::format(&d, CTX).unwrap();
    d.close().unwrap();
    let (d, fs) = open(meta.clone(), data.clone());
    let b = fs.mkdir(CTX, ROOT_INO, b"b", 0o755).unwrap().ino;
    let y = fs.mknod(CTX, b, b"y", 0o100644, 0).unwrap().ino;
    fs.write(y, 0, &[7u8; 8192]).unwrap();
    let big = fs.mknod(CTX, b, b"big", 0o100644, 0).unwrap().ino;
    let bytes: Vec<u8> = (0..16u8).flat_map(|k| vec![k; 4096]).collect();
    fs.write(big, 0, &bytes).unwrap();
    let list = ListId(fs.inode_record(big).unwrap().list);
    let block = d
        .data_block(list, 5)
        .unwrap()
        .expect("block 5 is on the data device");
    let at = d.stats().geo.offset(block) as usize;
    drop(fs);
    Arc::try_unwrap(d)
        .unwrap_or_else(|_| panic!("dual still shared"))
        .close()
        .unwrap();
    // The block's bytes were written to the data device (not inline in
    // the log): damage them there.
    let mut data_bytes = data.snapshot();
    assert_eq!(data_bytes[at + 100], 5, "block 5 is not at {at}");
    data_bytes[at + 100] ^= 0x40;
    let (_d, fs) = open(meta, Arc::new(MemoryDevice::from_vec(data_bytes)));
    // Scrub finds it, on the data device, by path and offset.
    let r = scrub(&fs);
    assert_eq!(r.damage.len(), 1, "{:?}", r.damage);
    assert_eq!(r.damage[0].kind, ldfs::fs::scrub::DamageKind::Data);
    assert_eq!(r.damage[0].path.as_deref(), Some(&b"/b/big"[..]));
    assert_eq!(r.damage[0].offset, 5 * 4096);
    assert!(matches!(fs.read(big, 5 * 4096, 10), Err(FsError::Io(_))));
    assert!(matches!(fs.read(big, 0, 16 * 4096), Err(FsError::Io(_))));
    assert_eq!(fs.read(big, 4 * 4096, 4096).unwrap(), vec![4u8; 4096]);
    assert_eq!(fs.read(big, 6 * 4096, 4096).unwrap(), vec![6u8; 4096]);
    assert_eq!(fs.read(y, 0, 8192).unwrap(), vec![7u8; 8192]);
    assert!(fs.damaged().is_none());
    fs.mknod(CTX, b, b"new", 0o100644, 0).unwrap();
    fs.write(y, 0, b"Y").unwrap();
    fs.write(big, 5 * 4096, &[9u8; 4096]).unwrap();
    assert_eq!(fs.read(big, 5 * 4096, 4096).unwrap(), vec![9u8; 4096]);
}

/// Scrubs `fs` as fast as it goes.
fn scrub(fs: &Fs) -> ldfs::fs::scrub::ScrubReport {
    ldfs::fs::scrub::scrub(
        &**fs.logical_disk(),
        &ldfs::fs::scrub::ScrubOptions::default(),
        &mut |_| {},
    )
    .unwrap()
}

/// Scrub (issue 17) reads every block of an undamaged file system and
/// finds nothing; on a damaged one it names each damaged block by what it
/// is, with the path and offset of the file it belongs to, and changes
/// nothing (the mount stays writable: the damage is the fs's to meet).
#[test]
fn scrub_names_each_damaged_block_by_path_and_offset() {
    use ldfs::fs::scrub::DamageKind;
    let img = build();
    let (_lld, fs) = mount(img.bytes.clone());
    let clean = scrub(&fs);
    assert!(clean.damage.is_empty(), "{:?}", clean.damage);
    assert!(!clean.stopped);
    // root, a, b, x, y, big: each record read once.
    assert_eq!(clean.inodes, 6);
    assert!(clean.bytes >= 16 * 4096, "{} bytes", clean.bytes);
    assert!(clean.blocks >= 16 + 6 + 2, "{} blocks", clean.blocks);

    let big_list = list_of(&img, img.big);
    let (_lld, fs) = mount(flip(
        &img,
        Key {
            list: big_list,
            index: 5,
        },
    ));
    let r = scrub(&fs);
    assert_eq!(r.damage.len(), 1, "{:?}", r.damage);
    let d = &r.damage[0];
    assert_eq!(d.kind, DamageKind::Data);
    assert_eq!(
        (d.ino, d.list, d.index, d.offset),
        (img.big, big_list, 5, 5 * 4096)
    );
    assert_eq!(d.path.as_deref(), Some(&b"/b/big"[..]));
    // The other 15 blocks were read.
    assert!(r.bytes >= 15 * 4096);
    assert!(fs.damaged().is_none());

    let (_lld, fs) = mount(flip(
        &img,
        Key {
            list: INODE_LIST,
            index: img.x,
        },
    ));
    let r = scrub(&fs);
    assert_eq!(r.damage.len(), 1, "{:?}", r.damage);
    assert_eq!(r.damage[0].kind, DamageKind::InodeRecord);
    assert_eq!(r.damage[0].ino, img.x);
    assert_eq!(r.damage[0].path.as_deref(), Some(&b"/a/x"[..]));
    assert!(fs.damaged().is_none(), "scrub only reports");

    let a_list = list_of(&img, img.a);
    let bucket = ldfs::fs::dir::bucket(b"x");
    let (_lld, fs) = mount(flip(
        &img,
        Key {
            list: a_list,
            index: bucket,
        },
    ));
    let r = scrub(&fs);
    assert_eq!(r.damage.len(), 1, "{:?}", r.damage);
    let d = &r.damage[0];
    assert_eq!(d.kind, DamageKind::DirectoryBucket);
    assert_eq!((d.ino, d.list, d.index), (img.a, a_list, bucket));
    assert_eq!(d.path.as_deref(), Some(&b"/a"[..]));
    // x, below the bucket, is still read (by the pass over inode records).
    assert_eq!(r.inodes, 6);
}

/// A scrub keeps to its rate, stops when told, and finds nothing wrong in
/// a file system that changes under it.
#[test]
fn scrub_keeps_its_rate_stops_when_told_and_runs_beside_writers() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Instant;
    let img = build();
    let (_lld, fs) = mount(img.bytes.clone());
    let fs = Arc::new(fs);
    let all = scrub(&fs).bytes;
    let rate = all * 4; // a quarter of a second
    let t = Instant::now();
    let r = ldfs::fs::scrub::scrub(
        &**fs.logical_disk(),
        &ldfs::fs::scrub::ScrubOptions {
            rate: Some(rate),
            stop: None,
        },
        &mut |_| {},
    )
    .unwrap();
    assert!(
        t.elapsed().as_secs_f64() >= r.bytes as f64 / rate as f64 * 0.95,
        "{} bytes in {:?} at {rate} B/s",
        r.bytes,
        t.elapsed()
    );
    let stop = AtomicBool::new(true);
    let r = ldfs::fs::scrub::scrub(
        &**fs.logical_disk(),
        &ldfs::fs::scrub::ScrubOptions {
            rate: None,
            stop: Some(&stop),
        },
        &mut |_| {},
    )
    .unwrap();
    assert!(r.stopped && r.bytes < all);

    // Files created, grown and deleted while scrubs run.
    let done = Arc::new(AtomicBool::new(false));
    let ops = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let writer = {
        let (fs, done, ops, b) = (fs.clone(), done.clone(), ops.clone(), img.b);
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !done.load(Ordering::Relaxed) {
                let name = format!("f{}", n % 40).into_bytes();
                if let Ok(a) = fs.mknod(CTX, b, &name, 0o100644, 0) {
                    fs.write(a.ino, 0, &vec![n as u8; 3 * 4096 + 17]).unwrap();
                } else {
                    fs.unlink(b, &name).unwrap();
                }
                n += 1;
                ops.store(n, Ordering::Relaxed);
            }
        })
    };
    let mut scrubs = 0;
    while scrubs < 5 || ops.load(Ordering::Relaxed) < 400 {
        let r = scrub(&fs);
        assert!(r.damage.is_empty(), "{:?}", r.damage);
        scrubs += 1;
    }
    done.store(true, Ordering::Relaxed);
    writer.join().unwrap();
}
