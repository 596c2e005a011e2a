//! fsck as a library: checks a whole image — engine (`lld::verify`) and
//! file tree (`fs::check`) — and, when asked, repairs it. The `ldfs fsck`
//! command only parses arguments, prints and maps the outcome to fsck(8)'s
//! exit codes.
//!
//! A check opens the engine read-only and writes nothing; the log check
//! and the tree check run side by side. A repair works only through the
//! normal write paths: a superblock copy is rewritten from the other; a
//! damaged map (or one disagreeing with the summaries) is rebuilt from
//! every summary by opening with `LldOptions::rebuild`; the log head moves
//! to a fresh segment; list entries lost or damaged are rewritten; live
//! blocks that fail their checksum are deleted (their contents are lost;
//! a file keeps a hole, the tree repair deals with lost metadata); live
//! blocks whose summary is damaged are rewritten through the log, and
//! segments with a damaged summary emptied; the usage table is recomputed
//! from the map; the file system's own lists, record and root are
//! recreated if a mount fails; the tree is repaired by `Fs::repair`, one
//! ARU per fix; opening for writing and closing write both checkpoint
//! slots. Every damage found is acted on, not only the reported ones.
//! A crash in the middle leaves an image that opens and that a second run
//! finishes. After a repair the whole image is checked again from scratch:
//! what that check finds is what is left.

use std::sync::Arc;

use crate::device::Device;
use crate::dual::{self, Dual};
use crate::fs::check::Finding;
use crate::fs::{Fs, FsOptions};
use crate::ld::{LdError, ListHints, ListId, ListKind, LogicalDisk};
use crate::lld::verify::{self, EngineDamage, EngineProblem, LogCheckOptions};
use crate::lld::{Lld, LldOptions};

/// Progress reports: (phase, done, total); a total of 0 means unknown.
pub type ProgressFn = Arc<dyn Fn(&str, u64, u64) + Send + Sync>;

/// How to run.
#[derive(Clone)]
pub struct FsckOptions {
    /// The same image opened for streaming reads (O_DIRECT), for the
    /// whole-log pass of the data check; without it that pass reads through
    /// the engine's device.
    pub bulk: Option<Arc<dyn Device>>,
    /// Repair what can be repaired (`-y`, `-p`); otherwise only report.
    pub repair: bool,
    /// Memory budget of the block-number map while checking.
    pub map_budget_bytes: usize,
    /// Check every live block's bytes against its crc (reads the whole
    /// log); without it only metadata is checked (summaries, map, usage,
    /// list 0, the tree), and a repair cannot find blocks that fail their
    /// crc.
    pub data_checksums: bool,
    /// Called now and then while checking.
    pub progress: Option<ProgressFn>,
}

impl std::fmt::Debug for FsckOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FsckOptions")
            .field("repair", &self.repair)
            .field("bulk", &self.bulk.is_some())
            .field("map_budget_bytes", &self.map_budget_bytes)
            .field("data_checksums", &self.data_checksums)
            .field("progress", &self.progress.is_some())
            .finish()
    }
}

impl Default for FsckOptions {
    fn default() -> Self {
        FsckOptions {
            bulk: None,
            repair: false,
            // The check looks up every summary record in the map: a map
            // that does not fit rereads its leaves at random.
            map_budget_bytes: 1 << 30,
            data_checksums: true,
            progress: None,
        }
    }
}

/// An operational error: the check itself could not run (fsck(8) exit 8).
#[derive(Debug, thiserror::Error)]
pub enum FsckError {
    #[error("not an ldfs image: {0}")]
    NotLdfs(String),
    #[error("{0}")]
    Device(String),
}

/// What one full check found.
#[derive(Debug, Default)]
pub struct Findings {
    pub engine: Vec<EngineProblem>,
    /// The engine could not be opened at all (why).
    pub engine_unopenable: Option<String>,
    pub fs: Vec<Finding>,
    /// The file system could not be mounted, or was not checked (why).
    pub fs_unchecked: Option<String>,
    /// A dual file system's data blocks against its bitmaps and pointers
    /// (`Dual::check_blocks_with`).
    pub data_blocks: Vec<String>,
    /// Figures for the summary line.
    pub map_entries: u64,
    pub partials: u64,
    pub blocks_checked: u64,
    pub inodes: u64,
    pub directories: u64,
    pub files: u64,
}

