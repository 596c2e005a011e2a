//! A file system whose durable home is an object store (issue 20): `ldfs mkfs --store`,
//! `ldfs mount s3://BUCKET[/PREFIX] DIR --cache PATH`. What the two share: the store's URL,
//! opening the bucket (endpoint, region and keys from the environment or the AWS shared
//! files, never the command line), the lease, and getting the cache ready for a mount (kept,
//! or rebuilt from the store when it is empty or absent).
//!
//! The cache keeps a note beside it, `PATH.ldfs-store` (fs id, writer): the lease generation
//! of the last read-write mount on it, or 0 for a cache a read-only mount rebuilt. A writer's
//! cache is used as it is only if no later writer has uploaded a checkpoint since (the newest
//! checkpoint object's writer is not above the note's): otherwise another machine took the
//! file system over and went on, and this cache's tree is a branch the store no longer has;
//! the mount is refused, naming both. A read-only mount shows the last uploaded checkpoint, so
//! it rebuilds its cache from the store: only an empty cache or a read-only mount's own, never
//! a writer's, which may hold writes the store lacks (review 31).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ldfs::device::{Device, FileDevice, FileDeviceOptions};
use ldfs::lld::layout::{
    copy1_addr, random_cache_id, superblock_as_copy, superblock_with_cache_id, Geometry,
};
use ldfs::lld::PAGE_BYTES;
use ldfs::store::cache::{map_path_for_note, remove_map};
use ldfs::store::lease::{HeldLease, LeaseError, LeaseOptions};
use ldfs::store::readers::{PinOptions, ReaderPin};
use ldfs::store::segments::{newest_checkpoint, parse_checkpoint_key};
use ldfs::store::segments::{restore_lazy_keeping, CheckpointObject, SegmentEntry};
use ldfs::store::{restore_lazy_as, ObjectStore, S3Config, S3Store};

/// `s3://BUCKET[/PREFIX]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreUrl {
    pub bucket: String,
    pub prefix: String,
}

impl StoreUrl {
    /// Whether `s` names a store rather than an image.
    pub fn is_store(s: &Path) -> bool {
        s.to_str().is_some_and(|s| s.starts_with("s3://"))
    }

    pub fn parse(s: &str) -> Result<StoreUrl, String> {
        let rest = s
            .strip_prefix("s3://")
            .ok_or_else(|| format!("{s:?}: a store is s3://BUCKET[/PREFIX]"))?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(format!("{s:?}: no bucket (s3://BUCKET[/PREFIX])"));
        }
        Ok(StoreUrl {
            bucket: bucket.to_string(),
            prefix: prefix.trim_matches('/').to_string(),
        })
    }

    /// Opens the bucket; configuration from the environment and the AWS shared files;
    /// `timeout` for each request if given (a writer's, by its lease), else the default.
    pub fn open(&self, timeout: Option<Duration>) -> Result<Arc<S3Store>, String> {
        let mut cfg = S3Config::from_env(&self.bucket, &self.prefix).map_err(|e| e.to_string())?;
        if let Some(t) = timeout {
            cfg.timeout = t;
        }
        Ok(Arc::new(S3Store::new(&cfg).map_err(|e| e.to_string())?))
    }
}

impl std::fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.prefix.is_empty() {
            write!(f, "s3://{}", self.bucket)
        } else {
            write!(f, "s3://{}/{}", self.bucket, self.prefix)
        }
    }
}

/// This host's name (the lease names it to a refused mount).
pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    if unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } != 0 {
        return "unknown-host".into();
    }
    let n = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

/// Takes the lease for this process, turning a refusal into the message a user reads.
pub fn take_lease(
    store: Arc<dyn ObjectStore>,
    url: &StoreUrl,
    duration: Duration,
    force_takeover: bool,
) -> Result<Arc<HeldLease>, String> {
    let opts = LeaseOptions {
        duration,
        force_takeover,
        ..LeaseOptions::default()
    };
    match HeldLease::acquire(store, &hostname(), std::process::id(), opts) {
        Ok(l) => Ok(Arc::new(l)),
        Err(e @ LeaseError::Held { .. }) => Err(format!("{url}: {e}")),
        Err(e) => Err(format!("{url}: taking the lease: {e}")),
    }
}

/// Pins the store's newest complete checkpoint for a read-only mount (`store::readers`), turning
/// a failure into the message a user reads: the pin, and the checkpoint (its key first).
pub fn take_pin(
    store: Arc<dyn ObjectStore>,
    url: &StoreUrl,
    duration: Duration,
) -> Result<(ReaderPin, String, CheckpointObject), String> {
    let opts = PinOptions {
        duration,
        clock: ldfs::store::lease::system_clock(),
        host: hostname(),
        pid: std::process::id(),
    };
    ReaderPin::take(store, opts).map_err(|e| format!("{url}: pinning a checkpoint to read: {e}"))
}

/// Where the notes of caches under `/dev` go: beside a block device the note would be on a
/// devtmpfs, emptied at every boot (review 31), and the cache then refused after a reboot.
pub const DEVICE_NOTES: &str = "/var/lib/ldfs/store-notes";

