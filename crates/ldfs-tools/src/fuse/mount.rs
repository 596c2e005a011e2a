//! `ldfs mount`: open an image, mount it through FUSE, serve until unmounted.
//!
//! Like other mount programs it returns once the file system is mounted and
//! keeps serving in the background (a child process started with `-f`
//! reports "ready" on a pipe); `-f` stays in the foreground. SIGTERM, SIGINT
//! and SIGHUP unmount, and on a busy mount detach it and end its FUSE
//! connection; every end is a final checkpoint. The image's lock is held
//! until that checkpoint is written, so a mount or fsck right after an
//! unmount waits for it. Also runs as the mount helper `mount.fuse.ldfs
//! IMAGE DIR -o OPTIONS`, so `mount -t fuse.ldfs` and /etc/fstab work.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use fuser::{Config, MountOption, Session, SessionACL};
use ldfs::device::{Device, FileDevice, FileDeviceOptions};
use ldfs::dual::Dual;
use ldfs::fs::{Fs, FsOptions};
use ldfs::ld::LogicalDisk;
use ldfs::lld::{Lld, LldOptions};

use crate::cli::store::StoreUrl;
use crate::fuse::adapter::{Control, FuseFs, GiveBack, WriteGate};
use crate::fuse::refresh::{Refresher, Refreshing, Served};
use crate::fuse::store_mount::StoreMount;
use crate::fuse::transport::{self, dev::Dev, uring, Transport};

/// What `ldfs stats` and `ldfs clean` reach on a mounted file system.
struct Daemon {
    lld: Arc<Lld>,
    /// A dual file system's LD (its data device in `ldfs stats`).
    dual: Option<Arc<Dual>>,
    fs: Arc<Fs>,
    /// Whether the background cleaner ran before a remount read-only
    /// stopped it (restarted by the remount read-write).
    cleaner_before_ro: std::sync::Mutex<Option<bool>>,
    /// Set by `ldfs clean --stop`: a running `clean` ends after its pass.
    cancel: AtomicBool,
    /// What the last `clean` command did (read back by `ldfs clean`).
    last_clean: std::sync::Mutex<String>,
    /// The transport serving the mount, for `ldfs stats`.
    transport: Arc<std::sync::Mutex<String>>,
    /// Requests served over io_uring.
    ring_served: Arc<std::sync::atomic::AtomicUsize>,
    /// The scrub running or last run (`ldfs scrub`).
    scrub: Arc<Scrub>,
    /// What the last `trim` command did (read back by `ldfs trim`).
    last_trim: std::sync::Mutex<String>,
    /// What the last `resize` command did (read back by `ldfs resize`).
    last_resize: std::sync::Mutex<String>,
    /// The image, absolute (its snapshots' locks are taken on it).
    image: PathBuf,
    /// The snapshot this mount serves, if it is a snapshot mount.
    snapshot: Option<u64>,
    /// The results of the last `snapshot` commands, by the token each
    /// command carried, for `ldfs snapshot` to read back (its own, even
    /// when several run at once). At most `SNAPSHOT_RESULTS` are kept.
    snapshot_results: std::sync::Mutex<std::collections::VecDeque<(String, String)>>,
    /// Protected checkpoints, yielding space to writes and to snapshots.
    history: Arc<ProtectedHistory>,
    /// A store-backed file system's layer and lease (read-write mounts of one).
    store: Option<Arc<StoreMount>>,
    /// A read-only mount of one: its pin and cache.
    reader: Option<Arc<crate::fuse::store_mount::ReaderMount>>,
}

/// How many `snapshot` command results the daemon keeps.
const SNAPSHOT_RESULTS: usize = 64;

/// A scrub of the mounted file system, run on a thread of its own.
#[derive(Default)]
pub(crate) struct Scrub {
    stop: AtomicBool,
    state: std::sync::Mutex<ScrubState>,
}

#[derive(Default)]
struct ScrubState {
    running: bool,
    /// Scrubs started since mount.
    runs: u64,
    report: ldfs::fs::scrub::ScrubReport,
    error: Option<String>,
    thread: Option<JoinHandle<()>>,
}

impl Scrub {
    fn start(self: &Arc<Self>, ld: Arc<dyn LogicalDisk>, rate: Option<u64>) -> Result<(), String> {
        let mut st = self.state.lock().expect("scrub poisoned");
        if st.running {
            return Err("a scrub is running already".into());
        }
        if let Some(t) = st.thread.take() {
            let _ = t.join();
        }
        self.stop.store(false, Ordering::Relaxed);
        st.running = true;
        st.runs += 1;
        st.error = None;
        st.report = Default::default();
        let me = self.clone();
        st.thread = Some(std::thread::spawn(move || {
            let opts = ldfs::fs::scrub::ScrubOptions {
                rate,
                stop: Some(&me.stop),
            };
            let r = ldfs::fs::scrub::scrub(&*ld, &opts, &mut |r| {
                me.state.lock().expect("scrub poisoned").report = r.clone();
            });
            let mut st = me.state.lock().expect("scrub poisoned");
            match r {
                Ok(r) => st.report = r,
                Err(e) => st.error = Some(e.to_string()),
            }
            for d in &st.report.damage {
                eprintln!("ldfs: scrub: {}", crate::cli::scrub::damage_text(d));
            }
            st.running = false;
        }));
        Ok(())
    }

    /// Ends a running scrub and waits for its thread (unmount).
    pub(crate) fn stop_and_join(&self) {
        self.stop.store(true, Ordering::Relaxed);
        let t = self.state.lock().expect("scrub poisoned").thread.take();
        if let Some(t) = t {
            let _ = t.join();
        }
    }

    /// The state as `ldfs scrub` reads it (JSON).
    fn json(&self) -> String {
        let st = self.state.lock().expect("scrub poisoned");
        crate::cli::scrub::state_json(st.running, st.runs, &st.report, st.error.as_deref())
    }
}

impl Control for Daemon {
    fn get(&self, name: &str) -> Result<Vec<u8>, String> {
        match name {
            "stats" => {
                let mut t = crate::cli::stats::stats_text(&self.lld);
                t += &format!(
                    "transport: {}, {} requests served over io_uring\n",
                    self.transport.lock().expect("transport poisoned"),
                    self.ring_served.load(Ordering::Relaxed)
                );
                if let Some(d) = &self.dual {
                    t += "data device (dual):\n";
                    t += &crate::cli::stats::dual_text(&d.stats());
                }
                if let Some(s) = &self.store {
                    t += &s.text();
                }
                if let Some(r) = &self.reader {
                    t += &r.text();
                }
                Ok(t.into_bytes())
            }
            "stats-json" => {
                use ldfs::ld::LogicalDisk;
                let st = self.lld.stats();
                let sp = self.lld.space();
                Ok(serde_json::json!({
                    "checkpoint_serial": self.lld.checkpoint_serial(),
                    "checkpoints": st.checkpoints,
                    "live_bytes": sp.live_bytes,
                    "capacity_bytes": sp.capacity_bytes,
                    "available_bytes": sp.available_bytes,
                    "store": match (&self.store, &self.reader) {
                        (Some(s), _) => Some(s.json()),
                        (None, Some(r)) => Some(r.json()),
                        (None, None) => None,
                    },
                })
                .to_string()
                .into_bytes())
            }
            "clean" => Ok(self
                .last_clean
                .lock()
                .expect("last_clean poisoned")
                .clone()
                .into_bytes()),
            // `mount -o remount,ro|rw` (see `remount`): queries, not
            // commands, because the kernel refuses setxattr on a read-only
            // mount, and the helper must reach the daemon while it is one.
            "scrub" => Ok(self.scrub.json().into_bytes()),
            // `ldfs sync --remote` on a read-only mount; a store's is answered before it gets
            // here (`fuse::refresh`).
            "refresh" => Ok(match (&self.store, self.fs.is_read_only()) {
                (Some(_), _) => {
                    "failed: the writer's mount, remounted read-only: it uploads \
                     (`ldfs sync --remote`) once remounted read-write"
                }
                (None, false) => "failed: not a read-only mount: nothing to refresh",
                (None, true) => {
                    "failed: not a mount of a store-backed file system: nothing to refresh from"
                }
            }
            .as_bytes()
            .to_vec()),
            "trim" => Ok(self
                .last_trim
                .lock()
                .expect("last_trim poisoned")
                .clone()
                .into_bytes()),
            "resize" => Ok(self
                .last_resize
                .lock()
                .expect("last_resize poisoned")
                .clone()
                .into_bytes()),
            "checkpoints" => {
                Ok(
                    crate::cli::checkpoints::listing(&self.lld, &self.image, self.snapshot)
                        .to_string()
                        .into_bytes(),
                )
            }
            q if q.starts_with("snapshot.") => {
                let token = &q["snapshot.".len()..];
                let results = self
                    .snapshot_results
                    .lock()
                    .expect("snapshot_results poisoned");
                results
                    .iter()
                    .find(|(t, _)| t == token)
                    .map(|(_, r)| r.clone().into_bytes())
                    .ok_or_else(|| format!("no snapshot command {token:?}"))
            }
            // `mount -o remount,compress=V`: the policy of new files.
            q if q.starts_with("compress=") => {
                if self.snapshot.is_some() {
                    return Err("a snapshot mount is read-only: it stores nothing".into());
                }
                let c = ldfs::ld::Compression::parse(&q["compress=".len()..])?;
                self.fs.set_default_compression(c);
                eprintln!("ldfs: remount: compress={c} for new files");
                Ok(Vec::new())
            }
            "remount-ro" => self.remount_ro().map(|()| Vec::new()),
            "remount-rw" => self.remount_rw().map(|()| Vec::new()),
            other => Err(format!("unknown query {other}")),
        }
    }

    fn set(&self, name: &str, value: &[u8]) -> Result<(), String> {
        let text = String::from_utf8_lossy(value);
        match name {
            "checkpoint" => {
                self.writable("checkpoints are written")?;
                // What stat shows goes into it, atimes reads kept too.
                self.fs.write_kept();
                self.lld.checkpoint_now().map_err(|e| e.to_string())
            }
            // `ldfs sync --remote`.
            "upload" => {
                let s = self.store.as_ref().ok_or(
                    "not a read-write mount of a store-backed file system: nothing to upload",
                )?;
                self.writable("uploads are made")?;
                s.sync_remote(&self.fs)
            }
            "clean" => {
                self.writable("the cleaner runs")?;
                let req = crate::cli::clean::CleanRequest::parse(&text)?;
                self.cancel.store(false, Ordering::Relaxed);
                let sum = self
                    .lld
                    .clean_now(
                        req.policy,
                        req.segments,
                        req.max_utilization as f64 / 100.0,
                        &self.cancel,
                    )
                    .map_err(|e| e.to_string())?;
                *self.last_clean.lock().expect("last_clean poisoned") =
                    format!("cleaned with {}: {sum}\n", req.policy);
                Ok(())
            }
            // "on POLICY" or "off": the background cleaner from now on.
            "background" => {
                let mut words = text.split_whitespace();
                let on = match words.next() {
                    Some("on") => true,
                    Some("off") => false,
                    other => return Err(format!("background: on or off, not {other:?}")),
                };
                if on {
                    self.writable("the cleaner runs")?;
                }
                if let Some(p) = words.next() {
                    self.lld.set_cleaner_policy(p.parse()?);
                }
                self.lld
                    .set_background_cleaner(on)
                    .map_err(|e| e.to_string())
            }
            // Stop cleaning: a running `clean` and the background thread.
            "stop" => {
                self.cancel.store(true, Ordering::Relaxed);
                self.lld
                    .set_background_cleaner(false)
                    .map_err(|e| e.to_string())
            }
            // "start [RATE]" (bytes per second) or "stop".
            "scrub" => {
                let mut words = text.split_whitespace();
                match words.next() {
                    Some("start") => {
                        let rate = match words.next() {
                            Some(r) => Some(r.parse().map_err(|_| format!("scrub rate {r:?}"))?),
                            None => None,
                        };
                        self.scrub.start(self.fs.logical_disk().clone(), rate)
                    }
                    Some("stop") => {
                        self.scrub.stop.store(true, Ordering::Relaxed);
                        Ok(())
                    }
                    other => Err(format!("scrub: start or stop, not {other:?}")),
                }
            }
            "snapshot" => {
                let req = crate::cli::snapshot::SnapshotRequest::parse(&text)?;
                let r = self.snapshot_command(&req.action);
                let kept = match &r {
                    Ok(v) => v.to_string(),
                    Err(e) => serde_json::json!({ "error": e }).to_string(),
                };
                let mut results = self
                    .snapshot_results
                    .lock()
                    .expect("snapshot_results poisoned");
                if results.len() >= SNAPSHOT_RESULTS {
                    results.pop_front();
                }
                results.push_back((req.token, kept));
                r.map(|_| ())
            }
            // SIZE as `ldfs resize` takes it (empty: the device's size).
            "resize" => {
                let r = self.resize(&text);
                *self.last_resize.lock().expect("last_resize poisoned") = match &r {
                    Ok(s) => s.clone(),
                    Err(e) => format!("not resized: {e}\n"),
                };
                r.map(|_| ())
            }
            "trim" => {
                self.writable("trim runs")?;
                let (segs, bytes) = self.lld.trim().map_err(|e| e.to_string())?;
                let mut said = format!("trimmed {segs} clean segments, {bytes} bytes");
                if let Some(d) = &self.dual {
                    let (blocks, bytes) = d.trim_data().map_err(|e| e.to_string())?;
                    said += &format!(
                        " of the metadata log; the data device: {blocks} free blocks, {bytes} bytes"
                    );
                }
                *self.last_trim.lock().expect("last_trim poisoned") = said + "\n";
                Ok(())
            }
            other => Err(format!("unknown command {other}")),
        }
    }
}

impl Daemon {
    /// Refuses a command that writes the image while the mount is
    /// read-only (`remount,ro`: a shutdown expects no more writes).
    fn writable(&self, what: &str) -> Result<(), String> {
        if self.fs.is_read_only() {
            return Err(format!(
                "the file system is mounted read-only: {what} only on a read-write mount"
            ));
        }
        Ok(())
    }

    /// `ldfs resize MNT SIZE`: grows the log while mounted (the engine's
    /// `grow`); the result as `ldfs resize` prints it.
    fn resize(&self, spec: &str) -> Result<String, String> {
        if self.snapshot.is_some() {
            return Err("a snapshot mount is read-only: resize through the live mount".into());
        }
        if self.dual.is_some() {
            return Err(
                "a dual file system is resized unmounted, and only its metadata device".into(),
            );
        }
        self.writable("it is resized")?;
        let current = self.lld.device_bytes();
        let size = crate::cli::resize::resolve_size(Some(spec), current)?;
        let r = self.lld.grow(size).map_err(|e| e.to_string())?;
        eprintln!("ldfs: resized online, {r}");
        Ok(format!("resized, {r}\n"))
    }

