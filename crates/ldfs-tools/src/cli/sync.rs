//! `ldfs sync MNT`: make everything written to a mounted ldfs durable,
//! including what still sits in the kernel's page cache.
//!
//! The daemon can flush only what reached it. The kernel does not pass
//! sync(2) or syncfs(2) on to a FUSE daemon, and syncfs does not wait for
//! FUSE writeback, so dirty pages of files that are still open (with
//! `-o writeback_cache`) or still mapped (shared writable mmap, in any mode)
//! would be missed. So this command, like fsync(2) called on each of them:
//! starts writeback of the whole file system (syncfs), then fsyncs every
//! regular file of the mount that any process holds open or mapped (found
//! under /proc: each fsync writes the file's dirty pages back, waits for
//! them, and reaches the daemon as FSYNC), and last fsyncs the mount's root
//! directory, which makes the daemon flush everything it has accepted. A
//! file closed before the call was written back by its close (FUSE's
//! FLUSH), so when this returns 0 everything written to the mount before it
//! started is durable.

use std::collections::HashSet;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Files of the file system on `dev` that processes hold open or mapped:
/// one /proc path per inode, through which the file can be opened again.
fn held_files(dev: u64) -> Vec<PathBuf> {
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return out;
    };
    for p in procs.flatten() {
        let name = p.file_name();
        if !name.to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        // Open descriptors, and mappings (map_files: root only, else
        // unreadable and skipped; a mapped file of one's own process is
        // usually also open).
        for sub in ["fd", "map_files"] {
            let Ok(entries) = std::fs::read_dir(p.path().join(sub)) else {
                continue;
            };
            for e in entries.flatten() {
                let path = e.path();
                // metadata() follows the magic link to the file itself.
                let Ok(m) = std::fs::metadata(&path) else {
                    continue;
                };
                if m.dev() == dev && m.file_type().is_file() && seen.insert(m.ino()) {
                    out.push(path);
                }
            }
        }
    }
    out
}

/// fsync of a file held by another process, reopened through /proc. A
/// process that has exited, or whose files this user may not open, is
/// skipped: its data is then covered by the final flush only if it
/// reached the daemon (always, without the writeback cache, except for
/// shared mappings).
fn fsync_held(path: &Path) -> Result<(), String> {
    let f = match File::open(path).or_else(|_| File::options().write(true).open(path)) {
        Ok(f) => f,
        Err(_) => return Ok(()),
    };
    match f.sync_all() {
        Ok(()) => Ok(()),
        // The file was deleted and released meanwhile.
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(()),
        Err(e) => Err(format!("fsync of an open file ({}): {e}", path.display())),
    }
}

pub fn run(mountpoint: &Path) -> Result<(), String> {
    let name = mountpoint.display();
    let root = File::open(mountpoint).map_err(|e| format!("{name}: {e}"))?;
    let dev = root.metadata().map_err(|e| format!("{name}: {e}"))?.dev();
    // Starts writeback of every dirty inode (it may not wait for FUSE's).
    if unsafe { libc::syncfs(root.as_raw_fd()) } != 0 {
        return Err(format!(
            "{name}: syncfs: {}",
            std::io::Error::last_os_error()
        ));
    }
    let mut failed = Vec::new();
    for p in held_files(dev) {
        if let Err(e) = fsync_held(&p) {
            failed.push(e);
        }
    }
    // Last: the daemon flushes everything accepted so far.
    root.sync_all().map_err(|e| format!("{name}: {e}"))?;
    if !failed.is_empty() {
        return Err(format!("{name}: {}", failed.join("; ")));
    }
    Ok(())
}
