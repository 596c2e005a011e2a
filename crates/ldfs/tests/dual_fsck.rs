//! fsck of a dual pair (issue 14): damage made in a real pair (a file
//! system written through the dual LD, then changed behind its back) is
//! found by the check, which writes nothing, and repaired by `-y`'s
//! library call, after which a fresh check is clean and every file reads
//! back. Covers the pair — a data block both free in its bitmap
//! and named by a pointer, an allocated block named by nothing — and a
//! block named by two pointers, a descriptor that disagrees with its
//! bitmap, a bitmap block failing its checksum in the log, a damaged data
//! label copy.

use std::sync::Arc;

use ldfs::device::{Device, MemoryDevice};
use ldfs::dual::format::{encode_desc, Pointer};
use ldfs::dual::{Dual, DualMkfsOptions, BITMAP_LIST, DESC_LIST, INFO_LIST};
use ldfs::fs::{Ctx, Fs, FsOptions, ROOT_INO};
use ldfs::fsck::{run_dual, FsckOptions, Outcome};
use ldfs::ld::{ListId, LogicalDisk};
use ldfs::lld::{Key, LldOptions};

const CTX: Ctx = Ctx {
    uid: 0,
    gid: 0,
    umask: 0,
};
const GROUP_BLOCKS: u64 = 256;

struct Pair {
    meta: Arc<MemoryDevice>,
    data: Arc<MemoryDevice>,
    /// (directory, name, contents)
    files: Vec<(u64, String, Vec<u8>)>,
}

fn contents(k: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + k * 13) as u8).collect()
}

impl Pair {
    /// A pair holding a directory of files of 1 to 6 blocks, and one in /.
    fn build() -> Pair {
        let meta = Arc::new(MemoryDevice::new(64 << 20));
        let data = Arc::new(MemoryDevice::new(16 << 20));
        let mk = DualMkfsOptions {
            group_blocks: GROUP_BLOCKS as u32,
            ..Default::default()
        };
        ldfs::dual::mkfs(meta.clone(), &*data, &mk).unwrap();
        let p = Pair {
            meta,
            data,
            files: Vec::new(),
        };
        let dual = p.open();
        Fs::format(&*dual, CTX).unwrap();
        let ld: Arc<dyn LogicalDisk> = dual.clone();
        let fs = Fs::mount(ld, FsOptions::default()).unwrap();
        let d = fs.mkdir(CTX, ROOT_INO, b"d", 0o755).unwrap().ino;
        let mut files = Vec::new();
        for k in 0..6 {
            files.push((d, format!("f{k}"), contents(k, 3000 + k * 4096)));
        }
        files.push((ROOT_INO, "top".to_string(), contents(9, 9000)));
        for (dir, name, bytes) in &files {
            let f = fs
                .mknod(CTX, *dir, name.as_bytes(), 0o100644, 0)
                .unwrap()
                .ino;
            fs.write(f, 0, bytes).unwrap();
        }
        fs.fsync().unwrap();
        drop(fs);
        dual.close().unwrap();
        Pair { files, ..p }
    }

    fn open(&self) -> Arc<Dual> {
        Arc::new(Dual::open(self.meta.clone(), self.data.clone(), LldOptions::default()).unwrap())
    }

    fn mount(&self) -> (Arc<Dual>, Fs) {
        let dual = self.open();
        let ld: Arc<dyn LogicalDisk> = dual.clone();
        let fs = Fs::mount(ld, FsOptions::default()).unwrap();
        (dual, fs)
    }

    /// The user list of a file, and the data block of its block `index`.
    fn block_of(&self, dual: &Dual, fs: &Fs, file: usize, index: u64) -> (ListId, u64) {
        let (dir, name, _) = &self.files[file];
        let ino = fs.lookup(*dir, name.as_bytes()).unwrap().ino;
        let list = ListId(fs.inode_record(ino).unwrap().list);
        (list, dual.data_block(list, index).unwrap().unwrap())
    }

    fn fsck(&self, repair: bool) -> Outcome {
        let before = (self.meta.snapshot(), self.data.snapshot());
        let out = run_dual(
            self.meta.clone(),
            self.data.clone(),
            &FsckOptions {
                repair,
                ..Default::default()
            },
        )
        .unwrap();
        if !repair {
            assert!(
                before == (self.meta.snapshot(), self.data.snapshot()),
                "a check wrote"
            );
        }
        out
    }

