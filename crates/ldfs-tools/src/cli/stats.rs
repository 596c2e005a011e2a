//! `ldfs stats MNT`: a mounted ldfs's figures, which its daemon writes
//! (`stats_text`, `dual_text`); `inspect` shows a dual pair's the same way.

use std::path::Path;

use ldfs::lld::usage::SegmentState;

use super::{control::control_get, CmdResult};

/// Prints what the daemon of the ldfs mounted on `mountpoint` reports.
pub fn run(mountpoint: &Path, json: bool) -> CmdResult {
    let t = control_get(mountpoint, if json { "stats-json" } else { "stats" })?;
    print!("{}", String::from_utf8_lossy(&t));
    if json {
        println!();
    }
    Ok(())
}

/// The engine figures `ldfs stats` prints.
pub(crate) fn stats_text(lld: &ldfs::lld::Lld) -> String {
    use ldfs::ld::LogicalDisk;
    let st = lld.stats();
    let sp = lld.space();
    let mut clean = 0;
    let mut dirty = 0;
    for (_, u) in lld.segment_usage() {
        match u.state {
            SegmentState::Clean => clean += 1,
            SegmentState::Dirty => dirty += 1,
            _ => {}
        }
    }
    let cs = lld.cleaner_stats();
    let (user, moved) = lld.write_totals();
    let cost = if user == 0 {
        1.0
    } else {
        (user + moved) as f64 / user as f64
    };
    format!(
        "cleaner: policy {}, background {}, starts below {} and stops above {} clean segments\ncleaned: {} segments, {} blocks ({} bytes) moved, {} writes waited\nwrite cost (user + moved) / user = {cost:.2}\n",
        lld.cleaner_policy().name(),
        if lld.background_cleaner_running() { "on" } else { "off" },
        lld.start_watermark(),
        lld.stop_watermark(),
        cs.segments_released,
        cs.blocks_moved,
        cs.bytes_moved,
        cs.waits
    ) + &format!(
        "segments: {clean} clean, {dirty} dirty\nlive bytes: {}\ncapacity bytes: {}\navailable bytes: {}\ncheckpoints: {}\npartial segments written: {}\nmap pages written: {}\ndevice flushes: {}\nwrites coalesced at ARU ends: {}\nsegments discarded: {}\n",
        sp.live_bytes,
        sp.capacity_bytes,
        sp.available_bytes,
        st.checkpoints,
        st.partials_written,
        st.map_pages_written,
        st.device_flushes,
        st.writes_coalesced,
        st.segments_discarded
    ) + &compression_text(&st)
        + &history_text(lld)
}

/// What compressing lists took since mount: bytes given to the engine,
/// bytes stored for them, and how many blocks compression paid for.
fn compression_text(st: &ldfs::lld::EngineStats) -> String {
    let ratio = if st.compress_logical_bytes == 0 {
        String::new()
    } else {
        format!(
            " ({:.1}% of logical)",
            st.compress_stored_bytes as f64 * 100.0 / st.compress_logical_bytes as f64
        )
    };
    format!(
        "compression since mount: {} logical bytes written, {} bytes stored{ratio}; {} blocks compressed, {} stored plain; the cleaner recompressed {} cold blocks, saving {} bytes\n",
        st.compress_logical_bytes,
        st.compress_stored_bytes,
        st.compress_blocks_compressed,
        st.compress_blocks_plain,
        st.blocks_recompressed,
        st.recompress_bytes_saved
    )
}

/// What history holds: in all, and what each snapshot alone holds (its
/// deletion would give that back).
fn history_text(lld: &ldfs::lld::Lld) -> String {
    let snaps = lld.snapshots();
    let mut t = format!(
        "history bytes (held only for snapshots; used, not available): {}
snapshots: {} of at most {}
",
        lld.history_bytes(),
        snaps.len(),
        ldfs::lld::snapshot::MAX_SNAPSHOTS
    );
    for s in snaps {
        t += &format!(
            "  {} {}: {} bytes only it holds{}\n",
            if s.protected {
                "protected checkpoint"
            } else {
                "snapshot"
            },
            s.number,
            s.held_alone_bytes,
            if s.name.is_empty() {
                String::new()
            } else {
                format!(" ({:?})", s.name)
            }
        );
    }
    t
}

/// The data device of a dual file system as `inspect` and `stats` show
/// it: the groups with their free blocks, and the bitmap's summary.
pub(crate) fn dual_text(s: &ldfs::dual::DualStats) -> String {
    let free: u64 = s.group_free.iter().map(|&f| f as u64).sum();
    let empty = (0..s.geo.groups)
        .filter(|&g| s.group_free[g as usize] as u64 == s.geo.group_len(g))
        .count();
    let full = s.group_free.iter().filter(|&&f| f == 0).count();
    let mut t = format!(
        "  {} groups of {} blocks; {} blocks free ({:.1}%)\n  bitmap: {} blocks allocated, {} freed and reusable after the next commit, {} reserved by operations under way; {} groups empty, {} full; {} blocks discarded since mount\n",
        s.geo.groups,
        s.geo.group_blocks,
        free,
        free as f64 * 100.0 / s.geo.blocks.max(1) as f64,
        s.allocated,
        s.freed_pending,
        s.reserved,
        empty,
        full,
        s.discarded
    );
    for (g, f) in s.group_free.iter().enumerate() {
        t += &format!("  group {g}: {f} of {} free\n", s.geo.group_len(g as u32));
    }
    t
}

/// `dual_text` as JSON.
pub(crate) fn dual_json(s: &ldfs::dual::DualStats) -> serde_json::Value {
    let free: u64 = s.group_free.iter().map(|&f| f as u64).sum();
    serde_json::json!({
        "fs_id": format!("{:016x}", s.geo.fs_id),
        "block_bytes": ldfs::dual::format::DATA_BLOCK_BYTES,
        "blocks": s.geo.blocks,
        "group_blocks": s.geo.group_blocks,
        "free_blocks": free,
        "bitmap": {
            "allocated": s.allocated,
            "freed_pending": s.freed_pending,
            "reserved": s.reserved,
        },
        "discarded_blocks": s.discarded,
        "groups": s.group_free.iter().enumerate().map(|(g, &f)| serde_json::json!({
            "group": g,
            "blocks": s.geo.group_len(g as u32),
            "free": f,
        })).collect::<Vec<_>>(),
    })
}
