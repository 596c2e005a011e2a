//! `ldfs bench cleaner`: the cleaner's figures (issue 3).
//!
//! 1. Write cost `(user bytes + bytes moved by the cleaner) / user bytes`
//!    against utilization, for uniform random 4 KiB overwrites and for
//!    hot-and-cold ones (90% of the writes to 10% of the blocks), under each
//!    policy — the experiment behind Sprite LFS's cost-benefit policy. Runs
//!    in memory: a device is filled to the utilization, overwritten to a
//!    steady state, then measured over the same volume again.
//! 2. Random 4 KiB synchronous overwrites (write + flush each) on an image
//!    file at 80% utilization with the cleaner forced to run (clean
//!    segments at the start watermark, no idle time), as a fraction of the
//!    same on an empty file system (virtual-log paper 5.3).
//!
//! With `--out DIR` the write costs are also drawn, DIR/bench/cleaner.png:
//! a panel per workload, write cost against utilization, a line per policy
//! (Sprite LFS's figures of the same experiment have this shape).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ldfs::device::{Device, FileDevice, FileDeviceOptions, MemoryDevice};
use ldfs::ld::{ListHints, ListId, LogicalDisk};
use ldfs::lld::layout::MkfsOptions;
use ldfs::lld::{CleanerOptions, Lld, LldOptions, PolicyKind};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

pub struct CleanerBench {
    pub dir: PathBuf,
    pub size: u64,
    pub segment_size: u64,
    pub utilizations: Vec<f64>,
    pub overwrites: u64,
    pub policies: Vec<PolicyKind>,
    pub sync_size: u64,
    pub seconds: u64,
    pub out: Option<PathBuf>,
}

type R<T> = Result<T, String>;

const BLOCK: usize = 4096;
const SEED: u64 = 0xc1ea_2026;

#[derive(Clone, Copy, PartialEq)]
enum Workload {
    Uniform,
    HotCold,
}

impl Workload {
    fn name(self) -> &'static str {
        match self {
            Workload::Uniform => "uniform",
            Workload::HotCold => "hot-and-cold",
        }
    }

    /// Index of the next overwrite among `n` blocks.
    fn pick(self, rng: &mut ChaCha8Rng, n: u64) -> u64 {
        match self {
            Workload::Uniform => rng.gen_range(0..n),
            Workload::HotCold => {
                let hot = (n / 10).max(1);
                if rng.gen_ratio(9, 10) {
                    rng.gen_range(0..hot)
                } else {
                    rng.gen_range(hot..n.max(hot + 1))
                }
            }
        }
    }
}

/// One workload's write costs: `costs[u][p]` for utilization `u` and
/// policy `p` (None where the run failed).
struct Curve {
    workload: Workload,
    costs: Vec<Vec<Option<f64>>>,
}

pub fn run(b: &CleanerBench) -> R<()> {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "# ldfs bench cleaner ({cpus} CPUs; write cost in memory on {} MiB, {} KiB segments, 4 KiB blocks; seed {SEED:#x})",
        b.size >> 20,
        b.segment_size >> 10
    );
    // Where the figure goes, checked before the measurements, not after.
    let png = match &b.out {
        Some(out) if !b.utilizations.is_empty() => {
            let dir = out.join("bench");
            std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            crate::bench::report::load_font()?;
            Some(dir.join("cleaner.png"))
        }
        _ => None,
    };
    let mut curves = Vec::new();
    let mut failed = 0;
    for w in [Workload::Uniform, Workload::HotCold] {
        if b.utilizations.is_empty() {
            break;
        }
        println!("write cost, {} overwrites:", w.name());
        let mut header = format!("  {:>11}", "utilization");
        for p in &b.policies {
            header += &format!(" {:>14}", p.name());
        }
        println!("{header}");
        let mut curve = Curve {
            workload: w,
            costs: Vec::new(),
        };
        for &u in &b.utilizations {
            let mut line = format!("  {u:>11.2}");
            let mut row = Vec::new();
            for &p in &b.policies {
                let cell = match write_cost(b, w, u, p) {
                    Ok(c) => {
                        row.push(Some(c));
                        format!("{c:>14.2}")
                    }
                    Err(e) => {
                        eprintln!("  {} {u} {p}: {e}", w.name());
                        failed += 1;
                        row.push(None);
                        format!("{:>14}", "error")
                    }
                };
                line += &cell;
            }
            println!("{line}");
            curve.costs.push(row);
        }
        curves.push(curve);
    }
    if let Some(path) = png {
        chart(b, &curves, &path).map_err(|e| format!("{}: {e}", path.display()))?;
        eprintln!("bench cleaner: wrote {}", path.display());
    }
    if b.sync_size > 0 {
        sync_overwrites(b)?;
    }
    if failed > 0 {
        return Err(format!(
            "{failed} write-cost runs failed (marked 'error' above)"
        ));
    }
    Ok(())
}

