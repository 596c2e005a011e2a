use super::*;
use crate::device::sim::{DiskParams, PaperDisk, PowerCut};

fn small(disk: PaperDisk, cylinders: u32) -> Arc<SimDisk> {
    let mut p = DiskParams::paper(disk);
    p.cylinders = cylinders;
    Arc::new(SimDisk::new(p, 0.0))
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut r = ChaCha8Rng::seed_from_u64(seed);
    (0..len).map(|_| r.gen()).collect()
}

#[test]
fn writes_read_back_and_survive_power_down_and_scan() {
    let disk = small(PaperDisk::Hp97560, 2);
    let v = Vld::create(disk.clone(), VldOptions::default()).unwrap();
    let size = v.size_bytes();
    let mut model = vec![0u8; size as usize];
    let mut r = ChaCha8Rng::seed_from_u64(5);
    for i in 0..400u64 {
        let len = r.gen_range(1..9000usize).min(size as usize);
        let off = r.gen_range(0..size - len as u64);
        let d = pattern(i, len);
        v.write_at(&d, off).unwrap();
        model[off as usize..off as usize + len].copy_from_slice(&d);
    }
    v.check().unwrap();
    let mut back = vec![0u8; size as usize];
    v.read_at(&mut back, 0).unwrap();
    assert!(back == model);
    // Clean power-down: recovery by traversal from the tail.
    v.power_down().unwrap();
    drop(v);
    let (v, how) = Vld::open(disk.clone(), VldOptions::default()).unwrap();
    assert!(matches!(how, Recovery::Tail { .. }), "{how:?}");
    v.check().unwrap();
    v.read_at(&mut back, 0).unwrap();
    assert!(back == model);
    // The tail was cleared: without a new power-down the next open scans.
    drop(v);
    let (v, how) = Vld::open(disk, VldOptions::default()).unwrap();
    assert_eq!(how, Recovery::Scan);
    v.check().unwrap();
    v.read_at(&mut back, 0).unwrap();
    assert!(back == model);
}

#[test]
fn overwritten_map_sectors_are_recycled_at_high_utilization() {
    // Fill 90% of the logical space, then rewrite at random: the map tree
    // keeps every live version reachable while obsolete ones are reused.
    let disk = small(PaperDisk::St19101, 1);
    let v = Vld::create(disk.clone(), VldOptions::default()).unwrap();
    let blocks = v.size_bytes() / 4096 * 9 / 10;
    for b in 0..blocks {
        v.write_at(&pattern(b, 4096), b * 4096).unwrap();
    }
    let mut r = ChaCha8Rng::seed_from_u64(9);
    let mut last = vec![0u64; blocks as usize];
    for i in 0..3000u64 {
        let b = r.gen_range(0..blocks);
        v.write_at(&pattern(1_000_000 + i, 4096), b * 4096).unwrap();
        last[b as usize] = 1_000_000 + i;
        if i % 97 == 0 {
            v.check().unwrap();
        }
    }
    v.check().unwrap();
    assert!(v.utilization() > 0.75, "{}", v.utilization());
    let physical = disk.params().sectors() / 8;
    let map_sectors = v.stats().map_writes;
    // Far more map sector versions were written than there was ever free
    // space for: obsolete ones were reused.
    let free = (physical as f64 * (1.0 - v.utilization())) as u64;
    assert!(
        map_sectors > 2 * free,
        "{map_sectors} map writes, {free} free"
    );
    v.power_down().unwrap();
    drop(v);
    let (v, how) = Vld::open(disk, VldOptions::default()).unwrap();
    assert!(matches!(how, Recovery::Tail { .. }));
    for b in 0..blocks {
        let mut got = vec![0u8; 4096];
        v.read_at(&mut got, b * 4096).unwrap();
        let seed = if last[b as usize] == 0 {
            b
        } else {
            last[b as usize]
        };
        assert!(got == pattern(seed, 4096), "block {b}");
    }
}

#[test]
fn eager_writes_locate_in_a_fraction_of_a_turn_on_an_empty_disk() {
    // An update in place waits half a turn on average; eager writing on an
    // empty disk finds a free block close to the head.
    for d in PaperDisk::ALL {
        let disk = small(d, 4);
        let v = Vld::create(disk.clone(), VldOptions::default()).unwrap();
        let mut r = ChaCha8Rng::seed_from_u64(3);
        disk.reset_stats();
        let writes = 200;
        for _ in 0..writes {
            let b = r.gen_range(0..v.size_bytes() / 4096 / 4);
            v.write_at(&[1u8; 4096], b * 4096).unwrap();
        }
        let s = disk.stats();
        let per_write = s.time.locate_us() / f64::from(writes);
        let half = disk.params().rotation_us() / 2.0;
        println!("{d:?}: {per_write:.0} us locate per write, half a turn {half:.0} us");
        // Under a quarter turn: each write waits for a block's first sector
        // (up to a block of sectors after the SCSI overhead), and a data
        // block and its map block fill a track (9 blocks on the HP) every
        // few writes, then a head switch (2.5 ms on the HP).
        assert!(
            per_write < half / 2.0,
            "{d:?}: {per_write} us locate per write"
        );
    }
}

