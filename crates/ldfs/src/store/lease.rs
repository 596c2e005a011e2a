//! One writer at a time: a lease held in the store (issue 20).
//!
//! Lease objects are `lease/GGGGGGGGGGGGGGGG` (generation, hex); the newest one is the lease.
//! Taking, renewing and taking over all put the next generation with `If-None-Match: *`, so of
//! two writers racing for the same generation exactly one gets it (radosgw 16 honours the
//! condition: checked in `tests/store_s3.rs`). A holder that finds its next generation taken
//! has lost the lease and must stop writing. Clocks: expiry is the holder's wall clock plus the
//! duration; a taker compares it with its own clock, so the duration must be much longer than
//! the clock skew between hosts (minutes against NTP's milliseconds).
//!
//! Only the newest two generations are kept (older ones deleted by whoever puts a new one), so
//! a put can land in a generation deleted long ago (a holder back from a partition renewing):
//! each put lists the generations after it lands and has lost if a later one is there. A put
//! that finds its generation taken by its own owner (an earlier try whose answer was lost) has
//! it, with the landed record's expiry.

use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::{ObjectStore, PutOutcome, StoreError};

pub const LEASE_MAGIC: u64 = u64::from_le_bytes(*b"LDFSLEAS");
pub const LEASE_VERSION: u32 = 1;
const HOST_MAX: usize = 255;
const L_MAGIC: usize = 0;
const L_VERSION: usize = 8;
const L_CRC: usize = 12;
const L_OWNER: usize = 16;
const L_EXPIRES: usize = 24;
const L_PID: usize = 32;
const L_HOST_LEN: usize = 36;
const L_HOST: usize = 40;

/// Who holds the lease, and until when.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseRecord {
    /// Random per mount: tells a renewal of one's own lease from someone else's.
    pub owner: u64,
    /// Seconds since 1970 on the holder's clock.
    pub expires_secs: u64,
    pub pid: u32,
    pub host: String,
}

impl LeaseRecord {
    pub fn encode(&self) -> Vec<u8> {
        let host = self.host.as_bytes();
        assert!(host.len() <= HOST_MAX, "host name over {HOST_MAX} bytes");
        let mut b = vec![0u8; L_HOST + host.len()];
        b[L_MAGIC..L_MAGIC + 8].copy_from_slice(&LEASE_MAGIC.to_le_bytes());
        b[L_VERSION..L_VERSION + 4].copy_from_slice(&LEASE_VERSION.to_le_bytes());
        b[L_OWNER..L_OWNER + 8].copy_from_slice(&self.owner.to_le_bytes());
        b[L_EXPIRES..L_EXPIRES + 8].copy_from_slice(&self.expires_secs.to_le_bytes());
        b[L_PID..L_PID + 4].copy_from_slice(&self.pid.to_le_bytes());
        b[L_HOST_LEN..L_HOST_LEN + 4].copy_from_slice(&(host.len() as u32).to_le_bytes());
        b[L_HOST..].copy_from_slice(host);
        let crc = crc_with_hole(&b, L_CRC);
        b[L_CRC..L_CRC + 4].copy_from_slice(&crc.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<LeaseRecord, String> {
        if b.len() < L_HOST {
            return Err(format!("{} bytes, shorter than a lease", b.len()));
        }
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"));
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
        if u64_at(L_MAGIC) != LEASE_MAGIC {
            return Err(format!("bad magic {:#x}", u64_at(L_MAGIC)));
        }
        if u32_at(L_VERSION) != LEASE_VERSION {
            return Err(format!("version {}", u32_at(L_VERSION)));
        }
        let host_len = u32_at(L_HOST_LEN) as usize;
        if host_len > HOST_MAX || b.len() != L_HOST + host_len {
            return Err(format!("host of {host_len} bytes in {} bytes", b.len()));
        }
        if u32_at(L_CRC) != crc_with_hole(b, L_CRC) {
            return Err("crc mismatch".into());
        }
        Ok(LeaseRecord {
            owner: u64_at(L_OWNER),
            expires_secs: u64_at(L_EXPIRES),
            pid: u32_at(L_PID),
            host: String::from_utf8_lossy(&b[L_HOST..]).into_owned(),
        })
    }
}

/// The crc32c of `b` with its 4-byte crc field at `at` taken as zeros (lease and pin records).
pub(super) fn crc_with_hole(b: &[u8], at: usize) -> u32 {
    let c = crc32c::crc32c(&b[..at]);
    let c = crc32c::crc32c_append(c, &[0u8; 4]);
    crc32c::crc32c_append(c, &b[at + 4..])
}

/// Why a lease was not had.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    #[error(
        "the file system is mounted read-write by pid {} on {} (lease until {} s since 1970{})",
        .holder.pid, .holder.host, .holder.expires_secs,
        if *.expired { ", expired: --force-takeover takes it" } else { "" }
    )]
    Held { holder: LeaseRecord, expired: bool },
    /// Someone else put the next generation first (a race, or a takeover of ours).
    #[error("the lease was taken by another writer (generation {generation})")]
    Lost { generation: u64 },
    #[error("lease object {key}: {detail}")]
    Corrupt { key: String, detail: String },
    #[error(transparent)]
    Store(#[from] StoreError),
}

