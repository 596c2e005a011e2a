//! The application workloads of `ldfs bench fs`: PostMark (DualFS 4.2), the
//! Andrew benchmark (BSD-LFS 5.2.2) and TPC-B through PostgreSQL's pgbench
//! (BSD-LFS 5.2.3). Each runs real programs against a mounted target.
//!
//! Invariants: what a workload starts it stops (postgres through `Postgres`
//! on drop, also on error paths), what it mounts it unmounts (the Andrew
//! source tmpfs through `TmpfsGuard`), and what it creates on the target it
//! deletes. Everything is offline and seeded: PostMark's seed is fixed, the
//! Andrew C program is generated from a fixed seed.

use std::fs::{self, File};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::bench::fs::{have, install, run, FsBench, Target, R};

/// PostMark's configuration (DualFS: 150,000 files of 512 B to 16 KB in
/// 150 subdirectories, 20,000 transactions; the issue asks for 20,000 files
/// in 100 subdirectories).
#[derive(Clone, Debug)]
pub struct Postmark {
    pub files: usize,
    pub min_bytes: u64,
    pub max_bytes: u64,
    pub subdirs: usize,
    pub transactions: usize,
    pub seed: u64,
}

/// The Andrew benchmark's sizes.
#[derive(Clone, Debug)]
pub struct Andrew {
    /// MiB of vendored crate sources (from ~/.cargo/registry/src) added to
    /// this repository's crates/ in the tree copied.
    pub source_mib: u64,
    /// C files of the generated program compiled in phase 5.
    pub c_files: usize,
}

/// The TPC-B run: `pgbench -i -s scale`, then `pgbench -c clients -T secs`.
#[derive(Clone, Debug)]
pub struct Tpcb {
    pub scale: u32,
    pub clients: u32,
    pub secs: u64,
}

/// A tmpfs this benchmark mounted; unmounted (and its mount point removed)
/// on drop.
pub struct TmpfsGuard {
    pub path: PathBuf,
}

impl Drop for TmpfsGuard {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.path).status();
        let _ = fs::remove_dir(&self.path);
    }
}

/// What the workloads need, prepared once per run: the Andrew source tree
/// on a tmpfs (so reading it costs no target I/O), PostgreSQL's binaries.
/// A workload that cannot be prepared is skipped, with the reason.
pub struct Env {
    andrew_src: Option<TmpfsGuard>,
    pg_bin: Option<PathBuf>,
    skipped: Vec<(String, String)>,
}

impl Env {
    pub fn prepare(b: &FsBench) -> R<Env> {
        let mut env = Env {
            andrew_src: None,
            pg_bin: None,
            skipped: Vec::new(),
        };
        for w in &b.workloads {
            let r = match w.as_str() {
                "postmark" => need(&["postmark"], &["postmark"], "the postmark workload"),
                "andrew" => need(&["cc", "make"], &["gcc", "make"], "the andrew workload")
                    .and_then(|()| andrew_source(b))
                    .map(|g| env.andrew_src = Some(g)),
                "tpcb" => pg_bin().map(|p| env.pg_bin = Some(p)),
                _ => Ok(()),
            };
            if let Err(e) = r {
                env.skipped.push((w.clone(), e));
            }
        }
        Ok(env)
    }

    pub fn skipped(&self, key: &str) -> Option<String> {
        self.skipped
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, why)| why.clone())
    }
}

/// Installs `pkgs` (as root, through apt) unless every one of `progs` is
/// on the PATH; the error says why the `why` cannot run.
pub(crate) fn need(progs: &[&str], pkgs: &[&str], why: &str) -> R<()> {
    if progs.iter().all(|p| have(p)) {
        return Ok(());
    }
    install(pkgs, why)?;
    match progs.iter().find(|p| !have(p)) {
        Some(p) => Err(format!("{p} is still missing after installing")),
        None => Ok(()),
    }
}

// ---------------------------------------------------------------- PostMark

/// PostMark's own summary: whole seconds in total and of transactions, and
/// its transactions per second when the transactions took a second or more.
#[derive(Debug, PartialEq)]
pub struct PostmarkOutput {
    pub total_secs: u64,
    pub transaction_secs: u64,
    pub transactions_per_sec: Option<u64>,
}