    /// Every file reads back as written, `except` the first 4 KiB of the
    /// files listed (damage the repair cannot undo).
    fn files_read_back(&self, except: &[usize]) {
        let (dual, fs) = self.mount();
        for (k, (dir, name, bytes)) in self.files.iter().enumerate() {
            let ino = fs.lookup(*dir, name.as_bytes()).unwrap().ino;
            let got = fs.read(ino, 0, bytes.len() as u32 + 10).unwrap();
            assert_eq!(got.len(), bytes.len(), "{name}");
            let from = if except.contains(&k) { 4096 } else { 0 };
            assert!(got[from..] == bytes[from..], "{name} differs");
        }
        assert!(fs.check().unwrap().problems.is_empty());
        assert_eq!(dual.check_blocks_with(true).unwrap(), Vec::<String>::new());
        drop(fs);
        dual.close().unwrap();
    }
}

fn has(lines: &[String], what: &str) -> bool {
    lines.iter().any(|l| l.contains(what))
}

#[test]
fn dual_fsck_repairs_free_named_leaked_and_doubly_named_blocks() {
    let p = Pair::build();
    assert!(p.fsck(false).found.is_clean());
    let (dual, fs) = p.mount();
    let (_, named) = p.block_of(&dual, &fs, 4, 1);
    let g = named / GROUP_BLOCKS;
    // f3's block 0 made to name f2's block 0 (with f2's checksum): that
    // block is named twice and f3's own block 0 is leaked.
    let (_, b0) = p.block_of(&dual, &fs, 2, 0);
    let (l3, b1) = p.block_of(&dual, &fs, 3, 0);
    let ptr = Pointer {
        block: b0,
        len: 4096,
        crc: crc32c::crc32c(&p.files[2].2[..4096]),
    };
    // Group g's bitmap: f4's block 1 free, and an unnamed block allocated,
    // with a descriptor to match (the pair still opens).
    let lo = g * GROUP_BLOCKS;
    let stored = dual.meta().read(BITMAP_LIST, g).unwrap().unwrap();
    let mut words: Vec<u64> = stored
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let unnamed = (lo..lo + GROUP_BLOCKS)
        .rev()
        .find(|b| words[((b - lo) / 64) as usize] >> ((b - lo) % 64) & 1 == 0)
        .unwrap();
    words[((named - lo) / 64) as usize] &= !(1 << ((named - lo) % 64));
    words[((unnamed - lo) / 64) as usize] |= 1 << ((unnamed - lo) % 64);
    let used: u32 = words.iter().map(|w| w.count_ones()).sum();
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    let meta = dual.meta();
    meta.write(None, BITMAP_LIST, g, &bytes).unwrap();
    meta.write(
        None,
        DESC_LIST,
        g,
        &encode_desc(g as u32, GROUP_BLOCKS as u32 - used),
    )
    .unwrap();
    meta.write(None, ListId(l3.0 + 3), 0, &ptr.encode())
        .unwrap();
    drop(fs);
    dual.close().unwrap();

    let out = p.fsck(false);
    assert_eq!(out.exit_code(), 4);
    let lines = out.found.lines();
    assert!(
        has(&lines, &format!("data block {named} is free in the bitmap")),
        "{lines:?}"
    );
    assert!(
        has(
            &lines,
            &format!("data block {unnamed} is allocated but named by nothing")
        ),
        "{lines:?}"
    );
    assert!(
        has(&lines, &format!("data block {b0} named twice")),
        "{lines:?}"
    );
    assert!(
        has(
            &lines,
            &format!("data block {b1} is allocated but named by nothing")
        ),
        "{lines:?}"
    );

    let out = p.fsck(true);
    assert_eq!(out.exit_code(), 1, "{out:?}");
    assert!(out.remaining.is_empty(), "{:?}", out.remaining);
    assert!(has(&out.fixed, "named twice"), "{:?}", out.fixed);
    assert!(
        has(
            &out.fixed,
            &format!("group {g}: bitmap and descriptor rewritten")
        ),
        "{:?}",
        out.fixed
    );
    assert!(p.fsck(false).found.is_clean());
    p.files_read_back(&[3]);

    // The repaired bitmap holds: new data goes around every named block,
    // and f3 no longer shares f2's block.
    let (dual, fs) = p.mount();
    let f = fs.mknod(CTX, ROOT_INO, b"new", 0o100644, 0).unwrap().ino;
    fs.write(f, 0, &vec![0x5a; 2 << 20]).unwrap();
    let f3 = fs.lookup(p.files[3].0, b"f3").unwrap().ino;
    fs.write(f3, 0, &[0xcc; 4096]).unwrap();
    fs.fsync().unwrap();
    drop(fs);
    dual.close().unwrap();
    p.files_read_back(&[3]);
}