fn key(generation: u64) -> String {
    format!("lease/{generation:016x}")
}

/// A lease this process holds.
#[derive(Debug)]
pub struct Lease {
    pub generation: u64,
    pub record: LeaseRecord,
}

/// The newest lease object, if any: (generation, record).
pub fn current(store: &dyn ObjectStore) -> Result<Option<(u64, LeaseRecord)>, LeaseError> {
    let Some(newest) = store
        .list("lease/")?
        .into_iter()
        .filter_map(|o| {
            u64::from_str_radix(o.key.strip_prefix("lease/")?, 16)
                .ok()
                .map(|g| (g, o.key))
        })
        .max()
    else {
        return Ok(None);
    };
    let b = store.get(&newest.1)?;
    let rec = LeaseRecord::decode(&b).map_err(|detail| LeaseError::Corrupt {
        key: newest.1.clone(),
        detail,
    })?;
    Ok(Some((newest.0, rec)))
}

/// Takes the lease for `me` (its `expires_secs` set by the caller: now + duration): refused
/// naming the holder while another's lease stands; an expired one only with `force_takeover`.
/// `now_secs` is this host's clock.
pub fn acquire(
    store: &dyn ObjectStore,
    me: LeaseRecord,
    now_secs: u64,
    force_takeover: bool,
) -> Result<Lease, LeaseError> {
    acquire_over(store, me, now_secs, force_takeover).map(|(l, _)| l)
}

/// [`acquire`], with the record it took over: another holder's that was never released
/// (expired, taken with `force_takeover`), `None` when the lease was free (none yet, or
/// released). [`give_back`] puts that state back.
pub fn acquire_over(
    store: &dyn ObjectStore,
    me: LeaseRecord,
    now_secs: u64,
    force_takeover: bool,
) -> Result<(Lease, Option<LeaseRecord>), LeaseError> {
    let (generation, over) = match current(store)? {
        None => (1, None),
        Some((g, holder)) => {
            // Expiry 0: given up by `release`, free for anyone.
            if holder.owner != me.owner && holder.expires_secs != 0 {
                let expired = holder.expires_secs <= now_secs;
                if !(expired && force_takeover) {
                    return Err(LeaseError::Held { holder, expired });
                }
                (g + 1, Some(holder))
            } else {
                (g + 1, None)
            }
        }
    };
    Ok((put_next(store, generation, me)?, over))
}

