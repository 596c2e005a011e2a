//! The edges users meet every day, through a real mount (issue 12): a full
//! file system says so at write(2) and drops nothing; `ldfs sync` makes
//! everything written durable, open and mapped files included; data never
//! synced is durable within the commit interval. Each crash here is a
//! kill -9 of the daemon, so what the kernel's page cache held is lost as
//! in a real crash.

mod common;

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::{Duration, Instant};

use common::{fuse_usable, ldfs, mkfs, Mount, Succeeds};

/// Bytes of `len` at file offset `off` of a file seeded by `seed`: every
/// 8 bytes name their offset, so a misplaced or zeroed block shows.
fn pattern(seed: u64, off: u64, len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len);
    for p in off..off + len as u64 {
        let word = (p / 8) ^ seed.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        v.push((word >> ((p % 8) * 8)) as u8);
    }
    v
}

fn available_bytes(dir: &Path) -> u64 {
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    let r = unsafe { libc::statvfs(common::cstr(dir).as_ptr(), &mut s) };
    assert_eq!(r, 0, "statvfs {}", dir.display());
    s.f_bavail * s.f_frsize
}

/// Checks that `path` holds exactly `len` bytes of `pattern(seed, ..)`.
fn verify(path: &Path, seed: u64, len: u64) {
    verify_with_hole(path, seed, len, 0..0)
}

/// `verify`, but `hole` reads as zeros.
fn verify_with_hole(path: &Path, seed: u64, len: u64, hole: std::ops::Range<u64>) {
    let mut f = File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(
        f.metadata().unwrap().len(),
        len,
        "{}: size (seed {seed})",
        path.display()
    );
    let mut buf = vec![0u8; 1 << 20];
    let mut off = 0u64;
    while off < len {
        let n = f.read(&mut buf).unwrap();
        assert!(n > 0, "{}: short read at {off}", path.display());
        let mut want = pattern(seed, off, n);
        for (k, b) in want.iter_mut().enumerate() {
            if hole.contains(&(off + k as u64)) {
                *b = 0;
            }
        }
        assert!(
            buf[..n] == want[..],
            "{}: wrong bytes in [{off}, {}) (seed {seed})",
            path.display(),
            off + n as u64
        );
        off += n as u64;
    }
}

/// Writes `len` bytes of `pattern(seed, ..)` to `f` in 1 MiB writes.
fn write_pattern(f: &mut File, seed: u64, len: u64) {
    let mut off = 0;
    while off < len {
        let n = (len - off).min(1 << 20) as usize;
        f.write_all(&pattern(seed, off, n)).unwrap();
        off += n as u64;
    }
}

/// `dd if=/dev/zero of=MNT/fill bs=1M` into a full ldfs: write(2) returns
/// ENOSPC once the file system is full (a few MiB of slack at most), the
/// file's size claims only what was stored, what was fsynced before is
/// intact, a hole can be punched, and deleting makes room again. With the writeback cache this
/// ran forever, the size climbing past what the disk holds.
#[test]
fn a_full_file_system_says_enospc_at_write() {
    if !fuse_usable() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let img = t.path().join("full.img");
    mkfs(&img, "64M");
    let mnt = t.path().join("mnt");
    let m = Mount::new(&img, &mnt, &[]);
    let mut keep = File::create(m.path("keep")).unwrap();
    write_pattern(&mut keep, 1, 3 << 20);
    keep.sync_all().unwrap();
    drop(keep);

    let cap = 64u64 << 20;
    let start = Instant::now();
    let mut fill = File::create(m.path("fill")).unwrap();
    let mut written = 0u64;
    let err = loop {
        let chunk = pattern(2, written, 1 << 20);
        match fill.write(&chunk) {
            Ok(n) => written += n as u64,
            Err(e) => break e,
        }
        assert!(
            written <= cap,
            "{written} bytes accepted by a {cap}-byte file system"
        );
        assert!(start.elapsed() < Duration::from_secs(120), "fill too slow");
    };
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
    let slack = available_bytes(&mnt);
    eprintln!(
        "full after {written} bytes in {:?}; statfs then says {slack} available",
        start.elapsed()
    );
    assert!(
        slack <= 4 << 20,
        "ENOSPC with {slack} bytes still available"
    );
    assert!(written >= 32 << 20, "only {written} bytes fit in 64 MiB");
    assert_eq!(fill.metadata().unwrap().len(), written, "size after ENOSPC");
    // A second write fails the same way and changes nothing.
    let e = fill.write(&pattern(2, written, 1 << 20)).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
    // Punching a hole works on the full file system (it frees space).
    let hole = (1u64 << 20)..(3u64 << 20);
    let r = unsafe {
        libc::fallocate(
            fill.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            hole.start as i64,
            (hole.end - hole.start) as i64,
        )
    };
    assert_eq!(
        r,
        0,
        "punching a hole in a full ldfs: errno {}",
        common::errno()
    );
    drop(fill);
    verify_with_hole(&m.path("fill"), 2, written, hole.clone());
    verify(&m.path("keep"), 1, 3 << 20);
    m.unmount();

    // After a remount: the same size, every byte, and the fsynced file.
    let m = Mount::new(&img, &mnt, &[]);
    verify_with_hole(&m.path("fill"), 2, written, hole);
    verify(&m.path("keep"), 1, 3 << 20);
    // Deleting makes the space writable again (through the cleaner).
    fs::remove_file(m.path("fill")).unwrap();
    let mut again = File::create(m.path("again")).unwrap();
    write_pattern(&mut again, 3, written / 2);
    again.sync_all().unwrap();
    drop(again);
    m.unmount();
    let m = Mount::new(&img, &mnt, &[]);
    verify(&m.path("again"), 3, written / 2);
    verify(&m.path("keep"), 1, 3 << 20);
    m.unmount();
}

