//! Model-based crash simulation of the engine (issue 2).
//!
//! Random LD operations (writes of random lengths, overwrites, deletes of
//! blocks, ranges and lists, interleaved ARUs ended or aborted, flushes,
//! checkpoints, and now and then a long ARU at a nearly full device) run
//! against lld on a crash device and against an in-memory model. At random
//! points the device crashes (unflushed writes kept or dropped at random,
//! some torn at 512-byte granularity) and lld reopens from the crash image;
//! the reopen must succeed.
//! The recovered state must equal the model after some prefix of the
//! operations no shorter than the last completed flush, with the operations
//! of every ARU not ended within that prefix removed. An aborted ARU's
//! operations leave the model at once (nothing of them may survive, and
//! every other operation stands); after each abort the lists it touched must
//! read as the model says.
//!
//! Checkpoints that operations start stay pending (snapshot taken, slot not
//! yet written) until the mix finishes them (`finish_checkpoint`, or any
//! operation that needs one finished): no checkpointer thread, so crashes
//! and power cuts land between a checkpoint's snapshot and its slot at
//! seeded points, and the tally counts them.
//!
//! With snapshots (`Mode::snapshots`, issue 18) the mix also takes and
//! deletes snapshots (some with the power cut during them): after every
//! recovery each acknowledged snapshot must exist and read exactly as the
//! model's tree of its moment, one whose deletion was acknowledged must be
//! gone, and one taken or deleted when the power went may be either way but,
//! if there, must read as its moment.
//!
//! `LDFS_CRASH_CYCLES` sets the number of crash-and-recover cycles (2,000 by
//! default, `LDFS_LONG=1` for 100,000); `LDFS_SEED` the base seed. A failure
//! prints the seed and the command that replays it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use ldfs::device::{CrashDevice, CrashOptions};
use ldfs::ld::{AruId, Compression, LdError, ListHints, ListId, LogicalDisk};
use ldfs::lld::layout::MkfsOptions;
use ldfs::lld::{CleanerOptions, Lld, LldOptions, PolicyKind};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const DEVICE_BYTES: u64 = 8 << 20;
const MAX_BLOCK: usize = 12 << 10;
/// Cycles on one device before it is formatted afresh. The cleaner keeps a
/// device usable forever; a fresh one now and then only varies the start.
const CYCLES_PER_DEVICE: u64 = 1000;
/// Cycles in a row that may refuse every write for space before the run
/// calls the device stuck full (the mix deletes as much as it writes, so
/// space comes back within a few cycles when the cleaner works).
const STUCK_CYCLES: u64 = 100;
/// Lists alive at most, so live data stays near the capacity without
/// exceeding it for long (about 60-80% of it, and the wide list's tenth;
/// NoSpace stays possible).
const MAX_LISTS: usize = 64;
/// The wide list: one-byte blocks at `WIDE_BASE..WIDE_BASE + WIDE_BLOCKS`,
/// written in descending order so its map leaves are half full (about 126
/// of them). A long ARU touching one block in each dirties more map pages
/// than the whole reserve holds (issue 12: the engine must keep room for
/// the checkpoint that follows). Ordinary operations leave it alone.
const WIDE_BLOCKS: u64 = 8000;
const WIDE_BASE: u64 = 1000;
/// A long ARU writes every `WIDE_STEP`-th block of the wide list.
const WIDE_STEP: u64 = 40;
/// Large overwrites a long ARU makes at most before NoSpace stops it.
const LONG_ARU_WRITES: u64 = 1000;
/// One operation in this many is a long ARU.
const LONG_ARU_ONE_IN: u32 = 300;

/// A block's bytes; shared, so model states are cheap to copy.
type Block = Arc<[u8]>;

/// `threads`: the log writer on its own thread, as in use; the device then
/// sees its writes at times the scheduler picks, so a seed no longer
/// replays exactly. Off (the default here), the thread that seals a partial
/// segment writes it.
/// `discard`: released segments are given back to the device (zeroed,
/// as an unflushed write a crash may keep, drop or tear): odd seeds.
fn engine_options(threads: bool, discard: bool) -> LldOptions {
    LldOptions {
        log_writer_thread: threads,
        discard,
        map_budget_bytes: 48 << 10, // forces leaf eviction and reloads
        checkpoint_log_bytes: 96 << 10,
        checkpoint_dirty_pages: Some(24),
        partial_bytes: 24 << 10,
        cleaner: CleanerOptions {
            // One thread holds every ARU here: waiting for them to end
            // would only time out (and timing is not deterministic).
            aru_wait_ms: 0,
            ..Default::default()
        },
        checkpoint_thread: false,
        ..Default::default()
    }
}

fn mkfs_options(mode: Mode) -> MkfsOptions {
    MkfsOptions {
        segment_bytes: 64 << 10,
        max_block_bytes: MAX_BLOCK as u32,
        reserved_segments: Some(6),
        fs_id: 0x1df5,
        max_bytes: None,
        kept_pages: mode.kept_table as u32,
    }
}

/// One logged operation, as the model replays it.
#[derive(Clone, Debug)]
enum Op {
    CreateList(u64),
    DeleteList(u64),
    Write(u64, u64, Block),
    Delete(u64, u64),
    DeleteRange(u64, u64, u64),
    End,
}

/// Model state: lists and their blocks (each list shared until changed).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct State {
    lists: BTreeMap<u64, Arc<BTreeMap<u64, Block>>>,
}

impl State {
    fn apply(&mut self, op: &Op) {
        match op {
            Op::CreateList(l) => {
                self.lists.insert(*l, Arc::default());
            }
            Op::DeleteList(l) => {
                self.lists.remove(l);
            }
            Op::Write(l, i, d) => {
                Arc::make_mut(self.lists.get_mut(l).expect("model list")).insert(*i, d.clone());
            }
            Op::Delete(l, i) => {
                if let Some(b) = self.lists.get_mut(l) {
                    if b.contains_key(i) {
                        Arc::make_mut(b).remove(i);
                    }
                }
            }
            Op::DeleteRange(l, a, z) => {
                if let Some(b) = self.lists.get_mut(l) {
                    if b.range(a..z).next().is_some() {
                        Arc::make_mut(b).retain(|i, _| !(a..z).contains(&i));
                    }
                }
            }
            Op::End => {}
        }
    }
}

