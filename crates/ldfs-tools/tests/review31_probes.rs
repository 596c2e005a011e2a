//! Review 31's probes of `ldfs mount s3://...` (issue 20 step 2 B): the cache and its note,
//! the end of a mount, the backlog gate and the mount options. Each probe fails while the
//! defect its doc comment names is there. In memory (a `MemoryStore`, cache files in a temp
//! dir): no gateway, no FUSE. `#[ignore]` marks an open defect:
//! `cargo test --release -p ldfs-tools --test review31_probes -- --ignored` runs them.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ldfs::device::{Device, FileDevice, FileDeviceOptions};
use ldfs::ld::{ListHints, ListId, LogicalDisk};
use ldfs::lld::layout::MkfsOptions;
use ldfs::lld::{Lld, LldOptions};
use ldfs::store::lease::{self, LeaseError, LeaseRecord};
use ldfs::store::{
    MemoryStore, MemoryStoreFaults, ObjectInfo, ObjectStore, PutOutcome, SegmentStore, StoreError,
    StoreOp, StoreResult,
};
use ldfs::testing::store::{take_lease, TestClock};
use ldfs_tools::cli::store::{note_path, prepare_cache, write_note, StoreUrl};
use ldfs_tools::fuse::adapter::WriteGate;
use ldfs_tools::fuse::store_mount::StoreMount;

const CACHE_BYTES: u64 = 24 << 20;

fn mkfs_opts() -> MkfsOptions {
    MkfsOptions {
        segment_bytes: 128 << 10,
        max_block_bytes: 32 << 10,
        reserved_segments: Some(4),
        fs_id: 3131,
        max_bytes: None,
        kept_pages: 0,
    }
}

use ldfs::testing::store::fast_backoff as fast;

fn url() -> StoreUrl {
    StoreUrl::parse("s3://probe/fs").unwrap()
}

/// A cache file formatted as lld (what `ldfs mkfs --store` leaves), and its device.
fn cache_file(dir: &Path) -> (std::path::PathBuf, Arc<dyn Device>) {
    let p = dir.join("cache.img");
    let dev = FileDevice::create(&p, CACHE_BYTES, FileDeviceOptions::default()).unwrap();
    ldfs::lld::mkfs::mkfs(&dev, &mkfs_opts()).unwrap();
    (p, Arc::new(dev))
}

fn open(seg: &SegmentStore) -> Lld {
    Lld::open(
        seg.device(),
        LldOptions {
            checkpoint_hook: Some(seg.hook()),
            segment_hook: Some(seg.segment_hook()),
            ..LldOptions::default()
        },
    )
    .unwrap()
}

fn write(lld: &Lld, l: ListId, byte: u8) {
    for i in 0..20 {
        lld.write(None, l, i, &[byte; 9000]).unwrap();
    }
}

/// Finding 5 (high): `-o ro` on the cache of the last read-write mount (`prepare_cache` with
/// no writer) rebuilds it from the store, whatever it holds: the writes that mount's final
/// upload never got into the store (the store was down at unmount; "it stays in the cache
/// ..., and the next mount on that cache uploads it", says the unmount) are overwritten. The
/// README promises a cache is kept across mounts unless another machine wrote to the store;
/// nothing stops a user from looking at a cache read-only first.
/// Fixed: a read-only mount rebuilds only an empty cache or one only read-only mounts used
/// (its note says writer 0); a writer's cache, or one without a note, is refused.
#[test]
fn a_read_only_mount_never_rebuilds_a_cache_holding_unuploaded_writes() {
    let d = tempfile::tempdir().unwrap();
    let (cache, dev) = cache_file(d.path());
    let store = Arc::new(MemoryStore::new());
    let clock = TestClock::default();
    let lease = take_lease(store.clone(), &clock, false);
    write_note(&cache, &url(), 3131, lease.writer()).unwrap();
    let seg = SegmentStore::start(store.clone(), dev, lease.clone(), fast()).unwrap();
    let lld = open(&seg);
    let l = lld.create_list(None, ListHints::default()).unwrap();
    write(&lld, l, 1);
    lld.checkpoint_now().unwrap();
    seg.wait_uploaded(seg.announced(), Duration::from_secs(30))
        .unwrap();
    // The store goes down; the mount writes on and unmounts (its final checkpoint durable in
    // the cache only).
    store.set_faults(MemoryStoreFaults {
        lost_ppm: 1_000_000,
        ..MemoryStoreFaults::default()
    });
    write(&lld, l, 2);
    lld.close().unwrap();
    drop(lld);
    seg.stop();
    lease.abandon();
    store.set_faults(MemoryStoreFaults::default());
    // Later: a read-only look at the same cache is refused (it would be rebuilt from the
    // store), saying what to do.
    let r = prepare_cache(&*store, &url(), &cache, None);
    assert!(
        r.as_ref().is_err_and(|e| e.contains("cache of its own")),
        "a read-only mount took a writer's cache: {r:?}"
    );
    let dev = FileDevice::open(&cache, FileDeviceOptions::default()).unwrap();
    let lld = Lld::open(Arc::new(dev), LldOptions::default()).unwrap();
    let first = lld.read(l, 0).unwrap().map(|v| (v.len(), v[0]));
    assert_eq!(
        first,
        Some((9000, 2)),
        "a read-only mount rebuilt the cache over its unuploaded writes (1: the uploaded value)"
    );
}

