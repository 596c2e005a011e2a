//! Review 33's probes of the store mount's eager hand-over (a621fe1) and of fsck, inspect and
//! clean on a store cache (cf4a82b). Each probe fails while the defect its doc comment names is
//! there. `#[ignore]` marks an open defect:
//! `cargo test --release -p ldfs-tools --test review33_probes -- --ignored` runs them.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ldfs::device::{Device, MemoryDevice};
use ldfs::fs::{Ctx, Fs, FsOptions, ROOT_INO};
use ldfs::ld::LogicalDisk;
use ldfs::lld::layout::MkfsOptions;
use ldfs::lld::{Lld, LldOptions};
use ldfs::store::{MemoryStore, SegmentStore, SegmentStoreOptions};
use ldfs::testing::store::{take_lease, TestClock};
use ldfs_tools::cli::store::{write_note, StoreUrl};
use ldfs_tools::fuse::store_mount::StoreMount;

use common::{fuse_usable, is_mounted, ldfs};

fn url() -> StoreUrl {
    StoreUrl::parse("s3://probe33/fs").unwrap()
}

fn text(o: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A store mount's pieces over a memory store and a memory cache, as `ldfs mount s3://...`
/// puts them together (mount.rs), and the file system on them.
fn store_mount() -> (Arc<StoreMount>, Arc<Fs>) {
    let store = Arc::new(MemoryStore::new());
    let dev: Arc<dyn Device> = Arc::new(MemoryDevice::new(64 << 20));
    ldfs::lld::mkfs::mkfs(
        &*dev,
        &MkfsOptions {
            segment_bytes: 256 << 10,
            max_block_bytes: 64 << 10,
            reserved_segments: Some(4),
            fs_id: 3333,
            max_bytes: None,
            kept_pages: 0,
        },
    )
    .unwrap();
    let lease = take_lease(store.clone(), &TestClock::default(), false);
    let seg = SegmentStore::start(
        store,
        dev,
        lease,
        SegmentStoreOptions {
            backoff_initial: Duration::from_millis(1),
            backoff_max: Duration::from_millis(20),
        },
    )
    .unwrap();
    let lld = Arc::new(
        Lld::open(
            seg.device(),
            LldOptions {
                checkpoint_hook: Some(seg.hook()),
                segment_hook: Some(seg.segment_hook()),
                ..LldOptions::default()
            },
        )
        .unwrap(),
    );
    let ld: Arc<dyn LogicalDisk> = lld.clone();
    let ctx = Ctx {
        uid: 0,
        gid: 0,
        umask: 0,
    };
    Fs::format(&*ld, ctx).unwrap();
    let fs = Arc::new(Fs::mount(ld, FsOptions::default()).unwrap());
    let sm = Arc::new(StoreMount::new(url(), seg, lld, u64::MAX));
    (sm, fs)
}

/// Finding 2 (medium; fixed on review33): `sync --remote` (`StoreMount::sync_remote`), the eager hand-over of
/// a621fe1 (`run_window`, every 20 ms) and the backlog gate's `hand_over` take their checkpoint
/// with `Lld::checkpoint_now`, which fails at once with "a checkpoint cannot be taken while an
/// ARU is open" whenever another thread's file system operation holds an ARU that logged
/// something (every `Fs` operation is one ARU, held for its whole run). While an application
/// keeps writing, `ldfs sync --remote` then fails for the user instead of waiting the moment
/// for the operation to end (`Lld::checkpoint_when_quiet` does), and the eager hand-over fails
/// (logged every 20 ms) as long as the write goes on. Here: 20 `sync_remote` calls beside a
/// thread writing 64 KiB pieces; every one must succeed.
#[test]
fn sync_remote_beside_a_writer_does_not_fail_on_an_open_aru() {
    let (sm, fs) = store_mount();
    let ctx = Ctx {
        uid: 0,
        gid: 0,
        umask: 0,
    };
    let f = fs.mknod(ctx, ROOT_INO, b"big", 0o100644, 0).unwrap().ino;
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (fs, stop) = (fs.clone(), stop.clone());
        std::thread::spawn(move || {
            let piece = vec![0x5au8; 64 << 10];
            let mut off = 0u64;
            while !stop.load(Ordering::Relaxed) {
                fs.write(f, off, &piece).unwrap();
                // Wrap at 16 MiB: overwrites keep the cleaner out of it.
                off = (off + piece.len() as u64) % (16 << 20);
            }
        })
    };
    std::thread::sleep(Duration::from_millis(200));
    let mut failed = Vec::new();
    for _ in 0..20 {
        if let Err(e) = sm.sync_remote(&fs) {
            failed.push(e);
        }
    }
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    assert!(
        failed.is_empty(),
        "{} of 20 sync --remote beside a writer failed, e.g. {:?}",
        failed.len(),
        failed.first()
    );
    sm.seg.stop();
}