impl Findings {
    /// One line per problem.
    pub fn lines(&self) -> Vec<String> {
        let mut v: Vec<String> = self.engine.iter().map(|p| p.text.clone()).collect();
        v.extend(self.engine_unopenable.iter().cloned());
        v.extend(self.fs_unchecked.iter().cloned());
        v.extend(self.fs.iter().map(|f| f.to_string()));
        v.extend(self.data_blocks.iter().cloned());
        v
    }

    pub fn is_clean(&self) -> bool {
        self.lines().is_empty()
    }

    fn has(&self, f: impl Fn(&EngineDamage) -> bool) -> bool {
        self.engine.iter().any(|p| f(&p.damage))
    }
}

/// The result of a run.
#[derive(Debug, Default)]
pub struct Outcome {
    /// What the first check found.
    pub found: Findings,
    /// The repairs made, one line each.
    pub fixed: Vec<String>,
    /// What a repair could not fix (the check after it); without repair,
    /// what was found.
    pub remaining: Vec<String>,
    pub repaired: bool,
    /// Why a repair stopped short, if it did.
    pub notes: Vec<String>,
}

impl Outcome {
    /// fsck(8) exit code: 0 clean, 1 errors corrected, 4 errors left.
    pub fn exit_code(&self) -> u8 {
        if self.found.is_clean() {
            0
        } else if self.repaired && self.remaining.is_empty() {
            1
        } else {
            4
        }
    }
}

fn op_err(e: impl std::fmt::Display) -> FsckError {
    FsckError::Device(e.to_string())
}

/// Checks the whole image on `dev`, reading only.
pub fn check(dev: Arc<dyn Device>, opts: &FsckOptions) -> Result<Findings, FsckError> {
    let (geo, mut out) = superblocks(&*dev)?;
    let lld = match Lld::open(dev.clone(), read_only(opts)) {
        Ok(l) => Arc::new(l),
        Err(LdError::Corrupt(c)) => {
            out.engine_unopenable = Some(format!("the log cannot be opened: {c}"));
            return Ok(out);
        }
        Err(e) => return Err(op_err(e)),
    };
    out.engine
        .extend(verify::check_checkpoints(&*dev, &geo, lld.open_report()).map_err(op_err)?);
    let report = progress(opts);
    // The tree check reads metadata blocks at random while the log check
    // streams the log (or its summaries): run side by side, the total is
    // about the longer of the two. The log check takes the engine's lock
    // per segment only.
    let check_tree = || check_tree(lld.clone(), &report);
    let log_opts = LogCheckOptions {
        data: opts.data_checksums,
        progress: Some(&report),
        bulk: opts.bulk.as_deref(),
    };
    let (log, tree) = std::thread::scope(|s| {
        let t = s.spawn(check_tree);
        let log = lld.check_log_with(&log_opts);
        let t = t.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
        (log, t)
    });
    if out.take_log(log.map_err(op_err)?) {
        out.take_tree(tree?);
    }
    Ok(out)
}

/// Both superblocks checked; the geometry, and findings holding what the
/// check found. Not an ldfs image at all is an error.
fn superblocks(dev: &dyn Device) -> Result<(crate::lld::layout::Geometry, Findings), FsckError> {
    let (geo, sb) = verify::check_superblocks(dev).map_err(op_err)?;
    let Some(geo) = geo else {
        let why: Vec<String> = sb.iter().map(|p| p.text.clone()).collect();
        return Err(FsckError::NotLdfs(why.join("; ")));
    };
    let out = Findings {
        engine: sb,
        ..Findings::default()
    };
    Ok((geo, out))
}

fn read_only(opts: &FsckOptions) -> LldOptions {
    LldOptions {
        read_only: true,
        map_budget_bytes: opts.map_budget_bytes,
        ..Default::default()
    }
}

fn progress(opts: &FsckOptions) -> impl Fn(&str, u64, u64) + Sync + '_ {
    move |phase: &str, done: u64, total: u64| {
        if let Some(p) = &opts.progress {
            p(phase, done, total)
        }
    }
}