#[test]
fn dual_fsck_repairs_a_descriptor_a_damaged_bitmap_block_and_a_label() {
    let p = Pair::build();
    let (dual, fs) = p.mount();
    let (_, b) = p.block_of(&dual, &fs, 3, 0);
    let g = b / GROUP_BLOCKS;
    drop(fs);
    dual.meta()
        .write(None, DESC_LIST, g, &encode_desc(g as u32, 7))
        .unwrap();
    let at = dual
        .meta()
        .map_entry(Key {
            list: BITMAP_LIST.0,
            index: g,
        })
        .unwrap()
        .unwrap()
        .addr;
    dual.close().unwrap();
    drop(dual);
    assert!(
        Dual::open(p.meta.clone(), p.data.clone(), LldOptions::default()).is_err(),
        "a descriptor disagreeing with its bitmap must fail a mount"
    );
    // The bitmap block's bytes in the log, and the first label copy.
    let mut one = [0u8];
    p.meta.read_at(&mut one, at).unwrap();
    p.meta.write_at(&[one[0] ^ 0x10], at).unwrap();
    p.data.write_at(&[0xff; 16], 100).unwrap();

    let out = p.fsck(false);
    assert_eq!(out.exit_code(), 4);
    let lines = out.found.lines();
    assert!(has(&lines, "data label copy 0"), "{lines:?}");
    assert!(has(&lines, "checksum"), "{lines:?}");
    let out = p.fsck(true);
    assert_eq!(out.exit_code(), 1, "{out:?}");
    assert!(out.remaining.is_empty(), "{:?}", out.remaining);
    assert!(
        has(&out.fixed, "data label copy 0 rewritten"),
        "{:?}",
        out.fixed
    );
    assert!(
        has(&out.fixed, &format!("group {g}: bitmap")),
        "{:?}",
        out.fixed
    );
    assert!(p.fsck(false).found.is_clean());
    p.files_read_back(&[]);
}

/// A layout record in the log that is missing or disagrees with the data
/// label fails a mount, is a finding of the check (not an error that stops
/// it), and is rewritten from the label by the repair.
#[test]
fn dual_fsck_finds_and_rewrites_a_bad_layout_record() {
    for missing in [false, true] {
        let p = Pair::build();
        let dual = p.open();
        if missing {
            dual.meta().delete(None, INFO_LIST, 0).unwrap();
        } else {
            let mut info = dual.meta().read(INFO_LIST, 0).unwrap().unwrap();
            // groups (offset 24) off by one: a well-formed record that
            // disagrees with the label.
            info[24] ^= 1;
            dual.meta().write(None, INFO_LIST, 0, &info).unwrap();
        }
        dual.close().unwrap();
        drop(dual);
        assert!(
            Dual::open(p.meta.clone(), p.data.clone(), LldOptions::default()).is_err(),
            "a bad layout record must fail a mount (missing: {missing})"
        );
        let out = p.fsck(false);
        assert_eq!(out.exit_code(), 4, "missing {missing}: {out:?}");
        assert!(has(&out.found.lines(), "layout record"), "{out:?}");
        let out = p.fsck(true);
        assert_eq!(out.exit_code(), 1, "missing {missing}: {out:?}");
        assert!(has(&out.fixed, "layout record rewritten"), "{out:?}");
        assert!(p.fsck(false).found.is_clean());
        p.files_read_back(&[]);
    }
}
