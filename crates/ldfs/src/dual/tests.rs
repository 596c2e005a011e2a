use super::*;
use crate::device::MemoryDevice;

const META_BYTES: u64 = 32 << 20;
const DATA_BYTES: u64 = 16 << 20;

fn opts() -> LldOptions {
    LldOptions {
        map_budget_bytes: 1 << 20,
        partial_bytes: 64 << 10,
        ..Default::default()
    }
}

struct Pair {
    meta: Arc<MemoryDevice>,
    data: Arc<MemoryDevice>,
}

impl Pair {
    fn new(group_blocks: u32) -> Pair {
        let p = Pair {
            meta: Arc::new(MemoryDevice::new(META_BYTES)),
            data: Arc::new(MemoryDevice::new(DATA_BYTES)),
        };
        mkfs(
            p.meta.clone(),
            &*p.data,
            &DualMkfsOptions {
                group_blocks,
                meta_path: "/meta".into(),
                ..Default::default()
            },
        )
        .unwrap();
        p
    }

    fn open(&self) -> Dual {
        Dual::open(self.meta.clone(), self.data.clone(), opts()).unwrap()
    }
}

fn data_list(d: &Dual) -> ListId {
    d.create_list(
        None,
        ListHints {
            kind: ListKind::Data,
            ..Default::default()
        },
    )
    .unwrap()
}

fn meta_list(d: &Dual) -> ListId {
    d.create_list(
        None,
        ListHints {
            kind: ListKind::Metadata,
            ..Default::default()
        },
    )
    .unwrap()
}

fn block(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| seed.wrapping_add(i as u8)).collect()
}

/// The data block a data list's block lives in.
fn where_is(d: &Dual, list: ListId, index: u64) -> u64 {
    d.pointer(d.eng(list).unwrap(), index)
        .unwrap()
        .unwrap()
        .block
}

#[test]
fn user_lists_start_at_one_and_data_goes_to_the_data_device() {
    let p = Pair::new(256);
    let d = p.open();
    let m = meta_list(&d);
    assert_eq!(m, ListId(1), "the fs expects its first lists at 1, 2, 3");
    let f = data_list(&d);
    assert_eq!(f, ListId(2));
    assert_eq!(d.lists(0, 10).unwrap(), vec![m, f]);
    d.write(None, m, 0, b"inode").unwrap();
    d.write(None, f, 0, &block(7, 4096)).unwrap();
    d.write(None, f, 1, &block(9, 100)).unwrap();
    assert_eq!(d.read(m, 0).unwrap().unwrap(), b"inode");
    assert_eq!(d.read(f, 0).unwrap().unwrap(), block(7, 4096));
    assert_eq!(d.read(f, 1).unwrap().unwrap(), block(9, 100));
    assert_eq!(d.read(f, 2).unwrap(), None);
    // The file's bytes are on the data device at the pointer's block,
    // its blocks one after the other.
    let b0 = where_is(&d, f, 0);
    assert_eq!(where_is(&d, f, 1), b0 + 1);
    // Data writes reach the device by the next flush (or metadata write).
    d.flush().unwrap();
    let img = p.data.snapshot();
    let off = d.geo.offset(b0) as usize;
    assert_eq!(&img[off..off + 4096], &block(7, 4096)[..]);
    let got = d.read_range(f, 0..10, 10).unwrap();
    assert_eq!(got, vec![(0, block(7, 4096)), (1, block(9, 100))]);
    assert!(d.write(None, f, 3, &[0; 4097]).is_err());
    assert!(d.check_blocks().unwrap().is_empty());
}

#[test]
fn state_survives_a_reopen_and_checks_clean() {
    let p = Pair::new(256);
    let (f, g) = {
        let d = p.open();
        let f = data_list(&d);
        let g = data_list(&d);
        for i in 0..300 {
            d.write(None, f, i, &block(i as u8, 4096)).unwrap();
        }
        d.write(None, g, 5, &block(1, 10)).unwrap();
        d.delete_range(None, f, 100..200).unwrap();
        d.close().unwrap();
        (f, g)
    };
    let d = p.open();
    for i in (0..100).chain(200..300) {
        assert_eq!(d.read(f, i).unwrap().unwrap(), block(i as u8, 4096));
    }
    assert_eq!(d.read(f, 150).unwrap(), None);
    assert_eq!(d.read(g, 5).unwrap().unwrap(), block(1, 10));
    assert_eq!(d.check_blocks().unwrap(), Vec::<String>::new());
    let s = d.stats();
    let free: u64 = s.group_free.iter().map(|&f| f as u64).sum();
    assert_eq!(free, s.geo.blocks - 201);
    // f's 300 blocks took two groups, g's one block a third; the rest
    // are untouched.
    let touched = (0..s.geo.groups)
        .filter(|&g| s.group_free[g as usize] as u64 != s.geo.group_len(g))
        .count();
    assert_eq!(touched, 3, "{:?}", s.group_free);
}

