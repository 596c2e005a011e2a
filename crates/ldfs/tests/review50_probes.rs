//! Review 50 probes: the uploader's feed when a checkpoint comes during puts ahead
//! (`Job::left_before`, commit 6c70344).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use ldfs::device::{Device, DeviceError, MemoryDevice};
use ldfs::ld::{ListHints, LogicalDisk};
use ldfs::lld::layout::MkfsOptions;
use ldfs::lld::{CheckpointHook, DurableCheckpoint, Lld, LldOptions};
use ldfs::store::segments::{decode_checkpoint_object, UPLOAD_PUTS_IN_FLIGHT};
use ldfs::store::{MemoryStore, ObjectInfo, ObjectStore, PutOutcome, SegmentStore, StoreResult};
use ldfs::testing::store::{take_lease, TestClock};

/// What the store saw, in order.
#[derive(Clone, Debug)]
enum Event {
    /// A segment put began (before it waits out a stall).
    SegPut(String),
    /// The checkpoint hook returned (the job is set).
    Hook(u64),
    /// A checkpoint object put began.
    Ckpt(String, Vec<u8>),
}

/// A memory store whose segment puts wait while `stalled` (a gateway that answers nothing),
/// recording every put.
struct StallStore {
    inner: MemoryStore,
    events: Mutex<Vec<Event>>,
    stalled: Mutex<bool>,
    cv: Condvar,
}

impl StallStore {
    fn stall(&self, on: bool) {
        *self.stalled.lock().unwrap() = on;
        self.cv.notify_all();
    }
}

impl ObjectStore for StallStore {
    fn put(&self, key: &str, bytes: &[u8]) -> StoreResult<()> {
        if key.starts_with("seg/") {
            self.events
                .lock()
                .unwrap()
                .push(Event::SegPut(key.to_string()));
            let t = Instant::now();
            let mut s = self.stalled.lock().unwrap();
            while *s && t.elapsed() < Duration::from_secs(60) {
                s = self
                    .cv
                    .wait_timeout(s, Duration::from_millis(100))
                    .unwrap()
                    .0;
            }
            drop(s);
            // A put takes a while (a gateway's latency).
            std::thread::sleep(Duration::from_millis(20));
        }
        self.inner.put(key, bytes)
    }
    fn put_if_absent(&self, key: &str, bytes: &[u8]) -> StoreResult<PutOutcome> {
        if key.starts_with("ckpt/") {
            self.events
                .lock()
                .unwrap()
                .push(Event::Ckpt(key.to_string(), bytes.to_vec()));
        }
        self.inner.put_if_absent(key, bytes)
    }
    fn get(&self, key: &str) -> StoreResult<Vec<u8>> {
        self.inner.get(key)
    }
    fn get_range(&self, key: &str, offset: u64, len: u64) -> StoreResult<Vec<u8>> {
        self.inner.get_range(key, offset, len)
    }
    fn delete(&self, key: &str) -> StoreResult<()> {
        self.inner.delete(key)
    }
    fn list(&self, prefix: &str) -> StoreResult<Vec<ObjectInfo>> {
        self.inner.list(prefix)
    }
}

/// A memory device whose first flush by the armed thread waits until released: a checkpoint's
/// phase 2 (after its snapshot, before its slot is durable and its hook runs) held open while
/// other threads write.
struct GatedDevice {
    inner: MemoryDevice,
    armed: Mutex<Option<ThreadId>>,
    reached: AtomicBool,
    open: Mutex<bool>,
    cv: Condvar,
}

impl Device for GatedDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), DeviceError> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), DeviceError> {
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> Result<(), DeviceError> {
        let me = std::thread::current().id();
        let gated = {
            let mut a = self.armed.lock().unwrap();
            let g = *a == Some(me);
            if g {
                *a = None;
            }
            g
        };
        if gated {
            self.reached.store(true, Ordering::SeqCst);
            let t = Instant::now();
            let mut o = self.open.lock().unwrap();
            while !*o && t.elapsed() < Duration::from_secs(60) {
                o = self
                    .cv
                    .wait_timeout(o, Duration::from_millis(100))
                    .unwrap()
                    .0;
            }
        }
        self.inner.flush()
    }
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
}