/// With finding 5's fix: a read-only mount's own cache (note: writer 0) follows the store,
/// rebuilt at each read-only mount to the newest upload, and a read-write mount takes it
/// (rebuilt: it holds nothing of its own).
#[test]
fn a_read_only_mounts_cache_follows_the_store() {
    let wd = tempfile::tempdir().unwrap();
    let (wcache, wdev) = cache_file(wd.path());
    let store = Arc::new(MemoryStore::new());
    let clock = TestClock::default();
    let lease = take_lease(store.clone(), &clock, false);
    write_note(&wcache, &url(), 3131, lease.writer()).unwrap();
    let seg = SegmentStore::start(store.clone(), wdev, lease.clone(), fast()).unwrap();
    let lld = open(&seg);
    let l = lld.create_list(None, ListHints::default()).unwrap();
    let upload = |byte: u8| {
        write(&lld, l, byte);
        lld.checkpoint_now().unwrap();
        seg.wait_uploaded(seg.announced(), Duration::from_secs(30))
            .unwrap();
    };
    let rd = tempfile::tempdir().unwrap();
    let rcache = rd.path().join("ro.img");
    // Through the cache's residency map: a read-write mount's rebuild fetches segments as
    // they are read (issue 20 step C).
    let read_first = |p: &Path| {
        let dev = FileDevice::open(p, FileDeviceOptions::default()).unwrap();
        let view = ldfs::store::cache::ReadThroughDevice::open(
            Arc::new(dev),
            store.clone(),
            &ldfs_tools::cli::store::map_path(p),
        )
        .unwrap();
        let ro = LldOptions {
            read_only: true,
            ..LldOptions::default()
        };
        let lld = Lld::open(Arc::new(view), ro).unwrap();
        let v = lld.read(l, 0).unwrap().map(|v| v[0]);
        lld.close().unwrap();
        v
    };
    upload(1);
    prepare_cache(&*store, &url(), &rcache, None).unwrap();
    assert_eq!(read_first(&rcache), Some(1));
    upload(2);
    prepare_cache(&*store, &url(), &rcache, None).unwrap();
    assert_eq!(
        read_first(&rcache),
        Some(2),
        "a read-only mount's cache kept an older upload"
    );
    upload(3);
    lld.close().unwrap();
    seg.wait_uploaded(seg.announced(), Duration::from_secs(30))
        .unwrap();
    drop(lld);
    seg.stop();
    lease.release().unwrap();
    let lease2 = take_lease(store.clone(), &clock, false);
    prepare_cache(&*store, &url(), &rcache, Some(lease2.writer())).unwrap();
    assert_eq!(read_first(&rcache), Some(3));
}

/// Finding 6 (medium): a block device cache's note goes to `/dev/NAME.ldfs-store`: a
/// devtmpfs, emptied at every boot. After a reboot (the case fsync-durable-on-the-cache is
/// for) the note is gone, the cache is refused as a branch ("move it away"), and the writes
/// only it holds cannot be mounted or uploaded. The README says fsync survives a reboot.
#[test]
fn a_block_device_caches_note_survives_a_reboot() {
    let p = note_path(Path::new("/dev/nvme0n1p3"));
    assert!(
        !p.starts_with("/dev"),
        "the note of a block device cache is {} (devtmpfs: lost at boot)",
        p.display()
    );
}

/// Puts of segment and checkpoint objects refused for good (a quota exceeded, a policy), the
/// lease's own small puts accepted.
struct QuotaStore(MemoryStore);

