//! `ldfs mount`: open an image, mount it through FUSE, serve until unmounted.
//!
//! Like other mount programs it returns once the file system is mounted and
//! keeps serving in the background (a child process started with `-f`
//! reports "ready" on a pipe); `-f` stays in the foreground. SIGTERM, SIGINT
//! and SIGHUP unmount; every unmount ends with a final checkpoint. Also runs
//! as the mount helper `mount.fuse.ldfs IMAGE DIR -o OPTIONS`, so
//! `mount -t fuse.ldfs` and /etc/fstab work.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fuser::{Config, MountOption, Session, SessionACL};
use ldfs::device::{Device, FileDevice, FileDeviceOptions};
use ldfs::fs::{Fs, FsOptions};
use ldfs::ld::LogicalDisk;
use ldfs::lld::{Lld, LldOptions};

use crate::fuse::{Control, FuseFs};

/// What `ldfs stats` and `ldfs clean` reach on a mounted file system.
struct Daemon {
    lld: Arc<Lld>,
    /// Set by `ldfs clean --stop`: a running `clean` ends after its pass.
    cancel: AtomicBool,
    /// What the last `clean` command did (read back by `ldfs clean`).
    last_clean: std::sync::Mutex<String>,
}

impl Control for Daemon {
    fn get(&self, name: &str) -> Result<Vec<u8>, String> {
        match name {
            "stats" => Ok(crate::stats_text(&self.lld).into_bytes()),
            "clean" => Ok(self
                .last_clean
                .lock()
                .expect("last_clean poisoned")
                .clone()
                .into_bytes()),
            other => Err(format!("unknown query {other}")),
        }
    }

    fn set(&self, name: &str, value: &[u8]) -> Result<(), String> {
        let text = String::from_utf8_lossy(value);
        match name {
            "checkpoint" => self.lld.checkpoint_now().map_err(|e| e.to_string()),
            "clean" => {
                let req = crate::CleanRequest::parse(&text)?;
                self.cancel.store(false, Ordering::Relaxed);
                let sum = self
                    .lld
                    .clean_now(
                        req.policy,
                        req.segments,
                        req.max_utilization as f64 / 100.0,
                        &self.cancel,
                    )
                    .map_err(|e| e.to_string())?;
                *self.last_clean.lock().expect("last_clean poisoned") =
                    format!("cleaned with {}: {sum}\n", req.policy);
                Ok(())
            }
            // "on POLICY" or "off": the background cleaner from now on.
            "background" => {
                let mut words = text.split_whitespace();
                let on = match words.next() {
                    Some("on") => true,
                    Some("off") => false,
                    other => return Err(format!("background: on or off, not {other:?}")),
                };
                if let Some(p) = words.next() {
                    self.lld.set_cleaner_policy(p.parse()?);
                }
                self.lld
                    .set_background_cleaner(on)
                    .map_err(|e| e.to_string())
            }
            // Stop cleaning: a running `clean` and the background thread.
            "stop" => {
                self.cancel.store(true, Ordering::Relaxed);
                self.lld
                    .set_background_cleaner(false)
                    .map_err(|e| e.to_string())
            }
            other => Err(format!("unknown command {other}")),
        }
    }
}

/// Parsed `-o` options.
#[derive(Clone, Debug)]
pub struct MountOpts {
    pub read_only: bool,
    pub allow_other: bool,
    pub cache_bytes: usize,
    pub commit_secs: u64,
    /// The kernel's writeback cache (`writeback_cache`; off by default):
    /// faster small writes, but write(2) no longer sees ENOSPC (see
    /// `FuseFs::writeback_cache`).
    pub writeback_cache: bool,
    /// Background cleaning policy; `None` turns the background cleaner off
    /// (writes still clean in the foreground when space runs low).
    pub cleaner: Option<ldfs::lld::PolicyKind>,
    /// Cleaning starts below this many clean segments (`clean_start=N`;
    /// default: the reserve plus max(2, segments/256)).
    pub clean_start: Option<u32>,
    /// Background cleaning stops above this many (`clean_stop=N`).
    pub clean_stop: Option<u32>,
    /// Options passed on to FUSE as they are.
    pub fuse: Vec<MountOption>,
}

