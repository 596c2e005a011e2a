//! Review 17 probes: the VLD's hole-plugging compactor (8510f8f) under
//! power cuts at every media write and on full, fragmented disks; uip's
//! whole-extent writes (d738f2c).
//!
//! Env: `R17_SEEDS` (default 24) seeds per sweep, `R17_SEED` one seed.

use std::sync::Arc;

use ldfs::device::sim::{DiskParams, PaperDisk, PowerCut, SimDisk};
use ldfs::device::vld::{Recovery, Vld, VldOptions};
use ldfs::device::Device;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const SECTOR: usize = 512;

fn seeds(default: u64) -> Vec<u64> {
    if let Some(s) = std::env::var("R17_SEED").ok().and_then(|s| s.parse().ok()) {
        return vec![s];
    }
    let n = std::env::var("R17_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default);
    (0..n).collect()
}

fn params(rng: &mut ChaCha8Rng) -> DiskParams {
    let mut p = if rng.gen_bool(0.5) {
        DiskParams::paper(PaperDisk::Hp97560)
    } else {
        DiskParams::paper(PaperDisk::St19101)
    };
    p.cylinders = if p.sectors_per_track == 72 { 2 } else { 1 };
    p
}

fn block_bytes(rng: &mut ChaCha8Rng, p: &DiskParams) -> u32 {
    match rng.gen_range(0..4) {
        0 => 512,
        1 if p.sectors_per_track == 72 => 4608,
        1 => 8192,
        _ => 4096,
    }
}

/// A random write inside `hot` bytes (a quarter of them one hot sector).
fn random_write(rng: &mut ChaCha8Rng, size: u64, hot: u64) -> (u64, Vec<u8>) {
    let len = match rng.gen_range(0..4) {
        0 => rng.gen_range(1..600),
        1 => 4096,
        2 => rng.gen_range(1..20_000),
        _ => 512 * rng.gen_range(1..9),
    }
    .min(hot as usize);
    if rng.gen_bool(0.25) {
        return (0, vec![rng.gen(); 512]);
    }
    let off = if rng.gen_bool(0.5) {
        rng.gen_range(0..hot / 4096) * 4096
    } else {
        rng.gen_range(0..hot - len as u64)
    };
    let off = off.min(size - len as u64);
    let fill: u8 = rng.gen();
    let mut data = vec![fill; len];
    data[0] = fill.wrapping_add(1);
    (off, data)
}

fn read_all(v: &Vld) -> Vec<u8> {
    let mut b = vec![0u8; v.size_bytes() as usize];
    v.read_at(&mut b, 0).unwrap();
    b
}

fn first_diff(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter().zip(b).position(|(x, y)| x != y)
}

/// A fragmented VLD: filled to a random utilization with random writes,
/// compacted once and written again (so a fill track may be set), then
/// powered down. Returns (params, opts, image, model).
fn fragmented(seed: u64) -> (DiskParams, VldOptions, Vec<u8>, Vec<u8>) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let p = params(&mut rng);
    let opts = VldOptions {
        seed,
        block_bytes: block_bytes(&mut rng, &p),
        ..VldOptions::default()
    };
    let disk = Arc::new(SimDisk::new(p.clone(), 0.0));
    let v = Vld::create(disk.clone(), opts).unwrap();
    let size = v.size_bytes();
    let hot = (size as f64 * rng.gen_range(0.3..0.99)) as u64;
    let mut model = vec![0u8; size as usize];
    let writes = rng.gen_range(100..900);
    for i in 0..writes {
        let (off, d) = random_write(&mut rng, size, hot);
        v.write_at(&d, off).unwrap();
        model[off as usize..off as usize + d.len()].copy_from_slice(&d);
        if i == writes / 2 && rng.gen_bool(0.5) {
            v.compact(rng.gen_range(10_000.0..500_000.0))
                .unwrap_or_else(|e| panic!("seed {seed}: uncut compaction failed: {e}"));
        }
    }
    v.check().unwrap();
    v.power_down().unwrap();
    (p, opts, disk.image(), model)
}

