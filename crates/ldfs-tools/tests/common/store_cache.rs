//! A store cache over a memory store for the tools' store tests (`store_cache_superblocks`,
//! review 41's probes): a store holding a file system, a cache opened as a read-write mount
//! does, and a writer's cache holding a write never uploaded.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use ldfs::device::{Device, FileDevice, FileDeviceOptions, MemoryDevice};
use ldfs::ld::{ListHints, ListId, LogicalDisk};
use ldfs::lld::layout::MkfsOptions;
use ldfs::lld::{Lld, LldOptions};
use ldfs::store::{CacheConfig, MemoryStore, ObjectStore, SegmentStore, SegmentStoreOptions};
use ldfs::testing::store::{crash_lease, take_lease, TestClock};
use ldfs_tools::cli::store::{map_path, prepare_cache_sized, StoreUrl};

pub const DEV_BYTES: u64 = 16 << 20;

/// A store holding a file system (one checkpoint uploaded by a writer that then crashed) and
/// the clock its lease is on.
pub fn store_with_fs(fs_id: u64) -> (Arc<MemoryStore>, TestClock) {
    let store = Arc::new(MemoryStore::new());
    let clock = TestClock::default();
    let dev: Arc<dyn Device> = Arc::new(MemoryDevice::new(DEV_BYTES));
    ldfs::lld::mkfs::mkfs(
        &*dev,
        &MkfsOptions {
            segment_bytes: 128 << 10,
            max_block_bytes: 32 << 10,
            reserved_segments: Some(4),
            fs_id,
            max_bytes: None,
            kept_pages: 0,
        },
    )
    .unwrap();
    let lease = take_lease(store.clone(), &clock, false);
    let seg = SegmentStore::start(
        store.clone(),
        dev,
        lease.clone(),
        SegmentStoreOptions::default(),
    )
    .unwrap();
    let lld = Lld::open(
        seg.device(),
        LldOptions {
            checkpoint_hook: Some(seg.hook()),
            ..LldOptions::default()
        },
    )
    .unwrap();
    let l = lld.create_list(None, ListHints::default()).unwrap();
    for i in 0..20 {
        lld.write(None, l, i, &[7u8; 9000]).unwrap();
    }
    lld.close().unwrap();
    seg.wait_uploaded(seg.announced(), Duration::from_secs(30))
        .unwrap();
    seg.stop();
    crash_lease(&lease, &clock);
    (store, clock)
}

/// Opens the cache as a read-write mount does.
pub fn open_cache(
    cache: &Path,
    store: &Arc<MemoryStore>,
    lease: &Arc<ldfs::store::HeldLease>,
) -> (SegmentStore, Lld) {
    open_cache_as_a_mount(cache, store, lease, false)
}

/// `open_cache`, with the uploads held from before lld's open if `held` (as a read-write mount
/// does until it serves: `fuse::mount`, `SegmentStore::hold_uploads`).
pub fn open_cache_as_a_mount(
    cache: &Path,
    store: &Arc<MemoryStore>,
    lease: &Arc<ldfs::store::HeldLease>,
    held: bool,
) -> (SegmentStore, Lld) {
    let dev: Arc<dyn Device> =
        Arc::new(FileDevice::open(cache, FileDeviceOptions::default()).unwrap());
    let seg = SegmentStore::start_cached(
        store.clone(),
        dev,
        lease.clone(),
        SegmentStoreOptions::default(),
        Some(CacheConfig::new(map_path(cache), None)),
    )
    .unwrap();
    if held {
        seg.hold_uploads();
    }
    let lld = Lld::open(
        seg.device(),
        LldOptions {
            checkpoint_hook: Some(seg.hook()),
            ..LldOptions::default()
        },
    )
    .unwrap();
    (seg, lld)
}

/// A writer's cache holding a write fsynced and never uploaded (its mount crashed).
pub fn writers_cache_with_unuploaded_write(
    cache: &Path,
    url: &StoreUrl,
    store: &Arc<MemoryStore>,
    clock: &TestClock,
) -> ListId {
    std::fs::File::create(cache).unwrap();
    let lease = take_lease(store.clone(), clock, true);
    prepare_cache_sized(
        &**store as &dyn ObjectStore,
        url,
        cache,
        Some(lease.writer()),
        None,
    )
    .unwrap();
    let (seg, lld) = open_cache(cache, store, &lease);
    let l = lld.create_list(None, ListHints::default()).unwrap();
    lld.write(None, l, 0, &[0x5a; 5000]).unwrap();
    lld.flush().unwrap();
    seg.stop();
    drop(lld);
    drop(seg);
    crash_lease(&lease, clock);
    l
}
