//! The analytical models of eager writing (virtual-log-1999 Section 2) and
//! the Monte Carlo simulations that check them on the simulated disks.
//!
//! All latencies are in sectors unless the name ends in `_us`. `p` is the
//! free fraction (utilization is `1 - p`), `n` sectors per track, `t` tracks
//! per cylinder, `s` the head-switch cost in sectors, `k` the free sectors a
//! track keeps when eager writing moves on (the track-switch threshold).

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::disk::{HeadPos, SimDisk};
use super::params::DiskParams;

/// Equation 3: expected used sectors skipped before the first free one in a
/// track of `n` sectors, `k` of them free, placed at random.
pub fn eq3(n: f64, k: f64) -> f64 {
    (n - k) / (1.0 + k)
}

/// Equation 1: the same with `k = p·n`.
pub fn eq1(n: f64, p: f64) -> f64 {
    (1.0 - p) * n / (1.0 + p * n)
}

/// Equation 1 in µs for a drive at utilization `u`.
pub fn eq1_us(d: &DiskParams, utilization: f64) -> f64 {
    eq1(f64::from(d.sectors_per_track), 1.0 - utilization) * d.sector_us()
}

/// Equation 11: sectors skipped locating every free sector of a logical
/// block of `big_b` sectors when the drive allocates physical blocks of
/// `b` sectors (`b <= big_b`), `big_b / b` independent locates on a track
/// of `n / b` blocks: `(1-p)n / (b + pn) · B`. With `b = big_b = 1` it is
/// equation 1.
pub fn eq11(n: f64, p: f64, b: f64, big_b: f64) -> f64 {
    (1.0 - p) * n / (b + p * n) * big_b
}

/// Equation 11 in µs for a drive at utilization `u`: a logical block of
/// `logical_sectors` on physical blocks of `block_sectors`.
pub fn eq11_us(d: &DiskParams, utilization: f64, block_sectors: u32, logical_sectors: u32) -> f64 {
    let (b, big_b) = (f64::from(block_sectors), f64::from(logical_sectors));
    eq11(f64::from(d.sectors_per_track), 1.0 - utilization, b, big_b) * d.sector_us()
}

/// Equation 4 with the probability functions (5) and (6): the expected
/// delay to the nearest free sector in one cylinder, taking the current
/// track (`x`, geometric with parameter `p`) or the best of the other `t-1`
/// tracks after a head switch (`y = s + j`, `j` geometric with parameter
/// `1 - (1-p)^(t-1)`). `s` may be fractional: `y - s` runs over integers.
///
/// The sum over `y` is done in closed form for each `x` (finite), and the
/// sum over `x` runs until the remaining probability is below 1e-15, so
/// the result is exact to that bound.
pub fn eq4(p: f64, t: u32, s: f64) -> f64 {
    assert!(p > 0.0 && p <= 1.0 && t >= 1 && s >= 0.0);
    let q = if t > 1 {
        1.0 - (1.0 - p).powi(t as i32 - 1)
    } else {
        0.0
    };
    let mut total = 0.0;
    let mut px = p; // f_x(p, x) = p (1-p)^x
    let mut tail = 1.0; // P(X >= x)
    let mut x = 0u64;
    while tail > 1e-15 && x < 10_000_000 {
        let xf = x as f64;
        // g(x) = E[min(x, s + J)]: j < x - s gives s + j, the rest x.
        let g = if q == 0.0 || xf <= s {
            xf
        } else {
            let jmax = (xf - s).ceil() as u64; // j in 0..jmax has s + j < x
            let mut sum = 0.0;
            let mut pj = q;
            for j in 0..jmax {
                sum += (s + j as f64) * pj;
                pj *= 1.0 - q;
            }
            sum + xf * (1.0 - q).powf(jmax as f64)
        };
        total += g * px;
        tail -= px;
        px *= 1.0 - p;
        x += 1;
    }
    total
}

