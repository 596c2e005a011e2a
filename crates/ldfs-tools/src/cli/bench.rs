//! `ldfs bench ...`: the benchmarks' options and their dispatch into
//! `crate::bench` (one module per benchmark).

use std::path::PathBuf;

use clap::Subcommand;
use ldfs::lld::PolicyKind;

use super::{parse_size, CmdResult};
use crate::bench::{
    apps, cleaner, compress, dual, engine, fs, fsck, ops, report, store_cold, vld, writedel,
};

/// The options of `ldfs bench fs`.
#[derive(clap::Args)]
pub struct FsArgs {
    /// Directory for the image files.
    #[arg(long, default_value = ".")]
    dir: PathBuf,
    /// Reduced sizes for a quick end-to-end check (every size below
    /// that is not given takes its quick value).
    #[arg(long)]
    quick: bool,
    /// Size of each target's image (and of the tmpfs).
    #[arg(long, default_value = "4G", value_parser = parse_size)]
    image_size: u64,
    /// Small files (1 KB each) to create, read and delete (LFS: 10,000;
    /// quick: 2,000).
    #[arg(long)]
    small_files: Option<usize>,
    /// Size of the large file in MiB (LFS: 100 MB; quick: 32).
    #[arg(long)]
    large_mib: Option<u64>,
    /// Names in the big directory (1,000,000; quick: 20,000).
    #[arg(long)]
    dir_names: Option<usize>,
    /// Targets, in order: ldfs, ext4, xfs, btrfs, fuse2fs, memfs, tmpfs;
    /// also ldfs-wb and memfs-wb (the two with the kernel's writeback cache) and
    /// memfs-sync (memfs flushing one page of a host file per fsync), and
    /// ldfs-uring and memfs-uring (over FUSE over io_uring; skipped with
    /// the reason where the kernel lacks it).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "ldfs,ext4,xfs,btrfs,fuse2fs,memfs,tmpfs"
    )]
    targets: Vec<String>,
    /// Workloads, in order: smallfiles, largefile, bigdir, syncwrite,
    /// synccreate, metadata, postmark, andrew, tpcb, writedel.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "smallfiles,largefile,bigdir,syncwrite,synccreate,metadata,postmark,andrew,tpcb,writedel"
    )]
    workloads: Vec<String>,
    /// Rounds, targets interleaved in each; medians are printed.
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// Sample the ldfs daemon with perf(1) during the metadata workload of
    /// the first round and report where its time goes, by layer.
    #[arg(long)]
    profile: bool,
    /// Seconds of each syncwrite run: 1 thread, 8 on one file, 8 on a file each (5; quick: 1).
    #[arg(long)]
    sync_secs: Option<f64>,
    /// Files synccreate makes with 1 thread; 8 threads make as many in
    /// all (2,000; quick: 400).
    #[arg(long)]
    sync_creates: Option<usize>,
    /// PostMark files (20,000; quick: 2,000), 512 B to 16 KB each.
    #[arg(long)]
    postmark_files: Option<usize>,
    /// PostMark transactions (20,000; quick: 2,000).
    #[arg(long)]
    postmark_transactions: Option<usize>,
    /// PostMark subdirectories.
    #[arg(long, default_value_t = 100)]
    postmark_subdirs: usize,
    /// MiB of vendored crate sources in the Andrew tree, besides this
    /// repository's crates/ (32; quick: 4).
    #[arg(long)]
    andrew_source_mib: Option<u64>,
    /// C files of the program Andrew compiles (40; quick: 8).
    #[arg(long)]
    andrew_c_files: Option<usize>,
    /// pgbench scale factor (10; quick: 2).
    #[arg(long)]
    tpcb_scale: Option<u32>,
    /// pgbench clients.
    #[arg(long, default_value_t = 4)]
    tpcb_clients: u32,
    /// Seconds of the pgbench run (60; quick: 10).
    #[arg(long)]
    tpcb_secs: Option<u64>,
    /// Write every sample to this JSON file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write OUT/BENCHMARKS.md (machine, date, command, tables) and one
    /// chart per workload in OUT/bench/ (`--out docs` for the repo's).
    #[arg(long)]
    out: Option<PathBuf>,
    /// A sentence added to the report (for example, that the machine
    /// was shared).
    #[arg(long)]
    note: Option<String>,
}

