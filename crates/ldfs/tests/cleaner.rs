//! The segment cleaner through the public API (issue 3): a device kept 90%
//! full under random overwrites of ten times its size, blocks deleted while
//! they are being cleaned, writers that wait for the cleaner instead of
//! failing, the background thread, and passes that crash at any device
//! write. Every test prints its seed on failure; `LDFS_SEED` replays.

use std::collections::BTreeMap;
use std::sync::Arc;

use ldfs::device::{CrashDevice, CrashOptions, MemoryDevice};
use ldfs::ld::{LdError, ListHints, ListId, LogicalDisk};
use ldfs::lld::layout::MkfsOptions;
use ldfs::lld::{CleanerOptions, Lld, LldOptions, PolicyKind};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

mod space_common;
use space_common::{bytes, fill_small_random, Model};

fn seed(default: u64) -> u64 {
    std::env::var("LDFS_SEED")
        .map(|v| v.parse().expect("LDFS_SEED must be a number"))
        .unwrap_or(default)
}

/// `with_seed` for each of the seeds `defaults`, or `LDFS_SEED` alone.
fn with_seeds(name: &str, defaults: std::ops::RangeInclusive<u64>, f: fn(u64)) {
    let seeds: Vec<u64> = match std::env::var("LDFS_SEED") {
        Ok(_) => vec![seed(0)],
        Err(_) => defaults.collect(),
    };
    for s in seeds {
        with_seed(name, s, f);
    }
}

/// Runs `f(seed)` and prints the replay line if it panics.
fn with_seed(name: &str, default: u64, f: impl FnOnce(u64) + std::panic::UnwindSafe) {
    let s = seed(default);
    if let Err(e) = std::panic::catch_unwind(move || f(s)) {
        eprintln!("replay: LDFS_SEED={s} cargo test --release -p ldfs --test cleaner {name}");
        std::panic::resume_unwind(e);
    }
}

fn mkfs(segment_bytes: u64, max_block: u32, reserved: u32) -> MkfsOptions {
    MkfsOptions {
        segment_bytes,
        max_block_bytes: max_block,
        reserved_segments: Some(reserved),
        fs_id: 0xc1ea,
        max_bytes: None,
        kept_pages: 0,
    }
}

fn opts(policy: PolicyKind) -> LldOptions {
    LldOptions {
        map_budget_bytes: 256 << 10,
        cleaner: CleanerOptions {
            policy,
            ..Default::default()
        },
        ..Default::default()
    }
}

fn verify(lld: &Lld, model: &Model, lists: &[ListId], what: &str) {
    for &l in lists {
        let want: Vec<u64> = model
            .range((l.0, 0)..(l.0 + 1, 0))
            .map(|((_, i), _)| *i)
            .collect();
        assert_eq!(
            lld.indices(l, 0, usize::MAX).unwrap(),
            want,
            "{what}: indices of {l}"
        );
    }
    for (&(l, i), &(s, len)) in model {
        let got = lld
            .read(ListId(l), i)
            .unwrap_or_else(|e| panic!("{what}: read {l}/{i}: {e}"));
        assert!(
            got.as_deref() == Some(&bytes(s, len)[..]),
            "{what}: block {l}/{i} differs (len {len}, got {:?})",
            got.map(|g| g.len())
        );
    }
    assert_eq!(lld.accounting_drift(), 0, "{what}: accounting drift");
}

fn mixed_len(rng: &mut ChaCha8Rng, max: usize) -> usize {
    match rng.gen_range(0..10) {
        0..=2 => rng.gen_range(1..512),
        3..=6 => 4096 * rng.gen_range(1..=(max / 4096).min(3)),
        _ => rng.gen_range(1..=max),
    }
}

