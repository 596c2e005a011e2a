//! Review 37's probe of f440280's `prepare_cache_sized` (a cache noted READER is rebuilt
//! whatever page 0 holds). `#[ignore]` marks an open defect:
//! `cargo test --release -p ldfs-tools --test review37_probes -- --ignored` runs it.

mod common;

use std::sync::Arc;

use ldfs::store::{MemoryStore, ObjectStore};
use ldfs_tools::cli::store::{note_path, prepare_cache_sized, StoreUrl};

const DEV_BYTES: u64 = 16 << 20;
const FS_ID: u64 = 0x3737;

/// A store holding a file system (one checkpoint uploaded by a writer that then crashed).
fn store_with_fs() -> Arc<MemoryStore> {
    common::store_cache::store_with_fs(FS_ID).0
}

/// Finding 2: the note is a sidecar keyed by the cache's path (`c.img.ldfs-store`, or
/// `/var/lib/.../dev%sdb.ldfs-store` for a block device) and outlives what is at that path: a
/// cache file removed and the name reused for other data, or `/dev/sdb` naming another disk
/// after a reboot. Before f440280 a page 0 that is neither zeros nor an ldfs superblock was
/// refused ("not an ldfs cache") whatever the note said; now a stale READER note for this fs
/// makes `prepare_cache_sized` rebuild over it, destroying the foreign data. Only a torn
/// superblock write needs the pass (forget_cache zeroed page 0 first): page 0 should at least
/// carry the superblock's magic (or the fs id) before the note is trusted over it.
#[test]
fn a_stale_reader_note_does_not_rebuild_over_foreign_data() {
    let d = tempfile::tempdir().unwrap();
    let url = StoreUrl::parse("s3://probe37/foreign").unwrap();
    let store = store_with_fs();
    let cache = d.path().join("c.img");
    // A read-only mount's cache (noted READER), later removed; the note stays beside it.
    std::fs::File::create(&cache).unwrap();
    prepare_cache_sized(&*store as &dyn ObjectStore, &url, &cache, None, None).unwrap();
    std::fs::remove_file(&cache).unwrap();
    // The name reused for something else: not zeros, not an ldfs superblock.
    let foreign: Vec<u8> = (0..DEV_BYTES).map(|i| (i % 251) as u8 + 1).collect();
    std::fs::write(&cache, &foreign).unwrap();
    let r = prepare_cache_sized(&*store as &dyn ObjectStore, &url, &cache, None, None);
    let now = std::fs::read(&cache).unwrap();
    assert!(
        r.is_err() && now == foreign,
        "a READER note outlived its cache, and the file now at its path (not an ldfs cache) \
         was rebuilt over: {r:?}"
    );
}

/// Guard: a writer's note is never replaced by READER without a rebuild it asked for: a
/// read-only mount beside a writer's cache is refused and leaves the writer's note as it was.
#[test]
fn a_read_only_mount_leaves_a_writers_note_alone() {
    let d = tempfile::tempdir().unwrap();
    let url = StoreUrl::parse("s3://probe37/writer").unwrap();
    let store = store_with_fs();
    let cache = d.path().join("c.img");
    std::fs::File::create(&cache).unwrap();
    // A writer (lease generation 5) rebuilt and noted the cache.
    prepare_cache_sized(&*store as &dyn ObjectStore, &url, &cache, Some(5), None).unwrap();
    let note = note_path(&cache);
    let before = std::fs::read_to_string(&note).unwrap();
    assert!(before.contains("writer=5"), "{before}");
    let r = prepare_cache_sized(&*store as &dyn ObjectStore, &url, &cache, None, None);
    assert!(r.is_err(), "a read-only mount took a writer's cache");
    assert_eq!(std::fs::read_to_string(&note).unwrap(), before);
}
