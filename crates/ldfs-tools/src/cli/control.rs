//! The control channel to a mounted ldfs's daemon: `trusted.ldfs.<name>`
//! extended attributes of the mount point's root, read (`stats`, the last
//! `clean`'s result) or set (`checkpoint`, `clean`, `background`, `stop`).

use super::CmdResult;

fn control_attr(name: &str) -> std::ffi::CString {
    std::ffi::CString::new(format!("trusted.ldfs.{name}")).expect("no NUL in a control name")
}

fn mountpoint_cstr(
    mountpoint: &std::path::Path,
) -> Result<std::ffi::CString, Box<dyn std::error::Error>> {
    use std::os::unix::ffi::OsStrExt;
    Ok(std::ffi::CString::new(mountpoint.as_os_str().as_bytes())?)
}

/// Reads `trusted.ldfs.<name>` from a mount point's root: the daemon answers.
pub fn control_get(
    mountpoint: &std::path::Path,
    name: &str,
) -> Result<Vec<u8>, Box<dyn std::error::Error>> {
    let path = mountpoint_cstr(mountpoint)?;
    let attr = control_attr(name);
    let mut buf = vec![0u8; 1 << 16];
    let n = unsafe {
        libc::getxattr(
            path.as_ptr(),
            attr.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if n < 0 {
        let e = std::io::Error::last_os_error();
        return Err(format!(
            "{}: not a mounted ldfs, or not allowed ({e})",
            mountpoint.display()
        )
        .into());
    }
    buf.truncate(n as usize);
    Ok(buf)
}

/// Runs a daemon command by setting `trusted.ldfs.<name>` on the root.
pub fn control_set(mountpoint: &std::path::Path, name: &str, value: &[u8]) -> CmdResult {
    let path = mountpoint_cstr(mountpoint)?;
    let attr = control_attr(name);
    let r = unsafe {
        libc::setxattr(
            path.as_ptr(),
            attr.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    if r != 0 {
        let e = std::io::Error::last_os_error();
        return Err(format!(
            "{}: {name} failed ({e}; details in the daemon's log)",
            mountpoint.display()
        )
        .into());
    }
    Ok(())
}
