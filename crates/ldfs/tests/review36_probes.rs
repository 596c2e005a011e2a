//! Review 36's probes of the checkpoint a rebuild takes (e30acc4: `restore` and `restore_lazy`
//! choose it through one function, `checkpoint_to_rebuild`) and of the rebuilds' crash safety.
//! Each probe fails while the defect its doc comment names is there; guards pin the behaviour
//! the refactor must keep. `#[ignore]` marks an open defect:
//! `cargo test --release -p ldfs --test review36_probes -- --ignored` runs them.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ldfs::device::{CrashDevice, CrashOptions, Device, MemoryDevice};
use ldfs::ld::{ListHints, ListId, LogicalDisk};
use ldfs::lld::layout::{Geometry, MkfsOptions};
use ldfs::lld::{Lld, LldOptions, PAGE_BYTES};
use ldfs::store::cache::read_map;
use ldfs::store::segments::{
    decode_checkpoint_object, newest_checkpoint, parse_checkpoint_key, CheckpointObject,
};
use ldfs::store::{
    restore_as, restore_lazy_as, LayerError, MemoryStore, ObjectInfo, ObjectStore, PutOutcome,
    RestoreReport, SegmentStore, StoreResult,
};

/// The cache id every rebuild here writes: a rebuild writes a random one by default (store5),
/// and these probes compare images of rebuilds byte for byte.
const CACHE_ID: u64 = 0x3636_3636;

fn restore(store: &dyn ObjectStore, dev: &dyn Device) -> Result<RestoreReport, LayerError> {
    restore_as(store, dev, CACHE_ID)
}

fn restore_lazy(
    store: &dyn ObjectStore,
    dev: &dyn Device,
    map: &std::path::Path,
) -> Result<RestoreReport, LayerError> {
    restore_lazy_as(store, dev, map, CACHE_ID)
}
use ldfs::testing::store::{crash_lease, take_lease, TestClock};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const DEV_BYTES: u64 = 16 << 20;
const VALUES: u64 = 40;

fn mkfs_opts() -> MkfsOptions {
    MkfsOptions {
        segment_bytes: 128 << 10,
        max_block_bytes: 32 << 10,
        reserved_segments: Some(4),
        fs_id: 3636,
        max_bytes: None,
        kept_pages: 0,
    }
}

use ldfs::testing::store::fast_backoff as fast;

fn seed() -> u64 {
    std::env::var("LDFS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                % 1_000_000
        })
}

fn open(dev: Arc<dyn Device>, seg: &SegmentStore) -> Lld {
    Lld::open(
        dev,
        LldOptions {
            checkpoint_hook: Some(seg.hook()),
            segment_hook: Some(seg.segment_hook()),
            ..LldOptions::default()
        },
    )
    .expect("open")
}

/// Writes `VALUES` values of `byte` into `l` and uploads a checkpoint.
fn fill_and_upload(lld: &Lld, seg: &SegmentStore, l: ListId, byte: u8) {
    for i in 0..VALUES {
        lld.write(None, l, i, &[byte; 9000]).unwrap();
    }
    lld.checkpoint_now().unwrap();
    seg.wait_uploaded(seg.announced(), Duration::from_secs(30))
        .unwrap();
}

/// A writer (lease generation 1) that uploaded `uploads` checkpoints of one list, the k-th
/// (from 1) holding every value as byte k. Returns the store, the clock, the writer (still
/// running: its lease held), its lld and the list.
fn writer_with(uploads: u8) -> (Arc<MemoryStore>, TestClock, SegmentStore, Lld, ListId) {
    let store = Arc::new(MemoryStore::new());
    let clock = TestClock::default();
    let dev: Arc<dyn Device> = Arc::new(MemoryDevice::new(DEV_BYTES));
    ldfs::lld::mkfs::mkfs(&*dev, &mkfs_opts()).unwrap();
    let lease = take_lease(store.clone(), &clock, false);
    let seg = SegmentStore::start(store.clone(), dev, lease, fast()).unwrap();
    let lld = open(seg.device(), &seg);
    let l = lld.create_list(None, ListHints::default()).unwrap();
    for k in 1..=uploads {
        fill_and_upload(&lld, &seg, l, k);
    }
    (store, clock, seg, lld, l)
}