/// Fills to 90% of capacity, overwrites 10x the device in mixed sizes with
/// no NoSpace while the data fits, verifies everything, then after a clean
/// reopen and after a crash.
fn fill_and_overwrite(seed: u64, policy: PolicyKind) {
    const DEV: u64 = 16 << 20;
    const MAX: usize = 16 << 10;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let dev = Arc::new(CrashDevice::new(DEV));
    let lld = Lld::create(dev.clone(), &mkfs(128 << 10, MAX as u32, 6), opts(policy)).unwrap();
    let lists: Vec<ListId> = (0..4)
        .map(|_| lld.create_list(None, ListHints::default()).unwrap())
        .collect();
    let cap = lld.space().capacity_bytes;
    let mut model = Model::new();
    let mut next_index = vec![0u64; lists.len()];
    // Fill to 90% of capacity with live data.
    while lld.space().available_bytes > cap / 10 {
        let k = rng.gen_range(0..lists.len());
        let len = mixed_len(&mut rng, MAX);
        let s: u64 = rng.gen();
        lld.write(None, lists[k], next_index[k], &bytes(s, len))
            .unwrap_or_else(|e| panic!("fill: {e} at {:?}", lld.space()));
        model.insert((lists[k].0, next_index[k]), (s, len));
        next_index[k] += 1;
    }
    let keys: Vec<(u64, u64)> = model.keys().copied().collect();
    let fill = lld.space();
    eprintln!(
        "{policy}: filled {} blocks, {} live bytes, capacity {cap}, {} segments",
        keys.len(),
        fill.live_bytes,
        lld.geometry().segment_count
    );
    // Overwrite ten times the device's size.
    let (user0, moved0) = lld.write_totals();
    let mut written = 0u64;
    let mut flushes = 0;
    while written < 10 * DEV {
        let (l, i) = keys[rng.gen_range(0..keys.len())];
        let old = model[&(l, i)].1;
        let s: u64 = rng.gen();
        // Stay near 90%: grow a block only while below it.
        let len = if lld.space().available_bytes > cap / 10 {
            mixed_len(&mut rng, MAX)
        } else {
            rng.gen_range(1..=old)
        };
        match lld.write(None, ListId(l), i, &bytes(s, len)) {
            Ok(()) => {}
            Err(LdError::NoSpace { .. }) => {
                let sp = lld.space();
                panic!(
                    "NoSpace writing {len} bytes over {old} at {:?} (clean/releasable {:?}, cleaner {:?})",
                    sp,
                    lld.clean_segment_counts(),
                    lld.cleaner_stats()
                );
            }
            Err(e) => panic!("overwrite: {e}"),
        }
        model.insert((l, i), (s, len));
        written += len as u64;
        if rng.gen_ratio(1, 200) {
            lld.flush().unwrap();
            flushes += 1;
        }
    }
    let (user1, moved1) = lld.write_totals();
    let st = lld.cleaner_stats();
    eprintln!(
        "{policy}: write cost {:.2} over {} MiB ({} flushes), cleaner {:?}",
        (user1 - user0 + moved1 - moved0) as f64 / (user1 - user0) as f64,
        written >> 20,
        flushes,
        st
    );
    assert!(st.segments_released > 0, "the cleaner never ran");
    verify(&lld, &model, &lists, "after overwrites");
    // A crash with everything flushed and then a burst of unflushed writes:
    // the recovered state is the flushed model plus some prefix of the burst.
    lld.flush().unwrap();
    let flushed = model.clone();
    let mut burst = Vec::new();
    for _ in 0..40 {
        let (l, i) = keys[rng.gen_range(0..keys.len())];
        let s: u64 = rng.gen();
        let len = rng.gen_range(1..=model[&(l, i)].1);
        lld.write(None, ListId(l), i, &bytes(s, len)).unwrap();
        burst.push(((l, i), (s, len)));
    }
    let crashed = dev.crash_image(
        rng.gen(),
        &CrashOptions {
            keep_probability: rng.gen_range(0.0..1.0),
            tear_probability: 0.3,
        },
    );
    for (k, v) in &burst {
        model.insert(*k, *v);
    }
    lld.close().unwrap();
    drop(lld);
    let lld = Lld::open(dev.clone(), opts(policy)).unwrap();
    verify(&lld, &model, &lists, "after clean reopen");
    drop(lld);
    let lld = Lld::open(Arc::new(MemoryDevice::from_vec(crashed)), opts(policy)).unwrap();
    let mut state = flushed;
    let mut matched = false;
    for p in 0..=burst.len() {
        if p > 0 {
            state.insert(burst[p - 1].0, burst[p - 1].1);
        }
        let ok = state.iter().all(|(&(l, i), &(s, len))| {
            lld.read(ListId(l), i).unwrap().as_deref() == Some(&bytes(s, len)[..])
        });
        if ok {
            matched = true;
            verify(&lld, &state, &lists, "after crash");
            break;
        }
    }
    assert!(
        matched,
        "crash image matches no prefix of the unflushed burst"
    );
}

