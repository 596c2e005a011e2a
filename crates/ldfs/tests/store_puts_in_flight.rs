//! The uploader puts several segment objects at once (`segments::puts_in_flight`, DESIGN
//! "Upload throughput"), and still puts a checkpoint object only after every segment object it
//! names was acknowledged: over a store whose segment puts each take a while, the most puts
//! seen in flight together reaches the bound, no checkpoint put starts while one is in flight,
//! and a cache rebuilt from the store opens what was written.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ldfs::device::{Device, MemoryDevice};
use ldfs::ld::{ListHints, LogicalDisk};
use ldfs::lld::layout::MkfsOptions;
use ldfs::lld::{Lld, LldOptions};
use ldfs::store::segments::{puts_in_flight, UPLOAD_PUTS_IN_FLIGHT};
use ldfs::store::{
    restore, MemoryStore, ObjectInfo, ObjectStore, PutOutcome, SegmentStore, StoreResult,
};
use ldfs::testing::store::{take_lease, TestClock};

/// A memory store whose segment puts take 30 ms, counting those in flight.
struct SlowPuts {
    inner: MemoryStore,
    in_flight: AtomicUsize,
    most: AtomicUsize,
    /// Segment puts in flight when each checkpoint put began.
    at_checkpoint: Mutex<Vec<usize>>,
}

impl ObjectStore for SlowPuts {
    fn put(&self, key: &str, bytes: &[u8]) -> StoreResult<()> {
        if !key.starts_with("seg/") {
            return self.inner.put(key, bytes);
        }
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(30));
        let r = self.inner.put(key, bytes);
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        r
    }
    fn put_if_absent(&self, key: &str, bytes: &[u8]) -> StoreResult<PutOutcome> {
        if key.starts_with("ckpt/") {
            self.at_checkpoint
                .lock()
                .unwrap()
                .push(self.in_flight.load(Ordering::SeqCst));
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
        self.inner.list(prefix)
    }
}

fn slow_store() -> Arc<SlowPuts> {
    Arc::new(SlowPuts {
        inner: MemoryStore::new(),
        in_flight: AtomicUsize::new(0),
        most: AtomicUsize::new(0),
        at_checkpoint: Mutex::new(Vec::new()),
    })
}

/// lld on a fresh 32 MiB memory device of `seg_bytes` segments, uploading to `store`.
fn open(store: &Arc<SlowPuts>, seg_bytes: u64) -> (Arc<dyn Device>, SegmentStore, Lld) {
    let dev: Arc<dyn Device> = Arc::new(MemoryDevice::new(32 << 20));
    ldfs::lld::mkfs::mkfs(
        &*dev,
        &MkfsOptions {
            segment_bytes: seg_bytes,
            max_block_bytes: 32 << 10,
            reserved_segments: Some(4),
            fs_id: 2027,
            max_bytes: None,
            kept_pages: 0,
        },
    )
    .unwrap();
    let lease = take_lease(store.clone(), &TestClock::default(), false);
    let seg = SegmentStore::start(store.clone(), dev.clone(), lease, Default::default()).unwrap();
    let lld = Lld::open(
        dev.clone(),
        LldOptions {
            checkpoint_hook: Some(seg.hook()),
            segment_hook: Some(seg.segment_hook()),
            ..LldOptions::default()
        },
    )
    .unwrap();
    (dev, seg, lld)
}

