//! The `ldfs` command. Subcommands so far: `mkfs`, `inspect`, `clean`
//! (of an unmounted image), `bench engine` and `bench cleaner` (mount and
//! fsck follow; see the issues).

mod bench;
mod bench_cleaner;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use ldfs::device::{Device, FileDevice, FileDeviceOptions};
use ldfs::lld::layout::MkfsOptions;
use ldfs::lld::mkfs::{mkfs, read_checkpoints, read_superblock};
use ldfs::lld::summary::{self, Expect};
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
        /// Segments kept back for checkpoints and the cleaner (default: 1/16, 4..=64).
        #[arg(long)]
        reserved_segments: Option<u32>,
    },
    /// Print the superblock, both checkpoints, the segment usage table and,
    /// with --segment, that segment's partial-segment summaries.
    Inspect {
        image: PathBuf,
        #[arg(long)]
        segment: Option<u32>,
        /// Print every segment's usage entry, not only a summary of states.
        #[arg(long)]
        all_segments: bool,
    },
    /// Clean an unmounted image now: move the live blocks out of segments
    /// chosen by a policy until none at or below --max-utilization is left
    /// (or --segments were cleaned), then checkpoint and close.
    /// (Cleaning a mounted file system, `ldfs clean MOUNTPOINT`, comes with
    /// the FUSE layer.)
    Clean {
        image: PathBuf,
        /// greedy, cost-benefit or free-weighted.
        #[arg(long, default_value = "free-weighted")]
        policy: PolicyKind,
        /// Leave segments fuller than this percentage alone.
        #[arg(long, default_value_t = 80)]
        max_utilization: u32,
        /// Stop after cleaning this many segments.
        #[arg(long)]
        segments: Option<u64>,
    },
    /// Run a benchmark and print its figures.
    Bench {
        #[command(subcommand)]
        which: BenchCmd,
    },
}

#[derive(Subcommand)]
enum BenchCmd {
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
    /// The cleaner's figures (issue 3): write cost against utilization for
    /// uniform and hot-and-cold overwrites under each policy, and random
    /// 4 KiB synchronous overwrites at 80% utilization vs an empty file system.
    Cleaner {
        /// Directory for the synchronous-overwrite image (needs --sync-size free).
        #[arg(long, default_value = ".")]
        dir: PathBuf,
        /// Device size of the write-cost runs (in memory).
        #[arg(long, default_value = "128M", value_parser = parse_size)]
        size: u64,
        /// Segment size of the write-cost runs.
        #[arg(long, default_value = "512K", value_parser = parse_size)]
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
    },
}

fn parse_size(s: &str) -> Result<u64, String> {
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
    let cli = Cli::parse();
    let result = match cli.cmd {
        Cmd::Mkfs {
            image,
            size,
            segment_size,
            max_block,
            reserved_segments,
        } => cmd_mkfs(image, size, segment_size, max_block, reserved_segments),
        Cmd::Inspect {
            image,
            segment,
            all_segments,
        } => cmd_inspect(image, segment, all_segments),
        Cmd::Clean {
            image,
            policy,
            max_utilization,
            segments,
        } => cmd_clean(image, policy, max_utilization, segments),
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

fn cmd_mkfs(
    image: PathBuf,
    size: Option<u64>,
    segment_size: u64,
    max_block: u64,
    reserved: Option<u32>,
) -> CmdResult {
    let dev = match size {
        Some(size) => FileDevice::create(&image, size, FileDeviceOptions::default())?,
        None => FileDevice::open(&image, FileDeviceOptions::default())?,
    };
    let max_block_bytes =
        u32::try_from(max_block).map_err(|_| format!("--max-block {max_block} is too large"))?;
    let opts = MkfsOptions {
        segment_bytes: segment_size,
        max_block_bytes,
        reserved_segments: reserved,
        fs_id: 0,
    };
    let g = mkfs(&dev, &opts)?;
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
        if seg >= g.segment_count {
            return Err(format!(
                "segment {seg} does not exist (the device has {})",
                g.segment_count
            )
            .into());
        }
        println!("segment {seg} summaries");
        let mut page = 0;
        while page < g.segment_pages {
            let addr = g.page_addr(SegmentId(seg), page);
            let mut first = vec![0u8; PAGE_BYTES];
            dev.read_at(&mut first, addr)?;
            let ex = Expect {
                fs_id: g.fs_id,
                segment: seg,
                page,
                pages_left: g.segment_pages - page,
                segment_count: g.segment_count,
                max_block_bytes: g.max_block_bytes,
            };
            let h = match summary::decode_header(&first, addr, &ex) {
                Ok(h) => h,
                Err(e) => {
                    println!("  page {page}: no valid summary ({e}); end of segment's log");
                    break;
                }
            };
            let mut b = vec![0u8; h.summary_pages as usize * PAGE_BYTES];
            dev.read_at(&mut b, addr)?;
            println!(
                "  page {page}: epoch {} seq {} summary {} pages, data {} pages, next segment {}",
                h.epoch, h.seq, h.summary_pages, h.data_pages, h.next_segment
            );
            match summary::decode_records(&b, addr, h.summary_pages, h.data_pages) {
                Ok(records) => {
                    for r in records {
                        println!("    {r:?}");
                    }
                }
                Err(e) => {
                    println!("    records invalid: {e}");
                    break;
                }
            }
            page += h.total_pages();
        }
    }
    Ok(())
}

fn cmd_clean(
    image: PathBuf,
    policy: PolicyKind,
    max_utilization: u32,
    segments: Option<u64>,
) -> CmdResult {
    if max_utilization > 100 {
        return Err(format!("--max-utilization {max_utilization} is not a percentage").into());
    }
    let dev: std::sync::Arc<dyn Device> =
        std::sync::Arc::new(FileDevice::open(&image, FileDeviceOptions::default())?);
    let opts = LldOptions {
        cleaner: CleanerOptions {
            policy,
            ..Default::default()
        },
        ..Default::default()
    };
    let lld = Lld::open(dev, opts)?;
    let (clean0, _) = lld.clean_segment_counts();
    let (user0, moved0) = lld.write_totals();
    let limit = segments.unwrap_or(u64::MAX);
    let mut cleaned = 0u64;
    let mut blocks = 0u64;
    let mut idle_passes = 0;
    while cleaned < limit {
        let step = (limit - cleaned).min(16) as usize;
        let rep = lld.clean_below(policy, step, max_utilization as f64 / 100.0)?;
        if rep.victims.is_empty() {
            break;
        }
        cleaned += rep.released as u64;
        blocks += rep.blocks_moved;
        if rep.progress() {
            idle_passes = 0;
        } else {
            idle_passes += 1;
            if idle_passes >= 3 {
                // Victims that keep their live bytes: blocks held by
                // nothing we can move (should not happen on an unmounted
                // image) — stop rather than loop.
                break;
            }
        }
    }
    let (clean1, _) = lld.clean_segment_counts();
    let (_, moved1) = lld.write_totals();
    lld.close()?;
    println!(
        "cleaned {} with {policy}: {cleaned} segments released, {blocks} blocks ({} bytes) moved; clean segments {clean0} -> {clean1}",
        image.display(),
        moved1 - moved0
    );
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
    use super::parse_size;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("2M").unwrap(), 2 << 20);
        assert_eq!(parse_size("1GiB").unwrap(), 1 << 30);
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("").is_err());
    }
}