#[test]
fn ninety_percent_full_overwritten_ten_times_cost_benefit() {
    with_seed(
        "ninety_percent_full_overwritten_ten_times_cost_benefit",
        31,
        |s| fill_and_overwrite(s, PolicyKind::CostBenefit),
    );
}

#[test]
fn ninety_percent_full_overwritten_ten_times_greedy() {
    with_seed(
        "ninety_percent_full_overwritten_ten_times_greedy",
        32,
        |s| fill_and_overwrite(s, PolicyKind::Greedy),
    );
}

#[test]
fn ninety_percent_full_overwritten_ten_times_free_weighted() {
    with_seed(
        "ninety_percent_full_overwritten_ten_times_free_weighted",
        33,
        |s| fill_and_overwrite(s, PolicyKind::FreeWeighted),
    );
}

/// One thread cleans without pause while another deletes blocks and whole
/// lists and overwrites others: deleted data never comes back, in the live
/// engine or after a reopen.
#[test]
fn deletes_while_the_cleaner_copies_never_come_back() {
    with_seed(
        "deletes_while_the_cleaner_copies_never_come_back",
        41,
        |seed| {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let dev = Arc::new(MemoryDevice::new(16 << 20));
            let lld = Arc::new(
                Lld::create(
                    dev.clone(),
                    &mkfs(128 << 10, 16 << 10, 6),
                    opts(PolicyKind::Greedy),
                )
                .unwrap(),
            );
            let mut model = Model::new();
            let mut lists: Vec<ListId> = Vec::new();
            for _ in 0..8 {
                let l = lld.create_list(None, ListHints::default()).unwrap();
                for i in 0..150 {
                    let (s, len) = (rng.gen(), rng.gen_range(1..9000));
                    lld.write(None, l, i, &bytes(s, len)).unwrap();
                    model.insert((l.0, i), (s, len));
                }
                lists.push(l);
            }
            let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let cleaner = {
                let (lld, stop) = (lld.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut passes = 0u64;
                    let mut moved = 0u64;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let r = lld.clean(PolicyKind::Greedy, 3).unwrap();
                        passes += 1;
                        moved += r.blocks_moved;
                    }
                    (passes, moved)
                })
            };
            let mut deleted_lists = Vec::new();
            for round in 0..3000u64 {
                match rng.gen_range(0..10) {
                    0..=3 => {
                        let l = lists[rng.gen_range(0..lists.len())];
                        let i = rng.gen_range(0..150);
                        lld.delete(None, l, i).unwrap();
                        model.remove(&(l.0, i));
                    }
                    4 if lists.len() > 3 && round % 300 == 4 => {
                        let l = lists.swap_remove(rng.gen_range(0..lists.len()));
                        lld.delete_list(None, l).unwrap();
                        model.retain(|(ml, _), _| *ml != l.0);
                        deleted_lists.push(l);
                    }
                    _ => {
                        let l = lists[rng.gen_range(0..lists.len())];
                        let i = rng.gen_range(0..150);
                        let (s, len) = (rng.gen(), rng.gen_range(1..9000));
                        lld.write(None, l, i, &bytes(s, len)).unwrap();
                        model.insert((l.0, i), (s, len));
                    }
                }
                if round % 97 == 0 {
                    lld.flush().unwrap();
                }
            }
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            let (passes, moved) = cleaner.join().unwrap();
            eprintln!(
                "{passes} passes moved {moved} blocks; {:?}",
                lld.cleaner_stats()
            );
            assert!(moved > 0, "the cleaner moved nothing");
            let check = |lld: &Lld, what: &str| {
                verify(lld, &model, &lists, what);
                for l in &deleted_lists {
                    assert_eq!(lld.list_hints(*l).unwrap(), None, "{what}: {l} is back");
                    assert_eq!(lld.read(*l, 0).unwrap(), None, "{what}");
                }
            };
            check(&lld, "live");
            lld.close().unwrap();
            drop(lld);
            let lld = Lld::open(dev, opts(PolicyKind::Greedy)).unwrap();
            check(&lld, "reopened");
        },
    );
}

