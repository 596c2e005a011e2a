//! Snapshots through the public API (issue 18, docs/DESIGN.md "Snapshots"):
//! a snapshot reads its moment through an engine opened at it beside the
//! live one; the cleaner at 85% of the capacity keeps three snapshots of a
//! third of the data each; a snapshot reads right while the live engine
//! churns and cleans; deletion gives history's space back. The crash test
//! with snapshots is in crash.rs. Every test prints its seed on failure;
//! `LDFS_SEED` replays.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use ldfs::device::{Device, MemoryDevice};
use ldfs::ld::{LdError, ListHints, ListId, LogicalDisk};
use ldfs::lld::layout::MkfsOptions;
use ldfs::lld::{CleanerOptions, Lld, LldOptions, PolicyKind};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn seed(default: u64) -> u64 {
    std::env::var("LDFS_SEED")
        .map(|v| v.parse().expect("LDFS_SEED must be a number"))
        .unwrap_or(default)
}

/// Runs `f(seed)` and prints the replay line if it panics.
fn with_seed(name: &str, default: u64, f: impl FnOnce(u64) + std::panic::UnwindSafe) {
    let s = seed(default);
    if let Err(e) = std::panic::catch_unwind(move || f(s)) {
        eprintln!("replay: LDFS_SEED={s} cargo test --release -p ldfs --test snapshots {name}");
        std::panic::resume_unwind(e);
    }
}

fn mkfs() -> MkfsOptions {
    MkfsOptions {
        segment_bytes: 128 << 10,
        max_block_bytes: 16 << 10,
        reserved_segments: Some(8),
        fs_id: 0x5a95,
        max_bytes: None,
        kept_pages: 0,
    }
}

fn opts() -> LldOptions {
    LldOptions {
        map_budget_bytes: 256 << 10,
        cleaner: CleanerOptions {
            policy: PolicyKind::FreeWeighted,
            ..Default::default()
        },
        ..Default::default()
    }
}

/// An engine at snapshot `n` of `dev`, read-only, with a small map budget
/// so its leaves are read again and again from the device.
fn reader(dev: &Arc<MemoryDevice>, n: u64) -> LdResult<Lld> {
    Lld::open(
        dev.clone() as Arc<dyn Device>,
        LldOptions {
            read_only: true,
            snapshot: Some(n),
            map_budget_bytes: 32 << 10,
            ..Default::default()
        },
    )
}

type LdResult<T> = Result<T, LdError>;
type Blocks = BTreeMap<u64, Vec<u8>>;

fn block(rng: &mut ChaCha8Rng, tag: u64) -> Vec<u8> {
    let mut d = vec![rng.gen::<u8>(); 4096];
    d[..8].copy_from_slice(&tag.to_le_bytes());
    for _ in 0..4 {
        let i = rng.gen_range(8..4096);
        d[i] = rng.gen();
    }
    d
}

fn fill(lld: &Lld, list: ListId, from: u64, n: u64, rng: &mut ChaCha8Rng, model: &mut Blocks) {
    for i in from..from + n {
        let d = block(rng, i);
        lld.write(None, list, i, &d)
            .unwrap_or_else(|e| panic!("write {list}/{i}: {e}"));
        model.insert(i, d);
    }
}

fn read_all(lld: &Lld, list: ListId) -> Blocks {
    lld.read_range(list, 0..u64::MAX, usize::MAX)
        .unwrap_or_else(|e| panic!("read {list}: {e}"))
        .into_iter()
        .collect()
}

