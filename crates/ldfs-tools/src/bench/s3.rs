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

    #[test]
    fn the_script_is_built_in() {
        assert!(CEPH_SH.starts_with("#!/usr/bin/env bash"));
        assert!(CEPH_SH.contains("destroy)"));
    }
}
