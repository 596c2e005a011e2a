#!/usr/bin/env bash
# Installs what is missing on a fresh Debian machine (fuse3, a Rust
# toolchain), builds ldfs, creates a default image (ldfs.img, 1 GiB, written
# whole as `ldfs mkfs --size` makes it) if there is none, and mounts it on
# ./mnt, ready for use.
#   ./scripts/quickstart.sh [IMAGE] [MOUNTPOINT]
set -euo pipefail
cd "$(dirname "$0")/.."
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
if ! command -v fusermount3 >/dev/null 2>&1; then
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq fuse3
fi
if ! command -v cargo >/dev/null 2>&1; then
  [ -x "$HOME/.cargo/bin/cargo" ] || curl -sSf https://sh.rustup.rs | sh -s -- -y
  . "$HOME/.cargo/env"
fi
cargo build --release
# The binary and its mount helper, so `mount -t fuse.ldfs` and fstab work.
if $SUDO true 2>/dev/null; then
  $SUDO install -m 755 target/release/ldfs /usr/local/bin/ldfs
  $SUDO ln -sf /usr/local/bin/ldfs /sbin/mount.fuse.ldfs
  $SUDO ln -sf /usr/local/bin/ldfs /sbin/fsck.ldfs
  LDFS=/usr/local/bin/ldfs
else
  LDFS=./target/release/ldfs
fi
IMG=${1:-ldfs.img}
MNT=${2:-mnt}
[ -e "$IMG" ] || "$LDFS" mkfs --size 1G "$IMG"
mkdir -p "$MNT"
if grep -q " $(realpath "$MNT") " /proc/mounts; then
  echo "$MNT is already mounted"
else
  "$LDFS" mount "$IMG" "$MNT"
fi
echo "ldfs is mounted on $MNT (image $IMG). Unmount with: fusermount3 -u $MNT"
