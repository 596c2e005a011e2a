//! Recovery: newest valid checkpoint, then a two-phase roll-forward
//! (BSD-LFS 3.3 and 4.3; NetBSD `lfs_rfw.c`), or a rebuild from every
//! summary when neither checkpoint slot can be used (LD 3.4, the LLD method).
//!
//! Roll-forward phase 1 walks the log from the checkpoint's position and
//! accepts a partial segment only if its summary and every block checksum
//! hold and it carries this file system's id, the checkpoint's epoch and
//! exactly the next sequence number; it stops at the first that does not.
//! Phase 2 applies, in log order, the records outside any ARU and those of
//! ARUs whose end record was accepted in phase 1. Nothing is applied until
//! the walk is over, so a torn tail can never be half-applied. Partials of
//! map pages that end the log belong to a checkpoint that never became
//! durable: the log ends before them, so their room is the recovery
//! checkpoint's. The next list id ends above every list a replayed write
//! names.

use std::collections::HashSet;

use super::checkpoint::CheckpointHeader;
use super::engine::{advance_head, choose_next, LldOptions, LogHead, OpenReport};
use super::layout::Geometry;
use super::map::{Map, MapRoot, PageReader};
use super::mkfs;
use super::snapshot::SnapshotRecord;
use super::summary::{self, Expect, Record, SummaryHeader};
use super::types::{Key, MapEntry, SegmentId, PAGE_BYTES};
use super::usage::{SegmentState, SegmentUsage, Usage};
use crate::device::Device;
use crate::ld::{CorruptReason, Corruption, LdError, LdResult};

/// A partial segment read back and verified.
pub struct ScannedPartial {
    pub header: SummaryHeader,
    pub records: Vec<Record>,
    /// Byte address of the data area.
    pub data_base: u64,
}

/// The state recovery hands to the engine.
pub(crate) struct Recovered {
    pub map: Map,
    pub usage: Usage,
    pub log: LogHead,
    pub serial: u64,
    pub next_list: u64,
    pub user_bytes: u64,
    pub moved_bytes: u64,
    pub snapshots: Vec<SnapshotRecord>,
    pub report: OpenReport,
    /// The geometry as the recovered checkpoint has it: its segment count
    /// (a resize's commit point, docs/DESIGN.md "Resize").
    pub geo: Geometry,
}

/// The geometry a decoded slot implies: its usage table's length is its
/// segment count, which `checkpoint::decode` checked against the slots'
/// room and the device.
pub(crate) fn slot_geometry(g: &Geometry, usage: &Usage) -> Geometry {
    g.with_segments(usage.len(), g.total_pages)
        .expect("a decoded slot's segment count fits its geometry")
}

/// How much of a partial segment `read_partial` checks beyond its summary.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Verify {
    /// The summary only.
    Summary,
    /// The summary and every written block's crc, not the map pages: the
    /// rebuild uses no map page, so a damaged one must not cost it the
    /// blocks beside it.
    Blocks,
    /// The summary and the crc of everything it names (roll-forward).
    All,
}

