//! A cache smaller than the file system (issue 20 step C; docs/DESIGN.md "A cache smaller than
//! the file system"): lld over a bounded cache (a sparse file, so its allocated bytes can be
//! measured), its uploads in a memory store with seeded faults. Everything reads back through
//! fetches while the cache stays within its bound; a restart and a cold cache read the same;
//! a damaged or missing object fails the blocks in its segment only; a power cut in the middle
//! of fetches and evictions loses nothing that was flushed.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use ldfs::device::{CrashDevice, CrashOptions, Device, FileDevice, FileDeviceOptions};
use ldfs::ld::{ListHints, ListId, LogicalDisk};
use ldfs::lld::layout::{Geometry, MkfsOptions};
use ldfs::lld::{Key, Lld, LldOptions, PolicyKind, SegmentId, PAGE_BYTES};
use ldfs::store::cache::metadata_allowance_bytes;
use ldfs::store::segments::{decode_checkpoint_object, newest_checkpoint};
use ldfs::store::{
    restore_lazy, CacheConfig, MemoryStore, MemoryStoreFaults, ObjectStore, SegmentStore,
    SegmentStoreOptions,
};
use ldfs::testing::store::{crash_lease, take_lease, TestClock};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const DEV_BYTES: u64 = 32 << 20;
const SEGMENT_BYTES: u64 = 128 << 10;
/// What the workloads write (live), and the bound: a quarter of it.
const DATA_BYTES: u64 = 8 << 20;
const BOUND_BYTES: u64 = DATA_BYTES / 4;

type Model = BTreeMap<(u64, u64), Vec<u8>>;

fn mkfs_opts() -> MkfsOptions {
    MkfsOptions {
        segment_bytes: SEGMENT_BYTES,
        max_block_bytes: 32 << 10,
        reserved_segments: Some(4),
        fs_id: 2030,
        max_bytes: None,
        kept_pages: 0,
    }
}

fn fast_backoff() -> SegmentStoreOptions {
    SegmentStoreOptions {
        backoff_initial: Duration::from_millis(1),
        backoff_max: Duration::from_millis(20),
    }
}

fn cache_cfg(map: &Path) -> CacheConfig {
    CacheConfig {
        map_path: map.to_path_buf(),
        bound_bytes: BOUND_BYTES,
        fetch_patience: Duration::from_millis(200),
    }
}

fn replay(seed: u64) -> String {
    format!("seed {seed}; replay: LDFS_SEED={seed} cargo test --release -p ldfs --test store_cache")
}

fn seeds(default: &[u64]) -> Vec<u64> {
    match std::env::var("LDFS_SEED") {
        Ok(s) => vec![s.parse().expect("LDFS_SEED is a number")],
        Err(_) => default.to_vec(),
    }
}

/// lld over the layer's device (fetches and evictions happen under it), discarding released
/// segments as a bounded store mount does.
fn open(seg: &SegmentStore) -> Lld {
    Lld::open(
        seg.device(),
        LldOptions {
            checkpoint_hook: Some(seg.hook()),
            segment_hook: Some(seg.segment_hook()),
            discard: true,
            ..LldOptions::default()
        },
    )
    .expect("open")
}

fn allocated(path: &Path) -> u64 {
    std::fs::metadata(path).unwrap().blocks() * 512
}

fn geometry(dev: &dyn Device) -> Geometry {
    let mut sb = vec![0u8; PAGE_BYTES];
    dev.read_at(&mut sb, 0).unwrap();
    Geometry::decode_superblock(&sb, 0, dev.size_bytes()).unwrap()
}

/// The cache file's allocated bytes are within the bound plus what the superblocks and slots
/// take.
fn assert_within_bound(path: &Path, geo: &Geometry, what: &str) {
    let a = allocated(path);
    let limit = BOUND_BYTES + metadata_allowance_bytes(geo);
    assert!(
        a <= limit,
        "{what}: the cache file holds {a} bytes, over its bound {BOUND_BYTES} + {} of metadata",
        metadata_allowance_bytes(geo)
    );
}