/// Parses PostMark 1.5's report ("Time:\n\t3 seconds total\n\t2 seconds of
/// transactions (10000 per second)").
pub fn parse_postmark(out: &str) -> R<PostmarkOutput> {
    let lead = |l: &str| -> Option<u64> { l.split_whitespace().next()?.parse().ok() };
    let mut total = None;
    let mut tx = None;
    let mut rate = None;
    for l in out.lines().map(str::trim) {
        if l.ends_with("seconds total") {
            total = lead(l);
        } else if l.contains("seconds of transactions") {
            tx = lead(l);
            rate = l
                .split_once('(')
                .and_then(|(_, r)| r.split_whitespace().next()?.parse().ok());
        }
    }
    match (total, tx) {
        (Some(total_secs), Some(transaction_secs)) => Ok(PostmarkOutput {
            total_secs,
            transaction_secs,
            transactions_per_sec: rate,
        }),
        _ => Err(format!(
            "postmark printed no time summary:\n{}",
            out.lines().take(20).collect::<Vec<_>>().join("\n")
        )),
    }
}

/// Runs PostMark in a fresh directory of the target, driven by a config on
/// stdin. PostMark flushes its progress lines, so the ends of its phases
/// (files created, transactions done, files deleted) are timed here to the
/// millisecond; its own report has whole seconds only.
/// Returns: create s, transactions/s, delete s, postmark's tx/s, postmark's
/// total s, wall clock until durable s.
pub fn postmark(t: &Target, p: &Postmark) -> R<Vec<f64>> {
    postmark_at(&t.mnt, &|| t.durable(), p)
}

/// `postmark` in a fresh directory under `mnt` of any mounted file system,
/// made durable with `durable`.
pub(crate) fn postmark_at(mnt: &Path, durable: &dyn Fn() -> R<()>, p: &Postmark) -> R<Vec<f64>> {
    let dir = mnt.join("postmark");
    fs::create_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let loc = dir.to_str().filter(|s| !s.contains(char::is_whitespace));
    let loc = loc.ok_or_else(|| format!("postmark cannot use {}", dir.display()))?;
    let config = format!(
        "set location {loc}\nset number {}\nset size {} {}\nset subdirectories {}\n\
         set transactions {}\nset seed {}\nrun\nquit\n",
        p.files, p.min_bytes, p.max_bytes, p.subdirs, p.transactions, p.seed
    );
    let t0 = Instant::now();
    let mut child = Command::new("postmark")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("postmark: {e}"))?;
    child
        .stdin
        .take()
        .ok_or("postmark: no stdin")?
        .write_all(config.as_bytes())
        .map_err(|e| format!("postmark stdin: {e}"))?;
    let mut stdout = child.stdout.take().ok_or("postmark: no stdout")?;
    // (seconds since start, line) for each line as it completes.
    let mut lines: Vec<(f64, String)> = Vec::new();
    let mut line = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = stdout
            .read(&mut buf)
            .map_err(|e| format!("postmark stdout: {e}"))?;
        if n == 0 {
            break;
        }
        for &c in &buf[..n] {
            if c == b'\n' {
                let s = String::from_utf8_lossy(&line).into_owned();
                lines.push((t0.elapsed().as_secs_f64(), s));
                line.clear();
            } else {
                line.push(c);
            }
        }
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("postmark: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "postmark failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    durable()?;
    let wall = t0.elapsed().as_secs_f64();
    let text: String = lines.iter().map(|(_, l)| format!("{l}\n")).collect();
    let own = parse_postmark(&text)?;
    let at = |what: &str| -> R<f64> {
        lines
            .iter()
            .find(|(_, l)| l.contains(what) && l.ends_with("Done"))
            .map(|(s, _)| *s)
            .ok_or_else(|| format!("postmark never finished \"{what}\""))
    };
    let created = at("Creating files")?;
    let transacted = at("Performing transactions")?;
    let deleted = at("Deleting files")?;
    let tx_secs = (transacted - created).max(1e-6);
    fs::remove_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    durable()?;
    let own_rate = own
        .transactions_per_sec
        .map(|r| r as f64)
        .unwrap_or(f64::NAN);
    Ok(vec![
        created,
        p.transactions as f64 / tx_secs,
        deleted - transacted,
        own_rate,
        own.total_secs as f64,
        wall,
    ])
}

// ------------------------------------------------------------------ Andrew