/// What the tree on `dev` is.
#[derive(Debug, PartialEq)]
enum Tree {
    /// Upload k's: every value holds byte k.
    Whole(u8),
    /// A state the writer passed through between uploads k and k + 1 (a prefix of the log
    /// rolled forward): values 0..j hold k + 1, the rest k (each upload overwrites in index
    /// order).
    Between(u8),
    /// A value missing, failing its checks, or of no state the writer passed through.
    Broken(String),
}

/// The tree on `dev` (`Err` if lld does not open it).
fn tree_on(dev: Arc<dyn Device>, l: ListId) -> Result<Tree, String> {
    let lld = Lld::open(dev, LldOptions::default()).map_err(|e| e.to_string())?;
    let mut bytes = Vec::new();
    for i in 0..VALUES {
        match lld.read(l, i) {
            Ok(Some(v)) if v.len() == 9000 && v.iter().all(|&b| b == v[0]) => bytes.push(v[0]),
            other => {
                return Ok(Tree::Broken(format!(
                    "value {i}: {:?}",
                    other.map(|v| v.map(|v| v.len()))
                )))
            }
        }
    }
    let (first, last) = (bytes[0], bytes[bytes.len() - 1]);
    Ok(if first == last && bytes.iter().all(|&b| b == first) {
        Tree::Whole(first)
    } else if first == last + 1 && bytes.windows(2).all(|w| w[0] >= w[1]) {
        Tree::Between(last)
    } else {
        Tree::Broken(format!("values {bytes:?}"))
    })
}

/// Whether the slot of `obj`'s serial on `dev` is `obj`'s slot, byte for byte.
fn holds_slot_of(dev: &dyn Device, obj: &CheckpointObject) -> bool {
    let mut b = vec![0u8; obj.slot.len()];
    dev.read_at(&mut b, obj.geo.slot_addr((obj.serial % 2) as usize))
        .is_ok()
        && b == obj.slot
}

/// The decoded newest checkpoint object among those of `writer`.
fn newest_of(store: &MemoryStore, writer: u64) -> (String, CheckpointObject) {
    let key = store
        .keys()
        .into_iter()
        .filter(|k| parse_checkpoint_key(k).is_some_and(|(w, _)| w == writer))
        .max()
        .unwrap_or_else(|| panic!("no checkpoint object of writer {writer}"));
    let obj = decode_checkpoint_object(&key, &store.get(&key).unwrap()).unwrap();
    (key, obj)
}

/// What a refused rebuild returned, in short: the variant and the store key or message.
fn kind(e: &LayerError) -> String {
    match e {
        LayerError::Corrupt { what, key, .. } => format!("Corrupt({what}, {key})"),
        LayerError::Other(m) => format!("Other({m})"),
        other => format!("{other:?}"),
    }
}