/// Writes `DATA_BYTES` in blocks of 8 KiB over four lists, with some overwrites and deletes
/// and a cleaning pass, a checkpoint uploaded (and the cache shrunk) every 512 KiB.
fn write_workload(
    lld: &Lld,
    seg: &SegmentStore,
    rng: &mut ChaCha8Rng,
    check_bound: &dyn Fn(&str),
) -> (Vec<ListId>, Model) {
    let lists: Vec<ListId> = (0..4)
        .map(|_| lld.create_list(None, ListHints::default()).unwrap())
        .collect();
    let mut model = Model::new();
    let blocks = DATA_BYTES / 8192;
    for n in 0..blocks {
        let l = lists[(n % 4) as usize];
        let v: Vec<u8> = (0..8192).map(|_| rng.gen()).collect();
        lld.write(None, l, n / 4, &v).unwrap();
        model.insert((l.0, n / 4), v);
        if rng.gen_bool(0.05) {
            // An overwrite of an earlier block, or a delete: dead bytes for the cleaner.
            let i = rng.gen_range(0..=n / 4);
            let l2 = lists[rng.gen_range(0..4)];
            if rng.gen_bool(0.3) {
                lld.delete(None, l2, i).unwrap();
                model.remove(&(l2.0, i));
            } else {
                let w: Vec<u8> = (0..rng.gen_range(1..9000)).map(|_| rng.gen()).collect();
                lld.write(None, l2, i, &w).unwrap();
                model.insert((l2.0, i), w);
            }
        }
        if n % 64 == 63 {
            if n % 512 == 511 {
                let cancel = std::sync::atomic::AtomicBool::new(false);
                lld.clean_now(PolicyKind::Greedy, Some(4), 0.9, &cancel)
                    .unwrap();
            }
            lld.checkpoint_now().unwrap();
            seg.wait_uploaded(seg.announced(), Duration::from_secs(60))
                .unwrap();
            seg.shrink_cache().unwrap();
            check_bound(&format!("after {n} blocks"));
        }
    }
    lld.checkpoint_now().unwrap();
    seg.wait_uploaded(seg.announced(), Duration::from_secs(60))
        .unwrap();
    seg.shrink_cache().unwrap();
    (lists, model)
}

/// Reads every block back (the model's and the deleted ones), checking the bound every 64.
fn read_back(lld: &Lld, model: &Model, seed: u64, what: &str, check_bound: &dyn Fn(&str)) {
    let keys: Vec<(u64, u64)> = model.keys().copied().collect();
    for (n, (l, i)) in keys.iter().enumerate() {
        let got = lld
            .read(ListId(*l), *i)
            .unwrap_or_else(|e| panic!("{what}: list {l} index {i}: {e} ({})", replay(seed)));
        assert_eq!(
            got.as_deref(),
            model.get(&(*l, *i)).map(|v| v.as_slice()),
            "{what}: list {l} index {i} ({})",
            replay(seed)
        );
        if n % 64 == 0 {
            check_bound(&format!("{what}: after {n} reads"));
        }
    }
}

