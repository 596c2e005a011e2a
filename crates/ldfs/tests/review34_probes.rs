//! Review 34's probes of the bounded store cache (issue 20 step C) as merged with main
//! (9b15a29). Each probe fails while the defect its doc comment names is there. `#[ignore]`
//! marks an open defect: `cargo test --release -p ldfs --test review34_probes -- --ignored`
//! runs them.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use ldfs::device::{Device, DeviceError, MemoryDevice};
use ldfs::ld::{ListHints, ListId, LogicalDisk};
use ldfs::lld::layout::{Geometry, MkfsOptions};
use ldfs::lld::usage::SegmentState;
use ldfs::lld::{Lld, LldOptions, SegmentId, PAGE_BYTES};
use ldfs::store::cache::{read_map, Cache, CacheDevice};
use ldfs::store::segments::{parse_checkpoint_key, SegmentEntry};
use ldfs::store::{
    restore, CacheConfig, MemoryStore, ObjectInfo, ObjectStore, PutOutcome, SegmentStore,
    StoreResult,
};
use ldfs::testing::store::{take_lease, TestClock};

const DEV_BYTES: u64 = 24 << 20;

fn mkfs_opts() -> MkfsOptions {
    MkfsOptions {
        segment_bytes: 128 << 10,
        max_block_bytes: 32 << 10,
        reserved_segments: Some(4),
        fs_id: 3434,
        max_bytes: None,
        kept_pages: 0,
    }
}

use ldfs::testing::store::fast_backoff as fast;

fn geometry(dev: &dyn Device) -> Geometry {
    let mut sb = vec![0u8; PAGE_BYTES];
    dev.read_at(&mut sb, 0).unwrap();
    Geometry::decode_superblock(&sb, 0, dev.size_bytes()).unwrap()
}

/// A memory device whose next flush, once armed, waits for `go` (a slow fsync of the cache
/// device inside the residency map's write).
#[derive(Default)]
struct GatedFlush {
    inner: Option<MemoryDevice>,
    armed: AtomicBool,
    /// (a flush is waiting, go)
    gate: Mutex<(bool, bool)>,
    cv: Condvar,
}

impl GatedFlush {
    fn dev(&self) -> &MemoryDevice {
        self.inner.as_ref().unwrap()
    }
    fn wait_entered(&self) {
        let g = self.gate.lock().unwrap();
        let (g, _) = self
            .cv
            .wait_timeout_while(g, Duration::from_secs(30), |g| !g.0)
            .unwrap();
        assert!(g.0, "no flush of the cache device began");
    }
    fn go(&self) {
        self.gate.lock().unwrap().1 = true;
        self.cv.notify_all();
    }
}

impl Device for GatedFlush {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), DeviceError> {
        self.dev().read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), DeviceError> {
        self.dev().write_at(buf, offset)
    }
    fn flush(&self) -> Result<(), DeviceError> {
        if self.armed.swap(false, Ordering::SeqCst) {
            let mut g = self.gate.lock().unwrap();
            g.0 = true;
            self.cv.notify_all();
            while !g.1 {
                g = self.cv.wait(g).unwrap();
            }
        }
        self.dev().flush()
    }
    fn size_bytes(&self) -> u64 {
        self.dev().size_bytes()
    }
    fn discard(&self, offset: u64, len: u64) -> Result<bool, DeviceError> {
        self.dev().discard(offset, len)
    }
}

