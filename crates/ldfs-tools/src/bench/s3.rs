//! The `ldfs-s3` target of `ldfs bench fs` (issue 20, "Figures"): ldfs mounted from a bucket
//! of a Ceph S3 gateway (`ldfs mkfs --store`, `ldfs mount s3://...`), its cache an image file
//! in `--dir`; and the gateway's own PUT throughput, measured in the same run with the same
//! client, which the upload throughput of the large-file workload is compared with.
//!
//! The gateway is the one the AWS_* environment names (`AWS_ENDPOINT_URL` set), or else a
//! one-node Ceph cluster this run starts in `--dir` with the repository's `scripts/ceph.sh`
//! (built into the binary, so an installed `ldfs` needs no checkout) and destroys at its end,
//! also on error and Ctrl-C ([`Gateway`]'s drop). Each mount gets a prefix of its own in one
//! bucket of the run; what a target put there is deleted when it is torn down, and the bucket
//! when the run ends.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ldfs::store::{ObjectStore, S3Config, S3Store};

use super::fs::R;

/// `scripts/ceph.sh`, written next to the cluster it starts.
const CEPH_SH: &str = include_str!("../../../../scripts/ceph.sh");

/// The S3 gateway of a run; see the module documentation.
pub struct Gateway {
    /// The AWS_* variables the mounts and the in-process client use.
    env: BTreeMap<String, String>,
    pub bucket: String,
    /// The cluster this run started: (script, folder), destroyed on drop.
    own: Option<(PathBuf, PathBuf)>,
    next: AtomicUsize,
    /// Where the gateway is, for the report.
    pub describe: String,
}

/// `export K=V` lines (scripts/ceph.sh's env file).
fn parse_env(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("export "))
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

impl Gateway {
    /// The gateway of the AWS_* environment if `AWS_ENDPOINT_URL` is set, else a cluster
    /// started in `dir/bench-ceph`. `Err` is the reason the target is skipped (the Ceph
    /// packages cannot be installed, the cluster does not start, the bucket cannot be made);
    /// whatever was started is stopped and removed by then.
    pub fn start(dir: &Path) -> R<Gateway> {
        let bucket = format!(
            "ldfs-bench-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs() % 1_000_000)
        );
        let given = std::env::var("AWS_ENDPOINT_URL").is_ok_and(|v| !v.is_empty());
        let mut g = Gateway {
            env: BTreeMap::new(),
            bucket,
            own: None,
            next: AtomicUsize::new(0),
            describe: String::new(),
        };
        if given {
            g.env = std::env::vars()
                .filter(|(k, _)| k.starts_with("AWS_"))
                .collect();
            g.describe = format!(
                "the S3 gateway at {} (from the environment)",
                g.env["AWS_ENDPOINT_URL"]
            );
        } else {
            let script = dir.join("bench-ceph.sh");
            let cluster = dir.join("bench-ceph");
            std::fs::write(&script, CEPH_SH).map_err(|e| format!("{}: {e}", script.display()))?;
            // Owned before it starts: a start cut short (an error, Ctrl-C reaching the script
            // too) is still destroyed.
            g.own = Some((script.clone(), cluster.clone()));
            eprintln!(
                "bench fs: starting a one-node Ceph cluster in {} for ldfs-s3",
                cluster.display()
            );
            let t = Instant::now();
            let out = Command::new("bash")
                .arg(&script)
                .arg("start")
                .arg(&cluster)
                .output()
                .map_err(|e| format!("bash {}: {e}", script.display()))?;
            let stderr = String::from_utf8_lossy(&out.stderr);
            let last: Vec<&str> = stderr.lines().rev().take(3).collect();
            let last = last.into_iter().rev().collect::<Vec<_>>().join("; ");
            match out.status.code() {
                Some(0) => {}
                Some(3) => return Err(format!("no Ceph: {last}")),
                _ => return Err(format!("Ceph did not start ({}): {last}", out.status)),
            }
            let env_file = cluster.join("env");
            let text = std::fs::read_to_string(&env_file)
                .map_err(|e| format!("{}: {e}", env_file.display()))?;
            g.env = parse_env(&text);
            g.describe = format!(
                "a one-node Ceph cluster (scripts/ceph.sh) started by the run in {:.0} s, its gateway at {}",
                t.elapsed().as_secs_f64(),
                g.env.get("AWS_ENDPOINT_URL").map_or("?", String::as_str)
            );
        }
        g.client("")?
            .create_bucket()
            .map_err(|e| format!("creating bucket {}: {e}", g.bucket))?;
        eprintln!("bench fs: ldfs-s3 on {}, bucket {}", g.describe, g.bucket);
        Ok(g)
    }

