//! Engine behaviour under bad conditions: corrupt blocks and summaries, lost
//! checkpoints, a full device, device errors, concurrent flushes, a slow
//! device flush during a checkpoint, slow device writes.

use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use ldfs::device::{
    CrashDevice, CrashOptions, Device, DeviceError, FaultDevice, FaultPlan, MemoryDevice,
};
use ldfs::ld::{Compression, CorruptReason, LdError, ListHints, ListId, LogicalDisk};
use ldfs::lld::layout::MkfsOptions;
use ldfs::lld::{Lld, LldOptions};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn small_mkfs() -> MkfsOptions {
    MkfsOptions {
        segment_bytes: 128 << 10,
        max_block_bytes: 32 << 10,
        reserved_segments: Some(4),
        fs_id: 77,
        max_bytes: None,
        kept_pages: 0,
    }
}

fn data(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..len).map(|_| rng.gen()).collect()
}

#[test]
fn write_read_overwrite_delete_and_reopen() {
    let dev: Arc<dyn Device> = Arc::new(MemoryDevice::new(16 << 20));
    let lld = Lld::create(dev.clone(), &small_mkfs(), LldOptions::default()).unwrap();
    let a = lld.create_list(None, ListHints::default()).unwrap();
    let b = lld.create_list(None, ListHints::default()).unwrap();
    assert_ne!(a, b);
    for i in 0..100u64 {
        lld.write(None, a, i, &data(i, 1 + (i as usize * 97) % 9000))
            .unwrap();
    }
    lld.write(None, b, 5, b"five").unwrap();
    lld.write(None, a, 3, b"three").unwrap();
    lld.delete(None, a, 4).unwrap();
    lld.delete_range(None, a, 50..60).unwrap();
    let check = |lld: &Lld| {
        assert_eq!(lld.read(a, 3).unwrap().unwrap(), b"three");
        assert_eq!(lld.read(a, 4).unwrap(), None);
        assert_eq!(lld.read(a, 55).unwrap(), None);
        assert_eq!(lld.read(a, 70).unwrap().unwrap(), data(70, 1 + 6790));
        assert_eq!(lld.read(b, 5).unwrap().unwrap(), b"five");
        let idx = lld.indices(a, 0, 1000).unwrap();
        assert_eq!(idx.len(), 100 - 1 - 10);
        assert_eq!(lld.indices(a, 95, 3).unwrap(), vec![95, 96, 97]);
    };
    check(&lld);
    lld.flush().unwrap();
    check(&lld);
    lld.close().unwrap();
    drop(lld);
    let lld = Lld::open(dev.clone(), LldOptions::default()).unwrap();
    assert_eq!(
        lld.open_report().rolled_forward,
        0,
        "clean close needs no roll-forward"
    );
    check(&lld);
    lld.delete_list(None, b).unwrap();
    assert!(matches!(lld.read(b, 5), Ok(None)));
    assert!(matches!(lld.indices(b, 0, 10), Err(LdError::NoSuchList(_))));
    assert!(matches!(
        lld.write(None, b, 1, b"x"),
        Err(LdError::NoSuchList(_))
    ));
    assert!(matches!(
        lld.write(None, a, 1, &[]),
        Err(LdError::BadBlockLength { .. })
    ));
    assert!(matches!(
        lld.write(None, a, 1, &vec![0; (32 << 10) + 1]),
        Err(LdError::BadBlockLength { .. })
    ));
    assert_eq!(lld.accounting_drift(), 0);
}

#[test]
fn compressed_lists_store_fewer_bytes() {
    let dev: Arc<dyn Device> = Arc::new(MemoryDevice::new(16 << 20));
    let lld = Lld::create(dev.clone(), &small_mkfs(), LldOptions::default()).unwrap();
    let hints = ListHints {
        compress: Compression::Lz4,
        ..Default::default()
    };
    let l = lld.create_list(None, hints).unwrap();
    assert_eq!(lld.list_hints(l).unwrap(), Some(hints));
    let text: Vec<u8> = b"log-structured "
        .iter()
        .cycle()
        .take(16384)
        .copied()
        .collect();
    for i in 0..10 {
        lld.write(None, l, i, &text).unwrap();
    }
    lld.flush().unwrap();
    assert!(lld.space().live_bytes < 10 * 16384 / 4);
    lld.close().unwrap();
    drop(lld);
    let lld = Lld::open(dev, LldOptions::default()).unwrap();
    assert_eq!(lld.list_hints(l).unwrap(), Some(hints));
    for i in 0..10 {
        assert_eq!(lld.read(l, i).unwrap().unwrap(), text);
    }
}

#[test]
fn a_corrupt_block_is_reported_never_returned() {
    let dev = Arc::new(MemoryDevice::new(16 << 20));
    let lld = Lld::create(dev.clone(), &small_mkfs(), LldOptions::default()).unwrap();
    let l = lld.create_list(None, ListHints::default()).unwrap();
    let block = data(1, 8192);
    lld.write(None, l, 0, &block).unwrap();
    lld.write(None, l, 1, b"neighbour").unwrap();
    lld.close().unwrap();
    drop(lld);
    // Find the block on the device and flip one byte of it.
    let image = dev.snapshot();
    let at = image
        .windows(64)
        .position(|w| w == &block[..64])
        .expect("block on device");
    dev.write_at(&[image[at + 100] ^ 1], (at + 100) as u64)
        .unwrap();
    let lld = Lld::open(dev, LldOptions::default()).unwrap();
    match lld.read(l, 0) {
        Err(LdError::Corrupt(c)) => {
            assert!(matches!(c.reason, CorruptReason::BadChecksum { .. }), "{c}");
            assert_eq!(c.what, "block");
        }
        other => panic!("corrupt block read gave {other:?}"),
    }
    assert_eq!(lld.read(l, 1).unwrap().unwrap(), b"neighbour");
}

#[test]
fn a_torn_log_tail_stops_roll_forward_and_keeps_the_flushed_prefix() {
    let dev = Arc::new(MemoryDevice::new(16 << 20));
    let lld = Lld::create(dev.clone(), &small_mkfs(), LldOptions::default()).unwrap();
    let l = lld.create_list(None, ListHints::default()).unwrap();
    lld.write(None, l, 0, b"durable").unwrap();
    lld.flush().unwrap();
    let before = dev.snapshot();
    lld.write(None, l, 1, &data(9, 5000)).unwrap();
    lld.flush().unwrap();
    let after = dev.snapshot();
    lld.abandon();
    // Corrupt each byte of the new partial segment's summary page in turn
    // (sampled): recovery must drop that partial and keep the earlier one.
    let first_changed = before
        .iter()
        .zip(&after)
        .position(|(a, b)| a != b)
        .expect("the flush wrote something");
    let page = first_changed / 4096 * 4096;
    for off in (0..4096).step_by(61) {
        let mut img = after.clone();
        img[page + off] ^= 0x20;
        let d = Arc::new(MemoryDevice::from_vec(img));
        let lld = Lld::open(d, LldOptions::default()).unwrap();
        assert_eq!(lld.read(l, 0).unwrap().unwrap(), b"durable");
        let one = lld.read(l, 1).unwrap();
        // A flip in unused summary bytes is caught by the checksum too.
        assert_eq!(one, None, "flip at summary byte {off} was not detected");
    }
}

#[test]
fn both_checkpoints_lost_rebuilds_from_summaries() {
    let dev = Arc::new(MemoryDevice::new(16 << 20));
    let lld = Lld::create(dev.clone(), &small_mkfs(), LldOptions::default()).unwrap();
    let l = lld.create_list(None, ListHints::default()).unwrap();
    for i in 0..300u64 {
        lld.write(None, l, i, &data(i, 3000)).unwrap();
    }
    lld.checkpoint_now().unwrap();
    for i in 0..50u64 {
        lld.write(None, l, i, &data(i + 1000, 2000)).unwrap();
    }
    lld.delete(None, l, 299).unwrap();
    let aru = lld.begin_aru().unwrap();
    lld.write(Some(aru), l, 7, b"never committed").unwrap();
    lld.flush().unwrap();
    let g = lld.geometry();
    lld.abandon();
    for slot in 0..2 {
        dev.write_at(&[0xAB; 64], g.slot_addr(slot) + 8).unwrap();
    }
    let lld = Lld::open(dev, LldOptions::default()).unwrap();
    assert!(lld.open_report().rebuilt);
    assert_eq!(lld.open_report().checkpoint_errors.len(), 2);
    for i in 0..299u64 {
        let want = if i < 50 {
            data(i + 1000, 2000)
        } else {
            data(i, 3000)
        };
        assert_eq!(lld.read(l, i).unwrap().unwrap(), want, "block {i}");
    }
    assert_eq!(lld.read(l, 299).unwrap(), None);
    assert_eq!(lld.accounting_drift(), 0);
}

#[test]
fn full_device_refuses_up_front_and_keeps_everything_accepted() {
    let dev = Arc::new(CrashDevice::new(8 << 20));
    let lld = Lld::create(dev.clone(), &small_mkfs(), LldOptions::default()).unwrap();
    let l = lld.create_list(None, ListHints::default()).unwrap();
    let mut accepted = 0u64;
    loop {
        match lld.write(None, l, accepted, &data(accepted, 20_000)) {
            Ok(()) => accepted += 1,
            Err(LdError::NoSpace { .. }) => break,
            Err(e) => panic!("write {accepted}: {e}"),
        }
        assert!(accepted < 10_000, "never ran out of space");
    }
    assert!(accepted > 100, "only {accepted} blocks fit");
    // Deletes still work on a full device, and free space once checkpointed.
    lld.delete(None, l, 0).unwrap();
    lld.flush().unwrap();
    let crashed = dev.crash_image(1, &CrashOptions::default());
    lld.close().unwrap();
    let clean = dev.durable_image();
    drop(lld);
    for image in [clean, crashed] {
        let d = Arc::new(MemoryDevice::from_vec(image));
        let lld = Lld::open(d, LldOptions::default()).unwrap();
        assert_eq!(lld.read(l, 0).unwrap(), None);
        for i in 1..accepted {
            assert_eq!(
                lld.read(l, i).unwrap().unwrap(),
                data(i, 20_000),
                "block {i}"
            );
        }
    }
}