impl Default for MountOpts {
    fn default() -> Self {
        MountOpts {
            read_only: false,
            allow_other: false,
            cache_bytes: 64 << 20,
            commit_secs: 5,
            writeback_cache: false,
            cleaner: Some(ldfs::lld::PolicyKind::default()),
            clean_start: None,
            clean_stop: None,
            fuse: Vec::new(),
        }
    }
}

/// Parses a comma-separated option list (`ro,allow_other,cache=128M,commit=5`).
pub fn parse_options(list: &[String]) -> Result<MountOpts, String> {
    let mut o = MountOpts::default();
    for item in list
        .iter()
        .flat_map(|s| s.split(','))
        .filter(|s| !s.is_empty())
    {
        let (key, val) = match item.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (item, None),
        };
        match (key, val) {
            ("ro", None) => o.read_only = true,
            ("rw", None) => o.read_only = false,
            ("allow_other", None) => o.allow_other = true,
            ("writeback_cache", None) => o.writeback_cache = true,
            ("no_writeback_cache", None) => o.writeback_cache = false,
            ("cache", Some(v)) => {
                o.cache_bytes = crate::parse_size(v)
                    .map_err(|e| format!("cache={v}: {e}"))?
                    .try_into()
                    .map_err(|_| format!("cache={v} is too large"))?;
                if o.cache_bytes < 1 << 20 {
                    return Err(format!("cache={v}: at least 1M"));
                }
            }
            ("commit", Some(v)) => {
                o.commit_secs = v
                    .parse()
                    .ok()
                    .filter(|&s: &u64| (1..=3600).contains(&s))
                    .ok_or_else(|| format!("commit={v}: seconds from 1 to 3600"))?;
            }
            ("cleaner", Some("off")) => o.cleaner = None,
            ("cleaner", Some(v)) => {
                o.cleaner = Some(v.parse().map_err(|e| format!("cleaner={v}: {e}"))?);
            }
            ("clean_start", Some(v)) => {
                o.clean_start = Some(
                    v.parse()
                        .map_err(|_| format!("clean_start={v}: a number of segments"))?,
                );
            }
            ("clean_stop", Some(v)) => {
                o.clean_stop = Some(
                    v.parse()
                        .map_err(|_| format!("clean_stop={v}: a number of segments"))?,
                );
            }
            ("dev", None) => o.fuse.push(MountOption::Dev),
            ("nodev", None) => o.fuse.push(MountOption::NoDev),
            ("suid", None) => o.fuse.push(MountOption::Suid),
            ("nosuid", None) => o.fuse.push(MountOption::NoSuid),
            ("exec", None) => o.fuse.push(MountOption::Exec),
            ("noexec", None) => o.fuse.push(MountOption::NoExec),
            ("atime", None) => o.fuse.push(MountOption::Atime),
            ("noatime", None) => o.fuse.push(MountOption::NoAtime),
            ("sync", None) => o.fuse.push(MountOption::Sync),
            ("async", None) => o.fuse.push(MountOption::Async),
            // What mount(8) and fstab pass along but is not ours to act on.
            (
                "defaults" | "auto" | "noauto" | "user" | "nouser" | "users" | "nofail" | "_netdev"
                | "relatime" | "norelatime" | "strictatime",
                None,
            ) => {}
            (k, _) if k.starts_with("x-") => {}
            _ => return Err(format!("unknown mount option '{item}'")),
        }
    }
    if let (Some(a), Some(b)) = (o.clean_start, o.clean_stop) {
        if b < a {
            return Err(format!(
                "clean_stop={b} is below clean_start={a}: cleaning would stop before it starts"
            ));
        }
    }
    Ok(o)
}

/// Holds an exclusive lock on the image for the life of the mount, so a
/// second mount of the same image is refused.
fn lock_image(image: &Path) -> Result<File, String> {
    let f = File::open(image).map_err(|e| format!("{}: {e}", image.display()))?;
    let r = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if r != 0 {
        return Err(format!(
            "{} is in use (already mounted, or being checked)",
            image.display()
        ));
    }
    Ok(f)
}

