//! Review 19's probes of the ARU-end coalescing (a800d5a): at an ARU's end, buffered writes it replaced (of ARUs
//! that have ended, or of none) are dropped when its end record joins them
//! in the same open partial segment and no open ARU's undo chain names the
//! key (DESIGN.md, engine invariant 5).
//!
//! Targeted sequences first (each checks reads, the abort result, what a
//! crash keeps before and after the flush, and the live-byte accounting),
//! then a model-checked crash mix built for the coalescing: few hot keys,
//! several ARUs open at once, aborts, range and list deletes, cleaning,
//! and partial segments sealed at random sizes.
//!
//! `LDFS_COALESCE_CYCLES` sets the crash cycles (600 by default),
//! `LDFS_SEED` the base seed.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};

use ldfs::device::{CrashDevice, CrashOptions};
use ldfs::ld::{AruId, LdError, ListHints, ListId, LogicalDisk};
use ldfs::lld::layout::MkfsOptions;
use ldfs::lld::{CleanerOptions, Key, Lld, LldOptions, PolicyKind};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn mkfs(segment_bytes: u64) -> MkfsOptions {
    MkfsOptions {
        segment_bytes,
        max_block_bytes: 32 << 10,
        reserved_segments: Some(4),
        fs_id: 0xc0a1,
        max_bytes: None,
        kept_pages: 0,
    }
}

fn opts(partial_bytes: usize) -> LldOptions {
    LldOptions {
        partial_bytes,
        checkpoint_thread: false,
        log_writer_thread: false,
        ..Default::default()
    }
}

fn usage_is_exact(lld: &Lld, when: &str) {
    assert_eq!(lld.accounting_drift(), 0, "{when}: accounting drifted");
    let problems = lld.check_usage().unwrap();
    assert!(problems.is_empty(), "{when}: {problems:?}");
}

/// What a crash right now keeps of everything flushed.
fn open_durable(dev: &CrashDevice) -> Lld {
    let lld = Lld::open(
        Arc::new(CrashDevice::from_image(dev.durable_image())),
        opts(1 << 20),
    )
    .unwrap();
    usage_is_exact(&lld, "reopened durable image");
    lld
}

/// What a crash right now keeps if every write issued reached the device
/// (nothing torn): the sealed partials, flushed or not.
fn open_all_written(dev: &CrashDevice) -> Lld {
    let image = dev.crash_image(
        1,
        &CrashOptions {
            keep_probability: 1.0,
            tear_probability: 0.0,
        },
    );
    let lld = Lld::open(Arc::new(CrashDevice::from_image(image)), opts(1 << 20)).unwrap();
    usage_is_exact(&lld, "reopened image with every write kept");
    lld
}

fn fresh(partial: usize) -> (Arc<CrashDevice>, Lld, ListId) {
    let dev = Arc::new(CrashDevice::new(16 << 20));
    let lld = Lld::create(dev.clone(), &mkfs(128 << 10), opts(partial)).unwrap();
    let a = lld.create_list(None, ListHints::default()).unwrap();
    lld.write(None, a, 0, b"base").unwrap();
    lld.flush().unwrap();
    (dev, lld, a)
}

fn get(lld: &Lld, l: ListId, i: u64) -> Option<Vec<u8>> {
    lld.read(l, i).unwrap()
}

fn coalesced(lld: &Lld) -> u64 {
    lld.stats().writes_coalesced
}

/// A writes k, B overwrites it, A ends, then B ends: A's write is dropped
/// at B's end; a crash keeps base or B's version, never A's alone.
#[test]
fn an_open_aru_write_replaced_then_ended_is_dropped_at_the_replacers_end() {
    let (dev, lld, l) = fresh(1 << 20);
    let c0 = coalesced(&lld);
    let a = lld.begin_aru().unwrap();
    let b = lld.begin_aru().unwrap();
    lld.write(Some(a), l, 0, b"A").unwrap();
    lld.write(Some(b), l, 0, b"B").unwrap();
    lld.end_aru(a).unwrap();
    assert_eq!(coalesced(&lld), c0, "A's end must not drop its own write");
    lld.end_aru(b).unwrap();
    assert_eq!(coalesced(&lld), c0 + 1);
    assert_eq!(get(&lld, l, 0).unwrap(), b"B");
    let early = open_all_written(&dev);
    assert_eq!(get(&early, l, 0).unwrap(), b"base");
    early.abandon();
    lld.flush().unwrap();
    let after = open_durable(&dev);
    assert_eq!(get(&after, l, 0).unwrap(), b"B");
    after.abandon();
    usage_is_exact(&lld, "live");
}

