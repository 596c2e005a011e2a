//! `ldfs bench fs --profile`: where the ldfs daemon's time goes during one
//! workload (issue 16 asks the report to say it). `perf record` samples the
//! daemon's threads (user and kernel) while the workload runs on the
//! `ldfs` target in the first round; `perf report` gives each symbol's
//! share, and the report groups them by layer: the kernel's FUSE code, its
//! scheduler (a request wakes a daemon thread, a reply wakes the caller),
//! fuser and ldfs's own adapter, the fs layer, the log engine, the
//! allocator. Without `perf` on the machine the run says so and goes on.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::bench::fs::R;

/// What one recording found.
#[derive(Clone, Debug, Default)]
pub struct Profile {
    pub target: String,
    pub workload: String,
    /// `perf report`'s own count, as it prints it ("12K").
    pub samples: String,
    /// (area, percent of the daemon's samples), largest first.
    pub areas: Vec<(String, f64)>,
    /// (symbol, percent), largest first.
    pub top: Vec<(String, f64)>,
}

/// A `perf record` running on a daemon.
pub struct Recording {
    perf: Child,
    data: PathBuf,
}

/// The pid of the ldfs daemon serving `mnt` (`ldfs mount` runs it as
/// `ldfs mount -f --daemon-child IMAGE MNT`).
pub fn daemon_of(mnt: &Path) -> R<u32> {
    let want = mnt.as_os_str().as_encoded_bytes();
    let entries = std::fs::read_dir("/proc").map_err(|e| format!("/proc: {e}"))?;
    for e in entries.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(cmd) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = cmd.split(|&b| b == 0).collect();
        if args.contains(&&b"--daemon-child"[..]) && args.contains(&want) {
            return Ok(pid);
        }
    }
    Err(format!("no ldfs daemon serves {}", mnt.display()))
}

/// Starts sampling process `pid` (every thread) into `data`.
pub fn start(pid: u32, data: &Path) -> R<Recording> {
    let perf = Command::new("perf")
        .args(["record", "-q", "-F", "1999", "-p", &pid.to_string(), "-o"])
        .arg(data)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("perf record: {e} (Debian: apt-get install linux-perf)"))?;
    // perf attaches to every thread before it samples; a workload started
    // sooner would lose its first milliseconds.
    std::thread::sleep(std::time::Duration::from_millis(300));
    Ok(Recording {
        perf,
        data: data.to_path_buf(),
    })
}

impl Recording {
    /// Stops sampling and reads the recording.
    pub fn finish(mut self, target: &str, workload: &str) -> R<Profile> {
        unsafe { libc::kill(self.perf.id() as i32, libc::SIGINT) };
        let st = self.perf.wait().map_err(|e| format!("perf record: {e}"))?;
        // perf exits with the signal's status after writing its file.
        if !self.data.exists() {
            return Err(format!("perf record wrote nothing ({st})"));
        }
        let out = Command::new("perf")
            .args(["report", "--stdio", "--no-children", "--sort", "sym"])
            .args(["--percentage", "relative", "-i"])
            .arg(&self.data)
            .stderr(Stdio::null())
            .output()
            .map_err(|e| format!("perf report: {e}"))?;
        let _ = std::fs::remove_file(&self.data);
        if !out.status.success() {
            return Err(format!("perf report: {}", out.status));
        }
        let text = String::from_utf8_lossy(&out.stdout);
        let (samples, syms) = parse(&text);
        if syms.is_empty() {
            return Err("perf report gave no samples".into());
        }
        Ok(summarize(target, workload, samples, &syms))
    }
}

/// `perf report --stdio --sort sym` output: its sample count and every
/// (symbol with its `[k]`/`[.]` mark, percent) line.
pub fn parse(text: &str) -> (String, Vec<(String, f64)>) {
    let mut samples = String::new();
    let mut syms = Vec::new();
    for line in text.lines() {
        let l = line.trim();
        if let Some(rest) = l.strip_prefix("# Samples:") {
            samples = rest.split_whitespace().next().unwrap_or("").to_string();
            continue;
        }
        if l.starts_with('#') || l.is_empty() {
            continue;
        }
        let Some((pct, sym)) = l.split_once('%') else {
            continue;
        };
        let Ok(p) = pct.trim().parse::<f64>() else {
            continue;
        };
        syms.push((sym.trim().to_string(), p));
    }
    (samples, syms)
}

