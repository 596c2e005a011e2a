//! `ldfs bench fsck`: the fsck figure (issue 4). Builds an image holding
//! `--files` files and `--data` bytes of file data through the library (no
//! FUSE), in directories of `--per-dir` files, each file's data written
//! whole; then, on this machine's storage and in one run: the raw
//! sequential read bandwidth of the image file (1 MiB O_DIRECT reads of the
//! part the log uses), fsck's metadata check (everything but data-block
//! checksums: `ldfs fsck -n --no-data`) and its full check, each from a cold
//! page cache (as root; otherwise the figures say the cache was warm). The
//! full check's rate is the log bytes it read over its time, against the
//! raw rate.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ldfs::device::{Device, FileDevice, FileDeviceOptions};
use ldfs::fs::{Ctx, Fs, FsOptions, ROOT_INO};
use ldfs::fsck::{self, FsckOptions};
use ldfs::ld::LogicalDisk;
use ldfs::lld::layout::MkfsOptions;
use ldfs::lld::usage::SegmentState;
use ldfs::lld::{Lld, LldOptions};
use rand::{Rng, SeedableRng};

pub struct FsckBench {
    pub dir: PathBuf,
    pub files: u64,
    pub data_bytes: u64,
    pub per_dir: u64,
    /// Use the image left by an earlier run with the same counts.
    pub reuse: bool,
    /// Keep the image afterwards.
    pub keep: bool,
}

type R<T> = Result<T, String>;

fn e(x: impl std::fmt::Display) -> String {
    x.to_string()
}

fn mib_s(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / (1 << 20) as f64 / d.as_secs_f64()
}

/// Drops the page cache (root only); returns whether it could.
fn drop_caches() -> bool {
    unsafe { libc::sync() };
    std::fs::write("/proc/sys/vm/drop_caches", "3").is_ok()
}

pub fn run(b: &FsckBench) -> R<()> {
    if b.files == 0 || b.per_dir == 0 {
        return Err("--files and --per-dir must be at least 1".into());
    }
    std::fs::create_dir_all(&b.dir).map_err(|x| format!("{}: {x}", b.dir.display()))?;
    let path = b
        .dir
        .join(format!("bench-fsck-{}-{}.img", b.files, b.data_bytes >> 20));
    println!(
        "# ldfs bench fsck: {} files, {} MiB of data, {} files per directory ({})",
        b.files,
        b.data_bytes >> 20,
        b.per_dir,
        path.display()
    );
    if !(b.reuse && path.exists()) {
        build(b, &path)?;
    } else {
        println!("reusing the image");
    }
    let (log_bytes, seg_bytes) = {
        let dev: Arc<dyn Device> = Arc::new(FileDevice::open_read_only(&path).map_err(e)?);
        let lld = Lld::open(
            dev,
            LldOptions {
                read_only: true,
                ..Default::default()
            },
        )
        .map_err(e)?;
        let seg = lld.geometry().segment_bytes();
        let used = lld
            .segment_usage()
            .iter()
            .filter(|(_, u)| u.state != SegmentState::Clean)
            .count() as u64;
        (used * seg, seg)
    };
    let image_bytes = std::fs::metadata(&path).map_err(e)?.len();
    let cold = drop_caches();
    let raw = raw_read(&path, log_bytes.min(image_bytes))?;
    println!(
        "raw sequential read: {:.0} MiB/s  [{} MiB, 1 MiB O_DIRECT reads]",
        raw,
        log_bytes >> 20
    );
    let run = |data: bool| -> R<(Duration, fsck::Outcome)> {
        drop_caches();
        let dev: Arc<dyn Device> = Arc::new(FileDevice::open_read_only(&path).map_err(e)?);
        let t = Instant::now();
        // When each phase was first and last reported: the breakdown
        // printed (the log and tree checks run side by side).
        let phases: Arc<std::sync::Mutex<Vec<(String, Instant, Instant)>>> = Default::default();
        let p2 = phases.clone();
        let out = fsck::run(
            dev,
            &FsckOptions {
                bulk: FileDevice::open_read_only_with(&path, FileDeviceOptions { direct: true })
                    .ok()
                    .map(|d| Arc::new(d) as Arc<dyn Device>),
                data_checksums: data,
                progress: Some(Arc::new(move |phase: &str, _, _| {
                    let mut v = p2.lock().unwrap_or_else(|x| x.into_inner());
                    let now = Instant::now();
                    match v.iter_mut().find(|(p, _, _)| p == phase) {
                        Some(x) => x.2 = now,
                        None => v.push((phase.to_string(), now, now)),
                    }
                })),
                ..Default::default()
            },
        )
        .map_err(e)?;
        let took = t.elapsed();
        let v = phases.lock().unwrap_or_else(|x| x.into_inner());
        let mut line = format!(
            "  {} check, phases (seconds from the start):",
            if data { "full" } else { "metadata" }
        );
        for (name, first, last) in v.iter() {
            line += &format!(
                " {name} {:.1}-{:.1};",
                first.duration_since(t).as_secs_f64(),
                last.duration_since(t).as_secs_f64()
            );
        }
        line += &format!(" end {:.1}", took.as_secs_f64());
        println!("{line}");
        Ok((took, out))
    };
    let (meta_t, meta) = run(false)?;
    let (full_t, full) = run(true)?;
    for (what, o) in [("metadata", &meta), ("full", &full)] {
        if o.exit_code() != 0 {
            return Err(format!(
                "the {what} check found problems: {:?}",
                o.found.lines().iter().take(5).collect::<Vec<_>>()
            ));
        }
    }
    let f = &full.found;
    println!(
        "checked: {} map entries, {} partial segments, {} blocks' checksums, {} inodes ({} directories, {} files); {} MiB log in {} MiB segments",
        f.map_entries,
        f.partials,
        f.blocks_checked,
        f.inodes,
        f.directories,
        f.files,
        log_bytes >> 20,
        seg_bytes >> 20
    );
    let cache = if cold {
        "page cache dropped before each"
    } else {
        "NOT root: page cache warm, figures optimistic"
    };
    println!(
        "fsck metadata check (ldfs fsck -n --no-data): {:.1} s (target < 20 s)  [{cache}]",
        meta_t.as_secs_f64()
    );
    let rate = mib_s(log_bytes, full_t);
    println!(
        "fsck full check (ldfs fsck -n): {:.1} s, {:.0} MiB/s = {:.0}% of raw sequential read (target >= 70%)  [{cache}]",
        full_t.as_secs_f64(),
        rate,
        100.0 * rate / raw
    );
    if !b.keep {
        let _ = std::fs::remove_file(&path);
    }
    Ok(())
}

