//! A file-system operation commits whole or not at all (issue 12, item 6),
//! and space can be freed on a full file system (item 1).
//!
//! Renames of every shape are run with the Nth device read failing, for
//! every N up to the rename's last read: each either succeeds whole or
//! fails with nothing changed — in the running file system, and after a
//! crash and a remount of what was flushed. The same with inode records near
//! their largest size (a thousand extended attributes) on a full file system.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use ldfs::device::{CrashDevice, FaultDevice, FaultPlan};
use ldfs::dual::{Dual, DualMkfsOptions};
use ldfs::fs::inode::Kind;
use ldfs::fs::{
    Ctx, FallocMode, Fs, FsError, FsOptions, RenameFlags, SetAttr, XattrMode, ROOT_INO,
};
use ldfs::ld::{AruId, LdError, LdResult, ListHints, ListId, LogicalDisk, SpaceStats};
use ldfs::lld::layout::MkfsOptions;
use ldfs::lld::{Lld, LldOptions};

const CTX: Ctx = Ctx {
    uid: 0,
    gid: 0,
    umask: 0,
};

fn mkfs_options() -> MkfsOptions {
    MkfsOptions {
        segment_bytes: 256 << 10,
        max_block_bytes: 64 << 10,
        reserved_segments: Some(8),
        fs_id: 12,
        max_bytes: None,
        kept_pages: 0,
    }
}

mod common;

use common::{hash, walk, Tree};

/// The whole tree: path -> kind, links, `..`, size, a content hash and the
/// extended attributes' count and total size.
fn snapshot(fs: &Fs) -> Tree {
    walk(fs, |ino, a| {
        let names = fs.listxattr(ino).unwrap();
        let xattrs: usize = names
            .iter()
            .map(|n| n.len() + fs.getxattr(ino, n).unwrap().len())
            .sum();
        let what = match a.kind {
            Kind::Dir => format!("dir .. {}", fs.lookup(ino, b"..").unwrap().ino),
            Kind::File => {
                let data = fs.read(ino, 0, a.size as u32 + 1).unwrap();
                format!("file size {} {:x}", a.size, hash(&data))
            }
            Kind::Symlink => format!("symlink {:x}", hash(&fs.readlink(ino).unwrap())),
            k => format!("{k:?}"),
        };
        format!(
            "ino {ino} nlink {} {what} xattrs {}/{xattrs}",
            a.nlink,
            names.len()
        )
    })
}

fn check_clean(fs: &Fs, when: &str) {
    let report = fs.check().unwrap();
    assert!(report.problems.is_empty(), "{when}: {:#?}", report.problems);
}

/// Names to inode numbers, as the population made them.
type Inos = HashMap<&'static str, u64>;

/// Where a test's file system lives: one log, or the dual layout's
/// metadata log and data device (issue 14: the dual layout is tested as the
/// single one is).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Layout {
    Single,
    Dual,
}

const LAYOUTS: [Layout; 2] = [Layout::Single, Layout::Dual];

/// What is durable on a file system's devices: the one log's image, or
/// the dual layout's metadata device's and data device's.
struct Image {
    layout: Layout,
    devices: Vec<Vec<u8>>,
}

fn dual_mkfs_options() -> DualMkfsOptions {
    DualMkfsOptions {
        lld: mkfs_options(),
        group_blocks: 256,
        meta_path: String::new(),
    }
}

/// The Logical Disk under a mount, to stop it as a crash would.
enum Engine {
    Lld(Arc<Lld>),
    Dual(Arc<Dual>),
}

struct Mounted {
    /// A fault injector over each device (the dual layout: metadata, data).
    faults: Vec<Arc<FaultDevice<Arc<CrashDevice>>>>,
    crashes: Vec<Arc<CrashDevice>>,
    engine: Engine,
    ld: Arc<dyn LogicalDisk>,
    fs: Fs,
}

impl Mounted {
    /// The one log's fault injector (single-layout tests).
    fn fault(&self) -> &FaultDevice<Arc<CrashDevice>> {
        assert_eq!(self.faults.len(), 1, "a single-layout test");
        &self.faults[0]
    }
}

fn mount(image: &Image) -> Mounted {
    let crashes: Vec<Arc<CrashDevice>> = image
        .devices
        .iter()
        .map(|d| Arc::new(CrashDevice::from_image(d.clone())))
        .collect();
    let faults: Vec<_> = crashes
        .iter()
        .map(|c| Arc::new(FaultDevice::new(c.clone(), FaultPlan::default())))
        .collect();
    let (engine, ld): (Engine, Arc<dyn LogicalDisk>) = match image.layout {
        Layout::Single => {
            let l = Arc::new(Lld::open(faults[0].clone(), LldOptions::default()).unwrap());
            (Engine::Lld(l.clone()), l)
        }
        Layout::Dual => {
            let d = Arc::new(
                Dual::open(faults[0].clone(), faults[1].clone(), LldOptions::default()).unwrap(),
            );
            (Engine::Dual(d.clone()), d)
        }
    };
    let fs = Fs::mount(ld.clone(), FsOptions::default()).unwrap();
    Mounted {
        faults,
        crashes,
        engine,
        ld,
        fs,
    }
}

/// Stops `m` as a crash would, after a flush: returns what is durable.
fn crash(m: Mounted) -> Image {
    m.fs.fsync().unwrap();
    let layout = match m.engine {
        Engine::Lld(_) => Layout::Single,
        Engine::Dual(_) => Layout::Dual,
    };
    let devices = m.crashes.iter().map(|c| c.durable_image()).collect();
    drop(m.fs);
    drop(m.ld);
    match m.engine {
        Engine::Lld(l) => match Arc::try_unwrap(l) {
            Ok(l) => l.abandon(),
            Err(_) => panic!("engine still shared"),
        },
        Engine::Dual(d) => match Arc::try_unwrap(d) {
            Ok(d) => d.abandon(),
            Err(_) => panic!("dual still shared"),
        },
    }
    Image { layout, devices }
}

