//! `ldfs bench dual --quick` (issue 14, the DualFS paper's section 4 on
//! loop devices): the command runs end to end on every target, its JSON has
//! every key, every phase's I/O time is read per device from the block
//! layer (both of ldfs-dual's devices, both partitions of ldfs-dual-1d), and
//! with `--out` it writes its own section of BENCHMARKS.md without touching
//! the rest. Needs root, loop devices and FUSE; skips with the reason
//! otherwise.

mod common;

use common::{fuse_usable, ldfs};
use serde_json::Value;

fn runs_of<'a>(doc: &'a Value, target: &str) -> Vec<&'a Value> {
    doc["runs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["target"].as_str().unwrap().split(' ').next() == Some(target))
        .collect()
}

/// The I/O milliseconds of the device with `role`, summed over `runs`.
fn role_ms(runs: &[&Value], role: &str) -> u64 {
    runs.iter()
        .flat_map(|r| r["devices"].as_array().unwrap())
        .filter(|d| d["role"] == role)
        .map(|d| d["io_ms"].as_u64().unwrap())
        .sum()
}

#[test]
fn bench_dual_quick_measures_io_time_per_device() {
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("\n*** SKIPPING bench dual: needs root (loop devices, mount) ***\n");
        return;
    }
    if !std::path::Path::new("/dev/loop-control").exists() {
        eprintln!("\n*** SKIPPING bench dual: no loop devices (/dev/loop-control) ***\n");
        return;
    }
    if !fuse_usable() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let json = t.path().join("dual.json");
    let out = t.path().join("docs");
    std::fs::create_dir_all(&out).unwrap();
    let keep = "# ldfs benchmarks\n\nSomething bench fs wrote.\n";
    std::fs::write(out.join("BENCHMARKS.md"), keep).unwrap();
    let work = t.path().join("work");
    let res = ldfs()
        .args(["bench", "dual", "--quick", "--dir"])
        .arg(&work)
        .arg("--json")
        .arg(&json)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&res.stderr);
    assert!(res.status.success(), "{err}");
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    for k in [
        "machine",
        "description",
        "targets",
        "skipped",
        "runs",
        "errors",
    ] {
        assert!(doc.get(k).is_some(), "no {k} in the JSON");
    }
    assert_eq!(doc["errors"], serde_json::json!([]), "{err}");
    for k in ["load_start", "load_end", "date", "cpu"] {
        assert!(doc["machine"].get(k).is_some(), "no machine.{k}");
    }
    let targets: Vec<&str> = doc["targets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    for skipped in doc["skipped"].as_array().unwrap() {
        eprintln!("bench dual skipped {skipped}");
    }
    assert!(targets.contains(&"ldfs-dual"), "{doc}");
    for r in doc["runs"].as_array().unwrap() {
        for k in [
            "experiment",
            "phase",
            "target",
            "rep",
            "load",
            "wall_s",
            "io_s",
        ] {
            assert!(r.get(k).is_some(), "run without {k}: {r}");
        }
        let devices = r["devices"].as_array().unwrap();
        assert!(!devices.is_empty(), "{r}");
        for d in devices {
            for k in [
                "role",
                "device",
                "summed",
                "io_ms",
                "reads",
                "writes",
                "read_kib",
                "write_kib",
            ] {
                assert!(d.get(k).is_some(), "device without {k}: {r}");
            }
        }
        // The total is the summed devices' busy time.
        let summed: u64 = devices
            .iter()
            .filter(|d| d["summed"] == true)
            .map(|d| d["io_ms"].as_u64().unwrap())
            .sum();
        assert!(
            (r["io_s"].as_f64().unwrap() - summed as f64 / 1000.0).abs() < 1e-9,
            "{r}"
        );
    }
    for target in &targets {
        let runs = runs_of(&doc, target);
        let phases: Vec<&str> = runs.iter().map(|r| r["phase"].as_str().unwrap()).collect();
        for p in [
            "read-meta",
            "read-data-meta",
            "write-meta",
            "write-data-meta",
            "read-write-meta",
            "read-write-data-meta",
            "read-meta, 4 processes",
            "read-data-meta, 4 processes",
            "write-meta, 4 processes",
            "write-data-meta, 4 processes",
            "read-write-meta, 4 processes",
            "read-write-data-meta, 4 processes",
            "PostMark",
            "write-del",
        ] {
            assert!(phases.contains(&p), "{target}: no {p} run");
        }
        // Copying the tree writes megabytes to the counted devices. (Its
        // busy time may round to 0 ms on fast storage: diskstats counts in
        // jiffies; busy time is checked over all phases below.)
        let wdm = runs
            .iter()
            .find(|r| r["phase"] == "write-data-meta")
            .unwrap();
        let written: u64 = wdm["devices"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|d| d["summed"] == true)
            .map(|d| d["write_kib"].as_u64().unwrap())
            .sum();
        assert!(written >= 1024, "{wdm}");
        assert!(wdm["wall_s"].as_f64().unwrap() > 0.0, "{wdm}");
        if target.starts_with("ldfs") {
            let wd: Vec<&str> = runs
                .iter()
                .filter(|r| r["phase"] == "write-del")
                .map(|r| r["target"].as_str().unwrap())
                .collect();
            assert_eq!(wd.len(), 2, "{target}: write-del without and with cleaning");
        }
    }
    // ldfs-dual: two loop devices, each busy, each written.
    let dual = runs_of(&doc, "ldfs-dual");
    let wdm = dual
        .iter()
        .find(|r| r["phase"] == "write-data-meta")
        .unwrap();
    let devs = wdm["devices"].as_array().unwrap();
    assert_eq!(devs.len(), 2, "{wdm}");
    assert_ne!(devs[0]["device"], devs[1]["device"], "{wdm}");
    for d in devs {
        assert!(d["writes"].as_u64().unwrap() > 0, "{wdm}");
        assert_eq!(d["summed"], true, "{wdm}");
    }
    // Busy time is counted in jiffies and only for I/O that spans one; a
    // fast machine (CI's) may report 0 ms for a whole quick run of a target.
    // Bytes are exact: each device wrote over the runs, and busy time, where
    // the machine reports any, is attributed to both devices.
    let all: Vec<&Value> = doc["runs"].as_array().unwrap().iter().collect();
    let busy_anywhere = all
        .iter()
        .flat_map(|r| r["devices"].as_array().unwrap())
        .any(|d| d["io_ms"].as_u64().unwrap() > 0);
    for role in ["meta", "data"] {
        let kib: u64 = dual
            .iter()
            .flat_map(|r| r["devices"].as_array().unwrap())
            .filter(|d| d["role"] == role)
            .map(|d| d["write_kib"].as_u64().unwrap())
            .sum();
        assert!(kib > 0, "{role} device never written");
    }
    if busy_anywhere {
        assert!(
            role_ms(&dual, "meta") + role_ms(&dual, "data") > 0,
            "dual devices never busy"
        );
    } else {
        eprintln!("note: this machine reported 0 ms of busy time for every device");
    }
    // ldfs-dual-1d: one disk counted, its two partitions reported.
    if targets.contains(&"ldfs-dual-1d") {
        let d1 = runs_of(&doc, "ldfs-dual-1d");
        let roles: Vec<(&str, bool)> = d1[0]["devices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| (d["role"].as_str().unwrap(), d["summed"].as_bool().unwrap()))
            .collect();
        assert_eq!(
            roles,
            vec![("disk", true), ("meta", false), ("data", false)]
        );
        if busy_anywhere {
            assert!(role_ms(&d1, "disk") > 0, "one-disk layout never busy");
        }
    }
    // The section is written between its markers; the rest is kept.
    let md = std::fs::read_to_string(out.join("BENCHMARKS.md")).unwrap();
    assert!(md.starts_with(keep.trim_end()), "{md}");
    let begin = md
        .find("<!-- begin dual: written by `ldfs bench dual --out`")
        .unwrap();
    let end = md.find("<!-- end dual -->").unwrap();
    let section = &md[begin..end];
    assert!(
        section.contains("| phase | ldfs-dual I/O s (wall s)"),
        "{section}"
    );
    assert!(section.contains("### write-del"), "{section}");
    assert!(section.contains("| write-meta, 4 processes |"), "{section}");
    // Everything it made is gone (images, mount points, the pattern tmpfs).
    let left: Vec<_> = std::fs::read_dir(&work)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}
