//! Output of `ldfs bench fs`: every sample as JSON, medians as Markdown
//! tables (with ldfs/ext4 and ldfs/memfs ratios), and with `--out DIR` a
//! report, DIR/BENCHMARKS.md, with one PNG chart per workload in DIR/bench/
//! (bars per phase per target, grouped by phase, one panel per unit, as in
//! the papers' figures).
//!
//! Charts use plotters' bitmap backend with its pure-Rust `ab_glyph` text
//! renderer rather than the `ttf` feature: `ttf` goes through font-kit,
//! which links FreeType and fontconfig, while ab_glyph needs only a font
//! file, read at run time from Debian's fonts-dejavu-core (`FONT`). Nothing
//! new is needed to build ldfs; the font is needed only to write charts.

use std::fmt::Write as _;
use std::fs;
use std::path::Path;
use std::process::Command;

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::bench::fs::R;

/// The font the charts are drawn with (Debian: fonts-dejavu-core).
pub const FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";

pub struct WorkloadResult {
    pub key: String,
    pub title: String,
    pub source: String,
    /// Why the workload was not run, if it was not.
    pub skipped: Option<String>,
    /// (what, unit, higher is better).
    pub phases: Vec<(String, String, bool)>,
    /// [phase][target] -> the samples of every round that succeeded.
    pub samples: Vec<Vec<Vec<f64>>>,
    /// ldfs's engine counters over the workload, one list per round.
    pub ldfs_counters: Vec<Vec<(String, f64)>>,
    pub errors: Vec<String>,
}

pub struct Results {
    pub targets: Vec<String>,
    /// Per target: why it was skipped, if it was.
    pub skipped: Vec<Option<String>>,
    pub workloads: Vec<WorkloadResult>,
    pub rounds: usize,
    /// Rounds finished (reports are written after each).
    pub rounds_done: usize,
    pub description: String,
    pub machine: Machine,
    /// `--profile`: where the ldfs daemon's time went (and memfs's).
    pub profiles: Vec<super::profile::Profile>,
    /// ldfs-s3's upload figures, one per round of the large-file workload.
    pub uploads: Vec<super::s3::UploadSample>,
}

/// The machine a run was measured on.
/// The machine a run was made on, and its command, as a report shows them.
pub fn machine_table(m: &Machine) -> String {
    let mut md = String::from("| | |\n|---|---|\n");
    for (k, v) in [
        ("date", &m.date),
        ("machine", &m.uname),
        ("CPU", &m.cpu),
        ("memory", &m.memory),
        ("storage", &m.storage),
        ("load average (1, 5, 15 min) at start", &m.load_start),
        ("load average at end", &m.load_end),
    ] {
        let _ = writeln!(md, "| {k} | {} |", v.replace('|', "\\|"));
    }
    let _ = writeln!(md, "\nCommand:\n\n```sh\n{}\n```\n", m.command);
    md
}

pub struct Machine {
    pub uname: String,
    pub cpu: String,
    pub memory: String,
    pub storage: String,
    pub date: String,
    pub command: String,
    pub load_start: String,
    pub load_end: String,
}