/// Gives a lease taken a moment ago back in the state it was found in (a mount refused before
/// it wrote anything of its own, store5): released if it was free (`over` `None`), else
/// expired and not released, as `over` left it (its expiry, host and pid; this lease's owner,
/// so that `over`'s holder never takes the record for a renewal of its own): the next mount
/// then needs `--force-takeover` as it did before, at once. `over` from [`acquire_over`].
pub fn give_back(
    store: &dyn ObjectStore,
    lease: &Lease,
    over: Option<&LeaseRecord>,
) -> Result<(), LeaseError> {
    let Some(over) = over else {
        return release(store, lease);
    };
    let as_found = LeaseRecord {
        owner: lease.record.owner,
        ..over.clone()
    };
    let l = put_next(store, lease.generation + 1, as_found.clone())?;
    if l.record != as_found {
        // The generation held an earlier renewal of ours whose answer was lost: one more.
        put_next(store, l.generation + 1, as_found)?;
    }
    Ok(())
}

/// Extends a held lease to `expires_secs`; `Lost` if another writer took it meanwhile.
pub fn renew(
    store: &dyn ObjectStore,
    lease: &Lease,
    expires_secs: u64,
) -> Result<Lease, LeaseError> {
    let me = LeaseRecord {
        expires_secs,
        ..lease.record.clone()
    };
    put_next(store, lease.generation + 1, me)
}

/// Gives the lease up (a clean unmount): a next generation with expiry 0, which the next writer
/// takes without waiting or forcing.
pub fn release(store: &dyn ObjectStore, lease: &Lease) -> Result<(), LeaseError> {
    let l = renew(store, lease, 0)?;
    if l.record.expires_secs != 0 {
        // The generation held an earlier renewal of ours whose answer was lost: one more.
        renew(store, &l, 0)?;
    }
    Ok(())
}

/// Every lease generation in the store.
fn generations(store: &dyn ObjectStore) -> Result<Vec<u64>, LeaseError> {
    Ok(store
        .list("lease/")?
        .into_iter()
        .filter_map(|o| u64::from_str_radix(o.key.strip_prefix("lease/")?, 16).ok())
        .collect())
}

fn put_next(
    store: &dyn ObjectStore,
    generation: u64,
    me: LeaseRecord,
) -> Result<Lease, LeaseError> {
    let k = key(generation);
    let bytes = me.encode();
    let record = match store.put_if_absent(&k, &bytes)? {
        PutOutcome::Created => me,
        PutOutcome::Exists => {
            // Ours if an earlier try landed with its answer lost: the same owner (random per
            // mount), perhaps another expiry. The landed record is the lease: its expiry is
            // what a taker reads (review 31).
            match LeaseRecord::decode(&store.get(&k)?) {
                Ok(r) if r.owner == me.owner => r,
                _ => return Err(LeaseError::Lost { generation }),
            }
        }
    };
    // A later generation in the store means another writer took the lease and went on: this
    // put landed only because the generation it names was deleted (only the newest two are
    // kept), and it holds nothing (review 31: a holder back from a partition). Generations
    // below the one before this are deleted (best effort: a leftover is only an object).
    let all = generations(store)?;
    if let Some(&newest) = all.iter().max().filter(|&&g| g > generation) {
        return Err(LeaseError::Lost { generation: newest });
    }
    for g in all.into_iter().filter(|&g| g + 1 < generation) {
        let _ = store.delete(&key(g));
    }
    Ok(Lease { generation, record })
}

/// Seconds since 1970 by some clock: this host's ([`system_clock`]), or a test's.
pub type Clock = Arc<dyn Fn() -> u64 + Send + Sync>;

/// This host's wall clock.
pub fn system_clock() -> Clock {
    Arc::new(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    })
}

/// The longest a request to the store may take for a holder of a lease of `duration`: under
/// half of it (two fifths, at most 120 s), so that a request [`HeldLease::check`] let go
/// lands or times out before the lease can expire and be taken (review 31: a fixed 120 s
/// timeout under a 60 s lease let a stale writer's put land after a takeover).
pub fn request_timeout_for(duration: Duration) -> Duration {
    (duration * 2 / 5).min(Duration::from_secs(120))
}

