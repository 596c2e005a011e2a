//! `ldfs bench store-cold` (issue 20, "Figures"): the cold mount of a store-backed file system.
//! A file system of `--size` bytes of files is written through a mount whose cache is bounded
//! (`--cache-size`: the local disk holds little of it) and uploaded; then, on an empty cache:
//!
//! - a read-write mount with the same bound: the time until it is usable (from `ldfs mount` to
//!   the root listing every file), what it fetched and wrote before any read, then every file
//!   read once in order (cold sequential read: every segment fetched from the store as read,
//!   evicted behind), its MB/s and the bytes fetched;
//! - a read-only mount with the same bound, which pins the checkpoint it mounts and fetches
//!   as it reads (`store::readers`): the same time to a usable mount, and what its cache then
//!   holds.
//!
//! The gateway is `bench fs`'s ([`super::s3::Gateway`]: the AWS_* environment's, or a one-node
//! cluster the run starts and destroys). Every mount is unmounted, every file and object the
//! run made is removed, also on error ([`Mounted`], [`Scratch`]).

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use rand::{RngCore, SeedableRng};

use super::fs::{run, R};
use super::report::{machine_table, Machine};
use super::s3::Gateway;

/// Bytes of each write and read.
const IO: usize = 1 << 20;
/// Every 4 KiB block of a file starts with its file number and offset (the rest is seeded
/// random bytes), so every block differs and a read checks where its bytes came from.
const BLOCK: usize = 4096;
const SEED: u64 = 0x5eed_c01d;

pub struct ColdBench {
    pub dir: PathBuf,
    /// Bytes of files written (the file system is a quarter larger).
    pub data_bytes: u64,
    pub file_bytes: u64,
    /// The cache bound of the writer and of the cold read-write mount.
    pub cache_bytes: u64,
    pub segment_bytes: u64,
    /// Also time a read-only mount on an empty cache (with the same bound).
    pub read_only: bool,
    pub json: Option<PathBuf>,
    pub out: Option<PathBuf>,
    pub note: Option<String>,
}

/// What one run measured.
#[derive(Debug, Default)]
struct Figures {
    fs_bytes: u64,
    files: u64,
    /// Writing every file (fsynced) and `ldfs sync --remote`.
    write_secs: f64,
    sync_remote_secs: f64,
    writer_allocated: u64,
    writer_evictions: u64,
    segments_put: u64,
    /// The cold read-write mount.
    mount_secs: f64,
    mount_fetched: u64,
    mount_allocated: u64,
    read_secs: f64,
    read_fetched: u64,
    read_misses: u64,
    read_evictions: u64,
    read_allocated: u64,
    /// The read-only mount, if timed.
    ro_mount_secs: Option<f64>,
    ro_allocated: Option<u64>,
}

impl Figures {
    fn read_mb_s(&self, data: u64) -> f64 {
        data as f64 / 1e6 / self.read_secs
    }
    fn write_mb_s(&self, data: u64) -> f64 {
        data as f64 / 1e6 / (self.write_secs + self.sync_remote_secs)
    }
}

/// A mount of this run: unmounted on drop, its daemon waited for (a writer's final upload).
struct Mounted {
    mnt: PathBuf,
    pid: Option<u32>,
    live: bool,
}

impl Mounted {
    fn unmount(mut self) -> R<()> {
        run(Command::new("fusermount3").arg("-u").arg(&self.mnt))?;
        self.live = false;
        if let Some(pid) = self.pid {
            super::s3::wait_exit(pid, Duration::from_secs(150));
        }
        Ok(())
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if self.live {
            let _ = Command::new("fusermount3")
                .arg("-u")
                .arg(&self.mnt)
                .status();
            if let Some(pid) = self.pid {
                super::s3::wait_exit(pid, Duration::from_secs(150));
            }
        }
    }
}

/// The run's files (caches, their notes and residency maps, the mount point), removed on drop.
struct Scratch {
    dir: PathBuf,
    caches: Vec<PathBuf>,
}

