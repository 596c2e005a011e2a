//! The drive's track buffer and its read-ahead (virtual-log-1999 Section
//! 4.2, "the interaction between eager writing and the disk track buffer
//! read-ahead algorithm").
//!
//! - [`ReadAhead::Sequential`] is the HP 97560's policy as the paper gives
//!   the Dartmouth simulator's: after a read the drive goes on reading the
//!   following sectors, at the media rate (head switches, seeks to the next
//!   cylinder and the skews as the mechanics have them), while no other
//!   request arrives; the buffer holds the sectors from the first of the
//!   current request through the read-ahead point, at most its size (the
//!   read-ahead stops there and resumes when a read frees room), and
//!   discards those below the current request. A read wholly in it costs
//!   the bus transfer only (no seek, no rotation); one that starts in it
//!   takes what it holds and waits for the rest as the read-ahead brings it
//!   (a request arriving before the read-ahead reached its sectors waits for
//!   the media); any other read goes to the media and starts a new buffer.
//! - [`ReadAhead::WholeTrack`] is the paper's fix for the VLD, whose
//!   sequential data need not have increasing physical addresses: as soon
//!   as the head reaches a read's track the drive reads the whole track, in
//!   the order it passes under the head (so a read completes when the last
//!   of its sectors has passed, wherever the head landed), and keeps each
//!   sector until a read delivers it to the host; the buffer holds as many
//!   whole tracks as fit (at least one), the oldest leaving first.
//!
//! Invariants: the buffer holds no bytes — the media image does, and every
//! write drops the buffered sectors it overlaps, so whatever the buffer
//! would deliver equals the media; it decides only where a read's time
//! goes. Only a read starts reading ahead; a write (or a whole-track read
//! elsewhere) stops it, and time between requests ([`super::SimDisk::idle`])
//! is when it runs: until the drive starts on the next request's media
//! access, after that request's command overhead. Everything is a
//! function of the simulated clock: the read-ahead is computed then, from
//! where and when it started, so the same requests give the same times.

use std::collections::VecDeque;

use super::disk::{Breakdown, HeadPos, SimDisk};

/// What the drive reads into its track buffer beyond a read request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadAhead {
    /// No buffer: every read goes to the media.
    Off,
    /// The HP 97560's (module doc): sequentially after each read, keeping
    /// the current request's sectors through the read-ahead point.
    Sequential,
    /// The VLD's (module doc): the whole track of each read, each sector
    /// kept until it is delivered.
    WholeTrack,
}

/// What the buffer did for one read: its time beyond the command overhead
/// and how many of its sectors the buffer supplied.
pub(super) struct Served {
    pub time: Breakdown,
    pub buffered: u64,
}

/// Below this (µs) two simulated times are the same: the clock is a float.
const TIME_EPS_US: f64 = 1e-6;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mechanism {
    /// Reading ahead: sector `next` is read as soon as it passes under the
    /// head from `at_us` on.
    Reading,
    /// The buffer is full: the head stays on the track of `next - 1` and
    /// reading resumes when a read frees room.
    Full,
    /// A write took the head away: the buffer still serves what it holds,
    /// nothing more is read into it.
    Stopped,
}

/// The sequential policy's buffer: sectors `lo..next`.
struct Stream {
    lo: u64,
    next: u64,
    /// While reading: when the head finished sector `next - 1` (or resumed).
    at_us: f64,
    mech: Mechanism,
}

/// One track of the whole-track policy: the head reached it at `t0_us` and
/// left at `end_us` (infinite while it is still there); sector `s` entered
/// the buffer when it first passed whole under the head in between, and
/// left it when delivered or overwritten (`gone[s]`).
struct TrackFill {
    track: u64,
    t0_us: f64,
    end_us: f64,
    gone: Vec<bool>,
}

impl TrackFill {
    /// When sector `s` of the track first passed whole under the head.
    fn first_done(&self, d: &SimDisk, s: u32) -> f64 {
        let (cylinder, head) = track_pos(d, self.track);
        let slot = d.slot(cylinder, head, s);
        let wait = d.wait_sectors(d.angle_at(self.t0_us), slot);
        self.t0_us + (wait + 1.0) * d.params().sector_us()
    }