/// The layer a symbol belongs to.
pub fn area(sym: &str) -> &'static str {
    const SCHED: [&str; 9] = [
        "finish_task_switch",
        "__schedule",
        "schedule",
        "_raw_spin_unlock_irqrestore",
        "try_to_wake_up",
        "__wake_up",
        "prepare_to_wait",
        "pick_next",
        "enqueue_",
    ];
    const ALLOC: [&str; 10] = [
        "malloc",
        "_int_malloc",
        "_int_free",
        "cfree",
        "free",
        "realloc",
        "malloc_consolidate",
        "unlink_chunk",
        "__memmove",
        "__memcpy",
    ];
    if let Some(k) = sym.strip_prefix("[k]") {
        let k = k.trim();
        if k.starts_with("fuse") || k.contains("fuse_") {
            return "kernel: FUSE (requests, copies to and from the daemon)";
        }
        if k.contains("spin_lock") && !k.contains("irqrestore") {
            return "kernel: spin locks (the FUSE queue, wake-ups)";
        }
        if SCHED.iter().any(|s| k.starts_with(s)) {
            return "kernel: scheduler (a request wakes a daemon thread, a reply its caller)";
        }
        return "kernel: other (system calls, page cache, device)";
    }
    let u = sym.strip_prefix("[.]").unwrap_or(sym).trim();
    if u.starts_with("ldfs::fs::") {
        "ldfs: file system layer (fs)"
    } else if u.starts_with("ldfs::lld::") || u.contains("crc32c") {
        "ldfs: log engine (lld: map, log, checksums)"
    } else if u.starts_with("ldfs::") {
        "ldfs: other library code (devices, dual, codecs)"
    } else if u.starts_with("ldfs_tools::") || u.starts_with("<ldfs_tools::") {
        "FUSE adapter and transport (ldfs-tools; memfs: all its code)"
    } else if u.starts_with("fuser::") || u.starts_with("<fuser::") {
        "fuser (the /dev/fuse session crate)"
    } else if ALLOC.iter().any(|s| u.starts_with(s)) || u.starts_with("tcache") {
        "allocator and copies (libc)"
    } else if u.starts_with("__GI___") || u.starts_with("__libc") || u == "read" {
        "libc: system call wrappers"
    } else {
        "other (Rust std, collections, threads)"
    }
}

/// Groups `syms` by area and keeps the 12 largest symbols.
pub fn summarize(target: &str, workload: &str, samples: String, syms: &[(String, f64)]) -> Profile {
    let mut areas: Vec<(String, f64)> = Vec::new();
    for (s, p) in syms {
        let a = area(s);
        match areas.iter_mut().find(|(n, _)| n == a) {
            Some((_, t)) => *t += p,
            None => areas.push((a.to_string(), *p)),
        }
    }
    areas.sort_by(|a, b| b.1.total_cmp(&a.1));
    let mut top = syms.to_vec();
    top.sort_by(|a, b| b.1.total_cmp(&a.1));
    top.truncate(12);
    Profile {
        target: target.into(),
        workload: workload.into(),
        samples,
        areas,
        top,
    }
}

/// The report's section: the areas side by side (one column per profiled
/// target), then each target's largest symbols. Empty without profiles.
pub fn markdown(profiles: &[Profile]) -> String {
    let Some(first) = profiles.first() else {
        return String::new();
    };
    let mut md = String::new();
    let who: Vec<String> = profiles
        .iter()
        .map(|p| format!("`{}` ({} samples)", p.target, p.samples))
        .collect();
    let _ = writeln!(
        md,
        "\n### Where the daemons' time goes\n\n`perf record` of each daemon ({}; all its threads, user and kernel) during the `{}` workload of the first round (`--profile`), as a share of that daemon's samples. Time a daemon spends blocked waiting for a request is not sampled, nor is the benchmark's own side of each system call.\n",
        who.join(", "),
        first.workload
    );
    let mut areas: Vec<&str> = Vec::new();
    for p in profiles {
        for (a, _) in &p.areas {
            if !areas.contains(&a.as_str()) {
                areas.push(a);
            }
        }
    }
    let _ = writeln!(
        md,
        "| where | {} |\n|---|{}",
        profiles
            .iter()
            .map(|p| p.target.as_str())
            .collect::<Vec<_>>()
            .join(" | "),
        "---:|".repeat(profiles.len())
    );
    for a in areas {
        let _ = write!(md, "| {a} |");
        for p in profiles {
            match p.areas.iter().find(|(n, _)| n == a) {
                Some((_, pct)) => {
                    let _ = write!(md, " {pct:.1}% |");
                }
                None => md += " |",
            }
        }
        md += "\n";
    }
    for p in profiles {
        let _ = writeln!(
            md,
            "\n| `{}`: symbol (largest 12) | share |\n|---|---:|",
            p.target
        );
        for (s, pct) in &p.top {
            let s = s.replace('|', "\\|");
            let _ = writeln!(md, "| `{s}` | {pct:.1}% |");
        }
    }
    md
}