/// The file tree checked read-only through `ld`; Err(why) when it cannot
/// be mounted.
fn check_tree(
    ld: Arc<dyn LogicalDisk>,
    report: &(dyn Fn(&str, u64, u64) + Sync),
) -> Result<Result<crate::fs::check::Report, String>, FsckError> {
    let fs_opts = FsOptions {
        read_only: true,
        ..Default::default()
    };
    match Fs::mount(ld, fs_opts) {
        Ok(fs) => Ok(Ok(fs.check_with(Some(report)).map_err(op_err)?)),
        Err(e) => Ok(Err(format!("the file system cannot be mounted: {e}"))),
    }
}

impl Findings {
    /// Takes the log check's results; false when the map is damaged, so
    /// the tree is not to be checked (or what was seen through it is noise).
    fn take_log(&mut self, log: verify::LogCheck) -> bool {
        self.map_entries = log.map_entries;
        self.partials = log.partials;
        self.blocks_checked = log.blocks_checked;
        self.engine.extend(log.problems);
        if self.has(|d| *d == EngineDamage::Map) {
            self.fs_unchecked = Some("the file tree was not checked: the map is damaged".into());
            return false;
        }
        true
    }

    fn take_tree(&mut self, tree: Result<crate::fs::check::Report, String>) {
        match tree {
            Ok(r) => {
                self.inodes = r.inodes;
                self.directories = r.directories;
                self.files = r.files;
                self.fs = r.findings;
            }
            Err(why) => self.fs_unchecked = Some(why),
        }
    }
}

/// Checks a dual file system (metadata log on `meta`, file data on
/// `data`), reading only: both copies of the data label, the engine's
/// superblocks, checkpoints and log, the file tree through the dual LD,
/// and the data blocks against the bitmaps (and descriptors, and group
/// ties) and, with `data_checksums`, their checksums.
pub fn check_dual(
    meta: Arc<dyn Device>,
    data: Arc<dyn Device>,
    opts: &FsckOptions,
) -> Result<Findings, FsckError> {
    let (geo, mut out) = superblocks(&*meta)?;
    out.data_blocks = bad_labels(&*data)?
        .into_iter()
        .map(|(copy, why)| format!("data label copy {copy}: {why}"))
        .collect();
    let dual = match Dual::open_for_fsck(meta.clone(), data, read_only(opts)) {
        Ok(d) => Arc::new(d),
        Err(LdError::Corrupt(c)) => {
            out.engine_unopenable = Some(format!("the dual file system cannot be opened: {c}"));
            return Ok(out);
        }
        Err(e) => return Err(op_err(e)),
    };
    out.engine.extend(
        verify::check_checkpoints(&*meta, &geo, dual.meta().open_report()).map_err(op_err)?,
    );
    let report = progress(opts);
    let log = dual
        .meta()
        .check_log_with(&LogCheckOptions {
            data: opts.data_checksums,
            progress: Some(&report),
            bulk: None,
        })
        .map_err(op_err)?;
    if !out.take_log(log) {
        return Ok(out);
    }
    out.take_tree(check_tree(dual.clone(), &report)?);
    out.data_blocks.extend(
        dual.check_blocks_with(opts.data_checksums)
            .map_err(op_err)?,
    );
    Ok(out)
}

/// The copies of the data label that do not decode or differ from the one
/// that does: (copy, why). Not a dual data device at all is an error.
fn bad_labels(data: &dyn Device) -> Result<Vec<(usize, String)>, FsckError> {
    let label = dual::read_label(data).map_err(|e| FsckError::NotLdfs(e.to_string()))?;
    let good = label.encode().map_err(op_err)?;
    let mut bad = Vec::new();
    for (copy, off) in label.geo.label_offsets().into_iter().enumerate() {
        let mut b = vec![0u8; good.len()];
        data.read_at(&mut b, off).map_err(op_err)?;
        match dual::format::DataLabel::decode(&b, off) {
            Err(e) => bad.push((copy, e.to_string())),
            Ok(l) if l != label => bad.push((copy, "differs from the other copy".into())),
            Ok(_) => {}
        }
    }
    Ok(bad)
}

/// Checks a dual pair and, if `opts.repair`, repairs it and checks again.
pub fn run_dual(
    meta: Arc<dyn Device>,
    data: Arc<dyn Device>,
    opts: &FsckOptions,
) -> Result<Outcome, FsckError> {
    let found = check_dual(meta.clone(), data.clone(), opts)?;
    let mut out = Outcome {
        remaining: found.lines(),
        ..Default::default()
    };
    if found.is_clean() || !opts.repair {
        out.found = found;
        return Ok(out);
    }
    out.repaired = true;
    repair_dual(
        meta.clone(),
        data.clone(),
        opts,
        &found,
        &mut out.fixed,
        &mut out.notes,
    )?;
    let after = check_dual(meta, data, opts)?;
    out.remaining = after.lines();
    out.found = found;
    Ok(out)
}

