//! The `ldfs` command: `mkfs`, `mount` (also as the mount helper
//! `mount.fuse.ldfs`), `fsck` (also as `fsck.ldfs`), `sync`, `stats`,
//! `checkpoint`, `clean`, `inspect` and `bench` (engine, cleaner, fs).

mod bench;
mod bench_apps;
mod bench_cleaner;
mod bench_dual;
mod bench_fs;
mod bench_fsck;
mod bench_report;
mod bench_vld;
mod bench_writedel;
mod fsck;
mod fuse;
mod memfs;
mod mount;
mod sync;
use ldfs_tools::transport;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use ldfs::device::{Device, FileDevice, FileDeviceOptions};
use ldfs::lld::layout::MkfsOptions;
use ldfs::lld::mkfs::{mkfs, read_checkpoints, read_superblock};
use ldfs::lld::usage::SegmentState;
use ldfs::lld::{CleanerOptions, Lld, LldOptions, PolicyKind, SegmentId, PAGE_BYTES};

#[derive(Parser)]
#[command(
    name = "ldfs",
    version,
    about = "ldfs: a log-structured file system (Logical Disk + BSD-LFS engineering)"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Format an image file (created or resized to --size) or a block device.
    Mkfs {
        image: PathBuf,
        /// Size of the image file to create, e.g. 1G, 512M. Omit for a block device or an existing file.
        #[arg(long, value_parser = parse_size)]
        size: Option<u64>,
        /// Segment size (the unit of cleaning and of large writes).
        #[arg(long, default_value = "2M", value_parser = parse_size)]
        segment_size: u64,
        /// Largest block the engine accepts.
        #[arg(long, default_value = "64K", value_parser = parse_size)]
        max_block: u64,
        /// Segments kept back for checkpoints and the cleaner (default: 1/16, 4..=64; at least 4).
        #[arg(long)]
        reserved_segments: Option<u32>,
        /// With --size: write the whole image file (zeros) instead of leaving
        /// it sparse. Costs time once; afterwards the host file system never
        /// allocates under ldfs, so each fsync is one data flush, not a
        /// journal commit of the host (about 1.5x faster small fsyncs).
        #[arg(long)]
        preallocate: bool,
        /// Format a dual file system (DualFS): IMAGE holds file data in
        /// groups, updated in place; META (created if absent) holds the
        /// metadata log. Mount IMAGE; META is found by the path recorded here.
        #[arg(long)]
        meta: Option<PathBuf>,
        /// Size of META when it is created (default: 1/10 of IMAGE, at least 64M).
        #[arg(long, value_parser = parse_size, requires = "meta")]
        meta_size: Option<u64>,
    },
    /// Check an image (both superblocks, both checkpoints, every summary and
    /// live block's checksum, the map against the summaries, the usage
    /// table, the file tree) and with -y or -p repair it. Exit codes as
    /// fsck(8): 0 clean, 1 corrected, 4 errors left, 8 operational error,
    /// 16 usage error, 32 cancelled.
    Fsck(fsck::FsckArgs),
    /// Print the superblock, both checkpoints, the segment usage table and,
    /// with --segment, that segment's partial-segment summaries.
    Inspect {
        image: PathBuf,
        #[arg(long)]
        segment: Option<u32>,
        /// Print every segment's usage entry, not only a summary of states.
        #[arg(long)]
        all_segments: bool,
        /// Print one inode: its record and where each of its blocks lies
        /// (segment, byte offset, length, crc).
        #[arg(long, conflicts_with = "path")]
        inode: Option<u64>,
        /// Resolve a path (from the root of the file system) to its inode,
        /// then as --inode.
        #[arg(long)]
        path: Option<String>,
        /// Print JSON (superblock, checkpoint slots, usage summary, and the
        /// segment's partial segments and the inode or path asked for)
        /// instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Mount an image through FUSE. Returns once mounted and serves in the
    /// background; unmount with `fusermount3 -u DIR` or `umount DIR`.
    Mount {
        image: PathBuf,
        dir: PathBuf,
        /// Stay in the foreground (SIGINT/SIGTERM unmount).
        #[arg(short = 'f', long)]
        foreground: bool,
        /// Options: ro, rw, allow_other, cache=SIZE (map memory, default 64M),
        /// commit=SECONDS (default 5), writeback_cache (faster small writes,
        /// but a full file system is then seen at writeback, not by
        /// write(2): see the README), cleaner=POLICY|off, clean_start=N,
        /// clean_stop=N (clean-segment watermarks), dev, nodev, suid, nosuid,
        /// exec, noexec, atime, noatime, sync, async.
        #[arg(short = 'o', value_name = "OPTIONS")]
        options: Vec<String>,
        #[arg(long, hide = true)]
        daemon_child: bool,
    },
    /// Make everything written to a mounted ldfs before this call durable,
    /// open files included (the kernel does not pass sync(2) on to FUSE
    /// file systems).
    Sync { mountpoint: PathBuf },
    /// Print a mounted ldfs's figures: cleaner (policy, watermarks, segments
    /// cleaned, blocks moved, write cost), segments, space, checkpoints.
    Stats { mountpoint: PathBuf },
    /// Write a checkpoint of a mounted ldfs now (the next mount, even after
    /// a crash, then has nothing to roll forward).
    Checkpoint { mountpoint: PathBuf },
    /// Serve the in-memory FUSE ceiling file system on DIR in the foreground
    /// (a benchmark target: FUSE with no storage at all).
    #[command(hide = true)]
    BenchMemfs {
        dir: PathBuf,
        /// Use the kernel's writeback cache (as ldfs's `-o writeback_cache`).
        #[arg(long)]
        writeback_cache: bool,
        /// Write a page to this file (made and filled first) and fdatasync
        /// it on every fsync: the durable FUSE ceiling.
        #[arg(long)]
        flush_file: Option<PathBuf>,
        /// Serve over FUSE over io_uring (as ldfs's `-o transport=uring`).
        #[arg(long)]
        uring: bool,
    },
    /// Clean now: move the live blocks out of segments chosen by a policy
    /// until none at or below --max-utilization is left (or --segments were
    /// released). TARGET is an unmounted image (cleaned, checkpointed and
    /// closed) or the mount point of a mounted ldfs (its daemon cleans);
    /// on a mount point --background and --stop control the background
    /// cleaner.
    Clean {
        #[arg(value_name = "TARGET")]
        image: PathBuf,
        /// greedy, cost-benefit or free-weighted.
        #[arg(long, default_value = "free-weighted")]
        policy: PolicyKind,
        /// Leave segments fuller than this percentage alone.
        #[arg(long, default_value_t = 80)]
        max_utilization: u32,
        /// Stop after releasing this many segments.
        #[arg(long)]
        segments: Option<u64>,
        /// Mount point only: turn the background cleaner on (with --policy)
        /// or off, instead of cleaning now.
        #[arg(long, value_name = "on|off", value_parser = ["on", "off"])]
        background: Option<String>,
        /// Mount point only: stop a running `ldfs clean` and the background
        /// cleaner (writes still clean in the foreground when space runs low).
        #[arg(long, conflicts_with = "background")]
        stop: bool,
    },
    /// Run a benchmark and print its figures.
    Bench {
        #[command(subcommand)]
        which: BenchCmd,
    },
}