/// Guard (the refactor's contract): for each store or cache a rebuild must refuse — a store
/// holding no checkpoint object, one whose checkpoint objects all name a segment object that
/// is gone, a cache too small for the file system, a newest checkpoint object with a flipped
/// byte — `restore` and `restore_lazy` return the same typed error (the old copies' variants
/// and messages), never panic, and leave the cache device byte for byte as it was (`restore_lazy`
/// zeroes page 0 only after the choice) and write no residency map.
#[test]
fn both_rebuilds_refuse_alike_and_touch_nothing() {
    let (store, _clock, seg, lld, _l) = writer_with(2);
    lld.close().unwrap();
    seg.stop();
    drop(seg);
    let d = tempfile::tempdir().unwrap();
    let marked = |bytes: u64| {
        let mut v = vec![0u8; bytes as usize];
        for (i, b) in v.iter_mut().enumerate().step_by(509) {
            *b = (i % 251) as u8 | 1;
        }
        v
    };
    let check = |what: &str, s: &MemoryStore, bytes: u64, want: &dyn Fn(&str) -> bool| {
        let img = marked(bytes);
        let dev = MemoryDevice::from_vec(img.clone());
        let full = match restore(s, &dev) {
            Ok(r) => panic!("{what}: restore rebuilt {r:?}"),
            Err(e) => kind(&e),
        };
        assert!(dev.snapshot() == img, "{what}: restore changed the cache");
        let dev = MemoryDevice::from_vec(img.clone());
        let map = d.path().join(format!("{what}.map"));
        let lazy = match restore_lazy(s, &dev, &map) {
            Ok(r) => panic!("{what}: restore_lazy rebuilt {r:?}"),
            Err(e) => kind(&e),
        };
        assert!(
            dev.snapshot() == img,
            "{what}: restore_lazy changed the cache"
        );
        assert!(!map.exists(), "{what}: restore_lazy wrote a residency map");
        assert_eq!(full, lazy, "{what}: the two rebuilds refuse differently");
        assert!(want(&full), "{what}: {full}");
    };
    check("empty", &MemoryStore::new(), DEV_BYTES, &|k| {
        k == "Other(the store holds no checkpoint object)"
    });
    let newest = store
        .keys()
        .into_iter()
        .filter(|k| parse_checkpoint_key(k).is_some())
        .max()
        .unwrap();
    let incomplete = store.clone_landed();
    for k in incomplete.keys() {
        if k.starts_with("seg/") {
            incomplete.delete(&k).unwrap();
        }
    }
    check("incomplete", &incomplete, DEV_BYTES, &|k| {
        k == format!("Corrupt(store, {newest})")
    });
    let (_, obj) = newest_checkpoint(&*store).unwrap().unwrap();
    let need = obj.geo.total_pages * PAGE_BYTES as u64;
    check("small", &store, need - PAGE_BYTES as u64, &|k| {
        k == format!(
            "Other(the cache holds {} bytes; this file system needs {need})",
            need - PAGE_BYTES as u64
        )
    });
    let flipped = store.clone_landed();
    assert!(flipped.corrupt(&newest, |b| {
        let at = b.len() / 2;
        b[at] ^= 0x40;
    }));
    check("flipped", &flipped, DEV_BYTES, &|k| {
        k == format!("Corrupt(checkpoint object, {newest})")
    });
}

/// Guard (DESIGN "One writer: the lease"): a stale writer's late checkpoint object — complete,
/// its segment objects acknowledged first, landing after the taker uploaded — sorts below
/// every checkpoint of the taker's: `restore` and `restore_lazy` both take the taker's newest,
/// and the full rebuild opens the taker's tree.
#[test]
fn a_stale_writers_late_checkpoint_is_taken_by_neither_rebuild() {
    let (store, clock, seg_a, lld_a, l) = writer_with(2);
    // A's third upload lands late: its segment objects and its checkpoint object are held back
    // (taken out of the store) until the taker started and uploaded, then land (complete).
    let before: std::collections::BTreeSet<String> = store.keys().into_iter().collect();
    fill_and_upload(&lld_a, &seg_a, l, 3);
    let lease_a = seg_a.lease().clone();
    seg_a.stop();
    drop(lld_a);
    drop(seg_a);
    let (late_key, late_obj) = newest_of(&store, 1);
    let held: Vec<(String, Vec<u8>)> = store
        .keys()
        .into_iter()
        .filter(|k| !before.contains(k))
        .map(|k| {
            let b = store.get(&k).unwrap();
            store.delete(&k).unwrap();
            (k, b)
        })
        .collect();
    assert!(held.iter().any(|(k, _)| *k == late_key));
    crash_lease(&lease_a, &clock);
    let lease_b = take_lease(store.clone(), &clock, true);
    let dev_b: Arc<dyn Device> = Arc::new(MemoryDevice::new(DEV_BYTES));
    restore(&*store, &*dev_b).unwrap();
    let seg_b = SegmentStore::start(store.clone(), dev_b, lease_b.clone(), fast()).unwrap();
    let lld_b = open(seg_b.device(), &seg_b);
    fill_and_upload(&lld_b, &seg_b, l, 9);
    lld_b.close().unwrap();
    seg_b.stop();
    // The late puts land.
    for (k, b) in &held {
        assert_eq!(store.put_if_absent(k, b).unwrap(), PutOutcome::Created);
    }
    let keys = store.keys();
    assert!(
        late_obj.entries.iter().all(|e| keys.contains(&e.key())),
        "the late checkpoint is not complete: the probe tests less than it says"
    );
    let (b_key, b_obj) = newest_of(&store, lease_b.writer());
    assert!(late_key < b_key, "{late_key} sorts after {b_key}");
    let dev: Arc<dyn Device> = Arc::new(MemoryDevice::new(DEV_BYTES));
    let r = restore(&*store, &*dev).unwrap();
    assert_eq!(r.serial, b_obj.serial, "restore took another checkpoint");
    assert!(holds_slot_of(&*dev, &b_obj), "restore did not take {b_key}");
    assert_eq!(tree_on(dev, l), Ok(Tree::Whole(9)), "restore's tree");
    let d = tempfile::tempdir().unwrap();
    let dev = MemoryDevice::new(DEV_BYTES);
    let r = restore_lazy(&*store, &dev, &d.path().join("map")).unwrap();
    assert_eq!(
        r.serial, b_obj.serial,
        "restore_lazy took another checkpoint"
    );
    assert!(
        holds_slot_of(&dev, &b_obj),
        "restore_lazy did not take {b_key}"
    );
}