/// A checkpoint names the segments left before its snapshot; the log goes on writing while its
/// slot is made durable (phase 2), and the segments it leaves meanwhile are told to the store
/// layer before the checkpoint hook, so they count in `left_before`. The checkpoint names none
/// of them (Clean in its slot, or the Active one as a prefix), yet its job now waits until
/// every one of them was put ahead: the window a lost machine loses grows by the puts of what
/// was written during the checkpoint's own flushes, not by the (at most
/// `UPLOAD_PUTS_IN_FLIGHT`) puts in hand when it came, as before 6c70344.
#[test]
fn a_checkpoint_waits_for_no_put_of_a_segment_it_does_not_name() {
    let seg_bytes = 128u64 << 10;
    let store = Arc::new(StallStore {
        inner: MemoryStore::new(),
        events: Mutex::new(Vec::new()),
        stalled: Mutex::new(false),
        cv: Condvar::new(),
    });
    let gated = Arc::new(GatedDevice {
        inner: MemoryDevice::new(32 << 20),
        armed: Mutex::new(None),
        reached: AtomicBool::new(false),
        open: Mutex::new(false),
        cv: Condvar::new(),
    });
    let dev: Arc<dyn Device> = gated.clone();
    ldfs::lld::mkfs::mkfs(
        &*dev,
        &MkfsOptions {
            segment_bytes: seg_bytes,
            max_block_bytes: 32 << 10,
            reserved_segments: Some(4),
            fs_id: 5050,
            max_bytes: None,
            kept_pages: 0,
        },
    )
    .unwrap();
    let lease = take_lease(store.clone(), &TestClock::default(), false);
    let seg = SegmentStore::start(store.clone(), dev.clone(), lease, Default::default()).unwrap();
    let inner = seg.hook();
    let (st2, unstall) = (store.clone(), Arc::new(AtomicBool::new(false)));
    let unstall2 = unstall.clone();
    let hook = CheckpointHook(Arc::new(move |c: &DurableCheckpoint<'_>| {
        (inner.0)(c);
        st2.events.lock().unwrap().push(Event::Hook(c.serial));
        if unstall2.load(Ordering::SeqCst) {
            st2.stall(false);
        }
    }));
    let lld = Lld::open(
        dev.clone(),
        LldOptions {
            checkpoint_hook: Some(hook),
            segment_hook: Some(seg.segment_hook()),
            ..LldOptions::default()
        },
    )
    .unwrap();
    let l = lld.create_list(None, ListHints::default()).unwrap();
    // 1 MiB named by the checkpoint below, then nothing pending.
    for i in 0..32u64 {
        lld.write(None, l, i, &[i as u8; 32 << 10]).unwrap();
    }
    lld.flush().unwrap();
    lld.checkpoint_now().unwrap();
    seg.wait_uploaded(seg.announced(), Duration::from_secs(60))
        .unwrap();
    // More named by the next checkpoint, then the gateway stalls.
    for i in 32..64u64 {
        lld.write(None, l, i, &[i as u8; 32 << 10]).unwrap();
    }
    lld.flush().unwrap();
    store.stall(true);
    unstall.store(true, Ordering::SeqCst);
    let serial = std::thread::scope(|s| {
        let ck = s.spawn(|| {
            *gated.armed.lock().unwrap() = Some(std::thread::current().id());
            lld.checkpoint_now().unwrap();
        });
        let t = Instant::now();
        while !gated.reached.load(Ordering::SeqCst) {
            assert!(t.elapsed() < Duration::from_secs(30), "phase 2 not reached");
            std::thread::sleep(Duration::from_millis(1));
        }
        // The checkpoint's snapshot is taken; its slot is not durable yet. 4 MiB more: about
        // 32 segments left before its hook, none of them named by it.
        for i in 64..192u64 {
            lld.write(None, l, i, &[i as u8; 32 << 10]).unwrap();
        }
        // Their writes return (the log writer's); the segment hook is told.
        std::thread::sleep(Duration::from_millis(300));
        *gated.open.lock().unwrap() = true;
        gated.cv.notify_all();
        ck.join().unwrap();
        seg.announced()
    });
    seg.wait_uploaded(serial, Duration::from_secs(120)).unwrap();
    let events = store.events.lock().unwrap().clone();
    let h = events
        .iter()
        .position(|e| matches!(e, Event::Hook(s) if *s == serial))
        .expect("the hook's event");
    let (c, key, bytes) = events
        .iter()
        .enumerate()
        .skip(h)
        .find_map(|(i, e)| match e {
            Event::Ckpt(k, b) => Some((i, k.clone(), b.clone())),
            _ => None,
        })
        .expect("the checkpoint object's put");
    let obj = decode_checkpoint_object(&key, &bytes).unwrap();
    let named: std::collections::BTreeSet<String> = obj.entries.iter().map(|e| e.key()).collect();
    let unnamed: Vec<&String> = events[h..c]
        .iter()
        .filter_map(|e| match e {
            Event::SegPut(k) if !named.contains(k) => Some(k),
            _ => None,
        })
        .collect();
    let before_hook = events[..h]
        .iter()
        .filter(|e| matches!(e, Event::SegPut(_)))
        .count();
    assert!(
        unnamed.len() <= UPLOAD_PUTS_IN_FLIGHT,
        "checkpoint {key} waited for {} segment puts begun after its hook that it does not \
         name (it names {} objects; {before_hook} segment puts began before its hook): {:?}",
        unnamed.len(),
        named.len(),
        &unnamed[..unnamed.len().min(6)]
    );
    lld.close().unwrap();
    seg.stop();
}
