//! Full segments go up as the log leaves them (issue 20: "each full segment is then uploaded as
//! one immutable object"), before the checkpoint that names them: `LldOptions::segment_hook` and
//! `SegmentStore::segment_hook`. A write uploads while it is written; the checkpoint after it
//! puts only what it names that is not there yet; an object put ahead for a use that ends
//! before any checkpoint names it is deleted; what a fresh cache rebuilds is the checkpoint's
//! tree.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ldfs::device::{Device, MemoryDevice};
use ldfs::ld::{ListHints, LogicalDisk};
use ldfs::lld::layout::{Geometry, MkfsOptions};
use ldfs::lld::{Lld, LldOptions, SegmentId, PAGE_BYTES};
use ldfs::store::segments::decode_checkpoint_object;
use ldfs::store::{restore, MemoryStore, ObjectStore, SegmentStore};
use ldfs::testing::store::{fast_backoff, seed_or, small_mkfs, take_lease, TestClock};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const DEV_BYTES: u64 = 32 << 20;
const SEGMENT_BYTES: u64 = 128 << 10;

fn mkfs_opts() -> MkfsOptions {
    small_mkfs(SEGMENT_BYTES, 2026)
}

fn seed() -> u64 {
    seed_or(20261127)
}

/// lld on `dev` with both of `seg`'s hooks, and no checkpoint before the test asks for one.
fn open(dev: &Arc<dyn Device>, seg: &SegmentStore) -> Lld {
    Lld::open(
        dev.clone(),
        LldOptions {
            checkpoint_hook: Some(seg.hook()),
            segment_hook: Some(seg.segment_hook()),
            checkpoint_log_bytes: 1 << 40,
            checkpoint_dirty_pages: Some(1 << 30),
            ..LldOptions::default()
        },
    )
    .expect("open")
}

/// Waits until `f` holds, or panics after 30 s saying `what`.
fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + Duration::from_secs(30);
    while !f() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The segment object keys every kept checkpoint object names.
fn named_by_checkpoints(store: &dyn ObjectStore) -> BTreeSet<String> {
    let mut named = BTreeSet::new();
    for c in store.list("ckpt/").unwrap() {
        let obj = decode_checkpoint_object(&c.key, &store.get(&c.key).unwrap()).unwrap();
        named.extend(obj.entries.iter().map(|e| e.key()));
    }
    named
}

fn segment_keys(store: &dyn ObjectStore) -> BTreeSet<String> {
    store
        .list("seg/")
        .unwrap()
        .into_iter()
        .map(|o| o.key)
        .collect()
}

/// The segment number in a segment object's key.
fn segment_of(key: &str) -> u32 {
    let hex = key.strip_prefix("seg/").unwrap().split('-').next().unwrap();
    u32::from_str_radix(hex, 16).unwrap()
}

