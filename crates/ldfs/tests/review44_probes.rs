//! Review 44's probes of 3d48bba (review 43's findings fixed: the start's deferred sweep,
//! unreadable pins, `readers_checkpoint_gone`, `choose_and_pin`'s renewal). Each probe fails
//! while the defect its doc comment names is there.

mod readers_common;

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use ldfs::store::readers::ReaderPin;
use ldfs::store::{ObjectStore, StoreError, StoreOp, StoreResult};
use ldfs::testing::store::{HookStore, TestClock, When};
use readers_common::{pin_opts_by, replay_in, seed, seg_listing_takes, uploaded};

fn replay(seed: u64) -> String {
    replay_in("review44_probes", seed)
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

impl SlowRenewal {
    /// `inner` with this hook (the state stays with the probe).
    fn store(self: &Arc<Self>) -> HookStore {
        let me = self.clone();
        HookStore::new(self.inner.clone(), move |op, key, when| {
            me.hook(op, key, when)
        })
    }

    fn hook(&self, op: StoreOp, key: &str, when: When) -> StoreResult<()> {
        if op == StoreOp::List && key == "seg/" && when == When::After {
            self.clock.advance(50);
        }
        if op != StoreOp::Put || !key.starts_with("readers/") {
            return Ok(());
        }
        if when == When::After {
            let live = ldfs::store::readers::pins(&*self.inner, self.clock.now()).unwrap();
            *self.pinned.lock().unwrap() = live.checkpoints.iter().next_back().cloned();
            return Ok(());
        }
        if self.pin_puts.load(Ordering::SeqCst) == 1 && self.refusals.load(Ordering::SeqCst) < 3 {
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
        Ok(())
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
    let clock = TestClock::default();
    let (store, _writer) = uploaded(seed, &clock, |w, rng, _| w.write_round(rng));
    let slow = Arc::new(SlowRenewal {
        inner: store.clone(),
        clock: clock.clone(),
        pin_puts: AtomicU32::new(0),
        refusals: AtomicU32::new(0),
        lapsed: AtomicBool::new(false),
        puts_since_lapse: AtomicU32::new(0),
        pinned: Mutex::new(None),
    });
    let taken = ReaderPin::take(Arc::new(slow.store()), pin_opts_by(&clock, 60));
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
    let clock = TestClock::default();
    let (store, _writer) = uploaded(seed, &clock, |w, rng, _| w.write_round(rng));
    // The take's listing of `seg/` takes 55 s by `clock` (a large store's listing).
    let slow = Arc::new(seg_listing_takes(store.clone(), clock.clone(), 55));
    match ReaderPin::take(slow, pin_opts_by(&clock, 60)) {
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