/// Sequential 1 MiB O_DIRECT reads of the first `bytes` of the file.
fn raw_read(path: &std::path::Path, bytes: u64) -> R<f64> {
    let dev = FileDevice::open(path, FileDeviceOptions { direct: true }).map_err(e)?;
    let mut buf = vec![0u8; 1 << 20];
    let bytes = bytes / buf.len() as u64 * buf.len() as u64;
    let t = Instant::now();
    let mut off = 0;
    while off < bytes {
        dev.read_at(&mut buf, off).map_err(e)?;
        off += buf.len() as u64;
    }
    Ok(mib_s(bytes, t.elapsed()))
}

fn build(b: &FsckBench, path: &std::path::Path) -> R<()> {
    let per_file = b.data_bytes / b.files;
    // Data and its summary records, inode records and buckets, the map, and
    // a quarter more for the segments' slack and the reserve.
    let size = (b.data_bytes + b.files * 1024) / 4 * 5 + (512 << 20);
    let t = Instant::now();
    let dev: Arc<dyn Device> =
        Arc::new(FileDevice::create(path, size, FileDeviceOptions { direct: false }).map_err(e)?);
    let lld =
        Arc::new(Lld::create(dev, &MkfsOptions::default(), LldOptions::default()).map_err(e)?);
    let ctx = Ctx {
        uid: 0,
        gid: 0,
        umask: 0,
    };
    Fs::format(&*lld, ctx).map_err(e)?;
    let ld: Arc<dyn LogicalDisk> = lld.clone();
    let fs = Fs::mount(ld, FsOptions::default()).map_err(e)?;
    let mut pattern = vec![0u8; per_file.max(8) as usize];
    rand_chacha::ChaCha8Rng::seed_from_u64(4).fill(&mut pattern[..]);
    let mut dir = ROOT_INO;
    for i in 0..b.files {
        if i % b.per_dir == 0 {
            dir = fs
                .mkdir(
                    ctx,
                    ROOT_INO,
                    format!("d{}", i / b.per_dir).as_bytes(),
                    0o755,
                )
                .map_err(e)?
                .ino;
        }
        let a = fs
            .mknod(ctx, dir, format!("f{i}").as_bytes(), 0o100644, 0)
            .map_err(e)?;
        if per_file > 0 {
            pattern[..8].copy_from_slice(&i.to_le_bytes());
            fs.write(a.ino, 0, &pattern[..per_file as usize])
                .map_err(e)?;
        }
        if i % 50_000 == 0 && i > 0 {
            eprint!("\rbuilding: {i} files, {:.0} s", t.elapsed().as_secs_f64());
        }
    }
    drop(fs);
    lld.close().map_err(e)?;
    eprintln!("\r\x1b[K");
    println!(
        "built in {:.0} s ({} MiB image)",
        t.elapsed().as_secs_f64(),
        size >> 20
    );
    Ok(())
}
