//! The segment usage table: per segment, its state, live bytes and age
//! (BSD-LFS 3.2 "segment usage table"; the cleaner's input).
//!
//! States and the only legal transitions (asserted):
//!
//! ```text
//! Clean --choose as next--> Next --log enters--> Active --log leaves--> Dirty
//! Dirty --live bytes 0 at a checkpoint, made Clean once that checkpoint is durable--> Clean
//! ```
//!
//! A segment is reused only after the checkpoint that stops referencing it is
//! durable (STYLE 11): nothing moves Dirty to Clean except `Usage::release`,
//! which the engine calls after the checkpoint's flush. A segment pinned by
//! a kept snapshot (`pins`, docs/DESIGN.md "Snapshots") is never released
//! and never a cleaner candidate: its bytes are that snapshot's tree.

use super::layout::USAGE_ENTRY_BYTES;
use super::types::SegmentId;
use crate::ld::{CorruptReason, Corruption};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SegmentState {
    /// Holds nothing anyone needs; may be chosen as the next log segment.
    Clean = 0,
    /// Chosen to follow the active segment; summaries point at it.
    Next = 1,
    /// The log head is in it.
    Active = 2,
    /// Written; may hold live blocks.
    Dirty = 3,
}

impl SegmentState {
    fn from_u8(v: u8) -> Option<SegmentState> {
        Some(match v {
            0 => SegmentState::Clean,
            1 => SegmentState::Next,
            2 => SegmentState::Active,
            3 => SegmentState::Dirty,
            _ => return None,
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentUsage {
    pub state: SegmentState,
    /// Bytes of live blocks and map pages in the segment.
    pub live_bytes: u32,
    /// Sequence number of the last partial segment written to it: its age.
    pub last_seq: u64,
    /// Pin bits of the kept snapshots whose trees need this segment
    /// (bit `b`: the snapshot with pin bit `b`); 0 for most segments.
    pub pins: u32,
}

/// Pin bits available (the usage entry's three spare bytes).
pub const PIN_BITS: u32 = 24;

fn is_releasable(state: SegmentState, live_bytes: u32, pins: u32) -> bool {
    state == SegmentState::Dirty && live_bytes == 0 && pins == 0
}

#[derive(Debug)]
pub struct Usage {
    segs: Vec<SegmentUsage>,
    clean: u32,
    /// Sum of every segment's live bytes (kept so admission is O(1)).
    live_total: u64,
    /// Dirty segments with no live bytes (kept so the check is O(1)).
    releasable: u32,
    segment_bytes: u32,
    /// Times live-byte accounting would have gone below zero or above the
    /// segment size. Always 0 unless an image lies; fsck and tests check it.
    drift: u64,
    /// Pinned segments, and the live bytes in them (history's space is
    /// the rest of them: `history_bytes`, O(1) for admission).
    pinned: u32,
    pinned_live: u64,
    /// Segments at or past it are never chosen for the log and not counted
    /// as clean (`clean` counts only those below it): a resize's fence
    /// (docs/DESIGN.md "Resize"). Equal to the length but while one runs.
    limit: u32,
}

impl Usage {
    pub fn new(segment_count: u32, segment_bytes: u32) -> Usage {
        let e = SegmentUsage {
            state: SegmentState::Clean,
            live_bytes: 0,
            last_seq: 0,
            pins: 0,
        };
        Usage {
            segs: vec![e; segment_count as usize],
            clean: segment_count,
            live_total: 0,
            releasable: 0,
            segment_bytes,
            drift: 0,
            pinned: 0,
            pinned_live: 0,
            limit: segment_count,
        }
    }

    /// Fences the segments at and past `limit` off (a shrink empties them,
    /// a grow adds them before its checkpoint commits): the log never
    /// chooses them and they are not counted clean. `limit == len()` lifts
    /// the fence. A Next segment past the limit must be given back first
    /// (`unchoose`).
    pub fn set_limit(&mut self, limit: u32) {
        assert!(limit <= self.len(), "fence past the table");
        self.limit = limit;
        self.clean = self.segs[..limit as usize]
            .iter()
            .filter(|u| u.state == SegmentState::Clean)
            .count() as u32;
        assert!(
            self.segs[limit as usize..]
                .iter()
                .all(|u| u.state != SegmentState::Next),
            "a Next segment past the fence"
        );
    }

    /// The fence (`set_limit`); `len()` when there is none.
    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// Appends Clean segments up to `count` (a grow), fenced off until
    /// `set_limit(len())`: the checkpoint that records them must be durable
    /// before the log may enter one.
    pub fn grow(&mut self, count: u32) {
        assert!(count >= self.len(), "grow to fewer segments");
        let e = SegmentUsage {
            state: SegmentState::Clean,
            live_bytes: 0,
            last_seq: 0,
            pins: 0,
        };
        self.segs.resize(count as usize, e);
    }

    /// The table's first `count` segments (a shrink's new table). Every
    /// segment cut off must be Clean, unpinned, and so hold no live byte.
    pub fn truncated(&self, count: u32) -> Usage {
        assert!(count <= self.len(), "truncate to more segments");
        assert!(
            self.segs[count as usize..]
                .iter()
                .all(|u| u.state == SegmentState::Clean && u.pins == 0 && u.live_bytes == 0),
            "a shrink cuts off a segment in use"
        );
        let mut t = Usage::new(count, self.segment_bytes);
        for (s, u) in self.iter().take(count as usize) {
            t.set(s, u);
        }
        t.drift = self.drift;
        t
    }

    /// Gives a Next segment back (Clean): a shrink's fence fell on the
    /// segment the log had chosen; the engine chooses another below it.
    pub fn unchoose(&mut self, s: SegmentId) {
        let u = &mut self.segs[s.0 as usize];
        assert_eq!(u.state, SegmentState::Next, "segment {} is not Next", s.0);
        u.state = SegmentState::Clean;
        if s.0 < self.limit {
            self.clean += 1;
        }
    }

    pub fn len(&self) -> u32 {
        self.segs.len() as u32
    }
    pub fn is_empty(&self) -> bool {
        self.segs.is_empty()
    }
    pub fn get(&self, s: SegmentId) -> SegmentUsage {
        self.segs[s.0 as usize]
    }
    pub fn iter(&self) -> impl Iterator<Item = (SegmentId, SegmentUsage)> + '_ {
        self.segs
            .iter()
            .enumerate()
            .map(|(i, u)| (SegmentId(i as u32), *u))
    }
    pub fn clean_count(&self) -> u32 {
        self.clean
    }
    pub fn live_bytes_total(&self) -> u64 {
        debug_assert_eq!(
            self.live_total,
            self.segs.iter().map(|u| u.live_bytes as u64).sum::<u64>()
        );
        self.live_total
    }
    pub fn segment_bytes(&self) -> u32 {
        self.segment_bytes
    }

    /// Moves `s` to `to`, asserting the transition is one of the legal ones.
    pub fn transition(&mut self, s: SegmentId, to: SegmentState) {
        use SegmentState::*;
        let u = &mut self.segs[s.0 as usize];
        let ok = matches!(
            (u.state, to),
            (Clean, Next) | (Next, Active) | (Active, Dirty) | (Dirty, Clean) | (Clean, Active)
        );
        assert!(
            ok,
            "illegal segment transition {:?} -> {:?} for segment {}",
            u.state, to, s.0
        );
        let counted = s.0 < self.limit;
        if u.state == Clean && counted {
            self.clean -= 1;
        }
        self.releasable -= is_releasable(u.state, u.live_bytes, u.pins) as u32;
        self.releasable += is_releasable(to, u.live_bytes, u.pins) as u32;
        if to == Next {
            // A new life: its age comes from what is written into it now.
            u.last_seq = 0;
        }
        if to == Clean {
            assert_eq!(
                u.live_bytes, 0,
                "segment {} made clean with live bytes",
                s.0
            );
            assert_eq!(u.pins, 0, "segment {} made clean while pinned", s.0);
            self.clean += counted as u32;
        }
        u.state = to;
    }

    /// A clean segment other than those in `avoid`, lowest number first
    /// after `after` (wrapping), so the log sweeps the device.
    pub fn pick_clean(&self, after: SegmentId) -> Option<SegmentId> {
        let n = self.limit;
        (1..=n)
            .map(|d| (after.0 + d) % n)
            .find(|&i| self.segs[i as usize].state == SegmentState::Clean)
            .map(SegmentId)
    }

    pub fn add_live(&mut self, s: SegmentId, bytes: u32, seq: u64) {
        let u = &mut self.segs[s.0 as usize];
        assert!(
            matches!(u.state, SegmentState::Active),
            "live bytes added to {:?} segment {}",
            u.state,
            s.0
        );
        self.count_live(s, bytes);
        let u = &mut self.segs[s.0 as usize];
        u.last_seq = u.last_seq.max(seq);
    }

    /// Adds `bytes` to a segment's live count (capped at the segment's
    /// size; going past it is counted as drift), keeping the totals.
    fn count_live(&mut self, s: SegmentId, bytes: u32) {
        let u = &mut self.segs[s.0 as usize];
        let before = u.live_bytes;
        match u.live_bytes.checked_add(bytes) {
            Some(v) if v <= self.segment_bytes => u.live_bytes = v,
            _ => {
                self.drift += 1;
                u.live_bytes = self.segment_bytes;
            }
        }
        self.live_total = self.live_total + u.live_bytes as u64 - before as u64;
        if u.pins != 0 {
            self.pinned_live = self.pinned_live + u.live_bytes as u64 - before as u64;
        }
        self.releasable -= is_releasable(u.state, before, u.pins) as u32;
        self.releasable += is_releasable(u.state, u.live_bytes, u.pins) as u32;
    }

    /// Counts a block again whose removal was taken back (a delete or an
    /// overwrite by an aborted ARU). Its segment still holds it: only a
    /// checkpoint releases segments, and none is written while an ARU that
    /// logged something is open. The block keeps its age.
    pub fn restore_live(&mut self, s: SegmentId, bytes: u32) {
        let u = &mut self.segs[s.0 as usize];
        assert!(
            matches!(u.state, SegmentState::Active | SegmentState::Dirty),
            "live bytes restored to {:?} segment {}",
            u.state,
            s.0
        );
        self.count_live(s, bytes);
    }

    /// Whether `transition(s, to)` is legal now (recovery checks before
    /// trusting a summary's segment pointers).
    pub fn can_transition(&self, s: SegmentId, to: SegmentState) -> bool {
        use SegmentState::*;
        let Some(u) = self.segs.get(s.0 as usize) else {
            return false;
        };
        matches!(
            (u.state, to),
            (Clean, Next) | (Next, Active) | (Active, Dirty) | (Clean, Active)
        ) || (u.state == Dirty && to == Clean && u.live_bytes == 0 && u.pins == 0)
    }

    pub fn drift(&self) -> u64 {
        self.drift
    }

    pub fn touch(&mut self, s: SegmentId, seq: u64) {
        let u = &mut self.segs[s.0 as usize];
        u.last_seq = u.last_seq.max(seq);
    }

    /// Subtracts live bytes. Going below zero means the accounting and the
    /// map disagree (a lying image); it is counted in `drift`, not a panic,
    /// because the numbers came from a device.
    pub fn sub_live(&mut self, s: SegmentId, bytes: u32) {
        let u = &mut self.segs[s.0 as usize];
        let before = u.live_bytes;
        match u.live_bytes.checked_sub(bytes) {
            Some(v) => u.live_bytes = v,
            None => {
                self.drift += 1;
                u.live_bytes = 0;
            }
        }
        self.live_total -= (before - u.live_bytes) as u64;
        if u.pins != 0 {
            self.pinned_live -= (before - u.live_bytes) as u64;
        }
        self.releasable -= is_releasable(u.state, before, u.pins) as u32;
        self.releasable += is_releasable(u.state, u.live_bytes, u.pins) as u32;
    }

    /// Dirty segments with no live bytes: free once the next checkpoint is durable.
    pub fn releasable(&self) -> Vec<SegmentId> {
        let v: Vec<SegmentId> = self
            .iter()
            .filter(|(_, u)| is_releasable(u.state, u.live_bytes, u.pins))
            .map(|(s, _)| s)
            .collect();
        assert_eq!(
            v.len(),
            self.releasable as usize,
            "releasable count drifted"
        );
        v
    }

    /// How many segments `releasable` would return (O(1)).
    pub fn releasable_count(&self) -> u32 {
        self.releasable
    }

    /// Gives pin bit `bit` to every segment holding live bytes now: a
    /// snapshot taken at this point needs exactly those (the live counts
    /// include the map's own pages). Returns how many were pinned.
    pub fn pin_live(&mut self, bit: u32) -> u32 {
        assert!(bit < PIN_BITS, "pin bit {bit} out of range");
        let mut n = 0;
        for i in 0..self.segs.len() {
            let u = self.segs[i];
            if u.live_bytes == 0 {
                continue;
            }
            assert!(u.pins & (1 << bit) == 0, "pin bit {bit} already in use");
            assert!(
                u.state != SegmentState::Clean,
                "live bytes in a Clean segment"
            );
            self.set(
                SegmentId(i as u32),
                SegmentUsage {
                    pins: u.pins | 1 << bit,
                    ..u
                },
            );
            n += 1;
        }
        n
    }

    /// Gives pin bit `bit`, which a generation of protected checkpoints
    /// already holds, to every segment holding live bytes now that lacks
    /// it: the tree of this checkpoint joins the generation. Returns how
    /// many segments gained it.
    pub fn pin_live_shared(&mut self, bit: u32) -> u32 {
        assert!(bit < PIN_BITS, "pin bit {bit} out of range");
        let mut n = 0;
        for i in 0..self.segs.len() {
            let u = self.segs[i];
            if u.live_bytes == 0 || u.pins & (1 << bit) != 0 {
                continue;
            }
            assert!(
                u.state != SegmentState::Clean,
                "live bytes in a Clean segment"
            );
            self.set(
                SegmentId(i as u32),
                SegmentUsage {
                    pins: u.pins | 1 << bit,
                    ..u
                },
            );
            n += 1;
        }
        n
    }

    /// Takes pin bit `bit` off every segment (a deleted snapshot); the
    /// segments left with no pin and no live bytes become releasable.
    pub fn unpin(&mut self, bit: u32) {
        assert!(bit < PIN_BITS, "pin bit {bit} out of range");
        for i in 0..self.segs.len() {
            let u = self.segs[i];
            if u.pins & (1 << bit) != 0 {
                self.set(
                    SegmentId(i as u32),
                    SegmentUsage {
                        pins: u.pins & !(1 << bit),
                        ..u
                    },
                );
            }
        }
    }

    /// Bytes of pinned segments that the live tree does not use: what
    /// history alone holds.
    pub fn history_bytes(&self) -> u64 {
        self.pinned as u64 * self.segment_bytes as u64 - self.pinned_live
    }

    /// Segments pinned by at least one snapshot.
    pub fn pinned_count(&self) -> u32 {
        self.pinned
    }

    /// Bytes only the snapshot with pin bit `bit` holds: its segments no
    /// other snapshot pins, less their live bytes (what deleting it frees).
    pub fn held_only_by(&self, bit: u32) -> u64 {
        self.segs
            .iter()
            .filter(|u| u.pins == 1 << bit)
            .map(|u| (self.segment_bytes - u.live_bytes) as u64)
            .sum()
    }

    /// Bytes of the segments only the snapshots with pin bits in `mask`
    /// pin and that hold no live bytes: what deleting all of them frees
    /// without leaving live segments to pin again.
    pub fn held_empty_within(&self, mask: u32) -> u64 {
        self.segs
            .iter()
            .filter(|u| u.pins != 0 && u.pins & !mask == 0 && u.live_bytes == 0)
            .map(|_| self.segment_bytes as u64)
            .sum()
    }

    /// Bytes only the snapshots with pin bits in `mask` hold together:
    /// segments pinned by none outside it, less their live bytes (what
    /// deleting all of them frees).
    pub fn held_only_within(&self, mask: u32) -> u64 {
        self.segs
            .iter()
            .filter(|u| u.pins != 0 && u.pins & !mask == 0)
            .map(|u| (self.segment_bytes - u.live_bytes) as u64)
            .sum()
    }

    /// The union of the pin bits in use.
    pub fn pin_mask(&self) -> u32 {
        self.segs.iter().fold(0, |m, u| m | u.pins)
    }

    /// Marks `segs` clean. Call only after a checkpoint that no longer
    /// references them is durable.
    pub fn release(&mut self, segs: &[SegmentId]) {
        for &s in segs {
            self.transition(s, SegmentState::Clean);
        }
    }

    /// Encodes the table as a checkpoint stores it; segments in
    /// `released` are recorded as Clean (they are, once the checkpoint holds).
    pub fn encode(&self, released: &[SegmentId], out: &mut Vec<u8>) {
        let mut rel = released.to_vec();
        rel.sort_unstable();
        for (s, u) in self.iter() {
            let state = if rel.binary_search(&s).is_ok() {
                SegmentState::Clean
            } else {
                u.state
            };
            let mut e = [0u8; USAGE_ENTRY_BYTES];
            e[0..4].copy_from_slice(&u.live_bytes.to_le_bytes());
            e[4] = state as u8;
            e[5..8].copy_from_slice(&u.pins.to_le_bytes()[..3]);
            e[8..16].copy_from_slice(&u.last_seq.to_le_bytes());
            out.extend_from_slice(&e);
        }
    }

    /// Decodes `count` entries; bounds each.
    pub fn decode(
        b: &[u8],
        count: u32,
        segment_bytes: u32,
        offset: u64,
    ) -> Result<Usage, Corruption> {
        let mut segs = Vec::with_capacity(count as usize);
        let mut clean = 0;
        let mut live_total = 0u64;
        let mut releasable = 0u32;
        let (mut pinned, mut pinned_live) = (0u32, 0u64);
        for i in 0..count as usize {
            let e = b
                .get(i * USAGE_ENTRY_BYTES..(i + 1) * USAGE_ENTRY_BYTES)
                .ok_or(Corruption {
                    what: "usage table",
                    offset,
                    reason: CorruptReason::OutOfBounds {
                        field: "entries",
                        value: count as u64,
                        limit: (b.len() / USAGE_ENTRY_BYTES) as u64,
                    },
                })?;
            let live_bytes = u32::from_le_bytes(e[0..4].try_into().unwrap());
            let state = SegmentState::from_u8(e[4]);
            let last_seq = u64::from_le_bytes(e[8..16].try_into().unwrap());
            let pins = u32::from_le_bytes([e[5], e[6], e[7], 0]);
            let state = match state {
                Some(s)
                    if live_bytes <= segment_bytes
                        && (s != SegmentState::Clean || live_bytes == 0)
                        && (pins == 0
                            || matches!(s, SegmentState::Active | SegmentState::Dirty)) =>
                {
                    s
                }
                _ => {
                    return Err(Corruption {
                        what: "usage table",
                        offset: offset + (i * USAGE_ENTRY_BYTES) as u64,
                        reason: CorruptReason::Inconsistent(format!(
                            "segment {i}: state {} with {live_bytes} live bytes, pins {pins:#x}",
                            e[4]
                        )),
                    })
                }
            };
            if state == SegmentState::Clean {
                clean += 1;
            }
            live_total += live_bytes as u64;
            releasable += is_releasable(state, live_bytes, pins) as u32;
            if pins != 0 {
                pinned += 1;
                pinned_live += live_bytes as u64;
            }
            segs.push(SegmentUsage {
                state,
                live_bytes,
                last_seq,
                pins,
            });
        }
        Ok(Usage {
            segs,
            clean,
            live_total,
            releasable,
            segment_bytes,
            drift: 0,
            pinned,
            pinned_live,
            limit: count,
        })
    }

    /// Replaces a segment's entry wholesale (recovery and rebuild).
    pub fn set(&mut self, s: SegmentId, u: SegmentUsage) {
        let old = self.segs[s.0 as usize];
        let counted = (s.0 < self.limit) as u32;
        if old.state == SegmentState::Clean {
            self.clean -= counted;
        }
        if u.state == SegmentState::Clean {
            self.clean += counted;
        }
        assert!(
            u.pins == 0 || matches!(u.state, SegmentState::Active | SegmentState::Dirty),
            "segment {} pinned in state {:?}",
            s.0,
            u.state
        );
        self.live_total = self.live_total - old.live_bytes as u64 + u.live_bytes as u64;
        if old.pins != 0 {
            self.pinned -= 1;
            self.pinned_live -= old.live_bytes as u64;
        }
        if u.pins != 0 {
            self.pinned += 1;
            self.pinned_live += u.live_bytes as u64;
        }
        self.releasable -= is_releasable(old.state, old.live_bytes, old.pins) as u32;
        self.releasable += is_releasable(u.state, u.live_bytes, u.pins) as u32;
        self.segs[s.0 as usize] = u;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transitions_and_roundtrip() {
        let mut u = Usage::new(4, 1 << 16);
        u.transition(SegmentId(1), SegmentState::Next);
        u.transition(SegmentId(1), SegmentState::Active);
        u.add_live(SegmentId(1), 100, 7);
        u.transition(SegmentId(1), SegmentState::Dirty);
        assert_eq!(u.clean_count(), 3);
        let mut b = Vec::new();
        u.encode(&[], &mut b);
        let v = Usage::decode(&b, 4, 1 << 16, 0).unwrap();
        assert_eq!(v.get(SegmentId(1)), u.get(SegmentId(1)));
        assert_eq!(v.clean_count(), 3);
        u.sub_live(SegmentId(1), 100);
        assert_eq!(u.releasable(), vec![SegmentId(1)]);
        u.release(&[SegmentId(1)]);
        assert_eq!(u.clean_count(), 4);
    }

    #[test]
    fn pins_hold_segments_and_count_as_history() {
        let seg = 1 << 16;
        let mut u = Usage::new(4, seg);
        for s in [1, 2] {
            u.transition(SegmentId(s), SegmentState::Next);
            u.transition(SegmentId(s), SegmentState::Active);
            u.add_live(SegmentId(s), 1000, 7);
            u.transition(SegmentId(s), SegmentState::Dirty);
        }
        assert_eq!(u.pin_live(0), 2);
        u.sub_live(SegmentId(1), 1000);
        u.sub_live(SegmentId(2), 400);
        assert!(u.releasable().is_empty(), "a pinned segment is released");
        assert_eq!(u.history_bytes(), 2 * seg as u64 - 600);
        assert_eq!(u.held_only_by(0), 2 * seg as u64 - 600);
        assert_eq!(u.held_only_within(1), 2 * seg as u64 - 600);
        assert_eq!(u.held_only_within(0), 0);
        // Only segment 1 is empty: deleting bit 0 frees it whole, while
        // segment 2's live bytes would be pinned again by a new snapshot.
        assert_eq!(u.held_empty_within(1), seg as u64);
        assert_eq!(u.held_empty_within(0), 0);
        // Encoded and decoded, the pins and the totals come back.
        let mut b = Vec::new();
        u.encode(&[], &mut b);
        let v = Usage::decode(&b, 4, seg, 0).unwrap();
        assert_eq!(v.get(SegmentId(1)).pins, 1);
        assert_eq!(v.history_bytes(), u.history_bytes());
        assert!(v.releasable().is_empty());
        assert_eq!(u.pin_live(5), 1, "only segment 2 still holds live bytes");
        assert_eq!(
            u.held_only_by(0),
            seg as u64,
            "segment 1 is pinned by bit 0 alone"
        );
        assert_eq!(
            u.held_only_within(1),
            seg as u64,
            "segment 2 is also bit 5's"
        );
        assert_eq!(u.held_only_within(1 | 1 << 5), 2 * seg as u64 - 600);
        u.unpin(0);
        assert_eq!(u.releasable(), vec![SegmentId(1)]);
        assert_eq!(u.history_bytes(), seg as u64 - 600);
        u.unpin(5);
        assert_eq!(u.history_bytes(), 0);
        assert_eq!(u.pinned_count(), 0);
        // A pinned Clean segment does not decode.
        let mut b = vec![0u8; 16];
        b[5] = 1;
        assert!(Usage::decode(&b, 1, seg, 0).is_err());
    }

    #[test]
    #[should_panic(expected = "illegal segment transition")]
    fn dirty_cannot_become_active() {
        let mut u = Usage::new(2, 1 << 16);
        u.transition(SegmentId(0), SegmentState::Next);
        u.transition(SegmentId(0), SegmentState::Active);
        u.transition(SegmentId(0), SegmentState::Dirty);
        u.transition(SegmentId(0), SegmentState::Active);
    }

    #[test]
    fn decode_rejects_bad_state_and_overfull() {
        let mut b = vec![0u8; 16];
        b[4] = 9;
        assert!(Usage::decode(&b, 1, 4096, 0).is_err());
        let mut b = vec![0u8; 16];
        b[0..4].copy_from_slice(&5000u32.to_le_bytes());
        b[4] = 3;
        assert!(Usage::decode(&b, 1, 4096, 0).is_err());
        assert!(Usage::decode(&b, 2, 1 << 20, 0).is_err());
    }
}