#[test]
fn compactor_empties_tracks_and_writes_fill_them() {
    let disk = small(PaperDisk::Hp97560, 2);
    let v = Vld::create(disk.clone(), VldOptions::default()).unwrap();
    let blocks = v.size_bytes() / 4096 * 6 / 10;
    let mut r = ChaCha8Rng::seed_from_u64(1);
    for i in 0..blocks * 3 {
        let b = r.gen_range(0..blocks);
        v.write_at(&pattern(i, 4096), b * 4096).unwrap();
    }
    let mut before = vec![0u8; (blocks * 4096) as usize];
    v.read_at(&mut before, 0).unwrap();
    let emptied = v.compact(2_000_000.0).unwrap();
    assert!(emptied > 0);
    v.check().unwrap();
    let mut after = vec![0u8; before.len()];
    v.read_at(&mut after, 0).unwrap();
    assert!(before == after);
    // Writes now fill one emptied track (eq. 10) rather than the free
    // blocks scattered nearest the head: three 4 KiB blocks and their map
    // sectors (at most 6 of the track's 9 blocks, below the 75% threshold)
    // all land there.
    let n = u64::from(disk.params().sectors_per_track);
    let ft = v
        .lock()
        .fill_track
        .expect("compaction leaves a track to fill");
    assert_eq!(v.blocks_used_in(&v.lock(), ft), 0);
    for k in 0..3u64 {
        let b = r.gen_range(0..blocks);
        v.write_at(&pattern(k, 4096), b * 4096).unwrap();
        let at = v.physical_of(b * 8).unwrap();
        assert_eq!(at / n, ft, "block {k} of the fill went to sector {at}");
    }
    v.check().unwrap();
}

/// Tracks holding no block.
fn empty_tracks(v: &Vld) -> u64 {
    let g = v.lock();
    (0..v.disk.params().tracks())
        .filter(|&t| v.blocks_used_in(&g, t) == 0)
        .count() as u64
}

#[test]
fn the_compactor_plugs_holes_and_never_refills_a_track_it_emptied() {
    // The paper's compactor copies a track's live data to holes in other
    // tracks (Section 4.2, "similar to hole-plugging"). Moving it eagerly
    // into the nearest free blocks instead put it into the tracks emptied
    // just before: on the 80% Figure 9 run on the Seagate it emptied 117
    // tracks and left 16 empty, a third of what its free space holds.
    for d in PaperDisk::ALL {
        let disk = small(d, 3);
        let v = Vld::create(disk.clone(), VldOptions::default()).unwrap();
        let blocks = v.size_bytes() / 4096 * 7 / 10;
        let mut r = ChaCha8Rng::seed_from_u64(3);
        for i in 0..blocks * 3 {
            let b = r.gen_range(0..blocks);
            v.write_at(&pattern(i, 4096), b * 4096).unwrap();
        }
        let before = empty_tracks(&v);
        let emptied = v.compact(60_000_000.0).unwrap();
        v.check().unwrap();
        let after = empty_tracks(&v);
        assert!(emptied > 0, "{d:?}");
        assert_eq!(after, before + emptied, "{d:?}: {emptied} emptied");
        // Most of the free space is now in empty tracks.
        let k = v.track_blocks();
        let free = v.lock().free;
        assert!(
            after * k * 10 >= free * 6,
            "{d:?}: {after} empty tracks of {k} blocks, {free} blocks free"
        );
    }
}