/// With foreground steps disabled (start watermark 0), writers that find
/// no clean segment wait for the cleaner; four threads overwriting a 90%
/// full device never see NoSpace.
#[test]
fn writers_wait_for_the_cleaner_instead_of_failing() {
    with_seed(
        "writers_wait_for_the_cleaner_instead_of_failing",
        51,
        |seed| {
            let dev = Arc::new(MemoryDevice::new(16 << 20));
            let mut o = opts(PolicyKind::CostBenefit);
            o.cleaner.start_clean_segments = Some(0);
            o.cleaner.stop_clean_segments = Some(0);
            let lld = Arc::new(Lld::create(dev.clone(), &mkfs(128 << 10, 16 << 10, 6), o).unwrap());
            let l = lld.create_list(None, ListHints::default()).unwrap();
            let cap = lld.space().capacity_bytes;
            let n = cap * 9 / 10 / (8192 + 38);
            for i in 0..n {
                lld.write(None, l, i, &bytes(i, 8192)).unwrap();
            }
            let threads: Vec<_> = (0..4u64)
                .map(|t| {
                    let lld = lld.clone();
                    std::thread::spawn(move || {
                        let mut rng = ChaCha8Rng::seed_from_u64(seed + t);
                        let mut mine = BTreeMap::new();
                        for _ in 0..1500 {
                            // Thread t owns the indices congruent to t mod 4.
                            let i = rng.gen_range(0..n / 4) * 4 + t;
                            let s = rng.gen();
                            lld.write(None, l, i, &bytes(s, 8192)).unwrap_or_else(|e| {
                                panic!(
                                    "thread {t}: {e}; clean/releasable {:?}, {:?}, {:?}",
                                    lld.clean_segment_counts(),
                                    lld.cleaner_stats(),
                                    lld.space()
                                )
                            });
                            mine.insert(i, s);
                        }
                        mine
                    })
                })
                .collect();
            let mut model = Model::new();
            for i in 0..n {
                model.insert((l.0, i), (i, 8192));
            }
            for t in threads {
                for (i, s) in t.join().unwrap() {
                    model.insert((l.0, i), (s, 8192));
                }
            }
            let st = lld.cleaner_stats();
            assert!(st.waits > 0, "no writer waited: {st:?}");
            assert_eq!(st.foreground_steps, 0);
            verify(&lld, &model, &[l], "after waiting writers");
        },
    );
}

