//! Review 39 probes: full segments uploaded ahead of the checkpoint that names them
//! (`LldOptions::segment_hook`, `SegmentStore::segment_hook`, commit a8cec9e). Each probe fails
//! if the defect it names exists; the four findings' probes failed on a8cec9e and pass since
//! their fixes.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use ldfs::device::{
    CrashDevice, CrashOptions, Device, DeviceError, FileDevice, FileDeviceOptions, MemoryDevice,
};
use ldfs::ld::{ListHints, ListId, LogicalDisk};
use ldfs::lld::layout::MkfsOptions;
use ldfs::lld::{Lld, LldOptions, PolicyKind, PAGE_BYTES};
use ldfs::store::segments::decode_checkpoint_object;
use ldfs::store::{
    restore, CacheConfig, MemoryStore, MemoryStoreFaults, ObjectInfo, ObjectStore, PutOutcome,
    SegmentStore, StoreResult,
};
use ldfs::testing::store::{crash_lease, fast_backoff, take_lease, TestClock};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const DEV_BYTES: u64 = 32 << 20;
const SEGMENT_BYTES: u64 = 128 << 10;

fn mkfs_opts() -> MkfsOptions {
    MkfsOptions {
        segment_bytes: SEGMENT_BYTES,
        max_block_bytes: 32 << 10,
        reserved_segments: Some(4),
        fs_id: 2039,
        max_bytes: None,
        kept_pages: 0,
    }
}

fn seeds(default: &[u64]) -> Vec<u64> {
    match std::env::var("LDFS_SEED") {
        Ok(s) => vec![s.parse().expect("LDFS_SEED is a number")],
        Err(_) => default.to_vec(),
    }
}

fn replay(seed: u64) -> String {
    format!(
        "seed {seed}; replay: LDFS_SEED={seed} cargo test --release -p ldfs --test review39_probes"
    )
}

/// Waits until `f` holds, or panics after 30 s saying `what`.
fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + Duration::from_secs(30);
    while !f() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Waits until `f()` has not changed for `quiet` (at most 30 s).
fn wait_settled<T: PartialEq>(quiet: Duration, mut f: impl FnMut() -> T) -> T {
    let end = Instant::now() + Duration::from_secs(30);
    let mut last = f();
    let mut since = Instant::now();
    loop {
        std::thread::sleep(Duration::from_millis(20));
        let now = f();
        if now != last {
            last = now;
            since = Instant::now();
        } else if since.elapsed() >= quiet || Instant::now() > end {
            return last;
        }
    }
}

/// A memory store whose segment puts wait while a gate is closed (a slow store, made
/// deterministic), counting the puts of each segment key.
#[derive(Default)]
struct GateStore {
    inner: MemoryStore,
    closed: Mutex<bool>,
    /// Segment puts let through while closed.
    allow: AtomicU64,
    cv: Condvar,
    /// Segment puts waiting at the gate.
    waiting: AtomicU64,
    seg_puts: Mutex<BTreeMap<String, u64>>,
    /// Deletes wait while this is set.
    deletes_closed: Mutex<bool>,
    /// Deletes waiting.
    deletes_waiting: AtomicU64,
}

impl GateStore {
    fn close(&self) {
        *self.closed.lock().unwrap() = true;
    }
    /// Lets `n` more segment puts through the closed gate.
    fn let_through(&self, n: u64) {
        let _c = self.closed.lock().unwrap();
        self.allow.fetch_add(n, Ordering::SeqCst);
        self.cv.notify_all();
    }
    fn set_deletes(&self, closed: bool) {
        *self.deletes_closed.lock().unwrap() = closed;
        self.cv.notify_all();
    }
    fn open(&self) {
        *self.closed.lock().unwrap() = false;
        self.cv.notify_all();
    }
}

