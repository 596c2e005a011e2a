use super::*;
use crate::device::sim::{DiskParams, PaperDisk};

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
    let physical = disk.params().sectors();
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
fn eager_writes_locate_in_a_few_sectors_on_an_empty_disk() {
    // An update in place waits half a turn on average; eager writing on an
    // empty disk finds a free run almost under the head.
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
        assert!(
            per_write < half / 4.0,
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
    // sectors scattered nearest the head: five 4 KiB blocks and their map
    // sectors (45 of 72 sectors, below the 75% threshold) all land there.
    let n = u64::from(disk.params().sectors_per_track);
    let ft = v
        .lock()
        .fill_track
        .expect("compaction leaves a track to fill");
    assert!((ft * n..(ft + 1) * n).all(|x| !v.lock().used[x as usize]));
    for k in 0..5u64 {
        let b = r.gen_range(0..blocks);
        v.write_at(&pattern(k, 4096), b * 4096).unwrap();
        let at = v.physical_of(b * 8).unwrap();
        assert_eq!(at / n, ft, "block {k} of the fill went to sector {at}");
    }
    v.check().unwrap();
}

#[test]
fn a_hot_map_sector_gathers_orphans_without_relogging_the_map() {
    // A file system's pattern: a random data block, then the same metadata
    // sector (an inode), over and over. The hot map sector inherits every
    // data map sector as an orphan; absorbing keeps each update at about
    // one map write instead of rewriting the whole map every 16 updates.
    let disk = small(PaperDisk::Hp97560, 4);
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