fn check_mountpoint(dir: &Path) -> Result<(), String> {
    let meta = std::fs::metadata(dir).map_err(|e| format!("mount point {}: {e}", dir.display()))?;
    if !meta.is_dir() {
        return Err(format!("mount point {} is not a directory", dir.display()));
    }
    let canon = dir
        .canonicalize()
        .map_err(|e| format!("mount point {}: {e}", dir.display()))?;
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let canon = canon.to_string_lossy();
    if mounts.lines().any(|l| l.split(' ').nth(1) == Some(&*canon)) {
        return Err(format!(
            "mount point {} is busy: something is mounted there",
            dir.display()
        ));
    }
    Ok(())
}

/// Blocks the signals the mount handles, so only the signal thread gets them.
fn block_signals() -> libc::sigset_t {
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::sigaddset(&mut set, s);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

pub fn run(
    image: PathBuf,
    dir: PathBuf,
    foreground: bool,
    options: Vec<String>,
    daemon_child: bool,
) -> Result<(), String> {
    let opts = parse_options(&options)?;
    if !foreground {
        return spawn_daemon(&image, &dir, &options);
    }
    if daemon_child {
        unsafe { libc::setsid() };
    }
    check_mountpoint(&dir)?;
    let sigset = block_signals();
    let _lock = lock_image(&image)?;
    let dev: Arc<dyn Device> = Arc::new(
        FileDevice::open(&image, FileDeviceOptions::default())
            .map_err(|e| format!("{}: {e}", image.display()))?,
    );
    let lld = Arc::new(
        Lld::open(
            dev,
            LldOptions {
                read_only: opts.read_only,
                map_budget_bytes: opts.cache_bytes,
                cleaner: ldfs::lld::CleanerOptions {
                    policy: opts.cleaner.unwrap_or_default(),
                    background: opts.cleaner.is_some() && !opts.read_only,
                    start_clean_segments: opts.clean_start,
                    stop_clean_segments: opts.clean_stop,
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .map_err(|e| format!("{}: {e}", image.display()))?,
    );
    let ld: Arc<dyn LogicalDisk> = lld.clone();
    let fs = Arc::new(
        Fs::mount(
            ld,
            FsOptions {
                read_only: opts.read_only,
                ..Default::default()
            },
        )
        .map_err(|e| format!("{}: {e}", image.display()))?,
    );

    let mut cfg = Config::default();
    cfg.mount_options = vec![
        MountOption::FSName(image.display().to_string()),
        MountOption::Subtype("ldfs".into()),
        MountOption::DefaultPermissions,
        if opts.read_only {
            MountOption::RO
        } else {
            MountOption::RW
        },
    ];
    cfg.mount_options.extend(opts.fuse.iter().cloned());
    if opts.allow_other {
        cfg.acl = SessionACL::All;
    }
    cfg.n_threads = Some(crate::FUSE_THREADS);
    let control: Arc<dyn Control> = Arc::new(Daemon {
        lld: lld.clone(),
        cancel: AtomicBool::new(false),
        last_clean: std::sync::Mutex::new("no clean since mount\n".into()),
    });
    let mut session = Session::new(
        FuseFs {
            fs: fs.clone(),
            no_open: false,
            control: Some(control),
            writeback_cache: opts.writeback_cache,
        },
        &dir,
        &cfg,
    )
    .map_err(|e| format!("mounting on {}: {e}", dir.display()))?;

    // Signals unmount; the session then returns and the engine closes.
    let mut unmounter = session.unmount_callable();
    std::thread::spawn(move || loop {
        let mut sig = 0;
        if unsafe { libc::sigwait(&sigset, &mut sig) } == 0 {
            let _ = unmounter.unmount();
            break;
        }
    });
    // Commit on our own within the interval: the kernel does not pass
    // sync(2) on to FUSE daemons.
    let stop = Arc::new(AtomicBool::new(false));
    let committer = {
        let (fs, stop) = (fs.clone(), stop.clone());
        let every = Duration::from_secs(opts.commit_secs);
        std::thread::spawn(move || {
            let tick = Duration::from_millis(100);
            let mut waited = Duration::ZERO;
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(tick);
                waited += tick;
                if waited >= every {
                    waited = Duration::ZERO;
                    if let Err(e) = fs.fsync() {
                        eprintln!("ldfs: periodic commit failed: {e}");
                    }
                }
            }
        })
    };
    if daemon_child {
        println!("ready");
        let _ = std::io::stdout().flush();
        detach_output(&image);
    }
    let served = session.run();
    stop.store(true, Ordering::Relaxed);
    let _ = committer.join();
    drop(fs);
    let closed = lld.close();
    served.map_err(|e| format!("serving {}: {e}", dir.display()))?;
    closed.map_err(|e| format!("final checkpoint of {}: {e}", image.display()))
}

/// A daemon must not hold its parent's terminal or pipes: stdout goes to
/// /dev/null and stderr (errors such as a block failing its checksum, with
/// inode and offset) to syslog, one line per message.
fn detach_output(image: &Path) {
    let Ok(null) = File::options().write(true).open("/dev/null") else {
        return;
    };
    unsafe { libc::dup2(null.as_raw_fd(), 1) };
    let mut fds = [0; 2];
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        unsafe { libc::dup2(null.as_raw_fd(), 2) };
        return;
    }
    unsafe {
        libc::dup2(fds[1], 2);
        libc::close(fds[1]);
    }
    let reader = unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fds[0]) };
    let ident = std::ffi::CString::new(format!("ldfs[{}]", image.display())).unwrap_or_default();
    std::thread::spawn(move || {
        // openlog keeps the pointer: the string lives as long as the thread.
        unsafe { libc::openlog(ident.as_ptr(), libc::LOG_PID, libc::LOG_DAEMON) };
        for line in BufReader::new(reader).lines().map_while(Result::ok) {
            if let Ok(c) = std::ffi::CString::new(line) {
                unsafe { libc::syslog(libc::LOG_ERR, c"%s".as_ptr(), c.as_ptr()) };
            }
        }
    });
}

