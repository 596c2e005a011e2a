//! Review 32's probes of the store-backed file system after review 31's open findings were
//! fixed (7748b11: named slots in checkpoint objects, the newest complete checkpoint, the fs
//! id check at start, the uploader's end). Each probe fails while the defect its doc comment
//! names is there. `#[ignore]` marks an open defect:
//! `cargo test --release -p ldfs --test review32_probes -- --ignored` runs them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use ldfs::device::{Device, MemoryDevice};
use ldfs::ld::{ListHints, ListId, LogicalDisk};
use ldfs::lld::layout::MkfsOptions;
use ldfs::lld::{Lld, LldOptions};
use ldfs::store::segments::{
    checkpoint_key, encode_checkpoint_object, newest_checkpoint, parse_checkpoint_key,
};
use ldfs::store::{
    restore, MemoryStore, ObjectInfo, ObjectStore, PutOutcome, SegmentStore, StoreResult,
};
use ldfs::testing::store::{take_lease, TestClock};

const DEV_BYTES: u64 = 24 << 20;

fn mkfs_opts() -> MkfsOptions {
    MkfsOptions {
        segment_bytes: 128 << 10,
        max_block_bytes: 32 << 10,
        reserved_segments: Some(4),
        fs_id: 3232,
        max_bytes: None,
        kept_pages: 0,
    }
}

use ldfs::testing::store::fast_backoff as fast;

fn open(dev: Arc<dyn Device>, seg: &SegmentStore) -> Lld {
    Lld::open(
        dev,
        LldOptions {
            checkpoint_hook: Some(seg.hook()),
            segment_hook: Some(seg.segment_hook()),
            ..LldOptions::default()
        },
    )
    .expect("open")
}

fn fill(lld: &Lld, l: ListId, byte: u8, n: u64) {
    for i in 0..n {
        lld.write(None, l, i, &[byte; 9000]).unwrap();
    }
}

/// Writes `n` values into a fresh list and uploads a checkpoint; returns the list.
fn write_and_upload(lld: &Lld, seg: &SegmentStore, byte: u8, n: u64) -> ListId {
    let l = lld.create_list(None, ListHints::default()).unwrap();
    fill(lld, l, byte, n);
    lld.checkpoint_now().unwrap();
    seg.wait_uploaded(seg.announced(), Duration::from_secs(30))
        .unwrap();
    l
}

/// A memory store whose checkpoint puts can be held in flight (a stale writer's request that
/// lands late: the design tolerates them, DESIGN "One writer: the lease"), and whose first
/// `seg/` listing after `arm_list` waits for `go` (a writer uploading meanwhile).
#[derive(Default)]
struct Probe {
    inner: Arc<MemoryStore>,
    hold_ckpt: AtomicBool,
    /// (puts waiting, released)
    gate: Mutex<(usize, bool)>,
    gate_cv: Condvar,
    list_armed: AtomicBool,
    /// (listed, go)
    list_gate: Mutex<(bool, bool)>,
    list_cv: Condvar,
}

impl Probe {
    fn wait_held(&self) {
        let g = self.gate.lock().unwrap();
        let (g, _) = self
            .gate_cv
            .wait_timeout_while(g, Duration::from_secs(30), |g| g.0 == 0)
            .unwrap();
        assert!(g.0 > 0, "no checkpoint put was held");
    }
    fn release_held(&self) {
        self.hold_ckpt.store(false, Ordering::SeqCst);
        self.gate.lock().unwrap().1 = true;
        self.gate_cv.notify_all();
    }
    fn wait_listed(&self) {
        let g = self.list_gate.lock().unwrap();
        let (g, _) = self
            .list_cv
            .wait_timeout_while(g, Duration::from_secs(30), |g| !g.0)
            .unwrap();
        assert!(g.0, "no seg/ listing happened");
    }
    fn go(&self) {
        self.list_gate.lock().unwrap().1 = true;
        self.list_cv.notify_all();
    }
}

