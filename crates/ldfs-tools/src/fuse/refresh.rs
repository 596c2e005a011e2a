//! A read-only mount of a store-backed file system that moves to the store's newer uploads
//! (issue 20: read-only mounts beside the writer see the last uploaded checkpoint).
//!
//! The mount serves through [`Refreshing`], which hands each request to the engine of the
//! checkpoint it shows, under a read lock. A refresh ([`Refresher::refresh`]):
//! 1. pins the store's newest checkpoint (`store::readers`: from then on the writer keeps what
//!    it names), before anything of the mount changes;
//! 2. notes what the kernel holds of the old tree (the inodes it has references to, their
//!    attributes, and the names of its directories): the old tree is the old pin's, which no
//!    one changes, so this runs beside the requests;
//! 3. with no request in flight (the write lock), stops the old engine's cache, rebuilds the
//!    cache from the new checkpoint (as a read-only mount on an empty cache does: nothing is
//!    downloaded but the Active segment's prefix), opens an engine on it, works out what
//!    changed against it, and swaps it in;
//! 4. at once, with requests served again (the kernel may wait on them), tells the kernel
//!    what changed (FUSE notifications): the attributes and pages of every inode it holds
//!    whose attributes differ or that is gone, then every name of a directory it holds whose
//!    target differs, appeared or went; last deletes the old pin and closes the old engine.
//!
//! A rebuild that fails goes back to the old checkpoint (still pinned); if that fails too, every
//! request fails with EIO until a later refresh succeeds, and the old pin is kept meanwhile;
//! the refresh thread then tries again after 1 s, doubling to 60 s, whatever `refresh=` says.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::time::Duration;

use fuser::{Errno, FileAttr, INodeNo, KernelConfig};
use ldfs::fs::inode::Kind;
use ldfs::fs::{Attr, Fs};
use ldfs::lld::Lld;
use ldfs::store::readers::ReaderPin;
use ldfs::store::segments::{CheckpointObject, SegmentEntry};
use ldfs::store::ObjectStore;

use crate::fuse::adapter::FuseFs;
use crate::fuse::store_mount::ReaderMount;
use crate::fuse::transport::{
    Caller, DirEntry, DirEntryPlus, Entry, FuseOps, OpResult, Opened, SetattrIn, Statfs, Xattr,
};

/// The first wait before a refresh tries again after one that left every request failing
/// ([`Refresher::run`]); each next one doubles, to [`LAST_RETRY`].
pub const FIRST_RETRY: Duration = Duration::from_secs(1);
pub const LAST_RETRY: Duration = Duration::from_secs(60);

/// The control query (`trusted.ldfs.refresh` on the root) that asks for a refresh now and
/// answers when it is done: `ldfs sync --remote` on a read-only mount.
pub const REFRESH_QUERY: &[u8] = b"trusted.ldfs.refresh";

/// The most bytes a refresh's answer takes ([`REFRESH_QUERY`]; longer ones are cut).
const ANSWER_ROOM: usize = 4096;

/// What a read-only store mount serves from: rebuilt at each refresh.
pub struct Served {
    pub fuse: Arc<FuseFs>,
    pub fs: Arc<Fs>,
    pub lld: Arc<Lld>,
    pub reader: Arc<ReaderMount>,
    /// Stops what runs beside the engine on threads of its own (a scrub), before the cache
    /// it reads is rebuilt.
    pub quiesce: Box<dyn Fn() + Send + Sync>,
}

/// Builds the engine of a pinned checkpoint (its key and object): rebuilds the cache from it,
/// keeping the segments given (entries of the object the cache holds byte for byte:
/// `ReaderMount::unchanged_in`), and opens the engine and the file system on it.
pub type Build = dyn Fn(Arc<ReaderPin>, &str, &CheckpointObject, &[SegmentEntry]) -> Result<Served, String>
    + Send
    + Sync;

/// Pins the store's newest checkpoint: the pin, its key and object.
pub type TakePin = dyn Fn() -> Result<(ReaderPin, String, CheckpointObject), String> + Send + Sync;

