//! Mounting an image for tests: `ldfs mount -f` as a child process, so a
//! test can unmount it cleanly or kill it.

#![allow(dead_code)]

pub mod store_cache;

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub fn ldfs() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ldfs"))
}

/// Whether FUSE mounts can work here; if not, says so loudly.
pub fn fuse_usable() -> bool {
    let dev = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .is_ok();
    let helper = Command::new("fusermount3")
        .arg("-V")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !(dev && helper) {
        eprintln!(
            "\n*** SKIPPING FUSE MOUNT TEST: /dev/fuse usable: {dev}, fusermount3 present: {helper} ***\n"
        );
    }
    dev && helper
}

/// Runs a command that must succeed; fails the test with its stderr if not.
pub trait Succeeds {
    fn succeeds(&mut self) -> std::process::Output;
}

impl Succeeds for Command {
    fn succeeds(&mut self) -> std::process::Output {
        let out = self.output().unwrap();
        assert!(
            out.status.success(),
            "{:?}: {}",
            self,
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }
}

pub fn mkfs(img: &Path, size: &str) {
    ldfs()
        .arg("mkfs")
        .args(["--size", size])
        .arg(img)
        .succeeds();
}

pub fn is_mounted(dir: &Path) -> bool {
    let canon = dir.canonicalize().unwrap();
    std::fs::read_to_string("/proc/self/mounts")
        .unwrap()
        .lines()
        .any(|l| l.split(' ').nth(1) == Some(canon.to_str().unwrap()))
}

pub struct Mount {
    pub dir: PathBuf,
    pub img: PathBuf,
    child: Option<Child>,
}

/// What a store-backed file system's mount adds to `ldfs mount`: `--cache PATH` after the
/// `s3://` URL (given as the image), and the gateway's environment.
#[derive(Clone, Debug, Default)]
pub struct MountExtra {
    pub args: Vec<std::ffi::OsString>,
    pub envs: std::collections::BTreeMap<String, String>,
}

impl Mount {
    /// Mounts with `opts`; `LDFS_TEST_TRANSPORT=uring|dev|auto` adds
    /// `transport=` to every mount that names none (TESTING.md: the FUSE
    /// tests over io_uring).
    pub fn new(img: &Path, dir: &Path, opts: &[&str]) -> Mount {
        Mount::new_with(img, dir, opts, &MountExtra::default())
    }

    /// [`Mount::new`] with `extra`'s arguments and environment.
    pub fn new_with(img: &Path, dir: &Path, opts: &[&str], extra: &MountExtra) -> Mount {
        std::fs::create_dir_all(dir).unwrap();
        let mut cmd = ldfs();
        cmd.envs(&extra.envs);
        cmd.arg("mount").arg("-f");
        for o in opts {
            cmd.args(["-o", o]);
        }
        if let Ok(t) = std::env::var("LDFS_TEST_TRANSPORT") {
            if !opts.iter().any(|o| o.contains("transport=")) {
                cmd.args(["-o", &format!("transport={t}")]);
            }
        }
        let child = cmd
            .arg(img)
            .arg(dir)
            .args(&extra.args)
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let mut m = Mount {
            dir: dir.to_path_buf(),
            img: img.to_path_buf(),
            child: Some(child),
        };
        let t = Instant::now();
        while !is_mounted(dir) {
            if let Some(st) = m.child.as_mut().unwrap().try_wait().unwrap() {
                m.child = None;
                panic!("ldfs mount exited with {st} before mounting");
            }
            assert!(t.elapsed() < Duration::from_secs(20), "mount timed out");
            std::thread::sleep(Duration::from_millis(20));
        }
        m
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.join(rel)
    }

