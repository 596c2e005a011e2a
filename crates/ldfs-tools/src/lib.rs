//! What of the `ldfs` command other programs may build on: the FUSE
//! transports (`transport`: /dev/fuse and FUSE over io_uring, with the
//! request decoder and reply encoder), a library so that the fuzz targets
//! (`fuzz/fuzz_targets/fuse_request.rs`) can reach the decoder.

pub mod transport;
