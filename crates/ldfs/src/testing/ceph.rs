//! The real S3 gateway for integration tests: a one-node Ceph cluster (`scripts/ceph.sh`).
//!
//! `./scripts/test.sh` starts one for the run and passes its environment file in
//! `LDFS_S3_ENV` (or `LDFS_S3_SKIP` with the reason when the Ceph packages cannot be
//! installed). A test run by hand without either starts (or reuses) a cluster in
//! `/var/tmp/ldfs-ceph-shared` and leaves it running for the next run, saying how to stop it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The gateway's environment (AWS_ENDPOINT_URL, keys, region), or why there is none.
pub enum Gateway {
    Ready(BTreeMap<String, String>),
    Skip(String),
}

/// Parse `export K=V` lines.
pub fn read_env_file(path: &Path) -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read the gateway's env file {}: {e}", path.display()));
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("export "))
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/ceph.sh")
}

/// The folder of the cluster `gateway()` uses.
pub fn cluster_dir() -> PathBuf {
    match std::env::var("LDFS_S3_ENV") {
        Ok(p) => Path::new(&p)
            .parent()
            .expect("LDFS_S3_ENV names a file in the cluster's folder")
            .to_path_buf(),
        Err(_) => PathBuf::from("/var/tmp/ldfs-ceph-shared"),
    }
}

/// Stops the cluster's radosgw (SIGTERM, waits for it to exit): the store is down.
pub fn stop_radosgw(dir: &Path) {
    let pid_file = dir.join("run/client.rgw.a.pid");
    let pid = std::fs::read_to_string(&pid_file)
        .unwrap_or_else(|e| panic!("{}: {e}", pid_file.display()));
    let pid = pid.trim();
    let st = Command::new("kill").arg(pid).status().expect("kill");
    assert!(st.success(), "kill {pid}");
    let proc_dir = PathBuf::from(format!("/proc/{pid}"));
    for _ in 0..300 {
        if !proc_dir.exists() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    panic!("radosgw {pid} still running 30 s after SIGTERM");
}

/// Starts whatever of the cluster is not running (radosgw after `stop_radosgw`).
pub fn start_cluster(dir: &Path) {
    let out = Command::new("bash")
        .arg(script())
        .arg("start")
        .arg(dir)
        .output()
        .expect("run scripts/ceph.sh");
    assert!(
        out.status.success(),
        "scripts/ceph.sh start {} failed: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The gateway to test against; panics if one should be there and cannot be started.
pub fn gateway() -> Gateway {
    if let Ok(p) = std::env::var("LDFS_S3_ENV") {
        return Gateway::Ready(read_env_file(Path::new(&p)));
    }
    if let Ok(why) = std::env::var("LDFS_S3_SKIP") {
        return Gateway::Skip(why);
    }
    let dir = PathBuf::from("/var/tmp/ldfs-ceph-shared");
    let out = Command::new("bash")
        .arg(script())
        .arg("start")
        .arg(&dir)
        .output()
        .expect("run scripts/ceph.sh");
    match out.status.code() {
        Some(0) => {
            eprintln!(
                "note: the Ceph cluster in {} is left running for the next test; stop it with \
                 scripts/ceph.sh stop {}",
                dir.display(),
                dir.display()
            );
            Gateway::Ready(read_env_file(&dir.join("env")))
        }
        Some(3) => Gateway::Skip(String::from_utf8_lossy(&out.stderr).trim().to_string()),
        _ => panic!(
            "scripts/ceph.sh start {} failed ({}):\n{}",
            dir.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

/// A bucket name no other test run uses (S3: 3-63 lowercase letters, digits, dashes).
pub fn unique_bucket(what: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!(
        "ldfs-{what}-{}-{}",
        std::process::id(),
        nanos % 1_000_000_000_000
    )
}