#[test]
fn a_hot_map_sector_gathers_orphans_without_relogging_the_map() {
    // A file system's pattern: a random data block, then the same metadata
    // sector (an inode), over and over. The hot map sector inherits every
    // data map sector as an orphan; absorbing keeps each update at about
    // one map write instead of rewriting the whole map every 16 updates.
    // (A map sector covers 56 blocks: the paper's 36 cylinders have 110.)
    let disk = small(PaperDisk::Hp97560, 36);
    let v = Vld::create(disk.clone(), VldOptions::default()).unwrap();
    let blocks = v.size_bytes() / 4096;
    let mut r = ChaCha8Rng::seed_from_u64(2);
    for i in 0..2000u64 {
        let b = r.gen_range(1..blocks);
        v.write_at(&pattern(i, 4096), b * 4096).unwrap();
        v.write_at(&pattern(i + 7, 512), 0).unwrap();
    }
    v.check().unwrap();
    let s = v.stats();
    assert_eq!(s.relogs, 0, "{s:?}");
    assert!(
        s.absorbs > 0 && s.map_writes < s.data_writes * 11 / 10,
        "{s:?}"
    );
    let mut want = vec![0u8; v.size_bytes() as usize];
    v.read_at(&mut want, 0).unwrap();
    v.power_down().unwrap();
    drop(v);
    let (v, how) = Vld::open(disk, VldOptions::default()).unwrap();
    assert!(matches!(how, Recovery::Tail { .. }));
    let mut got = vec![0u8; want.len()];
    v.read_at(&mut got, 0).unwrap();
    assert!(got == want);
}

#[test]
fn sub_block_writes_merge_with_the_old_block_in_one_request() {
    let disk = small(PaperDisk::St19101, 1);
    let v = Vld::create(disk.clone(), VldOptions::default()).unwrap();
    let mut model = vec![0u8; 3 * 4096];
    // Into unmapped blocks: zeros around, nothing to read.
    let before = disk.stats();
    v.write_at(&[7u8; 100], 4096 + 300).unwrap();
    model[4096 + 300..4096 + 400].fill(7);
    let s = disk.stats();
    assert_eq!(
        (
            s.requests - before.requests,
            s.sectors_read - before.sectors_read
        ),
        (1, 0)
    );
    // Whole block, then pieces of it and across the next boundary: each
    // one request that reads the old block(s) and writes whole blocks.
    v.write_at(&pattern(1, 4096), 0).unwrap();
    model[..4096].copy_from_slice(&pattern(1, 4096));
    for (i, (off, len)) in [(512, 512), (1000, 37), (4000, 200), (8191, 2)]
        .into_iter()
        .enumerate()
    {
        let d = pattern(10 + i as u64, len);
        let before = disk.stats();
        v.write_at(&d, off as u64).unwrap();
        model[off..off + len].copy_from_slice(&d);
        let s = disk.stats();
        assert_eq!(s.requests - before.requests, 1);
        assert!(
            s.sectors_read > before.sectors_read,
            "write {i} did not merge"
        );
        assert_eq!(
            (s.sectors_written - before.sectors_written) % 8,
            1,
            "write {i}"
        );
    }
    let mut got = vec![0u8; model.len()];
    v.read_at(&mut got, 0).unwrap();
    assert!(got == model);
    v.check().unwrap();
}

#[test]
fn the_block_size_is_a_format_parameter_kept_in_the_label() {
    let disk = small(PaperDisk::St19101, 1);
    // 3 KiB (6 sectors) does not divide the Seagate's 256-sector track.
    let bad = VldOptions {
        block_bytes: 3072,
        ..VldOptions::default()
    };
    assert!(Vld::create(disk.clone(), bad).is_err());
    for block_bytes in [512, 8192] {
        let opts = VldOptions {
            block_bytes,
            ..VldOptions::default()
        };
        let v = Vld::create(disk.clone(), opts).unwrap();
        assert_eq!(v.write_unit_bytes(), u64::from(block_bytes));
        v.write_at(&pattern(3, 5000), 700).unwrap();
        v.power_down().unwrap();
        drop(v);
        // Open takes the size from the label, whatever it is asked.
        let (v, _) = Vld::open(disk.clone(), VldOptions::default()).unwrap();
        assert_eq!(v.block_bytes(), block_bytes);
        let mut got = vec![0u8; 5000];
        v.read_at(&mut got, 700).unwrap();
        assert!(got == pattern(3, 5000));
        v.check().unwrap();
    }
}