#[test]
fn freed_blocks_wait_for_a_flush() {
    let p = Pair::new(256);
    let d = p.open();
    let f = data_list(&d);
    d.write(None, f, 0, &block(1, 4096)).unwrap();
    let b = where_is(&d, f, 0);
    d.delete(None, f, 0).unwrap();
    let g = data_list(&d);
    d.write(None, g, 0, &block(2, 4096)).unwrap();
    assert_ne!(where_is(&d, g, 0), b, "reused before the free was durable");
    assert_eq!(d.stats().freed_pending, 1);
    d.flush().unwrap();
    assert_eq!(d.stats().freed_pending, 0);
    let h = data_list(&d);
    d.delete(None, g, 0).unwrap();
    d.flush().unwrap();
    d.write(None, h, 0, &block(3, 4096)).unwrap();
    assert!(d.check_blocks().unwrap().is_empty());
}

#[test]
fn abort_gives_back_allocations_and_overwritten_bytes() {
    let p = Pair::new(256);
    let d = p.open();
    let f = data_list(&d);
    d.write(None, f, 0, &block(1, 4096)).unwrap();
    let before = d.stats().group_free.clone();
    let a = d.begin_aru().unwrap();
    d.reserve(a, 3 * 4096).unwrap();
    d.write(Some(a), f, 0, &block(2, 50)).unwrap();
    d.write(Some(a), f, 0, &block(3, 60)).unwrap();
    d.write(Some(a), f, 1, &block(4, 4096)).unwrap();
    d.write(Some(a), f, 2, &block(5, 4096)).unwrap();
    d.delete(Some(a), f, 2).unwrap();
    assert_eq!(d.read(f, 0).unwrap().unwrap(), block(3, 60), "in place");
    d.abort_aru(a).unwrap();
    assert_eq!(d.read(f, 0).unwrap().unwrap(), block(1, 4096));
    assert_eq!(d.read(f, 1).unwrap(), None);
    assert_eq!(d.stats().group_free, before);
    assert_eq!(d.stats().reserved, 0);
    d.close().unwrap();
    let d = p.open();
    assert_eq!(d.read(f, 0).unwrap().unwrap(), block(1, 4096));
    assert!(d.check_blocks().unwrap().is_empty());
}

#[test]
fn interleaved_arus_each_recover_their_own_bits() {
    // Two ARUs allocate in one group; whichever ends, the bitmap written
    // last holds exactly the ended ARUs' bits.
    for end_first in [true, false] {
        let p = Pair::new(256);
        let d = p.open();
        let f = data_list(&d);
        let g = data_list(&d);
        let a = d.begin_aru().unwrap();
        let b = d.begin_aru().unwrap();
        d.write(Some(a), f, 0, &block(1, 4096)).unwrap();
        d.write(Some(b), g, 0, &block(2, 4096)).unwrap();
        if end_first {
            d.end_aru(a).unwrap();
        } else {
            d.end_aru(b).unwrap();
        }
        d.flush().unwrap();
        // A crash now: the other ARU never ends.
        let meta = p.meta.snapshot();
        let data = p.data.snapshot();
        d.abandon();
        let d = Dual::open(
            Arc::new(MemoryDevice::from_vec(meta)),
            Arc::new(MemoryDevice::from_vec(data)),
            opts(),
        )
        .unwrap();
        assert_eq!(d.check_blocks().unwrap(), Vec::<String>::new());
        let s = d.stats();
        let free: u64 = s.group_free.iter().map(|&f| f as u64).sum();
        assert_eq!(free, s.geo.blocks - 1);
        assert_eq!(d.read(f, 0).unwrap().is_some(), end_first);
        assert_eq!(d.read(g, 0).unwrap().is_some(), !end_first);
    }
}

#[test]
fn metadata_only_work_leaves_the_data_device_alone() {
    let p = Pair::new(256);
    let before = p.data.snapshot();
    let d = p.open();
    let m = meta_list(&d);
    for i in 0..500 {
        d.write(None, m, i, &block(i as u8, 300)).unwrap();
    }
    d.delete_range(None, m, 0..250).unwrap();
    d.flush().unwrap();
    d.close().unwrap();
    let d = p.open();
    assert_eq!(d.read(m, 300).unwrap().unwrap(), block(44, 300));
    d.close().unwrap();
    assert!(p.data.snapshot() == before, "the data device changed");
}

#[test]
fn data_checksum_catches_damage() {
    let p = Pair::new(256);
    let d = p.open();
    let f = data_list(&d);
    d.write(None, f, 0, &block(1, 4096)).unwrap();
    d.flush().unwrap();
    let off = d.geo.offset(where_is(&d, f, 0));
    p.data.write_at(&[0xff], off + 17).unwrap();
    assert!(matches!(
        d.read(f, 0),
        Err(LdError::Corrupt(Corruption {
            what: "data block",
            ..
        }))
    ));
    assert!(d.read_range(f, 0..1, 1).is_err());
}

#[test]
fn a_mismatched_pair_is_refused() {
    let p = Pair::new(256);
    let q = Pair::new(256);
    let e = Dual::open(p.meta.clone(), q.data.clone(), opts())
        .err()
        .unwrap();
    assert!(e.to_string().contains("belongs to file system"), "{e}");
    // The metadata device was not written by the failed open.
    let before = p.meta.snapshot();
    let _ = Dual::open(p.meta.clone(), q.data.clone(), opts());
    assert!(p.meta.snapshot() == before);
}

