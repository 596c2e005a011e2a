//! The segment store layer: lld's durable checkpoints, uploaded as immutable objects.
//!
//! docs/DESIGN.md "The segment store layer" has the design, docs/FORMAT.md "Object store
//! layout" the keys and the checkpoint object. In short: lld's segment hook tells of each
//! segment the log left once its writes returned, and the uploader puts it at once ("ahead",
//! an object no checkpoint object names yet); lld's checkpoint hook hands each durable slot to
//! [`SegmentStore`] (no I/O in the hooks: the newest slot is kept as the next job), and the
//! uploader puts every segment the slot names that the store lacks, then the checkpoint
//! object, then deletes what neither of the newest two checkpoint objects names. [`restore`]
//! rebuilds a fresh cache device from the newest complete checkpoint object.
//!
//! Invariants: a checkpoint object is put only after every segment object it names was
//! acknowledged; a key always names the same bytes (what is uploaded is a durable checkpoint's
//! content or a segment the log left with its writes returned, within one writer the log never
//! writes a use twice, and a segment's content changes only after a checkpoint releases it,
//! which the uploader detects around each read); an object is deleted only when neither of the
//! two newest uploaded checkpoint objects names it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::cache::{Cache, CacheConfig, CacheDevice, CacheStats};
use super::lease::{HeldLease, LeaseCheck};
use super::{ObjectStore, PutOutcome, StoreError, StoreResult};
use crate::device::{Device, DeviceError};
use crate::lld::checkpoint;
use crate::lld::layout::{
    copy1_addr, random_cache_id, recorded_total_pages, superblock_as_copy,
    superblock_with_cache_id, Geometry,
};
use crate::lld::summary::{self, Expect};
use crate::lld::usage::SegmentState;
use crate::lld::{CheckpointHook, DurableCheckpoint, SegmentHook, SegmentId, PAGE_BYTES};

pub const CKPT_MAGIC: u64 = u64::from_le_bytes(*b"LDFSSCKP");
pub const CKPT_VERSION: u32 = 2;
const O_MAGIC: usize = 0;
const O_VERSION: usize = 8;
const O_COUNT: usize = 12;
const O_FS_ID: usize = 16;
const O_SERIAL: usize = 24;
const O_SLOT_LEN: usize = 32;
const O_CRC: usize = 36;
const O_WRITER: usize = 40;
const O_SUPERBLOCK: usize = 48;
const O_SLOT: usize = O_SUPERBLOCK + PAGE_BYTES;
const ENTRY_BYTES: usize = 32;

/// The most segment objects the uploader puts at once ([`puts_in_flight`]; `ldfs bench fs`
/// measures the gateway's own PUT throughput with as many in flight).
pub const UPLOAD_PUTS_IN_FLIGHT: usize = 4;

/// The layer's errors.
#[derive(Debug, thiserror::Error)]
pub enum LayerError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Device(#[from] DeviceError),
    /// An object, or the cache, holds what cannot be right; evidence included.
    #[error("{what} {key}: {detail}")]
    Corrupt {
        what: &'static str,
        key: String,
        detail: String,
    },
    /// Another writer put a checkpoint object this one was about to put.
    #[error("checkpoint object {key} already exists with other bytes: another writer")]
    Conflict { key: String },
    /// This mount's lease is gone (taken over, or released): it writes nothing more.
    #[error("{0}")]
    LeaseLost(#[from] LeaseCheck),
    #[error("{0}")]
    Other(String),
}

pub type LayerResult<T> = Result<T, LayerError>;

/// The key of a segment object. `writer` is the lease generation of the mount that put it:
/// two writers (a stale one whose late puts still land, and the one that took over and
/// continues the same log from the same checkpoint) never share a key (review 26).
pub fn segment_key(segment: u32, writer: u64, first_seq: u64, pages: u32) -> String {
    format!("seg/{segment:08x}-{writer:016x}-{first_seq:016x}-{pages:04x}")
}

/// The key of a checkpoint object: writer first, so key order puts every checkpoint of a
/// later writer after all of an earlier one's (a stale writer's late checkpoint never sorts
/// newest), then serial.
pub fn checkpoint_key(writer: u64, serial: u64) -> String {
    format!("ckpt/{writer:016x}-{serial:016x}")
}

/// (writer, serial) of a checkpoint key.
pub fn parse_checkpoint_key(key: &str) -> Option<(u64, u64)> {
    let (w, n) = key.strip_prefix("ckpt/")?.split_once('-')?;
    if w.len() != 16 || n.len() != 16 {
        return None;
    }
    Some((
        u64::from_str_radix(w, 16).ok()?,
        u64::from_str_radix(n, 16).ok()?,
    ))
}

/// One segment object a checkpoint object names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentEntry {
    pub segment: u32,
    pub pages: u32,
    pub first_seq: u64,
    /// The writer (lease generation) that put the object.
    pub writer: u64,
    pub crc: u32,
}

impl SegmentEntry {
    pub fn key(&self) -> String {
        segment_key(self.segment, self.writer, self.first_seq, self.pages)
    }
}

/// A decoded checkpoint object.
#[derive(Clone, Debug)]
pub struct CheckpointObject {
    pub writer: u64,
    pub serial: u64,
    pub geo: Geometry,
    pub superblock: Vec<u8>,
    pub slot: Vec<u8>,
    pub entries: Vec<SegmentEntry>,
}

fn get_u32(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"))
}
fn get_u64(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"))
}
fn crc_with_hole(b: &[u8], at: usize) -> u32 {
    let c = crc32c::crc32c(&b[..at]);
    let c = crc32c::crc32c_append(c, &[0u8; 4]);
    crc32c::crc32c_append(c, &b[at + 4..])
}

/// Whether `len` is a slot's length for `geo`: every page of the slot, or, with a named slot
/// (RESIZE or KEPT_TABLE), the pages it names, from its header page up (review 31: such
/// slots are as long as their usage and kept tables, not the room the superblock leaves).
fn slot_len_ok(geo: &Geometry, len: usize) -> bool {
    let whole = geo.checkpoint_pages as usize * PAGE_BYTES;
    if geo.named_slot() {
        len >= PAGE_BYTES && len <= whole && len.is_multiple_of(PAGE_BYTES)
    } else {
        len == whole
    }
}

/// Encodes a checkpoint object (FORMAT "Object store layout").
pub fn encode_checkpoint_object(
    geo: &Geometry,
    superblock: &[u8],
    writer: u64,
    serial: u64,
    slot: &[u8],
    entries: &[SegmentEntry],
) -> Vec<u8> {
    assert_eq!(superblock.len(), PAGE_BYTES);
    assert!(
        slot_len_ok(geo, slot.len()),
        "a slot of {} bytes for {} pages",
        slot.len(),
        geo.checkpoint_pages
    );
    assert!(entries.windows(2).all(|w| w[0].segment < w[1].segment));
    let mut b = Vec::with_capacity(O_SLOT + slot.len() + entries.len() * ENTRY_BYTES);
    b.extend_from_slice(&CKPT_MAGIC.to_le_bytes());
    b.extend_from_slice(&CKPT_VERSION.to_le_bytes());
    b.extend_from_slice(&(entries.len() as u32).to_le_bytes());
    b.extend_from_slice(&geo.fs_id.to_le_bytes());
    b.extend_from_slice(&serial.to_le_bytes());
    b.extend_from_slice(&(slot.len() as u32).to_le_bytes());
    b.extend_from_slice(&0u32.to_le_bytes());
    b.extend_from_slice(&writer.to_le_bytes());
    b.extend_from_slice(superblock);
    b.extend_from_slice(slot);
    for e in entries {
        b.extend_from_slice(&e.segment.to_le_bytes());
        b.extend_from_slice(&e.pages.to_le_bytes());
        b.extend_from_slice(&e.first_seq.to_le_bytes());
        b.extend_from_slice(&e.writer.to_le_bytes());
        b.extend_from_slice(&e.crc.to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes());
    }
    let crc = crc_with_hole(&b, O_CRC);
    b[O_CRC..O_CRC + 4].copy_from_slice(&crc.to_le_bytes());
    b
}

/// Decodes and checks a checkpoint object read from `key`: magic, version, crc, the
/// superblock, the slot (its own crc, fs id and serial), every entry bounded, and the key's
/// writer and serial equal to the object's.
pub fn decode_checkpoint_object(key: &str, b: &[u8]) -> LayerResult<CheckpointObject> {
    let bad = |detail: String| LayerError::Corrupt {
        what: "checkpoint object",
        key: key.to_string(),
        detail,
    };
    if b.len() < O_SLOT {
        return Err(bad(format!("{} bytes, shorter than its header", b.len())));
    }
    if get_u64(b, O_MAGIC) != CKPT_MAGIC {
        return Err(bad(format!("bad magic {:#x}", get_u64(b, O_MAGIC))));
    }
    if get_u32(b, O_VERSION) != CKPT_VERSION {
        return Err(bad(format!("version {}", get_u32(b, O_VERSION))));
    }
    let (want, got) = (get_u32(b, O_CRC), crc_with_hole(b, O_CRC));
    if want != got {
        return Err(bad(format!("crc {got:#x}, stored {want:#x}")));
    }
    let superblock = b[O_SUPERBLOCK..O_SLOT].to_vec();
    let geo = Geometry::decode_superblock(&superblock, 0, u64::MAX)
        .map_err(|e| bad(format!("superblock: {e}")))?;
    // A resizable image takes its size from the device it is on; here that is the size it
    // records (the cache's when it was made), which a rebuild needs (review 31).
    let geo = match geo.resizable() {
        false => geo,
        true => {
            let bytes = recorded_total_pages(&superblock).saturating_mul(PAGE_BYTES as u64);
            Geometry::decode_superblock(&superblock, 0, bytes)
                .map_err(|e| bad(format!("superblock: {e}")))?
        }
    };
    let fs_id = get_u64(b, O_FS_ID);
    if fs_id != geo.fs_id {
        return Err(bad(format!(
            "fs id {fs_id:#x}, superblock {:#x}",
            geo.fs_id
        )));
    }
    let slot_len = get_u32(b, O_SLOT_LEN) as usize;
    if !slot_len_ok(&geo, slot_len) {
        return Err(bad(format!("slot of {slot_len} bytes")));
    }
    let count = get_u32(b, O_COUNT) as usize;
    if count > geo.segment_count as usize
        || b.len()
            != O_SLOT
                .saturating_add(slot_len)
                .saturating_add(count * ENTRY_BYTES)
    {
        return Err(bad(format!("{count} entries in {} bytes", b.len())));
    }
    let slot = b[O_SLOT..O_SLOT + slot_len].to_vec();
    let serial = get_u64(b, O_SERIAL);
    let (hdr, _) = checkpoint::decode(&geo, &slot, 0).map_err(|e| bad(format!("slot: {e}")))?;
    // The slot's count may exceed the superblock's only after a grow, which a store cache
    // never does: the log must be inside the superblock's segments (review 32: a rebuild
    // zeroes the log head there).
    if hdr.log_segment >= geo.segment_count || hdr.next_segment >= geo.segment_count {
        return Err(bad(format!(
            "log at segment {} (next {}), beyond the superblock's {} segments",
            hdr.log_segment, hdr.next_segment, geo.segment_count
        )));
    }
    if hdr.serial != serial {
        return Err(bad(format!("slot serial {}, object {serial}", hdr.serial)));
    }
    let mut entries = Vec::with_capacity(count);
    for i in 0..count {
        let o = O_SLOT + slot_len + i * ENTRY_BYTES;
        let e = SegmentEntry {
            segment: get_u32(b, o),
            pages: get_u32(b, o + 4),
            first_seq: get_u64(b, o + 8),
            writer: get_u64(b, o + 16),
            crc: get_u32(b, o + 24),
        };
        if e.segment >= geo.segment_count
            || e.pages == 0
            || e.pages > geo.segment_pages
            || e.writer == 0
        {
            return Err(bad(format!("entry {i}: {e:?} outside the geometry")));
        }
        if entries
            .last()
            .is_some_and(|p: &SegmentEntry| p.segment >= e.segment)
        {
            return Err(bad(format!("entry {i}: segments not ascending")));
        }
        entries.push(e);
    }
    let writer = get_u64(b, O_WRITER);
    if parse_checkpoint_key(key) != Some((writer, serial)) {
        return Err(bad(format!("holds writer {writer} serial {serial}")));
    }
    if let Some(e) = entries.iter().find(|e| e.writer > writer) {
        return Err(bad(format!("names {e:?}, of a later writer than its own")));
    }
    Ok(CheckpointObject {
        writer,
        serial,
        geo,
        superblock,
        slot,
        entries,
    })
}

