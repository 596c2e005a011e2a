//! The engine: `Engine`, the log-structured Logical Disk, and `Lld`, which
//! owns an engine behind an `Arc` together with its background cleaner
//! thread (`cleaner`) and derefs to it.
//!
//! One mutex guards the in-memory state (map, usage table, open partial
//! segment, log head, ARUs). Sealing a partial segment queues it on the log
//! writer (`flight`) under that lock, so the log's order on disk is the
//! order operations were accepted. `flush` adds group commit on top:
//! callers that arrive while a device flush is running are covered by the
//! next one, which seals everything buffered by then (`docs/DESIGN.md`,
//! "Flush").
//!
//! Checkpoints run beside operations (`checkpointer`): the snapshot (seal,
//! map pages placed and queued on the log writer, slot encoded) is taken
//! under the lock; waiting for the writes, the device flushes and the slot
//! write happen without it; the release of emptied segments under it
//! again. One that an operation starts is finished by the checkpointer
//! thread, so no operation waits for the device because a checkpoint fell
//! due (callers such as the file system hold locks of their own).
//!
//! Invariants (asserted where cheap, checked by the crash tests):
//! - every map entry is on disk or BUFFERED in the open partial, never both;
//! - after `seal`, no entry is BUFFERED;
//! - a checkpoint's snapshot is taken only when no ARU that has logged
//!   anything is open, so a checkpoint never holds part of an ARU;
//! - at most one checkpoint is pending (snapshot taken, segments not yet
//!   released); what its slot names is queued on the log writer before
//!   anything sealed after the snapshot, so a later group commit makes it
//!   durable too;
//! - an aborted ARU's operations are taken back from the map (`undo` keeps
//!   what each open ARU changed) and it never ends in the log, so recovery
//!   drops whatever of it was written;
//! - a segment becomes Clean only after a checkpoint that no longer needs it
//!   is durable (the pending checkpoint's snapshot lists the segments it
//!   will release; none is reused before its slot is flushed);
//! - an operation is accepted only if the space it needs, with the reserve
//!   kept back for checkpoints and the cleaner, exists now, and with it the
//!   room for the checkpoint that must follow (every map page dirtied since
//!   the last one and those the operation, or an abort of it, may dirty):
//!   a long ARU gets
//!   NoSpace, never its end, the checkpoint or the next open (which may
//!   write the same map pages again);
//! - a user write is accepted only if live data stays within the capacity
//!   (`capacity_bytes`); within it, a write short of clean segments waits
//!   for the cleaner instead of failing.

use rustc_hash::FxHashMap;
use std::collections::VecDeque;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::checkpoint::{self, CheckpointHeader};
use super::checkpointer::{Checkpointer, PendingCheckpoint, Plan};
use super::cleaner::policy::UsageSnapshot;
use super::cleaner::{Background, CleanerOptions, CleanerState, LogClock, SpaceWait};
use super::flight::{Flight, Writer};
use super::layout::Geometry;
use super::map::{DirtySet, Map, MapRoot, PageReader, SharedPages};
use super::mkfs;
use super::recovery;
use super::snapshot::{self, SnapshotInfo, SnapshotRecord, MAX_SNAPSHOTS};
use super::summary::{self, Record, SummaryHeader};
use super::types::{entry_flags, Key, MapEntry, PagePtr, SegmentId, PAGE_BYTES};
use super::undo::Undo;
use super::usage::{SegmentState, SegmentUsage, Usage, PIN_BITS};
use super::writer::{self, Pending, PendingWrite, WRITE_RECORD_BYTES};
use crate::device::Device;
use crate::ld::{
    AruId, Compression, CorruptReason, Corruption, LdError, LdResult, ListHints, ListId, ListKind,
    LogicalDisk, SpaceStats, Temperature,
};

/// How an engine is opened and when it checkpoints.
#[derive(Clone, Debug)]
pub struct LldOptions {
    /// Never write: no recovery checkpoint, every mutation fails.
    pub read_only: bool,
    /// Open the tree of kept checkpoint `n` (a snapshot) instead of the
    /// current one: read-only (set `read_only` too), no roll-forward; may
    /// run beside a read-write engine on the same image in another process
    /// (docs/DESIGN.md "Snapshots").
    pub snapshot: Option<u64>,
    /// Memory budget of the block-number map.
    pub map_budget_bytes: usize,
    /// Checkpoint after this many bytes of log, so roll-forward stays short.
    pub checkpoint_log_bytes: u64,
    /// Checkpoint when this many map pages were dirtied since the last one
    /// (`None`: an eighth of the reserve, at least 64, at most what a
    /// checkpoint can write within its half of the reserve). Whatever the
    /// limit, admission keeps room for the checkpoint; a larger one only
    /// takes that room from operations.
    pub checkpoint_dirty_pages: Option<usize>,
    /// Seal the open partial segment once its data reaches this size.
    pub partial_bytes: usize,
    /// The segment cleaner: policy, watermarks, background thread.
    pub cleaner: CleanerOptions,
    /// Ignore both checkpoint slots and rebuild the map and the usage table
    /// from every summary on the device (fsck's repair of a damaged map or
    /// usage table; see `recovery::rebuild` for the method's limit).
    pub rebuild: bool,
    /// Finish the checkpoints that operations start on a thread of their
    /// own (the default). Off, such a checkpoint stays pending until
    /// something needs it finished (`Engine::finish_checkpoint`, the next
    /// checkpoint, a caller that waits for released segments, close): the
    /// crash simulation's deterministic mode, where power cuts land
    /// between a checkpoint's snapshot and its slot at seeded points.
    pub checkpoint_thread: bool,
    /// Write sealed partial segments on a log writer thread of their own
    /// (the default). Off, the thread that seals one writes it at once:
    /// with `checkpoint_thread` off too, the device sees every write in an
    /// order the caller alone decides, so a crash simulation's seed
    /// replays exactly.
    pub log_writer_thread: bool,
    /// Give segments back to the storage (`Device::discard`: a hole in an
    /// image file, BLKDISCARD) as checkpoints release them, once the slot
    /// that stops referencing them is durable (mount option `discard`).
    pub discard: bool,
    /// Told of every checkpoint once its slot is durable (the segment store
    /// layer, `store::segments`; docs/DESIGN.md "The segment store layer").
    pub checkpoint_hook: Option<CheckpointHook>,
    /// Told of every segment the log has left once all its writes returned
    /// (the segment store layer uploads it before a checkpoint names it).
    pub segment_hook: Option<SegmentHook>,
}

/// A checkpoint whose slot is durable on the device: everything the slot
/// names was written and flushed before it.
pub struct DurableCheckpoint<'a> {
    pub serial: u64,
    /// The slot as written (`checkpoint::decode` reads it).
    pub slot_bytes: &'a [u8],
    /// Segments this checkpoint releases right after the hook returns
    /// (discarded if the engine discards, then Clean in phase 3): from then
    /// on the log may reuse them.
    pub released: &'a [SegmentId],
    /// How many segments this engine had reported to `LldOptions::segment_hook` when the
    /// checkpoint's snapshot was taken: each of the first `segments_told` reports is of a
    /// segment this checkpoint or an earlier one names or releases (in that use); a report
    /// after them is of a segment the log left since, which it does not name (0 without a
    /// segment hook).
    pub segments_told: u64,
}

/// Called in a checkpoint's phase 2 right after the slot's second flush,
/// before the segments it releases are discarded or made Clean; no engine
/// lock is held, and checkpoints are told one at a time, in order. It must
/// only take note (no I/O, no engine calls).
#[derive(Clone)]
pub struct CheckpointHook(pub Arc<dyn Fn(&DurableCheckpoint<'_>) + Send + Sync>);

/// Called with a segment the log head left, once every write of that use of
/// it has returned from the device (not yet flushed), by the thread whose
/// write completed it: the log writer's, or one writing its own items (a
/// flush leader, the checkpointer's phase 2, an operation holding the engine
/// lock); it must only take note. A panic is caught and ends the reports
/// (logged): the engine goes on, its checkpoints naming every segment. Its bytes then stay as they are until a
/// checkpoint releases the segment, and that checkpoint's
/// [`CheckpointHook`] call comes after this one: a segment the log left
/// before a checkpoint's snapshot is not reported after it (that
/// checkpoint names it, or releases it), so the hook never hears of a use
/// a release already ended. Segments left inside a checkpoint's own
/// writing (its map pages) are named by it and not reported.
#[derive(Clone)]
pub struct SegmentHook(pub Arc<dyn Fn(SegmentId) + Send + Sync>);

impl std::fmt::Debug for SegmentHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SegmentHook")
    }
}

impl std::fmt::Debug for CheckpointHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CheckpointHook")
    }
}

impl Default for LldOptions {
    fn default() -> Self {
        LldOptions {
            read_only: false,
            snapshot: None,
            map_budget_bytes: 64 << 20,
            checkpoint_log_bytes: 256 << 20,
            checkpoint_dirty_pages: None,
            partial_bytes: 1 << 20,
            cleaner: CleanerOptions::default(),
            rebuild: false,
            checkpoint_thread: true,
            log_writer_thread: true,
            discard: false,
            checkpoint_hook: None,
            segment_hook: None,
        }
    }
}

/// Counters for tests, `inspect` and benchmarks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EngineStats {
    pub partials_written: u64,
    pub checkpoints: u64,
    pub map_pages_written: u64,
    pub device_flushes: u64,
    /// Partial segments applied by roll-forward at open.
    pub rolled_forward: u64,
    /// Whether open had to rebuild from every summary (both slots bad).
    pub rebuilt: bool,
    /// Blocks the cleaner moved since open.
    pub blocks_moved: u64,
    /// Segments made Clean by checkpoints since open (emptied by the
    /// cleaner or by overwrites and deletes).
    pub segments_released: u64,
    /// Buffered writes (of ended ARUs, of none, or the cleaner's moves)
    /// dropped because a later ARU's write of the same block ended in the
    /// same partial segment.
    pub writes_coalesced: u64,
    /// Segments given back to the storage (`discard`, `trim`) since open.
    pub segments_discarded: u64,
    /// Bytes given to `write` for lists whose compression is not off,
    /// since open (each block's length before compression).
    pub compress_logical_bytes: u64,
    /// What those blocks take in the log (compressed or plain).
    pub compress_stored_bytes: u64,
    /// Blocks of such lists stored compressed, and stored plain because
    /// compression did not pay.
    pub compress_blocks_compressed: u64,
    pub compress_blocks_plain: u64,
    /// Cold blocks the cleaner stored anew with `recompress_cold`'s level,
    /// and the bytes that saved.
    pub blocks_recompressed: u64,
    pub recompress_bytes_saved: u64,
}

/// What open found, for `inspect` and tests.
#[derive(Clone, Debug, Default)]
pub struct OpenReport {
    pub checkpoint_slot: Option<usize>,
    pub checkpoint_errors: Vec<String>,
    /// Slots that could not be used: they did not decode, their map root
    /// failed its checksum, or roll-forward from them met an inconsistency.
    pub failed_slots: Vec<usize>,
    pub rolled_forward: u64,
    /// Why roll-forward stopped, if not at a clean end of the log.
    pub stopped: Option<String>,
    /// Partials of map pages that ended the log (a checkpoint cut short):
    /// not replayed, written over.
    pub unfinished_checkpoint_partials: u64,
    pub rebuilt: bool,
    /// Snapshots the newest slot kept that a rebuild dropped.
    pub snapshots_dropped: usize,
}

/// The log head.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LogHead {
    pub seg: SegmentId,
    /// Next free page in `seg`.
    pub page: u32,
    /// The segment the log continues in; equal to `seg` when none is chosen.
    pub next: SegmentId,
    /// Sequence of the next partial segment.
    pub seq: u64,
    pub epoch: u64,
    /// Segments the head has entered since recovery began (roll-forward
    /// counts too): the cleaner's clock for telling hot segments from cold
    /// ones (`LogClock`); not persisted.
    pub entered: u64,
}

#[derive(Default)]
struct AruState {
    /// Records logged in this ARU.
    ops: u64,
    /// Reserved bytes not yet used.
    reserved: u64,
    /// Writes in the open partial that this ARU's writes replaced but could
    /// not drop yet (another ARU's, or one of no ARU): dropped at this ARU's
    /// end if its end record joins them in the same partial (`end_aru`).
    superseded: Vec<Superseded>,
}

/// A buffered write an open ARU's write replaced.
struct Superseded {
    /// The partial segment (its sequence number) the write is buffered in.
    seq: u64,
    slot: usize,
    key: Key,
    /// The replaced write's ARU (0: none).
    aru: u64,
}

/// Space class of an operation: user writes keep the whole reserve free;
/// deletes, ARU ends and list creation may dip into half of it, so that
/// freeing space is always possible on a full device; the cleaner's moves
/// dip into that half too, but pay for the checkpoint that follows them out
/// of it, so that after it deletes still find their room (a move frees
/// nothing until its victim is emptied and a checkpoint releases it).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Class {
    User,
    Meta,
    Clean,
}

pub(crate) struct Inner {
    pub map: Map,
    pub usage: Usage,
    pub log: LogHead,
    /// Where the head was, for telling hot victims from cold ones.
    pub clock: LogClock,
    pub serial: u64,
    pub next_list: u64,
    pub user_bytes: u64,
    pub moved_bytes: u64,
    pending: Pending,
    arus: FxHashMap<u64, AruState>,
    /// What the open ARUs changed (`abort_aru` takes one back).
    undo: Undo,
    /// ARU ids are never reused while open: a later end record can never
    /// adopt an aborted ARU's records (each open starts a new epoch, and
    /// roll-forward reads only the newest epoch).
    next_aru: u64,
    /// Open ARUs that have logged something; checkpoints wait for 0.
    open_nonempty: usize,
    /// Threads waiting on `aru_cv` for `open_nonempty` to reach 0: ending
    /// the last ARU notifies only when there are some (a notify is a
    /// system call, and ARUs end on every operation).
    aru_waiters: usize,
    /// Operations accepted so far (flush targets).
    op_seq: u64,
    /// Foreground cleaning steps pause until `op_seq` reaches this (set
    /// when a step found nothing to clean).
    clean_futile_until: u64,
    log_bytes_since_checkpoint: u64,
    hints: FxHashMap<u64, ListHints>,
    failed: Option<String>,
    closed: bool,
    stats: EngineStats,
    /// The log writer thread (`None` once stopped).
    writer: Option<Writer>,
    /// The checkpoint between its snapshot (phase 1) and its release
    /// (phase 3), if one is (`checkpointer`); at most one at a time.
    ckpt: Option<Arc<PendingCheckpoint>>,
    /// The kept checkpoints, by number, as the next slot will record them.
    snapshots: Vec<SnapshotRecord>,
    /// A change to the table that the next checkpoint's snapshot point
    /// makes (set and consumed under one lock hold).
    snap_change: Option<SnapChange>,
    /// `LldOptions::checkpoint_hook`.
    checkpoint_hook: Option<CheckpointHook>,
    /// `Engine::geo` as of now, for code holding the lock: the per-write
    /// admission arithmetic read it through the `RwLock` about fifteen
    /// times per operation, a shared cache line bounced between cores
    /// (6% of a metadata workload's daemon time, issue 16).
    geo: Geometry,
}

/// A change to the snapshot table, made at a checkpoint's snapshot point.
enum SnapChange {
    Take {
        name: String,
        time_secs: u64,
        protected: bool,
        /// A protected checkpoint's generation window (seconds; 0 = none):
        /// see `Engine::take_protected`.
        window_secs: u64,
    },
    /// Kept checkpoints deleted in one checkpoint (a generation at once).
    Delete(Vec<u64>),
}

/// The engine's state and logic. [`Lld`] owns one behind an `Arc`, so the
/// background cleaner thread can share it.
pub struct Engine {
    dev: Arc<dyn Device>,
    /// Changes only in `grow`, under the state lock (a resize, issue 17):
    /// read it through `geo()`, or as `Inner::geo` while holding the lock.
    geo: std::sync::RwLock<Geometry>,
    /// `geo().max_block_bytes`, which no resize changes: read on every
    /// block read and write without the lock.
    max_block_bytes: u32,
    opts: LldOptions,
    /// Shared with the checkpointer thread, which finishes checkpoints.
    inner: Arc<Mutex<Inner>>,
    /// Held while a device flush runs; callers queue here (group commit).
    /// Whether a group-commit leader is flushing now; waiters sleep on
    /// `commit_cv` and return once `durable_op` covers them.
    committing: Mutex<bool>,
    commit_cv: Condvar,
    /// Operations made durable by the last completed flush.
    durable_op: Arc<AtomicU64>,
    /// Sealed partial segments not yet written.
    flight: Arc<Flight>,
    /// With `LldOptions::segment_hook`: the segments left it has not been
    /// told of yet.
    left: Option<Arc<LeftSegments>>,
    report: OpenReport,
    /// Held for a whole cleaning pass (one cleaner at a time); holds the
    /// policy and the cleaner's counters.
    pub(crate) cleaner: Mutex<CleanerState>,
    /// Signalled when the last open ARU that logged something ends, so a
    /// cleaner waiting to checkpoint can go on.
    aru_cv: Condvar,
    /// Calls through the `LogicalDisk` interface (the background cleaner's
    /// idleness test).
    pub(crate) activity: AtomicU64,
    /// Finishes checkpoints that operations start (`None`: read-only, or
    /// stopped by drop).
    checkpointer: Mutex<Option<Checkpointer>>,
    /// `dirty_page_limit`, computed once.
    dirty_limit: usize,
    /// Log pages of the checkpoint the lower half of the reserve holds
    /// (`floor_pages`): one at `dirty_limit`, from anywhere, but at most
    /// that half less the margin.
    checkpoint_share: i64,
    /// Kept checkpoints (snapshots, protected ones) deleted since open,
    /// by any caller: read without a lock by those deciding whether a
    /// deletion happened since they last looked (`kept_deleted`).
    kept_deleted: AtomicU64,
}

/// Reads map pages for the map, checking each against its pointer's crc.
/// A page a checkpoint placed but the log writer has not yet written is
/// read from `flight` (its leaf may be evicted and needed again meanwhile).
pub(crate) struct DevPages<'a> {
    pub dev: &'a dyn Device,
    pub flight: Option<&'a Flight>,
}

impl PageReader for DevPages<'_> {
    fn read_page(&self, ptr: PagePtr) -> LdResult<Vec<u8>> {
        let b = match self.flight.and_then(|f| f.read(ptr.addr, PAGE_BYTES)) {
            Some(b) => b,
            None => {
                let mut b = vec![0u8; PAGE_BYTES];
                self.dev.read_at(&mut b, ptr.addr)?;
                b
            }
        };
        let got = crc32c::crc32c(&b);
        if got != ptr.crc {
            return Err(LdError::Corrupt(Corruption {
                what: "map page",
                offset: ptr.addr,
                reason: CorruptReason::BadChecksum {
                    expected: ptr.crc,
                    got,
                },
            }));
        }
        Ok(b)
    }
}

const HINTS_CACHE_LIMIT: usize = 1 << 16;
/// How long a resize waits for open ARUs to end before its checkpoint.
const RESIZE_ARU_WAIT: Duration = Duration::from_secs(10);
/// Rounds of moving data out of the segments a shrink cuts off (one
/// usually does; map pages a full checkpoint had no room for take more).
const SHRINK_ROUNDS: usize = 8;
const HINTS_BYTES: usize = 16;

pub(crate) fn encode_hints(h: &ListHints) -> Vec<u8> {
    let mut b = vec![0u8; HINTS_BYTES];
    b[0] = match h.kind {
        ListKind::Data => 0,
        ListKind::Metadata => 1,
    };
    b[1] = match h.temperature {
        Temperature::Warm => 0,
        Temperature::Hot => 1,
        Temperature::Cold => 2,
    };
    // Byte 2 was 0/1 (off/lz4) before zstd; those keep their meaning.
    (b[2], b[3]) = match h.compress {
        Compression::Off => (0, 0),
        Compression::Lz4 => (1, 0),
        Compression::Zstd { level } => (2, level),
    };
    b[8..16].copy_from_slice(&h.near.map_or(0, |l| l.0).to_le_bytes());
    b
}

fn decode_hints(b: &[u8], offset: u64) -> LdResult<ListHints> {
    let bad = || {
        LdError::Corrupt(Corruption {
            what: "list hints",
            offset,
            reason: CorruptReason::Inconsistent(format!("{} bytes: {:?}", b.len(), b)),
        })
    };
    if b.len() != HINTS_BYTES {
        return Err(bad());
    }
    let kind = match b[0] {
        0 => ListKind::Data,
        1 => ListKind::Metadata,
        _ => return Err(bad()),
    };
    let temperature = match b[1] {
        0 => Temperature::Warm,
        1 => Temperature::Hot,
        2 => Temperature::Cold,
        _ => return Err(bad()),
    };
    let compress = match (b[2], b[3]) {
        (0, 0) => Compression::Off,
        (1, 0) => Compression::Lz4,
        (2, level)
            if (Compression::ZSTD_LEVEL_MIN..=Compression::ZSTD_LEVEL_MAX).contains(&level) =>
        {
            Compression::Zstd { level }
        }
        _ => return Err(bad()),
    };
    let near = u64::from_le_bytes(b[8..16].try_into().unwrap());
    Ok(ListHints {
        kind,
        temperature,
        compress,
        near: (near != 0).then_some(ListId(near)),
    })
}

/// The key range holding every block of `list`.
fn list_range(list: u64) -> (Key, Key) {
    let from = Key { list, index: 0 };
    let to = if list == u64::MAX {
        Key::MAX
    } else {
        Key {
            list: list + 1,
            index: 0,
        }
    };
    (from, to)
}

