//! Review 43's probes of 3b04d21 (review 42's findings fixed: `readers::pinned_unknown`,
//! `choose_and_pin`). Each probe fails while the defect its doc comment names is there.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use ldfs::device::{Device, MemoryDevice};
use ldfs::ld::{ListHints, ListId, LogicalDisk};
use ldfs::lld::layout::MkfsOptions;
use ldfs::lld::{Lld, LldOptions, PolicyKind};
use ldfs::store::cache::CacheDevice;
use ldfs::store::readers::{open_reader_cache, PinOptions, ReaderPin};
use ldfs::store::segments::{decode_checkpoint_object, restore_lazy_of, CheckpointObject};
use ldfs::store::{
    restore_as, CacheConfig, HeldLease, MemoryStore, ObjectInfo, ObjectStore, PutOutcome,
    SegmentStore, StoreError, StoreOp,
};
use ldfs::testing::store::{crash_lease, fast_backoff, take_lease, TestClock};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const DEV_BYTES: u64 = 24 << 20;
const SEGMENT_BYTES: u64 = 128 << 10;

type Model = BTreeMap<(u64, u64), Vec<u8>>;

fn mkfs_opts() -> MkfsOptions {
    MkfsOptions {
        segment_bytes: SEGMENT_BYTES,
        max_block_bytes: 32 << 10,
        reserved_segments: Some(4),
        fs_id: 2026,
        max_bytes: None,
        kept_pages: 0,
    }
}

