//! Review 44's probes of 3d48bba (review 43's findings fixed: the start's deferred sweep,
//! unreadable pins, `readers_checkpoint_gone`, `choose_and_pin`'s renewal). Each probe fails
//! while the defect its doc comment names is there.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ldfs::device::{Device, MemoryDevice};
use ldfs::ld::{ListHints, ListId, LogicalDisk};
use ldfs::lld::layout::MkfsOptions;
use ldfs::lld::{Lld, LldOptions};
use ldfs::store::readers::{PinOptions, ReaderPin};
use ldfs::store::{
    HeldLease, MemoryStore, ObjectInfo, ObjectStore, PutOutcome, SegmentStore, StoreError, StoreOp,
};
use ldfs::testing::store::{fast_backoff, take_lease, TestClock};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const DEV_BYTES: u64 = 24 << 20;
const SEGMENT_BYTES: u64 = 128 << 10;

fn mkfs_opts() -> MkfsOptions {
    MkfsOptions {
        segment_bytes: SEGMENT_BYTES,
        max_block_bytes: 32 << 10,
        reserved_segments: Some(4),
        fs_id: 2026,
        max_bytes: None,
        kept_pages: 0,
    }
}

fn seed() -> u64 {
    std::env::var("LDFS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20261127)
}

fn replay(seed: u64) -> String {
    format!(
        "seed {seed}; replay: LDFS_SEED={seed} cargo test --release -p ldfs --test review44_probes"
    )
}

struct Writer {
    lld: Lld,
    seg: SegmentStore,
    _lease: Arc<HeldLease>,
    lists: Vec<ListId>,
}

impl Writer {
    fn start(store: Arc<dyn ObjectStore>, clock: &TestClock) -> Writer {
        let dev: Arc<dyn Device> = Arc::new(MemoryDevice::new(DEV_BYTES));
        ldfs::lld::mkfs::mkfs(&*dev, &mkfs_opts()).unwrap();
        let lease = take_lease(store.clone(), clock, false);
        let seg = SegmentStore::start(store, dev, lease.clone(), fast_backoff()).unwrap();
        let lld = Lld::open(
            seg.device(),
            LldOptions {
                checkpoint_hook: Some(seg.hook()),
                segment_hook: Some(seg.segment_hook()),
                ..LldOptions::default()
            },
        )
        .unwrap();
        let lists = (0..4)
            .map(|_| lld.create_list(None, ListHints::default()).unwrap())
            .collect();
        Writer {
            lld,
            seg,
            _lease: lease,
            lists,
        }
    }

    fn round(&mut self, rng: &mut ChaCha8Rng) {
        for _ in 0..300 {
            let l = self.lists[rng.gen_range(0..self.lists.len())];
            let i = rng.gen_range(0..60u64);
            let v: Vec<u8> = (0..rng.gen_range(1..9000)).map(|_| rng.gen()).collect();
            self.lld.write(None, l, i, &v).unwrap();
        }
        self.lld.checkpoint_now().unwrap();
        self.seg
            .wait_uploaded(self.seg.announced(), Duration::from_secs(60))
            .unwrap();
    }
}

/// A store whose listing of `seg/` takes 50 s by `clock` (the take's completeness check), and
/// whose second put of a pin (the take's renewal) is answered 503 three times, 5 s each by
/// `clock`, before it lands (`patiently` retries it for up to half the pin's duration). At
/// each 503 it notes whether a writer listing the pins then (`readers::pins` at `clock`'s now,
/// as the delete round does) still finds the pinned checkpoint kept.
struct SlowRenewal {
    inner: Arc<dyn ObjectStore>,
    clock: TestClock,
    pin_puts: AtomicU32,
    refusals: AtomicU32,
    lapsed: AtomicBool,
    /// Pin puts landed since the lapse: 1, the late renewal only (the pin returned).
    puts_since_lapse: AtomicU32,
    pinned: Mutex<Option<String>>,
}

impl ObjectStore for SlowRenewal {
    fn put(&self, key: &str, bytes: &[u8]) -> Result<(), StoreError> {
        if key.starts_with("readers/") {
            if self.pin_puts.load(Ordering::SeqCst) == 1 && self.refusals.load(Ordering::SeqCst) < 3
            {
                self.refusals.fetch_add(1, Ordering::SeqCst);
                self.clock.advance(5);
                let live = ldfs::store::readers::pins(&*self.inner, self.clock.now()).unwrap();
                let ck = self.pinned.lock().unwrap().clone().unwrap();
                if !live.checkpoints.contains(&ck) {
                    self.lapsed.store(true, Ordering::SeqCst);
                    self.puts_since_lapse.store(0, Ordering::SeqCst);
                }
                return Err(StoreError::Unavailable {
                    op: StoreOp::Put,
                    key: key.into(),
                    reason: "503 SlowDown (probe)".into(),
                });
            }
            self.pin_puts.fetch_add(1, Ordering::SeqCst);
            self.puts_since_lapse.fetch_add(1, Ordering::SeqCst);
            let rec = self.inner.put(key, bytes);
            let live = ldfs::store::readers::pins(&*self.inner, self.clock.now()).unwrap();
            *self.pinned.lock().unwrap() = live.checkpoints.iter().next_back().cloned();
            return rec;
        }
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
            self.clock.advance(50);
        }
        r
    }
}