#[test]
fn a_quarter_sized_cache_reads_everything_back_within_its_bound() {
    for seed in seeds(&[1, 2]) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cache.img");
        let map = dir.path().join("cache.img.ldfs-resident");
        let store = Arc::new(MemoryStore::with_faults(MemoryStoreFaults {
            seed,
            lost_ppm: 50_000,
            landed_answer_lost_ppm: 50_000,
            ..MemoryStoreFaults::default()
        }));
        let dev: Arc<dyn Device> =
            Arc::new(FileDevice::create(&path, DEV_BYTES, FileDeviceOptions::default()).unwrap());
        ldfs::lld::mkfs::mkfs(&*dev, &mkfs_opts()).unwrap();
        let geo = geometry(&*dev);
        let bound =
            |what: &str| assert_within_bound(&path, &geo, &format!("{what} ({})", replay(seed)));
        let clock = TestClock::default();
        let lease = take_lease(store.clone(), &clock, false);
        let seg = SegmentStore::start_cached(
            store.clone(),
            dev.clone(),
            lease.clone(),
            fast_backoff(),
            Some(cache_cfg(&map)),
        )
        .unwrap();
        let lld = open(&seg);
        let (_lists, model) = write_workload(&lld, &seg, &mut rng, &bound);
        let st = seg.cache_stats().unwrap();
        assert!(
            st.evictions > 0,
            "nothing evicted: {st:?} ({})",
            replay(seed)
        );
        read_back(&lld, &model, seed, "the first mount", &bound);
        let st = seg.cache_stats().unwrap();
        assert!(
            st.misses > 0 && st.bytes_fetched >= st.misses * SEGMENT_BYTES,
            "the reads fetched nothing: {st:?} ({})",
            replay(seed)
        );
        assert_eq!(st.fetch_failures, 0, "{st:?}");
        lld.close().unwrap();
        seg.wait_uploaded(seg.announced(), Duration::from_secs(60))
            .unwrap();
        seg.stop();
        drop(seg);
        drop(dev);
        crash_lease(&lease, &clock);

        // A restart on the same cache: the map says what is a hole.
        let dev: Arc<dyn Device> =
            Arc::new(FileDevice::open(&path, FileDeviceOptions::default()).unwrap());
        let lease = take_lease(store.clone(), &clock, true);
        let seg = SegmentStore::start_cached(
            store.clone(),
            dev.clone(),
            lease.clone(),
            fast_backoff(),
            Some(cache_cfg(&map)),
        )
        .unwrap();
        assert!(seg.cache_stats().unwrap().evicted_segments > 0);
        let lld = open(&seg);
        // The eviction thread runs when woken; the test waits for it here.
        seg.shrink_cache().unwrap();
        read_back(&lld, &model, seed, "a restart on the same cache", &bound);
        assert!(seg.cache_stats().unwrap().misses > 0);
        let put_before = seg.stats().segments_put;
        lld.close().unwrap();
        seg.wait_uploaded(seg.announced(), Duration::from_secs(60))
            .unwrap();
        // Nothing evicted went up again: the store's objects were reused.
        let named = {
            let (_, obj) = newest_checkpoint(&*store).unwrap().unwrap();
            obj.entries.len() as u64
        };
        assert!(
            seg.stats().segments_put - put_before < named,
            "the restart re-uploaded what it had evicted"
        );
        seg.stop();
        drop(seg);
        crash_lease(&lease, &clock);

        // A cold cache: nothing downloaded at the rebuild, everything fetched as read.
        let path2 = dir.path().join("cold.img");
        let map2 = dir.path().join("cold.img.ldfs-resident");
        let dev2: Arc<dyn Device> =
            Arc::new(FileDevice::create(&path2, DEV_BYTES, FileDeviceOptions::default()).unwrap());
        let r = restore_lazy(&*store, &*dev2, &map2).unwrap();
        assert!(
            r.segments <= 1,
            "a cold rebuild fetched {} segments",
            r.segments
        );
        assert!(
            allocated(&path2) <= 2 * SEGMENT_BYTES + metadata_allowance_bytes(&geo),
            "a cold rebuild wrote {} bytes",
            allocated(&path2)
        );
        let bound2 =
            |what: &str| assert_within_bound(&path2, &geo, &format!("{what} ({})", replay(seed)));
        let lease = take_lease(store.clone(), &clock, true);
        let seg = SegmentStore::start_cached(
            store.clone(),
            dev2.clone(),
            lease.clone(),
            fast_backoff(),
            Some(cache_cfg(&map2)),
        )
        .unwrap();
        let lld = open(&seg);
        seg.shrink_cache().unwrap();
        read_back(&lld, &model, seed, "a cold cache", &bound2);
        let st = seg.cache_stats().unwrap();
        assert!(st.misses > 0 && st.evictions > 0, "{st:?}");
        drop(lld);
        seg.stop();
    }
}