/// A dual pair's repair: a bad label copy rewritten from the good one;
/// the log's repair on the metadata device (a lost list entry rewritten
/// as a data list only if every block it holds is a pointer whose data
/// matches it, `dual::infer_list_hints`); the dual layout's own lists and
/// layout record, and the file system's own lists, recreated if missing;
/// then, through the dual LD, the data blocks (`Dual::repair_blocks`:
/// bad pointers deleted, doubly named blocks copied, bitmaps and
/// descriptors rewritten from the pointers, bad ties deleted) and the tree.
fn repair_dual(
    meta: Arc<dyn Device>,
    data: Arc<dyn Device>,
    opts: &FsckOptions,
    found: &Findings,
    fixed: &mut Vec<String>,
    notes: &mut Vec<String>,
) -> Result<(), FsckError> {
    let label = dual::read_label(&*data).map_err(|e| FsckError::NotLdfs(e.to_string()))?;
    let bad = bad_labels(&*data)?;
    if !bad.is_empty() {
        let good = label.encode().map_err(op_err)?;
        let offsets = label.geo.label_offsets();
        for (copy, _) in bad {
            data.write_at(&good, offsets[copy]).map_err(op_err)?;
            fixed.push(format!("data label copy {copy} rewritten from the other"));
        }
        data.flush().map_err(op_err)?;
    }
    let geo = label.geo;
    let hints_for = |lld: &Lld, l: u64| dual::infer_list_hints(lld, &*data, &geo, l);
    let Some(lld) = repair_engine(meta.clone(), opts, found, fixed, notes, &hints_for)? else {
        return Ok(());
    };
    let metadata = ListHints {
        kind: ListKind::Metadata,
        ..Default::default()
    };
    // The layout's lists (1..=3) and the file system's (user 1..=3, engine
    // 4..=6): all metadata lists.
    let own: Vec<(u64, ListHints)> = (1..=6)
        .filter(|&l| matches!(lld.list_hints(ListId(l)), Ok(None)))
        .map(|l| (l, metadata))
        .collect();
    if !own.is_empty() {
        lld.repair_lists_with(&own).map_err(op_err)?;
        let ids: Vec<u64> = own.iter().map(|o| o.0).collect();
        fixed.push(format!("engine lists {ids:?} recreated"));
    }
    let info_ok = matches!(
        lld.read(dual::INFO_LIST, 0),
        Ok(Some(b)) if dual::format::decode_info(&b).ok() == Some(geo)
    );
    if !info_ok {
        lld.write(None, dual::INFO_LIST, 0, &dual::format::encode_info(&geo))
            .map_err(op_err)?;
        fixed.push("dual layout record rewritten from the data label".into());
    }
    lld.close().map_err(op_err)?;
    drop(lld);
    let d = match Dual::open_for_fsck(
        meta,
        data,
        LldOptions {
            map_budget_bytes: opts.map_budget_bytes,
            ..Default::default()
        },
    ) {
        Ok(d) => Arc::new(d),
        Err(e) => {
            notes.push(format!("cannot open the dual pair for repair: {e}"));
            return Ok(());
        }
    };
    fixed.extend(d.repair_blocks(opts.data_checksums).map_err(op_err)?);
    repair_tree(d.clone(), fixed, notes)?;
    d.close().map_err(op_err)?;
    Ok(())
}

/// Checks `dev` and, if `opts.repair`, repairs it and checks again.
pub fn run(dev: Arc<dyn Device>, opts: &FsckOptions) -> Result<Outcome, FsckError> {
    let found = check(dev.clone(), opts)?;
    let mut out = Outcome {
        remaining: found.lines(),
        ..Default::default()
    };
    if found.is_clean() || !opts.repair {
        out.found = found;
        return Ok(out);
    }
    out.repaired = true;
    repair(dev.clone(), opts, &found, &mut out.fixed, &mut out.notes)?;
    let after = check(dev, opts)?;
    out.remaining = after.lines();
    out.found = found;
    Ok(out)
}

