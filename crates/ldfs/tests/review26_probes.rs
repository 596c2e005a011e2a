//! Review 26's probes of the segment store layer (issue 20 step 1). Each doc comment says
//! what the probe showed and what fixed it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ldfs::device::{Device, MemoryDevice};
use ldfs::ld::{ListHints, ListId, LogicalDisk};
use ldfs::lld::layout::MkfsOptions;
use ldfs::lld::{CheckpointHook, Lld, LldOptions, PolicyKind, SegmentId, PAGE_BYTES};
use ldfs::store::segments::decode_checkpoint_object;
use ldfs::store::{restore, MemoryStore, MemoryStoreFaults, ObjectStore, SegmentStore};
use ldfs::testing::store::{crash_lease, take_lease, TestClock};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const DEV_BYTES: u64 = 24 << 20;
type Model = BTreeMap<(u64, u64), Vec<u8>>;

fn mkfs_opts() -> MkfsOptions {
    MkfsOptions {
        segment_bytes: 128 << 10,
        max_block_bytes: 32 << 10,
        reserved_segments: Some(4),
        fs_id: 2626,
        max_bytes: None,
        kept_pages: 0,
    }
}

use ldfs::testing::store::fast_backoff as fast;

fn open(dev: &Arc<dyn Device>, hook: Option<CheckpointHook>) -> Lld {
    Lld::open(
        dev.clone(),
        LldOptions {
            checkpoint_hook: hook,
            ..LldOptions::default()
        },
    )
    .expect("open")
}

fn churn(lld: &Lld, lists: &[ListId], model: &mut Model, rng: &mut ChaCha8Rng, ops: usize) {
    for _ in 0..ops {
        let l = lists[rng.gen_range(0..lists.len())];
        let i = rng.gen_range(0..60u64);
        if rng.gen_bool(0.2) {
            lld.delete(None, l, i).unwrap();
            model.remove(&(l.0, i));
        } else {
            let len = rng.gen_range(1..9000);
            let v: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
            lld.write(None, l, i, &v).unwrap();
            model.insert((l.0, i), v);
        }
    }
}

fn clean(lld: &Lld) {
    let cancel = AtomicBool::new(false);
    lld.clean_now(PolicyKind::Greedy, Some(16), 0.9, &cancel)
        .unwrap();
}

/// What went wrong reading `model` back, if anything.
fn mismatch(lld: &Lld, lists: &[ListId], model: &Model) -> Option<String> {
    for &l in lists {
        for i in 0..60u64 {
            match lld.read(l, i) {
                Ok(got) if got.as_deref() == model.get(&(l.0, i)).map(|v| v.as_slice()) => {}
                Ok(_) => return Some(format!("list {} index {i}: other bytes", l.0)),
                Err(e) => return Some(format!("list {} index {i}: {e}", l.0)),
            }
        }
    }
    None
}

