//! The cleaner and admission at the edge of a full device (issue 12), from
//! review 9 of `map_allowance` and the cleaner's victim costs (each test
//! failed on the commit its comment names): freeing operations after a
//! checkpoint on a full device, reserved writes, `clean_now` ending, and a
//! device where cleaning no longer gains (writers refused) neither making
//! `clean_now` run for ever nor the idle background cleaner churn.

use std::sync::Arc;

use ldfs::device::MemoryDevice;
use ldfs::ld::{LdError, ListHints, LogicalDisk};
use ldfs::lld::layout::MkfsOptions;
use ldfs::lld::{Lld, LldOptions};

fn mkfs() -> MkfsOptions {
    MkfsOptions {
        segment_bytes: 128 << 10,
        max_block_bytes: 16 << 10,
        reserved_segments: Some(4),
        fs_id: 0x9e9,
        max_bytes: None,
        kept_pages: 0,
    }
}

/// Writes blocks of `list` from `next` on, halving the size on NoSpace,
/// until not even one byte fits; returns the next free index.
fn fill(lld: &Lld, list: ldfs::ld::ListId, mut next: u64) -> u64 {
    let mut len = 16 << 10;
    loop {
        match lld.write(None, list, next, &vec![0x5a; len]) {
            Ok(()) => next += 1,
            Err(LdError::NoSpace { .. }) if len > 1 => len /= 2,
            Err(LdError::NoSpace { .. }) => return next,
            Err(e) => panic!("fill: {e}"),
        }
    }
}

/// Keys written: (list, index, length).
type Keys = Vec<(ldfs::ld::ListId, u64, usize)>;

/// An engine on an 8 MiB device (`mkfs`) with four lists, greedy cleaning
/// and a small map budget, on `opts` otherwise.
fn small_block_engine(opts: LldOptions) -> (Lld, Vec<ldfs::ld::ListId>) {
    engine_on(8 << 20, opts)
}

/// `small_block_engine` on a device of `bytes`.
fn engine_on(bytes: u64, opts: LldOptions) -> (Lld, Vec<ldfs::ld::ListId>) {
    let opts = LldOptions {
        map_budget_bytes: 256 << 10,
        cleaner: ldfs::lld::CleanerOptions {
            policy: ldfs::lld::PolicyKind::Greedy,
            ..opts.cleaner
        },
        ..opts
    };
    let lld = Lld::create(Arc::new(MemoryDevice::new(bytes)), &mkfs(), opts).unwrap();
    let lists = (0..4)
        .map(|_| lld.create_list(None, ListHints::default()).unwrap())
        .collect();
    (lld, lists)
}

/// Writes blocks of 200..1200 bytes at random keys of `lists` until a
/// `1/stop`-th of the capacity is left.
fn fill_random(
    lld: &Lld,
    lists: &[ldfs::ld::ListId],
    rng: &mut rand_chacha::ChaCha8Rng,
    stop: u64,
) -> Keys {
    use rand::Rng;
    let cap = lld.space().capacity_bytes;
    let mut keys = Vec::new();
    while lld.space().available_bytes > cap / stop {
        let l = lists[rng.gen_range(0..lists.len())];
        let i = rng.gen_range(0..1u64 << 40);
        let len = rng.gen_range(200..1200);
        lld.write(None, l, i, &vec![7; len]).unwrap();
        keys.push((l, i, len));
    }
    keys
}

