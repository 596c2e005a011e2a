//! `ldfs bench dual`: the DualFS paper's experiments (section 4) on this
//! machine, measured as the paper measures them: the total I/O time, the
//! time each device was busy (`io_ticks`, field 10 of
//! /sys/block/DEV/stat), summed over the devices a file system uses.
//!
//! Every target runs on loop devices (`losetup --direct-io=on`, so the I/O
//! reaches the host disk and the block layer keeps the statistics):
//! - `ldfs-dual`: DualFS's "separate disks" set-up, metadata and data on two
//!   loop devices (metadata 10% of the space, as in the paper);
//! - `ldfs-dual-1d`: DualFS-1d, one loop device with two partitions, the
//!   metadata on the outer (first) one; its I/O time is the whole disk's;
//! - `ldfs` (one log), `ext4` (data=ordered, the paper's Ext3) and `ext2`,
//!   each on one loop device of the same total size.
//!
//! Experiments: the six micro-benchmarks of 4.1 on a real source tree (the
//! pattern tree sits on a tmpfs, a device not analyzed), PostMark (4.2,
//! Debian's postmark 1.51) and write-del (4.4, without cleaning and with a
//! segment cleaned every five seconds). Each phase starts from a fresh
//! mount with the page cache dropped (the paper rebooted) and ends with the
//! file system durable and unmounted, so the writes it caused are counted
//! in it; the wall time is the phase's work until durable.
//!
//! Invariants: what this benchmark mounts it unmounts, every loop device
//! it attaches it detaches and every image it creates it deletes, also on
//! error paths (`Rig` on drop). A target whose tools are missing is skipped
//! with the reason.

use std::fmt::Write as _;
use std::fs::{self, File};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::bench::apps::Postmark;
use crate::bench::fs::{have, run, R};
use crate::bench::report::{md_table, Machine};
use crate::bench::writedel::Tree;

pub struct DualBench {
    pub dir: PathBuf,
    /// Space of each target: one device, or metadata plus data.
    pub image_bytes: u64,
    pub targets: Vec<String>,
    pub experiments: Vec<String>,
    /// MiB of vendored crates in the micro-benchmarks' source tree.
    pub tree_mib: u64,
    pub postmark: Postmark,
    pub writedel_files: usize,
    pub writedel_rounds: usize,
    /// Seconds between the segments cleaned in write-del's "+cleaner".
    pub clean_every_secs: f64,
    /// Process counts of the micro-benchmarks (the paper: 1 and 4).
    pub procs: Vec<usize>,
    /// Runs of everything, targets interleaved; medians reported.
    pub repeat: usize,
    pub json: Option<PathBuf>,
    pub out: Option<PathBuf>,
    pub note: Option<String>,
}

pub const TARGETS: [&str; 5] = ["ldfs-dual", "ldfs-dual-1d", "ldfs", "ext4", "ext2"];
pub const EXPERIMENTS: [&str; 3] = ["micro", "postmark", "writedel"];

/// The micro-benchmarks in the paper's order (they run in `RUN_ORDER`).
const MICRO: [&str; 6] = [
    "read-meta",
    "read-data-meta",
    "write-meta",
    "write-data-meta",
    "read-write-meta",
    "read-write-data-meta",
];
/// The write phases make the tree the read phases read.
const RUN_ORDER: [usize; 6] = [2, 3, 0, 1, 4, 5];
/// read-data-meta searches every file for this (files containing it are
/// counted and checked against the pattern tree).
const NEEDLE: &[u8] = b"unsafe";

fn is_ldfs(target: &str) -> bool {
    target.starts_with("ldfs")
}

fn drop_caches() {
    unsafe { libc::sync() };
    let _ = fs::write("/proc/sys/vm/drop_caches", "3");
}