/// Formats a file system of `layout` (each device `device_bytes`), lets
/// `populate` fill it, closes it cleanly; returns the image and what
/// `populate` named.
fn build(
    layout: Layout,
    device_bytes: u64,
    populate: impl Fn(&Fs, &dyn LogicalDisk) -> Inos,
) -> (Image, Inos) {
    let crashes: Vec<Arc<CrashDevice>> = match layout {
        Layout::Single => vec![Arc::new(CrashDevice::new(device_bytes))],
        Layout::Dual => vec![
            Arc::new(CrashDevice::new(device_bytes)),
            Arc::new(CrashDevice::new(device_bytes)),
        ],
    };
    let inos = match layout {
        Layout::Single => {
            let lld = Arc::new(
                Lld::create(crashes[0].clone(), &mkfs_options(), LldOptions::default()).unwrap(),
            );
            Fs::format(&*lld, CTX).unwrap();
            let ld: Arc<dyn LogicalDisk> = lld.clone();
            let fs = Fs::mount(ld.clone(), FsOptions::default()).unwrap();
            let inos = populate(&fs, &*ld);
            drop(fs);
            drop(ld);
            match Arc::try_unwrap(lld) {
                Ok(l) => l.close().unwrap(),
                Err(_) => panic!("engine still shared"),
            }
            inos
        }
        Layout::Dual => {
            ldfs::dual::mkfs(crashes[0].clone(), &*crashes[1], &dual_mkfs_options()).unwrap();
            let d = Arc::new(
                Dual::open(
                    crashes[0].clone(),
                    crashes[1].clone(),
                    LldOptions::default(),
                )
                .unwrap(),
            );
            Fs::format(&*d, CTX).unwrap();
            let ld: Arc<dyn LogicalDisk> = d.clone();
            let fs = Fs::mount(ld.clone(), FsOptions::default()).unwrap();
            let inos = populate(&fs, &*ld);
            drop(fs);
            drop(ld);
            match Arc::try_unwrap(d) {
                Ok(d) => d.close().unwrap(),
                Err(_) => panic!("dual still shared"),
            }
            inos
        }
    };
    let devices = crashes.iter().map(|c| c.durable_image()).collect();
    (Image { layout, devices }, inos)
}

type Op = fn(&Fs, &Inos) -> Result<(), FsError>;

/// Runs `op` on a fresh mount of `image` with the Nth read of one device
/// failing, for N = 1, 2, ... until a run meets no fault, and so for each
/// device (the dual layout: its metadata device, then its data device);
/// every run must leave the tree as it was (a failure) or as `op` makes it
/// without faults (success), while mounted and after a crash. Returns how
/// many runs failed.
fn every_failure_point(name: &str, image: &Image, inos: &Inos, op: Op) -> u64 {
    (0..image.devices.len())
        .map(|dev| {
            let name = match image.layout {
                Layout::Single => name.to_string(),
                Layout::Dual => format!("{name} (dual, {} device)", ["metadata", "data"][dev]),
            };
            every_failure_point_of(&name, image, dev, inos, op)
        })
        .sum()
}

fn every_failure_point_of(name: &str, image: &Image, dev: usize, inos: &Inos, op: Op) -> u64 {
    let (before, after) = {
        let m = mount(image);
        let before = snapshot(&m.fs);
        op(&m.fs, inos).unwrap_or_else(|e| panic!("{name}: fails without faults: {e}"));
        let after = snapshot(&m.fs);
        assert_ne!(before, after, "{name}: changes nothing");
        check_clean(&m.fs, name);
        (before, after)
    };
    let mut failed = 0;
    for n in 1..=500u64 {
        let m = mount(image);
        let fault = m.faults[dev].clone();
        fault.set_plan(FaultPlan {
            fail_read_nth: Some(n),
            ..FaultPlan::default()
        });
        let r = op(&m.fs, inos);
        let fired = fault.fired();
        fault.set_plan(FaultPlan::default());
        let want = match &r {
            Ok(()) => &after,
            Err(FsError::Io(_)) if fired => &before,
            Err(e) => panic!("{name}, read {n} failing: unexpected {e:?}"),
        };
        failed += r.is_err() as u64;
        let when = format!("{name}, read {n} failing ({r:?})");
        assert_eq!(&snapshot(&m.fs), want, "{when}: while mounted");
        check_clean(&m.fs, &when);
        // The caches forgot what the failed operation did: a new inode
        // gets a number no later mount hands out again (a full file system
        // may have no room for one).
        let create = |fs: &Fs, name: &[u8]| match fs.mknod(CTX, ROOT_INO, name, 0o100644, 0) {
            Ok(a) => Some(a.ino),
            Err(FsError::NoSpace { .. }) => None,
            Err(e) => panic!("{when}: creating a file: {e}"),
        };
        let later = create(&m.fs, b"later");
        let durable = crash(m);
        let m = mount(&durable);
        let mut got = snapshot(&m.fs);
        assert_eq!(
            got.remove("/later").is_some(),
            later.is_some(),
            "{when}: /later"
        );
        assert_eq!(&got, want, "{when}: after a crash");
        if let (Some(later), Some(again)) = (later, create(&m.fs, b"again")) {
            assert!(again > later, "{when}: inode {again} handed out twice");
        }
        check_clean(&m.fs, &format!("{when}, after a crash"));
        if !fired {
            eprintln!("{name}: {failed} of {n} runs failed, none half-way");
            return failed;
        }
    }
    panic!("{name}: still reading after 500 reads");
}

/// Files PREFIX0 .. PREFIX{n-1} in the root, each holding `data`.
fn numbered_files(fs: &Fs, prefix: &str, n: usize, data: &[u8]) -> Inos {
    let mut inos = Inos::new();
    for k in 0..n {
        // Inos is keyed by &'static str, as the tests' literal names are.
        let name: &'static str = Box::leak(format!("{prefix}{k}").into_boxed_str());
        let ino = fs
            .mknod(CTX, ROOT_INO, name.as_bytes(), 0o100644, 0)
            .unwrap()
            .ino;
        if !data.is_empty() {
            fs.write(ino, 0, data).unwrap();
        }
        inos.insert(name, ino);
    }
    inos
}

fn lookup(fs: &Fs, dir: u64, name: &str) -> u64 {
    fs.lookup(dir, name.as_bytes()).unwrap().ino
}

const PLAIN: RenameFlags = RenameFlags {
    noreplace: false,
    exchange: false,
};
const EXCHANGE: RenameFlags = RenameFlags {
    noreplace: false,
    exchange: true,
};