#[test]
fn reservations_are_honoured_or_refused_up_front() {
    let dev = Arc::new(MemoryDevice::new(8 << 20));
    let lld = Lld::create(dev, &small_mkfs(), LldOptions::default()).unwrap();
    let l = lld.create_list(None, ListHints::default()).unwrap();
    let aru = lld.begin_aru().unwrap();
    let avail = lld.space().available_bytes;
    assert!(matches!(
        lld.reserve(aru, avail * 2),
        Err(LdError::NoSpace { .. })
    ));
    lld.reserve(aru, 1 << 20).unwrap();
    // Fill the rest with writes outside the ARU.
    let mut i = 1000;
    while lld.write(None, l, i, &data(i, 16_000)).is_ok() {
        i += 1;
    }
    // The reservation still holds.
    for j in 0..(1 << 20) / 16_000 {
        lld.write(Some(aru), l, j, &data(j, 16_000))
            .unwrap_or_else(|e| panic!("reserved write {j}: {e}"));
    }
    lld.end_aru(aru).unwrap();
}

#[test]
fn eio_on_write_turns_read_only_and_loses_nothing_flushed() {
    let dev = Arc::new(FaultDevice::new(
        MemoryDevice::new(16 << 20),
        FaultPlan::default(),
    ));
    let lld = Lld::create(dev.clone(), &small_mkfs(), LldOptions::default()).unwrap();
    let l = lld.create_list(None, ListHints::default()).unwrap();
    for i in 0..20 {
        lld.write(None, l, i, &data(i, 4096)).unwrap();
    }
    lld.flush().unwrap();
    dev.set_plan(FaultPlan {
        fail_write_nth: Some(1),
        sticky: true,
        ..Default::default()
    });
    lld.write(None, l, 100, b"buffered").unwrap();
    let err = lld.flush().unwrap_err();
    assert!(matches!(err, LdError::Device(_)), "{err}");
    assert!(matches!(
        lld.write(None, l, 101, b"more"),
        Err(LdError::ReadOnly(_))
    ));
    // Reads keep working, including the block that could not be written.
    assert_eq!(lld.read(l, 3).unwrap().unwrap(), data(3, 4096));
    assert_eq!(lld.read(l, 100).unwrap().unwrap(), b"buffered");
    drop(lld);
    dev.set_plan(FaultPlan::default());
    let lld = Lld::open(dev, LldOptions::default()).unwrap();
    for i in 0..20 {
        assert_eq!(lld.read(l, i).unwrap().unwrap(), data(i, 4096));
    }
}

