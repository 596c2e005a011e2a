//! Review 37's probes of f440280 (a rebuild first zeroes page 0, the geometry's superblock copy
//! 1 and the device's last page). Each probe fails while the defect its doc comment names is
//! there. `#[ignore]` marks an open defect:
//! `cargo test --release -p ldfs --test review37_probes -- --ignored` runs them.

use std::sync::Arc;
use std::time::Duration;

use ldfs::device::{Device, MemoryDevice};
use ldfs::ld::{ListHints, LogicalDisk};
use ldfs::lld::layout::MkfsOptions;
use ldfs::lld::verify::check_superblocks;
use ldfs::lld::{Lld, LldOptions};
use ldfs::store::{restore, restore_lazy, MemoryStore, SegmentStore};
use ldfs::testing::store::fast_backoff as fast;
use ldfs::testing::store::{take_lease, TestClock};

const DEV_BYTES: u64 = 16 << 20;

fn mkfs_opts() -> MkfsOptions {
    MkfsOptions {
        segment_bytes: 128 << 10,
        max_block_bytes: 32 << 10,
        reserved_segments: Some(4),
        fs_id: 3737,
        max_bytes: None,
        kept_pages: 0,
    }
}

/// A store holding one uploaded checkpoint of a 16 MiB file system.
fn uploaded_store() -> Arc<MemoryStore> {
    uploaded_store_with(&mkfs_opts())
}

/// [`uploaded_store`] of a file system made with `opts`.
fn uploaded_store_with(opts: &MkfsOptions) -> Arc<MemoryStore> {
    let store = Arc::new(MemoryStore::new());
    let clock = TestClock::default();
    let dev: Arc<dyn Device> = Arc::new(MemoryDevice::new(DEV_BYTES));
    ldfs::lld::mkfs::mkfs(&*dev, opts).unwrap();
    let lease = take_lease(store.clone(), &clock, false);
    let seg = SegmentStore::start(store.clone(), dev, lease, fast()).unwrap();
    let lld = Lld::open(
        seg.device(),
        LldOptions {
            checkpoint_hook: Some(seg.hook()),
            segment_hook: Some(seg.segment_hook()),
            ..LldOptions::default()
        },
    )
    .unwrap();
    let l = lld.create_list(None, ListHints::default()).unwrap();
    for i in 0..20 {
        lld.write(None, l, i, &[7u8; 9000]).unwrap();
    }
    lld.checkpoint_now().unwrap();
    seg.wait_uploaded(seg.announced(), Duration::from_secs(30))
        .unwrap();
    store
}

/// Finding 1: on a cache larger than the file system (a block device, or a cache file a larger
/// file system left), the superblock copy 1 that `read_superblock`, `Lld::open`'s fallback and
/// fsck's `check_superblocks` read is the device's last page (the resize format: the device's
/// size is the total). `forget_cache` now zeroes that page, and `write_slot_and_superblocks`
/// rewrites only the checkpoint geometry's copy 1 (the writer's device's last page): after a
/// *finished* rebuild the device's copy 1 is zeros, fsck reports "superblock copy 1" damage on
/// a healthy cache, and a later damaged page 0 has no copy to fall back to. Before f440280 the
/// page held whatever the device held (an older cache's copy). Both rebuilds.
#[test]
fn a_finished_rebuild_on_a_larger_device_has_both_superblock_copies() {
    let store = uploaded_store();
    let map = std::env::temp_dir().join(format!("review37-map-{}", std::process::id()));
    for lazy in [false, true] {
        // A device twice the file system's size (a block device, or a larger earlier cache).
        let dev = MemoryDevice::new(2 * DEV_BYTES);
        let r = if lazy {
            restore_lazy(&*store, &dev, &map)
        } else {
            restore(&*store, &dev)
        };
        r.expect("rebuild");
        let (geo, problems) = check_superblocks(&dev).unwrap();
        assert!(geo.is_some());
        let texts: Vec<_> = problems.iter().map(|p| p.text.clone()).collect();
        assert!(
            texts.is_empty(),
            "lazy={lazy}: a finished rebuild fsck reports as damaged: {texts:?}"
        );
        // And lld's fallback to copy 1 works: page 0 damaged, the cache still opens.
        dev.write_at(&[0xffu8; 16], 8).unwrap();
        assert!(
            ldfs::lld::mkfs::read_superblock(&dev).is_ok(),
            "lazy={lazy}: page 0 damaged after a finished rebuild, no copy 1 to fall back to"
        );
    }
    let _ = std::fs::remove_file(&map);
}

