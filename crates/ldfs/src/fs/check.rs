//! The file-tree consistency check and its repairs (the fs half of fsck; the
//! check runs in the crash tests after every recovery): every entry names a
//! live inode of the kind it says; every directory's `..`, entry count and
//! link count are right; every inode's link count equals the entries naming
//! it; every inode is reachable from the root or recorded as an orphan;
//! every list an inode names exists, and every list is named by an inode
//! (or is one of the file system's own); every long attribute value's list
//! holds it whole; every bucket decodes.
//!
//! `check` reads only and returns typed [`Finding`]s (and their text).
//! `repair` acts on them through the normal write paths, one ARU per fix,
//! so a crash during a repair leaves a consistent image that a second run
//! finishes. It works in rounds, each starting from a fresh check: first
//! the structure (damaged buckets rebuilt from what can be salvaged,
//! entries naming no inode dropped, kinds corrected, second links to a
//! directory dropped, undecodable unreachable inode records deleted,
//! unreachable inodes reattached under `/lost+found`, lists no inode
//! names deleted when empty and otherwise reattached as regular files
//! `/lost+found/#list-N` holding their blocks, missing lists replaced by
//! empty ones, attributes whose long value's list is missing or damaged
//! dropped), then, once the structure is sound, the counts (`..`, entry
//! counts, link counts). The number of rounds is bounded. `repair_base`
//! comes first when a mount fails: the file-system record and the root.

use std::collections::{HashMap, HashSet};
use std::fmt;

use super::inode::{Inode, Kind, XATTR_CHUNK};
use super::{
    dir, encode_fs_record, Ctx, Fs, FsError, FsResult, BLOCK_BYTES, INODE_LIST, INO_BATCH,
    MAX_FILE_BYTES, META_LIST, ORPHAN_LIST, ROOT_INO,
};
use crate::ld::{LdError, ListHints, ListId, ListKind, LogicalDisk, Temperature};

/// Bytes a repair step reserves (`Fs::begin_repair`).
const REPAIR_RESERVE: u64 = 256 << 10;

/// Name of the directory under the root that receives unreachable inodes.
pub const LOST_FOUND: &[u8] = b"lost+found";
/// Repair rounds before giving up (each round fixes a class of damage and
/// the next round checks again).
const REPAIR_ROUNDS: usize = 8;

/// One inconsistency, with what a repair needs to act on it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Finding {
    /// A directory bucket cannot be read or does not decode.
    BadBucket { dir: u64, index: u64, why: String },
    /// An entry names an inode that does not exist or cannot be decoded.
    Dangling {
        dir: u64,
        name: Vec<u8>,
        ino: u64,
        why: String,
    },
    /// An entry's kind differs from its inode's (`kind`: the inode's code).
    WrongKind {
        dir: u64,
        name: Vec<u8>,
        ino: u64,
        kind: u8,
    },
    /// A second entry naming a directory already linked elsewhere.
    DirLinkedTwice { dir: u64, name: Vec<u8>, ino: u64 },
    /// A directory whose `..` is not the directory it is in.
    WrongParent { ino: u64, says: u64, parent: u64 },
    /// A directory whose entry count is wrong.
    DirSize { dir: u64, says: u64, entries: u64 },
    /// An inode whose link count is wrong.
    Nlink { ino: u64, says: u32, expected: u32 },
    /// An inode reachable from no directory and not an orphan.
    Unreachable { ino: u64 },
    /// An inode record that is reachable from nowhere and does not decode.
    BadInode { ino: u64, why: String },
    /// A list exists that no inode record names (its inode record was lost,
    /// or a crash or bug left it behind).
    LeakedList { list: u64, blocks: bool },
    /// An inode names a list that does not exist.
    MissingList { ino: u64, list: u64 },
    /// A long attribute value's list that does not hold the value: a block
    /// missing, damaged or of the wrong length (the value is unreadable).
    BadValueList { ino: u64, list: u64, why: String },
    /// A long attribute value's list that another inode also holds, as its
    /// own list or a value's (a damaged record): the value cannot be the
    /// list's contents, and deleting "its" list with the attribute would
    /// destroy the other's.
    SharedValueList { ino: u64, list: u64, with: u64 },
    /// Something a repair cannot fix (device errors, an undecodable root
    /// left after `repair_base`).
    Unfixable(String),
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        match self {
            Finding::BadBucket { dir, index, why } => {
                write!(
                    f,
                    "directory {dir}: damaged directory index (bucket {index}): {why}"
                )
            }
            Finding::Dangling {
                dir,
                name,
                ino,
                why,
            } => write!(
                f,
                "directory {dir} entry {:?}: dangling entry: inode {ino} {why}",
                n(name)
            ),
            Finding::WrongKind {
                dir,
                name,
                ino,
                kind,
            } => write!(
                f,
                "directory {dir} entry {:?}: wrong kind: inode {ino} is {:?}",
                n(name),
                Kind::from_code(*kind)
            ),
            Finding::DirLinkedTwice { dir, name, ino } => write!(
                f,
                "directory {ino} is linked twice (again as {:?} in {dir})",
                n(name)
            ),
            Finding::WrongParent { ino, says, parent } => {
                write!(f, "directory {ino} has parent {says}, but is in {parent}")
            }
            Finding::DirSize { dir, says, entries } => {
                write!(f, "directory {dir}: {entries} entries, inode says {says}")
            }
            Finding::Nlink {
                ino,
                says,
                expected,
            } => write!(
                f,
                "inode {ino}: wrong link count {says}, expected {expected}"
            ),
            Finding::Unreachable { ino } => {
                write!(
                    f,
                    "inode {ino} is unreachable (neither reachable nor an orphan)"
                )
            }
            Finding::BadInode { ino, why } => write!(f, "inode {ino}: bad inode record: {why}"),
            Finding::LeakedList { list, blocks } => write!(
                f,
                "list {list} is named by no inode ({})",
                if *blocks { "it holds blocks" } else { "empty" }
            ),
            Finding::MissingList { ino, list } => {
                write!(f, "inode {ino} names list {list}, which does not exist")
            }
            Finding::BadValueList { ino, list, why } => write!(
                f,
                "inode {ino}: the list {list} of a long attribute value {why}"
            ),
            Finding::SharedValueList { ino, list, with } => write!(
                f,
                "inode {ino}: a long attribute value names list {list}, which inode {with} holds"
            ),
            Finding::Unfixable(s) => f.write_str(s),
        }
    }
}

