//! The file system crashed through the engine's crash device at many points:
//! after every recovery the tree passes `Fs::check`, and equals the tree as
//! it was after some operation no earlier than the last fsync (every
//! operation is one ARU and the log is one sequence, so what survives is a
//! prefix of what was done, and fsync makes everything before it durable).
//! `LDFS_FS_CRASH_CYCLES` (default 300), `LDFS_SEED`.

use std::collections::BTreeMap;
use std::sync::Arc;

use ldfs::device::{CrashDevice, CrashOptions};
use ldfs::fs::inode::Time;
use ldfs::fs::{Ctx, Fs, FsError, FsOptions, RenameFlags, ROOT_INO};
use ldfs::ld::LogicalDisk;
use ldfs::lld::layout::MkfsOptions;
use ldfs::lld::{Lld, LldOptions};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const CTX: Ctx = Ctx { uid: 0, gid: 0 };
const NAMES: [&[u8]; 6] = [b"a", b"b", b"c", b"d", b"e", b"f"];

fn lld_opts() -> LldOptions {
    LldOptions {
        map_budget_bytes: 256 << 10,
        checkpoint_log_bytes: 512 << 10,
        partial_bytes: 64 << 10,
        // The thread that seals a partial segment writes it, and
        // checkpoints stay pending until an operation needs one finished:
        // the device sees one order of writes per seed, so a printed seed
        // replays exactly.
        checkpoint_thread: false,
        log_writer_thread: false,
        ..Default::default()
    }
}

type Tree = BTreeMap<String, String>;

/// The whole tree: path -> kind, size and a content hash.
fn snapshot(fs: &Fs) -> Tree {
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
                let desc = match a.kind {
                    ldfs::fs::inode::Kind::Dir => {
                        stack.push((e.ino, p.clone()));
                        format!("dir nlink {}", a.nlink)
                    }
                    ldfs::fs::inode::Kind::File => {
                        let data = fs.read(e.ino, 0, a.size as u32 + 1).unwrap();
                        assert_eq!(data.len() as u64, a.size);
                        let h = data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| {
                            (h ^ x as u64).wrapping_mul(0x100_0000_01b3)
                        });
                        format!("file nlink {} size {} {h:x}", a.nlink, a.size)
                    }
                    k => format!("{k:?}"),
                };
                out.insert(p, desc);
            }
        }
    }
    out
}

fn ok_or_expected<T>(r: Result<T, FsError>) -> Option<T> {
    match r {
        Ok(v) => Some(v),
        Err(
            FsError::NotFound
            | FsError::Exists
            | FsError::NotDir
            | FsError::IsDir
            | FsError::NotEmpty
            | FsError::Invalid(_)
            | FsError::NoSpace,
        ) => None,
        Err(e) => panic!("unexpected error {e:?}"),
    }
}

