//! Review 46's guards of d8075cd (each choice of a take pinned under a key of its own, the
//! previous one deleted after; `PinState::owners`; release deleting them all). Review 46 found
//! no defect to probe; these guards pass now and each fails against the regression its doc
//! comment names (checked by hand).

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ldfs::device::{Device, MemoryDevice};
use ldfs::ld::{ListHints, LogicalDisk};
use ldfs::lld::LldOptions;
use ldfs::store::readers::{PinOptions, ReaderPin};
use ldfs::store::{MemoryStore, ObjectStore, SegmentStore, StoreError, StoreOp};
use ldfs::testing::store::{
    fast_backoff, open_with_hooks, seed_or, small_mkfs, take_lease, HookStore, TestClock, When,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const DEV_BYTES: u64 = 24 << 20;
const SEGMENT_BYTES: u64 = 128 << 10;

fn seed() -> u64 {
    seed_or(20261128)
}

fn replay(seed: u64) -> String {
    format!(
        "seed {seed}; replay: LDFS_SEED={seed} cargo test --release -p ldfs --test review46_probes"
    )
}

/// A store holding three uploads' checkpoints, its writer stopped.
fn uploaded_store(seed: u64) -> Arc<dyn ObjectStore> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let clock = TestClock::default();
    let dev: Arc<dyn Device> = Arc::new(MemoryDevice::new(DEV_BYTES));
    ldfs::lld::mkfs::mkfs(&*dev, &small_mkfs(SEGMENT_BYTES, 2026)).unwrap();
    let lease = take_lease(store.clone(), &clock, false);
    let seg = SegmentStore::start(store.clone(), dev.clone(), lease, fast_backoff()).unwrap();
    let lld = open_with_hooks(&seg, LldOptions::default());
    let lists: Vec<_> = (0..4)
        .map(|_| lld.create_list(None, ListHints::default()).unwrap())
        .collect();
    for _ in 0..3 {
        for _ in 0..300 {
            let l = lists[rng.gen_range(0..lists.len())];
            let i = rng.gen_range(0..60u64);
            let v: Vec<u8> = (0..rng.gen_range(1..9000)).map(|_| rng.gen()).collect();
            lld.write(None, l, i, &v).unwrap();
        }
        lld.checkpoint_now().unwrap();
        seg.wait_uploaded(seg.announced(), Duration::from_secs(60))
            .unwrap();
    }
    drop(lld);
    seg.stop();
    store
}

fn pin_keys(store: &dyn ObjectStore) -> Vec<String> {
    store
        .list("readers/")
        .unwrap()
        .into_iter()
        .map(|o| o.key)
        .collect()
}

fn refused(op: StoreOp, key: &str) -> StoreError {
    StoreError::Refused {
        op,
        key: key.to_string(),
        status: 403,
        detail: "the probe refuses it".into(),
    }
}

/// Guard: a take that chooses again (its first pin lapsed during the checks) and cannot delete
/// its first choice's pin returns its second choice with both pins in the store (the first
/// expires on its own), and release deletes both. Fails if release deletes only the current
/// record's key (as before d8075cd, one key per take).
#[test]
fn a_previous_choices_pin_whose_delete_failed_is_deleted_at_release() {
    let seed = seed();
    let inner = uploaded_store(seed);
    let clock = TestClock::default();
    let seg_listings = Arc::new(AtomicU32::new(0));
    let pin_deletes = Arc::new(AtomicU32::new(0));
    let store: Arc<dyn ObjectStore> = Arc::new(HookStore::new(inner.clone(), {
        let clock = clock.clone();
        let seg_listings = seg_listings.clone();
        let pin_deletes = pin_deletes.clone();
        move |op, key, when| {
            match (op, when) {
                // The first pin lapses during the take's first listing of `seg/`.
                (StoreOp::List, When::After)
                    if key == "seg/" && seg_listings.fetch_add(1, Ordering::SeqCst) == 0 =>
                {
                    clock.advance(601);
                }
                // The take's delete of the pin it moved on from is refused.
                (StoreOp::Delete, When::Before)
                    if key.starts_with("readers/")
                        && pin_deletes.fetch_add(1, Ordering::SeqCst) == 0 =>
                {
                    return Err(refused(op, key));
                }
                _ => {}
            }
            Ok(())
        }
    }));
    let opts = PinOptions {
        duration: Duration::from_secs(600),
        clock: clock.clock(),
        host: "reader".into(),
        pid: std::process::id(),
    };
    let (pin, _, _) = ReaderPin::take(store.clone(), opts).unwrap();
    assert_eq!(
        seg_listings.load(Ordering::SeqCst),
        2,
        "the take chose again once ({})",
        replay(seed)
    );
    let held = pin_keys(&*inner);
    assert_eq!(
        held.len(),
        2,
        "the first choice's pin stays (its delete refused): {held:?} ({})",
        replay(seed)
    );
    pin.release().unwrap();
    let left = pin_keys(&*inner);
    assert!(
        left.is_empty(),
        "release left pins in the store: {left:?} ({})",
        replay(seed)
    );
}

