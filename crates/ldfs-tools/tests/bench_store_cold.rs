//! `ldfs bench store-cold` at its smallest (issue 20's cold-mount figure) against the gateway:
//! the run writes its files through a bounded cache, then a read-write mount on an empty cache
//! fetches less than a segment's worth before it is usable and every segment as the files are
//! read, a read-only mount on an empty cache likewise (it pins its checkpoint and fetches as
//! it reads, where it once downloaded the whole); the figures are printed, in the JSON and in
//! the run's own section of BENCHMARKS.md (the rest of the file kept), and the run leaves
//! nothing behind in its directory.

mod common;

use common::{fuse_usable, ldfs, Succeeds};
use ldfs::testing::ceph::{gateway, Gateway};

#[test]
fn bench_store_cold_smallest_run() {
    if !fuse_usable() {
        return;
    }
    let vars = match gateway() {
        Gateway::Ready(v) => v,
        Gateway::Skip(why) => {
            eprintln!("*** SKIPPING bench store-cold: {why} ***");
            return;
        }
    };
    std::fs::create_dir_all("/var/tmp/s3mount-tests").unwrap();
    let dir = tempfile::tempdir_in("/var/tmp/s3mount-tests").unwrap();
    let work = dir.path().join("work");
    let out = dir.path().join("docs");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("BENCHMARKS.md"), "# ldfs benchmarks\n\nkept\n").unwrap();
    let json = dir.path().join("cold.json");
    const DATA: u64 = 16 << 20;
    const SEGMENT: u64 = 512 << 10;
    let o = ldfs()
        .envs(&vars)
        .args(["bench", "store-cold", "--quick", "--size", "16M"])
        .args([
            "--file-size",
            "4M",
            "--segment-size",
            "512K",
            "--cache-size",
            "4M",
        ])
        .arg("--dir")
        .arg(&work)
        .arg("--json")
        .arg(&json)
        .arg("--out")
        .arg(&out)
        .succeeds();
    let text = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(
        text.contains("cold read-write mount: time to a usable mount"),
        "{text}"
    );
    let j: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let n = |k: &str| j[k].as_u64().unwrap_or_else(|| panic!("{k} in {j}"));
    let f = |k: &str| j[k].as_f64().unwrap_or_else(|| panic!("{k} in {j}"));
    assert_eq!(n("data_bytes"), DATA, "{j}");
    assert_eq!(n("files"), 4, "{j}");
    // Before any read the cold mount fetched at most the segments lld's open reads, and its
    // cache holds little more than its metadata and the Active segment's prefix.
    assert!(n("cold_mount_fetched_bytes") < DATA / 2, "{j}");
    assert!(n("cold_mount_allocated_bytes") < DATA / 2, "{j}");
    // Reading everything fetched at least every byte written, and evicted to stay bounded.
    assert!(n("cold_read_fetched_bytes") >= DATA, "{j}");
    assert!(n("cold_read_misses") >= DATA / SEGMENT, "{j}");
    assert!(n("cold_read_evictions") > 0, "{j}");
    assert!(
        f("cold_mount_secs") > 0.0 && f("cold_read_mb_s") > 0.0,
        "{j}"
    );
    // The read-only mount, as the read-write one, holds little before any read (before the
    // pins it downloaded the whole file system).
    assert!(n("ro_allocated_bytes") < DATA / 2, "{j}");
    assert!(f("ro_mount_secs") > 0.0, "{j}");
    let md = std::fs::read_to_string(out.join("BENCHMARKS.md")).unwrap();
    assert!(md.starts_with("# ldfs benchmarks\n\nkept\n"), "{md}");
    assert!(md.contains("<!-- begin store-cold:"), "{md}");
    assert!(md.contains("time to a usable mount"), "{md}");
    // The caches, their notes and maps, and the mount point are gone.
    let left: Vec<_> = std::fs::read_dir(&work)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "left behind: {left:?}");
}
