//! `ldfs inspect`: an unmounted image's superblock, checkpoints, segment
//! usage, a segment's partial-segment summaries and one inode, as text or
//! JSON; for a dual pair, the data device's groups and bitmap first.

use std::path::PathBuf;

use ldfs::device::{Device, FileDevice};
use ldfs::lld::mkfs::{read_checkpoints, read_superblock};
use ldfs::lld::usage::SegmentState;
use ldfs::lld::{Lld, LldOptions, SegmentId, PAGE_BYTES};

use super::stats::{dual_json, dual_text};
use super::CmdResult;
use crate::fuse::mount;

/// The options of `ldfs inspect`.
#[derive(clap::Args)]
pub struct InspectArgs {
    image: PathBuf,
    #[arg(long)]
    segment: Option<u32>,
    /// Print every segment's usage entry, not only a summary of states.
    #[arg(long)]
    all_segments: bool,
    /// Print one inode: its record and where each of its blocks lies
    /// (segment, byte offset, length, crc).
    #[arg(long, conflicts_with = "path")]
    inode: Option<u64>,
    /// Resolve a path (from the root of the file system) to its inode,
    /// then as --inode.
    #[arg(long)]
    path: Option<String>,
    /// Print JSON (superblock, checkpoint slots, usage summary, and the
    /// segment's partial segments and the inode or path asked for)
    /// instead of text.
    #[arg(long)]
    json: bool,
}

pub fn run(a: InspectArgs) -> CmdResult {
    let InspectArgs {
        image,
        segment,
        all_segments,
        inode,
        path,
        json,
    } = a;
    // A store-backed file system's cache: said first (its note names the store).
    let store = super::store_check::store_cache(&image)?;
    if let (Some(n), false) = (&store, json) {
        println!("store cache\n  {}", n.describe(&image));
    }
    let dual = inspect_dual(
        &image,
        json,
        segment,
        all_segments,
        inode_target(inode, path.as_deref()),
    );
    if let Err(e) = dual {
        Err(e)
    } else if let Ok(true) = dual {
        Ok(())
    } else if json {
        cmd_inspect_json(&image, segment, inode, path.as_deref(), store.as_ref())
    } else {
        cmd_inspect(image.clone(), segment, all_segments).and_then(|()| {
            match inode_target(inode, path.as_deref()) {
                Some(t) => {
                    let v = inode_report(&image, t)?;
                    print!("{}", inode_text(&v));
                    Ok(())
                }
                None => Ok(()),
            }
        })
    }
}

/// On a dual data device: prints the pair (devices, groups and their free
/// blocks, the bitmap's summary), then the metadata log's own report (its
/// segments), as text or as one JSON object (the log's, with a `dual`
/// member). False for an ordinary image.
fn inspect_dual(
    image: &std::path::Path,
    json: bool,
    segment: Option<u32>,
    all_segments: bool,
    target: Option<InodeTarget<'_>>,
) -> Result<bool, Box<dyn std::error::Error>> {
    let data: std::sync::Arc<dyn Device> = std::sync::Arc::new(FileDevice::open_read_only(image)?);
    if !ldfs::dual::is_data_device(&*data) {
        return Ok(false);
    }
    let meta_path = mount::dual_meta_path(&*data, image, None)?;
    let meta: std::sync::Arc<dyn Device> =
        std::sync::Arc::new(FileDevice::open_read_only(&meta_path)?);
    // As fsck opens it: bitmaps that disagree with their descriptors are
    // shown as they are, not refused.
    let d = ldfs::dual::Dual::open_for_fsck(
        meta,
        data,
        ldfs::lld::LldOptions {
            read_only: true,
            ..Default::default()
        },
    )?;
    let s = d.stats();
    drop(d);
    if json {
        let mut v = inspect_json_value(&meta_path, segment, None, None)?;
        let mut dj = dual_json(&s);
        dj["data_device"] = serde_json::json!(image.display().to_string());
        dj["metadata_device"] = serde_json::json!(meta_path.display().to_string());
        v["dual"] = dj;
        if let Some(t) = target {
            v["inode"] = inode_report(image, t)?;
        }
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(true);
    }
    println!("dual file system {:016x}", s.geo.fs_id);
    println!(
        "  data device: {} ({} blocks of 4 KiB)",
        image.display(),
        s.geo.blocks
    );
    println!("  metadata device: {}", meta_path.display());
    print!("{}", dual_text(&s));
    println!("metadata log:");
    cmd_inspect(meta_path, segment, all_segments)?;
    if let Some(t) = target {
        print!("{}", inode_text(&inode_report(image, t)?));
    }
    Ok(true)
}

