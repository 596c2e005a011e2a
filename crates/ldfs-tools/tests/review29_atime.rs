//! Review 29 probes through real mounts: an atime a read set (kept in the
//! daemon's memory, not written by the read) reaches the image at every
//! clean end of the daemon and at every flush the README names, so a
//! kill -9 after that flush keeps it; a snapshot mount writes nothing.
//!
//! Each probe reads a file with `strictatime` (the read reaches ldfs: the
//! page cache is dropped first), notes the atime stat shows, ends the
//! daemon or flushes and kills it, and mounts again with `noatime`: the
//! atime must be the one stat showed. The ignored one shows an open
//! defect (its `ignore` names the finding).

mod common;

use std::fs::{self, File};
use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{fuse_usable, is_mounted, ldfs, mkfs, mkfs_dual, Mount, Succeeds};

/// Reads `p` through to the daemon; returns the atime stat shows after.
fn read_through(p: &Path) -> (i64, i64) {
    let mut f = File::open(p).unwrap();
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    let mut buf = Vec::new();
    f.read_to_end(&mut buf).unwrap();
    drop(f);
    atime(p)
}

fn atime(p: &Path) -> (i64, i64) {
    let md = fs::metadata(p).unwrap();
    (md.atime(), md.atime_nsec())
}

struct Setup {
    _t: tempfile::TempDir,
    img: PathBuf,
    mnt: PathBuf,
}

/// An image with /f and /g (written, then unmounted), so the next mount's
/// read sets a new atime.
fn setup(name: &str) -> Setup {
    let t = tempfile::tempdir().unwrap();
    let img = t.path().join(format!("{name}.img"));
    let mnt = t.path().join("mnt");
    mkfs(&img, "64M");
    let m = Mount::new(&img, &mnt, &[]);
    fs::write(m.path("f"), vec![5u8; 20_000]).unwrap();
    fs::write(m.path("g"), b"another file").unwrap();
    fs::create_dir(m.path("d")).unwrap();
    m.unmount();
    Setup { _t: t, img, mnt }
}

/// Mounts again with noatime and checks f's atime.
fn check_kept(s: &Setup, want: (i64, i64), how: &str) {
    let m = Mount::new(&s.img, &s.mnt, &["noatime"]);
    let got = atime(&m.path("f"));
    m.unmount();
    assert_eq!(
        got, want,
        "{how}: the atime stat showed before is not on the image ({got:?} there, {want:?} shown)"
    );
}

/// A read, then a flush the README names, then kill -9: the atime is kept.
fn flush_then_kill(name: &str, flush: impl FnOnce(&Setup, &Mount)) {
    let s = setup(name);
    let m = Mount::new(&s.img, &s.mnt, &["strictatime"]);
    std::thread::sleep(Duration::from_millis(20));
    let shown = read_through(&m.path("f"));
    flush(&s, &m);
    m.kill();
    check_kept(&s, shown, name);
}

#[test]
fn an_atime_survives_kill_after_ldfs_sync() {
    if !fuse_usable() {
        return;
    }
    flush_then_kill("ldfs sync", |s, _| {
        ldfs().arg("sync").arg(&s.mnt).succeeds();
    });
}

#[test]
fn an_atime_survives_kill_after_fsync_of_another_file() {
    if !fuse_usable() {
        return;
    }
    flush_then_kill("fsync of g", |_, m| {
        File::options()
            .write(true)
            .open(m.path("g"))
            .unwrap()
            .sync_all()
            .unwrap();
    });
}

#[test]
fn an_atime_survives_kill_after_fsyncdir() {
    if !fuse_usable() {
        return;
    }
    flush_then_kill("fsync of a directory", |_, m| {
        File::open(m.path("d")).unwrap().sync_all().unwrap();
    });
}

#[test]
fn an_atime_survives_kill_after_the_periodic_commit() {
    if !fuse_usable() {
        return;
    }
    let s = setup("commit");
    let m = Mount::new(&s.img, &s.mnt, &["strictatime", "commit=1"]);
    std::thread::sleep(Duration::from_millis(20));
    let shown = read_through(&m.path("f"));
    std::thread::sleep(Duration::from_millis(2500));
    m.kill();
    check_kept(&s, shown, "commit=1, 2.5 s");
}