#[test]
fn a_snapshot_reads_its_moment_beside_the_live_engine() {
    with_seed("a_snapshot_reads_its_moment", 1, |s| {
        let mut rng = ChaCha8Rng::seed_from_u64(s);
        let dev = Arc::new(MemoryDevice::new(24 << 20));
        let lld = Lld::create(dev.clone(), &mkfs(), opts()).unwrap();
        let a = lld.create_list(None, ListHints::default()).unwrap();
        let mut then = Blocks::new();
        fill(&lld, a, 0, 300, &mut rng, &mut then);
        assert_eq!(lld.history_bytes(), 0);
        let n = lld.take_snapshot("before", 1_700_000_000).unwrap();
        let listed = lld.snapshots();
        assert_eq!(listed.len(), 1);
        assert_eq!((listed[0].number, listed[0].name.as_str()), (n, "before"));
        assert_eq!(listed[0].time_secs, 1_700_000_000);
        // Change everything: overwrite half, delete the list, make another.
        let mut now = then.clone();
        fill(&lld, a, 0, 150, &mut rng, &mut now);
        lld.delete_list(None, a).unwrap();
        let b = lld.create_list(None, ListHints::default()).unwrap();
        let mut later = Blocks::new();
        fill(&lld, b, 0, 50, &mut rng, &mut later);
        lld.flush().unwrap();
        assert!(
            lld.history_bytes() >= 300 * 4096,
            "history holds the deleted list: {}",
            lld.history_bytes()
        );
        // The snapshot beside the live engine reads its moment.
        let r = reader(&dev, n).unwrap();
        assert_eq!(read_all(&r, a), then);
        assert!(
            r.list_hints(b).unwrap().is_none(),
            "a later list in the snapshot"
        );
        for e in [
            r.write(None, a, 0, b"x").unwrap_err(),
            r.delete_list(None, a).unwrap_err(),
            r.create_list(None, ListHints::default()).unwrap_err(),
        ] {
            assert!(matches!(e, LdError::ReadOnly(_)), "{e}");
        }
        assert!(r.take_snapshot("", 0).is_err());
        assert_eq!(read_all(&lld, b), later);
        assert!(lld.list_hints(a).unwrap().is_none());
        // Unknown numbers are refused, at open and at deletion.
        assert!(matches!(
            reader(&dev, n + 99),
            Err(LdError::InvalidArgument(_))
        ));
        assert!(matches!(
            lld.delete_snapshot(n + 99),
            Err(LdError::InvalidArgument(_))
        ));
        let problems = lld.check_snapshots(true).unwrap();
        assert!(problems.is_empty(), "{problems:?}");
        // Survives close and open, and the live engine's checks.
        lld.close().unwrap();
        drop(lld);
        let lld = Lld::open(dev.clone(), opts()).unwrap();
        assert_eq!(lld.snapshots().len(), 1);
        assert_eq!(read_all(&r, a), then);
        assert!(lld.check_usage().unwrap().is_empty());
        // Deleting it gives the history back (released by its checkpoint).
        let (clean_before, _) = lld.clean_segment_counts();
        lld.delete_snapshot(n).unwrap();
        assert!(lld.snapshots().is_empty());
        assert_eq!(lld.history_bytes(), 0);
        let (clean_after, _) = lld.clean_segment_counts();
        assert!(
            clean_after >= clean_before + 8,
            "deleting the snapshot released too little: {clean_before} -> {clean_after}"
        );
        assert!(matches!(reader(&dev, n), Err(LdError::InvalidArgument(_))));
        assert_eq!(read_all(&lld, b), later);
        assert!(lld.check_usage().unwrap().is_empty());
    });
}

#[test]
fn names_and_the_snapshot_limit_are_checked() {
    let dev = Arc::new(MemoryDevice::new(16 << 20));
    let lld = Lld::create(dev.clone(), &mkfs(), opts()).unwrap();
    assert!(matches!(
        lld.take_snapshot(&"n".repeat(65), 0),
        Err(LdError::InvalidArgument(_))
    ));
    let a = lld.create_list(None, ListHints::default()).unwrap();
    let mut taken = Vec::new();
    for i in 0..24u64 {
        lld.write(None, a, i, &i.to_le_bytes()).unwrap();
        taken.push(lld.take_snapshot(&format!("s{i}"), i).unwrap());
    }
    assert!(matches!(
        lld.take_snapshot("one more", 0),
        Err(LdError::InvalidArgument(_))
    ));
    // Each reads its own moment: blocks 0..=i.
    for (i, &n) in taken.iter().enumerate() {
        let r = reader(&dev, n).unwrap();
        assert_eq!(
            r.indices(a, 0, usize::MAX).unwrap().len(),
            i + 1,
            "snapshot {n}"
        );
    }
    lld.delete_snapshot(taken[5]).unwrap();
    // The freed pin bit is reused, and the others are untouched.
    let n = lld.take_snapshot("again", 99).unwrap();
    assert!(n > *taken.last().unwrap());
    assert_eq!(lld.snapshots().len(), 24);
    let problems = lld.check_snapshots(true).unwrap();
    assert!(problems.is_empty(), "{problems:?}");
}

