//! `ldfs snapshot MNT [--name NAME]` takes a snapshot of a mounted ldfs and
//! prints its number; `ldfs snapshot MNT --delete N` deletes one (refused
//! while a snapshot mount holds it). The daemon does both (docs/DESIGN.md
//! "Snapshots"): the command sends `trusted.ldfs.snapshot` =
//! "take TOKEN NAME" or "delete TOKEN N" and reads the result back from
//! `trusted.ldfs.snapshot.TOKEN`, its own even when several run at once.

use std::path::{Path, PathBuf};

use super::control::{control_get, control_set};
use super::CmdResult;

#[derive(clap::Args)]
pub struct SnapshotArgs {
    /// The mount point of a mounted ldfs (its live, read-write mount).
    #[arg(value_name = "MNT")]
    mountpoint: PathBuf,
    /// A name kept with the snapshot (at most 64 bytes).
    #[arg(long, conflicts_with = "delete")]
    name: Option<String>,
    /// Delete snapshot N instead (refused while it is mounted).
    #[arg(long, value_name = "N")]
    delete: Option<u64>,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

/// What the daemon is asked to do.
#[derive(Clone, Debug, PartialEq)]
pub enum SnapshotAction {
    Take { name: String },
    Delete { number: u64 },
}

/// A `snapshot` command as the daemon receives it.
#[derive(Clone, Debug, PartialEq)]
pub struct SnapshotRequest {
    /// Names the result (no spaces).
    pub token: String,
    pub action: SnapshotAction,
}

impl SnapshotRequest {
    pub fn encode(&self) -> String {
        match &self.action {
            SnapshotAction::Take { name } => format!("take {} {name}", self.token),
            SnapshotAction::Delete { number } => format!("delete {} {number}", self.token),
        }
    }

    pub fn parse(s: &str) -> Result<SnapshotRequest, String> {
        let (verb, rest) = s.split_once(' ').ok_or("snapshot: no token")?;
        // The name is everything after the token's space (it may hold
        // spaces of its own).
        let (token, arg) = rest.split_once(' ').unwrap_or((rest, ""));
        if token.is_empty() {
            return Err("snapshot: empty token".into());
        }
        let action = match verb {
            "take" => SnapshotAction::Take {
                name: arg.to_string(),
            },
            "delete" => SnapshotAction::Delete {
                number: arg
                    .parse()
                    .map_err(|_| format!("snapshot delete: {arg:?} is not a snapshot number"))?,
            },
            other => return Err(format!("snapshot: take or delete, not {other:?}")),
        };
        Ok(SnapshotRequest {
            token: token.to_string(),
            action,
        })
    }
}

/// A token no other `ldfs snapshot` running now has.
fn token() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{}-{nanos}", std::process::id())
}

/// Sends `req` and returns the daemon's result (JSON); a refusal is the
/// daemon's own message.
fn send(mnt: &Path, req: &SnapshotRequest) -> Result<serde_json::Value, String> {
    let sent = control_set(mnt, "snapshot", req.encode().as_bytes());
    let result = control_get(mnt, &format!("snapshot.{}", req.token))
        .ok()
        .and_then(|r| serde_json::from_slice::<serde_json::Value>(&r).ok());
    match (sent, result) {
        (_, Some(v)) if v["error"].is_string() => Err(format!(
            "{}: {}",
            mnt.display(),
            v["error"].as_str().unwrap_or_default()
        )),
        (Ok(()), Some(v)) => Ok(v),
        (Err(e), _) => Err(e.to_string()),
        (Ok(()), None) => Err(format!(
            "{}: the daemon did not report the snapshot's result",
            mnt.display()
        )),
    }
}

/// Whether the file system at `dir` is mounted read-only (the kernel then
/// refuses the control channel's setxattr).
fn read_only(dir: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: statvfs is plain data, filled by the call from a valid path.
    let mut sv: libc::statvfs = unsafe { std::mem::zeroed() };
    unsafe { libc::statvfs(c.as_ptr(), &mut sv) == 0 && sv.f_flag & libc::ST_RDONLY != 0 }
}

pub fn run(a: SnapshotArgs) -> CmdResult {
    let mnt = &a.mountpoint;
    if !mnt.is_dir() {
        return Err(format!(
            "{}: not a directory; snapshots are taken through the mount point of a mounted ldfs",
            mnt.display()
        )
        .into());
    }
    if read_only(mnt) {
        return Err(format!(
            "{} is mounted read-only (a snapshot mount, or remounted ro): snapshots are taken and deleted through the live read-write mount",
            mnt.display()
        )
        .into());
    }
    let action = match a.delete {
        Some(number) => SnapshotAction::Delete { number },
        None => {
            let name = a.name.unwrap_or_default();
            ldfs::lld::snapshot::check_name(&name)?;
            // What the kernel still caches must reach the daemon first, or
            // the snapshot would miss writes made before this command.
            super::sync::run(mnt)?;
            SnapshotAction::Take { name }
        }
    };
    let req = SnapshotRequest {
        token: token(),
        action,
    };
    let v = send(mnt, &req)?;
    if a.json {
        println!("{v}");
        return Ok(());
    }
    match req.action {
        // Only the number: `n=$(ldfs snapshot MNT)` in scripts.
        SnapshotAction::Take { .. } => println!("{}", v["number"]),
        SnapshotAction::Delete { number } => {
            println!("{}: snapshot {number} deleted", mnt.display())
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip_and_bad_ones_are_refused() {
        for action in [
            SnapshotAction::Take {
                name: "before upgrade".into(),
            },
            SnapshotAction::Take { name: "".into() },
            SnapshotAction::Delete { number: 12 },
        ] {
            let r = SnapshotRequest {
                token: "42-7".into(),
                action,
            };
            assert_eq!(SnapshotRequest::parse(&r.encode()).unwrap(), r);
        }
        for bad in [
            "",
            "take",
            "take ",
            "delete 1-2 x",
            "delete 1-2",
            "drop 1-2 3",
        ] {
            assert!(SnapshotRequest::parse(bad).is_err(), "{bad:?}");
        }
    }
}
