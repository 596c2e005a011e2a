//! The simulated disk: a [`Device`] whose contents live in memory and whose
//! every request advances a simulated clock by the time the drive would take.
//!
//! Mechanics (per request): the host's own time (`host_overhead_us`, the
//! "other" of Figure 10), the drive's SCSI command overhead, then for each
//! track the request touches: a seek (the curve of [`DiskParams::seek`]) or a
//! head switch, the rotational wait until the first sector arrives under the
//! head, and the transfer at one sector time per sector. Consecutive tracks
//! are skewed by the head-switch time (and cylinders by a one-cylinder seek),
//! so a long transfer crosses track boundaries without losing a turn.
//!
//! The platter turns continuously: the angle under the head is the clock
//! modulo one revolution, so time the host spends between requests (or
//! [`SimDisk::idle`]) changes where the head is — which is what makes a
//! back-to-back stream of small writes miss a turn on a regular disk.
//!
//! Reads go through the drive's track buffer ([`super::buffer`]): after a
//! read the drive reads ahead while no other request arrives, and a read
//! the buffer holds costs the bus transfer instead of the mechanics. The
//! policy is [`DiskParams::read_ahead`] ([`SimDisk::set_read_ahead`]: the
//! VLD reads whole tracks).
//!
//! Writes go to the surface before they return (no write cache): a write
//! that returned is durable, and `flush` costs nothing. A [`PowerCut`] stops
//! the drive at a chosen write, which it tears at sector granularity; every
//! request after it fails. Nothing here sleeps.

use std::sync::Mutex;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::buffer::{ReadAhead, TrackBuffer};
use super::params::{DiskParams, SECTOR_BYTES_SIM};
use crate::device::{check_range, Device, DeviceError, DeviceOp};

/// Where the time of one request (or a sum of them) went, in µs.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Breakdown {
    /// Host processing per request (Figure 10's "other").
    pub host_us: f64,
    /// The drive's command processing.
    pub scsi_us: f64,
    pub seek_us: f64,
    pub head_switch_us: f64,
    pub rotation_us: f64,
    /// Moving the bits to or from the media.
    pub transfer_us: f64,
    /// Moving sectors the track buffer held over the SCSI bus (a read it
    /// served; a media read's bus transfer overlaps the media's and is not
    /// counted).
    pub bus_us: f64,
}

impl Breakdown {
    /// Figure 10's "locate sectors": seek, head switch and rotation.
    pub fn locate_us(&self) -> f64 {
        self.seek_us + self.head_switch_us + self.rotation_us
    }

    pub fn total_us(&self) -> f64 {
        self.host_us + self.scsi_us + self.locate_us() + self.transfer_us + self.bus_us
    }

    pub fn add(&mut self, o: &Breakdown) {
        self.host_us += o.host_us;
        self.scsi_us += o.scsi_us;
        self.seek_us += o.seek_us;
        self.head_switch_us += o.head_switch_us;
        self.rotation_us += o.rotation_us;
        self.transfer_us += o.transfer_us;
        self.bus_us += o.bus_us;
    }

    /// Every part divided by `k` (a sum made a mean).
    pub fn scaled(&self, k: f64) -> Breakdown {
        Breakdown {
            host_us: self.host_us / k,
            scsi_us: self.scsi_us / k,
            seek_us: self.seek_us / k,
            head_switch_us: self.head_switch_us / k,
            rotation_us: self.rotation_us / k,
            transfer_us: self.transfer_us / k,
            bus_us: self.bus_us / k,
        }
    }
}

/// Counters and the summed breakdown since creation or the last reset.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SimStats {
    pub requests: u64,
    pub reads: u64,
    pub writes: u64,
    pub flushes: u64,
    /// Sectors read and written by requests (and by a layer inside the
    /// drive that accesses the media directly, such as the VLD), whether
    /// the media or the track buffer supplied them.
    pub sectors_read: u64,
    pub sectors_written: u64,
    /// Reads the track buffer served whole, and the sectors it supplied
    /// (to those and to reads it served in part).
    pub buffer_hits: u64,
    pub buffer_sectors: u64,
    pub time: Breakdown,
    /// The media part of `time` (seek, switch, rotation, transfer; for a
    /// read the buffer served, the bus) spent reading, and writing: a VLD's
    /// read-modify-write reads count as reads although they serve a write
    /// request.
    pub media_read_time: Breakdown,
    pub media_write_time: Breakdown,
}

