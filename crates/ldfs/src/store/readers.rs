//! Read-only mounts beside the writer (issue 20): a reader pins the checkpoint object it
//! mounts, and the writer keeps that object and every segment object it names while the pin
//! lives, so the reader can fetch segments lazily (a bounded cache, a mount in seconds) instead
//! of downloading the file system whole before it mounts.
//!
//! A pin is the object `readers/OOOOOOOOOOOOOOOO` (a random owner per choice, hex): who holds
//! it (owner, pid, host), until when (the reader's wall clock plus the lease duration, renewed
//! every fifth of it), and the key of the checkpoint object it reads. DESIGN "Readers pin their
//! checkpoint" has the argument; in short:
//!
//! - The writer deletes a checkpoint object (and what only it names) after it put two newer
//!   ones, and lists the pins after the newer one's put and before any delete; a start's sweep
//!   lists them after the checkpoints it decides on.
//! - A reader puts its pin, then lists the checkpoint objects: if the one it chose is still
//!   among the newest two, no writer decided to delete it before the pin was there, and every
//!   later decision sees the pin. Otherwise it chooses again.
//! - Clocks: as the lease's (`store::lease`): the duration must dwarf the hosts' skew. A
//!   reader whose renewals fail past its expiry says so: the writer may then delete what it
//!   reads (EIO for the segments not in its cache); a remount reads the newest tree.

use std::collections::BTreeSet;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::cache::{Cache, CacheConfig};
use super::lease::Clock;
use super::segments::{
    decode_checkpoint_object, newest_slot_states, parse_checkpoint_key, CheckpointObject,
    LayerError, LayerResult, SegmentEntry,
};
use super::{ObjectStore, StoreError};
use crate::device::Device;
use crate::lld::layout::Geometry;
use crate::lld::usage::SegmentState;
use crate::lld::PAGE_BYTES;

pub const PIN_MAGIC: u64 = u64::from_le_bytes(*b"LDFSREAD");
pub const PIN_VERSION: u32 = 1;
/// Where the pins live.
pub const PIN_PREFIX: &str = "readers/";
const HOST_MAX: usize = 255;
const KEY_MAX: usize = 1024;
const P_MAGIC: usize = 0;
const P_VERSION: usize = 8;
const P_CRC: usize = 12;
const P_OWNER: usize = 16;
const P_EXPIRES: usize = 24;
const P_PID: usize = 32;
const P_HOST_LEN: usize = 36;
const P_KEY_LEN: usize = 40;
const P_HOST: usize = 44;

/// A reader's pin: FORMAT "Reader pins".
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PinRecord {
    /// Random per choice of the mount (the key's `O`: review 45 finding 1).
    pub owner: u64,
    /// Seconds since 1970 on the reader's clock.
    pub expires_secs: u64,
    pub pid: u32,
    pub host: String,
    /// The key of the checkpoint object the reader mounted.
    pub checkpoint: String,
}

