//! Test support for the store layer: a clock a test moves, a lease taken by it, and a store
//! with a hook around each request.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::store::lease::{Clock, HeldLease, LeaseOptions};
use crate::store::segments::SegmentStoreOptions;
use crate::store::{ObjectInfo, ObjectStore, PutOutcome, StoreOp, StoreResult};

/// Seconds since 1970 that stand still until the test moves them.
#[derive(Clone, Debug)]
pub struct TestClock(Arc<AtomicU64>);

impl Default for TestClock {
    fn default() -> Self {
        TestClock(Arc::new(AtomicU64::new(1_000_000)))
    }
}

impl TestClock {
    pub fn now(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
    pub fn advance(&self, secs: u64) {
        self.0.fetch_add(secs, Ordering::SeqCst);
    }
    pub fn clock(&self) -> Clock {
        let c = self.0.clone();
        Arc::new(move || c.load(Ordering::SeqCst))
    }
}

/// The lease on `store` by `clock` (60 s long; `force` takes over an expired one), host
/// "test", this pid.
pub fn take_lease(store: Arc<dyn ObjectStore>, clock: &TestClock, force: bool) -> Arc<HeldLease> {
    Arc::new(
        HeldLease::acquire(
            store,
            "test",
            std::process::id(),
            LeaseOptions {
                duration: Duration::from_secs(60),
                force_takeover: force,
                clock: clock.clock(),
            },
        )
        .expect("take the lease"),
    )
}

/// A crash: `lease` stops being renewed, unreleased, and `clock` moves past its expiry, so the
/// next writer takes it over with force.
pub fn crash_lease(lease: &HeldLease, clock: &TestClock) {
    lease.abandon();
    clock.advance(61);
}

/// An uploader that retries at once (1 ms, at most 20 ms between tries): store tests fail
/// uploads on purpose and must not wait out the real backoff.
pub fn fast_backoff() -> SegmentStoreOptions {
    SegmentStoreOptions {
        backoff_initial: Duration::from_millis(1),
        backoff_max: Duration::from_millis(20),
    }
}

/// A small geometry for store tests: segments of `segment_bytes`, 32 KiB blocks, 4 reserved
/// segments, fs id `fs_id`.
pub fn small_mkfs(segment_bytes: u64, fs_id: u64) -> crate::lld::layout::MkfsOptions {
    crate::lld::layout::MkfsOptions {
        segment_bytes,
        max_block_bytes: 32 << 10,
        reserved_segments: Some(4),
        fs_id,
        max_bytes: None,
        kept_pages: 0,
    }
}

/// `LDFS_SEED` from the environment (a failure's replay), else `default`.
pub fn seed_or(default: u64) -> u64 {
    std::env::var("LDFS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// lld on the layer's device with both of its hooks, as a read-write store mount opens it;
/// `opts` gives the rest.
pub fn open_with_hooks(
    seg: &crate::store::SegmentStore,
    opts: crate::lld::LldOptions,
) -> crate::lld::Lld {
    crate::lld::Lld::open(
        seg.device(),
        crate::lld::LldOptions {
            checkpoint_hook: Some(seg.hook()),
            segment_hook: Some(seg.segment_hook()),
            ..opts
        },
    )
    .expect("open lld over the segment store")
}

/// When a [`HookStore`]'s hook runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum When {
    /// Before the request: an error fails it unsent.
    Before,
    /// After it was applied: an error fails it all the same (a lost answer).
    After,
}

type Hook = dyn Fn(StoreOp, &str, When) -> StoreResult<()> + Send + Sync;

/// `inner` with a hook around every request, given the operation and the key (the prefix of a
/// listing): probes slow, fail or interleave requests with it.
pub struct HookStore {
    inner: Arc<dyn ObjectStore>,
    hook: Box<Hook>,
}

impl HookStore {
    pub fn new(
        inner: Arc<dyn ObjectStore>,
        hook: impl Fn(StoreOp, &str, When) -> StoreResult<()> + Send + Sync + 'static,
    ) -> HookStore {
        HookStore {
            inner,
            hook: Box::new(hook),
        }
    }

    fn around<T>(
        &self,
        op: StoreOp,
        key: &str,
        f: impl FnOnce() -> StoreResult<T>,
    ) -> StoreResult<T> {
        (self.hook)(op, key, When::Before)?;
        let r = f()?;
        (self.hook)(op, key, When::After)?;
        Ok(r)
    }
}

impl ObjectStore for HookStore {
    fn put(&self, key: &str, bytes: &[u8]) -> StoreResult<()> {
        self.around(StoreOp::Put, key, || self.inner.put(key, bytes))
    }
    fn put_if_absent(&self, key: &str, bytes: &[u8]) -> StoreResult<PutOutcome> {
        self.around(StoreOp::PutIfAbsent, key, || {
            self.inner.put_if_absent(key, bytes)
        })
    }
    fn get(&self, key: &str) -> StoreResult<Vec<u8>> {
        self.around(StoreOp::Get, key, || self.inner.get(key))
    }
    fn get_range(&self, key: &str, offset: u64, len: u64) -> StoreResult<Vec<u8>> {
        self.around(StoreOp::GetRange, key, || {
            self.inner.get_range(key, offset, len)
        })
    }
    fn delete(&self, key: &str) -> StoreResult<()> {
        self.around(StoreOp::Delete, key, || self.inner.delete(key))
    }
    fn list(&self, prefix: &str) -> StoreResult<Vec<ObjectInfo>> {
        self.around(StoreOp::List, prefix, || self.inner.list(prefix))
    }
}
