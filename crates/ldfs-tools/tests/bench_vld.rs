//! `ldfs bench vld` at its smallest: the command runs end to end, its JSON
//! has every key the issue names (issue 15) and the per-request accounting, equation 1 and its simulation
//! agree within 10% at every utilization on both disks, and with `--out` it
//! writes its own section of BENCHMARKS.md without touching the rest.

mod common;

use common::{ldfs, Succeeds};
use serde_json::Value;

const FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";

fn rows<'a>(doc: &'a Value, key: &str, fields: &[&str]) -> &'a Vec<Value> {
    let rows = doc[key]
        .as_array()
        .unwrap_or_else(|| panic!("no {key} in the JSON"));
    assert!(!rows.is_empty(), "{key} is empty");
    for r in rows {
        for f in fields {
            assert!(r.get(*f).is_some(), "{key} row without {f}: {r}");
        }
    }
    rows
}

#[test]
fn bench_vld_smallest_run() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("vld.json");
    let out = dir.path().join("docs");
    std::fs::create_dir_all(&out).unwrap();
    let keep = "# ldfs benchmarks\n\nSomething bench fs wrote.\n";
    std::fs::write(out.join("BENCHMARKS.md"), keep).unwrap();
    let font = std::path::Path::new(FONT).exists();
    let mut cmd = ldfs();
    cmd.args([
        "bench",
        "vld",
        "--quick",
        "--eq1-trials",
        "50000",
        "--eq10-tracks",
        "50",
        "--utilizations",
        "0.5",
        "--updates",
        "5",
        "--warmup",
        "20",
        "--phase-mib",
        "1",
        "--files",
        "50",
        "--table5-mib",
        "1",
        "--json",
    ])
    .arg(&json);
    if font {
        cmd.arg("--out").arg(&out);
    }
    cmd.succeeds();
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();

    let eq1 = rows(
        &doc,
        "eq1",
        &["disk", "utilization", "model_us", "simulated_us"],
    );
    assert_eq!(eq1.len(), 18, "0.1 to 0.9 on two disks");
    for r in eq1 {
        let (m, s) = (
            r["model_us"].as_f64().unwrap(),
            r["simulated_us"].as_f64().unwrap(),
        );
        assert!(
            (s - m).abs() / m < 0.1,
            "equation 1 and its simulation differ by more than 10%: {r} (seed in the JSON: {})",
            doc["seed"]
        );
    }
    rows(
        &doc,
        "eq10",
        &["disk", "threshold", "model_us", "simulated_us"],
    );
    let updates = rows(
        &doc,
        "random_updates",
        &["disk", "utilization", "system", "latency_us"],
    );
    for system in ["uip-regular", "uip-vld", "lld-regular", "lld-vld"] {
        for disk in ["HP97560", "ST19101"] {
            let r = updates
                .iter()
                .find(|r| r["system"] == system && r["disk"] == disk)
                .unwrap_or_else(|| panic!("no random_updates row for {system} on {disk}"));
            assert!(r["latency_us"].as_f64().unwrap() > 0.0, "{r}");
        }
    }
    rows(
        &doc,
        "breakdown",
        &[
            "disk",
            "host",
            "system",
            "scsi_us",
            "transfer_us",
            "locate_us",
            "other_us",
            "reads_per_update",
            "read_locate_us",
            "write_locate_us",
            "vld_used",
        ],
    );
    // Every request of Figure 9's updates: two writes per update on both
    // disks (the inode's block and the file's), and on the VLD a map
    // sector after each.
    let acc = rows(
        &doc,
        "accounting",
        &[
            "disk",
            "host",
            "system",
            "request",
            "requests",
            "data_sectors_per_request",
            "map_sectors_per_request",
            "total_us",
        ],
    );
    for system in ["uip-regular", "uip-vld"] {
        for request in ["inode block", "file block"] {
            let r = acc
                .iter()
                .find(|r| r["system"] == system && r["request"] == request)
                .unwrap_or_else(|| panic!("no accounting row for {system}'s {request}"));
            assert_eq!(r["data_sectors_per_request"].as_f64(), Some(8.0), "{r}");
            let maps = r["map_sectors_per_request"].as_f64().unwrap();
            assert_eq!(maps >= 1.0, system == "uip-vld", "{r}");
        }
    }
    rows(
        &doc,
        "host_sensitivity",
        &["host_us_per_request", "system", "latency_us"],
    );
    let phases = rows(&doc, "phases", &["disk", "system", "phase", "mb_per_s"]);
    assert_eq!(
        phases.len(),
        2 * 4 * 6,
        "six phases, four systems, two disks"
    );
    // The VLD's sequential read with the drive's own read-ahead, per disk.
    let ablation = rows(
        &doc,
        "phases_vld_read_ahead",
        &["disk", "read_ahead", "mb_per_s"],
    );
    assert_eq!(ablation.len(), 2);
    assert!(ablation.iter().all(|r| r["mb_per_s"].as_f64().is_some()));
    let t4 = rows(&doc, "ld_table4", &["system", "files_per_s", "file_bytes"]);
    for system in ["uip", "lld"] {
        // Both of LD Table 4's columns: 1 KB and 10 KB files.
        for bytes in [1024, 10240] {
            let r = t4
                .iter()
                .find(|r| r["system"] == system && r["file_bytes"] == bytes)
                .unwrap_or_else(|| panic!("no ld_table4 row for {system}, {bytes} B"));
            assert!(r["files_per_s"].as_f64().unwrap() > 0.0, "{r}");
        }
    }
    rows(&doc, "ld_table5", &["system", "phase", "kb_per_s"]);

    if font {
        let md = std::fs::read_to_string(out.join("BENCHMARKS.md")).unwrap();
        assert!(md.starts_with(keep.trim_end()), "{md}");
        assert!(md.contains("<!-- begin vld:") && md.contains("<!-- end vld -->"));
        assert!(md.contains("![vld-eq1](bench/vld-eq1.png)"), "{md}");
        assert!(out.join("bench/vld-eq1.png").exists());
    }
}