    /// `ldfs snapshot`: takes or deletes a snapshot; the result as JSON.
    fn snapshot_command(
        &self,
        action: &crate::cli::snapshot::SnapshotAction,
    ) -> Result<serde_json::Value, String> {
        use crate::cli::snapshot::SnapshotAction;
        if let Some(n) = self.snapshot {
            return Err(format!(
                "this is a read-only mount of snapshot {n}: take and delete snapshots through the live mount"
            ));
        }
        if self.dual.is_some() {
            return Err("a dual file system updates its data in place: it has no snapshots".into());
        }
        self.writable("snapshots are taken and deleted")?;
        match action {
            SnapshotAction::Take { name } => {
                let secs = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs());
                // Protected checkpoints yield to a snapshot (for a pin bit
                // or for space), oldest first.
                // Refusals a protected checkpoint cannot cure come first:
                // only space or a pin bit can be had back from one.
                ldfs::lld::snapshot::check_name(name)
                    .map_err(|e| format!("no snapshot taken: {e}"))?;
                self.fs.write_kept();
                let n = loop {
                    let seen = self.history.given();
                    if self.lld.snapshot_table_full() && self.history.give_back_to_snapshot(0, seen)
                    {
                        continue;
                    }
                    match self.lld.take_snapshot(name, secs) {
                        Ok(n) => break n,
                        Err(ldfs::ld::LdError::NoSpace { needed, available })
                            if self.history.give_back_to_snapshot(
                                needed.saturating_sub(available).max(1),
                                seen,
                            ) => {}
                        Err(e) => return Err(format!("no snapshot taken: {e}")),
                    }
                };
                eprintln!("ldfs: snapshot {n} taken ({name:?})");
                Ok(serde_json::json!({ "number": n, "name": name, "time": secs }))
            }
            &SnapshotAction::Delete { number } => {
                // Exclusive and non-blocking: a reader's shared lock (a
                // snapshot mount) refuses the deletion; held until the
                // checkpoint recording it is durable (DESIGN "Snapshots").
                delete_kept(&self.lld, &self.image, number)?;
                eprintln!("ldfs: snapshot {number} deleted");
                Ok(serde_json::json!({ "deleted": number }))
            }
        }
    }

    /// Refuses changes from now on, stops the background cleaner and
    /// writes a checkpoint holding everything accepted before: the image is
    /// then as an unmount leaves it (systemd remounts read-only at
    /// shutdown, before it may cut power).
    fn remount_ro(&self) -> Result<(), String> {
        if self.snapshot.is_some() {
            // Read-only from the start: nothing to stop or write.
            return Ok(());
        }
        self.fs.set_read_only(true).map_err(|e| e.to_string())?;
        {
            let mut before = self
                .cleaner_before_ro
                .lock()
                .expect("cleaner_before_ro poisoned");
            if before.is_none() {
                *before = Some(self.lld.background_cleaner_running());
            }
        }
        self.lld
            .set_background_cleaner(false)
            .map_err(|e| e.to_string())?;
        self.fs.fsync().map_err(|e| e.to_string())?;
        // An operation that passed its writable check just before the
        // switch may still hold an ARU open for a moment.
        let mut tries = 0;
        loop {
            match self.lld.checkpoint_now() {
                Ok(()) => return Ok(()),
                Err(ldfs::ld::LdError::InvalidArgument(_)) if tries < 100 => {
                    tries += 1;
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => return Err(format!("checkpoint at the remount read-only: {e}")),
            }
        }
    }

    fn remount_rw(&self) -> Result<(), String> {
        // A store mount whose lease was taken over turned read-only for good (`run_window`):
        // its writes could never be uploaded, and the next read-write mount on this cache
        // refuses it (review 33).
        if let Some(s) = &self.store {
            if let Err(ldfs::store::lease::LeaseCheck::Lost(why)) = s.seg.lease().check() {
                return Err(format!(
                    "{}: the store's lease was lost ({why}): this mount stays read-only;                      unmount it",
                    s.url
                ));
            }
        }
        self.fs.set_read_only(false).map_err(|_| {
            "mounted read-only from the start (the image was opened read-only): unmount it and mount it rw".to_string()
        })?;
        let before = self
            .cleaner_before_ro
            .lock()
            .expect("cleaner_before_ro poisoned")
            .take();
        if before == Some(true) {
            self.lld
                .set_background_cleaner(true)
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }
}

/// Parsed `-o` options.
#[derive(Clone, Debug)]
pub struct MountOpts {
    pub read_only: bool,
    /// `ro` or `rw` was given (a remount without either keeps the mode).
    pub ro_given: bool,
    /// `remount`: change the options of the mount at DIR (see `remount`).
    pub remount: bool,
    pub allow_other: bool,
    pub cache_bytes: usize,
    pub commit_secs: u64,
    /// The kernel's writeback cache (`writeback_cache`; off by default):
    /// faster small writes, but write(2) no longer sees ENOSPC (see
    /// `FuseFs::writeback_cache`).
    pub writeback_cache: bool,
    /// Aligned writes to the image through `O_DIRECT` (`direct_writes`,
    /// `nodirect_writes`; by default on where the image's file system
    /// allows it): an fsync's device flush then has no page cache to write
    /// back (see `FileDevice::direct_writes`).
    pub direct_writes: Toggle,
    /// When reads update atime (`noatime`, `relatime`: the default,
    /// `strictatime`).
    pub atime: ldfs::fs::AtimeMode,
    /// `nodiratime`.
    pub nodiratime: bool,
    /// Background cleaning policy; `None` turns the background cleaner off
    /// (writes still clean in the foreground when space runs low).
    pub cleaner: Option<ldfs::lld::PolicyKind>,
    /// Cleaning starts below this many clean segments (`clean_start=N`;
    /// default: the reserve plus max(2, segments/256)).
    pub clean_start: Option<u32>,
    /// Background cleaning stops above this many (`clean_stop=N`).
    pub clean_stop: Option<u32>,
    /// Options passed on to FUSE as they are.
    pub fuse: Vec<MountOption>,
    /// A dual file system's metadata device (`meta=PATH`); default: the
    /// path its data device's label recorded at mkfs.
    pub meta: Option<PathBuf>,
    /// How FUSE requests travel (`transport=auto|uring|dev`).
    pub transport: Transport,
    /// Give segments back to the storage as checkpoints release them
    /// (`discard`; `nodiscard`, the default: `ldfs trim` does it on
    /// demand, as fstrim).
    pub discard: bool,
    /// How new file data is stored when its file (or the directory it was
    /// made in) has no `user.ldfs.compress` (`compress=zstd[:LEVEL]|lz4|off`;
    /// off by default). `None`: not given.
    pub compress: Option<ldfs::ld::Compression>,
    /// The zstd level the cleaner stores cold blocks of compressing files
    /// with as it moves them (`compress_cold=zstd:LEVEL`; off by default).
    pub compress_cold: Option<u8>,
    /// Mount snapshot N read-only beside the live tree (`snapshot=N`, with
    /// `ro`): see `run`.
    pub snapshot: Option<u64>,
    /// Keep the states of this last span as protected checkpoints
    /// (`protect=DURATION`; off by default): see `protect_loop`.
    pub protect: Option<Duration>,
    /// A store-backed mount: a checkpoint (an upload) at least this often while there are
    /// changes (`upload=SECONDS`, default 30).
    pub upload: Option<Duration>,
    /// A store-backed mount's lease duration (`lease=SECONDS`, default 300; see
    /// `HeldLease::check` for why it must exceed twice the request timeout).
    pub lease: Option<Duration>,
    /// A store-backed mount's upload backlog bound (`upload_backlog=SIZE`; default a
    /// quarter of the file system, or half the cache bound).
    pub upload_backlog: Option<u64>,
    /// A read-only store mount moves to the store's newest checkpoint this often
    /// (`refresh=SECONDS`, default [`DEFAULT_REFRESH`]; 0: only when asked, by `ldfs sync
    /// --remote` on it).
    pub refresh: Option<u64>,
}

/// How often a read-only store mount looks for a newer upload by default: the writer's
/// default upload window, so it lags the writer's last upload by at most as much again.
pub const DEFAULT_REFRESH: Duration = Duration::from_secs(30);

impl MountOpts {
    /// How often a read-only store mount refreshes (`None`: only when asked).
    pub fn refresh_every(&self) -> Option<Duration> {
        match self.refresh {
            None => Some(DEFAULT_REFRESH),
            Some(0) => None,
            Some(s) => Some(Duration::from_secs(s)),
        }
    }
}

/// An option that is on, off, or on where it can be had (the default).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Toggle {
    Auto,
    On,
    Off,
}

impl Default for MountOpts {
    fn default() -> Self {
        MountOpts {
            read_only: false,
            ro_given: false,
            remount: false,
            allow_other: false,
            cache_bytes: 64 << 20,
            commit_secs: 5,
            writeback_cache: false,
            direct_writes: Toggle::Auto,
            atime: ldfs::fs::AtimeMode::Relatime,
            nodiratime: false,
            cleaner: Some(ldfs::lld::PolicyKind::default()),
            clean_start: None,
            clean_stop: None,
            fuse: Vec::new(),
            meta: None,
            transport: Transport::default(),
            discard: false,
            compress: None,
            compress_cold: None,
            snapshot: None,
            protect: None,
            upload: None,
            lease: None,
            upload_backlog: None,
            refresh: None,
        }
    }
}

/// Parses a comma-separated option list (`ro,allow_other,cache=128M,commit=5`).
pub fn parse_options(list: &[String]) -> Result<MountOpts, String> {
    let mut o = MountOpts::default();
    for item in list
        .iter()
        .flat_map(|s| s.split(','))
        .filter(|s| !s.is_empty())
    {
        let (key, val) = match item.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (item, None),
        };
        match (key, val) {
            ("ro", None) => (o.read_only, o.ro_given) = (true, true),
            ("rw", None) => (o.read_only, o.ro_given) = (false, true),
            ("remount", None) => o.remount = true,
            ("allow_other", None) => o.allow_other = true,
            ("writeback_cache", None) => o.writeback_cache = true,
            ("no_writeback_cache", None) => o.writeback_cache = false,
            ("discard", None) => o.discard = true,
            ("nodiscard", None) => o.discard = false,
            ("compress", Some(v)) => {
                o.compress = Some(v.parse().map_err(|e| format!("compress={v}: {e}"))?);
            }
            ("compress_cold", Some("off")) => o.compress_cold = None,
            ("compress_cold", Some(v)) => match v.parse() {
                Ok(ldfs::ld::Compression::Zstd { level }) => o.compress_cold = Some(level),
                Ok(_) => return Err(format!("compress_cold={v}: zstd[:LEVEL] or off")),
                Err(e) => return Err(format!("compress_cold={v}: {e}")),
            },
            ("direct_writes", None) => o.direct_writes = Toggle::On,
            ("nodirect_writes", None) => o.direct_writes = Toggle::Off,
            ("cache", Some(v)) => {
                o.cache_bytes = crate::cli::parse_size(v)
                    .map_err(|e| format!("cache={v}: {e}"))?
                    .try_into()
                    .map_err(|_| format!("cache={v} is too large"))?;
                if o.cache_bytes < 1 << 20 {
                    return Err(format!("cache={v}: at least 1M"));
                }
            }
            ("commit", Some(v)) => {
                o.commit_secs = v
                    .parse()
                    .ok()
                    .filter(|&s: &u64| (1..=3600).contains(&s))
                    .ok_or_else(|| format!("commit={v}: seconds from 1 to 3600"))?;
            }
            ("cleaner", Some("off")) => o.cleaner = None,
            ("cleaner", Some(v)) => {
                o.cleaner = Some(v.parse().map_err(|e| format!("cleaner={v}: {e}"))?);
            }
            ("clean_start", Some(v)) => {
                o.clean_start = Some(
                    v.parse()
                        .map_err(|_| format!("clean_start={v}: a number of segments"))?,
                );
            }
            ("clean_stop", Some(v)) => {
                o.clean_stop = Some(
                    v.parse()
                        .map_err(|_| format!("clean_stop={v}: a number of segments"))?,
                );
            }
            ("meta", Some(v)) if !v.is_empty() => o.meta = Some(PathBuf::from(v)),
            ("protect", Some("0" | "off")) => o.protect = None,
            ("protect", Some(v)) => {
                o.protect = Some(parse_duration(v).map_err(|e| format!("protect={v}: {e}"))?);
            }
            ("snapshot", Some(v)) => {
                o.snapshot = Some(v.parse().ok().filter(|&n: &u64| n > 0).ok_or_else(|| {
                    format!(
                        "snapshot={v}: a snapshot's number (`ldfs checkpoints IMAGE` lists them)"
                    )
                })?);
            }
            ("transport", Some(v)) => o.transport = v.parse()?,
            ("upload", Some(v)) => {
                o.upload = Some(Duration::from_secs(
                    v.parse()
                        .ok()
                        .filter(|&s: &u64| (1..=86_400).contains(&s))
                        .ok_or_else(|| format!("upload={v}: seconds from 1 to 86400"))?,
                ));
            }
            ("lease", Some(v)) => {
                o.lease = Some(Duration::from_secs(
                    v.parse()
                        .ok()
                        .filter(|&s: &u64| {
                            (ldfs::store::lease::MIN_LEASE.as_secs()..=86_400).contains(&s)
                        })
                        .ok_or_else(|| {
                            format!(
                                "lease={v}: seconds from {} to 86400",
                                ldfs::store::lease::MIN_LEASE.as_secs()
                            )
                        })?,
                ));
            }
            ("refresh", Some(v)) => {
                o.refresh = Some(v.parse().ok().filter(|&s: &u64| s <= 86_400).ok_or_else(
                    || format!("refresh={v}: seconds from 0 (only when asked) to 86400"),
                )?);
            }
            ("upload_backlog", Some(v)) => {
                o.upload_backlog = Some(
                    crate::cli::parse_size(v).map_err(|e| format!("upload_backlog={v}: {e}"))?,
                );
            }
            ("dev", None) => o.fuse.push(MountOption::Dev),
            ("nodev", None) => o.fuse.push(MountOption::NoDev),
            ("suid", None) => o.fuse.push(MountOption::Suid),
            ("nosuid", None) => o.fuse.push(MountOption::NoSuid),
            ("exec", None) => o.fuse.push(MountOption::Exec),
            ("noexec", None) => o.fuse.push(MountOption::NoExec),
            // As the kernel: `atime` and `norelatime` mean the default
            // (relatime) unless `strictatime`.
            ("atime" | "norelatime" | "relatime", None) => {
                o.atime = ldfs::fs::AtimeMode::Relatime;
                if key == "atime" {
                    o.fuse.push(MountOption::Atime);
                }
            }
            ("noatime", None) => {
                o.atime = ldfs::fs::AtimeMode::NoAtime;
                o.fuse.push(MountOption::NoAtime);
            }
            ("strictatime", None) => o.atime = ldfs::fs::AtimeMode::StrictAtime,
            ("nodiratime", None) => o.nodiratime = true,
            ("diratime", None) => o.nodiratime = false,
            ("sync", None) => o.fuse.push(MountOption::Sync),
            ("async", None) => o.fuse.push(MountOption::Async),
            // What mount(8) and fstab pass along but is not ours to act on.
            (
                "defaults"
                | "auto"
                | "noauto"
                | "user"
                | "nouser"
                | "users"
                | "nofail"
                | "_netdev"
                | "lazytime"
                | "nolazytime"
                | "default_permissions",
                None,
            ) => {}
            // What a remount through mount(8) passes back from the mount
            // table: set by the daemon at mount, not changeable.
            ("user_id" | "group_id" | "fsname" | "subtype", Some(_)) => {}
            (k, _) if k.starts_with("x-") => {}
            _ => return Err(format!("unknown mount option '{item}'")),
        }
    }
    if let Some(n) = o.snapshot {
        if !o.read_only {
            return Err(format!(
                "snapshot={n}: a snapshot is read-only; mount it with -o ro,snapshot={n}"
            ));
        }
    }
    if o.protect.is_some() && o.read_only && !o.remount {
        return Err("protect= keeps the states a writable mount goes through: not with ro".into());
    }
    if let (Some(a), Some(b)) = (o.clean_start, o.clean_stop) {
        if b < a {
            return Err(format!(
                "clean_stop={b} is below clean_start={a}: cleaning would stop before it starts"
            ));
        }
    }
    Ok(o)
}

/// A span as `protect=` takes it: seconds, or a number with s, m, h or d;
/// from a second to a year.
pub fn parse_duration(v: &str) -> Result<Duration, String> {
    let (num, unit) = match v.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => (&v[..i], &v[i..]),
        None => (v, "s"),
    };
    let mult = match unit {
        "s" => 1,
        "m" | "min" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(format!("unknown unit {unit:?} (s, m, h or d)")),
    };
    let secs = num
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .filter(|&s| (1..=366 * 86_400).contains(&s))
        .ok_or("a span from 1s to 366d")?;
    Ok(Duration::from_secs(secs))
}

/// Generations `protect=` divides its span into: the protected
/// checkpoints of one window of span/8 share a pin bit (with a kept table;
/// docs/DESIGN.md "Snapshots"), so at most 9 of the 24 bits are in use
/// at once and snapshots keep the rest.
const PROTECT_GENERATIONS: u64 = 8;

/// How often and in which windows `protect=SPAN` keeps a checkpoint on an
/// image that can keep `capacity` protected checkpoints: every commit
/// interval, or further apart if the span would need more records than
/// the image holds (a few spare for the expiry's slack); generations of
/// span/8, never shorter than the interval. An image without a kept
/// table (capacity at most 24) keeps one every span/8, as before.
fn protect_schedule(span: Duration, commit_secs: u64, capacity: usize) -> (Duration, u64) {
    let span = span.as_secs().max(1);
    let records = if capacity <= ldfs::lld::snapshot::MAX_SNAPSHOTS {
        // No kept table: a pin bit each, one every span/8 as before (a
        // full table makes the oldest yield, whatever the snapshots hold).
        PROTECT_GENERATIONS
    } else {
        (capacity as u64).saturating_sub(PROTECT_GENERATIONS + 2)
    };
    let every = commit_secs.max(1).max(span.div_ceil(records));
    let window = span.div_ceil(PROTECT_GENERATIONS).max(every);
    (Duration::from_secs(every), window)
}

/// A store mount's upload window when `upload=` is not given.
const DEFAULT_UPLOAD: Duration = Duration::from_secs(30);