impl PinRecord {
    pub fn encode(&self) -> Vec<u8> {
        let host = self.host.as_bytes();
        let key = self.checkpoint.as_bytes();
        assert!(host.len() <= HOST_MAX, "host name over {HOST_MAX} bytes");
        assert!(key.len() <= KEY_MAX, "checkpoint key over {KEY_MAX} bytes");
        let mut b = vec![0u8; P_HOST + host.len() + key.len()];
        b[P_MAGIC..P_MAGIC + 8].copy_from_slice(&PIN_MAGIC.to_le_bytes());
        b[P_VERSION..P_VERSION + 4].copy_from_slice(&PIN_VERSION.to_le_bytes());
        b[P_OWNER..P_OWNER + 8].copy_from_slice(&self.owner.to_le_bytes());
        b[P_EXPIRES..P_EXPIRES + 8].copy_from_slice(&self.expires_secs.to_le_bytes());
        b[P_PID..P_PID + 4].copy_from_slice(&self.pid.to_le_bytes());
        b[P_HOST_LEN..P_HOST_LEN + 4].copy_from_slice(&(host.len() as u32).to_le_bytes());
        b[P_KEY_LEN..P_KEY_LEN + 4].copy_from_slice(&(key.len() as u32).to_le_bytes());
        b[P_HOST..P_HOST + host.len()].copy_from_slice(host);
        b[P_HOST + host.len()..].copy_from_slice(key);
        let crc = super::lease::crc_with_hole(&b, P_CRC);
        b[P_CRC..P_CRC + 4].copy_from_slice(&crc.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<PinRecord, String> {
        if b.len() < P_HOST {
            return Err(format!("{} bytes, shorter than a reader pin", b.len()));
        }
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"));
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
        if u64_at(P_MAGIC) != PIN_MAGIC {
            return Err(format!("bad magic {:#x}", u64_at(P_MAGIC)));
        }
        if u32_at(P_VERSION) != PIN_VERSION {
            return Err(format!("version {}", u32_at(P_VERSION)));
        }
        let host_len = u32_at(P_HOST_LEN) as usize;
        let key_len = u32_at(P_KEY_LEN) as usize;
        if host_len > HOST_MAX || key_len > KEY_MAX || b.len() != P_HOST + host_len + key_len {
            return Err(format!(
                "host of {host_len} and key of {key_len} bytes in {} bytes",
                b.len()
            ));
        }
        if u32_at(P_CRC) != super::lease::crc_with_hole(b, P_CRC) {
            return Err("crc mismatch".into());
        }
        let key = &b[P_HOST + host_len..];
        Ok(PinRecord {
            owner: u64_at(P_OWNER),
            expires_secs: u64_at(P_EXPIRES),
            pid: u32_at(P_PID),
            host: String::from_utf8_lossy(&b[P_HOST..P_HOST + host_len]).into_owned(),
            checkpoint: String::from_utf8(key.to_vec())
                .map_err(|_| "checkpoint key is not UTF-8".to_string())?,
        })
    }
}

fn pin_key(owner: u64) -> String {
    format!("{PIN_PREFIX}{owner:016x}")
}

/// The pins in the store, as the writer sees them at `now_secs` (its clock).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Pins {
    /// Checkpoint keys a live pin names: kept with what they name.
    pub checkpoints: BTreeSet<String>,
    /// Keys of pins expired by `now_secs`: nothing kept for them.
    pub expired: Vec<String>,
    /// Pins listed that this writer may not read (refused: another user's object). Any
    /// checkpoint may be what one names, so while one is listed the writer keeps every
    /// checkpoint object and every object it does not know (review 43 finding 2).
    pub unreadable: Vec<String>,
}

/// Lists the pins. A pin that does not decode (damaged, or a newer version's) pins nothing
/// and is said on stderr: the cost of ignoring it is a reader's EIO, never the writer's data;
/// one deleted between the listing and its read (its reader unmounted) is skipped.
pub fn pins(store: &dyn ObjectStore, now_secs: u64) -> Result<Pins, StoreError> {
    let mut p = Pins::default();
    for o in store.list(PIN_PREFIX)? {
        let b = match store.get(&o.key) {
            Ok(b) => b,
            Err(StoreError::NotFound { .. }) => continue,
            Err(e) if e.is_transient() => return Err(e),
            // Refused (another user's object): failing here stopped the writer's uploads for
            // good (review 42 finding 3); pinning nothing let it delete under a live reader
            // (review 43 finding 2). It may name any checkpoint: the caller keeps them all.
            Err(e) => {
                eprintln!(
                    "ldfs: reader pin {}: {e}; every checkpoint object is kept while it is there",
                    o.key
                );
                p.unreadable.push(o.key);
                continue;
            }
        };
        match PinRecord::decode(&b) {
            Ok(r) if r.expires_secs >= now_secs => {
                p.checkpoints.insert(r.checkpoint);
            }
            Ok(_) => p.expired.push(o.key),
            Err(why) => eprintln!("ldfs: reader pin {}: {why}; it pins nothing", o.key),
        }
    }
    Ok(p)
}

/// The checkpoint objects live pins name that `known` (the writer's kept checkpoints) does not
/// hold, decoded, their keys first: a stale writer's late checkpoint, which lands after the
/// next writer's start listed the store and sorts among the newest two until that writer's
/// second upload, may be what a reader pins (review 42 finding 1). The writer keeps them, and
/// what they name, as it keeps its own. One gone since (its pin outlived it) or that does not
/// decode is skipped, said on stderr.
pub fn pinned_unknown(
    store: &dyn ObjectStore,
    pins: &Pins,
    known: impl Fn(&str) -> bool,
) -> Result<Vec<(String, CheckpointObject)>, StoreError> {
    let mut found = Vec::new();
    for key in pins.checkpoints.iter().filter(|k| !known(k)) {
        if parse_checkpoint_key(key).is_none() {
            eprintln!("ldfs: a reader pin names {key}, not a checkpoint key; it keeps nothing");
            continue;
        }
        let b = match store.get(key) {
            Ok(b) => b,
            Err(StoreError::NotFound { .. }) => continue,
            Err(e) => return Err(e),
        };
        match decode_checkpoint_object(key, &b) {
            Ok(obj) => found.push((key.clone(), obj)),
            Err(e) => eprintln!("ldfs: the pinned checkpoint object {key}: {e}; it keeps nothing"),
        }
    }
    Ok(found)
}

/// Which of `checkpoints` (checkpoint keys, oldest first) are kept: the newest two, and any a
/// live pin names.
pub fn retained(checkpoints: &[String], pins: &Pins) -> BTreeSet<String> {
    if !pins.unreadable.is_empty() {
        return checkpoints.iter().cloned().collect();
    }
    let newest_two = checkpoints.len().saturating_sub(2);
    checkpoints
        .iter()
        .enumerate()
        .filter(|(i, k)| *i >= newest_two || pins.checkpoints.contains(*k))
        .map(|(_, k)| k.clone())
        .collect()
}

/// How a reader holds its pin.
#[derive(Clone)]
pub struct PinOptions {
    /// How long one renewal lasts (the lease's duration, `-o lease=`).
    pub duration: Duration,
    pub clock: Clock,
    pub host: String,
    pub pid: u32,
}

struct PinState {
    /// The record as last put: none before the take's first pin.
    record: Option<PinRecord>,
    stop: bool,
    /// The take returned: the pin now keeps what this mount reads (lapses are said).
    serving: bool,
    /// The last renewal failed past the pin's expiry (said once per lapse).
    lapsed: bool,
    /// Every put since the record's checkpoint was first pinned landed before the one it
    /// replaced expired: no writer's decision meanwhile can have passed it over. A take
    /// returns its choice only while this holds (review 44 findings A and B).
    unbroken: bool,
    /// Owners of pin objects this take may have put and not deleted: each choice gets a key
    /// of its own (review 45 finding 1: a writer that listed a lapsed pin as expired deletes
    /// that key later, so a choice put again under it could vanish unseen). Release deletes
    /// them all (a put that failed may have landed).
    owners: Vec<u64>,
}

struct Keeper {
    store: Arc<dyn ObjectStore>,
    opts: PinOptions,
    state: Mutex<PinState>,
    cv: Condvar,
    /// Held across each put of the pin and the record's update after it, so a renewal never
    /// puts back a choice the take has moved on from.
    puts: Mutex<()>,
}

/// A pin this read-only mount holds, renewed by a thread of its own every fifth of the
/// duration from the take's first pin until [`ReaderPin::release`] or drop (both delete it: a
/// reader holds nothing the store lacks, so letting go early harms no one).
pub struct ReaderPin {
    k: Arc<Keeper>,
    checkpoint: String,
    thread: Mutex<Option<JoinHandle<()>>>,
}

/// How many times a reader chooses again before it gives up (each time the writer put two
/// checkpoint objects between its choice and its pin: a writer uploading every second or so).
const PIN_TRIES: usize = 20;

impl ReaderPin {
    /// Chooses the newest complete checkpoint object, pins it and checks the pin came in time
    /// (the module documentation); returns the pin and the checkpoint (its key first). The
    /// renewer runs from the first pin, so checks that take longer than the pin's duration (a
    /// large store lists slowly) keep it live (review 44 finding B). A take that fails leaves
    /// no pin behind (review 42 finding 2).
    pub fn take(
        store: Arc<dyn ObjectStore>,
        opts: PinOptions,
    ) -> LayerResult<(ReaderPin, String, CheckpointObject)> {
        let k = Arc::new(Keeper {
            store,
            opts,
            state: Mutex::new(PinState {
                record: None,
                stop: false,
                serving: false,
                lapsed: false,
                unbroken: false,
                owners: Vec::new(),
            }),
            cv: Condvar::new(),
            puts: Mutex::new(()),
        });
        let k2 = k.clone();
        let thread = std::thread::Builder::new()
            .name("ldfs-pin".into())
            .spawn(move || renewer(&k2))
            .expect("spawn pin thread");
        let mut pin = ReaderPin {
            k,
            checkpoint: String::new(),
            thread: Mutex::new(Some(thread)),
        };
        match choose_and_pin(&pin.k) {
            Ok((ckpt, obj)) => {
                pin.checkpoint = ckpt.clone();
                Ok((pin, ckpt, obj))
            }
            Err(e) => {
                // The pin may have landed though its put failed: deleted (errors ignored:
                // it expires on its own), and drop then does nothing more.
                let _ = pin.release();
                Err(e)
            }
        }
    }

