//! The `ldfs` command: `mkfs`, `mount` (also as the mount helper
//! `mount.fuse.ldfs`), `fsck` (also as `fsck.ldfs`), `sync`, `stats`,
//! `checkpoint`, `snapshot`, `checkpoints`, `clean`, `scrub`, `trim`, `resize`, `inspect` and `bench`
//! (engine, cleaner, fs, ...):
//! one module per command, each parsing its own options and doing its work;
//! `main` only dispatches.

pub mod bench;
pub mod checkpoint;
pub mod checkpoints;
pub mod clean;
pub mod control;
pub mod fsck;
pub mod inspect;
pub mod mkfs;
pub mod mount;
pub mod resize;
pub mod scrub;
pub mod snapshot;
pub mod stats;
pub mod store;
pub mod store_check;
pub mod sync;
pub mod trim;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

pub type CmdResult = Result<(), Box<dyn std::error::Error>>;

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
    Mkfs(mkfs::MkfsArgs),
    /// Check an image (both superblocks, both checkpoints, every summary and
    /// live block's checksum, the map against the summaries, the usage
    /// table, the file tree) and with -y or -p repair it. Exit codes as
    /// fsck(8): 0 clean, 1 corrected, 4 errors left, 8 operational error,
    /// 16 usage error, 32 cancelled.
    Fsck(fsck::FsckArgs),
    /// Print the superblock, both checkpoints, the segment usage table and,
    /// with --segment, that segment's partial-segment summaries.
    Inspect(inspect::InspectArgs),
    /// Mount an image through FUSE. Returns once mounted and serves in the
    /// background; unmount with `fusermount3 -u DIR` or `umount DIR`.
    /// IMAGE may be a store, s3://BUCKET[/PREFIX] (made by `ldfs mkfs
    /// --store`), with --cache PATH: a read-write mount holds the store's
    /// lease while mounted (a second one anywhere is refused naming the
    /// holder), an empty or absent cache is made ready from the store
    /// (segments fetched as read; a read-only mount pins the newest uploaded
    /// checkpoint and shows it until it is mounted again), and a read-write
    /// mount's unmount waits for the final checkpoint's upload.
    Mount {
        image: PathBuf,
        dir: PathBuf,
        /// A store mount's local cache and write log (file or block device).
        #[arg(long)]
        cache: Option<PathBuf>,
        /// A store mount: the most bytes of segments the cache holds (e.g.
        /// 10G); segments the store holds are evicted, least recently used
        /// first, and fetched again when read. Remembered in the cache's
        /// note for later mounts (default: the note's, else the file
        /// system's size).
        #[arg(long, requires = "cache", value_parser = parse_size)]
        cache_size: Option<u64>,
        /// A store mount: take over a lease that expired without being
        /// released (its holder crashed or lost the store).
        #[arg(long)]
        force_takeover: bool,
        /// Stay in the foreground (SIGINT/SIGTERM unmount).
        #[arg(short = 'f', long)]
        foreground: bool,
        /// Options: ro, rw, allow_other, cache=SIZE (map memory, default 64M),
        /// commit=SECONDS (default 5), writeback_cache (faster small writes,
        /// but a full file system is then seen at writeback, not by
        /// write(2): see the README), cleaner=POLICY|off, clean_start=N,
        /// clean_stop=N (clean-segment watermarks), dev, nodev, suid, nosuid,
        /// exec, noexec, atime, noatime, sync, async; ro,snapshot=N mounts
        /// snapshot (or protected checkpoint) N read-only beside the live
        /// mount; protect=DURATION keeps a protected checkpoint every
        /// DURATION/8 for DURATION (they yield when space runs short).
        /// A store mount: upload=SECONDS (a checkpoint uploaded at least
        /// that often while there are changes; default 30), lease=SECONDS
        /// (default 300), upload_backlog=SIZE (writers wait while uploads
        /// are behind by more; default a quarter of the file system, or half the --cache-size);
        /// read-only, refresh=SECONDS (moves to the store's newest upload that often; default
        /// 30, 0: only at `ldfs sync --remote` on it).
        #[arg(short = 'o', value_name = "OPTIONS")]
        options: Vec<String>,
        #[arg(long, hide = true)]
        daemon_child: bool,
    },
    /// Make everything written to a mounted ldfs before this call durable,
    /// open files included (the kernel does not pass sync(2) on to FUSE
    /// file systems).
    Sync {
        mountpoint: PathBuf,
        /// A store-backed mount: return when everything written before
        /// this call is in the store (a checkpoint, and its upload). On a
        /// read-only mount of one: move it to the store's newest checkpoint
        /// now (as `-o refresh=` does periodically) and say what changed.
        #[arg(long)]
        remote: bool,
    },
    /// Print a mounted ldfs's figures: cleaner (policy, watermarks, segments
    /// cleaned, blocks moved, write cost), segments, space, checkpoints;
    /// on a store mount the upload backlog, bytes in the store, the last
    /// uploaded checkpoint and its age, and the lease.
    Stats {
        mountpoint: PathBuf,
        /// Print a JSON object (space, checkpoints, and "store").
        #[arg(long)]
        json: bool,
    },
    /// Write a checkpoint of a mounted ldfs now (the next mount, even after
    /// a crash, then has nothing to roll forward).
    Checkpoint { mountpoint: PathBuf },
    /// Take a snapshot of a mounted ldfs now (a checkpoint kept until it is
    /// deleted; mount it with -o ro,snapshot=N) and print its number, or
    /// delete one with --delete N (refused while it is mounted).
    Snapshot(snapshot::SnapshotArgs),
    /// List the snapshots of a mounted ldfs or an unmounted image, and its
    /// newest checkpoint: number, time, name, the space only it holds.
    Checkpoints(checkpoints::CheckpointsArgs),
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
    Clean(clean::CleanArgs),
    /// Read every live block of a mounted ldfs and verify its checksum.
    Scrub(scrub::ScrubArgs),
    /// Give every clean segment back to the storage (fstrim).
    Trim(trim::TrimArgs),
    /// Grow an unmounted image or a mounted ldfs to SIZE (8G, +1G; omitted:
    /// the device's size), or shrink an unmounted image (-1G): its live
    /// data is moved out of the segments cut off first, and the shrink is
    /// refused when it does not fit or a snapshot holds them.
    Resize(resize::ResizeArgs),
    /// Run a benchmark and print its figures.
    Bench {
        #[command(subcommand)]
        which: bench::BenchCmd,
    },
}