/// Seconds since 1970 now.
fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Deletes kept checkpoint `n` unless a reader holds it (a snapshot
/// mount): takes its lock exclusively, non-blocking (DESIGN "Snapshots").
fn delete_kept(lld: &Lld, image: &Path, n: u64) -> Result<(), String> {
    let f = File::options()
        .read(true)
        .write(true)
        .open(image)
        .map_err(|e| format!("{}: {e}", image.display()))?;
    let _lock = ldfs::lld::SnapshotLock::exclusive(f, n).map_err(|e| {
        if e.kind() != std::io::ErrorKind::WouldBlock {
            return format!("locking snapshot {n}: {e}");
        }
        let on = snapshot_mounted_on(image, n);
        if on.is_empty() {
            format!("snapshot {n} is in use (opened by another process, perhaps a mount in another namespace): not deleted")
        } else {
            let dirs: Vec<String> = on.iter().map(|d| d.display().to_string()).collect();
            format!(
                "snapshot {n} is mounted on {}: unmount it first; not deleted",
                dirs.join(", ")
            )
        }
    })?;
    lld.delete_snapshot(n)
        .map_err(|e| format!("snapshot {n} not deleted: {e}"))
}

/// Deletes those of the kept checkpoints `numbers` no reader holds, in one
/// checkpoint (a generation at once); those a reader has mounted stay.
/// With `whole`, deletes none unless no reader holds any (a generation
/// with one held keeps its pin bit: deleting the rest frees nothing).
/// Returns the numbers deleted.
fn delete_kept_many(
    lld: &Lld,
    image: &Path,
    numbers: &[u64],
    whole: bool,
) -> Result<Vec<u64>, String> {
    let f = File::options()
        .read(true)
        .write(true)
        .open(image)
        .map_err(|e| format!("{}: {e}", image.display()))?;
    let mut locks = Vec::new();
    for &n in numbers {
        let c = f
            .try_clone()
            .map_err(|e| format!("{}: {e}", image.display()))?;
        if let Ok(l) = ldfs::lld::SnapshotLock::exclusive(c, n) {
            locks.push(l);
        }
    }
    let free: Vec<u64> = locks.iter().map(|l| l.number()).collect();
    if free.is_empty() || (whole && free.len() < numbers.len()) {
        return Ok(Vec::new());
    }
    lld.delete_kept(&free)
        .map_err(|e| format!("kept checkpoints not deleted: {e}"))?;
    Ok(free)
}

/// The protected checkpoints of a live mount, giving space back to
/// writes (`FuseFs::room`) and to snapshots, one deletion at a time. The
/// count an operation compares is the engine's `kept_deleted`, which every
/// deletion advances (a yield, the protection thread's expiry, `ldfs
/// snapshot --delete`) and which is read without a lock, so operations
/// with room never wait behind a deletion.
pub(crate) struct ProtectedHistory {
    lld: Arc<Lld>,
    image: PathBuf,
    /// Serialises deletions: held across one (which may wait for open
    /// ARUs), never by `given`.
    deleting: std::sync::Mutex<()>,
}

impl ProtectedHistory {
    pub(crate) fn new(lld: Arc<Lld>, image: PathBuf) -> ProtectedHistory {
        ProtectedHistory {
            lld,
            image,
            deleting: std::sync::Mutex::new(()),
        }
    }

    /// `give_back` for a snapshot short of `short` bytes: only segments
    /// the protected checkpoints alone pin and that hold no live bytes
    /// help it (`Lld::kept_bytes_of` with `empty_only`); `short` 0 asks for a pin
    /// bit.
    fn give_back_to_snapshot(&self, short: u64, seen: u64) -> bool {
        self.give_back_by(short, seen, true)
    }

    /// The protected checkpoints no reader has mounted (their locks free
    /// now): the ones a yield can delete.
    fn deletable(&self) -> Vec<u64> {
        // An exclusive lock needs the file open for writing.
        let Ok(f) = File::options().read(true).write(true).open(&self.image) else {
            return Vec::new();
        };
        self.lld
            .snapshots()
            .iter()
            .filter(|s| s.protected)
            .filter(|s| {
                f.try_clone()
                    .ok()
                    .and_then(|c| ldfs::lld::SnapshotLock::exclusive(c, s.number).ok())
                    .is_some()
            })
            .map(|s| s.number)
            .collect()
    }

    fn give_back_by(&self, short: u64, seen: u64, empty_only: bool) -> bool {
        let _one = self.deleting.lock().expect("deleting poisoned");
        if self.lld.kept_deleted() != seen {
            // Some were deleted after this operation tried: try again.
            return true;
        }
        let covers = self.lld.kept_bytes_of(&self.deletable(), empty_only);
        if covers < short {
            // Even all of it would not do: keep it (a request that cannot
            // fit deletes nothing).
            return false;
        }
        yield_protected(&self.lld, &self.image)
    }
}

impl GiveBack for ProtectedHistory {
    fn given(&self) -> u64 {
        self.lld.kept_deleted()
    }

    fn give_back(&self, short: u64, seen: u64) -> bool {
        self.give_back_by(short, seen, false)
    }
}

/// Space is short: deletes the oldest generation of protected
/// checkpoints (those sharing the oldest one's pin bit: deleting fewer
/// frees nothing) no record of which anyone has mounted, saying so in the log (syslog
/// for a background daemon). True if any were deleted. Snapshots never
/// yield.
fn yield_protected(lld: &Lld, image: &Path) -> bool {
    let listed = lld.snapshots();
    let mut tried = 0u32;
    for s in listed.iter().filter(|s| s.protected) {
        if tried & 1 << s.pin != 0 {
            continue;
        }
        tried |= 1 << s.pin;
        let gen: Vec<&ldfs::lld::SnapshotInfo> = listed
            .iter()
            .filter(|o| o.protected && o.pin == s.pin)
            .collect();
        let numbers: Vec<u64> = gen.iter().map(|o| o.number).collect();
        match delete_kept_many(lld, image, &numbers, true) {
            Ok(gone) if !gone.is_empty() => {
                let last = gen.last().map_or(s.time_secs, |o| o.time_secs);
                eprintln!(
                    "ldfs: space is short: deleted {} protected checkpoint(s) {}..{} (of {} to {}) to make room",
                    gone.len(),
                    gone[0],
                    gone[gone.len() - 1],
                    crate::cli::checkpoints::time_text(s.time_secs),
                    crate::cli::checkpoints::time_text(last)
                );
                return true;
            }
            _ => {}
        }
    }
    false
}

/// `protect=`: every `every` takes a protected checkpoint if anything was
/// written since the last (in generations of `window` seconds, which share
/// a pin bit), and deletes those older than `keep` (plus one interval, so
/// the state of `keep` ago is still there). Stops with `stop`.
/// Paused while the mount is read-only (`remount,ro`: a shutdown expects
/// no more writes).
fn protect_loop(
    lld: Arc<Lld>,
    fs: Arc<Fs>,
    image: PathBuf,
    keep: Duration,
    every: Duration,
    window: u64,
    stop: &AtomicBool,
) {
    let tick = Duration::from_millis(100);
    let mut waited = Duration::ZERO;
    // Nothing written since the mount: its state is the previous one's.
    let mut written = Some(lld.write_totals().0);
    let mut said = false;
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(tick);
        waited += tick;
        if waited < every {
            continue;
        }
        waited = Duration::ZERO;
        if fs.is_read_only() {
            continue;
        }
        let now = now_secs();
        let oldest_kept = now.saturating_sub(keep.as_secs() + every.as_secs());
        let expired: Vec<u64> = lld
            .snapshots()
            .iter()
            .filter(|s| s.protected && s.time_secs < oldest_kept)
            .map(|s| s.number)
            .collect();
        // In one checkpoint; a mounted one stays until it is unmounted.
        if let Err(e) = delete_kept_many(&lld, &image, &expired, false) {
            eprintln!("ldfs: protect: {e}");
        }
        let user = lld.write_totals().0;
        if written == Some(user) {
            continue;
        }
        // What stat shows, atimes reads kept included (only when there are
        // changes anyway: reads alone take no protected checkpoint).
        fs.write_kept();
        let user = lld.write_totals().0;
        match lld.take_protected(now, window) {
            Ok(_) => {
                written = Some(user);
                said = false;
            }
            Err(e) if !said => {
                eprintln!("ldfs: protect: no protected checkpoint taken: {e}");
                said = true;
            }
            Err(_) => {}
        }
    }
}

/// How long a mount or fsck waits for a daemon that is still writing its
/// final checkpoint after its file system was unmounted.
pub(crate) const EXITING_DAEMON_WAIT: Duration = Duration::from_secs(60);

/// Why the image's lock could not be taken.
#[derive(Debug)]
pub(crate) enum LockError {
    /// The image cannot be opened.
    Open { image: PathBuf, err: std::io::Error },
    /// A live mount of the image: refused at once.
    Mounted { image: PathBuf, on: PathBuf },
    /// Held by a process that is not an ldfs daemon (an fsck, say).
    InUse { image: PathBuf, holder: String },
    /// Still held after waiting for an exiting daemon.
    TimedOut { image: PathBuf, holder: String },
}

impl std::fmt::Display for LockError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LockError::Open { image, err } => write!(f, "{}: {err}", image.display()),
            LockError::Mounted { image, on } => write!(
                f,
                "{} is already mounted on {}",
                image.display(),
                on.display()
            ),
            LockError::InUse { image, holder } => {
                write!(f, "{} is in use by {holder}", image.display())
            }
            LockError::TimedOut { image, holder } => write!(
                f,
                "{} is still locked by {holder} after {} s",
                image.display(),
                EXITING_DAEMON_WAIT.as_secs()
            ),
        }
    }
}

/// Takes the image's lock: exclusive for a mount or a repair (held for the
/// life of the mount, so a second mount is refused), shared for a check.
///
/// A busy lock held by a live mount of the image (listed in
/// /proc/self/mounts) is refused at once, naming the mount point. Held by
/// anything else that may be an ldfs daemon, it is most likely one whose
/// file system was just unmounted and which is still writing its final
/// checkpoint: scripts run `fusermount3 -u DIR && ldfs mount IMG DIR`, so
/// that is waited for, up to [`EXITING_DAEMON_WAIT`], saying so once on
/// stderr as `who`.
pub(crate) fn lock_image(image: &Path, exclusive: bool, who: &str) -> Result<File, LockError> {
    let f = File::open(image).map_err(|err| LockError::Open {
        image: image.to_path_buf(),
        err,
    })?;
    let mode = if exclusive {
        libc::LOCK_EX
    } else {
        libc::LOCK_SH
    };
    let started = std::time::Instant::now();
    let mut said = false;
    loop {
        if unsafe { libc::flock(f.as_raw_fd(), mode | libc::LOCK_NB) } == 0 {
            return Ok(f);
        }
        if let Some(on) = mounted_on(image) {
            return Err(LockError::Mounted {
                image: image.to_path_buf(),
                on,
            });
        }
        let holder = lock_holder(&f);
        let holder_text = match &holder {
            // An exiting process has no command line left (its memory is
            // gone before its files, and so its lock, are released).
            Some((pid, cmd)) if cmd.is_empty() => format!("process {pid} (exiting)"),
            Some((pid, cmd)) => format!("process {pid} ({cmd})"),
            None => "another process".to_string(),
        };
        if let Some((_, cmd)) = &holder {
            if !worth_waiting_for(cmd) {
                return Err(LockError::InUse {
                    image: image.to_path_buf(),
                    holder: holder_text,
                });
            }
        }
        if started.elapsed() >= EXITING_DAEMON_WAIT {
            return Err(LockError::TimedOut {
                image: image.to_path_buf(),
                holder: holder_text,
            });
        }
        if !said {
            eprintln!(
                "{who}: {} is locked by {holder_text}, an ldfs daemon not (or no longer) mounted: finishing its final checkpoint after an unmount, or still opening the image; waiting up to {} s",
                image.display(),
                EXITING_DAEMON_WAIT.as_secs()
            );
            said = true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The mount source of snapshot `n` of the image at `canon` (absolute).
pub(crate) fn snapshot_source(canon: &Path, n: u64) -> String {
    format!("{}@snapshot={n}", canon.display())
}

/// Where snapshot `n` of `image` is mounted (in this namespace).
pub(crate) fn snapshot_mounted_on(image: &Path, n: u64) -> Vec<PathBuf> {
    let Ok(canon) = std::fs::canonicalize(image) else {
        return Vec::new();
    };
    let want = snapshot_source(&canon, n);
    mounts()
        .into_iter()
        .filter(|m| m.kind.starts_with("fuse") && m.source == want)
        .map(|m| m.dir)
        .collect()
}

/// A snapshot reader's lock (shared) on snapshot `n` of `image`.
fn lock_snapshot(image: &Path, n: u64) -> Result<ldfs::lld::SnapshotLock, String> {
    let f = File::open(image).map_err(|e| format!("{}: {e}", image.display()))?;
    ldfs::lld::SnapshotLock::shared(f, n).map_err(|e| {
        if e.kind() == std::io::ErrorKind::WouldBlock {
            format!("{}: snapshot {n} is being deleted", image.display())
        } else {
            format!("{}: locking snapshot {n}: {e}", image.display())
        }
    })
}

/// Where the image is mounted, if a live FUSE mount of it is listed in
/// /proc/self/mounts (its source is the image: ldfs mounts name it by its
/// absolute path).
pub(crate) fn mounted_on(image: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let want = std::fs::metadata(image).ok()?;
    mounts().into_iter().find_map(|m| {
        if m.kind != "fuse.ldfs" && m.kind != "fuse" {
            return None;
        }
        let src = std::fs::metadata(&m.source).ok()?;
        (src.dev() == want.dev() && src.ino() == want.ino()).then_some(m.dir)
    })
}

/// Every mount of this process's namespace, in the order they were made,
/// from /proc/self/mountinfo (the one parser of the mount table).
pub(crate) fn mounts() -> Vec<MountEntry> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    // "36 35 0:52 / /mnt/x rw,nosuid shared:1 - fuse.ldfs /img rw,...":
    // optional fields end at "-".
    info.lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split(' ').collect();
            let (maj, min) = w.get(2)?.split_once(':')?;
            let dash = w.iter().position(|&x| x == "-")?;
            Some(MountEntry {
                dev: (maj.parse().ok()?, min.parse().ok()?),
                dir: PathBuf::from(unescape_mount_field(w.get(4)?)),
                kind: w.get(dash + 1)?.to_string(),
                source: unescape_mount_field(w.get(dash + 2)?),
                read_only: w.get(5)?.split(',').any(|o| o == "ro"),
            })
        })
        .collect()
}

