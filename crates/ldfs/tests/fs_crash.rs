//! The file system crashed through the engine's crash device at many points:
//! after every recovery the tree passes `Fs::check`, and equals the tree as
//! it was after some operation no earlier than the last fsync (every
//! operation is one ARU and the log is one sequence, so what survives is a
//! prefix of what was done, and fsync makes everything before it durable).
//! `LDFS_FS_CRASH_CYCLES` (default 300), `LDFS_SEED`.

use std::sync::Arc;

use ldfs::device::{CrashDevice, CrashOptions};
use ldfs::fs::Fs;
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