impl ObjectStore for GateStore {
    fn put(&self, key: &str, bytes: &[u8]) -> StoreResult<()> {
        if key.starts_with("seg/") {
            let mut c = self.closed.lock().unwrap();
            self.waiting.fetch_add(1, Ordering::SeqCst);
            let end = Instant::now() + Duration::from_secs(20);
            while *c && Instant::now() < end {
                if self
                    .allow
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |a| a.checked_sub(1))
                    .is_ok()
                {
                    break;
                }
                c = self
                    .cv
                    .wait_timeout(c, Duration::from_millis(100))
                    .unwrap()
                    .0;
            }
            self.waiting.fetch_sub(1, Ordering::SeqCst);
            drop(c);
            *self
                .seg_puts
                .lock()
                .unwrap()
                .entry(key.to_string())
                .or_default() += 1;
        }
        self.inner.put(key, bytes)
    }
    fn put_if_absent(&self, key: &str, bytes: &[u8]) -> StoreResult<PutOutcome> {
        self.inner.put_if_absent(key, bytes)
    }
    fn get(&self, key: &str) -> StoreResult<Vec<u8>> {
        self.inner.get(key)
    }
    fn get_range(&self, key: &str, offset: u64, len: u64) -> StoreResult<Vec<u8>> {
        self.inner.get_range(key, offset, len)
    }
    fn delete(&self, key: &str) -> StoreResult<()> {
        let mut c = self.deletes_closed.lock().unwrap();
        self.deletes_waiting.fetch_add(1, Ordering::SeqCst);
        // Bounded: a probe that panics with the gate closed must not hang in its drops.
        let end = Instant::now() + Duration::from_secs(20);
        while *c && Instant::now() < end {
            c = self
                .cv
                .wait_timeout(c, Duration::from_millis(100))
                .unwrap()
                .0;
        }
        self.deletes_waiting.fetch_sub(1, Ordering::SeqCst);
        drop(c);
        self.inner.delete(key)
    }
    fn list(&self, prefix: &str) -> StoreResult<Vec<ObjectInfo>> {
        self.inner.list(prefix)
    }
}

/// A memory device counting the reads of one whole segment (what the uploader does to put
/// one; lld itself reads blocks and pages).
struct CountingDevice {
    inner: MemoryDevice,
    whole_reads: AtomicU64,
}

impl Device for CountingDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), DeviceError> {
        if buf.len() as u64 == SEGMENT_BYTES {
            self.whole_reads.fetch_add(1, Ordering::SeqCst);
        }
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), DeviceError> {
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> Result<(), DeviceError> {
        self.inner.flush()
    }
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn discard(&self, offset: u64, len: u64) -> Result<bool, DeviceError> {
        self.inner.discard(offset, len)
    }
}

/// lld on `dev` with both of `seg`'s hooks; checkpoints only when the test asks, unless
/// `auto`.
fn open(dev: &Arc<dyn Device>, seg: &SegmentStore, auto: bool) -> Lld {
    let mut opts = LldOptions {
        checkpoint_hook: Some(seg.hook()),
        segment_hook: std::env::var("R39_NO_AHEAD")
            .is_err()
            .then(|| seg.segment_hook()),
        discard: true,
        ..LldOptions::default()
    };
    if !auto {
        opts.checkpoint_log_bytes = 1 << 40;
        opts.checkpoint_dirty_pages = Some(1 << 30);
    }
    Lld::open(dev.clone(), opts).expect("open")
}

/// Every kept checkpoint object names only objects that are in the store, each of the length
/// and crc it names. Returns the keys named.
fn check_store(store: &dyn ObjectStore, what: &str) -> BTreeSet<String> {
    let mut named = BTreeSet::new();
    // The newest two: an older one is deleted after the objects only it names.
    let ckpts = store.list("ckpt/").unwrap();
    for c in ckpts.iter().rev().take(2) {
        let obj = decode_checkpoint_object(&c.key, &store.get(&c.key).unwrap()).unwrap();
        for e in &obj.entries {
            let b = store
                .get(&e.key())
                .unwrap_or_else(|err| panic!("{what}: {} names {}: {err}", c.key, e.key()));
            assert_eq!(
                b.len(),
                e.pages as usize * PAGE_BYTES,
                "{what}: {} length",
                e.key()
            );
            assert_eq!(
                crc32c::crc32c(&b),
                e.crc,
                "{what}: {} holds other bytes than {} names",
                e.key(),
                c.key
            );
            named.insert(e.key());
        }
    }
    named
}

fn seg_keys(store: &dyn ObjectStore) -> BTreeSet<String> {
    store
        .list("seg/")
        .unwrap()
        .into_iter()
        .map(|o| o.key)
        .collect()
}