    /// The variables a subprocess needs to reach the gateway.
    pub fn env(&self) -> &BTreeMap<String, String> {
        &self.env
    }

    /// An S3 client for `prefix` of the run's bucket: the client the mounts use (`S3Store`).
    pub fn client(&self, prefix: &str) -> R<Arc<S3Store>> {
        let cfg = S3Config::from_vars(&self.bucket, prefix, |k| self.env.get(k).cloned())
            .map_err(|e| e.to_string())?;
        Ok(Arc::new(S3Store::new(&cfg).map_err(|e| e.to_string())?))
    }

    /// A prefix no other mount of the run uses.
    pub fn next_prefix(&self) -> String {
        format!("fs{}", self.next.fetch_add(1, Ordering::Relaxed))
    }

    /// `s3://BUCKET/PREFIX`.
    pub fn url(&self, prefix: &str) -> String {
        format!("s3://{}/{prefix}", self.bucket)
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        match &self.own {
            Some((script, cluster)) => {
                eprintln!(
                    "bench fs: stopping and removing the Ceph cluster in {}",
                    cluster.display()
                );
                let _ = Command::new("bash")
                    .arg(script)
                    .arg("destroy")
                    .arg(cluster)
                    .status();
                let _ = std::fs::remove_file(script);
            }
            None => {
                // A gateway given to the run keeps nothing of it.
                if let Ok(c) = self.client("") {
                    let _ = delete_all(&*c);
                    if let Err(e) = c.delete_bucket() {
                        eprintln!("bench fs: deleting bucket {}: {e}", self.bucket);
                    }
                }
            }
        }
    }
}

/// The names of the processes of a Ceph cluster: what the split-CPU measurement pins apart.
const CEPH_DAEMONS: [&str; 4] = ["ceph-mon", "ceph-mgr", "ceph-osd", "radosgw"];

impl Gateway {
    /// The processes of the gateway's cluster: those of the cluster this run started (their
    /// command line names its folder), or, for a gateway given by the environment, every Ceph
    /// daemon on the machine (which cluster serves the endpoint is not known).
    pub fn daemons(&self) -> Vec<u32> {
        let folder = self.own.as_ref().map(|(_, c)| c.display().to_string());
        processes()
            .into_iter()
            .filter(|&pid| {
                let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
                if !CEPH_DAEMONS.contains(&comm.trim()) {
                    return false;
                }
                match &folder {
                    None => true,
                    Some(f) => std::fs::read(format!("/proc/{pid}/cmdline"))
                        .is_ok_and(|c| String::from_utf8_lossy(&c).contains(f.as_str())),
                }
            })
            .collect()
    }

    /// The daemons of the cluster this run started, which it may stop for a moment
    /// ([`GatewayStall`]); none for a gateway from the environment, which is not this run's
    /// (every radosgw on the machine would be: review 50 finding 1).
    pub fn stall_daemons(&self) -> Vec<u32> {
        match self.own {
            Some(_) => self.daemons(),
            None => Vec::new(),
        }
    }
}

/// Every process id in /proc.
fn processes() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// The threads (tasks) of process `pid`.
fn tasks(pid: u32) -> Vec<i32> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// The CPUs this process may run on.
pub fn allowed_cpus() -> Vec<usize> {
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    if unsafe { libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set) } != 0 {
        return Vec::new();
    }
    (0..libc::CPU_SETSIZE as usize)
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect()
}

