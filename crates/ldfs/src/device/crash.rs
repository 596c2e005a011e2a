//! A device that models what survives a crash (after FoundationDB's
//! `AsyncFileNonDurable` and redb's crash tests).
//!
//! It keeps the *durable* image — what the last completed `flush` made
//! permanent — apart from the ordered list of writes since then. Reads see the
//! durable image with every pending write applied in order (kept as a `current`
//! image so reads are cheap). A crash image is the durable image plus, in write
//! order, a seeded choice of the pending writes: each is dropped, kept whole,
//! or torn (only some of its 512-byte sectors land).
//!
//! Invariants: `current == durable + pending applied in order`; a flush makes
//! `durable == current` and empties `pending`; every crash image agrees with
//! the durable image outside the pending writes' ranges, and inside them
//! differs only in whole sectors of the [`SECTOR_BYTES`] grid.

use std::sync::Mutex;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::{check_range, Device, DeviceError, DeviceOp, SECTOR_BYTES};

/// How a crash treats the writes that no completed flush covered.
#[derive(Clone, Debug, PartialEq)]
pub struct CrashOptions {
    /// Each unflushed write survives with this probability (clamped to 0..=1;
    /// NaN counts as 0).
    pub keep_probability: f64,
    /// A surviving write is torn with this probability: each of its sectors
    /// then lands, or not, with probability one half.
    pub tear_probability: f64,
}

impl Default for CrashOptions {
    fn default() -> Self {
        CrashOptions {
            keep_probability: 0.5,
            tear_probability: 0.3,
        }
    }
}

/// Operation counters since the device was made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CrashStats {
    pub writes: u64,
    pub bytes_written: u64,
    pub flushes: u64,
    /// Discards (each zeroes its range like an unflushed write).
    pub discards: u64,
}

struct PendingWrite {
    offset: u64,
    bytes: Vec<u8>,
}

struct State {
    durable: Vec<u8>,
    current: Vec<u8>,
    pending: Vec<PendingWrite>,
    stats: CrashStats,
    /// Writes and flushes still allowed before the power goes (`None`: no
    /// cut planned).
    power_left: Option<u64>,
}

/// An in-memory device that separates written from durable data.
pub struct CrashDevice {
    state: Mutex<State>,
    /// A discard leaves the old bytes (as a drive without "read zeroes
    /// after TRIM" may): set, nothing discarded ever reads as zeros, so a
    /// reader that relies on zeros there is caught.
    discard_keeps_old: std::sync::atomic::AtomicBool,
}

/// True with probability `p`. Drawing a uniform value in [0, 1) makes 0 and 1
/// exact and never panics on out-of-range or NaN probabilities.
fn chance(rng: &mut ChaCha8Rng, p: f64) -> bool {
    rng.gen::<f64>() < p
}

impl CrashDevice {
    /// A zero-filled device of `size_bytes`, all of it durable.
    pub fn new(size_bytes: u64) -> CrashDevice {
        CrashDevice::from_image(vec![0; size_bytes as usize])
    }