/// A device filled to its capacity while some map leaves were dirty (a
/// few scattered overwrites) is then checkpointed: the leaves become
/// clean, `map_allowance` (part of the footprint) grows with them, and the
/// footprint rises past the capacity with nothing written. A freeing
/// operation (the file system's unlink, rmdir, truncate reserve with
/// `reserve_freeing`) may overdraw the capacity by one segment only, so it
/// now fails with NoSpace: nothing can be deleted through the fs, and
/// nothing lowers the footprint again (writes fail too).
#[test]
fn a_checkpoint_alone_makes_a_full_device_refuse_freeing_reservations() {
    let dev = Arc::new(MemoryDevice::new(8 << 20));
    let lld = Lld::create(dev, &mkfs(), LldOptions::default()).unwrap();
    // 200 full leaves of one-byte blocks, all written out.
    let small = lld.create_list(None, ListHints::default()).unwrap();
    let n = 127 * 200;
    for i in 0..n {
        lld.write(None, small, i, &[i as u8]).unwrap();
    }
    lld.checkpoint_now().unwrap();
    let ckpts = lld.stats().checkpoints;
    // Scattered overwrites: one block in every fifth leaf (below the
    // dirty-page limit, so no checkpoint is due).
    for k in 0..40 {
        lld.write(None, small, 127 * 5 * k, &[0xee]).unwrap();
    }
    let (_, total, dirty) = lld.map_figures();
    eprintln!("map pages {total}, dirty {dirty}");
    // Fill the device to its capacity with other data.
    let big = lld.create_list(None, ListHints::default()).unwrap();
    let written = fill(&lld, big, 0);
    assert_eq!(
        lld.stats().checkpoints,
        ckpts,
        "no checkpoint while filling (else the probe measures nothing)"
    );
    let (_, total, dirty) = lld.map_figures();
    eprintln!(
        "filled: {written} blocks; map pages {total}, dirty {dirty}; space {:?}",
        lld.space()
    );
    // A freeing reservation of 200 bytes, taken back at once.
    let reserve_freeing = |when: &str| {
        let aru = lld.begin_aru().unwrap();
        let r = lld.reserve_freeing(aru, 200);
        lld.abort_aru(aru).unwrap();
        eprintln!("reserve_freeing(200) {when}: {r:?}");
        r
    };
    // Full: a freeing reservation still works.
    let before = reserve_freeing("before the checkpoint");
    before.expect("a freeing reservation on the full device before the checkpoint");
    // A checkpoint: nothing written, nothing freed.
    lld.checkpoint_now().unwrap();
    let (_, total, dirty) = lld.map_figures();
    eprintln!(
        "after the checkpoint: map pages {total}, dirty {dirty}; space {:?}",
        lld.space()
    );
    let after = reserve_freeing("after the checkpoint");
    // And an overwrite of a block with one of the same size.
    let same = lld.write(None, big, 0, &vec![0x77; 16 << 10]);
    eprintln!("same-size overwrite after the checkpoint: {same:?}");
    // (The same-size overwrite fails on 545d315 too: the map pages the
    // checkpoint adds raise the footprint a few pages past the capacity.
    // Only printed.)
    after.expect("a freeing reservation on the full device after a checkpoint");
}

/// The same through the file system: a directory of many small files (one
/// directory bucket each, at hashed keys, so its map leaves are many), a
/// few more files created (their buckets dirty scattered leaves), the file
/// system filled to NoSpace with one large file, then a checkpoint (as the
/// dirty-page or log-byte limit, or a cleaner pass, would begin): unlinking
/// a file — the way to free space on a full file system — now fails with
/// NoSpace, as does deleting the large file itself.
#[test]
fn after_a_checkpoint_a_full_file_system_refuses_every_unlink() {
    use ldfs::fs::{Ctx, Fs, FsError, FsOptions, ROOT_INO};
    const CTX: Ctx = Ctx {
        uid: 0,
        gid: 0,
        umask: 0,
    };
    let dev = Arc::new(MemoryDevice::new(32 << 20));
    let mk = MkfsOptions {
        segment_bytes: 256 << 10,
        max_block_bytes: 64 << 10,
        ..mkfs()
    };
    let opts = LldOptions {
        checkpoint_thread: false,
        log_writer_thread: false,
        ..Default::default()
    };
    let lld = Arc::new(Lld::create(dev, &mk, opts).unwrap());
    Fs::format(&*lld, CTX).unwrap();
    let ld: Arc<dyn LogicalDisk> = lld.clone();
    let fs = Fs::mount(ld, FsOptions::default()).unwrap();
    let d = fs.mkdir(CTX, ROOT_INO, b"d", 0o755).unwrap().ino;
    let files = 12_000;
    for n in 0..files {
        fs.mknod(CTX, d, format!("f{n}").as_bytes(), 0o100644, 0)
            .unwrap();
    }
    lld.checkpoint_now().unwrap();
    let ckpts = lld.stats().checkpoints;
    for n in 0..50 {
        fs.mknod(CTX, d, format!("g{n}").as_bytes(), 0o100644, 0)
            .unwrap();
    }
    let (_, total, dirty) = lld.map_figures();
    eprintln!("map pages {total}, dirty {dirty}");
    let big = fs.mknod(CTX, ROOT_INO, b"big", 0o100644, 0).unwrap().ino;
    let mut off = 0u64;
    let mut len = 16 << 10;
    loop {
        match fs.write(big, off, &vec![0x5a; len]) {
            Ok(n) => off += n as u64,
            Err(FsError::NoSpace { .. }) if len > 512 => len /= 2,
            Err(FsError::NoSpace { .. }) => break,
            Err(e) => panic!("fill: {e:?}"),
        }
    }
    let (_, total, dirty) = lld.map_figures();
    eprintln!(
        "filled {off} bytes; map pages {total}, dirty {dirty}; checkpoints {} (were {ckpts}); space {:?}",
        lld.stats().checkpoints,
        lld.space()
    );
    lld.checkpoint_now().unwrap();
    let (_, total, dirty) = lld.map_figures();
    eprintln!(
        "after the checkpoint: map pages {total}, dirty {dirty}; space {:?}",
        lld.space()
    );
    let small = fs.unlink(d, b"f0");
    let large = fs.unlink(ROOT_INO, b"big");
    eprintln!("unlink f0: {small:?}; unlink big: {large:?}");
    small.expect("unlink of a small file on the full file system");
    large.expect("unlink of the large file on the full file system");
}

