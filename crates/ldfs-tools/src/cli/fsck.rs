//! `ldfs fsck [-n|-y|-p] [-f] IMAGE`, also run as `fsck.ldfs` (so `fsck -t
//! ldfs` finds it): parses arguments, decides read-only or repair, prints,
//! and maps the outcome to fsck(8)'s exit codes. The checks and repairs are
//! `ldfs::fsck`.
//!
//! Read-only (`-n`, the default without `-y`/`-p`, and always when the image
//! is in use) opens the image with O_RDONLY, so not a byte can be written.
//! A repair holds the image's exclusive lock (the one `ldfs mount` takes)
//! for its whole run, a check a shared one; either waits for a daemon that
//! is still writing its final checkpoint after an unmount.

use std::path::PathBuf;
use std::sync::Arc;

use clap::Parser;
use ldfs::device::{Device, FileDevice, FileDeviceOptions};
use ldfs::fsck::{self, FsckError, FsckOptions};

/// fsck(8) exit codes.
pub const EXIT_OK: u8 = 0;
pub const EXIT_OPERATIONAL: u8 = 8;
pub const EXIT_USAGE: u8 = 16;
pub const EXIT_CANCELLED: u8 = 32;

/// Check an ldfs image (and repair it with -y or -p).
#[derive(Parser, Debug)]
#[command(name = "fsck.ldfs", version)]
pub struct FsckArgs {
    /// Report only: open the image read-only and write nothing (the default
    /// unless -y or -p is given).
    #[arg(short = 'n', conflicts_with_all = ["yes", "preen"])]
    pub no: bool,
    /// Repair everything that can be repaired, without asking.
    #[arg(short = 'y', conflicts_with = "preen")]
    pub yes: bool,
    /// Repair automatically (as -y; -a is the same, for fsck(8)).
    #[arg(short = 'p', short_alias = 'a')]
    pub preen: bool,
    /// Check even if the image looks clean (ldfs always checks everything;
    /// accepted for fsck(8)).
    #[arg(short = 'f')]
    pub force: bool,
    /// Print every problem, not only the first 50.
    #[arg(short = 'v')]
    pub verbose: bool,
    /// Check metadata only: skip the checksums of data blocks (reads the
    /// summaries, not the whole log). Blocks whose bytes are bad are then
    /// neither found nor repaired.
    #[arg(long)]
    pub no_data: bool,
    /// Never print the progress line (printed on stderr only when it is a
    /// terminal).
    #[arg(long)]
    pub no_progress: bool,
    /// A dual file system's metadata device (default: the path its data
    /// device's label recorded at mkfs).
    #[arg(long)]
    pub meta: Option<PathBuf>,
    /// The image file or block device (a dual file system's data device).
    pub image: PathBuf,
}

/// Parses `args` (the first one is the program name) and runs; returns the
/// exit code.
pub fn main_with(args: impl IntoIterator<Item = String>) -> u8 {
    let a = match FsckArgs::try_parse_from(args) {
        Ok(a) => a,
        Err(e) => {
            let code = if e.use_stderr() { EXIT_USAGE } else { EXIT_OK };
            let _ = e.print();
            return code;
        }
    };
    install_cancel_handler();
    match run(&a) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("fsck.ldfs: {}: {e}", a.image.display());
            EXIT_OPERATIONAL
        }
    }
}

/// SIGINT/SIGTERM end the run with exit 32. A repair interrupted so is a
/// crash between ARUs: the image stays consistent and a rerun finishes it.
fn install_cancel_handler() {
    extern "C" fn cancelled(_: libc::c_int) {
        unsafe { libc::_exit(EXIT_CANCELLED as libc::c_int) };
    }
    let h = cancelled as extern "C" fn(libc::c_int) as libc::sighandler_t;
    unsafe {
        libc::signal(libc::SIGINT, h);
        libc::signal(libc::SIGTERM, h);
    }
}

