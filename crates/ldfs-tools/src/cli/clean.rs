//! `ldfs clean`: clean an unmounted image now, or ask a mounted ldfs's
//! daemon to (and to start or stop its background cleaner).

use std::path::PathBuf;

use ldfs::device::{Device, FileDevice, FileDeviceOptions};
use ldfs::lld::{CleanerOptions, Lld, LldOptions, PolicyKind};

use super::control::{control_get, control_set};
use super::CmdResult;

/// The options of `ldfs clean`.
#[derive(clap::Args)]
pub struct CleanArgs {
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
}

pub fn run(a: CleanArgs) -> CmdResult {
    clean(
        a.image,
        CleanRequest {
            policy: a.policy,
            max_utilization: a.max_utilization,
            segments: a.segments,
        },
        a.background,
        a.stop,
    )
}

/// What `ldfs clean` asks for, as the daemon receives it
/// (`trusted.ldfs.clean` = "POLICY MAX_UTILIZATION [SEGMENTS]").
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CleanRequest {
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

fn clean(target: PathBuf, req: CleanRequest, background: Option<String>, stop: bool) -> CmdResult {
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
    // A store cache changes only under a mount holding the store's lease (cli/store_check).
    if let Some(n) = super::store_check::store_cache(&target)? {
        return Err(n.refusal(&target, "cleaning it offline").into());
    }
    // A mounted image has one writer, its daemon: refused (the daemon
    // cleans it: `ldfs clean MOUNTPOINT`), as `ldfs trim` and fsck are.
    let _lock =
        crate::fuse::mount::lock_image(&target, true, "ldfs clean").map_err(|e| e.to_string())?;
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