/// A damaged first label leaves the data device a data device (its copy
/// in the last block says so), and it still opens; a log is never one.
#[test]
fn a_data_device_with_a_damaged_first_label_is_still_recognised() {
    let p = Pair::new(256);
    assert!(is_data_device(&*p.data));
    assert!(!is_data_device(&*p.meta));
    p.data.write_at(&[0xff; 16], 0).unwrap();
    assert!(is_data_device(&*p.data));
    p.open().close().unwrap();
}

#[test]
fn a_full_data_device_refuses_reservations_first() {
    let p = Pair::new(256);
    let d = p.open();
    let f = data_list(&d);
    let blocks = d.stats().geo.blocks;
    let a = d.begin_aru().unwrap();
    assert!(matches!(
        d.reserve(a, (blocks + 1) * 4096),
        Err(LdError::NoSpace { .. })
    ));
    d.reserve(a, blocks * 4096).unwrap();
    // Another writer finds nothing left while `a` holds it all.
    assert!(matches!(
        d.write(None, f, 0, &block(1, 10)),
        Err(LdError::NoSpace { .. })
    ));
    d.write(Some(a), f, 0, &block(1, 10)).unwrap();
    d.end_aru(a).unwrap();
    assert_eq!(d.stats().reserved, 0);
    d.write(None, f, 1, &block(1, 10)).unwrap();
    assert!(d.check_blocks().unwrap().is_empty());
}

#[test]
fn new_lists_go_to_the_emptiest_group() {
    let p = Pair::new(256);
    let d = p.open();
    let f = data_list(&d);
    for i in 0..200 {
        d.write(None, f, i, &block(1, 4096)).unwrap();
    }
    let g = data_list(&d);
    d.write(None, g, 0, &block(2, 4096)).unwrap();
    let geo = d.stats().geo;
    assert_ne!(
        geo.group_of(where_is(&d, g, 0)),
        geo.group_of(where_is(&d, f, 0))
    );
    // A list created near another starts in its group.
    let h = d
        .create_list(
            None,
            ListHints {
                kind: ListKind::Data,
                near: Some(f),
                ..Default::default()
            },
        )
        .unwrap();
    d.write(None, h, 0, &block(3, 4096)).unwrap();
    assert_eq!(
        geo.group_of(where_is(&d, h, 0)),
        geo.group_of(where_is(&d, f, 0))
    );
    assert_eq!(d.list_hints(h).unwrap().unwrap().near, Some(f));
}

#[test]
fn data_is_durable_before_the_log_names_it() {
    use crate::device::{CrashDevice, CrashOptions};
    let meta = Arc::new(CrashDevice::new(META_BYTES));
    let data = Arc::new(CrashDevice::new(DATA_BYTES));
    mkfs(
        meta.clone(),
        &*data,
        &DualMkfsOptions {
            group_blocks: 256,
            ..Default::default()
        },
    )
    .unwrap();
    let small = LldOptions {
        partial_bytes: 4096,
        ..opts()
    };
    let d = Dual::open(meta.clone(), data.clone(), small).unwrap();
    let f = data_list(&d);
    let m = meta_list(&d);
    d.flush().unwrap();
    d.write(None, f, 0, &block(1, 4096)).unwrap();
    // A large metadata block seals the partial segment holding the
    // pointer: the log reaches its device without any flush asked for.
    d.write(None, m, 0, &block(2, 8000)).unwrap();
    d.write(None, m, 1, &block(3, 8000)).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while meta.pending_writes() == 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert!(meta.pending_writes() > 0, "the log wrote nothing");
    // The worst crash: every log write survives, no unflushed data write.
    let keep_all = CrashOptions {
        keep_probability: 1.0,
        tear_probability: 0.0,
    };
    let lose_all = CrashOptions {
        keep_probability: 0.0,
        tear_probability: 0.0,
    };
    let mimg = meta.crash_image(1, &keep_all);
    let dimg = data.crash_image(1, &lose_all);
    d.abandon();
    let d = Dual::open(
        Arc::new(MemoryDevice::from_vec(mimg)),
        Arc::new(MemoryDevice::from_vec(dimg)),
        opts(),
    )
    .unwrap();
    // Every log write survived, so the pointer did: its data must have.
    match d.read(f, 0) {
        Ok(None) => panic!("the pointer was lost though every log write survived"),
        Ok(Some(b)) => assert_eq!(b, block(1, 4096)),
        Err(e) => panic!("the log named data that never reached its device: {e}"),
    }
    assert_eq!(d.read(m, 0).unwrap().unwrap(), block(2, 8000));
}

