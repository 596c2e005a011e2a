//! Review 16 of 6cb6e21..a576a27 (issue 12): freeing operations that clean
//! first (c4b0677), a waiting writer's doubling passes (c918df0), the
//! blocked-ARU retries (187c238) and the map allowance's partial overhead
//! (42a4d4d), kept as tests. Seeded, `LDFS_SEED` replays one seed;
//! `measure` ones print tables (run with `--ignored --nocapture`).
//!
//! - A delete (or any freeing operation) at the user floor while another
//!   ARU that logged something is open waited about 4.5 s (a pass's
//!   `aru_wait_ms`, then the blocked rounds), and again every 65th
//!   operation: 400 deletes took 31.5 s (0.3 ms at 6cb6e21); four deleting
//!   threads waited in turn, worst 19.5 s. Freeing operations now never
//!   wait for open ARUs, clean one round at most, and do not queue behind
//!   a running pass (`SpaceWait::freeing`). The file system (one ARU at a
//!   time) could not reach this.
//! - Open, ignored: a deleter among three writers on a 256 MiB device at
//!   250 MB/s: worst delete 2.1 s, 22 over 1 s in 60 s, before; 1.6 s and
//!   one over 1 s now; 0.5 s at 6cb6e21, where 8,312 of 12,188 deletes
//!   failed with NoSpace on 64 MiB instead.
//! - `a_full_file_system_takes_freeing_operations` fails on 6cb6e21
//!   (unlinks refused with small files on 64 MiB and larger: review 14's
//!   F1, fixed by c4b0677).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ldfs::device::{Device, DeviceError, MemoryDevice};
use ldfs::ld::{LdError, ListHints, ListId, LogicalDisk};
use ldfs::lld::layout::MkfsOptions;
use ldfs::lld::{Lld, LldOptions};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

mod space_common;
use space_common::{bytes, seeds};

/// The mkfs defaults, or (`small`) the smallest segments the default max
/// block allows (a device of 8 MiB holds too few 2 MiB segments).
fn mk(seg: u64, max_block: u32) -> MkfsOptions {
    MkfsOptions {
        segment_bytes: seg,
        max_block_bytes: max_block,
        ..MkfsOptions::default()
    }
}

#[derive(Clone, Copy, Debug)]
enum Load {
    /// 200..1200 bytes at random keys of 4 lists (the map-heavy case).
    Small,
    /// 4 KiB blocks, sequential in 16 lists (file data).
    Seq4k,
}

struct Writer {
    lists: Vec<ListId>,
    next: Vec<u64>,
    rng: ChaCha8Rng,
    load: Load,
    /// Data bytes accepted.
    written: u64,
    keys: Vec<(ListId, u64, usize)>,
}

impl Writer {
    fn new(lld: &Lld, load: Load, seed: u64) -> Writer {
        let n = match load {
            Load::Small => 4,
            Load::Seq4k => 16,
        };
        Writer {
            lists: (0..n)
                .map(|_| lld.create_list(None, ListHints::default()).unwrap())
                .collect(),
            next: vec![0; n],
            rng: ChaCha8Rng::seed_from_u64(seed),
            load,
            written: 0,
            keys: Vec::new(),
        }
    }

    /// One new block; Err on refusal.
    fn step(&mut self, lld: &Lld) -> Result<(), LdError> {
        let li = self.rng.gen_range(0..self.lists.len());
        let l = self.lists[li];
        let (i, len) = match self.load {
            Load::Small => (
                self.rng.gen_range(0..1u64 << 40),
                self.rng.gen_range(200..1200),
            ),
            Load::Seq4k => (self.next[li], 4096),
        };
        let s: u64 = self.rng.gen();
        lld.write(None, l, i, &bytes(s & 0xffff, len))?;
        self.next[li] += 1;
        self.written += len as u64;
        self.keys.push((l, i, len));
        Ok(())
    }
}

/// A memory device that takes as long as a disk of `R16_MBPS` MB/s
/// would (each read and write sleeps its length at that rate; flushes
/// 2 ms), to see how long waits for the cleaner take on real hardware.
struct Throttled {
    inner: MemoryDevice,
    bytes_per_sec: f64,
}