    /// A device whose durable contents are `image` (for example a crash image,
    /// to recover from it and crash again).
    pub fn from_image(image: Vec<u8>) -> CrashDevice {
        let state = State {
            current: image.clone(),
            durable: image,
            pending: Vec::new(),
            stats: CrashStats::default(),
            power_left: None,
        };
        CrashDevice {
            state: Mutex::new(state),
            discard_keeps_old: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Every pending write becomes durable (a flush's effect).
    fn make_durable(state: &mut State) {
        let State {
            durable, pending, ..
        } = state;
        for w in pending.drain(..) {
            let start = w.offset as usize;
            durable[start..start + w.bytes.len()].copy_from_slice(&w.bytes);
        }
    }

    /// From now on a discard changes nothing the device reads (see
    /// `discard_keeps_old`); it is still counted.
    pub fn set_discard_keeps_old(&self, keep: bool) {
        self.discard_keeps_old
            .store(keep, std::sync::atomic::Ordering::Relaxed);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // Every update below leaves the state consistent before anything that
        // can panic, so a poisoned lock still guards valid data.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What the disk would hold after a crash now. The same `seed`, options
    /// and write history always give the same image.
    pub fn crash_image(&self, seed: u64, opts: &CrashOptions) -> Vec<u8> {
        let state = self.lock();
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut image = state.durable.clone();
        for w in &state.pending {
            if !chance(&mut rng, opts.keep_probability) {
                continue;
            }
            let start = w.offset as usize;
            if !chance(&mut rng, opts.tear_probability) {
                image[start..start + w.bytes.len()].copy_from_slice(&w.bytes);
                continue;
            }
            // Torn: cut at the device's sector grid, so a write that is not
            // sector aligned has partial sectors at its ends.
            let end = w.offset + w.bytes.len() as u64;
            let mut pos = w.offset;
            while pos < end {
                let next = ((pos / SECTOR_BYTES + 1) * SECTOR_BYTES).min(end);
                if rng.gen::<bool>() {
                    let (a, b) = ((pos - w.offset) as usize, (next - w.offset) as usize);
                    image[pos as usize..next as usize].copy_from_slice(&w.bytes[a..b]);
                }
                pos = next;
            }
        }
        image
    }

    /// The contents made durable by the last completed flush.
    pub fn durable_image(&self) -> Vec<u8> {
        self.lock().durable.clone()
    }

    /// The contents a read sees now (durable plus every pending write).
    pub fn current_image(&self) -> Vec<u8> {
        self.lock().current.clone()
    }

    /// How many writes a crash could still lose.
    pub fn pending_writes(&self) -> usize {
        self.lock().pending.len()
    }

    /// Counters of writes, bytes written and flushes.
    pub fn stats(&self) -> CrashStats {
        self.lock().stats
    }

    /// Cuts the power after `ops` more writes and flushes: from then on
    /// every write and flush fails with an I/O error and changes nothing,
    /// so `crash_image` shows the disk as it was at that instant — a crash
    /// in the middle of whatever the caller is doing (tests aim it into a
    /// cleaning pass or a checkpoint).
    pub fn cut_power_after(&self, ops: u64) {
        self.lock().power_left = Some(ops);
    }

    /// Whether a planned power cut has happened.
    pub fn power_is_cut(&self) -> bool {
        self.lock().power_left == Some(0)
    }

    /// Takes one unit of power; false once it has run out.
    fn spend_power(state: &mut State) -> bool {
        match &mut state.power_left {
            None => true,
            Some(0) => false,
            Some(n) => {
                *n -= 1;
                true
            }
        }
    }
}

fn power_cut(op: DeviceOp, offset: u64, len: usize) -> DeviceError {
    DeviceError::Io {
        op,
        offset,
        len: len as u64,
        source: std::io::Error::other("power cut (crash simulation)"),
    }
}

impl Device for CrashDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), DeviceError> {
        let state = self.lock();
        check_range(
            DeviceOp::Read,
            offset,
            buf.len(),
            state.current.len() as u64,
        )?;
        let start = offset as usize;
        buf.copy_from_slice(&state.current[start..start + buf.len()]);
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), DeviceError> {
        let mut state = self.lock();
        check_range(
            DeviceOp::Write,
            offset,
            buf.len(),
            state.current.len() as u64,
        )?;
        if !CrashDevice::spend_power(&mut state) {
            return Err(power_cut(DeviceOp::Write, offset, buf.len()));
        }
        state.stats.writes += 1;
        state.stats.bytes_written += buf.len() as u64;
        if buf.is_empty() {
            return Ok(());
        }
        let start = offset as usize;
        state.current[start..start + buf.len()].copy_from_slice(buf);
        state.pending.push(PendingWrite {
            offset,
            bytes: buf.to_vec(),
        });
        Ok(())
    }

    /// Zeroes the range now; like a write, a crash before the next flush
    /// may keep it, drop it or keep part of it (a discarded range reads as
    /// zeros or as before). With `set_discard_keeps_old`, changes nothing.
    fn discard(&self, offset: u64, len: u64) -> Result<bool, DeviceError> {
        let mut state = self.lock();
        check_range(
            DeviceOp::Discard,
            offset,
            len as usize,
            state.current.len() as u64,
        )?;
        if !CrashDevice::spend_power(&mut state) {
            return Err(power_cut(DeviceOp::Discard, offset, len as usize));
        }
        state.stats.discards += 1;
        if len == 0
            || self
                .discard_keeps_old
                .load(std::sync::atomic::Ordering::Relaxed)
        {
            return Ok(true);
        }
        let start = offset as usize;
        state.current[start..start + len as usize].fill(0);
        state.pending.push(PendingWrite {
            offset,
            bytes: vec![0; len as usize],
        });
        Ok(true)
    }

    fn flush(&self) -> Result<(), DeviceError> {
        let mut state = self.lock();
        if !CrashDevice::spend_power(&mut state) {
            return Err(power_cut(DeviceOp::Flush, 0, 0));
        }
        CrashDevice::make_durable(&mut state);
        state.stats.flushes += 1;
        Ok(())
    }

    fn size_bytes(&self) -> u64 {
        self.lock().current.len() as u64
    }

    /// As an image file's `set_len` then `fsync`: one step the power may
    /// cut before it, durable with every earlier write once it returns
    /// (counted as a flush). Grown bytes read as zeros.
    fn resize(&self, bytes: u64) -> Result<bool, DeviceError> {
        let mut state = self.lock();
        if !CrashDevice::spend_power(&mut state) {
            return Err(power_cut(DeviceOp::Flush, bytes, 0));
        }
        CrashDevice::make_durable(&mut state);
        state.stats.flushes += 1;
        state.durable.resize(bytes as usize, 0);
        state.current.resize(bytes as usize, 0);
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: usize = SECTOR_BYTES as usize;

    fn opts(keep: f64, tear: f64) -> CrashOptions {
        CrashOptions {
            keep_probability: keep,
            tear_probability: tear,
        }
    }

    #[test]
    fn a_power_cut_freezes_the_disk() {
        let dev = CrashDevice::new(4096);
        dev.cut_power_after(3);
        dev.write_at(&[1u8; 10], 0).unwrap();
        dev.flush().unwrap();
        assert!(!dev.power_is_cut());
        dev.write_at(&[2u8; 10], 100).unwrap();
        assert!(dev.power_is_cut());
        assert!(dev.write_at(&[3u8; 10], 200).is_err());
        assert!(dev.flush().is_err());
        assert_eq!(dev.pending_writes(), 1);
        let img = dev.crash_image(1, &opts(1.0, 0.0));
        assert_eq!(img[0], 1);
        assert_eq!(img[100], 2);
        assert_eq!(img[200], 0);
    }

    #[test]
    fn reads_see_unflushed_writes() {
        let dev = CrashDevice::new(8192);
        dev.write_at(b"abc", 10).unwrap();
        dev.write_at(b"XY", 11).unwrap();
        let mut buf = [0u8; 4];
        dev.read_at(&mut buf, 10).unwrap();
        assert_eq!(&buf, b"aXY\0");
        assert_eq!(dev.pending_writes(), 2);
        assert_eq!(dev.durable_image(), vec![0u8; 8192]);
        assert_eq!(&dev.current_image()[10..13], b"aXY");
    }

    #[test]
    fn unflushed_writes_lost_with_keep_zero() {
        let dev = CrashDevice::new(4096);
        dev.write_at(&[1u8; 1000], 100).unwrap();
        dev.write_at(&[2u8; 10], 3000).unwrap();
        for seed in 0..20 {
            assert_eq!(dev.crash_image(seed, &opts(0.0, 0.0)), vec![0u8; 4096]);
        }
    }

    #[test]
    fn all_kept_with_keep_one_and_no_tear() {
        let dev = CrashDevice::new(4096);
        dev.write_at(&[1u8; 1000], 100).unwrap();
        dev.write_at(&[2u8; 10], 500).unwrap(); // overlaps: order matters
        for seed in 0..20 {
            assert_eq!(dev.crash_image(seed, &opts(1.0, 0.0)), dev.current_image());
        }
    }

    #[test]
    fn flushed_writes_always_survive() {
        let dev = CrashDevice::new(4096);
        dev.write_at(&[7u8; 600], 0).unwrap();
        dev.flush().unwrap();
        assert_eq!(dev.pending_writes(), 0);
        assert_eq!(dev.durable_image(), dev.current_image());
        dev.write_at(&[9u8; 100], 2000).unwrap();
        for seed in 0..50 {
            let image = dev.crash_image(seed, &CrashOptions::default());
            assert_eq!(image[..600], [7u8; 600]);
            assert!(image[600..2000].iter().all(|&b| b == 0));
        }
        assert_eq!(&dev.durable_image()[..600], &[7u8; 600]);
        assert_eq!(dev.durable_image()[2000], 0);
    }

    #[test]
    fn torn_writes_differ_in_whole_sectors_only() {
        let dev = CrashDevice::new(64 * S as u64);
        // Not sector aligned: starts mid-sector and ends mid-sector.
        let (off, len) = (S / 2, 20 * S);
        dev.write_at(&vec![0xFFu8; len], off as u64).unwrap();
        let mut saw_mixed = false;
        for seed in 0..50 {
            let image = dev.crash_image(seed, &opts(1.0, 1.0));
            // Each piece cut by the 512-byte grid is entirely old or new.
            let mut pos = off;
            let (mut old, mut new) = (0, 0);
            while pos < off + len {
                let next = ((pos / S + 1) * S).min(off + len);
                let piece = &image[pos..next];
                if piece.iter().all(|&b| b == 0xFF) {
                    new += 1;
                } else {
                    assert!(
                        piece.iter().all(|&b| b == 0),
                        "seed {seed}: sector at {pos} torn inside"
                    );
                    old += 1;
                }
                pos = next;
            }
            assert!(image[..off].iter().all(|&b| b == 0));
            assert!(image[off + len..].iter().all(|&b| b == 0));
            saw_mixed |= old > 0 && new > 0;
        }
        assert!(saw_mixed, "tear_probability 1 never produced a torn image");
    }

    #[test]
    fn same_seed_same_image_and_seeds_differ() {
        let dev = CrashDevice::new(64 * S as u64);
        for i in 0..30u64 {
            dev.write_at(&vec![i as u8 + 1; 3 * S], i * S as u64)
                .unwrap();
        }
        let o = CrashOptions::default();
        let a = dev.crash_image(42, &o);
        assert_eq!(a, dev.crash_image(42, &o));
        let distinct: std::collections::HashSet<Vec<u8>> =
            (0..10).map(|seed| dev.crash_image(seed, &o)).collect();
        assert!(distinct.len() > 1, "seeds do not change the crash image");
    }

    #[test]
    fn crash_image_is_replayable_forever() {
        // Pins the ChaCha8 stream: if this changes, old failing seeds no longer
        // reproduce.
        let dev = CrashDevice::new(8 * S as u64);
        for i in 0..8u64 {
            dev.write_at(&[i as u8 + 1; S], i * S as u64).unwrap();
        }
        let image = dev.crash_image(7, &CrashOptions::default());
        let sectors: Vec<u8> = image.chunks(S).map(|s| s[0]).collect();
        let again = CrashDevice::new(8 * S as u64);
        for i in 0..8u64 {
            again.write_at(&[i as u8 + 1; S], i * S as u64).unwrap();
        }
        assert_eq!(again.crash_image(7, &CrashOptions::default()), image);
        assert_eq!(sectors, EXPECTED_SEED_7);
    }

    /// Recorded from `crash_image_is_replayable_forever`.
    const EXPECTED_SEED_7: [u8; 8] = [0, 2, 0, 4, 5, 0, 0, 8];

    #[test]
    fn from_image_is_durable_and_stats_count() {
        let dev = CrashDevice::from_image(vec![3u8; 2048]);
        assert_eq!(dev.size_bytes(), 2048);
        assert_eq!(dev.crash_image(1, &opts(0.0, 0.0)), vec![3u8; 2048]);
        dev.write_at(&[1u8; 100], 0).unwrap();
        dev.write_at(&[], 0).unwrap();
        dev.flush().unwrap();
        assert_eq!(
            dev.stats(),
            CrashStats {
                writes: 2,
                bytes_written: 100,
                flushes: 1,
                discards: 0
            }
        );
    }

    #[test]
    fn a_discard_zeroes_or_keeps_the_old_bytes() {
        let dev = CrashDevice::new(8192);
        dev.write_at(&[7u8; 8192], 0).unwrap();
        dev.flush().unwrap();
        assert!(dev.discard(0, 4096).unwrap());
        dev.flush().unwrap();
        let mut b = [1u8; 4096];
        dev.read_at(&mut b, 0).unwrap();
        assert_eq!(b, [0; 4096]);
        dev.set_discard_keeps_old(true);
        assert!(dev.discard(4096, 4096).unwrap());
        dev.flush().unwrap();
        dev.read_at(&mut b, 4096).unwrap();
        assert_eq!(b, [7; 4096]);
        assert_eq!(dev.crash_image(1, &opts(1.0, 0.0))[4096..], [7; 4096]);
        assert_eq!(dev.stats().discards, 2);
    }

    #[test]
    fn out_of_range_and_bad_probabilities_do_not_panic() {
        let dev = CrashDevice::new(1024);
        assert!(matches!(
            dev.write_at(&[1u8; 2], 1023),
            Err(DeviceError::OutOfRange { .. })
        ));
        assert!(matches!(
            dev.read_at(&mut [0u8; 1], u64::MAX),
            Err(DeviceError::OutOfRange { .. })
        ));
        assert_eq!(dev.pending_writes(), 0);
        dev.write_at(&[1u8; 10], 0).unwrap();
        for p in [f64::NAN, -1.0, 2.0, f64::INFINITY] {
            let _ = dev.crash_image(0, &opts(p, p));
        }
        assert_eq!(dev.crash_image(0, &opts(2.0, -1.0)), dev.current_image());
    }
}