fn cmd_inspect(image: PathBuf, segment: Option<u32>, all: bool) -> CmdResult {
    let dev = log_device(&image)?;
    let (g, sb_errs) = read_superblock(&*dev)?;
    println!("superblock");
    for (i, e) in sb_errs.iter().enumerate() {
        match e {
            None => println!("  copy {i}: ok"),
            Some(e) => println!("  copy {i}: BAD: {e}"),
        }
    }
    println!("  fs id              {:016x}", g.fs_id);
    println!(
        "  device             {} pages of {PAGE_BYTES} bytes",
        g.total_pages
    );
    println!(
        "  segments           {} x {} pages, from page {}",
        g.segment_count, g.segment_pages, g.first_segment_page
    );
    println!(
        "  checkpoint slots   pages {} and {}, {} pages each",
        g.slot_pages[0], g.slot_pages[1], g.checkpoint_pages
    );
    println!("  max block          {} bytes", g.max_block_bytes);
    println!("  reserved segments  {}", g.reserved_segments);
    println!(
        "  resize             up to {} segments{}",
        g.max_segments(),
        if g.resizable() {
            " (flag RESIZE: the newest checkpoint's count rules)"
        } else {
            ""
        }
    );
    let slots = read_checkpoints(&*dev, &g)?;
    let mut newest: Option<(u64, usize)> = None;
    for (i, s) in slots.iter().enumerate() {
        match s {
            Ok((h, _)) => {
                println!(
                    "checkpoint slot {i}: serial {} epoch {} next seq {} log at segment {} page {} next segment {} next list {}",
                    h.serial, h.epoch, h.next_seq, h.log_segment, h.log_page, h.next_segment, h.next_list
                );
                match h.map_root {
                    Some((ptr, height, entries)) => {
                        println!("  map root at byte {} (crc {:08x}), height {height}, {entries} entries", ptr.addr, ptr.crc)
                    }
                    None => println!("  map empty"),
                }
                if newest.is_none_or(|(s, _)| h.serial > s) {
                    newest = Some((h.serial, i));
                }
            }
            Err(e) => println!("checkpoint slot {i}: invalid: {e}"),
        }
    }
    if let Some((_, i)) = newest {
        let (_, usage) = slots[i].as_ref().unwrap();
        let mut counts = [0u32; 4];
        for (_, u) in usage.iter() {
            counts[u.state as usize] += 1;
        }
        let (h, usage) = slots[i].as_ref().unwrap();
        let seg_bytes = g.segment_bytes();
        let dirty_bytes = counts[3] as u64 * seg_bytes;
        let dirty_live: u64 = usage
            .iter()
            .filter(|(_, u)| u.state == SegmentState::Dirty)
            .map(|(_, u)| u.live_bytes as u64)
            .sum();
        println!(
            "segment usage (slot {i}): {} clean, {} next, {} active, {} dirty; {} live bytes",
            counts[0],
            counts[1],
            counts[2],
            counts[3],
            usage.live_bytes_total()
        );
        if counts[3] > 0 {
            println!(
                "  dirty segments {:.1}% live on average; {} dead bytes the cleaner can reclaim",
                100.0 * dirty_live as f64 / dirty_bytes as f64,
                dirty_bytes - dirty_live
            );
            let mut hist = [0u32; 10];
            for (_, u) in usage.iter().filter(|(_, u)| u.state == SegmentState::Dirty) {
                let d = (u.live_bytes as u64 * 10 / seg_bytes).min(9) as usize;
                hist[d] += 1;
            }
            let cells: Vec<String> = hist
                .iter()
                .enumerate()
                .map(|(d, n)| format!("{}-{}%: {n}", d * 10, d * 10 + 10))
                .collect();
            println!("  dirty segments by utilization: {}", cells.join(", "));
        }
        let cost = if h.user_bytes == 0 {
            "n/a".to_string()
        } else {
            format!(
                "{:.3}",
                (h.user_bytes + h.moved_bytes) as f64 / h.user_bytes as f64
            )
        };
        println!(
            "writes since mkfs: {} bytes by users, {} bytes moved by the cleaner; write cost (user + moved) / user = {cost}",
            h.user_bytes, h.moved_bytes
        );
        if all {
            for (s, u) in usage.iter().filter(|(_, u)| u.state != SegmentState::Clean) {
                println!(
                    "  segment {:>6}  {:<6?}  live {:>10}  last seq {}",
                    s.0, u.state, u.live_bytes, u.last_seq
                );
            }
        }
    }
    if let Some(seg) = segment {
        println!("segment {seg} summaries");
        let (partials, end) = segment_partials(&*dev, &g, seg)?;
        for p in &partials {
            let h = &p.header;
            println!(
                "  page {}: epoch {} seq {} summary {} pages, data {} pages, next segment {}",
                h.page, h.epoch, h.seq, h.summary_pages, h.data_pages, h.next_segment
            );
            for r in &p.records {
                println!("    {r:?}");
            }
        }
        if let Some(why) = end {
            println!("  {why}; end of segment's log");
        }
    }
    Ok(())
}