impl ObjectStore for QuotaStore {
    fn put(&self, key: &str, bytes: &[u8]) -> StoreResult<()> {
        if key.starts_with("seg/") {
            return Err(StoreError::Refused {
                op: StoreOp::Put,
                key: key.into(),
                status: 403,
                detail: "QuotaExceeded".into(),
            });
        }
        self.0.put(key, bytes)
    }
    fn put_if_absent(&self, key: &str, bytes: &[u8]) -> StoreResult<PutOutcome> {
        self.0.put_if_absent(key, bytes)
    }
    fn get(&self, key: &str) -> StoreResult<Vec<u8>> {
        self.0.get(key)
    }
    fn get_range(&self, key: &str, offset: u64, len: u64) -> StoreResult<Vec<u8>> {
        self.0.get_range(key, offset, len)
    }
    fn delete(&self, key: &str) -> StoreResult<()> {
        self.0.delete(key)
    }
    fn list(&self, prefix: &str) -> StoreResult<Vec<ObjectInfo>> {
        self.0.list(prefix)
    }
}

/// Finding 7 (medium): the end of a mount releases the lease even when the final checkpoint
/// is not in the store (`StoreMount::finish` logs and releases). Another machine then mounts
/// at once, without `--force-takeover`, the older tree; its first upload makes this cache a
/// branch the mount refuses: the writes of the last window, fsynced and "kept in the cache for
/// the next mount", are stranded. Keeping the lease (it expires; a taker must force) would
/// let the next mount on this cache upload them.
#[test]
fn an_unmount_whose_final_upload_failed_keeps_the_lease() {
    let d = tempfile::tempdir().unwrap();
    let (cache, dev) = cache_file(d.path());
    let store: Arc<dyn ObjectStore> = Arc::new(QuotaStore(MemoryStore::new()));
    let lease = take_lease(store.clone(), &TestClock::default(), false);
    let seg = SegmentStore::start(store.clone(), dev, lease, fast()).unwrap();
    let lld = Arc::new(open(&seg));
    let l = lld.create_list(None, ListHints::default()).unwrap();
    write(&lld, l, 3);
    let mount = StoreMount::new(url(), seg, lld.clone(), 1 << 40);
    lld.close().unwrap();
    mount.finish(&cache, true);
    let (_, rec) = lease::current(&*store).unwrap().unwrap();
    let other = LeaseRecord {
        owner: 2,
        expires_secs: u64::MAX / 2,
        pid: 1,
        host: "other".into(),
    };
    let r = lease::acquire(&*store, other, 1, false);
    assert!(
        matches!(r, Err(LeaseError::Held { .. })),
        "with the final checkpoint only in the cache the lease was released (expiry {}): \
         another machine mounted the older tree without forcing: {r:?}",
        rec.expires_secs
    );
}

/// Finding 8 (medium): a writer waiting on the backlog (`StoreMount::before_write`) waits
/// while the uploader neither catches up nor fails; with the store down for good nothing ends
/// the wait: not a stopped uploader (`wait_backlog` then returns false at once, so the loop
/// spins on a core), not the end of the mount, not a signal to the writer. A FUSE write
/// blocked there keeps the mount busy: unmount never happens, nor the final checkpoint.
#[test]
fn a_writer_waiting_on_the_backlog_is_released_when_the_uploader_stops() {
    let d = tempfile::tempdir().unwrap();
    let (_cache, dev) = cache_file(d.path());
    let mem = Arc::new(MemoryStore::new());
    let store: Arc<dyn ObjectStore> = mem.clone();
    let lease = take_lease(store.clone(), &TestClock::default(), false);
    let seg = SegmentStore::start(store.clone(), dev, lease, fast()).unwrap();
    let lld = Arc::new(open(&seg));
    let l = lld.create_list(None, ListHints::default()).unwrap();
    // The store is gone for good.
    mem.set_faults(MemoryStoreFaults {
        lost_ppm: 1_000_000,
        ..MemoryStoreFaults::default()
    });
    write(&lld, l, 4);
    lld.flush().unwrap();
    let mount = Arc::new(StoreMount::new(url(), seg, lld.clone(), 1));
    let m2 = mount.clone();
    let writer = std::thread::spawn(move || m2.before_write());
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        !writer.is_finished(),
        "the writer must wait: the store is down"
    );
    // What an unmount does to the layer.
    mount.seg.stop();
    let t = Instant::now();
    while !writer.is_finished() && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        writer.is_finished(),
        "a writer waiting on the backlog still waits 10 s after the uploader stopped"
    );
}