/// `cleaner.rs`'s small_blocks_at_random_keys_on_a_device_three_quarters_full
/// with every write made the way the file system makes its writes: in an
/// ARU, after `reserve` for its bytes. `reserve_class` keeps the User floor
/// of `floor_pages`, without `map_allowance`, and the writes it covers are
/// admitted as Meta: the room the allowance keeps for the cleaner to
/// rewrite the map (issue 12) is not kept from them. Passes at 3/4 of the
/// capacity all the same (seeds 1-4): no harm shown.
fn small_random_blocks_reserved(seed: u64, stop: u64, reserved: bool) {
    use ldfs::ld::ListId;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;
    let bytes = |s: u64, len: usize| {
        let mut r = ChaCha8Rng::seed_from_u64(s);
        let mut v = vec![0u8; len];
        r.fill(&mut v[..]);
        v
    };
    let write = |lld: &Lld, l: ListId, i: u64, d: &[u8]| -> Result<(), LdError> {
        if !reserved {
            return lld.write(None, l, i, d);
        }
        let aru = lld.begin_aru()?;
        let r = lld
            .reserve(aru, d.len() as u64)
            .and_then(|()| lld.write(Some(aru), l, i, d));
        match r {
            Ok(()) => lld.end_aru(aru),
            Err(e) => {
                lld.abort_aru(aru)?;
                Err(e)
            }
        }
    };
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let (lld, lists) = small_block_engine(LldOptions::default());
    let cap = lld.space().capacity_bytes;
    let mut keys = Vec::new();
    let mut lens = std::collections::HashMap::new();
    while lld.space().available_bytes > cap / stop {
        let l = lists[rng.gen_range(0..lists.len())];
        let i = rng.gen_range(0..1u64 << 40);
        let len = rng.gen_range(200..1200);
        let s: u64 = rng.gen();
        write(&lld, l, i, &bytes(s, len)).unwrap_or_else(|e| panic!("seed {seed}: fill: {e}"));
        if lens.insert((l.0, i), len).is_none() {
            keys.push((l.0, i));
        }
    }
    let fill = lld.space();
    let mut written = 0u64;
    let mut n = 0u64;
    while written < 3 * (8 << 20) {
        let (l, i) = keys[rng.gen_range(0..keys.len())];
        let len = lens[&(l, i)];
        let s: u64 = rng.gen();
        if let Err(e) = write(&lld, ListId(l), i, &bytes(s, len)) {
            panic!(
                "seed {seed}: overwrite {n} ({written} bytes) of {} blocks: {e}; \
                 filled to {fill:?}, now {:?}, clean/releasable {:?}, {:?}, map {:?}",
                keys.len(),
                lld.space(),
                lld.clean_segment_counts(),
                lld.cleaner_stats(),
                lld.map_figures()
            );
        }
        written += len as u64;
        n += 1;
    }
}

