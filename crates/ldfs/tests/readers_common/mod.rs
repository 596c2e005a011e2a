//! What the store readers' tests share (store_readers.rs, review42-45_probes.rs): a writer (lld
//! on a memory device uploading to a store through `SegmentStore`) with its model, a read-only
//! reader of a pinned checkpoint, listings of the store, and store hooks more than one uses.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ldfs::device::{Device, MemoryDevice};
use ldfs::ld::{ListHints, ListId, LogicalDisk};
use ldfs::lld::{Lld, LldOptions, PolicyKind};
use ldfs::store::cache::{Cache, CacheDevice};
use ldfs::store::readers::{open_reader_cache, PinOptions, ReaderPin};
use ldfs::store::segments::{decode_checkpoint_object, restore_lazy_of, CheckpointObject};
use ldfs::store::{
    restore_as, CacheConfig, HeldLease, ObjectStore, SegmentStore, StoreOp, StoreResult,
};
use ldfs::testing::store::{
    crash_lease, fast_backoff, open_with_hooks, seed_or, small_mkfs, take_lease, HookStore,
    TestClock, When,
};
use rand::Rng;
use rand_chacha::ChaCha8Rng;

pub const DEV_BYTES: u64 = 24 << 20;
pub const SEGMENT_BYTES: u64 = 128 << 10;

pub type Model = BTreeMap<(u64, u64), Vec<u8>>;

/// `LDFS_SEED`, else 20261127.
pub fn seed() -> u64 {
    seed_or(20261127)
}

/// How to replay `seed` in the test target `test`.
pub fn replay_in(test: &str, seed: u64) -> String {
    format!("seed {seed}; replay: LDFS_SEED={seed} cargo test --release -p ldfs --test {test}")
}

/// A writer: lld on a memory cache, uploading to `store`; `model` is what it wrote.
pub struct Writer {
    pub lld: Lld,
    pub seg: SegmentStore,
    pub lease: Arc<HeldLease>,
    pub lists: Vec<ListId>,
    pub model: Model,
}

impl Writer {
    /// A writer on a fresh file system (four lists); `force`: take over a crashed writer's
    /// lease.
    pub fn start(store: Arc<dyn ObjectStore>, clock: &TestClock, force: bool) -> Writer {
        let dev: Arc<dyn Device> = Arc::new(MemoryDevice::new(DEV_BYTES));
        ldfs::lld::mkfs::mkfs(&*dev, &small_mkfs(SEGMENT_BYTES, 2026)).unwrap();
        let lease = take_lease(store.clone(), clock, force);
        let seg = SegmentStore::start(store, dev, lease.clone(), fast_backoff()).unwrap();
        let lld = open_with_hooks(&seg, LldOptions::default());
        let lists = (0..4)
            .map(|_| lld.create_list(None, ListHints::default()).unwrap())
            .collect();
        Writer {
            lld,
            seg,
            lease,
            lists,
            model: Model::new(),
        }
    }

    /// A writer taking over (a crashed writer's lease): its cache rebuilt from the store
    /// (`restore_as`, the store's newest complete checkpoint), as a mount on a new host does;
    /// `between` runs after its start's sweep and before lld opens (and checkpoints).
    pub fn take_over(
        store: Arc<dyn ObjectStore>,
        clock: &TestClock,
        lists: Vec<ListId>,
        model: Model,
        between: impl FnOnce(),
    ) -> Writer {
        let restore = store.clone();
        Writer::take_over_restoring(store, &*restore, clock, lists, model, between)
    }

    /// [`Writer::take_over`], its cache rebuilt from `restore` (the store unwrapped, so a
    /// wrapper's hook sees only the start's own requests).
    pub fn take_over_restoring(
        store: Arc<dyn ObjectStore>,
        restore: &dyn ObjectStore,
        clock: &TestClock,
        lists: Vec<ListId>,
        model: Model,
        between: impl FnOnce(),
    ) -> Writer {
        let lease = take_lease(store.clone(), clock, true);
        let dev: Arc<dyn Device> = Arc::new(MemoryDevice::new(DEV_BYTES));
        restore_as(restore, &*dev, 9).unwrap();
        let seg = SegmentStore::start(store, dev, lease.clone(), fast_backoff()).unwrap();
        between();
        let lld = open_with_hooks(&seg, LldOptions::default());
        Writer {
            lld,
            seg,
            lease,
            lists,
            model,
        }
    }

    /// 300 writes at random keys (a fifth of them deletes, with `deletes`), in the model.
    pub fn churn(&mut self, rng: &mut ChaCha8Rng, deletes: bool) {
        for _ in 0..300 {
            let l = self.lists[rng.gen_range(0..self.lists.len())];
            let i = rng.gen_range(0..60u64);
            if deletes && rng.gen_bool(0.2) {
                self.lld.delete(None, l, i).unwrap();
                self.model.remove(&(l.0, i));
            } else {
                let v: Vec<u8> = (0..rng.gen_range(1..9000)).map(|_| rng.gen()).collect();
                self.lld.write(None, l, i, &v).unwrap();
                self.model.insert((l.0, i), v);
            }
        }
    }

