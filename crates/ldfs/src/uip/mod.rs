//! uip: an update-in-place Logical Disk, the baseline of both papers (UFS
//! on a regular disk in virtual-log-1999, MINIX in logical-disk-1993).
//!
//! Every block `(list, index)` gets a fixed home when first written: an
//! extent of `ceil(len / unit_bytes)` units, taken first-fit from just
//! after the list's previous allocation inside the list's group (groups are
//! the cylinder groups of FFS: a descriptor area beside its data units; a
//! list starts in the group of its `near` list, else the next group round
//! robin). A block is always written as its whole extent (UFS and MINIX
//! write whole buffers), so the same operation makes the same requests on
//! every device. A rewrite of the same size goes back to the same home;
//! metadata (the block's descriptor, a list record) is written
//! synchronously in place whenever it changes — on allocation, length
//! change, free. Nothing is buffered beyond an open ARU's held overwrites
//! (below): every write accepted outside an ARU, and every ARU once ended,
//! has reached the device when the call returns, so `flush` only passes
//! the device's flush on.
//!
//! What uip does NOT promise, as the update-in-place systems it stands for:
//! - ARUs are atomic for reads and aborts, not across crashes: a crash in
//!   the middle of an operation leaves the blocks it had written (UFS needs
//!   fsck for the same reason). Recovery keeps the newest descriptor (by
//!   `seq`) when a crash left two for a key or overlapping extents.
//! - Blocks carry no checksums (descriptors and list records do).
//! - An ARU's overwrite of a block of the same size in units, the first
//!   change the ARU makes to that key, is held in memory until the ARU
//!   ends and then written in place; reads see it at once, an abort drops
//!   it. So it costs no read of the old value, and its one device write
//!   comes at the end: the write an ARU of one fs operation makes anyway
//!   (issue 15: reading each old block back before overwriting it doubled
//!   the disk time of small random writes, VLD paper Figure 8). A change of
//!   another kind to a held key (a delete, a write of another size, another
//!   ARU's change) first settles it: dropped if the same ARU's, else
//!   written in place as its owner's change.
//! - Any other change of an ARU is written at once; an abort restores the
//!   values the ARU found (read back before its first change to each key,
//!   from a small cache or the device) by writing them in place; a later
//!   change by another ARU to the same key is overwritten (the fs runs one
//!   operation's ARU at a time per key). An `end_aru` failing on a device
//!   error may leave part of the ARU's held writes on the device, like a
//!   crash, and no abort can take them back: uip then refuses every change
//!   (`LdError::ReadOnly`) and reads what the device holds.
//! - `reserve` counts units, assuming blocks of at least half a unit;
//!   smaller blocks each take a whole unit.
//!
//! Invariants (asserted): a unit belongs to at most one extent; the free
//! count equals the units not in any extent; every list's blocks have a
//! descriptor naming them at their first unit.

pub mod layout;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::ops::Range;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::device::Device;
use crate::ld::{AruId, LdError, LdResult, ListHints, ListId, ListKind, LogicalDisk, SpaceStats};
use layout::{decode_list, encode_list, Desc, Geometry, DESC_BYTES, LIST_RECORD_BYTES};

/// Format and runtime choices.
#[derive(Clone, Copy, Debug)]
pub struct UipOptions {
    /// Allocation unit (UFS's fragment: 1 KiB).
    pub unit_bytes: u32,
    pub units_per_group: u32,
    pub max_block_bytes: usize,
    /// Bytes of recently read or written blocks kept for aborts' undo.
    pub cache_bytes: usize,
}

