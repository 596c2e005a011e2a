//! The `ldfs` binary: everything is in the library (`ldfs_tools::cli`).

/// mimalloc: glibc malloc and free were ~16% of the mount daemon's user time
/// (issue 16; see Cargo.toml).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    ldfs_tools::cli::main()
}