/// A power cut anywhere in a sub-block write spanning two blocks of two
/// map sectors (logical blocks 55 and 56: read-modify-write of both, two
/// data blocks, two map sectors) leaves each block wholly old or wholly
/// new, whether recovery has the tail or scans, and the map consistent.
#[test]
fn a_cut_sub_block_write_leaves_each_block_old_or_new() {
    let bb = 4096usize;
    for at_write in 0..6u64 {
        for seed in 0..8u64 {
            for tail in [true, false] {
                let disk = small(PaperDisk::St19101, 1);
                let v = Vld::create(disk.clone(), VldOptions::default()).unwrap();
                let old = pattern(1, 4 * bb);
                v.write_at(&old, 54 * bb as u64).unwrap();
                // Superseded map slots next to the live ones.
                for i in 0..20u64 {
                    v.write_at(&pattern(100 + i, 512), (i % 3) * 512).unwrap();
                }
                let off = 55 * bb + 1000;
                let new = pattern(2, bb + 200);
                disk.set_power_cut(Some(PowerCut { at_write, seed }));
                let r = v.write_at(&new, off as u64);
                let mut want = old.clone();
                let rel = off - 54 * bb;
                want[rel..rel + new.len()].copy_from_slice(&new);
                let what = format!("cut at write {at_write}, seed {seed}, tail {tail}");
                let mut image = disk.image();
                if tail {
                    image[..SECTOR].copy_from_slice(&v.tail_record());
                }
                let again = Arc::new(SimDisk::with_image(disk.params().clone(), 0.0, image));
                let (v2, _) = Vld::open(again, VldOptions::default())
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                v2.check().unwrap_or_else(|e| panic!("{what}: {e}"));
                let mut got = vec![0u8; 4 * bb];
                v2.read_at(&mut got, 54 * bb as u64).unwrap();
                for b in 0..4 {
                    let r = b * bb..(b + 1) * bb;
                    assert!(
                        got[r.clone()] == old[r.clone()] || got[r.clone()] == want[r.clone()],
                        "{what}: block {} torn",
                        54 + b
                    );
                }
                if r.is_ok() {
                    assert!(got == want, "{what}: a write that returned is durable");
                }
            }
        }
    }
}

/// A write larger than the free space of a full disk fails with nothing
/// committed, and the runs it had written are free again: the disk checks
/// clean and takes the next small write (review 11: they leaked, and a
/// full disk refused every write until reopened).
#[test]
fn a_write_that_runs_out_of_room_frees_what_it_wrote() {
    let disk = small(PaperDisk::Hp97560, 2);
    let v = Vld::create(disk, VldOptions::default()).unwrap();
    let size = v.size_bytes() as usize;
    v.write_at(&pattern(1, size), 0).unwrap();
    v.check().unwrap();
    // The error names the part of the write that found no room (it named
    // a sector at the write's start whatever the write).
    match v.write_at(&pattern(2, size), 0) {
        Err(DeviceError::Io { offset, len, .. }) => {
            assert!(
                len > 512 && offset + len == size as u64,
                "{offset} + {len} of {size}"
            );
        }
        r => panic!("a whole-disk overwrite: {r:?}"),
    }
    v.check().unwrap();
    let mut back = vec![0u8; size];
    v.read_at(&mut back, 0).unwrap();
    assert!(
        back == pattern(1, size),
        "a failed write changed the contents"
    );
    v.write_at(&[7u8; 4096], 0).unwrap();
    v.check().unwrap();
}

/// A disk formatted again: the scan that recovers it after a crash adopts
/// none of the previous format's map sectors (they carried the same disk
/// id, and their higher sequence numbers won: blocks the new format never
/// wrote read back the old contents).
#[test]
fn a_reformatted_disk_scans_none_of_the_old_format() {
    let disk = small(PaperDisk::Hp97560, 2);
    let v = Vld::create(disk.clone(), VldOptions::default()).unwrap();
    let size = v.size_bytes() as usize;
    // Many versions of every map sector: high sequence numbers.
    for round in 0..4 {
        v.write_at(&pattern(round, size / 2), 0).unwrap();
    }
    drop(v);
    let v = Vld::create(disk.clone(), VldOptions::default()).unwrap();
    v.write_at(&[7u8; 4096], 0).unwrap();
    drop(v);
    let (v, how) = Vld::open(disk, VldOptions::default()).unwrap();
    assert_eq!(how, Recovery::Scan);
    v.check().unwrap();
    let mut back = vec![0u8; size / 2];
    v.read_at(&mut back, 0).unwrap();
    assert!(
        back[..4096].iter().all(|&b| b == 7),
        "the new format's block"
    );
    assert!(
        back[4096..].iter().all(|&b| b == 0),
        "blocks the new format never wrote read the old format's contents"
    );
}