/// The image read-only; for a store cache whose residency map lists segments it does not hold,
/// a view that reads those from their objects in the store (its note names it; credentials as
/// for a mount), as fsck does: without it they would read as the holes they are. A store that
/// cannot be reached is said, and the cache is read as it is.
fn log_device(
    image: &std::path::Path,
) -> Result<std::sync::Arc<dyn Device>, Box<dyn std::error::Error>> {
    let dev: std::sync::Arc<dyn Device> = std::sync::Arc::new(FileDevice::open_read_only(image)?);
    Ok(match super::store::read_through(image, dev.clone()) {
        Ok(None) => dev,
        Ok(Some((view, url))) => {
            eprintln!(
                "ldfs inspect: {}: {} segments are in {url} only: read from there",
                image.display(),
                view.evicted().len()
            );
            view as std::sync::Arc<dyn Device>
        }
        Err(e) => {
            eprintln!(
                "ldfs inspect: {}: segments of this cache are in its store only, which cannot be \
                 reached ({e}): they read as holes here",
                image.display()
            );
            dev
        }
    })
}

/// The partial segments of segment `seg` as recovery reads them (summary
/// verified), in log order, up to the first page without a valid one; and
/// why the scan ended before the segment's end, if it did.
fn segment_partials(
    dev: &dyn Device,
    g: &ldfs::lld::layout::Geometry,
    seg: u32,
) -> Result<(Vec<ldfs::lld::ScannedPartial>, Option<String>), Box<dyn std::error::Error>> {
    if seg >= g.segment_count {
        return Err(format!(
            "segment {seg} does not exist (the device has {})",
            g.segment_count
        )
        .into());
    }
    let mut out: Vec<ldfs::lld::ScannedPartial> = Vec::new();
    let mut page = 0;
    while page < g.segment_pages {
        match ldfs::lld::read_partial(dev, g, SegmentId(seg), page, ldfs::lld::Verify::Summary)? {
            Ok(p) => {
                page += p.header.total_pages();
                out.push(p);
            }
            Err(why) => return Ok((out, Some(format!("page {page}: no valid summary ({why})")))),
        }
    }
    Ok((out, None))
}

/// Which inode `inspect` is asked about.
#[derive(Clone, Copy)]
enum InodeTarget<'a> {
    Ino(u64),
    Path(&'a str),
}

fn inode_target(inode: Option<u64>, path: Option<&str>) -> Option<InodeTarget<'_>> {
    inode.map(InodeTarget::Ino).or(path.map(InodeTarget::Path))
}

