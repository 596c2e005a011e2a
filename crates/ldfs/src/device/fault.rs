//! A device wrapper that injects faults into another device, following a
//! [`FaultPlan`]: an injected error on the Nth read, write or flush (optionally
//! sticky), bit flips seen by reads, and a misdirected write.
//!
//! Invariants: an injected error does nothing to the inner device; bit flips
//! change only the caller's buffer, never the inner device; counters count
//! every call of their kind since the plan was set (1-based), including calls
//! that fail. Decisions are taken under a lock, the inner I/O runs outside it,
//! so the wrapper adds no serialization of its own.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};

use super::{check_range, Device, DeviceError, DeviceOp};

/// Which faults to inject. The default injects none.
#[derive(Clone, Debug, Default)]
pub struct FaultPlan {
    /// The Nth read (1-based) fails with [`DeviceError::Injected`].
    pub fail_read_nth: Option<u64>,
    /// The Nth write fails with [`DeviceError::Injected`] and writes nothing.
    pub fail_write_nth: Option<u64>,
    /// The Nth flush fails with [`DeviceError::Injected`] and flushes nothing.
    pub fail_flush_nth: Option<u64>,
    /// Once an injected failure fired, every later call of that kind fails.
    pub sticky: bool,
    /// `(device byte offset, xor mask)`: every read covering that byte sees it
    /// xored with the mask; the stored data is unchanged.
    pub flip_bits_on_read: Vec<(u64, u8)>,
    /// `(n, delta)`: the Nth write lands at `offset + delta` instead and
    /// reports success; if that range is outside the device it is silently
    /// dropped.
    pub misdirect_write_nth: Option<(u64, i64)>,
}

#[derive(Default)]
struct Counter {
    calls: u64,
    failed: bool,
}

impl Counter {
    /// Counts a call; returns its number if it must fail.
    fn next(&mut self, nth: Option<u64>, sticky: bool) -> Result<u64, u64> {
        self.calls += 1;
        let n = self.calls;
        if nth == Some(n) || (sticky && self.failed) {
            self.failed = true;
            return Err(n);
        }
        Ok(n)
    }
}

#[derive(Default)]
struct State {
    plan: FaultPlan,
    reads: Counter,
    writes: Counter,
    flushes: Counter,
}

/// Wraps `D`, injecting the faults of the current [`FaultPlan`].
pub struct FaultDevice<D: Device> {
    inner: D,
    state: Mutex<State>,
    fired: AtomicBool,
}

impl<D: Device> FaultDevice<D> {
    pub fn new(inner: D, plan: FaultPlan) -> FaultDevice<D> {
        let state = State {
            plan,
            ..State::default()
        };
        FaultDevice {
            inner,
            state: Mutex::new(state),
            fired: AtomicBool::new(false),
        }
    }

    /// Replaces the plan and restarts every counter (and [`Self::fired`]).
    pub fn set_plan(&self, plan: FaultPlan) {
        let mut state = self.lock();
        *state = State {
            plan,
            ..State::default()
        };
        self.fired.store(false, Ordering::SeqCst);
    }

    /// The wrapped device, for reading behind the faults' back.
    pub fn inner(&self) -> &D {
        &self.inner
    }

