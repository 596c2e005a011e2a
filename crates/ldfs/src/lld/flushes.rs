//! Device flushes in the order they began. A flush that fails may have
//! dropped writes the device held, whoever issued them, and a later flush
//! that succeeds does not bring them back (Linux reports a writeback error
//! to one fsync per open file description). So the engine's device reports
//! a flush as successful only once it and every flush under way when its
//! own device flush returned (begun before it or after it) have ended
//! without error, and no other flush failed before it ended: a group
//! commit overlapping a checkpoint's failing flush (on the checkpointer
//! thread, begun before or after it, and returning before or after it)
//! fails too, and so does every flush after a failed one (the engine has
//! turned read-only by then anyway).

use std::collections::BTreeSet;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use crate::device::{Device, DeviceError, DeviceOp};

pub(crate) struct OrderedFlushes {
    inner: Arc<dyn Device>,
    state: Mutex<State>,
    done: Condvar,
}

#[derive(Default)]
struct State {
    /// Number of the next flush to begin.
    next: u64,
    /// Flushes begun and not yet ended.
    running: BTreeSet<u64>,
    /// The first flush that failed, if any did.
    failed: Option<u64>,
}

impl OrderedFlushes {
    pub(crate) fn new(inner: Arc<dyn Device>) -> OrderedFlushes {
        OrderedFlushes {
            inner,
            state: Mutex::new(State::default()),
            done: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().expect("flush order poisoned")
    }
}

impl Device for OrderedFlushes {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), DeviceError> {
        self.inner.read_at(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), DeviceError> {
        self.inner.write_at(buf, offset)
    }

    fn flush(&self) -> Result<(), DeviceError> {
        let me = {
            let mut s = self.lock();
            let me = s.next;
            s.next += 1;
            s.running.insert(me);
            me
        };
        let res = self.inner.flush();
        let mut s = self.lock();
        s.running.remove(&me);
        if res.is_err() && s.failed.is_none_or(|f| f > me) {
            s.failed = Some(me);
        }
        self.done.notify_all();
        res?;
        // Every flush under way now, begun before this one or after it,
        // must end first: one begun later may have taken this one's
        // writeback error (the device reports it to one flush only) with
        // its check before this one's, and still be on its way back. Those
        // begun from now on came after this one's check: they cannot have.
        let horizon = s.next;
        while s.running.first().is_some_and(|&f| f < horizon) {
            s = self.done.wait(s).expect("flush order poisoned");
        }
        // Any failure seen by now counts, a later-begun flush's too.
        match s.failed {
            Some(f) => Err(DeviceError::Io {
                op: DeviceOp::Flush,
                offset: 0,
                len: 0,
                source: std::io::Error::other(format!(
                    "another flush (#{f}, this one #{me}) failed before this one ended: \
                     the device may have dropped writes this flush was to make durable"
                )),
            }),
            None => Ok(()),
        }
    }

    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }

    fn will_need(&self, ranges: &[(u64, u64)]) {
        self.inner.will_need(ranges)
    }

    fn write_unit_bytes(&self) -> u64 {
        self.inner.write_unit_bytes()
    }

