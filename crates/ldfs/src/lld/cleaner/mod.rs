//! The segment cleaner: mechanism and scheduling (BSD-LFS 3.5, LD 3.5).
//!
//! A pass (`Engine::clean`) does what BSD-LFS's user-level cleaner does
//! through `lfs_bmapv`/`lfs_markv`/`lfs_segclean`, inside the engine:
//!
//! 1. a [`policy`] picks victims from the usage table alone, and the batch
//!    is cut to what the cleaner's half of the reserve can absorb;
//! 2. each victim is read whole, once, without the state lock, and its
//!    summaries parsed; a block is live iff the map names exactly the
//!    address its record describes, a map page iff the map still uses it;
//! 3. live blocks, those of hot victims before those of cold ones
//!    (Rosenblum and Ousterhout's hot/cold segregation) and each group
//!    sorted by (list, index) so lists come back contiguous (LD 3.5), are
//!    rewritten through the normal log as Meta-class writes outside any
//!    ARU, each only if the map *still* holds the entry it was found with
//!    (a block that died meanwhile is never resurrected) and no open ARU
//!    wrote it; their bytes come from the victim buffer, checked
//!    against the map's crc; live map pages are dirtied so the next
//!    checkpoint writes them elsewhere;
//! 4. a checkpoint (only when no ARU that logged something is open) makes
//!    the emptied victims Clean — after its flush, never before (STYLE 11).
//!
//! Moving a block changes only the map. Passes are serialized by
//! `Engine::cleaner`. Progress is guaranteed while the live data fits:
//! user writes may not take the last `reserved_segments` clean segments,
//! the cleaner may use half of them, and a victim is only chosen if what
//! it holds fits in what the cleaner may use.
//!
//! Scheduling: a user write that finds fewer clean segments than the start
//! watermark first runs one bounded step (foreground cleaning); a write
//! refused for want of clean segments while its live data fits waits for
//! the cleaner and retries; a background thread, if enabled, cleans when
//! the engine is idle until the stop watermark is reached, and whenever
//! clean segments are below the start watermark.

pub mod policy;

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use self::policy::PolicyKind;
use super::engine::{Engine, Move, MAP_RECORD_BYTES};
use super::layout::Geometry;
use super::map::DirtySet;
use super::summary::{self, Expect, Record};
use super::types::{Key, SegmentId, PAGE_BYTES};
use super::usage::SegmentState;
use super::writer::WRITE_RECORD_BYTES;
use crate::ld::{LdError, LdResult};

/// When and how the cleaner runs.
#[derive(Clone, Debug)]
pub struct CleanerOptions {
    /// Victim selection (changeable at run time: `Engine::set_cleaner_policy`).
    pub policy: PolicyKind,
    /// Cleaning starts below this many clean segments (`None`: the reserve
    /// plus max(2, segments/256)).
    pub start_clean_segments: Option<u32>,
    /// Background cleaning stops above this many (`None`: start plus 1/16
    /// of the segments, at least 4).
    pub stop_clean_segments: Option<u32>,
    /// Most victims in one step (one foreground step, one background pass).
    pub step_segments: u32,
    /// Run a background cleaner thread (`Lld::open` starts it). Off by
    /// default so that tests replay exactly; a mount turns it on.
    pub background: bool,
    /// The engine counts as idle after this long without an operation.
    pub idle_ms: u64,
    /// Live data (blocks, map pages and one summary record per block) may
    /// fill at most this percentage of the segments outside the reserve;
    /// beyond it writes fail with NoSpace and `space()` reports none left.
    pub max_live_percent: u32,
    /// How long a writer waiting for space lets other threads' ARUs run
    /// before giving up on the checkpoint that frees cleaned segments (and
    /// failing with NoSpace). 0 for single-threaded callers that hold
    /// several ARUs: they would only wait for themselves.
    pub aru_wait_ms: u64,
    /// Cold blocks of compressing lists that a pass moves are stored anew
    /// as zstd at this level when that saves a sixteenth (LD section 3:
    /// compress cold data during cleaning, so writes need not wait for a
    /// strong compressor). `None`: blocks move as they are.
    pub recompress_cold: Option<u8>,
}

impl Default for CleanerOptions {
    fn default() -> Self {
        CleanerOptions {
            policy: PolicyKind::default(),
            start_clean_segments: None,
            stop_clean_segments: None,
            step_segments: 16,
            background: false,
            idle_ms: 50,
            max_live_percent: 90,
            aru_wait_ms: 500,
            recompress_cold: None,
        }
    }
}

/// Counters since open.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CleanerStats {
    pub passes: u64,
    pub foreground_steps: u64,
    pub background_passes: u64,
    /// Writes that waited for the cleaner.
    pub waits: u64,
    pub victims: u64,
    /// Segments made clean by the cleaner's checkpoints.
    pub segments_released: u64,
    pub blocks_moved: u64,
    pub bytes_moved: u64,
    pub map_pages_moved: u64,
    /// Blocks found live that died (or were claimed by an ARU) before they
    /// could be moved, and were left alone.
    pub died_while_cleaning: u64,
}

/// What one pass did.
#[derive(Clone, Debug, Default)]
pub struct CleanReport {
    pub victims: Vec<SegmentId>,
    pub blocks_moved: u64,
    pub bytes_moved: u64,
    pub map_pages_moved: u64,
    pub died_while_cleaning: u64,
    /// Live blocks whose map entry points outside the victim's bytes
    /// (a lying map): left alone and reported.
    pub inconsistent: u64,
    /// Segments released by checkpoints during the pass (its own victims,
    /// those emptied by earlier passes that left the release for later,
    /// and any that overwrites emptied meanwhile).
    pub released: u32,
    pub clean_before: u32,
    pub clean_after: u32,
    pub checkpointed: bool,
    /// The cleaner's share of the reserve ran out before the batch did.
    pub out_of_space: bool,
    /// Every victim the policy offered would have cost more than it frees:
    /// the pass cleaned the cheapest one alone (see `clean_pass_below`).
    pub losing: bool,
}

impl CleanReport {
    /// Whether the pass freed more than it spent: released something, and
    /// was not a losing pass (which releases its victim but writes more
    /// than a segment doing so; callers that repeat passes while they make
    /// progress would otherwise churn for ever on a device where no pass
    /// gains).
    pub fn progress(&self) -> bool {
        self.released > 0 && !self.losing
    }
}

