//! fsck for the engine: checks what the log-structured LD keeps on the
//! device against itself, and the repairs that only the engine can make.
//!
//! - both superblock copies decode and agree;
//! - both checkpoint slots decode and the one in use opened (map root and
//!   roll-forward); a slot still zero from mkfs is not damage;
//! - the map can be read whole (every map page passes the crc its parent
//!   holds), and every map entry names a block that a valid partial-segment
//!   summary records at that address for that key, with the same length,
//!   flags and crc, and whose bytes match that crc;
//! - the usage table equals the live bytes recomputed from the map
//!   (`Engine::check_usage`).
//!
//! Checking reads only: on an engine opened read-only it writes nothing.
//! Every finding is an [`EngineProblem`]: a typed [`EngineDamage`] that
//! repairs act on, and a message with the evidence (segment, byte offset,
//! expected and found). Memory is bounded by the map's budget plus one
//! segment buffer and 8 bytes per live block.

use std::collections::HashMap;

use super::engine::{DevPages, Engine, OpenReport};
use super::layout::Geometry;
use super::mkfs;
use super::recovery;
use super::summary::Record;
use super::types::{entry_flags, Key, MapEntry, SegmentId, PAGE_BYTES};
use super::usage::{SegmentState, SegmentUsage};
use crate::device::{Device, DeviceError};
use crate::ld::{Corruption, LdError, LdResult};

/// What kind of damage a problem is: what a repair has to do about it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EngineDamage {
    /// A superblock copy does not decode or disagrees with the other.
    Superblock(usize),
    /// A checkpoint slot does not decode, or the engine could not open it.
    CheckpointSlot(usize),
    /// The map cannot be read whole (a map page fails its checksum).
    Map,
    /// A map entry names a block no valid summary records there (a damaged
    /// summary, or a wrong map); the bytes themselves still match the map.
    Unrecorded(Key),
    /// A map entry disagrees with the summary record at its address.
    Mismatch(Key),
    /// A live block's bytes fail their checksum: its contents are lost.
    BadBlock(Key),
    /// The segment usage table disagrees with the map.
    Usage,
    /// A list holds blocks but has no entry in list 0 (the engine's list of
    /// lists): it cannot be read or written until the entry is rewritten.
    ListEntry(u64),
    /// The next list id the engine would hand out is already in use.
    NextList,
    /// A partial segment's summary in this segment is damaged while valid
    /// ones follow it: the blocks it records cannot be accounted for, and
    /// a rebuild or the cleaner would lose them. Repaired by moving every
    /// live block out of the segment.
    Summary(u32),
}

/// One finding: its kind and the evidence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineProblem {
    pub damage: EngineDamage,
    pub text: String,
}

impl std::fmt::Display for EngineProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

/// What [`Engine::check_log`] looked at and found.
#[derive(Clone, Debug, Default)]
pub struct LogCheck {
    pub problems: Vec<EngineProblem>,
    /// Entries in the map.
    pub map_entries: u64,
    /// Valid partial segments read in non-Clean segments.
    pub partials: u64,
    /// Live blocks whose bytes were checked against their crc.
    pub blocks_checked: u64,
    /// Every damage found, uncapped (`problems` holds at most
    /// `MAX_REPORTED` of a kind): what a repair acts on.
    pub damaged: Vec<EngineDamage>,
}

/// Problems are capped per kind so a wrecked image gives a readable report.
const MAX_REPORTED: usize = 64;

/// Reads both superblock copies. Returns the geometry (from the first good
/// copy) if any copy is good, and a problem for each bad or disagreeing one.
pub fn check_superblocks(dev: &dyn Device) -> LdResult<(Option<Geometry>, Vec<EngineProblem>)> {
    let size = dev.size_bytes();
    let last = (size / PAGE_BYTES as u64).saturating_sub(1) * PAGE_BYTES as u64;
    let mut problems = Vec::new();
    let mut copies = [None, None];
    for (i, addr) in [0, last].into_iter().enumerate() {
        let mut b = vec![0u8; PAGE_BYTES];
        dev.read_at(&mut b, addr)?;
        match Geometry::decode_superblock(&b, addr, size) {
            Ok(g) => copies[i] = Some(g),
            Err(c) => problems.push(EngineProblem {
                damage: EngineDamage::Superblock(i),
                text: format!("superblock copy {i}: {c}"),
            }),
        }
    }
    if let [Some(a), Some(b)] = &copies {
        if a != b {
            problems.push(EngineProblem {
                damage: EngineDamage::Superblock(1),
                text: format!("superblock copy 1 disagrees with copy 0: {b:?} vs {a:?}"),
            });
        }
    }
    Ok((copies[0].or(copies[1]), problems))
}