/// A scratch directory under /dev/shm (a tmpfs whose paths start with /dev, so the note of a
/// cache there is kept as a device's is: by the name given, in `DEVICE_NOTES`), removed with
/// the notes the probe made.
struct DevScratch {
    dir: PathBuf,
    notes: Vec<PathBuf>,
}

impl Drop for DevScratch {
    fn drop(&mut self) {
        for n in &self.notes {
            let _ = std::fs::remove_file(n);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn digest(p: &Path) -> Vec<u8> {
    std::fs::read(p).unwrap()
}

/// Finding 3 (low; fixed on s3cache: a device's note is also found by identity, the note of
/// another name under `/dev` that leads to the same device): the refusal of `fsck -y`/`-p`
/// and of an offline `clean` on a store cache rests on finding the cache's note, and a cache under `/dev` has its note by the name given
/// (`note_path` resolves no link there, by design: `/dev/disk/by-id/...` is stable, the
/// `/dev/sdX` it leads to is not). A cache mounted as `/dev/disk/by-id/X` and repaired as
/// `/dev/sdX` (or the reverse) is therefore not recognised: `fsck -y` repairs it offline and
/// `clean` cleans it, behind the store's back. Modelled with a file in /dev/shm reached through
/// a symbolic link beside it (both names start with /dev, as a by-id link and its device do).
#[test]
fn fsck_repair_through_another_dev_name_of_a_store_cache_is_refused() {
    if !Path::new("/dev/shm").is_dir()
        || !nix_writable(Path::new(ldfs_tools::cli::store::DEVICE_NOTES))
    {
        eprintln!("*** SKIPPING: /dev/shm or the device notes' directory is not writable ***");
        return;
    }
    let dir = PathBuf::from(format!("/dev/shm/review33-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut s = DevScratch {
        dir: dir.clone(),
        notes: Vec::new(),
    };
    let real = dir.join("sdx");
    let by_id = dir.join("by-id-x");
    let out = ldfs()
        .args(["mkfs", "--size", "32M"])
        .arg(&real)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    std::os::unix::fs::symlink(&real, &by_id).unwrap();
    // The mount took the cache by its stable name and wrote the note for that name.
    write_note(&by_id, &url(), 0x3333, 7).unwrap();
    s.notes.push(ldfs_tools::cli::store::note_path(&by_id));
    // Through the stable name: refused (cf4a82b's test).
    let out = ldfs().args(["fsck", "-y"]).arg(&by_id).output().unwrap();
    assert_eq!(out.status.code(), Some(16), "{}", text(&out));
    // Through the device's other name: must be refused too, and change nothing.
    let before = digest(&real);
    let out = ldfs().args(["fsck", "-y"]).arg(&real).output().unwrap();
    let fsck_said = text(&out);
    let out = ldfs().arg("clean").arg(&real).output().unwrap();
    let clean_said = text(&out);
    let clean_ok = out.status.success();
    let after = digest(&real);
    assert!(
        fsck_said.contains("behind the store's back"),
        "fsck -y through {} (the cache of {} by another name) was not refused: {fsck_said}",
        real.display(),
        url()
    );
    assert!(
        !clean_ok,
        "an offline clean through another name ran: {clean_said}"
    );
    assert_eq!(after, before, "the cache changed offline");
}

/// Finding 4 (low; fixed on review33): cf4a82b refuses the offline changes `fsck -y`/`-p` and `clean IMAGE` on a
/// store cache ("a change made behind the store's back would be either lost at the next
/// rebuild or uploaded by no one in order"), but the other offline commands that open the
/// cache read-write are not refused: `ldfs trim IMAGE` opens lld (a recovery checkpoint, a
/// final one: the slot the store's newest checkpoint object holds is overwritten, so the next
/// mount takes the store's objects only as candidates) and `ldfs resize IMAGE SIZE` changes the
/// geometry of a file system whose size the store layer keeps fixed (`CountingDevice` has no
/// `resize`; a checkpoint object's log must lie inside its superblock's segments).
#[test]
fn offline_trim_and_resize_of_a_store_cache_are_refused() {
    let d = tempfile::tempdir().unwrap();
    let cache = d.path().join("cache.img");
    // As `mkfs --store` makes a cache: no room to grow.
    let out = ldfs()
        .args(["mkfs", "--size", "32M", "--max-size", "32M"])
        .arg(&cache)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    write_note(&cache, &url(), 0x3333, 7).unwrap();
    let before = digest(&cache);
    let trim = ldfs().arg("trim").arg(&cache).output().unwrap();
    let trim_changed = digest(&cache) != before;
    let before = digest(&cache);
    let resize = ldfs()
        .arg("resize")
        .arg(&cache)
        .arg("24M")
        .output()
        .unwrap();
    let resize_changed = digest(&cache) != before;
    assert!(
        !trim.status.success() && !trim_changed,
        "offline trim of a store cache ran (changed: {trim_changed}): {}",
        text(&trim)
    );
    assert!(
        !resize.status.success() && !resize_changed,
        "offline resize of a store cache ran (changed: {resize_changed}): {}",
        text(&resize)
    );
}

fn nix_writable(dir: &Path) -> bool {
    std::fs::create_dir_all(dir).is_ok() && {
        let p = dir.join(format!(".review33-{}", std::process::id()));
        let ok = std::fs::write(&p, b"").is_ok();
        let _ = std::fs::remove_file(&p);
        ok
    }
}

/// Guard (passes): `fsck -n` on a store cache writes nothing (not the cache, not its note)
/// and takes no lease (no store environment: the store is not reached at all).
#[test]
fn fsck_n_on_a_store_cache_writes_nothing() {
    let d = tempfile::tempdir().unwrap();
    let cache = d.path().join("cache.img");
    let out = ldfs()
        .args(["mkfs", "--size", "32M"])
        .arg(&cache)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    write_note(&cache, &url(), 0x3333, 7).unwrap();
    let note = ldfs_tools::cli::store::note_path(&cache);
    let (before, note_before) = (digest(&cache), std::fs::read(&note).unwrap());
    let mtime = std::fs::metadata(&cache).unwrap().modified().unwrap();
    let t = Instant::now();
    let out = ldfs()
        .args(["fsck", "-n"])
        .arg(&cache)
        .env_remove("AWS_ENDPOINT_URL")
        .env_remove("AWS_ACCESS_KEY_ID")
        .env_remove("AWS_SECRET_ACCESS_KEY")
        .env("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
        .env("AWS_CONFIG_FILE", "/nonexistent")
        .output()
        .unwrap();
    let said = text(&out);
    assert_eq!(out.status.code(), Some(0), "{said}");
    assert!(said.contains("the store was not checked"), "{said}");
    assert!(t.elapsed() < Duration::from_secs(60));
    assert_eq!(digest(&cache), before);
    assert_eq!(
        std::fs::metadata(&cache).unwrap().modified().unwrap(),
        mtime
    );
    assert_eq!(std::fs::read(&note).unwrap(), note_before);
}

/// Finding 5 (medium; fixed on review33): once the lease is lost (another writer took the store over), the window
/// thread turns the file system read-only, once (`lost_said`), and the uploader has stopped for
/// good. `mount -o remount,rw` (`remount_rw`) then makes it writable again without looking at
/// the store: writes are accepted and fsynced into the cache, the backlog gate lets them
/// through (`failed` is set), and nothing can ever upload them (the lease is another writer's;
/// the next read-write mount on this cache refuses it, a later writer having uploaded). Here:
/// a real mount against the gateway, a lease object of a taker put in the generation after the
/// holder's, then a remount read-write and a write: the remount or the write must fail.
#[test]
fn remount_rw_after_the_lease_was_lost_stays_read_only() {
    use ldfs::store::lease::LeaseRecord;
    use ldfs::store::{ObjectStore, S3Config, S3Store};
    use ldfs::testing::ceph::{gateway, unique_bucket, Gateway};
    if !fuse_usable() {
        return;
    }
    let vars = match gateway() {
        Gateway::Ready(v) => v,
        Gateway::Skip(why) => {
            eprintln!("*** SKIPPING the remount-after-lease-lost probe: {why} ***");
            return;
        }
    };
    let bucket = unique_bucket("r33remount");
    let url = format!("s3://{bucket}/fs");
    std::fs::create_dir_all("/var/tmp/review33").unwrap();
    let d = tempfile::tempdir_in("/var/tmp/review33").unwrap();
    let (cache, dir) = (d.path().join("cache.img"), d.path().join("mnt"));
    std::fs::create_dir(&dir).unwrap();
    let run = |args: &[&str]| {
        let mut c = ldfs();
        c.envs(&vars).args(args);
        c
    };
    let out = run(&["mkfs", "--store", &url, "--cache"])
        .arg(&cache)
        .args(["--size", "64M", "--sparse"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let mut child = run(&["mount", "-f", &url])
        .arg(&dir)
        .arg("--cache")
        .arg(&cache)
        .args(["-o", "lease=10"])
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let t = Instant::now();
    while !is_mounted(&dir) {
        assert!(child.try_wait().unwrap().is_none(), "the mount exited");
        assert!(t.elapsed() < Duration::from_secs(60), "mount timed out");
        std::thread::sleep(Duration::from_millis(20));
    }
    let unmount = |child: &mut std::process::Child| {
        let _ = Command::new("fusermount3").arg("-u").arg(&dir).status();
        let t = Instant::now();
        while child.try_wait().unwrap().is_none() {
            if t.elapsed() > Duration::from_secs(150) {
                let _ = child.kill();
                let _ = Command::new("fusermount3")
                    .args(["-u", "-z"])
                    .arg(&dir)
                    .status();
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    std::fs::write(dir.join("before"), b"uploaded").unwrap();
    let out = run(&["sync", "--remote"]).arg(&dir).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    // A taker puts the next lease generation (as one would after the holder's expiry).
    let cfg = S3Config::from_vars(&bucket, "fs", |k| vars.get(k).cloned()).unwrap();
    let s3 = S3Store::new(&cfg).unwrap();
    let g = s3
        .list("lease/")
        .unwrap()
        .iter()
        .filter_map(|o| u64::from_str_radix(o.key.strip_prefix("lease/")?, 16).ok())
        .max()
        .unwrap();
    let rec = LeaseRecord {
        owner: 0x007a_6be7,
        expires_secs: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
            + 3600,
        pid: 1,
        host: "taker".into(),
    };
    s3.put(&format!("lease/{:016x}", g + 1), &rec.encode())
        .unwrap();
    // The holder's renewal (every 2 s) finds it; the window turns the mount read-only.
    let t = Instant::now();
    loop {
        if std::fs::write(dir.join("probe"), b"x").is_err() {
            break;
        }
        if t.elapsed() > Duration::from_secs(30) {
            unmount(&mut child);
            panic!("the mount stayed writable 30 s after its lease was taken");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let remount = run(&["mount", "-o", "remount,rw", &url])
        .arg(&dir)
        .output()
        .unwrap();
    let wrote = std::fs::write(dir.join("after"), b"never uploaded").is_ok();
    unmount(&mut child);
    assert!(
        !wrote,
        "after the lease was lost, remount,rw ({}: {}) made the mount writable: a write was \
         accepted that no one can upload",
        remount.status,
        text(&remount).trim()
    );
}

/// A memory store seen by `fsck -n`'s store check while a writer goes on uploading: before the
/// first `seg/` listing the check makes, `between` runs (the writer's uploads meanwhile).
struct Racing<F: Fn()> {
    inner: Arc<MemoryStore>,
    between: F,
    armed: AtomicBool,
}

impl<F: Fn() + Send + Sync> ldfs::store::ObjectStore for Racing<F> {
    fn put(&self, key: &str, bytes: &[u8]) -> ldfs::store::StoreResult<()> {
        self.inner.put(key, bytes)
    }
    fn put_if_absent(
        &self,
        key: &str,
        bytes: &[u8],
    ) -> ldfs::store::StoreResult<ldfs::store::PutOutcome> {
        self.inner.put_if_absent(key, bytes)
    }
    fn get(&self, key: &str) -> ldfs::store::StoreResult<Vec<u8>> {
        self.inner.get(key)
    }
    fn get_range(&self, key: &str, offset: u64, len: u64) -> ldfs::store::StoreResult<Vec<u8>> {
        self.inner.get_range(key, offset, len)
    }
    fn delete(&self, key: &str) -> ldfs::store::StoreResult<()> {
        self.inner.delete(key)
    }
    fn list(&self, prefix: &str) -> ldfs::store::StoreResult<Vec<ldfs::store::ObjectInfo>> {
        if prefix == "seg/" && self.armed.swap(false, Ordering::SeqCst) {
            (self.between)();
        }
        self.inner.list(prefix)
    }
}

/// Finding 6 (low; fixed on review33): `fsck -n` on a store cache checks the store (`store_check::check_store`)
/// by listing `ckpt/`, reading the newest checkpoint object, then listing `seg/`. A writer
/// that uploads two more checkpoints between the two listings (the eager hand-over of a621fe1
/// makes one every 8 segments during a long write) deletes segment objects the checkpoint read
/// names, and the check reports each as a PROBLEM "is missing" (exit 4) about a store that is
/// whole: the race review 32 fixed for `restore` (`newest_complete_checkpoint` lists again
/// when what it read looks incomplete). `fsck -n` is what one runs beside a mount, or from
/// another host, to see whether the store is sound.
#[test]
fn the_store_check_beside_an_uploading_writer_finds_no_problem() {
    use ldfs::ld::{ListHints, LogicalDisk};
    use ldfs_tools::cli::store_check::{check_store, CacheNote};
    let inner = Arc::new(MemoryStore::new());
    let dev: Arc<dyn Device> = Arc::new(MemoryDevice::new(64 << 20));
    ldfs::lld::mkfs::mkfs(
        &*dev,
        &MkfsOptions {
            segment_bytes: 256 << 10,
            max_block_bytes: 64 << 10,
            reserved_segments: Some(4),
            fs_id: 3333,
            max_bytes: None,
            kept_pages: 0,
        },
    )
    .unwrap();
    let lease = take_lease(inner.clone(), &TestClock::default(), false);
    let writer = lease.writer();
    let seg = SegmentStore::start(inner.clone(), dev, lease, Default::default()).unwrap();
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
    // Rewrites the same blocks: each upload supersedes the segments the one before named.
    let upload = |byte: u8| {
        for i in 0..32u64 {
            lld.write(None, l, i, &[byte; 16 << 10]).unwrap();
        }
        let cancel = AtomicBool::new(false);
        lld.clean_now(ldfs::lld::PolicyKind::Greedy, Some(16), 0.9, &cancel)
            .unwrap();
        lld.checkpoint_now().unwrap();
        seg.wait_uploaded(seg.announced(), Duration::from_secs(30))
            .unwrap();
    };
    upload(1);
    upload(2);
    let store = Racing {
        inner: inner.clone(),
        between: || {
            upload(3);
            upload(4);
        },
        armed: AtomicBool::new(true),
    };
    let note = CacheNote {
        url: url(),
        fs_id: 3333,
        writer,
    };
    let c = check_store(&store, &note).unwrap();
    assert!(
        !store.armed.load(Ordering::SeqCst),
        "the writer never uploaded during the check"
    );
    seg.stop();
    assert!(
        c.problems.is_empty(),
        "a whole store, checked beside an uploading writer: {:?}",
        c.problems
    );
}
