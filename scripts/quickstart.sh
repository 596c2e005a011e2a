#!/usr/bin/env bash
# Installs what is missing on a fresh Debian machine, builds ldfs, and formats
# and inspects a default image file (ldfs.img, 1 GiB, sparse).
set -euo pipefail
cd "$(dirname "$0")/.."
need=()
command -v fusermount3 >/dev/null 2>&1 || need+=(fuse3)
dpkg -s libfuse3-dev >/dev/null 2>&1 || need+=(libfuse3-dev)
command -v pkg-config >/dev/null 2>&1 || need+=(pkg-config)
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq "${need[@]}"
fi
command -v cargo >/dev/null 2>&1 || { curl -sSf https://sh.rustup.rs | sh -s -- -y; . "$HOME/.cargo/env"; }
cargo build --release
IMG=${1:-ldfs.img}
./target/release/ldfs mkfs --size 1G "$IMG"
./target/release/ldfs inspect "$IMG"