fn output(cmd: &mut Command) -> String {
    cmd.output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

fn loadavg() -> String {
    fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

impl Machine {
    pub fn probe(dir: &Path) -> Machine {
        let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let model = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name"))
            .map(|l| l.trim_start_matches([' ', '\t', ':']).to_string())
            .unwrap_or_else(|| "unknown".into());
        let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
        let memory = fs::read_to_string("/proc/meminfo")
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .map(|kib| format!("{:.1} GiB", kib as f64 / (1 << 20) as f64))
            .unwrap_or_else(|| "unknown".into());
        let mount = output(
            Command::new("findmnt")
                .args(["-no", "SOURCE,FSTYPE,OPTIONS", "-T"])
                .arg(dir),
        );
        let source = mount.split_whitespace().next().unwrap_or("").to_string();
        let disk = if source.starts_with("/dev/") {
            output(
                Command::new("lsblk")
                    .args(["-dno", "NAME,SIZE,ROTA,MODEL"])
                    .arg(&source),
            )
        } else {
            String::new()
        };
        let storage = format!(
            "{} on {mount}{}",
            dir.display(),
            if disk.is_empty() {
                String::new()
            } else {
                format!(" (lsblk NAME SIZE ROTA MODEL: {disk})")
            }
        );
        let command = std::env::args()
            .map(|a| {
                if a.is_empty() || a.contains(|c: char| c.is_whitespace() || c == '\'') {
                    format!("'{}'", a.replace('\'', "'\\''"))
                } else {
                    a
                }
            })
            .collect::<Vec<_>>()
            .join(" ");
        Machine {
            uname: output(Command::new("uname").arg("-a")),
            cpu: format!("{model} ({cpus} CPUs)"),
            memory,
            storage,
            date: output(Command::new("date").args(["-u", "+%Y-%m-%d %H:%M UTC"])),
            command,
            load_start: loadavg(),
            load_end: String::new(),
        }
    }

    pub fn finish(&mut self) {
        self.load_end = loadavg();
    }
}

pub fn median(v: &[f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    Some(v[v.len() / 2])
}

fn json_str(s: &str) -> String {
    let mut o = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => o += "\\\"",
            '\\' => o += "\\\\",
            '\n' => o += "\\n",
            c if (c as u32) < 0x20 => {
                let _ = write!(o, "\\u{:04x}", c as u32);
            }
            c => o.push(c),
        }
    }
    o + "\""
}

/// A number as JSON: the shortest form that reads back as the same f64 (three decimals lost
/// the fast phases' seconds: `ldfs bench report` drew memfs's 66 us as 0).
fn json_num(x: Option<f64>) -> String {
    match x {
        Some(x) if x.is_finite() => format!("{x}"),
        _ => "null".into(),
    }
}

/// The machine as a JSON object (one line).
pub(crate) fn machine_json(m: &Machine) -> String {
    format!(
        "{{\"uname\": {}, \"cpu\": {}, \"memory\": {}, \"storage\": {}, \"date\": {}, \"command\": {}, \"load_start\": {}, \"load_end\": {}}}",
        json_str(&m.uname),
        json_str(&m.cpu),
        json_str(&m.memory),
        json_str(&m.storage),
        json_str(&m.date),
        json_str(&m.command),
        json_str(&m.load_start),
        json_str(&m.load_end)
    )
}

/// Every sample of a run, with its machine and what was skipped.
pub fn json(r: &Results) -> String {
    let mut j = String::from("{\n");
    let _ = writeln!(j, "  \"machine\": {},", machine_json(&r.machine));
    let _ = writeln!(j, "  \"description\": {},", json_str(&r.description));
    let _ = writeln!(
        j,
        "  \"rounds\": {}, \"rounds_done\": {},",
        r.rounds, r.rounds_done
    );
    let _ = writeln!(
        j,
        "  \"targets\": [{}],",
        r.targets
            .iter()
            .map(|t| json_str(t))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let skipped: Vec<String> = r
        .targets
        .iter()
        .zip(&r.skipped)
        .filter_map(|(t, s)| Some(format!("{}: {}", json_str(t), json_str(s.as_ref()?))))
        .collect();
    let _ = writeln!(j, "  \"skipped\": {{{}}},", skipped.join(", "));
    j += "  \"workloads\": [\n";
    let body: Vec<String> = r
        .workloads
        .iter()
        .map(|w| {
            let phases: Vec<String> = w
                .phases
                .iter()
                .zip(&w.samples)
                .map(|((what, unit, higher), s)| {
                    let samples: Vec<String> = s
                        .iter()
                        .map(|t| {
                            let v: Vec<String> = t.iter().map(|x| json_num(Some(*x))).collect();
                            format!("[{}]", v.join(", "))
                        })
                        .collect();
                    let medians: Vec<String> = s.iter().map(|t| json_num(median(t))).collect();
                    format!(
                        "        {{\"phase\": {}, \"unit\": {}, \"higher_is_better\": {higher}, \"samples\": [{}], \"median\": [{}]}}",
                        json_str(what),
                        json_str(unit),
                        samples.join(", "),
                        medians.join(", ")
                    )
                })
                .collect();
            let counters: Vec<String> = w
                .ldfs_counters
                .iter()
                .map(|round| {
                    let kv: Vec<String> = round
                        .iter()
                        .map(|(k, v)| format!("{}: {}", json_str(k), json_num(Some(*v))))
                        .collect();
                    format!("{{{}}}", kv.join(", "))
                })
                .collect();
            format!(
                "    {{\"workload\": {}, \"title\": {}, \"source\": {}, \"skipped\": {}, \"errors\": [{}], \"ldfs_counters\": [{}],\n      \"phases\": [\n{}\n      ]}}",
                json_str(&w.key),
                json_str(&w.title),
                json_str(&w.source),
                w.skipped.as_deref().map_or("null".into(), json_str),
                w.errors.iter().map(|e| json_str(e)).collect::<Vec<_>>().join(", "),
                counters.join(", "),
                phases.join(",\n")
            )
        })
        .collect();
    j += &body.join(",\n");
    j += "\n  ]";
    if !r.profiles.is_empty() {
        let p: Vec<String> = r
            .profiles
            .iter()
            .map(|p| super::profile::json(p, json_str))
            .collect();
        let _ = write!(j, ",\n  \"profiles\": [{}]", p.join(", "));
    }
    if !r.uploads.is_empty() {
        let u: Vec<String> = r
            .uploads
            .iter()
            .map(|u| {
                let split = match &u.split {
                    Ok(s) => format!(
                        "\"split\": {{\"upload_mb_s\": {}, \"after_fsync_mb_s\": {}, \"gateway_mb_s\": {}, \"ldfs_cpus\": {}, \"ceph_cpus\": {}}}",
                        json_num(Some(s.upload_mb_s)),
                        json_num(Some(s.after_fsync_mb_s)),
                        json_num(Some(s.gateway_mb_s)),
                        json_str(&s.ldfs_cpus),
                        json_str(&s.ceph_cpus)
                    ),
                    Err(why) => format!("\"split_skipped\": {}", json_str(why)),
                };
                let drain = match &u.drain {
                    Ok(d) => format!(
                        "\"drain\": {{\"bytes\": {}, \"drain_mb_s\": {}, \"gateway_mb_s\": {}}}",
                        d.bytes,
                        json_num(Some(d.drain_mb_s)),
                        json_num(Some(d.gateway_mb_s))
                    ),
                    Err(why) => format!("\"drain_skipped\": {}", json_str(why)),
                };
                format!(
                    "{{\"bytes\": {}, \"upload_mb_s\": {}, \"after_fsync_mb_s\": {}, \"gateway_mb_s\": {}, \"gateway_one_mb_s\": {}, \"segments_put\": {}, \"segment_bytes_put\": {}, \"object_bytes\": {}, \"in_flight\": {}, {split}, {drain}}}",
                    u.bytes,
                    json_num(Some(u.upload_mb_s)),
                    json_num(Some(u.after_fsync_mb_s)),
                    json_num(Some(u.gateway_mb_s)),
                    json_num(Some(u.gateway_one_mb_s)),
                    u.segments_put,
                    u.segment_bytes_put,
                    u.object_bytes,
                    u.in_flight
                )
            })
            .collect();
        let _ = write!(j, ",\n  \"s3_uploads\": [{}]", u.join(", "));
    }
    j += "\n}\n";
    j
}

/// Reads back what `json` wrote (`ldfs bench report` redraws a report from
/// it without measuring again).
pub fn from_json(text: &str) -> R<Results> {
    use serde_json::Value;
    let v: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    let s = |v: &Value| v.as_str().unwrap_or("").to_string();
    let list = |v: &Value, what: &str| -> R<Vec<Value>> {
        v.as_array()
            .cloned()
            .ok_or_else(|| format!("no {what} in the JSON"))
    };
    let m = &v["machine"];
    let targets: Vec<String> = list(&v["targets"], "targets")?.iter().map(s).collect();
    let skipped = targets
        .iter()
        .map(|t| {
            v["skipped"]
                .get(t)
                .and_then(Value::as_str)
                .map(String::from)
        })
        .collect();
    let mut workloads = Vec::new();
    for w in list(&v["workloads"], "workloads")? {
        let mut phases = Vec::new();
        let mut samples = Vec::new();
        for p in list(&w["phases"], "phases")? {
            phases.push((
                s(&p["phase"]),
                s(&p["unit"]),
                p["higher_is_better"].as_bool().unwrap_or(true),
            ));
            let per_target: Vec<Vec<f64>> = list(&p["samples"], "samples")?
                .iter()
                .map(|t| {
                    t.as_array()
                        .map(|a| a.iter().filter_map(Value::as_f64).collect())
                        .unwrap_or_default()
                })
                .collect();
            if per_target.len() != targets.len() {
                return Err(format!(
                    "{}: samples for {} targets",
                    s(&p["phase"]),
                    per_target.len()
                ));
            }
            samples.push(per_target);
        }
        let ldfs_counters = list(&w["ldfs_counters"], "ldfs_counters")?
            .iter()
            .map(|round| {
                round
                    .as_object()
                    .map(|o| {
                        o.iter()
                            .filter_map(|(k, v)| Some((k.clone(), v.as_f64()?)))
                            .collect()
                    })
                    .unwrap_or_default()
            })
            .collect();
        workloads.push(WorkloadResult {
            key: s(&w["workload"]),
            title: s(&w["title"]),
            source: s(&w["source"]),
            skipped: w["skipped"].as_str().map(String::from),
            phases,
            samples,
            ldfs_counters,
            errors: list(&w["errors"], "errors")?.iter().map(s).collect(),
        });
    }
    let profile = |p: &Value| {
        let pairs = |v: &Value| -> Vec<(String, f64)> {
            v.as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|e| Some((e[0].as_str()?.to_string(), e[1].as_f64()?)))
                        .collect()
                })
                .unwrap_or_default()
        };
        super::profile::Profile {
            target: s(&p["target"]),
            workload: s(&p["workload"]),
            samples: s(&p["samples"]),
            areas: pairs(&p["areas"]),
            top: pairs(&p["top"]),
        }
    };
    let profiles = v["profiles"]
        .as_array()
        .map(|a| a.iter().map(profile).collect())
        .unwrap_or_default();
    let uploads =
        v["s3_uploads"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|u| {
                        let n = |k: &str| u[k].as_u64().unwrap_or(0);
                        let f = |k: &str| u[k].as_f64().unwrap_or(f64::NAN);
                        super::s3::UploadSample {
                            bytes: n("bytes"),
                            upload_mb_s: f("upload_mb_s"),
                            after_fsync_mb_s: f("after_fsync_mb_s"),
                            gateway_mb_s: f("gateway_mb_s"),
                            gateway_one_mb_s: f("gateway_one_mb_s"),
                            segments_put: n("segments_put"),
                            segment_bytes_put: n("segment_bytes_put"),
                            object_bytes: n("object_bytes"),
                            in_flight: n("in_flight") as usize,
                            // Reports written before the split-CPU figures have neither.
                            split: match (&u["split"], u["split_skipped"].as_str()) {
                                (sp, _) if sp.is_object() => {
                                    let f = |k: &str| sp[k].as_f64().unwrap_or(f64::NAN);
                                    let t = |k: &str| sp[k].as_str().unwrap_or("").to_string();
                                    Ok(super::s3::SplitUpload {
                                        upload_mb_s: f("upload_mb_s"),
                                        after_fsync_mb_s: f("after_fsync_mb_s"),
                                        gateway_mb_s: f("gateway_mb_s"),
                                        ldfs_cpus: t("ldfs_cpus"),
                                        ceph_cpus: t("ceph_cpus"),
                                    })
                                }
                                (_, Some(why)) => Err(why.to_string()),
                                _ => {
                                    Err("not measured (a report from before the split-CPU figures)"
                                        .into())
                                }
                            },
                            drain: match (&u["drain"], u["drain_skipped"].as_str()) {
                                (d, _) if d.is_object() => {
                                    let f = |k: &str| d[k].as_f64().unwrap_or(f64::NAN);
                                    Ok(super::s3::DrainUpload {
                                        bytes: d["bytes"].as_u64().unwrap_or(0),
                                        drain_mb_s: f("drain_mb_s"),
                                        gateway_mb_s: f("gateway_mb_s"),
                                    })
                                }
                                (_, Some(why)) => Err(why.to_string()),
                                _ => Err("not measured (a report from before the catch-up figure)"
                                    .into()),
                            },
                        }
                    })
                    .collect()
            })
            .unwrap_or_default();
    Ok(Results {
        profiles,
        uploads,
        targets,
        skipped,
        workloads,
        rounds: v["rounds"].as_u64().unwrap_or(1) as usize,
        rounds_done: v["rounds_done"].as_u64().unwrap_or(1) as usize,
        description: s(&v["description"]),
        machine: Machine {
            uname: s(&m["uname"]),
            cpu: s(&m["cpu"]),
            memory: s(&m["memory"]),
            storage: s(&m["storage"]),
            date: s(&m["date"]),
            command: s(&m["command"]),
            load_start: s(&m["load_start"]),
            load_end: s(&m["load_end"]),
        },
    })
}