/// One media access of a traced request (see [`SimDisk::start_trace`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TracedAccess {
    pub write: bool,
    pub lba: u64,
    pub sectors: u64,
    /// Of a read: the sectors the track buffer supplied (all of them: a
    /// buffer hit, its time the bus's).
    pub buffered: u64,
    /// Its mechanics: seek, head switch, rotation, transfer (or bus).
    pub time: Breakdown,
}

/// One host request as the trace records it: its per-command time (host
/// and SCSI overhead) and every media access the drive made for it (one
/// for a plain request; a VLD adds its map writes and any
/// read-modify-write read). Media accesses outside a request (the VLD's
/// compactor in idle time) form entries with no `op`.
#[derive(Clone, Debug, PartialEq)]
pub struct TracedRequest {
    pub op: Option<DeviceOp>,
    pub overhead: Breakdown,
    pub accesses: Vec<TracedAccess>,
}

impl TracedRequest {
    /// The request's whole time.
    pub fn time(&self) -> Breakdown {
        let mut t = self.overhead;
        for a in &self.accesses {
            t.add(&a.time);
        }
        t
    }
}

/// Requests a trace keeps; later ones are counted in `SimStats` only.
pub const TRACE_LIMIT: usize = 1 << 16;

/// Cut the power at write number `at_write` (0-based, counting media writes):
/// that write puts a seeded prefix of its sectors on the media (possibly
/// none) and fails, and so does every request after it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PowerCut {
    pub at_write: u64,
    pub seed: u64,
}

/// A head position: cylinder, head (track within the cylinder).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HeadPos {
    pub cylinder: u32,
    pub head: u32,
}

/// A sector address split into cylinder, head and sector within the track.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chs {
    pub cylinder: u32,
    pub head: u32,
    pub sector: u32,
}

struct State {
    bytes: Vec<u8>,
    clock_us: f64,
    pos: HeadPos,
    stats: SimStats,
    last: Breakdown,
    cut: Option<PowerCut>,
    media_writes: u64,
    dead: bool,
    /// Requests traced since [`SimDisk::start_trace`], if tracing.
    trace: Option<Vec<TracedRequest>>,
    /// Whether the trace's last entry takes the next media access (its
    /// request is the current one).
    trace_open: bool,
    buffer: TrackBuffer,
}

pub struct SimDisk {
    params: DiskParams,
    host_overhead_us: f64,
    state: Mutex<State>,
}

/// Tolerance (in sectors) below which a rotational wait is taken as none: the
/// clock is a float, and a transfer that ends exactly where the next begins
/// must not cost a full turn.
const ANGLE_EPS: f64 = 1e-6;

impl SimDisk {
    /// A zeroed disk with the head at cylinder 0, head 0, time 0.
    pub fn new(params: DiskParams, host_overhead_us: f64) -> SimDisk {
        let size = params.size_bytes() as usize;
        SimDisk::with_image(params, host_overhead_us, vec![0; size])
    }

    /// A disk holding `bytes` (a crash image), time 0.
    pub fn with_image(params: DiskParams, host_overhead_us: f64, bytes: Vec<u8>) -> SimDisk {
        assert_eq!(bytes.len() as u64, params.size_bytes(), "image size");
        assert!(params.sectors_per_track > 0 && params.tracks_per_cylinder > 0);
        let buffer = TrackBuffer::new(params.read_ahead, params.buffer_sectors());
        SimDisk {
            params,
            host_overhead_us,
            state: Mutex::new(State {
                bytes,
                clock_us: 0.0,
                pos: HeadPos::default(),
                stats: SimStats::default(),
                last: Breakdown::default(),
                cut: None,
                media_writes: 0,
                dead: false,
                trace: None,
                trace_open: false,
                buffer,
            }),
        }
    }