#[test]
fn an_atime_survives_kill_after_remount_ro() {
    if !fuse_usable() {
        return;
    }
    flush_then_kill("remount,ro", |s, _| {
        ldfs()
            .args(["mount", "-o", "remount,ro"])
            .arg(&s.img)
            .arg(&s.mnt)
            .succeeds();
    });
}

/// `ldfs checkpoint MNT` (the next mount has nothing to roll forward): the
/// checkpoint holds what stat showed, atimes included?
#[test]
fn an_atime_survives_kill_after_ldfs_checkpoint() {
    if !fuse_usable() {
        return;
    }
    flush_then_kill("ldfs checkpoint", |s, _| {
        ldfs().arg("checkpoint").arg(&s.mnt).succeeds();
    });
}

/// remount,ro then remount,rw, then a clean unmount.
#[test]
fn an_atime_survives_remount_ro_rw_and_unmount() {
    if !fuse_usable() {
        return;
    }
    let s = setup("ro-rw");
    let m = Mount::new(&s.img, &s.mnt, &["strictatime"]);
    std::thread::sleep(Duration::from_millis(20));
    let first = read_through(&m.path("f"));
    for opt in ["remount,ro", "remount,rw"] {
        ldfs()
            .args(["mount", "-o", opt])
            .arg(&s.img)
            .arg(&s.mnt)
            .succeeds();
    }
    assert_eq!(atime(&m.path("f")), first);
    std::thread::sleep(Duration::from_millis(20));
    let shown = read_through(&m.path("f"));
    assert_ne!(shown, first, "strictatime: no update after remount,rw");
    m.unmount();
    check_kept(&s, shown, "remount,ro, remount,rw, unmount");
}

/// SIGTERM on a busy mount (a process's cwd inside, a file held open):
/// the daemon detaches and ends with a final checkpoint holding the atime.
#[test]
fn an_atime_survives_sigterm_on_a_busy_mount() {
    if !fuse_usable() {
        return;
    }
    let s = setup("busy");
    let mut m = Mount::new(&s.img, &s.mnt, &["strictatime"]);
    let mut squatter = Command::new("sleep")
        .arg("60")
        .current_dir(m.path("d"))
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let held = File::open(m.path("g")).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let shown = read_through(&m.path("f"));
    let st = m
        .signal_within(libc::SIGTERM, Duration::from_secs(15))
        .expect("the daemon still runs 15 s after SIGTERM");
    let _ = squatter.kill();
    let _ = squatter.wait();
    drop(held);
    assert!(st.success(), "daemon exited with {st}");
    assert!(!is_mounted(&s.mnt));
    check_kept(&s, shown, "SIGTERM on a busy mount");
}

/// A lazy detach with a file still open: the daemon serves reads through
/// the open descriptor until it is closed, then ends; those reads' atimes
/// are on the image.
#[test]
fn an_atime_of_a_read_after_a_lazy_detach_survives_the_end() {
    if !fuse_usable() {
        return;
    }
    let s = setup("lazy");
    let mut m = Mount::new(&s.img, &s.mnt, &["strictatime"]);
    let mut f = File::open(m.path("f")).unwrap();
    let st = Command::new("fusermount3")
        .args(["-u", "-z"])
        .arg(&s.mnt)
        .status()
        .unwrap();
    assert!(st.success());
    std::thread::sleep(Duration::from_millis(20));
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    let mut buf = Vec::new();
    f.read_to_end(&mut buf).unwrap();
    assert_eq!(buf.len(), 20_000);
    let md = f.metadata().unwrap();
    let shown = (md.atime(), md.atime_nsec());
    drop(f);
    let st = m
        .wait_within(Duration::from_secs(15))
        .expect("the daemon still runs 15 s after its last file closed");
    assert!(st.success(), "daemon exited with {st}");
    check_kept(&s, shown, "a read after a lazy detach");
}

