//! The gateway killed and restarted in the middle of a workload (issue 20): writes go on into
//! the cache while the store is down, the uploader retries with backoff, and once radosgw is
//! back every checkpoint goes up; a cache rebuilt from the store then holds the last one.
//! A test binary of its own: it takes the cluster's radosgw down, which the other store tests
//! (run one binary at a time by cargo) must not see.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ldfs::device::{Device, MemoryDevice};
use ldfs::ld::{ListHints, LogicalDisk};
use ldfs::lld::layout::MkfsOptions;
use ldfs::lld::{Lld, LldOptions};
use ldfs::store::{restore, S3Config, S3Store, SegmentStore, SegmentStoreOptions};
use ldfs::testing::ceph::{
    cluster_dir, gateway, start_cluster, stop_radosgw, unique_bucket, Gateway,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

#[test]
fn uploads_resume_after_the_gateway_restarts() {
    let vars = match gateway() {
        Gateway::Ready(v) => v,
        Gateway::Skip(why) => {
            eprintln!("*** SKIPPING the gateway restart test: {why} ***");
            return;
        }
    };
    let cfg =
        S3Config::from_vars(&unique_bucket("restart"), "fs", |k| vars.get(k).cloned()).unwrap();
    let s3 = Arc::new(S3Store::new(&cfg).unwrap());
    s3.create_bucket().unwrap();
    let dev: Arc<dyn Device> = Arc::new(MemoryDevice::new(24 << 20));
    let mk = MkfsOptions {
        segment_bytes: 128 << 10,
        max_block_bytes: 32 << 10,
        reserved_segments: Some(4),
        fs_id: 2022,
        max_bytes: None,
        kept_pages: 0,
    };
    ldfs::lld::mkfs::mkfs(&*dev, &mk).unwrap();
    let lease = ldfs::testing::store::take_lease(
        s3.clone(),
        &ldfs::testing::store::TestClock::default(),
        false,
    );
    let seg = SegmentStore::start(
        s3.clone(),
        dev.clone(),
        lease,
        SegmentStoreOptions {
            backoff_initial: Duration::from_millis(50),
            backoff_max: Duration::from_secs(1),
        },
    )
    .unwrap();
    let lld = Lld::open(
        dev.clone(),
        LldOptions {
            checkpoint_hook: Some(seg.hook()),
            segment_hook: Some(seg.segment_hook()),
            ..LldOptions::default()
        },
    )
    .unwrap();
    let l = lld.create_list(None, ListHints::default()).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(20);
    let mut model = BTreeMap::new();
    let mut churn = |n: usize, model: &mut BTreeMap<u64, Vec<u8>>| {
        for _ in 0..n {
            let i = rng.gen_range(0..200u64);
            let v: Vec<u8> = (0..rng.gen_range(1..8000)).map(|_| rng.gen()).collect();
            lld.write(None, l, i, &v).unwrap();
            model.insert(i, v);
        }
    };
    churn(500, &mut model);
    lld.checkpoint_now().unwrap();
    seg.wait_uploaded(seg.announced(), Duration::from_secs(60))
        .unwrap();

    let dir = cluster_dir();
    stop_radosgw(&dir);
    let retries = seg.stats().retries;
    // Writers go on into the cache while the store is down.
    churn(500, &mut model);
    lld.checkpoint_now().unwrap();
    let due = seg.announced();
    std::thread::sleep(Duration::from_secs(2));
    let down = seg.stats();
    // Read before the restart: once radosgw is back the uploader's next retry may land before
    // the assertion runs (it did once, under load).
    let uploaded_while_down = seg.uploaded();
    start_cluster(&dir);
    assert!(
        uploaded_while_down < due,
        "checkpoint {due} uploaded with the gateway down"
    );
    assert!(
        down.retries > retries,
        "no retry while the gateway was down: {down:?}"
    );
    seg.wait_uploaded(due, Duration::from_secs(120))
        .expect("uploads resume once the gateway is back");
    drop(lld);
    drop(seg);

    let dev2: Arc<dyn Device> = Arc::new(MemoryDevice::new(24 << 20));
    restore(&*s3, &*dev2).unwrap();
    let lld2 = Lld::open(dev2, LldOptions::default()).unwrap();
    for i in 0..200u64 {
        assert_eq!(
            lld2.read(l, i).unwrap().as_deref(),
            model.get(&i).map(|v| v.as_slice()),
            "index {i}"
        );
    }
}