/// What `Engine::clean_now` did over all its passes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CleanSummary {
    pub passes: u64,
    /// Segments made clean (by this call's checkpoints).
    pub released: u64,
    pub blocks_moved: u64,
    pub bytes_moved: u64,
    pub clean_before: u32,
    pub clean_after: u32,
    /// Stopped early because `cancel` was set.
    pub cancelled: bool,
}

impl std::fmt::Display for CleanSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} segments released in {} passes, {} blocks ({} bytes) moved; clean segments {} -> {}{}",
            self.released,
            self.passes,
            self.blocks_moved,
            self.bytes_moved,
            self.clean_before,
            self.clean_after,
            if self.cancelled { " (stopped)" } else { "" }
        )
    }
}

/// The cleaner's state inside the engine (behind `Engine::cleaner`).
pub(crate) struct CleanerState {
    pub policy: PolicyKind,
    pub stats: CleanerStats,
    /// Victims whose blocks are all moved but whose map pages move only at
    /// the next checkpoint: not candidates again until it has happened.
    awaiting: Vec<SegmentId>,
    /// Checkpoints begun when `awaiting` was last added to
    /// (`Engine::relocate_map_pages`): the next one to begin moves the pages.
    awaiting_since: u64,
}

/// Losing passes a waiting writer may still retry after: each releases its
/// victim and leaves dead map pages that a later pass may gain from, but
/// on a device where no pass gains they only churn.
const LOSING_RETRIES: u32 = 3;

/// How many times `wait_rounds` a writer may retry after other threads
/// freed space that it then did not get (`clean_for_space`).
const OTHERS_ROUNDS: u32 = 16;

/// Rounds a waiting writer spends waiting (`aru_wait_ms` each) for open
/// ARUs to end so that a checkpoint can release what passes emptied (at
/// eight, a writer beside a long ARU waited 5.5 s for its NoSpace: review
/// 16).
const BLOCKED_ROUNDS: u32 = 4;

/// One writer's wait for space (`clean_for_space`).
#[derive(Default)]
pub(crate) struct SpaceWait {
    /// Losing passes waited through.
    losing: u32,
    /// Passes and checkpoints of its own.
    own: u32,
    /// Retries after another thread freed space first.
    others: u32,
    /// Rounds whose releasing checkpoint open ARUs kept from being taken.
    blocked: u32,
    /// A freeing operation cleaning first (`Engine::lock_for_meta`): it
    /// has a floor of its own to fall back to, so it never waits for open
    /// ARUs (it waited seconds beside one, and again every 65th operation:
    /// review 16).
    pub(crate) freeing: bool,
    /// A freeing operation did its one round (`clean_for_space`): not
    /// futile, only not its to go on with. (It queues behind a pass already
    /// running: skipping it with `try_lock` let deletes beside a busy
    /// writer sink the log below the cleaner's floor again, and a delete
    /// got NoSpace: review 18.)
    pub(crate) busy: bool,
}

impl SpaceWait {
    /// The wait of a freeing operation (`freeing`).
    pub(crate) fn freeing() -> SpaceWait {
        SpaceWait {
            freeing: true,
            ..SpaceWait::default()
        }
    }
}

impl CleanerState {
    pub fn new(policy: PolicyKind) -> CleanerState {
        CleanerState {
            policy,
            stats: CleanerStats::default(),
            awaiting: Vec::new(),
            awaiting_since: 0,
        }
    }
}

/// Where the log head was, in sequence numbers, three quarters of the
/// segments ago: a victim last written before that is cold. The engine
/// notes every segment the head enters; a sample is kept every `every`
/// segments (at most about 1,024 whatever the device size), so the answer
/// is at most `every` segments older than the exact one. Not persisted:
/// until an open has written that much log, the answer is estimated from
/// the segments' ages (`seeded`).
#[derive(Debug)]
pub(crate) struct LogClock {
    /// (segments entered, sequence number then), oldest first.
    samples: VecDeque<(u64, u64)>,
    span: u64,
    every: u64,
    /// The answer until the samples reach back `span` segments.
    seed: u64,
}

impl LogClock {
    /// A clock for `segment_count` segments, started at the head's
    /// position (`entered`, `seq`).
    pub fn new(segment_count: u32, entered: u64, seq: u64) -> LogClock {
        let span = (segment_count as u64 * 3 / 4).max(1);
        let mut c = LogClock {
            samples: VecDeque::new(),
            span,
            every: (span / 1024).max(1),
            seed: 0,
        };
        c.samples.push_back((entered, seq));
        c
    }

    /// Estimates the answer from the ages (last sequence numbers) of the
    /// segments holding data, for the time before the clock has run a
    /// whole span: the age of the `span`-th youngest, as if the head had
    /// written those segments one after another. Fewer than that: 0.
    pub fn seeded(mut self, mut ages: Vec<u64>) -> LogClock {
        let k = self.span as usize;
        if ages.len() > k {
            ages.select_nth_unstable_by(k, |a, b| b.cmp(a));
            self.seed = ages[k];
        }
        self
    }

    /// The head entered its `entered`-th segment; `seq` is the sequence
    /// number of the partial segment it will write next.
    pub fn note(&mut self, entered: u64, seq: u64) {
        if entered.is_multiple_of(self.every) {
            self.samples.push_back((entered, seq));
        }
        if let Some(horizon) = entered.checked_sub(self.span) {
            // Keep the newest sample at or before the horizon, and later ones.
            while self.samples.get(1).is_some_and(|&(e, _)| e <= horizon) {
                self.samples.pop_front();
            }
        }
    }

    /// The sequence number before which a segment counts as cold, with the
    /// head in its `entered`-th segment (0, nothing cold, until `span`
    /// segments were entered since the clock started, unless seeded).
    pub fn cold_before(&self, entered: u64) -> u64 {
        let horizon = entered.checked_sub(self.span);
        match (self.samples.front(), horizon) {
            (Some(&(e, s)), Some(h)) if e <= h => s,
            _ => self.seed,
        }
    }
}

/// When a pass checkpoints to release what it emptied.
#[derive(Clone, Copy, Debug)]
enum Release {
    /// At the end of the pass, waiting up to this long for open ARUs.
    Now(Duration),
    /// Only once enough is releasable (or clean segments are short), so one
    /// checkpoint's map pages pay for many segments.
    Batched,
}

/// Live blocks and map pages a victim's summaries name.
struct VictimContents {
    blocks: Vec<(Key, u64)>,
    map_pages: Vec<u64>,
}