    fn discard(&self, offset: u64, len: u64) -> Result<bool, DeviceError> {
        self.inner.discard(offset, len)
    }
    fn resize(&self, bytes: u64) -> Result<bool, DeviceError> {
        self.inner.resize(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::MemoryDevice;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    /// The device's hints pass through (uip sizes its writes by the unit).
    #[test]
    fn the_write_unit_is_the_devices() {
        let dev = OrderedFlushes::new(Arc::new(MemoryDevice::new(1 << 16).with_write_unit(4096)));
        assert_eq!(dev.write_unit_bytes(), 4096);
    }

    /// A flush that succeeds while one begun before it is still under way
    /// waits for it, and fails with it.
    #[test]
    fn a_flush_fails_when_an_earlier_one_fails_after_it() {
        let gate = Arc::new(GateOne::new("probe-first-flush", true, false));
        let dev = Arc::new(OrderedFlushes::new(gate.clone()));
        let first = gate.spawn_gated(&dev);
        let second = {
            let dev = dev.clone();
            std::thread::spawn(move || dev.flush())
        };
        // The second flush has ended on the device; it must not return yet.
        while dev.lock().next < 2 || dev.lock().running.len() > 1 {
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(20));
        assert!(
            !second.is_finished(),
            "returned before the earlier flush ended"
        );
        gate.release();
        assert!(first.join().unwrap().is_err());
        assert!(
            second.join().unwrap().is_err(),
            "the later flush reported Ok"
        );
        // Nor can any later flush bring the dropped writes back.
        assert!(dev.flush().is_err());
    }

    /// Blocks the flushes of the thread named `gated` until released (then
    /// fails them if `gated_fails`), and fails every flush of other threads
    /// while `fail` is set.
    struct GateOne {
        inner: MemoryDevice,
        gated: &'static str,
        gated_fails: bool,
        fail: AtomicBool,
        gate: Mutex<(bool, u32)>,
        cv: Condvar,
    }

    impl GateOne {
        fn new(gated: &'static str, gated_fails: bool, others_fail: bool) -> GateOne {
            GateOne {
                inner: MemoryDevice::new(1 << 20),
                gated,
                gated_fails,
                fail: AtomicBool::new(others_fail),
                gate: Mutex::new((true, 0)),
                cv: Condvar::new(),
            }
        }

        /// A flush of `dev` on the gated thread, returned once it waits at
        /// the gate.
        fn spawn_gated(
            &self,
            dev: &Arc<OrderedFlushes>,
        ) -> std::thread::JoinHandle<Result<(), DeviceError>> {
            let dev = dev.clone();
            let h = std::thread::Builder::new()
                .name(self.gated.into())
                .spawn(move || dev.flush())
                .unwrap();
            let mut g = self.gate.lock().unwrap();
            while g.1 == 0 {
                g = self.cv.wait(g).unwrap();
            }
            h
        }

        fn release(&self) {
            self.gate.lock().unwrap().0 = false;
            self.cv.notify_all();
        }
    }

    impl Device for GateOne {
        fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), DeviceError> {
            self.inner.read_at(buf, offset)
        }
        fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), DeviceError> {
            self.inner.write_at(buf, offset)
        }
        fn flush(&self) -> Result<(), DeviceError> {
            if std::thread::current().name() == Some(self.gated) {
                let mut g = self.gate.lock().unwrap();
                g.1 += 1;
                self.cv.notify_all();
                while g.0 {
                    g = self.cv.wait(g).unwrap();
                }
                if !self.gated_fails {
                    return Ok(());
                }
            } else if !self.fail.load(Ordering::SeqCst) {
                return Ok(());
            }
            Err(DeviceError::Injected {
                op: DeviceOp::Flush,
                n: 1,
                offset: 0,
            })
        }
        fn size_bytes(&self) -> u64 {
            self.inner.size_bytes()
        }
    }

    /// Review probe: a flush begun *after* a slow one fails while the slow
    /// one is still under way (a checkpoint's flush failing while a group
    /// commit's, begun first, waits at the device). Linux reports a
    /// writeback error to one fsync only: the failing one may have taken
    /// the error of the slow one's writes, so the slow one must not return
    /// Ok either (the engine's own check misses the failure while the
    /// checkpointer thread has not yet marked its phase 2 done).
    #[test]
    fn a_flush_fails_when_a_later_one_failed_before_it_ended() {
        let gate = Arc::new(GateOne::new("probe-slow-flush", false, true));
        let ordered = Arc::new(OrderedFlushes::new(gate.clone()));
        let slow = gate.spawn_gated(&ordered);
        assert!(ordered.flush().is_err(), "the injected failure");
        gate.release();
        let res = slow.join().unwrap();
        assert!(
            res.is_err(),
            "a flush that ended after another one failed returned {res:?}"
        );
    }

    /// Flushes of threads named in `gates` wait there until released, then
    /// end with the result the gate names; other threads' flushes succeed.
    struct NamedGates {
        inner: MemoryDevice,
        /// (thread name, fails, shut, waiting)
        gates: Mutex<Vec<(&'static str, bool, bool, bool)>>,
        cv: Condvar,
    }