#[test]
fn concurrent_writers_share_flushes() {
    let dev: Arc<dyn Device> = Arc::new(MemoryDevice::new(64 << 20));
    let lld = Arc::new(Lld::create(dev.clone(), &small_mkfs(), LldOptions::default()).unwrap());
    let l = lld.create_list(None, ListHints::default()).unwrap();
    let threads: Vec<_> = (0..8u64)
        .map(|t| {
            let lld = lld.clone();
            std::thread::spawn(move || {
                for i in 0..200u64 {
                    lld.write(None, l, t * 1000 + i, &data(t * 1000 + i, 4096))
                        .unwrap();
                    lld.flush().unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let flushes = lld.stats().device_flushes;
    assert!(
        flushes <= 1600 + 10,
        "{flushes} device flushes for 1600 flush calls"
    );
    lld.close().unwrap();
    drop(lld);
    let lld = Lld::open(dev, LldOptions::default()).unwrap();
    for t in 0..8u64 {
        for i in 0..200u64 {
            assert_eq!(
                lld.read(l, t * 1000 + i).unwrap().unwrap(),
                data(t * 1000 + i, 4096)
            );
        }
    }
    let _ = ListId(0);
}

#[test]
fn read_only_open_writes_nothing() {
    let dev = Arc::new(MemoryDevice::new(16 << 20));
    let lld = Lld::create(dev.clone(), &small_mkfs(), LldOptions::default()).unwrap();
    let l = lld.create_list(None, ListHints::default()).unwrap();
    lld.write(None, l, 0, b"zero").unwrap();
    lld.flush().unwrap();
    lld.abandon();
    let before = dev.snapshot();
    let ro = LldOptions {
        read_only: true,
        ..Default::default()
    };
    let lld = Lld::open(dev.clone(), ro).unwrap();
    assert_eq!(lld.read(l, 0).unwrap().unwrap(), b"zero");
    assert!(matches!(
        lld.write(None, l, 1, b"x"),
        Err(LdError::ReadOnly(_))
    ));
    drop(lld);
    assert!(
        before == dev.snapshot(),
        "read-only open changed the device"
    );
}

#[test]
fn relocate_moves_only_the_map_and_respects_open_arus() {
    use ldfs::lld::Key;
    let dev = Arc::new(CrashDevice::new(16 << 20));
    let lld = Lld::create(dev.clone(), &small_mkfs(), LldOptions::default()).unwrap();
    let l = lld.create_list(None, ListHints::default()).unwrap();
    lld.write(None, l, 1, &data(1, 5000)).unwrap();
    let aru = lld.begin_aru().unwrap();
    lld.write(Some(aru), l, 2, &data(2, 5000)).unwrap();
    lld.flush().unwrap();
    let entry = |i: u64| lld.map_entry(Key::new(l, i)).unwrap().unwrap();
    let (e1, e2) = (entry(1), entry(2));
    assert!(lld.relocate(Key::new(l, 1), &e1).unwrap());
    assert_ne!(entry(1).addr, e1.addr);
    // Moving a block written by an open ARU would commit it early.
    assert!(!lld.relocate(Key::new(l, 2), &e2).unwrap());
    // A stale expectation is refused.
    assert!(!lld.relocate(Key::new(l, 1), &e1).unwrap());
    lld.flush().unwrap();
    let image = dev.crash_image(3, &CrashOptions::default());
    lld.abandon();
    let lld = Lld::open(
        Arc::new(MemoryDevice::from_vec(image)),
        LldOptions::default(),
    )
    .unwrap();
    assert_eq!(lld.read(l, 1).unwrap().unwrap(), data(1, 5000));
    assert_eq!(
        lld.read(l, 2).unwrap(),
        None,
        "uncommitted ARU write survived"
    );
    assert_eq!(lld.stats().rolled_forward, 2);
    assert_eq!(lld.accounting_drift(), 0);
}

#[test]
fn map_pages_can_be_moved_out_of_a_segment() {
    let dev = Arc::new(MemoryDevice::new(16 << 20));
    let lld = Lld::create(dev.clone(), &small_mkfs(), LldOptions::default()).unwrap();
    let l = lld.create_list(None, ListHints::default()).unwrap();
    for i in 0..1000 {
        lld.write(None, l, i, b"tiny").unwrap();
    }
    lld.checkpoint_now().unwrap();
    // Find a live map page through the summaries, move it, checkpoint.
    let mut found = None;
    for (seg, u) in lld.segment_usage() {
        if u.live_bytes == 0 {
            continue;
        }
        for (h, recs) in lld.segment_summaries(seg).unwrap() {
            for r in recs {
                if let ldfs::lld::summary::Record::MapPage { data_off, .. } = r {
                    let g = lld.geometry();
                    let addr = g.page_addr(seg, h.page + h.summary_pages) + data_off as u64;
                    if lld.map_page_is_live(addr) {
                        found = Some(addr);
                    }
                }
            }
        }
    }
    let addr = found.expect("a live map page");
    assert!(lld.relocate_map_page(addr).unwrap());
    lld.checkpoint_now().unwrap();
    assert!(!lld.map_page_is_live(addr));
    lld.close().unwrap();
    drop(lld);
    let lld = Lld::open(dev, LldOptions::default()).unwrap();
    assert_eq!(lld.indices(l, 0, 2000).unwrap().len(), 1000);
    assert_eq!(lld.accounting_drift(), 0);
}

/// `read_range` returns exactly what block-by-block reads return: blocks
/// still in the open partial, written ones (read in runs), compressed ones,
/// holes skipped, blocks the cleaner moved, and the limit honoured; a
/// corrupt block in a run is an error, never its bytes.
#[test]
fn read_range_agrees_with_single_reads() {
    let seed = 0x5eed_0001;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let dev = Arc::new(MemoryDevice::new(16 << 20));
    let lld = Lld::create(dev.clone(), &small_mkfs(), LldOptions::default()).unwrap();
    let plain = lld.create_list(None, ListHints::default()).unwrap();
    let packed = lld
        .create_list(
            None,
            ListHints {
                compress: Compression::Lz4,
                ..Default::default()
            },
        )
        .unwrap();
    let check = |lld: &Lld, l: ListId, what: &str| {
        for (lo, hi, limit) in [(0, 400, 1000), (7, 93, 1000), (0, 400, 17), (350, 900, 5)] {
            let got = lld.read_range(l, lo..hi, limit).unwrap();
            let mut want = Vec::new();
            for i in lo..hi {
                if want.len() == limit {
                    break;
                }
                if let Some(b) = lld.read(l, i).unwrap() {
                    want.push((i, b));
                }
            }
            assert!(
                got == want,
                "seed {seed}: {what}: range {lo}..{hi} limit {limit}"
            );
        }
    };
    for round in 0..3 {
        for i in 0..300u64 {
            let len = [4096, 4096, 4096, 100, 9000][rng.gen_range(0..5)];
            if rng.gen_ratio(1, 6) {
                lld.delete(None, plain, i).unwrap();
            } else {
                lld.write(None, plain, i, &data(i * 10 + round, len))
                    .unwrap();
            }
            if i % 3 == 0 {
                let text: Vec<u8> = format!("block {i} round {round} ").repeat(200).into_bytes();
                lld.write(None, packed, i, &text).unwrap();
            }
        }
        check(&lld, plain, "partly buffered");
        check(&lld, packed, "compressed, partly buffered");
        lld.flush().unwrap();
        check(&lld, plain, "flushed");
    }
    let rep = lld.clean(ldfs::lld::PolicyKind::Greedy, 8).unwrap();
    assert!(rep.blocks_moved > 0, "the cleaner moved nothing");
    check(&lld, plain, "after cleaning");
    check(&lld, packed, "compressed, after cleaning");
    lld.close().unwrap();
    drop(lld);

    // One corrupt block in the middle of a run of adjacent blocks.
    let lld = Lld::open(dev.clone(), LldOptions::default()).unwrap();
    let l = lld.create_list(None, ListHints::default()).unwrap();
    for i in 0..32u64 {
        lld.write(None, l, i, &data(1_000_000 + i, 4096)).unwrap();
    }
    lld.close().unwrap();
    drop(lld);
    let victim = data(1_000_000 + 20, 4096);
    let image = dev.snapshot();
    let at = image
        .windows(64)
        .position(|w| w == &victim[..64])
        .expect("block on device");
    dev.write_at(&[image[at + 7] ^ 0x40], (at + 7) as u64)
        .unwrap();
    let lld = Lld::open(dev, LldOptions::default()).unwrap();
    assert!(lld.read(l, 20).is_err(), "the flipped byte missed block 20");
    match lld.read_range(l, 0..32, 64) {
        Err(LdError::Corrupt(c)) => assert_eq!(c.what, "block", "{c}"),
        other => panic!(
            "a range over a corrupt block gave {:?}",
            other.map(|v| v.len())
        ),
    }
    let before = lld.read_range(l, 0..20, 64).unwrap();
    assert_eq!(before.len(), 20);
    assert!(before.iter().all(|(i, b)| *b == data(1_000_000 + i, 4096)));
    let after = lld.read_range(l, 21..32, 64).unwrap();
    assert_eq!(after.len(), 11);
}

/// A device whose flushes (or writes) wait while its gate is shut (a disk
/// that takes long), counting the calls waiting there.
struct SlowFlush {
    inner: MemoryDevice,
    /// (shut, calls waiting)
    gate: Mutex<(bool, usize)>,
    cv: Condvar,
    /// The gate holds writes, not flushes.
    writes: bool,
}

impl SlowFlush {
    fn new(writes: bool) -> SlowFlush {
        SlowFlush {
            inner: MemoryDevice::new(16 << 20),
            gate: Mutex::new((false, 0)),
            cv: Condvar::new(),
            writes,
        }
    }

    fn shut(&self, shut: bool) {
        self.gate.lock().unwrap().0 = shut;
        self.cv.notify_all();
    }

    fn pass(&self) {
        let mut g = self.gate.lock().unwrap();
        g.1 += 1;
        self.cv.notify_all();
        while g.0 {
            g = self.cv.wait(g).unwrap();
        }
        g.1 -= 1;
    }

    /// Waits until a call waits at the shut gate; false after `limit`.
    fn await_blocked(&self, limit: Duration) -> bool {
        let g = self.gate.lock().unwrap();
        let (g, _) = self.cv.wait_timeout_while(g, limit, |g| g.1 == 0).unwrap();
        g.1 > 0
    }
}

impl Device for SlowFlush {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), DeviceError> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), DeviceError> {
        if self.writes {
            self.pass();
        }
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> Result<(), DeviceError> {
        if !self.writes {
            self.pass();
        }
        self.inner.flush()
    }
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
}

/// Opens the gate when dropped, so a failing assertion leaves no thread
/// waiting at it.
struct OpenOnDrop(Arc<SlowFlush>);

impl Drop for OpenOnDrop {
    fn drop(&mut self) {
        self.0.shut(false);
    }
}

/// Issue 12 item 7: a checkpoint's device flushes run beside operations.
/// With the device's flush stuck, the ARU end that starts a checkpoint and
/// other threads' writes and ARU ends still complete (the file system
/// calls `end_aru` under its own mutex: a checkpoint written there stalled
/// every operation for the device's flushes).
#[test]
fn operations_proceed_while_a_checkpoint_waits_for_the_device() {
    let dev = Arc::new(SlowFlush::new(false));
    let opts = LldOptions {
        // Every ARU end that leaves a dirty map page is due a checkpoint.
        checkpoint_dirty_pages: Some(1),
        ..LldOptions::default()
    };
    let lld = Arc::new(Lld::create(dev.clone(), &small_mkfs(), opts.clone()).unwrap());
    let l = lld.create_list(None, ListHints::default()).unwrap();
    lld.checkpoint_now().unwrap();
    let before = lld.stats().checkpoints;
    let _open = OpenOnDrop(dev.clone());
    dev.shut(true);
    let limit = Duration::from_secs(10);
    let op = |lld: &Arc<Lld>, i: u64| {
        let (lld, (tx, rx)) = (lld.clone(), mpsc::channel());
        std::thread::spawn(move || {
            let aru = lld.begin_aru().unwrap();
            lld.write(Some(aru), l, i, &data(i, 3000)).unwrap();
            lld.end_aru(aru).unwrap();
            let _ = tx.send(());
        });
        rx
    };
    // This ARU's end starts a checkpoint, which gets stuck in a flush.
    let t0 = Instant::now();
    let first = op(&lld, 0);
    assert!(dev.await_blocked(limit), "no checkpoint flush started");
    assert!(
        first.recv_timeout(limit).is_ok(),
        "the ARU end that started the checkpoint waited for the device"
    );
    for i in 1..=8 {
        assert!(
            op(&lld, i).recv_timeout(limit).is_ok(),
            "operation {i} waited for the checkpoint's device flush ({:?} in)",
            t0.elapsed()
        );
    }
    assert_eq!(
        lld.stats().checkpoints,
        before,
        "the checkpoint finished with its flush stuck"
    );
    dev.shut(false);
    // Waits for the pending checkpoint, then takes one more.
    lld.checkpoint_now().unwrap();
    assert!(lld.stats().checkpoints >= before + 2);
    for i in 0..=8 {
        assert_eq!(lld.read(l, i).unwrap().unwrap(), data(i, 3000));
    }
    assert!(lld.check_usage().unwrap().is_empty());
    lld.close().unwrap();
    drop(lld);
    let lld = Lld::open(dev, opts).unwrap();
    for i in 0..=8 {
        assert_eq!(lld.read(l, i).unwrap().unwrap(), data(i, 3000));
    }
}

/// Sealed partial segments queue for the log writer by bytes, not by
/// count: with the device's writes stuck, a stream of small partial
/// segments (one per group commit, or here per write) does not make the
/// sealing operation, which holds the engine lock, wait for the device
/// (it did after four), and their blocks read back from the queue.
#[test]
fn small_partials_queue_while_a_device_write_is_slow() {
    let dev = Arc::new(SlowFlush::new(true));
    let opts = LldOptions {
        // Every 4 KiB write seals a partial segment of its own.
        partial_bytes: 4096,
        ..LldOptions::default()
    };
    let lld = Arc::new(Lld::create(dev.clone(), &small_mkfs(), opts.clone()).unwrap());
    let l = lld.create_list(None, ListHints::default()).unwrap();
    lld.flush().unwrap();
    let _open = OpenOnDrop(dev.clone());
    dev.shut(true);
    let (tx, rx) = mpsc::channel();
    let writer = lld.clone();
    std::thread::spawn(move || {
        for i in 0..16u64 {
            writer.write(None, l, i, &data(i, 4096)).unwrap();
            let _ = tx.send(i);
        }
    });
    for i in 0..16u64 {
        assert_eq!(
            rx.recv_timeout(Duration::from_secs(10)).ok(),
            Some(i),
            "write {i} waited for the device"
        );
    }
    assert!(dev.await_blocked(Duration::from_secs(10)));
    for i in 0..16u64 {
        assert_eq!(lld.read(l, i).unwrap().unwrap(), data(i, 4096));
    }
    dev.shut(false);
    lld.flush().unwrap();
    lld.close().unwrap();
    drop(lld);
    let lld = Lld::open(dev, opts).unwrap();
    for i in 0..16u64 {
        assert_eq!(lld.read(l, i).unwrap().unwrap(), data(i, 4096));
    }
}

/// Issue 12, item 5: one ARU dirties every map leaf, then overwrites a few
/// keys with large blocks until the device is full. The checkpoint due when
/// it ends must still fit (the writes get NoSpace first), it releases what
/// the overwrites killed, and every image the engine leaves — whole, or cut
/// off anywhere in that checkpoint — opens again.
#[test]
fn a_long_aru_at_a_full_device_gets_nospace_and_every_image_opens() {
    const SMALL: u64 = 40_000;
    let big = |k: u64| data(k, 32 << 10);
    // Builds the scenario up to the ARU's end; returns the engine, its
    // device and the list.
    let scenario = || {
        let dev = Arc::new(CrashDevice::new(16 << 20));
        let lld = Lld::create(dev.clone(), &small_mkfs(), LldOptions::default()).unwrap();
        let l = lld.create_list(None, ListHints::default()).unwrap();
        for i in 0..SMALL {
            lld.write(None, l, i, &[i as u8]).unwrap();
        }
        lld.checkpoint_now().unwrap();
        let aru = lld.begin_aru().unwrap();
        // A key in every leaf: the next checkpoint rewrites the whole map.
        for i in (0..SMALL).step_by(100) {
            lld.write(Some(aru), l, i, &[!(i as u8)]).unwrap();
        }
        let (_, _, dirty) = lld.map_figures();
        assert!(dirty > 300, "only {dirty} map pages dirty");
        let mut k = 0u64;
        loop {
            match lld.write(Some(aru), l, SMALL + k % 8, &big(k)) {
                Ok(()) => k += 1,
                Err(LdError::NoSpace { .. }) => break,
                Err(e) => panic!("overwrite {k}: {e}"),
            }
            assert!(k < 10_000, "never ran out of space");
        }
        assert!(k > 100, "only {k} overwrites fit");
        (dev, lld, l, aru, k)
    };
    let check = |lld: &Lld, l: ListId, k: u64, committed: bool| {
        for i in (0..SMALL).step_by(997) {
            let want = if committed && i % 100 == 0 {
                !(i as u8)
            } else {
                i as u8
            };
            assert_eq!(lld.read(l, i).unwrap().unwrap(), [want], "block {i}");
        }
        for j in 0..8 {
            let got = lld.read(l, SMALL + j).unwrap();
            if committed {
                // The last of the overwrites of this key.
                let last = (0..k).rev().find(|x| x % 8 == j).unwrap();
                assert_eq!(got.unwrap(), big(last), "key {}", SMALL + j);
            } else {
                assert_eq!(got, None, "key {}", SMALL + j);
            }
        }
    };

    let (dev, lld, l, aru, k) = scenario();
    // The ARU's end writes the due checkpoint: it must fit...
    lld.end_aru(aru).unwrap();
    // (The checkpointer thread finishes it; wait for that.)
    lld.finish_checkpoint().unwrap();
    assert!(lld.stats().segments_released > 50, "{:?}", lld.stats());
    // ...and release what the overwrites killed: there is room again.
    lld.write(None, l, SMALL + 100, &big(1 << 40)).unwrap();
    lld.flush().unwrap();
    let image = dev.current_image();
    lld.abandon();
    let lld = Lld::open(
        Arc::new(MemoryDevice::from_vec(image)),
        LldOptions::default(),
    )
    .expect("reopen after the ARU");
    check(&lld, l, k, true);
    drop(lld);

    // The power goes out at points of that checkpoint: first every write
    // made before the cut lands (the log's tail holds as many map pages as
    // it got to write), then a random subset does.
    for cut in [1, 3, 6, 9, 12] {
        let (dev, lld, l, aru, k) = scenario();
        dev.cut_power_after(cut);
        let _ = lld.end_aru(aru);
        let _ = lld.finish_checkpoint();
        let images = [
            (dev.current_image(), "every write"),
            (
                dev.crash_image(cut, &CrashOptions::default()),
                "some writes",
            ),
        ];
        lld.abandon();
        for (image, what) in images {
            let lld = Lld::open(
                Arc::new(MemoryDevice::from_vec(image)),
                LldOptions::default(),
            )
            .unwrap_or_else(|e| panic!("cut after {cut} writes, {what}: reopen: {e}"));
            // The end record was written before the checkpoint began: the
            // ARU is there unless the crash lost it.
            let committed = lld.read(l, SMALL).unwrap().is_some();
            check(&lld, l, k, committed);
            assert_eq!(lld.accounting_drift(), 0);
            assert!(lld.check_usage().unwrap().is_empty());
        }
    }
}

/// Issue 12, item 5: a list created in an ARU that never ended, and a block
/// written to it outside that ARU. After a crash the list's entry is gone
/// but the block is not: its list id must not be handed out again.
#[test]
fn a_list_id_with_a_surviving_block_is_not_handed_out_again() {
    let dev = Arc::new(CrashDevice::new(16 << 20));
    let lld = Lld::create(dev.clone(), &small_mkfs(), LldOptions::default()).unwrap();
    let a = lld.create_list(None, ListHints::default()).unwrap();
    lld.write(None, a, 0, b"a").unwrap();
    lld.checkpoint_now().unwrap();
    let aru = lld.begin_aru().unwrap();
    let l = lld.create_list(Some(aru), ListHints::default()).unwrap();
    lld.write(None, l, 0, b"outside the ARU").unwrap();
    lld.flush().unwrap();
    let image = dev.durable_image();
    lld.abandon();
    let lld = Lld::open(
        Arc::new(MemoryDevice::from_vec(image)),
        LldOptions::default(),
    )
    .unwrap();
    assert!(lld.open_report().rolled_forward > 0);
    assert_eq!(lld.list_hints(l).unwrap(), None, "the ARU's list survived");
    let n = lld.create_list(None, ListHints::default()).unwrap();
    assert_ne!(n, l, "list {} handed out again", l.0);
    assert!(lld.indices(n, 0, 10).unwrap().is_empty());
    assert_eq!(lld.read(a, 0).unwrap().unwrap(), b"a");
}

/// A checkpoint can leave the log with no segment to continue in when it
/// takes the last clean one, and release segments in the same stroke: the
/// log then goes on into one of those. Recovery must follow it there.
#[test]
fn the_log_goes_on_into_a_segment_its_checkpoint_released() {
    let dev = Arc::new(CrashDevice::new(16 << 20));
    let lld = Lld::create(dev.clone(), &small_mkfs(), LldOptions::default()).unwrap();
    let l = lld.create_list(None, ListHints::default()).unwrap();
    for i in 0..40_000u64 {
        lld.write(None, l, i, &[i as u8]).unwrap();
    }
    lld.checkpoint_now().unwrap();
    let aru = lld.begin_aru().unwrap();
    for i in (0..40_000u64).step_by(100) {
        lld.write(Some(aru), l, i, &[!(i as u8)]).unwrap();
    }
    // Overwrites kill whole segments that only a checkpoint releases...
    let mut k = 0u64;
    while lld
        .write(Some(aru), l, 50_000 + k % 8, &data(k, 32 << 10))
        .is_ok()
    {
        k += 1;
    }
    // ...and deletes (allowed further into the reserve) take the log down
    // to what the checkpoint at the ARU's end needs.
    let mut deleted = 0u64;
    while lld.delete(Some(aru), l, 1 + deleted * 3 % 39_000).is_ok() {
        deleted += 1;
        assert!(deleted < 200_000, "deletes never ran out of space");
    }
    // Its checkpoint fills every clean segment (31 map pages and a summary
    // page each) and more.
    let (clean, _) = lld.clean_segment_counts();
    let (_, _, dirty) = lld.map_figures();
    assert!(
        dirty > clean as usize * 31,
        "{dirty} dirty pages, {clean} clean segments"
    );
    lld.end_aru(aru).unwrap();
    // Enough to fill a segment or two after the checkpoint.
    for j in 0..12u64 {
        lld.write(None, l, 60_000 + j, &data(1000 + j, 32 << 10))
            .unwrap();
    }
    lld.flush().unwrap();
    let image = dev.durable_image();
    lld.abandon();
    let lld = Lld::open(
        Arc::new(MemoryDevice::from_vec(image)),
        LldOptions::default(),
    )
    .expect("reopen");
    assert!(
        lld.open_report().failed_slots.is_empty(),
        "{:?}",
        lld.open_report()
    );
    for j in 0..12u64 {
        assert_eq!(
            lld.read(l, 60_000 + j).unwrap().unwrap(),
            data(1000 + j, 32 << 10)
        );
    }
    assert_eq!(lld.read(l, 1).unwrap(), None);
    assert!(lld.check_usage().unwrap().is_empty());
}

/// The cleaner moves map pages by marking them dirty for the next
/// checkpoint: on a full device it may mark only as many as that
/// checkpoint can write.
#[test]
fn map_pages_are_moved_only_while_their_checkpoint_fits() {
    // Without threads and with no checkpoint finished during the writes:
    // the layout (where each checkpoint lands) depended on when the
    // checkpointer thread got to the checkpoints the writes started (see
    // `a_full_device_takes_deletes_after_moved_map_pages_in_every_layout`).
    full_device_delete_after_map_page_moves(0, 0).unwrap();
}

/// Every block of each list (`None` for a list that does not exist).
type Lists = Vec<Option<Vec<(u64, Vec<u8>)>>>;

fn lists_of(lld: &Lld, lists: &[ListId]) -> Lists {
    lists
        .iter()
        .map(|&l| {
            lld.list_hints(l).unwrap()?;
            Some(
                lld.indices(l, 0, usize::MAX)
                    .unwrap()
                    .into_iter()
                    .map(|i| (i, lld.read(l, i).unwrap().unwrap()))
                    .collect(),
            )
        })
        .collect()
}

fn usage_is_exact(lld: &Lld, when: &str) {
    assert_eq!(lld.accounting_drift(), 0, "{when}: accounting drifted");
    let problems = lld.check_usage().unwrap();
    assert!(problems.is_empty(), "{when}: {problems:?}");
}

/// Reopens the durable image of `dev` (what a crash right now keeps of
/// everything flushed), after abandoning `lld`.
fn crash_reopen(lld: Lld, dev: &CrashDevice) -> Lld {
    let image = dev.durable_image();
    lld.abandon();
    Lld::open(
        Arc::new(CrashDevice::from_image(image)),
        LldOptions::default(),
    )
    .unwrap()
}

#[test]
fn abort_aru_takes_back_every_change_and_recovery_agrees() {
    let dev = Arc::new(CrashDevice::new(16 << 20));
    let opts = LldOptions {
        partial_bytes: 16 << 10, // seals often: versions move from slots to addresses
        ..Default::default()
    };
    let lld = Lld::create(dev.clone(), &small_mkfs(), opts).unwrap();
    let a = lld.create_list(None, ListHints::default()).unwrap();
    let b = lld.create_list(None, ListHints::default()).unwrap();
    for i in 0..40u64 {
        lld.write(None, a, i, &data(i, 100 + i as usize * 131))
            .unwrap();
    }
    for i in 0..20u64 {
        lld.write(None, b, i, &data(1000 + i, 3000)).unwrap();
    }
    lld.flush().unwrap();
    // Still in the open partial (buffered) when the ARU replaces them.
    for i in 40..50u64 {
        lld.write(None, a, i, &data(2000 + i, 700)).unwrap();
    }
    let d = ListId(b.0 + 1); // the list the ARU will create
    let all = [a, b, d];
    let before = lists_of(&lld, &all);
    let space_before = lld.space();

    let x = lld.begin_aru().unwrap();
    lld.reserve(x, 256 << 10).unwrap();
    for i in (0..10u64).chain(40..45).chain(100..110) {
        lld.write(Some(x), a, i, &data(3000 + i, 2500)).unwrap();
    }
    lld.write(Some(x), a, 1, b"written twice").unwrap();
    lld.delete(Some(x), a, 20).unwrap();
    lld.delete(Some(x), a, 39).unwrap();
    lld.delete_range(Some(x), a, 25..35).unwrap();
    lld.delete_range(Some(x), a, 45..50).unwrap();
    lld.delete_list(Some(x), b).unwrap();
    assert_eq!(lld.create_list(Some(x), ListHints::default()).unwrap(), d);
    lld.write(Some(x), d, 0, b"in a list the abort removes")
        .unwrap();
    lld.flush().unwrap(); // the ARU's records reach the log, unended
    lld.write(Some(x), a, 2, b"after the flush").unwrap();
    lld.delete(Some(x), a, 100).unwrap();
    // Changes by others meanwhile stand: a committed ARU and a plain write,
    // on keys the aborted ARU also changed (before and after them).
    let y = lld.begin_aru().unwrap();
    lld.write(Some(y), a, 60, b"by y").unwrap();
    lld.write(Some(y), a, 3, b"y after x").unwrap();
    lld.end_aru(y).unwrap();
    lld.write(None, a, 30, b"plain write over x's delete")
        .unwrap();
    lld.write(Some(x), a, 60, b"x after y").unwrap();

    lld.abort_aru(x).unwrap();
    let mut want = before.clone();
    {
        let la = want[0].as_mut().unwrap();
        let mut m: std::collections::BTreeMap<u64, Vec<u8>> = la.drain(..).collect();
        m.insert(60, b"by y".to_vec());
        m.insert(3, b"y after x".to_vec());
        m.insert(30, b"plain write over x's delete".to_vec());
        la.extend(m);
    }
    assert_eq!(lists_of(&lld, &all), want, "running engine after abort");
    assert!(lld.list_hints(d).unwrap().is_none());
    usage_is_exact(&lld, "after abort");
    assert!(matches!(lld.abort_aru(x), Err(LdError::NoSuchAru(_))));
    assert!(matches!(lld.end_aru(x), Err(LdError::NoSuchAru(_))));
    let z = lld.begin_aru().unwrap();
    assert!(z.0 > y.0, "ARU ids are never reused");
    lld.end_aru(z).unwrap();
    // Live bytes: as before the ARU, with y's and the plain write's blocks
    // in place of the ones they replaced.
    let extra = [
        b"by y".len(),
        b"y after x".len(),
        b"plain write over x's delete".len(),
    ]
    .iter()
    .sum::<usize>() as u64;
    let a3_old = (100 + 3 * 131) as u64;
    let a30_old = (100 + 30 * 131) as u64;
    assert_eq!(
        lld.space().live_bytes,
        space_before.live_bytes + extra - a3_old - a30_old,
        "live bytes after the abort"
    );

    lld.flush().unwrap();
    let lld = crash_reopen(lld, &dev);
    assert_eq!(lists_of(&lld, &all), want, "after a crash");
    usage_is_exact(&lld, "after a crash");
}

#[test]
fn a_checkpoint_after_an_abort_keeps_the_aru_out() {
    let dev = Arc::new(CrashDevice::new(16 << 20));
    let lld = Lld::create(dev.clone(), &small_mkfs(), LldOptions::default()).unwrap();
    let a = lld.create_list(None, ListHints::default()).unwrap();
    for i in 0..30u64 {
        lld.write(None, a, i, &data(i, 4096)).unwrap();
    }
    lld.flush().unwrap();
    let before = lists_of(&lld, &[a]);
    let x = lld.begin_aru().unwrap();
    for i in 0..10u64 {
        lld.write(Some(x), a, i, &data(100 + i, 4096)).unwrap();
    }
    lld.delete_range(Some(x), a, 10..30).unwrap();
    lld.flush().unwrap();
    // While the ARU is open no checkpoint can be taken; after the abort one can.
    assert!(lld.checkpoint_now().is_err());
    lld.abort_aru(x).unwrap();
    lld.checkpoint_now().unwrap();
    lld.write(None, a, 50, b"after the checkpoint").unwrap();
    lld.flush().unwrap();
    let mut want = before.clone();
    want[0]
        .as_mut()
        .unwrap()
        .push((50, b"after the checkpoint".to_vec()));
    assert_eq!(lists_of(&lld, &[a]), want);
    let lld = crash_reopen(lld, &dev);
    assert_eq!(lists_of(&lld, &[a]), want, "reopened after a crash");
    usage_is_exact(&lld, "reopened after a crash");
    lld.close().unwrap();
    let lld = Lld::open(dev.clone(), LldOptions::default()).unwrap();
    assert_eq!(lists_of(&lld, &[a]), want, "reopened after close");
    usage_is_exact(&lld, "reopened after close");
}

#[test]
fn abort_restores_blocks_in_segments_the_cleaner_emptied_meanwhile() {
    use ldfs::lld::PolicyKind;
    let dev = Arc::new(CrashDevice::new(16 << 20));
    let lld = Lld::create(dev.clone(), &small_mkfs(), LldOptions::default()).unwrap();
    let a = lld.create_list(None, ListHints::default()).unwrap();
    let b = lld.create_list(None, ListHints::default()).unwrap();
    // a's and b's blocks share segments.
    for i in 0..96u64 {
        lld.write(None, a, i, &data(i, 4096)).unwrap();
        lld.write(None, b, i, &data(500 + i, 4096)).unwrap();
    }
    lld.flush().unwrap();
    lld.checkpoint_now().unwrap();
    let before = lists_of(&lld, &[a, b]);
    let x = lld.begin_aru().unwrap();
    lld.delete_list(Some(x), a).unwrap();
    // Half-empty segments: the cleaner moves b's blocks out, leaving them
    // with no live bytes; nothing is released while x is open.
    let rep = lld.clean(PolicyKind::Greedy, 8).unwrap();
    assert!(rep.blocks_moved > 0, "{rep:?}");
    assert_eq!(
        rep.released, 0,
        "a segment was released while an ARU was open"
    );
    lld.abort_aru(x).unwrap();
    assert_eq!(lists_of(&lld, &[a, b]), before);
    usage_is_exact(&lld, "after the abort");
    lld.checkpoint_now().unwrap();
    usage_is_exact(&lld, "after the checkpoint");
    assert_eq!(lists_of(&lld, &[a, b]), before);
    let lld = crash_reopen(lld, &dev);
    assert_eq!(lists_of(&lld, &[a, b]), before, "reopened");
    usage_is_exact(&lld, "reopened");
}

#[test]
fn abort_gives_back_the_space_it_took() {
    let dev = Arc::new(CrashDevice::new(16 << 20));
    let lld = Lld::create(dev.clone(), &small_mkfs(), LldOptions::default()).unwrap();
    let a = lld.create_list(None, ListHints::default()).unwrap();
    for i in 0..20u64 {
        lld.write(None, a, i, &data(i, 4096)).unwrap();
    }
    lld.flush().unwrap();
    let before = lld.space();
    let x = lld.begin_aru().unwrap();
    lld.reserve(x, 1 << 20).unwrap();
    assert!(lld.space().available_bytes < before.available_bytes);
    for i in 0..100u64 {
        lld.write(Some(x), a, 100 + i, &data(i, 4096)).unwrap();
    }
    lld.delete_range(Some(x), a, 0..20).unwrap();
    lld.abort_aru(x).unwrap();
    assert_eq!(lld.space(), before);
    usage_is_exact(&lld, "after the abort");
}

/// Aborting an ARU that deleted a range puts the range's entries back: the
/// map leaves that held them are made again, and the checkpoint that must
/// follow writes them. On a full device the delete keeps room for that.
#[test]
fn aborting_a_large_range_delete_on_a_full_device_keeps_the_engine_writable() {
    let dev = Arc::new(CrashDevice::new(16 << 20));
    let lld = Lld::create(dev.clone(), &small_mkfs(), LldOptions::default()).unwrap();
    let l = lld.create_list(None, ListHints::default()).unwrap();
    for i in 0..40_000u64 {
        lld.write(None, l, i, &[i as u8]).unwrap();
    }
    lld.checkpoint_now().unwrap();
    // Segments half live, half dead: full, and nothing to release.
    let aru = lld.begin_aru().unwrap();
    let mut k = 0u64;
    loop {
        let key = if k.is_multiple_of(2) {
            100_000 + k
        } else {
            90_000 + k % 8
        };
        match lld.write(Some(aru), l, key, &data(k, 32 << 10)) {
            Ok(()) => k += 1,
            Err(LdError::NoSpace { .. }) => break,
            Err(e) => panic!("write {k}: {e}"),
        }
    }
    lld.end_aru(aru).unwrap();
    let x = lld.begin_aru().unwrap();
    match lld.delete_range(Some(x), l, 0..40_000) {
        Ok(()) => lld.abort_aru(x).unwrap(),
        Err(LdError::NoSpace { .. }) => lld.abort_aru(x).unwrap(),
        Err(e) => panic!("delete_range: {e}"),
    }
    assert_eq!(lld.read(l, 12_345).unwrap().unwrap(), [12_345u64 as u8]);
    lld.checkpoint_now().unwrap();
    lld.delete(None, l, 7).unwrap();
    lld.close().unwrap();
    drop(lld);
    let lld = Lld::open(dev, LldOptions::default()).unwrap();
    assert_eq!(lld.read(l, 7).unwrap(), None);
    assert_eq!(lld.read(l, 39_999).unwrap().unwrap(), [39_999u64 as u8]);
    assert!(lld.check_usage().unwrap().is_empty());
}

/// `close` aborts the ARUs still open (their operations never finished):
/// none of their changes is in the final checkpoint, nor read after a
/// reopen, while what was written outside them is.
#[test]
fn close_aborts_the_arus_still_open() {
    let dev = Arc::new(CrashDevice::new(16 << 20));
    let lld = Lld::create(dev.clone(), &small_mkfs(), LldOptions::default()).unwrap();
    let a = lld.create_list(None, ListHints::default()).unwrap();
    lld.write(None, a, 1, b"before").unwrap();
    lld.flush().unwrap();
    let x = lld.begin_aru().unwrap();
    lld.write(Some(x), a, 1, b"open ARU's overwrite").unwrap();
    lld.write(Some(x), a, 2, b"open ARU's new block").unwrap();
    lld.flush().unwrap(); // its records reach the log, unended
    lld.write(None, a, 3, b"outside").unwrap();
    let _empty = lld.begin_aru().unwrap(); // logged nothing
    lld.close().unwrap();
    assert!(matches!(lld.end_aru(x), Err(LdError::ReadOnly(_))));
    drop(lld);
    let lld = Lld::open(
        Arc::new(CrashDevice::from_image(dev.durable_image())),
        LldOptions::default(),
    )
    .unwrap();
    assert_eq!(lld.read(a, 1).unwrap().as_deref(), Some(&b"before"[..]));
    assert_eq!(lld.read(a, 2).unwrap(), None);
    assert_eq!(lld.read(a, 3).unwrap().as_deref(), Some(&b"outside"[..]));
    usage_is_exact(&lld, "after close with an ARU open");
}

/// A write or delete that fails because a map page cannot be read (its
/// leaf was evicted) reports the failure and leaves nothing of itself to
/// reach the log: after a flush and a crash its key is as before. (The
/// write is taken out of the open partial again; a failed delete turns
/// the engine read-only, so its record is never written.)
#[test]
fn an_operation_failing_on_a_map_page_read_leaves_nothing_in_the_log() {
    for delete in [false, true] {
        let crash = Arc::new(CrashDevice::new(32 << 20));
        let fault = Arc::new(FaultDevice::new(crash.clone(), FaultPlan::default()));
        let opts = LldOptions {
            map_budget_bytes: 64 << 10,
            ..Default::default()
        };
        let lld = Lld::create(fault.clone(), &small_mkfs(), opts.clone()).unwrap();
        let l = lld.create_list(None, ListHints::default()).unwrap();
        for i in 0..20_000u64 {
            lld.write(None, l, i, &[1]).unwrap();
        }
        lld.checkpoint_now().unwrap();
        // The list's entry (checked by every operation) is resident; leaves
        // far from it are mostly evicted by now.
        lld.write(None, l, 0, &[1]).unwrap();
        let mut failed = None;
        for i in (5000..20_000u64).step_by(997) {
            fault.set_plan(FaultPlan {
                fail_read_nth: Some(1),
                ..Default::default()
            });
            let res = if delete {
                lld.delete(None, l, i)
            } else {
                lld.write(None, l, i, &[2])
            };
            let fired = fault.fired();
            fault.set_plan(FaultPlan::default());
            if fired {
                assert!(res.is_err(), "delete {delete}: key {i}: {res:?}");
                failed = Some(i);
                break;
            }
            res.unwrap();
        }
        let i = failed.expect("no operation read a map page");
        let _ = lld.flush();
        let image = crash.durable_image();
        lld.abandon();
        let lld = Lld::open(Arc::new(CrashDevice::from_image(image)), opts).unwrap();
        assert_eq!(
            lld.read(l, i).unwrap(),
            Some(vec![1]),
            "delete {delete}: the failed operation's key {i} after a crash"
        );
    }
}

/// Calls of one kind (writes, or flushes) made by the thread named
/// `thread` wait at a gate while it is shut and, once through, fail if
/// `fail` is set; everyone else's calls go straight through.
struct ThreadGate {
    inner: MemoryDevice,
    thread: &'static str,
    writes: bool,
    /// (shut, calls waiting)
    gate: Mutex<(bool, usize)>,
    cv: Condvar,
    fail: std::sync::atomic::AtomicBool,
}

impl ThreadGate {
    fn new(thread: &'static str, writes: bool) -> ThreadGate {
        ThreadGate {
            inner: MemoryDevice::new(16 << 20),
            thread,
            writes,
            gate: Mutex::new((false, 0)),
            cv: Condvar::new(),
            fail: std::sync::atomic::AtomicBool::new(false),
        }
    }

    fn shut(&self, shut: bool) {
        self.gate.lock().unwrap().0 = shut;
        self.cv.notify_all();
    }

    fn await_blocked(&self, limit: Duration) -> bool {
        let g = self.gate.lock().unwrap();
        let (g, _) = self.cv.wait_timeout_while(g, limit, |g| g.1 == 0).unwrap();
        g.1 > 0
    }

    /// The gate for a call of the gated kind; an error if it must fail.
    fn pass(&self, op: ldfs::device::DeviceOp, offset: u64) -> Result<(), DeviceError> {
        if std::thread::current().name() != Some(self.thread) {
            return Ok(());
        }
        let mut g = self.gate.lock().unwrap();
        g.1 += 1;
        self.cv.notify_all();
        while g.0 {
            g = self.cv.wait(g).unwrap();
        }
        g.1 -= 1;
        if self.fail.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(DeviceError::Injected { op, n: 0, offset });
        }
        Ok(())
    }
}

impl Device for ThreadGate {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), DeviceError> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), DeviceError> {
        if self.writes {
            self.pass(ldfs::device::DeviceOp::Write, offset)?;
        }
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> Result<(), DeviceError> {
        if !self.writes {
            self.pass(ldfs::device::DeviceOp::Flush, 0)?;
        }
        self.inner.flush()
    }
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
}

struct OpenGate(Arc<ThreadGate>);

impl Drop for OpenGate {
    fn drop(&mut self) {
        self.0.shut(false);
    }
}

/// Review probe (group commit, writes completing out of order): the log
/// writer thread holds a plain partial segment at the device when a group
/// commit's leader seals the next one and writes it itself. The flush
/// waits for the thread's partial too, and when that write fails the
/// flush fails (it covers it), the engine turns read-only, and reads still
/// find every block of both partials.
#[test]
fn a_group_commit_fails_when_the_writer_threads_earlier_partial_fails() {
    let dev = Arc::new(ThreadGate::new("ldfs-log-writer", true));
    let opts = LldOptions {
        // A 4 KiB write fills a partial: the write seals it (a plain
        // submit, for the writer thread).
        partial_bytes: 4096,
        ..LldOptions::default()
    };
    let lld = Arc::new(Lld::create(dev.clone(), &small_mkfs(), opts).unwrap());
    let l = lld.create_list(None, ListHints::default()).unwrap();
    lld.write(None, l, 0, &data(0, 4096)).unwrap();
    lld.flush().unwrap();
    let _open = OpenGate(dev.clone());
    dev.fail.store(true, std::sync::atomic::Ordering::SeqCst);
    dev.shut(true);
    lld.write(None, l, 1, &data(1, 4096)).unwrap();
    assert!(
        dev.await_blocked(Duration::from_secs(10)),
        "the log writer thread took nothing"
    );
    // Smaller than a partial: the flush's leader seals it (quietly) and
    // writes it on its own thread.
    lld.write(None, l, 2, b"small").unwrap();
    let flusher = {
        let lld = lld.clone();
        std::thread::spawn(move || lld.flush())
    };
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        !flusher.is_finished(),
        "the flush returned while a partial it covers was still being written"
    );
    dev.shut(false);
    let res = flusher.join().unwrap();
    assert!(
        res.is_err(),
        "flush returned {res:?} though a partial it covers failed"
    );
    assert!(matches!(
        lld.write(None, l, 3, b"more"),
        Err(LdError::ReadOnly(_))
    ));
    assert!(lld.flush().is_err(), "a later flush");
    assert_eq!(lld.read(l, 0).unwrap().unwrap(), data(0, 4096));
    assert_eq!(lld.read(l, 1).unwrap().unwrap(), data(1, 4096));
    assert_eq!(lld.read(l, 2).unwrap().unwrap(), b"small");
}

/// (Found by review: the race `flush_as_leader`'s comment left open.) A
/// checkpoint's device flush, on the checkpointer thread, fails while a
/// group commit's own flush succeeds, the failure reported only after the
/// group commit looked. A device whose flush fails may have dropped the
/// writes it held (the group commit's among them: the checkpoint's phase 2
/// wrote them), and the later flush that succeeds does not bring them
/// back (Linux reports a writeback error to one fsync of a file
/// description only), so the group commit must not return Ok.
#[test]
fn a_group_commit_overlapping_a_failing_checkpoint_flush_fails() {
    let dev = Arc::new(ThreadGate::new("ldfs-checkpointer", false));
    let opts = LldOptions {
        // The next write is due a checkpoint, handed to the checkpointer.
        checkpoint_dirty_pages: Some(1),
        ..LldOptions::default()
    };
    let lld = Arc::new(Lld::create(dev.clone(), &small_mkfs(), opts).unwrap());
    let l = lld.create_list(None, ListHints::default()).unwrap();
    lld.checkpoint_now().unwrap();
    let _open = OpenGate(dev.clone());
    // The checkpoint's flush fails as it is issued; it returns later.
    dev.fail.store(true, std::sync::atomic::Ordering::SeqCst);
    dev.shut(true);
    lld.write(None, l, 1, &data(1, 4096)).unwrap();
    assert!(
        dev.await_blocked(Duration::from_secs(10)),
        "no checkpoint flush started"
    );
    // (A fix may make the group commit wait for the flushes under way
    // when its own ends: the gate opens after a while.)
    let flusher = {
        let lld = lld.clone();
        std::thread::spawn(move || lld.flush())
    };
    std::thread::sleep(Duration::from_millis(200));
    dev.shut(false);
    let res = flusher.join().unwrap();
    assert!(
        res.is_err(),
        "a group commit returned {res:?} while a checkpoint flush covering its write failed"
    );
}

/// Records which pages whole-page writes (aligned to 4 KiB in offset and
/// length) and other writes touch.
struct PageKinds {
    inner: MemoryDevice,
    /// (pages of aligned writes, pages of unaligned writes)
    seen: Mutex<(
        std::collections::BTreeSet<u64>,
        std::collections::BTreeSet<u64>,
    )>,
}

impl PageKinds {
    fn new(bytes: u64) -> PageKinds {
        PageKinds {
            inner: MemoryDevice::new(bytes),
            seen: Mutex::new(Default::default()),
        }
    }

    /// Pages both kinds of write touched.
    fn mixed(&self) -> Vec<u64> {
        let s = self.seen.lock().unwrap();
        println!("{} pages written whole, {} in part", s.0.len(), s.1.len());
        assert!(!s.0.is_empty(), "no whole-page write: nothing was checked");
        s.0.intersection(&s.1).copied().collect()
    }
}

impl Device for PageKinds {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), DeviceError> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), DeviceError> {
        if !buf.is_empty() {
            let whole = offset.is_multiple_of(4096) && buf.len().is_multiple_of(4096);
            let mut s = self.seen.lock().unwrap();
            let set = if whole { &mut s.0 } else { &mut s.1 };
            set.extend(offset / 4096..=(offset + buf.len() as u64 - 1) / 4096);
        }
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> Result<(), DeviceError> {
        self.inner.flush()
    }
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
}