/// Open the image from its tail (deterministic state).
fn reopen(p: &DiskParams, opts: VldOptions, image: Vec<u8>) -> (Arc<SimDisk>, Vld) {
    let disk = Arc::new(SimDisk::with_image(p.clone(), 0.0, image));
    let (v, how) = Vld::open(disk.clone(), opts).unwrap();
    assert!(matches!(how, Recovery::Tail { .. }));
    (disk, v)
}

/// Recover `image` (with the firmware's tail, or scanning), check it and
/// its contents against `model`, write some more, power down, reopen and
/// compare again; and compact the recovered disk, which must not fail.
fn recover_and_verify(
    p: &DiskParams,
    opts: VldOptions,
    mut image: Vec<u8>,
    tail: Option<[u8; SECTOR]>,
    model: &[u8],
    what: &str,
) {
    if let Some(t) = tail {
        image[..SECTOR].copy_from_slice(&t);
    }
    let disk = Arc::new(SimDisk::with_image(p.clone(), 0.0, image));
    let (v, how) =
        Vld::open(disk.clone(), opts).unwrap_or_else(|e| panic!("{what}: open after cut: {e}"));
    assert_eq!(
        tail.is_some(),
        matches!(how, Recovery::Tail { .. }),
        "{what}"
    );
    v.check()
        .unwrap_or_else(|e| panic!("{what}: check after recovery {how:?}: {e}"));
    let got = read_all(&v);
    if let Some(i) = first_diff(&got, model) {
        panic!(
            "{what}: recovery {how:?}: byte {i} (sector {}) differs",
            i / SECTOR
        );
    }
    // The recovered disk compacts cleanly and keeps its contents.
    v.compact(2_000_000.0)
        .unwrap_or_else(|e| panic!("{what}: compaction after recovery: {e}"));
    v.check()
        .unwrap_or_else(|e| panic!("{what}: check after compaction: {e}"));
    let got = read_all(&v);
    if let Some(i) = first_diff(&got, model) {
        panic!("{what}: compaction after recovery: byte {i} differs");
    }
    v.power_down().unwrap();
    drop(v);
    let (v, how) = Vld::open(disk.clone(), opts).unwrap();
    assert!(matches!(how, Recovery::Tail { .. }), "{what}");
    v.check()
        .unwrap_or_else(|e| panic!("{what}: check after reopen: {e}"));
    let got = read_all(&v);
    if let Some(i) = first_diff(&got, model) {
        panic!("{what}: reopened: byte {i} differs");
    }
    // And a crash now (no tail): the scan agrees.
    drop(v);
    let (v, how) = Vld::open(disk, opts).unwrap();
    assert_eq!(how, Recovery::Scan, "{what}");
    v.check()
        .unwrap_or_else(|e| panic!("{what}: check after a second scan: {e}"));
    let got = read_all(&v);
    if let Some(i) = first_diff(&got, model) {
        panic!("{what}: second scan: byte {i} differs");
    }
}

