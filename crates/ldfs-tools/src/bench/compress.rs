//! `ldfs bench compress`: what compression costs and saves (issue 17),
//! in-process (the file system over lld on an image file in `--dir`, or in
//! memory; no FUSE). Two data sets of the same shape: a real source tree
//! (this repository's crates/ and the vendored crate sources under
//! ~/.cargo/registry/src, up to `--source-size`), and the same files filled
//! with random bytes. Each is written (files created, written in 128 KiB
//! pieces as FUSE delivers them, then flushed) and read back (the image's
//! page cache dropped first with POSIX_FADV_DONTNEED), with compression off,
//! lz4 and zstd at its default level. Figures: write and read throughput of
//! file bytes, and live bytes over file bytes (what the data took in the
//! log, metadata included), against the LD paper's claim that compressed
//! writes ran within ~21% of uncompressed ones (`logical-disk-1993.txt`,
//! section 4: 1600 KB/s with compression).

use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use ldfs::device::{Device, FileDevice, FileDeviceOptions, MemoryDevice};
use ldfs::fs::{Ctx, Fs, FsOptions, ROOT_INO};
use ldfs::ld::{Compression, LogicalDisk};
use ldfs::lld::layout::MkfsOptions;
use ldfs::lld::{Lld, LldOptions};
use rand::{RngCore, SeedableRng};

use super::report::{machine_table, Machine};

type R<T> = Result<T, String>;

pub struct CompressBench {
    /// Directory for the image file.
    pub dir: PathBuf,
    /// Most bytes of source files taken.
    pub source_bytes: u64,
    /// Runs of each setting; medians are reported.
    pub rounds: usize,
    /// An in-memory device instead of an image file.
    pub memory: bool,
    /// Write the `compress` section of OUT/BENCHMARKS.md.
    pub out: Option<PathBuf>,
    pub note: Option<String>,
}

const SEED: u64 = 0x5eed_c0de;
const PIECE: usize = 128 << 10;
const CTX: Ctx = Ctx {
    uid: 0,
    gid: 0,
    umask: 0o022,
};

/// A tree to write: directories (parents first) and files with contents.
struct Tree {
    dirs: Vec<PathBuf>,
    files: Vec<(PathBuf, Vec<u8>)>,
    bytes: u64,
}

/// Reads files under `from` (sorted, `target` directories skipped) into
/// `tree` below `to`, until `budget` bytes are taken.
fn take(from: &Path, to: &Path, tree: &mut Tree, budget: &mut u64) -> R<()> {
    let meta = std::fs::symlink_metadata(from).map_err(|e| format!("{}: {e}", from.display()))?;
    if meta.is_dir() {
        tree.dirs.push(to.to_path_buf());
        let mut names: Vec<_> = std::fs::read_dir(from)
            .map_err(|e| format!("{}: {e}", from.display()))?
            .filter_map(|e| e.ok().map(|e| e.file_name()))
            .collect();
        names.sort();
        for n in names {
            if *budget == 0 {
                break;
            }
            if n == "target" {
                continue;
            }
            take(&from.join(&n), &to.join(&n), tree, budget)?;
        }
    } else if meta.is_file() && meta.len() > 0 && meta.len() <= *budget {
        let b = std::fs::read(from).map_err(|e| format!("{}: {e}", from.display()))?;
        *budget -= b.len() as u64;
        tree.bytes += b.len() as u64;
        tree.files.push((to.to_path_buf(), b));
    }
    Ok(())
}

/// This repository's crates/, then the vendored crates in
/// ~/.cargo/registry/src, whole files, up to `cap` bytes in all.
fn source_tree(cap: u64) -> R<Tree> {
    let mut tree = Tree {
        dirs: Vec::new(),
        files: Vec::new(),
        bytes: 0,
    };
    let mut budget = cap;
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    take(&crates, Path::new("ldfs-crates"), &mut tree, &mut budget)?;
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    if let Ok(regs) = std::fs::read_dir(Path::new(&home).join(".cargo/registry/src")) {
        let mut regs: Vec<PathBuf> = regs.filter_map(|e| e.ok().map(|e| e.path())).collect();
        regs.sort();
        for reg in regs {
            if budget == 0 {
                break;
            }
            take(&reg, Path::new("vendor"), &mut tree, &mut budget)?;
        }
    }
    if tree.files.is_empty() {
        return Err("no source files found".into());
    }
    Ok(tree)
}

