//! FUSE: the thin adapter from requests to `ldfs::fs` calls (`adapter`),
//! the mount and the daemon's life (`mount`), and how requests travel
//! (`transport`: /dev/fuse or FUSE over io_uring); a read-only mount of a store-backed
//! file system moving to the store's newer uploads (`refresh`).

pub mod adapter;
pub mod mount;
pub mod refresh;
pub mod store_mount;
pub mod transport;

/// FUSE worker threads. Requests such as fsync block their thread on the
/// device, so there are more threads than CPUs: concurrent fsyncs must reach
/// the engine together for group commit to batch them.
pub(crate) const FUSE_THREADS: usize = 16;