/// The operations since the last verified state, each with its ARU (0 = none).
struct History {
    base: State,
    log: Vec<(u64, Op)>,
    /// `log[..flushed]` must survive.
    flushed: usize,
}

impl History {
    /// State after `log[..p]`, without the ARUs not ended within it.
    fn state_at(&self, p: usize) -> State {
        let ended: BTreeSet<u64> = self.log[..p]
            .iter()
            .filter(|(_, op)| matches!(op, Op::End))
            .map(|(a, _)| *a)
            .collect();
        let mut s = self.base.clone();
        for (aru, op) in &self.log[..p] {
            if *aru == 0 || ended.contains(aru) {
                s.apply(op);
            }
        }
        s
    }

    /// The live state: what reads see now (every accepted operation).
    fn live(&self) -> State {
        let mut s = self.base.clone();
        for (_, op) in &self.log {
            s.apply(op);
        }
        s
    }

    /// The lists reads see now (`live`, without copying blocks).
    fn live_lists(&self) -> BTreeSet<u64> {
        let mut lists: BTreeSet<u64> = self.base.lists.keys().copied().collect();
        for (_, op) in &self.log {
            match op {
                Op::CreateList(l) => {
                    lists.insert(*l);
                }
                Op::DeleteList(l) => {
                    lists.remove(l);
                }
                _ => {}
            }
        }
        lists
    }
}

fn read_state(lld: &Lld, universe: u64) -> State {
    let mut s = State::default();
    for l in 1..universe {
        if let Some(blocks) = read_list(lld, l) {
            s.lists.insert(l, blocks);
        }
    }
    s
}

/// The blocks of list `l`, or `None` if it does not exist.
fn read_list(lld: &Lld, l: u64) -> Option<Arc<BTreeMap<u64, Block>>> {
    let list = ListId(l);
    lld.list_hints(list).unwrap()?;
    let indices = lld.indices(list, 0, usize::MAX).unwrap();
    let blocks: BTreeMap<u64, Block> = lld
        .read_range(list, 0..u64::MAX, usize::MAX)
        .unwrap_or_else(|e| panic!("read list {l}: {e}"))
        .into_iter()
        .map(|(i, d)| (i, d.into()))
        .collect();
    assert!(
        blocks.keys().copied().eq(indices.iter().copied()),
        "list {l}: indices and read_range disagree"
    );
    Some(Arc::new(blocks))
}

fn block(rng: &mut ChaCha8Rng) -> Vec<u8> {
    let len = match rng.gen_range(0..10) {
        0..=3 => rng.gen_range(1..200),
        4..=6 => 4096 * rng.gen_range(1..=3),
        _ => rng.gen_range(1..=MAX_BLOCK),
    };
    let fill: u8 = rng.gen();
    let mut d = vec![fill; len];
    // A few random bytes so torn or misplaced blocks cannot pass as right.
    for _ in 0..4 {
        let i = rng.gen_range(0..len);
        d[i] = rng.gen();
    }
    d
}

/// The snapshots the model knows: acknowledged ones must survive every
/// crash; `maybe` ones (the power went during their take or deletion) may.
#[derive(Default)]
struct Snaps {
    kept: BTreeMap<u64, (State, Certainty)>,
    /// Whether each acknowledged one was taken protected (every other
    /// take: the kind byte must survive the crashes too).
    protected: BTreeMap<u64, bool>,
    /// A take that failed at the power cut: the tree it would keep.
    maybe_taken: Option<State>,
    /// The simulated clock protected checkpoints are taken at (one tick a
    /// take): with `PROTECT_WINDOW`, generations of three.
    clock: u64,
    /// Generations (every record sharing a pin bit) deleted in one call.
    generations_deleted: u64,
    /// The most records seen sharing one pin bit.
    most_sharing: usize,
}

/// The generation window of the mix's protected checkpoints (clock ticks).
const PROTECT_WINDOW: u64 = 3;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Certainty {
    Acknowledged,
    /// Its deletion failed at the power cut.
    MaybeDeleted,
}

/// Snapshots kept at most by the mix (each pins a share of a small device);
/// with a kept table, protected checkpoints of one generation share a pin,
/// so this bounds distinct pin bits and `MIX_KEPT` the records.
const MIX_SNAPSHOTS: usize = 3;
const MIX_KEPT: usize = 8;

struct Cycle<'a> {
    lld: &'a Lld,
    /// `Mode::kept_table`.
    kept_table: bool,
    /// Lists are made with a drawn compression choice, which the mix also
    /// changes; some blocks are random bytes (stored plain).
    compress: bool,
    /// `Some` when the mix takes snapshots.
    snaps: Option<Snaps>,
    rng: ChaCha8Rng,
    hist: History,
    next_list: u64,
    /// The wide list (see `WIDE_BLOCKS`).
    wide: u64,
    open: Vec<AruId>,
    /// The device's power is set to go out (a planned crash mid-operation):
    /// device errors are expected from then on.
    cut: bool,
    /// An operation failed after the cut: stop issuing more.
    dead: bool,
    tally: Tally,
}

/// What a run exercised, printed at the end so a quiet test is noticed.
#[derive(Clone, Copy, Debug, Default)]
struct Tally {
    passes: u64,
    blocks_moved: u64,
    released: u64,
    no_space: u64,
    power_cuts: u64,
    died_at_cut: u64,
    /// Pending checkpoints finished by the mix.
    finished: u64,
    /// Crashes (images taken) while a checkpoint was pending.
    crashed_pending: u64,
    /// Power cuts aimed into finishing a pending checkpoint.
    cut_finishing: u64,
    aborts: u64,
    snapshots_taken: u64,
    snapshots_deleted: u64,
    snapshots_refused: u64,
    snapshots_checked: u64,
    long_arus: u64,
    /// Long ARUs whose large overwrites ran into NoSpace.
    long_arus_full: u64,
    /// Blocks written compressed, and moved blocks the cleaner
    /// recompressed (compression mode).
    compressed: u64,
    recompressed: u64,
}