/// Parses the valid partial segments of a segment read whole into `buf`
/// (as `recovery::scan_segment` does from the device): every block record
/// with its byte address, every map page address. Stops at the first page
/// holding no valid summary, or at a sequence number that does not grow
/// (a partial left from before the segment was reused).
fn scan_buffer(g: &Geometry, seg: SegmentId, buf: &[u8]) -> VictimContents {
    let mut out = VictimContents {
        blocks: Vec::new(),
        map_pages: Vec::new(),
    };
    let mut page = 0u32;
    let mut last_seq: Option<u64> = None;
    while page + 1 < g.segment_pages {
        let off = page as usize * PAGE_BYTES;
        let addr = g.page_addr(seg, page);
        let ex = Expect {
            fs_id: g.fs_id,
            segment: seg.0,
            page,
            pages_left: g.segment_pages - page,
            segment_count: g.next_segment_bound(),
            max_block_bytes: g.max_block_bytes,
        };
        let Ok(h) = summary::decode_header(&buf[off..], addr, &ex) else {
            break;
        };
        // decode_header bounded the partial by the pages left.
        let end = off + h.summary_pages as usize * PAGE_BYTES;
        let Ok(records) = summary::decode_records_limited(
            &buf[off..end],
            addr,
            h.summary_pages,
            h.data_pages,
            g.max_block_bytes,
        ) else {
            break;
        };
        if last_seq.is_some_and(|l| h.seq <= l) {
            break;
        }
        last_seq = Some(h.seq);
        let data_base = addr + h.summary_pages as u64 * PAGE_BYTES as u64;
        for r in records {
            match r {
                Record::Write { key, data_off, .. } => {
                    out.blocks.push((key, data_base + data_off as u64))
                }
                Record::MapPage { data_off, .. } => out.map_pages.push(data_base + data_off as u64),
                _ => {}
            }
        }
        page += h.total_pages();
    }
    out
}

/// Map lookups per lock hold while deciding liveness.
const LOOKUP_CHUNK: usize = 512;

impl Engine {
    /// Recompresses the cold blocks of compressing lists among `moves`
    /// (`CleanerOptions::recompress_cold`), outside the engine's lock;
    /// `compressing` remembers each list's answer for the pass.
    fn recompress(
        &self,
        moves: &mut [Move],
        level: u8,
        compressing: &mut HashMap<u64, bool>,
    ) -> LdResult<()> {
        use crate::ld::{ListId, LogicalDisk};
        let max_block = self.max_block_bytes() as u32;
        for m in moves.iter_mut() {
            // List 0 holds the engine's own hint blocks.
            if m.key.list == 0 {
                continue;
            }
            let on = match compressing.get(&m.key.list) {
                Some(&on) => on,
                None => {
                    let on = self
                        .list_hints(ListId(m.key.list))?
                        .is_some_and(|h| !h.compress.is_off());
                    compressing.insert(m.key.list, on);
                    on
                }
            };
            if on {
                m.recompressed =
                    super::engine::recompress_cold(&m.expected, &m.stored, level, max_block);
            }
        }
        Ok(())
    }

    /// Sets the victim-selection policy from now on.
    pub fn set_cleaner_policy(&self, p: PolicyKind) {
        self.cleaner.lock().expect("cleaner poisoned").policy = p;
    }

    pub fn cleaner_policy(&self) -> PolicyKind {
        self.cleaner.lock().expect("cleaner poisoned").policy
    }

    pub fn cleaner_stats(&self) -> CleanerStats {
        self.cleaner.lock().expect("cleaner poisoned").stats
    }

    /// One cleaning pass now with `policy`, over at most `max_victims`
    /// segments (tools and tests; the engine schedules its own).
    pub fn clean(&self, policy: PolicyKind, max_victims: usize) -> LdResult<CleanReport> {
        self.clean_below(policy, max_victims, 1.0)
    }

    /// A pass like `clean` that leaves alone segments fuller than
    /// `max_utilization` (a fraction of the segment; `ldfs clean`).
    pub fn clean_below(
        &self,
        policy: PolicyKind,
        max_victims: usize,
        max_utilization: f64,
    ) -> LdResult<CleanReport> {
        let mut st = self.cleaner.lock().expect("cleaner poisoned");
        self.clean_pass_below(
            &mut st,
            policy,
            max_victims,
            Release::Now(Duration::ZERO),
            max_utilization,
        )
    }

    /// Cleans now, pass after pass (`ldfs clean`, on an image or a mount):
    /// segments at or below `max_utilization` chosen by `policy`, until the
    /// policy finds none, `max_segments` were released, `cancel` is set, or
    /// three passes in a row gain no clean segment (victims whose live
    /// blocks an open ARU holds stay until it ends; a compacted device
    /// gives a segment of survivors for each victim).
    pub fn clean_now(
        &self,
        policy: PolicyKind,
        max_segments: Option<u64>,
        max_utilization: f64,
        cancel: &std::sync::atomic::AtomicBool,
    ) -> LdResult<CleanSummary> {
        let limit = max_segments.unwrap_or(u64::MAX);
        let mut sum = CleanSummary {
            clean_before: self.clean_segment_counts().0,
            ..Default::default()
        };
        let moved0 = self.write_totals().1;
        let mut futile = 0;
        // Clean segments the passes gained, net of those used meanwhile.
        let (mut gained, mut most_gained) = (0i64, 0i64);
        while sum.released < limit && !cancel.load(std::sync::atomic::Ordering::Relaxed) {
            let step = (limit - sum.released).min(16) as usize;
            let rep = self.clean_below(policy, step, max_utilization)?;
            if rep.victims.is_empty() {
                break;
            }
            sum.passes += 1;
            sum.released += rep.released as u64;
            sum.blocks_moved += rep.blocks_moved;
            // A pass that freed no more segments than its survivors took
            // is futile too: on a compacted device (or one where no pass
            // gains) every pass would release its victims for ever. So is
            // one that only wins back what an earlier pass lost: on a full
            // device small passes alternate, one clean segment more, then
            // one less, for ever. (Counted per pass, so writes between
            // passes on a mount do not make gaining passes look futile.)
            gained += rep.clean_after as i64 - rep.clean_before as i64;
            if rep.progress() && gained > most_gained {
                most_gained = gained;
                futile = 0;
            } else {
                futile += 1;
                if futile >= 3 {
                    break;
                }
            }
        }
        sum.cancelled = cancel.load(std::sync::atomic::Ordering::Relaxed);
        sum.bytes_moved = self.write_totals().1 - moved0;
        sum.clean_after = self.clean_segment_counts().0;
        Ok(sum)
    }

