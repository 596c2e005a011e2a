//! dual: the DualFS layout (`dualfs-2002.txt` section 3) as a Logical Disk.
//!
//! Every list lives in an lld engine on the *metadata device*. A metadata
//! list's blocks are stored there as they are; a data list's block
//! (`ListKind::Data`, the hint the fs already gives file lists) is stored
//! on the *data device*, updated in place, and the log holds only a
//! [`format::Pointer`] to it: block number, length, crc32c. So ARUs,
//! recovery, checkpoints, the cleaner and checksums are all lld's; this
//! module adds the data device's allocation.
//!
//! The data device is cut into groups of blocks (ext2's block groups, the
//! paper's). Their free-block bitmaps and descriptors (the paper's DGDT in
//! its IFile) are lists of the engine too, so a metadata-only workload
//! never touches the data device. The engine's lists 1..=3 are this
//! module's (layout record, descriptors, bitmaps); user list `n` is engine
//! list `n + 3`.
//!
//! Invariants:
//! - *Data before metadata.* A data block is written to the data device
//!   before the pointer naming it is handed to the engine, and the data
//!   device is flushed before any write reaches the metadata device
//!   (`OrderedMeta`): a pointer is durable only after its data is.
//! - *Bitmaps follow ARUs.* An ARU's allocations and frees are written to
//!   the bitmap blocks of the groups it touched in that same ARU, just
//!   before it ends, as "bits of every ended ARU, plus this one's", under
//!   the state lock (no other ARU ends in between). So recovery, which
//!   applies ended ARUs in log order, leaves each group's bitmap equal to
//!   what the ended ARUs made it: no block referenced and free, none
//!   leaked. An aborted ARU never wrote its bitmaps.
//! - *Frees wait for durability.* A block freed by an ARU stays allocated
//!   in memory until a flush begun after the ARU ended returned (the
//!   freeing metadata is durable), so no new data overwrites a block a
//!   crash could still give back to its old file; flushes running at once
//!   each release only blocks freed before they began, and each block once.
//! - *Directories are tied to groups.* A metadata list (as far as the data
//!   device goes, a directory) is tied, when it is created and in the same
//!   ARU, to the emptiest group (DualFS section 3.1); the tie is block `id`
//!   of the layout list. A data list created `near` it takes its first
//!   block there, and each later block right after the block of the index
//!   before, so a directory's files share a group and a file's blocks stay
//!   together as it grows.
//! - *Overwrites go in place.* A block rewritten by an open ARU keeps its
//!   old content in memory until the ARU ends; an abort writes it back. A
//!   crash between the data write and the commit of the new pointer
//!   leaves a block whose content does not match the checksum the
//!   recovered pointer holds: it reads as corrupt (EIO), never as another
//!   file's data (docs/DESIGN.md, "Dual layout").

pub mod format;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Range;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::device::{Device, DeviceError, DeviceOp};
use crate::ld::{
    AruId, Compression, CorruptReason, Corruption, LdError, LdResult, ListHints, ListId, ListKind,
    LogicalDisk, SpaceStats, Temperature,
};
use crate::lld::layout::MkfsOptions;
use crate::lld::{Lld, LldOptions};

use format::{DataGeometry, DataLabel, Pointer, DATA_BLOCK_BYTES};

/// The engine list holding the layout record.
pub const INFO_LIST: ListId = ListId(1);
/// The engine list of group descriptors, indexed by group.
pub const DESC_LIST: ListId = ListId(2);
/// The engine list of free-block bitmaps, indexed by group.
pub const BITMAP_LIST: ListId = ListId(3);
/// Entries each of the in-memory per-list caches (`kinds`, `ties`,
/// `list_group`) holds before it is emptied: each is rebuilt from the log
/// (or, for `list_group`, a placement hint only) on the next use, and a
/// file system of millions of files would otherwise keep one entry per
/// list for ever. Small in unit tests, so their every path runs with
/// evictions.
const CACHE_LIMIT: usize = if cfg!(test) { 64 } else { 1 << 16 };

/// Inserts into a per-list cache, emptying it first when full.
fn cache_insert<V>(map: &mut HashMap<u64, V>, key: u64, value: V) {
    if map.len() >= CACHE_LIMIT && !map.contains_key(&key) {
        map.clear();
    }
    map.insert(key, value);
}

/// Engine lists this module keeps for itself; user list ids are shifted.
const OWN_LISTS: u64 = 3;
/// Blocks per group unless told otherwise: a 4 KiB bitmap, 128 MiB of data.
pub const DEFAULT_GROUP_BLOCKS: u32 = 32768;
/// Blocks read with one device request at most (read_range).
const READ_RUN_BLOCKS: usize = 64;
/// Pointers handled at a time when a range or list is deleted.
const DELETE_CHUNK: usize = 4096;

/// What `mkfs` needs besides the two devices.
#[derive(Clone, Debug)]
pub struct DualMkfsOptions {
    pub lld: MkfsOptions,
    pub group_blocks: u32,
    /// The metadata device's path, recorded in the data label so `mount`
    /// finds it.
    pub meta_path: String,
}

impl Default for DualMkfsOptions {
    fn default() -> Self {
        DualMkfsOptions {
            lld: MkfsOptions::default(),
            group_blocks: DEFAULT_GROUP_BLOCKS,
            meta_path: String::new(),
        }
    }
}

/// Formats a dual pair: the engine on `meta` (with the layout record and
/// empty bitmaps: an absent bitmap block is an all-free group), then the
/// label and its copy on `data`. `lld.fs_id` 0 picks a fresh id.
pub fn mkfs(
    meta: Arc<dyn Device>,
    data: &dyn Device,
    opts: &DualMkfsOptions,
) -> LdResult<DataGeometry> {
    let mut lopts = opts.lld;
    if lopts.fs_id == 0 {
        lopts.fs_id = crate::lld::mkfs::random_fs_id();
    }
    let geo = DataGeometry::plan(data.size_bytes(), opts.group_blocks, lopts.fs_id)?;
    let label = DataLabel {
        geo,
        meta_path: opts.meta_path.clone(),
    }
    .encode()?;
    let own = ListHints {
        kind: ListKind::Metadata,
        temperature: Temperature::Hot,
        ..Default::default()
    };
    let lld = Lld::create(
        meta,
        &lopts,
        LldOptions {
            cleaner: crate::lld::CleanerOptions {
                background: false,
                ..Default::default()
            },
            ..Default::default()
        },
    )?;
    for want in [INFO_LIST, DESC_LIST, BITMAP_LIST] {
        let got = lld.create_list(None, own)?;
        if got != want {
            return Err(LdError::InvalidArgument(format!(
                "fresh engine gave {got}, expected {want}"
            )));
        }
    }
    lld.write(None, INFO_LIST, 0, &format::encode_info(&geo))?;
    lld.close()?;
    for off in geo.label_offsets() {
        data.write_at(&label, off)?;
    }
    data.flush()?;
    Ok(geo)
}