/// A power cut at every media write of a compaction of a fragmented disk
/// (each write torn at a seeded prefix), with the tail and by scan: every
/// block keeps its contents (the compactor only moves), the map and the
/// free space agree, and the recovered disk compacts again.
#[test]
fn a_compaction_cut_at_any_write_loses_nothing() {
    let mut cuts = 0u64;
    for seed in seeds(24) {
        let (p, opts, image, model) = fragmented(seed);
        // How many media writes the uncut compaction makes.
        let mut at = 0u64;
        loop {
            let (disk, v) = reopen(&p, opts, image.clone());
            disk.set_power_cut(Some(PowerCut {
                at_write: at,
                seed: seed ^ at,
            }));
            let r = v.compact(50_000_000.0);
            if !disk.powered_off() {
                r.unwrap_or_else(|e| panic!("seed {seed}: compaction failed uncut: {e}"));
                v.check()
                    .unwrap_or_else(|e| panic!("seed {seed}: check after compaction: {e}"));
                assert!(
                    read_all(&v) == model,
                    "seed {seed}: compaction changed contents"
                );
                break;
            }
            assert!(r.is_err(), "seed {seed}: cut {at} but compact returned Ok");
            cuts += 1;
            let what = format!(
                "seed {seed} (R17_SEED={seed}), bs {}, cut at write {at}",
                opts.block_bytes
            );
            let img = disk.image();
            // With the firmware's tail record, and without (scan).
            recover_and_verify(
                &p,
                opts,
                img.clone(),
                Some(v.tail_record()),
                &model,
                &format!("{what}, tail"),
            );
            recover_and_verify(&p, opts, img, None, &model, &format!("{what}, scan"));
            at += 1 + at / 64; // dense first, then sparser
        }
    }
    println!("{cuts} cuts inside compactions");
}

/// After compaction the writes fill an emptied track; cut there too, and
/// at any write of a write that follows the compaction.
#[test]
fn writes_after_a_compaction_cut_anywhere_are_old_or_new() {
    for seed in seeds(24) {
        let (p, opts, image, model) = fragmented(seed + 1000);
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let (disk, v) = reopen(&p, opts, image);
        v.compact(50_000_000.0).unwrap();
        let size = v.size_bytes();
        let mut model = model;
        let hot = size * 9 / 10;
        disk.set_power_cut(Some(PowerCut {
            at_write: rng.gen_range(0..200),
            seed,
        }));
        for _ in 0..400 {
            let (off, d) = random_write(&mut rng, size, hot);
            let before = model[off as usize..off as usize + d.len()].to_vec();
            if v.write_at(&d, off).is_ok() {
                model[off as usize..off as usize + d.len()].copy_from_slice(&d);
                continue;
            }
            let img = disk.image();
            for tail in [true, false] {
                let mut im = img.clone();
                if tail {
                    im[..SECTOR].copy_from_slice(&v.tail_record());
                }
                let d2 = Arc::new(SimDisk::with_image(p.clone(), 0.0, im));
                let what = format!("seed {seed} tail {tail}");
                let (v2, _) = Vld::open(d2, opts).unwrap_or_else(|e| panic!("{what}: {e}"));
                v2.check().unwrap_or_else(|e| panic!("{what}: {e}"));
                let got = read_all(&v2);
                for s in 0..model.len() / SECTOR {
                    let r = s * SECTOR..(s + 1) * SECTOR;
                    if got[r.clone()] == model[r.clone()] {
                        continue;
                    }
                    let (a, b) = (off as usize, off as usize + d.len());
                    let mut old = model[r.clone()].to_vec();
                    let mut new = model[r.clone()].to_vec();
                    for x in r.start.max(a)..r.end.min(b) {
                        old[x - r.start] = before[x - a];
                        new[x - r.start] = d[x - a];
                    }
                    assert!(
                        got[r.clone()] == old || got[r.clone()] == new,
                        "{what}: sector {s} neither old nor new"
                    );
                }
            }
            return;
        }
    }
}