/// The requests of a mount, each served by its engine: the one it mounted, or for a read-only
/// store mount, the engine in the slot (none, after a failed refresh: EIO).
pub struct Refreshing {
    /// Every mount but a read-only store mount: served with no lock.
    fixed: Option<Arc<FuseFs>>,
    slot: RwLock<Option<Arc<FuseFs>>>,
    /// Weak: the refresher holds this slot, and a strong reference back would keep both (and
    /// the served engine's pin) alive past a mount refused before it serves (review 48).
    refresher: std::sync::OnceLock<std::sync::Weak<Refresher>>,
}

impl Refreshing {
    /// A mount whose engine never changes.
    pub fn fixed(fs: Arc<FuseFs>) -> Refreshing {
        Refreshing {
            fixed: Some(fs),
            slot: RwLock::new(None),
            refresher: std::sync::OnceLock::new(),
        }
    }

    /// A mount whose engine a [`Refresher`] replaces.
    pub fn swappable(first: Arc<FuseFs>) -> Refreshing {
        Refreshing {
            fixed: None,
            slot: RwLock::new(Some(first)),
            refresher: std::sync::OnceLock::new(),
        }
    }

    /// Serves [`REFRESH_QUERY`] from now on.
    pub fn set_refresher(&self, r: &Arc<Refresher>) {
        let _ = self.refresher.set(Arc::downgrade(r));
    }

    fn with<T>(&self, f: impl FnOnce(&FuseFs) -> OpResult<T>) -> OpResult<T> {
        if let Some(fs) = &self.fixed {
            return f(fs);
        }
        let slot = self.slot.read().unwrap_or_else(|p| p.into_inner());
        match &*slot {
            Some(fs) => f(fs),
            None => Err(Errno::from_i32(libc::EIO)),
        }
    }
}

/// `FuseOps` methods that hand the request to the engine serving it (`Refreshing::with`).
macro_rules! served_by_engine {
    ($($op:ident($($arg:ident: $ty:ty),*) -> $ret:ty;)*) => {
        $(fn $op(&self, $($arg: $ty),*) -> OpResult<$ret> {
            self.with(|f| f.$op($($arg),*))
        })*
    };
}

impl FuseOps for Refreshing {
    fn init(&self, config: &mut KernelConfig) {
        let _ = self.with(|f| {
            f.init(config);
            Ok(())
        });
    }
    fn forget(&self, ino: u64, nlookup: u64) {
        let _ = self.with(|f| {
            f.forget(ino, nlookup);
            Ok(())
        });
    }
    fn getxattr(&self, c: &Caller, ino: u64, name: &[u8], size: u32) -> OpResult<Xattr> {
        // Served outside the slot's lock: the refresh it waits for takes the lock exclusively.
        if let (Some(r), true) = (
            self.refresher.get().and_then(|r| r.upgrade()),
            ino == ldfs::fs::ROOT_INO && name == REFRESH_QUERY,
        ) {
            // A tool asking for the size first (getfattr) gets room for any answer, and the
            // refresh happens once, at the read (review 48's note).
            if size == 0 {
                return Ok(Xattr::Size(ANSWER_ROOM as u32));
            }
            let mut said = r.request().into_bytes();
            said.truncate(ANSWER_ROOM.min(size as usize));
            return Ok(Xattr::Data(said));
        }
        self.with(|f| f.getxattr(c, ino, name, size))
    }
    served_by_engine! {
        lookup(c: &Caller, parent: u64, name: &[u8]) -> Entry;
        getattr(ino: u64) -> (FileAttr, Duration);
        setattr(c: &Caller, ino: u64, sa: &SetattrIn) -> (FileAttr, Duration);
        readlink(ino: u64) -> Vec<u8>;
        mknod(c: &Caller, parent: u64, name: &[u8], mode: u32, umask: u32, rdev: u32) -> Entry;
        mkdir(c: &Caller, parent: u64, name: &[u8], mode: u32, umask: u32) -> Entry;
        unlink(parent: u64, name: &[u8]) -> ();
        rmdir(parent: u64, name: &[u8]) -> ();
        symlink(c: &Caller, parent: u64, name: &[u8], target: &[u8]) -> Entry;
        rename(parent: u64, name: &[u8], newparent: u64, newname: &[u8], flags: u32) -> ();
        link(ino: u64, newparent: u64, newname: &[u8]) -> Entry;
        open(ino: u64, flags: i32) -> Opened;
        read(ino: u64, fh: u64, offset: u64, size: u32) -> Vec<u8>;
        write(c: &Caller, ino: u64, fh: u64, offset: u64, data: &[u8], write_flags: u32) -> u32;
        flush(ino: u64, fh: u64) -> ();
        release(ino: u64, fh: u64) -> ();
        fsync(ino: u64, fh: u64, datasync: bool) -> ();
        opendir(ino: u64, flags: i32) -> Opened;
        readdir(ino: u64, fh: u64, offset: u64, add: &mut dyn FnMut(DirEntry) -> bool) -> ();
        readdirplus(
            ino: u64,
            fh: u64,
            offset: u64,
            add: &mut dyn FnMut(DirEntryPlus) -> bool
        ) -> ();
        releasedir(ino: u64, fh: u64) -> ();
        fsyncdir(ino: u64, fh: u64, datasync: bool) -> ();
        statfs(ino: u64) -> Statfs;
        setxattr(c: &Caller, ino: u64, name: &[u8], value: &[u8], flags: i32) -> ();
        listxattr(ino: u64, size: u32) -> Xattr;
        removexattr(ino: u64, name: &[u8]) -> ();
        access(ino: u64, mask: i32) -> ();
        create(
            c: &Caller,
            parent: u64,
            name: &[u8],
            mode: u32,
            umask: u32,
            flags: i32
        ) -> (Entry, Opened);
        fallocate(ino: u64, fh: u64, offset: u64, length: u64, mode: i32) -> ();
        lseek(ino: u64, fh: u64, offset: i64, whence: i32) -> i64;
        ioctl(c: &Caller, ino: u64, fh: u64, cmd: u32, input: &[u8], out_size: u32) -> Vec<u8>;
    }
}