    pub fn params(&self) -> &DiskParams {
        &self.params
    }

    pub fn host_overhead_us(&self) -> f64 {
        self.host_overhead_us
    }

    /// The simulated time, µs since creation.
    pub fn now_us(&self) -> f64 {
        self.state.lock().unwrap().clock_us
    }

    /// Let `us` pass with nothing to do (the platter keeps turning).
    pub fn idle(&self, us: f64) {
        assert!(us >= 0.0);
        let mut s = self.state.lock().unwrap();
        s.clock_us += us;
        s.trace_open = false;
    }

    /// Record every request from now on (at most [`TRACE_LIMIT`]), dropping
    /// any earlier trace.
    pub fn start_trace(&self) {
        self.state.lock().unwrap().trace = Some(Vec::new());
    }

    /// The requests recorded since [`SimDisk::start_trace`]; tracing stops.
    pub fn take_trace(&self) -> Vec<TracedRequest> {
        self.state.lock().unwrap().trace.take().unwrap_or_default()
    }

    /// Where the head is now (a read-ahead running since the last request
    /// may have moved it on).
    pub fn head(&self) -> HeadPos {
        let mut s = self.state.lock().unwrap();
        self.catch_up(&mut s);
        s.pos
    }

    /// The read-ahead policy in force.
    pub fn read_ahead(&self) -> ReadAhead {
        self.state.lock().unwrap().buffer.policy()
    }

    /// Change the read-ahead policy (the VLD selects
    /// [`ReadAhead::WholeTrack`]); the buffer starts empty.
    pub fn set_read_ahead(&self, policy: ReadAhead) {
        self.state.lock().unwrap().buffer.set_policy(policy);
    }

    /// Runs the read-ahead up to the clock.
    fn catch_up(&self, s: &mut State) {
        let st = &mut *s;
        st.buffer.catch_up(self, &mut st.pos, st.clock_us);
    }

    pub fn stats(&self) -> SimStats {
        self.state.lock().unwrap().stats
    }

    /// The breakdown of the last request (everything since the last
    /// [`SimDisk::begin_request`]).
    pub fn last(&self) -> Breakdown {
        self.state.lock().unwrap().last
    }

    pub fn reset_stats(&self) {
        self.state.lock().unwrap().stats = SimStats::default();
    }

    pub fn set_power_cut(&self, cut: Option<PowerCut>) {
        let mut s = self.state.lock().unwrap();
        s.cut = cut;
        s.media_writes = 0;
    }

    pub fn powered_off(&self) -> bool {
        self.state.lock().unwrap().dead
    }

    /// A copy of the media.
    pub fn image(&self) -> Vec<u8> {
        self.state.lock().unwrap().bytes.clone()
    }

    /// Split a sector number.
    pub fn chs(&self, lba: u64) -> Chs {
        let n = u64::from(self.params.sectors_per_track);
        let t = u64::from(self.params.tracks_per_cylinder);
        let track = lba / n;
        Chs {
            cylinder: (track / t) as u32,
            head: (track % t) as u32,
            sector: (lba % n) as u32,
        }
    }

    /// The rotational slot (0..n) at which `sector` of track (cyl, head)
    /// passes under the head: sector plus the track's skew.
    pub fn slot(&self, cylinder: u32, head: u32, sector: u32) -> u32 {
        let p = &self.params;
        let n = u64::from(p.sectors_per_track);
        let ts = u64::from(p.track_skew_sectors());
        let cs = u64::from(p.cylinder_skew_sectors());
        let per_cyl = u64::from(p.tracks_per_cylinder - 1) * ts + cs;
        let skew = u64::from(cylinder) * per_cyl + u64::from(head) * ts;
        ((u64::from(sector) + skew) % n) as u32
    }

