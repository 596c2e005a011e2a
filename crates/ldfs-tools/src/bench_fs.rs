//! `ldfs bench fs`: the LFS papers' micro-benchmarks on a mounted ldfs, side
//! by side in one run with ext4 on a loop device and fuse2fs (a FUSE peer)
//! on an ext4 image of the same size. Write phases are timed until the data
//! is durable; reads are cold (caches dropped before each read phase).

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

pub struct FsBench {
    pub dir: PathBuf,
    pub image_bytes: u64,
    pub small_files: usize,
    pub large_mib: u64,
    pub dir_names: usize,
    pub targets: Vec<String>,
    /// Seconds of each syncwrite run.
    pub sync_secs: f64,
    /// Rounds; targets are interleaved round by round and medians reported.
    pub rounds: usize,
    /// Where to write every sample as JSON, if anywhere.
    pub json: Option<PathBuf>,
}

type R<T> = Result<T, String>;

fn run(cmd: &mut Command) -> R<()> {
    let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(())
}

fn drop_caches() {
    unsafe { libc::sync() };
    let _ = fs::write("/proc/sys/vm/drop_caches", "3");
}

/// A mounted target; unmounted on drop.
struct Target {
    name: &'static str,
    mnt: PathBuf,
    umount: Vec<String>,
    loopdev: Option<String>,
    /// A daemon this benchmark started in the foreground (memfs).
    child: Option<std::process::Child>,
}