/// Review probe for `FileDevice::direct_writes`, which sends whole-page
/// writes through `O_DIRECT` and the rest through the page cache: no page
/// of an image (log, checkpoint slots, superblocks; a dual pair's data
/// device) is ever written both ways, so a buffered write can never race
/// a direct write of the same page (a dirty cached page written back
/// after a direct write would undo it). Runs mkfs, a file system
/// workload with checkpoints and the cleaner, and a close.
#[test]
fn no_page_is_written_both_whole_and_in_part() {
    use ldfs::fs::{Ctx, Fs, FsOptions};
    let ctx = Ctx {
        uid: 0,
        gid: 0,
        umask: 0,
    };
    let mkfs = MkfsOptions {
        segment_bytes: 256 << 10,
        max_block_bytes: 64 << 10,
        reserved_segments: Some(8),
        fs_id: 78,
        max_bytes: None,
        kept_pages: 0,
    };
    let opts = LldOptions {
        checkpoint_dirty_pages: Some(4),
        ..LldOptions::default()
    };
    let workload = |fs: &Fs| {
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let mut inos = Vec::new();
        for i in 0..200u64 {
            let name = format!("f{}", i % 40);
            let a = match fs.lookup(ldfs::fs::ROOT_INO, name.as_bytes()) {
                Ok(a) => a,
                Err(_) => fs
                    .mknod(ctx, ldfs::fs::ROOT_INO, name.as_bytes(), 0o100644, 0)
                    .unwrap(),
            };
            inos.push(a.ino);
            let len = rng.gen_range(1..40_000usize);
            let off = rng.gen_range(0..200_000u64);
            fs.write(a.ino, off, &data(i, len)).unwrap();
            if i % 17 == 0 {
                fs.unlink(ldfs::fs::ROOT_INO, name.as_bytes()).unwrap();
            }
            if i % 23 == 0 {
                fs.fsync().unwrap();
            }
        }
    };
    // One log.
    let dev = Arc::new(PageKinds::new(32 << 20));
    let lld = Lld::create(dev.clone(), &mkfs, opts.clone()).unwrap();
    Fs::format(&lld, ctx).unwrap();
    lld.close().unwrap();
    drop(lld);
    let lld = Arc::new(Lld::open(dev.clone(), opts.clone()).unwrap());
    let fs = Fs::mount(lld.clone(), FsOptions::default()).unwrap();
    workload(&fs);
    drop(fs);
    lld.clean_now(
        ldfs::lld::PolicyKind::default(),
        Some(4),
        0.9,
        &std::sync::atomic::AtomicBool::new(false),
    )
    .unwrap();
    lld.close().unwrap();
    assert_eq!(
        dev.mixed(),
        Vec::<u64>::new(),
        "one log: pages written both ways"
    );
    // A dual pair.
    let meta = Arc::new(PageKinds::new(32 << 20));
    let data_dev = Arc::new(PageKinds::new(32 << 20));
    ldfs::dual::mkfs(
        meta.clone(),
        &*data_dev,
        &ldfs::dual::DualMkfsOptions {
            lld: mkfs,
            group_blocks: 256,
            meta_path: String::new(),
        },
    )
    .unwrap();
    let d = Arc::new(ldfs::dual::Dual::open(meta.clone(), data_dev.clone(), opts).unwrap());
    Fs::format(&*d, ctx).unwrap();
    let fs = Fs::mount(d.clone(), FsOptions::default()).unwrap();
    workload(&fs);
    drop(fs);
    d.close().unwrap();
    assert_eq!(meta.mixed(), Vec::<u64>::new(), "dual metadata device");
    assert_eq!(data_dev.mixed(), Vec::<u64>::new(), "dual data device");
}