/// Defect (high): a remount on the same cache trusts, as `known`, every segment the newest
/// checkpoint object names whose page 0 still carries the same sequence number, with
/// `read_gen` 0 and `released_at` 0. A segment that a later, never-uploaded checkpoint
/// released (Clean in the cache, bytes not yet overwritten) passes that check; once the new
/// mount reuses it and it is Dirty and full again, `released_at (0) <= read_gen (0)` and the
/// uploader names the OLD object (old first seq, old crc) in a new checkpoint object without
/// reading or putting anything. The store's newest checkpoint then names a deleted object
/// (restore fails NotFound) or the previous use's bytes (restore writes them; lld reads
/// garbage where the new tree points). Measured: seeds 1-3 each had rounds 7-12 whose newest
/// checkpoint object named 36-37 objects that were not in the store (keys with the first
/// use's sequence numbers, e.g. `seg/00000000-0000000000000001-0020`): a machine lost then
/// cannot be rebuilt. Later cleaning happened to repair it by round 30.
#[test]
fn a_remount_must_not_reuse_objects_of_segments_released_before_it() {
    let mut failures = Vec::new();
    for seed in [1u64, 2, 3] {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let store: Arc<MemoryStore> = Arc::new(MemoryStore::new());
        let dev: Arc<dyn Device> = Arc::new(MemoryDevice::new(DEV_BYTES));
        ldfs::lld::mkfs::mkfs(&*dev, &mkfs_opts()).unwrap();
        let mut model = Model::new();
        // Mount 1: uploads checkpoint N, then goes on (the store unreachable, or the uploader
        // behind at unmount): later checkpoints clean and release segments N names.
        let lease = take_lease(store.clone(), &TestClock::default(), false);
        let seg = SegmentStore::start(store.clone(), dev.clone(), lease, fast()).unwrap();
        let lld = open(&dev, Some(seg.hook()));
        let lists: Vec<ListId> = (0..4)
            .map(|_| lld.create_list(None, ListHints::default()).unwrap())
            .collect();
        for _ in 0..4 {
            churn(&lld, &lists, &mut model, &mut rng, 400);
            lld.checkpoint_now().unwrap();
        }
        seg.wait_uploaded(seg.announced(), Duration::from_secs(60))
            .unwrap();
        seg.lease().release().unwrap();
        drop(seg); // nothing after this reaches the store (the lease is released)
        for _ in 0..4 {
            churn(&lld, &lists, &mut model, &mut rng, 400);
            clean(&lld);
            lld.checkpoint_now().unwrap();
        }
        drop(lld);
        // Mount 2 on the same cache: runs long enough for the log to reuse those segments.
        let lease2 = take_lease(store.clone(), &TestClock::default(), false);
        let seg2 = SegmentStore::start(store.clone(), dev.clone(), lease2, fast()).unwrap();
        let lld2 = open(&dev, Some(seg2.hook()));
        for round in 0..30 {
            churn(&lld2, &lists, &mut model, &mut rng, 400);
            if round % 2 == 1 {
                clean(&lld2);
            }
            lld2.checkpoint_now().unwrap();
            seg2.wait_uploaded(seg2.announced(), Duration::from_secs(60))
                .unwrap();
            // The engine is idle: the newest checkpoint object must name exactly the cache's
            // bytes of every segment it names (none is released before the next checkpoint).
            let newest = store.list("ckpt/").unwrap().last().unwrap().key.clone();
            let obj = decode_checkpoint_object(&newest, &store.get(&newest).unwrap()).unwrap();
            for e in &obj.entries {
                let mut cache = vec![0u8; e.pages as usize * PAGE_BYTES];
                dev.read_at(
                    &mut cache,
                    lld2.geometry().page_addr(SegmentId(e.segment), 0),
                )
                .unwrap();
                let why = match store.get(&e.key()) {
                    Err(err) => Some(format!("{err}")),
                    Ok(b) if b != cache => Some("other bytes than the cache".to_string()),
                    Ok(_) => None,
                };
                if let Some(why) = why {
                    failures.push(format!(
                        "seed {seed} round {round}: {newest} names {}: {why}",
                        e.key()
                    ));
                }
            }
        }
        drop(lld2);
        drop(seg2);
        // Every object the newest checkpoint object names must be there and be what the
        // checkpoint's tree needs.
        let newest = store.list("ckpt/").unwrap().last().unwrap().key.clone();
        let obj = decode_checkpoint_object(&newest, &store.get(&newest).unwrap()).unwrap();
        let missing: Vec<String> = obj
            .entries
            .iter()
            .map(|e| e.key())
            .filter(|k| store.get(k).is_err())
            .collect();
        let dev3: Arc<dyn Device> = Arc::new(MemoryDevice::new(DEV_BYTES));
        let outcome = match restore(&*store, &*dev3) {
            Err(e) => Some(format!("restore: {e}")),
            Ok(_) => match Lld::open(dev3, LldOptions::default()) {
                Err(e) => Some(format!("open: {e}")),
                Ok(l3) => mismatch(&l3, &lists, &model),
            },
        };
        if !missing.is_empty() || outcome.is_some() {
            failures.push(format!(
                "seed {seed}: {newest} names {} missing objects {missing:?}; rebuilt cache: {outcome:?}",
                missing.len()
            ));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Was a defect (medium; fixed: keys carry the writer's lease generation): segment keys were
/// not unique across writers. After a rebuild from checkpoint N, the new writer continues the
/// log at the same head with the same sequence numbers and picks the same clean segments, so
/// its objects got the very keys the previous writer used (or was still retrying) for other
/// bytes after N. A put of the old writer that lands after the new writer's (a partitioned
/// writer whose retries succeed once the network heals) replaced the new writer's object: the
/// newest checkpoint object then failed its crc at restore.
#[test]
fn a_stale_writers_late_put_must_not_replace_the_new_writers_object() {
    let store: Arc<MemoryStore> = Arc::new(MemoryStore::new());
    let dev: Arc<dyn Device> = Arc::new(MemoryDevice::new(DEV_BYTES));
    ldfs::lld::mkfs::mkfs(&*dev, &mkfs_opts()).unwrap();
    let clock = TestClock::default();
    let lease_a = take_lease(store.clone(), &clock, false);
    let seg = SegmentStore::start(store.clone(), dev.clone(), lease_a.clone(), fast()).unwrap();
    let lld = open(&dev, Some(seg.hook()));
    let l = lld.create_list(None, ListHints::default()).unwrap();
    for i in 0..20u64 {
        lld.write(None, l, i, &[0x11; 8000]).unwrap();
    }
    lld.checkpoint_now().unwrap();
    seg.wait_uploaded(seg.announced(), Duration::from_secs(10))
        .unwrap();
    // Writer A is cut off from the store: every put stays in flight.
    store.set_faults(MemoryStoreFaults {
        seed: 5,
        held_ppm: 1_000_000,
        ..MemoryStoreFaults::default()
    });
    for i in 0..60u64 {
        lld.write(None, l, 100 + i, &[0xA1; 8000]).unwrap();
    }
    lld.checkpoint_now().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let a_keys: std::collections::BTreeSet<String> = store.keys().into_iter().collect();
    drop(lld);
    drop(seg);
    // A never comes back to release its lease; B takes it over once it expired.
    crash_lease(&lease_a, &clock);
    store.set_faults(MemoryStoreFaults::default());
    // Writer B: a fresh cache from the store, the same amount of other bytes.
    let dev2: Arc<dyn Device> = Arc::new(MemoryDevice::new(DEV_BYTES));
    restore(&*store, &*dev2).unwrap();
    let lease_b = take_lease(store.clone(), &clock, true);
    let seg2 = SegmentStore::start(store.clone(), dev2.clone(), lease_b, fast()).unwrap();
    let lld2 = open(&dev2, Some(seg2.hook()));
    let mut model = Model::new();
    for i in 0..20u64 {
        model.insert((l.0, i), vec![0x11; 8000]);
    }
    for i in 0..60u64 {
        lld2.write(None, l, 100 + i, &[0xB2; 8000]).unwrap();
        model.insert((l.0, 100 + i), vec![0xB2; 8000]);
    }
    lld2.checkpoint_now().unwrap();
    seg2.wait_uploaded(seg2.announced(), Duration::from_secs(10))
        .unwrap();
    drop(lld2);
    drop(seg2);
    let b_keys: std::collections::BTreeSet<String> = store.keys().into_iter().collect();
    // A's retried puts land now.
    let landed = store.settle();
    eprintln!(
        "A's objects before B: {}; B's store: {} keys; A's late puts landed: {landed}",
        a_keys.len(),
        b_keys.len()
    );
    let dev3: Arc<dyn Device> = Arc::new(MemoryDevice::new(DEV_BYTES));
    let outcome = match restore(&*store, &*dev3) {
        Err(e) => Some(format!("restore: {e}")),
        Ok(_) => match Lld::open(dev3, LldOptions::default()) {
            Err(e) => Some(format!("open: {e}")),
            Ok(l3) => mismatch(&l3, &[l], &model),
        },
    };
    assert!(outcome.is_none(), "{outcome:?}");
}

/// Review 26 (low): a hook that panics inside phase 2 left the checkpoint `Running` for ever:
/// the next checkpoint waited for it and never returned. Now the panic is caught, that
/// checkpoint fails and the engine turns read-only, and the next one returns at once.
#[test]
fn a_panicking_hook_does_not_hang_the_engine() {
    let dev: Arc<dyn Device> = Arc::new(MemoryDevice::new(DEV_BYTES));
    ldfs::lld::mkfs::mkfs(&*dev, &mkfs_opts()).unwrap();
    let armed = Arc::new(AtomicBool::new(false));
    let a2 = armed.clone();
    let hook = CheckpointHook(Arc::new(move |_c| {
        if a2.swap(false, Ordering::SeqCst) {
            panic!("hook fails once");
        }
    }));
    let lld = Arc::new(open(&dev, Some(hook)));
    let l = lld.create_list(None, ListHints::default()).unwrap();
    lld.write(None, l, 0, &[1u8; 100]).unwrap();
    armed.store(true, Ordering::SeqCst);
    let l2 = lld.clone();
    let first = std::thread::spawn(move || l2.checkpoint_now()).join();
    // Caught: the checkpoint fails (the engine turns read-only) rather
    // than the panic unwinding through it.
    assert!(matches!(first, Ok(Err(_))), "the hook's panic: {first:?}");
    let (tx, rx) = std::sync::mpsc::channel();
    let l3 = lld.clone();
    std::thread::spawn(move || {
        let _ = l3.write(None, l, 1, &[2u8; 100]);
        let r = l3.checkpoint_now();
        let _ = tx.send(r.map_err(|e| e.to_string()));
    });
    match rx.recv_timeout(Duration::from_secs(10)) {
        Ok(r) => eprintln!("the next checkpoint returned {r:?}"),
        Err(_) => panic!("the next checkpoint did not return within 10 s: the engine hangs"),
    }
}