pub fn parse_size(s: &str) -> Result<u64, String> {
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

/// The `ldfs` program (and `mount.fuse.ldfs`, `fsck.ldfs`, by the name it
/// was run as).
pub fn main() -> ExitCode {
    let argv0 = std::env::args().next().unwrap_or_default();
    if argv0.ends_with("mount.fuse.ldfs") || argv0.ends_with("mount.ldfs") {
        return mount::helper();
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
    let result = match Cli::parse().cmd {
        Cmd::Mkfs(a) => mkfs::run(a),
        Cmd::Inspect(a) => inspect::run(a),
        Cmd::Mount {
            image,
            dir,
            cache,
            cache_size,
            force_takeover,
            foreground,
            options,
            daemon_child,
        } => crate::fuse::mount::run(
            image,
            dir,
            foreground,
            options,
            daemon_child,
            crate::fuse::mount::StoreArgs {
                cache,
                cache_size,
                force_takeover,
            },
        )
        .map_err(Into::into),
        Cmd::Fsck(_) => unreachable!("fsck is dispatched before the other commands"),
        Cmd::BenchMemfs {
            dir,
            writeback_cache,
            flush_file,
            uring,
        } => crate::bench::memfs::serve(&dir, writeback_cache, flush_file.as_deref(), uring)
            .map_err(Into::into),
        Cmd::Stats { mountpoint, json } => stats::run(&mountpoint, json),
        Cmd::Checkpoint { mountpoint } => checkpoint::run(&mountpoint),
        Cmd::Snapshot(a) => snapshot::run(a),
        Cmd::Checkpoints(a) => checkpoints::run(a),
        Cmd::Sync { mountpoint, remote } => match (remote, sync::read_only(&mountpoint)) {
            (false, _) => sync::run(&mountpoint).map_err(Into::into),
            (true, false) => sync::run(&mountpoint)
                .map_err(Into::into)
                .and_then(|()| control::control_set(&mountpoint, "upload", b"")),
            // A read-only mount has nothing to flush, and one a failed refresh left failing
            // every request answers only the refresh query (review 49 finding 3). The kernel
            // refuses setxattr on a read-only mount: a query.
            (true, true) => sync::refresh(&mountpoint),
        },
        Cmd::Clean(a) => clean::run(a),
        Cmd::Scrub(a) => return scrub::main(a),
        Cmd::Trim(a) => trim::run(a),
        Cmd::Resize(a) => resize::run(a),
        Cmd::Bench { which } => bench::run(which),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ldfs: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::clean::CleanRequest;
    use super::parse_size;
    use ldfs::lld::PolicyKind;

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
