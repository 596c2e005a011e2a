//! The S3 object store against a real gateway (Ceph's radosgw from `scripts/ceph.sh`): every
//! operation of `ObjectStore` on segment-sized objects, the conditional put the lease needs, the
//! errors a caller must tell apart, and the gateway's PUT/GET throughput for segment-sized
//! objects (printed: the yardstick for the upload path's figure in issue 20).

use std::time::Instant;

use ldfs::store::{ObjectStore, PutOutcome, S3Config, S3Store, StoreError};
use ldfs::testing::ceph::{gateway, unique_bucket, Gateway};
use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn store_or_skip(what: &str, prefix: &str) -> Option<(S3Config, S3Store)> {
    let vars = match gateway() {
        Gateway::Ready(v) => v,
        Gateway::Skip(why) => {
            eprintln!("*** SKIPPING the S3 store test {what}: {why} ***");
            return None;
        }
    };
    let cfg = S3Config::from_vars(&unique_bucket(what), prefix, |k| vars.get(k).cloned())
        .expect("gateway env");
    let store = S3Store::new(&cfg).expect("store");
    store.create_bucket().expect("create bucket");
    Some((cfg, store))
}

fn random_bytes(seed: u64, n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    ChaCha8Rng::seed_from_u64(seed).fill_bytes(&mut v);
    v
}

#[test]
fn segment_objects_put_get_range_list_delete() {
    let Some((cfg, s)) = store_or_skip("ops", "fs1") else {
        return;
    };
    let seg = random_bytes(1, 4 << 20);
    s.put("seg/00000001", &seg).unwrap();
    assert_eq!(s.get("seg/00000001").unwrap(), seg);
    for (off, len) in [
        (0u64, 4096u64),
        (4096, 8192),
        ((4 << 20) - 100, 100),
        (12345, 1),
    ] {
        assert_eq!(
            s.get_range("seg/00000001", off, len).unwrap(),
            &seg[off as usize..(off + len) as usize],
            "range {off}+{len}"
        );
    }
    match s.get_range("seg/00000001", (4 << 20) - 10, 20) {
        Err(StoreError::BadAnswer { .. }) => {}
        other => panic!("a range past the end must be BadAnswer, got {other:?}"),
    }
    match s.get("seg/missing") {
        Err(StoreError::NotFound { key }) => assert_eq!(key, "seg/missing"),
        other => panic!("expected NotFound, got {other:?}"),
    }
    assert!(matches!(
        s.get_range("seg/missing", 0, 10),
        Err(StoreError::NotFound { .. })
    ));

    // Conditional put (If-None-Match: *): radosgw 16 honours it, so the lease can use it.
    assert_eq!(
        s.put_if_absent("lease", b"owner a").unwrap(),
        PutOutcome::Created
    );
    assert_eq!(
        s.put_if_absent("lease", b"owner b").unwrap(),
        PutOutcome::Exists
    );
    assert_eq!(s.get("lease").unwrap(), b"owner a");

    // A second prefix in the same bucket sees none of the first's objects.
    let mut cfg2 = cfg.clone();
    cfg2.prefix = "fs2".to_string();
    let s2 = S3Store::new(&cfg2).unwrap();
    s2.put("seg/00000001", b"other").unwrap();
    assert_eq!(s.get("seg/00000001").unwrap(), seg);
    assert_eq!(s2.list("").unwrap().len(), 1);

    // Listing pages past S3's 1,000 keys a page.
    for i in 0..1050u32 {
        s.put(&format!("ckpt/{i:08x}"), &i.to_le_bytes()).unwrap();
    }
    let listed = s.list("ckpt/").unwrap();
    assert_eq!(listed.len(), 1050);
    assert!(listed.windows(2).all(|w| w[0].key < w[1].key));
    assert_eq!(listed[1049].key, format!("ckpt/{:08x}", 1049));
    assert!(listed.iter().all(|o| o.size_bytes == 4));
    let all = s.list("").unwrap();
    assert_eq!(all.len(), 1052, "1050 checkpoints, a segment, the lease");

    s.delete("seg/00000001").unwrap();
    s.delete("seg/00000001").unwrap(); // absent: still Ok
    assert!(matches!(
        s.get("seg/00000001"),
        Err(StoreError::NotFound { .. })
    ));
    assert_eq!(s2.get("seg/00000001").unwrap(), b"other");
}