    /// One bounded step with the current policy: foreground (a write below
    /// the start watermark) or a background pass.
    pub(crate) fn clean_step(&self, background: bool) -> LdResult<CleanReport> {
        let mut st = self.cleaner.lock().expect("cleaner poisoned");
        if !background {
            // Another thread may have cleaned while this one waited.
            let (clean, _) = self.clean_segment_counts();
            if clean >= self.start_watermark() {
                return Ok(CleanReport::default());
            }
        }
        let policy = st.policy;
        let step = self.options().cleaner.step_segments.max(1) as usize;
        let rep = self.clean_pass(&mut st, policy, step, Release::Batched)?;
        if background {
            st.stats.background_passes += 1;
        } else {
            st.stats.foreground_steps += 1;
            if rep.victims.is_empty() && !rep.progress() {
                drop(st);
                self.note_futile(64);
            }
        }
        Ok(rep)
    }

    /// A write was refused for want of clean segments while its data fits:
    /// clean (waiting for a running pass first) and say whether space was
    /// freed, so the caller retries, or not, so it fails with NoSpace.
    ///
    /// `wait` is the writer's own account (a count shared between writers
    /// made one that came after a successful retry give up after a single
    /// pass: review 10). After `LOSING_RETRIES` losing passes
    /// (`CleanReport::losing`), or `wait_rounds` passes and checkpoints of
    /// its own, it gets `false`. Rounds in which another thread had freed
    /// space first count apart, against a far larger bound: with several
    /// writers, the others may take that space before this one retries,
    /// and counted as its own such rounds made writers give up within a
    /// second while every pass gained (review 12, four writers).
    pub(crate) fn clean_for_space(&self, seen_clean: u32, wait: &mut SpaceWait) -> LdResult<bool> {
        let mut st = self.cleaner.lock().expect("cleaner poisoned");
        st.stats.waits += 1;
        let (clean, releasable) = self.clean_segment_counts();
        if clean > seen_clean {
            wait.others += 1;
            let bound = if wait.freeing {
                2
            } else {
                OTHERS_ROUNDS * self.wait_rounds()
            };
            return Ok(wait.others <= bound);
        }
        // A freeing operation cleans one round at most: it may go on at
        // its own floor, and each one cleaning a round keeps pace with the
        // room they take (a pass per delete), without one delete running
        // the long, doubling passes of a waiting writer (review 16).
        if wait.freeing && wait.own >= 1 {
            wait.busy = true;
            return Ok(false);
        }
        wait.own += 1;
        if wait.own > self.wait_rounds() {
            return Ok(false);
        }
        let wait_for_arus = if wait.freeing {
            Duration::ZERO
        } else {
            Duration::from_millis(self.options().cleaner.aru_wait_ms)
        };
        if releasable > 0 || !st.awaiting.is_empty() {
            // What earlier passes emptied only needs the checkpoint.
            if self.checkpoint_when_quiet(wait_for_arus)? {
                st.awaiting.clear();
                return Ok(true);
            }
            // Open ARUs kept it from being taken: wait for them a few
            // rounds more (review 14, F4).
            wait.blocked += 1;
            return Ok(!wait.freeing && wait.blocked <= BLOCKED_ROUNDS);
        }
        // A writer is waiting: free the most space now. Greedy takes the
        // emptiest segments whatever the configured policy (which may
        // prefer old, fuller ones): a pass must gain more than it spends.
        if wait.losing >= LOSING_RETRIES {
            return Ok(false);
        }
        // Each losing pass doubles the next one's victims (the budget still
        // bounds them): when the map is larger than a pass of `step`
        // victims can pay for (small blocks at scattered keys, a map of
        // hundreds of pages), only a pass that shares the map's rewrite
        // among dozens of victims gains, and writers gave up after three
        // losing passes of 16 while `clean_now` (64) then freed space.
        let step = (self.options().cleaner.step_segments.max(1) as usize) << wait.losing;
        let rep = self.clean_pass(
            &mut st,
            PolicyKind::Greedy,
            step,
            Release::Now(wait_for_arus),
        )?;
        if rep.losing && rep.released > 0 {
            // Released something: the writer tries admission again.
            wait.losing += 1;
            return Ok(true);
        }
        if rep.progress() {
            return Ok(true);
        }
        // Released nothing, but a checkpoint would: open ARUs kept the
        // pass's own from being taken (it waits `aru_wait_ms`). Giving up
        // here refused a writer after one pass that had emptied six
        // segments (review 14, F4); the next round waits for the ARUs.
        let (_, releasable) = self.clean_segment_counts();
        Ok(!rep.checkpointed && (releasable > 0 || !st.awaiting.is_empty()))
    }

    fn clean_pass(
        &self,
        st: &mut CleanerState,
        policy: PolicyKind,
        max_victims: usize,
        release: Release,
    ) -> LdResult<CleanReport> {
        self.clean_pass_below(st, policy, max_victims, release, 1.0)
    }