/// Review probe (group commit, quiet seals, out-of-order log writes and
/// checkpoints together): threads write and flush concurrently while the
/// log writer thread, the group commits' leaders and the checkpointer all
/// write; crash images taken meanwhile (every unflushed write kept, lost
/// or torn at random) must each hold every block whose flush had returned
/// Ok before the image was taken, with that version or a later one.
#[test]
fn concurrent_group_commits_keep_every_acknowledged_block_across_crashes() {
    use std::collections::HashMap;
    let seed = std::env::var("LDFS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_u64);
    println!("seed {seed} (LDFS_SEED)");
    let dev = Arc::new(CrashDevice::new(32 << 20));
    let opts = LldOptions {
        // Frequent checkpoints racing the group commits, small partials
        // (many log writer items), and group commits sealing the rest.
        checkpoint_dirty_pages: Some(2),
        partial_bytes: 16 << 10,
        ..LldOptions::default()
    };
    let lld = Arc::new(Lld::create(dev.clone(), &small_mkfs(), opts.clone()).unwrap());
    let l = lld.create_list(None, ListHints::default()).unwrap();
    lld.flush().unwrap();
    // key -> version whose flush returned Ok.
    let acked: Arc<Mutex<HashMap<u64, u64>>> = Arc::new(Mutex::new(HashMap::new()));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let value = |key: u64, version: u64, len: usize| {
        let mut v = data(key * 1_000_003 + version, len.max(16));
        v[..8].copy_from_slice(&key.to_le_bytes());
        v[8..16].copy_from_slice(&version.to_le_bytes());
        v
    };
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let (lld, acked, stop) = (lld.clone(), acked.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut rng = ChaCha8Rng::seed_from_u64(seed ^ (t + 1));
                let mut version: HashMap<u64, u64> = HashMap::new();
                let mut unflushed: HashMap<u64, u64> = HashMap::new();
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    let key = t * 1000 + rng.gen_range(0..40u64);
                    let v = version.entry(key).or_insert(0);
                    *v += 1;
                    let len = rng.gen_range(16..6000usize);
                    lld.write(None, l, key, &value(key, *v, len)).unwrap();
                    unflushed.insert(key, *v);
                    if rng.gen_range(0..3) == 0 {
                        lld.flush().unwrap();
                        acked.lock().unwrap().extend(unflushed.drain());
                    }
                }
            })
        })
        .collect();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut images = Vec::new();
    for i in 0..12u64 {
        std::thread::sleep(Duration::from_millis(rng.gen_range(2..15)));
        let before = acked.lock().unwrap().clone();
        let image = dev.crash_image(seed ^ (i << 32), &CrashOptions::default());
        images.push((i, before, image));
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    for t in threads {
        t.join().unwrap();
    }
    let st = lld.stats();
    println!(
        "{} checkpoints, {} device flushes, {} keys acknowledged",
        st.checkpoints,
        st.device_flushes,
        acked.lock().unwrap().len()
    );
    assert!(st.checkpoints > 2, "no checkpoint raced the group commits");
    for (i, before, image) in images {
        let got = Lld::open(Arc::new(CrashDevice::from_image(image)), opts.clone())
            .unwrap_or_else(|e| panic!("seed {seed}, image {i}: open: {e}"));
        for (key, v) in before {
            let b = got
                .read(l, key)
                .unwrap_or_else(|e| panic!("seed {seed}, image {i}: key {key}: {e}"))
                .unwrap_or_else(|| panic!("seed {seed}, image {i}: key {key} (v{v}) lost"));
            let found = u64::from_le_bytes(b[8..16].try_into().unwrap());
            assert_eq!(u64::from_le_bytes(b[..8].try_into().unwrap()), key);
            assert!(
                found >= v,
                "seed {seed}, image {i}: key {key} is v{found}, v{v} was flushed"
            );
            assert_eq!(
                b,
                value(key, found, b.len()),
                "seed {seed}: key {key} v{found}"
            );
        }
        got.abandon();
    }
}

