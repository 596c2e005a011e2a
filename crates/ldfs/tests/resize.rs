//! Resize (`lld::resize`, issue 17; docs/DESIGN.md "Resize"): a file system
//! on an in-memory image grown offline and online then filled past its old
//! capacity; shrunk with live data past the new end (moved first); a shrink
//! refused when the data does not fit and when a snapshot pins a segment
//! past the end; growth past what mkfs's slots hold refused; and a crash at
//! every device operation of a grow and of a shrink (`CrashDevice`, each cut
//! crashed with seeded unflushed writes kept or torn): the image opens at
//! the old or the new size, every file is there and fsck is clean
//! (`LDFS_SEED` picks other crash images; a failure prints the cut).

mod common;

use std::sync::Arc;

use ldfs::device::{CrashDevice, CrashOptions, Device, MemoryDevice};
use ldfs::fs::{Ctx, Fs, FsOptions, ROOT_INO};
use ldfs::fsck::{self, FsckOptions};
use ldfs::ld::{LdError, LogicalDisk};
use ldfs::lld::layout::MkfsOptions;
use ldfs::lld::{resize_offline, Lld, LldOptions};

const CTX: Ctx = Ctx {
    uid: 0,
    gid: 0,
    umask: 0,
};

const SEG: u64 = 256 << 10;

fn mkfs(max_bytes: Option<u64>) -> MkfsOptions {
    MkfsOptions {
        segment_bytes: SEG,
        max_block_bytes: 64 << 10,
        reserved_segments: Some(4),
        fs_id: 0x5e5e,
        max_bytes,
        kept_pages: 0,
    }
}

/// Bytes no compressor shrinks, from a seed (xorshift).
fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

type Files = Vec<(String, Vec<u8>)>;

fn mount(dev: Arc<dyn Device>) -> (Arc<Lld>, Fs) {
    let lld = Arc::new(Lld::open(dev, LldOptions::default()).unwrap());
    let ld: Arc<dyn LogicalDisk> = lld.clone();
    let fs = Fs::mount(ld, FsOptions::default()).unwrap();
    (lld, fs)
}

/// Writes `n` files of `bytes` each named `{prefix}{i}`; returns them.
fn write_files(fs: &Fs, prefix: &str, n: usize, bytes: usize, seed: u64) -> FsResultFiles {
    let mut out = Vec::new();
    for i in 0..n {
        let name = format!("{prefix}{i}");
        let data = noise(seed * 1000 + i as u64, bytes);
        let a = match fs.mknod(CTX, ROOT_INO, name.as_bytes(), 0o100644, 0) {
            Ok(a) => a,
            Err(e) => return Err((out, format!("{e}"))),
        };
        if let Err(e) = fs.write(a.ino, 0, &data) {
            let _ = fs.unlink(ROOT_INO, name.as_bytes());
            return Err((out, format!("{e}")));
        }
        out.push((name, data));
    }
    Ok(out)
}

/// What `write_files` wrote before an error, and the error.
type FsResultFiles = Result<Files, (Files, String)>;

/// A formatted image of `size` bytes whose live files sit mostly in its
/// upper segments: files written, then the first ones deleted (the log
/// sweeps the device upward).
fn image(size: u64, max_bytes: Option<u64>, live_bytes: usize) -> (Arc<MemoryDevice>, Files) {
    let dev = Arc::new(MemoryDevice::new(size));
    let lld = Arc::new(Lld::create(dev.clone(), &mkfs(max_bytes), LldOptions::default()).unwrap());
    Fs::format(&*lld, CTX).unwrap();
    let ld: Arc<dyn LogicalDisk> = lld.clone();
    let fs = Fs::mount(ld, FsOptions::default()).unwrap();
    let early = write_files(&fs, "early", live_bytes / 8192, 8192, 1).unwrap();
    let files = write_files(&fs, "f", live_bytes / 8192, 8192, 2).unwrap();
    for (name, _) in &early {
        fs.unlink(ROOT_INO, name.as_bytes()).unwrap();
    }
    drop(fs);
    lld.close().unwrap();
    (dev, files)
}