/// The brief's sequence: k written by A, replaced by B, deleted outside
/// any ARU, then A and B end (B's write went with the delete already).
#[test]
fn a_write_replaced_then_deleted_outside_arus() {
    for abort_b in [false, true] {
        let (dev, lld, l) = fresh(1 << 20);
        let a = lld.begin_aru().unwrap();
        let b = lld.begin_aru().unwrap();
        lld.write(Some(a), l, 0, b"A").unwrap();
        lld.write(Some(b), l, 0, b"B").unwrap();
        lld.write(Some(b), l, 1, b"B1").unwrap();
        lld.delete(None, l, 0).unwrap();
        lld.end_aru(a).unwrap();
        if abort_b {
            lld.abort_aru(b).unwrap();
            assert_eq!(get(&lld, l, 1), None);
        } else {
            lld.end_aru(b).unwrap();
            assert_eq!(get(&lld, l, 1).unwrap(), b"B1");
        }
        assert_eq!(get(&lld, l, 0), None);
        lld.flush().unwrap();
        let after = open_durable(&dev);
        assert_eq!(get(&after, l, 0), None);
        assert_eq!(get(&after, l, 1).is_some(), !abort_b);
        after.abandon();
        usage_is_exact(&lld, "live");
    }
}

/// No-ARU write, B overwrites, C (open) deletes a range over it, B ends
/// (C's chain names the key: kept), then C ends or aborts.
#[test]
fn a_range_delete_by_an_open_aru_keeps_the_replaced_write() {
    for abort_c in [false, true] {
        let (dev, lld, l) = fresh(1 << 20);
        lld.write(None, l, 3, b"none").unwrap();
        let b = lld.begin_aru().unwrap();
        lld.write(Some(b), l, 3, b"B").unwrap();
        let c = lld.begin_aru().unwrap();
        lld.delete_range(Some(c), l, 0..10).unwrap();
        let c0 = coalesced(&lld);
        lld.end_aru(b).unwrap();
        assert_eq!(coalesced(&lld), c0, "C's chain names the key");
        if abort_c {
            lld.abort_aru(c).unwrap();
            assert_eq!(get(&lld, l, 3).unwrap(), b"B");
            assert_eq!(get(&lld, l, 0).unwrap(), b"base");
        } else {
            lld.end_aru(c).unwrap();
            assert_eq!(get(&lld, l, 3), None);
        }
        let early = open_all_written(&dev);
        assert_eq!(get(&early, l, 0).unwrap(), b"base");
        assert_eq!(get(&early, l, 3), None);
        early.abandon();
        lld.flush().unwrap();
        let after = open_durable(&dev);
        if abort_c {
            assert_eq!(get(&after, l, 3).unwrap(), b"B");
            assert_eq!(get(&after, l, 0).unwrap(), b"base");
        } else {
            assert_eq!(get(&after, l, 3), None);
            assert_eq!(get(&after, l, 0), None);
        }
        after.abandon();
        usage_is_exact(&lld, "live");
    }
}

/// A range delete by an open ARU first (a bulk in undo), then B writes the
/// key: B's write replaced nothing; C's delete replaced the no-ARU write.
#[test]
fn a_bulk_removed_write_is_dropped_only_at_the_deleters_end() {
    for abort_c in [false, true] {
        let (dev, lld, l) = fresh(1 << 20);
        lld.write(None, l, 3, b"none").unwrap();
        lld.write(None, l, 4, b"none4").unwrap();
        let c = lld.begin_aru().unwrap();
        lld.delete_range(Some(c), l, 1..10).unwrap();
        let b = lld.begin_aru().unwrap();
        lld.write(Some(b), l, 3, b"B").unwrap();
        lld.end_aru(b).unwrap();
        if abort_c {
            lld.abort_aru(c).unwrap();
            assert_eq!(get(&lld, l, 4).unwrap(), b"none4");
        } else {
            lld.end_aru(c).unwrap();
            assert_eq!(get(&lld, l, 4), None);
        }
        assert_eq!(get(&lld, l, 3).unwrap(), b"B");
        lld.flush().unwrap();
        let after = open_durable(&dev);
        assert_eq!(get(&after, l, 3).unwrap(), b"B");
        assert_eq!(get(&after, l, 4).is_some(), abort_c);
        after.abandon();
        usage_is_exact(&lld, "live");
    }
}