impl Finding {
    /// Findings about the tree's structure, repaired before the counts.
    fn structural(&self) -> bool {
        matches!(
            self,
            Finding::BadBucket { .. }
                | Finding::Dangling { .. }
                | Finding::WrongKind { .. }
                | Finding::DirLinkedTwice { .. }
                | Finding::Unreachable { .. }
                | Finding::BadInode { .. }
                | Finding::LeakedList { .. }
                | Finding::MissingList { .. }
                | Finding::BadValueList { .. }
                | Finding::SharedValueList { .. }
        )
    }
}

/// What the check found wrong; empty means consistent.
#[derive(Debug, Default)]
pub struct Report {
    /// Every finding's text.
    pub problems: Vec<String>,
    pub findings: Vec<Finding>,
    pub inodes: u64,
    pub directories: u64,
    pub files: u64,
    pub bytes: u64,
}

impl Report {
    fn push(&mut self, f: Finding) {
        self.problems.push(f.to_string());
        self.findings.push(f);
    }
}

/// What `repair` did and what is left.
#[derive(Debug, Default)]
pub struct RepairReport {
    /// One line per fix made.
    pub fixed: Vec<String>,
    /// The check after the last round.
    pub after: Report,
}

/// Why an inode could not be loaded: it is gone or its bytes are bad (a
/// repair may drop what names it), or the device failed (it may not).
enum LoadError {
    Gone(String),
    Device(String),
}