/// A memory store that runs `hook` once, at the first segment object get after it is armed
/// (before answering it), and counts gets per key and checkpoint listings.
#[derive(Default)]
struct Hooked {
    inner: Arc<MemoryStore>,
    #[allow(clippy::type_complexity)]
    hook: Mutex<Option<Box<dyn FnOnce() + Send>>>,
    gets: Mutex<BTreeMap<String, u32>>,
    ckpt_lists: AtomicU32,
    /// Every segment object get answers "not found" (an object deleted between the listing
    /// and the get, each time).
    vanish: std::sync::atomic::AtomicBool,
}

impl ObjectStore for Hooked {
    fn put(&self, key: &str, bytes: &[u8]) -> StoreResult<()> {
        self.inner.put(key, bytes)
    }
    fn put_if_absent(&self, key: &str, bytes: &[u8]) -> StoreResult<PutOutcome> {
        self.inner.put_if_absent(key, bytes)
    }
    fn get(&self, key: &str) -> StoreResult<Vec<u8>> {
        if key.starts_with("seg/") {
            let h = self.hook.lock().unwrap().take();
            if let Some(h) = h {
                h();
            }
            *self
                .gets
                .lock()
                .unwrap()
                .entry(key.to_string())
                .or_default() += 1;
            if self.vanish.load(Ordering::SeqCst) {
                return Err(ldfs::store::StoreError::NotFound {
                    key: key.to_string(),
                });
            }
        }
        self.inner.get(key)
    }
    fn get_range(&self, key: &str, offset: u64, len: u64) -> StoreResult<Vec<u8>> {
        self.inner.get_range(key, offset, len)
    }
    fn delete(&self, key: &str) -> StoreResult<()> {
        self.inner.delete(key)
    }
    fn list(&self, prefix: &str) -> StoreResult<Vec<ObjectInfo>> {
        if prefix == "ckpt/" {
            self.ckpt_lists.fetch_add(1, Ordering::SeqCst);
        }
        self.inner.list(prefix)
    }
}