/// A list created and filled outside ARUs, deleted by an ARU that ends in
/// the same partial: its entry and blocks are dropped. The list stays gone
/// after a crash (a later list keeps the ids above it; without one, see the
/// ignored test below).
#[test]
fn a_list_created_outside_arus_and_deleted_by_an_aru() {
    let (dev, lld, _) = fresh(1 << 20);
    lld.checkpoint_now().unwrap();
    let l = lld.create_list(None, ListHints::default()).unwrap();
    for i in 0..5 {
        lld.write(None, l, i, b"doomed").unwrap();
    }
    let c0 = coalesced(&lld);
    let b = lld.begin_aru().unwrap();
    lld.delete_list(Some(b), l).unwrap();
    lld.end_aru(b).unwrap();
    let dropped = coalesced(&lld) - c0;
    assert_eq!(dropped, 6, "the list entry and its five blocks");
    let m = lld.create_list(None, ListHints::default()).unwrap();
    assert!(m.0 > l.0);
    lld.write(None, m, 0, b"m").unwrap();
    lld.flush().unwrap();
    let after = open_durable(&dev);
    assert!(after.list_hints(l).unwrap().is_none());
    assert_eq!(get(&after, m, 0).unwrap(), b"m");
    let n = after.create_list(None, ListHints::default()).unwrap();
    assert!(n.0 > m.0, "list id {} handed out again after recovery", n.0);
    after.abandon();
}

/// A list created (in an ARU that ended, as the file system creates a
/// file's list) and deleted by a later ARU whose end joins them in the same
/// partial leaves no write naming it in the log; roll-forward derived
/// `next_list` from write records only, so after a crash its id was handed
/// out again (review 19; also, before coalescing, for a delete outside
/// ARUs, the second case). Roll-forward and rebuild now count the
/// `DeleteList` record too.
#[test]
fn a_list_deleted_in_its_creating_partial_is_not_handed_out_again_after_a_crash() {
    let mut reused = Vec::new();
    for in_arus in [true, false] {
        let (dev, lld, _) = fresh(1 << 20);
        lld.checkpoint_now().unwrap();
        let x = in_arus.then(|| lld.begin_aru().unwrap());
        let l = lld.create_list(x, ListHints::default()).unwrap();
        lld.write(x, l, 0, b"doomed").unwrap();
        if let Some(x) = x {
            lld.end_aru(x).unwrap();
        }
        let y = in_arus.then(|| lld.begin_aru().unwrap());
        lld.delete_list(y, l).unwrap();
        if let Some(y) = y {
            lld.end_aru(y).unwrap();
        }
        lld.flush().unwrap();
        let after = open_durable(&dev);
        let n = after.create_list(None, ListHints::default()).unwrap();
        if n.0 <= l.0 {
            reused.push(format!("in ARUs {in_arus}: list {} handed out again", l.0));
        }
        after.abandon();
    }
    assert!(reused.is_empty(), "after a crash: {reused:?}");
}

/// The cleaner's move of a block (a write of no ARU, with an age) replaced
/// by an ARU's write: dropped at the ARU's end; the victim still reads
/// right until the checkpoint, and the accounting stays exact.
#[test]
fn a_cleaner_move_replaced_by_an_aru_write() {
    let (dev, lld, l) = fresh(1 << 20);
    lld.write(None, l, 7, b"seven").unwrap();
    lld.checkpoint_now().unwrap();
    let key = Key::new(l, 7);
    let e = lld.map_entry(key).unwrap().unwrap();
    assert!(lld.relocate(key, &e).unwrap(), "moved");
    let c0 = coalesced(&lld);
    let b = lld.begin_aru().unwrap();
    lld.write(Some(b), l, 7, b"B").unwrap();
    lld.end_aru(b).unwrap();
    assert_eq!(coalesced(&lld), c0 + 1);
    usage_is_exact(&lld, "live, before the flush");
    let early = open_all_written(&dev);
    assert_eq!(get(&early, l, 7).unwrap(), b"seven");
    early.abandon();
    lld.flush().unwrap();
    let after = open_durable(&dev);
    assert_eq!(get(&after, l, 7).unwrap(), b"B");
    after.abandon();
    lld.checkpoint_now().unwrap();
    usage_is_exact(&lld, "after the checkpoint");
    let after = open_durable(&dev);
    assert_eq!(get(&after, l, 7).unwrap(), b"B");
    after.abandon();
}

fn fresh_with(segment_bytes: u64, big: usize) -> (Arc<CrashDevice>, Lld, ListId) {
    let dev = Arc::new(CrashDevice::new(16 << 20));
    let lld = Lld::create(dev.clone(), &mkfs(segment_bytes), opts(usize::MAX)).unwrap();
    let a = lld.create_list(None, ListHints::default()).unwrap();
    lld.write(None, a, 0, b"base").unwrap();
    lld.flush().unwrap();
    lld.write(None, a, 1, b"none").unwrap();
    // Data that fills most of the segment (the segment-full case).
    for i in 0..big {
        lld.write(None, a, 100 + i as u64, &vec![i as u8; 32 << 10])
            .unwrap();
    }
    (dev, lld, a)
}