/// The note of a cache: beside it (`PATH.ldfs-store`), or for a cache under `/dev` (a block
/// device) in [`DEVICE_NOTES`], named by its path (`/` as `%`). A file's path is taken with
/// its symbolic links resolved, so one cache reached by two names has one note (review 32);
/// a device's name is kept as given (`/dev/mapper/NAME`, `/dev/disk/by-id/...` are stable
/// across boots, the `/dev/dm-N` they lead to is not). A device reached by a name no note
/// has is found by identity (review 33: `/dev/sdX` for a cache mounted as
/// `/dev/disk/by-id/X` was repaired offline): the note of another name that leads to the same
/// device now ([`device_note_by_identity`]).
pub fn note_path(cache: &Path) -> PathBuf {
    let by_name = note_path_by_name(cache);
    if cache.starts_with("/dev") && !by_name.exists() {
        if let Some(p) = device_note_by_identity(cache) {
            return p;
        }
    }
    by_name
}

/// What a path leads to, symbolic links followed: a block or character device by its device
/// number (`st_rdev`: one device has one, whatever its name), anything else by its file system
/// and inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Identity {
    Device { block: bool, rdev: u64 },
    File { dev: u64, ino: u64 },
}

fn identity(path: &Path) -> Option<Identity> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let m = std::fs::metadata(path).ok()?;
    let t = m.file_type();
    Some(match t.is_block_device() || t.is_char_device() {
        true => Identity::Device {
            block: t.is_block_device(),
            rdev: m.rdev(),
        },
        false => Identity::File {
            dev: m.dev(),
            ino: m.ino(),
        },
    })
}

/// The note in [`DEVICE_NOTES`] of another name under `/dev` that leads to the same device as
/// `cache` does now. Each note's name is looked up again (not an identity recorded in the
/// note: device numbers change across boots, the names a note is kept by do not), so a note
/// counts only for the device its name leads to today. Several such notes that say different
/// things (a kernel name noted at an earlier boot for another device): none is taken, and
/// [`ambiguous_note`] makes the mount and the offline tools refuse (review 34).
fn device_note_by_identity(cache: &Path) -> Option<PathBuf> {
    let found = device_notes_by_identity(cache);
    if notes_disagree(&found) {
        return None;
    }
    found.into_iter().next()
}

/// Every note of [`device_note_by_identity`], by name.
fn device_notes_by_identity(cache: &Path) -> Vec<PathBuf> {
    let Some(want) = identity(cache) else {
        return Vec::new();
    };
    let Ok(dir) = std::fs::read_dir(DEVICE_NOTES) else {
        return Vec::new();
    };
    let mut found: Vec<PathBuf> = dir
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let dev = name.strip_suffix(".ldfs-store")?.strip_prefix("dev%")?;
            let path = PathBuf::from(format!("/dev/{}", dev.replace('%', "/")));
            (identity(&path) == Some(want)).then(|| e.path())
        })
        .collect();
    // Several names of one device each with a note: the same one every time.
    found.sort();
    found
}

/// Whether notes differ in the store, file system or writer they name.
fn notes_disagree(notes: &[PathBuf]) -> bool {
    let facts = |p: &PathBuf| -> Vec<String> {
        let text = std::fs::read_to_string(p).unwrap_or_default();
        let mut f: Vec<String> = text
            .lines()
            .filter(|l| {
                ["store=", "fs_id=", "writer=", "cache_id="]
                    .iter()
                    .any(|k| l.starts_with(k))
            })
            .map(|l| l.trim().to_string())
            .collect();
        f.sort();
        f
    };
    notes.windows(2).any(|w| facts(&w[0]) != facts(&w[1]))
}

/// Why the note of `cache` cannot be told: a name under `/dev` without a note of its own that
/// leads to a device several differing notes of other names lead to as well. Callers refuse.
pub fn ambiguous_note(cache: &Path) -> Option<String> {
    if !cache.starts_with("/dev") || note_path_by_name(cache).exists() {
        return None;
    }
    let found = device_notes_by_identity(cache);
    notes_disagree(&found).then(|| {
        format!(
            "{}: the notes of several names of this device differ ({}): one is stale (a name \
             noted at an earlier boot for another device). Use the name the cache's mounts \
             use, or remove the stale note",
            cache.display(),
            found
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )
    })
}

/// [`note_path`] by the name given alone.
fn note_path_by_name(cache: &Path) -> PathBuf {
    let resolved;
    let cache = match cache.starts_with("/dev") {
        true => cache,
        false => {
            resolved = std::fs::canonicalize(cache).unwrap_or_else(|_| cache.to_path_buf());
            resolved.as_path()
        }
    };
    let mut p = match cache.strip_prefix("/dev") {
        Ok(rest) => {
            let name = rest.to_string_lossy().replace('/', "%");
            Path::new(DEVICE_NOTES)
                .join(format!("dev%{name}"))
                .into_os_string()
        }
        Err(_) => cache.as_os_str().to_owned(),
    };
    p.push(".ldfs-store");
    PathBuf::from(p)
}

/// The residency map of a cache (`store::cache`): beside its note.
pub fn map_path(cache: &Path) -> PathBuf {
    map_path_for_note(&note_path(cache))
}

/// The smallest cache bound, in segments: the Active one, the upload backlog (half the bound)
/// and room to fetch beside them.
pub const MIN_CACHE_SEGMENTS: u64 = 8;

/// The note's writer of a cache only read-only mounts used.
pub const READER: u64 = 0;