/// `a_reformatted_disk_scans_none_of_the_old_format` with the old label
/// damaged first: the format cannot read the old id, and fell back to the
/// requested one, the old format's too, so the scan adopted the old map
/// sectors (review 14, F5).
#[test]
fn a_format_over_a_damaged_label_scans_none_of_the_old_format() {
    let disk = small(PaperDisk::Hp97560, 2);
    let v = Vld::create(disk.clone(), VldOptions::default()).unwrap();
    let size = v.size_bytes() as usize;
    for round in 0..4 {
        v.write_at(&pattern(round, size / 2), 0).unwrap();
    }
    drop(v);
    let mut label = [0u8; SECTOR];
    disk.media_read(1, &mut label).unwrap();
    label[20] ^= 0x40;
    disk.media_write(1, &label).unwrap();
    let v = Vld::create(disk.clone(), VldOptions::default()).unwrap();
    v.write_at(&[7u8; 4096], 0).unwrap();
    drop(v);
    let (v, how) = Vld::open(disk, VldOptions::default()).unwrap();
    assert_eq!(how, Recovery::Scan);
    v.check().unwrap();
    let mut back = vec![0u8; size / 2];
    v.read_at(&mut back, 0).unwrap();
    assert!(
        back[..4096].iter().all(|&b| b == 7),
        "the new format's block"
    );
    assert!(
        back[4096..].iter().all(|&b| b == 0),
        "blocks the new format never wrote read the old format's contents"
    );
}

#[test]
fn the_drive_reads_whole_tracks_for_the_vld_and_sequential_reads_hit_them() {
    // Logical blocks written last to first land where the head was each
    // time, mostly lower for the lower logical blocks, so reading them
    // first to last goes down the tracks: the drive's own policy discards
    // everything below each request, the VLD's mode keeps the tracks.
    let mut hits: Vec<(u64, f64)> = Vec::new();
    for read_ahead in [ReadAhead::WholeTrack, ReadAhead::Sequential] {
        let mut p = DiskParams::paper(PaperDisk::Hp97560);
        p.cylinders = 4;
        let disk = Arc::new(SimDisk::new(p, 1000.0));
        assert_eq!(disk.read_ahead(), ReadAhead::Sequential);
        let opts = VldOptions {
            read_ahead,
            ..VldOptions::default()
        };
        let v = Vld::create(disk.clone(), opts).unwrap();
        assert_eq!(disk.read_ahead(), read_ahead);
        for b in (0..8u64).rev() {
            v.write_at(&pattern(b, 4096), b * 4096).unwrap();
        }
        let at: Vec<u64> = (0..8).map(|b| v.physical_of(b * 8).unwrap()).collect();
        assert!(at.windows(2).filter(|w| w[0] > w[1]).count() >= 4, "{at:?}");
        disk.reset_stats();
        let t0 = disk.now_us();
        for b in 0..8u64 {
            let mut got = vec![0u8; 4096];
            v.read_at(&mut got, b * 4096).unwrap();
            assert!(got == pattern(b, 4096));
        }
        hits.push((disk.stats().buffer_hits, disk.now_us() - t0));
        // Open selects it again.
        v.power_down().unwrap();
        disk.set_read_ahead(ReadAhead::Off);
        Vld::open(disk.clone(), opts).unwrap();
        assert_eq!(disk.read_ahead(), read_ahead);
    }
    // Three of the eight reads wholly from the buffer, the others' waits
    // shorter, against none.
    assert!(hits[0].0 >= 3 && hits[1].0 == 0, "{hits:?}");
    assert!(hits[0].1 < 0.8 * hits[1].1, "{hits:?}");
}

// ---- review 17 probes ----

/// Review 17: a power cut while recovery's scan relogs the map (every open
/// after a crash without a tail does), with the firmware recording the log
/// tail from its residual power as at any other cut (vld_crash's model):
/// the next open traverses from that root and must find every block.
/// `relog_all` writes the live map sectors as a chain whose first link
/// points to nothing, and before it the root is only the newest sector
/// found, so the root of a cut relog reaches a fraction of the map.
#[test]
fn r17_a_cut_while_the_scan_relogs_loses_no_block() {
    for at_write in [0u64, 1, 2, 5, 9] {
        let disk = small(PaperDisk::Hp97560, 2);
        let v = Vld::create(disk.clone(), VldOptions::default()).unwrap();
        let size = v.size_bytes() as usize;
        // Many map sectors (56 blocks each), written in several passes.
        let want = pattern(3, size * 3 / 4);
        for chunk in (0..want.len()).step_by(40_000).rev() {
            let end = (chunk + 40_000).min(want.len());
            v.write_at(&want[chunk..end], chunk as u64).unwrap();
        }
        drop(v); // a crash: no tail, so the next open scans
                 // Open as `Vld::open` does, the power cut at the relog's map write
                 // `at_write`.
        let mut lb = [0u8; SECTOR];
        disk.media_read(1, &mut lb).unwrap();
        let l = format::decode_label(&lb).unwrap();
        let opts = VldOptions {
            disk_id: l.disk_id,
            ..VldOptions::default()
        };
        let r = Vld::empty(
            disk.clone(),
            opts,
            u64::from(l.block_sectors),
            l.logical_blocks,
        );
        disk.set_power_cut(Some(PowerCut { at_write, seed: 1 }));
        if r.recover_by_scan().is_ok() {
            // The relog wrote fewer sectors than `at_write`: no cut in it.
            continue;
        }
        let mut image = disk.image();
        image[..SECTOR].copy_from_slice(&r.tail_record());
        let again = Arc::new(SimDisk::with_image(disk.params().clone(), 0.0, image));
        let (v2, how) = Vld::open(again, VldOptions::default()).unwrap();
        // No tail names a mid-relog root: the scan recovers.
        assert_eq!(how, Recovery::Scan);
        v2.check().unwrap();
        let mut got = vec![0u8; want.len()];
        v2.read_at(&mut got, 0).unwrap();
        let lost = got
            .chunks(4096)
            .zip(want.chunks(4096))
            .filter(|(a, b)| a != b)
            .count();
        assert_eq!(lost, 0, "cut at relog write {at_write}: {lost} blocks lost");
    }
}