/// The shortest lease a mount may ask for: its requests get two fifths of it
/// ([`request_timeout_for`]), 4 s, enough for a segment object to a nearby gateway.
pub const MIN_LEASE: Duration = Duration::from_secs(10);

/// How a mount holds its lease.
#[derive(Clone)]
pub struct LeaseOptions {
    /// How long one renewal lasts. A taker waits this long after a crashed holder's last
    /// renewal (then `--force-takeover`); it must dwarf the hosts' clock skew and exceed twice
    /// the store's request timeout (see [`HeldLease::check`] and [`request_timeout_for`]).
    pub duration: Duration,
    pub force_takeover: bool,
    pub clock: Clock,
}

impl Default for LeaseOptions {
    fn default() -> Self {
        LeaseOptions {
            duration: Duration::from_secs(300),
            force_takeover: false,
            clock: system_clock(),
        }
    }
}

impl std::fmt::Debug for LeaseOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseOptions")
            .field("duration", &self.duration)
            .field("force_takeover", &self.force_takeover)
            .finish_non_exhaustive()
    }
}

/// Why the holder may not write to the store now.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LeaseCheck {
    /// Too close to its expiry by this host's clock: a renewal is late (the store is
    /// unreachable or slow). Transient: the next renewal restores it, unless someone took it.
    #[error("lease generation {generation} expires at {expires_secs} s, now {now_secs} s: not renewed in time")]
    Expiring {
        generation: u64,
        expires_secs: u64,
        now_secs: u64,
    },
    /// Final: another writer holds it now, or it was released.
    #[error("lease lost: {0}")]
    Lost(String),
}

struct KeeperState {
    lease: Lease,
    lost: Option<String>,
    stop: bool,
    released: bool,
}

struct Keeper {
    store: Arc<dyn ObjectStore>,
    /// The unreleased record this lease took over (`--force-takeover`), if it did.
    over: Option<LeaseRecord>,
    opts: LeaseOptions,
    /// The generation taken at acquire: this mount's writer number (keys of its objects).
    writer: u64,
    state: Mutex<KeeperState>,
    cv: Condvar,
}

/// A lease this mount holds, renewed by a thread of its own every fifth of the duration until
/// [`HeldLease::release`] (a clean unmount), [`HeldLease::abandon`] (a simulated crash), or
/// drop (abandoned: it expires).
pub struct HeldLease {
    k: Arc<Keeper>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for HeldLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HeldLease(writer {})", self.k.writer)
    }
}

fn secs(d: Duration) -> u64 {
    d.as_secs().max(1)
}