/// The end record that makes the partial seal (its summary full, or the
/// segment full) lands in the next partial: nothing is dropped, and a
/// crash keeping the first partial alone keeps the no-ARU version. For
/// each shift (`ranges` range deletes of 33 bytes before the 25-byte
/// deletes) a first run finds how many deletes seal the partial; a second
/// stops one short and ends the ARU there.
#[test]
fn an_end_record_pushed_into_the_next_partial_drops_nothing() {
    let mut sides = [0u32; 2];
    for (segment_bytes, big) in [(256u64 << 10, 0usize), (128 << 10, 3)] {
        for ranges in 0..12u64 {
            let filler = |lld: &Lld, l: ListId, upto: Option<u64>| -> u64 {
                for r in 0..ranges {
                    lld.delete_range(None, l, 5000 + 10 * r..5005 + 10 * r)
                        .unwrap();
                }
                let start = lld.stats().partials_written;
                let mut i = 0;
                loop {
                    if upto == Some(i) {
                        return i;
                    }
                    lld.delete(None, l, 1000 + i).unwrap();
                    i += 1;
                    if upto.is_none() && lld.stats().partials_written > start {
                        return i;
                    }
                }
            };
            let (_, lld, l) = fresh_with(segment_bytes, big);
            let b = lld.begin_aru().unwrap();
            lld.write(Some(b), l, 1, b"B").unwrap();
            let sealing = filler(&lld, l, None);
            lld.abandon();

            let (dev, lld, l) = fresh_with(segment_bytes, big);
            let b = lld.begin_aru().unwrap();
            lld.write(Some(b), l, 1, b"B").unwrap();
            let sealed = lld.stats().partials_written;
            filler(&lld, l, Some(sealing - 1));
            assert_eq!(lld.stats().partials_written, sealed);
            let c0 = coalesced(&lld);
            lld.end_aru(b).unwrap();
            let end_sealed = lld.stats().partials_written > sealed;
            let dropped = coalesced(&lld) - c0;
            sides[end_sealed as usize] += 1;
            let what = format!("segment {segment_bytes} ranges {ranges}");
            if end_sealed {
                assert_eq!(dropped, 0, "{what}: the end went to the next partial");
                let early = open_all_written(&dev);
                assert_eq!(get(&early, l, 1).unwrap(), b"none", "{what}");
                early.abandon();
            } else {
                assert_eq!(dropped, 1, "{what}");
                // Nothing of the open partial reached the device.
                let early = open_all_written(&dev);
                assert_eq!(get(&early, l, 1), None, "{what}");
                early.abandon();
            }
            assert_eq!(get(&lld, l, 1).unwrap(), b"B");
            lld.flush().unwrap();
            let after = open_durable(&dev);
            assert_eq!(get(&after, l, 1).unwrap(), b"B", "{what}");
            after.abandon();
            usage_is_exact(&lld, "live");
        }
    }
    eprintln!(
        "end record: in the same partial {}, sealed it {}",
        sides[0], sides[1]
    );
    assert!(
        sides[0] > 0 && sides[1] > 0,
        "the probe never hit both sides of the boundary: {sides:?}"
    );
}

/// Aborts after a coalescing: A and B rewrite k, C changes another key and
/// k; B's end keeps A's write while C is open; C aborts.
#[test]
fn an_abort_after_coalescing_restores_the_right_versions() {
    let (dev, lld, l) = fresh(1 << 20);
    let a = lld.begin_aru().unwrap();
    lld.write(Some(a), l, 0, b"A").unwrap();
    lld.end_aru(a).unwrap();
    let b = lld.begin_aru().unwrap();
    lld.write(Some(b), l, 0, b"B").unwrap();
    let c = lld.begin_aru().unwrap();
    lld.write(Some(c), l, 5, b"C5").unwrap();
    lld.end_aru(b).unwrap(); // A's write dropped (C does not name key 0)
    lld.write(Some(c), l, 0, b"C").unwrap();
    let d = lld.begin_aru().unwrap();
    lld.write(Some(d), l, 0, b"D").unwrap();
    lld.end_aru(d).unwrap(); // C's write kept (C open), C's chain names 0
    lld.abort_aru(c).unwrap();
    assert_eq!(get(&lld, l, 0).unwrap(), b"D");
    assert_eq!(get(&lld, l, 5), None);
    let e = lld.begin_aru().unwrap();
    lld.write(Some(e), l, 0, b"E").unwrap();
    lld.abort_aru(e).unwrap();
    assert_eq!(get(&lld, l, 0).unwrap(), b"D");
    lld.flush().unwrap();
    let after = open_durable(&dev);
    assert_eq!(get(&after, l, 0).unwrap(), b"D");
    assert_eq!(get(&after, l, 5), None);
    after.abandon();
    usage_is_exact(&lld, "live");
}

