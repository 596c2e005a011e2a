//! Review 31's probes of the store-backed file system (issue 20 step 2: writer-unique keys,
//! the lease held by a mount, the fenced uploader). Each probe fails while the defect its doc
//! comment names is there. `#[ignore]` marks an open defect:
//! `cargo test --release -p ldfs --test review31_probes -- --ignored` runs them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use ldfs::device::{Device, MemoryDevice};
use ldfs::ld::{ListHints, ListId, LogicalDisk};
use ldfs::lld::layout::MkfsOptions;
use ldfs::lld::{Lld, LldOptions};
use ldfs::store::lease::LeaseCheck;
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
        fs_id: 3131,
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

fn unavailable(op: StoreOp, key: &str) -> StoreError {
    StoreError::Unavailable {
        op,
        key: key.to_string(),
        reason: "probe: no answer".into(),
    }
}

/// A memory store with faults the probes switch on by hand: a lease put that lands but loses
/// its answer, a lease delete that fails, and checkpoint puts held in flight until released.
#[derive(Default)]
struct Probe {
    inner: MemoryStore,
    lease_put_answer_lost: AtomicBool,
    lease_delete_fails: AtomicBool,
    hold_ckpt: AtomicBool,
    /// (puts waiting, released)
    gate: Mutex<(usize, bool)>,
    gate_cv: Condvar,
}

impl Probe {
    fn wait_held(&self) {
        let g = self.gate.lock().unwrap();
        let (g, t) = self
            .gate_cv
            .wait_timeout_while(g, Duration::from_secs(30), |g| g.0 == 0)
            .unwrap();
        assert!(!t.timed_out() || g.0 > 0, "no checkpoint put was held");
    }
    fn release_held(&self) {
        self.gate.lock().unwrap().1 = true;
        self.gate_cv.notify_all();
    }
}

impl ObjectStore for Probe {
    fn put(&self, key: &str, bytes: &[u8]) -> StoreResult<()> {
        self.inner.put(key, bytes)
    }
    fn put_if_absent(&self, key: &str, bytes: &[u8]) -> StoreResult<PutOutcome> {
        if key.starts_with("ckpt/") && self.hold_ckpt.load(Ordering::SeqCst) {
            // In flight: the request was sent while the writer held its lease and lands
            // when the network lets it (a slow proxy, a gateway queue, clock skew).
            let mut g = self.gate.lock().unwrap();
            g.0 += 1;
            self.gate_cv.notify_all();
            while !g.1 {
                g = self.gate_cv.wait(g).unwrap();
            }
            drop(g);
            return self.inner.put_if_absent(key, bytes);
        }
        let r = self.inner.put_if_absent(key, bytes);
        if key.starts_with("lease/") && self.lease_put_answer_lost.swap(false, Ordering::SeqCst) {
            r?;
            return Err(unavailable(StoreOp::PutIfAbsent, key));
        }
        r
    }
    fn get(&self, key: &str) -> StoreResult<Vec<u8>> {
        self.inner.get(key)
    }
    fn get_range(&self, key: &str, offset: u64, len: u64) -> StoreResult<Vec<u8>> {
        self.inner.get_range(key, offset, len)
    }
    fn delete(&self, key: &str) -> StoreResult<()> {
        if key.starts_with("lease/") && self.lease_delete_fails.swap(false, Ordering::SeqCst) {
            return Err(unavailable(StoreOp::Delete, key));
        }
        self.inner.delete(key)
    }
    fn list(&self, prefix: &str) -> StoreResult<Vec<ObjectInfo>> {
        self.inner.list(prefix)
    }
}

/// Finding 1 (medium; fixed on review31): a renewal whose put landed but whose answer was lost (the transient
/// failure S3 clients see most) makes the next renewal put the same generation with another
/// expiry; `put_next` compares whole bytes, finds them different and calls the lease lost.
/// The mount turns read-only and stops uploading for good although nobody else holds the lease.
#[test]
fn a_renewal_whose_answer_was_lost_keeps_the_lease() {
    let store = Arc::new(Probe::default());
    let clock = TestClock::default();
    let lease = take_lease(store.clone(), &clock, false);
    store.lease_put_answer_lost.store(true, Ordering::SeqCst);
    assert!(
        lease.renew_now().is_err(),
        "the probe's lost answer must fail the renewal"
    );
    clock.advance(5);
    let r = lease.renew_now();
    assert!(
        r.is_ok(),
        "the next renewal found its own landed lease object and called the lease lost: {r:?}"
    );
    assert_eq!(lease.check(), Ok(()));
}