fn renames() -> Vec<(&'static str, Op)> {
    vec![
        ("file to another directory", |fs, i| {
            fs.rename(i["a"], b"f", i["b"], b"f2", PLAIN)
        }),
        ("file over a file", |fs, i| {
            fs.rename(i["a"], b"f", i["b"], b"g", PLAIN)
        }),
        ("file over an open file", |fs, i| {
            fs.open(i["g"])?;
            fs.rename(i["a"], b"f", i["b"], b"g", PLAIN)
        }),
        ("file within its directory", |fs, i| {
            fs.rename(i["a"], b"f", i["a"], b"f3", PLAIN)
        }),
        ("directory to another directory", |fs, i| {
            fs.rename(i["a"], b"d", i["b"], b"d2", PLAIN)
        }),
        ("directory over an empty directory", |fs, i| {
            fs.rename(i["a"], b"d", i["b"], b"e", PLAIN)
        }),
        ("exchange of directories", |fs, i| {
            fs.rename(i["a"], b"d", i["b"], b"e2", EXCHANGE)
        }),
        ("exchange of a file and a directory", |fs, i| {
            fs.rename(i["a"], b"f", i["b"], b"e2", EXCHANGE)
        }),
    ]
}

#[test]
fn a_rename_failing_at_any_read_changes_nothing() {
    for layout in LAYOUTS {
        a_rename_failing_at_any_read_changes_nothing_on(layout);
    }
}

fn a_rename_failing_at_any_read_changes_nothing_on(layout: Layout) {
    let (image, inos) = build(layout, 8 << 20, |fs, _| {
        let mut inos = Inos::new();
        let a = fs.mkdir(CTX, ROOT_INO, b"a", 0o755).unwrap().ino;
        let b = fs.mkdir(CTX, ROOT_INO, b"b", 0o755).unwrap().ino;
        let f = fs.mknod(CTX, a, b"f", 0o100644, 0).unwrap().ino;
        fs.write(f, 0, &vec![7u8; 10_000]).unwrap();
        let g = fs.mknod(CTX, b, b"g", 0o100644, 0).unwrap().ino;
        fs.write(g, 0, b"gee").unwrap();
        let d = fs.mkdir(CTX, a, b"d", 0o755).unwrap().ino;
        fs.mknod(CTX, d, b"x", 0o100644, 0).unwrap();
        fs.mkdir(CTX, b, b"e", 0o755).unwrap();
        let e2 = fs.mkdir(CTX, b, b"e2", 0o755).unwrap().ino;
        fs.mknod(CTX, e2, b"y", 0o100644, 0).unwrap();
        inos.extend([("a", a), ("b", b), ("g", g)]);
        inos
    });
    let mut total = 0;
    for (name, op) in renames() {
        total += every_failure_point(name, &image, &inos, op);
    }
    assert!(
        total >= 8,
        "{layout:?}: only {total} runs failed: the faults missed"
    );
}

fn others() -> Vec<(&'static str, Op)> {
    vec![
        ("mkdir", |fs, i| {
            fs.mkdir(CTX, i["b"], b"new", 0o755).map(drop)
        }),
        ("symlink", |fs, i| {
            fs.symlink(CTX, i["a"], b"sym", b"target").map(drop)
        }),
        ("unlink of a file with blocks", |fs, i| {
            fs.unlink(i["a"], b"f")
        }),
        ("rmdir", |fs, i| fs.rmdir(i["b"], b"e")),
        ("link", |fs, i| fs.link(i["f"], i["b"], b"f-link").map(drop)),
        ("truncation inside a block", |fs, i| {
            let sa = SetAttr {
                size: Some(5000),
                ..SetAttr::default()
            };
            fs.setattr(i["f"], &sa).map(drop)
        }),
        ("truncation of an inline file past the inode", |fs, i| {
            let sa = SetAttr {
                size: Some(30_000),
                ..SetAttr::default()
            };
            fs.setattr(i["small"], &sa).map(drop)
        }),
        ("write out of the inode", |fs, i| {
            fs.write(i["small"], 500, &[9; 9000]).map(drop)
        }),
        ("write across blocks", |fs, i| {
            fs.write(i["f"], 3000, &[8; 6000]).map(drop)
        }),
        ("setxattr", |fs, i| {
            fs.setxattr(i["f"], b"user.new", b"value", XattrMode::Create)
        }),
        ("removexattr", |fs, i| fs.removexattr(i["f"], b"user.k")),
        ("setxattr of a 64 KiB value", |fs, i| {
            fs.setxattr(i["f"], b"user.max", &[3; 65536], XattrMode::Create)
        }),
        ("replacing a long value", |fs, i| {
            fs.setxattr(i["small"], b"user.long", &[4; 50_000], XattrMode::Replace)
        }),
        ("replacing a long value by a short one", |fs, i| {
            fs.setxattr(i["small"], b"user.long", b"short", XattrMode::Replace)
        }),
        ("removing a long value", |fs, i| {
            fs.removexattr(i["small"], b"user.long")
        }),
        ("unlink of a file with a long value", |fs, i| {
            fs.unlink(i["a"], b"small")
        }),
        ("punching a hole", |fs, i| {
            let punch = FallocMode {
                keep_size: true,
                punch_hole: true,
                zero_range: false,
            };
            fs.fallocate(i["f"], 100, 8000, punch)
        }),
        ("allocating", |fs, i| {
            fs.fallocate(i["f"], 0, 20_000, FallocMode::default())
        }),
    ]
}

#[test]
fn every_other_operation_failing_at_any_read_changes_nothing() {
    for layout in LAYOUTS {
        every_other_operation_failing_at_any_read_changes_nothing_on(layout);
    }
}

fn every_other_operation_failing_at_any_read_changes_nothing_on(layout: Layout) {
    let (image, inos) = build(layout, 8 << 20, |fs, _| {
        let a = fs.mkdir(CTX, ROOT_INO, b"a", 0o755).unwrap().ino;
        let b = fs.mkdir(CTX, ROOT_INO, b"b", 0o755).unwrap().ino;
        let f = fs.mknod(CTX, a, b"f", 0o100644, 0).unwrap().ino;
        fs.write(f, 0, &vec![7u8; 10_000]).unwrap();
        fs.setxattr(f, b"user.k", b"v", XattrMode::Create).unwrap();
        let small = fs.mknod(CTX, a, b"small", 0o100644, 0).unwrap().ino;
        fs.write(small, 0, &[6u8; 1000]).unwrap();
        fs.setxattr(small, b"user.long", &[5; 65536], XattrMode::Create)
            .unwrap();
        fs.mkdir(CTX, b, b"e", 0o755).unwrap();
        Inos::from([("a", a), ("b", b), ("f", f), ("small", small)])
    });
    let mut total = 0;
    for (name, op) in others() {
        total += every_failure_point(name, &image, &inos, op);
    }
    assert!(
        total >= 13,
        "{layout:?}: only {total} runs failed: the faults missed"
    );
}