/// Finding 1: a segment the log left is queued for a put ahead (`State::left`); when a
/// checkpoint job comes first (the uploader takes jobs first) and puts that segment itself,
/// the queued entry stays, and `put_ahead` later reads the whole segment again only to find
/// the object it would put is the one the job put. Each segment a job uploads so is read
/// twice; through a bounded cache the second read of a segment evicted meanwhile fetches it
/// back from the store.
#[test]
fn a_segment_the_checkpoint_put_is_not_read_again_for_a_put_ahead() {
    let store = Arc::new(GateStore::default());
    let counting = Arc::new(CountingDevice {
        inner: MemoryDevice::new(DEV_BYTES),
        whole_reads: AtomicU64::new(0),
    });
    let dev: Arc<dyn Device> = counting.clone();
    ldfs::lld::mkfs::mkfs(&*dev, &mkfs_opts()).unwrap();
    let clock = TestClock::default();
    let lease = take_lease(store.clone(), &clock, false);
    let seg = SegmentStore::start(store.clone(), dev.clone(), lease, fast_backoff()).unwrap();
    let lld = open(&dev, &seg, false);
    seg.wait_uploaded(seg.announced(), Duration::from_secs(30))
        .unwrap();
    let l = lld.create_list(None, ListHints::default()).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(39);
    // A slow store: the first segments left wait in their puts while more are left.
    store.close();
    let reads0 = counting.whole_reads.load(Ordering::SeqCst);
    let put0 = seg.stats().segments_put;
    for i in 0..80u64 {
        let v: Vec<u8> = (0..32 << 10).map(|_| rng.gen()).collect();
        lld.write(None, l, i, &v).unwrap();
    }
    lld.flush().unwrap();
    wait_for("the ahead puts at the gate", || {
        store.waiting.load(Ordering::SeqCst) >= 1
    });
    std::thread::sleep(Duration::from_millis(200));
    // A checkpoint now (an fsync's, a timer's): its job goes before the puts ahead queued.
    lld.checkpoint_now().unwrap();
    store.open();
    seg.wait_uploaded(seg.announced(), Duration::from_secs(30))
        .unwrap();
    let (reads, st) = wait_settled(Duration::from_millis(500), || {
        (
            counting.whole_reads.load(Ordering::SeqCst),
            seg.stats().segments_put,
        )
    });
    let reads = reads - reads0;
    let put = st - put0;
    let dup: Vec<(String, u64)> = store
        .seg_puts
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(k, n)| (k.clone(), *n))
        .collect();
    assert!(
        dup.is_empty(),
        "segment objects put more than once: {dup:?}"
    );
    // One whole read per segment object put (the Active prefix is not a whole read).
    assert!(
        reads <= put,
        "{reads} whole-segment reads for {put} segment objects put: {} read again for puts \
         ahead the checkpoint job had made already",
        reads - put
    );
    drop(lld);
    seg.stop();
}