#[test]
fn the_block_check_finds_free_named_leaked_and_damaged_blocks() {
    let p = Pair::new(256);
    let d = p.open();
    let f = data_list(&d);
    d.write(None, f, 0, &block(1, 4096)).unwrap();
    d.write(None, f, 1, &block(2, 4096)).unwrap();
    let (b0, b1) = (where_is(&d, f, 0), where_is(&d, f, 1));
    assert!(d.check_blocks_with(true).unwrap().is_empty());
    // Rewrite group 0's bitmap behind the LD's back: block b0 free, and
    // block 200 allocated though nothing names it.
    let gw = 256 / 64;
    let mut words = vec![0u64; gw];
    set_bit(&mut words, b1, true);
    set_bit(&mut words, 200, true);
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    d.meta().write(None, BITMAP_LIST, 0, &bytes).unwrap();
    d.meta()
        .write(None, DESC_LIST, 0, &format::encode_desc(0, 254))
        .unwrap();
    let off = d.geo.offset(b1);
    d.close().unwrap();
    p.data.write_at(&[0xee], off + 5).unwrap();
    let d = p.open();
    let found = d.check_blocks_with(true).unwrap();
    assert!(
        found
            .iter()
            .any(|l| l.contains(&format!("data block {b0} is free"))),
        "{found:?}"
    );
    assert!(
        found
            .iter()
            .any(|l| l.contains("data block 200 is allocated but named by nothing")),
        "{found:?}"
    );
    assert!(found.iter().any(|l| l.contains("checksum")), "{found:?}");
    assert_eq!(found.len(), 3, "{found:?}");
    assert_eq!(d.check_blocks().unwrap().len(), 2);
}

#[test]
fn reads_beside_overwrites_in_place_never_see_a_checksum_mismatch() {
    use std::sync::atomic::{AtomicU64, Ordering};
    const READS: u64 = 2000;
    let p = Pair::new(256);
    let d = Arc::new(p.open());
    let f = data_list(&d);
    d.write(None, f, 0, &block(0, 4096)).unwrap();
    let (reads, writes) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let reader = {
        let (d, reads, writes) = (d.clone(), reads.clone(), writes.clone());
        std::thread::spawn(move || {
            while reads.load(Ordering::Relaxed) < READS {
                // Counted only once the overwrites have begun.
                let counts = writes.load(Ordering::Relaxed) > 0;
                let b = d
                    .read(f, 0)
                    .expect("a read beside an overwrite failed")
                    .unwrap();
                assert!(b == block(0, 4096) || b == block(1, 4096));
                d.read_range(f, 0..1, 1)
                    .expect("a range read beside an overwrite failed");
                reads.fetch_add(u64::from(counts), Ordering::Relaxed);
            }
        })
    };
    // Overwrite for as long as the reader reads (a count, not a time, so a
    // loaded machine only makes it slower); the bound only ends a hang.
    let give_up = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let mut i = 0u64;
    while reads.load(Ordering::Relaxed) < READS && !reader.is_finished() {
        assert!(std::time::Instant::now() < give_up, "reader stalled");
        d.write(None, f, 0, &block((i % 2) as u8, 4096)).unwrap();
        i += 1;
        writes.store(i, Ordering::Relaxed);
    }
    reader.join().unwrap();
}

/// The metadata device, with the flushes of one named thread held at a
/// gate until it opens.
struct HeldFlush {
    inner: Arc<MemoryDevice>,
    thread: &'static str,
    /// (shut, a flush is waiting)
    gate: std::sync::Mutex<(bool, bool)>,
    cv: std::sync::Condvar,
}

impl HeldFlush {
    fn open_gate(&self) {
        self.gate.lock().unwrap().0 = false;
        self.cv.notify_all();
    }

    fn await_held(&self) {
        let g = self.gate.lock().unwrap();
        let (g, _) = self
            .cv
            .wait_timeout_while(g, std::time::Duration::from_secs(10), |g| !g.1)
            .unwrap();
        assert!(g.1, "the held thread never flushed");
    }
}

impl Device for HeldFlush {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), DeviceError> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), DeviceError> {
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> Result<(), DeviceError> {
        if std::thread::current().name() == Some(self.thread) {
            let mut g = self.gate.lock().unwrap();
            g.1 = true;
            self.cv.notify_all();
            while g.0 {
                g = self.cv.wait(g).unwrap();
            }
        }
        self.inner.flush()
    }
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
}

