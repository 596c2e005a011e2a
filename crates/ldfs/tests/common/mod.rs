//! The random fs workload the crash simulations share (fs_crash on one
//! log, dual_crash on the dual layout) and the differential of uip against
//! lld (fs_uip): operations, and the tree they leave.

#![allow(dead_code)]

use std::collections::BTreeMap;

use ldfs::fs::inode::{Kind, Time};
use ldfs::fs::{Attr, Ctx, Fs, FsError, FsOptions, RenameFlags, ROOT_INO};
use rand::Rng;
use rand_chacha::ChaCha8Rng;

pub const CTX: Ctx = Ctx {
    uid: 0,
    gid: 0,
    umask: 0,
};
pub const NAMES: [&[u8]; 6] = [b"a", b"b", b"c", b"d", b"e", b"f"];

pub type Tree = BTreeMap<String, String>;

/// A number from the environment (cycle counts, seeds), else `default`.
pub fn env_u64(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name} must be a number, not {v:?}")),
        Err(_) => default,
    }
}

/// The base seed of a randomized test: `LDFS_SEED`, else 2026.
pub fn base_seed() -> u64 {
    env_u64("LDFS_SEED", 2026)
}

/// Where the replay clock starts (`Fs::format_at` takes it too).
pub const START: Time = Time {
    secs: 1_700_000_000,
    nsecs: 0,
};

/// Mount options whose clock advances a microsecond a call from `START`:
/// the same seed gives the same inode records, so the same images (with
/// the engine's own threads off, a printed seed replays exactly).
pub fn replay_fs_opts() -> FsOptions {
    let tick = std::sync::atomic::AtomicU32::new(0);
    FsOptions {
        clock: Box::new(move || Time {
            secs: START.secs,
            nsecs: tick.fetch_add(1000, std::sync::atomic::Ordering::Relaxed) % 1_000_000_000,
        }),
        ..Default::default()
    }
}

/// Every name below the root, depth first: path -> what `describe` says of
/// the entry's inode (given its number and attributes).
pub fn walk(fs: &Fs, mut describe: impl FnMut(u64, &Attr) -> String) -> Tree {
    let mut out = Tree::new();
    let mut stack = vec![(ROOT_INO, String::new())];
    while let Some((d, path)) = stack.pop() {
        let mut off = 0;
        loop {
            let ents = fs.readdir(d, off, 64).unwrap();
            if ents.is_empty() {
                break;
            }
            for e in &ents {
                off = e.next;
                if e.name == b"." || e.name == b".." {
                    continue;
                }
                let p = format!("{path}/{}", String::from_utf8_lossy(&e.name));
                let a = fs.getattr(e.ino).unwrap();
                if a.kind == Kind::Dir {
                    stack.push((e.ino, p.clone()));
                }
                out.insert(p, describe(e.ino, &a));
            }
        }
    }
    out
}

/// The whole tree: path -> kind, size and a hash of each 4 KiB block of a
/// file, `X` for a block that fails to read (see `same_but_unreadable`).
pub fn snapshot(fs: &Fs) -> Tree {
    walk(fs, |ino, a| match a.kind {
        Kind::Dir => format!("dir nlink {}", a.nlink),
        Kind::File => {
            let mut blocks = Vec::new();
            let mut at = 0;
            while at < a.size {
                let n = (a.size - at).min(4096) as u32;
                match fs.read(ino, at, n) {
                    Ok(data) => {
                        assert_eq!(data.len() as u32, n);
                        blocks.push(format!("{:x}", hash(&data)));
                    }
                    Err(_) => blocks.push("X".into()),
                }
                at += n as u64;
            }
            format!(
                "file ino {ino} nlink {} size {} [{}]",
                a.nlink,
                a.size,
                blocks.join(",")
            )
        }
        k => format!("{k:?}"),
    })
}

pub fn hash(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| {
        (h ^ x as u64).wrapping_mul(0x100_0000_01b3)
    })
}

fn file_blocks(desc: &str) -> Option<(&str, Vec<&str>)> {
    let (head, blocks) = desc.split_once('[')?;
    let blocks = blocks.trim_end_matches(']');
    Some((head, blocks.split(',').collect()))
}

