//! `ldfs checkpoints MNT|IMAGE`: the checkpoints a file system keeps (its
//! snapshots) and its newest one, with the space each snapshot alone holds
//! and where it is mounted (docs/DESIGN.md "Snapshots"). Through the
//! daemon of a mounted ldfs, or on an unmounted image opened read-only
//! under its shared lock (as `fsck -n`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ldfs::device::{Device, FileDevice};
use ldfs::ld::LogicalDisk;
use ldfs::lld::{Lld, LldOptions};
use serde_json::{json, Value};

use super::control::control_get;
use super::CmdResult;

#[derive(clap::Args)]
pub struct CheckpointsArgs {
    /// The mount point of a mounted ldfs, or an unmounted image.
    #[arg(value_name = "MNT|IMAGE")]
    target: PathBuf,
    /// Print the list as JSON.
    #[arg(long)]
    json: bool,
}

/// The listing of `lld` (an engine of `image`; `at` the snapshot it was
/// opened at, for a snapshot mount) as JSON: what `--json` prints.
pub(crate) fn listing(lld: &Lld, image: &Path, at: Option<u64>) -> Value {
    let sp = lld.space();
    let mut rows: Vec<Value> = lld
        .snapshots()
        .iter()
        .map(|s| {
            json!({
                "number": s.number,
                "time": s.time_secs,
                "snapshot": !s.protected,
                "protected": s.protected,
                "name": s.name,
                "held_alone_bytes": s.held_alone_bytes,
                "map_entries": s.entries,
                "mounted_on": crate::fuse::mount::snapshot_mounted_on(image, s.number),
            })
        })
        .collect();
    // The live tree's base, unless it is a snapshot itself: never kept
    // (the cleaner reclaims what only it held once a newer checkpoint is
    // durable), so not mountable.
    let newest = lld.checkpoint_serial();
    if rows.last().is_none_or(|r| r["number"] != newest) {
        rows.push(json!({
        "number": newest,
        "time": null,
        "snapshot": false,
        "protected": false,
        "name": "",
        "held_alone_bytes": 0,
        "map_entries": null,
        "mounted_on": [],
        }));
    }
    json!({
        "image": image.display().to_string(),
        "opened_at_snapshot": at,
        "newest_checkpoint": newest,
        "checkpoints": rows,
        "max_snapshots": ldfs::lld::snapshot::MAX_SNAPSHOTS,
        "history_bytes": lld.history_bytes(),
        "live_bytes": sp.live_bytes,
        "capacity_bytes": sp.capacity_bytes,
        "available_bytes": sp.available_bytes,
    })
}

/// Seconds since 1970 as local time, `2026-11-26 23:50:01 +0000`.
pub(crate) fn time_text(secs: u64) -> String {
    let t = secs as libc::time_t;
    // SAFETY: tm is plain data; localtime_r fills it from a valid time_t.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    if unsafe { libc::localtime_r(&t, &mut tm) }.is_null() {
        return format!("@{secs}");
    }
    let off = tm.tm_gmtoff / 60;
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02}:{:02} {}{:02}{:02}",
        tm.tm_year + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec,
        if off < 0 { '-' } else { '+' },
        off.abs() / 60,
        off.abs() % 60
    )
}

/// Bytes for people: `0`, `812 KiB`, `1.5 GiB`.
pub(crate) fn bytes_text(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else if v < 10.0 {
        format!("{v:.1} {}", UNITS[u])
    } else {
        format!("{v:.0} {}", UNITS[u])
    }
}

/// The listing as a table.
pub(crate) fn text(v: &Value) -> String {
    let rows = v["checkpoints"].as_array().cloned().unwrap_or_default();
    let snaps = rows.iter().filter(|r| r["snapshot"] == true).count();
    let protected = rows.iter().filter(|r| r["protected"] == true).count();
    let mut t = format!(
        "{}: {snaps} snapshots and {protected} protected checkpoints kept (at most {} in all); history holds {}, live data {}, available {}\n",
        v["image"].as_str().unwrap_or_default(),
        v["max_snapshots"],
        bytes_text(v["history_bytes"].as_u64().unwrap_or(0)),
        bytes_text(v["live_bytes"].as_u64().unwrap_or(0)),
        bytes_text(v["available_bytes"].as_u64().unwrap_or(0)),
    );
    if let Some(n) = v["opened_at_snapshot"].as_u64() {
        t += &format!("(as this mount of snapshot {n} found them when it was mounted)\n");
    }
    t += &format!(
        "{:>8}  {:<10}  {:<25}  {:>13}  NAME\n",
        "NUMBER", "KIND", "TIME", "ONLY IT HOLDS"
    );
    for r in &rows {
        let protected = r["protected"] == true;
        let snapshot = r["snapshot"] == true || protected;
        let time = r["time"].as_u64().map_or("-".to_string(), time_text);
        let held = if snapshot {
            bytes_text(r["held_alone_bytes"].as_u64().unwrap_or(0))
        } else {
            "-".to_string()
        };
        let mut name = if protected {
            "(yields when space runs short)".to_string()
        } else if snapshot {
            r["name"].as_str().unwrap_or_default().to_string()
        } else {
            "(the newest: the live tree's; not kept)".to_string()
        };
        let on: Vec<&str> = r["mounted_on"]
            .as_array()
            .map(|a| a.iter().filter_map(|d| d.as_str()).collect())
            .unwrap_or_default();
        if !on.is_empty() {
            name += &format!("  [mounted on {}]", on.join(", "));
        }
        t += &format!(
            "{:>8}  {:<10}  {:<25}  {:>13}  {name}\n",
            r["number"].as_u64().unwrap_or(0),
            if protected {
                "protected"
            } else if snapshot {
                "snapshot"
            } else {
                "checkpoint"
            },
            time,
            held
        );
    }
    t
}

