//! A cache smaller than the file system (issue 20 step C): segments fetched from the store on
//! a miss, least recently used ones evicted (a hole punched) to stay within a bound.
//!
//! docs/DESIGN.md "A cache smaller than the file system" has the design, docs/FORMAT.md
//! "Residency map" the side file. [`Cache`] owns the cache device's residency; [`CacheDevice`]
//! is the device lld (and the uploader) read and write through: lld does not know about
//! objects.
//!
//! Invariants:
//! - A segment is evicted only while the newest uploaded checkpoint object names it in full and
//!   nothing wrote to it or released it since ([`Cache::set_evictable`], [`Cache::note_released`]).
//! - The durable residency map lists every segment whose bytes the cache may not hold: a
//!   segment enters it (durably) before its hole is punched, leaves it only at a write of the
//!   map that follows a flush of the cache device, and a write to a segment it lists first
//!   writes a map without it.
//! - A hole is punched under the exclusive I/O lock; every read and write through the device
//!   holds it shared, so no read in flight sees a hole it did not expect.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::segments::{LayerError, LayerResult, SegmentEntry};
use super::ObjectStore;
use crate::device::{Device, DeviceError, DeviceOp};
use crate::lld::layout::Geometry;
use crate::lld::usage::SegmentState;
use crate::lld::{SegmentId, PAGE_BYTES};

pub const MAP_MAGIC: u64 = u64::from_le_bytes(*b"LDFSRESI");
pub const MAP_VERSION: u32 = 1;
const M_MAGIC: usize = 0;
const M_VERSION: usize = 8;
const M_COUNT: usize = 12;
const M_FS_ID: usize = 16;
const M_CRC: usize = 24;
const M_ENTRIES: usize = 32;
const ENTRY_BYTES: usize = 32;

/// The residency map's path for a cache's note path: `PATH.ldfs-resident` beside
/// `PATH.ldfs-store` (or in the notes folder of a block device cache).
pub fn map_path_for_note(note: &Path) -> PathBuf {
    note.with_extension("ldfs-resident")
}

fn crc_with_hole(b: &[u8], at: usize) -> u32 {
    let c = crc32c::crc32c(&b[..at]);
    let c = crc32c::crc32c_append(c, &[0u8; 4]);
    crc32c::crc32c_append(c, &b[at + 4..])
}

/// Encodes a residency map (FORMAT "Residency map").
pub fn encode_map(fs_id: u64, entries: &[SegmentEntry]) -> Vec<u8> {
    assert!(entries.windows(2).all(|w| w[0].segment < w[1].segment));
    let mut b = Vec::with_capacity(M_ENTRIES + entries.len() * ENTRY_BYTES);
    b.extend_from_slice(&MAP_MAGIC.to_le_bytes());
    b.extend_from_slice(&MAP_VERSION.to_le_bytes());
    b.extend_from_slice(&(entries.len() as u32).to_le_bytes());
    b.extend_from_slice(&fs_id.to_le_bytes());
    b.extend_from_slice(&[0u8; 8]);
    for e in entries {
        b.extend_from_slice(&e.segment.to_le_bytes());
        b.extend_from_slice(&e.pages.to_le_bytes());
        b.extend_from_slice(&e.first_seq.to_le_bytes());
        b.extend_from_slice(&e.writer.to_le_bytes());
        b.extend_from_slice(&e.crc.to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes());
    }
    let crc = crc_with_hole(&b, M_CRC);
    b[M_CRC..M_CRC + 4].copy_from_slice(&crc.to_le_bytes());
    b
}

/// Decodes and checks a residency map of the cache of `geo` (read from `what`, for errors):
/// magic, version, crc, fs id, every entry a full segment of the file system, in order.
pub fn decode_map(what: &str, geo: &Geometry, b: &[u8]) -> LayerResult<Vec<SegmentEntry>> {
    let bad = |detail: String| LayerError::Corrupt {
        what: "residency map",
        key: what.to_string(),
        detail,
    };
    if b.len() < M_ENTRIES {
        return Err(bad(format!("{} bytes, shorter than its header", b.len())));
    }
    let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"));
    let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
    if u64_at(M_MAGIC) != MAP_MAGIC {
        return Err(bad(format!("bad magic {:#x}", u64_at(M_MAGIC))));
    }
    if u32_at(M_VERSION) != MAP_VERSION {
        return Err(bad(format!("version {}", u32_at(M_VERSION))));
    }
    let (want, got) = (u32_at(M_CRC), crc_with_hole(b, M_CRC));
    if want != got {
        return Err(bad(format!("crc {got:#x}, stored {want:#x}")));
    }
    if u64_at(M_FS_ID) != geo.fs_id {
        return Err(bad(format!(
            "fs id {:#x}, the cache's {:#x}",
            u64_at(M_FS_ID),
            geo.fs_id
        )));
    }
    let count = u32_at(M_COUNT) as usize;
    if count > geo.segment_count as usize || b.len() != M_ENTRIES + count * ENTRY_BYTES {
        return Err(bad(format!("{count} entries in {} bytes", b.len())));
    }
    let mut out: Vec<SegmentEntry> = Vec::with_capacity(count);
    for i in 0..count {
        let o = M_ENTRIES + i * ENTRY_BYTES;
        let e = SegmentEntry {
            segment: u32_at(o),
            pages: u32_at(o + 4),
            first_seq: u64_at(o + 8),
            writer: u64_at(o + 16),
            crc: u32_at(o + 24),
        };
        if e.segment >= geo.segment_count
            || e.pages != geo.segment_pages
            || e.writer == 0
            || u32_at(o + 28) != 0
            || out.last().is_some_and(|p| p.segment >= e.segment)
        {
            return Err(bad(format!("entry {i}: {e:?}")));
        }
        out.push(e);
    }
    Ok(out)
}