/// Finding A (review 43 finding 4's fix, `choose_and_pin`, readers.rs ~414-426). The take
/// checks the pin's expiry with a margin of a tenth of its duration (6 s of 60) and then
/// re-puts it through `patiently`, which retries 503s for up to half the duration (30 s). A
/// renewal that lands after the margin is used up (here 15 s of 503s, after checks that took
/// 50 s) lands after the first pin expired: meanwhile a writer's delete round
/// (`readers::pins`, then `retained`) did not keep the checkpoint, and may have deleted it and
/// what only it names. The take still returns the pin as if it had held throughout; the fix:
/// after the renewal lands, check that it landed before the first pin's expiry (less the
/// margin), else choose again.
#[test]
fn a_take_whose_renewal_lands_after_the_pin_expired_returns_it() {
    let seed = seed();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let clock = TestClock::default();
    let mut a = Writer::start(store.clone(), &clock);
    for _ in 0..3 {
        a.round(&mut rng);
    }
    a.seg.stop();
    let slow = Arc::new(SlowRenewal {
        inner: store.clone(),
        clock: clock.clone(),
        pin_puts: AtomicU32::new(0),
        refusals: AtomicU32::new(0),
        lapsed: AtomicBool::new(false),
        puts_since_lapse: AtomicU32::new(0),
        pinned: Mutex::new(None),
    });
    let opts = PinOptions {
        duration: Duration::from_secs(60),
        clock: clock.clock(),
        host: "reader".into(),
        pid: std::process::id(),
    };
    let taken = ReaderPin::take(slow.clone(), opts);
    // The pin returned is the one renewed late: no fresh choice put since the lapse.
    let lapsed =
        slow.lapsed.load(Ordering::SeqCst) && slow.puts_since_lapse.load(Ordering::SeqCst) == 1;
    match taken {
        Ok((pin, key, _obj)) => {
            drop(pin);
            assert!(
                !lapsed,
                "ReaderPin::take returned {key}, whose pin a writer took for expired while the \
                 take's renewal was retried ({})",
                replay(seed)
            );
        }
        Err(e) => panic!("the take failed: {e} ({})", replay(seed)),
    }
}

/// A store whose listing of `seg/` takes `secs` by `clock` (a large store's listing).
struct SlowSegListing {
    inner: Arc<dyn ObjectStore>,
    clock: TestClock,
    secs: u64,
}

impl ObjectStore for SlowSegListing {
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
            self.clock.advance(self.secs);
        }
        r
    }
}

/// Finding B (review 43 finding 4's fix, `choose_and_pin`, readers.rs ~417). A take whose
/// checks end with its pin still live but within the margin (a tenth of the duration) of its
/// expiry chooses again instead of renewing it, and every check as slow fails the take after
/// `PIN_TRIES`. So a store whose listing of `seg/` takes 0.9 to 1.0 of the pin's duration
/// (at `lease=10`: 9 s, a few hundred thousand objects) can no longer be mounted read-only,
/// though the pin held throughout every check (here 55 s of 60: the writer's `readers::pins`
/// keeps it at the end of each). Fixed: the renewer runs from the first pin, and the take
/// returns a choice whose pin never lapsed, with no margin (`store_readers` checks the
/// renewals themselves in real time).
#[test]
fn a_take_whose_checks_end_within_the_margin_fails_though_its_pin_held() {
    let seed = seed();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let clock = TestClock::default();
    let mut a = Writer::start(store.clone(), &clock);
    for _ in 0..3 {
        a.round(&mut rng);
    }
    a.seg.stop();
    let slow: Arc<dyn ObjectStore> = Arc::new(SlowSegListing {
        inner: store.clone(),
        clock: clock.clone(),
        secs: 55,
    });
    let opts = PinOptions {
        duration: Duration::from_secs(60),
        clock: clock.clock(),
        host: "reader".into(),
        pid: std::process::id(),
    };
    match ReaderPin::take(slow, opts) {
        Ok((pin, key, _)) => {
            let live = ldfs::store::readers::pins(&*store, clock.now()).unwrap();
            assert!(
                live.checkpoints.contains(&key),
                "a take returned a lapsed pin"
            );
            drop(pin);
        }
        Err(e) => panic!(
            "a take whose every check ended with its pin live (55 s of 60) failed: {e} ({})",
            replay(seed)
        ),
    }
}