impl Engine {
    /// Opens a formatted device: see [`Lld::open`].
    fn open(dev: Arc<dyn Device>, opts: LldOptions) -> LdResult<Engine> {
        if opts.snapshot.is_some() && !opts.read_only {
            return Err(LdError::InvalidArgument(
                "a snapshot can only be opened read-only".into(),
            ));
        }
        // Flushes on the checkpointer thread and group commits' own report
        // failures in the order they began (see `flushes`).
        let dev: Arc<dyn Device> = Arc::new(super::flushes::OrderedFlushes::new(dev));
        let (sb_geo, _sb_errors) = mkfs::read_superblock(&*dev)?;
        let recovered = recovery::recover(&*dev, &sb_geo, &opts)?;
        let geo = if opts.read_only {
            recovered.geo
        } else {
            super::resize::settle_superblocks(&*dev, recovered.geo)?
        };
        let stats = EngineStats {
            rolled_forward: recovered.report.rolled_forward,
            rebuilt: recovered.report.rebuilt,
            ..Default::default()
        };
        // Until the clock has run a span, cold is estimated from the ages
        // of the segments holding data.
        let clock = LogClock::new(geo.segment_count, recovered.log.entered, recovered.log.seq)
            .seeded(
                recovered
                    .usage
                    .iter()
                    .filter(|(_, u)| u.state == SegmentState::Dirty)
                    .map(|(_, u)| u.last_seq)
                    .collect(),
            );
        let inner = Inner {
            map: recovered.map,
            usage: recovered.usage,
            clock,
            log: recovered.log,
            serial: recovered.serial,
            next_list: recovered.next_list,
            user_bytes: recovered.user_bytes,
            moved_bytes: recovered.moved_bytes,
            pending: Pending::default(),
            arus: FxHashMap::default(),
            undo: Undo::default(),
            next_aru: 1,
            open_nonempty: 0,
            aru_waiters: 0,
            op_seq: 0,
            clean_futile_until: 0,
            log_bytes_since_checkpoint: 0,
            hints: FxHashMap::default(),
            failed: None,
            closed: false,
            stats,
            writer: None,
            ckpt: None,
            snapshots: recovered.snapshots,
            snap_change: None,
            checkpoint_hook: opts.checkpoint_hook.clone(),
            geo,
        };
        let flight = Arc::new(Flight::default());
        let left = opts
            .segment_hook
            .clone()
            .filter(|_| !opts.read_only)
            .map(|hook| {
                let left = Arc::new(LeftSegments {
                    hook,
                    queue: Mutex::new(LeftQueue::default()),
                });
                let l = left.clone();
                flight.set_on_written(Box::new(move |written| l.tell(written)));
                left
            });
        let opts_policy = opts.cleaner.policy;
        let opts_dirty_limit = opts
            .checkpoint_dirty_pages
            .unwrap_or_else(|| default_dirty_limit(&geo));
        let mut inner = inner;
        if !opts.read_only {
            inner.writer = Some(if opts.log_writer_thread {
                flight.start(dev.clone())
            } else {
                flight.start_inline(dev.clone())
            });
        }
        let inner = Arc::new(Mutex::new(inner));
        let durable_op = Arc::new(AtomicU64::new(0));
        let checkpointer = (!opts.read_only && opts.checkpoint_thread).then(|| {
            let (dev, flight, inner, durable_op) = (
                dev.clone(),
                flight.clone(),
                inner.clone(),
                durable_op.clone(),
            );
            Checkpointer::start(move |p| {
                let res = p.write(&*dev, &flight);
                // Poisoned: a panic elsewhere already stopped the engine.
                if let Ok(mut g) = inner.lock() {
                    // A failure is recorded in the state (read-only).
                    let _ = apply_checkpoint(&mut g, &p, res, &durable_op);
                }
            })
        });
        let lld = Engine {
            dev,
            geo: std::sync::RwLock::new(geo),
            max_block_bytes: geo.max_block_bytes,
            opts,
            inner,
            committing: Mutex::new(false),
            commit_cv: Condvar::new(),
            durable_op,
            flight,
            left,
            report: recovered.report,
            cleaner: Mutex::new(CleanerState::new(opts_policy)),
            aru_cv: Condvar::new(),
            activity: AtomicU64::new(0),
            checkpointer: Mutex::new(checkpointer),
            dirty_limit: opts_dirty_limit,
            checkpoint_share: checkpoint_share(&geo, opts_dirty_limit),
            kept_deleted: AtomicU64::new(0),
        };
        if !lld.opts.read_only {
            let mut g = lld.lock();
            g.log.epoch += 1;
            if g.log.next == g.log.seg {
                let Inner { usage, log, .. } = &mut *g;
                choose_next(usage, log);
            }
            lld.checkpoint(&mut g)?;
        }
        Ok(lld)
    }

    /// The geometry now (its segment count changes when a grow commits).
    pub fn geometry(&self) -> Geometry {
        self.geo()
    }

    fn geo(&self) -> Geometry {
        *self.geo.read().expect("geometry poisoned")
    }

    /// The device's size in bytes now (a grow changes it).
    pub fn device_bytes(&self) -> u64 {
        self.dev.size_bytes()
    }

    pub(crate) fn device(&self) -> &dyn Device {
        &*self.dev
    }