/// Review probe: two flushes at once (fsyncs of two files: the fs does
/// not serialize them). Each notes how many freed blocks wait before its
/// log flush and releases that many after it, so the one that finishes
/// second releases blocks the first one already released, or (had more
/// been freed meanwhile) blocks freed by an ARU its log flush did not
/// make durable, which new data may then overwrite before the free is
/// durable. Flush A (the group commit's leader) is held at the metadata
/// device's flush after noting one freed block; a second block is freed;
/// flush B notes two and waits for A. Neither may panic, and every freed
/// block is released once. No randomness (no seed); B is given 200 ms to
/// note its count.
#[test]
fn concurrent_flushes_release_each_freed_block_once() {
    let p = Pair::new(256);
    let held = Arc::new(HeldFlush {
        inner: p.meta.clone(),
        thread: "probe-flush-a",
        gate: std::sync::Mutex::new((true, false)),
        cv: std::sync::Condvar::new(),
    });
    struct Open(Arc<HeldFlush>);
    impl Drop for Open {
        fn drop(&mut self) {
            self.0.open_gate();
        }
    }
    let _open = Open(held.clone());
    let d = Arc::new(Dual::open(held.clone(), p.data.clone(), opts()).unwrap());
    let f = data_list(&d);
    d.write(None, f, 0, &block(1, 4096)).unwrap();
    d.write(None, f, 1, &block(2, 4096)).unwrap();
    d.flush().unwrap();
    d.delete(None, f, 0).unwrap();
    let flush_on = |name: &'static str| {
        let d = d.clone();
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || d.flush())
            .unwrap()
    };
    let a = flush_on("probe-flush-a");
    held.await_held();
    d.delete(None, f, 1).unwrap();
    assert_eq!(d.stats().freed_pending, 2);
    let b = flush_on("probe-flush-b");
    std::thread::sleep(std::time::Duration::from_millis(200));
    held.open_gate();
    let outcome = |r: std::thread::Result<LdResult<()>>| match r {
        Ok(Ok(())) => "Ok".to_string(),
        Ok(Err(e)) => format!("error: {e}"),
        Err(_) => "panicked".to_string(),
    };
    let (ra, rb) = (outcome(a.join()), outcome(b.join()));
    assert!(ra == "Ok" && rb == "Ok", "flush A: {ra}, flush B: {rb}");
    assert_eq!(d.stats().freed_pending, 0);
    d.write(None, f, 2, &block(3, 4096)).unwrap();
    d.flush().unwrap();
    assert!(d.check_blocks().unwrap().is_empty());
}

/// A file written a block at a time reaches the data device in a few large
/// requests, not a request per block; reads before that see the blocks.
#[test]
fn adjacent_data_blocks_reach_the_device_as_one_request() {
    let meta = Arc::new(MemoryDevice::new(META_BYTES));
    let data = Arc::new(crate::device::CrashDevice::new(DATA_BYTES));
    let mk = DualMkfsOptions {
        group_blocks: 256,
        ..Default::default()
    };
    mkfs(meta.clone(), &*data, &mk).unwrap();
    let d = Dual::open(meta, data.clone(), opts()).unwrap();
    let f = data_list(&d);
    let before = data.stats().writes;
    for i in 0..64u64 {
        d.write(None, f, i, &block(i as u8, 4096)).unwrap();
    }
    for i in 0..64u64 {
        assert_eq!(d.read(f, i).unwrap().unwrap(), block(i as u8, 4096));
    }
    assert_eq!(d.read_range(f, 0..64, 64).unwrap().len(), 64);
    d.flush().unwrap();
    let writes = data.stats().writes - before;
    assert!(
        writes <= 2,
        "64 adjacent blocks took {writes} device writes"
    );
    let off = d.geo.offset(where_is(&d, f, 0)) as usize;
    let mut img = vec![0u8; 64 * 4096];
    data.read_at(&mut img, off as u64).unwrap();
    for i in 0..64usize {
        assert_eq!(&img[i * 4096..(i + 1) * 4096], &block(i as u8, 4096)[..]);
    }
    d.close().unwrap();
}

/// A data device whose reads, once armed, stop after reading and wait to
/// be let go (to put a drain between a read's device bytes and its look at
/// the pending blocks).
struct PausingDevice {
    inner: MemoryDevice,
    armed: std::sync::atomic::AtomicBool,
    read_done: Mutex<Option<std::sync::mpsc::Sender<()>>>,
    go: Mutex<Option<std::sync::mpsc::Receiver<()>>>,
}

impl Device for PausingDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), DeviceError> {
        self.inner.read_at(buf, offset)?;
        if self.armed.swap(false, std::sync::atomic::Ordering::SeqCst) {
            let _ = self.read_done.lock().unwrap().take().unwrap().send(());
            let _ = self.go.lock().unwrap().take().unwrap().recv();
        }
        Ok(())
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), DeviceError> {
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> Result<(), DeviceError> {
        self.inner.flush()
    }
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
}

/// A read whose device bytes were read before a drain wrote the block, and
/// whose look at the pending blocks came after it, still sees the block
/// (it saw neither version before: a checksum error for fresh data).
#[test]
fn a_read_racing_a_drain_sees_the_drained_block() {
    use std::sync::mpsc::channel;
    use std::time::Duration;
    let meta = Arc::new(MemoryDevice::new(META_BYTES));
    let data = Arc::new(PausingDevice {
        inner: MemoryDevice::new(DATA_BYTES),
        armed: false.into(),
        read_done: Mutex::new(None),
        go: Mutex::new(None),
    });
    mkfs(
        meta.clone(),
        &*data,
        &DualMkfsOptions {
            group_blocks: 256,
            ..Default::default()
        },
    )
    .unwrap();
    let d = Arc::new(Dual::open(meta, data.clone(), opts()).unwrap());
    let f = data_list(&d);
    d.write(None, f, 0, &block(9, 4096)).unwrap();
    let (done_tx, done_rx) = channel();
    let (go_tx, go_rx) = channel();
    *data.read_done.lock().unwrap() = Some(done_tx);
    *data.go.lock().unwrap() = Some(go_rx);
    data.armed.store(true, std::sync::atomic::Ordering::SeqCst);
    let reader = {
        let d = d.clone();
        std::thread::spawn(move || d.read(f, 0))
    };
    done_rx.recv().unwrap();
    // The drain: done at once if reads do not hold it off, else let the
    // read go on first.
    let (flushed_tx, flushed_rx) = channel();
    let flusher = {
        let d = d.clone();
        std::thread::spawn(move || {
            let r = d.flush();
            let _ = flushed_tx.send(());
            r
        })
    };
    let _ = flushed_rx.recv_timeout(Duration::from_millis(500));
    go_tx.send(()).unwrap();
    let got = reader.join().unwrap();
    flusher.join().unwrap().unwrap();
    assert_eq!(got.unwrap().unwrap(), block(9, 4096));
}