/// The compactor on full and nearly full fragmented disks, every block
/// size: it returns (no loop), never fails for want of room (it checks the
/// holes first), keeps the contents and leaves the map and free space
/// agreeing; the disk still takes writes afterwards.
#[test]
fn the_compactor_on_a_full_fragmented_disk_never_fails() {
    for seed in seeds(24) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed + 7);
        let p = params(&mut rng);
        let opts = VldOptions {
            seed,
            block_bytes: block_bytes(&mut rng, &p),
            ..VldOptions::default()
        };
        let disk = Arc::new(SimDisk::new(p.clone(), 0.0));
        let v = Vld::create(disk, opts).unwrap();
        let size = v.size_bytes();
        let frac = [1.0, 0.99, 0.97, 0.9][(seed % 4) as usize];
        let hot = ((size as f64 * frac) as u64).max(8192);
        // Everything once, then random overwrites: fragmented.
        let mut model = vec![0u8; size as usize];
        let mut off = 0;
        while off < hot {
            let len = rng.gen_range(1..40_000).min((hot - off) as usize);
            let d = vec![rng.gen::<u8>() | 1; len];
            v.write_at(&d, off).unwrap();
            model[off as usize..off as usize + len].copy_from_slice(&d);
            off += len as u64;
        }
        for _ in 0..600 {
            let (off, d) = random_write(&mut rng, size, hot);
            v.write_at(&d, off).unwrap();
            model[off as usize..off as usize + d.len()].copy_from_slice(&d);
        }
        let what = format!(
            "seed {seed} (R17_SEED={seed}) bs {} fill {frac}",
            opts.block_bytes
        );
        for round in 0..3 {
            v.compact(20_000_000.0)
                .unwrap_or_else(|e| panic!("{what}: compaction {round} failed: {e}"));
            v.check()
                .unwrap_or_else(|e| panic!("{what}: check after compaction {round}: {e}"));
            assert!(
                read_all(&v) == model,
                "{what}: contents after compaction {round}"
            );
            for _ in 0..50 {
                let (off, d) = random_write(&mut rng, size, hot);
                v.write_at(&d, off)
                    .unwrap_or_else(|e| panic!("{what}: write after compaction {round}: {e}"));
                model[off as usize..off as usize + d.len()].copy_from_slice(&d);
            }
        }
    }
}

/// A map sector's crc covers neither its own position nor anything the
/// data path cannot produce, and every fresh format takes the same default
/// disk id: a VLD whose user data holds another VLD's image (a disk image
/// file, a nested test disk) has the inner map sectors adopted by the
/// outer disk's recovery scan when their sequence numbers are higher.
#[test]
fn the_scan_adopts_no_map_sector_stored_as_data() {
    let mut p = DiskParams::paper(PaperDisk::Hp97560);
    p.cylinders = 2;
    // The inner disk: many writes, so high sequence numbers.
    let inner = Arc::new(SimDisk::new(p.clone(), 0.0));
    let a = Vld::create(inner.clone(), VldOptions::default()).unwrap();
    let size = a.size_bytes() as usize;
    for round in 0..6u8 {
        a.write_at(&vec![round + 1; size / 2], 0).unwrap();
    }
    drop(a);
    let image = inner.image();
    // The outer disk: a fresh format, the inner image's first part as data.
    let outer = Arc::new(SimDisk::new(p.clone(), 0.0));
    let b = Vld::create(outer.clone(), VldOptions::default()).unwrap();
    let stored = &image[..size / 2];
    b.write_at(stored, 0).unwrap();
    let mut want = vec![0u8; size];
    want[..stored.len()].copy_from_slice(stored);
    assert!(read_all(&b) == want, "before the crash");
    drop(b); // a crash: the next open scans
    let (b, how) = Vld::open(outer, VldOptions::default())
        .unwrap_or_else(|e| panic!("open after a crash: {e}"));
    assert_eq!(how, Recovery::Scan);
    b.check().unwrap();
    let got = read_all(&b);
    let bad = got
        .chunks(4096)
        .zip(want.chunks(4096))
        .filter(|(x, y)| x != y)
        .count();
    assert_eq!(bad, 0, "blocks not what was written after the scan");
}

mod uip_cuts {
    use super::*;
    use ldfs::ld::{ListHints, LogicalDisk};
    use ldfs::uip::{Uip, UipOptions};
    use std::collections::BTreeMap;

    type Model = BTreeMap<u64, Vec<u8>>;

    fn blob(rng: &mut ChaCha8Rng) -> Vec<u8> {
        let len = [100usize, 512, 1000, 1024, 1500, 2048, 3000, 4096, 5000][rng.gen_range(0..9)];
        let mut d = vec![rng.gen::<u8>(); len];
        d[0] = rng.gen();
        d[len - 1] = rng.gen();
        d
    }