/// Issue 18's cleaner test: three snapshots, each holding a third of the
/// data, 85% of the capacity in all; a hot list outside every snapshot is
/// then overwritten many times its size, so the cleaner must work in what
/// history leaves. Every snapshot and the live tree read right, the space
/// figures say what history holds, and deleting a snapshot gives its space
/// back.
#[test]
fn the_cleaner_at_85_percent_keeps_three_snapshots_of_a_third_each() {
    with_seed("the_cleaner_at_85_percent", 3, |s| {
        let mut rng = ChaCha8Rng::seed_from_u64(s);
        let dev = Arc::new(MemoryDevice::new(48 << 20));
        let lld = Lld::create(dev.clone(), &mkfs(), opts()).unwrap();
        let capacity = lld.capacity_bytes();
        // 4 KiB blocks and their 38-byte records.
        let third = capacity * 85 / 100 / 3 / (4096 + 38);
        let mut snaps: Vec<(u64, ListId, Blocks)> = Vec::new();
        for k in 0..3u64 {
            let l = lld.create_list(None, ListHints::default()).unwrap();
            let mut m = Blocks::new();
            fill(&lld, l, 0, third, &mut rng, &mut m);
            let n = lld.take_snapshot(&format!("third {k}"), k).unwrap();
            snaps.push((n, l, m));
            if k < 2 {
                // Only the snapshot holds it from now on.
                lld.delete_list(None, l).unwrap();
            }
        }
        let held = lld.history_bytes();
        assert!(
            held >= 2 * third * 4096,
            "history holds two deleted thirds: {held}"
        );
        let space = lld.space();
        assert!(
            space.available_bytes < capacity * 16 / 100,
            "history counted as available: {space:?}"
        );
        // A hot list nobody snapshots, overwritten twenty times its size.
        let hot = lld.create_list(None, ListHints::default()).unwrap();
        let hot_blocks = (space.available_bytes * 9 / 10 / (4096 + 38)).max(16);
        let mut hot_model = Blocks::new();
        fill(&lld, hot, 0, hot_blocks, &mut rng, &mut hot_model);
        let moved0 = lld.cleaner_stats().blocks_moved;
        for _ in 0..20 * hot_blocks {
            let i = rng.gen_range(0..hot_blocks);
            let d = block(&mut rng, i);
            lld.write(None, hot, i, &d)
                .unwrap_or_else(|e| panic!("hot overwrite at {i}: {e} ({:?})", lld.space()));
            hot_model.insert(i, d);
        }
        let moved = lld.cleaner_stats().blocks_moved - moved0;
        assert!(moved > 0, "the cleaner never ran");
        assert_eq!(read_all(&lld, hot), hot_model);
        assert_eq!(read_all(&lld, snaps[2].1), snaps[2].2);
        for (n, l, m) in &snaps {
            let r = reader(&dev, *n).unwrap();
            assert_eq!(&read_all(&r, *l), m, "snapshot {n}");
        }
        assert!(lld.check_usage().unwrap().is_empty());
        let problems = lld.check_snapshots(true).unwrap();
        assert!(problems.is_empty(), "{problems:?}");
        // What a snapshot alone holds is what its deletion frees: the
        // first third cannot be written again until it is deleted.
        let alone = lld.snapshots()[0].held_alone_bytes;
        assert!(alone >= third * 4096, "snapshot 1 alone holds {alone}");
        let l = lld.create_list(None, ListHints::default()).unwrap();
        let refused = (0..third).any(|i| {
            let d = block(&mut rng, i);
            matches!(lld.write(None, l, i, &d), Err(LdError::NoSpace { .. }))
        });
        assert!(refused, "a third more fitted beside history");
        lld.delete_list(None, l).unwrap();
        lld.delete_snapshot(snaps[0].0).unwrap();
        let l = lld.create_list(None, ListHints::default()).unwrap();
        let mut m = Blocks::new();
        fill(&lld, l, 0, third * 9 / 10, &mut rng, &mut m);
        assert_eq!(read_all(&lld, l), m);
        for (n, l, m) in &snaps[1..] {
            let r = reader(&dev, *n).unwrap();
            assert_eq!(
                &read_all(&r, *l),
                m,
                "snapshot {n} after the first was deleted"
            );
        }
        eprintln!(
            "seed {s}: capacity {capacity}, third {third} blocks, hot {hot_blocks} blocks, \
             moved {moved}, cleaner {:?}",
            lld.cleaner_stats()
        );
    });
}