impl Default for UipOptions {
    fn default() -> Self {
        UipOptions {
            unit_bytes: 1024,
            units_per_group: 1024,
            max_block_bytes: 64 << 10,
            cache_bytes: 4 << 20,
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Home {
    unit: u32,
    len: u32,
}

struct ListInfo {
    hints: ListHints,
    blocks: BTreeMap<u64, Home>,
    /// Where the next allocation of this list starts looking.
    cursor: u32,
}

enum Undo {
    Block {
        list: u64,
        index: u64,
        old: Option<Vec<u8>>,
    },
    Created(u64),
    Deleted {
        list: u64,
        hints: ListHints,
        blocks: Vec<(u64, Vec<u8>)>,
    },
}

#[derive(Default)]
struct Aru {
    undo: Vec<Undo>,
    touched: HashSet<(u64, u64)>,
    /// Keys whose overwrite this ARU holds in `State::held` (some may have
    /// been settled since).
    held: BTreeSet<(u64, u64)>,
    reserved_units: u64,
}

struct State {
    lists: BTreeMap<u64, ListInfo>,
    descs: Vec<Desc>,
    used: Vec<bool>,
    free_units: u64,
    seq: u64,
    next_list: u64,
    next_group: u32,
    arus: HashMap<u64, Aru>,
    next_aru: u64,
    reserved_units: u64,
    cache: HashMap<(u64, u64), Vec<u8>>,
    cache_order: VecDeque<(u64, u64)>,
    cache_bytes: usize,
    /// Overwrites held until their ARU ends: key -> (ARU, bytes).
    held: HashMap<(u64, u64), (u64, Vec<u8>)>,
    /// Why uip refuses changes: an `end_aru` failed half way (`end_aru`).
    failed: Option<String>,
}

pub struct Uip {
    dev: Arc<dyn Device>,
    /// Descriptor writes are padded to this: the device's write unit, at
    /// most a unit — so a VLD with 4 KiB blocks under 4 KiB units never
    /// reads to merge. Blocks are written as whole extents (see `put`).
    write_unit: usize,
    geo: Geometry,
    opts: UipOptions,
    state: Mutex<State>,
}

const SECTOR: usize = 512;

impl Uip {
    /// Format `dev` and open it.
    pub fn create(dev: Arc<dyn Device>, opts: UipOptions) -> LdResult<Uip> {
        let size = dev.size_bytes();
        let geo =
            Geometry::for_size(size, opts.unit_bytes, opts.units_per_group).ok_or_else(|| {
                LdError::InvalidArgument(format!("device of {size} bytes too small for uip"))
            })?;
        // Zero the list table and every descriptor area, then the
        // superblock last: a half-formatted device does not open.
        let zeros = vec![0u8; 1 << 16];
        let zero = |mut off: u64, mut len: u64| -> LdResult<()> {
            while len > 0 {
                let n = len.min(zeros.len() as u64);
                dev.write_at(&zeros[..n as usize], off)?;
                off += n;
                len -= n;
            }
            Ok(())
        };
        zero(0, geo.first_group())?;
        for g in 0..geo.groups {
            zero(
                geo.desc_offset(g * geo.units_per_group),
                geo.desc_area_bytes(),
            )?;
        }
        dev.flush()?;
        dev.write_at(&geo.encode(), 0)?;
        dev.flush()?;
        Uip::open(dev, opts)
    }

    /// Open a formatted device: read the list table and every descriptor.
    pub fn open(dev: Arc<dyn Device>, opts: UipOptions) -> LdResult<Uip> {
        let mut sb = [0u8; layout::SUPER_BYTES];
        dev.read_at(&mut sb, 0)?;
        let geo = Geometry::decode(&sb, dev.size_bytes())?;
        let units = geo.units() as usize;
        let mut lists = BTreeMap::new();
        let mut table = vec![0u8; geo.list_slots as usize * LIST_RECORD_BYTES];
        dev.read_at(&mut table, geo.list_offset(0))?;
        let mut next_list = 1;
        for slot in 0..geo.list_slots {
            let o = slot as usize * LIST_RECORD_BYTES;
            let off = geo.list_offset(slot);
            if let Some((id, hints)) = decode_list(&table[o..o + LIST_RECORD_BYTES], off)? {
                if id.0 != u64::from(slot) + 1 {
                    return Err(corrupt(
                        "uip list record",
                        off,
                        format!("{id} in slot {slot}"),
                    ));
                }
                next_list = next_list.max(id.0 + 1);
                lists.insert(
                    id.0,
                    ListInfo {
                        hints,
                        blocks: BTreeMap::new(),
                        cursor: 0,
                    },
                );
            }
        }
        let mut found = Vec::new();
        let mut area = vec![0u8; geo.desc_area_bytes() as usize];
        for g in 0..geo.groups {
            let first = g * geo.units_per_group;
            dev.read_at(&mut area, geo.desc_offset(first))?;
            for i in 0..geo.units_per_group {
                let o = i as usize * DESC_BYTES;
                let u = first + i;
                if let Some(d) = Desc::decode(&area[o..o + DESC_BYTES], geo.desc_offset(u))? {
                    found.push((u, d));
                }
            }
        }
        // Newest first: an older descriptor for the same key or over the
        // same units is what a crash left behind.
        found.sort_by_key(|f| std::cmp::Reverse(f.1.seq));
        let mut descs = vec![Desc::default(); units];
        let mut used = vec![false; units];
        let mut seq = 0;
        let mut free_units = units as u64;
        for (u, d) in found {
            seq = seq.max(d.seq);
            let n = units_for(d.len, geo.unit_bytes);
            // Bounded by the group, not by `opts.max_block_bytes`: that is
            // a runtime limit on new writes, not recorded on the device.
            let fits = d.len > 0 && (u % geo.units_per_group) + n <= geo.units_per_group;
            let Some(list) = lists.get_mut(&d.list) else {
                continue; // its list was deleted and the crash kept the block
            };
            if !fits || list.blocks.contains_key(&d.index) || (u..u + n).any(|x| used[x as usize]) {
                continue;
            }
            for x in u..u + n {
                used[x as usize] = true;
            }
            free_units -= u64::from(n);
            descs[u as usize] = d;
            list.blocks.insert(
                d.index,
                Home {
                    unit: u,
                    len: d.len,
                },
            );
            list.cursor = u + n;
        }
        let state = State {
            lists,
            descs,
            used,
            free_units,
            seq,
            next_list,
            next_group: 0,
            arus: HashMap::new(),
            next_aru: 1,
            reserved_units: 0,
            cache: HashMap::new(),
            cache_order: VecDeque::new(),
            cache_bytes: 0,
            held: HashMap::new(),
            failed: None,
        };
        let w = dev.write_unit_bytes() as usize;
        let write_unit = if w > SECTOR && (geo.unit_bytes as usize).is_multiple_of(w) {
            w
        } else {
            SECTOR
        };
        Ok(Uip {
            dev,
            write_unit,
            geo,
            opts,
            state: Mutex::new(state),
        })
    }

    pub fn geometry(&self) -> Geometry {
        self.geo
    }

    /// Where `(list, index)` lives: its first unit's byte offset and length.
    pub fn home_of(&self, list: ListId, index: u64) -> Option<(u64, u32)> {
        let s = self.lock();
        let h = s.lists.get(&list.0)?.blocks.get(&index)?;
        Some((self.geo.unit_offset(h.unit), h.len))
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap()
    }

    /// Units kept back for freeing operations (deletes must work on a full
    /// device: a shrinking write or a new descriptor may need a unit).
    fn meta_reserve(&self) -> u64 {
        (u64::from(self.geo.units()) / 64).max(16)
    }

    fn check_aru(s: &State, aru: Option<AruId>) -> LdResult<()> {
        if let Some(why) = &s.failed {
            return Err(LdError::ReadOnly(why.clone()));
        }
        match aru {
            Some(a) if !s.arus.contains_key(&a.0) => Err(LdError::NoSuchAru(a)),
            _ => Ok(()),
        }
    }

    fn check_list(s: &State, list: ListId) -> LdResult<()> {
        if s.lists.contains_key(&list.0) {
            Ok(())
        } else {
            Err(LdError::NoSuchList(list))
        }
    }

    fn cache_put(&self, s: &mut State, key: (u64, u64), data: Option<&[u8]>) {
        if let Some(old) = s.cache.remove(&key) {
            s.cache_bytes -= old.len();
        }
        if let Some(d) = data {
            if d.len() > self.opts.cache_bytes {
                return;
            }
            s.cache_bytes += d.len();
            s.cache.insert(key, d.to_vec());
            s.cache_order.push_back(key);
            while s.cache_bytes > self.opts.cache_bytes {
                let Some(k) = s.cache_order.pop_front() else {
                    break;
                };
                if let Some(old) = s.cache.remove(&k) {
                    s.cache_bytes -= old.len();
                }
            }
        }
        if s.cache_order.len() > 4 * s.cache.len() + 64 {
            let live = &s.cache;
            let order: VecDeque<_> = s
                .cache_order
                .iter()
                .filter(|k| live.contains_key(k))
                .copied()
                .collect();
            s.cache_order = order;
        }
    }

    fn read_locked(&self, s: &mut State, list: u64, index: u64) -> LdResult<Option<Vec<u8>>> {
        if let Some((_, d)) = s.held.get(&(list, index)) {
            return Ok(Some(d.clone()));
        }
        self.read_stored(s, list, index)
    }

    /// What the device holds for `(list, index)` (through the cache),
    /// whatever an ARU holds for it.
    fn read_stored(&self, s: &mut State, list: u64, index: u64) -> LdResult<Option<Vec<u8>>> {
        let Some(h) = s
            .lists
            .get(&list)
            .and_then(|l| l.blocks.get(&index))
            .copied()
        else {
            return Ok(None);
        };
        if let Some(d) = s.cache.get(&(list, index)) {
            return Ok(Some(d.clone()));
        }
        let mut buf = vec![0u8; (h.len as usize).div_ceil(SECTOR) * SECTOR];
        self.dev.read_at(&mut buf, self.geo.unit_offset(h.unit))?;
        buf.truncate(h.len as usize);
        self.cache_put(s, (list, index), Some(&buf));
        Ok(Some(buf))
    }

    /// Write the sector (or device write unit, at most the descriptor
    /// area's alignment) of descriptors holding unit `u`'s, from memory.
    fn write_desc(&self, s: &State, u: u32) -> LdResult<()> {
        let chunk = self.write_unit.min(layout::ALIGN as usize);
        let per = (chunk / DESC_BYTES) as u32;
        let upg = self.geo.units_per_group;
        let group_first = u - u % upg;
        let first = u - (u % upg) % per;
        let end = (first + per).min(group_first + upg);
        let mut b = vec![0u8; chunk];
        for x in first..end {
            let o = (x - first) as usize * DESC_BYTES;
            b[o..o + DESC_BYTES].copy_from_slice(&s.descs[x as usize].encode());
        }
        self.dev.write_at(&b, self.geo.desc_offset(first))?;
        Ok(())
    }

    fn write_list_record(&self, id: u64, hints: Option<&ListHints>) -> LdResult<()> {
        let slot = (id - 1) as u32;
        let b = match hints {
            Some(h) => encode_list(ListId(id), h),
            None => [0u8; LIST_RECORD_BYTES],
        };
        // The record is 32 bytes of a sector: rewrite the whole sector from
        // what is on the device would cost a read; records are written
        // alone (the device merges partial sectors).
        self.dev.write_at(&b, self.geo.list_offset(slot))?;
        Ok(())
    }

    /// First fit of `n` free units inside one group, from `from` on,
    /// wrapping once around the device.
    fn allocate(&self, s: &State, from: u32, n: u32) -> Option<u32> {
        let units = self.geo.units();
        let upg = self.geo.units_per_group;
        if n == 0 || n > upg {
            return None;
        }
        let mut u = from % units;
        let mut scanned = 0u64;
        while scanned < u64::from(units) + u64::from(n) {
            let g_end = (u / upg + 1) * upg;
            if u + n > g_end {
                scanned += u64::from(g_end - u);
                u = g_end % units;
                continue;
            }
            match (u..u + n).find(|&x| s.used[x as usize]) {
                None => return Some(u),
                Some(busy) => {
                    scanned += u64::from(busy + 1 - u);
                    u = (busy + 1) % units;
                }
            }
        }
        None
    }

    /// Units an ARU may use now beyond its own reservation.
    fn available(&self, s: &State, aru: Option<AruId>, freeing: bool) -> u64 {
        let own = aru
            .and_then(|a| s.arus.get(&a.0))
            .map_or(0, |a| a.reserved_units);
        let others = s.reserved_units - own;
        let keep = if freeing { 0 } else { self.meta_reserve() };
        s.free_units.saturating_sub(others + keep)
    }

    fn note_undo_block(
        &self,
        s: &mut State,
        aru: Option<AruId>,
        list: u64,
        index: u64,
    ) -> LdResult<()> {
        let Some(a) = aru else {
            return Ok(());
        };
        if s.arus[&a.0].touched.contains(&(list, index)) {
            return Ok(());
        }
        let old = self.read_stored(s, list, index)?;
        let a = s.arus.get_mut(&a.0).expect("checked");
        a.touched.insert((list, index));
        a.undo.push(Undo::Block { list, index, old });
        Ok(())
    }

    /// Before a change by `by` (an ARU or none) to `key`: the overwrite an
    /// ARU holds for it is dropped if it is `by`'s own (the change
    /// supersedes it; the device still has what the ARU found), else
    /// written in place as its owner's change, with its undo.
    fn settle(&self, s: &mut State, key: (u64, u64), by: Option<AruId>) -> LdResult<()> {
        let Some((owner, data)) = s.held.remove(&key) else {
            return Ok(());
        };
        if by.map(|a| a.0) == Some(owner) {
            return Ok(());
        }
        let done = self
            .note_undo_block(s, Some(AruId(owner)), key.0, key.1)
            .and_then(|()| self.put(s, key.0, key.1, &data));
        if let Err(e) = done {
            s.held.insert(key, (owner, data));
            return Err(e);
        }
        Ok(())
    }

    /// Settles every held overwrite of `list` (see `settle`).
    fn settle_list(&self, s: &mut State, list: u64, by: Option<AruId>) -> LdResult<()> {
        let mut keys: Vec<(u64, u64)> = s.held.keys().filter(|k| k.0 == list).copied().collect();
        keys.sort_unstable();
        for k in keys {
            self.settle(s, k, by)?;
        }
        Ok(())
    }

    /// Put `data` at `(list, index)` in place, or at a new home when its
    /// size in units changed. No admission, no undo.
    fn put(&self, s: &mut State, list: u64, index: u64, data: &[u8]) -> LdResult<()> {
        let ub = self.geo.unit_bytes;
        let n = units_for(data.len() as u32, ub);
        let old = s.lists[&list].blocks.get(&index).copied();
        // The whole extent is written, as UFS writes a whole buffer (a 4 KB
        // inode block for one inode, `ufs_iupdat`) and MINIX a whole block:
        // the same request on every device. Units smaller than a VLD block
        // (1 KiB units on 4 KiB blocks) share one; the VLD reads and merges
        // the block within the same request (review 17).
        let mut padded = data.to_vec();
        padded.resize(n as usize * ub as usize, 0);
        match old {
            Some(h) if units_for(h.len, ub) == n => {
                self.dev.write_at(&padded, self.geo.unit_offset(h.unit))?;
                if h.len != data.len() as u32 {
                    s.seq += 1;
                    let seq = s.seq;
                    let d = &mut s.descs[h.unit as usize];
                    d.len = data.len() as u32;
                    d.seq = seq;
                    self.write_desc(s, h.unit)?;
                    s.lists
                        .get_mut(&list)
                        .unwrap()
                        .blocks
                        .get_mut(&index)
                        .unwrap()
                        .len = data.len() as u32;
                }
            }
            _ => {
                let cursor = s.lists[&list].cursor;
                let u = self.allocate(s, cursor, n).ok_or(LdError::NoSpace {
                    needed: u64::from(n) * u64::from(ub),
                    available: s.free_units * u64::from(ub),
                })?;
                self.dev.write_at(&padded, self.geo.unit_offset(u))?;
                for x in u..u + n {
                    assert!(!s.used[x as usize]);
                    s.used[x as usize] = true;
                }
                s.free_units -= u64::from(n);
                s.seq += 1;
                s.descs[u as usize] = Desc {
                    list,
                    index,
                    seq: s.seq,
                    len: data.len() as u32,
                };
                self.write_desc(s, u)?;
                let l = s.lists.get_mut(&list).unwrap();
                l.blocks.insert(
                    index,
                    Home {
                        unit: u,
                        len: data.len() as u32,
                    },
                );
                l.cursor = u + n;
                if let Some(h) = old {
                    self.release(s, h)?;
                }
            }
        }
        self.cache_put(s, (list, index), Some(data));
        Ok(())
    }

    /// Free a home: clear its descriptor on the device, then its units.
    fn release(&self, s: &mut State, h: Home) -> LdResult<()> {
        let n = units_for(h.len, self.geo.unit_bytes);
        s.descs[h.unit as usize] = Desc::default();
        self.write_desc(s, h.unit)?;
        for x in h.unit..h.unit + n {
            assert!(s.used[x as usize]);
            s.used[x as usize] = false;
        }
        s.free_units += u64::from(n);
        Ok(())
    }

    /// Remove `(list, index)`. No undo.
    fn remove(&self, s: &mut State, list: u64, index: u64) -> LdResult<()> {
        // (Only an abort removes a key another ARU may hold: that hold
        // goes with the block.)
        s.held.remove(&(list, index));
        let h = s.lists.get_mut(&list).and_then(|l| l.blocks.remove(&index));
        self.cache_put(s, (list, index), None);
        if let Some(h) = h {
            self.release(s, h)?;
        }
        Ok(())
    }

    fn new_list(&self, s: &mut State, id: u64, hints: ListHints) -> LdResult<()> {
        let upg = self.geo.units_per_group;
        let group = match hints.near.and_then(|n| s.lists.get(&n.0)) {
            Some(near) => near.cursor / upg,
            None if hints.kind == ListKind::Metadata => 0,
            None => {
                let g = s.next_group % self.geo.groups;
                s.next_group = s.next_group.wrapping_add(1);
                g
            }
        };
        self.write_list_record(id, Some(&hints))?;
        s.lists.insert(
            id,
            ListInfo {
                hints,
                blocks: BTreeMap::new(),
                cursor: group * upg,
            },
        );
        Ok(())
    }

    fn drop_list(&self, s: &mut State, id: u64) -> LdResult<()> {
        let indices: Vec<u64> = s.lists[&id].blocks.keys().copied().collect();
        for i in indices {
            self.remove(s, id, i)?;
        }
        self.write_list_record(id, None)?;
        s.lists.remove(&id);
        Ok(())
    }

    fn consume(&self, s: &mut State, aru: Option<AruId>, units: u64) {
        if let Some(a) = aru.and_then(|a| s.arus.get_mut(&a.0)) {
            let take = a.reserved_units.min(units);
            a.reserved_units -= take;
            s.reserved_units -= take;
        }
    }

    fn end(&self, s: &mut State, aru: AruId) -> LdResult<Aru> {
        let a = s.arus.remove(&aru.0).ok_or(LdError::NoSuchAru(aru))?;
        s.reserved_units -= a.reserved_units;
        Ok(a)
    }
}

fn units_for(len: u32, unit_bytes: u32) -> u32 {
    len.div_ceil(unit_bytes).max(1)
}

fn corrupt(what: &'static str, offset: u64, why: String) -> LdError {
    LdError::Corrupt(crate::ld::Corruption {
        what,
        offset,
        reason: crate::ld::CorruptReason::Inconsistent(why),
    })
}

impl LogicalDisk for Uip {
    fn max_block_bytes(&self) -> usize {
        self.opts.max_block_bytes
    }

    fn create_list(&self, aru: Option<AruId>, hints: ListHints) -> LdResult<ListId> {
        let mut s = self.lock();
        Self::check_aru(&s, aru)?;
        let id = if s.next_list <= u64::from(self.geo.list_slots) {
            s.next_list
        } else {
            // Ids ran out: reuse the lowest free slot.
            (1..=u64::from(self.geo.list_slots))
                .find(|i| !s.lists.contains_key(i))
                .ok_or(LdError::NoSpace {
                    needed: LIST_RECORD_BYTES as u64,
                    available: 0,
                })?
        };
        self.new_list(&mut s, id, hints)?;
        s.next_list = s.next_list.max(id + 1);
        if let Some(a) = aru {
            s.arus.get_mut(&a.0).unwrap().undo.push(Undo::Created(id));
        }
        Ok(ListId(id))
    }

    fn delete_list(&self, aru: Option<AruId>, list: ListId) -> LdResult<()> {
        let mut s = self.lock();
        Self::check_aru(&s, aru)?;
        Self::check_list(&s, list)?;
        self.settle_list(&mut s, list.0, aru)?;
        if let Some(a) = aru {
            let indices: Vec<u64> = s.lists[&list.0].blocks.keys().copied().collect();
            let mut blocks = Vec::with_capacity(indices.len());
            for i in indices {
                let d = self.read_locked(&mut s, list.0, i)?.expect("listed");
                blocks.push((i, d));
            }
            let hints = s.lists[&list.0].hints;
            s.arus.get_mut(&a.0).unwrap().undo.push(Undo::Deleted {
                list: list.0,
                hints,
                blocks,
            });
        }
        self.drop_list(&mut s, list.0)
    }

    fn list_hints(&self, list: ListId) -> LdResult<Option<ListHints>> {
        Ok(self.lock().lists.get(&list.0).map(|l| l.hints))
    }

    fn write(&self, aru: Option<AruId>, list: ListId, index: u64, data: &[u8]) -> LdResult<()> {
        let max = self.opts.max_block_bytes;
        if data.is_empty() || data.len() > max {
            return Err(LdError::BadBlockLength {
                len: data.len(),
                max,
            });
        }
        let mut s = self.lock();
        Self::check_aru(&s, aru)?;
        Self::check_list(&s, list)?;
        let ub = self.geo.unit_bytes;
        let n = u64::from(units_for(data.len() as u32, ub));
        let old = s.lists[&list.0]
            .blocks
            .get(&index)
            .map_or(0, |h| u64::from(units_for(h.len, ub)));
        // A new home is taken before the old one is freed.
        let peak = if old == n { 0 } else { n };
        let avail = self.available(&s, aru, false);
        if peak > avail {
            return Err(LdError::NoSpace {
                needed: peak * u64::from(ub),
                available: avail * u64::from(ub),
            });
        }
        self.settle(&mut s, (list.0, index), aru)?;
        if let Some(a) = aru {
            let key = (list.0, index);
            let first = !s.arus[&a.0].touched.contains(&key);
            if first && old == n {
                // Same home, first change of this ARU: hold it (module doc).
                s.held.insert(key, (a.0, data.to_vec()));
                s.arus.get_mut(&a.0).expect("checked").held.insert(key);
                return Ok(());
            }
        }
        self.note_undo_block(&mut s, aru, list.0, index)?;
        self.put(&mut s, list.0, index, data)?;
        self.consume(&mut s, aru, n.saturating_sub(old));
        Ok(())
    }

    fn read(&self, list: ListId, index: u64) -> LdResult<Option<Vec<u8>>> {
        let mut s = self.lock();
        Self::check_list(&s, list)?;
        self.read_locked(&mut s, list.0, index)
    }

    fn delete(&self, aru: Option<AruId>, list: ListId, index: u64) -> LdResult<()> {
        let mut s = self.lock();
        Self::check_aru(&s, aru)?;
        Self::check_list(&s, list)?;
        if !s.lists[&list.0].blocks.contains_key(&index) {
            return Ok(());
        }
        self.settle(&mut s, (list.0, index), aru)?;
        self.note_undo_block(&mut s, aru, list.0, index)?;
        self.remove(&mut s, list.0, index)
    }

    fn delete_range(&self, aru: Option<AruId>, list: ListId, range: Range<u64>) -> LdResult<()> {
        let mut s = self.lock();
        Self::check_aru(&s, aru)?;
        Self::check_list(&s, list)?;
        if range.start >= range.end {
            return Ok(());
        }
        let indices: Vec<u64> = s.lists[&list.0]
            .blocks
            .range(range)
            .map(|(&i, _)| i)
            .collect();
        for i in indices {
            self.settle(&mut s, (list.0, i), aru)?;
            self.note_undo_block(&mut s, aru, list.0, i)?;
            self.remove(&mut s, list.0, i)?;
        }
        Ok(())
    }

    fn indices(&self, list: ListId, from: u64, limit: usize) -> LdResult<Vec<u64>> {
        let s = self.lock();
        let l = s.lists.get(&list.0).ok_or(LdError::NoSuchList(list))?;
        Ok(l.blocks
            .range(from..)
            .take(limit)
            .map(|(&i, _)| i)
            .collect())
    }

    fn lists(&self, from: u64, limit: usize) -> LdResult<Vec<ListId>> {
        let s = self.lock();
        Ok(s.lists
            .range(from..)
            .take(limit)
            .map(|(&i, _)| ListId(i))
            .collect())
    }

    fn prefetch(&self, _list: ListId) -> LdResult<()> {
        Ok(())
    }

    fn begin_aru(&self) -> LdResult<AruId> {
        let mut s = self.lock();
        let id = s.next_aru;
        s.next_aru += 1;
        s.arus.insert(id, Aru::default());
        Ok(AruId(id))
    }

    fn end_aru(&self, aru: AruId) -> LdResult<()> {
        let mut s = self.lock();
        Self::check_aru(&s, Some(aru))?;
        // The held overwrites reach their homes, in device order.
        let mut keys: Vec<((u64, u64), u32)> = s.arus[&aru.0]
            .held
            .iter()
            .filter(|k| s.held.get(k).is_some_and(|(o, _)| *o == aru.0))
            .map(|k| {
                let home = s.lists.get(&k.0).and_then(|l| l.blocks.get(&k.1));
                (
                    *k,
                    home.expect("a held key has its block (remove drops the hold)")
                        .unit,
                )
            })
            .collect();
        keys.sort_unstable_by_key(|(_, u)| *u);
        for (key, _) in keys {
            let (_, data) = s.held.remove(&key).expect("held by this ARU");
            if let Err(e) = self.put(&mut s, key.0, key.1, &data) {
                // Held writes have no undo: some of this ARU's may be on the
                // device now, and no abort can take them back. Stop changing
                // anything (as a crash would), and read what the device
                // holds: the ARU's other holds go, and so does the cache (a
                // block may have landed without its descriptor).
                s.failed = Some(format!(
                    "uip is read-only: a device write failed while an ARU ended ({e}); \
                     part of it may be on the device"
                ));
                s.held.retain(|_, (o, _)| *o != aru.0);
                s.cache.clear();
                s.cache_order.clear();
                s.cache_bytes = 0;
                return Err(e);
            }
        }
        self.end(&mut s, aru).map(|_| ())
    }

    fn abort_aru(&self, aru: AruId) -> LdResult<()> {
        let mut s = self.lock();
        Self::check_aru(&s, Some(aru))?;
        let a = self.end(&mut s, aru)?;
        for key in &a.held {
            if s.held.get(key).is_some_and(|(o, _)| *o == aru.0) {
                s.held.remove(key);
            }
        }
        for u in a.undo.into_iter().rev() {
            match u {
                Undo::Block { list, index, old } => {
                    if !s.lists.contains_key(&list) {
                        continue;
                    }
                    match old {
                        Some(d) => self.put(&mut s, list, index, &d)?,
                        None => self.remove(&mut s, list, index)?,
                    }
                }
                Undo::Created(list) => {
                    if s.lists.contains_key(&list) {
                        self.drop_list(&mut s, list)?;
                    }
                }
                Undo::Deleted {
                    list,
                    hints,
                    blocks,
                } => {
                    if s.lists.contains_key(&list) {
                        continue;
                    }
                    self.new_list(&mut s, list, hints)?;
                    for (i, d) in blocks {
                        self.put(&mut s, list, i, &d)?;
                    }
                }
            }
        }
        Ok(())
    }

    fn reserve(&self, aru: AruId, bytes: u64) -> LdResult<()> {
        self.reserve_units(aru, bytes, false)
    }

    fn reserve_freeing(&self, aru: AruId, bytes: u64) -> LdResult<()> {
        self.reserve_units(aru, bytes, true)
    }

    fn flush(&self) -> LdResult<()> {
        self.dev.flush()?;
        Ok(())
    }

    fn flush_list(&self, _list: ListId) -> LdResult<()> {
        self.flush()
    }

    fn space(&self) -> SpaceStats {
        let s = self.lock();
        let ub = u64::from(self.geo.unit_bytes);
        let total = u64::from(self.geo.units());
        let capacity = total.saturating_sub(self.meta_reserve());
        let used = total - s.free_units;
        SpaceStats {
            capacity_bytes: capacity * ub,
            available_bytes: capacity.saturating_sub(used + s.reserved_units) * ub,
            live_bytes: used * ub,
        }
    }
}

impl Uip {
    fn reserve_units(&self, aru: AruId, bytes: u64, freeing: bool) -> LdResult<()> {
        let mut s = self.lock();
        Self::check_aru(&s, Some(aru))?;
        let ub = u64::from(self.geo.unit_bytes);
        // Blocks of at least half a unit: each takes at most twice its bytes.
        let units = (2 * bytes).div_ceil(ub);
        let avail = self.available(&s, None, freeing);
        if units > avail {
            return Err(LdError::NoSpace {
                needed: units * ub,
                available: avail * ub,
            });
        }
        s.arus.get_mut(&aru.0).unwrap().reserved_units += units;
        s.reserved_units += units;
        Ok(())
    }
}

#[cfg(test)]
mod tests;
