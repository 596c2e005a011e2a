//! Review 42's probes of 53f2f7e (issue 20: read-only mounts pin their checkpoint,
//! `store::readers`). Each probe fails while the defect its doc comment names is there.
//! All five findings are fixed (the fixes' commit says where); each probe passes now.

mod readers_common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ldfs::ld::LogicalDisk;
use ldfs::store::readers::ReaderPin;
use ldfs::store::{MemoryStore, ObjectStore, StoreError, StoreOp};
use ldfs::testing::store::{HookStore, TestClock, When};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use readers_common::{
    checkpoints, keys, once, pin_opts, read_errors, read_only, reader, reader_cache, replay_in,
    seed, segment_objects, Late, Writer,
};

fn replay(seed: u64) -> String {
    replay_in("review42_probes", seed)
}

/// Finding 1. A stale writer's late checkpoint put (and the segment puts before it) land after
/// the taking-over writer's start swept (the design's own case: review 31/32). It sorts newest
/// until the new writer's first upload and is complete, so a reader pins it, and its check
/// passes (it is the newest listed). The running writer's delete rounds only weigh the pins
/// against its in-memory `named` (the checkpoints its start kept and the ones it put), which
/// lacks the late one: the pin is ignored, and the objects the pinned checkpoint shares with
/// the checkpoints the writer moves past are deleted under the reader.
#[test]
fn a_pin_on_a_checkpoint_the_running_writer_never_listed_is_ignored() {
    late_checkpoint_pinned(false);
}

/// Finding 1's other window (the lead's probe, after the fix): A's late puts and the reader's
/// pin land while B's start sweeps, after its listing of the checkpoint objects and before its
/// listing of the pins. The sweep deleted the late checkpoint's own segment objects (named by
/// no checkpoint it listed) under the reader.
#[test]
fn a_pin_landing_during_a_starts_sweep_keeps_the_late_checkpoint() {
    late_checkpoint_pinned(true);
}

/// A stale writer's late checkpoint pinned by a reader, landing after the next writer's start
/// (`during_sweep`: inside its sweep); the reader must read its tree whole while the writer
/// moves on.
fn late_checkpoint_pinned(during_sweep: bool) {
    let seed = seed();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let clock = TestClock::default();
    // B takes over: rebuilds from the store's newest (the one before) and sweeps; then, before
    // its first upload, A's in-flight puts land (its segment objects, then its checkpoint
    // object), and a reader pins.
    let (late, land) = Late::new(&store, &clock, &mut rng);
    let (lists, before) = (late.lists.clone(), late.before.clone());
    let mut b = if during_sweep {
        // `land` runs once, when the pins are first listed (inside B's start's sweep).
        let at = |op, key: &str, when| (op, key, when) == (StoreOp::List, "readers/", When::Before);
        let wrapped: Arc<dyn ObjectStore> = Arc::new(HookStore::new(store.clone(), once(at, land)));
        Writer::take_over(wrapped, &clock, lists, before, || {})
    } else {
        Writer::take_over(store.clone(), &clock, lists, before, land)
    };
    let (pin, key, obj) = late.pinned(&replay(seed));
    let r = reader(store.clone(), dir.path(), &key, &obj, 2);
    for round in 0..4 {
        b.round(&mut rng, round % 2 == 1);
    }
    let segs = segment_objects(&*store);
    let missing: Vec<&String> = late.named.difference(&segs).collect();
    let listed = checkpoints(&*store).contains(&key);
    // What the reader reads (a cache of two segments: the rest is fetched).
    let read_errors = read_errors(&r, &late.lists, &late.model, &replay(seed));
    drop(r);
    pin.release().unwrap();
    assert!(
        missing.is_empty() && listed,
        "while its pin lived, the writer deleted {} of the {} objects the pinned checkpoint {key} \
         names (checkpoint still listed: {listed}); the reader failed {read_errors} reads ({})",
        missing.len(),
        late.named.len(),
        replay(seed)
    );
}

/// A store whose listing of `ckpt/` fails once, right after the first pin put: "unavailable"
/// (one 503 at the reader's check), or with `refuse` a final refusal.
fn list_fails_after_pin(inner: Arc<dyn ObjectStore>, refuse: bool) -> HookStore {
    let armed = AtomicBool::new(false);
    HookStore::new(inner, move |op, key, when| {
        if (op, when) == (StoreOp::Put, When::After) && key.starts_with("readers/") {
            armed.store(true, Ordering::SeqCst);
        }
        if (op, key, when) == (StoreOp::List, "ckpt/", When::Before)
            && armed.swap(false, Ordering::SeqCst)
        {
            if refuse {
                return Err(StoreError::Refused {
                    op: StoreOp::List,
                    key: key.into(),
                    status: 403,
                    detail: "probe: refused".into(),
                });
            }
            return Err(StoreError::Unavailable {
                op: StoreOp::List,
                key: key.into(),
                reason: "probe: one 503".into(),
            });
        }
        Ok(())
    })
}