/// A crash after full segments went up ahead of any flush: the objects hold bytes the cache
/// loses, under keys of the crashed writer. The next writer on the same cache sweeps them;
/// what it uploads rebuilds exactly its own tree, and no kept checkpoint names an object
/// whose bytes differ from what it says.
#[test]
fn a_crash_after_puts_ahead_of_the_flush_leaves_the_store_consistent() {
    for seed in seeds(&[1, 2, 3, 4]) {
        let why = replay(seed);
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let store = Arc::new(MemoryStore::new());
        let crash = Arc::new(CrashDevice::new(DEV_BYTES));
        let dev: Arc<dyn Device> = crash.clone();
        ldfs::lld::mkfs::mkfs(&*dev, &mkfs_opts()).unwrap();
        dev.flush().unwrap();
        let clock = TestClock::default();
        let lease = take_lease(store.clone(), &clock, false);
        let seg =
            SegmentStore::start(store.clone(), dev.clone(), lease.clone(), fast_backoff()).unwrap();
        let lld = open(&dev, &seg, false);
        seg.wait_uploaded(seg.announced(), Duration::from_secs(30))
            .unwrap();
        let l = lld.create_list(None, ListHints::default()).unwrap();
        let mut model = BTreeMap::new();
        for i in 0..20u64 {
            let v: Vec<u8> = (0..32 << 10).map(|_| rng.gen()).collect();
            lld.write(None, l, i, &v).unwrap();
            model.insert(i, v);
        }
        lld.checkpoint_now().unwrap();
        seg.wait_uploaded(seg.announced(), Duration::from_secs(30))
            .unwrap();
        // Unflushed: written to the device, reported once the writes returned, put ahead.
        let ahead0 = seg.stats().segments_put_ahead;
        for i in 20..60u64 {
            let v: Vec<u8> = (0..32 << 10).map(|_| rng.gen()).collect();
            lld.write(None, l, i, &v).unwrap();
            // The log writer catches up, so a later seal tells of what was left (finding 3:
            // nothing else does without a flush).
            std::thread::sleep(Duration::from_millis(5));
        }
        wait_for("unflushed segments put ahead", || {
            seg.stats().segments_put_ahead >= ahead0 + 4
        });
        let image = crash.crash_image(seed, &CrashOptions::default());
        seg.stop();
        crash_lease(&lease, &clock);
        drop(lld);
        drop(seg);

        // The next writer, on the crashed cache.
        let dev2: Arc<dyn Device> = Arc::new(MemoryDevice::new(DEV_BYTES));
        dev2.write_at(&image, 0).unwrap();
        let lease2 = take_lease(store.clone(), &clock, true);
        let seg2 =
            SegmentStore::start(store.clone(), dev2.clone(), lease2, fast_backoff()).unwrap();
        let lld2 = open(&dev2, &seg2, false);
        // Whatever survived of 20..60 stays as lld2 has it; write over part of it so the
        // segments the crashed writer put ahead are written again, differently.
        let mut now: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
        for i in 0..60u64 {
            if let Some(v) = lld2.read(l, i).unwrap() {
                now.insert(i, v);
            }
        }
        for (i, v) in &model {
            assert_eq!(
                now.get(i),
                Some(v),
                "index {i} flushed before the crash: {why}"
            );
        }
        for i in 30..70u64 {
            let v: Vec<u8> = (0..32 << 10).map(|_| rng.gen()).collect();
            lld2.write(None, l, i, &v).unwrap();
            now.insert(i, v);
        }
        lld2.flush().unwrap();
        wait_settled(Duration::from_millis(300), || seg2.stats().segments_put);
        lld2.checkpoint_now().unwrap();
        seg2.wait_uploaded(seg2.announced(), Duration::from_secs(30))
            .unwrap();
        let named = check_store(&*store, &why);
        let _ = named;
        drop(lld2);
        seg2.stop();
        let dev3: Arc<dyn Device> = Arc::new(MemoryDevice::new(DEV_BYTES));
        restore(&*store, &*dev3).unwrap();
        let lld3 = Lld::open(dev3, LldOptions::default()).unwrap();
        for i in 0..70u64 {
            assert_eq!(
                lld3.read(l, i).unwrap().as_deref(),
                now.get(&i).map(|v| v.as_slice()),
                "index {i} after the rebuild: {why}"
            );
        }
    }
}

/// Churn with the cleaner and checkpoints (many releases and reuses of segments the log left)
/// while the store loses puts or their answers: every kept checkpoint object names only
/// objects that are there with the bytes it says, and the store rebuilds the last checkpoint's
/// tree.
#[test]
fn churn_with_reuse_keeps_every_named_object() {
    for seed in seeds(&[11, 12, 13]) {
        let why = replay(seed);
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let store = Arc::new(MemoryStore::with_faults(MemoryStoreFaults {
            seed,
            lost_ppm: 50_000,
            landed_answer_lost_ppm: 50_000,
            held_ppm: 0,
            reads_down: false,
        }));
        let dev: Arc<dyn Device> = Arc::new(MemoryDevice::new(24 << 20));
        ldfs::lld::mkfs::mkfs(&*dev, &mkfs_opts()).unwrap();
        let clock = TestClock::default();
        let lease = take_lease(store.clone(), &clock, false);
        let seg = SegmentStore::start(store.clone(), dev.clone(), lease, fast_backoff()).unwrap();
        let lld = open(&dev, &seg, false);
        let lists: Vec<ListId> = (0..3)
            .map(|_| lld.create_list(None, ListHints::default()).unwrap())
            .collect();
        let mut model: BTreeMap<(u64, u64), Vec<u8>> = BTreeMap::new();
        let cancel = std::sync::atomic::AtomicBool::new(false);
        for round in 0..30 {
            for _ in 0..rng.gen_range(10..60) {
                let l = lists[rng.gen_range(0..lists.len())];
                let i = rng.gen_range(0..80u64);
                if rng.gen_bool(0.2) {
                    lld.delete(None, l, i).unwrap();
                    model.remove(&(l.0, i));
                } else {
                    let v: Vec<u8> = (0..rng.gen_range(1..32 << 10)).map(|_| rng.gen()).collect();
                    lld.write(None, l, i, &v).unwrap();
                    model.insert((l.0, i), v);
                }
            }
            if rng.gen_bool(0.5) {
                lld.flush().unwrap();
            }
            if rng.gen_bool(0.3) {
                lld.clean_now(PolicyKind::Greedy, Some(8), 0.9, &cancel)
                    .unwrap();
            }
            if rng.gen_bool(0.4) {
                lld.checkpoint_now().unwrap();
            }
            if round % 7 == 6 {
                seg.wait_uploaded(seg.announced(), Duration::from_secs(30))
                    .unwrap();
                check_store(&*store, &format!("round {round}: {why}"));
            }
        }
        lld.flush().unwrap();
        // Let the puts ahead finish, then the last checkpoints settle what they made.
        wait_settled(Duration::from_millis(300), || seg.stats().segments_put);
        for _ in 0..3 {
            lld.checkpoint_now().unwrap();
            seg.wait_uploaded(seg.announced(), Duration::from_secs(30))
                .unwrap();
        }
        // Objects left unnamed are finding 2 (its own probe): here only what is named.
        check_store(&*store, &why);
        assert!(seg.failed().is_none(), "{:?}: {why}", seg.failed());
        drop(lld);
        seg.stop();
        let dev2: Arc<dyn Device> = Arc::new(MemoryDevice::new(24 << 20));
        restore(&*store, &*dev2).unwrap();
        let lld2 = Lld::open(dev2, LldOptions::default()).unwrap();
        for &l in &lists {
            for i in 0..80u64 {
                assert_eq!(
                    lld2.read(l, i).unwrap().as_deref(),
                    model.get(&(l.0, i)).map(|v| v.as_slice()),
                    "list {} index {i} after the rebuild: {why}",
                    l.0
                );
            }
        }
    }
}