/// Finding 9 (medium): `-o lease=` takes 4 s and up, but the fence (`HeldLease::check`) is
/// sound only if a request sent at half the duration from expiry lands before it: the S3
/// request timeout is 120 s, so any lease under 240 s lets a stale writer's checkpoint put or
/// delete land after a taker took over (see the library probe
/// `a_stale_writers_late_checkpoint_never_leaves_the_store_unrestorable`).
///
/// Fixed: a writer's requests time out at two fifths of its lease (at most 120 s), and a
/// lease is at least 10 s.
#[test]
fn a_lease_shorter_than_twice_the_request_timeout_is_refused() {
    use ldfs::store::lease::{request_timeout_for, MIN_LEASE};
    for secs in [
        MIN_LEASE.as_secs(),
        11,
        60,
        239,
        240,
        241,
        300,
        3600,
        86_400,
    ] {
        let d = Duration::from_secs(secs);
        let r = ldfs_tools::fuse::mount::parse_options(&[format!("lease={secs}")]);
        assert!(r.is_ok(), "lease={secs}: {:?}", r.err());
        let t = request_timeout_for(d);
        assert!(
            t * 2 < d && t <= Duration::from_secs(120),
            "lease={secs}: requests time out at {t:?}, not under half of it"
        );
    }
    let r = ldfs_tools::fuse::mount::parse_options(&[format!("lease={}", MIN_LEASE.as_secs() - 1)]);
    assert!(r.is_err(), "a lease under {MIN_LEASE:?} accepted");
}

/// Finding 12 (low): `ldfs mount` of a prefix that holds no file system (a typo, a bucket
/// never made with `mkfs --store`) is refused, but only after it created the cache file
/// (empty) and took and released the lease: a prefix the user never meant gets `lease/`
/// objects, and a stray empty file sits where the cache was named. Against the gateway
/// (skipped loudly without one); nothing is mounted.
#[test]
fn a_mount_of_a_prefix_without_a_file_system_leaves_nothing_behind() {
    use ldfs::store::{S3Config, S3Store};
    use ldfs::testing::ceph::{gateway, unique_bucket, Gateway};
    let vars = match gateway() {
        Gateway::Ready(v) => v,
        Gateway::Skip(why) => {
            eprintln!("*** SKIPPING the empty-prefix mount probe: {why} ***");
            return;
        }
    };
    let bucket = unique_bucket("r31empty");
    let cfg = S3Config::from_vars(&bucket, "typo", |k| vars.get(k).cloned()).unwrap();
    let s3 = S3Store::new(&cfg).unwrap();
    s3.create_bucket().unwrap();
    let d = tempfile::tempdir_in("/var/tmp").unwrap();
    let cache = d.path().join("cache.img");
    let dir = d.path().join("mnt");
    std::fs::create_dir(&dir).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ldfs"))
        .envs(&vars)
        .arg("mount")
        .arg(format!("s3://{bucket}/typo"))
        .arg(&dir)
        .arg("--cache")
        .arg(&cache)
        .arg("-f")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("holds no file system"),
        "{err}"
    );
    let leases = s3.list("lease/").unwrap();
    assert!(
        leases.is_empty() && !cache.exists(),
        "a refused mount left {leases:?} in the store, cache file there: {}",
        cache.exists()
    );
}

/// A loop device over a file in /var/tmp, detached on drop (skipped loudly without loop
/// devices).
struct Loop {
    dev: std::path::PathBuf,
    _file: tempfile::NamedTempFile,
}

impl Loop {
    fn new(bytes: u64) -> Option<Loop> {
        if !Path::new("/dev/loop-control").exists() {
            eprintln!("*** SKIPPING: no loop devices ***");
            return None;
        }
        let file = tempfile::NamedTempFile::new_in("/var/tmp").unwrap();
        file.as_file().set_len(bytes).unwrap();
        let out = std::process::Command::new("losetup")
            .args(["-f", "--show"])
            .arg(file.path())
            .output()
            .ok()?;
        if !out.status.success() {
            eprintln!(
                "*** SKIPPING: losetup: {} ***",
                String::from_utf8_lossy(&out.stderr)
            );
            return None;
        }
        let dev = String::from_utf8_lossy(&out.stdout).trim().to_string();
        Some(Loop {
            dev: dev.into(),
            _file: file,
        })
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(note_path(&self.dev));
        let _ = std::fs::remove_file(ldfs_tools::cli::store::map_path(&self.dev));
        let _ = std::process::Command::new("losetup")
            .arg("-d")
            .arg(&self.dev)
            .status();
    }
}