/// Guard: a take whose pin put failed (refused, final) after it landed fails, and leaves no pin
/// behind. Fails if a choice's owner is recorded only once its put succeeded.
#[test]
fn a_failed_take_deletes_a_pin_whose_put_failed_but_landed() {
    let seed = seed();
    let inner = uploaded_store(seed);
    let store: Arc<dyn ObjectStore> = Arc::new(HookStore::new(inner.clone(), |op, key, when| {
        if (op, when) == (StoreOp::Put, When::After) && key.starts_with("readers/") {
            return Err(refused(op, key));
        }
        Ok(())
    }));
    let opts = PinOptions {
        duration: Duration::from_secs(600),
        clock: TestClock::default().clock(),
        host: "reader".into(),
        pid: std::process::id(),
    };
    assert!(ReaderPin::take(store, opts).is_err());
    let left = pin_keys(&*inner);
    assert!(
        left.is_empty(),
        "a failed take left pins in the store: {left:?} ({})",
        replay(seed)
    );
}

/// Guard: a renewal of the first choice's pin, in flight when the take moves on, never puts
/// that pin back after the take deleted it (nor makes it the record again). The renewer's put
/// of the first key waits (up to 2 s) for the take's delete of that key; with the puts
/// serialised (`Keeper::puts`) the take's new pin waits for the renewal instead, and the
/// delete comes after it. Fails if `pin_choice` does not hold `puts`.
#[test]
fn a_renewal_in_flight_when_the_take_moves_on_does_not_put_the_old_pin_back() {
    let seed = seed();
    let inner = uploaded_store(seed);
    let clock = TestClock::default();
    let first_key: Arc<std::sync::Mutex<Option<String>>> = Arc::default();
    let renewing = Arc::new(AtomicBool::new(false));
    let deleted = Arc::new(AtomicBool::new(false));
    let seg_listings = Arc::new(AtomicU32::new(0));
    let store: Arc<dyn ObjectStore> = Arc::new(HookStore::new(inner.clone(), {
        let clock = clock.clone();
        let first_key = first_key.clone();
        let renewing = renewing.clone();
        let deleted = deleted.clone();
        let seg_listings = seg_listings.clone();
        move |op, key, when| {
            let renewer = std::thread::current().name() == Some("ldfs-pin");
            match (op, when) {
                (StoreOp::Put, When::After) if key.starts_with("readers/") && !renewer => {
                    first_key.lock().unwrap().get_or_insert(key.to_string());
                }
                // The first renewal of the first key waits for the take to delete it.
                (StoreOp::Put, When::Before)
                    if renewer
                        && first_key.lock().unwrap().as_deref() == Some(key)
                        && !renewing.swap(true, Ordering::SeqCst) =>
                {
                    let give_up = Instant::now() + Duration::from_secs(2);
                    while !deleted.load(Ordering::SeqCst) && Instant::now() < give_up {
                        std::thread::sleep(Duration::from_millis(10));
                    }
                }
                (StoreOp::Delete, When::After)
                    if first_key.lock().unwrap().as_deref() == Some(key) =>
                {
                    deleted.store(true, Ordering::SeqCst);
                }
                (StoreOp::List, When::After)
                    if key == "seg/" && seg_listings.fetch_add(1, Ordering::SeqCst) == 0 =>
                {
                    // A renewal of the first pin under way, the pin lapses: the take moves on.
                    let give_up = Instant::now() + Duration::from_secs(10);
                    while !renewing.load(Ordering::SeqCst) && Instant::now() < give_up {
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    assert!(renewing.load(Ordering::SeqCst), "no renewal in 10 s");
                    clock.advance(10);
                }
                _ => {}
            }
            Ok(())
        }
    }));
    let opts = PinOptions {
        duration: Duration::from_secs(1),
        clock: clock.clock(),
        host: "reader".into(),
        pid: std::process::id(),
    };
    let (pin, key, _) = ReaderPin::take(store.clone(), opts).unwrap();
    let first = first_key.lock().unwrap().clone().unwrap();
    // Let any renewal in flight finish.
    std::thread::sleep(Duration::from_millis(500));
    let rec = pin.record();
    let held = pin_keys(&*inner);
    assert!(
        seg_listings.load(Ordering::SeqCst) >= 2,
        "the take chose again ({})",
        replay(seed)
    );
    assert_eq!(rec.checkpoint, key, "{}", replay(seed));
    assert!(
        !held.contains(&first),
        "the first choice's pin {first} was put back after the take moved on: {held:?} ({})",
        replay(seed)
    );
    assert_eq!(
        held,
        vec![format!("readers/{:016x}", rec.owner)],
        "{}",
        replay(seed)
    );
    pin.release().unwrap();
    assert!(pin_keys(&*inner).is_empty(), "{}", replay(seed));
}