/// Counters (`ldfs stats` will show them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UploadStats {
    pub segments_put: u64,
    pub segment_bytes_put: u64,
    /// Of `segments_put`: full segments put as soon as the log left them, before any
    /// checkpoint named them (`LldOptions::segment_hook`).
    pub segments_put_ahead: u64,
    pub checkpoints_put: u64,
    /// Checkpoints given up for a newer one (a segment they named was released meanwhile, or a
    /// newer one arrived before their upload began).
    pub checkpoints_skipped: u64,
    pub objects_deleted: u64,
    /// Requests that failed transiently and were tried again.
    pub retries: u64,
    /// Waits before a checkpoint put or delete for a late lease renewal.
    pub lease_waits: u64,
}

struct Job {
    serial: u64,
    slot: Vec<u8>,
    /// `State::release_gen` when the hook ran.
    gen: u64,
    /// Bytes lld had written to the cache when the hook ran.
    written: u64,
    /// The segments the log had left at the snapshot of the first job still waiting
    /// (`DurableCheckpoint::segments_told`, at most `State::left_pushed`): the checkpoint names
    /// (or released) them, and the puts ahead under way go on putting them before the job is
    /// taken.
    left_before: u64,
}

/// A segment object in the store, and when its bytes were read.
#[derive(Clone, Copy)]
struct Known {
    entry: SegmentEntry,
    read_gen: u64,
    /// Named by the store's newest complete checkpoint object, which the cache does not hold
    /// (review 32): the object is the cache's segment only if their bytes are the same, so
    /// the uploader reads the segment and compares crcs before it takes the object as its.
    verify: bool,
}

struct State {
    /// Bumped by every hook call that releases segments.
    release_gen: u64,
    /// Per segment: the `release_gen` of its last release (0: never).
    released_at: Vec<u64>,
    job: Option<Job>,
    /// Segments the log left (`SegmentStore::segment_hook`), each with `release_gen` when told:
    /// put ahead of the checkpoint that will name them.
    left: std::collections::VecDeque<(SegmentId, u64)>,
    /// Segments ever pushed onto `left` (those popped: this less `left.len()`).
    left_pushed: u64,
    /// The newest checkpoint object in the store.
    uploaded: u64,
    /// The newest checkpoint the hook announced.
    announced: u64,
    failed: Option<String>,
    stop: bool,
    /// Nothing is put or deleted until [`SegmentStore::release_uploads`] (a mount that may
    /// still be refused: review 41 finding 3).
    held: bool,
    /// The mount is ending: [`SegmentStore::wait_backlog`] returns at once (review 32 finding 7).
    backlog_waits_ended: bool,
    stats: UploadStats,
    /// Bytes lld had written to the cache at the newest uploaded checkpoint.
    uploaded_written: u64,
    /// When the newest checkpoint object was put (by this process), and its size plus the
    /// sizes of the segment objects it names.
    uploaded_at: Option<std::time::SystemTime>,
    store_bytes: u64,
    /// Segment objects the start's sweep found no kept checkpoint object naming, deleted only
    /// in the delete round of this writer's second checkpoint put (review 43 finding 1): until
    /// then a stale writer's late checkpoint put may sort among the newest two and name them,
    /// and a reader may pin it after the start listed the pins; from then on this writer's two
    /// checkpoints sort above it, and the round lists the pins after its put.
    sweep_deferred: Vec<String>,
    /// Checkpoint puts before `sweep_deferred` goes.
    puts_before_sweep: u32,
}

struct Shared {
    /// Bytes written through [`SegmentStore::device`]: the upload backlog is what was written
    /// since the newest uploaded checkpoint.
    written: std::sync::atomic::AtomicU64,
    store: Arc<dyn ObjectStore>,
    /// Checked before every checkpoint put and delete (not segment puts: their keys are this
    /// writer's own, so a late one harms nobody).
    lease: Arc<HeldLease>,
    /// The cache device: through the [`Cache`] when there is one.
    dev: Arc<dyn Device>,
    cache: Option<Arc<Cache>>,
    geo: Geometry,
    superblock: Vec<u8>,
    state: Mutex<State>,
    cv: Condvar,
    backoff: (Duration, Duration),
}

/// Options of the uploader.
#[derive(Clone, Copy, Debug)]
pub struct SegmentStoreOptions {
    /// First wait after a transient failure; doubled up to `backoff_max`.
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
}

impl Default for SegmentStoreOptions {
    fn default() -> Self {
        SegmentStoreOptions {
            backoff_initial: Duration::from_millis(50),
            backoff_max: Duration::from_secs(5),
        }
    }
}

/// See the module documentation. Give [`SegmentStore::hook`] to lld
/// (`LldOptions::checkpoint_hook`) before opening the engine on `dev`.
pub struct SegmentStore {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl SegmentStore {
    /// Starts the uploader for the lld image on `dev` (its superblock is read now), writing as
    /// the holder of `lease` (its generation is the writer part of every key put).
    pub fn start(
        store: Arc<dyn ObjectStore>,
        dev: Arc<dyn Device>,
        lease: Arc<HeldLease>,
        opts: SegmentStoreOptions,
    ) -> LayerResult<SegmentStore> {
        Self::start_cached(store, dev, lease, opts, None)
    }

