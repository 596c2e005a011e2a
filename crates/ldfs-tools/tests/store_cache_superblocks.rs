//! A store cache's superblock copies and what a mount does with a cache whose page 0 is gone or
//! torn (`cli::store::prepare_cache_sized`; issue 20, store5). Page 0 zeros or torn with copy 1
//! good is a cache of the file system, not an empty one: a writer's is opened (page 0 restored
//! from copy 1), never rebuilt over (its fsynced, unuploaded writes would go with it); a
//! reader's is rebuilt. A page 0 that is neither zeros, a superblock nor a torn write of copy
//! 1's superblock is refused, whatever the note says (review 37 finding 2).

use std::os::unix::fs::FileExt;
use std::sync::Arc;

use ldfs::device::{Device, FileDevice, FileDeviceOptions};
use ldfs::ld::LogicalDisk;
use ldfs::lld::PAGE_BYTES;
use ldfs::store::ObjectStore;
use ldfs::testing::store::take_lease;
use ldfs_tools::cli::store::{map_path, prepare_cache_sized, StoreUrl};

mod common;
use common::store_cache::{open_cache, store_with_fs, writers_cache_with_unuploaded_write};

/// store5 finding (issue 20): a writer's cache whose page 0 reads as zeros (a sector lost, a
/// stray write) while superblock copy 1 is good was taken for an empty cache (`cache_geometry`
/// looked at page 0 alone: `None => true`) and rebuilt from the store, losing the writes it
/// held that were fsynced and never uploaded. It must be opened (lld falls back to copy 1;
/// page 0 is restored from it) or refused, never rebuilt over.
#[test]
fn a_writers_cache_whose_page_0_is_lost_is_opened_not_rebuilt() {
    let d = tempfile::tempdir().unwrap();
    let url = StoreUrl::parse("s3://store5/page0").unwrap();
    let (store, clock) = store_with_fs(0x5105);
    let cache = d.path().join("c.img");
    let l = writers_cache_with_unuploaded_write(&cache, &url, &store, &clock);
    // Page 0 lost.
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&cache)
        .unwrap();
    f.write_all_at(&[0u8; PAGE_BYTES], 0).unwrap();
    f.sync_all().unwrap();
    let lease = take_lease(store.clone(), &clock, true);
    let r = prepare_cache_sized(
        &*store as &dyn ObjectStore,
        &url,
        &cache,
        Some(lease.writer()),
        None,
    );
    assert!(
        r.is_ok(),
        "a writer's cache with a good copy 1 was refused: {r:?}"
    );
    let (seg, lld) = open_cache(&cache, &store, &lease);
    let got = lld.read(l, 0);
    assert!(
        matches!(&got, Ok(Some(b)) if b[..] == [0x5a; 5000][..]),
        "the cache was rebuilt over: its fsynced, unuploaded write is gone ({:?})",
        got.map(|b| b.map(|b| b.len()))
    );
    drop(lld);
    drop(seg);
}

/// The same with page 0 torn (half of it zeros): a writer's cache is opened, its write there.
#[test]
fn a_writers_cache_whose_page_0_is_torn_is_opened() {
    let d = tempfile::tempdir().unwrap();
    let url = StoreUrl::parse("s3://store5/torn").unwrap();
    let (store, clock) = store_with_fs(0x5105);
    let cache = d.path().join("c.img");
    let l = writers_cache_with_unuploaded_write(&cache, &url, &store, &clock);
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&cache)
        .unwrap();
    f.write_all_at(&[0u8; PAGE_BYTES / 2], (PAGE_BYTES / 2) as u64)
        .unwrap();
    f.sync_all().unwrap();
    let lease = take_lease(store.clone(), &clock, true);
    prepare_cache_sized(
        &*store as &dyn ObjectStore,
        &url,
        &cache,
        Some(lease.writer()),
        None,
    )
    .expect("a writer's cache with page 0 torn and copy 1 good");
    let (seg, lld) = open_cache(&cache, &store, &lease);
    let got = lld.read(l, 0);
    assert!(
        matches!(&got, Ok(Some(b)) if b[..] == [0x5a; 5000][..]),
        "the write is gone ({:?})",
        got.map(|b| b.map(|b| b.len()))
    );
    drop(lld);
    drop(seg);
}

/// Guard: page 0 overwritten by something else (another file system's start) with the
/// device's last page still holding this file system's copy 1 (a cache whose name or disk was
/// reused; the note a stale reader's) is refused and left as it is: only a torn write of
/// copy 1's own superblock (each sector zeros or that superblock's bytes) counts as ours.
#[test]
fn a_foreign_page_0_over_a_good_copy_1_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let url = StoreUrl::parse("s3://store5/foreign").unwrap();
    let (store, _clock) = store_with_fs(0x5105);
    let cache = d.path().join("c.img");
    std::fs::File::create(&cache).unwrap();
    // A read-only mount's cache (noted READER): rebuilt at every mount.
    prepare_cache_sized(&*store as &dyn ObjectStore, &url, &cache, None, None).unwrap();
    // Its start reused: a superblock-like structure of another kind at 1 KiB.
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&cache)
        .unwrap();
    let mut page = vec![0u8; PAGE_BYTES];
    for (i, b) in page[1024..2048].iter_mut().enumerate() {
        *b = (i % 253) as u8 + 1;
    }
    f.write_all_at(&page, 0).unwrap();
    f.sync_all().unwrap();
    let before = std::fs::read(&cache).unwrap();
    let r = prepare_cache_sized(&*store as &dyn ObjectStore, &url, &cache, None, None);
    assert!(r.is_err(), "a foreign page 0 was rebuilt over");
    assert!(
        std::fs::read(&cache).unwrap() == before,
        "the device was changed"
    );
}