#[test]
fn errors_are_typed_refused_or_transient() {
    let Some((cfg, _s)) = store_or_skip("errors", "") else {
        return;
    };
    let mut bad = cfg.clone();
    bad.secret_access_key = "wrong".to_string();
    match S3Store::new(&bad).unwrap().put("x", b"x") {
        Err(e @ StoreError::Refused { status: 403, .. }) => assert!(!e.is_transient()),
        other => panic!("a wrong secret must be refused with 403, got {other:?}"),
    }
    let mut missing = cfg.clone();
    missing.bucket = unique_bucket("absent");
    match S3Store::new(&missing).unwrap().get("x") {
        Err(StoreError::Refused { status: 404, .. }) | Err(StoreError::NotFound { .. }) => {}
        other => panic!("a missing bucket must be an error, got {other:?}"),
    }
    // Nothing listens there: transient, to be retried.
    let mut down = cfg.clone();
    down.endpoint = Some("http://127.0.0.1:9".to_string());
    let e = S3Store::new(&down).unwrap().put("x", b"x").unwrap_err();
    assert!(e.is_transient(), "{e}");
    assert!(S3Config::from_vars("b", "", |_| None).is_err());
}

/// The gateway's own throughput for segment-sized objects, one client thread and four: what the
/// upload path is measured against (issue 20: upload throughput at least 0.8x of it).
#[test]
fn segment_sized_put_get_throughput() {
    let Some((_cfg, s)) = store_or_skip("speed", "") else {
        return;
    };
    let seg_bytes = 4usize << 20;
    let n = 24;
    let data = random_bytes(2, seg_bytes);
    s.put("warmup", &data).unwrap();
    let t = Instant::now();
    for i in 0..n {
        s.put(&format!("seg/{i:08x}"), &data).unwrap();
    }
    let put_1 = (n * seg_bytes) as f64 / t.elapsed().as_secs_f64() / 1e6;
    let t = Instant::now();
    for i in 0..n {
        assert_eq!(s.get(&format!("seg/{i:08x}")).unwrap().len(), seg_bytes);
    }
    let get_1 = (n * seg_bytes) as f64 / t.elapsed().as_secs_f64() / 1e6;
    let t = Instant::now();
    std::thread::scope(|sc| {
        for th in 0..4 {
            let s = &s;
            let data = &data;
            sc.spawn(move || {
                for i in (th..n).step_by(4) {
                    s.put(&format!("par/{i:08x}"), data).unwrap();
                }
            });
        }
    });
    let put_4 = (n * seg_bytes) as f64 / t.elapsed().as_secs_f64() / 1e6;
    println!(
        "gateway throughput, {n} objects of 4 MiB: PUT {put_1:.0} MB/s (1 thread), \
         {put_4:.0} MB/s (4 threads); GET {get_1:.0} MB/s (1 thread)"
    );
    assert!(put_1 > 0.0 && get_1 > 0.0);
}

/// The lease through radosgw: four writers race for the same takeover; exactly one gets each
/// generation (the conditional put), the others are told who holds it.
#[test]
fn lease_one_writer_against_the_gateway() {
    use ldfs::store::lease::{acquire, current, LeaseError, LeaseRecord};
    let Some((_cfg, s)) = store_or_skip("lease", "fs") else {
        return;
    };
    let rec = |owner: u64, exp: u64| LeaseRecord {
        owner,
        expires_secs: exp,
        pid: owner as u32,
        host: format!("host{owner}"),
    };
    acquire(&s, rec(1, 100), 50, false).unwrap();
    for round in 0..3u64 {
        // The lease has expired: four takers at once.
        let won: Vec<bool> = std::thread::scope(|sc| {
            let hs: Vec<_> = (0..4u64)
                .map(|t| {
                    let s = &s;
                    sc.spawn(move || {
                        let now = (round + 1) * 10_000;
                        match acquire(s, rec(10 * round + t + 2, now + 5_000), now, true) {
                            Ok(_) => true,
                            Err(LeaseError::Lost { .. }) | Err(LeaseError::Held { .. }) => false,
                            Err(e) => panic!("{e}"),
                        }
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        // The winner's lease stands for 5,000 s: whoever lost the put of the same generation,
        // or read the winner's lease, is refused. Exactly one winner.
        assert_eq!(
            won.iter().filter(|&&w| w).count(),
            1,
            "round {round}: {won:?}"
        );
        let (_, holder) = current(&s).unwrap().unwrap();
        let winners: Vec<u64> = (0..4u64)
            .filter(|&t| won[t as usize])
            .map(|t| 10 * round + t + 2)
            .collect();
        assert!(winners.contains(&holder.owner), "{holder:?} vs {winners:?}");
    }
    // An unexpired lease refuses everyone, naming its holder.
    let (_, holder) = current(&s).unwrap().unwrap();
    acquire(&s, rec(99, 100_000), 50_000, true).unwrap();
    match acquire(&s, rec(100, 200_000), 50_001, true) {
        Err(e @ LeaseError::Held { expired: false, .. }) => {
            assert!(e.to_string().contains("host99"), "{e}")
        }
        other => panic!("expected Held by host99 (after {holder:?}), got {other:?}"),
    }
}