    /// Whether sector `s` is in the buffer at `t_us`.
    fn has(&self, d: &SimDisk, s: u32, t_us: f64) -> bool {
        !self.gone[s as usize] && self.first_done(d, s) <= t_us.min(self.end_us) + TIME_EPS_US
    }

    fn active(&self) -> bool {
        self.end_us.is_infinite()
    }
}

fn track_pos(d: &SimDisk, track: u64) -> (u32, u32) {
    let t = u64::from(d.params().tracks_per_cylinder);
    ((track / t) as u32, (track % t) as u32)
}

pub(super) struct TrackBuffer {
    policy: ReadAhead,
    capacity_sectors: u64,
    stream: Option<Stream>,
    /// Whole-track policy: oldest first; only the last may be active.
    tracks: VecDeque<TrackFill>,
}

impl TrackBuffer {
    pub(super) fn new(policy: ReadAhead, capacity_sectors: u64) -> TrackBuffer {
        TrackBuffer {
            policy,
            capacity_sectors,
            stream: None,
            tracks: VecDeque::new(),
        }
    }

    pub(super) fn policy(&self) -> ReadAhead {
        self.policy
    }

    /// A new policy, with an empty buffer.
    pub(super) fn set_policy(&mut self, policy: ReadAhead) {
        self.policy = policy;
        self.stream = None;
        self.tracks.clear();
    }

    fn enabled(&self) -> bool {
        self.policy != ReadAhead::Off && self.capacity_sectors > 0
    }

    /// Lets the read-ahead run until `now_us`: what passed whole under the
    /// head by then is in the buffer, and the head is where it took it.
    pub(super) fn catch_up(&mut self, d: &SimDisk, pos: &mut HeadPos, now_us: f64) {
        if !self.enabled() || self.policy != ReadAhead::Sequential {
            return;
        }
        let cap = self.capacity_sectors;
        let Some(st) = self.stream.as_mut() else {
            return;
        };
        if st.mech == Mechanism::Reading {
            let limit = st.lo + cap;
            advance(d, st, pos, now_us, limit, now_us);
            if st.next >= limit.min(d.params().sectors()) {
                st.mech = Mechanism::Full;
            }
        }
    }

    /// A read of `count` sectors at `lba` that the drive starts serving at
    /// `now_us` (read-ahead caught up). `None`: the media serves it the
    /// ordinary way, and the caller then reports it with
    /// [`TrackBuffer::media_read`]. Otherwise the buffer's answer; the
    /// clock is to advance by its time.
    pub(super) fn read(
        &mut self,
        d: &SimDisk,
        pos: &mut HeadPos,
        now_us: f64,
        lba: u64,
        count: u64,
    ) -> Option<Served> {
        if !self.enabled() {
            return None;
        }
        match self.policy {
            ReadAhead::Off => None,
            ReadAhead::Sequential => self.read_sequential(d, pos, now_us, lba, count),
            ReadAhead::WholeTrack => Some(self.read_tracks(d, pos, now_us, lba, count)),
        }
    }

    /// The media served a read of `count` sectors at `lba`, its last
    /// sector passing at `end_us`: the sequential policy's buffer is now
    /// that request, and the drive reads ahead from its end.
    pub(super) fn media_read(&mut self, lba: u64, count: u64, end_us: f64) {
        if !self.enabled() || self.policy != ReadAhead::Sequential {
            return;
        }
        let cap = self.capacity_sectors;
        let next = lba + count;
        let lo = lba.max(next.saturating_sub(cap));
        self.stream = Some(Stream {
            lo,
            next,
            at_us: end_us,
            mech: if next - lo >= cap {
                Mechanism::Full
            } else {
                Mechanism::Reading
            },
        });
    }

    /// A write of `count` sectors at `lba` starts at `now_us` (read-ahead
    /// caught up): the head stops reading ahead and the buffered sectors
    /// it overlaps are dropped.
    pub(super) fn write(&mut self, lba: u64, count: u64, now_us: f64) {
        let end = lba + count;
        if let Some(st) = self.stream.as_mut() {
            st.mech = Mechanism::Stopped;
            if lba < st.next && end > st.lo {
                // Keep the part below the write (else the part above it):
                // the buffer stays one run.
                if lba > st.lo {
                    st.next = lba;
                } else {
                    st.lo = end.min(st.next);
                }
            }
        }
        for f in self.tracks.iter_mut() {
            if f.active() {
                f.end_us = now_us;
            }
            let n = f.gone.len() as u64;
            let (first, last) = (f.track * n, (f.track + 1) * n);
            for x in lba.max(first)..end.min(last) {
                f.gone[(x - first) as usize] = true;
            }
        }
    }