/// Finding 2: a checkpoint job given up for a newer one (`Outcome::Skipped`: a segment it names
/// was released while it uploaded) moves what it put, and the objects put ahead it took, into
/// `known`; none of them is named by any checkpoint object. When their segments are released
/// too, nothing deletes them: `gone` looks at `ahead` only, and the old checkpoints' deletes at
/// what they named. They stay in the store until the next start's sweep.
#[test]
fn objects_of_a_skipped_job_whose_segments_are_released_are_deleted() {
    let store = Arc::new(GateStore::default());
    let dev: Arc<dyn Device> = Arc::new(MemoryDevice::new(DEV_BYTES));
    ldfs::lld::mkfs::mkfs(&*dev, &mkfs_opts()).unwrap();
    let clock = TestClock::default();
    let lease = take_lease(store.clone(), &clock, false);
    let seg = SegmentStore::start(store.clone(), dev.clone(), lease, fast_backoff()).unwrap();
    let lld = open(&dev, &seg, false);
    seg.wait_uploaded(seg.announced(), Duration::from_secs(30))
        .unwrap();
    let keep = lld.create_list(None, ListHints::default()).unwrap();
    let v: Vec<u8> = vec![7; 8192];
    lld.write(None, keep, 0, &v).unwrap();
    let a = lld.create_list(None, ListHints::default()).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(392);
    store.close();
    // About 16 segments of list `a`: the first go to puts ahead, which wait at the gate.
    for i in 0..64u64 {
        let v: Vec<u8> = (0..32 << 10).map(|_| rng.gen()).collect();
        lld.write(None, a, i, &v).unwrap();
    }
    lld.flush().unwrap();
    wait_for("the ahead puts at the gate", || {
        store.waiting.load(Ordering::SeqCst) >= 1
    });
    std::thread::sleep(Duration::from_millis(200));
    // Checkpoint 1 names them all; its job takes those put ahead and puts two itself, then
    // four more wait at the gate, read already, and the rest is not read yet.
    lld.checkpoint_now().unwrap();
    store.let_through(store.waiting.load(Ordering::SeqCst) + 2);
    wait_for("the job's puts at the gate", || {
        store.waiting.load(Ordering::SeqCst) >= 4 && store.allow.load(Ordering::SeqCst) == 0
    });
    let skipped0 = seg.stats().checkpoints_skipped;
    // List `a` goes, and checkpoint 2 releases its segments while job 1 is under way.
    lld.delete_list(None, a).unwrap();
    let cancel = std::sync::atomic::AtomicBool::new(false);
    lld.clean_now(PolicyKind::Greedy, Some(64), 0.9, &cancel)
        .unwrap();
    lld.checkpoint_now().unwrap();
    store.open();
    for _ in 0..3 {
        lld.checkpoint_now().unwrap();
        seg.wait_uploaded(seg.announced(), Duration::from_secs(30))
            .unwrap();
    }
    let st = seg.stats();
    assert!(
        st.checkpoints_skipped > skipped0,
        "job 1 was not given up: the probe did not reach its case: {st:?}"
    );
    let named = check_store(&*store, "after the releases");
    let left: Vec<String> = seg_keys(&*store).difference(&named).cloned().collect();
    assert!(
        left.is_empty(),
        "{} segment objects no checkpoint names, of segments released, left in the store: \
         {left:?}",
        left.len()
    );
    drop(lld);
    seg.stop();
}