/// Threads rewrite one hot block in ARUs (each also its own block), others
/// read it and flush, with the log writer thread on and small partials:
/// every read finds a version some thread wrote, nothing panics, and a
/// crash after the last flush keeps each thread's last own block.
#[test]
fn concurrent_arus_readers_and_flushes_on_a_hot_block() {
    let dev = Arc::new(CrashDevice::new(32 << 20));
    let o = LldOptions {
        log_writer_thread: true,
        checkpoint_thread: true,
        partial_bytes: 6 << 10,
        ..Default::default()
    };
    let lld = Arc::new(Lld::create(dev.clone(), &mkfs(128 << 10), o).unwrap());
    let l = lld.create_list(None, ListHints::default()).unwrap();
    lld.write(None, l, 0, b"t9 i0").unwrap();
    lld.flush().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let start = Arc::new(Barrier::new(5));
    let mut writers = Vec::new();
    for t in 0..3u64 {
        let lld = lld.clone();
        let start = start.clone();
        writers.push(std::thread::spawn(move || {
            start.wait();
            let mut last = 0;
            for i in 1..=400u64 {
                let a = lld.begin_aru().unwrap();
                let v = format!("t{t} i{i}");
                lld.write(Some(a), l, 0, v.as_bytes()).unwrap();
                lld.write(Some(a), l, 1 + t, v.as_bytes()).unwrap();
                if i % 7 == 0 {
                    lld.abort_aru(a).unwrap();
                } else {
                    lld.end_aru(a).unwrap();
                    last = i;
                }
                if i % 50 == 0 {
                    lld.flush().unwrap();
                }
            }
            lld.flush().unwrap();
            last
        }));
    }
    let mut readers = Vec::new();
    for _ in 0..2 {
        let lld = lld.clone();
        let stop = stop.clone();
        let start = start.clone();
        readers.push(std::thread::spawn(move || {
            start.wait();
            let mut n = 0u64;
            while n == 0 || !stop.load(Ordering::Relaxed) {
                let v = lld.read(l, 0).unwrap().expect("hot block present");
                let s = String::from_utf8(v).unwrap();
                assert!(s.starts_with('t') && s.contains(" i"), "read {s:?}");
                let r = lld.read_range(l, 0..10, 10).unwrap();
                assert!(!r.is_empty());
                n += 1;
            }
            n
        }));
    }
    let lasts: Vec<u64> = writers.into_iter().map(|w| w.join().unwrap()).collect();
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        assert!(r.join().unwrap() > 0);
    }
    assert!(coalesced(&lld) > 0, "nothing coalesced");
    usage_is_exact(&lld, "live");
    let after = open_durable(&dev);
    for t in 0..3u64 {
        let want = format!("t{t} i{}", lasts[t as usize]);
        assert_eq!(get(&after, l, 1 + t).unwrap(), want.as_bytes());
    }
    let hot = String::from_utf8(get(&after, l, 0).unwrap()).unwrap();
    assert!(
        (0..3).any(|t| hot.starts_with(&format!("t{t} "))),
        "hot block {hot:?}"
    );
    after.abandon();
}

// ---- the model-checked crash mix ------------------------------------------

type Block = Arc<[u8]>;