/// What the kernel holds of a tree, taken from it: per inode it has references to, the
/// attributes (`None`: gone) and, for a directory, its names and their inodes.
#[derive(Default)]
struct Held {
    attrs: BTreeMap<u64, Option<Attr>>,
    names: BTreeMap<u64, BTreeMap<Vec<u8>, u64>>,
}

impl Held {
    /// Adds what `fs` holds of `inos` that is not noted yet.
    fn note(&mut self, fs: &Fs, inos: impl IntoIterator<Item = u64>) {
        for ino in inos {
            if self.attrs.contains_key(&ino) {
                continue;
            }
            let attr = fs.getattr(ino).ok();
            if let Some(a) = attr.filter(|a| a.kind == Kind::Dir) {
                self.names.insert(ino, names_of(fs, a.ino));
            }
            self.attrs.insert(ino, attr);
        }
    }
}

/// Every name of directory `ino` (. and .. aside) and its inode; none if it cannot be read.
fn names_of(fs: &Fs, ino: u64) -> BTreeMap<Vec<u8>, u64> {
    let mut out = BTreeMap::new();
    let mut offset = 0;
    loop {
        let Ok(batch) = fs.readdir(ino, offset, 1024) else {
            return out;
        };
        let Some(last) = batch.last() else {
            return out;
        };
        offset = last.next;
        for e in batch {
            if e.name != b"." && e.name != b".." {
                out.insert(e.name, e.ino);
            }
        }
    }
}

/// What the kernel must forget after the swap from the tree `old` notes to `new`: inodes whose
/// attributes differ (or are gone), and (directory, name) pairs whose target differs.
fn changes(old: &Held, new: &Fs) -> (Vec<u64>, Vec<(u64, Vec<u8>)>) {
    let mut inodes = Vec::new();
    let mut names = Vec::new();
    for (&ino, attr) in &old.attrs {
        let now = new.getattr(ino).ok();
        if now != *attr {
            inodes.push(ino);
        }
        let Some(was) = old.names.get(&ino) else {
            continue;
        };
        let is = match now {
            Some(a) if a.kind == Kind::Dir => names_of(new, ino),
            _ => BTreeMap::new(),
        };
        for (name, target) in was {
            if is.get(name) != Some(target) {
                names.push((ino, name.clone()));
            }
        }
        for name in is.keys() {
            // A name the old tree lacked: the kernel may hold it as absent.
            if !was.contains_key(name) {
                names.push((ino, name.clone()));
            }
        }
    }
    (inodes, names)
}