/// The options of `ldfs bench vld`.
#[derive(clap::Args)]
pub struct VldArgs {
    /// Reduced sizes (under 10 minutes on 2 cores); every size below that
    /// is not given takes its quick value.
    #[arg(long)]
    quick: bool,
    /// Trials per point of equation 1's simulation (200,000; quick: 50,000).
    #[arg(long)]
    eq1_trials: Option<u32>,
    /// Tracks per point of equation 10's simulation (2,000; quick: 500).
    #[arg(long)]
    eq10_tracks: Option<u32>,
    /// Utilizations of the random-update benchmark (Figure 8; 0.1 to 0.9 by
    /// 0.1; quick: 0.1 to 0.9 by 0.2).
    #[arg(long, value_delimiter = ',', value_parser = parse_fraction)]
    utilizations: Vec<f64>,
    /// Measured updates per point of Figures 8-10 (400; quick: 100).
    #[arg(long)]
    updates: Option<u32>,
    /// Most unmeasured updates before them, to reach a steady state
    /// (6,000; quick: 1,500).
    #[arg(long)]
    warmup: Option<u64>,
    /// MiB of Figure 7's file (the paper: 10; quick: 4).
    #[arg(long)]
    phase_mib: Option<u64>,
    /// 1 KB files of LD Table 4 (the paper: 10,000; quick: 2,000); a tenth as many 10 KB files.
    #[arg(long)]
    files: Option<usize>,
    /// MiB of LD Table 5's file (40, the paper: 80; quick: 8).
    #[arg(long)]
    table5_mib: Option<u64>,
    /// Write every figure to this JSON file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write the section of OUT/BENCHMARKS.md (kept when `bench fs --out`
    /// rewrites the file) and its charts, OUT/bench/vld-*.png.
    #[arg(long)]
    out: Option<PathBuf>,
    /// A sentence added to the report.
    #[arg(long)]
    note: Option<String>,
}

/// The options of `ldfs bench dual`.
#[derive(clap::Args)]
pub struct DualArgs {
    /// Directory for the image files (sparse; each target's at most --image-size).
    #[arg(long, default_value = ".")]
    dir: PathBuf,
    /// Reduced sizes for a check end to end (about 3 minutes); every size
    /// below that is not given takes its quick value.
    #[arg(long)]
    quick: bool,
    /// Space of each target (4G, the paper's disks; quick: 640M).
    #[arg(long, value_parser = parse_size)]
    image_size: Option<u64>,
    /// Targets, in order: ldfs-dual (two loop devices), ldfs-dual-1d (one
    /// loop device, two partitions), ldfs, ext4, ext2.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "ldfs-dual,ldfs-dual-1d,ldfs,ext4,ext2"
    )]
    targets: Vec<String>,
    /// Experiments: micro (4.1), postmark (4.2), writedel (4.4).
    #[arg(long, value_delimiter = ',', default_value = "micro,postmark,writedel")]
    experiments: Vec<String>,
    /// MiB of vendored crates in the micro-benchmarks' source tree, besides
    /// this repository's crates/ (80, about a Linux 2.2 tree; quick: 2).
    #[arg(long)]
    tree_mib: Option<u64>,
    /// PostMark files (the paper: 150,000; quick: 500).
    #[arg(long)]
    postmark_files: Option<usize>,
    /// PostMark transactions (the paper: 20,000; quick: 500).
    #[arg(long)]
    postmark_transactions: Option<usize>,
    /// PostMark subdirectories (the paper: 150; quick: 10).
    #[arg(long)]
    postmark_subdirs: Option<usize>,
    /// Files of write-del's tree (1,500; quick: 150).
    #[arg(long)]
    writedel_files: Option<usize>,
    /// write-del's copy-and-delete rounds (the paper: 20; quick: 3).
    #[arg(long)]
    writedel_rounds: Option<usize>,
    /// Seconds between the segments write-del's "+cleaner" cleans (the
    /// paper: 5; quick: 0.5).
    #[arg(long)]
    clean_every: Option<f64>,
    /// Process counts of the micro-benchmarks (the paper: 1 and 4).
    #[arg(long, value_delimiter = ',', default_value = "1,4")]
    procs: Vec<usize>,
    /// Runs of everything, targets interleaved; medians are reported.
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    /// Write every run's figures to this JSON file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write the section of OUT/BENCHMARKS.md (kept when `bench fs --out`
    /// rewrites the file).
    #[arg(long)]
    out: Option<PathBuf>,
    /// A sentence added to the report.
    #[arg(long)]
    note: Option<String>,
}

