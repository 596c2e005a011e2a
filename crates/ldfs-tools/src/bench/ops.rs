//! `ldfs bench ops`: ldfs's own cost per file-system operation (issue 16),
//! without FUSE or a disk: `Fs` over `Lld` on a `MemoryDevice`, the calls
//! the FUSE adapter makes for each request (a create pins the new inode as
//! the kernel's lookup reference does; an unlink's FORGET unpins it), timed
//! phase by phase over `--files` files of one directory. What is left is the
//! CPU time of fs, the engine and the map per operation: the part of a
//! FUSE request that ldfs can cut (the round trip itself is memfs's figure
//! in `bench fs`). Run it under `perf record -g` to see where it goes.
//!
//! Each phase is timed twice: wall time, and the process's CPU time (its
//! threads', the log writer's included), which a busy machine moves far
//! less: time spent waiting for a core is not in it.

use std::sync::Arc;
use std::time::Instant;

use ldfs::device::{Device, MemoryDevice};
use ldfs::fs::{Ctx, Fs, FsOptions, RenameFlags, ROOT_INO};
use ldfs::ld::LogicalDisk;
use ldfs::lld::layout::MkfsOptions;
use ldfs::lld::{Lld, LldOptions};

pub struct OpsBench {
    pub files: usize,
    /// Bytes written to each file (at most `INLINE_MAX`: kept in the inode).
    pub file_bytes: usize,
    pub device_bytes: u64,
    pub rounds: usize,
}

/// The phases, in the order they run.
pub const PHASES: [&str; 6] = [
    "create+write",
    "lookup",
    "getattr",
    "read",
    "rename",
    "unlink",
];

type R<T> = Result<T, String>;

/// The process's CPU time so far (every thread's), in seconds.
fn cpu_secs() -> f64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // Cannot fail: the clock exists on Linux and `t` is valid.
    let r = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut t) };
    assert_eq!(r, 0, "clock_gettime(CLOCK_PROCESS_CPUTIME_ID)");
    t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}

/// Per-operation cost of a phase, in microseconds.
#[derive(Clone, Copy, Debug, Default)]
pub struct Cost {
    pub wall_us: f64,
    pub cpu_us: f64,
}

/// One round on a fresh device: the cost of an operation of each phase.
fn round(b: &OpsBench) -> R<[Cost; PHASES.len()]> {
    let dev: Arc<dyn Device> = Arc::new(MemoryDevice::new(b.device_bytes));
    let lld = Arc::new(
        Lld::create(dev, &MkfsOptions::default(), LldOptions::default())
            .map_err(|e| format!("mkfs: {e}"))?,
    );
    let ctx = Ctx {
        uid: 0,
        gid: 0,
        umask: 0o022,
    };
    Fs::format(&*lld, ctx).map_err(|e| format!("format: {e}"))?;
    let ld: Arc<dyn LogicalDisk> = lld.clone();
    let fs = Fs::mount(ld, FsOptions::default()).map_err(|e| format!("mount: {e}"))?;
    let dir = fs
        .mkdir(ctx, ROOT_INO, b"d", 0o755)
        .map_err(|e| format!("mkdir: {e}"))?
        .ino;
    let name = |p: &str, i: usize| format!("{p}{i:07}").into_bytes();
    let data = vec![0x5a_u8; b.file_bytes];
    let mut inos = Vec::with_capacity(b.files);
    let mut us = [Cost::default(); PHASES.len()];
    let mut time = |phase: usize, f: &mut dyn FnMut(usize) -> R<()>| -> R<()> {
        let t = Instant::now();
        let c = cpu_secs();
        for i in 0..b.files {
            f(i).map_err(|e| format!("{} of file {i}: {e}", PHASES[phase]))?;
        }
        us[phase] = Cost {
            wall_us: t.elapsed().as_secs_f64() * 1e6 / b.files as f64,
            cpu_us: (cpu_secs() - c) * 1e6 / b.files as f64,
        };
        Ok(())
    };
    time(0, &mut |i| {
        let a = fs
            .mknod(ctx, dir, &name("f", i), 0o100644, 0)
            .map_err(|e| e.to_string())?;
        fs.pin(a.ino, 1);
        fs.write(a.ino, 0, &data).map_err(|e| e.to_string())?;
        inos.push(a.ino);
        Ok(())
    })?;
    time(1, &mut |i| {
        let a = fs.lookup(dir, &name("f", i)).map_err(|e| e.to_string())?;
        fs.pin(a.ino, 1);
        Ok(())
    })?;
    time(2, &mut |i| {
        fs.getattr(inos[i]).map(drop).map_err(|e| e.to_string())
    })?;
    time(3, &mut |i| {
        let got = fs.read(inos[i], 0, 1 << 20).map_err(|e| e.to_string())?;
        if got != data {
            return Err(format!(
                "read {} bytes, not the {} written",
                got.len(),
                data.len()
            ));
        }
        Ok(())
    })?;
    time(4, &mut |i| {
        fs.rename(
            dir,
            &name("f", i),
            dir,
            &name("g", i),
            RenameFlags::default(),
        )
        .map_err(|e| e.to_string())
    })?;
    time(5, &mut |i| {
        fs.unlink(dir, &name("g", i)).map_err(|e| e.to_string())?;
        // The kernel's FORGET of the create's and the lookup's references.
        fs.unpin(inos[i], 2).map_err(|e| e.to_string())
    })?;
    let left = fs.readdir(dir, 0, 8).map_err(|e| e.to_string())?;
    if left.iter().any(|e| e.name != b"." && e.name != b"..") {
        return Err("the directory is not empty after the unlinks".into());
    }
    drop(fs);
    lld.close().map_err(|e| format!("close: {e}"))?;
    Ok(us)
}