    fn read_sequential(
        &mut self,
        d: &SimDisk,
        pos: &mut HeadPos,
        now_us: f64,
        lba: u64,
        count: u64,
    ) -> Option<Served> {
        let cap = self.capacity_sectors;
        let st = self.stream.as_mut()?;
        let end = lba + count;
        // Below the buffer (discarded), past it, or just past it with the
        // head no longer reading there: the media's.
        if lba < st.lo || lba > st.next || (lba == st.next && st.mech != Mechanism::Reading) {
            return None;
        }
        let buffered = st.next.min(end) - lba;
        // What lies below the current request is discarded.
        st.lo = lba;
        let mut time = Breakdown::default();
        if end <= st.next {
            time.bus_us = count as f64 * d.params().bus_sector_us();
            if st.mech == Mechanism::Full && st.next - st.lo < cap {
                st.mech = Mechanism::Reading;
                st.at_us = now_us;
            }
        } else {
            // The rest comes from the media as the read-ahead reaches it
            // (resuming it, back where it stopped, if it had stopped).
            if st.mech != Mechanism::Reading {
                st.mech = Mechanism::Reading;
                st.at_us = now_us;
            }
            time = advance(d, st, pos, f64::INFINITY, end, now_us);
            assert_eq!(st.next, end, "a read past the disk's end");
            st.lo = lba.max(end.saturating_sub(cap));
            if st.next - st.lo >= cap {
                st.mech = Mechanism::Full;
            }
        }
        Some(Served { time, buffered })
    }

    /// The whole-track policy, track by track of the request.
    fn read_tracks(
        &mut self,
        d: &SimDisk,
        pos: &mut HeadPos,
        now_us: f64,
        lba: u64,
        count: u64,
    ) -> Served {
        let p = d.params();
        let n = u64::from(p.sectors_per_track);
        let su = p.sector_us();
        let max_tracks = (self.capacity_sectors / n).max(1) as usize;
        let mut t = now_us;
        let mut time = Breakdown::default();
        let mut buffered = 0;
        let mut x = lba;
        let end = lba + count;
        while x < end {
            let track = x / n;
            let stop = end.min((track + 1) * n);
            let secs = ((x - track * n) as u32)..((stop - track * n) as u32);
            let k = stop - x;
            let at = self.tracks.iter().position(|f| f.track == track);
            let all_in = at.is_some_and(|i| secs.clone().all(|s| self.tracks[i].has(d, s, t)));
            let i = if all_in {
                let bus = k as f64 * p.bus_sector_us();
                time.bus_us += bus;
                t += bus;
                buffered += k;
                at.expect("found")
            } else if let Some(i) = at.filter(|&i| self.tracks[i].active()) {
                // The head is on this track, filling it: the sectors not
                // in the buffer yet arrive as they pass (again, if one was
                // delivered already).
                let f = &self.tracks[i];
                assert_eq!(track_pos(d, track), (pos.cylinder, pos.head));
                let (cylinder, head) = (pos.cylinder, pos.head);
                let mut done = t;
                let mut missing = 0u64;
                for s in secs.clone() {
                    if f.has(d, s, t) {
                        buffered += 1;
                        continue;
                    }
                    missing += 1;
                    let first = f.first_done(d, s);
                    let c = if first > t + TIME_EPS_US {
                        first
                    } else {
                        let slot = d.slot(cylinder, head, s);
                        t + (d.wait_sectors(d.angle_at(t), slot) + 1.0) * su
                    };
                    done = done.max(c);
                }
                let transfer = (missing as f64 * su).min(done - t);
                time.transfer_us += transfer;
                time.rotation_us += done - t - transfer;
                t = done;
                i
            } else {
                // The head goes there and the whole track streams in from
                // where it lands; the request is done when its last sector
                // has passed.
                if let Some(f) = self.tracks.back_mut().filter(|f| f.active()) {
                    f.end_us = t;
                }
                if let Some(i) = at {
                    self.tracks.remove(i);
                }
                let (cylinder, head) = track_pos(d, track);
                let (seek, switch) = d.move_us(*pos, cylinder, head);
                let arrive = t + seek + switch;
                let fill = TrackFill {
                    track,
                    t0_us: arrive,
                    end_us: f64::INFINITY,
                    gone: vec![false; n as usize],
                };
                let done = secs
                    .clone()
                    .map(|s| fill.first_done(d, s))
                    .fold(arrive, f64::max);
                let transfer = k as f64 * su;
                time.seek_us += seek;
                time.head_switch_us += switch;
                time.transfer_us += transfer;
                time.rotation_us += (done - arrive - transfer).max(0.0);
                *pos = HeadPos { cylinder, head };
                self.tracks.push_back(fill);
                while self.tracks.len() > max_tracks {
                    self.tracks.pop_front();
                }
                t = t.max(done).max(arrive + transfer);
                self.tracks.len() - 1
            };
            // Delivered: it leaves the buffer.
            for s in secs {
                self.tracks[i].gone[s as usize] = true;
            }
            x = stop;
        }
        Served { time, buffered }
    }
}

