//! Victim selection: pure functions of the segment usage table (STYLE 13).
//!
//! A policy sees a [`UsageSnapshot`] — every segment's state, live bytes and
//! age (the sequence number of the last partial segment written into it) —
//! and returns victims, best first. It never touches a device, so each one
//! is unit-tested on hand-made tables.
//!
//! Invariants every policy keeps (checked by `candidates` and the tests):
//! only Dirty segments are chosen; never one with no live bytes (a checkpoint
//! alone frees it) nor one so full that moving it frees less than a page,
//! nor one a kept snapshot pins (it is never released, so moving its live
//! blocks frees nothing: what only history holds is never moved at all);
//! no segment twice; the order is deterministic (ties go to the lower
//! segment number).

use std::fmt;
use std::str::FromStr;

use crate::lld::types::{SegmentId, PAGE_BYTES};
use crate::lld::usage::{SegmentState, SegmentUsage};

/// What a policy decides from.
#[derive(Clone, Debug)]
pub struct UsageSnapshot {
    pub segments: Vec<(SegmentId, SegmentUsage)>,
    pub segment_bytes: u32,
    /// The sequence number the next partial segment will get: "now".
    pub now_seq: u64,
    /// Segments fuller than this fraction are not candidates (1.0: any).
    pub max_utilization: f64,
}

/// A Dirty segment worth cleaning, with its utilization and age.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Candidate {
    pub seg: SegmentId,
    /// Live bytes / segment bytes, in (0, 1).
    pub utilization: f64,
    /// Partial segments written since this one was last written (>= 1).
    pub age: u64,
}

impl UsageSnapshot {
    /// Segments a policy may choose: Dirty, unpinned, some live bytes, and
    /// at least a page that cleaning would free.
    pub fn candidates(&self) -> Vec<Candidate> {
        let seg_bytes = self.segment_bytes as u64;
        self.segments
            .iter()
            .filter(|(_, u)| {
                u.state == SegmentState::Dirty
                    && u.pins == 0
                    && u.live_bytes > 0
                    && (u.live_bytes as u64) + (PAGE_BYTES as u64) <= seg_bytes
                    && u.live_bytes as f64 <= self.max_utilization * seg_bytes as f64
            })
            .map(|(s, u)| Candidate {
                seg: *s,
                utilization: u.live_bytes as f64 / seg_bytes as f64,
                age: self.now_seq.saturating_sub(u.last_seq).max(1),
            })
            .collect()
    }
}

/// A victim-selection policy.
pub trait Policy: Send + Sync + fmt::Debug {
    fn name(&self) -> &'static str;
    /// Up to `max` victims, best first.
    fn select(&self, table: &UsageSnapshot, max: usize) -> Vec<SegmentId>;
}

/// Sorts candidates by descending score, ties to the lower segment number,
/// and returns the first `max`.
fn best_by(mut c: Vec<Candidate>, max: usize, score: impl Fn(&Candidate) -> f64) -> Vec<SegmentId> {
    c.sort_by(|a, b| {
        score(b)
            .partial_cmp(&score(a))
            .unwrap_or(std::cmp::Ordering::Equal)
            .then(a.seg.cmp(&b.seg))
    });
    c.into_iter().take(max).map(|c| c.seg).collect()
}

/// Greedy: the least-utilized segments first (Sprite LFS's baseline).
#[derive(Clone, Copy, Debug, Default)]
pub struct Greedy;

impl Policy for Greedy {
    fn name(&self) -> &'static str {
        "greedy"
    }
    fn select(&self, t: &UsageSnapshot, max: usize) -> Vec<SegmentId> {
        best_by(t.candidates(), max, |c| -c.utilization)
    }
}

/// Cost-benefit (Rosenblum and Ousterhout; BSD-LFS 3.5): the highest
/// `(1 - u) * age / (1 + u)` first, so cold segments are cleaned at a higher
/// utilization than hot ones, which are left to die further.
#[derive(Clone, Copy, Debug, Default)]
pub struct CostBenefit;

pub fn cost_benefit_score(c: &Candidate) -> f64 {
    (1.0 - c.utilization) * c.age as f64 / (1.0 + c.utilization)
}