/// Medians over the rounds (wall and CPU time apart), in `PHASES` order.
pub fn measure(b: &OpsBench) -> R<Vec<Cost>> {
    if b.files == 0 || b.rounds == 0 || b.file_bytes == 0 {
        return Err("--files, --bytes and --rounds must be at least 1".into());
    }
    if b.file_bytes > 1 << 20 {
        return Err("--bytes: at most 1M (one write)".into());
    }
    let mut all = Vec::new();
    for _ in 0..b.rounds {
        all.push(round(b)?);
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    Ok((0..PHASES.len())
        .map(|p| Cost {
            wall_us: median(all.iter().map(|r| r[p].wall_us).collect()),
            cpu_us: median(all.iter().map(|r| r[p].cpu_us).collect()),
        })
        .collect())
}

pub fn run(b: &OpsBench) -> R<()> {
    println!(
        "# ldfs bench ops: {} files of {} bytes in one directory, Fs over Lld on a {} MiB MemoryDevice, median of {} rounds",
        b.files,
        b.file_bytes,
        b.device_bytes >> 20,
        b.rounds
    );
    let costs = measure(b)?;
    println!(
        "{:<14} {:>10} {:>12} {:>10}",
        "operation", "us/op", "ops/s", "cpu us/op"
    );
    for (p, c) in PHASES.iter().zip(&costs) {
        println!(
            "{p:<14} {:>10.2} {:>12.0} {:>10.2}",
            c.wall_us,
            1e6 / c.wall_us,
            c.cpu_us
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every phase runs its operations and takes time; the round checks
    /// what it did (reads return the data, the directory ends empty).
    #[test]
    fn every_phase_is_measured() {
        // Files with a list of blocks, and small ones kept in the inode.
        for file_bytes in [4096, 1024] {
            let us = measure(&OpsBench {
                files: 300,
                file_bytes,
                device_bytes: 64 << 20,
                rounds: 1,
            })
            .unwrap();
            assert_eq!(us.len(), PHASES.len());
            for (p, c) in PHASES.iter().zip(&us) {
                assert!(c.wall_us.is_finite() && c.wall_us > 0.0, "{p}: {c:?}");
                assert!(c.cpu_us.is_finite() && c.cpu_us >= 0.0, "{p}: {c:?}");
            }
        }
    }
}