/// Equation 4 in µs for a drive at utilization `u`.
pub fn eq4_us(d: &DiskParams, utilization: f64) -> f64 {
    let s = d.head_switch_us / d.sector_us();
    eq4(1.0 - utilization, d.tracks_per_cylinder, s) * d.sector_us()
}

/// Equation 7: sectors skipped filling an empty track of `n` down to `k`
/// free sectors, if free space stayed random.
pub fn eq7(n: u32, k: u32) -> f64 {
    ((k + 1)..=n)
        .map(|i| f64::from(n - i) / f64::from(1 + i))
        .sum()
}

/// Equation 8: average latency per write, µs, with the exact sum (7).
pub fn eq8_us(n: u32, k: u32, s_us: f64, r_us: f64) -> f64 {
    assert!(k < n);
    (s_us + r_us * eq7(n, k)) / f64::from(n - k)
}

/// Equation 9: the correction for the non-random free space left by
/// filling a track to a threshold.
pub fn eq9(n: f64, k: f64) -> f64 {
    let p = 1.0 + n / 36.0;
    (n - k - 0.5).powf(p + 2.0) / ((8.0 - n / 96.0) * (p + 2.0) * n.powf(p))
}

/// Equation 10: average latency per write, µs, filling empty tracks to `k`
/// free sectors, with a track switch costing `s_us` and a sector `r_us`.
pub fn eq10_us(n: u32, k: u32, s_us: f64, r_us: f64) -> f64 {
    assert!(k < n);
    let (nf, kf) = (f64::from(n), f64::from(k));
    let skipped = (nf + 1.0) * ((nf + 2.0) / (kf + 2.0)).ln() - (nf - kf) + eq9(nf, kf);
    (s_us + r_us * skipped) / (nf - kf)
}

/// Free sectors kept per track at a threshold (fraction of the track kept
/// free), as Figure 2's x axis.
pub fn threshold_sectors(d: &DiskParams, threshold: f64) -> u32 {
    ((threshold * f64::from(d.sectors_per_track)).round() as u32).min(d.sectors_per_track - 1)
}

/// Equation 10 for a drive at a threshold; the switch cost is a head switch.
pub fn eq10_for(d: &DiskParams, threshold: f64) -> f64 {
    eq10_us(
        d.sectors_per_track,
        threshold_sectors(d, threshold),
        d.head_switch_us,
        d.sector_us(),
    )
}

/// Where a simulated eager write may go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// The current track only (equation 1's setting).
    Track,
    /// Any track of the simulated zone, seeking if that is nearer
    /// (Figure 1's simulation).
    Zone,
}

/// Simulate Figure 1: each track of the zone has `(1-u)·n` free sectors at
/// random places (rounded up or down at random so that the mean is exactly
/// `(1-u)·n`, as equation 1 assumes); the head stops at a random sector
/// boundary of a random track, and eager writing takes the free sector
/// reached soonest. Returns the mean locate time in µs over `trials`.
///
/// `Scope::Track` lays out a fresh track under the head for every trial
/// (it looks at nothing else), so trials are independent and cheap;
/// `Scope::Zone` lays out the whole zone afresh every 16 trials.
pub fn simulate_locate(
    d: &DiskParams,
    utilization: f64,
    scope: Scope,
    trials: u32,
    seed: u64,
) -> f64 {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let n = d.sectors_per_track as usize;
    let tracks = d.tracks() as usize;
    let free_mean = (1.0 - utilization) * n as f64;
    let draw_free = |rng: &mut ChaCha8Rng| -> usize {
        let floor = free_mean.floor();
        let k = floor as usize + usize::from(rng.gen_bool(free_mean - floor));
        k.clamp(1, n)
    };
    let lay_out = |rng: &mut ChaCha8Rng, row: &mut [bool]| {
        row.iter_mut().for_each(|f| *f = false);
        let k = draw_free(rng);
        for i in rand::seq::index::sample(rng, n, k) {
            row[i] = true;
        }
    };
    // The drive only lends its geometry and timing; no media is touched.
    let disk = SimDisk::new(
        DiskParams {
            cylinders: d.cylinders,
            ..d.clone()
        },
        0.0,
    );
    let mut free = vec![false; tracks * n];
    let mut total = 0.0;
    for trial in 0..trials {
        if scope == Scope::Zone && trial % 16 == 0 {
            for tr in 0..tracks {
                lay_out(&mut rng, &mut free[tr * n..(tr + 1) * n]);
            }
        }
        let track = rng.gen_range(0..tracks);
        if scope == Scope::Track {
            lay_out(&mut rng, &mut free[track * n..(track + 1) * n]);
        }
        let pos = HeadPos {
            cylinder: (track / d.tracks_per_cylinder as usize) as u32,
            head: (track % d.tracks_per_cylinder as usize) as u32,
        };
        let clock = rng.gen_range(0..n) as f64 * d.sector_us();
        let candidates = match scope {
            Scope::Track => track * n..(track + 1) * n,
            Scope::Zone => 0..tracks * n,
        };
        let best = candidates
            .filter(|&lba| free[lba])
            .map(|lba| disk.locate_from(pos, clock, lba as u64))
            .fold(f64::INFINITY, f64::min);
        total += best;
    }
    total / f64::from(trials)
}

