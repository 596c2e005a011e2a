//! Review 41 probes (store5: the cache's identity, superblock copy 1, the lease a refused
//! mount gives back). Each probe fails if the defect it names exists; those that fail now are
//! `#[ignore]`d with the finding's number.

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ldfs::ld::LogicalDisk;
use ldfs::lld::layout::{copy1_addr, superblock_as_copy, superblock_with_cache_id};
use ldfs::lld::PAGE_BYTES;
use ldfs::store::{
    MemoryStore, ObjectInfo, ObjectStore, PutOutcome, StoreError, StoreOp, StoreResult,
};
use ldfs::testing::store::take_lease;
use ldfs_tools::cli::store::{note_path, prepare_cache_sized, StoreUrl};

mod common;
use common::store_cache::{
    open_cache, open_cache_as_a_mount, store_with_fs, writers_cache_with_unuploaded_write,
};

/// A store whose `get`s of checkpoint objects fail (transient) once `allowed` of them passed:
/// the gateway dropping out in the middle of a mount.
struct FailingCheckpointGets {
    inner: Arc<MemoryStore>,
    allowed: AtomicU64,
}

impl ObjectStore for FailingCheckpointGets {
    fn put(&self, key: &str, bytes: &[u8]) -> StoreResult<()> {
        self.inner.put(key, bytes)
    }
    fn put_if_absent(&self, key: &str, bytes: &[u8]) -> StoreResult<PutOutcome> {
        self.inner.put_if_absent(key, bytes)
    }
    fn get(&self, key: &str) -> StoreResult<Vec<u8>> {
        if key.starts_with("ckpt/") {
            let left = self.allowed.load(Ordering::SeqCst);
            if left == 0 {
                return Err(StoreError::Unavailable {
                    op: StoreOp::Get,
                    key: key.to_string(),
                    reason: "review41 probe: the gateway went away".into(),
                });
            }
            self.allowed.store(left - 1, Ordering::SeqCst);
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
        self.inner.list(prefix)
    }
}

/// Review 41 finding 1: `prepare_cache_sized` writes the READER note with the id the rebuild
/// *will* write before the rebuild zeroes the old superblocks (`forget_cache`). A rebuild that
/// fails (a transient store error; or a crash) between the note and `forget_cache` leaves the
/// old cache's superblocks (the old id) under a note naming the new id: the next mount refuses
/// the cache as "another cache's" (whose remedy says unuploaded writes are lost), where
/// review 36 finding 2 wants a rebuild cut short rebuilt again. A read-only mount's cache
/// here; a stale writer's cache being rebuilt (lazily) has the same window.
#[test]
fn a_rebuild_that_fails_before_it_forgets_the_cache_is_rebuilt_by_the_next_mount() {
    let d = tempfile::tempdir().unwrap();
    let url = StoreUrl::parse("s3://review41/f1").unwrap();
    let (store, _clock) = store_with_fs(0x4141);
    let cache = d.path().join("r.img");
    std::fs::File::create(&cache).unwrap();
    // A read-only mount's cache (noted READER, with its id).
    prepare_cache_sized(&*store as &dyn ObjectStore, &url, &cache, None, None).unwrap();
    // The next read-only mount rebuilds it; the store answers prepare_cache's newest_checkpoint
    // and then drops out before the rebuild's own read of the checkpoint object.
    let flaky = FailingCheckpointGets {
        inner: store.clone(),
        allowed: AtomicU64::new(1),
    };
    let r = prepare_cache_sized(&flaky, &url, &cache, None, None);
    assert!(
        r.is_err(),
        "the probe's store fault did not cut the rebuild"
    );
    // The store back: the next mount must rebuild (nothing of the cache is anyone's writes).
    let again = prepare_cache_sized(&*store as &dyn ObjectStore, &url, &cache, None, None);
    assert!(
        again.is_ok(),
        "a rebuild cut short by a store error left a cache the next mount refuses: {again:?}"
    );
}

/// Overwrites the cache's note without its `cache_id=` line and both superblock copies with
/// id 0: a cache made before caches had ids (what an upgrade finds).
fn make_pre_id_cache(cache: &Path) {
    let note = std::fs::read_to_string(note_path(cache)).unwrap();
    let old: String = note
        .lines()
        .filter(|l| !l.starts_with("cache_id="))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(note_path(cache), old).unwrap();
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(cache)
        .unwrap();
    let mut p0 = vec![0u8; PAGE_BYTES];
    f.read_exact_at(&mut p0, 0).unwrap();
    let p0 = superblock_with_cache_id(&p0, 0);
    let last = copy1_addr(f.metadata().unwrap().len());
    f.write_all_at(&superblock_as_copy(&p0, 1), last).unwrap();
    f.write_all_at(&p0, 0).unwrap();
    f.sync_all().unwrap();
}

/// Review 41 finding 2: the first read-write mount keeping a cache made before ids gives it one
/// (`write_superblocks`: copy 1 with the id, flush, page 0 with the id, flush). A crash tearing
/// that page 0 write leaves sectors of the *old* page 0 (id 0, its crc) beside sectors of the
/// new one: not "each sector zeros or copy 1's bytes", so `cache_superblock` calls the cache
/// "not an ldfs cache" and the mount is refused, its remedy (move it away, rebuild) losing the
/// writer's fsynced, unuploaded writes -- though copy 1 is good and lld opens it through copy 1.
/// The same holds for page 0 restored from copy 1 on a pre-id cache (a new id then too).
#[test]
fn a_page_0_torn_while_a_kept_cache_gets_its_id_is_still_the_writers_cache() {
    let d = tempfile::tempdir().unwrap();
    let url = StoreUrl::parse("s3://review41/f2").unwrap();
    let (store, clock) = store_with_fs(0x4141);
    let cache = d.path().join("w.img");
    let l = writers_cache_with_unuploaded_write(&cache, &url, &store, &clock);
    make_pre_id_cache(&cache);
    // The id-giving mount's writes, cut: copy 1 with the new id (flushed), then page 0 torn --
    // its first sector new (the id is at byte 92), the rest the old page's (its crc, byte 4092).
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&cache)
        .unwrap();
    let mut old0 = vec![0u8; PAGE_BYTES];
    f.read_exact_at(&mut old0, 0).unwrap();
    let new0 = superblock_with_cache_id(&old0, 0x4141_0000_0000_0001);
    let last = copy1_addr(f.metadata().unwrap().len());
    f.write_all_at(&superblock_as_copy(&new0, 1), last).unwrap();
    f.write_all_at(&new0[..512], 0).unwrap();
    f.sync_all().unwrap();
    drop(f);
    // lld itself opens such a device (page 0's crc fails, copy 1 is good).
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
        "a writer's cache with copy 1 good and page 0 torn by the id-giving write was refused \
         (the remedy loses its unuploaded write): {r:?}"
    );
    let (seg, lld) = open_cache(&cache, &store, &lease);
    let got = lld.read(l, 0);
    assert!(
        matches!(&got, Ok(Some(b)) if b[..] == [0x5a; 5000][..]),
        "the writer's unuploaded write is gone ({:?})",
        got.map(|b| b.map(|b| b.len()))
    );
    drop(lld);
    drop(seg);
}