/// Review 36 finding 4's other half, the cache's identity (store5): the note is found by the
/// cache's path, so a cache moved to a path whose note is another cache's took that note.
/// A writer's note (current: no later writer) at a path now holding another cache of the same
/// file system (a read-only mount's, rebuilt from the store; or a disk swapped under a /dev
/// name) made the mount keep it as the writer's, and upload its tree as the next head: a
/// branch the writer never wrote. The note records the cache's identity (an id each rebuild
/// and `mkfs --store` writes into both superblock copies); a note of another cache is refused.
#[test]
fn a_writers_note_does_not_vouch_for_another_cache_at_its_path() {
    let d = tempfile::tempdir().unwrap();
    let url = StoreUrl::parse("s3://store5/swap").unwrap();
    let (store, clock) = store_with_fs(0x5105);
    let a = d.path().join("a.img");
    let b = d.path().join("b.img");
    std::fs::File::create(&a).unwrap();
    std::fs::File::create(&b).unwrap();
    let lease = take_lease(store.clone(), &clock, true);
    prepare_cache_sized(
        &*store as &dyn ObjectStore,
        &url,
        &a,
        Some(lease.writer()),
        None,
    )
    .unwrap();
    // Another cache of the same file system (a read-only mount's), moved to a's path.
    prepare_cache_sized(&*store as &dyn ObjectStore, &url, &b, None, None).unwrap();
    std::fs::rename(&b, &a).unwrap();
    let before = std::fs::read(&a).unwrap();
    let r = prepare_cache_sized(
        &*store as &dyn ObjectStore,
        &url,
        &a,
        Some(lease.writer()),
        None,
    );
    assert!(
        r.is_err(),
        "another cache at a writer's path was taken as the writer's cache"
    );
    assert!(
        std::fs::read(&a).unwrap() == before,
        "the cache was changed"
    );
}

/// The same the other way: a writer's cache (holding a write never uploaded) moved to a path
/// whose note is a read-only mount's (READER, rebuilt at every mount) was rebuilt over by the
/// next read-only mount there, its write lost. Refused: the note is of another cache.
#[test]
fn a_readers_note_does_not_vouch_for_a_writers_cache_at_its_path() {
    let d = tempfile::tempdir().unwrap();
    let url = StoreUrl::parse("s3://store5/swap2").unwrap();
    let (store, clock) = store_with_fs(0x5105);
    let w = d.path().join("w.img");
    let r = d.path().join("r.img");
    writers_cache_with_unuploaded_write(&w, &url, &store, &clock);
    std::fs::File::create(&r).unwrap();
    prepare_cache_sized(&*store as &dyn ObjectStore, &url, &r, None, None).unwrap();
    std::fs::rename(&w, &r).unwrap();
    let before = std::fs::read(&r).unwrap();
    let got = prepare_cache_sized(&*store as &dyn ObjectStore, &url, &r, None, None);
    assert!(
        got.is_err(),
        "a writer's cache at a reader's path was rebuilt over"
    );
    assert!(
        std::fs::read(&r).unwrap() == before,
        "the cache was changed"
    );
}

/// The offline tools too (`fsck -n`, `inspect` read a cache through the residency map beside
/// its note): a cache at a path whose note (and map) are another cache's is refused, not read
/// with the other cache's map (which would send its reads to the wrong objects or take its
/// holes for data).
#[test]
fn the_offline_tools_refuse_a_cache_whose_note_is_another_caches() {
    let d = tempfile::tempdir().unwrap();
    let url = StoreUrl::parse("s3://store5/tools").unwrap();
    let (store, clock) = store_with_fs(0x5105);
    let a = d.path().join("a.img");
    let b = d.path().join("b.img");
    std::fs::File::create(&a).unwrap();
    std::fs::File::create(&b).unwrap();
    // A writer's cold cache (a residency map beside it), and a read-only mount's moved there.
    let lease = take_lease(store.clone(), &clock, true);
    prepare_cache_sized(
        &*store as &dyn ObjectStore,
        &url,
        &a,
        Some(lease.writer()),
        None,
    )
    .unwrap();
    assert!(map_path(&a).exists());
    prepare_cache_sized(&*store as &dyn ObjectStore, &url, &b, None, None).unwrap();
    std::fs::rename(&b, &a).unwrap();
    let dev: Arc<dyn Device> =
        Arc::new(FileDevice::open(&a, FileDeviceOptions::default()).unwrap());
    match ldfs_tools::cli::store::read_through(&a, dev) {
        Err(why) => assert!(why.contains("another cache"), "{why}"),
        Ok(v) => panic!("read through another cache's map: {:?}", v.map(|v| v.1)),
    }
}