/// Reads the map at `path`: `None` if there is none (every segment is held).
pub fn read_map(path: &Path, geo: &Geometry) -> LayerResult<Option<Vec<SegmentEntry>>> {
    match std::fs::read(path) {
        Ok(b) => decode_map(&path.display().to_string(), geo, &b).map(Some),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(LayerError::Other(format!("{}: {e}", path.display()))),
    }
}

/// Writes the map durably: a temporary file, fsynced, renamed over the map, the folder fsynced.
pub fn write_map(path: &Path, fs_id: u64, entries: &[SegmentEntry]) -> std::io::Result<()> {
    use std::io::Write;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(&encode_map(fs_id, entries))?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// Removes the map (a cache rebuilt whole holds every segment).
pub fn remove_map(path: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// How a store-backed mount's cache is bounded.
#[derive(Clone, Debug)]
pub struct CacheConfig {
    /// The residency map (FORMAT "Residency map").
    pub map_path: PathBuf,
    /// Bytes of segments the cache may hold (whole segments); `u64::MAX`: no bound.
    pub bound_bytes: u64,
    /// How long a read waits for a store that answers "unavailable" before it fails.
    pub fetch_patience: Duration,
}

impl CacheConfig {
    pub fn new(map_path: PathBuf, bound_bytes: Option<u64>) -> CacheConfig {
        CacheConfig {
            map_path,
            bound_bytes: bound_bytes.unwrap_or(u64::MAX),
            fetch_patience: Duration::from_secs(30),
        }
    }
}

/// The cache's counters (`ldfs stats`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// `u64::MAX`: no bound.
    pub bound_bytes: u64,
    /// Segments the cache holds bytes of (written or fetched), counted whole.
    pub held_segments: u64,
    pub held_bytes: u64,
    /// Segments whose bytes are in the store only.
    pub evicted_segments: u64,
    /// Reads served from the cache (one per read call).
    pub hits: u64,
    /// Segments fetched from the store.
    pub misses: u64,
    pub bytes_fetched: u64,
    /// Fetches that failed (the read got EIO).
    pub fetch_failures: u64,
    pub evictions: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Seg {
    /// The cache holds the segment's bytes (or the segment holds nothing lld reads).
    Held,
    /// In the store only (a hole in the cache).
    Evicted(SegmentEntry),
    /// Being fetched by one reader; the others wait.
    Fetching(SegmentEntry),
    /// Chosen for eviction: in the map being written, bytes still in the cache.
    Evicting(SegmentEntry),
}

struct CState {
    seg: Vec<Seg>,
    /// What the durable map lists.
    durable: Vec<Option<SegmentEntry>>,
    /// Bytes of the segment are allocated in the cache (counted whole).
    occupied: Vec<bool>,
    /// The entry of the newest uploaded checkpoint object naming it in full, while nothing
    /// wrote to it or released it since.
    evictable: Vec<Option<SegmentEntry>>,
    /// Released by a durable checkpoint and not written since: lld reads nothing of it.
    released: Vec<bool>,
    last_use: Vec<u64>,
    tick: u64,
    stats: CacheStats,
    wake: bool,
    stop: bool,
    /// When the log last said the cache is over its bound with nothing evictable (at most
    /// once a minute: while uploads are behind it happens at every new segment).
    over_said: Option<Instant>,
}

impl CState {
    fn held_count(&self) -> u64 {
        self.occupied.iter().filter(|&&o| o).count() as u64
    }
}

/// See the module documentation.
pub struct Cache {
    dev: Arc<dyn Device>,
    store: Arc<dyn ObjectStore>,
    geo: Geometry,
    cfg: CacheConfig,
    bound_segments: u64,
    state: Mutex<CState>,
    cv: Condvar,
    /// Shared by every read and write through the device; exclusive for a punch.
    io: RwLock<()>,
    /// One write of the map at a time (each writes the state as it is when it begins).
    persist_lock: Mutex<()>,
    evictor: Mutex<Option<JoinHandle<()>>>,
}

impl Cache {
    /// Opens the residency of the cache on `dev` (its superblock decoded as `geo`): the map at
    /// `cfg.map_path` (absent: everything held). `states` are the segments' states in the
    /// cache's newest durable slot (`None`: no slot decodes; every listed segment stays listed):
    /// a listed segment that is not Dirty there holds nothing lld reads (released, or beyond
    /// the log) and leaves the map as a hole; one Dirty segment's
    /// object `kept` (what the newest two checkpoint objects name) does not contain is fetched
    /// back before the caller's sweep deletes it. Starts the eviction thread.
    pub fn open(
        dev: Arc<dyn Device>,
        store: Arc<dyn ObjectStore>,
        geo: Geometry,
        cfg: CacheConfig,
        states: Option<&[SegmentState]>,
        kept: &std::collections::BTreeSet<String>,
    ) -> LayerResult<Arc<Cache>> {
        let n = geo.segment_count as usize;
        let map = read_map(&cfg.map_path, &geo)?;
        // No slot to say (none decodes): every listed segment stays listed (review 34).
        let dirty =
            |s: usize| states.is_none_or(|st| matches!(st.get(s), Some(SegmentState::Dirty)));
        let live = |s: usize| {
            states.is_none_or(|st| {
                matches!(st.get(s), Some(SegmentState::Dirty | SegmentState::Active))
            })
        };
        let mut st = CState {
            seg: vec![Seg::Held; n],
            durable: vec![None; n],
            occupied: (0..n).map(live).collect(),
            evictable: vec![None; n],
            released: vec![false; n],
            last_use: vec![0; n],
            tick: 0,
            stats: CacheStats::default(),
            wake: false,
            stop: false,
            over_said: None,
        };
        let mut refetch = Vec::new();
        let mut changed = false;
        for e in map.into_iter().flatten() {
            let s = e.segment as usize;
            st.durable[s] = Some(e);
            st.occupied[s] = false;
            if !dirty(s) {
                changed = true; // a hole lld does not read
            } else if !kept.contains(&e.key()) {
                st.seg[s] = Seg::Fetching(e);
                refetch.push(e);
            } else {
                st.seg[s] = Seg::Evicted(e);
            }
        }
        let bound_segments = (cfg.bound_bytes / geo.segment_bytes()).max(1);
        let cache = Arc::new(Cache {
            dev,
            store,
            geo,
            cfg,
            bound_segments,
            state: Mutex::new(st),
            cv: Condvar::new(),
            io: RwLock::new(()),
            persist_lock: Mutex::new(()),
            evictor: Mutex::new(None),
        });
        for e in refetch {
            // A crash after a checkpoint put and before its deletes: the sweep is about to
            // delete what this segment still needs.
            cache.fetch(e.segment as usize, e)?;
            changed = true;
        }
        if changed {
            cache.persist()?;
        }
        let c2 = Arc::downgrade(&cache);
        let t = std::thread::Builder::new()
            .name("ldfs-evictor".into())
            .spawn(move || evictor(c2))
            .expect("spawn evictor thread");
        *cache.evictor.lock().unwrap() = Some(t);
        Ok(cache)
    }

    /// Stops the eviction thread.
    pub fn stop(&self) {
        self.state.lock().unwrap().stop = true;
        self.cv.notify_all();
        let t = self.evictor.lock().unwrap().take();
        if let Some(t) = t {
            let _ = t.join();
        }
    }

    /// The segments whose bytes the cache holds (held, allocated): what a rebuild of the same
    /// device may keep (`segments::restore_lazy_keeping`). Stop the cache first
    /// ([`Cache::stop`]) and read nothing through it after, so that none is evicted since.
    pub fn held_segments(&self) -> Vec<u32> {
        let st = self.state.lock().unwrap();
        (0..st.seg.len())
            .filter(|&s| st.seg[s] == Seg::Held && st.occupied[s])
            .map(|s| s as u32)
            .collect()
    }

    pub fn stats(&self) -> CacheStats {
        let st = self.state.lock().unwrap();
        let held = st.held_count();
        CacheStats {
            bound_bytes: self.cfg.bound_bytes,
            held_segments: held,
            held_bytes: held * self.geo.segment_bytes(),
            evicted_segments: st
                .seg
                .iter()
                .filter(|s| matches!(s, Seg::Evicted(_) | Seg::Fetching(_)))
                .count() as u64,
            ..st.stats
        }
    }

    /// Evicts now until the cache is within its bound (or nothing more may go); the eviction
    /// thread does the same when woken.
    pub fn shrink(&self) -> LayerResult<()> {
        self.make_room(0)
    }

    /// Whether the cache holds a bound (else it never evicts).
    pub fn bounded(&self) -> bool {
        self.cfg.bound_bytes != u64::MAX
    }

    /// The entry of an evicted segment (its bytes are in the store only).
    pub fn evicted_entry(&self, segment: u32) -> Option<SegmentEntry> {
        match self.state.lock().unwrap().seg[segment as usize] {
            Seg::Evicted(e) | Seg::Fetching(e) => Some(e),
            _ => None,
        }
    }

    /// The newest uploaded checkpoint object names these segments in full (Dirty in its slot,
    /// read for it, or known, after their last release): they, and no others, may be evicted.
    /// The caller holds the uploader's state lock, under which it checked that no later
    /// checkpoint released them.
    pub fn set_evictable(&self, entries: &[SegmentEntry]) {
        if !self.bounded() {
            return;
        }
        let mut st = self.state.lock().unwrap();
        st.evictable.iter_mut().for_each(|e| *e = None);
        for e in entries {
            let s = e.segment as usize;
            // A segment evicted already stays evictable after a fetch brings it back.
            let same = match st.seg[s] {
                Seg::Held => true,
                Seg::Evicted(x) | Seg::Fetching(x) | Seg::Evicting(x) => x == *e,
            };
            if same && !st.released[s] {
                st.evictable[s] = Some(*e);
            }
        }
        st.wake = true;
        self.cv.notify_all();
    }

    /// Segments a durable checkpoint releases (the hook): never evicted from now on, and what
    /// they held is not read again before lld writes them.
    pub fn note_released(&self, segments: &[SegmentId]) {
        let mut st = self.state.lock().unwrap();
        for s in segments {
            st.evictable[s.0 as usize] = None;
            st.released[s.0 as usize] = true;
        }
    }

    /// Before the uploader deletes the segment object `entry`: a segment whose bytes only it
    /// holds is settled first (released: left as a hole; else fetched back), and the map made
    /// durable without it. Returns once deleting it harms nothing.
    pub fn before_delete(&self, key: &str) -> LayerResult<()> {
        let Some(s) = key
            .strip_prefix("seg/")
            .and_then(|k| k.get(..8))
            .and_then(|h| u32::from_str_radix(h, 16).ok())
            .map(|s| s as usize)
            .filter(|&s| s < self.seg_count())
        else {
            return Ok(());
        };
        // Found evicted or being evicted: a map write in flight may list it, though the
        // durable map does not yet (review 34); a map is written after it, in any case.
        let mut settled = false;
        loop {
            let mut st = self.state.lock().unwrap();
            match st.seg[s] {
                Seg::Fetching(_) => {
                    drop(self.cv.wait(st).unwrap());
                    continue;
                }
                Seg::Evicted(e) | Seg::Evicting(e) if e.key() == key => {
                    settled = true;
                    if st.released[s] {
                        st.seg[s] = Seg::Held;
                    } else {
                        st.seg[s] = Seg::Fetching(e);
                        drop(st);
                        self.fetch(s, e)?;
                        continue;
                    }
                }
                _ => {}
            }
            let listed = settled || st.durable[s].is_some_and(|e| e.key() == key);
            drop(st);
            if listed {
                self.persist()?;
            }
            return Ok(());
        }
    }

    fn seg_count(&self) -> usize {
        self.geo.segment_count as usize
    }

    /// The segments `len` bytes at `offset` touch.
    fn segments_of(&self, offset: u64, len: u64) -> std::ops::Range<usize> {
        if len == 0 {
            return 0..0;
        }
        let first = self.geo.page_addr(SegmentId(0), 0);
        let end = offset.saturating_add(len);
        let area_end = first + self.geo.segment_bytes() * self.geo.segment_count as u64;
        if end <= first || offset >= area_end {
            return 0..0;
        }
        let a = (offset.max(first) - first) / self.geo.segment_bytes();
        let b = (end.min(area_end) - first).div_ceil(self.geo.segment_bytes());
        a as usize..b as usize
    }

    /// Writes the map as the state is now (after a flush of the device, so that every
    /// segment fetched before it is durable when the map stops listing it).
    fn persist(&self) -> LayerResult<()> {
        let _p = self.persist_lock.lock().unwrap();
        let listed: Vec<Option<SegmentEntry>> = {
            let st = self.state.lock().unwrap();
            st.seg
                .iter()
                .map(|s| match *s {
                    Seg::Held => None,
                    Seg::Evicted(e) | Seg::Fetching(e) | Seg::Evicting(e) => Some(e),
                })
                .collect()
        };
        self.dev.flush()?;
        let entries: Vec<SegmentEntry> = listed.iter().flatten().copied().collect();
        write_map(&self.cfg.map_path, self.geo.fs_id, &entries).map_err(|e| {
            LayerError::Other(format!(
                "writing the residency map {}: {e}",
                self.cfg.map_path.display()
            ))
        })?;
        self.state.lock().unwrap().durable = listed;
        Ok(())
    }

    /// Fetches segment `s` (its state `Fetching(e)`, set by the caller) from the store, checks
    /// it, makes room, writes it into the cache: `Held`. On failure the segment is `Evicted`
    /// again (the next read tries again) and the error says segment and key.
    fn fetch(&self, s: usize, e: SegmentEntry) -> LayerResult<()> {
        let key = e.key();
        let t = Instant::now();
        let mut wait = Duration::from_millis(50);
        let got = loop {
            match self.store.get(&key) {
                Err(err) if err.is_transient() && t.elapsed() < self.cfg.fetch_patience => {
                    std::thread::sleep(wait);
                    wait = (wait * 2).min(Duration::from_secs(2));
                }
                r => break r,
            }
        };
        let want = e.pages as usize * PAGE_BYTES;
        let checked = match got {
            Ok(b) if b.len() == want && crc32c::crc32c(&b) == e.crc => Ok(b),
            Ok(b) => Err(LayerError::Corrupt {
                what: "segment object",
                key: key.clone(),
                detail: format!(
                    "segment {s}: {} bytes with crc {:#x}; the checkpoint named {want} with crc {:#x}",
                    b.len(),
                    crc32c::crc32c(&b),
                    e.crc
                ),
            }),
            Err(err) => Err(LayerError::Store(err)),
        };
        let bytes = match checked {
            Ok(b) => b,
            Err(err) => {
                let mut st = self.state.lock().unwrap();
                if st.seg[s] == Seg::Fetching(e) {
                    st.seg[s] = Seg::Evicted(e);
                }
                st.stats.fetch_failures += 1;
                self.cv.notify_all();
                eprintln!("ldfs: segment {s} (object {key}) cannot be fetched: {err}");
                return Err(err);
            }
        };
        if let Err(err) = self.make_room(1) {
            // Evicted again, its waiters woken: left Fetching, every later read of the
            // segment would wait for ever (review 51).
            let mut st = self.state.lock().unwrap();
            if st.seg[s] == Seg::Fetching(e) {
                st.seg[s] = Seg::Evicted(e);
            }
            st.stats.fetch_failures += 1;
            self.cv.notify_all();
            eprintln!("ldfs: segment {s} (object {key}): no room could be made for it: {err}");
            return Err(err);
        }
        let _io = self.io.read().unwrap();
        let mut st = self.state.lock().unwrap();
        if st.seg[s] == Seg::Fetching(e) {
            // Under the state lock: a write by lld to this segment (after a release) changes
            // its state first, so it is never overwritten by what the object held.
            let r = self
                .dev
                .write_at(&bytes, self.geo.page_addr(SegmentId(s as u32), 0));
            if let Err(err) = r {
                st.seg[s] = Seg::Evicted(e);
                self.cv.notify_all();
                return Err(err.into());
            }
            st.seg[s] = Seg::Held;
            st.occupied[s] = true;
            st.tick += 1;
            st.last_use[s] = st.tick;
            st.stats.misses += 1;
            st.stats.bytes_fetched += bytes.len() as u64;
        }
        self.cv.notify_all();
        Ok(())
    }

    /// Evicts least recently used evictable segments until `extra` more fit in the bound (or
    /// nothing more may go).
    fn make_room(&self, extra: u64) -> LayerResult<()> {
        if !self.bounded() {
            return Ok(());
        }
        loop {
            let victims: Vec<(usize, SegmentEntry)> = {
                let mut st = self.state.lock().unwrap();
                let held = st.held_count();
                let over = (held + extra).saturating_sub(self.bound_segments);
                if over == 0 {
                    return Ok(());
                }
                let mut cand: Vec<(u64, usize, SegmentEntry)> = (0..self.seg_count())
                    .filter_map(|s| match (st.seg[s], st.evictable[s]) {
                        (Seg::Held, Some(e)) if st.occupied[s] => Some((st.last_use[s], s, e)),
                        _ => None,
                    })
                    .collect();
                cand.sort_unstable_by_key(|c| (c.0, c.1));
                // A sixteenth of the bound more than needed: each eviction writes the map
                // (three fsyncs), so a read sweep pays for it once per batch, not per fetch.
                cand.truncate((over + self.bound_segments / 16) as usize);
                if cand.is_empty() {
                    if st
                        .over_said
                        .is_none_or(|t| t.elapsed() >= Duration::from_secs(60))
                    {
                        st.over_said = Some(Instant::now());
                        eprintln!(
                            "ldfs: the cache holds {held} segments (its bound is {}; {extra} more \
                             wanted) and none may be evicted yet (not uploaded, or the log's): \
                             it shrinks after the next upload",
                            self.bound_segments
                        );
                    }
                    return Ok(());
                }
                for &(_, s, e) in &cand {
                    st.seg[s] = Seg::Evicting(e);
                }
                cand.into_iter().map(|(_, s, e)| (s, e)).collect()
            };
            // The map names them before any hole is punched.
            if let Err(err) = self.persist() {
                let mut st = self.state.lock().unwrap();
                for &(s, e) in &victims {
                    if st.seg[s] == Seg::Evicting(e) {
                        st.seg[s] = Seg::Held;
                    }
                }
                return Err(err);
            }
            let _io = self.io.write().unwrap();
            let mut st = self.state.lock().unwrap();
            for (s, e) in victims {
                if st.seg[s] != Seg::Evicting(e) {
                    continue; // written since: lld's again
                }
                let addr = self.geo.page_addr(SegmentId(s as u32), 0);
                // A device that cannot punch keeps the bytes: the segment still reads from
                // the store, which holds the same.
                if let Err(err) = self.dev.discard(addr, self.geo.segment_bytes()) {
                    eprintln!("ldfs: evicting segment {s}: {err}");
                }
                st.seg[s] = Seg::Evicted(e);
                st.occupied[s] = false;
                st.stats.evictions += 1;
            }
        }
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), DeviceError> {
        let segs = self.segments_of(offset, buf.len() as u64);
        let mut first_try = true;
        loop {
            let io = self.io.read().unwrap();
            let mut st = self.state.lock().unwrap();
            let missing = segs
                .clone()
                .find(|&s| !matches!(st.seg[s], Seg::Held | Seg::Evicting(_)));
            match missing {
                None => {
                    st.tick += 1;
                    let t = st.tick;
                    for s in segs.clone() {
                        st.last_use[s] = t;
                    }
                    if first_try && !segs.is_empty() {
                        st.stats.hits += 1;
                    }
                    drop(st);
                    let r = self.dev.read_at(buf, offset);
                    drop(io);
                    return r;
                }
                Some(s) => {
                    first_try = false;
                    drop(io);
                    match st.seg[s] {
                        Seg::Evicted(e) => {
                            st.seg[s] = Seg::Fetching(e);
                            drop(st);
                            self.fetch(s, e).map_err(|err| DeviceError::Io {
                                op: DeviceOp::Read,
                                offset,
                                len: buf.len() as u64,
                                source: std::io::Error::other(format!(
                                    "segment {s} is not in the cache and its object {} cannot \
                                     be fetched: {err}",
                                    e.key()
                                )),
                            })?;
                        }
                        _ => drop(self.cv.wait(st).unwrap()),
                    }
                }
            }
        }
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), DeviceError> {
        let segs = self.segments_of(offset, buf.len() as u64);
        let mut wake = false;
        loop {
            let mut st = self.state.lock().unwrap();
            // A segment lld writes without a release first (never, by lld's rules: written
            // segments are the log's) would need its other bytes: fetched before the write.
            if let Some(s) = segs.clone().find(|&s| {
                matches!(st.seg[s], Seg::Evicted(_) | Seg::Fetching(_)) && !st.released[s]
            }) {
                match st.seg[s] {
                    Seg::Evicted(e) => {
                        st.seg[s] = Seg::Fetching(e);
                        drop(st);
                        self.fetch(s, e).map_err(|err| DeviceError::Io {
                            op: DeviceOp::Write,
                            offset,
                            len: buf.len() as u64,
                            source: std::io::Error::other(err.to_string()),
                        })?;
                    }
                    _ => drop(self.cv.wait(st).unwrap()),
                }
                continue;
            }
            let mut listed = false;
            st.tick += 1;
            let t = st.tick;
            for s in segs.clone() {
                // `Evicting`: a map write in flight may list it (`durable` is set only when
                // that write ends); this one's persist waits for it (review 34).
                listed |= st.durable[s].is_some() || matches!(st.seg[s], Seg::Evicting(_));
                st.seg[s] = Seg::Held;
                st.evictable[s] = None;
                st.released[s] = false;
                st.last_use[s] = t;
                if !st.occupied[s] {
                    st.occupied[s] = true;
                    wake = true;
                }
            }
            if wake {
                st.wake = true;
                self.cv.notify_all();
            }
            drop(st);
            if listed {
                // The durable map must not send a read of these new bytes to an old object.
                self.persist().map_err(|err| DeviceError::Io {
                    op: DeviceOp::Write,
                    offset,
                    len: buf.len() as u64,
                    source: std::io::Error::other(err.to_string()),
                })?;
            }
            let _io = self.io.read().unwrap();
            return self.dev.write_at(buf, offset);
        }
    }

    fn discard(&self, offset: u64, len: u64) -> Result<bool, DeviceError> {
        let _io = self.io.read().unwrap();
        let r = self.dev.discard(offset, len)?;
        if r {
            let mut st = self.state.lock().unwrap();
            let first = self.geo.page_addr(SegmentId(0), 0);
            for s in self.segments_of(offset, len) {
                let a = first + s as u64 * self.geo.segment_bytes();
                // Only a whole segment given back stops counting.
                if a >= offset
                    && a + self.geo.segment_bytes() <= offset + len
                    && st.seg[s] == Seg::Held
                {
                    st.occupied[s] = false;
                }
            }
        }
        Ok(r)
    }
}

impl Drop for Cache {
    fn drop(&mut self) {
        self.state.lock().unwrap().stop = true;
        self.cv.notify_all();
    }
}

/// The eviction thread: woken when lld starts a segment or the uploader made some evictable.
fn evictor(cache: std::sync::Weak<Cache>) {
    loop {
        let Some(c) = cache.upgrade() else { return };
        let go = {
            let mut st = c.state.lock().unwrap();
            if !st.wake && !st.stop {
                // Woken, or once a second to let go of the cache (its owner may be gone).
                st = c.cv.wait_timeout(st, Duration::from_secs(1)).unwrap().0;
            }
            if st.stop {
                return;
            }
            std::mem::take(&mut st.wake)
        };
        if go {
            if let Err(e) = c.make_room(0) {
                eprintln!("ldfs: evicting from the cache: {e}");
            }
        }
    }
}

/// The cache device lld reads and writes: reads of segments the cache does not hold fetch
/// them first (see the module documentation).
pub struct CacheDevice(pub Arc<Cache>);

impl Device for CacheDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), DeviceError> {
        self.0.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), DeviceError> {
        self.0.write_at(buf, offset)
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
        self.0.discard(offset, len)
    }
}

