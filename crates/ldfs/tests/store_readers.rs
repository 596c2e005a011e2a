//! Read-only mounts beside the writer (issue 20, `store::readers`): a reader pins the
//! checkpoint object it mounts, fetches segments as it reads them into a small cache, and reads
//! exactly that tree while the writer overwrites, deletes, cleans and uploads; the writer keeps
//! what a live pin names (at each upload and at a start's sweep), lets it go once the pin is
//! released or expired, and a reader that pins while the writer moves on chooses again.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ldfs::device::{Device, MemoryDevice};
use ldfs::ld::{ListHints, ListId, LogicalDisk};
use ldfs::lld::{Lld, LldOptions, PolicyKind};
use ldfs::store::cache::CacheDevice;
use ldfs::store::readers::{open_reader_cache, PinOptions, PinRecord, ReaderPin};
use ldfs::store::segments::{decode_checkpoint_object, restore_lazy_of, CheckpointObject};
use ldfs::store::{CacheConfig, HeldLease, MemoryStore, ObjectStore, SegmentStore, StoreOp};
use ldfs::testing::store::{
    crash_lease, fast_backoff, open_with_hooks, seed_or, small_mkfs, take_lease, HookStore,
    TestClock, When,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const DEV_BYTES: u64 = 24 << 20;
const SEGMENT_BYTES: u64 = 128 << 10;

type Model = BTreeMap<(u64, u64), Vec<u8>>;

fn seed() -> u64 {
    seed_or(20261127)
}

fn replay(seed: u64) -> String {
    format!(
        "seed {seed}; replay: LDFS_SEED={seed} cargo test --release -p ldfs --test store_readers"
    )
}

/// A writer: lld on a memory cache, uploading to `store`.
struct Writer {
    lld: Lld,
    seg: SegmentStore,
    lease: Arc<HeldLease>,
    lists: Vec<ListId>,
    model: Model,
}

impl Writer {
    /// `force`: take over a crashed writer's lease.
    fn start(store: Arc<dyn ObjectStore>, clock: &TestClock, force: bool) -> Writer {
        let dev: Arc<dyn Device> = Arc::new(MemoryDevice::new(DEV_BYTES));
        ldfs::lld::mkfs::mkfs(&*dev, &small_mkfs(SEGMENT_BYTES, 2026)).unwrap();
        let lease = take_lease(store.clone(), clock, force);
        let seg = SegmentStore::start(store, dev.clone(), lease.clone(), fast_backoff()).unwrap();
        let lld = open_with_hooks(&seg, LldOptions::default());
        let lists = (0..4)
            .map(|_| lld.create_list(None, ListHints::default()).unwrap())
            .collect();
        Writer {
            lld,
            seg,
            lease,
            lists,
            model: Model::new(),
        }
    }

    /// Overwrites and deletes, some cleaning, then a checkpoint uploaded.
    fn round(&mut self, rng: &mut ChaCha8Rng, clean: bool) {
        for _ in 0..300 {
            let l = self.lists[rng.gen_range(0..self.lists.len())];
            let i = rng.gen_range(0..60u64);
            if rng.gen_bool(0.2) {
                self.lld.delete(None, l, i).unwrap();
                self.model.remove(&(l.0, i));
            } else {
                let v: Vec<u8> = (0..rng.gen_range(1..9000)).map(|_| rng.gen()).collect();
                self.lld.write(None, l, i, &v).unwrap();
                self.model.insert((l.0, i), v);
            }
        }
        if clean {
            let cancel = std::sync::atomic::AtomicBool::new(false);
            self.lld
                .clean_now(PolicyKind::Greedy, Some(16), 0.9, &cancel)
                .unwrap();
        }
        self.lld.checkpoint_now().unwrap();
        self.seg
            .wait_uploaded(self.seg.announced(), Duration::from_secs(60))
            .unwrap();
    }
}

fn pin_opts() -> PinOptions {
    PinOptions {
        duration: Duration::from_secs(60),
        clock: ldfs::store::lease::system_clock(),
        host: "reader".into(),
        pid: std::process::id(),
    }
}

/// A read-only engine on a cache rebuilt lazily from the checkpoint `key` (`obj`), bounded to
/// `bound_segments` segments.
fn reader(
    store: Arc<dyn ObjectStore>,
    dir: &std::path::Path,
    key: &str,
    obj: &CheckpointObject,
    bound_segments: u64,
) -> Lld {
    let dev: Arc<dyn Device> = Arc::new(MemoryDevice::new(DEV_BYTES));
    let map = dir.join("reader.ldfs-resident");
    restore_lazy_of(&*store, &*dev, &map, 7, key, obj).unwrap();
    let cache = open_reader_cache(
        store,
        dev,
        CacheConfig::new(map, Some(bound_segments * SEGMENT_BYTES)),
        obj,
    )
    .unwrap();
    Lld::open(
        Arc::new(CacheDevice(cache)),
        LldOptions {
            read_only: true,
            ..LldOptions::default()
        },
    )
    .unwrap()
}

fn check(lld: &Lld, lists: &[ListId], model: &Model, what: &str, seed: u64) {
    for &l in lists {
        for i in 0..60u64 {
            let got = lld.read(l, i).unwrap_or_else(|e| {
                panic!("{what}: list {} index {i}: {e} ({})", l.0, replay(seed))
            });
            assert_eq!(
                got.as_deref(),
                model.get(&(l.0, i)).map(|v| v.as_slice()),
                "{what}: list {} index {i} ({})",
                l.0,
                replay(seed)
            );
        }
    }
}

fn checkpoints(store: &dyn ObjectStore) -> Vec<String> {
    store
        .list("ckpt/")
        .unwrap()
        .into_iter()
        .map(|o| o.key)
        .collect()
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

fn segment_objects(store: &dyn ObjectStore) -> BTreeSet<String> {
    store
        .list("seg/")
        .unwrap()
        .into_iter()
        .map(|o| o.key)
        .collect()
}

fn named_by(store: &dyn ObjectStore, key: &str) -> BTreeSet<String> {
    let obj = decode_checkpoint_object(key, &store.get(key).unwrap()).unwrap();
    obj.entries.iter().map(|e| e.key()).collect()
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
        seed,
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
    let pins: Vec<String> = store
        .list("readers/")
        .unwrap()
        .into_iter()
        .map(|o| o.key)
        .collect();
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
    let f = Mutex::new(Some(f));
    HookStore::new(inner, move |op, key, when| {
        if (op, when) == (StoreOp::Put, When::After) && key.starts_with("readers/") {
            let f = f.lock().unwrap().take();
            if let Some(f) = f {
                f();
            }
        }
        Ok(())
    })
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
    check(&r, &w.lists, &w.model, "the reader's second choice", seed);
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
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let mut w = Writer::start(store.clone(), &TestClock::default(), false);
    for r in 0..3 {
        w.round(&mut rng, r == 2);
    }
    w.seg.stop();
    store
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