#[test]
fn several_segment_puts_in_flight_and_the_checkpoint_after_them() {
    let seg_bytes = 128u64 << 10;
    assert_eq!(puts_in_flight(seg_bytes), UPLOAD_PUTS_IN_FLIGHT);
    const { assert!(UPLOAD_PUTS_IN_FLIGHT > 1) };
    // At most 32 MiB of segments in memory: one at a time from 32 MiB segments up.
    assert_eq!(puts_in_flight(32 << 20), 1);
    assert_eq!(puts_in_flight(64 << 20), 1);
    let store = slow_store();
    let (_dev, seg, lld) = open(&store, seg_bytes);
    let l = lld.create_list(None, ListHints::default()).unwrap();
    // 4 MiB: 32 segments, all named by one checkpoint.
    for i in 0..128u64 {
        lld.write(None, l, i, &[i as u8; 32 << 10]).unwrap();
    }
    lld.flush().unwrap();
    let t = std::time::Instant::now();
    lld.checkpoint_now().unwrap();
    seg.wait_uploaded(seg.announced(), Duration::from_secs(60))
        .unwrap();
    let took = t.elapsed();
    let put = seg.stats().segments_put;
    assert!(put >= 32, "{put} segment objects put");
    assert_eq!(
        store.most.load(Ordering::SeqCst),
        UPLOAD_PUTS_IN_FLIGHT,
        "segment puts in flight together"
    );
    // One at a time would take 30 ms each.
    assert!(
        took < Duration::from_millis(30) * put as u32 * 3 / 4,
        "{put} puts of 30 ms took {took:?}"
    );
    let at = store.at_checkpoint.lock().unwrap().clone();
    assert!(!at.is_empty());
    assert!(
        at.iter().all(|&n| n == 0),
        "a checkpoint put began with segment puts in flight: {at:?}"
    );
    lld.close().unwrap();
    seg.stop();
    let fresh: Arc<dyn Device> = Arc::new(MemoryDevice::new(32 << 20));
    restore(&store.inner, &*fresh).unwrap();
    let back = Lld::open(fresh, LldOptions::default()).unwrap();
    for i in 0..128u64 {
        assert_eq!(
            back.read(l, i).unwrap().as_deref(),
            Some(&[i as u8; 32 << 10][..]),
            "block {i} after a rebuild"
        );
    }
}

/// A checkpoint that comes while the segments the log left are being put ahead lets the
/// workers go on with those (it names them), rather than end one by one and start again for
/// the checkpoint (DESIGN "Upload throughput": about 50 ms of fewer puts in flight per
/// checkpoint in a stream): every segment left before it goes up ahead, the checkpoint puts
/// only the Active segment's prefix, and still after every segment put.
#[test]
fn a_checkpoint_lets_the_puts_ahead_of_it_go_on() {
    let seg_bytes = 128u64 << 10;
    let store = slow_store();
    let (_dev, seg, lld) = open(&store, seg_bytes);
    seg.wait_uploaded(seg.announced(), Duration::from_secs(60))
        .unwrap();
    let before = seg.stats();
    let l = lld.create_list(None, ListHints::default()).unwrap();
    // 4 MiB: 32 segments left at once, the checkpoint at once after (8 puts of 30 ms at least
    // before the queue is empty).
    for i in 0..128u64 {
        lld.write(None, l, i, &[i as u8; 32 << 10]).unwrap();
    }
    lld.flush().unwrap();
    let left = lld
        .segment_usage()
        .iter()
        .filter(|(_, u)| u.state == ldfs::lld::usage::SegmentState::Dirty)
        .count() as u64;
    // The puts ahead under way (a checkpoint coming to an idle uploader goes first, and puts
    // what it names itself).
    let t = std::time::Instant::now();
    while seg.stats().segments_put_ahead == before.segments_put_ahead {
        assert!(t.elapsed() < Duration::from_secs(30), "no put ahead");
        std::thread::sleep(Duration::from_millis(1));
    }
    lld.checkpoint_now().unwrap();
    seg.wait_uploaded(seg.announced(), Duration::from_secs(60))
        .unwrap();
    let after = seg.stats();
    let ahead = after.segments_put_ahead - before.segments_put_ahead;
    let by_checkpoint = (after.segments_put - before.segments_put) - ahead;
    assert!(left >= 32, "{left} segments left");
    assert!(
        ahead >= left,
        "{ahead} of the {left} segments left before the checkpoint were put ahead of it ({by_checkpoint} by it; {} checkpoint objects put, {} skipped)",
        after.checkpoints_put - before.checkpoints_put,
        after.checkpoints_skipped - before.checkpoints_skipped
    );
    assert!(
        by_checkpoint <= 1,
        "the checkpoint put {by_checkpoint} segment objects (the Active prefix only expected)"
    );
    let at = store.at_checkpoint.lock().unwrap().clone();
    assert!(
        at.iter().all(|&n| n == 0),
        "a checkpoint put began with segment puts in flight: {at:?}"
    );
    lld.close().unwrap();
    seg.stop();
}