/// The background thread cleans an idle engine up to the stop watermark.
#[test]
fn the_background_cleaner_works_while_idle() {
    let dev = Arc::new(MemoryDevice::new(16 << 20));
    let mut o = opts(PolicyKind::CostBenefit);
    o.cleaner.background = true;
    o.cleaner.idle_ms = 5;
    let lld = Lld::create(dev, &mkfs(128 << 10, 16 << 10, 6), o).unwrap();
    assert!(lld.background_cleaner_running());
    let l = lld.create_list(None, ListHints::default()).unwrap();
    // Write 60% of capacity, then overwrite it at random until clean
    // segments are down to the start watermark: dead space everywhere.
    let n = lld.space().capacity_bytes * 6 / 10 / 4134;
    let mut model = vec![0u64; n as usize];
    for i in 0..n {
        lld.write(None, l, i, &bytes(i, 4096)).unwrap();
        model[i as usize] = i;
    }
    let mut rng = ChaCha8Rng::seed_from_u64(61);
    while lld.clean_segment_counts().0 > lld.start_watermark() + 1 {
        let i = rng.gen_range(0..n);
        let s = rng.gen();
        lld.write(None, l, i, &bytes(s, 4096)).unwrap();
        model[i as usize] = s;
    }
    let stop = lld.stop_watermark();
    let t = std::time::Instant::now();
    while lld.clean_segment_counts().0 < stop {
        assert!(
            t.elapsed() < std::time::Duration::from_secs(30),
            "background cleaner did not reach {stop} clean segments: {:?} {:?}",
            lld.clean_segment_counts(),
            lld.cleaner_stats()
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(lld.cleaner_stats().background_passes > 0);
    for i in 0..n {
        assert_eq!(
            lld.read(l, i).unwrap().unwrap(),
            bytes(model[i as usize], 4096)
        );
    }
    lld.close().unwrap();
    assert!(!lld.background_cleaner_running());
}

/// Review probe (`Class::Clean`, 8d96706): the cleaner's moves now leave
/// the checkpoint's half of the reserve plus the pages of the checkpoint
/// after them and the margin. On a device filled to its capacity by user
/// writes, with no cleaning until writers find no room (watermarks 0), the
/// cleaner gets only what user writes leave above that floor; overwriting
/// every other block (segments half dead) and then deleting and writing
/// again must still work: writers wait for the cleaner, never NoSpace,
/// while the data fits the capacity.
#[test]
fn a_full_device_with_half_dead_segments_still_cleans() {
    for reserved in [4u32, 6] {
        with_seed(
            "a_full_device_with_half_dead_segments_still_cleans",
            reserved as u64,
            |seed| full_device_cleans(seed, reserved),
        );
    }
}

fn full_device_cleans(seed: u64, reserved: u32) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let dev = Arc::new(MemoryDevice::new(8 << 20));
    let mut o = opts(PolicyKind::Greedy);
    o.cleaner.start_clean_segments = Some(0);
    o.cleaner.stop_clean_segments = Some(0);
    let lld = Lld::create(dev, &mkfs(128 << 10, 16 << 10, reserved), o).unwrap();
    let lists: Vec<ListId> = (0..4)
        .map(|_| lld.create_list(None, ListHints::default()).unwrap())
        .collect();
    let mut model = Model::new();
    // Fill to 90% of the capacity (the rest of the log is dead space soon):
    // sparse indices, so the map has many leaves and moves dirty many.
    let cap = lld.space().capacity_bytes;
    let mut keys = Vec::new();
    while lld.space().available_bytes > cap / 10 {
        let l = lists[rng.gen_range(0..lists.len())];
        let i = rng.gen_range(0..1u64 << 40);
        let s: u64 = rng.gen();
        match lld.write(None, l, i, &bytes(s, 4096)) {
            Ok(()) => {
                model.insert((l.0, i), (s, 4096));
                keys.push((l.0, i));
            }
            Err(e) => panic!("reserved {reserved}: fill: {e}"),
        }
    }
    let what = |lld: &Lld, step: &str, e: &LdError| {
        format!(
            "reserved {reserved}, {step}: {e}; clean/releasable {:?}, {:?}, {:?}",
            lld.clean_segment_counts(),
            lld.cleaner_stats(),
            lld.space()
        )
    };
    // Every other block rewritten, twice (same size: the footprint stays,
    // and segments are left half dead).
    for (n, &(l, i)) in keys.iter().enumerate().chain(keys.iter().enumerate()) {
        if n % 2 == 0 {
            let s: u64 = rng.gen();
            lld.write(None, ListId(l), i, &bytes(s, 4096))
                .unwrap_or_else(|e| panic!("{}", what(&lld, "overwrite", &e)));
            model.insert((l, i), (s, 4096));
        }
    }
    assert!(lld.cleaner_stats().segments_released > 0, "never cleaned");
    // A quarter deleted, then as much written again.
    for &(l, i) in keys.iter().skip(1).step_by(4) {
        lld.delete(None, ListId(l), i)
            .unwrap_or_else(|e| panic!("{}", what(&lld, "delete", &e)));
        model.remove(&(l, i));
    }
    for &(l, i) in keys.iter().skip(1).step_by(4) {
        let s: u64 = rng.gen();
        lld.write(None, ListId(l), i, &bytes(s, 4096))
            .unwrap_or_else(|e| panic!("{}", what(&lld, "write after deletes", &e)));
        model.insert((l, i), (s, 4096));
    }
    let ids: Vec<ListId> = lists.clone();
    verify(&lld, &model, &ids, "after a full device was cleaned");
}

/// The review probe's reserve of two segments (mkfs accepted one): writers
/// got NoSpace after some passes, the cleaner's half of the reserve (less
/// the checkpoint and the margin) could not empty a victim. mkfs now
/// refuses fewer than four, and four cleans (the test above).
#[test]
fn mkfs_refuses_a_reserve_too_small_to_clean_a_full_device() {
    for reserved in [1u32, 2, 3] {
        let dev = Arc::new(MemoryDevice::new(8 << 20));
        let e = Lld::create(
            dev,
            &mkfs(128 << 10, 16 << 10, reserved),
            opts(PolicyKind::Greedy),
        )
        .err()
        .unwrap_or_else(|| panic!("mkfs accepted {reserved} reserved segments"));
        assert!(e.to_string().contains("at least 4"), "{reserved}: {e}");
    }
}

/// Small blocks (200..1200 bytes) at random keys, so a victim's live blocks
/// lie in many map leaves and moving them dirties about a leaf each. A
/// device filled to 90% of its capacity and overwritten (same sizes, so the
/// footprint stays) must take every overwrite: writers wait for the
/// cleaner, never NoSpace, while the data fits. Every pass rewrites most of
/// the map (70 pages, more than two segments) to free segments about half
/// full, so a pass gains only with four or more victims, and the room that
/// takes is about what the reserve and `map_allowance` leave. Failed for
/// seeds 1, 3-6 and 8 (review 10's probe) while a pass counted a map page
/// once for its hot survivors and again for its cold ones: it planned too
/// few victims to gain, and writers gave up after three losing passes.
#[test]
fn small_blocks_at_random_keys_on_a_full_device_still_clean() {
    with_seeds(
        "small_blocks_at_random_keys_on_a_full_device_still_clean",
        1..=8,
        |seed| small_random_blocks(seed, 10),
    );
}

/// Small blocks at random keys on a device filled to 3/4 of its capacity and
/// overwritten three times over: every overwrite is taken. Before the
/// cleaner counted the map pages its moves dirty, and admission kept room
/// for rewriting the map (`map_allowance`), a pass spent the reserve on map
/// pages without emptying its victims, and overwrites failed with NoSpace
/// with a quarter of the capacity free (seed 1: after 2,360). The long
/// crash run found the same state for good (seed 3000995107, cycle 57,098:
/// every write NoSpace at 55% of the capacity; issue 12). Counting a map
/// page twice in a pass (see the test above) still failed seed 3 when the
/// checkpointer thread ran late (CI, and here on one loaded core).
#[test]
fn small_blocks_at_random_keys_on_a_device_three_quarters_full_still_clean() {
    with_seeds(
        "small_blocks_at_random_keys_on_a_device_three_quarters_full_still_clean",
        1..=4,
        |seed| small_random_blocks(seed, 4),
    );
}

/// Fills with small blocks at random keys until a `1/stop`-th of the
/// capacity is left, then overwrites three devices' worth.
fn small_random_blocks(seed: u64, stop: u64) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let dev = Arc::new(MemoryDevice::new(8 << 20));
    let lld = Lld::create(dev, &mkfs(128 << 10, 16 << 10, 4), opts(PolicyKind::Greedy)).unwrap();
    let (lists, mut model, keys) = fill_small_random(&lld, &mut rng, stop);
    let fill = lld.space();
    let mut written = 0u64;
    let mut n = 0u64;
    while written < 3 * (8 << 20) {
        let (l, i) = keys[rng.gen_range(0..keys.len())];
        let len = model[&(l, i)].1;
        let s: u64 = rng.gen();
        if let Err(e) = lld.write(None, ListId(l), i, &bytes(s, len)) {
            panic!(
                "seed {seed}: overwrite {n} ({written} bytes) of {} blocks: {e}; \
                 filled to {fill:?}, now {:?}, clean/releasable {:?}, {:?}, map {:?}",
                keys.len(),
                lld.space(),
                lld.clean_segment_counts(),
                lld.cleaner_stats(),
                lld.map_figures()
            );
        }
        model.insert((l, i), (s, len));
        written += len as u64;
        n += 1;
    }
    verify(&lld, &model, &lists, "after overwrites");
}