/// A reader thread reads a snapshot over and over (its map leaves evicted
/// and read again) while the live engine overwrites what the snapshot
/// holds, churns a hot list and cleans, with the background cleaner on.
#[test]
fn a_snapshot_reads_right_while_the_live_engine_churns_and_cleans() {
    with_seed("a_snapshot_reads_right_while", 5, |s| {
        let mut rng = ChaCha8Rng::seed_from_u64(s);
        let dev = Arc::new(MemoryDevice::new(32 << 20));
        let mut o = opts();
        o.cleaner.background = true;
        o.cleaner.idle_ms = 1;
        let lld = Lld::create(dev.clone(), &mkfs(), o).unwrap();
        let a = lld.create_list(None, ListHints::default()).unwrap();
        let mut then = Blocks::new();
        fill(&lld, a, 0, 1200, &mut rng, &mut then);
        let n = lld.take_snapshot("", 0).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let rd = {
            let (dev, stop, then) = (dev.clone(), stop.clone(), then.clone());
            std::thread::spawn(move || {
                let r = reader(&dev, n).unwrap();
                let mut rounds = 0u64;
                while !stop.load(Ordering::Relaxed) || rounds < 3 {
                    assert_eq!(read_all(&r, a), then, "snapshot {n}, round {rounds}");
                    rounds += 1;
                }
                rounds
            })
        };
        let hot = lld.create_list(None, ListHints::default()).unwrap();
        let mut hot_model = Blocks::new();
        fill(&lld, hot, 0, 600, &mut rng, &mut hot_model);
        for round in 0..6 {
            for _ in 0..1500 {
                let i = rng.gen_range(0..600);
                let d = block(&mut rng, i);
                lld.write(None, hot, i, &d).unwrap();
                hot_model.insert(i, d);
            }
            // Overwrite some of what the snapshot holds, too.
            for _ in 0..100 {
                let i = rng.gen_range(0..1200);
                let d = block(&mut rng, i);
                lld.write(None, a, i, &d).unwrap();
            }
            lld.clean_now(PolicyKind::Greedy, Some(4), 1.0, &AtomicBool::new(false))
                .unwrap_or_else(|e| panic!("round {round}: clean: {e}"));
        }
        stop.store(true, Ordering::Relaxed);
        let rounds = rd.join().expect("reader panicked");
        assert_eq!(read_all(&lld, hot), hot_model);
        assert!(lld.cleaner_stats().blocks_moved > 0, "nothing was cleaned");
        let problems = lld.check_snapshots(true).unwrap();
        assert!(problems.is_empty(), "{problems:?}");
        eprintln!("seed {s}: the reader read the snapshot {rounds} times");
    });
}

/// A protected checkpoint (`protect=`) is kept and read as a snapshot, but
/// what only protected checkpoints hold counts as available (they yield
/// when space runs short), and a snapshot's never does; the flag survives
/// close and open.
#[test]
fn a_protected_checkpoints_history_is_available_and_a_snapshots_is_not() {
    with_seed("a_protected_checkpoints_history", 5, |s| {
        let mut rng = ChaCha8Rng::seed_from_u64(s);
        let dev = Arc::new(MemoryDevice::new(24 << 20));
        let lld = Lld::create(dev.clone(), &mkfs(), opts()).unwrap();
        let a = lld.create_list(None, ListHints::default()).unwrap();
        let mut then = Blocks::new();
        fill(&lld, a, 0, 300, &mut rng, &mut then);
        lld.checkpoint_now().unwrap();
        let before = lld.space().available_bytes;
        let p = lld.take_protected(1_700_000_000, 0).unwrap();
        lld.delete_list(None, a).unwrap();
        lld.checkpoint_now().unwrap();
        let history = lld.history_bytes();
        assert!(history >= 300 * 4096, "history {history}");
        let with_protected = lld.space().available_bytes;
        // The deleted blocks are available: only the protected one holds them.
        assert!(
            with_protected >= before + 300 * 4096,
            "available {before} -> {with_protected} with {history} protected"
        );
        let listed = lld.snapshots();
        assert_eq!((listed[0].number, listed[0].protected), (p, true));
        assert_eq!(read_all(&reader(&dev, p).unwrap(), a), then);

        // A snapshot of the same moment holds the same segments: now
        // nothing is held by protected checkpoints alone.
        lld.close().unwrap();
        drop(lld);
        let lld = Lld::open(dev.clone(), opts()).unwrap();
        assert!(lld.snapshots()[0].protected, "the flag survives reopening");
        let b = lld.create_list(None, ListHints::default()).unwrap();
        let mut now = Blocks::new();
        fill(&lld, b, 0, 300, &mut rng, &mut now);
        let n = lld.take_snapshot("kept", 1_700_000_100).unwrap();
        lld.delete_list(None, b).unwrap();
        lld.checkpoint_now().unwrap();
        let space = lld.space();
        let footprint = space.capacity_bytes - space.available_bytes;
        assert!(
            footprint >= 300 * 4096,
            "the snapshot's history is not available: footprint {footprint}"
        );
        lld.delete_snapshot(p).unwrap();
        lld.delete_snapshot(n).unwrap();
        assert_eq!(lld.history_bytes(), 0);
        assert!(lld.check_usage().unwrap().is_empty());
    });
}