    /// Whether any fault of the current plan (error, bit flip or misdirected
    /// write) has taken effect.
    pub fn fired(&self) -> bool {
        self.fired.load(Ordering::SeqCst)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state is plain counters, valid even if a holder panicked.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn injected(&self, op: DeviceOp, n: u64, offset: u64) -> DeviceError {
        self.fired.store(true, Ordering::SeqCst);
        DeviceError::Injected { op, n, offset }
    }
}

impl<D: Device> Device for FaultDevice<D> {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), DeviceError> {
        let flips: Vec<(usize, u8)> = {
            let mut state = self.lock();
            let sticky = state.plan.sticky;
            let nth = state.plan.fail_read_nth;
            if let Err(n) = state.reads.next(nth, sticky) {
                return Err(self.injected(DeviceOp::Read, n, offset));
            }
            let end = offset.saturating_add(buf.len() as u64);
            state
                .plan
                .flip_bits_on_read
                .iter()
                .filter(|&&(at, _)| at >= offset && at < end)
                .map(|&(at, mask)| ((at - offset) as usize, mask))
                .collect()
        };
        self.inner.read_at(buf, offset)?;
        if !flips.is_empty() {
            for (i, mask) in flips {
                buf[i] ^= mask;
            }
            self.fired.store(true, Ordering::SeqCst);
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), DeviceError> {
        let misdirect = {
            let mut state = self.lock();
            let sticky = state.plan.sticky;
            let nth = state.plan.fail_write_nth;
            let n = match state.writes.next(nth, sticky) {
                Ok(n) => n,
                Err(n) => return Err(self.injected(DeviceOp::Write, n, offset)),
            };
            match state.plan.misdirect_write_nth {
                Some((m, delta)) if m == n => Some(delta),
                _ => None,
            }
        };
        let Some(delta) = misdirect else {
            return self.inner.write_at(buf, offset);
        };
        // The request itself must be valid; only the device misplaces it.
        let size = self.inner.size_bytes();
        check_range(DeviceOp::Write, offset, buf.len(), size)?;
        self.fired.store(true, Ordering::SeqCst);
        let target = offset.checked_add_signed(delta);
        match target {
            Some(t) if check_range(DeviceOp::Write, t, buf.len(), size).is_ok() => {
                self.inner.write_at(buf, t)
            }
            _ => Ok(()),
        }
    }

    fn flush(&self) -> Result<(), DeviceError> {
        {
            let mut state = self.lock();
            let sticky = state.plan.sticky;
            let nth = state.plan.fail_flush_nth;
            if let Err(n) = state.flushes.next(nth, sticky) {
                return Err(self.injected(DeviceOp::Flush, n, 0));
            }
        }
        self.inner.flush()
    }

    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
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
    use crate::device::{CrashDevice, MemoryDevice};

    fn dev(plan: FaultPlan) -> FaultDevice<MemoryDevice> {
        FaultDevice::new(MemoryDevice::new(8192), plan)
    }

    #[test]
    fn no_plan_is_transparent() {
        let d = dev(FaultPlan::default());
        d.write_at(b"abc", 5).unwrap();
        d.flush().unwrap();
        let mut buf = [0u8; 3];
        d.read_at(&mut buf, 5).unwrap();
        assert_eq!(&buf, b"abc");
        assert_eq!(d.size_bytes(), 8192);
        assert!(!d.fired());
    }

    #[test]
    fn nth_write_fails_and_others_succeed() {
        let d = dev(FaultPlan {
            fail_write_nth: Some(2),
            ..FaultPlan::default()
        });
        d.write_at(&[1], 0).unwrap();
        assert!(!d.fired());
        let err = d.write_at(&[2], 1).unwrap_err();
        assert!(matches!(
            err,
            DeviceError::Injected {
                op: DeviceOp::Write,
                n: 2,
                offset: 1
            }
        ));
        assert!(d.fired());
        d.write_at(&[3], 2).unwrap();
        let mut buf = [9u8; 3];
        d.inner().read_at(&mut buf, 0).unwrap();
        assert_eq!(buf, [1, 0, 3], "the failed write must not reach the device");
    }

    #[test]
    fn nth_read_and_flush_fail() {
        let inner = CrashDevice::new(4096);
        let d = FaultDevice::new(
            inner,
            FaultPlan {
                fail_read_nth: Some(1),
                fail_flush_nth: Some(1),
                ..FaultPlan::default()
            },
        );
        let mut buf = [0u8; 4];
        assert!(matches!(
            d.read_at(&mut buf, 7),
            Err(DeviceError::Injected {
                op: DeviceOp::Read,
                n: 1,
                offset: 7
            })
        ));
        d.read_at(&mut buf, 7).unwrap();
        d.write_at(&[1], 0).unwrap();
        assert!(matches!(
            d.flush(),
            Err(DeviceError::Injected {
                op: DeviceOp::Flush,
                n: 1,
                offset: 0
            })
        ));
        assert_eq!(
            d.inner().pending_writes(),
            1,
            "the failed flush must not flush"
        );
        d.flush().unwrap();
        assert_eq!(d.inner().pending_writes(), 0);
    }