/// /proc/self/mounts and mountinfo write space, tab, newline and backslash
/// in names as `\ooo` (octal).
fn unescape_mount_field(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let oct = b
            .get(i + 1..i + 4)
            .filter(|o| o.iter().all(|c| (b'0'..=b'7').contains(c)));
        match oct {
            Some(o) if b[i] == b'\\' => {
                out.push(o.iter().fold(0u8, |v, c| v.wrapping_mul(8) + (c - b'0')));
                i += 4;
            }
            _ => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The process holding a lock on `f`'s file (from /proc/locks) and its
/// command line (empty while the process exits), if it can be seen from
/// here.
fn lock_holder(f: &File) -> Option<(u32, String)> {
    use std::os::unix::fs::MetadataExt;
    let meta = f.metadata().ok()?;
    let (maj, min) = (libc::major(meta.dev()), libc::minor(meta.dev()));
    let want = format!("{maj:02x}:{min:02x}:{}", meta.ino());
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    // "1: FLOCK  ADVISORY  WRITE 4242 00:2d:123 0 EOF"; waiters have "->".
    let pid: u32 = locks.lines().find_map(|l| {
        let w: Vec<&str> = l.split_whitespace().collect();
        (w.len() >= 6 && w[1] == "FLOCK" && w[5] == want)
            .then(|| w[4].parse().ok())
            .flatten()
    })?;
    if pid == 0 {
        return None;
    }
    let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let cmd: Vec<String> = cmd
        .split(|&c| c == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    Some((pid, cmd.join(" ")))
}

/// Whether a lock holder with this command line may be an ldfs daemon
/// about to let go: a mount daemon, or a process already exiting (the
/// kernel drops a process's memory, and with it its command line, before
/// its files and their locks; seen in CI right after an unmount).
fn worth_waiting_for(cmd: &str) -> bool {
    cmd.is_empty() || is_mount_daemon(cmd)
}

/// Whether a command line is an ldfs mount daemon's (`ldfs mount ...`, or
/// the mount helper `mount.fuse.ldfs ...`).
fn is_mount_daemon(cmd: &str) -> bool {
    let mut words = cmd.split(' ');
    let prog = words.next().unwrap_or("");
    let base = prog.rsplit('/').next().unwrap_or(prog);
    base.starts_with("mount.") || (base.starts_with("ldfs") && words.next() == Some("mount"))
}

/// Applies the `direct_writes` option: asked for, a refusal is an error;
/// by default it falls back to buffered writes with one line saying why.
fn with_direct_writes(mut dev: FileDevice, image: &Path, t: Toggle) -> Result<FileDevice, String> {
    if t == Toggle::Off {
        return Ok(dev);
    }
    match dev.direct_writes() {
        Ok(()) => Ok(dev),
        Err(e) if t == Toggle::On => Err(format!("{}: direct_writes: {e}", image.display())),
        Err(e) => {
            eprintln!(
                "ldfs: {}: writes stay buffered (no O_DIRECT: {e})",
                image.display()
            );
            Ok(dev)
        }
    }
}

/// Checks that `dir` is a directory with nothing mounted on it; returns its
/// absolute path (as /proc/self/mountinfo names it).
fn check_mountpoint(dir: &Path) -> Result<PathBuf, String> {
    let meta = std::fs::metadata(dir).map_err(|e| format!("mount point {}: {e}", dir.display()))?;
    if !meta.is_dir() {
        return Err(format!("mount point {} is not a directory", dir.display()));
    }
    let canon = dir
        .canonicalize()
        .map_err(|e| format!("mount point {}: {e}", dir.display()))?;
    if top_mount(&canon).is_some() {
        return Err(format!(
            "mount point {} is busy: something is mounted there",
            dir.display()
        ));
    }
    Ok(canon)
}

/// The topmost mount at `dir` (absolute) in /proc/self/mountinfo.
pub(crate) fn top_mount(dir: &Path) -> Option<MountEntry> {
    // Later lines are mounted later, so the last one at `dir` is on top.
    mounts().into_iter().rev().find(|m| m.dir == dir)
}

/// A mount as /proc/self/mountinfo lists it.
pub(crate) struct MountEntry {
    /// Its device (major, minor).
    pub dev: (u32, u32),
    /// Its mount point, absolute.
    pub dir: PathBuf,
    /// Its file-system type (`fuse.ldfs`).
    pub kind: String,
    /// Its source (an ldfs mount's is its image's absolute path).
    pub source: String,
    /// Mounted read-only (the mount's own options).
    pub read_only: bool,
}

/// Ends the mount when a signal comes, also when it is busy (a file held
/// open, a process's working directory inside): then a plain unmount fails
/// with EBUSY, so the mount is detached lazily, which leaves the FUSE
/// connection up for as long as the open files stay, and the connection is
/// aborted, which ends the session. Processes that still hold files get
/// ENOTCONN, as at any shutdown; the engine then closes with its final
/// checkpoint, with everything the daemon accepted.
struct Ender {
    /// The mount point, absolute.
    dir: PathBuf,
    /// The mount's device: tells our mount from whatever is mounted there
    /// later, and names its connection in /sys/fs/fuse/connections.
    dev: Option<(u32, u32)>,
    /// The mount's source (the image's absolute path): tells our mount
    /// when its device is unknown.
    source: String,
    /// Set when the session has ended and the final checkpoint runs.
    served: AtomicBool,
    /// A store mount's backlog gate: let go as the end begins (`WriteGate::let_go`).
    gate: Option<Arc<dyn WriteGate>>,
}

impl Ender {
    /// Whether our mount is still the one on top at `dir`: by its device
    /// if known, else a FUSE mount of our image (never whatever else is
    /// mounted there now, which an unmount must not touch).
    fn attached(&self) -> bool {
        match (top_mount(&self.dir), self.dev) {
            (Some(m), Some(ours)) => m.dev == ours,
            (Some(m), None) => m.kind.starts_with("fuse") && m.source == self.source,
            (None, _) => false,
        }
    }

    /// The first signal: flush the kernel's writeback cache (after a lazy
    /// detach and an abort, dirty pages would be lost), unmount, and if the
    /// mount is busy, detach it and end the connection.
    fn end(&self) {
        // First: the flush's writes would wait on the gate too, and the
        // session's end joins a writer's thread held there (review 32
        // finding 7).
        self.let_writers_go();
        if !self.attached() {
            return self.abort();
        }
        if let Err(e) = syncfs(&self.dir) {
            eprintln!(
                "ldfs: flushing {} before unmounting: {e}",
                self.dir.display()
            );
        }
        // Busy for a moment after our own close of the mount point (the
        // kernel finishes RELEASE asynchronously); busy for good when a
        // process holds a file or its working directory there.
        // Bind mounts of this mount (a second `ldfs mount` of the image)
        // share its connection: the daemon ends when all are gone.
        for other in self.dev.map(mount_points).unwrap_or_default() {
            if other != self.dir {
                if let Err(e) = unmount(&other, false) {
                    eprintln!("ldfs: unmounting {}: {e}", other.display());
                }
            }
        }
        let mut tries = 0;
        let err = loop {
            match unmount(&self.dir, false) {
                Ok(()) => return,
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) && tries < 5 => {
                    tries += 1;
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => break e,
            }
        };
        if self.served.load(Ordering::Relaxed) || !self.attached() {
            return;
        }
        eprintln!(
            "ldfs: unmounting {}: {err}; detaching it lazily and ending the FUSE connection: processes still using it get errors",
            self.dir.display()
        );
        self.force();
    }

    /// Detaches the mount lazily if it is still attached, and aborts the
    /// connection: the session then ends whatever holds the mount.
    fn force(&self) {
        self.let_writers_go();
        if self.attached() {
            if let Err(e) = unmount(&self.dir, true) {
                eprintln!("ldfs: detaching {}: {e}", self.dir.display());
            }
        }
        self.abort();
    }

    /// Writers held by a store mount's backlog gate go on (into the cache).
    fn let_writers_go(&self) {
        if let Some(g) = &self.gate {
            g.let_go();
        }
    }

    fn abort(&self) {
        let Some(dev) = self.dev else {
            eprintln!(
                "ldfs: the FUSE connection of {} is unknown (not in /proc/self/mountinfo at mount): the daemon ends when its last open file is closed",
                self.dir.display()
            );
            return;
        };
        if let Err(e) = abort_connection(dev) {
            if !self.served.load(Ordering::Relaxed) {
                eprintln!(
                    "ldfs: ending the FUSE connection of {}: {e}; the daemon ends when its last open file is closed",
                    self.dir.display()
                );
            }
        }
    }
}

/// syncfs(2) on the file system mounted at `dir`.
fn syncfs(dir: &Path) -> std::io::Result<()> {
    let d = File::open(dir)?;
    if unsafe { libc::syncfs(d.as_raw_fd()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Unmounts `dir` (lazily: detaches it, leaving the file system alive while
/// it is in use); as root with umount2(2), otherwise through fusermount3.
fn unmount(dir: &Path, lazy: bool) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes())?;
    let flags = if lazy { libc::MNT_DETACH } else { 0 };
    if unsafe { libc::umount2(c.as_ptr(), flags) } == 0 {
        return Ok(());
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() != Some(libc::EPERM) {
        return Err(e);
    }
    let out = Command::new("fusermount3")
        .arg("-u")
        .args(lazy.then_some("-z"))
        .arg("--")
        .arg(dir)
        .stdin(Stdio::null())
        .output()?;
    if out.status.success() {
        return Ok(());
    }
    let text = String::from_utf8_lossy(&out.stderr).trim().to_string();
    Err(if text.contains("busy") {
        std::io::Error::from_raw_os_error(libc::EBUSY)
    } else {
        std::io::Error::other(format!("fusermount3: {text}"))
    })
}

/// Aborts the FUSE connection of the mount with device `dev` through
/// fusectl: every request, pending and future, fails, and the daemon's
/// reads of /dev/fuse end (ENODEV). fusectl is mounted if it is not
/// (systemd mounts it at boot; containers often do not).
fn abort_connection(dev: (u32, u32)) -> std::io::Result<()> {
    let conns = Path::new("/sys/fs/fuse/connections");
    let mounted = mounts().iter().any(|m| m.kind == "fusectl");
    if !mounted {
        let r = unsafe {
            libc::mount(
                c"fusectl".as_ptr(),
                c"/sys/fs/fuse/connections".as_ptr(),
                c"fusectl".as_ptr(),
                0,
                std::ptr::null(),
            )
        };
        if r != 0 {
            let e = std::io::Error::last_os_error();
            return Err(std::io::Error::new(
                e.kind(),
                format!("mounting fusectl on {}: {e}", conns.display()),
            ));
        }
    }
    // The kernel names a connection by its device number, encoded as the
    // kernel does (major << 20 | minor).
    let conn = conns.join((dev.0 << 20 | dev.1).to_string());
    match std::fs::write(conn.join("abort"), b"1") {
        // fusectl lists every live connection: this one has ended.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        r => r.map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", conn.display()))),
    }
}

fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGTERM => "SIGTERM",
        libc::SIGINT => "SIGINT",
        libc::SIGHUP => "SIGHUP",
        _ => "a signal",
    }
}

/// Blocks the signals the mount handles, so only the signal thread gets them.
fn block_signals() -> libc::sigset_t {
    let set = mount_signals();
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    set
}

/// The signals the mount handles (SIGINT, SIGTERM, SIGHUP).
fn mount_signals() -> libc::sigset_t {
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::sigaddset(&mut set, s);
        }
        set
    }
}

/// Runs `f` with the mount's signals blocked in this thread, then puts its mask back: threads
/// `f` starts inherit the mask, so they never take a signal meant for the signal thread, while
/// this thread keeps the default action (before the mount, a signal ends the process).
fn with_signals_blocked<T>(f: impl FnOnce() -> T) -> T {
    let set = mount_signals();
    let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old) };
    let r = f();
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    r
}

/// What `ldfs mount s3://BUCKET[/PREFIX] DIR` takes beside the options.
#[derive(Clone, Debug, Default)]
pub struct StoreArgs {
    /// `--cache PATH`: the local cache and write log.
    pub cache: Option<PathBuf>,
    /// `--cache-size N`: the cache's bound (else the note's).
    pub cache_size: Option<u64>,
    /// `--force-takeover`: take an expired lease of a writer that did not release it.
    pub force_takeover: bool,
}