/// One inode of an unmounted image (or dual pair, named by its data
/// device), opened read-only: its record and, for a list, where every
/// block lies: in the log (segment, byte, length, crc), or for a dual
/// pair's file data, the data block and its group.
fn inode_report(
    image: &std::path::Path,
    target: InodeTarget<'_>,
) -> Result<serde_json::Value, Box<dyn std::error::Error>> {
    use ldfs::ld::LogicalDisk;
    let dev = log_device(image)?;
    let ro = LldOptions {
        read_only: true,
        ..Default::default()
    };
    if ldfs::dual::is_data_device(&*dev) {
        let meta_path = mount::dual_meta_path(&*dev, image, None)?;
        let meta: std::sync::Arc<dyn Device> =
            std::sync::Arc::new(FileDevice::open_read_only(&meta_path)?);
        let d = std::sync::Arc::new(ldfs::dual::Dual::open_for_fsck(meta, dev, ro)?);
        let ld: std::sync::Arc<dyn LogicalDisk> = d.clone();
        let geo = d.label().geo;
        return inode_report_on(ld, target, &|list, ix| {
            if let Some(b) = d.data_block(list, ix)? {
                return Ok(Some(serde_json::json!({
                    "index": ix,
                    "data_block": b,
                    "group": b / geo.group_blocks as u64,
                    "offset": geo.offset(b),
                })));
            }
            let eng = d.engine_list(list)?;
            log_block_json(d.meta(), eng, ix)
        });
    }
    let lld = std::sync::Arc::new(Lld::open(dev, ro)?);
    let ld: std::sync::Arc<dyn LogicalDisk> = lld.clone();
    inode_report_on(ld, target, &|list, ix| log_block_json(&lld, list, ix))
}

/// Where block `ix` of engine list `list` lies in the log, if it exists.
fn log_block_json(
    lld: &Lld,
    list: ldfs::ld::ListId,
    ix: u64,
) -> Result<Option<serde_json::Value>, Box<dyn std::error::Error>> {
    let g = lld.geometry();
    use ldfs::ld::LogicalDisk;
    use ldfs::lld::types::entry_flags;
    let Some(e) = lld.map_entry(ldfs::lld::Key::new(list, ix))? else {
        return Ok(None);
    };
    let compression = match e.flags & entry_flags::ON_DISK_MASK {
        0 => "none",
        entry_flags::COMPRESSED => "lz4",
        entry_flags::ZSTD => "zstd",
        _ => "bad flags",
    };
    // The length before compression costs a read (and a decompression);
    // a block that fails it is shown with the error instead.
    let logical = if compression == "none" {
        serde_json::json!(e.len)
    } else {
        match lld.read(list, ix) {
            Ok(Some(b)) => serde_json::json!(b.len()),
            Ok(None) => serde_json::Value::Null,
            Err(err) => serde_json::json!(err.to_string()),
        }
    };
    Ok(Some(serde_json::json!({
        "index": ix,
        "segment": g.segment_of(e.offset()).map(|s| s.0),
        "offset": e.offset(),
        "length": e.len,
        "logical_length": logical,
        "compression": compression,
        "crc": format!("{:08x}", e.crc),
        "flags": e.flags,
    })))
}

type BlockLocator<'a> = dyn Fn(ldfs::ld::ListId, u64) -> Result<Option<serde_json::Value>, Box<dyn std::error::Error>>
    + 'a;