/// Guard (review 34's fix, kept by e30acc4): the checkpoint `restore` chose is superseded
/// twice while it downloads (the writer's third and fourth uploads run at its first segment
/// get, deleting what only the chosen checkpoint named): it chooses again and rebuilds the
/// newest tree, fetching no segment object twice (what the first choice wrote under the same
/// key and crc is kept). And a store whose every segment get finds the object gone makes it
/// give up after exactly 5 choices, with the store's "not found", never loop.
#[test]
fn restore_chooses_again_when_its_objects_vanish_and_gives_up_after_five() {
    let (store, _clock, seg, lld, l) = writer_with(2);
    let hooked = Arc::new(Hooked {
        inner: store.clone(),
        ..Hooked::default()
    });
    let (chosen, _) = newest_of(&store, 1);
    let seg = Arc::new(seg);
    let lld = Arc::new(lld);
    {
        let (seg, lld, inner, chosen) = (seg.clone(), lld.clone(), store.clone(), chosen.clone());
        *hooked.hook.lock().unwrap() = Some(Box::new(move || {
            let l2 = lld.create_list(None, ListHints::default()).unwrap();
            fill_and_upload(&lld, &seg, l2, 3);
            fill_and_upload(&lld, &seg, l2, 4);
            // The deletes behind an upload may follow its wait (review 33 finding 1).
            let t = std::time::Instant::now();
            while inner.keys().contains(&chosen) && t.elapsed() < Duration::from_secs(30) {
                std::thread::sleep(Duration::from_millis(5));
            }
        }));
    }
    let dev: Arc<dyn Device> = Arc::new(MemoryDevice::new(DEV_BYTES));
    let r = restore(&*hooked, &*dev);
    assert!(
        !store.keys().contains(&chosen),
        "the writer's uploads never deleted {chosen}: the probe tests nothing"
    );
    let r = r.unwrap_or_else(|e| panic!("restore beside the writer: {e}"));
    assert!(
        hooked.ckpt_lists.load(Ordering::SeqCst) >= 2,
        "restore never chose again: the probe tests nothing"
    );
    let (_, newest) = newest_of(&store, 1);
    assert_eq!(r.serial, newest.serial, "restore took an older checkpoint");
    let twice: Vec<_> = hooked
        .gets
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, &n)| n > 1)
        .map(|(k, n)| format!("{k} x{n}"))
        .collect();
    assert!(twice.is_empty(), "fetched again: {twice:?}");
    assert_eq!(tree_on(dev, l), Ok(Tree::Whole(2)), "the rebuilt tree");

    hooked.vanish.store(true, Ordering::SeqCst);
    hooked.ckpt_lists.store(0, Ordering::SeqCst);
    let dev = MemoryDevice::new(DEV_BYTES);
    match restore(&*hooked, &dev) {
        Err(LayerError::Store(ldfs::store::StoreError::NotFound { .. })) => {}
        other => panic!("objects always gone: {other:?}"),
    }
    assert_eq!(
        hooked.ckpt_lists.load(Ordering::SeqCst),
        5,
        "choices made before giving up"
    );
    match Arc::try_unwrap(lld) {
        Ok(lld) => lld.close().unwrap(),
        Err(_) => panic!("lld still shared"),
    }
    seg.stop();
}

/// The first page at which `a` and `b` differ outside the byte ranges `skip`.
fn differs_outside(a: &[u8], b: &[u8], skip: &[(u64, u64)]) -> Option<u64> {
    let mut p = 0u64;
    while (p as usize) < a.len() {
        let in_skip = skip.iter().any(|&(s, e)| p >= s && p < e);
        if !in_skip
            && a[p as usize..p as usize + PAGE_BYTES] != b[p as usize..p as usize + PAGE_BYTES]
        {
            return Some(p);
        }
        p += PAGE_BYTES as u64;
    }
    None
}