#[test]
fn full_segments_go_up_before_the_checkpoint_that_names_them() {
    let seed = seed();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let store = Arc::new(MemoryStore::new());
    let dev: Arc<dyn Device> = Arc::new(MemoryDevice::new(DEV_BYTES));
    ldfs::lld::mkfs::mkfs(&*dev, &mkfs_opts()).unwrap();
    let mut sb = vec![0u8; PAGE_BYTES];
    dev.read_at(&mut sb, 0).unwrap();
    let geo = Geometry::decode_superblock(&sb, 0, DEV_BYTES).unwrap();
    let clock = TestClock::default();
    let lease = take_lease(store.clone(), &clock, false);
    let seg =
        SegmentStore::start(store.clone(), dev.clone(), lease.clone(), fast_backoff()).unwrap();
    let lld = open(&dev, &seg);
    // The open's own checkpoint goes up first.
    seg.wait_uploaded(seg.announced(), Duration::from_secs(30))
        .unwrap();
    let ckpts_before = seg.stats().checkpoints_put;
    let l = lld.create_list(None, ListHints::default()).unwrap();
    let mut model = BTreeMap::new();
    // About 20 segments of data, and no checkpoint.
    for i in 0..80u64 {
        let v: Vec<u8> = (0..32 << 10).map(|_| rng.gen()).collect();
        lld.write(None, l, i, &v).unwrap();
        model.insert(i, v);
    }
    lld.flush().unwrap();
    // Every segment the log left (Dirty: nothing was cleaned) goes up, and no checkpoint.
    let left = lld
        .segment_usage()
        .iter()
        .filter(|(_, u)| u.state == ldfs::lld::usage::SegmentState::Dirty)
        .count() as u64;
    assert!(left >= 16, "{left} segments left: seed {seed}");
    wait_for("every segment left put ahead", || {
        seg.stats().segments_put_ahead >= left
    });
    assert_eq!(
        seg.stats().checkpoints_put,
        ckpts_before,
        "no checkpoint was taken: seed {seed}"
    );
    // Each object put ahead holds exactly its segment's bytes as the cache has them now: it
    // was put only once every write of that use had returned.
    let ahead: BTreeSet<String> = segment_keys(&*store)
        .difference(&named_by_checkpoints(&*store))
        .cloned()
        .collect();
    assert_eq!(ahead.len() as u64, left, "{ahead:?}");
    for key in &ahead {
        let obj = store.get(key).unwrap();
        let mut b = vec![0u8; geo.segment_pages as usize * PAGE_BYTES];
        dev.read_at(&mut b, geo.page_addr(SegmentId(segment_of(key)), 0))
            .unwrap();
        assert!(
            obj == b,
            "object {key} differs from its segment: seed {seed}"
        );
    }

    // The checkpoint names them and puts only what it adds: the Active segment's prefix and
    // what the log left since.
    let put_before = seg.stats().segments_put;
    lld.checkpoint_now().unwrap();
    seg.wait_uploaded(seg.announced(), Duration::from_secs(30))
        .unwrap();
    let named = named_by_checkpoints(&*store);
    assert!(
        ahead.is_subset(&named),
        "put ahead but not named: {:?}",
        ahead.difference(&named).collect::<Vec<_>>()
    );
    let put = seg.stats().segments_put - put_before;
    assert!(
        put <= 2,
        "{put} segment objects put for the checkpoint of {} put ahead: seed {seed}",
        ahead.len()
    );

    // A use that ends before any checkpoint names it: a second list filled and deleted again,
    // its segments cleaned. What was put ahead for them goes once a checkpoint frees them.
    let l2 = lld.create_list(None, ListHints::default()).unwrap();
    let ahead_before = seg.stats().segments_put_ahead;
    for i in 0..40u64 {
        let v: Vec<u8> = (0..32 << 10).map(|_| rng.gen()).collect();
        lld.write(None, l2, i, &v).unwrap();
    }
    lld.flush().unwrap();
    wait_for("8 more segments put ahead", || {
        seg.stats().segments_put_ahead >= ahead_before + 8
    });
    lld.delete_list(None, l2).unwrap();
    let cancel = std::sync::atomic::AtomicBool::new(false);
    lld.clean_now(ldfs::lld::PolicyKind::Greedy, Some(64), 0.9, &cancel)
        .unwrap();
    for _ in 0..3 {
        lld.checkpoint_now().unwrap();
        seg.wait_uploaded(seg.announced(), Duration::from_secs(30))
            .unwrap();
    }
    wait_for("every segment object named by a kept checkpoint", || {
        segment_keys(&*store).is_subset(&named_by_checkpoints(&*store))
    });
    let st = seg.stats();
    assert!(st.objects_deleted > 0, "{st:?}");

    // A lost machine: the store alone rebuilds the checkpoint's tree.
    drop(lld);
    seg.stop();
    let dev2: Arc<dyn Device> = Arc::new(MemoryDevice::new(DEV_BYTES));
    restore(&*store, &*dev2).unwrap();
    let lld2 = Lld::open(dev2, LldOptions::default()).unwrap();
    for (i, v) in &model {
        assert_eq!(
            lld2.read(l, *i).unwrap().as_deref(),
            Some(v.as_slice()),
            "index {i} after the rebuild: seed {seed}"
        );
    }
    assert_eq!(lld2.read(l2, 0).unwrap(), None);
}