pub(crate) fn fmt_value(x: f64) -> String {
    if x > 0.0 && x < 1.0 {
        // Two significant digits, however small.
        let decimals = (-x.log10()).floor() as usize + 2;
        format!("{x:.decimals$}")
    } else if x >= 100.0 {
        format!("{x:.0}")
    } else if x >= 10.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.2}")
    }
}

/// A Markdown table: the first `left` columns left-aligned (names), the
/// rest right-aligned (numbers); an empty cell stays empty.
pub(crate) fn md_table(head: &[String], left: usize, rows: &[Vec<String>]) -> String {
    let mut md = String::from("|");
    for h in head {
        let _ = write!(md, " {h} |");
    }
    md += "\n|";
    for i in 0..head.len() {
        md += if i < left { "---|" } else { "---:|" };
    }
    md += "\n";
    for row in rows {
        md += "|";
        for c in row {
            if c.is_empty() {
                md += " |";
            } else {
                let _ = write!(md, " {c} |");
            }
        }
        md += "\n";
    }
    md
}

/// Medians as Markdown: one table per workload. With `charts`, each table
/// is preceded by its chart (`charts/KEY.png`).
pub fn markdown(r: &Results, charts: Option<&str>) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "Figures: {}; medians of {} round(s){}.",
        r.description,
        r.rounds_done,
        if r.rounds_done < r.rounds {
            format!(" ({} planned, the run is not finished)", r.rounds)
        } else {
            String::new()
        }
    );
    let s3 = r.targets.iter().any(|t| t == "ldfs-s3") && r.targets.iter().any(|t| t == "ldfs");
    let uring = ["ldfs-uring", "memfs-uring"]
        .iter()
        .all(|n| r.targets.iter().any(|t| t == n));
    // The ratio columns: (numerator, denominator) targets.
    let mut ratios = vec![("ldfs", "ext4"), ("ldfs", "memfs")];
    if uring {
        ratios.extend([("ldfs-uring", "ext4"), ("ldfs-uring", "memfs-uring")]);
    }
    // Issue 16: ldfs / memfs on each transport, lowest over the small-file,
    // metadata and big-directory phases (target >= 0.8).
    let mut ceiling_lowest: Vec<Option<(f64, String)>> = vec![None; ratios.len()];
    let _ = writeln!(
        md,
        "Ratios divide ldfs's median by ext4's and by memfs's (the in-memory FUSE ceiling){}{}; for units of time (s, ms, us) lower is better.",
        if uring {
            ", ldfs-uring's by ext4's and by memfs-uring's (the ceiling on the same transport)"
        } else {
            ""
        },
        if s3 {
            ", and ldfs-s3's (ldfs on an object store, served by its cache) by ldfs's"
        } else {
            ""
        }
    );
    // ldfs-s3 / ldfs over the small-file and metadata phases (issue 20: >= 0.9).
    let mut s3_lowest: Option<(f64, String)> = None;
    let mut s3_apart_lowest: Option<(f64, String)> = None;
    // And each round's ldfs-s3 / ldfs of those phases (the targets interleaved in each round, so
    // paired by round), shared and apart: phases of about a second move by a third from round
    // to round here, so the lowest of a few medians says little without them.
    let (mut s3_rounds, mut s3_apart_rounds) = (Vec::new(), Vec::new());
    for (t, s) in r.targets.iter().zip(&r.skipped) {
        if let Some(why) = s {
            let _ = writeln!(md, "\nTarget {t} skipped: {why}.");
        }
    }
    for w in &r.workloads {
        let _ = writeln!(md, "\n### {}\n\nFrom: {}.\n", w.title, w.source);
        if let Some(why) = &w.skipped {
            let _ = writeln!(md, "Skipped: {why}.");
            continue;
        }
        if let Some(dir) = charts {
            let _ = writeln!(md, "![{}]({dir}/{}.png)\n", w.key, w.key);
        }
        let mut head = vec!["phase".to_string(), "unit".to_string()];
        head.extend(r.targets.iter().cloned());
        head.extend(ratios.iter().map(|(a, b)| format!("{a} / {b}")));
        if s3 {
            head.push("ldfs-s3 / ldfs".to_string());
        }
        let mut rows = Vec::new();
        for ((what, unit, higher), s) in w.phases.iter().zip(&w.samples) {
            let higher = *higher;
            let meds: Vec<Option<f64>> = s.iter().map(|t| median(t)).collect();
            let mut row = vec![what.clone(), unit.clone()];
            // A phase run again with the gateway's CPU apart is ldfs's and ldfs-s3's only.
            let apart = what.ends_with(super::fs::APART);
            for ((m, skipped), name) in meds.iter().zip(&r.skipped).zip(&r.targets) {
                row.push(match (m, skipped) {
                    (Some(x), _) => fmt_value(*x),
                    (None, Some(_)) => "skipped".into(),
                    (None, None) if apart && name != "ldfs" && name != "ldfs-s3" => String::new(),
                    (None, None) => "failed".into(),
                });
            }
            let at = |name: &str| {
                r.targets
                    .iter()
                    .position(|t| t == name)
                    .and_then(|k| meds[k])
            };
            for (k, (num, den)) in ratios.iter().enumerate() {
                let ratio = match (at(num), at(den)) {
                    (Some(a), Some(e)) if e > 0.0 => Some(a / e),
                    _ => None,
                };
                if let (Some(x), true, "smallfiles" | "metadata" | "bigdir", true) =
                    (ratio, den.starts_with("memfs"), w.key.as_str(), higher)
                {
                    if ceiling_lowest[k].as_ref().is_none_or(|(l, _)| x < *l) {
                        ceiling_lowest[k] = Some((x, format!("{} {what}", w.key)));
                    }
                }
                row.push(ratio.map_or(String::new(), |x| format!("{x:.2}")));
            }
            if s3 {
                let ratio = match (at("ldfs-s3"), at("ldfs")) {
                    (Some(a), Some(e)) if e > 0.0 => Some(a / e),
                    _ => None,
                };
                if let (Some(x), "smallfiles" | "metadata", true) = (ratio, w.key.as_str(), higher)
                {
                    let (low, rounds) = if apart {
                        (&mut s3_apart_lowest, &mut s3_apart_rounds)
                    } else {
                        (&mut s3_lowest, &mut s3_rounds)
                    };
                    if low.as_ref().is_none_or(|(l, _)| x < *l) {
                        *low = Some((x, format!("{} {what}", w.key)));
                    }
                    rounds.extend(paired_ratios(&r.targets, s, "ldfs-s3", "ldfs"));
                }
                row.push(ratio.map_or(String::new(), |x| format!("{x:.2}")));
            }
            rows.push(row);
        }
        md += &md_table(&head, 2, &rows);
        for e in &w.errors {
            let first = e.lines().next().unwrap_or("");
            let _ = writeln!(md, "\nFailed: {first}");
        }
    }
    let lows: Vec<String> = ratios
        .iter()
        .zip(&ceiling_lowest)
        .filter_map(|((a, b), low)| {
            low.as_ref()
                .map(|(x, phase)| format!("{a} / {b} lowest {x:.2} ({phase})"))
        })
        .collect();
    if !lows.is_empty() {
        let _ = writeln!(
            md,
            "\nOn the small-file, metadata and big-directory phases: {}; issue 16's target is at least 0.8 on each transport.",
            lows.join("; ")
        );
    }
    if let Some((x, phase)) = &s3_lowest {
        let apart = s3_apart_lowest.as_ref().map_or(String::new(), |(y, p)| {
            format!(
                "; run again with the gateway's CPU apart (both targets on the same CPUs, the \
                 one-node gateway's work on the segments put ahead on the others): lowest \
                 {y:.2} ({p}){}",
                pooled(&s3_apart_rounds)
            )
        });
        let _ = writeln!(
            md,
            "\nldfs-s3 / ldfs on the small-file and metadata phases: lowest {x:.2} ({phase}){}{apart}; issue 20's target is at least 0.9.",
            pooled(&s3_rounds)
        );
    }
    md += &uploads_markdown(&r.uploads);
    let counted: Vec<&WorkloadResult> = r
        .workloads
        .iter()
        .filter(|w| !w.ldfs_counters.is_empty())
        .collect();
    if let Some(first) = counted.first() {
        let names: Vec<&str> = first.ldfs_counters[0]
            .iter()
            .map(|(k, _)| k.as_str())
            .collect();
        let _ = writeln!(
            md,
            "\n### ldfs engine counters per workload (median over rounds)\n"
        );
        let _ = writeln!(md, "| workload | {} |", names.join(" | "));
        let _ = writeln!(md, "|---|{}", "---:|".repeat(names.len()));
        for w in counted {
            let _ = write!(md, "| {} |", w.key);
            for k in &names {
                let v: Vec<f64> = w
                    .ldfs_counters
                    .iter()
                    .filter_map(|round| round.iter().find(|(n, _)| n == k).map(|(_, v)| *v))
                    .collect();
                let _ = write!(md, " {} |", median(&v).map_or("".into(), fmt_value));
            }
            md += "\n";
        }
    }
    md += &super::profile::markdown(&r.profiles);
    md
}