impl Fs {
    /// What a mount needs before the tree can be checked, made right in
    /// one ARU (fsck runs it when a mount fails): the file-system record
    /// (rewritten with an inode bound above every inode record if it is
    /// missing, damaged or too low) and a root directory (a new, empty one
    /// if the root's record is missing, damaged or not a directory; the
    /// tree repair then reattaches what hung below the old one under
    /// `/lost+found`). The file system's own lists must exist. Returns the
    /// fixes made.
    pub fn repair_base(ld: &dyn LogicalDisk) -> FsResult<Vec<String>> {
        let mut fixed = Vec::new();
        let top = ld
            .indices(INODE_LIST, 0, usize::MAX)?
            .last()
            .copied()
            .unwrap_or(ROOT_INO);
        let record = match ld.read(META_LIST, 0) {
            Ok(Some(rec)) if rec.len() == 16 && &rec[..8] == super::FS_MAGIC => {
                Some(u64::from_le_bytes(rec[8..16].try_into().expect("8 bytes")))
            }
            Ok(_) | Err(LdError::Corrupt(_)) => None,
            Err(e) => return Err(e.into()),
        };
        let root_ok = match ld.read(INODE_LIST, ROOT_INO) {
            Ok(Some(b)) => {
                matches!(Inode::decode(ROOT_INO, &b, ROOT_INO), Ok(i) if i.kind() == Kind::Dir)
            }
            Ok(None) | Err(LdError::Corrupt(_)) => false,
            Err(e) => return Err(e.into()),
        };
        let record_ok = record.is_some_and(|r| r > top);
        if record_ok && root_ok {
            return Ok(fixed);
        }
        let aru = ld.begin_aru()?;
        let r = (|| -> FsResult<()> {
            if !record_ok {
                let reserved = top.saturating_add(1 + INO_BATCH);
                ld.write(Some(aru), META_LIST, 0, &encode_fs_record(reserved))?;
                fixed.push(format!(
                    "file-system record rewritten (inode numbers from {reserved})"
                ));
            }
            if !root_ok {
                let list = ld.create_list(
                    Some(aru),
                    ListHints {
                        kind: ListKind::Metadata,
                        temperature: Temperature::Hot,
                        ..Default::default()
                    },
                )?;
                let root = super::empty_root(
                    list,
                    Ctx {
                        uid: 0,
                        gid: 0,
                        umask: 0,
                    },
                    super::system_time(),
                );
                ld.write(Some(aru), INODE_LIST, ROOT_INO, &root.encode())?;
                fixed.push("root directory record rewritten (a new, empty root)".into());
            }
            Ok(())
        })();
        match r {
            Ok(()) => ld.end_aru(aru)?,
            Err(e) => {
                // Nothing half-done stays: the LD forgets the ARU's changes.
                let _ = ld.abort_aru(aru);
                return Err(e);
            }
        }
        Ok(fixed)
    }

    /// Walks the whole tree. Corruption is a finding; only a failure to list
    /// the inode or orphan lists is an error.
    pub fn check(&self) -> Result<Report, FsError> {
        self.check_with(None)
    }