    /// The checkpoint object this pin keeps.
    pub fn checkpoint(&self) -> &str {
        &self.checkpoint
    }

    /// The record as last put.
    pub fn record(&self) -> PinRecord {
        let st = self.k.state.lock().unwrap();
        // A ReaderPin is returned only once its take put a record.
        st.record.clone().expect("a taken pin has a record")
    }

    /// Renews now (tests; the thread renews on its own).
    pub fn renew_now(&self) -> Result<(), StoreError> {
        renew_once(&self.k)
    }

    /// Stops renewing and deletes the pin (the unmount). Idempotent.
    pub fn release(&self) -> Result<(), StoreError> {
        let was_stopped = {
            let mut st = self.k.state.lock().unwrap_or_else(|p| p.into_inner());
            std::mem::replace(&mut st.stop, true)
        };
        self.k.cv.notify_all();
        if let Some(t) = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = t.join();
        }
        if was_stopped {
            return Ok(());
        }
        // After any put in flight (`renew_now`), which, seeing `stop`, puts nothing more.
        let _p = self.k.puts.lock().unwrap_or_else(|p| p.into_inner());
        let owners = std::mem::take(
            &mut self
                .k
                .state
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .owners,
        );
        let mut first_err = None;
        for owner in owners {
            if let Err(e) = self.k.store.delete(&pin_key(owner)) {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }
}

impl Drop for ReaderPin {
    fn drop(&mut self) {
        if let Err(e) = self.release() {
            eprintln!(
                "ldfs: deleting the reader pin of {}: {e} (it expires on its own)",
                self.checkpoint
            );
        }
    }
}

/// `f` retried while the store answers "unavailable", up to `patience`.
fn patiently<T>(
    patience: Duration,
    mut f: impl FnMut() -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    let give_up = Instant::now() + patience;
    let mut wait = Duration::from_millis(50);
    loop {
        match f() {
            Err(e) if e.is_transient() && Instant::now() < give_up => {
                std::thread::sleep(wait);
                wait = (wait * 2).min(Duration::from_secs(2));
            }
            r => return r,
        }
    }
}

/// The checkpoint keys in the store, oldest first.
fn checkpoint_keys(store: &dyn ObjectStore, patience: Duration) -> Result<Vec<String>, StoreError> {
    Ok(patiently(patience, || store.list("ckpt/"))?
        .into_iter()
        .filter(|o| parse_checkpoint_key(&o.key).is_some())
        .map(|o| o.key)
        .collect())
}

/// [`ReaderPin::take`]'s choice. Each of the newest two checkpoint objects, newest first, is
/// pinned, then checked to be still among the newest two (else the store is listed again),
/// then whole (every object it names there: a stale writer's late checkpoint may name objects
/// a sweep deleted, and the one before it is then the file system). Completeness is checked
/// under the pin, so a writer uploading meanwhile cannot make every choice look incomplete
/// (review 42 finding 4: choosing first with `newest_complete_checkpoint`, whose listing of
/// every segment object takes seconds in a large store, failed beside a busy writer). The
/// keeper's renewer keeps the pin live while the checks run; a choice whose pin lapsed
/// meanwhile (every renewal failed past an expiry, or landed after it) may have been passed
/// over by a writer's delete round, so it is chosen again (review 43 finding 4, review 44
/// finding A).
fn choose_and_pin(k: &Keeper) -> LayerResult<(String, CheckpointObject)> {
    let store = &*k.store;
    let patience = k.opts.duration / 2;
    for _ in 0..PIN_TRIES {
        let listed = checkpoint_keys(store, patience)?;
        if listed.is_empty() {
            return Err(LayerError::Other(
                "the store holds no checkpoint object".into(),
            ));
        }
        for ckpt in listed.iter().rev().take(2) {
            pin_choice(k, ckpt, patience)?;
            let now = checkpoint_keys(store, patience)?;
            if !now.iter().rev().take(2).any(|c| c == ckpt) {
                break; // superseded before the pin: list again
            }
            let b = match patiently(patience, || store.get(ckpt)) {
                Ok(b) => b,
                Err(StoreError::NotFound { .. }) => break,
                Err(e) => return Err(e.into()),
            };
            let obj = decode_checkpoint_object(ckpt, &b)?;
            let present: BTreeSet<String> = patiently(patience, || store.list("seg/"))?
                .into_iter()
                .map(|o| o.key)
                .collect();
            if obj.entries.iter().all(|e| present.contains(&e.key())) {
                let held = {
                    let mut st = k.state.lock().unwrap();
                    let expires = st.record.as_ref().map_or(0, |r| r.expires_secs);
                    // Serving from here, under the same lock: a lapse after the check is
                    // said (review 46 note 1).
                    st.serving = st.unbroken && (k.opts.clock)() <= expires;
                    st.serving
                };
                if !held {
                    break; // lapsed during the checks: choose again
                }
                return Ok((ckpt.clone(), obj));
            }
        }
    }
    Err(LayerError::Other(format!(
        "no checkpoint object could be pinned whole in {PIN_TRIES} tries (a writer uploading \
         faster than the store lists, a pin that could not be kept live, or only incomplete \
         checkpoint objects): try again"
    )))
}

/// Pins `ckpt` under a key of its own (a fresh choice: the pin held unbroken from here), then
/// deletes the previous choice's pin.
fn pin_choice(k: &Keeper, ckpt: &str, patience: Duration) -> Result<(), StoreError> {
    let p = k.puts.lock().unwrap();
    let owner = rand::random::<u64>() | 1;
    k.state.lock().unwrap().owners.push(owner);
    let record = PinRecord {
        owner,
        expires_secs: (k.opts.clock)() + k.opts.duration.as_secs().max(1),
        pid: k.opts.pid,
        host: k.opts.host.clone(),
        checkpoint: ckpt.to_string(),
    };
    patiently(patience, || k.store.put(&pin_key(owner), &record.encode()))?;
    let landed = (k.opts.clock)();
    let previous = {
        let mut st = k.state.lock().unwrap();
        // Live by the writer's test (`pins`: expires >= now).
        st.unbroken = landed <= record.expires_secs;
        st.lapsed = false;
        st.record.replace(record).map(|r| r.owner)
    };
    // Renewals renew only the record's key from here: a slow delete need not hold them up
    // (review 46 note 2).
    drop(p);
    // A failed delete leaves a pin that keeps an older checkpoint until it expires, or until
    // release tries again.
    if let Some(old) = previous {
        if k.store.delete(&pin_key(old)).is_ok() {
            k.state.lock().unwrap().owners.retain(|&o| o != old);
        }
    }
    Ok(())
}

fn renew_once(k: &Keeper) -> Result<(), StoreError> {
    let _p = k.puts.lock().unwrap();
    let record = {
        let st = k.state.lock().unwrap();
        // Released: the pin is deleted, or being deleted (review 45 finding 4).
        if st.stop {
            return Ok(());
        }
        st.record.clone()
    };
    let Some(mut record) = record else {
        return Ok(()); // nothing pinned yet
    };
    let was = record.expires_secs;
    record.expires_secs = (k.opts.clock)() + k.opts.duration.as_secs().max(1);
    k.store.put(&pin_key(record.owner), &record.encode())?;
    // When it landed, not when it was sent: a put the store answered late may have landed
    // after the record it replaced expired (review 44 finding A).
    let landed = (k.opts.clock)();
    let mut st = k.state.lock().unwrap();
    if landed > was {
        // Expired before it landed, by the writer's test (`pins`: expires >= now; review 45
        // finding 3): a writer may have deleted objects meanwhile.
        st.unbroken = false;
        if st.serving {
            eprintln!(
                "ldfs: the reader pin on {} was renewed {} s after it expired: the writer may \
                 have deleted segments this read-only mount has not read yet (they then fail \
                 with EIO); a remount reads the store's newest tree",
                record.checkpoint,
                landed - was
            );
        }
    }
    st.lapsed = false;
    st.record = Some(record);
    Ok(())
}

/// Renews every fifth of the duration; a failure is tried again at the next tick, said once
/// when the pin has expired meanwhile.
fn renewer(k: &Keeper) {
    let tick = (k.opts.duration / 5).max(Duration::from_millis(100));
    loop {
        {
            let st = k.state.lock().unwrap();
            let st = k.cv.wait_timeout_while(st, tick, |s| !s.stop).unwrap().0;
            if st.stop {
                return;
            }
        }
        if let Err(e) = renew_once(k) {
            let mut st = k.state.lock().unwrap();
            let now = (k.opts.clock)();
            let Some(r) = st.record.clone() else { continue };
            if now > r.expires_secs && !st.lapsed {
                st.lapsed = true;
                if st.serving {
                    eprintln!(
                        "ldfs: the reader pin on {} expired and cannot be renewed ({e}): the \
                         writer may delete segments this read-only mount has not read yet",
                        r.checkpoint
                    );
                }
            }
        }
    }
}

/// The cache of a read-only mount of the checkpoint object `obj` its pin keeps, rebuilt by
/// `restore_lazy_of` on `dev`: segments are fetched as read (each whole, its crc checked) and,
/// with a bound, evicted least recently used first: every segment `obj` names in full is its
/// object, which the pin keeps in the store. Everything must then read through
/// `CacheDevice(cache)`.
pub fn open_reader_cache(
    store: Arc<dyn ObjectStore>,
    dev: Arc<dyn Device>,
    cfg: CacheConfig,
    obj: &CheckpointObject,
) -> LayerResult<Arc<Cache>> {
    let mut sb = vec![0u8; PAGE_BYTES];
    dev.read_at(&mut sb, 0)?;
    let geo =
        Geometry::decode_superblock(&sb, 0, dev.size_bytes()).map_err(|e| LayerError::Corrupt {
            what: "cache device",
            key: "superblock".into(),
            detail: e.to_string(),
        })?;
    if geo.fs_id != obj.geo.fs_id {
        return Err(LayerError::Other(format!(
            "the cache holds file system {:016x}; the pinned checkpoint is of {:016x}",
            geo.fs_id, obj.geo.fs_id
        )));
    }
    let holds = newest_slot_states(&*dev, &geo)?;
    let named: BTreeSet<String> = obj.entries.iter().map(|e| e.key()).collect();
    let cache = Cache::open(dev, store, geo, cfg, holds.as_deref(), &named)?;
    let full: Vec<SegmentEntry> = obj
        .entries
        .iter()
        .filter(|e| {
            e.pages == geo.segment_pages
                && holds
                    .as_ref()
                    .is_some_and(|st| st.get(e.segment as usize) == Some(&SegmentState::Dirty))
        })
        .copied()
        .collect();
    cache.set_evictable(&full);
    Ok(cache)
}

/// What a reader moving from the checkpoint object `old` to `new` on the same cache keeps
/// ([`super::segments::restore_lazy_keeping`]): the entries of `new` naming a segment in full
/// whose entry in `old` is the same (key, pages and crc: the same bytes) and which the cache
/// holds (`held`: [`Cache::held_segments`]). None if the layout differs (a resize moves
/// segments); the cache id in the superblock does not count.
pub fn unchanged_segments(
    old: &CheckpointObject,
    new: &CheckpointObject,
    held: &[u32],
) -> Vec<SegmentEntry> {
    // The layout, not whose cache wrote it: a checkpoint object carries its writer's cache's
    // superblock, whose id changes when a writer rebuilds its cache elsewhere (review 51).
    let layout = |g: &Geometry| Geometry { cache_id: 0, ..*g };
    if layout(&new.geo) != layout(&old.geo) {
        return Vec::new();
    }
    let full = new.geo.segment_pages;
    let held: BTreeSet<u32> = held.iter().copied().collect();
    let before: std::collections::BTreeMap<u32, SegmentEntry> = old
        .entries
        .iter()
        .filter(|e| e.pages == full)
        .map(|e| (e.segment, *e))
        .collect();
    new.entries
        .iter()
        .filter(|e| {
            e.pages == full && held.contains(&e.segment) && before.get(&e.segment) == Some(*e)
        })
        .copied()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemoryStore;

    /// What a refresh keeps: held, full, the same entry; across a writer's cache rebuilt
    /// elsewhere (another cache id in the superblock) too; nothing across another layout.
    #[test]
    fn unchanged_segments_are_the_held_full_equal_entries_of_one_layout() {
        let geo = Geometry::plan(
            8 << 20,
            &crate::lld::layout::MkfsOptions {
                segment_bytes: 128 << 10,
                max_block_bytes: 32 << 10,
                reserved_segments: Some(4),
                fs_id: 9,
                max_bytes: None,
                kept_pages: 0,
            },
        )
        .unwrap();
        let full = geo.segment_pages;
        let e = |segment: u32, pages: u32, crc: u32| SegmentEntry {
            segment,
            pages,
            first_seq: segment as u64 * 100,
            writer: 3,
            crc,
        };
        let obj = |geo: Geometry, entries: Vec<SegmentEntry>| CheckpointObject {
            writer: 3,
            serial: 1,
            geo,
            superblock: Vec::new(),
            slot: Vec::new(),
            entries,
        };
        let old = obj(
            geo,
            vec![e(1, full, 1), e(2, full, 2), e(3, full, 3), e(4, 5, 4)],
        );
        // 1 the same, 2 written again (another crc), 3 not held, 4 the old Active prefix now full.
        let new_entries = vec![e(1, full, 1), e(2, full, 22), e(3, full, 3), e(4, full, 4)];
        let held = [1, 2, 4];
        let new = obj(geo, new_entries.clone());
        assert_eq!(unchanged_segments(&old, &new, &held), vec![e(1, full, 1)]);
        let elsewhere = obj(
            Geometry {
                cache_id: geo.cache_id ^ 0x55,
                ..geo
            },
            new_entries.clone(),
        );
        assert_eq!(
            unchanged_segments(&old, &elsewhere, &held),
            vec![e(1, full, 1)]
        );
        let resized = obj(
            Geometry {
                segment_count: geo.segment_count + 8,
                ..geo
            },
            new_entries,
        );
        assert!(unchanged_segments(&old, &resized, &held).is_empty());
    }

    #[test]
    fn a_pin_record_round_trips_and_every_flipped_byte_is_refused() {
        let r = PinRecord {
            owner: 0x1234_5678_9abc_def1,
            expires_secs: 1_800_000_000,
            pid: 4242,
            host: "reader-host".into(),
            checkpoint: "ckpt/0000000000000003/0000000000000011".into(),
        };
        let b = r.encode();
        assert_eq!(PinRecord::decode(&b).unwrap(), r);
        for i in 0..b.len() {
            let mut c = b.clone();
            c[i] ^= 0x40;
            assert!(
                PinRecord::decode(&c).is_err(),
                "byte {i} flipped was accepted"
            );
        }
        assert!(PinRecord::decode(&b[..b.len() - 1]).is_err());
    }

    #[test]
    fn retained_keeps_the_newest_two_and_what_a_live_pin_names() {
        let ck: Vec<String> = (1..=5).map(|i| format!("ckpt/{i}")).collect();
        let none = Pins::default();
        assert_eq!(
            retained(&ck, &none),
            ["ckpt/4", "ckpt/5"].map(String::from).into()
        );
        let p = Pins {
            checkpoints: ["ckpt/2".to_string()].into(),
            ..Pins::default()
        };
        assert_eq!(
            retained(&ck, &p),
            ["ckpt/2", "ckpt/4", "ckpt/5"].map(String::from).into()
        );
    }

    #[test]
    fn pins_tells_live_from_expired_and_skips_a_damaged_one() {
        let s = MemoryStore::new();
        let rec = |owner: u64, expires_secs: u64, ck: &str| PinRecord {
            owner,
            expires_secs,
            pid: 1,
            host: "h".into(),
            checkpoint: ck.into(),
        };
        s.put(&pin_key(1), &rec(1, 100, "ckpt/a").encode()).unwrap();
        s.put(&pin_key(2), &rec(2, 99, "ckpt/b").encode()).unwrap();
        s.put(&pin_key(3), b"not a pin").unwrap();
        let p = pins(&s, 100).unwrap();
        assert_eq!(p.checkpoints, ["ckpt/a".to_string()].into());
        assert_eq!(p.expired, vec![pin_key(2)]);
    }
}
