//! Review 25 probes of resize (commit c856457, issue 17): crash during an
//! online grow with writers, a "block device" (resize() == false) shrink
//! followed by the storage shrinking, a rerun after a shrink cut before its
//! truncate, the library default setting the RESIZE flag, and two online
//! grows at once.

mod common;

use std::sync::Arc;

use ldfs::device::{CrashDevice, CrashOptions, Device, DeviceError, MemoryDevice};
use ldfs::fs::{Ctx, Fs, FsOptions, ROOT_INO};
use ldfs::fsck::{self, FsckOptions};
use ldfs::ld::LogicalDisk;
use ldfs::lld::layout::{Geometry, MkfsOptions, INCOMPAT_RESIZE};
use ldfs::lld::{resize_offline, Lld, LldOptions};

const CTX: Ctx = Ctx {
    uid: 0,
    gid: 0,
    umask: 0,
};
const SEG: u64 = 256 << 10;

fn mkfs(max_bytes: Option<u64>) -> MkfsOptions {
    MkfsOptions {
        segment_bytes: SEG,
        max_block_bytes: 64 << 10,
        reserved_segments: Some(4),
        fs_id: 0x5e5e,
        max_bytes,
        kept_pages: 0,
    }
}

fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

type Files = Vec<(String, Vec<u8>)>;

fn write_files(fs: &Fs, prefix: &str, n: usize, bytes: usize, seed: u64) -> Files {
    let mut out = Vec::new();
    for i in 0..n {
        let name = format!("{prefix}{i}");
        let data = noise(seed * 1000 + i as u64, bytes);
        let Ok(a) = fs.mknod(CTX, ROOT_INO, name.as_bytes(), 0o100644, 0) else {
            break;
        };
        if fs.write(a.ino, 0, &data).is_err() {
            break;
        }
        out.push((name, data));
    }
    out
}

/// A closed image whose live files sit in its upper segments.
fn image(dev: Arc<dyn Device>, max_bytes: Option<u64>, live: usize) -> Files {
    let lld = Arc::new(Lld::create(dev, &mkfs(max_bytes), LldOptions::default()).unwrap());
    Fs::format(&*lld, CTX).unwrap();
    let ld: Arc<dyn LogicalDisk> = lld.clone();
    let fs = Fs::mount(ld, FsOptions::default()).unwrap();
    let early = write_files(&fs, "early", live / 8192, 8192, 1);
    let files = write_files(&fs, "f", live / 8192, 8192, 2);
    for (name, _) in &early {
        fs.unlink(ROOT_INO, name.as_bytes()).unwrap();
    }
    drop(fs);
    lld.close().unwrap();
    files
}

/// Opens `dev`, checks every file of `files` (others may be there too),
/// closes; returns the segment count. Panics with `what` on a failure.
fn check(dev: Arc<dyn Device>, files: &Files, what: &str) -> u32 {
    let lld = Arc::new(
        Lld::open(dev, LldOptions::default()).unwrap_or_else(|e| panic!("{what}: open: {e}")),
    );
    assert!(!lld.open_report().rebuilt, "{what}: rebuilt");
    let ld: Arc<dyn LogicalDisk> = lld.clone();
    let fs = Fs::mount(ld, FsOptions::default()).unwrap_or_else(|e| panic!("{what}: mount: {e}"));
    for (name, data) in files {
        let a = fs
            .lookup(ROOT_INO, name.as_bytes())
            .unwrap_or_else(|e| panic!("{what}: {name}: {e}"));
        let got = fs.read(a.ino, 0, data.len() as u32 + 1).unwrap();
        assert!(got == *data, "{what}: {name} differs");
    }
    let n = lld.geometry().segment_count;
    drop(fs);
    lld.close().unwrap();
    n
}

fn fsck_clean(dev: Arc<dyn Device>, what: &str) {
    let f = fsck::check(dev, &FsckOptions::default()).unwrap();
    assert!(f.is_clean(), "{what}: fsck: {:#?}", f.lines());
}