    /// [`Fs::check`], calling `progress("tree", inodes loaded, inode
    /// records)` now and then.
    pub fn check_with(&self, progress: Option<crate::ld::Progress<'_>>) -> Result<Report, FsError> {
        let mut r = Report::default();
        let ld = self.logical_disk().clone();
        let total = match ld.indices(INODE_LIST, 0, usize::MAX) {
            Ok(v) => v.len() as u64,
            Err(_) => 0,
        };
        // Every list that exists, in one pass over the engine's list of
        // lists: files' lists are looked up here, and those no inode names
        // are reported at the end.
        let mut existing: HashSet<u64> = HashSet::new();
        let mut from = 1u64;
        loop {
            let lists = ld.lists(from, 65536).map_err(FsError::from)?;
            let Some(last) = lists.last() else {
                break;
            };
            from = last.0.saturating_add(1);
            existing.extend(lists.iter().map(|l| l.0));
            if from == u64::MAX {
                break;
            }
        }
        // Every inode record is read below: let the device start on them.
        match ld.prefetch(INODE_LIST) {
            Ok(()) | Err(LdError::NoSuchList(_)) => {}
            Err(e) => return Err(e.into()),
        }
        let mut walked = 0u64;
        let tick = |n: u64| {
            if let Some(p) = progress {
                p("tree", n, total)
            }
        };
        tick(0);
        let mut refs: HashMap<u64, u32> = HashMap::new();
        let mut seen: HashSet<u64> = HashSet::new();
        let mut stack = vec![ROOT_INO];
        let mut inodes: HashMap<u64, Inode> = HashMap::new();
        let load = |ino: u64, inodes: &mut HashMap<u64, Inode>| -> Result<Inode, LoadError> {
            if let Some(i) = inodes.get(&ino) {
                return Ok(i.clone());
            }
            let b = match ld.read(INODE_LIST, ino) {
                Ok(Some(b)) => b,
                Ok(None) => return Err(LoadError::Gone("does not exist".into())),
                Err(LdError::Corrupt(c)) => return Err(LoadError::Gone(c.to_string())),
                Err(e) => return Err(LoadError::Device(format!("inode {ino}: {e}"))),
            };
            let i = Inode::decode(ino, &b, ino).map_err(|c| LoadError::Gone(c.to_string()))?;
            inodes.insert(ino, i.clone());
            Ok(i)
        };
        seen.insert(ROOT_INO);
        while let Some(d) = stack.pop() {
            let di = match load(d, &mut inodes) {
                Ok(i) if i.kind() == Kind::Dir => i,
                Ok(_) => {
                    r.push(Finding::Unfixable(format!(
                        "inode {d} (root) is not a directory"
                    )));
                    continue;
                }
                Err(LoadError::Gone(why) | LoadError::Device(why)) => {
                    r.push(Finding::Unfixable(format!("directory {d}: {why}")));
                    continue;
                }
            };
            r.directories += 1;
            let list = ListId(di.list);
            // Its buckets are read next; a missing list is a finding below.
            if let Err(e) = ld.prefetch(list) {
                if !matches!(e, LdError::NoSuchList(_)) {
                    return Err(e.into());
                }
            }
            let mut count = 0u64;
            let mut subdirs = 0u32;
            let mut from = 0;
            loop {
                let idx = match ld.indices(list, from, 1024) {
                    Ok(v) => v,
                    Err(LdError::NoSuchList(_)) => {
                        r.push(Finding::MissingList {
                            ino: d,
                            list: di.list,
                        });
                        break;
                    }
                    Err(e) => {
                        r.push(Finding::Unfixable(format!(
                            "directory {d}: list {}: {e}",
                            di.list
                        )));
                        break;
                    }
                };
                let Some(&last) = idx.last() else {
                    break;
                };
                for b in &idx {
                    let raw = match ld.read(list, *b) {
                        Ok(Some(raw)) => raw,
                        Ok(None) => continue,
                        Err(LdError::Corrupt(c)) => {
                            r.push(Finding::BadBucket {
                                dir: d,
                                index: *b,
                                why: c.to_string(),
                            });
                            continue;
                        }
                        Err(e) => {
                            r.push(Finding::Unfixable(format!("directory {d} bucket {b}: {e}")));
                            continue;
                        }
                    };
                    let entries = match dir::decode(&raw, d, *b) {
                        Ok(e) => e,
                        Err(c) => {
                            r.push(Finding::BadBucket {
                                dir: d,
                                index: *b,
                                why: c.to_string(),
                            });
                            continue;
                        }
                    };
                    for e in entries {
                        walked += 1;
                        if walked.is_multiple_of(4096) {
                            tick(walked);
                        }
                        let ci = match load(e.ino, &mut inodes) {
                            Ok(i) => i,
                            Err(LoadError::Gone(why)) => {
                                r.push(Finding::Dangling {
                                    dir: d,
                                    name: e.name,
                                    ino: e.ino,
                                    why,
                                });
                                continue;
                            }
                            Err(LoadError::Device(why)) => {
                                r.push(Finding::Unfixable(why));
                                continue;
                            }
                        };
                        count += 1;
                        *refs.entry(e.ino).or_insert(0) += 1;
                        if ci.kind().code() != e.kind {
                            r.push(Finding::WrongKind {
                                dir: d,
                                name: e.name.clone(),
                                ino: e.ino,
                                kind: ci.kind().code(),
                            });
                        }
                        if ci.kind() == Kind::Dir {
                            if !seen.insert(e.ino) {
                                r.push(Finding::DirLinkedTwice {
                                    dir: d,
                                    name: e.name,
                                    ino: e.ino,
                                });
                                continue;
                            }
                            subdirs += 1;
                            if ci.parent != d {
                                r.push(Finding::WrongParent {
                                    ino: e.ino,
                                    says: ci.parent,
                                    parent: d,
                                });
                            }
                            stack.push(e.ino);
                        } else if seen.insert(e.ino) {
                            r.files += 1;
                            r.bytes += ci.size;
                            if ci.list != 0 && !existing.contains(&ci.list) {
                                r.push(Finding::MissingList {
                                    ino: e.ino,
                                    list: ci.list,
                                });
                            }
                        }
                    }
                }
                from = match last.checked_add(1) {
                    Some(f) => f,
                    None => break,
                };
            }
            if count != di.size {
                r.push(Finding::DirSize {
                    dir: d,
                    says: di.size,
                    entries: count,
                });
            }
            if di.nlink != 2 + subdirs {
                r.push(Finding::Nlink {
                    ino: d,
                    says: di.nlink,
                    expected: 2 + subdirs,
                });
            }
        }
        let mut refs: Vec<(u64, u32)> = refs.into_iter().collect();
        refs.sort_unstable();
        for (ino, n) in refs {
            if let Some(i) = inodes.get(&ino) {
                if i.kind() != Kind::Dir && i.nlink != n {
                    r.push(Finding::Nlink {
                        ino,
                        says: i.nlink,
                        expected: n,
                    });
                }
            }
        }
        // Every inode record is reachable or an orphan.
        // The file system's own lists: fsck recreates a missing one before
        // it mounts for a repair.
        let own = |list: ListId, r: &mut Report| match ld.indices(list, 0, usize::MAX) {
            Ok(v) => Ok(v),
            Err(LdError::NoSuchList(_)) => {
                r.push(Finding::Unfixable(format!(
                    "the file system's list {} does not exist",
                    list.0
                )));
                Ok(Vec::new())
            }
            Err(e) => Err(FsError::from(e)),
        };
        let orphans: HashSet<u64> = own(ORPHAN_LIST, &mut r)?.into_iter().collect();
        let all = own(INODE_LIST, &mut r)?;
        r.inodes = all.len() as u64;
        for ino in all {
            if seen.contains(&ino) {
                continue;
            }
            let orphan = orphans.contains(&ino);
            match load(ino, &mut inodes) {
                Ok(_) if orphan => {}
                Ok(_) => r.push(Finding::Unreachable { ino }),
                // An orphan's record is destroyed at the next writable mount.
                Err(LoadError::Gone(_)) if orphan => {}
                Err(LoadError::Gone(why)) => r.push(Finding::BadInode { ino, why }),
                Err(LoadError::Device(why)) => r.push(Finding::Unfixable(why)),
            }
        }
        // Every long attribute value's list exists and holds the value:
        // block k holds bytes XATTR_CHUNK·k .., every block full but the
        // last, and nothing after it (what getxattr reads).
        let mut held: Vec<(u64, u64, usize)> = inodes
            .values()
            .flat_map(|i| {
                i.xattrs
                    .iter()
                    .filter_map(|(_, v)| Some((i.ino, v.list()?, v.len())))
            })
            .collect();
        held.sort_unstable();
        // Who holds each list first: inodes their own, then values in order.
        let mut holder: HashMap<u64, u64> = inodes.values().map(|i| (i.list, i.ino)).collect();
        for &(ino, list, len) in &held {
            if let Some(&with) = holder.get(&list) {
                r.push(Finding::SharedValueList { ino, list, with });
                continue;
            }
            holder.insert(list, ino);
            if !existing.contains(&list) {
                r.push(Finding::MissingList { ino, list });
                continue;
            }
            let blocks = len.div_ceil(XATTR_CHUNK) as u64;
            let mut why = None;
            match ld.indices(ListId(list), 0, blocks as usize + 1) {
                Ok(idx) if idx != (0..blocks).collect::<Vec<_>>() => {
                    why = Some(format!("has blocks {idx:?}, not 0..{blocks}"));
                }
                Ok(_) => {
                    for k in 0..blocks {
                        let want = XATTR_CHUNK.min(len - k as usize * XATTR_CHUNK);
                        why = match ld.read(ListId(list), k) {
                            Ok(Some(b)) if b.len() == want => continue,
                            Ok(Some(b)) => {
                                Some(format!("holds {} bytes in block {k}, not {want}", b.len()))
                            }
                            Ok(None) => Some(format!("lost block {k}")),
                            Err(LdError::Corrupt(c)) => Some(format!("block {k}: {c}")),
                            Err(e) => {
                                r.push(Finding::Unfixable(format!("list {list} block {k}: {e}")));
                                None
                            }
                        };
                        break;
                    }
                }
                Err(e) => r.push(Finding::Unfixable(format!("list {list}: {e}"))),
            }
            if let Some(why) = why {
                r.push(Finding::BadValueList { ino, list, why });
            }
        }
        // Every list is named by an inode record (or is one of the file
        // system's own).
        let mut named: HashSet<u64> = inodes.values().map(|i| i.list).collect();
        named.extend(held.iter().map(|&(_, l, _)| l));
        named.extend([META_LIST.0, INODE_LIST.0, ORPHAN_LIST.0]);
        let mut leaked: Vec<u64> = existing.difference(&named).copied().collect();
        leaked.sort_unstable();
        for l in leaked {
            let blocks = match ld.indices(ListId(l), 0, 1) {
                Ok(v) => !v.is_empty(),
                Err(e) => {
                    r.push(Finding::Unfixable(format!("list {l}: {e}")));
                    continue;
                }
            };
            r.push(Finding::LeakedList { list: l, blocks });
        }
        Ok(r)
    }