/// The same files and sizes, filled with random bytes (seeded).
fn random_like(t: &Tree) -> Tree {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(SEED);
    Tree {
        dirs: t.dirs.clone(),
        files: t
            .files
            .iter()
            .map(|(p, b)| {
                let mut r = vec![0u8; b.len()];
                rng.fill_bytes(&mut r);
                (p.clone(), r)
            })
            .collect(),
        bytes: t.bytes,
    }
}

#[derive(Clone, Copy, Default)]
struct Sample {
    write_mib_s: f64,
    read_mib_s: f64,
    /// Live bytes the run added over file bytes.
    live_ratio: f64,
    /// Stored over logical bytes of compressing lists (engine counters).
    data_ratio: Option<f64>,
}

fn mib_s(bytes: u64, secs: f64) -> f64 {
    bytes as f64 / (1 << 20) as f64 / secs.max(1e-9)
}

/// Drops the image file's cached pages (no root needed), so reads reach
/// the storage.
fn drop_cached(path: &Path) {
    if let Ok(f) = std::fs::File::open(path) {
        let _ = f.sync_all();
        unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    }
}

/// One run: a fresh file system, the tree written and flushed, then read
/// back and compared.
fn measure(b: &CompressBench, tree: &Tree, c: Compression) -> R<Sample> {
    let size = (tree.bytes * 3 + (256 << 20)).next_multiple_of(1 << 20);
    let image = b
        .dir
        .join(format!("bench-compress-{}.img", std::process::id()));
    let dev: Arc<dyn Device> = if b.memory {
        Arc::new(MemoryDevice::new(size))
    } else {
        Arc::new(
            FileDevice::create(&image, size, FileDeviceOptions { direct: false })
                .map_err(|e| format!("{}: {e}", image.display()))?,
        )
    };
    let r = (|| {
        let lld = Arc::new(
            Lld::create(dev, &MkfsOptions::default(), LldOptions::default())
                .map_err(|e| e.to_string())?,
        );
        Fs::format(&*lld, CTX).map_err(|e| e.to_string())?;
        let fs = Fs::mount(
            lld.clone() as Arc<dyn LogicalDisk>,
            FsOptions {
                compress: c,
                ..Default::default()
            },
        )
        .map_err(|e| e.to_string())?;
        let live0 = lld.space().live_bytes;
        let t = Instant::now();
        let mut inos: std::collections::HashMap<PathBuf, u64> = Default::default();
        let parent = |inos: &std::collections::HashMap<PathBuf, u64>, p: &Path| {
            p.parent()
                .filter(|q| !q.as_os_str().is_empty())
                .map_or(ROOT_INO, |q| inos[q])
        };
        let name = |p: &Path| {
            p.file_name()
                .unwrap_or_default()
                .as_encoded_bytes()
                .to_vec()
        };
        for d in &tree.dirs {
            if inos.contains_key(d) {
                continue;
            }
            let a = fs
                .mkdir(CTX, parent(&inos, d), &name(d), 0o040755)
                .map_err(|e| format!("mkdir {}: {e}", d.display()))?;
            inos.insert(d.clone(), a.ino);
        }
        let mut files = Vec::with_capacity(tree.files.len());
        for (p, data) in &tree.files {
            let a = fs
                .mknod(CTX, parent(&inos, p), &name(p), 0o100644, 0)
                .map_err(|e| format!("create {}: {e}", p.display()))?;
            for (k, piece) in data.chunks(PIECE).enumerate() {
                fs.write(a.ino, (k * PIECE) as u64, piece)
                    .map_err(|e| format!("write {}: {e}", p.display()))?;
            }
            files.push(a.ino);
        }
        lld.flush().map_err(|e| e.to_string())?;
        let write_secs = t.elapsed().as_secs_f64();
        let live = lld.space().live_bytes.saturating_sub(live0);
        let st = lld.stats();
        let data_ratio = (st.compress_logical_bytes > 0)
            .then(|| st.compress_stored_bytes as f64 / st.compress_logical_bytes as f64);
        if !b.memory {
            drop_cached(&image);
        }
        let t = Instant::now();
        for ((p, data), &ino) in tree.files.iter().zip(&files) {
            let mut off = 0;
            while off < data.len() {
                let got = fs
                    .read(ino, off as u64, PIECE as u32)
                    .map_err(|e| format!("read {}: {e}", p.display()))?;
                let end = (off + PIECE).min(data.len());
                if got != data[off..end] {
                    return Err(format!("{}: read back differs at {off}", p.display()));
                }
                off = end;
            }
        }
        let read_secs = t.elapsed().as_secs_f64();
        drop(fs);
        lld.close().map_err(|e| e.to_string())?;
        Ok(Sample {
            write_mib_s: mib_s(tree.bytes, write_secs),
            read_mib_s: mib_s(tree.bytes, read_secs),
            live_ratio: live as f64 / tree.bytes as f64,
            data_ratio,
        })
    })();
    if !b.memory {
        let _ = std::fs::remove_file(&image);
    }
    r
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

pub fn run(b: &CompressBench) -> R<()> {
    if b.rounds == 0 {
        return Err("--rounds must be at least 1".into());
    }
    std::fs::create_dir_all(&b.dir).map_err(|e| format!("{}: {e}", b.dir.display()))?;
    let mut machine = Machine::probe(&b.dir);
    let source = source_tree(b.source_bytes)?;
    let random = random_like(&source);
    let settings = [
        ("off", Compression::Off),
        ("lz4", Compression::Lz4),
        (
            "zstd",
            Compression::Zstd {
                level: Compression::ZSTD_DEFAULT_LEVEL,
            },
        ),
    ];
    let device = if b.memory {
        "an in-memory device".to_string()
    } else {
        format!("an image file in {}", b.dir.display())
    };
    println!(
        "# ldfs bench compress: {} files, {:.1} MiB, {} directories; fs over lld on {device}; {} round(s), medians",
        source.files.len(),
        source.bytes as f64 / (1 << 20) as f64,
        source.dirs.len(),
        b.rounds
    );
    let mut md = String::new();
    let mut summary = Vec::new();
    for (set, tree) in [("source tree", &source), ("random data", &random)] {
        // Settings interleaved in each round, so a change in the machine's
        // load falls on all of them.
        let mut all: Vec<Vec<Sample>> = vec![Vec::new(); settings.len()];
        for _ in 0..b.rounds {
            for (k, &(_, c)) in settings.iter().enumerate() {
                all[k].push(measure(b, tree, c)?);
            }
        }
        let mut rows: Vec<(&str, Sample)> = Vec::new();
        for (&(label, _), samples) in settings.iter().zip(all) {
            let s = Sample {
                write_mib_s: median(samples.iter().map(|s| s.write_mib_s).collect()),
                read_mib_s: median(samples.iter().map(|s| s.read_mib_s).collect()),
                live_ratio: median(samples.iter().map(|s| s.live_ratio).collect()),
                data_ratio: samples[0]
                    .data_ratio
                    .map(|_| median(samples.iter().filter_map(|s| s.data_ratio).collect())),
            };
            println!(
                "{set:<12} {label:<5} write {:>8.1} MiB/s  read {:>8.1} MiB/s  live/logical {:.3}{}",
                s.write_mib_s,
                s.read_mib_s,
                s.live_ratio,
                s.data_ratio
                    .map_or(String::new(), |r| format!("  data stored/logical {r:.3}"))
            );
            rows.push((label, s));
        }
        md += &format!(
            "\n### {set}\n\n| setting | write MiB/s | read MiB/s | write vs off | read vs off | live bytes / file bytes | data stored / logical |\n|---|---|---|---|---|---|---|\n"
        );
        let off = rows[0].1;
        for (label, s) in &rows {
            md += &format!(
                "| {label} | {:.1} | {:.1} | {:+.0}% | {:+.0}% | {:.3} | {} |\n",
                s.write_mib_s,
                s.read_mib_s,
                (s.write_mib_s / off.write_mib_s - 1.0) * 100.0,
                (s.read_mib_s / off.read_mib_s - 1.0) * 100.0,
                s.live_ratio,
                s.data_ratio.map_or("-".into(), |r| format!("{r:.3}"))
            );
        }
        for (label, s) in &rows[1..] {
            let w = (1.0 - s.write_mib_s / off.write_mib_s) * 100.0;
            let line = format!(
                "{set}, {label}: write throughput {} ({:.1} vs {:.1} MiB/s), read {:.1} vs {:.1} MiB/s, stored {:.0}% of off's; the LD paper: compressed writes within ~21% of uncompressed: {}",
                if w >= 0.0 {
                    format!("{w:.0}% below off")
                } else {
                    format!("{:.0}% above off", -w)
                },
                s.write_mib_s,
                off.write_mib_s,
                s.read_mib_s,
                off.read_mib_s,
                s.live_ratio / off.live_ratio * 100.0,
                if w <= 21.0 { "within" } else { "not within" }
            );
            println!("{line}");
            summary.push(line);
        }
    }
    machine.finish();
    if let Some(out) = &b.out {
        let loaded = [&machine.load_start, &machine.load_end].iter().any(|l| {
            l.split_whitespace()
                .next()
                .and_then(|x| x.parse::<f64>().ok())
                .is_some_and(|x| x >= 1.0)
        });
        let mut body = String::from("## Compression (`ldfs bench compress`, issue 17)\n\n");
        body += &format!(
            "The file system over lld on {device} (in-process, no FUSE), one setting at a time on a fresh image: {} files ({:.1} MiB) in {} directories of a real source tree (this repository's crates/ and vendored crate sources from ~/.cargo/registry/src), then the same files filled with random bytes (seed {SEED:#x}). Each run creates the files, writes them in 128 KiB pieces and flushes (write throughput: file bytes over that time, compression included: it runs in the writing thread while the log writer thread writes the last partial segment), then drops the image's cached pages and reads every file back, comparing (read throughput). `live bytes / file bytes` is what the run added to the log's live bytes (metadata included) over the file bytes; `data stored / logical` is the engine's count for compressing lists alone. zstd is level {}. Medians of {} rounds, the settings interleaved in each.\n\n",
            source.files.len(),
            source.bytes as f64 / (1 << 20) as f64,
            source.dirs.len(),
            Compression::ZSTD_DEFAULT_LEVEL,
            b.rounds
        );
        if loaded {
            body += "**Measured on a loaded machine** (other builds and tests running; see the load averages below): throughputs are lower and noisier than on an idle one; the ratios do not depend on it.\n\n";
        }
        if let Some(n) = &b.note {
            body += &format!("{n}\n\n");
        }
        body += &machine_table(&machine);
        body += &md;
        body += "\nAgainst the LD paper (`logical-disk-1993.txt`, section 4: MINIX LLD wrote 1600 KB/s with compression, within 21% of its throughput without, and read 800 KB/s):\n\n";
        for l in &summary {
            body += &format!("- {l}\n");
        }
        body += "\nThe paper's claim rests on a disk slower than compression: MINIX LLD wrote about 2 MB/s uncompressed, so compressing one segment while the previous one was written cost little. Here the log is written at hundreds of MiB/s (an image file on a virtual disk, through the host's cache), so compression's CPU time shows in the write figures; on random data the engine gives up after a sample and an LZ4 pass, so each setting costs little there.\n";
        super::report::write_section(out, "compress", &body)?;
    }
    Ok(())
}