/// Finding 2. `ReaderPin::take` returns with `?` on an error after its pin is put (the check's
/// listing, or the next try's `newest_complete_checkpoint`): the pin is left in the store, and
/// the writer keeps that checkpoint and what it names for a whole lease duration after the
/// mount failed. One transient answer at the check also fails the mount (the put is patient,
/// the listing is not).
#[test]
fn a_take_that_fails_after_its_pin_put_leaves_the_pin() {
    let seed = seed();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mem: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let clock = TestClock::default();
    let mut w = Writer::start(mem.clone(), &clock, false);
    w.round(&mut rng, false);
    let pins = || keys(&*mem, "readers/");
    // A final refusal at the check: the take fails and leaves no pin.
    let store: Arc<dyn ObjectStore> = Arc::new(list_fails_after_pin(mem.clone(), true));
    let r = ReaderPin::take(store, pin_opts());
    assert!(
        r.is_err(),
        "a refused listing at the check: {:?}",
        r.map(|x| x.1)
    );
    assert!(pins().is_empty(), "a failed take left the pin {:?}", pins());
    // One transient answer there is retried; the pin lives until the take's pin is dropped.
    let store: Arc<dyn ObjectStore> = Arc::new(list_fails_after_pin(mem.clone(), false));
    let r = ReaderPin::take(store, pin_opts());
    assert!(
        r.is_ok(),
        "one 503 at the check failed the take: {:?}",
        r.err()
    );
    assert_eq!(pins().len(), 1);
    drop(r);
    assert!(pins().is_empty(), "a dropped pin was left: {:?}", pins());
}

/// Probe (expected sound): a reader's cache stays within its bound while it reads its whole
/// tree, and reads it exactly.
#[test]
fn a_reader_cache_stays_within_its_bound() {
    let seed = seed();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let clock = TestClock::default();
    let mut w = Writer::start(store.clone(), &clock, false);
    for r in 0..4 {
        w.round(&mut rng, r == 2);
    }
    let (pin, key, obj) = ReaderPin::take(store.clone(), pin_opts()).unwrap();
    let bound = 3u64;
    let cache = reader_cache(store.clone(), dir.path(), &key, &obj, bound);
    let r = read_only(cache.clone());
    let mut most = 0;
    for _ in 0..2 {
        for &l in &w.lists {
            for i in 0..60u64 {
                let got = r.read(l, i).unwrap();
                assert_eq!(
                    got.as_deref(),
                    w.model.get(&(l.0, i)).map(|v| v.as_slice()),
                    "({})",
                    replay(seed)
                );
                cache.shrink().unwrap();
                most = most.max(cache.stats().held_segments);
            }
        }
    }
    let st = cache.stats();
    assert!(st.misses > 0, "nothing was fetched: {st:?}");
    // The Active segment's prefix is held and never evicted: one over the bound at most.
    assert!(
        most <= bound + 1,
        "a reader's cache held {most} segments, bound {bound}: {st:?} ({})",
        replay(seed)
    );
    drop(r);
    cache.stop();
    pin.release().unwrap();
}

/// A store refusing (HTTP 403) every read of one object: a pin put by a reader whose
/// credentials the writer's cannot read (another user's object in the writer's bucket).
fn refuses_one(inner: Arc<dyn ObjectStore>, refused: String) -> HookStore {
    HookStore::new(inner, move |op, key, when| {
        if (op, when) == (StoreOp::Get, When::Before) && key == refused {
            return Err(StoreError::Refused {
                op: StoreOp::Get,
                key: key.into(),
                status: 403,
                detail: "probe: AccessDenied".into(),
            });
        }
        Ok(())
    })
}

/// Finding 3. An object under `readers/` the writer cannot read (refused, not transient) fails
/// the writer's upload for good (`pins()` returns the error, `upload` fails, the uploader is
/// failed) at its next upload with more than two checkpoint objects, and a later start
/// (`plan_sweep`) refuses to mount at all; a pin that reads but does not decode is only said
/// and ignored ("the cost of ignoring it is a reader's EIO, never the writer's data").
#[test]
fn an_unreadable_pin_object_stops_the_writers_uploads() {
    let seed = seed();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mem: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let foreign = "readers/00000000000000ff".to_string();
    let store: Arc<dyn ObjectStore> = Arc::new(refuses_one(mem.clone(), foreign.clone()));
    let clock = TestClock::default();
    let mut w = Writer::start(store.clone(), &clock, false);
    for _ in 0..2 {
        w.round(&mut rng, false);
    }
    mem.put(&foreign, b"another user's pin").unwrap();
    // Two more uploads: the first with three checkpoint objects lists the pins.
    for _ in 0..2 {
        let l = w.lists[0];
        w.lld.write(None, l, 1, &[7u8; 5000]).unwrap();
        w.lld.checkpoint_now().unwrap();
        let r = w
            .seg
            .wait_uploaded(w.seg.announced(), Duration::from_secs(20));
        assert!(
            r.is_ok() && w.seg.failed().is_none(),
            "an unreadable readers/ object failed the upload: {:?} / {:?} ({})",
            r.map_err(|e| e.to_string()),
            w.seg.failed(),
            replay(seed)
        );
    }
}

