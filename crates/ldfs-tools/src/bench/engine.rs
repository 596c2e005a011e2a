//! `ldfs bench engine`: the engine's figures (issue 2), each measured side
//! by side with the raw device in one run.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ldfs::device::{Device, FileDevice, FileDeviceOptions};
use ldfs::ld::{ListHints, LogicalDisk};
use ldfs::lld::layout::MkfsOptions;
use ldfs::lld::{Lld, LldOptions};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

pub struct EngineBench {
    pub dir: PathBuf,
    pub stream_mib: u64,
    pub map_blocks: u64,
    pub crash_mib: u64,
    pub seconds: u64,
}

type R<T> = Result<T, String>;

fn mib_s(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / (1 << 20) as f64 / d.as_secs_f64()
}

fn direct() -> FileDeviceOptions {
    FileDeviceOptions { direct: true }
}

fn buffered() -> FileDeviceOptions {
    FileDeviceOptions { direct: false }
}

/// Drops the page cache so opens read from the device (root only).
fn drop_caches() -> bool {
    unsafe { libc::sync() };
    std::fs::write("/proc/sys/vm/drop_caches", "3").is_ok()
}

pub fn run(b: &EngineBench) -> R<()> {
    std::fs::create_dir_all(&b.dir).map_err(|e| format!("{}: {e}", b.dir.display()))?;
    println!(
        "# ldfs bench engine ({} in {})",
        env_line(),
        b.dir.display()
    );
    streaming(b)?;
    map_figures(b)?;
    open_after_crash(b)?;
    group_commit(b)?;
    Ok(())
}

fn env_line() -> String {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!("{cpus} CPUs")
}

fn raw_stream(path: &Path, size: u64, bytes: u64) -> R<f64> {
    let dev = FileDevice::create(path, size, direct()).map_err(|e| e.to_string())?;
    let buf = vec![0x5au8; 1 << 20];
    let t = Instant::now();
    let mut off = 0;
    while off < bytes {
        dev.write_at(&buf, off).map_err(|e| e.to_string())?;
        off += buf.len() as u64;
    }
    dev.flush().map_err(|e| e.to_string())?;
    Ok(mib_s(bytes, t.elapsed()))
}

fn lld_stream(path: &Path, size: u64, bytes: u64) -> R<f64> {
    let dev: Arc<dyn Device> =
        Arc::new(FileDevice::create(path, size, direct()).map_err(|e| e.to_string())?);
    let lld = Lld::create(dev, &MkfsOptions::default(), LldOptions::default())
        .map_err(|e| e.to_string())?;
    let l = lld
        .create_list(None, ListHints::default())
        .map_err(|e| e.to_string())?;
    let mut block = vec![0u8; 4096];
    ChaCha8Rng::seed_from_u64(1).fill(&mut block[..]);
    let t = Instant::now();
    for i in 0..bytes / 4096 {
        block[..8].copy_from_slice(&i.to_le_bytes());
        lld.write(None, l, i, &block).map_err(|e| e.to_string())?;
    }
    lld.flush().map_err(|e| e.to_string())?;
    let rate = mib_s(bytes, t.elapsed());
    lld.close().map_err(|e| e.to_string())?;
    Ok(rate)
}

/// Streaming 4 KiB block writes through lld vs 1 MiB O_DIRECT writes.
fn streaming(b: &EngineBench) -> R<()> {
    let path = b.dir.join("bench-stream.img");
    let bytes = b.stream_mib << 20;
    let size = bytes + bytes / 4 + (256 << 20);
    let (mut raw, mut lld) = (Vec::new(), Vec::new());
    for _ in 0..2 {
        raw.push(raw_stream(&path, size, bytes)?);
        lld.push(lld_stream(&path, size, bytes)?);
    }
    let _ = std::fs::remove_file(&path);
    let best = |v: &[f64]| v.iter().cloned().fold(0.0, f64::max);
    let (r, l) = (best(&raw), best(&lld));
    println!(
        "streaming write: {:.0}% of raw ({:.0} MiB/s vs {:.0} MiB/s)  [{} MiB of 4 KiB blocks, O_DIRECT, final flush included; best of 2]",
        100.0 * l / r,
        l,
        r,
        b.stream_mib
    );
    Ok(())
}