/// Round by round, `num`'s sample of a phase divided by `den`'s (`samples` by target, as
/// `targets`): none unless both ran every round the same (a round one of them failed would
/// pair the others wrongly).
fn paired_ratios(targets: &[String], samples: &[Vec<f64>], num: &str, den: &str) -> Vec<f64> {
    let of = |name: &str| targets.iter().position(|t| t == name).map(|k| &samples[k]);
    match (of(num), of(den)) {
        (Some(a), Some(e)) if a.len() == e.len() && e.iter().all(|&x| x > 0.0) => {
            a.iter().zip(e).map(|(x, y)| x / y).collect()
        }
        _ => Vec::new(),
    }
}

/// ", the geometric mean of the N per-round ratios G (LOW to HIGH)", or nothing for fewer than
/// two (one is the ratio of the medians).
fn pooled(ratios: &[f64]) -> String {
    if ratios.len() < 2 || ratios.iter().any(|&x| x <= 0.0) {
        return String::new();
    }
    let mean = (ratios.iter().map(|x| x.ln()).sum::<f64>() / ratios.len() as f64).exp();
    let low = ratios.iter().copied().fold(f64::INFINITY, f64::min);
    let high = ratios.iter().copied().fold(0.0, f64::max);
    format!(
        ", the geometric mean of the {} per-round ratios {mean:.2} ({low:.2} to {high:.2})",
        ratios.len()
    )
}

/// The median of `f` over `items` (not-a-number values left out) as a table cell; empty if none.
fn median_cell<T>(items: &[T], f: impl Fn(&T) -> f64) -> String {
    let v: Vec<f64> = items.iter().map(f).filter(|x| x.is_finite()).collect();
    median(&v).map_or("".into(), fmt_value)
}

