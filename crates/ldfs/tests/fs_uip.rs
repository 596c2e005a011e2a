//! The file system over uip (the update-in-place Logical Disk) against the
//! same file system over lld: the same seeded operations on both give the
//! same tree after every one (`LDFS_SEED`, `LDFS_UIP_OPS`, default 600),
//! `Fs::check` is clean on both, and uip reopened from its device gives the
//! tree again. Also: a full uip fails creates and writes with ENOSPC up
//! front, and deletes still work there. And the same over the simulated
//! disks: uip on a VLD on a simulated HP 97560 against lld in memory, and
//! lld on a VLD, each surviving a power-down and reopen.

use std::sync::Arc;

use ldfs::device::sim::{DiskParams, PaperDisk, SimDisk};
use ldfs::device::vld::{Recovery, Vld, VldOptions};
use ldfs::device::MemoryDevice;
use ldfs::fs::{Fs, FsError, FsOptions, ROOT_INO};
use ldfs::ld::LogicalDisk;
use ldfs::lld::layout::MkfsOptions;
use ldfs::lld::{Lld, LldOptions};
use ldfs::uip::{Uip, UipOptions};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

mod common;

use common::{op, snapshot, CTX};

fn seed() -> u64 {
    std::env::var("LDFS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(15)
}

fn ops() -> u64 {
    std::env::var("LDFS_UIP_OPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(600)
}

fn mount(ld: Arc<dyn LogicalDisk>) -> Fs {
    Fs::mount(ld, FsOptions::default()).unwrap()
}

#[test]
fn fs_over_uip_matches_fs_over_lld() {
    let seed = seed();
    let lld = Lld::create(
        Arc::new(MemoryDevice::new(64 << 20)),
        &MkfsOptions::default(),
        LldOptions::default(),
    )
    .unwrap();
    Fs::format(&lld, CTX).unwrap();
    let on_lld = mount(Arc::new(lld));
    let dev = Arc::new(MemoryDevice::new(64 << 20));
    let uip = Uip::create(dev.clone(), UipOptions::default()).unwrap();
    Fs::format(&uip, CTX).unwrap();
    let on_uip = mount(Arc::new(uip));
    let mut rng_a = ChaCha8Rng::seed_from_u64(seed);
    let mut rng_b = ChaCha8Rng::seed_from_u64(seed);
    let (mut log, mut states) = (Vec::new(), Vec::new());
    for i in 0..ops() {
        op(&on_lld, &mut rng_a, &mut log, &mut states);
        let n = log.len();
        op(&on_uip, &mut rng_b, &mut log, &mut states);
        states.clear();
        let (a, b) = (snapshot(&on_lld), snapshot(&on_uip));
        assert!(
            a == b && log[..n] == log[n..],
            "seed {seed} (LDFS_SEED={seed}), op {i}: trees differ\n{:?}\nlld {a:?}\nuip {b:?}",
            &log[n..]
        );
        log.clear();
    }
    let want = snapshot(&on_uip);
    for fs in [&on_lld, &on_uip] {
        let r = fs.check().unwrap();
        assert!(r.problems.is_empty(), "seed {seed}: {:?}", r.problems);
    }
    on_uip.fsync().unwrap();
    drop(on_uip);
    let again = mount(Arc::new(Uip::open(dev, UipOptions::default()).unwrap()));
    assert!(
        snapshot(&again) == want,
        "seed {seed}: tree changed by a reopen"
    );
    let r = again.check().unwrap();
    assert!(r.problems.is_empty(), "seed {seed}: {:?}", r.problems);
}

#[test]
fn full_uip_is_enospc_up_front_and_deletes_work() {
    let dev = Arc::new(MemoryDevice::new(8 << 20));
    let uip = Uip::create(dev, UipOptions::default()).unwrap();
    Fs::format(&uip, CTX).unwrap();
    let fs = mount(Arc::new(uip));
    let chunk = vec![0x5au8; 40 << 10];
    for cycle in 0..3 {
        let mut n = 0;
        loop {
            let name = format!("f{n}");
            let f = match fs.mknod(CTX, ROOT_INO, name.as_bytes(), 0o100644, 0) {
                Ok(a) => a.ino,
                Err(FsError::NoSpace { .. }) => break,
                Err(e) => panic!("create {name}: {e:?}"),
            };
            match fs.write(f, 0, &chunk) {
                Ok(_) => n += 1,
                Err(FsError::NoSpace { .. }) => {
                    assert_eq!(
                        fs.getattr(f).unwrap().size,
                        0,
                        "a failed write changed nothing"
                    );
                    fs.unlink(ROOT_INO, name.as_bytes()).unwrap();
                    break;
                }
                Err(e) => panic!("write {name}: {e:?}"),
            }
        }
        assert!(n > 50, "cycle {cycle}: only {n} files fit");
        for i in 0..n {
            fs.unlink(ROOT_INO, format!("f{i}").as_bytes()).unwrap();
        }
        let r = fs.check().unwrap();
        assert!(r.problems.is_empty(), "cycle {cycle}: {:?}", r.problems);
    }
}

fn vld_on(disk: PaperDisk) -> (Arc<SimDisk>, Arc<Vld>) {
    let sim = Arc::new(SimDisk::new(DiskParams::paper(disk), 0.0));
    let vld = Arc::new(Vld::create(sim.clone(), VldOptions::default()).unwrap());
    (sim, vld)
}

#[test]
fn fs_over_uip_on_a_vld_matches_fs_over_lld() {
    let seed = seed();
    let lld = Lld::create(
        Arc::new(MemoryDevice::new(64 << 20)),
        &MkfsOptions::default(),
        LldOptions::default(),
    )
    .unwrap();
    Fs::format(&lld, CTX).unwrap();
    let on_lld = mount(Arc::new(lld));
    let (sim, vld) = vld_on(PaperDisk::Hp97560);
    let uip = Uip::create(vld.clone(), UipOptions::default()).unwrap();
    Fs::format(&uip, CTX).unwrap();
    let on_vld = mount(Arc::new(uip));
    let mut rng_a = ChaCha8Rng::seed_from_u64(seed);
    let mut rng_b = ChaCha8Rng::seed_from_u64(seed);
    let (mut log, mut states) = (Vec::new(), Vec::new());
    for i in 0..ops() / 3 {
        op(&on_lld, &mut rng_a, &mut log, &mut states);
        let n = log.len();
        op(&on_vld, &mut rng_b, &mut log, &mut states);
        states.clear();
        assert!(
            snapshot(&on_lld) == snapshot(&on_vld) && log[..n] == log[n..],
            "seed {seed} (LDFS_SEED={seed}), op {i}: trees differ: {:?}",
            &log[n..]
        );
        log.clear();
    }
    let want = snapshot(&on_vld);
    on_vld.fsync().unwrap();
    drop(on_vld);
    vld.check().unwrap();
    vld.power_down().unwrap();
    drop(vld);
    let (vld, how) = Vld::open(sim, VldOptions::default()).unwrap();
    assert!(matches!(how, Recovery::Tail { .. }));
    let again = mount(Arc::new(
        Uip::open(Arc::new(vld), UipOptions::default()).unwrap(),
    ));
    assert!(
        snapshot(&again) == want,
        "seed {seed}: tree changed by a power-down"
    );
    let r = again.check().unwrap();
    assert!(r.problems.is_empty(), "seed {seed}: {:?}", r.problems);
}

#[test]
fn fs_over_lld_on_a_vld_survives_a_power_down() {
    let seed = seed();
    let (sim, vld) = vld_on(PaperDisk::St19101);
    let mk = MkfsOptions {
        segment_bytes: 512 << 10,
        ..MkfsOptions::default()
    };
    let lld = Lld::create(vld.clone(), &mk, LldOptions::default()).unwrap();
    Fs::format(&lld, CTX).unwrap();
    let lld = Arc::new(lld);
    let fs = mount(lld.clone());
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let (mut log, mut states) = (Vec::new(), Vec::new());
    for _ in 0..ops() / 3 {
        op(&fs, &mut rng, &mut log, &mut states);
        states.clear();
    }
    let want = snapshot(&fs);
    fs.fsync().unwrap();
    drop(fs);
    lld.close().unwrap();
    drop(lld);
    vld.power_down().unwrap();
    drop(vld);
    let (vld, _) = Vld::open(sim, VldOptions::default()).unwrap();
    let lld = Lld::open(Arc::new(vld), LldOptions::default()).unwrap();
    let fs = mount(Arc::new(lld));
    assert!(
        snapshot(&fs) == want,
        "seed {seed}: tree changed by a power-down"
    );
    let r = fs.check().unwrap();
    assert!(r.problems.is_empty(), "seed {seed}: {:?}", r.problems);
}
