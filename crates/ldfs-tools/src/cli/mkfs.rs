//! `ldfs mkfs`: format an image file or block device as a log (`lld`) with
//! an empty root directory, or with `--meta` as a dual pair (DualFS).

use std::path::PathBuf;

use ldfs::device::{Device, FileDevice, FileDeviceOptions};
use ldfs::lld::layout::MkfsOptions;
use ldfs::lld::mkfs::mkfs;

use super::{parse_size, CmdResult};

/// How many times its size `ldfs mkfs` lets a file system grow by default.
const DEFAULT_GROWTH: u64 = 16;

/// The options of `ldfs mkfs`.
#[derive(clap::Args)]
pub struct MkfsArgs {
    /// The image file or block device (not with --store: then --cache).
    #[arg(required_unless_present = "store")]
    image: Option<PathBuf>,
    /// Make the file system's durable home an object store, s3://BUCKET[/PREFIX] (the bucket
    /// is created if absent; a prefix holding a file system already is refused). Endpoint,
    /// region and keys from AWS_ENDPOINT_URL, AWS_REGION, AWS_ACCESS_KEY_ID,
    /// AWS_SECRET_ACCESS_KEY or the AWS shared files (AWS_PROFILE), never the command line.
    #[arg(long, requires = "cache", conflicts_with_all = ["image", "meta"])]
    store: Option<String>,
    /// With --store: the local cache and write log (a file, made --size large, or a block
    /// device), formatted here and uploaded.
    #[arg(long, requires = "store")]
    cache: Option<PathBuf>,
    /// With --store: the most bytes of segments the cache holds (remembered in its note;
    /// `ldfs mount --cache-size` overrides it). The cache file is then left sparse.
    #[arg(long, requires = "store", value_parser = parse_size)]
    cache_size: Option<u64>,
    /// Size of the image file to create, e.g. 1G, 512M. Omit for a block device or an existing file.
    #[arg(long, value_parser = parse_size)]
    size: Option<u64>,
    /// Segment size (the unit of cleaning and of large writes).
    #[arg(long, default_value = "2M", value_parser = parse_size)]
    segment_size: u64,
    /// Largest block the engine accepts.
    #[arg(long, default_value = "64K", value_parser = parse_size)]
    max_block: u64,
    /// Segments kept back for checkpoints and the cleaner (default: 1/16, 4..=64; at least 4).
    #[arg(long)]
    reserved_segments: Option<u32>,
    /// The largest size `ldfs resize` may grow the file system to: the
    /// checkpoint slots get room for its segment table (16 bytes a segment,
    /// twice). Default 16 times the size (at most 2^24 segments); equal to
    /// the size, older ldfs binaries can still read the image.
    #[arg(long, value_parser = parse_size, conflicts_with = "meta")]
    max_size: Option<u64>,
    /// Pages per checkpoint slot for the kept-checkpoint table, where
    /// `-o protect=` keeps one 48-byte record per checkpoint (packed
    /// across the pages: the default 16 keeps 1365, an hour at a commit
    /// every 3 s, 24 h at one every 64 s). 0 writes the older format: at most 24 kept
    /// checkpoints, protect= keeps one every span/8, and ldfs binaries
    /// from before the kept table can still read the image.
    #[arg(long, default_value_t = 16, conflicts_with = "meta")]
    kept_table_pages: u32,
    /// With --size: leave the image file (and a META it creates) sparse
    /// instead of writing it whole. Quicker to make and takes only what is
    /// written, but every segment ldfs first writes is then allocated by
    /// the host file system, in the fsync that flushes it (a journal
    /// commit of the host's: small fsyncs about 1.5x slower).
    #[arg(long)]
    sparse: bool,
    /// With --size: write the whole image file (zeros), so the host file
    /// system never allocates under ldfs. The default; kept for scripts.
    #[arg(long, conflicts_with = "sparse")]
    preallocate: bool,
    /// Format a dual file system (DualFS): IMAGE holds file data in
    /// groups, updated in place; META (created if absent) holds the
    /// metadata log. Mount IMAGE; META is found by the path recorded here.
    #[arg(long)]
    meta: Option<PathBuf>,
    /// Size of META when it is created (default: 1/10 of IMAGE, at least 64M).
    #[arg(long, value_parser = parse_size, requires = "meta")]
    meta_size: Option<u64>,
}

