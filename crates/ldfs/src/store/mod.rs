//! Object stores: where a store-backed file system keeps its durable home (issue 20).
//!
//! [`ObjectStore`] is the six operations the segment store layer needs of a bucket (put,
//! put_if_absent, get, get_range, delete, list), over whole immutable objects named by keys.
//! Two implementations:
//!
//! - [`MemoryStore`]: a map in memory with seeded faults (uploads failed before or after they
//!   land, uploads held in flight and then kept or lost in any order at a simulated crash), for
//!   unit tests and the crash simulation.
//! - [`S3Store`]: an S3 bucket (and key prefix) through an S3 gateway: Ceph's radosgw in the
//!   tests, any S3 service in use.
//!
//! Invariants every implementation keeps: a `put` that returned `Ok` is durable and visible to
//! every later `get` and `list`; a `put` that returned an error may or may not have landed (a
//! lost response); `put_if_absent` never replaces an object; `delete` of an absent key is `Ok`.
//! Transient failures (the gateway down, slow or overloaded) are
//! [`StoreError::Unavailable`], which callers retry with backoff; everything else is final.

pub mod cache;
pub mod lease;
mod memory;
pub mod readers;
mod s3;
pub mod segments;

pub use cache::{CacheConfig, CacheStats};
pub use lease::{HeldLease, LeaseOptions};
pub use memory::{MemoryStore, MemoryStoreFaults};
pub use s3::{S3Config, S3Store};
pub use segments::{
    restore, restore_as, restore_lazy, restore_lazy_as, LayerError, RestoreReport, SegmentStore,
    SegmentStoreOptions, UploadStats,
};

use std::fmt;

/// One listed object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectInfo {
    /// The key, without the store's own prefix.
    pub key: String,
    pub size_bytes: u64,
}

/// What a conditional put found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PutOutcome {
    /// The object did not exist and now holds the bytes.
    Created,
    /// An object already had the key; it was left as it was.
    Exists,
}

/// Which store operation failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreOp {
    Put,
    PutIfAbsent,
    Get,
    GetRange,
    Delete,
    List,
    CreateBucket,
    DeleteBucket,
}

impl fmt::Display for StoreOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            StoreOp::Put => "put",
            StoreOp::PutIfAbsent => "conditional put",
            StoreOp::Get => "get",
            StoreOp::GetRange => "ranged get",
            StoreOp::Delete => "delete",
            StoreOp::List => "list",
            StoreOp::CreateBucket => "bucket creation",
            StoreOp::DeleteBucket => "bucket deletion",
        })
    }
}

/// The store layer's errors (one enum per layer: STYLE.md practice 6).
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("object {key} not found")]
    NotFound { key: String },
    /// Transient: no answer, a timeout, or a 5xx (503 SlowDown included). Retry with backoff.
    #[error("store unavailable: {op} {key}: {reason}")]
    Unavailable {
        op: StoreOp,
        key: String,
        reason: String,
    },
    /// Final: the store answered and refused (credentials, a missing bucket, a bad request).
    #[error("store refused {op} {key}: HTTP {status}: {detail}")]
    Refused {
        op: StoreOp,
        key: String,
        status: u16,
        detail: String,
    },
    /// The store answered with something that cannot be right (a short range, a listing that
    /// does not parse). Evidence included.
    #[error("bad answer from the store to {op} {key}: {detail}")]
    BadAnswer {
        op: StoreOp,
        key: String,
        detail: String,
    },
    /// Configuration: a missing variable, a bad endpoint or bucket name.
    #[error("store configuration: {0}")]
    Config(String),
}

impl StoreError {
    /// Whether retrying the same request may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(self, StoreError::Unavailable { .. })
    }
}

pub type StoreResult<T> = Result<T, StoreError>;

/// A bucket of immutable objects. Keys are UTF-8 without a leading `/`; implementations add
/// their own prefix. Methods take `&self` and may be called from several threads at once.
pub trait ObjectStore: Send + Sync {
    /// Store `bytes` under `key`, replacing any object there.
    fn put(&self, key: &str, bytes: &[u8]) -> StoreResult<()>;
    /// Store `bytes` under `key` only if no object has that key (S3 `If-None-Match: *`).
    fn put_if_absent(&self, key: &str, bytes: &[u8]) -> StoreResult<PutOutcome>;
    /// The whole object.
    fn get(&self, key: &str) -> StoreResult<Vec<u8>>;
    /// `len` bytes from `offset`; an object shorter than `offset + len` is `BadAnswer`.
    fn get_range(&self, key: &str, offset: u64, len: u64) -> StoreResult<Vec<u8>>;
    /// Remove the object; `Ok` if there was none.
    fn delete(&self, key: &str) -> StoreResult<()>;
    /// Every object whose key starts with `prefix`, in key order.
    fn list(&self, prefix: &str) -> StoreResult<Vec<ObjectInfo>>;
}

impl<T: ObjectStore + ?Sized> ObjectStore for std::sync::Arc<T> {
    fn put(&self, key: &str, bytes: &[u8]) -> StoreResult<()> {
        (**self).put(key, bytes)
    }
    fn put_if_absent(&self, key: &str, bytes: &[u8]) -> StoreResult<PutOutcome> {
        (**self).put_if_absent(key, bytes)
    }
    fn get(&self, key: &str) -> StoreResult<Vec<u8>> {
        (**self).get(key)
    }
    fn get_range(&self, key: &str, offset: u64, len: u64) -> StoreResult<Vec<u8>> {
        (**self).get_range(key, offset, len)
    }
    fn delete(&self, key: &str) -> StoreResult<()> {
        (**self).delete(key)
    }
    fn list(&self, prefix: &str) -> StoreResult<Vec<ObjectInfo>> {
        (**self).list(prefix)
    }
}
