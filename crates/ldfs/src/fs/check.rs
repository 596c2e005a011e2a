//! The file-tree consistency check (the fs half of fsck, run by the crash
//! tests after every recovery): every entry names a live inode of the kind it
//! says; every directory's `..`, entry count and link count are right; every
//! inode's link count equals the entries naming it; every inode is reachable
//! from the root or recorded as an orphan; every list an inode names exists.
//! It reads only; it reports what it finds.

use std::collections::{HashMap, HashSet};

use super::inode::{Inode, Kind};
use super::{dir, Fs, FsError, ORPHAN_LIST, ROOT_INO};
use crate::ld::ListId;

/// What the check found wrong; empty means consistent.
#[derive(Debug, Default)]
pub struct Report {
    pub problems: Vec<String>,
    pub inodes: u64,
    pub directories: u64,
    pub files: u64,
    pub bytes: u64,
}

impl Fs {
    /// Walks the whole tree. Errors reading the device are problems too.
    pub fn check(&self) -> Result<Report, FsError> {
        let mut r = Report::default();
        let ld = self.logical_disk().clone();
        let mut refs: HashMap<u64, u32> = HashMap::new();
        let mut seen: HashSet<u64> = HashSet::new();
        let mut stack = vec![ROOT_INO];
        let mut inodes: HashMap<u64, Inode> = HashMap::new();
        let load = |ino: u64, inodes: &mut HashMap<u64, Inode>| -> Result<Inode, String> {
            if let Some(i) = inodes.get(&ino) {
                return Ok(i.clone());
            }
            let b = ld
                .read(super::INODE_LIST, ino)
                .map_err(|e| format!("inode {ino}: {e}"))?
                .ok_or_else(|| format!("inode {ino} is named but does not exist"))?;
            let i = Inode::decode(ino, &b, ino).map_err(|c| c.to_string())?;
            inodes.insert(ino, i.clone());
            Ok(i)
        };
        seen.insert(ROOT_INO);
        while let Some(d) = stack.pop() {
            let di = match load(d, &mut inodes) {
                Ok(i) => i,
                Err(e) => {
                    r.problems.push(e);
                    continue;
                }
            };
            r.directories += 1;
            let list = ListId(di.list);
            let mut count = 0u64;
            let mut subdirs = 0u32;
            let mut from = 0;
            loop {
                let idx = match ld.indices(list, from, 1024) {
                    Ok(v) => v,
                    Err(e) => {
                        r.problems
                            .push(format!("directory {d}: list {}: {e}", di.list));
                        break;
                    }
                };
                if idx.is_empty() {
                    break;
                }
                for b in &idx {
                    let raw = match ld.read(list, *b) {
                        Ok(Some(raw)) => raw,
                        Ok(None) => continue,
                        Err(e) => {
                            r.problems.push(format!("directory {d} bucket {b}: {e}"));
                            continue;
                        }
                    };
                    let entries = match dir::decode(&raw, d, *b) {
                        Ok(e) => e,
                        Err(c) => {
                            r.problems.push(c.to_string());
                            continue;
                        }
                    };
                    for e in entries {
                        count += 1;
                        *refs.entry(e.ino).or_insert(0) += 1;
                        let name = String::from_utf8_lossy(&e.name).to_string();
                        let ci = match load(e.ino, &mut inodes) {
                            Ok(i) => i,
                            Err(msg) => {
                                r.problems
                                    .push(format!("directory {d} entry {name:?}: {msg}"));
                                continue;
                            }
                        };
                        if ci.kind().code() != e.kind {
                            r.problems.push(format!(
                                "directory {d} entry {name:?}: says kind {}, inode {} is {:?}",
                                e.kind,
                                e.ino,
                                ci.kind()
                            ));
                        }
                        if ci.kind() == Kind::Dir {
                            subdirs += 1;
                            if ci.parent != d {
                                r.problems.push(format!(
                                    "directory {} ({name:?}) has parent {}, but is in {d}",
                                    e.ino, ci.parent
                                ));
                            }
                            if !seen.insert(e.ino) {
                                r.problems
                                    .push(format!("directory {} is linked twice", e.ino));
                                continue;
                            }
                            stack.push(e.ino);
                        } else if seen.insert(e.ino) {
                            r.files += 1;
                            r.bytes += ci.size;
                            if ci.list != 0 {
                                if let Err(e2) = ld.indices(ListId(ci.list), 0, 1) {
                                    r.problems.push(format!(
                                        "inode {}: data list {}: {e2}",
                                        e.ino, ci.list
                                    ));
                                }
                            }
                        }
                    }
                }
                from = idx.last().unwrap() + 1;
            }
            if count != di.size {
                r.problems.push(format!(
                    "directory {d}: {count} entries, inode says {}",
                    di.size
                ));
            }
            if di.nlink != 2 + subdirs {
                r.problems.push(format!(
                    "directory {d}: link count {}, expected {}",
                    di.nlink,
                    2 + subdirs
                ));
            }
        }
        for (ino, n) in &refs {
            if let Some(i) = inodes.get(ino) {
                if i.kind() != Kind::Dir && i.nlink != *n {
                    r.problems.push(format!(
                        "inode {ino}: link count {}, {n} entries name it",
                        i.nlink
                    ));
                }
            }
        }
        // Every inode record is reachable or an orphan.
        let orphans: HashSet<u64> = ld
            .indices(ORPHAN_LIST, 0, usize::MAX)
            .map_err(FsError::from)?
            .into_iter()
            .collect();
        let all = ld
            .indices(super::INODE_LIST, 0, usize::MAX)
            .map_err(FsError::from)?;
        r.inodes = all.len() as u64;
        for ino in all {
            if !seen.contains(&ino) && !orphans.contains(&ino) {
                r.problems
                    .push(format!("inode {ino} is neither reachable nor an orphan"));
            }
        }
        Ok(r)
    }
}