impl ObjectStore for Probe {
    fn put(&self, key: &str, bytes: &[u8]) -> StoreResult<()> {
        self.inner.put(key, bytes)
    }
    fn put_if_absent(&self, key: &str, bytes: &[u8]) -> StoreResult<PutOutcome> {
        if key.starts_with("ckpt/") && self.hold_ckpt.load(Ordering::SeqCst) {
            let mut g = self.gate.lock().unwrap();
            g.0 += 1;
            self.gate_cv.notify_all();
            while !g.1 {
                g = self.gate_cv.wait(g).unwrap();
            }
        }
        self.inner.put_if_absent(key, bytes)
    }
    fn get(&self, key: &str) -> StoreResult<Vec<u8>> {
        self.inner.get(key)
    }
    fn get_range(&self, key: &str, offset: u64, len: u64) -> StoreResult<Vec<u8>> {
        self.inner.get_range(key, offset, len)
    }
    fn delete(&self, key: &str) -> StoreResult<()> {
        self.inner.delete(key)
    }
    fn list(&self, prefix: &str) -> StoreResult<Vec<ObjectInfo>> {
        let r = self.inner.list(prefix);
        if prefix == "seg/" && self.list_armed.swap(false, Ordering::SeqCst) {
            let mut g = self.list_gate.lock().unwrap();
            g.0 = true;
            self.list_cv.notify_all();
            while !g.1 {
                g = self.list_cv.wait(g).unwrap();
            }
        }
        r
    }
}