fn run(a: &FsckArgs) -> Result<u8, String> {
    let image = &a.image;
    let mut repair = a.yes || a.preen;
    // A store-backed file system's cache is checked, never changed offline (cli/store_check).
    let store_note = super::store_check::store_cache(image)?;
    if let (Some(n), true) = (&store_note, repair) {
        eprintln!("fsck.ldfs: {}", n.refusal(image, "a repair (-y, -p)"));
        return Ok(EXIT_USAGE);
    }
    // Right after an unmount the daemon may still be writing its final
    // checkpoint: lock_image waits for it (a live mount is not waited for).
    // A mount whose daemon died is still listed until it is unmounted.
    let (lock, busy) = match crate::fuse::mount::lock_image(image, repair, "fsck.ldfs") {
        Err(crate::fuse::mount::LockError::Open { err, .. }) => return Err(err.to_string()),
        Err(e) => (None, Some(e.to_string())),
        Ok(f) => {
            let on = crate::fuse::mount::mounted_on(image);
            let mut why =
                on.map(|on| format!("{} is mounted on {}", image.display(), on.display()));
            // A snapshot mount holds no image lock (it runs beside the live
            // one) but its snapshot's: a repair may drop snapshots, so it
            // waits until none is mounted. One mounted after this check is
            // not seen (the reader locks no more than its own snapshot).
            if why.is_none() && repair && ldfs::lld::SnapshotLock::any_held(&f).unwrap_or(false) {
                why = Some(format!(
                    "a snapshot of {} is mounted (`ldfs checkpoints {}` says where)",
                    image.display(),
                    image.display()
                ));
            }
            (Some(f), why)
        }
    };
    if let Some(why) = &busy {
        eprintln!(
            "fsck.ldfs: WARNING: {why}; checking read-only, nothing will be repaired, and what a running mount has not yet checkpointed may show as problems"
        );
        repair = false;
    }
    let dev: Arc<dyn Device> = if repair {
        Arc::new(FileDevice::open(image, FileDeviceOptions::default()).map_err(|e| e.to_string())?)
    } else {
        Arc::new(FileDevice::open_read_only(image).map_err(|e| e.to_string())?)
    };
    // A store-backed file system's cache holding only some segments (issue 20 step C): the
    // rest is read from the store, each object checked; nothing is repaired.
    let (dev, store_problems, in_store) = match crate::cli::store::cache_view(image, dev.clone())? {
        None => (dev, Vec::new(), false),
        Some((_, bad))
            if !bad.is_empty()
                && crate::cli::store::is_readers_cache(image)
                && crate::cli::store::readers_checkpoint_gone(image, &*dev)? =>
        {
            // Its checkpoint's objects go once no mount pins it (review 42 finding 5: each
            // was reported as a problem of a cache that holds nothing the store lacks).
            println!(
                "fsck.ldfs {}: the cache of read-only mounts (rebuilt from the store at each \
                 read-only mount; it holds nothing the store lacks): {} of the segments it \
                 does not hold are gone from the store, with the checkpoint it was rebuilt \
                 from (no mount pins it): nothing to check",
                image.display(),
                bad.len()
            );
            return Ok(EXIT_OK);
        }
        Some((view, bad)) => {
            // A cache with a note: a repair was refused above.
            debug_assert!(!repair && store_note.is_some());
            (view, bad, true)
        }
    };
    println!(
        "fsck.ldfs {}: {}",
        image.display(),
        if repair {
            "checking and repairing"
        } else {
            "checking (read-only)"
        }
    );
    let progress = (!a.no_progress && unsafe { libc::isatty(2) } == 1).then(progress_line);
    let started = std::time::Instant::now();
    let dual = ldfs::dual::is_data_device(&*dev);
    if !dual && a.meta.is_some() {
        eprintln!(
            "fsck.ldfs: {}: --meta is for a dual file system; this one has one log",
            image.display()
        );
        return Ok(EXIT_USAGE);
    }
    let result = if dual {
        check_dual(a, &dev, repair, progress)
    } else {
        fsck::run(
            dev,
            &FsckOptions {
                // The log is streamed past the page cache where O_DIRECT works
                // (not on tmpfs): no copy, no cache filled with data.
                bulk: FileDevice::open_read_only_with(image, FileDeviceOptions { direct: true })
                    .ok()
                    .filter(|_| !in_store)
                    .map(|d| Arc::new(d) as Arc<dyn Device>),
                repair,
                data_checksums: !a.no_data,
                progress,
                ..Default::default()
            },
        )
    };
    if !a.no_progress && unsafe { libc::isatty(2) } == 1 {
        // Clear the progress line.
        eprint!("\r\x1b[K");
    }
    for l in &store_problems {
        println!("PROBLEM: {l}");
    }
    let out = match result {
        Ok(o) => o,
        Err(e @ FsckError::NotLdfs(_)) => {
            eprintln!("fsck.ldfs: {}: {e}", image.display());
            return Ok(EXIT_OPERATIONAL);
        }
        Err(e) => return Err(e.to_string()),
    };
    let limit = if a.verbose { usize::MAX } else { 50 };
    let found = out.found.lines();
    for l in found.iter().take(limit) {
        println!("PROBLEM: {l}");
    }
    if found.len() > limit {
        println!(
            "... and {} more problems (-v prints all)",
            found.len() - limit
        );
    }
    for l in out.fixed.iter().take(limit) {
        println!("FIXED: {l}");
    }
    for l in &out.notes {
        println!("NOTE: {l}");
    }
    if out.repaired {
        for l in out.remaining.iter().take(limit) {
            println!("LEFT: {l}");
        }
    }
    let f = &out.found;
    println!(
        "{}: {} problems found, {} repairs, {} problems left; {} map entries, {} blocks checked in {} partial segments; {} inodes ({} directories, {} other files)",
        image.display(),
        found.len() + store_problems.len(),
        out.fixed.len(),
        out.remaining.len() + store_problems.len(),
        f.map_entries,
        f.blocks_checked,
        f.partials,
        f.inodes,
        f.directories,
        f.files
    );
    println!(
        "{}: checked in {:.1} s{}",
        image.display(),
        started.elapsed().as_secs_f64(),
        if a.no_data {
            " (metadata only: data checksums not checked)"
        } else {
            ""
        }
    );
    let mut code = out.exit_code();
    if !store_problems.is_empty() {
        code |= 4;
    }
    if let Some(n) = &store_note {
        match store_report(n, image) {
            Ok(0) => {}
            Ok(p) => {
                println!("{}: {p} problems in the store", image.display());
                code |= 4;
            }
            Err(e) => {
                eprintln!("fsck.ldfs: {}: the store: {e}", image.display());
                code |= EXIT_OPERATIONAL;
            }
        }
    }
    if code & 4 != 0 && !out.repaired && store_note.is_none() {
        println!(
            "{}: errors left; run fsck.ldfs -y to repair",
            image.display()
        );
    }
    drop(lock);
    Ok(code)
}

