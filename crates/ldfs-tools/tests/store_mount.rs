//! A store-backed file system through real FUSE mounts against the real gateway (issue 20):
//! `ldfs mkfs --store`, `ldfs mount s3://...`, the lease, `sync --remote`, `stats --json`,
//! machine loss (a fresh cache rebuilt from the store), a read-only mount beside the writer,
//! and kill -9 of the daemon mid-upload then a remount on the same cache.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{fuse_usable, is_mounted, ldfs, Succeeds};
use ldfs::testing::ceph::{gateway, unique_bucket, Gateway};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

type Tree = BTreeMap<String, Vec<u8>>;

struct Env {
    vars: BTreeMap<String, String>,
    url: String,
    scratch: tempfile::TempDir,
}

fn env(what: &str) -> Option<Env> {
    if !fuse_usable() {
        return None;
    }
    let vars = match gateway() {
        Gateway::Ready(v) => v,
        Gateway::Skip(why) => {
            eprintln!("*** SKIPPING the store mount test: {why} ***");
            return None;
        }
    };
    std::fs::create_dir_all("/var/tmp/s3mount-tests").unwrap();
    Some(Env {
        vars,
        url: format!("s3://{}/fs", unique_bucket(what)),
        scratch: tempfile::tempdir_in("/var/tmp/s3mount-tests").unwrap(),
    })
}

impl Env {
    fn path(&self, p: &str) -> PathBuf {
        self.scratch.path().join(p)
    }
    fn ldfs(&self) -> Command {
        let mut c = ldfs();
        c.envs(&self.vars);
        c
    }
    fn mkfs(&self, cache: &Path) {
        self.ldfs()
            .args(["mkfs", "--store", &self.url, "--cache"])
            .arg(cache)
            .args(["--size", "96M", "--sparse"])
            .succeeds();
    }
    /// `ldfs mount -f` of the store as a child; waits until mounted.
    /// A fresh file system (`mkfs`, cache `c1.img`) mounted read-write at `d1` with `opts`.
    fn writer(&self, opts: &[&str]) -> (PathBuf, PathBuf, StoreMount) {
        let (cache, dir) = (self.path("c1.img"), self.path("d1"));
        self.mkfs(&cache);
        let m = self.mount(&cache, &dir, opts, false);
        (cache, dir, m)
    }

    fn mount(&self, cache: &Path, dir: &Path, opts: &[&str], force: bool) -> StoreMount {
        let force: &[&str] = if force { &["--force-takeover"] } else { &[] };
        self.mount_with(cache, dir, opts, force)
    }
    /// `mount` with more arguments.
    fn mount_with(&self, cache: &Path, dir: &Path, opts: &[&str], args: &[&str]) -> StoreMount {
        self.spawn_mount(cache, dir, opts, args, Stdio::inherit())
    }
    /// `mount` with the daemon's stderr written to `log`.
    fn mount_logged(&self, cache: &Path, dir: &Path, opts: &[&str], log: &Path) -> StoreMount {
        let f = std::fs::File::create(log).unwrap();
        self.spawn_mount(cache, dir, opts, &[], Stdio::from(f))
    }
    fn spawn_mount(
        &self,
        cache: &Path,
        dir: &Path,
        opts: &[&str],
        args: &[&str],
        stderr: Stdio,
    ) -> StoreMount {
        std::fs::create_dir_all(dir).unwrap();
        let mut c = self.ldfs();
        c.args(["mount", "-f", &self.url])
            .arg(dir)
            .arg("--cache")
            .arg(cache)
            .args(args);
        for o in opts {
            c.args(["-o", o]);
        }
        let mut child = c.stdin(Stdio::null()).stderr(stderr).spawn().unwrap();
        let t = Instant::now();
        while !is_mounted(dir) {
            if let Some(st) = child.try_wait().unwrap() {
                panic!("ldfs mount {} exited with {st} before mounting", self.url);
            }
            assert!(t.elapsed() < Duration::from_secs(60), "mount timed out");
            std::thread::sleep(Duration::from_millis(20));
        }
        StoreMount {
            dir: dir.to_path_buf(),
            child: Some(child),
        }
    }
    /// The store itself (to look at its objects).
    fn store(&self) -> ldfs::store::S3Store {
        let bucket = self.url["s3://".len()..].split('/').next().unwrap();
        let cfg =
            ldfs::store::S3Config::from_vars(bucket, "fs", |k| self.vars.get(k).cloned()).unwrap();
        ldfs::store::S3Store::new(&cfg).unwrap()
    }
    /// A mount that must fail: its stderr.
    fn mount_refused(&self, cache: &Path, dir: &Path) -> String {
        self.mount_refused_with(&[], cache, dir)
    }

    /// `ldfs mount [-o OPTS] URL DIR --cache CACHE`, which must fail: what it said.
    fn mount_refused_with(&self, opts: &[&str], cache: &Path, dir: &Path) -> String {
        std::fs::create_dir_all(dir).unwrap();
        let mut cmd = self.ldfs();
        cmd.arg("mount");
        if !opts.is_empty() {
            cmd.args(["-o", &opts.join(",")]);
        }
        let out = cmd
            .arg(&self.url)
            .arg(dir)
            .arg("--cache")
            .arg(cache)
            .output()
            .unwrap();
        if out.status.success() {
            let _ = Command::new("fusermount3").arg("-u").arg(dir).status();
            panic!("a mount of {} with {opts:?} succeeded", self.url);
        }
        String::from_utf8_lossy(&out.stderr).into_owned()
    }
}

struct StoreMount {
    dir: PathBuf,
    child: Option<Child>,
}

impl StoreMount {
    fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }
    fn unmount(mut self) {
        for tries in 0.. {
            let out = Command::new("fusermount3")
                .arg("-u")
                .arg(&self.dir)
                .output()
                .unwrap();
            if out.status.success() {
                break;
            }
            assert!(tries < 100, "{}", String::from_utf8_lossy(&out.stderr));
            std::thread::sleep(Duration::from_millis(50));
        }
        let st = self.child.take().unwrap().wait().unwrap();
        assert!(st.success(), "ldfs mount exited with {st}");
    }
    fn kill9(mut self) {
        let mut c = self.child.take().unwrap();
        c.kill().unwrap();
        c.wait().unwrap();
        let _ = Command::new("fusermount3")
            .args(["-u", "-z"])
            .arg(&self.dir)
            .status();
    }
}

impl Drop for StoreMount {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("fusermount3")
                .args(["-u", "-z"])
                .arg(&self.dir)
                .status();
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Files in a few directories, some of them MiBs (several segments), each fsynced.
fn write_tree(root: &Path, seed: u64, files: usize) -> Tree {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut tree = Tree::new();
    for i in 0..files {
        let rel = format!("d{}/f{seed}-{i}", i % 4);
        std::fs::create_dir_all(root.join(format!("d{}", i % 4))).unwrap();
        let len = if i % 7 == 0 {
            rng.gen_range(1 << 20..3 << 20)
        } else {
            rng.gen_range(0..40_000)
        };
        let data: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
        let f = std::fs::File::create(root.join(&rel)).unwrap();
        std::io::Write::write_all(&mut &f, &data).unwrap();
        f.sync_all().unwrap();
        tree.insert(rel, data);
    }
    tree
}

fn read_tree(root: &Path) -> Tree {
    let mut tree = Tree::new();
    for d in std::fs::read_dir(root).unwrap() {
        let d = d.unwrap();
        if !d.file_type().unwrap().is_dir() {
            continue;
        }
        for f in std::fs::read_dir(d.path()).unwrap() {
            let f = f.unwrap();
            let rel = format!(
                "{}/{}",
                d.file_name().to_string_lossy(),
                f.file_name().to_string_lossy()
            );
            tree.insert(rel, std::fs::read(f.path()).unwrap());
        }
    }
    tree
}

fn assert_same(got: &Tree, want: &Tree, what: &str) {
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        want.keys().collect::<Vec<_>>(),
        "{what}: names"
    );
    for (k, v) in want {
        assert!(got[k] == *v, "{what}: {k} differs");
    }
}