/// `small_random_blocks` with `threads` writers at once (each owning every
/// `threads`-th key), three devices' worth of same-size overwrites in all,
/// with the engine's options changed by `tweak`. Other threads' operations
/// (past the dirty-page limit, or admission making room) then begin
/// checkpoints in the middle of cleaning passes, and user writes take room
/// a checkpoint frees while a pass reads its victims. No writer may get
/// NoSpace while the data fits; on failure the test says whether the
/// device was refused for good (a checkpoint, `clean_now` and 200
/// overwrites after the writers stopped). Thread interleavings do not
/// replay: run a failing seed several times.
fn threaded(dev_bytes: u64, seed: u64, stop: u64, threads: u64, tweak: fn(&mut LldOptions)) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let dev = Arc::new(CrashDevice::new(dev_bytes));
    let mut o = opts(PolicyKind::Greedy);
    tweak(&mut o);
    let lld = Arc::new(Lld::create(dev.clone(), &mkfs(128 << 10, 16 << 10, 4), o.clone()).unwrap());
    let (lists, mut model, keys) = fill_small_random(&lld, &mut rng, stop);
    let fill = lld.space();
    let keys = Arc::new(keys);
    let lens: Arc<BTreeMap<(u64, u64), usize>> =
        Arc::new(model.iter().map(|(k, v)| (*k, v.1)).collect());
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (lld, keys, lens) = (lld.clone(), keys.clone(), lens.clone());
            std::thread::spawn(move || {
                let mut rng = ChaCha8Rng::seed_from_u64(seed ^ ((t + 1) * 0x9e37_79b9));
                let mine: Vec<(u64, u64)> = keys
                    .iter()
                    .skip(t as usize)
                    .step_by(threads as usize)
                    .copied()
                    .collect();
                let mut out = Model::new();
                let mut written = 0u64;
                while written < 3 * dev_bytes / threads {
                    let (l, i) = mine[rng.gen_range(0..mine.len())];
                    let len = lens[&(l, i)];
                    let s: u64 = rng.gen();
                    match lld.write(None, ListId(l), i, &bytes(s, len)) {
                        Ok(()) => {}
                        Err(e @ LdError::NoSpace { .. }) => {
                            return Err(format!(
                                "thread {t}, {written} bytes in: {e}; clean/releasable {:?}, {:?}",
                                lld.clean_segment_counts(),
                                lld.cleaner_stats(),
                            ));
                        }
                        Err(e) => panic!("thread {t}: {e}"),
                    }
                    out.insert((l, i), (s, len));
                    written += len as u64;
                }
                Ok(out)
            })
        })
        .collect();
    let mut errors = Vec::new();
    for h in handles {
        match h.join().expect("writer thread panicked") {
            Ok(m) => model.extend(m),
            Err(e) => errors.push(e),
        }
    }
    if !errors.is_empty() {
        lld.checkpoint_now().unwrap();
        let cancel = std::sync::atomic::AtomicBool::new(false);
        let sum = lld.clean_now(PolicyKind::Greedy, Some(64), 1.0, &cancel);
        let ok = keys[..200]
            .iter()
            .filter(|k| {
                lld.write(None, ListId(k.0), k.1, &bytes(1, lens[k]))
                    .is_ok()
            })
            .count();
        panic!(
            "seed {seed}: filled to {fill:?}; refused:\n{}\nthen: clean_now {sum:?}, \
             {ok} of 200 overwrites taken",
            errors.join("\n")
        );
    }
    eprintln!("seed {seed}: {:?}", lld.cleaner_stats());
    verify(&lld, &model, &lists, "after overwrites");
    lld.flush().unwrap();
    let crashed = dev.crash_image(
        rng.gen(),
        &CrashOptions {
            keep_probability: rng.gen_range(0.0..1.0),
            tear_probability: 0.3,
        },
    );
    let lld = Arc::into_inner(lld).expect("writers gone");
    lld.close().unwrap();
    let lld = Lld::open(dev.clone(), o.clone()).unwrap();
    verify(&lld, &model, &lists, "after a clean reopen");
    drop(lld);
    let lld = Lld::open(Arc::new(MemoryDevice::from_vec(crashed)), o).unwrap();
    verify(&lld, &model, &lists, "after a crash (everything flushed)");
}

