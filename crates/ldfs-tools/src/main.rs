//! The `ldfs` binary: everything is in the library (`ldfs_tools::cli`).

fn main() -> std::process::ExitCode {
    ldfs_tools::cli::main()
}