    /// Open what a cut left: on a VLD with its tail or by scan, on the
    /// regular disk as is.
    fn reopen(
        p: &DiskParams,
        image: Vec<u8>,
        vld: Option<&Vld>,
        tail: bool,
        opts: UipOptions,
    ) -> Uip {
        let disk = Arc::new(SimDisk::with_image(p.clone(), 0.0, image));
        let dev: Arc<dyn Device> = match vld {
            Some(v) => {
                if tail {
                    let t = v.tail_record();
                    disk.media_write(0, &t).unwrap();
                }
                Arc::new(Vld::open(disk, VldOptions::default()).unwrap().0)
            }
            None => disk,
        };
        Uip::open(dev, opts).unwrap()
    }

    /// uip writing whole extents, on the regular disk and on a VLD (units
    /// of 1 KiB inside its 4 KiB blocks, so neighbours share a VLD block,
    /// and of 4 KiB): ARUs of 1-4 writes (held overwrites, moves to new
    /// homes, deletes) ended or aborted, and writes outside ARUs; the power
    /// cut at a random media write. After it, every key the interrupted
    /// operation did not touch reads as the model (a whole-extent write
    /// never reaches a neighbour), and each key it touched holds one of
    /// the values it had during that operation.
    #[test]
    fn uip_cuts_touch_only_the_interrupted_operation() {
        for seed in seeds(60) {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let mut p = DiskParams::paper(PaperDisk::Hp97560);
            p.cylinders = 3;
            let on = seed % 3; // 0 regular, 1 VLD 1 KiB units, 2 VLD 4 KiB units
            let opts = UipOptions {
                unit_bytes: if on == 2 { 4096 } else { 1024 },
                units_per_group: 256,
                max_block_bytes: 8192,
                cache_bytes: if seed % 2 == 0 { 0 } else { 1 << 20 },
            };
            let disk = Arc::new(SimDisk::new(p.clone(), 0.0));
            let vld = (on != 0)
                .then(|| Arc::new(Vld::create(disk.clone(), VldOptions::default()).unwrap()));
            let dev: Arc<dyn Device> = match &vld {
                Some(v) => v.clone(),
                None => disk.clone(),
            };
            let u = Uip::create(dev, opts).unwrap();
            let l = u.create_list(None, ListHints::default()).unwrap();
            let mut model: Model = BTreeMap::new();
            let keys = 24u64;
            disk.set_power_cut(Some(PowerCut {
                at_write: rng.gen_range(0..1500),
                seed,
            }));
            let what = format!("seed {seed} (R17_SEED={seed}) on {on}");
            'ops: for _ in 0..2000 {
                // One operation: its keys and every value each had in it.
                let mut seen: BTreeMap<u64, Vec<Option<Vec<u8>>>> = BTreeMap::new();
                let mut next = model.clone();
                let aru = rng.gen_bool(0.6).then(|| u.begin_aru().unwrap());
                let n = if aru.is_some() {
                    rng.gen_range(1..5)
                } else {
                    1
                };
                let mut failed = false;
                for _ in 0..n {
                    let k = rng.gen_range(0..keys);
                    seen.entry(k)
                        .or_insert_with(|| vec![model.get(&k).cloned()]);
                    let r = if rng.gen_bool(0.15) {
                        next.remove(&k);
                        u.delete(aru, l, k)
                    } else {
                        let d = blob(&mut rng);
                        next.insert(k, d.clone());
                        u.write(aru, l, k, &d)
                    };
                    seen.get_mut(&k).unwrap().push(next.get(&k).cloned());
                    if r.is_err() {
                        failed = true;
                        break;
                    }
                }
                if !failed {
                    if let Some(a) = aru {
                        if rng.gen_bool(0.25) {
                            if u.abort_aru(a).is_err() {
                                failed = true;
                            } else {
                                continue 'ops; // model unchanged
                            }
                        } else if u.end_aru(a).is_err() {
                            failed = true;
                        }
                    }
                }
                if !failed {
                    // Reads see the operation.
                    for (k, want) in &next {
                        assert_eq!(
                            u.read(l, *k).unwrap().as_ref(),
                            Some(want),
                            "{what}: key {k}"
                        );
                    }
                    model = next;
                    continue;
                }
                assert!(disk.powered_off(), "{what}: an error without a cut");
                let image = disk.image();
                for tail in [true, false] {
                    if vld.is_none() && !tail {
                        continue;
                    }
                    let u2 = reopen(&p, image.clone(), vld.as_deref(), tail, opts);
                    for k in 0..keys {
                        let got = u2.read(l, k).unwrap();
                        match seen.get(&k) {
                            None => assert_eq!(
                                got.as_ref(),
                                model.get(&k),
                                "{what} tail {tail}: key {k}, untouched by the cut operation"
                            ),
                            Some(vals) => {
                                if vals.contains(&got) {
                                    continue;
                                }
                                // A rewrite in place whose length changed
                                // within its units: the data reached the
                                // extent, the descriptor's length did not
                                // (uip's documented lack of atomicity):
                                // one value's bytes at another's length,
                                // zeros past its end (the whole extent).
                                let g = got.as_ref().expect("a cut never deletes what it did not");
                                // Or torn (a regular disk's sectors, a
                                // VLD's blocks): each sector from one of
                                // its values.
                                let mix = vals.iter().flatten().any(|a| a.len() == g.len())
                                    && g.chunks(SECTOR).enumerate().all(|(i, c)| {
                                        vals.iter().flatten().any(|b| {
                                            let mut x = b.clone();
                                            x.resize(g.len().max(b.len()), 0);
                                            x[i * SECTOR..i * SECTOR + c.len()] == *c
                                        })
                                    });
                                assert!(
                                    mix,
                                    "{what} tail {tail}: key {k} ({} bytes) is none of its values in the cut operation",
                                    g.len()
                                );
                                println!("{what} tail {tail}: key {k}: a mix of its values");
                            }
                        }
                    }
                }
                break;
            }
        }
    }
}

