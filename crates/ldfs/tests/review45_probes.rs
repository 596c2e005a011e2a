//! Review 45's probes of 61c2bcb (the reader pin's renewer running during the take). Each probe
//! fails while the defect its doc comment names is there.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ldfs::device::{Device, MemoryDevice};
use ldfs::ld::{ListHints, ListId, LogicalDisk};
use ldfs::lld::Lld;
use ldfs::lld::LldOptions;
use ldfs::store::readers::{PinOptions, ReaderPin};
use ldfs::store::{
    HeldLease, MemoryStore, ObjectInfo, ObjectStore, PutOutcome, SegmentStore, StoreError,
};
use ldfs::testing::store::{
    fast_backoff, open_with_hooks, seed_or, small_mkfs, take_lease, TestClock,
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
        "seed {seed}; replay: LDFS_SEED={seed} cargo test --release -p ldfs --test review45_probes"
    )
}

/// A writer: lld on a memory cache, uploading to `store`.
struct Writer {
    lld: Lld,
    seg: SegmentStore,
    lease: Arc<HeldLease>,
    lists: Vec<ListId>,
}

impl Writer {
    fn start(store: Arc<dyn ObjectStore>, clock: &TestClock) -> Writer {
        let dev: Arc<dyn Device> = Arc::new(MemoryDevice::new(DEV_BYTES));
        ldfs::lld::mkfs::mkfs(&*dev, &small_mkfs(SEGMENT_BYTES, 2026)).unwrap();
        let lease = take_lease(store.clone(), clock, false);
        let seg = SegmentStore::start(store, dev.clone(), lease.clone(), fast_backoff()).unwrap();
        let lld = open_with_hooks(&seg, LldOptions::default());
        let lists = (0..4)
            .map(|_| lld.create_list(None, ListHints::default()).unwrap())
            .collect();
        Writer {
            lld,
            seg,
            lease,
            lists,
        }
    }

    /// Overwrites and deletes, then a checkpoint uploaded (with the writer's delete round).
    fn round(&mut self, rng: &mut ChaCha8Rng) {
        for _ in 0..300 {
            let l = self.lists[rng.gen_range(0..self.lists.len())];
            let i = rng.gen_range(0..60u64);
            if rng.gen_bool(0.2) {
                self.lld.delete(None, l, i).unwrap();
            } else {
                let v: Vec<u8> = (0..rng.gen_range(1..9000)).map(|_| rng.gen()).collect();
                self.lld.write(None, l, i, &v).unwrap();
            }
        }
        self.lld.checkpoint_now().unwrap();
        self.seg
            .wait_uploaded(self.seg.announced(), Duration::from_secs(60))
            .unwrap();
    }

    /// The shared test clock moved on by `secs`, the writer's lease renewed on the way (as its
    /// renewer would: it must not expire by the jump).
    fn advance(&self, clock: &TestClock, secs: u64) {
        let mut left = secs;
        while left > 0 {
            let step = left.min(20);
            clock.advance(step);
            self.lease.renew_now().unwrap();
            left -= step;
        }
    }
}

type Hook = Box<dyn FnMut(u32) + Send>;

/// The reader's view of the store: each listing of `seg/` is taken, then `hook` runs with its
/// number (from 0) before the listing is returned: what a writer does while the reader's
/// answer is on its way.
struct HookedSegListing {
    inner: Arc<dyn ObjectStore>,
    hook: Mutex<Hook>,
    listings: AtomicU32,
}

impl ObjectStore for HookedSegListing {
    fn put(&self, key: &str, bytes: &[u8]) -> Result<(), StoreError> {
        self.inner.put(key, bytes)
    }
    fn put_if_absent(&self, key: &str, bytes: &[u8]) -> Result<PutOutcome, StoreError> {
        self.inner.put_if_absent(key, bytes)
    }
    fn get(&self, key: &str) -> Result<Vec<u8>, StoreError> {
        self.inner.get(key)
    }
    fn get_range(&self, key: &str, offset: u64, len: u64) -> Result<Vec<u8>, StoreError> {
        self.inner.get_range(key, offset, len)
    }
    fn delete(&self, key: &str) -> Result<(), StoreError> {
        self.inner.delete(key)
    }
    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, StoreError> {
        let r = self.inner.list(prefix);
        if prefix == "seg/" {
            let n = self.listings.fetch_add(1, Ordering::SeqCst);
            (self.hook.lock().unwrap())(n);
        }
        r
    }
}

