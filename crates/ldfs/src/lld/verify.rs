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
//!   (`Engine::check_usage`);
//! - every list holding blocks has its entry in list 0, and the next list
//!   id is above every list.
//!
//! A damaged summary does not end the scan of its segment: the pages after
//! it are tried for the next valid summary (`recovery::scan_segment_resync`);
//! damage followed by a valid partial is reported as `Summary`, and repaired
//! by moving everything live out of the segment (`Engine::evacuate_segment`).
//! With data, segments are streamed whole by a reader thread (optionally
//! through a second, O_DIRECT, device); without, eight threads read only
//! the summaries. The engine lock is taken per segment, so the tree check
//! can run alongside; a check must not run beside writers.
//!
//! Checking reads only: on an engine opened read-only it writes nothing.
//! Every finding is an [`EngineProblem`]: a typed [`EngineDamage`] that
//! repairs act on, and a message with the evidence (segment, byte offset,
//! expected and found). Memory is bounded by the map's budget plus a few
//! segment buffers, 8 bytes per live block and 16 per damaged key.

use std::collections::HashMap;

use super::engine::{Engine, OpenReport};
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
    /// A kept snapshot's tree is damaged (a map page or block fails its
    /// checksum, or names a segment its pin does not hold). Repaired by
    /// deleting the snapshot, never by touching the live tree.
    Snapshot(u64),
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
    let last = crate::lld::layout::copy1_addr(size);
    let mut problems = Vec::new();
    let mut copies = [None, None];
    let mut pages = [vec![0u8; PAGE_BYTES], vec![0u8; PAGE_BYTES]];
    for (i, addr) in [0, last].into_iter().enumerate() {
        let b = &mut pages[i];
        dev.read_at(b, addr)?;
        match Geometry::decode_superblock(b, addr, size) {
            Ok(g) => copies[i] = Some(g),
            Err(c) => problems.push(EngineProblem {
                damage: EngineDamage::Superblock(i),
                text: format!("superblock copy {i}: {c}"),
            }),
        }
    }
    if copies == [None, None] {
        // Both damaged, most likely in different bytes: rebuild from the two.
        if let Some(g) = Geometry::salvage_superblock(&pages[0], &pages[1], [0, last], size) {
            for p in problems.iter_mut() {
                p.text += " (the geometry was salvaged from both copies)";
            }
            return Ok((Some(g), problems));
        }
    }
    if let [Some(a), Some(b)] = &copies {
        // A resize writes copy 1, then its checkpoint, then copy 0: between
        // them the copies' segment counts differ and the checkpoint's is the
        // truth (a writable open rewrites both to it).
        let same = if a.resizable() && b.resizable() {
            Geometry {
                segment_count: a.segment_count,
                ..*b
            } == *a
        } else {
            a == b
        };
        if !same {
            problems.push(EngineProblem {
                damage: EngineDamage::Superblock(1),
                text: format!("superblock copy 1 disagrees with copy 0: {b:?} vs {a:?}"),
            });
        }
    }
    Ok((copies[0].or(copies[1]), problems))
}

/// Rewrites superblock copy `copy` from the geometry (the other copy's),
/// then flushes. Copy 1 goes where [`check_superblocks`] reads it, the
/// device's last page (`layout::copy1_addr`): on a device larger than a
/// geometry without the resize flag, the geometry's own last page is read
/// by no one, and a repair there left the damage it reported.
pub fn rewrite_superblock(dev: &dyn Device, g: &Geometry, copy: usize) -> LdResult<()> {
    assert!(copy < 2, "superblock copy {copy}");
    let addr = match copy {
        0 => 0,
        _ => crate::lld::layout::copy1_addr(dev.size_bytes()),
    };
    dev.write_at(&g.encode_superblock(copy as u32), addr)?;
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
    let mut b = vec![0u8; super::checkpoint::slot_pages_for(g) * PAGE_BYTES];
    dev.read_at(&mut b, g.slot_addr(slot))?;
    Ok(b.iter().all(|&x| x == 0))
}