    /// [`SegmentStore::start`] with the cache's residency (`store::cache`): segments the cache
    /// does not hold are fetched on a read, and with a bound, uploaded ones are evicted to stay
    /// within it. Everything lld does must then go through [`SegmentStore::device`].
    pub fn start_cached(
        store: Arc<dyn ObjectStore>,
        dev: Arc<dyn Device>,
        lease: Arc<HeldLease>,
        opts: SegmentStoreOptions,
        cache: Option<CacheConfig>,
    ) -> LayerResult<SegmentStore> {
        lease.check()?;
        let mut superblock = vec![0u8; PAGE_BYTES];
        dev.read_at(&mut superblock, 0)?;
        let geo = Geometry::decode_superblock(&superblock, 0, dev.size_bytes()).map_err(|e| {
            LayerError::Corrupt {
                what: "cache device",
                key: "superblock".into(),
                detail: e.to_string(),
            }
        })?;
        // The store's file system must be this cache's (review 31: two `mkfs --store` racing
        // on one prefix, or a caller skipping the cache check), before anything is deleted.
        if let Some((key, obj)) = newest_checkpoint(&*store)? {
            if obj.geo.fs_id != geo.fs_id {
                return Err(LayerError::Other(format!(
                    "the store holds file system {:016x} ({key}); this cache is of {:016x}",
                    obj.geo.fs_id, geo.fs_id
                )));
            }
        }
        let holds = newest_slot_states(&*dev, &geo)?;
        // One decision of what the sweep keeps, for the cache and the sweep alike (a pin
        // expiring between two listings must not let the sweep delete what the cache was told
        // stays).
        let plan = plan_sweep(&*store, lease.now_secs())?;
        // The residency: a segment only an object the sweep is about to delete holds is
        // fetched back (or left as a hole if lld reads nothing of it) first.
        let (cache, dev) = match cache {
            None => (None, dev),
            Some(cfg) => {
                let c = Cache::open(
                    dev.clone(),
                    store.clone(),
                    geo,
                    cfg,
                    holds.as_deref(),
                    &plan.named(),
                )?;
                let d: Arc<dyn Device> = Arc::new(CacheDevice(c.clone()));
                (Some(c), d)
            }
        };
        let (kept, swept, sweep_deferred) = run_sweep(&*store, plan, true)?;
        if let Some(k) = kept.iter().find(|k| k.fs_id != geo.fs_id) {
            return Err(LayerError::Other(format!(
                "the store holds checkpoint object {} of file system {:016x}; this cache is of \
                 {:016x}",
                k.key, k.fs_id, geo.fs_id
            )));
        }
        let writer = lease.writer();
        if let Some(k) = kept.iter().find(|k| k.writer >= writer) {
            // Generations only grow; the lease objects were removed behind our back.
            return Err(LayerError::Other(format!(
                "lease generation {writer} is not above the writer of checkpoint object {}: \
                 the store's lease objects were removed",
                k.key
            )));
        }
        // What the store holds is its newest complete checkpoint (a stale writer's late one
        // may name objects the sweep deleted: nothing it names is taken as uploaded). It is
        // this cache's only if the cache holds its slot, byte for byte (review 32: a stale
        // writer's late checkpoint that landed after a taker rebuilt its cache from the one
        // before is complete, but of another branch: the sequence numbers after the
        // checkpoint both continued from are the same in both, so page 0 cannot tell).
        // Of the newest two: an older one kept for a reader's pin is not what the store holds.
        let newest = kept
            .iter()
            .filter(|k| !k.pinned_late)
            .rev()
            .take(2)
            .find(|k| k.complete);
        let held = newest.filter(|k| cache_holds_slot(&*dev, &geo, k.serial, &k.slot));
        let uploaded = held.map_or(0, |k| k.serial);
        let store_bytes = newest.map_or(0, |k| {
            k.entries
                .iter()
                .map(|e| e.pages as u64 * PAGE_BYTES as u64)
                .sum()
        });
        // A restart on the same cache: what the newest checkpoint object names and the cache
        // still holds in the same use of its segment (the sequence number at page 0 matches)
        // is not uploaded again. One page read per named segment.
        // Only a segment the cache's own newest durable checkpoint still
        // holds (Dirty or Active) can be the use that object holds (review
        // 26: one released since, Clean but not yet written over, kept its
        // page 0, and its new use was taken for the old object, which by
        // then was deleted).
        // Objects of a newest checkpoint the cache does not hold are only candidates
        // (`Known::verify`): taken once their crc is the cache segment's.
        let verify = held.is_none();
        let mut known = BTreeMap::new();
        if let Some(newest) = newest {
            let mut page = vec![0u8; PAGE_BYTES];
            for e in &newest.entries {
                let held = holds.as_ref().is_some_and(|st| {
                    matches!(
                        st.get(e.segment as usize),
                        Some(SegmentState::Dirty | SegmentState::Active)
                    )
                });
                if !held {
                    continue;
                }
                // An evicted segment is its object (no read: it would fetch it), also when the
                // newest checkpoint is not this cache's slot: the map's entry carries the crc
                // the uploader took of the very bytes it evicted (review 32's doubt is about
                // a segment the cache holds, whose use page 0 cannot tell).
                if cache
                    .as_ref()
                    .is_some_and(|c| c.evicted_entry(e.segment) == Some(*e))
                {
                    known.insert(
                        e.segment,
                        Known {
                            entry: *e,
                            read_gen: 0,
                            verify: false,
                        },
                    );
                    continue;
                }
                dev.read_at(&mut page, geo.page_addr(SegmentId(e.segment), 0))?;
                if first_seq_of(&geo, SegmentId(e.segment), &page).ok() == Some(e.first_seq) {
                    known.insert(
                        e.segment,
                        Known {
                            entry: *e,
                            read_gen: 0,
                            verify,
                        },
                    );
                }
            }
        }
        if let Some(c) = &cache {
            // What the newest complete checkpoint object names in full and the cache holds as
            // it: evictable from the start (a restart need not wait for its first upload).
            // Only when that checkpoint is this cache's (its slot held byte for byte): a
            // candidate (`verify`) may be another branch's bytes until the uploader compared
            // crcs, and evicting the cache's segment for it would lose the segment.
            let full: Vec<SegmentEntry> = known
                .values()
                .filter(|k| held.is_some() && !k.verify)
                .map(|k| k.entry)
                .filter(|e| {
                    e.pages == geo.segment_pages
                        && holds.as_ref().is_some_and(|st| {
                            st.get(e.segment as usize) == Some(&SegmentState::Dirty)
                        })
                })
                .collect();
            c.set_evictable(&full);
        }
        let named: Vec<(String, BTreeSet<String>)> = kept
            .into_iter()
            .map(|k| (k.key, k.entries.iter().map(|e| e.key()).collect()))
            .collect();
        let shared = Arc::new(Shared {
            written: std::sync::atomic::AtomicU64::new(0),
            store,
            lease,
            dev,
            cache,
            superblock,
            state: Mutex::new(State {
                release_gen: 0,
                released_at: vec![0; geo.segment_count as usize],
                job: None,
                left: std::collections::VecDeque::new(),
                left_pushed: 0,
                uploaded,
                announced: 0,
                failed: None,
                stop: false,
                held: false,
                backlog_waits_ended: false,
                stats: UploadStats {
                    objects_deleted: swept,
                    ..UploadStats::default()
                },
                uploaded_written: 0,
                uploaded_at: None,
                store_bytes,
                sweep_deferred,
                puts_before_sweep: 2,
            }),
            geo,
            cv: Condvar::new(),
            backoff: (opts.backoff_initial, opts.backoff_max),
        });
        let s2 = shared.clone();
        let thread = std::thread::Builder::new()
            .name("ldfs-uploader".into())
            .spawn(move || uploader(&s2, known, named))
            .expect("spawn uploader thread");
        Ok(SegmentStore {
            shared,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// The hook for `LldOptions::checkpoint_hook`.
    pub fn hook(&self) -> CheckpointHook {
        let shared = Arc::downgrade(&self.shared);
        CheckpointHook(Arc::new(move |c: &DurableCheckpoint<'_>| {
            let Some(sh) = shared.upgrade() else { return };
            let mut st = sh.state.lock().expect("uploader state poisoned");
            if let Some(cache) = &sh.cache {
                cache.note_released(c.released);
            }
            if !c.released.is_empty() {
                st.release_gen += 1;
                let g = st.release_gen;
                for s in c.released {
                    st.released_at[s.0 as usize] = g;
                }
            }
            // The segments left before the snapshot, which it names or releases; not those
            // left during its flushes (review 50 finding 3). lld counts its own reports: one
            // opened again on this layer counts from 0 again, which bounds lower, never past
            // the snapshot. A newer job replacing a waiting one keeps its bound: the puts
            // ahead stop where they would have for the first, so a write stream never holds
            // a checkpoint back.
            let left_before = match st.job.take() {
                Some(waiting) => {
                    st.stats.checkpoints_skipped += 1;
                    waiting.left_before
                }
                None => c.segments_told.min(st.left_pushed),
            };
            let gen = st.release_gen;
            st.announced = st.announced.max(c.serial);
            st.job = Some(Job {
                serial: c.serial,
                slot: c.slot_bytes.to_vec(),
                gen,
                written: sh.written.load(std::sync::atomic::Ordering::Relaxed),
                left_before,
            });
            sh.cv.notify_all();
        }))
    }

    /// The hook for `LldOptions::segment_hook`: a segment the log left is put as soon as the
    /// uploader is free, before the checkpoint that names it (issue 20: each full segment is
    /// uploaded as soon as it is sealed, so a long write uploads while it is written).
    pub fn segment_hook(&self) -> SegmentHook {
        let shared = Arc::downgrade(&self.shared);
        SegmentHook(Arc::new(move |seg: SegmentId| {
            let Some(sh) = shared.upgrade() else { return };
            // Never a panic on lld's writing threads (review 40 finding 1): a poisoned lock
            // (the uploader panicked under it) means no more puts ahead; the checkpoint job
            // path reports the uploader's end.
            let Ok(mut st) = sh.state.lock() else { return };
            if st.stop || st.failed.is_some() {
                return;
            }
            let gen = st.release_gen;
            st.left.push_back((seg, gen));
            st.left_pushed += 1;
            sh.cv.notify_all();
        }))
    }

    /// Puts and deletes wait until [`SegmentStore::release_uploads`]: a mount that may still
    /// be refused after lld's open (whose recovery checkpoint would otherwise go up under this
    /// writer) leaves the store as it found it, so the lease it gives back is as it found it
    /// too (review 41 finding 3). Call before lld's open.
    pub fn hold_uploads(&self) {
        self.shared.state.lock().unwrap().held = true;
    }

    /// Lets the uploader go on (see [`SegmentStore::hold_uploads`]).
    pub fn release_uploads(&self) {
        self.shared.state.lock().unwrap().held = false;
        self.shared.cv.notify_all();
    }

    /// The serial of the newest checkpoint object in the store.
    pub fn uploaded(&self) -> u64 {
        self.shared.state.lock().unwrap().uploaded
    }

    /// The cache device for lld: `dev` as given to `start`, counting the bytes written to it
    /// (the upload backlog).
    pub fn device(&self) -> Arc<dyn Device> {
        Arc::new(CountingDevice(self.shared.clone()))
    }

    /// Bytes written to the cache since the newest checkpoint this process uploaded was
    /// taken (everything since the start before the first): what a machine lost now loses,
    /// at most, and what the uploader has yet to catch up with.
    pub fn backlog_bytes(&self) -> u64 {
        let w = self
            .shared
            .written
            .load(std::sync::atomic::Ordering::Relaxed);
        w.saturating_sub(self.shared.state.lock().unwrap().uploaded_written)
    }

    /// The newest uploaded checkpoint's time (by this process; `None` before its first) and
    /// the bytes of the segment objects it names.
    pub fn uploaded_at(&self) -> (Option<std::time::SystemTime>, u64) {
        let st = self.shared.state.lock().unwrap();
        (st.uploaded_at, st.store_bytes)
    }

    /// Why the uploader stopped for good, if it did.
    pub fn failed(&self) -> Option<String> {
        self.shared.state.lock().unwrap().failed.clone()
    }

    /// Waits until the backlog is at most `bytes`, the uploader fails or is stopped, the
    /// backlog waits are ended ([`SegmentStore::end_backlog_waits`]), or `timeout` passes;
    /// returns whether the backlog is at most `bytes`.
    pub fn wait_backlog(&self, bytes: u64, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut st = self.shared.state.lock().unwrap();
        loop {
            let w = self
                .shared
                .written
                .load(std::sync::atomic::Ordering::Relaxed);
            if w.saturating_sub(st.uploaded_written) <= bytes {
                return true;
            }
            let now = Instant::now();
            if st.failed.is_some() || st.stop || st.backlog_waits_ended || now >= deadline {
                return false;
            }
            st = self.shared.cv.wait_timeout(st, deadline - now).unwrap().0;
        }
    }

    /// The mount is ending (an unmount or a signal began; the FUSE side says so before it
    /// joins its threads): [`SegmentStore::wait_backlog`] returns at once, for the waiters of
    /// now and of later, while the uploader goes on (the unmount still waits for the final
    /// checkpoint's upload). Without it a writer held by the backlog, with the store away,
    /// was let go only by [`SegmentStore::stop`], which the mount calls after its FUSE
    /// session, and the session's end joins that writer's thread (review 32 finding 7).
    pub fn end_backlog_waits(&self) {
        self.shared.state.lock().unwrap().backlog_waits_ended = true;
        self.shared.cv.notify_all();
    }

    /// Whether [`SegmentStore::end_backlog_waits`] was called.
    pub fn backlog_waits_ended(&self) -> bool {
        self.shared.state.lock().unwrap().backlog_waits_ended
    }

    /// The serial of the newest durable checkpoint lld announced.
    pub fn announced(&self) -> u64 {
        self.shared.state.lock().unwrap().announced
    }

    pub fn stats(&self) -> UploadStats {
        self.shared.state.lock().unwrap().stats
    }

    /// Waits until checkpoint `serial` (or a newer one) is in the store; an error if the
    /// uploader stopped on a final error, or `timeout` passed.
    pub fn wait_uploaded(&self, serial: u64, timeout: Duration) -> LayerResult<()> {
        let deadline = Instant::now() + timeout;
        let mut st = self.shared.state.lock().unwrap();
        loop {
            if st.uploaded >= serial {
                return Ok(());
            }
            if let Some(why) = &st.failed {
                return Err(LayerError::Other(format!("uploader stopped: {why}")));
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(LayerError::Other(format!(
                    "checkpoint {serial} not uploaded after {timeout:?} (newest in the store: {})",
                    st.uploaded
                )));
            }
            st = self.shared.cv.wait_timeout(st, deadline - now).unwrap().0;
        }
    }

    /// Stops the uploader (what it has not uploaded stays in the cache for the next start)
    /// and the cache's eviction (reads still fetch what the cache lacks).
    pub fn stop(&self) {
        self.shared.state.lock().unwrap().stop = true;
        self.shared.cv.notify_all();
        let t = self.thread.lock().unwrap().take();
        if let Some(t) = t {
            let _ = t.join();
        }
        if let Some(c) = &self.shared.cache {
            // What the last upload made evictable goes now: the cache is left within its
            // bound.
            if let Err(e) = c.shrink() {
                eprintln!("ldfs: evicting from the cache: {e}");
            }
            c.stop();
        }
    }

    /// Evicts now until the cache is within its bound (what the eviction thread does when
    /// woken); nothing without a cache.
    pub fn shrink_cache(&self) -> LayerResult<()> {
        match &self.shared.cache {
            Some(c) => c.shrink(),
            None => Ok(()),
        }
    }

    /// The entry of a segment the cache evicted (its bytes are in the store only).
    pub fn evicted_entry(&self, segment: u32) -> Option<SegmentEntry> {
        self.shared.cache.as_ref()?.evicted_entry(segment)
    }

    /// The cache's figures, if the layer keeps its residency.
    pub fn cache_stats(&self) -> Option<CacheStats> {
        self.shared.cache.as_ref().map(|c| c.stats())
    }

    /// Whether [`SegmentStore::stop`] was called: nothing more is uploaded.
    pub fn is_stopped(&self) -> bool {
        self.shared.state.lock().unwrap().stop
    }

    /// The lease this layer writes under.
    pub fn lease(&self) -> &Arc<HeldLease> {
        &self.shared.lease
    }
}

impl Drop for SegmentStore {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The cache device as lld sees it through the layer: every write counted.
struct CountingDevice(Arc<Shared>);

impl Device for CountingDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), DeviceError> {
        self.0.dev.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), DeviceError> {
        self.0.dev.write_at(buf, offset)?;
        self.0
            .written
            .fetch_add(buf.len() as u64, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }
    fn flush(&self) -> Result<(), DeviceError> {
        self.0.dev.flush()
    }
    fn size_bytes(&self) -> u64 {
        self.0.dev.size_bytes()
    }
    fn will_need(&self, ranges: &[(u64, u64)]) {
        self.0.dev.will_need(ranges)
    }
    fn write_unit_bytes(&self) -> u64 {
        self.0.dev.write_unit_bytes()
    }
    fn discard(&self, offset: u64, len: u64) -> Result<bool, DeviceError> {
        self.0.dev.discard(offset, len)
    }
    // Not `resize`: the default (the size is not ldfs's to set) keeps a store-backed file
    // system at the size its cache was made with.
}

/// The newest checkpoint object in the store, decoded (its key first), or `None` if the store
/// holds none: what a mount checks its cache against and sizes a fresh cache by.
pub fn newest_checkpoint(
    store: &dyn ObjectStore,
) -> LayerResult<Option<(String, CheckpointObject)>> {
    let Some(key) = newest_checkpoint_key(store)? else {
        return Ok(None);
    };
    let obj = decode_checkpoint_object(&key, &store.get(&key)?)?;
    Ok(Some((key, obj)))
}

/// The key of the newest checkpoint object in the store (one listing, nothing read), or
/// `None` if it holds none: what a read-only mount compares with the checkpoint it shows.
pub fn newest_checkpoint_key(store: &dyn ObjectStore) -> Result<Option<String>, StoreError> {
    Ok(store
        .list("ckpt/")?
        .into_iter()
        .rev()
        .find(|o| parse_checkpoint_key(&o.key).is_some())
        .map(|o| o.key))
}

/// The newest checkpoint object whose every named segment object is in the store, decoded
/// (its key first); `None` if there is none. What a rebuild restores: a stale writer's
/// checkpoint put that landed after the next writer's start swept the segment objects it
/// names sorts newest but names objects that are gone (review 31); the complete one before
/// it is the file system.
pub fn newest_complete_checkpoint(
    store: &dyn ObjectStore,
) -> LayerResult<Option<(String, CheckpointObject)>> {
    // Checkpoint objects listed before segment objects: a writer uploading meanwhile puts
    // a checkpoint only after its segments, so a listed checkpoint's segments are listed
    // unless deleted since, by two later uploads; then every listed one may look incomplete
    // (review 32), and the listing is taken again.
    for _ in 0..5 {
        let listed = store.list("ckpt/")?;
        let segments: BTreeSet<String> = store.list("seg/")?.into_iter().map(|o| o.key).collect();
        for o in listed.iter().rev() {
            if parse_checkpoint_key(&o.key).is_none() {
                continue;
            }
            let bytes = match store.get(&o.key) {
                Ok(b) => b,
                // Deleted since the listing: a newer one was put.
                Err(StoreError::NotFound { .. }) => continue,
                Err(e) => return Err(e.into()),
            };
            let obj = decode_checkpoint_object(&o.key, &bytes)?;
            if obj.entries.iter().all(|e| segments.contains(&e.key())) {
                return Ok(Some((o.key.clone(), obj)));
            }
        }
    }
    Ok(None)
}

/// Deletes what no kept checkpoint object (the newest two, and any a live reader's pin names)
/// names, and pins expired by this host's clock: objects of uploads a stopped or crashed
/// writer never finished, and puts that landed after their key was deleted (a request the
/// client gave up on may still arrive). One writer at a time (the lease), so nothing else is
/// putting meanwhile. Returns the newest checkpoint serial in the store and how many objects
/// were deleted.
///
/// Everything goes at once: sound only when no stale writer's checkpoint put can still land
/// (tests, after the stale writer is gone). A writer's start does not call this: it defers the
/// segment objects no kept checkpoint names to its second upload (`run_sweep`, review 43
/// finding 1), for a late checkpoint a reader pins may name them (review 44 finding C).
pub fn sweep(store: &dyn ObjectStore) -> LayerResult<(u64, u64)> {
    let (kept, deleted) = sweep_kept(store)?;
    Ok((kept.last().map_or(0, |k| k.serial), deleted))
}

/// A kept checkpoint object.
struct KeptCheckpoint {
    key: String,
    writer: u64,
    serial: u64,
    fs_id: u64,
    entries: Vec<SegmentEntry>,
    /// The checkpoint slot it holds.
    slot: Vec<u8>,
    /// Every segment object it names is in the store (see [`newest_complete_checkpoint`]).
    complete: bool,
    /// Kept only for a reader's pin, found after the listing the start decided on: never what
    /// the store holds for this writer's start.
    pinned_late: bool,
}

impl KeptCheckpoint {
    fn of(
        key: String,
        writer: u64,
        serial: u64,
        obj: CheckpointObject,
        pinned_late: bool,
    ) -> KeptCheckpoint {
        KeptCheckpoint {
            key,
            writer,
            serial,
            fs_id: obj.geo.fs_id,
            entries: obj.entries,
            slot: obj.slot,
            complete: false,
            pinned_late,
        }
    }
}

/// The kept checkpoint objects, oldest first.
type Kept = Vec<KeptCheckpoint>;

/// What a sweep keeps and deletes, decided from one listing of the checkpoint objects and,
/// after it, of the readers' pins (`store::readers`): the newest two checkpoint objects and any
/// a live pin names are kept, with what they name.
struct SweepPlan {
    /// Decoded, oldest first (`complete` is found by [`run_sweep`]).
    kept: Kept,
    /// Checkpoint objects to delete, oldest first.
    doomed: Vec<String>,
    /// Pins expired by this host's clock.
    expired_pins: Vec<String>,
}

impl SweepPlan {
    /// The keys of the segment objects the kept checkpoint objects name.
    fn named(&self) -> BTreeSet<String> {
        self.kept
            .iter()
            .flat_map(|k| k.entries.iter().map(|e| e.key()))
            .collect()
    }
}

/// `now_secs`: the sweeping writer's clock (its lease's), for the pins' expiry.
fn plan_sweep(store: &dyn ObjectStore, now_secs: u64) -> LayerResult<SweepPlan> {
    // Only checkpoint keys count towards the newest two: an object of another kind under
    // `ckpt/` (review 31) is left alone, and never pushes a checkpoint out.
    let ckpts: Vec<(String, u64, u64)> = store
        .list("ckpt/")?
        .into_iter()
        .filter_map(|o| parse_checkpoint_key(&o.key).map(|(w, s)| (o.key, w, s)))
        .collect();
    // Listed after the checkpoints: a reader whose pin this misses checks, after its pin, that
    // its checkpoint is among the newest two this listing saw, so none that is doomed here.
    let pins = super::readers::pins(store, now_secs)?;
    let keys: Vec<String> = ckpts.iter().map(|c| c.0.clone()).collect();
    let keep = super::readers::retained(&keys, &pins);
    let mut kept = Vec::new();
    let mut doomed = Vec::new();
    for (key, writer, serial) in ckpts {
        if !keep.contains(&key) {
            doomed.push(key);
            continue;
        }
        let obj = decode_checkpoint_object(&key, &store.get(&key)?)?;
        kept.push(KeptCheckpoint::of(key, writer, serial, obj, false));
    }
    // A pinned checkpoint object put after the listing above (a stale writer's late put, a
    // reader pinning it before the pins were listed): kept with what it names (review 42
    // finding 1: its objects were swept).
    for (key, obj) in super::readers::pinned_unknown(store, &pins, |k| keys.iter().any(|x| x == k))?
    {
        let (writer, serial) = parse_checkpoint_key(&key).expect("pinned_unknown parsed it");
        kept.push(KeptCheckpoint::of(key, writer, serial, obj, true));
    }
    kept.sort_by(|a, b| a.key.cmp(&b.key));
    Ok(SweepPlan {
        kept,
        doomed,
        expired_pins: pins.expired,
    })
}

/// Carries out `plan`: returns the kept checkpoint objects and how many objects it deleted.
/// `defer`: segment objects no kept checkpoint object names are returned, not deleted (a
/// writer's start: see [`State::sweep_deferred`]).
fn run_sweep(
    store: &dyn ObjectStore,
    plan: SweepPlan,
    defer: bool,
) -> LayerResult<(Kept, u64, Vec<String>)> {
    let mut deleted = 0;
    for k in plan.doomed.iter().chain(&plan.expired_pins) {
        store.delete(k)?;
        deleted += 1;
    }
    let named = plan.named();
    let mut kept = plan.kept;
    let mut present = BTreeSet::new();
    let mut deferred = Vec::new();
    for o in store.list("seg/")? {
        if named.contains(&o.key) {
            present.insert(o.key);
        } else if defer {
            deferred.push(o.key);
        } else {
            store.delete(&o.key)?;
            deleted += 1;
        }
    }
    for k in &mut kept {
        k.complete = k.entries.iter().all(|e| present.contains(&e.key()));
    }
    Ok((kept, deleted, deferred))
}

/// `sweep`, returning the kept checkpoint objects and how many objects it deleted.
fn sweep_kept(store: &dyn ObjectStore) -> LayerResult<(Kept, u64)> {
    let (kept, deleted, _) = run_sweep(
        store,
        plan_sweep(store, (super::lease::system_clock())())?,
        false,
    )?;
    Ok((kept, deleted))
}

enum Outcome {
    Done,
    /// A segment was released while it was read: a newer job exists.
    Skipped,
    Stopped,
}

/// What the uploader does next.
enum Work {
    /// A durable checkpoint: put what it names that the store lacks, then its object.
    Job(Job),
    /// Segments the log left: put them ahead of the checkpoint that will name them.
    Ahead,
}

/// `known`: the segment objects in the store the cache still matches; `named`: what the kept
/// (newest two) checkpoint objects name, oldest first. `ahead` (starts empty): segment objects
/// put as the log left their segments, which no checkpoint object names yet.
fn uploader(
    sh: &Shared,
    mut known: BTreeMap<u32, Known>,
    mut named: Vec<(String, BTreeSet<String>)>,
) {
    let mut ahead: BTreeMap<u32, Known> = BTreeMap::new();
    loop {
        let work = {
            let mut st = sh.state.lock().unwrap();
            loop {
                if st.stop {
                    return;
                }
                // A checkpoint first: it is what a lost machine comes back to.
                if !st.held {
                    if let Some(j) = st.job.take() {
                        break Work::Job(j);
                    }
                    if !st.left.is_empty() {
                        break Work::Ahead;
                    }
                }
                st = sh.cv.wait(st).unwrap();
            }
        };
        // A panic in one upload ends the uploader like an error does,
        // saying so, rather than leaving `wait_uploaded` to time out.
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match &work {
            Work::Job(job) => upload(sh, job, &mut known, &mut ahead, &mut named),
            Work::Ahead => put_ahead(sh, &known, &mut ahead, &named),
        }))
        .unwrap_or_else(|_| Err(LayerError::Other("the uploader panicked".into())));
        match r {
            // Counted as uploaded when its checkpoint object was acknowledged (`upload`).
            Ok(Outcome::Done) => {}
            Ok(Outcome::Skipped) => {
                sh.state.lock().unwrap().stats.checkpoints_skipped += 1;
            }
            Ok(Outcome::Stopped) => return,
            Err(e) => {
                eprintln!(
                    "ldfs: uploads to the store stopped (writer {}): {e}",
                    sh.lease.writer()
                );
                let mut st = sh.state.lock().unwrap_or_else(|p| p.into_inner());
                st.failed = Some(e.to_string());
                sh.cv.notify_all();
                return;
            }
        }
    }
}

/// Runs `f` until it succeeds, fails for good, or the uploader is stopped (`None`).
fn retry<T>(sh: &Shared, mut f: impl FnMut() -> StoreResult<T>) -> LayerResult<Option<T>> {
    let mut wait = sh.backoff.0;
    loop {
        match f() {
            Ok(v) => return Ok(Some(v)),
            Err(e) if e.is_transient() => {
                let mut st = sh.state.lock().unwrap();
                st.stats.retries += 1;
                if st.stop {
                    return Ok(None);
                }
                st = sh.cv.wait_timeout(st, wait).unwrap().0;
                if st.stop {
                    return Ok(None);
                }
                wait = (wait * 2).min(sh.backoff.1);
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// `retry` for a request that may harm another writer if it lands after this one lost the
/// lease (a checkpoint put, a delete): each attempt only while [`HeldLease::check`] passes;
/// while the lease is late in renewing, wait as for a transient failure; lost, stop for good.
fn retry_fenced<T>(sh: &Shared, mut f: impl FnMut() -> StoreResult<T>) -> LayerResult<Option<T>> {
    let mut wait = sh.backoff.0;
    loop {
        match sh.lease.check() {
            Ok(()) => {}
            Err(e @ LeaseCheck::Lost(_)) => return Err(e.into()),
            Err(LeaseCheck::Expiring { .. }) => {
                let mut st = sh.state.lock().unwrap();
                st.stats.lease_waits += 1;
                if st.stop {
                    return Ok(None);
                }
                st = sh.cv.wait_timeout(st, wait).unwrap().0;
                if st.stop {
                    return Ok(None);
                }
                wait = (wait * 2).min(sh.backoff.1);
                continue;
            }
        }
        match f() {
            Ok(v) => return Ok(Some(v)),
            Err(e) if e.is_transient() => {
                let mut st = sh.state.lock().unwrap();
                st.stats.retries += 1;
                if st.stop {
                    return Ok(None);
                }
                st = sh.cv.wait_timeout(st, wait).unwrap().0;
                if st.stop {
                    return Ok(None);
                }
                wait = (wait * 2).min(sh.backoff.1);
            }
            Err(e) => return Err(e.into()),
        }
    }
}

fn upload(
    sh: &Shared,
    job: &Job,
    known: &mut BTreeMap<u32, Known>,
    ahead: &mut BTreeMap<u32, Known>,
    named: &mut Vec<(String, BTreeSet<String>)>,
) -> LayerResult<Outcome> {
    let geo = &sh.geo;
    let (hdr, usage) = checkpoint::decode(geo, &job.slot, 0).map_err(|e| LayerError::Corrupt {
        what: "durable slot",
        key: job.serial.to_string(),
        detail: e.to_string(),
    })?;
    assert_eq!(hdr.serial, job.serial, "hook gave a slot of another serial");
    // What the store lacks is put (several at once), the rest is known to be there.
    let mut entries: Vec<Option<SegmentEntry>> = Vec::new();
    let mut todo = Vec::new();
    // Segment objects put ahead that this checkpoint names: known from now on.
    let mut taken = Vec::new();
    // Per entry: named in full (Dirty), never the Active one: what the cache may evict once
    // this checkpoint object is in the store.
    let mut whole = Vec::new();
    for (seg, u) in usage.iter() {
        let pages = match u.state {
            SegmentState::Dirty if u.live_bytes > 0 || u.pins != 0 => geo.segment_pages,
            SegmentState::Active if seg.0 == hdr.log_segment && hdr.log_page > 0 => hdr.log_page,
            _ => continue,
        };
        let released_at = {
            let st = sh.state.lock().unwrap();
            // Stopped (the unmount's wait is over): no more puts (review 32).
            if st.stop {
                return Ok(Outcome::Stopped);
            }
            st.released_at[seg.0 as usize]
        };
        if released_at > job.gen {
            return Ok(Outcome::Skipped);
        }
        if let Some(k) = known.get(&seg.0) {
            if !k.verify && k.entry.pages == pages && released_at <= k.read_gen {
                entries.push(Some(k.entry));
                whole.push(u.state == SegmentState::Dirty);
                continue;
            }
        }
        // Put as the log left it, and not released since: the same use, whose bytes a
        // Dirty segment keeps until a release (`SegmentHook`).
        if let Some(a) = ahead.get(&seg.0) {
            if a.entry.pages == pages && released_at <= a.read_gen {
                taken.push(*a);
                entries.push(Some(a.entry));
                whole.push(u.state == SegmentState::Dirty);
                continue;
            }
        }
        todo.push(ToPut {
            slot: entries.len(),
            seg,
            pages,
            gen: job.gen,
            candidate: known.get(&seg.0).map(|k| k.entry),
        });
        entries.push(None);
        whole.push(u.state == SegmentState::Dirty);
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let feed = || {
        todo.get(next.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
            .copied()
    };
    let workers = puts_in_flight(geo.segment_bytes()).min(todo.len());
    let (done, end) = put_segments(sh, &feed, workers, None);
    // What was acknowledged is in the store, whatever became of the job.
    let mut acknowledged: Vec<(SegmentEntry, u64)> =
        taken.iter().map(|a| (a.entry, a.read_gen)).collect();
    for (t, entry) in done {
        entries[t.slot] = Some(entry);
        acknowledged.push((entry, job.gen));
    }
    for (entry, read_gen) in acknowledged {
        if ahead.get(&entry.segment).is_some_and(|a| a.entry == entry) {
            ahead.remove(&entry.segment);
        }
        if let Some(old) = known.insert(
            entry.segment,
            Known {
                entry,
                read_gen,
                verify: false,
            },
        ) {
            // Superseded (a longer prefix, or a new use): deletable once no kept checkpoint
            // object names it.
            if old.entry != entry {
                orphan(sh, old.entry.key(), named)?;
            }
        }
    }
    match end? {
        Worker::Finished => {}
        Worker::Skipped => return Ok(Outcome::Skipped),
        Worker::Stopped => return Ok(Outcome::Stopped),
    }
    // Every worker finished: each segment was put or known.
    let entries: Vec<SegmentEntry> = entries
        .into_iter()
        .map(|e| e.expect("a segment neither known nor put"))
        .collect();
    let writer = sh.lease.writer();
    let object =
        encode_checkpoint_object(geo, &sh.superblock, writer, job.serial, &job.slot, &entries);
    let key = checkpoint_key(writer, job.serial);
    match retry_fenced(sh, || sh.store.put_if_absent(&key, &object))? {
        None => return Ok(Outcome::Stopped),
        Some(PutOutcome::Created) => {}
        Some(PutOutcome::Exists) => {
            // Ours, if an earlier try landed and its answer was lost.
            let there = retry(sh, || sh.store.get(&key))?;
            match there {
                None => return Ok(Outcome::Stopped),
                Some(b) if b == object => {}
                Some(_) => return Err(LayerError::Conflict { key }),
            }
        }
    }
    named.push((key, entries.iter().map(|e| e.key()).collect()));
    // In the store from now on, whatever becomes of the deletes behind it (review 33: a
    // delete failing, the lease lost or a stop there left it uncounted, and an unmount said
    // its final checkpoint was not in the store and kept the lease).
    {
        let mut st = sh.state.lock().unwrap();
        if let Some(cache) = &sh.cache {
            // Evictable from its acknowledgement on: the objects it names stay until a later
            // checkpoint supersedes them, and each delete settles an evicted segment first
            // (`orphan`). Under the state lock, so that no release slips between the check
            // and the set.
            let full: Vec<SegmentEntry> = entries
                .iter()
                .zip(&whole)
                .filter(|(e, &w)| w && st.released_at[e.segment as usize] <= job.gen)
                .map(|(e, _)| *e)
                .collect();
            cache.set_evictable(&full);
        }
        st.store_bytes = entries
            .iter()
            .map(|e| e.pages as u64 * PAGE_BYTES as u64)
            .sum();
        st.uploaded = st.uploaded.max(job.serial);
        st.uploaded_written = st.uploaded_written.max(job.written);
        st.uploaded_at = Some(std::time::SystemTime::now());
        st.stats.checkpoints_put += 1;
        sh.cv.notify_all();
    }
    // Put for a use that ended (the segment was released since) and that neither kept
    // checkpoint object names: put ahead and never named, or put or taken by a job abandoned
    // for a newer one (review 39 finding 2). No checkpoint object will name it; what a kept
    // one names goes when that one is deleted, below.
    let is_named = |k: &String| named.iter().any(|(_, keys)| keys.contains(k));
    let gone: Vec<SegmentEntry> = {
        let st = sh.state.lock().unwrap();
        ahead
            .values()
            .chain(known.values())
            .filter(|a| st.released_at[a.entry.segment as usize] > a.read_gen)
            .map(|a| a.entry)
            .filter(|e| !is_named(&e.key()))
            .collect()
    };
    for e in &gone {
        if ahead.get(&e.segment).is_some_and(|a| a.entry == *e) {
            ahead.remove(&e.segment);
        }
        if known.get(&e.segment).is_some_and(|k| k.entry == *e) {
            known.remove(&e.segment);
        }
    }
    let mut deletes: Vec<String> = gone.iter().map(|e| e.key()).collect();
    // Keep the newest two checkpoint objects, any a reader's pin names, and what they name.
    // The pins are listed after this checkpoint's put (`store::readers`): a reader that pinned
    // an older one after this listing found it no longer among the newest two, and chose again.
    let mut old_checkpoints = Vec::new();
    let mut late_sweep = {
        let mut st = sh.state.lock().unwrap();
        st.puts_before_sweep = st.puts_before_sweep.saturating_sub(1);
        match st.puts_before_sweep {
            0 => std::mem::take(&mut st.sweep_deferred),
            _ => Vec::new(),
        }
    };
    if named.len() > 2 || !late_sweep.is_empty() {
        let now = sh.lease.now_secs();
        let Some(pins) = retry(sh, || super::readers::pins(&*sh.store, now))? else {
            return Ok(Outcome::Stopped);
        };
        // A pinned checkpoint this writer never listed (a stale writer's late put, which sorts
        // among the newest two until this writer's second upload) is kept as if it had
        // (review 42 finding 1: its objects went with the older checkpoints it shares them
        // with).
        let Some(late) = retry(sh, || {
            super::readers::pinned_unknown(&*sh.store, &pins, |k| named.iter().any(|n| n.0 == k))
        })?
        else {
            return Ok(Outcome::Stopped);
        };
        for (key, obj) in late {
            named.push((key, obj.entries.iter().map(|e| e.key()).collect()));
        }
        named.sort_by(|a, b| a.0.cmp(&b.0));
        let keys: Vec<String> = named.iter().map(|n| n.0.clone()).collect();
        let keep = super::readers::retained(&keys, &pins);
        named.retain(|(ck, old_keys)| {
            if keep.contains(ck) {
                return true;
            }
            deletes.extend(old_keys.iter().cloned());
            old_checkpoints.push(ck.clone());
            false
        });
        // Expired by this writer's clock, they pin nothing: deleted with the rest (a crashed
        // reader's pin was otherwise read at every upload until the next start's sweep).
        deletes.extend(pins.expired);
        if pins.unreadable.is_empty() {
            // What the start's sweep deferred, less what a pinned checkpoint names (below).
            deletes.append(&mut late_sweep);
        }
    }
    if !late_sweep.is_empty() {
        // A pin it may not read names any checkpoint: kept for a later round.
        sh.state.lock().unwrap().sweep_deferred = late_sweep;
    }
    deletes.sort();
    deletes.dedup();
    deletes.retain(|k| !named.iter().any(|(_, keys)| keys.contains(k)));
    let (deleted, end) = delete_objects(sh, &deletes);
    // Gone from the store: no later checkpoint object may name it as uploaded (review 26).
    known.retain(|_, kn| !deleted.contains(&kn.entry.key()));
    if !end? {
        return Ok(Outcome::Stopped);
    }
    // A checkpoint object after what it named: a crash between leaves objects the next
    // start's sweep removes, never a kept checkpoint naming a deleted object.
    let (_, end) = delete_objects(sh, &old_checkpoints);
    if !end? {
        return Ok(Outcome::Stopped);
    }
    Ok(Outcome::Done)
}

/// Puts the segments the log left (`State::left`), [`puts_in_flight`] at once, until none is
/// left, a checkpoint job waits or the uploader stops: each is read whole and put under its
/// own key, which no checkpoint object names yet (`ahead`), unless the store has its bytes
/// already. A segment released after it was left (a checkpoint since freed it) is passed
/// over, as is one released while it was read.
fn put_ahead(
    sh: &Shared,
    known: &BTreeMap<u32, Known>,
    ahead: &mut BTreeMap<u32, Known>,
    named: &[(String, BTreeSet<String>)],
) -> LayerResult<Outcome> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let full = sh.geo.segment_pages;
    // Workers with a segment in hand.
    let busy = AtomicUsize::new(0);
    let (done, end) = {
        let ahead = &*ahead;
        let feed = || {
            let mut st = sh.state.lock().unwrap();
            let linger_end = Instant::now() + AHEAD_LINGER;
            loop {
                if st.stop {
                    return None;
                }
                // A checkpoint waits for the puts of the segments the log left before it,
                // which it names: the workers go on with them rather than end one by one
                // while the job waits for the last, then start again for the job (measured:
                // about 50 ms of fewer puts in flight per checkpoint in a stream).
                let popped = st.left_pushed - st.left.len() as u64;
                if st.job.as_ref().is_some_and(|j| popped >= j.left_before) {
                    return None;
                }
                let Some((seg, gen)) = st.left.pop_front() else {
                    // A long write leaves a segment every few milliseconds: a worker that
                    // ended at an empty queue while others were putting left fewer puts in
                    // flight for the rest of the stream (review 39 finding 4). So an idle
                    // worker ends only once every worker is idle and the linger is over.
                    let now = Instant::now();
                    if now >= linger_end && busy.load(Ordering::SeqCst) == 0 {
                        return None;
                    }
                    let wait = linger_end
                        .saturating_duration_since(now)
                        .max(Duration::from_millis(10));
                    st = sh.cv.wait_timeout(st, wait).unwrap().0;
                    continue;
                };
                let released_at = st.released_at[seg.0 as usize];
                if released_at > gen {
                    continue;
                }
                // Put already (a checkpoint job took it while it was queued, or an earlier
                // report): the object holding this use is there, so the segment is not read
                // again (review 39 finding 1). No release since that read: the same use.
                let current =
                    |k: &Known| !k.verify && k.entry.pages == full && released_at <= k.read_gen;
                if known.get(&seg.0).is_some_and(current) || ahead.get(&seg.0).is_some_and(current)
                {
                    continue;
                }
                let candidate = ahead.get(&seg.0).or_else(|| known.get(&seg.0));
                return Some(ToPut {
                    slot: 0,
                    seg,
                    pages: full,
                    gen,
                    candidate: candidate.map(|k| k.entry),
                });
            }
        };
        put_segments(
            sh,
            &feed,
            puts_in_flight(sh.geo.segment_bytes()),
            Some(&busy),
        )
    };
    for (t, entry) in done {
        if known.get(&entry.segment).is_some_and(|k| k.entry == entry) {
            continue;
        }
        let new = Known {
            entry,
            read_gen: t.gen,
            verify: false,
        };
        if let Some(old) = ahead.insert(entry.segment, new) {
            // An earlier use, which no checkpoint object named.
            if old.entry != entry {
                orphan(sh, old.entry.key(), named)?;
            }
        }
    }
    match end? {
        Worker::Stopped => Ok(Outcome::Stopped),
        Worker::Finished | Worker::Skipped => Ok(Outcome::Done),
    }
}

/// Runs `work` on `workers` threads named `name` (scoped: they borrow the caller's state) and
/// returns what each did and how it ended; one that panicked did nothing and failed, saying so.
#[allow(clippy::type_complexity)]
fn on_threads<T: Send, W: Send>(
    name: &str,
    workers: usize,
    work: &(dyn Fn() -> (Vec<T>, LayerResult<W>) + Sync),
) -> Vec<(Vec<T>, LayerResult<W>)> {
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..workers)
            .map(|_| {
                std::thread::Builder::new()
                    .name(name.into())
                    .spawn_scoped(s, work)
                    .unwrap_or_else(|e| panic!("spawn a {name} thread: {e}"))
            })
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    (
                        Vec::new(),
                        Err(LayerError::Other(format!("a {name} thread panicked"))),
                    )
                })
            })
            .collect()
    })
}