/// A read-only view of a cache whose residency map lists segments it does not hold (fsck and
/// inspect of a store-backed file system's cache, while it is not mounted): a read of such a
/// segment is served from its object (fetched whole, its crc checked, the last few kept in
/// memory), never written into the cache. A missing or damaged object fails the read, naming
/// segment and key. Writes are refused.
pub struct ReadThroughDevice {
    dev: Arc<dyn Device>,
    store: Arc<dyn ObjectStore>,
    geo: Geometry,
    evicted: std::collections::BTreeMap<u32, SegmentEntry>,
    recent: Mutex<std::collections::VecDeque<(u32, Arc<Vec<u8>>)>>,
}

/// Segments a [`ReadThroughDevice`] keeps in memory.
const READ_THROUGH_KEPT: usize = 8;

impl ReadThroughDevice {
    /// The view of the cache on `dev` with its map at `map_path` (none: `dev` itself serves
    /// everything).
    pub fn open(
        dev: Arc<dyn Device>,
        store: Arc<dyn ObjectStore>,
        map_path: &Path,
    ) -> LayerResult<ReadThroughDevice> {
        let mut sb = vec![0u8; PAGE_BYTES];
        dev.read_at(&mut sb, 0)?;
        let geo = Geometry::decode_superblock(&sb, 0, dev.size_bytes()).map_err(|e| {
            LayerError::Corrupt {
                what: "cache device",
                key: "superblock".into(),
                detail: e.to_string(),
            }
        })?;
        let evicted = read_map(map_path, &geo)?
            .unwrap_or_default()
            .into_iter()
            .map(|e| (e.segment, e))
            .collect();
        Ok(ReadThroughDevice {
            dev,
            store,
            geo,
            evicted,
            recent: Mutex::new(Default::default()),
        })
    }