pub fn run(
    image: PathBuf,
    dir: PathBuf,
    foreground: bool,
    options: Vec<String>,
    daemon_child: bool,
    store_args: StoreArgs,
) -> Result<(), String> {
    let opts = parse_options(&options)?;
    if opts.remount {
        return remount(&dir, &opts);
    }
    let url = if StoreUrl::is_store(&image) {
        let u = StoreUrl::parse(&image.to_string_lossy())?;
        if store_args.cache.is_none() {
            return Err(format!(
                "{u}: a store mount needs --cache PATH (its local cache)"
            ));
        }
        if opts.snapshot.is_some() || opts.protect.is_some() {
            return Err(format!(
                "{u}: snapshot= and protect= are not for a store-backed file system (yet)"
            ));
        }
        if opts.refresh.is_some() && !opts.read_only {
            return Err(format!(
                "{u}: refresh= is for a read-only mount (-o ro), which follows the writer's \
                 uploads; a read-write mount is the writer"
            ));
        }
        Some(u)
    } else {
        if store_args.cache.is_some()
            || store_args.force_takeover
            || store_args.cache_size.is_some()
        {
            return Err(
                "--cache and --force-takeover are for a store mount (s3://BUCKET[/PREFIX])".into(),
            );
        }
        if opts.upload.is_some()
            || opts.lease.is_some()
            || opts.upload_backlog.is_some()
            || opts.refresh.is_some()
        {
            return Err(
                "upload=, lease=, upload_backlog= and refresh= are for a store mount \
                 (s3://BUCKET[/PREFIX])"
                    .into(),
            );
        }
        None
    };
    // A snapshot mount is a daemon of its own beside the live one. (A store mount's image is
    // its cache.)
    if opts.snapshot.is_none() {
        if let Some(on) = mounted_on(store_args.cache.as_ref().unwrap_or(&image)) {
            return bind_mount(&on, &dir, &opts);
        }
    }
    if !foreground {
        return spawn_daemon(&image, &dir, &options, &store_args);
    }
    // From here on a store mount's image is its cache.
    let image = store_args.cache.clone().unwrap_or(image);
    if daemon_child {
        // A session of its own: the terminal's hangup must not reach the daemon as the SIGHUP
        // that unmounts (DESIGN "The daemon's session", which also gives what it costs).
        unsafe { libc::setsid() };
    }
    let canon_dir = check_mountpoint(&dir)?;
    // Signals keep their default action (end the process) while the lock
    // is waited for (up to a minute for an exiting daemon): nothing is
    // mounted or opened yet, so nothing needs a clean end. Blocked from
    // here on, before any thread starts, for the signal thread.
    // A snapshot mount takes no image lock (the live mount holds it
    // exclusively) but its snapshot's, shared, before the engine reads the
    // slot: a deletion is then refused while it is mounted (DESIGN
    // "Snapshots"). It opens the image read-only: the kernel refuses any
    // write it could make.
    // A store mount: the bucket opened and found to hold a file system before anything is
    // made or taken (review 31: a mistyped prefix got lease objects and an empty cache file).
    let store = match &url {
        Some(u) => {
            // A writer's requests end before its lease can expire (the fence, review 31).
            let timeout = match opts.read_only {
                true => None,
                false => Some(ldfs::store::lease::request_timeout_for(
                    opts.lease
                        .unwrap_or(ldfs::store::LeaseOptions::default().duration),
                )),
            };
            let s3 = u.open(timeout)?;
            let store: Arc<dyn ldfs::store::ObjectStore> = s3;
            crate::cli::store::holds_file_system(&*store, u)?;
            Some(store)
        }
        None => None,
    };
    if url.is_some() && !image.exists() {
        // Made (empty) to be locked; `prepare_cache` sizes it and rebuilds it from the store.
        File::create(&image).map_err(|e| format!("{}: {e}", image.display()))?;
    }
    let (_lock, _snapshot_lock) = match opts.snapshot {
        None => (
            Some(lock_image(&image, true, "ldfs").map_err(|e| e.to_string())?),
            None,
        ),
        Some(n) => (None, Some(lock_snapshot(&image, n)?)),
    };
    // A store mount: the lease (read-write), then the cache kept or rebuilt from the store.
    // Given back as it was found if the mount is refused before it serves (store5).
    let mut lease_until_served = LeaseUntilServed::default();
    // A read-only store mount's pin and the checkpoint it keeps: the pin goes to its
    // `ReaderMount` (deleted at the mount's end, or on any earlier way out when dropped).
    let mut reader_pin = None;
    let store_ctx = match (&url, store) {
        (Some(u), Some(store)) => {
            // Its renewer thread must never take a signal: a process-directed one goes to a
            // thread that does not block it, and SIGTERM's default action there ended the
            // whole daemon at once, no final checkpoint, the mount left dead (found by the
            // backlog gate's test, review 32 finding 7).
            let lease = if opts.read_only {
                None
            } else {
                Some(with_signals_blocked(|| {
                    crate::cli::store::take_lease(
                        store.clone(),
                        u,
                        opts.lease
                            .unwrap_or(ldfs::store::LeaseOptions::default().duration),
                        store_args.force_takeover,
                    )
                })?)
            };
            lease_until_served.hold(lease.clone(), u.clone());
            let bound = match &lease {
                Some(l) => crate::cli::store::prepare_cache_sized(
                    &*store,
                    u,
                    &image,
                    Some(l.writer()),
                    store_args.cache_size,
                )?,
                // A reader pins the checkpoint it mounts, so the writer keeps what it names
                // while this mount lives, and fetches segments as it reads them
                // (`store::readers`). Its renewer thread takes no signal (as the lease's).
                None => {
                    let (pin, key, obj) = with_signals_blocked(|| {
                        crate::cli::store::take_pin(
                            store.clone(),
                            u,
                            opts.lease
                                .unwrap_or(ldfs::store::LeaseOptions::default().duration),
                        )
                    })?;
                    let bound = crate::cli::store::prepare_reader_cache(
                        &*store,
                        u,
                        &image,
                        store_args.cache_size,
                        &key,
                        &obj,
                        &[],
                    )?;
                    reader_pin = Some((Arc::new(pin), key, obj));
                    bound
                }
            };
            Some((u.clone(), store, lease, bound))
        }
        _ => None,
    };
    let sigset = block_signals();
    let dev: Arc<dyn Device> = if opts.snapshot.is_some() {
        Arc::new(
            FileDevice::open_read_only(&image).map_err(|e| format!("{}: {e}", image.display()))?,
        )
    } else {
        open_image(&image, opts.direct_writes)?
    };
    if let (Some(n), true) = (opts.snapshot, ldfs::dual::is_data_device(&*dev)) {
        return Err(format!(
            "snapshot={n}: {} is a dual file system, whose data is updated in place: it has no snapshots",
            image.display()
        ));
    }
    if opts.protect.is_some() && ldfs::dual::is_data_device(&*dev) {
        return Err(format!(
            "protect=: {} is a dual file system, whose data is updated in place: it keeps no checkpoints",
            image.display()
        ));
    }
    if store_ctx.is_some() && ldfs::dual::is_data_device(&*dev) {
        return Err(format!(
            "{}: a dual file system cannot be store-backed",
            image.display()
        ));
    }
    // A read-write store mount: lld writes the cache through the layer (its writes counted for
    // the backlog), and tells it of each durable checkpoint.
    // Its reads go through the cache's residency (segments the cache does not hold fetched;
    // with a bound, uploaded ones evicted).
    // A read-only store mount: the engine of its pinned checkpoint (a refresh builds the next
    // one the same way: `fuse::refresh`).
    let reader_engine = match (&store_ctx, reader_pin.take()) {
        (Some((u, store, None, bound)), Some((pin, key, obj))) => Some(open_reader_engine(
            store,
            u,
            &image,
            dev.clone(),
            *bound,
            pin,
            &key,
            &obj,
            &opts,
        )?),
        _ => None,
    };
    let (dev, seg) = match &store_ctx {
        Some((u, store, Some(lease), bound)) => {
            let seg = ldfs::store::SegmentStore::start_cached(
                store.clone(),
                dev,
                lease.clone(),
                ldfs::store::SegmentStoreOptions::default(),
                Some(ldfs::store::CacheConfig::new(
                    crate::cli::store::map_path(&image),
                    *bound,
                )),
            )
            .map_err(|e| crate::cli::store::start_failed(u, &image, &e))?;
            // Nothing goes to the store until the mount serves (`LeaseUntilServed`).
            seg.hold_uploads();
            (seg.device(), Some(seg))
        }
        _ => (dev, None),
    };
    // A read-only store mount has its engine already; every other mount opens its own here.
    let mut _meta_lock = None;
    let (lld, dual, fs, reader) = match reader_engine {
        Some(e) => (e.lld, None, e.fs, Some(e.reader)),
        None => {
            let bounded = matches!(&store_ctx, Some((_, _, Some(_), Some(_))));
            let lld_opts = lld_options(&opts, seg.as_ref(), bounded);
            // A dual file system: IMAGE is its data device; the metadata device is
            // found by the path its label recorded, or `meta=`, and locked too.
            let (ld, lld, dual): (Arc<dyn LogicalDisk>, Arc<Lld>, Option<Arc<Dual>>) =
                if ldfs::dual::is_data_device(&*dev) {
                    let meta_path = dual_meta_path(&*dev, &image, opts.meta.as_deref())?;
                    _meta_lock =
                        Some(lock_image(&meta_path, true, "ldfs").map_err(|e| e.to_string())?);
                    let meta = FileDevice::open(&meta_path, FileDeviceOptions::default())
                        .map_err(|e| format!("{}: {e}", meta_path.display()))?;
                    let meta: Arc<dyn Device> =
                        Arc::new(with_direct_writes(meta, &meta_path, opts.direct_writes)?);
                    let d = Arc::new(Dual::open(meta, dev, lld_opts).map_err(|e| {
                        format!(
                            "{} with metadata {}: {e}",
                            image.display(),
                            meta_path.display()
                        )
                    })?);
                    (d.clone(), d.meta_arc(), Some(d))
                } else {
                    if opts.meta.is_some() {
                        return Err(format!(
                            "{}: meta= is for a dual file system (ldfs mkfs --meta); this one \
                             has one log",
                            image.display()
                        ));
                    }
                    let l = Arc::new(
                        Lld::open(dev, lld_opts)
                            .map_err(|e| format!("{}: {e}", image.display()))?,
                    );
                    (l.clone(), l, None)
                };
            let fs = Arc::new(
                Fs::mount(
                    ld,
                    FsOptions {
                        read_only: opts.read_only,
                        compress: opts.compress.unwrap_or_default(),
                        ..Default::default()
                    },
                )
                .map_err(|e| format!("{}: {e}", image.display()))?,
            );
            (lld, dual, fs, None)
        }
    };
    let store_mount = match (seg, &store_ctx) {
        (Some(seg), Some((u, _, _, cache_bound))) => {
            // Segments Clean in the cache but still allocated (a mount without discard
            // before) count against no bound: given back now.
            if cache_bound.is_some() {
                if let Err(e) = lld.trim() {
                    eprintln!("ldfs: giving clean segments of the cache back: {e}");
                }
            }
            // With a cache bound, writers wait at half of it: the rest stays evictable.
            let default_backlog = match cache_bound {
                Some(b) => (lld.device_bytes() / 4).min(b / 2),
                None => lld.device_bytes() / 4,
            };
            let bound = opts.upload_backlog.unwrap_or(default_backlog).max(1);
            eprintln!(
                "ldfs: {u}: writer {} (lease generation), cache {}{}, upload window {} s, backlog bound {bound} bytes",
                seg.lease().writer(),
                image.display(),
                match cache_bound {
                    Some(b) => format!(" (at most {b} bytes of segments)"),
                    None => String::new(),
                },
                opts.upload.unwrap_or(DEFAULT_UPLOAD).as_secs()
            );
            Some(Arc::new(
                StoreMount::new(u.clone(), seg, lld.clone(), bound).with_cache_file(image.clone()),
            ))
        }
        _ => None,
    };

    // By its absolute path: a mount or fsck of the image, from any
    // directory, finds this mount in /proc/self/mounts. A snapshot mount's
    // source names its snapshot, so that it is never taken for the live
    // mount (nor bound to by a second mount of the image).
    let canon_image = std::fs::canonicalize(&image).unwrap_or_else(|_| image.clone());
    let source = match opts.snapshot {
        None => canon_image.display().to_string(),
        Some(n) => snapshot_source(&canon_image, n),
    };
    let mut cfg = Config::default();
    cfg.mount_options = vec![
        MountOption::FSName(source.clone()),
        // The type is `fuse.ldfs` (so mount(8) runs mount.fuse.ldfs for a
        // remount): as a kernel option when root mounts with mount(2)
        // itself (fuser's Subtype only reaches fusermount3, which also
        // takes it this way).
        MountOption::CUSTOM("subtype=ldfs".into()),
        MountOption::DefaultPermissions,
        if opts.read_only {
            MountOption::RO
        } else {
            MountOption::RW
        },
    ];
    cfg.mount_options.extend(opts.fuse.iter().cloned());
    if opts.allow_other {
        cfg.acl = SessionACL::All;
    }
    cfg.n_threads = Some(crate::fuse::FUSE_THREADS);
    let frontend = Frontend {
        transport: Arc::new(std::sync::Mutex::new("/dev/fuse".to_string())),
        ring_served: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
        image: canon_image.clone(),
        snapshot: opts.snapshot,
        read_only: opts.read_only,
        writeback_cache: opts.writeback_cache,
        atime: opts.atime,
        nodiratime: opts.nodiratime,
    };
    let (transport_text, ring_served) = (frontend.transport.clone(), frontend.ring_served.clone());
    let scrub = Arc::new(Scrub::default());
    let history = Arc::new(ProtectedHistory::new(lld.clone(), canon_image.clone()));
    let fuse_fs = frontend.adapter(Engine {
        lld: lld.clone(),
        dual: dual.clone(),
        fs: fs.clone(),
        store: store_mount.clone(),
        reader: reader.clone(),
        history: history.clone(),
        scrub: scrub.clone(),
    });
    drop(history);
    let want_uring = transport::choose(opts.transport)?;
    // A read-only store mount serves whichever engine its refresher put in; every other mount
    // the one it opened.
    let (serving, refresher, kept) = match (reader, &store_ctx) {
        (Some(reader), Some((u, store, _, _))) => {
            let serving = Arc::new(Refreshing::swappable(fuse_fs.clone()));
            let first = Served {
                fuse: fuse_fs.clone(),
                fs,
                lld,
                reader,
                quiesce: {
                    let scrub = scrub.clone();
                    Box::new(move || scrub.stop_and_join())
                },
            };
            let duration = opts
                .lease
                .unwrap_or(ldfs::store::LeaseOptions::default().duration);
            let take_pin: Box<crate::fuse::refresh::TakePin> = {
                let (store, u) = (store.clone(), u.clone());
                Box::new(move || crate::cli::store::take_pin(store.clone(), &u, duration))
            };
            let build: Box<crate::fuse::refresh::Build> = {
                let (store, u, image, frontend, opts) = (
                    store.clone(),
                    u.clone(),
                    image.clone(),
                    frontend.clone(),
                    opts.clone(),
                );
                let cache_size = store_args.cache_size;
                Box::new(move |pin, key, obj, keep| {
                    rebuild_reader(
                        &store, &u, &image, cache_size, &opts, &frontend, pin, key, obj, keep,
                    )
                })
            };
            let r = Refresher::new(serving.clone(), first, store.clone(), take_pin, build);
            (serving, Some(r), None)
        }
        (_, _) => (
            Arc::new(Refreshing::fixed(fuse_fs.clone())),
            None,
            Some((fs, lld)),
        ),
    };
    let start = want_uring.then(|| Arc::new(uring::Start::default()));
    let session = Session::new(
        Dev {
            fs: serving.clone(),
            uring: start.clone(),
        },
        &dir,
        &cfg,
    )
    .map_err(|e| format!("mounting on {}: {e}", dir.display()))?;
    // Mounted: from here the mount's end (`StoreMount::finish`) releases the lease or keeps it.
    lease_until_served.served();
    if let Some(s) = &store_mount {
        s.seg.release_uploads();
    }

    // Signals end the mount (see Ender); the session then returns and the
    // engine closes. A later signal is never ignored: it forces the end.
    let ender = Arc::new(Ender {
        dev: top_mount(&canon_dir)
            .filter(|m| m.kind.starts_with("fuse") && m.source == source)
            .map(|m| m.dev),
        source,
        dir: canon_dir,
        served: AtomicBool::new(false),
        gate: store_mount.clone().map(|s| s as Arc<dyn WriteGate>),
    });
    // A background daemon tells `ldfs mount` it serves once the transport
    // is settled: over io_uring, only after the queues are registered (a
    // `transport=uring` that cannot be had then fails `ldfs mount`).
    let announce = {
        let image = image.clone();
        move || {
            // The parent may be gone (killed while waiting): a broken pipe
            // here must not end a daemon that is already serving the mount.
            let mut out = std::io::stdout();
            let _ = writeln!(out, "ready").and_then(|()| out.flush());
            detach_output(&image);
        }
    };
    let mut announce: Option<Box<dyn FnOnce() + Send>> =
        daemon_child.then(|| Box::new(announce) as Box<dyn FnOnce() + Send>);
    let rings = match start {
        Some(start) => {
            use std::os::fd::AsFd;
            let fd = session
                .as_fd()
                .try_clone_to_owned()
                .map_err(|e| format!("duplicating /dev/fuse: {e}"))?;
            let setup = RingSetup {
                fs: serving.clone(),
                start,
                fd,
                asked: opts.transport,
                text: transport_text.clone(),
                served: ring_served.clone(),
                ender: ender.clone(),
            };
            Some(start_uring(setup, announce.take()))
        }
        None => None,
    };
    drop(fuse_fs);
    drop(serving);
    // A read-only store mount moves to the store's newer uploads: asked (`ldfs sync --remote`
    // on it), and every `refresh=` seconds.
    let refresh_thread = refresher.clone().map(|r| {
        r.set_notifier(session.notifier());
        let every = opts.refresh_every();
        std::thread::Builder::new()
            .name("ldfs-refresh".into())
            .spawn(move || r.run(every))
            .expect("spawn refresh thread")
    });
    {
        let ender = ender.clone();
        std::thread::spawn(move || {
            let mut first = true;
            loop {
                let mut sig = 0;
                if unsafe { libc::sigwait(&sigset, &mut sig) } != 0 {
                    continue;
                }
                let name = signal_name(sig);
                if ender.served.load(Ordering::Relaxed) {
                    eprintln!("ldfs: {name}: already ending, writing the final checkpoint");
                } else if first {
                    first = false;
                    eprintln!("ldfs: {name}: unmounting {}", ender.dir.display());
                    // In its own thread: a flush stuck in the kernel must
                    // not keep the next signal from forcing the end.
                    let ender = ender.clone();
                    std::thread::spawn(move || ender.end());
                } else {
                    eprintln!(
                        "ldfs: {name} again: detaching {} and ending the FUSE connection now",
                        ender.dir.display()
                    );
                    ender.force();
                }
            }
        });
    }
    // Commit on our own within the interval: the kernel does not pass
    // sync(2) on to FUSE daemons.
    let stop = Arc::new(AtomicBool::new(false));
    // A read-only store mount has nothing to commit, and its engine is the refresher's.
    let committer = kept.as_ref().map(|(fs, _)| {
        let (fs, stop) = (fs.clone(), stop.clone());
        let every = Duration::from_secs(opts.commit_secs);
        std::thread::spawn(move || {
            let tick = Duration::from_millis(100);
            let mut waited = Duration::ZERO;
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(tick);
                waited += tick;
                if waited >= every {
                    waited = Duration::ZERO;
                    if let Err(e) = fs.fsync() {
                        eprintln!("ldfs: periodic commit failed: {e}");
                    }
                }
            }
        })
    });
    let uploader_window = store_mount.clone().zip(kept.as_ref()).map(|(s, (fs, _))| {
        let (fs, stop) = (fs.clone(), stop.clone());
        let every = opts.upload.unwrap_or(DEFAULT_UPLOAD);
        std::thread::spawn(move || s.run_window(&fs, every, &stop))
    });
    let protector = opts.protect.zip(kept.as_ref()).map(|(keep, (fs, lld))| {
        let (lld, fs, image, stop) = (lld.clone(), fs.clone(), canon_image.clone(), stop.clone());
        let (every, window) = protect_schedule(keep, opts.commit_secs, lld.kept_capacity());
        std::thread::spawn(move || protect_loop(lld, fs, image, keep, every, window, &stop))
    });
    if let Some(announce) = announce {
        announce();
    }
    let served = session.run();
    ender.served.store(true, Ordering::Relaxed);
    // An unmount that was not a signal's (`fusermount3 -u` with nothing
    // busy): the ring's threads, joined next, must not wait on the gate.
    ender.let_writers_go();
    // The kernel ended the ring's queues with the connection: its threads
    // finish the request they hold, if any, and end.
    let ring = rings.map_or(Ok(()), join_uring);
    stop.store(true, Ordering::Relaxed);
    if let Some(c) = committer {
        let _ = c.join();
    }
    if let Some(p) = protector {
        let _ = p.join();
    }
    if let Some(w) = uploader_window {
        let _ = w.join();
    }
    scrub.stop_and_join();
    // The engine the mount ends with: a refreshing mount's current one (after the refresh
    // under way, if any).
    let (fs, lld, reader) = match (refresher, kept) {
        (Some(r), _) => {
            r.stop();
            if let Some(t) = refresh_thread {
                let _ = t.join();
            }
            let last = r
                .take_served()
                .expect("the refresher serves an engine until its end");
            (last.quiesce)();
            (last.fs, last.lld, Some(last.reader))
        }
        (None, Some((fs, lld))) => (fs, lld, None),
        (None, None) => unreachable!("an engine is kept or refreshed"),
    };
    // Before the final checkpoint, whoever else still holds the file system.
    fs.write_kept();
    drop(fs);
    let closed = match &dual {
        Some(d) => d.close(),
        None => lld.close(),
    };
    if let Some(s) = &store_mount {
        s.finish(&image, closed.is_ok());
    }
    if let Some(r) = &reader {
        r.finish();
    }
    served.map_err(|e| format!("serving {}: {e}", dir.display()))?;
    closed.map_err(|e| format!("final checkpoint of {}: {e}", image.display()))?;
    ring
}

/// The lease a read-write store mount took, until it serves: a mount refused before then
/// (no note, a damaged residency map, a cache of a branch the store no longer has, a failed
/// open) gives it back as it found it on its way out (`HeldLease::give_back`), saying so.
/// Before, it kept it until it expired (`HeldLease`'s drop never releases), and the remedy's
/// mount was refused naming the refused mount's pid, then needed `--force-takeover` (store5).
/// Safe: the refused mount put nothing in the store (its uploads are held until it serves:
/// lld's recovery checkpoint went up under its writer before, and the holder's cache was then
/// refused as a branch the store no longer has; review 41 finding 3), and a lease it took over from a
/// holder that never released it goes back to that state, so whatever that holder's cache may
/// hold still needs `--force-takeover`. Declared before the segment store and the engine: they
/// are dropped (the uploader stopped) before it gives the lease back.
#[derive(Default)]
struct LeaseUntilServed {
    held: Option<(Arc<ldfs::store::HeldLease>, StoreUrl)>,
}

impl LeaseUntilServed {
    fn hold(&mut self, lease: Option<Arc<ldfs::store::HeldLease>>, url: StoreUrl) {
        self.held = lease.map(|l| (l, url));
    }

    fn served(&mut self) {
        self.held = None;
    }
}

impl Drop for LeaseUntilServed {
    fn drop(&mut self) {
        if let Some((lease, url)) = self.held.take() {
            match lease.give_back() {
                Ok(what) => eprintln!("ldfs: {url}: {what}"),
                Err(e) => eprintln!(
                    "ldfs: {url}: giving the lease back failed ({e}): it is kept until it \
                     expires, then taken with --force-takeover"
                ),
            }
        }
    }
}

/// What starting the ring needs.
/// What the daemon's control and the FUSE adapter of every engine share (a read-only store
/// mount's refresh makes new ones for each new engine).
#[derive(Clone)]
struct Frontend {
    /// The transport serving the mount, for `ldfs stats`.
    transport: Arc<std::sync::Mutex<String>>,
    ring_served: Arc<std::sync::atomic::AtomicUsize>,
    /// The image, absolute.
    image: PathBuf,
    snapshot: Option<u64>,
    read_only: bool,
    writeback_cache: bool,
    atime: ldfs::fs::AtimeMode,
    nodiratime: bool,
}

/// One engine and what runs beside it, for [`Frontend::adapter`].
struct Engine {
    lld: Arc<Lld>,
    dual: Option<Arc<Dual>>,
    fs: Arc<Fs>,
    store: Option<Arc<StoreMount>>,
    reader: Option<Arc<crate::fuse::store_mount::ReaderMount>>,
    history: Arc<ProtectedHistory>,
    scrub: Arc<Scrub>,
}