#[test]
fn small_blocks_at_random_keys_three_quarters_full_written_with_reservations() {
    for seed in 1..=4 {
        small_random_blocks_reserved(seed, 4, true);
    }
}

/// `Engine::clean_now` (`ldfs clean` without `--max-segments`) ends when
/// the policy finds no victim or three passes in a row free nothing. On
/// a healthy device neither comes: every pass releases what it cleaned,
/// and its moves and the map pages they dirty leave dead space elsewhere
/// for the next pass (545d315 and 5ee5daa alike). Small blocks at
/// random keys, half the capacity, overwritten once over (no NoSpace
/// here), then `clean_now` under a 20 s watchdog.
#[test]
fn clean_now_ends_on_its_own() {
    use ldfs::lld::PolicyKind;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let (lld, lists) = small_block_engine(LldOptions::default());
    let keys = fill_random(&lld, &lists, &mut rng, 2);
    let mut written = 0;
    while written < 8 << 20 {
        let (l, i, len) = keys[rng.gen_range(0..keys.len())];
        lld.write(None, l, i, &vec![9; len]).unwrap();
        written += len;
    }
    let cancel = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let c2 = cancel.clone();
    std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_secs(20));
        c2.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    let t = std::time::Instant::now();
    let sum = lld
        .clean_now(PolicyKind::Greedy, None, 1.0, &cancel)
        .unwrap();
    eprintln!("clean_now took {:?}: {sum:?}", t.elapsed());
    assert!(!sum.cancelled, "clean_now ran until cancelled: {sum}");
}

/// A full device that refuses overwrites: small blocks at random keys
/// filled until a fiftieth of the capacity is left, then overwritten
/// until an overwrite gets NoSpace (every pass rewrites most of the map,
/// and the map allowance takes what is left: `available_bytes` is 0 with
/// about 10 clean segments; seeds 1-4 all get there). Cleaning still
/// gains a few segments there, but no overwrite fits. Deterministic options. Returns the
/// engine and the keys (list, index, len), or None if no overwrite failed.
/// (At a fifth of the capacity left, seed 1 stayed refused for good on
/// 545d315 and on 5ee5daa, the state issue 12 describes; at a twentieth,
/// seeds 1-4 did until a pass counted each map page once, 7752612.)
fn stuck_device(seed: u64) -> Option<(Lld, Keys)> {
    use ldfs::lld::CleanerOptions;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let (lld, lists) = small_block_engine(LldOptions {
        checkpoint_thread: false,
        log_writer_thread: false,
        cleaner: CleanerOptions {
            idle_ms: 1,
            ..Default::default()
        },
        ..Default::default()
    });
    // LDFS_STUCK_STOP=n fills until 1/n of the capacity is left instead.
    let stop: u64 = std::env::var("LDFS_STUCK_STOP").map_or(50, |v| v.parse().unwrap());
    let keys = fill_random(&lld, &lists, &mut rng, stop);
    for n in 0..100_000 {
        let (l, i, len) = keys[rng.gen_range(0..keys.len())];
        match lld.write(None, l, i, &vec![9; len]) {
            Ok(()) => {}
            Err(LdError::NoSpace { .. }) => {
                eprintln!(
                    "seed {seed}: overwrite {n} refused; space {:?}, clean/releasable {:?}",
                    lld.space(),
                    lld.clean_segment_counts()
                );
                return Some((lld, keys));
            }
            Err(e) => panic!("{e}"),
        }
    }
    None
}

