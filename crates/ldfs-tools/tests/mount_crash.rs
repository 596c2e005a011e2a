//! kill -9 of the mount process in the middle of a workload, then remount:
//! every file fsynced before the kill is intact, each rename is wholly done or
//! not at all, and the tree is consistent. Also several threads working on one
//! mount at once: no deadlock, no lost update.

mod common;

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{fuse_usable, ldfs, mkfs, mkfs_dual, Mount};

fn content(i: usize) -> Vec<u8> {
    let len = 1000 + (i * 7919) % 150_000;
    (0..len)
        .map(|k| (k as u32).wrapping_mul(i as u32 + 1) as u8)
        .collect()
}

#[test]
fn kill_9_keeps_everything_fsynced() {
    kill_9_run(false);
}

/// The same on the dual layout: the metadata log recovers, and every data
/// block a recovered file names holds what was fsynced (DualFS 3.3's order:
/// data blocks are durable before the metadata naming them).
#[test]
fn kill_9_keeps_everything_fsynced_on_dual() {
    kill_9_run(true);
}

fn kill_9_run(dual: bool) {
    if !fuse_usable() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let img = t.path().join("kill.img");
    let mnt = t.path().join("mnt");
    if dual {
        mkfs_dual(&img, &t.path().join("kill-meta.img"), "512M");
    } else {
        mkfs(&img, "512M");
    }
    for round in 0..3u64 {
        let m = Mount::new(&img, &mnt, &[]);
        let dir = m.path(&format!("r{round}"));
        fs::create_dir(&dir).unwrap();
        let synced = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let worker = {
            let (dir, synced, stop) = (dir.clone(), synced.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    let tmp = dir.join(format!("tmp{i}"));
                    let done = dir.join(format!("f{i}"));
                    let r = (|| -> std::io::Result<()> {
                        let mut f = OpenOptions::new()
                            .create(true)
                            .truncate(true)
                            .write(true)
                            .open(&tmp)?;
                        f.write_all(&content(i))?;
                        if i % 2 == 0 {
                            f.sync_all()?;
                            fs::rename(&tmp, &done)?;
                            // fsync the directory: the rename is durable too.
                            fs::File::open(&dir)?.sync_all()?;
                            synced.lock().unwrap().push(i);
                        } else {
                            fs::rename(&tmp, &done)?;
                        }
                        Ok(())
                    })();
                    if r.is_err() {
                        break; // the mount died under us
                    }
                    i += 1;
                }
            })
        };
        std::thread::sleep(Duration::from_millis(300 + 200 * round));
        m.kill();
        stop.store(true, Ordering::Relaxed);
        worker.join().unwrap();
        let synced = synced.lock().unwrap().clone();
        assert!(!synced.is_empty(), "nothing was fsynced before the kill");

        let m = Mount::new(&img, &mnt, &[]);
        let dir = m.path(&format!("r{round}"));
        for &i in &synced {
            let got = fs::read(dir.join(format!("f{i}")))
                .unwrap_or_else(|e| panic!("round {round}: fsynced f{i} lost: {e}"));
            assert!(got == content(i), "round {round}: fsynced f{i} damaged");
            assert!(
                !dir.join(format!("tmp{i}")).exists(),
                "rename half done for {i}"
            );
        }
        // Unsynced files: each exists under exactly one name or none, and
        // reads without error.
        for e in fs::read_dir(&dir).unwrap() {
            let e = e.unwrap();
            fs::read(e.path()).unwrap();
        }
        m.unmount();
    }
    // The tree is consistent: ldfs's own check (which, on a pair, also
    // checks every data block named is allocated and none leaked).
    let out = ldfs().args(["fsck", "-n"]).arg(&img).output().unwrap();
    assert!(
        out.status.success(),
        "fsck after the kills: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// kill -9 while small files are created and deleted (their inodes'
/// destroys wait in memory for a batch, issue 16) and one unlinked file is
/// held open: the remount reclaims every orphan, so after it only the
/// files still named have inode records, and the tree is consistent.
#[test]
fn kill_9_while_deleting_leaks_no_inode() {
    if !fuse_usable() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let img = t.path().join("del.img");
    let mnt = t.path().join("mnt");
    mkfs(&img, "256M");
    let m = Mount::new(&img, &mnt, &[]);
    let dir = m.path("d");
    fs::create_dir(&dir).unwrap();
    fs::write(dir.join("held"), b"held open").unwrap();
    let held = fs::File::open(dir.join("held")).unwrap();
    fs::remove_file(dir.join("held")).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let worker = {
        let (dir, stop) = (dir.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut i = 0usize;
            while !stop.load(Ordering::Relaxed) {
                let r = (|| -> std::io::Result<()> {
                    fs::write(dir.join(format!("s{i}")), vec![i as u8; 100])?;
                    if i >= 10 {
                        fs::remove_file(dir.join(format!("s{}", i - 10)))?;
                    }
                    if i.is_multiple_of(97) {
                        fs::File::open(&dir)?.sync_all()?;
                    }
                    Ok(())
                })();
                if r.is_err() {
                    break; // the mount died under us
                }
                i += 1;
            }
            i
        })
    };
    std::thread::sleep(Duration::from_millis(700));
    m.kill();
    stop.store(true, Ordering::Relaxed);
    let done = worker.join().unwrap();
    drop(held);
    assert!(done > 100, "only {done} files before the kill");
    let m = Mount::new(&img, &mnt, &[]);
    let named = fs::read_dir(m.path("d")).unwrap().count() as u64;
    m.unmount();
    // Read-only: reclaims nothing itself, so it sees what the mounts left.
    let dev: Arc<dyn ldfs::device::Device> = Arc::new(
        ldfs::device::FileDevice::open(&img, ldfs::device::FileDeviceOptions::default()).unwrap(),
    );
    let ro = ldfs::lld::LldOptions {
        read_only: true,
        ..Default::default()
    };
    let lld = Arc::new(ldfs::lld::Lld::open(dev, ro).unwrap());
    let opts = ldfs::fs::FsOptions {
        read_only: true,
        ..Default::default()
    };
    let fs = ldfs::fs::Fs::mount(lld, opts).unwrap();
    let report = fs.check().unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    assert_eq!(
        report.inodes,
        2 + named,
        "inodes besides the root, d and its {named} files"
    );
}

