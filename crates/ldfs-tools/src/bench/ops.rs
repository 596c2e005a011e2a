//! `ldfs bench ops`: ldfs's own cost per file-system operation (issue 16),
//! without FUSE or a disk: `Fs` over `Lld` on a `MemoryDevice`, the calls
//! the FUSE adapter makes for each request (a create pins the new inode as
//! the kernel's lookup reference does; an unlink's FORGET unpins it), timed
//! phase by phase over `--files` files of one directory. What is left is the
//! CPU time of fs, the engine and the map per operation: the part of a
//! FUSE request that ldfs can cut (the round trip itself is memfs's figure
//! in `bench fs`). Run it under `perf record -g` to see where it goes.

use std::sync::Arc;
use std::time::Instant;

use ldfs::device::{Device, MemoryDevice};
use ldfs::fs::{Ctx, Fs, FsOptions, RenameFlags, ROOT_INO};
use ldfs::ld::LogicalDisk;
use ldfs::lld::layout::MkfsOptions;
use ldfs::lld::{Lld, LldOptions};

pub struct OpsBench {
    pub files: usize,
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

/// One round on a fresh device: microseconds per operation of each phase.
fn round(b: &OpsBench) -> R<[f64; PHASES.len()]> {
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
    let data = vec![0x5a_u8; 4096];
    let mut inos = Vec::with_capacity(b.files);
    let mut us = [0f64; PHASES.len()];
    let mut time = |phase: usize, f: &mut dyn FnMut(usize) -> R<()>| -> R<()> {
        let t = Instant::now();
        for i in 0..b.files {
            f(i).map_err(|e| format!("{} of file {i}: {e}", PHASES[phase]))?;
        }
        us[phase] = t.elapsed().as_secs_f64() * 1e6 / b.files as f64;
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
        let got = fs.read(inos[i], 0, 4096).map_err(|e| e.to_string())?;
        if got != data {
            return Err(format!("read {} bytes, not the 4096 written", got.len()));
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

/// Medians over the rounds, microseconds per operation, in `PHASES` order.
pub fn measure(b: &OpsBench) -> R<Vec<f64>> {
    if b.files == 0 || b.rounds == 0 {
        return Err("--files and --rounds must be at least 1".into());
    }
    let mut all = Vec::new();
    for _ in 0..b.rounds {
        all.push(round(b)?);
    }
    Ok((0..PHASES.len())
        .map(|p| {
            let mut v: Vec<f64> = all.iter().map(|r| r[p]).collect();
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        })
        .collect())
}

pub fn run(b: &OpsBench) -> R<()> {
    println!(
        "# ldfs bench ops: {} files of 4 KiB in one directory, Fs over Lld on a {} MiB MemoryDevice, median of {} rounds",
        b.files,
        b.device_bytes >> 20,
        b.rounds
    );
    let us = measure(b)?;
    println!("{:<14} {:>10} {:>12}", "operation", "us/op", "ops/s");
    for (p, u) in PHASES.iter().zip(&us) {
        println!("{p:<14} {u:>10.2} {:>12.0}", 1e6 / u);
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
        let us = measure(&OpsBench {
            files: 300,
            device_bytes: 64 << 20,
            rounds: 1,
        })
        .unwrap();
        assert_eq!(us.len(), PHASES.len());
        for (p, u) in PHASES.iter().zip(&us) {
            assert!(u.is_finite() && *u > 0.0, "{p}: {u} us/op");
        }
    }
}