/// The dual layout: a clean unmount writes the atime.
#[test]
fn an_atime_survives_a_dual_unmount_and_a_dual_sync_then_kill() {
    if !fuse_usable() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let (data, meta) = (t.path().join("data.img"), t.path().join("meta.img"));
    mkfs_dual(&data, &meta, "128M");
    let mnt = t.path().join("mnt");
    let m = Mount::new(&data, &mnt, &[]);
    fs::write(m.path("f"), vec![3u8; 50_000]).unwrap();
    m.unmount();
    let kept = |want: (i64, i64), how: &str| {
        let m = Mount::new(&data, &mnt, &["noatime"]);
        let got = atime(&m.path("f"));
        m.unmount();
        assert_eq!(got, want, "dual, {how}: the atime stat showed is not kept");
    };
    let m = Mount::new(&data, &mnt, &["strictatime"]);
    std::thread::sleep(Duration::from_millis(20));
    let shown = read_through(&m.path("f"));
    m.unmount();
    kept(shown, "unmount");
    let m = Mount::new(&data, &mnt, &["strictatime"]);
    std::thread::sleep(Duration::from_millis(20));
    let shown = read_through(&m.path("f"));
    ldfs().arg("sync").arg(&mnt).succeeds();
    m.kill();
    kept(shown, "ldfs sync, kill -9");
}

/// FUSE over io_uring: the unmount writes the atime (skips where the ring
/// cannot be had; `transport=uring` turns the module parameter on as root,
/// put back here as found).
#[test]
fn an_atime_survives_an_unmount_over_io_uring() {
    if !fuse_usable() {
        return;
    }
    const PARAM: &str = "/sys/module/fuse/parameters/enable_uring";
    let Ok(was) = fs::read_to_string(PARAM) else {
        eprintln!("\n*** SKIPPING: {PARAM} missing ***\n");
        return;
    };
    if unsafe { libc::geteuid() } != 0 && was.trim() != "Y" {
        eprintln!("\n*** SKIPPING: {PARAM} is off and only root may turn it on ***\n");
        return;
    }
    struct Restore(String);
    impl Drop for Restore {
        fn drop(&mut self) {
            let _ = fs::write(PARAM, self.0.trim());
        }
    }
    let _restore = Restore(was);
    let s = setup("uring");
    let m = Mount::new(&s.img, &s.mnt, &["strictatime", "transport=uring"]);
    let stats = ldfs().arg("stats").arg(&s.mnt).succeeds();
    let text = String::from_utf8_lossy(&stats.stdout).into_owned();
    std::thread::sleep(Duration::from_millis(20));
    let shown = read_through(&m.path("f"));
    m.unmount();
    assert!(
        text.contains("transport: io_uring ("),
        "not over the ring: {text}"
    );
    check_kept(&s, shown, "unmount over io_uring");
}

/// A snapshot mount is read-only: reads there write nothing, and its end
/// writes nothing (the image is byte for byte what it was).
#[test]
fn a_snapshot_mount_writes_nothing() {
    if !fuse_usable() {
        return;
    }
    let s = setup("snap");
    let m = Mount::new(&s.img, &s.mnt, &[]);
    let out = ldfs().arg("snapshot").arg(&s.mnt).succeeds();
    let n: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    m.unmount();
    let before = fs::read(&s.img).unwrap();
    let m = Mount::new(
        &s.img,
        &s.mnt,
        &[&format!("ro,snapshot={n}"), "strictatime"],
    );
    let a0 = atime(&m.path("f"));
    std::thread::sleep(Duration::from_millis(20));
    let a1 = read_through(&m.path("f"));
    fs::read_dir(m.path("d")).unwrap().for_each(drop);
    assert_eq!(a0, a1, "a read on a snapshot mount changed atime");
    m.unmount();
    let after = fs::read(&s.img).unwrap();
    let changed = before
        .chunks(4096)
        .zip(after.chunks(4096))
        .filter(|(a, b)| a != b)
        .count();
    assert_eq!(
        changed, 0,
        "the snapshot mount wrote {changed} blocks of the image"
    );
}

/// kill -9 in the middle of a workload that reads (strictatime) while
/// another thread writes and fsyncs new files: after the remount fsck is
/// clean, every fsynced file is whole, and every atime a read had set
/// before an fsync began (of any file) is there (or a later one): nothing
/// beyond the documented loss of atimes set after the last flush. Single
/// log and dual layout.
#[test]
fn kill_9_amid_reads_and_fsyncs_loses_only_atimes_after_the_last_flush() {
    if !fuse_usable() {
        return;
    }
    for dual in [true, false] {
        kill_9_amid_reads(dual);
    }
}

fn content(i: usize) -> Vec<u8> {
    let len = 500 + (i * 7919) % 60_000;
    (0..len)
        .map(|k| (k as u32).wrapping_mul(i as u32 + 3) as u8)
        .collect()
}