/// Starts `ldfs mount -f` in the background and waits until it has mounted
/// (or failed, in which case its error has already been printed).
fn spawn_daemon(image: &Path, dir: &Path, options: &[String]) -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| format!("finding ldfs: {e}"))?;
    let mut cmd = Command::new(exe);
    cmd.arg("mount").arg("-f").arg("--daemon-child");
    for o in options {
        cmd.arg("-o").arg(o);
    }
    cmd.arg(image).arg(dir);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("starting the mount process: {e}"))?;
    let out = child.stdout.take().expect("piped stdout");
    let mut line = String::new();
    let _ = BufReader::new(out).read_line(&mut line);
    if line.trim() == "ready" {
        return Ok(());
    }
    let status = child.wait().map_err(|e| e.to_string())?;
    Err(format!("mount failed ({status})"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<MountOpts, String> {
        parse_options(&[s.to_string()])
    }

    #[test]
    fn cleaner_options() {
        let o = parse("").unwrap();
        assert_eq!(o.cleaner, Some(ldfs::lld::PolicyKind::default()));
        assert_eq!(parse("cleaner=off").unwrap().cleaner, None);
        assert_eq!(
            parse("cleaner=greedy").unwrap().cleaner,
            Some(ldfs::lld::PolicyKind::Greedy)
        );
        let o = parse("clean_start=10,clean_stop=40").unwrap();
        assert_eq!((o.clean_start, o.clean_stop), (Some(10), Some(40)));
        for bad in [
            "cleaner=bogus",
            "cleaner",
            "clean_start=x",
            "clean_stop=-1",
            "clean_start=9,clean_stop=3",
        ] {
            let e = parse(bad).unwrap_err();
            let key = bad.split(['=', ',']).next().unwrap();
            assert!(e.contains(key), "{bad}: {e}");
        }
    }

    #[test]
    fn other_options() {
        let o = parse("ro,cache=128M,commit=7,noatime").unwrap();
        assert!(o.read_only);
        assert_eq!(o.cache_bytes, 128 << 20);
        assert_eq!(o.commit_secs, 7);
        assert!(!o.writeback_cache, "the writeback cache is opt-in");
        assert!(parse("writeback_cache").unwrap().writeback_cache);
        assert!(
            !parse("writeback_cache,no_writeback_cache")
                .unwrap()
                .writeback_cache
        );
        assert!(parse("commit=0").is_err());
        assert!(parse("cache=10K").is_err());
        assert!(parse("frobnicate").unwrap_err().contains("frobnicate"));
    }
}