impl Cycle<'_> {
    fn run_ops(&mut self, n: usize) {
        for _ in 0..n {
            if self.dead {
                break;
            }
            self.one_op();
        }
    }

    /// An operation failed: fine after a power cut (the engine is now
    /// read-only), a bug otherwise.
    fn draw_compression(&mut self) -> Compression {
        [
            Compression::Off,
            Compression::Lz4,
            Compression::Zstd { level: 1 },
            Compression::Zstd { level: 3 },
        ][self.rng.gen_range(0..4)]
    }

    fn failed(&mut self, what: &str, e: LdError) {
        if self.cut && matches!(e, LdError::Device(_) | LdError::ReadOnly(_)) {
            self.dead = true;
            self.tally.died_at_cut += 1;
        } else {
            panic!("{what}: {e}");
        }
    }

    /// A cleaning pass with any policy, whatever ARUs are open.
    fn clean(&mut self) {
        let policy = PolicyKind::ALL[self.rng.gen_range(0..3)];
        match self.lld.clean(policy, self.rng.gen_range(1..5)) {
            Ok(rep) => {
                self.tally.passes += 1;
                self.tally.blocks_moved += rep.blocks_moved;
                self.tally.released += rep.released as u64;
                if rep.checkpointed {
                    self.hist.flushed = self.hist.log.len();
                }
            }
            Err(e) => self.failed("clean", e),
        }
    }

    /// Finishes the pending checkpoint, if any: its slot reaches the device.
    fn finish_checkpoint(&mut self) {
        match self.lld.finish_checkpoint() {
            Ok(true) => self.tally.finished += 1,
            Ok(false) => {}
            Err(e) => self.failed("finish_checkpoint", e),
        }
    }

    /// A list other than the wide one.
    fn existing_list(&mut self) -> Option<u64> {
        let wide = self.wide;
        let lists: Vec<u64> = self
            .hist
            .live_lists()
            .into_iter()
            .filter(|l| *l != wide)
            .collect();
        if lists.is_empty() {
            None
        } else {
            Some(lists[self.rng.gen_range(0..lists.len())])
        }
    }

    fn pick_aru(&mut self) -> Option<AruId> {
        if !self.open.is_empty() && self.rng.gen_bool(0.5) {
            Some(self.open[self.rng.gen_range(0..self.open.len())])
        } else {
            None
        }
    }

    fn record(&mut self, aru: Option<AruId>, r: Result<(), LdError>, op: Op) {
        match r {
            Ok(()) => self.hist.log.push((aru.map_or(0, |a| a.0), op)),
            // Operations may be refused for space; an ARU's end never is.
            Err(LdError::NoSpace { .. }) if !matches!(op, Op::End) => self.tally.no_space += 1,
            Err(e) => {
                // Failed at the power cut: it may still have reached the
                // disk, so it is the last operation a recovered state may
                // or may not contain.
                self.failed(&format!("{op:?}"), e);
                self.hist.log.push((aru.map_or(0, |a| a.0), op));
            }
        }
    }

    /// Aborts `a`: its operations leave the model; the lists they touched
    /// must read as the model says at once.
    fn abort(&mut self, a: AruId) {
        if let Err(e) = self.lld.abort_aru(a) {
            // Only after a power cut (a map page the undo needs could not
            // be read back); the ARU never ends, so recovery drops it. A
            // failure after the undo (the checkpoint it started) is not the
            // abort's: the lists read as the model without the ARU.
            self.failed("abort_aru", e);
            return;
        }
        let mut touched = BTreeSet::new();
        for (x, op) in &self.hist.log {
            if *x != a.0 {
                continue;
            }
            match op {
                Op::Write(l, ..)
                | Op::Delete(l, _)
                | Op::DeleteRange(l, ..)
                | Op::DeleteList(l) => {
                    touched.insert(*l);
                }
                Op::CreateList(_) | Op::End => {}
            }
        }
        let before_flush = self.hist.log[..self.hist.flushed]
            .iter()
            .filter(|(x, _)| *x == a.0)
            .count();
        self.hist.flushed -= before_flush;
        self.hist.log.retain(|(x, _)| *x != a.0);
        self.tally.aborts += 1;
        if self.dead {
            return;
        }
        let live = self.hist.live();
        for l in touched {
            let got = read_list(self.lld, l);
            assert_eq!(
                got.as_ref(),
                live.lists.get(&l),
                "after aborting {a}: list {l} reads otherwise than the model"
            );
        }
    }

    /// A long ARU at a nearly full device (issue 12): it rewrites a block in
    /// every leaf of the wide list's map, then overwrites a few keys with
    /// large blocks until NoSpace. Usually it ends (the checkpoint that is
    /// then due must fit) and is flushed; else it stays open, maybe into
    /// the crash.
    fn long_aru(&mut self) {
        let lld = self.lld;
        let a = match lld.begin_aru() {
            Ok(a) => a,
            Err(e) => return self.failed("begin_aru", e),
        };
        self.open.push(a);
        self.tally.long_arus += 1;
        let w = self.wide;
        for i in (WIDE_BASE..WIDE_BASE + WIDE_BLOCKS).step_by(WIDE_STEP as usize) {
            if self.dead {
                return;
            }
            let d: Block = vec![self.rng.gen::<u8>()].into();
            let r = lld.write(Some(a), ListId(w), i, &d);
            self.record(Some(a), r, Op::Write(w, i, d));
        }
        let keys = self.rng.gen_range(1..=8);
        for k in 0..LONG_ARU_WRITES {
            if self.dead {
                return;
            }
            let i = WIDE_BASE + WIDE_BLOCKS + k % keys;
            let mut d = vec![self.rng.gen::<u8>(); MAX_BLOCK];
            d[..8].copy_from_slice(&k.to_le_bytes());
            let d: Block = d.into();
            let r = lld.write(Some(a), ListId(w), i, &d);
            let full = matches!(r, Err(LdError::NoSpace { .. }));
            self.record(Some(a), r, Op::Write(w, i, d));
            if full {
                self.tally.long_arus_full += 1;
                break;
            }
        }
        match self.rng.gen_range(0..8) {
            // Left open: a later operation ends or aborts it, or the crash
            // finds it open.
            0 => return,
            1 => {
                self.open.retain(|x| *x != a);
                self.abort(a);
            }
            _ => {
                self.open.retain(|x| *x != a);
                let r = lld.end_aru(a);
                self.record(Some(a), r, Op::End);
            }
        }
        if !self.dead {
            match lld.flush() {
                Ok(()) => self.hist.flushed = self.hist.log.len(),
                Err(e) => self.failed("flush", e),
            }
        }
    }

    /// Lists alive at most: with snapshots a third as many, so that live
    /// data leaves history room (a snapshot that would pass the capacity
    /// is refused).
    fn max_lists(&self) -> usize {
        if self.snaps.is_some() {
            MAX_LISTS / 3
        } else {
            MAX_LISTS
        }
    }

    /// Takes a snapshot (only with no ARU open: it would wait for them).
    fn take_snapshot(&mut self) {
        if !self.open.is_empty() || self.snaps.is_none() {
            return;
        }
        let state = self.hist.live();
        let protected = self.tally.snapshots_taken % 2 == 1 || self.kept_table;
        let protected =
            protected && !(self.kept_table && self.tally.snapshots_taken.is_multiple_of(5));
        let r = if protected {
            let snaps = self.snaps.as_mut().expect("checked above");
            snaps.clock += 1;
            self.lld.take_protected(snaps.clock, PROTECT_WINDOW)
        } else {
            self.lld.take_snapshot("mix", 0)
        };
        let snaps = self.snaps.as_mut().expect("checked above");
        match r {
            Ok(n) => {
                assert!(!snaps.kept.contains_key(&n), "snapshot number {n} twice");
                snaps.kept.insert(n, (state, Certainty::Acknowledged));
                snaps.protected.insert(n, protected);
                self.hist.flushed = self.hist.log.len();
                self.tally.snapshots_taken += 1;
            }
            Err(LdError::NoSpace { .. }) => self.tally.snapshots_refused += 1,
            Err(e) => {
                snaps.maybe_taken = Some(state);
                self.failed("take_snapshot", e);
            }
        }
    }

    /// Deletes the oldest snapshot, or (with a kept table, one time in
    /// two) the oldest one's whole generation: every record sharing its
    /// pin bit, in one call (only with no ARU open).
    fn delete_snapshot(&mut self) {
        if !self.open.is_empty() {
            return;
        }
        let Some(n) = self
            .snaps
            .as_ref()
            .and_then(|s| s.kept.keys().next().copied())
        else {
            return;
        };
        let mut numbers = vec![n];
        if self.kept_table && self.rng.gen_bool(0.5) {
            let listed = self.lld.snapshots();
            if let Some(pin) = listed.iter().find(|s| s.number == n).map(|s| s.pin) {
                let snaps = self.snaps.as_ref().expect("checked above");
                numbers = listed
                    .iter()
                    .filter(|s| s.pin == pin && snaps.kept.contains_key(&s.number))
                    .map(|s| s.number)
                    .collect();
            }
        }
        let r = self.lld.delete_kept(&numbers);
        let snaps = self.snaps.as_mut().expect("checked above");
        match r {
            Ok(()) => {
                for n in &numbers {
                    snaps.kept.remove(n);
                }
                snaps.generations_deleted += (numbers.len() > 1) as u64;
                self.hist.flushed = self.hist.log.len();
                self.tally.snapshots_deleted += 1;
            }
            Err(e) => {
                for n in &numbers {
                    snaps.kept.get_mut(n).expect("kept").1 = Certainty::MaybeDeleted;
                }
                self.failed("delete_snapshot", e);
            }
        }
    }

    /// Distinct pin bits the kept checkpoints hold now.
    fn pins_held(&self) -> usize {
        let mask = self
            .lld
            .snapshots()
            .iter()
            .fold(0u32, |m, s| m | 1 << s.pin);
        mask.count_ones() as usize
    }

    fn one_op(&mut self) {
        let lld = self.lld;
        if self.rng.gen_ratio(1, LONG_ARU_ONE_IN) {
            return self.long_aru();
        }
        if let Some(kept) = self.snaps.as_ref().map(|s| s.kept.len()) {
            // Drawn only in snapshot mode: the plain mix's seeds replay as
            // before.
            let room = if self.kept_table {
                kept < MIX_KEPT && self.pins_held() < MIX_SNAPSHOTS
            } else {
                kept < MIX_SNAPSHOTS
            };
            match self.rng.gen_range(0..100) {
                0..=2 if room => return self.take_snapshot(),
                3..=4 if kept > 0 => return self.delete_snapshot(),
                _ => {}
            }
        }
        if self.compress && self.rng.gen_ratio(1, 40) {
            // Drawn only in compression mode, as snapshots above.
            if let Some(l) = self.existing_list() {
                let aru = self.pick_aru();
                let c = self.draw_compression();
                match lld.set_compression(aru, ListId(l), c) {
                    Ok(()) | Err(LdError::NoSpace { .. }) => {}
                    Err(e) => self.failed("set_compression", e),
                }
                return;
            }
        }
        let lists = self.hist.live_lists().len();
        match self.rng.gen_range(0..100) {
            0..=3 if lists >= self.max_lists() => {
                if let Some(l) = self.existing_list() {
                    let aru = self.pick_aru();
                    let r = lld.delete_list(aru, ListId(l));
                    self.record(aru, r, Op::DeleteList(l));
                }
            }
            0..=3 if self.cut => {}
            0..=3 => {
                // Lists are created outside ARUs: a list whose creation could
                // be undone while blocks written outside its ARU survive is a
                // state the model does not describe (the fs never does it).
                let hints = ListHints {
                    compress: if self.compress {
                        self.draw_compression()
                    } else {
                        Compression::Off
                    },
                    ..Default::default()
                };
                match lld.create_list(None, hints) {
                    Ok(l) => {
                        self.next_list = self.next_list.max(l.0 + 1);
                        self.hist.log.push((0, Op::CreateList(l.0)));
                    }
                    Err(LdError::NoSpace { .. }) => {}
                    Err(e) => panic!("create_list: {e}"),
                }
            }
            4 => {
                if let Some(l) = self.existing_list() {
                    let aru = self.pick_aru();
                    let r = lld.delete_list(aru, ListId(l));
                    self.record(aru, r, Op::DeleteList(l));
                }
            }
            5..=59 => {
                if let Some(l) = self.existing_list() {
                    let aru = self.pick_aru();
                    let i = self.rng.gen_range(0..24);
                    let mut d = block(&mut self.rng);
                    if self.compress && self.rng.gen_ratio(1, 3) {
                        self.rng.fill(&mut d[..]);
                    }
                    let d: Block = d.into();
                    let r = lld.write(aru, ListId(l), i, &d);
                    self.record(aru, r, Op::Write(l, i, d));
                }
            }
            60..=69 => {
                if let Some(l) = self.existing_list() {
                    let aru = self.pick_aru();
                    let i = self.rng.gen_range(0..24);
                    let r = lld.delete(aru, ListId(l), i);
                    self.record(aru, r, Op::Delete(l, i));
                }
            }
            70..=73 => {
                if let Some(l) = self.existing_list() {
                    let aru = self.pick_aru();
                    let a = self.rng.gen_range(0..24);
                    let z = a + self.rng.gen_range(1..8);
                    let r = lld.delete_range(aru, ListId(l), a..z);
                    self.record(aru, r, Op::DeleteRange(l, a, z));
                }
            }
            74..=81 => {
                if self.open.len() < 3 {
                    match lld.begin_aru() {
                        Ok(a) => self.open.push(a),
                        Err(e) => self.failed("begin_aru", e),
                    }
                }
            }
            82..=91 => {
                if !self.open.is_empty() {
                    let k = self.rng.gen_range(0..self.open.len());
                    let a = self.open.swap_remove(k);
                    if self.rng.gen_ratio(1, 4) {
                        self.abort(a);
                    } else {
                        let r = lld.end_aru(a);
                        self.record(Some(a), r, Op::End);
                    }
                }
            }
            92..=94 => match lld.flush() {
                Ok(()) => self.hist.flushed = self.hist.log.len(),
                Err(e) => self.failed("flush", e),
            },
            95..=97 => self.clean(),
            98 => self.finish_checkpoint(),
            _ => {
                if self.open.is_empty() {
                    match lld.checkpoint_now() {
                        Ok(()) => self.hist.flushed = self.hist.log.len(),
                        Err(e) => self.failed("checkpoint", e),
                    }
                }
            }
        }
    }
}