impl Throttled {
    fn pause(&self, len: usize) {
        std::thread::sleep(Duration::from_secs_f64(len as f64 / self.bytes_per_sec));
    }
}

impl Device for Throttled {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), DeviceError> {
        self.pause(buf.len());
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), DeviceError> {
        self.pause(buf.len());
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> Result<(), DeviceError> {
        std::thread::sleep(Duration::from_millis(2));
        self.inner.flush()
    }
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
}

/// A memory device, throttled if `R16_MBPS` is set.
fn device(bytes: u64) -> Arc<dyn Device> {
    device_at(
        bytes,
        std::env::var("R16_MBPS")
            .ok()
            .map(|v| v.parse().expect("a number")),
    )
}

/// A memory device, throttled to `mbps` MB/s if given.
fn device_at(bytes: u64, mbps: Option<f64>) -> Arc<dyn Device> {
    match mbps {
        Some(m) => Arc::new(Throttled {
            inner: MemoryDevice::new(bytes),
            bytes_per_sec: m * 1e6,
        }),
        None => Arc::new(MemoryDevice::new(bytes)),
    }
}

/// Available space at several fills, and where writes are first refused,
/// on a device of `dev_bytes` with `mkfs`, default LldOptions.
fn space_table(dev_bytes: u64, mkfs: &MkfsOptions, load: Load, seed: u64) -> String {
    let lld = Lld::create(device(dev_bytes), mkfs, LldOptions::default()).unwrap();
    let cap = lld.space().capacity_bytes;
    let mut w = Writer::new(&lld, load, seed);
    let mut out = format!(
        "{} MiB seg {} KiB {load:?}: capacity {} KiB\n",
        dev_bytes >> 20,
        mkfs.segment_bytes >> 10,
        cap >> 10
    );
    let mut stops = vec![0.25, 0.5, 0.75, 0.8, 0.85].into_iter().peekable();
    let (mut refused, mut in_row) = (0u64, 0u32);
    let (mut worst, mut slow) = (Duration::ZERO, 0u32);
    let t0 = Instant::now();
    loop {
        let s = lld.space();
        if let Some(&f) = stops.peek() {
            if s.live_bytes as f64 >= f * cap as f64 {
                stops.next();
                let rec = w.keys.len() as u64 * 38;
                out += &format!(
                    "  live {:>4.1}%: available {:>7} KiB ({:>4.1}% of cap), unexplained \
                     (allowance) {:>6} KiB\n",
                    100.0 * s.live_bytes as f64 / cap as f64,
                    s.available_bytes >> 10,
                    100.0 * s.available_bytes as f64 / cap as f64,
                    (cap - s.available_bytes).saturating_sub(s.live_bytes + rec) >> 10,
                );
            }
        }
        let before = lld.space();
        let tw = Instant::now();
        let r = w.step(&lld);
        let e = tw.elapsed();
        worst = worst.max(e);
        slow += (e > Duration::from_millis(100)) as u32;
        match r {
            Ok(()) => in_row = 0,
            Err(LdError::NoSpace { .. }) => {
                refused += 1;
                in_row += 1;
                let s = lld.space();
                if refused == 1 || in_row == 50 {
                    out +=
                        &format!(
                        "  {}: live {:>4.1}% of cap, {} KiB written, available before {} KiB / \
                         after {} KiB, clean/releasable {:?} ({:.1}s)\n",
                        if in_row == 50 { "50 refused in a row" } else { "first refusal" },
                        100.0 * s.live_bytes as f64 / cap as f64,
                        w.written >> 10,
                        before.available_bytes >> 10,
                        s.available_bytes >> 10,
                        lld.clean_segment_counts(),
                        t0.elapsed().as_secs_f64()
                    );
                }
                if in_row == 50 {
                    break;
                }
            }
            Err(e) => panic!("{e}"),
        }
    }
    // Go on: how much more is taken in 200 more tries.
    let mut more = 0;
    let w0 = w.written;
    for _ in 0..200 {
        if w.step(&lld).is_ok() {
            more += 1;
        }
    }
    out += &format!(
        "  then {more} of 200 more writes taken ({} KiB), available now {} KiB; slowest write \
         of the fill {worst:?}, {slow} over 100 ms; cleaner {:?}\n",
        (w.written - w0) >> 10,
        lld.space().available_bytes >> 10,
        lld.cleaner_stats()
    );
    lld.close().unwrap();
    out
}