/// Online grow (`Lld::grow`) with writers before and after it, the power
/// cut at every device operation from the grow on: every crash image must
/// open from a checkpoint with the files of the base image, at the old or
/// the new count, and fsck clean. (The offline crash test in resize.rs
/// never crashes an online grow.)
#[test]
fn probe_crash_anywhere_in_an_online_grow_with_writers() {
    let base_dev = Arc::new(MemoryDevice::new(8 << 20));
    let files = image(base_dev.clone(), Some(64 << 20), 1 << 20);
    let base = base_dev.snapshot();
    let old = check(
        Arc::new(MemoryDevice::from_vec(base.clone())),
        &files,
        "base",
    );
    let seed = common::base_seed();
    let mut n = 0u64;
    let mut new = 0;
    loop {
        let dev = Arc::new(CrashDevice::from_image(base.clone()));
        let lld = Arc::new(Lld::open(dev.clone(), LldOptions::default()).unwrap());
        let ld: Arc<dyn LogicalDisk> = lld.clone();
        let fs = Fs::mount(ld, FsOptions::default()).unwrap();
        let _ = write_files(&fs, "pre", 16, 8192, 7);
        dev.cut_power_after(n);
        let grown = lld.grow(Some(16 << 20));
        if let Ok(r) = &grown {
            new = r.new_segments;
        }
        let _ = write_files(&fs, "post", 96, 8192, 8);
        let _ = lld.checkpoint_now();
        drop(fs);
        let _ = lld.close();
        drop(lld);
        if !dev.power_is_cut() {
            eprintln!("online grow: {n} cut points");
            assert!(grown.is_ok(), "{grown:?}");
            let d: Arc<dyn Device> = Arc::new(MemoryDevice::from_vec(dev.durable_image()));
            assert_eq!(check(d.clone(), &files, "completed"), new);
            fsck_clean(d, "completed");
            return;
        }
        for s in 0..2u64 {
            let what = format!(
                "online grow cut after {n} operations, crash seed {}",
                seed + s
            );
            let img = dev.crash_image(
                seed + s,
                &CrashOptions {
                    keep_probability: 0.5,
                    tear_probability: 0.3,
                },
            );
            let d: Arc<dyn Device> = Arc::new(MemoryDevice::from_vec(img));
            let got = check(d.clone(), &files, &what);
            let want_new = ldfs::lld::resize::segments_for_size(
                &Lld::open(
                    d.clone(),
                    LldOptions {
                        read_only: true,
                        ..Default::default()
                    },
                )
                .unwrap()
                .geometry(),
                16 << 20,
            )
            .unwrap();
            assert!(
                got == old || got == want_new,
                "{what}: {got} segments, not {old} or {want_new}"
            );
            fsck_clean(d, &what);
        }
        n += 1;
    }
}

/// A device whose size is not ldfs's to set (as a block device: `resize`
/// answers false), shrinkable from outside like an LV.
struct BlockLike(std::sync::Mutex<Vec<u8>>);

impl Device for BlockLike {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), DeviceError> {
        let v = self.0.lock().unwrap();
        buf.copy_from_slice(&v[offset as usize..offset as usize + buf.len()]);
        Ok(())
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), DeviceError> {
        let mut v = self.0.lock().unwrap();
        v[offset as usize..offset as usize + buf.len()].copy_from_slice(buf);
        Ok(())
    }
    fn flush(&self) -> Result<(), DeviceError> {
        Ok(())
    }
    fn size_bytes(&self) -> u64 {
        self.0.lock().unwrap().len() as u64
    }
}

/// F1: `resize_offline` to a smaller size on a device it cannot resize (a
/// block device) is accepted; it writes superblock copy 1 at the device's
/// present last page and copy 0 with total_pages = the present size. When
/// the storage is then shrunk to the size asked for (what a shrink of a
/// block device is for), copy 0 fails its "total pages <= device" bound and
/// copy 1 was cut away: the image no longer opens.
#[test]
fn probe_block_device_shrink_then_storage_shrinks() {
    let mem = Arc::new(MemoryDevice::new(32 << 20));
    let files = image(mem.clone(), Some(256 << 20), 4 << 20);
    let dev = Arc::new(BlockLike(std::sync::Mutex::new(mem.snapshot())));
    let r = resize_offline(dev.clone(), Some(16 << 20), LldOptions::default());
    let r = r.expect("the shrink of a block-like device is accepted");
    eprintln!("block-like shrink: {r}");
    // The storage shrinks to the size the shrink was asked for.
    let mut img = dev.0.lock().unwrap().clone();
    img.truncate(16 << 20);
    let d: Arc<dyn Device> = Arc::new(MemoryDevice::from_vec(img));
    check(d.clone(), &files, "block device shrunk after ldfs resize");
    fsck_clean(d, "block device shrunk");
}