/// fsck of a cache: segments it does not hold are read from the store (with the gateway's
/// credentials in the environment).
fn fsck_clean(e: &Env, cache: &Path) {
    let out = e.ldfs().args(["fsck", "-n"]).arg(cache).output().unwrap();
    assert!(
        out.status.success(),
        "fsck -n {}: {}{}",
        cache.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn stats_json(dir: &Path) -> serde_json::Value {
    let out = ldfs().args(["stats", "--json"]).arg(dir).succeeds();
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Machine loss: write, `sync --remote`, unmount, delete the cache, mount with a fresh cache:
/// the same tree, fsck clean. While the writer is mounted a second read-write mount is refused
/// naming the holder, and a read-only mount beside it sees the last uploaded checkpoint.
#[test]
fn a_fresh_cache_mounts_the_same_tree_and_a_second_writer_is_refused() {
    let Some(e) = env("mnt") else { return };
    let (c1, d1, m) = e.writer(&["upload=2"]);
    let tree = write_tree(&d1, 1, 40);
    // A second writer anywhere (another cache) is refused, naming the holder.
    let why = e.mount_refused(&e.path("c2.img"), &e.path("d2"));
    assert!(
        why.contains(&format!("pid {} on", m.pid())),
        "the refusal must name the holder: {why}"
    );
    e.ldfs().args(["sync", "--remote"]).arg(&d1).succeeds();
    let st = stats_json(&d1);
    let store = &st["store"];
    assert!(store["uploaded_checkpoint"].as_u64().unwrap() >= 1, "{st}");
    assert!(store["store_bytes"].as_u64().unwrap() > 4 << 20, "{st}");
    assert!(
        store["lease_holder"]
            .as_str()
            .unwrap()
            .contains(&format!("pid {}", m.pid())),
        "{st}"
    );
    // A read-only mount beside the writer, on its own cache: the last uploaded checkpoint.
    let d3 = e.path("d3");
    let ro = e.mount(&e.path("c3.img"), &d3, &["ro"], false);
    assert_same(&read_tree(&d3), &tree, "read-only mount beside the writer");
    ro.unmount();
    // Written after the upload, then unmounted: the unmount uploads the final checkpoint.
    let more = write_tree(&d1, 2, 10);
    m.unmount();
    let mut want = tree.clone();
    want.extend(more);
    // The machine is lost: a fresh cache elsewhere.
    std::fs::remove_file(&c1).unwrap();
    let c4 = e.path("c4.img");
    let m = e.mount(&c4, &d1, &[], false);
    assert_same(&read_tree(&d1), &want, "fresh cache from the store");
    m.unmount();
    fsck_clean(&e, &c4);
}

/// Review 34's first and third notes (fixed on store4). `ldfs mkfs --store` over the path of
/// an earlier file system's cache whose residency map remains (`PATH.ldfs-resident`): mkfs
/// removes the map and says so (before, every mount failed on the map's fs id until the user
/// found and removed it). And a damaged map refuses the mount naming the remedy (a new cache
/// rebuilt from the store), which then works.
#[test]
fn mkfs_over_an_earlier_caches_map_removes_it_and_a_damaged_map_names_the_remedy() {
    let Some(e) = env("staleamap") else { return };
    let c1 = e.path("c1.img");
    let map = ldfs_tools::cli::store::map_path(&c1);
    // An earlier file system's map at the cache's place (a cache it had evicted from).
    std::fs::write(&map, ldfs::store::cache::encode_map(0x5403, &[])).unwrap();
    let out = e
        .ldfs()
        .args(["mkfs", "--store", &e.url, "--cache"])
        .arg(&c1)
        .args(["--size", "96M", "--sparse"])
        .succeeds();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!map.exists(), "mkfs left the earlier file system's map");
    assert!(
        said.contains("removed") && said.contains("0000000000005403"),
        "mkfs did not say it removed the map: {said}"
    );
    let d1 = e.path("d1");
    let m = e.mount(&c1, &d1, &[], false);
    let tree = write_tree(&d1, 5, 10);
    m.unmount();
    // A damaged map: refused, naming the remedy; the remedy (the cache moved away) works.
    std::fs::write(&map, b"not a residency map").unwrap();
    let why = e.mount_refused_with(&["lease=10"], &c1, &d1);
    assert!(
        why.contains("residency map") && why.contains("move the cache away"),
        "the refusal names no remedy: {why}"
    );
    // The refused mount had taken the lease (free: the last writer unmounted cleanly) and
    // gives it back as it found it: the remedy's mount takes it at once, without
    // --force-takeover (store5; before, it kept it until it expired, and the remedy's mount was
    // refused naming the refused mount's pid, then needed --force-takeover).
    assert!(
        why.contains("lease") && why.contains("given back"),
        "the refusal does not say what became of the lease: {why}"
    );
    std::fs::rename(&c1, e.path("c1.damaged")).unwrap();
    let m = e.mount(&c1, &d1, &[], false);
    assert_same(&read_tree(&d1), &tree, "a new cache after a damaged map");
    m.unmount();
}

/// kill -9 of the daemon in the middle of uploads: the lease is not released; a remount on
/// the same cache is refused until it expires, then taken over with --force-takeover; every
/// file fsynced before the kill is there, fsck clean, and after `sync --remote` a cache
/// rebuilt from the store has them too.
#[test]
fn kill_9_mid_upload_then_a_remount_on_the_same_cache() {
    let Some(e) = env("kill") else { return };
    let (c1, d1, m) = e.writer(&["upload=1", "lease=10"]);
    let tree = write_tree(&d1, 3, 30);
    // Uploads are under way (a checkpoint a second).
    std::thread::sleep(Duration::from_millis(1500));
    m.kill9();
    let why = e.mount_refused(&c1, &d1);
    assert!(why.contains("lease until"), "{why}");
    std::thread::sleep(Duration::from_secs(11));
    let m = e.mount(&c1, &d1, &["lease=10"], true);
    assert_same(&read_tree(&d1), &tree, "same cache after kill -9");
    e.ldfs().args(["sync", "--remote"]).arg(&d1).succeeds();
    m.unmount();
    fsck_clean(&e, &c1);
    let c2 = e.path("c2.img");
    let m = e.mount(&c2, &e.path("d2"), &[], false);
    assert_same(
        &read_tree(&e.path("d2")),
        &tree,
        "rebuilt after the remount",
    );
    m.unmount();
}

/// A TCP proxy in front of the gateway that the test takes down and brings back: down, its
/// connections are cut and new ones closed at once (to the mount, the gateway is unreachable:
/// every request fails as transient and is retried).
struct Proxy {
    addr: std::net::SocketAddr,
    /// Whether connections are forwarded, and the open ones (both sides) to cut when not.
    state: std::sync::Arc<std::sync::Mutex<(bool, Vec<std::net::TcpStream>)>>,
}

impl Proxy {
    fn start(endpoint: &str) -> Proxy {
        use std::net::{TcpListener, TcpStream};
        let upstream = endpoint
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_string();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let state = std::sync::Arc::new(std::sync::Mutex::new((true, Vec::new())));
        let st = state.clone();
        // Blocked in accept when the test ends: the process's end takes it.
        std::thread::spawn(move || {
            for c in listener.incoming() {
                let Ok(c) = c else { continue };
                let mut s = st.lock().unwrap();
                if !s.0 {
                    continue;
                }
                let Ok(u) = TcpStream::connect(&upstream) else {
                    continue;
                };
                s.1.push(c.try_clone().unwrap());
                s.1.push(u.try_clone().unwrap());
                for (mut from, mut to) in [(c.try_clone().unwrap(), u.try_clone().unwrap()), (u, c)]
                {
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut to);
                        let _ = to.shutdown(std::net::Shutdown::Write);
                    });
                }
            }
        });
        Proxy { addr, state }
    }
    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
    fn down(&self) {
        let mut s = self.state.lock().unwrap();
        s.0 = false;
        for c in s.1.drain(..) {
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
    }
}