/// Finding 1, second path: the renewal's put landed, then deleting generation - 2 failed
/// (transient); `renew` returns the delete's error, the keeper never records the new
/// generation, and the next renewal collides with its own object: lease lost.
#[test]
fn a_renewal_whose_cleanup_delete_failed_keeps_the_lease() {
    let store = Arc::new(Probe::default());
    let clock = TestClock::default();
    let lease = take_lease(store.clone(), &clock, false);
    clock.advance(5);
    lease.renew_now().expect("generation 2");
    store.lease_delete_fails.store(true, Ordering::SeqCst);
    clock.advance(5);
    let _ = lease.renew_now(); // generation 3 lands; deleting generation 1 fails
    clock.advance(5);
    let r = lease.renew_now();
    assert!(
        r.is_ok(),
        "a failed clean-up delete turned into a lost lease: {r:?}"
    );
    assert!(!matches!(lease.check(), Err(LeaseCheck::Lost(_))));
}

/// Writes `n` values into a fresh list and uploads a checkpoint; returns the list.
fn write_and_upload(lld: &Lld, seg: &SegmentStore, byte: u8, n: u64) -> ListId {
    let l = lld.create_list(None, ListHints::default()).unwrap();
    for i in 0..n {
        lld.write(None, l, i, &[byte; 9000]).unwrap();
    }
    lld.checkpoint_now().unwrap();
    seg.wait_uploaded(seg.announced(), Duration::from_secs(30))
        .unwrap();
    l
}

/// Finding 2 (medium; fixed on review31): `sweep_kept` (run by every `SegmentStore::start`) keeps "the newest
/// two" by counting every key under `ckpt/`, parsable or not. Two foreign objects there that
/// sort after the checkpoint keys (a README, a `.bak` copy, another tool's marker) make it
/// delete every real checkpoint object and then every segment object: the file system is gone.
#[test]
fn foreign_objects_under_ckpt_do_not_get_the_file_system_deleted() {
    let store = Arc::new(MemoryStore::new());
    let dev: Arc<dyn Device> = Arc::new(MemoryDevice::new(DEV_BYTES));
    ldfs::lld::mkfs::mkfs(&*dev, &mkfs_opts()).unwrap();
    let clock = TestClock::default();
    let lease = take_lease(store.clone(), &clock, false);
    let seg = SegmentStore::start(store.clone(), dev.clone(), lease.clone(), fast()).unwrap();
    let lld = open(seg.device(), &seg);
    let l = write_and_upload(&lld, &seg, 7, 20);
    lld.close().unwrap();
    seg.wait_uploaded(seg.announced(), Duration::from_secs(30))
        .unwrap();
    drop(seg);
    lease.release().unwrap();
    store.put("ckpt/README", b"not ldfs's").unwrap();
    store.put("ckpt/notes.txt", b"not ldfs's").unwrap();
    // The next mount's start sweeps.
    let lease2 = take_lease(store.clone(), &clock, false);
    let dev2: Arc<dyn Device> = Arc::new(MemoryDevice::new(DEV_BYTES));
    restore(&*store, &*dev2).expect("restore before the sweep");
    let seg2 = SegmentStore::start(store.clone(), dev2, lease2, fast()).unwrap();
    drop(seg2);
    let dev3: Arc<dyn Device> = Arc::new(MemoryDevice::new(DEV_BYTES));
    let r = restore(&*store, &*dev3);
    assert!(
        r.is_ok(),
        "after a start's sweep the store no longer restores: {r:?}; keys left: {:?}",
        store.keys()
    );
    let lld3 = Lld::open(dev3, LldOptions::default()).unwrap();
    assert_eq!(lld3.read(l, 19).unwrap().as_deref(), Some(&[7u8; 9000][..]));
}