fn copy_tree(from: &Path, to: &Path, budget: &mut u64) -> R<()> {
    let meta = fs::symlink_metadata(from).map_err(|e| format!("{}: {e}", from.display()))?;
    if meta.is_dir() {
        fs::create_dir_all(to).map_err(|e| format!("{}: {e}", to.display()))?;
        let mut names: Vec<_> = fs::read_dir(from)
            .map_err(|e| format!("{}: {e}", from.display()))?
            .filter_map(|e| e.ok().map(|e| e.file_name()))
            .collect();
        names.sort();
        for n in names {
            // Build outputs are not sources.
            if n == "target" {
                continue;
            }
            copy_tree(&from.join(&n), &to.join(&n), budget)?;
        }
    } else if meta.is_file() {
        fs::copy(from, to).map_err(|e| format!("{}: {e}", from.display()))?;
        *budget = budget.saturating_sub(meta.len());
    }
    Ok(())
}

/// A deterministic multi-file C program with a Makefile: `files` modules of
/// 24 functions each, a header and a main that checks their sum.
fn generate_c_program(dir: &Path, files: usize) -> R<()> {
    fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let w = |name: &str, text: &str| -> R<()> {
        fs::write(dir.join(name), text).map_err(|e| format!("{name}: {e}"))
    };
    let mut rng = ChaCha8Rng::seed_from_u64(5_2_2);
    let mut header = String::from("#ifndef PROG_H\n#define PROG_H\n#include <stdint.h>\n");
    for i in 0..files {
        header += &format!("uint64_t module{i}(uint64_t x);\n");
    }
    header += "#endif\n";
    w("prog.h", &header)?;
    for i in 0..files {
        let mut c = String::from("#include \"prog.h\"\n\n");
        for k in 0..24 {
            let (a, b, s) = (
                rng.gen_range(3u64..1 << 30) | 1,
                rng.gen_range(1u64..1 << 30),
                rng.gen_range(1..31),
            );
            c += &format!(
                "static uint64_t f{k}(uint64_t x)\n{{\n    uint64_t h = x;\n    for (int i = 0; i < 16; i++) {{\n        h = h * {a}u + {b}u;\n        h ^= h >> {s};\n        if (h % 7 == 3)\n            h += (uint64_t)i * {b}u;\n    }}\n    return h;\n}}\n\n"
            );
        }
        c += &format!("uint64_t module{i}(uint64_t x)\n{{\n    uint64_t r = 0;\n");
        for k in 0..24 {
            c += &format!("    r += f{k}(x + {k});\n");
        }
        c += "    return r;\n}\n";
        w(&format!("m{i}.c"), &c)?;
    }
    let mut main = String::from(
        "#include <stdio.h>\n#include \"prog.h\"\n\nint main(void)\n{\n    uint64_t r = 0;\n",
    );
    for i in 0..files {
        main += &format!("    r += module{i}({i});\n");
    }
    main += "    printf(\"%llu\\n\", (unsigned long long)r);\n    return 0;\n}\n";
    w("main.c", &main)?;
    let objs: Vec<String> = std::iter::once("main.o".to_string())
        .chain((0..files).map(|i| format!("m{i}.o")))
        .collect();
    w(
        "Makefile",
        &format!(
            "CC = cc\nCFLAGS = -O2 -Wall\nOBJS = {}\n\nprog: $(OBJS)\n\t$(CC) -o $@ $(OBJS)\n\n%.o: %.c prog.h\n\t$(CC) $(CFLAGS) -c $<\n",
            objs.join(" ")
        ),
    )
}

/// Mounts a tmpfs under --dir and puts the Andrew source tree on it
/// (`source_tree`) with a generated C program beside it.
fn andrew_source(b: &FsBench) -> R<TmpfsGuard> {
    let guard = source_tree(&b.dir.join("bench-andrew-src"), b.andrew.source_mib)?;
    generate_c_program(&guard.path.join("tree").join("cprog"), b.andrew.c_files)?;
    Ok(guard)
}