/// Extended attributes filling an inode record to near its largest size:
/// 32 KiB of names and values (a record of about 33 KiB; a symlink's
/// target adds 4 KiB more).
fn fill_xattrs(fs: &Fs, ino: u64) {
    for k in 0..8 {
        let name = format!("user.x{k}");
        let value = vec![k as u8; 4096 - name.len()];
        fs.setxattr(ino, name.as_bytes(), &value, XattrMode::Create)
            .unwrap();
    }
}

/// Appends 4 KiB blocks of 0x5a to `file` until the LD takes no more: the
/// blocks go straight into the file's list (no reservation, so the file
/// system ends up as full as the LD lets it be), then the size follows
/// (down from a size set beforehand: growing a file takes space).
fn fill(fs: &Fs, ld: &dyn LogicalDisk, file: u64) {
    let size = fs.getattr(file).unwrap().size;
    let mut b = size.div_ceil(4096);
    if b == 0 {
        fs.write(file, 0, &[0x5a; 4096]).unwrap();
        b = 1;
    }
    let sa = SetAttr {
        size: Some(1 << 40),
        ..SetAttr::default()
    };
    fs.setattr(file, &sa).unwrap();
    let list = ListId(fs.inode_record(file).unwrap().list);
    loop {
        match ld.write(None, list, b, &[0x5a; 4096]) {
            Ok(()) => b += 1,
            Err(LdError::NoSpace { .. }) => break,
            Err(e) => panic!("filling: {e}"),
        }
    }
    let sa = SetAttr {
        size: Some(b * 4096),
        ..SetAttr::default()
    };
    fs.setattr(file, &sa).unwrap();
}

#[test]
fn renames_of_large_inode_records_on_a_full_file_system_commit_whole_or_not_at_all() {
    let (image, inos) = build(Layout::Single, 12 << 20, |fs, lld| {
        let p = fs.mkdir(CTX, ROOT_INO, b"p", 0o755).unwrap().ino;
        let np = fs.mkdir(CTX, ROOT_INO, b"np", 0o755).unwrap().ino;
        let a = fs.mkdir(CTX, p, b"a", 0o755).unwrap().ino;
        let s = fs.mkdir(CTX, p, b"s", 0o755).unwrap().ino;
        let b = fs.symlink(CTX, np, b"b", &[b't'; 4095]).unwrap().ino;
        let c = fs.mkdir(CTX, np, b"c", 0o755).unwrap().ino;
        for ino in [p, np, a, s, b, c] {
            fill_xattrs(fs, ino);
        }
        let big = fs.mknod(CTX, ROOT_INO, b"big", 0o100644, 0).unwrap().ino;
        fill(fs, lld, big);
        Inos::from([("p", p), ("np", np), ("c", c), ("big", big)])
    });
    {
        let m = mount(&image);
        assert!(
            matches!(
                m.fs.write(inos["big"], 0, &[1; 4096]),
                Err(FsError::NoSpace { .. })
            ),
            "the file system is not full"
        );
    }
    let ops: Vec<(&str, Op)> = vec![
        // Four large records: p and np (entries, link counts), a (`..`)
        // and b.
        ("exchange of a directory and a symlink", |fs, i| {
            fs.rename(i["p"], b"a", i["np"], b"b", EXCHANGE)
        }),
        // p, np, s (`..`) and c, open, so it is kept as an orphan.
        ("directory over an open empty directory", |fs, i| {
            fs.open(i["c"])?;
            fs.rename(i["p"], b"s", i["np"], b"c", PLAIN)
        }),
    ];
    for (name, op) in ops {
        every_failure_point(name, &image, &inos, op);
    }
}

#[test]
fn holes_can_be_punched_and_files_deleted_on_a_full_file_system() {
    for layout in LAYOUTS {
        holes_can_be_punched_and_files_deleted_on_a_full_file_system_on(layout);
    }
}

/// (The dual layout fills its data device.)
fn holes_can_be_punched_and_files_deleted_on_a_full_file_system_on(layout: Layout) {
    let (image, _) = build(layout, 12 << 20, |_, _| Inos::new());
    let m = mount(&image);
    let fs = &m.fs;
    let f = fs.mknod(CTX, ROOT_INO, b"f", 0o100644, 0).unwrap().ino;
    let g = fs.mknod(CTX, ROOT_INO, b"g", 0o100644, 0).unwrap().ino;
    let h = fs.mknod(CTX, ROOT_INO, b"h", 0o100644, 0).unwrap().ino;
    fill(fs, &*m.ld, f);
    assert!(matches!(
        fs.write(g, 0, &[1; 4096]),
        Err(FsError::NoSpace { .. })
    ));
    let size = fs.getattr(f).unwrap().size;
    let punch = FallocMode {
        keep_size: true,
        punch_hole: true,
        zero_range: false,
    };
    // Unaligned: two edge blocks are rewritten, the rest deleted.
    fs.fallocate(f, (1 << 20) + 100, 2 << 20, punch).unwrap();
    let zero = FallocMode {
        keep_size: true,
        punch_hole: false,
        zero_range: true,
    };
    fs.fallocate(f, (4 << 20) + 7, 1 << 20, zero).unwrap();
    assert_eq!(fs.getattr(f).unwrap().size, size);
    assert!(size > 6 << 20, "only {size} bytes fit");
    let data = fs.read(f, 0, 6 << 20).unwrap();
    let (m1, m3, m4, m5) = (1 << 20, 3 << 20, 4 << 20, 5 << 20);
    for (range, want) in [
        (0..m1 + 100, 0x5a),
        (m1 + 100..m3 + 100, 0),
        (m3 + 100..m4 + 7, 0x5a),
        (m4 + 7..m5 + 7, 0),
        (m5 + 7..6 << 20, 0x5a),
    ] {
        assert!(
            data[range.clone()].iter().all(|&x| x == want),
            "bytes {range:?} are not all {want:#x}"
        );
    }
    // The punched space can be written again.
    fs.write(g, 0, &vec![2; 1 << 20]).unwrap();
    // Full again; deleting still works, and frees space.
    fill(fs, &*m.ld, g);
    fs.unlink(ROOT_INO, b"f").unwrap();
    fs.write(h, 0, &vec![3; 2 << 20]).unwrap();
    check_clean(fs, "after punching, deleting and writing");
    assert_eq!(fs.read(h, 0, 8).unwrap(), vec![3; 8]);
    let durable = crash(m);
    let m = mount(&durable);
    check_clean(&m.fs, "after a crash");
    assert_eq!(lookup(&m.fs, ROOT_INO, "h"), h);
    assert!(m.fs.lookup(ROOT_INO, b"f").is_err());
}