/// Reads sectors from `st.next` on, in order, each as soon as it passes
/// under the head after `st.at_us` (moving to the next track or cylinder
/// at a track's end), until the next one would not be whole by `until_us`
/// or `st.next` reaches `limit` (or the disk's end). Moves the head along.
/// Returns the time it spent after `from_us`.
fn advance(
    d: &SimDisk,
    st: &mut Stream,
    pos: &mut HeadPos,
    until_us: f64,
    limit: u64,
    from_us: f64,
) -> Breakdown {
    let p = d.params();
    let n = u64::from(p.sectors_per_track);
    let su = p.sector_us();
    let limit = limit.min(p.sectors());
    let clip = |a: f64, z: f64| (z - a.max(from_us)).max(0.0);
    let mut b = Breakdown::default();
    while st.next < limit {
        let c = d.chs(st.next);
        let (seek, switch) = d.move_us(*pos, c.cylinder, c.head);
        let arrive = st.at_us + seek + switch;
        let slot = d.slot(c.cylinder, c.head, c.sector);
        let start = arrive + d.wait_sectors(d.angle_at(arrive), slot) * su;
        if start + su > until_us + TIME_EPS_US {
            break;
        }
        let fit = if until_us.is_finite() {
            (((until_us + TIME_EPS_US - start) / su).floor() as u64).max(1)
        } else {
            u64::MAX
        };
        let m = (n - u64::from(c.sector)).min(limit - st.next).min(fit);
        let done = start + m as f64 * su;
        if seek > 0.0 {
            b.seek_us += clip(st.at_us, arrive);
        } else {
            b.head_switch_us += clip(st.at_us, arrive);
        }
        b.rotation_us += clip(arrive, start);
        b.transfer_us += clip(start, done);
        st.at_us = done;
        st.next += m;
        *pos = HeadPos {
            cylinder: c.cylinder,
            head: c.head,
        };
    }
    b
}