fn loadavg() -> String {
    fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// Why `target` cannot run here, if it cannot.
fn check_target(target: &str) -> R<()> {
    if unsafe { libc::geteuid() } != 0 {
        return Err("needs root (loop devices, mount, drop_caches)".into());
    }
    if !Path::new("/dev/loop-control").exists() || !have("losetup") {
        return Err("no loop devices (/dev/loop-control, losetup)".into());
    }
    let need = |progs: &[&str]| match progs.iter().find(|p| !have(p)) {
        Some(p) => Err(format!("{p} is missing")),
        None => Ok(()),
    };
    match target {
        "ldfs" | "ldfs-dual" => need(&["fusermount3"]),
        "ldfs-dual-1d" => need(&["fusermount3", "partx"]),
        "ext4" => need(&["mkfs.ext4"]),
        "ext2" => need(&["mkfs.ext2"]),
        other => Err(format!("unknown target {other} ({})", TARGETS.join(", "))),
    }
}

// ------------------------------------------------------------ loop devices

/// A loop device this benchmark attached; detached on drop.
struct Loop {
    dev: String,
}

impl Loop {
    fn attach(img: &Path, partitions: bool) -> R<Loop> {
        let out = Command::new("losetup")
            .args(["--direct-io=on", "--find", "--show"])
            .args(partitions.then_some("--partscan"))
            .arg(img)
            .output()
            .map_err(|e| format!("losetup: {e}"))?;
        let dev = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if !out.status.success() || dev.is_empty() {
            return Err(format!(
                "losetup {}: {}",
                img.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(Loop { dev })
    }

    /// `loop3` for /dev/loop3.
    fn name(&self) -> String {
        self.dev.trim_start_matches("/dev/").to_string()
    }

    /// Partition `n`'s device, once the kernel has it: the kernel reads the
    /// table itself where it can, else `partx -a` tells it (BLKPG).
    fn partition(&self, n: u32) -> R<String> {
        let name = format!("{}p{n}", self.name());
        let sys = Path::new("/sys/block").join(self.name()).join(&name);
        if !sys.exists() {
            run(Command::new("partx").arg("-a").arg(&self.dev))?;
        }
        let dev = format!("/dev/{name}");
        for _ in 0..100 {
            if sys.exists() && Path::new(&dev).exists() {
                return Ok(dev);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(format!("{dev} did not appear (no partition support?)"))
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.dev).status();
    }
}

/// A minimal MBR with two primary Linux partitions: the first (outer)
/// `first_bytes` long from 1 MiB on, the second the rest of `total_bytes`.
fn write_mbr(img: &Path, first_bytes: u64, total_bytes: u64) -> R<()> {
    use std::os::unix::fs::FileExt;
    const SECTOR: u64 = 512;
    let start1 = (1u64 << 20) / SECTOR;
    let len1 = first_bytes / SECTOR;
    let start2 = start1 + len1;
    let len2 = total_bytes / SECTOR - start2;
    let mut mbr = [0u8; 512];
    for (i, (start, len)) in [(start1, len1), (start2, len2)].into_iter().enumerate() {
        let e = 446 + 16 * i;
        mbr[e + 4] = 0x83; // Linux
        let start = u32::try_from(start).map_err(|_| "partition too far for an MBR")?;
        let len = u32::try_from(len).map_err(|_| "partition too large for an MBR")?;
        mbr[e + 8..e + 12].copy_from_slice(&start.to_le_bytes());
        mbr[e + 12..e + 16].copy_from_slice(&len.to_le_bytes());
    }
    mbr[510] = 0x55;
    mbr[511] = 0xaa;
    let f = fs::OpenOptions::new()
        .write(true)
        .open(img)
        .map_err(|e| format!("{}: {e}", img.display()))?;
    f.write_all_at(&mbr, 0).map_err(|e| e.to_string())
}

// ------------------------------------------------------ device statistics

/// A device whose statistics a target's runs report.
#[derive(Clone, Debug)]
struct Dev {
    /// "disk", "meta" or "data".
    role: &'static str,
    name: String,
    stat: PathBuf,
    /// Counted in the target's total I/O time (a partition is not: its
    /// disk is).
    summed: bool,
}

/// The fields of a block device's stat file this benchmark reports.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Stat {
    reads: u64,
    read_sectors: u64,
    writes: u64,
    write_sectors: u64,
    /// Field 10: milliseconds the device had I/O in flight.
    io_ms: u64,
}

impl Stat {
    fn parse(text: &str) -> R<Stat> {
        let f: Vec<u64> = text
            .split_whitespace()
            .map(|x| x.parse().map_err(|_| format!("stat field {x:?}")))
            .collect::<R<_>>()?;
        if f.len() < 11 {
            return Err(format!("a stat line of {} fields", f.len()));
        }
        Ok(Stat {
            reads: f[0],
            read_sectors: f[2],
            writes: f[4],
            write_sectors: f[6],
            io_ms: f[9],
        })
    }

    fn read(path: &Path) -> R<Stat> {
        Stat::parse(&fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?)
    }

    fn since(self, before: Stat) -> Stat {
        Stat {
            reads: self.reads - before.reads,
            read_sectors: self.read_sectors - before.read_sectors,
            writes: self.writes - before.writes,
            write_sectors: self.write_sectors - before.write_sectors,
            io_ms: self.io_ms - before.io_ms,
        }
    }
}

// ------------------------------------------------------------------ targets

/// A formatted target on its loop devices; unmounted, detached and deleted
/// on drop.
struct Rig {
    target: String,
    mnt: PathBuf,
    /// The device mounted (the data device of a dual file system).
    source: String,
    /// Devices a FUSE daemon holds locked until it has exited.
    locked: Vec<String>,
    options: String,
    devices: Vec<Dev>,
    mounted: bool,
    loops: Vec<Loop>,
    images: Vec<PathBuf>,
}

fn make_image(path: &Path, bytes: u64) -> R<()> {
    let _ = fs::remove_file(path);
    File::create(path)
        .and_then(|f| f.set_len(bytes))
        .map_err(|e| format!("{}: {e}", path.display()))
}

fn stat_path(disk: &str, part: Option<&str>) -> PathBuf {
    let p = Path::new("/sys/block").join(disk);
    match part {
        Some(n) => p.join(n).join("stat"),
        None => p.join("stat"),
    }
}

impl Rig {
    /// Formats a fresh `target` under `b.dir`; `ldfs_options` are added to
    /// an ldfs target's mount options.
    fn new(b: &DualBench, target: &str, ldfs_options: &str) -> R<Rig> {
        let base = b.dir.join(format!("bench-dual-{target}"));
        let mnt = base.join("mnt");
        fs::create_dir_all(&mnt).map_err(|e| format!("{}: {e}", mnt.display()))?;
        if is_mounted(&mnt) {
            return Err(format!("{} is already mounted", mnt.display()));
        }
        let mut rig = Rig {
            target: target.to_string(),
            mnt,
            source: String::new(),
            locked: Vec::new(),
            options: String::new(),
            devices: Vec::new(),
            mounted: false,
            loops: Vec::new(),
            images: Vec::new(),
        };
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        // DualFS: the metadata device is 10% of the space.
        let meta_bytes = (b.image_bytes / 10).max(64 << 20) >> 20 << 20;
        match target {
            "ext2" | "ext4" | "ldfs" => {
                let img = base.with_extension("img");
                make_image(&img, b.image_bytes)?;
                rig.images.push(img.clone());
                let l = Loop::attach(&img, false)?;
                rig.source = l.dev.clone();
                rig.devices.push(Dev {
                    role: "disk",
                    name: l.name(),
                    stat: stat_path(&l.name(), None),
                    summed: true,
                });
                rig.loops.push(l);
                match target {
                    "ext2" => run(Command::new("mkfs.ext2")
                        .args(["-q", "-F", "-b", "4096"])
                        .arg(&rig.source))?,
                    // No lazy initialization: it would write in the
                    // background of the measured phases.
                    "ext4" => run(Command::new("mkfs.ext4")
                        .args(["-q", "-F", "-b", "4096", "-E"])
                        .arg("lazy_itable_init=0,lazy_journal_init=0")
                        .arg(&rig.source))?,
                    _ => run(Command::new(&exe).arg("mkfs").arg(&rig.source))?,
                }
                rig.locked = vec![rig.source.clone()];
            }
            "ldfs-dual" => {
                let data_img = base.with_extension("data.img");
                let meta_img = base.with_extension("meta.img");
                make_image(&data_img, b.image_bytes - meta_bytes)?;
                make_image(&meta_img, meta_bytes)?;
                rig.images.extend([data_img.clone(), meta_img.clone()]);
                let meta = Loop::attach(&meta_img, false)?;
                let data = Loop::attach(&data_img, false)?;
                for (role, l) in [("meta", &meta), ("data", &data)] {
                    rig.devices.push(Dev {
                        role,
                        name: l.name(),
                        stat: stat_path(&l.name(), None),
                        summed: true,
                    });
                }
                run(Command::new(&exe)
                    .arg("mkfs")
                    .arg("--meta")
                    .arg(&meta.dev)
                    .arg(&data.dev))?;
                rig.source = data.dev.clone();
                rig.locked = vec![data.dev.clone(), meta.dev.clone()];
                rig.loops.extend([meta, data]);
            }
            "ldfs-dual-1d" => {
                let img = base.with_extension("img");
                let total = b.image_bytes + (1 << 20);
                make_image(&img, total)?;
                rig.images.push(img.clone());
                write_mbr(&img, meta_bytes, total)?;
                let l = Loop::attach(&img, true)?;
                let name = l.name();
                rig.loops.push(l);
                let meta = rig.loops[0].partition(1)?;
                let data = rig.loops[0].partition(2)?;
                rig.devices.push(Dev {
                    role: "disk",
                    name: name.clone(),
                    stat: stat_path(&name, None),
                    summed: true,
                });
                for (role, p) in [("meta", &meta), ("data", &data)] {
                    let part = p.trim_start_matches("/dev/");
                    rig.devices.push(Dev {
                        role,
                        name: part.to_string(),
                        stat: stat_path(&name, Some(part)),
                        summed: false,
                    });
                }
                run(Command::new(&exe)
                    .arg("mkfs")
                    .arg("--meta")
                    .arg(&meta)
                    .arg(&data))?;
                rig.source = data.clone();
                rig.locked = vec![data, meta];
            }
            other => return Err(format!("unknown target {other}")),
        }
        rig.options = match target {
            "ext4" => "data=ordered".into(),
            "ext2" => String::new(),
            _ if ldfs_options.is_empty() => "transport=dev".into(),
            _ => format!("transport=dev,{ldfs_options}"),
        };
        for d in &rig.devices {
            Stat::read(&d.stat)?;
        }
        Ok(rig)
    }

    fn kernel(&self) -> bool {
        !is_ldfs(&self.target)
    }

    fn mount(&mut self) -> R<()> {
        assert!(!self.mounted, "{} mounted twice", self.target);
        if self.kernel() {
            let mut cmd = Command::new("mount");
            cmd.args(["-t", &self.target]);
            if !self.options.is_empty() {
                cmd.args(["-o", &self.options]);
            }
            run(cmd.arg(&self.source).arg(&self.mnt))?;
        } else {
            let exe = std::env::current_exe().map_err(|e| e.to_string())?;
            run(Command::new(exe)
                .args(["mount", "-o", &self.options])
                .arg(&self.source)
                .arg(&self.mnt))?;
            for _ in 0..200 {
                if is_mounted(&self.mnt) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            if !is_mounted(&self.mnt) {
                return Err(format!("{} did not mount", self.mnt.display()));
            }
        }
        self.mounted = true;
        Ok(())
    }

    /// Unmounts, and for ldfs waits until its daemon has written its last
    /// checkpoint and exited (it holds its devices locked until then).
    fn unmount(&mut self) -> R<()> {
        if !self.mounted {
            return Ok(());
        }
        if self.kernel() {
            run(Command::new("umount").arg(&self.mnt))?;
            self.mounted = false;
            return Ok(());
        }
        run(Command::new("fusermount3").arg("-u").arg(&self.mnt))?;
        self.mounted = false;
        for dev in &self.locked {
            let f = File::open(dev).map_err(|e| format!("{dev}: {e}"))?;
            let t0 = Instant::now();
            while unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
                if t0.elapsed() > Duration::from_secs(120) {
                    return Err(format!("the ldfs daemon on {dev} did not exit"));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Ok(())
    }

    fn snapshot(&self) -> R<Vec<Stat>> {
        self.devices.iter().map(|d| Stat::read(&d.stat)).collect()
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        if self.mounted {
            let _ = self.unmount();
            if is_mounted(&self.mnt) {
                let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
            }
        }
        self.loops.clear();
        for img in &self.images {
            let _ = fs::remove_file(img);
        }
        let _ = fs::remove_dir(&self.mnt);
        if let Some(base) = self.mnt.parent() {
            let _ = fs::remove_dir(base);
        }
    }
}

fn is_mounted(mnt: &Path) -> bool {
    let Ok(canon) = mnt.canonicalize() else {
        return false;
    };
    crate::fuse::mount::mounts().iter().any(|m| m.dir == canon)
}

/// The mounted file system a phase works in.
struct Mnt<'a> {
    path: &'a Path,
    kernel: bool,
}

impl Mnt<'_> {
    /// syncfs(2) for a kernel file system; an fsync of the root for ldfs
    /// (the kernel does not pass syncfs to FUSE; ldfs flushes its log).
    fn durable(&self) -> R<()> {
        let d = File::open(self.path).map_err(|e| format!("{}: {e}", self.path.display()))?;
        if self.kernel {
            if unsafe { libc::syncfs(d.as_raw_fd()) } != 0 {
                return Err(format!("syncfs: {}", std::io::Error::last_os_error()));
            }
            Ok(())
        } else {
            d.sync_all().map_err(|e| format!("fsync of the root: {e}"))
        }
    }
}

/// One measured phase.
struct Run {
    experiment: &'static str,
    phase: String,
    /// The column: the target, with write-del's cleaning configuration.
    column: String,
    rep: usize,
    load: String,
    wall_s: f64,
    devices: Vec<(Dev, Stat)>,
    extra: Vec<(String, f64)>,
}

impl Run {
    fn io_s(&self) -> f64 {
        self.devices
            .iter()
            .filter(|(d, _)| d.summed)
            .map(|(_, s)| s.io_ms as f64 / 1000.0)
            .sum()
    }

    fn role_io_s(&self, role: &str) -> Option<f64> {
        self.devices
            .iter()
            .find(|(d, _)| d.role == role)
            .map(|(_, s)| s.io_ms as f64 / 1000.0)
    }
}

/// A phase's wall time, each device's statistics and its own figures.
type Measured = (f64, Vec<(Dev, Stat)>, Vec<(String, f64)>);

type Work<'w> = dyn FnMut(&Mnt) -> R<Vec<(String, f64)>> + 'w;

/// Cold start (caches dropped, fresh mount), `work`, durable, unmounted:
/// the devices' statistics over all of it, the wall time of `work` until
/// durable.
fn phase(rig: &mut Rig, work: &mut Work) -> R<Measured> {
    drop_caches();
    rig.mount()?;
    let before = rig.snapshot()?;
    let t0 = Instant::now();
    let m = Mnt {
        path: &rig.mnt,
        kernel: rig.kernel(),
    };
    let extra = work(&m)?;
    m.durable()?;
    let wall = t0.elapsed().as_secs_f64();
    rig.unmount()?;
    let after = rig.snapshot()?;
    let devices = rig
        .devices
        .iter()
        .cloned()
        .zip(after.into_iter().zip(before).map(|(a, b)| a.since(b)))
        .collect();
    Ok((wall, devices, extra))
}

// -------------------------------------------------------- micro-benchmarks

/// The pattern tree and what the read phases must find in its copy.
struct Pattern {
    root: PathBuf,
    dirs: Vec<PathBuf>,
    files: Vec<PathBuf>,
    bytes: u64,
    /// Files larger than 2 KB (read-meta's `find -size +2k`).
    big: usize,
    /// Files containing `NEEDLE` (read-data-meta's `grep -l`).
    matching: usize,
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

impl Pattern {
    fn scan(root: PathBuf) -> R<Pattern> {
        let (dirs, files) = super::apps::walk(&root)?;
        let (mut bytes, mut big, mut matching) = (0, 0, 0);
        for f in &files {
            let data = fs::read(root.join(f)).map_err(|e| format!("{}: {e}", f.display()))?;
            bytes += data.len() as u64;
            big += usize::from(data.len() > 2048);
            matching += usize::from(contains(&data, NEEDLE));
        }
        Ok(Pattern {
            root,
            dirs,
            files,
            bytes,
            big,
            matching,
        })
    }
}

/// Runs `each` on every file of `files`, split over `procs` threads (the
/// paper's 4-process runs: the job divided into roughly equal parts), and
/// sums what it returns.
fn split(procs: usize, files: &[PathBuf], each: &(dyn Fn(&Path) -> R<usize> + Sync)) -> R<usize> {
    let procs = procs.max(1);
    std::thread::scope(|s| {
        let parts: Vec<_> = (0..procs)
            .map(|k| {
                s.spawn(move || -> R<usize> {
                    let mut sum = 0;
                    for f in files.iter().skip(k).step_by(procs) {
                        sum += each(f)?;
                    }
                    Ok(sum)
                })
            })
            .collect();
        let mut sum = 0;
        for p in parts {
            sum += p.join().map_err(|_| "a worker panicked".to_string())??;
        }
        Ok(sum)
    })
}

/// Recreates `from`'s tree under `to` (`to` must not exist), with every
/// file's bytes or empty: the directories first, then the files by `procs`
/// workers.
fn copy_tree(from: &Path, to: &Path, with_data: bool, procs: usize) -> R<()> {
    let (dirs, files) = super::apps::walk(from)?;
    fs::create_dir(to).map_err(|e| format!("{}: {e}", to.display()))?;
    for d in &dirs {
        fs::create_dir(to.join(d)).map_err(|e| format!("{}: {e}", d.display()))?;
    }
    split(procs, &files, &|f| {
        if with_data {
            fs::copy(from.join(f), to.join(f)).map_err(|e| format!("{}: {e}", f.display()))?;
        } else {
            File::create(to.join(f)).map_err(|e| format!("{}: {e}", f.display()))?;
        }
        Ok(0)
    })?;
    Ok(())
}

/// One micro-benchmark in the mounted file system by `procs` workers;
/// checks what it finds.
fn micro_work(which: &str, procs: usize, m: &Mnt, p: &Pattern) -> R<Vec<(String, f64)>> {
    let src = m.path.join("src");
    match which {
        "write-meta" => copy_tree(&p.root, &m.path.join("wm"), false, procs)?,
        "write-data-meta" => copy_tree(&p.root, &src, true, procs)?,
        "read-meta" => {
            let (_, files) = super::apps::walk(&src)?;
            let big = split(procs, &files, &|f| {
                let md = fs::symlink_metadata(src.join(f)).map_err(|e| e.to_string())?;
                Ok(usize::from(md.len() > 2048))
            })?;
            if big != p.big || files.len() != p.files.len() {
                return Err(format!(
                    "read-meta found {big} of {} files over 2 KB, expected {} of {}",
                    files.len(),
                    p.big,
                    p.files.len()
                ));
            }
        }
        "read-data-meta" => {
            let (_, files) = super::apps::walk(&src)?;
            let matching = split(procs, &files, &|f| {
                let data = fs::read(src.join(f)).map_err(|e| e.to_string())?;
                Ok(usize::from(contains(&data, NEEDLE)))
            })?;
            if matching != p.matching {
                return Err(format!(
                    "read-data-meta found {matching} files, expected {}",
                    p.matching
                ));
            }
        }
        "read-write-meta" => copy_tree(&src, &m.path.join("rwm"), false, procs)?,
        "read-write-data-meta" => copy_tree(&src, &m.path.join("rwdm"), true, procs)?,
        other => unreachable!("micro-benchmark {other}"),
    }
    Ok(Vec::new())
}

/// A micro-benchmark's row: its name, and the processes if more than one.
fn micro_label(which: &str, procs: usize) -> String {
    if procs <= 1 {
        which.to_string()
    } else {
        format!("{which}, {procs} processes")
    }
}

// ----------------------------------------------------------------- write-del

/// `copy_delete_rounds`, with one segment cleaned every `every` seconds
/// meanwhile if `clean` (through the daemon, as `ldfs clean MNT
/// --segments 1`), and the segments the file system cleaned.
fn writedel_work(m: &Mnt, b: &DualBench, tree: &Tree, clean: bool) -> R<Vec<(String, f64)>> {
    let root = m.path.join("writedel");
    let stop = AtomicBool::new(false);
    let requests = std::thread::scope(|s| -> R<u64> {
        let cleaner = clean.then(|| {
            s.spawn(|| {
                let req = crate::cli::clean::CleanRequest {
                    policy: ldfs::lld::PolicyKind::default(),
                    max_utilization: 100,
                    segments: Some(1),
                }
                .encode();
                let mut n = 0u64;
                loop {
                    let t0 = Instant::now();
                    while t0.elapsed().as_secs_f64() < b.clean_every_secs {
                        if stop.load(Ordering::Relaxed) {
                            return n;
                        }
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    if crate::cli::control::control_set(m.path, "clean", req.as_bytes()).is_ok() {
                        n += 1;
                    }
                }
            })
        });
        let r =
            super::writedel::copy_delete_rounds(&root, tree, b.writedel_rounds, &|| m.durable());
        stop.store(true, Ordering::Relaxed);
        let n = cleaner.map_or(0, |h| h.join().unwrap_or(0));
        r.map(|_| n)
    })?;
    let mut extra = vec![("clean requests".to_string(), requests as f64)];
    if !m.kernel {
        let stats = crate::cli::control::control_get(m.path, "stats").map_err(|e| e.to_string())?;
        let cleaned = super::writedel::stat_after(&String::from_utf8_lossy(&stats), "cleaned:")
            .unwrap_or(f64::NAN);
        extra.push(("segments cleaned".into(), cleaned));
    }
    Ok(extra)
}

// ---------------------------------------------------------------- the run

fn json_run(r: &Run) -> Value {
    json!({
        "experiment": r.experiment,
        "phase": r.phase,
        "target": r.column,
        "rep": r.rep,
        "load": r.load,
        "wall_s": r.wall_s,
        "io_s": r.io_s(),
        "devices": r.devices.iter().map(|(d, s)| json!({
            "role": d.role,
            "device": d.name,
            "summed": d.summed,
            "io_ms": s.io_ms,
            "reads": s.reads,
            "writes": s.writes,
            "read_kib": s.read_sectors / 2,
            "write_kib": s.write_sectors / 2,
        })).collect::<Vec<_>>(),
        "extra": r.extra.iter().map(|(k, v)| (k.clone(), json!(v))).collect::<serde_json::Map<_, _>>(),
    })
}

struct Outcome {
    machine: Machine,
    description: String,
    targets: Vec<String>,
    skipped: Vec<(String, String)>,
    runs: Vec<Run>,
    errors: Vec<String>,
}

fn outcome_json(o: &Outcome) -> String {
    let v = json!({
        "machine": serde_json::from_str::<Value>(&super::report::machine_json(&o.machine)).unwrap_or(Value::Null),
        "description": o.description,
        "targets": o.targets,
        "skipped": o.skipped.iter().map(|(t, why)| json!({"target": t, "reason": why})).collect::<Vec<_>>(),
        "runs": o.runs.iter().map(json_run).collect::<Vec<_>>(),
        "errors": o.errors,
    });
    serde_json::to_string_pretty(&v).unwrap_or_default() + "\n"
}

/// Adds an error to the outcome and says it.
fn failed(o: &mut Outcome, what: String) {
    eprintln!("bench dual: {what}");
    o.errors.push(what);
}

pub fn run_bench(b: &DualBench) -> R<()> {
    for t in &b.targets {
        if !TARGETS.contains(&t.as_str()) {
            return Err(format!("unknown target {t} ({})", TARGETS.join(", ")));
        }
    }
    for e in &b.experiments {
        if !EXPERIMENTS.contains(&e.as_str()) {
            return Err(format!(
                "unknown experiment {e} ({})",
                EXPERIMENTS.join(", ")
            ));
        }
    }
    if b.procs.is_empty() || b.procs.contains(&0) {
        return Err("--procs: one or more process counts, each at least 1".into());
    }
    fs::create_dir_all(&b.dir).map_err(|e| format!("{}: {e}", b.dir.display()))?;
    let mut o = Outcome {
        machine: Machine::probe(&b.dir),
        description: String::new(),
        targets: Vec::new(),
        skipped: Vec::new(),
        runs: Vec::new(),
        errors: Vec::new(),
    };
    for t in &b.targets {
        match check_target(t) {
            Ok(()) => o.targets.push(t.clone()),
            Err(why) => {
                eprintln!("bench dual: skipping target {t}: {why}");
                o.skipped.push((t.clone(), why));
            }
        }
    }
    // PostMark is a program of its own: installed when missing (as `bench
    // fs` does), else the experiment is skipped with the reason (it failed
    // on every target of a fresh machine).
    let mut experiments = b.experiments.clone();
    if experiments.iter().any(|e| e == "postmark") {
        if let Err(why) = super::apps::need(&["postmark"], &["postmark"], "the postmark workload") {
            eprintln!("bench dual: skipping PostMark: {why}");
            o.skipped.push(("postmark (every target)".into(), why));
            experiments.retain(|e| e != "postmark");
        }
    }
    let want = |e: &str| experiments.iter().any(|x| x == e);
    let pattern_fs = if want("micro") && !o.targets.is_empty() {
        Some(super::apps::source_tree(
            &b.dir.join("bench-dual-src"),
            b.tree_mib,
        )?)
    } else {
        None
    };
    let pattern = match &pattern_fs {
        Some(g) => Some(Pattern::scan(g.path.join("tree"))?),
        None => None,
    };
    let tree = Tree::generate(b.writedel_files, super::writedel::SEED);
    o.description = format!(
        "{} MiB per target on loop devices (losetup --direct-io=on, sparse image files on {}); \
         ldfs-dual's metadata device 10% of it; micro-benchmark tree: {}, by {} process(es); PostMark: {} files of {}-{} B in {} directories, {} transactions; \
         write-del: a tree of {} files ({:.1} MiB) copied and 7/8 deleted, {} times, \"+cleaner\" cleaning a segment every {} s; {} run(s), medians",
        b.image_bytes >> 20,
        b.dir.display(),
        pattern.as_ref().map_or("not run".into(), |p| format!(
            "{} files ({:.1} MiB) in {} directories (this repository's crates/ and vendored crates from ~/.cargo/registry/src, on a tmpfs)",
            p.files.len(),
            p.bytes as f64 / (1 << 20) as f64,
            p.dirs.len()
        )),
        b.procs
            .iter()
            .map(|n| n.to_string())
            .collect::<Vec<_>>()
            .join(" and "),
        b.postmark.files,
        b.postmark.min_bytes,
        b.postmark.max_bytes,
        b.postmark.subdirs,
        b.postmark.transactions,
        b.writedel_files,
        tree.bytes() as f64 / (1 << 20) as f64,
        b.writedel_rounds,
        b.clean_every_secs,
        b.repeat.max(1),
    );
    let stop = crate::bench::fs::stop_flag();
    'reps: for rep in 0..b.repeat.max(1) {
        for target in o.targets.clone() {
            for exp in EXPERIMENTS.iter().filter(|e| want(e)) {
                if stop.load(Ordering::Relaxed) {
                    break 'reps;
                }
                eprintln!(
                    "bench dual: run {} of {}: {target}: {exp}",
                    rep + 1,
                    b.repeat.max(1)
                );
                let configs: &[(&str, &str)] = match (*exp, is_ldfs(&target)) {
                    ("writedel", true) => {
                        &[("-cleaner", "cleaner=off"), ("+cleaner", "cleaner=off")]
                    }
                    _ => &[("", "")],
                };
                for (config, options) in configs {
                    let column = format!(
                        "{target}{}",
                        if config.is_empty() {
                            String::new()
                        } else {
                            format!(" {config}")
                        }
                    );
                    let r = run_experiment(
                        b,
                        exp,
                        &target,
                        options,
                        *config == "+cleaner",
                        pattern.as_ref(),
                        &tree,
                        &mut |phase, (wall, devices, extra)| {
                            eprintln!("bench dual:   {column}: {phase}: {wall:.2} s");
                            o.runs.push(Run {
                                experiment: exp,
                                phase: phase.to_string(),
                                column: column.clone(),
                                rep,
                                load: loadavg(),
                                wall_s: wall,
                                devices,
                                extra,
                            });
                        },
                    );
                    if let Err(e) = r {
                        failed(&mut o, format!("{column}: {exp}: {e}"));
                    }
                }
            }
        }
    }
    drop(pattern_fs);
    o.machine.finish();
    let loads: Vec<f64> = o
        .runs
        .iter()
        .filter_map(|r| r.load.split_whitespace().next()?.parse().ok())
        .collect();
    if let (Some(lo), Some(hi)) = (
        loads.iter().cloned().reduce(f64::min),
        loads.iter().cloned().reduce(f64::max),
    ) {
        let _ = write!(
            o.description,
            "; 1-minute load average at the end of each phase from {lo:.2} to {hi:.2} (every phase's is in the JSON)"
        );
    }
    if let Some(path) = &b.json {
        fs::write(path, outcome_json(&o)).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    let md = markdown(b, &o);
    print!("{md}");
    if let Some(out) = &b.out {
        super::report::write_section(out, "dual", &md)?;
    }
    if stop.load(Ordering::Relaxed) {
        return Err("interrupted; everything mounted was unmounted".into());
    }
    Ok(())
}

/// One experiment on a freshly formatted target; each phase measured is
/// handed to `record` as it finishes.
#[allow(clippy::too_many_arguments)]
fn run_experiment(
    b: &DualBench,
    exp: &str,
    target: &str,
    options: &str,
    clean: bool,
    pattern: Option<&Pattern>,
    tree: &Tree,
    record: &mut dyn FnMut(&str, Measured),
) -> R<()> {
    let mut rig = Rig::new(b, target, options)?;
    match exp {
        "micro" => {
            let p = pattern.ok_or("no pattern tree")?;
            for (n, &procs) in b.procs.iter().enumerate() {
                if n > 0 {
                    // Each process count on a freshly made file system.
                    drop(rig);
                    rig = Rig::new(b, target, options)?;
                }
                for i in RUN_ORDER {
                    let which = MICRO[i];
                    let m = phase(&mut rig, &mut |m| micro_work(which, procs, m, p))?;
                    record(&micro_label(which, procs), m);
                }
            }
        }
        "postmark" => {
            let m = phase(&mut rig, &mut |m| {
                let v = super::apps::postmark_at(m.path, &|| m.durable(), &b.postmark)?;
                Ok(vec![("transactions/s".into(), v[1])])
            })?;
            record("PostMark", m);
        }
        "writedel" => {
            let m = phase(&mut rig, &mut |m| writedel_work(m, b, tree, clean))?;
            // Outside the measure: what the rounds kept reads back intact.
            rig.mount()?;
            super::writedel::verify_kept(&rig.mnt.join("writedel"), tree, b.writedel_rounds)?;
            rig.unmount()?;
            record("write-del", m);
        }
        other => unreachable!("experiment {other}"),
    }
    Ok(())
}

// ------------------------------------------------------------------ report

fn median(v: Vec<f64>) -> Option<f64> {
    super::report::median(&v)
}

/// The median over the reps of `f` of the runs of (experiment, phase, column).
fn med(
    o: &Outcome,
    exp: &str,
    phase: &str,
    column: &str,
    f: &dyn Fn(&Run) -> Option<f64>,
) -> Option<f64> {
    median(
        o.runs
            .iter()
            .filter(|r| r.experiment == exp && r.phase == phase && r.column == column)
            .filter_map(f)
            .collect(),
    )
}

fn secs(x: Option<f64>) -> String {
    x.map_or("".into(), |x| format!("{x:.2}"))
}

fn pct(a: Option<f64>, base: Option<f64>) -> String {
    match (a, base) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:+.0}%", (a / b - 1.0) * 100.0),
        _ => "".into(),
    }
}

fn columns(o: &Outcome, exp: &str) -> Vec<String> {
    let mut cols: Vec<String> = Vec::new();
    for r in o.runs.iter().filter(|r| r.experiment == exp) {
        if !cols.contains(&r.column) {
            cols.push(r.column.clone());
        }
    }
    cols
}

/// A table of total I/O time (and wall time) per phase and column, with
/// the dual targets against ext2.
fn io_table(o: &Outcome, exp: &str, phases: &[&str]) -> String {
    let cols = columns(o, exp);
    let duals: Vec<&String> = cols.iter().filter(|c| c.starts_with("ldfs-dual")).collect();
    let mut head = vec!["phase".to_string()];
    head.extend(cols.iter().map(|c| format!("{c} I/O s (wall s)")));
    head.extend(duals.iter().map(|c| format!("{c} vs ext2 (I/O)")));
    let rows: Vec<Vec<String>> = phases
        .iter()
        .map(|ph| {
            let mut row = vec![ph.to_string()];
            for c in &cols {
                let io = med(o, exp, ph, c, &|r| Some(r.io_s()));
                let wall = med(o, exp, ph, c, &|r| Some(r.wall_s));
                row.push(match (io, wall) {
                    (Some(io), Some(w)) => format!("{io:.2} ({w:.1})"),
                    _ => String::new(),
                });
            }
            let ext2 = med(o, exp, ph, "ext2", &|r| Some(r.io_s()));
            for c in &duals {
                row.push(pct(med(o, exp, ph, c, &|r| Some(r.io_s())), ext2));
            }
            row
        })
        .collect();
    md_table(&head, 1, &rows)
}

/// ldfs-dual's I/O time per device.
fn device_table(o: &Outcome, exp: &str, phases: &[&str]) -> String {
    let cols: Vec<String> = columns(o, exp)
        .into_iter()
        .filter(|c| c.starts_with("ldfs-dual"))
        .collect();
    if cols.is_empty() {
        return String::new();
    }
    let mut head = vec!["phase".to_string()];
    for c in &cols {
        head.push(format!("{c} meta I/O s"));
        head.push(format!("{c} data I/O s"));
    }
    let rows: Vec<Vec<String>> = phases
        .iter()
        .map(|ph| {
            let mut row = vec![ph.to_string()];
            for c in &cols {
                row.push(secs(med(o, exp, ph, c, &|r| r.role_io_s("meta"))));
                row.push(secs(med(o, exp, ph, c, &|r| r.role_io_s("data"))));
            }
            row
        })
        .collect();
    md_table(&head, 1, &rows)
}

/// Requests and MiB moved (reads + writes over the summed devices): why
/// the I/O times differ.
fn request_table(o: &Outcome, exp: &str, phases: &[&str]) -> String {
    let cols = columns(o, exp);
    let mut head = vec!["phase".to_string()];
    head.extend(cols.iter().map(|c| format!("{c} requests (MiB)")));
    let sum = |r: &Run, f: &dyn Fn(&Stat) -> u64| -> f64 {
        r.devices
            .iter()
            .filter(|(d, _)| d.summed)
            .map(|(_, s)| f(s) as f64)
            .sum()
    };
    let rows: Vec<Vec<String>> = phases
        .iter()
        .map(|ph| {
            let mut row = vec![ph.to_string()];
            for c in &cols {
                let n = med(o, exp, ph, c, &|r| Some(sum(r, &|s| s.reads + s.writes)));
                let mib = med(o, exp, ph, c, &|r| {
                    Some(sum(r, &|s| s.read_sectors + s.write_sectors) / 2048.0)
                });
                row.push(match (n, mib) {
                    (Some(n), Some(m)) => format!("{n:.0} ({m:.1})"),
                    _ => String::new(),
                });
            }
            row
        })
        .collect();
    md_table(&head, 1, &rows)
}

fn writedel_table(o: &Outcome) -> String {
    let head: Vec<String> = [
        "file system",
        "total I/O s",
        "wall s",
        "segments cleaned",
        "vs ext2 (I/O)",
    ]
    .map(String::from)
    .to_vec();
    let ext2 = med(o, "writedel", "write-del", "ext2", &|r| Some(r.io_s()));
    let rows: Vec<Vec<String>> = columns(o, "writedel")
        .iter()
        .map(|c| {
            let io = med(o, "writedel", "write-del", c, &|r| Some(r.io_s()));
            let cleaned = med(o, "writedel", "write-del", c, &|r| {
                r.extra
                    .iter()
                    .find(|(k, _)| k == "segments cleaned")
                    .map(|(_, v)| *v)
            });
            vec![
                c.clone(),
                secs(io),
                secs(med(o, "writedel", "write-del", c, &|r| Some(r.wall_s))),
                cleaned.map_or("".into(), |x| format!("{x:.0}")),
                pct(io, ext2),
            ]
        })
        .collect();
    md_table(&head, 1, &rows)
}

/// What the figures say about the paper's claims.
fn comparison(b: &DualBench, o: &Outcome) -> String {
    let mut s = String::new();
    let io = |exp: &str, ph: &str, c: &str| med(o, exp, ph, c, &|r| Some(r.io_s()));
    for dual in ["ldfs-dual", "ldfs-dual-1d"] {
        let labels: Vec<String> = b
            .procs
            .iter()
            .flat_map(|&n| {
                ["read-meta", "write-meta", "read-write-meta"].map(|w| micro_label(w, n))
            })
            .collect();
        let cuts: Vec<(&str, f64)> = labels
            .iter()
            .filter_map(|ph| {
                Some((
                    ph.as_str(),
                    1.0 - io("micro", ph, dual)? / io("micro", ph, "ext2")?,
                ))
            })
            .collect();
        if let Some((ph, best)) = cuts.iter().cloned().max_by(|a, b| a.1.total_cmp(&b.1)) {
            let all: Vec<String> = cuts
                .iter()
                .map(|(p, c)| format!("{p} {:+.0}%", -c * 100.0))
                .collect();
            let _ = writeln!(
                s,
                "- Meta-data micro-benchmarks, {dual} against ext2 (I/O time): {}. The paper: DualFS cut the total I/O time by up to 97% (its meta-data tests); here the largest cut is {:.0}% ({ph}).",
                all.join(", "),
                best * 100.0
            );
        }
        if let (Some(d), Some(e)) = (
            io("postmark", "PostMark", dual),
            io("postmark", "PostMark", "ext2"),
        ) {
            let _ = writeln!(
                s,
                "- PostMark, {dual} against ext2: {:+.0}% I/O time (the paper: DualFS clearly beats Ext2).",
                (d / e - 1.0) * 100.0
            );
        }
        let minus = io("writedel", "write-del", &format!("{dual} -cleaner"));
        let plus = io("writedel", "write-del", &format!("{dual} +cleaner"));
        if let (Some(m), Some(p)) = (minus, plus) {
            let _ = writeln!(
                s,
                "- write-del, {dual}: cleaning a segment every few seconds costs {:+.1}% I/O time against no cleaning (the paper: 44.41 s against 42.16 s, +5.3%, \"less than 6%\"); {dual} without cleaning against ext2: {}.",
                (p / m - 1.0) * 100.0,
                pct(Some(m), io("writedel", "write-del", "ext2"))
            );
        }
    }
    s
}

fn markdown(b: &DualBench, o: &Outcome) -> String {
    let m = &o.machine;
    let mut md = String::from(
        "## DualFS experiments: total I/O time on loop devices (`ldfs bench dual`)\n\n",
    );
    md += "The DualFS paper's section 4 on this machine (issue 14): its measure is the total I/O time, \
           the time each device is busy (`io_ticks`, field 10 of /sys/block/DEV/stat), summed over the \
           devices of a file system, from a cold start (caches dropped, fresh mount) until the phase's \
           writes are durable and the file system unmounted. `ldfs-dual`: metadata and data on two loop \
           devices; `ldfs-dual-1d`: one loop device with two partitions (metadata on the first), its I/O \
           time the whole device's; `ldfs` (one log), `ext4` (data=ordered, the paper's Ext3) and `ext2` \
           on one loop device each. With more than one process, the directories are made by one and the files split among the processes, as the paper divides the job. Wall times are noisy on a \
           shared machine: I/O times are the comparison.\n\n";
    md += &crate::bench::report::machine_table(m);
    let _ = writeln!(md, "{}.\n", o.description);
    if let Some(n) = &b.note {
        let _ = writeln!(md, "{n}\n");
    }
    for (t, why) in &o.skipped {
        let _ = writeln!(md, "- target {t} skipped: {why}");
    }
    for e in &o.errors {
        let _ = writeln!(md, "- error: {e}");
    }
    if !o.skipped.is_empty() || !o.errors.is_empty() {
        md += "\n";
    }
    if o.runs.iter().any(|r| r.experiment == "micro") {
        let rows: Vec<String> = b
            .procs
            .iter()
            .flat_map(|&n| MICRO.iter().map(move |w| micro_label(w, n)))
            .collect();
        let rows: Vec<&str> = rows.iter().map(String::as_str).collect();
        md += "### Micro-benchmarks (DualFS 4.1, Figure 3)\n\n";
        md += &io_table(o, "micro", &rows);
        md += "\nldfs-dual's I/O time per device (the 1d set-up's partitions share one disk):\n\n";
        md += &device_table(o, "micro", &rows);
        md += "\nRequests (reads and writes) and MiB moved:\n\n";
        md += &request_table(o, "micro", &rows);
        md += "\n";
    }
    if o.runs.iter().any(|r| r.experiment == "postmark") {
        md += "### PostMark (DualFS 4.2, Figure 4)\n\n";
        md += &io_table(o, "postmark", &["PostMark"]);
        md += "\n";
        md += &device_table(o, "postmark", &["PostMark"]);
        md += "\n";
        md += &request_table(o, "postmark", &["PostMark"]);
        md += "\n";
    }
    if o.runs.iter().any(|r| r.experiment == "writedel") {
        md += "### write-del (DualFS 4.4, Table 3)\n\n";
        md += "\"-cleaner\": the background cleaner off; \"+cleaner\": also one segment cleaned through the daemon every few seconds (the paper: every five), whatever its use.\n\n";
        md += &writedel_table(o);
        md += "\n";
        md += &request_table(o, "writedel", &["write-del"]);
        md += "\n";
    }
    let c = comparison(b, o);
    if !c.is_empty() {
        md += "### Against the paper\n\n";
        md += &c;
        let _ = writeln!(
            md,
            "\nWhat differs from the paper's set-up: its machine had 256 MB of memory and IDE disks, this one has {} and loop devices on the host's disk ({}), so the kernel file systems keep much more in their page cache and write less of what is deleted soon after (write-del, PostMark), while ldfs, under FUSE without the writeback cache, receives every write; ext4 with data=ordered stands for Ext3.",
            m.memory, m.storage
        );
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields() {
        let s = Stat::parse(
            "   33091      118   698235    53231  1050224    31869 11004809   484622        0   114272   635017        7        0   851968       24   255440    97139",
        )
        .unwrap();
        assert_eq!(
            s,
            Stat {
                reads: 33091,
                read_sectors: 698235,
                writes: 1050224,
                write_sectors: 11004809,
                io_ms: 114272,
            }
        );
        assert!(Stat::parse("1 2 3").is_err());
        let later = Stat { io_ms: 114300, ..s };
        assert_eq!(later.since(s).io_ms, 28);
    }

    #[test]
    fn mbr_has_two_partitions() {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("disk.img");
        make_image(&img, 100 << 20).unwrap();
        write_mbr(&img, 10 << 20, 100 << 20).unwrap();
        let b = fs::read(&img).unwrap();
        assert_eq!(&b[510..512], &[0x55, 0xaa]);
        let u = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
        assert_eq!((u(446 + 8), u(446 + 12)), (2048, 20480));
        assert_eq!(
            (u(462 + 8), u(462 + 12)),
            (2048 + 20480, 204800 - 2048 - 20480)
        );
        assert_eq!((b[446 + 4], b[462 + 4]), (0x83, 0x83));
    }

    #[test]
    fn needle_search() {
        assert!(contains(b"let x = unsafe { y };", NEEDLE));
        assert!(!contains(b"unsaf", NEEDLE));
        // Run order: the write phases first, every phase once.
        let mut seen = RUN_ORDER.to_vec();
        seen.sort();
        assert_eq!(seen, vec![0, 1, 2, 3, 4, 5]);
        assert_eq!(MICRO[RUN_ORDER[1]], "write-data-meta");
    }
}