/// Deletes `keys` (fenced), [`UPLOAD_PUTS_IN_FLIGHT`] at once: a delete is one short request,
/// all latency, and an upload after a large removal has many (each settled with the cache
/// first: `orphan`). Returns the keys deleted, and `Ok(false)` if the uploader was stopped.
fn delete_objects(sh: &Shared, keys: &[String]) -> (Vec<String>, LayerResult<bool>) {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let next = AtomicUsize::new(0);
    let halt = AtomicBool::new(false);
    let work = || -> (Vec<String>, LayerResult<bool>) {
        let mut deleted = Vec::new();
        loop {
            if halt.load(Ordering::Relaxed) {
                return (deleted, Ok(true));
            }
            let Some(key) = keys.get(next.fetch_add(1, Ordering::Relaxed)) else {
                return (deleted, Ok(true));
            };
            let r = (|| {
                if let Some(cache) = &sh.cache {
                    // A segment the cache evicted may hold nothing but this object.
                    cache.before_delete(key)?;
                }
                retry_fenced(sh, || sh.store.delete(key))
            })();
            match r {
                Ok(Some(())) => {
                    sh.state.lock().unwrap().stats.objects_deleted += 1;
                    deleted.push(key.clone());
                }
                Ok(None) => {
                    halt.store(true, Ordering::Relaxed);
                    return (deleted, Ok(false));
                }
                Err(e) => {
                    halt.store(true, Ordering::Relaxed);
                    return (deleted, Err(e));
                }
            }
        }
    };
    let workers = UPLOAD_PUTS_IN_FLIGHT.min(keys.len());
    if workers <= 1 {
        return work();
    }
    let ends = on_threads("ldfs-upload-del", workers, &work);
    let mut all = Vec::new();
    let mut outcome = Ok(true);
    for (done, end) in ends {
        all.extend(done);
        outcome = match (outcome, end) {
            (Err(e), _) | (_, Err(e)) => Err(e),
            (Ok(a), Ok(b)) => Ok(a && b),
        };
    }
    (all, outcome)
}