/// Growing a file frees nothing, so on a full file system it takes space
/// the way writes do (`reserve`): truncating an inline file up to 1 MiB
/// or zeroing a range past its end (each moves its data to a block of its
/// own) gets ENOSPC rather than eating the reserve kept for deletions;
/// deleting still works afterwards.
#[test]
fn growing_files_on_a_full_file_system_gets_enospc_and_deletes_still_work() {
    let (image, inos) = build(Layout::Single, 12 << 20, |fs, lld| {
        let mut inos = numbered_files(fs, "small", 40, &[7; 2000]);
        let big = fs.mknod(CTX, ROOT_INO, b"big", 0o100644, 0).unwrap().ino;
        fill(fs, lld, big);
        inos.insert("big", big);
        inos
    });
    let m = mount(&image);
    let fs = &m.fs;
    let zero_past_end = FallocMode {
        keep_size: false,
        punch_hole: false,
        zero_range: true,
    };
    let mut grown = 0;
    for k in 0..40usize {
        let ino = inos[format!("small{k}").as_str()];
        let r = if k % 2 == 0 {
            let sa = SetAttr {
                size: Some(1 << 20),
                ..SetAttr::default()
            };
            fs.setattr(ino, &sa).map(|_| ())
        } else {
            fs.fallocate(ino, 1000, 1 << 20, zero_past_end)
        };
        match r {
            Ok(()) => grown += 1,
            Err(FsError::NoSpace { .. }) => assert_eq!(fs.getattr(ino).unwrap().size, 2000),
            Err(e) => panic!("growing small{k}: {e}"),
        }
    }
    // What was left after filling (less than a block) fits one or two.
    assert!(grown <= 2, "{grown} of 40 files grew on a full file system");
    for k in 0..40usize {
        fs.unlink(ROOT_INO, format!("small{k}").as_bytes()).unwrap();
    }
    fs.unlink(ROOT_INO, b"big").unwrap();
    let f = fs.mknod(CTX, ROOT_INO, b"after", 0o100644, 0).unwrap().ino;
    fs.write(f, 0, &vec![3; 2 << 20]).unwrap();
    check_clean(fs, "after growing and deleting");
    let durable = crash(m);
    let m = mount(&durable);
    check_clean(&m.fs, "after a crash");
    assert_eq!(m.fs.read(f, 0, 8).unwrap(), vec![3; 8]);
}

/// An operation that fails a check (EEXIST) wrote nothing, so its abort
/// leaves the inode cache warm: afterwards every cached inode is served
/// without a device read (with every read failing, getattr still works).
#[test]
fn a_failed_check_keeps_the_inode_cache() {
    let (image, inos) = build(Layout::Single, 12 << 20, |fs, _| {
        numbered_files(fs, "f", 20, &[])
    });
    let m = mount(&image);
    for &ino in inos.values() {
        m.fs.getattr(ino).unwrap();
    }
    assert!(matches!(
        m.fs.mknod(CTX, ROOT_INO, b"f3", 0o100644, 0),
        Err(FsError::Exists)
    ));
    m.fault().set_plan(FaultPlan {
        fail_read_nth: Some(1),
        sticky: true,
        ..FaultPlan::default()
    });
    for (name, &ino) in &inos {
        let r = m.fs.getattr(ino);
        assert!(r.is_ok(), "{name} was evicted by the failed create: {r:?}");
    }
    assert!(
        !m.fault().fired(),
        "an inode was read from the device again"
    );
}

/// The engine under a file system, failing its Nth change (write, delete,
/// range or list delete, list creation) with NoSpace before making it: a
/// step of an operation failing after the ones before it were made.
struct FailNth {
    inner: Arc<Lld>,
    changes: std::sync::atomic::AtomicU64,
    fail_at: std::sync::atomic::AtomicU64,
}

impl FailNth {
    fn change(&self) -> Result<(), LdError> {
        use std::sync::atomic::Ordering::SeqCst;
        let n = self.changes.fetch_add(1, SeqCst) + 1;
        if n == self.fail_at.load(SeqCst) {
            return Err(LdError::NoSpace {
                needed: 1,
                available: 0,
            });
        }
        Ok(())
    }
}

impl LogicalDisk for FailNth {
    fn max_block_bytes(&self) -> usize {
        self.inner.max_block_bytes()
    }
    fn create_list(&self, aru: Option<AruId>, hints: ListHints) -> LdResult<ListId> {
        self.change()?;
        self.inner.create_list(aru, hints)
    }
    fn delete_list(&self, aru: Option<AruId>, list: ListId) -> LdResult<()> {
        self.change()?;
        self.inner.delete_list(aru, list)
    }
    fn list_hints(&self, list: ListId) -> LdResult<Option<ListHints>> {
        self.inner.list_hints(list)
    }
    fn write(&self, aru: Option<AruId>, list: ListId, index: u64, data: &[u8]) -> LdResult<()> {
        self.change()?;
        self.inner.write(aru, list, index, data)
    }
    fn read(&self, list: ListId, index: u64) -> LdResult<Option<Vec<u8>>> {
        self.inner.read(list, index)
    }
    fn delete(&self, aru: Option<AruId>, list: ListId, index: u64) -> LdResult<()> {
        self.change()?;
        self.inner.delete(aru, list, index)
    }
    fn delete_range(&self, aru: Option<AruId>, list: ListId, range: Range<u64>) -> LdResult<()> {
        self.change()?;
        self.inner.delete_range(aru, list, range)
    }
    fn indices(&self, list: ListId, from: u64, limit: usize) -> LdResult<Vec<u64>> {
        self.inner.indices(list, from, limit)
    }
    fn lists(&self, from: u64, limit: usize) -> LdResult<Vec<ListId>> {
        self.inner.lists(from, limit)
    }
    fn prefetch(&self, list: ListId) -> LdResult<()> {
        self.inner.prefetch(list)
    }
    fn begin_aru(&self) -> LdResult<AruId> {
        self.inner.begin_aru()
    }
    fn end_aru(&self, aru: AruId) -> LdResult<()> {
        self.inner.end_aru(aru)
    }
    fn abort_aru(&self, aru: AruId) -> LdResult<()> {
        self.inner.abort_aru(aru)
    }
    fn reserve(&self, aru: AruId, bytes: u64) -> LdResult<()> {
        self.inner.reserve(aru, bytes)
    }
    fn reserve_freeing(&self, aru: AruId, bytes: u64) -> LdResult<()> {
        self.inner.reserve_freeing(aru, bytes)
    }
    fn flush(&self) -> LdResult<()> {
        self.inner.flush()
    }
    fn flush_list(&self, list: ListId) -> LdResult<()> {
        self.inner.flush_list(list)
    }
    fn space(&self) -> SpaceStats {
        self.inner.space()
    }
}