/// A snapshot take waits for the open ARU that logged something, and wakes
/// as soon as it ends (the end notifies only when someone waits: a lost
/// wake-up would show as the full `SNAPSHOT_ARU_WAIT`, 30 s).
#[test]
fn a_take_waiting_for_an_aru_wakes_when_it_ends() {
    let dev = Arc::new(MemoryDevice::new(24 << 20));
    let lld = Arc::new(Lld::create(dev, &mkfs(), opts()).unwrap());
    let l = lld.create_list(None, ListHints::default()).unwrap();
    for round in 0..3 {
        let aru = lld.begin_aru().unwrap();
        lld.write(Some(aru), l, round, &[round as u8; 4096])
            .unwrap();
        let t = {
            let lld = lld.clone();
            std::thread::spawn(move || {
                let start = std::time::Instant::now();
                let n = lld.take_snapshot(&format!("s{round}"), 0).unwrap();
                (n, start.elapsed())
            })
        };
        std::thread::sleep(std::time::Duration::from_millis(150));
        lld.end_aru(aru).unwrap();
        let (_, took) = t.join().unwrap();
        assert!(
            took < std::time::Duration::from_secs(5),
            "round {round}: the take waited {took:?}"
        );
    }
    assert_eq!(lld.snapshots().len(), 3);
}