/// Finding 1 (medium): a take whose pin lapsed during its checks chooses again under the SAME
/// pin key (`readers/OWNER`, one owner per take: readers.rs `pin_choice`, 447-456). A writer's
/// delete round that listed the pins while the first pin had lapsed holds that key among
/// `pins.expired` and deletes it after its listing (segments.rs 1447 and 1476, also a start's
/// `plan_sweep`/`run_sweep`, 1046 and 1084), blind: the delete removes the take's fresh pin.
/// The reader never learns (`unbroken` tracks only its own puts), so the take returns the
/// choice, with no pin in the store, and the writer's next two uploads delete it and what
/// only it names under the mount (EIO for every segment not cached, nothing said).
///
/// Here: the pin lasts 600 s (the renewer's tick, 120 s, never comes); the newest checkpoint
/// is pinned and listed whole; during that listing the clock passes the pin's expiry and a
/// writer's delete round lists the pins (`readers::pins`, as segments.rs 1447 does) and finds
/// it expired; the take sees the lapse and pins the newest checkpoint again, under the same
/// key; during its second listing the writer's round deletes what it found expired (the key),
/// then the writer uploads twice. The take returns the checkpoint; the probe asserts it and
/// every object it names are still in the store (a fresh key per choice, or the key checked
/// after the checks, would keep them).
#[test]
fn a_retaken_pin_deleted_by_a_writer_that_saw_it_expired_is_returned() {
    let seed = seed();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let inner: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let clock = TestClock::default();
    let writer = Arc::new(Mutex::new(Writer::start(inner.clone(), &clock)));
    for _ in 0..3 {
        writer.lock().unwrap().round(&mut rng);
    }
    let expired_seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let hook: Hook = {
        let inner = inner.clone();
        let clock = clock.clone();
        let writer = writer.clone();
        let expired_seen = expired_seen.clone();
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x45);
        Box::new(move |n| match n {
            0 => {
                // The pin lapses; a writer's delete round lists the pins meanwhile.
                writer.lock().unwrap().advance(&clock, 601);
                let p = ldfs::store::readers::pins(&*inner, clock.now()).unwrap();
                assert_eq!(
                    p.expired.len(),
                    1,
                    "the reader's pin is expired for the writer"
                );
                *expired_seen.lock().unwrap() = p.expired;
            }
            1 => {
                // That round's delete of what it found expired lands after the re-pin; then
                // two uploads, each with its delete round.
                for k in expired_seen.lock().unwrap().iter() {
                    inner.delete(k).unwrap();
                }
                let mut w = writer.lock().unwrap();
                w.round(&mut rng);
                w.round(&mut rng);
            }
            _ => {}
        })
    };
    let store = Arc::new(HookedSegListing {
        inner: inner.clone(),
        hook: Mutex::new(hook),
        listings: AtomicU32::new(0),
    });
    let opts = PinOptions {
        duration: Duration::from_secs(600),
        clock: clock.clock(),
        host: "reader".into(),
        pid: std::process::id(),
    };
    let (pin, key, obj) = ReaderPin::take(store.clone(), opts).unwrap();
    assert_eq!(
        store.listings.load(Ordering::SeqCst),
        2,
        "the take chose again once ({})",
        replay(seed)
    );
    // The take returned: its pin must be in the store, live, naming its choice.
    let pinned = ldfs::store::readers::pins(&*inner, clock.now()).unwrap();
    // What the writer's delete round (after its last upload, running on) does without it.
    let gone = || -> Vec<String> {
        std::iter::once(key.clone())
            .chain(obj.entries.iter().map(|e| e.key()))
            .filter(|k| matches!(inner.get(k), Err(StoreError::NotFound { .. })))
            .collect()
    };
    let mut missing = gone();
    for _ in 0..100 {
        if pinned.checkpoints.contains(&key) || !missing.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
        missing = gone();
    }
    assert!(
        pinned.checkpoints.contains(&key),
        "the take returned {key}, but no live pin in the store names it (pins: {pinned:?}); \
         the writer deleted {} of it and the objects it names ({:?}...) ({})",
        missing.len(),
        &missing[..missing.len().min(3)],
        replay(seed)
    );
    assert!(missing.is_empty(), "{missing:?} ({})", replay(seed));
    pin.release().unwrap();
    drop(pin);
    drop(store);
    let w = Arc::try_unwrap(writer).ok().unwrap().into_inner().unwrap();
    w.seg.stop();
}

/// The reader's puts of its pin counted (the renewer's among them).
struct CountingPins {
    inner: Arc<dyn ObjectStore>,
    pin_puts: AtomicU32,
    hook: Mutex<Hook>,
}