/// Runs `ldfs sync MNT`, which must succeed.
fn ldfs_sync(mnt: &Path) {
    ldfs().arg("sync").arg(mnt).succeeds();
}

/// 16 MiB written to a file that stays open, then `ldfs sync`, then kill -9:
/// everything is there after a remount, with and without the writeback
/// cache (with it, the data sat in the kernel's page cache and `ldfs sync`
/// used to return 0 while the file came back empty or full of holes).
#[test]
fn ldfs_sync_makes_open_files_durable() {
    if !fuse_usable() {
        return;
    }
    for opts in [&[][..], &["writeback_cache"][..]] {
        let t = tempfile::tempdir().unwrap();
        let img = t.path().join("sync.img");
        mkfs(&img, "256M");
        let mnt = t.path().join("mnt");
        // A long commit interval: only `ldfs sync` can make this durable.
        let mut o = vec!["commit=3600"];
        o.extend_from_slice(opts);
        let m = Mount::new(&img, &mnt, &o);
        let mut f = File::create(m.path("open")).unwrap();
        write_pattern(&mut f, 7, 16 << 20);
        // A shared writable mapping, dirtied and left unsynced.
        let mapped = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(m.path("mapped"))
            .unwrap();
        let map_len = 1usize << 20;
        mapped.set_len(map_len as u64).unwrap();
        let want = pattern(8, 0, map_len);
        // Mapped until after the kill: FUSE writes a mapping back when it
        // is unmapped.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                mapped.as_raw_fd(),
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        unsafe { std::ptr::copy_nonoverlapping(want.as_ptr(), p as *mut u8, map_len) };
        ldfs_sync(&mnt);
        m.kill();
        unsafe { libc::munmap(p, map_len) };
        drop(f);
        drop(mapped);
        let m = Mount::new(&img, &mnt, &[]);
        verify(&m.path("open"), 7, 16 << 20);
        let got = fs::read(m.path("mapped")).unwrap();
        assert!(got == want, "mapped file lost its pages ({opts:?})");
        m.unmount();
    }
}

/// The README's window: without the writeback cache, every write(2) has
/// reached ldfs when it returns, so data never synced is durable after
/// the commit interval (`commit=`), even if the daemon is then killed.
#[test]
fn unsynced_writes_are_durable_after_the_commit_interval() {
    if !fuse_usable() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let img = t.path().join("window.img");
    mkfs(&img, "128M");
    let mnt = t.path().join("mnt");
    let m = Mount::new(&img, &mnt, &["commit=1"]);
    let mut f = File::create(m.path("unsynced")).unwrap();
    write_pattern(&mut f, 9, 4 << 20);
    fs::create_dir(m.path("dir")).unwrap();
    std::thread::sleep(Duration::from_millis(2500));
    m.kill();
    drop(f);
    let m = Mount::new(&img, &mnt, &[]);
    verify(&m.path("unsynced"), 9, 4 << 20);
    assert!(m.path("dir").is_dir());
    m.unmount();
}