/// Finding 3 (medium): a stale writer's checkpoint put that lands after the next writer
/// started (a request longer than half the lease, a lease= shorter than twice the request
/// timeout, clock skew): the new writer's start swept the segment objects it names (nothing
/// named them yet), and it sorts newest until the new writer uploads. Every restore then
/// fails on a missing segment object: a machine lost now cannot get the file system back,
/// though a complete older checkpoint is in the store.
#[test]
fn a_stale_writers_late_checkpoint_never_leaves_the_store_unrestorable() {
    let store = Arc::new(Probe::default());
    let clock = TestClock::default();
    let dev_a: Arc<dyn Device> = Arc::new(MemoryDevice::new(DEV_BYTES));
    ldfs::lld::mkfs::mkfs(&*dev_a, &mkfs_opts()).unwrap();
    let lease_a = take_lease(store.clone(), &clock, false);
    let seg_a = SegmentStore::start(store.clone(), dev_a.clone(), lease_a.clone(), fast()).unwrap();
    let lld_a = open(seg_a.device(), &seg_a);
    let l1 = write_and_upload(&lld_a, &seg_a, 1, 30);
    // A's next checkpoint: segments put, its checkpoint put sent while A held the lease and
    // held in flight.
    store.hold_ckpt.store(true, Ordering::SeqCst);
    let l2 = lld_a.create_list(None, ListHints::default()).unwrap();
    for i in 0..30 {
        lld_a.write(None, l2, i, &[2u8; 9000]).unwrap();
    }
    lld_a.checkpoint_now().unwrap();
    store.wait_held();
    // A is cut off: no more renewals; its lease expires; B takes over from the store.
    lease_a.abandon();
    clock.advance(61);
    let lease_b = take_lease(store.clone(), &clock, true);
    let dev_b: Arc<dyn Device> = Arc::new(MemoryDevice::new(DEV_BYTES));
    restore(&*store, &*dev_b).unwrap();
    let seg_b = SegmentStore::start(store.clone(), dev_b, lease_b.clone(), fast()).unwrap();
    // A's put lands now.
    store.hold_ckpt.store(false, Ordering::SeqCst);
    store.release_held();
    std::thread::sleep(Duration::from_millis(200));
    // B dies before its first upload.
    drop(seg_b);
    lease_b.abandon();
    // A third machine, an empty cache.
    let dev_c: Arc<dyn Device> = Arc::new(MemoryDevice::new(DEV_BYTES));
    let r = restore(&store.inner, &*dev_c);
    assert!(
        r.is_ok(),
        "the store no longer restores after a stale writer's late checkpoint put: {r:?}; \
         keys: {:?}",
        store.inner.keys()
    );
    let lld_c = Lld::open(dev_c, LldOptions::default()).unwrap();
    assert_eq!(
        lld_c.read(l1, 29).unwrap().as_deref(),
        Some(&[1u8; 9000][..])
    );
    seg_a.stop();
    drop(lld_a);
}

/// Finding 4 (medium; high once `ldfs mkfs` sets KEPT_TABLE by default): the checkpoint
/// object assumes a slot spans the geometry's full `checkpoint_pages`
/// (`encode_checkpoint_object` asserts it, `decode_checkpoint_object` requires it). A
/// resizable image (`ldfs mkfs --store ... --max-size` above `--size`) writes slots of the
/// pages its segment count needs: the uploader panics on its first checkpoint, nothing is
/// ever uploaded.
#[test]
fn a_resizable_image_uploads_and_restores() {
    let store = Arc::new(MemoryStore::new());
    let dev: Arc<dyn Device> = Arc::new(MemoryDevice::new(DEV_BYTES));
    let g = ldfs::lld::mkfs::mkfs(
        &*dev,
        &MkfsOptions {
            max_bytes: Some(DEV_BYTES * 16),
            ..mkfs_opts()
        },
    )
    .unwrap();
    assert!(
        g.resizable(),
        "the probe needs slots shorter than checkpoint_pages"
    );
    let lease = take_lease(store.clone(), &TestClock::default(), false);
    let seg = SegmentStore::start(store.clone(), dev.clone(), lease, fast()).unwrap();
    let lld = open(seg.device(), &seg);
    let l = lld.create_list(None, ListHints::default()).unwrap();
    lld.write(None, l, 0, &[9u8; 5000]).unwrap();
    lld.checkpoint_now().unwrap();
    let r = seg.wait_uploaded(seg.announced(), Duration::from_secs(30));
    assert!(
        r.is_ok(),
        "a resizable image's checkpoint did not upload: {r:?}"
    );
    let dev2: Arc<dyn Device> = Arc::new(MemoryDevice::new(DEV_BYTES));
    restore(&*store, &*dev2).unwrap();
    let lld2 = Lld::open(dev2, LldOptions::default()).unwrap();
    assert_eq!(lld2.read(l, 0).unwrap().as_deref(), Some(&[9u8; 5000][..]));
}

/// Finding 0 (high: split brain; fixed on review31): only the newest two lease generations are kept, so a
/// holder cut off from the store for longer than the lease, whose taker has renewed twice
/// since, renews into a generation the taker already deleted: `put_if_absent` of its next
/// generation succeeds, and it believes it holds the lease again (fresh expiry, `check`
/// passes) until its next renewal, a fifth of the duration later. Meanwhile its uploader
/// (a backlog from the partition waiting) puts checkpoints and deletes what its own newest two
/// no longer name: segment objects the taker's checkpoints name.
#[test]
fn a_holder_back_from_a_partition_never_renews_into_a_deleted_generation() {
    let store = Arc::new(MemoryStore::new());
    let clock = TestClock::default();
    let a = take_lease(store.clone(), &clock, false);
    // A is cut off; its lease expires; B takes over and renews as usual.
    clock.advance(61);
    let b = take_lease(store.clone(), &clock, true);
    clock.advance(12);
    b.renew_now().unwrap();
    clock.advance(12);
    b.renew_now().unwrap();
    // A's network comes back.
    let r = a.renew_now();
    assert!(
        r.is_err() && matches!(a.check(), Err(LeaseCheck::Lost(_))),
        "A renewed ({r:?}, check {:?}) while B holds the lease (generation {}): two writers",
        a.check(),
        b.current().0
    );
}