/// Simulate Figure 2: writes of one sector arrive with the head at a random
/// sector boundary; each goes to the free sector of the current track reached
/// soonest; once the track is down to `k` free sectors the head switches to
/// the next, empty, track. Returns the mean latency per write, µs (the
/// switches included).
pub fn simulate_threshold(d: &DiskParams, threshold: f64, tracks: u32, seed: u64) -> f64 {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let n = d.sectors_per_track;
    let k = threshold_sectors(d, threshold);
    let r = d.sector_us();
    let mut total = 0.0;
    let mut writes = 0u64;
    for _ in 0..tracks {
        total += d.head_switch_us;
        let mut used = vec![false; n as usize];
        for _ in 0..(n - k) {
            // The head arrives at a random sector boundary (the models count
            // whole sectors skipped).
            let mut i = rng.gen_range(0..n);
            let mut wait = 0.0;
            while used[i as usize] {
                i = (i + 1) % n;
                wait += 1.0;
            }
            used[i as usize] = true;
            total += wait * r;
            writes += 1;
        }
    }
    total / writes as f64
}

#[cfg(test)]
mod tests {
    use super::super::params::PaperDisk;
    use super::*;

    #[test]
    fn eq11_is_eq1_for_sectors_and_lowest_when_the_block_is_the_fs_block() {
        for p in [0.05, 0.2, 0.5, 0.9] {
            for n in [72.0, 256.0] {
                assert!((eq11(n, p, 1.0, 1.0) - eq1(n, p)).abs() < 1e-9);
                // Section 4.2: a 4 KiB block as one 4 KiB physical block
                // locates sooner than as eight 512-byte ones.
                let (whole, sectors) = (eq11(n, p, 8.0, 8.0), eq11(n, p, 1.0, 8.0));
                assert!(whole < sectors, "p {p} n {n}: {whole} vs {sectors}");
            }
        }
    }

    #[test]
    fn eq1_for_one_free_sector_is_half_a_rotation() {
        for n in [72.0, 256.0, 10.0] {
            // pn = 1: (n - 1) / 2 sectors skipped, the n - 1 used ones
            // halved: half a rotation less half a sector.
            let p = 1.0 / n;
            assert!((eq1(n, p) - (n - 1.0) / 2.0).abs() < 1e-9);
        }
        let hp = DiskParams::paper(PaperDisk::Hp97560);
        let half = eq1_us(&hp, 1.0 - 1.0 / 72.0) + hp.sector_us() / 2.0;
        assert!((half - hp.rotation_us() / 2.0).abs() < 1e-6);
        // Section 2.1: at 80% utilization about four sectors.
        assert!((eq1(72.0, 0.2) - 57.6 / 15.4).abs() < 1e-12);
        assert!((3.5..4.0).contains(&eq1(256.0, 0.2)));
    }

