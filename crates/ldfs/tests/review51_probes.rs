//! Review 51's probes of 359843c (a read-only mount's refresh keeps the segments its cache
//! fetched whose objects the newer checkpoint still names: `Cache::held_segments`,
//! `segments::restore_lazy_keeping`). The reader's refresh is replayed at library level on
//! one cache device rebuilt again and again, the keep chosen by `readers::unchanged_segments`
//! (what `ReaderMount::unchanged_in` calls).

mod readers_common;

use std::collections::BTreeSet;
use std::sync::Arc;

use ldfs::device::{Device, MemoryDevice};
use ldfs::lld::{SegmentId, PAGE_BYTES};
use ldfs::store::cache::Cache;
use ldfs::store::readers::{open_reader_cache, unchanged_segments, ReaderPin};
use ldfs::store::segments::{restore_lazy_keeping, CheckpointObject};
use ldfs::store::{CacheConfig, MemoryStore, ObjectStore};
use ldfs::testing::store::TestClock;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use readers_common::{check, pin_opts, read_only, replay_in, seed, Writer, DEV_BYTES};
use readers_common::{Model, SEGMENT_BYTES};

fn replay(seed: u64) -> String {
    replay_in("review51_probes", seed)
}

fn open(
    store: &Arc<dyn ObjectStore>,
    dev: &Arc<dyn Device>,
    map: &std::path::Path,
    obj: &CheckpointObject,
    bound_segments: u64,
) -> Arc<Cache> {
    open_reader_cache(
        store.clone(),
        dev.clone(),
        CacheConfig::new(map.to_path_buf(), Some(bound_segments * SEGMENT_BYTES)),
        obj,
    )
    .unwrap()
}

/// Reads about `share` of the tree (what the reader fetched before its refresh).
fn read_some(lld: &ldfs::lld::Lld, w: &Writer, model: &Model, rng: &mut ChaCha8Rng, share: f64) {
    use ldfs::ld::LogicalDisk;
    for &l in &w.lists {
        for i in 0..60u64 {
            if rng.gen_bool(share) {
                let got = lld.read(l, i).unwrap();
                assert_eq!(got.as_deref(), model.get(&(l.0, i)).map(|v| v.as_slice()));
            }
        }
    }
}

/// A reader refreshing eight times on one cache device (bounds of 3, 6 and unbounded
/// segments; between refreshes the writer uploads 1 to 3 rounds of overwrites, deletes and
/// cleaning, or nothing but a rewrite of a few keys): after every rebuild keeping what
/// `unchanged_segments` chose, (a) each kept segment's bytes on the device are its object's
/// in the store, byte for byte, (b) no kept segment is the new slot's log or next segment
/// (the rebuild writes zeros there), and (c) the whole tree reads as the writer's model at
/// the pinned checkpoint. Fails if the keep is chosen without the old entry's equality (checked by
/// hand: keeping every held segment the new object names in full fails (a) and (c)).
#[test]
fn kept_segments_hold_the_new_checkpoints_bytes_through_refreshes() {
    let seed = seed();
    let why = replay(seed);
    let mut kept_total = 0usize;
    for (n, bound) in [3u64, 6, 1000].into_iter().enumerate() {
        let mut rng = ChaCha8Rng::seed_from_u64(seed.wrapping_add(n as u64));
        let dir = tempfile::tempdir().unwrap();
        let map = dir.path().join("reader.ldfs-resident");
        let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
        let clock = TestClock::default();
        let mut w = Writer::start(store.clone(), &clock, false);
        for r in 0..3 {
            w.round(&mut rng, r == 2);
        }
        let dev: Arc<dyn Device> = Arc::new(MemoryDevice::new(DEV_BYTES));
        let (mut pin, mut key, mut obj) = ReaderPin::take(store.clone(), pin_opts()).unwrap();
        let mut model = w.model.clone();
        restore_lazy_keeping(&*store, &*dev, &map, 7, &key, &obj, &[]).unwrap();
        let mut cache = open(&store, &dev, &map, &obj, bound);
        let mut lld = read_only(cache.clone());
        for step in 0..8 {
            let share = rng.gen_range(0.2..1.0);
            read_some(&lld, &w, &model, &mut rng, share);
            // The refresh: no request in flight, the old cache stopped.
            cache.stop();
            let held = cache.held_segments();
            match rng.gen_range(0..4) {
                0 => {
                    // A few keys only: most segments stay as they were.
                    w.churn(&mut rng, false);
                    w.upload();
                }
                k => {
                    for r in 0..k {
                        w.round(&mut rng, r == 1);
                    }
                }
            }
            let (pin2, key2, obj2) = ReaderPin::take(store.clone(), pin_opts()).unwrap();
            assert_ne!(key2, key, "setup: the writer moved on ({why})");
            let keep = unchanged_segments(&obj, &obj2, &held);
            let r = restore_lazy_keeping(&*store, &*dev, &map, 7, &key2, &obj2, &keep).unwrap();
            assert_eq!(r.kept, keep.len(), "bound {bound} step {step} ({why})");
            kept_total += keep.len();
            let (hdr, _) = ldfs::lld::checkpoint::decode(&obj2.geo, &obj2.slot, 0).unwrap();
            for e in &keep {
                assert!(
                    e.segment != hdr.log_segment && e.segment != hdr.next_segment,
                    "bound {bound} step {step}: kept segment {} is the log's ({hdr:?}) ({why})",
                    e.segment
                );
                let want = store.get(&e.key()).unwrap();
                let mut got = vec![0u8; want.len()];
                dev.read_at(&mut got, obj2.geo.page_addr(SegmentId(e.segment), 0))
                    .unwrap();
                assert!(
                    got == want,
                    "bound {bound} step {step}: kept segment {} holds other bytes than its \
                     object {} ({why})",
                    e.segment,
                    e.key()
                );
                assert_eq!(want.len(), obj2.geo.segment_pages as usize * PAGE_BYTES);
            }
            drop(lld);
            drop(cache);
            pin.release().unwrap();
            (pin, key, obj) = (pin2, key2, obj2);
            model = w.model.clone();
            cache = open(&store, &dev, &map, &obj, bound);
            // The kept segments count as held, and may be evicted: a bound below them is kept
            // once the cache shrinks (the Active segment, not evictable, aside).
            let (_, usage) = ldfs::lld::checkpoint::decode(&obj.geo, &obj.slot, 0).unwrap();
            let dirty = |s: u32| {
                usage
                    .iter()
                    .any(|(g, u)| g.0 == s && u.state == ldfs::lld::usage::SegmentState::Dirty)
            };
            let kept_dirty = keep.iter().filter(|e| dirty(e.segment)).count() as u64;
            assert!(
                cache.stats().held_segments >= kept_dirty,
                "bound {bound} step {step}: {kept_dirty} kept segments, {:?} ({why})",
                cache.stats()
            );
            // Unbounded, every other step: opened once bounded to 2 segments and shrunk (what
            // the unbounded cache kept must go), then opened again as it was.
            if bound == 1000 && step % 2 == 0 {
                cache.stop();
                drop(cache);
                let small = open(&store, &dev, &map, &obj, 2);
                small.shrink().unwrap();
                let still: BTreeSet<u32> = small.held_segments().into_iter().collect();
                let kept_held = keep.iter().filter(|e| still.contains(&e.segment)).count();
                assert!(
                    kept_held <= 2,
                    "step {step}: {kept_held} of {} kept segments held after a shrink to 2 \
                     ({:?}) ({why})",
                    keep.len(),
                    small.stats()
                );
                small.stop();
                drop(small);
                cache = open(&store, &dev, &map, &obj, bound);
            }
            lld = read_only(cache.clone());
            check(
                &lld,
                &w.lists,
                &model,
                &format!("bound {bound} step {step}, after the refresh"),
                &why,
            );
        }
        cache.stop();
        pin.release().unwrap();
        drop(lld);
        w.seg.stop();
    }
    assert!(kept_total > 0, "setup: some segments were kept ({why})");
    eprintln!("{kept_total} segments kept in all ({why})");
}