/// ldfs-s3's upload figures (medians over rounds), if any were measured.
fn uploads_markdown(u: &[super::s3::UploadSample]) -> String {
    let Some(first) = u.first() else {
        return String::new();
    };
    let med = |f: &dyn Fn(&super::s3::UploadSample) -> f64| median_cell(u, f);
    let mut md = String::from("\n### ldfs-s3: upload throughput (large-file workload)\n\n");
    let _ = writeln!(
        md,
        "Issue 20's target: upload throughput at least 0.8x the gateway's own PUT throughput for objects of the segment size, measured in the same run with the same client (`S3Store`): {} KiB objects (the segment size), {} in flight (the uploader's). Medians of {} round(s), the large file of {} MiB.\n",
        first.object_bytes >> 10,
        first.in_flight,
        u.len(),
        first.bytes >> 20,
    );
    let drains: Vec<&super::s3::DrainUpload> =
        u.iter().filter_map(|s| s.drain.as_ref().ok()).collect();
    let mut rows = Vec::new();
    match drains.first() {
        Some(first_drain) => {
            let med_drain =
                |f: &dyn Fn(&super::s3::DrainUpload) -> f64| median_cell(&drains, |d| f(d));
            let _ = writeln!(
                md,
                "*Catching up*, the uploader's own throughput: {} MiB written sequentially (a file of its own; seconds of puts, so that the gateway's jitter and a put's latency at either end weigh little) with the run's gateway stopped (SIGSTOP to radosgw: it takes connections and answers nothing), so that no put completes before its return (the first puts' requests wait in its sockets); timed from the gateway's return until `ldfs sync --remote` returns, with nothing else running, against the gateway's PUT throughput measured right after for as many bytes ({} of {} round(s)).\n",
                first_drain.bytes >> 20,
                drains.len(),
                u.len()
            );
            rows.extend([
                vec![
                    "catching up: from the gateway's return until in the store".into(),
                    "MB/s".into(),
                    med_drain(&|d| d.drain_mb_s),
                ],
                vec![
                    format!(
                        "catching up: gateway PUT right after, {} in flight",
                        first.in_flight
                    ),
                    "MB/s".into(),
                    med_drain(&|d| d.gateway_mb_s),
                ],
                vec![
                    "catching up: ratio upload / gateway PUT".into(),
                    "".into(),
                    med_drain(&|d| d.ratio()),
                ],
            ]);
        }
        None => {
            let why = u
                .iter()
                .find_map(|s| s.drain.as_ref().err())
                .map_or("", String::as_str);
            let _ = writeln!(
                md,
                "The catch-up figure (the uploader's own throughput) was not measured: {why}.\n"
            );
        }
    }
    let _ = writeln!(
        md,
        "*Write until in the store*: the large-file workload's sequential write, timed from its first write until `ldfs sync --remote` returns (everything in the store), the puts running beside the write; on one machine the write and its cache device share the CPU and the disk with the gateway and its OSD, which a gateway on other machines does not.\n"
    );
    rows.extend([
        vec![
            "upload: write until in the store".into(),
            "MB/s".into(),
            med(&|s| s.upload_mb_s),
        ],
        vec![
            "of it, from the fsync's return to sync --remote's".into(),
            "MB/s".into(),
            med(&|s| s.after_fsync_mb_s),
        ],
        vec![
            format!("gateway PUT, same client, {} in flight", first.in_flight),
            "MB/s".into(),
            med(&|s| s.gateway_mb_s),
        ],
        vec![
            "gateway PUT, one at a time".into(),
            "MB/s".into(),
            med(&|s| s.gateway_one_mb_s),
        ],
        vec![
            "ratio upload / gateway PUT".into(),
            "".into(),
            med(&|s| s.ratio()),
        ],
        vec![
            "segment objects put".into(),
            "".into(),
            med(&|s| s.segments_put as f64),
        ],
        vec![
            "bytes put / bytes written".into(),
            "".into(),
            med(&|s| s.segment_bytes_put as f64 / s.bytes as f64),
        ],
    ]);
    let splits: Vec<&super::s3::SplitUpload> =
        u.iter().filter_map(|s| s.split.as_ref().ok()).collect();
    match splits.first() {
        Some(first_split) => {
            let med_split =
                |f: &dyn Fn(&super::s3::SplitUpload) -> f64| median_cell(&splits, |s| f(s));
            let _ = writeln!(
                md,
                "Two measurements of the write until in the store. *Shared cores*: as the machine runs them, the Ceph daemons, the ldfs daemon and the writer on the same cores (with whatever else runs), so the ratio also measures who gets the CPU: radosgw and its OSD spend CPU on every MB put. *Split CPUs*: the same write (a file of its own) and the same PUT baseline again with the gateway's CPU apart from ldfs's: every thread of the Ceph daemons (ceph-mon, ceph-mgr, ceph-osd, radosgw) on CPU {} and every thread of the ldfs daemon and of the benchmark (the writer, the PUT client) on CPU {}, the affinities restored after; that ratio compares the uploader with the gateway when neither takes the other's CPU ({} of {} round(s)).\n",
                first_split.ceph_cpus,
                first_split.ldfs_cpus,
                splits.len(),
                u.len()
            );
            rows.extend([
                vec![
                    "split CPUs: upload, write until in the store".into(),
                    "MB/s".into(),
                    med_split(&|s| s.upload_mb_s),
                ],
                vec![
                    "split CPUs: of it, from the fsync's return to sync --remote's".into(),
                    "MB/s".into(),
                    med_split(&|s| s.after_fsync_mb_s),
                ],
                vec![
                    format!(
                        "split CPUs: gateway PUT, same client, {} in flight",
                        first.in_flight
                    ),
                    "MB/s".into(),
                    med_split(&|s| s.gateway_mb_s),
                ],
                vec![
                    "split CPUs: ratio upload / gateway PUT".into(),
                    "".into(),
                    med_split(&|s| s.ratio()),
                ],
            ]);
        }
        None => {
            let why = u
                .iter()
                .find_map(|s| s.split.as_ref().err())
                .map_or("", String::as_str);
            let _ = writeln!(
                md,
                "These are shared-cores figures: the Ceph daemons, the ldfs daemon and the writer on the same cores. The split-CPU figures (the gateway's CPU apart from ldfs's) were not measured: {why}.\n"
            );
        }
    }
    md += &md_table(&["figure".into(), "unit".into(), "median".into()], 2, &rows);
    md
}

/// Writes `out/BENCHMARKS.md` and `out/bench/KEY.png`.
pub fn write_report(r: &Results, out: &Path, note: Option<&str>) -> R<()> {
    let charts = out.join("bench");
    fs::create_dir_all(&charts).map_err(|e| format!("{}: {e}", charts.display()))?;
    let drawn = match load_font() {
        Ok(()) => {
            for w in r.workloads.iter().filter(|w| w.skipped.is_none()) {
                let path = charts.join(format!("{}.png", w.key));
                chart(r, w, &path).map_err(|e| format!("{}: {e}", path.display()))?;
            }
            true
        }
        Err(e) => {
            eprintln!("bench fs: no charts: {e}");
            false
        }
    };
    let m = &r.machine;
    let mut md = String::from("# ldfs benchmarks\n\n");
    md += "Written by `ldfs bench fs --out` (see README, Benchmarks); do not edit by hand, run it again.\n\n";
    md += &machine_table(m);
    if let Some(n) = note {
        let _ = writeln!(md, "{n}\n");
    }
    md += "## Results\n\n";
    md += &markdown(r, drawn.then_some("bench"));
    let path = out.join("BENCHMARKS.md");
    // Sections other benchmarks wrote into the file (`bench vld`) stay.
    let old = fs::read_to_string(&path).unwrap_or_default();
    for (_, text) in sections(&old) {
        md += "\n";
        md += text;
        md += "\n";
    }
    fs::write(&path, md).map_err(|e| format!("{}: {e}", path.display()))?;
    eprintln!("bench fs: wrote {}", path.display());
    Ok(())
}

/// The first line of a section another benchmark owns in BENCHMARKS.md.
fn section_begin(key: &str) -> String {
    format!("<!-- begin {key}: written by `ldfs bench {key} --out`; run it again, do not edit -->")
}

fn section_end(key: &str) -> String {
    format!("<!-- end {key} -->")
}