/// Write cost against utilization, a panel per workload, a line (with a
/// mark per measured point) per policy.
fn chart(
    b: &CleanerBench,
    curves: &[Curve],
    path: &Path,
) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;
    let root = BitMapBackend::new(path, (1200, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let (title, body) = root.split_vertically(50);
    title.draw(&Text::new(
        format!(
            "ldfs bench cleaner: write cost, {} MiB device, {} KiB segments, 4 KiB blocks",
            b.size >> 20,
            b.segment_size >> 10
        ),
        (20, 14),
        ("sans-serif", 22).into_font().color(&BLACK),
    ))?;
    let (u_lo, u_hi) = b
        .utilizations
        .iter()
        .fold((1.0f64, 0.0f64), |(lo, hi), &u| (lo.min(u), hi.max(u)));
    let panels = body.split_evenly((1, curves.len()));
    for (panel, curve) in panels.iter().zip(curves) {
        let top = curve
            .costs
            .iter()
            .flatten()
            .flatten()
            .fold(2.0f64, |a, &c| a.max(c));
        let mut c = ChartBuilder::on(panel)
            .margin(16)
            .x_label_area_size(40)
            .y_label_area_size(50)
            .caption(
                format!("{} overwrites", curve.workload.name()),
                ("sans-serif", 18),
            )
            .build_cartesian_2d((u_lo - 0.02)..(u_hi + 0.02), 1.0..(top * 1.1))?;
        c.configure_mesh()
            .x_desc("utilization (live / segments outside the reserve)")
            .y_desc("write cost")
            .label_style(("sans-serif", 14))
            .draw()?;
        for (pi, p) in b.policies.iter().enumerate() {
            let color = crate::bench::report::color(pi);
            let points: Vec<(f64, f64)> = b
                .utilizations
                .iter()
                .zip(&curve.costs)
                .filter_map(|(&u, row)| Some((u, row[pi]?)))
                .collect();
            c.draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?
                .label(p.name())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
                });
            c.draw_series(
                points
                    .into_iter()
                    .map(|pt| Circle::new(pt, 4, color.filled())),
            )?;
        }
        c.configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .label_font(("sans-serif", 14))
            .draw()?;
    }
    root.present()?;
    Ok(())
}

fn block_for(i: u64, round: u64) -> Vec<u8> {
    let mut v = vec![0u8; BLOCK];
    v[..8].copy_from_slice(&i.to_le_bytes());
    v[8..16].copy_from_slice(&round.to_le_bytes());
    v[16] = 0x5a;
    v
}

fn mkfs_for(b: &CleanerBench, max_block: u32) -> MkfsOptions {
    MkfsOptions {
        segment_bytes: b.segment_size,
        max_block_bytes: max_block,
        reserved_segments: None,
        fs_id: 0,
        max_bytes: None,
        kept_pages: 0,
    }
}

fn bench_opts(policy: PolicyKind) -> LldOptions {
    LldOptions {
        map_budget_bytes: 256 << 20,
        cleaner: CleanerOptions {
            policy,
            // The figures set utilization themselves, up to 95%.
            max_live_percent: 100,
            ..Default::default()
        },
        ..Default::default()
    }
}

/// Blocks that make `u` of the segments outside the reserve live.
fn blocks_for(lld: &Lld, u: f64) -> R<u64> {
    let g = lld.geometry();
    let usable = (g.segment_count - g.reserved_segments) as u64 * g.segment_bytes();
    let n = (usable as f64 * u / BLOCK as f64) as u64;
    let need = n * (BLOCK as u64 + 38);
    let cap = lld.space().capacity_bytes;
    if need > cap {
        return Err(format!(
            "utilization {u} needs {need} bytes, capacity is {cap}: use larger segments"
        ));
    }
    Ok(n)
}

fn fill(lld: &Lld, n: u64) -> R<ListId> {
    let l = lld
        .create_list(None, ListHints::default())
        .map_err(|e| e.to_string())?;
    for i in 0..n {
        lld.write(None, l, i, &block_for(i, 0))
            .map_err(|e| format!("fill {i}: {e}"))?;
    }
    Ok(l)
}

fn write_cost(b: &CleanerBench, w: Workload, u: f64, p: PolicyKind) -> R<f64> {
    let dev: Arc<dyn Device> = Arc::new(MemoryDevice::new(b.size));
    let lld =
        Lld::create(dev, &mkfs_for(b, BLOCK as u32), bench_opts(p)).map_err(|e| e.to_string())?;
    let n = blocks_for(&lld, u)?;
    let l = fill(&lld, n)?;
    let mut rng = ChaCha8Rng::seed_from_u64(SEED);
    let per_phase = b.overwrites * b.size / BLOCK as u64;
    let mut round = 1;
    let mut overwrite = |count: u64| -> R<()> {
        for _ in 0..count {
            let i = w.pick(&mut rng, n);
            lld.write(None, l, i, &block_for(i, round))
                .map_err(|e| format!("overwrite {i}: {e}"))?;
            round += 1;
        }
        Ok(())
    };
    overwrite(per_phase)?;
    let (u0, m0) = lld.write_totals();
    overwrite(per_phase)?;
    let (u1, m1) = lld.write_totals();
    if lld.accounting_drift() != 0 {
        return Err("accounting drift".into());
    }
    Ok((u1 - u0 + m1 - m0) as f64 / (u1 - u0) as f64)
}

