//! Partial segments on their way to the device.
//!
//! A writer thread writes sealed partial segments in the order they were
//! sealed while the engine goes on accepting operations, so building the
//! next partial segment overlaps writing the last one (how LFS streams small
//! writes at the device's bandwidth). Until its write returns, a partial
//! segment stays here and reads of its blocks are served from memory. After a
//! failed write nothing more is written; what was queued stays readable.
//!
//! Items are numbered as they are submitted (1, 2, ...) and taken for
//! writing in that order, so "everything up to item N is written" is one
//! counter: a checkpoint or a group commit waits for the items it needs
//! (`wait_written`) rather than for an empty queue, which under continuous
//! writes might never come. A waiter whose items nobody has taken yet
//! writes them itself instead of waking the writer thread and sleeping
//! until it is done (two thread switches per group commit, each a wait for
//! a core on a busy machine). Writes may so complete out of order: nothing
//! assumes an order among unflushed writes (the crash model), and an item
//! stays readable here until it and every item before it are written.

use std::collections::{BTreeSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::thread::JoinHandle;

use crate::device::{Device, DeviceError};

/// Bytes queued ahead of the writer before `submit` waits. Counted in
/// bytes, not items: a stream of small partial segments (one per group
/// commit) must not make the sealing thread, which holds the engine lock,
/// wait for the device after a handful of them.
const QUEUE_BYTES: usize = 4 << 20;

pub(crate) struct InFlight {
    pub addr: u64,
    pub bytes: Vec<u8>,
}

#[derive(Default)]
struct State {
    /// Items `written + 1 ..= submitted`, oldest first.
    queue: VecDeque<Arc<InFlight>>,
    /// Items submitted so far; the newest's number.
    submitted: u64,
    /// Items taken for writing so far (all of `1..=taken`).
    taken: u64,
    /// Items written so far (all of `1..=written`).
    written: u64,
    /// Items beyond `written + 1` whose write returned.
    done: BTreeSet<u64>,
    /// Bytes of the queued items.
    queued_bytes: usize,
    /// The writer thread is to stop once nothing is left to take.
    stopping: bool,
    /// Submits leave the writer thread asleep: the submitter waits for its
    /// items at once and writes them itself (`wait_written`), so waking the
    /// thread would only add two thread switches (or a race for a core)
    /// to a group commit. Set around a group commit's seal.
    quiet: bool,
    /// No writer thread: `submit` writes each item itself, at once
    /// (`start_inline`).
    inline: bool,
    /// The write error, handed to the first caller that drains after it.
    error: Option<DeviceError>,
    failed: Option<String>,
}

#[derive(Default)]
pub(crate) struct Flight {
    state: Mutex<State>,
    /// Waiters for written items and for queue space.
    cv: Condvar,
    /// The writer thread, for new items, a stop or a failure; apart from
    /// `cv` so a write that a waiter did itself does not wake the thread.
    work: Condvar,
    /// The device written to (set by `start`; without it nothing is written).
    dev: OnceLock<Arc<dyn Device>>,
    /// `State::failed` is set (it never clears): every writable check of
    /// the engine asks, and without this each took the queue's lock.
    has_failed: AtomicBool,
    /// Told the new `written` count each time it grows (`set_on_written`).
    on_written: OnceLock<Box<dyn Fn(u64) + Send + Sync>>,
}

/// The writer thread.
pub(crate) struct Writer {
    flight: Arc<Flight>,
    handle: Option<JoinHandle<()>>,
}

impl Flight {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().expect("in-flight queue poisoned")
    }

    /// `f` is told the count of written items each time it grows, after
    /// the queue's lock is let go, by the thread whose write grew it (the
    /// writer thread, a waiter writing its own items, or an inline
    /// submit). Set before the first submit.
    pub fn set_on_written(&self, f: Box<dyn Fn(u64) + Send + Sync>) {
        assert!(self.on_written.set(f).is_ok(), "on_written set twice");
    }

    pub fn start(self: &Arc<Self>, dev: Arc<dyn Device>) -> Writer {
        assert!(self.dev.set(dev).is_ok(), "log writer started twice");
        let flight = self.clone();
        let handle = std::thread::Builder::new()
            .name("ldfs-log-writer".into())
            .spawn(move || loop {
                let mut s = flight.lock();
                while s.taken == s.submitted && !s.stopping && s.failed.is_none() {
                    s = flight.work.wait(s).expect("in-flight queue poisoned");
                }
                match flight.take(&mut s) {
                    Some((ticket, item)) => {
                        drop(s);
                        flight.write(ticket, &item);
                    }
                    // Stopping with nothing left, or after a failed write.
                    None => return,
                }
            })
            .expect("spawn log writer thread");
        Writer {
            flight: self.clone(),
            handle: Some(handle),
        }
    }

    /// No thread: each item is written by the thread that submits it,
    /// before `submit` returns, so the device sees the log's writes in one
    /// order a seed fixes (the crash simulations replay exactly). Reads and
    /// waits behave as with the thread.
    pub fn start_inline(self: &Arc<Self>, dev: Arc<dyn Device>) -> Writer {
        assert!(self.dev.set(dev).is_ok(), "log writer started twice");
        self.lock().inline = true;
        Writer {
            flight: self.clone(),
            handle: None,
        }
    }

    /// Takes the oldest item nobody is writing yet, if any (none after a
    /// failed write).
    fn take(&self, s: &mut State) -> Option<(u64, Arc<InFlight>)> {
        if s.taken == s.submitted || s.failed.is_some() {
            return None;
        }
        s.taken += 1;
        let at = (s.taken - s.written - 1) as usize;
        Some((s.taken, s.queue[at].clone()))
    }

    /// Writes a taken item and retires what is written in order.
    fn write(&self, ticket: u64, item: &InFlight) {
        let dev = self.dev.get().expect("taken without a device");
        let res = dev.write_at(&item.bytes, item.addr);
        let mut s = self.lock();
        let mut grew = None;
        match res {
            Ok(()) => {
                let st = &mut *s;
                st.done.insert(ticket);
                let before = st.written;
                while st.done.remove(&(st.written + 1)) {
                    let it = st.queue.pop_front().expect("written item queued");
                    st.queued_bytes -= it.bytes.len();
                    st.written += 1;
                }
                grew = (st.written > before).then_some(st.written);
            }
            Err(e) => {
                if s.failed.is_none() {
                    s.failed = Some(e.to_string());
                    s.error = Some(e);
                    // After `failed` is set, under the lock: whoever sees
                    // the flag finds the reason.
                    self.has_failed.store(true, Ordering::Release);
                }
                self.work.notify_all();
            }
        }
        self.cv.notify_all();
        drop(s);
        if let (Some(w), Some(f)) = (grew, self.on_written.get()) {
            // A panic here would end the writer thread in silence, and the
            // next submit that waits for room would hold the engine lock for
            // good (review 40 finding 1): writing stops, with the reason. (The
            // engine's callback catches the segment hook's own panics.)
            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(w))).is_err() {
                let mut s = self.lock();
                if s.failed.is_none() {
                    s.failed = Some("the segment hook panicked: nothing more is written".into());
                    self.has_failed.store(true, Ordering::Release);
                }
                self.work.notify_all();
                self.cv.notify_all();
            }
        }
    }

    /// Queues a write; returns its number (see `wait_written`). Waits while
    /// `QUEUE_BYTES` are queued already (memory stays bounded). Fails if the
    /// writer stopped after an error (the item then stays readable, never
    /// written).
    pub fn submit(&self, _w: &Writer, addr: u64, bytes: Vec<u8>) -> Result<u64, String> {
        let item = Arc::new(InFlight { addr, bytes });
        let mut s = self.lock();
        while s.failed.is_none()
            && !s.queue.is_empty()
            && s.queued_bytes + item.bytes.len() > QUEUE_BYTES
        {
            if s.taken < s.submitted {
                // Only writes free space. Items nobody has taken (quiet
                // ones whose submitter has not waited for them yet) are the
                // thread's now: this submit would wake it only after the
                // space came, so without this both would wait for good.
                self.work.notify_all();
            }
            s = self.cv.wait(s).expect("in-flight queue poisoned");
        }
        if let Some(f) = s.failed.clone() {
            // Never written, but kept readable like the items queued before
            // the failure: the caller may already point at it (the map at
            // a checkpoint's pages), and reads go on after a failure.
            s.queued_bytes += item.bytes.len();
            s.queue.push_back(item);
            s.submitted += 1;
            return Err(f);
        }
        s.queued_bytes += item.bytes.len();
        s.queue.push_back(item);
        s.submitted += 1;
        let ticket = s.submitted;
        if s.inline {
            // A failed write is reported as with the thread: by the next
            // submit, wait or `failed`.
            if let Some((t, item)) = self.take(&mut s) {
                drop(s);
                self.write(t, &item);
                return Ok(ticket);
            }
        }
        if !s.quiet {
            self.work.notify_all();
        }
        Ok(ticket)
    }

    /// Whether submits wake the writer thread (see `State::quiet`). Whoever
    /// turns it on waits for what it submits, or turns it off again, before
    /// anyone else submits: an item nobody takes is written only when a
    /// later submit wakes the thread or someone waits for it.
    pub fn set_quiet(&self, quiet: bool) {
        self.lock().quiet = quiet;
    }

    /// How many items are written (all of `1..=written`).
    pub fn written(&self) -> u64 {
        self.lock().written
    }

    /// The number of the newest item submitted (0: none yet).
    pub fn submitted(&self) -> u64 {
        self.lock().submitted
    }

    /// Waits until every queued write has returned. The first call after a
    /// failed write returns its error; later ones a description of it.
    pub fn drain(&self) -> Result<(), Result<DeviceError, String>> {
        let last = self.submitted();
        self.wait_written(last)
    }

    /// Waits until items `1..=ticket` have been written (later ones may
    /// still be queued), writing those nobody has taken yet itself. Errors
    /// as `drain`.
    pub fn wait_written(&self, ticket: u64) -> Result<(), Result<DeviceError, String>> {
        let mut s = self.lock();
        while s.written < ticket && s.failed.is_none() {
            if s.taken < ticket && self.dev.get().is_some() {
                if let Some((t, item)) = self.take(&mut s) {
                    drop(s);
                    self.write(t, &item);
                    s = self.lock();
                    continue;
                }
            }
            s = self.cv.wait(s).expect("in-flight queue poisoned");
        }
        if let Some(e) = s.error.take() {
            return Err(Ok(e));
        }
        match &s.failed {
            Some(f) => Err(Err(f.clone())),
            None => Ok(()),
        }
    }

    /// Why writing stopped, if it did.
    pub fn failed(&self) -> Option<String> {
        if !self.has_failed.load(Ordering::Acquire) {
            return None;
        }
        self.lock().failed.clone()
    }

    /// The bytes at `[offset, offset + len)` if a queued write holds them:
    /// the newest such write's, since it is the one the device ends with.
    pub fn read(&self, offset: u64, len: usize) -> Option<Vec<u8>> {
        let s = self.lock();
        let (at, bytes) = s.queue.iter().enumerate().rev().find_map(|(at, it)| {
            let start = offset.checked_sub(it.addr)? as usize;
            let end = start.checked_add(len)?;
            (end <= it.bytes.len()).then(|| (at, it.bytes[start..end].to_vec()))
        })?;
        // A newer item covering only part of the range would make the
        // answer half stale: the engine never queues one (each item goes
        // to the log head, which a segment's reuse reaches only after the
        // checkpoint that released it waited for every earlier item).
        debug_assert!(
            s.queue.iter().skip(at + 1).all(|it| {
                let end = it.addr + it.bytes.len() as u64;
                end <= offset || it.addr >= offset + len as u64
            }),
            "queued writes overlap [{offset}, +{len}) ambiguously"
        );
        Some(bytes)
    }
}