    /// The map's page reader: the device, and the log writer's queue first.
    pub(crate) fn pages(&self) -> DevPages<'_> {
        DevPages {
            dev: &*self.dev,
            flight: Some(&self.flight),
        }
    }

    /// Waits until every sealed partial segment is on the device (so reads
    /// of the device see the whole log); fails the engine if one cannot be.
    pub(crate) fn drain_flight(&self) -> LdResult<()> {
        if let Err(e) = self.flight.drain() {
            let mut g = self.lock();
            return Err(self.fail(&mut g, drain_error(e)));
        }
        Ok(())
    }

    pub fn open_report(&self) -> &OpenReport {
        &self.report
    }

    pub fn stats(&self) -> EngineStats {
        self.lock().stats
    }

    /// The segment usage table (the cleaner's input).
    pub fn segment_usage(&self) -> Vec<(SegmentId, SegmentUsage)> {
        self.lock().usage.iter().collect()
    }

    /// Times live-byte accounting disagreed with the map (0 on a sound image).
    pub fn accounting_drift(&self) -> u64 {
        self.lock().usage.drift()
    }

    /// Gives every Clean segment back to the storage (`ldfs trim`, what
    /// fstrim does): a Clean segment holds nothing a durable checkpoint
    /// needs. Each is discarded under the state lock, so the log cannot
    /// choose it meanwhile; others run between segments. Returns the
    /// segments and bytes discarded, 0 when the device cannot discard.
    pub fn trim(&self) -> LdResult<(u64, u64)> {
        if self.opts.read_only {
            return Err(LdError::ReadOnly("opened read-only".into()));
        }
        let clean: Vec<SegmentId> = {
            let g = self.lock();
            g.usage
                .iter()
                .filter(|(_, u)| u.state == SegmentState::Clean)
                .map(|(s, _)| s)
                .collect()
        };
        let (mut segs, mut bytes) = (0, 0);
        for s in clean {
            let mut g = self.lock_writable()?;
            if g.usage.get(s).state != SegmentState::Clean {
                continue; // taken by the log since
            }
            let (offset, len) = (self.geo().page_addr(s, 0), self.geo().segment_bytes());
            match self.dev.discard(offset, len) {
                Ok(true) => {
                    g.stats.segments_discarded += 1;
                    segs += 1;
                    bytes += len;
                }
                Ok(false) => break,
                Err(e) => return Err(e.into()),
            }
        }
        Ok((segs, bytes))
    }

    // ---- resize (issue 17; docs/DESIGN.md "Resize", `lld::resize`) -------

    /// Grows the engine to `count` segments, which the device already holds
    /// (the caller extended it and wrote superblock copy 1 at its new end).
    /// They are appended Clean but fenced off (`Usage::grow`), and a whole
    /// checkpoint is written while the state lock is held: that slot, the
    /// first to record them, is the commit point. The fence is lifted only
    /// once it is durable, so no summary names a new segment as the log's
    /// next before a durable slot knows it (roll-forward from a slot of the
    /// old count would stop there). Waits up to `RESIZE_ARU_WAIT` for open
    /// ARUs that logged something: a checkpoint never holds half of one.
    pub(crate) fn grow_segments(&self, count: u32) -> LdResult<Geometry> {
        let mut g = self.lock_quiet(RESIZE_ARU_WAIT)?;
        let old = self.geo();
        if count <= old.segment_count {
            return Err(LdError::InvalidArgument(format!(
                "the file system has {} segments already: not grown to {count}",
                old.segment_count
            )));
        }
        let device_pages = self.dev.size_bytes() / PAGE_BYTES as u64;
        let new = Geometry {
            incompat: old.incompat | super::layout::INCOMPAT_RESIZE,
            ..old
        }
        .with_segments(count, device_pages)
        .ok_or_else(|| {
            LdError::InvalidArgument(format!(
                "{count} segments do not fit: the slots hold {}, the device {} pages",
                old.max_segments(),
                device_pages
            ))
        })?;
        g.usage.grow(count);
        *self.geo.write().expect("geometry poisoned") = new;
        g.geo = new;
        if let Err(e) = self.checkpoint(&mut g) {
            // The table and the geometry are the new ones and the slot may
            // not be: nothing more may be written (the next open decides).
            return Err(self.fail(&mut g, e));
        }
        g.usage.set_limit(count);
        if g.log.next == g.log.seg {
            let Inner { usage, log, .. } = &mut *g;
            choose_next(usage, log);
        }
        Ok(new)
    }

    /// The first half of an offline shrink to `count` segments
    /// (`lld::resize`). Refuses, changing nothing, if a kept snapshot pins
    /// a segment past the new end or the live data does not fit `count`
    /// segments; else fences those segments off (`Usage::set_limit`), moves
    /// the log head below the fence, moves every live block and map page
    /// out of them through the log (the cleaner's `relocate`), and
    /// checkpoints until every one is Clean. The caller then closes the
    /// engine and commits the new size. A block failing its crc stops it
    /// (fsck first: moving it would need its bytes).
    pub(crate) fn empty_segments_past(&self, count: u32) -> LdResult<()> {
        {
            let mut g = self.lock_quiet(RESIZE_ARU_WAIT)?;
            let pins = g
                .usage
                .iter()
                .skip(count as usize)
                .fold(0u32, |m, (_, u)| m | u.pins);
            if pins != 0 {
                let which: Vec<String> = g
                    .snapshots
                    .iter()
                    .filter(|s| pins >> s.pin & 1 == 1)
                    .map(|s| format!("{} {:?}", s.number, s.name))
                    .collect();
                return Err(LdError::InvalidArgument(format!(
                    "snapshot(s) {} hold segments past the new end: delete them first \
                     (ldfs snapshot MNT --delete N), or shrink less",
                    which.join(", ")
                )));
            }
            let live = self.footprint_bytes(&g, Class::Meta);
            let fits = self.capacity_for(count);
            if live > fits {
                return Err(LdError::InvalidArgument(format!(
                    "{live} bytes are live (blocks, map pages and their summary records) and \
                     {fits} fit in {count} segments: delete data or shrink less"
                )));
            }
            let Inner { usage, log, .. } = &mut *g;
            if log.next != log.seg && log.next.0 >= count {
                usage.unchoose(log.next);
                log.next = log.seg;
            }
            usage.set_limit(count);
            if log.next == log.seg {
                choose_next(usage, log);
            }
            if log.seg.0 >= count && log.next == log.seg {
                // Advancing would find nowhere to go and fail the engine.
                return Err(LdError::InvalidArgument(format!(
                    "no clean segment below segment {count} for the log to move to: \
                     clean first (ldfs clean IMAGE), or shrink less"
                )));
            }
            if g.log.seg.0 >= count {
                self.seal(&mut g)?;
                self.drain(&mut g)?;
                self.advance(&mut g)?;
            }
            self.checkpoint(&mut g)?;
        }
        for _ in 0..SHRINK_ROUNDS {
            let left: Vec<SegmentId> = self
                .lock()
                .usage
                .iter()
                .skip(count as usize)
                .filter(|(_, u)| u.state != SegmentState::Clean)
                .map(|(s, _)| s)
                .collect();
            if left.is_empty() {
                return Ok(());
            }
            for seg in left {
                self.move_out_of(seg)?;
            }
            // Writes the relocated map pages below the fence and releases
            // what the moves emptied.
            self.checkpoint_now()?;
        }
        Err(LdError::InvalidArgument(format!(
            "segments past {count} still hold data after {SHRINK_ROUNDS} rounds of moving it"
        )))
    }

    /// The map entries of blocks on the device in `seg`, and the addresses
    /// of the map's pages there: what must move before `seg` is empty.
    fn live_in_segment(&self, seg: SegmentId) -> LdResult<SegmentContents> {
        let geo = self.geo();
        let mut entries: Vec<(Key, MapEntry)> = Vec::new();
        let mut pages: Vec<u64> = Vec::new();
        let mut g = self.lock();
        let r = self.pages();
        g.map.range(Key::MIN, Key::MAX, &r, &mut |k, e| {
            if !e.is_buffered() && geo.segment_of(e.offset()) == Some(seg) {
                entries.push((k, *e));
            }
            true
        })?;
        g.map.for_each_page(&mut |p| {
            if geo.segment_of(p.addr) == Some(seg) {
                pages.push(p.addr);
            }
        });
        Ok((entries, pages))
    }

    /// Moves every live block and map page out of `seg` (`relocate`; map
    /// pages at the next checkpoint, as far as it has room). A move that
    /// finds no room lets the cleaner free some first, once.
    fn move_out_of(&self, seg: SegmentId) -> LdResult<()> {
        let (entries, pages) = self.live_in_segment(seg)?;
        for (k, e) in entries {
            match self.relocate(k, &e) {
                Err(LdError::NoSpace { .. }) => {
                    let stop = std::sync::atomic::AtomicBool::new(false);
                    self.clean_now(
                        super::cleaner::policy::PolicyKind::Greedy,
                        Some(4),
                        1.0,
                        &stop,
                    )?;
                    self.relocate(k, &e)?;
                }
                Err(LdError::Corrupt(c)) => {
                    return Err(LdError::InvalidArgument(format!(
                        "cannot move a block out of segment {}: {c} (run ldfs fsck first)",
                        seg.0
                    )))
                }
                r => {
                    r?;
                }
            }
        }
        self.relocate_map_pages(&pages)?;
        Ok(())
    }

    /// The state lock, writable, with no pending checkpoint and no open ARU
    /// that logged something (waiting up to `wait` for them to end).
    fn lock_quiet(&self, wait: Duration) -> LdResult<MutexGuard<'_, Inner>> {
        let deadline = Instant::now() + wait;
        let mut g = self.lock_writable()?;
        loop {
            g = self.finish_pending_unlocked(g)?;
            if g.open_nonempty == 0 {
                return Ok(g);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(LdError::InvalidArgument(
                    "atomic recovery units stayed open: try again".into(),
                ));
            }
            g = self
                .aru_cv
                .wait_timeout_while(g, left, |g| g.open_nonempty > 0)
                .expect("engine state poisoned by an earlier panic")
                .0;
            self.check_writable(&mut g)?;
        }
    }

    /// Memory held by the map, and its page counts (total, dirty).
    pub fn map_figures(&self) -> (usize, usize, usize) {
        let g = self.lock();
        (
            g.map.memory_bytes(),
            g.map.total_pages(),
            g.map.dirty_pages(),
        )
    }

    /// Reads every valid partial segment summary in `seg`, in order, as the
    /// cleaner does: the header and its records. Stops at the first page that
    /// does not hold a valid summary.
    pub fn segment_summaries(&self, seg: SegmentId) -> LdResult<Vec<(SummaryHeader, Vec<Record>)>> {
        if seg.0 >= self.geo().segment_count {
            return Err(LdError::InvalidArgument(format!("no segment {}", seg.0)));
        }
        self.drain_flight()?;
        Ok(
            recovery::scan_segment(&*self.dev, &self.geo(), seg, recovery::Verify::Summary)?
                .into_iter()
                .map(|p| (p.header, p.records))
                .collect(),
        )
    }

    /// Whether the map page stored at `addr` is still part of the map.
    pub fn map_page_is_live(&self, addr: u64) -> bool {
        self.lock().map.page_is_live(addr)
    }

    /// Has the map page at `addr` rewritten elsewhere by the next checkpoint
    /// (the cleaner's way to empty a segment holding map pages). Returns
    /// false if no live map page is there, or if the next checkpoint has no
    /// room for one more page.
    pub fn relocate_map_page(&self, addr: u64) -> LdResult<bool> {
        Ok(self.relocate_map_pages(&[addr])?.0 > 0)
    }

    /// The map entry of a block (the cleaner checks liveness with it).
    pub fn map_entry(&self, key: Key) -> LdResult<Option<MapEntry>> {
        let mut g = self.lock();
        let r = self.pages();
        g.map.get(key, &r)
    }

    /// Moves a block by rewriting it through the log, if the map still holds
    /// `expected` for it; changes only the map (the cleaner's primitive).
    /// Returns whether the block was moved.
    pub fn relocate(&self, key: Key, expected: &MapEntry) -> LdResult<bool> {
        let stored = match self.read_stored(key)? {
            Some((e, data)) if e == *expected => data,
            _ => return Ok(false),
        };
        let mut g = self.lock_writable()?;
        let r = self.pages();
        if g.map.get(key, &r)? != Some(*expected) || expected.is_buffered() {
            return Ok(false);
        }
        if g.undo.touches(key) {
            return Ok(false);
        }
        self.admit(
            &mut g,
            None,
            WRITE_RECORD_BYTES,
            stored.len(),
            Class::Clean,
            1,
            None,
        )?;
        self.log_write(
            &mut g,
            PendingWrite {
                aru: 0,
                key,
                data: stored,
                crc: expected.crc,
                flags: expected.flags & entry_flags::ON_DISK_MASK,
                age: 0,
            },
        )?;
        g.moved_bytes += expected.len as u64;
        self.after_op(&mut g);
        Ok(true)
    }

    /// fsck: (re)writes list 0's entry for each of `lists` with default
    /// hints (hints steer placement and compression of new writes only;
    /// the engine's reads never need them), so a list whose entry was lost
    /// or damaged exists again with every block it holds, and raises the
    /// next list id above every list the map holds. Fails with
    /// `InvalidArgument` for list 0.
    pub fn repair_lists(&self, lists: &[u64]) -> LdResult<()> {
        let with: Vec<(u64, ListHints)> =
            lists.iter().map(|&l| (l, ListHints::default())).collect();
        self.repair_lists_with(&with)
    }

    /// [`Engine::repair_lists`] with the hints to write for each list, for
    /// a layer above that reads them back (the dual layout tells a data
    /// list from a metadata list by its kind).
    pub fn repair_lists_with(&self, lists: &[(u64, ListHints)]) -> LdResult<()> {
        let mut g = self.lock_writable()?;
        for &(list, hints) in lists {
            if list == 0 {
                return Err(LdError::InvalidArgument(
                    "list 0 belongs to the engine".into(),
                ));
            }
            let data = encode_hints(&hints);
            self.admit(
                &mut g,
                None,
                WRITE_RECORD_BYTES,
                data.len(),
                Class::Meta,
                1,
                None,
            )?;
            let crc = crc32c::crc32c(&data);
            self.log_write(
                &mut g,
                PendingWrite {
                    aru: 0,
                    key: Key {
                        list: 0,
                        index: list,
                    },
                    data,
                    crc,
                    flags: 0,
                    age: 0,
                },
            )?;
            g.hints.remove(&list);
            g.next_list = g.next_list.max(list.saturating_add(1));
            self.after_op(&mut g);
            // The entries so far stand; a failure after them stops the rest.
            self.check_writable(&mut g)?;
        }
        // Above every list that has an entry (those without one are the
        // caller's `lists`).
        let r = self.pages();
        let mut top = 0u64;
        let (from, to) = list_range(0);
        g.map.range(from, to, &r, &mut |k, _| {
            top = top.max(k.index);
            true
        })?;
        g.next_list = g.next_list.max(top.saturating_add(1));
        Ok(())
    }

    /// fsck: moves every live block and map page out of segment `seg`
    /// (blocks through the log now, map pages at the next checkpoint), so
    /// that the segment holds nothing live and is released. A block whose
    /// bytes fail their crc cannot be moved: it is deleted. Returns (moved,
    /// deleted). Call [`Engine::start_new_segment`] first if `seg` may be
    /// the one the log writes into.
    pub fn evacuate_segment(&self, seg: SegmentId) -> LdResult<(u64, u64)> {
        let (entries, pages) = self.live_in_segment(seg)?;
        let (mut moved, mut deleted) = (0, 0);
        for (k, e) in entries {
            match self.relocate(k, &e) {
                Ok(true) => moved += 1,
                Ok(false) => {}
                Err(LdError::Corrupt(_)) => {
                    if k.list == 0 {
                        self.repair_lists(&[k.index])?;
                    } else {
                        self.delete(None, ListId(k.list), k.index)?;
                    }
                    deleted += 1;
                }
                Err(e) => return Err(e),
            }
        }
        self.relocate_map_pages(&pages)?;
        Ok((moved, deleted))
    }

    /// fsck: seals the open partial segment and moves the log head to a
    /// fresh segment, then checkpoints there. A segment whose summaries are
    /// damaged is so never appended to again: what is written next (blocks
    /// fsck rewrites because their summary is lost) lies where a scan of the
    /// summaries reaches it. Fails with `InvalidArgument` if an ARU that has
    /// logged operations is open.
    pub fn start_new_segment(&self) -> LdResult<()> {
        let mut g = self.lock_writable()?;
        if g.open_nonempty > 0 {
            return Err(LdError::InvalidArgument(
                "a new segment cannot be started while an ARU is open".into(),
            ));
        }
        self.seal(&mut g)?;
        if g.log.page > 0 {
            self.drain(&mut g)?;
            self.advance(&mut g)?;
        }
        self.checkpoint(&mut g)
    }

    /// Flushes, writes a final checkpoint so the next open is fast, and
    /// stops accepting operations.
    pub fn close(&self) -> LdResult<()> {
        if self.opts.read_only {
            self.lock().closed = true;
            return Ok(());
        }
        let mut g = self.lock_writable()?;
        // ARUs still open are aborted: their owners never finished them
        // (a failed or interrupted operation), so none may become durable,
        // and a checkpoint must not hold part of one.
        let open: Vec<u64> = g.arus.keys().copied().collect();
        for id in open {
            self.abort_locked(&mut g, id)?;
        }
        self.checkpoint(&mut g)?;
        g.closed = true;
        Ok(())
    }

    /// Finishes the pending checkpoint, if one is, and returns whether one
    /// was: waits until its slot is durable (the lock is not held while the
    /// device works) and releases its segments. Without a checkpointer
    /// thread (`LldOptions::checkpoint_thread`) this is how tests choose
    /// when a checkpoint that an operation started reaches the device.
    pub fn finish_checkpoint(&self) -> LdResult<bool> {
        let g = self.lock_writable()?;
        let pending = g.ckpt.is_some();
        drop(self.finish_pending_unlocked(g)?);
        Ok(pending)
    }

    /// Whether a checkpoint is between its snapshot and its release.
    pub fn checkpoint_pending(&self) -> bool {
        self.lock().ckpt.is_some()
    }

    /// Writes a checkpoint now (tests, benchmarks, `ldfs` tools) and returns
    /// once it is durable; operations of other threads go on while the
    /// device works. Fails with `InvalidArgument` if an ARU that has logged
    /// operations is open.
    pub fn checkpoint_now(&self) -> LdResult<()> {
        let g = self.lock_writable()?;
        let g = self.finish_pending_unlocked(g)?;
        if g.open_nonempty > 0 {
            return Err(LdError::InvalidArgument(
                "a checkpoint cannot be taken while an ARU is open".into(),
            ));
        }
        self.checkpoint_unlocked(g)
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves the state suspect: propagate.
        self.inner
            .lock()
            .expect("engine state poisoned by an earlier panic")
    }

    fn lock_writable(&self) -> LdResult<MutexGuard<'_, Inner>> {
        let mut g = self.lock();
        self.check_writable(&mut g)?;
        Ok(g)
    }

    fn check_writable(&self, g: &mut Inner) -> LdResult<()> {
        if self.opts.read_only {
            return Err(LdError::ReadOnly("opened read-only".into()));
        }
        if let Some(why) = &g.failed {
            return Err(LdError::ReadOnly(why.clone()));
        }
        if let Some(why) = self.flight.failed() {
            let why = format!("device error, engine is now read-only: {why}");
            g.failed = Some(why.clone());
            return Err(LdError::ReadOnly(why));
        }
        if g.closed {
            return Err(LdError::ReadOnly("closed".into()));
        }
        Ok(())
    }

    /// Waits for queued partial segments (under the state lock: checkpoints).
    fn drain(&self, g: &mut Inner) -> LdResult<()> {
        match self.flight.drain() {
            Ok(()) => Ok(()),
            Err(e) => Err(self.fail(g, drain_error(e))),
        }
    }

    /// Map pages a recovery checkpoint may have to write if the engine crashed
    /// now: those dirtied since the last durable checkpoint, which with a
    /// checkpoint pending (snapshot taken, slot not yet durable) includes the
    /// pages its snapshot wrote, since recovery would start before it.
    fn dirtied_for_recovery(g: &Inner) -> usize {
        g.map.dirtied_pages() + g.ckpt.as_ref().map_or(0, |p| p.plan.dirtied)
    }

    /// A device write or flush failed: nothing more is written, reads go on.
    fn fail(&self, g: &mut Inner, e: LdError) -> LdError {
        fail_state(g, e)
    }

    fn check_list(&self, g: &mut Inner, list: ListId) -> LdResult<()> {
        if list.0 == 0 {
            return Err(LdError::InvalidArgument(
                "list 0 belongs to the engine".into(),
            ));
        }
        let r = self.pages();
        if g.map
            .get(
                Key {
                    list: 0,
                    index: list.0,
                },
                &r,
            )?
            .is_none()
        {
            return Err(LdError::NoSuchList(list));
        }
        Ok(())
    }

    fn check_aru(&self, g: &Inner, aru: Option<AruId>) -> LdResult<u64> {
        match aru {
            None => Ok(0),
            Some(a) if g.arus.contains_key(&a.0) => Ok(a.0),
            Some(a) => Err(LdError::NoSuchAru(a)),
        }
    }

    /// Logs list `id`'s hints block (its entry in list 0), already
    /// admitted, and keeps the hints.
    fn write_hints(
        &self,
        g: &mut Inner,
        aru_id: u64,
        id: u64,
        hints: ListHints,
        data: Vec<u8>,
    ) -> LdResult<()> {
        let crc = crc32c::crc32c(&data);
        self.log_write(
            g,
            PendingWrite {
                aru: aru_id,
                key: Key { list: 0, index: id },
                data,
                crc,
                flags: 0,
                age: 0,
            },
        )?;
        g.hints.insert(id, hints);
        self.after_op(g);
        Ok(())
    }

    fn hints_of(&self, g: &mut Inner, list: ListId) -> LdResult<ListHints> {
        if let Some(h) = g.hints.get(&list.0) {
            return Ok(*h);
        }
        let key = Key {
            list: 0,
            index: list.0,
        };
        let data = self
            .read_key_locked(g, key)?
            .ok_or(LdError::NoSuchList(list))?;
        let h = decode_hints(&data, 0)?;
        if g.hints.len() >= HINTS_CACHE_LIMIT {
            g.hints.clear();
        }
        g.hints.insert(list.0, h);
        Ok(h)
    }

    /// Reads a block while holding the lock (list 0's small hint blocks).
    fn read_key_locked(&self, g: &mut Inner, key: Key) -> LdResult<Option<Vec<u8>>> {
        let r = self.pages();
        let Some(e) = g.map.get(key, &r)? else {
            return Ok(None);
        };
        let stored = if e.is_buffered() {
            g.pending
                .write_at(e.addr as usize)
                .expect("buffered entry without its write")
                .data
                .clone()
        } else {
            self.read_device_block(&e)?
        };
        decode_stored(&e, stored, g.geo.max_block_bytes).map(Some)
    }

    fn read_device_block(&self, e: &MapEntry) -> LdResult<Vec<u8>> {
        if e.device() != 0 {
            return Err(LdError::Corrupt(Corruption {
                what: "map entry",
                offset: e.addr,
                reason: CorruptReason::Inconsistent(format!("names device {}", e.device())),
            }));
        }
        let b = match self.flight.read(e.offset(), e.len as usize) {
            Some(b) => b,
            None => {
                let mut b = vec![0u8; e.len as usize];
                self.dev.read_at(&mut b, e.offset())?;
                b
            }
        };
        let got = crc32c::crc32c(&b);
        if got != e.crc {
            return Err(LdError::Corrupt(Corruption {
                what: "block",
                offset: e.offset(),
                reason: CorruptReason::BadChecksum {
                    expected: e.crc,
                    got,
                },
            }));
        }
        Ok(b)
    }

    /// A block's map entry and stored bytes (compressed if flagged), read
    /// without holding the lock during device I/O.
    fn read_stored(&self, key: Key) -> LdResult<Option<(MapEntry, Vec<u8>)>> {
        let mut last_err = None;
        for _ in 0..4 {
            let e = {
                let mut g = self.lock();
                let r = self.pages();
                let Some(e) = g.map.get(key, &r)? else {
                    return Ok(None);
                };
                if e.is_buffered() {
                    let w = g
                        .pending
                        .write_at(e.addr as usize)
                        .expect("buffered entry without its write");
                    return Ok(Some((e, w.data.clone())));
                }
                e
            };
            match self.read_device_block(&e) {
                Ok(b) => return Ok(Some((e, b))),
                Err(err @ LdError::Corrupt(_)) => {
                    // The block may have moved (cleaned, segment reused)
                    // after the lock was dropped: look again before blaming
                    // the device.
                    let mut g = self.lock();
                    let r = self.pages();
                    if g.map.get(key, &r)? == Some(e) {
                        return Err(err);
                    }
                    last_err = Some(err);
                }
                Err(err) => return Err(err),
            }
        }
        Err(last_err.expect("retried without an error"))
    }

    // ---- accounting -------------------------------------------------------

    /// The log once the open partial and one more operation of the given
    /// size are written (as `make_room` and `seal` would place them): the
    /// pages it can still take, counting segment tails that would be
    /// skipped (negative when the operation does not fit), and the page of
    /// its segment where the head would then be — where a checkpoint
    /// following the operation would start.
    fn log_after(&self, g: &Inner, record_bytes: usize, data_bytes: usize) -> LogRoom {
        let sp = g.geo.segment_pages as i64;
        let page = g.log.page as i64;
        let has_next = (g.log.next != g.log.seg) as i64;
        let others = (g.usage.clean_count() as i64 + has_next) * sp;
        let cur = g.pending.pages() as i64;
        let with = g.pending.pages_with(record_bytes, data_bytes) as i64;
        let alone = writer::pages_for(record_bytes, data_bytes) as i64;
        // Where the operation's partial ends: in this segment, or (`None`)
        // `alone` pages into the next.
        let end = if with <= sp - page && g.pending.summary_has_room(record_bytes) {
            Some(page + with)
        } else if sp - (page + cur) >= 2 && alone <= sp - (page + cur) {
            Some(page + cur + alone)
        } else {
            None
        };
        // A segment left with fewer than two pages is skipped (`seal`).
        let (left, at) = match end {
            Some(e) if sp - e >= 2 => (sp - e + others, e),
            Some(_) => (others, 0),
            None if sp - alone >= 2 => (others - alone, alone),
            None => (others - sp, 0),
        };
        LogRoom {
            left,
            page: at as u32,
        }
    }

    /// Pages the log must keep free after an operation of `class` when the
    /// checkpoint that has to follow it takes `checkpoint` pages. The lower
    /// half of the reserve is the checkpoint's: it holds one of up to
    /// `checkpoint_share` pages with `margin_pages` to spare; map pages
    /// beyond that (ARUs that dirty more than `dirty_page_limit` before a
    /// checkpoint can be taken) raise the floor by what they need, so a
    /// checkpoint always leaves as much as one at the limit would. User
    /// writes leave the upper half on top, for deletes, ARU ends and the
    /// cleaner.
    fn floor_pages(&self, geo: &Geometry, class: Class, checkpoint: i64) -> i64 {
        let (lower, upper) = reserve_halves(geo);
        let meta = lower + (checkpoint - self.checkpoint_share).max(0);
        match class {
            // The checkpoint's pages on top too: once it is written the
            // upper half must still be whole, or the cleaner (which leaves
            // the lower half, that checkpoint and the margin) has nothing
            // left to move a victim with when writes stop at this floor.
            Class::User => upper + meta + checkpoint.min(self.checkpoint_share),
            Class::Meta => meta,
            Class::Clean => meta + checkpoint.min(self.checkpoint_share) + margin_pages(geo),
        }
    }

    /// What `floor_pages` asks of an operation that may newly dirty
    /// `new_pages` more map pages, with the head at `page`.
    fn floor_after(&self, g: &Inner, class: Class, page: u32, new_pages: usize) -> i64 {
        let dirty = Self::dirtied_for_recovery(g) + new_pages;
        let floor = self.floor_pages(&g.geo, class, checkpoint_log_pages(&g.geo, page, dirty));
        match class {
            Class::User => floor + self.map_allowance(g),
            Class::Meta | Class::Clean => floor,
        }
    }

    /// Log pages user writes leave, beyond the reserve, for the cleaner to
    /// rewrite the block map while it empties victims (issue 12). Moving a
    /// victim's blocks dirties their map leaves, which the checkpoint that
    /// releases it must write: up to every map page (`m`), fewer if a
    /// segment cannot hold that many blocks. Victims of one pass share those
    /// pages, so a pass gains only if it cleans enough of them to pay for
    /// the map: at live fraction `u`, `m / (1 - u)` pages of room let the
    /// victims' data and the map fit with the segments they free exceeding
    /// both. What the upper half of the reserve and the checkpoint share
    /// already give the cleaner counts towards that; at least `m` is kept.
    /// Without it a device of small blocks at scattered keys (a page of map
    /// per block moved) stopped at half its capacity: every pass spent the
    /// reserve on map pages, freed less than it wrote, and the log stayed
    /// full for good. Sprite LFS and BSD-LFS had no such map (the inode map
    /// is small and written whole); the LD's block map is as large as its
    /// lists are scattered.
    fn map_allowance(&self, g: &Inner) -> i64 {
        // A victim holds at most a segment's worth of the smallest blocks
        // (a record each), each dirtying at most its own leaf. (Not of the
        // average size: with large blocks filling most of the device and
        // small ones at scattered keys the rest, that cap fell below what a
        // victim of small blocks dirties, and cleaning stopped gaining:
        // review 10.)
        let per_victim =
            g.geo.segment_bytes() as usize / WRITE_RECORD_BYTES + g.map.internal_pages();
        // Every page, dirty ones too: the figure must not jump when a
        // checkpoint cleans them (`footprint_bytes` counts it, and a full
        // file system must stay full, not overfull, across one).
        let m = checkpoint_log_pages_anywhere(&g.geo, g.map.total_pages().min(per_victim));
        if m == 0 {
            return 0;
        }
        let usable = (g.geo.segment_count - g.geo.reserved_segments) as u64 * g.geo.segment_bytes();
        // Pinned segments are never victims: counted whole as occupied, the
        // estimate errs towards a larger allowance.
        let live =
            (g.usage.live_bytes_total() + g.usage.history_bytes()) as f64 / usable.max(1) as f64;
        let u = live.min(self.opts.cleaner.max_live_percent.min(100) as f64 / 100.0);
        // The cleaner writes a victim's live data in partial segments of at
        // most `partial_bytes`, each with a summary page and a part-empty
        // last page: about two pages more per partial, so a victim costs
        // `u (1 + o)` of a segment. With 32 KiB partials (o = 1/4) the
        // allowance planned for passes that could not gain, and writers were
        // refused with a fifth of the capacity free (review 14, F2).
        let chunk =
            (self.opts.partial_bytes as u64).clamp(PAGE_BYTES as u64, g.geo.segment_bytes());
        let o = 2.0 * PAGE_BYTES as f64 / chunk as f64;
        let u = (u * (1.0 + o)).min(0.95);
        let need = (m as f64 / (1.0 - u).max(0.05)).ceil() as i64;
        let (_, upper) = reserve_halves(&g.geo);
        let room = upper + self.checkpoint_share - margin_pages(&g.geo);
        m.max(need - room)
    }

    fn reserved_by_others(&self, g: &Inner, aru: u64) -> i64 {
        g.arus
            .iter()
            .filter(|(id, _)| **id != aru)
            .map(|(_, a)| a.reserved.div_ceil(PAGE_BYTES as u64) as i64)
            .sum()
    }

    /// Whether a Meta-class operation of `aru` that leaves `left` pages
    /// with the head at `page` should let the cleaner make room first: it
    /// may clean (its ARU has logged nothing), cleaning was not found
    /// futile lately, and the operation would take the log below the user
    /// floor. Below that floor the cleaner lacks the room a pass needs to
    /// gain (`map_allowance`); a freeing operation may still go on down to
    /// its own floor, but only once cleaning cannot help.
    fn meta_wants_cleaning(
        &self,
        g: &Inner,
        aru: u64,
        left: i64,
        page: u32,
        new_pages: usize,
    ) -> bool {
        self.may_clean_for(g, aru)
            && g.op_seq >= g.clean_futile_until
            && left < self.floor_after(g, Class::User, page, new_pages)
    }

    /// The state lock for a Meta-class operation (a delete, a list's
    /// creation or deletion) of `changes` map changes that writes
    /// `record_bytes` of records and `data_bytes` of data, after letting the
    /// cleaner make room while the operation would otherwise take the log
    /// below the user floor (`meta_wants_cleaning`). Deletes at scattered
    /// keys cost about a map page each at the next checkpoint and free whole
    /// segments only through the cleaner: admitted down to their own floor,
    /// they sank the log below the room a cleaning pass needs, and every
    /// later write was refused for good with half the device dead (review
    /// 14, F1). When cleaning cannot free anything the operation goes on
    /// (freeing must work on a full device) and the next 64 operations do
    /// not ask again. The common case (an ARU that logged already, or room
    /// enough) takes the lock once and decides with a few comparisons.
    fn lock_for_meta(
        &self,
        aru: Option<AruId>,
        record_bytes: usize,
        data_bytes: usize,
        changes: usize,
    ) -> LdResult<MutexGuard<'_, Inner>> {
        let mut wait = SpaceWait::freeing();
        loop {
            let g = self.lock_writable()?;
            let aru_id = self.check_aru(&g, aru)?;
            if !self.may_clean_for(&g, aru_id) || g.op_seq < g.clean_futile_until {
                return Ok(g);
            }
            let room = self.log_after(&g, record_bytes, data_bytes);
            let left = room.left - self.reserved_by_others(&g, aru_id);
            let new_pages = changes * g.map.change_bound();
            if !self.meta_wants_cleaning(&g, aru_id, left, room.page, new_pages) {
                return Ok(g);
            }
            let seen = g.usage.clean_count();
            drop(g);
            // The cleaner failing (a victim it cannot read) must not fail
            // a freeing operation that has room of its own: before this,
            // a latent sector error anywhere failed every delete that came
            // near the user floor (review 15).
            if !matches!(self.clean_for_space(seen, &mut wait), Ok(true)) {
                if !wait.busy {
                    self.note_futile(64);
                }
                // Go on at its own floor.
                let g = self.lock_writable()?;
                self.check_aru(&g, aru)?;
                return Ok(g);
            }
        }
    }

    /// Admission control: accept the operation only if its space exists now,
    /// and with it the room for the checkpoint that must follow (the map
    /// pages dirtied since the last one, and those of `changes` more map
    /// changes: one per key written or deleted, one per range; and for a
    /// range `undo` removed inside an ARU, the pages an abort would make
    /// again). May checkpoint to turn emptied segments into clean ones.
    #[allow(clippy::too_many_arguments)]
    fn admit(
        &self,
        g: &mut Inner,
        aru: Option<AruId>,
        record_bytes: usize,
        data_bytes: usize,
        class: Class,
        changes: usize,
        undo: Option<(Key, Key)>,
    ) -> LdResult<()> {
        let aru_id = aru.map_or(0, |a| a.0);
        let new_pages = changes * g.map.change_bound()
            + match undo {
                Some((from, to)) if aru_id != 0 => undo_pages(g.map.leaves_in_range(from, to)),
                _ => 0,
            };
        self.admit_pages(g, aru, record_bytes, data_bytes, class, new_pages)
    }

    /// `admit` for an operation known to newly dirty at most `new_pages`
    /// map pages.
    fn admit_pages(
        &self,
        g: &mut Inner,
        aru: Option<AruId>,
        record_bytes: usize,
        data_bytes: usize,
        class: Class,
        new_pages: usize,
    ) -> LdResult<()> {
        let aru_id = aru.map_or(0, |a| a.0);
        let cost = (record_bytes + data_bytes) as u64;
        // Within a reservation the ARU spends what was set aside for it.
        let reserved = g.arus.get(&aru_id).is_some_and(|a| a.reserved >= cost);
        let class = if reserved { Class::Meta } else { class };
        for attempt in 0..2 {
            let room = self.log_after(g, record_bytes, data_bytes);
            let left = room.left - self.reserved_by_others(g, aru_id);
            // Room for the checkpoint that must follow, with the map pages
            // this operation may dirty: it gets NoSpace, never the ARU's
            // end, the checkpoint or the next open.
            let need = self.floor_after(g, class, room.page, new_pages);
            if left >= need {
                if reserved {
                    g.arus.get_mut(&aru_id).expect("ARU checked open").reserved -= cost;
                }
                return Ok(());
            }
            // Dead space comes back only through a checkpoint; one is
            // always affordable (the floor keeps its pages), so take it
            // now if nothing forbids it, rather than wait for the cleaner.
            if attempt == 0 && g.open_nonempty == 0 && g.usage.releasable_count() > 0 {
                self.checkpoint(g)?;
                continue;
            }
            let available = (left - self.floor_after(g, Class::User, room.page, new_pages)).max(0)
                as u64
                * PAGE_BYTES as u64;
            return Err(LdError::NoSpace {
                needed: cost,
                available,
            });
        }
        unreachable!()
    }

    // ---- the log writer ---------------------------------------------------

    /// Makes room in the open partial for one more operation, sealing it or
    /// moving the log to the next segment as needed.
    fn make_room(&self, g: &mut Inner, record_bytes: usize, data_bytes: usize) -> LdResult<()> {
        let remain = g.geo.segment_pages - g.log.page;
        if g.pending.pages_with(record_bytes, data_bytes) <= remain
            && g.pending.summary_has_room(record_bytes)
        {
            return Ok(());
        }
        self.seal(g)?;
        let remain = g.geo.segment_pages - g.log.page;
        if writer::pages_for(record_bytes, data_bytes) > remain {
            self.advance(g)?;
        }
        Ok(())
    }

    /// Moves the log head to the next segment.
    fn advance(&self, g: &mut Inner) -> LdResult<()> {
        assert!(g.pending.is_empty());
        if let Some(left) = self.left.as_ref().filter(|_| g.log.page > 0) {
            // Every write to it is queued by now (`seal` submits before it
            // advances): told once the log writer is past the newest.
            let ticket = self.flight.submitted();
            left.push(g.log.seg, ticket, self.flight.written());
        }
        let Inner {
            usage,
            log,
            clock,
            geo,
            ..
        } = &mut *g;
        if let Err(e) = enter_next(usage, log, clock, geo) {
            return Err(self.fail(g, e));
        }
        Ok(())
    }

    fn summary_header(&self, g: &Inner) -> SummaryHeader {
        SummaryHeader {
            fs_id: g.geo.fs_id,
            epoch: g.log.epoch,
            seq: g.log.seq,
            segment: g.log.seg.0,
            page: g.log.page,
            next_segment: g.log.next.0,
            summary_pages: 0,
            data_pages: 0,
        }
    }

    /// Writes the open partial segment and points the map at its blocks.
    fn seal(&self, g: &mut Inner) -> LdResult<()> {
        if g.pending.is_empty() {
            return Ok(());
        }
        let header = self.summary_header(g);
        let pages = g.pending.pages();
        assert!(pages <= g.geo.segment_pages - g.log.page);
        let sealed = g.pending.seal(header);
        let base = g.geo.page_addr(g.log.seg, g.log.page);
        let writer = g.writer.as_ref().expect("writable engine has a log writer");
        if let Err(why) = self.flight.submit(writer, base, sealed.bytes) {
            // The operations stay buffered, so reads still see them.
            return Err(self.fail(g, LdError::ReadOnly(why)));
        }
        let seg = g.log.seg;
        let seq = g.log.seq;
        let data_base = base + sealed.summary_pages as u64 * PAGE_BYTES as u64;
        let r = self.pages();
        for p in &sealed.placed {
            let buffered = MapEntry {
                addr: p.slot as u64,
                len: p.len,
                crc: p.crc,
                flags: p.flags | entry_flags::BUFFERED,
            };
            let on_disk = MapEntry {
                addr: data_base + p.data_off as u64,
                len: p.len,
                crc: p.crc,
                flags: p.flags,
            };
            // Only the newest version is live; older ones kept in this
            // partial for ARU reasons were already superseded in the map.
            // Dirty leaves are resident, so this reads nothing; if it ever
            // failed the log and the map would disagree: stop writing.
            // A moved block keeps its age; anything else is as old as
            // this partial segment.
            let age = if p.age == 0 { seq } else { p.age.min(seq) };
            match g.map.replace_if(p.key, &buffered, on_disk, &r) {
                Ok(true) => g.usage.add_live(seg, p.len, age),
                Ok(false) => {}
                Err(e) => return Err(self.fail(g, e)),
            }
            if !g.undo.is_empty() {
                g.undo.sealed(p.key, &buffered, on_disk);
            }
        }
        if g.pending.is_fresh() {
            g.usage.touch(seg, seq);
        }
        g.pending.clear();
        g.log.page += pages;
        g.log.seq += 1;
        g.log_bytes_since_checkpoint += pages as u64 * PAGE_BYTES as u64;
        g.stats.partials_written += 1;
        if g.geo.segment_pages - g.log.page < 2 {
            self.advance(g)?;
        }
        Ok(())
    }

    /// Removes a block's current version before it is replaced or deleted:
    /// drops it from the open partial when allowed, else takes its bytes off
    /// its segment's live count.
    fn retire(&self, g: &mut Inner, aru: u64, old: &MapEntry) {
        if old.is_buffered() {
            let slot = old.addr as usize;
            let w = g
                .pending
                .write_at(slot)
                .expect("buffered entry without its write");
            let (old_aru, key) = (w.aru, w.key);
            if aru == 0 || aru == old_aru {
                g.pending.drop_write(slot);
            } else if let Some(state) = g.arus.get_mut(&aru) {
                // Entries of partials already sealed can never be dropped
                // (`drop_superseded`), and sequence numbers only grow.
                if state.superseded.last().is_some_and(|s| s.seq != g.log.seq) {
                    state.superseded.clear();
                }
                state.superseded.push(Superseded {
                    seq: g.log.seq,
                    slot,
                    key,
                    aru: old_aru,
                });
            }
        } else if let Some(seg) = g.geo.segment_of(old.offset()) {
            g.usage.sub_live(seg, old.len);
        }
    }

    /// Drops the buffered writes an ARU that just ended replaced, where that
    /// cannot change what recovery sees (DESIGN.md, engine invariant 5): the
    /// ARU's end record went into the same open partial as the replaced
    /// write, a partial segment is valid only whole (invariant 3), so no
    /// crash can keep the replaced write without the replacing one and the
    /// end that commits it; the replaced write's own ARU has ended too (or
    /// it had none), so no abort can need it back; and no open ARU's undo
    /// chain names the key, so no abort can restore it either. Consecutive
    /// ARUs rewriting the same blocks (a directory's inode and bucket, the
    /// dual layout's bitmaps) then log each block once per partial segment,
    /// not once per ARU.
    fn drop_superseded(&self, g: &mut Inner, superseded: Vec<Superseded>) {
        for s in superseded {
            if s.seq != g.log.seq || (s.aru != 0 && g.arus.contains_key(&s.aru)) {
                continue;
            }
            let live =
                matches!(g.pending.write_at(s.slot), Some(w) if w.key == s.key && w.aru == s.aru);
            if live && !g.undo.touches(s.key) {
                g.pending.drop_write(s.slot);
                g.stats.writes_coalesced += 1;
            }
        }
    }

    fn log_write(&self, g: &mut Inner, w: PendingWrite) -> LdResult<()> {
        self.make_room(g, WRITE_RECORD_BYTES, w.data.len())?;
        let len = w.data.len() as u32;
        let (aru, key, crc, flags) = (w.aru, w.key, w.crc, w.flags);
        let slot = g.pending.add_write(w);
        let r = self.pages();
        let entry = MapEntry {
            addr: slot as u64,
            len,
            crc,
            flags: flags | entry_flags::BUFFERED,
        };
        let old = match g.map.insert(key, entry, &r) {
            Ok(old) => old,
            Err(e) => {
                // (A map page that could not be read.) The write must not
                // reach the log behind the caller's back.
                g.pending.drop_write(slot);
                return Err(e);
            }
        };
        if let Some(old) = old {
            self.retire(g, aru, &old);
        }
        g.undo.changed(aru, key, old, Some(entry));
        self.count_op(g, aru);
        Ok(())
    }

    fn log_record(&self, g: &mut Inner, r: Record) -> LdResult<()> {
        let aru = r.aru();
        self.make_room(g, r.encoded_len(), 0)?;
        g.pending.add_record(r);
        self.count_op(g, aru);
        Ok(())
    }

    fn count_op(&self, g: &mut Inner, aru: u64) {
        g.op_seq += 1;
        if aru != 0 {
            let a = g.arus.get_mut(&aru).expect("ARU checked open");
            if a.ops == 0 {
                g.open_nonempty += 1;
            }
            a.ops += 1;
        }
    }

    /// After every accepted operation: seal a full partial, start a
    /// checkpoint when one is due. The operation does not wait for the
    /// device: the checkpointer thread writes the checkpoint (callers may
    /// hold locks of their own, like the file system's mutex). Only when
    /// the map pages dirtied since the pending checkpoint's snapshot reach
    /// twice the limit does the caller wait for that checkpoint, so dirty
    /// (unevictable) pages and what the next checkpoint must place in the
    /// reserve stay bounded.
    ///
    /// The operation itself is done when this runs (the map, the open
    /// partial and reads have it), so a failure here is not the
    /// operation's: it turns the engine read-only, and the next operation
    /// and every flush report it (never a caller told its change failed
    /// while reads, and perhaps the log, have it).
    fn after_op(&self, g: &mut Inner) {
        if let Err(e) = self.try_after_op(g) {
            self.fail(g, e);
        }
    }

    fn try_after_op(&self, g: &mut Inner) -> LdResult<()> {
        if g.pending.data_bytes() >= self.opts.partial_bytes {
            self.seal(g)?;
        }
        if g.open_nonempty > 0 || !self.checkpoint_due(g) {
            return Ok(());
        }
        if g.ckpt.is_some() {
            if g.map.dirty_pages() < 2 * self.dirty_page_limit() {
                return Ok(());
            }
            self.finish_pending(g)?;
        }
        let p = self.begin_checkpoint(g)?;
        if let Some(c) = &*self.checkpointer.lock().expect("checkpointer poisoned") {
            if !c.hand(p.clone()) {
                // The thread is gone (the engine is being dropped).
                let res = p.write(&*self.dev, &self.flight);
                apply_checkpoint(g, &p, res, &self.durable_op)?;
            }
        }
        Ok(())
    }

    /// Map pages dirtied since the last checkpoint that make the next one
    /// due (`LldOptions::checkpoint_dirty_pages`, else `default_dirty_limit`).
    fn dirty_page_limit(&self) -> usize {
        self.dirty_limit
    }

    fn checkpoint_due(&self, g: &Inner) -> bool {
        g.log_bytes_since_checkpoint >= self.opts.checkpoint_log_bytes
            || g.map.dirtied_pages() >= self.dirty_page_limit()
            // Emptied segments are otherwise released when admission or
            // the cleaner needs them: each checkpoint rewrites every dirty
            // map page, so one per emptied segment would cost more than it
            // frees. Only when even the cleaner's half of the reserve is
            // gone does every operation try to release them.
            || (g.usage.clean_count() <= g.geo.reserved_segments / 2
                && g.usage.releasable_count() > 0)
    }

    // ---- checkpoints ------------------------------------------------------

    /// A whole checkpoint while holding the lock (open, close, admission,
    /// fsck): finishes the pending one, if any, then takes a new one and
    /// waits until it is durable and its segments are released.
    fn checkpoint(&self, g: &mut Inner) -> LdResult<()> {
        self.finish_pending(g)?;
        let p = self.begin_checkpoint(g)?;
        let res = p.write(&*self.dev, &self.flight);
        apply_checkpoint(g, &p, res, &self.durable_op)
    }

    /// Finishes the pending checkpoint while holding the lock: runs its
    /// phase 2 here, or waits for the thread running it (phase 2 takes no
    /// engine lock), then applies it.
    fn finish_pending(&self, g: &mut Inner) -> LdResult<()> {
        if let Some(p) = g.ckpt.clone() {
            let res = p.write(&*self.dev, &self.flight);
            apply_checkpoint(g, &p, res, &self.durable_op)?;
        }
        Ok(())
    }

    /// Finishes the pending checkpoint, if any, without holding the lock
    /// while the device works; returns the lock, still writable.
    fn finish_pending_unlocked<'a>(
        &'a self,
        mut g: MutexGuard<'a, Inner>,
    ) -> LdResult<MutexGuard<'a, Inner>> {
        while let Some(p) = g.ckpt.clone() {
            drop(g);
            let res = p.write(&*self.dev, &self.flight);
            g = self.lock();
            apply_checkpoint(&mut g, &p, res, &self.durable_op)?;
            self.check_writable(&mut g)?;
        }
        Ok(g)
    }

    /// Takes a checkpoint and waits until it is durable, without holding
    /// the lock while the device works. The caller found no pending
    /// checkpoint and no open ARU that logged anything.
    fn checkpoint_unlocked(&self, mut g: MutexGuard<'_, Inner>) -> LdResult<()> {
        let p = self.begin_checkpoint(&mut g)?;
        drop(g);
        let res = p.write(&*self.dev, &self.flight);
        let mut g = self.lock();
        apply_checkpoint(&mut g, &p, res, &self.durable_op)
    }

    /// Phase 1, the snapshot point (`checkpointer`): seals the open partial,
    /// places every dirty map page in the log through the log writer, and
    /// encodes the slot as of now (map root, usage table, log head after
    /// the map pages). What the slot names is queued in order before
    /// anything sealed later, so a later group commit covers it too.
    fn begin_checkpoint(&self, g: &mut Inner) -> LdResult<Arc<PendingCheckpoint>> {
        assert_eq!(g.open_nonempty, 0, "checkpoint with an ARU open");
        assert!(g.ckpt.is_none(), "two checkpoints pending");
        assert!(g.undo.is_empty(), "checkpoint with undo information kept");
        // Taken first: a failure below must not leave it to a later one.
        let change = g.snap_change.take();
        self.seal(g)?;
        // This checkpoint names (or releases) every segment left so far:
        // none is told of after its hook (`SegmentHook`).
        let segments_told = self.left.as_ref().map_or(0, |left| left.forget());
        // Admission kept room for exactly this placement.
        let (entered, page) = (g.log.entered, g.log.page);
        let predicted = checkpoint_log_pages(&g.geo, page, g.map.dirty_pages());
        let dirtied = g.map.dirtied_pages();
        let root = self.write_map_pages(g)?;
        let used = (g.log.entered - entered) as i64 * g.geo.segment_pages as i64
            + g.log.page as i64
            - page as i64;
        assert!(
            used <= predicted,
            "checkpoint took {used} log pages, {predicted} predicted"
        );
        for old in g.map.take_obsolete() {
            if let Some(seg) = g.geo.segment_of(old.addr) {
                g.usage.sub_live(seg, PAGE_BYTES as u32);
            }
        }
        // The live counts are now exactly this checkpoint's tree: a
        // snapshot taken here pins the segments holding live bytes.
        match change {
            None => {}
            Some(SnapChange::Take {
                name,
                time_secs,
                protected,
                window_secs,
            }) => {
                let shared = protected && self.geo().kept_table();
                let pin = match generation_pin(&g.snapshots, shared, time_secs, window_secs) {
                    Some(bit) => {
                        // The generation's bit goes onto the segments this
                        // tree needs that it does not have yet.
                        g.usage.pin_live_shared(bit);
                        bit
                    }
                    None => {
                        let used = g.snapshots.iter().fold(0u32, |m, s| m | 1 << s.pin);
                        let pin = (0..PIN_BITS)
                            .find(|b| used & (1 << b) == 0)
                            .expect("a free pin bit checked before the checkpoint");
                        g.usage.pin_live(pin);
                        pin
                    }
                };
                g.snapshots.push(SnapshotRecord {
                    number: g.serial + 1,
                    time_secs,
                    map_root: root.map(|r| (r.ptr, r.height, r.entries)),
                    next_list: g.next_list,
                    pin,
                    name,
                    protected,
                });
            }
            Some(SnapChange::Delete(numbers)) => {
                let before = g.snapshots.len();
                let gone_pins = g
                    .snapshots
                    .iter()
                    .filter(|s| numbers.contains(&s.number))
                    .fold(0u32, |m, s| m | 1 << s.pin);
                g.snapshots.retain(|s| !numbers.contains(&s.number));
                assert_eq!(
                    before - g.snapshots.len(),
                    numbers.len(),
                    "snapshots checked before the checkpoint"
                );
                self.kept_deleted.fetch_add(1, Ordering::Release);
                // A bit goes when no record is left with it (a generation's
                // last); segments only such bits pinned and the live tree
                // left empty are released by this very checkpoint, once
                // durable (inv. 7).
                let kept = g.snapshots.iter().fold(0u32, |m, s| m | 1 << s.pin);
                for b in 0..PIN_BITS {
                    if gone_pins & !kept & (1 << b) != 0 {
                        g.usage.unpin(b);
                    }
                }
            }
        }
        let released = g.usage.releasable();
        let header = CheckpointHeader {
            serial: g.serial + 1,
            epoch: g.log.epoch,
            next_seq: g.log.seq,
            log_segment: g.log.seg.0,
            log_page: g.log.page,
            next_segment: g.log.next.0,
            map_root: root.map(|r| (r.ptr, r.height, r.entries)),
            next_list: g.next_list,
            user_bytes: g.user_bytes,
            moved_bytes: g.moved_bytes,
            snapshots: g.snapshots.clone(),
        };
        let slot_bytes = checkpoint::encode(&g.geo, &header, &g.usage, &released);
        let slot = (header.serial % 2) as usize;
        g.log_bytes_since_checkpoint = 0;
        let discard = if self.opts.discard {
            released
                .iter()
                .map(|&s| (g.geo.page_addr(s, 0), g.geo.segment_bytes()))
                .collect()
        } else {
            Vec::new()
        };
        let p = PendingCheckpoint::new(Plan {
            serial: header.serial,
            ticket: self.flight.submitted(),
            slot_addr: g.geo.slot_addr(slot),
            slot_bytes,
            discard,
            released,
            segments_told,
            op_seq: g.op_seq,
            dirtied,
            hook: g.checkpoint_hook.clone(),
        });
        g.ckpt = Some(p.clone());
        Ok(p)
    }

    /// Places every dirty map page, children first, in partial segments of
    /// MapPage records queued on the log writer; returns the new root.
    fn write_map_pages(&self, g: &mut Inner) -> LdResult<Option<MapRoot>> {
        // Called even with nothing dirty: a map emptied since the last
        // checkpoint has no dirty page but a new (absent) root.
        let total = g.map.dirty_pages();
        let flight = &*self.flight;
        let Inner {
            map,
            usage,
            log,
            stats,
            clock,
            writer,
            geo,
            ..
        } = &mut *g;
        let geo = &*geo;
        let writer = writer.as_ref().expect("writable engine has a log writer");
        let mut remaining = total;
        let mut cur: Option<MapPartial> = None;
        let mut place = |page: &[u8]| -> LdResult<u64> {
            if cur.is_none() {
                let mut k = map_pages_fit(geo.segment_pages - log.page).min(remaining);
                if k == 0 {
                    enter_next(usage, log, clock, geo)?;
                    k = map_pages_fit(geo.segment_pages).min(remaining);
                }
                assert!(k > 0, "segment too small for one map page");
                cur = Some(MapPartial {
                    k,
                    start_page: log.page,
                    summary_pages: summary::summary_pages_for(k * MAP_RECORD_BYTES),
                    pages: Vec::with_capacity(k),
                });
            }
            let p = cur.as_mut().expect("partial started above");
            let addr = geo.page_addr(
                log.seg,
                p.start_page + p.summary_pages + p.pages.len() as u32,
            );
            p.pages.push(page.to_vec());
            if p.pages.len() == p.k {
                let p = cur.take().expect("partial started above");
                let bytes = map_partial_bytes(geo, log, &p);
                flight
                    .submit(writer, geo.page_addr(log.seg, log.page), bytes)
                    .map_err(LdError::ReadOnly)?;
                usage.add_live(log.seg, (p.k * PAGE_BYTES) as u32, log.seq);
                usage.touch(log.seg, log.seq);
                log.page += p.summary_pages + p.k as u32;
                log.seq += 1;
                stats.partials_written += 1;
                stats.map_pages_written += p.k as u64;
                remaining -= p.k;
                if geo.segment_pages - log.page < 2 {
                    enter_next(usage, log, clock, geo)?;
                }
            }
            Ok(addr)
        };
        let root = map.write_dirty(&mut place);
        match root {
            Ok(root) => {
                assert_eq!(
                    remaining, 0,
                    "map wrote fewer pages than it said were dirty"
                );
                Ok(root)
            }
            Err(e) => Err(self.fail(g, e)),
        }
    }
}