/// Map memory for many mapped blocks, and checkpoint size after 1% overwrites.
fn map_figures(b: &EngineBench) -> R<()> {
    let path = b.dir.join("bench-map.img");
    let n = b.map_blocks;
    let size = (n * 4096).max(1 << 30);
    let dev: Arc<dyn Device> =
        Arc::new(FileDevice::create(&path, size, buffered()).map_err(|e| e.to_string())?);
    let opts = LldOptions::default();
    let budget = opts.map_budget_bytes;
    let lld = Lld::create(dev.clone(), &MkfsOptions::default(), opts.clone())
        .map_err(|e| e.to_string())?;
    let l = lld
        .create_list(None, ListHints::default())
        .map_err(|e| e.to_string())?;
    let t = Instant::now();
    for i in 0..n {
        lld.write(None, l, i, &i.to_le_bytes())
            .map_err(|e| format!("block {i}: {e}"))?;
    }
    lld.checkpoint_now().map_err(|e| e.to_string())?;
    let fill = t.elapsed();
    let (mem, pages, _) = lld.map_figures();
    println!(
        "map: {n} blocks mapped ({} GiB sparse image) in {:.1} s; map memory {:.1} MiB (budget {} MiB), {pages} map pages",
        size >> 30,
        fill.as_secs_f64(),
        mem as f64 / (1 << 20) as f64,
        budget >> 20
    );
    let one_pct = n / 100;
    for (name, random) in [("contiguous", false), ("random", true)] {
        let before = lld.stats().map_pages_written;
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        for k in 0..one_pct {
            let i = if random {
                rng.gen_range(0..n)
            } else {
                n / 2 + k
            };
            lld.write(None, l, i, &(i ^ 1).to_le_bytes())
                .map_err(|e| e.to_string())?;
        }
        lld.checkpoint_now().map_err(|e| e.to_string())?;
        let written = lld.stats().map_pages_written - before;
        let (mem, pages, _) = lld.map_figures();
        println!(
            "checkpoint after overwriting 1% ({name}): {written} of {pages} map pages written ({:.2}%); map memory {:.1} MiB",
            100.0 * written as f64 / pages as f64,
            mem as f64 / (1 << 20) as f64
        );
    }
    lld.close().map_err(|e| e.to_string())?;
    drop(lld);
    drop(dev);
    let cold = drop_caches();
    let dev: Arc<dyn Device> =
        Arc::new(FileDevice::open(&path, buffered()).map_err(|e| e.to_string())?);
    let t = Instant::now();
    let lld = Lld::open(dev, LldOptions::default()).map_err(|e| e.to_string())?;
    let open = t.elapsed();
    println!(
        "open after clean shutdown: {:.3} s ({n} mapped blocks, {} cache)",
        open.as_secs_f64(),
        if cold { "cold" } else { "warm" }
    );
    let got = lld.read(l, 12345 % n).map_err(|e| e.to_string())?;
    if got.is_none() {
        return Err("map lost a block".into());
    }
    lld.close().map_err(|e| e.to_string())?;
    drop(lld);
    let _ = std::fs::remove_file(&path);
    Ok(())
}

fn open_after_crash(b: &EngineBench) -> R<()> {
    let path = b.dir.join("bench-crash.img");
    let bytes = b.crash_mib << 20;
    let size = bytes * 2 + (512 << 20);
    let dev: Arc<dyn Device> =
        Arc::new(FileDevice::create(&path, size, buffered()).map_err(|e| e.to_string())?);
    let opts = LldOptions {
        checkpoint_log_bytes: u64::MAX,
        checkpoint_dirty_pages: Some(usize::MAX),
        ..Default::default()
    };
    let lld = Lld::create(dev, &MkfsOptions::default(), opts).map_err(|e| e.to_string())?;
    let l = lld
        .create_list(None, ListHints::default())
        .map_err(|e| e.to_string())?;
    let block = vec![0xc3u8; 4096];
    for i in 0..bytes / 4096 {
        lld.write(None, l, i, &block).map_err(|e| e.to_string())?;
    }
    lld.flush().map_err(|e| e.to_string())?;
    let checkpoints = lld.stats().checkpoints;
    lld.abandon();
    let cold = drop_caches();
    let dev: Arc<dyn Device> =
        Arc::new(FileDevice::open(&path, buffered()).map_err(|e| e.to_string())?);
    let t = Instant::now();
    let lld = Lld::open(dev, LldOptions::default()).map_err(|e| e.to_string())?;
    let open = t.elapsed();
    let rolled = lld.open_report().rolled_forward;
    if lld
        .read(l, bytes / 4096 - 1)
        .map_err(|e| e.to_string())?
        .is_none()
    {
        return Err("roll-forward lost the last block".into());
    }
    println!(
        "open after crash: {:.3} s ({} MiB written since the last checkpoint, {rolled} partial segments rolled forward, {} cache; {checkpoints} checkpoint(s) before the crash)",
        open.as_secs_f64(),
        b.crash_mib,
        if cold { "cold" } else { "warm" }
    );
    lld.close().map_err(|e| e.to_string())?;
    drop(lld);
    let _ = std::fs::remove_file(&path);
    Ok(())
}