/// Mounts a tmpfs at `path` (so reading it costs no target I/O) and puts a
/// real source tree in `path/tree`: this repository's crates/ and vendored
/// crates from ~/.cargo/registry/src (whole crates, by name, up to
/// `source_mib` MiB). Also used by `ldfs bench dual` as the DualFS
/// micro-benchmarks' pattern tree.
pub(crate) fn source_tree(path: &Path, source_mib: u64) -> R<TmpfsGuard> {
    fs::create_dir_all(path).map_err(|e| format!("{}: {e}", path.display()))?;
    run(Command::new("mount")
        .args(["-t", "tmpfs", "-o"])
        .arg(format!("size={}M", source_mib * 2 + 256))
        .arg("tmpfs")
        .arg(path))?;
    let guard = TmpfsGuard {
        path: path.to_path_buf(),
    };
    let tree = guard.path.join("tree");
    let mut unlimited = u64::MAX;
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    copy_tree(&crates, &tree.join("ldfs-crates"), &mut unlimited)?;
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    let mut budget = source_mib << 20;
    if let Ok(registries) = fs::read_dir(Path::new(&home).join(".cargo/registry/src")) {
        let mut regs: Vec<PathBuf> = registries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect();
        regs.sort();
        'all: for reg in regs {
            let mut krates: Vec<PathBuf> = fs::read_dir(&reg)
                .map_err(|e| format!("{}: {e}", reg.display()))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .collect();
            krates.sort();
            for k in krates {
                if budget == 0 {
                    break 'all;
                }
                let name = k.file_name().unwrap_or_default().to_owned();
                copy_tree(&k, &tree.join("vendor").join(name), &mut budget)?;
            }
        }
    }
    Ok(guard)
}

/// Directories (pre-order) and regular files of a tree, relative to it.
pub(crate) fn walk(root: &Path) -> R<(Vec<PathBuf>, Vec<PathBuf>)> {
    let mut dirs = Vec::new();
    let mut files = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let mut entries: Vec<_> = fs::read_dir(root.join(&rel))
            .map_err(|e| format!("{}: {e}", root.join(&rel).display()))?
            .filter_map(|e| e.ok())
            .collect();
        entries.sort_by_key(|e| e.file_name());
        for e in entries.into_iter().rev() {
            let ty = e.file_type().map_err(|e| e.to_string())?;
            let p = rel.join(e.file_name());
            if ty.is_dir() {
                dirs.push(p.clone());
                stack.push(p);
            } else if ty.is_file() {
                files.push(p);
            }
        }
    }
    Ok((dirs, files))
}

/// The Andrew benchmark's five phases on a copy of the source tree, caches
/// warm as in the original: (1) create the directory hierarchy, (2) copy
/// every file, (3) stat every file and directory by walking the copy,
/// (4) read every byte, (5) compile the C program in the copy with make;
/// then make everything durable. Seconds per phase.
pub fn andrew(t: &Target, env: &Env) -> R<Vec<f64>> {
    let src = &env.andrew_src.as_ref().ok_or("no Andrew source tree")?.path;
    let src = src.join("tree");
    let dst = t.mnt.join("andrew");
    let (dirs, files) = walk(&src)?;
    let err = |p: &Path, e: std::io::Error| format!("{}: {e}", p.display());

    let t0 = Instant::now();
    fs::create_dir(&dst).map_err(|e| err(&dst, e))?;
    for d in &dirs {
        fs::create_dir(dst.join(d)).map_err(|e| err(d, e))?;
    }
    let mkdir = t0.elapsed().as_secs_f64();

    let t0 = Instant::now();
    let mut buf = vec![0u8; 64 << 10];
    let mut bytes = 0u64;
    for f in &files {
        let mut from = File::open(src.join(f)).map_err(|e| err(f, e))?;
        let mut to = File::create(dst.join(f)).map_err(|e| err(f, e))?;
        loop {
            let n = from.read(&mut buf).map_err(|e| err(f, e))?;
            if n == 0 {
                break;
            }
            to.write_all(&buf[..n]).map_err(|e| err(f, e))?;
            bytes += n as u64;
        }
    }
    let copy = t0.elapsed().as_secs_f64();

    let t0 = Instant::now();
    let mut seen = 0usize;
    let mut stack = vec![dst.clone()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).map_err(|e| err(&d, e))? {
            let p = e.map_err(|e| err(&d, e))?.path();
            let m = fs::symlink_metadata(&p).map_err(|e| err(&p, e))?;
            seen += 1;
            if m.is_dir() {
                stack.push(p);
            }
        }
    }
    let stat = t0.elapsed().as_secs_f64();
    if seen != dirs.len() + files.len() {
        return Err(format!(
            "andrew: the copy has {seen} entries, the source {}",
            dirs.len() + files.len()
        ));
    }

    let t0 = Instant::now();
    let mut read = 0u64;
    for f in &files {
        let mut from = File::open(dst.join(f)).map_err(|e| err(f, e))?;
        loop {
            let n = from.read(&mut buf).map_err(|e| err(f, e))?;
            if n == 0 {
                break;
            }
            read += n as u64;
        }
    }
    let scan = t0.elapsed().as_secs_f64();
    if read != bytes {
        return Err(format!("andrew: read {read} bytes of {bytes} copied"));
    }

    let prog = dst.join("cprog");
    let t0 = Instant::now();
    run(Command::new("make").arg("-s").arg("-C").arg(&prog))?;
    let compile = t0.elapsed().as_secs_f64();
    let t0 = Instant::now();
    t.durable()?;
    let sync = t0.elapsed().as_secs_f64();
    let out = Command::new(prog.join("prog"))
        .output()
        .map_err(|e| format!("running the compiled program: {e}"))?;
    if !out.status.success() || out.stdout.is_empty() {
        return Err("andrew: the compiled program did not run".into());
    }
    fs::remove_dir_all(&dst).map_err(|e| err(&dst, e))?;
    t.durable()?;
    Ok(vec![mkdir, copy, stat, scan, compile, sync])
}

