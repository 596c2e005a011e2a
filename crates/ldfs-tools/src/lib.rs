//! The `ldfs` command, as a library so that its parts can be reached by the
//! fuzz targets (`fuzz/fuzz_targets/fuse_request.rs` decodes FUSE requests
//! with `fuse::transport::proto`); the binary (`main.rs`) only calls
//! `cli::main`.
//!
//! - `cli/`: one module per command (mkfs, mount's helper, fsck, inspect,
//!   stats, clean, sync, checkpoint, bench's dispatch), each parsing its
//!   options; the control channel to a running daemon.
//! - `fuse/`: the thin FUSE adapter (request -> `ldfs::fs` call -> reply),
//!   the mount and the daemon's life, and the transports (/dev/fuse and
//!   FUSE over io_uring, with the request decoder and reply encoder).
//! - `bench/`: one module per benchmark, the report writer, and memfs (the
//!   in-memory FUSE ceiling).

pub(crate) mod bench;
pub mod cli;
pub mod fuse;