    fn clean_pass_below(
        &self,
        st: &mut CleanerState,
        policy: PolicyKind,
        max_victims: usize,
        release: Release,
        max_utilization: f64,
    ) -> LdResult<CleanReport> {
        let geo = self.geometry();
        let (mut snap, view) = self.cleaner_view();
        snap.max_utilization = max_utilization;
        let released0 = self.stats().segments_released;
        // A checkpoint pending when the pages were dirtied does not move
        // them; the next one does.
        if self.checkpoints_finished() > st.awaiting_since {
            st.awaiting.clear();
        }
        for s in &st.awaiting {
            // Nothing left to do there but the checkpoint: hide it from
            // the policy (the snapshot is the cleaner's own copy).
            snap.segments[s.0 as usize].1.state = SegmentState::Active;
        }
        let mut rep = CleanReport {
            clean_before: view.clean,
            ..Default::default()
        };
        // The batch must fit in what the cleaner may write before the
        // checkpoint that frees it: each victim costs its live blocks with
        // their records, its share of the partial segments' rounding, and
        // the map pages its moves newly dirty, each one more page that
        // checkpoint writes (with small blocks at scattered keys nearly a
        // page per block; victims then share most of them). Room for one
        // more move stays,
        // or the pass would leave the cleaner unable to move even the next
        // victim's smallest block (issue 12: counting live bytes alone, a
        // pass spent the reserve on map pages before emptying any victim,
        // and the log stayed full for good).
        let seg_bytes = geo.segment_bytes() as i64;
        let page_cost = (PAGE_BYTES + MAP_RECORD_BYTES) as i64;
        let cold_before = self.cold_before();
        let chunk_bytes = self.options().partial_bytes.max(PAGE_BYTES) as i64;
        let chunk_bytes_est = chunk_bytes.min(seg_bytes);
        let mut moved = 0i64;
        // A map page the moves dirty is written once, by the checkpoint
        // that releases the victims, however many of them dirty it, unless
        // a checkpoint begins during the moves: `relocate_batch` begins
        // none, so the hot and cold runs (below) share their pages. (Counted
        // once per run, a pass saw up to twice the map it rewrites, and with
        // small blocks at scattered keys, where the map is most of a pass's
        // cost, planned passes too small to gain: the three-quarters-full
        // cleaner test failed.) A checkpoint can still begin mid-pass, from
        // another thread's operation past the dirty limit or from admission
        // making room; with the moves sorted by key it writes the leaves
        // dirtied so far, and later moves dirty others.
        let mut seen = DirtySet::default();
        // Lists whose compression is on, as far as this pass asked.
        let mut compressing: HashMap<u64, bool> = HashMap::new();
        let mut budget = view.headroom_bytes;
        let mut map = None;
        let mut taken: Vec<Victim> = Vec::new();
        let mut keep_bytes = 0;
        // The pass's moves share partial segments of about `chunk_bytes`
        // (at most a segment): each may leave a page part empty and spill
        // its summary into another page, and a segment tail too short for a
        // partial is skipped. A victim pays for the partials its data adds.
        let overhead = |bytes: i64| (2 * (bytes / chunk_bytes_est + 1) + 2) * PAGE_BYTES as i64;
        for seg in policy.policy().select(&snap, max_victims) {
            let age = snap.segments[seg.0 as usize].1.last_seq;
            let buf = self.read_segment(seg)?;
            let contents = scan_buffer(&geo, seg, &buf);
            let base = geo.page_addr(seg, 0);
            let mut found = Vec::new();
            for chunk in contents.blocks.chunks(LOOKUP_CHUNK) {
                for ((key, addr), e) in chunk.iter().zip(self.live_entries(chunk)?) {
                    let Some(e) = e else { continue };
                    let start = (addr - base) as usize;
                    match buf.get(start..start + e.len as usize) {
                        Some(b) => found.push(Move {
                            key: *key,
                            expected: e,
                            stored: b.to_vec(),
                            age,
                            recompressed: None,
                        }),
                        None => rep.inconsistent += 1,
                    }
                }
            }
            if let (Some(level), true) = (self.options().cleaner.recompress_cold, age < cold_before)
            {
                self.recompress(&mut found, level, &mut compressing)?;
            }
            let keys: Vec<Key> = found.iter().map(|m| m.key).collect();
            let m = self.map_cost_of_moves(&keys, &contents.map_pages, &mut seen);
            let data: i64 = found
                .iter()
                .map(|m| (m.out_len() + WRITE_RECORD_BYTES) as i64)
                .sum();
            let pages = m.new_pages;
            let cost = data + overhead(moved + data)
                - if taken.is_empty() { 0 } else { overhead(moved) }
                + pages as i64 * page_cost;
            keep_bytes = m.path_pages as i64 * PAGE_BYTES as i64;
            let keep = if taken.is_empty() { keep_bytes } else { 0 };
            if cost + keep > budget {
                break;
            }
            budget -= cost + keep;
            moved += data;
            map = Some(m);
            taken.push(Victim {
                seg,
                found,
                map_pages: contents.map_pages,
                data,
                cost: (cost, pages),
            });
        }
        // The prefix of the policy's order that frees the most net of its
        // cost. When every prefix costs more than it frees, the one victim
        // that costs least is still cleaned: the map pages it rewrites
        // leave dead copies behind that later passes reclaim, while
        // cleaning nothing would leave the log full for good. Admission
        // keeps room for a pass that gains (`map_allowance`).
        let mut net = 0;
        let mut best = (0, 0);
        for (i, v) in taken.iter().enumerate() {
            net += seg_bytes - v.cost.0;
            if net > best.1 {
                best = (i + 1, net);
            }
        }
        if best.0 == 0 {
            // Alone, not after the others: a victim late in the policy's
            // order was charged only the pages the earlier ones did not
            // dirty. Losing only if even this one costs a segment or more
            // (a victim holding just map pages or a few blocks, after one
            // that dirties most of the map, gains; counted as losing, its
            // pass made writers give up on a device with room: review 12).
            // (The first one's cost is its cost alone, and it fitted with
            // its path kept, as planned.)
            for v in taken.iter_mut().skip(1) {
                let keys: Vec<Key> = v.found.iter().map(|m| m.key).collect();
                let m = self.map_cost_of_moves(&keys, &v.map_pages, &mut DirtySet::default());
                v.cost = (
                    v.data + overhead(v.data) + m.new_pages as i64 * page_cost,
                    m.new_pages,
                );
            }
            let fits = |&i: &usize| i == 0 || taken[i].cost.0 + keep_bytes <= view.headroom_bytes;
            if let Some(i) = (0..taken.len())
                .filter(fits)
                .min_by_key(|&i| taken[i].cost.0)
            {
                taken.swap(0, i);
                best.0 = 1;
                rep.losing = taken[0].cost.0 >= seg_bytes;
            }
        }
        taken.truncate(best.0);
        let spent: i64 = taken.iter().map(|v| v.cost.0).sum();
        let new_pages: usize = taken.iter().map(|v| v.cost.1).sum();
        let mut moves: Vec<((bool, usize), Move)> = Vec::new();
        for (
            v,
            Victim {
                seg,
                found,
                map_pages,
                ..
            },
        ) in taken.into_iter().enumerate()
        {
            let age = snap.segments[seg.0 as usize].1.last_seq;
            rep.victims.push(seg);
            moves.extend(found.into_iter().map(|m| ((age < cold_before, v), m)));
            let (pages, begun) = self.relocate_map_pages(&map_pages)?;
            if pages > 0 {
                st.awaiting.push(seg);
                st.awaiting_since = begun;
            }
            rep.map_pages_moved += pages;
        }
        // Survivors of hot victims are written before those of cold ones,
        // not mixed with them by key: a segment of cold survivors then stays
        // full, and one of hot survivors empties again soon (Sprite LFS's
        // hot/cold segregation, approximated within a pass). A victim
        // is cold when last written before the log head's position three
        // quarters of the segments ago.
        //
        // Within each group, sorting by key clusters lists best, but if the
        // space ran out half way every victim would keep some live blocks
        // and none could be released: with little room to spare, empty the
        // victims one after the other (each sorted by key) — hot ones first,
        // then cold ones, each in the policy's order. Only while no
        // checkpoint is due in the middle of the pass, though (other
        // threads' operations begin one past the dirty-page limit): it would
        // write the leaves the first victim dirtied, and each later victim
        // dirty them again.
        let mid_pass = map.is_some_and(|m| m.dirtied + new_pages >= m.limit);
        if (view.headroom_bytes - spent) * 2 >= view.headroom_bytes || mid_pass {
            for ((_, v), _) in &mut moves {
                *v = 0;
            }
        }
        moves.sort_by_key(|(order, m)| (*order, m.key));
        // Move in chunks of about a partial segment, so user operations
        // get the lock between them.
        let chunk_bytes = chunk_bytes as usize;
        let mut it = moves.into_iter().map(|(_, m)| m).peekable();
        while it.peek().is_some() {
            let mut batch = Vec::new();
            let mut bytes = 0;
            while let Some(m) = it.next_if(|_| bytes < chunk_bytes) {
                bytes += m.out_len();
                batch.push(m);
            }
            let out = self.relocate_batch(batch)?;
            rep.blocks_moved += out.moved;
            rep.bytes_moved += out.moved_bytes;
            rep.died_while_cleaning += out.stale;
            if out.out_of_space {
                rep.out_of_space = true;
                break;
            }
        }
        let (clean, releasable) = self.clean_segment_counts();
        // Any victim wants the checkpoint, even one nothing was moved out
        // of: what it still counts live may be map pages the moves dirtied
        // (their old copies leave only when the checkpoint writes them), so
        // without one it is neither releasable nor worth a move, and the
        // next pass picks it again for nothing.
        let wanted = releasable > 0 || !rep.victims.is_empty();
        let wait = match release {
            Release::Now(wait) => Some(wait),
            // Every checkpoint rewrites the map pages the moves dirtied:
            // release in batches, when the band between the watermarks is
            // full or clean segments reach the reserve.
            Release::Batched
                if clean <= self.reserved_segments() + 1
                    || clean + releasable >= self.stop_watermark() =>
            {
                Some(Duration::ZERO)
            }
            Release::Batched => None,
        };
        if let (true, Some(wait)) = (wanted, wait) {
            rep.checkpointed = self.checkpoint_when_quiet(wait)?;
            if rep.checkpointed {
                st.awaiting.clear();
            }
        }
        // Checkpoints during the moves (admission makes room that way) and
        // the one above: this pass's victims and those of earlier batched
        // passes, and anything overwrites emptied meanwhile.
        rep.released = (self.stats().segments_released - released0) as u32;
        rep.clean_after = self.clean_segment_counts().0;
        let s = &mut st.stats;
        s.passes += 1;
        s.victims += rep.victims.len() as u64;
        s.segments_released += rep.released as u64;
        s.blocks_moved += rep.blocks_moved;
        s.bytes_moved += rep.bytes_moved;
        s.map_pages_moved += rep.map_pages_moved;
        s.died_while_cleaning += rep.died_while_cleaning;
        Ok(rep)
    }
}