fn repair(
    dev: Arc<dyn Device>,
    opts: &FsckOptions,
    found: &Findings,
    fixed: &mut Vec<String>,
    notes: &mut Vec<String>,
) -> Result<(), FsckError> {
    let default_hints = |_: &Lld, _: u64| Ok::<_, LdError>(ListHints::default());
    let Some(lld) = repair_engine(dev, opts, found, fixed, notes, &default_hints)? else {
        return Ok(());
    };
    let ld: Arc<dyn LogicalDisk> = lld.clone();
    // The file system's own lists, record and root come first.
    let own: Vec<u64> = (1..=3)
        .filter(|&l| matches!(lld.list_hints(ListId(l)), Ok(None)))
        .collect();
    if !own.is_empty() {
        lld.repair_lists(&own).map_err(op_err)?;
        fixed.push(format!("file-system lists {own:?} recreated"));
    }
    repair_tree(ld, fixed, notes)?;
    lld.close().map_err(op_err)?;
    Ok(())
}

/// The hints to write for a list whose entry in list 0 is rewritten.
type HintsFor<'a> = &'a dyn Fn(&Lld, u64) -> Result<ListHints, LdError>;

/// The log's repair, up to the usage table: superblock copies, the map
/// (rebuilt if damaged), list entries (with `hints_for`), blocks failing
/// their checksum, blocks whose summary is damaged. The engine, open for
/// writing, or None if it cannot be opened (noted).
fn repair_engine(
    dev: Arc<dyn Device>,
    opts: &FsckOptions,
    found: &Findings,
    fixed: &mut Vec<String>,
    notes: &mut Vec<String>,
    hints_for: HintsFor<'_>,
) -> Result<Option<Arc<Lld>>, FsckError> {
    let (geo, _) = verify::check_superblocks(&*dev).map_err(op_err)?;
    let geo = geo.ok_or_else(|| FsckError::NotLdfs("no valid superblock".into()))?;
    for p in &found.engine {
        if let EngineDamage::Superblock(copy) = p.damage {
            verify::rewrite_superblock(&*dev, &geo, copy).map_err(op_err)?;
            fixed.push(format!("superblock copy {copy} rewritten"));
        }
    }
    let rebuild = found.engine_unopenable.is_some()
        || found.has(|d| matches!(d, EngineDamage::Map | EngineDamage::Mismatch(_)));
    let lld = match Lld::open(
        dev.clone(),
        LldOptions {
            map_budget_bytes: opts.map_budget_bytes,
            rebuild,
            ..Default::default()
        },
    ) {
        Ok(l) => Arc::new(l),
        Err(LdError::Corrupt(c)) => {
            // Nothing more can be done through the engine; the final check
            // reports what is left.
            notes.push(format!("cannot open the log for repair: {c}"));
            return Ok(None);
        }
        Err(e) => return Err(op_err(e)),
    };
    if rebuild {
        fixed.push(format!(
            "map and usage table rebuilt from {} partial segments",
            lld.open_report().rolled_forward
        ));
        let dropped = lld.open_report().snapshots_dropped;
        if dropped > 0 {
            fixed.push(format!(
                "{dropped} snapshots dropped: a rebuild has no snapshot table"
            ));
        }
    }
    if found.has(|d| matches!(d, EngineDamage::CheckpointSlot(_))) {
        fixed.push("both checkpoint slots rewritten".into());
    }
    // What the log looks like now (after a rebuild, keys may differ).
    let mut log = lld
        .check_log_with(&LogCheckOptions {
            data: opts.data_checksums,
            progress: None,
            bulk: None,
        })
        .map_err(op_err)?;
    let mut bad_snapshots: Vec<u64> = log
        .damaged
        .iter()
        .filter_map(|d| match d {
            EngineDamage::Snapshot(n) => Some(*n),
            _ => None,
        })
        .collect();
    bad_snapshots.dedup();
    // Everything the repair writes goes to a fresh segment: the one the log
    // was writing into may hold a damaged summary (seen as the end of its
    // log until something valid follows it), and blocks rewritten because
    // their summary is lost must land where a scan finds them.
    lld.start_new_segment().map_err(op_err)?;
    // Lists that lost their entry in list 0 (or whose entry fails its
    // checksum) get it back first: the deletes below need the list.
    let lists: Vec<u64> = log
        .damaged
        .iter()
        .filter_map(|d| match d {
            EngineDamage::ListEntry(l) => Some(*l),
            EngineDamage::BadBlock(k) if k.list == 0 => Some(k.index),
            _ => None,
        })
        .collect();
    if !lists.is_empty() || log.damaged.contains(&EngineDamage::NextList) {
        let with = lists
            .iter()
            .map(|&l| Ok((l, hints_for(lld.as_ref(), l)?)))
            .collect::<Result<Vec<_>, LdError>>()
            .map_err(op_err)?;
        lld.repair_lists_with(&with).map_err(op_err)?;
        for l in &lists {
            fixed.push(format!("list {l}: its entry in list 0 rewritten"));
        }
        if log.damaged.contains(&EngineDamage::NextList) {
            fixed.push("next list id raised above every list".into());
        }
        lld.flush().map_err(op_err)?;
    }
    // Blocks that fail their checksum are lost: deleted (a file keeps a
    // hole there; the tree repair deals with lost metadata).
    let mut dropped = 0u64;
    for d in &log.damaged {
        if let EngineDamage::BadBlock(key) = *d {
            if key.list == 0 {
                continue; // rewritten above
            }
            lld.delete(None, ListId(key.list), key.index)
                .map_err(op_err)?;
            dropped += 1;
            if dropped <= 64 {
                fixed.push(format!("{key:?} deleted: its bytes failed their checksum"));
            }
        }
    }
    if dropped > 64 {
        fixed.push(format!(
            "... and {} more blocks deleted: their bytes failed their checksum",
            dropped - 64
        ));
    }
    let mut damaged_segments: Vec<u32> = log
        .damaged
        .iter()
        .filter_map(|d| match d {
            EngineDamage::Summary(s) => Some(*s),
            _ => None,
        })
        .collect();
    damaged_segments.dedup();
    let mut moved = 0u64;
    for d in std::mem::take(&mut log.damaged) {
        if let EngineDamage::Unrecorded(key) = d {
            if let Some(e) = lld.map_entry(key).map_err(op_err)? {
                if lld.relocate(key, &e).map_err(op_err)? {
                    moved += 1;
                }
            }
        }
    }
    for seg in damaged_segments {
        let (m, del) = lld
            .evacuate_segment(crate::lld::types::SegmentId(seg))
            .map_err(op_err)?;
        moved += m;
        dropped += del;
        fixed.push(format!(
            "segment {seg} (a damaged summary): {m} live blocks moved out{}",
            if del > 0 {
                format!(", {del} that failed their checksum deleted")
            } else {
                String::new()
            }
        ));
    }
    if moved > 0 {
        fixed.push(format!(
            "{moved} live blocks whose summary was damaged rewritten through the log"
        ));
    }
    if moved + dropped > 0 {
        lld.flush().map_err(op_err)?;
    }
    // A damaged snapshot is dropped (its pins go with it); the live tree
    // is never changed for it.
    // In one checkpoint: a damaged page shared by a generation damages
    // every tree reaching it.
    bad_snapshots.sort_unstable();
    bad_snapshots.dedup();
    lld.delete_kept(&bad_snapshots).map_err(op_err)?;
    for n in bad_snapshots {
        fixed.push(format!("snapshot {n} (damaged) deleted"));
    }
    // Recomputed whatever was found: the repairs above move live bytes.
    let n = lld.repair_usage().map_err(op_err)?;
    if n > 0 {
        fixed.push(format!("segment usage table: {n} segments corrected"));
    }
    Ok(Some(lld))
}

/// The tree's repair through `ld`: the file-system record and root
/// recreated if a mount fails, then `Fs::repair`.
fn repair_tree(
    ld: Arc<dyn LogicalDisk>,
    fixed: &mut Vec<String>,
    notes: &mut Vec<String>,
) -> Result<(), FsckError> {
    let mut mounted = Fs::mount(ld.clone(), FsOptions::default());
    if mounted.is_err() {
        match Fs::repair_base(&*ld) {
            Ok(f) => fixed.extend(f),
            Err(e) => notes.push(format!(
                "cannot rewrite the file-system record or root: {e}"
            )),
        }
        mounted = Fs::mount(ld, FsOptions::default());
    }
    match mounted {
        Ok(fs) => {
            let r = fs.repair().map_err(op_err)?;
            fixed.extend(r.fixed);
            drop(fs);
        }
        Err(e) => notes.push(format!("cannot mount the file system for repair: {e}")),
    }
    Ok(())
}