/// 4a24d28 gives a random disk id to a format over a label that does not
/// decode, unless the label is all zeros ("never formatted, or wiped").
/// A disk whose first sectors alone were zeroed (wiping signatures, a
/// `dd` of the first KiB) still holds the old format's map sectors, with
/// the default id the new format takes again: the scan after the first
/// crash adopts them (review 14 F5 by another path).
#[test]
fn a_format_over_a_zeroed_label_scans_none_of_the_old_format() {
    let mut p = DiskParams::paper(PaperDisk::Hp97560);
    p.cylinders = 2;
    let disk = Arc::new(SimDisk::new(p, 0.0));
    let v = Vld::create(disk.clone(), VldOptions::default()).unwrap();
    let size = v.size_bytes() as usize;
    for round in 0..4u8 {
        v.write_at(&vec![round + 1; size / 2], 0).unwrap();
    }
    drop(v);
    // Wipe the first 4 KiB (tail and label).
    disk.media_write(0, &[0u8; 4096]).unwrap();
    let v = Vld::create(disk.clone(), VldOptions::default()).unwrap();
    v.write_at(&[7u8; 4096], 0).unwrap();
    drop(v); // a crash
    let (v, how) = Vld::open(disk, VldOptions::default()).unwrap();
    assert_eq!(how, Recovery::Scan);
    v.check().unwrap();
    let mut back = vec![0u8; size / 2];
    v.read_at(&mut back, 0).unwrap();
    assert!(
        back[..4096].iter().all(|&b| b == 7),
        "the new format's block"
    );
    let stale = back[4096..]
        .chunks(4096)
        .filter(|c| c.iter().any(|&b| b != 0))
        .count();
    assert_eq!(
        stale, 0,
        "blocks the new format never wrote read the old format's contents"
    );
}