    /// Repairs what `check` finds, in rounds (see the module documentation),
    /// each fix its own ARU; returns the fixes and the final check. Fails
    /// with `ReadOnly` on a read-only mount.
    pub fn repair(&self) -> FsResult<RepairReport> {
        if self.opts.read_only {
            return Err(FsError::ReadOnly);
        }
        // Corruption met while repairing is what is being repaired: it must
        // not turn the file system read-only.
        self.repairing
            .store(true, std::sync::atomic::Ordering::Relaxed);
        let r = self.repair_rounds();
        self.repairing
            .store(false, std::sync::atomic::Ordering::Relaxed);
        r
    }

    fn repair_rounds(&self) -> FsResult<RepairReport> {
        let mut out = RepairReport::default();
        for _ in 0..REPAIR_ROUNDS {
            let r = self.check()?;
            let structural: Vec<&Finding> = r.findings.iter().filter(|f| f.structural()).collect();
            let todo: Vec<Finding> = if structural.is_empty() {
                r.findings
                    .iter()
                    .filter(|f| !matches!(f, Finding::Unfixable(_)))
                    .cloned()
                    .collect()
            } else {
                structural.into_iter().cloned().collect()
            };
            if todo.is_empty() {
                out.after = r;
                return Ok(out);
            }
            let mut lost_found = None;
            let mut covered: HashSet<u64> = HashSet::new();
            // Unreachable directories first, so their contents come along.
            let mut todo = todo;
            todo.sort_by_key(|f| match f {
                Finding::Unreachable { ino } => (1, !self.is_dir(*ino), *ino),
                _ => (0, false, 0),
            });
            for f in todo {
                if let Finding::Unreachable { ino } = f {
                    if covered.contains(&ino) {
                        continue;
                    }
                    let lf = match lost_found {
                        Some(lf) => lf,
                        None => {
                            let lf = self.lost_found()?;
                            lost_found = Some(lf);
                            lf
                        }
                    };
                    self.subtree(ino, &mut covered);
                    let name = self.reattach(lf, ino)?;
                    out.fixed.push(format!(
                        "inode {ino} reattached as /lost+found/{}",
                        String::from_utf8_lossy(&name)
                    ));
                    continue;
                }
                if let Finding::LeakedList { list, blocks: true } = f {
                    let lf = match lost_found {
                        Some(lf) => lf,
                        None => {
                            let lf = self.lost_found()?;
                            lost_found = Some(lf);
                            lf
                        }
                    };
                    let (ino, name) = self.adopt_list(lf, list)?;
                    out.fixed.push(format!(
                        "list {list} (named by no inode) reattached as file {ino}, /lost+found/{}",
                        String::from_utf8_lossy(&name)
                    ));
                    continue;
                }
                self.fix(&f)?;
                out.fixed.push(format!("fixed: {f}"));
            }
        }
        out.after = self.check()?;
        Ok(out)
    }