impl Target {
    /// Makes everything written so far durable. The kernel does not pass
    /// syncfs to FUSE daemons, so FUSE targets get an fsync of their root
    /// (ldfs flushes its whole log for it; fuse2fs flushes its image).
    fn durable(&self) -> R<()> {
        let d = File::open(&self.mnt).map_err(|e| e.to_string())?;
        if self.name == "ext4" {
            if unsafe { libc::syncfs(std::os::fd::AsRawFd::as_raw_fd(&d)) } != 0 {
                return Err(std::io::Error::last_os_error().to_string());
            }
            Ok(())
        } else {
            d.sync_all().map_err(|e| e.to_string())
        }
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = Command::new(&self.umount[0])
            .args(&self.umount[1..])
            .status();
        // FUSE daemons finish in the background; wait until unmounted.
        for _ in 0..100 {
            let mounts = fs::read_to_string("/proc/mounts").unwrap_or_default();
            if !mounts.contains(self.mnt.to_str().unwrap_or("")) {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        if let Some(c) = &mut self.child {
            let _ = c.wait();
        }
        if let Some(l) = &self.loopdev {
            let _ = Command::new("losetup").arg("-d").arg(l).status();
        }
    }
}

fn make_image(path: &Path, bytes: u64) -> R<()> {
    let f = File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
    f.set_len(bytes).map_err(|e| e.to_string())
}

fn wait_mounted(mnt: &Path) -> R<()> {
    let canon = mnt.canonicalize().map_err(|e| e.to_string())?;
    for _ in 0..200 {
        let mounts = fs::read_to_string("/proc/mounts").unwrap_or_default();
        if mounts
            .lines()
            .any(|l| l.split(' ').nth(1) == canon.to_str())
        {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(format!("{} did not mount", mnt.display()))
}

fn setup(name: &str, b: &FsBench) -> R<Target> {
    let base = b.dir.join(format!("bench-{name}"));
    let img = b.dir.join(format!("bench-{name}.img"));
    let mnt = base.join("mnt");
    fs::create_dir_all(&mnt).map_err(|e| e.to_string())?;
    make_image(&img, b.image_bytes)?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    match name {
        "ldfs" => {
            // Preallocated, as a block device would be: the host file system
            // then does not allocate (and journal) under every fsync.
            run(Command::new(&exe)
                .arg("mkfs")
                .arg("--preallocate")
                .args(["--size", &b.image_bytes.to_string()])
                .arg(&img))?;
            run(Command::new(&exe).arg("mount").arg(&img).arg(&mnt))?;
            wait_mounted(&mnt)?;
            Ok(Target {
                name: "ldfs",
                mnt: mnt.clone(),
                umount: vec!["fusermount3".into(), "-u".into(), mnt.display().to_string()],
                loopdev: None,
                child: None,
            })
        }
        "ext4" => {
            run(Command::new("mkfs.ext4")
                .args(["-q", "-F", "-i", "4096"])
                .arg(&img))?;
            let out = Command::new("losetup")
                .args(["--find", "--show"])
                .arg(&img)
                .output()
                .map_err(|e| e.to_string())?;
            let dev = String::from_utf8_lossy(&out.stdout).trim().to_string();
            if dev.is_empty() {
                return Err("losetup found no free loop device".into());
            }
            run(Command::new("mount").arg(&dev).arg(&mnt))?;
            Ok(Target {
                name: "ext4",
                mnt: mnt.clone(),
                umount: vec!["umount".into(), mnt.display().to_string()],
                loopdev: Some(dev),
                child: None,
            })
        }
        "fuse2fs" => {
            run(Command::new("mkfs.ext4")
                .args(["-q", "-F", "-i", "4096"])
                .arg(&img))?;
            run(Command::new("fuse2fs")
                .arg(&img)
                .arg(&mnt)
                .args(["-o", "rw,fakeroot"]))?;
            wait_mounted(&mnt)?;
            Ok(Target {
                name: "fuse2fs",
                mnt: mnt.clone(),
                umount: vec!["fusermount3".into(), "-u".into(), mnt.display().to_string()],
                loopdev: None,
                child: None,
            })
        }
        "memfs" => {
            let child = Command::new(&exe)
                .arg("bench-memfs")
                .arg(&mnt)
                .spawn()
                .map_err(|e| e.to_string())?;
            let t = Target {
                name: "memfs",
                mnt: mnt.clone(),
                umount: vec!["fusermount3".into(), "-u".into(), mnt.display().to_string()],
                loopdev: None,
                child: Some(child),
            };
            wait_mounted(&mnt)?;
            Ok(t)
        }
        other => Err(format!(
            "unknown target {other} (ldfs, ext4, fuse2fs, memfs)"
        )),
    }
}

struct Row {
    what: String,
    unit: &'static str,
    /// Per target, the samples of every round that succeeded.
    samples: Vec<Vec<f64>>,
    /// Per target, its median.
    values: Vec<Option<f64>>,
}

fn median(v: &[f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    Some(v[v.len() / 2])
}

fn rate(n: f64, d: Duration) -> f64 {
    n / d.as_secs_f64()
}

fn small_files(t: &Target, n: usize) -> R<Vec<f64>> {
    let root = t.mnt.join("small");
    fs::create_dir(&root).map_err(|e| e.to_string())?;
    let per_dir = 1000;
    let data = vec![0x61u8; 1024];
    let path = |i: usize| root.join(format!("d{}", i / per_dir)).join(format!("f{i}"));
    let t0 = Instant::now();
    for i in 0..n {
        if i % per_dir == 0 {
            fs::create_dir(root.join(format!("d{}", i / per_dir))).map_err(|e| e.to_string())?;
        }
        fs::write(path(i), &data).map_err(|e| e.to_string())?;
    }
    t.durable()?;
    let create = rate(n as f64, t0.elapsed());
    drop_caches();
    let t0 = Instant::now();
    let mut buf = Vec::with_capacity(1024);
    for i in 0..n {
        buf.clear();
        File::open(path(i))
            .and_then(|mut f| f.read_to_end(&mut buf))
            .map_err(|e| e.to_string())?;
        if buf.len() != 1024 {
            return Err(format!("small file {i}: {} bytes", buf.len()));
        }
    }
    let read = rate(n as f64, t0.elapsed());
    let t0 = Instant::now();
    for i in 0..n {
        fs::remove_file(path(i)).map_err(|e| e.to_string())?;
    }
    t.durable()?;
    let delete = rate(n as f64, t0.elapsed());
    Ok(vec![create, read, delete])
}

fn large_file(t: &Target, mib: u64) -> R<Vec<f64>> {
    let p = t.mnt.join("large");
    let bytes = mib << 20;
    let mb = bytes as f64 / 1e6;
    let mut chunk = vec![0u8; 1 << 20];
    ChaCha8Rng::seed_from_u64(1).fill(&mut chunk[..]);
    let t0 = Instant::now();
    {
        let mut f = File::create(&p).map_err(|e| e.to_string())?;
        for _ in 0..mib {
            f.write_all(&chunk).map_err(|e| e.to_string())?;
        }
        f.sync_all().map_err(|e| e.to_string())?;
    }
    let seq_write = mb / t0.elapsed().as_secs_f64();
    let seq_read = |label: &str| -> R<f64> {
        drop_caches();
        let t0 = Instant::now();
        let mut f = File::open(&p).map_err(|e| e.to_string())?;
        let mut buf = vec![0u8; 1 << 20];
        let mut total = 0u64;
        loop {
            let n = f.read(&mut buf).map_err(|e| format!("{label}: {e}"))?;
            if n == 0 {
                break;
            }
            total += n as u64;
        }
        if total != bytes {
            return Err(format!("{label}: read {total} of {bytes} bytes"));
        }
        Ok(mb / t0.elapsed().as_secs_f64())
    };
    let seq_read1 = seq_read("sequential read")?;
    let blocks = bytes / 4096;
    let ops = blocks.min(25_600);
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    let block = vec![0x77u8; 4096];
    let t0 = Instant::now();
    {
        let f = OpenOptions::new()
            .write(true)
            .open(&p)
            .map_err(|e| e.to_string())?;
        for _ in 0..ops {
            let b = rng.gen_range(0..blocks);
            f.write_all_at(&block, b * 4096)
                .map_err(|e| e.to_string())?;
        }
        f.sync_all().map_err(|e| e.to_string())?;
    }
    let rand_write = (ops * 4096) as f64 / 1e6 / t0.elapsed().as_secs_f64();
    drop_caches();
    let t0 = Instant::now();
    {
        let mut f = File::open(&p).map_err(|e| e.to_string())?;
        let mut buf = vec![0u8; 4096];
        for _ in 0..ops {
            let b = rng.gen_range(0..blocks);
            f.seek(SeekFrom::Start(b * 4096))
                .map_err(|e| e.to_string())?;
            f.read_exact(&mut buf).map_err(|e| e.to_string())?;
        }
    }
    let rand_read = (ops * 4096) as f64 / 1e6 / t0.elapsed().as_secs_f64();
    let seq_read2 = seq_read("sequential re-read")?;
    fs::remove_file(&p).map_err(|e| e.to_string())?;
    t.durable()?;
    Ok(vec![seq_write, seq_read1, rand_write, rand_read, seq_read2])
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

/// Random 4 KiB overwrites of a 64 MB file, each followed by fdatasync, from
/// `threads` threads for `secs` seconds (virtual log section 5.3): ops/s, and
/// p50 and p99 latency in microseconds.
fn sync_write(t: &Target, threads: usize, secs: f64) -> R<Vec<f64>> {
    let p = t.mnt.join(format!("syncwrite-{threads}"));
    let size = 64u64 << 20;
    {
        let mut f = File::create(&p).map_err(|e| e.to_string())?;
        let chunk = vec![1u8; 1 << 20];
        for _ in 0..size >> 20 {
            f.write_all(&chunk).map_err(|e| e.to_string())?;
        }
        f.sync_all().map_err(|e| e.to_string())?;
    }
    let until = Instant::now() + Duration::from_secs_f64(secs);
    let handles: Vec<_> = (0..threads)
        .map(|k| {
            let p = p.clone();
            std::thread::spawn(move || -> R<Vec<f64>> {
                let f = OpenOptions::new()
                    .write(true)
                    .open(&p)
                    .map_err(|e| e.to_string())?;
                let mut rng = ChaCha8Rng::seed_from_u64(k as u64);
                let block = vec![k as u8; 4096];
                let mut lat = Vec::new();
                while Instant::now() < until {
                    let t0 = Instant::now();
                    f.write_all_at(&block, rng.gen_range(0..size / 4096) * 4096)
                        .map_err(|e| e.to_string())?;
                    f.sync_data().map_err(|e| e.to_string())?;
                    lat.push(t0.elapsed().as_secs_f64() * 1e6);
                }
                Ok(lat)
            })
        })
        .collect();
    let mut lat = Vec::new();
    for h in handles {
        lat.extend(h.join().map_err(|_| "syncwrite thread panicked")??);
    }
    fs::remove_file(&p).map_err(|e| e.to_string())?;
    if lat.is_empty() {
        return Err("no syncwrite completed".into());
    }
    let ops = lat.len() as f64 / secs;
    let p50 = percentile(&mut lat, 0.5);
    let p99 = percentile(&mut lat, 0.99);
    Ok(vec![ops, p50, p99])
}

/// Create a 4 KB file, fsync it and its directory, `n` times per thread.
fn sync_create(t: &Target, threads: usize, n: usize) -> R<Vec<f64>> {
    let d = t.mnt.join(format!("synccreate-{threads}"));
    fs::create_dir(&d).map_err(|e| e.to_string())?;
    let t0 = Instant::now();
    let handles: Vec<_> = (0..threads)
        .map(|k| {
            let d = d.clone();
            std::thread::spawn(move || -> R<()> {
                let data = vec![k as u8; 4096];
                for i in 0..n {
                    let mut f =
                        File::create(d.join(format!("t{k}-{i}"))).map_err(|e| e.to_string())?;
                    f.write_all(&data).map_err(|e| e.to_string())?;
                    f.sync_all().map_err(|e| e.to_string())?;
                    File::open(&d)
                        .and_then(|dir| dir.sync_all())
                        .map_err(|e| e.to_string())?;
                }
                Ok(())
            })
        })
        .collect();
    for h in handles {
        h.join().map_err(|_| "synccreate thread panicked")??;
    }
    Ok(vec![rate((threads * n) as f64, t0.elapsed())])
}

/// 100 directories of 100 empty files: create, stat (cold), rename, delete.
fn metadata(t: &Target) -> R<Vec<f64>> {
    let root = t.mnt.join("meta");
    fs::create_dir(&root).map_err(|e| e.to_string())?;
    let name = |d: usize, f: usize| root.join(format!("d{d}")).join(format!("f{f}"));
    let n = 100 * 100;
    let t0 = Instant::now();
    for d in 0..100 {
        fs::create_dir(root.join(format!("d{d}"))).map_err(|e| e.to_string())?;
        for f in 0..100 {
            File::create(name(d, f)).map_err(|e| e.to_string())?;
        }
    }
    t.durable()?;
    let create = rate(n as f64, t0.elapsed());
    drop_caches();
    let t0 = Instant::now();
    for d in 0..100 {
        for f in 0..100 {
            fs::metadata(name(d, f)).map_err(|e| e.to_string())?;
        }
    }
    let stat = rate(n as f64, t0.elapsed());
    let t0 = Instant::now();
    for d in 0..100 {
        for f in 0..100 {
            fs::rename(name(d, f), root.join(format!("d{d}")).join(format!("r{f}")))
                .map_err(|e| e.to_string())?;
        }
    }
    t.durable()?;
    let rename = rate(n as f64, t0.elapsed());
    let t0 = Instant::now();
    for d in 0..100 {
        for f in 0..100 {
            fs::remove_file(root.join(format!("d{d}")).join(format!("r{f}")))
                .map_err(|e| e.to_string())?;
        }
        fs::remove_dir(root.join(format!("d{d}"))).map_err(|e| e.to_string())?;
    }
    t.durable()?;
    let delete = rate(n as f64, t0.elapsed());
    Ok(vec![create, stat, rename, delete])
}

/// Creates and looks up names in one directory; rates at 1,000 names and at
/// `n` names.
fn big_dir(t: &Target, n: usize) -> R<Vec<f64>> {
    let d = t.mnt.join("bigdir");
    fs::create_dir(&d).map_err(|e| e.to_string())?;
    let name = |i: usize| d.join(format!("name-{i:08}"));
    let lookups = |count: usize, upto: usize| -> R<f64> {
        let mut rng = ChaCha8Rng::seed_from_u64(upto as u64);
        let t0 = Instant::now();
        for _ in 0..count {
            fs::symlink_metadata(name(rng.gen_range(0..upto))).map_err(|e| e.to_string())?;
        }
        Ok(rate(count as f64, t0.elapsed()))
    };
    let first = 1000.min(n);
    let t0 = Instant::now();
    for i in 0..first {
        File::create(name(i)).map_err(|e| e.to_string())?;
    }
    let create_small = rate(first as f64, t0.elapsed());
    t.durable()?;
    drop_caches();
    let lookup_small = lookups(1000, first)?;
    let t0 = Instant::now();
    for i in first..n {
        File::create(name(i)).map_err(|e| e.to_string())?;
    }
    let tail = 10_000.min(n / 10).max(1);
    // The rate at the full size: the last creates (a tenth, at most 10,000).
    let t1 = Instant::now();
    for i in n..n + tail {
        File::create(name(i)).map_err(|e| e.to_string())?;
    }
    let create_big = rate(tail as f64, t1.elapsed());
    let _ = t0;
    t.durable()?;
    drop_caches();
    let lookup_big = lookups(1000, n)?;
    Ok(vec![create_small, lookup_small, create_big, lookup_big])
}

pub fn run_all(b: &FsBench) -> R<()> {
    fs::create_dir_all(&b.dir).map_err(|e| e.to_string())?;
    let mut rows = vec![
        ("small files: create (1 KB)", "files/s"),
        ("small files: read (cold)", "files/s"),
        ("small files: delete", "files/s"),
        ("large file: sequential write", "MB/s"),
        ("large file: sequential read (cold)", "MB/s"),
        ("large file: random 4 KiB write", "MB/s"),
        ("large file: random 4 KiB read (cold)", "MB/s"),
        ("large file: sequential re-read (cold)", "MB/s"),
        ("directory: create at 1,000 names", "ops/s"),
        ("directory: lookup at 1,000 names (cold)", "ops/s"),
        ("directory: create at N names", "ops/s"),
        ("directory: lookup at N names (cold)", "ops/s"),
        ("syncwrite 1 thread (4 KiB + fdatasync)", "ops/s"),
        ("syncwrite 1 thread p50", "us"),
        ("syncwrite 1 thread p99", "us"),
        ("syncwrite 8 threads", "ops/s"),
        ("syncwrite 8 threads p50", "us"),
        ("syncwrite 8 threads p99", "us"),
        (
            "synccreate 1 thread (create 4 KB + fsync file and dir)",
            "files/s",
        ),
        ("synccreate 8 threads", "files/s"),
        ("metadata: create (100 dirs x 100 files)", "ops/s"),
        ("metadata: stat (cold)", "ops/s"),
        ("metadata: rename", "ops/s"),
        ("metadata: delete", "ops/s"),
    ]
    .into_iter()
    .map(|(w, u)| Row {
        what: w.replace('N', &format!("{}", b.dir_names)),
        unit: u,
        samples: vec![Vec::new(); b.targets.len()],
        values: Vec::new(),
    })
    .collect::<Vec<_>>();
    for round in 0..b.rounds.max(1) {
        for (ti, name) in b.targets.iter().enumerate() {
            eprintln!(
                "bench fs: round {} of {}: {name}...",
                round + 1,
                b.rounds.max(1)
            );
            let t = setup(name, b)?;
            let mut vals: Vec<Option<f64>> = Vec::new();
            for (r, count) in [
                (small_files(&t, b.small_files), 3),
                (large_file(&t, b.large_mib), 5),
                (big_dir(&t, b.dir_names), 4),
                (sync_write(&t, 1, b.sync_secs), 3),
                (sync_write(&t, 8, b.sync_secs), 3),
                (sync_create(&t, 1, 2000), 1),
                (sync_create(&t, 8, 250), 1),
                (metadata(&t), 4),
            ] {
                match r {
                    Ok(v) => vals.extend(v.into_iter().map(Some)),
                    Err(e) => {
                        eprintln!("bench fs: {name}: {e}");
                        vals.extend(std::iter::repeat_n(None, count));
                    }
                }
            }
            for (row, v) in rows.iter_mut().zip(vals) {
                if let Some(v) = v {
                    row.samples[ti].push(v);
                }
            }
            drop(t);
            let _ = fs::remove_file(b.dir.join(format!("bench-{name}.img")));
        }
    }
    for row in &mut rows {
        row.values = row.samples.iter().map(|s| median(s)).collect();
    }
    if let Some(path) = &b.json {
        let mut j = String::from("{\n  \"targets\": [");
        j += &b
            .targets
            .iter()
            .map(|t| format!("\"{t}\""))
            .collect::<Vec<_>>()
            .join(", ");
        j += "],\n  \"rows\": [\n";
        let body: Vec<String> = rows
            .iter()
            .map(|r| {
                let samples: Vec<String> = r
                    .samples
                    .iter()
                    .map(|s| {
                        format!(
                            "[{}]",
                            s.iter()
                                .map(|x| format!("{x:.3}"))
                                .collect::<Vec<_>>()
                                .join(", ")
                        )
                    })
                    .collect();
                format!(
                    "    {{\"workload\": \"{}\", \"unit\": \"{}\", \"samples\": [{}]}}",
                    r.what,
                    r.unit,
                    samples.join(", ")
                )
            })
            .collect();
        j += &body.join(",\n");
        j += "\n  ]\n}\n";
        fs::write(path, j).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    println!(
        "# ldfs bench fs: {} small files, a {} MiB file, {} names in one directory; images of {} MiB; median of {} round(s)",
        b.small_files,
        b.large_mib,
        b.dir_names,
        b.image_bytes >> 20,
        b.rounds.max(1)
    );
    print!("| workload | unit |");
    for t in &b.targets {
        print!(" {t} |");
    }
    println!(" ldfs / ext4 | ldfs / memfs |");
    print!("|---|---|");
    for _ in &b.targets {
        print!("---|");
    }
    println!("---|---|");
    for r in rows {
        print!("| {} | {} |", r.what, r.unit);
        for v in &r.values {
            match v {
                Some(x) => print!(" {x:.0} |"),
                None => print!(" failed |"),
            }
        }
        let at = |name: &str| {
            b.targets
                .iter()
                .position(|t| t == name)
                .and_then(|k| r.values[k])
        };
        let ratio = |other: &str| match (at("ldfs"), at(other)) {
            (Some(a), Some(e)) if e > 0.0 => format!(" {:.2} |", a / e),
            _ => " |".into(),
        };
        println!("{}{}", ratio("ext4"), ratio("memfs"));
    }
    Ok(())
}