fn parse_fraction(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(u) if u > 0.0 && u < 1.0 => Ok(u),
        _ => Err(format!("'{s}' must be a fraction in (0, 1)")),
    }
}

#[derive(Subcommand)]
pub enum BenchCmd {
    /// The virtual-log paper's experiments and the LD paper's Tables 4-5
    /// on the simulated HP 97560 and Seagate ST19101: equations 1 and 10
    /// against simulation (Figures 1, 2), random synchronous updates
    /// (Figures 8-10) and large-file phases (Figure 7) for uip and lld on the
    /// regular disk and on the virtual-log disk, small files and large files
    /// (LD Tables 4, 5). Simulated time: nothing depends on this machine.
    Vld(Box<VldArgs>),
    /// The DualFS paper's experiments (section 4) measured as it measures
    /// them, total I/O time (the devices' busy time, io_ticks) besides wall
    /// time: its six micro-benchmarks on a real source tree, PostMark and
    /// write-del with and without cleaning, for ldfs-dual on two loop
    /// devices and on one partitioned loop device, ldfs, ext4 and ext2.
    /// Needs root (loop devices, mounts, drop_caches).
    Dual(Box<DualArgs>),
    /// The engine's figures (issue 2): streaming writes vs raw O_DIRECT,
    /// map memory and checkpoint size for 10 million blocks, open time after
    /// a clean shutdown and after a crash, group commit vs bare fdatasync.
    Engine {
        /// Directory for the image files (needs about 2.5 x --stream-mib free).
        #[arg(long, default_value = ".")]
        dir: PathBuf,
        /// MiB streamed in the write-bandwidth comparison.
        #[arg(long, default_value_t = 1024)]
        stream_mib: u64,
        /// Blocks mapped for the map-memory and checkpoint figures.
        #[arg(long, default_value_t = 10_000_000)]
        map_blocks: u64,
        /// MiB written after the last checkpoint before the simulated crash.
        #[arg(long, default_value_t = 1024)]
        crash_mib: u64,
        /// Seconds of the group-commit and fdatasync loops.
        #[arg(long, default_value_t = 5)]
        seconds: u64,
    },
    /// Compression (issue 17): write and read throughput, and bytes stored
    /// over bytes written, with compression off, lz4 and zstd, on a real
    /// source tree (this repository's crates/ and ~/.cargo/registry/src) and
    /// on random data; the file system over lld in-process (no FUSE).
    Compress {
        /// Directory for the image file (needs about 3 x --source-size).
        #[arg(long, default_value = ".")]
        dir: PathBuf,
        /// Most bytes of source files to take.
        #[arg(long, default_value = "64M", value_parser = parse_size)]
        source_size: u64,
        /// Runs of each setting (interleaved); medians are reported.
        #[arg(long, default_value_t = 5)]
        rounds: usize,
        /// An in-memory device instead of an image file.
        #[arg(long)]
        memory: bool,
        /// Write the compression section of OUT/BENCHMARKS.md (`--out docs`).
        #[arg(long)]
        out: Option<PathBuf>,
        /// A sentence added to the section.
        #[arg(long)]
        note: Option<String>,
    },
    /// The fsck figure (issue 4): builds an image of --files files holding
    /// --data bytes through the library, then times the raw sequential read
    /// of the image, fsck's metadata check (--no-data) and its full check,
    /// each from a cold page cache (root).
    Fsck {
        /// Directory for the image (needs about 1.25 x --data free).
        #[arg(long, default_value = ".")]
        dir: PathBuf,
        /// Files in the image.
        #[arg(long, default_value_t = 1_000_000)]
        files: u64,
        /// File data in all, spread evenly over the files.
        #[arg(long, default_value = "10G", value_parser = parse_size)]
        data: u64,
        /// Files per directory.
        #[arg(long, default_value_t = 1000)]
        per_dir: u64,
        /// Reuse the image an earlier run with the same counts kept.
        #[arg(long)]
        reuse: bool,
        /// Keep the image afterwards.
        #[arg(long)]
        keep: bool,
    },
    /// The papers' benchmarks on ldfs and its peers, side by side: ext4, xfs
    /// and btrfs on loop devices, fuse2fs, memfs (the in-memory FUSE ceiling)
    /// and tmpfs (the memory ceiling). Workloads: the LFS micro-benchmarks
    /// (small files, large file, big directory), syncwrite and synccreate
    /// (virtual-log paper), metadata, PostMark and write-del (DualFS), Andrew and TPC-B
    /// (BSD-LFS). Needs root (mounts, loop devices, drop_caches); installs
    /// missing packages with apt-get as root and skips targets or workloads
    /// whose tools are still missing.
    Fs(Box<FsArgs>),
    /// Issue 20's cold-mount figure: a store-backed file system of --size bytes of files is
    /// written through a mount whose cache is bounded (--cache-size) and uploaded to an S3
    /// gateway (the AWS_* environment's, or a one-node Ceph cluster the run starts and
    /// destroys); then a read-write mount on an empty cache is timed to a usable mount and
    /// every file read once (cold sequential read MB/s, bytes fetched), and a read-only mount
    /// on an empty cache with the same bound (it pins its checkpoint and fetches as it reads)
    /// is timed the same way. Needs root (FUSE, drop_caches).
    StoreCold {
        /// Directory for the caches (each sparse, holding about --cache-size).
        #[arg(long, default_value = ".")]
        dir: PathBuf,
        /// Smaller sizes: 512 MiB of files, a 64 MiB cache bound, 64 MiB files.
        #[arg(long)]
        quick: bool,
        /// Bytes of files written (10 GiB; quick: 512 MiB); the file system is a quarter
        /// larger.
        #[arg(long, value_parser = parse_size)]
        size: Option<u64>,
        /// Size of each file (256 MiB; quick: 64 MiB).
        #[arg(long, value_parser = parse_size)]
        file_size: Option<u64>,
        /// The cache bound of the writer and of the cold mount (512 MiB; quick: 64 MiB).
        #[arg(long, value_parser = parse_size)]
        cache_size: Option<u64>,
        /// Segment size (the size of each object).
        #[arg(long, default_value = "2M", value_parser = parse_size)]
        segment_size: u64,
        /// Leave out the read-only mount.
        #[arg(long)]
        no_read_only: bool,
        /// Write the figures to this JSON file.
        #[arg(long)]
        json: Option<PathBuf>,
        /// Write the store-cold section of OUT/BENCHMARKS.md (kept when `bench fs --out` or
        /// `bench report` rewrites the file).
        #[arg(long)]
        out: Option<PathBuf>,
        /// A sentence added to the section.
        #[arg(long)]
        note: Option<String>,
    },
    /// Redraw the report (BENCHMARKS.md and charts) of an earlier
    /// `bench fs --json` run without measuring again.
    Report {
        /// The JSON `bench fs --json` wrote.
        #[arg(long)]
        json: PathBuf,
        /// Where to write BENCHMARKS.md and bench/*.png.
        #[arg(long)]
        out: PathBuf,
        /// A sentence added to the report.
        #[arg(long)]
        note: Option<String>,
    },
    /// The cleaner's figures (issue 3): write cost against utilization for
    /// uniform and hot-and-cold overwrites under each policy, and random
    /// 4 KiB synchronous overwrites at 80% utilization vs an empty file system.
    Cleaner {
        /// Directory for the synchronous-overwrite image (needs --sync-size free).
        #[arg(long, default_value = ".")]
        dir: PathBuf,
        /// Device size of the write-cost runs (in memory). `--size 128M
        /// --segment-size 512K` is a much quicker run that costs more: with
        /// fewer segments, victims are picked from fewer candidates.
        #[arg(long, default_value = "1G", value_parser = parse_size)]
        size: u64,
        /// Segment size of the write-cost runs (default: mkfs's).
        #[arg(long, default_value = "2M", value_parser = parse_size)]
        segment_size: u64,
        /// Utilizations (live bytes over the segments outside the reserve).
        /// 0.95 works but takes long: uniform overwrites then cost ~20x.
        /// `--utilizations none` runs only the synchronous-overwrite test.
        #[arg(
            long,
            value_delimiter = ',',
            default_value = "0.5,0.6,0.7,0.8,0.85,0.9"
        )]
        #[arg(value_parser = parse_utilization)]
        utilizations: Vec<Option<f64>>,
        /// Overwrites, in device sizes, before measuring and while measuring.
        #[arg(long, default_value_t = 3)]
        overwrites: u64,
        /// Policies to run (default: all).
        #[arg(long, value_delimiter = ',')]
        policies: Vec<PolicyKind>,
        /// Image size of the synchronous-overwrite test (0 skips it).
        #[arg(long, default_value = "256M", value_parser = parse_size)]
        sync_size: u64,
        /// Seconds of each synchronous-overwrite phase.
        #[arg(long, default_value_t = 5)]
        seconds: u64,
        /// Also write the write-cost figure, DIR/bench/cleaner.png (one
        /// panel per workload, a line per policy).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// ldfs's own cost per operation (issue 16), without FUSE or a disk:
    /// the fs calls FUSE's create (with a 4 KiB write), lookup, getattr,
    /// read, rename and unlink make, on Fs over the engine on a memory
    /// device, timed per operation (microseconds; median of --rounds).
    /// Profile it with `perf record -g ldfs bench ops`.
    Ops {
        /// Files (in one directory).
        #[arg(long, default_value_t = 20_000)]
        files: usize,
        /// Bytes per file: 4 KiB gets a list of blocks; 2 KiB or less lives
        /// in the inode (bench fs's small files are 1 KiB).
        #[arg(long, default_value = "4K", value_parser = parse_size)]
        bytes: u64,
        /// Size of the memory device.
        #[arg(long, default_value = "1G", value_parser = parse_size)]
        device_size: u64,
        /// Rounds, each on a fresh device; medians are printed.
        #[arg(long, default_value_t = 3)]
        rounds: usize,
    },
    /// The DualFS write-del test (DualFS 4.4): copy a tree, delete 7/8 of
    /// its files, 20 times; total time with the background cleaner on an
    /// image that must be cleaned against no cleaning at all. Mounts
    /// through FUSE (needs fusermount3).
    Writedel {
        /// Directory for the images.
        #[arg(long, default_value = ".")]
        dir: PathBuf,
        /// Files in the tree (log-uniform 512 B to 64 KiB, about 13 KiB each).
        #[arg(long, default_value_t = 1500)]
        files: usize,
        /// Copy-and-delete rounds.
        #[arg(long, default_value_t = 20)]
        rounds: usize,
        /// Image that must be cleaned (the rounds write several times its size).
        #[arg(long, default_value = "128M", value_parser = parse_size)]
        small_size: u64,
        /// Image that needs no cleaning.
        #[arg(long, default_value = "1G", value_parser = parse_size)]
        large_size: u64,
        /// Runs of each configuration, interleaved; medians are reported.
        #[arg(long, default_value_t = 3)]
        repeat: usize,
        /// The background cleaner's policy.
        #[arg(long, default_value = "free-weighted")]
        policy: PolicyKind,
    },
}