/// Guard: the id-giving mount cut between its copy 1 and its page 0 (copy 1 new id, page 0
/// whole with id 0, note without an id) keeps the writer's cache and its write.
#[test]
fn a_crash_between_the_two_id_writes_keeps_the_writers_cache() {
    let d = tempfile::tempdir().unwrap();
    let url = StoreUrl::parse("s3://review41/g1").unwrap();
    let (store, clock) = store_with_fs(0x4141);
    let cache = d.path().join("w.img");
    let l = writers_cache_with_unuploaded_write(&cache, &url, &store, &clock);
    make_pre_id_cache(&cache);
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&cache)
        .unwrap();
    let mut old0 = vec![0u8; PAGE_BYTES];
    f.read_exact_at(&mut old0, 0).unwrap();
    let new0 = superblock_with_cache_id(&old0, 0x4141_0000_0000_0003);
    let last = copy1_addr(f.metadata().unwrap().len());
    f.write_all_at(&superblock_as_copy(&new0, 1), last).unwrap();
    f.sync_all().unwrap();
    drop(f);
    let lease = take_lease(store.clone(), &clock, true);
    prepare_cache_sized(
        &*store as &dyn ObjectStore,
        &url,
        &cache,
        Some(lease.writer()),
        None,
    )
    .expect("the writer's cache");
    // Both copies now carry one id, the note's.
    let bytes = std::fs::read(&cache).unwrap();
    let id0 = u64::from_le_bytes(bytes[92..100].try_into().unwrap());
    let c1 = copy1_addr(bytes.len() as u64) as usize;
    let id1 = u64::from_le_bytes(bytes[c1 + 92..c1 + 100].try_into().unwrap());
    let note = std::fs::read_to_string(note_path(&cache)).unwrap();
    assert_eq!(id0, id1, "the two copies disagree on the cache id");
    assert!(
        note.contains(&format!("cache_id={id0:016x}")),
        "the note does not name the cache's id {id0:016x}: {note}"
    );
    let (seg, lld) = open_cache(&cache, &store, &lease);
    assert!(matches!(lld.read(l, 0), Ok(Some(b)) if b[..] == [0x5a; 5000][..]));
    drop(lld);
    drop(seg);
}