/// How many segment objects of `segment_bytes` the uploader puts at once: a PUT's time on a
/// gateway is mostly its latency (the request's round trips, the gateway's write to its OSDs)
/// rather than the bytes, so several in flight keep the link busy, as S3 clients do with
/// multipart parts (measured by `ldfs bench fs`, DESIGN "Upload throughput"). At most
/// [`UPLOAD_PUTS_IN_FLIGHT`], and at most 32 MiB of segments held in memory at once.
pub fn puts_in_flight(segment_bytes: u64) -> usize {
    ((32u64 << 20) / segment_bytes.max(1)).clamp(1, UPLOAD_PUTS_IN_FLIGHT as u64) as usize
}

/// How long a worker putting segments ahead waits for the log to leave another before it ends
/// (a checkpoint job or a stop ends the wait at once).
const AHEAD_LINGER: Duration = Duration::from_millis(100);

/// One segment object to put: where its entry goes (a job's), the segment, its length.
#[derive(Clone, Copy)]
struct ToPut {
    slot: usize,
    seg: SegmentId,
    pages: u32,
    /// `State::release_gen` when the segment's bytes were known final (the job's hook, or the
    /// log leaving it): a release after it means they may have changed.
    gen: u64,
    /// An object in the store this segment may already be (review 32): taken instead of a
    /// put if its length, use and crc are the cache segment's, whoever put it.
    candidate: Option<SegmentEntry>,
}