/// `inode_report` on an opened Logical Disk; `locate` says where a block
/// of a list lies.
fn inode_report_on(
    ld: std::sync::Arc<dyn ldfs::ld::LogicalDisk>,
    target: InodeTarget<'_>,
    locate: &BlockLocator<'_>,
) -> Result<serde_json::Value, Box<dyn std::error::Error>> {
    use ldfs::fs::{Fs, FsOptions, ROOT_INO};
    let fs = Fs::mount(
        ld.clone(),
        FsOptions {
            read_only: true,
            ..Default::default()
        },
    )?;
    let ino = match target {
        InodeTarget::Ino(n) => n,
        InodeTarget::Path(p) => {
            let mut ino = ROOT_INO;
            for part in p.split('/').filter(|c| !c.is_empty()) {
                ino = fs
                    .lookup(ino, part.as_bytes())
                    .map_err(|e| format!("{p}: {part}: {e}"))?
                    .ino;
            }
            ino
        }
    };
    let i = fs
        .inode_record(ino)
        .map_err(|e| format!("inode {ino}: {e}"))?;
    let mut blocks = Vec::new();
    if i.list != 0 {
        let list = ldfs::ld::ListId(i.list);
        let mut from = 0;
        loop {
            let idx = ld.indices(list, from, 1024)?;
            let Some(&last) = idx.last() else { break };
            for ix in idx {
                if let Some(b) = locate(list, ix)? {
                    blocks.push(b);
                }
            }
            from = last + 1;
        }
    }
    let t = |t: ldfs::fs::inode::Time| format!("{}.{:09}", t.secs, t.nsecs);
    // Blocks in the log (a dual pair's data blocks are stored plain, in
    // place, and not counted): bytes as stored and before compression.
    let stored_bytes: u64 = blocks.iter().filter_map(|b| b["length"].as_u64()).sum();
    let logical_bytes: u64 = blocks
        .iter()
        .filter_map(|b| b["logical_length"].as_u64())
        .sum();
    let compress = match i.list {
        0 => None,
        l => ld
            .list_hints(ldfs::ld::ListId(l))?
            .map(|h| h.compress.to_string()),
    };
    Ok(serde_json::json!({
        "ino": i.ino,
        "generation": i.generation,
        "kind": format!("{:?}", i.kind()),
        "mode": format!("{:o}", i.mode),
        "uid": i.uid,
        "gid": i.gid,
        "nlink": i.nlink,
        "size": i.size,
        "parent": i.parent,
        "rdev": i.rdev,
        "atime": t(i.atime),
        "mtime": t(i.mtime),
        "ctime": t(i.ctime),
        "list": i.list,
        "compress": compress,
        "stored_bytes": stored_bytes,
        "logical_bytes": logical_bytes,
        "inline_bytes": i.inline.len(),
        "xattrs": i.xattrs.iter().map(|(n, v)| serde_json::json!({
            "name": String::from_utf8_lossy(n),
            "bytes": v.len(),
            "list": v.list(),
        })).collect::<Vec<_>>(),
        "blocks": blocks,
    }))
}

/// The inode report as text.
fn inode_text(v: &serde_json::Value) -> String {
    let mut out = format!("inode {}\n", v["ino"]);
    for k in [
        "kind",
        "mode",
        "uid",
        "gid",
        "nlink",
        "size",
        "parent",
        "rdev",
        "generation",
        "atime",
        "mtime",
        "ctime",
        "list",
        "compress",
        "inline_bytes",
    ] {
        let val = &v[k];
        let shown = val.as_str().map_or(val.to_string(), str::to_string);
        out += &format!("  {k:<13}{shown}\n");
    }
    for x in v["xattrs"].as_array().into_iter().flatten() {
        out += &format!(
            "  xattr        {} ({} bytes)\n",
            x["name"].as_str().unwrap_or(""),
            x["bytes"]
        );
    }
    let blocks = v["blocks"].as_array().map_or(&[][..], |b| b.as_slice());
    if !blocks.is_empty() {
        let (stored, logical) = (
            v["stored_bytes"].as_u64().unwrap_or(0),
            v["logical_bytes"].as_u64().unwrap_or(0),
        );
        if stored > 0 {
            out += &format!(
                "  {:<13}{logical} logical bytes stored in {stored} ({:.1}%)\n",
                "stored",
                stored as f64 * 100.0 / logical.max(1) as f64
            );
        }
        out += &format!("  blocks of list {}:\n", v["list"]);
    }
    for b in blocks {
        if b.get("data_block").is_some() {
            out += &format!(
                "    index {:>10}  data block {:>12}  group {:>6}  byte {:>14}\n",
                b["index"], b["data_block"], b["group"], b["offset"]
            );
            continue;
        }
        let how = match b["compression"].as_str() {
            Some("none") | None => String::new(),
            Some(c) => format!("  {c} of {}", b["logical_length"]),
        };
        out += &format!(
            "    index {:>10}  segment {:>6}  byte {:>14}  length {:>6}  crc {}{how}\n",
            b["index"],
            b["segment"],
            b["offset"],
            b["length"],
            b["crc"].as_str().unwrap_or("")
        );
    }
    out
}