/// The cache bound the note remembers (`cache_size=`), if any.
pub fn noted_cache_size(cache: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(note_path(cache)).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("cache_size="))
        .and_then(|v| v.trim().parse().ok())
}

/// (fs id, writer) from the note, if it reads.
fn read_note(cache: &Path) -> Option<(u64, u64)> {
    read_note_id(cache).map(|(fs_id, writer, _)| (fs_id, writer))
}

/// (fs id, writer, cache id) from the note, if it reads; the cache id `None` in a note written
/// before notes recorded it (`Geometry::cache_id`).
fn read_note_id(cache: &Path) -> Option<(u64, u64, Option<u64>)> {
    let text = std::fs::read_to_string(note_path(cache)).ok()?;
    let mut fs_id = None;
    let mut writer = None;
    let mut cache_id = None;
    for l in text.lines() {
        match l.split_once('=') {
            Some(("fs_id", v)) => fs_id = u64::from_str_radix(v.trim(), 16).ok(),
            Some(("writer", v)) => writer = v.trim().parse().ok(),
            Some(("cache_id", v)) => cache_id = u64::from_str_radix(v.trim(), 16).ok(),
            _ => {}
        }
    }
    Some((fs_id?, writer?, cache_id))
}

/// Whether the cache's note says read-only mounts use it (`READER`): it holds nothing the store
/// lacks, and each read-only mount rebuilds it.
pub fn is_readers_cache(cache: &Path) -> bool {
    read_note(cache).is_some_and(|n| n.1 == READER)
}