/// `protect=` at the granularity of the commit interval (issue 18): on an
/// image with a kept table, a protected checkpoint taken after every few
/// writes (the daemon takes one each commit interval) in generations of
/// eight "seconds" shares its generation's pin bit; after a reopen every
/// one of them reads as the model's tree of its moment; fsck reads each
/// shared leaf once, not once per tree; one record of a generation frees
/// nothing, the whole generation frees its history, and the others still
/// read their moments.
#[test]
fn every_protected_checkpoint_of_the_span_reads_its_moment() {
    with_seed("every_protected_checkpoint", 6, |s| {
        let mut rng = ChaCha8Rng::seed_from_u64(s);
        let dev = Arc::new(MemoryDevice::new(24 << 20));
        let kept = MkfsOptions {
            kept_pages: 1,
            ..mkfs()
        };
        let lld = Lld::create(dev.clone(), &kept, opts()).unwrap();
        assert_eq!(lld.kept_capacity(), 4096 / 48);
        let a = lld.create_list(None, ListHints::default()).unwrap();
        // Small blocks: 2000 entries, 16 leaves in each tree.
        let mut model = Blocks::new();
        let small = |rng: &mut ChaCha8Rng, i: u64| {
            let mut d = vec![rng.gen::<u8>(); 64];
            d[..8].copy_from_slice(&i.to_le_bytes());
            d
        };
        for i in 0..2000 {
            let d = small(&mut rng, i);
            lld.write(None, a, i, &d).unwrap();
            model.insert(i, d);
        }
        const TAKES: u64 = 40;
        const WINDOW: u64 = 8;
        let mut moments = Vec::new();
        for t in 0..TAKES {
            for _ in 0..3 {
                let i = rng.gen_range(0..2200);
                if rng.gen_bool(0.2) {
                    lld.delete(None, a, i).unwrap();
                    model.remove(&i);
                } else {
                    let d = small(&mut rng, i);
                    lld.write(None, a, i, &d).unwrap();
                    model.insert(i, d);
                }
            }
            let n = lld.take_protected(1_700_000_000 + t, WINDOW).unwrap();
            moments.push((n, model.clone()));
        }
        let listed = lld.snapshots();
        assert_eq!(listed.len(), TAKES as usize);
        let pins: std::collections::BTreeSet<u32> = listed.iter().map(|s| s.pin).collect();
        assert_eq!(
            pins.len(),
            (TAKES / WINDOW) as usize,
            "one pin bit a window"
        );
        lld.close().unwrap();
        drop(lld);
        let lld = Lld::open(dev.clone(), opts()).unwrap();
        let ids = |v: &[ldfs::lld::SnapshotInfo]| -> Vec<(u64, u64, u32, bool)> {
            v.iter()
                .map(|s| (s.number, s.time_secs, s.pin, s.protected))
                .collect()
        };
        assert_eq!(
            ids(&lld.snapshots()),
            ids(&listed),
            "the kept table survives reopening"
        );
        for (n, want) in &moments {
            assert_eq!(
                read_all(&reader(&dev, *n).unwrap(), a),
                *want,
                "checkpoint {n}"
            );
        }
        let (problems, leaves) = lld.check_snapshots_counted(true).unwrap();
        assert!(problems.is_empty(), "{problems:?}");
        // At most 3 leaves change a take; one by one it would be 40 x 16+.
        assert!(
            leaves <= 17 + 3 * TAKES,
            "fsck read {leaves} leaves for {TAKES} trees"
        );
        // The oldest generation: one record frees nothing (its bit stays on
        // every segment), all of it takes the bit off every segment.
        let oldest: Vec<u64> = listed
            .iter()
            .filter(|s| s.pin == listed[0].pin)
            .map(|s| s.number)
            .collect();
        assert_eq!(oldest.len(), WINDOW as usize);
        assert_eq!(lld.kept_bytes_of(&oldest[..1], false), 0);
        let frees = lld.kept_bytes_of(&oldest, false);
        let bit = 1u32 << listed[0].pin;
        let carrying = |l: &Lld| {
            l.segment_usage()
                .iter()
                .filter(|(_, u)| u.pins & bit != 0)
                .count()
        };
        let pinned = carrying(&lld);
        assert!(pinned > 0);
        let history = lld.history_bytes();
        lld.delete_kept(&oldest[..1]).unwrap();
        assert_eq!(
            lld.history_bytes(),
            history,
            "a generation frees with its last record"
        );
        lld.delete_kept(&oldest[1..]).unwrap();
        assert!(
            lld.history_bytes() <= history - frees,
            "history {history} -> {} after freeing {frees}",
            lld.history_bytes()
        );
        assert!(lld.snapshots().iter().all(|s| s.pin != listed[0].pin));
        assert_eq!(carrying(&lld), 0, "the generation's bit is gone");
        for (n, want) in &moments[WINDOW as usize..] {
            assert_eq!(
                read_all(&reader(&dev, *n).unwrap(), a),
                *want,
                "checkpoint {n}"
            );
        }
        assert!(lld.check_snapshots(true).unwrap().is_empty());
    });
}

/// An image without a kept table (the older format) keeps protected
/// checkpoints as before: one pin bit each, whatever the window, at most
/// 24 with the snapshots, and they read their moments after a reopen.
#[test]
fn without_a_kept_table_protected_checkpoints_keep_a_bit_each() {
    with_seed("without_a_kept_table", 7, |s| {
        let mut rng = ChaCha8Rng::seed_from_u64(s);
        let dev = Arc::new(MemoryDevice::new(24 << 20));
        let lld = Lld::create(dev.clone(), &mkfs(), opts()).unwrap();
        assert_eq!(lld.kept_capacity(), 24);
        let a = lld.create_list(None, ListHints::default()).unwrap();
        let mut model = Blocks::new();
        let mut moments = Vec::new();
        for t in 0..4 {
            fill(&lld, a, t * 10, 10, &mut rng, &mut model);
            moments.push((lld.take_protected(100 + t, 1000).unwrap(), model.clone()));
        }
        lld.take_snapshot("s", 0).unwrap();
        let pins: std::collections::BTreeSet<u32> = lld.snapshots().iter().map(|s| s.pin).collect();
        assert_eq!(pins.len(), 5);
        assert_eq!(lld.kept_capacity(), 23);
        lld.close().unwrap();
        drop(lld);
        let lld = Lld::open(dev.clone(), opts()).unwrap();
        assert_eq!(lld.snapshots().len(), 5);
        for (n, want) in &moments {
            assert_eq!(read_all(&reader(&dev, *n).unwrap(), a), *want);
        }
    });
}