// ------------------------------------------------------------------- TPC-B

/// The newest PostgreSQL server's bin directory (Debian keeps them in
/// /usr/lib/postgresql/VERSION/bin), installing postgresql if none.
fn pg_bin() -> R<PathBuf> {
    let find = || -> Option<PathBuf> {
        let mut versions: Vec<(u32, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
            .ok()?
            .filter_map(|e| {
                let e = e.ok()?;
                let v = e.file_name().to_str()?.parse().ok()?;
                Some((v, e.path().join("bin")))
            })
            .filter(|(_, p)| {
                ["initdb", "pg_ctl", "postgres", "pgbench"]
                    .iter()
                    .all(|b| p.join(b).is_file())
            })
            .collect();
        versions.sort();
        versions.pop().map(|(_, p)| p)
    };
    let bin = match find() {
        Some(b) => b,
        None => {
            install(&["postgresql", "postgresql-contrib"], "the tpcb workload")?;
            find().ok_or("no PostgreSQL server after installing postgresql")?
        }
    };
    postgres_ids()?;
    if !have("runuser") {
        return Err("runuser (util-linux) is missing".into());
    }
    Ok(bin)
}

/// The postgres user's uid and gid (the server refuses to run as root).
fn postgres_ids() -> R<(u32, u32)> {
    let name = std::ffi::CString::new("postgres").expect("no NUL");
    let pw = unsafe { libc::getpwnam(name.as_ptr()) };
    if pw.is_null() {
        return Err("there is no postgres user (apt-get install postgresql makes one)".into());
    }
    Ok(unsafe { ((*pw).pw_uid, (*pw).pw_gid) })
}

fn chown(p: &Path, (uid, gid): (u32, u32)) -> R<()> {
    std::os::unix::fs::chown(p, Some(uid), Some(gid))
        .map_err(|e| format!("chown {}: {e}", p.display()))
}

/// A PostgreSQL server this benchmark started; stopped on drop.
struct Postgres {
    bin: PathBuf,
    data: PathBuf,
}

impl Postgres {
    fn pg_ctl(&self, args: &[&str]) -> Command {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"])
            .arg(self.bin.join("pg_ctl"))
            .arg("-D")
            .arg(&self.data)
            .args(args);
        c
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let _ = self
            .pg_ctl(&["-m", "fast", "-w", "-t", "120", "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// pgbench's figures: transactions per second and average latency in ms.
pub fn parse_pgbench(out: &str) -> R<(f64, f64)> {
    let value = |prefix: &str| -> Option<f64> {
        out.lines()
            .map(str::trim)
            .find_map(|l| l.strip_prefix(prefix))
            .and_then(|r| r.split_whitespace().next()?.parse().ok())
    };
    match (value("tps = "), value("latency average = ")) {
        (Some(tps), Some(lat)) => Ok((tps, lat)),
        _ => Err(format!("pgbench printed no tps:\n{out}")),
    }
}

/// A TCP port on loopback that is free now.
fn free_port() -> R<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| format!("bind: {e}"))?;
    Ok(l.local_addr().map_err(|e| e.to_string())?.port())
}

/// TPC-B through PostgreSQL: initdb a data directory on the target, start
/// the server as the postgres user on a private loopback port (no Unix
/// socket), `pgbench -i -s SCALE` (timed until durable), then
/// `pgbench -c CLIENTS -T SECS`. Default server settings (fsync on,
/// synchronous commit), so every commit is an fsync of the WAL.
pub fn tpcb(t: &Target, b: &FsBench, env: &Env) -> R<Vec<f64>> {
    let bin = env.pg_bin.as_ref().ok_or("no PostgreSQL")?;
    let ids = postgres_ids()?;
    let data = t.mnt.join("pgdata");
    fs::create_dir(&data).map_err(|e| format!("{}: {e}", data.display()))?;
    chown(&data, ids)?;
    fs::set_permissions(&data, std::os::unix::fs::PermissionsExt::from_mode(0o700))
        .map_err(|e| format!("chmod {}: {e}", data.display()))?;
    let log = b.dir.join(format!("bench-tpcb-{}.log", t.name));
    File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
    chown(&log, ids)?;
    let result = (|| -> R<Vec<f64>> {
        run(Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(bin.join("initdb"))
            .args(["-U", "postgres", "--auth=trust", "-E", "UTF8", "-D"])
            .arg(&data))?;
        let port = free_port()?;
        let mut conf = fs::OpenOptions::new()
            .append(true)
            .open(data.join("postgresql.conf"))
            .map_err(|e| format!("postgresql.conf: {e}"))?;
        write!(
            conf,
            "\n# ldfs bench fs\nport = {port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = ''\n"
        )
        .map_err(|e| format!("postgresql.conf: {e}"))?;
        drop(conf);
        let pg = Postgres {
            bin: bin.clone(),
            data: data.clone(),
        };
        run(pg.pg_ctl(&["-w", "-t", "300", "-l"]).arg(&log).arg("start"))?;
        let pgbench = |args: &[String]| -> R<String> {
            let out = Command::new(bin.join("pgbench"))
                .args(["-h", "127.0.0.1", "-U", "postgres", "-p", &port.to_string()])
                .args(args)
                .arg("postgres")
                .output()
                .map_err(|e| format!("pgbench: {e}"))?;
            if !out.status.success() {
                return Err(format!(
                    "pgbench {args:?} failed: {}",
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        };
        let t0 = Instant::now();
        pgbench(&[
            "-i".into(),
            "-q".into(),
            "-s".into(),
            b.tpcb.scale.to_string(),
        ])?;
        t.durable()?;
        let init = t0.elapsed().as_secs_f64();
        let out = pgbench(&[
            "-c".into(),
            b.tpcb.clients.to_string(),
            "-j".into(),
            b.tpcb.clients.min(2).to_string(),
            "-T".into(),
            b.tpcb.secs.to_string(),
        ])?;
        let (tps, latency_ms) = parse_pgbench(&out)?;
        drop(pg);
        Ok(vec![init, tps, latency_ms])
    })();
    let _ = fs::remove_file(&log);
    let removed = fs::remove_dir_all(&data).map_err(|e| format!("{}: {e}", data.display()));
    let v = result?;
    removed?;
    t.durable()?;
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn postmark_report() {
        let out = "pm>Creating files...Done\nTime:\n\t12 seconds total\n\t9 seconds of transactions (2222 per second)\n\nFiles:\n\t753 created (753 per second)\n";
        assert_eq!(
            parse_postmark(out).unwrap(),
            PostmarkOutput {
                total_secs: 12,
                transaction_secs: 9,
                transactions_per_sec: Some(2222)
            }
        );
        let fast = "Time:\n\t0 seconds total\n\t0 seconds of transactions\n";
        assert_eq!(parse_postmark(fast).unwrap().transactions_per_sec, None);
        assert!(parse_postmark("pm>pm>").is_err());
    }

    #[test]
    fn pgbench_report() {
        let out = "number of transactions actually processed: 1234\nnumber of failed transactions: 0 (0.000%)\nlatency average = 3.241 ms\ninitial connection time = 5.1 ms\ntps = 1234.567890 (without initial connection time)\n";
        assert_eq!(parse_pgbench(out).unwrap(), (1234.56789, 3.241));
        assert!(parse_pgbench("error").is_err());
    }
}