impl Frontend {
    /// The daemon's control and the FUSE adapter serving `e`.
    fn adapter(&self, e: Engine) -> Arc<FuseFs> {
        // Protected checkpoints yield to writes whether or not this mount
        // takes new ones (an earlier mount's `protect=` may have left some).
        let yield_space = (self.snapshot.is_none() && !self.read_only)
            .then(|| e.history.clone() as Arc<dyn GiveBack>);
        let write_gate = e.store.clone().map(|s| s as Arc<dyn WriteGate>);
        let control: Arc<dyn Control> = Arc::new(Daemon {
            lld: e.lld,
            dual: e.dual,
            fs: e.fs.clone(),
            cleaner_before_ro: std::sync::Mutex::new(None),
            cancel: AtomicBool::new(false),
            last_clean: std::sync::Mutex::new("no clean since mount\n".into()),
            transport: self.transport.clone(),
            ring_served: self.ring_served.clone(),
            scrub: e.scrub,
            last_trim: std::sync::Mutex::new("no trim since mount\n".into()),
            last_resize: std::sync::Mutex::new("no resize since mount\n".into()),
            image: self.image.clone(),
            snapshot: self.snapshot,
            snapshot_results: std::sync::Mutex::new(std::collections::VecDeque::new()),
            history: e.history,
            store: e.store,
            reader: e.reader,
        });
        Arc::new(FuseFs {
            fs: e.fs,
            no_open: AtomicBool::new(false),
            control: Some(control),
            writeback_cache: self.writeback_cache,
            atime: self.atime,
            nodiratime: self.nodiratime,
            forgets: std::sync::atomic::AtomicU64::new(0),
            yield_space,
            write_gate,
        })
    }
}

/// Opens an image (or a store mount's cache) read-write, with `direct_writes=` applied.
fn open_image(image: &Path, direct: Toggle) -> Result<Arc<dyn Device>, String> {
    let dev = FileDevice::open(image, FileDeviceOptions::default())
        .map_err(|e| format!("{}: {e}", image.display()))?;
    Ok(Arc::new(with_direct_writes(dev, image, direct)?))
}

/// The engine's options for a mount with `opts`; `seg`: a read-write store mount's layer (its
/// hooks), `bounded`: its cache has a bound.
fn lld_options(
    opts: &MountOpts,
    seg: Option<&ldfs::store::SegmentStore>,
    bounded: bool,
) -> LldOptions {
    LldOptions {
        checkpoint_hook: seg.map(|s| s.hook()),
        segment_hook: seg.map(|s| s.segment_hook()),
        snapshot: opts.snapshot,
        read_only: opts.read_only,
        map_budget_bytes: opts.cache_bytes,
        cleaner: ldfs::lld::CleanerOptions {
            policy: opts.cleaner.unwrap_or_default(),
            background: opts.cleaner.is_some() && !opts.read_only,
            start_clean_segments: opts.clean_start,
            stop_clean_segments: opts.clean_stop,
            recompress_cold: opts.compress_cold,
            ..Default::default()
        },
        // A bounded cache gives released segments back (holes) at once.
        discard: opts.discard || bounded,
        ..Default::default()
    }
}

/// A read-only store mount's engine: the cache's residency for the pinned checkpoint, the
/// engine and the file system on it, and what the mount runs beside them (the pin, the cache).
struct ReaderEngine {
    lld: Arc<Lld>,
    fs: Arc<Fs>,
    reader: Arc<crate::fuse::store_mount::ReaderMount>,
}

/// Opens the engine of the checkpoint `key` (`obj`) pinned by `pin` on the cache `dev` at
/// `image`, which `prepare_reader_cache` made ready for it (`bound`: its bound).
#[allow(clippy::too_many_arguments)]
fn open_reader_engine(
    store: &Arc<dyn ldfs::store::ObjectStore>,
    u: &StoreUrl,
    image: &Path,
    dev: Arc<dyn Device>,
    bound: Option<u64>,
    pin: Arc<ldfs::store::readers::ReaderPin>,
    key: &str,
    obj: &ldfs::store::segments::CheckpointObject,
    opts: &MountOpts,
) -> Result<ReaderEngine, String> {
    let cache = ldfs::store::readers::open_reader_cache(
        store.clone(),
        dev,
        ldfs::store::CacheConfig::new(crate::cli::store::map_path(image), bound),
        obj,
    )
    .map_err(|e| format!("{u}: opening the cache {}: {e}", image.display()))?;
    let d: Arc<dyn Device> = Arc::new(ldfs::store::cache::CacheDevice(cache.clone()));
    // Refused: the cache's evictor joined first. A refresh rebuilds this file next (its
    // fallback), which an eviction still under way would punch and write the map of (review 51).
    let refused = |e: String| {
        cache.stop();
        format!("{u} at {key} (cache {}): {e}", image.display())
    };
    let lld =
        Arc::new(Lld::open(d, lld_options(opts, None, false)).map_err(|e| refused(e.to_string()))?);
    let fs = Arc::new(
        Fs::mount(
            lld.clone(),
            FsOptions {
                read_only: true,
                compress: opts.compress.unwrap_or_default(),
                ..Default::default()
            },
        )
        .map_err(|e| refused(e.to_string()))?,
    );
    let reader = Arc::new(crate::fuse::store_mount::ReaderMount::new(
        u.clone(),
        store.clone(),
        pin,
        obj.clone(),
        cache,
        lld.clone(),
        image.to_path_buf(),
    ));
    Ok(ReaderEngine { lld, fs, reader })
}

/// A refresh's engine (`fuse::refresh::Build`): the cache rebuilt from the checkpoint `key`
/// (`obj`, pinned by `pin`), as a read-only mount on an empty cache does, and the engine, the
/// daemon's control and the adapter on it.
#[allow(clippy::too_many_arguments)]
fn rebuild_reader(
    store: &Arc<dyn ldfs::store::ObjectStore>,
    u: &StoreUrl,
    image: &Path,
    cache_size: Option<u64>,
    opts: &MountOpts,
    frontend: &Frontend,
    pin: Arc<ldfs::store::readers::ReaderPin>,
    key: &str,
    obj: &ldfs::store::segments::CheckpointObject,
    keep: &[ldfs::store::segments::SegmentEntry],
) -> Result<Served, String> {
    let bound =
        crate::cli::store::prepare_reader_cache(&**store, u, image, cache_size, key, obj, keep)?;
    let dev = open_image(image, opts.direct_writes)?;
    let e = open_reader_engine(store, u, image, dev, bound, pin, key, obj, opts)?;
    let scrub = Arc::new(Scrub::default());
    let fuse = frontend.adapter(Engine {
        lld: e.lld.clone(),
        dual: None,
        fs: e.fs.clone(),
        store: None,
        reader: Some(e.reader.clone()),
        history: Arc::new(ProtectedHistory::new(e.lld.clone(), frontend.image.clone())),
        scrub: scrub.clone(),
    });
    Ok(Served {
        fuse,
        fs: e.fs,
        lld: e.lld,
        reader: e.reader,
        quiesce: Box::new(move || scrub.stop_and_join()),
    })
}

struct RingSetup {
    fs: Arc<Refreshing>,
    start: Arc<uring::Start>,
    /// The session's /dev/fuse.
    fd: std::os::fd::OwnedFd,
    asked: Transport,
    /// What `ldfs stats` says of the transport.
    text: Arc<std::sync::Mutex<String>>,
    served: Arc<std::sync::atomic::AtomicUsize>,
    ender: Arc<Ender>,
}

/// Starts FUSE over io_uring once the session's INIT has run (in a thread
/// of its own: INIT comes when the session runs). If the kernel refused it
/// or the queues cannot be registered, `transport=uring` ends the mount
/// with the reason; `auto` stays on /dev/fuse, saying why (a REGISTER the
/// kernel refuses switches the connection back to /dev/fuse).
/// `announce` (a background daemon's "ready") runs once that is settled,
/// unless the mount ends.
fn start_uring(
    setup: RingSetup,
    announce: Option<Box<dyn FnOnce() + Send>>,
) -> JoinHandle<Result<Option<uring::Rings>, String>> {
    std::thread::spawn(move || {
        let r = start_uring_now(setup);
        if r.is_ok() {
            if let Some(announce) = announce {
                announce();
            }
        }
        r
    })
}

fn start_uring_now(setup: RingSetup) -> Result<Option<uring::Rings>, String> {
    let RingSetup {
        fs,
        start,
        fd,
        asked,
        text,
        served,
        ender,
    } = setup;
    let fail = |why: String| {
        if asked == Transport::Uring {
            eprintln!("ldfs: transport=uring: {why}; ending the mount");
            // Requests wait for a ring that will not come: end the
            // connection (the session then returns), and the daemon
            // with an error.
            ender.force();
            Err(format!("transport=uring: {why}"))
        } else {
            eprintln!("ldfs: transport /dev/fuse: {why}");
            Ok(None)
        }
    };
    match start.wait(Duration::from_secs(60)) {
        None => return fail("no INIT from the kernel within 60 s".into()),
        Some(false) => {
            return fail(format!(
                "the kernel did not offer FUSE over io_uring at INIT ({})",
                transport::HOW_TO_ENABLE
            ))
        }
        Some(true) => {}
    }
    let queues = uring::queue_count();
    let per_queue = (crate::fuse::FUSE_THREADS / queues).max(2);
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize;
    let payload = crate::fuse::adapter::MAX_WRITE_BYTES
        .next_multiple_of(page)
        .max(8192);
    // Entries serve as soon as each is registered, before `start`
    // returns: a request served then (`ldfs stats` right after the mount
    // appears) must already see the ring named. Put back if it fails.
    let before = std::mem::replace(
        &mut *text.lock().expect("transport poisoned"),
        uring::describe(queues, per_queue),
    );
    let r = uring::start(fs, &fd, per_queue, payload, served);
    if r.is_err() {
        *text.lock().expect("transport poisoned") = before;
    }
    match r {
        Ok(r) => {
            *text.lock().expect("transport poisoned") = r.describe();
            Ok(Some(r))
        }
        // The kernel still waits for the ring: /dev/fuse would serve no
        // request, so the mount ends whatever was asked.
        Err(f) if !f.fell_back => {
            eprintln!(
                "ldfs: registering the io_uring queues: {}; the kernel waits for the ring: ending the mount",
                f.why
            );
            ender.force();
            Err(format!("registering the io_uring queues: {}", f.why))
        }
        Err(f) => fail(format!("registering the io_uring queues: {}", f.why)).map(|none| {
            // Entries that did register end with the connection.
            none.or(Some(f.rings))
        }),
    }
}

/// Waits (at most 10 s) for the ring's threads once the session has ended;
/// `Err` if `transport=uring` could not be had.
fn join_uring(r: JoinHandle<Result<Option<uring::Rings>, String>>) -> Result<(), String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let r = match r.join() {
            Ok(Ok(Some(rings))) => {
                rings.join();
                Ok(())
            }
            Ok(Ok(None)) => Ok(()),
            Ok(Err(e)) => Err(e),
            Err(_) => Err("the io_uring start-up panicked".into()),
        };
        let _ = tx.send(r);
    });
    rx.recv_timeout(Duration::from_secs(10))
        .unwrap_or_else(|_| {
            eprintln!("ldfs: io_uring threads still busy 10 s after the session ended");
            Ok(())
        })
}

/// Where a dual file system's metadata device is: `meta=` if given, else
/// the path recorded at mkfs (relative paths from the data device's
/// directory). Dual::open then checks that both carry one file-system id.
pub(crate) fn dual_meta_path(
    data: &dyn Device,
    image: &Path,
    given: Option<&Path>,
) -> Result<PathBuf, String> {
    if let Some(p) = given {
        return Ok(p.to_path_buf());
    }
    let label = ldfs::dual::read_label(data).map_err(|e| format!("{}: {e}", image.display()))?;
    if label.meta_path.is_empty() {
        return Err(format!(
            "{}: a dual file system with no metadata path recorded: give -o meta=PATH",
            image.display()
        ));
    }
    let p = PathBuf::from(&label.meta_path);
    Ok(match (p.is_relative(), image.parent()) {
        (true, Some(dir)) => dir.join(p),
        _ => p,
    })
}

/// `mount -o remount,ro|rw DIR` (mount(8) runs `mount.fuse.ldfs IMAGE DIR
/// -o remount,...`): the FUSE kernel module never tells a daemon about a
/// remount, so this helper remounts with mount(2) and tells the daemon
/// through its control attributes, in the order that never refuses a write
/// the kernel accepts. Read-only: the kernel's mount first (EROFS from then
/// on; a file open for writing makes it fail with EBUSY, and then nothing
/// changed), then the daemon refuses changes, stops its cleaner and writes
/// a checkpoint. Read-write: the daemon first (no write reaches it while
/// the kernel's mount is read-only), then the kernel's mount, the daemon
/// made read-only again should that fail.
/// Per-mount flags not named in the options (nosuid, nodev, noatime, ...)
/// stay as they are.
fn remount(dir: &Path, opts: &MountOpts) -> Result<(), String> {
    use std::os::unix::ffi::OsStrExt;
    if opts.compress_cold.is_some() {
        return Err("remount: compress_cold= is set at mount only".into());
    }
    let canon = dir
        .canonicalize()
        .map_err(|e| format!("remount: {}: {e}", dir.display()))?;
    match top_mount(&canon) {
        Some(m) if m.kind == "fuse.ldfs" => {
            // A snapshot mount's source is IMAGE@snapshot=N (`run`).
            let snapshot = m
                .source
                .rsplit_once("@snapshot=")
                .map(|(_, n)| n.to_string());
            if let (Some(n), true) = (snapshot, opts.ro_given && !opts.read_only) {
                return Err(format!(
                    "remount: {} is a mount of snapshot {n}, which is read-only",
                    dir.display()
                ));
            }
        }
        _ => return Err(format!("remount: no ldfs mount at {}", dir.display())),
    }
    let c = std::ffi::CString::new(canon.as_os_str().as_bytes()).map_err(|e| e.to_string())?;
    let mut sv: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut sv) } != 0 {
        return Err(format!(
            "remount: {}: {}",
            dir.display(),
            std::io::Error::last_os_error()
        ));
    }
    let mut flags = libc::MS_REMOUNT;
    for (st, ms) in [
        (libc::ST_NOSUID, libc::MS_NOSUID),
        (libc::ST_NODEV, libc::MS_NODEV),
        (libc::ST_NOEXEC, libc::MS_NOEXEC),
        (libc::ST_SYNCHRONOUS, libc::MS_SYNCHRONOUS),
        (libc::ST_NOATIME, libc::MS_NOATIME),
        (libc::ST_NODIRATIME, libc::MS_NODIRATIME),
        (libc::ST_RELATIME, libc::MS_RELATIME),
    ] {
        if sv.f_flag & st != 0 {
            flags |= ms;
        }
    }
    for o in &opts.fuse {
        match o {
            MountOption::Dev => flags &= !libc::MS_NODEV,
            MountOption::NoDev => flags |= libc::MS_NODEV,
            MountOption::Suid => flags &= !libc::MS_NOSUID,
            MountOption::NoSuid => flags |= libc::MS_NOSUID,
            MountOption::Exec => flags &= !libc::MS_NOEXEC,
            MountOption::NoExec => flags |= libc::MS_NOEXEC,
            MountOption::Atime => flags &= !libc::MS_NOATIME,
            MountOption::NoAtime => flags |= libc::MS_NOATIME,
            MountOption::Sync => flags |= libc::MS_SYNCHRONOUS,
            MountOption::Async => flags &= !libc::MS_SYNCHRONOUS,
            _ => {}
        }
    }
    let ro = if opts.ro_given {
        opts.read_only
    } else {
        sv.f_flag & libc::ST_RDONLY != 0
    };
    // A getxattr: it reaches the daemon also through a read-only mount.
    let tell = |query: &std::ffi::CStr| -> Result<(), String> {
        let r = unsafe { libc::getxattr(c.as_ptr(), query.as_ptr(), std::ptr::null_mut(), 0) };
        if r < 0 {
            return Err(format!(
                "the daemon of {} refused (see its log): {}",
                dir.display(),
                std::io::Error::last_os_error()
            ));
        }
        Ok(())
    };
    if let Some(v) = opts.compress {
        let q = std::ffi::CString::new(format!("trusted.ldfs.compress={v}"))
            .map_err(|e| e.to_string())?;
        tell(&q)?;
    }
    let sys = |flags: libc::c_ulong| sys_mount(None, &c, flags);
    // The daemon's mode and the kernel's change in two steps: a signal
    // between them (Ctrl-C, a shutdown's SIGTERM) would leave the kernel's
    // mount rw with a daemon refusing every change. Held until the helper
    // exits, so both steps (or the step back) are done; SIGKILL still ends
    // it if the daemon never answers.
    block_signals();
    if ro {
        sys(flags | libc::MS_RDONLY)
            .map_err(|e| format!("remounting {} read-only: {e}", dir.display()))?;
        // Not undone: the kernel's mount stays read-only (a daemon refuses
        // when its checkpoint failed, and then it is read-only anyway), but
        // the message must not read as if nothing had changed.
        tell(c"trusted.ldfs.remount-ro").map_err(|e| {
            format!(
                "{e}; the mount is read-only now, but the daemon did not switch \
                 (its cleaner may still run, no checkpoint was written)"
            )
        })?;
    } else {
        tell(c"trusted.ldfs.remount-rw")?;
        if let Err(e) = sys(flags) {
            let _ = tell(c"trusted.ldfs.remount-ro");
            return Err(format!("remounting {} read-write: {e}", dir.display()));
        }
    }
    Ok(())
}