/// The bytes of the blocked writer's file: a pattern of `seed`.
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..len).map(|_| rng.gen()).collect()
}

/// Review 32 finding 7: a writer waiting on the upload backlog (the gateway unreachable)
/// must not keep the daemon from ending on SIGTERM. fuser's session joins every FUSE thread,
/// one waiting in the backlog gate too, so a gate let go only when the uploader stops (after
/// the session) kept the daemon alive, its lease renewer with it, for as long as the store
/// was away. Here: a mount through a proxy with an 8 MiB backlog bound, files fsynced and
/// uploaded, one fsynced after the proxy went down, then a writer held by the gate; a plain
/// `fusermount3 -u` is refused (busy: the writer holds its file), SIGTERM must end the daemon
/// within the final upload's wait and a margin; the lease is kept (the final upload failed),
/// and the cache, mounted again with the gateway back (`--force-takeover`: the lease expired
/// unrenewed), holds everything fsynced and every byte the writer was told was written.
fn a_writer_waiting_on_the_backlog_does_not_keep_the_daemon_alive(transport: &str) {
    let Some(e) = env(&format!("gate{transport}")) else {
        return;
    };
    let proxy = Proxy::start(&e.vars["AWS_ENDPOINT_URL"]);
    let c1 = e.path("c1.img");
    e.mkfs(&c1);
    let d1 = e.path("d1");
    std::fs::create_dir_all(&d1).unwrap();
    let log = e.path("daemon.log");
    let mut c = e.ldfs();
    c.env("AWS_ENDPOINT_URL", proxy.url())
        .args(["mount", "-f", &e.url])
        .arg(&d1)
        .arg("--cache")
        .arg(&c1)
        .args(["-o", "lease=10,upload=600,upload_backlog=8M"])
        .args(["-o", &format!("transport={transport}")])
        .stdin(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    let mut m = StoreMount {
        dir: d1.clone(),
        child: Some(c.spawn().unwrap()),
    };
    let t = Instant::now();
    while !is_mounted(&d1) {
        if let Some(st) = m.child.as_mut().unwrap().try_wait().unwrap() {
            panic!(
                "ldfs mount exited with {st}: {}",
                std::fs::read_to_string(&log).unwrap()
            );
        }
        assert!(t.elapsed() < Duration::from_secs(60), "mount timed out");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut want = write_tree(&d1, 11, 12);
    e.ldfs().args(["sync", "--remote"]).arg(&d1).succeeds();
    let writer = stats_json(&d1)["store"]["writer"].as_u64().unwrap();
    proxy.down();
    // Fsynced after the gateway went away: in the cache only.
    want.extend(write_tree(&d1, 12, 3));
    let (seed, len) = (13, 24 << 20);
    let data = pattern(seed, len);
    let acked = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let w = {
        let (path, data, acked) = (d1.join("blocked"), data.clone(), acked.clone());
        std::thread::spawn(move || -> std::io::Result<()> {
            let mut f = std::fs::File::create(path)?;
            for chunk in data.chunks(64 << 10) {
                std::io::Write::write_all(&mut f, chunk)?;
                acked.fetch_add(chunk.len(), std::sync::atomic::Ordering::SeqCst);
            }
            Ok(())
        })
    };
    // The writer waits: no progress for 3 s, the backlog over its bound, the line logged.
    let t = Instant::now();
    let mut last = (usize::MAX, Instant::now());
    loop {
        let now = acked.load(std::sync::atomic::Ordering::SeqCst);
        if now != last.0 {
            last = (now, Instant::now());
        }
        let said = std::fs::read_to_string(&log)
            .unwrap()
            .contains("writers wait for the store");
        if said && last.1.elapsed() > Duration::from_secs(3) {
            break;
        }
        assert!(
            !w.is_finished() && t.elapsed() < Duration::from_secs(60),
            "the writer was not held by the backlog bound ({now} bytes written): {}",
            std::fs::read_to_string(&log).unwrap()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let st = stats_json(&d1);
    assert!(
        st["store"]["backlog_bytes"].as_u64().unwrap() > 8 << 20,
        "{st}"
    );
    // A plain unmount: the writer holds its file, the mount is busy (as any mount).
    let out = Command::new("fusermount3")
        .arg("-u")
        .arg(&d1)
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "fusermount3 -u of a mount with a writer inside succeeded"
    );
    let pid = m.pid();
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGTERM) }, 0);
    let limit = Duration::from_secs(120 + 45);
    let t = Instant::now();
    let ended = loop {
        if let Some(st) = m.child.as_mut().unwrap().try_wait().unwrap() {
            break Some(st);
        }
        if t.elapsed() > limit {
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        ended.is_some(),
        "the daemon (pid {pid}) did not end within {limit:?} of SIGTERM with a writer waiting \
         on the backlog ({} bytes acknowledged): {text}",
        acked.load(std::sync::atomic::Ordering::SeqCst)
    );
    m.child = None;
    let left = is_mounted(&d1);
    if left {
        let _ = Command::new("fusermount3")
            .args(["-u", "-z"])
            .arg(&d1)
            .status();
    }
    assert!(
        !left,
        "the daemon ended ({ended:?}) leaving its mount: {text}"
    );
    // Its file was cut off by the end (or completed): either is fine.
    let _ = w.join().unwrap();
    let acked = acked.load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        text.contains("is not in"),
        "{ended:?} after {:?}: {text}",
        t.elapsed()
    );
    // Over io_uring the session ends without the ring's threads; one still held by the gate
    // is given up on after 10 s, and its write then meets a closed engine.
    assert!(
        !text.contains("still busy"),
        "a FUSE thread outlived the session: {text}"
    );
    // The lease is kept, to expire: neither released nor taken by anyone.
    {
        use ldfs::store::{S3Config, S3Store};
        let bucket = e.url["s3://".len()..].split('/').next().unwrap();
        let cfg = S3Config::from_vars(bucket, "fs", |k| e.vars.get(k).cloned()).unwrap();
        let s3 = S3Store::new(&cfg).unwrap();
        let (g, rec) = ldfs::store::lease::current(&s3).unwrap().unwrap();
        assert_eq!(g, writer, "the lease moved: {rec:?}");
        assert_ne!(rec.expires_secs, 0, "released after a failed final upload");
        assert_eq!(rec.pid, pid, "{rec:?}");
    }
    // The gateway is back; the lease expired unrenewed: the same cache, forced.
    std::thread::sleep(Duration::from_secs(11).saturating_sub(t.elapsed()));
    let m = e.mount(&c1, &d1, &["lease=10"], true);
    let mut got = read_tree(&d1);
    let blocked = std::fs::read(d1.join("blocked")).unwrap();
    assert!(
        blocked.len() >= acked && blocked[..] == data[..blocked.len()],
        "the writer was told {acked} bytes were written; the cache holds {} bytes of its file, \
         or other bytes",
        blocked.len()
    );
    got.remove("blocked");
    assert_same(&got, &want, "the cache after the end");
    e.ldfs().args(["sync", "--remote"]).arg(&d1).succeeds();
    m.unmount();
    fsck_clean(&e, &c1);
    // And the store has it all.
    let c2 = e.path("c2.img");
    let d2 = e.path("d2");
    let m = e.mount(&c2, &d2, &[], false);
    assert_same(&read_tree(&d2), &want, "rebuilt from the store");
    assert!(std::fs::read(d2.join("blocked")).unwrap() == blocked);
    m.unmount();
}