/// Review 51 finding (cache.rs `Cache::fetch`): a fetch whose room-making fails (the residency
/// map cannot be written: its folder gone, the disk full) returns the error with the segment
/// left `Fetching`, and nobody wakes its waiters: every later read of that segment waits for
/// ever (a FUSE request stuck, and a refresh, which waits for requests in flight, with it).
/// The probe breaks the map's folder once the bounded reader's cache is full, reads until a
/// read fails, then reads the same key again from a thread: it must answer (an error, or the
/// bytes) within 20 s.
#[test]
fn a_fetch_whose_eviction_fails_leaves_no_segment_fetching_for_ever() {
    use ldfs::ld::LogicalDisk;
    let seed = seed();
    let why = replay(seed);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    let sub = dir.path().join("sub");
    std::fs::create_dir_all(&sub).unwrap();
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let clock = TestClock::default();
    let mut w = Writer::start(store.clone(), &clock, false);
    for r in 0..3 {
        w.round(&mut rng, r == 2);
    }
    w.seg.stop();
    let (_pin, key, obj) = ReaderPin::take(store.clone(), pin_opts()).unwrap();
    let cache = readers_common::reader_cache(store.clone(), &sub, &key, &obj, 3);
    let lld = Arc::new(read_only(cache.clone()));
    // Fill the cache to its bound, then take the map's folder away (a file in its place).
    let lists = w.lists.clone();
    let mut keys = Vec::new();
    for &l in &lists {
        for i in 0..60u64 {
            keys.push((l, i));
        }
    }
    for &(l, i) in keys.iter().take(8) {
        lld.read(l, i).unwrap();
    }
    std::fs::remove_dir_all(&sub).unwrap();
    std::fs::write(&sub, b"not a folder").unwrap();
    let failed = keys
        .iter()
        .copied()
        .find(|&(l, i)| lld.read(l, i).is_err())
        .unwrap_or_else(|| panic!("setup: no read failed with the map unwritable ({why})"));
    let (tx, rx) = std::sync::mpsc::channel();
    {
        let lld = lld.clone();
        std::thread::spawn(move || {
            let r = lld.read(failed.0, failed.1).map(|_| ());
            let _ = tx.send(r.is_ok());
        });
    }
    let answered = rx.recv_timeout(std::time::Duration::from_secs(20));
    assert!(
        answered.is_ok(),
        "a read of list {} index {} after its fetch failed making room waits for ever: the \
         segment is left Fetching ({why})",
        failed.0 .0,
        failed.1
    );
    cache.stop();
}