/// Phase 3 of a checkpoint, under the lock: once the slot is durable,
/// adopts its serial, releases the segments its snapshot found empty and
/// publishes the operations it made durable; a failed phase 2 turns the
/// engine read-only. Does nothing (but return `res`) if another thread
/// applied it already.
fn apply_checkpoint(
    g: &mut Inner,
    p: &Arc<PendingCheckpoint>,
    res: LdResult<()>,
    durable_op: &AtomicU64,
) -> LdResult<()> {
    if !g.ckpt.as_ref().is_some_and(|c| Arc::ptr_eq(c, p)) {
        return res;
    }
    g.ckpt = None;
    if let Err(e) = res {
        return Err(fail_state(g, e));
    }
    assert_eq!(p.plan.serial, g.serial + 1, "checkpoints out of order");
    g.stats.device_flushes += 2;
    g.stats.checkpoints += 1;
    g.serial = p.plan.serial;
    g.usage.release(&p.plan.released);
    g.stats.segments_discarded += p.discarded();
    if g.log.next == g.log.seg {
        // The log had no segment to continue in; now it may.
        let Inner { usage, log, .. } = &mut *g;
        choose_next(usage, log);
    }
    g.stats.segments_released += p.plan.released.len() as u64;
    durable_op.fetch_max(p.plan.op_seq, Ordering::SeqCst);
    Ok(())
}

/// A device write or flush failed: nothing more is written, reads go on.
fn fail_state(g: &mut Inner, e: LdError) -> LdError {
    if g.failed.is_none() {
        let why = format!("device error, engine is now read-only: {e}");
        eprintln!("ldfs: {why}");
        g.failed = Some(why);
    }
    e
}

/// Encoded size of a MapPage summary record.
pub(crate) const MAP_RECORD_BYTES: usize = 26;

/// A partial segment of map pages being planned.
struct MapPartial {
    k: usize,
    start_page: u32,
    summary_pages: u32,
    pages: Vec<Vec<u8>>,
}

/// The log after an operation (`Engine::log_after`).
#[derive(Clone, Copy, Debug)]
struct LogRoom {
    /// Pages it can still take (negative: the operation does not fit).
    left: i64,
    /// Page of the head's segment where the next partial would start.
    page: u32,
}

/// The reserve in pages, as (lower half: the checkpoint's, upper half:
/// deletes', ARU ends' and the cleaner's).
fn reserve_halves(geo: &Geometry) -> (i64, i64) {
    let r = geo.reserved_segments as i64 * geo.segment_pages as i64;
    (r / 2, r - r / 2)
}

/// Pages kept free beyond the next checkpoint's own: for ARU end records,
/// which are never refused, and for a recovery that dirties a few more map
/// pages than the running engine did (`Map::dirtied_pages`).
fn margin_pages(geo: &Geometry) -> i64 {
    let (lower, upper) = reserve_halves(geo);
    ((lower + upper) / 16).max(4)
}

/// Map pages an abort makes again when it puts back the entries of a range
/// that held `leaves` leaves: the undo re-inserts them one by one, into a
/// gap with keys after it, so splits halve leaves (at most two for each leaf
/// there was, and the edges), with new parents. (Relinking the removed
/// subtrees' pages, which stay on disk until a checkpoint, would cost
/// nothing; the map cannot do that yet.)
fn undo_pages(leaves: usize) -> usize {
    let l = 2 * leaves + 2;
    l + l.div_ceil(super::map::INTERNAL_CAPACITY / 2)
}

/// `Engine::checkpoint_share` for a dirty-page limit.
fn checkpoint_share(geo: &Geometry, limit: usize) -> i64 {
    let (lower, _) = reserve_halves(geo);
    let most = (lower - margin_pages(geo)).max(0);
    if limit > lower.max(0) as usize {
        // A checkpoint takes at least a page per dirty page.
        return most;
    }
    checkpoint_log_pages_anywhere(geo, limit).min(most)
}

/// Map pages a checkpoint puts into one fresh segment when it has more than
/// that to write (`write_map_pages`: partials as large as the summary
/// limits allow, until fewer than two pages are left).
fn map_pages_per_segment(geo: &Geometry) -> usize {
    let sp = geo.segment_pages;
    let (mut page, mut placed) = (0u32, 0usize);
    loop {
        let k = map_pages_fit(sp - page);
        if k == 0 {
            return placed;
        }
        page += summary::summary_pages_for(k * MAP_RECORD_BYTES) + k as u32;
        placed += k;
        if sp - page < 2 {
            return placed;
        }
    }
}

/// Log pages a checkpoint writing `dirty` map pages takes when the head is
/// at `page` of its segment, counting the segment tails it skips: exactly
/// `write_map_pages`'s placement (the checkpoint asserts it took no more).
pub(crate) fn checkpoint_log_pages(geo: &Geometry, page: u32, dirty: usize) -> i64 {
    let sp = geo.segment_pages;
    let (mut page, mut left, mut used) = (page, dirty, 0i64);
    while left > 0 {
        if page == 0 {
            // Whole segments at once.
            let per = map_pages_per_segment(geo);
            let n = left / per;
            used = used.saturating_add((n as i64).saturating_mul(sp as i64));
            left -= n * per;
            if left == 0 {
                break;
            }
        }
        let k = map_pages_fit(sp - page).min(left);
        if k == 0 {
            used += (sp - page) as i64;
            page = 0;
            continue;
        }
        let taken = summary::summary_pages_for(k * MAP_RECORD_BYTES) + k as u32;
        page += taken;
        used += taken as i64;
        left -= k;
        if sp - page < 2 {
            used += (sp - page) as i64;
            page = 0;
        }
    }
    used
}

/// `checkpoint_log_pages` from wherever the head may be: a partial in the
/// head's segment costs at most a summary and a skipped page more than
/// starting afresh (checked against every start page by a test).
fn checkpoint_log_pages_anywhere(geo: &Geometry, dirty: usize) -> i64 {
    if dirty == 0 {
        return 0;
    }
    let s = summary::summary_pages_for(map_pages_per_segment(geo) * MAP_RECORD_BYTES);
    checkpoint_log_pages(geo, 0, dirty) + s as i64 + 2
}

/// The default `checkpoint_dirty_pages`: an eighth of the reserve, at least
/// 64 pages, but never more than a checkpoint (with the margin) can write
/// within its half of the reserve from anywhere, so the checkpoint due at
/// that limit always fits there.
fn default_dirty_limit(geo: &Geometry) -> usize {
    let (lower, upper) = reserve_halves(geo);
    let budget = lower - margin_pages(geo);
    // The largest count whose checkpoint fits the budget (monotone).
    let (mut lo, mut hi) = (0usize, lower.max(0) as usize);
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        if checkpoint_log_pages_anywhere(geo, mid) <= budget {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    (((lower + upper) / 8).max(64) as usize).min(lo).max(1)
}

/// Most map pages one partial segment can hold in `pages_left` pages.
fn map_pages_fit(pages_left: u32) -> usize {
    let limit = (writer::MAX_RECORD_BYTES / MAP_RECORD_BYTES).min(summary::MAX_RECORDS as usize);
    let mut k = (pages_left as usize).min(limit);
    while k > 0
        && summary::summary_pages_for(k * MAP_RECORD_BYTES) as usize + k > pages_left as usize
    {
        k -= 1;
    }
    k
}

/// The bytes of a partial segment of map pages: summary, then the pages.
fn map_partial_bytes(geo: &Geometry, log: &LogHead, p: &MapPartial) -> Vec<u8> {
    let records: Vec<Record> = p
        .pages
        .iter()
        .enumerate()
        .map(|(j, page)| Record::MapPage {
            level: page[4],
            first_key: Key {
                list: u64::from_le_bytes(page[16..24].try_into().unwrap()),
                index: u64::from_le_bytes(page[24..32].try_into().unwrap()),
            },
            data_off: (j * PAGE_BYTES) as u32,
            crc: crc32c::crc32c(page),
        })
        .collect();
    let header = SummaryHeader {
        fs_id: geo.fs_id,
        epoch: log.epoch,
        seq: log.seq,
        segment: log.seg.0,
        page: log.page,
        next_segment: log.next.0,
        summary_pages: p.summary_pages,
        data_pages: p.k as u32,
    };
    let mut bytes = summary::encode(&header, &records);
    for page in &p.pages {
        bytes.extend_from_slice(page);
    }
    bytes
}

/// A segment's live blocks (map entries) and map pages (addresses).
type SegmentContents = (Vec<(Key, MapEntry)>, Vec<u64>);

/// Moves the log head into the next segment and chooses the one after it.
pub(crate) fn advance_head(usage: &mut Usage, log: &mut LogHead, geo: &Geometry) -> LdResult<()> {
    if log.next == log.seg {
        return Err(LdError::NoSpace {
            needed: geo.segment_bytes(),
            available: 0,
        });
    }
    usage.transition(log.seg, SegmentState::Dirty);
    usage.transition(log.next, SegmentState::Active);
    log.seg = log.next;
    log.page = 0;
    log.entered += 1;
    choose_next(usage, log);
    Ok(())
}

/// The segments the log left that `LldOptions::segment_hook` has not been
/// told of yet, each with the log writer's item that ends its writes. A
/// lock of its own, not the engine's: they are told as the log writer's
/// writes return (`Flight::set_on_written`), by whoever wrote, so a burst
/// the writer finishes after the engine went quiet still goes up (review
/// 39 finding 3). Telling happens under this lock, and a checkpoint's
/// snapshot forgets the queue under it too, so no report follows the
/// snapshot of a checkpoint that names or releases its segment.
struct LeftSegments {
    hook: SegmentHook,
    queue: Mutex<LeftQueue>,
}

#[derive(Default)]
struct LeftQueue {
    left: VecDeque<(SegmentId, u64)>,
    /// The hook panicked: no more reports (the checkpoints still name every
    /// segment; only the early uploads stop).
    broken: bool,
    /// The highest written count told so far: a push after a write whose
    /// `tell` found the queue empty still sees it (review 40 finding 2).
    written: u64,
    /// Segments reported to the hook so far.
    told: u64,
}

impl LeftSegments {
    fn lock(&self) -> MutexGuard<'_, LeftQueue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `seg` was left with its last write at item `ticket`; `written` items
    /// were written when the caller looked (a write may have returned
    /// before the push).
    fn push(&self, seg: SegmentId, ticket: u64, written: u64) {
        let mut q = self.lock();
        if q.broken {
            return;
        }
        q.left.push_back((seg, ticket));
        self.tell_locked(&mut q, written);
    }

    /// Items `1..=written` are written: tells of the segments they end.
    fn tell(&self, written: u64) {
        let mut q = self.lock();
        self.tell_locked(&mut q, written);
    }

    fn tell_locked(&self, q: &mut LeftQueue, written: u64) {
        q.written = q.written.max(written);
        while let Some(&(seg, ticket)) = q.left.front() {
            if ticket > q.written || q.broken {
                break;
            }
            q.left.pop_front();
            q.told += 1;
            // The hook runs on whichever thread wrote (the log writer's, or
            // one holding the engine lock): a panic must reach neither, one
            // ending the writer thread in silence, the other poisoning the
            // engine (review 40 finding 1).
            let hook = &self.hook;
            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (hook.0)(seg))).is_err() {
                eprintln!(
                    "ldfs: the segment hook panicked at segment {}: no more segments are \
                     reported (checkpoints still name them all)",
                    seg.0
                );
                q.broken = true;
                q.left.clear();
            }
        }
    }

    /// A checkpoint's snapshot: the queue forgotten; the reports made so far.
    fn forget(&self) -> u64 {
        let mut q = self.lock();
        q.left.clear();
        q.told
    }
}