#[test]
fn sigterm_ends_a_daemon_whose_writer_waits_on_the_backlog() {
    a_writer_waiting_on_the_backlog_does_not_keep_the_daemon_alive("dev");
}

/// The same over FUSE over io_uring, where the ring's threads, not fuser's, hold the writer.
/// As root with the fuse module's `enable_uring` off, `transport=uring` turns it on; the test
/// puts it back as it found it.
#[test]
fn sigterm_ends_a_daemon_whose_writer_waits_on_the_backlog_uring() {
    const PARAM: &str = "/sys/module/fuse/parameters/enable_uring";
    struct Restore(String);
    impl Drop for Restore {
        fn drop(&mut self) {
            let _ = std::fs::write(PARAM, self.0.trim());
        }
    }
    let Ok(was) = std::fs::read_to_string(PARAM) else {
        eprintln!("*** SKIPPING the io_uring backlog gate test: no {PARAM} ***");
        return;
    };
    if was.trim() != "Y" && unsafe { libc::geteuid() } != 0 {
        eprintln!("*** SKIPPING the io_uring backlog gate test: {PARAM} is off, not root ***");
        return;
    }
    let _restore = Restore(was);
    a_writer_waiting_on_the_backlog_does_not_keep_the_daemon_alive("uring");
}

/// Allocated bytes of a file (st_blocks).
fn allocated(p: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(p).unwrap().blocks() * 512
}

/// Files of 1 MiB and small ones, `bytes` in all, each fsynced.
fn write_bytes(root: &Path, seed: u64, bytes: u64) -> Tree {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut tree = Tree::new();
    let mut total = 0;
    let mut i = 0;
    while total < bytes {
        let rel = format!("d{}/b{seed}-{i}", i % 4);
        std::fs::create_dir_all(root.join(format!("d{}", i % 4))).unwrap();
        let len = if i % 3 == 0 {
            rng.gen_range(0..40_000)
        } else {
            1 << 20
        };
        let data: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
        let f = std::fs::File::create(root.join(&rel)).unwrap();
        std::io::Write::write_all(&mut &f, &data).unwrap();
        f.sync_all().unwrap();
        total += len as u64;
        tree.insert(rel, data);
        i += 1;
    }
    tree
}

/// Issue 20 step C through FUSE against the gateway: `--cache-size` a quarter of the data.
/// The writer's cache file stays within the bound (plus its superblocks and slots) while
/// mounted and after; a remount on the same cache and a mount on an empty cache (a cold mount:
/// nothing downloaded up front, timed) read every file back by fetching, within the bound;
/// `ldfs stats` counts the misses, bytes fetched and evictions; fsck of a cache holding only
/// some segments reads the rest from the store and is clean.
#[test]
fn a_cache_a_quarter_of_the_data_reads_every_file_back() {
    let Some(e) = env("bounded") else { return };
    const DATA: u64 = 32 << 20;
    const BOUND: u64 = DATA / 4;
    let c1 = e.path("c1.img");
    e.ldfs()
        .args(["mkfs", "--store", &e.url, "--cache"])
        .arg(&c1)
        .args(["--size", "128M", "--segment-size", "512K"])
        .args(["--cache-size", &BOUND.to_string()])
        .succeeds();
    let within = |cache: &Path, st: &serde_json::Value, what: &str| {
        let s = &st["store"];
        assert_eq!(s["cache_bound_bytes"].as_u64(), Some(BOUND), "{what}: {st}");
        let meta = s["cache_metadata_bytes"].as_u64().unwrap();
        let a = allocated(cache);
        assert!(
            a <= BOUND + meta,
            "{what}: the cache file holds {a} bytes, over the bound {BOUND} + {meta}: {st}"
        );
    };
    let d1 = e.path("d1");
    // The bound comes from the note mkfs wrote.
    let m = e.mount(&c1, &d1, &["upload=1"], false);
    let tree = write_bytes(&d1, 5, DATA);
    e.ldfs().args(["sync", "--remote"]).arg(&d1).succeeds();
    // The eviction thread runs after the upload: give it a moment.
    std::thread::sleep(Duration::from_millis(500));
    let st = stats_json(&d1);
    within(&c1, &st, "after writing");
    assert!(st["store"]["cache_evictions"].as_u64().unwrap() > 0, "{st}");
    assert_same(&read_tree(&d1), &tree, "the writer reads back");
    let st = stats_json(&d1);
    within(&c1, &st, "after reading");
    assert!(st["store"]["cache_misses"].as_u64().unwrap() > 0, "{st}");
    m.unmount();
    assert!(
        allocated(&c1) <= BOUND + (1 << 20),
        "after the unmount the cache file holds {} bytes",
        allocated(&c1)
    );
    // The same cache again.
    let m = e.mount(&c1, &d1, &[], false);
    assert_same(&read_tree(&d1), &tree, "a remount on the same cache");
    let st = stats_json(&d1);
    within(&c1, &st, "the remount after reading");
    m.unmount();
    fsck_clean(&e, &c1);
    // An empty cache: a cold mount, timed; every file fetched as read.
    let c2 = e.path("c2.img");
    let d2 = e.path("d2");
    let t = Instant::now();
    let m = e.mount_with(&c2, &d2, &[], &["--cache-size", &BOUND.to_string()]);
    let cold = t.elapsed();
    assert!(
        allocated(&c2) <= 2 << 20,
        "a cold mount wrote {} bytes before any read",
        allocated(&c2)
    );
    let t = Instant::now();
    assert_same(&read_tree(&d2), &tree, "a cold mount on an empty cache");
    let read = t.elapsed();
    let st = stats_json(&d2);
    within(&c2, &st, "the cold mount after reading");
    let s = &st["store"];
    assert!(
        s["cache_misses"].as_u64().unwrap() > 0 && s["cache_evictions"].as_u64().unwrap() > 0,
        "{st}"
    );
    println!(
        "cold mount of {} MiB in the store: usable in {:.2} s; every file read in {:.2} s ({:.1} MiB/s, {} bytes fetched)",
        DATA >> 20,
        cold.as_secs_f64(),
        read.as_secs_f64(),
        (DATA >> 20) as f64 / read.as_secs_f64(),
        s["cache_bytes_fetched"]
    );
    m.unmount();
    fsck_clean(&e, &c2);
    inspect_reads_from_the_store(&e, &c2);
}

/// `ldfs inspect --segment S` of a segment the cache `cache` holds only in the store shows
/// its partial segments (read from its object), not the hole's "no valid summary".
fn inspect_reads_from_the_store(e: &Env, cache: &Path) {
    use ldfs::device::{Device, FileDevice};
    let dev = FileDevice::open_read_only(cache).unwrap();
    let (geo, _) = ldfs::lld::mkfs::read_superblock(&dev).unwrap();
    let map = ldfs_tools::cli::store::map_path(cache);
    let evicted = ldfs::store::cache::read_map(&map, &geo).unwrap().unwrap();
    // The durable map may still list a segment fetched back since (it leaves the map at a
    // later write of it): take one that is a hole.
    let mut page = vec![0u8; 4096];
    let s = evicted
        .iter()
        .map(|e| e.segment)
        .find(|&s| {
            dev.read_at(&mut page, geo.page_addr(ldfs::lld::SegmentId(s), 0))
                .unwrap();
            page.iter().all(|&b| b == 0)
        })
        .expect("no segment of the cache is a hole");
    let out = e
        .ldfs()
        .arg("inspect")
        .arg(cache)
        .args(["--segment", &s.to_string()])
        .succeeds();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!("segment {s} summaries\n  page 0: epoch")),
        "inspect of segment {s}, in the store only: {text}"
    );
}