/// A device whose writes take a while: the log writer thread finishes a segment's writes
/// well after the operation that left it returned.
struct SlowDevice(MemoryDevice);

impl Device for SlowDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), DeviceError> {
        self.0.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), DeviceError> {
        std::thread::sleep(Duration::from_millis(3));
        self.0.write_at(buf, offset)
    }
    fn flush(&self) -> Result<(), DeviceError> {
        self.0.flush()
    }
    fn size_bytes(&self) -> u64 {
        self.0.size_bytes()
    }
}

/// Finding 3: lld tells the hook of a segment it left only from `seal` and after a flush, and
/// only if the log writer has written it by then. A burst of writes faster than the device
/// leaves full segments nobody is told of until the next write, flush or checkpoint: a file
/// written and then left alone (no fsync) is not uploaded while it waits ("each full segment
/// is uploaded as soon as it is sealed", issue 20).
#[test]
fn segments_left_by_a_burst_go_up_without_a_later_write_or_flush() {
    let store = Arc::new(MemoryStore::new());
    let dev: Arc<dyn Device> = Arc::new(SlowDevice(MemoryDevice::new(DEV_BYTES)));
    ldfs::lld::mkfs::mkfs(&*dev, &mkfs_opts()).unwrap();
    let clock = TestClock::default();
    let lease = take_lease(store.clone(), &clock, false);
    let seg = SegmentStore::start(store.clone(), dev.clone(), lease, fast_backoff()).unwrap();
    let lld = open(&dev, &seg, false);
    seg.wait_uploaded(seg.announced(), Duration::from_secs(30))
        .unwrap();
    let l = lld.create_list(None, ListHints::default()).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(393);
    let ahead0 = seg.stats().segments_put_ahead;
    let dirty0 = dirty(&lld);
    for i in 0..40u64 {
        let v: Vec<u8> = (0..32 << 10).map(|_| rng.gen()).collect();
        lld.write(None, l, i, &v).unwrap();
    }
    let left = dirty(&lld) - dirty0;
    assert!(left >= 8, "{left} segments left");
    // No flush, no more writes: the log writer finishes on its own (40 writes of 3 ms).
    let ahead = wait_settled(Duration::from_secs(2), || seg.stats().segments_put_ahead) - ahead0;
    assert_eq!(
        ahead, left,
        "{ahead} of the {left} segments the burst left went up ahead of a checkpoint"
    );
    drop(lld);
    seg.stop();
}

/// Segments the log left (Dirty).
fn dirty(lld: &Lld) -> u64 {
    lld.segment_usage()
        .iter()
        .filter(|(_, u)| u.state == ldfs::lld::usage::SegmentState::Dirty)
        .count() as u64
}

