//! The mount daemon at its edges: a mount or fsck right after an unmount
//! (the old daemon may still be writing its final checkpoint), a second
//! mount of a live image showing the same tree at once, and SIGTERM / SIGINT / SIGHUP
//! ending the daemon with a final checkpoint also when the mount is busy.

mod common;

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{fuse_usable, is_mounted, ldfs, mkfs, Mount, Succeeds};

/// Deterministic contents, different for every (cycle, file).
fn content(cycle: usize, k: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| {
            (i as u32)
                .wrapping_mul(2654435761)
                .wrapping_add((cycle * 1000 + k) as u32) as u8
        })
        .collect()
}

/// `fusermount3 -u`, retried while the kernel still finishes RELEASEs of
/// files closed just before (the mount is busy for a moment then).
fn fusermount_u(dir: &Path) {
    let t = Instant::now();
    loop {
        let out = Command::new("fusermount3")
            .arg("-u")
            .arg(dir)
            .output()
            .unwrap();
        if out.status.success() {
            return;
        }
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "fusermount3 -u {}: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Detaches a mount made through the CLI if the test fails half-way; the
/// daemon then ends on its own.
struct Detach(PathBuf);

impl Drop for Detach {
    fn drop(&mut self) {
        if is_mounted(&self.0) {
            let _ = Command::new("fusermount3")
                .args(["-u", "-z"])
                .arg(&self.0)
                .status();
        }
    }
}

/// `ldfs mount IMG MNT` (the daemon goes to the background); returns what
/// it printed on stderr.
fn cli_mount(img: &Path, mnt: &Path) -> String {
    let out = ldfs().arg("mount").arg(img).arg(mnt).succeeds();
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The engine's view of the image after the daemon has gone: whether open
/// had to roll anything forward (none after a final checkpoint).
fn rolled_forward(img: &Path) -> u64 {
    let dev: Arc<dyn ldfs::device::Device> =
        Arc::new(ldfs::device::FileDevice::open_read_only(img).unwrap());
    let lld = ldfs::lld::Lld::open(
        dev,
        ldfs::lld::LldOptions {
            read_only: true,
            ..Default::default()
        },
    )
    .unwrap();
    lld.open_report().rolled_forward
}

fn fsck_clean(img: &Path) {
    let out = ldfs().args(["fsck", "-n"]).arg(img).output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(0), "fsck -n: {text}");
    assert!(!text.contains("WARNING"), "fsck -n: {text}");
}

#[test]
fn mount_and_fsck_right_after_unmount() {
    if !fuse_usable() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let img = t.path().join("cycle.img");
    let mnt = t.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    mkfs(&img, "256M");
    let _detach = Detach(mnt.clone());
    // Many small files per cycle, none fsynced: the final checkpoint after
    // each unmount has their inodes and directory blocks to write, long
    // enough that a mount started at once finds the image still locked.
    const SMALL: usize = 400;
    let write_cycle = |c: usize| {
        fs::write(mnt.join(format!("big{c}")), content(c, 0, 300_000)).unwrap();
        let d = mnt.join(format!("s{c}"));
        fs::create_dir(&d).unwrap();
        for k in 0..SMALL {
            fs::write(d.join(format!("f{k}")), content(c, k + 1, 100 + k)).unwrap();
        }
    };
    let verify = |upto: usize| {
        for c in 0..upto {
            let big = fs::read(mnt.join(format!("big{c}"))).unwrap();
            assert!(big == content(c, 0, 300_000), "cycle {c}: big{c} damaged");
            for k in (0..SMALL).step_by(37).chain([SMALL - 1]) {
                let p = mnt.join(format!("s{c}/f{k}"));
                let got = fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
                assert!(got == content(c, k + 1, 100 + k), "{} damaged", p.display());
            }
        }
    };
    cli_mount(&img, &mnt);
    let mut waited = 0;
    for c in 0..10 {
        write_cycle(c);
        fusermount_u(&mnt);
        let err = cli_mount(&img, &mnt);
        if err.contains("waiting") {
            waited += 1;
        }
        verify(c + 1);
    }
    eprintln!("{waited} of 10 mounts waited for the previous daemon");

    // A second mount of a live image shows the same tree at once (a bind
    // mount of the first, as a kernel file system shares its superblock);
    // fsck checks it read-only at once, with a warning.
    let mnt2 = t.path().join("mnt2");
    fs::create_dir(&mnt2).unwrap();
    let t0 = Instant::now();
    ldfs().arg("mount").arg(&img).arg(&mnt2).succeeds();
    assert!(t0.elapsed() < Duration::from_secs(3), "second mount waited");
    let names = |d: &Path| {
        let mut v: Vec<_> = fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        v.sort();
        v
    };
    assert_eq!(names(&mnt), names(&mnt2));
    fusermount_u(&mnt2);
    let t0 = Instant::now();
    let out = ldfs().args(["fsck", "-n"]).arg(&img).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("WARNING") && err.contains("mounted"), "{err}");
    assert!(
        t0.elapsed() < Duration::from_secs(20),
        "fsck of a live mount waited"
    );

    // fsck right after an unmount checks the final checkpoint, not a half
    // written one, and finds the image clean.
    write_cycle(10);
    fusermount_u(&mnt);
    fsck_clean(&img);
    assert_eq!(rolled_forward(&img), 0, "no final checkpoint");
    cli_mount(&img, &mnt);
    verify(11);
    fusermount_u(&mnt);
}

/// A process whose working directory is inside the mount, killed at the end.
struct Squatter(Child);

impl Squatter {
    fn new(dir: &Path) -> Squatter {
        Squatter(
            Command::new("sleep")
                .arg("120")
                .current_dir(dir)
                .stdin(Stdio::null())
                .spawn()
                .unwrap(),
        )
    }
}

impl Drop for Squatter {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Mounts, makes the mount busy (an open file written through the page
/// cache, a process's cwd), sends `sigs` to the daemon one after the other,
/// and checks that it ends within seconds with a final checkpoint that holds
/// everything written before the signal (what was written without fsync
/// only if `all`: a second signal may cut the daemon's flush of the kernel's
/// writeback cache short).
fn signal_busy_mount(name: &str, sigs: &[i32], all: bool) {
    let t = tempfile::tempdir().unwrap();
    let img = t.path().join(format!("{name}.img"));
    let mnt = t.path().join("mnt");
    mkfs(&img, "128M");
    let mut m = Mount::new(&img, &mnt, &[]);
    fs::create_dir(m.path("sub")).unwrap();
    let squatter = Squatter::new(&m.path("sub"));
    let synced = content(1, 1, 1 << 20);
    let unsynced = content(2, 2, 300_000);
    let mut f = OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .open(m.path("held"))
        .unwrap();
    f.write_all(&synced).unwrap();
    f.sync_all().unwrap();
    f.write_all(&unsynced).unwrap();
    fs::write(m.path("closed"), b"written and closed before the signal").unwrap();

    let pid = m.pid();
    for (i, &s) in sigs.iter().enumerate() {
        if i > 0 {
            // Apart, or the kernel merges them into one pending signal.
            std::thread::sleep(Duration::from_millis(50));
        }
        unsafe { libc::kill(pid, s) };
    }
    let st = m.wait_within(Duration::from_secs(10)).unwrap_or_else(|| {
        panic!("{name}: the daemon still runs 10 s after {sigs:?} on a busy mount")
    });
    assert!(st.success(), "{name}: daemon exited with {st}");
    assert!(
        !is_mounted(&mnt),
        "{name}: still mounted after the daemon ended"
    );
    // The connection is gone: what still holds the file gets errors.
    let late = f.write_all(b"after the end").and_then(|_| f.sync_all());
    eprintln!("{name}: a write + fsync through the held fd after the end: {late:?}");
    assert!(late.is_err(), "{name}: fsync after the end succeeded");
    drop(f);
    drop(squatter);

    assert_eq!(rolled_forward(&img), 0, "{name}: no final checkpoint");
    fsck_clean(&img);
    let m = Mount::new(&img, &mnt, &[]);
    let mut got = Vec::new();
    File::open(m.path("held"))
        .unwrap()
        .read_to_end(&mut got)
        .unwrap();
    assert!(
        got.len() >= synced.len() && got[..synced.len()] == synced[..],
        "{name}: the fsynced part is damaged ({} bytes read)",
        got.len()
    );
    // The unsynced part was written before the signal: the daemon flushes
    // the kernel's writeback cache before it detaches, so it is there too.
    let kept = got[synced.len()..] == unsynced[..];
    eprintln!("{name}: the part written without fsync survived: {kept}");
    assert!(
        kept || !all,
        "{name}: the part written without fsync before the signal is lost or damaged ({} bytes read)",
        got.len()
    );
    assert_eq!(
        fs::read(m.path("closed")).unwrap(),
        b"written and closed before the signal"
    );
    m.unmount();
}

#[test]
fn sigterm_on_a_busy_mount_ends_with_a_final_checkpoint() {
    if !fuse_usable() {
        return;
    }
    signal_busy_mount("term", &[libc::SIGTERM], true);
}

#[test]
fn sigint_and_sighup_on_a_busy_mount_and_sigterm_twice() {
    if !fuse_usable() {
        return;
    }
    signal_busy_mount("int", &[libc::SIGINT], true);
    signal_busy_mount("hup", &[libc::SIGHUP], true);
    signal_busy_mount("twice", &[libc::SIGTERM, libc::SIGTERM], false);
}

#[test]
fn sigterm_on_an_idle_mount() {
    if !fuse_usable() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let img = t.path().join("idle.img");
    let mnt = t.path().join("mnt");
    mkfs(&img, "128M");
    let mut m = Mount::new(&img, &mnt, &[]);
    fs::write(m.path("a"), content(3, 3, 50_000)).unwrap();
    let st = m
        .signal_within(libc::SIGTERM, Duration::from_secs(10))
        .expect("the daemon still runs 10 s after SIGTERM");
    assert!(st.success(), "daemon exited with {st}");
    assert!(!is_mounted(&mnt));
    assert_eq!(rolled_forward(&img), 0, "no final checkpoint");
    let m = Mount::new(&img, &mnt, &[]);
    assert!(fs::read(m.path("a")).unwrap() == content(3, 3, 50_000));
    m.unmount();
}

/// A signal to a mount that is waiting for the image's lock (held by what
/// looks like an exiting ldfs daemon; the wait lasts up to 60 s) ends it
/// at once: nothing is mounted yet, and the signal is not held back until
/// the wait is over.
#[test]
fn a_signal_ends_a_mount_waiting_for_the_lock() {
    if !fuse_usable() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let img = t.path().join("locked.img");
    let mnt = t.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    mkfs(&img, "64M");
    // flock(1) named as a mount daemon: `ldfs mount` waits for it.
    let mut holder = Command::new("bash")
        .arg("-c")
        .arg("exec -a 'ldfs mount' flock \"$0\" sleep 60")
        .arg(&img)
        .spawn()
        .unwrap();
    struct Kill(Vec<u32>);
    impl Drop for Kill {
        fn drop(&mut self) {
            for &pid in &self.0 {
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            }
        }
    }
    let mut kill = Kill(vec![holder.id()]);
    let t0 = Instant::now();
    while !fs::read_to_string("/proc/locks")
        .unwrap()
        .lines()
        .any(|l| l.contains(&format!(" {} ", holder.id())))
    {
        assert!(t0.elapsed() < Duration::from_secs(10), "flock took no lock");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut m = ldfs()
        .args(["mount", "-f"])
        .arg(&img)
        .arg(&mnt)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    kill.0.push(m.id());
    let mut err = m.stderr.take().unwrap();
    let mut said = Vec::new();
    let mut buf = [0u8; 256];
    while !String::from_utf8_lossy(&said).contains("waiting") {
        let n = err.read(&mut buf).unwrap();
        assert!(n > 0, "the mount ended: {}", String::from_utf8_lossy(&said));
        said.extend_from_slice(&buf[..n]);
    }
    unsafe { libc::kill(m.id() as i32, libc::SIGTERM) };
    let t0 = Instant::now();
    let st = loop {
        if let Some(st) = m.try_wait().unwrap() {
            break st;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "the mount still waits for the lock 5 s after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(!st.success(), "{st}");
    assert!(!is_mounted(&mnt));
    holder.kill().unwrap();
    holder.wait().unwrap();
}

/// When O_DIRECT cannot be had (here: an image whose size is not a
/// multiple of 4096 bytes; elsewhere a host file system refusing it),
/// `-o direct_writes` is a clear error and mounts nothing; by default
/// (auto) the mount falls back to buffered writes and works, data intact
/// across a remount.
#[test]
fn direct_writes_refused_when_asked_falls_back_by_default() {
    if !fuse_usable() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let img = t.path().join("odd.img");
    let mnt = t.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    mkfs(&img, "64M");
    let f = OpenOptions::new().write(true).open(&img).unwrap();
    f.set_len(f.metadata().unwrap().len() + 512).unwrap();
    drop(f);
    let out = ldfs()
        .args(["mount", "-o", "direct_writes"])
        .arg(&img)
        .arg(&mnt)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    if out.status.success() {
        fusermount_u(&mnt);
        panic!("mounted with direct_writes on an image of odd size");
    }
    assert!(err.contains("direct_writes"), "unclear error: {err}");
    assert!(!is_mounted(&mnt));
    let m = Mount::new(&img, &mnt, &[]);
    fs::write(m.path("f"), content(1, 1, 100_000)).unwrap();
    m.unmount();
    let m = Mount::new(&img, &mnt, &[]);
    assert!(fs::read(m.path("f")).unwrap() == content(1, 1, 100_000));
    m.unmount();
}