/// `advance_head` for the running engine: the cleaner's clock notes it.
fn enter_next(
    usage: &mut Usage,
    log: &mut LogHead,
    clock: &mut LogClock,
    geo: &Geometry,
) -> LdResult<()> {
    advance_head(usage, log, geo)?;
    clock.note(log.entered, log.seq);
    Ok(())
}

/// Chooses a clean segment to follow the active one, if there is one.
pub(crate) fn choose_next(usage: &mut Usage, log: &mut LogHead) {
    if let Some(s) = usage.pick_clean(log.seg) {
        usage.transition(s, SegmentState::Next);
        log.next = s;
    } else {
        log.next = log.seg;
    }
}

pub(crate) fn drain_error(e: Result<crate::device::DeviceError, String>) -> LdError {
    match e {
        Ok(dev) => LdError::Device(dev),
        Err(why) => LdError::ReadOnly(format!("device error, engine is now read-only: {why}")),
    }
}

impl Engine {
    /// Reserves `bytes` for `aru`: the live data must fit the capacity
    /// (with one segment's slack for freeing operations, as metadata writes
    /// have) and the log must keep `class`'s part of the reserve. Waits for
    /// the cleaner (and the checkpoint that releases what it emptied) while
    /// the ARU has logged nothing yet.
    fn reserve_class(&self, aru: AruId, bytes: u64, class: Class) -> LdResult<()> {
        // Each reserved byte may come as a block with its summary record:
        // count the record of a block per page plus a partial's rounding.
        let with_overhead = bytes
            .saturating_add(bytes.div_ceil(PAGE_BYTES as u64) * WRITE_RECORD_BYTES as u64)
            .saturating_add(2 * PAGE_BYTES as u64);
        let pages = with_overhead.div_ceil(PAGE_BYTES as u64);
        let mut wait = SpaceWait::default();
        // Whether a freeing reservation still lets the cleaner make room first.
        let mut clean_anyway = true;
        loop {
            let mut g = self.lock_writable()?;
            if !g.arus.contains_key(&aru.0) {
                return Err(LdError::NoSuchAru(aru));
            }
            let footprint = self.footprint_bytes(&g, class);
            // A freeing operation gives back more than it takes.
            let slack = match class {
                Class::User => 0,
                Class::Meta | Class::Clean => self.geo().segment_bytes().max(with_overhead),
            };
            let capacity = self.capacity_bytes() + slack;
            if footprint.saturating_add(with_overhead) > capacity {
                // What was checked, records and rounding included: the
                // shortfall a caller computes from it is exact.
                return Err(LdError::NoSpace {
                    needed: with_overhead,
                    available: capacity.saturating_sub(footprint),
                });
            }
            let left = self.log_after(&g, 0, 0).left - self.reserved_by_others(&g, aru.0);
            let have = g.arus[&aru.0].reserved.div_ceil(PAGE_BYTES as u64) as i64;
            // The reserved writes will be admitted later, wherever the head
            // is then, and dirty map pages of their own: room for the
            // checkpoint from anywhere, with one change's pages. (A
            // reservation cannot bound how many leaves its writes touch;
            // if its ARU dirties more than the checkpoint's share of the
            // reserve, its writes may still get NoSpace.)
            let dirty = Self::dirtied_for_recovery(&g) + g.map.change_bound();
            let mut floor =
                self.floor_pages(&g.geo, class, checkpoint_log_pages_anywhere(&g.geo, dirty));
            if class == Class::User {
                floor += self.map_allowance(&g);
            }
            let after = left - have - (pages as i64);
            // A freeing reservation lets the cleaner make room first while
            // it would take the log below the user floor (`lock_for_meta`).
            let clean_first = clean_anyway
                && class == Class::Meta
                && self.meta_wants_cleaning(&g, aru.0, after, 0, g.map.change_bound());
            if after >= floor && !clean_first {
                g.arus.get_mut(&aru.0).expect("checked above").reserved += with_overhead;
                return Ok(());
            }
            let available = (left - have - floor).max(0) as u64 * PAGE_BYTES as u64;
            let e = LdError::NoSpace {
                needed: bytes,
                available,
            };
            if !self.may_clean_for(&g, aru.0) {
                return Err(e);
            }
            let seen = g.usage.clean_count();
            drop(g);
            // Cleaning first, it has its own floor to fall back to: no
            // waiting for open ARUs (`SpaceWait::freeing`).
            wait.freeing = clean_first && after >= floor;
            match self.clean_for_space(seen, &mut wait) {
                Ok(true) => {}
                // Cleaning cannot help (or failed: `lock_for_meta`);
                // the reservation fits its own floor: take it there (next
                // time round).
                Ok(false) | Err(_) if clean_first && after >= floor => {
                    if !wait.busy {
                        self.note_futile(64);
                    }
                    // Taken at its own floor next time round.
                    clean_anyway = false;
                }
                Ok(false) => return Err(e),
                Err(err) => return Err(err),
            }
        }
    }
}

/// Largest single device read `read_range` issues for adjacent blocks.
const READ_RUN_BYTES: u64 = 1 << 20;

/// Blocks shorter than this are stored plain: a compressed form's framing
/// (4 bytes for LZ4, 6 to 9 for a Zstandard frame) eats what little it saves.
const COMPRESS_MIN_BYTES: usize = 256;

/// The stored form of `data` under `compression` and its entry flags, or
/// `None` when it should be stored plain: compression is off, the block is
/// small, or compressing saves less than a sixteenth (a block that barely
/// shrinks costs a decompression on every read for next to no space, and
/// random or already-compressed data is given up on after one attempt).
fn encode_stored(compression: Compression, data: &[u8]) -> Option<(Vec<u8>, u8)> {
    if data.len() < COMPRESS_MIN_BYTES {
        return None;
    }
    let (c, flags) = match compression {
        Compression::Off => return None,
        Compression::Lz4 => (
            lz4_flex::compress_prepend_size(data),
            entry_flags::COMPRESSED,
        ),
        Compression::Zstd { level } => {
            if !zstd_may_pay(data) {
                return None;
            }
            (zstd_compress(data, level)?, entry_flags::ZSTD)
        }
    };
    pays(data, &c).then_some((c, flags))
}

/// Whether `stored` is at least a sixteenth smaller than `data`.
fn pays(data: &[u8], stored: &[u8]) -> bool {
    stored.len() <= data.len() - data.len() / 16
}

/// A cheap screen before zstd, whose attempt on random data costs several
/// times an LZ4 one: bytes spread nearly evenly (over 7 bits of entropy a
/// byte, estimated from a sample) leave zstd's entropy coder nothing, so only repeats could pay, and
/// LZ4 finds those; if it finds too few, the block is stored plain. Text,
/// hex and the like (low entropy) go to zstd directly.
fn zstd_may_pay(data: &[u8]) -> bool {
    // About 1024 bytes spread over the block, and the collision entropy
    // (-log2 of the sum of squared frequencies: integer sums and one log;
    // it is at most the Shannon entropy, so the screen errs toward trying
    // zstd). From 1024 uniform bytes it is about 7.7.
    let step = (data.len() / 1024).max(1);
    let mut counts = [0u32; 256];
    let mut n = 0u64;
    for &b in data.iter().step_by(step) {
        counts[b as usize] += 1;
        n += 1;
    }
    let squares: u64 = counts.iter().map(|&c| c as u64 * c as u64).sum();
    let bits = -((squares as f64) / (n * n) as f64).log2();
    bits < 7.0 || pays(data, &lz4_flex::compress_prepend_size(data))
}

