//! Scrub: read every live block of a mounted file system and verify its
//! checksum, naming each damaged block by what it is (issue 17).
//!
//! The walk goes through the Logical Disk, whose every read checks the
//! block against the checksum the layout holds for it (lld's map entry, the
//! dual layout's data pointer), so the map pages on the way are verified
//! too. It goes from the root down so that damage is reported with a path:
//! directory buckets, then each inode record, the file's blocks and its long
//! attribute values; then what no path reaches (orphans, inode records and
//! lists no walk met, including those created meanwhile).
//!
//! It only reads, through the same paths as every other reader, so it runs
//! beside normal use: a file deleted or changed meanwhile is skipped or read
//! as it is then, never reported as damage. Damaged metadata is reported,
//! not acted on: the file system finds it by itself when it is used (and
//! turns read-only then), and fsck repairs it.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::inode::{Inode, Kind, XattrValue, XATTR_CHUNK};
use super::{dir, BLOCK_BYTES, INODE_LIST, META_LIST, ORPHAN_LIST, ROOT_INO};
use crate::ld::{LdError, LdResult, ListId, LogicalDisk};

/// Blocks read with one `read_range`.
const CHUNK: usize = 64;

/// What a damaged block is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DamageKind {
    /// The file-system record (list 1).
    FsRecord,
    InodeRecord,
    DirectoryBucket,
    /// A block of a file's data.
    Data,
    /// A block of a long extended-attribute value.
    XattrValue,
    /// A block of a list no inode names.
    UnnamedList,
}

impl DamageKind {
    pub fn name(self) -> &'static str {
        match self {
            DamageKind::FsRecord => "file-system record",
            DamageKind::InodeRecord => "inode record",
            DamageKind::DirectoryBucket => "directory bucket",
            DamageKind::Data => "data",
            DamageKind::XattrValue => "extended attribute value",
            DamageKind::UnnamedList => "list no inode names",
        }
    }
}

/// One block that failed its read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Damage {
    pub kind: DamageKind,
    /// The inode it belongs to (0: none).
    pub ino: u64,
    /// A path of that inode from the root, if the walk reached it by one.
    pub path: Option<Vec<u8>>,
    /// The list and block index that failed.
    pub list: u64,
    pub index: u64,
    /// Byte offset in the file (data) or value (attribute) it holds.
    pub offset: u64,
    pub why: String,
}

/// What a scrub found, so far or in all.
#[derive(Clone, Debug, Default)]
pub struct ScrubReport {
    pub blocks: u64,
    pub bytes: u64,
    pub inodes: u64,
    /// Live bytes of the file system when the scrub started: how far
    /// `bytes` has to go (approximate: the tree changes meanwhile).
    pub total_bytes: u64,
    pub damage: Vec<Damage>,
    /// Stopped before the end (`ScrubOptions::stop`).
    pub stopped: bool,
}

#[derive(Default)]
pub struct ScrubOptions<'a> {
    /// Bytes per second at most (`None`: as fast as the device goes).
    pub rate: Option<u64>,
    /// Set to end the scrub early (unmount, a user's interrupt).
    pub stop: Option<&'a AtomicBool>,
}

struct Walk<'a> {
    ld: &'a dyn LogicalDisk,
    opts: &'a ScrubOptions<'a>,
    start: Instant,
    report: ScrubReport,
    progress: &'a mut dyn FnMut(&ScrubReport),
    last_progress: Instant,
    /// Inodes whose record was read.
    inodes: HashSet<u64>,
    /// Lists read (or named by an inode read).
    lists: HashSet<u64>,
}

/// Scrubs the file system on `ld`. `progress` is called every second or so
/// and at the end. Errors other than damage (a list that cannot be listed
/// because the engine failed) end the scrub with that error.
pub fn scrub(
    ld: &dyn LogicalDisk,
    opts: &ScrubOptions<'_>,
    progress: &mut dyn FnMut(&ScrubReport),
) -> LdResult<ScrubReport> {
    let now = Instant::now();
    let mut w = Walk {
        ld,
        opts,
        start: now,
        report: ScrubReport {
            total_bytes: ld.space().live_bytes,
            ..Default::default()
        },
        progress,
        last_progress: now,
        inodes: HashSet::new(),
        lists: [META_LIST.0, INODE_LIST.0, ORPHAN_LIST.0]
            .into_iter()
            .collect(),
    };
    w.run()?;
    (w.progress)(&w.report);
    Ok(w.report)
}

