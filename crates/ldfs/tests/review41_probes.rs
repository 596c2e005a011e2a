//! Review 41 probes (store5): the lease a refused mount gives back. Guards: each fails if the
//! give-back could take or free a lease another writer took meanwhile.

use ldfs::store::lease::{acquire, acquire_over, current, give_back, renew, LeaseRecord};
use ldfs::store::MemoryStore;

fn rec(owner: u64, expires_secs: u64, host: &str) -> LeaseRecord {
    LeaseRecord {
        owner,
        expires_secs,
        pid: 41,
        host: host.to_string(),
    }
}

/// A refused mount partitioned long enough for its lease to expire and be taken over (and
/// renewed, so the generation after the refused mount's is deleted: only the newest two are
/// kept) gives back afterwards, free or as found: the taker's lease stays the lease, not
/// released, not expired, renewable.
#[test]
fn a_late_give_back_never_frees_or_expires_a_lease_another_writer_took() {
    for taken_over in [false, true] {
        let s = MemoryStore::new();
        if taken_over {
            // An unreleased holder the refused mount took over with force.
            acquire_over(&s, rec(1, 1_000, "beta"), 900, false).unwrap();
        }
        let now = if taken_over { 1_001 } else { 900 };
        let (c, over) = acquire_over(&s, rec(2, now + 100, "gamma"), now, taken_over).unwrap();
        assert_eq!(over.is_some(), taken_over);
        // gamma is partitioned; its lease expires; delta takes it over and renews twice.
        let d = acquire(&s, rec(3, now + 500, "delta"), now + 101, true).unwrap();
        let d = renew(&s, &d, now + 600).unwrap();
        let d = renew(&s, &d, now + 700).unwrap();
        // gamma's refusal gives the lease back, late.
        let _ = give_back(&s, &c, over.as_ref());
        let (g, holder) = current(&s).unwrap().unwrap();
        assert_eq!(
            (g, holder.owner, holder.expires_secs),
            (d.generation, 3, now + 700),
            "taken_over={taken_over}: a late give-back changed delta's lease: {holder:?} at {g}"
        );
        renew(&s, &d, now + 800).expect("delta's lease is still its own");
        // And no one takes it without force while delta holds it.
        assert!(acquire(&s, rec(4, now + 900, "eps"), now + 102, false).is_err());
    }
}
