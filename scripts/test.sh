#!/usr/bin/env bash
# The whole test suite: formatting, lints, and every test (unit, property,
# crash simulation with fixed seeds). Set LDFS_LONG=1 for the long mode.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo test --workspace --release