#[cfg(test)]
mod tests {
    use super::super::disk::TracedAccess;
    use super::super::params::{DiskParams, PaperDisk};
    use super::*;
    use crate::device::Device;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-6
    }

    /// A drive with no per-command overhead (a request's time is what the
    /// buffer or the mechanics cost), reading ahead by `policy`.
    fn bare(disk: PaperDisk, policy: ReadAhead) -> SimDisk {
        let mut p = DiskParams::paper(disk);
        p.scsi_overhead_us = 0.0;
        p.read_ahead = policy;
        SimDisk::new(p, 0.0)
    }

    /// Reads `sectors` at `lba`; returns the request's single media access.
    fn read(d: &SimDisk, lba: u64, sectors: u64) -> TracedAccess {
        d.start_trace();
        let mut buf = vec![0u8; sectors as usize * 512];
        d.read_at(&mut buf, lba * 512).unwrap();
        let t = d.take_trace();
        assert_eq!((t.len(), t[0].accesses.len()), (1, 1));
        t[0].accesses[0]
    }

    fn is_hit(a: &TracedAccess, p: &DiskParams) -> bool {
        a.buffered == a.sectors
            && a.time.locate_us() == 0.0
            && a.time.transfer_us == 0.0
            && close(a.time.bus_us, a.sectors as f64 * p.bus_sector_us())
    }

    #[test]
    fn a_sequential_read_after_the_first_request_comes_from_the_buffer_at_bus_speed() {
        for disk in PaperDisk::ALL {
            let p = DiskParams::paper(disk);
            let d = SimDisk::new(p.clone(), 0.0);
            let first = read(&d, 0, 8);
            assert_eq!(first.buffered, 0);
            assert!(close(first.time.transfer_us, 8.0 * p.sector_us()));
            // 40 requests of 4 KB: more than a track on both drives, so
            // the read-ahead crosses head switches; each arrives after the
            // drive had a turn's time to read ahead.
            for i in 1..40u64 {
                d.idle(p.rotation_us());
                let a = read(&d, 8 * i, 8);
                assert!(is_hit(&a, &p), "{disk:?} request {i}: {a:?}");
                // The whole request: the SCSI overhead and the bus.
                let b = d.last();
                assert!(close(b.scsi_us, p.scsi_overhead_us));
                assert!(close(
                    b.total_us(),
                    p.scsi_overhead_us + 8.0 * p.bus_sector_us()
                ));
            }
            let s = d.stats();
            assert_eq!((s.buffer_hits, s.buffer_sectors), (39, 39 * 8));
            assert_eq!(s.sectors_read, 40 * 8);
            // Without a buffer every one of them waits for the media.
            let mut off = p.clone();
            off.read_ahead = ReadAhead::Off;
            let d = SimDisk::new(off, 0.0);
            read(&d, 0, 8);
            d.idle(p.rotation_us());
            let a = read(&d, 8, 8);
            assert!(a.buffered == 0 && a.time.transfer_us > 0.0, "{disk:?}");
        }
    }

    #[test]
    fn a_read_arriving_before_the_read_ahead_reached_its_sectors_waits_for_the_media() {
        let d = bare(PaperDisk::Hp97560, ReadAhead::Sequential);
        let su = d.params().sector_us();
        // Track 0 starts under the head at time 0: sectors 0..8 are read
        // by 8 sector times, the read-ahead has sectors 8..20 whole at
        // 20.5.
        read(&d, 0, 8);
        assert!(close(d.now_us(), 8.0 * su));
        d.idle(12.5 * su);
        // Sectors 16..32: four from the buffer, twelve as the read-ahead
        // reaches them (the one under the head half read already).
        let a = read(&d, 16, 16);
        assert_eq!(a.buffered, 4);
        assert!(close(a.time.transfer_us, 11.5 * su), "{a:?}");
        assert!(close(a.time.total_us(), 11.5 * su));
        assert!(close(d.now_us(), 32.0 * su));
        // Right after it, the next sectors are just being read: no turn
        // is lost.
        let a = read(&d, 32, 8);
        assert!(a.buffered == 0 && close(a.time.total_us(), 8.0 * su));
        // Sectors the read-ahead has not reached, not following the
        // buffer: a media read, waiting for them to come round.
        let a = read(&d, 60, 4);
        assert_eq!(a.buffered, 0);
        assert!(close(a.time.rotation_us, 20.0 * su), "{a:?}");
    }

    #[test]
    fn a_write_drops_the_buffered_sectors_it_overlaps() {
        let d = bare(PaperDisk::Hp97560, ReadAhead::Sequential);
        let p = d.params().clone();
        read(&d, 0, 8);
        d.idle(p.rotation_us());
        d.write_at(&[9u8; 4096], 24 * 512).unwrap();
        // Below the write: still buffered. The written sectors (and the
        // rest above them) come from the media, with what was written.
        assert!(is_hit(&read(&d, 8, 8), &p));
        assert!(is_hit(&read(&d, 16, 8), &p));
        let a = read(&d, 24, 8);
        assert!(a.buffered == 0 && close(a.time.transfer_us, 8.0 * p.sector_us()));
        let mut got = [0u8; 4096];
        d.read_at(&mut got, 24 * 512).unwrap();
        assert_eq!(got, [9u8; 4096]);
        // A write over the low end of the buffer keeps what is above it.
        let d = bare(PaperDisk::Hp97560, ReadAhead::Sequential);
        read(&d, 0, 8);
        d.idle(p.rotation_us());
        d.write_at(&[7u8; 512], 0).unwrap();
        assert!(is_hit(&read(&d, 8, 8), &p));
        // The whole-track buffer too.
        let d = bare(PaperDisk::Hp97560, ReadAhead::WholeTrack);
        read(&d, 0, 8);
        d.idle(p.rotation_us());
        d.write_at(&[5u8; 4096], 40 * 512).unwrap();
        assert!(is_hit(&read(&d, 32, 8), &p));
        assert_eq!(read(&d, 40, 8).buffered, 0);
    }

    #[test]
    fn the_buffer_discards_what_lies_below_the_current_request() {
        let d = bare(PaperDisk::Hp97560, ReadAhead::Sequential);
        let p = d.params().clone();
        read(&d, 0, 8);
        d.idle(p.rotation_us());
        assert!(is_hit(&read(&d, 32, 8), &p));
        // Sectors 8..16 were read ahead, but lie below the last request.
        let a = read(&d, 8, 8);
        assert_eq!(a.buffered, 0);
        assert!(a.time.transfer_us > 0.0 && a.time.rotation_us > 0.0);
    }

    #[test]
    fn the_read_ahead_fills_the_buffer_moving_the_head_and_stops_there() {
        let d = bare(PaperDisk::Hp97560, ReadAhead::Sequential);
        let p = d.params().clone();
        read(&d, 0, 8);
        d.idle(10.0 * p.rotation_us());
        // 128 KB: 256 sectors from the request's first, on track 3.
        assert_eq!(p.buffer_sectors(), 256);
        assert_eq!(d.head().head, 3);
        assert!(is_hit(&read(&d, 248, 8), &p));
        // Past it nothing was read: the media's (the head waits on track
        // 3 for the sector to come round).
        let a = read(&d, 256, 8);
        assert!(a.buffered == 0 && a.time.head_switch_us == 0.0);
        // Where the read-ahead got depends only on the time: the same
        // requests with the idle time split, and the head looked at
        // between, take the same times.
        let runs: Vec<(f64, Breakdown)> = [1usize, 3]
            .into_iter()
            .map(|pieces| {
                let d = bare(PaperDisk::Hp97560, ReadAhead::Sequential);
                read(&d, 0, 8);
                for _ in 0..pieces {
                    d.idle(1.7 * p.rotation_us() / pieces as f64);
                    d.head();
                }
                read(&d, 100, 8);
                d.write_at(&[1u8; 512], 5000 * 512).unwrap();
                (d.now_us(), d.last())
            })
            .collect();
        assert!(close(runs[0].0, runs[1].0), "{runs:?}");
    }

    #[test]
    fn the_vld_mode_reads_the_whole_track_and_keeps_it_until_delivered() {
        let d = bare(PaperDisk::Hp97560, ReadAhead::WholeTrack);
        let p = d.params().clone();
        let su = p.sector_us();
        // The head reaches track 0 with sector 0 under it: sectors 40..48
        // are done after 48 sector times, and all before them are in.
        let a = read(&d, 40, 8);
        assert!(close(a.time.rotation_us, 40.0 * su) && close(a.time.transfer_us, 8.0 * su));
        // Lower addresses than the last request are still there.
        assert!(is_hit(&read(&d, 0, 8), &p));
        // Sectors still to come: the request waits for them, no turn lost.
        let now = d.now_us();
        let a = read(&d, 60, 8);
        assert_eq!(a.buffered, 0);
        assert!(close(d.now_us(), 68.0 * su), "{} {now}", d.now_us());
        // Elsewhere and back: what was not delivered is still there.
        let a = read(&d, 72 + 30, 8);
        assert!(close(a.time.head_switch_us, p.head_switch_us));
        assert!(is_hit(&read(&d, 16, 8), &p));
        assert!(is_hit(&read(&d, 72 + 20, 8), &p));
        // Delivered sectors leave the buffer.
        assert_eq!(read(&d, 0, 8).buffered, 0);
        // The drive's own policy loses the lower sectors at once.
        let d = bare(PaperDisk::Hp97560, ReadAhead::Sequential);
        read(&d, 40, 8);
        assert_eq!(read(&d, 0, 8).buffered, 0);
    }
}
