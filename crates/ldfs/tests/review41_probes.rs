//! Review 41 probes (store5): superblock copy 1 on a device larger than the file system, and the
//! lease a refused mount gives back. Each fails if the defect it names exists; those that fail
//! now are `#[ignore]`d with the finding's number.

use std::sync::Arc;

use ldfs::device::{Device, MemoryDevice};
use ldfs::lld::layout::{copy1_addr, Geometry, MkfsOptions};
use ldfs::lld::{Lld, LldOptions, PAGE_BYTES};
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

/// Review 41 finding 4: store5 made "copy 1 is at the device's last page, whatever the flags"
/// the rule (FORMAT.md; `layout::copy1_addr`; the rebuild and fsck's repair write it there), but
/// lld's own repair at every writable open, `resize::settle_superblocks`, still writes copy 1
/// at the geometry's last page (`resize::write_superblock`: `g.total_pages - 1`) while it reads
/// it at the device's last page. On a device larger than a file system without RESIZE (an image
/// written to a larger disk; a store cache rebuilt there by a binary from before f140350) the
/// device's last page holds no copy 1; each open "repairs" it where no one reads it, and the
/// file system stays one lost page 0 from unopenable (and a store mount from taking its cache
/// for an empty one: `cache_superblock` finds no copy 1 either).
#[test]
fn a_writable_open_repairs_copy_1_where_it_is_read_on_a_larger_device() {
    let small = 32u64 << 20;
    let img = MemoryDevice::new(small);
    let g = ldfs::lld::mkfs::mkfs(
        &img,
        &MkfsOptions {
            fs_id: 0x4141,
            ..MkfsOptions::default()
        },
    )
    .unwrap();
    assert!(
        !g.resizable(),
        "the probe needs a file system without RESIZE"
    );
    // The image written to a device twice its size.
    let mut bytes = vec![0u8; 2 * small as usize];
    img.read_at(&mut bytes[..small as usize], 0).unwrap();
    let dev = Arc::new(MemoryDevice::from_vec(bytes));
    let lld = Lld::open(dev.clone(), LldOptions::default()).unwrap();
    lld.close().unwrap();
    drop(lld);
    let last = copy1_addr(dev.size_bytes());
    let mut page = vec![0u8; PAGE_BYTES];
    dev.read_at(&mut page, last).unwrap();
    assert!(
        Geometry::decode_superblock(&page, last, dev.size_bytes()).is_ok(),
        "after a writable open (which settles the superblocks) the device's last page, where \
         open, fsck and the store mount read copy 1, holds none"
    );
    // And the file system survives page 0 lost.
    dev.write_at(&vec![0u8; PAGE_BYTES], 0).unwrap();
    let r = Lld::open(dev.clone(), LldOptions::default());
    assert!(r.is_ok(), "page 0 lost: {:?}", r.err());
}

/// Review 41's smaller note: a mount giving back a lease another writer took meanwhile (its
/// give-back finds the next generation taken) said "given back" all the same. It must not
/// claim it gave back what was not its own.
#[test]
fn a_give_back_after_a_takeover_does_not_say_given_back() {
    use ldfs::testing::store::{take_lease, TestClock};
    let store: std::sync::Arc<dyn ldfs::store::ObjectStore> =
        std::sync::Arc::new(ldfs::store::MemoryStore::new());
    let clock = TestClock::default();
    // A's renewer runs every fifth of its 60 s: it has not noticed B by the give-back.
    let a = take_lease(store.clone(), &clock, false);
    clock.advance(61);
    let _b = take_lease(store.clone(), &clock, true);
    let said = a.give_back().unwrap();
    assert!(said.contains("another writer took the lease"), "{said}");
}