    /// The segments the cache does not hold, with their objects.
    pub fn evicted(&self) -> Vec<SegmentEntry> {
        self.evicted.values().copied().collect()
    }

    /// Fetches and checks the object of `e`.
    pub fn fetch(&self, e: &SegmentEntry) -> LayerResult<Arc<Vec<u8>>> {
        if let Some((_, b)) = self
            .recent
            .lock()
            .unwrap()
            .iter()
            .find(|r| r.0 == e.segment)
        {
            return Ok(b.clone());
        }
        let key = e.key();
        let b = self.store.get(&key)?;
        if b.len() != e.pages as usize * PAGE_BYTES || crc32c::crc32c(&b) != e.crc {
            return Err(LayerError::Corrupt {
                what: "segment object",
                key,
                detail: format!(
                    "segment {}: {} bytes with crc {:#x}; the cache's map names {} pages with \
                     crc {:#x}",
                    e.segment,
                    b.len(),
                    crc32c::crc32c(&b),
                    e.pages,
                    e.crc
                ),
            });
        }
        let b = Arc::new(b);
        let mut r = self.recent.lock().unwrap();
        if r.len() >= READ_THROUGH_KEPT {
            r.pop_front();
        }
        r.push_back((e.segment, b.clone()));
        Ok(b)
    }
}