fn cpu_set(cpus: &[usize]) -> libc::cpu_set_t {
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in cpus {
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    set
}

/// `2,3`: the CPUs of a set, for the report.
pub fn cpu_list(cpus: &[usize]) -> String {
    cpus.iter()
        .map(|c| c.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// The gateway's CPU apart from ldfs's (issue 20's upload figure on a machine whose cores the
/// Ceph daemons share with the ldfs daemon and the writer): every thread of the Ceph daemons
/// on one half of the allowed CPUs, every thread of the ldfs daemon and of this process (the
/// writer, the PUT baseline's client) on the other, each thread's own affinity restored on
/// [`CpuSplit::restore`] or drop. Threads started later inherit their starter's affinity, so a
/// pinned process stays pinned; threads started between the listing and the pinning are
/// caught by listing again until none is new.
pub struct CpuSplit {
    saved: Vec<(i32, libc::cpu_set_t)>,
    /// Each pinned process and the mask its main thread had (for threads started since).
    procs: Vec<(u32, libc::cpu_set_t)>,
    pub ldfs_cpus: Vec<usize>,
    pub ceph_cpus: Vec<usize>,
}

impl CpuSplit {
    /// Pins `ceph` (process ids) and `ldfs` apart; `Err` is why not (fewer than 2 CPUs, no
    /// daemon, a pin refused), with whatever was pinned restored.
    pub fn apply(ceph: &[u32], ldfs: &[u32]) -> R<CpuSplit> {
        let cpus = allowed_cpus();
        if cpus.len() < 2 {
            return Err(format!(
                "the benchmark may run on {} CPU(s): nothing to split",
                cpus.len()
            ));
        }
        if ceph.is_empty() {
            return Err("no Ceph daemon (ceph-mon, ceph-mgr, ceph-osd, radosgw) found".into());
        }
        let (l, c) = cpus.split_at(cpus.len() / 2);
        let mut split = CpuSplit {
            saved: Vec::new(),
            procs: Vec::new(),
            ldfs_cpus: l.to_vec(),
            ceph_cpus: c.to_vec(),
        };
        let (lset, cset) = (cpu_set(l), cpu_set(c));
        for (pids, set) in [(ceph, cset), (ldfs, lset)] {
            for &pid in pids {
                split.pin(pid, &set)?;
            }
        }
        Ok(split)
    }

    fn pin(&mut self, pid: u32, set: &libc::cpu_set_t) -> R<()> {
        let size = std::mem::size_of::<libc::cpu_set_t>();
        let mut main: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        if unsafe { libc::sched_getaffinity(pid as i32, size, &mut main) } != 0 {
            return Err(format!(
                "process {pid}: sched_getaffinity: {}",
                std::io::Error::last_os_error()
            ));
        }
        self.procs.push((pid, main));
        for _round in 0..5 {
            let new: Vec<i32> = tasks(pid)
                .into_iter()
                .filter(|t| !self.saved.iter().any(|(s, _)| s == t))
                .collect();
            if new.is_empty() {
                return Ok(());
            }
            for tid in new {
                let mut old: libc::cpu_set_t = unsafe { std::mem::zeroed() };
                if unsafe { libc::sched_getaffinity(tid, size, &mut old) } != 0 {
                    continue; // the thread ended
                }
                if unsafe { libc::sched_setaffinity(tid, size, set) } != 0 {
                    let e = std::io::Error::last_os_error();
                    if e.raw_os_error() == Some(libc::ESRCH) {
                        continue;
                    }
                    return Err(format!(
                        "thread {tid} of process {pid}: sched_setaffinity: {e}"
                    ));
                }
                self.saved.push((tid, old));
            }
        }
        Ok(())
    }

    /// Every pinned thread back to its own affinity; a thread started since, to its process's.
    pub fn restore(mut self) {
        self.restore_all();
    }

    fn restore_all(&mut self) {
        let size = std::mem::size_of::<libc::cpu_set_t>();
        for (pid, main) in std::mem::take(&mut self.procs) {
            for tid in tasks(pid) {
                let set = self
                    .saved
                    .iter()
                    .find(|(t, _)| *t == tid)
                    .map_or(main, |(_, s)| *s);
                // A thread that ended meanwhile: nothing to restore.
                unsafe { libc::sched_setaffinity(tid, size, &set) };
            }
        }
        self.saved.clear();
    }
}

impl Drop for CpuSplit {
    fn drop(&mut self) {
        self.restore_all();
    }
}

/// The gateway stopped (SIGSTOP to this run's radosgw) until [`GatewayStall::resume`] or
/// drop: a stall, as of a gateway that takes connections and answers nothing, so that a write
/// meanwhile leaves its whole upload for after the gateway's return (the catch-up figure,
/// [`DrainUpload`]). Requests sent meanwhile wait in the gateway's sockets and are served on
/// its return; none reaches its timeout (2 minutes) in the fraction of a second it lasts.
pub struct GatewayStall {
    stopped: Vec<u32>,
}

impl GatewayStall {
    /// Stops every radosgw among `daemons` (this run's cluster's processes); `Err` is why not
    /// (none: a gateway from the environment is not this run's to stop).
    pub fn apply(daemons: &[u32]) -> R<GatewayStall> {
        let gateways: Vec<u32> = daemons
            .iter()
            .copied()
            .filter(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/comm"))
                    .is_ok_and(|c| c.trim() == "radosgw")
            })
            .collect();
        if gateways.is_empty() {
            return Err("no radosgw of this run's cluster to stop (a gateway from the environment is not stopped)".into());
        }
        let mut stall = GatewayStall {
            stopped: Vec::new(),
        };
        for pid in gateways {
            if unsafe { libc::kill(pid as i32, libc::SIGSTOP) } != 0 {
                return Err(format!(
                    "radosgw {pid}: SIGSTOP: {}",
                    std::io::Error::last_os_error()
                ));
            }
            stall.stopped.push(pid);
        }
        Ok(stall)
    }

    /// The gateway goes on.
    pub fn resume(mut self) {
        self.resume_all();
    }

    fn resume_all(&mut self) {
        for pid in std::mem::take(&mut self.stopped) {
            unsafe { libc::kill(pid as i32, libc::SIGCONT) };
        }
    }
}

impl Drop for GatewayStall {
    fn drop(&mut self) {
        self.resume_all();
    }
}

/// Deletes every object of `store` (under its prefix); how many.
pub fn delete_all(store: &dyn ObjectStore) -> R<usize> {
    let objects = store.list("").map_err(|e| e.to_string())?;
    for o in &objects {
        store.delete(&o.key).map_err(|e| e.to_string())?;
    }
    Ok(objects.len())
}

/// A mounted `ldfs-s3` target's view of the store: its prefix (emptied at teardown) and what
/// the PUT baseline needs.
pub struct S3Target {
    /// The file system's prefix.
    pub store: Arc<S3Store>,
    /// A prefix beside it for the gateway's own PUTs.
    pub put_store: Arc<S3Store>,
    /// The file system's segment size: the size of the objects the baseline puts.
    pub segment_bytes: u64,
    /// Segment objects the uploader has in flight at once
    /// (`ldfs::store::segments::puts_in_flight`): the baseline's concurrency.
    pub in_flight: usize,
    /// The gateway's cluster's processes (pinned apart for the split-CPU figures).
    pub ceph_pids: Vec<u32>,
    /// The daemons the catch-up figure may stop ([`GatewayStall`]): this run's own cluster's,
    /// none for a gateway from the environment ([`Gateway::stall_daemons`]).
    pub stall_pids: Vec<u32>,
}

/// The upload figures measured again with the CPUs split ([`CpuSplit`]): the Ceph daemons on
/// `ceph_cpus`, the ldfs daemon and the benchmark (writer, PUT client) on `ldfs_cpus`.
#[derive(Clone, Debug, PartialEq)]
pub struct SplitUpload {
    pub upload_mb_s: f64,
    pub after_fsync_mb_s: f64,
    /// The gateway's PUT throughput, `in_flight` at once, with the same split.
    pub gateway_mb_s: f64,
    pub ldfs_cpus: String,
    pub ceph_cpus: String,
}

impl SplitUpload {
    pub fn ratio(&self) -> f64 {
        self.upload_mb_s / self.gateway_mb_s
    }
}

/// The uploader catching up (issue 20's upload figure as the uploader's own throughput): a
/// sequential write of `bytes` (a file of its own) with the gateway stopped
/// ([`GatewayStall`]), so that no put completes before the gateway's return, then timed from
/// that return until `ldfs sync --remote` returns: every byte of the file put in that time,
/// with nothing but the uploader and the gateway running; against the gateway's PUT
/// throughput measured right after (same client, the uploader's concurrency).
#[derive(Clone, Debug, PartialEq)]
pub struct DrainUpload {
    pub bytes: u64,
    /// Bytes written (and put) over the time from the gateway's return to sync --remote's.
    pub drain_mb_s: f64,
    /// The gateway's PUT throughput, `in_flight` at once, measured right after.
    pub gateway_mb_s: f64,
}

impl DrainUpload {
    pub fn ratio(&self) -> f64 {
        self.drain_mb_s / self.gateway_mb_s
    }
}

/// The upload figures of one round's large-file workload on ldfs-s3.
#[derive(Clone, Debug, PartialEq)]
pub struct UploadSample {
    /// Bytes the workload wrote.
    pub bytes: u64,
    /// From the first write to the return of `ldfs sync --remote`: MB/s into the store.
    pub upload_mb_s: f64,
    /// From the fsync's return to `ldfs sync --remote`'s: the uploader's own part.
    pub after_fsync_mb_s: f64,
    /// The gateway's own PUT throughput for segment-size objects, same client, same run,
    /// `in_flight` at once.
    pub gateway_mb_s: f64,
    /// The same, one at a time.
    pub gateway_one_mb_s: f64,
    /// Segment objects and their bytes the uploader put for it.
    pub segments_put: u64,
    pub segment_bytes_put: u64,
    /// The object size and concurrency of the baseline.
    pub object_bytes: u64,
    pub in_flight: usize,
    /// The same measured with the gateway's CPU apart from ldfs's: `Ok`, or why not.
    pub split: Result<SplitUpload, String>,
    /// The uploader catching up after a stall: `Ok`, or why not measured.
    pub drain: Result<DrainUpload, String>,
}

impl UploadSample {
    pub fn ratio(&self) -> f64 {
        self.upload_mb_s / self.gateway_mb_s
    }
}

impl S3Target {
    /// The gateway's PUT throughput for `bytes` in objects of the segment size, `in_flight`
    /// at once: the median of three passes (one pass of the quick run's 32 MiB takes a
    /// fraction of a second, and a single one moved by 2x from run to run here); MB/s.
    pub fn gateway_put_rate(&self, bytes: u64, data: &[u8], in_flight: usize) -> R<f64> {
        let mut v = Vec::new();
        for _ in 0..3 {
            v.push(self.put_pass(bytes, data, in_flight)?);
        }
        Ok(super::report::median(&v).expect("three passes"))
    }

    /// PUTs `bytes` (rounded up to whole objects) as objects of the segment size from
    /// `in_flight` threads, as fast as they go; MB/s. The objects are deleted afterwards
    /// (not timed). `data` is repeated to fill each object.
    fn put_pass(&self, bytes: u64, data: &[u8], in_flight: usize) -> R<f64> {
        let size = self.segment_bytes as usize;
        let mut object = Vec::with_capacity(size);
        while object.len() < size {
            let n = (size - object.len()).min(data.len());
            object.extend_from_slice(&data[..n]);
        }
        let count = bytes.div_ceil(self.segment_bytes).max(1) as usize;
        let next = AtomicUsize::new(0);
        let t0 = Instant::now();
        let failed: Vec<String> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..in_flight.max(1))
                .map(|_| {
                    s.spawn(|| -> R<()> {
                        loop {
                            let i = next.fetch_add(1, Ordering::Relaxed);
                            if i >= count {
                                return Ok(());
                            }
                            // Unique bytes per object, as segments are.
                            let mut o = object.clone();
                            o[..8].copy_from_slice(&(i as u64).to_le_bytes());
                            self.put_store
                                .put(&format!("put/{i:08}"), &o)
                                .map_err(|e| e.to_string())?;
                        }
                    })
                })
                .collect();
            hs.into_iter()
                .filter_map(|h| {
                    h.join()
                        .unwrap_or(Err("a put thread panicked".into()))
                        .err()
                })
                .collect()
        });
        let secs = t0.elapsed().as_secs_f64();
        let _ = delete_all(&*self.put_store);
        if let Some(e) = failed.first() {
            return Err(format!("gateway PUT baseline: {e}"));
        }
        Ok((count as u64 * self.segment_bytes) as f64 / 1e6 / secs)
    }
}