/// Whether `got` is one of `states` except for file blocks that fail to
/// read, each of which had two different contents among `states` (it was
/// overwritten in place after the last fsync, under whatever name: the
/// dual layout's crash
/// during an overwrite leaves a block whose bytes do not match the
/// recovered checksum). A block written once cannot fail: its data was
/// durable before its pointer.
pub fn same_but_overwritten_unreadable(got: &Tree, states: &[Tree]) -> bool {
    // Keyed by inode number (the head's "file ino N"), not by path: the
    // overwrite may have happened under a name a rename gave later.
    let ino = |head: &str| head.split(' ').nth(2).map(str::to_string);
    let overwritten = |head: &str, k: usize| {
        let mut seen = std::collections::HashSet::new();
        for s in states {
            for d in s.values() {
                if let Some((h, b)) = file_blocks(d) {
                    if ino(h) == ino(head) {
                        if let Some(x) = b.get(k) {
                            seen.insert(x.to_string());
                        }
                    }
                }
            }
        }
        seen.len() >= 2
    };
    states.iter().any(|state| {
        got.len() == state.len()
            && got.iter().all(|(p, g)| {
                let Some(s) = state.get(p) else { return false };
                if g == s {
                    return true;
                }
                let (Some((gh, gb)), Some((sh, sb))) = (file_blocks(g), file_blocks(s)) else {
                    return false;
                };
                gh == sh
                    && gb.len() == sb.len()
                    && gb
                        .iter()
                        .zip(&sb)
                        .enumerate()
                        .all(|(k, (x, y))| x == y || (*x == "X" && overwritten(gh, k)))
            })
    })
}

pub fn ok_or_expected<T>(r: Result<T, FsError>) -> Option<T> {
    match r {
        Ok(v) => Some(v),
        Err(
            FsError::NotFound
            | FsError::Exists
            | FsError::NotDir
            | FsError::IsDir
            | FsError::NotEmpty
            | FsError::Invalid(_)
            | FsError::NoSpace { .. },
        ) => None,
        Err(e) => panic!("unexpected error {e:?}"),
    }
}

pub fn dir_of(fs: &Fs, rng: &mut ChaCha8Rng) -> u64 {
    match rng.gen_range(0..3) {
        0 => ROOT_INO,
        _ => {
            let n = NAMES[rng.gen_range(0..NAMES.len())];
            match fs.lookup(ROOT_INO, n) {
                Ok(a) if a.kind == ldfs::fs::inode::Kind::Dir => a.ino,
                _ => ROOT_INO,
            }
        }
    }
}

/// One random operation; returns whether it was an fsync.
pub fn op(fs: &Fs, rng: &mut ChaCha8Rng, log: &mut Vec<String>, states: &mut Vec<Tree>) -> bool {
    let d = dir_of(fs, rng);
    let name = NAMES[rng.gen_range(0..NAMES.len())];
    log.push(format!("dir {d} name {}", String::from_utf8_lossy(name)));
    match rng.gen_range(0..100) {
        0..=29 => {
            let ino = match fs.lookup(d, name) {
                Ok(a) => Some(a.ino),
                Err(_) => {
                    // Creating is an operation of its own: the tree after
                    // it is a state a crash may leave.
                    let a = ok_or_expected(fs.mknod(CTX, d, name, 0o100644, 0)).map(|a| a.ino);
                    states.push(snapshot(fs));
                    a
                }
            };
            if let Some(ino) = ino {
                let len = match rng.gen_range(0..3) {
                    0 => rng.gen_range(1..500),
                    1 => rng.gen_range(1..9000),
                    _ => rng.gen_range(1..100_000),
                };
                let off = rng.gen_range(0..50_000);
                let fill: u8 = rng.gen();
                log.push(format!("  write ino {ino} off {off} len {len}"));
                ok_or_expected(fs.write(ino, off, &vec![fill; len]));
            }
        }
        30..=39 => {
            ok_or_expected(fs.mkdir(CTX, d, name, 0o755));
        }
        40..=49 => {
            ok_or_expected(fs.unlink(d, name));
        }
        50..=54 => {
            ok_or_expected(fs.rmdir(d, name));
        }
        55..=69 => {
            let d2 = dir_of(fs, rng);
            let n2 = NAMES[rng.gen_range(0..NAMES.len())];
            let flags = RenameFlags {
                noreplace: rng.gen_bool(0.2),
                exchange: rng.gen_bool(0.2),
            };
            if !(flags.noreplace && flags.exchange) {
                log.push(format!(
                    "  rename to {d2}/{} {flags:?} -> {:?}",
                    String::from_utf8_lossy(n2),
                    fs.rename(d, name, d2, n2, flags)
                ));
            }
        }
        70..=77 => {
            if let Ok(a) = fs.lookup(d, name) {
                let d2 = dir_of(fs, rng);
                let n2 = NAMES[rng.gen_range(0..NAMES.len())];
                if a.kind != ldfs::fs::inode::Kind::Dir {
                    ok_or_expected(fs.link(a.ino, d2, n2));
                }
            }
        }
        78..=87 => {
            if let Ok(a) = fs.lookup(d, name) {
                if a.kind == ldfs::fs::inode::Kind::File {
                    let sa = ldfs::fs::SetAttr {
                        size: Some(rng.gen_range(0..60_000)),
                        ..Default::default()
                    };
                    log.push(format!("  truncate {} to {:?}", a.ino, sa.size));
                    ok_or_expected(fs.setattr(a.ino, &sa));
                }
            }
        }
        88..=91 => {
            ok_or_expected(fs.symlink(CTX, d, name, b"target"));
        }
        _ => {
            fs.fsync().unwrap();
            return true;
        }
    }
    false
}