/// Reads and verifies the partial segment at `(seg, page)`. Device errors
/// are errors; anything wrong with the bytes is a `Corruption`, which
/// roll-forward treats as the end of the log (and `ldfs inspect` shows).
pub fn read_partial(
    dev: &dyn Device,
    g: &Geometry,
    seg: SegmentId,
    page: u32,
    verify: Verify,
) -> LdResult<Result<ScannedPartial, Corruption>> {
    let verify_data = verify != Verify::Summary;
    if page >= g.segment_pages {
        return Ok(Err(Corruption {
            what: "summary",
            offset: g.page_addr(seg, g.segment_pages),
            reason: CorruptReason::OutOfBounds {
                field: "page",
                value: page as u64,
                limit: g.segment_pages as u64,
            },
        }));
    }
    let addr = g.page_addr(seg, page);
    let mut first = vec![0u8; PAGE_BYTES];
    dev.read_at(&mut first, addr)?;
    let ex = Expect {
        fs_id: g.fs_id,
        segment: seg.0,
        page,
        pages_left: g.segment_pages - page,
        segment_count: g.next_segment_bound(),
        max_block_bytes: g.max_block_bytes,
    };
    let header = match summary::decode_header(&first, addr, &ex) {
        Ok(h) => h,
        Err(c) => return Ok(Err(c)),
    };
    let len = if verify_data {
        header.total_pages()
    } else {
        header.summary_pages
    } as usize
        * PAGE_BYTES;
    let mut b = first;
    if len > PAGE_BYTES {
        b.resize(len, 0);
        dev.read_at(&mut b[PAGE_BYTES..], addr + PAGE_BYTES as u64)?;
    }
    let records = match summary::decode_records_limited(
        &b,
        addr,
        header.summary_pages,
        header.data_pages,
        g.max_block_bytes,
    ) {
        Ok(r) => r,
        Err(c) => return Ok(Err(c)),
    };
    let data0 = header.summary_pages as usize * PAGE_BYTES;
    let data_base = addr + data0 as u64;
    if verify_data {
        for r in &records {
            let (off, len, crc) = match *r {
                Record::Write {
                    data_off, len, crc, ..
                } => (data_off as usize, len as usize, crc),
                Record::MapPage { data_off, crc, .. } if verify == Verify::All => {
                    (data_off as usize, PAGE_BYTES, crc)
                }
                _ => continue,
            };
            // decode_records bounded off + len by the data area.
            let got = crc32c::crc32c(&b[data0 + off..data0 + off + len]);
            if got != crc {
                return Ok(Err(Corruption {
                    what: "block",
                    offset: data_base + off as u64,
                    reason: CorruptReason::BadChecksum { expected: crc, got },
                }));
            }
        }
    }
    Ok(Ok(ScannedPartial {
        header,
        records,
        data_base,
    }))
}

/// Every valid partial segment of `seg` from its first page on, stopping at
/// the first invalid one (the cleaner's and the rebuild's view of a segment).
pub(crate) fn scan_segment(
    dev: &dyn Device,
    g: &Geometry,
    seg: SegmentId,
    verify: Verify,
) -> LdResult<Vec<ScannedPartial>> {
    let mut out: Vec<ScannedPartial> = Vec::new();
    let mut page = 0;
    while page + 1 < g.segment_pages {
        let Ok(p) = read_partial(dev, g, seg, page, verify)? else {
            break;
        };
        // Partials within a segment are written in increasing sequence;
        // a smaller one is left over from before the segment was reused.
        if let Some(prev) = out.last() {
            if p.header.seq <= prev.header.seq {
                break;
            }
        }
        page += p.header.total_pages();
        out.push(p);
    }
    Ok(out)
}

/// A page of a segment where a damaged summary lies, and why it is bad.
pub(crate) type DamagedAt = (u32, Corruption);

/// As [`scan_segment`], but a damaged partial does not end the scan: the
/// pages after it are tried one by one for the next valid summary (its
/// header names this segment and page and carries the file system's id, so
/// a stray match is as likely as a crc collision), which must still be
/// newer than the last one accepted. Returns the partials and, for each
/// damaged stretch followed by a valid partial, the page it starts at and
/// why. The rebuild and fsck use
/// it; roll-forward never does (a bad summary is the end of the log).
pub(crate) fn scan_segment_resync(
    dev: &dyn Device,
    g: &Geometry,
    seg: SegmentId,
    verify: Verify,
) -> LdResult<(Vec<ScannedPartial>, Vec<DamagedAt>)> {
    let mut out: Vec<ScannedPartial> = Vec::new();
    let mut bad: Vec<DamagedAt> = Vec::new();
    let mut page = 0;
    let mut in_damage = false;
    while page + 1 < g.segment_pages {
        let p = match read_partial(dev, g, seg, page, verify)? {
            Ok(p) => p,
            Err(why) => {
                if !in_damage {
                    bad.push((page, why));
                    in_damage = true;
                }
                page += 1;
                continue;
            }
        };
        if let Some(prev) = out.last() {
            if p.header.seq <= prev.header.seq {
                if in_damage {
                    page += 1;
                    continue;
                }
                break;
            }
        }
        in_damage = false;
        page += p.header.total_pages();
        out.push(p);
    }
    // Damage with no valid partial after it is indistinguishable from the
    // end of the segment's log.
    if in_damage {
        bad.pop();
    }
    Ok((out, bad))
}

struct Pages<'a> {
    dev: &'a dyn Device,
}

impl PageReader for Pages<'_> {
    fn read_page(&self, ptr: super::types::PagePtr) -> LdResult<Vec<u8>> {
        super::engine::DevPages {
            dev: self.dev,
            flight: None,
        }
        .read_page(ptr)
    }
}