#[derive(Default)]
struct Asks {
    /// Refreshes asked for (`request`), and refreshes done, each with what it said.
    asked: u64,
    done: u64,
    said: String,
    stop: bool,
    /// A caller waits in `request` (at most one: review 49 finding 1).
    waiting: bool,
}

/// What [`Refresher::request`] answers while another caller waits for a refresh: the caller
/// (`ldfs sync --remote`) asks again shortly.
pub const BUSY: &str = "busy: another caller waits for a refresh";

/// Moves a read-only store mount to the store's newest checkpoint: on demand
/// ([`Refresher::request`]) and, with `-o refresh=SECONDS`, that often.
pub struct Refresher {
    slot: Arc<Refreshing>,
    served: Mutex<Option<Served>>,
    store: Arc<dyn ObjectStore>,
    take_pin: Box<TakePin>,
    build: Box<Build>,
    notifier: Mutex<Option<fuser::Notifier>>,
    /// What the kernel held of the tree a failed refresh left (every request fails meanwhile,
    /// so the kernel caches nothing new): what the refresh that recovers compares with
    /// (review 49 finding 2: names cached before the failure stayed for their 30 s).
    held_at_failure: Mutex<Option<Held>>,
    asks: Mutex<Asks>,
    cv: Condvar,
}

impl Refresher {
    pub fn new(
        slot: Arc<Refreshing>,
        first: Served,
        store: Arc<dyn ObjectStore>,
        take_pin: Box<TakePin>,
        build: Box<Build>,
    ) -> Arc<Refresher> {
        let r = Arc::new(Refresher {
            slot: slot.clone(),
            served: Mutex::new(Some(first)),
            store,
            take_pin,
            build,
            notifier: Mutex::new(None),
            held_at_failure: Mutex::new(None),
            asks: Mutex::new(Asks::default()),
            cv: Condvar::new(),
        });
        slot.set_refresher(&r);
        r
    }

    /// The kernel's caches are invalidated through it (given once the session exists).
    pub fn set_notifier(&self, n: fuser::Notifier) {
        *self.notifier.lock().unwrap() = Some(n);
    }