/// F2: a shrink cut after its copy 0 but before its truncate leaves the
/// file at the old size with the new count. resize.rs says "a rerun
/// trims"; a rerun to the same size answers "nothing to do" instead and
/// the file keeps its old length.
#[test]
fn probe_rerun_after_a_shrink_cut_before_its_truncate_trims() {
    let mem = Arc::new(MemoryDevice::new(16 << 20));
    let files = image(mem.clone(), Some(64 << 20), 2 << 20);
    let base = mem.snapshot();
    let mut n = 0u64;
    let mut prev: Option<Vec<u8>> = None;
    loop {
        let dev = Arc::new(CrashDevice::from_image(base.clone()));
        dev.cut_power_after(n);
        if resize_offline(dev.clone(), Some(8 << 20), LldOptions::default()).is_ok() {
            break;
        }
        prev = Some(dev.durable_image());
        n += 1;
    }
    // The last cut is at the truncate: everything before it durable.
    let img = prev.unwrap();
    assert_eq!(img.len(), 16 << 20, "the last cut is before the truncate");
    let d = Arc::new(MemoryDevice::from_vec(img));
    let count = check(d.clone(), &files, "cut before truncate");
    let r = resize_offline(d.clone(), Some(8 << 20), LldOptions::default());
    assert!(r.is_ok(), "rerun ({count} segments): {:?}", r.err());
    assert_eq!(d.size_bytes(), 8 << 20);
}

/// F3: with `max_bytes: None` (the library default, and `ldfs mkfs
/// --max-size SIZE` equal to the size) the commit says no flag is set, but
/// the slots are sized from the rough count before the metadata is taken
/// off: where that crosses a table page, `incompat` gets RESIZE anyway and
/// older binaries refuse the image.
#[test]
fn probe_default_mkfs_sets_no_flag() {
    let opts = MkfsOptions {
        segment_bytes: 64 << 10,
        max_block_bytes: 16 << 10,
        reserved_segments: Some(4),
        fs_id: 1,
        max_bytes: None,
        kept_pages: 0,
    };
    let mut flagged = Vec::new();
    let mut size = 4u64 << 20;
    while size <= 80 << 20 {
        if let Ok(g) = Geometry::plan(size, &opts) {
            if g.incompat & INCOMPAT_RESIZE != 0 {
                flagged.push((size, g.segment_count, g.checkpoint_pages));
            }
        }
        size += 4096;
    }
    assert!(
        flagged.is_empty(),
        "flagged without --max-size: {:?}",
        &flagged[..flagged.len().min(4)]
    );
}

/// A memory device whose `resize` to `slow_at` bytes takes a while (a slow
/// `set_len` + `fsync`).
struct SlowResize {
    inner: MemoryDevice,
    slow_at: u64,
}

impl Device for SlowResize {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), DeviceError> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), DeviceError> {
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> Result<(), DeviceError> {
        self.inner.flush()
    }
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn resize(&self, bytes: u64) -> Result<bool, DeviceError> {
        if bytes == self.slow_at {
            std::thread::sleep(std::time::Duration::from_millis(300));
        }
        self.inner.resize(bytes)
    }
}

/// F4: two online grows at once (`Lld::grow`, the daemon's `resize`
/// command): each checks its size against the geometry it read first, then
/// sets the device's length outside any lock. The smaller one, whose
/// `set_len` lands after the larger one committed, truncates the device
/// under segments a durable slot counts; its `grow_segments` then returns
/// the larger geometry and its copy 0 is written with it. The image is
/// left with a count the device does not hold.
#[test]
fn probe_two_online_grows_at_once() {
    let mem = Arc::new(MemoryDevice::new(8 << 20));
    let files = image(mem.clone(), Some(256 << 20), 1 << 20);
    let dev = Arc::new(SlowResize {
        inner: MemoryDevice::from_vec(mem.snapshot()),
        slow_at: 32 << 20,
    });
    let lld = Arc::new(Lld::open(dev.clone(), LldOptions::default()).unwrap());
    let barrier = Arc::new(std::sync::Barrier::new(2));
    let (l2, b2) = (lld.clone(), barrier.clone());
    let small = std::thread::spawn(move || {
        b2.wait();
        l2.grow(Some(32 << 20))
    });
    barrier.wait();
    let big = lld.grow(Some(64 << 20));
    let small = small.join().unwrap();
    eprintln!("64M: {big:?}\n32M: {small:?}");
    let g = lld.geometry();
    let end = (g.first_segment_page + g.segment_count as u64 * g.segment_pages as u64) * 4096;
    let _ = lld.close();
    drop(lld);
    assert!(
        end < dev.size_bytes(),
        "{} segments end at byte {end}, the device holds {}",
        g.segment_count,
        dev.size_bytes()
    );
    let d: Arc<dyn Device> = Arc::new(MemoryDevice::from_vec(dev.inner.snapshot()));
    check(d, &files, "after two grows at once");
}