/// Waits (bounded) for process `pid` to exit: a store mount's daemon outlives its unmount by
/// the final upload (up to 2 minutes).
pub fn wait_exit(pid: u32, limit: Duration) {
    let proc_dir = PathBuf::from(format!("/proc/{pid}"));
    let t = Instant::now();
    while proc_dir.exists() && t.elapsed() < limit {
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_lines_parse() {
        let e = parse_env("export AWS_ENDPOINT_URL=http://127.0.0.1:1\n# x\nexport A=b=c\n");
        assert_eq!(e["AWS_ENDPOINT_URL"], "http://127.0.0.1:1");
        assert_eq!(e["A"], "b=c");
        assert_eq!(e.len(), 2);
    }

    /// The CPUs a process's threads may run on, from /proc.
    fn allowed(pid: u32) -> Vec<Vec<usize>> {
        let mut v: Vec<Vec<usize>> = tasks(pid)
            .into_iter()
            .map(|tid| {
                let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
                let r =
                    unsafe { libc::sched_getaffinity(tid, std::mem::size_of_val(&set), &mut set) };
                assert_eq!(r, 0);
                (0..libc::CPU_SETSIZE as usize)
                    .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
                    .collect()
            })
            .collect();
        v.sort();
        v.dedup();
        v
    }

    /// A process's state letter from /proc (`T`: stopped).
    fn state(pid: u32) -> char {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        stat.rsplit_once(") ").unwrap().1.chars().next().unwrap()
    }

    /// Waits (bounded) for `pid` to reach a state `ok` accepts; its last state.
    fn wait_state(pid: u32, ok: impl Fn(char) -> bool) -> char {
        let t = Instant::now();
        loop {
            let s = state(pid);
            if ok(s) || t.elapsed() > Duration::from_secs(10) {
                return s;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Review 50 probe: `bench fs`'s catch-up figure stalls `S3Target::ceph_pids`, which is
    /// `Gateway::daemons()`; for a gateway given by the environment (AWS_ENDPOINT_URL: the
    /// shared one-node Ceph every session's tests use) that is every Ceph daemon on the
    /// machine, so `GatewayStall::apply` SIGSTOPs every radosgw on it, although its contract is
    /// that a gateway from the environment is not this run's to stop. No signal is sent here:
    /// a radosgw no cluster of this run started (a `sleep` named radosgw) must not be among
    /// what an environment gateway's run would stall.
    #[test]
    fn a_gateway_from_the_environment_is_not_among_what_a_stall_stops() {
        let dir = tempfile::tempdir().unwrap();
        let fake = dir.path().join("radosgw");
        std::fs::copy("/bin/sleep", &fake).unwrap();
        let mut rgw = Command::new(&fake).arg("30").spawn().unwrap();
        let r = rgw.id();
        wait_state(r, |s| s == 'S');
        let g = Gateway {
            env: BTreeMap::new(),
            bucket: "review50-never-made".into(),
            own: None,
            next: AtomicUsize::new(0),
            describe: String::new(),
        };
        let would_stop: Vec<u32> = g
            .stall_daemons()
            .into_iter()
            .filter(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/comm"))
                    .is_ok_and(|c| c.trim() == "radosgw")
            })
            .collect();
        // Its drop would delete a bucket of the environment's gateway.
        std::mem::forget(g);
        let _ = rgw.kill();
        let _ = rgw.wait();
        assert!(
            !would_stop.contains(&r),
            "a run on the environment's gateway would SIGSTOP radosgw {r}, which it did not \
             start (every radosgw on the machine: {would_stop:?})"
        );
    }

    #[test]
    fn a_gateway_stall_stops_radosgw_only_and_resumes_it() {
        // `sleep` under the name radosgw (its comm), beside a plain `sleep`.
        let dir = tempfile::tempdir().unwrap();
        let fake = dir.path().join("radosgw");
        std::fs::copy("/bin/sleep", &fake).unwrap();
        let mut rgw = Command::new(&fake).arg("30").spawn().unwrap();
        let mut other = Command::new("sleep").arg("30").spawn().unwrap();
        let (r, o) = (rgw.id(), other.id());
        wait_state(r, |s| s == 'S');
        let stall = GatewayStall::apply(&[r, o]).unwrap();
        assert_eq!(wait_state(r, |s| s == 'T'), 'T', "radosgw not stopped");
        assert_ne!(state(o), 'T', "another daemon stopped");
        stall.resume();
        assert_ne!(wait_state(r, |s| s != 'T'), 'T', "radosgw not resumed");
        // Dropped rather than resumed (an error on the way): resumed all the same.
        drop(GatewayStall::apply(&[r]).unwrap());
        assert_ne!(wait_state(r, |s| s != 'T'), 'T', "radosgw left stopped");
        // No radosgw among the daemons (a gateway from the environment): refused.
        let e = GatewayStall::apply(&[o]).err().unwrap();
        assert!(e.contains("no radosgw"), "{e}");
        for c in [&mut rgw, &mut other] {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    #[test]
    fn the_cpu_split_pins_every_thread_apart_and_restores_them() {
        let cpus = allowed_cpus();
        let spawn = || {
            Command::new("sleep")
                .arg("30")
                .spawn()
                .expect("spawn sleep")
        };
        let (mut a, mut b) = (spawn(), spawn());
        let before = (allowed(a.id()), allowed(b.id()));
        let r = CpuSplit::apply(&[a.id()], &[b.id()]);
        if cpus.len() < 2 {
            assert!(r.is_err(), "split on {} CPU(s)", cpus.len());
        } else {
            let split = r.unwrap();
            assert!(!split.ldfs_cpus.is_empty() && !split.ceph_cpus.is_empty());
            assert!(split.ldfs_cpus.iter().all(|c| !split.ceph_cpus.contains(c)));
            assert_eq!(allowed(a.id()), vec![split.ceph_cpus.clone()]);
            assert_eq!(allowed(b.id()), vec![split.ldfs_cpus.clone()]);
            split.restore();
            assert_eq!((allowed(a.id()), allowed(b.id())), before, "not restored");
        }
        // No Ceph daemon: refused, nothing pinned.
        assert!(CpuSplit::apply(&[], &[b.id()]).is_err());
        assert_eq!(allowed(b.id()), before.1);
        for c in [&mut a, &mut b] {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    #[test]
    fn the_script_is_built_in() {
        assert!(CEPH_SH.starts_with("#!/usr/bin/env bash"));
        assert!(CEPH_SH.contains("destroy)"));
    }
}