/// A read-only mount on an empty cache a quarter of the data's size. Before, a read-only mount
/// downloaded the file system whole before it mounted (a reader beside a writer must not
/// depend on objects the writer deletes); now it pins the checkpoint it mounts
/// (`store::readers`) and fetches segments as it reads. It mounts having written little to
/// its cache, and reads the tree of its checkpoint whole and exact, within its bound, while the
/// writer beside it deletes and rewrites every file and uploads several times. Unmounted, its
/// pin goes, and the writer's next upload deletes what only the pin kept.
#[test]
fn a_read_only_mount_on_a_small_cache_reads_its_tree_while_the_writer_rewrites_it() {
    use ldfs::store::ObjectStore;
    let Some(e) = env("reader") else { return };
    const DATA: u64 = 16 << 20;
    const BOUND: u64 = DATA / 4;
    let c1 = e.path("c1.img");
    e.ldfs()
        .args(["mkfs", "--store", &e.url, "--cache"])
        .arg(&c1)
        .args(["--size", "128M", "--segment-size", "512K", "--sparse"])
        .succeeds();
    let d1 = e.path("d1");
    let m = e.mount(&c1, &d1, &["upload=1"], false);
    let tree = write_bytes(&d1, 7, DATA);
    e.ldfs().args(["sync", "--remote"]).arg(&d1).succeeds();
    let c2 = e.path("c2.img");
    let d2 = e.path("d2");
    let t = Instant::now();
    // Not refreshed (`refresh=0`): the tree of the checkpoint it pinned, until it is asked.
    let ro = e.mount_with(
        &c2,
        &d2,
        &["ro", "refresh=0"],
        &["--cache-size", &BOUND.to_string()],
    );
    let usable = t.elapsed();
    assert!(
        allocated(&c2) <= 2 << 20,
        "a read-only mount wrote {} bytes to its cache before any read",
        allocated(&c2)
    );
    let store = e.store();
    let pins = store.list("readers/").unwrap();
    assert_eq!(pins.len(), 1, "{pins:?}");
    // The writer replaces everything, uploading after each step.
    for rel in tree.keys() {
        std::fs::remove_file(d1.join(rel)).unwrap();
    }
    e.ldfs().args(["sync", "--remote"]).arg(&d1).succeeds();
    let new = write_bytes(&d1, 8, DATA);
    for i in 0..3 {
        std::fs::write(d1.join(format!("small{i}")), [i as u8; 100]).unwrap();
        e.ldfs().args(["sync", "--remote"]).arg(&d1).succeeds();
    }
    let t = Instant::now();
    assert_same(
        &read_tree(&d2),
        &tree,
        "the read-only mount after the writer rewrote everything",
    );
    let read = t.elapsed();
    let st = stats_json(&d2);
    let s = &st["store"];
    let newest = store.list("ckpt/").unwrap().pop().unwrap().key;
    assert_eq!(s["behind_the_store"], true, "{st}");
    assert_eq!(s["store_newest_checkpoint"], newest.as_str(), "{st}");
    let text = String::from_utf8(e.ldfs().arg("stats").arg(&d2).succeeds().stdout).unwrap();
    assert!(
        text.contains(&format!("the store's newest is {newest}"))
            && text.contains("at its next refresh"),
        "{text}"
    );
    let meta = s["cache_metadata_bytes"].as_u64().unwrap();
    assert!(
        allocated(&c2) <= BOUND + meta,
        "the reader's cache holds {} bytes, over its bound {BOUND} + {meta}: {st}",
        allocated(&c2)
    );
    assert_eq!(s["read_only"], true, "{st}");
    assert_eq!(s["cache_bound_bytes"].as_u64(), Some(BOUND), "{st}");
    assert!(
        s["pinned_checkpoint"]
            .as_str()
            .unwrap()
            .starts_with("ckpt/")
            && s["cache_misses"].as_u64().unwrap() > 0
            && s["cache_evictions"].as_u64().unwrap() > 0,
        "{st}"
    );
    println!(
        "read-only mount of {} MiB in the store on an empty {} MiB cache: usable in {:.2} s; \
         every file read in {:.2} s",
        DATA >> 20,
        BOUND >> 20,
        usable.as_secs_f64(),
        read.as_secs_f64()
    );
    ro.unmount();
    assert!(
        store.list("readers/").unwrap().is_empty(),
        "the unmount deletes the pin"
    );
    std::fs::write(d1.join("after"), b"after").unwrap();
    e.ldfs().args(["sync", "--remote"]).arg(&d1).succeeds();
    let t = Instant::now();
    while store.list("ckpt/").unwrap().len() > 2 {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "the pinned checkpoint outlived its pin: {:?}",
            store.list("ckpt/").unwrap()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_same(&read_tree(&d1), &new, "the writer");
    m.unmount();
}

/// A read-only mount follows the writer's uploads (`fuse::refresh`): asked for with `ldfs sync
/// --remote` on it, and every `refresh=` seconds. Before, it showed the checkpoint it mounted
/// until it was mounted again. What the kernel cached of the old tree goes with it: a file read
/// before and rewritten since is read anew (its pages and size), a name looked up before and
/// removed since is gone, a name looked up and found absent before and made since is found, a
/// directory renamed since is found under its new name only. A file held open across the
/// refresh reads on. The old pin goes with the refresh, and the store's newest is what the
/// mount says it shows.
#[test]
fn a_read_only_mount_moves_to_the_writers_newer_uploads() {
    use ldfs::store::ObjectStore;
    let Some(e) = env("refresh") else { return };
    // noatime: the writer's reads of its own tree change nothing, so it uploads only what the
    // test writes (and the store's newest stays what the reader moved to).
    let (c1, d1, m) = e.writer(&["upload=1", "noatime"]);
    let put = |rel: &str, data: &[u8]| {
        let p = d1.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, data).unwrap();
    };
    // Segments the writer never changes, which the reader reads before its refresh.
    put("big/stay", &pattern(8, 12_000_000));
    put("d0/a", &pattern(1, 300_000));
    put("d0/b", &pattern(2, 5_000));
    put("d1/keep", &pattern(3, 70_000));
    e.ldfs().args(["sync", "--remote"]).arg(&d1).succeeds();
    let store = e.store();
    settled_newest(&store);
    let d2 = e.path("d2");
    let ro = e.mount(&e.path("c2.img"), &d2, &["ro", "refresh=0"], false);
    assert_same(
        &read_tree(&d2),
        &read_tree(&d1),
        "the read-only mount at first",
    );
    // What the kernel then holds: a's pages, b's name, n's absence, d1's name, keep open.
    assert!(std::fs::metadata(d2.join("d0/b")).is_ok());
    assert!(std::fs::metadata(d2.join("d0/n")).is_err());
    let mut held = std::fs::File::open(d2.join("d1/keep")).unwrap();
    // The writer moves on.
    put("d0/a", &pattern(4, 120_000));
    std::fs::remove_file(d1.join("d0/b")).unwrap();
    put("d0/n", &pattern(5, 10_000));
    std::fs::rename(d1.join("d1"), d1.join("d9")).unwrap();
    put("d3/new", &pattern(6, 3_000_000));
    e.ldfs().args(["sync", "--remote"]).arg(&d1).succeeds();
    let want = read_tree(&d1);
    // The writer's window may upload once more after `sync --remote` (the checkpoint it made
    // is itself a change): the store's newest once it stops moving.
    let newest = settled_newest(&store);
    // Not refreshed yet (refresh=0): the old tree, and the mount says the store moved on.
    assert_eq!(std::fs::read(d2.join("d0/a")).unwrap(), pattern(1, 300_000));
    assert_eq!(stats_json(&d2)["store"]["behind_the_store"], true);
    let out = e.ldfs().args(["sync", "--remote"]).arg(&d2).succeeds();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("moved from") && said.contains(&newest),
        "{said}"
    );
    // The segments the reader had fetched whose objects the new checkpoint still names stay
    // in its cache: big/stay reads again (its pages dropped) fetching at most the segments
    // rewritten since (its inode's, the one the log was filling), not its 12 MB.
    let kept: u64 = said
        .trim()
        .split("; ")
        .find_map(|p| p.strip_suffix(" cached segments kept"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no count of segments kept: {said}"));
    assert!(kept > 0, "{said}");
    assert!(std::fs::metadata(d2.join("big/stay")).is_ok());
    let fetched = || {
        stats_json(&d2)["store"]["cache_bytes_fetched"]
            .as_u64()
            .unwrap()
    };
    let before = fetched();
    std::fs::write("/proc/sys/vm/drop_caches", "1").unwrap();
    assert!(std::fs::read(d2.join("big/stay")).unwrap() == pattern(8, 12_000_000));
    let refetched = fetched() - before;
    eprintln!("refresh: big/stay fetched {refetched} bytes again ({kept} segments kept)");
    assert!(
        refetched < 6_000_000,
        "big/stay fetched {refetched} bytes again after the refresh ({kept} segments kept)"
    );
    assert!(
        std::fs::metadata(d2.join("d0/b")).is_err(),
        "a name removed since is still there"
    );
    assert!(
        std::fs::metadata(d2.join("d0/n")).is_ok(),
        "a name made since is still absent"
    );
    assert!(!d2.join("d1").exists() && d2.join("d9").exists());
    assert_same(
        &read_tree(&d2),
        &want,
        "the read-only mount after its refresh",
    );
    let mut again = Vec::new();
    std::io::Read::read_to_end(&mut held, &mut again).unwrap();
    assert_eq!(
        again,
        pattern(3, 70_000),
        "a file held open across the refresh"
    );
    let st = stats_json(&d2);
    assert_eq!(st["store"]["pinned_checkpoint"], newest.as_str(), "{st}");
    assert_eq!(st["store"]["behind_the_store"], false, "{st}");
    assert_eq!(
        store.list("readers/").unwrap().len(),
        1,
        "the refresh deletes the old pin"
    );
    // A tool asking for the answer's size first (getfattr) is given room for any answer
    // without a refresh, which happens once, at the read.
    let query = std::ffi::CString::new("trusted.ldfs.refresh").unwrap();
    let dir = std::ffi::CString::new(d2.as_os_str().as_encoded_bytes()).unwrap();
    let room = unsafe { libc::getxattr(dir.as_ptr(), query.as_ptr(), std::ptr::null_mut(), 0) };
    assert_eq!(room, 4096, "the size of the refresh query's answer");
    let mut buf = vec![0u8; room as usize];
    let n = unsafe {
        libc::getxattr(
            dir.as_ptr(),
            query.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    assert!(n > 0, "{}", std::io::Error::last_os_error());
    let said = String::from_utf8_lossy(&buf[..n as usize]);
    assert!(said.contains("at the store's newest"), "{said}");
    // Nothing newer: nothing moves.
    let out = e.ldfs().args(["sync", "--remote"]).arg(&d2).succeeds();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("at the store's newest"), "{said}");
    // Every second on its own.
    let d3 = e.path("d3");
    let ro3 = e.mount(&e.path("c3.img"), &d3, &["ro", "refresh=1"], false);
    assert_same(&read_tree(&d3), &want, "a second read-only mount");
    put("d0/late", &pattern(7, 50_000));
    e.ldfs().args(["sync", "--remote"]).arg(&d1).succeeds();
    let t = Instant::now();
    while std::fs::read(d3.join("d0/late")).ok() != Some(pattern(7, 50_000)) {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "refresh=1 did not show an upload within 30 s"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_same(&read_tree(&d3), &read_tree(&d1), "the refreshing mount");
    drop(held);
    ro.unmount();
    ro3.unmount();
    assert!(store.list("readers/").unwrap().is_empty(), "pins left");
    m.unmount();
    // A read-write mount refuses refresh=, as a local image does.
    let why = e.mount_refused_with(&["refresh=5"], &c1, &d1);
    assert!(why.contains("refresh= is for a read-only mount"), "{why}");
}

/// The store's newest checkpoint object once it has not changed for 3 s (a writer's window
/// uploads what its own last checkpoint wrote, within a second or two at `upload=1`).
fn settled_newest(store: &dyn ldfs::store::ObjectStore) -> String {
    let newest = || store.list("ckpt/").unwrap().pop().unwrap().key;
    let t = Instant::now();
    let mut seen = newest();
    loop {
        std::thread::sleep(Duration::from_secs(3));
        let now = newest();
        if now == seen {
            return now;
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "the writer kept uploading"
        );
        seen = now;
    }
}

/// Review 48, finding 1: a read-only store mount refused after its pin was taken (the mount
/// point gone before the FUSE mount, so `Session::new` fails) must delete its pin on the way
/// out, as it did before the refresher: `Refresher` and `Refreshing` hold each other (`slot`,
/// `refresher`), so neither is dropped, nor the `Served` whose `ReaderMount` holds the pin,
/// and the pin stays in the store (the writer keeps that checkpoint's objects) until it
/// expires. The race (the mount point removed once the pin shows, before the mount) is
/// retried when the mount wins it.
#[test]
fn review48_a_read_only_mount_refused_after_its_pin_leaves_no_pin() {
    use ldfs::store::ObjectStore;
    let Some(e) = env("r48pin") else { return };
    let (_, d1, m) = e.writer(&["upload=1", "noatime"]);
    std::fs::write(d1.join("f"), pattern(1, 100_000)).unwrap();
    e.ldfs().args(["sync", "--remote"]).arg(&d1).succeeds();
    let store = e.store();
    assert!(store.list("readers/").unwrap().is_empty());
    let mut refused = None;
    for attempt in 0..10 {
        let d2 = e.path(&format!("ro{attempt}"));
        std::fs::create_dir_all(&d2).unwrap();
        let mut child = e
            .ldfs()
            .args(["mount", "-f", "-o", "ro,refresh=0", &e.url])
            .arg(&d2)
            .arg("--cache")
            .arg(e.path(&format!("c-ro{attempt}.img")))
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let t = Instant::now();
        while store.list("readers/").unwrap().is_empty() {
            assert!(t.elapsed() < Duration::from_secs(60), "no pin in 60 s");
            if child.try_wait().unwrap().is_some() || is_mounted(&d2) {
                break;
            }
        }
        // Before the FUSE mount: the mount point goes.
        let _ = std::fs::remove_dir(&d2);
        let out = child.wait_with_output().unwrap();
        if (d2.exists() && is_mounted(&d2)) || out.status.success() {
            let _ = Command::new("fusermount3")
                .args(["-u", "-z"])
                .arg(&d2)
                .status();
            continue; // the mount won the race
        }
        refused = Some(String::from_utf8_lossy(&out.stderr).into_owned());
        break;
    }
    // The race is the test's, not the mount's: a machine where every mount wins it checks
    // nothing this run, and says so (each try is a real mount, so a bounded number).
    let Some(why) = refused else {
        eprintln!("review48 pin probe: the mount won the race in 10 tries; nothing checked");
        m.unmount();
        return;
    };
    assert!(
        why.contains("mounting on"),
        "refused for another reason: {why}"
    );
    let pins = store.list("readers/").unwrap();
    assert!(
        pins.is_empty(),
        "a read-only mount refused at its FUSE mount left its pin {:?} (it keeps the writer from \
         deleting until it expires); its stderr: {why}",
        pins.iter().map(|o| &o.key).collect::<Vec<_>>()
    );
    m.unmount();
}

/// Review 48, finding 2: a refresh serves the new engine before it tells the kernel what
/// changed (`Refresher::refresh`: the slot is swapped, then the old engine closed, its pin
/// deleted and `changes` read on the new tree, with requests served again, then the
/// notifications), so meanwhile the kernel's caches of the old tree and the new engine answer
/// together: a file whose first half the kernel holds (old pages) and whose second half it
/// reads reads as neither version. A reader hammers such a file while the mount refreshes
/// (the kernel holding many directories, whose names `changes` reads on the new tree's cold
/// cache); every whole read must be one version, but for a read under way across the swap
/// itself (its first half from the kernel's pages before the swap, its second half read
/// after it), which no order of the refresh's steps avoids: at most three per refresh (found:
/// 4 to 10 in most refreshes, all after the swap; with `changes` read before the swap and the
/// notifications sent at once after it, 1).
#[test]
fn review48_a_refresh_never_serves_a_mix_of_the_old_and_the_new_tree() {
    use std::os::unix::fs::FileExt;
    use std::os::unix::io::AsRawFd;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;
    let Some(e) = env("r48mix") else { return };
    let (_, d1, m) = e.writer(&["upload=1", "noatime"]);
    const HALF: usize = 1 << 20;
    std::fs::create_dir_all(d1.join("d0")).unwrap();
    std::fs::write(d1.join("d0/a"), pattern(0, 2 * HALF)).unwrap();
    for i in 0..150 {
        let d = d1.join(format!("many/{i}"));
        std::fs::create_dir_all(&d).unwrap();
        for j in 0..10 {
            std::fs::write(d.join(format!("f{j}")), b"x").unwrap();
        }
    }
    e.ldfs().args(["sync", "--remote"]).arg(&d1).succeeds();
    let d2 = e.path("d2");
    let ro = e.mount(&e.path("c2.img"), &d2, &["ro", "refresh=0"], false);
    let mixed = Arc::new(AtomicUsize::new(0));
    let reads = Arc::new(AtomicUsize::new(0));
    let mut per_round = Vec::new();
    for round in 1..=4u64 {
        let before = mixed.load(Ordering::Relaxed);
        // The kernel holds every directory, and the first half of a's pages.
        fn walk(p: &Path) {
            for e in std::fs::read_dir(p).unwrap() {
                let e = e.unwrap();
                if std::fs::metadata(e.path()).unwrap().is_dir() {
                    walk(&e.path());
                }
            }
        }
        walk(&d2);
        let f = std::fs::File::open(d2.join("d0/a")).unwrap();
        let mut first = vec![0u8; HALF];
        f.read_exact_at(&mut first, 0).unwrap();
        drop(f);
        std::fs::write(d1.join("d0/a"), pattern(round, 2 * HALF)).unwrap();
        std::fs::write(d1.join(format!("many/{round}/new")), b"y").unwrap();
        e.ldfs().args(["sync", "--remote"]).arg(&d1).succeeds();
        let stop = Arc::new(AtomicBool::new(false));
        let hammer = {
            let (stop, mixed, reads, path) =
                (stop.clone(), mixed.clone(), reads.clone(), d2.join("d0/a"));
            std::thread::spawn(move || {
                let (old, new) = (pattern(round - 1, 2 * HALF), pattern(round, 2 * HALF));
                let mut buf = vec![0u8; 2 * HALF];
                while !stop.load(Ordering::Relaxed) {
                    let Ok(f) = std::fs::File::open(&path) else {
                        continue;
                    };
                    // The second half read from the engine each time; the first stays cached.
                    unsafe {
                        libc::posix_fadvise(
                            f.as_raw_fd(),
                            HALF as i64,
                            HALF as i64,
                            libc::POSIX_FADV_DONTNEED,
                        )
                    };
                    let Ok(n) = f.read_at(&mut buf, 0) else {
                        continue;
                    };
                    reads.fetch_add(1, Ordering::Relaxed);
                    let got = &buf[..n];
                    if got != &old[..] && got != &new[..] {
                        let first_old = got.len() >= HALF && got[..HALF] == old[..HALF];
                        let second_new = got.len() == 2 * HALF && got[HALF..] == new[HALF..];
                        eprintln!(
                            "round {round}: a read of {n} bytes is neither version (first half \
                             old: {first_old}, second half new: {second_new})"
                        );
                        mixed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        };
        std::thread::sleep(Duration::from_millis(300));
        let out = e.ldfs().args(["sync", "--remote"]).arg(&d2).succeeds();
        let said = String::from_utf8_lossy(&out.stdout).into_owned();
        std::thread::sleep(Duration::from_millis(300));
        stop.store(true, Ordering::Relaxed);
        hammer.join().unwrap();
        assert!(said.contains("moved from"), "{said}");
        assert_eq!(
            std::fs::read(d2.join("d0/a")).unwrap(),
            pattern(round, 2 * HALF),
            "round {round}: a after the refresh"
        );
        per_round.push(mixed.load(Ordering::Relaxed) - before);
    }
    eprintln!(
        "{} whole reads of a during 4 refreshes, {per_round:?} of them neither version",
        reads.load(Ordering::Relaxed),
    );
    // At most 3: the read across the swap, and on a loaded machine one or two more while the
    // refresh thread waits for a CPU between the swap and its first notification.
    assert!(
        per_round.iter().all(|&n| n <= 3),
        "reads during a refresh mixed the kernel's pages of the old tree with the new engine's \
         (per refresh: {per_round:?}): the new engine served while the kernel still held the \
         old tree's pages"
    );
    ro.unmount();
    m.unmount();
}

/// Review 49, finding 1: a tool asking a read-only mount for a refresh (`ldfs sync --remote`,
/// the `trusted.ldfs.refresh` query) holds a FUSE thread until the refresh it waits for is done
/// (`Refresher::request`), and that refresh ends by telling the kernel what changed
/// (`tell_kernel`), which for a name waits for the directory's lock in the kernel. A lookup in
/// that directory holds the lock while its request waits for a free FUSE thread: with as many
/// askers as threads, none is free, the notification never ends, the refresh never answers,
/// and the mount hangs for good (killing the askers frees no thread: they stay in `request`).
/// Askers (more than `FUSE_THREADS`) ask in a loop, the writer adds names to the root and
/// uploads, and a looker looks up new names in the reader's root; its lookups must keep going.
/// On a hang the probe aborts the FUSE connection to clean up.
#[test]
fn review49_askers_waiting_for_a_refresh_never_starve_its_notifications() {
    use std::os::unix::fs::MetadataExt;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    let Some(e) = env("r49ask") else { return };
    let (_, d1, m) = e.writer(&["upload=1", "noatime"]);
    std::fs::write(d1.join("seed"), b"s").unwrap();
    e.ldfs().args(["sync", "--remote"]).arg(&d1).succeeds();
    let d2 = e.path("d2");
    let mut ro = e.mount(&e.path("c2.img"), &d2, &["ro", "refresh=0"], false);
    let dev = std::fs::metadata(&d2).unwrap().dev();
    let conn = ((dev >> 12) & 0xfff00) | (dev & 0xff);
    let stop = Arc::new(AtomicBool::new(false));
    let (looked, moved) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut threads = Vec::new();
    for _ in 0..24 {
        let (stop, moved, d2, vars) = (stop.clone(), moved.clone(), d2.clone(), e.vars.clone());
        threads.push(std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let out = ldfs()
                    .envs(&vars)
                    .args(["sync", "--remote"])
                    .arg(&d2)
                    .output()
                    .unwrap();
                if String::from_utf8_lossy(&out.stdout).contains("moved from") {
                    moved.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    {
        let (stop, d1, vars) = (stop.clone(), d1.clone(), e.vars.clone());
        threads.push(std::thread::spawn(move || {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                for _ in 0..20 {
                    i += 1;
                    std::fs::write(d1.join(format!("w{i}")), b"w").unwrap();
                }
                let _ = ldfs()
                    .envs(&vars)
                    .args(["sync", "--remote"])
                    .arg(&d1)
                    .output();
            }
        }));
    }
    {
        let (stop, looked, d2) = (stop.clone(), looked.clone(), d2.clone());
        threads.push(std::thread::spawn(move || {
            let mut k = 0u64;
            while !stop.load(Ordering::Relaxed) {
                k += 1;
                let _ = std::fs::symlink_metadata(d2.join(format!("nx{k}")));
                let _ = std::fs::symlink_metadata(d2.join(format!("w{k}")));
                looked.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    let t = Instant::now();
    let (mut last, mut since) = (0, Instant::now());
    let mut hung = None;
    while t.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(500));
        let now = looked.load(Ordering::Relaxed);
        if now != last {
            (last, since) = (now, Instant::now());
        } else if since.elapsed() > Duration::from_secs(20) {
            hung = Some(t.elapsed());
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    if hung.is_some() {
        let _ = std::fs::write(format!("/sys/fs/fuse/connections/{conn}/abort"), b"1");
    }
    for th in threads {
        th.join().unwrap();
    }
    let refreshes = moved.load(Ordering::Relaxed);
    if let Some(at) = hung {
        let _ = Command::new("fusermount3")
            .args(["-u", "-z"])
            .arg(&d2)
            .status();
        let c = ro.child.as_mut().unwrap();
        let _ = c.kill();
        let _ = c.wait();
        m.unmount();
        panic!(
            "the read-only mount hung at {at:?} (no lookup in its root for 20 s, {last} before, \
             {refreshes} refreshes moved): askers waiting for a refresh held every FUSE thread \
             while the refresh's notification waited for a lookup that needs one"
        );
    }
    eprintln!("{last} lookups, {refreshes} refreshes moved; no hang");
    assert!(refreshes > 0, "no refresh moved: nothing checked");
    ro.unmount();
    m.unmount();
}

/// A read-only mount whose refresh failed (every request EIO): the writer made `late` after
/// the reader cached its absence; the mount of `e`'s writer at `d1`, the reader at `d2` (cache
/// `c2`, its daemon's stderr in `reader.log`). The cache file made immutable (`chattr +i`)
/// fails both rebuilds of the refresh `ldfs sync --remote` asks for, and stays so until the
/// refresh thread's own tries after 1, 2 and 4 s more failed too (`refresh::FIRST_RETRY`,
/// doubling): its next comes 8 s after the last, so a caller asking at once is the one that
/// recovers the mount (review 52: with 4 s, a caller slower than that under load would find
/// the mount recovered already).
fn broken_reader(e: &Env) -> (PathBuf, StoreMount, PathBuf, StoreMount) {
    let (_, d1, m) = e.writer(&["upload=1", "noatime"]);
    std::fs::write(d1.join("seed"), b"s").unwrap();
    e.ldfs().args(["sync", "--remote"]).arg(&d1).succeeds();
    let (c2, d2, log) = (e.path("c2.img"), e.path("d2"), e.path("reader.log"));
    let ro = e.mount_logged(&c2, &d2, &["ro", "refresh=0"], &log);
    assert!(std::fs::symlink_metadata(d2.join("late")).is_err());
    std::fs::write(d1.join("late"), b"l").unwrap();
    e.ldfs().args(["sync", "--remote"]).arg(&d1).succeeds();
    Command::new("chattr").arg("+i").arg(&c2).succeeds();
    let out = e
        .ldfs()
        .args(["sync", "--remote"])
        .arg(&d2)
        .output()
        .unwrap();
    let t = Instant::now();
    let fourth = "the next in 8 s";
    let mut said_log = String::new();
    while !said_log.contains(fourth) && t.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(50));
        said_log = std::fs::read_to_string(&log).unwrap_or_default();
    }
    Command::new("chattr").arg("-i").arg(&c2).succeeds();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        said.contains("every request fails"),
        "the first refresh: {said}"
    );
    assert!(
        said_log.contains(fourth),
        "the refresh thread did not try again three times (its log: {said_log})"
    );
    (d1, m, d2, ro)
}

/// The refresh query itself (what `ldfs sync --remote` asks on a read-only mount).
fn ask_refresh(d: &Path) -> String {
    let path = std::ffi::CString::new(d.as_os_str().as_encoded_bytes()).unwrap();
    let mut buf = vec![0u8; 4096];
    let n = unsafe {
        libc::getxattr(
            path.as_ptr(),
            c"trusted.ldfs.refresh".as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    assert!(n >= 0, "{}", std::io::Error::last_os_error());
    String::from_utf8_lossy(&buf[..n as usize]).into_owned()
}

/// Review 49, finding 2: a refresh that recovers from a failed one (both rebuilds failed: every
/// request EIO, `Refresher::refresh`'s `broken`) invalidates the inodes the kernel holds but
/// no name: the kernel's entries of the tree before the failure stay for their `ENTRY_TTL`
/// (30 s). A name the reader looked up before it existed (a negative entry) and the writer
/// then made stays missing on the reader after the recovery moved it to a tree that has it.
#[test]
fn review49_a_refresh_after_a_failed_one_leaves_no_stale_name() {
    let Some(e) = env("r49neg") else { return };
    let (_, m, d2, ro) = broken_reader(&e);
    let again = ask_refresh(&d2);
    let got = std::fs::symlink_metadata(d2.join("late")).map(|_| ());
    ro.unmount();
    m.unmount();
    assert!(again.contains("moved from"), "the second refresh: {again}");
    assert!(
        got.is_ok(),
        "after a refresh recovered from a failed one, `late` (made by the writer, in the tree \
         the mount moved to) is still missing on the reader ({got:?}): the kernel's negative \
         entry from before the failure was never invalidated"
    );
}

/// Review 49, finding 3: `ldfs sync --remote`, the way to ask a read-only mount for a refresh,
/// cannot ask the one that would end a failed refresh's EIO: it syncs the mount first
/// (`cli::mod`'s `Cmd::Sync`: `sync::run`, then `sync::read_only`), which fails with EIO, so a
/// mount with `refresh=0` stays failed until it is unmounted.
#[test]
fn review49_ldfs_sync_remote_recovers_a_failed_refresh() {
    let Some(e) = env("r49cli") else { return };
    let (_, m, d2, ro) = broken_reader(&e);
    let out = e
        .ldfs()
        .args(["sync", "--remote"])
        .arg(&d2)
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    ro.unmount();
    m.unmount();
    assert!(
        out.status.success() && said.contains("moved from"),
        "`ldfs sync --remote` on a mount whose refresh failed: {said}"
    );
}

/// Review 48's note: a read-only mount whose refresh failed (both rebuilds: every request EIO)
/// stayed failing until the next period, or with `refresh=0` until someone asked. Now the
/// refresh thread tries again after 1 s, doubling: once the cause is gone (here the cache
/// file made mutable again after three tries failed, so the fourth comes 8 s later; in use, a
/// store back after a brief outage) the mount serves the newer tree without anyone asking.
#[test]
fn a_failed_refresh_is_tried_again_without_asking() {
    let Some(e) = env("refretry") else { return };
    let (_, m, d2, ro) = broken_reader(&e);
    let t = Instant::now();
    let mut got = std::fs::read(d2.join("late"));
    while got.is_err() && t.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(100));
        got = std::fs::read(d2.join("late"));
    }
    let waited = t.elapsed();
    ro.unmount();
    m.unmount();
    assert_eq!(
        got.as_deref().ok(),
        Some(&b"l"[..]),
        "20 s after a refresh left every request failing (and its cause was gone), the \
         `refresh=0` mount still fails ({got:?}): nothing tried again without being asked"
    );
    eprintln!("the mount served again {waited:?} after the failed refresh");
}