pub fn run(a: MkfsArgs) -> CmdResult {
    if a.preallocate && a.size.is_none() {
        return Err("--preallocate needs --size".into());
    }
    if let (Some(url), Some(cache)) = (&a.store, &a.cache) {
        return mkfs_store(url, cache, &a);
    }
    // Files mkfs makes are preallocated unless --sparse (issue 16: the
    // figures users get are those of `bench fs`, whose images always were).
    format(
        a.image.expect("clap requires IMAGE without --store"),
        a.size,
        a.segment_size,
        a.max_block,
        (a.reserved_segments, a.max_size, a.kept_table_pages),
        !a.sparse,
        a.meta.map(|m| (m, a.meta_size)),
    )
}

/// `ldfs mkfs --store URL --cache PATH`: formats the cache as an image (no growth: the
/// store's objects carry the geometry), then, holding the lease, uploads its first checkpoint
/// and releases the lease.
fn mkfs_store(url: &str, cache: &std::path::Path, a: &MkfsArgs) -> CmdResult {
    use ldfs::store::segments::newest_checkpoint;
    let url = super::store::StoreUrl::parse(url)?;
    let s3 = url.open(None)?;
    s3.create_bucket().map_err(|e| format!("{url}: {e}"))?;
    let store: std::sync::Arc<dyn ldfs::store::ObjectStore> = s3;
    if let Some((key, obj)) = newest_checkpoint(&*store).map_err(|e| format!("{url}: {e}"))? {
        return Err(format!(
            "{url} holds a file system already (fs id {:016x}, {key}); mount it, or choose \
             another bucket or prefix",
            obj.geo.fs_id
        )
        .into());
    }
    if a.size.is_none() && !cache.exists() {
        return Err(format!("{}: absent; give --size to make it", cache.display()).into());
    }
    let size = match a.size {
        Some(s) => s,
        None => FileDevice::open(cache, FileDeviceOptions::default())?.size_bytes(),
    };
    format(
        cache.to_path_buf(),
        a.size,
        a.segment_size,
        a.max_block,
        (
            a.reserved_segments,
            Some(a.max_size.unwrap_or(size)),
            a.kept_table_pages,
        ),
        // A bounded cache holds only what it must: sparse.
        !a.sparse && a.cache_size.is_none(),
        None,
    )?;
    if let Some(n) = a.cache_size {
        let seg = a.segment_size;
        if n < super::store::MIN_CACHE_SEGMENTS * seg {
            return Err(format!(
                "--cache-size {n}: a cache holds at least {} segments ({} bytes)",
                super::store::MIN_CACHE_SEGMENTS,
                super::store::MIN_CACHE_SEGMENTS * seg
            )
            .into());
        }
    }
    let lease = super::store::take_lease(
        store.clone(),
        &url,
        ldfs::store::LeaseOptions::default().duration,
        false,
    )?;
    // A failure from here gives the lease back (taken free: nothing of this cache is the
    // store's yet but what it uploaded whole), so that mkfs can be run again at once (store5).
    let r = upload_first_checkpoint(store, &url, cache, a, &lease);
    if r.is_err() {
        match lease.give_back() {
            Ok(what) => eprintln!("ldfs mkfs: {url}: {what}"),
            Err(e) => eprintln!("ldfs mkfs: {url}: giving the lease back failed: {e}"),
        }
    }
    r
}

