//! Review 44's probes of 3d48bba (review 43's findings fixed: the start's deferred sweep,
//! unreadable pins, `readers_checkpoint_gone`, `choose_and_pin`'s renewal). Each probe fails
//! while the defect its doc comment names is there.

mod readers_common;

use std::sync::Arc;

use ldfs::store::readers::ReaderPin;
use ldfs::testing::store::TestClock;
use readers_common::{pin_opts_by, replay_in, seed, seg_listing_takes, uploaded};

fn replay(seed: u64) -> String {
    replay_in("review44_probes", seed)
}

// Finding A (review 43 finding 4's fix: a take whose final renewal, retried through 503s,
// landed after the pin's first expiry returned it) had its probe here until 61c2bcb. The take
// no longer renews at its end: the renewer runs from the first pin, and a renewal that lands
// after the expiry it replaced makes the take choose again. That probe's refusals targeted
// the final renewal, which no longer exists, so it could not fail; the condition is now
// checked by `store_readers::a_take_whose_pin_lapsed_during_its_checks_chooses_again` (a late
// renewal) and `review45_probes` (the expiry second).

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
