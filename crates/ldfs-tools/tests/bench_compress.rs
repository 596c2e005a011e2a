//! `ldfs bench compress` at its smallest (issue 17): the command writes and
//! reads back a source tree and random data with each setting, prints the
//! figures and the comparison with the LD paper, and with `--out` writes
//! its own section of BENCHMARKS.md, leaving the rest alone.

mod common;

use common::{ldfs, Succeeds};

/// The figures of one printed line: (write, read, live/logical, data ratio).
fn figures(stdout: &str, set: &str, setting: &str) -> (f64, f64, f64, Option<f64>) {
    let line = stdout
        .lines()
        .find(|l| l.starts_with(set) && l[set.len()..].trim_start().starts_with(setting))
        .unwrap_or_else(|| panic!("no {set} {setting} line in:\n{stdout}"));
    let nums: Vec<f64> = line
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    (nums[0], nums[1], nums[2], nums.get(3).copied())
}

#[test]
fn bench_compress_smallest_run() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("docs");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("BENCHMARKS.md"), "# ldfs benchmarks\n\nkept\n").unwrap();
    for memory in [false, true] {
        let mut cmd = ldfs();
        cmd.args(["bench", "compress", "--source-size", "2M", "--rounds", "1"])
            .arg("--dir")
            .arg(dir.path())
            .arg("--out")
            .arg(&out);
        if memory {
            cmd.arg("--memory");
        }
        let o = cmd.succeeds();
        let text = String::from_utf8_lossy(&o.stdout).to_string();
        for set in ["source tree", "random data"] {
            for setting in ["off", "lz4", "zstd"] {
                let (w, r, live, data) = figures(&text, set, setting);
                assert!(w > 0.0 && r > 0.0, "{set} {setting}: {text}");
                // Off, or random data: every byte stored, and metadata.
                if setting == "off" || set == "random data" {
                    assert!(live > 0.99, "{set} {setting}: live/logical {live}");
                } else {
                    assert!(live < 0.8, "{set} {setting}: live/logical {live}");
                }
                assert_eq!(data.is_some(), setting != "off", "{set} {setting}");
                if let Some(d) = data {
                    if set == "random data" {
                        assert!(d > 0.99, "random data compressed: {d}");
                    } else {
                        assert!(d < 0.7, "source tree stored at {d} with {setting}");
                    }
                }
            }
            assert!(
                text.contains(&format!("{set}, zstd: write throughput")),
                "{text}"
            );
        }
        assert!(text.contains("the LD paper"), "{text}");
        // No image is left behind.
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().ends_with(".img"))
            .collect();
        assert!(left.is_empty());
    }
    let md = std::fs::read_to_string(out.join("BENCHMARKS.md")).unwrap();
    assert!(md.contains("kept"), "{md}");
    assert_eq!(md.matches("<!-- begin compress").count(), 1, "{md}");
    assert!(md.contains("### source tree") && md.contains("### random data"));
    assert!(md.contains("within ~21%"), "{md}");
}