/// Says which store `image` is the cache of and checks that store (when its environment is
/// set, as for a mount): its problems printed, and counted.
fn store_report(
    n: &super::store_check::CacheNote,
    image: &std::path::Path,
) -> Result<usize, String> {
    println!("NOTE: {}", n.describe(image));
    let store = match n.url.open(None) {
        Ok(s) => s,
        Err(e) => {
            println!(
                "NOTE: the store was not checked: {e} (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY or the AWS shared files, as for a mount)"
            );
            return Ok(0);
        }
    };
    let c = super::store_check::check_store(&*store, n)?;
    for p in &c.problems {
        println!("PROBLEM: store: {p}");
    }
    for l in &c.notes {
        println!("NOTE: store: {l}");
    }
    Ok(c.problems.len())
}

/// fsck of a dual file system: its metadata device is found as a mount
/// finds it and locked too (exclusively to repair; a metadata device in
/// use is only checked).
fn check_dual(
    a: &FsckArgs,
    data: &Arc<dyn Device>,
    repair: bool,
    progress: Option<fsck::ProgressFn>,
) -> Result<fsck::Outcome, FsckError> {
    let meta_path = crate::fuse::mount::dual_meta_path(&**data, &a.image, a.meta.as_deref())
        .map_err(FsckError::Device)?;
    let _lock = crate::fuse::mount::lock_image(&meta_path, repair, "fsck.ldfs")
        .map_err(|e| FsckError::Device(e.to_string()))?;
    let meta: Arc<dyn Device> = Arc::new(
        if repair {
            FileDevice::open(&meta_path, FileDeviceOptions::default())
        } else {
            FileDevice::open_read_only(&meta_path)
        }
        .map_err(|e| FsckError::Device(format!("{}: {e}", meta_path.display())))?,
    );
    println!(
        "fsck.ldfs: dual file system, metadata on {}",
        meta_path.display()
    );
    fsck::run_dual(
        meta,
        data.clone(),
        &FsckOptions {
            repair,
            data_checksums: !a.no_data,
            progress,
            ..Default::default()
        },
    )
}

/// A progress line on stderr, rewritten in place at most 5 times a second:
/// `fsck.ldfs: segments 41% (1234/3000)`, or a count when the total is
/// unknown.
fn progress_line() -> fsck::ProgressFn {
    let last = std::sync::Mutex::new(None::<std::time::Instant>);
    Arc::new(move |phase: &str, done: u64, total: u64| {
        let mut l = last.lock().unwrap_or_else(|e| e.into_inner());
        let now = std::time::Instant::now();
        let finished = total > 0 && done >= total;
        if !finished && l.is_some_and(|t| now.duration_since(t).as_millis() < 200) {
            return;
        }
        *l = Some(now);
        match (done.min(total) * 100).checked_div(total) {
            Some(pct) => eprint!("\r\x1b[Kfsck.ldfs: {phase} {pct}% ({done}/{total})"),
            None => eprint!("\r\x1b[Kfsck.ldfs: {phase} {done}"),
        }
    })
}