/// An evicted segment holding data blocks and no live map page, with its key.
fn data_only_evicted_segment(
    lld: &Lld,
    seg: &SegmentStore,
    store: &dyn ObjectStore,
    geo: &Geometry,
    model: &Model,
) -> (SegmentId, String, Vec<(u64, u64)>) {
    let (key, _) = newest_checkpoint(store).unwrap().unwrap();
    let obj = decode_checkpoint_object(&key, &store.get(&key).unwrap()).unwrap();
    let mut by_seg: BTreeMap<u32, Vec<(u64, u64)>> = BTreeMap::new();
    for &(l, i) in model.keys() {
        let e = lld.map_entry(Key { list: l, index: i }).unwrap().unwrap();
        let s = geo.segment_of(e.offset()).unwrap();
        by_seg.entry(s.0).or_default().push((l, i));
    }
    for e in &obj.entries {
        let s = SegmentId(e.segment);
        if seg.evicted_entry(e.segment) != Some(*e) || !by_seg.contains_key(&e.segment) {
            continue;
        }
        let map_pages = (0..geo.segment_pages).any(|p| lld.map_page_is_live(geo.page_addr(s, p)));
        if !map_pages {
            return (s, e.key(), by_seg[&e.segment].clone());
        }
    }
    panic!("no evicted segment of data blocks only");
}

#[test]
fn a_damaged_or_missing_object_fails_only_the_blocks_in_its_segment() {
    let seed = 7;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cache.img");
    let map = dir.path().join("cache.img.ldfs-resident");
    let store = Arc::new(MemoryStore::new());
    let dev: Arc<dyn Device> =
        Arc::new(FileDevice::create(&path, DEV_BYTES, FileDeviceOptions::default()).unwrap());
    ldfs::lld::mkfs::mkfs(&*dev, &mkfs_opts()).unwrap();
    let geo = geometry(&*dev);
    let clock = TestClock::default();
    let lease = take_lease(store.clone(), &clock, false);
    let seg = SegmentStore::start_cached(
        store.clone(),
        dev.clone(),
        lease,
        fast_backoff(),
        Some(cache_cfg(&map)),
    )
    .unwrap();
    let lld = open(&seg);
    let (_lists, model) = write_workload(&lld, &seg, &mut rng, &|_| {});
    let (s, key, in_it) = data_only_evicted_segment(&lld, &seg, &*store, &geo, &model);
    assert!(!in_it.is_empty());
    let read_all = |what: &str| {
        let mut failed = Vec::new();
        for (&(l, i), v) in &model {
            match lld.read(ListId(l), i) {
                Ok(got) => assert_eq!(got.as_deref(), Some(v.as_slice()), "{what}: {l}/{i}"),
                Err(_) => failed.push((l, i)),
            }
        }
        failed
    };
    // Damaged: one byte flipped in the store.
    assert!(store.corrupt(&key, |b| b[PAGE_BYTES + 100] ^= 1));
    let failed = read_all("damaged");
    assert_eq!(
        failed, in_it,
        "with segment {} ({key}) damaged, exactly its blocks fail",
        s.0
    );
    assert!(seg.cache_stats().unwrap().fetch_failures > 0);
    // Put right: the next reads fetch it.
    assert!(store.corrupt(&key, |b| b[PAGE_BYTES + 100] ^= 1));
    assert!(read_all("put right").is_empty());
    // Missing: evicted again, then deleted behind the layer's back.
    seg.shrink_cache().unwrap();
    let (s, key, in_it) = data_only_evicted_segment(&lld, &seg, &*store, &geo, &model);
    store.delete(&key).unwrap();
    let failed = read_all("missing");
    assert_eq!(failed, in_it, "with segment {} ({key}) missing", s.0);
    drop(lld);
    seg.stop();
}