/// Finding 13 (high; fixed on review31): a block device cache never works. `cache_geometry` takes the file
/// length from `metadata().len()`, which is 0 for a block device, so every read-write mount
/// sees "an empty cache" and rebuilds it from the store (the writes only the cache held are
/// overwritten), and the rebuild's `set_len` (ftruncate) on the device fails: the mount is
/// refused. `ldfs mkfs --store --cache /dev/...` works, so the file system it made cannot be
/// mounted on that cache. The README and `--cache`'s help offer a block device.
#[test]
fn a_block_device_cache_is_kept_across_mounts() {
    let Some(lo) = Loop::new(CACHE_BYTES) else {
        return;
    };
    let dev: Arc<dyn Device> =
        Arc::new(FileDevice::open(&lo.dev, FileDeviceOptions::default()).unwrap());
    ldfs::lld::mkfs::mkfs(&*dev, &mkfs_opts()).unwrap();
    let store = Arc::new(MemoryStore::new());
    let clock = TestClock::default();
    let lease = take_lease(store.clone(), &clock, false);
    write_note(&lo.dev, &url(), 3131, lease.writer()).unwrap();
    let seg = SegmentStore::start(store.clone(), dev, lease.clone(), fast()).unwrap();
    let lld = open(&seg);
    let l = lld.create_list(None, ListHints::default()).unwrap();
    write(&lld, l, 1);
    lld.checkpoint_now().unwrap();
    seg.wait_uploaded(seg.announced(), Duration::from_secs(30))
        .unwrap();
    // Written and durable on the cache, not uploaded (the machine crashed).
    store.set_faults(MemoryStoreFaults {
        lost_ppm: 1_000_000,
        ..MemoryStoreFaults::default()
    });
    write(&lld, l, 2);
    lld.close().unwrap();
    drop(lld);
    seg.stop();
    lease.abandon();
    store.set_faults(MemoryStoreFaults::default());
    // The remount on the same cache, as its last writer (nobody wrote since).
    let r = prepare_cache(&*store, &url(), &lo.dev, Some(lease.writer() + 2));
    assert!(r.is_ok(), "the block device cache was refused: {r:?}");
    let dev = FileDevice::open(&lo.dev, FileDeviceOptions::default()).unwrap();
    let lld = Lld::open(Arc::new(dev), LldOptions::default()).unwrap();
    let first = lld.read(l, 0).unwrap().map(|v| (v.len(), v[0]));
    assert_eq!(
        first,
        Some((9000, 2)),
        "the block device cache was rebuilt over its unuploaded writes"
    );
    drop(lld);
    // Zeros at both superblock copies (a new machine's device): rebuilt from the store in
    // place. (Page 0 alone zeroed with copy 1 good is a cache whose page 0 was lost: opened,
    // never rebuilt over, store5.)
    let dev = FileDevice::open(&lo.dev, FileDeviceOptions::default()).unwrap();
    dev.write_at(&[0u8; ldfs::lld::PAGE_BYTES], 0).unwrap();
    dev.write_at(
        &[0u8; ldfs::lld::PAGE_BYTES],
        ldfs::lld::layout::copy1_addr(dev.size_bytes()),
    )
    .unwrap();
    dev.flush().unwrap();
    drop(dev);
    prepare_cache(&*store, &url(), &lo.dev, Some(lease.writer() + 4)).unwrap();
    let dev = FileDevice::open(&lo.dev, FileDeviceOptions::default()).unwrap();
    // Rebuilt for a read-write mount: segments are fetched as read (issue 20 step C).
    let view = ldfs::store::cache::ReadThroughDevice::open(
        Arc::new(dev),
        store.clone(),
        &ldfs_tools::cli::store::map_path(&lo.dev),
    )
    .unwrap();
    let ro = LldOptions {
        read_only: true,
        ..LldOptions::default()
    };
    let lld = Lld::open(Arc::new(view), ro).unwrap();
    let first = lld.read(l, 0).unwrap().map(|v| (v.len(), v[0]));
    assert_eq!(
        first,
        Some((9000, 1)),
        "the rebuild holds the uploaded tree"
    );
}