impl Device for ReadThroughDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), DeviceError> {
        let len = buf.len() as u64;
        let mut done = 0u64;
        while done < len {
            let at = offset + done;
            let seg = self.geo.segment_of(at);
            let (n, entry) = match seg {
                Some(s) => {
                    let start = self.geo.page_addr(s, 0);
                    let n = (start + self.geo.segment_bytes() - at).min(len - done);
                    (n, self.evicted.get(&s.0).map(|e| (start, e)))
                }
                None => {
                    // Outside the segment area: up to where it starts, or the rest.
                    let first = self.geo.page_addr(SegmentId(0), 0);
                    let n = if at < first {
                        (first - at).min(len - done)
                    } else {
                        len - done
                    };
                    (n, None)
                }
            };
            let part = &mut buf[done as usize..(done + n) as usize];
            match entry {
                None => self.dev.read_at(part, at)?,
                Some((start, e)) => {
                    let b = self.fetch(e).map_err(|err| DeviceError::Io {
                        op: DeviceOp::Read,
                        offset: at,
                        len: n,
                        source: std::io::Error::other(format!(
                            "segment {} is not in the cache: {err}",
                            e.segment
                        )),
                    })?;
                    let from = (at - start) as usize;
                    let have = b.len().saturating_sub(from).min(part.len());
                    part[..have].copy_from_slice(&b[from..from + have]);
                    part[have..].fill(0);
                }
            }
            done += n;
        }
        Ok(())
    }
    fn write_at(&self, _buf: &[u8], offset: u64) -> Result<(), DeviceError> {
        Err(DeviceError::Io {
            op: DeviceOp::Write,
            offset,
            len: _buf.len() as u64,
            source: std::io::Error::other("a read-through view of a cache is read-only"),
        })
    }
    fn flush(&self) -> Result<(), DeviceError> {
        Ok(())
    }
    fn size_bytes(&self) -> u64 {
        self.dev.size_bytes()
    }
}