impl Policy for CostBenefit {
    fn name(&self) -> &'static str {
        "cost-benefit"
    }
    fn select(&self, t: &UsageSnapshot, max: usize) -> Vec<SegmentId> {
        best_by(t.candidates(), max, cost_benefit_score)
    }
}

/// Free-weighted cost-benefit: `(1 - u)^2 * age / (1 + u)`. Cost-benefit
/// with the free fraction counted twice, so a hot segment is taken once it
/// is nearly empty and a cold one only when a real share of it is free;
/// on ldfs's hot-and-cold figures (90% of writes to 10% of the data) it
/// moves clearly less than cost-benefit (`ldfs bench cleaner`), and it is
/// no worse on uniform overwrites.
#[derive(Clone, Copy, Debug, Default)]
pub struct FreeWeighted;

pub fn free_weighted_score(c: &Candidate) -> f64 {
    let free = 1.0 - c.utilization;
    free * free * c.age as f64 / (1.0 + c.utilization)
}

impl Policy for FreeWeighted {
    fn name(&self) -> &'static str {
        "free-weighted"
    }
    fn select(&self, t: &UsageSnapshot, max: usize) -> Vec<SegmentId> {
        best_by(t.candidates(), max, free_weighted_score)
    }
}

/// The policies by name (`-o cleaner=NAME`, `ldfs clean --policy NAME`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PolicyKind {
    Greedy,
    CostBenefit,
    #[default]
    FreeWeighted,
}

impl PolicyKind {
    pub const ALL: [PolicyKind; 3] = [
        PolicyKind::Greedy,
        PolicyKind::CostBenefit,
        PolicyKind::FreeWeighted,
    ];

    pub fn policy(self) -> &'static dyn Policy {
        match self {
            PolicyKind::Greedy => &Greedy,
            PolicyKind::CostBenefit => &CostBenefit,
            PolicyKind::FreeWeighted => &FreeWeighted,
        }
    }

    pub fn name(self) -> &'static str {
        self.policy().name()
    }
}

impl fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for PolicyKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        PolicyKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| {
                format!("unknown cleaner policy '{s}' (greedy, cost-benefit or free-weighted)")
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEG: u32 = 64 * PAGE_BYTES as u32;

    /// A table from (state, live fraction in percent, last seq) rows.
    fn table(rows: &[(SegmentState, u32, u64)], now_seq: u64) -> UsageSnapshot {
        UsageSnapshot {
            segments: rows
                .iter()
                .enumerate()
                .map(|(i, &(state, pct, last_seq))| {
                    (
                        SegmentId(i as u32),
                        SegmentUsage {
                            state,
                            live_bytes: (SEG as u64 * pct as u64 / 100) as u32,
                            last_seq,
                            pins: 0,
                        },
                    )
                })
                .collect(),
            segment_bytes: SEG,
            now_seq,
            max_utilization: 1.0,
        }
    }

    use SegmentState::*;

    #[test]
    fn only_dirty_segments_with_something_to_free_are_candidates() {
        let t = table(
            &[
                (Clean, 0, 0),
                (Active, 10, 5),
                (Next, 0, 0),
                (Dirty, 0, 3),   // a checkpoint frees it: not cleaning's job
                (Dirty, 100, 3), // nothing to gain
                (Dirty, 50, 3),
            ],
            10,
        );
        for k in PolicyKind::ALL {
            assert_eq!(k.policy().select(&t, 10), vec![SegmentId(5)], "{k}");
        }
        assert!(Greedy.select(&table(&[], 1), 4).is_empty());
    }

    #[test]
    fn pinned_segments_are_never_victims() {
        let mut t = table(&[(Dirty, 10, 1), (Dirty, 60, 2), (Dirty, 5, 1)], 10);
        t.segments[0].1.pins = 1;
        t.segments[2].1.pins = 1 << 23;
        for k in PolicyKind::ALL {
            assert_eq!(k.policy().select(&t, 10), vec![SegmentId(1)], "{k}");
        }
    }

    #[test]
    fn greedy_takes_the_emptiest_first_ties_by_number() {
        let t = table(
            &[
                (Dirty, 70, 1),
                (Dirty, 20, 90),
                (Dirty, 50, 2),
                (Dirty, 20, 3),
                (Dirty, 90, 1),
            ],
            100,
        );
        assert_eq!(
            Greedy.select(&t, 3),
            vec![SegmentId(1), SegmentId(3), SegmentId(2)]
        );
        assert_eq!(Greedy.select(&t, 0), vec![]);
    }