fn seed() -> u64 {
    std::env::var("LDFS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20261127)
}

fn replay(seed: u64) -> String {
    format!(
        "seed {seed}; replay: LDFS_SEED={seed} cargo test --release -p ldfs --test review43_probes"
    )
}

struct Writer {
    lld: Lld,
    seg: SegmentStore,
    lease: Arc<HeldLease>,
    lists: Vec<ListId>,
    model: Model,
}

impl Writer {
    /// A first writer, on a fresh file system.
    fn start(store: Arc<dyn ObjectStore>, clock: &TestClock) -> Writer {
        let dev: Arc<dyn Device> = Arc::new(MemoryDevice::new(DEV_BYTES));
        ldfs::lld::mkfs::mkfs(&*dev, &mkfs_opts()).unwrap();
        let lease = take_lease(store.clone(), clock, false);
        let seg = SegmentStore::start(store, dev, lease.clone(), fast_backoff()).unwrap();
        let lld = open_rw(&seg);
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

fn open_rw(seg: &SegmentStore) -> Lld {
    Lld::open(
        seg.device(),
        LldOptions {
            checkpoint_hook: Some(seg.hook()),
            segment_hook: Some(seg.segment_hook()),
            ..LldOptions::default()
        },
    )
    .unwrap()
}

fn pin_opts() -> PinOptions {
    PinOptions {
        duration: Duration::from_secs(60),
        clock: ldfs::store::lease::system_clock(),
        host: "reader".into(),
        pid: std::process::id(),
    }
}

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

fn checkpoints(store: &dyn ObjectStore) -> Vec<String> {
    store
        .list("ckpt/")
        .unwrap()
        .into_iter()
        .map(|o| o.key)
        .collect()
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

/// A store that runs `f` once, at the first listing of `seg/` after a listing of the pins: in a
/// start, `run_sweep`'s listing of the segment objects, after `plan_sweep` listed the pins.
struct AfterPinsAtSegListing {
    inner: Arc<dyn ObjectStore>,
    pins_listed: std::sync::atomic::AtomicBool,
    f: std::sync::Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

impl ObjectStore for AfterPinsAtSegListing {
    fn put(&self, key: &str, bytes: &[u8]) -> Result<(), StoreError> {
        self.inner.put(key, bytes)
    }
    fn put_if_absent(&self, key: &str, bytes: &[u8]) -> Result<PutOutcome, StoreError> {
        self.inner.put_if_absent(key, bytes)
    }
    fn get(&self, key: &str) -> Result<Vec<u8>, StoreError> {
        self.inner.get(key)
    }
    fn get_range(&self, key: &str, offset: u64, len: u64) -> Result<Vec<u8>, StoreError> {
        self.inner.get_range(key, offset, len)
    }
    fn delete(&self, key: &str) -> Result<(), StoreError> {
        self.inner.delete(key)
    }
    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, StoreError> {
        use std::sync::atomic::Ordering;
        if prefix == "readers/" {
            self.pins_listed.store(true, Ordering::SeqCst);
        }
        if prefix == "seg/" && self.pins_listed.load(Ordering::SeqCst) {
            let f = self.f.lock().unwrap().take();
            if let Some(f) = f {
                f();
            }
        }
        self.inner.list(prefix)
    }
}

/// Finding 1 (sweep window, after the pins listing). The fix keeps a pinned late checkpoint
/// only if the pin is in the start's pin listing (`plan_sweep`). A stale writer's late
/// checkpoint (and its segment objects) landing after the start's listing of `ckpt/`, and a
/// reader pinning it after the start's listing of `readers/` but before `run_sweep` deleted
/// the unnamed segment objects: the reader's checks all pass (the late checkpoint is the
/// newest listed, the new writer has put none yet; every object it names is listed, the
/// sweep has not deleted them yet), and `choose_and_pin` returns it. The sweep then deletes
/// the late checkpoint's own segment objects (named by no checkpoint it kept) under the pin,
/// and the running writer's `pinned_unknown` adopts the checkpoint only afterwards.
/// Checking completeness under the pin does not close this: the writer's deletes were
/// decided before the pin, and land after the reader's check.
#[test]
fn a_pin_after_a_starts_pin_listing_loses_the_late_checkpoints_objects_to_the_sweep() {
    let seed = seed();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let clock = TestClock::default();
    let mut a = Writer::start(store.clone(), &clock);
    for r in 0..4 {
        a.round(&mut rng, r == 2);
    }
    let before_late = a.model.clone();
    a.round(&mut rng, false);
    let late_model = a.model.clone();
    let late = checkpoints(&*store).last().cloned().unwrap();
    let late_bytes = store.get(&late).unwrap();
    let late_named = named_by(&*store, &late);
    let late_segs: Vec<(String, Vec<u8>)> = late_named
        .iter()
        .map(|k| (k.clone(), store.get(k).unwrap()))
        .collect();
    a.seg.stop();
    crash_lease(&a.lease, &clock);
    let lists = a.lists.clone();
    drop(a);
    store.delete(&late).unwrap();
    // B takes over from the checkpoint before; A's in-flight puts land, and a reader pins,
    // once B's start listed the pins and before it lists (and sweeps) the segment objects.
    let taken = Arc::new(std::sync::Mutex::new(None));
    let land = {
        let (store, taken, late) = (store.clone(), taken.clone(), late.clone());
        move || {
            for (k, v) in &late_segs {
                store.put(k, v).unwrap();
            }
            store.put(&late, &late_bytes).unwrap();
            *taken.lock().unwrap() = Some(ReaderPin::take(store.clone(), pin_opts()).unwrap());
        }
    };
    let wrapped: Arc<dyn ObjectStore> = Arc::new(AfterPinsAtSegListing {
        inner: store.clone(),
        pins_listed: std::sync::atomic::AtomicBool::new(false),
        f: std::sync::Mutex::new(Some(Box::new(land))),
    });
    let mut b = {
        let lease = take_lease(wrapped.clone(), &clock, true);
        let dev: Arc<dyn Device> = Arc::new(MemoryDevice::new(DEV_BYTES));
        restore_as(&*store, &*dev, 9).unwrap();
        let seg = SegmentStore::start(wrapped, dev, lease.clone(), fast_backoff()).unwrap();
        let lld = open_rw(&seg);
        Writer {
            lld,
            seg,
            lease,
            lists: lists.clone(),
            model: before_late,
        }
    };
    let (pin, key, obj) = taken
        .lock()
        .unwrap()
        .take()
        .expect("setup: the hook ran in B's start");
    assert_eq!(
        key,
        late,
        "setup: the reader pins the late checkpoint ({})",
        replay(seed)
    );
    // What the reader then opens (a cache of two segments: the rest is fetched as read): its
    // lazy rebuild fetches what the checkpoint's slot needs.
    let segs = segment_objects(&*store);
    let missing_at_start = late_named.difference(&segs).count();
    let opened = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        reader(store.clone(), dir.path(), &key, &obj, 2)
    }));
    for round in 0..4 {
        b.round(&mut rng, round % 2 == 1);
    }
    let segs = segment_objects(&*store);
    let missing = late_named.difference(&segs).count();
    let mut read_errors = 0;
    if let Ok(r) = &opened {
        for &l in &lists {
            for i in 0..60u64 {
                match r.read(l, i) {
                    Ok(got) => assert_eq!(
                        got.as_deref(),
                        late_model.get(&(l.0, i)).map(|v| v.as_slice()),
                        "the reader read other bytes than its checkpoint's ({})",
                        replay(seed)
                    ),
                    Err(_) => read_errors += 1,
                }
            }
        }
    }
    let open_failed = opened.is_err();
    drop(opened);
    pin.release().unwrap();
    b.seg.stop();
    assert!(
        missing_at_start == 0 && missing == 0,
        "the pin was taken after B's start listed the pins and before its sweep deleted: of the \
         {} objects the pinned checkpoint {late} names, {missing_at_start} were gone once B \
         started, {missing} after its rounds; the reader's rebuild failed: {}, then {read_errors} \
         reads failed ({})",
        late_named.len(),
        open_failed,
        replay(seed)
    );
}

/// A store whose GET of a pin object is refused (403): the pin's owner is another user whose
/// objects the writer may not read (objects owned by their uploader, the read-only mount's
/// credentials not the writer's).
struct PinsUnreadable {
    inner: Arc<dyn ObjectStore>,
}

impl ObjectStore for PinsUnreadable {
    fn put(&self, key: &str, bytes: &[u8]) -> Result<(), StoreError> {
        self.inner.put(key, bytes)
    }
    fn put_if_absent(&self, key: &str, bytes: &[u8]) -> Result<PutOutcome, StoreError> {
        self.inner.put_if_absent(key, bytes)
    }
    fn get(&self, key: &str) -> Result<Vec<u8>, StoreError> {
        if key.starts_with("readers/") {
            return Err(StoreError::Refused {
                op: StoreOp::Get,
                key: key.into(),
                status: 403,
                detail: "probe: another user's object".into(),
            });
        }
        self.inner.get(key)
    }
    fn get_range(&self, key: &str, offset: u64, len: u64) -> Result<Vec<u8>, StoreError> {
        self.inner.get_range(key, offset, len)
    }
    fn delete(&self, key: &str) -> Result<(), StoreError> {
        self.inner.delete(key)
    }
    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, StoreError> {
        self.inner.list(prefix)
    }
}

/// Finding 3's fix, the other way round. A pin the writer may not read now "pins nothing":
/// the writer goes on, and deletes the checkpoint a live reader pinned, with what only it
/// names, under that reader. The refusal says nothing of the pin's checkpoint or its expiry,
/// and a reader whose credentials are not the writer's is the case finding 3 named; keeping
/// every checkpoint while such a pin object is listed (or young, by its listing's time) would
/// keep the reader's.
#[test]
fn a_pin_the_writer_may_not_read_lets_it_delete_under_the_reader() {
    let seed = seed();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let wrapped: Arc<dyn ObjectStore> = Arc::new(PinsUnreadable {
        inner: store.clone(),
    });
    let clock = TestClock::default();
    let mut a = Writer::start(wrapped, &clock);
    for r in 0..3 {
        a.round(&mut rng, r == 1);
    }
    let (pin, key, _obj) = ReaderPin::take(store.clone(), pin_opts()).unwrap();
    let pinned_named = named_by(&*store, &key);
    for r in 0..4 {
        a.round(&mut rng, r % 2 == 0);
    }
    let segs = segment_objects(&*store);
    let missing = pinned_named.difference(&segs).count();
    let listed = checkpoints(&*store).contains(&key);
    pin.release().unwrap();
    a.seg.stop();
    assert!(
        listed && missing == 0,
        "the writer, refused the pin object, deleted under its live pin: checkpoint {key} \
         listed: {listed}; {missing} of the {} objects it names gone ({})",
        pinned_named.len(),
        replay(seed)
    );
}

/// A store whose listing of `seg/` takes `secs` by `clock` (a large store's listing, or one
/// retried patiently through 503s: `choose_and_pin` waits up to half the pin's duration for
/// each of its listing of `ckpt/`, its get and its listing of `seg/`).
struct SlowSegListing {
    inner: Arc<dyn ObjectStore>,
    clock: TestClock,
    secs: u64,
}

impl ObjectStore for SlowSegListing {
    fn put(&self, key: &str, bytes: &[u8]) -> Result<(), StoreError> {
        self.inner.put(key, bytes)
    }
    fn put_if_absent(&self, key: &str, bytes: &[u8]) -> Result<PutOutcome, StoreError> {
        self.inner.put_if_absent(key, bytes)
    }
    fn get(&self, key: &str) -> Result<Vec<u8>, StoreError> {
        self.inner.get(key)
    }
    fn get_range(&self, key: &str, offset: u64, len: u64) -> Result<Vec<u8>, StoreError> {
        self.inner.get_range(key, offset, len)
    }
    fn delete(&self, key: &str) -> Result<(), StoreError> {
        self.inner.delete(key)
    }
    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, StoreError> {
        let r = self.inner.list(prefix);
        if prefix == "seg/" {
            self.clock.advance(self.secs);
        }
        r
    }
}

/// `choose_and_pin` puts the pin (expiry: now + duration) and then checks the choice, and
/// returns it without looking whether the pin is still live: a check that outlasts the pin's
/// duration (the listing of every segment object, review 42 finding 4's "seconds in a large
/// store", plus up to half the duration of patience for each of three calls) returns a pin a
/// writer already ignores (`readers::pins` drops it as expired), so the checkpoint it "keeps"
/// and what only it names may be deleted before the renewer's first renewal, a fifth of the
/// duration later. Re-putting the pin (or checking its expiry) before returning closes it.
#[test]
fn a_take_whose_check_outlasts_the_pin_returns_an_expired_pin() {
    let seed = seed();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let clock = TestClock::default();
    let mut a = Writer::start(store.clone(), &clock);
    for r in 0..3 {
        a.round(&mut rng, r == 1);
    }
    // A check that outlasts the pin (61 s against 60) can never return a live pin: the take
    // chooses again and, every listing as slow, fails, leaving no pin. One that takes a third
    // of it returns a pin renewed at its end. (The lead's change of this probe, after the fix:
    // before it, the take returned the expired pin in both cases.)
    for secs in [61, 20] {
        let slow: Arc<dyn ObjectStore> = Arc::new(SlowSegListing {
            inner: store.clone(),
            clock: clock.clone(),
            secs,
        });
        let opts = PinOptions {
            duration: Duration::from_secs(60),
            clock: clock.clock(),
            host: "reader".into(),
            pid: std::process::id(),
        };
        match ReaderPin::take(slow, opts) {
            Ok((pin, key, _obj)) => {
                let live = ldfs::store::readers::pins(&*store, clock.now()).unwrap();
                assert!(
                    live.checkpoints.contains(&key) && secs == 20,
                    "ReaderPin::take returned {key} with a pin a writer now takes for expired \
                     (listing {secs} s; {})",
                    replay(seed)
                );
                drop(pin);
            }
            Err(e) => {
                assert_eq!(secs, 61, "a listing of {secs} s failed the take: {e}");
                assert!(
                    store.list("readers/").unwrap().is_empty(),
                    "a failed take left its pin"
                );
            }
        }
    }
    a.seg.stop();
}