/// Review 41 finding 3: a read-write mount that took the lease over from an unreleased holder
/// (`--force-takeover`) and is refused after `Lld::open` (a failed `Fs::mount`, the FUSE mount
/// itself: `Session::new`) gives the lease back "as it was found, expired and not released by
/// <holder> (whose cache may hold writes the store lacks): the next mount takes it with
/// --force-takeover". But every read-write `Lld::open` writes a checkpoint, and the uploader
/// puts it at once under the refused mount's writer number: the store is not as found. The
/// holder's cache (its note's writer now below the store's newest) is then refused as "a branch
/// the store no longer has": the writes the message says its cache may hold cannot be mounted
/// any more. Fixed: a read-write mount holds its uploads until it serves; here the mount's
/// protocol (held from before lld's open), and time for an upload that would race the refusal.
#[test]
fn a_lease_given_back_as_found_leaves_the_holders_cache_mountable() {
    let d = tempfile::tempdir().unwrap();
    let url = StoreUrl::parse("s3://review41/f3").unwrap();
    let (store, clock) = store_with_fs(0x4141);
    // beta: a writer whose mount crashed holding a write never uploaded; its lease expired.
    let beta = d.path().join("beta.img");
    let l = writers_cache_with_unuploaded_write(&beta, &url, &store, &clock);
    // gamma, another machine, takes the lease over with force, rebuilds its own cache, opens
    // the engine -- and its mount is refused (the FUSE mount fails) before it serves.
    let gamma = d.path().join("gamma.img");
    std::fs::File::create(&gamma).unwrap();
    let lease = take_lease(store.clone(), &clock, true);
    prepare_cache_sized(
        &*store as &dyn ObjectStore,
        &url,
        &gamma,
        Some(lease.writer()),
        None,
    )
    .unwrap();
    let ckpts = store.list("ckpt/").unwrap().len();
    let (seg, lld) = open_cache_as_a_mount(&gamma, &store, &lease, true);
    assert!(seg.announced() > seg.uploaded(), "lld's open checkpointed");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        store.list("ckpt/").unwrap().len(),
        ckpts,
        "a checkpoint object went up before the mount served"
    );
    // The refusal: the segment store stopped, the engine dropped, the lease given back.
    seg.stop();
    drop(lld);
    drop(seg);
    let what = lease.give_back().unwrap();
    assert!(what.contains("as it was found"), "{what}");
    // beta's host, told so, mounts its cache with --force-takeover to keep its writes.
    let back = take_lease(store.clone(), &clock, true);
    let r = prepare_cache_sized(
        &*store as &dyn ObjectStore,
        &url,
        &beta,
        Some(back.writer()),
        None,
    );
    assert!(
        r.is_ok(),
        "after a give-back \"as it was found\", the unreleased holder's cache is refused: {r:?}"
    );
    let (seg, lld) = open_cache(&beta, &store, &back);
    assert!(matches!(lld.read(l, 0), Ok(Some(b)) if b[..] == [0x5a; 5000][..]));
    drop(lld);
    drop(seg);
}