/// Opens the image, checks every file and that nothing else is there
/// (deleted files stay deleted), closes it; returns its segments. The
/// open must come from a checkpoint: a resize never leaves an image to a
/// rebuild from the summaries.
fn verify(dev: Arc<dyn Device>, files: &Files, what: &str) -> u32 {
    let (lld, fs) = mount(dev);
    assert!(
        !lld.open_report().rebuilt,
        "{what}: rebuilt from summaries: {:?}",
        lld.open_report().checkpoint_errors
    );
    let mut names: Vec<String> = fs
        .readdir(ROOT_INO, 0, 100_000)
        .unwrap()
        .into_iter()
        .map(|e| String::from_utf8_lossy(&e.name).into_owned())
        .filter(|n| n != "." && n != "..")
        .collect();
    let mut want: Vec<String> = files.iter().map(|(n, _)| n.clone()).collect();
    names.sort();
    want.sort();
    assert!(
        names == want,
        "{what}: {} entries, {} files",
        names.len(),
        want.len()
    );
    for (name, data) in files {
        let a = fs
            .lookup(ROOT_INO, name.as_bytes())
            .unwrap_or_else(|e| panic!("{what}: {name}: {e}"));
        let got = fs.read(a.ino, 0, data.len() as u32 + 1).unwrap();
        assert!(got == *data, "{what}: {name} differs");
    }
    let n = lld.geometry().segment_count;
    drop(fs);
    lld.close().unwrap();
    n
}

fn assert_fsck_clean(dev: Arc<dyn Device>, what: &str) {
    let f = fsck::check(dev, &FsckOptions::default()).unwrap();
    assert!(f.is_clean(), "{what}: fsck: {:#?}", f.lines());
}

#[test]
fn grow_offline_then_fill_the_new_space() {
    let (dev, files) = image(16 << 20, Some(256 << 20), 4 << 20);
    let before = verify(dev.clone(), &files, "before");
    let r = resize_offline(dev.clone(), Some(48 << 20), LldOptions::default()).unwrap();
    assert_eq!(dev.size_bytes(), 48 << 20);
    assert_eq!(
        (r.old_segments, r.new_segments),
        (before, verify(dev.clone(), &files, "grown"))
    );
    assert!(r.new_segments > 2 * before, "{r}");
    assert_fsck_clean(dev.clone(), "grown");
    // More than the old device held fits now.
    let (lld, fs) = mount(dev.clone());
    let more = write_files(&fs, "new", (20 << 20) / 8192, 8192, 3).unwrap();
    drop(fs);
    lld.close().unwrap();
    let all: Files = files.into_iter().chain(more).collect();
    verify(dev.clone(), &all, "filled");
    assert_fsck_clean(dev, "filled");
}

#[test]
fn grow_online_while_mounted_then_fill() {
    let (dev, files) = image(16 << 20, Some(256 << 20), 4 << 20);
    let (lld, fs) = mount(dev.clone());
    let cap0 = lld.space().capacity_bytes;
    // Fill until refused: the old size is full.
    let (mut kept, _) = write_files(&fs, "a", 10_000, 8192, 4).unwrap_err();
    let r = lld.grow(Some(64 << 20)).unwrap();
    assert_eq!(dev.size_bytes(), 64 << 20);
    assert!(lld.space().capacity_bytes > 3 * cap0, "{r}");
    let more = write_files(&fs, "b", (24 << 20) / 8192, 8192, 5).unwrap();
    kept.extend(more);
    drop(fs);
    lld.close().unwrap();
    drop(lld);
    let all: Files = files.into_iter().chain(kept).collect();
    assert_eq!(verify(dev.clone(), &all, "grown online"), r.new_segments);
    assert_fsck_clean(dev, "grown online");
}

#[test]
fn shrink_moves_live_data_out_of_the_cut_segments() {
    let (dev, files) = image(32 << 20, Some(256 << 20), 8 << 20);
    // The deletes left live files past the new end.
    let lld = Lld::open(dev.clone(), LldOptions::default()).unwrap();
    let end = ldfs::lld::resize::segments_for_size(&lld.geometry(), 16 << 20).unwrap();
    let past: u64 = lld
        .segment_usage()
        .iter()
        .filter(|(s, _)| s.0 >= end)
        .map(|(_, u)| u.live_bytes as u64)
        .sum();
    lld.close().unwrap();
    drop(lld);
    assert!(past > 1 << 20, "only {past} live bytes past segment {end}");
    let r = resize_offline(dev.clone(), Some(16 << 20), LldOptions::default()).unwrap();
    assert_eq!(dev.size_bytes(), 16 << 20);
    assert!(r.new_segments < r.old_segments / 2 + 1, "{r}");
    assert_fsck_clean(dev.clone(), "shrunk, as left");
    assert_eq!(verify(dev.clone(), &files, "shrunk"), r.new_segments);
    assert_fsck_clean(dev.clone(), "shrunk");
    // And it grows back.
    resize_offline(dev.clone(), Some(32 << 20), LldOptions::default()).unwrap();
    assert_eq!(verify(dev.clone(), &files, "regrown"), r.old_segments);
    assert_fsck_clean(dev, "regrown");
}