#[derive(Clone, Debug)]
enum Op {
    CreateList(u64),
    DeleteList(u64),
    Write(u64, u64, Block),
    Delete(u64, u64),
    DeleteRange(u64, u64, u64),
    End,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct State {
    lists: BTreeMap<u64, BTreeMap<u64, Block>>,
}

impl State {
    fn apply(&mut self, op: &Op) {
        match op {
            Op::CreateList(l) => {
                self.lists.insert(*l, BTreeMap::new());
            }
            Op::DeleteList(l) => {
                self.lists.remove(l);
            }
            Op::Write(l, i, d) => {
                self.lists
                    .get_mut(l)
                    .expect("model list")
                    .insert(*i, d.clone());
            }
            Op::Delete(l, i) => {
                if let Some(b) = self.lists.get_mut(l) {
                    b.remove(i);
                }
            }
            Op::DeleteRange(l, a, z) => {
                if let Some(b) = self.lists.get_mut(l) {
                    b.retain(|i, _| !(a..z).contains(&i));
                }
            }
            Op::End => {}
        }
    }
}

struct History {
    base: State,
    log: Vec<(u64, Op)>,
    flushed: usize,
}

impl History {
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
    fn live(&self) -> State {
        let mut s = self.base.clone();
        for (_, op) in &self.log {
            s.apply(op);
        }
        s
    }
}

fn read_state(lld: &Lld, universe: u64) -> State {
    let mut s = State::default();
    for l in 1..universe {
        let list = ListId(l);
        if lld.list_hints(list).unwrap().is_none() {
            continue;
        }
        let blocks: BTreeMap<u64, Block> = lld
            .read_range(list, 0..u64::MAX, usize::MAX)
            .unwrap_or_else(|e| panic!("read list {l}: {e}"))
            .into_iter()
            .map(|(i, d)| (i, d.into()))
            .collect();
        let idx = lld.indices(list, 0, usize::MAX).unwrap();
        assert!(blocks.keys().copied().eq(idx.iter().copied()));
        s.lists.insert(l, blocks);
    }
    s
}

fn mix_options(partial: usize) -> LldOptions {
    LldOptions {
        log_writer_thread: false,
        map_budget_bytes: 48 << 10,
        checkpoint_log_bytes: 96 << 10,
        checkpoint_dirty_pages: Some(24),
        partial_bytes: partial,
        cleaner: CleanerOptions {
            aru_wait_ms: 0,
            ..Default::default()
        },
        checkpoint_thread: false,
        ..Default::default()
    }
}

const MAX_LISTS: usize = 6;

struct Mix<'a> {
    lld: &'a Lld,
    rng: ChaCha8Rng,
    hist: History,
    next_list: u64,
    open: Vec<AruId>,
    cut: bool,
    dead: bool,
    /// ARUs open at most, keys per list, and how often an operation goes
    /// into an open ARU (in 8ths): chosen per device.
    max_open: usize,
    keys: u64,
    in_aru: u32,
}