/// A power cut at a seeded point of a read sweep that fetches and evicts (and of the writes
/// and flushes beside it): remounted on the same cache and map, every flushed block reads back.
#[test]
fn a_power_cut_mid_fetch_and_mid_eviction_loses_nothing_flushed() {
    for seed in seeds(&[21, 22, 23, 24, 25, 26]) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let dir = tempfile::tempdir().unwrap();
        let map: PathBuf = dir.path().join("cache.ldfs-resident");
        let store = Arc::new(MemoryStore::new());
        let crash = Arc::new(CrashDevice::new(DEV_BYTES));
        let dev: Arc<dyn Device> = crash.clone();
        ldfs::lld::mkfs::mkfs(&*dev, &mkfs_opts()).unwrap();
        crash.flush().unwrap();
        let clock = TestClock::default();
        let lease = take_lease(store.clone(), &clock, false);
        let seg = SegmentStore::start_cached(
            store.clone(),
            dev.clone(),
            lease.clone(),
            fast_backoff(),
            Some(cache_cfg(&map)),
        )
        .unwrap();
        let lld = open(&seg);
        let (lists, mut model) = write_workload(&lld, &seg, &mut rng, &|_| {});
        lld.flush().unwrap();
        // The cut: somewhere in the next few hundred device writes and flushes.
        let cut = rng.gen_range(1..400);
        crash.cut_power_after(cut);
        let keys: Vec<(u64, u64)> = model.keys().copied().collect();
        let mut flushed = model.clone();
        'sweep: for (n, (l, i)) in keys.iter().enumerate() {
            if lld.read(ListId(*l), *i).is_err() {
                break;
            }
            if n % 16 == 0 {
                let v: Vec<u8> = (0..rng.gen_range(1..9000)).map(|_| rng.gen()).collect();
                let l2 = lists[rng.gen_range(0..4)];
                let i2 = rng.gen_range(0..64);
                if lld.write(None, l2, i2, &v).is_err() {
                    break 'sweep;
                }
                model.insert((l2.0, i2), v);
                if lld.flush().is_err() {
                    break 'sweep;
                }
                flushed = model.clone();
            }
        }
        assert!(
            crash.power_is_cut(),
            "seed {seed}: the sweep ended before the cut at {cut}"
        );
        let image = crash.crash_image(seed, &CrashOptions::default());
        seg.stop();
        crash_lease(&lease, &clock);
        drop(lld);
        drop(seg);

        let dev2: Arc<dyn Device> = Arc::new(CrashDevice::from_image(image));
        let lease2 = take_lease(store.clone(), &clock, true);
        let seg2 = SegmentStore::start_cached(
            store.clone(),
            dev2,
            lease2,
            fast_backoff(),
            Some(cache_cfg(&map)),
        )
        .unwrap_or_else(|e| panic!("restart after the cut at {cut}: {e} ({})", replay(seed)));
        let lld2 = open(&seg2);
        // A write after the last successful flush may or may not have survived; every block
        // that was flushed reads as flushed unless a later (unflushed) write replaced it.
        for (k, v) in &flushed {
            let got = lld2
                .read(ListId(k.0), k.1)
                .unwrap_or_else(|e| panic!("cut at {cut}: {k:?}: {e} ({})", replay(seed)));
            let ok = got.as_deref() == Some(v.as_slice())
                || got.as_deref() == model.get(k).map(|v| v.as_slice());
            assert!(ok, "cut at {cut}: block {k:?} lost ({})", replay(seed));
        }
        let st = seg2.cache_stats().unwrap();
        assert_eq!(st.fetch_failures, 0, "{st:?}");
        drop(lld2);
        seg2.stop();
    }
}