/// Review probe: `map_pages_are_moved_only_while_their_checkpoint_fits`
/// with the checkpointer's timing made explicit. That test fails about one
/// full-suite run in five under load (NoSpace on its last delete): how far
/// the writes get before each checkpoint is applied decides the layout, and
/// some layouts leave a delete on the full device no room after the
/// checkpoint that writes the moved map pages. Here the checkpoints started
/// by the 40,000 writes are finished at seeded points (no threads), which
/// replays such layouts exactly (seeds 4 and 52 of 60 fail at 1 in 5000).
#[test]
fn a_full_device_takes_deletes_after_moved_map_pages_in_every_layout() {
    let mut bad = Vec::new();
    for seed in [4u64, 52] {
        if let Err(e) = full_device_delete_after_map_page_moves(seed, 5000) {
            bad.push(e);
        }
    }
    assert!(bad.is_empty(), "{bad:?}");
}

/// Full of half-dead segments, every live map page asked to move (the
/// cleaner's primitive: only as many move as the next checkpoint can
/// write), a checkpoint, then a delete must still work. Without threads;
/// after each of the 40,000 first writes a pending checkpoint is finished
/// with probability 1/`p` (seeded; never for `p` 0).
fn full_device_delete_after_map_page_moves(seed: u64, p: u32) -> Result<(), String> {
    let dev = Arc::new(CrashDevice::new(16 << 20));
    let opts = LldOptions {
        checkpoint_thread: false,
        log_writer_thread: false,
        ..LldOptions::default()
    };
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let lld = Lld::create(dev.clone(), &small_mkfs(), opts).unwrap();
    let l = lld.create_list(None, ListHints::default()).unwrap();
    for i in 0..40_000u64 {
        lld.write(None, l, i, &[i as u8]).unwrap();
        if p != 0 && rng.gen_range(0..p) == 0 {
            lld.finish_checkpoint().unwrap();
        }
    }
    lld.checkpoint_now().unwrap();
    // Fill the log with segments half live, half dead: nothing a
    // checkpoint could release. Inside an ARU, so no write waits for the
    // cleaner.
    let aru = lld.begin_aru().unwrap();
    let mut k = 0u64;
    loop {
        let key = if k.is_multiple_of(2) {
            100_000 + k
        } else {
            90_000 + k % 8
        };
        match lld.write(Some(aru), l, key, &data(k, 32 << 10)) {
            Ok(()) => k += 1,
            Err(LdError::NoSpace { .. }) => break,
            Err(e) => panic!("write {k}: {e}"),
        }
    }
    lld.end_aru(aru).unwrap();
    // Every live map page of the 40,000 blocks' leaves, asked to move.
    let geo = lld.geometry();
    let mut pages = Vec::new();
    for (seg, u) in lld.segment_usage() {
        if u.live_bytes == 0 {
            continue;
        }
        for (h, recs) in lld.segment_summaries(seg).unwrap() {
            for r in recs {
                if let ldfs::lld::summary::Record::MapPage { data_off, .. } = r {
                    let addr = geo.page_addr(seg, h.page + h.summary_pages) + data_off as u64;
                    if lld.map_page_is_live(addr) {
                        pages.push(addr);
                    }
                }
            }
        }
    }
    assert!(pages.len() > 300, "{} live map pages", pages.len());
    let moved = pages
        .iter()
        .filter(|&&a| lld.relocate_map_page(a).unwrap())
        .count();
    assert!(moved > 0 && moved < pages.len(), "moved {moved}");
    lld.checkpoint_now().unwrap();
    // Full, but not stuck: deletes go on.
    lld.delete(None, l, 0)
        .map_err(|e| format!("seed {seed} p {p} k {k} moved {moved}: {e}"))?;
    lld.close().unwrap();
    drop(lld);
    let lld = Lld::open(dev, LldOptions::default()).unwrap();
    assert_eq!(lld.read(l, 0).unwrap(), None);
    assert_eq!(lld.read(l, 39_999).unwrap().unwrap(), [39_999u64 as u8]);
    assert!(lld.check_usage().unwrap().is_empty());
    Ok(())
}

