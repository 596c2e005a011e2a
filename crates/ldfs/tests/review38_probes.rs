//! Review 38 probes: the batched destroys of released orphans
//! (`State::released`, `Fs::write_kept`, `Fs::destroy_released`) against
//! the file system turning read-only.
//!
//! Each probe fails if the defect it names exists; an ignored one shows an
//! open defect (its `ignore` names the finding):
//! - `write_kept` (every fsync, checkpoint, snapshot and unmount) and
//!   `destroy_released` (an operation short of space) check that the file
//!   system is writable before they take the state lock, not under it: an
//!   operation holding the lock that finds metadata corrupt turns the file
//!   system read-only (`Fs::damaged`), and the waiting `write_kept` then
//!   writes a destroy ARU to it all the same (finding 1). `unpin` checks
//!   under the lock; `set_read_only(true)` is open to the same window
//!   (a flag stored between the check and the lock), but only by a
//!   preemption there, which no test makes deterministic.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use ldfs::device::MemoryDevice;
use ldfs::fs::{Fs, FsOptions, ROOT_INO};
use ldfs::ld::{AruId, LdResult, ListHints, ListId, LogicalDisk, SpaceStats};
use ldfs::lld::layout::MkfsOptions;
use ldfs::lld::{Lld, LldOptions};

mod common;

use common::CTX;

const INODE_LIST: ListId = ListId(2);
const ORPHAN_LIST: ListId = ListId(3);

/// An LD that forwards to lld, but for one inode record's read: it holds
/// it (the caller keeps the fs's state lock meanwhile) until let go, and
/// returns it cut short (metadata found corrupt). Counts the
/// changes made after `armed` (begin_aru, writes, deletes).
struct Hooked {
    inner: Arc<Lld>,
    /// The inode whose record read is held and corrupted (0: none).
    target: AtomicU64,
    /// (held now, let go)
    gate: Mutex<(bool, bool)>,
    cv: Condvar,
    armed: AtomicBool,
    changes: AtomicU64,
}