impl Mix<'_> {
    fn failed(&mut self, what: &str, e: LdError) {
        if self.cut && matches!(e, LdError::Device(_) | LdError::ReadOnly(_)) {
            self.dead = true;
        } else {
            panic!("{what}: {e}");
        }
    }

    fn record(&mut self, aru: Option<AruId>, r: Result<(), LdError>, op: Op) {
        match r {
            Ok(()) => self.hist.log.push((aru.map_or(0, |a| a.0), op)),
            Err(LdError::NoSpace { .. }) if !matches!(op, Op::End) => {}
            Err(e) => {
                self.failed(&format!("{op:?}"), e);
                self.hist.log.push((aru.map_or(0, |a| a.0), op));
            }
        }
    }

    fn list(&mut self) -> Option<u64> {
        let lists: Vec<u64> = self.hist.live().lists.keys().copied().collect();
        if lists.is_empty() {
            None
        } else {
            Some(lists[self.rng.gen_range(0..lists.len())])
        }
    }

    fn aru(&mut self) -> Option<AruId> {
        if !self.open.is_empty() && self.rng.gen_ratio(self.in_aru, 8) {
            Some(self.open[self.rng.gen_range(0..self.open.len())])
        } else {
            None
        }
    }

    fn block(&mut self) -> Block {
        let len = match self.rng.gen_range(0..10) {
            0..=6 => self.rng.gen_range(1..300),
            7..=8 => 4096,
            _ => self.rng.gen_range(1..12000),
        };
        let mut d = vec![self.rng.gen::<u8>(); len];
        for _ in 0..4 {
            let i = self.rng.gen_range(0..len);
            d[i] = self.rng.gen();
        }
        d.into()
    }

    fn abort(&mut self, a: AruId) {
        if let Err(e) = self.lld.abort_aru(a) {
            self.failed("abort_aru", e);
            return;
        }
        let before = self.hist.log[..self.hist.flushed]
            .iter()
            .filter(|(x, _)| *x == a.0)
            .count();
        self.hist.flushed -= before;
        self.hist.log.retain(|(x, _)| *x != a.0);
    }

    /// An ARU that rewrites a few hot blocks and ends (or aborts) at once,
    /// as the file system's operations do, beside the ARUs left open.
    fn short_aru(&mut self) {
        let lld = self.lld;
        let a = match lld.begin_aru() {
            Ok(a) => a,
            Err(e) => return self.failed("begin_aru", e),
        };
        for _ in 0..self.rng.gen_range(1..4) {
            let Some(l) = self.list() else { break };
            let i = self.rng.gen_range(0..self.keys);
            if self.rng.gen_ratio(1, 6) {
                let r = lld.delete(Some(a), ListId(l), i);
                self.record(Some(a), r, Op::Delete(l, i));
            } else {
                let d = self.block();
                let r = lld.write(Some(a), ListId(l), i, &d);
                self.record(Some(a), r, Op::Write(l, i, d));
            }
            if self.dead {
                return;
            }
        }
        if self.rng.gen_ratio(1, 8) {
            self.abort(a);
        } else {
            let r = lld.end_aru(a);
            self.record(Some(a), r, Op::End);
        }
    }

    fn one(&mut self) {
        let lld = self.lld;
        match self.rng.gen_range(0..100) {
            0..=4 => {
                if self.hist.live().lists.len() < MAX_LISTS && !self.cut {
                    match lld.create_list(None, ListHints::default()) {
                        Ok(l) => {
                            self.next_list = self.next_list.max(l.0 + 1);
                            self.hist.log.push((0, Op::CreateList(l.0)));
                        }
                        Err(LdError::NoSpace { .. }) => {}
                        Err(e) => self.failed("create_list", e),
                    }
                }
            }
            5..=7 => {
                if let Some(l) = self.list() {
                    let aru = self.aru();
                    let r = lld.delete_list(aru, ListId(l));
                    self.record(aru, r, Op::DeleteList(l));
                }
            }
            8..=24 => self.short_aru(),
            25..=54 => {
                if let Some(l) = self.list() {
                    let aru = self.aru();
                    let i = self.rng.gen_range(0..self.keys);
                    let d = self.block();
                    let r = lld.write(aru, ListId(l), i, &d);
                    self.record(aru, r, Op::Write(l, i, d));
                }
            }
            55..=60 => {
                if let Some(l) = self.list() {
                    let aru = self.aru();
                    let i = self.rng.gen_range(0..self.keys);
                    let r = lld.delete(aru, ListId(l), i);
                    self.record(aru, r, Op::Delete(l, i));
                }
            }
            61..=65 => {
                if let Some(l) = self.list() {
                    let aru = self.aru();
                    let a = self.rng.gen_range(0..self.keys);
                    let z = a + self.rng.gen_range(1..4);
                    let r = lld.delete_range(aru, ListId(l), a..z);
                    self.record(aru, r, Op::DeleteRange(l, a, z));
                }
            }
            66..=75 => {
                if self.open.len() < self.max_open {
                    match lld.begin_aru() {
                        Ok(a) => self.open.push(a),
                        Err(e) => self.failed("begin_aru", e),
                    }
                }
            }
            76..=89 => {
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
            90..=93 => match lld.flush() {
                Ok(()) => self.hist.flushed = self.hist.log.len(),
                Err(e) => self.failed("flush", e),
            },
            94..=96 => {
                let policy = PolicyKind::ALL[self.rng.gen_range(0..3)];
                match lld.clean(policy, self.rng.gen_range(1..4)) {
                    Ok(rep) => {
                        if rep.checkpointed {
                            self.hist.flushed = self.hist.log.len();
                        }
                    }
                    Err(e) => self.failed("clean", e),
                }
            }
            97 => {
                if let Err(e) = lld.finish_checkpoint() {
                    self.failed("finish_checkpoint", e);
                }
            }
            _ => {
                if self.open.is_empty() {
                    match lld.checkpoint_now() {
                        Ok(()) => self.hist.flushed = self.hist.log.len(),
                        Err(e) => self.failed("checkpoint", e),
                    }
                }
            }
        }
        if !self.dead {
            // Reads see every accepted operation at once.
            let got = read_state(lld, self.next_list);
            let want = self.hist.live();
            assert_eq!(got, want, "live reads differ from the model");
        }
    }
}

