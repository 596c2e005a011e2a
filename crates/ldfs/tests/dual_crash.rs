//! The dual layout crashed: a crash device under each of its two devices,
//! each losing its own random subset of unflushed writes (some torn). After
//! every recovery the tree passes `Fs::check`, no data block is both free
//! and referenced or leaked (`Dual::check_blocks`), and the tree is one
//! that existed at or after the last fsync, except that a block overwritten
//! in place may fail its checksum (docs/DESIGN.md, "Dual layout": the new
//! bytes reached the data device, the new pointer did not reach the log).
//! Never another file's bytes: a block reads as one of its own versions or
//! not at all. Also: metadata-only work never touches the data device, and
//! file data goes there.
//! `LDFS_DUAL_CRASH_CYCLES` (default 120), `LDFS_SEED`.

use std::sync::Arc;

use ldfs::device::{CrashDevice, CrashOptions, Device};
use ldfs::dual::{Dual, DualMkfsOptions};
use ldfs::fs::{Fs, SetAttr, XattrMode, ROOT_INO};
use ldfs::ld::LogicalDisk;
use ldfs::lld::layout::MkfsOptions;
use ldfs::lld::LldOptions;

mod common;

use common::{
    base_seed, env_u64, op, replay_fs_opts, same_but_overwritten_unreadable, snapshot, CTX, START,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const META_BYTES: u64 = 32 << 20;
const DATA_BYTES: u64 = 16 << 20;

fn lld_opts() -> LldOptions {
    LldOptions {
        map_budget_bytes: 256 << 10,
        checkpoint_log_bytes: 512 << 10,
        // Small partials: the log reaches its device between fsyncs, where
        // the data-before-metadata order matters.
        partial_bytes: 4 << 10,
        // One order of writes per seed, so a printed seed replays exactly
        // (as in fs_crash).
        checkpoint_thread: false,
        log_writer_thread: false,
        ..Default::default()
    }
}

fn mkfs_opts() -> DualMkfsOptions {
    DualMkfsOptions {
        lld: MkfsOptions {
            segment_bytes: 256 << 10,
            max_block_bytes: 64 << 10,
            reserved_segments: Some(8),
            fs_id: 77,
            max_bytes: None,
            kept_pages: 0,
        },
        group_blocks: 256,
        meta_path: String::new(),
    }
}

/// A fresh formatted pair.
fn fresh() -> (Arc<CrashDevice>, Arc<CrashDevice>) {
    let meta = Arc::new(CrashDevice::new(META_BYTES));
    let data = Arc::new(CrashDevice::new(DATA_BYTES));
    ldfs::dual::mkfs(meta.clone(), &*data, &mkfs_opts()).unwrap();
    let d = Dual::open(meta.clone(), data.clone(), lld_opts()).unwrap();
    Fs::format_at(&d, CTX, START).unwrap();
    d.close().unwrap();
    (meta, data)
}

fn mount(meta: &Arc<CrashDevice>, data: &Arc<CrashDevice>) -> (Arc<Dual>, Fs) {
    let d = Arc::new(Dual::open(meta.clone(), data.clone(), lld_opts()).unwrap());
    let ld: Arc<dyn LogicalDisk> = d.clone();
    let fs = Fs::mount(ld, replay_fs_opts()).unwrap();
    (d, fs)
}

fn unmount(d: Arc<Dual>, fs: Fs, crash: bool) {
    drop(fs);
    let d = Arc::try_unwrap(d).unwrap_or_else(|_| panic!("dual still shared"));
    if crash {
        d.abandon();
    } else {
        d.close().unwrap();
    }
}

fn cycles() -> u64 {
    env_u64("LDFS_DUAL_CRASH_CYCLES", 120)
}

fn crash_opts(rng: &mut ChaCha8Rng) -> CrashOptions {
    CrashOptions {
        keep_probability: rng.gen_range(0.0..1.0),
        tear_probability: rng.gen_range(0.0..0.5),
    }
}

#[test]
fn dual_fs_survives_crashes_of_either_device() {
    let seed = base_seed();
    let replay = format!("replay: LDFS_SEED={seed} cargo test --release -p ldfs --test dual_crash");
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let (mut meta, mut data) = fresh();
    let mut unreadable = 0;
    for cycle in 0..cycles() {
        let (d, fs) = mount(&meta, &data);
        let mut states = vec![snapshot(&fs)];
        let mut synced = 0;
        let mut log = Vec::new();
        let n = rng.gen_range(1..40);
        for _ in 0..n {
            if op(&fs, &mut rng, &mut log, &mut states) {
                synced = states.len() - 1;
            }
            states.push(snapshot(&fs));
        }
        // Both devices crash at this instant, each keeping its own subset
        // of what was not yet flushed.
        let (mo, dop) = (crash_opts(&mut rng), crash_opts(&mut rng));
        let mimg = meta.crash_image(rng.gen(), &mo);
        let dimg = data.crash_image(rng.gen(), &dop);
        unmount(d, fs, true);
        meta = Arc::new(CrashDevice::from_image(mimg));
        data = Arc::new(CrashDevice::from_image(dimg));
        let (d, fs) = mount(&meta, &data);
        let report = fs.check().unwrap();
        assert!(
            report.problems.is_empty(),
            "seed {seed} cycle {cycle}: check found {:#?}\n{replay}",
            report.problems
        );
        let blocks = d.check_blocks().unwrap();
        assert!(
            blocks.is_empty(),
            "seed {seed} cycle {cycle}: data blocks {blocks:#?}\n{replay}"
        );
        let got = snapshot(&fs);
        let damaged = !states[synced..].contains(&got);
        if damaged {
            assert!(
                same_but_overwritten_unreadable(&got, &states[synced..]),
                "seed {seed} cycle {cycle}: recovered tree is no state at or after the last fsync (op {synced} of {n})\n\
                 got {got:#?}\nops {log:#?}\n{replay}"
            );
            unreadable += 1;
        }
        unmount(d, fs, false);
        // A block that fails its checksum stays so until rewritten whole
        // (the workload's partial writes would fail on it): start afresh.
        if damaged || cycle % 40 == 39 {
            (meta, data) = fresh();
        }
    }
    eprintln!(
        "dual_crash: {unreadable} recoveries had a block overwritten in place fail its checksum"
    );
}

/// Mkdir, create, rename, link, chmod, xattrs, symlinks, deletes (which
/// free data blocks: that is bitmap work, in the log): not one write or
/// flush reaches the data device.
#[test]
fn metadata_only_work_leaves_the_data_device_unchanged() {
    let (meta, data) = fresh();
    let (d, fs) = mount(&meta, &data);
    let f = fs.mknod(CTX, ROOT_INO, b"data", 0o100644, 0).unwrap().ino;
    fs.write(f, 0, &vec![0x5a; 200_000]).unwrap();
    let g = fs.mknod(CTX, ROOT_INO, b"doomed", 0o100644, 0).unwrap().ino;
    fs.write(g, 0, &vec![0x6b; 50_000]).unwrap();
    fs.fsync().unwrap();
    unmount(d, fs, false);
    let before = data.current_image();
    let writes = data.stats();

    let (d, fs) = mount(&meta, &data);
    for i in 0..50 {
        let dir = fs
            .mkdir(CTX, ROOT_INO, format!("d{i}").as_bytes(), 0o755)
            .unwrap()
            .ino;
        let x = fs.mknod(CTX, dir, b"x", 0o100644, 0).unwrap().ino;
        fs.setxattr(x, b"user.k", b"v", XattrMode::Any).unwrap();
        fs.symlink(CTX, dir, b"l", b"../data").unwrap();
        fs.link(f, dir, b"hard").unwrap();
        fs.rename(
            dir,
            b"x",
            ROOT_INO,
            format!("x{i}").as_bytes(),
            Default::default(),
        )
        .unwrap();
        fs.setattr(
            x,
            &SetAttr {
                mode: Some(0o600),
                ..Default::default()
            },
        )
        .unwrap();
    }
    fs.unlink(ROOT_INO, b"doomed").unwrap();
    fs.fsync().unwrap();
    assert_eq!(fs.read(f, 0, 10).unwrap(), vec![0x5a; 10]);
    unmount(d, fs, false);
    let (d, fs) = mount(&meta, &data);
    assert_eq!(
        fs.lookup(ROOT_INO, b"d49").unwrap().kind,
        ldfs::fs::inode::Kind::Dir
    );
    unmount(d, fs, false);
    assert_eq!(
        data.stats(),
        writes,
        "the data device was written or flushed"
    );
    assert!(data.current_image() == before, "the data device changed");
}

/// A file's bytes are on the data device, and not in the log.
#[test]
fn file_data_goes_to_the_data_device() {
    let (meta, data) = fresh();
    let (d, fs) = mount(&meta, &data);
    let pattern: Vec<u8> = (0..8192u32).map(|i| (i * 7 + 3) as u8 ^ 0xc3).collect();
    let f = fs.mknod(CTX, ROOT_INO, b"f", 0o100644, 0).unwrap().ino;
    fs.write(f, 0, &pattern).unwrap();
    fs.fsync().unwrap();
    unmount(d, fs, false);
    let find = |img: &[u8]| img.windows(64).any(|w| w == &pattern[1000..1064]);
    assert!(
        find(&data.current_image()),
        "file bytes not on the data device"
    );
    assert!(
        !find(&meta.current_image()),
        "file bytes in the metadata log"
    );
    let mut b = vec![0u8; 8];
    data.read_at(&mut b, 0).unwrap();
    assert_eq!(&b, b"LDFSDATA");
}

/// A full data device (issue 12's item 1, on the dual layout): writes get
/// NoSpace, sizes claim nothing unstored, holes can be punched and files
/// deleted, the space they free is written again, and after a crash the
/// fsynced tree is there and consistent.
#[test]
fn a_full_data_device_says_no_space_and_deleting_frees_it() {
    use ldfs::fs::{FallocMode, FsError};
    let (meta, data) = fresh();
    let (d, fs) = mount(&meta, &data);
    let mk = |name: &[u8]| fs.mknod(CTX, ROOT_INO, name, 0o100644, 0).unwrap().ino;
    let (f, g, h) = (mk(b"f"), mk(b"g"), mk(b"h"));
    let fill = |ino: u64, byte: u8| -> u64 {
        let mut off = fs.getattr(ino).unwrap().size;
        for len in [64 << 10, 4096] {
            loop {
                match fs.write(ino, off, &vec![byte; len]) {
                    Ok(n) => off += n as u64,
                    Err(FsError::NoSpace { .. }) => break,
                    Err(e) => panic!("filling: {e}"),
                }
            }
        }
        assert_eq!(
            fs.getattr(ino).unwrap().size,
            off,
            "size claims unstored data"
        );
        off
    };
    let size = fill(f, 0x5a);
    assert!(
        size > DATA_BYTES / 2,
        "only {size} bytes fit on the data device"
    );
    assert!(matches!(
        fs.write(g, 0, &[1; 64 << 10]),
        Err(FsError::NoSpace { .. })
    ));
    let punch = FallocMode {
        keep_size: true,
        punch_hole: true,
        zero_range: false,
    };
    fs.fallocate(f, (1 << 20) + 100, 2 << 20, punch).unwrap();
    assert_eq!(fs.getattr(f).unwrap().size, size);
    let got = fs.read(f, 0, 4 << 20).unwrap();
    assert!(got[..(1 << 20) + 100].iter().all(|&b| b == 0x5a));
    assert!(got[(1 << 20) + 100..(3 << 20) + 100]
        .iter()
        .all(|&b| b == 0));
    assert!(got[(3 << 20) + 100..].iter().all(|&b| b == 0x5a));
    fs.write(g, 0, &vec![2; 1 << 20]).unwrap();
    fill(g, 2);
    fs.unlink(ROOT_INO, b"f").unwrap();
    fs.write(h, 0, &vec![3; 2 << 20]).unwrap();
    fs.fsync().unwrap();
    assert!(fs.check().unwrap().problems.is_empty());
    assert_eq!(d.check_blocks().unwrap(), Vec::<String>::new());
    let mimg = meta.crash_image(1, &CrashOptions::default());
    let dimg = data.crash_image(2, &CrashOptions::default());
    unmount(d, fs, true);
    let (meta, data) = (
        Arc::new(CrashDevice::from_image(mimg)),
        Arc::new(CrashDevice::from_image(dimg)),
    );
    let (d, fs) = mount(&meta, &data);
    assert!(fs.check().unwrap().problems.is_empty());
    assert_eq!(d.check_blocks().unwrap(), Vec::<String>::new());
    assert!(fs.lookup(ROOT_INO, b"f").is_err());
    let h = fs.lookup(ROOT_INO, b"h").unwrap().ino;
    assert_eq!(fs.read(h, 0, 2 << 20).unwrap(), vec![3; 2 << 20]);
    unmount(d, fs, false);
}

/// Review 24 probe: the crash test above with `-o discard` on the dual
/// pair (every flush discards the data blocks it makes free again) and
/// `ldfs trim`'s `Dual::trim_data` run after some fsyncs, the data device
/// alternating per cycle between reading discarded blocks as zeros and
/// keeping their old bytes. A discard of a block that durable metadata
/// (or metadata a crash may bring back) still names shows as a block that
/// fails its checksum where no overwrite in place explains it, or as a
/// recovered tree that is no state at or after the last fsync.
#[test]
fn dual_fs_with_discard_survives_crashes_of_either_device() {
    let seed = base_seed() ^ 0xd15c;
    let replay = format!(
        "replay: LDFS_SEED={} cargo test --release -p ldfs --test dual_crash dual_fs_with_discard (seed xored with 0xd15c)",
        base_seed()
    );
    let opts = || LldOptions {
        discard: true,
        ..lld_opts()
    };
    let mount_d = |meta: &Arc<CrashDevice>, data: &Arc<CrashDevice>| {
        let d = Arc::new(Dual::open(meta.clone(), data.clone(), opts()).unwrap());
        let ld: Arc<dyn LogicalDisk> = d.clone();
        let fs = Fs::mount(ld, replay_fs_opts()).unwrap();
        (d, fs)
    };
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let (mut meta, mut data) = fresh();
    let (mut unreadable, mut discarded, mut trimmed) = (0u64, 0u64, 0u64);
    for cycle in 0..cycles() {
        data.set_discard_keeps_old(cycle % 2 == 1);
        let (d, fs) = mount_d(&meta, &data);
        let mut states = vec![snapshot(&fs)];
        let mut synced = 0;
        let mut log = Vec::new();
        let n = rng.gen_range(1..40);
        for _ in 0..n {
            if op(&fs, &mut rng, &mut log, &mut states) {
                synced = states.len() - 1;
                if rng.gen_bool(0.3) {
                    trimmed += d.trim_data().unwrap().0;
                }
            }
            states.push(snapshot(&fs));
        }
        discarded += d.stats().discarded;
        let (mo, dop) = (crash_opts(&mut rng), crash_opts(&mut rng));
        let mimg = meta.crash_image(rng.gen(), &mo);
        let dimg = data.crash_image(rng.gen(), &dop);
        unmount(d, fs, true);
        meta = Arc::new(CrashDevice::from_image(mimg));
        data = Arc::new(CrashDevice::from_image(dimg));
        data.set_discard_keeps_old(cycle % 2 == 1);
        let (d, fs) = mount_d(&meta, &data);
        let report = fs.check().unwrap();
        assert!(
            report.problems.is_empty(),
            "seed {seed} cycle {cycle}: check found {:#?}\n{replay}",
            report.problems
        );
        let blocks = d.check_blocks().unwrap();
        assert!(
            blocks.is_empty(),
            "seed {seed} cycle {cycle}: data blocks {blocks:#?}\n{replay}"
        );
        let got = snapshot(&fs);
        let damaged = !states[synced..].contains(&got);
        if damaged {
            assert!(
                same_but_overwritten_unreadable(&got, &states[synced..]),
                "seed {seed} cycle {cycle}: recovered tree is no state at or after the last fsync (op {synced} of {n})\n\
                 got {got:#?}\nops {log:#?}\n{replay}"
            );
            unreadable += 1;
        }
        unmount(d, fs, false);
        if damaged || cycle % 40 == 39 {
            (meta, data) = fresh();
        }
    }
    eprintln!(
        "dual_crash with discard: {discarded} blocks discarded by flushes, {trimmed} by trims, {unreadable} recoveries with a block overwritten in place unreadable"
    );
    assert!(discarded > 0 && trimmed > 0, "the probe discarded nothing");
}