/// Finding 1 (high): `SegmentStore::start` takes what the store "already holds" (`known`,
/// and `uploaded`) from the newest complete kept checkpoint object, which need not be the
/// checkpoint the cache holds. A stale writer's checkpoint put that lands after the taker
/// took the lease and rebuilt its cache from the checkpoint before it, but before the
/// taker's start (or before its first upload, then a remount on the same cache), is complete
/// (its segment objects were put before the takeover) and is taken as the base: every
/// segment the cache holds in the same use (page 0's sequence number, all that is compared)
/// is taken as uploaded with the stale writer's page count and bytes. When the taker's log
/// fills that segment to the same length, its checkpoint object names the stale writer's
/// segment object: the store holds a tree whose blocks are another branch's bytes (the
/// segment object's crc matches, so restore cannot tell; lld's block crcs then fail the
/// reads: B's uploaded, acknowledged writes are lost). `uploaded` is the stale serial too, so the taker's
/// first checkpoint of that serial counts as uploaded (`sync --remote`, the unmount).
#[test]
fn a_late_checkpoint_landing_before_the_takers_start_is_never_taken_as_uploaded() {
    let store = Arc::new(Probe::default());
    let clock = TestClock::default();
    let dev_a: Arc<dyn Device> = Arc::new(MemoryDevice::new(DEV_BYTES));
    ldfs::lld::mkfs::mkfs(&*dev_a, &mkfs_opts()).unwrap();
    let lease_a = take_lease(store.clone(), &clock, false);
    let seg_a = SegmentStore::start(store.clone(), dev_a.clone(), lease_a.clone(), fast()).unwrap();
    let lld_a = open(seg_a.device(), &seg_a);
    let l1 = write_and_upload(&lld_a, &seg_a, 1, 30);
    let base = seg_a.uploaded();
    // A's next checkpoint: its segment objects acknowledged, its checkpoint put sent while A
    // held the lease and held in flight.
    store.hold_ckpt.store(true, Ordering::SeqCst);
    let la = lld_a.create_list(None, ListHints::default()).unwrap();
    fill(&lld_a, la, 2, 30);
    lld_a.checkpoint_now().unwrap();
    store.wait_held();
    // A is cut off; B takes over and rebuilds its cache from the store (A's `base`).
    lease_a.abandon();
    clock.advance(61);
    let lease_b = take_lease(store.clone(), &clock, true);
    let dev_b: Arc<dyn Device> = Arc::new(MemoryDevice::new(DEV_BYTES));
    let r = restore(&*store, &*dev_b).unwrap();
    assert_eq!(r.serial, base);
    // A's put lands now, between B's rebuild and B's start.
    store.release_held();
    let t = Instant::now();
    while !store
        .inner
        .keys()
        .iter()
        .any(|k| parse_checkpoint_key(k).is_some_and(|(w, s)| w == lease_a.writer() && s > base))
    {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "A's put never landed"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let seg_b = SegmentStore::start(store.clone(), dev_b.clone(), lease_b.clone(), fast()).unwrap();
    let uploaded_at_start = seg_b.uploaded();
    let lld_b = open(seg_b.device(), &seg_b);
    let lb = lld_b.create_list(None, ListHints::default()).unwrap();
    fill(&lld_b, lb, 3, 30);
    lld_b.checkpoint_now().unwrap();
    fill(&lld_b, lb, 4, 4);
    lld_b.close().unwrap();
    seg_b
        .wait_uploaded(seg_b.announced(), Duration::from_secs(30))
        .unwrap();
    seg_b.stop();
    seg_a.stop();
    drop(lld_a);
    // A new machine rebuilds from the store: B's tree, B's bytes.
    let dev_c: Arc<dyn Device> = Arc::new(MemoryDevice::new(DEV_BYTES));
    let rc = restore(&*store.inner, &*dev_c).unwrap();
    let lld_c = Lld::open(dev_c, LldOptions::default()).unwrap();
    let mut wrong = Vec::new();
    for i in 0..30u64 {
        let want = if i < 4 { 4u8 } else { 3u8 };
        match lld_c.read(lb, i) {
            Ok(Some(b)) if b == [want; 9000] => {}
            Ok(Some(b)) => wrong.push(format!("block {i}: byte {} (want {want})", b[0])),
            other => wrong.push(format!(
                "block {i}: {:?}",
                other.map(|o| o.map(|b| b.len()))
            )),
        }
    }
    assert_eq!(
        lld_c.read(l1, 29).unwrap().as_deref(),
        Some(&[1u8; 9000][..])
    );
    assert!(
        wrong.is_empty() && uploaded_at_start <= base,
        "B's checkpoint {} in the store reads other bytes: {wrong:?}; B's start took \
         checkpoint {uploaded_at_start} (A's late one) as the store's, its cache holds {base}",
        rc.serial
    );
}

/// Finding 2 (low): a checkpoint object's slot may name more segments than its superblock
/// (RESIZE: "the slot's count is the truth"); `decode_checkpoint_object` checks entries
/// against the superblock's count but `checkpoint::decode` checks the slot's log and next
/// segments against the slot's. A hostile object (the crcs are not keyed) whose superblock
/// counts fewer segments than the slot's log segment passes decoding, and `restore` panics in
/// `Geometry::page_addr`'s assertion zeroing the log head (the repository's rule: never panic
/// on data read from a device; a rebuild runs inside `ldfs mount`).
#[test]
fn a_hostile_checkpoint_object_fails_the_rebuild_without_a_panic() {
    let store = Arc::new(MemoryStore::new());
    let dev: Arc<dyn Device> = Arc::new(MemoryDevice::new(DEV_BYTES));
    ldfs::lld::mkfs::mkfs(
        &*dev,
        &MkfsOptions {
            max_bytes: Some(DEV_BYTES * 4),
            ..mkfs_opts()
        },
    )
    .unwrap();
    let clock = TestClock::default();
    let lease = take_lease(store.clone(), &clock, false);
    let seg = SegmentStore::start(store.clone(), dev, lease, fast()).unwrap();
    let lld = open(seg.device(), &seg);
    write_and_upload(&lld, &seg, 5, 40);
    lld.close().unwrap();
    seg.wait_uploaded(seg.announced(), Duration::from_secs(30))
        .unwrap();
    seg.stop();
    let (key, obj) = newest_checkpoint(&*store).unwrap().unwrap();
    assert!(obj.geo.resizable());
    let (hdr, _) = ldfs::lld::checkpoint::decode(&obj.geo, &obj.slot, 0).unwrap();
    assert!(hdr.log_segment > 0, "the log must have moved on");
    // The superblock rewritten to count only the segments below the log's.
    let mut g = obj.geo;
    g.segment_count = hdr.log_segment;
    g.reserved_segments = 1;
    let sb = g.encode_superblock(0);
    let entries: Vec<_> = obj
        .entries
        .iter()
        .copied()
        .filter(|e| e.segment < g.segment_count)
        .collect();
    let (w, s) = parse_checkpoint_key(&key).unwrap();
    // Same key (the slot's serial is the key's), the object replaced.
    let bytes = encode_checkpoint_object(&g, &sb, w, s, &obj.slot, &entries);
    store.put(&checkpoint_key(w, s), &bytes).unwrap();
    let fresh: Arc<dyn Device> = Arc::new(MemoryDevice::new(DEV_BYTES));
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| restore(&*store, &*fresh)));
    match r {
        Err(_) => panic!("restore panicked on a hostile checkpoint object"),
        Ok(Ok(rep)) => panic!("restore took a hostile checkpoint object: {rep:?}"),
        Ok(Err(e)) => eprintln!("refused: {e}"),
    }
}