thread_local! {
    /// One Zstandard context per thread that writes (creating one costs
    /// more than compressing a 4 KiB block), with the level it is set to.
    static ZSTD_CCTX: std::cell::RefCell<Option<(u8, zstd::bulk::Compressor<'static>)>> =
        const { std::cell::RefCell::new(None) };
    static ZSTD_DCTX: std::cell::RefCell<Option<zstd::bulk::Decompressor<'static>>> =
        const { std::cell::RefCell::new(None) };
}

/// One Zstandard frame holding `data`, its content size recorded (the
/// decoder bounds its output by it); `None` if zstd fails (no memory), and
/// the block is then stored plain.
fn zstd_compress(data: &[u8], level: u8) -> Option<Vec<u8>> {
    ZSTD_CCTX.with(|c| {
        let mut c = c.borrow_mut();
        match &mut *c {
            Some((l, cctx)) if *l == level => {}
            slot => {
                let cctx = zstd::bulk::Compressor::new(level as i32).ok()?;
                *slot = Some((level, cctx));
            }
        }
        let (_, cctx) = c.as_mut().expect("set above");
        cctx.compress(data).ok()
    })
}

/// The cleaner's recompression of a cold block (LD section 3: compress
/// cold blocks during cleaning): its contents as one zstd frame at
/// `level`, if that is at least a sixteenth smaller than what is stored
/// now (and than the contents); `None` leaves the block as it is, as does
/// one that does not decode (the move keeps its bytes; reads report it).
pub(crate) fn recompress_cold(
    e: &MapEntry,
    stored: &[u8],
    level: u8,
    max_block: u32,
) -> Option<(Vec<u8>, u8)> {
    let data = decode_stored(e, stored.to_vec(), max_block).ok()?;
    if data.len() < COMPRESS_MIN_BYTES || !zstd_may_pay(&data) {
        return None;
    }
    let c = zstd_compress(&data, level)?;
    (pays(stored, &c) && pays(&data, &c)).then_some((c, entry_flags::ZSTD))
}

/// A block's stored bytes decoded as map-entry `flags` say: its contents,
/// or `Corrupt` (the fuzz target `stored_block`; reads go through the same
/// function).
pub fn decode_stored_block(flags: u8, stored: Vec<u8>, max_block: u32) -> LdResult<Vec<u8>> {
    let e = MapEntry {
        addr: 0,
        len: stored.len() as u32,
        crc: 0,
        flags,
    };
    decode_stored(&e, stored, max_block)
}

/// A list's hints block (list 0) decoded, or `Corrupt` (fuzz target).
pub fn decode_list_hints(b: &[u8]) -> LdResult<ListHints> {
    decode_hints(b, 0)
}

/// Decompresses a stored block if needed. The output is bounded before
/// anything is allocated: a corrupt length field or frame header cannot
/// make it allocate more than `max_block` bytes.
fn decode_stored(e: &MapEntry, stored: Vec<u8>, max_block: u32) -> LdResult<Vec<u8>> {
    let bad = |why: String| {
        LdError::Corrupt(Corruption {
            what: "compressed block",
            offset: e.offset(),
            reason: CorruptReason::Inconsistent(why),
        })
    };
    match e.flags & entry_flags::ON_DISK_MASK {
        0 => return Ok(stored),
        entry_flags::COMPRESSED => {}
        entry_flags::ZSTD => return zstd_decode(&stored, max_block).map_err(bad),
        f => return Err(bad(format!("flags {f:#x} name two compressions"))),
    }
    if stored.len() < 4 {
        return Err(bad("shorter than its length prefix".into()));
    }
    let n = u32::from_le_bytes(stored[..4].try_into().unwrap());
    if n == 0 || n > max_block {
        return Err(bad(format!("claims {n} bytes, limit {max_block}")));
    }
    lz4_flex::decompress_size_prepended(&stored).map_err(|e| bad(e.to_string()))
}

/// Decodes one Zstandard frame of at most `max_block` bytes that records
/// its content size; anything else is an error, never a panic.
fn zstd_decode(stored: &[u8], max_block: u32) -> Result<Vec<u8>, String> {
    let n = match zstd::zstd_safe::get_frame_content_size(stored) {
        Ok(Some(n)) => n,
        Ok(None) => return Err("zstd frame without its content size".into()),
        Err(_) => return Err("not a zstd frame".into()),
    };
    if n == 0 || n > max_block as u64 {
        return Err(format!("zstd frame claims {n} bytes, limit {max_block}"));
    }
    let n = n as usize;
    ZSTD_DCTX.with(|d| {
        let mut d = d.borrow_mut();
        if d.is_none() {
            *d = Some(zstd::bulk::Decompressor::new().map_err(|e| format!("zstd: {e}"))?);
        }
        let dctx = d.as_mut().expect("set above");
        // The capacity is the bound: zstd stops with an error rather than
        // write past it.
        let out = dctx
            .decompress(stored, n)
            .map_err(|e| format!("zstd: {e}"))?;
        if out.len() != n {
            return Err(format!(
                "zstd frame decodes to {} bytes, claims {n}",
                out.len()
            ));
        }
        Ok(out)
    })
}

impl LogicalDisk for Engine {
    fn max_block_bytes(&self) -> usize {
        self.max_block_bytes as usize
    }

    fn create_list(&self, aru: Option<AruId>, hints: ListHints) -> LdResult<ListId> {
        let mut g = self.lock_for_meta(aru, WRITE_RECORD_BYTES, encode_hints(&hints).len(), 1)?;
        let aru_id = self.check_aru(&g, aru)?;
        if let Some(near) = hints.near {
            self.check_list(&mut g, near)?;
        }
        let data = encode_hints(&hints);
        self.admit(
            &mut g,
            aru,
            WRITE_RECORD_BYTES,
            data.len(),
            Class::Meta,
            1,
            None,
        )?;
        let id = g.next_list;
        g.next_list += 1;
        self.write_hints(&mut g, aru_id, id, hints, data)?;
        Ok(ListId(id))
    }

    fn delete_list(&self, aru: Option<AruId>, list: ListId) -> LdResult<()> {
        let recs = |aru_id| {
            Record::DeleteList {
                aru: aru_id,
                list: list.0,
            }
            .encoded_len()
                + Record::Delete {
                    aru: aru_id,
                    key: Key::MIN,
                }
                .encoded_len()
        };
        let mut g = self.lock_for_meta(aru, recs(aru.map_or(0, |a| a.0)), 0, 2)?;
        let aru_id = self.check_aru(&g, aru)?;
        self.check_list(&mut g, list)?;
        let recs = recs(aru_id);
        // The list's blocks (a range) and its entry in list 0.
        self.admit(
            &mut g,
            aru,
            recs,
            0,
            Class::Meta,
            2,
            Some(list_range(list.0)),
        )?;
        // Both records in one partial segment: outside an ARU, roll-forward
        // applies each as it finds it, and a crash between two partials
        // would leave the list's entry without its blocks.
        self.make_room(&mut g, recs, 0)?;
        let key = Key {
            list: 0,
            index: list.0,
        };
        self.log_record(
            &mut g,
            Record::DeleteList {
                aru: aru_id,
                list: list.0,
            },
        )?;
        self.log_record(&mut g, Record::Delete { aru: aru_id, key })?;
        // Logged already: as in `delete`, a map that cannot follow stops
        // every later write.
        self.remove_keys(&mut g, aru_id, list_range(list.0))
            .map_err(|e| self.fail(&mut g, e))?;
        let r = self.pages();
        let old = g.map.remove(key, &r).map_err(|e| self.fail(&mut g, e))?;
        if let Some(old) = old {
            self.retire(&mut g, aru_id, &old);
        }
        g.undo.changed(aru_id, key, old, None);
        g.hints.remove(&list.0);
        self.after_op(&mut g);
        Ok(())
    }

    /// Rewrites the list's hints block in list 0 with the new choice (in
    /// `aru`, so it recovers with the operation that set it).
    fn set_compression(
        &self,
        aru: Option<AruId>,
        list: ListId,
        compression: Compression,
    ) -> LdResult<()> {
        let mut g = self.lock_for_meta(aru, WRITE_RECORD_BYTES, HINTS_BYTES, 1)?;
        let aru_id = self.check_aru(&g, aru)?;
        self.check_list(&mut g, list)?;
        let old = self.hints_of(&mut g, list)?;
        if old.compress == compression {
            return Ok(());
        }
        let hints = ListHints {
            compress: compression,
            ..old
        };
        let data = encode_hints(&hints);
        self.admit(
            &mut g,
            aru,
            WRITE_RECORD_BYTES,
            data.len(),
            Class::Meta,
            1,
            None,
        )?;
        self.write_hints(&mut g, aru_id, list.0, hints, data)
    }

    fn list_hints(&self, list: ListId) -> LdResult<Option<ListHints>> {
        if list.0 == 0 {
            return Ok(None);
        }
        let mut g = self.lock();
        match self.hints_of(&mut g, list) {
            Ok(h) => Ok(Some(h)),
            Err(LdError::NoSuchList(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn write(&self, aru: Option<AruId>, list: ListId, index: u64, data: &[u8]) -> LdResult<()> {
        let max = self.max_block_bytes as usize;
        if data.is_empty() || data.len() > max {
            return Err(LdError::BadBlockLength {
                len: data.len(),
                max,
            });
        }
        // Compress before taking the lock. The list's hints are all this
        // needs (NoSuchList if they are not cached and the list is gone);
        // whether the list exists is checked under the lock the write is
        // made under, below.
        if list.0 == 0 {
            return Err(LdError::InvalidArgument(
                "list 0 belongs to the engine".into(),
            ));
        }
        let (compress, metadata) = {
            let mut g = self.lock_writable()?;
            let h = self.hints_of(&mut g, list)?;
            (h.compress, h.kind == ListKind::Metadata)
        };
        let (stored, flags) = match encode_stored(compress, data) {
            Some((c, flags)) => (c, flags),
            None => (data.to_vec(), 0),
        };
        let crc = crc32c::crc32c(&stored);
        let key = Key::new(list, index);
        let mut stepped = false;
        let mut wait = SpaceWait::default();
        let (mut g, aru_id) = loop {
            let mut g = self.lock_writable()?;
            let aru_id = self.check_aru(&g, aru)?;
            // The list may have been deleted while the lock was dropped.
            self.check_list(&mut g, list)?;
            let may_clean = self.may_clean_for(&g, aru_id);
            if !stepped && may_clean && self.cleaning_wanted(&g) {
                // Below the start watermark: one bounded cleaning step
                // before this write (foreground cleaning).
                drop(g);
                stepped = true;
                self.clean_step(false)?;
                continue;
            }
            self.check_fits(&mut g, aru_id, key, stored.len(), metadata)?;
            match self.admit(
                &mut g,
                aru,
                WRITE_RECORD_BYTES,
                stored.len(),
                Class::User,
                1,
                None,
            ) {
                Ok(()) => break (g, aru_id),
                // The live data fits but clean segments do not: wait for the
                // cleaner to make them, then try again.
                Err(e @ LdError::NoSpace { .. }) if may_clean => {
                    stepped = true;
                    let seen = g.usage.clean_count();
                    drop(g);
                    if !self.clean_for_space(seen, &mut wait)? {
                        return Err(e);
                    }
                }
                Err(e) => return Err(e),
            }
        };
        g.user_bytes += stored.len() as u64;
        if !compress.is_off() {
            let st = &mut g.stats;
            st.compress_logical_bytes += data.len() as u64;
            st.compress_stored_bytes += stored.len() as u64;
            if flags == 0 {
                st.compress_blocks_plain += 1;
            } else {
                st.compress_blocks_compressed += 1;
            }
        }
        self.log_write(
            &mut g,
            PendingWrite {
                aru: aru_id,
                key,
                data: stored,
                crc,
                flags,
                age: 0,
            },
        )?;
        self.after_op(&mut g);
        Ok(())
    }

    fn read(&self, list: ListId, index: u64) -> LdResult<Option<Vec<u8>>> {
        if list.0 == 0 {
            return Err(LdError::InvalidArgument(
                "list 0 belongs to the engine".into(),
            ));
        }
        match self.read_stored(Key::new(list, index))? {
            None => Ok(None),
            Some((e, stored)) => decode_stored(&e, stored, self.max_block_bytes).map(Some),
        }
    }

    /// Takes the map entries of the range under one lock hold, then reads
    /// blocks that are adjacent on the device with one request of at most
    /// `READ_RUN_BYTES`. Everything else — a block still buffered, one
    /// alone, one whose bytes fail its checksum in the run (moved by the
    /// cleaner after the lock was dropped, or still in flight) — goes
    /// through `read`, which tells a move from damage.
    fn read_range(
        &self,
        list: ListId,
        range: Range<u64>,
        limit: usize,
    ) -> LdResult<Vec<(u64, Vec<u8>)>> {
        if list.0 == 0 {
            return Err(LdError::InvalidArgument(
                "list 0 belongs to the engine".into(),
            ));
        }
        if range.start >= range.end || limit == 0 {
            return Ok(Vec::new());
        }
        let mut found: Vec<(u64, MapEntry)> = Vec::new();
        {
            let mut g = self.lock();
            self.check_list(&mut g, list)?;
            let r = self.pages();
            g.map.range(
                Key::new(list, range.start),
                Key::new(list, range.end),
                &r,
                &mut |k, e| {
                    found.push((k.index, *e));
                    found.len() < limit
                },
            )?;
        }
        let on_device = |e: &MapEntry| !e.is_buffered() && e.device() == 0;
        let mut out = Vec::with_capacity(found.len());
        let mut i = 0;
        while i < found.len() {
            // A run of on-device blocks, each starting where the last ended.
            let mut j = i + 1;
            if on_device(&found[i].1) {
                let start = found[i].1.offset();
                let mut end = start + found[i].1.len as u64;
                while j < found.len()
                    && on_device(&found[j].1)
                    && found[j].1.offset() == end
                    && end - start + found[j].1.len as u64 <= READ_RUN_BYTES
                {
                    end += found[j].1.len as u64;
                    j += 1;
                }
            }
            if j - i == 1 {
                // Alone (still buffered, or not next to its neighbour).
                if let Some(b) = self.read(list, found[i].0)? {
                    out.push((found[i].0, b));
                }
                i = j;
                continue;
            }
            let start = found[i].1.offset();
            let last = &found[j - 1].1;
            let len = (last.offset() + last.len as u64 - start) as usize;
            let buf = match self.flight.read(start, len) {
                Some(b) => b,
                None => {
                    let mut b = vec![0u8; len];
                    self.dev.read_at(&mut b, start)?;
                    b
                }
            };
            for (idx, e) in &found[i..j] {
                let at = (e.offset() - start) as usize;
                let b = &buf[at..at + e.len as usize];
                if crc32c::crc32c(b) == e.crc {
                    out.push((*idx, decode_stored(e, b.to_vec(), self.max_block_bytes)?));
                } else if let Some(b) = self.read(list, *idx)? {
                    out.push((*idx, b));
                }
            }
            i = j;
        }
        Ok(out)
    }

    fn delete(&self, aru: Option<AruId>, list: ListId, index: u64) -> LdResult<()> {
        let rec = Record::Delete {
            aru: aru.map_or(0, |a| a.0),
            key: Key::new(list, index),
        };
        let mut g = self.lock_for_meta(aru, rec.encoded_len(), 0, 1)?;
        let aru_id = self.check_aru(&g, aru)?;
        self.check_list(&mut g, list)?;
        let key = Key::new(list, index);
        let rec = Record::Delete { aru: aru_id, key };
        self.admit(&mut g, aru, rec.encoded_len(), 0, Class::Meta, 1, None)?;
        self.log_record(&mut g, rec)?;
        let r = self.pages();
        // Logged already: if the map cannot follow (a map page that cannot
        // be read), nothing more may be written, or the log would hold a
        // delete the caller was told failed.
        let old = g.map.remove(key, &r).map_err(|e| self.fail(&mut g, e))?;
        if let Some(old) = old {
            self.retire(&mut g, aru_id, &old);
        }
        g.undo.changed(aru_id, key, old, None);
        self.after_op(&mut g);
        Ok(())
    }

    fn delete_range(&self, aru: Option<AruId>, list: ListId, range: Range<u64>) -> LdResult<()> {
        let rec = |aru_id| Record::DeleteRange {
            aru: aru_id,
            list: list.0,
            from: range.start,
            to: range.end,
        };
        let mut g = if range.start < range.end {
            self.lock_for_meta(aru, rec(aru.map_or(0, |a| a.0)).encoded_len(), 0, 1)?
        } else {
            self.lock_writable()?
        };
        let aru_id = self.check_aru(&g, aru)?;
        self.check_list(&mut g, list)?;
        if range.start >= range.end {
            return Ok(());
        }
        let rec = rec(aru_id);
        let removed = (Key::new(list, range.start), Key::new(list, range.end));
        self.admit(
            &mut g,
            aru,
            rec.encoded_len(),
            0,
            Class::Meta,
            1,
            Some(removed),
        )?;
        self.log_record(&mut g, rec)?;
        // Logged already: as in `delete`.
        self.remove_keys(
            &mut g,
            aru_id,
            (Key::new(list, range.start), Key::new(list, range.end)),
        )
        .map_err(|e| self.fail(&mut g, e))?;
        self.after_op(&mut g);
        Ok(())
    }

    fn indices(&self, list: ListId, from: u64, limit: usize) -> LdResult<Vec<u64>> {
        let mut g = self.lock();
        self.check_list(&mut g, list)?;
        let mut out = Vec::new();
        if limit == 0 {
            return Ok(out);
        }
        let (_, to) = list_range(list.0);
        let r = self.pages();
        g.map.range(Key::new(list, from), to, &r, &mut |k, _| {
            out.push(k.index);
            out.len() < limit
        })?;
        Ok(out)
    }

    fn prefetch(&self, list: ListId) -> LdResult<()> {
        let mut ranges: Vec<(u64, u64)> = Vec::new();
        {
            let mut g = self.lock();
            self.check_list(&mut g, list)?;
            let (from, to) = list_range(list.0);
            let r = self.pages();
            g.map.range(from, to, &r, &mut |_, e| {
                if !e.is_buffered() && e.device() == 0 {
                    ranges.push((e.offset(), e.len as u64));
                }
                true
            })?;
        }
        // In address order, pages that touch merged: one hint per run.
        ranges.sort_unstable();
        let page = PAGE_BYTES as u64;
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
        for (off, len) in ranges {
            let (start, end) = (off / page * page, (off + len).div_ceil(page) * page);
            match merged.last_mut() {
                Some((s, l)) if *s + *l >= start => *l = (*l).max(end - *s),
                _ => merged.push((start, end - start)),
            }
        }
        self.dev.will_need(&merged);
        Ok(())
    }

    fn lists(&self, from: u64, limit: usize) -> LdResult<Vec<ListId>> {
        let mut g = self.lock();
        let mut out = Vec::new();
        if limit == 0 {
            return Ok(out);
        }
        let (_, to) = list_range(0);
        let r = self.pages();
        g.map
            .range(Key::new(ListId(0), from.max(1)), to, &r, &mut |k, _| {
                out.push(ListId(k.index));
                out.len() < limit
            })?;
        Ok(out)
    }

    fn begin_aru(&self) -> LdResult<AruId> {
        let mut g = self.lock_writable()?;
        let id = g.next_aru;
        g.next_aru += 1;
        g.arus.insert(id, AruState::default());
        Ok(AruId(id))
    }

    fn end_aru(&self, aru: AruId) -> LdResult<()> {
        let mut g = self.lock_writable()?;
        let Some(state) = g.arus.get(&aru.0) else {
            return Err(LdError::NoSuchAru(aru));
        };
        if state.ops > 0 {
            let rec = Record::AruEnd { aru: aru.0 };
            // Space for the end record was kept back by every record of the
            // ARU: Meta class admission leaves room; it must not fail here.
            self.make_room(&mut g, rec.encoded_len(), 0)?;
            g.pending.add_record(rec);
            g.op_seq += 1;
            g.open_nonempty -= 1;
            if g.open_nonempty == 0 && g.aru_waiters > 0 {
                self.aru_cv.notify_all();
            }
        }
        let state = g.arus.remove(&aru.0).expect("checked above");
        g.undo.end(aru.0);
        self.drop_superseded(&mut g, state.superseded);
        self.after_op(&mut g);
        Ok(())
    }

    /// Takes back every operation of `aru` in memory (`undo`) and forgets
    /// its buffered writes; nothing is logged, so the ARU is never ended in
    /// the log and recovery drops whatever of it was written. Works on an
    /// engine turned read-only by a device error (it only restores memory);
    /// a map page that cannot be read on the way fails the engine.
    fn abort_aru(&self, aru: AruId) -> LdResult<()> {
        let mut g = self.lock();
        if !g.arus.contains_key(&aru.0) {
            return Err(LdError::NoSuchAru(aru));
        }
        let logged = self.abort_locked(&mut g, aru.0)?;
        if !logged || g.failed.is_some() || g.closed || self.opts.read_only {
            return Ok(());
        }
        self.after_op(&mut g);
        Ok(())
    }

    fn reserve(&self, aru: AruId, bytes: u64) -> LdResult<()> {
        self.reserve_class(aru, bytes, Class::User)
    }

    fn reserve_freeing(&self, aru: AruId, bytes: u64) -> LdResult<()> {
        self.reserve_class(aru, bytes, Class::Meta)
    }

    fn flush(&self) -> LdResult<()> {
        let target = {
            let g = self.lock();
            if let Some(why) = &g.failed {
                return Err(LdError::ReadOnly(why.clone()));
            }
            g.op_seq
        };
        // Group commit: one caller at a time leads, sealing and flushing
        // everything accepted so far; the others wait and return as soon as
        // a completed flush covers their operations.
        let mut busy = self.committing.lock().expect("commit lock poisoned");
        loop {
            if self.durable_op.load(Ordering::SeqCst) >= target {
                return Ok(());
            }
            if !*busy {
                break;
            }
            busy = self.commit_cv.wait(busy).expect("commit lock poisoned");
        }
        *busy = true;
        drop(busy);
        let res = self.flush_as_leader();
        *self.committing.lock().expect("commit lock poisoned") = false;
        self.commit_cv.notify_all();
        res
    }

    fn flush_list(&self, _list: ListId) -> LdResult<()> {
        // One log: flushing its prefix is the only way to flush a list.
        self.flush()
    }

    fn space(&self) -> SpaceStats {
        // What users can still have accepted: the capacity (the live-data
        // limit the cleaner can sustain) less what live blocks, their
        // summary records and ARU reservations take. Dead space is not
        // counted as used: the cleaner turns it into clean segments while
        // writes wait.
        // What only protected checkpoints hold is available too: they
        // yield when a write needs the space (DESIGN "Snapshots").
        let g = self.lock();
        let capacity = self.capacity_bytes();
        let yielding = g.usage.held_only_within(protected_pins(&g.snapshots));
        SpaceStats {
            capacity_bytes: capacity,
            available_bytes: capacity
                .saturating_sub(self.footprint_bytes(&g, Class::User))
                .saturating_add(yielding)
                .min(capacity),
            live_bytes: g.usage.live_bytes_total() + g.pending.data_bytes() as u64,
        }
    }
}

impl Engine {
    /// A device error anyone has met so far: the engine's own, the log
    /// writer's, or that of a pending checkpoint's phase 2 which phase 3
    /// has not applied yet (the checkpointer thread waits for the lock).
    /// Turns the engine read-only on the last two.
    fn device_failed(&self, g: &mut Inner) -> LdResult<()> {
        if let Some(why) = &g.failed {
            return Err(LdError::ReadOnly(why.clone()));
        }
        let why = self
            .flight
            .failed()
            .or_else(|| g.ckpt.as_ref().and_then(|p| p.failed()));
        match why {
            Some(why) => Err(self.fail(g, LdError::ReadOnly(why))),
            None => Ok(()),
        }
    }

    /// Seals, waits for the log writer, flushes the device. Returns Ok only
    /// if no device write or flush has failed before its own flush ended:
    /// after a failed flush (a checkpoint's, say) the device may have
    /// dropped writes it held, and a later flush that succeeds does not
    /// bring them back. (A flush on another thread under way when this
    /// one's device flush returned and failing after it is caught by the
    /// device: `flushes`.)
    fn flush_as_leader(&self) -> LdResult<()> {
        let (written, ticket) = {
            let mut g = self.lock();
            self.device_failed(&mut g)?;
            // This thread writes what it seals itself (`wait_written`,
            // below): the log writer thread is left asleep.
            self.flight.set_quiet(true);
            let sealed = self.seal(&mut g);
            self.flight.set_quiet(false);
            sealed?;
            g.stats.device_flushes += 1;
            // Everything accepted so far is queued up to here (the map
            // pages of a pending checkpoint too): later writes need not be
            // waited for.
            (g.op_seq, self.flight.submitted())
        };
        if let Err(e) = self.flight.wait_written(ticket) {
            let mut g = self.lock();
            return Err(self.fail(&mut g, drain_error(e)));
        }
        let res = self.dev.flush();
        let mut g = self.lock();
        if let Err(e) = res {
            return Err(self.fail(&mut g, e.into()));
        }
        self.device_failed(&mut g)?;
        self.durable_op.fetch_max(written, Ordering::SeqCst);
        Ok(())
    }

    /// Takes back every operation of open ARU `aru` (`abort_aru`); returns
    /// whether it had logged anything.
    fn abort_locked(&self, g: &mut Inner, aru: u64) -> LdResult<bool> {
        let state = g.arus.remove(&aru).expect("ARU checked open");
        if state.ops == 0 {
            // Nothing logged, nothing to take back (an fs operation that
            // failed its checks): dropping the ARU released its reservation.
            return Ok(false);
        }
        g.open_nonempty -= 1;
        if g.open_nonempty == 0 && g.aru_waiters > 0 {
            self.aru_cv.notify_all();
        }
        let restores = g.undo.abort(aru);
        let r = self.pages();
        for u in restores {
            let old = match u.to {
                Some(e) => g.map.insert(u.key, e, &r),
                None => g.map.remove(u.key, &r),
            };
            let old = match old {
                Ok(old) => old,
                Err(e) => return Err(self.fail(g, e)),
            };
            assert_eq!(old, u.from, "undo and map disagree on {:?}", u.key);
            if let Some(old) = old {
                if old.is_buffered() {
                    // The aborted ARU's own write, still in the partial.
                    g.pending.drop_write(old.addr as usize);
                } else if let Some(seg) = g.geo.segment_of(old.offset()) {
                    g.usage.sub_live(seg, old.len);
                }
            }
            if let Some(e) = u.to {
                if e.is_buffered() {
                    assert!(
                        g.pending.write_at(e.addr as usize).is_some(),
                        "restored {:?} names a dropped write",
                        u.key
                    );
                } else if let Some(seg) = g.geo.segment_of(e.offset()) {
                    g.usage.restore_live(seg, e.len);
                }
            }
            if u.key.list == 0 {
                g.hints.remove(&u.key.index);
            }
        }
        g.pending.drop_aru_writes(aru);
        Ok(true)
    }

    /// Removes every key in `[from, to)`, retiring each old version.
    fn remove_keys(&self, g: &mut Inner, aru: u64, (from, to): (Key, Key)) -> LdResult<()> {
        let r = self.pages();
        let removed = g.map.remove_range(from, to, &r)?;
        for (_, old) in &removed {
            self.retire(g, aru, old);
        }
        g.undo.removed_range(aru, from, to, removed);
        Ok(())
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        let closed = self
            .inner
            .lock()
            .map(|g| g.closed || g.failed.is_some())
            .unwrap_or(true);
        if !closed && !self.opts.read_only {
            if let Err(e) = self.close() {
                eprintln!("ldfs: final checkpoint failed: {e}");
            }
        }
        // Without the state lock: the thread takes it to finish a checkpoint.
        let ckpt = self.checkpointer.lock().ok().and_then(|mut c| c.take());
        if let Some(mut c) = ckpt {
            c.stop();
        }
        if let Ok(mut g) = self.inner.lock() {
            if let Some(mut w) = g.writer.take() {
                w.stop();
            }
        }
    }
}

/// The log-structured Logical Disk: an [`Engine`] and, if
/// [`CleanerOptions::background`] is set, the background cleaner thread
/// that shares it. Derefs to the engine for its own methods (stats,
/// checkpoints, cleaning).
pub struct Lld {
    core: Arc<Engine>,
    background: Mutex<Option<Background>>,
}

impl std::ops::Deref for Lld {
    type Target = Engine;
    fn deref(&self) -> &Engine {
        &self.core
    }
}

impl Lld {
    /// Formats `dev` and opens it.
    pub fn create(
        dev: Arc<dyn Device>,
        mkfs_opts: &super::layout::MkfsOptions,
        opts: LldOptions,
    ) -> LdResult<Lld> {
        mkfs::mkfs(&*dev, mkfs_opts)?;
        Lld::open(dev, opts)
    }

    /// Opens a formatted device: newest valid checkpoint, then roll-forward;
    /// a rebuild from every summary if neither checkpoint slot is usable.
    /// Unless read-only, writes a checkpoint at once with a new epoch, so the
    /// recovered state is durable and stale summaries can never be replayed.
    /// Starts the background cleaner if the options ask for it.
    pub fn open(dev: Arc<dyn Device>, opts: LldOptions) -> LdResult<Lld> {
        let background = opts.cleaner.background && !opts.read_only;
        let core = Arc::new(Engine::open(dev, opts)?);
        let background = background.then(|| Background::start(core.clone()));
        Ok(Lld {
            core,
            background: Mutex::new(background),
        })
    }

    /// Stops the background cleaner (if running), then flushes and writes a
    /// final checkpoint; see [`Engine::close`].
    pub fn close(&self) -> LdResult<()> {
        self.stop_background();
        self.core.close()
    }

    /// Stops the engine without flushing or a final checkpoint, as a crash
    /// would (crash tests take the device image first).
    pub fn abandon(self) {
        self.core.lock().closed = true;
        self.stop_background();
    }

    /// Whether the background cleaner thread is running.
    pub fn background_cleaner_running(&self) -> bool {
        self.background
            .lock()
            .expect("background handle poisoned")
            .is_some()
    }

    /// Starts or stops the background cleaner thread at run time (`ldfs
    /// clean MOUNTPOINT --background on|off`). Writes still clean in the
    /// foreground when clean segments run low, whichever it is.
    pub fn set_background_cleaner(&self, on: bool) -> LdResult<()> {
        if !on {
            self.stop_background();
            return Ok(());
        }
        if self.core.options().read_only {
            return Err(LdError::ReadOnly(
                "no background cleaner on a read-only open".into(),
            ));
        }
        let mut bg = self.background.lock().expect("background handle poisoned");
        if bg.is_none() {
            *bg = Some(Background::start(self.core.clone()));
        }
        Ok(())
    }

    fn stop_background(&self) {
        let bg = self
            .background
            .lock()
            .expect("background handle poisoned")
            .take();
        if let Some(mut bg) = bg {
            bg.stop();
        }
    }

    fn touch(&self) {
        self.core.activity.fetch_add(1, Ordering::Relaxed);
    }
}

impl Drop for Lld {
    fn drop(&mut self) {
        // The thread holds a reference to the engine: stop it first, so the
        // engine's own drop (final checkpoint) runs here, once.
        self.stop_background();
    }
}

impl LogicalDisk for Lld {
    fn max_block_bytes(&self) -> usize {
        self.core.max_block_bytes()
    }
    fn create_list(&self, aru: Option<AruId>, hints: ListHints) -> LdResult<ListId> {
        self.touch();
        self.core.create_list(aru, hints)
    }
    fn delete_list(&self, aru: Option<AruId>, list: ListId) -> LdResult<()> {
        self.touch();
        self.core.delete_list(aru, list)
    }
    fn list_hints(&self, list: ListId) -> LdResult<Option<ListHints>> {
        self.core.list_hints(list)
    }
    fn set_compression(
        &self,
        aru: Option<AruId>,
        list: ListId,
        compression: Compression,
    ) -> LdResult<()> {
        self.touch();
        self.core.set_compression(aru, list, compression)
    }
    fn write(&self, aru: Option<AruId>, list: ListId, index: u64, data: &[u8]) -> LdResult<()> {
        self.touch();
        self.core.write(aru, list, index, data)
    }
    fn read(&self, list: ListId, index: u64) -> LdResult<Option<Vec<u8>>> {
        self.touch();
        self.core.read(list, index)
    }
    fn read_range(
        &self,
        list: ListId,
        range: Range<u64>,
        limit: usize,
    ) -> LdResult<Vec<(u64, Vec<u8>)>> {
        self.touch();
        self.core.read_range(list, range, limit)
    }
    fn delete(&self, aru: Option<AruId>, list: ListId, index: u64) -> LdResult<()> {
        self.touch();
        self.core.delete(aru, list, index)
    }
    fn delete_range(&self, aru: Option<AruId>, list: ListId, range: Range<u64>) -> LdResult<()> {
        self.touch();
        self.core.delete_range(aru, list, range)
    }
    fn indices(&self, list: ListId, from: u64, limit: usize) -> LdResult<Vec<u64>> {
        self.core.indices(list, from, limit)
    }
    fn lists(&self, from: u64, limit: usize) -> LdResult<Vec<ListId>> {
        self.core.lists(from, limit)
    }
    fn prefetch(&self, list: ListId) -> LdResult<()> {
        self.core.prefetch(list)
    }
    fn begin_aru(&self) -> LdResult<AruId> {
        self.touch();
        self.core.begin_aru()
    }
    fn end_aru(&self, aru: AruId) -> LdResult<()> {
        self.touch();
        self.core.end_aru(aru)
    }
    fn abort_aru(&self, aru: AruId) -> LdResult<()> {
        self.touch();
        self.core.abort_aru(aru)
    }
    fn reserve(&self, aru: AruId, bytes: u64) -> LdResult<()> {
        self.touch();
        self.core.reserve(aru, bytes)
    }
    fn reserve_freeing(&self, aru: AruId, bytes: u64) -> LdResult<()> {
        self.touch();
        self.core.reserve_freeing(aru, bytes)
    }
    fn flush(&self) -> LdResult<()> {
        self.touch();
        self.core.flush()
    }
    fn flush_list(&self, list: ListId) -> LdResult<()> {
        self.touch();
        self.core.flush_list(list)
    }
    fn space(&self) -> SpaceStats {
        self.core.space()
    }
}

/// A block the cleaner wants moved: the map entry it found live and the
/// stored bytes it read from the victim (checked against the entry's crc).
pub(crate) struct Move {
    pub key: Key,
    pub expected: MapEntry,
    pub stored: Vec<u8>,
    /// The victim's age (last sequence written into it): the block keeps it.
    pub age: u64,
    /// The block's new stored form and flags, if the cleaner recompressed
    /// it (`recompress_cold`); else it moves as it is.
    pub recompressed: Option<(Vec<u8>, u8)>,
}

impl Move {
    /// Bytes the move writes.
    pub fn out_len(&self) -> usize {
        self.recompressed
            .as_ref()
            .map_or(self.stored.len(), |(b, _)| b.len())
    }
}

/// See `Engine::map_cost_of_moves`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MapCost {
    pub new_pages: usize,
    pub dirtied: usize,
    pub limit: usize,
    /// Pages one more move may dirty: a leaf's path.
    pub path_pages: usize,
}

/// What `relocate_batch` did.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct BatchOutcome {
    pub moved: u64,
    pub moved_bytes: u64,
    /// Blocks that died, moved or were claimed by an open ARU since they
    /// were found live: left alone.
    pub stale: u64,
    /// The cleaner's share of the reserve ran out before the batch did.
    pub out_of_space: bool,
}

/// The space situation as the cleaner sees it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SpaceView {
    pub clean: u32,
    /// Bytes the cleaner (Clean class) may count on writing before a
    /// checkpoint must release something: down to its floor from the user
    /// floor, or from where the log is if lower (`cleaner_view`).
    pub headroom_bytes: i64,
}

// ---- space limits and the cleaner's primitives -----------------------------
impl Engine {
    pub fn options(&self) -> &LldOptions {
        &self.opts
    }

    /// The live-data limit: bytes of live blocks plus their summary records
    /// that the segments outside the reserve hold with room for the cleaner
    /// to work (`CleanerOptions::max_live_percent`, after a per-segment
    /// allowance for summary pages, padding and the skipped tail).
    pub fn capacity_bytes(&self) -> u64 {
        self.capacity_for(self.geo().segment_count)
    }

    /// `capacity_bytes` with `count` segments (a shrink's check).
    fn capacity_for(&self, count: u32) -> u64 {
        let g = &self.geo();
        let allowance = 2 * PAGE_BYTES as u64 + g.max_block_bytes as u64 / 2;
        let per_segment = g.segment_bytes().saturating_sub(allowance);
        let segments = count.saturating_sub(g.reserved_segments) as u64;
        segments * per_segment / 100 * self.opts.cleaner.max_live_percent.min(100) as u64
    }

    /// What live data takes against `capacity_bytes`: live blocks and map
    /// pages, one summary record per mapped block, the open partial's data,
    /// and every ARU's unspent reservation; for user writes (`class`) and
    /// `space`, also the room kept for the cleaner to rewrite the map
    /// (`map_allowance`), so that users are told what they can really still
    /// write. Freeing operations leave it out, as their log floor does: the
    /// allowance grows faster than the live data near a full device, and a
    /// delete after a fill must not find the file system overfull.
    fn footprint_bytes(&self, g: &Inner, class: Class) -> u64 {
        let reserved: u64 = g.arus.values().map(|a| a.reserved).sum();
        let allowance = match class {
            Class::User => self.map_allowance(g) as u64 * PAGE_BYTES as u64,
            Class::Meta | Class::Clean => 0,
        };
        g.usage.live_bytes_total()
            + g.usage.history_bytes()
            + g.pending.data_bytes() as u64
            + g.map.len() * WRITE_RECORD_BYTES as u64
            + reserved
            + allowance
    }

    /// Fails with NoSpace if writing `len` bytes at `key` would take the
    /// live data past the capacity (replacing a block gives its bytes back).
    /// Writes covered by their ARU's reservation were counted when reserved.
    /// Blocks of metadata lists may overdraw the capacity by one segment:
    /// deleting on a full file system writes small records of its own (an
    /// inode's orphan mark, a rewritten directory bucket) and must not fail
    /// for the space it is about to free.
    fn check_fits(
        &self,
        g: &mut Inner,
        aru: u64,
        key: Key,
        len: usize,
        metadata: bool,
    ) -> LdResult<()> {
        let cost = (WRITE_RECORD_BYTES + len) as u64;
        if g.arus.get(&aru).is_some_and(|a| a.reserved >= cost) {
            return Ok(());
        }
        let r = self.pages();
        let old = g
            .map
            .get(key, &r)?
            .map_or(0, |e| e.len as u64 + WRITE_RECORD_BYTES as u64);
        let footprint = self.footprint_bytes(g, if metadata { Class::Meta } else { Class::User });
        let slack = if metadata { g.geo.segment_bytes() } else { 0 };
        let capacity = self.capacity_bytes() + slack;
        if footprint + cost > capacity + old {
            return Err(LdError::NoSpace {
                needed: len as u64,
                available: (capacity + old).saturating_sub(footprint + WRITE_RECORD_BYTES as u64),
            });
        }
        Ok(())
    }

    /// Whether an operation of `aru` may wait for the cleaner: not if its
    /// own ARU has logged something, since the checkpoint that frees the
    /// cleaned segments would then have to wait for that very ARU.
    fn may_clean_for(&self, g: &Inner, aru: u64) -> bool {
        g.arus.get(&aru).is_none_or(|a| a.ops == 0)
    }

    /// Below the start watermark and not told recently that cleaning is futile.
    fn cleaning_wanted(&self, g: &Inner) -> bool {
        g.usage.clean_count() < self.start_watermark() && g.op_seq >= g.clean_futile_until
    }

    /// Cleaning rounds (passes and checkpoints of its own) one write may
    /// wait through before giving up.
    pub(crate) fn wait_rounds(&self) -> u32 {
        2 * self.geo().segment_count + 8
    }

    /// Clean segments below which cleaning starts.
    pub fn start_watermark(&self) -> u32 {
        let c = &self.opts.cleaner;
        c.start_clean_segments
            .unwrap_or_else(|| {
                self.geo().reserved_segments + (self.geo().segment_count / 256).max(2)
            })
            .min(self.geo().segment_count)
    }

    /// Clean segments above which cleaning stops.
    pub fn stop_watermark(&self) -> u32 {
        let c = &self.opts.cleaner;
        c.stop_clean_segments
            .unwrap_or_else(|| self.start_watermark() + (self.geo().segment_count / 16).max(4))
            .max(self.start_watermark())
            .min(self.geo().segment_count)
    }

    /// Reserved segments (user writes leave them to checkpoints and the cleaner).
    pub fn reserved_segments(&self) -> u32 {
        self.geo().reserved_segments
    }

    /// Segments the log head has entered since open, and the sequence
    /// number of the next partial segment.
    #[cfg(test)]
    pub(crate) fn log_clock(&self) -> (u64, u64) {
        let g = self.lock();
        (g.log.entered, g.log.seq)
    }

    /// The sequence number before which a victim counts as cold
    /// (`LogClock`).
    pub(crate) fn cold_before(&self) -> u64 {
        let g = self.lock();
        g.clock.cold_before(g.log.entered)
    }

    /// Clean segments now, and segments a checkpoint would release.
    pub fn clean_segment_counts(&self) -> (u32, u32) {
        let g = self.lock();
        (g.usage.clean_count(), g.usage.releasable_count())
    }

    /// Bytes written by users and moved by the cleaner since mkfs (the write
    /// cost is `(user + moved) / user`).
    pub fn write_totals(&self) -> (u64, u64) {
        let g = self.lock();
        (g.user_bytes, g.moved_bytes)
    }

    /// The usage table as policies see it, and the space situation.
    pub(crate) fn cleaner_view(&self) -> (UsageSnapshot, SpaceView) {
        let g = self.lock();
        let snap = UsageSnapshot {
            segments: g.usage.iter().collect(),
            segment_bytes: self.geo().segment_bytes() as u32,
            now_seq: g.log.seq,
            max_utilization: 1.0,
        };
        let room = self.log_after(&g, 0, 0);
        // Only what lies below the user floor is the cleaner's for a whole
        // pass: room above it, freed by a checkpoint a moment before, user
        // writes take while the pass reads its victims. Planned on it, a
        // pass ran out of room with every victim partly emptied (its moves
        // sorted by key), released none, and left the cleaner no headroom
        // for another pass: the log was full for good (review 12, four
        // writers and the background cleaner).
        let user_floor = self.floor_after(&g, Class::User, room.page, 0);
        let headroom = (room.left - self.reserved_by_others(&g, 0)).min(user_floor)
            - self.floor_after(&g, Class::Clean, room.page, 0);
        let view = SpaceView {
            clean: g.usage.clean_count(),
            headroom_bytes: headroom * PAGE_BYTES as i64,
        };
        (snap, view)
    }

    /// Notes that cleaning found nothing to do: foreground steps pause for
    /// a while (`ops` more operations).
    pub(crate) fn note_futile(&self, ops: u64) {
        let mut g = self.lock();
        g.clean_futile_until = g.op_seq + ops;
    }

    /// Reads a whole segment once every queued log write has landed, without
    /// holding the state lock.
    pub(crate) fn read_segment(&self, seg: SegmentId) -> LdResult<Vec<u8>> {
        self.drain_flight()?;
        let mut b = vec![0u8; self.geo().segment_bytes() as usize];
        self.dev.read_at(&mut b, self.geo().page_addr(seg, 0))?;
        Ok(b)
    }

    /// The map entries of `(key, address)` pairs that are live there: the
    /// map names exactly that address (on the log device, written).
    pub(crate) fn live_entries(&self, cands: &[(Key, u64)]) -> LdResult<Vec<Option<MapEntry>>> {
        let mut g = self.lock();
        let r = self.pages();
        let mut out = Vec::with_capacity(cands.len());
        for &(key, addr) in cands {
            let e = g.map.get(key, &r)?;
            out.push(e.filter(|e| !e.is_buffered() && e.device() == 0 && e.offset() == addr));
        }
        Ok(out)
    }

    /// Moves blocks through the log as Meta-class writes outside any ARU,
    /// each only if the map still holds the entry it was found with and no
    /// open ARU wrote it. Stops early when the cleaner's share of the reserve
    /// is used up. Changes only the map (and the live counts).
    pub(crate) fn relocate_batch(&self, moves: Vec<Move>) -> LdResult<BatchOutcome> {
        let mut out = BatchOutcome::default();
        let mut g = self.lock_writable()?;
        for m in moves {
            assert_eq!(
                m.stored.len(),
                m.expected.len as usize,
                "cleaner read the wrong length"
            );
            let r = self.pages();
            // A snapshot taken since the pass chose its victims may pin
            // this one: moving its blocks would free nothing (it is never
            // released while pinned) and only add them to history.
            let pinned = self
                .geo()
                .segment_of(m.expected.offset())
                .is_some_and(|s| g.usage.get(s).pins != 0);
            if m.expected.is_buffered()
                || pinned
                || crc32c::crc32c(&m.stored) != m.expected.crc
                || g.map.get(m.key, &r)? != Some(m.expected)
                || g.undo.touches(m.key)
            {
                out.stale += 1;
                continue;
            }
            // Replacing an entry in place dirties the clean pages on its
            // leaf's path and nothing else (no split): near the floor, a
            // move into a leaf already dirty still fits.
            let new_pages = g.map.path_pages_to_dirty(m.key);
            match self.admit_pages(
                &mut g,
                None,
                WRITE_RECORD_BYTES,
                m.out_len(),
                Class::Clean,
                new_pages,
            ) {
                Ok(()) => {}
                Err(LdError::NoSpace { .. }) => {
                    out.out_of_space = true;
                    break;
                }
                Err(e) => return Err(e),
            }
            let (data, crc, flags) = match m.recompressed {
                Some((b, flags)) => {
                    g.stats.blocks_recompressed += 1;
                    g.stats.recompress_bytes_saved += m.stored.len() as u64 - b.len() as u64;
                    let crc = crc32c::crc32c(&b);
                    (b, crc, flags)
                }
                None => (
                    m.stored,
                    m.expected.crc,
                    m.expected.flags & entry_flags::ON_DISK_MASK,
                ),
            };
            let len = data.len() as u64;
            self.log_write(
                &mut g,
                PendingWrite {
                    aru: 0,
                    key: m.key,
                    data,
                    crc,
                    flags,
                    age: m.age.max(1),
                },
            )?;
            g.moved_bytes += len;
            g.stats.blocks_moved += 1;
            out.moved += 1;
            out.moved_bytes += len;
            // Seal a full partial, but begin no checkpoint in the middle of
            // a pass: one would write the leaves dirtied so far while, until
            // it finished, the floor still kept room to dirty them again (a
            // crash before its slot), and later moves would dirty some once
            // more. The pass counted every page its moves dirty, and its own
            // checkpoint follows it.
            if g.pending.data_bytes() >= self.opts.partial_bytes {
                if let Err(e) = self.seal(&mut g) {
                    self.fail(&mut g, e);
                }
            }
            // The moves so far stand; a failure after them stops the rest.
            self.check_writable(&mut g)?;
        }
        Ok(out)
    }

    /// What moving a victim would add to the next checkpoint: the map pages
    /// its moves (`keys`) and its live map pages (`addrs`) would newly
    /// dirty beyond those in `seen`; with the pages dirtied since the last
    /// checkpoint and the count at which one is taken.
    pub(crate) fn map_cost_of_moves(
        &self,
        keys: &[Key],
        addrs: &[u64],
        seen: &mut DirtySet,
    ) -> MapCost {
        let g = self.lock();
        MapCost {
            new_pages: g.map.pages_to_dirty(keys, addrs, seen),
            dirtied: g.map.dirtied_pages(),
            limit: self.dirty_page_limit(),
            path_pages: g.map.height(),
        }
    }

    /// Has every live map page among `addrs` rewritten by the next
    /// checkpoint to begin; returns how many were live, and the checkpoints
    /// begun so far (`checkpoint_counts`): the pages have moved once more
    /// than that many have finished.
    pub(crate) fn relocate_map_pages(&self, addrs: &[u64]) -> LdResult<(u64, u64)> {
        let mut g = self.lock_writable()?;
        let r = self.pages();
        let mut n = 0;
        for &a in addrs {
            if !self.map_page_fits(&g) {
                break;
            }
            if g.map.mark_page_dirty(a, &r)? {
                n += 1;
            }
        }
        Ok((n, g.stats.checkpoints + g.ckpt.is_some() as u64))
    }

    /// Whether the next checkpoint may take one more dirty map page (and
    /// its path) within the cleaner's share: what `admit` asks of a Meta
    /// operation, for a change that writes nothing but map pages.
    fn map_page_fits(&self, g: &Inner) -> bool {
        let room = self.log_after(g, 0, 0);
        room.left - self.reserved_by_others(g, 0)
            >= self.floor_after(g, Class::Clean, room.page, g.map.change_bound())
    }

    /// Checkpoints (releasing emptied segments) once no ARU that logged
    /// something is open, waiting up to `wait` for such ARUs to end (and
    /// first for a pending checkpoint). Operations go on while the device
    /// works. Returns whether it checkpointed. What a caller beside running
    /// operations uses (`checkpoint_now` fails at once while one holds an
    /// ARU that logged something: a store mount's `sync --remote` beside a
    /// writer did; review 33).
    pub fn checkpoint_when_quiet(&self, wait: Duration) -> LdResult<bool> {
        Ok(self
            .checkpoint_quiet_with(wait, &mut |_, _| Ok(None))?
            .is_some())
    }

    /// As `checkpoint_when_quiet`; once quiet, and under the same lock hold
    /// as the checkpoint's snapshot point, `change` may refuse (an error)
    /// or set a snapshot-table change for that checkpoint. Returns the
    /// serial of the checkpoint written, `None` if ARUs stayed open.
    fn checkpoint_quiet_with(
        &self,
        wait: Duration,
        change: &mut dyn FnMut(&Engine, &Inner) -> LdResult<Option<SnapChange>>,
    ) -> LdResult<Option<u64>> {
        let deadline = Instant::now() + wait;
        let mut g = self.lock_writable()?;
        loop {
            g = self.finish_pending_unlocked(g)?;
            if g.open_nonempty == 0 {
                break;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            // Counted under the lock the notifier holds: an ARU ending
            // after this sees the waiter.
            g.aru_waiters += 1;
            g = self
                .aru_cv
                .wait_timeout_while(g, left, |g| g.open_nonempty > 0)
                .expect("engine state poisoned by an earlier panic")
                .0;
            g.aru_waiters -= 1;
            self.check_writable(&mut g)?;
        }
        g.snap_change = change(self, &g)?;
        let serial = g.serial + 1;
        self.checkpoint_unlocked(g)?;
        Ok(Some(serial))
    }

    /// Takes a snapshot of the current state: a whole checkpoint, once no
    /// ARU that logged anything is open (waiting up to `SNAPSHOT_ARU_WAIT`),
    /// that the engine keeps until `delete_snapshot`. Returns its number
    /// once its slot is durable. `time_secs` is stored for display only
    /// (the engine reads no clock). Fails with `InvalidArgument` for a bad
    /// name or when `MAX_SNAPSHOTS` are kept, with `NoSpace` if live data
    /// and what history would hold then no longer fit the capacity.
    pub fn take_snapshot(&self, name: &str, time_secs: u64) -> LdResult<u64> {
        self.take_kept(name, time_secs, false, 0)
    }

    /// Takes a protected checkpoint (`protect=`): kept and read as a
    /// snapshot, but what only protected checkpoints hold counts as
    /// available in `space()`, since they are deleted, oldest first, when
    /// space runs short (by the caller: the engine reads no clock). On an
    /// image with a kept table, protected checkpoints whose `time_secs`
    /// fall in the same window of `window_secs` (`time / window` equal) form
    /// a generation sharing one pin bit (docs/DESIGN.md "Snapshots"), as do
    /// all of them when no bit is free; `window_secs` 0 gives each its own
    /// bit, as on an image without a kept table, where the window is
    /// ignored.
    pub fn take_protected(&self, time_secs: u64, window_secs: u64) -> LdResult<u64> {
        self.take_kept("", time_secs, true, window_secs)
    }

    /// How many protected checkpoints this image can keep: its kept table's
    /// records, or without one the pin bits no snapshot takes.
    pub fn kept_capacity(&self) -> usize {
        let geo = self.geo();
        if geo.kept_table() {
            snapshot::kept_capacity(geo.kept_pages)
        } else {
            let g = self.lock();
            MAX_SNAPSHOTS - g.snapshots.iter().filter(|s| !s.protected).count()
        }
    }

    /// Whether a snapshot (not protected) taken now would find no room in
    /// the table or no pin bit: the protected checkpoints must yield one
    /// (the oldest generation) first.
    pub fn snapshot_table_full(&self) -> bool {
        let g = self.lock();
        self.table_refusal(&g, false, 0, 0).is_some()
    }

    /// Why a kept checkpoint of this kind cannot be added to the table now
    /// (no record room, no pin bit), if it cannot.
    fn table_refusal(&self, g: &Inner, protected: bool, time: u64, window: u64) -> Option<String> {
        let geo = self.geo();
        let in_header = g
            .snapshots
            .iter()
            .filter(|s| !geo.kept_table() || !s.protected)
            .count();
        if protected && geo.kept_table() {
            let capacity = snapshot::kept_capacity(geo.kept_pages);
            if g.snapshots.len() - in_header >= capacity {
                return Some(format!(
                    "{capacity} protected checkpoints are kept already (the kept table is full)"
                ));
            }
        } else if in_header >= MAX_SNAPSHOTS {
            return Some(format!(
                "{MAX_SNAPSHOTS} snapshots are kept already: delete one first"
            ));
        }
        let used = g.snapshots.iter().fold(0u32, |m, s| m | 1 << s.pin);
        let free = used.count_ones() < PIN_BITS;
        if !free
            && generation_pin(&g.snapshots, protected && geo.kept_table(), time, window).is_none()
        {
            return Some(format!(
                "all {PIN_BITS} pin bits are taken: delete a snapshot first"
            ));
        }
        None
    }

    fn take_kept(&self, name: &str, time_secs: u64, protected: bool, window: u64) -> LdResult<u64> {
        snapshot::check_name(name).map_err(LdError::InvalidArgument)?;
        let name = name.to_string();
        let serial = self.checkpoint_quiet_with(SNAPSHOT_ARU_WAIT, &mut |e, g| {
            if let Some(why) = e.table_refusal(g, protected, time_secs, window) {
                return Err(LdError::InvalidArgument(why));
            }
            let window_secs = if e.geo().kept_table() { window } else { 0 };
            // What the new pin would add to history: the dead space of
            // every segment holding live bytes that the bit it takes does
            // not pin yet (the checkpoint's map pages change it by a few
            // pages; this is a policy bound, admission stays exact either
            // way).
            let seg = e.geo().segment_bytes();
            let added: u64 = g
                .usage
                .iter()
                .filter(|(_, u)| u.live_bytes > 0 && u.pins == 0)
                .map(|(_, u)| seg - u.live_bytes as u64)
                .sum();
            let after = e.footprint_bytes(g, Class::Meta) + added;
            if after > e.capacity_bytes() {
                return Err(LdError::NoSpace {
                    needed: added,
                    available: e
                        .capacity_bytes()
                        .saturating_sub(e.footprint_bytes(g, Class::Meta)),
                });
            }
            Ok(Some(SnapChange::Take {
                name: name.clone(),
                time_secs,
                protected,
                window_secs,
            }))
        })?;
        serial.ok_or_else(|| {
            LdError::InvalidArgument("ARUs stayed open: no snapshot was taken".into())
        })
    }

    /// Deletes snapshot `number`; returns once the checkpoint recording
    /// the deletion is durable (the segments only it held are released by
    /// that checkpoint). A snapshot opened elsewhere must be locked out by
    /// the caller first (`SnapshotLock::exclusive`).
    pub fn delete_snapshot(&self, number: u64) -> LdResult<()> {
        self.delete_kept(&[number])
    }

    /// Deletes the kept checkpoints `numbers` (snapshots or protected ones)
    /// in one checkpoint, as `delete_snapshot`: a generation's records go
    /// together, and its pin bit with the last of them.
    pub fn delete_kept(&self, numbers: &[u64]) -> LdResult<()> {
        let mut numbers = numbers.to_vec();
        numbers.sort_unstable();
        numbers.dedup();
        if numbers.is_empty() {
            return Ok(());
        }
        let done = self.checkpoint_quiet_with(SNAPSHOT_ARU_WAIT, &mut |_, g| {
            if let Some(n) = numbers
                .iter()
                .find(|&&n| !g.snapshots.iter().any(|s| s.number == n))
            {
                return Err(LdError::InvalidArgument(format!(
                    "snapshot {n} does not exist"
                )));
            }
            Ok(Some(SnapChange::Delete(numbers.clone())))
        })?;
        done.map(|_| ()).ok_or_else(|| {
            LdError::InvalidArgument("ARUs stayed open: the snapshot was not deleted".into())
        })
    }

    /// The kept snapshots, by number, with the space each alone holds.
    pub fn snapshots(&self) -> Vec<SnapshotInfo> {
        let g = self.lock();
        g.snapshots
            .iter()
            .map(|s| SnapshotInfo {
                number: s.number,
                time_secs: s.time_secs,
                name: s.name.clone(),
                entries: s.map_root.map_or(0, |r| r.2),
                // A generation's bit frees only with its last record.
                held_alone_bytes: if g.snapshots.iter().filter(|o| o.pin == s.pin).count() == 1 {
                    g.usage.held_only_by(s.pin)
                } else {
                    0
                },
                pin: s.pin,
                protected: s.protected,
            })
            .collect()
    }

    /// The serial of the newest durable checkpoint: the next snapshot's
    /// number is above it. An engine opened at a snapshot reports the
    /// serial of the slot it found the snapshot in.
    pub fn checkpoint_serial(&self) -> u64 {
        self.lock().serial
    }

    /// Bytes of segments kept only for snapshots (counted as used, not
    /// available: docs/DESIGN.md "Snapshots").
    pub fn history_bytes(&self) -> u64 {
        self.lock().usage.history_bytes()
    }

    /// Bytes the protected checkpoints hold that no snapshot shares: what
    /// deleting all of them gives back to writes (`-o protect=` yields no
    /// more).
    pub fn protected_bytes(&self) -> u64 {
        let g = self.lock();
        let mask = Self::protected_mask(&g);
        if mask == 0 {
            return 0;
        }
        g.usage.held_only_within(mask)
    }

    fn protected_mask(g: &Inner) -> u32 {
        g.snapshots
            .iter()
            .filter(|s| s.protected)
            .fold(0u32, |m, s| m | 1 << s.pin)
    }

    /// What deleting the kept checkpoints numbered `numbers` gives back (those
    /// a reader has mounted cannot be deleted): to writes, the bytes only
    /// they hold (`protected_bytes`); with `empty_only`, to a new snapshot,
    /// only their segments that hold no live bytes (a segment with live
    /// bytes set free is pinned again by the snapshot, so its dead space
    /// does not shrink the snapshot's need).
    pub fn kept_bytes_of(&self, numbers: &[u64], empty_only: bool) -> u64 {
        let g = self.lock();
        // Bits whose every record is among `numbers`: a generation frees
        // nothing while one of its records stays.
        let (gone, stay) = g.snapshots.iter().fold((0u32, 0u32), |(a, b), s| {
            if numbers.contains(&s.number) {
                (a | 1 << s.pin, b)
            } else {
                (a, b | 1 << s.pin)
            }
        });
        let mask = gone & !stay;
        match (mask, empty_only) {
            (0, _) => 0,
            (m, false) => g.usage.held_only_within(m),
            (m, true) => g.usage.held_empty_within(m),
        }
    }

    /// Kept checkpoints deleted since open, by anyone (a count that only
    /// grows; read without the engine's lock).
    pub fn kept_deleted(&self) -> u64 {
        self.kept_deleted.load(Ordering::Acquire)
    }

    /// fsck for the kept trees: walks every snapshot's map (each page
    /// against its crc) and checks that every page and block it names lies
    /// in a segment carrying its pin bit, and with `data`, reads every
    /// block against its crc. Returns the problems found, per snapshot.
    /// Kept trees share most pages (a generation of protected checkpoints
    /// differs by what a commit interval changed): each page and block is
    /// read once for all of them (`SharedPages`), and a damaged one is
    /// reported for every tree that reaches it.
    pub fn check_snapshots(&self, data: bool) -> LdResult<Vec<(u64, String)>> {
        Ok(self.check_snapshots_counted(data)?.0)
    }

    /// `check_snapshots`, also returning how many leaf pages it read.
    pub fn check_snapshots_counted(&self, data: bool) -> LdResult<(Vec<(u64, String)>, u64)> {
        let (table, pins) = {
            let g = self.lock();
            let pins: Vec<u32> = g.usage.iter().map(|(_, u)| u.pins).collect();
            (g.snapshots.clone(), pins)
        };
        let geo = self.geo();
        let held = |addr: u64, mask: u32| {
            geo.segment_of(addr)
                .is_some_and(|g| pins[g.0 as usize] & mask == mask)
        };
        let r = DevPages {
            dev: &*self.dev,
            flight: None,
        };
        let root_of = |s: &SnapshotRecord| {
            s.map_root.map(|(ptr, height, entries)| MapRoot {
                ptr,
                height,
                entries,
            })
        };
        let mut shared = SharedPages::new(geo.fs_id);
        // Problems found while adding a tree are that tree's; a page or
        // block found bad afterwards is reported for every tree reaching it.
        let mut out = Vec::new();
        for s in &table {
            if let Some(root) = root_of(s) {
                for (_, why) in shared.add_tree(root, 1 << s.pin, &r)? {
                    out.push((s.number, why));
                }
            }
        }
        let mut bad: FxHashMap<u64, String> = FxHashMap::default();
        shared.for_each_page(&mut |p, mask| {
            if !held(p.addr, mask) {
                bad.entry(p.addr).or_insert(format!(
                    "map page at byte {} is in no segment its pin bits {mask:#x} hold",
                    p.addr
                ));
            }
        });
        // A block is read once, but may be named by several leaves (trees
        // whose leaf changed elsewhere between them): each is charged.
        let mut blocks: FxHashMap<(u64, u32, u32), (Key, Vec<u64>)> = FxHashMap::default();
        let unread = shared.for_each_leaf(&r, &mut |leaf, mask, entries| {
            for (k, e) in entries {
                if e.is_buffered() || e.device() != 0 || !held(e.offset(), mask) {
                    bad.entry(leaf.addr).or_insert(format!(
                        "{k:?} at {e:?} is in no segment its pin bits {mask:#x} hold"
                    ));
                } else if data {
                    blocks
                        .entry((e.offset(), e.len, e.crc))
                        .or_insert_with(|| (*k, Vec::new()))
                        .1
                        .push(leaf.addr);
                }
            }
        })?;
        bad.extend(unread);
        bad.extend(shared.failed().map(|(a, why)| (a, why.clone())));
        let mut blocks: Vec<_> = blocks.into_iter().collect();
        blocks.sort_unstable_by_key(|b| b.0);
        for ((offset, len, crc), (k, leaves)) in blocks {
            let mut b = vec![0u8; len as usize];
            self.dev.read_at(&mut b, offset)?;
            if crc32c::crc32c(&b) != crc {
                for leaf in leaves {
                    bad.entry(leaf)
                        .or_insert(format!("{k:?}: block at byte {offset} fails its crc"));
                }
            }
        }
        if !bad.is_empty() {
            for s in &table {
                if let Some(at) = root_of(s).and_then(|root| shared.reaches(root, &bad)) {
                    out.push((s.number, bad[&at].clone()));
                }
            }
        }
        Ok((out, shared.leaves_read))
    }

    /// Checkpoints finished (durable so far).
    pub(crate) fn checkpoints_finished(&self) -> u64 {
        self.lock().stats.checkpoints
    }
}

/// The pin bit a new kept checkpoint shares, if it joins a generation: a
/// protected one (`shared`: the image has a kept table) joins the newest
/// protected record's bit when its time falls in the same window of
/// `window` seconds, or when no bit is free (coarser, never refused).
fn generation_pin(table: &[SnapshotRecord], shared: bool, time: u64, window: u64) -> Option<u32> {
    if !shared {
        return None;
    }
    let newest = table.iter().rev().find(|s| s.protected)?;
    let used = table.iter().fold(0u32, |m, s| m | 1 << s.pin);
    let same = window > 0 && newest.time_secs / window == time / window;
    (same || used.count_ones() >= PIN_BITS).then_some(newest.pin)
}

/// The pin bits of the protected checkpoints in `table`.
fn protected_pins(table: &[SnapshotRecord]) -> u32 {
    table
        .iter()
        .filter(|s| s.protected)
        .fold(0, |m, s| m | 1 << s.pin)
}

/// How long taking or deleting a snapshot waits for open ARUs to end.
const SNAPSHOT_ARU_WAIT: Duration = Duration::from_secs(30);

/// A map entry that points outside every segment.
pub(crate) type Misplaced = (Key, MapEntry);

impl Engine {
    /// Live bytes per segment as the map says: blocks on the device, the
    /// map's own pages, and pages dirtied since the last checkpoint (they
    /// count until the next one subtracts them); and the entries that point
    /// outside every segment.
    pub(crate) fn recount_live(&self, g: &mut Inner) -> LdResult<(Vec<u64>, Vec<Misplaced>)> {
        let geo = g.geo;
        let mut live = vec![0u64; geo.segment_count as usize];
        let mut outside = Vec::new();
        let r = self.pages();
        g.map.range(Key::MIN, Key::MAX, &r, &mut |k, e| {
            if !e.is_buffered() {
                match geo.segment_of(e.offset()) {
                    Some(s) => live[s.0 as usize] += e.len as u64,
                    None => outside.push((k, *e)),
                }
            }
            true
        })?;
        g.map.for_each_page(&mut |p| {
            if let Some(s) = geo.segment_of(p.addr) {
                live[s.0 as usize] += PAGE_BYTES as u64;
            }
        });
        for p in g.map.obsolete_pages() {
            if let Some(s) = geo.segment_of(p.addr) {
                live[s.0 as usize] += PAGE_BYTES as u64;
            }
        }
        Ok((live, outside))
    }

    /// fsck for the engine's space accounting: recomputes every segment's
    /// live bytes from the map (blocks on disk and the map's own pages) and
    /// compares them with the usage table; also checks that nothing live is
    /// in a Clean segment. Returns the disagreements (empty when sound).
    pub fn check_usage(&self) -> LdResult<Vec<String>> {
        let mut g = self.lock();
        if let Err(e) = self.flight.drain() {
            return Err(self.fail(&mut g, drain_error(e)));
        }
        let (live, outside) = self.recount_live(&mut g)?;
        let mut problems: Vec<String> = outside
            .iter()
            .take(4)
            .map(|(k, e)| format!("{k:?} maps outside the segments: {e:?}"))
            .collect();
        for (s, u) in g.usage.iter() {
            let want = live[s.0 as usize];
            if want != u.live_bytes as u64 {
                problems.push(format!(
                    "segment {}: usage says {} live bytes ({:?}), the map {want}",
                    s.0, u.live_bytes, u.state
                ));
            }
            if u.state == SegmentState::Clean && want > 0 {
                problems.push(format!(
                    "segment {} is Clean but holds {want} live bytes",
                    s.0
                ));
            }
        }
        Ok(problems)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{FaultDevice, FaultPlan, MemoryDevice};

    fn zstd_entry() -> MapEntry {
        MapEntry {
            addr: 4096,
            len: 1,
            crc: 0,
            flags: entry_flags::ZSTD,
        }
    }

    fn text(len: usize) -> Vec<u8> {
        b"a log-structured file system writes everything at the head. "
            .iter()
            .cycle()
            .take(len)
            .copied()
            .collect()
    }

    #[test]
    fn old_hint_bytes_keep_their_meaning() {
        // Images made before zstd wrote byte 2 as 0 or 1 and byte 3 as 0.
        let mut b = encode_hints(&ListHints::default());
        assert_eq!(decode_hints(&b, 0).unwrap().compress, Compression::Off);
        b[2] = 1;
        assert_eq!(decode_hints(&b, 0).unwrap().compress, Compression::Lz4);
        for c in [
            Compression::Off,
            Compression::Lz4,
            Compression::Zstd { level: 1 },
            Compression::Zstd { level: 19 },
        ] {
            let h = ListHints {
                compress: c,
                ..Default::default()
            };
            assert_eq!(decode_hints(&encode_hints(&h), 0).unwrap(), h);
        }
        // Unknown kinds, levels out of range, a level without zstd.
        for (b2, b3) in [(3, 0), (2, 0), (2, 20), (1, 1), (0, 3)] {
            let mut b = encode_hints(&ListHints::default());
            (b[2], b[3]) = (b2, b3);
            assert!(
                matches!(decode_hints(&b, 0), Err(LdError::Corrupt(_))),
                "byte 2 = {b2}, byte 3 = {b3} accepted"
            );
        }
    }

    #[test]
    fn encode_stored_stores_plain_unless_it_saves_a_sixteenth() {
        let zstd = Compression::Zstd { level: 3 };
        for c in [Compression::Lz4, zstd] {
            let t = text(4096);
            let (s, flags) = encode_stored(c, &t).expect("text compresses");
            assert!(s.len() < 1024, "{c}: {} bytes", s.len());
            let e = MapEntry {
                flags,
                ..zstd_entry()
            };
            assert_eq!(decode_stored(&e, s, 4096).unwrap(), t);
            assert_eq!(encode_stored(c, &text(255)), None, "{c}: small block");
            // Random bytes, then random bytes with a run of zeros that
            // saves less than a sixteenth (plain), then one that saves
            // more (compressed).
            let mut rng = ChaCha8Rng::seed_from_u64(17);
            let mut b: Vec<u8> = (0..4096).map(|_| rng.gen()).collect();
            assert_eq!(encode_stored(c, &b), None, "{c}: random block");
            b[..160].fill(0);
            assert_eq!(encode_stored(c, &b), None, "{c}: saves under 1/16");
            b[..700].fill(0);
            assert!(encode_stored(c, &b).is_some(), "{c}: saves over 1/16");
        }
        assert_eq!(encode_stored(Compression::Off, &text(4096)), None);
    }

    /// The screen before zstd passes what zstd can shrink: hex digits
    /// (no repeats, half the bits unused) and random bytes that repeat; it
    /// stops random bytes.
    #[test]
    fn zstd_screen_passes_what_compresses() {
        let zstd = Compression::Zstd { level: 3 };
        let mut rng = ChaCha8Rng::seed_from_u64(23);
        let random: Vec<u8> = (0..4096).map(|_| rng.gen()).collect();
        assert!(!zstd_may_pay(&random));
        let hex: Vec<u8> = (0..4096)
            .map(|_| b"0123456789abcdef"[rng.gen_range(0..16)])
            .collect();
        assert!(zstd_may_pay(&hex));
        let (s, _) = encode_stored(zstd, &hex).expect("hex compresses");
        assert!(s.len() < 3072, "hex stored as {}", s.len());
        let repeated: Vec<u8> = random[..1024].repeat(4);
        assert!(zstd_may_pay(&repeated));
        assert!(encode_stored(zstd, &repeated).is_some());
    }

    /// Whatever the stored bytes of a block flagged zstd, decoding them is
    /// a `Corrupt` error or at most `max_block` bytes: never a panic, never
    /// an allocation a corrupt header asks for.
    #[test]
    fn corrupt_zstd_blocks_are_corrupt_never_a_panic() {
        let max = 8192u32;
        let corrupt = |stored: Vec<u8>, what: &str| match decode_stored(&zstd_entry(), stored, max)
        {
            Err(LdError::Corrupt(c)) => assert_eq!(c.what, "compressed block", "{what}"),
            r => panic!("{what}: {r:?}"),
        };
        corrupt(Vec::new(), "empty");
        corrupt(b"not a frame at all".to_vec(), "garbage");
        let good = zstd_compress(&text(8000), 3).unwrap();
        corrupt(good[..good.len() / 2].to_vec(), "truncated");
        // A frame claiming more than a block: refused before allocating.
        let big = zstd_compress(&vec![0u8; max as usize + 1], 3).unwrap();
        corrupt(big, "over the limit");
        // A frame header claiming 2^40 bytes (single-segment frame,
        // 8-byte content size), with nothing after it.
        let mut huge = vec![0x28, 0xb5, 0x2f, 0xfd, 0xe0];
        huge.extend_from_slice(&(1u64 << 40).to_le_bytes());
        corrupt(huge, "2^40 bytes claimed");
        // A frame without its content size.
        let mut z = zstd::bulk::Compressor::new(3).unwrap();
        z.set_parameter(zstd::zstd_safe::CParameter::ContentSizeFlag(false))
            .unwrap();
        corrupt(z.compress(&text(100)).unwrap(), "no content size");
        // Two frames: the second would write past the first's claim.
        let mut two = zstd_compress(&text(300), 3).unwrap();
        two.extend(zstd_compress(&text(300), 3).unwrap());
        corrupt(two, "two frames");
        // Two compressions flagged at once.
        let e = MapEntry {
            flags: entry_flags::ZSTD | entry_flags::COMPRESSED,
            ..zstd_entry()
        };
        assert!(matches!(
            decode_stored(&e, good.clone(), max),
            Err(LdError::Corrupt(_))
        ));
        // Every byte of a good frame flipped in turn, and random damage.
        let seed = 0x2575_d001u64;
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        for i in 0..good.len() {
            for _ in 0..4 {
                let mut b = good.clone();
                b[i] ^= 1 << rng.gen_range(0..8);
                if rng.gen_ratio(1, 4) {
                    let j = rng.gen_range(0..b.len());
                    b[j] = rng.gen();
                }
                match decode_stored(&zstd_entry(), b, max) {
                    Ok(out) => assert!(out.len() <= max as usize, "seed {seed}: byte {i}"),
                    Err(LdError::Corrupt(_)) => {}
                    Err(e) => panic!("seed {seed}: byte {i}: {e}"),
                }
            }
        }
    }
    use crate::lld::layout::{MkfsOptions, MAX_SEGMENT_PAGES, MIN_SEGMENT_PAGES};
    use rand::seq::SliceRandom;
    use rand::Rng as _;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    /// `write_map_pages`'s placement replayed page by page (no shortcut for
    /// whole segments): the log pages it takes from `page`.
    fn placement(geo: &Geometry, page: u32, dirty: usize) -> i64 {
        let sp = geo.segment_pages;
        let (mut page, mut remaining, mut used) = (page, dirty, 0i64);
        while remaining > 0 {
            let mut k = map_pages_fit(sp - page).min(remaining);
            if k == 0 {
                used += (sp - page) as i64;
                page = 0;
                k = map_pages_fit(sp).min(remaining);
            }
            let taken = summary::summary_pages_for(k * MAP_RECORD_BYTES) + k as u32;
            page += taken;
            used += taken as i64;
            remaining -= k;
            if sp - page < 2 {
                used += (sp - page) as i64;
                page = 0;
            }
        }
        used
    }

    fn geometries() -> Vec<Geometry> {
        let mut out = Vec::new();
        for (seg_pages, reserved) in [
            (MIN_SEGMENT_PAGES, 4),
            (16, 6),
            (32, 4),
            (33, 5),
            (128, 16),
            (512, 64),
            (3000, 7),
            (MAX_SEGMENT_PAGES, 4),
        ] {
            let opts = MkfsOptions {
                segment_bytes: seg_pages as u64 * PAGE_BYTES as u64,
                max_block_bytes: 4096,
                reserved_segments: Some(reserved),
                fs_id: 1,
                max_bytes: None,
                kept_pages: 0,
            };
            let size = (reserved as u64 + 64) * opts.segment_bytes + (64 << 20);
            out.push(Geometry::plan(size, &opts).unwrap());
        }
        out
    }

    /// The admission's estimate of a checkpoint is its placement exactly,
    /// from every page the head can be at; the position-free bound is at
    /// least the worst of them.
    #[test]
    fn checkpoint_pages_match_the_placement_from_every_start() {
        for geo in geometries() {
            let sp = geo.segment_pages;
            let per = map_pages_per_segment(&geo);
            let step = (sp as usize / 40).max(1);
            let counts: Vec<usize> = (0..3 * per + 3)
                .step_by(step)
                .chain([per - 1, per, per + 1, 2 * per, 5 * per + 7])
                .collect();
            for &d in &counts {
                let mut worst = 0;
                for start in (0..=sp - 2).step_by(step).chain([sp - 2]) {
                    let want = placement(&geo, start, d);
                    let got = checkpoint_log_pages(&geo, start, d);
                    assert_eq!(got, want, "{sp} pages/segment, start {start}, {d} dirty");
                    worst = worst.max(want);
                }
                let anywhere = checkpoint_log_pages_anywhere(&geo, d);
                assert!(
                    anywhere >= worst,
                    "{sp} pages/segment, {d} dirty: bound {anywhere} < {worst}"
                );
            }
        }
    }

    /// A checkpoint due at the default limit fits in its half of the
    /// reserve with the margin, wherever the head is.
    #[test]
    fn the_default_dirty_limit_fits_the_checkpoints_half_of_the_reserve() {
        for geo in geometries() {
            let limit = default_dirty_limit(&geo);
            let (lower, _) = reserve_halves(&geo);
            let cost = checkpoint_log_pages_anywhere(&geo, limit);
            assert!(limit >= 1);
            assert!(
                cost + margin_pages(&geo) <= lower || limit == 1,
                "{} pages/segment, {} reserved: limit {limit} costs {cost} of {lower}",
                geo.segment_pages,
                geo.reserved_segments
            );
        }
        // The issue's device: 128 KiB segments, 4 reserved. The floor of 64
        // pages no longer exceeds what fits.
        let geo = Geometry::plan(
            16 << 20,
            &MkfsOptions {
                segment_bytes: 128 << 10,
                max_block_bytes: 32 << 10,
                reserved_segments: Some(4),
                fs_id: 1,
                max_bytes: None,
                kept_pages: 0,
            },
        )
        .unwrap();
        let limit = default_dirty_limit(&geo);
        assert!((30..64).contains(&limit), "limit {limit}");
    }

    /// An abort puts a removed range back: it dirties no more map pages
    /// than the range delete kept room for (`undo_pages`), whether the
    /// range's leaves were full (sequential inserts) or about half full
    /// (random ones).
    #[test]
    fn an_abort_dirties_no_more_than_its_range_delete_kept_room_for() {
        for (seed, shuffled) in [(1u64, false), (2, true), (3, true)] {
            let dev = Arc::new(MemoryDevice::new(64 << 20));
            let opts = LldOptions {
                checkpoint_dirty_pages: Some(usize::MAX),
                checkpoint_log_bytes: u64::MAX,
                ..Default::default()
            };
            let mkfs = MkfsOptions {
                segment_bytes: 128 << 10,
                max_block_bytes: 32 << 10,
                reserved_segments: Some(8),
                fs_id: 7,
                max_bytes: None,
                kept_pages: 0,
            };
            let lld = Lld::create(dev, &mkfs, opts).unwrap();
            let l = lld.create_list(None, ListHints::default()).unwrap();
            let mut keys: Vec<u64> = (0..30_000).collect();
            if shuffled {
                keys.shuffle(&mut rand_chacha::ChaCha8Rng::seed_from_u64(seed));
            }
            for &i in &keys {
                lld.write(None, l, i, &[i as u8]).unwrap();
            }
            lld.checkpoint_now().unwrap();
            let (from, to) = list_range(l.0);
            let leaves = lld.lock().map.leaves_in_range(from, to);
            let aru = lld.begin_aru().unwrap();
            lld.delete_range(Some(aru), l, 0..u64::MAX).unwrap();
            let before = lld.lock().map.dirtied_pages();
            lld.abort_aru(aru).unwrap();
            let grew = lld.lock().map.dirtied_pages() - before;
            assert!(
                grew <= undo_pages(leaves),
                "seed {seed}: the abort dirtied {grew} pages; {leaves} leaves, bound {}",
                undo_pages(leaves)
            );
            assert_eq!(lld.read(l, 29_999).unwrap().unwrap(), [29_999u64 as u8]);
        }
    }

    /// A checkpoint pending after its snapshot, on a fault device (no
    /// checkpointer thread: the test runs its phase 2).
    /// `keys` blocks are written first, with the default options.
    /// A list deleted outside an ARU comes back whole or not at all after a
    /// crash, also when its two records (its blocks, its entry in list 0)
    /// meet the open partial's summary limit: filler deletes (records of
    /// the entry's size) fill the summary until the pair no longer fits
    /// but its first record does; the crash keeps every device write.
    /// Found by the long crash run (LDFS_SEED=846086490 at 8d96706).
    #[test]
    fn a_list_deleted_at_a_partials_limit_survives_a_crash_whole() {
        use crate::device::{CrashDevice, CrashOptions};
        let dev = Arc::new(CrashDevice::new(16 << 20));
        let opts = LldOptions {
            checkpoint_thread: false,
            log_writer_thread: false,
            partial_bytes: 4 << 20,
            ..Default::default()
        };
        let mkfs = MkfsOptions {
            segment_bytes: 512 << 10,
            max_block_bytes: 32 << 10,
            reserved_segments: Some(4),
            fs_id: 7,
            max_bytes: None,
            kept_pages: 0,
        };
        let lld = Lld::create(dev.clone(), &mkfs, opts).unwrap();
        let filler = lld.create_list(None, ListHints::default()).unwrap();
        let l = lld.create_list(None, ListHints::default()).unwrap();
        lld.write(None, l, 0, b"block").unwrap();
        let first = Record::DeleteList { aru: 0, list: l.0 }.encoded_len();
        let entry = Record::Delete {
            aru: 0,
            key: Key::MIN,
        }
        .encoded_len();
        while lld.lock().pending.summary_has_room(first + entry) {
            lld.delete(None, filler, 1_000_000).unwrap();
        }
        assert!(lld.lock().pending.summary_has_room(first));
        lld.delete_list(None, l).unwrap();
        let keep_all = CrashOptions {
            keep_probability: 1.0,
            tear_probability: 0.0,
        };
        let img = dev.crash_image(1, &keep_all);
        let after =
            Lld::open(Arc::new(MemoryDevice::from_vec(img)), LldOptions::default()).unwrap();
        let listed = after.lists(0, 100).unwrap().contains(&l);
        let block = after.read(l, 0).ok().flatten();
        assert_eq!(listed, block.is_some(), "listed {listed}, block {block:?}");
    }

    fn pending_on_fault_device(keys: u64) -> (Lld, Arc<FaultDevice<MemoryDevice>>, ListId) {
        let dev = Arc::new(FaultDevice::new(
            MemoryDevice::new(16 << 20),
            FaultPlan::default(),
        ));
        let opts = LldOptions {
            checkpoint_dirty_pages: Some(1),
            checkpoint_thread: false,
            ..Default::default()
        };
        let mkfs = MkfsOptions {
            segment_bytes: 128 << 10,
            max_block_bytes: 32 << 10,
            reserved_segments: Some(4),
            fs_id: 7,
            max_bytes: None,
            kept_pages: 0,
        };
        let lld = Lld::create(dev.clone(), &mkfs, LldOptions::default()).unwrap();
        let l = lld.create_list(None, ListHints::default()).unwrap();
        for i in 0..keys {
            lld.write(None, l, i, &[i as u8; 64]).unwrap();
        }
        lld.close().unwrap();
        drop(lld);
        let lld = Lld::open(dev.clone(), opts).unwrap();
        lld.write(None, l, 1, b"one").unwrap();
        assert!(
            lld.checkpoint_pending(),
            "the write's checkpoint is pending"
        );
        (lld, dev, l)
    }

    /// A checkpoint's phase 2 failed (its device flush) and phase 3 has
    /// not run yet (the checkpointer thread has not got the lock back): a
    /// group commit in that window must not return Ok (after a failed
    /// flush the device may have dropped what it held), and the engine is
    /// read-only from then on.
    #[test]
    fn a_flush_after_a_failed_checkpoint_write_fails() {
        let (lld, dev, l) = pending_on_fault_device(0);
        let p = lld.lock().ckpt.clone().unwrap();
        dev.set_plan(FaultPlan {
            fail_flush_nth: Some(1),
            ..Default::default()
        });
        assert!(p.write(&*lld.dev, &lld.flight).is_err());
        assert!(dev.fired());
        // The next flush of the device succeeds; the group commit must
        // still report the earlier failure.
        let res = lld.flush();
        assert!(
            res.is_err(),
            "flush returned {res:?} after a failed checkpoint"
        );
        assert!(matches!(
            lld.write(None, l, 2, b"two"),
            Err(LdError::ReadOnly(_))
        ));
        assert!(lld.flush().is_err(), "a later flush");
    }

    /// An operation whose own change is made, but whose aftermath fails
    /// (here: it waits for the pending checkpoint, whose device flush
    /// fails), reports what happened to it: Ok, and reads see it. The
    /// failure turns the engine read-only, so the next operation and the
    /// flush report it.
    #[test]
    fn a_failure_after_an_operation_is_applied_is_not_the_operations() {
        // Enough keys for a map of two levels: a write then dirties a leaf
        // and the root, twice the limit of 1, so the operation waits for
        // the pending checkpoint (`after_op`).
        let (lld, dev, l) = pending_on_fault_device(2000);
        dev.set_plan(FaultPlan {
            fail_flush_nth: Some(1),
            sticky: true,
            ..Default::default()
        });
        let mut at = None;
        for i in 1..100u64 {
            let res = lld.write(None, l, i * 1000, b"the operation");
            let seen = lld.read(l, i * 1000).unwrap();
            if dev.fired() {
                assert!(res.is_ok(), "write {i}: {res:?}, yet reads see {seen:?}");
                at = Some(i);
                break;
            }
            res.unwrap();
        }
        let i = at.expect("no operation waited for the checkpoint");
        assert_eq!(
            lld.read(l, i * 1000).unwrap().as_deref(),
            Some(&b"the operation"[..])
        );
        assert!(matches!(
            lld.write(None, l, 5, b"next"),
            Err(LdError::ReadOnly(_))
        ));
        assert!(lld.flush().is_err());
    }
}