/// `mkfs_store` holding the lease: the cache's first checkpoint uploaded, the lease released.
fn upload_first_checkpoint(
    store: std::sync::Arc<dyn ldfs::store::ObjectStore>,
    url: &super::store::StoreUrl,
    cache: &std::path::Path,
    a: &MkfsArgs,
    lease: &std::sync::Arc<ldfs::store::HeldLease>,
) -> CmdResult {
    use ldfs::store::{SegmentStore, SegmentStoreOptions};
    let _lock =
        crate::fuse::mount::lock_image(cache, true, "ldfs mkfs").map_err(|e| e.to_string())?;
    // Under the lock: a mount of the cache (holding its map) would have refused the format.
    if let Some(removed) = super::store::remove_stale_map(cache)? {
        eprintln!("ldfs mkfs: {removed}");
    }
    // The cache's identity, which its note records (a note vouches only for it; store5).
    let cache_id = super::store::stamp_cache_id(cache)?;
    let dev: std::sync::Arc<dyn Device> =
        std::sync::Arc::new(FileDevice::open(cache, FileDeviceOptions::default())?);
    let seg = SegmentStore::start(
        store.clone(),
        dev,
        lease.clone(),
        SegmentStoreOptions::default(),
    )?;
    let lld = ldfs::lld::Lld::open(
        seg.device(),
        ldfs::lld::LldOptions {
            checkpoint_hook: Some(seg.hook()),
            segment_hook: Some(seg.segment_hook()),
            ..Default::default()
        },
    )?;
    super::store::write_note_as(
        cache,
        url,
        lld.geometry().fs_id,
        lease.writer(),
        a.cache_size,
        Some(cache_id),
    )?;
    lld.checkpoint_now()?;
    lld.close()?;
    seg.wait_uploaded(seg.announced(), std::time::Duration::from_secs(300))?;
    seg.stop();
    lease.release()?;
    println!(
        "uploaded to {url}: checkpoint {}, {} bytes of segment objects",
        seg.uploaded(),
        seg.uploaded_at().1
    );
    Ok(())
}

/// Writes every byte of a device just created (zeros), then flushes: the
/// host file system allocates the whole file now, not under ldfs's fsyncs.
fn preallocate(dev: &FileDevice) -> CmdResult {
    let zeros = vec![0u8; 1 << 20];
    let size = dev.size_bytes();
    let mut off = 0;
    while off < size {
        let n = (size - off).min(zeros.len() as u64) as usize;
        dev.write_at(&zeros[..n], off)?;
        off += n as u64;
    }
    dev.flush()?;
    Ok(())
}