/// How a put worker ended.
enum Worker {
    Finished,
    Skipped,
    Stopped,
}

/// Reads each segment `feed` gives from the cache and puts it, `workers` at once; every object
/// acknowledged is returned with what was put (also when the work ends early: what is in the
/// store is known), and how it ended. For a job (`busy` none), a release seen around a read
/// abandons it (the newer one that released the segment has it), as in the one-at-a-time loop
/// this replaced; ahead of a checkpoint (`busy` counts the workers with a segment in hand, for
/// the feed), only that segment is passed over.
fn put_segments(
    sh: &Shared,
    feed: &(dyn Fn() -> Option<ToPut> + Sync),
    workers: usize,
    busy: Option<&std::sync::atomic::AtomicUsize>,
) -> (Vec<(ToPut, SegmentEntry)>, LayerResult<Worker>) {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let ahead = busy.is_some();
    /// Counts a worker busy while it lives (a panic included: the others' wait ends).
    struct Busy<'a>(Option<&'a AtomicUsize>);
    impl Drop for Busy<'_> {
        fn drop(&mut self) {
            if let Some(b) = self.0 {
                b.fetch_sub(1, Ordering::SeqCst);
            }
        }
    }
    let geo = &sh.geo;
    // Set when a worker ends early: the others take no new segment.
    let halt = AtomicBool::new(false);
    let work = || -> (Vec<(ToPut, SegmentEntry)>, LayerResult<Worker>) {
        let mut done = Vec::new();
        let mut bytes = vec![0u8; geo.segment_pages as usize * PAGE_BYTES];
        let mut one = |t: ToPut| -> LayerResult<Option<Worker>> {
            let bytes = &mut bytes[..t.pages as usize * PAGE_BYTES];
            sh.dev.read_at(bytes, geo.page_addr(t.seg, 0))?;
            // Released (and maybe rewritten) while we read: these bytes may be a mix.
            if sh.state.lock().unwrap().released_at[t.seg.0 as usize] > t.gen {
                return Ok((!ahead).then_some(Worker::Skipped));
            }
            let (first_seq, crc) = (first_seq_of(geo, t.seg, bytes)?, crc32c::crc32c(bytes));
            if let Some(c) = t
                .candidate
                .filter(|c| c.pages == t.pages && c.first_seq == first_seq && c.crc == crc)
            {
                done.push((t, c));
                return Ok(None);
            }
            let entry = SegmentEntry {
                segment: t.seg.0,
                pages: t.pages,
                first_seq,
                writer: sh.lease.writer(),
                crc,
            };
            // Stopped (the unmount's wait is over): no more puts (review 32).
            if sh.state.lock().unwrap().stop {
                return Ok(Some(Worker::Stopped));
            }
            let key = entry.key();
            if retry(sh, || sh.store.put(&key, bytes))?.is_none() {
                return Ok(Some(Worker::Stopped));
            }
            {
                let mut st = sh.state.lock().unwrap();
                st.stats.segments_put += 1;
                st.stats.segment_bytes_put += bytes.len() as u64;
                st.stats.segments_put_ahead += ahead as u64;
            }
            done.push((t, entry));
            Ok(None)
        };
        loop {
            if halt.load(Ordering::Relaxed) {
                return (done, Ok(Worker::Finished));
            }
            let Some(t) = feed() else {
                return (done, Ok(Worker::Finished));
            };
            if let Some(b) = busy {
                b.fetch_add(1, Ordering::SeqCst);
            }
            let _busy = Busy(busy);
            match one(t) {
                Ok(None) => {}
                Ok(Some(w)) => {
                    halt.store(true, Ordering::Relaxed);
                    return (done, Ok(w));
                }
                Err(e) => {
                    halt.store(true, Ordering::Relaxed);
                    return (done, Err(e));
                }
            }
        }
    };
    let ends = on_threads("ldfs-upload-put", workers.max(1), &work);
    let mut all = Vec::new();
    let mut outcome = Ok(Worker::Finished);
    for (done, end) in ends {
        all.extend(done);
        // An error first, then a stop, then an abandoned job.
        outcome = match (outcome, end) {
            (Err(e), _) | (_, Err(e)) => Err(e),
            (Ok(Worker::Stopped), _) | (_, Ok(Worker::Stopped)) => Ok(Worker::Stopped),
            (Ok(Worker::Skipped), _) | (_, Ok(Worker::Skipped)) => Ok(Worker::Skipped),
            _ => Ok(Worker::Finished),
        };
    }
    all.sort_by_key(|(t, _)| t.slot);
    (all, outcome)
}