    #[test]
    fn sticky_failures_persist_per_kind() {
        let d = dev(FaultPlan {
            fail_write_nth: Some(1),
            sticky: true,
            ..FaultPlan::default()
        });
        for n in 1..=4 {
            assert!(matches!(
                d.write_at(&[1], 0),
                Err(DeviceError::Injected { op: DeviceOp::Write, n: got, .. }) if got == n
            ));
        }
        // Other kinds are unaffected.
        d.read_at(&mut [0u8; 1], 0).unwrap();
        d.flush().unwrap();
        assert_eq!(d.inner().snapshot()[0], 0);
    }

    #[test]
    fn not_sticky_fails_once() {
        let d = dev(FaultPlan {
            fail_write_nth: Some(1),
            ..FaultPlan::default()
        });
        assert!(d.write_at(&[1], 0).is_err());
        d.write_at(&[1], 0).unwrap();
    }

    #[test]
    fn set_plan_resets_counters() {
        let d = dev(FaultPlan {
            fail_flush_nth: Some(2),
            ..FaultPlan::default()
        });
        d.flush().unwrap();
        assert!(d.flush().is_err());
        d.set_plan(FaultPlan {
            fail_flush_nth: Some(2),
            ..FaultPlan::default()
        });
        assert!(!d.fired());
        d.flush().unwrap();
        assert!(d.flush().is_err());
        d.set_plan(FaultPlan::default());
        d.flush().unwrap();
        d.flush().unwrap();
    }

    #[test]
    fn bit_flip_visible_on_read_not_in_inner() {
        let d = dev(FaultPlan {
            flip_bits_on_read: vec![(100, 0x01), (200, 0xF0)],
            ..FaultPlan::default()
        });
        d.write_at(&[0xAA; 300], 0).unwrap();
        // A read not covering a flipped byte is clean and fires nothing.
        let mut clean = [0u8; 50];
        d.read_at(&mut clean, 0).unwrap();
        assert_eq!(clean, [0xAA; 50]);
        assert!(!d.fired());
        let mut buf = [0u8; 300];
        d.read_at(&mut buf, 0).unwrap();
        assert_eq!(buf[100], 0xAB);
        assert_eq!(buf[200], 0x5A);
        assert_eq!(buf[99], 0xAA);
        assert!(d.fired());
        // Partial read, offset inside the buffer.
        let mut one = [0u8; 2];
        d.read_at(&mut one, 199).unwrap();
        assert_eq!(one, [0xAA, 0x5A]);
        // The stored data is unchanged.
        assert_eq!(d.inner().snapshot()[..300], [0xAA; 300]);
    }

    #[test]
    fn misdirected_write_lands_elsewhere_and_reports_success() {
        let d = dev(FaultPlan {
            misdirect_write_nth: Some((2, 4096)),
            ..FaultPlan::default()
        });
        d.write_at(&[1; 10], 0).unwrap();
        d.write_at(&[2; 10], 100).unwrap();
        assert!(d.fired());
        d.write_at(&[3; 10], 200).unwrap();
        let img = d.inner().snapshot();
        assert_eq!(img[..10], [1; 10]);
        assert_eq!(
            img[100..110],
            [0; 10],
            "the misdirected write reached its target"
        );
        assert_eq!(img[4196..4206], [2; 10]);
        assert_eq!(img[200..210], [3; 10]);
    }

    #[test]
    fn misdirected_write_out_of_range_is_dropped() {
        for delta in [-1000, 8192, i64::MAX, i64::MIN] {
            let d = dev(FaultPlan {
                misdirect_write_nth: Some((1, delta)),
                ..FaultPlan::default()
            });
            d.write_at(&[5; 10], 500).unwrap();
            assert_eq!(d.inner().snapshot(), vec![0u8; 8192], "delta {delta}");
        }
        // An invalid request is still an error.
        let d = dev(FaultPlan {
            misdirect_write_nth: Some((1, -8192)),
            ..FaultPlan::default()
        });
        assert!(matches!(
            d.write_at(&[5; 10], 8190),
            Err(DeviceError::OutOfRange { .. })
        ));
    }

    #[test]
    fn out_of_range_read_with_flips_is_an_error_not_a_panic() {
        let d = dev(FaultPlan {
            flip_bits_on_read: vec![(u64::MAX, 1)],
            ..FaultPlan::default()
        });
        assert!(matches!(
            d.read_at(&mut [0u8; 4], u64::MAX - 1),
            Err(DeviceError::OutOfRange { .. })
        ));
    }
}