fn dir_of(fs: &Fs, rng: &mut ChaCha8Rng) -> u64 {
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
fn op(fs: &Fs, rng: &mut ChaCha8Rng, log: &mut Vec<String>, states: &mut Vec<Tree>) -> bool {
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

fn cycles() -> u64 {
    std::env::var("LDFS_FS_CRASH_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300)
}

const START: Time = Time {
    secs: 1_700_000_000,
    nsecs: 0,
};

/// A clock that advances a microsecond a call from a fixed start: the same
/// seed gives the same inode records, so the same images.
fn fs_opts() -> FsOptions {
    let tick = std::sync::atomic::AtomicU32::new(0);
    FsOptions {
        clock: Box::new(move || Time {
            secs: START.secs,
            nsecs: tick.fetch_add(1000, std::sync::atomic::Ordering::Relaxed) % 1_000_000_000,
        }),
        ..Default::default()
    }
}

fn base_seed() -> u64 {
    std::env::var("LDFS_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2026)
}

#[test]
fn fs_survives_crashes_at_any_point() {
    run(base_seed(), cycles(), false);
}

/// A seed replays exactly: two runs crash to byte-identical images.
#[test]
fn fs_crash_seed_replays_exactly() {
    let seed = base_seed() ^ 0x5a;
    assert_eq!(
        run(seed, 25, true),
        run(seed, 25, true),
        "seed {seed}: two runs crashed to different images"
    );
}

/// Runs `cycles` crash-and-recover cycles; returns a digest of the crash
/// images (0 unless `digest`).
fn run(seed: u64, cycles: u64, digest: bool) -> u32 {
    let mut sum = 0u32;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mkfs = MkfsOptions {
        segment_bytes: 256 << 10,
        max_block_bytes: 64 << 10,
        reserved_segments: Some(8),
        fs_id: 99,
    };
    let mut dev = Arc::new(CrashDevice::new(48 << 20));
    {
        let lld = Lld::create(dev.clone(), &mkfs, lld_opts()).unwrap();
        Fs::format_at(&lld, CTX, START).unwrap();
        lld.close().unwrap();
    }
    for cycle in 0..cycles {
        let lld = Arc::new(Lld::open(dev.clone(), lld_opts()).unwrap());
        let ld: Arc<dyn LogicalDisk> = lld.clone();
        let fs = Fs::mount(ld, fs_opts()).unwrap();
        let mut states = vec![snapshot(&fs)];
        let mut synced = 0;
        let mut log = Vec::new();
        let n = rng.gen_range(1..40);
        for _ in 0..n {
            if op(&fs, &mut rng, &mut log, &mut states) {
                synced = states.len() - 1;
            }
            states.push(snapshot(&fs));
        }
        let image = dev.crash_image(
            rng.gen(),
            &CrashOptions {
                keep_probability: rng.gen_range(0.0..1.0),
                tear_probability: rng.gen_range(0.0..0.5),
            },
        );
        drop(fs);
        match Arc::try_unwrap(lld) {
            Ok(l) => l.abandon(),
            Err(_) => panic!("engine still shared"),
        }
        if digest {
            sum = crc32c::crc32c_append(sum, &image);
        }
        dev = Arc::new(CrashDevice::from_image(image));
        let lld = Arc::new(Lld::open(dev.clone(), lld_opts()).unwrap());
        let ld: Arc<dyn LogicalDisk> = lld.clone();
        let fs = Fs::mount(ld, fs_opts()).unwrap();
        let report = fs.check().unwrap();
        assert!(
            report.problems.is_empty(),
            "seed {seed} cycle {cycle}: check found {:#?}\nreplay: LDFS_SEED={seed} cargo test --release -p ldfs --test fs_crash",
            report.problems
        );
        let got = snapshot(&fs);
        if !states[synced..].contains(&got) {
            let diff = |a: &Tree, b: &Tree| -> Vec<String> {
                let mut d: Vec<String> = a
                    .iter()
                    .filter(|(k, v)| b.get(*k) != Some(v))
                    .map(|(k, v)| format!("{k}: {v} / {:?}", b.get(k)))
                    .collect();
                d.extend(
                    b.keys()
                        .filter(|k| !a.contains_key(*k))
                        .map(|k| format!("{k}: absent / {:?}", b[k])),
                );
                d
            };
            let closest = states[synced..]
                .iter()
                .enumerate()
                .min_by_key(|(_, s)| diff(&got, s).len())
                .unwrap();
            panic!(
                "seed {seed} cycle {cycle}: recovered tree is no state at or after the last fsync (op {synced} of {n})\n\
                 ops {log:#?}\nclosest: state {} differs in {:#?}\nreplay: LDFS_SEED={seed} cargo test --release -p ldfs --test fs_crash",
                closest.0 + synced,
                diff(&got, closest.1)
            );
        }
        drop(fs);
        match Arc::try_unwrap(lld) {
            Ok(l) => l.close().unwrap(),
            Err(_) => panic!("engine still shared"),
        }
        // Every so often start afresh: there is no cleaner yet.
        if cycle % 40 == 39 {
            dev = Arc::new(CrashDevice::new(48 << 20));
            let lld = Lld::create(dev.clone(), &mkfs, lld_opts()).unwrap();
            Fs::format_at(&lld, CTX, START).unwrap();
            lld.close().unwrap();
        }
    }
    sum
}