/// Review probe (read-only transitions and waiters): threads writing and
/// flushing, with checkpoints racing, when the device's writes start
/// failing for good. Every call returns (no group commit follower, queue
/// space waiter or checkpoint waiter is left asleep), flushes fail from
/// then on, and the engine is read-only.
#[test]
fn a_device_failing_under_concurrent_group_commits_leaves_no_waiter_hung() {
    let dev = Arc::new(FaultDevice::new(
        MemoryDevice::new(32 << 20),
        FaultPlan::default(),
    ));
    let opts = LldOptions {
        checkpoint_dirty_pages: Some(2),
        partial_bytes: 16 << 10,
        ..LldOptions::default()
    };
    let lld = Arc::new(Lld::create(dev.clone(), &small_mkfs(), opts).unwrap());
    let l = lld.create_list(None, ListHints::default()).unwrap();
    let (tx, rx) = mpsc::channel();
    for t in 0..6u64 {
        let (lld, tx) = (lld.clone(), tx.clone());
        std::thread::spawn(move || {
            let mut flush_failed = false;
            let t0 = Instant::now();
            // Until the device fails (or, if it never does, for a while).
            for i in 0.. {
                if t0.elapsed() > Duration::from_secs(10) {
                    break;
                }
                let key = t * 10_000 + i % 50;
                if lld.write(None, l, key, &data(key + i, 3000)).is_err() {
                    break;
                }
                if lld.flush().is_err() {
                    flush_failed = true;
                    break;
                }
            }
            let _ = tx.send((t, flush_failed || lld.flush().is_err()));
        });
    }
    drop(tx);
    std::thread::sleep(Duration::from_millis(30));
    dev.set_plan(FaultPlan {
        fail_write_nth: Some(1),
        sticky: true,
        ..Default::default()
    });
    for _ in 0..6 {
        let (t, failed) = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("a thread hung after the device failed");
        assert!(failed, "thread {t}: a flush after the failure returned Ok");
    }
    assert!(dev.fired(), "the device never failed");
    assert!(matches!(
        lld.write(None, l, 1, b"x"),
        Err(LdError::ReadOnly(_))
    ));
}

