//! Disk parameters: the two drives of the virtual-log paper's Table 1 and
//! their seek curves.
//!
//! Only what Table 1 gives is taken from the paper; the rest is documented
//! here as an assumption. The HP 97560 seek curve is the one Ruemmler and
//! Wilkes published ("An introduction to disk drive modeling", 1994):
//! 3.24 + 0.400·√d ms for d < 383 cylinders, 8.00 + 0.008·d ms beyond; its
//! one-cylinder seek (3.64 ms) is Table 1's minimum seek of 3.6 ms. For the
//! ST19101 the paper only says it adjusted the HP model's parameters; we keep
//! the HP curve's shape and fit it to Table 1's 0.5 ms minimum and the
//! drive's published 5.2 ms average (one third of the stroke).
//!
//! The track buffer (see [`super::buffer`]) is not in Table 1 and neither
//! paper gives its size or the bus rate. The HP 97560's are its data
//! sheet's (HP 97556/58/60 SCSI technical reference manual 5960-0115:
//! "Cache/Buffer 128 KB static RAM", "10.000 MB/s ext sync"), which the
//! Dartmouth simulator the paper ran models. The paper built its Seagate by
//! adjusting only Table 1's parameters of that simulator (Section 4.1), so
//! its Seagate kept the HP's 128 KB buffer: one ST19101 track (256
//! sectors). Its bus is taken from the ST19101W's Ultra SCSI wide interface
//! (40 MB/s): a 10 MB/s bus would be slower than the Seagate's media
//! (256 sectors per 6 ms turn, 21.8 MB/s), and the simulator does not make
//! a media read wait for the bus. Both are parameters.

use super::buffer::ReadAhead;

/// A seek curve: `short_a + short_b·√d` µs below `boundary_cyl`,
/// `long_a + long_b·d` µs from there on; no seek (d = 0) costs nothing.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SeekCurve {
    pub short_a_us: f64,
    pub short_b_us: f64,
    pub boundary_cyl: u32,
    pub long_a_us: f64,
    pub long_b_us: f64,
}

impl SeekCurve {
    /// The time to move the arm `distance_cyl` cylinders (settling included).
    pub fn seek_us(&self, distance_cyl: u32) -> f64 {
        if distance_cyl == 0 {
            0.0
        } else if distance_cyl < self.boundary_cyl {
            self.short_a_us + self.short_b_us * f64::from(distance_cyl).sqrt()
        } else {
            self.long_a_us + self.long_b_us * f64::from(distance_cyl)
        }
    }
}

/// Everything the simulator needs to know about a drive.
#[derive(Clone, Debug, PartialEq)]
pub struct DiskParams {
    pub name: &'static str,
    /// Table 1, `n`.
    pub sectors_per_track: u32,
    /// Table 1, `t`.
    pub tracks_per_cylinder: u32,
    /// Cylinders simulated (the paper simulates 36 of the HP, 11 of the
    /// Seagate: about 24 MB each).
    pub cylinders: u32,
    pub rpm: f64,
    /// Table 1, `s`: switching to another head of the same cylinder.
    pub head_switch_us: f64,
    pub seek: SeekCurve,
    /// Table 1, `o`: the drive's processing time per SCSI command.
    pub scsi_overhead_us: f64,
    /// The track buffer's size (module doc: the data sheet's 128 KB).
    pub buffer_bytes: u64,
    /// The SCSI bus's rate, MB/s (10^6 bytes): what a read the track
    /// buffer serves costs beyond the command overhead.
    pub bus_mb_per_s: f64,
    /// What the drive reads into its buffer beyond a read request.
    pub read_ahead: ReadAhead,
}

/// Bytes per sector.
pub const SECTOR_BYTES_SIM: u64 = 512;

impl DiskParams {
    /// The HP 97560 (Table 1), `cylinders` of it simulated.
    pub fn hp97560(cylinders: u32) -> DiskParams {
        DiskParams {
            name: "HP97560",
            sectors_per_track: 72,
            tracks_per_cylinder: 19,
            cylinders,
            rpm: 4002.0,
            head_switch_us: 2500.0,
            seek: SeekCurve {
                short_a_us: 3240.0,
                short_b_us: 400.0,
                boundary_cyl: 383,
                long_a_us: 8000.0,
                long_b_us: 8.0,
            },
            scsi_overhead_us: 2300.0,
            buffer_bytes: 128 << 10,
            bus_mb_per_s: 10.0,
            read_ahead: ReadAhead::Sequential,
        }
    }