/// Removing most of a big file on a full file system (unlink, unlink of an
/// open file then its release, truncation to an unaligned size, a punched
/// hole) with each of its steps failing in turn: the operation fails with
/// the file intact, the engine stays writable (the bulk delete is the
/// operation's last step, so no abort has to put back thousands of
/// entries), and the same removal then succeeds.
#[test]
fn a_big_removal_failing_at_any_step_keeps_the_file_and_the_engine_writable() {
    type Removal = fn(&Fs, u64) -> Result<(), FsError>;
    let removals: [(&str, Removal); 4] = [
        ("unlink", |fs, _| fs.unlink(ROOT_INO, b"big")),
        // Opened and unlinked first (below). Opened again, so that a
        // retry after a failed destroy (which leaves the orphan to the
        // next mount) is a last release too.
        ("release of an unlinked open file", |fs, ino| {
            fs.open(ino)?;
            fs.release(ino)?;
            fs.release(ino)
        }),
        ("truncation", |fs, ino| {
            let sa = SetAttr {
                size: Some(5000),
                ..SetAttr::default()
            };
            fs.setattr(ino, &sa).map(|_| ())
        }),
        ("punched hole", |fs, ino| {
            let punch = FallocMode {
                keep_size: true,
                punch_hole: true,
                zero_range: false,
            };
            fs.fallocate(ino, 5000, 1 << 40, punch)
        }),
    ];
    let (image, inos) = build(Layout::Single, 12 << 20, |fs, lld| {
        let big = fs.mknod(CTX, ROOT_INO, b"big", 0o100644, 0).unwrap().ino;
        fill(fs, lld, big);
        Inos::from([("big", big)])
    });
    let big = inos["big"];
    for (name, removal) in removals {
        for n in 1..=20u64 {
            let crash = Arc::new(CrashDevice::from_image(image.devices[0].clone()));
            let lld = Arc::new(Lld::open(crash.clone(), LldOptions::default()).unwrap());
            let ld = Arc::new(FailNth {
                inner: lld.clone(),
                changes: Default::default(),
                fail_at: n.into(),
            });
            let fs = Fs::mount(ld.clone(), FsOptions::default()).unwrap();
            ld.fail_at.store(0, std::sync::atomic::Ordering::SeqCst);
            if name.starts_with("release") {
                fs.open(big).unwrap();
                fs.unlink(ROOT_INO, b"big").unwrap();
            }
            let done = ld.changes.load(std::sync::atomic::Ordering::SeqCst);
            ld.fail_at
                .store(done + n, std::sync::atomic::Ordering::SeqCst);
            let before = snapshot(&fs);
            let r = removal(&fs, big);
            let when = format!("{name}, its change {n} failing ({r:?})");
            let failed = ld.changes.load(std::sync::atomic::Ordering::SeqCst) >= done + n;
            if failed {
                assert!(matches!(r, Err(FsError::NoSpace { .. })), "{when}");
                assert_eq!(snapshot(&fs), before, "{when}: the file changed");
                check_clean(&fs, &when);
            }
            ld.fail_at.store(0, std::sync::atomic::Ordering::SeqCst);
            if failed {
                removal(&fs, big).unwrap_or_else(|e| panic!("{when}: then, without faults: {e}"));
            } else {
                r.unwrap();
            }
            let g = fs
                .mknod(CTX, ROOT_INO, b"g", 0o100644, 0)
                .unwrap_or_else(|e| panic!("{when}: creating a file after the removal: {e}"))
                .ino;
            fs.write(g, 0, &vec![3; 1 << 20])
                .unwrap_or_else(|e| panic!("{when}: writing after the removal: {e}"));
            check_clean(&fs, &format!("{when}: after the removal"));
            drop(fs);
            drop(ld);
            match Arc::try_unwrap(lld) {
                Ok(l) => l.close().unwrap(),
                Err(_) => panic!("engine still shared"),
            }
            if !failed {
                break;
            }
        }
    }
}

/// The unlink of a file of 200,000 blocks on a full file system with each
/// of its steps failing in turn: the file stays whole and the unlink then
/// succeeds. The list delete is the unlink's last step, so no abort has to
/// put its entries back (when one did, the map leaves it dirtied again
/// left the retry short of room: ENOSPC).
#[test]
fn unlinking_a_file_of_200000_blocks_on_a_full_file_system_failing_at_any_step() {
    const BLOCKS: u64 = 200_000;
    let (image, inos) = build(Layout::Single, 64 << 20, |fs, lld| {
        let many = fs.mknod(CTX, ROOT_INO, b"many", 0o100644, 0).unwrap().ino;
        fs.write(many, 0, &[1; 4096]).unwrap();
        let list = ListId(fs.inode_record(many).unwrap().list);
        for i in 1..BLOCKS {
            lld.write(None, list, i, &[1]).unwrap();
        }
        let sa = SetAttr {
            size: Some(BLOCKS * 4096),
            ..SetAttr::default()
        };
        fs.setattr(many, &sa).unwrap();
        let big = fs.mknod(CTX, ROOT_INO, b"big", 0o100644, 0).unwrap().ino;
        fill(fs, lld, big);
        Inos::from([("many", many), ("big", big)])
    });
    for n in 1..=10u64 {
        let crash = Arc::new(CrashDevice::from_image(image.devices[0].clone()));
        let lld = Arc::new(Lld::open(crash, LldOptions::default()).unwrap());
        let ld = Arc::new(FailNth {
            inner: lld.clone(),
            changes: Default::default(),
            fail_at: n.into(),
        });
        let fs = Fs::mount(ld.clone(), FsOptions::default()).unwrap();
        assert!(matches!(
            fs.write(inos["big"], 0, &[2; 4096]),
            Err(FsError::NoSpace { .. })
        ));
        let r = fs.unlink(ROOT_INO, b"many");
        let failed = ld.changes.load(std::sync::atomic::Ordering::SeqCst) >= n;
        ld.fail_at.store(0, std::sync::atomic::Ordering::SeqCst);
        if failed {
            assert!(
                matches!(r, Err(FsError::NoSpace { .. })),
                "change {n}: {r:?}"
            );
            let many = inos["many"];
            assert_eq!(fs.getattr(many).unwrap().size, BLOCKS * 4096);
            assert_eq!(fs.read(many, (BLOCKS - 1) * 4096, 1).unwrap(), vec![1]);
            fs.unlink(ROOT_INO, b"many")
                .unwrap_or_else(|e| panic!("change {n} failed, then: {e}"));
        } else {
            r.unwrap();
        }
        let g = fs.mknod(CTX, ROOT_INO, b"g", 0o100644, 0).unwrap().ino;
        fs.write(g, 0, &[3; 4096])
            .unwrap_or_else(|e| panic!("change {n}: writing after the unlink: {e}"));
        check_clean(&fs, &format!("change {n}"));
        drop(fs);
        drop(ld);
        match Arc::try_unwrap(lld) {
            Ok(l) => l.close().unwrap(),
            Err(_) => panic!("engine still shared"),
        }
        if !failed {
            return;
        }
    }
    panic!("the unlink still fails at its 10th change");
}