/// Review 17: `relog_all` called on a running disk (it is the fallback of
/// `write_map` when absorbing gathers nothing), cut at any of its writes,
/// with the firmware's tail.
#[test]
fn r17_a_cut_relog_on_a_running_disk_loses_no_block() {
    for at_write in [0u64, 1, 3, 7] {
        let disk = small(PaperDisk::Hp97560, 2);
        let v = Vld::create(disk.clone(), VldOptions::default()).unwrap();
        let size = v.size_bytes() as usize;
        let want = pattern(4, size / 2);
        v.write_at(&want, 0).unwrap();
        disk.set_power_cut(Some(PowerCut { at_write, seed: 2 }));
        let cut = v.relog_all(&mut v.lock()).is_err();
        assert!(
            cut || at_write > 0,
            "the first write of the relog was not cut"
        );
        if !cut {
            continue;
        }
        let mut image = disk.image();
        image[..SECTOR].copy_from_slice(&v.tail_record());
        let again = Arc::new(SimDisk::with_image(disk.params().clone(), 0.0, image));
        let (v2, _) = Vld::open(again, VldOptions::default()).unwrap();
        v2.check().unwrap();
        let mut got = vec![0u8; want.len()];
        v2.read_at(&mut got, 0).unwrap();
        let lost = got
            .chunks(4096)
            .zip(want.chunks(4096))
            .filter(|(a, b)| a != b)
            .count();
        assert_eq!(lost, 0, "cut at relog write {at_write}: {lost} blocks lost");
    }
}

/// Review 17: how often normal writes (and the compactor) relog the whole
/// map (`relog_all`), the one multi-write map update whose intermediate
/// roots do not reach every live map sector.
#[test]
#[ignore = "exploration"]
fn r17_explore_relog_frequency() {
    for seed in 0..40u64 {
        let mut r = ChaCha8Rng::seed_from_u64(seed);
        let d = if seed % 2 == 0 {
            PaperDisk::Hp97560
        } else {
            PaperDisk::St19101
        };
        let disk = small(d, if seed % 2 == 0 { 4 } else { 2 });
        let bb = [512u32, 4096, 8192][(seed % 3) as usize];
        let bb = if d == PaperDisk::Hp97560 && bb == 8192 {
            4608
        } else {
            bb
        };
        let v = Vld::create(
            disk,
            VldOptions {
                block_bytes: bb,
                seed,
                ..VldOptions::default()
            },
        )
        .unwrap();
        let size = v.size_bytes();
        let hot = size * r.gen_range(3..10) / 10;
        for i in 0..20000u64 {
            match r.gen_range(0..10) {
                0..=3 => v
                    .write_at(&[i as u8; 512], r.gen_range(0..4) * 512)
                    .unwrap(),
                4 => {
                    v.compact(100_000.0).unwrap();
                }
                _ => {
                    let len = r.gen_range(1..9000u64).min(hot);
                    let off = r.gen_range(0..hot - len);
                    v.write_at(&vec![i as u8; len as usize], off).unwrap();
                }
            }
        }
        v.check().unwrap();
        println!("seed {seed} bb {bb}: {:?}", v.stats());
    }
}