/// Rewrites superblock copy `copy` from the geometry (the other copy's),
/// then flushes.
pub fn rewrite_superblock(dev: &dyn Device, g: &Geometry, copy: usize) -> LdResult<()> {
    assert!(copy < 2, "superblock copy {copy}");
    dev.write_at(
        &g.encode_superblock(copy as u32),
        g.superblock_addrs()[copy],
    )?;
    dev.flush()?;
    Ok(())
}

/// Problems with the checkpoint slots, from what open found (`report`) and
/// the slots themselves: a slot the engine could not use is damage, except a
/// slot still all zero while the other holds one of the first two checkpoints.
pub fn check_checkpoints(
    dev: &dyn Device,
    g: &Geometry,
    report: &OpenReport,
) -> LdResult<Vec<EngineProblem>> {
    let slots = mkfs::read_checkpoints(dev, g)?;
    let fresh = slots
        .iter()
        .any(|s| matches!(s, Ok((h, _)) if h.serial == 1));
    let mut problems = Vec::new();
    let mut failed = report.failed_slots.clone();
    failed.sort_unstable();
    failed.dedup();
    for slot in failed {
        if slot >= 2 {
            continue;
        }
        let why = match &slots[slot] {
            Err(c) => {
                if fresh && slot_is_zero(dev, g, slot)? {
                    continue;
                }
                c.to_string()
            }
            Ok(_) => report
                .checkpoint_errors
                .iter()
                .find(|e| e.starts_with(&format!("slot {slot}:")))
                .cloned()
                .unwrap_or_else(|| format!("slot {slot}: could not be opened")),
        };
        problems.push(EngineProblem {
            damage: EngineDamage::CheckpointSlot(slot),
            text: format!("checkpoint slot {slot}: {why}"),
        });
    }
    Ok(problems)
}

fn slot_is_zero(dev: &dyn Device, g: &Geometry, slot: usize) -> LdResult<bool> {
    let mut b = vec![0u8; g.checkpoint_pages as usize * PAGE_BYTES];
    dev.read_at(&mut b, g.slot_addr(slot))?;
    Ok(b.iter().all(|&x| x == 0))
}

/// A segment read whole into memory, served as a device (reads outside it
/// go to the device): the summary scan parses from memory.
struct SegmentView<'a> {
    dev: &'a dyn Device,
    base: u64,
    buf: Vec<u8>,
}

impl Device for SegmentView<'_> {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), DeviceError> {
        let end = offset.checked_add(buf.len() as u64);
        if offset >= self.base && end.is_some_and(|e| e <= self.base + self.buf.len() as u64) {
            let at = (offset - self.base) as usize;
            buf.copy_from_slice(&self.buf[at..at + buf.len()]);
            Ok(())
        } else {
            self.dev.read_at(buf, offset)
        }
    }
    fn write_at(&self, _: &[u8], offset: u64) -> Result<(), DeviceError> {
        unreachable!("fsck's segment view is never written (offset {offset})")
    }
    fn flush(&self) -> Result<(), DeviceError> {
        Ok(())
    }
    fn size_bytes(&self) -> u64 {
        self.dev.size_bytes()
    }
}

/// Where the scan of a segment's summaries found damage, as evidence for
/// blocks it could not account for.
struct Stop {
    page: u32,
    why: Corruption,
}