/// mount(2) with no file-system type or data: a remount (`src` None) or a
/// bind mount of `src` at `dst`.
fn sys_mount(
    src: Option<&std::ffi::CStr>,
    dst: &std::ffi::CStr,
    flags: libc::c_ulong,
) -> std::io::Result<()> {
    let src = src.map_or(std::ptr::null(), |s| s.as_ptr());
    let r = unsafe { libc::mount(src, dst.as_ptr(), std::ptr::null(), flags, std::ptr::null()) };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// A second mount of an image that is already mounted: as with a kernel
/// file system, both show the one file system (the daemon serving `on`),
/// here through a bind mount of `on` at `dir`; `ro` makes the new one
/// read-only by itself. Unmounting either leaves the other.
fn bind_mount(on: &Path, dir: &Path, opts: &MountOpts) -> Result<(), String> {
    use std::os::unix::ffi::OsStrExt;
    let canon = check_mountpoint(dir)?;
    let c = |p: &Path| std::ffi::CString::new(p.as_os_str().as_bytes()).map_err(|e| e.to_string());
    let (src, dst) = (c(on)?, c(&canon)?);
    let mount = |flags: libc::c_ulong| sys_mount(Some(&src), &dst, flags);
    mount(libc::MS_BIND).map_err(|e| {
        format!(
            "already mounted on {}; mounting it at {} too (a bind mount, as root): {e}",
            on.display(),
            dir.display()
        )
    })?;
    if opts.read_only {
        let flags = libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY;
        if let Err(e) = mount(flags) {
            let _ = unmount(&canon, false);
            return Err(format!("making {} read-only: {e}", dir.display()));
        }
    }
    Ok(())
}

/// Every mount point of the FUSE connection `dev` (a mount and its bind
/// mounts), from /proc/self/mountinfo.
fn mount_points(dev: (u32, u32)) -> Vec<PathBuf> {
    mounts()
        .into_iter()
        .filter(|m| m.dev == dev)
        .map(|m| m.dir)
        .collect()
}

/// A daemon must not hold its parent's terminal or pipes: stdout goes to
/// /dev/null and stderr (errors such as a block failing its checksum, with
/// inode and offset) to syslog, one line per message.
fn detach_output(image: &Path) {
    let Ok(null) = File::options().write(true).open("/dev/null") else {
        return;
    };
    unsafe { libc::dup2(null.as_raw_fd(), 1) };
    let mut fds = [0; 2];
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        unsafe { libc::dup2(null.as_raw_fd(), 2) };
        return;
    }
    unsafe {
        libc::dup2(fds[1], 2);
        libc::close(fds[1]);
    }
    let reader = unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fds[0]) };
    let ident = std::ffi::CString::new(format!("ldfs[{}]", image.display())).unwrap_or_default();
    std::thread::spawn(move || {
        // openlog keeps the pointer: the string lives as long as the thread.
        unsafe { libc::openlog(ident.as_ptr(), libc::LOG_PID, libc::LOG_DAEMON) };
        for line in BufReader::new(reader).lines().map_while(Result::ok) {
            if let Ok(c) = std::ffi::CString::new(line) {
                unsafe { libc::syslog(libc::LOG_ERR, c"%s".as_ptr(), c.as_ptr()) };
            }
        }
    });
}