/// Guard (crash safety of a writer's cold rebuild): `restore_lazy` over a device that held an
/// older rebuild of the same file system (a reader's cache; a drive whose discard keeps the old
/// bytes), the power cut at every one of its device operations and the crash image taken with
/// two seeds: the image is the older cache untouched, or page 0 is zeros (the next mount
/// rebuilds) or torn (finding 4), or it is the finished rebuild's everywhere but the second superblock copy, with
/// the residency map naming every full segment the checkpoint names.
#[test]
fn restore_lazy_cut_anywhere_is_rebuilt_again_or_whole() {
    let s = seed();
    let (store, _clock, seg, lld, l) = writer_with(1);
    let old = CrashDevice::new(DEV_BYTES);
    restore(&*store, &old).unwrap();
    fill_and_upload(&lld, &seg, l, 2);
    let old_img = old.durable_image();
    let d = tempfile::tempdir().unwrap();
    let map = d.path().join("map");
    let (_, obj) = newest_checkpoint(&*store).unwrap().unwrap();
    let geo = obj.geo;
    let reference = {
        let dev = CrashDevice::from_image(old_img.clone());
        dev.set_discard_keeps_old(true);
        restore_lazy(&*store, &dev, &map).unwrap();
        dev.durable_image()
    };
    let full: Vec<_> = obj
        .entries
        .iter()
        .filter(|e| e.pages == geo.segment_pages)
        .copied()
        .collect();
    let sb1 = geo.superblock_addrs()[1];
    let last = DEV_BYTES - PAGE_BYTES as u64;
    let copy1 = [(sb1, sb1 + PAGE_BYTES as u64), (last, DEV_BYTES)];
    let mut outcomes = BTreeMap::new();
    for n in 0.. {
        std::fs::remove_file(&map).ok();
        let dev = CrashDevice::from_image(old_img.clone());
        dev.set_discard_keeps_old(true);
        dev.cut_power_after(n);
        let done = restore_lazy(&*store, &dev, &map).is_ok();
        for cs in [s, s + 1] {
            let img = dev.crash_image(
                cs,
                &CrashOptions {
                    keep_probability: 0.5,
                    tear_probability: 0.3,
                },
            );
            if img[..PAGE_BYTES].iter().all(|&b| b == 0) {
                *outcomes.entry("zeros").or_insert(0) += 1;
                continue;
            }
            if Geometry::decode_superblock(&img[..PAGE_BYTES], 0, DEV_BYTES).is_err() {
                // Page 0's zeroing or the last superblock write torn: finding 4
                // (`prepare_cache` refuses such a cache; ldfs-tools' review36_probes).
                *outcomes.entry("page 0 torn").or_insert(0) += 1;
                continue;
            }
            // Page 0 holds the superblock (the older cache's and the rebuild's are the same
            // bytes): the image is the older cache untouched (cut before page 0's zeros
            // landed) or the finished rebuild, but for copy 1 (which a rebuild may zero first).
            if differs_outside(&img, &old_img, &copy1).is_none() {
                *outcomes.entry("untouched").or_insert(0) += 1;
                continue;
            }
            *outcomes.entry("whole").or_insert(0) += 1;
            let at = differs_outside(&img, &reference, &copy1);
            assert!(
                at.is_none(),
                "cut after {n} operations (crash seed {cs}; LDFS_SEED={s}): page 0 holds a \
                 superblock but the image is neither the older cache nor the finished rebuild \
                 (differs from it at byte {at:?})"
            );
            let m = read_map(&map, &geo).unwrap();
            assert_eq!(
                m.as_deref(),
                Some(&full[..]),
                "cut after {n} (crash seed {cs}; LDFS_SEED={s}): the residency map"
            );
        }
        if done {
            break;
        }
    }
    eprintln!("restore_lazy cut anywhere: {outcomes:?} (LDFS_SEED={s})");
    lld.close().unwrap();
    seg.stop();
}