impl Hooked {
    fn changed(&self) {
        if self.armed.load(Ordering::SeqCst) {
            self.changes.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn wait_held(&self) {
        let mut g = self.gate.lock().unwrap();
        while !g.0 {
            g = self.cv.wait(g).unwrap();
        }
    }

    fn let_go(&self) {
        self.gate.lock().unwrap().1 = true;
        self.cv.notify_all();
    }
}

impl LogicalDisk for Hooked {
    fn max_block_bytes(&self) -> usize {
        self.inner.max_block_bytes()
    }
    fn create_list(&self, aru: Option<AruId>, hints: ListHints) -> LdResult<ListId> {
        self.changed();
        self.inner.create_list(aru, hints)
    }
    fn delete_list(&self, aru: Option<AruId>, list: ListId) -> LdResult<()> {
        self.changed();
        self.inner.delete_list(aru, list)
    }
    fn list_hints(&self, list: ListId) -> LdResult<Option<ListHints>> {
        self.inner.list_hints(list)
    }
    fn write(&self, aru: Option<AruId>, list: ListId, index: u64, data: &[u8]) -> LdResult<()> {
        self.changed();
        self.inner.write(aru, list, index, data)
    }
    fn read(&self, list: ListId, index: u64) -> LdResult<Option<Vec<u8>>> {
        let r = self.inner.read(list, index)?;
        if list == INODE_LIST && index == self.target.load(Ordering::SeqCst) {
            let mut g = self.gate.lock().unwrap();
            g.0 = true;
            self.cv.notify_all();
            while !g.1 {
                g = self.cv.wait(g).unwrap();
            }
            // Cut short: no record decodes from it.
            return Ok(r.map(|b| b[..3].to_vec()));
        }
        Ok(r)
    }
    fn delete(&self, aru: Option<AruId>, list: ListId, index: u64) -> LdResult<()> {
        self.changed();
        self.inner.delete(aru, list, index)
    }
    fn delete_range(&self, aru: Option<AruId>, list: ListId, range: Range<u64>) -> LdResult<()> {
        self.changed();
        self.inner.delete_range(aru, list, range)
    }
    fn indices(&self, list: ListId, from: u64, limit: usize) -> LdResult<Vec<u64>> {
        self.inner.indices(list, from, limit)
    }
    fn lists(&self, from: u64, limit: usize) -> LdResult<Vec<ListId>> {
        self.inner.lists(from, limit)
    }
    fn prefetch(&self, list: ListId) -> LdResult<()> {
        self.inner.prefetch(list)
    }
    fn begin_aru(&self) -> LdResult<AruId> {
        self.changed();
        self.inner.begin_aru()
    }
    fn end_aru(&self, aru: AruId) -> LdResult<()> {
        self.inner.end_aru(aru)
    }
    fn abort_aru(&self, aru: AruId) -> LdResult<()> {
        self.inner.abort_aru(aru)
    }
    fn reserve(&self, aru: AruId, bytes: u64) -> LdResult<()> {
        self.inner.reserve(aru, bytes)
    }
    fn reserve_freeing(&self, aru: AruId, bytes: u64) -> LdResult<()> {
        self.inner.reserve_freeing(aru, bytes)
    }
    fn flush(&self) -> LdResult<()> {
        self.inner.flush()
    }
    fn flush_list(&self, list: ListId) -> LdResult<()> {
        self.inner.flush_list(list)
    }
    fn space(&self) -> SpaceStats {
        self.inner.space()
    }
}

fn lld() -> Arc<Lld> {
    let mkfs = MkfsOptions {
        segment_bytes: 256 << 10,
        max_block_bytes: 64 << 10,
        reserved_segments: Some(8),
        fs_id: 38,
        max_bytes: None,
        kept_pages: 0,
    };
    let opts = LldOptions {
        checkpoint_thread: false,
        log_writer_thread: false,
        ..Default::default()
    };
    let lld = Lld::create(Arc::new(MemoryDevice::new(16 << 20)), &mkfs, opts).unwrap();
    Fs::format(&lld, CTX).unwrap();
    Arc::new(lld)
}

/// Finding 1: an fsync (`write_kept`) that passed its writable check while
/// another operation held the state lock destroys the released orphans
/// after that operation found metadata corrupt and turned the file system
/// read-only: a destroy ARU written to a file system every later write is
/// refused on (DESIGN: corruption "turns the file system read-only").
/// Deterministic: the corrupt read is held until the fsync waits for the
/// lock. Fix: in `write_kept` and `destroy_released`, check writability
/// (and that `released` is not empty) again once the lock is had, as
/// `unpin` does.
#[test]
fn released_orphans_are_not_destroyed_by_an_fsync_after_the_fs_turned_read_only() {
    not_destroyed_after_damage(|fs| {
        let _ = fs.fsync();
    });
}

/// Finding 1 through `destroy_released` (`FuseFs::room`: an operation that
/// found no space destroys the released orphans and tries again).
#[test]
fn released_orphans_are_not_destroyed_for_room_after_the_fs_turned_read_only() {
    not_destroyed_after_damage(|fs| {
        let _ = fs.destroy_released();
    });
}

/// `late` runs while an operation holding the state lock reads a corrupt
/// inode record; it must write nothing once that made the fs read-only.
fn not_destroyed_after_damage(late: fn(&Fs)) {
    let inner = lld();
    let hooked = Arc::new(Hooked {
        inner: inner.clone(),
        target: AtomicU64::new(0),
        gate: Mutex::new((false, false)),
        cv: Condvar::new(),
        armed: AtomicBool::new(false),
        changes: AtomicU64::new(0),
    });
    let ld: Arc<dyn LogicalDisk> = hooked.clone();
    // Made in one mount, so the next one has not read the record of `bad`.
    let (bad, small) = {
        let fs = Fs::mount(ld.clone(), FsOptions::default()).unwrap();
        let bad = fs.mknod(CTX, ROOT_INO, b"bad", 0o100644, 0).unwrap().ino;
        let small = fs.mknod(CTX, ROOT_INO, b"s", 0o100644, 0).unwrap().ino;
        fs.write(small, 0, b"small").unwrap();
        fs.fsync().unwrap();
        (bad, small)
    };
    let fs = Arc::new(Fs::mount(ld.clone(), FsOptions::default()).unwrap());
    // Looked up by the kernel, unlinked, forgotten: its destroy waits.
    assert_eq!(fs.lookup(ROOT_INO, b"s").unwrap().ino, small);
    fs.pin(small, 1);
    fs.unlink(ROOT_INO, b"s").unwrap();
    fs.unpin(small, 1).unwrap();
    let orphans = || inner.indices(ORPHAN_LIST, 0, usize::MAX).unwrap();
    assert_eq!(orphans(), vec![small], "not waiting for its batch");
    // An operation reads `bad`'s record (corrupt) with the lock held.
    hooked.target.store(bad, Ordering::SeqCst);
    let reader = {
        let fs = fs.clone();
        std::thread::spawn(move || fs.getattr(bad))
    };
    hooked.wait_held();
    // An fsync comes meanwhile: writable yet, it waits for the lock.
    let syncer = {
        let fs = fs.clone();
        std::thread::spawn(move || late(&fs))
    };
    std::thread::sleep(Duration::from_millis(300));
    hooked.armed.store(true, Ordering::SeqCst);
    hooked.let_go();
    let read = reader.join().unwrap();
    assert!(read.is_err(), "the corrupt record read as {read:?}");
    syncer.join().unwrap();
    assert!(fs.is_read_only(), "corruption did not turn it read-only");
    let changes = hooked.changes.load(Ordering::SeqCst);
    assert_eq!(
        (changes, orphans()),
        (0, vec![small]),
        "changes written to a file system read-only for corruption (the orphan's destroy)"
    );
}