/// The options of `ldfs bench fs`.
#[derive(clap::Args)]
struct FsArgs {
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
struct VldArgs {
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
struct DualArgs {
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
enum BenchCmd {
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

pub(crate) fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        None => (s, 1u64),
        Some((i, _)) => {
            let m = match s[i..]
                .to_ascii_uppercase()
                .trim_end_matches("IB")
                .trim_end_matches('B')
            {
                "" => 1,
                "K" => 1 << 10,
                "M" => 1 << 20,
                "G" => 1 << 30,
                "T" => 1 << 40,
                other => {
                    return Err(format!(
                        "unknown size suffix '{other}' in '{s}' (use K, M, G or T)"
                    ))
                }
            };
            (&s[..i], m)
        }
    };
    let n: u64 = num.parse().map_err(|_| format!("'{s}' is not a size"))?;
    n.checked_mul(mult)
        .ok_or_else(|| format!("'{s}' is too large"))
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

fn main() -> ExitCode {
    // As mount(8)'s helper `mount.fuse.ldfs IMAGE DIR [-o OPTIONS]`.
    let argv0 = std::env::args().next().unwrap_or_default();
    if argv0.ends_with("mount.fuse.ldfs") || argv0.ends_with("mount.ldfs") {
        let mut args = std::env::args().skip(1);
        let (Some(image), Some(dir)) = (args.next(), args.next()) else {
            eprintln!("usage: mount.fuse.ldfs IMAGE DIR [-o OPTIONS]");
            return ExitCode::from(1);
        };
        let mut options = Vec::new();
        while let Some(a) = args.next() {
            match a.as_str() {
                "-o" => options.extend(args.next()),
                // mount(8) may pass -n (no mtab), -s, -v: nothing to do.
                "-n" | "-s" | "-v" | "-f" => {}
                other => {
                    eprintln!("mount.fuse.ldfs: unexpected argument '{other}'");
                    return ExitCode::from(1);
                }
            }
        }
        // As for kernel file systems, device nodes work when root mounts
        // through mount(8) or fstab unless `nodev` says otherwise (fuser
        // and fusermount3 default to nodev).
        let named = |w: &str| options.iter().flat_map(|o| o.split(',')).any(|o| o == w);
        if unsafe { libc::geteuid() } == 0 && !named("nodev") && !named("dev") && !named("remount")
        {
            options.push("dev".into());
        }
        return match mount::run(image.into(), dir.into(), false, options, false) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("ldfs: {e}");
                ExitCode::from(32)
            }
        };
    }
    // As fsck(8)'s helper `fsck.ldfs [-n|-y|-p] [-f] IMAGE`, or `ldfs fsck`:
    // parsed here so usage errors exit 16, as fsck(8) says.
    if argv0.ends_with("fsck.ldfs") {
        return ExitCode::from(fsck::main_with(std::env::args()));
    }
    if std::env::args().nth(1).as_deref() == Some("fsck") {
        let args = std::iter::once("ldfs fsck".to_string()).chain(std::env::args().skip(2));
        return ExitCode::from(fsck::main_with(args));
    }
    let cli = Cli::parse();
    let result = match cli.cmd {
        Cmd::Mkfs {
            image,
            size,
            segment_size,
            max_block,
            reserved_segments,
            preallocate,
            meta,
            meta_size,
        } => cmd_mkfs(
            image,
            size,
            segment_size,
            max_block,
            reserved_segments,
            preallocate,
            meta.map(|m| (m, meta_size)),
        ),
        Cmd::Inspect {
            image,
            segment,
            all_segments,
            inode,
            path,
            json,
        } => {
            let dual = inspect_dual(
                &image,
                json,
                segment,
                all_segments,
                inode_target(inode, path.as_deref()),
            );
            if let Err(e) = dual {
                Err(e)
            } else if let Ok(true) = dual {
                Ok(())
            } else if json {
                cmd_inspect_json(&image, segment, inode, path.as_deref())
            } else {
                cmd_inspect(image.clone(), segment, all_segments).and_then(|()| match inode_target(
                    inode,
                    path.as_deref(),
                ) {
                    Some(t) => {
                        let v = inode_report(&image, t)?;
                        print!("{}", inode_text(&v));
                        Ok(())
                    }
                    None => Ok(()),
                })
            }
        }
        Cmd::Mount {
            image,
            dir,
            foreground,
            options,
            daemon_child,
        } => mount::run(image, dir, foreground, options, daemon_child).map_err(Into::into),
        Cmd::Fsck(_) => unreachable!("fsck is dispatched before the other commands"),
        Cmd::BenchMemfs {
            dir,
            writeback_cache,
            flush_file,
            uring,
        } => memfs::serve(&dir, writeback_cache, flush_file.as_deref(), uring).map_err(Into::into),
        Cmd::Stats { mountpoint } => control_get(&mountpoint, "stats").map(|t| {
            print!("{}", String::from_utf8_lossy(&t));
        }),
        Cmd::Checkpoint { mountpoint } => control_set(&mountpoint, "checkpoint", b""),
        Cmd::Sync { mountpoint } => sync::run(&mountpoint).map_err(Into::into),
        Cmd::Bench {
            which: BenchCmd::Fs(args),
        } => {
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
            bench_fs::run_all(&bench_fs::FsBench {
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
                json,
                out,
                note,
                postmark: bench_apps::Postmark {
                    files: pick(postmark_files, quick, 20_000, 2_000),
                    min_bytes: 512,
                    max_bytes: 16 << 10,
                    subdirs: postmark_subdirs,
                    transactions: pick(postmark_transactions, quick, 20_000, 2_000),
                    seed: 42,
                },
                andrew: bench_apps::Andrew {
                    source_mib: pick(andrew_source_mib, quick, 32, 4),
                    c_files: pick(andrew_c_files, quick, 40, 8),
                },
                tpcb: bench_apps::Tpcb {
                    scale: pick(tpcb_scale, quick, 10, 2),
                    clients: tpcb_clients,
                    secs: pick(tpcb_secs, quick, 60, 10),
                },
            })
            .map_err(Into::into)
        }
        Cmd::Bench {
            which: BenchCmd::Vld(args),
        } => {
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
            bench_vld::run(&bench_vld::VldBench {
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
        Cmd::Bench {
            which: BenchCmd::Dual(args),
        } => {
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
            bench_dual::run_bench(&bench_dual::DualBench {
                dir,
                image_bytes: pick(image_size, quick, 4 << 30, 640 << 20),
                targets,
                experiments,
                tree_mib: pick(tree_mib, quick, 80, 2),
                postmark: bench_apps::Postmark {
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
        Cmd::Bench {
            which: BenchCmd::Report { json, out, note },
        } => std::fs::read_to_string(&json)
            .map_err(|e| format!("{}: {e}", json.display()))
            .and_then(|text| bench_report::from_json(&text))
            .and_then(|r| {
                print!("{}", bench_report::markdown(&r, None));
                bench_report::write_report(&r, &out, note.as_deref())
            })
            .map_err(Into::into),
        Cmd::Clean {
            image,
            policy,
            max_utilization,
            segments,
            background,
            stop,
        } => cmd_clean(
            image,
            CleanRequest {
                policy,
                max_utilization,
                segments,
            },
            background,
            stop,
        ),
        Cmd::Bench {
            which:
                BenchCmd::Fsck {
                    dir,
                    files,
                    data,
                    per_dir,
                    reuse,
                    keep,
                },
        } => bench_fsck::run(&bench_fsck::FsckBench {
            dir,
            files,
            data_bytes: data,
            per_dir,
            reuse,
            keep,
        })
        .map_err(Into::into),
        Cmd::Bench {
            which:
                BenchCmd::Writedel {
                    dir,
                    files,
                    rounds,
                    small_size,
                    large_size,
                    repeat,
                    policy,
                },
        } => bench_writedel::run_bench(&bench_writedel::WriteDelBench {
            dir,
            small_bytes: small_size,
            large_bytes: large_size,
            files,
            rounds,
            repeat,
            policy,
        })
        .map_err(Into::into),
        Cmd::Bench {
            which:
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
                },
        } => bench_cleaner::run(&bench_cleaner::CleanerBench {
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
        Cmd::Bench {
            which:
                BenchCmd::Engine {
                    dir,
                    stream_mib,
                    map_blocks,
                    crash_mib,
                    seconds,
                },
        } => bench::run(&bench::EngineBench {
            dir,
            stream_mib,
            map_blocks,
            crash_mib,
            seconds,
        })
        .map_err(Into::into),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ldfs: {e}");
            ExitCode::FAILURE
        }
    }
}

type CmdResult = Result<(), Box<dyn std::error::Error>>;

/// FUSE worker threads. Requests such as fsync block their thread on the
/// device, so there are more threads than CPUs: concurrent fsyncs must reach
/// the engine together for group commit to batch them.
pub(crate) const FUSE_THREADS: usize = 16;

fn control_attr(name: &str) -> std::ffi::CString {
    std::ffi::CString::new(format!("trusted.ldfs.{name}")).expect("no NUL in a control name")
}

fn mountpoint_cstr(
    mountpoint: &std::path::Path,
) -> Result<std::ffi::CString, Box<dyn std::error::Error>> {
    use std::os::unix::ffi::OsStrExt;
    Ok(std::ffi::CString::new(mountpoint.as_os_str().as_bytes())?)
}

/// Reads `trusted.ldfs.<name>` from a mount point's root: the daemon answers.
fn control_get(
    mountpoint: &std::path::Path,
    name: &str,
) -> Result<Vec<u8>, Box<dyn std::error::Error>> {
    let path = mountpoint_cstr(mountpoint)?;
    let attr = control_attr(name);
    let mut buf = vec![0u8; 1 << 16];
    let n = unsafe {
        libc::getxattr(
            path.as_ptr(),
            attr.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if n < 0 {
        let e = std::io::Error::last_os_error();
        return Err(format!(
            "{}: not a mounted ldfs, or not allowed ({e})",
            mountpoint.display()
        )
        .into());
    }
    buf.truncate(n as usize);
    Ok(buf)
}

/// Runs a daemon command by setting `trusted.ldfs.<name>` on the root.
fn control_set(mountpoint: &std::path::Path, name: &str, value: &[u8]) -> CmdResult {
    let path = mountpoint_cstr(mountpoint)?;
    let attr = control_attr(name);
    let r = unsafe {
        libc::setxattr(
            path.as_ptr(),
            attr.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    if r != 0 {
        let e = std::io::Error::last_os_error();
        return Err(format!(
            "{}: {name} failed ({e}; details in the daemon's log)",
            mountpoint.display()
        )
        .into());
    }
    Ok(())
}

/// The engine figures `ldfs stats` prints.
pub(crate) fn stats_text(lld: &ldfs::lld::Lld) -> String {
    use ldfs::ld::LogicalDisk;
    let st = lld.stats();
    let sp = lld.space();
    let mut clean = 0;
    let mut dirty = 0;
    for (_, u) in lld.segment_usage() {
        match u.state {
            SegmentState::Clean => clean += 1,
            SegmentState::Dirty => dirty += 1,
            _ => {}
        }
    }
    let cs = lld.cleaner_stats();
    let (user, moved) = lld.write_totals();
    let cost = if user == 0 {
        1.0
    } else {
        (user + moved) as f64 / user as f64
    };
    format!(
        "cleaner: policy {}, background {}, starts below {} and stops above {} clean segments\ncleaned: {} segments, {} blocks ({} bytes) moved, {} writes waited\nwrite cost (user + moved) / user = {cost:.2}\n",
        lld.cleaner_policy().name(),
        if lld.background_cleaner_running() { "on" } else { "off" },
        lld.start_watermark(),
        lld.stop_watermark(),
        cs.segments_released,
        cs.blocks_moved,
        cs.bytes_moved,
        cs.waits
    ) + &format!(
        "segments: {clean} clean, {dirty} dirty\nlive bytes: {}\ncapacity bytes: {}\navailable bytes: {}\ncheckpoints: {}\npartial segments written: {}\nmap pages written: {}\ndevice flushes: {}\n",
        sp.live_bytes,
        sp.capacity_bytes,
        sp.available_bytes,
        st.checkpoints,
        st.partials_written,
        st.map_pages_written,
        st.device_flushes
    )
}

fn cmd_mkfs(
    image: PathBuf,
    size: Option<u64>,
    segment_size: u64,
    max_block: u64,
    reserved: Option<u32>,
    preallocate: bool,
    meta: Option<(PathBuf, Option<u64>)>,
) -> CmdResult {
    let dev = match size {
        Some(size) => FileDevice::create(&image, size, FileDeviceOptions::default())?,
        None if preallocate => return Err("--preallocate needs --size".into()),
        None => FileDevice::open(&image, FileDeviceOptions::default())?,
    };
    if preallocate {
        let zeros = vec![0u8; 1 << 20];
        let size = dev.size_bytes();
        let mut off = 0;
        while off < size {
            let n = (size - off).min(zeros.len() as u64) as usize;
            dev.write_at(&zeros[..n], off)?;
            off += n as u64;
        }
        dev.flush()?;
    }
    let max_block_bytes =
        u32::try_from(max_block).map_err(|_| format!("--max-block {max_block} is too large"))?;
    let opts = MkfsOptions {
        segment_bytes: segment_size,
        max_block_bytes,
        reserved_segments: reserved,
        fs_id: 0,
    };
    if let Some((meta, meta_size)) = meta {
        return mkfs_dual(image, dev, meta, meta_size, opts);
    }
    let g = mkfs(&dev, &opts)?;
    // The file system on top: an empty root directory owned by the caller.
    let dev: std::sync::Arc<dyn Device> = std::sync::Arc::new(dev);
    let lld = ldfs::lld::Lld::open(dev.clone(), ldfs::lld::LldOptions::default())?;
    let ctx = ldfs::fs::Ctx {
        uid: unsafe { libc::getuid() },
        gid: unsafe { libc::getgid() },
        umask: 0,
    };
    ldfs::fs::Fs::format(&lld, ctx)?;
    lld.close()?;
    drop(lld);
    println!(
        "formatted {}: {} bytes, {} segments of {} KiB, max block {} bytes, {} reserved segments, fs id {:016x}",
        image.display(),
        dev.size_bytes(),
        g.segment_count,
        g.segment_bytes() >> 10,
        g.max_block_bytes,
        g.reserved_segments,
        g.fs_id
    );
    Ok(())
}

/// `ldfs mkfs --meta META DATA`: the engine on META, the groups on DATA.
fn mkfs_dual(
    image: PathBuf,
    data: FileDevice,
    meta: PathBuf,
    meta_size: Option<u64>,
    lld: MkfsOptions,
) -> CmdResult {
    let meta_dev = if meta.exists() && meta_size.is_none() {
        FileDevice::open(&meta, FileDeviceOptions::default())?
    } else {
        let size = meta_size.unwrap_or((data.size_bytes() / 10).max(64 << 20));
        FileDevice::create(&meta, size, FileDeviceOptions::default())?
    };
    // Recorded absolute, so a mount from any directory finds it.
    let meta_path = std::fs::canonicalize(&meta)
        .map_err(|e| format!("{}: {e}", meta.display()))?
        .display()
        .to_string();
    let meta_dev: std::sync::Arc<dyn Device> = std::sync::Arc::new(meta_dev);
    let data: std::sync::Arc<dyn Device> = std::sync::Arc::new(data);
    let geo = ldfs::dual::mkfs(
        meta_dev.clone(),
        &*data,
        &ldfs::dual::DualMkfsOptions {
            lld,
            meta_path: meta_path.clone(),
            ..Default::default()
        },
    )?;
    let d = ldfs::dual::Dual::open(meta_dev.clone(), data, ldfs::lld::LldOptions::default())?;
    let ctx = ldfs::fs::Ctx {
        uid: unsafe { libc::getuid() },
        gid: unsafe { libc::getgid() },
        umask: 0,
    };
    ldfs::fs::Fs::format(&d, ctx)?;
    d.close()?;
    println!(
        "formatted {} (data: {} groups of {} blocks of 4 KiB) with metadata on {} ({} bytes), fs id {:016x}",
        image.display(),
        geo.groups,
        geo.group_blocks,
        meta_path,
        meta_dev.size_bytes(),
        geo.fs_id
    );
    Ok(())
}

/// On a dual data device: prints the pair (devices, groups and their free
/// blocks, the bitmap's summary), then the metadata log's own report (its
/// segments), as text or as one JSON object (the log's, with a `dual`
/// member). False for an ordinary image.
fn inspect_dual(
    image: &std::path::Path,
    json: bool,
    segment: Option<u32>,
    all_segments: bool,
    target: Option<InodeTarget<'_>>,
) -> Result<bool, Box<dyn std::error::Error>> {
    let data: std::sync::Arc<dyn Device> = std::sync::Arc::new(FileDevice::open_read_only(image)?);
    if !ldfs::dual::is_data_device(&*data) {
        return Ok(false);
    }
    let meta_path = mount::dual_meta_path(&*data, image, None)?;
    let meta: std::sync::Arc<dyn Device> =
        std::sync::Arc::new(FileDevice::open_read_only(&meta_path)?);
    // As fsck opens it: bitmaps that disagree with their descriptors are
    // shown as they are, not refused.
    let d = ldfs::dual::Dual::open_for_fsck(
        meta,
        data,
        ldfs::lld::LldOptions {
            read_only: true,
            ..Default::default()
        },
    )?;
    let s = d.stats();
    drop(d);
    if json {
        let mut v = inspect_json_value(&meta_path, segment, None, None)?;
        let mut dj = dual_json(&s);
        dj["data_device"] = serde_json::json!(image.display().to_string());
        dj["metadata_device"] = serde_json::json!(meta_path.display().to_string());
        v["dual"] = dj;
        if let Some(t) = target {
            v["inode"] = inode_report(image, t)?;
        }
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(true);
    }
    println!("dual file system {:016x}", s.geo.fs_id);
    println!(
        "  data device: {} ({} blocks of 4 KiB)",
        image.display(),
        s.geo.blocks
    );
    println!("  metadata device: {}", meta_path.display());
    print!("{}", dual_text(&s));
    println!("metadata log:");
    cmd_inspect(meta_path, segment, all_segments)?;
    if let Some(t) = target {
        print!("{}", inode_text(&inode_report(image, t)?));
    }
    Ok(true)
}

/// The data device of a dual file system as `inspect` and `stats` show
/// it: the groups with their free blocks, and the bitmap's summary.
pub(crate) fn dual_text(s: &ldfs::dual::DualStats) -> String {
    let free: u64 = s.group_free.iter().map(|&f| f as u64).sum();
    let empty = (0..s.geo.groups)
        .filter(|&g| s.group_free[g as usize] as u64 == s.geo.group_len(g))
        .count();
    let full = s.group_free.iter().filter(|&&f| f == 0).count();
    let mut t = format!(
        "  {} groups of {} blocks; {} blocks free ({:.1}%)\n  bitmap: {} blocks allocated, {} freed and reusable after the next commit, {} reserved by operations under way; {} groups empty, {} full\n",
        s.geo.groups,
        s.geo.group_blocks,
        free,
        free as f64 * 100.0 / s.geo.blocks.max(1) as f64,
        s.allocated,
        s.freed_pending,
        s.reserved,
        empty,
        full
    );
    for (g, f) in s.group_free.iter().enumerate() {
        t += &format!("  group {g}: {f} of {} free\n", s.geo.group_len(g as u32));
    }
    t
}

/// `dual_text` as JSON.
pub(crate) fn dual_json(s: &ldfs::dual::DualStats) -> serde_json::Value {
    let free: u64 = s.group_free.iter().map(|&f| f as u64).sum();
    serde_json::json!({
        "fs_id": format!("{:016x}", s.geo.fs_id),
        "block_bytes": ldfs::dual::format::DATA_BLOCK_BYTES,
        "blocks": s.geo.blocks,
        "group_blocks": s.geo.group_blocks,
        "free_blocks": free,
        "bitmap": {
            "allocated": s.allocated,
            "freed_pending": s.freed_pending,
            "reserved": s.reserved,
        },
        "groups": s.group_free.iter().enumerate().map(|(g, &f)| serde_json::json!({
            "group": g,
            "blocks": s.geo.group_len(g as u32),
            "free": f,
        })).collect::<Vec<_>>(),
    })
}

fn cmd_inspect(image: PathBuf, segment: Option<u32>, all: bool) -> CmdResult {
    let dev = FileDevice::open(&image, FileDeviceOptions::default())?;
    let (g, sb_errs) = read_superblock(&dev)?;
    println!("superblock");
    for (i, e) in sb_errs.iter().enumerate() {
        match e {
            None => println!("  copy {i}: ok"),
            Some(e) => println!("  copy {i}: BAD: {e}"),
        }
    }
    println!("  fs id              {:016x}", g.fs_id);
    println!(
        "  device             {} pages of {PAGE_BYTES} bytes",
        g.total_pages
    );
    println!(
        "  segments           {} x {} pages, from page {}",
        g.segment_count, g.segment_pages, g.first_segment_page
    );
    println!(
        "  checkpoint slots   pages {} and {}, {} pages each",
        g.slot_pages[0], g.slot_pages[1], g.checkpoint_pages
    );
    println!("  max block          {} bytes", g.max_block_bytes);
    println!("  reserved segments  {}", g.reserved_segments);
    let slots = read_checkpoints(&dev, &g)?;
    let mut newest: Option<(u64, usize)> = None;
    for (i, s) in slots.iter().enumerate() {
        match s {
            Ok((h, _)) => {
                println!(
                    "checkpoint slot {i}: serial {} epoch {} next seq {} log at segment {} page {} next segment {} next list {}",
                    h.serial, h.epoch, h.next_seq, h.log_segment, h.log_page, h.next_segment, h.next_list
                );
                match h.map_root {
                    Some((ptr, height, entries)) => {
                        println!("  map root at byte {} (crc {:08x}), height {height}, {entries} entries", ptr.addr, ptr.crc)
                    }
                    None => println!("  map empty"),
                }
                if newest.is_none_or(|(s, _)| h.serial > s) {
                    newest = Some((h.serial, i));
                }
            }
            Err(e) => println!("checkpoint slot {i}: invalid: {e}"),
        }
    }
    if let Some((_, i)) = newest {
        let (_, usage) = slots[i].as_ref().unwrap();
        let mut counts = [0u32; 4];
        for (_, u) in usage.iter() {
            counts[u.state as usize] += 1;
        }
        let (h, usage) = slots[i].as_ref().unwrap();
        let seg_bytes = g.segment_bytes();
        let dirty_bytes = counts[3] as u64 * seg_bytes;
        let dirty_live: u64 = usage
            .iter()
            .filter(|(_, u)| u.state == SegmentState::Dirty)
            .map(|(_, u)| u.live_bytes as u64)
            .sum();
        println!(
            "segment usage (slot {i}): {} clean, {} next, {} active, {} dirty; {} live bytes",
            counts[0],
            counts[1],
            counts[2],
            counts[3],
            usage.live_bytes_total()
        );
        if counts[3] > 0 {
            println!(
                "  dirty segments {:.1}% live on average; {} dead bytes the cleaner can reclaim",
                100.0 * dirty_live as f64 / dirty_bytes as f64,
                dirty_bytes - dirty_live
            );
            let mut hist = [0u32; 10];
            for (_, u) in usage.iter().filter(|(_, u)| u.state == SegmentState::Dirty) {
                let d = (u.live_bytes as u64 * 10 / seg_bytes).min(9) as usize;
                hist[d] += 1;
            }
            let cells: Vec<String> = hist
                .iter()
                .enumerate()
                .map(|(d, n)| format!("{}-{}%: {n}", d * 10, d * 10 + 10))
                .collect();
            println!("  dirty segments by utilization: {}", cells.join(", "));
        }
        let cost = if h.user_bytes == 0 {
            "n/a".to_string()
        } else {
            format!(
                "{:.3}",
                (h.user_bytes + h.moved_bytes) as f64 / h.user_bytes as f64
            )
        };
        println!(
            "writes since mkfs: {} bytes by users, {} bytes moved by the cleaner; write cost (user + moved) / user = {cost}",
            h.user_bytes, h.moved_bytes
        );
        if all {
            for (s, u) in usage.iter().filter(|(_, u)| u.state != SegmentState::Clean) {
                println!(
                    "  segment {:>6}  {:<6?}  live {:>10}  last seq {}",
                    s.0, u.state, u.live_bytes, u.last_seq
                );
            }
        }
    }
    if let Some(seg) = segment {
        println!("segment {seg} summaries");
        let (partials, end) = segment_partials(&dev, &g, seg)?;
        for p in &partials {
            let h = &p.header;
            println!(
                "  page {}: epoch {} seq {} summary {} pages, data {} pages, next segment {}",
                h.page, h.epoch, h.seq, h.summary_pages, h.data_pages, h.next_segment
            );
            for r in &p.records {
                println!("    {r:?}");
            }
        }
        if let Some(why) = end {
            println!("  {why}; end of segment's log");
        }
    }
    Ok(())
}

/// The partial segments of segment `seg` as recovery reads them (summary
/// verified), in log order, up to the first page without a valid one; and
/// why the scan ended before the segment's end, if it did.
fn segment_partials(
    dev: &FileDevice,
    g: &ldfs::lld::layout::Geometry,
    seg: u32,
) -> Result<(Vec<ldfs::lld::ScannedPartial>, Option<String>), Box<dyn std::error::Error>> {
    if seg >= g.segment_count {
        return Err(format!(
            "segment {seg} does not exist (the device has {})",
            g.segment_count
        )
        .into());
    }
    let mut out: Vec<ldfs::lld::ScannedPartial> = Vec::new();
    let mut page = 0;
    while page < g.segment_pages {
        match ldfs::lld::read_partial(dev, g, SegmentId(seg), page, ldfs::lld::Verify::Summary)? {
            Ok(p) => {
                page += p.header.total_pages();
                out.push(p);
            }
            Err(why) => return Ok((out, Some(format!("page {page}: no valid summary ({why})")))),
        }
    }
    Ok((out, None))
}

/// Which inode `inspect` is asked about.
#[derive(Clone, Copy)]
enum InodeTarget<'a> {
    Ino(u64),
    Path(&'a str),
}

fn inode_target(inode: Option<u64>, path: Option<&str>) -> Option<InodeTarget<'_>> {
    inode.map(InodeTarget::Ino).or(path.map(InodeTarget::Path))
}

/// One inode of an unmounted image (or dual pair, named by its data
/// device), opened read-only: its record and, for a list, where every
/// block lies: in the log (segment, byte, length, crc), or for a dual
/// pair's file data, the data block and its group.
fn inode_report(
    image: &std::path::Path,
    target: InodeTarget<'_>,
) -> Result<serde_json::Value, Box<dyn std::error::Error>> {
    use ldfs::ld::LogicalDisk;
    let dev: std::sync::Arc<dyn Device> = std::sync::Arc::new(FileDevice::open_read_only(image)?);
    let ro = LldOptions {
        read_only: true,
        ..Default::default()
    };
    if ldfs::dual::is_data_device(&*dev) {
        let meta_path = mount::dual_meta_path(&*dev, image, None)?;
        let meta: std::sync::Arc<dyn Device> =
            std::sync::Arc::new(FileDevice::open_read_only(&meta_path)?);
        let d = std::sync::Arc::new(ldfs::dual::Dual::open_for_fsck(meta, dev, ro)?);
        let ld: std::sync::Arc<dyn LogicalDisk> = d.clone();
        let geo = d.label().geo;
        return inode_report_on(ld, target, &|list, ix| {
            if let Some(b) = d.data_block(list, ix)? {
                return Ok(Some(serde_json::json!({
                    "index": ix,
                    "data_block": b,
                    "group": b / geo.group_blocks as u64,
                    "offset": geo.offset(b),
                })));
            }
            let eng = d.engine_list(list)?;
            log_block_json(d.meta(), eng, ix)
        });
    }
    let lld = std::sync::Arc::new(Lld::open(dev, ro)?);
    let ld: std::sync::Arc<dyn LogicalDisk> = lld.clone();
    inode_report_on(ld, target, &|list, ix| log_block_json(&lld, list, ix))
}

/// Where block `ix` of engine list `list` lies in the log, if it exists.
fn log_block_json(
    lld: &Lld,
    list: ldfs::ld::ListId,
    ix: u64,
) -> Result<Option<serde_json::Value>, Box<dyn std::error::Error>> {
    let g = *lld.geometry();
    let Some(e) = lld.map_entry(ldfs::lld::Key::new(list, ix))? else {
        return Ok(None);
    };
    Ok(Some(serde_json::json!({
        "index": ix,
        "segment": g.segment_of(e.offset()).map(|s| s.0),
        "offset": e.offset(),
        "length": e.len,
        "crc": format!("{:08x}", e.crc),
        "flags": e.flags,
    })))
}

type BlockLocator<'a> = dyn Fn(ldfs::ld::ListId, u64) -> Result<Option<serde_json::Value>, Box<dyn std::error::Error>>
    + 'a;

/// `inode_report` on an opened Logical Disk; `locate` says where a block
/// of a list lies.
fn inode_report_on(
    ld: std::sync::Arc<dyn ldfs::ld::LogicalDisk>,
    target: InodeTarget<'_>,
    locate: &BlockLocator<'_>,
) -> Result<serde_json::Value, Box<dyn std::error::Error>> {
    use ldfs::fs::{Fs, FsOptions, ROOT_INO};
    let fs = Fs::mount(
        ld.clone(),
        FsOptions {
            read_only: true,
            ..Default::default()
        },
    )?;
    let ino = match target {
        InodeTarget::Ino(n) => n,
        InodeTarget::Path(p) => {
            let mut ino = ROOT_INO;
            for part in p.split('/').filter(|c| !c.is_empty()) {
                ino = fs
                    .lookup(ino, part.as_bytes())
                    .map_err(|e| format!("{p}: {part}: {e}"))?
                    .ino;
            }
            ino
        }
    };
    let i = fs
        .inode_record(ino)
        .map_err(|e| format!("inode {ino}: {e}"))?;
    let mut blocks = Vec::new();
    if i.list != 0 {
        let list = ldfs::ld::ListId(i.list);
        let mut from = 0;
        loop {
            let idx = ld.indices(list, from, 1024)?;
            let Some(&last) = idx.last() else { break };
            for ix in idx {
                if let Some(b) = locate(list, ix)? {
                    blocks.push(b);
                }
            }
            from = last + 1;
        }
    }
    let t = |t: ldfs::fs::inode::Time| format!("{}.{:09}", t.secs, t.nsecs);
    Ok(serde_json::json!({
        "ino": i.ino,
        "generation": i.generation,
        "kind": format!("{:?}", i.kind()),
        "mode": format!("{:o}", i.mode),
        "uid": i.uid,
        "gid": i.gid,
        "nlink": i.nlink,
        "size": i.size,
        "parent": i.parent,
        "rdev": i.rdev,
        "atime": t(i.atime),
        "mtime": t(i.mtime),
        "ctime": t(i.ctime),
        "list": i.list,
        "inline_bytes": i.inline.len(),
        "xattrs": i.xattrs.iter().map(|(n, v)| serde_json::json!({
            "name": String::from_utf8_lossy(n),
            "bytes": v.len(),
            "list": v.list(),
        })).collect::<Vec<_>>(),
        "blocks": blocks,
    }))
}

/// The inode report as text.
fn inode_text(v: &serde_json::Value) -> String {
    let mut out = format!("inode {}\n", v["ino"]);
    for k in [
        "kind",
        "mode",
        "uid",
        "gid",
        "nlink",
        "size",
        "parent",
        "rdev",
        "generation",
        "atime",
        "mtime",
        "ctime",
        "list",
        "inline_bytes",
    ] {
        let val = &v[k];
        let shown = val.as_str().map_or(val.to_string(), str::to_string);
        out += &format!("  {k:<13}{shown}\n");
    }
    for x in v["xattrs"].as_array().into_iter().flatten() {
        out += &format!(
            "  xattr        {} ({} bytes)\n",
            x["name"].as_str().unwrap_or(""),
            x["bytes"]
        );
    }
    let blocks = v["blocks"].as_array().map_or(&[][..], |b| b.as_slice());
    if !blocks.is_empty() {
        out += &format!("  blocks of list {}:\n", v["list"]);
    }
    for b in blocks {
        if b.get("data_block").is_some() {
            out += &format!(
                "    index {:>10}  data block {:>12}  group {:>6}  byte {:>14}\n",
                b["index"], b["data_block"], b["group"], b["offset"]
            );
            continue;
        }
        out += &format!(
            "    index {:>10}  segment {:>6}  byte {:>14}  length {:>6}  crc {}\n",
            b["index"],
            b["segment"],
            b["offset"],
            b["length"],
            b["crc"].as_str().unwrap_or("")
        );
    }
    out
}

/// `ldfs inspect --json`: superblock, checkpoint slots, usage summary and,
/// if asked, one inode.
fn cmd_inspect_json(
    image: &std::path::Path,
    segment: Option<u32>,
    inode: Option<u64>,
    path: Option<&str>,
) -> CmdResult {
    let v = inspect_json_value(image, segment, inode, path)?;
    println!("{}", serde_json::to_string_pretty(&v)?);
    Ok(())
}

/// What `inspect --json` prints for a log.
fn inspect_json_value(
    image: &std::path::Path,
    segment: Option<u32>,
    inode: Option<u64>,
    path: Option<&str>,
) -> Result<serde_json::Value, Box<dyn std::error::Error>> {
    let dev = FileDevice::open_read_only(image)?;
    let (g, sb_errs) = read_superblock(&dev)?;
    let slots = read_checkpoints(&dev, &g)?;
    let slot_json: Vec<serde_json::Value> = slots
        .iter()
        .map(|s| match s {
            Ok((h, usage)) => {
                let mut counts = [0u32; 4];
                for (_, u) in usage.iter() {
                    counts[u.state as usize] += 1;
                }
                serde_json::json!({
                    "valid": true,
                    "serial": h.serial,
                    "epoch": h.epoch,
                    "next_seq": h.next_seq,
                    "log_segment": h.log_segment,
                    "log_page": h.log_page,
                    "next_segment": h.next_segment,
                    "next_list": h.next_list,
                    "map_entries": h.map_root.map(|(_, _, n)| n),
                    "user_bytes": h.user_bytes,
                    "moved_bytes": h.moved_bytes,
                    "segments": {
                        "clean": counts[0], "next": counts[1], "active": counts[2], "dirty": counts[3],
                    },
                    "live_bytes": usage.live_bytes_total(),
                })
            }
            Err(e) => serde_json::json!({ "valid": false, "error": e.to_string() }),
        })
        .collect();
    let mut v = serde_json::json!({
        "superblock": {
            "copies": sb_errs.iter().map(|e| e.as_ref().map_or("ok".to_string(), |e| e.to_string())).collect::<Vec<_>>(),
            "fs_id": format!("{:016x}", g.fs_id),
            "page_bytes": PAGE_BYTES,
            "total_pages": g.total_pages,
            "segment_pages": g.segment_pages,
            "segment_count": g.segment_count,
            "first_segment_page": g.first_segment_page,
            "checkpoint_pages": g.checkpoint_pages,
            "max_block_bytes": g.max_block_bytes,
            "reserved_segments": g.reserved_segments,
        },
        "checkpoints": slot_json,
    });
    if let Some(seg) = segment {
        let (partials, end) = segment_partials(&dev, &g, seg)?;
        let partials: Vec<serde_json::Value> = partials
            .iter()
            .map(|p| {
                serde_json::json!({
                    "page": p.header.page,
                    "epoch": p.header.epoch,
                    "seq": p.header.seq,
                    "summary_pages": p.header.summary_pages,
                    "data_pages": p.header.data_pages,
                    "next_segment": p.header.next_segment,
                    "records": p.records.iter().map(|r| format!("{r:?}")).collect::<Vec<_>>(),
                })
            })
            .collect();
        v["segment"] = serde_json::json!({ "segment": seg, "partials": partials, "end": end });
    }
    if let Some(t) = inode_target(inode, path) {
        v["inode"] = inode_report(image, t)?;
    }
    Ok(v)
}

/// What `ldfs clean` asks for, as the daemon receives it
/// (`trusted.ldfs.clean` = "POLICY MAX_UTILIZATION [SEGMENTS]").
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct CleanRequest {
    pub policy: PolicyKind,
    /// Percent: segments fuller than this are left alone.
    pub max_utilization: u32,
    pub segments: Option<u64>,
}

impl CleanRequest {
    pub fn encode(&self) -> String {
        let mut s = format!("{} {}", self.policy, self.max_utilization);
        if let Some(n) = self.segments {
            s += &format!(" {n}");
        }
        s
    }

    pub fn parse(s: &str) -> Result<CleanRequest, String> {
        let mut w = s.split_whitespace();
        let policy = w.next().ok_or("clean: no policy")?.parse()?;
        let max_utilization = w
            .next()
            .ok_or("clean: no utilization")?
            .parse()
            .ok()
            .filter(|&u| u <= 100)
            .ok_or_else(|| format!("clean: bad utilization in {s:?}"))?;
        let segments = w
            .next()
            .map(|n| {
                n.parse()
                    .map_err(|_| format!("clean: bad segment count in {s:?}"))
            })
            .transpose()?;
        if w.next().is_some() {
            return Err(format!("clean: trailing words in {s:?}"));
        }
        Ok(CleanRequest {
            policy,
            max_utilization,
            segments,
        })
    }
}

fn cmd_clean(
    target: PathBuf,
    req: CleanRequest,
    background: Option<String>,
    stop: bool,
) -> CmdResult {
    if req.max_utilization > 100 {
        return Err(format!(
            "--max-utilization {} is not a percentage",
            req.max_utilization
        )
        .into());
    }
    if target.is_dir() {
        // A mount point: the daemon does the work.
        if stop {
            control_set(&target, "stop", b"")?;
            println!("{}: cleaner stopped", target.display());
        } else if let Some(b) = background {
            control_set(
                &target,
                "background",
                format!("{b} {}", req.policy).as_bytes(),
            )?;
            println!(
                "{}: background cleaner {b} (policy {})",
                target.display(),
                req.policy
            );
        } else {
            control_set(&target, "clean", req.encode().as_bytes())?;
            print!(
                "{}",
                String::from_utf8_lossy(&control_get(&target, "clean")?)
            );
        }
        print!(
            "{}",
            String::from_utf8_lossy(&control_get(&target, "stats")?)
        );
        return Ok(());
    }
    if background.is_some() || stop {
        return Err(format!(
            "{}: --background and --stop need the mount point of a mounted ldfs",
            target.display()
        )
        .into());
    }
    let dev: std::sync::Arc<dyn Device> =
        std::sync::Arc::new(FileDevice::open(&target, FileDeviceOptions::default())?);
    let opts = LldOptions {
        cleaner: CleanerOptions {
            policy: req.policy,
            ..Default::default()
        },
        ..Default::default()
    };
    let lld = Lld::open(dev, opts)?;
    let (user0, _) = lld.write_totals();
    let sum = lld.clean_now(
        req.policy,
        req.segments,
        req.max_utilization as f64 / 100.0,
        &std::sync::atomic::AtomicBool::new(false),
    )?;
    let (_, moved1) = lld.write_totals();
    lld.close()?;
    println!("cleaned {} with {}: {sum}", target.display(), req.policy);
    if user0 > 0 {
        println!(
            "write cost since mkfs: {:.3}",
            (user0 + moved1) as f64 / user0 as f64
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{parse_size, CleanRequest, PolicyKind};

    /// clap's own consistency checks (duplicate short options and the
    /// like) run only in debug builds; `fsck -V` once clashed with
    /// `--version` there and panicked. In any build: -V prints the version
    /// and -v means verbose, for `ldfs fsck` and `fsck.ldfs` alike.
    #[test]
    fn the_command_line_is_well_formed() {
        use clap::{CommandFactory, Parser};
        super::Cli::command().debug_assert();
        super::fsck::FsckArgs::command().debug_assert();
        let e = super::fsck::FsckArgs::try_parse_from(["fsck.ldfs", "-V"]).unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::DisplayVersion);
        let a = super::fsck::FsckArgs::try_parse_from(["fsck.ldfs", "-v", "x.img"]).unwrap();
        assert!(a.verbose);
    }

    #[test]
    fn clean_requests_round_trip() {
        for r in [
            CleanRequest {
                policy: PolicyKind::Greedy,
                max_utilization: 80,
                segments: None,
            },
            CleanRequest {
                policy: PolicyKind::CostBenefit,
                max_utilization: 100,
                segments: Some(7),
            },
        ] {
            assert_eq!(CleanRequest::parse(&r.encode()).unwrap(), r);
        }
        for bad in [
            "",
            "greedy",
            "bogus 80",
            "greedy 101",
            "greedy 80 x",
            "greedy 80 1 2",
        ] {
            assert!(CleanRequest::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("2M").unwrap(), 2 << 20);
        assert_eq!(parse_size("1GiB").unwrap(), 1 << 30);
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("").is_err());
    }
}