fn format(
    image: PathBuf,
    size: Option<u64>,
    segment_size: u64,
    max_block: u64,
    (reserved, max_size, kept_table_pages): (Option<u32>, Option<u64>, u32),
    fill: bool,
    meta: Option<(PathBuf, Option<u64>)>,
) -> CmdResult {
    // An existing image may be mounted (or checked): formatting it under
    // its daemon is refused, as a second mount is.
    let _lock = if image.exists() {
        Some(crate::fuse::mount::lock_image(&image, true, "ldfs mkfs").map_err(|e| e.to_string())?)
    } else {
        None
    };
    // Only a file made here is written whole: a block device or an
    // existing file (no --size) is formatted as it is.
    let dev = match size {
        Some(size) => {
            let dev = FileDevice::create(&image, size, FileDeviceOptions::default())?;
            if fill {
                preallocate(&dev)?;
            }
            dev
        }
        None => FileDevice::open(&image, FileDeviceOptions::default())?,
    };
    let max_block_bytes =
        u32::try_from(max_block).map_err(|_| format!("--max-block {max_block} is too large"))?;
    let opts = MkfsOptions {
        segment_bytes: segment_size,
        max_block_bytes,
        reserved_segments: reserved,
        fs_id: 0,
        max_bytes: None,
        kept_pages: 0,
    };
    if let Some((meta, meta_size)) = meta {
        return mkfs_dual(image, dev, meta, meta_size, fill, opts);
    }
    // Room to grow (`ldfs resize`): 16 times, a few slot pages on a small
    // image, 1/4096 of a large one's size with 2 MiB segments.
    let size = dev.size_bytes();
    let max = max_size.unwrap_or(size.saturating_mul(DEFAULT_GROWTH));
    if max < size {
        return Err(format!("--max-size {max} is below the size, {size}").into());
    }
    let opts = MkfsOptions {
        max_bytes: Some(max),
        kept_pages: kept_table_pages,
        ..opts
    };
    let g = mkfs(&dev, &opts)?;
    // The file system on top: an empty root directory owned by the caller.
    let dev: std::sync::Arc<dyn Device> = std::sync::Arc::new(dev);
    let lld = ldfs::lld::Lld::open(dev.clone(), ldfs::lld::LldOptions::default())?;
    let ctx = ldfs::fs::Ctx {
        uid: unsafe { libc::getuid() },
        gid: unsafe { libc::getgid() },
        umask: 0,
    };
    ldfs::fs::Fs::format(&lld, ctx)?;
    lld.close()?;
    drop(lld);
    println!(
        "formatted {}: {} bytes, {} segments of {} KiB, max block {} bytes, {} reserved segments, fs id {:016x}, resize up to {} segments",
        image.display(),
        dev.size_bytes(),
        g.segment_count,
        g.segment_bytes() >> 10,
        g.max_block_bytes,
        g.reserved_segments,
        g.fs_id,
        g.max_segments()
    );
    Ok(())
}

/// `ldfs mkfs --meta META DATA`: the engine on META, the groups on DATA.
fn mkfs_dual(
    image: PathBuf,
    data: FileDevice,
    meta: PathBuf,
    meta_size: Option<u64>,
    fill: bool,
    lld: MkfsOptions,
) -> CmdResult {
    let _meta_lock = if meta.exists() {
        Some(crate::fuse::mount::lock_image(&meta, true, "ldfs mkfs").map_err(|e| e.to_string())?)
    } else {
        None
    };
    let meta_dev = if meta.exists() && meta_size.is_none() {
        FileDevice::open(&meta, FileDeviceOptions::default())?
    } else {
        let size = meta_size.unwrap_or((data.size_bytes() / 10).max(64 << 20));
        let dev = FileDevice::create(&meta, size, FileDeviceOptions::default())?;
        if fill {
            preallocate(&dev)?;
        }
        dev
    };
    // Recorded absolute, so a mount from any directory finds it.
    let meta_path = std::fs::canonicalize(&meta)
        .map_err(|e| format!("{}: {e}", meta.display()))?
        .display()
        .to_string();
    let meta_dev: std::sync::Arc<dyn Device> = std::sync::Arc::new(meta_dev);
    let data: std::sync::Arc<dyn Device> = std::sync::Arc::new(data);
    let geo = ldfs::dual::mkfs(
        meta_dev.clone(),
        &*data,
        &ldfs::dual::DualMkfsOptions {
            lld,
            meta_path: meta_path.clone(),
            ..Default::default()
        },
    )?;
    let d = ldfs::dual::Dual::open(meta_dev.clone(), data, ldfs::lld::LldOptions::default())?;
    let ctx = ldfs::fs::Ctx {
        uid: unsafe { libc::getuid() },
        gid: unsafe { libc::getgid() },
        umask: 0,
    };
    ldfs::fs::Fs::format(&d, ctx)?;
    d.close()?;
    println!(
        "formatted {} (data: {} groups of {} blocks of 4 KiB) with metadata on {} ({} bytes), fs id {:016x}",
        image.display(),
        geo.groups,
        geo.group_blocks,
        meta_path,
        meta_dev.size_bytes(),
        geo.fs_id
    );
    Ok(())
}