/// Starts `ldfs mount -f` in the background and waits until it has mounted
/// (or failed, in which case its error has already been printed).
fn spawn_daemon(
    image: &Path,
    dir: &Path,
    options: &[String],
    store: &StoreArgs,
) -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| format!("finding ldfs: {e}"))?;
    let mut cmd = Command::new(exe);
    cmd.arg("mount").arg("-f").arg("--daemon-child");
    if let Some(c) = &store.cache {
        cmd.arg("--cache").arg(c);
    }
    if let Some(n) = store.cache_size {
        cmd.arg("--cache-size").arg(n.to_string());
    }
    if store.force_takeover {
        cmd.arg("--force-takeover");
    }
    for o in options {
        cmd.arg("-o").arg(o);
    }
    cmd.arg(image).arg(dir);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("starting the mount process: {e}"))?;
    let out = child.stdout.take().expect("piped stdout");
    let mut line = String::new();
    let _ = BufReader::new(out).read_line(&mut line);
    if line.trim() == "ready" {
        return Ok(());
    }
    let status = child.wait().map_err(|e| e.to_string())?;
    Err(format!("mount failed ({status})"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<MountOpts, String> {
        parse_options(&[s.to_string()])
    }

    #[test]
    fn compress_takes_off_lz4_and_zstd_levels() {
        use ldfs::ld::Compression;
        assert_eq!(parse("rw").unwrap().compress, None);
        for (v, want) in [
            ("off", Compression::Off),
            ("lz4", Compression::Lz4),
            ("zstd", Compression::Zstd { level: 3 }),
            ("zstd:1", Compression::Zstd { level: 1 }),
            ("zstd:19", Compression::Zstd { level: 19 }),
        ] {
            assert_eq!(
                parse(&format!("compress={v}")).unwrap().compress,
                Some(want)
            );
        }
        for bad in [
            "compress=zstd:0",
            "compress=zstd:20",
            "compress=gzip",
            "compress=",
        ] {
            let e = parse(bad).unwrap_err();
            assert!(e.contains("zstd:LEVEL"), "{bad}: {e}");
        }
        assert_eq!(
            parse("compress_cold=zstd:15").unwrap().compress_cold,
            Some(15)
        );
        assert_eq!(parse("compress_cold=off").unwrap().compress_cold, None);
        assert!(parse("compress_cold=lz4").is_err());
    }

    /// The lock of an image held by what looks like an exiting mount daemon
    /// (flock(1) named `ldfs mount`, letting go after 0.4 s) is waited for,
    /// never taken while held, and taken once released; one held by
    /// anything else is refused at once.
    #[test]
    fn the_lock_of_an_exiting_daemon_is_waited_for_and_no_one_else_is() {
        let t = tempfile::tempdir().unwrap();
        let img = t.path().join("img");
        std::fs::write(&img, b"x").unwrap();
        let hold = |name: &str, secs: &str| {
            let c = Command::new("bash")
                .arg("-c")
                .arg(format!("exec -a '{name}' flock -o \"$0\" sleep {secs}"))
                .arg(&img)
                .spawn()
                .unwrap();
            // Until flock(1) holds it.
            let started = std::time::Instant::now();
            while lock_holder(&File::open(&img).unwrap()).is_none() {
                assert!(started.elapsed() < Duration::from_secs(5), "no holder");
                std::thread::sleep(Duration::from_millis(5));
            }
            c
        };
        let mut c = hold("ldfs mount", "0.4");
        let started = std::time::Instant::now();
        let f = lock_image(&img, true, "test").unwrap();
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_millis(300) && waited < Duration::from_secs(10),
            "lock taken after {waited:?} of a 0.4 s hold"
        );
        c.wait().unwrap();
        drop(f);
        let mut c = hold("some other program", "5");
        let started = std::time::Instant::now();
        let r = lock_image(&img, true, "test");
        assert!(matches!(r, Err(LockError::InUse { .. })), "{:?}", r.err());
        assert!(started.elapsed() < Duration::from_secs(5));
        let _ = c.kill();
        let _ = c.wait();
    }

    #[test]
    fn cleaner_options() {
        let o = parse("").unwrap();
        assert_eq!(o.cleaner, Some(ldfs::lld::PolicyKind::default()));
        assert_eq!(parse("cleaner=off").unwrap().cleaner, None);
        assert_eq!(
            parse("cleaner=greedy").unwrap().cleaner,
            Some(ldfs::lld::PolicyKind::Greedy)
        );
        let o = parse("clean_start=10,clean_stop=40").unwrap();
        assert_eq!((o.clean_start, o.clean_stop), (Some(10), Some(40)));
        for bad in [
            "cleaner=bogus",
            "cleaner",
            "clean_start=x",
            "clean_stop=-1",
            "clean_start=9,clean_stop=3",
        ] {
            let e = parse(bad).unwrap_err();
            let key = bad.split(['=', ',']).next().unwrap();
            assert!(e.contains(key), "{bad}: {e}");
        }
    }

    #[test]
    fn mount_table_names_and_lock_holders() {
        assert_eq!(
            unescape_mount_field(r"/tmp/a\040b\011c\134d\0"),
            "/tmp/a b\tc\\d\\0"
        );
        assert_eq!(unescape_mount_field("/plain"), "/plain");
        for daemon in [
            "/usr/local/bin/ldfs mount -f --daemon-child /i /m",
            "ldfs mount -f /i /m",
            "/sbin/mount.fuse.ldfs /i /m -o rw",
        ] {
            assert!(is_mount_daemon(daemon), "{daemon}");
        }
        for other in [
            "fsck.ldfs -y /i",
            "/usr/bin/ldfs fsck -n /i",
            "sleep 60",
            "",
        ] {
            assert!(!is_mount_daemon(other), "{other}");
            assert_eq!(worth_waiting_for(other), other.is_empty(), "{other}");
        }
    }

    #[test]
    fn other_options() {
        let o = parse("ro,cache=128M,commit=7,noatime").unwrap();
        assert!(o.read_only);
        assert_eq!(o.cache_bytes, 128 << 20);
        assert_eq!(o.commit_secs, 7);
        assert!(!o.writeback_cache, "the writeback cache is opt-in");
        assert!(parse("writeback_cache").unwrap().writeback_cache);
        assert_eq!(parse("").unwrap().direct_writes, Toggle::Auto);
        assert_eq!(parse("direct_writes").unwrap().direct_writes, Toggle::On);
        assert_eq!(
            parse("direct_writes,nodirect_writes")
                .unwrap()
                .direct_writes,
            Toggle::Off
        );
        assert!(
            !parse("writeback_cache,no_writeback_cache")
                .unwrap()
                .writeback_cache
        );
        assert!(parse("commit=0").is_err());
        assert!(parse("cache=10K").is_err());
        assert!(parse("frobnicate").unwrap_err().contains("frobnicate"));
    }

    #[test]
    fn protect_takes_a_span_on_a_writable_mount() {
        let d = |v: &str| parse(v).unwrap().protect.map(|d| d.as_secs());
        assert_eq!(d("protect=90"), Some(90));
        assert_eq!(d("protect=40s"), Some(40));
        assert_eq!(d("protect=30m"), Some(1800));
        assert_eq!(d("protect=1h"), Some(3600));
        assert_eq!(d("protect=2d"), Some(2 * 86_400));
        assert_eq!(d("protect=1h,protect=off"), None);
        assert_eq!(d(""), None, "off by default");
        for bad in [
            "protect=",
            "protect=1y",
            "protect=h",
            "protect=367d",
            "protect=-1h",
        ] {
            assert!(parse(bad).unwrap_err().contains("protect="), "{bad}");
        }
        assert!(parse("ro,protect=1h").unwrap_err().contains("not with ro"));
    }

    #[test]
    fn a_snapshot_is_mounted_read_only_by_number() {
        assert_eq!(parse("ro,snapshot=12").unwrap().snapshot, Some(12));
        assert_eq!(parse("snapshot=3,ro").unwrap().snapshot, Some(3));
        assert_eq!(parse("ro").unwrap().snapshot, None);
        for bad in ["snapshot=3", "rw,snapshot=3", "ro,snapshot=3,rw"] {
            assert!(
                parse(bad).unwrap_err().contains("-o ro,snapshot=3"),
                "{bad}"
            );
        }
        for bad in [
            "ro,snapshot=",
            "ro,snapshot=x",
            "ro,snapshot=0",
            "ro,snapshot=-1",
        ] {
            assert!(
                parse(bad).unwrap_err().contains("snapshot's number"),
                "{bad}"
            );
        }
    }

    /// With its device unknown, the mount at the mount point is ours only
    /// if it is a FUSE mount of our image: a signal must not unmount
    /// whatever else is mounted there.
    #[test]
    fn an_unknown_device_is_not_taken_for_another_mount() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().canonicalize().unwrap();
        let c = std::ffi::CString::new(dir.to_str().unwrap()).unwrap();
        let r = unsafe {
            libc::mount(
                c"tmpfs".as_ptr(),
                c.as_ptr(),
                c"tmpfs".as_ptr(),
                0,
                std::ptr::null(),
            )
        };
        if r != 0 {
            eprintln!(
                "*** SKIPPING an_unknown_device_is_not_taken_for_another_mount: mounting tmpfs: {} ***",
                std::io::Error::last_os_error()
            );
            return;
        }
        let e = Ender {
            dir: dir.clone(),
            dev: None,
            source: "/nowhere/ldfs.img".into(),
            served: AtomicBool::new(false),
            gate: None,
        };
        let attached = e.attached();
        assert_eq!(unsafe { libc::umount2(c.as_ptr(), 0) }, 0);
        assert!(!attached, "a tmpfs taken for our mount");
    }

    /// An engine on an image file holding `n` protected checkpoints, each
    /// keeping 64 blocks the live tree has since deleted.
    fn with_protected(n: usize) -> (tempfile::TempDir, PathBuf, Arc<Lld>) {
        use ldfs::ld::ListHints;
        let (t, image, lld) = engine();
        for i in 0..n {
            let l = lld.create_list(None, ListHints::default()).unwrap();
            for b in 0..64 {
                lld.write(None, l, b, &[i as u8 + 1; 4096]).unwrap();
            }
            lld.checkpoint_now().unwrap();
            lld.take_protected(1_700_000_000 + i as u64, 0).unwrap();
            lld.delete_list(None, l).unwrap();
        }
        lld.checkpoint_now().unwrap();
        (t, image, lld)
    }

    /// A file system formatted on `lld` (root owned by `uid`) and mounted;
    /// the context that made it.
    fn formatted(lld: &Arc<Lld>, uid: u32) -> (Arc<Fs>, ldfs::fs::Ctx) {
        let ctx = ldfs::fs::Ctx {
            uid,
            gid: uid,
            umask: 0o022,
        };
        Fs::format(&**lld, ctx).unwrap();
        let fs = Fs::mount(lld.clone() as Arc<dyn LogicalDisk>, FsOptions::default()).unwrap();
        (Arc::new(fs), ctx)
    }

    /// An engine on a fresh 32 MiB image file.
    fn engine() -> (tempfile::TempDir, PathBuf, Arc<Lld>) {
        engine_kept(0)
    }

    /// An engine on a fresh 32 MiB image file with `kept_pages` of kept
    /// table per slot.
    fn engine_kept(kept_pages: u32) -> (tempfile::TempDir, PathBuf, Arc<Lld>) {
        let t = tempfile::tempdir().unwrap();
        let image = t.path().join("p.img");
        let dev = FileDevice::create(&image, 32 << 20, FileDeviceOptions::default()).unwrap();
        let mk = ldfs::lld::layout::MkfsOptions {
            segment_bytes: 256 << 10,
            max_block_bytes: 64 << 10,
            reserved_segments: Some(8),
            fs_id: 0x9e5,
            max_bytes: None,
            kept_pages,
        };
        let lld = Arc::new(Lld::create(Arc::new(dev), &mk, LldOptions::default()).unwrap());
        (t, image, lld)
    }

    /// With a kept table, space running short deletes the oldest
    /// generation whole (its records share a pin bit: fewer would free
    /// nothing), in one deletion, and the newer generation stays.
    #[test]
    fn a_yield_deletes_the_oldest_generation_whole() {
        use ldfs::ld::ListHints;
        let (_t, image, lld) = engine_kept(1);
        for i in 0..6u64 {
            let l = lld.create_list(None, ListHints::default()).unwrap();
            for b in 0..16 {
                lld.write(None, l, b, &[i as u8 + 1; 4096]).unwrap();
            }
            // Windows of 3 s: checkpoints 0..3 and 3..6 are two generations.
            lld.take_protected(1_700_000_001 + i, 3).unwrap();
            lld.delete_list(None, l).unwrap();
        }
        lld.checkpoint_now().unwrap();
        let before = lld.snapshots();
        let pins: Vec<u32> = before.iter().map(|s| s.pin).collect();
        assert_eq!(pins[..3], [pins[0]; 3]);
        assert_eq!(pins[3..], [pins[3]; 3]);
        assert_ne!(pins[0], pins[3]);
        let h = ProtectedHistory::new(lld.clone(), image);
        let seen = h.given();
        assert!(h.give_back(4096, seen));
        assert_eq!(h.given(), seen + 1, "one deletion");
        let left: Vec<u64> = lld.snapshots().iter().map(|s| s.number).collect();
        let newer: Vec<u64> = before[3..].iter().map(|s| s.number).collect();
        assert_eq!(left, newer, "the oldest generation went whole");
    }

    /// Every commit interval on an image with a kept table, spaced out when
    /// the span needs more records than it holds; span/8 without one.
    #[test]
    fn protect_schedules_by_the_commit_interval_and_the_table() {
        let h = Duration::from_secs(3600);
        let secs = |(d, w): (Duration, u64)| (d.as_secs(), w);
        assert_eq!(secs(protect_schedule(h, 5, 1365)), (5, 450));
        assert_eq!(secs(protect_schedule(h, 5, 24)), (450, 450));
        // 20 snapshots leave 4 bits: still span/8 without a table.
        assert_eq!(secs(protect_schedule(h, 5, 4)), (450, 450));
        assert_eq!(secs(protect_schedule(24 * h, 5, 1365)), (64, 10_800));
        assert_eq!(
            secs(protect_schedule(Duration::from_secs(8), 5, 1365)),
            (5, 5)
        );
    }

    /// Review 22, finding 3: a request short of more than all protected
    /// history holds deletes nothing; one it can cover takes the oldest.
    #[test]
    fn protected_history_yields_only_to_a_request_it_can_cover() {
        let (_t, image, lld) = with_protected(3);
        let h = ProtectedHistory::new(lld.clone(), image);
        let held = lld.protected_bytes();
        assert!(held >= 3 * 64 * 4096, "protected checkpoints hold {held}");
        let seen = h.given();
        assert!(!h.give_back(held + 1, seen), "a hopeless request yielded");
        assert_eq!(lld.snapshots().len(), 3);
        let oldest = lld.snapshots()[0].number;
        assert!(h.give_back(4096, seen));
        let left: Vec<u64> = lld.snapshots().iter().map(|s| s.number).collect();
        assert_eq!(left.len(), 2);
        assert!(!left.contains(&oldest), "not the oldest deleted: {left:?}");
        assert_eq!(h.given(), seen + 1);
    }

    /// Review 22: operations that fail at once take one deletion between
    /// them; each is told to try again.
    #[test]
    fn concurrent_shortages_delete_one_protected_checkpoint() {
        let (_t, image, lld) = with_protected(4);
        let h = Arc::new(ProtectedHistory::new(lld.clone(), image));
        let seen = h.given();
        let go = Arc::new(std::sync::Barrier::new(6));
        let threads: Vec<_> = (0..6)
            .map(|_| {
                let (h, go) = (h.clone(), go.clone());
                std::thread::spawn(move || {
                    go.wait();
                    h.give_back(4096, seen)
                })
            })
            .collect();
        for t in threads {
            assert!(t.join().unwrap(), "a failed operation not retried");
        }
        assert_eq!(lld.snapshots().len(), 3, "{:?}", lld.snapshots());
        assert_eq!(h.given(), seen + 1);
    }

    /// Review 22: after `remount,ro` the daemon refuses what would write
    /// the image (the kernel refuses the setxattr first; this is the
    /// daemon's own guard), and accepts it again after `remount,rw`.
    #[test]
    fn a_live_mount_remounted_read_only_refuses_snapshot_trim_and_clean() {
        let (_t, image, lld) = engine();
        let (fs, _) = formatted(&lld, 0);
        let d = daemon_on(&lld, &image, fs);
        d.get("remount-ro").unwrap();
        let kept = lld.snapshots().len();
        for (name, value) in [
            ("snapshot", "take t1 ro"),
            ("trim", ""),
            ("clean", "greedy 90 4"),
            ("background", "on"),
            ("checkpoint", ""),
        ] {
            let e = d.set(name, value.as_bytes()).unwrap_err();
            assert!(e.contains("read-only"), "{name}: {e}");
        }
        assert_eq!(lld.snapshots().len(), kept);
        d.get("remount-rw").unwrap();
        d.set("trim", b"").unwrap();
        d.set("snapshot", b"take t2 rw").unwrap();
        assert_eq!(lld.snapshots().len(), kept + 1);
    }

    /// Review 23: a daemon over `lld` for the probes below.
    fn daemon_on(lld: &Arc<Lld>, image: &Path, fs: Arc<Fs>) -> Daemon {
        let history = Arc::new(ProtectedHistory::new(lld.clone(), image.to_path_buf()));
        Daemon {
            lld: lld.clone(),
            dual: None,
            fs,
            cleaner_before_ro: std::sync::Mutex::new(None),
            cancel: AtomicBool::new(false),
            last_clean: std::sync::Mutex::new(String::new()),
            transport: Arc::new(std::sync::Mutex::new(String::new())),
            ring_served: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
            scrub: Arc::new(Scrub::default()),
            last_trim: std::sync::Mutex::new(String::new()),
            last_resize: std::sync::Mutex::new(String::new()),
            image: image.to_path_buf(),
            snapshot: None,
            snapshot_results: std::sync::Mutex::new(std::collections::VecDeque::new()),
            history,
            store: None,
            reader: None,
        }
    }

    /// Review 23, probe: with the snapshot table full (23 snapshots and one
    /// protected checkpoint), `ldfs snapshot` with a bad name (65 bytes)
    /// deletes the protected checkpoint before failing: the second arm of
    /// the take loop yields on *any* error while the table is full, and the
    /// name check comes before the table check. FAILS on eca2c69 (the
    /// protected checkpoint is gone).
    #[test]
    fn a_bad_snapshot_name_with_a_full_table_keeps_protected_checkpoints() {
        let (_t, image, lld) = engine();
        let (fs, ctx) = formatted(&lld, 0);
        let f = fs
            .mknod(ctx, ldfs::fs::ROOT_INO, b"f", 0o100644, 0)
            .unwrap()
            .ino;
        fs.write(f, 0, &[1; 256 << 10]).unwrap();
        lld.checkpoint_now().unwrap();
        lld.take_protected(1_700_000_000, 0).unwrap();
        fs.unlink(ldfs::fs::ROOT_INO, b"f").unwrap();
        for i in 0..ldfs::lld::snapshot::MAX_SNAPSHOTS - 1 {
            lld.take_snapshot(&format!("s{i}"), 0).unwrap();
        }
        assert_eq!(lld.snapshots().len(), ldfs::lld::snapshot::MAX_SNAPSHOTS);
        let d = daemon_on(&lld, &image, fs);
        let bad = format!("take t1 {}", "x".repeat(65));
        let e = d.set("snapshot", bad.as_bytes()).unwrap_err();
        assert!(e.contains("64"), "{e}");
        let protected = lld.snapshots().iter().filter(|s| s.protected).count();
        assert_eq!(
            protected, 1,
            "a refused take deleted a protected checkpoint"
        );
    }

    /// Review 23, probe: `given()`, which `FuseFs::room` calls before every
    /// attempt of every space-taking operation, waits on the mutex that a
    /// deletion holds while `delete_snapshot` waits (up to
    /// SNAPSHOT_ARU_WAIT = 30 s, per protected checkpoint tried) for open
    /// ARUs: every write, create, mkdir... of the mount stalls behind one
    /// writer's deletion, even ones with room to spare. FAILS on eca2c69
    /// (`given()` blocks until the ARU ends).
    #[test]
    fn given_does_not_wait_for_a_deletion_in_progress() {
        use ldfs::ld::ListHints;
        let (_t, image, lld) = with_protected(2);
        let h = Arc::new(ProtectedHistory::new(lld.clone(), image));
        let l = lld.create_list(None, ListHints::default()).unwrap();
        let aru = lld.begin_aru().unwrap();
        lld.write(Some(aru), l, 0, &[7; 4096]).unwrap();
        let seen = h.given();
        let deleter = {
            let h = h.clone();
            std::thread::spawn(move || h.give_back(4096, seen))
        };
        std::thread::sleep(Duration::from_millis(300));
        let (tx, rx) = std::sync::mpsc::channel();
        let reader = {
            let h = h.clone();
            std::thread::spawn(move || {
                let t = std::time::Instant::now();
                let g = h.given();
                let _ = tx.send((g, t.elapsed()));
            })
        };
        let got = rx.recv_timeout(Duration::from_secs(2));
        lld.end_aru(aru).unwrap();
        reader.join().unwrap();
        assert!(deleter.join().unwrap());
        assert!(
            got.is_ok(),
            "given() still blocked after 2 s behind a deletion waiting for an open ARU"
        );
    }

    /// Review 23, probe: a protected checkpoint deleted outside
    /// `ProtectedHistory` (the protection thread's expiry, `ldfs snapshot
    /// --delete`) does not advance `given`, so an operation that failed
    /// before that deletion deletes another one rather than retrying
    /// first. FAILS on eca2c69 (two deleted where one gave the room back).
    #[test]
    fn a_deletion_by_expiry_counts_for_a_writer_that_failed_before_it() {
        let (_t, image, lld) = with_protected(3);
        let h = ProtectedHistory::new(lld.clone(), image.clone());
        let seen = h.given();
        // The writer's attempt fails here; then the protection thread
        // expires the oldest protected checkpoint.
        let oldest = lld.snapshots()[0].number;
        delete_kept(&lld, &image, oldest).unwrap();
        assert_eq!(lld.snapshots().len(), 2);
        assert!(h.give_back(4096, seen), "not retried");
        assert_eq!(
            lld.snapshots().len(),
            2,
            "a second protected checkpoint deleted before the retry"
        );
    }

    /// Review 23: FS_IOC_SETFLAGS from a caller who does not own the file
    /// is EPERM (kernels before 5.13 pass it on without the owner check);
    /// the owner and root may; GETFLAGS is anyone's.
    #[test]
    fn chattr_needs_the_owner_or_root() {
        use crate::fuse::transport::{Caller, FuseOps};
        let (_t, _image, lld) = engine();
        let (fs, ctx) = formatted(&lld, 1000);
        let f = fs
            .mknod(ctx, ldfs::fs::ROOT_INO, b"f", 0o100644, 0)
            .unwrap()
            .ino;
        let a = FuseFs {
            fs,
            no_open: AtomicBool::new(false),
            control: None,
            writeback_cache: false,
            atime: ldfs::fs::AtimeMode::NoAtime,
            nodiratime: false,
            forgets: std::sync::atomic::AtomicU64::new(0),
            yield_space: None,
            write_gate: None,
        };
        let who = |uid| Caller {
            uid,
            gid: uid,
            pid: 1,
        };
        const SET: u32 = 0x4008_6602;
        const GET: u32 = 0x8008_6601;
        let c = 4u32.to_le_bytes();
        let e = a.ioctl(&who(2000), f, 0, SET, &c, 0).unwrap_err();
        assert_eq!(e, fuser::Errno::from_i32(libc::EPERM));
        assert_eq!(a.ioctl(&who(2000), f, 0, GET, &[], 4).unwrap(), [0; 4]);
        a.ioctl(&who(1000), f, 0, SET, &c, 0).unwrap();
        assert_eq!(a.ioctl(&who(2000), f, 0, GET, &[], 4).unwrap(), c);
        a.ioctl(&who(0), f, 0, SET, &[0; 4], 0).unwrap();
        assert_eq!(a.ioctl(&who(0), f, 0, GET, &[], 4).unwrap(), [0; 4]);
    }

    /// Issue 16: the destroys of unlinked small files wait for a batch
    /// (`Fs::unpin`); an operation that finds no space destroys them and
    /// tries again (`FuseFs::room`), so deleting small files on a full file
    /// system makes room for the next write at once.
    #[test]
    fn a_write_on_a_full_file_system_gets_the_room_of_released_orphans() {
        use crate::fuse::transport::{Caller, FuseOps};
        use ldfs::fs::FsError;
        let (_t, _image, lld) = engine();
        let (fs, ctx) = formatted(&lld, 0);
        let root = ldfs::fs::ROOT_INO;
        let a = FuseFs {
            fs: fs.clone(),
            no_open: AtomicBool::new(true),
            control: None,
            writeback_cache: false,
            atime: ldfs::fs::AtimeMode::NoAtime,
            nodiratime: false,
            forgets: std::sync::atomic::AtomicU64::new(0),
            yield_space: None,
            write_gate: None,
        };
        let name = |k: usize| format!("s{k}").into_bytes();
        let small: Vec<u64> = (0..40)
            .map(|k| {
                let i = fs.mknod(ctx, root, &name(k), 0o100644, 0).unwrap().ino;
                fs.write(i, 0, &[k as u8; 2000]).unwrap();
                i
            })
            .collect();
        let big = fs.mknod(ctx, root, b"big", 0o100644, 0).unwrap().ino;
        let mut off = 0;
        loop {
            match fs.write(big, off, &[1u8; 4096]) {
                Ok(_) => off += 4096,
                Err(FsError::NoSpace { .. }) => break,
                Err(e) => panic!("filling: {e}"),
            }
        }
        // Looked up by the kernel, unlinked, forgotten.
        for (k, &i) in small.iter().enumerate() {
            fs.pin(i, 1);
            fs.unlink(root, &name(k)).unwrap();
            a.forget(i, 1);
        }
        assert!(
            matches!(
                fs.write(big, off, &[1u8; 4096]),
                Err(FsError::NoSpace { .. })
            ),
            "room without destroying the released orphans"
        );
        let c = Caller {
            uid: 0,
            gid: 0,
            pid: 1,
        };
        assert_eq!(a.write(&c, big, 0, off, &[1u8; 4096], 0), Ok(4096));
    }

    /// A protected checkpoint a reader has mounted cannot be deleted, so
    /// it does not count toward what a yield could give back: a request
    /// only it could cover deletes none of the others.
    #[test]
    fn a_mounted_protected_checkpoint_does_not_count_toward_a_yield() {
        let (_t, image, lld) = with_protected(2);
        let h = ProtectedHistory::new(lld.clone(), image.clone());
        let all = lld.protected_bytes();
        let newest = lld.snapshots()[1].number;
        let one = lld.kept_bytes_of(&[lld.snapshots()[0].number], false);
        assert!(one < all, "{one} of {all}");
        // A reader (a snapshot mount) holds the newest.
        let reader = ldfs::lld::SnapshotLock::shared(File::open(&image).unwrap(), newest).unwrap();
        let seen = h.given();
        assert!(
            !h.give_back(one + 1, seen),
            "a request only the mounted one could cover yielded"
        );
        assert_eq!(lld.snapshots().len(), 2);
        assert!(h.give_back(one, seen));
        assert_eq!(lld.snapshots().len(), 1);
        assert_eq!(lld.snapshots()[0].number, newest);
        drop(reader);
    }

    /// Review 30, finding 3 (low-medium): a yield while a reader holds
    /// one checkpoint of the oldest generation deletes that generation's
    /// other records, which frees nothing (the held one keeps the shared
    /// bit on every segment), and counts it as a deletion; the retry then
    /// deletes the next generation. History is lost for no space. Fixed on
    /// review30: a generation a reader holds is skipped whole, the next
    /// one yields.
    #[test]
    fn review30_a_yield_skips_a_generation_a_reader_holds() {
        use ldfs::ld::ListHints;
        let (_t, image, lld) = engine_kept(1);
        for i in 0..6u64 {
            let l = lld.create_list(None, ListHints::default()).unwrap();
            for b in 0..16 {
                lld.write(None, l, b, &[i as u8 + 1; 4096]).unwrap();
            }
            lld.take_protected(1_700_000_001 + i, 3).unwrap();
            lld.delete_list(None, l).unwrap();
        }
        lld.checkpoint_now().unwrap();
        let before: Vec<u64> = lld.snapshots().iter().map(|s| s.number).collect();
        let reader =
            ldfs::lld::SnapshotLock::shared(File::open(&image).unwrap(), before[1]).unwrap();
        let h = ProtectedHistory::new(lld.clone(), image);
        let seen = h.given();
        assert!(h.give_back(4096, seen));
        let left: Vec<u64> = lld.snapshots().iter().map(|s| s.number).collect();
        assert_eq!(left, before[..3], "the held generation stays whole");
        drop(reader);
    }

    /// Review 30, finding 4 (low): on an image without a kept table the
    /// schedule is documented as before (one every span/8: DESIGN "The
    /// kept table", README), but `protect_schedule` takes the slack meant
    /// for the 1365-record table (capacity - 10) from the 24 header
    /// records: with 8 snapshots kept it is span/6, with 14 or more once
    /// per span, though 9 protected bits (8 and the one expiring) fit.
    /// Fixed on gens by 78b2113 (the same change).
    #[test]
    fn review30_old_format_protect_keeps_span_over_eight_with_snapshots_kept() {
        let h = Duration::from_secs(3600);
        for snapshots in [0usize, 8, 14] {
            let capacity = ldfs::lld::snapshot::MAX_SNAPSHOTS - snapshots;
            let (every, window) = protect_schedule(h, 5, capacity);
            assert_eq!(
                (every.as_secs(), window),
                (450, 450),
                "{snapshots} snapshots kept"
            );
        }
    }
}
