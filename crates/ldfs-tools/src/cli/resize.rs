//! `ldfs resize IMAGE|MNT [SIZE]`: grow an unmounted image or a mounted
//! ldfs (through its daemon, as `ldfs trim` does), or shrink an unmounted
//! image (its live data moved out of the segments cut off first). SIZE as
//! mkfs's (`8G`, `512M`), or relative (`+1G`, `-512M`); omitted, the
//! device's size (a block device the storage grew, or an image file
//! extended by other means). docs/DESIGN.md "Resize".

use std::path::PathBuf;
use std::sync::Arc;

use ldfs::device::{Device, FileDevice, FileDeviceOptions};
use ldfs::lld::{resize_offline, LldOptions};

use super::control::{control_get, control_set};
use super::{parse_size, CmdResult};

#[derive(clap::Args)]
pub struct ResizeArgs {
    /// An unmounted image or block device (for a dual pair, its metadata
    /// device), or the mount point of a mounted ldfs (grow only).
    #[arg(value_name = "IMAGE|MNT")]
    target: PathBuf,
    /// The new size: 8G, 512M, +1G, -512M; omitted, the device's size.
    #[arg(value_name = "SIZE", allow_hyphen_values = true)]
    size: Option<String>,
}

/// The new size in bytes that `spec` asks for on a device of `current`
/// bytes: absolute, `+N` or `-N`; `None` for the device's own size.
pub fn resolve_size(spec: Option<&str>, current: u64) -> Result<Option<u64>, String> {
    let Some(spec) = spec.map(str::trim).filter(|s| !s.is_empty()) else {
        return Ok(None);
    };
    let size = if let Some(more) = spec.strip_prefix('+') {
        current
            .checked_add(parse_size(more)?)
            .ok_or_else(|| format!("{spec}: too large"))?
    } else if let Some(less) = spec.strip_prefix('-') {
        current
            .checked_sub(parse_size(less)?)
            .ok_or_else(|| format!("{spec}: more than the {current} bytes there are"))?
    } else {
        parse_size(spec)?
    };
    Ok(Some(size))
}

pub fn run(a: ResizeArgs) -> CmdResult {
    let target = a.target;
    if target.is_dir() {
        let set = control_set(&target, "resize", a.size.unwrap_or_default().as_bytes());
        // The daemon keeps what it did, or why it did not.
        let said = control_get(&target, "resize")
            .map(|b| String::from_utf8_lossy(&b).trim_end().to_string());
        return match (set, said) {
            (Ok(()), Ok(said)) => {
                println!("{}: {said}", target.display());
                Ok(())
            }
            (Err(_), Ok(said)) => Err(format!("{}: {said}", target.display()).into()),
            (Err(e), Err(_)) | (Ok(()), Err(e)) => Err(e),
        };
    }
    // A store cache changes only under a mount holding the store's lease (cli/store_check;
    // review 33: as fsck -y and clean).
    if let Some(n) = super::store_check::store_cache(&target)? {
        return Err(n.refusal(&target, "resizing it offline").into());
    }
    let _lock =
        crate::fuse::mount::lock_image(&target, true, "ldfs resize").map_err(|e| e.to_string())?;
    let dev: Arc<dyn Device> = Arc::new(FileDevice::open(&target, FileDeviceOptions::default())?);
    if ldfs::dual::is_data_device(&*dev) {
        return Err(format!(
            "{} is the data device of a dual pair: its groups cannot be resized yet \
             (its metadata device, an ordinary log, can)",
            target.display()
        )
        .into());
    }
    let size = resolve_size(a.size.as_deref(), dev.size_bytes())?;
    let r = resize_offline(dev, size, LldOptions::default())?;
    println!("{}: resized, {r}", target.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::resolve_size;

    #[test]
    fn sizes_absolute_and_relative() {
        let g = 1u64 << 30;
        assert_eq!(resolve_size(Some("2G"), g), Ok(Some(2 << 30)));
        assert_eq!(resolve_size(Some("+1G"), g), Ok(Some(2 << 30)));
        assert_eq!(resolve_size(Some("-512M"), g), Ok(Some(512 << 20)));
        assert_eq!(resolve_size(None, g), Ok(None));
        assert_eq!(resolve_size(Some(""), g), Ok(None));
        assert!(resolve_size(Some("-2G"), g).is_err());
        assert!(resolve_size(Some("+x"), g).is_err());
    }
}