#[test]
fn threads_share_a_mount_without_losing_updates() {
    if !fuse_usable() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let img = t.path().join("conc.img");
    mkfs(&img, "512M");
    let m = Mount::new(&img, &t.path().join("mnt"), &[]);
    let shared = m.path("shared");
    fs::create_dir(&shared).unwrap();
    let counter = m.path("counter");
    fs::write(&counter, b"").unwrap();
    let appended = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..6)
        .map(|t| {
            let (root, shared, counter, appended) = (
                m.dir.clone(),
                shared.clone(),
                counter.clone(),
                appended.clone(),
            );
            std::thread::spawn(move || {
                let own = root.join(format!("t{t}"));
                fs::create_dir(&own).unwrap();
                for i in 0..150 {
                    // Independent work.
                    fs::write(own.join(format!("f{i}")), content(i % 20)).unwrap();
                    if i % 3 == 0 {
                        fs::remove_file(own.join(format!("f{}", i / 2))).ok();
                    }
                    // Overlapping work in one directory.
                    let a = shared.join(format!("x{}", i % 10));
                    let b = shared.join(format!("y{}", (i + t) % 10));
                    let _ = fs::write(&a, [t as u8; 100]);
                    let _ = fs::rename(&a, &b);
                    let _ = fs::remove_file(shared.join(format!("y{}", i % 7)));
                    // Appends to one file from every thread.
                    let mut f = OpenOptions::new().append(true).open(&counter).unwrap();
                    f.write_all(&[b'+'; 10]).unwrap();
                    appended.fetch_add(10, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for th in threads {
        th.join().unwrap();
    }
    assert_eq!(
        fs::metadata(&counter).unwrap().len() as usize,
        appended.load(Ordering::Relaxed),
        "appends were lost"
    );
    for t in 0..6 {
        let own = m.dir.join(format!("t{t}"));
        for i in 0..150 {
            let p = own.join(format!("f{i}"));
            if p.exists() {
                assert_eq!(fs::read(&p).unwrap(), content(i % 20));
            }
        }
    }
    m.unmount();
}