    /// A checkpoint, waited for until uploaded (with the writer's delete round).
    pub fn upload(&self) {
        self.lld.checkpoint_now().unwrap();
        self.seg
            .wait_uploaded(self.seg.announced(), Duration::from_secs(60))
            .unwrap();
    }

    /// Overwrites and deletes, some cleaning with `clean`, then a checkpoint uploaded.
    pub fn round(&mut self, rng: &mut ChaCha8Rng, clean: bool) {
        self.churn(rng, true);
        if clean {
            let cancel = AtomicBool::new(false);
            self.lld
                .clean_now(PolicyKind::Greedy, Some(16), 0.9, &cancel)
                .unwrap();
        }
        self.upload();
    }

    /// Overwrites only (no deletes, no cleaning), then a checkpoint uploaded.
    pub fn write_round(&mut self, rng: &mut ChaCha8Rng) {
        self.churn(rng, false);
        self.upload();
    }

    /// The shared test clock moved on by `secs`, the writer's lease renewed on the way (as its
    /// renewer would: it must not expire by the jump).
    pub fn advance(&self, clock: &TestClock, secs: u64) {
        let mut left = secs;
        while left > 0 {
            let step = left.min(20);
            clock.advance(step);
            self.lease.renew_now().unwrap();
            left -= step;
        }
    }
}

/// A reader's pin options: 60 s by the system clock.
pub fn pin_opts() -> PinOptions {
    PinOptions {
        duration: Duration::from_secs(60),
        clock: ldfs::store::lease::system_clock(),
        host: "reader".into(),
        pid: std::process::id(),
    }
}

/// [`pin_opts`] for `secs` by `clock`.
pub fn pin_opts_by(clock: &TestClock, secs: u64) -> PinOptions {
    PinOptions {
        duration: Duration::from_secs(secs),
        clock: clock.clock(),
        ..pin_opts()
    }
}

/// A reader's cache, rebuilt lazily from the checkpoint `key` (`obj`), bounded to
/// `bound_segments` segments.
pub fn reader_cache(
    store: Arc<dyn ObjectStore>,
    dir: &std::path::Path,
    key: &str,
    obj: &CheckpointObject,
    bound_segments: u64,
) -> Arc<Cache> {
    let dev: Arc<dyn Device> = Arc::new(MemoryDevice::new(DEV_BYTES));
    let map = dir.join("reader.ldfs-resident");
    restore_lazy_of(&*store, &*dev, &map, 7, key, obj).unwrap();
    open_reader_cache(
        store,
        dev,
        CacheConfig::new(map, Some(bound_segments * SEGMENT_BYTES)),
        obj,
    )
    .unwrap()
}

/// A read-only engine on `cache`.
pub fn read_only(cache: Arc<Cache>) -> Lld {
    Lld::open(
        Arc::new(CacheDevice(cache)),
        LldOptions {
            read_only: true,
            ..LldOptions::default()
        },
    )
    .unwrap()
}

/// A read-only engine on a [`reader_cache`].
pub fn reader(
    store: Arc<dyn ObjectStore>,
    dir: &std::path::Path,
    key: &str,
    obj: &CheckpointObject,
    bound_segments: u64,
) -> Lld {
    read_only(reader_cache(store, dir, key, obj, bound_segments))
}

/// Every key of `lists` (indices 0..60) read from `lld` equals `model`'s; `why` names the
/// failure (the replay line).
pub fn check(lld: &Lld, lists: &[ListId], model: &Model, what: &str, why: &str) {
    for &l in lists {
        for i in 0..60u64 {
            let got = lld
                .read(l, i)
                .unwrap_or_else(|e| panic!("{what}: list {} index {i}: {e} ({why})", l.0));
            assert_eq!(
                got.as_deref(),
                model.get(&(l.0, i)).map(|v| v.as_slice()),
                "{what}: list {} index {i} ({why})",
                l.0,
            );
        }
    }
}

/// How many reads of `lists` failed; those that answered equal `model`'s (else it panics: "the
/// reader read other bytes than its checkpoint's").
pub fn read_errors(lld: &Lld, lists: &[ListId], model: &Model, why: &str) -> usize {
    let mut errors = 0;
    for &l in lists {
        for i in 0..60u64 {
            match lld.read(l, i) {
                Ok(got) => assert_eq!(
                    got.as_deref(),
                    model.get(&(l.0, i)).map(|v| v.as_slice()),
                    "the reader read other bytes than its checkpoint's ({why})",
                ),
                Err(_) => errors += 1,
            }
        }
    }
    errors
}

/// The keys under `prefix`, in order.
pub fn keys(store: &dyn ObjectStore, prefix: &str) -> Vec<String> {
    store
        .list(prefix)
        .unwrap()
        .into_iter()
        .map(|o| o.key)
        .collect()
}

pub fn checkpoints(store: &dyn ObjectStore) -> Vec<String> {
    keys(store, "ckpt/")
}

pub fn segment_objects(store: &dyn ObjectStore) -> BTreeSet<String> {
    keys(store, "seg/").into_iter().collect()
}