/// Finding 1 (medium, crash-critical; fixed on review34): `CacheDevice::write_at` writes the
/// residency map first only when the *durable* map lists the segment (`durable[s]`), but `durable`
/// is set at the end of a map write. A segment chosen for eviction (`Evicting`) is in the snapshot
/// of a map write in flight (between its snapshot and its rename: the device flush and three
/// fsyncs); a checkpoint releases it and lld writes it meanwhile: the write sees `durable[s] ==
/// None`, writes no map and goes to the device; the map write then lands listing the segment with
/// its old object. The eviction skips the punch (no longer `Evicting`), but the durable map now
/// names the old object for new bytes until the next write of that segment or the next map write. A
/// power cut in that window, with the segment Dirty in the cache's slot (written whole at once, as
/// a cleaner's or a large write's batch may) and its old object still kept: the restart takes it as
/// evicted and the first read fetches the old object over the new bytes. Fix: `listed |=
/// matches!(st.seg[s], Seg::Evicting(_))` in `write_at` (its persist then waits for the in-flight
/// one under `persist_lock` and writes a map without it).
#[test]
fn a_write_during_an_evictions_map_write_never_leaves_the_map_naming_the_old_object() {
    let gated = Arc::new(GatedFlush {
        inner: Some(MemoryDevice::new(8 << 20)),
        ..Default::default()
    });
    ldfs::lld::mkfs::mkfs(gated.dev(), &mkfs_opts()).unwrap();
    let geo = geometry(gated.dev());
    let seg_bytes = geo.segment_bytes() as usize;
    let s = 5u32;
    let addr = geo.page_addr(SegmentId(s), 0);
    let old = vec![0xAAu8; seg_bytes];
    let new = vec![0x55u8; seg_bytes];
    gated.dev().write_at(&old, addr).unwrap();
    let store = Arc::new(MemoryStore::new());
    let e = SegmentEntry {
        segment: s,
        pages: geo.segment_pages,
        first_seq: 7,
        writer: 1,
        crc: crc32c::crc32c(&old),
    };
    store.put(&e.key(), &old).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let map = dir.path().join("cache.ldfs-resident");
    let cfg = CacheConfig {
        map_path: map.clone(),
        bound_bytes: geo.segment_bytes(),
        fetch_patience: Duration::from_millis(200),
    };
    let dev: Arc<dyn Device> = gated.clone();
    let cache = Cache::open(
        dev.clone(),
        store.clone(),
        geo,
        cfg.clone(),
        None,
        &BTreeSet::new(),
    )
    .unwrap();
    // The eviction's map write stops in its flush, the segment in its snapshot.
    gated.armed.store(true, Ordering::SeqCst);
    cache.set_evictable(&[e]);
    gated.wait_entered();
    // A durable checkpoint releases the segment; lld writes it whole.
    cache.note_released(&[SegmentId(s)]);
    let c2 = cache.clone();
    let new2 = new.clone();
    let writer = std::thread::spawn(move || CacheDevice(c2).write_at(&new2, addr));
    // Fixed, the write waits for the map write in flight; give it time to go by otherwise.
    let t = Instant::now();
    while !writer.is_finished() && t.elapsed() < Duration::from_millis(500) {
        std::thread::sleep(Duration::from_millis(10));
    }
    gated.go();
    writer.join().unwrap().unwrap();
    cache.shrink().unwrap();
    // The eviction thread's map write ends.
    cache.stop();
    drop(cache);
    let listed = read_map(&map, &geo).unwrap().unwrap_or_default();
    // A power cut now: the restart, with the segment Dirty in the slot and its old object
    // kept, reads it.
    let mut states = vec![SegmentState::Clean; geo.segment_count as usize];
    states[s as usize] = SegmentState::Dirty;
    let kept: BTreeSet<String> = [e.key()].into_iter().collect();
    let cache = Cache::open(dev, store, geo, cfg, Some(&states), &kept).unwrap();
    let mut got = vec![0u8; seg_bytes];
    CacheDevice(cache.clone()).read_at(&mut got, addr).unwrap();
    cache.stop();
    assert!(
        got == new,
        "segment {s} was written (0x55) after it was chosen for eviction, and the durable map \
         lists it with its old object ({listed:?}): the restart fetched the old bytes (0x{:02x}) \
         over the new",
        got[0]
    );
}

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

/// A memory store whose first checkpoint object get, once armed, waits for `go` after reading
/// it (a rebuild that chose its checkpoint, then downloads slowly).
#[derive(Default)]
struct HoldAfterChoice {
    inner: Arc<MemoryStore>,
    armed: AtomicBool,
    /// (a get is waiting, go)
    gate: Mutex<(bool, bool)>,
    cv: Condvar,
}