/// A drain whose device write fails keeps the blocks it did not write:
/// reads still see them (they do not turn into checksum errors), and every
/// later flush fails.
#[test]
fn a_failed_drain_keeps_its_blocks_readable() {
    use crate::device::{FaultDevice, FaultPlan};
    let meta = Arc::new(MemoryDevice::new(META_BYTES));
    let data = Arc::new(FaultDevice::new(
        MemoryDevice::new(DATA_BYTES),
        FaultPlan::default(),
    ));
    mkfs(
        meta.clone(),
        &*data,
        &DualMkfsOptions {
            group_blocks: 256,
            ..Default::default()
        },
    )
    .unwrap();
    let d = Dual::open(meta, data.clone(), opts()).unwrap();
    let f = data_list(&d);
    let g = data_list(&d);
    // Two runs apart: f's blocks and g's.
    for i in 0..4u64 {
        d.write(None, f, i, &block(i as u8, 4096)).unwrap();
    }
    d.flush().unwrap();
    for i in 0..4u64 {
        d.write(None, f, i, &block(100 + i as u8, 4096)).unwrap();
        d.write(None, g, i, &block(50 + i as u8, 4096)).unwrap();
    }
    data.set_plan(FaultPlan {
        fail_write_nth: Some(1),
        ..Default::default()
    });
    assert!(d.flush().is_err());
    for i in 0..4u64 {
        assert_eq!(d.read(f, i).unwrap().unwrap(), block(100 + i as u8, 4096));
        assert_eq!(d.read(g, i).unwrap().unwrap(), block(50 + i as u8, 4096));
    }
    assert_eq!(d.read_range(g, 0..4, 4).unwrap().len(), 4);
    assert!(d.flush().is_err());
    d.abandon();
}

/// The metadata device's hints pass through the ordering wrapper.
#[test]
fn the_metadata_devices_write_unit_passes_through() {
    let meta = OrderedMeta {
        inner: Arc::new(MemoryDevice::new(1 << 16).with_write_unit(4096)),
        data: Arc::new(DataSync::new(Arc::new(MemoryDevice::new(1 << 16)))),
    };
    assert_eq!(meta.write_unit_bytes(), 4096);
}

/// The per-list caches stay within `CACHE_LIMIT` however many lists there
/// are, and a list whose entries were evicted still reads, writes and
/// deletes as before (issue 14: they
/// grew by an entry per list for ever).
#[test]
fn per_list_caches_stay_bounded_and_evicted_lists_still_work() {
    let p = Pair::new(64);
    let d = p.open();
    let n = 3 * CACHE_LIMIT as u64;
    let mut lists = Vec::new();
    for i in 0..n {
        let dir = meta_list(&d);
        let f = d
            .create_list(
                None,
                ListHints {
                    kind: ListKind::Data,
                    near: Some(dir),
                    ..Default::default()
                },
            )
            .unwrap();
        d.write(None, f, 0, &block(i as u8, 4096)).unwrap();
        lists.push((dir, f));
        let st = d.lock();
        assert!(st.kinds.len() <= CACHE_LIMIT, "kinds: {}", st.kinds.len());
        assert!(st.ties.len() <= CACHE_LIMIT, "ties: {}", st.ties.len());
        assert!(
            st.list_group.len() <= CACHE_LIMIT,
            "list_group: {}",
            st.list_group.len()
        );
    }
    // The first lists' entries are long gone: a second block of each is
    // written, every block reads back, and deletes free them.
    for (i, &(dir, f)) in lists.iter().enumerate() {
        d.write(None, f, 1, &block(i as u8 ^ 0x55, 4096)).unwrap();
        assert_eq!(d.read(f, 0).unwrap().unwrap(), block(i as u8, 4096));
        assert_eq!(d.read(f, 1).unwrap().unwrap(), block(i as u8 ^ 0x55, 4096));
        if i % 2 == 0 {
            d.delete_list(None, f).unwrap();
            d.delete_list(None, dir).unwrap();
        }
    }
    d.flush().unwrap();
    drop(d);
    let d = p.open();
    for (i, &(_, f)) in lists.iter().enumerate().filter(|(i, _)| i % 2 == 1) {
        assert_eq!(d.read(f, 1).unwrap().unwrap(), block(i as u8 ^ 0x55, 4096));
    }
}