impl Walk<'_> {
    fn stopped(&mut self) -> bool {
        if self.opts.stop.is_some_and(|s| s.load(Ordering::Relaxed)) {
            self.report.stopped = true;
        }
        self.report.stopped
    }

    fn run(&mut self) -> LdResult<()> {
        if let Some(b) = self.read(META_LIST, 0, DamageKind::FsRecord, 0, None, 0) {
            self.account(b.len());
        }
        // Depth first from the root, with the path that reached each
        // directory.
        let mut stack: Vec<(Inode, Vec<u8>)> = Vec::new();
        if let Some(root) = self.inode(ROOT_INO, Some(b"/"))? {
            if root.kind() == Kind::Dir {
                stack.push((root, b"/".to_vec()));
            }
        }
        while let Some((di, path)) = stack.pop() {
            if self.stopped() {
                return Ok(());
            }
            let d = di.ino;
            for (index, bucket) in self.blocks(di.list, DamageKind::DirectoryBucket, d, &path)? {
                let entries = match dir::decode(&bucket, d, index) {
                    Ok(e) => e,
                    Err(c) => {
                        let why = c.to_string();
                        self.damage(
                            DamageKind::DirectoryBucket,
                            d,
                            Some(&path),
                            di.list,
                            index,
                            0,
                            why,
                        );
                        continue;
                    }
                };
                for e in entries {
                    if self.inodes.contains(&e.ino) {
                        continue;
                    }
                    let mut child = path.clone();
                    if child.len() > 1 {
                        child.push(b'/');
                    }
                    child.extend_from_slice(&e.name);
                    if let Some(ci) = self.inode(e.ino, Some(&child))? {
                        if ci.kind() == Kind::Dir {
                            stack.push((ci, child));
                        }
                    }
                }
            }
        }
        // Orphans and every other inode record no walk reached.
        for list in [ORPHAN_LIST, INODE_LIST] {
            let mut from = 0;
            loop {
                let idx = match self.ld.indices(list, from, 4096) {
                    Ok(v) => v,
                    Err(LdError::NoSuchList(_)) => break,
                    Err(e) => return Err(e),
                };
                let Some(&last) = idx.last() else {
                    break;
                };
                for ino in idx {
                    if self.stopped() {
                        return Ok(());
                    }
                    if !self.inodes.contains(&ino) {
                        self.inode(ino, None)?;
                    }
                }
                from = last + 1;
            }
        }
        // Lists no inode read names (leaked, or made meanwhile).
        let mut from = 1;
        loop {
            let lists = self.ld.lists(from, 4096)?;
            let Some(&last) = lists.last() else {
                break;
            };
            for l in lists {
                if self.stopped() {
                    return Ok(());
                }
                if self.lists.insert(l.0) {
                    self.blocks(l.0, DamageKind::UnnamedList, 0, b"")?;
                }
            }
            from = last.0 + 1;
        }
        Ok(())
    }

    /// Reads inode `ino`'s record and everything it names but a directory's
    /// buckets (the walk reads those). `None` when it is gone or damaged.
    fn inode(&mut self, ino: u64, path: Option<&[u8]>) -> LdResult<Option<Inode>> {
        if !self.inodes.insert(ino) {
            return Ok(None);
        }
        self.report.inodes += 1;
        let Some(raw) = self.read(INODE_LIST, ino, DamageKind::InodeRecord, ino, path, 0) else {
            return Ok(None);
        };
        self.account(raw.len());
        let i = match Inode::decode(ino, &raw, ino) {
            Ok(i) => i,
            Err(c) => {
                self.damage(
                    DamageKind::InodeRecord,
                    ino,
                    path,
                    INODE_LIST.0,
                    ino,
                    0,
                    c.to_string(),
                );
                return Ok(None);
            }
        };
        let path = path.unwrap_or(b"");
        for (_, v) in &i.xattrs {
            if let XattrValue::List { list, .. } = v {
                self.blocks(*list, DamageKind::XattrValue, ino, path)?;
            }
        }
        if i.list != 0 {
            if i.kind() == Kind::Dir {
                self.lists.insert(i.list);
            } else {
                self.blocks(i.list, DamageKind::Data, ino, path)?;
            }
        }
        Ok(Some(i))
    }

    /// Reads every block of `list`; returns them for a directory's buckets
    /// (and nothing otherwise, so a big file is not held in memory).
    fn blocks(
        &mut self,
        list: u64,
        kind: DamageKind,
        ino: u64,
        path: &[u8],
    ) -> LdResult<Vec<(u64, Vec<u8>)>> {
        self.lists.insert(list);
        let keep = kind == DamageKind::DirectoryBucket;
        // Byte offset of a block in what it holds (buckets: none).
        let block_bytes = match kind {
            DamageKind::XattrValue => XATTR_CHUNK as u64,
            DamageKind::Data | DamageKind::UnnamedList => BLOCK_BYTES,
            _ => 0,
        };
        let path = (!path.is_empty()).then_some(path);
        let mut out = Vec::new();
        let mut from = 0u64;
        loop {
            if self.stopped() {
                break;
            }
            let got = match self.ld.read_range(ListId(list), from..u64::MAX, CHUNK) {
                Ok(v) => v,
                Err(LdError::NoSuchList(_)) => break, // deleted meanwhile
                Err(_) => {
                    // Some block of the chunk failed: find which, one by one.
                    let idx = match self.ld.indices(ListId(list), from, CHUNK) {
                        Ok(v) => v,
                        Err(LdError::NoSuchList(_)) => break,
                        Err(e) => return Err(e),
                    };
                    let mut v = Vec::new();
                    for i in idx {
                        let off = i.saturating_mul(block_bytes);
                        if let Some(b) = self.read(ListId(list), i, kind, ino, path, off) {
                            v.push((i, b));
                        } else {
                            // Keep the walk moving past the damaged block.
                            v.push((i, Vec::new()));
                        }
                    }
                    v
                }
            };
            let Some(&(last, _)) = got.last() else {
                break;
            };
            for (i, b) in got {
                if b.is_empty() {
                    continue;
                }
                self.account(b.len());
                if keep {
                    out.push((i, b));
                }
            }
            from = last + 1;
        }
        Ok(out)
    }

    /// One block; damage is reported and gives `None`, as does a block or
    /// list that is gone.
    fn read(
        &mut self,
        list: ListId,
        index: u64,
        kind: DamageKind,
        ino: u64,
        path: Option<&[u8]>,
        offset: u64,
    ) -> Option<Vec<u8>> {
        match self.ld.read(list, index) {
            Ok(b) => b,
            Err(LdError::NoSuchList(_)) => None,
            Err(e) => {
                self.damage(kind, ino, path, list.0, index, offset, e.to_string());
                None
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn damage(
        &mut self,
        kind: DamageKind,
        ino: u64,
        path: Option<&[u8]>,
        list: u64,
        index: u64,
        offset: u64,
        why: String,
    ) {
        self.report.damage.push(Damage {
            kind,
            ino,
            path: path.map(|p| p.to_vec()),
            list,
            index,
            offset,
            why,
        });
    }

    /// Counts a block read, calls `progress` about once a second, and keeps
    /// to the rate limit.
    fn account(&mut self, bytes: usize) {
        self.report.blocks += 1;
        self.report.bytes += bytes as u64;
        if let Some(rate) = self.opts.rate.filter(|&r| r > 0) {
            let due = Duration::from_secs_f64(self.report.bytes as f64 / rate as f64);
            let spent = self.start.elapsed();
            // In slices, so that a stop (unmount) is seen within 100 ms
            // even at a rate of a few bytes a second.
            let mut left = due.saturating_sub(spent);
            while !left.is_zero() && !self.opts.stop.is_some_and(|s| s.load(Ordering::Relaxed)) {
                let nap = left.min(Duration::from_millis(100));
                std::thread::sleep(nap);
                left -= nap;
            }
        }
        if self.last_progress.elapsed() >= Duration::from_secs(1) {
            self.last_progress = Instant::now();
            (self.progress)(&self.report);
        }
    }
}