/// Review 17: `check` compares counts only; this checks block by block:
/// every mapped block used and owned by its logical block, every used
/// block reserved, owned (and mapped back) or a map block, no map block
/// holding data, the free count the unused blocks.
fn r17_strict(v: &Vld) -> Result<(), String> {
    v.check()?;
    let g = v.lock();
    let reserved = reserved_blocks(v.bs);
    for (l, p) in g.map.iter().enumerate() {
        if let Some(p) = *p {
            if !g.used[p as usize] || g.owner.get(&p) != Some(&(l as u64)) {
                return Err(format!(
                    "logical {l} -> {p}: used {} owner {:?}",
                    g.used[p as usize],
                    g.owner.get(&p)
                ));
            }
            if g.map_slots.contains_key(&p) {
                return Err(format!("logical {l} -> {p}, a map block"));
            }
        }
    }
    for (x, &u) in g.used.iter().enumerate() {
        let x32 = x as u32;
        let owned = g
            .owner
            .get(&x32)
            .is_some_and(|&l| g.map[l as usize] == Some(x32));
        let ok = (x as u64) < reserved || owned || g.map_slots.contains_key(&x32);
        if u != ok {
            return Err(format!(
                "block {x}: used {u}, owned {owned}, map {}",
                g.map_slots.contains_key(&x32)
            ));
        }
    }
    let free = g.used.iter().filter(|&&u| !u).count() as u64;
    if free != g.free {
        return Err(format!("{free} unused blocks, free says {}", g.free));
    }
    Ok(())
}

/// Review 17: random writes and frequent compactions, every block size,
/// the power cut anywhere, recovery with the tail and by scan; after each,
/// and after the uncut steps, the strict block-by-block check. A
/// compaction that fails without a cut is counted (and the disk checked
/// and used on); returns how many did.
fn r17_compaction_run(from: u64, seeds: u64) -> u64 {
    let mut uncut_failures = 0;
    for seed in from..from + seeds {
        let mut r = ChaCha8Rng::seed_from_u64(seed);
        let d = if r.gen_bool(0.5) {
            PaperDisk::Hp97560
        } else {
            PaperDisk::St19101
        };
        let disk = small(d, if d == PaperDisk::Hp97560 { 2 } else { 1 });
        let bb = match r.gen_range(0..4) {
            0 => 512,
            1 if d == PaperDisk::Hp97560 => 4608,
            1 => 8192,
            _ => 4096,
        };
        let opts = VldOptions {
            block_bytes: bb,
            seed,
            ..VldOptions::default()
        };
        let v = Vld::create(disk.clone(), opts).unwrap();
        let size = v.size_bytes();
        let hot = size * r.gen_range(3..10) / 10;
        let mut model = vec![0u8; size as usize];
        disk.set_power_cut(Some(PowerCut {
            at_write: r.gen_range(0..3000),
            seed,
        }));
        let what = format!("seed {seed} bb {bb}");
        let mut cut = None;
        for i in 0..1500u64 {
            if r.gen_bool(0.15) {
                if let Err(e) = v.compact(r.gen_range(1_000.0..400_000.0)) {
                    if disk.powered_off() {
                        break;
                    }
                    uncut_failures += 1;
                    println!("{what}: compaction {i} failed uncut: {e}");
                }
                r17_strict(&v).unwrap_or_else(|e| panic!("{what}: after compaction {i}: {e}"));
                // (No read here: it moves the head, and so every later
                // placement; the recovery below compares the contents.)
                continue;
            }
            let (off, data) = if r.gen_bool(0.25) {
                (r.gen_range(0..4) * 512, vec![i as u8; 512])
            } else {
                let len = r.gen_range(1..9000u64).min(hot);
                (
                    r.gen_range(0..hot - len),
                    vec![(i as u8) ^ 0x5a; len as usize],
                )
            };
            let o = off as usize;
            let old = model[o..o + data.len()].to_vec();
            if v.write_at(&data, off).is_err() {
                assert!(disk.powered_off(), "{what}: write failed uncut");
                cut = Some((o, old, data));
                break;
            }
            model[o..o + data.len()].copy_from_slice(&data);
        }
        if !disk.powered_off() {
            continue;
        }
        let image = disk.image();
        for tail in [true, false] {
            let mut im = image.clone();
            if tail {
                im[..SECTOR].copy_from_slice(&v.tail_record());
            }
            let again = Arc::new(SimDisk::with_image(disk.params().clone(), 0.0, im));
            let (v2, how) = Vld::open(again, VldOptions::default())
                .unwrap_or_else(|e| panic!("{what} tail {tail}: {e}"));
            r17_strict(&v2).unwrap_or_else(|e| panic!("{what} {how:?}: {e}"));
            let mut got = vec![0u8; size as usize];
            v2.read_at(&mut got, 0).unwrap();
            let bbu = bb as usize;
            for b in 0..got.len() / bbu {
                let rg = b * bbu..(b + 1) * bbu;
                if got[rg.clone()] == model[rg.clone()] {
                    continue;
                }
                // Only the cut write's blocks may differ: then wholly new.
                let (o, _, ref data) = *cut.as_ref().unwrap_or_else(|| {
                    panic!("{what} {how:?}: block {b} changed by a cut compaction")
                });
                let mut new = model.clone();
                new[o..o + data.len()].copy_from_slice(data);
                assert!(
                    got[rg.clone()] == new[rg.clone()],
                    "{what} {how:?}: block {b} neither old nor new"
                );
            }
            if v2.compact(5_000_000.0).is_err() {
                uncut_failures += 1;
            }
            r17_strict(&v2).unwrap_or_else(|e| panic!("{what} {how:?} compacted: {e}"));
        }
    }
    uncut_failures
}

