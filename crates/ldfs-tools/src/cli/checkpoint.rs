//! `ldfs checkpoint MNT`: the daemon of a mounted ldfs writes a checkpoint
//! now (the next mount, even after a crash, then has nothing to roll
//! forward).

use std::path::Path;

use super::{control::control_set, CmdResult};

pub fn run(mountpoint: &Path) -> CmdResult {
    control_set(mountpoint, "checkpoint", b"")
}