fn cycles() -> u64 {
    if let Ok(v) = std::env::var("LDFS_CRASH_CYCLES") {
        return v.parse().expect("LDFS_CRASH_CYCLES must be a number");
    }
    if std::env::var("LDFS_LONG").is_ok() {
        100_000
    } else {
        2_000
    }
}

fn base_seed() -> u64 {
    std::env::var("LDFS_SEED")
        .map(|v| v.parse().expect("LDFS_SEED must be a number"))
        .unwrap_or(0x5eed_2026)
}

/// How `run_device` runs.
#[derive(Clone, Copy, Default)]
struct Mode {
    /// `engine_options(threads, _)`.
    threads: bool,
    /// Fold every crash image into the returned digest (costs a crc of the
    /// device per cycle).
    digest: bool,
    /// The mix takes and deletes snapshots, and every recovery checks them.
    snapshots: bool,
    /// The image has a kept table (one page: 85 protected checkpoints),
    /// so protected checkpoints of one generation share a pin bit.
    kept_table: bool,
    /// Lists compress (a drawn choice, changed by the mix) and the cleaner
    /// recompresses cold blocks it moves.
    compress: bool,
}

/// `engine_options` for a run in `mode`.
/// Seeds that discard (odd ones) alternate, cycle by cycle, between a
/// device that reads discarded ranges as zeros and one that keeps the old
/// bytes there, as drives differ: the engine must need neither (zeros
/// catch a discard of something still needed, old bytes a reader that
/// takes stale contents for valid ones).
fn discard_keeps_old(seed: u64, cycle: u64) -> bool {
    seed % 2 == 1 && cycle % 2 == 1
}