    /// The sector of track (cyl, head) at rotational slot `slot`.
    pub fn sector_at_slot(&self, cylinder: u32, head: u32, slot: u32) -> u32 {
        let n = self.params.sectors_per_track;
        let zero = self.slot(cylinder, head, 0);
        (slot + n - zero) % n
    }

    /// The angle under the head at time `t_us`, in sectors (0..n, fractional).
    pub fn angle_at(&self, t_us: f64) -> f64 {
        let n = f64::from(self.params.sectors_per_track);
        (t_us / self.params.sector_us()).rem_euclid(n)
    }

    /// The arm's time from `from` to track (cyl, head): seek, or head switch.
    pub fn move_us(&self, from: HeadPos, cylinder: u32, head: u32) -> (f64, f64) {
        if cylinder != from.cylinder {
            (
                self.params.seek.seek_us(cylinder.abs_diff(from.cylinder)),
                0.0,
            )
        } else if head != from.head {
            (0.0, self.params.head_switch_us)
        } else {
            (0.0, 0.0)
        }
    }

    /// Sectors to wait from angle `angle` until slot `slot` arrives.
    pub fn wait_sectors(&self, angle: f64, slot: u32) -> f64 {
        let n = f64::from(self.params.sectors_per_track);
        let mut d = f64::from(slot) - angle;
        if d < -ANGLE_EPS {
            d += n;
        }
        d.max(0.0)
    }

    /// Time from now until the head could start transferring `lba` (arm
    /// movement plus rotation), without moving anything; the quantity eager
    /// writing minimises.
    pub fn locate_us(&self, lba: u64) -> f64 {
        let mut s = self.state.lock().unwrap();
        self.catch_up(&mut s);
        self.locate_from(s.pos, s.clock_us, lba)
    }

    /// [`SimDisk::locate_us`] from a given state.
    pub fn locate_from(&self, pos: HeadPos, clock_us: f64, lba: u64) -> f64 {
        let c = self.chs(lba);
        let (seek, switch) = self.move_us(pos, c.cylinder, c.head);
        let arrive = clock_us + seek + switch;
        let wait = self.wait_sectors(
            self.angle_at(arrive),
            self.slot(c.cylinder, c.head, c.sector),
        );
        seek + switch + wait * self.params.sector_us()
    }

    /// Start a host request: charges the host's and the drive's per-command
    /// time and starts a new per-request breakdown. [`Device`] calls do this
    /// themselves; a layer inside the drive (the VLD) calls it once per host
    /// request and then accesses the media with [`SimDisk::media_read`] and
    /// [`SimDisk::media_write`].
    pub fn begin_request(&self, op: DeviceOp) -> Result<(), DeviceError> {
        let mut s = self.state.lock().unwrap();
        if s.dead {
            return Err(power_error(op, 0, 0));
        }
        let b = Breakdown {
            host_us: self.host_overhead_us,
            scsi_us: self.params.scsi_overhead_us,
            ..Breakdown::default()
        };
        s.clock_us += b.host_us + b.scsi_us;
        s.last = b;
        s.trace_open = false;
        if let Some(t) = s.trace.as_mut() {
            if t.len() < TRACE_LIMIT {
                t.push(TracedRequest {
                    op: Some(op),
                    overhead: b,
                    accesses: Vec::new(),
                });
                s.trace_open = true;
            }
        }
        s.stats.requests += 1;
        s.stats.time.add(&b);
        match op {
            DeviceOp::Read => s.stats.reads += 1,
            DeviceOp::Write => s.stats.writes += 1,
            DeviceOp::Flush => s.stats.flushes += 1,
            DeviceOp::Open | DeviceOp::Discard => {}
        }
        Ok(())
    }

