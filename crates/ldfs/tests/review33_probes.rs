//! Review 33's probes of the segment store's uploader after 2a1a46a (up to 4 segment objects in
//! flight) and the merge d44e098 (review 32's candidates and stops joined with it). Each probe
//! fails while the defect its doc comment names is there. `#[ignore]` marks an open defect:
//! `cargo test --release -p ldfs --test review33_probes -- --ignored` runs them.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ldfs::device::{Device, MemoryDevice};
use ldfs::ld::{ListHints, ListId, LogicalDisk};
use ldfs::lld::layout::MkfsOptions;
use ldfs::lld::{Lld, LldOptions};
use ldfs::store::segments::{checkpoint_key, decode_checkpoint_object, parse_checkpoint_key};
use ldfs::store::{
    restore, MemoryStore, ObjectInfo, ObjectStore, PutOutcome, SegmentStore, StoreError, StoreOp,
    StoreResult,
};
use ldfs::testing::store::{take_lease, TestClock};

const DEV_BYTES: u64 = 24 << 20;

fn mkfs_opts() -> MkfsOptions {
    MkfsOptions {
        segment_bytes: 128 << 10,
        max_block_bytes: 32 << 10,
        reserved_segments: Some(4),
        fs_id: 3333,
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

/// A memory store whose deletes of checkpoint objects fail transiently (503) while
/// `fail_deletes` is set, and whose
/// segment puts can be made to fail for good (`refuse_segment_put`) or to take a while.
#[derive(Default)]
struct Flaky {
    inner: MemoryStore,
    fail_deletes: AtomicBool,
    deletes_refused: AtomicUsize,
    refuse_segment_put: AtomicBool,
    slow_segment_puts: AtomicBool,
    /// Keys of segment puts acknowledged.
    acked: Mutex<Vec<String>>,
}

impl ObjectStore for Flaky {
    fn put(&self, key: &str, bytes: &[u8]) -> StoreResult<()> {
        if key.starts_with("seg/") {
            if self.slow_segment_puts.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(40));
            }
            if self.refuse_segment_put.swap(false, Ordering::SeqCst) {
                return Err(StoreError::Refused {
                    op: StoreOp::Put,
                    key: key.into(),
                    status: 403,
                    detail: "probe: refused".into(),
                });
            }
            self.inner.put(key, bytes)?;
            self.acked.lock().unwrap().push(key.into());
            return Ok(());
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
        // Checkpoint objects only: the deletes of superseded segment objects a job may make
        // before its checkpoint put (a job abandoned earlier left one no kept checkpoint
        // names) go through, so the put is reached whatever the timing.
        if key.starts_with("ckpt/") && self.fail_deletes.load(Ordering::SeqCst) {
            self.deletes_refused.fetch_add(1, Ordering::SeqCst);
            return Err(StoreError::Unavailable {
                op: StoreOp::Delete,
                key: key.into(),
                reason: "probe: 503 SlowDown".into(),
            });
        }
        self.inner.delete(key)
    }
    fn list(&self, prefix: &str) -> StoreResult<Vec<ObjectInfo>> {
        self.inner.list(prefix)
    }
}

/// The newest checkpoint serial of this process's writer in the store.
fn newest_serial_in_store(store: &dyn ObjectStore, writer: u64) -> u64 {
    store
        .list("ckpt/")
        .unwrap()
        .iter()
        .filter_map(|o| parse_checkpoint_key(&o.key))
        .filter(|(w, _)| *w == writer)
        .map(|(_, s)| s)
        .max()
        .unwrap_or(0)
}

/// Finding 1 (medium; fixed on review33): a checkpoint object acknowledged by the store is counted as uploaded
/// (`State::uploaded`, what `wait_uploaded`, `sync --remote` and an unmount's `finish` read)
/// only when the whole job returns `Done`, i.e. after the deletes of what the checkpoint
/// superseded. A delete that fails transiently (503 SlowDown, or the lease late in renewing:
/// `retry_fenced` waits) holds the count back though the checkpoint is in the store; the
/// unmount's wait then times out, `stop` makes the delete loop return `Stopped` (not `Done`),
/// and `finish` says "the final checkpoint N is not in the store", keeps the lease
/// (abandoned: another machine waits for its expiry and needs `--force-takeover`). A delete
/// refused for good (`Err`) or the lease lost between the put and the deletes likewise sets
/// `failed` with the checkpoint in the store.
#[test]
fn an_acknowledged_checkpoint_counts_as_uploaded_before_the_deletes_behind_it() {
    let store = Arc::new(Flaky::default());
    let dev: Arc<dyn Device> = Arc::new(MemoryDevice::new(DEV_BYTES));
    ldfs::lld::mkfs::mkfs(&*dev, &mkfs_opts()).unwrap();
    let lease = take_lease(store.clone(), &TestClock::default(), false);
    let writer = lease.writer();
    let seg = SegmentStore::start(store.clone(), dev.clone(), lease, fast()).unwrap();
    let lld = open(seg.device(), &seg);
    let l = lld.create_list(None, ListHints::default()).unwrap();
    // Two checkpoint objects in the store: the next one supersedes the oldest.
    for b in 1..=2u8 {
        fill(&lld, l, b, 30);
        lld.checkpoint_now().unwrap();
        seg.wait_uploaded(seg.announced(), Duration::from_secs(30))
            .unwrap();
    }
    // The second upload's deletes behind it are done (with the fix they may still run after
    // wait_uploaded returned): two checkpoint objects left.
    let t = Instant::now();
    while store.inner.list("ckpt/").unwrap().len() > 2 {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "old checkpoints never deleted"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    store.fail_deletes.store(true, Ordering::SeqCst);
    fill(&lld, l, 3, 30);
    lld.checkpoint_now().unwrap();
    let due = seg.announced();
    let t = Instant::now();
    while newest_serial_in_store(&store.inner, writer) < due {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "checkpoint object {due} never put"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // The object is in the store, complete and decodable.
    let key = checkpoint_key(writer, due);
    decode_checkpoint_object(&key, &store.inner.get(&key).unwrap()).unwrap();
    let waited = seg.wait_uploaded(due, Duration::from_secs(2));
    let refused = store.deletes_refused.load(Ordering::SeqCst);
    // What an unmount does after its wait: stop, then ask whether the final one is there.
    seg.stop();
    let after_stop = seg.uploaded();
    assert!(
        waited.is_ok(),
        "checkpoint object {key} is in the store, but wait_uploaded said: {:?} ({refused} \
         deletes refused meanwhile)",
        waited.err()
    );
    assert!(
        after_stop >= due,
        "after stop the uploader counts {after_stop} uploaded, though {key} is in the store"
    );
    std::mem::forget(lld);
}

/// Guard (passes): an error in one put worker while others' puts are in flight leaves every
/// acknowledged put known to the next start (here: not deleted while a kept checkpoint
/// names it) and a rebuild from the store opens the last uploaded checkpoint's tree.
/// (The uploader stops for good on the error; the next start sweeps what no kept checkpoint
/// names.)
#[test]
fn an_error_in_one_put_worker_leaves_the_store_restorable() {
    let store = Arc::new(Flaky::default());
    let dev: Arc<dyn Device> = Arc::new(MemoryDevice::new(DEV_BYTES));
    ldfs::lld::mkfs::mkfs(&*dev, &mkfs_opts()).unwrap();
    let clock = TestClock::default();
    let lease = take_lease(store.clone(), &clock, false);
    let seg = SegmentStore::start(store.clone(), dev.clone(), lease.clone(), fast()).unwrap();
    let lld = open(seg.device(), &seg);
    let l = lld.create_list(None, ListHints::default()).unwrap();
    fill(&lld, l, 1, 40);
    lld.checkpoint_now().unwrap();
    seg.wait_uploaded(seg.announced(), Duration::from_secs(30))
        .unwrap();
    let good = seg.uploaded();
    // Many segments, slow puts: several in flight when one is refused.
    store.slow_segment_puts.store(true, Ordering::SeqCst);
    let l2 = lld.create_list(None, ListHints::default()).unwrap();
    fill(&lld, l2, 2, 200);
    store.refuse_segment_put.store(true, Ordering::SeqCst);
    lld.checkpoint_now().unwrap();
    let e = seg.wait_uploaded(seg.announced(), Duration::from_secs(30));
    assert!(
        e.is_err(),
        "a refused segment put did not stop the uploader"
    );
    assert_eq!(seg.uploaded(), good);
    seg.stop();
    std::mem::forget(lld);
    lease.abandon();
    // Every acknowledged put is either named by a kept checkpoint or not; a rebuild works.
    let fresh: Arc<dyn Device> = Arc::new(MemoryDevice::new(DEV_BYTES));
    let r = restore(&store.inner, &*fresh).unwrap();
    assert_eq!(r.serial, good);
    let back = Lld::open(fresh, LldOptions::default()).unwrap();
    for i in 0..40u64 {
        assert_eq!(back.read(l, i).unwrap().map(|v| v[0]), Some(1), "block {i}");
    }
}