/// Finding 1 (low; crash-safety of the library's contract, masked in the `ldfs` command by the
/// reader's note): `restore` says "a rebuild cut short leaves a cache with zeros [at page 0],
/// which a mount rebuilds again", but unlike `restore_lazy` it never zeroes page 0 first, and
/// it may be given a device that holds an older rebuild of the same file system (a read-only
/// mount's cache, which `prepare_cache` rebuilds at every read-only mount). Its segment writes,
/// the new slot and the zeroing of the other slot all precede its first flush, so a power cut
/// keeps any subset of them under the old superblock: the new slot with some of its segments
/// missing opens as a file system whose blocks fail or read the old rebuild's bytes. Today
/// only the note (`READER`, written before the rebuild) makes the next mount rebuild again; a
/// caller of the library, or a note lost, mounts it. Fix: zero page 0 (and copy 1, finding 3)
/// and flush before the first segment write, as `restore_lazy` does (one flush per rebuild;
/// tried on review36, not committed: this probe and finding 3's then pass, the guards too).
#[test]
fn restore_cut_short_over_an_older_cache_never_opens_a_mix() {
    let s = seed();
    let (store, _clock, seg, lld, l) = writer_with(1);
    let old = CrashDevice::new(DEV_BYTES);
    restore(&*store, &old).unwrap();
    fill_and_upload(&lld, &seg, l, 2);
    let old_img = old.durable_image();
    let mut bad = Vec::new();
    let mut outcomes: BTreeMap<String, u32> = BTreeMap::new();
    for n in 0.. {
        let dev = CrashDevice::from_image(old_img.clone());
        dev.cut_power_after(n);
        let done = restore(&*store, &dev).is_ok();
        for cs in s..s + 12 {
            let img = dev.crash_image(cs, &CrashOptions::default());
            let what = if img[..PAGE_BYTES].iter().all(|&b| b == 0) {
                "zeros".to_string()
            } else {
                match tree_on(Arc::new(MemoryDevice::from_vec(img)), l) {
                    Ok(Tree::Whole(b)) => format!("upload {b}"),
                    Ok(Tree::Between(b)) => format!("between uploads {b} and {}", b + 1),
                    Ok(Tree::Broken(why)) => {
                        bad.push(format!("cut after {n}, crash seed {cs}: {why}"));
                        "broken".to_string()
                    }
                    // Refused: no tree served (a torn page 0 is finding 4's).
                    Err(_) => "no open".to_string(),
                }
            };
            *outcomes.entry(what).or_insert(0) += 1;
        }
        if done {
            break;
        }
    }
    lld.close().unwrap();
    seg.stop();
    eprintln!("restore cut short over an older cache: {outcomes:?} (LDFS_SEED={s})");
    assert!(
        bad.is_empty(),
        "restore cut short over an older cache left images that are neither zeros at page 0 \
         nor a whole tree (LDFS_SEED={s}): {outcomes:?}; {bad:?}"
    );
}

/// Guard (a checkpoint object from the store is data: typed errors, never a panic): the
/// newest checkpoint object with seeded random bytes changed (its crc put right, so the
/// change reaches the checks behind it), cut short or grown: `restore` and `restore_lazy` each
/// return (an error or a rebuild), never panic.
#[test]
fn mangled_checkpoint_objects_never_panic_a_rebuild() {
    let s = seed();
    let (store, _clock, seg, lld, _l) = writer_with(2);
    lld.close().unwrap();
    seg.stop();
    let newest = store
        .keys()
        .into_iter()
        .filter(|k| parse_checkpoint_key(k).is_some())
        .max()
        .unwrap();
    let good = store.get(&newest).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(s);
    let d = tempfile::tempdir().unwrap();
    for round in 0..200 {
        let mut b = good.clone();
        match rng.gen_range(0..4) {
            0 => b.truncate(rng.gen_range(0..b.len())),
            1 => b.extend((0..rng.gen_range(1..64)).map(|_| rng.gen::<u8>())),
            _ => {
                for _ in 0..rng.gen_range(1..4) {
                    // The header, the superblock and the slot's header are where the
                    // bounds live.
                    let at = rng.gen_range(0..(2 * PAGE_BYTES + 64).min(b.len()));
                    b[at] = rng.gen();
                }
            }
        }
        if b.len() >= 40 {
            let mut c = b.clone();
            c[36..40].fill(0);
            let crc = crc32c::crc32c(&c);
            b[36..40].copy_from_slice(&crc.to_le_bytes());
        }
        let s2 = store.clone_landed();
        s2.put(&newest, &b).unwrap();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let dev = MemoryDevice::new(DEV_BYTES);
            let _ = restore(&s2, &dev);
            let dev = MemoryDevice::new(DEV_BYTES);
            let _ = restore_lazy(&s2, &dev, &d.path().join("map"));
        }));
        assert!(
            r.is_ok(),
            "round {round}: a rebuild panicked on a mangled checkpoint object (LDFS_SEED={s})"
        );
    }
}

