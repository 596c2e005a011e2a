//! A small file system image, damaged as the input says (bytes flipped in
//! pages that hold something), opened by the engine, mounted by the file
//! system, walked, changed and checked as the rest of the input says. Any
//! of it may fail with an error; none of it may panic or hang.
#![no_main]
use std::sync::{Arc, OnceLock};

use ldfs::device::CrashDevice;
use ldfs::fs::{Ctx, Fs, FsOptions, RenameFlags, XattrMode, ROOT_INO};
use ldfs::ld::LogicalDisk;
use ldfs::lld::layout::MkfsOptions;
use ldfs::lld::{Lld, LldOptions, PAGE_BYTES};
use libfuzzer_sys::fuzz_target;

const CTX: Ctx = Ctx {
    uid: 0,
    gid: 0,
    umask: 0,
};

fn lld_opts() -> LldOptions {
    LldOptions {
        map_budget_bytes: 256 << 10,
        partial_bytes: 64 << 10,
        ..Default::default()
    }
}

/// The undamaged image and the pages of it that hold anything.
fn base() -> &'static (Vec<u8>, Vec<usize>) {
    static BASE: OnceLock<(Vec<u8>, Vec<usize>)> = OnceLock::new();
    BASE.get_or_init(|| {
        let mkfs = MkfsOptions {
            segment_bytes: 256 << 10,
            max_block_bytes: 64 << 10,
            reserved_segments: Some(4),
            fs_id: 5,
            max_bytes: None,
            kept_pages: 0,
        };
        let dev = Arc::new(CrashDevice::new(8 << 20));
        {
            let lld = Arc::new(Lld::create(dev.clone(), &mkfs, lld_opts()).unwrap());
            Fs::format(&*lld, CTX).unwrap();
            let ld: Arc<dyn LogicalDisk> = lld.clone();
            let fs = Fs::mount(ld, FsOptions::default()).unwrap();
            let d = fs.mkdir(CTX, ROOT_INO, b"dir", 0o755).unwrap().ino;
            for i in 0..12u64 {
                let f = fs
                    .mknod(CTX, d, format!("f{i}").as_bytes(), 0o100644, 0)
                    .unwrap()
                    .ino;
                let len = [10usize, 5000, 40_000][i as usize % 3];
                let data: Vec<u8> = (0..len).map(|k| (k as u64 * 7 + i) as u8).collect();
                fs.write(f, 0, &data).unwrap();
                if i % 4 == 0 {
                    fs.setxattr(f, b"user.k", b"value", XattrMode::Any).unwrap();
                }
            }
            fs.symlink(CTX, ROOT_INO, b"link", b"dir/f1").unwrap();
            fs.link(fs.lookup(d, b"f2").unwrap().ino, ROOT_INO, b"hard")
                .unwrap();
            fs.fsync().unwrap();
            drop(fs);
            lld.close().unwrap();
        }
        let img = dev.durable_image();
        let used = img
            .chunks(PAGE_BYTES)
            .enumerate()
            .filter(|(_, p)| p.iter().any(|&b| b != 0))
            .map(|(i, _)| i)
            .collect();
        (img, used)
    })
}

/// Reads everything reachable, depth- and count-bounded.
fn walk(fs: &Fs) {
    let mut stack = vec![ROOT_INO];
    let mut visited = 0;
    while let Some(d) = stack.pop() {
        let mut off = 0;
        for _ in 0..64 {
            let Ok(ents) = fs.readdir(d, off, 32) else {
                break;
            };
            if ents.is_empty() {
                break;
            }
            for e in ents {
                off = e.next;
                visited += 1;
                if visited > 200 || e.name == b"." || e.name == b".." {
                    continue;
                }
                let Ok(a) = fs.getattr(e.ino) else { continue };
                match a.kind {
                    ldfs::fs::inode::Kind::Dir => stack.push(e.ino),
                    ldfs::fs::inode::Kind::File => {
                        let _ = fs.read(e.ino, 0, a.size.min(1 << 20) as u32);
                    }
                    ldfs::fs::inode::Kind::Symlink => {
                        let _ = fs.readlink(e.ino);
                    }
                    _ => {}
                }
                let _ = fs.listxattr(e.ino);
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let (img, used) = base();
    let mut img = img.clone();
    let flips = data.first().map_or(0, |b| (b % 16) as usize);
    let mut rest = data.get(1..).unwrap_or(&[]);
    for _ in 0..flips {
        let Some((f, r)) = rest.split_first_chunk::<5>() else {
            break;
        };
        rest = r;
        let page = used[u16::from_le_bytes([f[0], f[1]]) as usize % used.len()];
        let at = page * PAGE_BYTES + u16::from_le_bytes([f[2], f[3]]) as usize % PAGE_BYTES;
        img[at] ^= f[4].max(1);
    }
    let dev = Arc::new(CrashDevice::from_image(img));
    let Ok(lld) = Lld::open(dev, lld_opts()) else {
        return;
    };
    let lld = Arc::new(lld);
    let ld: Arc<dyn LogicalDisk> = lld.clone();
    let Ok(fs) = Fs::mount(ld, FsOptions::default()) else {
        return;
    };
    walk(&fs);
    let _ = fs.check();
    // Changes, as the rest of the input says.
    let dir = fs
        .lookup(ROOT_INO, b"dir")
        .map(|a| a.ino)
        .unwrap_or(ROOT_INO);
    for op in rest.chunks(3).take(32) {
        let name = format!("f{}", op.get(1).copied().unwrap_or(0) % 16);
        let name = name.as_bytes();
        match op[0] % 8 {
            0 => {
                let _ = fs.mknod(CTX, dir, name, 0o100644, 0);
            }
            1 => {
                if let Ok(a) = fs.lookup(dir, name) {
                    let _ = fs.write(
                        a.ino,
                        op.get(2).copied().unwrap_or(0) as u64 * 997,
                        &[9; 3000],
                    );
                }
            }
            2 => {
                let _ = fs.unlink(dir, name);
            }
            3 => {
                let _ = fs.rename(dir, name, ROOT_INO, b"moved", RenameFlags::default());
            }
            4 => {
                let _ = fs.mkdir(CTX, dir, name, 0o755);
            }
            5 => {
                let _ = fs.rmdir(ROOT_INO, b"dir");
            }
            6 => {
                let _ = fs.fsync();
            }
            _ => walk(&fs),
        }
    }
    let _ = fs.fsync();
    let _ = fs.check();
    drop(fs);
    let _ = lld.close();
});