/// `ldfs inspect --json`: superblock, checkpoint slots, usage summary and,
/// if asked, one inode.
fn cmd_inspect_json(
    image: &std::path::Path,
    segment: Option<u32>,
    inode: Option<u64>,
    path: Option<&str>,
    store: Option<&super::store_check::CacheNote>,
) -> CmdResult {
    let mut v = inspect_json_value(image, segment, inode, path)?;
    if let (Some(n), Some(o)) = (store, v.as_object_mut()) {
        o.insert(
            "store".into(),
            serde_json::json!({
                "url": n.url.to_string(),
                "fs_id": format!("{:016x}", n.fs_id),
                "writer": n.writer,
            }),
        );
    }
    println!("{}", serde_json::to_string_pretty(&v)?);
    Ok(())
}

/// What `inspect --json` prints for a log.
fn inspect_json_value(
    image: &std::path::Path,
    segment: Option<u32>,
    inode: Option<u64>,
    path: Option<&str>,
) -> Result<serde_json::Value, Box<dyn std::error::Error>> {
    let dev = log_device(image)?;
    let (g, sb_errs) = read_superblock(&*dev)?;
    let slots = read_checkpoints(&*dev, &g)?;
    let slot_json: Vec<serde_json::Value> = slots
        .iter()
        .map(|s| match s {
            Ok((h, usage)) => {
                let mut counts = [0u32; 4];
                for (_, u) in usage.iter() {
                    counts[u.state as usize] += 1;
                }
                serde_json::json!({
                    "valid": true,
                    "serial": h.serial,
                    "epoch": h.epoch,
                    "next_seq": h.next_seq,
                    "log_segment": h.log_segment,
                    "log_page": h.log_page,
                    "next_segment": h.next_segment,
                    "next_list": h.next_list,
                    "map_entries": h.map_root.map(|(_, _, n)| n),
                    "user_bytes": h.user_bytes,
                    "moved_bytes": h.moved_bytes,
                    "segments": {
                        "clean": counts[0], "next": counts[1], "active": counts[2], "dirty": counts[3],
                    },
                    "live_bytes": usage.live_bytes_total(),
                })
            }
            Err(e) => serde_json::json!({ "valid": false, "error": e.to_string() }),
        })
        .collect();
    let mut v = serde_json::json!({
        "superblock": {
            "copies": sb_errs.iter().map(|e| e.as_ref().map_or("ok".to_string(), |e| e.to_string())).collect::<Vec<_>>(),
            "fs_id": format!("{:016x}", g.fs_id),
            "page_bytes": PAGE_BYTES,
            "total_pages": g.total_pages,
            "segment_pages": g.segment_pages,
            "segment_count": g.segment_count,
            "first_segment_page": g.first_segment_page,
            "checkpoint_pages": g.checkpoint_pages,
            "max_block_bytes": g.max_block_bytes,
            "reserved_segments": g.reserved_segments,
            "max_segments": g.max_segments(),
            "resizable": g.resizable(),
        },
        "checkpoints": slot_json,
    });
    if let Some(seg) = segment {
        let (partials, end) = segment_partials(&*dev, &g, seg)?;
        let partials: Vec<serde_json::Value> = partials
            .iter()
            .map(|p| {
                serde_json::json!({
                    "page": p.header.page,
                    "epoch": p.header.epoch,
                    "seq": p.header.seq,
                    "summary_pages": p.header.summary_pages,
                    "data_pages": p.header.data_pages,
                    "next_segment": p.header.next_segment,
                    "records": p.records.iter().map(|r| format!("{r:?}")).collect::<Vec<_>>(),
                })
            })
            .collect();
        v["segment"] = serde_json::json!({ "segment": seg, "partials": partials, "end": end });
    }
    if let Some(t) = inode_target(inode, path) {
        v["inode"] = inode_report(image, t)?;
    }
    Ok(v)
}