/// A segment read whole into memory, served as a device (reads outside it
/// go to the device): the summary scan parses from memory.
struct SegmentView<'a> {
    dev: &'a dyn Device,
    base: u64,
    buf: SegmentBuf,
}

/// A segment's bytes in a buffer whose window is aligned for O_DIRECT.
#[derive(Default)]
struct SegmentBuf {
    v: Vec<u8>,
    start: usize,
    len: usize,
}

impl SegmentBuf {
    fn new(len: usize) -> SegmentBuf {
        const ALIGN: usize = 4096;
        let v = vec![0u8; len + ALIGN];
        let start = (ALIGN - v.as_ptr() as usize % ALIGN) % ALIGN;
        SegmentBuf { v, start, len }
    }
    fn data(&self) -> &[u8] {
        &self.v[self.start..self.start + self.len]
    }
    fn data_mut(&mut self) -> &mut [u8] {
        &mut self.v[self.start..self.start + self.len]
    }
}

impl Device for SegmentView<'_> {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), DeviceError> {
        let end = offset.checked_add(buf.len() as u64);
        let have = self.buf.data();
        if offset >= self.base && end.is_some_and(|e| e <= self.base + have.len() as u64) {
            let at = (offset - self.base) as usize;
            buf.copy_from_slice(&have[at..at + buf.len()]);
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

/// How [`Engine::check_log_with`] runs.
#[derive(Clone, Copy)]
pub struct LogCheckOptions<'a> {
    /// Check every live block's bytes against its crc (reads every non-clean
    /// segment whole); otherwise only the summaries are read.
    pub data: bool,
    /// Called now and then with (phase, done, total).
    pub progress: Option<crate::ld::Progress<'a>>,
    /// The same device opened for streaming (O_DIRECT: no page-cache copy),
    /// used for the whole-segment reads; the engine's device otherwise.
    pub bulk: Option<&'a dyn Device>,
}

impl Default for LogCheckOptions<'_> {
    fn default() -> Self {
        LogCheckOptions {
            data: true,
            progress: None,
            bulk: None,
        }
    }
}

/// Segments read ahead of the check when it reads them whole: the device
/// streams while the summaries and crcs of the one before are checked.
const READ_AHEAD_SEGMENTS: usize = 4;
/// Threads reading summaries at once when only summaries are read.
const SUMMARY_SCANNERS: usize = 8;

type ScanResult = LdResult<(Vec<recovery::ScannedPartial>, Vec<recovery::DamagedAt>)>;

impl Engine {
    /// Checks the map against the log, data included: see the module
    /// documentation.
    pub fn check_log(&self) -> LdResult<LogCheck> {
        self.check_log_with(&LogCheckOptions::default())
    }