/// Review 17: the map and free space agree block by block through
/// compactions and cuts anywhere (whatever the compactor returns).
#[test]
fn r17_compaction_and_cuts_keep_the_map_and_free_space_agreeing() {
    let seeds: u64 = std::env::var("R17_UNIT_SEEDS").map_or(40, |v| v.parse().unwrap());
    let from: u64 = std::env::var("R17_UNIT_FROM").map_or(0, |v| v.parse().unwrap());
    let failed = r17_compaction_run(from, seeds);
    println!("{failed} compactions failed without a cut");
}

/// Review 17: the compactor checks that the holes of other tracks holding
/// data can take the track's blocks, but a track whose only block was a
/// map block (or a block the moves replace) empties during the moves and
/// leaves the candidates: the holes shrink below the estimate and
/// `compact` fails "no free block (more logical blocks than the disk
/// holds)" with most of the disk free (seed 961: 444 of 512 blocks).
#[test]
fn r17_the_compactor_never_fails_for_room_on_a_mostly_free_disk() {
    assert_eq!(r17_compaction_run(961, 1), 0);
}

/// Review 18: a write whose data blocks all find room but whose map sector
/// then finds none (`commit` -> `log_version`: "no free block") fails
/// uncut. Does it leave the map and free space agreeing (the compactor now
/// swallows this error from its moves and calls the disk consistent,
/// 7261cf8), the contents unchanged, and a power-down then reopen intact?
/// Every write size around the free space, on a full disk.
#[test]
fn r18_a_write_whose_map_sector_finds_no_room_leaks_nothing() {
    let mut failures = Vec::new();
    for bb in [512u32, 4096] {
        for extra in 0..4u64 {
            let disk = small(PaperDisk::Hp97560, 2);
            let opts = VldOptions {
                block_bytes: bb,
                ..VldOptions::default()
            };
            let v = Vld::create(disk.clone(), opts).unwrap();
            let size = v.size_bytes() as usize;
            let mut model = pattern(u64::from(bb), size);
            v.write_at(&model, 0).unwrap();
            r17_strict(&v).unwrap();
            let free = v.lock().free;
            let blocks = (free + extra).saturating_sub(2).max(1);
            let data = pattern(99 + extra, (blocks * u64::from(bb)) as usize);
            let r = v.write_at(&data, 0);
            let what = format!("bb {bb}, {free} free, writing {blocks} blocks: {r:?}");
            if r.is_ok() {
                model[..data.len()].copy_from_slice(&data);
            }
            if let Err(e) = r17_strict(&v) {
                failures.push(format!("{what}: {e}"));
            }
            let mut got = vec![0u8; size];
            v.read_at(&mut got, 0).unwrap();
            if got != model {
                failures.push(format!("{what}: contents changed"));
            }
            v.power_down().unwrap();
            let again = Arc::new(SimDisk::with_image(
                disk.params().clone(),
                0.0,
                disk.image(),
            ));
            match Vld::open(again, VldOptions::default()) {
                Ok((v2, how)) => {
                    let mut got = vec![0u8; size];
                    v2.read_at(&mut got, 0).unwrap();
                    if got != model {
                        failures.push(format!("{what}: reopened ({how:?}) contents differ"));
                    }
                    if let Err(e) = r17_strict(&v2) {
                        failures.push(format!("{what}: reopened ({how:?}): {e}"));
                    }
                }
                Err(e) => failures.push(format!("{what}: reopen: {e}")),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Review 18: r17's compaction run over more seeds (`R18_FROM`, `R18_SEEDS`):
/// the compactor's StorageFull `break` leaves the map and free space
/// agreeing block by block, and cuts anywhere recover.
#[test]
fn r18_compaction_and_cuts_more_seeds() {
    let seeds: u64 = std::env::var("R18_SEEDS").map_or(120, |v| v.parse().unwrap());
    let from: u64 = std::env::var("R18_FROM").map_or(1000, |v| v.parse().unwrap());
    let failed = r17_compaction_run(from, seeds);
    println!("{failed} compactions failed without a cut");
}