/// Guard: on a device of exactly the file system's size, a finished rebuild leaves both copies
/// good (the geometry's copy 1 is the device's last page).
#[test]
fn a_finished_rebuild_on_an_exact_device_has_both_superblock_copies() {
    let store = uploaded_store();
    let map = std::env::temp_dir().join(format!("review37-map-exact-{}", std::process::id()));
    for lazy in [false, true] {
        let dev = MemoryDevice::new(DEV_BYTES);
        let r = if lazy {
            restore_lazy(&*store, &dev, &map)
        } else {
            restore(&*store, &dev)
        };
        r.expect("rebuild");
        let (_, problems) = check_superblocks(&dev).unwrap();
        assert!(problems.is_empty(), "lazy={lazy}: {:?}", problems.len());
    }
    let _ = std::fs::remove_file(&map);
}

/// Review 37 finding 1's other half (store5): fsck's repair of superblock copy 1 on a device
/// larger than a file system without the resize flag wrote the geometry's last page, which no
/// reader looks at: the damage it reported ("superblock copy 1" at the device's last page)
/// stayed after the repair. A copy of a 16 MiB image on a 32 MiB device (a cache rebuilt there
/// by an older binary), repaired: both copies good after.
#[test]
fn fsck_repairs_copy_1_where_it_reads_it_on_a_larger_device() {
    let small = MemoryDevice::new(DEV_BYTES);
    let g = ldfs::lld::mkfs::mkfs(&small, &mkfs_opts()).unwrap();
    assert!(!g.resizable());
    let big = MemoryDevice::new(2 * DEV_BYTES);
    let mut b = vec![0u8; DEV_BYTES as usize];
    small.read_at(&mut b, 0).unwrap();
    big.write_at(&b, 0).unwrap();
    let (geo, problems) = check_superblocks(&big).unwrap();
    assert_eq!(problems.len(), 1, "the copy's device's last page is zeros");
    ldfs::lld::verify::rewrite_superblock(&big, &geo.unwrap(), 1).unwrap();
    let (_, problems) = check_superblocks(&big).unwrap();
    let texts: Vec<_> = problems.iter().map(|p| p.text.clone()).collect();
    assert!(
        texts.is_empty(),
        "copy 1 repaired where no one reads it: {texts:?}"
    );
}

/// store5: the same for a file system with room to grow (`INCOMPAT_RESIZE`: the device's size
/// is its total, so both copies decode to the larger device's geometry): both rebuilds on a
/// device twice its size leave both copies good, and page 0 damaged the cache still opens
/// through copy 1 with the uploaded tree.
#[test]
fn a_finished_rebuild_of_a_resizable_fs_on_a_larger_device_has_both_copies() {
    let store = uploaded_store_with(&MkfsOptions {
        max_bytes: Some(4 * DEV_BYTES),
        ..mkfs_opts()
    });
    let map = std::env::temp_dir().join(format!("review37-map-resize-{}", std::process::id()));
    for lazy in [false, true] {
        let dev = MemoryDevice::new(2 * DEV_BYTES);
        if lazy {
            restore_lazy(&*store, &dev, &map).expect("rebuild");
        } else {
            restore(&*store, &dev).expect("rebuild");
        }
        let (geo, problems) = check_superblocks(&dev).unwrap();
        assert!(geo.unwrap().resizable());
        let texts: Vec<_> = problems.iter().map(|p| p.text.clone()).collect();
        assert!(texts.is_empty(), "lazy={lazy}: {texts:?}");
        dev.write_at(&[0xffu8; 16], 8).unwrap();
        let (g, errs) = ldfs::lld::mkfs::read_superblock(&dev).expect("copy 1");
        assert!(errs[0].is_some() && errs[1].is_none());
        assert_eq!(g.total_pages, 2 * DEV_BYTES / ldfs::lld::PAGE_BYTES as u64);
    }
    let _ = std::fs::remove_file(&map);
}