fn run_mix(seed: u64, cycles: u64) -> Result<(u64, u64), String> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let partial = [700usize, 3000, 9000, 24 << 10, usize::MAX][rng.gen_range(0..5)];
    let max_open = [1usize, 2, 2, 4][rng.gen_range(0..4)];
    let keys = [1u64, 2, 3, 6][rng.gen_range(0..4)];
    let in_aru = rng.gen_range(4..=8);
    let dev = Arc::new(CrashDevice::new(8 << 20));
    let m = MkfsOptions {
        segment_bytes: 64 << 10,
        max_block_bytes: 12 << 10,
        reserved_segments: Some(6),
        fs_id: 0xc0a1,
        max_bytes: None,
        kept_pages: 0,
    };
    let lld = Lld::create(dev.clone(), &m, mix_options(partial)).map_err(|e| e.to_string())?;
    lld.flush().unwrap();
    let mut state = State::default();
    let mut next_list = 1;
    let mut lld = Some(lld);
    let mut dev = dev;
    let mut total_coalesced = 0u64;
    let mut total_ops = 0u64;
    for c in 0..cycles {
        let engine = lld.take().unwrap();
        let mut mx = Mix {
            lld: &engine,
            rng: ChaCha8Rng::seed_from_u64(rng.gen()),
            hist: History {
                base: state.clone(),
                log: Vec::new(),
                flushed: 0,
            },
            next_list,
            open: Vec::new(),
            cut: false,
            dead: false,
            max_open,
            keys,
            in_aru,
        };
        let n = mx.rng.gen_range(1..120);
        for _ in 0..n {
            mx.one();
        }
        if mx.rng.gen_ratio(1, 4) {
            dev.cut_power_after(mx.rng.gen_range(0..12));
            mx.cut = true;
            let n = mx.rng.gen_range(0..30);
            for _ in 0..n {
                if mx.dead {
                    break;
                }
                mx.one();
            }
        }
        if !mx.dead {
            if engine.accounting_drift() != 0 {
                return Err(format!("seed {seed} cycle {c}: live accounting drifted"));
            }
            if !mx.cut {
                let p = engine.check_usage().map_err(|e| e.to_string())?;
                if !p.is_empty() {
                    return Err(format!("seed {seed} cycle {c}: live usage check {p:?}"));
                }
            }
        }
        total_coalesced += engine.stats().writes_coalesced;
        total_ops += mx.hist.log.len() as u64;
        let image = dev.crash_image(
            mx.rng.gen(),
            &CrashOptions {
                keep_probability: mx.rng.gen_range(0.0..1.0),
                tear_probability: mx.rng.gen_range(0.0..0.5),
            },
        );
        next_list = mx.next_list;
        let hist = mx.hist;
        engine.abandon();
        dev = Arc::new(CrashDevice::from_image(image));
        let reopened = Lld::open(dev.clone(), mix_options(partial))
            .map_err(|e| format!("seed {seed} cycle {c}: reopen: {e}"))?;
        if reopened.accounting_drift() != 0 {
            return Err(format!("seed {seed} cycle {c}: accounting drifted"));
        }
        let problems = reopened.check_usage().map_err(|e| e.to_string())?;
        if !problems.is_empty() {
            return Err(format!("seed {seed} cycle {c}: usage: {problems:?}"));
        }
        let got = read_state(&reopened, next_list);
        match (hist.flushed..=hist.log.len())
            .rev()
            .find(|&p| hist.state_at(p) == got)
        {
            Some(p) => state = hist.state_at(p),
            None => {
                return Err(format!(
                    "seed {seed} cycle {c} (partial {partial}): recovered state matches no \
                     allowed prefix ({} ops, flushed {})\nrecovered {:?}\nops {:?}",
                    hist.log.len(),
                    hist.flushed,
                    got.lists
                        .iter()
                        .map(|(l, b)| (*l, b.iter().map(|(i, d)| (*i, d.len())).collect()))
                        .collect::<Vec<(u64, Vec<(u64, usize)>)>>(),
                    hist.log
                        .iter()
                        .map(|(a, op)| match op {
                            Op::Write(l, i, d) => format!("{a}:W{l}/{i}({})", d.len()),
                            o => format!("{a}:{o:?}"),
                        })
                        .collect::<Vec<_>>()
                ));
            }
        }
        lld = Some(reopened);
    }
    if let Some(l) = lld {
        l.close().map_err(|e| format!("close: {e}"))?;
    }
    Ok((total_coalesced, total_ops))
}

#[test]
fn coalescing_crash_mix_matches_the_model() {
    let base: u64 = std::env::var("LDFS_SEED")
        .map(|v| v.parse().unwrap())
        .unwrap_or(0xc0a1_e5ce);
    let cycles: u64 = std::env::var("LDFS_COALESCE_CYCLES")
        .map(|v| v.parse().unwrap())
        .unwrap_or(1200);
    let devices: u64 = std::env::var("LDFS_COALESCE_DEVICES")
        .map(|v| v.parse().unwrap())
        .unwrap_or(12);
    let mut coalesced = 0;
    let mut ops = 0;
    for d in 0..devices {
        let seed = base.wrapping_add(d);
        match run_mix(seed, cycles / devices) {
            Ok((c, o)) => {
                eprintln!("seed {seed}: {o} operations, {c} coalesced");
                coalesced += c;
                ops += o;
            }
            Err(e) => panic!("{e}\nreplay: LDFS_SEED={seed} (device {d})"),
        }
    }
    eprintln!("coalescing mix: {ops} operations, {coalesced} writes coalesced");
    assert!(coalesced > 0, "the mix never coalesced a write");
}