impl Writer {
    /// Stops the thread once everything queued is written.
    pub fn stop(&mut self) {
        self.flight.lock().stopping = true;
        self.flight.work.notify_all();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::MemoryDevice;
    use std::time::Duration;

    /// Writes from the log writer thread wait while the gate is shut;
    /// everyone else's go through. Records the thread of every write.
    struct WriterStuck {
        inner: MemoryDevice,
        /// (shut, writer-thread writes waiting)
        gate: Mutex<(bool, usize)>,
        cv: Condvar,
        writers: Mutex<Vec<Option<String>>>,
        /// Writer-thread writes fail (after the gate) instead of writing.
        fail_thread: std::sync::atomic::AtomicBool,
    }

    impl WriterStuck {
        fn new(shut: bool) -> WriterStuck {
            WriterStuck::with_bytes(shut, 1 << 20)
        }

        fn with_bytes(shut: bool, bytes: u64) -> WriterStuck {
            WriterStuck {
                inner: MemoryDevice::new(bytes),
                gate: Mutex::new((shut, 0)),
                cv: Condvar::new(),
                writers: Mutex::new(Vec::new()),
                fail_thread: std::sync::atomic::AtomicBool::new(false),
            }
        }

        fn open_gate(&self) {
            self.gate.lock().unwrap().0 = false;
            self.cv.notify_all();
        }

        /// Waits until a writer-thread write reached the gate.
        fn await_thread_write(&self) {
            let g = self.gate.lock().unwrap();
            let (g, _) = self
                .cv
                .wait_timeout_while(g, Duration::from_secs(10), |g| g.1 == 0)
                .unwrap();
            assert!(g.1 > 0, "the writer thread took nothing");
        }
    }

    impl Device for WriterStuck {
        fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), DeviceError> {
            self.inner.read_at(buf, offset)
        }
        fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), DeviceError> {
            let name = std::thread::current().name().map(String::from);
            self.writers.lock().unwrap().push(name);
            if std::thread::current().name() == Some("ldfs-log-writer") {
                let mut g = self.gate.lock().unwrap();
                g.1 += 1;
                self.cv.notify_all();
                while g.0 {
                    g = self.cv.wait(g).unwrap();
                }
                if self.fail_thread.load(std::sync::atomic::Ordering::SeqCst) {
                    return Err(DeviceError::Injected {
                        op: crate::device::DeviceOp::Write,
                        n: 0,
                        offset,
                    });
                }
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

    /// A waiter writes the items the writer thread has not taken (here: it
    /// is stuck on an earlier one) instead of sleeping until the thread
    /// gets to them; it returns once every item up to its own is written,
    /// and items stay readable until then.
    #[test]
    fn waiters_write_what_the_writer_thread_has_not_taken() {
        let dev = Arc::new(WriterStuck::new(true));
        let flight = Arc::new(Flight::default());
        let mut w = flight.start(dev.clone());
        // Dropped before `w` (whose drop joins the writer thread): a failed
        // assertion leaves no thread stuck at the gate.
        struct Open(Arc<WriterStuck>);
        impl Drop for Open {
            fn drop(&mut self) {
                self.0.gate.lock().unwrap().0 = false;
                self.0.cv.notify_all();
            }
        }
        let _open = Open(dev.clone());
        flight.submit(&w, 0, vec![1; 4096]).unwrap();
        {
            let g = dev.gate.lock().unwrap();
            let (g, _) = dev
                .cv
                .wait_timeout_while(g, Duration::from_secs(10), |g| g.1 == 0)
                .unwrap();
            assert_eq!(g.1, 1, "the writer thread did not take item 1");
        }
        assert_eq!(flight.submit(&w, 4096, vec![2; 4096]).unwrap(), 2);
        assert_eq!(flight.submit(&w, 8192, vec![3; 4096]).unwrap(), 3);
        let waiter = {
            let flight = flight.clone();
            std::thread::spawn(move || flight.wait_written(3).is_ok())
        };
        // Items 2 and 3 reach the device while item 1 is stuck.
        let mut b = vec![0u8; 4096];
        let t0 = std::time::Instant::now();
        loop {
            dev.inner.read_at(&mut b, 8192).unwrap();
            if b == vec![3; 4096] {
                break;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "the waiter left item 3 to the stuck writer thread"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        dev.inner.read_at(&mut b, 4096).unwrap();
        assert_eq!(b, vec![2; 4096]);
        assert!(!waiter.is_finished(), "returned before item 1 was written");
        assert_eq!(flight.read(0, 4096), Some(vec![1; 4096]));
        assert_eq!(flight.read(8192, 4096), Some(vec![3; 4096]));
        dev.gate.lock().unwrap().0 = false;
        dev.cv.notify_all();
        assert!(waiter.join().unwrap());
        assert_eq!(flight.read(8192, 4096), None);
        w.stop();
        dev.inner.read_at(&mut b, 0).unwrap();
        assert_eq!(b, vec![1; 4096]);
    }

    /// A quiet submit (a group commit's seal) leaves the writer thread
    /// asleep: the submitter's own wait writes the item, on its thread.
    /// Without `quiet` the thread would be woken and would usually race
    /// the waiter for it.
    #[test]
    fn quiet_submits_are_written_by_their_waiter() {
        let dev = Arc::new(WriterStuck::new(false));
        let flight = Arc::new(Flight::default());
        let mut w = flight.start(dev.clone());
        let me = std::thread::current().name().map(String::from);
        // Until the writer thread has taken a plain item (polled, not
        // waited for: the wait would write it here) the count is `n`.
        let taken_by_thread = |n: usize| {
            let until = std::time::Instant::now() + Duration::from_secs(60);
            while dev.writers.lock().unwrap().len() < n {
                assert!(
                    std::time::Instant::now() < until,
                    "the writer thread never ran"
                );
                std::thread::sleep(Duration::from_millis(1));
            }
        };
        // Let the thread reach its wait: before that it looks at the queue
        // without being woken. It has after writing a plain item of its own.
        let t = flight.submit(&w, 1 << 18, vec![8; 4096]).unwrap();
        taken_by_thread(1);
        flight.wait_written(t).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        for round in 0..20u64 {
            flight.set_quiet(true);
            let t = flight
                .submit(&w, round * 4096, vec![round as u8; 4096])
                .unwrap();
            flight.set_quiet(false);
            // Give a wrongly woken writer thread every chance to take it.
            std::thread::sleep(Duration::from_millis(1));
            flight.wait_written(t).unwrap();
        }
        let writers = dev.writers.lock().unwrap().clone();
        assert_eq!(writers.len(), 21);
        assert!(
            writers[1..].iter().all(|n| *n == me),
            "the writer thread took quiet items: {writers:?}"
        );
        // A plain submit still goes to the writer thread.
        let t = flight.submit(&w, 1 << 19, vec![9; 4096]).unwrap();
        taken_by_thread(22);
        flight.wait_written(t).unwrap();
        assert_eq!(
            dev.writers.lock().unwrap().last().unwrap().as_deref(),
            Some("ldfs-log-writer")
        );
        w.stop();
    }

    /// Two queued writes of the same device range: a read gets the newer
    /// one (the device ends with it), not the first found.
    #[test]
    fn a_read_gets_the_newest_queued_write_of_a_range() {
        // Not started: nothing is written, both items stay queued.
        let flight = Flight::default();
        let w = Writer {
            flight: Arc::new(Flight::default()),
            handle: None,
        };
        flight.submit(&w, 8192, vec![1; 8192]).unwrap();
        flight.submit(&w, 8192, vec![2; 4096]).unwrap();
        let first = |b: Vec<u8>| (b[0], b.len());
        assert_eq!(flight.read(8192, 4096).map(first), Some((2, 4096)));
        // Only the older one covers this: no newer item touches it.
        assert_eq!(flight.read(12288, 4096).map(first), Some((1, 4096)));
        assert_eq!(flight.read(4096, 4096), None);
    }

    /// Without a thread each item is written as it is submitted; after a
    /// failed write, later items are refused but stay readable (a map
    /// may already point at them), and waits report the failure.
    #[test]
    fn inline_writes_and_items_refused_after_a_failure_stay_readable() {
        use crate::device::{FaultDevice, FaultPlan};
        let dev = Arc::new(FaultDevice::new(
            MemoryDevice::new(1 << 20),
            FaultPlan {
                fail_write_nth: Some(2),
                sticky: true,
                ..Default::default()
            },
        ));
        let flight = Arc::new(Flight::default());
        let w = flight.start_inline(dev.clone());
        assert_eq!(flight.submit(&w, 0, vec![1; 4096]), Ok(1));
        let mut b = vec![0u8; 4096];
        dev.inner().read_at(&mut b, 0).unwrap();
        assert_eq!(b, vec![1; 4096], "written before submit returned");
        assert_eq!(flight.read(0, 4096), None);
        assert_eq!(flight.submit(&w, 4096, vec![2; 4096]), Ok(2));
        assert!(flight.failed().is_some());
        assert!(flight.submit(&w, 8192, vec![3; 4096]).is_err());
        assert_eq!(flight.read(4096, 1).map(|b| b[0]), Some(2));
        assert_eq!(flight.read(8192, 1).map(|b| b[0]), Some(3));
        assert!(flight.wait_written(3).is_err());
    }

    /// Review probe (lost wakeup): a quiet item whose submitter has not
    /// waited for it yet (`set_quiet` allows that: "an item nobody takes is
    /// written when a later submit wakes the thread") fills the queue; a
    /// plain submit then waits for queue space, which only that item's
    /// write frees. The plain submit must wake the writer thread before it
    /// waits, or the two wait for each other for good. `stop` also writes
    /// what nobody took.
    #[test]
    fn a_submit_waiting_for_queue_space_wakes_the_thread_for_untaken_items() {
        let dev = Arc::new(WriterStuck::with_bytes(false, 8 << 20));
        let flight = Arc::new(Flight::default());
        let mut w = flight.start(dev.clone());
        // Let the thread reach its first wait (see the test above).
        std::thread::sleep(Duration::from_millis(50));
        flight.set_quiet(true);
        let big = QUEUE_BYTES - (1 << 20);
        assert_eq!(flight.submit(&w, 0, vec![1; big]), Ok(1));
        flight.set_quiet(false);
        let (tx, rx) = std::sync::mpsc::channel();
        let plain = {
            let flight = flight.clone();
            // `submit` only wants a writer to show; this one stops another
            // flight when dropped.
            let w = Writer {
                flight: Arc::new(Flight::default()),
                handle: None,
            };
            std::thread::spawn(move || {
                let t = flight.submit(&w, 4 << 20, vec![2; 2 << 20]);
                let _ = tx.send(t);
            })
        };
        let got = rx.recv_timeout(Duration::from_secs(10));
        // Unstick a plain submit left waiting (the stop takes item 1).
        w.stop();
        plain.join().unwrap();
        assert_eq!(
            got.ok(),
            Some(Ok(2)),
            "a plain submit waited for queue space that only an untaken quiet item held"
        );
        let mut b = vec![0u8; 4096];
        dev.inner.read_at(&mut b, 0).unwrap();
        assert_eq!(b, vec![1; 4096]);
        dev.inner.read_at(&mut b, 4 << 20).unwrap();
        assert_eq!(b, vec![2; 4096]);
        // A quiet item nobody waits for is written when the writer stops.
        let flight = Arc::new(Flight::default());
        let mut w = flight.start(dev.clone());
        std::thread::sleep(Duration::from_millis(50));
        flight.set_quiet(true);
        flight.submit(&w, 8192, vec![3; 4096]).unwrap();
        flight.set_quiet(false);
        w.stop();
        dev.inner.read_at(&mut b, 8192).unwrap();
        assert_eq!(b, vec![3; 4096], "stop left a quiet item unwritten");
    }

    /// Writes complete out of order (a waiter writes the items after the
    /// one the writer thread holds): when the thread's earlier item then
    /// fails, the waiter reports the failure, never Ok, and every item,
    /// written or not, stays readable.
    #[test]
    fn a_waiter_that_wrote_later_items_reports_an_earlier_items_failure() {
        let dev = Arc::new(WriterStuck::new(true));
        dev.fail_thread
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let flight = Arc::new(Flight::default());
        let mut w = flight.start(dev.clone());
        struct Open(Arc<WriterStuck>);
        impl Drop for Open {
            fn drop(&mut self) {
                self.0.open_gate();
            }
        }
        let _open = Open(dev.clone());
        flight.submit(&w, 0, vec![1; 4096]).unwrap();
        dev.await_thread_write();
        flight.set_quiet(true);
        let t = flight.submit(&w, 4096, vec![2; 4096]).unwrap();
        flight.set_quiet(false);
        let waiter = {
            let flight = flight.clone();
            std::thread::spawn(move || flight.wait_written(t))
        };
        // The waiter writes item 2 itself, then waits for item 1.
        let t0 = std::time::Instant::now();
        let mut b = vec![0u8; 4096];
        loop {
            dev.inner.read_at(&mut b, 4096).unwrap();
            if b == vec![2; 4096] {
                break;
            }
            assert!(t0.elapsed() < Duration::from_secs(10), "item 2 unwritten");
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(20));
        assert!(!waiter.is_finished(), "returned before item 1 was written");
        dev.open_gate();
        let res = waiter.join().unwrap();
        assert!(
            matches!(res, Err(Ok(DeviceError::Injected { .. }))),
            "{res:?}"
        );
        assert!(flight.failed().is_some());
        assert!(flight.wait_written(t).is_err(), "a later wait");
        assert_eq!(flight.read(0, 4096), Some(vec![1; 4096]));
        assert_eq!(flight.read(4096, 4096), Some(vec![2; 4096]));
        w.stop();
    }
}