/// Opens the newest usable checkpoint and rolls forward; rebuilds if none.
pub(crate) fn recover(dev: &dyn Device, g: &Geometry, opts: &LldOptions) -> LdResult<Recovered> {
    let slots = mkfs::read_checkpoints(dev, g)?;
    let mut report = OpenReport::default();
    let mut valid = Vec::new();
    for (i, s) in slots.into_iter().enumerate() {
        match s {
            Ok((h, u)) => valid.push((i, h, u)),
            Err(c) => {
                report.checkpoint_errors.push(format!("slot {i}: {c}"));
                report.failed_slots.push(i);
            }
        }
    }
    valid.sort_by_key(|(_, h, _)| std::cmp::Reverse(h.serial));
    // A rebuild must outrank every slot still on the device: its first
    // checkpoint takes the next serial, and its epoch fences off their logs.
    let floor = Floor {
        serial: valid.iter().map(|(_, h, _)| h.serial).max().unwrap_or(0),
        epoch: valid.iter().map(|(_, h, _)| h.epoch).max().unwrap_or(0),
        snapshots: valid.first().map_or(0, |(_, h, _)| h.snapshots.len()),
    };
    if let Some(n) = opts.snapshot {
        return open_snapshot(dev, g, opts, valid, report, n);
    }
    if opts.rebuild {
        report
            .checkpoint_errors
            .push("checkpoints ignored: rebuild requested".into());
        valid.clear();
    }
    let r = Pages { dev };
    for (slot, h, usage) in valid {
        let g = &slot_geometry(g, &usage);
        let root = h.map_root.map(|(ptr, height, entries)| MapRoot {
            ptr,
            height,
            entries,
        });
        let map = match Map::open(g.fs_id, opts.map_budget_bytes, root, &r) {
            Ok(m) => m,
            Err(LdError::Corrupt(c)) => {
                report
                    .checkpoint_errors
                    .push(format!("slot {slot}: map: {c}"));
                report.failed_slots.push(slot);
                continue;
            }
            Err(e) => return Err(e),
        };
        let log = LogHead {
            seg: SegmentId(h.log_segment),
            page: h.log_page,
            next: SegmentId(h.next_segment),
            seq: h.next_seq,
            epoch: h.epoch,
            entered: 0,
        };
        let mut rec = Recovered {
            map,
            usage,
            log,
            serial: h.serial,
            next_list: h.next_list,
            user_bytes: h.user_bytes,
            moved_bytes: h.moved_bytes,
            snapshots: h.snapshots.clone(),
            report: OpenReport::default(),
            geo: *g,
        };
        match roll_forward(dev, g, &mut rec) {
            Ok(()) => {
                rec.report.checkpoint_slot = Some(slot);
                rec.report.checkpoint_errors = std::mem::take(&mut report.checkpoint_errors);
                rec.report.failed_slots = std::mem::take(&mut report.failed_slots);
                return Ok(rec);
            }
            Err(LdError::Corrupt(c)) => {
                report
                    .checkpoint_errors
                    .push(format!("slot {slot}: roll-forward: {c}"));
                report.failed_slots.push(slot);
            }
            Err(e) => return Err(e),
        }
    }
    let mut rec = rebuild(dev, g, opts, floor)?;
    rec.report.checkpoint_errors = report.checkpoint_errors;
    rec.report.failed_slots = report.failed_slots;
    Ok(rec)
}