    /// The Seagate ST19101 (Table 1), `cylinders` of it simulated.
    pub fn st19101(cylinders: u32) -> DiskParams {
        DiskParams {
            name: "ST19101",
            sectors_per_track: 256,
            tracks_per_cylinder: 16,
            cylinders,
            rpm: 10000.0,
            head_switch_us: 500.0,
            // 400 + 100·√1 = 500 µs (Table 1's minimum); 400 + 100·√2320 ≈
            // 5.2 ms at a third of its 6962 cylinders; linear and continuous
            // beyond, 10.5 ms at full stroke.
            seek: SeekCurve {
                short_a_us: 400.0,
                short_b_us: 100.0,
                boundary_cyl: 2320,
                long_a_us: 2577.0,
                long_b_us: 1.138,
            },
            scsi_overhead_us: 100.0,
            // The paper's Seagate is the Dartmouth HP model with Table 1's
            // values (module doc): the HP's 128 KB, one track here.
            buffer_bytes: 128 << 10,
            bus_mb_per_s: 40.0,
            read_ahead: ReadAhead::Sequential,
        }
    }

    /// The paper's simulated portions: 36 cylinders of the HP, 11 of the
    /// Seagate.
    pub fn paper(disk: PaperDisk) -> DiskParams {
        match disk {
            PaperDisk::Hp97560 => DiskParams::hp97560(36),
            PaperDisk::St19101 => DiskParams::st19101(11),
        }
    }

    /// One revolution.
    pub fn rotation_us(&self) -> f64 {
        60.0e6 / self.rpm
    }

    /// One sector passing under the head.
    pub fn sector_us(&self) -> f64 {
        self.rotation_us() / f64::from(self.sectors_per_track)
    }

    pub fn tracks(&self) -> u64 {
        u64::from(self.cylinders) * u64::from(self.tracks_per_cylinder)
    }

    pub fn sectors(&self) -> u64 {
        self.tracks() * u64::from(self.sectors_per_track)
    }

    pub fn size_bytes(&self) -> u64 {
        self.sectors() * SECTOR_BYTES_SIM
    }

    /// Sectors the track buffer holds.
    pub fn buffer_sectors(&self) -> u64 {
        self.buffer_bytes / SECTOR_BYTES_SIM
    }

    /// One sector crossing the SCSI bus.
    pub fn bus_sector_us(&self) -> f64 {
        SECTOR_BYTES_SIM as f64 / self.bus_mb_per_s
    }

    /// Sectors by which consecutive tracks of a cylinder are rotated, so that
    /// a transfer running onto the next head finds its first sector just
    /// arriving after the head switch.
    pub fn track_skew_sectors(&self) -> u32 {
        (self.head_switch_us / self.sector_us()).ceil() as u32
    }

    /// The same for the step from a cylinder's last track to the next
    /// cylinder's first (a one-cylinder seek).
    pub fn cylinder_skew_sectors(&self) -> u32 {
        (self.seek.seek_us(1) / self.sector_us()).ceil() as u32
    }
}

/// The two drives of Table 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PaperDisk {
    Hp97560,
    St19101,
}

impl PaperDisk {
    pub const ALL: [PaperDisk; 2] = [PaperDisk::Hp97560, PaperDisk::St19101];

    pub fn name(self) -> &'static str {
        match self {
            PaperDisk::Hp97560 => "HP97560",
            PaperDisk::St19101 => "ST19101",
        }
    }
}