/// The segment objects the checkpoint object `key` names.
pub fn named_by(store: &dyn ObjectStore, key: &str) -> BTreeSet<String> {
    let obj = decode_checkpoint_object(key, &store.get(key).unwrap()).unwrap();
    obj.entries.iter().map(|e| e.key()).collect()
}

/// `inner` whose listings of `seg/` each move `clock` on by `secs` once answered (a large
/// store's listing).
pub fn seg_listing_takes(inner: Arc<dyn ObjectStore>, clock: TestClock, secs: u64) -> HookStore {
    HookStore::new(inner, move |op, key, when| {
        if (op, key, when) == (StoreOp::List, "seg/", When::After) {
            clock.advance(secs);
        }
        Ok(())
    })
}

/// `f` run the first time `at` says yes (a hook's condition), from a [`HookStore`]'s hook.
pub fn once(
    at: impl Fn(StoreOp, &str, When) -> bool + Send + Sync + 'static,
    f: Box<dyn FnOnce() + Send>,
) -> impl Fn(StoreOp, &str, When) -> StoreResult<()> + Send + Sync + 'static {
    let f = Mutex::new(Some(f));
    move |op, key, when| {
        if at(op, key, when) {
            let f = f.lock().unwrap().take();
            if let Some(f) = f {
                f();
            }
        }
        Ok(())
    }
}

/// A stale writer's late checkpoint, ready to land: writer A uploaded four rounds and a fifth
/// (`key`), then lost its host before the fifth's checkpoint put landed (deleted here, its
/// segment objects kept aside); A's lease is crashed, so the next writer takes over from the
/// checkpoint before.
pub struct Late {
    /// The tree of the checkpoint before the late one (what the next writer rebuilds).
    pub before: Model,
    /// The late checkpoint's tree.
    pub model: Model,
    pub key: String,
    /// The segment objects it names.
    pub named: BTreeSet<String>,
    pub lists: Vec<ListId>,
    /// What the land pinned: the reader's take.
    taken: Arc<Mutex<Option<(ReaderPin, String, CheckpointObject)>>>,
}

/// A's in-flight puts landing (its segment objects, then its checkpoint object), and a reader
/// pinning (what [`Late::pinned`] returns).
pub type Land = Box<dyn FnOnce() + Send>;

impl Late {
    pub fn new(
        store: &Arc<dyn ObjectStore>,
        clock: &TestClock,
        rng: &mut ChaCha8Rng,
    ) -> (Late, Land) {
        let mut a = Writer::start(store.clone(), clock, false);
        for r in 0..4 {
            a.round(rng, r == 2);
        }
        let before = a.model.clone();
        a.round(rng, false);
        let model = a.model.clone();
        let key = checkpoints(&**store).last().cloned().unwrap();
        let bytes = store.get(&key).unwrap();
        let named = named_by(&**store, &key);
        let segs: Vec<(String, Vec<u8>)> = named
            .iter()
            .map(|k| (k.clone(), store.get(k).unwrap()))
            .collect();
        // A's last checkpoint put had not landed when it lost its host: as if it never was, yet.
        a.seg.stop();
        crash_lease(&a.lease, clock);
        let lists = a.lists.clone();
        drop(a);
        store.delete(&key).unwrap();
        let taken = Arc::new(Mutex::new(None));
        let land = {
            let (store, taken, key) = (store.clone(), taken.clone(), key.clone());
            move || {
                for (k, v) in &segs {
                    store.put(k, v).unwrap();
                }
                store.put(&key, &bytes).unwrap();
                *taken.lock().unwrap() = Some(ReaderPin::take(store.clone(), pin_opts()).unwrap());
            }
        };
        let late = Late {
            before,
            model,
            key,
            named,
            lists,
            taken,
        };
        (late, Box::new(land))
    }

    /// The reader's take once the land ran; it pinned the late checkpoint (`why`: the replay).
    pub fn pinned(&self, why: &str) -> (ReaderPin, String, CheckpointObject) {
        let taken = self
            .taken
            .lock()
            .unwrap()
            .take()
            .expect("setup: the land ran (in B's start)");
        assert_eq!(
            taken.1, self.key,
            "setup: the reader pins the late checkpoint ({why})"
        );
        taken
    }
}

/// A store holding three uploads' checkpoints (upload `r` by `round(writer, rng, r)`, the rng
/// seeded by `seed`) by a writer on `clock`, its uploader stopped; the writer is returned to
/// keep its lease held as long as the caller wants.
pub fn uploaded(
    seed: u64,
    clock: &TestClock,
    round: impl Fn(&mut Writer, &mut ChaCha8Rng, u32),
) -> (Arc<dyn ObjectStore>, Writer) {
    let mut rng = <ChaCha8Rng as rand::SeedableRng>::seed_from_u64(seed);
    let store: Arc<dyn ObjectStore> = Arc::new(ldfs::store::MemoryStore::new());
    let mut w = Writer::start(store.clone(), clock, false);
    for r in 0..3 {
        round(&mut w, &mut rng, r);
    }
    w.seg.stop();
    (store, w)
}