/// On the stuck device: `clean_now` (`ldfs clean`) should end once passes
/// stop freeing anything (545d315: three futile passes, at once). With the
/// fallback victim every pass releases the one victim it cleaned, so it
/// counts as progress, while the clean count stays where it was and
/// overwrites stay refused: `clean_now` runs until cancelled (20 s here).
#[test]
fn on_a_stuck_device_clean_now_ends() {
    use ldfs::lld::PolicyKind;
    let mut stuck = 0;
    for seed in 1..=4 {
        let Some((lld, keys)) = stuck_device(seed) else {
            eprintln!("seed {seed}: not stuck");
            continue;
        };
        stuck += 1;
        let cancel = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let c2 = cancel.clone();
        std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_secs(20));
            c2.store(true, std::sync::atomic::Ordering::Relaxed);
        });
        let t = std::time::Instant::now();
        let sum = lld
            .clean_now(PolicyKind::Greedy, None, 1.0, &cancel)
            .unwrap();
        let ok = keys[..50]
            .iter()
            .filter(|(l, i, len)| lld.write(None, *l, *i, &vec![3; *len]).is_ok())
            .count();
        eprintln!(
            "seed {seed}: clean_now took {:?}: {sum}; then {ok} of 50 overwrites taken",
            t.elapsed()
        );
        if sum.cancelled {
            panic!("seed {seed}: clean_now ran until cancelled: {sum}");
        }
    }
    assert!(
        stuck > 0,
        "no seed reached a refused overwrite: the test tested nothing"
    );
}

/// On the stuck device with the background cleaner on and no user
/// operation at all for 3 s: a pass that frees nothing lets the thread
/// sleep (`idle_ms`; 545d315 makes a few passes), one that releases a
/// segment makes it go on at once. With the fallback victim every pass
/// releases one: the idle device is rewritten continuously.
#[test]
fn on_a_stuck_device_the_background_cleaner_rests() {
    let mut stuck = 0;
    for seed in 1..=4 {
        let Some((lld, _)) = stuck_device(seed) else {
            eprintln!("seed {seed}: not stuck");
            continue;
        };
        stuck += 1;
        let before = lld.cleaner_stats();
        lld.set_background_cleaner(true).unwrap();
        std::thread::sleep(std::time::Duration::from_secs(3));
        lld.set_background_cleaner(false).unwrap();
        let after = lld.cleaner_stats();
        let passes = after.passes - before.passes;
        let moved = after.bytes_moved - before.bytes_moved;
        eprintln!(
            "seed {seed}: idle 3 s: {passes} passes, {moved} bytes moved, {} released; clean/releasable {:?}",
            after.segments_released - before.segments_released,
            lld.clean_segment_counts()
        );
        assert!(
            moved < 8 << 20,
            "seed {seed}: the idle background cleaner moved {moved} bytes (an 8 MiB device) in 3 s"
        );
    }
    assert!(
        stuck > 0,
        "no seed reached a refused overwrite: the test tested nothing"
    );
}

/// A number from the environment, or `default`.
fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).map_or(default, |v| v.parse().expect("a number"))
}

/// `map_allowance` now takes the average block size from the live bytes,
/// which count map pages: a checkpoint that frees map pages (leaves merged
/// or emptied by deletes) lowers the average and may raise the allowance,
/// part of the User footprint. Small blocks at random keys, the device
/// filled to a twentieth of its capacity left, then rounds of scattered
/// deletes each followed by a checkpoint: `available_bytes` must not drop
/// across a checkpoint (nothing written).
#[test]
fn a_checkpoint_after_deletes_does_not_lower_available_space() {
    use rand::{Rng, SeedableRng};
    let mut drops = Vec::new();
    for seed in 1..=3u64 {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let (lld, lists) = small_block_engine(LldOptions {
            checkpoint_thread: false,
            log_writer_thread: false,
            ..Default::default()
        });
        let mut keys: Vec<_> = fill_random(&lld, &lists, &mut rng, 20)
            .into_iter()
            .map(|(l, i, _)| (l, i))
            .collect();
        lld.checkpoint_now().unwrap();
        for round in 0..8 {
            for _ in 0..keys.len() / 10 {
                if keys.is_empty() {
                    break;
                }
                let (l, i) = keys.swap_remove(rng.gen_range(0..keys.len()));
                lld.delete(None, l, i).unwrap();
            }
            let before = lld.space();
            let (_, total0, dirty0) = lld.map_figures();
            lld.checkpoint_now().unwrap();
            let after = lld.space();
            let (_, total1, dirty1) = lld.map_figures();
            eprintln!(
                "seed {seed} round {round}: keys {} map pages {total0}/{dirty0} -> {total1}/{dirty1}; available {} -> {}, live {} -> {}",
                keys.len(),
                before.available_bytes,
                after.available_bytes,
                before.live_bytes,
                after.live_bytes
            );
            if after.available_bytes < before.available_bytes {
                drops.push(format!(
                    "seed {seed} round {round}: available {} -> {} across a checkpoint",
                    before.available_bytes, after.available_bytes
                ));
            }
        }
    }
    assert!(drops.is_empty(), "{}", drops.join("\n"));
}