/// Deletes `key` unless a kept checkpoint object names it; true if it was
/// deleted (or asked to be: the store holds it no more).
fn orphan(sh: &Shared, key: String, named: &[(String, BTreeSet<String>)]) -> LayerResult<bool> {
    if named.iter().any(|(_, keys)| keys.contains(&key)) {
        return Ok(false);
    }
    if let Some(cache) = &sh.cache {
        // A segment the cache evicted may hold nothing but this object.
        cache.before_delete(&key)?;
    }
    if retry_fenced(sh, || sh.store.delete(&key))?.is_some() {
        sh.state.lock().unwrap().stats.objects_deleted += 1;
        return Ok(true);
    }
    Ok(false)
}

/// Whether the cache's slot for `serial` holds `slot`, byte for byte.
pub fn cache_holds_slot(dev: &dyn Device, geo: &Geometry, serial: u64, slot: &[u8]) -> bool {
    let mut b = vec![0u8; slot.len()];
    dev.read_at(&mut b, geo.slot_addr((serial % 2) as usize))
        .is_ok()
        && b == slot
}

/// The segments' states in the cache's newest valid checkpoint slot (`None`
/// if neither decodes: nothing from the store is then taken as held).
/// `None`: no slot decodes. An error reading them is an error (review 34: taken for `None`,
/// one transient read error made the cache's residency map drop every segment it listed).
pub(super) fn newest_slot_states(
    dev: &dyn Device,
    geo: &Geometry,
) -> LayerResult<Option<Vec<SegmentState>>> {
    let slots = crate::lld::mkfs::read_checkpoints(dev, geo)
        .map_err(|e| LayerError::Other(format!("reading the cache's checkpoint slots: {e}")))?;
    Ok(slots
        .into_iter()
        .flatten()
        .max_by_key(|(h, _)| h.serial)
        .map(|newest| newest.1.iter().map(|(_, u)| u.state).collect()))
}

/// The sequence number of the partial segment at page 0: which use of the segment this is.
fn first_seq_of(geo: &Geometry, seg: SegmentId, bytes: &[u8]) -> LayerResult<u64> {
    let ex = Expect {
        fs_id: geo.fs_id,
        segment: seg.0,
        page: 0,
        pages_left: geo.segment_pages,
        segment_count: geo.segment_count,
        max_block_bytes: geo.max_block_bytes,
    };
    summary::decode_header(&bytes[..PAGE_BYTES], geo.page_addr(seg, 0), &ex)
        .map(|h| h.seq)
        .map_err(|e| LayerError::Corrupt {
            what: "cache segment named by a durable checkpoint",
            key: format!("segment {}", seg.0),
            detail: e.to_string(),
        })
}

/// The checkpoint a rebuild takes: the newest complete one in `store` ([`restore`],
/// [`restore_lazy`]; each then checks the cache can hold its file system, [`fits`]).
fn checkpoint_to_rebuild(store: &dyn ObjectStore) -> LayerResult<(String, CheckpointObject)> {
    let Some((key, obj)) = newest_complete_checkpoint(store)? else {
        return Err(match newest_checkpoint(store)? {
            Some((key, _)) => LayerError::Corrupt {
                what: "store",
                key,
                detail: "no checkpoint object whose segment objects are all there".into(),
            },
            None => LayerError::Other("the store holds no checkpoint object".into()),
        });
    };
    Ok((key, obj))
}

/// Refuses a device too small for `obj`'s file system.
fn fits(dev: &dyn Device, obj: &CheckpointObject) -> LayerResult<()> {
    let need = obj.geo.total_pages * PAGE_BYTES as u64;
    if dev.size_bytes() < need {
        return Err(LayerError::Other(format!(
            "the cache holds {} bytes; this file system needs {need}",
            dev.size_bytes()
        )));
    }
    Ok(())
}

/// The first step of a rebuild: whatever the device held is no cache from here on. Both
/// superblock copies (and the device's last page, copy 1 of a larger earlier file system) are
/// zeroed and flushed before anything else is written, so a rebuild cut short leaves no
/// superblock that `Lld::open` could take over a mix of old and new segments: the next mount
/// finds no cache and rebuilds (review 36 findings 1 and 3).
/// `geo`: a geometry whose copy 1 may lie elsewhere (the file system being restored, or the
/// one the cache held). Also called by a mount before it notes a rebuild (review 41 finding 1).
pub fn forget_cache(dev: &dyn Device, geo: Option<&Geometry>) -> LayerResult<()> {
    let zero = vec![0u8; PAGE_BYTES];
    dev.write_at(&zero, 0)?;
    if let Some(geo) = geo {
        dev.write_at(&zero, geo.superblock_addrs()[1])?;
    }
    dev.write_at(&zero, copy1_addr(dev.size_bytes()))?;
    dev.flush()?;
    Ok(())
}