fn mode_options(mode: Mode, seed: u64) -> LldOptions {
    let mut o = engine_options(mode.threads, seed % 2 == 1);
    if mode.compress {
        o.cleaner.recompress_cold = Some(6);
    }
    o
}

/// Runs the cycles of one freshly formatted device; `Err` names the cycle.
/// Returns a digest of the images it crashed to (0 unless `mode.digest`).
fn run_device(seed: u64, first_cycle: u64, cycles: u64, mode: Mode) -> Result<u32, String> {
    let mut digest = 0u32;
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ first_cycle.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let dev = Arc::new(CrashDevice::new(DEVICE_BYTES));
    dev.set_discard_keeps_old(discard_keeps_old(seed, first_cycle));
    let lld = Lld::create(dev.clone(), &mkfs_options(mode), mode_options(mode, seed))
        .map_err(|e| format!("create: {e}"))?;
    lld.flush().unwrap();
    // The wide list, checkpointed: its leaves are clean until a long ARU.
    let wide = lld.create_list(None, ListHints::default()).unwrap().0;
    let mut blocks = BTreeMap::new();
    for i in (WIDE_BASE..WIDE_BASE + WIDE_BLOCKS).rev() {
        let d: Block = vec![i as u8].into();
        lld.write(None, ListId(wide), i, &d).unwrap();
        blocks.insert(i, d);
    }
    lld.checkpoint_now().unwrap();
    let mut state = State::default();
    state.lists.insert(wide, Arc::new(blocks));
    let mut next_list = wide + 1;
    let mut lld = Some(lld);
    let mut dev = dev;
    let mut tally = Tally::default();
    // Cycles in a row in which every write was refused for space.
    let mut stuck = 0u64;
    let mut snaps = mode.snapshots.then(Snaps::default);
    for c in first_cycle..first_cycle + cycles {
        let engine = lld.take().expect("engine open");
        let mut cy = Cycle {
            lld: &engine,
            kept_table: mode.kept_table,
            compress: mode.compress,
            snaps: snaps.take(),
            rng: ChaCha8Rng::seed_from_u64(rng.gen()),
            hist: History {
                base: state.clone(),
                log: Vec::new(),
                flushed: 0,
            },
            next_list,
            wide,
            open: Vec::new(),
            cut: false,
            dead: false,
            tally,
        };
        if stuck > 0 && cy.snaps.is_some() {
            // Writes were refused last cycle: history may be what fills
            // the device, and deleting a snapshot is the way out.
            cy.delete_snapshot();
        }
        let n = cy.rng.gen_range(1..80);
        cy.run_ops(n);
        let mut clean = cy.rng.gen_ratio(1, 10);
        if !clean && cy.snaps.is_some() && cy.rng.gen_ratio(1, 8) {
            // The power goes out during a snapshot's take or deletion.
            dev.cut_power_after(cy.rng.gen_range(0..24));
            cy.cut = true;
            cy.tally.power_cuts += 1;
            if cy.rng.gen_bool(0.5) {
                cy.take_snapshot();
            } else {
                cy.delete_snapshot();
            }
        } else if !clean && cy.rng.gen_ratio(1, 3) {
            // The power goes out a few device writes into a cleaning pass
            // (or the operations after it): a crash in the middle of moving
            // blocks, writing map pages or the checkpoint that frees victims.
            dev.cut_power_after(cy.rng.gen_range(0..24));
            cy.cut = true;
            cy.tally.power_cuts += 1;
            if engine.checkpoint_pending() && cy.rng.gen_bool(0.5) {
                // ...or into finishing a pending checkpoint: its map pages,
                // the flushes, the slot.
                cy.tally.cut_finishing += 1;
                cy.finish_checkpoint();
            } else {
                cy.clean();
            }
            let n = cy.rng.gen_range(0..20);
            cy.run_ops(n);
        }
        clean &= !cy.cut;
        let st = engine.stats();
        cy.tally.compressed += st.compress_blocks_compressed;
        cy.tally.recompressed += st.blocks_recompressed;
        let image = if clean {
            for a in std::mem::take(&mut cy.open) {
                engine
                    .end_aru(a)
                    .map_err(|e| format!("cycle {c}: end_aru before close: {e}"))?;
                cy.hist.log.push((a.0, Op::End));
            }
            engine
                .close()
                .map_err(|e| format!("cycle {c}: close: {e}"))?;
            cy.hist.flushed = cy.hist.log.len();
            dev.durable_image()
        } else {
            cy.tally.crashed_pending += engine.checkpoint_pending() as u64;
            let opts = CrashOptions {
                keep_probability: cy.rng.gen_range(0.0..1.0),
                tear_probability: cy.rng.gen_range(0.0..0.5),
            };
            dev.crash_image(cy.rng.gen(), &opts)
        };
        let refused = cy.tally.no_space > tally.no_space;
        let wrote = cy
            .hist
            .log
            .iter()
            .any(|(_, op)| matches!(op, Op::Write(..)));
        stuck = if refused && !wrote { stuck + 1 } else { 0 };
        if stuck >= STUCK_CYCLES {
            let live: u64 = engine
                .segment_usage()
                .iter()
                .map(|(_, u)| u.live_bytes as u64)
                .sum();
            return Err(format!(
                "cycle {c}: the device stayed full: {stuck} cycles in a row refused every write, \
                 with {live} live bytes of a capacity of {}; clean and releasable segments {:?}",
                engine.capacity_bytes(),
                engine.clean_segment_counts()
            ));
        }
        next_list = cy.next_list;
        tally = cy.tally;
        snaps = cy.snaps.take();
        let hist = cy.hist;
        engine.abandon();
        if mode.digest {
            digest = crc32c::crc32c_append(digest, &image);
        }
        dev = Arc::new(CrashDevice::from_image(image));
        dev.set_discard_keeps_old(discard_keeps_old(seed, c + 1));
        let reopened = Lld::open(dev.clone(), mode_options(mode, seed))
            .map_err(|e| format!("cycle {c}: reopen: {e}"))?;
        if reopened.accounting_drift() != 0 {
            return Err(format!("cycle {c}: live-byte accounting drifted"));
        }
        let problems = reopened
            .check_usage()
            .map_err(|e| format!("cycle {c}: check: {e}"))?;
        if !problems.is_empty() {
            return Err(format!("cycle {c}: usage check: {problems:?}"));
        }
        if let Some(sn) = snaps.as_mut() {
            let checked = check_snapshots(&reopened, &dev, sn, next_list, mode.kept_table)
                .map_err(|e| format!("cycle {c}: snapshots: {e}"))?;
            tally.snapshots_checked += checked;
        }
        let got = read_state(&reopened, next_list);
        let lo = if clean { hist.log.len() } else { hist.flushed };
        let matched = (lo..=hist.log.len())
            .rev()
            .find(|&p| hist.state_at(p) == got);
        match matched {
            Some(p) => state = hist.state_at(p),
            None => {
                let want = hist.state_at(hist.flushed);
                return Err(format!(
                    "cycle {c}: recovered state matches no allowed prefix ({} ops, flushed {}, clean {clean}).\n\
                     open: {:?}\n\
                     recovered lists {:?}\nstate at last flush lists {:?}\nops: {:?}",
                    hist.log.len(),
                    hist.flushed,
                    reopened.open_report(),
                    summarize(&got),
                    summarize(&want),
                    hist.log
                        .iter()
                        .map(|(a, op)| format!("{a}:{}", short(op)))
                        .collect::<Vec<_>>()
                ));
            }
        }
        lld = Some(reopened);
    }
    if let Some(l) = lld {
        l.close().map_err(|e| format!("final close: {e}"))?;
    }
    if mode.snapshots
        && cycles >= 200
        && (tally.snapshots_taken == 0 || tally.snapshots_deleted == 0)
    {
        return Err(format!(
            "cycles {first_cycle}..: no snapshot taken and deleted: {tally:?}"
        ));
    }
    if let Some(sn) = snaps.as_ref().filter(|_| mode.kept_table && cycles >= 200) {
        eprintln!(
            "generations: {} deleted whole, at most {} records on one pin bit",
            sn.generations_deleted, sn.most_sharing
        );
        if sn.generations_deleted == 0 || sn.most_sharing < 2 {
            return Err(format!(
                "cycles {first_cycle}..: no generation shared a pin bit or was deleted whole \
                 ({} deleted, at most {} sharing): {tally:?}",
                sn.generations_deleted, sn.most_sharing
            ));
        }
    }
    // 500 cycles (CI's run) recompress a few dozen blocks.
    if mode.compress && cycles >= 400 && (tally.compressed == 0 || tally.recompressed == 0) {
        return Err(format!(
            "cycles {first_cycle}..: nothing compressed or recompressed: {tally:?}"
        ));
    }
    if cycles >= CYCLES_PER_DEVICE && (tally.crashed_pending == 0 || tally.cut_finishing == 0) {
        return Err(format!(
            "cycles {first_cycle}..: no crash landed between a checkpoint's snapshot and its slot: {tally:?}"
        ));
    }
    eprintln!("cycles {first_cycle}..{}: {tally:?}", first_cycle + cycles);
    Ok(digest)
}