/// The profile as a JSON object.
pub fn json(p: &Profile, json_str: impl Fn(&str) -> String) -> String {
    let pairs = |v: &[(String, f64)]| {
        v.iter()
            .map(|(n, x)| format!("[{}, {x:.3}]", json_str(n)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    format!(
        "{{\"target\": {}, \"workload\": {}, \"samples\": {}, \"areas\": [{}], \"top\": [{}]}}",
        json_str(&p.target),
        json_str(&p.workload),
        json_str(&p.samples),
        pairs(&p.areas),
        pairs(&p.top)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const REPORT: &str = "\
# To display the perf.data header info, please use --header/--header-only options.
#
# Total Lost Samples: 0
#
# Samples: 8K of event 'cpu-clock:ppp'
# Event count (approx.): 2049608640
#
# Overhead  Symbol
# ........  ......
#
    40.00%  [k] finish_task_switch.isra.0
    10.00%  [k] fuse_dev_do_read
     8.00%  [.] ldfs::lld::map::Map::get
     7.00%  [.] ldfs::fs::Fs::get_inode
     6.00%  [.] malloc
     5.00%  [k] do_syscall_64
     5.00%  [.] fuser::session::SessionEventLoop<FS>::event_loop
     4.00%  [.] crc32c::hw_x86_64::crc32c
     4.00%  [.] <ldfs_tools::fuse::transport::dev::Dev<F> as fuser::Filesystem>::lookup
     3.00%  [.] __GI___writev
     3.00%  [.] ldfs::device::file::FileDevice::read_at
     2.50%  [.] hashbrown::map::HashMap<K,V,S,A>::insert
     2.50%  [.] _int_free

#
# (Tip: something)
";

    /// Every symbol line is read with its share, the count from the
    /// header, and each lands in its layer; areas add up to the whole.
    #[test]
    fn a_report_is_grouped_by_layer() {
        let (samples, syms) = parse(REPORT);
        assert_eq!(samples, "8K");
        assert_eq!(syms.len(), 13);
        assert_eq!(syms[0], ("[k] finish_task_switch.isra.0".to_string(), 40.0));
        let p = summarize("ldfs", "metadata", samples, &syms);
        let share = |prefix: &str| {
            p.areas
                .iter()
                .filter(|(a, _)| a.starts_with(prefix))
                .map(|(_, x)| *x)
                .sum::<f64>()
        };
        assert_eq!(share("kernel: scheduler"), 40.0);
        assert_eq!(share("kernel: FUSE"), 10.0);
        assert_eq!(share("kernel: other"), 5.0);
        assert_eq!(share("ldfs: log engine"), 12.0, "map and crc32c");
        assert_eq!(share("ldfs: file system"), 7.0);
        assert_eq!(share("ldfs: other library"), 3.0);
        assert_eq!(share("FUSE adapter"), 4.0);
        assert_eq!(share("fuser"), 5.0);
        assert_eq!(share("allocator"), 8.5);
        assert_eq!(share("libc"), 3.0);
        assert_eq!(share("other"), 2.5);
        let total: f64 = p.areas.iter().map(|(_, x)| x).sum();
        assert!((total - 100.0).abs() < 1e-9, "{total}");
        assert_eq!(p.areas[0].1, 40.0, "largest first");
        assert_eq!(p.top.len(), 12);
        let md = markdown(&[p]);
        assert!(md.contains("| kernel: scheduler"), "{md}");
        assert!(md.contains("`ldfs` (8K samples)"), "{md}");
        assert!(md.contains("FS>::event_loop"), "{md}");
    }
}
