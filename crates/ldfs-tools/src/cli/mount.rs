//! `ldfs mount` as mount(8)'s helper `mount.fuse.ldfs IMAGE DIR [-o
//! OPTIONS]` (so `mount -t fuse.ldfs` and /etc/fstab work): its argument
//! conventions, then the same `fuse::mount::run` as `ldfs mount`.

use std::process::ExitCode;

use crate::fuse::mount;

/// Runs as `mount.fuse.ldfs`: exit 0 when mounted, 1 on a usage error, 32
/// (mount(8)'s "mount failure") otherwise.
pub fn helper() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let (Some(image), Some(dir)) = (args.next(), args.next()) else {
        eprintln!("usage: mount.fuse.ldfs IMAGE DIR [-o OPTIONS]");
        return ExitCode::from(1);
    };
    let mut options = Vec::new();
    while let Some(a) = args.next() {
        match a.as_str() {
            "-o" => options.extend(args.next()),
            // mount(8) may pass -n (no mtab), -s, -v: nothing to do.
            "-n" | "-s" | "-v" | "-f" => {}
            other => {
                eprintln!("mount.fuse.ldfs: unexpected argument '{other}'");
                return ExitCode::from(1);
            }
        }
    }
    // As for kernel file systems, device nodes work when root mounts
    // through mount(8) or fstab unless `nodev` says otherwise (fuser
    // and fusermount3 default to nodev).
    let named = |w: &str| options.iter().flat_map(|o| o.split(',')).any(|o| o == w);
    if unsafe { libc::geteuid() } == 0 && !named("nodev") && !named("dev") && !named("remount") {
        options.push("dev".into());
    }
    match mount::run(
        image.into(),
        dir.into(),
        false,
        options,
        false,
        mount::StoreArgs::default(),
    ) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ldfs: {e}");
            ExitCode::from(32)
        }
    }
}