/// A victim a pass may take: its live blocks, its live map pages, the
/// bytes its moves write, and its cost (bytes, new map pages) in the pass:
/// after the victims before it in the policy's order (pages they dirty are
/// not counted again), or alone when it is cleaned alone.
struct Victim {
    seg: SegmentId,
    found: Vec<Move>,
    map_pages: Vec<u64>,
    data: i64,
    cost: (i64, usize),
}

/// The background cleaner thread and its stop signal.
pub(crate) struct Background {
    signal: Arc<(Mutex<bool>, Condvar)>,
    handle: Option<JoinHandle<()>>,
}

impl Background {
    pub fn start(core: Arc<Engine>) -> Background {
        let signal = Arc::new((Mutex::new(false), Condvar::new()));
        let sig = signal.clone();
        let handle = std::thread::Builder::new()
            .name("ldfs-cleaner".into())
            .spawn(move || background_loop(&core, &sig))
            .expect("spawn cleaner thread");
        Background {
            signal,
            handle: Some(handle),
        }
    }

    /// Asks the thread to stop and waits for it (a pass in progress ends first).
    pub fn stop(&mut self) {
        *self.signal.0.lock().expect("cleaner signal poisoned") = true;
        self.signal.1.notify_all();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        self.stop();
    }
}

fn background_loop(core: &Engine, signal: &(Mutex<bool>, Condvar)) {
    let idle = Duration::from_millis(core.options().cleaner.idle_ms.max(1));
    let mut last = core.activity.load(std::sync::atomic::Ordering::Relaxed);
    let mut pause = idle;
    loop {
        {
            let stop = signal.0.lock().expect("cleaner signal poisoned");
            let (stop, _) = signal
                .1
                .wait_timeout_while(stop, pause, |s| !*s)
                .expect("cleaner signal poisoned");
            if *stop {
                return;
            }
        }
        pause = idle;
        let now = core.activity.load(std::sync::atomic::Ordering::Relaxed);
        let quiet = now == last;
        last = now;
        let (clean, releasable) = core.clean_segment_counts();
        let urgent = clean < core.start_watermark();
        if !(urgent || (quiet && clean + releasable < core.stop_watermark())) {
            continue;
        }
        match core.clean_step(true) {
            // Freed something: go on without sleeping (the next round
            // checks idleness and the watermarks again).
            Ok(rep) if rep.progress() => pause = Duration::from_millis(1),
            Ok(_) => {}
            Err(LdError::ReadOnly(_)) => return,
            Err(e) => {
                eprintln!("ldfs: background cleaner: {e}");
                pause = idle * 20;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{Device, MemoryDevice};
    use crate::ld::{ListHints, ListId, LogicalDisk};
    use crate::lld::layout::MkfsOptions;
    use crate::lld::recovery::Verify;
    use crate::lld::{Lld, LldOptions};

    fn block(i: u64, len: usize) -> Vec<u8> {
        (0..len).map(|j| (i as usize * 31 + j) as u8).collect()
    }

    /// 8 MiB devices of 64 segments of 128 KiB, 4 reserved.
    fn small_mkfs() -> MkfsOptions {
        MkfsOptions {
            segment_bytes: 128 << 10,
            max_block_bytes: 16 << 10,
            reserved_segments: Some(4),
            fs_id: 9,
            max_bytes: None,
            kept_pages: 0,
        }
    }

    #[test]
    fn the_log_clock_answers_where_the_head_was_a_span_ago() {
        // 16 segments: a span of 12, a sample per segment.
        let mut c = LogClock::new(16, 0, 1);
        assert_eq!((c.span, c.every), (12, 1));
        // Not enough log written since the clock started: nothing is cold.
        assert_eq!(c.cold_before(0), 0);
        for e in 1..=11 {
            c.note(e, 10 * e);
            assert_eq!(c.cold_before(e), 0);
        }
        // 12 in, 12 back is where the clock started.
        c.note(12, 120);
        assert_eq!(c.cold_before(12), 1);
        c.note(13, 130);
        assert_eq!(c.cold_before(13), 10);
        // Samples older than needed are dropped.
        for e in 14..=40 {
            c.note(e, 10 * e);
        }
        assert_eq!(c.cold_before(40), 280);
        assert_eq!(c.samples.len(), 13, "{:?}", c.samples);
        // Seeded from ages: the 12th youngest of 20 until a span is run.
        let ages: Vec<u64> = (0..20).map(|i| 1000 + 7 * i).collect();
        let mut c = LogClock::new(16, 5, 2000).seeded(ages);
        assert_eq!(c.cold_before(5), 1000 + 7 * 7);
        for e in 6..=16 {
            c.note(e, 2000 + e);
            assert_eq!(c.cold_before(e), 1049);
        }
        c.note(17, 2017);
        assert_eq!(c.cold_before(17), 2000);
        // Too few segments with data to estimate: nothing is cold.
        assert_eq!(
            LogClock::new(16, 0, 1).seeded(vec![5; 12]).cold_before(0),
            0
        );
        // A large device keeps about 1,024 samples, one every `every`
        // segments, and answers within `every` segments.
        let mut c = LogClock::new(1 << 20, 0, 0);
        assert_eq!(c.every, 768);
        for e in 1..=2_000_000u64 {
            c.note(e, 3 * e);
        }
        assert!(c.samples.len() <= 1026, "{}", c.samples.len());
        let exact = 3 * (2_000_000 - c.span);
        let got = c.cold_before(2_000_000);
        assert!(
            got <= exact && exact - got <= 3 * c.every,
            "{got} vs {exact}"
        );
    }

    /// After an open, before the clock has run a span, cold is estimated
    /// from the segments' ages: the oldest quarter of a full log is cold.
    #[test]
    fn a_reopened_engine_knows_cold_segments_at_once() {
        let dev: Arc<dyn Device> = Arc::new(MemoryDevice::new(8 << 20));
        let mk = small_mkfs();
        // Live data in more than three quarters of the segments.
        let opts = || LldOptions {
            cleaner: CleanerOptions {
                max_live_percent: 100,
                ..Default::default()
            },
            ..Default::default()
        };
        let lld = Lld::create(dev.clone(), &mk, opts()).unwrap();
        assert_eq!(lld.cold_before(), 0, "a fresh log has no history");
        let l = lld.create_list(None, ListHints::default()).unwrap();
        let segments = lld.geometry().segment_count as u64;
        let mut i = 0;
        while lld.log_clock().0 < segments * 3 / 4 + 4 {
            lld.write(None, l, i, &block(i, 6000)).unwrap();
            i += 1;
        }
        lld.close().unwrap();
        drop(lld);
        let lld = Lld::open(dev, opts()).unwrap();
        let mut ages: Vec<u64> = lld
            .segment_usage()
            .iter()
            .filter(|(_, u)| u.state == SegmentState::Dirty)
            .map(|(_, u)| u.last_seq)
            .collect();
        ages.sort_unstable_by(|a, b| b.cmp(a));
        let span = (segments * 3 / 4) as usize;
        assert!(ages.len() > span, "{} dirty segments", ages.len());
        assert_eq!(lld.cold_before(), ages[span]);
        assert!(lld.cold_before() > 0);
    }

    /// Two victims, one written long ago (cold) and one just now (hot):
    /// the hot one's survivors go first although the cold one's keys sort
    /// lower, so the two never share a stretch of log.
    #[test]
    fn survivors_of_hot_victims_are_written_apart_from_cold_ones() {
        let dev: Arc<dyn Device> = Arc::new(MemoryDevice::new(8 << 20));
        let mk = small_mkfs();
        // No foreground cleaning: only the pass below may move blocks.
        let opts = LldOptions {
            cleaner: CleanerOptions {
                start_clean_segments: Some(0),
                ..Default::default()
            },
            ..Default::default()
        };
        let lld = Lld::create(dev.clone(), &mk, opts).unwrap();
        let segments = lld.geometry().segment_count as u64;
        let cold = lld.create_list(None, ListHints::default()).unwrap();
        let churn = lld.create_list(None, ListHints::default()).unwrap();
        let hot = lld.create_list(None, ListHints::default()).unwrap();
        let seg_of = |l: ListId, i: u64| {
            let e = lld.map_entry(Key::new(l, i)).unwrap().unwrap();
            lld.geometry().segment_of(e.offset()).unwrap()
        };
        // Fills most of one segment with `l`'s blocks 0..20 and keeps three.
        let sparse_segment = |l: ListId| {
            for i in 0..20 {
                lld.write(None, l, i, &block(i, 5000)).unwrap();
            }
            for i in 3..20 {
                lld.delete(None, l, i).unwrap();
            }
        };
        // Overwrites that leave nothing live behind (flushed, or the open
        // partial would absorb them) until the head has entered `segments`.
        let mut n = 0;
        let mut churn_until = |segments: u64| {
            while lld.log_clock().0 < segments {
                lld.write(None, churn, n % 8, &block(n, 6000)).unwrap();
                n += 1;
                if n % 8 == 0 {
                    lld.flush().unwrap();
                }
            }
        };
        sparse_segment(cold);
        // More log than the span (3/4 of the segments).
        churn_until(2 + segments);
        for i in 0..8 {
            lld.delete(None, churn, i).unwrap();
        }
        sparse_segment(hot);
        // Move the head on, so the hot segment is Dirty, and leave it
        // sparse (a pass leaves a victim that would cost more than it
        // frees).
        for i in 0..30 {
            lld.write(None, churn, 100 + i, &block(i, 6000)).unwrap();
        }
        lld.delete_range(None, churn, 100..130).unwrap();
        lld.checkpoint_now().unwrap();
        let (cold_seg, hot_seg) = (seg_of(cold, 0), seg_of(hot, 0));
        assert_ne!(cold_seg, hot_seg);
        let rep = lld.clean(PolicyKind::Greedy, 2).unwrap();
        let mut victims = rep.victims.clone();
        victims.sort();
        let mut want = vec![cold_seg, hot_seg];
        want.sort();
        assert_eq!(victims, want, "{rep:?}");
        // A block's place in the log: its partial's sequence number and
        // its record's position in the summary.
        let log_position = |l: ListId, i: u64| {
            let key = Key::new(l, i);
            let addr = lld.map_entry(key).unwrap().unwrap().offset();
            let seg = lld.geometry().segment_of(addr).unwrap();
            let partials =
                crate::lld::recovery::scan_segment(&*dev, &lld.geometry(), seg, Verify::Summary)
                    .unwrap();
            partials
                .iter()
                .find_map(|p| {
                    p.records
                        .iter()
                        .position(|r| {
                            matches!(r, Record::Write { key: k, data_off, .. }
                            if *k == key && p.data_base + *data_off as u64 == addr)
                        })
                        .map(|n| (p.header.seq, n))
                })
                .unwrap_or_else(|| panic!("no record for {key:?} at {addr}"))
        };
        let hot_last = (0..3).map(|i| log_position(hot, i)).max().unwrap();
        let cold_first = (0..3).map(|i| log_position(cold, i)).min().unwrap();
        assert!(
            hot_last < cold_first,
            "hot survivors end at {hot_last:?}, cold ones start at {cold_first:?}"
        );
        for l in [cold, hot] {
            for i in 0..3 {
                assert_eq!(lld.read(l, i).unwrap().unwrap(), block(i, 5000));
            }
        }
    }

    /// The pass's steps one by one, with a delete and an overwrite between
    /// deciding liveness and moving: neither block may come back.
    #[test]
    fn blocks_that_die_between_liveness_and_move_stay_dead() {
        let dev: Arc<dyn Device> = Arc::new(MemoryDevice::new(8 << 20));
        let mk = small_mkfs();
        let lld = Lld::create(dev.clone(), &mk, LldOptions::default()).unwrap();
        let l = lld.create_list(None, ListHints::default()).unwrap();
        for i in 0..20 {
            lld.write(None, l, i, &block(i, 5000)).unwrap();
        }
        lld.checkpoint_now().unwrap();
        // Kill a few so the segment is a candidate.
        for i in 10..14 {
            lld.delete(None, l, i).unwrap();
        }
        lld.checkpoint_now().unwrap();
        let e0 = lld.map_entry(Key::new(l, 0)).unwrap().unwrap();
        let seg = lld.geometry().segment_of(e0.offset()).unwrap();
        let geo = lld.geometry();
        let buf = lld.read_segment(seg).unwrap();
        let contents = scan_buffer(&geo, seg, &buf);
        assert!(contents.blocks.len() >= 20);
        let live = lld.live_entries(&contents.blocks).unwrap();
        let base = geo.page_addr(seg, 0);
        let moves: Vec<Move> = contents
            .blocks
            .iter()
            .zip(live)
            .filter_map(|((k, a), e)| {
                let e = e?;
                let s = (a - base) as usize;
                Some(Move {
                    key: *k,
                    expected: e,
                    stored: buf[s..s + e.len as usize].to_vec(),
                    age: 1,
                    recompressed: None,
                })
            })
            .collect();
        assert_eq!(
            moves.len(),
            17,
            "20 written, 4 deleted, and the list's hints"
        );
        // Block 1 dies, block 2 is replaced, after the cleaner decided.
        lld.delete(None, l, 1).unwrap();
        lld.write(None, l, 2, b"new").unwrap();
        let out = lld.relocate_batch(moves).unwrap();
        assert_eq!((out.moved, out.stale), (15, 2));
        assert!(lld.checkpoint_when_quiet(Duration::ZERO).unwrap());
        assert_eq!(
            lld.segment_usage()[seg.0 as usize].1.state,
            SegmentState::Clean
        );
        let check = |lld: &Lld| {
            assert_eq!(lld.read(l, 1).unwrap(), None);
            assert_eq!(lld.read(l, 2).unwrap().unwrap(), b"new");
            for i in (0..20).filter(|i| ![1, 2, 10, 11, 12, 13].contains(i)) {
                assert_eq!(lld.read(l, i).unwrap().unwrap(), block(i, 5000));
            }
            assert_eq!(lld.read(l, 11).unwrap(), None);
            assert_eq!(lld.accounting_drift(), 0);
        };
        check(&lld);
        lld.close().unwrap();
        drop(lld);
        check(&Lld::open(dev, LldOptions::default()).unwrap());
    }

    /// A block written by an open ARU is not moved (the move, outside the
    /// ARU, would commit it early), and the checkpoint waits for the ARU.
    #[test]
    fn open_aru_blocks_stay_and_the_checkpoint_waits() {
        let dev: Arc<dyn Device> = Arc::new(MemoryDevice::new(8 << 20));
        let mk = small_mkfs();
        let lld = Lld::create(dev, &mk, LldOptions::default()).unwrap();
        let l = lld.create_list(None, ListHints::default()).unwrap();
        let aru = lld.begin_aru().unwrap();
        lld.write(Some(aru), l, 0, &block(0, 6000)).unwrap();
        for i in 1..10 {
            lld.write(None, l, i, &block(i, 6000)).unwrap();
        }
        lld.flush().unwrap();
        // Fill the segment's neighbours so it is left behind as Dirty.
        for i in 100..160 {
            lld.write(None, l, i, &block(i, 6000)).unwrap();
        }
        for i in 5..10 {
            lld.delete(None, l, i).unwrap();
        }
        lld.flush().unwrap();
        let seg = lld
            .geometry()
            .segment_of(lld.map_entry(Key::new(l, 0)).unwrap().unwrap().offset())
            .unwrap();
        let rep = lld.clean(PolicyKind::Greedy, 64).unwrap();
        assert!(rep.victims.contains(&seg), "{rep:?}");
        assert!(!rep.checkpointed, "checkpointed with an ARU open");
        assert_eq!(lld.segment_usage()[seg.0 as usize].1.live_bytes, 6000);
        lld.end_aru(aru).unwrap();
        let rep = lld.clean(PolicyKind::Greedy, 64).unwrap();
        assert!(rep.checkpointed);
        assert_eq!(
            lld.segment_usage()[seg.0 as usize].1.state,
            SegmentState::Clean
        );
        assert_eq!(lld.read(l, 0).unwrap().unwrap(), block(0, 6000));
    }
}