impl ObjectStore for CountingPins {
    fn put(&self, key: &str, bytes: &[u8]) -> Result<(), StoreError> {
        let r = self.inner.put(key, bytes);
        if key.starts_with("readers/") {
            self.pin_puts.fetch_add(1, Ordering::SeqCst);
        }
        r
    }
    fn put_if_absent(&self, key: &str, bytes: &[u8]) -> Result<PutOutcome, StoreError> {
        self.inner.put_if_absent(key, bytes)
    }
    fn get(&self, key: &str) -> Result<Vec<u8>, StoreError> {
        self.inner.get(key)
    }
    fn get_range(&self, key: &str, offset: u64, len: u64) -> Result<Vec<u8>, StoreError> {
        self.inner.get_range(key, offset, len)
    }
    fn delete(&self, key: &str) -> Result<(), StoreError> {
        self.inner.delete(key)
    }
    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, StoreError> {
        let r = self.inner.list(prefix);
        if prefix == "seg/" {
            (self.hook.lock().unwrap())(0);
        }
        r
    }
}

/// Finding 3 (low): the renewal's lapse test is a second early against the writer's. The
/// writer keeps a pin while `expires_secs >= now` (readers.rs 163), so a renewal that lands in
/// the second `expires_secs` itself replaced a pin every writer still counted live; but
/// `renew_once` (readers.rs 477) takes `landed >= was` as a lapse: during a take it clears
/// `unbroken` and the take chooses again for nothing; while serving it says "renewed 0 s after
/// it expired: the writer may have deleted segments" when it cannot have.
///
/// Here: a 5 s pin (the renewer every second); during the first listing of `seg/` the clock
/// moves to the pin's expiry second exactly and the renewer renews once; the writer's test
/// still counts the old pin live then (checked), yet the take chooses again.
#[test]
fn a_renewal_in_the_expiry_second_is_taken_for_a_lapse() {
    let seed = seed();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let inner: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let wclock = TestClock::default();
    let mut w = Writer::start(inner.clone(), &wclock);
    for _ in 0..3 {
        w.round(&mut rng);
    }
    w.seg.stop();
    let clock = TestClock::default();
    let listings = Arc::new(AtomicU32::new(0));
    let live_at_expiry = Arc::new(Mutex::new(None));
    let store = Arc::new_cyclic(|weak: &std::sync::Weak<CountingPins>| {
        let weak = weak.clone();
        let clock = clock.clone();
        let listings = listings.clone();
        let live_at_expiry = live_at_expiry.clone();
        let inner2 = inner.clone();
        let hook: Hook = Box::new(move |_| {
            if listings.fetch_add(1, Ordering::SeqCst) != 0 {
                return;
            }
            let me = weak.upgrade().unwrap();
            clock.advance(5); // now == the first pin's expiry
                              // The writer's view: still live in this second.
            let p = ldfs::store::readers::pins(&*inner2, clock.now()).unwrap();
            *live_at_expiry.lock().unwrap() = Some(p.checkpoints.len());
            let before = me.pin_puts.load(Ordering::SeqCst);
            for _ in 0..100 {
                if me.pin_puts.load(Ordering::SeqCst) > before {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            assert!(
                me.pin_puts.load(Ordering::SeqCst) > before,
                "no renewal in 5 s"
            );
        });
        CountingPins {
            inner: inner.clone(),
            pin_puts: AtomicU32::new(0),
            hook: Mutex::new(hook),
        }
    });
    let opts = PinOptions {
        duration: Duration::from_secs(5),
        clock: clock.clock(),
        host: "reader".into(),
        pid: std::process::id(),
    };
    let (pin, _, _) = ReaderPin::take(store.clone(), opts).unwrap();
    assert_eq!(
        *live_at_expiry.lock().unwrap(),
        Some(1),
        "the writer counts the pin live in its expiry second ({})",
        replay(seed)
    );
    assert_eq!(
        listings.load(Ordering::SeqCst),
        1,
        "the take chose again though its pin never lapsed by the writer's test ({})",
        replay(seed)
    );
    pin.release().unwrap();
}

/// Finding 4 (low, the test API): `renew_now` after `release` puts the pin back (renew_once,
/// readers.rs 465-472, does not look at `stop`), and nothing deletes it again: the writer keeps
/// the checkpoint a whole duration for an unmounted reader.
#[test]
fn renew_now_after_release_puts_the_pin_back() {
    let seed = seed();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let inner: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let clock = TestClock::default();
    let mut w = Writer::start(inner.clone(), &clock);
    for _ in 0..3 {
        w.round(&mut rng);
    }
    w.seg.stop();
    let opts = PinOptions {
        duration: Duration::from_secs(60),
        clock: clock.clock(),
        host: "reader".into(),
        pid: std::process::id(),
    };
    let (pin, _, _) = ReaderPin::take(inner.clone(), opts).unwrap();
    pin.release().unwrap();
    let _ = pin.renew_now();
    let left = inner.list("readers/").unwrap();
    assert!(
        left.is_empty(),
        "a released pin was put back: {left:?} ({})",
        replay(seed)
    );
}
