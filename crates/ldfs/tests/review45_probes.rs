//! Review 45's probes of 61c2bcb (the reader pin's renewer running during the take). Each probe
//! fails while the defect its doc comment names is there.

mod readers_common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ldfs::store::readers::ReaderPin;
use ldfs::store::{MemoryStore, ObjectStore, StoreError, StoreOp};
use ldfs::testing::store::{seed_or, HookStore, TestClock, When};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use readers_common::{keys, pin_opts_by, replay_in, uploaded, Writer};

fn seed() -> u64 {
    seed_or(20261128)
}

fn replay(seed: u64) -> String {
    replay_in("review45_probes", seed)
}

/// The reader's view of the store: each listing of `seg/` is taken, then `hook` runs with its
/// number (from 0, counted in `listings`) before the listing is returned: what a writer does
/// while the reader's answer is on its way.
fn hooked_seg_listing(
    inner: Arc<dyn ObjectStore>,
    listings: Arc<AtomicU32>,
    hook: impl FnMut(u32) + Send + 'static,
) -> HookStore {
    let hook = Mutex::new(hook);
    HookStore::new(inner, move |op, key, when| {
        if (op, key, when) == (StoreOp::List, "seg/", When::After) {
            let n = listings.fetch_add(1, Ordering::SeqCst);
            (hook.lock().unwrap())(n);
        }
        Ok(())
    })
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
    let writer = Arc::new(Mutex::new(Writer::start(inner.clone(), &clock, false)));
    for _ in 0..3 {
        writer.lock().unwrap().round(&mut rng, false);
    }
    let expired_seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let listings = Arc::new(AtomicU32::new(0));
    let hook = {
        let inner = inner.clone();
        let clock = clock.clone();
        let writer = writer.clone();
        let expired_seen = expired_seen.clone();
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x45);
        move |n: u32| match n {
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
                w.round(&mut rng, false);
                w.round(&mut rng, false);
            }
            _ => {}
        }
    };
    let store = Arc::new(hooked_seg_listing(inner.clone(), listings.clone(), hook));
    let (pin, key, obj) = ReaderPin::take(store.clone(), pin_opts_by(&clock, 600)).unwrap();
    assert_eq!(
        listings.load(Ordering::SeqCst),
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
    let (inner, _writer) = uploaded(seed, &TestClock::default(), |w, rng, _| w.round(rng, false));
    let clock = TestClock::default();
    let listings = Arc::new(AtomicU32::new(0));
    let live_at_expiry = Arc::new(Mutex::new(None));
    // The reader's puts of its pin counted (the renewer's among them).
    let pin_puts = Arc::new(AtomicU32::new(0));
    let counting = {
        let pin_puts = pin_puts.clone();
        HookStore::new(inner.clone(), move |op, key, when| {
            if (op, when) == (StoreOp::Put, When::After) && key.starts_with("readers/") {
                pin_puts.fetch_add(1, Ordering::SeqCst);
            }
            Ok(())
        })
    };
    let hook = {
        let clock = clock.clone();
        let live_at_expiry = live_at_expiry.clone();
        let inner = inner.clone();
        move |n: u32| {
            if n != 0 {
                return;
            }
            clock.advance(5); // now == the first pin's expiry
                              // The writer's view: still live in this second.
            let p = ldfs::store::readers::pins(&*inner, clock.now()).unwrap();
            *live_at_expiry.lock().unwrap() = Some(p.checkpoints.len());
            let before = pin_puts.load(Ordering::SeqCst);
            for _ in 0..100 {
                if pin_puts.load(Ordering::SeqCst) > before {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            assert!(
                pin_puts.load(Ordering::SeqCst) > before,
                "no renewal in 5 s"
            );
        }
    };
    let store = Arc::new(hooked_seg_listing(
        Arc::new(counting),
        listings.clone(),
        hook,
    ));
    let opts = pin_opts_by(&clock, 5);
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
    let clock = TestClock::default();
    let (inner, _writer) = uploaded(seed, &clock, |w, rng, _| w.round(rng, false));
    let (pin, _, _) = ReaderPin::take(inner.clone(), pin_opts_by(&clock, 60)).unwrap();
    pin.release().unwrap();
    let _ = pin.renew_now();
    let left = keys(&*inner, "readers/");
    assert!(
        left.is_empty(),
        "a released pin was put back: {left:?} ({})",
        replay(seed)
    );
}