    /// Read whole sectors at `lba` into `buf` (a multiple of 512 bytes),
    /// charging only the mechanics, or the bus for what the track buffer
    /// holds.
    pub fn media_read(&self, lba: u64, buf: &mut [u8]) -> Result<(), DeviceError> {
        let mut s = self.state.lock().unwrap();
        let count = self.sector_count(DeviceOp::Read, lba, buf.len())?;
        if s.dead {
            return Err(power_error(DeviceOp::Read, lba, count));
        }
        self.catch_up(&mut s);
        let st = &mut *s;
        let (b, buffered) = match st.buffer.read(self, &mut st.pos, st.clock_us, lba, count) {
            Some(served) => {
                st.clock_us += served.time.total_us();
                (served.time, served.buffered)
            }
            None => {
                let b = self.mechanics(st, lba, count);
                st.buffer.media_read(lba, count, st.clock_us);
                (b, 0)
            }
        };
        s.last.add(&b);
        s.stats.time.add(&b);
        s.stats.media_read_time.add(&b);
        s.stats.buffer_sectors += buffered;
        s.stats.buffer_hits += u64::from(buffered == count);
        Self::trace_access(&mut s, false, lba, count, buffered, b);
        let start = (lba * SECTOR_BYTES_SIM) as usize;
        buf.copy_from_slice(&s.bytes[start..start + buf.len()]);
        s.stats.sectors_read += count;
        Ok(())
    }

    /// Write whole sectors at `lba`, charging only the mechanics. Honours
    /// the power cut.
    pub fn media_write(&self, lba: u64, buf: &[u8]) -> Result<(), DeviceError> {
        let mut s = self.state.lock().unwrap();
        let count = self.sector_count(DeviceOp::Write, lba, buf.len())?;
        if s.dead {
            return Err(power_error(DeviceOp::Write, lba, count));
        }
        self.catch_up(&mut s);
        let now = s.clock_us;
        s.buffer.write(lba, count, now);
        let n = s.media_writes;
        s.media_writes += 1;
        let start = (lba * SECTOR_BYTES_SIM) as usize;
        if let Some(cut) = s.cut {
            if n == cut.at_write {
                let mut rng = ChaCha8Rng::seed_from_u64(cut.seed ^ n.wrapping_mul(0x9e37_79b9));
                let kept = rng.gen_range(0..count) as usize * SECTOR_BYTES_SIM as usize;
                s.bytes[start..start + kept].copy_from_slice(&buf[..kept]);
                s.dead = true;
                return Err(power_error(DeviceOp::Write, lba, count));
            }
        }
        let b = self.mechanics(&mut s, lba, count);
        s.last.add(&b);
        s.stats.time.add(&b);
        s.stats.media_write_time.add(&b);
        Self::trace_access(&mut s, true, lba, count, 0, b);
        s.bytes[start..start + buf.len()].copy_from_slice(buf);
        s.stats.sectors_written += count;
        Ok(())
    }

    fn sector_count(&self, op: DeviceOp, lba: u64, len: usize) -> Result<u64, DeviceError> {
        assert!(
            (len as u64).is_multiple_of(SECTOR_BYTES_SIM) && len > 0,
            "whole sectors"
        );
        check_range(op, lba * SECTOR_BYTES_SIM, len, self.params.size_bytes())?;
        Ok(len as u64 / SECTOR_BYTES_SIM)
    }

    /// Move the arm and wait for and transfer `count` sectors from `lba`,
    /// advancing the clock, track by track; returns the time.
    fn mechanics(&self, s: &mut State, mut lba: u64, mut count: u64) -> Breakdown {
        let n = u64::from(self.params.sectors_per_track);
        let mut total = Breakdown::default();
        let sector_us = self.params.sector_us();
        while count > 0 {
            let c = self.chs(lba);
            let (seek, switch) = self.move_us(s.pos, c.cylinder, c.head);
            s.clock_us += seek + switch;
            let wait = self.wait_sectors(
                self.angle_at(s.clock_us),
                self.slot(c.cylinder, c.head, c.sector),
            ) * sector_us;
            let run = count.min(n - u64::from(c.sector));
            let transfer = run as f64 * sector_us;
            s.clock_us += wait + transfer;
            s.pos = HeadPos {
                cylinder: c.cylinder,
                head: c.head,
            };
            let b = Breakdown {
                seek_us: seek,
                head_switch_us: switch,
                rotation_us: wait,
                transfer_us: transfer,
                ..Breakdown::default()
            };
            total.add(&b);
            lba += run;
            count -= run;
        }
        total
    }