/// The sections of `text` as (key, text from its begin line through its
/// end line), in order.
fn sections(text: &str) -> Vec<(String, &str)> {
    let mut found = Vec::new();
    let mut rest = text;
    let mut base = 0;
    while let Some(at) = rest.find("<!-- begin ") {
        let start = base + at;
        let after = &text[start + "<!-- begin ".len()..];
        let Some(key) = after.split(':').next().map(str::to_string) else {
            break;
        };
        let end_mark = section_end(&key);
        let Some(end) = text[start..].find(&end_mark) else {
            break;
        };
        let stop = start + end + end_mark.len();
        found.push((key, &text[start..stop]));
        base = stop;
        rest = &text[stop..];
    }
    found
}

/// Writes (or replaces) the section `key` of `out/BENCHMARKS.md`, keeping
/// the rest of the file; `bench fs --out`, which rewrites the file, keeps
/// it too.
pub(crate) fn write_section(out: &Path, key: &str, body: &str) -> R<()> {
    fs::create_dir_all(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let path = out.join("BENCHMARKS.md");
    let old = fs::read_to_string(&path).unwrap_or_else(|_| "# ldfs benchmarks\n".to_string());
    let section = format!(
        "{}\n{}\n{}",
        section_begin(key),
        body.trim_end(),
        section_end(key)
    );
    let text = match sections(&old).into_iter().find(|(k, _)| k == key) {
        Some((_, span)) => old.replacen(span, &section, 1),
        None => format!("{}\n\n{section}\n", old.trim_end()),
    };
    fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
    eprintln!("bench {key}: wrote its section of {}", path.display());
    Ok(())
}

pub(crate) fn load_font() -> R<()> {
    if !Path::new(FONT).exists() {
        crate::bench::fs::install(&["fonts-dejavu-core"], "the charts")?;
    }
    let bytes = fs::read(FONT).map_err(|e| format!("{FONT}: {e}"))?;
    // Registered once per process; plotters keeps it for the whole run.
    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
        .map_err(|_| format!("{FONT} is not a font plotters can read"))
}

/// The color of target `i`, the same in every chart.
pub(crate) fn color(i: usize) -> RGBColor {
    const PALETTE: [RGBColor; 8] = [
        RGBColor(0xd6, 0x27, 0x28),
        RGBColor(0x1f, 0x77, 0xb4),
        RGBColor(0x2c, 0xa0, 0x2c),
        RGBColor(0xff, 0x7f, 0x0e),
        RGBColor(0x94, 0x67, 0xbd),
        RGBColor(0x8c, 0x56, 0x4b),
        RGBColor(0x7f, 0x7f, 0x7f),
        RGBColor(0x17, 0xbe, 0xcf),
    ];
    PALETTE[i % PALETTE.len()]
}

/// One chart: a panel per unit; in each, a group of bars per phase, one bar
/// per target (its median), as in the papers' figures. The y axes are
/// logarithmic: the memory ceilings are orders of magnitude above the
/// storage targets, which a linear axis would flatten to nothing.
fn chart(r: &Results, w: &WorkloadResult, path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let shown: Vec<usize> = (0..r.targets.len())
        .filter(|&i| r.skipped[i].is_none())
        .collect();
    let series: Vec<(String, usize)> = shown.iter().map(|&i| (r.targets[i].clone(), i)).collect();
    let values: Vec<Vec<Option<f64>>> = w
        .samples
        .iter()
        .map(|s| shown.iter().map(|&i| median(&s[i])).collect())
        .collect();
    bar_chart(&w.title, &series, &w.phases, &values, path)
}

/// A bar chart: a panel per unit; in each, a group of bars per phase, one
/// bar per series (name, color index), `values[phase][series]`; log y axes.
pub(crate) fn bar_chart(
    title_text: &str,
    series: &[(String, usize)],
    all_phases: &[(String, String, bool)],
    values: &[Vec<Option<f64>>],
    path: &Path,
) -> Result<(), Box<dyn std::error::Error>> {
    let mut units: Vec<&str> = Vec::new();
    for (_, u, _) in all_phases {
        if !units.contains(&u.as_str()) {
            units.push(u);
        }
    }
    let (width_px, panel_h) = (1200u32, 400u32);
    let root =
        BitMapBackend::new(path, (width_px, 70 + panel_h * units.len() as u32)).into_drawing_area();
    root.fill(&WHITE)?;
    let (title, body) = root.split_vertically(70);
    title.draw(&Text::new(
        title_text.to_string(),
        (20, 12),
        ("sans-serif", 24).into_font().color(&BLACK),
    ))?;
    // The legend, once, under the title: the series in bar order, each as
    // wide as its name.
    let mut x = 20;
    for (name, ci) in series {
        title.draw(&Rectangle::new(
            [(x, 46), (x + 14, 60)],
            color(*ci).filled(),
        ))?;
        title.draw(&Text::new(
            name.clone(),
            (x + 20, 45),
            ("sans-serif", 16).into_font().color(&BLACK),
        ))?;
        x += 40 + 9 * name.chars().count() as i32;
    }
    let panels = body.split_evenly((units.len(), 1));
    for (panel, unit) in panels.iter().zip(&units) {
        let phases: Vec<&(String, String, bool)> =
            all_phases.iter().filter(|p| p.1 == *unit).collect();
        let meds: Vec<&Vec<Option<f64>>> = all_phases
            .iter()
            .zip(values)
            .filter(|(p, _)| p.1 == *unit)
            .map(|(_, v)| v)
            .collect();
        let values: Vec<f64> = meds
            .iter()
            .flat_map(|m| m.iter())
            .flatten()
            .copied()
            .filter(|v| *v > 0.0)
            .collect();
        let max = values.iter().fold(1e-9f64, |a, &b| a.max(b));
        let min = values.iter().fold(max, |a, &b| a.min(b));
        let top = 10f64.powf((max * 1.5).log10().ceil());
        let low = 10f64.powf((min / 1.5).log10().floor()).min(top / 10.0);
        let n = phases.len();
        let better = if phases[0].2 {
            "higher is better"
        } else {
            "lower is better"
        };
        let mut c = ChartBuilder::on(panel)
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(80)
            .caption(format!("{unit}, {better} (log scale)"), ("sans-serif", 18))
            .build_cartesian_2d(0.0..n as f64, (low..top).log_scale())?;
        c.configure_mesh()
            .disable_x_mesh()
            .x_labels(0)
            .y_label_formatter(&|v| fmt_value(*v))
            .y_label_style(("sans-serif", 14))
            .draw()?;
        // Phase names under their groups, in the root's (pixel) coordinates.
        for (i, p) in phases.iter().enumerate() {
            let (x, y) = c.backend_coord(&(i as f64 + 0.5, low));
            root.draw(&Text::new(
                p.0.clone(),
                (x, y + 8),
                ("sans-serif", 14)
                    .into_font()
                    .color(&BLACK)
                    .pos(Pos::new(HPos::Center, VPos::Top)),
            ))?;
        }
        let width = 0.8 / series.len().max(1) as f64;
        for (slot, (_, ci)) in series.iter().enumerate() {
            let bars: Vec<Rectangle<(f64, f64)>> = meds
                .iter()
                .enumerate()
                .filter_map(|(p, m)| {
                    let v = m[slot]?;
                    let x0 = p as f64 + 0.1 + slot as f64 * width;
                    Some(Rectangle::new(
                        [(x0, low), (x0 + width * 0.9, v.max(low))],
                        color(*ci).filled(),
                    ))
                })
                .collect();
            c.draw_series(bars)?;
        }
    }
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn results() -> Results {
        let phases = vec![
            ("create".to_string(), "files/s".to_string(), true),
            ("read".to_string(), "files/s".to_string(), true),
            ("p99".to_string(), "us".to_string(), false),
        ];
        let samples = vec![
            vec![vec![2500.0, 2600.0], vec![3700.0], vec![], vec![150_000.0]],
            vec![vec![8000.0], vec![5000.0], vec![], vec![200_000.0]],
            vec![vec![400.0], vec![650.0], vec![], vec![0.9]],
        ];
        Results {
            targets: ["ldfs", "ext4", "xfs", "tmpfs"].map(String::from).to_vec(),
            skipped: vec![None, None, Some("no mkfs.xfs".into()), None],
            workloads: vec![WorkloadResult {
                key: "smallfiles".into(),
                title: "small \"files\"".into(),
                source: "Sprite LFS".into(),
                skipped: None,
                phases,
                samples,
                ldfs_counters: vec![vec![("device flushes".into(), 2.0)]],
                errors: vec!["memfs: boom\nmore".into()],
            }],
            rounds: 2,
            rounds_done: 2,
            description: "test".into(),
            machine: Machine::probe(Path::new("/")),
            profiles: vec![
                super::super::profile::summarize(
                    "ldfs",
                    "smallfiles",
                    "2K".into(),
                    &[
                        ("[k] fuse_dev_do_read".into(), 60.0),
                        ("[.] malloc".into(), 40.0),
                    ],
                ),
                super::super::profile::summarize(
                    "memfs",
                    "smallfiles",
                    "1K".into(),
                    &[("[k] fuse_dev_do_read".into(), 100.0)],
                ),
            ],
            uploads: Vec::new(),
        }
    }

    /// [`results`] with ldfs-s3 as its second target and a create phase run again with the
    /// gateway's CPU apart (its samples are the test's).
    fn results_with_s3_apart() -> Results {
        let mut r = results();
        r.targets[1] = "ldfs-s3".into();
        r.workloads[0].phases.push((
            format!("create{}", super::super::fs::APART),
            "files/s".into(),
            true,
        ));
        r
    }

    #[test]
    fn ldfs_s3_against_ldfs_is_also_pooled_round_by_round() {
        let mut r = results_with_s3_apart();
        r.rounds = 3;
        r.rounds_done = 3;
        r.workloads[0].samples = vec![
            vec![
                vec![1000.0; 3],
                vec![900.0, 1100.0, 800.0],
                vec![],
                vec![5.0; 3],
            ],
            vec![
                vec![2000.0; 3],
                vec![2000.0, 1000.0, 2000.0],
                vec![],
                vec![5.0; 3],
            ],
            // A time (lower is better): never pooled.
            vec![vec![400.0; 3], vec![4000.0; 3], vec![], vec![1.0; 3]],
            vec![vec![1000.0; 3], vec![500.0, 1000.0, 2000.0], vec![], vec![]],
        ];
        let md = markdown(&r, None);
        // Shared: 0.9, 1.1, 0.8, 1.0, 0.5, 1.0; apart 0.5, 1.0, 2.0.
        assert!(
            md.contains(
                "lowest 0.90 (smallfiles create), the geometric mean of the 6 per-round ratios \
                 0.86 (0.50 to 1.10); run again"
            ),
            "{md}"
        );
        assert!(
            md.contains(
                "(smallfiles create, gateway's CPU apart), the geometric mean of the 3 per-round \
                 ratios 1.00 (0.50 to 2.00); issue 20's"
            ),
            "{md}"
        );
        // A round ldfs-s3 lacks (failed) pairs none of that phase's rounds.
        r.workloads[0].samples[1][1].pop();
        let md = markdown(&r, None);
        assert!(
            md.contains("the geometric mean of the 3 per-round ratios 0.93 (0.80 to 1.10); run"),
            "{md}"
        );
    }

    #[test]
    fn phases_with_the_gateways_cpu_apart_are_ldfs_and_ldfs_s3s_with_a_lowest_of_their_own() {
        let mut r = results_with_s3_apart();
        // ldfs 2000, ldfs-s3 1900 (0.95); ext4 and tmpfs do not run it.
        r.workloads[0]
            .samples
            .push(vec![vec![2000.0], vec![1900.0], vec![], vec![]]);
        let md = markdown(&r, None);
        assert!(
            md.contains(
                "| create, gateway's CPU apart | files/s | 2000 | 1900 | skipped | | | | 0.95 |"
            ),
            "{md}"
        );
        // The shared phases' lowest (read: 5000 / 8000), then the apart ones'.
        assert!(
            md.contains("lowest 0.62 (smallfiles read); run again with the gateway's CPU apart"),
            "{md}"
        );
        assert!(
            md.contains("lowest 0.95 (smallfiles create, gateway's CPU apart); issue 20's target"),
            "{md}"
        );
        // A target that should have run it and has no value failed.
        r.workloads[0].samples[3][1].clear();
        let md = markdown(&r, None);
        assert!(
            md.contains("| create, gateway's CPU apart | files/s | 2000 | failed | skipped | | |"),
            "{md}"
        );
    }

    #[test]
    fn each_transport_is_divided_by_its_own_ceiling() {
        let mut r = results();
        r.targets = ["ldfs", "ldfs-uring", "memfs", "memfs-uring"]
            .map(String::from)
            .to_vec();
        r.skipped = vec![None; 4];
        // create: ldfs 1000 / memfs 2000, ldfs-uring 3000 / memfs-uring 4000;
        // read: 900 / 1000 and 2000 / 5000 (the lowest over the transport).
        r.workloads[0].samples = vec![
            vec![vec![1000.0], vec![3000.0], vec![2000.0], vec![4000.0]],
            vec![vec![900.0], vec![2000.0], vec![1000.0], vec![5000.0]],
            vec![vec![400.0], vec![300.0], vec![100.0], vec![50.0]],
        ];
        let md = markdown(&r, None);
        assert!(
            md.contains("| phase | unit | ldfs | ldfs-uring | memfs | memfs-uring | ldfs / ext4 | ldfs / memfs | ldfs-uring / ext4 | ldfs-uring / memfs-uring |"),
            "{md}"
        );
        assert!(
            md.contains("| create | files/s | 1000 | 3000 | 2000 | 4000 | | 0.50 | | 0.75 |"),
            "{md}"
        );
        // A time (lower is better) is divided too, but never counts as the lowest.
        assert!(
            md.contains("ldfs / memfs lowest 0.50 (smallfiles create); ldfs-uring / memfs-uring lowest 0.40 (smallfiles read); issue 16's target is at least 0.8"),
            "{md}"
        );
        // Without the io_uring pair there are only the two columns.
        let md = markdown(&results(), None);
        assert!(!md.contains("ldfs-uring / memfs-uring"), "{md}");
    }

    #[test]
    fn the_s3_column_ratio_and_uploads() {
        let mut r = results();
        r.targets[1] = "ldfs-s3".into();
        let sample = |up: f64| super::super::s3::UploadSample {
            bytes: 32 << 20,
            upload_mb_s: up,
            after_fsync_mb_s: 2.0 * up,
            gateway_mb_s: 100.0,
            gateway_one_mb_s: 40.0,
            segments_put: 17,
            segment_bytes_put: 34 << 20,
            object_bytes: 2 << 20,
            in_flight: 4,
            split: Ok(super::super::s3::SplitUpload {
                upload_mb_s: up + 60.0,
                after_fsync_mb_s: up,
                gateway_mb_s: 160.0,
                ldfs_cpus: "0".into(),
                ceph_cpus: "1".into(),
            }),
            drain: Ok(super::super::s3::DrainUpload {
                bytes: 512 << 20,
                drain_mb_s: up + 40.0,
                gateway_mb_s: 125.0,
            }),
        };
        r.uploads = vec![sample(50.0), sample(90.0), sample(70.0)];
        let md = markdown(&r, None);
        // create: 3700 / 2600; read: 5000 / 8000, the lowest.
        assert!(
            md.contains("| create | files/s | 2600 | 3700 | skipped | 150000 | | | 1.42 |"),
            "{md}"
        );
        assert!(
            md.contains("lowest 0.62 (smallfiles read); issue 20's target is at least 0.9"),
            "{md}"
        );
        assert!(
            md.contains("| upload: write until in the store | MB/s | 70.0 |"),
            "{md}"
        );
        assert!(
            md.contains("| ratio upload / gateway PUT | | 0.70 |"),
            "{md}"
        );
        assert!(
            md.contains("| bytes put / bytes written | | 1.06 |"),
            "{md}"
        );
        assert!(
            md.contains("2048 KiB objects (the segment size), 4 in flight"),
            "{md}"
        );
        // The split-CPU rows: upload 110, 150, 130; ratio against 160: 0.81.
        assert!(
            md.contains("| split CPUs: upload, write until in the store | MB/s | 130 |"),
            "{md}"
        );
        assert!(
            md.contains("| split CPUs: ratio upload / gateway PUT | | 0.81 |"),
            "{md}"
        );
        assert!(
            md.contains("Ceph daemons (ceph-mon, ceph-mgr, ceph-osd, radosgw) on CPU 1 and every thread of the ldfs daemon and of the benchmark (the writer, the PUT client) on CPU 0"),
            "{md}"
        );
        assert!(
            md.contains(
                "*Catching up*, the uploader's own throughput: 512 MiB written sequentially"
            ),
            "{md}"
        );
        // The catch-up rows: 90, 130, 110; ratio against 125: 0.88.
        assert!(
            md.contains(
                "| catching up: from the gateway's return until in the store | MB/s | 110 |"
            ),
            "{md}"
        );
        assert!(
            md.contains("| catching up: ratio upload / gateway PUT | | 0.88 |"),
            "{md}"
        );
        let j = json(&r);
        let back = from_json(&j).unwrap();
        assert_eq!(back.uploads, r.uploads);
        assert_eq!(json(&back), j);
        // Not measured (a gateway from the environment): said, with why, no catch-up rows.
        for s in &mut r.uploads {
            s.drain = Err("no radosgw of this run's cluster to stop".into());
        }
        let md = markdown(&r, None);
        assert!(
            md.contains("The catch-up figure (the uploader's own throughput) was not measured: no radosgw of this run's cluster to stop."),
            "{md}"
        );
        assert!(!md.contains("| catching up"), "{md}");
        assert_eq!(from_json(&json(&r)).unwrap().uploads, r.uploads);
        // Not measured (one CPU): said, with why, and no split rows; the reason round-trips.
        for s in &mut r.uploads {
            s.split = Err("the benchmark may run on 1 CPU(s): nothing to split".into());
        }
        let md = markdown(&r, None);
        assert!(
            md.contains("were not measured: the benchmark may run on 1 CPU(s): nothing to split."),
            "{md}"
        );
        assert!(!md.contains("| split CPUs"), "{md}");
        let j = json(&r);
        assert_eq!(from_json(&j).unwrap().uploads, r.uploads);
        // Without ldfs-s3 there is no column and no section.
        let md = markdown(&results(), None);
        assert!(!md.contains("ldfs-s3") && !md.contains("upload throughput"));
    }

    #[test]
    fn sections_are_replaced_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("BENCHMARKS.md");
        write_section(dir.path(), "vld", "## first\n").unwrap();
        let text = fs::read_to_string(&path).unwrap();
        assert!(
            text.starts_with("# ldfs benchmarks\n\n<!-- begin vld:"),
            "{text}"
        );
        write_section(dir.path(), "other", "## other\n").unwrap();
        write_section(dir.path(), "vld", "## second\n").unwrap();
        let text = fs::read_to_string(&path).unwrap();
        assert!(
            !text.contains("## first") && text.contains("## second"),
            "{text}"
        );
        let found: Vec<String> = sections(&text).into_iter().map(|(k, _)| k).collect();
        assert_eq!(found, ["vld", "other"]);
        // `bench fs --out` rewrites the file and keeps both sections.
        let mut r = results();
        r.workloads[0].errors.clear();
        write_report(&r, dir.path(), None).unwrap();
        let text = fs::read_to_string(&path).unwrap();
        assert!(text.contains("## Results") && text.contains("## second"));
        assert!(text.contains("## other"), "{text}");
        assert_eq!(sections(&text).len(), 2);
    }

    #[test]
    fn tables_json_and_chart() {
        let r = results();
        let md = markdown(&r, None);
        assert!(md.contains("| create | files/s | 2600 | 3700 | skipped | 150000 | 0.70 | |"));
        assert!(md.contains("Target xfs skipped: no mkfs.xfs."));
        assert!(md.contains("Failed: memfs: boom\n"));
        let j = json(&r);
        assert!(j.contains("\"title\": \"small \\\"files\\\"\""));
        assert!(j.contains("\"samples\": [[2500, 2600], [3700], [], [150000]]"));
        assert!(j.contains("\"median\": [2600, 3700, null, 150000]"));
        assert_eq!(json(&from_json(&j).unwrap()), j);
        // Read back, it draws the same report: small values (seconds of a fast phase) and the
        // counters' order kept.
        let mut r = results();
        r.workloads[0].samples[2][3] = vec![0.000066, 0.000075];
        r.workloads[0].ldfs_counters = vec![vec![
            ("partial segments written".into(), 87.0),
            ("device flushes".into(), 2.0),
        ]];
        let md = markdown(&r, None);
        assert!(
            md.contains("| p99 | us | 400 | 650 | skipped | 0.000075 |"),
            "{md}"
        );
        assert_eq!(markdown(&from_json(&json(&r)).unwrap(), None), md);
        assert!(j.contains("\"profiles\": [{\"target\": \"ldfs\""), "{j}");
        assert!(md.contains("### Where the daemons' time goes"), "{md}");
        assert!(
            md.contains(
                "| kernel: FUSE (requests, copies to and from the daemon) | 60.0% | 100.0% |"
            ),
            "{md}"
        );
        assert!(md.contains("| `[.] malloc` | 40.0% |"), "{md}");
        assert_eq!(fmt_value(0.0012), "0.0012");
        assert_eq!(fmt_value(0.5), "0.50");
        if Path::new(FONT).exists() {
            load_font().unwrap();
            let dir = tempfile::tempdir().unwrap();
            let png = dir.path().join("smallfiles.png");
            chart(&r, &r.workloads[0], &png).unwrap();
            assert!(fs::metadata(&png).unwrap().len() > 1000);
        }
    }
}