/// After a recovery: every acknowledged snapshot exists and reads as its
/// moment (through an engine opened at it, read-only, beside the live one),
/// a maybe-deleted one may be gone, a maybe-taken one may be there, and no
/// other exists; fsck's snapshot check finds nothing. Returns how many were
/// read.
fn check_snapshots(
    lld: &Lld,
    dev: &Arc<CrashDevice>,
    sn: &mut Snaps,
    universe: u64,
    kept_table: bool,
) -> Result<u64, String> {
    let infos = lld.snapshots();
    // Pin bits: a snapshot's is its own; protected checkpoints share one
    // only with a kept table (a generation).
    for s in &infos {
        let sharing = infos.iter().filter(|o| o.pin == s.pin).count();
        sn.most_sharing = sn.most_sharing.max(sharing);
        if sharing > 1 && (!kept_table || infos.iter().any(|o| o.pin == s.pin && !o.protected)) {
            return Err(format!("pin bit {} shared by {infos:?}", s.pin));
        }
    }
    for s in &infos {
        if let Some(&p) = sn.protected.get(&s.number) {
            if s.protected != p {
                return Err(format!(
                    "snapshot {} came back protected: {}, taken protected: {p}",
                    s.number, s.protected
                ));
            }
        }
    }
    let listed: Vec<u64> = infos.iter().map(|s| s.number).collect();
    let maybe_taken = sn.maybe_taken.take();
    for n in &listed {
        if sn.kept.contains_key(n) {
            continue;
        }
        match &maybe_taken {
            Some(state) if sn.kept.keys().all(|k| k < n) => {
                sn.kept.insert(*n, (state.clone(), Certainty::Acknowledged));
            }
            _ => {
                return Err(format!(
                    "snapshot {n} exists but was never taken (listed {listed:?})"
                ))
            }
        }
    }
    let mut read = 0;
    for (n, (state, certainty)) in std::mem::take(&mut sn.kept) {
        if !listed.contains(&n) {
            if certainty == Certainty::Acknowledged {
                return Err(format!(
                    "acknowledged snapshot {n} is gone (listed {listed:?})"
                ));
            }
            continue;
        }
        let opts = LldOptions {
            read_only: true,
            snapshot: Some(n),
            ..engine_options(false, false)
        };
        let reader = Lld::open(dev.clone(), opts).map_err(|e| format!("open snapshot {n}: {e}"))?;
        let got = read_state(&reader, universe);
        if got != state {
            return Err(format!(
                "snapshot {n} reads otherwise than the model's tree of its moment:
 got {:?}
want {:?}",
                summarize(&got),
                summarize(&state)
            ));
        }
        if !matches!(
            reader.write(None, ListId(1), 0, b"x"),
            Err(LdError::ReadOnly(_))
        ) {
            return Err(format!("snapshot {n} accepted a write"));
        }
        reader.close().map_err(|e| e.to_string())?;
        sn.kept.insert(n, (state, Certainty::Acknowledged));
        read += 1;
    }
    let problems = lld.check_snapshots(true).map_err(|e| e.to_string())?;
    if !problems.is_empty() {
        return Err(format!("fsck's snapshot check: {problems:?}"));
    }
    Ok(read)
}