/// Finding 10 (low): `SegmentStore::start` never compares the cache's fs id with the store's
/// checkpoint objects. `ldfs mkfs --store` checks the prefix is empty before it takes the
/// lease, so two of them at once on one prefix both pass; the second uploads its own file
/// system over the first's (its checkpoint sorts newest; two uploads later the first's
/// objects are swept). Any caller that skips `prepare_cache` does the same.
#[test]
fn a_start_on_another_file_systems_cache_is_refused() {
    let store = Arc::new(MemoryStore::new());
    let clock = TestClock::default();
    let dev: Arc<dyn Device> = Arc::new(MemoryDevice::new(DEV_BYTES));
    ldfs::lld::mkfs::mkfs(&*dev, &mkfs_opts()).unwrap();
    let lease = take_lease(store.clone(), &clock, false);
    let seg = SegmentStore::start(store.clone(), dev.clone(), lease.clone(), fast()).unwrap();
    let lld = open(seg.device(), &seg);
    write_and_upload(&lld, &seg, 5, 4);
    drop(seg);
    lease.release().unwrap();
    // Another file system's cache (the second mkfs of a race).
    let other: Arc<dyn Device> = Arc::new(MemoryDevice::new(DEV_BYTES));
    ldfs::lld::mkfs::mkfs(
        &*other,
        &MkfsOptions {
            fs_id: 4242,
            ..mkfs_opts()
        },
    )
    .unwrap();
    let lease2 = take_lease(store.clone(), &clock, false);
    let r = SegmentStore::start(store.clone(), other, lease2, fast());
    assert!(
        r.is_err(),
        "a cache of fs 4242 started uploading into a store holding fs 3131"
    );
    drop(lld);
}

/// A memory device whose `fail_at`-th write (from 0) and every later one fail: a rebuild
/// killed part-way.
struct DyingDevice {
    inner: MemoryDevice,
    writes: std::sync::atomic::AtomicU64,
    fail_at: u64,
}

impl Device for DyingDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), ldfs::device::DeviceError> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), ldfs::device::DeviceError> {
        if self.writes.fetch_add(1, Ordering::SeqCst) >= self.fail_at {
            return Err(ldfs::device::DeviceError::Io {
                op: ldfs::device::DeviceOp::Write,
                offset,
                len: buf.len() as u64,
                source: std::io::Error::other("probe: killed mid-rebuild"),
            });
        }
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> Result<(), ldfs::device::DeviceError> {
        self.inner.flush()
    }
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
}

/// Finding 11 (low; fixed on review31): `restore` writes the superblock before the checkpoint slot. A rebuild
/// killed between the two (kill -9, a full disk) leaves a cache with this file system's
/// superblock and no valid slot: the next mount no longer sees an empty cache to rebuild but
/// "the same file system", refused as a branch (no note yet) or, with an old note, opened and
/// failing. Written last, the superblock makes a partial rebuild an empty cache again.
#[test]
fn a_rebuild_killed_part_way_leaves_a_cache_that_is_rebuilt_again() {
    let store = Arc::new(MemoryStore::new());
    let dev: Arc<dyn Device> = Arc::new(MemoryDevice::new(DEV_BYTES));
    ldfs::lld::mkfs::mkfs(&*dev, &mkfs_opts()).unwrap();
    let lease = take_lease(store.clone(), &TestClock::default(), false);
    let seg = SegmentStore::start(store.clone(), dev, lease, fast()).unwrap();
    let lld = open(seg.device(), &seg);
    write_and_upload(&lld, &seg, 6, 30);
    let mut fail_at = 0;
    loop {
        let d = DyingDevice {
            inner: MemoryDevice::new(DEV_BYTES),
            writes: Default::default(),
            fail_at,
        };
        if restore(&*store, &d).is_ok() {
            break;
        }
        let mut page = vec![0u8; ldfs::lld::PAGE_BYTES];
        d.inner.read_at(&mut page, 0).unwrap();
        assert!(
            page.iter().all(|&b| b == 0),
            "a rebuild killed at its write {fail_at} left a superblock on the cache"
        );
        fail_at += 1;
    }
    assert!(fail_at > 2, "the probe killed no rebuild");
}