    /// Adds a media access to the current traced request (or, outside any
    /// request, to an entry without an op).
    fn trace_access(
        s: &mut State,
        write: bool,
        lba: u64,
        sectors: u64,
        buffered: u64,
        time: Breakdown,
    ) {
        let Some(t) = s.trace.as_mut() else {
            return;
        };
        if !s.trace_open {
            if t.len() >= TRACE_LIMIT {
                return;
            }
            t.push(TracedRequest {
                op: None,
                overhead: Breakdown::default(),
                accesses: Vec::new(),
            });
            s.trace_open = true;
        }
        let access = TracedAccess {
            write,
            lba,
            sectors,
            buffered,
            time,
        };
        t.last_mut().expect("an entry").accesses.push(access);
    }

    /// Byte range to whole sectors: (first lba, sector count).
    fn span(offset: u64, len: usize) -> (u64, u64) {
        let first = offset / SECTOR_BYTES_SIM;
        let end = (offset + len as u64).div_ceil(SECTOR_BYTES_SIM);
        (first, end - first)
    }
}

fn power_error(op: DeviceOp, lba: u64, count: u64) -> DeviceError {
    DeviceError::Io {
        op,
        offset: lba * SECTOR_BYTES_SIM,
        len: count * SECTOR_BYTES_SIM,
        source: std::io::Error::other("simulated power cut"),
    }
}

