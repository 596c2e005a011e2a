//! The file system crashed through the engine's crash device at many points:
//! after every recovery the tree passes `Fs::check`, and equals the tree as
//! it was after some operation no earlier than the last fsync (every
//! operation is one ARU and the log is one sequence, so what survives is a
//! prefix of what was done, and fsync makes everything before it durable).
//! `LDFS_FS_CRASH_CYCLES` (default 300), `LDFS_SEED`.

use std::sync::Arc;

use ldfs::device::{CrashDevice, CrashOptions};
use ldfs::fs::{Fs, FsError, Kill, RenameFlags, SetAttr, XattrMode, ROOT_INO};
use ldfs::ld::LogicalDisk;
use ldfs::lld::layout::MkfsOptions;
use ldfs::lld::{Lld, LldOptions};

mod common;

use common::{base_seed, env_u64, op, replay_fs_opts as fs_opts, snapshot, Tree, CTX, START};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

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

fn cycles() -> u64 {
    env_u64("LDFS_FS_CRASH_CYCLES", 300)
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
        max_bytes: None,
        kept_pages: 0,
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

/// A value of `len` bytes (8 at least) that says its own length and tag:
/// one read back whole is recognizable, a partial or mixed one is not.
fn tagged_value(len: usize, tag: u32) -> Vec<u8> {
    let mut v = vec![tag as u8; len];
    v[..4].copy_from_slice(&(len as u32).to_le_bytes());
    v[4..8].copy_from_slice(&tag.to_le_bytes());
    v
}

fn whole_tagged_value(v: &[u8]) -> bool {
    v.len() >= 8
        && u32::from_le_bytes(v[..4].try_into().unwrap()) as usize == v.len()
        && v[8..].iter().all(|&b| b == v[4])
}

/// Long extended attribute values (each in a list of its own) set,
/// replaced, removed, dropped as a file capability by writes, truncations
/// and chowns, and destroyed with their inodes (by unlink, by a rename over
/// them, and as orphans unlinked while open), crashed at many points:
/// after every recovery the check finds no list leaked or missing (the
/// mount destroyed the orphans with their lists) and every value reads
/// back whole.
#[test]
fn long_xattr_values_and_orphans_survive_crashes() {
    let seed = base_seed() ^ 0x13;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mkfs = MkfsOptions {
        segment_bytes: 256 << 10,
        max_block_bytes: 64 << 10,
        reserved_segments: Some(8),
        fs_id: 98,
        max_bytes: None,
        kept_pages: 0,
    };
    let mut dev = Arc::new(CrashDevice::new(48 << 20));
    {
        let lld = Lld::create(dev.clone(), &mkfs, lld_opts()).unwrap();
        Fs::format_at(&lld, CTX, START).unwrap();
        lld.close().unwrap();
    }
    let names: [&[u8]; 4] = [b"user.a", b"user.b", b"user.c", b"security.capability"];
    let mut tag = 0u32;
    for cycle in 0..cycles().div_ceil(3) {
        let lld = Arc::new(Lld::open(dev.clone(), lld_opts()).unwrap());
        let ld: Arc<dyn LogicalDisk> = lld.clone();
        let fs = Fs::mount(ld, fs_opts()).unwrap();
        let mut log = Vec::new();
        for _ in 0..rng.gen_range(1..40) {
            let n = common::NAMES[rng.gen_range(0..common::NAMES.len())];
            let ino = match fs.lookup(ROOT_INO, n) {
                Ok(a) => a.ino,
                Err(_) => match fs.mknod(CTX, ROOT_INO, n, 0o100644, 0) {
                    Ok(a) => a.ino,
                    Err(e) => panic!("seed {seed} cycle {cycle}: mknod: {e}"),
                },
            };
            let what = rng.gen_range(0..100);
            log.push(format!("{} ino {ino}: {what}", String::from_utf8_lossy(n)));
            let r = match what {
                0..=44 => {
                    tag += 1;
                    let len = [8, 4096, 4097, 30_000, 32_768, 32_769, 65_536][rng.gen_range(0..7)];
                    let name = names[rng.gen_range(0..names.len())];
                    fs.setxattr(ino, name, &tagged_value(len, tag), XattrMode::Any)
                }
                45..=54 => match fs.removexattr(ino, names[rng.gen_range(0..names.len())]) {
                    Err(FsError::NoAttr) => Ok(()),
                    r => r,
                },
                55..=59 => fs.write(ino, rng.gen_range(0..9000), &[1; 100]).map(drop),
                60..=64 => {
                    let sa = SetAttr {
                        size: Some(rng.gen_range(0..9000)),
                        kill: Kill::SuidAndSgid,
                        ..SetAttr::default()
                    };
                    fs.setattr(ino, &sa).map(drop)
                }
                65..=69 => {
                    let sa = SetAttr {
                        uid: Some(rng.gen_range(0..3)),
                        ..SetAttr::default()
                    };
                    fs.setattr(ino, &sa).map(drop)
                }
                70..=79 => fs.unlink(ROOT_INO, n),
                80..=89 => {
                    // Unlinked while open: left open at the crash, or
                    // closed (destroyed) now.
                    fs.open(ino).unwrap();
                    let r = fs.unlink(ROOT_INO, n);
                    if rng.gen_bool(0.5) {
                        fs.release(ino).unwrap();
                    }
                    r
                }
                90..=95 => {
                    let n2 = common::NAMES[rng.gen_range(0..common::NAMES.len())];
                    match fs.rename(ROOT_INO, n, ROOT_INO, n2, RenameFlags::default()) {
                        Err(FsError::Exists) => Ok(()),
                        r => r,
                    }
                }
                _ => fs.fsync(),
            };
            if let Err(e) = r {
                panic!("seed {seed} cycle {cycle}: {e}\nops {log:#?}");
            }
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
        dev = Arc::new(CrashDevice::from_image(image));
        let lld = Arc::new(Lld::open(dev.clone(), lld_opts()).unwrap());
        let ld: Arc<dyn LogicalDisk> = lld.clone();
        let fs = Fs::mount(ld, fs_opts())
            .unwrap_or_else(|e| panic!("seed {seed} cycle {cycle}: mount: {e}\nops {log:#?}"));
        let replay = format!(
            "replay: LDFS_SEED={} cargo test --release -p ldfs --test fs_crash long_xattr",
            base_seed()
        );
        let report = fs.check().unwrap();
        assert!(
            report.problems.is_empty(),
            "seed {seed} cycle {cycle}: check found {:#?}\nops {log:#?}\n{replay}",
            report.problems
        );
        for n in common::NAMES {
            let Ok(a) = fs.lookup(ROOT_INO, n) else {
                continue;
            };
            for x in fs.listxattr(a.ino).unwrap() {
                let v = fs.getxattr(a.ino, &x).unwrap_or_else(|e| {
                    panic!(
                        "seed {seed} cycle {cycle}: ino {} {x:?}: {e}\n{replay}",
                        a.ino
                    )
                });
                assert!(
                    whole_tagged_value(&v),
                    "seed {seed} cycle {cycle}: ino {} {x:?}: {} bytes, not a value written\n{replay}",
                    a.ino,
                    v.len()
                );
            }
        }
        drop(fs);
        match Arc::try_unwrap(lld) {
            Ok(l) => l.close().unwrap(),
            Err(_) => panic!("engine still shared"),
        }
        // Every so often start afresh: there is no cleaner yet.
        if cycle % 20 == 19 {
            dev = Arc::new(CrashDevice::new(48 << 20));
            let lld = Lld::create(dev.clone(), &mkfs, lld_opts()).unwrap();
            Fs::format_at(&lld, CTX, START).unwrap();
            lld.close().unwrap();
        }
    }
}