fn summarize(s: &State) -> HashMap<u64, Vec<(u64, usize)>> {
    s.lists
        .iter()
        .map(|(l, b)| (*l, b.iter().map(|(i, d)| (*i, d.len())).collect()))
        .collect()
}

fn short(op: &Op) -> String {
    match op {
        Op::Write(l, i, d) => format!("W{l}/{i}({})", d.len()),
        other => format!("{other:?}"),
    }
}

#[test]
fn crash_recovery_matches_model() {
    let seed = base_seed();
    let total = cycles();
    let from: u64 = std::env::var("LDFS_FROM")
        .map(|v| v.parse().expect("LDFS_FROM must be a number"))
        .unwrap_or(0);
    let mut c = from;
    while c < total {
        let n = CYCLES_PER_DEVICE.min(total - c);
        if let Err(e) = run_device(seed, c, n, Mode::default()) {
            panic!(
                "{e}\nreplay: LDFS_SEED={seed} LDFS_FROM={c} LDFS_CRASH_CYCLES={} \
                 cargo test --release -p ldfs --test crash",
                c + n
            );
        }
        c += n;
    }
}

/// The chunk of the long run (`LDFS_LONG=1`, seed 3,000,995,107) in which
/// the device stayed full from cycle 57,098 on, at 55% of its capacity:
/// cleaning passes spent the reserve on the map pages their moves dirtied
/// (small blocks at scattered keys) before emptying a victim, and every
/// later pass could afford nothing (issue 12).
#[test]
fn the_chunk_the_long_run_found_stuck_full_stays_writable() {
    if let Err(e) = run_device(3_000_995_107, 57_000, CYCLES_PER_DEVICE, Mode::default()) {
        panic!("{e}\nreplay: LDFS_SEED=3000995107 LDFS_FROM=57000 LDFS_CRASH_CYCLES=58000 cargo test --release -p ldfs --test crash");
    }
}