fn roll_forward(dev: &dyn Device, g: &Geometry, rec: &mut Recovered) -> LdResult<()> {
    // Phase 1: find the valid tail of the log.
    let mut partials: Vec<ScannedPartial> = Vec::new();
    let mut committed: HashSet<u64> = HashSet::new();
    let (mut seg, mut page, mut next) = (rec.log.seg, rec.log.page, rec.log.next);
    let mut seq = rec.log.seq;
    let epoch = rec.log.epoch;
    loop {
        let mut found = None;
        let mut why = None;
        // The next partial is where the last one ended, or at the start of
        // the segment it named when the rest of its own was too short.
        for (i, (s, pg)) in [(seg, page), (next, 0)].into_iter().enumerate() {
            // A next segment past the end: named before a shrink cut it
            // off, or by a grow whose slot never became durable (it fences
            // new segments off until then): the log does not go there.
            if (i == 1 && (next == seg || next.0 >= g.segment_count)) || pg >= g.segment_pages {
                continue;
            }
            match read_partial(dev, g, s, pg, Verify::All)? {
                Ok(p) if p.header.epoch == epoch && p.header.seq == seq => {
                    found = Some(p);
                    break;
                }
                Ok(p) => {
                    why = Some(format!(
                        "segment {} page {pg}: epoch {} seq {}, expected epoch {epoch} seq {seq}",
                        s.0, p.header.epoch, p.header.seq
                    ))
                }
                Err(c) => {
                    if why.is_none() {
                        why = Some(c.to_string())
                    }
                }
            }
        }
        let Some(p) = found else {
            rec.report.stopped = why;
            break;
        };
        for r in &p.records {
            if let Record::AruEnd { aru } = r {
                committed.insert(*aru);
            }
        }
        seg = SegmentId(p.header.segment);
        page = p.header.page + p.header.total_pages();
        next = SegmentId(p.header.next_segment);
        seq += 1;
        partials.push(p);
    }
    // Map pages at the end of the log are a checkpoint that never became
    // durable (a durable one would be where recovery starts): they hold
    // nothing to apply, so the log ends before them and the recovery
    // checkpoint writes over them. Otherwise a crash in a checkpoint would
    // leave its pages taking the room the next checkpoint needs.
    while partials.last().is_some_and(|p| {
        !p.records.is_empty()
            && p.records
                .iter()
                .all(|r| matches!(r, Record::MapPage { .. }))
    }) {
        partials.pop();
        rec.report.unfinished_checkpoint_partials += 1;
    }

    // Phase 2: apply.
    let r = Pages { dev };
    let usage = &mut rec.usage;
    let log = &mut rec.log;
    for p in &partials {
        let h = &p.header;
        let here = SegmentId(h.segment);
        if here != log.seg {
            // The log moved on to the segment its predecessor named.
            if here != log.next
                || !usage.can_transition(log.seg, SegmentState::Dirty)
                || !usage.can_transition(here, SegmentState::Active)
            {
                return Err(LdError::Corrupt(Corruption {
                    what: "summary",
                    offset: g.page_addr(here, h.page),
                    reason: CorruptReason::Inconsistent(format!(
                        "log moves from segment {} to {} (named next: {}, state {:?})",
                        log.seg.0,
                        here.0,
                        log.next.0,
                        usage.get(here).state
                    )),
                }));
            }
            usage.transition(log.seg, SegmentState::Dirty);
            usage.transition(here, SegmentState::Active);
            log.seg = here;
            let named = SegmentId(h.next_segment);
            if named != here && usage.can_transition(named, SegmentState::Next) {
                usage.transition(named, SegmentState::Next);
                log.next = named;
            } else {
                log.next = here;
            }
        } else if log.next == log.seg {
            // The log had no segment to continue in when it entered this
            // one; a checkpoint since released some, and the engine chose
            // one of them (Clean in that checkpoint) as it went on.
            let named = SegmentId(h.next_segment);
            if named != here && usage.can_transition(named, SegmentState::Next) {
                usage.transition(named, SegmentState::Next);
                log.next = named;
            }
        }
        for rcd in &p.records {
            if rcd.aru() != 0 && !committed.contains(&rcd.aru()) {
                continue;
            }
            match *rcd {
                Record::Write {
                    key,
                    data_off,
                    len,
                    crc,
                    flags,
                    ..
                } => {
                    let e = MapEntry {
                        addr: p.data_base + data_off as u64,
                        len,
                        crc,
                        flags,
                    };
                    if let Some(old) = rec.map.insert(key, e, &r)? {
                        sub_old(usage, g, &old);
                    }
                    usage.add_live(here, len, h.seq);
                    // Above every list that holds a block, as the rebuild
                    // does: a list created in an ARU that never ended has
                    // no entry, but blocks written to it outside that ARU
                    // survive, and its id must not be handed out again.
                    rec.next_list = rec.next_list.max(key.list.saturating_add(1));
                    if key.list == 0 {
                        rec.next_list = rec.next_list.max(key.index.saturating_add(1));
                    }
                }
                Record::Delete { key, .. } => {
                    if let Some(old) = rec.map.remove(key, &r)? {
                        sub_old(usage, g, &old);
                    }
                }
                Record::DeleteRange { list, from, to, .. } => {
                    if from < to {
                        let (a, b) = (Key { list, index: from }, Key { list, index: to });
                        for (_, old) in rec.map.remove_range(a, b, &r)? {
                            sub_old(usage, g, &old);
                        }
                    }
                }
                Record::DeleteList { list, .. } => {
                    // A list deleted here existed: its id was handed out,
                    // whether or not a write naming it is still in the log
                    // (a write replaced before it was written is dropped).
                    rec.next_list = rec.next_list.max(list.saturating_add(1));
                    let a = Key { list, index: 0 };
                    let b = if list == u64::MAX {
                        Key::MAX
                    } else {
                        Key {
                            list: list + 1,
                            index: 0,
                        }
                    };
                    for (_, old) in rec.map.remove_range(a, b, &r)? {
                        sub_old(usage, g, &old);
                    }
                }
                // Map pages after the checkpoint belong to one that never
                // became durable: not live. ARU ends were used in phase 1.
                Record::AruEnd { .. } | Record::MapPage { .. } => {}
            }
        }
        usage.touch(here, h.seq);
        log.page = h.page + h.total_pages();
        log.seq = h.seq + 1;
        rec.report.rolled_forward += 1;
    }
    if g.segment_pages - log.page < 2 {
        advance_head(usage, log, g)?;
    }
    Ok(())
}