impl HeldLease {
    /// Takes the lease (refused naming the holder, as [`acquire`]) for `host`/`pid` with a fresh
    /// random owner, and starts renewing it.
    pub fn acquire(
        store: Arc<dyn ObjectStore>,
        host: &str,
        pid: u32,
        opts: LeaseOptions,
    ) -> Result<HeldLease, LeaseError> {
        let owner = rand::random::<u64>() | 1;
        // A store that is down or slow now is retried for up to half the duration; a refusal
        // or a loss is final. A put that landed with its answer lost is found as ours by the
        // next try (same owner) and the generation after it taken.
        let give_up = Instant::now() + opts.duration / 2;
        let mut wait = Duration::from_millis(50);
        let (lease, over) = loop {
            let now = (opts.clock)();
            let me = LeaseRecord {
                owner,
                expires_secs: now + secs(opts.duration),
                pid,
                host: host.to_string(),
            };
            match acquire_over(&*store, me, now, opts.force_takeover) {
                Ok(l) => break l,
                Err(LeaseError::Store(e)) if e.is_transient() && Instant::now() < give_up => {
                    std::thread::sleep(wait);
                    wait = (wait * 2).min(Duration::from_secs(2));
                }
                Err(e) => return Err(e),
            }
        };
        let k = Arc::new(Keeper {
            store,
            over,
            writer: lease.generation,
            opts,
            state: Mutex::new(KeeperState {
                lease,
                lost: None,
                stop: false,
                released: false,
            }),
            cv: Condvar::new(),
        });
        let k2 = k.clone();
        let thread = std::thread::Builder::new()
            .name("ldfs-lease".into())
            .spawn(move || renewer(&k2))
            .expect("spawn lease thread");
        Ok(HeldLease {
            k,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// The generation this mount took at acquire: the writer part of its objects' keys,
    /// above every earlier writer's (generations only grow).
    pub fn writer(&self) -> u64 {
        self.k.writer
    }

    /// Now by the lease's clock, in seconds since 1970: what a reader's pin expiry is compared
    /// with (`store::readers`).
    pub fn now_secs(&self) -> u64 {
        (self.k.opts.clock)()
    }

    /// The newest generation and record this mount put.
    pub fn current(&self) -> (u64, LeaseRecord) {
        let st = self.k.state.lock().unwrap();
        (st.lease.generation, st.lease.record.clone())
    }

    /// Whether this mount may write to the store now: the lease not lost, and by this host's
    /// clock more than half its duration from expiry. The half is the fence against a taker:
    /// a request sent now lands (or times out) within the store's request timeout, which is
    /// below half the duration, so it lands before the lease expires and anyone may take it.
    pub fn check(&self) -> Result<(), LeaseCheck> {
        let st = self.k.state.lock().unwrap();
        if let Some(why) = &st.lost {
            return Err(LeaseCheck::Lost(why.clone()));
        }
        if st.released {
            return Err(LeaseCheck::Lost("released".into()));
        }
        let now = (self.k.opts.clock)();
        let margin = secs(self.k.opts.duration) / 2;
        if now + margin >= st.lease.record.expires_secs {
            return Err(LeaseCheck::Expiring {
                generation: st.lease.generation,
                expires_secs: st.lease.record.expires_secs,
                now_secs: now,
            });
        }
        Ok(())
    }

    /// Renews now (tests; the thread renews on its own).
    pub fn renew_now(&self) -> Result<(), LeaseError> {
        renew_once(&self.k)
    }

    fn stop_thread(&self) {
        self.k.state.lock().unwrap().stop = true;
        self.k.cv.notify_all();
        if let Some(t) = self.thread.lock().unwrap().take() {
            let _ = t.join();
        }
    }

    /// Gives the lease up (a clean unmount, after the last upload): the next writer takes it
    /// at once. Idempotent; after it, [`HeldLease::check`] fails.
    pub fn release(&self) -> Result<(), LeaseError> {
        self.stop_thread();
        let mut st = self.k.state.lock().unwrap();
        if st.released || st.lost.is_some() {
            st.released = true;
            return Ok(());
        }
        st.released = true;
        let r = release(&*self.k.store, &st.lease);
        if let Err(LeaseError::Lost { .. }) = &r {
            return Ok(());
        }
        r
    }

    /// Gives the lease back as it was found ([`give_back`]): a mount refused after taking it
    /// and before writing anything of its own (store5: it kept the lease until it expired,
    /// and the remedy's mount was refused, then needed `--force-takeover`). Stops renewing;
    /// after it, [`HeldLease::check`] fails. Returns what the next mount needs, for the
    /// refusal's message.
    pub fn give_back(&self) -> Result<String, LeaseError> {
        self.stop_thread();
        let mut st = self.k.state.lock().unwrap();
        if st.released || st.lost.is_some() {
            st.released = true;
            return Ok("the lease this mount took is no longer its own".into());
        }
        st.released = true;
        match give_back(&*self.k.store, &st.lease, self.k.over.as_ref()) {
            Ok(()) => {}
            // Another writer took the next generation meanwhile: not ours to give (review 41).
            Err(LeaseError::Lost { .. }) => {
                return Ok("another writer took the lease meanwhile: nothing was given back".into())
            }
            Err(e) => return Err(e),
        }
        Ok(match &self.k.over {
            None => {
                "the lease this mount took was given back: the next mount takes it at once".into()
            }
            Some(o) => format!(
                "the lease this mount took over was given back as it was found, expired and \
                 not released by pid {} on {} (whose cache may hold writes the store lacks): \
                 the next mount takes it with --force-takeover, at once",
                o.pid, o.host
            ),
        })
    }

    /// Stops renewing without releasing: what a crash leaves (tests), and what an unmount
    /// leaves whose final checkpoint is not in the store (the lease then expires).
    pub fn abandon(&self) {
        self.stop_thread();
        self.k.state.lock().unwrap().released = true;
    }
}

impl Drop for HeldLease {
    /// Stops renewing; never releases (review 32): a mount that ends any other way than
    /// through its final upload (an error, a panic) may leave its cache holding what the store
    /// lacks, and a released lease would let another machine mount the older tree without
    /// `--force-takeover`. The lease expires; [`HeldLease::release`] is the only release.
    fn drop(&mut self) {
        let released = {
            let st = self.k.state.lock().unwrap_or_else(|p| p.into_inner());
            st.released || st.lost.is_some()
        };
        if !released {
            eprintln!(
                "ldfs: the store lease (writer {}) is kept until it expires: this mount ended \
                 without uploading its final checkpoint",
                self.k.writer
            );
        }
        self.abandon();
    }
}

fn renew_once(k: &Keeper) -> Result<(), LeaseError> {
    let lease = {
        let st = k.state.lock().unwrap();
        if st.lost.is_some() {
            return Err(LeaseError::Lost {
                generation: st.lease.generation + 1,
            });
        }
        Lease {
            generation: st.lease.generation,
            record: st.lease.record.clone(),
        }
    };
    let expires = (k.opts.clock)() + secs(k.opts.duration);
    match renew(&*k.store, &lease, expires) {
        Ok(l) => {
            let mut st = k.state.lock().unwrap();
            st.lease = l;
            Ok(())
        }
        Err(e @ LeaseError::Lost { .. }) => {
            let mut st = k.state.lock().unwrap();
            st.lost = Some(e.to_string());
            k.cv.notify_all();
            Err(e)
        }
        Err(e) => Err(e),
    }
}

/// Renews every fifth of the duration (every second while renewals fail) until stopped or
/// lost; logs the first failure of a run of them and the loss.
fn renewer(k: &Keeper) {
    let every = k.opts.duration / 5;
    let mut failing = false;
    loop {
        {
            let st = k.state.lock().unwrap();
            let wait = if failing {
                every.min(Duration::from_secs(1))
            } else {
                every
            };
            let st = k.cv.wait_timeout_while(st, wait, |s| !s.stop).unwrap().0;
            if st.stop {
                return;
            }
        }
        match renew_once(k) {
            Ok(()) => {
                if failing {
                    eprintln!("ldfs: store lease renewed again");
                }
                failing = false;
            }
            Err(e @ LeaseError::Lost { .. }) => {
                eprintln!("ldfs: {e}: this mount stops writing to the store");
                return;
            }
            Err(e) => {
                if !failing {
                    eprintln!("ldfs: renewing the store lease failed (retrying): {e}");
                }
                failing = true;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemoryStore;

    fn rec(owner: u64, expires_secs: u64, host: &str) -> LeaseRecord {
        LeaseRecord {
            owner,
            expires_secs,
            pid: 42,
            host: host.to_string(),
        }
    }

    /// store5: a lease given back (a mount refused before it served) is as it was found: free
    /// when it was free, so the next writer takes it at once; expired and unreleased when it
    /// was taken over from such a holder, so the next writer still needs force (at once), and
    /// the refusal names the holder that left it.
    #[test]
    fn a_lease_given_back_is_as_it_was_found() {
        let s = MemoryStore::new();
        let (a, over) = acquire_over(&s, rec(1, 1_000, "alpha"), 900, false).unwrap();
        assert_eq!(over, None);
        give_back(&s, &a, over.as_ref()).unwrap();
        let (b, over) = acquire_over(&s, rec(2, 2_000, "beta"), 901, false).unwrap();
        assert_eq!(over, None, "a lease given back free is taken without force");
        // beta crashes (never releases); gamma takes it over after expiry, then gives it back.
        let (c, over) = acquire_over(&s, rec(3, 3_000, "gamma"), 2_001, true).unwrap();
        assert_eq!(over.as_ref(), Some(&b.record));
        give_back(&s, &c, over.as_ref()).unwrap();
        match acquire(&s, rec(4, 4_000, "delta"), 2_002, false) {
            Err(e @ LeaseError::Held { expired: true, .. }) => {
                assert!(e.to_string().contains("on beta"), "{e}");
            }
            other => panic!("expected an expired lease needing force, got {other:?}"),
        }
        // beta, back, cannot take the record for its own renewal: another owner's.
        assert!(matches!(renew(&s, &b, 5_000), Err(LeaseError::Lost { .. })));
        let (d, over) = acquire_over(&s, rec(4, 4_000, "delta"), 2_002, true).unwrap();
        assert_eq!(over.map(|o| o.host), Some("beta".to_string()));
        assert!(d.generation > c.generation);
    }

    #[test]
    fn one_writer_refusal_names_the_holder_takeover_only_after_expiry() {
        let s = MemoryStore::new();
        let a = acquire(&s, rec(1, 1_000, "alpha"), 900, false).unwrap();
        assert_eq!(a.generation, 1);
        // A second writer is refused while the lease stands, even with force.
        for force in [false, true] {
            match acquire(&s, rec(2, 2_000, "beta"), 950, force) {
                Err(e @ LeaseError::Held { expired: false, .. }) => {
                    let msg = e.to_string();
                    assert!(msg.contains("pid 42 on alpha"), "{msg}");
                }
                other => panic!("expected Held, got {other:?}"),
            }
        }
        // The holder renews.
        let a = renew(&s, &a, 1_100).unwrap();
        assert_eq!(a.generation, 2);
        // Expired: refused without force, saying how; taken with it.
        match acquire(&s, rec(2, 2_000, "beta"), 1_200, false) {
            Err(e @ LeaseError::Held { expired: true, .. }) => {
                assert!(e.to_string().contains("--force-takeover"))
            }
            other => panic!("expected an expired Held, got {other:?}"),
        }
        let b = acquire(&s, rec(2, 2_000, "beta"), 1_200, true).unwrap();
        assert_eq!(b.generation, 3);
        // The old holder finds out at its next renewal.
        assert!(matches!(
            renew(&s, &a, 1_300),
            Err(LeaseError::Lost { generation: 3 })
        ));
        // A clean release lets the next writer in at once; two generations are kept.
        release(&s, &b).unwrap();
        let c = acquire(&s, rec(3, 3_000, "gamma"), 1_250, false).unwrap();
        assert_eq!(c.generation, 5);
        assert_eq!(
            s.keys(),
            ["lease/0000000000000004", "lease/0000000000000005"]
        );
        assert_eq!(current(&s).unwrap().unwrap().1.host, "gamma");
    }

    #[test]
    fn a_lease_record_rejects_every_flipped_byte() {
        let b = rec(7, 123, "host-1").encode();
        assert_eq!(LeaseRecord::decode(&b).unwrap(), rec(7, 123, "host-1"));
        for i in 0..b.len() {
            let mut c = b.clone();
            c[i] ^= 0x10;
            assert!(LeaseRecord::decode(&c).is_err(), "byte {i}");
        }
        assert!(LeaseRecord::decode(&b[..b.len() - 1]).is_err());
    }
}
