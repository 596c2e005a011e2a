//! Differential random testing: one seeded sequence of file operations is
//! applied to an ldfs mount and to a tmpfs directory; return codes, contents
//! and the stat fields that should agree must agree after every operation.
//! `LDFS_DIFF_OPS` sets the operations per seed (default 300), `LDFS_SEED` a
//! single seed to replay; a failure prints the seed and the operation log.

mod common;

use std::collections::BTreeMap;
use std::ffi::CString;
use std::fs::{self, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{cstr, fuse_usable, mkfs, mkfs_dual, mkfs_store, Mount, MountExtra};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const NAMES: [&str; 10] = [
    "a", "b", "c", "d/a", "d/b", "d/e", "d/e/x", "f", "f/y", "d/e/z",
];

/// A tmpfs for the reference side, unmounted on drop.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn new(dir: &Path) -> Option<Tmpfs> {
        fs::create_dir_all(dir).unwrap();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=512m", "ldfs-diff"])
            .arg(dir)
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if !ok {
            eprintln!("\n*** SKIPPING DIFFERENTIAL TEST: cannot mount tmpfs (needs root) ***\n");
            return None;
        }
        Some(Tmpfs(dir.to_path_buf()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// Result of an operation: Ok with a value to compare, or an errno.
type Outcome = Result<String, i32>;

fn io<T>(r: std::io::Result<T>, f: impl FnOnce(T) -> String) -> Outcome {
    r.map(f).map_err(|e| e.raw_os_error().unwrap_or(-1))
}

fn sys(r: i64) -> Outcome {
    if r < 0 {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(-1))
    } else {
        Ok(r.to_string())
    }
}

#[derive(Debug, Clone)]
enum Op {
    Write {
        name: usize,
        off: u64,
        len: usize,
        fill: u8,
    },
    Truncate {
        name: usize,
        size: u64,
    },
    Fallocate {
        name: usize,
        mode: i32,
        off: u64,
        len: u64,
    },
    Rename {
        from: usize,
        to: usize,
        flags: u32,
    },
    Link {
        from: usize,
        to: usize,
    },
    Unlink {
        name: usize,
    },
    Mkdir {
        name: usize,
    },
    Rmdir {
        name: usize,
    },
    Symlink {
        name: usize,
        target: usize,
    },
    SetXattr {
        name: usize,
        key: u8,
        len: usize,
        flags: i32,
    },
    RemoveXattr {
        name: usize,
        key: u8,
    },
    Chmod {
        name: usize,
        mode: u32,
    },
    Fsync {
        name: usize,
    },
    Read {
        name: usize,
        off: u64,
        len: usize,
    },
}

fn gen(rng: &mut ChaCha8Rng) -> Op {
    let n = |rng: &mut ChaCha8Rng| rng.gen_range(0..NAMES.len());
    match rng.gen_range(0..100) {
        0..=24 => Op::Write {
            name: n(rng),
            off: match rng.gen_range(0..3) {
                0 => 0,
                1 => rng.gen_range(0..10_000),
                _ => rng.gen_range(0..300_000),
            },
            len: match rng.gen_range(0..3) {
                0 => rng.gen_range(1..100),
                1 => rng.gen_range(1..10_000),
                _ => rng.gen_range(1..70_000),
            },
            fill: rng.gen(),
        },
        25..=31 => Op::Truncate {
            name: n(rng),
            size: match rng.gen_range(0..3) {
                0 => 0,
                1 => rng.gen_range(0..5000),
                _ => rng.gen_range(0..400_000),
            },
        },
        32..=37 => Op::Fallocate {
            name: n(rng),
            // tmpfs has no ZERO_RANGE; tests/posix.rs covers it.
            mode: [
                0,
                libc::FALLOC_FL_KEEP_SIZE,
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            ][rng.gen_range(0..3)],
            off: rng.gen_range(0..200_000),
            len: rng.gen_range(1..100_000),
        },
        38..=47 => Op::Rename {
            from: n(rng),
            to: n(rng),
            flags: [0, 0, libc::RENAME_NOREPLACE, libc::RENAME_EXCHANGE][rng.gen_range(0..4)],
        },
        48..=52 => Op::Link {
            from: n(rng),
            to: n(rng),
        },
        53..=60 => Op::Unlink { name: n(rng) },
        61..=67 => Op::Mkdir { name: n(rng) },
        68..=71 => Op::Rmdir { name: n(rng) },
        72..=75 => Op::Symlink {
            name: n(rng),
            target: n(rng),
        },
        76..=81 => Op::SetXattr {
            name: n(rng),
            key: rng.gen_range(0..3),
            len: rng.gen_range(0..300),
            flags: [0, libc::XATTR_CREATE, libc::XATTR_REPLACE][rng.gen_range(0..3)],
        },
        82..=84 => Op::RemoveXattr {
            name: n(rng),
            key: rng.gen_range(0..3),
        },
        85..=88 => Op::Chmod {
            name: n(rng),
            mode: rng.gen_range(0..0o7777),
        },
        89..=91 => Op::Fsync { name: n(rng) },
        _ => Op::Read {
            name: n(rng),
            off: rng.gen_range(0..300_000),
            len: rng.gen_range(1..100_000),
        },
    }
}

fn c(p: &Path) -> CString {
    cstr(p)
}

fn apply(root: &Path, op: &Op) -> Outcome {
    let p = |i: usize| root.join(NAMES[i]);
    match *op {
        Op::Write {
            name,
            off,
            len,
            fill,
        } => io(
            OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .mode(0o644)
                .open(p(name))
                .and_then(|mut f| {
                    f.seek(SeekFrom::Start(off))?;
                    f.write_all(&vec![fill; len])
                }),
            |_| String::new(),
        ),
        Op::Truncate { name, size } => {
            sys(unsafe { libc::truncate(c(&p(name)).as_ptr(), size as i64) } as i64)
        }
        Op::Fallocate {
            name,
            mode,
            off,
            len,
        } => match OpenOptions::new().write(true).open(p(name)) {
            Ok(f) => {
                sys(unsafe { libc::fallocate(f.as_raw_fd(), mode, off as i64, len as i64) } as i64)
            }
            Err(e) => Err(e.raw_os_error().unwrap_or(-1)),
        },
        Op::Rename { from, to, flags } => sys(unsafe {
            libc::renameat2(
                libc::AT_FDCWD,
                c(&p(from)).as_ptr(),
                libc::AT_FDCWD,
                c(&p(to)).as_ptr(),
                flags,
            )
        } as i64),
        Op::Link { from, to } => io(fs::hard_link(p(from), p(to)), |_| String::new()),
        Op::Unlink { name } => io(fs::remove_file(p(name)), |_| String::new()),
        Op::Mkdir { name } => io(fs::create_dir(p(name)), |_| String::new()),
        Op::Rmdir { name } => io(fs::remove_dir(p(name)), |_| String::new()),
        Op::Symlink { name, target } => {
            io(std::os::unix::fs::symlink(NAMES[target], p(name)), |_| {
                String::new()
            })
        }
        Op::SetXattr {
            name,
            key,
            len,
            flags,
        } => {
            let k = CString::new(format!("trusted.k{key}")).unwrap();
            let v = vec![key + 1; len];
            sys(unsafe {
                libc::lsetxattr(
                    c(&p(name)).as_ptr(),
                    k.as_ptr(),
                    v.as_ptr().cast(),
                    v.len(),
                    flags,
                )
            } as i64)
        }
        Op::RemoveXattr { name, key } => {
            let k = CString::new(format!("trusted.k{key}")).unwrap();
            sys(unsafe { libc::lremovexattr(c(&p(name)).as_ptr(), k.as_ptr()) } as i64)
        }
        Op::Chmod { name, mode } => sys(unsafe { libc::chmod(c(&p(name)).as_ptr(), mode) } as i64),
        Op::Fsync { name } => io(fs::File::open(p(name)).and_then(|f| f.sync_all()), |_| {
            String::new()
        }),
        Op::Read { name, off, len } => io(
            fs::File::open(p(name)).and_then(|mut f| {
                f.seek(SeekFrom::Start(off))?;
                let mut b = vec![0u8; len];
                let mut got = 0;
                loop {
                    let n = f.read(&mut b[got..])?;
                    if n == 0 || got + n == len {
                        got += n;
                        break;
                    }
                    got += n;
                }
                b.truncate(got);
                Ok(b)
            }),
            |b| format!("{} bytes crc {:08x}", b.len(), crc(&b)),
        ),
    }
}

fn crc(b: &[u8]) -> u32 {
    // FNV is enough to compare contents.
    b.iter().fold(0x811c_9dc5u32, |h, &x| {
        (h ^ x as u32).wrapping_mul(0x0100_0193)
    })
}

/// Everything that should agree between the two trees.
fn snapshot(root: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let mut names: Vec<_> = fs::read_dir(root.join(&rel))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        for n in names {
            let r = rel.join(&n);
            let path = root.join(&r);
            let md = fs::symlink_metadata(&path).unwrap();
            let ft = md.file_type();
            let mut xa = Vec::new();
            for k in 0..3 {
                let key = CString::new(format!("trusted.k{k}")).unwrap();
                let mut buf = vec![0u8; 1024];
                let got = unsafe {
                    libc::lgetxattr(
                        c(&path).as_ptr(),
                        key.as_ptr(),
                        buf.as_mut_ptr().cast(),
                        buf.len(),
                    )
                };
                if got >= 0 {
                    xa.push(format!("k{k}={}", got));
                }
            }
            let desc = if ft.is_dir() {
                stack.push(r.clone());
                format!(
                    "dir mode {:o} nlink {} xattrs {:?}",
                    md.mode(),
                    md.nlink(),
                    xa
                )
            } else if ft.is_symlink() {
                format!("symlink -> {:?}", fs::read_link(&path).unwrap())
            } else {
                let data = fs::read(&path).unwrap();
                format!(
                    "file mode {:o} nlink {} size {} crc {:08x} xattrs {:?}",
                    md.mode(),
                    md.nlink(),
                    md.len(),
                    crc(&data),
                    xa
                )
            };
            out.insert(r.to_string_lossy().to_string(), desc);
        }
    }
    out
}

fn run_seed(seed: u64, ops: usize, ldfs_root: &Path, ref_root: &Path) -> Result<(), String> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut log = Vec::new();
    for k in 0..ops {
        let op = gen(&mut rng);
        let a = apply(ldfs_root, &op);
        let b = apply(ref_root, &op);
        log.push(format!("{k}: {op:?} -> ldfs {a:?} tmpfs {b:?}"));
        if a != b {
            return Err(format!("op {k} differs\n{}", log.join("\n")));
        }
        let (sa, sb) = (snapshot(ldfs_root), snapshot(ref_root));
        if sa != sb {
            let diff: Vec<String> = sa
                .iter()
                .filter(|(k, v)| sb.get(*k) != Some(v))
                .map(|(k, v)| format!("{k}: ldfs {v} / tmpfs {:?}", sb.get(k)))
                .chain(
                    sb.keys()
                        .filter(|k| !sa.contains_key(*k))
                        .map(|k| format!("{k}: only in tmpfs")),
                )
                .collect();
            return Err(format!(
                "trees differ after op {k}: {diff:#?}\n{}",
                log.join("\n")
            ));
        }
    }
    Ok(())
}