#[test]
fn shrink_refused_when_the_data_does_not_fit() {
    let (dev, files) = image(32 << 20, Some(256 << 20), 8 << 20);
    let before = dev.snapshot();
    let err = resize_offline(dev.clone(), Some(8 << 20), LldOptions::default()).unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(err, LdError::InvalidArgument(_)) && text.contains("live") && text.contains("fit"),
        "{text}"
    );
    assert_eq!(dev.size_bytes(), 32 << 20);
    verify(dev.clone(), &files, "refused");
    assert_fsck_clean(dev.clone(), "refused");
    assert_eq!(before.len(), dev.snapshot().len());
}

#[test]
fn a_snapshot_pinning_segments_past_the_end_refuses_a_shrink() {
    let (dev, files) = image(32 << 20, Some(256 << 20), 8 << 20);
    let lld = Lld::open(dev.clone(), LldOptions::default()).unwrap();
    let n = lld.take_snapshot("keep", 1).unwrap();
    lld.close().unwrap();
    drop(lld);
    let err = resize_offline(dev.clone(), Some(16 << 20), LldOptions::default()).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("snapshot") && text.contains(&n.to_string()) && text.contains("keep"),
        "{text}"
    );
    assert_eq!(dev.size_bytes(), 32 << 20);
    verify(dev.clone(), &files, "refused");
    // Deleted, the shrink goes through.
    let lld = Lld::open(dev.clone(), LldOptions::default()).unwrap();
    lld.delete_snapshot(n).unwrap();
    lld.close().unwrap();
    drop(lld);
    resize_offline(dev.clone(), Some(16 << 20), LldOptions::default()).unwrap();
    verify(dev.clone(), &files, "shrunk");
    assert_fsck_clean(dev, "shrunk");
}

#[test]
fn growth_past_what_the_slots_hold_is_refused() {
    // No room set aside: the slots hold the table's pages for the size
    // only (a page holds 256 entries), so growth stops there.
    let (dev, files) = image(16 << 20, None, 4 << 20);
    let err = resize_offline(dev.clone(), Some(1 << 30), LldOptions::default()).unwrap_err();
    assert!(err.to_string().contains("--max-size"), "{err}");
    assert_eq!(dev.size_bytes(), 16 << 20);
    // Within them it grows (and the image becomes resizable).
    let r = resize_offline(dev.clone(), Some(24 << 20), LldOptions::default()).unwrap();
    assert_eq!(verify(dev.clone(), &files, "grown"), r.new_segments);
    assert_fsck_clean(dev, "grown");
}

/// Cuts the power at every device operation of `resize` on a copy of
/// `base`; each crash image (two seeds: unflushed writes kept at random,
/// some torn) must open at the old or the new size with every file and a
/// clean fsck. Returns how many cuts landed inside the resize.
fn crash_every_step(base: &[u8], files: &Files, to: u64, old: u32, new: u32) -> u64 {
    let seed = common::base_seed();
    let mut n = 0u64;
    loop {
        let dev = Arc::new(CrashDevice::from_image(base.to_vec()));
        dev.cut_power_after(n);
        let r = resize_offline(dev.clone(), Some(to), LldOptions::default());
        if r.is_ok() {
            let img = dev.durable_image();
            let d: Arc<dyn Device> = Arc::new(MemoryDevice::from_vec(img));
            // As left, before any open writes: both slots of the new count.
            assert_fsck_clean(d.clone(), "completed, as left");
            assert_eq!(verify(d.clone(), files, "completed"), new);
            assert_fsck_clean(d, "completed");
            return n;
        }
        assert!(dev.power_is_cut(), "cut {n}: {:?}", r.err());
        for s in 0..2u64 {
            let what = format!("cut after {n} operations, crash seed {}", seed + s);
            let img = dev.crash_image(
                seed + s,
                &CrashOptions {
                    keep_probability: 0.5,
                    tear_probability: 0.3,
                },
            );
            let d: Arc<dyn Device> = Arc::new(MemoryDevice::from_vec(img));
            let got = verify(d.clone(), files, &what);
            assert!(
                got == old || got == new,
                "{what}: {got} segments, not {old} or {new}"
            );
            assert_fsck_clean(d, &what);
        }
        n += 1;
    }
}