/// Measures `space().available_bytes` at several fills and where writes
/// are first refused (compare this table on main and on 6cb6e21).
#[test]
#[ignore = "measure"]
fn measure_available_space() {
    let seed = seeds(1..=1)[0];
    let only = std::env::var("R16_DEV").ok();
    let cases: Vec<(u64, MkfsOptions)> = vec![
        (8 << 20, mk(128 << 10, 16 << 10)),
        (8 << 20, mk(256 << 10, 64 << 10)),
        (64 << 20, MkfsOptions::default()),
        (1 << 30, MkfsOptions::default()),
    ];
    for (dev, m) in cases {
        if only
            .as_deref()
            .is_some_and(|o| o != format!("{}", dev >> 20))
        {
            continue;
        }
        let loads = if std::env::var("R16_MBPS").is_ok() {
            vec![Load::Small]
        } else {
            vec![Load::Small, Load::Seq4k]
        };
        for load in loads {
            eprint!("{}", space_table(dev, &m, load, seed));
        }
    }
}

/// Fills an 8 MiB device (128 KiB segments) to a tenth of its capacity
/// left, opens an ARU and logs a write in it, overwrites until the first
/// refusal (the log at the user floor; returns how long that writer
/// waited), then deletes `n` keys (no ARU) on each of `threads` threads:
/// (the writer's wait, the worst delete, deletes over 1 s, all the deletes'
/// time, failed deletes).
fn open_aru_run(
    seed: u64,
    threads: usize,
    n: usize,
) -> (Duration, Duration, usize, Duration, usize) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let o = LldOptions {
        map_budget_bytes: 256 << 10,
        ..LldOptions::default()
    };
    let lld = Arc::new(
        Lld::create(
            Arc::new(MemoryDevice::new(8 << 20)),
            &mk(128 << 10, 16 << 10),
            o,
        )
        .unwrap(),
    );
    let mut w = Writer::new(&lld, Load::Small, seed);
    let cap = lld.space().capacity_bytes;
    while lld.space().available_bytes > cap / 10 {
        w.step(&lld).unwrap();
    }
    // A long ARU that has logged a write.
    let aru = lld.begin_aru().unwrap();
    let l = lld.create_list(None, ListHints::default()).unwrap();
    lld.write(Some(aru), l, 0, &[1u8; 100]).unwrap();
    // Overwrites until the log is at the user floor: the first refusal
    // (what the passes emptied, the open ARU keeps).
    let mut keys = w.keys.clone();
    let t = Instant::now();
    let mut over = 0;
    loop {
        let (l, i, len) = keys[rng.gen_range(0..keys.len())];
        match lld.write(None, l, i, &bytes(over, len)) {
            Ok(()) => over += 1,
            Err(LdError::NoSpace { .. }) => break,
            Err(e) => panic!("{e}"),
        }
    }
    let writer_wait = t.elapsed();
    let mut per: Vec<Vec<(ListId, u64)>> = vec![Vec::new(); threads];
    for mine in per.iter_mut() {
        for _ in 0..n {
            let (l, i, _) = keys.swap_remove(rng.gen_range(0..keys.len()));
            mine.push((l, i));
        }
    }
    let t0 = Instant::now();
    let res: Vec<(Duration, usize, usize)> = per
        .into_iter()
        .map(|mine| {
            let lld = lld.clone();
            std::thread::spawn(move || {
                let (mut worst, mut slow, mut failed) = (Duration::ZERO, 0, 0);
                for (l, i) in mine {
                    let t = Instant::now();
                    let r = lld.delete(None, l, i);
                    let e = t.elapsed();
                    slow += (e > Duration::from_secs(1)) as usize;
                    worst = worst.max(e);
                    failed += r.is_err() as usize;
                }
                (worst, slow, failed)
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().unwrap())
        .collect();
    let total = t0.elapsed();
    lld.end_aru(aru).unwrap();
    let worst = res.iter().map(|r| r.0).max().unwrap();
    (
        writer_wait,
        worst,
        res.iter().map(|r| r.1).sum(),
        total,
        res.iter().map(|r| r.2).sum(),
    )
}

/// A delete (no ARU) near the user floor while another ARU that has logged
/// something is open (here the test thread's; any thread's does the
/// same): the clean-first step (c4b0677) runs a pass whose checkpoint the
/// ARU blocks (`aru_wait_ms`), then the blocked-ARU retries (187c238) wait
/// `BLOCKED_ROUNDS` x `aru_wait_ms` more (8 x 500 ms by default) before
/// the delete goes on, and again after every 64 operations
/// (`note_futile(64)`). At 6cb6e21 the deletes took microseconds.
#[test]
fn a_delete_beside_an_open_aru_does_not_wait_seconds() {
    for seed in seeds(1..=2) {
        let (ww, worst, slow, total, failed) = open_aru_run(seed, 1, 400);
        eprintln!(
            "seed {seed}: the writer was refused after {ww:?}; 400 deletes in {total:?}, \
             {slow} over 1 s, worst {worst:?}; {failed} failed"
        );
        assert!(
            worst < Duration::from_secs(1),
            "seed {seed}: a delete waited {worst:?} ({slow} over 1 s, 400 deletes in {total:?})"
        );
    }
}

/// The same with four deleting threads: each waits its blocked rounds
/// holding the cleaner's lock (`clean_for_space` keeps it through
/// `checkpoint_when_quiet`), so the others' rounds come in turn and a
/// delete waits about four times as long.
#[test]
fn four_deleters_beside_an_open_aru_do_not_wait_in_turn() {
    for seed in seeds(1..=1) {
        let (ww, worst, slow, total, failed) = open_aru_run(seed, 4, 100);
        eprintln!(
            "seed {seed}: the writer was refused after {ww:?}; 4 x 100 deletes in {total:?}, \
             {slow} over 1 s, worst {worst:?}; {failed} failed"
        );
        assert!(
            worst < Duration::from_secs(1),
            "seed {seed}: a delete waited {worst:?} ({slow} over 1 s, 4 x 100 deletes in {total:?})"
        );
    }
}

/// Writers that keep a full device at the user floor (three threads of
/// random same-size overwrites, each waiting for the cleaner as it must)
/// and a fourth thread deleting other keys: the deletes' clean-first step
/// (c4b0677) makes each delete compete with the writers for what passes
/// free, up to `OTHERS_ROUNDS` x `wait_rounds` rounds of other threads'
/// passes, and losing passes of its own. Returns (deletes, worst delete,
/// deletes over 1 s, failed deletes, writes refused, run time).
fn deleter_among_writers(
    seed: u64,
    dev: Arc<dyn Device>,
    mkfs: &MkfsOptions,
    secs: u64,
) -> (usize, Duration, usize, usize, usize, Duration) {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let o = LldOptions {
        map_budget_bytes: 256 << 10,
        ..LldOptions::default()
    };
    let lld = Arc::new(Lld::create(dev, mkfs, o).unwrap());
    let mut w = Writer::new(&lld, Load::Small, seed);
    let cap = lld.space().capacity_bytes;
    while lld.space().available_bytes > cap / 10 {
        w.step(&lld).unwrap();
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0xde1);
    let mut keys = w.keys.clone();
    // A third of the keys are the deleter's.
    let mut mine = Vec::new();
    for _ in 0..keys.len() / 3 {
        mine.push(keys.swap_remove(rng.gen_range(0..keys.len())));
    }
    let keys = Arc::new(keys);
    let stop = Arc::new(AtomicBool::new(false));
    let refused = Arc::new(AtomicUsize::new(0));
    let wworst = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let writers: Vec<_> = (0..3u64)
        .map(|t| {
            let (lld, keys, stop, refused, wworst) = (
                lld.clone(),
                keys.clone(),
                stop.clone(),
                refused.clone(),
                wworst.clone(),
            );
            std::thread::spawn(move || {
                let mut rng = ChaCha8Rng::seed_from_u64(seed * 10 + t);
                let mut k = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let (l, i, len) = keys[rng.gen_range(0..keys.len())];
                    k += 1;
                    let t = Instant::now();
                    let r = lld.write(None, l, i, &bytes(k, len));
                    wworst.fetch_max(t.elapsed().as_millis() as u64, Ordering::Relaxed);
                    match r {
                        Ok(()) => {}
                        Err(LdError::NoSpace { .. }) => {
                            refused.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => panic!("{e}"),
                    }
                }
            })
        })
        .collect();
    let t0 = Instant::now();
    let (mut n, mut worst, mut slow, mut failed) = (0, Duration::ZERO, 0, 0);
    while t0.elapsed() < Duration::from_secs(secs) && !mine.is_empty() {
        let (l, i, _) = mine.swap_remove(rng.gen_range(0..mine.len()));
        let t = Instant::now();
        let r = lld.delete(None, l, i);
        let e = t.elapsed();
        n += 1;
        worst = worst.max(e);
        slow += (e > Duration::from_secs(1)) as usize;
        failed += r.is_err() as usize;
        std::thread::sleep(Duration::from_millis(1));
    }
    let run = t0.elapsed();
    stop.store(true, Ordering::Relaxed);
    for h in writers {
        h.join().unwrap();
    }
    eprintln!(
        "  (slowest write {} ms; cleaner {:?})",
        wworst.load(Ordering::Relaxed),
        lld.cleaner_stats()
    );
    (n, worst, slow, failed, refused.load(Ordering::Relaxed), run)
}

/// See `deleter_among_writers`: a delete must not wait more than a second
/// while writers keep the device full. `R16_SECS` (default 20) per run;
/// `R16_DW_BIG` runs 1 GiB alone. Passes on main (worst delete 30 ms at
/// 8 MiB, 170-200 ms at 64 MiB, against 12 and 22 ms on 6cb6e21; at
/// 64 MiB half as many deletes in 20 s).
#[test]
#[ignore = "measure"]
fn a_deleter_among_waiting_writers_does_not_wait_seconds() {
    let secs = std::env::var("R16_SECS").map_or(20, |v| v.parse().unwrap());
    let mut bad = Vec::new();
    for seed in seeds(1..=2) {
        let mut cases = vec![
            (8u64 << 20, mk(128 << 10, 16 << 10)),
            (64 << 20, MkfsOptions::default()),
        ];
        match std::env::var("R16_DW_BIG").as_deref() {
            Ok("64") => cases = vec![(64 << 20, MkfsOptions::default())],
            Ok("256") => cases = vec![(256 << 20, MkfsOptions::default())],
            Ok(_) => cases = vec![(1 << 30, MkfsOptions::default())],
            Err(_) => {}
        }
        for (dev, m) in cases {
            let (n, worst, slow, failed, refused, run) =
                deleter_among_writers(seed, device(dev), &m, secs);
            let line = format!(
                "seed {seed}, {} MiB: {n} deletes in {run:?}, worst {worst:?}, {slow} over 1 s, \
                 {failed} failed; writers refused {refused} times",
                dev >> 20
            );
            eprintln!("{line}");
            if worst > Duration::from_secs(1) || failed > 0 {
                bad.push(line);
            }
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

/// `deleter_among_writers` on a 256 MiB device (default mkfs) that takes
/// as long as a 250 MB/s disk, for 60 s: on main deletes wait as long as
/// the writers (worst 2.0 s, 23 of 11,292 over 1 s; the writers' worst
/// 2.0 s), on 6cb6e21 the worst delete took 0.39 s and none failed (the
/// writers' worst 1.9 s). On 1 GiB (`R16_DW_BIG=1 R16_MBPS=250` on the
/// measure) main's worst delete waited 19-23 s and a writer 40.6 s;
/// 6cb6e21 cannot be filled that far there (writers refused at 70% of
/// the capacity). About 4 minutes.
#[test]
#[ignore = "open (review 16 F2): worst delete 1.6 s among writers on a 250 MB/s disk, one over 1 s in 60 s (22 before the fix, 0.5 s worst at 6cb6e21); 2.5 min"]
fn a_deleter_among_waiting_writers_on_a_disk_does_not_wait_seconds() {
    let seed = seeds(1..=1)[0];
    let (n, worst, slow, failed, refused, run) = deleter_among_writers(
        seed,
        device_at(256 << 20, Some(250.0)),
        &MkfsOptions::default(),
        60,
    );
    let line = format!(
        "seed {seed}, 256 MiB at 250 MB/s: {n} deletes in {run:?}, worst {worst:?}, {slow} \
         over 1 s, {failed} failed; writers refused {refused} times"
    );
    eprintln!("{line}");
    assert!(worst < Duration::from_secs(1) && failed == 0, "{line}");
}

/// A full file system: how close to its stated capacity it fills with
/// small files, and whether unlink, truncate, hole punching and rename
/// still work when it is full. Prints; fails if any freeing operation is
/// refused.
fn fs_full_run(
    dev_bytes: u64,
    mkfs: &MkfsOptions,
    seed: u64,
    small_only: bool,
) -> Result<String, String> {
    use ldfs::fs::{Ctx, FallocMode, Fs, FsError, FsOptions, RenameFlags, SetAttr, ROOT_INO};
    const CTX: Ctx = Ctx {
        uid: 0,
        gid: 0,
        umask: 0,
    };
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let dev = Arc::new(MemoryDevice::new(dev_bytes));
    let lld = Arc::new(Lld::create(dev.clone(), mkfs, LldOptions::default()).unwrap());
    Fs::format(&*lld, CTX).unwrap();
    let ld: Arc<dyn LogicalDisk> = lld.clone();
    let fs = Fs::mount(ld, FsOptions::default()).unwrap();
    let st0 = fs.statfs();
    let dirs: Vec<u64> = (0..16)
        .map(|d| {
            fs.mkdir(CTX, ROOT_INO, format!("d{d}").as_bytes(), 0o755)
                .unwrap()
                .ino
        })
        .collect();
    // Small files, and every 16th a larger one (for truncate and punch).
    let mut files: Vec<(u64, String, u64, usize)> = Vec::new();
    let mut n = 0u64;
    let mut data = 0u64;
    let t0 = Instant::now();
    'fill: loop {
        let dir = dirs[rng.gen_range(0..dirs.len())];
        let name = format!("f{n}");
        n += 1;
        let len = if n.is_multiple_of(16) && !small_only {
            rng.gen_range(64 << 10..256 << 10)
        } else {
            rng.gen_range(100..6000)
        };
        let ino = match fs.mknod(CTX, dir, name.as_bytes(), 0o100644, 0) {
            Ok(a) => a.ino,
            Err(FsError::NoSpace { .. }) => break 'fill,
            Err(e) => return Err(format!("create: {e:?}")),
        };
        match fs.write(ino, 0, &vec![n as u8; len]) {
            Ok(_) => {
                files.push((dir, name, ino, len));
                data += len as u64;
            }
            Err(FsError::NoSpace { .. }) => {
                fs.unlink(dir, name.as_bytes())
                    .map_err(|e| format!("unlink of the file that did not fit: {e:?}"))?;
                break 'fill;
            }
            Err(e) => return Err(format!("write: {e:?}")),
        }
    }
    let st = fs.statfs();
    let mut out = format!(
        "{} MiB seg {} KiB{}: {} files, {} KiB of data = {:.1}% of the stated {} KiB \
         (statfs free now {} KiB) in {:.1}s\n",
        dev_bytes >> 20,
        mkfs.segment_bytes >> 10,
        if small_only { " small files" } else { "" },
        files.len(),
        data >> 10,
        100.0 * data as f64 / (st0.blocks * st0.block_bytes) as f64,
        (st0.blocks * st0.block_bytes) >> 10,
        (st.blocks_free * st.block_bytes) >> 10,
        t0.elapsed().as_secs_f64()
    );
    // Freeing operations on the full file system.
    let mut errs = Vec::new();
    let mut slowest = Duration::ZERO;
    let mut timed = |what: &str, f: &mut dyn FnMut() -> Result<(), FsError>| {
        let t = Instant::now();
        let r = f();
        slowest = slowest.max(t.elapsed());
        if let Err(e) = r {
            errs.push(format!(
                "{what}: {e:?} (free {} blocks)",
                fs.statfs().blocks_free
            ));
        }
    };
    let tf = Instant::now();
    let big: Vec<usize> = (0..files.len())
        .filter(|&i| files[i].3 > if small_only { 5000 } else { 60000 })
        .collect();
    for (k, &i) in big.iter().enumerate().take(40) {
        let ino = files[i].2;
        if k % 2 == 0 {
            timed("punch", &mut || {
                fs.fallocate(
                    ino,
                    if small_only { 0 } else { 8192 },
                    if small_only { 4096 } else { 32768 },
                    FallocMode {
                        keep_size: true,
                        punch_hole: true,
                        zero_range: false,
                    },
                )
            });
        } else {
            timed("truncate", &mut || {
                fs.setattr(
                    ino,
                    &SetAttr {
                        size: Some(if small_only { 1000 } else { 5000 }),
                        ..Default::default()
                    },
                )
                .map(|_| ())
            });
        }
    }
    for k in 0..200 {
        let a = rng.gen_range(0..files.len());
        let b = rng.gen_range(0..files.len());
        if a == b {
            continue;
        }
        let (da, na) = (files[a].0, files[a].1.clone());
        let (db, nb) = (files[b].0, files[b].1.clone());
        if k % 2 == 0 {
            // Rename over another file (frees it).
            timed("rename over", &mut || {
                fs.rename(da, na.as_bytes(), db, nb.as_bytes(), RenameFlags::default())
            });
            let (_, _, ino, len) = files[a];
            files[b] = (db, nb, ino, len);
            files.swap_remove(a);
        } else {
            let nn = format!("r{k}");
            timed("rename", &mut || {
                fs.rename(da, na.as_bytes(), db, nn.as_bytes(), RenameFlags::default())
            });
            files[a].0 = db;
            files[a].1 = nn;
        }
    }
    for _ in 0..files.len() / 4 {
        let (dir, name, _, _) = files.swap_remove(rng.gen_range(0..files.len()));
        timed("unlink", &mut || fs.unlink(dir, name.as_bytes()));
    }
    let st2 = fs.statfs();
    out += &format!(
        "  freeing ops: {} refused, slowest {slowest:?}, all in {:.1}s; statfs free after {} KiB\n",
        errs.len(),
        tf.elapsed().as_secs_f64(),
        (st2.blocks_free * st2.block_bytes) >> 10
    );
    // And it takes new files into what was freed.
    let mut taken = 0u64;
    let target = (st2.blocks_free * st2.block_bytes) / 2;
    while taken < target {
        let dir = dirs[rng.gen_range(0..dirs.len())];
        let name = format!("n{n}");
        n += 1;
        let len = rng.gen_range(100..6000);
        let r = fs
            .mknod(CTX, dir, name.as_bytes(), 0o100644, 0)
            .and_then(|a| fs.write(a.ino, 0, &vec![n as u8; len]));
        if let Err(e) = r {
            errs.push(format!(
                "new file after {taken} of {target} bytes: {e:?} ({:?})",
                lld.space()
            ));
            break;
        }
        taken += len as u64;
    }
    if errs.is_empty() {
        Ok(out)
    } else {
        Err(format!("{out}  {}", errs[..errs.len().min(6)].join("\n  ")))
    }
}

/// A full file system still takes unlink, truncate, hole punching and
/// rename, and new files after them (prints how close to the stated
/// capacity it filled: 94-95% with some large files, 78-87% with small
/// files only, alike on 6cb6e21). On 6cb6e21 the small-file cases of
/// 64 MiB and more refuse unlinks (NoSpace; 928-11,570 freeing operations
/// refused). `R16_BIG=1` adds 256 MiB, `R16_BIG=2` runs 1 GiB alone.
#[test]
fn a_full_file_system_takes_freeing_operations() {
    let mut failed = Vec::new();
    let big = std::env::var("R16_BIG").is_ok();
    for seed in seeds(1..=2) {
        let mut cases = vec![
            (8u64 << 20, mk(256 << 10, 64 << 10), false),
            (8 << 20, mk(256 << 10, 64 << 10), true),
            (64 << 20, MkfsOptions::default(), false),
            (64 << 20, MkfsOptions::default(), true),
        ];
        if big {
            cases.push((256 << 20, MkfsOptions::default(), true));
        }
        if std::env::var("R16_BIG").is_ok_and(|v| v == "2") {
            cases = vec![(1 << 30, MkfsOptions::default(), true)];
        }
        for (dev, m, small) in cases {
            match fs_full_run(dev, &m, seed, small) {
                Ok(s) => eprint!("seed {seed}: {s}"),
                Err(e) => {
                    eprintln!("seed {seed}: FAILED {e}");
                    failed.push(e);
                }
            }
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// statfs against writes: fill with small blocks at random keys to a
/// tenth of the capacity free, then overwrite random keys, and delete a
/// third of the keys and write new ones up to what `available_bytes`
/// says: refusals while it says room (more than 1% of the capacity).
fn honest_run(dev_bytes: u64, mkfs: &MkfsOptions, seed: u64) -> String {
    let lld = Lld::create(
        Arc::new(MemoryDevice::new(dev_bytes)),
        mkfs,
        LldOptions::default(),
    )
    .unwrap();
    let cap = lld.space().capacity_bytes;
    let mut w = Writer::new(&lld, Load::Small, seed);
    while lld.space().available_bytes > cap / 10 {
        w.step(&lld).unwrap();
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x55);
    let n = w.keys.len();
    let (mut refused, mut worst) = (0, 0u64);
    let t = Instant::now();
    for k in 0..n {
        let (l, i, len) = w.keys[rng.gen_range(0..w.keys.len())];
        if let Err(e) = lld.write(None, l, i, &bytes(k as u64, len)) {
            let a = lld.space().available_bytes;
            if a > cap / 100 {
                refused += 1;
                worst = worst.max(a);
            }
            assert!(matches!(e, LdError::NoSpace { .. }), "{e}");
        }
    }
    let over_t = t.elapsed();
    // Delete a third, then write new keys while statfs says room.
    let mut deleted = 0u64;
    for _ in 0..n / 3 {
        let (l, i, len) = w.keys.swap_remove(rng.gen_range(0..w.keys.len()));
        lld.delete(None, l, i).unwrap();
        deleted += len as u64;
    }
    let said = lld.space().available_bytes;
    let (mut refused2, mut worst2, mut wrote) = (0, 0u64, 0u64);
    let mut tries = 0;
    while lld.space().available_bytes > cap / 100 && tries < 4 * n {
        tries += 1;
        let before = lld.space().available_bytes;
        match w.step(&lld) {
            Ok(()) => wrote += w.keys.last().unwrap().2 as u64,
            Err(_) => {
                refused2 += 1;
                worst2 = worst2.max(before);
                if refused2 > 50 {
                    break;
                }
            }
        }
    }
    let s = lld.space();
    lld.close().unwrap();
    format!(
        "{} MiB seg {} KiB: {n} overwrites in {over_t:?}, {refused} refused with room (most {} \
         KiB); deleted {} KiB, statfs then said {} KiB, {} KiB written before it fell to 1% \
         ({refused2} refused with room, most {} KiB; available now {} KiB)\n",
        dev_bytes >> 20,
        mkfs.segment_bytes >> 10,
        worst >> 10,
        deleted >> 10,
        said >> 10,
        wrote >> 10,
        worst2 >> 10,
        s.available_bytes >> 10
    )
}

#[test]
#[ignore = "measure"]
fn measure_statfs_against_writes() {
    let only = std::env::var("R16_DEV").ok();
    for seed in seeds(1..=3) {
        for (dev, m) in [
            (8u64 << 20, mk(128 << 10, 16 << 10)),
            (8 << 20, mk(256 << 10, 64 << 10)),
            (64 << 20, MkfsOptions::default()),
            (256 << 20, MkfsOptions::default()),
        ] {
            if only
                .as_deref()
                .is_some_and(|o| o != format!("{}", dev >> 20))
            {
                continue;
            }
            eprint!("seed {seed}: {}", honest_run(dev, &m, seed));
        }
    }
}

#[allow(dead_code)]
fn unused(_: HashMap<u8, u8>) {}
