#!/usr/bin/env bash
# A short run of every cargo-fuzz target (fuzz/fuzz_targets): each decoder
# of on-disk bytes, and a damaged image mounted and used in-process. Any
# panic, hang (-timeout) or runaway allocation fails the run; the input is
# kept under fuzz/artifacts/TARGET/ and replays with
#   cargo +nightly fuzz run -O TARGET fuzz/artifacts/TARGET/crash-...
# FUZZ_SECONDS (default 10) per decoder, 3x that for the image target.
# Installs the nightly toolchain and cargo-fuzz when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${FUZZ_SECONDS:-10}
if ! rustup run nightly rustc --version >/dev/null 2>&1; then
  rustup toolchain install nightly --profile minimal
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
  cargo install cargo-fuzz --locked
fi
cd fuzz
cargo +nightly fuzz build -O
for t in $(cargo +nightly fuzz list); do
  s=$SECS
  [ "$t" = corrupt_image ] && s=$((SECS * 3))
  echo "fuzz smoke: $t for ${s}s"
  cargo +nightly fuzz run -O "$t" -- -max_total_time="$s" -timeout=10 -rss_limit_mb=2048 -max_len=512 \
    -print_final_stats=0 2>&1 | grep -E "^Done|ERROR|panicked|SUMMARY" || true
  # libFuzzer leaves an artifact for every failure.
  if compgen -G "artifacts/$t/*" >/dev/null; then
    echo "*** fuzz target $t failed: fuzz/artifacts/$t/ ***"
    exit 1
  fi
done
echo "fuzz smoke: all targets ran clean"