#[test]
fn ldfs_agrees_with_tmpfs() {
    agrees_with_tmpfs(Layout::OneLog);
}

/// The same on the dual layout (metadata log on one image, file data in
/// groups on another).
#[test]
fn dual_ldfs_agrees_with_tmpfs() {
    agrees_with_tmpfs(Layout::Dual);
}

/// The same on a store-backed file system (issue 20), its segments uploaded every second
/// while the operations run, then a mount on an empty cache (machine loss after the final
/// upload) must hold the same tree as tmpfs.
#[test]
fn store_ldfs_agrees_with_tmpfs() {
    agrees_with_tmpfs(Layout::Store);
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Layout {
    OneLog,
    Dual,
    Store,
}

fn agrees_with_tmpfs(layout: Layout) {
    if !fuse_usable() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let Some(tmp) = Tmpfs::new(&t.path().join("ref")) else {
        return;
    };
    let img = t.path().join("diff.img");
    let (source, extra) = match layout {
        Layout::OneLog => {
            mkfs(&img, "512M");
            (img.clone(), MountExtra::default())
        }
        Layout::Dual => {
            mkfs_dual(&img, &t.path().join("meta.img"), "512M");
            (img.clone(), MountExtra::default())
        }
        Layout::Store => match mkfs_store("diff", &img, "512M") {
            Some(s) => s,
            None => return,
        },
    };
    let opts: &[&str] = match layout {
        Layout::Store => &["upload=1"],
        _ => &[],
    };
    let m = Mount::new_with(&source, &t.path().join("mnt"), opts, &extra);
    let ops: usize = std::env::var("LDFS_DIFF_OPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let seeds: Vec<u64> = match std::env::var("LDFS_SEED") {
        Ok(s) => vec![s.parse().unwrap()],
        Err(_) => (1..=4).collect(),
    };
    for &seed in &seeds {
        let (a, b) = (
            m.dir.join(format!("s{seed}")),
            tmp.0.join(format!("s{seed}")),
        );
        fs::create_dir(&a).unwrap();
        fs::create_dir(&b).unwrap();
        if let Err(e) = run_seed(seed, ops, &a, &b) {
            panic!(
                "seed {seed}: {e}\nreplay: LDFS_SEED={seed} LDFS_DIFF_OPS={ops} cargo test --release -p ldfs-tools --test differential"
            );
        }
    }
    m.unmount();
    if layout == Layout::Store {
        // The machine is lost after the final upload: a mount on an empty cache.
        let fresh = MountExtra {
            args: vec!["--cache".into(), t.path().join("fresh.img").into()],
            envs: extra.envs.clone(),
        };
        let m = Mount::new_with(&source, &t.path().join("mnt"), &[], &fresh);
        for seed in seeds {
            let d = format!("s{seed}");
            let (got, want) = (snapshot(&m.dir.join(&d)), snapshot(&tmp.0.join(&d)));
            assert!(
                got == want,
                "seed {seed}: a fresh cache from the store differs from tmpfs:\n{got:#?}\nvs\n{want:#?}"
            );
        }
        m.unmount();
    }
}