/// Four writers on the 90%-full device of small blocks at random keys,
/// the engine's threads as in use (checkpointer, log writer).
#[test]
fn four_writers_small_random_blocks_ninety_percent_full() {
    with_seeds(
        "four_writers_small_random_blocks_ninety_percent_full",
        1..=3,
        |s| threaded(8 << 20, s, 10, 4, |_| {}),
    );
}

/// As above at three quarters of the capacity.
#[test]
fn four_writers_small_random_blocks_three_quarters_full() {
    with_seeds(
        "four_writers_small_random_blocks_three_quarters_full",
        1..=3,
        |s| threaded(8 << 20, s, 4, 4, |_| {}),
    );
}

/// Four writers at 90% with a dirty-page limit of 8 and the background
/// cleaner: checkpoints begin inside nearly every pass, and user writes
/// take what they release. The cleaner planned passes on room above the
/// user floor, which writers took while it read its victims; the pass then
/// ran out with every victim partly emptied and none released, and the log
/// stayed full for good (review 12: 9 runs of 12 on 26eb598). Its headroom
/// is now only what lies below the user floor.
#[test]
fn four_writers_with_checkpoints_inside_passes() {
    with_seeds("four_writers_with_checkpoints_inside_passes", 1..=6, |s| {
        threaded(8 << 20, s, 10, 4, |o| {
            o.checkpoint_dirty_pages = Some(8);
            o.cleaner.background = true;
            o.cleaner.idle_ms = 1;
        })
    });
}