fn parse_utilization(s: &str) -> Result<Option<f64>, String> {
    if s == "none" {
        return Ok(None);
    }
    match s.parse::<f64>() {
        Ok(u) if u > 0.0 && u < 1.0 => Ok(Some(u)),
        _ => Err(format!(
            "utilization '{s}' must be a fraction in (0, 1) or 'none'"
        )),
    }
}

/// Runs the benchmark asked for.
pub fn run(which: BenchCmd) -> CmdResult {
    match which {
        BenchCmd::Ops {
            files,
            bytes,
            device_size,
            rounds,
        } => ops::run(&ops::OpsBench {
            files,
            file_bytes: bytes as usize,
            device_bytes: device_size,
            rounds,
        })
        .map_err(Into::into),
        BenchCmd::Fs(args) => {
            let FsArgs {
                dir,
                quick,
                image_size,
                small_files,
                large_mib,
                dir_names,
                targets,
                workloads,
                rounds,
                profile,
                sync_secs,
                sync_creates,
                postmark_files,
                postmark_transactions,
                postmark_subdirs,
                andrew_source_mib,
                andrew_c_files,
                tpcb_scale,
                tpcb_clients,
                tpcb_secs,
                json,
                out,
                note,
            } = *args;
            // The full size, or the quick one.
            fn pick<T>(v: Option<T>, quick: bool, full: T, small: T) -> T {
                v.unwrap_or(if quick { small } else { full })
            }
            fs::run_all(&fs::FsBench {
                dir,
                image_bytes: image_size,
                small_files: pick(small_files, quick, 10_000, 2_000),
                large_mib: pick(large_mib, quick, 100, 32),
                dir_names: pick(dir_names, quick, 1_000_000, 20_000),
                targets,
                workloads,
                sync_secs: pick(sync_secs, quick, 5.0, 1.0),
                sync_creates: pick(sync_creates, quick, 2_000, 400),
                rounds,
                profile,
                json,
                out,
                note,
                postmark: apps::Postmark {
                    files: pick(postmark_files, quick, 20_000, 2_000),
                    min_bytes: 512,
                    max_bytes: 16 << 10,
                    subdirs: postmark_subdirs,
                    transactions: pick(postmark_transactions, quick, 20_000, 2_000),
                    seed: 42,
                },
                andrew: apps::Andrew {
                    source_mib: pick(andrew_source_mib, quick, 32, 4),
                    c_files: pick(andrew_c_files, quick, 40, 8),
                },
                tpcb: apps::Tpcb {
                    scale: pick(tpcb_scale, quick, 10, 2),
                    clients: tpcb_clients,
                    secs: pick(tpcb_secs, quick, 60, 10),
                },
            })
            .map_err(Into::into)
        }
        BenchCmd::Vld(args) => {
            let VldArgs {
                quick,
                eq1_trials,
                eq10_tracks,
                utilizations,
                updates,
                warmup,
                phase_mib,
                files,
                table5_mib,
                json,
                out,
                note,
            } = *args;
            let pick = |v: Option<u64>, full: u64, small: u64| {
                v.unwrap_or(if quick { small } else { full })
            };
            let utilizations = if !utilizations.is_empty() {
                utilizations
            } else if quick {
                vec![0.1, 0.3, 0.5, 0.7, 0.9]
            } else {
                (1..10).map(|i| f64::from(i) / 10.0).collect()
            };
            vld::run(&vld::VldBench {
                quick,
                eq1_trials: pick(eq1_trials.map(u64::from), 200_000, 50_000) as u32,
                eq10_tracks: pick(eq10_tracks.map(u64::from), 2000, 500) as u32,
                utilizations,
                updates: pick(updates.map(u64::from), 400, 100) as u32,
                warmup: pick(warmup, 6000, 1500),
                phase_mib: pick(phase_mib, 10, 4),
                files: pick(files.map(|f| f as u64), 10_000, 2000) as usize,
                table5_mib: pick(table5_mib, 40, 8),
                json,
                out,
                note,
            })
            .map_err(Into::into)
        }
        BenchCmd::Dual(args) => {
            let DualArgs {
                dir,
                quick,
                image_size,
                targets,
                experiments,
                tree_mib,
                postmark_files,
                postmark_transactions,
                postmark_subdirs,
                writedel_files,
                writedel_rounds,
                clean_every,
                procs,
                repeat,
                json,
                out,
                note,
            } = *args;
            fn pick<T>(v: Option<T>, quick: bool, full: T, small: T) -> T {
                v.unwrap_or(if quick { small } else { full })
            }
            dual::run_bench(&dual::DualBench {
                dir,
                image_bytes: pick(image_size, quick, 4 << 30, 640 << 20),
                targets,
                experiments,
                tree_mib: pick(tree_mib, quick, 80, 2),
                postmark: apps::Postmark {
                    files: pick(postmark_files, quick, 150_000, 500),
                    min_bytes: 512,
                    max_bytes: 16 << 10,
                    subdirs: pick(postmark_subdirs, quick, 150, 10),
                    transactions: pick(postmark_transactions, quick, 20_000, 500),
                    seed: 42,
                },
                writedel_files: pick(writedel_files, quick, 1500, 150),
                writedel_rounds: pick(writedel_rounds, quick, 20, 3),
                clean_every_secs: pick(clean_every, quick, 5.0, 0.5),
                procs,
                repeat,
                json,
                out,
                note,
            })
            .map_err(Into::into)
        }
        BenchCmd::StoreCold {
            dir,
            quick,
            size,
            file_size,
            cache_size,
            segment_size,
            no_read_only,
            json,
            out,
            note,
        } => {
            let pick = |v: Option<u64>, full: u64, small: u64| {
                v.unwrap_or(if quick { small } else { full })
            };
            store_cold::run_bench(&store_cold::ColdBench {
                dir,
                data_bytes: pick(size, 10 << 30, 512 << 20),
                file_bytes: pick(file_size, 256 << 20, 64 << 20),
                cache_bytes: pick(cache_size, 512 << 20, 64 << 20),
                segment_bytes: segment_size,
                read_only: !no_read_only,
                json,
                out,
                note,
            })
            .map_err(Into::into)
        }
        BenchCmd::Report { json, out, note } => std::fs::read_to_string(&json)
            .map_err(|e| format!("{}: {e}", json.display()))
            .and_then(|text| report::from_json(&text))
            .and_then(|r| {
                print!("{}", report::markdown(&r, None));
                report::write_report(&r, &out, note.as_deref())
            })
            .map_err(Into::into),
        BenchCmd::Compress {
            dir,
            source_size,
            rounds,
            memory,
            out,
            note,
        } => compress::run(&compress::CompressBench {
            dir,
            source_bytes: source_size,
            rounds,
            memory,
            out,
            note,
        })
        .map_err(Into::into),
        BenchCmd::Fsck {
            dir,
            files,
            data,
            per_dir,
            reuse,
            keep,
        } => fsck::run(&fsck::FsckBench {
            dir,
            files,
            data_bytes: data,
            per_dir,
            reuse,
            keep,
        })
        .map_err(Into::into),
        BenchCmd::Writedel {
            dir,
            files,
            rounds,
            small_size,
            large_size,
            repeat,
            policy,
        } => writedel::run_bench(&writedel::WriteDelBench {
            dir,
            small_bytes: small_size,
            large_bytes: large_size,
            files,
            rounds,
            repeat,
            policy,
        })
        .map_err(Into::into),
        BenchCmd::Cleaner {
            dir,
            size,
            segment_size,
            utilizations,
            overwrites,
            policies,
            sync_size,
            seconds,
            out,
        } => cleaner::run(&cleaner::CleanerBench {
            dir,
            size,
            segment_size,
            utilizations: utilizations.into_iter().flatten().collect(),
            overwrites,
            policies: if policies.is_empty() {
                PolicyKind::ALL.to_vec()
            } else {
                policies
            },
            sync_size,
            seconds,
            out,
        })
        .map_err(Into::into),
        BenchCmd::Engine {
            dir,
            stream_mib,
            map_blocks,
            crash_mib,
            seconds,
        } => engine::run(&engine::EngineBench {
            dir,
            stream_mib,
            map_blocks,
            crash_mib,
            seconds,
        })
        .map_err(Into::into),
    }
}