/// A store whose listing of `seg/` takes `delay` (a large store: S3 lists 1000 keys a page).
fn slow_seg_list(inner: Arc<dyn ObjectStore>, delay: Duration) -> HookStore {
    HookStore::new(inner, move |op, key, when| {
        if (op, key, when) == (StoreOp::List, "seg/", When::Before) {
            std::thread::sleep(delay);
        }
        Ok(())
    })
}

/// Finding 4. `ReaderPin::take` chooses with `newest_complete_checkpoint`, which lists every
/// segment object between its checkpoint listing and its completeness test, and only then
/// pins. A writer that uploads twice within one `seg/` listing (a busy writer with `upload=1`
/// beside a store of tens of thousands of segment objects, S3 listing 1000 keys a page) has
/// deleted what every listed checkpoint named by the time the listing ends: after 5 tries
/// `newest_complete_checkpoint` answers none, and the read-only mount fails at once with "the
/// store holds no complete checkpoint object" (or, were one found, its choice is superseded
/// before the pin, 20 times). Pinning the newest listed checkpoint first, checking it is among
/// the newest two, then testing completeness under the pin's protection closes the window to
/// one `ckpt/` listing.
#[test]
fn a_busy_writer_beside_a_slow_segment_listing_keeps_a_reader_from_pinning() {
    let seed = seed();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mem: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let clock = TestClock::default();
    let mut w = Writer::start(mem.clone(), &clock, false);
    w.round(&mut rng, false);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop2 = stop.clone();
    let writer = std::thread::spawn(move || {
        let mut n = 0u64;
        while !stop2.load(std::sync::atomic::Ordering::SeqCst) {
            let l = w.lists[(n % 4) as usize];
            w.lld.write(None, l, n % 60, &[n as u8; 3000]).unwrap();
            w.lld.checkpoint_now().unwrap();
            w.seg
                .wait_uploaded(w.seg.announced(), Duration::from_secs(60))
                .unwrap();
            n += 1;
            std::thread::sleep(Duration::from_millis(150));
        }
        n
    });
    let store: Arc<dyn ObjectStore> =
        Arc::new(slow_seg_list(mem.clone(), Duration::from_millis(400)));
    let t = std::time::Instant::now();
    let r = ReaderPin::take(store, pin_opts());
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let uploads = writer.join().unwrap();
    assert!(
        r.is_ok(),
        "a reader could not pin in {:.1} s beside a writer that uploaded {uploads} times: {} ({})",
        t.elapsed().as_secs_f64(),
        r.err().unwrap(),
        replay(seed)
    );
}

/// Probe: what a reader's cache counts as held right after it opens, before any read, when the
/// writer deleted most of what it wrote just before the pinned checkpoint (segments Dirty with
/// nothing live, which no checkpoint object names and the rebuild left as holes).
#[test]
fn a_reader_cache_counts_no_phantom_segments_at_open() {
    let seed = seed();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let clock = TestClock::default();
    let mut w = Writer::start(store.clone(), &clock, false);
    for _ in 0..4 {
        w.round(&mut rng, false);
    }
    // Delete nearly everything, then one checkpoint.
    for &l in &w.lists.clone() {
        for i in 0..58u64 {
            w.lld.delete(None, l, i).unwrap();
            w.model.remove(&(l.0, i));
        }
    }
    w.upload();
    let (pin, key, obj) = ReaderPin::take(store.clone(), pin_opts()).unwrap();
    let bound = 8u64;
    let cache = reader_cache(store.clone(), dir.path(), &key, &obj, bound);
    let at_open = cache.stats();
    let r = read_only(cache.clone());
    for _ in 0..3 {
        for &l in &w.lists {
            for i in 0..60u64 {
                let got = r.read(l, i).unwrap();
                assert_eq!(
                    got.as_deref(),
                    w.model.get(&(l.0, i)).map(|v| v.as_slice()),
                    "({})",
                    replay(seed)
                );
            }
        }
    }
    let after = cache.stats();
    let prefixes = obj
        .entries
        .iter()
        .filter(|e| e.pages != obj.geo.segment_pages)
        .count() as u64;
    let full = obj.entries.len() as u64 - prefixes;
    println!(
        "checkpoint names {full} full segments and {prefixes} prefixes; at open {at_open:?}; \
         after three reads of the tree {after:?}"
    );
    assert!(
        at_open.held_segments <= prefixes,
        "a reader's cache counts {} segments held before any read (the checkpoint names {full} \
         in full, {prefixes} prefix): segments the rebuild left as holes count against its \
         bound {bound} ({})",
        at_open.held_segments,
        replay(seed)
    );
    drop(r);
    cache.stop();
    pin.release().unwrap();
}