/// What [`restore`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RestoreReport {
    pub serial: u64,
    pub segments: usize,
    pub bytes: u64,
    /// Segments the cache already held and kept ([`restore_lazy_keeping`]).
    pub kept: usize,
}

/// Rebuilds a cache on `dev` (at least the file system's size; what it held is overwritten
/// where the file system keeps anything) from the newest complete checkpoint object in
/// `store` ([`newest_complete_checkpoint`]), so
/// that lld opens the tree of that checkpoint. Page 0 (the superblock) is written last: a
/// rebuild cut short leaves a cache with zeros there, which a mount rebuilds again.
pub fn restore(store: &dyn ObjectStore, dev: &dyn Device) -> LayerResult<RestoreReport> {
    restore_as(store, dev, random_cache_id())
}

/// [`restore`] writing `cache_id` as the cache's identity into both superblock copies
/// (`Geometry::cache_id`; its note records it before the rebuild).
pub fn restore_as(
    store: &dyn ObjectStore,
    dev: &dyn Device,
    cache_id: u64,
) -> LayerResult<RestoreReport> {
    // A writer uploading meanwhile deletes the objects two later uploads superseded: a
    // download that spans two of its upload windows finds one of its objects gone, and
    // chooses again (review 34). What was written already under the same key and crc is not
    // fetched again, so each attempt downloads only what changed.
    let mut written: BTreeMap<u32, (String, u32)> = BTreeMap::new();
    let mut bytes = 0u64;
    let mut attempt = 0;
    loop {
        attempt += 1;
        let (key, obj) = checkpoint_to_rebuild(store)?;
        fits(dev, &obj)?;
        let geo = &obj.geo;
        if attempt == 1 {
            // Later attempts reuse what this one wrote (same key and crc): only the first forgets.
            forget_cache(dev, Some(geo))?;
        }
        let mut gone = false;
        for e in &obj.entries {
            let k = e.key();
            if written
                .get(&e.segment)
                .is_some_and(|w| w.0 == k && w.1 == e.crc)
            {
                continue;
            }
            let b = match store.get(&k) {
                Ok(b) => b,
                Err(StoreError::NotFound { .. }) if attempt < RESTORE_ATTEMPTS => {
                    gone = true;
                    break;
                }
                Err(err) => return Err(err.into()),
            };
            if b.len() != e.pages as usize * PAGE_BYTES || crc32c::crc32c(&b) != e.crc {
                return Err(LayerError::Corrupt {
                    what: "segment object",
                    key: k,
                    detail: format!(
                        "{} bytes with crc {:#x}; the checkpoint names {} pages with crc {:#x}",
                        b.len(),
                        crc32c::crc32c(&b),
                        e.pages,
                        e.crc
                    ),
                });
            }
            dev.write_at(&b, geo.page_addr(SegmentId(e.segment), 0))?;
            bytes += b.len() as u64;
            written.insert(e.segment, (k, e.crc));
        }
        if gone {
            continue;
        }
        write_slot_and_superblocks(dev, &key, &obj, cache_id)?;
        return Ok(RestoreReport {
            serial: obj.serial,
            segments: obj.entries.len(),
            bytes,
            kept: 0,
        });
    }
}

/// How many times [`restore`] chooses a checkpoint whose objects a writer deleted mid-download
/// before it gives up.
const RESTORE_ATTEMPTS: u32 = 5;

/// Makes a fresh cache on `dev` for the newest complete checkpoint object in `store` without
/// downloading its segments (a cold mount, issue 20 step C): the residency map at `map_path`
/// lists every segment the checkpoint names in full (written durably first), the segment area
/// is given back (a hole, where the device can), the Active segment's prefix is fetched (lld
/// appends to it), then the slot and the end-of-log zeros, and the superblocks last. lld then
/// opens it as after a clean shutdown and fetches each segment at its first read
/// ([`SegmentStore::start_cached`]).
pub fn restore_lazy(
    store: &dyn ObjectStore,
    dev: &dyn Device,
    map_path: &std::path::Path,
) -> LayerResult<RestoreReport> {
    restore_lazy_as(store, dev, map_path, random_cache_id())
}

/// [`restore_lazy`] writing `cache_id` as the cache's identity (see [`restore_as`]).
pub fn restore_lazy_as(
    store: &dyn ObjectStore,
    dev: &dyn Device,
    map_path: &std::path::Path,
    cache_id: u64,
) -> LayerResult<RestoreReport> {
    let (key, obj) = checkpoint_to_rebuild(store)?;
    restore_lazy_of(store, dev, map_path, cache_id, &key, &obj)
}

/// [`restore_lazy_as`] of the checkpoint object `obj` (under `key`), chosen by the caller: a
/// read-only mount's, the one its pin keeps (`store::readers`).
pub fn restore_lazy_of(
    store: &dyn ObjectStore,
    dev: &dyn Device,
    map_path: &std::path::Path,
    cache_id: u64,
    key: &str,
    obj: &CheckpointObject,
) -> LayerResult<RestoreReport> {
    restore_lazy_keeping(store, dev, map_path, cache_id, key, obj, &[])
}

/// [`restore_lazy_of`] keeping what `dev` already holds of `keep`: entries of `obj` naming a
/// segment in full that the cache on `dev` holds byte for byte (a read-only mount moving to a
/// newer checkpoint keeps the segments it had fetched whose objects the new one still names:
/// a key always names the same bytes). Those are neither punched nor listed in the map, so the
/// cache opens them as held; an entry of `keep` that `obj` does not name so, in full, is
/// ignored. A rebuild cut short leaves no superblock ([`forget_cache`] first), so the next
/// mount rebuilds it whole.
pub fn restore_lazy_keeping(
    store: &dyn ObjectStore,
    dev: &dyn Device,
    map_path: &std::path::Path,
    cache_id: u64,
    key: &str,
    obj: &CheckpointObject,
    keep: &[SegmentEntry],
) -> LayerResult<RestoreReport> {
    fits(dev, obj)?;
    let geo = &obj.geo;
    forget_cache(dev, Some(geo))?;
    let (full, prefix): (Vec<SegmentEntry>, Vec<SegmentEntry>) = obj
        .entries
        .iter()
        .partition(|e| e.pages == geo.segment_pages);
    // By segment: `keep.contains` per entry was quadratic (a refresh of a reader holding
    // 50,000 segments spent seconds here with every request held back: review 51).
    let keep: std::collections::HashMap<u32, &SegmentEntry> =
        keep.iter().map(|e| (e.segment, e)).collect();
    let (kept, listed): (Vec<SegmentEntry>, Vec<SegmentEntry>) = full
        .into_iter()
        .partition(|e| keep.get(&e.segment).is_some_and(|k| *k == e));
    super::cache::write_map(map_path, geo.fs_id, &listed).map_err(|e| {
        LayerError::Other(format!(
            "writing the residency map {}: {e}",
            map_path.display()
        ))
    })?;
    // The segment area given back but for the segments kept, run by run.
    let mut held = vec![false; geo.segment_count as usize];
    for e in &kept {
        held[e.segment as usize] = true;
    }
    let mut s = 0usize;
    while s < held.len() {
        if held[s] {
            s += 1;
            continue;
        }
        let end = (s..held.len()).find(|&t| held[t]).unwrap_or(held.len());
        dev.discard(
            geo.page_addr(SegmentId(s as u32), 0),
            geo.segment_bytes() * (end - s) as u64,
        )?;
        s = end;
    }
    let mut bytes = 0u64;
    for e in &prefix {
        let k = e.key();
        let b = store.get(&k)?;
        if b.len() != e.pages as usize * PAGE_BYTES || crc32c::crc32c(&b) != e.crc {
            return Err(LayerError::Corrupt {
                what: "segment object",
                key: k,
                detail: format!(
                    "{} bytes with crc {:#x}; the checkpoint names {} pages with crc {:#x}",
                    b.len(),
                    crc32c::crc32c(&b),
                    e.pages,
                    e.crc
                ),
            });
        }
        dev.write_at(&b, geo.page_addr(SegmentId(e.segment), 0))?;
        bytes += b.len() as u64;
    }
    write_slot_and_superblocks(dev, key, obj, cache_id)?;
    Ok(RestoreReport {
        serial: obj.serial,
        segments: prefix.len(),
        bytes,
        kept: kept.len(),
    })
}

/// The end of a rebuild: the checkpoint object's slot (the other zeroed), zeros where the log
/// ends, a flush, then superblock copy 1, a flush, and page 0 the very last, and a flush: a
/// rebuild cut short leaves zeros at page 0 (review 31). Copy 1 goes where readers look for
/// it, the device's last page (`layout::copy1_addr`; on a device larger than the file system
/// the geometry's own last page is read by no one: review 37 finding 1). Written and flushed
/// before page 0, a good copy 1 with page 0 zero or torn means the rebuild finished but for
/// page 0: everything else was flushed before it.
fn write_slot_and_superblocks(
    dev: &dyn Device,
    key: &str,
    obj: &CheckpointObject,
    cache_id: u64,
) -> LayerResult<()> {
    assert_ne!(cache_id, 0, "a rebuilt cache has an identity");
    let geo = &obj.geo;
    let slot = (obj.serial % 2) as usize;
    dev.write_at(&obj.slot, geo.slot_addr(slot))?;
    dev.write_at(&vec![0u8; obj.slot.len()], geo.slot_addr(1 - slot))?;
    // Roll-forward starts at the slot's log head and may go on at page 0 of the next
    // segment: zeros there end the log, whatever the device held before.
    let (hdr, _) = checkpoint::decode(geo, &obj.slot, 0).map_err(|e| LayerError::Corrupt {
        what: "checkpoint object",
        key: key.to_string(),
        detail: format!("slot: {e}"),
    })?;
    let zero = vec![0u8; PAGE_BYTES];
    if hdr.log_page < geo.segment_pages {
        dev.write_at(
            &zero,
            geo.page_addr(SegmentId(hdr.log_segment), hdr.log_page),
        )?;
    }
    if hdr.next_segment != hdr.log_segment {
        dev.write_at(&zero, geo.page_addr(SegmentId(hdr.next_segment), 0))?;
    }
    dev.flush()?;
    // The uploaded page 0 is the writer's cache's, with its identity: this cache gets its own.
    let page0 = superblock_with_cache_id(&obj.superblock, cache_id);
    dev.write_at(&superblock_as_copy(&page0, 1), copy1_addr(dev.size_bytes()))?;
    dev.flush()?;
    dev.write_at(&page0, 0)?;
    dev.flush()?;
    Ok(())
}