/// Mixed block sizes: the average block size (what `map_allowance` now
/// divides a segment by) comes mostly from large cold blocks, while the
/// victims the cleaner works on hold small hot blocks at random keys, each
/// dirtying its own leaf (the issue 12 case). 32 MiB, large 16 KiB blocks
/// to about 55% of the capacity, small 200..1200-byte blocks at random keys
/// until a fifth is left, then random overwrites of the small blocks:
/// counts the refused ones (NoSpace) and whether they stay refused. Where
/// `space()` still says a twentieth is available, 1b04e32 refuses about
/// 1.3% of the overwrites (seed 1: 200 in a row, for good) and the cleaner
/// moves ~1 GB for 70 MB written; bcbc64e refuses none.
#[test]
fn mixed_sizes_small_overwrites_are_not_refused_for_good() {
    use ldfs::ld::LdError;
    use rand::{Rng, SeedableRng};
    let seed = env_u64("LDFS_SEED", 1);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let (lld, lists) = engine_on(
        32 << 20,
        LldOptions {
            checkpoint_thread: false,
            log_writer_thread: false,
            ..Default::default()
        },
    );
    let big = lld.create_list(None, ListHints::default()).unwrap();
    let cap = lld.space().capacity_bytes;
    let mut n = 0;
    while lld.space().available_bytes > cap * 45 / 100 {
        lld.write(None, big, n, &vec![5; 16 << 10]).unwrap();
        n += 1;
    }
    let keys = fill_random(&lld, &lists, &mut rng, env_u64("LDFS_MIXED_STOP", 20));
    let (_, total, _) = lld.map_figures();
    eprintln!(
        "{n} large, {} small blocks; map pages {total}; space {:?}",
        keys.len(),
        lld.space()
    );
    let (mut refused, mut in_row, mut max_row) = (0u64, 0u64, 0u64);
    let t = std::time::Instant::now();
    let total_ops = env_u64("LDFS_MIXED_OPS", 100_000);
    let mut done = 0;
    for _ in 0..total_ops {
        let (l, i, len) = keys[rng.gen_range(0..keys.len())];
        done += 1;
        match lld.write(None, l, i, &vec![9; len]) {
            Ok(()) => in_row = 0,
            Err(LdError::NoSpace { .. }) => {
                refused += 1;
                in_row += 1;
                max_row = max_row.max(in_row);
                if in_row >= 200 {
                    break;
                }
            }
            Err(e) => panic!("{e}"),
        }
    }
    eprintln!(
        "seed {seed}: {done} overwrites in {:?}: {refused} refused, longest run {max_row}; clean/releasable {:?}; cleaner {:?}",
        t.elapsed(),
        lld.clean_segment_counts(),
        lld.cleaner_stats()
    );
    // bcbc64e (the allowance from every map page): seeds 1-3 refuse none.
    assert!(in_row < 200, "refused for good");
    assert_eq!(refused, 0, "small overwrites refused");
}