fn kill_9_amid_reads(dual: bool) {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::Instant;
    let t = tempfile::tempdir().unwrap();
    let img = t.path().join("k.img");
    let mnt = t.path().join("mnt");
    if dual {
        mkfs_dual(&img, &t.path().join("k-meta.img"), "256M");
    } else {
        mkfs(&img, "256M");
    }
    let m = Mount::new(&img, &mnt, &["strictatime", "commit=3600"]);
    for i in 0..20 {
        fs::write(m.path(&format!("f{i}")), content(i)).unwrap();
    }
    ldfs().arg("sync").arg(&mnt).succeeds();
    let epoch = Instant::now();
    // Files fsynced (index), when each fsync began and when it returned.
    // (After the kill the lazy detach leaves the bare directory under the
    // mount point: what is made there later is not on the image, so only
    // what finished before the kill counts.)
    let synced = Arc::new(Mutex::new(Vec::<(usize, Duration, Duration)>::new()));
    // Reads: (file, atime shown, when the read ended).
    let reads = Arc::new(Mutex::new(Vec::<(usize, (i64, i64), Duration)>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (mnt, synced, stop) = (mnt.clone(), synced.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut i = 20;
            while !stop.load(Ordering::Relaxed) {
                let p = mnt.join(format!("f{i}"));
                let Ok(mut f) = File::create(&p) else { break };
                if std::io::Write::write_all(&mut f, &content(i)).is_err() {
                    break;
                }
                let began = epoch.elapsed();
                if f.sync_all().is_err() {
                    break;
                }
                synced.lock().unwrap().push((i, began, epoch.elapsed()));
                i += 1;
                std::thread::sleep(Duration::from_millis(15));
            }
        })
    };
    let reader = {
        let (mnt, reads, stop) = (mnt.clone(), reads.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut k = 0usize;
            while !stop.load(Ordering::Relaxed) {
                let i = (k * 7) % 20;
                k += 1;
                let p = mnt.join(format!("f{i}"));
                let Ok(mut f) = File::open(&p) else { break };
                unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
                let mut buf = Vec::new();
                if f.read_to_end(&mut buf).is_err() {
                    break;
                }
                let Ok(md) = f.metadata() else { break };
                reads
                    .lock()
                    .unwrap()
                    .push((i, (md.atime(), md.atime_nsec()), epoch.elapsed()));
                std::thread::sleep(Duration::from_millis(3));
            }
        })
    };
    std::thread::sleep(Duration::from_millis(1500));
    let kill_at = epoch.elapsed();
    m.kill();
    stop.store(true, Ordering::Relaxed);
    let _ = writer.join();
    let _ = reader.join();
    let out = ldfs().args(["fsck", "-n"]).arg(&img).output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "dual {dual}: fsck -n after kill -9: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let mut synced = synced.lock().unwrap().clone();
    synced.retain(|s| s.2 < kill_at);
    let mut reads = reads.lock().unwrap().clone();
    reads.retain(|r| r.2 < kill_at);
    assert!(
        synced.len() > 5 && reads.len() > 20,
        "dual {dual}: too little work: {} fsyncs, {} reads",
        synced.len(),
        reads.len()
    );
    let last_fsync = synced.last().unwrap().1;
    let m = Mount::new(&img, &mnt, &["noatime"]);
    let names: Vec<String> = fs::read_dir(&mnt)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    for &(i, began, _) in &synced {
        let got = fs::read(m.path(&format!("f{i}")));
        assert!(
            matches!(&got, Ok(b) if *b == content(i)),
            "dual {dual}: f{i}, fsynced at {began:?} (the last at {last_fsync:?}), is not whole after kill -9: {:?} ({} names: {names:?})",
            got.map(|b| b.len()),
            names.len()
        );
    }
    let mut checked = 0;
    for &(i, shown, ended) in &reads {
        if ended < last_fsync {
            let got = atime(&m.path(&format!("f{i}")));
            assert!(
                got >= shown,
                "dual {dual}: f{i} read (atime {shown:?}) before an fsync began, has atime {got:?} after kill -9"
            );
            checked += 1;
        }
    }
    m.unmount();
    eprintln!(
        "dual {dual}: {} fsyncs, {} reads, {checked} atimes checked",
        synced.len(),
        reads.len()
    );
    assert!(
        checked > 10,
        "dual {dual}: only {checked} reads before the last fsync"
    );
}