    fn is_dir(&self, ino: u64) -> bool {
        let mut st = self.lock();
        matches!(self.get_inode(&mut st, ino), Ok(i) if i.kind() == Kind::Dir)
    }

    /// Marks everything below directory `ino` (best effort, bounded by the
    /// set: a cycle ends where it meets itself).
    fn subtree(&self, ino: u64, covered: &mut HashSet<u64>) {
        let mut stack = vec![ino];
        while let Some(d) = stack.pop() {
            if !covered.insert(d) {
                continue;
            }
            let di = {
                let mut st = self.lock();
                match self.get_inode(&mut st, d) {
                    Ok(i) if i.kind() == Kind::Dir => i,
                    _ => continue,
                }
            };
            let Ok(idx) = self.ld.indices(ListId(di.list), 0, usize::MAX) else {
                continue;
            };
            for b in idx {
                if let Ok(Some(raw)) = self.ld.read(ListId(di.list), b) {
                    for e in dir::decode(&raw, d, b).unwrap_or_default() {
                        stack.push(e.ino);
                    }
                }
            }
        }
    }

    /// Starts one repair step: an operation (`Fs::begin`) with a flat
    /// reservation. Fixes are varied (a damaged bucket's salvaged entries
    /// may go back to many buckets) and write as they go, so unlike the
    /// operations of a mounted file system they do not size theirs from a
    /// plan; one that outgrows it and meets a full device fails whole.
    fn begin_repair(&self) -> FsResult<super::Tx<'_>> {
        let mut tx = self.begin()?;
        tx.reserve(REPAIR_RESERVE)?;
        Ok(tx)
    }

    /// The `/lost+found` directory, created if missing.
    fn lost_found(&self) -> FsResult<u64> {
        match self.lookup(ROOT_INO, LOST_FOUND) {
            Ok(a) if a.kind == Kind::Dir => return Ok(a.ino),
            Ok(_) => {
                return Err(FsError::Invalid(
                    "/lost+found exists and is not a directory".into(),
                ))
            }
            Err(FsError::NotFound) => {}
            Err(e) => return Err(e),
        }
        let a = self.mkdir(
            Ctx {
                uid: 0,
                gid: 0,
                umask: 0,
            },
            ROOT_INO,
            LOST_FOUND,
            0o700,
        )?;
        Ok(a.ino)
    }

    /// Links `ino` into `/lost+found` as `#ino` (or `#ino.N` if taken).
    fn reattach(&self, lf: u64, ino: u64) -> FsResult<Vec<u8>> {
        let mut tx = self.begin_repair()?;
        let r = (|| {
            let mut d = tx.dir_inode_mut(lf)?;
            let mut i = tx.inode_mut(ino)?;
            let (name, idx, entries) = tx.free_name(&d, &format!("#{ino}"))?;
            tx.add_found(&mut d, idx, entries, &name, ino, i.kind())?;
            if i.kind() == Kind::Dir {
                d.nlink += 1;
                i.parent = lf;
                tx.put(&i)?;
            } else if i.nlink == 0 {
                i.nlink = 1;
                tx.put(&i)?;
            }
            tx.put(&d)?;
            Ok(name)
        })();
        tx.finish(r)
    }

    /// Makes a list no inode names into a regular file (mode 0600, owner
    /// root) linked into `/lost+found` as `#list-LIST`: its blocks are kept
    /// as the file's contents (index `k` at byte `k * 4096`), its size runs
    /// to the end of its last block.
    fn adopt_list(&self, lf: u64, list: u64) -> FsResult<(u64, Vec<u8>)> {
        let mut tx = self.begin_repair()?;
        let r = (|| {
            let l = ListId(list);
            let mut last = None;
            let mut from = 0u64;
            loop {
                let idx = tx.ld().indices(l, from, 4096)?;
                let Some(&b) = idx.last() else { break };
                last = Some(b);
                match b.checked_add(1) {
                    Some(f) => from = f,
                    None => break,
                }
            }
            let size = match last {
                Some(b) => {
                    let len = tx.ld().read(l, b).ok().flatten().map_or(0, |d| d.len()) as u64;
                    b.saturating_mul(BLOCK_BYTES)
                        .saturating_add(len)
                        .min(MAX_FILE_BYTES)
                }
                None => 0,
            };
            let ino = tx.alloc_ino()?;
            let now = self.now();
            let i = Inode {
                ino,
                generation: 1,
                mode: Kind::File.mode_bits() | 0o600,
                uid: 0,
                gid: 0,
                nlink: 1,
                size,
                list,
                rdev: 0,
                parent: 0,
                atime: now,
                mtime: now,
                ctime: now,
                inline: Vec::new(),
                xattrs: Vec::new(),
            };
            tx.put(&i)?;
            let mut d = tx.dir_inode_mut(lf)?;
            let (name, idx, entries) = tx.free_name(&d, &format!("#list-{list}"))?;
            tx.add_found(&mut d, idx, entries, &name, ino, Kind::File)?;
            tx.put(&d)?;
            Ok((ino, name))
        })();
        tx.finish(r)
    }

    /// Applies one fix in its own ARU.
    fn fix(&self, f: &Finding) -> FsResult<()> {
        let mut tx = self.begin_repair()?;
        let r = (|| match f {
            Finding::BadBucket { dir, index, .. } => {
                let mut d = tx.dir_inode_mut(*dir)?;
                let list = ListId(d.list);
                let salvaged = match tx.ld().read(list, *index) {
                    Ok(Some(raw)) => dir::salvage(&raw),
                    Ok(None) | Err(LdError::Corrupt(_)) => Vec::new(),
                    Err(e) => return Err(e.into()),
                };
                tx.ld().delete(Some(tx.aru), list, *index)?;
                tx.forget_bucket(list, *index);
                // Each entry goes back to the bucket its name hashes to
                // (reads see the delete above, so its own starts empty). A
                // name already there, or a bucket that is itself damaged or
                // full, leaves the entry out: its inode ends in lost+found.
                for e in salvaged {
                    match tx.bucket_for_new(&d, &e.name) {
                        Ok((idx, entries)) => {
                            tx.add_found(&mut d, idx, entries, &e.name, e.ino, kind_of(e.kind))?
                        }
                        Err(FsError::Exists | FsError::NoSpace { .. } | FsError::Io(_)) => {}
                        Err(e) => return Err(e),
                    }
                }
                tx.put(&d)
            }
            Finding::Dangling { dir, name, .. } | Finding::DirLinkedTwice { dir, name, .. } => {
                let mut d = tx.dir_inode_mut(*dir)?;
                tx.remove_entry(&mut d, name)?;
                tx.put(&d)
            }
            Finding::WrongKind {
                dir, name, kind, ..
            } => {
                let d = tx.dir_inode(*dir)?;
                let (idx, mut entries) = tx.bucket_to_change(&d, name)?;
                for e in entries.iter_mut().filter(|e| e.name == *name) {
                    e.kind = *kind;
                }
                tx.write_bucket(&d, idx, entries)
            }
            Finding::BadInode { ino, .. } => {
                tx.ld().delete(Some(tx.aru), INODE_LIST, *ino)?;
                tx.st.inodes.remove(ino);
                Ok(())
            }
            Finding::WrongParent { ino, parent, .. } => {
                let mut i = tx.inode_mut(*ino)?;
                i.parent = *parent;
                tx.put(&i)
            }
            Finding::DirSize { dir, entries, .. } => {
                let mut d = tx.inode_mut(*dir)?;
                d.size = *entries;
                tx.put(&d)
            }
            Finding::Nlink { ino, expected, .. } => {
                let mut i = tx.inode_mut(*ino)?;
                i.nlink = *expected;
                tx.put(&i)
            }
            Finding::MissingList { ino, list } if tx.inode(*ino)?.list != *list => {
                // A long attribute value's list: the attribute goes.
                let mut i = tx.inode_mut(*ino)?;
                i.xattrs.retain(|(_, v)| v.list() != Some(*list));
                tx.put(&i)
            }
            Finding::SharedValueList { ino, list, .. } => {
                // The value is lost; the list stays with its other holder.
                let mut i = tx.inode_mut(*ino)?;
                i.xattrs.retain(|(_, v)| v.list() != Some(*list));
                tx.put(&i)
            }
            Finding::BadValueList { ino, list, .. } => {
                // The value is lost: the attribute goes, with its list.
                let mut i = tx.inode_mut(*ino)?;
                i.xattrs.retain(|(_, v)| v.list() != Some(*list));
                tx.put(&i)?;
                tx.ld().delete_list(Some(tx.aru), ListId(*list))?;
                Ok(())
            }
            Finding::MissingList { ino, .. } => {
                let mut i = tx.inode_mut(*ino)?;
                let kind = if i.kind() == Kind::Dir {
                    ListKind::Metadata
                } else {
                    ListKind::Data
                };
                i.list = tx
                    .ld()
                    .create_list(
                        Some(tx.aru),
                        ListHints {
                            kind,
                            ..Default::default()
                        },
                    )?
                    .0;
                tx.put(&i)
            }
            Finding::LeakedList { list, .. } => {
                tx.ld().delete_list(Some(tx.aru), ListId(*list))?;
                Ok(())
            }
            Finding::Unreachable { .. } | Finding::Unfixable(_) => {
                unreachable!("handled by repair: {f}")
            }
        })();
        tx.finish(r)
    }
}

fn kind_of(code: u8) -> Kind {
    Kind::from_code(code).expect("salvage keeps only valid kinds")
}

impl super::Tx<'_> {
    /// A name not yet in directory `d`: `base`, else `base.1` .. `base.16`;
    /// with the bucket it goes into and that bucket's entries.
    fn free_name(
        &mut self,
        d: &Inode,
        base: &str,
    ) -> Result<(Vec<u8>, u64, Vec<dir::Entry>), FsError> {
        let mut name = base.as_bytes().to_vec();
        let mut n = 0;
        loop {
            match self.bucket_for_new(d, &name) {
                Ok((idx, entries)) => return Ok((name, idx, entries)),
                Err(FsError::Exists) if n < 16 => {
                    n += 1;
                    name = format!("{base}.{n}").into_bytes();
                }
                Err(e) => return Err(e),
            }
        }
    }
}