fn sub_old(usage: &mut Usage, g: &Geometry, old: &MapEntry) {
    if let Some(s) = g.segment_of(old.offset()) {
        usage.sub_live(s, old.len);
    }
}

/// Rebuilds the map and usage table from every summary on the device, newest
/// last. Used only when both checkpoint slots are unusable. Blocks deleted by
/// a record whose segment has since been reused can come back; `fsck` and the
/// issue tracker know this limit of the method.
/// The largest serial and epoch of the checkpoint slots that decoded: a
/// rebuilt state starts above them.
#[derive(Clone, Copy)]
struct Floor {
    serial: u64,
    epoch: u64,
    /// Snapshots the newest slot kept: a rebuild drops them (reported).
    snapshots: usize,
}

fn rebuild(dev: &dyn Device, g: &Geometry, opts: &LldOptions, floor: Floor) -> LdResult<Recovered> {
    let mut all = Vec::new();
    for s in 0..g.segment_count {
        all.extend(scan_segment_resync(dev, g, SegmentId(s), Verify::Blocks)?.0);
    }
    all.sort_by_key(|p| (p.header.epoch, p.header.seq));
    let committed: HashSet<(u64, u64)> = all
        .iter()
        .flat_map(|p| {
            p.records.iter().filter_map(move |r| match r {
                Record::AruEnd { aru } => Some((p.header.epoch, *aru)),
                _ => None,
            })
        })
        .collect();
    let mut map = Map::new(g.fs_id, opts.map_budget_bytes);
    let r = Pages { dev };
    let mut live = vec![0i64; g.segment_count as usize];
    let mut last_seq = vec![0u64; g.segment_count as usize];
    let mut next_list = 1u64;
    let seg_idx = |a: u64| g.segment_of(a).map(|s| s.0 as usize);
    for p in &all {
        let here = p.header.segment as usize;
        last_seq[here] = last_seq[here].max(p.header.seq);
        for rcd in &p.records {
            if rcd.aru() != 0 && !committed.contains(&(p.header.epoch, rcd.aru())) {
                continue;
            }
            let removed: Vec<MapEntry> = match *rcd {
                Record::Write {
                    key,
                    data_off,
                    len,
                    crc,
                    flags,
                    ..
                } => {
                    let e = MapEntry {
                        addr: p.data_base + data_off as u64,
                        len,
                        crc,
                        flags,
                    };
                    live[here] += len as i64;
                    next_list = next_list.max(key.list.saturating_add(1));
                    if key.list == 0 {
                        next_list = next_list.max(key.index.saturating_add(1));
                    }
                    map.insert(key, e, &r)?.into_iter().collect()
                }
                Record::Delete { key, .. } => map.remove(key, &r)?.into_iter().collect(),
                Record::DeleteRange { list, from, to, .. } if from < to => map
                    .remove_range(Key { list, index: from }, Key { list, index: to }, &r)?
                    .into_iter()
                    .map(|(_, e)| e)
                    .collect(),
                Record::DeleteList { list, .. } => {
                    next_list = next_list.max(list.saturating_add(1));
                    let b = if list == u64::MAX {
                        Key::MAX
                    } else {
                        Key {
                            list: list + 1,
                            index: 0,
                        }
                    };
                    map.remove_range(Key { list, index: 0 }, b, &r)?
                        .into_iter()
                        .map(|(_, e)| e)
                        .collect()
                }
                _ => Vec::new(),
            };
            for old in removed {
                if let Some(s) = seg_idx(old.offset()) {
                    live[s] -= old.len as i64;
                }
            }
        }
    }
    let mut usage = Usage::new(g.segment_count, g.segment_bytes() as u32);
    for (i, l) in live.iter().enumerate() {
        let l = (*l).clamp(0, g.segment_bytes() as i64) as u32;
        usage.set(
            SegmentId(i as u32),
            SegmentUsage {
                state: if l > 0 {
                    SegmentState::Dirty
                } else {
                    SegmentState::Clean
                },
                live_bytes: l,
                last_seq: last_seq[i],
                pins: 0,
            },
        );
    }
    let last = all.last().map(|p| p.header.segment).unwrap_or(0);
    let Some(head) = usage.pick_clean(SegmentId(last)) else {
        return Err(LdError::Corrupt(Corruption {
            what: "device",
            offset: 0,
            reason: CorruptReason::Inconsistent(
                "rebuild found no clean segment to continue the log in".into(),
            ),
        }));
    };
    usage.transition(head, SegmentState::Active);
    let mut log = LogHead {
        seg: head,
        page: 0,
        next: head,
        seq: all.last().map_or(1, |p| p.header.seq + 1),
        epoch: all.last().map_or(1, |p| p.header.epoch).max(floor.epoch),
        entered: 0,
    };
    choose_next(&mut usage, &mut log);
    Ok(Recovered {
        // No slot to say otherwise: the superblock's count (a resize whose
        // copy 0 was not yet rewritten is lost with both its slots).
        geo: *g,
        map,
        usage,
        log,
        serial: floor.serial,
        next_list,
        user_bytes: 0,
        moved_bytes: 0,
        snapshots: Vec::new(),
        report: OpenReport {
            rebuilt: true,
            rolled_forward: all.len() as u64,
            snapshots_dropped: floor.snapshots,
            ..Default::default()
        },
    })
}