/// Bytes a bounded cache file holds beyond its segments: every page outside the segment area
/// (the superblocks, both checkpoint slots) and the two end-of-log pages a rebuild writes
/// (zeros) in segments it does not count.
pub fn metadata_allowance_bytes(geo: &Geometry) -> u64 {
    let segments = geo.segment_count as u64 * geo.segment_pages as u64;
    (geo.total_pages.saturating_sub(segments) + 2) * PAGE_BYTES as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geo() -> Geometry {
        let dev = crate::device::MemoryDevice::new(8 << 20);
        crate::lld::mkfs::mkfs(
            &dev,
            &crate::lld::layout::MkfsOptions {
                segment_bytes: 128 << 10,
                max_block_bytes: 32 << 10,
                reserved_segments: Some(4),
                fs_id: 77,
                max_bytes: None,
                kept_pages: 0,
            },
        )
        .unwrap();
        let mut sb = vec![0u8; PAGE_BYTES];
        dev.read_at(&mut sb, 0).unwrap();
        Geometry::decode_superblock(&sb, 0, dev.size_bytes()).unwrap()
    }

    #[test]
    fn the_map_round_trips_and_every_flipped_byte_is_caught() {
        let g = geo();
        let es = [
            SegmentEntry {
                segment: 3,
                pages: g.segment_pages,
                first_seq: 9,
                writer: 2,
                crc: 0xdead,
            },
            SegmentEntry {
                segment: 7,
                pages: g.segment_pages,
                first_seq: 12,
                writer: 1,
                crc: 0xbeef,
            },
        ];
        let b = encode_map(g.fs_id, &es);
        assert_eq!(decode_map("m", &g, &b).unwrap(), es);
        for i in 0..b.len() {
            let mut c = b.clone();
            c[i] ^= 0x10;
            assert!(decode_map("m", &g, &c).is_err(), "byte {i} flipped");
        }
        assert!(decode_map("m", &g, &b[..b.len() - 1]).is_err());
        let other = encode_map(g.fs_id + 1, &es);
        assert!(decode_map("m", &g, &other).is_err(), "another fs id");
        let mut partial = es;
        partial[0].pages -= 1;
        assert!(decode_map("m", &g, &encode_map(g.fs_id, &partial)).is_err());
    }
}
