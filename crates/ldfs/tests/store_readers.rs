//! Read-only mounts beside the writer (issue 20, `store::readers`): a reader pins the
//! checkpoint object it mounts, fetches segments as it reads them into a small cache, and reads
//! exactly that tree while the writer overwrites, deletes, cleans and uploads; the writer keeps
//! what a live pin names (at each upload and at a start's sweep), lets it go once the pin is
//! released or expired, and a reader that pins while the writer moves on chooses again.

mod readers_common;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ldfs::store::readers::{PinOptions, PinRecord, ReaderPin};
use ldfs::store::{MemoryStore, ObjectStore, StoreOp};
use ldfs::testing::store::{crash_lease, HookStore, TestClock, When};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use readers_common::{
    check, checkpoints, keys, named_by, once, pin_opts, reader, replay_in, seed, segment_objects,
    uploaded, Writer,
};

fn replay(seed: u64) -> String {
    replay_in("store_readers", seed)
}

/// The checkpoint objects once the deletes behind the last upload are done (at most two), or
/// as they are after 10 s.
fn settled(store: &dyn ObjectStore) -> Vec<String> {
    let t = std::time::Instant::now();
    loop {
        let ck = checkpoints(store);
        if ck.len() <= 2 || t.elapsed() > Duration::from_secs(10) {
            return ck;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The reader's tree stays readable, whole and exact, through ten uploads of overwrites,
/// deletes and cleaning, with a cache of four segments (every read of an evicted segment
/// fetches its object, which only the pin keeps). Released, the next upload deletes it.
#[test]
fn a_reader_reads_its_pinned_tree_while_the_writer_churns_cleans_and_uploads() {
    let seed = seed();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let clock = TestClock::default();
    let mut w = Writer::start(store.clone(), &clock, false);
    for r in 0..3 {
        w.round(&mut rng, r == 2);
    }
    let pinned_model = w.model.clone();
    let (pin, key, obj) = ReaderPin::take(store.clone(), pin_opts()).unwrap();
    assert_eq!(
        checkpoints(&*store).last(),
        Some(&key),
        "the newest is pinned"
    );
    let named = named_by(&*store, &key);
    let r = reader(store.clone(), dir.path(), &key, &obj, 4);
    // A crashed reader's pin, expired by the writer's clock: its delete rounds remove it.
    let stale = PinRecord {
        owner: 98,
        expires_secs: clock.now() - 1,
        pid: 1,
        host: "gone".into(),
        checkpoint: key.clone(),
    };
    store
        .put("readers/0000000000000062", &stale.encode())
        .unwrap();
    for round in 0..10 {
        w.round(&mut rng, round % 3 == 2);
    }
    assert!(
        store.get("readers/0000000000000062").is_err(),
        "an expired pin outlived ten delete rounds"
    );
    assert_ne!(
        w.model, pinned_model,
        "the writer must have changed the tree"
    );
    assert!(
        checkpoints(&*store).contains(&key),
        "the pinned checkpoint was deleted"
    );
    let segs = segment_objects(&*store);
    let missing: Vec<_> = named.difference(&segs).collect();
    assert!(
        missing.is_empty(),
        "objects the pinned checkpoint names were deleted: {missing:?}"
    );
    check(
        &r,
        &w.lists,
        &pinned_model,
        "the reader after 10 uploads",
        &replay(seed),
    );
    drop(r);
    pin.release().unwrap();
    assert!(
        store.list("readers/").unwrap().is_empty(),
        "release deletes the pin"
    );
    w.round(&mut rng, false);
    // An upload counts once its checkpoint object is in; the deletes behind it follow.
    let ck = settled(&*store);
    assert_eq!(
        ck.len(),
        2,
        "released: only the newest two are kept: {ck:?}"
    );
    assert!(!ck.contains(&key));
    let still: BTreeSet<String> = ck.iter().flat_map(|k| named_by(&*store, k)).collect();
    assert_eq!(
        segment_objects(&*store),
        still,
        "segment objects vs what the newest two name, once the pin is gone"
    );
}

/// A writer's start keeps what a live pin names and deletes pins that expired (by its lease's
/// clock); once the pin is gone, the next start's sweep deletes the checkpoint it kept.
#[test]
fn a_start_keeps_a_pinned_checkpoint_and_deletes_expired_pins() {
    let seed = seed();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let clock = TestClock::default();
    let mut w = Writer::start(store.clone(), &clock, false);
    w.round(&mut rng, false);
    let (pin, key, _) = ReaderPin::take(store.clone(), pin_opts()).unwrap();
    let named = named_by(&*store, &key);
    for _ in 0..3 {
        w.round(&mut rng, true);
    }
    // A reader that never released its pin, long expired.
    let stale = PinRecord {
        owner: 99,
        expires_secs: clock.now() - 1,
        pid: 1,
        host: "gone".into(),
        checkpoint: key.clone(),
    };
    store
        .put("readers/0000000000000063", &stale.encode())
        .unwrap();
    w.seg.stop();
    crash_lease(&w.lease, &clock);
    drop(w);
    // The next writer's start sweeps: the live pin keeps its checkpoint, the stale one goes.
    let mut w2 = Writer::start(store.clone(), &clock, true);
    assert!(checkpoints(&*store).contains(&key));
    assert!(named.is_subset(&segment_objects(&*store)));
    let pins = keys(&*store, "readers/");
    assert_eq!(
        pins.len(),
        1,
        "the expired pin is deleted, the live one kept: {pins:?}"
    );
    assert_eq!(store.get(&pins[0]).unwrap(), pin.record().encode());
    pin.release().unwrap();
    w2.round(&mut rng, false);
    assert!(!settled(&*store).contains(&key));
}

/// `inner`, running `f` once, right after the first pin lands: the writer uploading two
/// checkpoints between the reader's choice and its pin.
fn after_pin(inner: Arc<dyn ObjectStore>, f: Box<dyn FnOnce() + Send>) -> HookStore {
    let at = |op, key: &str, when| {
        (op, when) == (StoreOp::Put, When::After) && key.starts_with("readers/")
    };
    HookStore::new(inner, once(at, f))
}

/// The writer puts two checkpoint objects (and deletes the first choice's objects, whose pin
/// it listed before) between the reader's choice and its pin: the reader finds its choice no
/// longer among the newest two and chooses again, and reads the newer tree whole.
#[test]
fn a_reader_whose_choice_was_superseded_before_its_pin_chooses_again() {
    let seed = seed();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    let mem: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let clock = TestClock::default();
    let w = Arc::new(Mutex::new(Writer::start(mem.clone(), &clock, false)));
    for r in 0..2 {
        w.lock().unwrap().round(&mut rng, r == 1);
    }
    let first = checkpoints(&*mem).last().cloned().unwrap();
    let w2 = w.clone();
    let mut rng2 = ChaCha8Rng::seed_from_u64(seed ^ 1);
    let store: Arc<dyn ObjectStore> = Arc::new(after_pin(
        mem.clone(),
        Box::new(move || {
            // The pin landed after this writer's listing of pins: it must not count on it.
            let mut w = w2.lock().unwrap();
            let saved = mem.get(&mem.list("readers/").unwrap()[0].key).unwrap();
            let key = mem.list("readers/").unwrap()[0].key.clone();
            mem.delete(&key).unwrap();
            w.round(&mut rng2, true);
            w.round(&mut rng2, true);
            mem.put(&key, &saved).unwrap();
        }),
    ));
    let (pin, key, obj) = ReaderPin::take(store.clone(), pin_opts()).unwrap();
    assert_ne!(key, first, "the superseded choice was kept");
    let w = w.lock().unwrap();
    let r = reader(store.clone(), dir.path(), &key, &obj, 4);
    check(
        &r,
        &w.lists,
        &w.model,
        "the reader's second choice",
        &replay(seed),
    );
    drop(r);
    pin.release().unwrap();
}

/// `inner` whose first listing of `seg/` takes `first` of real time, the test clock moved on
/// by `jump` seconds halfway through; `listings` counts the listings of `seg/`.
fn slow_first_seg_listing(
    inner: Arc<dyn ObjectStore>,
    first: Duration,
    jump: Option<(TestClock, u64)>,
    listings: Arc<AtomicU32>,
) -> Arc<HookStore> {
    Arc::new(HookStore::new(inner, move |op, key, when| {
        if (op, key, when) == (StoreOp::List, "seg/", When::After)
            && listings.fetch_add(1, Ordering::SeqCst) == 0
        {
            std::thread::sleep(first / 2);
            if let Some((clock, secs)) = &jump {
                clock.advance(*secs);
            }
            std::thread::sleep(first / 2);
        }
        Ok(())
    }))
}

/// A store holding three uploads' checkpoints, its writer stopped.
fn uploaded_store(seed: u64) -> Arc<dyn ObjectStore> {
    uploaded(seed, &TestClock::default(), |w, rng, r| {
        w.round(rng, r == 2)
    })
    .0
}

/// Review 44 finding B: a take whose checks outlast the pin's duration (a large store lists
/// `seg/` slowly) keeps its pin live by renewing it meanwhile, and returns its first choice.
/// Before, the pin expired during the checks and the take chose again, and again for as long
/// as every listing was that slow.
#[test]
fn a_take_whose_checks_outlast_its_pins_duration_keeps_the_pin_live() {
    let seed = seed();
    let inner = uploaded_store(seed);
    let listings = Arc::new(AtomicU32::new(0));
    let store = slow_first_seg_listing(
        inner.clone(),
        Duration::from_secs(3),
        None,
        listings.clone(),
    );
    let opts = PinOptions {
        duration: Duration::from_secs(2),
        ..pin_opts()
    };
    let clock = opts.clock.clone();
    let (pin, key, _) = ReaderPin::take(store.clone(), opts).unwrap();
    let listings = listings.load(Ordering::SeqCst);
    assert_eq!(
        listings,
        1,
        "the take chose again: its pin lapsed during 3 s of checks ({})",
        replay(seed)
    );
    let live = ldfs::store::readers::pins(&*inner, clock()).unwrap();
    assert!(live.checkpoints.contains(&key), "{}", replay(seed));
    pin.release().unwrap();
}

/// A renewal that lands after the pin it renews expired (the clock jumped 5 s past a 1 s pin
/// while the take listed `seg/`: a writer's delete round meanwhile would not have kept the
/// choice) makes the take choose again (review 44 finding A, now found by the renewer).
#[test]
fn a_take_whose_pin_lapsed_during_its_checks_chooses_again() {
    let seed = seed();
    let inner = uploaded_store(seed);
    let clock = TestClock::default();
    let listings = Arc::new(AtomicU32::new(0));
    let store = slow_first_seg_listing(
        inner.clone(),
        Duration::from_secs(3),
        Some((clock.clone(), 5)),
        listings.clone(),
    );
    let opts = PinOptions {
        duration: Duration::from_secs(1),
        clock: clock.clock(),
        ..pin_opts()
    };
    let (pin, key, _) = ReaderPin::take(store.clone(), opts).unwrap();
    let listings = listings.load(Ordering::SeqCst);
    assert_eq!(
        listings,
        2,
        "the take returned the choice whose pin lapsed during its checks ({})",
        replay(seed)
    );
    let live = ldfs::store::readers::pins(&*inner, clock.now()).unwrap();
    assert!(live.checkpoints.contains(&key), "{}", replay(seed));
    pin.release().unwrap();
}

/// A reader moving to a newer checkpoint on the same cache (a refresh) keeps the segments it
/// fetched whose objects the newer one still names (`readers::unchanged_segments`,
/// `segments::restore_lazy_keeping`) and reads the newer tree exactly: the kept segments are
/// not fetched again, and an entry asked to be kept that the newer checkpoint names otherwise
/// (the old use of a segment cleaned and written again since) is fetched, not kept.
#[test]
fn a_reader_moving_to_a_newer_checkpoint_keeps_what_did_not_change() {
    use ldfs::device::{Device, MemoryDevice};
    use ldfs::store::readers::{open_reader_cache, unchanged_segments};
    use ldfs::store::segments::restore_lazy_keeping;
    use ldfs::store::CacheConfig;
    let seed = seed();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let clock = TestClock::default();
    let mut w = Writer::start(store.clone(), &clock, false);
    for r in 0..3 {
        w.round(&mut rng, r == 2);
    }
    let (pin_a, key_a, obj_a) = ReaderPin::take(store.clone(), pin_opts()).unwrap();
    let model_a = w.model.clone();
    let dev: Arc<dyn Device> = Arc::new(MemoryDevice::new(readers_common::DEV_BYTES));
    let map = dir.path().join("reader.ldfs-resident");
    let unbounded = || CacheConfig::new(map.clone(), None);
    restore_lazy_keeping(&*store, &*dev, &map, 7, &key_a, &obj_a, &[]).unwrap();
    let cache = open_reader_cache(store.clone(), dev.clone(), unbounded(), &obj_a).unwrap();
    let lld = readers_common::read_only(cache.clone());
    check(&lld, &w.lists, &model_a, "the first tree", &replay(seed));
    drop(lld);
    cache.stop();
    // The writer overwrites (most segments keep some of their blocks live) and cleans (the
    // emptiest freed, and written again by the overwrites after).
    w.churn(&mut rng, true);
    w.lld
        .clean_now(
            ldfs::lld::PolicyKind::Greedy,
            Some(3),
            0.9,
            &std::sync::atomic::AtomicBool::new(false),
        )
        .unwrap();
    w.upload();
    w.write_round(&mut rng);
    let (pin_b, key_b, obj_b) = ReaderPin::take(store.clone(), pin_opts()).unwrap();
    assert_ne!(key_a, key_b);
    let held = cache.held_segments();
    let keep = unchanged_segments(&obj_a, &obj_b, &held);
    assert!(
        !keep.is_empty(),
        "nothing unchanged to keep: {}",
        replay(seed)
    );
    // The segment the log was filling at the first checkpoint, if the newer one names it in
    // full (the default seed's does): its prefix the rebuild wrote (held), whose later pages
    // the cache never had, is not kept, and asked to be, it is not.
    let full_pages = obj_a.geo.segment_pages;
    let active = obj_a.entries.iter().copied().find(|a| {
        a.pages < full_pages
            && obj_b
                .entries
                .iter()
                .any(|b| b.segment == a.segment && b.pages == full_pages)
    });
    if seed == 20261127 {
        assert!(active.is_some(), "the default seed's case is gone");
    }
    if let Some(active) = active {
        assert!(held.contains(&active.segment), "{}", replay(seed));
        assert!(
            keep.iter().all(|k| k.segment != active.segment),
            "the first checkpoint's Active prefix kept for the newer one's full segment: {}",
            replay(seed)
        );
    }
    let asked: Vec<_> = keep.iter().copied().chain(active).collect();
    let r = restore_lazy_keeping(&*store, &*dev, &map, 8, &key_b, &obj_b, &asked).unwrap();
    assert_eq!(r.kept, keep.len(), "{}", replay(seed));
    let cache = open_reader_cache(store.clone(), dev.clone(), unbounded(), &obj_b).unwrap();
    let lld = readers_common::read_only(cache.clone());
    check(&lld, &w.lists, &w.model, "the newer tree", &replay(seed));
    let full = obj_b
        .entries
        .iter()
        .filter(|e| e.pages == obj_b.geo.segment_pages)
        .count() as u64;
    let misses = cache.stats().misses;
    assert!(
        misses <= full - keep.len() as u64,
        "{misses} segments fetched of {full}, {} kept: {}",
        keep.len(),
        replay(seed)
    );
    drop(lld);
    cache.stop();
    pin_a.release().unwrap();
    pin_b.release().unwrap();
}