#[test]
fn free_runs_are_found_word_by_word_and_bit_by_bit() {
    let mut v = vec![0u64; 4];
    assert_eq!(free_run(&v, 0, 256), Some((0, 256)));
    assert_eq!(free_run(&v, 10, 200), Some((10, 190)));
    v[0] = u64::MAX;
    v[1] = 1 << 5;
    assert_eq!(free_run(&v, 0, 256), Some((64, 5)));
    assert_eq!(free_run(&v, 69, 256), Some((70, 186)));
    v[2] = u64::MAX;
    v[3] = u64::MAX;
    assert_eq!(free_run(&v, 70, 256), Some((70, 58)));
    assert_eq!(free_run(&v, 128, 256), None);
    assert_eq!(free_run(&v, 0, 64), None);
    assert_eq!(free_run(&v, 256, 256), None);
}

/// `trim_data` discards the free data blocks, and only them: a block freed
/// but not yet durably stays as it is (it could still be needed if the
/// freeing ARU's end is lost), live blocks keep their bytes, and the pair
/// checks clean after a reopen.
#[test]
fn trim_gives_back_free_data_blocks_only() {
    let p = Pair::new(256);
    let d = p.open();
    let (f, g) = (data_list(&d), data_list(&d));
    for i in 0..8 {
        d.write(None, f, i, &block(i as u8 + 1, 4096)).unwrap();
    }
    for i in 0..4 {
        d.write(None, g, i, &block(i as u8 + 100, 4096)).unwrap();
    }
    d.flush().unwrap();
    let f_blocks: Vec<u64> = (0..8).map(|i| where_is(&d, f, i)).collect();
    d.delete_list(None, f).unwrap();
    let (blocks, bytes) = d.trim_data().unwrap();
    assert_eq!(bytes, blocks * DATA_BLOCK_BYTES);
    let total = d.geo.blocks;
    assert_eq!(blocks, total - 12, "freed but not durable: kept");
    let mut b = vec![0u8; 4096];
    p.data.read_at(&mut b, d.geo.offset(f_blocks[3])).unwrap();
    assert_eq!(b, block(4, 4096), "a block not durably freed was discarded");
    d.flush().unwrap();
    let (blocks, _) = d.trim_data().unwrap();
    assert_eq!(blocks, total - 4);
    p.data.read_at(&mut b, d.geo.offset(f_blocks[3])).unwrap();
    assert_eq!(b, vec![0u8; 4096]);
    for i in 0..4 {
        assert_eq!(d.read(g, i).unwrap().unwrap(), block(i as u8 + 100, 4096));
    }
    assert!(d.check_blocks().unwrap().is_empty());
    d.close().unwrap();
    drop(d);
    let d = p.open();
    for i in 0..4 {
        assert_eq!(d.read(g, i).unwrap().unwrap(), block(i as u8 + 100, 4096));
    }
    assert!(d.check_blocks().unwrap().is_empty());
}

/// `-o discard`: a flush that makes freed blocks free again discards them
/// (after the metadata freeing them is durable: the same flush), never one
/// still named; without the option nothing is discarded.
#[test]
fn discard_gives_blocks_back_as_their_frees_become_durable() {
    for discard in [false, true] {
        let p = Pair::new(256);
        let d = Dual::open(
            p.meta.clone(),
            p.data.clone(),
            LldOptions { discard, ..opts() },
        )
        .unwrap();
        let (f, g) = (data_list(&d), data_list(&d));
        for i in 0..6 {
            d.write(None, f, i, &block(i as u8 + 1, 4096)).unwrap();
            d.write(None, g, i, &block(i as u8 + 50, 4096)).unwrap();
        }
        d.flush().unwrap();
        let gone: Vec<u64> = (0..6).map(|i| where_is(&d, f, i)).collect();
        d.delete_list(None, f).unwrap();
        assert_eq!(
            d.stats().discarded,
            0,
            "discarded before the free was durable"
        );
        d.flush().unwrap();
        let mut b = vec![0u8; 4096];
        p.data.read_at(&mut b, d.geo.offset(gone[2])).unwrap();
        if discard {
            assert_eq!(d.stats().discarded, 6);
            assert_eq!(b, vec![0u8; 4096]);
        } else {
            assert_eq!(d.stats().discarded, 0);
            assert_eq!(b, block(3, 4096));
        }
        for i in 0..6 {
            assert_eq!(d.read(g, i).unwrap().unwrap(), block(i as u8 + 50, 4096));
        }
        assert!(d.check_blocks().unwrap().is_empty());
    }
}

