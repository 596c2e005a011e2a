//! Review 36's probe of a cache rebuild's crash windows in `prepare_cache` (the rebuilds'
//! checkpoint choice, e30acc4, is probed in `crates/ldfs/tests/review36_probes.rs`). `#[ignore]`
//! marks an open defect: `cargo test --release -p ldfs-tools --test review36_probes --
//! --ignored` runs it.

mod common;

use std::sync::Arc;

use ldfs::lld::PAGE_BYTES;
use ldfs::store::{MemoryStore, ObjectStore};
use ldfs::testing::store::{crash_lease, take_lease, TestClock};
use ldfs_tools::cli::store::{note_path, prepare_cache_sized, StoreUrl};

/// A store holding a file system (one checkpoint uploaded by a writer that then crashed) and
/// the clock its lease is on.
fn store_with_fs() -> (Arc<MemoryStore>, TestClock) {
    common::store_cache::store_with_fs(0x3636)
}

/// Finding 2 (low; availability, no data lost): a read-write mount on an absent (or zeroed)
/// cache rebuilds it with `restore_lazy` and writes its note (`writer=G`) only afterwards.
/// Killed between the two (the rebuild's last flush done, the note not yet written; the
/// mount's signals are not blocked yet, so a Ctrl-C there does it), the cache holds a whole
/// rebuild of the store's newest checkpoint and no note. The next read-write mount (the lease
/// taken over) finds a cache of this file system without a note and refuses it: "is older than
/// s3://...: a later writer ... uploaded ... after this cache was last mounted read-write; it
/// holds a branch the store no longer has" — neither true nor rebuilt; the user must delete the
/// cache. Fix: write the note as `READER` (0) before any rebuild, for read-write mounts too, as
/// the read-only path already does: a rebuild cut short, or finished but not yet noted as the
/// writer's, is then rebuilt again by any mount (tried on review36 with finding 4's fix, not
/// committed: both probes pass, and review 31, 32 and 34's tools probes still do).
#[test]
fn a_writers_rebuild_killed_before_its_note_is_rebuilt_or_used() {
    let d = tempfile::tempdir().unwrap();
    let url = StoreUrl::parse("s3://probe36/note").unwrap();
    let (store, clock) = store_with_fs();
    // A read-write mount on a new cache (the mount makes the file empty) whose process dies
    // between the rebuild and the note: the note's write fails there (a directory where its
    // temporary file goes), which leaves the cache as a kill -9 at that instant would.
    let cache = d.path().join("c.img");
    std::fs::File::create(&cache).unwrap();
    let blocker = note_path(&cache).with_extension("ldfs-store.tmp");
    std::fs::create_dir(&blocker).unwrap();
    let lease_b = take_lease(store.clone(), &clock, true);
    let r = prepare_cache_sized(
        &*store as &dyn ObjectStore,
        &url,
        &cache,
        Some(lease_b.writer()),
        None,
    );
    assert!(r.is_err(), "the note was written: the probe tests nothing");
    std::fs::remove_dir(&blocker).unwrap();
    assert!(!note_path(&cache).exists());
    crash_lease(&lease_b, &clock);
    // The next read-write mount of the same cache.
    let lease_c = take_lease(store.clone(), &clock, true);
    let r = prepare_cache_sized(
        &*store as &dyn ObjectStore,
        &url,
        &cache,
        Some(lease_c.writer()),
        None,
    );
    assert!(
        r.is_ok(),
        "a cache whose rebuild finished but was not yet noted is refused: {r:?}"
    );
}

/// Finding 4 (low; availability after a power cut, no data lost): a rebuild writes page 0 (the
/// superblock) last and a power cut can tear that write (the crash model, `CrashDevice`, lands
/// a write's sectors independently), as it can tear `restore_lazy`'s first write (page 0's
/// zeros over an older cache). Page 0 is then neither zeros nor a superblock, and the next mount
/// refuses the cache — `cache_geometry` fails ("not an ldfs cache: ...") before the note is
/// looked at — though the note says it is a reader's (rebuilt at every mount), or, on a writer's
/// rebuild with the fix of finding 2, that it was being rebuilt. Fix: a cache whose note says
/// `READER` (written before every rebuild) is rebuilt whatever page 0 holds; only a cache with
/// no note, or a writer's, is refused when page 0 is not a superblock (tried with finding 2's
/// fix: both probes pass). Fixed on store5 without trusting the note for the device (review 37
/// finding 2): the rebuild flushes copy 1 before page 0, and a page 0 each of whose sectors is
/// zeros or copy 1's superblock, copy 1 good, is the file system's cache.
#[test]
fn a_readers_rebuild_torn_at_its_last_write_is_rebuilt() {
    let d = tempfile::tempdir().unwrap();
    let url = StoreUrl::parse("s3://probe36/torn").unwrap();
    let (store, _clock) = store_with_fs();
    let cache = d.path().join("c.img");
    // The mount makes the file empty; the read-only mount's rebuild (note READER first).
    std::fs::File::create(&cache).unwrap();
    prepare_cache_sized(&*store as &dyn ObjectStore, &url, &cache, None, None).unwrap();
    // Its last write (the superblock at page 0, over the zeros a fresh file holds) torn by a
    // power cut: only its first sectors landed.
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&cache)
            .unwrap();
        f.write_all_at(&[0u8; PAGE_BYTES / 2], (PAGE_BYTES / 2) as u64)
            .unwrap();
        f.sync_all().unwrap();
    }
    let r = prepare_cache_sized(&*store as &dyn ObjectStore, &url, &cache, None, None);
    assert!(
        r.is_ok(),
        "a reader's cache whose rebuild was torn at its last write is refused: {r:?}"
    );
}