    /// Checks the map against the log: see the module documentation. Device
    /// errors are errors; everything wrong with the bytes is a problem.
    pub fn check_log_with(&self, opts: &LogCheckOptions) -> LdResult<LogCheck> {
        let progress = |phase: &str, done: u64, total: u64| {
            if let Some(p) = opts.progress {
                p(phase, done, total)
            }
        };
        self.drain_flight()?;
        let geo = self.geometry();
        let dev = self.device();
        let mut out = LogCheck::default();
        let mut g = self.lock();
        let r = self.pages();
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
        // The lock is taken per segment from here on, so other readers (the
        // tree check, run alongside) are not held up for the whole pass.
        // A check runs with no writer: the map does not change under it.
        drop(g);
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
        let usage: Vec<(SegmentId, SegmentUsage)> = usage
            .into_iter()
            .filter(|(_, u)| u.state != SegmentState::Clean)
            .collect();
        let total = usage.len() as u64;
        let seg_bytes = geo.segment_bytes() as usize;
        // With data: a reader thread streams the segments, in address
        // order, one large read each, a few ahead; buffers are recycled.
        let (full_tx, full_rx) =
            std::sync::mpsc::sync_channel::<(u64, LdResult<SegmentBuf>)>(READ_AHEAD_SEGMENTS);
        let (empty_tx, empty_rx) = std::sync::mpsc::channel::<SegmentBuf>();
        let bulk = opts.bulk.unwrap_or(dev);
        let bases: Vec<u64> = usage.iter().map(|(s, _)| geo.page_addr(*s, 0)).collect();
        // Shared with the scanners (declared outside the scope they borrow).
        let next = std::sync::atomic::AtomicUsize::new(0);
        let stop = std::sync::atomic::AtomicBool::new(false);
        let result = std::thread::scope(|scope| -> LdResult<()> {
            // Owned here, so an early return drops it and a reader blocked
            // on a full channel stops instead of keeping the scope open.
            let full_rx = full_rx;
            // Without data, several scanners read the summaries of
            // different segments at once (small reads: latency, not
            // bandwidth, bounds them); the results are taken in order.
            let (scan_tx, scan_rx) =
                std::sync::mpsc::sync_channel::<(usize, ScanResult)>(SUMMARY_SCANNERS * 8);
            let scan_rx = scan_rx;
            if opts.data {
                let bases = &bases;
                scope.spawn(move || {
                    for &base in bases {
                        let mut b = empty_rx
                            .try_recv()
                            .unwrap_or_else(|_| SegmentBuf::new(seg_bytes));
                        let r = bulk
                            .read_at(b.data_mut(), base)
                            .map(|_| b)
                            .map_err(LdError::from);
                        let failed = r.is_err();
                        if full_tx.send((base, r)).is_err() || failed {
                            return;
                        }
                    }
                });
                drop(scan_tx);
            } else {
                drop(full_tx);
                for _ in 0..SUMMARY_SCANNERS {
                    let (usage, next, stop, tx) = (&usage, &next, &stop, scan_tx.clone());
                    scope.spawn(move || loop {
                        let n = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        if n >= usage.len() || stop.load(std::sync::atomic::Ordering::Relaxed) {
                            return;
                        }
                        let r = recovery::scan_segment_resync(
                            dev,
                            &geo,
                            usage[n].0,
                            recovery::Verify::Summary,
                        );
                        if tx.send((n, r)).is_err() {
                            return;
                        }
                    });
                }
                drop(scan_tx);
            }
            let mut view = SegmentView {
                dev,
                base: 0,
                buf: SegmentBuf::default(),
            };
            let mut early: std::collections::BTreeMap<usize, ScanResult> = Default::default();
            let result = (|| -> LdResult<()> {
                for (n, (seg, _)) in usage.iter().enumerate() {
                    let seg = *seg;
                    if n % 64 == 0 {
                        progress("segments", n as u64, total);
                    }
                    let base = geo.page_addr(seg, 0);
                    let (parts, bad) = if opts.data {
                        let (got, r) = full_rx.recv().expect("the reader sends every segment");
                        assert_eq!(got, base, "segments read out of order");
                        let old = std::mem::replace(&mut view.buf, r?);
                        if old.len > 0 {
                            let _ = empty_tx.send(old);
                        }
                        view.base = base;
                        recovery::scan_segment_resync(&view, &geo, seg, recovery::Verify::Summary)?
                    } else {
                        loop {
                            if let Some(r) = early.remove(&n) {
                                break r?;
                            }
                            let (i, r) = scan_rx.recv().expect("the scanners send every segment");
                            early.insert(i, r);
                        }
                    };
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
                    let buf = view.buf.data();
                    let mut g = self.lock();
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
                            if e.len != len
                                || e.crc != crc
                                || e.flags & entry_flags::ON_DISK_MASK != flags
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
                            if !opts.data {
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
                progress("segments", total, total);
                Ok(())
            })();
            // Scanners still running stop at their next segment.
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            drop(scan_rx);
            result
        });
        result?;
        let mut g = self.lock();
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
        // 5. The kept snapshots' trees (their blocks are in pinned
        // segments: neither damage nor leaks of the live tree).
        for (n, text) in self.check_snapshots(opts.data)? {
            out.damaged.push(EngineDamage::Snapshot(n));
            out.problems.push(EngineProblem {
                damage: EngineDamage::Snapshot(n),
                text: format!("snapshot {n}: {text}"),
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
        let geo = self.geometry();
        {
            let mut g = self.lock();
            let (live, _) = self.recount_live(&mut g)?;
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
                        pins: u.pins,
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