    #[test]
    fn eq3_solves_the_recurrence() {
        // E(n, k) = (n-k)/n · (1 + E(n-1, k)), E(k, k) = 0.
        for k in 1..20u32 {
            let mut e = 0.0;
            for n in (k + 1)..200 {
                e = f64::from(n - k) / f64::from(n) * (1.0 + e);
                assert!((e - eq3(f64::from(n), f64::from(k))).abs() < 1e-9);
            }
        }
    }

    #[test]
    fn eq4_reduces_to_the_track_model_without_other_tracks() {
        // One track: min(x, y) = x, a geometric mean (1-p)/p.
        for p in [0.1, 0.5, 0.9] {
            assert!((eq4(p, 1, 5.0) - (1.0 - p) / p).abs() < 1e-9);
        }
        // A free head switch with many tracks: almost never wait.
        assert!(eq4(0.5, 16, 0.0) < 0.02);
        // Other tracks can only help, and never below... s caps the mean.
        let hp = DiskParams::paper(PaperDisk::Hp97560);
        let s = hp.head_switch_us / hp.sector_us();
        let e = eq4(0.1, 19, s);
        assert!(e < (1.0 - 0.1) / 0.1 && e > 0.0);
        // Brute force double sum agrees.
        let (p, t, s) = (0.2f64, 4u32, 3.5f64);
        let q = 1.0 - (1.0 - p).powi(t as i32 - 1);
        let mut brute = 0.0;
        for x in 0..2000 {
            for j in 0..2000 {
                let y = s + j as f64;
                brute += (x as f64).min(y) * p * (1.0 - p).powi(x) * q * (1.0 - q).powi(j);
            }
        }
        assert!(
            (eq4(p, t, s) - brute).abs() < 1e-9,
            "{} {}",
            eq4(p, t, s),
            brute
        );
    }

    #[test]
    fn eq10_tracks_the_exact_sum_and_has_an_interior_optimum() {
        for disk in PaperDisk::ALL {
            let d = DiskParams::paper(disk);
            let n = d.sectors_per_track;
            // The integral of (7) is close to the sum when k is not tiny.
            for k in [n / 4, n / 2] {
                let integral = (f64::from(n) + 1.0)
                    * ((f64::from(n) + 2.0) / (f64::from(k) + 2.0)).ln()
                    - f64::from(n - k);
                let rel = (integral - eq7(n, k)).abs() / eq7(n, k);
                assert!(rel < 0.1, "{disk:?} k={k}: {integral} vs {}", eq7(n, k));
            }
            let at = |th: f64| eq10_for(&d, th);
            // Switching after every write (k = n-1) pays s per write: exactly
            // in (8), to the integral's precision in (10).
            let exact = eq8_us(n, n - 1, d.head_switch_us, d.sector_us());
            assert!((exact - d.head_switch_us).abs() < 1e-9);
            let always = eq10_us(n, n - 1, d.head_switch_us, d.sector_us());
            assert!((always - d.head_switch_us).abs() / d.head_switch_us < 0.01);
            let best = (1..20)
                .map(|i| at(i as f64 * 0.05))
                .fold(f64::MAX, f64::min);
            assert!(best < at(0.0) && best < at(0.95), "{disk:?}");
        }
    }

    #[test]
    fn track_simulation_agrees_with_eq1() {
        for disk in PaperDisk::ALL {
            let d = DiskParams::paper(disk);
            for u in [0.2, 0.5, 0.8] {
                let model = eq1_us(&d, u);
                let sim = simulate_locate(&d, u, Scope::Track, 3000, 7);
                let rel = (sim - model).abs() / model;
                assert!(rel < 0.1, "{disk:?} u={u}: sim {sim} model {model}");
            }
        }
    }

    #[test]
    fn threshold_simulation_follows_eq10() {
        let d = DiskParams::paper(PaperDisk::Hp97560);
        for th in [0.2, 0.4, 0.6] {
            let model = eq10_for(&d, th);
            let sim = simulate_threshold(&d, th, 300, 3);
            let rel = (sim - model).abs() / model;
            assert!(rel < 0.2, "th={th}: sim {sim} model {model}");
        }
    }
}