fn group_commit(b: &EngineBench) -> R<()> {
    let path = b.dir.join("bench-commit.img");
    let size = 512u64 << 20;
    // Write the whole file first so neither side pays for block allocation
    // (a sparse file makes every fdatasync commit the fs journal).
    let dev = FileDevice::create(&path, size, buffered()).map_err(|e| e.to_string())?;
    let zeros = vec![0u8; 1 << 20];
    for off in (0..size).step_by(zeros.len()) {
        dev.write_at(&zeros, off).map_err(|e| e.to_string())?;
    }
    dev.flush().map_err(|e| e.to_string())?;
    drop(dev);
    // Bare fdatasync rate on the same file: 4 KiB pwrite + fdatasync.
    let dev = FileDevice::open(&path, buffered()).map_err(|e| e.to_string())?;
    let block = vec![7u8; 4096];
    let until = Instant::now() + Duration::from_secs(b.seconds);
    let mut bare = 0u64;
    let t = Instant::now();
    while Instant::now() < until {
        dev.write_at(&block, (bare % 1000) * 4096 + (256 << 20))
            .map_err(|e| e.to_string())?;
        dev.flush().map_err(|e| e.to_string())?;
        bare += 1;
    }
    let bare_rate = bare as f64 / t.elapsed().as_secs_f64();
    drop(dev);

    let dev: Arc<dyn Device> =
        Arc::new(FileDevice::open(&path, buffered()).map_err(|e| e.to_string())?);
    let lld = Arc::new(
        Lld::create(dev, &MkfsOptions::default(), LldOptions::default())
            .map_err(|e| e.to_string())?,
    );
    let l = lld
        .create_list(None, ListHints::default())
        .map_err(|e| e.to_string())?;
    let stop = Arc::new(AtomicBool::new(false));
    let calls = Arc::new(AtomicU64::new(0));
    let before = lld.stats().device_flushes;
    let t = Instant::now();
    let threads: Vec<_> = (0..8u64)
        .map(|th| {
            let (lld, stop, calls) = (lld.clone(), stop.clone(), calls.clone());
            std::thread::spawn(move || -> R<()> {
                let block = vec![th as u8; 4096];
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    lld.write(None, l, th << 32 | (i % 4096), &block)
                        .map_err(|e| e.to_string())?;
                    lld.flush().map_err(|e| e.to_string())?;
                    calls.fetch_add(1, Ordering::Relaxed);
                    i += 1;
                }
                Ok(())
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(b.seconds));
    stop.store(true, Ordering::Relaxed);
    for th in threads {
        th.join().map_err(|_| "writer thread panicked")??;
    }
    let secs = t.elapsed().as_secs_f64();
    let flushes = calls.load(Ordering::Relaxed) as f64 / secs;
    let device = (lld.stats().device_flushes - before) as f64 / secs;
    println!(
        "group commit: {flushes:.0} flushes/s from 8 threads (4 KiB write + flush each; {device:.0} device flushes/s) vs {bare_rate:.0} bare fdatasync/s on the same file"
    );
    lld.close().map_err(|e| e.to_string())?;
    drop(lld);
    let _ = std::fs::remove_file(&path);
    Ok(())
}
