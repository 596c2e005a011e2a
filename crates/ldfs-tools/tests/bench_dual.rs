//! `ldfs bench fs` runs the dual layout as its own target, `ldfs-dual`
//! (issue 14; DualFS 4.1 beside ldfs): a pair of plain image files is
//! formatted, mounted, measured and removed. Needs root (the bench drops
//! caches and mounts with allow_other) and FUSE.

mod common;

use common::{fuse_usable, ldfs};

#[test]
fn bench_fs_runs_the_ldfs_dual_target() {
    if !fuse_usable() {
        return;
    }
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("\n*** SKIPPING bench fs ldfs-dual: needs root ***\n");
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let json = t.path().join("r.json");
    let out = ldfs()
        .args(["bench", "fs", "--quick", "--rounds", "1"])
        .args(["--image-size", "256M"])
        .args(["--targets", "ldfs-dual", "--workloads", "metadata"])
        .arg("--dir")
        .arg(t.path())
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(v["targets"], serde_json::json!(["ldfs-dual"]), "{v}");
    let w = &v["workloads"][0];
    assert_eq!(w["errors"], serde_json::json!([]), "{w}");
    let phases = w["phases"].as_array().unwrap();
    assert_eq!(phases.len(), 4, "{w}");
    for p in phases {
        assert!(p["median"][0].as_f64().unwrap() > 0.0, "{p}");
    }
    // Both images and the mount point are gone afterwards.
    let left: Vec<_> = std::fs::read_dir(t.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, vec![std::ffi::OsString::from("r.json")], "{err}");
}