impl Scratch {
    fn cache(&mut self, name: &str) -> PathBuf {
        let p = self.dir.join(name);
        self.caches.push(p.clone());
        p
    }
    fn remove(p: &Path) {
        let _ = std::fs::remove_file(crate::cli::store::map_path(p));
        let _ = std::fs::remove_file(crate::cli::store::note_path(p));
        let _ = std::fs::remove_file(p);
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        for c in &self.caches {
            Scratch::remove(c);
        }
        let _ = std::fs::remove_dir(self.dir.join("mnt"));
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// The bytes of `file` at `offset`, `IO` of them.
fn chunk(base: &[u8], file: u64, offset: u64, out: &mut [u8]) {
    out.copy_from_slice(&base[..out.len()]);
    for (i, b) in out.chunks_mut(BLOCK).enumerate() {
        b[..8].copy_from_slice(&file.to_le_bytes());
        b[8..16].copy_from_slice(&(offset + (i * BLOCK) as u64).to_le_bytes());
    }
}

fn allocated(p: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(p).map_or(0, |m| m.blocks() * 512)
}

fn drop_caches() {
    unsafe { libc::sync() };
    let _ = std::fs::write("/proc/sys/vm/drop_caches", "3");
}

fn wait_mounted(mnt: &Path) -> R<()> {
    let t = Instant::now();
    let canon = mnt.canonicalize().map_err(|e| e.to_string())?;
    while t.elapsed() < Duration::from_secs(600) {
        if crate::fuse::mount::mounts().iter().any(|m| m.dir == canon) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Err(format!("{} did not mount", mnt.display()))
}

/// `ldfs stats --json`'s store figures.
fn store_stats(exe: &Path, mnt: &Path) -> R<serde_json::Value> {
    let out = Command::new(exe)
        .args(["stats", "--json"])
        .arg(mnt)
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!(
            "ldfs stats: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).map_err(|e| format!("ldfs stats --json: {e}"))?;
    Ok(v["store"].clone())
}

fn num(v: &serde_json::Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or(0)
}

fn free_bytes(dir: &Path) -> u64 {
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).unwrap_or_default();
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    match unsafe { libc::statvfs(c.as_ptr(), &mut s) } {
        0 => s.f_bavail as u64 * s.f_frsize as u64,
        _ => 0,
    }
}

pub fn run_bench(b: &ColdBench) -> R<()> {
    if b.file_bytes == 0 || !b.file_bytes.is_multiple_of(IO as u64) {
        return Err("--file-size must be a positive multiple of 1 MiB".into());
    }
    let files = b.data_bytes.div_ceil(b.file_bytes);
    let data = files * b.file_bytes;
    // Room for the data and for a cleaner that never needs to run.
    let fs_bytes = (data + data / 4 + (256 << 20)).div_ceil(b.segment_bytes) * b.segment_bytes;
    std::fs::create_dir_all(&b.dir).map_err(|e| format!("{}: {e}", b.dir.display()))?;
    let need = match b.read_only {
        true => 3 * b.cache_bytes + (1 << 30),
        false => 2 * b.cache_bytes + (1 << 30),
    };
    let free = free_bytes(&b.dir);
    if free < need {
        return Err(format!(
            "{} has {} MiB free; the run needs about {} MiB (the bounded caches{})",
            b.dir.display(),
            free >> 20,
            need >> 20,
            if b.read_only {
                " and the read-only mount's; --no-read-only leaves it out"
            } else {
                ""
            }
        ));
    }
    let mut machine = Machine::probe(&b.dir);
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let gw = Gateway::start(&b.dir)?;
    let prefix = gw.next_prefix();
    let url = gw.url(&prefix);
    let store = gw.client(&prefix)?;
    let work = b.dir.join(format!("store-cold-{}", std::process::id()));
    std::fs::create_dir_all(work.join("mnt")).map_err(|e| format!("{}: {e}", work.display()))?;
    let mut scratch = Scratch {
        dir: work.clone(),
        caches: Vec::new(),
    };
    let r = measure(b, &exe, &gw, &url, &mut scratch, files, fs_bytes);
    // The file system's objects go whatever happened (the bucket with the gateway).
    if let Err(e) = super::s3::delete_all(&*store) {
        eprintln!("bench store-cold: emptying {url}: {e}");
    }
    let f = r?;
    drop(scratch);
    machine.finish();
    report(b, &machine, &gw, &f, data)
}

fn mount(
    exe: &Path,
    gw: &Gateway,
    url: &str,
    mnt: &Path,
    cache: &Path,
    args: &[&str],
) -> R<Mounted> {
    run(Command::new(exe)
        .envs(gw.env())
        .arg("mount")
        .args(args)
        .arg(url)
        .arg(mnt)
        .arg("--cache")
        .arg(cache))?;
    wait_mounted(mnt)?;
    Ok(Mounted {
        mnt: mnt.to_path_buf(),
        pid: super::profile::daemon_of(mnt).ok(),
        live: true,
    })
}

/// The root lists every file: the mount is usable.
fn list_all(mnt: &Path, files: u64) -> R<()> {
    let n = std::fs::read_dir(mnt)
        .map_err(|e| format!("{}: {e}", mnt.display()))?
        .count() as u64;
    match n == files {
        true => Ok(()),
        false => Err(format!("{} lists {n} files, not {files}", mnt.display())),
    }
}

fn file_name(i: u64) -> String {
    format!("f{i:05}")
}

fn measure(
    b: &ColdBench,
    exe: &Path,
    gw: &Gateway,
    url: &str,
    scratch: &mut Scratch,
    files: u64,
    fs_bytes: u64,
) -> R<Figures> {
    let mut f = Figures {
        fs_bytes,
        files,
        ..Figures::default()
    };
    let mnt = scratch.dir.join("mnt");
    let bound = b.cache_bytes.to_string();
    let mut base = vec![0u8; IO];
    rand_chacha::ChaCha8Rng::seed_from_u64(SEED).fill_bytes(&mut base);
    let mut buf = vec![0u8; IO];

    // The writer, its cache bounded from mkfs on (the note remembers the bound).
    let writer = scratch.cache("writer.img");
    run(Command::new(exe)
        .envs(gw.env())
        .arg("mkfs")
        .args(["--store", url, "--cache"])
        .arg(&writer)
        .args(["--size", &fs_bytes.to_string()])
        .args(["--segment-size", &b.segment_bytes.to_string()])
        .args(["--cache-size", &bound]))?;
    let m = mount(exe, gw, url, &mnt, &writer, &[])?;
    eprintln!(
        "bench store-cold: writing {files} files of {} MiB to {url} (cache bound {} MiB)",
        b.file_bytes >> 20,
        b.cache_bytes >> 20
    );
    let t = Instant::now();
    for i in 0..files {
        let p = mnt.join(file_name(i));
        let mut w = File::create(&p).map_err(|e| format!("{}: {e}", p.display()))?;
        for off in (0..b.file_bytes).step_by(IO) {
            chunk(&base, i, off, &mut buf);
            w.write_all(&buf)
                .map_err(|e| format!("{}: {e}", p.display()))?;
        }
        w.sync_all().map_err(|e| format!("{}: {e}", p.display()))?;
    }
    f.write_secs = t.elapsed().as_secs_f64();
    let t = Instant::now();
    run(Command::new(exe).args(["sync", "--remote"]).arg(&mnt))?;
    f.sync_remote_secs = t.elapsed().as_secs_f64();
    // The eviction thread runs after the upload's acknowledgement.
    std::thread::sleep(Duration::from_millis(500));
    let s = store_stats(exe, &mnt)?;
    f.writer_allocated = allocated(&writer);
    f.writer_evictions = num(&s, "cache_evictions");
    f.segments_put = num(&s, "segments_put");
    m.unmount()?;
    Scratch::remove(&writer);
    eprintln!(
        "bench store-cold: written and uploaded in {:.1} s + {:.1} s ({:.1} MB/s); the writer's cache held {} MiB",
        f.write_secs,
        f.sync_remote_secs,
        f.write_mb_s(files * b.file_bytes),
        f.writer_allocated >> 20
    );

    // The cold read-write mount on an empty cache.
    let cold = scratch.cache("cold.img");
    drop_caches();
    let t = Instant::now();
    let m = mount(exe, gw, url, &mnt, &cold, &["--cache-size", &bound])?;
    list_all(&mnt, files)?;
    f.mount_secs = t.elapsed().as_secs_f64();
    let s = store_stats(exe, &mnt)?;
    f.mount_fetched = num(&s, "cache_bytes_fetched");
    f.mount_allocated = allocated(&cold);
    eprintln!(
        "bench store-cold: cold mount usable in {:.2} s ({} bytes fetched, {} bytes in its cache); reading every file",
        f.mount_secs, f.mount_fetched, f.mount_allocated
    );
    let mut want = vec![0u8; IO];
    let t = Instant::now();
    for i in 0..files {
        let p = mnt.join(file_name(i));
        let mut r = File::open(&p).map_err(|e| format!("{}: {e}", p.display()))?;
        for off in (0..b.file_bytes).step_by(IO) {
            r.read_exact(&mut buf)
                .map_err(|e| format!("{} at {off}: {e}", p.display()))?;
            chunk(&base, i, off, &mut want);
            if buf != want {
                return Err(format!(
                    "{} at {off}: the bytes read are not the bytes written",
                    p.display()
                ));
            }
        }
    }
    f.read_secs = t.elapsed().as_secs_f64();
    let s = store_stats(exe, &mnt)?;
    f.read_fetched = num(&s, "cache_bytes_fetched");
    f.read_misses = num(&s, "cache_misses");
    f.read_evictions = num(&s, "cache_evictions");
    f.read_allocated = allocated(&cold);
    m.unmount()?;
    Scratch::remove(&cold);
    eprintln!(
        "bench store-cold: cold sequential read {:.1} s ({:.1} MB/s), {} bytes fetched",
        f.read_secs,
        f.read_mb_s(files * b.file_bytes),
        f.read_fetched
    );

    // The read-only mount on an empty cache with the same bound: it pins its checkpoint and
    // fetches as it reads.
    if b.read_only {
        let ro = scratch.cache("ro.img");
        drop_caches();
        let t = Instant::now();
        let m = mount(
            exe,
            gw,
            url,
            &mnt,
            &ro,
            &["-o", "ro", "--cache-size", &bound],
        )?;
        list_all(&mnt, files)?;
        f.ro_mount_secs = Some(t.elapsed().as_secs_f64());
        f.ro_allocated = Some(allocated(&ro));
        m.unmount()?;
        Scratch::remove(&ro);
        eprintln!(
            "bench store-cold: read-only mount usable in {:.2} s ({} bytes in its cache)",
            f.ro_mount_secs.unwrap_or(0.0),
            f.ro_allocated.unwrap_or(0)
        );
    }
    Ok(f)
}

fn report(b: &ColdBench, machine: &Machine, gw: &Gateway, f: &Figures, data: u64) -> R<()> {
    let gib = |x: u64| x as f64 / (1u64 << 30) as f64;
    let mib = |x: u64| x as f64 / (1u64 << 20) as f64;
    let mut rows = vec![
        (
            "write + upload (every file fsynced, then `ldfs sync --remote`)".to_string(),
            format!(
                "{:.1} s + {:.1} s: {:.1} MB/s; {} segment objects put; the writer's cache held {:.0} MiB at the end ({} evictions)",
                f.write_secs,
                f.sync_remote_secs,
                f.write_mb_s(data),
                f.segments_put,
                mib(f.writer_allocated),
                f.writer_evictions
            ),
        ),
        (
            "**cold read-write mount: time to a usable mount**".to_string(),
            format!(
                "**{:.2} s** ({:.1} MiB fetched, {:.1} MiB in its cache before any read)",
                f.mount_secs,
                mib(f.mount_fetched),
                mib(f.mount_allocated)
            ),
        ),
        (
            "**cold sequential read of every file**".to_string(),
            format!(
                "**{:.1} MB/s** ({:.1} s; {:.2} GiB fetched in {} segment objects, {} evictions; its cache held {:.0} MiB at the end)",
                f.read_mb_s(data),
                f.read_secs,
                gib(f.read_fetched),
                f.read_misses,
                f.read_evictions,
                mib(f.read_allocated)
            ),
        ),
    ];
    if let (Some(s), Some(a)) = (f.ro_mount_secs, f.ro_allocated) {
        rows.push((
            "read-only mount on an empty cache with the same bound: time to a usable mount".into(),
            format!("{s:.2} s ({:.1} MiB in its cache)", mib(a)),
        ));
    }
    println!(
        "# ldfs bench store-cold: {:.2} GiB in {} files, file system {:.2} GiB, segments {} KiB, cache bound {:.0} MiB",
        gib(data),
        f.files,
        gib(f.fs_bytes),
        b.segment_bytes >> 10,
        mib(b.cache_bytes)
    );
    for (k, v) in &rows {
        println!("{}: {}", k.replace("**", ""), v.replace("**", ""));
    }
    if let Some(p) = &b.json {
        let j = serde_json::json!({
            "data_bytes": data,
            "files": f.files,
            "fs_bytes": f.fs_bytes,
            "segment_bytes": b.segment_bytes,
            "cache_bound_bytes": b.cache_bytes,
            "write_secs": f.write_secs,
            "sync_remote_secs": f.sync_remote_secs,
            "segments_put": f.segments_put,
            "writer_allocated_bytes": f.writer_allocated,
            "writer_evictions": f.writer_evictions,
            "cold_mount_secs": f.mount_secs,
            "cold_mount_fetched_bytes": f.mount_fetched,
            "cold_mount_allocated_bytes": f.mount_allocated,
            "cold_read_secs": f.read_secs,
            "cold_read_mb_s": f.read_mb_s(data),
            "cold_read_fetched_bytes": f.read_fetched,
            "cold_read_misses": f.read_misses,
            "cold_read_evictions": f.read_evictions,
            "cold_read_allocated_bytes": f.read_allocated,
            "ro_mount_secs": f.ro_mount_secs,
            "ro_allocated_bytes": f.ro_allocated,
            "gateway": gw.describe,
            "date": machine.date,
            "command": machine.command,
        });
        std::fs::write(p, format!("{j:#}\n")).map_err(|e| format!("{}: {e}", p.display()))?;
    }
    if let Some(out) = &b.out {
        let mut body =
            String::from("## ldfs-s3: a cold mount (`ldfs bench store-cold`, issue 20)\n\n");
        body += &format!(
            "A store-backed file system of {:.2} GiB ({:.2} GiB of files, {} files written in 1 MiB writes; {} KiB segments) in a bucket of {}. It is written through a mount whose cache is bounded to {:.0} MiB (`--cache-size`: uploaded segments are evicted, so the local disk holds little of it), each file fsynced, then `ldfs sync --remote`, and unmounted. Then a read-write mount on an empty cache with the same bound: its time to a usable mount runs from `ldfs mount` to the root listing every file (the rebuild writes the checkpoint, the residency map and the Active segment's prefix; nothing else is downloaded), and every file is then read once in order with the page cache dropped first, each segment fetched whole from the store at its first read (its crc checked) and evicted behind. Last, a read-only mount on an empty cache with the same bound, timed the same way: it pins the checkpoint it mounts (the writer keeps what a pinned checkpoint names) and fetches as it reads, as the read-write mount does.\n\n",
            gib(f.fs_bytes),
            gib(data),
            f.files,
            b.segment_bytes >> 10,
            gw.describe,
            mib(b.cache_bytes)
        );
        if let Some(n) = &b.note {
            body += &format!("{n}\n\n");
        }
        body += &machine_table(machine);
        body += "| | |\n|---|---|\n";
        for (k, v) in &rows {
            body += &format!("| {k} | {v} |\n");
        }
        super::report::write_section(out, "store-cold", &body)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_block_of_a_chunk_names_its_file_and_offset() {
        let mut base = vec![0u8; IO];
        rand_chacha::ChaCha8Rng::seed_from_u64(SEED).fill_bytes(&mut base);
        let (mut a, mut b) = (vec![0u8; IO], vec![0u8; IO]);
        chunk(&base, 3, 5 << 20, &mut a);
        chunk(&base, 3, 6 << 20, &mut b);
        assert_ne!(a, b);
        for (i, blk) in a.chunks(BLOCK).enumerate() {
            assert_eq!(u64::from_le_bytes(blk[..8].try_into().unwrap()), 3);
            assert_eq!(
                u64::from_le_bytes(blk[8..16].try_into().unwrap()),
                (5 << 20) + (i * BLOCK) as u64
            );
            assert_eq!(blk[16..], base[i * BLOCK + 16..(i + 1) * BLOCK]);
        }
    }
}