#[test]
fn a_crash_anywhere_in_a_grow_leaves_the_old_or_the_new_size() {
    let (dev, files) = image(8 << 20, Some(64 << 20), 1 << 20);
    let base = dev.snapshot();
    let old = verify(dev.clone(), &files, "base");
    let probe = Arc::new(MemoryDevice::from_vec(base.clone()));
    let new = resize_offline(probe, Some(16 << 20), LldOptions::default())
        .unwrap()
        .new_segments;
    let cuts = crash_every_step(&base, &files, 16 << 20, old, new);
    assert!(cuts > 8, "only {cuts} device operations in a grow");
    eprintln!("grow: {cuts} cut points, each crashed twice");
}

#[test]
fn a_crash_anywhere_in_a_shrink_leaves_the_old_or_the_new_size() {
    let (dev, files) = image(16 << 20, Some(64 << 20), 2 << 20);
    let base = dev.snapshot();
    let old = verify(dev.clone(), &files, "base");
    let probe = Arc::new(MemoryDevice::from_vec(base.clone()));
    let new = resize_offline(probe, Some(8 << 20), LldOptions::default())
        .unwrap()
        .new_segments;
    let cuts = crash_every_step(&base, &files, 8 << 20, old, new);
    assert!(cuts > 8, "only {cuts} device operations in a shrink");
    eprintln!("shrink: {cuts} cut points, each crashed twice");
}

/// Online: the engine runs (threads off, so a seed replays), its files
/// flushed; `Lld::grow` is cut at every device operation. Each crash image
/// opens at the old or the new size with every flushed file.
#[test]
fn a_crash_anywhere_in_an_online_grow_leaves_the_old_or_the_new_size() {
    let (dev, files) = image(8 << 20, Some(64 << 20), 1 << 20);
    let base = dev.snapshot();
    let old = verify(dev.clone(), &files, "base");
    let opts = LldOptions {
        log_writer_thread: false,
        checkpoint_thread: false,
        ..Default::default()
    };
    let seed = common::base_seed();
    let mut n = 0u64;
    loop {
        let dev = Arc::new(CrashDevice::from_image(base.clone()));
        let lld = Arc::new(Lld::open(dev.clone(), opts.clone()).unwrap());
        // Work before the grow, flushed: it must survive every cut.
        let ld: Arc<dyn LogicalDisk> = lld.clone();
        let fs = Fs::mount(ld, FsOptions::default()).unwrap();
        let more = write_files(&fs, "pre", 16, 8192, 6).unwrap();
        lld.flush().unwrap();
        let new = ldfs::lld::resize::segments_for_size(&lld.geometry(), 16 << 20).unwrap();
        dev.cut_power_after(n);
        let r = lld.grow(Some(16 << 20));
        let all: Files = files.iter().cloned().chain(more).collect();
        drop(fs);
        if let Ok(r) = r {
            // The grow took exactly `n` operations: power on again.
            dev.cut_power_after(u64::MAX);
            lld.close().unwrap();
            drop(lld);
            let d: Arc<dyn Device> = Arc::new(MemoryDevice::from_vec(dev.durable_image()));
            assert_eq!(verify(d.clone(), &all, "completed"), r.new_segments);
            assert_fsck_clean(d, "completed");
            assert!(n > 6, "only {n} device operations in an online grow");
            eprintln!("online grow: {n} cut points, each crashed twice");
            return;
        }
        assert!(dev.power_is_cut(), "cut {n}: {:?}", r.err());
        Arc::try_unwrap(lld)
            .ok()
            .expect("one engine handle")
            .abandon();
        for s in 0..2u64 {
            let what = format!(
                "online grow cut after {n} operations, crash seed {}",
                seed + s
            );
            let img = dev.crash_image(
                seed + s,
                &CrashOptions {
                    keep_probability: 0.5,
                    tear_probability: 0.3,
                },
            );
            let d: Arc<dyn Device> = Arc::new(MemoryDevice::from_vec(img));
            let got = verify(d.clone(), &all, &what);
            assert!(
                got == old || got == new,
                "{what}: {got} segments, not {old} or {new}"
            );
            assert_fsck_clean(d, &what);
        }
        n += 1;
    }
}