/// Random 4 KiB write + flush on `lld` for `secs` over blocks `0..n`.
fn sync_rate(lld: &Lld, l: ListId, n: u64, secs: u64, rng: &mut ChaCha8Rng) -> R<(f64, u64)> {
    let until = Instant::now() + Duration::from_secs(secs);
    let t = Instant::now();
    let mut ops = 0u64;
    while Instant::now() < until {
        let i = rng.gen_range(0..n);
        lld.write(None, l, i, &block_for(i, ops + 1))
            .map_err(|e| format!("sync overwrite: {e}"))?;
        lld.flush().map_err(|e| e.to_string())?;
        ops += 1;
    }
    Ok((ops as f64 / t.elapsed().as_secs_f64(), ops))
}

fn sync_overwrites(b: &CleanerBench) -> R<()> {
    let path = b.dir.join("bench-cleaner-sync.img");
    let mut rng = ChaCha8Rng::seed_from_u64(SEED);
    let open = || -> R<Lld> {
        let dev = FileDevice::create(&path, b.sync_size, FileDeviceOptions::default())
            .map_err(|e| format!("{}: {e}", path.display()))?;
        // Write the whole file first so neither phase pays for block
        // allocation in the host file system (a sparse file makes every
        // fdatasync commit its journal).
        let zeros = vec![0u8; 1 << 20];
        for off in (0..b.sync_size).step_by(zeros.len()) {
            let n = zeros.len().min((b.sync_size - off) as usize);
            dev.write_at(&zeros[..n], off).map_err(|e| e.to_string())?;
        }
        dev.flush().map_err(|e| e.to_string())?;
        let dev: Arc<dyn Device> = Arc::new(dev);
        Lld::create(
            dev,
            &mkfs_for(b, 16 << 10),
            bench_opts(PolicyKind::default()),
        )
        .map_err(|e| e.to_string())
    };
    // Empty: a 4 MiB file on a fresh file system.
    let lld = open()?;
    let n_empty = 1024;
    let l = fill(&lld, n_empty)?;
    lld.flush().map_err(|e| e.to_string())?;
    let (empty, _) = sync_rate(&lld, l, n_empty, b.seconds, &mut rng)?;
    lld.close().map_err(|e| e.to_string())?;
    drop(lld);
    // Full: 80% live, overwritten until the cleaner has to run, then the
    // same synchronous overwrites spread over all of it.
    let lld = open()?;
    let n = blocks_for(&lld, 0.8)?;
    let l = fill(&lld, n)?;
    let mut i = 0u64;
    while lld.clean_segment_counts().0 >= lld.start_watermark() {
        let k = rng.gen_range(0..n);
        lld.write(None, l, k, &block_for(k, i))
            .map_err(|e| e.to_string())?;
        i += 1;
    }
    lld.flush().map_err(|e| e.to_string())?;
    let (u0, m0) = lld.write_totals();
    let s0 = lld.cleaner_stats();
    let (full, ops) = sync_rate(&lld, l, n, b.seconds, &mut rng)?;
    let (u1, m1) = lld.write_totals();
    let s1 = lld.cleaner_stats();
    lld.close().map_err(|e| e.to_string())?;
    drop(lld);
    let _ = std::fs::remove_file(&path);
    println!(
        "random 4 KiB synchronous overwrites at 80% utilization, cleaner forced: {:.0}% of empty-fs throughput ({full:.0} vs {empty:.0} ops/s; write cost {:.2}, {} segments cleaned in {ops} ops; {} MiB image in {})",
        100.0 * full / empty,
        (u1 - u0 + m1 - m0) as f64 / (u1 - u0).max(1) as f64,
        s1.segments_released - s0.segments_released,
        b.sync_size >> 20,
        b.dir.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small run end to end; with the charts' font present, `--out`
    /// draws the figure.
    #[test]
    fn a_small_run_measures_and_draws() {
        let dir = tempfile::tempdir().unwrap();
        let font = Path::new(crate::bench::report::FONT).exists();
        let b = CleanerBench {
            dir: dir.path().to_path_buf(),
            size: 16 << 20,
            segment_size: 256 << 10,
            utilizations: vec![0.5, 0.7],
            overwrites: 1,
            policies: vec![PolicyKind::Greedy, PolicyKind::FreeWeighted],
            sync_size: 0,
            seconds: 0,
            out: font.then(|| dir.path().to_path_buf()),
        };
        let c = write_cost(&b, Workload::HotCold, 0.7, PolicyKind::Greedy).unwrap();
        assert!((1.0..10.0).contains(&c), "write cost {c}");
        run(&b).unwrap();
        if font {
            let png = dir.path().join("bench/cleaner.png");
            assert!(std::fs::metadata(&png).unwrap().len() > 1000);
        }
    }
}
