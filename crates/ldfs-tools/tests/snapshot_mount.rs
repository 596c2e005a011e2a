//! Snapshots through real mounts (issue 18, docs/DESIGN.md "Snapshots"):
//! `ldfs snapshot` on a live mount, a snapshot mounted read-only beside it
//! (its old contents read back exactly, writes get EROFS), a deletion
//! refused while the snapshot is mounted and done once it is not, the
//! space history holds in `df` and `ldfs stats`, `ldfs checkpoints --json`
//! checked at every step, a snapshot of an unmounted image mounted with
//! the live mount started beside it (and `fsck -y` only checking while it
//! is mounted), and `fsck -n` clean at the end; a snapshot mount read over
//! and over while the live mount churns and its cleaner moves blocks; a
//! snapshot acknowledged right before a kill -9 of the daemon, concurrent
//! takes, and a dual pair's clear refusal.

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use common::{cstr, errno, fuse_usable, ldfs, mkfs, Mount};
use serde_json::Value;

/// Runs `ldfs ARGS`: exit code, stdout, stderr.
fn run(args: &[&str]) -> (i32, String, String) {
    let out = ldfs().args(args).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `ldfs snapshot MNT --name NAME`: the number it prints.
fn take(mnt: &Path, name: &str) -> u64 {
    let (code, out, err) = run(&["snapshot", s(mnt), "--name", name]);
    assert_eq!(code, 0, "{err}");
    out.trim()
        .parse()
        .unwrap_or_else(|_| panic!("not a number: {out:?}"))
}

/// `ldfs checkpoints TARGET --json`.
fn checkpoints(target: &Path) -> Value {
    let (code, out, err) = run(&["checkpoints", "--json", s(target)]);
    assert_eq!(code, 0, "{err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

/// The snapshots a listing names: number -> (name, mounted on).
fn snapshots(v: &Value) -> BTreeMap<u64, (String, Vec<String>)> {
    v["checkpoints"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["snapshot"] == true)
        .map(|r| {
            let on = r["mounted_on"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_str().unwrap().to_string())
                .collect();
            (
                r["number"].as_u64().unwrap(),
                (r["name"].as_str().unwrap().to_string(), on),
            )
        })
        .collect()
}

fn data(i: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|k| (k * 13 + i * 101 + k / 4096) as u8)
        .collect()
}

/// Every regular file under `root`: relative path -> contents.
fn tree(root: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            } else {
                out.insert(
                    p.strip_prefix(root).unwrap().to_path_buf(),
                    fs::read(&p).unwrap(),
                );
            }
        }
    }
    out
}

/// Bytes `df` shows as used on the file system at `dir`.
fn df_used(dir: &Path) -> u64 {
    let mut sv: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(cstr(dir).as_ptr(), &mut sv) }, 0);
    (sv.f_blocks - sv.f_bfree) * sv.f_frsize
}

/// `ldfs stats MNT`'s "history bytes" figure.
fn stats_history(mnt: &Path) -> u64 {
    let (code, out, err) = run(&["stats", s(mnt)]);
    assert_eq!(code, 0, "{err}");
    let line = out
        .lines()
        .find(|l| l.starts_with("history bytes"))
        .unwrap_or_else(|| panic!("no history in {out}"));
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

/// Each way of writing to a read-only snapshot mount gets EROFS.
fn assert_read_only(snap: &Path) {
    let f = snap.join("f0");
    let e = fs::OpenOptions::new().write(true).open(&f).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS), "open for writing: {e}");
    let e = fs::write(snap.join("new"), b"x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS), "create: {e}");
    let e = fs::create_dir(snap.join("newdir")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS), "mkdir: {e}");
    let e = fs::remove_file(&f).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS), "unlink: {e}");
    let r = unsafe { libc::truncate(cstr(&f).as_ptr(), 0) };
    assert_eq!((r, errno()), (-1, libc::EROFS), "truncate");
}