/// Reads the data device's label, falling back to its copy in the last
/// block.
pub fn read_label(data: &dyn Device) -> LdResult<DataLabel> {
    let size = data.size_bytes();
    let last = (size / DATA_BLOCK_BYTES).saturating_sub(1) * DATA_BLOCK_BYTES;
    let mut first_err = None;
    for off in [0, last] {
        let mut b = vec![0u8; DATA_BLOCK_BYTES as usize];
        data.read_at(&mut b, off)?;
        match DataLabel::decode(&b, off) {
            Ok(l) => return Ok(l),
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    Err(first_err.expect("two attempts"))
}

/// Whether `data` holds a dual data label, either copy (mount and fsck
/// tell the layouts apart by it: a damaged first label must not make a
/// data device pass for a log).
pub fn is_data_device(data: &dyn Device) -> bool {
    read_label(data).is_ok()
}

/// Tracks the data device's writes so the metadata device can wait for
/// them to be durable first.
struct DataSync {
    dev: Arc<dyn Device>,
    /// Data blocks written but not yet given to the device (offset ->
    /// whole block): the fs writes a file a block at a time, and `drain`
    /// gives adjacent blocks to the device as one request (DualFS's data
    /// device is otherwise written 4 KiB a request). Like a disk's write
    /// cache, below the same ordering point: `sync` drains before it
    /// flushes, and `OrderedMeta` syncs before every metadata write. A
    /// read holds it shared from its device read to its look at the map,
    /// a drain exclusively from taking blocks to their writes' end: a read
    /// never sees a block neither pending nor yet on the device.
    pending: std::sync::RwLock<BTreeMap<u64, Vec<u8>>>,
    /// Data writes (runs) completed so far.
    written: std::sync::atomic::AtomicU64,
    /// `written` as of the last completed flush, and whether a flush (or a
    /// drained write) has failed.
    flushed: Mutex<(u64, bool)>,
}

/// Pending bytes past which a write drains at once (memory bound).
const PENDING_LIMIT: usize = 4 << 20;
/// Largest request `drain` makes.
const RUN_LIMIT: usize = 1 << 20;

impl DataSync {
    fn new(dev: Arc<dyn Device>) -> DataSync {
        DataSync {
            dev,
            pending: Default::default(),
            written: Default::default(),
            flushed: Mutex::new((0, false)),
        }
    }

    fn failed(&self) -> bool {
        self.flushed.lock().expect("data sync lock poisoned").1
    }

    fn failed_error() -> DeviceError {
        DeviceError::Io {
            op: DeviceOp::Flush,
            offset: 0,
            len: 0,
            source: std::io::Error::other(
                "an earlier write or flush of the data device failed: it may have dropped data writes",
            ),
        }
    }

    /// Takes whole block `buf` for `offset` (block-aligned). A drain this
    /// starts that fails is not this write's error: the block is taken,
    /// and every later `sync` fails. Once the device failed, a full cache
    /// takes no new block (memory bound): that write fails.
    fn write(&self, buf: Vec<u8>, offset: u64) -> Result<(), DeviceError> {
        assert!(buf.len() == DATA_BLOCK_BYTES as usize && offset.is_multiple_of(DATA_BLOCK_BYTES));
        let full = {
            let mut p = self.pending.write().expect("pending poisoned");
            let full =
                |p: &BTreeMap<u64, Vec<u8>>| p.len() * DATA_BLOCK_BYTES as usize >= PENDING_LIMIT;
            if full(&p) && !p.contains_key(&offset) && self.failed() {
                return Err(Self::failed_error());
            }
            p.insert(offset, buf);
            full(&p)
        };
        if full {
            let _ = self.drain();
        }
        Ok(())
    }

    /// Reads as the device would after every pending write: the device's
    /// bytes with the pending blocks over them.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), DeviceError> {
        let p = self.pending.read().expect("pending poisoned");
        self.dev.read_at(buf, offset)?;
        let end = offset + buf.len() as u64;
        let from = offset - offset % DATA_BLOCK_BYTES;
        for (&o, b) in p.range(from..end) {
            let lo = o.max(offset);
            let hi = (o + b.len() as u64).min(end);
            if lo < hi {
                buf[(lo - offset) as usize..(hi - offset) as usize]
                    .copy_from_slice(&b[(lo - o) as usize..(hi - o) as usize]);
            }
        }
        Ok(())
    }

    /// Gives every pending block to the device, adjacent ones as one
    /// request. A failed write fails every later `sync`, so no metadata
    /// naming its blocks is written after it; the blocks not written stay
    /// pending (reads see them) and are not tried again.
    fn drain(&self) -> Result<(), DeviceError> {
        let mut p = self.pending.write().expect("pending poisoned");
        if self.failed() {
            return Err(Self::failed_error());
        }
        let mut it = std::mem::take(&mut *p).into_iter().peekable();
        while let Some((off, first)) = it.next() {
            let mut run = first;
            while let Some((o, _)) = it.peek() {
                if *o != off + run.len() as u64 || run.len() >= RUN_LIMIT {
                    break;
                }
                run.extend_from_slice(&it.next().expect("peeked").1);
            }
            if let Err(e) = self.dev.write_at(&run, off) {
                self.flushed.lock().expect("data sync lock poisoned").1 = true;
                for (k, b) in run.chunks(DATA_BLOCK_BYTES as usize).enumerate() {
                    p.insert(off + (k as u64) * DATA_BLOCK_BYTES, b.to_vec());
                }
                p.extend(it);
                return Err(e);
            }
            self.written
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        Ok(())
    }

    /// Drains, then flushes the data device if a write completed since the
    /// last flush. Fails for good once a flush (or a drained write) has
    /// failed: the device may have dropped data writes then, and a later
    /// flush that succeeds does not bring them back (as `lld::flushes`
    /// does for the log device).
    fn sync(&self) -> Result<(), DeviceError> {
        let drained = self.drain();
        let w = self.written.load(std::sync::atomic::Ordering::SeqCst);
        let mut f = self.flushed.lock().expect("data sync lock poisoned");
        if f.1 {
            return Err(Self::failed_error());
        }
        drained?;
        if f.0 < w {
            if let Err(e) = self.dev.flush() {
                f.1 = true;
                return Err(e);
            }
            f.0 = w;
        }
        Ok(())
    }
}

/// The metadata device as the engine sees it: before each write, the data
/// device is flushed, so no pointer becomes durable before its data.
struct OrderedMeta {
    inner: Arc<dyn Device>,
    data: Arc<DataSync>,
}

impl Device for OrderedMeta {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), DeviceError> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), DeviceError> {
        self.data.sync()?;
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> Result<(), DeviceError> {
        self.inner.flush()
    }
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn will_need(&self, ranges: &[(u64, u64)]) {
        self.inner.will_need(ranges)
    }
    fn write_unit_bytes(&self) -> u64 {
        self.inner.write_unit_bytes()
    }
    fn discard(&self, offset: u64, len: u64) -> Result<bool, DeviceError> {
        self.inner.discard(offset, len)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Change {
    /// Allocated by this ARU.
    Alloc,
    /// Allocated before this ARU, freed by it.
    Free,
    /// Allocated and freed by this ARU.
    AllocFreed,
}

#[derive(Default)]
struct AruState {
    changes: BTreeMap<u64, Change>,
    /// Data blocks still reserved for this ARU.
    reserved: u64,
    /// Old contents of blocks this ARU overwrote in place (for an abort).
    undo: Vec<(u64, Vec<u8>)>,
    undone: BTreeSet<u64>,
}

struct State {
    /// Bit set: allocated as every ended ARU left it (what the bitmaps in
    /// the log say once those ARUs are durable).
    committed: Vec<u64>,
    /// Bit set: not available to allocate (committed, allocated by an open
    /// ARU, or freed but not yet durably).
    inuse: Vec<u64>,
    /// Free blocks of `inuse`, per group.
    group_free: Vec<u32>,
    /// Data blocks reserved by open ARUs and not yet used.
    reserved: u64,
    arus: HashMap<u64, AruState>,
    /// Blocks freed by ended ARUs, reusable after the next flush, in the
    /// order their ARUs ended.
    freed: Vec<u64>,
    /// Blocks of `freed` made reusable so far (the number of its first
    /// entry): flushes run at once, and each releases only what was freed
    /// before it began, less what another one released meanwhile.
    freed_released: u64,
    /// Data blocks `-o discard` gave back since open.
    discarded_blocks: u64,
    /// Engine list -> (is a data list, its near hint).
    kinds: HashMap<u64, (bool, Option<ListId>)>,
    /// Engine list -> the group its blocks were last taken from.
    list_group: HashMap<u64, u32>,
    /// Engine list -> the group it is tied to (a cache of the ties in the
    /// layout list).
    ties: HashMap<u64, u32>,
    /// The group tied last: ties among equally empty groups go round from
    /// there.
    tie_last: u32,
    /// Per group, where a list new to the group starts looking for a free
    /// block: just after the block allocated there last, so files made one
    /// after another lie one after another rather than in old holes.
    group_next: Vec<u64>,
}

/// The most blocks one discard request covers (64 MiB, as fstrim's
/// default chunk): a piece of a long free run is held out of the allocator
/// only that long.
const DISCARD_PIECE_BLOCKS: u64 = (64 << 20) / DATA_BLOCK_BYTES;

/// The first run of clear bits in `v` at or after `from`, below `end`:
/// (start, length). Whole zero words are skipped a word at a time.
fn free_run(v: &[u64], from: u64, end: u64) -> Option<(u64, u64)> {
    let mut b = from;
    while b < end {
        if b.is_multiple_of(64) && v[(b / 64) as usize] == u64::MAX {
            b += 64;
            continue;
        }
        if !bit(v, b) {
            let start = b;
            while b < end {
                if b.is_multiple_of(64) && end - b >= 64 && v[(b / 64) as usize] == 0 {
                    b += 64;
                } else if !bit(v, b) {
                    b += 1;
                } else {
                    break;
                }
            }
            return Some((start, b - start));
        }
        b += 1;
    }
    None
}

fn bit(v: &[u64], b: u64) -> bool {
    v[(b / 64) as usize] >> (b % 64) & 1 == 1
}

fn set_bit(v: &mut [u64], b: u64, on: bool) {
    let w = &mut v[(b / 64) as usize];
    if on {
        *w |= 1 << (b % 64);
    } else {
        *w &= !(1 << (b % 64));
    }
}

/// Figures for `inspect` and `stats`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DualStats {
    pub geo: DataGeometry,
    /// Free blocks per group as the allocator sees them.
    pub group_free: Vec<u32>,
    /// Blocks freed but waiting for a flush.
    pub freed_pending: u64,
    /// Data blocks reserved by open ARUs.
    pub reserved: u64,
    /// Blocks allocated as the ended ARUs left the bitmaps.
    pub allocated: u64,
    /// Data blocks `-o discard` gave back since open.
    pub discarded: u64,
}

/// The dual Logical Disk.
pub struct Dual {
    meta: Arc<Lld>,
    sync: Arc<DataSync>,
    geo: DataGeometry,
    label: DataLabel,
    st: Mutex<State>,
    /// Held shared by a data read from its pointer to its bytes, and
    /// exclusively by an overwrite in place from its bytes to its pointer
    /// (and by an abort writing old bytes back): a read never pairs one
    /// version's checksum with another's bytes.
    io: std::sync::RwLock<()>,
    /// What `open_for_fsck` found wrong with the bitmaps and descriptors.
    load_problems: Vec<String>,
    /// `-o discard`: blocks a flush makes free again are discarded.
    discard: bool,
}

impl Dual {
    /// Opens a formatted pair. The metadata device must carry the file
    /// system id of the data device's label; it is checked before the
    /// engine writes anything.
    pub fn open(meta: Arc<dyn Device>, data: Arc<dyn Device>, opts: LldOptions) -> LdResult<Dual> {
        Self::open_with(meta, data, opts, false)
    }

    /// `open` for fsck: bitmaps and descriptors that disagree do not fail
    /// it; `check_blocks` names them and `repair_blocks` rewrites them.
    pub fn open_for_fsck(
        meta: Arc<dyn Device>,
        data: Arc<dyn Device>,
        opts: LldOptions,
    ) -> LdResult<Dual> {
        Self::open_with(meta, data, opts, true)
    }

    fn open_with(
        meta: Arc<dyn Device>,
        data: Arc<dyn Device>,
        opts: LldOptions,
        tolerant: bool,
    ) -> LdResult<Dual> {
        let label = read_label(&*data)?;
        let (mgeo, _) = crate::lld::mkfs::read_superblock(&*meta)?;
        if mgeo.fs_id != label.geo.fs_id {
            return Err(LdError::InvalidArgument(format!(
                "the metadata device belongs to file system {:#x}, the data device to {:#x}",
                mgeo.fs_id, label.geo.fs_id
            )));
        }
        let sync = Arc::new(DataSync::new(data));
        let ordered: Arc<dyn Device> = Arc::new(OrderedMeta {
            inner: meta,
            data: sync.clone(),
        });
        let discard = opts.discard && !opts.read_only;
        let lld = Lld::open(ordered, opts)?;
        let mut problems = Vec::new();
        match Self::load(&lld, &label, tolerant.then_some(&mut problems)) {
            Ok(st) => Ok(Dual {
                load_problems: problems,
                meta: Arc::new(lld),
                sync,
                geo: label.geo,
                label,
                st: Mutex::new(st),
                io: std::sync::RwLock::new(()),
                discard,
            }),
            Err(e) => {
                lld.abandon();
                Err(e)
            }
        }
    }

    /// Builds the allocation state from the bitmaps in the log. Strict
    /// (`problems` None), a bitmap of the wrong length, a bit past its
    /// group's end or a descriptor disagreeing with its bitmap fails the
    /// open; otherwise each is noted in `problems` and the bitmap taken as
    /// far as it goes (fsck: the check names them, the repair rewrites
    /// them).
    fn load(
        lld: &Lld,
        label: &DataLabel,
        mut problems: Option<&mut Vec<String>>,
    ) -> LdResult<State> {
        // The record repeats the label's geometry (written together at
        // mkfs): a mount refuses a pair where they differ; fsck notes it and
        // goes on with the label's, which its repair writes back.
        let record = match lld.read(INFO_LIST, 0) {
            Ok(Some(info)) => format::decode_info(&info).and_then(|geo| {
                if geo == label.geo {
                    Ok(())
                } else {
                    Err(LdError::InvalidArgument(format!(
                        "the metadata device's layout record {geo:?} differs from the data label's {:?}",
                        label.geo
                    )))
                }
            }),
            Ok(None) => Err(LdError::InvalidArgument(
                "no dual layout record in the log".into(),
            )),
            Err(LdError::Corrupt(c)) => Err(LdError::Corrupt(c)),
            Err(e) => return Err(e),
        };
        if let Err(e) = record {
            match problems.as_deref_mut() {
                Some(p) => p.push(format!("dual layout record: {e}")),
                None => return Err(e),
            }
        }
        let geo = label.geo;
        let words = (geo.groups as usize) * (geo.group_blocks as usize / 64);
        let mut committed = vec![0u64; words];
        let mut group_free = Vec::with_capacity(geo.groups as usize);
        let gw = geo.group_blocks as usize / 64;
        for g in 0..geo.groups {
            let len = geo.group_len(g);
            let words = &mut committed[g as usize * gw..(g as usize + 1) * gw];
            let mut note = |e: LdError| match problems.as_deref_mut() {
                Some(p) => {
                    p.push(e.to_string());
                    Ok(())
                }
                None => Err(e),
            };
            // fsck: a block failing its checksum is noted (the log's check
            // names it too) and taken as absent.
            let stored = match lld.read(BITMAP_LIST, g as u64) {
                Ok(b) => b,
                Err(LdError::Corrupt(c)) => {
                    note(LdError::Corrupt(c))?;
                    None
                }
                Err(e) => return Err(e),
            };
            if let Some(b) = stored {
                if b.len() != gw * 8 {
                    note(bad_bitmap(
                        g,
                        format!("{} bytes, expected {}", b.len(), gw * 8),
                    ))?;
                }
                for (w, c) in words.iter_mut().zip(b.chunks_exact(8)) {
                    *w = u64::from_le_bytes(c.try_into().unwrap());
                }
                for i in len..geo.group_blocks as u64 {
                    if bit(words, i) {
                        note(bad_bitmap(g, format!("bit {i} set past the group's end")))?;
                        set_bit(words, i, false);
                    }
                }
            }
            let used: u64 = words.iter().map(|w| w.count_ones() as u64).sum();
            let free = (len - used) as u32;
            let desc = match lld.read(DESC_LIST, g as u64) {
                Ok(d) => d,
                Err(LdError::Corrupt(c)) => {
                    note(LdError::Corrupt(c))?;
                    None
                }
                Err(e) => return Err(e),
            };
            if let Some(d) = desc {
                match format::decode_desc(&d, g) {
                    Ok(said) if said != free => note(bad_bitmap(
                        g,
                        format!("descriptor says {said} free, bitmap {free}"),
                    ))?,
                    Ok(_) => {}
                    Err(e) => note(e)?,
                }
            }
            group_free.push(free);
        }
        Ok(State {
            inuse: committed.clone(),
            committed,
            group_free,
            reserved: 0,
            arus: HashMap::new(),
            freed: Vec::new(),
            discarded_blocks: 0,
            freed_released: 0,
            kinds: HashMap::new(),
            list_group: HashMap::new(),
            ties: HashMap::new(),
            tie_last: geo.groups - 1,
            group_next: (0..geo.groups)
                .map(|g| g as u64 * geo.group_blocks as u64)
                .collect(),
        })
    }

    /// The engine on the metadata device.
    pub fn meta(&self) -> &Lld {
        &self.meta
    }

    /// The engine, shared (a mount's control requests: clean, checkpoint).
    pub fn meta_arc(&self) -> Arc<Lld> {
        self.meta.clone()
    }

    pub fn label(&self) -> &DataLabel {
        &self.label
    }

    pub fn stats(&self) -> DualStats {
        let st = self.lock();
        DualStats {
            geo: self.geo,
            group_free: st.group_free.clone(),
            freed_pending: st.freed.len() as u64,
            reserved: st.reserved,
            allocated: st.committed.iter().map(|w| w.count_ones() as u64).sum(),
            discarded: st.discarded_blocks,
        }
    }

    /// The data block holding user list `list`'s block `index`, if that
    /// is a data list and the block exists (inspect, tests).
    pub fn data_block(&self, list: ListId, index: u64) -> LdResult<Option<u64>> {
        let eng = self.eng(list)?;
        if !self.is_data(eng)? {
            return Ok(None);
        }
        Ok(self.pointer(eng, index)?.map(|p| p.block))
    }

    /// The engine list on the metadata device holding user list `list`
    /// (its blocks, or for a data list its pointers): inspect.
    pub fn engine_list(&self, list: ListId) -> LdResult<ListId> {
        self.eng(list)
    }

    /// The group user list `list` is tied to, if it has a tie.
    pub fn tie(&self, list: ListId) -> LdResult<Option<u32>> {
        self.tie_of(self.eng(list)?)
    }

    /// Flushes, then closes the engine (a final checkpoint).
    pub fn close(&self) -> LdResult<()> {
        self.flush()?;
        self.meta.close()
    }

    /// Stops without flushing, as a crash would (if the engine is shared
    /// still, it is only dropped here).
    pub fn abandon(self) {
        if let Ok(l) = Arc::try_unwrap(self.meta) {
            l.abandon()
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.st.lock().expect("dual state poisoned")
    }

    fn eng(&self, list: ListId) -> LdResult<ListId> {
        if list.0 == 0 {
            return Err(LdError::NoSuchList(list));
        }
        list.0
            .checked_add(OWN_LISTS)
            .map(ListId)
            .ok_or(LdError::NoSuchList(list))
    }

    /// Names user lists in an engine error.
    fn user_err(e: LdError) -> LdError {
        match e {
            LdError::NoSuchList(l) if l.0 > OWN_LISTS => {
                LdError::NoSuchList(ListId(l.0 - OWN_LISTS))
            }
            e => e,
        }
    }

    /// Whether engine list `eng` is a data list (cached; a list's kind
    /// never changes).
    fn is_data(&self, eng: ListId) -> LdResult<bool> {
        if let Some(k) = self.lock().kinds.get(&eng.0) {
            return Ok(k.0);
        }
        let h = self
            .meta
            .list_hints(eng)?
            .ok_or(LdError::NoSuchList(eng))
            .map_err(Self::user_err)?;
        let k = (h.kind == ListKind::Data, h.near);
        cache_insert(&mut self.lock().kinds, eng.0, k);
        Ok(k.0)
    }

    fn pointer(&self, eng: ListId, index: u64) -> LdResult<Option<Pointer>> {
        match self.meta.read(eng, index).map_err(Self::user_err)? {
            Some(b) => Ok(Some(Pointer::decode(&b, self.geo.blocks)?)),
            None => Ok(None),
        }
    }

    /// Runs `f` in `aru`, or in an ARU of its own (so a data list's pointer
    /// and its bitmap change recover together).
    fn in_aru<T>(&self, aru: Option<AruId>, f: impl FnOnce(AruId) -> LdResult<T>) -> LdResult<T> {
        if let Some(a) = aru {
            return f(a);
        }
        let a = self.begin_aru()?;
        match f(a) {
            Ok(v) => {
                self.end_aru(a)?;
                Ok(v)
            }
            Err(e) => {
                let _ = self.abort_aru(a);
                Err(e)
            }
        }
    }

    /// Reads data block `p` and checks it against its pointer.
    fn read_block(&self, p: &Pointer) -> LdResult<Vec<u8>> {
        let mut buf = vec![0u8; p.len as usize];
        let off = self.geo.offset(p.block);
        self.sync.read_at(&mut buf, off)?;
        check_crc(&buf, p, off)?;
        Ok(buf)
    }

    /// The group engine list `list` is tied to, if it has a tie.
    fn tie_of(&self, list: ListId) -> LdResult<Option<u32>> {
        if list.0 <= OWN_LISTS {
            return Ok(None);
        }
        if let Some(&g) = self.lock().ties.get(&list.0) {
            return Ok(Some(g));
        }
        let Some(b) = self.meta.read(INFO_LIST, list.0)? else {
            return Ok(None);
        };
        let g = format::decode_tie(&b, self.geo.groups, list.0)?;
        cache_insert(&mut self.lock().ties, list.0, g);
        Ok(Some(g))
    }

    /// Takes a free block for (`eng`, `index`) in `aru`: next to the
    /// block of the index before, else in the list's group, else near the
    /// `near` list's, else in the emptiest group.
    fn alloc(&self, aru: AruId, eng: ListId, index: u64) -> LdResult<u64> {
        self.with_frees_released(|| self.alloc_once(aru, eng, index))
    }

    fn alloc_once(&self, aru: AruId, eng: ListId, index: u64) -> LdResult<u64> {
        let prev = match index.checked_sub(1) {
            Some(i) => self.pointer(eng, i)?,
            None => None,
        };
        let (near, placed) = {
            let st = self.lock();
            (
                st.kinds.get(&eng.0).and_then(|k| k.1),
                st.list_group.contains_key(&eng.0),
            )
        };
        // The directory's tie, unless the list already has a group.
        let tied = match (prev, placed, near) {
            (None, false, Some(n)) => self.tie_of(n)?,
            _ => None,
        };
        let mut st = self.lock();
        let st = &mut *st;
        let goal = match prev {
            Some(p) => p.block + 1,
            None => {
                let g = st
                    .list_group
                    .get(&eng.0)
                    .copied()
                    .or(tied)
                    .or_else(|| near.and_then(|n| st.list_group.get(&n.0).copied()))
                    .unwrap_or_else(|| emptiest(&st.group_free));
                st.group_next[g as usize]
            }
        };
        let a = st.arus.get_mut(&aru.0).ok_or(LdError::NoSuchAru(aru))?;
        if a.reserved > 0 {
            a.reserved -= 1;
            st.reserved -= 1;
        } else {
            let free: u64 = st.group_free.iter().map(|&f| f as u64).sum();
            if free <= st.reserved {
                return Err(LdError::NoSpace {
                    needed: DATA_BLOCK_BYTES,
                    available: 0,
                });
            }
        }
        let b = find_free(&self.geo, &st.inuse, &st.group_free, goal)
            .expect("a free block exists: counted above");
        set_bit(&mut st.inuse, b, true);
        let g = self.geo.group_of(b);
        st.group_free[g as usize] -= 1;
        cache_insert(&mut st.list_group, eng.0, g);
        let lo = g as u64 * self.geo.group_blocks as u64;
        st.group_next[g as usize] = if b + 1 < lo + self.geo.group_len(g) {
            b + 1
        } else {
            lo
        };
        a.changes.insert(b, Change::Alloc);
        Ok(b)
    }

    /// Takes back an allocation whose pointer never made it into the log.
    fn unalloc(&self, aru: AruId, b: u64) {
        let mut st = self.lock();
        if let Some(a) = st.arus.get_mut(&aru.0) {
            a.changes.remove(&b);
        }
        set_bit(&mut st.inuse, b, false);
        st.group_free[self.geo.group_of(b) as usize] += 1;
    }

    fn free(&self, aru: AruId, b: u64) -> LdResult<()> {
        let mut st = self.lock();
        let a = st.arus.get_mut(&aru.0).ok_or(LdError::NoSuchAru(aru))?;
        let c = match a.changes.get(&b) {
            Some(Change::Alloc) => Change::AllocFreed,
            _ => Change::Free,
        };
        a.changes.insert(b, c);
        Ok(())
    }

    fn write_data(&self, aru: AruId, eng: ListId, index: u64, data: &[u8]) -> LdResult<()> {
        let p = Pointer {
            block: 0,
            len: data.len() as u32,
            crc: crc32c::crc32c(data),
        };
        let mut buf = data.to_vec();
        buf.resize(DATA_BLOCK_BYTES as usize, 0);
        if let Some(old) = self.pointer(eng, index)? {
            // In place. Keep the old content while the ARU is open, unless
            // the ARU allocated the block itself (an abort frees it).
            let off = self.geo.offset(old.block);
            let need_undo = {
                let st = self.lock();
                let a = st.arus.get(&aru.0).ok_or(LdError::NoSuchAru(aru))?;
                a.changes.get(&old.block) != Some(&Change::Alloc) && !a.undone.contains(&old.block)
            };
            if need_undo {
                let mut prev = vec![0u8; DATA_BLOCK_BYTES as usize];
                self.sync.read_at(&mut prev, off)?;
                let mut st = self.lock();
                let a = st.arus.get_mut(&aru.0).ok_or(LdError::NoSuchAru(aru))?;
                a.undone.insert(old.block);
                a.undo.push((old.block, prev));
            }
            let p = Pointer {
                block: old.block,
                ..p
            };
            let _io = self.io.write().expect("io lock poisoned");
            self.sync.write(buf, off)?;
            return self.meta.write(Some(aru), eng, index, &p.encode());
        }
        let b = self.alloc(aru, eng, index)?;
        let r = self
            .sync
            .write(buf, self.geo.offset(b))
            .map_err(LdError::from)
            .and_then(|()| {
                let p = Pointer { block: b, ..p };
                self.meta.write(Some(aru), eng, index, &p.encode())
            });
        if r.is_err() {
            self.unalloc(aru, b);
        }
        r
    }

    /// Deletes the pointers of `eng` in `range` and frees their blocks, a
    /// chunk at a time.
    fn delete_data(&self, aru: AruId, eng: ListId, range: Range<u64>) -> LdResult<()> {
        let mut from = range.start;
        while from < range.end {
            let chunk = self
                .meta
                .read_range(eng, from..range.end, DELETE_CHUNK)
                .map_err(Self::user_err)?;
            let Some(&(last, _)) = chunk.last() else {
                break;
            };
            let ptrs = chunk
                .iter()
                .map(|(_, b)| Pointer::decode(b, self.geo.blocks))
                .collect::<LdResult<Vec<_>>>()?;
            let to = if chunk.len() < DELETE_CHUNK {
                range.end
            } else {
                last + 1
            };
            self.meta.delete_range(Some(aru), eng, from..to)?;
            for p in ptrs {
                self.free(aru, p.block)?;
            }
            if to == range.end || last == u64::MAX {
                break;
            }
            from = to;
        }
        Ok(())
    }

    /// `ldfs trim` for the data device (the log's segments are `Lld::trim`'s):
    /// gives every run of free data blocks back to the storage, a hole in an
    /// image file or BLKDISCARD, as fstrim does for ext4's free extents.
    /// Free means free to allocate (`inuse` clear): a block freed by an ARU
    /// is that only once a flush made its freeing durable, and that flush
    /// drained the data device's queue first, so no write of it is pending.
    /// As ext4's FITRIM does, each piece (at most `DISCARD_PIECE_BLOCKS`) is
    /// marked in use under the state lock, discarded with no lock held (a
    /// slow BLKDISCARD stalls no operation), then freed again: no
    /// allocation takes a block while it is discarded (a write landing
    /// before a discard of the same block would be lost). Returns (blocks,
    /// bytes) discarded; (0, 0) if the device cannot discard.
    pub fn trim_data(&self) -> LdResult<(u64, u64)> {
        let mut blocks = 0u64;
        let mut at = 0u64;
        loop {
            let (start, len) = {
                let mut st = self.lock();
                let Some((start, len)) = free_run(&st.inuse, at, self.geo.blocks) else {
                    break;
                };
                // Never the blocks open ARUs reserved: their allocations
                // count on finding them (review 27: a trim holding the last
                // free run made a reserved write panic).
                let free: u64 = st.group_free.iter().map(|&f| f as u64).sum();
                let spare = free.saturating_sub(st.reserved);
                let len = len.min(DISCARD_PIECE_BLOCKS).min(spare);
                if len == 0 {
                    break;
                }
                self.hold(&mut st, start, len, true);
                (start, len)
            };
            let done = self.discard_runs(&[(start, len)]);
            self.hold(&mut self.lock(), start, len, false);
            match done {
                Ok(0) => break,
                Ok(n) => blocks += n,
                Err(e) => return Err(e.into()),
            }
            at = start + len;
        }
        Ok((blocks, blocks * DATA_BLOCK_BYTES))
    }

    /// Marks blocks `start..start + len` in use (`on`; they were free) or
    /// free again, keeping the groups' free counts.
    fn hold(&self, st: &mut State, start: u64, len: u64, on: bool) {
        for b in start..start + len {
            debug_assert_eq!(
                bit(&st.inuse, b),
                !on,
                "block {b} held twice or freed twice"
            );
            set_bit(&mut st.inuse, b, on);
            let g = &mut st.group_free[self.geo.group_of(b) as usize];
            if on {
                *g -= 1;
            } else {
                *g += 1;
            }
        }
    }

    /// Discards `runs` of data blocks that no pointer names and no one may
    /// allocate meanwhile, holding no lock but for a moment: first the io
    /// lock exclusively, so a read that took a pointer to one of them
    /// before it was freed has read its bytes (a read holds the io lock
    /// shared from pointer to bytes; afterwards no pointer names them).
    /// Returns the blocks discarded, stopping at the first refusal.
    fn discard_runs(&self, runs: &[(u64, u64)]) -> Result<u64, DeviceError> {
        drop(self.io.write().expect("io lock poisoned"));
        let mut done = 0;
        for &(start, len) in runs {
            let mut b = start;
            while b < start + len {
                let n = (start + len - b).min(DISCARD_PIECE_BLOCKS);
                if !self
                    .sync
                    .dev
                    .discard(self.geo.offset(b), n * DATA_BLOCK_BYTES)?
                {
                    return Ok(done);
                }
                done += n;
                b += n;
            }
        }
        Ok(done)
    }

    /// Checks the data blocks against the pointers: every pointer names an
    /// allocated block, no block is named twice, no allocated block is
    /// named by nothing (a leak). Returns the problems found, as text.
    pub fn check_blocks(&self) -> LdResult<Vec<String>> {
        self.check_blocks_with(false)
    }

    /// `check_blocks`, and with `data` also every named block's bytes
    /// against its checksum.
    pub fn check_blocks_with(&self, data: bool) -> LdResult<Vec<String>> {
        let mut problems = self.load_problems.clone();
        let mut named = vec![0u64; self.lock().committed.len()];
        let mut from = OWN_LISTS + 1;
        loop {
            let lists = self.meta.lists(from, 1024)?;
            let Some(last) = lists.last() else { break };
            from = last.0 + 1;
            for l in lists {
                if !self.is_data(l)? {
                    continue;
                }
                let mut i = 0;
                loop {
                    let chunk = self.meta.read_range(l, i..u64::MAX, DELETE_CHUNK)?;
                    let Some(&(last, _)) = chunk.last() else {
                        break;
                    };
                    for (idx, b) in &chunk {
                        let user = l.0 - OWN_LISTS;
                        let p = match Pointer::decode(b, self.geo.blocks) {
                            Ok(p) => p,
                            Err(e) => {
                                problems.push(format!("list {user} block {idx}: {e}"));
                                continue;
                            }
                        };
                        if bit(&named, p.block) {
                            problems.push(format!(
                                "list {user} block {idx}: data block {} named twice",
                                p.block
                            ));
                        }
                        set_bit(&mut named, p.block, true);
                        if data {
                            let _io = self.io.read().expect("io lock poisoned");
                            match self.read_block(&p) {
                                Ok(_) => {}
                                Err(LdError::Corrupt(c)) => {
                                    problems.push(format!("list {user} block {idx}: {c}"))
                                }
                                Err(e) => return Err(e),
                            }
                        }
                        if !bit(&self.lock().committed, p.block) {
                            problems.push(format!(
                                "list {user} block {idx}: data block {} is free in the bitmap",
                                p.block
                            ));
                        }
                    }
                    if chunk.len() < DELETE_CHUNK || last == u64::MAX {
                        break;
                    }
                    i = last + 1;
                }
            }
        }
        let st = self.lock();
        for (w, (&c, &n)) in st.committed.iter().zip(&named).enumerate() {
            let leaked = c & !n;
            if leaked != 0 {
                for k in 0..64 {
                    if leaked >> k & 1 == 1 {
                        problems.push(format!(
                            "data block {} is allocated but named by nothing",
                            w as u64 * 64 + k
                        ));
                    }
                }
            }
        }
        drop(st);
        for (list, why) in self.bad_ties()? {
            problems.push(format!(
                "group tie of list {}: {why}",
                list.saturating_sub(OWN_LISTS)
            ));
        }
        Ok(problems)
    }

    /// fsck's repair of the data blocks; nothing else may run meanwhile
    /// (no ARU open). Returns what it fixed, one line each.
    ///
    /// A pointer that does not decode, or (with `data`) whose block fails
    /// its checksum, is deleted: the file keeps a hole there, as the log's
    /// repair does with a block failing its checksum. A block named twice
    /// stays with the first pointer (by list and index); a later one whose
    /// checksum the bytes match gets a copy in a free block, one they do not
    /// match is deleted. Then each group's bitmap and descriptor are
    /// rewritten from the blocks still named wherever they differ: a named
    /// block free in the bitmap becomes allocated, an allocated block named
    /// by nothing (leaked) free. Last, ties naming no metadata list are
    /// deleted. Each change is an ARU of its own, pointers before bitmaps:
    /// a crash in between leaves only leaked blocks, which a second run
    /// frees.
    pub fn repair_blocks(&self, data: bool) -> LdResult<Vec<String>> {
        const SHOWN: usize = 64;
        let mut fixed = Vec::new();
        let mut named = vec![0u64; self.lock().committed.len()];
        // (engine list, index, why) to delete; (engine list, index,
        // pointer) to give a copy.
        let mut drop_ptrs: Vec<(ListId, u64, String)> = Vec::new();
        let mut copies: Vec<(ListId, u64, Pointer)> = Vec::new();
        let mut from = OWN_LISTS + 1;
        loop {
            let lists = self.meta.lists(from, 1024)?;
            let Some(last) = lists.last() else { break };
            from = last.0 + 1;
            for l in lists {
                if !self.is_data(l)? {
                    continue;
                }
                let mut i = 0;
                loop {
                    let chunk = self.meta.read_range(l, i..u64::MAX, DELETE_CHUNK)?;
                    let Some(&(last, _)) = chunk.last() else {
                        break;
                    };
                    for (idx, b) in chunk.iter() {
                        let p = match Pointer::decode(b, self.geo.blocks) {
                            Ok(p) => p,
                            Err(e) => {
                                drop_ptrs.push((l, *idx, e.to_string()));
                                continue;
                            }
                        };
                        let twice = bit(&named, p.block);
                        if data || twice {
                            match self.read_block(&p) {
                                Ok(_) => {}
                                Err(LdError::Corrupt(c)) => {
                                    drop_ptrs.push((l, *idx, c.to_string()));
                                    continue;
                                }
                                Err(e) => return Err(e),
                            }
                        }
                        if twice {
                            copies.push((l, *idx, p));
                        } else {
                            set_bit(&mut named, p.block, true);
                        }
                    }
                    if chunk.len() < DELETE_CHUNK || last == u64::MAX {
                        break;
                    }
                    i = last + 1;
                }
            }
        }
        for (l, idx, p) in copies {
            let free = scan(&named, p.block, self.geo.blocks).or_else(|| scan(&named, 0, p.block));
            let Some(nb) = free else {
                drop_ptrs.push((l, idx, "named twice, and no free block for a copy".into()));
                continue;
            };
            let mut buf = self.read_block(&p)?;
            buf.resize(DATA_BLOCK_BYTES as usize, 0);
            self.sync.write(buf, self.geo.offset(nb))?;
            let q = Pointer { block: nb, ..p };
            let a = self.meta.begin_aru()?;
            self.meta.write(Some(a), l, idx, &q.encode())?;
            self.meta.end_aru(a)?;
            set_bit(&mut named, nb, true);
            fixed.push(format!(
                "list {} block {idx}: data block {} was named twice; this pointer now names a copy in block {nb}",
                l.0 - OWN_LISTS,
                p.block
            ));
        }
        let dropped = drop_ptrs.len();
        for (k, chunk) in drop_ptrs.chunks(1024).enumerate() {
            let a = self.meta.begin_aru()?;
            for (j, (l, idx, why)) in chunk.iter().enumerate() {
                self.meta.delete(Some(a), *l, *idx)?;
                if k * 1024 + j < SHOWN {
                    fixed.push(format!(
                        "list {} block {idx}: pointer deleted (its bytes are lost: {why})",
                        l.0 - OWN_LISTS
                    ));
                }
            }
            self.meta.end_aru(a)?;
        }
        if dropped > SHOWN {
            fixed.push(format!("... and {} more pointers deleted", dropped - SHOWN));
        }
        // The bitmaps, from what is still named.
        let gw = self.geo.group_blocks as usize / 64;
        for g in 0..self.geo.groups {
            let want = &named[g as usize * gw..(g as usize + 1) * gw];
            let want_bytes: Vec<u8> = want.iter().flat_map(|w| w.to_le_bytes()).collect();
            let used: u64 = want.iter().map(|w| w.count_ones() as u64).sum();
            let free = (self.geo.group_len(g) - used) as u32;
            let stored = self.meta.read(BITMAP_LIST, g as u64)?;
            let desc_ok = match self.meta.read(DESC_LIST, g as u64)? {
                None => true,
                Some(d) => format::decode_desc(&d, g).ok() == Some(free),
            };
            let bitmap_ok = match &stored {
                Some(b) => *b == want_bytes,
                None => used == 0,
            };
            if bitmap_ok && desc_ok {
                continue;
            }
            let mut had = vec![0u64; gw];
            if let Some(b) = &stored {
                for (w, c) in had.iter_mut().zip(b.chunks_exact(8)) {
                    *w = u64::from_le_bytes(c.try_into().unwrap());
                }
            }
            let marked: u32 = want
                .iter()
                .zip(&had)
                .map(|(w, h)| (w & !h).count_ones())
                .sum();
            let freed: u32 = want
                .iter()
                .zip(&had)
                .map(|(w, h)| (h & !w).count_ones())
                .sum();
            let a = self.meta.begin_aru()?;
            self.meta
                .write(Some(a), BITMAP_LIST, g as u64, &want_bytes)?;
            self.meta
                .write(Some(a), DESC_LIST, g as u64, &format::encode_desc(g, free))?;
            self.meta.end_aru(a)?;
            fixed.push(format!(
                "group {g}: bitmap and descriptor rewritten ({marked} named blocks that were free now allocated, {freed} allocated blocks named by nothing freed)"
            ));
        }
        {
            let mut st = self.lock();
            let st = &mut *st;
            assert!(st.arus.is_empty(), "repair_blocks with an ARU open");
            st.group_free = (0..self.geo.groups)
                .map(|g| {
                    let w = &named[g as usize * gw..(g as usize + 1) * gw];
                    (self.geo.group_len(g) - w.iter().map(|w| w.count_ones() as u64).sum::<u64>())
                        as u32
                })
                .collect();
            st.committed = named.clone();
            st.inuse = named;
            // As a flush releasing them all: a flush that counted them
            // before must not release them again.
            st.freed_released += st.freed.len() as u64;
            st.freed.clear();
            st.list_group.clear();
        }
        for (list, why) in self.bad_ties()? {
            self.meta.delete(None, INFO_LIST, list)?;
            fixed.push(format!(
                "group tie of list {} deleted ({why})",
                list.saturating_sub(OWN_LISTS)
            ));
        }
        self.lock().ties.clear();
        self.flush()?;
        Ok(fixed)
    }

    /// Ties that do not decode, or name a list that does not exist or is
    /// a data list: (engine list, why).
    fn bad_ties(&self) -> LdResult<Vec<(u64, String)>> {
        let mut bad = Vec::new();
        let mut from = OWN_LISTS + 1;
        loop {
            let idx = self.meta.indices(INFO_LIST, from, 1024)?;
            let Some(&last) = idx.last() else { break };
            for i in idx {
                let Some(b) = self.meta.read(INFO_LIST, i)? else {
                    continue;
                };
                if let Err(e) = format::decode_tie(&b, self.geo.groups, i) {
                    bad.push((i, e.to_string()));
                    continue;
                }
                match self.meta.list_hints(ListId(i))? {
                    None => bad.push((i, "the list does not exist".into())),
                    Some(h) if h.kind == ListKind::Data => {
                        bad.push((i, "the list is a data list".into()))
                    }
                    Some(_) => {}
                }
            }
            if last == u64::MAX {
                break;
            }
            from = last + 1;
        }
        Ok(bad)
    }

    /// Writes the bitmap and descriptor of each group `a` touched, as the
    /// ended ARUs left them plus `a`'s changes.
    fn write_bitmaps(&self, st: &State, aru: AruId, a: &AruState) -> LdResult<()> {
        let gw = self.geo.group_blocks as u64 / 64;
        let groups: BTreeSet<u32> = a.changes.keys().map(|&b| self.geo.group_of(b)).collect();
        for g in groups {
            let lo = g as u64 * self.geo.group_blocks as u64;
            let mut words =
                st.committed[(g as u64 * gw) as usize..((g as u64 + 1) * gw) as usize].to_vec();
            for (&b, &c) in a.changes.range(lo..lo + self.geo.group_blocks as u64) {
                set_bit(&mut words, b - lo, c == Change::Alloc);
            }
            let used: u64 = words.iter().map(|w| w.count_ones() as u64).sum();
            let free = (self.geo.group_len(g) - used) as u32;
            let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
            self.meta.write(Some(aru), BITMAP_LIST, g as u64, &bytes)?;
            self.meta.write(
                Some(aru),
                DESC_LIST,
                g as u64,
                &format::encode_desc(g, free),
            )?;
        }
        Ok(())
    }

    /// Engine bytes an ARU's bitmap and descriptor writes may take for an
    /// operation of `bytes` (one group per group's worth of data, plus one).
    fn bitmap_bytes(&self, bytes: u64) -> u64 {
        let group_bytes = self.geo.group_blocks as u64 * DATA_BLOCK_BYTES;
        let groups = bytes / group_bytes + 2;
        // And a few records for group ties (a list created or deleted).
        groups * (self.geo.group_blocks as u64 / 8 + format::DESC_BYTES as u64 + 256) + 256
    }

    /// Blocks freed by ended ARUs are reusable only once their freeing is
    /// durable. When an allocation or reservation finds no space while such
    /// blocks wait, flush (which releases them) and try once more, rather
    /// than fail with NoSpace until the next commit: a punch or a delete on
    /// a full data device makes its space writable at once (as lld's
    /// admission checkpoints to release emptied segments). Costs nothing
    /// until space runs out.
    fn with_frees_released<T>(&self, f: impl Fn() -> LdResult<T>) -> LdResult<T> {
        match f() {
            Err(LdError::NoSpace { .. }) if !self.lock().freed.is_empty() => {
                self.flush()?;
                f()
            }
            r => r,
        }
    }

    fn reserve_data(&self, aru: AruId, bytes: u64, must: bool) -> LdResult<u64> {
        self.with_frees_released(|| self.reserve_data_once(aru, bytes, must))
    }

    fn reserve_data_once(&self, aru: AruId, bytes: u64, must: bool) -> LdResult<u64> {
        let want = bytes.div_ceil(DATA_BLOCK_BYTES);
        let mut st = self.lock();
        let st = &mut *st;
        let free: u64 = st.group_free.iter().map(|&f| f as u64).sum();
        let avail = free.saturating_sub(st.reserved);
        if must && avail < want {
            return Err(LdError::NoSpace {
                needed: bytes,
                available: avail * DATA_BLOCK_BYTES,
            });
        }
        let got = want.min(avail);
        let a = st.arus.get_mut(&aru.0).ok_or(LdError::NoSuchAru(aru))?;
        a.reserved += got;
        st.reserved += got;
        Ok(got)
    }

    fn unreserve_data(&self, aru: AruId, n: u64) {
        let mut st = self.lock();
        let st = &mut *st;
        if let Some(a) = st.arus.get_mut(&aru.0) {
            let n = n.min(a.reserved);
            a.reserved -= n;
            st.reserved -= n;
        }
    }
}

/// fsck: the hints to give engine list `eng` of a dual pair whose entry
/// in list 0 was lost (the engine's repair rewrites it): a data list if it
/// holds blocks and every one is a pointer whose data block on `data`
/// matches its checksum, else a metadata list (a file misread as one
/// keeps its blocks; its bytes merely stay in the log). Dual's own lists
/// are metadata.
pub fn infer_list_hints(
    meta: &Lld,
    data: &dyn Device,
    geo: &DataGeometry,
    eng: u64,
) -> LdResult<ListHints> {
    let metadata = ListHints {
        kind: ListKind::Metadata,
        ..Default::default()
    };
    if eng <= OWN_LISTS {
        return Ok(metadata);
    }
    let mut i = 0;
    let mut any = false;
    loop {
        let chunk = meta.read_range(ListId(eng), i..u64::MAX, DELETE_CHUNK)?;
        let Some(&(last, _)) = chunk.last() else {
            break;
        };
        for (_, b) in &chunk {
            let Ok(p) = Pointer::decode(b, geo.blocks) else {
                return Ok(metadata);
            };
            let mut buf = vec![0u8; p.len as usize];
            data.read_at(&mut buf, geo.offset(p.block))?;
            if crc32c::crc32c(&buf) != p.crc {
                return Ok(metadata);
            }
            any = true;
        }
        if chunk.len() < DELETE_CHUNK || last == u64::MAX {
            break;
        }
        i = last + 1;
    }
    Ok(if any { ListHints::default() } else { metadata })
}

fn bad_bitmap(g: u32, why: String) -> LdError {
    LdError::Corrupt(Corruption {
        what: "group bitmap",
        offset: g as u64,
        reason: CorruptReason::Inconsistent(why),
    })
}

fn check_crc(buf: &[u8], p: &Pointer, offset: u64) -> LdResult<()> {
    let got = crc32c::crc32c(buf);
    if got != p.crc {
        return Err(LdError::Corrupt(Corruption {
            what: "data block",
            offset,
            reason: CorruptReason::BadChecksum {
                expected: p.crc,
                got,
            },
        }));
    }
    Ok(())
}

/// The group a new directory is tied to: the emptiest (DualFS 3.1); among
/// equally empty ones, the next after the last tie, so directories made one
/// after another on a fresh device spread over the groups rather than all
/// taking the first (ext2's find_group_dir spreads them for that reason).
fn tie_group(st: &mut State) -> u32 {
    let n = st.group_free.len() as u32;
    let most = st.group_free.iter().copied().max().unwrap_or(0);
    let g = (1..=n)
        .map(|k| (st.tie_last + k) % n)
        .find(|&g| st.group_free[g as usize] == most)
        .unwrap_or(0);
    st.tie_last = g;
    g
}

fn emptiest(group_free: &[u32]) -> u32 {
    let mut best = 0;
    for (g, &f) in group_free.iter().enumerate() {
        if f > group_free[best] {
            best = g;
        }
    }
    best as u32
}

/// The first free block at or after `goal` in its group, wrapping within
/// the group, then in the following groups.
fn find_free(geo: &DataGeometry, inuse: &[u64], group_free: &[u32], goal: u64) -> Option<u64> {
    let goal = if goal >= geo.blocks { 0 } else { goal };
    let g0 = geo.group_of(goal);
    for k in 0..geo.groups {
        let g = (g0 + k) % geo.groups;
        if group_free[g as usize] == 0 {
            continue;
        }
        let lo = g as u64 * geo.group_blocks as u64;
        let hi = lo + geo.group_len(g);
        let start = if g == g0 { goal } else { lo };
        if let Some(b) = scan(inuse, start, hi).or_else(|| scan(inuse, lo, start)) {
            return Some(b);
        }
    }
    None
}

fn scan(v: &[u64], from: u64, to: u64) -> Option<u64> {
    let mut b = from;
    while b < to {
        let w = v[(b / 64) as usize] >> (b % 64);
        if w == u64::MAX >> (b % 64) {
            b = (b / 64 + 1) * 64;
            continue;
        }
        let k = (!w).trailing_zeros() as u64;
        return (b + k < to).then_some(b + k);
    }
    None
}

impl LogicalDisk for Dual {
    fn max_block_bytes(&self) -> usize {
        self.meta.max_block_bytes()
    }

    fn create_list(&self, aru: Option<AruId>, hints: ListHints) -> LdResult<ListId> {
        let near = hints.near.map(|n| self.eng(n)).transpose()?;
        let h = ListHints { near, ..hints };
        if hints.kind == ListKind::Data {
            // File data goes to the data device in place, never
            // compressed: the hints say so rather than promise it.
            let h = ListHints {
                compress: Compression::Off,
                ..h
            };
            let id = self.meta.create_list(aru, h).map_err(Self::user_err)?;
            cache_insert(&mut self.lock().kinds, id.0, (true, near));
            return Ok(ListId(id.0 - OWN_LISTS));
        }
        // A metadata list may be a directory: tied to a group now, in the
        // same ARU, so the tie recovers with the list (module doc).
        self.in_aru(aru, |a| {
            let id = self.meta.create_list(Some(a), h).map_err(Self::user_err)?;
            let mut st = self.lock();
            let g = tie_group(&mut st);
            self.meta
                .write(Some(a), INFO_LIST, id.0, &format::encode_tie(g))?;
            cache_insert(&mut st.kinds, id.0, (false, near));
            cache_insert(&mut st.ties, id.0, g);
            Ok(ListId(id.0 - OWN_LISTS))
        })
    }

    fn delete_list(&self, aru: Option<AruId>, list: ListId) -> LdResult<()> {
        let eng = self.eng(list)?;
        if !self.is_data(eng)? {
            // With its tie, if it has one (lists made before ties had none).
            return self.in_aru(aru, |a| {
                self.meta
                    .delete_list(Some(a), eng)
                    .map_err(Self::user_err)?;
                self.meta.delete(Some(a), INFO_LIST, eng.0)?;
                self.lock().ties.remove(&eng.0);
                Ok(())
            });
        }
        self.in_aru(aru, |a| {
            self.delete_data(a, eng, 0..u64::MAX)?;
            self.meta
                .delete_list(Some(a), eng)
                .map_err(Self::user_err)?;
            self.lock().list_group.remove(&eng.0);
            Ok(())
        })
    }

    fn list_hints(&self, list: ListId) -> LdResult<Option<ListHints>> {
        let eng = self.eng(list)?;
        Ok(self.meta.list_hints(eng)?.map(|h| ListHints {
            near: h.near.map(|n| ListId(n.0.saturating_sub(OWN_LISTS))),
            ..h
        }))
    }

    fn write(&self, aru: Option<AruId>, list: ListId, index: u64, data: &[u8]) -> LdResult<()> {
        let eng = self.eng(list)?;
        if !self.is_data(eng)? {
            return self
                .meta
                .write(aru, eng, index, data)
                .map_err(Self::user_err);
        }
        if data.is_empty() || data.len() as u64 > DATA_BLOCK_BYTES {
            return Err(LdError::BadBlockLength {
                len: data.len(),
                max: DATA_BLOCK_BYTES as usize,
            });
        }
        self.in_aru(aru, |a| self.write_data(a, eng, index, data))
    }

    fn read(&self, list: ListId, index: u64) -> LdResult<Option<Vec<u8>>> {
        let eng = self.eng(list)?;
        if !self.is_data(eng)? {
            return self.meta.read(eng, index).map_err(Self::user_err);
        }
        let _io = self.io.read().expect("io lock poisoned");
        match self.pointer(eng, index)? {
            Some(p) => Ok(Some(self.read_block(&p)?)),
            None => Ok(None),
        }
    }

    fn read_range(
        &self,
        list: ListId,
        range: Range<u64>,
        limit: usize,
    ) -> LdResult<Vec<(u64, Vec<u8>)>> {
        let eng = self.eng(list)?;
        if !self.is_data(eng)? {
            return self
                .meta
                .read_range(eng, range, limit)
                .map_err(Self::user_err);
        }
        let _io = self.io.read().expect("io lock poisoned");
        let ptrs = self
            .meta
            .read_range(eng, range, limit)
            .map_err(Self::user_err)?
            .into_iter()
            .map(|(i, b)| Ok((i, Pointer::decode(&b, self.geo.blocks)?)))
            .collect::<LdResult<Vec<_>>>()?;
        // Blocks that lie one after another on the device are read with
        // one request.
        let mut out = Vec::with_capacity(ptrs.len());
        let mut k = 0;
        while k < ptrs.len() {
            let mut n = 1;
            while k + n < ptrs.len()
                && n < READ_RUN_BLOCKS
                && ptrs[k + n].1.block == ptrs[k].1.block + n as u64
            {
                n += 1;
            }
            let off = self.geo.offset(ptrs[k].1.block);
            let mut buf = vec![0u8; n * DATA_BLOCK_BYTES as usize];
            self.sync.read_at(&mut buf, off)?;
            for (j, (i, p)) in ptrs[k..k + n].iter().enumerate() {
                let at = j * DATA_BLOCK_BYTES as usize;
                let b = buf[at..at + p.len as usize].to_vec();
                check_crc(&b, p, off + at as u64)?;
                out.push((*i, b));
            }
            k += n;
        }
        Ok(out)
    }

    fn delete(&self, aru: Option<AruId>, list: ListId, index: u64) -> LdResult<()> {
        let eng = self.eng(list)?;
        if !self.is_data(eng)? {
            return self.meta.delete(aru, eng, index).map_err(Self::user_err);
        }
        self.in_aru(aru, |a| {
            if let Some(p) = self.pointer(eng, index)? {
                self.meta.delete(Some(a), eng, index)?;
                self.free(a, p.block)?;
            }
            Ok(())
        })
    }

    fn delete_range(&self, aru: Option<AruId>, list: ListId, range: Range<u64>) -> LdResult<()> {
        let eng = self.eng(list)?;
        if !self.is_data(eng)? {
            return self
                .meta
                .delete_range(aru, eng, range)
                .map_err(Self::user_err);
        }
        self.in_aru(aru, |a| self.delete_data(a, eng, range))
    }

    fn indices(&self, list: ListId, from: u64, limit: usize) -> LdResult<Vec<u64>> {
        let eng = self.eng(list)?;
        self.meta.indices(eng, from, limit).map_err(Self::user_err)
    }

    fn lists(&self, from: u64, limit: usize) -> LdResult<Vec<ListId>> {
        let from = from.max(1).saturating_add(OWN_LISTS);
        Ok(self
            .meta
            .lists(from, limit)?
            .into_iter()
            .map(|l| ListId(l.0 - OWN_LISTS))
            .collect())
    }

    fn prefetch(&self, list: ListId) -> LdResult<()> {
        let eng = self.eng(list)?;
        self.meta.prefetch(eng).map_err(Self::user_err)
    }

    fn begin_aru(&self) -> LdResult<AruId> {
        let a = self.meta.begin_aru()?;
        self.lock().arus.insert(a.0, AruState::default());
        Ok(a)
    }

    fn end_aru(&self, aru: AruId) -> LdResult<()> {
        // The lock is held from the bitmap writes to the end, so no other
        // ARU ends in between (module doc, "Bitmaps follow ARUs").
        let mut st = self.lock();
        let a = st.arus.remove(&aru.0).ok_or(LdError::NoSuchAru(aru))?;
        let r = self
            .write_bitmaps(&st, aru, &a)
            .and_then(|()| self.meta.end_aru(aru));
        if let Err(e) = r {
            st.arus.insert(aru.0, a);
            return Err(e);
        }
        for (&b, &c) in &a.changes {
            match c {
                Change::Alloc => set_bit(&mut st.committed, b, true),
                Change::Free => {
                    set_bit(&mut st.committed, b, false);
                    st.freed.push(b);
                }
                Change::AllocFreed => st.freed.push(b),
            }
        }
        st.reserved -= a.reserved;
        Ok(())
    }

    fn abort_aru(&self, aru: AruId) -> LdResult<()> {
        // Old pointers come back before old bytes: no read in between.
        let _io = self.io.write().expect("io lock poisoned");
        self.meta.abort_aru(aru)?;
        let a = {
            let mut st = self.lock();
            let Some(a) = st.arus.remove(&aru.0) else {
                return Ok(());
            };
            for (&b, &c) in &a.changes {
                if c != Change::Free {
                    set_bit(&mut st.inuse, b, false);
                    st.group_free[self.geo.group_of(b) as usize] += 1;
                }
            }
            st.reserved -= a.reserved;
            // A list created by the aborted ARU is gone again, and its tie.
            st.kinds.clear();
            st.ties.clear();
            a
        };
        // Blocks overwritten in place get their old content back, so the
        // restored pointers' checksums match again.
        for (b, old) in a.undo {
            self.sync.write(old, self.geo.offset(b))?;
        }
        Ok(())
    }

    fn reserve(&self, aru: AruId, bytes: u64) -> LdResult<()> {
        let got = self.reserve_data(aru, bytes, true)?;
        if let Err(e) = self.meta.reserve(aru, bytes + self.bitmap_bytes(bytes)) {
            self.unreserve_data(aru, got);
            return Err(e);
        }
        Ok(())
    }

    fn reserve_freeing(&self, aru: AruId, bytes: u64) -> LdResult<()> {
        let got = self.reserve_data(aru, bytes, false)?;
        if let Err(e) = self
            .meta
            .reserve_freeing(aru, bytes + self.bitmap_bytes(bytes))
        {
            self.unreserve_data(aru, got);
            return Err(e);
        }
        Ok(())
    }

    fn flush(&self) -> LdResult<()> {
        // Overwrites in place may have changed no pointer: the data device
        // is flushed whether or not the log has anything to write.
        self.sync.sync()?;
        // The frees of ARUs ended by now: the log flush below covers them.
        let upto = {
            let st = self.lock();
            st.freed_released + st.freed.len() as u64
        };
        self.meta.flush()?;
        let mut guard = self.lock();
        let st = &mut *guard;
        // A flush running beside this one may have released some of them
        // already; what was freed after this one began is not its to
        // release (its log flush may not cover those ARUs' ends).
        let n = upto.saturating_sub(st.freed_released) as usize;
        st.freed_released += n as u64;
        if !self.discard {
            for b in st.freed.drain(..n) {
                set_bit(&mut st.inuse, b, false);
                st.group_free[self.geo.group_of(b) as usize] += 1;
            }
            return Ok(());
        }
        // `-o discard`: their freeing is durable now. They stay in use
        // (no one allocates them) while they are discarded with no lock
        // held, then become free. A discard is advice: a failure leaves
        // the blocks as they are.
        let mut released: Vec<u64> = st.freed.drain(..n).collect();
        drop(guard);
        released.sort_unstable();
        let mut runs: Vec<(u64, u64)> = Vec::new();
        for &b in &released {
            match runs.last_mut() {
                Some((s, l)) if *s + *l == b => *l += 1,
                _ => runs.push((b, 1)),
            }
        }
        let done = self.discard_runs(&runs).unwrap_or(0);
        let mut st = self.lock();
        for &(start, len) in &runs {
            self.hold(&mut st, start, len, false);
        }
        st.discarded_blocks += done;
        Ok(())
    }

    fn flush_list(&self, _list: ListId) -> LdResult<()> {
        self.flush()
    }

    fn space(&self) -> SpaceStats {
        // The file system spans both devices: the capacity is both; what
        // can still be written is the data device's free blocks (a full
        // metadata log shows as NoSpace when an operation reserves).
        let st = self.lock();
        let free: u64 = st.group_free.iter().map(|&f| f as u64).sum();
        let used = self.geo.blocks - free;
        let m = self.meta.space();
        SpaceStats {
            capacity_bytes: self.geo.blocks * DATA_BLOCK_BYTES + m.capacity_bytes,
            available_bytes: free.saturating_sub(st.reserved) * DATA_BLOCK_BYTES,
            live_bytes: used * DATA_BLOCK_BYTES + m.live_bytes,
        }
    }
}

#[cfg(test)]
mod tests;