impl ObjectStore for HoldAfterChoice {
    fn put(&self, key: &str, bytes: &[u8]) -> StoreResult<()> {
        self.inner.put(key, bytes)
    }
    fn put_if_absent(&self, key: &str, bytes: &[u8]) -> StoreResult<PutOutcome> {
        self.inner.put_if_absent(key, bytes)
    }
    fn get(&self, key: &str) -> StoreResult<Vec<u8>> {
        let r = self.inner.get(key);
        if key.starts_with("ckpt/") && self.armed.swap(false, Ordering::SeqCst) {
            let mut g = self.gate.lock().unwrap();
            g.0 = true;
            self.cv.notify_all();
            while !g.1 {
                g = self.cv.wait(g).unwrap();
            }
        }
        r
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

/// Finding 2 (medium; fixed on review34; the cause of review 32's probe failing under load):
/// `restore` (every read-only mount's rebuild) chooses the newest complete checkpoint object
/// and then downloads the segment objects it names, one by one. A writer uploading meanwhile
/// deletes the objects of a checkpoint two uploads older (segment objects first, then the
/// checkpoint object): a download that spans two of the writer's upload windows finds one of
/// its objects gone and the rebuild fails with "not found", though the store is whole. A
/// read-only mount of a file system written to every few seconds whose download takes longer
/// than two windows never mounts. Review 32's probe
/// `a_rebuild_beside_an_uploading_writer_restores_the_file_system` hits it when the reader is
/// slow: since review 33 finding 1 a checkpoint counts as uploaded right after its put, before
/// the deletes behind it, so `wait_uploaded` returns while upload 3 deletes checkpoint 1's
/// objects, and the reader (its listing taken before uploads 2 and 3) may still read
/// checkpoint 1's object and then miss its segments. Fix: a segment object found missing
/// mid-download makes `restore` choose again (from a fresh listing; segments already written
/// under the same key need not be fetched again), a few times before it fails.
#[test]
fn a_rebuild_whose_checkpoint_is_superseded_twice_mid_download_restores() {
    let probe = Arc::new(HoldAfterChoice::default());
    let store: Arc<dyn ObjectStore> = probe.inner.clone();
    let clock = TestClock::default();
    let dev: Arc<dyn Device> = Arc::new(MemoryDevice::new(DEV_BYTES));
    ldfs::lld::mkfs::mkfs(&*dev, &mkfs_opts()).unwrap();
    let lease = take_lease(store.clone(), &clock, false);
    let seg = SegmentStore::start(store.clone(), dev, lease, fast()).unwrap();
    let lld = open(seg.device(), &seg);
    let l1 = write_and_upload(&lld, &seg, 1, 20);
    let chosen = probe
        .inner
        .keys()
        .into_iter()
        .filter(|k| parse_checkpoint_key(k).is_some())
        .max()
        .unwrap();
    probe.armed.store(true, Ordering::SeqCst);
    let p2 = probe.clone();
    let reader = std::thread::spawn(move || {
        let dev_r: Arc<dyn Device> = Arc::new(MemoryDevice::new(DEV_BYTES));
        restore(&*p2, &*dev_r).map(|r| (r, dev_r))
    });
    {
        let g = probe.gate.lock().unwrap();
        let (g, _) = probe
            .cv
            .wait_timeout_while(g, Duration::from_secs(30), |g| !g.0)
            .unwrap();
        assert!(g.0, "the rebuild read no checkpoint object");
    }
    // Two upload windows of the writer while the reader downloads: the second deletes what
    // only the chosen checkpoint named (its segment objects, then itself).
    write_and_upload(&lld, &seg, 2, 20);
    write_and_upload(&lld, &seg, 3, 20);
    let t = Instant::now();
    while probe.inner.keys().contains(&chosen) && t.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(
        !probe.inner.keys().contains(&chosen),
        "the writer never deleted {chosen}"
    );
    probe.gate.lock().unwrap().1 = true;
    probe.cv.notify_all();
    let r = reader.join().unwrap();
    lld.close().unwrap();
    seg.stop();
    let (_, dev_r) = r.unwrap_or_else(|e| {
        panic!(
            "a rebuild beside a writer failed though the store is whole: {e}; keys: {:?}",
            probe.inner.keys()
        )
    });
    let l = Lld::open(dev_r, LldOptions::default()).unwrap();
    assert_eq!(l.read(l1, 19).unwrap().as_deref(), Some(&[1u8; 9000][..]));
}

/// Finding 1b (medium, crash-critical; fixed on review34; the same race in `Cache::before_delete`):
/// the uploader settles a segment before it deletes the object an eviction in flight names
/// (`Evicting`: a checkpoint acknowledged meanwhile no longer names that object, so it is
/// orphaned): the segment is fetched back (its bytes were still there) and `before_delete` writes a
/// map only if the *durable* map lists it, which it does not yet. The object is deleted; the map
/// write in flight then lands naming it. A power cut before the next map write: the restart finds a
/// Dirty segment listed with an object no kept checkpoint names, tries to fetch it back before the
/// sweep, and the mount fails (the object is gone), though the cache holds every byte. Fix:
/// `before_delete` writes the map whenever it found the segment `Evicted` or `Evicting` (its
/// persist waits for the one in flight).
#[test]
fn a_delete_during_an_evictions_map_write_never_leaves_the_map_naming_the_deleted_object() {
    let gated = Arc::new(GatedFlush {
        inner: Some(MemoryDevice::new(8 << 20)),
        ..Default::default()
    });
    ldfs::lld::mkfs::mkfs(gated.dev(), &mkfs_opts()).unwrap();
    let geo = geometry(gated.dev());
    let seg_bytes = geo.segment_bytes() as usize;
    let s = 5u32;
    let addr = geo.page_addr(SegmentId(s), 0);
    let old = vec![0xAAu8; seg_bytes];
    gated.dev().write_at(&old, addr).unwrap();
    let store = Arc::new(MemoryStore::new());
    let e = SegmentEntry {
        segment: s,
        pages: geo.segment_pages,
        first_seq: 7,
        writer: 1,
        crc: crc32c::crc32c(&old),
    };
    store.put(&e.key(), &old).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let map = dir.path().join("cache.ldfs-resident");
    let cfg = CacheConfig {
        map_path: map.clone(),
        bound_bytes: geo.segment_bytes(),
        fetch_patience: Duration::from_millis(200),
    };
    let dev: Arc<dyn Device> = gated.clone();
    let cache = Cache::open(
        dev.clone(),
        store.clone(),
        geo,
        cfg.clone(),
        None,
        &BTreeSet::new(),
    )
    .unwrap();
    gated.armed.store(true, Ordering::SeqCst);
    cache.set_evictable(&[e]);
    gated.wait_entered();
    // A newer checkpoint object is acknowledged that names the segment otherwise; the
    // uploader deletes the object the eviction names.
    cache.set_evictable(&[]);
    let c2 = cache.clone();
    let key = e.key();
    let deleter = std::thread::spawn(move || c2.before_delete(&key));
    let t = Instant::now();
    while !deleter.is_finished() && t.elapsed() < Duration::from_millis(500) {
        std::thread::sleep(Duration::from_millis(10));
    }
    let settled = deleter.is_finished();
    gated.go();
    deleter.join().unwrap().unwrap();
    store.delete(&e.key()).unwrap();
    cache.stop();
    drop(cache);
    let listed = read_map(&map, &geo).unwrap().unwrap_or_default();
    // A power cut now.
    let mut states = vec![SegmentState::Clean; geo.segment_count as usize];
    states[s as usize] = SegmentState::Dirty;
    let reopened = Cache::open(dev, store, geo, cfg, Some(&states), &BTreeSet::new());
    let got = reopened.as_ref().ok().map(|c| {
        let mut got = vec![0u8; seg_bytes];
        let r = CacheDevice(c.clone()).read_at(&mut got, addr);
        c.stop();
        r.map(|()| got[0])
    });
    assert!(
        matches!(got, Some(Ok(0xAA))),
        "segment {s}'s object was deleted after the segment was settled (settled before the \
         map write ended: {settled}); the durable map lists {listed:?}; the restart: {:?}, \
         read {got:?}",
        reopened.as_ref().err()
    );
}

/// A memory device whose first read of checkpoint slot 0, once armed, fails (a transient I/O
/// error: a cable, a controller reset, an NBD reconnect).
struct FailSlotReadOnce {
    inner: Arc<MemoryDevice>,
    slot0: u64,
    armed: AtomicBool,
}

impl Device for FailSlotReadOnce {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), DeviceError> {
        if offset == self.slot0 && self.armed.swap(false, Ordering::SeqCst) {
            return Err(DeviceError::Io {
                op: ldfs::device::DeviceOp::Read,
                offset,
                len: buf.len() as u64,
                source: std::io::Error::other("injected: one failed read of slot 0"),
            });
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

/// Finding 4 (medium, crash-critical: silent loss of the residency; fixed on review34):
/// `SegmentStore::start_cached` takes the states of the cache's newest slot with
/// `newest_slot_states`, which gives `None` for an I/O error reading a slot
/// (`read_checkpoints(..).ok()?`) as for no valid slot; and `Cache::open` with `None` takes every
/// segment its residency map lists for one lld reads nothing of (not Dirty) and writes the map
/// without them. One transient read error at start so wipes the map for good: lld (whose own read
/// of the slot then succeeds) reads the holes of evicted segments as data (zeros), and the
/// uploader, finding no evicted entry, reads page 0 of those segments (zeros: not known) and would
/// put zeros for them in the next upload, then delete the good objects two uploads later. Fix:
/// start fails on an error reading the slots (propagate it instead of `.ok()?`), and `Cache::open`
/// with `states == None` and a non-empty map refuses (or keeps every entry) rather than dropping
/// them.
#[test]
fn a_failed_slot_read_at_start_never_wipes_the_residency_map() {
    let mem = Arc::new(MemoryDevice::new(DEV_BYTES));
    ldfs::lld::mkfs::mkfs(&*mem, &mkfs_opts()).unwrap();
    let geo = geometry(&*mem);
    let store = Arc::new(MemoryStore::new());
    let clock = TestClock::default();
    let dir = tempfile::tempdir().unwrap();
    let cfg = CacheConfig {
        map_path: dir.path().join("cache.ldfs-resident"),
        bound_bytes: 8 * geo.segment_bytes(),
        fetch_patience: Duration::from_millis(200),
    };
    let open_lld = |seg: &SegmentStore| {
        Lld::open(
            seg.device(),
            LldOptions {
                checkpoint_hook: Some(seg.hook()),
                segment_hook: Some(seg.segment_hook()),
                discard: true,
                ..LldOptions::default()
            },
        )
    };
    let lease = take_lease(store.clone(), &clock, false);
    let seg = SegmentStore::start_cached(
        store.clone(),
        mem.clone(),
        lease.clone(),
        fast(),
        Some(cfg.clone()),
    )
    .unwrap();
    let lld = open_lld(&seg).unwrap();
    let l1 = write_and_upload(&lld, &seg, 1, 150);
    seg.shrink_cache().unwrap();
    let l2 = write_and_upload(&lld, &seg, 2, 150);
    seg.shrink_cache().unwrap();
    lld.close().unwrap();
    seg.stop();
    drop(lld);
    drop(seg);
    let listed = read_map(&cfg.map_path, &geo).unwrap().unwrap_or_default();
    assert!(!listed.is_empty(), "the cache evicted nothing");
    lease.abandon();
    clock.advance(61);
    // The restart: its first read of slot 0 fails once.
    let flaky = Arc::new(FailSlotReadOnce {
        inner: mem.clone(),
        slot0: geo.slot_addr(0),
        armed: AtomicBool::new(true),
    });
    let lease2 = take_lease(store.clone(), &clock, true);
    let started = SegmentStore::start_cached(
        store.clone(),
        flaky,
        lease2.clone(),
        fast(),
        Some(cfg.clone()),
    );
    let after = read_map(&cfg.map_path, &geo).unwrap().unwrap_or_default();
    // Refusing to start is fine; starting on a map that lost its entries is not.
    let seg = match started {
        Ok(seg) => seg,
        Err(e) => {
            eprintln!("the start failed: {e}; started again");
            SegmentStore::start_cached(store.clone(), mem.clone(), lease2, fast(), Some(cfg))
                .unwrap()
        }
    };
    let read_back = open_lld(&seg).map_err(|e| e.to_string()).map(|lld| {
        let mut bad = 0;
        for (l, b) in [(l1, 1u8), (l2, 2u8)] {
            for i in 0..150 {
                if lld.read(l, i).ok().flatten().as_deref() != Some(&[b; 9000][..]) {
                    bad += 1;
                }
            }
        }
        let _ = lld.close();
        bad
    });
    seg.stop();
    assert!(
        after.len() == listed.len() && matches!(read_back, Ok(0)),
        "one failed read of slot 0 at start: the residency map listed {} evicted segments, \
         now {}; values read wrong or not at all: {read_back:?}",
        listed.len(),
        after.len()
    );
}