/// Only the background cleaner (idle after 1 ms), default dirty-page limit.
#[test]
fn four_writers_with_the_background_cleaner() {
    with_seeds("four_writers_with_the_background_cleaner", 1..=3, |s| {
        threaded(8 << 20, s, 10, 4, |o| {
            o.cleaner.background = true;
            o.cleaner.idle_ms = 1;
        })
    });
}

/// Default options on a 32 MiB device, 90% full: the map (about 300
/// pages, nine segments) is larger than the dirty-page limit. A pass gains
/// only with dozens of victims sharing the map's rewrite. While a waiting
/// writer's passes took at most 16 (`step_segments`), passes that lose (the
/// cheapest victim alone costs more than a segment) came in runs, and a
/// writer that waited through three of them got NoSpace although
/// `clean_now` then freed space (2 runs in 3). Each losing pass now
/// doubles the next one's victims.
#[test]
fn four_writers_on_a_larger_device_default_options() {
    with_seeds(
        "four_writers_on_a_larger_device_default_options",
        1..=2,
        |s| threaded(32 << 20, s, 10, 4, |_| {}),
    );
}

/// Deletes alone on a device 90% full of small blocks at random keys: half
/// the keys deleted one by one (no reservation), then the survivors
/// overwritten at the same sizes. Deletes may dip below the cleaner's
/// floor (they must work on a full device), and with scattered keys each
/// costs about a map page at the next checkpoint; the log then sank below
/// the room a cleaning pass needs, and every write was refused for good,
/// after `checkpoint_now`, `clean_now` and a reopen too, with half the
/// device dead (review 14, F1).
fn deletes_alone(seed: u64, o: LldOptions) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let dev = Arc::new(MemoryDevice::new(8 << 20));
    let lld = Lld::create(dev.clone(), &mkfs(128 << 10, 16 << 10, 4), o.clone()).unwrap();
    let (lists, mut model, mut keys) = fill_small_random(&lld, &mut rng, 10);
    let fill = lld.space();
    // Delete a random half.
    for _ in 0..keys.len() / 2 {
        let (l, i) = keys.swap_remove(rng.gen_range(0..keys.len()));
        lld.delete(None, ListId(l), i)
            .unwrap_or_else(|e| panic!("seed {seed}: delete: {e} at {:?}", lld.space()));
        model.remove(&(l, i));
    }
    let after = lld.space();
    // Overwrite the survivors, a device's worth: half the data is dead, so
    // every one must be taken.
    let mut written = 0u64;
    let mut n = 0;
    while written < 8 << 20 {
        let (l, i) = keys[rng.gen_range(0..keys.len())];
        let len = model[&(l, i)].1;
        let s: u64 = rng.gen();
        if let Err(e) = lld.write(None, ListId(l), i, &bytes(s, len)) {
            panic!(
                "seed {seed}: overwrite {n} after deleting half: {e}; filled {fill:?}, \
                 after deletes {after:?}, now {:?}, clean/releasable {:?}, {:?}",
                lld.space(),
                lld.clean_segment_counts(),
                lld.cleaner_stats()
            );
        }
        model.insert((l, i), (s, len));
        written += len as u64;
        n += 1;
    }
    verify(&lld, &model, &lists, "after overwrites");
    lld.close().unwrap();
    let lld = Lld::open(dev, o).unwrap();
    verify(&lld, &model, &lists, "after reopen");
}

#[test]
fn deletes_alone_on_a_full_device_leave_the_cleaner_room() {
    with_seeds(
        "deletes_alone_on_a_full_device_leave_the_cleaner_room",
        1..=4,
        |s| deletes_alone(s, opts(PolicyKind::Greedy)),
    );
}

#[test]
fn deletes_alone_with_default_options() {
    with_seeds("deletes_alone_with_default_options", 1..=4, |s| {
        deletes_alone(s, LldOptions::default())
    });
}