/// Whether the checkpoint a read-only mount's cache was rebuilt from (its slot) is gone from
/// the store: no checkpoint object listed there holds that slot, byte for byte. Then the
/// objects its map sends reads to may be gone too, with no harm (its pin ended); while the
/// checkpoint is there they are not, and one missing is the store's damage (review 43 finding
/// 3). An error (the store unreachable) is an error, not "gone"; so is a checkpoint object
/// that does not decode.
pub fn readers_checkpoint_gone(cache: &Path, dev: &dyn Device) -> Result<bool, String> {
    let url =
        noted_store(cache).ok_or_else(|| format!("{}: no note names a store", cache.display()))?;
    let mut sb = vec![0u8; PAGE_BYTES];
    dev.read_at(&mut sb, 0)
        .map_err(|e| format!("{}: {e}", cache.display()))?;
    let geo = Geometry::decode_superblock(&sb, 0, dev.size_bytes())
        .map_err(|e| format!("{}: {e}", cache.display()))?;
    let store = url.open(None)?;
    let listed = store.list("ckpt/").map_err(|e| format!("{url}: {e}"))?;
    for o in listed
        .iter()
        .filter(|o| parse_checkpoint_key(&o.key).is_some())
    {
        let b = match store.get(&o.key) {
            Ok(b) => b,
            Err(ldfs::store::StoreError::NotFound { .. }) => continue,
            Err(e) => return Err(format!("{url}: {e}")),
        };
        // One that does not decode may be the cache's own, damaged: the store's damage, not
        // "gone" (review 44 finding E).
        let Ok(obj) = ldfs::store::segments::decode_checkpoint_object(&o.key, &b) else {
            return Ok(false);
        };
        if ldfs::store::segments::cache_holds_slot(dev, &geo, obj.serial, &obj.slot) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Writes the note durably (before this writer uploads anything), keeping the cache bound it
/// remembers.
pub fn write_note(cache: &Path, url: &StoreUrl, fs_id: u64, writer: u64) -> Result<(), String> {
    write_note_with(cache, url, fs_id, writer, noted_cache_size(cache))
}

/// [`write_note`] with the cache bound to remember (`None`: none), keeping the cache id the
/// note records for the same file system.
pub fn write_note_with(
    cache: &Path,
    url: &StoreUrl,
    fs_id: u64,
    writer: u64,
    cache_size: Option<u64>,
) -> Result<(), String> {
    let id = read_note_id(cache)
        .filter(|n| n.0 == fs_id)
        .and_then(|n| n.2);
    write_note_as(cache, url, fs_id, writer, cache_size, id)
}

/// [`write_note_with`] recording `cache_id`, the identity of the cache it is the note of (the
/// id in its superblocks, `Geometry::cache_id`): a note vouches only for the cache that
/// carries its id (store5).
pub fn write_note_as(
    cache: &Path,
    url: &StoreUrl,
    fs_id: u64,
    writer: u64,
    cache_size: Option<u64>,
    cache_id: Option<u64>,
) -> Result<(), String> {
    let p = note_path(cache);
    let tmp = p.with_extension("ldfs-store.tmp");
    let err = |e: std::io::Error| format!("{}: {e}", p.display());
    if p.starts_with(DEVICE_NOTES) {
        std::fs::create_dir_all(DEVICE_NOTES).map_err(err)?;
    }
    let mut f = std::fs::File::create(&tmp).map_err(err)?;
    writeln!(f, "store={url}\nfs_id={fs_id:016x}\nwriter={writer}").map_err(err)?;
    if let Some(n) = cache_size {
        writeln!(f, "cache_size={n}").map_err(err)?;
    }
    if let Some(id) = cache_id {
        writeln!(f, "cache_id={id:016x}").map_err(err)?;
    }
    f.sync_all().map_err(err)?;
    std::fs::rename(&tmp, &p).map_err(err)?;
    if let Some(dir) = p.parent().filter(|d| !d.as_os_str().is_empty()) {
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
    }
    Ok(())
}

/// The store URL the note of `cache` names, if it has a note.
pub fn noted_store(cache: &Path) -> Option<StoreUrl> {
    let text = std::fs::read_to_string(note_path(cache)).ok()?;
    let url = text.lines().find_map(|l| l.strip_prefix("store="))?;
    StoreUrl::parse(url.trim()).ok()
}

/// A store-backed file system's cache whose residency map lists segments it does not hold
/// (fsck): a read-only view of `dev` that serves those from the store its note names
/// (credentials from the environment), and a line for each of them whose object is missing or
/// damaged (each fetched and checked). `None`: the cache holds everything.
#[allow(clippy::type_complexity)]
pub fn cache_view(
    cache: &Path,
    dev: Arc<dyn Device>,
) -> Result<Option<(Arc<dyn Device>, Vec<String>)>, String> {
    let Some((view, url)) = read_through(cache, dev)? else {
        return Ok(None);
    };
    let evicted = view.evicted();
    let mut bad = Vec::new();
    for e in &evicted {
        if let Err(err) = view.fetch(e) {
            bad.push(format!(
                "segment {} is in {url} only, and its object cannot be read: {err}",
                e.segment
            ));
        }
    }
    eprintln!(
        "ldfs: {}: {} segments are in {url} only: read from there ({} missing or damaged)",
        cache.display(),
        evicted.len(),
        bad.len()
    );
    Ok(Some((view as Arc<dyn Device>, bad)))
}

/// A read-only view of a store cache whose residency map lists segments it does not hold: a
/// read of one of them is served from its object, fetched then (`inspect`). `None`: the cache
/// holds everything (or its map is not this file system's).
pub fn read_through(
    cache: &Path,
    dev: Arc<dyn Device>,
) -> Result<Option<(Arc<ldfs::store::cache::ReadThroughDevice>, StoreUrl)>, String> {
    let map = map_path(cache);
    if !map.exists() {
        return Ok(None);
    }
    // Only the map of this cache's file system counts: one left beside a device since
    // formatted as a plain image (no note, or a note of another fs id) is not its.
    let mut sb = vec![0u8; PAGE_BYTES];
    let geo = dev
        .read_at(&mut sb, 0)
        .ok()
        .and_then(|()| Geometry::decode_superblock(&sb, 0, dev.size_bytes()).ok());
    let fs_id = geo.map(|g| g.fs_id);
    let (Some(url), Some((noted_id, _))) = (noted_store(cache), read_note(cache)) else {
        eprintln!(
            "ldfs: {}: ignoring the residency map {}: no note ({}) names a store",
            cache.display(),
            map.display(),
            note_path(cache).display()
        );
        return Ok(None);
    };
    if fs_id != Some(noted_id) {
        eprintln!(
            "ldfs: {}: ignoring the residency map {}: its note is of file system {noted_id:016x}, \
             not this one",
            cache.display(),
            map.display()
        );
        return Ok(None);
    }
    // The map beside the note is the note's cache's: another cache at this path (its id not
    // the note's) would read its holes by another cache's map (store5).
    let noted_cache = read_note_id(cache).and_then(|n| n.2);
    if let (Some(id), Some(g)) = (noted_cache, geo) {
        if id != g.cache_id {
            return Err(other_cache_refusal(cache, id, g.cache_id));
        }
    }
    let store: Arc<dyn ObjectStore> = url.open(None)?;
    let view = ldfs::store::cache::ReadThroughDevice::open(dev, store, &map)
        .map_err(|e| format!("{}: {e}", cache.display()))?;
    if view.evicted().is_empty() {
        return Ok(None);
    }
    Ok(Some((Arc::new(view), url)))
}

/// What a user can do with a cache whose state cannot be trusted (no note of it, a damaged
/// residency map): mount from the store, losing what only the cache holds.
const FROM_THE_STORE: &str = "move the cache away (or delete it; a block device: zero its first \
     and its last 4 KiB, the superblock's two copies) and mount again: a new cache is rebuilt from the store's last uploaded checkpoint, \
     and writes this cache holds that were never uploaded are lost with it";

/// Why a read-write mount refuses a cache of the store's file system that has no note (or a
/// note of another file system): the note's writer is what tells a cache the store went on
/// without (another machine took over) from one it may continue, so with none the cache may be
/// a branch the store no longer has. Not "older than the store": nothing says it is (review 34).
fn no_note_refusal(cache: &Path, url: &StoreUrl, fs_id: u64) -> String {
    let note = note_path(cache);
    let what = match std::fs::read_to_string(&note) {
        Ok(_) => format!(
            "its note {} is of another file system, not of this one (fs id {fs_id:016x})",
            note.display()
        ),
        Err(_) => format!("it has no note ({})", note.display()),
    };
    let device = match cache.starts_with("/dev") {
        true => format!(
            " The notes of block device caches are kept by the machine that mounted them, in \
             {DEVICE_NOTES}, under the name the mount was given: a cache moved from another \
             machine, or reached by a name that leads elsewhere now, has none here."
        ),
        false => String::new(),
    };
    format!(
        "{}: {what}, so nothing says which writer of {url} last mounted it read-write, and \
         whether a later writer went on from the store since (this cache then a branch the \
         store no longer has) cannot be told.{device} Mount it by the name its earlier mounts \
         used, or bring its note from the machine that mounted it; or {FROM_THE_STORE}",
        cache.display()
    )
}

/// The message of a store mount whose segment store did not start: a damaged residency map
/// (`PATH.ldfs-resident`: which segments the cache does not hold, so a hole is never read as
/// data) cannot be repaired from the cache, and a mount without it could read holes as data;
/// the remedy is a new cache (review 34).
pub fn start_failed(url: &StoreUrl, cache: &Path, e: &ldfs::store::LayerError) -> String {
    match e {
        ldfs::store::LayerError::Corrupt {
            what: "residency map",
            detail,
            ..
        } => format!(
            "{url}: {e}. The cache {} cannot be used without it (it says which segments the \
             cache holds and which are in the store only): {FROM_THE_STORE}{}",
            cache.display(),
            match detail.starts_with("fs id") {
                // An `ldfs mkfs --store` before review 34 left an earlier file system's map
                // at a reused cache path: no mount of this cache ever started, so it evicted
                // nothing.
                true =>
                    ". If this cache was made by ldfs mkfs --store at the path of an \
                         earlier one and no mount has used it since, the map is that earlier file \
                         system's: removing the map is enough",
                false => "",
            }
        ),
        _ => format!("{url}: {e}"),
    }
}

/// Removes a residency map left at `cache`'s place by an earlier file system (`ldfs mkfs
/// --store` over an old cache path: every mount then failed on the map's fs id until the user
/// removed it, review 34). A cache just formatted holds every segment, so any map there is
/// stale. Returns what it removed, for the message.
pub fn remove_stale_map(cache: &Path) -> Result<Option<String>, String> {
    let map = map_path(cache);
    let Ok(bytes) = std::fs::read(&map) else {
        return Ok(None);
    };
    remove_map(&map).map_err(|e| format!("{}: {e}", map.display()))?;
    let of = match bytes.get(..24) {
        Some(h) if h[..8] == ldfs::store::cache::MAP_MAGIC.to_le_bytes() => format!(
            "of file system {:016x}",
            u64::from_le_bytes(h[16..24].try_into().expect("8 bytes"))
        ),
        _ => "damaged".to_string(),
    };
    Ok(Some(format!(
        "removed {}, the residency map ({of}) of an earlier file system on this cache",
        map.display()
    )))
}

fn no_file_system(url: &StoreUrl) -> String {
    format!("{url} holds no file system (no checkpoint object): make one with ldfs mkfs --store")
}

/// An error unless `store` holds a file system (a checkpoint object).
pub fn holds_file_system(store: &dyn ObjectStore, url: &StoreUrl) -> Result<(), String> {
    match newest_checkpoint(store).map_err(|e| format!("{url}: {e}"))? {
        Some(_) => Ok(()),
        None => Err(no_file_system(url)),
    }
}

/// What a cache's superblock pages say ([`cache_superblock`]).
#[derive(Debug)]
enum CacheSuperblock {
    /// No cache: absent, empty, or page 0 zeros with no superblock copy 1 either (a rebuild's
    /// first step zeroes both, `store::segments::forget_cache`).
    Empty,
    /// Page 0 is a superblock.
    Whole(Geometry),
    /// Page 0 zeros or torn (each 512-byte sector zeros or the bytes of copy 1's superblock as
    /// copy 0), copy 1 at the device's last page good: a cache of the file system whose page
    /// 0 was lost, or a rebuild torn at its very last write (it writes and flushes copy 1
    /// before page 0, everything else before copy 1). `page0`: copy 1 as copy 0, to restore.
    Page0Lost { geo: Geometry, page0: Vec<u8> },
}

/// The sector a torn write lands whole or not at all.
const SECTOR_BYTES: usize = 512;

/// What the cache's superblock pages hold; an error if page 0 holds something else (neither
/// zeros, nor a superblock, nor a torn write of the superblock copy 1 holds).
fn cache_superblock(cache: &Path) -> Result<CacheSuperblock, String> {
    if !cache.exists() {
        return Ok(CacheSuperblock::Empty);
    }
    // The device's size, not the file's length: a block device's st_size is 0 (review 31).
    let dev = FileDevice::open_read_only(cache).map_err(|e| format!("{}: {e}", cache.display()))?;
    let size = dev.size_bytes();
    if size < PAGE_BYTES as u64 {
        return Ok(CacheSuperblock::Empty);
    }
    let read = |addr: u64| -> Result<Vec<u8>, String> {
        let mut page = vec![0u8; PAGE_BYTES];
        dev.read_at(&mut page, addr)
            .map_err(|e| format!("{}: {e}", cache.display()))?;
        Ok(page)
    };
    let page = read(0)?;
    let whole = Geometry::decode_superblock(&page, 0, size);
    if let Ok(g) = whole {
        return Ok(CacheSuperblock::Whole(g));
    }
    // Copy 1, where lld and fsck read it (review 37 finding 1): page 0 lost with it good is a
    // cache of the file system, never an empty one to rebuild over (store5).
    let last = copy1_addr(size);
    if last > 0 {
        let copy1 = read(last)?;
        if let Ok(geo) = Geometry::decode_superblock(&copy1, last, size) {
            let page0 = superblock_as_copy(&copy1, 0);
            // Torn while it was written: each sector is the new page's, zeros, or, when the
            // write gave a cache made before ids its id (copy 1 first), the page it replaced,
            // copy 1's with id 0 (review 41 finding 2).
            let before_id = superblock_with_cache_id(&page0, 0);
            let torn_of_it = page
                .chunks(SECTOR_BYTES)
                .zip(page0.chunks(SECTOR_BYTES))
                .zip(before_id.chunks(SECTOR_BYTES))
                .all(|((got, want), old)| {
                    got == want || (geo.cache_id != 0 && got == old) || got.iter().all(|&b| b == 0)
                });
            if torn_of_it && Geometry::decode_superblock(&page0, 0, size).is_ok() {
                return Ok(CacheSuperblock::Page0Lost { geo, page0 });
            }
        }
    }
    if page.iter().all(|&b| b == 0) {
        return Ok(CacheSuperblock::Empty);
    }
    Err(format!(
        "{}: not an ldfs cache: {}",
        cache.display(),
        whole.expect_err("decoded above")
    ))
}

/// Writes both superblock copies of a cache from `page0` (a superblock page as copy 0): copy
/// 1 at the device's last page, a flush, then page 0, a flush (each copy alone describes the
/// cache at every moment). For page 0 lost (`CacheSuperblock::Page0Lost`: the segment store
/// reads page 0 at its start) and for a cache id given to a cache made before caches had one.
fn write_superblocks(cache: &Path, page0: &[u8], why: &str) -> Result<(), String> {
    let err = |e: String| format!("{}: {why}: {e}", cache.display());
    let dev =
        FileDevice::open(cache, FileDeviceOptions::default()).map_err(|e| err(e.to_string()))?;
    let last = copy1_addr(dev.size_bytes());
    dev.write_at(&superblock_as_copy(page0, 1), last)
        .and_then(|()| dev.flush())
        .and_then(|()| dev.write_at(page0, 0))
        .and_then(|()| dev.flush())
        .map_err(|e| err(e.to_string()))
}

/// Page 0 of a cache, read as it is.
fn read_page0(cache: &Path) -> Result<Vec<u8>, String> {
    let dev = FileDevice::open_read_only(cache).map_err(|e| format!("{}: {e}", cache.display()))?;
    let mut page = vec![0u8; PAGE_BYTES];
    dev.read_at(&mut page, 0)
        .map_err(|e| format!("{}: {e}", cache.display()))?;
    Ok(page)
}

/// Gives the cache just formatted at `cache` (page 0 a superblock) an identity
/// (`Geometry::cache_id`) in both superblock copies, for its note (`ldfs mkfs --store`).
pub fn stamp_cache_id(cache: &Path) -> Result<u64, String> {
    let CacheSuperblock::Whole(_) = cache_superblock(cache)? else {
        return Err(format!("{}: no superblock at page 0", cache.display()));
    };
    let id = random_cache_id();
    let page0 = superblock_with_cache_id(&read_page0(cache)?, id);
    write_superblocks(cache, &page0, "writing its cache id")?;
    Ok(id)
}

/// Why a cache is refused whose note is another cache's: the note is found by the cache's path
/// and records the identity of the cache it was written for (`Geometry::cache_id`), which this
/// one does not carry (store5).
fn other_cache_refusal(cache: &Path, noted: u64, holds: u64) -> String {
    format!(
        "{}: its note {} is of another cache (cache id {noted:016x}; this one carries {}): a \
         cache moved or copied to this path, or a device now at this name that is not the one \
         the note was written for, so nothing says which writer last wrote it, nor whether it \
         holds writes the store lacks. Mount it by the name or at the path its mounts used (its \
         own note), or {FROM_THE_STORE}",
        cache.display(),
        note_path(cache).display(),
        match holds {
            0 => "none".to_string(),
            id => format!("{id:016x}"),
        }
    )
}

/// Gets `cache` ready for a mount of the file system in `store`: a cache that is absent, empty
/// or zeros (both superblock copies) is made the file system's size (sparse) and rebuilt from
/// the newest checkpoint object, as is a cache only read-only mounts used; one whose page 0
/// is zeros or torn with copy 1 good is a cache, not an empty one (`CacheSuperblock`): kept
/// for its writer (page 0 restored from copy 1), never rebuilt over; a read-only mount refuses a writer's
/// cache (rebuilding it would overwrite what it has not uploaded); a read-write mount keeps
/// a writer's cache of the same file system unless a later writer uploaded since it was last
/// mounted (see the module documentation). `writer` is the lease generation of this mount
/// (read-write; `None` read-only), written to the note.
pub fn prepare_cache(
    store: &dyn ObjectStore,
    url: &StoreUrl,
    cache: &Path,
    writer: Option<u64>,
) -> Result<(), String> {
    prepare_cache_sized(store, url, cache, writer, None).map(|_| ())
}

/// [`prepare_cache`] with the mount's `--cache-size` (which wins over, and replaces, the one
/// the note remembers). A rebuild downloads nothing but the Active segment's prefix
/// (`restore_lazy`: segments are fetched as read): a read-write mount's of the store's newest
/// complete checkpoint, a read-only mount's of the one its pin keeps
/// ([`prepare_reader_cache`]; without a pin, the newest complete one). Returns the cache's
/// bound, if it has one.
pub fn prepare_cache_sized(
    store: &dyn ObjectStore,
    url: &StoreUrl,
    cache: &Path,
    writer: Option<u64>,
    cache_size: Option<u64>,
) -> Result<Option<u64>, String> {
    prepare(store, url, cache, writer, cache_size, None)
}

/// A read-only mount's [`prepare_cache_sized`]: the cache is rebuilt (it always is for a
/// reader) from the checkpoint object `key` its pin keeps (`store::readers`), keeping what
/// the cache holds of `keep` (a refresh's: `segments::restore_lazy_keeping`; empty at a mount).
pub fn prepare_reader_cache(
    store: &dyn ObjectStore,
    url: &StoreUrl,
    cache: &Path,
    cache_size: Option<u64>,
    key: &str,
    obj: &CheckpointObject,
    keep: &[SegmentEntry],
) -> Result<Option<u64>, String> {
    prepare(store, url, cache, None, cache_size, Some((key, obj, keep)))
}

fn prepare(
    store: &dyn ObjectStore,
    url: &StoreUrl,
    cache: &Path,
    writer: Option<u64>,
    cache_size: Option<u64>,
    pinned: Option<(&str, &CheckpointObject, &[SegmentEntry])>,
) -> Result<Option<u64>, String> {
    if let Some(why) = ambiguous_note(cache) {
        return Err(why);
    }
    let Some((key, newest)) = newest_checkpoint(store).map_err(|e| format!("{url}: {e}"))? else {
        return Err(no_file_system(url));
    };
    let noted_size = match read_note(cache) {
        Some((id, _)) if id == newest.geo.fs_id => noted_cache_size(cache),
        _ => None,
    };
    let bound = cache_size.or(noted_size);
    if let Some(b) = bound {
        let least = MIN_CACHE_SEGMENTS * newest.geo.segment_bytes();
        if b < least {
            return Err(format!(
                "--cache-size {b}: a cache holds at least {MIN_CACHE_SEGMENTS} segments \
                 ({least} bytes) of this file system"
            ));
        }
    }
    let (newest_writer, _) = parse_checkpoint_key(&key).expect("newest_checkpoint parsed it");
    let fs_id = newest.geo.fs_id;
    // A page 0 that is neither zeros, an ldfs superblock nor a torn write of the superblock
    // copy 1 holds is refused, READER note or not: the note is a file found by the cache's
    // path and outlives the cache (a name reused, a /dev name given to another disk), so it
    // cannot vouch for what the device holds (review 37 finding 2). The device vouches for
    // itself: a rebuild writes and flushes copy 1 before page 0, so one torn at its very last
    // write has a good copy 1 and a page 0 each of whose sectors is zeros or copy 1's; such
    // a cache is a reader's to rebuild or a writer's to open (review 36 finding 4).
    let found = cache_superblock(cache).map_err(|e| {
        format!(
            "{e}. If it is a cache of this file system, move it away (for a device, zero its \
             first and its last 4 KiB, the superblock's two copies): the next mount rebuilds \
             it from {url}"
        )
    })?;
    let (geometry, page0) = match found {
        CacheSuperblock::Empty => (None, None),
        CacheSuperblock::Whole(g) => (Some(g), None),
        CacheSuperblock::Page0Lost { geo, page0 } => (Some(geo), Some(page0)),
    };
    let rebuild = match geometry {
        // Page 0 zeros with copy 1 good is a cache, never taken for an empty one: a writer's
        // fsynced, unuploaded writes would be rebuilt over (store5).
        None => true,
        Some(g) if g.fs_id != fs_id => {
            return Err(format!(
                "{} is the cache of another file system (fs id {:016x}; {url} holds {fs_id:016x})",
                cache.display(),
                g.fs_id
            ))
        }
        Some(g) => {
            let note = read_note_id(cache).filter(|n| n.0 == fs_id);
            // The note vouches only for the cache carrying its id: one found by this path
            // for another cache (moved here, a /dev name given to another disk) is refused,
            // READER or writer (store5). A note from before ids: as before.
            if let Some(id) = note.and_then(|n| n.2).filter(|&id| id != g.cache_id) {
                return Err(other_cache_refusal(cache, id, g.cache_id));
            }
            let noted = note.map(|n| n.1);
            match noted {
                Some(READER) => true,
                Some(w) if writer.is_none() => {
                    return Err(format!(
                        "{} is the cache of read-write mounts of {url} (as writer {w}): it may \
                         hold writes not yet in the store, which a read-only mount (rebuilt \
                         from the store's last checkpoint) would overwrite. Give the \
                         read-only mount a cache of its own, or mount this one read-write \
                         (which uploads them)",
                        cache.display()
                    ))
                }
                None if writer.is_none() => {
                    return Err(format!(
                        "{} holds this file system but no note ({}) says which mount last \
                         used it: it may hold writes not yet in the store. Give the read-only \
                         mount a cache of its own, or mount this one read-write",
                        cache.display(),
                        note_path(cache).display()
                    ))
                }
                Some(w) if w >= newest_writer => false,
                None => return Err(no_note_refusal(cache, url, fs_id)),
                Some(_) => {
                    return Err(format!(
                        "{} is older than {url}: a later writer (lease generation \
                         {newest_writer}) uploaded {key} after this cache was last mounted \
                         read-write{}; it holds a branch the store no longer has. Move it away \
                         (or delete it) to mount from the store",
                        cache.display(),
                        noted.map_or(String::new(), |w| format!(" (as writer {w})"))
                    ))
                }
            }
        }
    };
    // The cache's identity: a rebuild writes a new one (recorded in the note first); a kept
    // cache keeps its own, or gets one if it was made before caches had one.
    let cache_id = match geometry {
        Some(g) if !rebuild && g.cache_id != 0 => g.cache_id,
        _ => random_cache_id(),
    };
    if rebuild {
        let need = newest.geo.total_pages * PAGE_BYTES as u64;
        let t = Instant::now();
        {
            let f = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(cache)
                .map_err(|e| format!("{}: {e}", cache.display()))?;
            // A file grows to the file system's size (sparse); a block device is its size
            // (`restore` refuses one too small).
            let meta = f
                .metadata()
                .map_err(|e| format!("{}: {e}", cache.display()))?;
            if meta.file_type().is_file() && meta.len() < need {
                f.set_len(need)
                    .map_err(|e| format!("{}: {e}", cache.display()))?;
            }
        }
        let dev = FileDevice::open(cache, FileDeviceOptions::default())
            .map_err(|e| format!("{}: {e}", cache.display()))?;
        // The old superblocks go first (the cache is being replaced): a rebuild that stops
        // before its own first step must not leave them, with their id, under the note below,
        // which names the id the rebuild writes: the next mount refused it as another cache's
        // (review 41 finding 1); with no superblock it rebuilds again.
        ldfs::store::segments::forget_cache(&dev, geometry.as_ref())
            .map_err(|e| format!("{}: {e}", cache.display()))?;
        // Before every rebuild, a reader's or a writer's: one cut short, or a writer's finished
        // but killed before its own note, leaves a cache the next mount rebuilds again, not one
        // refused or taken as a writer's (review 36 finding 2).
        write_note_as(cache, url, fs_id, READER, bound, Some(cache_id))?;
        let map = map_path(cache);
        let r = match pinned {
            Some((key, obj, keep)) => {
                restore_lazy_keeping(store, &dev, &map, cache_id, key, obj, keep)
            }
            None => restore_lazy_as(store, &dev, &map, cache_id),
        }
        .map_err(|e| format!("rebuilding {} from {url}: {e}", cache.display()))?;
        eprintln!(
            "ldfs: rebuilt the cache {} from {url}: checkpoint {}, {} segment objects ({} bytes) downloaded{}; the rest is fetched as read, in {:.1} s",
            cache.display(),
            r.serial,
            r.segments,
            r.bytes,
            match r.kept {
                0 => String::new(),
                k => format!(", {k} segments the cache held kept"),
            },
            t.elapsed().as_secs_f64()
        );
    }
    if let (false, Some(g)) = (rebuild, geometry) {
        // Kept: page 0 restored from copy 1 if it was lost, an id given if it has none.
        let lost = page0.is_some();
        if lost || g.cache_id != cache_id {
            let base = match page0 {
                Some(p) => p,
                None => read_page0(cache)?,
            };
            write_superblocks(
                cache,
                &superblock_with_cache_id(&base, cache_id),
                "writing its superblocks",
            )?;
            if lost {
                eprintln!(
                    "ldfs: {}: superblock copy 0 (page 0) was zeros or torn; restored from copy 1",
                    cache.display()
                );
            }
        }
    }
    if let Some(w) = writer {
        write_note_as(cache, url, fs_id, w, bound, Some(cache_id))?;
    }
    Ok(bound)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(
            StoreUrl::parse("s3://b").unwrap(),
            StoreUrl {
                bucket: "b".into(),
                prefix: "".into()
            }
        );
        let u = StoreUrl::parse("s3://b/x/y/").unwrap();
        assert_eq!((u.bucket.as_str(), u.prefix.as_str()), ("b", "x/y"));
        assert_eq!(u.to_string(), "s3://b/x/y");
        assert!(StoreUrl::parse("s3:///p").is_err());
        assert!(StoreUrl::parse("/img").is_err());
        assert!(StoreUrl::is_store(Path::new("s3://b")));
        assert!(!StoreUrl::is_store(Path::new("./s3:")));
    }

    #[test]
    fn the_note_round_trips() {
        let d = tempfile::tempdir().unwrap();
        let cache = d.path().join("c.img");
        assert_eq!(read_note(&cache), None);
        let u = StoreUrl::parse("s3://b/p").unwrap();
        write_note(&cache, &u, 0xabc, 7).unwrap();
        assert_eq!(read_note(&cache), Some((0xabc, 7)));
        assert_eq!(noted_cache_size(&cache), None);
        write_note_with(&cache, &u, 0xabc, 7, Some(1 << 30)).unwrap();
        write_note(&cache, &u, 0xabc, 8).unwrap();
        assert_eq!(read_note(&cache), Some((0xabc, 8)));
        assert_eq!(
            noted_cache_size(&cache),
            Some(1 << 30),
            "kept by write_note"
        );
        assert!(map_path(&cache).ends_with("c.img.ldfs-resident"));
        assert!(note_path(&cache).ends_with("c.img.ldfs-store"));
        assert_eq!(
            note_path(Path::new("/dev/mapper/vg-cache")),
            Path::new("/var/lib/ldfs/store-notes/dev%mapper%vg-cache.ldfs-store")
        );
    }
}