/// Finding 1 through a bounded cache: a segment the checkpoint job put, evicted once its
/// checkpoint object was in the store, is fetched back from the store for the stale put ahead
/// (nothing else reads it): a GET of a whole segment, and an eviction more, for nothing.
#[test]
fn a_segment_the_checkpoint_put_is_not_fetched_back_for_a_put_ahead() {
    // Scratch under /var/tmp (the repository's rule for tests' files).
    std::fs::create_dir_all("/var/tmp/review39").unwrap();
    let dir = tempfile::tempdir_in("/var/tmp/review39").unwrap();
    let path = dir.path().join("cache");
    let dev: Arc<dyn Device> =
        Arc::new(FileDevice::create(&path, DEV_BYTES, FileDeviceOptions::default()).unwrap());
    ldfs::lld::mkfs::mkfs(&*dev, &mkfs_opts()).unwrap();
    let store = Arc::new(GateStore::default());
    let clock = TestClock::default();
    let lease = take_lease(store.clone(), &clock, false);
    let cfg = CacheConfig {
        map_path: dir.path().join("map"),
        bound_bytes: 8 * SEGMENT_BYTES,
        fetch_patience: Duration::from_millis(200),
    };
    let seg =
        SegmentStore::start_cached(store.clone(), dev, lease, fast_backoff(), Some(cfg)).unwrap();
    let cdev = seg.device();
    let lld = open(&cdev, &seg, false);
    // Three checkpoint objects: the next upload deletes one (after it made its segments
    // evictable), where this probe holds it.
    for _ in 0..2 {
        lld.checkpoint_now().unwrap();
    }
    seg.wait_uploaded(seg.announced(), Duration::from_secs(30))
        .unwrap();
    let l = lld.create_list(None, ListHints::default()).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(391);
    store.close();
    for i in 0..80u64 {
        let v: Vec<u8> = (0..32 << 10).map(|_| rng.gen()).collect();
        lld.write(None, l, i, &v).unwrap();
    }
    lld.flush().unwrap();
    wait_for("the ahead puts at the gate", || {
        store.waiting.load(Ordering::SeqCst) >= 1
    });
    std::thread::sleep(Duration::from_millis(200));
    store.set_deletes(true);
    lld.checkpoint_now().unwrap();
    store.open();
    seg.wait_uploaded(seg.announced(), Duration::from_secs(30))
        .unwrap();
    wait_for("the upload's deletes at their gate", || {
        store.deletes_waiting.load(Ordering::SeqCst) >= 1
    });
    // What the checkpoint made evictable goes (as the eviction thread would).
    seg.shrink_cache().unwrap();
    let before = seg.cache_stats().unwrap();
    assert!(before.evicted_segments > 0, "nothing evicted: {before:?}");
    store.set_deletes(false);
    let after = wait_settled(Duration::from_millis(500), || seg.cache_stats().unwrap());
    assert_eq!(
        after.misses, before.misses,
        "segments fetched back from the store though nothing read them: {after:?}"
    );
    drop(lld);
    seg.stop();
}

/// Finding 4: `put_ahead` starts its workers once, each taking segments from `State::left`
/// until it finds it empty, and runs again only when all of them ended. Segments left one by
/// one (a write streaming, each seal telling of one) find one worker: the others found the
/// queue empty at their start and ended, and the one left carries every later segment alone,
/// one put at a time, for as long as the stream goes on.
#[test]
fn segments_left_one_by_one_go_up_several_at_once() {
    let store = Arc::new(GateStore::default());
    let dev: Arc<dyn Device> = Arc::new(MemoryDevice::new(DEV_BYTES));
    ldfs::lld::mkfs::mkfs(&*dev, &mkfs_opts()).unwrap();
    let clock = TestClock::default();
    let lease = take_lease(store.clone(), &clock, false);
    let seg = SegmentStore::start(store.clone(), dev.clone(), lease, fast_backoff()).unwrap();
    let lld = open(&dev, &seg, false);
    seg.wait_uploaded(seg.announced(), Duration::from_secs(30))
        .unwrap();
    let l = lld.create_list(None, ListHints::default()).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(394);
    // A slow store: each put takes until the probe opens the gate.
    store.close();
    let mut i = 0u64;
    let mut write_segment = |lld: &Lld| {
        let d = dirty(lld);
        while dirty(lld) == d {
            let v: Vec<u8> = (0..32 << 10).map(|_| rng.gen()).collect();
            lld.write(None, l, i, &v).unwrap();
            i += 1;
        }
        lld.flush().unwrap();
    };
    write_segment(&lld);
    wait_for("the first put ahead at the gate", || {
        store.waiting.load(Ordering::SeqCst) >= 1
    });
    std::thread::sleep(Duration::from_millis(200));
    // The stream goes on: six more segments left while the first put is under way.
    for _ in 0..6 {
        write_segment(&lld);
    }
    let waiting = wait_settled(Duration::from_millis(500), || {
        store.waiting.load(Ordering::SeqCst)
    });
    let in_flight = ldfs::store::segments::puts_in_flight(SEGMENT_BYTES) as u64;
    store.open();
    assert_eq!(
        waiting, in_flight,
        "{waiting} puts ahead under way with 7 segments left and {in_flight} allowed at once"
    );
    drop(lld);
    seg.stop();
}

/// What the engine-level probe records of the hooks' calls.
#[derive(Default)]
struct HookLog {
    /// Per segment: the crc of its bytes and of its page 0 when reported (its use not yet
    /// released).
    reported: BTreeMap<u32, (u32, u32)>,
    /// Per segment: page 0's crc when its last reported use was released.
    released_page0: BTreeMap<u32, u32>,
    reports: u64,
    reported_then_released: u64,
    violations: Vec<String>,
}