/// Review 24 probe: a read racing a delete and the flush after it. `read`
/// takes the pointer, then (the io lock held shared, which neither a
/// delete nor a flush takes) the bytes; the fs reads without its lock, so
/// a truncate and the commit timer's flush may run in between. Without
/// `-o discard` the block keeps its bytes until it is allocated and
/// written again: the read returns the file's old bytes, a state that
/// existed. With `-o discard` (or an `ldfs trim` in between) the discard
/// must wait for that read (it takes the io lock exclusively first), or
/// the read fails its checksum: EIO for a read that raced a truncate.
#[test]
fn a_read_racing_a_delete_and_a_discarding_flush_reads_the_old_bytes() {
    for (discard, trim) in [(false, false), (true, false), (false, true)] {
        let p = Pair::new(256);
        let d = Arc::new(
            Dual::open(
                p.meta.clone(),
                p.data.clone(),
                LldOptions { discard, ..opts() },
            )
            .unwrap(),
        );
        let f = data_list(&d);
        d.write(None, f, 0, &block(9, 4096)).unwrap();
        d.flush().unwrap();
        // `read`, step by step: the pointer under the io lock...
        let eng = d.eng(f).unwrap();
        let io = d.io.read().unwrap();
        let ptr = d.pointer(eng, 0).unwrap().unwrap();
        // ...a truncate and the commit flush (and a trim) meanwhile, on
        // another thread (the discard waits for this read)...
        d.delete(None, f, 0).unwrap();
        let other = {
            let d = d.clone();
            std::thread::spawn(move || {
                d.flush().unwrap();
                if trim {
                    d.trim_data().unwrap();
                }
            })
        };
        std::thread::sleep(std::time::Duration::from_millis(200));
        // ...then the bytes.
        let got = d.read_block(&ptr);
        drop(io);
        other.join().unwrap();
        assert!(
            matches!(&got, Ok(b) if *b == block(9, 4096)),
            "discard {discard} trim {trim}: the racing read got {:?}",
            got.map(|b| b[..8].to_vec())
        );
        if discard || trim {
            let mut b = vec![1u8; 4096];
            p.data.read_at(&mut b, d.geo.offset(ptr.block)).unwrap();
            assert_eq!(b, vec![0u8; 4096], "discarded after the read");
        }
    }
}

/// A data device whose discards take `DISCARD_TIME` (a large BLKDISCARD on
/// a drive that erases as it trims).
struct SlowDiscard(Arc<MemoryDevice>);

const DISCARD_TIME: std::time::Duration = std::time::Duration::from_millis(1500);

impl Device for SlowDiscard {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), DeviceError> {
        self.0.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), DeviceError> {
        self.0.write_at(buf, offset)
    }
    fn flush(&self) -> Result<(), DeviceError> {
        self.0.flush()
    }
    fn size_bytes(&self) -> u64 {
        self.0.size_bytes()
    }
    fn discard(&self, offset: u64, len: u64) -> Result<bool, DeviceError> {
        std::thread::sleep(DISCARD_TIME);
        self.0.discard(offset, len)
    }
}

/// Review 24 probe: `trim_data` discards a whole run of free blocks (here
/// all the free space, one run) with the state lock held, and every
/// operation takes that lock (a read of a metadata list asks `is_data`,
/// through `kinds`): nothing, not even a directory read, goes on while the
/// device trims. A drive that takes seconds per BLKDISCARD freezes the
/// mount for that long. FAILS on 264d380 (the read waits out the discard).
#[test]
fn a_metadata_read_does_not_wait_for_a_trim() {
    let p = Pair::new(256);
    let d = Arc::new(
        Dual::open(
            p.meta.clone(),
            Arc::new(SlowDiscard(p.data.clone())),
            opts(),
        )
        .unwrap(),
    );
    let m = meta_list(&d);
    d.write(None, m, 0, b"directory bucket").unwrap();
    d.flush().unwrap();
    let t = {
        let d = d.clone();
        std::thread::spawn(move || d.trim_data().unwrap())
    };
    std::thread::sleep(std::time::Duration::from_millis(200));
    let start = std::time::Instant::now();
    assert_eq!(d.read(m, 0).unwrap().unwrap(), b"directory bucket");
    let waited = start.elapsed();
    let (blocks, _) = t.join().unwrap();
    assert!(blocks > 0);
    assert!(
        waited < DISCARD_TIME / 2,
        "a metadata read waited {waited:?} for a trim of the data device"
    );
}

/// Review 27: a trim held the only free run, blocks an ARU had reserved
/// included; the ARU's reserved allocation found none and panicked with the
/// state lock held (every later operation failed). A trim now leaves the
/// reserved blocks free.
#[test]
fn a_trim_leaves_reserved_blocks_to_their_aru() {
    let p = Pair::new(256);
    let d = Arc::new(
        Dual::open(
            p.meta.clone(),
            Arc::new(SlowDiscard(p.data.clone())),
            opts(),
        )
        .unwrap(),
    );
    let f = data_list(&d);
    d.flush().unwrap();
    let a = d.begin_aru().unwrap();
    d.reserve(a, 4096).unwrap();
    let t = {
        let d = d.clone();
        std::thread::spawn(move || d.trim_data().unwrap())
    };
    std::thread::sleep(std::time::Duration::from_millis(200));
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        d.write(Some(a), f, 0, &block(1, 4096))
    }));
    t.join().ok();
    assert!(
        matches!(r, Ok(Ok(()))),
        "reserved write during trim: {:?}",
        r.map(|x| x.map_err(|e| e.to_string()))
    );
}