/// Review probe (dual layout, outside `OrderedFlushes`): the data device's
/// flush (`DataSync::sync`) fails once; the dual flush reports it, but the
/// next flush flushes the data device again, succeeds and makes the log
/// durable, pointers to data blocks the failed flush may have dropped
/// included (Linux reports a writeback error to one fsync only). Like the
/// engine's device, the data device's flush failure must stay reported.
#[test]
fn a_dual_flush_after_a_failed_data_flush_fails() {
    use ldfs::dual::{Dual, DualMkfsOptions};
    let meta = Arc::new(MemoryDevice::new(32 << 20));
    let data = Arc::new(FaultDevice::new(
        MemoryDevice::new(16 << 20),
        FaultPlan::default(),
    ));
    let mkfs = DualMkfsOptions {
        lld: MkfsOptions {
            segment_bytes: 256 << 10,
            max_block_bytes: 64 << 10,
            reserved_segments: Some(8),
            fs_id: 78,
            max_bytes: None,
            kept_pages: 0,
        },
        group_blocks: 256,
        meta_path: String::new(),
    };
    ldfs::dual::mkfs(meta.clone(), &*data, &mkfs).unwrap();
    let d = Dual::open(meta, data.clone(), LldOptions::default()).unwrap();
    let l = d.create_list(None, ListHints::default()).unwrap();
    d.flush().unwrap();
    d.write(None, l, 0, &[7u8; 4096]).unwrap();
    data.set_plan(FaultPlan {
        fail_flush_nth: Some(1),
        ..Default::default()
    });
    assert!(d.flush().is_err(), "the injected data flush failure");
    assert!(data.fired());
    let res = d.flush();
    assert!(
        res.is_err(),
        "a flush after a failed data-device flush returned {res:?}"
    );
}

/// Consecutive ARUs rewriting one block (a directory's inode, the dual
/// layout's bitmap) log it once per partial segment, not once per ARU; what
/// a crash keeps is unchanged: the last ended ARU's version, or, for a
/// crash before the flush, none of them.
#[test]
fn consecutive_arus_rewriting_a_block_log_it_once_per_partial() {
    let dev = Arc::new(CrashDevice::new(16 << 20));
    let lld = Lld::create(dev.clone(), &small_mkfs(), LldOptions::default()).unwrap();
    let a = lld.create_list(None, ListHints::default()).unwrap();
    lld.write(None, a, 0, b"before the ARUs").unwrap();
    lld.flush().unwrap();
    let before = lld.stats().writes_coalesced;
    let written = dev.stats().bytes_written;
    for i in 0..50u64 {
        let x = lld.begin_aru().unwrap();
        lld.write(Some(x), a, 0, &data(i, 4096)).unwrap();
        lld.write(Some(x), a, 1 + i, b"one of each").unwrap();
        lld.end_aru(x).unwrap();
    }
    // Before the flush nothing of them is durable.
    let image = dev.durable_image();
    let early = Lld::open(
        Arc::new(CrashDevice::from_image(image)),
        LldOptions::default(),
    )
    .unwrap();
    assert_eq!(early.read(a, 0).unwrap().unwrap(), b"before the ARUs");
    assert_eq!(early.read(a, 1).unwrap(), None);
    early.abandon();
    lld.flush().unwrap();
    assert_eq!(lld.stats().writes_coalesced - before, 49);
    let logged = dev.stats().bytes_written - written;
    assert!(
        logged < 4 * 4096 + 32 * 1024,
        "50 ARUs rewriting a 4 KiB block wrote {logged} bytes"
    );
    let lld = crash_reopen(lld, &dev);
    assert_eq!(lld.read(a, 0).unwrap().unwrap(), data(49, 4096));
    assert_eq!(lld.indices(a, 0, usize::MAX).unwrap().len(), 51);
    usage_is_exact(&lld, "after a crash");
}

/// A replaced write is kept while an open ARU's abort could need what
/// follows it, or while its own ARU is open; the abort then gives back the
/// right version, before and after a crash.
#[test]
fn a_write_an_open_aru_may_need_is_not_coalesced_away() {
    let dev = Arc::new(CrashDevice::new(16 << 20));
    let lld = Lld::create(dev.clone(), &small_mkfs(), LldOptions::default()).unwrap();
    let a = lld.create_list(None, ListHints::default()).unwrap();
    lld.flush().unwrap();
    let before = lld.stats().writes_coalesced;
    // x (ends), c (open) and y (ends) write key 0 in turn; c's undo chain
    // names the key, so x's write stays; c's abort leaves y's version.
    let x = lld.begin_aru().unwrap();
    lld.write(Some(x), a, 0, b"x").unwrap();
    lld.end_aru(x).unwrap();
    let c = lld.begin_aru().unwrap();
    lld.write(Some(c), a, 0, b"c").unwrap();
    lld.write(Some(c), a, 9, b"c alone").unwrap();
    let y = lld.begin_aru().unwrap();
    lld.write(Some(y), a, 0, b"y").unwrap();
    lld.end_aru(y).unwrap();
    // o (open) writes key 1, z overwrites it and ends while o is open: o's
    // write stays (o may still end, or abort).
    let o = lld.begin_aru().unwrap();
    lld.write(Some(o), a, 1, b"o").unwrap();
    let z = lld.begin_aru().unwrap();
    lld.write(Some(z), a, 1, b"z").unwrap();
    lld.end_aru(z).unwrap();
    assert_eq!(lld.stats().writes_coalesced, before);
    lld.abort_aru(c).unwrap();
    assert_eq!(lld.read(a, 0).unwrap().unwrap(), b"y");
    assert_eq!(lld.read(a, 9).unwrap(), None);
    lld.end_aru(o).unwrap();
    assert_eq!(lld.read(a, 1).unwrap().unwrap(), b"z");
    lld.flush().unwrap();
    let lld = crash_reopen(lld, &dev);
    assert_eq!(lld.read(a, 0).unwrap().unwrap(), b"y");
    assert_eq!(lld.read(a, 1).unwrap().unwrap(), b"z");
    assert_eq!(lld.read(a, 9).unwrap(), None);
    usage_is_exact(&lld, "after a crash");
}

/// TRIM (issue 17): with `discard`, segments a checkpoint releases are
/// given back to the device once its slot is durable; `trim` gives back
/// every Clean segment. Nothing live is lost, before or after crashes that
/// keep any part of the discards.
#[test]
fn released_and_clean_segments_are_discarded_and_nothing_live_is_lost() {
    let dev = Arc::new(CrashDevice::new(16 << 20));
    let opts = LldOptions {
        discard: true,
        ..Default::default()
    };
    let lld = Lld::create(dev.clone(), &small_mkfs(), opts).unwrap();
    let a = lld.create_list(None, ListHints::default()).unwrap();
    // Every block written three times: the first two versions' segments
    // empty, and checkpoints release them.
    for round in 0..3u64 {
        for i in 0..200u64 {
            lld.write(None, a, i, &data(round * 1000 + i, 4000))
                .unwrap();
        }
        lld.flush().unwrap();
        lld.checkpoint_now().unwrap();
    }
    let want = |lld: &Lld| {
        for i in 0..200u64 {
            assert_eq!(
                lld.read(a, i).unwrap().unwrap(),
                data(2000 + i, 4000),
                "block {i}"
            );
        }
    };
    want(&lld);
    let released = lld.stats().segments_discarded;
    assert!(
        released > 0,
        "no released segment was discarded: {:?}",
        lld.stats()
    );
    assert_eq!(dev.stats().discards, released);
    // trim: every Clean segment, zeroed on the device.
    let (segs, bytes) = lld.trim().unwrap();
    assert!(segs > 0 && bytes == segs * (128 << 10));
    let image = dev.current_image();
    for (s, u) in lld.segment_usage() {
        if u.state == ldfs::lld::usage::SegmentState::Clean {
            let at = lld.geometry().page_addr(s, 0) as usize;
            assert!(
                image[at..at + (128 << 10)].iter().all(|&b| b == 0),
                "clean segment {} not discarded",
                s.0
            );
        }
    }
    want(&lld);
    // Crashes keeping any subset of the unflushed discards (and writes).
    for seed in 0..8u64 {
        let image = dev.crash_image(seed, &CrashOptions::default());
        let back = Lld::open(
            Arc::new(CrashDevice::from_image(image)),
            LldOptions::default(),
        )
        .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        want(&back);
        usage_is_exact(&back, &format!("seed {seed}"));
        back.abandon();
    }
    lld.flush().unwrap();
    let lld = crash_reopen(lld, &dev);
    want(&lld);
}