/// Opens kept checkpoint `number` from the newest valid slot: its map, the
/// slot's usage table, no roll-forward (the tree is the checkpoint's,
/// whole). Read-only: the log head is the slot's and never moves.
fn open_snapshot(
    dev: &dyn Device,
    g: &Geometry,
    opts: &LldOptions,
    valid: Vec<(usize, CheckpointHeader, Usage)>,
    mut report: OpenReport,
    number: u64,
) -> LdResult<Recovered> {
    let Some((slot, h, usage)) = valid.into_iter().next() else {
        return Err(LdError::InvalidArgument(format!(
            "no valid checkpoint to find snapshot {number} in: {}",
            report.checkpoint_errors.join("; ")
        )));
    };
    let Some(snap) = h.snapshots.iter().find(|s| s.number == number).cloned() else {
        let kept: Vec<String> = h.snapshots.iter().map(|s| s.number.to_string()).collect();
        return Err(LdError::InvalidArgument(format!(
            "snapshot {number} does not exist (kept: {})",
            if kept.is_empty() {
                "none".into()
            } else {
                kept.join(", ")
            }
        )));
    };
    let root = snap.map_root.map(|(ptr, height, entries)| MapRoot {
        ptr,
        height,
        entries,
    });
    let map = Map::open(g.fs_id, opts.map_budget_bytes, root, &Pages { dev })?;
    report.checkpoint_slot = Some(slot);
    let geo = slot_geometry(g, &usage);
    Ok(Recovered {
        geo,
        map,
        usage,
        log: LogHead {
            seg: SegmentId(h.log_segment),
            page: h.log_page,
            next: SegmentId(h.next_segment),
            seq: h.next_seq,
            epoch: h.epoch,
            entered: 0,
        },
        serial: h.serial,
        next_list: snap.next_list,
        user_bytes: h.user_bytes,
        moved_bytes: h.moved_bytes,
        snapshots: h.snapshots,
        report,
    })
}