/// The file system's side of review 14's F1 (deletes alone leave the
/// cleaner no room): 39,000 small files (inline in their inode records) in
/// 16 directories fill a 64 MiB file system to NoSpace, a random half is
/// unlinked, and then new files, a third of what was freed, must all be
/// written. Every unlink dirties scattered map leaves (the directory's
/// bucket, the inode record); admitted down to the freeing floor without
/// letting the cleaner make room first, the unlinks sank the log below the
/// room a cleaning pass needs, and unlink itself got NoSpace after a few
/// thousand (seed 7). Seeded (`LDFS_SEED`).
#[test]
fn a_full_file_system_with_half_its_small_files_unlinked_takes_new_files() {
    use ldfs::fs::{Ctx, Fs, FsError, FsOptions, ROOT_INO};
    use rand::{Rng, SeedableRng};
    const CTX: Ctx = Ctx {
        uid: 0,
        gid: 0,
        umask: 0,
    };
    let seed = env_u64("LDFS_SEED", 7);
    eprintln!("replay: LDFS_SEED={seed}");
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let dev = Arc::new(MemoryDevice::new(64 << 20));
    let mk = MkfsOptions {
        segment_bytes: 256 << 10,
        max_block_bytes: 64 << 10,
        ..mkfs()
    };
    let lld = Arc::new(Lld::create(dev.clone(), &mk, LldOptions::default()).unwrap());
    Fs::format(&*lld, CTX).unwrap();
    let ld: Arc<dyn LogicalDisk> = lld.clone();
    let fs = Fs::mount(ld, FsOptions::default()).unwrap();
    let dirs: Vec<u64> = (0..16)
        .map(|d| {
            fs.mkdir(CTX, ROOT_INO, format!("d{d}").as_bytes(), 0o755)
                .unwrap()
                .ino
        })
        .collect();
    let mut files: Vec<(u64, String, usize)> = Vec::new();
    let mut n = 0u64;
    'fill: loop {
        let dir = dirs[rng.gen_range(0..dirs.len())];
        let name = format!("f{n}");
        n += 1;
        let len = rng.gen_range(100..1500);
        let ino = match fs.mknod(CTX, dir, name.as_bytes(), 0o100644, 0) {
            Ok(a) => a.ino,
            Err(FsError::NoSpace { .. }) => break 'fill,
            Err(e) => panic!("seed {seed}: create: {e:?}"),
        };
        match fs.write(ino, 0, &vec![n as u8; len]) {
            Ok(_) => files.push((dir, name, len)),
            Err(FsError::NoSpace { .. }) => {
                fs.unlink(dir, name.as_bytes()).unwrap();
                break 'fill;
            }
            Err(e) => panic!("seed {seed}: write: {e:?}"),
        }
    }
    let filled = lld.space();
    eprintln!("filled: {} files, {filled:?}", files.len());
    let mut freed = 0;
    for _ in 0..files.len() / 2 {
        let (dir, name, len) = files.swap_remove(rng.gen_range(0..files.len()));
        fs.unlink(dir, name.as_bytes())
            .unwrap_or_else(|e| panic!("seed {seed}: unlink: {e:?} at {:?}", lld.space()));
        freed += len;
    }
    let after = lld.space();
    let mut written = 0;
    while written < freed / 3 {
        let dir = dirs[rng.gen_range(0..dirs.len())];
        let name = format!("n{n}");
        n += 1;
        let len = rng.gen_range(100..1500);
        let r = fs
            .mknod(CTX, dir, name.as_bytes(), 0o100644, 0)
            .and_then(|a| fs.write(a.ino, 0, &vec![n as u8; len]));
        if let Err(e) = r {
            panic!(
                "seed {seed}: new file after {written} of {} bytes: {e:?}; filled {filled:?} \
                 ({} files), after unlinks {after:?}, now {:?}, clean/releasable {:?}, {:?}",
                freed / 3,
                files.len() * 2,
                lld.space(),
                lld.clean_segment_counts(),
                lld.cleaner_stats()
            );
        }
        written += len;
    }
    drop(fs);
    let lld = Arc::into_inner(lld).expect("file system gone");
    lld.close().unwrap();
    let lld = Arc::new(Lld::open(dev, LldOptions::default()).unwrap());
    let ld: Arc<dyn LogicalDisk> = lld.clone();
    let fs = Fs::mount(ld, FsOptions::default()).unwrap();
    for (dir, name, len) in &files {
        let a = fs.lookup(*dir, name.as_bytes()).unwrap();
        assert_eq!(a.size, *len as u64, "seed {seed}: {name}");
    }
}
