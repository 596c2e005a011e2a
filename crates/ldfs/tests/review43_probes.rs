//! Review 43's probes of 3b04d21 (review 42's findings fixed: `readers::pinned_unknown`,
//! `choose_and_pin`). Each probe fails while the defect its doc comment names is there.

mod readers_common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use ldfs::store::readers::ReaderPin;
use ldfs::store::{MemoryStore, ObjectStore, StoreError, StoreOp};
use ldfs::testing::store::{HookStore, TestClock, When};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use readers_common::{
    checkpoints, named_by, once, pin_opts, pin_opts_by, read_errors, reader, replay_in, seed,
    seg_listing_takes, segment_objects, Late, Writer,
};

fn replay(seed: u64) -> String {
    replay_in("review43_probes", seed)
}

/// A store that runs `f` once, at the first listing of `seg/` after a listing of the pins: in a
/// start, `run_sweep`'s listing of the segment objects, after `plan_sweep` listed the pins.
fn after_pins_at_seg_listing(
    inner: Arc<dyn ObjectStore>,
    f: Box<dyn FnOnce() + Send>,
) -> HookStore {
    let pins_listed = AtomicBool::new(false);
    let at = move |op, key: &str, when| {
        if (op, when) != (StoreOp::List, When::Before) {
            return false;
        }
        if key == "readers/" {
            pins_listed.store(true, Ordering::SeqCst);
        }
        key == "seg/" && pins_listed.load(Ordering::SeqCst)
    };
    HookStore::new(inner, once(at, f))
}

/// Finding 1 (sweep window, after the pins listing). The fix keeps a pinned late checkpoint
/// only if the pin is in the start's pin listing (`plan_sweep`). A stale writer's late
/// checkpoint (and its segment objects) landing after the start's listing of `ckpt/`, and a
/// reader pinning it after the start's listing of `readers/` but before `run_sweep` deleted
/// the unnamed segment objects: the reader's checks all pass (the late checkpoint is the
/// newest listed, the new writer has put none yet; every object it names is listed, the
/// sweep has not deleted them yet), and `choose_and_pin` returns it. The sweep then deletes
/// the late checkpoint's own segment objects (named by no checkpoint it kept) under the pin,
/// and the running writer's `pinned_unknown` adopts the checkpoint only afterwards.
/// Checking completeness under the pin does not close this: the writer's deletes were
/// decided before the pin, and land after the reader's check.
#[test]
fn a_pin_after_a_starts_pin_listing_loses_the_late_checkpoints_objects_to_the_sweep() {
    let seed = seed();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let clock = TestClock::default();
    // B takes over from the checkpoint before; A's in-flight puts land, and a reader pins,
    // once B's start listed the pins and before it lists (and sweeps) the segment objects.
    let (late, land) = Late::new(&store, &clock, &mut rng);
    let wrapped: Arc<dyn ObjectStore> = Arc::new(after_pins_at_seg_listing(store.clone(), land));
    let (lists, before) = (late.lists.clone(), late.before.clone());
    let mut b = Writer::take_over_restoring(wrapped, &*store, &clock, lists, before, || {});
    let (pin, key, obj) = late.pinned(&replay(seed));
    // What the reader then opens (a cache of two segments: the rest is fetched as read): its
    // lazy rebuild fetches what the checkpoint's slot needs.
    let segs = segment_objects(&*store);
    let missing_at_start = late.named.difference(&segs).count();
    let opened = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        reader(store.clone(), dir.path(), &key, &obj, 2)
    }));
    for round in 0..4 {
        b.round(&mut rng, round % 2 == 1);
    }
    let segs = segment_objects(&*store);
    let missing = late.named.difference(&segs).count();
    let read_errors = match &opened {
        Ok(r) => read_errors(r, &late.lists, &late.model, &replay(seed)),
        Err(_) => 0,
    };
    let open_failed = opened.is_err();
    drop(opened);
    pin.release().unwrap();
    b.seg.stop();
    assert!(
        missing_at_start == 0 && missing == 0,
        "the pin was taken after B's start listed the pins and before its sweep deleted: of the \
         {} objects the pinned checkpoint {key} names, {missing_at_start} were gone once B \
         started, {missing} after its rounds; the reader's rebuild failed: {}, then {read_errors} \
         reads failed ({})",
        late.named.len(),
        open_failed,
        replay(seed)
    );
}