/// Finding 3 (low; defence in depth): a rebuild cut short is meant to leave "zeros at page 0,
/// which the next mount takes for an empty cache and rebuilds" (`write_slot_and_superblocks`).
/// Over a device that held an older cache of the file system (a reader's, rebuilt by a
/// read-write mount), `restore_lazy` zeroes page 0 and flushes, then gives back the segment
/// area — but the older cache's second superblock copy (the device's last page) is left, and
/// `Lld::open` falls back to it when copy 0 is bad (`mkfs::read_superblock`). Only
/// `prepare_cache`'s own look at page 0 keeps a store mount from opening it; anything opening
/// the file as an image (`ldfs mount cache.img`, `ldfs fsck -y cache.img` — a read-write
/// mount's cut-short cache has no note yet, so the tools take it for a plain image) mounts the
/// older checkpoint over a segment area given back or half overwritten: holes and new segments
/// read where its blocks were (map pages and blocks failing their checksums). A rebuild whole
/// but for page 0 (its copy 1 written, copy 0 not) is no defect and left out. Fix: the
/// rebuild's first step zeroes both superblock copies (page 0, the geometry's copy 1 and the
/// device's last page, where `read_superblock` looks) before its flush, in `restore` (first
/// attempt) and `restore_lazy` (tried on review36, not committed: this probe and finding 1's
/// then pass, the guards too).
#[test]
fn a_rebuild_cut_short_over_an_older_cache_does_not_open() {
    let s = seed();
    let (store, _clock, seg, lld, l) = writer_with(1);
    let old = CrashDevice::new(DEV_BYTES);
    restore(&*store, &old).unwrap();
    fill_and_upload(&lld, &seg, l, 2);
    let old_img = old.durable_image();
    let d = tempfile::tempdir().unwrap();
    let map = d.path().join("map");
    let reference = {
        let dev = CrashDevice::from_image(old_img.clone());
        restore_lazy(&*store, &dev, &map).unwrap();
        dev.durable_image()
    };
    let mut opened = Vec::new();
    let mut zeros = 0;
    for n in 0.. {
        let dev = CrashDevice::from_image(old_img.clone());
        dev.cut_power_after(n);
        let done = restore_lazy(&*store, &dev, &map).is_ok();
        // A crash seed decides the pending writes in order, so one seed drops the discard at
        // every cut alike: twelve make a run that never keeps it (1 in 4,096) rare.
        for cs in s..s + 12 {
            let img = dev.crash_image(cs, &CrashOptions::default());
            if !img[..PAGE_BYTES].iter().all(|&b| b == 0) {
                continue;
            }
            if img[PAGE_BYTES..] == reference[PAGE_BYTES..] {
                // The rebuild whole but for page 0 (its copy 1 landed, copy 0 not): a cold
                // cache, whose segments are in the store (read through the map, not here).
                continue;
            }
            zeros += 1;
            // A whole tree (the older cache's, through its copy 1) is a cache used correctly;
            // one that opens with values missing or failing is not.
            if let Ok(Tree::Broken(why)) = tree_on(Arc::new(MemoryDevice::from_vec(img)), l) {
                opened.push(format!("cut after {n}, crash seed {cs}: {why}"));
            }
        }
        if done {
            break;
        }
    }
    lld.close().unwrap();
    seg.stop();
    assert!(
        zeros > 0,
        "no cut left zeros at page 0: the probe tests nothing"
    );
    assert!(
        opened.is_empty(),
        "{} of {zeros} cut-short rebuilds (page 0 zeros) open as a file system whose values are \
         missing or fail (LDFS_SEED={s}): {opened:?}",
        opened.len()
    );
}