/// Long values (lists of their own) that go with something else: with an
/// inode a rename replaces, and as a file capability that a write, a
/// truncation or a chown drops. Each commits whole or not at all, list
/// included, at any failing read (the check finds no list leaked or
/// missing).
#[test]
fn long_values_dropped_by_other_operations_at_any_failing_read() {
    let (image, inos) = build(Layout::Single, 8 << 20, |fs, _| {
        let a = fs.mkdir(CTX, ROOT_INO, b"a", 0o755).unwrap().ino;
        let f = fs.mknod(CTX, a, b"f", 0o100644, 0).unwrap().ino;
        fs.write(f, 0, &vec![7u8; 10_000]).unwrap();
        fs.setxattr(f, b"security.capability", &[1; 40_000], XattrMode::Create)
            .unwrap();
        fs.setxattr(f, b"user.long", &[2; 5000], XattrMode::Create)
            .unwrap();
        let small = fs.mknod(CTX, a, b"small", 0o100644, 0).unwrap().ino;
        fs.write(small, 0, &[6u8; 1000]).unwrap();
        fs.setxattr(small, b"user.long", &[5; 65536], XattrMode::Create)
            .unwrap();
        fs.setxattr(small, b"security.capability", &[3; 4097], XattrMode::Create)
            .unwrap();
        Inos::from([("a", a), ("f", f), ("small", small)])
    });
    let ops: Vec<(&str, Op)> = vec![
        ("rename over a file with long values", |fs, i| {
            fs.rename(i["a"], b"f", i["a"], b"small", PLAIN)
        }),
        ("write dropping a long capability", |fs, i| {
            fs.write(i["f"], 100, &[9; 100]).map(drop)
        }),
        (
            "write to an inline file dropping a long capability",
            |fs, i| fs.write(i["small"], 10, &[9; 10]).map(drop),
        ),
        ("truncation dropping a long capability", |fs, i| {
            let sa = SetAttr {
                size: Some(5000),
                ..SetAttr::default()
            };
            fs.setattr(i["f"], &sa).map(drop)
        }),
        ("chown dropping a long capability", |fs, i| {
            let sa = SetAttr {
                uid: Some(7),
                ..SetAttr::default()
            };
            fs.setattr(i["small"], &sa).map(drop)
        }),
    ];
    let mut total = 0;
    for (name, op) in ops {
        total += every_failure_point(name, &image, &inos, op);
    }
    assert!(total >= 5, "only {total} runs failed: the faults missed");
}

/// A write and a truncation drop the file capability before they reserve
/// (a long one: its list is deleted in the operation's ARU); refused on a
/// full file system, each takes the delete back: the capability reads
/// whole, while mounted and after a crash, and the check is clean.
#[test]
fn operations_refused_on_a_full_file_system_keep_the_long_capability_they_would_drop() {
    let cap: Vec<u8> = (0..40_000u32).map(|k| (k % 253) as u8).collect();
    let (image, inos) = build(Layout::Single, 12 << 20, |fs, lld| {
        let f = fs.mknod(CTX, ROOT_INO, b"f", 0o100644, 0).unwrap().ino;
        fs.write(f, 0, &[1; 100]).unwrap();
        let cap: Vec<u8> = (0..40_000u32).map(|k| (k % 253) as u8).collect();
        fs.setxattr(f, b"security.capability", &cap, XattrMode::Create)
            .unwrap();
        let big = fs.mknod(CTX, ROOT_INO, b"big", 0o100644, 0).unwrap().ino;
        fill(fs, lld, big);
        Inos::from([("f", f)])
    });
    let f = inos["f"];
    let m = mount(&image);
    let before = snapshot(&m.fs);
    let ops: [(&str, Op); 2] = [
        ("a write out of the inode", |fs, i| {
            fs.write(i["f"], 0, &[9; 8192]).map(drop)
        }),
        ("a truncation growing the file", |fs, i| {
            let sa = SetAttr {
                size: Some(1 << 20),
                ..SetAttr::default()
            };
            fs.setattr(i["f"], &sa).map(drop)
        }),
    ];
    for (name, op) in ops {
        assert!(
            matches!(op(&m.fs, &inos), Err(FsError::NoSpace { .. })),
            "{name}: not refused"
        );
        assert_eq!(
            m.fs.getxattr(f, b"security.capability").unwrap(),
            cap,
            "{name}"
        );
        assert_eq!(snapshot(&m.fs), before, "{name}");
        check_clean(&m.fs, name);
    }
    let durable = crash(m);
    let m = mount(&durable);
    assert_eq!(m.fs.getxattr(f, b"security.capability").unwrap(), cap);
    assert_eq!(snapshot(&m.fs), before);
    check_clean(&m.fs, "after a crash");
}

/// Resolves `path` ("/a/b") name by name with `lookup`, as the kernel does.
fn resolve(fs: &Fs, path: &str) -> Result<u64, FsError> {
    let mut ino = ROOT_INO;
    for name in path.split('/').filter(|n| !n.is_empty()) {
        ino = fs.lookup(ino, name.as_bytes())?.ino;
    }
    Ok(ino)
}

/// Every path of `want` resolves by lookups to the inode its description
/// names, and every path only `other` has is not found: what lookups see
/// (the directory bucket cache) agrees with what readdir reads from the LD.
fn check_lookups(fs: &Fs, want: &Tree, other: &Tree, when: &str) {
    for (path, what) in want {
        let ino: u64 = what
            .split(' ')
            .nth(1)
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{when}: no inode in {what:?}"));
        match resolve(fs, path) {
            Ok(got) => assert_eq!(got, ino, "{when}: lookup of {path}"),
            Err(e) => panic!("{when}: lookup of {path}: {e}"),
        }
    }
    for path in other.keys().filter(|p| !want.contains_key(*p)) {
        let r = resolve(fs, path);
        assert!(
            matches!(r, Err(FsError::NotFound | FsError::NotDir)),
            "{when}: {path} is gone, yet its lookup gives {r:?}"
        );
    }
}