#[test]
fn a_snapshot_mounts_beside_the_live_tree_and_is_deleted_only_when_unmounted() {
    if !fuse_usable() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let img = t.path().join("snap.img");
    mkfs(&img, "128M");
    let live_dir = t.path().join("live");
    let snap_dir = t.path().join("snap");
    fs::create_dir(&snap_dir).unwrap();
    let snap_canon = snap_dir.canonicalize().unwrap().display().to_string();
    let live = Mount::new(&img, &live_dir, &[]);
    let before = checkpoints(&live_dir);
    assert!(snapshots(&before).is_empty(), "{before}");
    assert_eq!(before["history_bytes"], 0, "{before}");

    // The moment kept: files across directories, 8 MiB of data in one.
    fs::create_dir(live.path("d")).unwrap();
    fs::write(live.path("f0"), data(0, 8 << 20)).unwrap();
    fs::write(live.path("f1"), data(1, 70_000)).unwrap();
    fs::write(live.path("d/f2"), data(2, 5000)).unwrap();
    fs::write(live.path("d/small"), b"inline").unwrap();
    let kept = tree(&live_dir);
    let n = take(&live_dir, "before the change");
    let v = checkpoints(&live_dir);
    assert_eq!(
        snapshots(&v),
        BTreeMap::from([(n, ("before the change".to_string(), vec![]))]),
        "{v}"
    );

    // Change and delete; the big file's blocks are then history only.
    fs::write(live.path("f1"), data(9, 1000)).unwrap();
    fs::remove_file(live.path("f0")).unwrap();
    fs::remove_file(live.path("d/f2")).unwrap();
    fs::write(live.path("d/after"), b"new").unwrap();
    let (code, _, err) = run(&["sync", s(&live_dir)]);
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = run(&["checkpoint", s(&live_dir)]);
    assert_eq!(code, 0, "{err}");
    let now = tree(&live_dir);
    assert_ne!(now, kept);

    // Honest space: what only the snapshot holds is used, in df and stats.
    let v = checkpoints(&live_dir);
    let history = v["history_bytes"].as_u64().unwrap();
    assert!(
        history >= 8 << 20,
        "history {history} < the deleted 8 MiB: {v}"
    );
    assert_eq!(stats_history(&live_dir), history);
    let held = v["checkpoints"][0]["held_alone_bytes"].as_u64().unwrap();
    assert!(held >= 8 << 20, "{v}");
    let used_with_history = df_used(&live_dir);
    assert!(
        used_with_history >= history,
        "df used {used_with_history} < history {history}"
    );

    // Mounting a snapshot: ro is required, the number must exist.
    let (code, _, err) = run(&[
        "mount",
        "-o",
        &format!("snapshot={n}"),
        s(&img),
        s(&snap_dir),
    ]);
    assert_ne!(code, 0);
    assert!(err.contains(&format!("-o ro,snapshot={n}")), "{err}");
    let (code, _, err) = run(&[
        "mount",
        "-o",
        &format!("ro,snapshot={}", n + 1000),
        s(&img),
        s(&snap_dir),
    ]);
    assert_ne!(code, 0);
    assert!(
        err.contains(&format!("snapshot {} does not exist", n + 1000)),
        "{err}"
    );

    // Mounted beside the live mount, it reads its moment exactly.
    let snap = Mount::new(&img, &snap_dir, &[&format!("ro,snapshot={n}")]);
    assert_eq!(tree(&snap_dir), kept);
    assert_eq!(tree(&live_dir), now, "the live tree is untouched");
    assert_read_only(&snap_dir);
    // It cannot be made writable, nor take snapshots of its own.
    let (code, _, err) = run(&["mount", "-o", "remount,rw", s(&img), s(&snap_dir)]);
    assert_ne!(code, 0);
    assert!(
        err.contains(&format!("mount of snapshot {n}, which is read-only")),
        "{err}"
    );
    let (code, _, err) = run(&["mount", "-o", "remount,ro", s(&img), s(&snap_dir)]);
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = run(&["snapshot", s(&snap_dir)]);
    assert_ne!(code, 0);
    assert!(err.contains("mounted read-only"), "{err}");
    assert_read_only(&snap_dir);
    // The live mount still takes writes while the snapshot is mounted.
    fs::write(live.path("d/during"), b"written beside the snapshot").unwrap();
    let v = checkpoints(&live_dir);
    assert_eq!(
        snapshots(&v),
        BTreeMap::from([(
            n,
            ("before the change".to_string(), vec![snap_canon.clone()])
        )]),
        "{v}"
    );

    // Deleting it is refused while it is mounted, naming the mount.
    let (code, _, err) = run(&["snapshot", s(&live_dir), "--delete", &n.to_string()]);
    assert_ne!(code, 0, "deleted a mounted snapshot");
    assert!(err.contains(&format!("mounted on {snap_canon}")), "{err}");
    assert_eq!(tree(&snap_dir), kept, "the refused delete changed nothing");
    assert_eq!(snapshots(&checkpoints(&live_dir)).len(), 1);
    snap.unmount();

    // Unmounted, it is deleted, and its space comes back.
    let (code, out, err) = run(&[
        "snapshot",
        s(&live_dir),
        "--delete",
        &n.to_string(),
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let r: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(r["deleted"], n, "{r}");
    let v = checkpoints(&live_dir);
    assert!(snapshots(&v).is_empty(), "{v}");
    assert_eq!(v["history_bytes"], 0, "{v}");
    assert_eq!(stats_history(&live_dir), 0);
    let used = df_used(&live_dir);
    assert!(
        used + (8 << 20) <= used_with_history,
        "df used {used} after the delete, {used_with_history} before"
    );
    // Deleting it again: a clear error.
    let (code, _, err) = run(&["snapshot", s(&live_dir), "--delete", &n.to_string()]);
    assert_ne!(code, 0);
    assert!(err.contains("does not exist"), "{err}");

    // A snapshot of an unmounted image, with the live mount started
    // beside it afterwards (not taken for the snapshot's mount).
    let m = take(&live_dir, "");
    let kept2 = tree(&live_dir);
    fs::remove_file(live.path("f1")).unwrap();
    live.unmount();
    // Unmounted, the listing opens the image itself.
    let v = checkpoints(&img);
    assert_eq!(
        snapshots(&v),
        BTreeMap::from([(m, (String::new(), vec![]))])
    );
    let snap = Mount::new(&img, &snap_dir, &[&format!("ro,snapshot={m}")]);
    assert_eq!(tree(&snap_dir), kept2);
    // A repair, which may drop snapshots, only checks while one is mounted.
    let (code, out, err) = run(&["fsck", "-y", s(&img)]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        err.contains("a snapshot of") && out.contains("checking (read-only)"),
        "{out}{err}"
    );
    let live = Mount::new(&img, &live_dir, &[]);
    assert!(!live.path("f1").exists());
    assert_eq!(tree(&snap_dir), kept2);
    // Mounted, the image's listing names the mount point to ask instead.
    let (code, _, err) = run(&["checkpoints", s(&img)]);
    assert_ne!(code, 0);
    assert!(err.contains("is mounted on"), "{err}");
    let (code, _, err) = run(&["snapshot", s(&live_dir), "--delete", &m.to_string()]);
    assert_ne!(code, 0);
    assert!(err.contains(&format!("mounted on {snap_canon}")), "{err}");
    snap.unmount();
    let (code, _, err) = run(&["snapshot", s(&live_dir), "--delete", &m.to_string()]);
    assert_eq!(code, 0, "{err}");
    live.unmount();

    let v = checkpoints(&img);
    assert!(snapshots(&v).is_empty(), "{v}");
    let (code, out, err) = run(&["fsck", "-n", s(&img)]);
    assert_eq!(code, 0, "{out}{err}");
}

/// The issue's "mount a snapshot while the live mount churns; read it
/// while the cleaner moves blocks": a reader thread reads the snapshot
/// mount's whole tree over and over while the live mount overwrites and
/// deletes several times the device's free space and `ldfs clean` runs.
#[test]
fn a_snapshot_mount_reads_right_while_the_live_mount_churns_and_cleans() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;
    if !fuse_usable() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let img = t.path().join("churn.img");
    mkfs(&img, "96M");
    let live_dir = t.path().join("live");
    let snap_dir = t.path().join("snap");
    let live = Mount::new(&img, &live_dir, &[]);
    for i in 0..12 {
        fs::write(live.path(&format!("k{i}")), data(i, 1 << 20)).unwrap();
    }
    let kept = tree(&live_dir);
    let n = take(&live_dir, "kept");
    let snap = Mount::new(&img, &snap_dir, &[&format!("ro,snapshot={n}")]);

    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicUsize::new(0));
    let reader = {
        let (stop, reads, dir, kept) =
            (stop.clone(), reads.clone(), snap_dir.clone(), kept.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                assert!(
                    tree(&dir) == kept,
                    "snapshot {n} read wrong during the churn"
                );
                reads.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    // The kept files go from the live tree; then 8 files of 2 MiB are
    // overwritten 60 times (120 MiB through a 96 MiB device).
    for i in 0..12 {
        fs::remove_file(live.path(&format!("k{i}"))).unwrap();
    }
    for round in 0..60 {
        let i = round % 8;
        fs::write(live.path(&format!("c{i}")), data(100 + round, 2 << 20)).unwrap();
        if round % 15 == 14 {
            let (code, _, err) = run(&["clean", s(&live_dir), "--max-utilization", "95"]);
            assert_eq!(code, 0, "{err}");
        }
    }
    stop.store(true, Ordering::Relaxed);
    reader.join().expect("the snapshot reader failed");
    assert!(
        reads.load(Ordering::Relaxed) >= 2,
        "the snapshot was hardly read"
    );
    let (code, stats, err) = run(&["stats", s(&live_dir)]);
    assert_eq!(code, 0, "{err}");
    let cleaned: u64 = stats
        .lines()
        .find_map(|l| l.strip_prefix("cleaned: "))
        .and_then(|l| l.split(' ').next())
        .and_then(|w| w.parse().ok())
        .unwrap_or_else(|| panic!("{stats}"));
    assert!(cleaned > 0, "the cleaner never ran: {stats}");
    for i in 0..8 {
        let last = (0..60).filter(|r| r % 8 == i).max().unwrap();
        assert!(fs::read(live.path(&format!("c{i}"))).unwrap() == data(100 + last, 2 << 20));
    }
    assert_eq!(tree(&snap_dir), kept);
    snap.unmount();
    let (code, _, err) = run(&["snapshot", s(&live_dir), "--delete", &n.to_string()]);
    assert_eq!(code, 0, "{err}");
    live.unmount();
    let (code, out, err) = run(&["fsck", "-n", s(&img)]);
    assert_eq!(code, 0, "{out}{err}");
}

/// Snapshots acknowledged by `ldfs snapshot` survive a kill -9 of the live
/// daemon taken right after (and one taken concurrently with others gets a
/// number of its own); a snapshot mount keeps reading through the kill and
/// the recovery of the live mount beside it; a dual pair refuses snapshots
/// clearly.
#[test]
fn snapshots_survive_a_killed_daemon_and_concurrent_takes() {
    if !fuse_usable() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let img = t.path().join("kill.img");
    mkfs(&img, "64M");
    let live_dir = t.path().join("live");
    let snap_dir = t.path().join("snap");
    let live = Mount::new(&img, &live_dir, &[]);
    fs::write(live.path("a"), data(1, 300_000)).unwrap();
    let first = tree(&live_dir);
    let n = take(&live_dir, "first");
    let snap = Mount::new(&img, &snap_dir, &[&format!("ro,snapshot={n}")]);

    // Four at once, while files change: four distinct numbers, each
    // reported to its own command.
    let takers: Vec<_> = (0..4)
        .map(|k| {
            let dir = live_dir.clone();
            std::thread::spawn(move || take(&dir, &format!("concurrent {k}")))
        })
        .collect();
    for i in 0..20 {
        fs::write(live.path(&format!("w{}", i % 5)), data(i, 20_000)).unwrap();
    }
    let mut numbers: Vec<u64> = takers.into_iter().map(|h| h.join().unwrap()).collect();
    numbers.sort();
    numbers.dedup();
    assert_eq!(numbers.len(), 4, "{numbers:?}");
    let v = checkpoints(&live_dir);
    let listed = snapshots(&v);
    for (k, m) in numbers.iter().enumerate() {
        assert!(listed[m].0.starts_with("concurrent "), "{k}: {v}");
    }

    // Taken, acknowledged, then the daemon is killed before anything else.
    fs::write(live.path("b"), b"before the kill").unwrap();
    let second = tree(&live_dir);
    let last = take(&live_dir, "right before the kill");
    live.kill();
    assert_eq!(
        tree(&snap_dir),
        first,
        "the snapshot mount read through the kill"
    );
    let live = Mount::new(&img, &live_dir, &[]);
    assert_eq!(tree(&snap_dir), first, "and through the recovery");
    let v = checkpoints(&live_dir);
    let listed = snapshots(&v);
    assert_eq!(listed.len(), 6, "{v}");
    assert_eq!(listed[&last].0, "right before the kill");
    let last_dir = t.path().join("last");
    let m = Mount::new(&img, &last_dir, &[&format!("ro,snapshot={last}")]);
    assert_eq!(tree(&last_dir), second);
    m.unmount();
    snap.unmount();
    for k in listed.keys() {
        let (code, _, err) = run(&["snapshot", s(&live_dir), "--delete", &k.to_string()]);
        assert_eq!(code, 0, "{err}");
    }
    live.unmount();
    let (code, out, err) = run(&["fsck", "-n", s(&img)]);
    assert_eq!(code, 0, "{out}{err}");

    // A dual pair updates its data in place: no snapshots, said clearly.
    let data_img = t.path().join("dual.img");
    common::mkfs_dual(&data_img, &t.path().join("dual-meta.img"), "256M");
    let dual = Mount::new(&data_img, &live_dir, &[]);
    let (code, _, err) = run(&["snapshot", s(&live_dir)]);
    assert_ne!(code, 0);
    assert!(err.contains("dual file system"), "{err}");
    dual.unmount();
    let (code, _, err) = run(&["mount", "-o", "ro,snapshot=1", s(&data_img), s(&snap_dir)]);
    assert_ne!(code, 0);
    assert!(err.contains("dual file system"), "{err}");
    let (code, _, err) = run(&["mount", "-o", "protect=1h", s(&data_img), s(&live_dir)]);
    assert_ne!(code, 0);
    assert!(err.contains("dual file system"), "{err}");
}

/// The protected checkpoints (`-o protect=`) of the kept span, or the
/// whole listing's: number -> time.
fn protected(v: &Value) -> BTreeMap<u64, u64> {
    v["checkpoints"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["protected"] == true)
        .map(|r| (r["number"].as_u64().unwrap(), r["time"].as_u64().unwrap()))
        .collect()
}

/// Waits (up to 20 s) for a protected checkpoint numbered above `after`.
fn next_protected(mnt: &Path, after: u64) -> u64 {
    let t = std::time::Instant::now();
    loop {
        if let Some((&n, _)) = protected(&checkpoints(mnt)).range(after + 1..).next_back() {
            return n;
        }
        assert!(
            t.elapsed().as_secs() < 20,
            "no protected checkpoint after {after}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// A protected checkpoint taken after this call: one numbered above the
/// newest now, with a write in between so that one is taken at all (the
/// daemon takes none while nothing is written).
fn protected_after_this(mnt: &Path) -> u64 {
    let base = protected(&checkpoints(mnt))
        .keys()
        .next_back()
        .copied()
        .unwrap_or(0);
    fs::write(mnt.join("nudge"), b"x").unwrap();
    next_protected(mnt, base)
}

fn available(dir: &Path) -> u64 {
    let mut sv: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(cstr(dir).as_ptr(), &mut sv) }, 0);
    sv.f_bavail * sv.f_frsize
}

/// `-o protect=` keeps the state of every commit interval (issue 18): six
/// states a second or so apart on a freshly made image (kept table by
/// default) are six protected checkpoints (before generations, one every
/// span/8 = 7.5 s would have kept at most one of them), and each, mounted
/// read-only, holds exactly the files of its moment.
#[test]
fn protect_keeps_every_commit_intervals_state() {
    if !fuse_usable() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let img = t.path().join("every.img");
    mkfs(&img, "64M");
    let live_dir = t.path().join("live");
    let snap_dir = t.path().join("snap");
    let live = Mount::new(&img, &live_dir, &["protect=60s,commit=1"]);
    let mut moments = Vec::new();
    let start = std::time::Instant::now();
    for k in 0..6usize {
        fs::write(live.path("f"), data(k, 10_000 + k)).unwrap();
        fs::write(live.path(&format!("g{k}")), data(100 + k, 3000)).unwrap();
        if k == 3 {
            fs::remove_file(live.path("g1")).unwrap();
        }
        // The second one after the writes: the first may have been under
        // way (its tree taken) before they landed.
        protected_after_this(&live_dir);
        moments.push((protected_after_this(&live_dir), k));
    }
    // A commit interval (1 s) apart, not span/8 (7.5 s: 90 s for twelve).
    let took = start.elapsed();
    assert!(
        took.as_secs() < 24,
        "six protected checkpoints took {took:?}"
    );
    let kept = protected(&checkpoints(&live_dir));
    for (p, _) in &moments {
        assert!(
            kept.contains_key(p),
            "protected checkpoint {p} not listed: {kept:?}"
        );
    }
    let mut numbers: Vec<u64> = moments.iter().map(|m| m.0).collect();
    numbers.dedup();
    assert_eq!(
        numbers.len(),
        moments.len(),
        "one state a take: {moments:?}"
    );
    for (p, k) in &moments {
        let snap = Mount::new(&img, &snap_dir, &[&format!("ro,snapshot={p}")]);
        assert!(
            fs::read(snap_dir.join("f")).unwrap() == data(*k, 10_000 + *k),
            "checkpoint {p} (moment {k}): f"
        );
        for j in 0..6usize {
            let there = fs::read(snap_dir.join(format!("g{j}"))).ok();
            let want = (j <= *k && !(j == 1 && *k >= 3)).then(|| data(100 + j, 3000));
            assert!(there == want, "checkpoint {p} (moment {k}): g{j}");
        }
        snap.unmount();
    }
    live.unmount();
    let (code, out, err) = run(&["fsck", "-n", s(&img)]);
    assert_eq!(code, 0, "{out}{err}");
}

/// `-o protect=`: the states of the span are kept as protected checkpoints
/// (a deleted file is copied back from one, mounted read-only); what only
/// they hold is available in `df`, and a write that needs it gets it (the
/// oldest yield) where a snapshot's history would have refused it; old
/// ones expire.
#[test]
fn protected_checkpoints_undelete_a_file_and_yield_to_writes() {
    if !fuse_usable() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let img = t.path().join("protect.img");
    mkfs(&img, "64M");
    let live_dir = t.path().join("live");
    let snap_dir = t.path().join("snap");
    // One protected checkpoint every 40/8 = 5 s, kept 40 s.
    let live = Mount::new(&img, &live_dir, &["protect=40s,commit=1"]);
    let want = data(3, 200_000);
    fs::write(live.path("report"), &want).unwrap();
    let p = protected_after_this(&live_dir);
    fs::remove_file(live.path("report")).unwrap();

    // Undelete: mount the protected checkpoint, copy the file back.
    let snap = Mount::new(&img, &snap_dir, &[&format!("ro,snapshot={p}")]);
    fs::copy(snap_dir.join("report"), live.path("report")).unwrap();
    snap.unmount();
    assert!(fs::read(live.path("report")).unwrap() == want);

    // 24 MiB kept only by protected checkpoints: available in df.
    let before = available(&live_dir);
    fs::write(live.path("big"), data(4, 24 << 20)).unwrap();
    let p = protected_after_this(&live_dir);
    fs::remove_file(live.path("big")).unwrap();
    let (code, _, err) = run(&["checkpoint", s(&live_dir)]);
    assert_eq!(code, 0, "{err}");
    let v = checkpoints(&live_dir);
    let history = v["history_bytes"].as_u64().unwrap();
    assert!(history >= 24 << 20, "{v}");
    let after = available(&live_dir);
    assert!(
        after + (2 << 20) >= before,
        "df available {before} -> {after} with {history} bytes protected"
    );
    // 40 MiB more fit only if the protected checkpoints give theirs up.
    fs::write(live.path("bigger"), data(5, 40 << 20)).unwrap();
    let v = checkpoints(&live_dir);
    assert!(
        !protected(&v).contains_key(&p),
        "the protected checkpoint holding the 24 MiB is still kept: {v}"
    );
    assert!(v["history_bytes"].as_u64().unwrap() < 24 << 20, "{v}");
    assert!(fs::read(live.path("bigger")).unwrap() == data(5, 40 << 20));
    assert!(fs::read(live.path("report")).unwrap() == want);
    live.unmount();

    // A snapshot's history never yields: the same 40 MiB are refused.
    let live = Mount::new(&img, &live_dir, &[]);
    fs::remove_file(live.path("bigger")).unwrap();
    fs::write(live.path("big"), data(4, 24 << 20)).unwrap();
    let n = take(&live_dir, "holds 24 MiB");
    fs::remove_file(live.path("big")).unwrap();
    let e = fs::write(live.path("bigger"), data(5, 40 << 20)).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
    fs::remove_file(live.path("bigger")).unwrap();
    let (code, _, err) = run(&["snapshot", s(&live_dir), "--delete", &n.to_string()]);
    assert_eq!(code, 0, "{err}");
    live.unmount();

    // Expiry: kept 2 s (one every commit interval, 1 s), none older than
    // the span and an interval stays.
    let live = Mount::new(&img, &live_dir, &["protect=2s,commit=1"]);
    for i in 0..8 {
        fs::write(live.path("tick"), data(i, 5000)).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(700));
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let kept = protected(&checkpoints(&live_dir));
    assert!(!kept.is_empty());
    for (n, time) in &kept {
        assert!(
            time + 5 >= now,
            "protected checkpoint {n} of {time} kept at {now}"
        );
    }
    live.unmount();
    let (code, out, err) = run(&["fsck", "-n", s(&img)]);
    assert_eq!(code, 0, "{out}{err}");
}