impl Engine {
    /// Checks the map against the log: see the module documentation. Device
    /// errors are errors; everything wrong with the bytes is a problem.
    pub fn check_log(&self) -> LdResult<LogCheck> {
        self.drain_flight()?;
        let geo = *self.geometry();
        let dev = self.device();
        let mut out = LogCheck::default();
        let mut g = self.lock();
        let r = DevPages { dev };
        // 1. The whole map: every leaf is read and checked against its crc;
        //    every list holding blocks has its entry in list 0 (keys come
        //    in order, list 0's first).
        let mut n = 0u64;
        let mut entries: Vec<u64> = Vec::new();
        let mut homeless: Vec<u64> = Vec::new();
        let mut top_list = 0u64;
        if let Err(e) = g.map.range(Key::MIN, Key::MAX, &r, &mut |k, _| {
            n += 1;
            if k.list == 0 {
                entries.push(k.index);
                top_list = top_list.max(k.index);
            } else if homeless.last() != Some(&k.list) && entries.binary_search(&k.list).is_err() {
                homeless.push(k.list);
                top_list = top_list.max(k.list);
            }
            true
        }) {
            match e {
                LdError::Corrupt(c) => {
                    out.damaged.push(EngineDamage::Map);
                    out.problems.push(EngineProblem {
                        damage: EngineDamage::Map,
                        text: format!("the map cannot be read: {c}"),
                    });
                    return Ok(out);
                }
                e => return Err(e),
            }
        }
        out.map_entries = n;
        drop(entries);
        for list in homeless {
            out.damaged.push(EngineDamage::ListEntry(list));
            if out.problems.len() < MAX_REPORTED {
                out.problems.push(EngineProblem {
                    damage: EngineDamage::ListEntry(list),
                    text: format!("list {list} holds blocks but list 0 has no entry for it"),
                });
            }
        }
        if top_list >= g.next_list {
            out.damaged.push(EngineDamage::NextList);
            out.problems.push(EngineProblem {
                damage: EngineDamage::NextList,
                text: format!(
                    "the next list id is {}, but list {top_list} exists",
                    g.next_list
                ),
            });
        }
        // 2. Every write record in every non-Clean segment that the map
        //    still names is compared with its entry, and its bytes checked.
        let usage: Vec<(SegmentId, SegmentUsage)> = g.usage.iter().collect();
        let mut matched: Vec<u64> = Vec::new();
        let mut stops: HashMap<u32, Stop> = HashMap::new();
        let mut counts: HashMap<&'static str, usize> = HashMap::new();
        let mut push = |out: &mut LogCheck, kind: &'static str, p: EngineProblem| {
            out.damaged.push(p.damage);
            let c = counts.entry(kind).or_insert(0);
            *c += 1;
            if *c <= MAX_REPORTED {
                out.problems.push(p);
            }
        };
        let mut view = SegmentView {
            dev,
            base: 0,
            buf: vec![0u8; geo.segment_bytes() as usize],
        };
        for (seg, u) in usage {
            if u.state == SegmentState::Clean {
                continue;
            }
            let base = geo.page_addr(seg, 0);
            // One large read per segment; the summaries and blocks are then
            // parsed from memory.
            view.base = base;
            dev.read_at(&mut view.buf, base)?;
            let (parts, bad) =
                recovery::scan_segment_resync(&view, &geo, seg, recovery::Verify::Summary)?;
            for (page, why) in bad {
                out.damaged.push(EngineDamage::Summary(seg.0));
                out.problems.push(EngineProblem {
                    damage: EngineDamage::Summary(seg.0),
                    text: format!(
                        "segment {}: the summary at page {page} is damaged, valid partial segments follow it: {why}",
                        seg.0
                    ),
                });
                stops.entry(seg.0).or_insert(Stop { page, why });
            }
            let buf = &view.buf;
            for p in parts {
                out.partials += 1;
                for rec in &p.records {
                    let Record::Write {
                        key,
                        data_off,
                        len,
                        crc,
                        flags,
                        ..
                    } = *rec
                    else {
                        continue;
                    };
                    let addr = p.data_base + data_off as u64;
                    let Some(e) = g.map.get(key, &r)? else {
                        continue;
                    };
                    if e.is_buffered() || e.offset() != addr {
                        continue;
                    }
                    matched.push(addr);
                    if e.len != len || e.crc != crc || e.flags & entry_flags::ON_DISK_MASK != flags
                    {
                        push(
                            &mut out,
                            "mismatch",
                            EngineProblem {
                                damage: EngineDamage::Mismatch(key),
                                text: format!(
                                    "{key:?}: map says len {} crc {:#010x} flags {:#x}, the summary in segment {} says len {len} crc {crc:#010x} flags {flags:#x}",
                                    e.len, e.crc, e.flags, seg.0
                                ),
                            },
                        );
                        continue;
                    }
                    // read_partial bounded data_off + len by the partial,
                    // which lies inside the segment.
                    let at = (addr - base) as usize;
                    let got = crc32c::crc32c(&buf[at..at + len as usize]);
                    out.blocks_checked += 1;
                    if got != crc {
                        push(
                            &mut out,
                            "block",
                            EngineProblem {
                                damage: EngineDamage::BadBlock(key),
                                text: format!(
                                    "{key:?}: block at byte {addr} (segment {} page {}) fails its checksum: expected {crc:#010x}, got {got:#010x}",
                                    seg.0,
                                    (addr - base) / PAGE_BYTES as u64
                                ),
                            },
                        );
                    }
                }
            }
        }
        // 3. Map entries no summary accounted for.
        if matched.len() as u64 != out.map_entries {
            matched.sort_unstable();
            let mut lost: Vec<(Key, MapEntry)> = Vec::new();
            g.map.range(Key::MIN, Key::MAX, &r, &mut |k, e| {
                if !e.is_buffered() && matched.binary_search(&e.offset()).is_err() {
                    lost.push((k, *e));
                }
                true
            })?;
            for (k, e) in lost {
                let seg = geo.segment_of(e.offset());
                let evidence = match seg.and_then(|s| stops.get(&s.0).map(|st| (s, st))) {
                    Some((s, st)) => format!(
                        "; the summaries of segment {} end at page {}: {}",
                        s.0, st.page, st.why
                    ),
                    None => match seg {
                        Some(s) => format!(" in segment {} ({:?})", s.0, g.usage.get(s).state),
                        None => " outside every segment".into(),
                    },
                };
                // Whether the bytes are still good decides the repair.
                let mut data = vec![0u8; e.len as usize];
                let good = seg.is_some()
                    && dev.read_at(&mut data, e.offset()).is_ok()
                    && crc32c::crc32c(&data) == e.crc;
                let (kind, damage) = if good {
                    ("unrecorded", EngineDamage::Unrecorded(k))
                } else {
                    ("block", EngineDamage::BadBlock(k))
                };
                push(
                    &mut out,
                    kind,
                    EngineProblem {
                        damage,
                        text: format!(
                            "{k:?}: the map names byte {} ({} bytes, crc {:#010x}{}) but no valid summary records it there{evidence}",
                            e.offset(),
                            e.len,
                            e.crc,
                            if good { "" } else { ", and the bytes fail it" }
                        ),
                    },
                );
            }
        }
        for (kind, c) in counts {
            if c > MAX_REPORTED {
                out.problems.push(EngineProblem {
                    damage: out
                        .problems
                        .iter()
                        .rev()
                        .find(|p| kind_of(p.damage) == kind)
                        .map(|p| p.damage)
                        .expect("a kind counted has a problem reported"),
                    text: format!("... and {} more like it ({kind})", c - MAX_REPORTED),
                });
            }
        }
        drop(g);
        // 4. The usage table.
        for text in self.check_usage()? {
            out.damaged.push(EngineDamage::Usage);
            out.problems.push(EngineProblem {
                damage: EngineDamage::Usage,
                text,
            });
        }
        Ok(out)
    }

    /// Sets every segment's live bytes to what the map says (a Clean
    /// segment holding live data becomes Dirty), then writes a checkpoint.
    /// Returns how many segments changed. Fails with `InvalidArgument` if an
    /// ARU that has logged operations is open.
    pub fn repair_usage(&self) -> LdResult<u32> {
        self.drain_flight()?;
        let geo = *self.geometry();
        let n = geo.segment_count as usize;
        let mut live = vec![0u64; n];
        {
            let mut g = self.lock();
            let r = DevPages { dev: self.device() };
            g.map.range(Key::MIN, Key::MAX, &r, &mut |_, e| {
                if !e.is_buffered() {
                    if let Some(s) = geo.segment_of(e.offset()) {
                        live[s.0 as usize] += e.len as u64;
                    }
                }
                true
            })?;
            g.map.for_each_page(&mut |p| {
                if let Some(s) = geo.segment_of(p.addr) {
                    live[s.0 as usize] += PAGE_BYTES as u64;
                }
            });
            // The checkpoint below subtracts the pages dirtied since the
            // last one: they count until then.
            for p in g.map.obsolete_pages() {
                if let Some(s) = geo.segment_of(p.addr) {
                    live[s.0 as usize] += PAGE_BYTES as u64;
                }
            }
            let mut changed = 0;
            for (s, u) in g.usage.iter().collect::<Vec<_>>() {
                let want = live[s.0 as usize].min(geo.segment_bytes()) as u32;
                if want == u.live_bytes && !(u.state == SegmentState::Clean && want > 0) {
                    continue;
                }
                let state = if u.state == SegmentState::Clean && want > 0 {
                    SegmentState::Dirty
                } else {
                    u.state
                };
                g.usage.set(
                    s,
                    SegmentUsage {
                        state,
                        live_bytes: want,
                        last_seq: u.last_seq,
                    },
                );
                changed += 1;
            }
            drop(g);
            self.checkpoint_now()?;
            Ok(changed)
        }
    }
}

fn kind_of(d: EngineDamage) -> &'static str {
    match d {
        EngineDamage::Mismatch(_) => "mismatch",
        EngineDamage::BadBlock(_) => "block",
        EngineDamage::Unrecorded(_) => "unrecorded",
        _ => "other",
    }
}