    impl NamedGates {
        fn new(gates: &[(&'static str, bool)]) -> NamedGates {
            NamedGates {
                inner: MemoryDevice::new(1 << 20),
                gates: Mutex::new(gates.iter().map(|&(n, f)| (n, f, true, false)).collect()),
                cv: Condvar::new(),
            }
        }

        /// A flush of `dev` on thread `name`, returned once it waits at
        /// its gate (so flushes spawned one after another begin in order).
        fn spawn(
            &self,
            dev: &Arc<OrderedFlushes>,
            name: &'static str,
        ) -> std::thread::JoinHandle<Result<(), DeviceError>> {
            let dev = dev.clone();
            let h = std::thread::Builder::new()
                .name(name.into())
                .spawn(move || dev.flush())
                .unwrap();
            let mut g = self.gates.lock().unwrap();
            while !g.iter().any(|e| e.0 == name && e.3) {
                g = self.cv.wait(g).unwrap();
            }
            h
        }

        fn release(&self, name: &str) {
            for e in self.gates.lock().unwrap().iter_mut() {
                if e.0 == name {
                    e.2 = false;
                }
            }
            self.cv.notify_all();
        }

        /// Releases every gate (a failed assertion leaves no thread stuck).
        fn release_all(&self) {
            for e in self.gates.lock().unwrap().iter_mut() {
                e.2 = false;
            }
            self.cv.notify_all();
        }
    }

    impl Device for NamedGates {
        fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), DeviceError> {
            self.inner.read_at(buf, offset)
        }
        fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), DeviceError> {
            self.inner.write_at(buf, offset)
        }
        fn flush(&self) -> Result<(), DeviceError> {
            let me = std::thread::current().name().map(String::from);
            let mut g = self.gates.lock().unwrap();
            let Some(i) = g.iter().position(|e| Some(e.0) == me.as_deref()) else {
                return Ok(());
            };
            g[i].3 = true;
            self.cv.notify_all();
            while g[i].2 {
                g = self.cv.wait(g).unwrap();
            }
            if !g[i].1 {
                return Ok(());
            }
            Err(DeviceError::Injected {
                op: DeviceOp::Flush,
                n: 1,
                offset: 0,
            })
        }
        fn size_bytes(&self) -> u64 {
            self.inner.size_bytes()
        }
    }

    /// Review probe: flush A begins, then flush B (a checkpoint's, say),
    /// both on one file. A's writeback fails and B's error check comes
    /// first: B takes the error (Linux reports a writeback error to one
    /// fsync of a file description), A's own check finds none and A's
    /// device flush returns Ok — while B has not returned yet (its check
    /// came first, its return need not). A must not report Ok before B
    /// has ended: it waits for every flush under way when its own ended,
    /// not only for those begun before it, and fails with B. Here A's
    /// device flush succeeds at once and B's fails once released; no
    /// randomness (no seed).
    #[test]
    fn a_flush_fails_when_a_later_one_under_way_when_it_ended_fails() {
        let gates = Arc::new(NamedGates::new(&[("probe-a", false), ("probe-b", true)]));
        struct Open(Arc<NamedGates>);
        impl Drop for Open {
            fn drop(&mut self) {
                self.0.release_all();
            }
        }
        let _open = Open(gates.clone());
        let dev = Arc::new(OrderedFlushes::new(gates.clone()));
        let a = gates.spawn(&dev, "probe-a");
        let b = gates.spawn(&dev, "probe-b");
        gates.release("probe-a");
        // A returns before B ends only if it does not wait for B.
        let t0 = std::time::Instant::now();
        while !a.is_finished() && t0.elapsed() < Duration::from_millis(500) {
            std::thread::sleep(Duration::from_millis(1));
        }
        let early = a.is_finished();
        gates.release("probe-b");
        assert!(b.join().unwrap().is_err(), "the injected failure");
        let res = a.join().unwrap();
        assert!(
            res.is_err(),
            "flush A returned {res:?} (before B ended: {early}) though B, under way when A's \
             device flush ended, failed (B may have taken A's writeback error)"
        );
    }
}