pub fn run(a: CheckpointsArgs) -> CmdResult {
    let target = &a.target;
    let v: Value = if target.is_dir() {
        let raw = control_get(target, "checkpoints")?;
        serde_json::from_slice(&raw).map_err(|e| format!("the daemon's checkpoint list: {e}"))?
    } else {
        open_image(target)?
    };
    if a.json {
        println!("{v}");
    } else {
        print!("{}", text(&v));
    }
    Ok(())
}

/// The listing of an unmounted image: opened read-only, under the image's
/// shared lock (a live mount holds it exclusively: then its mount point is
/// named).
fn open_image(image: &Path) -> Result<Value, String> {
    use crate::fuse::mount::{lock_image, LockError};
    let _lock = lock_image(image, false, "ldfs checkpoints").map_err(|e| match e {
        LockError::Mounted { image, on } => format!(
            "{} is mounted on {}: run `ldfs checkpoints {}`",
            image.display(),
            on.display(),
            on.display()
        ),
        e => e.to_string(),
    })?;
    let dev: Arc<dyn Device> = Arc::new(
        FileDevice::open_read_only(image).map_err(|e| format!("{}: {e}", image.display()))?,
    );
    if ldfs::dual::is_data_device(&*dev) {
        return Err(format!(
            "{} is the data device of a dual file system, which has no snapshots",
            image.display()
        ));
    }
    let lld = Lld::open(
        dev,
        LldOptions {
            read_only: true,
            ..Default::default()
        },
    )
    .map_err(|e| format!("{}: {e}", image.display()))?;
    let canon = std::fs::canonicalize(image).unwrap_or_else(|_| image.to_path_buf());
    let v = listing(&lld, &canon, None);
    lld.close().map_err(|e| e.to_string())?;
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_read_as_people_write_them() {
        assert_eq!(bytes_text(0), "0 B");
        assert_eq!(bytes_text(1023), "1023 B");
        assert_eq!(bytes_text(1536), "1.5 KiB");
        assert_eq!(bytes_text(300 << 20), "300 MiB");
        assert_eq!(bytes_text(3 << 40), "3.0 TiB");
    }

    #[test]
    fn a_listing_reads_as_a_table() {
        let v = json!({
            "image": "/i",
            "opened_at_snapshot": null,
            "max_snapshots": 24,
            "history_bytes": 2048,
            "live_bytes": 4096,
            "available_bytes": 1 << 20,
            "checkpoints": [
                {"number": 7, "time": 0, "snapshot": true, "name": "before",
                 "held_alone_bytes": 2048, "mounted_on": ["/mnt/s"]},
                {"number": 8, "time": 5, "snapshot": false, "protected": true, "name": "",
                 "held_alone_bytes": 0, "mounted_on": []},
                {"number": 9, "time": null, "snapshot": false, "name": "",
                 "held_alone_bytes": 0, "mounted_on": []},
            ],
        });
        let t = text(&v);
        assert!(
            t.starts_with("/i: 1 snapshots and 1 protected checkpoints kept (at most 24 in all); history holds 2.0 KiB"),
            "{t}"
        );
        let lines: Vec<&str> = t.lines().collect();
        assert!(
            lines[2].contains("snapshot") && lines[2].contains("before"),
            "{t}"
        );
        assert!(lines[2].contains("[mounted on /mnt/s]"), "{t}");
        assert!(
            lines[3].contains("protected") && lines[3].contains("yields"),
            "{t}"
        );
        assert!(
            lines[4].contains("checkpoint") && lines[4].contains("not kept"),
            "{t}"
        );
    }
}