    /// Runs refreshes (asked for, or every `every`) until [`Refresher::stop`]. After a refresh
    /// that left every request failing (both rebuilds failed, most likely the store away), the
    /// next comes after [`FIRST_RETRY`], doubling to [`LAST_RETRY`] (or `every`, if sooner),
    /// `refresh=0` too: a store briefly away must not leave the mount failing until someone
    /// asks or the period ends (review 48's note: 30 s of EIO, or for good with `refresh=0`).
    pub fn run(&self, every: Option<Duration>) {
        // Waiting for the period, the retry's backoff, whichever ends first; or for an ask.
        let wait = |retry: Option<Duration>| match (every, retry) {
            (Some(e), Some(r)) => Some(e.min(r)),
            (e, r) => e.or(r),
        };
        let mut retry: Option<Duration> = None;
        loop {
            // Every ask made before a refresh begins is answered by it.
            let ask = {
                let mut a = self.asks.lock().unwrap();
                while a.asked == a.done && !a.stop {
                    match wait(retry) {
                        Some(t) => {
                            let (g, r) = self.cv.wait_timeout(a, t).unwrap();
                            a = g;
                            if r.timed_out() {
                                break;
                            }
                        }
                        None => a = self.cv.wait(a).unwrap(),
                    }
                }
                if a.stop {
                    return;
                }
                a.asked
            };
            let said = match self.refresh() {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("ldfs: refresh from the store: {e}");
                    format!("failed: {e}")
                }
            };
            retry = match self.broken() {
                false => None,
                true => {
                    let r = Some(retry.map_or(FIRST_RETRY, |r| (r * 2).min(LAST_RETRY)));
                    eprintln!(
                        "ldfs: refresh: every request fails until a refresh succeeds; the next \
                         in {} s",
                        wait(r).unwrap_or(LAST_RETRY).as_secs()
                    );
                    r
                }
            };
            let mut a = self.asks.lock().unwrap();
            a.done = a.done.max(ask);
            a.said = said;
            self.cv.notify_all();
        }
    }

    /// Asks for a refresh and waits for one that began after the ask; what it did. One caller
    /// waits at a time, the others are answered [`BUSY`] at once: each waiter holds a FUSE
    /// thread, and the refresh's notifications may wait for a request the kernel holds a
    /// directory's lock for, which needs a free thread (review 49 finding 1: 16 waiters, the
    /// whole pool, hung the mount for good).
    pub fn request(&self) -> String {
        let mut a = self.asks.lock().unwrap();
        if a.stop {
            return "failed: the mount is ending".into();
        }
        if a.waiting {
            return BUSY.into();
        }
        a.waiting = true;
        a.asked += 1;
        let mine = a.asked;
        self.cv.notify_all();
        while a.done < mine && !a.stop {
            a = self.cv.wait(a).unwrap();
        }
        a.waiting = false;
        match a.done >= mine {
            true => a.said.clone(),
            false => "failed: the mount is ending".into(),
        }
    }

    /// The mount is ending: a refresh under way stops at its next step that is not yet
    /// holding requests back (once it holds them, it finishes its swap).
    fn stopping(&self) -> bool {
        self.asks.lock().unwrap().stop
    }

    /// Ends [`Refresher::run`] (a refresh under way stops at its next step that is not yet
    /// holding requests back; once it holds them, it finishes its swap); then
    /// [`Refresher::take_served`] gives the engine to close.
    pub fn stop(&self) {
        self.asks.lock().unwrap().stop = true;
        self.cv.notify_all();
    }

    /// Whether a failed refresh left no engine: every request fails (EIO).
    fn broken(&self) -> bool {
        self.slot
            .slot
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .is_none()
    }

    /// What is served now (the mount's end closes it), once `run` has returned.
    pub fn take_served(&self) -> Option<Served> {
        self.served.lock().unwrap().take()
    }

    /// Moves the mount to the store's newest checkpoint if that is not the one it shows (or
    /// rebuilds it if it serves none after a failure). Says what it did.
    pub fn refresh(&self) -> Result<String, String> {
        let mut served = self.served.lock().unwrap();
        let Some(cur) = served.as_ref() else {
            return Err("the mount is ending".into());
        };
        let current = cur.reader.checkpoint().to_string();
        let broken = self.broken();
        // One listing first: most refreshes find nothing new.
        let newest = ldfs::store::segments::newest_checkpoint_key(&*self.store)
            .map_err(|e| format!("listing the store: {e}"))?;
        if !broken && newest.as_deref().is_none_or(|k| k == current) {
            return Ok(format!("at the store's newest checkpoint, {current}"));
        }
        if self.stopping() {
            return Err("the mount is ending".into());
        }
        let (pin, key, obj) = (self.take_pin)()?;
        let pin = Arc::new(pin);
        if self.stopping() {
            release(&pin, &key);
            return Err("the mount is ending".into());
        }
        if key == current && !broken {
            release(&pin, &key);
            return Ok(format!("at the store's newest checkpoint, {current}"));
        }
        // What the kernel holds of the old tree (the root, and what it has references to),
        // beside the requests: nobody changes that tree. Not after a failed rebuild: the old
        // engine's cache is gone, and every inode the kernel holds is invalidated.
        let known = |fs: &Fs| {
            let mut v: Vec<u64> = fs.pinned().into_iter().map(|(i, _)| i).collect();
            v.push(ldfs::fs::ROOT_INO);
            v
        };
        let mut held = match broken {
            true => self
                .held_at_failure
                .lock()
                .unwrap()
                .take()
                .unwrap_or_default(),
            false => Held::default(),
        };
        if !broken {
            held.note(&cur.fs, known(&cur.fs));
        }
        let mut slot = self.slot.slot.write().unwrap_or_else(|p| p.into_inner());
        // No request in flight from here. Inodes the kernel took since the note above.
        let pinned = cur.fs.pinned();
        if !broken {
            held.note(&cur.fs, known(&cur.fs));
        }
        // The served engine's, also after a failed refresh left the slot empty (the kernel's
        // INIT answered once, by the first engine).
        let no_open = cur.fuse.no_open.load(std::sync::atomic::Ordering::Relaxed);
        (cur.quiesce)();
        cur.reader.stop_cache();
        // What the old cache fetched and the new checkpoint still names. Not after a failed
        // refresh: the cache file was rebuilt (in part) since its engine's cache last held it.
        let keep = match broken {
            true => Vec::new(),
            false => cur.reader.unchanged_in(&obj),
        };
        let new = match (self.build)(pin.clone(), &key, &obj, &keep) {
            Ok(n) => n,
            Err(e) => {
                release(&pin, &key);
                // Back to the checkpoint the old pin still holds.
                // Whole: the failed rebuild may have given back any segment but the kept.
                match (self.build)(
                    cur.reader.pin(),
                    cur.reader.checkpoint(),
                    cur.reader.checkpoint_object(),
                    &[],
                ) {
                    Ok(again) => {
                        adopt(&again, no_open, &pinned);
                        *slot = Some(again.fuse.clone());
                        drop(slot);
                        let old = served.replace(again).expect("checked above");
                        close(old);
                        return Err(format!("opening {key}: {e}; still at {current}, rebuilt"));
                    }
                    Err(e2) => {
                        *slot = None;
                        *self.held_at_failure.lock().unwrap() = Some(held);
                        return Err(format!(
                            "opening {key}: {e}; rebuilding {current} again: {e2}; every \
                             request fails (EIO) until a refresh succeeds"
                        ));
                    }
                }
            }
        };
        adopt(&new, no_open, &pinned);
        // What changed, before any request reaches the new engine: from the swap to the
        // notifications the kernel's caches of the old tree and the new engine answer together
        // (review 48), so that window holds nothing but the notifications.
        // After a failure, what the kernel held then (`held_at_failure`); without it, every
        // inode it holds.
        let (inodes, names) = match broken && held.attrs.is_empty() {
            false => changes(&held, &new.fs),
            true => (pinned.iter().map(|&(i, _)| i).collect(), Vec::new()),
        };
        *slot = Some(new.fuse.clone());
        drop(slot);
        let old = served.replace(new).expect("checked above");
        drop(served);
        self.tell_kernel(&inodes, &names);
        old.reader.release_pin();
        close(old);
        Ok(format!(
            "moved from {current} to {key}: {} inodes and {} names the kernel held changed; {} cached segments kept",
            inodes.len(),
            names.len(),
            keep.len()
        ))
    }

    /// Invalidates what changed in the kernel's caches (best effort: an entry the kernel no
    /// longer holds answers ENOENT, which is no error here).
    fn tell_kernel(&self, inodes: &[u64], names: &[(u64, Vec<u8>)]) {
        let n = self.notifier.lock().unwrap();
        let Some(n) = n.as_ref() else {
            return;
        };
        for &ino in inodes {
            // Offset 0, length 0: the attributes and every cached page.
            if let Err(e) = n.inval_inode(INodeNo(ino), 0, 0) {
                if e.raw_os_error() != Some(libc::ENOENT) {
                    eprintln!("ldfs: refresh: invalidating inode {ino}: {e}");
                }
            }
        }
        for (dir, name) in names {
            if let Err(e) = n.inval_entry(INodeNo(*dir), OsStr::from_bytes(name)) {
                if e.raw_os_error() != Some(libc::ENOENT) {
                    eprintln!("ldfs: refresh: invalidating a name of directory {dir}: {e}");
                }
            }
        }
    }
}

/// A new engine takes the kernel's negotiated way of opening files (`no_open`, from the INIT
/// the first engine answered) and its lookup references (`pinned`).
fn adopt(new: &Served, no_open: bool, pinned: &[(u64, u64)]) {
    new.fuse
        .no_open
        .store(no_open, std::sync::atomic::Ordering::Relaxed);
    for &(ino, n) in pinned {
        new.fs.pin(ino, n);
    }
}

fn release(pin: &ReaderPin, key: &str) {
    if let Err(e) = pin.release() {
        eprintln!("ldfs: deleting the pin on {key}: {e} (it expires on its own)");
    }
}

/// Closes a replaced engine (read-only: nothing is written).
fn close(old: Served) {
    if let Err(e) = old.lld.close() {
        eprintln!("ldfs: refresh: closing the replaced engine: {e}");
    }
}
