//! Review 43's probes of 3b04d21 (review 42's findings fixed) through real FUSE mounts against
//! the gateway. Each probe fails while the defect its doc comment names is there.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{fuse_usable, is_mounted, ldfs, Succeeds};
use ldfs::testing::ceph::{gateway, unique_bucket, Gateway};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

struct Env {
    vars: BTreeMap<String, String>,
    url: String,
    bucket: String,
    scratch: tempfile::TempDir,
}

fn env(what: &str) -> Option<Env> {
    if !fuse_usable() {
        return None;
    }
    let vars = match gateway() {
        Gateway::Ready(v) => v,
        Gateway::Skip(why) => {
            eprintln!("*** SKIPPING the review 43 store probe: {why} ***");
            return None;
        }
    };
    std::fs::create_dir_all("/var/tmp/s3mount-tests").unwrap();
    let bucket = unique_bucket(what);
    Some(Env {
        vars,
        url: format!("s3://{bucket}/fs"),
        bucket,
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
    fn mount(&self, cache: &Path, dir: &Path, opts: &[&str], args: &[&str]) -> StoreMount {
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
        let mut child = c.stdin(Stdio::null()).spawn().unwrap();
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
}

struct StoreMount {
    dir: PathBuf,
    child: Option<Child>,
}

impl StoreMount {
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

/// Files of 1 MiB and small ones, `bytes` in all, each fsynced; their names.
fn write_bytes(root: &Path, seed: u64, bytes: u64) -> Vec<PathBuf> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut names = Vec::new();
    let mut total = 0;
    let mut i = 0;
    while total < bytes {
        std::fs::create_dir_all(root.join(format!("d{}", i % 4))).unwrap();
        let p = root.join(format!("d{}/b{seed}-{i}", i % 4));
        let len = if i % 3 == 0 {
            rng.gen_range(0..40_000)
        } else {
            1 << 20
        };
        let data: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
        let f = std::fs::File::create(&p).unwrap();
        std::io::Write::write_all(&mut &f, &data).unwrap();
        f.sync_all().unwrap();
        total += len as u64;
        names.push(p);
        i += 1;
    }
    names
}

/// The fsck change (review 42 finding 5's fix). `fsck -n` of a cache whose note says
/// `READER` exits 0 ("nothing to check") as soon as any segment it does not hold cannot be
/// fetched, and says they are "gone from the store since no mount pins its checkpoint"
/// without looking: it never checks whether the checkpoint the cache holds is still in the
/// store (or still the newest), nor what the fetch error was (`cache_view`'s `bad` holds
/// NotFound, a crc mismatch and an unreachable store alike). Here the store loses the
/// segment objects of its newest checkpoint, the very one the read-only cache was rebuilt
/// from: the file system in the store is damaged, and fsck -n of that cache says it is clean.
#[test]
fn fsck_of_a_readers_cache_calls_a_store_that_lost_its_newest_checkpoints_objects_clean() {
    use ldfs::store::{ObjectStore, S3Config, S3Store};
    let Some(e) = env("r43fsck") else { return };
    let c1 = e.path("c1.img");
    e.ldfs()
        .args(["mkfs", "--store", &e.url, "--cache"])
        .arg(&c1)
        .args(["--size", "128M", "--segment-size", "512K", "--sparse"])
        .succeeds();
    let d1 = e.path("d1");
    let w = e.mount(&c1, &d1, &["upload=1"], &[]);
    write_bytes(&d1, 1, 8 << 20);
    e.ldfs().args(["sync", "--remote"]).arg(&d1).succeeds();
    w.unmount();
    let c2 = e.path("c2.img");
    let d2 = e.path("d2");
    let ro = e.mount(
        &c2,
        &d2,
        &["ro"],
        &["--cache-size", &(4u64 << 20).to_string()],
    );
    ro.unmount();
    // No writer since: the store's newest checkpoint is the one c2 was rebuilt from. The
    // store then loses its segment objects (a bucket lifecycle rule, an operator's mistake).
    let cfg = S3Config::from_vars(&e.bucket, "fs", |k| e.vars.get(k).cloned()).unwrap();
    let s3 = S3Store::new(&cfg).unwrap();
    let segs = s3.list("seg/").unwrap();
    assert!(!segs.is_empty(), "setup: segment objects in the store");
    for o in &segs {
        s3.delete(&o.key).unwrap();
    }
    fails_fsck_n(
        &e,
        &c2,
        "whose checkpoint is still the store's newest, with every segment object of it gone \
         from the store",
    );
    // Review 44 finding E: the checkpoint objects damaged too (none decodes): the one the
    // cache holds may be among them, so this is still the store's damage, not "gone".
    for o in s3.list("ckpt/").unwrap() {
        s3.put(&o.key, b"not a checkpoint object").unwrap();
    }
    fails_fsck_n(
        &e,
        &c2,
        "every checkpoint object in the store damaged and every segment object gone",
    );
}

/// `ldfs fsck -n` of the read-only mount's cache `cache` must not exit clean (`what`: the
/// store's state, for the message).
fn fails_fsck_n(e: &Env, cache: &Path, what: &str) {
    let out = e.ldfs().args(["fsck", "-n"]).arg(cache).output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !out.status.success(),
        "fsck -n of a read-only mount's cache, {what}, exits {} (clean):\n{text}",
        out.status
    );
}