/// A dual pair's metadata device is an ordinary log: it grows and shrinks
/// unmounted like any image, and the pair opens with every file (its data
/// device, whose groups do not resize, is refused by `ldfs resize`).
#[test]
fn a_dual_pairs_metadata_device_resizes_like_any_log() {
    use ldfs::dual::{Dual, DualMkfsOptions};
    let meta = Arc::new(MemoryDevice::new(16 << 20));
    let data = Arc::new(MemoryDevice::new(32 << 20));
    let opts = DualMkfsOptions {
        lld: mkfs(Some(128 << 20)),
        group_blocks: 256,
        meta_path: String::new(),
    };
    ldfs::dual::mkfs(meta.clone(), &*data, &opts).unwrap();
    let open = || {
        let d = Arc::new(Dual::open(meta.clone(), data.clone(), LldOptions::default()).unwrap());
        let ld: Arc<dyn LogicalDisk> = d.clone();
        (d.clone(), Fs::mount(ld, FsOptions::default()).unwrap())
    };
    {
        let d = Dual::open(meta.clone(), data.clone(), LldOptions::default()).unwrap();
        Fs::format(&d, CTX).unwrap();
        d.close().unwrap();
    }
    let (d, fs) = open();
    let files = write_files(&fs, "f", 200, 8192, 7).unwrap();
    drop(fs);
    d.close().unwrap();
    drop(d);
    let check = |what: &str| {
        let (d, fs) = open();
        for (name, want) in &files {
            let a = fs.lookup(ROOT_INO, name.as_bytes()).unwrap();
            assert!(fs.read(a.ino, 0, 9000).unwrap() == *want, "{what}: {name}");
        }
        drop(fs);
        d.close().unwrap();
        let f = fsck::check_dual(meta.clone(), data.clone(), &FsckOptions::default()).unwrap();
        assert!(f.is_clean(), "{what}: {:#?}", f.lines());
    };
    let r = resize_offline(meta.clone(), Some(48 << 20), LldOptions::default()).unwrap();
    assert!(r.new_segments > 2 * r.old_segments, "{r}");
    check("meta grown");
    resize_offline(meta.clone(), Some(8 << 20), LldOptions::default()).unwrap();
    assert_eq!(meta.size_bytes(), 8 << 20);
    check("meta shrunk");
}

/// Online grow beside four threads overwriting their blocks (the
/// engine's own threads on): no write fails, the grow commits mid-stream,
/// after a reopen every block holds its last write, more than the old
/// device held fits, and the engine's check is clean.
#[test]
fn grow_online_beside_writers() {
    use ldfs::ld::{ListHints, ListId};
    use std::sync::atomic::{AtomicBool, Ordering};
    const KEYS: u64 = 384; // 4 threads x 1.5 MiB: within the old capacity
    let dev = Arc::new(MemoryDevice::new(16 << 20));
    let lld =
        Arc::new(Lld::create(dev.clone(), &mkfs(Some(128 << 20)), LldOptions::default()).unwrap());
    let lists: Vec<ListId> = (0..4)
        .map(|_| lld.create_list(None, ListHints::default()).unwrap())
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = lists
        .iter()
        .enumerate()
        .map(|(t, &l)| {
            let (lld, stop) = (lld.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) || i < 2 * KEYS {
                    lld.write(None, l, i % KEYS, &noise(t as u64 * 1_000_000 + i, 4096))
                        .unwrap_or_else(|e| panic!("thread {t} write {i}: {e}"));
                    i += 1;
                }
                i
            })
        })
        .collect();
    std::thread::sleep(std::time::Duration::from_millis(30));
    let r = lld.grow(Some(64 << 20)).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(30));
    stop.store(true, Ordering::Relaxed);
    let counts: Vec<u64> = writers.into_iter().map(|w| w.join().unwrap()).collect();
    // More than the old device held, now.
    let big = lld.create_list(None, ListHints::default()).unwrap();
    for i in 0..(24u64 << 20) / 4096 {
        lld.write(None, big, i, &noise(7_000_000 + i, 4096))
            .unwrap();
    }
    lld.close().unwrap();
    drop(lld);
    let lld = Lld::open(dev.clone(), LldOptions::default()).unwrap();
    assert_eq!(lld.geometry().segment_count, r.new_segments);
    for (t, (&l, &n)) in lists.iter().zip(&counts).enumerate() {
        for idx in 0..KEYS {
            let last = (idx..n).step_by(KEYS as usize).last().unwrap();
            let got = lld.read(l, idx).unwrap().unwrap();
            assert!(
                got == noise(t as u64 * 1_000_000 + last, 4096),
                "thread {t} index {idx}"
            );
        }
    }
    for i in 0..(24u64 << 20) / 4096 {
        assert!(lld.read(big, i).unwrap().unwrap() == noise(7_000_000 + i, 4096));
    }
    eprintln!("grow beside writers: {counts:?} writes, {r}");
    // No file system on it: the engine's own check (map against the
    // summaries, every block's crc, the usage table).
    let check = lld.check_log().unwrap();
    assert!(check.problems.is_empty(), "{:#?}", check.problems);
    assert_eq!(lld.accounting_drift(), 0);
    lld.close().unwrap();
}