/// Host processors of Figure 9: the time the host spends outside the disk
/// per request (system call, file system, driver and, the paper's
/// simulator being part of its kernel, the VLD's algorithm): Figure 10's
/// "other", charged per device request (a random update makes two, the
/// file's block and its inode's, as the paper's UFS). The paper gives no
/// such time and its figures' values are not in its text, so these are
/// assumptions: 3 ms on the SPARCstation-10, and on the UltraSPARC-170
/// about a third of it, the ratio of their clocks (50 and 167 MHz, Section
/// 4). What the text says of them holds: on the Seagate the VLD is host
/// limited with the SPARCstation-10 (Section 5.4), and the UltraSPARC-170
/// "can easily cut" its latency in half (Section 5.5), which with a third
/// needs the SPARCstation-10's time per update to be at least three times
/// the VLD's disk time per update (about 1 ms after compacting). The gap
/// between update in place and the VLD depends on little else: `ldfs bench
/// vld` reports it against this time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Host {
    SparcStation10,
    UltraSparc170,
}

impl Host {
    pub fn name(self) -> &'static str {
        match self {
            Host::SparcStation10 => "SPARCstation-10",
            Host::UltraSparc170 => "UltraSPARC-170",
        }
    }

    pub fn overhead_us(self) -> f64 {
        match self {
            Host::SparcStation10 => 3000.0,
            Host::UltraSparc170 => 1000.0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hp_seek_curve_is_ruemmler_wilkes() {
        let hp = DiskParams::hp97560(1962);
        let s = hp.seek;
        assert_eq!(s.seek_us(0), 0.0);
        // 3.24 + 0.4·√1 = 3.64 ms: Table 1's "minimum seek 3.6 ms".
        assert!((s.seek_us(1) - 3640.0).abs() < 1e-9);
        assert!((s.seek_us(100) - (3240.0 + 4000.0)).abs() < 1e-9);
        assert!((s.seek_us(382) - (3240.0 + 400.0 * 382f64.sqrt())).abs() < 1e-9);
        assert!((s.seek_us(383) - (8000.0 + 8.0 * 383.0)).abs() < 1e-9);
        assert!((s.seek_us(1000) - 16000.0).abs() < 1e-9);
    }

    #[test]
    fn seagate_seek_matches_table_1_and_is_continuous() {
        let sg = DiskParams::st19101(6962).seek;
        assert!((sg.seek_us(1) - 500.0).abs() < 1e-9);
        let below = sg.seek_us(2319);
        let at = sg.seek_us(2320);
        assert!((at - below).abs() < 10.0, "{below} {at}");
        assert!((at - 5217.0).abs() < 5.0);
    }

    #[test]
    fn rotation_and_geometry() {
        let hp = DiskParams::paper(PaperDisk::Hp97560);
        // 4002 RPM: 14.99 ms a turn, the paper's "7 ms" half rotation.
        assert!((hp.rotation_us() - 14992.5037).abs() < 1e-3);
        assert_eq!(hp.sectors(), 36 * 19 * 72);
        let sg = DiskParams::paper(PaperDisk::St19101);
        assert!((sg.rotation_us() - 6000.0).abs() < 1e-9);
        assert!((sg.sector_us() - 6000.0 / 256.0).abs() < 1e-9);
        // About the paper's 24 MB of simulated disk each.
        assert!(hp.size_bytes() > 24_000_000 && hp.size_bytes() < 26_000_000);
        assert!(sg.size_bytes() > 22_000_000 && sg.size_bytes() < 24_000_000);
        // The HP's head switch spans 12.006 sectors: a skew of 13.
        assert_eq!(hp.track_skew_sectors(), 13);
        assert_eq!(sg.track_skew_sectors(), 22);
    }

    #[test]
    fn the_track_buffer_is_the_hp_data_sheet_s_and_the_bus_outruns_the_media() {
        let hp = DiskParams::paper(PaperDisk::Hp97560);
        let sg = DiskParams::paper(PaperDisk::St19101);
        // 128 KB: three and a half HP tracks, one Seagate track.
        assert_eq!(hp.buffer_sectors(), 256);
        assert_eq!(sg.buffer_sectors(), u64::from(sg.sectors_per_track));
        // 10 and 40 MB/s: 51.2 and 12.8 µs a sector, under the media's
        // 208 and 23.4 µs, so a buffered read is never slower than the
        // media read it replaces.
        assert!((hp.bus_sector_us() - 51.2).abs() < 1e-9);
        assert!((sg.bus_sector_us() - 12.8).abs() < 1e-9);
        for d in [hp, sg] {
            assert!(d.bus_sector_us() < d.sector_us());
            assert_eq!(d.read_ahead, ReadAhead::Sequential);
        }
    }
}