/// A store whose GET of a pin object is refused (403): the pin's owner is another user whose
/// objects the writer may not read (objects owned by their uploader, the read-only mount's
/// credentials not the writer's).
fn pins_unreadable(inner: Arc<dyn ObjectStore>) -> HookStore {
    HookStore::new(inner, |op, key, when| {
        if (op, when) == (StoreOp::Get, When::Before) && key.starts_with("readers/") {
            return Err(StoreError::Refused {
                op: StoreOp::Get,
                key: key.into(),
                status: 403,
                detail: "probe: another user's object".into(),
            });
        }
        Ok(())
    })
}

/// Finding 3's fix, the other way round. A pin the writer may not read now "pins nothing":
/// the writer goes on, and deletes the checkpoint a live reader pinned, with what only it
/// names, under that reader. The refusal says nothing of the pin's checkpoint or its expiry,
/// and a reader whose credentials are not the writer's is the case finding 3 named; keeping
/// every checkpoint while such a pin object is listed (or young, by its listing's time) would
/// keep the reader's.
#[test]
fn a_pin_the_writer_may_not_read_lets_it_delete_under_the_reader() {
    let seed = seed();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let wrapped: Arc<dyn ObjectStore> = Arc::new(pins_unreadable(store.clone()));
    let clock = TestClock::default();
    let mut a = Writer::start(wrapped, &clock, false);
    for r in 0..3 {
        a.round(&mut rng, r == 1);
    }
    let (pin, key, _obj) = ReaderPin::take(store.clone(), pin_opts()).unwrap();
    let pinned_named = named_by(&*store, &key);
    for r in 0..4 {
        a.round(&mut rng, r % 2 == 0);
    }
    let segs = segment_objects(&*store);
    let missing = pinned_named.difference(&segs).count();
    let listed = checkpoints(&*store).contains(&key);
    pin.release().unwrap();
    a.seg.stop();
    assert!(
        listed && missing == 0,
        "the writer, refused the pin object, deleted under its live pin: checkpoint {key} \
         listed: {listed}; {missing} of the {} objects it names gone ({})",
        pinned_named.len(),
        replay(seed)
    );
}

/// `choose_and_pin` puts the pin (expiry: now + duration) and then checks the choice, and
/// returns it without looking whether the pin is still live: a check that outlasts the pin's
/// duration (the listing of every segment object, review 42 finding 4's "seconds in a large
/// store", plus up to half the duration of patience for each of three calls) returns a pin a
/// writer already ignores (`readers::pins` drops it as expired), so the checkpoint it "keeps"
/// and what only it names may be deleted before the renewer's first renewal, a fifth of the
/// duration later. Re-putting the pin (or checking its expiry) before returning closes it.
#[test]
fn a_take_whose_check_outlasts_the_pin_returns_an_expired_pin() {
    let seed = seed();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let clock = TestClock::default();
    let mut a = Writer::start(store.clone(), &clock, false);
    for r in 0..3 {
        a.round(&mut rng, r == 1);
    }
    // A check that outlasts the pin (61 s against 60) can never return a live pin: the take
    // chooses again and, every listing as slow, fails, leaving no pin. One that takes a third
    // of it returns a pin renewed at its end. (The lead's change of this probe, after the fix:
    // before it, the take returned the expired pin in both cases.)
    for secs in [61, 20] {
        // A listing of `seg/` that takes `secs` by `clock` (a large store's listing, or one
        // retried patiently through 503s: `choose_and_pin` waits up to half the pin's duration
        // for each of its listing of `ckpt/`, its get and its listing of `seg/`).
        let slow: Arc<dyn ObjectStore> =
            Arc::new(seg_listing_takes(store.clone(), clock.clone(), secs));
        let opts = pin_opts_by(&clock, 60);
        match ReaderPin::take(slow, opts) {
            Ok((pin, key, _obj)) => {
                let live = ldfs::store::readers::pins(&*store, clock.now()).unwrap();
                assert!(
                    live.checkpoints.contains(&key) && secs == 20,
                    "ReaderPin::take returned {key} with a pin a writer now takes for expired \
                     (listing {secs} s; {})",
                    replay(seed)
                );
                drop(pin);
            }
            Err(e) => {
                assert_eq!(secs, 61, "a listing of {secs} s failed the take: {e}");
                assert!(
                    store.list("readers/").unwrap().is_empty(),
                    "a failed take left its pin"
                );
            }
        }
    }
    a.seg.stop();
}