/// Segments evicted, then cleaned (fetched back for their live blocks), released and written
/// again by the log, and a crash before the next upload: the residency map must not send reads
/// of the new bytes to the old objects (which the store still holds: the uploads fail).
#[test]
fn a_segment_the_log_reuses_after_its_eviction_is_never_read_from_its_old_object() {
    for seed in seeds(&[31, 32, 33]) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let dir = tempfile::tempdir().unwrap();
        let map: PathBuf = dir.path().join("cache.ldfs-resident");
        let store = Arc::new(MemoryStore::new());
        let crash = Arc::new(CrashDevice::new(DEV_BYTES));
        let dev: Arc<dyn Device> = crash.clone();
        ldfs::lld::mkfs::mkfs(&*dev, &mkfs_opts()).unwrap();
        crash.flush().unwrap();
        let clock = TestClock::default();
        let lease = take_lease(store.clone(), &clock, false);
        let seg = SegmentStore::start_cached(
            store.clone(),
            dev.clone(),
            lease.clone(),
            fast_backoff(),
            Some(cache_cfg(&map)),
        )
        .unwrap();
        let lld = open(&seg);
        let (lists, mut model) = write_workload(&lld, &seg, &mut rng, &|_| {});
        lld.close().unwrap();
        seg.wait_uploaded(seg.announced(), Duration::from_secs(60))
            .unwrap();
        seg.shrink_cache().unwrap();
        assert!(seg.cache_stats().unwrap().evicted_segments > 0);
        seg.stop();
        drop(lld);
        drop(seg);
        crash_lease(&lease, &clock);
        // Remounted without a bound: no eviction (nor its writes of the map) from here on, so
        // only the write path can take a reused segment out of the map.
        let lease = take_lease(store.clone(), &clock, true);
        let seg = SegmentStore::start_cached(
            store.clone(),
            dev.clone(),
            lease.clone(),
            fast_backoff(),
            Some(CacheConfig::new(map.clone(), None)),
        )
        .unwrap();
        let lld = open(&seg);
        // From here on nothing reaches the store (so nothing in it is deleted either).
        store.set_faults(MemoryStoreFaults {
            seed,
            lost_ppm: 1_000_000,
            ..MemoryStoreFaults::default()
        });
        // Dead bytes everywhere, then a cleaning pass that reads the evicted segments.
        for _ in 0..600 {
            let l = lists[rng.gen_range(0..4)];
            let i = rng.gen_range(0..(DATA_BYTES / 8192 / 4));
            let v: Vec<u8> = (0..rng.gen_range(1..9000)).map(|_| rng.gen()).collect();
            lld.write(None, l, i, &v).unwrap();
            model.insert((l.0, i), v);
        }
        let cancel = std::sync::atomic::AtomicBool::new(false);
        // Enough writing that the log goes round the device and reuses what it released.
        for _ in 0..10 {
            lld.clean_now(PolicyKind::Greedy, Some(32), 1.0, &cancel)
                .unwrap();
            lld.checkpoint_now().unwrap();
            for _ in 0..300 {
                let l = lists[rng.gen_range(0..4)];
                let i = rng.gen_range(0..(DATA_BYTES / 8192 / 4));
                let v: Vec<u8> = (0..8192).map(|_| rng.gen()).collect();
                lld.write(None, l, i, &v).unwrap();
                model.insert((l.0, i), v);
            }
            lld.checkpoint_now().unwrap();
        }
        lld.flush().unwrap();
        let st = seg.cache_stats().unwrap();
        assert!(st.misses > 0, "the cleaner fetched nothing: {st:?}");
        let image = crash.durable_image();
        seg.stop();
        crash_lease(&lease, &clock);
        drop(lld);
        drop(seg);
        store.set_faults(MemoryStoreFaults::default());

        let dev2: Arc<dyn Device> = Arc::new(CrashDevice::from_image(image));
        let lease2 = take_lease(store.clone(), &clock, true);
        let seg2 = SegmentStore::start_cached(
            store.clone(),
            dev2,
            lease2,
            fast_backoff(),
            Some(cache_cfg(&map)),
        )
        .unwrap();
        let lld2 = open(&seg2);
        for (k, v) in &model {
            let got = lld2
                .read(ListId(k.0), k.1)
                .unwrap_or_else(|e| panic!("{k:?}: {e} ({})", replay(seed)));
            assert_eq!(
                got.as_deref(),
                Some(v.as_slice()),
                "block {k:?} after the restart ({})",
                replay(seed)
            );
        }
        drop(lld2);
        seg2.stop();
    }
}