/// Finding 3 (low): `newest_complete_checkpoint` lists `seg/` before `ckpt/`. A read-only
/// mount rebuilding its cache beside a writer (README: supported) whose uploads land while it
/// lists sees checkpoint objects newer than its segment listing: each looks incomplete, and
/// with two of them (the writer deleted the one before) the rebuild fails with "no checkpoint
/// object whose segment objects are all there", a corrupt store, though the store is whole
/// (before 7748b11 restore took the newest and read its segment objects by key). With one,
/// the rebuild silently takes the older checkpoint.
#[test]
fn a_rebuild_beside_an_uploading_writer_restores_the_file_system() {
    let probe = Arc::new(Probe::default());
    let store: Arc<dyn ObjectStore> = probe.inner.clone();
    let clock = TestClock::default();
    let dev: Arc<dyn Device> = Arc::new(MemoryDevice::new(DEV_BYTES));
    ldfs::lld::mkfs::mkfs(&*dev, &mkfs_opts()).unwrap();
    let lease = take_lease(store.clone(), &clock, false);
    let seg = SegmentStore::start(store.clone(), dev, lease, fast()).unwrap();
    let lld = open(seg.device(), &seg);
    let l1 = write_and_upload(&lld, &seg, 1, 20);
    probe.list_armed.store(true, Ordering::SeqCst);
    let p2 = probe.clone();
    let reader = std::thread::spawn(move || {
        let dev_r: Arc<dyn Device> = Arc::new(MemoryDevice::new(DEV_BYTES));
        restore(&*p2, &*dev_r).map(|r| (r, dev_r))
    });
    probe.wait_listed();
    // The writer's next two upload windows, while the reader lists.
    write_and_upload(&lld, &seg, 2, 3);
    write_and_upload(&lld, &seg, 3, 3);
    probe.go();
    let r = reader.join().unwrap();
    lld.close().unwrap();
    seg.stop();
    let (_, dev_r) = r.unwrap_or_else(|e| {
        panic!(
            "a rebuild beside a writer failed: {e}; keys: {:?}",
            probe.inner.keys()
        )
    });
    let l = Lld::open(dev_r, LldOptions::default()).unwrap();
    assert_eq!(l.read(l1, 19).unwrap().as_deref(), Some(&[1u8; 9000][..]));
}

/// A store whose segment puts take `delay` each (a slow link).
struct Slow {
    inner: MemoryStore,
    delay: Duration,
}

impl ObjectStore for Slow {
    fn put(&self, key: &str, bytes: &[u8]) -> StoreResult<()> {
        if key.starts_with("seg/") {
            std::thread::sleep(self.delay);
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
        self.inner.delete(key)
    }
    fn list(&self, prefix: &str) -> StoreResult<Vec<ObjectInfo>> {
        self.inner.list(prefix)
    }
}

/// Finding 4 (low): `SegmentStore::stop` sets `stop` and joins the uploader, which looks at
/// `stop` only when a request fails: an upload in progress goes on through every segment of
/// its checkpoint and the checkpoint put. The unmount's "bounded" wait for the final upload
/// (`StoreMount::finish`: 2 minutes, then stop) is then as long as the whole backlog takes on
/// a slow link (the backlog bound defaults to a quarter of the cache), and when that upload
/// does complete inside `stop`, `finish` has already decided it failed: it abandons the lease
/// and tells the user to wait for its expiry and `--force-takeover`.
#[test]
fn stopping_the_uploader_mid_upload_returns_promptly() {
    let store = Arc::new(Slow {
        inner: MemoryStore::new(),
        delay: Duration::from_millis(250),
    });
    let dev: Arc<dyn Device> = Arc::new(MemoryDevice::new(DEV_BYTES));
    ldfs::lld::mkfs::mkfs(&*dev, &mkfs_opts()).unwrap();
    let clock = TestClock::default();
    let lease = take_lease(store.clone(), &clock, false);
    let seg = SegmentStore::start(store.clone(), dev, lease, fast()).unwrap();
    let lld = open(seg.device(), &seg);
    let l = lld.create_list(None, ListHints::default()).unwrap();
    // About 40 segments of 128 KiB: 10 s of segment puts.
    fill(&lld, l, 6, 560);
    lld.checkpoint_now().unwrap();
    let due = seg.announced();
    assert!(seg.wait_uploaded(due, Duration::from_millis(700)).is_err());
    let t = Instant::now();
    seg.stop();
    let took = t.elapsed();
    assert!(
        took < Duration::from_secs(2),
        "stop() took {took:?}: it waited for the upload in progress (checkpoint {due} now \
         uploaded: {})",
        seg.uploaded() >= due
    );
    drop(lld);
}