/// The mix with snapshots taken and deleted (some as the power goes):
/// after every crash each acknowledged snapshot reads as the model's tree
/// of its moment (issue 18).
#[test]
fn crash_recovery_keeps_every_acknowledged_snapshot() {
    let base = base_seed();
    let mode = Mode {
        snapshots: true,
        kept_table: true,
        ..Mode::default()
    };
    run_snapshot_mix(
        base,
        base ^ 0x5a9,
        2,
        mode,
        "crash_recovery_keeps_every_acknowledged_snapshot",
    );
}

/// The snapshot mix on an image without a kept table (the format before
/// generations: protected checkpoints in the slot header, one pin bit
/// each), on a quarter of the cycles.
#[test]
fn crash_recovery_keeps_every_acknowledged_snapshot_without_a_kept_table() {
    let base = base_seed();
    let mode = Mode {
        snapshots: true,
        ..Mode::default()
    };
    run_snapshot_mix(
        base,
        base ^ 0x5aa,
        4,
        mode,
        "crash_recovery_keeps_every_acknowledged_snapshot_without_a_kept_table",
    );
}

/// Runs the snapshot mix with seed `seed` (derived from `base`) over
/// 1/`share` of the cycles.
fn run_snapshot_mix(base: u64, seed: u64, share: u64, mode: Mode, name: &str) {
    let total = (cycles() / share).max(1);
    let mut c: u64 = std::env::var("LDFS_FROM")
        .map(|v| v.parse().expect("LDFS_FROM must be a number"))
        .unwrap_or(0);
    while c < total {
        let n = CYCLES_PER_DEVICE.min(total - c);
        if let Err(e) = run_device(seed, c, n, mode) {
            panic!(
                "{e}\nreplay: LDFS_SEED={base} LDFS_FROM={c} LDFS_CRASH_CYCLES={} \
                 cargo test --release -p ldfs --test crash {name}\n\
                 (this test derives its seed from LDFS_SEED and runs 1/{share} of the cycles)",
                share * (c + n)
            );
        }
        c += n;
    }
}

/// The mix on compressing lists (lz4, zstd 1 and 3, off; changed as it
/// goes, in ARUs that may abort; a third of the blocks random), with the
/// cleaner recompressing the cold blocks it moves: after every crash the
/// lists read as the model says (issue 17).
#[test]
fn crash_recovery_matches_model_with_compression() {
    let base = base_seed();
    let seed = base ^ 0xc0;
    let total = (cycles() / 4).max(1);
    let mode = Mode {
        compress: true,
        ..Mode::default()
    };
    let mut c = 0;
    while c < total {
        let n = CYCLES_PER_DEVICE.min(total - c);
        if let Err(e) = run_device(seed, c, n, mode) {
            panic!(
                "{e}\nseed {base} (this test xors it with 0xc0 and runs a quarter of the cycles; \
                 from cycle {c}): LDFS_SEED={base} LDFS_CRASH_CYCLES={} \
                 cargo test --release -p ldfs --test crash crash_recovery_matches_model_with_compression",
                4 * (c + n)
            );
        }
        c += n;
    }
}

/// A seed replays exactly: the same operations, crash points and power
/// cuts give byte-identical crash images (the log's writes are made by the
/// thread that seals them, checkpoints are finished by the mix), so the
/// replay command a failure prints reproduces it.
#[test]
fn a_seed_replays_exactly() {
    let seed = base_seed() ^ 0x7e9a;
    let mode = Mode {
        threads: false,
        digest: true,
        snapshots: false,
        kept_table: false,
        compress: false,
    };
    let first = run_device(seed, 0, 60, mode).unwrap();
    let again = run_device(seed, 0, 60, mode).unwrap();
    assert_eq!(
        first, again,
        "seed {seed}: two runs crashed to different images"
    );
}

/// The log writer on its own thread, as in use (no exact replay: the
/// scheduler decides which queued writes a crash finds on the device).
#[test]
fn crash_recovery_matches_model_with_the_log_writer_thread() {
    let seed = base_seed() ^ 0x7d;
    let cycles = (cycles() / 5).min(CYCLES_PER_DEVICE);
    let mode = Mode {
        threads: true,
        digest: false,
        snapshots: false,
        kept_table: false,
        compress: false,
    };
    if let Err(e) = run_device(seed, 0, cycles, mode) {
        panic!("{e}\nseed {seed} (threaded: the seed may not reproduce it)");
    }
}
