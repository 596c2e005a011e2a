//! Review 42's probes of 53f2f7e (issue 20: read-only mounts pin their checkpoint,
//! `store::readers`). Each probe fails while the defect its doc comment names is there.
//! All five findings are fixed (the fixes' commit says where); each probe passes now.

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
        "seed {seed}; replay: LDFS_SEED={seed} cargo test --release -p ldfs --test review42_probes"
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

    /// A writer taking over (a crashed writer's lease): its cache rebuilt from the store
    /// (`restore_as`, the store's newest complete checkpoint), as a mount on a new host does;
    /// `between` runs after its start's sweep and before lld opens (and checkpoints).
    fn take_over(
        store: Arc<dyn ObjectStore>,
        clock: &TestClock,
        lists: Vec<ListId>,
        model: Model,
        between: impl FnOnce(),
    ) -> Writer {
        let lease = take_lease(store.clone(), clock, true);
        let dev: Arc<dyn Device> = Arc::new(MemoryDevice::new(DEV_BYTES));
        restore_as(&*store, &*dev, 9).unwrap();
        let seg = SegmentStore::start(store, dev, lease.clone(), fast_backoff()).unwrap();
        between();
        let lld = open_rw(&seg);
        Writer {
            lld,
            seg,
            lease,
            lists,
            model,
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

/// Finding 1. A stale writer's late checkpoint put (and the segment puts before it) land after
/// the taking-over writer's start swept (the design's own case: review 31/32). It sorts newest
/// until the new writer's first upload and is complete, so a reader pins it, and its check
/// passes (it is the newest listed). The running writer's delete rounds only weigh the pins
/// against its in-memory `named` (the checkpoints its start kept and the ones it put), which
/// lacks the late one: the pin is ignored, and the objects the pinned checkpoint shares with
/// the checkpoints the writer moves past are deleted under the reader.
#[test]
fn a_pin_on_a_checkpoint_the_running_writer_never_listed_is_ignored() {
    late_checkpoint_pinned(false);
}

/// Finding 1's other window (the lead's probe, after the fix): A's late puts and the reader's
/// pin land while B's start sweeps, after its listing of the checkpoint objects and before its
/// listing of the pins. The sweep deleted the late checkpoint's own segment objects (named by
/// no checkpoint it listed) under the reader.
#[test]
fn a_pin_landing_during_a_starts_sweep_keeps_the_late_checkpoint() {
    late_checkpoint_pinned(true);
}

/// A store that runs `f` once, when the pins are first listed.
struct OnPinsListing {
    inner: Arc<dyn ObjectStore>,
    f: std::sync::Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

impl ObjectStore for OnPinsListing {
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
        if prefix == "readers/" {
            let f = self.f.lock().unwrap().take();
            if let Some(f) = f {
                f();
            }
        }
        self.inner.list(prefix)
    }
}

/// A stale writer's late checkpoint pinned by a reader, landing after the next writer's start
/// (`during_sweep`: inside its sweep); the reader must read its tree whole while the writer
/// moves on.
fn late_checkpoint_pinned(during_sweep: bool) {
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
    // A's last checkpoint put had not landed when it lost its host: as if it never was, yet.
    a.seg.stop();
    crash_lease(&a.lease, &clock);
    let lists = a.lists.clone();
    drop(a);
    store.delete(&late).unwrap();
    // B takes over: rebuilds from the store's newest (the one before) and sweeps; then, before
    // its first upload, A's in-flight puts land (its segment objects, then its checkpoint
    // object), and a reader pins.
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
    let mut b = if during_sweep {
        let wrapped: Arc<dyn ObjectStore> = Arc::new(OnPinsListing {
            inner: store.clone(),
            f: std::sync::Mutex::new(Some(Box::new(land))),
        });
        Writer::take_over(wrapped, &clock, lists.clone(), before_late, || {})
    } else {
        Writer::take_over(store.clone(), &clock, lists.clone(), before_late, land)
    };
    let (pin, key, obj) = taken.lock().unwrap().take().unwrap();
    assert_eq!(
        key,
        late,
        "setup: the reader pins the late checkpoint ({})",
        replay(seed)
    );
    let r = reader(store.clone(), dir.path(), &key, &obj, 2);
    for round in 0..4 {
        b.round(&mut rng, round % 2 == 1);
    }
    let segs = segment_objects(&*store);
    let missing: Vec<&String> = late_named.difference(&segs).collect();
    let ck = checkpoints(&*store);
    // What the reader reads (a cache of two segments: the rest is fetched).
    let mut read_errors = 0;
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
    drop(r);
    pin.release().unwrap();
    assert!(
        missing.is_empty() && ck.contains(&late),
        "while its pin lived, the writer deleted {} of the {} objects the pinned checkpoint {late} \
         names (checkpoint still listed: {}); the reader failed {read_errors} reads ({})",
        missing.len(),
        late_named.len(),
        ck.contains(&late),
        replay(seed)
    );
}

/// A store whose listing of `ckpt/` fails once, right after the first pin put: "unavailable"
/// (one 503 at the reader's check), or with `refuse` a final refusal.
struct ListFailsAfterPin {
    inner: Arc<dyn ObjectStore>,
    armed: std::sync::atomic::AtomicBool,
    refuse: bool,
}

impl ObjectStore for ListFailsAfterPin {
    fn put(&self, key: &str, bytes: &[u8]) -> Result<(), StoreError> {
        self.inner.put(key, bytes)?;
        if key.starts_with("readers/") {
            self.armed.store(true, std::sync::atomic::Ordering::SeqCst);
        }
        Ok(())
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
        if prefix == "ckpt/" && self.armed.swap(false, std::sync::atomic::Ordering::SeqCst) {
            if self.refuse {
                return Err(StoreError::Refused {
                    op: StoreOp::List,
                    key: prefix.into(),
                    status: 403,
                    detail: "probe: refused".into(),
                });
            }
            return Err(StoreError::Unavailable {
                op: StoreOp::List,
                key: prefix.into(),
                reason: "probe: one 503".into(),
            });
        }
        self.inner.list(prefix)
    }
}

/// Finding 2. `ReaderPin::take` returns with `?` on an error after its pin is put (the check's
/// listing, or the next try's `newest_complete_checkpoint`): the pin is left in the store, and
/// the writer keeps that checkpoint and what it names for a whole lease duration after the
/// mount failed. One transient answer at the check also fails the mount (the put is patient,
/// the listing is not).
#[test]
fn a_take_that_fails_after_its_pin_put_leaves_the_pin() {
    let seed = seed();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mem: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let clock = TestClock::default();
    let mut w = Writer::start(mem.clone(), &clock);
    w.round(&mut rng, false);
    let pins = || -> Vec<String> {
        mem.list("readers/")
            .unwrap()
            .into_iter()
            .map(|o| o.key)
            .collect()
    };
    // A final refusal at the check: the take fails and leaves no pin.
    let store: Arc<dyn ObjectStore> = Arc::new(ListFailsAfterPin {
        inner: mem.clone(),
        armed: false.into(),
        refuse: true,
    });
    let r = ReaderPin::take(store, pin_opts());
    assert!(
        r.is_err(),
        "a refused listing at the check: {:?}",
        r.map(|x| x.1)
    );
    assert!(pins().is_empty(), "a failed take left the pin {:?}", pins());
    // One transient answer there is retried; the pin lives until the take's pin is dropped.
    let store: Arc<dyn ObjectStore> = Arc::new(ListFailsAfterPin {
        inner: mem.clone(),
        armed: false.into(),
        refuse: false,
    });
    let r = ReaderPin::take(store, pin_opts());
    assert!(
        r.is_ok(),
        "one 503 at the check failed the take: {:?}",
        r.err()
    );
    assert_eq!(pins().len(), 1);
    drop(r);
    assert!(pins().is_empty(), "a dropped pin was left: {:?}", pins());
}

/// Probe (expected sound): a reader's cache stays within its bound while it reads its whole
/// tree, and reads it exactly.
#[test]
fn a_reader_cache_stays_within_its_bound() {
    let seed = seed();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let clock = TestClock::default();
    let mut w = Writer::start(store.clone(), &clock);
    for r in 0..4 {
        w.round(&mut rng, r == 2);
    }
    let (pin, key, obj) = ReaderPin::take(store.clone(), pin_opts()).unwrap();
    let dev: Arc<dyn Device> = Arc::new(MemoryDevice::new(DEV_BYTES));
    let map = dir.path().join("reader.ldfs-resident");
    restore_lazy_of(&*store, &*dev, &map, 7, &key, &obj).unwrap();
    let bound = 3u64;
    let cache = open_reader_cache(
        store.clone(),
        dev,
        CacheConfig::new(map, Some(bound * SEGMENT_BYTES)),
        &obj,
    )
    .unwrap();
    let r = Lld::open(
        Arc::new(CacheDevice(cache.clone())),
        LldOptions {
            read_only: true,
            ..LldOptions::default()
        },
    )
    .unwrap();
    let mut most = 0;
    for _ in 0..2 {
        for &l in &w.lists {
            for i in 0..60u64 {
                let got = r.read(l, i).unwrap();
                assert_eq!(
                    got.as_deref(),
                    w.model.get(&(l.0, i)).map(|v| v.as_slice()),
                    "({})",
                    replay(seed)
                );
                cache.shrink().unwrap();
                most = most.max(cache.stats().held_segments);
            }
        }
    }
    let st = cache.stats();
    assert!(st.misses > 0, "nothing was fetched: {st:?}");
    // The Active segment's prefix is held and never evicted: one over the bound at most.
    assert!(
        most <= bound + 1,
        "a reader's cache held {most} segments, bound {bound}: {st:?} ({})",
        replay(seed)
    );
    drop(r);
    cache.stop();
    pin.release().unwrap();
}

/// A store refusing (HTTP 403) every read of one object: a pin put by a reader whose
/// credentials the writer's cannot read (another user's object in the writer's bucket).
struct RefusesOne {
    inner: Arc<dyn ObjectStore>,
    key: String,
}

impl ObjectStore for RefusesOne {
    fn put(&self, key: &str, bytes: &[u8]) -> Result<(), StoreError> {
        self.inner.put(key, bytes)
    }
    fn put_if_absent(&self, key: &str, bytes: &[u8]) -> Result<PutOutcome, StoreError> {
        self.inner.put_if_absent(key, bytes)
    }
    fn get(&self, key: &str) -> Result<Vec<u8>, StoreError> {
        if key == self.key {
            return Err(StoreError::Refused {
                op: StoreOp::Get,
                key: key.into(),
                status: 403,
                detail: "probe: AccessDenied".into(),
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

/// Finding 3. An object under `readers/` the writer cannot read (refused, not transient) fails
/// the writer's upload for good (`pins()` returns the error, `upload` fails, the uploader is
/// failed) at its next upload with more than two checkpoint objects, and a later start
/// (`plan_sweep`) refuses to mount at all; a pin that reads but does not decode is only said
/// and ignored ("the cost of ignoring it is a reader's EIO, never the writer's data").
#[test]
fn an_unreadable_pin_object_stops_the_writers_uploads() {
    let seed = seed();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mem: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let foreign = "readers/00000000000000ff".to_string();
    let store: Arc<dyn ObjectStore> = Arc::new(RefusesOne {
        inner: mem.clone(),
        key: foreign.clone(),
    });
    let clock = TestClock::default();
    let mut w = Writer::start(store.clone(), &clock);
    for _ in 0..2 {
        w.round(&mut rng, false);
    }
    mem.put(&foreign, b"another user's pin").unwrap();
    // Two more uploads: the first with three checkpoint objects lists the pins.
    for _ in 0..2 {
        let l = w.lists[0];
        w.lld.write(None, l, 1, &[7u8; 5000]).unwrap();
        w.lld.checkpoint_now().unwrap();
        let r = w
            .seg
            .wait_uploaded(w.seg.announced(), Duration::from_secs(20));
        assert!(
            r.is_ok() && w.seg.failed().is_none(),
            "an unreadable readers/ object failed the upload: {:?} / {:?} ({})",
            r.map_err(|e| e.to_string()),
            w.seg.failed(),
            replay(seed)
        );
    }
}

/// A store whose listing of `seg/` takes `delay` (a large store: S3 lists 1000 keys a page).
struct SlowSegList {
    inner: Arc<dyn ObjectStore>,
    delay: Duration,
}

impl ObjectStore for SlowSegList {
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
        if prefix == "seg/" {
            std::thread::sleep(self.delay);
        }
        self.inner.list(prefix)
    }
}

/// Finding 4. `ReaderPin::take` chooses with `newest_complete_checkpoint`, which lists every
/// segment object between its checkpoint listing and its completeness test, and only then
/// pins. A writer that uploads twice within one `seg/` listing (a busy writer with `upload=1`
/// beside a store of tens of thousands of segment objects, S3 listing 1000 keys a page) has
/// deleted what every listed checkpoint named by the time the listing ends: after 5 tries
/// `newest_complete_checkpoint` answers none, and the read-only mount fails at once with "the
/// store holds no complete checkpoint object" (or, were one found, its choice is superseded
/// before the pin, 20 times). Pinning the newest listed checkpoint first, checking it is among
/// the newest two, then testing completeness under the pin's protection closes the window to
/// one `ckpt/` listing.
#[test]
fn a_busy_writer_beside_a_slow_segment_listing_keeps_a_reader_from_pinning() {
    let seed = seed();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mem: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let clock = TestClock::default();
    let mut w = Writer::start(mem.clone(), &clock);
    w.round(&mut rng, false);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop2 = stop.clone();
    let writer = std::thread::spawn(move || {
        let mut n = 0u64;
        while !stop2.load(std::sync::atomic::Ordering::SeqCst) {
            let l = w.lists[(n % 4) as usize];
            w.lld.write(None, l, n % 60, &[n as u8; 3000]).unwrap();
            w.lld.checkpoint_now().unwrap();
            w.seg
                .wait_uploaded(w.seg.announced(), Duration::from_secs(60))
                .unwrap();
            n += 1;
            std::thread::sleep(Duration::from_millis(150));
        }
        n
    });
    let store: Arc<dyn ObjectStore> = Arc::new(SlowSegList {
        inner: mem.clone(),
        delay: Duration::from_millis(400),
    });
    let t = std::time::Instant::now();
    let r = ReaderPin::take(store, pin_opts());
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let uploads = writer.join().unwrap();
    assert!(
        r.is_ok(),
        "a reader could not pin in {:.1} s beside a writer that uploaded {uploads} times: {} ({})",
        t.elapsed().as_secs_f64(),
        r.err().unwrap(),
        replay(seed)
    );
}

/// Probe: what a reader's cache counts as held right after it opens, before any read, when the
/// writer deleted most of what it wrote just before the pinned checkpoint (segments Dirty with
/// nothing live, which no checkpoint object names and the rebuild left as holes).
#[test]
fn a_reader_cache_counts_no_phantom_segments_at_open() {
    let seed = seed();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let clock = TestClock::default();
    let mut w = Writer::start(store.clone(), &clock);
    for _ in 0..4 {
        w.round(&mut rng, false);
    }
    // Delete nearly everything, then one checkpoint.
    for &l in &w.lists.clone() {
        for i in 0..58u64 {
            w.lld.delete(None, l, i).unwrap();
            w.model.remove(&(l.0, i));
        }
    }
    w.lld.checkpoint_now().unwrap();
    w.seg
        .wait_uploaded(w.seg.announced(), Duration::from_secs(60))
        .unwrap();
    let (pin, key, obj) = ReaderPin::take(store.clone(), pin_opts()).unwrap();
    let dev: Arc<dyn Device> = Arc::new(MemoryDevice::new(DEV_BYTES));
    let map = dir.path().join("reader.ldfs-resident");
    restore_lazy_of(&*store, &*dev, &map, 7, &key, &obj).unwrap();
    let bound = 8u64;
    let cache = open_reader_cache(
        store.clone(),
        dev,
        CacheConfig::new(map, Some(bound * SEGMENT_BYTES)),
        &obj,
    )
    .unwrap();
    let at_open = cache.stats();
    let r = Lld::open(
        Arc::new(CacheDevice(cache.clone())),
        LldOptions {
            read_only: true,
            ..LldOptions::default()
        },
    )
    .unwrap();
    for _ in 0..3 {
        for &l in &w.lists {
            for i in 0..60u64 {
                let got = r.read(l, i).unwrap();
                assert_eq!(
                    got.as_deref(),
                    w.model.get(&(l.0, i)).map(|v| v.as_slice()),
                    "({})",
                    replay(seed)
                );
            }
        }
    }
    let after = cache.stats();
    let prefixes = obj
        .entries
        .iter()
        .filter(|e| e.pages != obj.geo.segment_pages)
        .count() as u64;
    let full = obj.entries.len() as u64 - prefixes;
    println!(
        "checkpoint names {full} full segments and {prefixes} prefixes; at open {at_open:?}; \
         after three reads of the tree {after:?}"
    );
    assert!(
        at_open.held_segments <= prefixes,
        "a reader's cache counts {} segments held before any read (the checkpoint names {full} \
         in full, {prefixes} prefix): segments the rebuild left as holes count against its \
         bound {bound} ({})",
        at_open.held_segments,
        replay(seed)
    );
    drop(r);
    cache.stop();
    pin.release().unwrap();
}
