//! `ldfs trim`: give every clean segment back to the storage (a hole
//! punched in an image file, BLKDISCARD on a block device), as fstrim does
//! for kernel file systems: through the daemon of a mounted ldfs, or on an
//! unmounted image (taking its lock, as a mount does). On a mounted dual
//! pair the metadata log's clean segments and the data device's free
//! blocks are trimmed; on an unmounted one, its metadata device only.

use std::path::PathBuf;
use std::sync::Arc;

use ldfs::device::{Device, FileDevice, FileDeviceOptions};
use ldfs::lld::{Lld, LldOptions};

use super::control::{control_get, control_set};
use super::CmdResult;

#[derive(clap::Args)]
pub struct TrimArgs {
    /// A mount point of a mounted ldfs, or an unmounted image (for a dual
    /// pair, its metadata device).
    #[arg(value_name = "MNT|IMAGE")]
    target: PathBuf,
}

pub fn run(a: TrimArgs) -> CmdResult {
    let target = a.target;
    if target.is_dir() {
        control_set(&target, "trim", b"")?;
        print!(
            "{}: {}",
            target.display(),
            String::from_utf8_lossy(&control_get(&target, "trim")?)
        );
        return Ok(());
    }
    // A store cache changes only under a mount holding the store's lease (cli/store_check;
    // review 33: as fsck -y and clean).
    if let Some(n) = super::store_check::store_cache(&target)? {
        return Err(n.refusal(&target, "trimming it offline").into());
    }
    let _lock =
        crate::fuse::mount::lock_image(&target, true, "ldfs trim").map_err(|e| e.to_string())?;
    let dev: Arc<dyn Device> = Arc::new(FileDevice::open(&target, FileDeviceOptions::default())?);
    if ldfs::dual::is_data_device(&*dev) {
        return Err(format!(
            "{} is the data device of a dual pair: trim its metadata device (or the mount point)",
            target.display()
        )
        .into());
    }
    let lld = Lld::open(dev, LldOptions::default())?;
    let (segs, bytes) = lld.trim()?;
    lld.close()?;
    if segs == 0 && bytes == 0 {
        println!(
            "{}: nothing trimmed (no clean segment, or the device cannot discard)",
            target.display()
        );
    } else {
        println!(
            "{}: trimmed {segs} clean segments, {bytes} bytes",
            target.display()
        );
    }
    Ok(())
}