impl Device for SimDisk {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), DeviceError> {
        check_range(DeviceOp::Read, offset, buf.len(), self.size_bytes())?;
        if buf.is_empty() {
            return Ok(());
        }
        self.begin_request(DeviceOp::Read)?;
        let (lba, count) = Self::span(offset, buf.len());
        let mut whole = vec![0u8; (count * SECTOR_BYTES_SIM) as usize];
        self.media_read(lba, &mut whole)?;
        let skip = (offset - lba * SECTOR_BYTES_SIM) as usize;
        buf.copy_from_slice(&whole[skip..skip + buf.len()]);
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), DeviceError> {
        check_range(DeviceOp::Write, offset, buf.len(), self.size_bytes())?;
        if buf.is_empty() {
            return Ok(());
        }
        self.begin_request(DeviceOp::Write)?;
        let (lba, count) = Self::span(offset, buf.len());
        let mut whole = vec![0u8; (count * SECTOR_BYTES_SIM) as usize];
        let skip = (offset - lba * SECTOR_BYTES_SIM) as usize;
        if skip != 0 || !buf.len().is_multiple_of(SECTOR_BYTES_SIM as usize) {
            // A partial sector: the drive merges it into what is there
            // (timed as one write; a real drive's host would read first).
            let s = self.state.lock().unwrap();
            let start = (lba * SECTOR_BYTES_SIM) as usize;
            let len = whole.len();
            whole.copy_from_slice(&s.bytes[start..start + len]);
        }
        whole[skip..skip + buf.len()].copy_from_slice(buf);
        self.media_write(lba, &whole)
    }

    /// Writes are on the media when they return: nothing to do.
    fn flush(&self) -> Result<(), DeviceError> {
        let mut s = self.state.lock().unwrap();
        if s.dead {
            return Err(power_error(DeviceOp::Flush, 0, 0));
        }
        s.stats.flushes += 1;
        Ok(())
    }

    fn size_bytes(&self) -> u64 {
        self.params.size_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::super::params::PaperDisk;
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-6
    }

    /// A disk with no per-command overheads, so a request's time is its
    /// mechanics alone.
    fn bare(disk: PaperDisk) -> SimDisk {
        let mut p = DiskParams::paper(disk);
        p.scsi_overhead_us = 0.0;
        SimDisk::new(p, 0.0)
    }

    fn lba(d: &SimDisk, cyl: u32, head: u32, sector: u32) -> u64 {
        let p = d.params();
        (u64::from(cyl) * u64::from(p.tracks_per_cylinder) + u64::from(head))
            * u64::from(p.sectors_per_track)
            + u64::from(sector)
    }

    /// Writes sector 0 of track 0 (the head ends just after it), then `lba`:
    /// returns the second request's breakdown.
    fn second(d: &SimDisk, target: u64) -> Breakdown {
        d.write_at(&[1u8; 512], 0).unwrap();
        d.write_at(&[2u8; 512], target * 512).unwrap();
        d.last()
    }

    #[test]
    fn seek_of_d_cylinders_takes_the_curve() {
        for disk in PaperDisk::ALL {
            for dist in [1u32, 2, 5, 10] {
                let d = bare(disk);
                let target = lba(&d, dist, 0, 0);
                let b = second(&d, target);
                assert!(
                    close(b.seek_us, d.params().seek.seek_us(dist)),
                    "{disk:?} {dist}"
                );
                assert_eq!(b.head_switch_us, 0.0);
                assert!(b.rotation_us < d.params().rotation_us());
            }
            // The published minimum seeks of Table 1.
            let d = bare(disk);
            let b = second(&d, lba(&d, 1, 0, 0));
            let want = match disk {
                PaperDisk::Hp97560 => 3640.0,
                PaperDisk::St19101 => 500.0,
            };
            assert!(close(b.seek_us, want));
        }
    }

    #[test]
    fn a_sector_just_missed_costs_a_full_rotation() {
        for disk in PaperDisk::ALL {
            let d = bare(disk);
            let p = d.params().clone();
            d.write_at(&[1u8; 512], 0).unwrap();
            // The head is now just past sector 0: rewriting it waits a
            // whole turn less the one sector it spent writing.
            d.write_at(&[1u8; 512], 0).unwrap();
            let b = d.last();
            assert!(
                close(b.rotation_us, p.rotation_us() - p.sector_us()),
                "{disk:?}"
            );
            assert!(close(b.transfer_us, p.sector_us()));
            assert!(close(b.total_us(), p.rotation_us()));
            // The next sector is under the head: no wait at all.
            d.write_at(&[1u8; 512], 512).unwrap();
            assert!(close(d.last().rotation_us, 0.0));
        }
    }

    #[test]
    fn head_switch_takes_table_1_time_and_skew_absorbs_it() {
        for disk in PaperDisk::ALL {
            let d = bare(disk);
            let p = d.params().clone();
            let target = lba(&d, 0, 3, 40);
            let b = second(&d, target);
            assert!(close(b.head_switch_us, p.head_switch_us), "{disk:?}");
            assert_eq!(b.seek_us, 0.0);
            // A whole-track transfer runs onto the next track after a
            // head switch and a wait shorter than one sector (the skew).
            let d = bare(disk);
            let n = p.sectors_per_track as usize;
            d.write_at(&vec![0u8; n * 512 * 2], 0).unwrap();
            let b = d.last();
            assert!(close(b.head_switch_us, p.head_switch_us));
            assert!(close(b.transfer_us, 2.0 * p.rotation_us()));
            assert!(b.rotation_us < p.sector_us() + 1e-6, "{disk:?}: {b:?}");
        }
    }

    #[test]
    fn overheads_are_charged_per_request_and_the_clock_adds_up() {
        let p = DiskParams::paper(PaperDisk::Hp97560);
        let d = SimDisk::new(p.clone(), 1000.0);
        d.write_at(&[7u8; 4096], 4096 * 10).unwrap();
        let b = d.last();
        assert!(close(b.scsi_us, 2300.0));
        assert!(close(b.host_us, 1000.0));
        assert!(close(b.transfer_us, 8.0 * p.sector_us()));
        assert!(close(d.now_us(), b.total_us()));
        let mut buf = [0u8; 4096];
        d.read_at(&mut buf, 4096 * 10).unwrap();
        assert_eq!(buf, [7u8; 4096]);
        let st = d.stats();
        assert_eq!((st.requests, st.reads, st.writes), (2, 1, 1));
        assert!(close(st.time.total_us(), d.now_us()));
        // Idle time turns the platter: a read right after idling a whole
        // turn finds the head at the same angle as before.
        let before = d.now_us();
        d.idle(p.rotation_us());
        assert!(close(d.now_us() - before, p.rotation_us()));
    }

    #[test]
    fn the_trace_records_each_request_and_its_media_accesses() {
        let p = DiskParams::paper(PaperDisk::St19101);
        let d = SimDisk::new(p.clone(), 500.0);
        d.write_at(&[1u8; 512], 0).unwrap();
        d.start_trace();
        let t0 = d.now_us();
        d.write_at(&[2u8; 4096], 4096 * 3).unwrap();
        // A layer inside the drive: one request, two media accesses.
        d.begin_request(DeviceOp::Write).unwrap();
        d.media_write(100, &[3u8; 4096]).unwrap();
        d.media_write(108, &[4u8; 512]).unwrap();
        // Idle work (a compactor): an entry of its own, without an op.
        d.idle(1000.0);
        let mut buf = [0u8; 512];
        d.media_read(0, &mut buf).unwrap();
        let t1 = d.now_us();
        let t = d.take_trace();
        assert_eq!(t.len(), 3);
        assert_eq!(t[0].op, Some(DeviceOp::Write));
        assert!(close(t[0].overhead.host_us, 500.0));
        assert!(close(t[0].overhead.scsi_us, p.scsi_overhead_us));
        assert_eq!(t[0].accesses.len(), 1);
        assert_eq!((t[0].accesses[0].lba, t[0].accesses[0].sectors), (24, 8));
        assert!(t[0].accesses[0].write);
        let sizes: Vec<(u64, u64)> = t[1].accesses.iter().map(|a| (a.lba, a.sectors)).collect();
        assert_eq!(sizes, [(100, 8), (108, 1)]);
        assert_eq!(t[2].op, None);
        assert_eq!(t[2].overhead, Breakdown::default());
        assert!(!t[2].accesses[0].write);
        // The trace accounts for every µs the clock moved but the idle time.
        let traced: f64 = t.iter().map(|r| r.time().total_us()).sum();
        assert!(close(traced + 1000.0, t1 - t0), "{traced} {t0} {t1}");
        // Tracing stopped with the take.
        d.write_at(&[5u8; 512], 0).unwrap();
        assert!(d.take_trace().is_empty());
    }

    #[test]
    fn unaligned_writes_merge_into_sectors() {
        let d = bare(PaperDisk::St19101);
        d.write_at(&[9u8; 512], 0).unwrap();
        d.write_at(b"abc", 100).unwrap();
        let mut buf = [0u8; 512];
        d.read_at(&mut buf, 0).unwrap();
        assert_eq!(&buf[100..103], b"abc");
        assert_eq!(buf[99], 9);
        assert_eq!(buf[103], 9);
    }

    #[test]
    fn power_cut_tears_one_write_and_stops_the_drive() {
        for seed in 0..20u64 {
            let d = bare(PaperDisk::St19101);
            d.set_power_cut(Some(PowerCut { at_write: 1, seed }));
            d.write_at(&[1u8; 4096], 0).unwrap();
            assert!(d.write_at(&[2u8; 4096], 4096).is_err());
            assert!(d.write_at(&[3u8; 512], 0).is_err());
            assert!(d.flush().is_err());
            let img = d.image();
            assert!(img[..4096].iter().all(|&b| b == 1));
            // A prefix of the torn write's sectors, never all of them.
            let kept = img[4096..8192].iter().take_while(|&&b| b == 2).count();
            assert_eq!(kept % 512, 0);
            assert!(kept < 4096, "seed {seed}");
            assert!(img[4096 + kept..8192].iter().all(|&b| b == 0));
        }
    }
}
