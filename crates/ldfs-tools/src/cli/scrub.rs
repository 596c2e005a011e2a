//! `ldfs scrub MNT`: the daemon of a mounted ldfs reads every live block
//! (data, metadata, the map pages on the way) at a rate limit and verifies
//! every checksum (`ldfs::fs::scrub`); this command starts it, shows its
//! progress on a terminal, and reports each damaged block with the path
//! and offset of the file it belongs to, or the metadata it is.
//! Exit status: 0 clean, 4 damage found, 8 the scrub could not run (or was
//! interrupted).

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ldfs::fs::scrub::{Damage, ScrubReport};

use super::control::{control_get, control_set};

/// Damage entries the daemon hands out at most (its answer must fit an
/// extended attribute); the count is always whole.
const DAMAGE_SHOWN: usize = 200;

#[derive(clap::Args)]
pub struct ScrubArgs {
    /// The mount point of a mounted ldfs.
    mountpoint: PathBuf,
    /// Read at most this many bytes per second (K, M, G suffixes); default:
    /// as fast as the device goes.
    #[arg(long, value_parser = super::parse_size)]
    rate: Option<u64>,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

/// One damaged block, as the daemon's log and this command print it.
pub fn damage_text(d: &Damage) -> String {
    let whose = match &d.path {
        Some(p) => format!("{} (inode {})", String::from_utf8_lossy(p), d.ino),
        None if d.ino != 0 => format!("inode {} (no path reached it)", d.ino),
        None => format!("list {}", d.list),
    };
    let at = match d.kind {
        ldfs::fs::scrub::DamageKind::Data | ldfs::fs::scrub::DamageKind::XattrValue => {
            format!(" at offset {}", d.offset)
        }
        _ => String::new(),
    };
    format!(
        "{} of {whose}{at} (list {} block {}): {}",
        d.kind.name(),
        d.list,
        d.index,
        d.why
    )
}

fn damage_json(d: &Damage) -> serde_json::Value {
    serde_json::json!({
        "kind": d.kind.name(),
        "ino": d.ino,
        "path": d.path.as_ref().map(|p| String::from_utf8_lossy(p).into_owned()),
        "offset": d.offset,
        "list": d.list,
        "index": d.index,
        "why": d.why,
    })
}

/// The daemon's answer to a `scrub` query.
pub fn state_json(running: bool, runs: u64, r: &ScrubReport, error: Option<&str>) -> String {
    serde_json::json!({
        "running": running,
        "runs": runs,
        "blocks": r.blocks,
        "bytes": r.bytes,
        "total_bytes": r.total_bytes,
        "inodes": r.inodes,
        "stopped": r.stopped,
        "error": error,
        "damaged": r.damage.len(),
        "damage": r.damage.iter().take(DAMAGE_SHOWN).map(damage_json).collect::<Vec<_>>(),
    })
    .to_string()
}

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_interrupt(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::Relaxed);
}

fn query(mnt: &std::path::Path) -> Result<serde_json::Value, String> {
    let raw = control_get(mnt, "scrub").map_err(|e| e.to_string())?;
    serde_json::from_slice(&raw).map_err(|e| format!("the daemon's scrub state: {e}"))
}

pub fn main(a: ScrubArgs) -> ExitCode {
    match scrub(&a) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("ldfs scrub: {e}");
            ExitCode::from(8)
        }
    }
}

fn scrub(a: &ScrubArgs) -> Result<u8, String> {
    let mnt = &a.mountpoint;
    let runs_before = query(mnt)?["runs"].as_u64().unwrap_or(0);
    let cmd = match a.rate {
        Some(0) => return Err("--rate must be above 0".into()),
        Some(r) => format!("start {r}"),
        None => "start".into(),
    };
    control_set(mnt, "scrub", cmd.as_bytes()).map_err(|e| e.to_string())?;
    // ^C stops the daemon's scrub too.
    unsafe {
        libc::signal(
            libc::SIGINT,
            on_interrupt as *const () as libc::sighandler_t,
        );
        libc::signal(
            libc::SIGTERM,
            on_interrupt as *const () as libc::sighandler_t,
        );
    }
    let tty = std::io::stderr().is_terminal() && !a.json;
    let state = loop {
        std::thread::sleep(Duration::from_millis(200));
        if INTERRUPTED.load(Ordering::Relaxed) {
            control_set(mnt, "scrub", b"stop").map_err(|e| e.to_string())?;
        }
        let s = query(mnt)?;
        if s["runs"].as_u64().unwrap_or(0) <= runs_before {
            return Err("another scrub was started meanwhile".into());
        }
        if tty {
            let (b, t) = (
                s["bytes"].as_u64().unwrap_or(0),
                s["total_bytes"].as_u64().unwrap_or(0),
            );
            let pct = (b * 100).checked_div(t).unwrap_or(0).min(99);
            eprint!(
                "\rscrub {}: {pct}% ({} MiB of about {} MiB, {} damaged)   ",
                mnt.display(),
                b >> 20,
                t >> 20,
                s["damaged"]
            );
            let _ = std::io::stderr().flush();
        }
        if !s["running"].as_bool().unwrap_or(false) {
            break s;
        }
    };
    if tty {
        eprintln!();
    }
    if a.json {
        println!("{state}");
    } else {
        for d in state["damage"].as_array().into_iter().flatten() {
            let kind = d["kind"].as_str().unwrap_or("?");
            let whose = match d["path"].as_str() {
                Some(p) => format!("{p} (inode {})", d["ino"]),
                None => format!("inode {} / list {}", d["ino"], d["list"]),
            };
            println!(
                "damaged: {kind} of {whose}, offset {}, list {} block {}: {}",
                d["offset"],
                d["list"],
                d["index"],
                d["why"].as_str().unwrap_or("")
            );
        }
        let n = state["damaged"].as_u64().unwrap_or(0);
        if n as usize > DAMAGE_SHOWN {
            println!(
                "... and {} more (all in the daemon's log)",
                n as usize - DAMAGE_SHOWN
            );
        }
        println!(
            "{}: scrubbed {} blocks, {} bytes, {} inodes: {}",
            mnt.display(),
            state["blocks"],
            state["bytes"],
            state["inodes"],
            if n == 0 {
                "no damage".to_string()
            } else {
                format!("{n} damaged blocks")
            }
        );
    }
    if let Some(e) = state["error"].as_str() {
        return Err(format!("the scrub failed: {e}"));
    }
    if state["stopped"].as_bool().unwrap_or(false) {
        return Err("interrupted before the end".into());
    }
    Ok(if state["damaged"].as_u64().unwrap_or(0) > 0 {
        4
    } else {
        0
    })
}