    /// Clean unmount; waits for the final checkpoint.
    pub fn unmount(mut self) {
        // The kernel sends RELEASE for a closed file asynchronously, so an
        // unmount right after a close can find the mount busy for a moment.
        let mut tries = 0;
        loop {
            let out = Command::new("fusermount3")
                .arg("-u")
                .arg(&self.dir)
                .output()
                .unwrap();
            if out.status.success() {
                break;
            }
            tries += 1;
            assert!(
                tries < 100,
                "fusermount3 -u failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let st = self.child.take().unwrap().wait().unwrap();
        assert!(st.success(), "ldfs mount exited with {st}");
    }

    /// The daemon's process id.
    pub fn pid(&self) -> i32 {
        self.child.as_ref().expect("daemon running").id() as i32
    }

    /// Sends `sig` to the daemon and waits up to `limit` for it to exit on
    /// its own: its exit status, or `None` if it is still running (it is
    /// then killed and its mount detached when the `Mount` is dropped).
    pub fn signal_within(&mut self, sig: i32, limit: Duration) -> Option<std::process::ExitStatus> {
        unsafe { libc::kill(self.pid(), sig) };
        self.wait_within(limit)
    }

    /// Waits up to `limit` for the daemon to exit; see `signal_within`.
    pub fn wait_within(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let t = Instant::now();
        loop {
            if let Some(st) = self
                .child
                .as_mut()
                .expect("daemon running")
                .try_wait()
                .unwrap()
            {
                self.child = None;
                return Some(st);
            }
            if t.elapsed() > limit {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends `sig` to the daemon and waits for it to exit on its own.
    pub fn signal(mut self, sig: i32) -> std::process::ExitStatus {
        let mut c = self.child.take().unwrap();
        unsafe { libc::kill(c.id() as i32, sig) };
        c.wait().unwrap()
    }

    /// kill -9 the daemon, then detach the dead mount.
    pub fn kill(mut self) {
        let mut c = self.child.take().unwrap();
        c.kill().unwrap();
        c.wait().unwrap();
        let _ = Command::new("fusermount3")
            .arg("-u")
            .arg("-z")
            .arg(&self.dir)
            .status();
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("fusermount3")
                .arg("-u")
                .arg("-z")
                .arg(&self.dir)
                .status();
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

pub fn cstr(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

pub fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// Formats a dual file system: file data on `data` (created at `size`),
/// the metadata log on `meta` (created, 1/10 of it, at least 64 MiB).
pub fn mkfs_dual(data: &Path, meta: &Path, size: &str) {
    ldfs()
        .arg("mkfs")
        .args(["--size", size])
        .arg("--meta")
        .arg(meta)
        .arg(data)
        .succeeds();
}

/// FS_IOC_GETFLAGS of `path` (what `lsattr` shows), or the errno.
pub fn get_flags(path: &Path) -> Result<u32, i32> {
    let f = std::fs::File::open(path).map_err(|e| e.raw_os_error().unwrap_or(0))?;
    let mut flags: libc::c_int = 0;
    // _IOR('f', 1, long)
    let r = unsafe { libc::ioctl(std::os::fd::AsRawFd::as_raw_fd(&f), 0x8008_6601, &mut flags) };
    if r == 0 {
        Ok(flags as u32)
    } else {
        Err(errno())
    }
}

/// FS_IOC_SETFLAGS of `path` (what `chattr` does), or the errno.
pub fn set_flags(path: &Path, flags: u32) -> Result<(), i32> {
    let f = std::fs::File::open(path).map_err(|e| e.raw_os_error().unwrap_or(0))?;
    let flags = flags as libc::c_int;
    // _IOW('f', 2, long)
    let r = unsafe { libc::ioctl(std::os::fd::AsRawFd::as_raw_fd(&f), 0x4008_6602, &flags) };
    if r == 0 {
        Ok(())
    } else {
        Err(errno())
    }
}

/// A store-backed file system for a test (issue 20: the POSIX and fsx-style tests through a
/// mount on the store): `ldfs mkfs --store` of `size` in a fresh bucket of the gateway the tests
/// use, its cache at `cache`. Returns the URL (to mount as the image) and what a mount of it
/// adds, or `None` (said loudly) without a gateway.
pub fn mkfs_store(what: &str, cache: &Path, size: &str) -> Option<(PathBuf, MountExtra)> {
    use ldfs::testing::ceph::{gateway, unique_bucket, Gateway};
    let envs = match gateway() {
        Gateway::Ready(v) => v,
        Gateway::Skip(why) => {
            eprintln!("\n*** SKIPPING the store-backed variant: {why} ***\n");
            return None;
        }
    };
    let url = format!("s3://{}/fs", unique_bucket(what));
    ldfs()
        .envs(&envs)
        .args(["mkfs", "--store", &url, "--cache"])
        .arg(cache)
        .args(["--size", size, "--sparse"])
        .succeeds();
    let extra = MountExtra {
        args: vec!["--cache".into(), cache.as_os_str().to_owned()],
        envs,
    };
    Some((PathBuf::from(url), extra))
}