/// Every rename and every other operation of the read-failure tests, with
/// each of its changes failing in turn after the caches were warmed by
/// lookups of every name (and of names still to come): a failed operation
/// leaves every lookup as before, so the bucket cache forgot what its
/// aborted ARU wrote; one that succeeds is seen by lookups at once.
#[test]
fn lookups_agree_with_the_tree_after_an_operation_fails_at_any_change() {
    let (image, inos) = build(Layout::Single, 8 << 20, |fs, _| {
        let mut inos = Inos::new();
        let a = fs.mkdir(CTX, ROOT_INO, b"a", 0o755).unwrap().ino;
        let b = fs.mkdir(CTX, ROOT_INO, b"b", 0o755).unwrap().ino;
        let f = fs.mknod(CTX, a, b"f", 0o100644, 0).unwrap().ino;
        fs.write(f, 0, &vec![7u8; 10_000]).unwrap();
        let g = fs.mknod(CTX, b, b"g", 0o100644, 0).unwrap().ino;
        fs.write(g, 0, b"gee").unwrap();
        let d = fs.mkdir(CTX, a, b"d", 0o755).unwrap().ino;
        fs.mknod(CTX, d, b"x", 0o100644, 0).unwrap();
        fs.mkdir(CTX, b, b"e", 0o755).unwrap();
        let e2 = fs.mkdir(CTX, b, b"e2", 0o755).unwrap().ino;
        fs.mknod(CTX, e2, b"y", 0o100644, 0).unwrap();
        // What `others` needs too.
        fs.setxattr(f, b"user.k", b"v", XattrMode::Create).unwrap();
        let small = fs.mknod(CTX, a, b"small", 0o100644, 0).unwrap().ino;
        fs.write(small, 0, &[6u8; 1000]).unwrap();
        fs.setxattr(small, b"user.long", &[5; 65536], XattrMode::Create)
            .unwrap();
        inos.extend([("a", a), ("b", b), ("g", g), ("f", f), ("small", small)]);
        inos
    });
    let mut failures = 0;
    for (name, op) in renames().into_iter().chain(others()) {
        // The tree the operation makes, for names to warm up.
        let after = {
            let m = mount(&image);
            op(&m.fs, &inos).unwrap_or_else(|e| panic!("{name}: fails without faults: {e}"));
            snapshot(&m.fs)
        };
        for n in 1..=100u64 {
            let crash = Arc::new(CrashDevice::from_image(image.devices[0].clone()));
            let lld = Arc::new(Lld::open(crash, LldOptions::default()).unwrap());
            let ld = Arc::new(FailNth {
                inner: lld.clone(),
                changes: Default::default(),
                fail_at: 0.into(),
            });
            let fs = Fs::mount(ld.clone(), FsOptions::default()).unwrap();
            let before = snapshot(&fs);
            check_lookups(&fs, &before, &after, &format!("{name}: warming"));
            let done = ld.changes.load(std::sync::atomic::Ordering::SeqCst);
            ld.fail_at
                .store(done + n, std::sync::atomic::Ordering::SeqCst);
            let r = op(&fs, &inos);
            let failed = ld.changes.load(std::sync::atomic::Ordering::SeqCst) >= done + n;
            ld.fail_at.store(0, std::sync::atomic::Ordering::SeqCst);
            let when = format!("{name}, its change {n} failing ({r:?})");
            if failed {
                assert!(r.is_err(), "{when}: succeeded");
                assert_eq!(snapshot(&fs), before, "{when}: the tree changed");
                check_lookups(&fs, &before, &after, &when);
                failures += 1;
                // And then it works, seen by lookups at once.
                op(&fs, &inos).unwrap_or_else(|e| panic!("{when}: then, without faults: {e}"));
            } else {
                r.unwrap_or_else(|e| panic!("{when}: {e}"));
            }
            assert_eq!(snapshot(&fs), after, "{when}: after the operation");
            check_lookups(
                &fs,
                &after,
                &before,
                &format!("{when}: after the operation"),
            );
            drop(fs);
            drop(ld);
            match Arc::try_unwrap(lld) {
                Ok(l) => l.close().unwrap(),
                Err(_) => panic!("engine still shared"),
            }
            if !failed {
                break;
            }
        }
    }
    assert!(
        failures >= 20,
        "only {failures} runs failed: the faults missed"
    );
}

/// Lookups are served from the bucket cache: once every name (and a
/// missing one) was looked up, lookups, a create and a rename in the same
/// directory read no directory bucket from the device (with every device
/// read failing, they still work). One create first has the engine read
/// the lists' hints, which it then keeps.
#[test]
fn looked_up_names_are_served_without_reading_their_buckets() {
    let (image, inos) = build(Layout::Single, 12 << 20, |fs, _| {
        numbered_files(fs, "f", 20, &[])
    });
    let m = mount(&image);
    m.fs.mknod(CTX, ROOT_INO, b"warm", 0o100644, 0).unwrap();
    for (name, &ino) in &inos {
        assert_eq!(lookup(&m.fs, ROOT_INO, name), ino);
    }
    assert!(matches!(
        m.fs.lookup(ROOT_INO, b"new"),
        Err(FsError::NotFound)
    ));
    m.fault().set_plan(FaultPlan {
        fail_read_nth: Some(1),
        sticky: true,
        ..FaultPlan::default()
    });
    for (name, &ino) in &inos {
        let r = m.fs.lookup(ROOT_INO, name.as_bytes());
        assert!(
            matches!(&r, Ok(a) if a.ino == ino),
            "{name}: {r:?} (a bucket was read from the device)"
        );
    }
    let new =
        m.fs.mknod(CTX, ROOT_INO, b"new", 0o100644, 0)
            .expect("a create in a looked-up bucket read the device")
            .ino;
    m.fs.rename(ROOT_INO, b"f3", ROOT_INO, b"new", PLAIN)
        .expect("a rename of looked-up names read the device");
    assert!(!m.fault().fired(), "a bucket was read from the device");
    m.fault().set_plan(FaultPlan::default());
    assert_eq!(lookup(&m.fs, ROOT_INO, "new"), inos["f3"]);
    assert!(matches!(
        m.fs.lookup(ROOT_INO, b"f3"),
        Err(FsError::NotFound)
    ));
    let _ = new;
    check_clean(&m.fs, "after the cached operations");
}