/// lld's side of the contract (`SegmentHook`): a segment is told of once per use, only after
/// every write of that use returned, never after the checkpoint that releases it, and its bytes
/// stay as they were told until that release. Checked from the hooks themselves (reading the
/// device), under a background cleaner, the checkpoint thread and two writers.
#[test]
fn lld_tells_each_use_once_before_its_release_with_its_final_bytes() {
    for seed in seeds(&[31, 32]) {
        let why = replay(seed);
        let mem = Arc::new(MemoryDevice::new(12 << 20));
        let dev: Arc<dyn Device> = mem.clone();
        ldfs::lld::mkfs::mkfs(&*dev, &mkfs_opts()).unwrap();
        let geo = {
            let mut sb = vec![0u8; PAGE_BYTES];
            dev.read_at(&mut sb, 0).unwrap();
            ldfs::lld::layout::Geometry::decode_superblock(&sb, 0, dev.size_bytes()).unwrap()
        };
        let log = Arc::new(Mutex::new(HookLog::default()));
        let read_seg = {
            let dev = dev.clone();
            move |s: u32| -> (u32, u32) {
                let mut b = vec![0u8; geo.segment_pages as usize * PAGE_BYTES];
                dev.read_at(&mut b, geo.page_addr(ldfs::lld::SegmentId(s), 0))
                    .unwrap();
                (crc32c::crc32c(&b), crc32c::crc32c(&b[..PAGE_BYTES]))
            }
        };
        let seg_hook = {
            let log = log.clone();
            let read_seg = read_seg.clone();
            ldfs::lld::SegmentHook(Arc::new(move |s: ldfs::lld::SegmentId| {
                let (all, p0) = read_seg(s.0);
                let mut l = log.lock().unwrap();
                l.reports += 1;
                if l.reported.contains_key(&s.0) {
                    l.violations
                        .push(format!("segment {} told of twice without a release", s.0));
                }
                if l.released_page0.get(&s.0) == Some(&p0) {
                    l.violations.push(format!(
                        "segment {} told of after the release of that use",
                        s.0
                    ));
                }
                l.reported.insert(s.0, (all, p0));
            }))
        };
        let ck_hook = {
            let log = log.clone();
            ldfs::lld::CheckpointHook(Arc::new(move |c: &ldfs::lld::DurableCheckpoint<'_>| {
                for s in c.released {
                    let (all, p0) = read_seg(s.0);
                    let mut l = log.lock().unwrap();
                    if let Some((was, _)) = l.reported.remove(&s.0) {
                        l.reported_then_released += 1;
                        if was != all {
                            l.violations.push(format!(
                                "segment {} changed between its report and its release \
                                 (checkpoint {})",
                                s.0, c.serial
                            ));
                        }
                    }
                    l.released_page0.insert(s.0, p0);
                }
            }))
        };
        let mut opts = LldOptions {
            checkpoint_hook: Some(ck_hook),
            segment_hook: Some(seg_hook),
            checkpoint_log_bytes: 1 << 20,
            ..LldOptions::default()
        };
        opts.cleaner.background = true;
        let lld = Arc::new(Lld::open(dev.clone(), opts).unwrap());
        let lists: Vec<ListId> = (0..2)
            .map(|_| lld.create_list(None, ListHints::default()).unwrap())
            .collect();
        let threads: Vec<_> = (0..2)
            .map(|t| {
                let lld = lld.clone();
                let l = lists[t];
                std::thread::spawn(move || {
                    let mut rng = ChaCha8Rng::seed_from_u64(seed * 10 + t as u64);
                    for n in 0..3000u64 {
                        let i = rng.gen_range(0..60u64);
                        let v: Vec<u8> =
                            (0..rng.gen_range(1..24 << 10)).map(|_| rng.gen()).collect();
                        lld.write(None, l, i, &v).unwrap();
                        if n % 97 == 0 {
                            lld.flush().unwrap();
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        lld.flush().unwrap();
        lld.checkpoint_now().unwrap();
        let l = log.lock().unwrap();
        assert!(
            l.violations.is_empty(),
            "{} violations, first {:?}: {why}",
            l.violations.len(),
            &l.violations[..l.violations.len().min(5)]
        );
        assert!(
            l.reports > 50 && l.reported_then_released > 20,
            "the probe did not reach its case: {} reports, {} of them released: {why}",
            l.reports,
            l.reported_then_released
        );
        eprintln!(
            "{} reports, {} released after their report: {why}",
            l.reports, l.reported_then_released
        );
    }
}
