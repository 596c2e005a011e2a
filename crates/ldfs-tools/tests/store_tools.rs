//! fsck, inspect and clean given the cache of a store-backed file system, against the real
//! gateway (issue 20: "fsck, inspect and clean work on a store-backed file system"): the cache
//! is recognised by its note and said so; `fsck -n` checks the cache and, with the store's
//! environment, that every segment object the newest checkpoint object names is there with its
//! size (a missing or short one is reported naming its key and segment); `fsck -y` and an
//! offline `clean` are refused, saying to mount and use the online commands, and change nothing.
//! And a long write goes up while it is being written, not at the next upload window: the
//! segments as the log leaves them (DESIGN "Segments go up as the log leaves them").

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{fuse_usable, is_mounted, ldfs, Succeeds};
use ldfs::store::{ObjectStore, S3Config, S3Store};
use ldfs::testing::ceph::{gateway, unique_bucket, Gateway};

struct Env {
    vars: BTreeMap<String, String>,
    bucket: String,
    url: String,
    scratch: tempfile::TempDir,
}

fn env() -> Option<Env> {
    if !fuse_usable() {
        return None;
    }
    let vars = match gateway() {
        Gateway::Ready(v) => v,
        Gateway::Skip(why) => {
            eprintln!("*** SKIPPING the store tools test: {why} ***");
            return None;
        }
    };
    std::fs::create_dir_all("/var/tmp/s3tools-tests").unwrap();
    let bucket = unique_bucket("tools");
    Some(Env {
        vars,
        url: format!("s3://{bucket}/fs"),
        bucket,
        scratch: tempfile::tempdir_in("/var/tmp/s3tools-tests").unwrap(),
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
    /// Deletes every object of the run's bucket, then the bucket.
    fn remove_bucket(&self) {
        let cfg = S3Config::from_vars(&self.bucket, "", |k| self.vars.get(k).cloned()).unwrap();
        let b = S3Store::new(&cfg).unwrap();
        for o in b.list("").unwrap() {
            b.delete(&o.key).unwrap();
        }
        b.delete_bucket().unwrap();
    }
    /// The file system's prefix of the bucket, through the client the mounts use.
    fn store(&self) -> S3Store {
        let cfg = S3Config::from_vars(&self.bucket, "fs", |k| self.vars.get(k).cloned()).unwrap();
        S3Store::new(&cfg).unwrap()
    }
}

/// `ldfs mount -f` as a child, unmounted (and waited for) on drop.
struct Mounted {
    dir: PathBuf,
    child: Option<Child>,
}

impl Mounted {
    fn new(e: &Env, cache: &Path, dir: &Path) -> Mounted {
        Mounted::with(e, cache, dir, &[])
    }
    fn with(e: &Env, cache: &Path, dir: &Path, opts: &[&str]) -> Mounted {
        std::fs::create_dir_all(dir).unwrap();
        let mut child = e
            .ldfs()
            .args(["mount", "-f", &e.url])
            .arg(dir)
            .arg("--cache")
            .arg(cache)
            .args(opts.iter().flat_map(|o| ["-o", o]))
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let t = Instant::now();
        while !is_mounted(dir) {
            if let Some(st) = child.try_wait().unwrap() {
                panic!("ldfs mount {} exited with {st} before mounting", e.url);
            }
            assert!(t.elapsed() < Duration::from_secs(60), "mount timed out");
            std::thread::sleep(Duration::from_millis(20));
        }
        Mounted {
            dir: dir.to_path_buf(),
            child: Some(child),
        }
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
}

impl Drop for Mounted {
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

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn digest(p: &Path) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    std::fs::read(p).unwrap().hash(&mut h);
    h.finish()
}

#[test]
fn fsck_inspect_and_clean_on_a_store_cache() {
    let Some(e) = env() else { return };
    let cache = e.path("c.img");
    e.ldfs()
        .args(["mkfs", "--store", &e.url, "--cache"])
        .arg(&cache)
        .args(["--size", "96M", "--sparse"])
        .succeeds();
    // A few segments of data, uploaded and unmounted.
    let d = e.path("d");
    let m = Mounted::new(&e, &cache, &d);
    for i in 0..6u8 {
        std::fs::write(d.join(format!("f{i}")), vec![i; 1 << 20]).unwrap();
    }
    e.ldfs().args(["sync", "--remote"]).arg(&d).succeeds();
    m.unmount();

    // fsck -n with the store's environment: the cache is clean and the store complete.
    let out = e.ldfs().args(["fsck", "-n"]).arg(&cache).output().unwrap();
    let t = text(&out);
    assert_eq!(out.status.code(), Some(0), "{t}");
    assert!(
        t.contains(&format!(
            "is the cache of the store-backed file system {}",
            e.url
        )),
        "{t}"
    );
    assert!(t.contains("are there with their sizes"), "{t}");
    // Without it: the cache is checked, the store is said not to be.
    let out = ldfs()
        .env_remove("AWS_ACCESS_KEY_ID")
        .env("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
        .args(["fsck", "-n"])
        .arg(&cache)
        .output()
        .unwrap();
    let t = text(&out);
    assert_eq!(out.status.code(), Some(0), "{t}");
    assert!(t.contains("NOTE: the store was not checked"), "{t}");

    // inspect says what the cache is, in text and JSON.
    let out = ldfs().arg("inspect").arg(&cache).succeeds();
    let t = text(&out);
    assert!(t.starts_with("store cache\n") && t.contains(&e.url), "{t}");
    let out = ldfs().args(["inspect", "--json"]).arg(&cache).succeeds();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["store"]["url"], e.url.as_str(), "{v}");

    // Repairs and offline cleaning are refused and change nothing.
    let before = digest(&cache);
    let out = e.ldfs().args(["fsck", "-y"]).arg(&cache).output().unwrap();
    let t = text(&out);
    assert_eq!(out.status.code(), Some(16), "{t}");
    assert!(
        t.contains("behind the store's back") && t.contains(&format!("ldfs mount {} MNT", e.url)),
        "{t}"
    );
    let out = e.ldfs().arg("clean").arg(&cache).output().unwrap();
    let t = text(&out);
    assert!(!out.status.success(), "{t}");
    assert!(
        t.contains("cleaning it offline") && t.contains("ldfs clean MNT"),
        "{t}"
    );
    assert_eq!(
        digest(&cache),
        before,
        "a refused command changed the cache"
    );

    // A segment object cut short, another deleted: each named, with its segment; exit 4.
    let s = e.store();
    let segs: Vec<_> = s.list("seg/").unwrap();
    assert!(segs.len() >= 2, "{segs:?}");
    let (short, gone) = (&segs[0].key, &segs[1].key);
    s.put(short, b"not a segment").unwrap();
    s.delete(gone).unwrap();
    let out = e.ldfs().args(["fsck", "-n"]).arg(&cache).output().unwrap();
    let t = text(&out);
    assert_eq!(out.status.code(), Some(4), "{t}");
    let segment_of = |k: &str| u32::from_str_radix(&k["seg/".len().."seg/".len() + 8], 16).unwrap();
    assert!(
        t.contains(&format!(
            "PROBLEM: store: segment object {short} (segment {}) in {} holds 13 bytes",
            segment_of(short),
            e.url
        )),
        "{t}"
    );
    assert!(
        t.contains(&format!(
            "PROBLEM: store: segment object {gone} (segment {},",
            segment_of(gone)
        )) && t.contains("is missing"),
        "{t}"
    );
    e.remove_bucket();
}

/// With an upload window of 10 minutes, a 24 MiB write (12 segments of 2 MiB) is uploaded
/// while the mount goes on, without `sync --remote`: each segment the log left is put before
/// any checkpoint names it (`SegmentStore::segment_hook`, which the mount gives lld).
#[test]
fn a_long_write_goes_up_before_the_upload_window() {
    let Some(e) = env() else { return };
    let cache = e.path("c.img");
    e.ldfs()
        .args(["mkfs", "--store", &e.url, "--cache"])
        .arg(&cache)
        .args(["--size", "96M", "--sparse"])
        .succeeds();
    let d = e.path("d");
    let m = Mounted::with(&e, &cache, &d, &["upload=600"]);
    {
        use std::io::Write;
        let mut f = std::fs::File::create(d.join("big")).unwrap();
        for i in 0..24u8 {
            f.write_all(&vec![i; 1 << 20]).unwrap();
        }
        f.sync_all().unwrap();
    }
    let t = Instant::now();
    let (put, ahead) = loop {
        let out = ldfs().args(["stats", "--json"]).arg(&d).succeeds();
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let put = v["store"]["segment_bytes_put"].as_u64().unwrap();
        let ahead = v["store"]["segments_put_ahead"].as_u64().unwrap();
        if put >= 16 << 20 || t.elapsed() > Duration::from_secs(20) {
            break (put, ahead);
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        put >= 16 << 20,
        "{put} bytes of segments uploaded 20 s after a 24 MiB write, with upload=600"
    );
    // Without the hand-over (64 segments) or the window: the log's own leaving.
    assert!(ahead >= 8, "{ahead} segments put as the log left them");
    m.unmount();
    e.remove_bucket();
}