    #[test]
    fn cost_benefit_prefers_an_old_fuller_segment_to_a_young_emptier_one() {
        // Segment 0: 75% live, written 1000 partials ago (cold).
        // Segment 1: 30% live, written 10 partials ago (hot, still dying).
        // (1-.75)*1000/1.75 = 142.9 > (1-.3)*10/1.3 = 5.4
        let t = table(&[(Dirty, 75, 0), (Dirty, 30, 990)], 1000);
        assert_eq!(CostBenefit.select(&t, 2), vec![SegmentId(0), SegmentId(1)]);
        assert_eq!(Greedy.select(&t, 2), vec![SegmentId(1), SegmentId(0)]);
        // Same age: it is greedy.
        let t = table(&[(Dirty, 75, 500), (Dirty, 30, 500)], 1000);
        assert_eq!(CostBenefit.select(&t, 1), vec![SegmentId(1)]);
        let c = t.candidates();
        let u = c[1].utilization;
        assert!((u - 0.3).abs() < 1e-3);
        assert!((cost_benefit_score(&c[1]) - (1.0 - u) * 500.0 / (1.0 + u)).abs() < 1e-9);
    }

    #[test]
    fn free_weighted_waits_longer_than_cost_benefit_for_a_fuller_old_segment() {
        // Segment 0: 60% live, age 100. Segment 1: 20% live, age 30.
        // Cost-benefit: .4*100/1.6 = 25 > .8*30/1.2 = 20 -> segment 0 first.
        // Free-weighted: .16*100/1.6 = 10 < .64*30/1.2 = 16 -> segment 1 first.
        let t = table(&[(Dirty, 60, 0), (Dirty, 20, 70)], 100);
        assert_eq!(CostBenefit.select(&t, 2), vec![SegmentId(0), SegmentId(1)]);
        assert_eq!(FreeWeighted.select(&t, 2), vec![SegmentId(1), SegmentId(0)]);
        // Old enough, the fuller one wins under both.
        let t = table(&[(Dirty, 60, 0), (Dirty, 20, 90)], 100);
        assert_eq!(FreeWeighted.select(&t, 1), vec![SegmentId(0)]);
        let c = t.candidates();
        let u = c[1].utilization;
        assert!((free_weighted_score(&c[1]) - (1.0 - u).powi(2) * 10.0 / (1.0 + u)).abs() < 1e-9);
    }

    #[test]
    fn max_utilization_bounds_every_policy() {
        let mut t = table(&[(Dirty, 70, 0), (Dirty, 40, 50), (Dirty, 20, 99)], 100);
        t.max_utilization = 0.5;
        for k in PolicyKind::ALL {
            let mut v = k.policy().select(&t, 5);
            v.sort();
            assert_eq!(v, vec![SegmentId(1), SegmentId(2)], "{k}");
        }
    }

    #[test]
    fn names_round_trip() {
        for k in PolicyKind::ALL {
            assert_eq!(k.name().parse::<PolicyKind>().unwrap(), k);
        }
        assert!("lru".parse::<PolicyKind>().is_err());
    }

    #[test]
    fn selection_never_repeats_and_respects_max() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        for _ in 0..200 {
            let n = rng.gen_range(0..40);
            let rows: Vec<(SegmentState, u32, u64)> = (0..n)
                .map(|_| {
                    let st = [Clean, Dirty, Dirty, Dirty][rng.gen_range(0..4)];
                    let pct = if st == Clean {
                        0
                    } else {
                        rng.gen_range(0..=100)
                    };
                    (st, pct, rng.gen_range(0..1000))
                })
                .collect();
            let t = table(&rows, 1000);
            let max = rng.gen_range(0..10);
            let cands: Vec<SegmentId> = t.candidates().iter().map(|c| c.seg).collect();
            for k in PolicyKind::ALL {
                let v = k.policy().select(&t, max);
                assert!(v.len() <= max);
                assert_eq!(v.len(), max.min(cands.len()), "{k}");
                let mut d = v.clone();
                d.sort();
                d.dedup();
                assert_eq!(d.len(), v.len(), "{k} repeated a victim");
                assert!(v.iter().all(|s| cands.contains(s)), "{k}");
            }
        }
    }
}
