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
/// one /proc path per inode, through which the file can be opened again,
/// with the inode number it led to.
fn held_files(dev: u64) -> Vec<(PathBuf, u64)> {
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
                    out.push((path, m.ino()));
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
/// shared mappings). So is a descriptor that no longer leads to the file
/// listed (`dev`, `ino`): the process closed it and the number was reused,
/// perhaps for a pipe, whose fsync fails with EINVAL; the file's data was
/// written back by that close.
fn fsync_held(path: &Path, dev: u64, ino: u64) -> Result<(), String> {
    let f = match File::open(path).or_else(|_| File::options().write(true).open(path)) {
        Ok(f) => f,
        Err(_) => return Ok(()),
    };
    match f.metadata() {
        Ok(m) if m.dev() == dev && m.ino() == ino && m.file_type().is_file() => {}
        _ => return Ok(()),
    }
    match f.sync_all() {
        Ok(()) => Ok(()),
        // The file was deleted and released meanwhile.
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(()),
        Err(e) => Err(format!("fsync of an open file ({}): {e}", path.display())),
    }
}

/// Whether the file system at `mountpoint` is mounted read-only, by the mount table (a
/// read-only store mount a failed refresh left failing every request fails statfs too).
pub fn read_only(mountpoint: &Path) -> bool {
    // Made absolute without asking the mount (`canonicalize` stats it, and fails on one
    // failing every request).
    std::path::absolute(mountpoint)
        .ok()
        .and_then(|dir| crate::fuse::mount::top_mount(&dir))
        .is_some_and(|m| m.read_only)
}

/// `ldfs sync --remote` on a read-only mount of a store-backed file system: moves it to the
/// store's newest checkpoint now and prints what changed. While another caller waits for a
/// refresh the daemon answers busy at once (one waits at a time): asked again shortly.
pub fn refresh(mountpoint: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let t = std::time::Instant::now();
    loop {
        let said = super::control::control_get(mountpoint, "refresh")?;
        let said = String::from_utf8_lossy(&said).into_owned();
        if said.starts_with("busy:") && t.elapsed() < std::time::Duration::from_secs(600) {
            std::thread::sleep(std::time::Duration::from_millis(50));
            continue;
        }
        return match said.strip_prefix("failed: ") {
            Some(why) => Err(format!("{}: {why}", mountpoint.display()).into()),
            None => {
                println!("{}: {said}", mountpoint.display());
                Ok(())
            }
        };
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
    for (p, ino) in held_files(dev) {
        if let Err(e) = fsync_held(&p, dev, ino) {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A descriptor listed for a file of the mount and reused for a pipe
    /// before the fsync (snapshot_mount caught it: EINVAL) is skipped.
    #[test]
    fn a_reused_descriptor_is_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let file = File::create(dir.path().join("f")).unwrap();
        let m = file.metadata().unwrap();
        let mut fds = [0; 2];
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        let pipe = PathBuf::from(format!("/proc/self/fd/{}", fds[0]));
        // What the fsync would meet without the check.
        let e = File::open(&pipe).unwrap().sync_all().unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EINVAL));
        let r = fsync_held(&pipe, m.dev(), m.ino());
        unsafe {
            libc::close(fds[0]);
            libc::close(fds[1]);
        }
        assert_eq!(r, Ok(()));
        // The file itself is synced.
        let own = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
        assert_eq!(fsync_held(&own, m.dev(), m.ino()), Ok(()));
    }
}
