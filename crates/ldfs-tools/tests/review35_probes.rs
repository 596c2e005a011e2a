//! Review 35 probes (issue 16's fs-layer speed changes, branch speed3)
//! through a FUSE mount. Each probe fails while the defect its doc comment
//! names is there; `#[ignore]` marks an open one:
//! `cargo test --release -p ldfs-tools --test review35_probes -- --ignored`.

mod common;

use std::fs;
use std::io::Read;
use std::path::Path;
use std::time::{Duration, Instant};

use common::{fuse_usable, mkfs, Mount};

/// A file handle (name_to_handle_at) as the kernel encodes it, in a
/// buffer with room for any FUSE handle.
#[repr(C)]
struct Handle {
    bytes: u32,
    kind: i32,
    data: [u8; 64],
}

fn handle_of(path: &Path) -> Handle {
    let mut h = Handle {
        bytes: 64,
        kind: 0,
        data: [0; 64],
    };
    let mut mount_id = 0;
    let c = common::cstr(path);
    let r = unsafe {
        libc::name_to_handle_at(
            libc::AT_FDCWD,
            c.as_ptr(),
            (&mut h as *mut Handle).cast(),
            &mut mount_id,
            0,
        )
    };
    assert_eq!(r, 0, "name_to_handle_at: errno {}", common::errno());
    h
}

fn open_handle(dir: &Path, h: &mut Handle) -> Result<fs::File, i32> {
    use std::os::unix::io::{AsRawFd, FromRawFd};
    let mnt = fs::File::open(dir).unwrap();
    let fd = unsafe {
        libc::open_by_handle_at(mnt.as_raw_fd(), (h as *mut Handle).cast(), libc::O_RDONLY)
    };
    if fd < 0 {
        return Err(common::errno());
    }
    Ok(unsafe { fs::File::from_raw_fd(fd) })
}

/// Finding 1 through the kernel: a small file deleted and closed (the
/// kernel evicts it and FORGETs it) can be opened again by its file handle
/// and read, for as long as its destroy waits for a batch (64 more, or a
/// flush: the mount's commit timer, 5 s by default; `commit=60` here makes
/// the window certain): `lookup(ino, ".")` finds the released orphan.
/// Before b6a6ab8 the FORGET destroyed it and the handle was stale at once
/// (ESTALE, as on ext4 and as `linux.rs` documents for a deleted file).
#[test]
fn a_deleted_closed_small_file_is_stale_by_handle() {
    if !fuse_usable() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let img = t.path().join("h.img");
    mkfs(&img, "64M");
    let mnt = t.path().join("mnt");
    let m = Mount::new(&img, &mnt, &["commit=60"]);
    fs::write(m.path("secret"), b"deleted secret").unwrap();
    let mut h = handle_of(&m.path("secret"));
    fs::remove_file(m.path("secret")).unwrap();
    // The kernel evicts the unlinked, closed inode and sends FORGET; give
    // it time (a handle opened meanwhile from its cache is no finding).
    let t0 = Instant::now();
    let outcome = loop {
        match open_handle(&mnt, &mut h) {
            Err(e) => break Err(e),
            Ok(mut f) => {
                let mut s = String::new();
                f.read_to_string(&mut s).unwrap();
                if t0.elapsed() > Duration::from_secs(3) {
                    break Ok(s);
                }
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    m.unmount();
    assert_eq!(
        outcome,
        Err(libc::ESTALE),
        "a deleted, closed file still opens by its handle 3 s later"
    );
}
