//! The block-number map: `(list, index) -> MapEntry` as a persistent, paged,
//! copy-on-write B+tree (docs/FORMAT.md, "Map page").
//!
//! Nodes live in an arena and are named by `u32` ids. Internal nodes are
//! always resident (about one per 127 leaves); a leaf's entries are resident
//! only while used and are dropped again by a CLOCK sweep once the map's
//! memory (`memory_bytes`: nodes, indexes and resident leaves) exceeds the
//! budget. Only clean leaves are dropped: their
//! page on disk holds exactly their entries and is re-read on demand.
//!
//! Invariants (checked by the tests' `check`):
//! - every internal entry's key is exactly the smallest key of its child's
//!   subtree, and every key of a subtree is below the next sibling's key;
//! - no node is empty; every leaf is at depth `height - 1`;
//! - a dirty node's ancestors are dirty; a dirty node has no on-disk page
//!   (the one it had went to the obsolete list when it was dirtied); a clean
//!   node has one, and `pages` maps its address to the node;
//! - a dirty leaf is resident.
//!
//! Splits of a full node are "append style" when the new key (or child)
//! goes past the node's last one: the node stays full and the newcomer
//! starts a new node, so sequential inserts fill leaves completely. An
//! append to a list whose last key is followed, in the same node, by keys
//! of later lists splits right after the new key (so several lists
//! appended at once fill their leaves too). Other splits halve the node.
//! A node below a quarter full is merged with an adjacent sibling when both
//! fit in half a node; a root with one child is collapsed.
//!
//! `remove_range` reads everything it needs first and only then changes the
//! tree, so a read error leaves the map as it was.

use std::collections::VecDeque;
use std::mem::size_of;

use rustc_hash::{FxHashMap, FxHashSet};

use super::codec::{get_u32, get_u64, put_u32, put_u64};
use super::types::{entry_flags, Key, MapEntry, PagePtr, PAGE_BYTES};
use crate::ld::{CorruptReason, Corruption, LdError, LdResult};

/// Entries of a full leaf page.
pub const LEAF_CAPACITY: usize = 127;
/// Children of a full internal page.
pub const INTERNAL_CAPACITY: usize = 145;

/// `LDMP`
pub const MAP_MAGIC: [u8; 4] = *b"LDMP";

const P_MAGIC: usize = 0;
const P_LEVEL: usize = 4;
const P_ZERO: usize = 5;
const P_COUNT: usize = 6;
const P_FS_ID: usize = 8;
const P_ENTRIES: usize = 16;

const LEAF_ENTRY_BYTES: usize = 32;
const INTERNAL_ENTRY_BYTES: usize = 28;
const LEN_MASK: u32 = 0xFF_FFFF;

const _: () = assert!(P_ENTRIES + LEAF_CAPACITY * LEAF_ENTRY_BYTES <= PAGE_BYTES);
const _: () = assert!(P_ENTRIES + (LEAF_CAPACITY + 1) * LEAF_ENTRY_BYTES > PAGE_BYTES);
const _: () = assert!(P_ENTRIES + INTERNAL_CAPACITY * INTERNAL_ENTRY_BYTES <= PAGE_BYTES);
const _: () = assert!(P_ENTRIES + (INTERNAL_CAPACITY + 1) * INTERNAL_ENTRY_BYTES > PAGE_BYTES);

/// Tallest tree accepted from disk (a tree of 2^64 entries is far lower).
const MAX_HEIGHT: u8 = 32;

/// A node with fewer entries than this tries to merge with a sibling...
const LEAF_MIN: usize = LEAF_CAPACITY / 4;
const INTERNAL_MIN: usize = INTERNAL_CAPACITY / 4;
/// ...when both together hold at most this many.
const LEAF_MERGE_MAX: usize = LEAF_CAPACITY / 2;
const INTERNAL_MERGE_MAX: usize = INTERNAL_CAPACITY / 2;

/// Memory of one resident entry, and what an allocation costs besides.
const ENTRY_MEM: usize = size_of::<(Key, MapEntry)>();
const ALLOC_OVERHEAD: usize = 16;
/// Internal nodes' child vectors hold one extra child while splitting.
const INTERNAL_VEC_CAP: usize = INTERNAL_CAPACITY + 1;

/// Reads one 4096-byte page at `ptr.addr` and checks it against `ptr.crc`;
/// a mismatch is `LdError::Corrupt` (what: "map page", BadChecksum).
/// Implemented by the engine.
pub trait PageReader {
    fn read_page(&self, ptr: PagePtr) -> LdResult<Vec<u8>>;
}

/// Where a map tree is on disk, as a checkpoint records it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapRoot {
    pub ptr: PagePtr,
    /// Levels of the tree: 1 = the root is a leaf.
    pub height: u8,
    /// Entries in the tree.
    pub entries: u64,
}

type NodeId = u32;
const NONE: NodeId = u32::MAX;
type LeafData = Vec<(Key, MapEntry)>;

enum Kind {
    /// Entries, or `None` while evicted (then the node is clean).
    Leaf(Option<LeafData>),
    /// `(smallest key of the child's subtree, child)`, ascending.
    Internal(Vec<(Key, NodeId)>),
    /// On the free list.
    Free,
}

struct Node {
    kind: Kind,
    /// The page holding this node's current contents; `None` while dirty.
    ptr: Option<PagePtr>,
    parent: NodeId,
    dirty: bool,
    /// CLOCK's referenced bit (leaves).
    referenced: bool,
}

/// Key bounds of a subtree: `lo` its exact smallest key (the parent's key
/// for it), `hi` the next sibling's key; `None` = unbounded.
#[derive(Clone, Copy, Debug)]
struct Bounds {
    lo: Option<Key>,
    hi: Option<Key>,
}

impl Bounds {
    const ALL: Bounds = Bounds { lo: None, hi: None };

    fn child(children: &[(Key, NodeId)], i: usize, hi: Option<Key>) -> Bounds {
        Bounds {
            lo: Some(children[i].0),
            hi: children.get(i + 1).map(|c| c.0).or(hi),
        }
    }

    /// Whether every key the subtree may hold is in `from..to`.
    fn within(&self, from: Key, to: Key) -> bool {
        self.lo.is_some_and(|lo| lo >= from) && self.hi.is_some_and(|hi| hi <= to)
    }
}

/// A decoded page.
#[derive(Debug, PartialEq, Eq)]
enum Page {
    Leaf(LeafData),
    Internal(Vec<(Key, PagePtr)>),
}

impl Page {
    fn first_last(&self) -> (Key, Key) {
        match self {
            Page::Leaf(d) => (d[0].0, d[d.len() - 1].0),
            Page::Internal(c) => (c[0].0, c[c.len() - 1].0),
        }
    }
}

/// Nodes `Map::pages_to_dirty` has counted already.
#[derive(Default)]
pub struct DirtySet(FxHashSet<NodeId>);

/// The persistent block-number map.
pub struct Map {
    fs_id: u64,
    budget: usize,
    nodes: Vec<Node>,
    free: Vec<NodeId>,
    /// `NONE` when the map is empty.
    root: NodeId,
    height: u8,
    entries: u64,
    last_root: Option<MapRoot>,
    /// Address of every on-disk page the tree references -> its node.
    pages: FxHashMap<u64, NodeId>,
    obsolete: Vec<PagePtr>,
    /// CLOCK queue of leaves that were clean and resident when queued;
    /// `in_clock[id]` says whether `id` is queued (stale ids are skipped).
    clock: VecDeque<NodeId>,
    in_clock: Vec<bool>,
    live_nodes: usize,
    internal_nodes: usize,
    dirty_nodes: usize,
    /// Nodes made dirty since the last `write_dirty`, counting those freed
    /// since (`dirtied_pages`).
    dirtied_nodes: usize,
    /// Bytes of resident leaf entries (see `leaf_mem`).
    resident_bytes: usize,
}

fn leaf_mem(capacity: usize) -> usize {
    capacity * ENTRY_MEM + ALLOC_OVERHEAD
}

fn corrupt(addr: u64, reason: CorruptReason) -> Corruption {
    Corruption {
        what: "map page",
        offset: addr,
        reason,
    }
}

impl Map {
    /// An empty map. `budget_bytes` bounds `memory_bytes()` as far as
    /// evicting clean leaves can (see `evict`).
    pub fn new(fs_id: u64, budget_bytes: usize) -> Map {
        Map {
            fs_id,
            budget: budget_bytes,
            nodes: Vec::new(),
            free: Vec::new(),
            root: NONE,
            height: 0,
            entries: 0,
            last_root: None,
            pages: FxHashMap::default(),
            obsolete: Vec::new(),
            clock: VecDeque::new(),
            in_clock: Vec::new(),
            live_nodes: 0,
            internal_nodes: 0,
            dirty_nodes: 0,
            dirtied_nodes: 0,
            resident_bytes: 0,
        }
    }

    /// A map whose tree is on disk at `root` (None = empty). Reads and keeps
    /// resident every internal node; leaves are loaded on first access.
    pub fn open(
        fs_id: u64,
        budget_bytes: usize,
        root: Option<MapRoot>,
        r: &dyn PageReader,
    ) -> LdResult<Map> {
        let mut m = Map::new(fs_id, budget_bytes);
        let Some(root) = root else {
            return Ok(m);
        };
        let bad = |reason| LdError::Corrupt(corrupt(root.ptr.addr, reason));
        if root.height == 0 || root.height > MAX_HEIGHT {
            return Err(bad(CorruptReason::OutOfBounds {
                field: "map height",
                value: root.height as u64,
                limit: MAX_HEIGHT as u64,
            }));
        }
        if root.entries == 0 {
            return Err(bad(CorruptReason::Inconsistent(
                "a map tree with 0 entries".into(),
            )));
        }
        m.root = m.open_node(root.ptr, root.height - 1, Bounds::ALL, NONE, r)?;
        m.height = root.height;
        m.entries = root.entries;
        m.last_root = Some(root);
        Ok(m)
    }

    fn open_node(
        &mut self,
        ptr: PagePtr,
        level: u8,
        b: Bounds,
        parent: NodeId,
        r: &dyn PageReader,
    ) -> LdResult<NodeId> {
        if self.pages.contains_key(&ptr.addr) {
            return Err(corrupt(
                ptr.addr,
                CorruptReason::Inconsistent("page referenced twice in the map tree".into()),
            )
            .into());
        }
        if level == 0 {
            return Ok(self.alloc(Kind::Leaf(None), parent, Some(ptr)));
        }
        let Page::Internal(children) = self.read_node(ptr, level, b, r)? else {
            unreachable!("decode_page returns internal pages for level > 0");
        };
        let id = self.alloc(
            Kind::Internal(Vec::with_capacity(INTERNAL_VEC_CAP)),
            parent,
            Some(ptr),
        );
        for i in 0..children.len() {
            let cb = Bounds {
                lo: Some(children[i].0),
                hi: children.get(i + 1).map(|c| c.0).or(b.hi),
            };
            let child = self.open_node(children[i].1, level - 1, cb, id, r)?;
            self.internal_mut(id).push((children[i].0, child));
        }
        Ok(id)
    }

    /// Number of entries.
    pub fn len(&self) -> u64 {
        self.entries
    }

    pub fn is_empty(&self) -> bool {
        self.entries == 0
    }

    pub fn get(&mut self, key: Key, r: &dyn PageReader) -> LdResult<Option<MapEntry>> {
        if self.root == NONE {
            return Ok(None);
        }
        let leaf = self.find_leaf(key);
        self.load_leaf(leaf, r)?;
        let d = self.leaf(leaf);
        let found = d.binary_search_by(|x| x.0.cmp(&key)).ok().map(|i| d[i].1);
        self.maybe_evict();
        Ok(found)
    }

    /// Insert or replace; returns the previous entry.
    pub fn insert(
        &mut self,
        key: Key,
        e: MapEntry,
        r: &dyn PageReader,
    ) -> LdResult<Option<MapEntry>> {
        if self.root == NONE {
            let mut d = Vec::with_capacity(LEAF_CAPACITY);
            d.push((key, e));
            self.root = self.alloc(Kind::Leaf(Some(d)), NONE, None);
            self.height = 1;
            self.entries = 1;
            return Ok(None);
        }
        let leaf = self.find_leaf(key);
        self.load_leaf(leaf, r)?;
        let old = match self.leaf(leaf).binary_search_by(|x| x.0.cmp(&key)) {
            Ok(i) => {
                let old = self.leaf(leaf)[i].1;
                if old != e {
                    self.leaf_mut(leaf)[i].1 = e;
                    self.mark_dirty(leaf);
                }
                Some(old)
            }
            Err(pos) => {
                self.mark_dirty(leaf);
                self.entries += 1;
                if self.leaf(leaf).len() < LEAF_CAPACITY {
                    self.leaf_insert(leaf, pos, (key, e));
                    if pos == 0 {
                        self.propagate_first_key(leaf);
                    }
                } else {
                    self.split_leaf(leaf, pos, (key, e));
                }
                None
            }
        };
        self.maybe_evict();
        Ok(old)
    }

    pub fn remove(&mut self, key: Key, r: &dyn PageReader) -> LdResult<Option<MapEntry>> {
        if self.root == NONE {
            return Ok(None);
        }
        let leaf = self.find_leaf(key);
        self.load_leaf(leaf, r)?;
        let Ok(i) = self.leaf(leaf).binary_search_by(|x| x.0.cmp(&key)) else {
            self.maybe_evict();
            return Ok(None);
        };
        self.mark_dirty(leaf);
        let (_, old) = self.leaf_mut(leaf).remove(i);
        self.entries -= 1;
        if i == 0 && !self.leaf(leaf).is_empty() {
            self.propagate_first_key(leaf);
        }
        self.rebalance(leaf, r);
        self.maybe_evict();
        Ok(Some(old))
    }

    /// Replace the entry for `key` with `new` only if it currently equals
    /// `expected`; returns whether it did.
    pub fn replace_if(
        &mut self,
        key: Key,
        expected: &MapEntry,
        new: MapEntry,
        r: &dyn PageReader,
    ) -> LdResult<bool> {
        if self.root == NONE {
            return Ok(false);
        }
        let leaf = self.find_leaf(key);
        self.load_leaf(leaf, r)?;
        let done = match self.leaf(leaf).binary_search_by(|x| x.0.cmp(&key)) {
            Ok(i) if self.leaf(leaf)[i].1 == *expected => {
                if new != *expected {
                    self.leaf_mut(leaf)[i].1 = new;
                    self.mark_dirty(leaf);
                }
                true
            }
            _ => false,
        };
        self.maybe_evict();
        Ok(done)
    }

    /// Calls `f` for entries with `from <= key < to` in ascending order
    /// until `f` returns false.
    pub fn range(
        &mut self,
        from: Key,
        to: Key,
        r: &dyn PageReader,
        f: &mut dyn FnMut(Key, &MapEntry) -> bool,
    ) -> LdResult<()> {
        if from < to && self.root != NONE {
            self.range_in(self.root, from, to, r, f)?;
        }
        self.maybe_evict();
        Ok(())
    }

    /// Returns false once the walk is to stop.
    fn range_in(
        &mut self,
        id: NodeId,
        from: Key,
        to: Key,
        r: &dyn PageReader,
        f: &mut dyn FnMut(Key, &MapEntry) -> bool,
    ) -> LdResult<bool> {
        if let Kind::Internal(ch) = &self.node(id).kind {
            let start = ch.partition_point(|c| c.0 <= from).saturating_sub(1);
            let end = ch.partition_point(|c| c.0 < to);
            let kids: Vec<NodeId> = ch[start..end.max(start)].iter().map(|c| c.1).collect();
            for c in kids {
                if !self.range_in(c, from, to, r, f)? {
                    return Ok(false);
                }
            }
            return Ok(true);
        }
        self.load_leaf(id, r)?;
        let d = self.leaf(id);
        let a = d.partition_point(|x| x.0 < from);
        for (k, e) in &d[a..] {
            if *k >= to || !f(*k, e) {
                return Ok(false);
            }
        }
        self.maybe_evict();
        Ok(true)
    }

    /// Removes every entry with `from <= key < to`; returns them in
    /// ascending order. Whole subtrees inside the range are dropped at once
    /// (their leaves are read but not made resident); only the leaves on
    /// the range's two edges are modified in place.
    pub fn remove_range(
        &mut self,
        from: Key,
        to: Key,
        r: &dyn PageReader,
    ) -> LdResult<Vec<(Key, MapEntry)>> {
        let mut out = Vec::new();
        if from >= to || self.root == NONE {
            return Ok(out);
        }
        // Phase 1 does all the reading, so that a read error leaves the map
        // unchanged; phase 2 cannot fail.
        self.collect_range(self.root, Bounds::ALL, from, to, r, &mut out)?;
        if !out.is_empty() {
            let (first, _) = self.apply_remove(self.root, Bounds::ALL, from, to);
            if first.is_none() {
                self.root = NONE;
                self.height = 0;
            }
            self.entries -= out.len() as u64;
            for k in [from, to] {
                if self.root != NONE {
                    let leaf = self.find_leaf(k);
                    self.rebalance(leaf, r);
                }
            }
        }
        self.maybe_evict();
        Ok(out)
    }

    fn collect_range(
        &mut self,
        id: NodeId,
        b: Bounds,
        from: Key,
        to: Key,
        r: &dyn PageReader,
        out: &mut Vec<(Key, MapEntry)>,
    ) -> LdResult<()> {
        if let Kind::Internal(ch) = &self.node(id).kind {
            let start = ch.partition_point(|c| c.0 <= from).saturating_sub(1);
            let end = ch.partition_point(|c| c.0 < to);
            let kids: Vec<(NodeId, Bounds)> = (start..end.max(start))
                .map(|i| (ch[i].1, Bounds::child(ch, i, b.hi)))
                .collect();
            for (c, cb) in kids {
                if cb.within(from, to) {
                    self.collect_all(c, cb, r, out)?;
                } else {
                    self.collect_range(c, cb, from, to, r, out)?;
                }
            }
            return Ok(());
        }
        // A leaf on an edge of the range: phase 2 trims it, so load it.
        self.load_leaf_bounded(id, b, r)?;
        let d = self.leaf(id);
        let a = d.partition_point(|x| x.0 < from);
        let z = d.partition_point(|x| x.0 < to);
        out.extend_from_slice(&d[a..z]);
        Ok(())
    }

    fn collect_all(
        &self,
        id: NodeId,
        b: Bounds,
        r: &dyn PageReader,
        out: &mut Vec<(Key, MapEntry)>,
    ) -> LdResult<()> {
        let n = self.node(id);
        match &n.kind {
            Kind::Internal(ch) => {
                for i in 0..ch.len() {
                    self.collect_all(ch[i].1, Bounds::child(ch, i, b.hi), r, out)?;
                }
            }
            Kind::Leaf(Some(d)) => out.extend_from_slice(d),
            Kind::Leaf(None) => {
                let ptr = n.ptr.expect("an evicted leaf is clean");
                let Page::Leaf(d) = self.read_node(ptr, 0, b, r)? else {
                    unreachable!("decode_page returns leaves for level 0");
                };
                out.extend(d);
            }
            Kind::Free => unreachable!("free node {id} in the tree"),
        }
        Ok(())
    }

    /// Phase 2 of `remove_range`: returns the subtree's new smallest key
    /// (`None`: the node was freed) and whether anything changed.
    fn apply_remove(&mut self, id: NodeId, b: Bounds, from: Key, to: Key) -> (Option<Key>, bool) {
        if let Kind::Internal(ch) = &self.node(id).kind {
            let start = ch.partition_point(|c| c.0 <= from).saturating_sub(1);
            let end = ch.partition_point(|c| c.0 < to);
            let kids: Vec<(usize, NodeId, Bounds)> = (start..end.max(start))
                .map(|i| (i, ch[i].1, Bounds::child(ch, i, b.hi)))
                .collect();
            let mut changes: Vec<(usize, Option<Key>)> = Vec::new();
            for (i, c, cb) in kids {
                if cb.within(from, to) {
                    self.free_subtree(c);
                    changes.push((i, None));
                } else {
                    let (first, changed) = self.apply_remove(c, cb, from, to);
                    if changed {
                        changes.push((i, first));
                    }
                }
            }
            if changes.is_empty() {
                return (Some(self.internal(id)[0].0), false);
            }
            self.mark_dirty(id);
            let ch = self.internal_mut(id);
            for &(i, first) in changes.iter().rev() {
                match first {
                    Some(k) => ch[i].0 = k,
                    None => {
                        ch.remove(i);
                    }
                }
            }
            if ch.is_empty() {
                self.free_node(id);
                return (None, true);
            }
            return (Some(ch[0].0), true);
        }
        let d = self.leaf_mut(id);
        let a = d.partition_point(|x| x.0 < from);
        let z = d.partition_point(|x| x.0 < to);
        if a == z {
            return (Some(d[0].0), false);
        }
        d.drain(a..z);
        if d.is_empty() {
            self.free_node(id);
            return (None, true);
        }
        let first = d[0].0;
        self.mark_dirty(id);
        (Some(first), true)
    }

    fn free_subtree(&mut self, id: NodeId) {
        if let Kind::Internal(ch) = &mut self.node_mut(id).kind {
            let ch = std::mem::take(ch);
            for (_, c) in ch {
                self.free_subtree(c);
            }
        }
        self.free_node(id);
    }

    /// Number of dirty nodes: exactly the pages write_dirty would place now.
    /// It can be 0 while the root still changes: when the map was emptied,
    /// or removals collapsed the root onto a clean child.
    pub fn dirty_pages(&self) -> usize {
        self.dirty_nodes
    }

    /// Nodes made dirty since the last `write_dirty`, including those freed
    /// again (by merges and removals) since: never more than `dirty_pages`
    /// falls short of it. A roll-forward of the same changes (less those of
    /// unfinished ARUs) starts from the tree the last checkpoint wrote and
    /// dirties about the same nodes, but frees fewer when it skips an
    /// unfinished ARU's removals: this, not `dirty_pages`, bounds what the
    /// checkpoint ending a recovery must write (the engine keeps room for it).
    pub fn dirtied_pages(&self) -> usize {
        self.dirtied_nodes
    }

    /// Most nodes one `insert`, `remove`, `replace_if`, `remove_range` or
    /// `mark_page_dirty` can newly dirty: the path to the root (`height`),
    /// a new node per level and a new root when splits cascade, and for a
    /// range the paths to both of its edges and a merged sibling per level
    /// at each edge. So `4 * (height + 1)`: loose, but the engine only keeps
    /// room for it during one operation.
    pub fn change_bound(&self) -> usize {
        4 * (self.height as usize + 1)
    }

    /// Leaves whose key range meets `from..to` (an edge leaf may hold no key
    /// of it), counted from the internal nodes, which are resident: no leaf
    /// is read.
    pub fn leaves_in_range(&self, from: Key, to: Key) -> usize {
        if from >= to || self.root == NONE {
            return 0;
        }
        self.count_leaves(self.root, from, to)
    }

    fn count_leaves(&self, id: NodeId, from: Key, to: Key) -> usize {
        match &self.node(id).kind {
            Kind::Internal(ch) => {
                let start = ch.partition_point(|c| c.0 <= from).saturating_sub(1);
                let end = ch.partition_point(|c| c.0 < to);
                (start..end.max(start))
                    .map(|i| self.count_leaves(ch[i].1, from, to))
                    .sum()
            }
            _ => 1,
        }
    }

    /// Total pages of the tree (resident or not).
    pub fn total_pages(&self) -> usize {
        self.live_nodes
    }

    /// Levels of the tree: the pages on a leaf's path.
    pub fn height(&self) -> usize {
        self.height as usize
    }

    /// Pages of the tree that are clean (on disk as they are): what more
    /// changes could still dirty.
    pub fn clean_pages(&self) -> usize {
        self.live_nodes - self.dirty_nodes
    }

    /// Internal pages of the tree.
    pub fn internal_pages(&self) -> usize {
        self.internal_nodes
    }

    /// Approximate bytes of memory held by the map.
    pub fn memory_bytes(&self) -> usize {
        size_of::<Map>()
            + self.nodes.capacity() * size_of::<Node>()
            + self.in_clock.capacity()
            + self.free.capacity() * size_of::<NodeId>()
            + self.clock.capacity() * size_of::<NodeId>()
            + self.internal_nodes * (INTERNAL_VEC_CAP * size_of::<(Key, NodeId)>() + ALLOC_OVERHEAD)
            + self.resident_bytes
            + self.pages.capacity() * (size_of::<(u64, NodeId)>() + 1)
            + self.obsolete.capacity() * size_of::<PagePtr>()
    }

    /// Writes every dirty node, children before parents: encodes the page,
    /// calls `place(&page)` for the address it will be stored at, records
    /// `PagePtr { addr, crc32c }` and marks the node clean. Returns the new
    /// root (None if the map is empty).
    ///
    /// Panics if an entry with flags outside `entry_flags::ON_DISK_MASK`
    /// (BUFFERED) is present: the engine replaces those first.
    pub fn write_dirty(
        &mut self,
        place: &mut dyn FnMut(&[u8]) -> LdResult<u64>,
    ) -> LdResult<Option<MapRoot>> {
        if self.root == NONE {
            self.last_root = None;
            self.dirtied_nodes = 0;
            return Ok(None);
        }
        let mut page = vec![0u8; PAGE_BYTES];
        self.write_node(self.root, self.height - 1, place, &mut page)?;
        self.dirtied_nodes = 0;
        let root = MapRoot {
            ptr: self.node(self.root).ptr.expect("root written"),
            height: self.height,
            entries: self.entries,
        };
        self.last_root = Some(root);
        self.maybe_evict();
        Ok(Some(root))
    }

    fn write_node(
        &mut self,
        id: NodeId,
        level: u8,
        place: &mut dyn FnMut(&[u8]) -> LdResult<u64>,
        page: &mut [u8],
    ) -> LdResult<()> {
        if !self.node(id).dirty {
            return Ok(());
        }
        match &self.node(id).kind {
            Kind::Internal(ch) => {
                assert!(level > 0, "internal node {id} at level 0");
                let kids: Vec<NodeId> = ch.iter().map(|c| c.1).collect();
                for c in kids {
                    self.write_node(c, level - 1, place, page)?;
                }
                let ch = self.internal(id);
                let children: Vec<(Key, PagePtr)> = ch
                    .iter()
                    .map(|&(k, c)| (k, self.node(c).ptr.expect("child written")))
                    .collect();
                encode_internal(self.fs_id, level, &children, page);
            }
            Kind::Leaf(d) => {
                assert!(level == 0, "leaf {id} at level {level}");
                encode_leaf(self.fs_id, d.as_ref().expect("dirty leaf resident"), page);
            }
            Kind::Free => unreachable!("free node {id} in the tree"),
        }
        let addr = place(page)?;
        let ptr = PagePtr {
            addr,
            crc: crc32c::crc32c(page),
        };
        let prev = self.pages.insert(addr, id);
        assert!(prev.is_none(), "place returned address {addr} twice");
        let n = self.node_mut(id);
        n.ptr = Some(ptr);
        n.dirty = false;
        let is_leaf = matches!(n.kind, Kind::Leaf(_));
        self.dirty_nodes -= 1;
        if is_leaf {
            self.enqueue_clock(id);
        }
        Ok(())
    }

    /// The root as of the last write_dirty/open (None if empty).
    pub fn root(&self) -> Option<MapRoot> {
        self.last_root
    }

    /// On-disk pages no longer referenced whose space the usage table still
    /// counts: the next checkpoint subtracts them (`take_obsolete`).
    pub fn obsolete_pages(&self) -> &[PagePtr] {
        &self.obsolete
    }

    /// On-disk pages that stopped being referenced since the last call.
    pub fn take_obsolete(&mut self) -> Vec<PagePtr> {
        std::mem::take(&mut self.obsolete)
    }

    /// Whether the on-disk page at `addr` is currently referenced by the tree.
    pub fn page_is_live(&self, addr: u64) -> bool {
        self.pages.contains_key(&addr)
    }

    /// Dirty the node whose current on-disk page is at `addr` (and its
    /// ancestors), so the next write_dirty rewrites it elsewhere. Returns
    /// false if no node is at `addr`.
    pub fn mark_page_dirty(&mut self, addr: u64, r: &dyn PageReader) -> LdResult<bool> {
        let Some(&id) = self.pages.get(&addr) else {
            return Ok(false);
        };
        if matches!(self.node(id).kind, Kind::Leaf(_)) {
            self.load_leaf(id, r)?;
        }
        self.mark_dirty(id);
        self.maybe_evict();
        Ok(true)
    }

    /// Map pages that replacing the entries of `keys` and rewriting the
    /// pages at `addrs` would newly dirty, leaving out nodes already in
    /// `seen` (which it extends): from each key's leaf (or each page's node)
    /// up towards the root, as far as the path is clean. What the cleaner
    /// counts a victim's moves to cost the next checkpoint; only resident
    /// internal nodes are read. Keys with no entry still count their leaf,
    /// so it may overstate.
    pub fn pages_to_dirty(&self, keys: &[Key], addrs: &[u64], seen: &mut DirtySet) -> usize {
        if self.root == NONE {
            return 0;
        }
        let mut n = 0;
        let mut climb = |mut cur: NodeId| {
            while cur != NONE && !self.node(cur).dirty && seen.0.insert(cur) {
                n += 1;
                cur = self.node(cur).parent;
            }
        };
        for &key in keys {
            climb(self.find_leaf(key));
        }
        for a in addrs {
            if let Some(&id) = self.pages.get(a) {
                climb(id);
            }
        }
        n
    }

    /// Pages replacing the entry of an existing `key` would newly dirty:
    /// the clean pages on its leaf's path.
    pub fn path_pages_to_dirty(&self, key: Key) -> usize {
        if self.root == NONE {
            return 0;
        }
        // (Every cleaner move asks: no set to allocate. A dirty node's
        // ancestors are dirty, so the clean ones are the leaf's end.)
        let mut n = 0;
        let mut cur = self.find_leaf(key);
        while cur != NONE && !self.node(cur).dirty {
            n += 1;
            cur = self.node(cur).parent;
        }
        n
    }

    /// Calls `f` with every on-disk page currently referenced (root included).
    pub fn for_each_page(&self, f: &mut dyn FnMut(PagePtr)) {
        for &id in self.pages.values() {
            f(self.node(id).ptr.expect("indexed node has a page"));
        }
    }

    /// Drops clean resident leaves (CLOCK order with a referenced bit) until
    /// the map's memory is within budget. Dirty leaves are never dropped.
    pub fn evict(&mut self) {
        // The budget covers the whole map (memory_bytes), not only leaves:
        // internal nodes and indexes stay, so leaves get what is left.
        while self.memory_bytes() > self.budget {
            let Some(id) = self.clock.pop_front() else {
                break;
            };
            let n = &mut self.nodes[id as usize];
            let Kind::Leaf(Some(d)) = &n.kind else {
                self.in_clock[id as usize] = false;
                continue;
            };
            if n.dirty {
                self.in_clock[id as usize] = false;
                continue;
            }
            if n.referenced {
                n.referenced = false;
                self.clock.push_back(id);
                continue;
            }
            debug_assert!(n.ptr.is_some());
            self.resident_bytes -= leaf_mem(d.capacity());
            n.kind = Kind::Leaf(None);
            self.in_clock[id as usize] = false;
        }
    }

    fn maybe_evict(&mut self) {
        if self.memory_bytes() > self.budget {
            self.evict();
        }
    }

    // ---- nodes ----

    fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id as usize]
    }

    fn node_mut(&mut self, id: NodeId) -> &mut Node {
        &mut self.nodes[id as usize]
    }

    fn internal(&self, id: NodeId) -> &Vec<(Key, NodeId)> {
        match &self.node(id).kind {
            Kind::Internal(ch) => ch,
            _ => unreachable!("node {id} is not internal"),
        }
    }

    fn internal_mut(&mut self, id: NodeId) -> &mut Vec<(Key, NodeId)> {
        match &mut self.node_mut(id).kind {
            Kind::Internal(ch) => ch,
            _ => unreachable!("node {id} is not internal"),
        }
    }

    fn leaf(&self, id: NodeId) -> &LeafData {
        match &self.node(id).kind {
            Kind::Leaf(Some(d)) => d,
            _ => unreachable!("node {id} is not a resident leaf"),
        }
    }

    fn leaf_mut(&mut self, id: NodeId) -> &mut LeafData {
        match &mut self.node_mut(id).kind {
            Kind::Leaf(Some(d)) => d,
            _ => unreachable!("node {id} is not a resident leaf"),
        }
    }

    /// A new node: dirty unless it has a page (`ptr`).
    fn alloc(&mut self, kind: Kind, parent: NodeId, ptr: Option<PagePtr>) -> NodeId {
        match &kind {
            Kind::Leaf(Some(d)) => self.resident_bytes += leaf_mem(d.capacity()),
            Kind::Internal(_) => self.internal_nodes += 1,
            _ => {}
        }
        let dirty = ptr.is_none();
        if dirty {
            self.dirty_nodes += 1;
            self.dirtied_nodes += 1;
        }
        self.live_nodes += 1;
        let node = Node {
            kind,
            ptr,
            parent,
            dirty,
            referenced: true,
        };
        let id = match self.free.pop() {
            Some(id) => {
                self.nodes[id as usize] = node;
                id
            }
            None => {
                assert!(self.nodes.len() < NONE as usize, "map node arena full");
                self.nodes.push(node);
                self.in_clock.push(false);
                (self.nodes.len() - 1) as NodeId
            }
        };
        if let Some(p) = ptr {
            self.pages.insert(p.addr, id);
        }
        id
    }

    /// Frees a node (not its children); its page, if any, becomes obsolete.
    fn free_node(&mut self, id: NodeId) {
        let n = &mut self.nodes[id as usize];
        if n.dirty {
            self.dirty_nodes -= 1;
        }
        if let Some(p) = n.ptr.take() {
            self.obsolete.push(p);
            self.pages.remove(&p.addr);
        }
        match std::mem::replace(&mut n.kind, Kind::Free) {
            Kind::Leaf(Some(d)) => self.resident_bytes -= leaf_mem(d.capacity()),
            Kind::Internal(_) => self.internal_nodes -= 1,
            Kind::Leaf(None) => {}
            Kind::Free => unreachable!("node {id} freed twice"),
        }
        self.live_nodes -= 1;
        self.free.push(id);
    }

    /// Dirties `id` and its ancestors; their pages become obsolete.
    fn mark_dirty(&mut self, id: NodeId) {
        let mut cur = id;
        while cur != NONE {
            let n = &mut self.nodes[cur as usize];
            if n.dirty {
                break;
            }
            debug_assert!(
                !matches!(n.kind, Kind::Leaf(None)),
                "dirtying an evicted leaf"
            );
            n.dirty = true;
            if let Some(p) = n.ptr.take() {
                self.obsolete.push(p);
                self.pages.remove(&p.addr);
            }
            self.dirty_nodes += 1;
            self.dirtied_nodes += 1;
            cur = n.parent;
        }
    }

    fn enqueue_clock(&mut self, id: NodeId) {
        if !self.in_clock[id as usize] {
            self.in_clock[id as usize] = true;
            self.clock.push_back(id);
        }
    }

    fn find_leaf(&self, key: Key) -> NodeId {
        let mut id = self.root;
        while let Kind::Internal(ch) = &self.node(id).kind {
            let i = ch.partition_point(|c| c.0 <= key).saturating_sub(1);
            id = ch[i].1;
        }
        id
    }

    /// Index of `child` in `parent`'s children.
    fn position(&self, parent: NodeId, child: NodeId) -> usize {
        self.internal(parent)
            .iter()
            .position(|c| c.1 == child)
            .expect("child listed in its parent")
    }

    /// The bounds of `id`'s subtree, from its ancestors.
    fn bounds_of(&self, id: NodeId) -> Bounds {
        let mut b = Bounds::ALL;
        let mut cur = id;
        loop {
            let p = self.node(cur).parent;
            if p == NONE {
                return b;
            }
            let ch = self.internal(p);
            let i = self.position(p, cur);
            if cur == id {
                b.lo = Some(ch[i].0);
            }
            if let Some(next) = ch.get(i + 1) {
                b.hi = Some(next.0);
                return b;
            }
            cur = p;
        }
    }

    fn first_key(&self, id: NodeId) -> Key {
        match &self.node(id).kind {
            Kind::Internal(ch) => ch[0].0,
            Kind::Leaf(Some(d)) => d[0].0,
            _ => unreachable!("first key of an evicted or free node {id}"),
        }
    }

    /// After `id`'s smallest key changed: updates the keys naming it in its
    /// ancestors.
    fn propagate_first_key(&mut self, id: NodeId) {
        let mut cur = id;
        loop {
            let p = self.node(cur).parent;
            if p == NONE {
                return;
            }
            let k = self.first_key(cur);
            let i = self.position(p, cur);
            if self.internal(p)[i].0 == k {
                return;
            }
            self.mark_dirty(p);
            self.internal_mut(p)[i].0 = k;
            if i != 0 {
                return;
            }
            cur = p;
        }
    }

    /// Reads, checks and decodes the page at `ptr`, expected at `level`
    /// with keys within `b`.
    fn read_node(&self, ptr: PagePtr, level: u8, b: Bounds, r: &dyn PageReader) -> LdResult<Page> {
        read_checked(self.fs_id, ptr, level, b, r)
    }

    fn load_leaf(&mut self, id: NodeId, r: &dyn PageReader) -> LdResult<()> {
        if let Kind::Leaf(Some(_)) = self.node(id).kind {
            self.node_mut(id).referenced = true;
            return Ok(());
        }
        let b = self.bounds_of(id);
        self.load_leaf_bounded(id, b, r)
    }

    fn load_leaf_bounded(&mut self, id: NodeId, b: Bounds, r: &dyn PageReader) -> LdResult<()> {
        let n = self.node(id);
        match n.kind {
            Kind::Leaf(Some(_)) => {}
            Kind::Leaf(None) => {
                let ptr = n.ptr.expect("an evicted leaf is clean");
                let Page::Leaf(d) = self.read_node(ptr, 0, b, r)? else {
                    unreachable!("decode_page returns leaves for level 0");
                };
                self.resident_bytes += leaf_mem(d.capacity());
                self.node_mut(id).kind = Kind::Leaf(Some(d));
                self.enqueue_clock(id);
            }
            _ => unreachable!("node {id} is not a leaf"),
        }
        self.node_mut(id).referenced = true;
        Ok(())
    }

    /// Inserts into a resident leaf with room, growing it to full capacity
    /// (never beyond) when needed.
    fn leaf_insert(&mut self, id: NodeId, pos: usize, item: (Key, MapEntry)) {
        let d = self.leaf_mut(id);
        debug_assert!(d.len() < LEAF_CAPACITY);
        let mut grown = 0;
        if d.len() == d.capacity() {
            let before = d.capacity();
            d.reserve_exact(LEAF_CAPACITY - d.len());
            grown = d.capacity() - before;
        }
        d.insert(pos, item);
        self.resident_bytes += grown * ENTRY_MEM;
    }

    /// Inserts into a full leaf by splitting it.
    fn split_leaf(&mut self, id: NodeId, pos: usize, item: (Key, MapEntry)) {
        let d = self.leaf_mut(id);
        let mut right = Vec::with_capacity(LEAF_CAPACITY);
        if pos == d.len() {
            right.push(item);
        } else if pos > 0 && d[pos - 1].0.list == item.0.list && d[pos].0.list != item.0.list {
            // An append to a list whose tail shares the leaf with later
            // lists: split there, so the list's tail ends its leaf.
            right.extend(d.drain(pos..));
            d.push(item);
        } else {
            let mid = d.len() / 2;
            right.extend(d.drain(mid..));
            if pos < mid {
                d.insert(pos, item);
            } else {
                right.insert(pos - mid, item);
            }
        }
        let sep = right[0].0;
        let new = self.alloc(Kind::Leaf(Some(right)), NONE, None);
        if pos == 0 {
            self.propagate_first_key(id);
        }
        self.insert_child(id, sep, new);
    }

    /// Puts `new` (smallest key `sep`) right after `left` in `left`'s parent,
    /// splitting upwards as needed; grows the tree at the root.
    fn insert_child(&mut self, mut left: NodeId, mut sep: Key, mut new: NodeId) {
        loop {
            let p = self.node(left).parent;
            if p == NONE {
                let mut ch = Vec::with_capacity(INTERNAL_VEC_CAP);
                ch.push((self.first_key(left), left));
                ch.push((sep, new));
                let root = self.alloc(Kind::Internal(ch), NONE, None);
                self.node_mut(left).parent = root;
                self.node_mut(new).parent = root;
                self.root = root;
                assert!(self.height < MAX_HEIGHT, "map tree too tall");
                self.height += 1;
                return;
            }
            let i = self.position(p, left);
            self.node_mut(new).parent = p;
            let ch = self.internal_mut(p);
            ch.insert(i + 1, (sep, new));
            if ch.len() <= INTERNAL_CAPACITY {
                return;
            }
            let mut right = Vec::with_capacity(INTERNAL_VEC_CAP);
            if i + 2 == ch.len() {
                right.push(ch.pop().expect("nonempty"));
            } else if ch[i].0.list == sep.list && ch[i + 2].0.list != sep.list {
                // As in split_leaf: the new child ends its list's run.
                right.extend(ch.drain(i + 2..));
            } else {
                let mid = ch.len() / 2;
                right.extend(ch.drain(mid..));
            }
            let sep2 = right[0].0;
            let np = self.alloc(Kind::Internal(right), NONE, None);
            for k in 0..self.internal(np).len() {
                let c = self.internal(np)[k].1;
                self.node_mut(c).parent = np;
            }
            left = p;
            sep = sep2;
            new = np;
        }
    }

    /// Entries or children of a node; `None` for an evicted leaf.
    fn count(&self, id: NodeId) -> Option<usize> {
        match &self.node(id).kind {
            Kind::Internal(ch) => Some(ch.len()),
            Kind::Leaf(Some(d)) => Some(d.len()),
            Kind::Leaf(None) => None,
            Kind::Free => unreachable!("free node {id} in the tree"),
        }
    }

    /// Walks from `id` to the root removing empty nodes, merging underfull
    /// ones with a sibling, and collapsing a root with one child. Loads a
    /// sibling leaf if needed; if that read fails the merge is skipped (the
    /// error surfaces when the leaf is used).
    fn rebalance(&mut self, id: NodeId, r: &dyn PageReader) {
        let mut cur = id;
        loop {
            let p = self.node(cur).parent;
            if p == NONE {
                self.collapse_root();
                return;
            }
            let is_leaf = matches!(self.node(cur).kind, Kind::Leaf(_));
            let (min, merge_max) = if is_leaf {
                (LEAF_MIN, LEAF_MERGE_MAX)
            } else {
                (INTERNAL_MIN, INTERNAL_MERGE_MAX)
            };
            match self.count(cur) {
                Some(0) => {
                    let i = self.position(p, cur);
                    self.remove_child(p, i);
                }
                Some(c) if c < min => self.try_merge(cur, p, c, merge_max, r),
                _ => {}
            }
            cur = p;
        }
    }

    fn try_merge(&mut self, id: NodeId, p: NodeId, count: usize, max: usize, r: &dyn PageReader) {
        let i = self.position(p, id);
        let ch = self.internal(p);
        let left = i.checked_sub(1).map(|j| ch[j].1);
        let right = ch.get(i + 1).map(|c| c.1);
        for (l, rt, sib) in [left.map(|s| (s, id, s)), right.map(|s| (id, s, s))]
            .into_iter()
            .flatten()
        {
            if matches!(self.node(sib).kind, Kind::Leaf(None)) && self.load_leaf(sib, r).is_err() {
                continue;
            }
            let sc = self.count(sib).expect("resident");
            if count + sc <= max {
                self.merge(l, rt, p);
                return;
            }
        }
    }

    /// Moves everything of `rt` into `l` (its left neighbour under `p`) and
    /// frees `rt`.
    fn merge(&mut self, l: NodeId, rt: NodeId, p: NodeId) {
        self.mark_dirty(l);
        match &mut self.node_mut(rt).kind {
            Kind::Leaf(Some(rd)) => {
                let rd = std::mem::take(rd);
                self.resident_bytes -= rd.capacity() * ENTRY_MEM;
                let ld = self.leaf_mut(l);
                let before = ld.capacity();
                if ld.capacity() < ld.len() + rd.len() {
                    ld.reserve_exact(rd.len());
                }
                ld.extend(rd);
                let grown = ld.capacity() - before;
                self.resident_bytes += grown * ENTRY_MEM;
            }
            Kind::Internal(rch) => {
                let rch = std::mem::take(rch);
                for &(_, c) in &rch {
                    self.node_mut(c).parent = l;
                }
                self.internal_mut(l).extend(rch);
            }
            _ => unreachable!("merging an evicted or free node"),
        }
        let i = self.position(p, rt);
        self.remove_child(p, i);
    }

    /// Removes and frees child `i` of `p` (its subtree must be empty or
    /// already moved).
    fn remove_child(&mut self, p: NodeId, i: usize) {
        self.mark_dirty(p);
        let (_, c) = self.internal_mut(p).remove(i);
        self.free_node(c);
        if i == 0 && !self.internal(p).is_empty() {
            self.propagate_first_key(p);
        }
    }

    fn collapse_root(&mut self) {
        loop {
            let root = self.root;
            match &self.node(root).kind {
                Kind::Internal(ch) if ch.len() == 1 => {
                    let c = ch[0].1;
                    self.free_node(root);
                    self.node_mut(c).parent = NONE;
                    self.root = c;
                    self.height -= 1;
                }
                Kind::Internal(ch) if ch.is_empty() => {
                    self.free_node(root);
                    self.root = NONE;
                    self.height = 0;
                    return;
                }
                Kind::Leaf(Some(d)) if d.is_empty() => {
                    self.free_node(root);
                    self.root = NONE;
                    self.height = 0;
                    return;
                }
                _ => return,
            }
        }
    }
}

fn put_header(page: &mut [u8], fs_id: u64, level: u8, count: usize) {
    page.fill(0);
    page[P_MAGIC..P_MAGIC + 4].copy_from_slice(&MAP_MAGIC);
    page[P_LEVEL] = level;
    page[P_COUNT..P_COUNT + 2].copy_from_slice(&(count as u16).to_le_bytes());
    put_u64(page, P_FS_ID, fs_id);
}

fn encode_leaf(fs_id: u64, entries: &[(Key, MapEntry)], page: &mut [u8]) {
    assert!((1..=LEAF_CAPACITY).contains(&entries.len()));
    put_header(page, fs_id, 0, entries.len());
    for (i, (k, e)) in entries.iter().enumerate() {
        assert!(
            e.flags & !entry_flags::ON_DISK_MASK == 0,
            "map entry {k:?} with flags {:#x} would reach disk",
            e.flags
        );
        assert!(
            (1..=LEN_MASK).contains(&e.len),
            "map entry {k:?} with length {}",
            e.len
        );
        let o = P_ENTRIES + i * LEAF_ENTRY_BYTES;
        put_u64(page, o, k.list);
        put_u64(page, o + 8, k.index);
        put_u64(page, o + 16, e.addr);
        put_u32(page, o + 24, e.len | (e.flags as u32) << 24);
        put_u32(page, o + 28, e.crc);
    }
}

fn encode_internal(fs_id: u64, level: u8, children: &[(Key, PagePtr)], page: &mut [u8]) {
    assert!(level > 0 && (1..=INTERNAL_CAPACITY).contains(&children.len()));
    put_header(page, fs_id, level, children.len());
    for (i, (k, p)) in children.iter().enumerate() {
        let o = P_ENTRIES + i * INTERNAL_ENTRY_BYTES;
        put_u64(page, o, k.list);
        put_u64(page, o + 8, k.index);
        put_u64(page, o + 16, p.addr);
        put_u32(page, o + 24, p.crc);
    }
}

/// Checks a map page read at `addr` as the map would when loading it at
/// `level` (fsck, fuzzing): magic, file system, level, counts, key order.
pub fn validate_page(b: &[u8], addr: u64, fs_id: u64, level: u8) -> Result<(), Corruption> {
    decode_page(b, addr, fs_id, level).map(|_| ())
}

/// Decodes a map page read at `addr`, expected at `level`. Never panics.
fn decode_page(b: &[u8], addr: u64, fs_id: u64, level: u8) -> Result<Page, Corruption> {
    let bad = |reason| corrupt(addr, reason);
    let inconsistent = |s: String| bad(CorruptReason::Inconsistent(s));
    if b.len() != PAGE_BYTES {
        return Err(bad(CorruptReason::OutOfBounds {
            field: "page length",
            value: b.len() as u64,
            limit: PAGE_BYTES as u64,
        }));
    }
    if b[P_MAGIC..P_MAGIC + 4] != MAP_MAGIC {
        return Err(bad(CorruptReason::BadMagic {
            got: get_u32(b, P_MAGIC) as u64,
        }));
    }
    let got_fs = get_u64(b, P_FS_ID);
    if got_fs != fs_id {
        return Err(bad(CorruptReason::WrongFileSystem {
            expected: fs_id,
            got: got_fs,
        }));
    }
    if b[P_LEVEL] != level {
        return Err(inconsistent(format!(
            "level {} where level {level} was expected",
            b[P_LEVEL]
        )));
    }
    if b[P_ZERO] != 0 {
        return Err(inconsistent(format!("reserved byte is {:#x}", b[P_ZERO])));
    }
    let count = u16::from_le_bytes([b[P_COUNT], b[P_COUNT + 1]]) as usize;
    let (cap, size) = if level == 0 {
        (LEAF_CAPACITY, LEAF_ENTRY_BYTES)
    } else {
        (INTERNAL_CAPACITY, INTERNAL_ENTRY_BYTES)
    };
    if count > cap {
        return Err(bad(CorruptReason::OutOfBounds {
            field: "count",
            value: count as u64,
            limit: cap as u64,
        }));
    }
    if count == 0 {
        return Err(inconsistent("empty map page".into()));
    }
    let end = P_ENTRIES + count * size;
    if b[end..].iter().any(|&x| x != 0) {
        return Err(inconsistent("nonzero bytes after the last entry".into()));
    }
    let key_at = |o: usize| Key {
        list: get_u64(b, o),
        index: get_u64(b, o + 8),
    };
    let mut prev: Option<Key> = None;
    let mut ascending = |i: usize, k: Key| {
        if prev.is_some_and(|p| p >= k) {
            return Err(inconsistent(format!(
                "key {k:?} of entry {i} is not above the previous one"
            )));
        }
        prev = Some(k);
        Ok(())
    };
    if level == 0 {
        let mut d = Vec::with_capacity(count);
        for i in 0..count {
            let o = P_ENTRIES + i * size;
            let k = key_at(o);
            ascending(i, k)?;
            let lf = get_u32(b, o + 24);
            let e = MapEntry {
                addr: get_u64(b, o + 16),
                len: lf & LEN_MASK,
                crc: get_u32(b, o + 28),
                flags: (lf >> 24) as u8,
            };
            if e.flags & !entry_flags::ON_DISK_MASK != 0 {
                return Err(inconsistent(format!("entry {i} has flags {:#x}", e.flags)));
            }
            if e.len == 0 {
                return Err(inconsistent(format!("entry {i} has length 0")));
            }
            d.push((k, e));
        }
        Ok(Page::Leaf(d))
    } else {
        let mut c = Vec::with_capacity(count);
        for i in 0..count {
            let o = P_ENTRIES + i * size;
            let k = key_at(o);
            ascending(i, k)?;
            c.push((
                k,
                PagePtr {
                    addr: get_u64(b, o + 16),
                    crc: get_u32(b, o + 24),
                },
            ));
        }
        Ok(Page::Internal(c))
    }
}

/// Reads the page at `ptr` as a node of `level` within bounds `b`: its crc
/// (kept in the parent), then its contents (`decode_page`), then its keys
/// against the parent's.
fn read_checked(
    fs_id: u64,
    ptr: PagePtr,
    level: u8,
    b: Bounds,
    r: &dyn PageReader,
) -> LdResult<Page> {
    let page = r.read_page(ptr)?;
    if page.len() == PAGE_BYTES {
        let got = crc32c::crc32c(&page);
        if got != ptr.crc {
            return Err(corrupt(
                ptr.addr,
                CorruptReason::BadChecksum {
                    expected: ptr.crc,
                    got,
                },
            )
            .into());
        }
    }
    let p = decode_page(&page, ptr.addr, fs_id, level)?;
    let (first, last) = p.first_last();
    if let Some(lo) = b.lo {
        if first != lo {
            return Err(corrupt(
                ptr.addr,
                CorruptReason::Inconsistent(format!(
                    "first key {first:?} is not the parent's key {lo:?}"
                )),
            )
            .into());
        }
    }
    if let Some(hi) = b.hi {
        if last >= hi {
            return Err(corrupt(
                ptr.addr,
                CorruptReason::Inconsistent(format!(
                    "key {last:?} is not below the next sibling's key {hi:?}"
                )),
            )
            .into());
        }
    }
    Ok(p)
}

/// What `SharedPages::for_each_leaf` calls: a leaf, the pin bits of the
/// trees reaching it, its entries.
pub type LeafVisitor<'a> = dyn FnMut(PagePtr, u32, &[(Key, MapEntry)]) + 'a;

/// One page of `SharedPages`.
struct SharedPage {
    ptr: PagePtr,
    level: u8,
    /// Bounds of the first tree that reached it (a page at an address is
    /// the same page in every tree: pinned segments are never rewritten).
    bounds: Bounds,
    /// The pin bits of every tree reaching it.
    mask: u32,
    /// An internal page's children.
    children: Vec<(Key, PagePtr)>,
}

/// The pages of several map trees, each read once: kept checkpoints'
/// trees share most of their pages, so checking them one by one would
/// read a page once per tree (fsck, `Engine::check_snapshots`). A tree
/// added descends only into pages it reaches with a pin bit they do not
/// have yet; leaves are read in one pass at the end.
pub struct SharedPages {
    fs_id: u64,
    pages: FxHashMap<u64, SharedPage>,
    /// Internal pages that failed their check (as named: pointer, level),
    /// with why: a later tree may reach one only through a page added
    /// already with its bits, where it stops (`failed`, `reaches`).
    failed: FxHashMap<u64, (PagePtr, u8, String)>,
    /// Leaf pages read by `for_each_leaf` (a statistic for tests).
    pub leaves_read: u64,
}

impl SharedPages {
    pub fn new(fs_id: u64) -> SharedPages {
        SharedPages {
            fs_id,
            pages: FxHashMap::default(),
            failed: FxHashMap::default(),
            leaves_read: 0,
        }
    }

    /// Adds the tree at `root`, whose pages need pin bits `mask`: reads
    /// every internal page not read before. Returns the problems of this
    /// tree's naming (a height, a page named otherwise elsewhere); a page
    /// that fails its check is kept in `failed` instead, for every tree
    /// reaching it (`reaches`). Device errors other than corruption are
    /// errors.
    pub fn add_tree(
        &mut self,
        root: MapRoot,
        mask: u32,
        r: &dyn PageReader,
    ) -> LdResult<Vec<(u64, String)>> {
        let mut problems = Vec::new();
        if root.height == 0 || root.height > MAX_HEIGHT {
            problems.push((root.ptr.addr, format!("map height {}", root.height)));
            return Ok(problems);
        }
        let mut stack = vec![(root.ptr, root.height - 1, Bounds::ALL)];
        while let Some((ptr, level, b)) = stack.pop() {
            if let Some((p, l, _)) = self.failed.get(&ptr.addr) {
                if p.crc != ptr.crc || *l != level {
                    problems.push((
                        ptr.addr,
                        format!(
                            "map page at byte {} named with crc {:#x} at level {level}, \
                             elsewhere with crc {:#x} at level {l}",
                            ptr.addr, ptr.crc, p.crc
                        ),
                    ));
                }
                continue;
            }
            if let Some(p) = self.pages.get_mut(&ptr.addr) {
                if p.ptr.crc != ptr.crc || p.level != level {
                    problems.push((
                        ptr.addr,
                        format!(
                            "map page at byte {} named with crc {:#x} at level {level}, \
                             elsewhere with crc {:#x} at level {}",
                            ptr.addr, ptr.crc, p.ptr.crc, p.level
                        ),
                    ));
                    continue;
                }
                if p.mask & mask == mask {
                    continue;
                }
                p.mask |= mask;
                push_children(&mut stack, &p.children, level, p.bounds);
                continue;
            }
            let children = if level == 0 {
                Vec::new()
            } else {
                match read_checked(self.fs_id, ptr, level, b, r) {
                    Ok(Page::Internal(c)) => c,
                    Ok(Page::Leaf(_)) => {
                        unreachable!("decode_page returns internal pages for level > 0")
                    }
                    Err(LdError::Corrupt(c)) => {
                        self.failed
                            .insert(ptr.addr, (ptr, level, format!("map: {c}")));
                        continue;
                    }
                    Err(e) => return Err(e),
                }
            };
            push_children(&mut stack, &children, level, b);
            self.pages.insert(
                ptr.addr,
                SharedPage {
                    ptr,
                    level,
                    bounds: b,
                    mask,
                    children,
                },
            );
        }
        Ok(problems)
    }

    /// The internal pages that failed their check (address, why).
    pub fn failed(&self) -> impl Iterator<Item = (u64, &String)> + '_ {
        self.failed.iter().map(|(&a, (_, _, why))| (a, why))
    }

    /// Calls `f` with every page (internal pages and leaves) and the pin
    /// bits of the trees reaching it.
    pub fn for_each_page(&self, f: &mut dyn FnMut(PagePtr, u32)) {
        for p in self.pages.values() {
            f(p.ptr, p.mask);
        }
    }

    /// Reads every leaf once (in address order) and calls `f` with it, the
    /// pin bits of the trees reaching it and its entries. Returns the
    /// leaves that could not be read (address, text).
    pub fn for_each_leaf(
        &mut self,
        r: &dyn PageReader,
        f: &mut LeafVisitor,
    ) -> LdResult<Vec<(u64, String)>> {
        let mut leaves: Vec<&SharedPage> = self.pages.values().filter(|p| p.level == 0).collect();
        leaves.sort_unstable_by_key(|p| p.ptr.addr);
        let mut problems = Vec::new();
        for p in leaves {
            self.leaves_read += 1;
            match read_checked(self.fs_id, p.ptr, 0, p.bounds, r) {
                Ok(Page::Leaf(d)) => f(p.ptr, p.mask, &d),
                Ok(Page::Internal(_)) => unreachable!("decode_page returns leaves at level 0"),
                Err(LdError::Corrupt(c)) => problems.push((p.ptr.addr, format!("map: {c}"))),
                Err(e) => return Err(e),
            }
        }
        Ok(problems)
    }

    /// The first page of `bad` the tree at `root` reaches, through pages
    /// read already (no device access).
    pub fn reaches(&self, root: MapRoot, bad: &FxHashMap<u64, String>) -> Option<u64> {
        let mut stack = vec![root.ptr.addr];
        let mut seen = FxHashSet::default();
        while let Some(addr) = stack.pop() {
            if bad.contains_key(&addr) {
                return Some(addr);
            }
            if !seen.insert(addr) {
                continue;
            }
            if let Some(p) = self.pages.get(&addr) {
                stack.extend(p.children.iter().map(|c| c.1.addr));
            }
        }
        None
    }
}

fn push_children(
    stack: &mut Vec<(PagePtr, u8, Bounds)>,
    children: &[(Key, PagePtr)],
    level: u8,
    b: Bounds,
) {
    for i in 0..children.len() {
        let cb = Bounds {
            lo: Some(children[i].0),
            hi: children.get(i + 1).map(|c| c.0).or(b.hi),
        };
        stack.push((children[i].1, level - 1, cb));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::seq::SliceRandom;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;
    use std::cell::{Cell, RefCell};
    use std::collections::{BTreeMap, HashMap, HashSet};
    use std::time::Instant;

    const FS: u64 = 0x1df5_0001;

    /// Pages in memory; `place` appends at increasing addresses.
    struct Disk {
        pages: RefCell<HashMap<u64, Vec<u8>>>,
        next: Cell<u64>,
        reads: Cell<u64>,
    }

    impl Disk {
        fn new() -> Disk {
            Disk {
                pages: RefCell::new(HashMap::new()),
                next: Cell::new(1 << 20),
                reads: Cell::new(0),
            }
        }

        fn place(&self) -> impl FnMut(&[u8]) -> LdResult<u64> + '_ {
            move |p| {
                assert_eq!(p.len(), PAGE_BYTES);
                let a = self.next.get();
                self.next.set(a + PAGE_BYTES as u64);
                self.pages.borrow_mut().insert(a, p.to_vec());
                Ok(a)
            }
        }

        /// Stores a hand-made page; returns its pointer.
        fn put(&self, page: &[u8]) -> PagePtr {
            let addr = self.place()(page).unwrap();
            PagePtr {
                addr,
                crc: crc32c::crc32c(page),
            }
        }

        /// Forgets obsolete pages, as the engine reuses their space.
        fn drop_pages(&self, ptrs: &[PagePtr]) {
            for p in ptrs {
                assert!(
                    self.pages.borrow_mut().remove(&p.addr).is_some(),
                    "obsolete page {} unknown or reported twice",
                    p.addr
                );
            }
        }
    }

    impl PageReader for Disk {
        fn read_page(&self, ptr: PagePtr) -> LdResult<Vec<u8>> {
            self.reads.set(self.reads.get() + 1);
            let page = self
                .pages
                .borrow()
                .get(&ptr.addr)
                .cloned()
                .ok_or_else(|| LdError::InvalidArgument(format!("no page at {}", ptr.addr)))?;
            let got = crc32c::crc32c(&page);
            if got != ptr.crc {
                return Err(corrupt(
                    ptr.addr,
                    CorruptReason::BadChecksum {
                        expected: ptr.crc,
                        got,
                    },
                )
                .into());
            }
            Ok(page)
        }
    }

    fn key(list: u64, index: u64) -> Key {
        Key { list, index }
    }

    fn entry(rng: &mut ChaCha8Rng) -> MapEntry {
        MapEntry {
            addr: rng.gen(),
            len: rng.gen_range(1..=LEN_MASK),
            crc: rng.gen(),
            flags: if rng.gen_bool(0.3) {
                entry_flags::COMPRESSED
            } else {
                0
            },
        }
    }

    fn seq_entry(i: u64) -> MapEntry {
        MapEntry {
            addr: i * 4096,
            len: 4096,
            crc: i as u32,
            flags: 0,
        }
    }

    fn contents(m: &mut Map, d: &Disk) -> Vec<(Key, MapEntry)> {
        let mut v = Vec::new();
        m.range(Key::MIN, Key::MAX, d, &mut |k, e| {
            v.push((k, *e));
            true
        })
        .unwrap();
        v
    }

    /// Writes dirty pages, drops the obsolete ones from the disk, and checks
    /// the on-disk tree independently of the map.
    fn write(m: &mut Map, d: &Disk) -> Option<MapRoot> {
        let dirty = m.dirty_pages();
        let placed = Cell::new(0);
        let mut place = d.place();
        let root = m
            .write_dirty(&mut |p| {
                placed.set(placed.get() + 1);
                place(p)
            })
            .unwrap();
        assert_eq!(
            placed.get(),
            dirty,
            "dirty_pages() is what write_dirty writes"
        );
        assert_eq!((m.dirty_pages(), m.dirtied_pages()), (0, 0));
        assert_eq!(m.root(), root);
        let obsolete = m.take_obsolete();
        for p in &obsolete {
            assert!(
                !m.page_is_live(p.addr),
                "obsolete page {} still live",
                p.addr
            );
        }
        d.drop_pages(&obsolete);
        let (_, addrs) = walk_disk(d, root);
        let mut live = HashSet::new();
        m.for_each_page(&mut |p| {
            assert!(live.insert(p.addr));
        });
        assert_eq!(live, addrs, "for_each_page differs from the on-disk tree");
        m.check();
        root
    }

    /// Reads a tree from disk without the map: its entries and page addresses.
    fn walk_disk(d: &Disk, root: Option<MapRoot>) -> (Vec<(Key, MapEntry)>, HashSet<u64>) {
        fn walk(
            d: &Disk,
            ptr: PagePtr,
            level: u8,
            out: &mut Vec<(Key, MapEntry)>,
            addrs: &mut HashSet<u64>,
        ) {
            assert!(addrs.insert(ptr.addr));
            let page = d.read_page(ptr).unwrap();
            match decode_page(&page, ptr.addr, FS, level).unwrap() {
                Page::Leaf(v) => out.extend(v),
                Page::Internal(c) => {
                    for (k, p) in c {
                        let before = out.len();
                        walk(d, p, level - 1, out, addrs);
                        assert_eq!(out[before].0, k, "internal key is not the child's first");
                    }
                }
            }
        }
        let mut out = Vec::new();
        let mut addrs = HashSet::new();
        if let Some(r) = root {
            walk(d, r.ptr, r.height - 1, &mut out, &mut addrs);
            assert_eq!(out.len() as u64, r.entries);
        }
        assert!(out.windows(2).all(|w| w[0].0 < w[1].0));
        (out, addrs)
    }

    #[derive(Default)]
    struct Stats {
        live: usize,
        dirty: usize,
        internal: usize,
        resident: usize,
        indexed: usize,
        entries: Option<u64>,
    }

    impl Map {
        /// Checks every structural invariant and counter.
        fn check(&self) {
            if self.root == NONE {
                assert_eq!((self.height, self.entries, self.live_nodes), (0, 0, 0));
                assert_eq!((self.dirty_nodes, self.resident_bytes), (0, 0));
                assert!(self.pages.is_empty());
                return;
            }
            assert_eq!(self.node(self.root).parent, NONE);
            let mut st = Stats {
                entries: Some(0),
                ..Stats::default()
            };
            self.check_node(self.root, self.height - 1, Bounds::ALL, &mut st);
            assert_eq!(st.live, self.live_nodes);
            assert_eq!(st.live + self.free.len(), self.nodes.len());
            assert_eq!(st.dirty, self.dirty_nodes);
            assert_eq!(st.internal, self.internal_nodes);
            assert_eq!(st.resident, self.resident_bytes);
            assert_eq!(st.indexed, self.pages.len());
            if let Some(n) = st.entries {
                assert_eq!(n, self.entries);
            }
        }

        fn check_node(&self, id: NodeId, level: u8, b: Bounds, st: &mut Stats) {
            let n = self.node(id);
            st.live += 1;
            if n.dirty {
                st.dirty += 1;
                assert!(n.ptr.is_none());
                assert!(
                    n.parent == NONE || self.node(n.parent).dirty,
                    "clean parent"
                );
            } else {
                let p = n.ptr.expect("clean node has a page");
                assert_eq!(self.pages.get(&p.addr), Some(&id));
                st.indexed += 1;
            }
            match &n.kind {
                Kind::Internal(ch) => {
                    st.internal += 1;
                    assert!(level > 0);
                    let min = if id == self.root { 2 } else { 1 };
                    assert!(
                        (min..=INTERNAL_CAPACITY).contains(&ch.len()),
                        "{}",
                        ch.len()
                    );
                    assert!(ch.capacity() <= INTERNAL_VEC_CAP);
                    assert!(ch.windows(2).all(|w| w[0].0 < w[1].0));
                    if let Some(lo) = b.lo {
                        assert_eq!(ch[0].0, lo);
                    }
                    for i in 0..ch.len() {
                        assert_eq!(self.node(ch[i].1).parent, id);
                        self.check_node(ch[i].1, level - 1, Bounds::child(ch, i, b.hi), st);
                    }
                }
                Kind::Leaf(Some(d)) => {
                    assert_eq!(level, 0);
                    assert!((1..=LEAF_CAPACITY).contains(&d.len()));
                    assert!(d.capacity() <= LEAF_CAPACITY);
                    assert!(d.windows(2).all(|w| w[0].0 < w[1].0));
                    if let Some(lo) = b.lo {
                        assert_eq!(d[0].0, lo);
                    }
                    if let Some(hi) = b.hi {
                        assert!(d[d.len() - 1].0 < hi);
                    }
                    st.resident += leaf_mem(d.capacity());
                    if let Some(e) = &mut st.entries {
                        *e += d.len() as u64;
                    }
                    if !n.dirty {
                        assert!(self.in_clock[id as usize], "clean leaf not evictable");
                    }
                }
                Kind::Leaf(None) => {
                    assert_eq!(level, 0);
                    assert!(!n.dirty);
                    st.entries = None;
                }
                Kind::Free => panic!("free node {id} in the tree"),
            }
        }

        fn leaf_count(&self) -> usize {
            self.live_nodes - self.internal_nodes
        }
    }

    fn corruption(e: LdError) -> CorruptReason {
        match e {
            LdError::Corrupt(c) => {
                assert_eq!(c.what, "map page");
                c.reason
            }
            e => panic!("not a corruption: {e}"),
        }
    }

    /// Random operations on keys `(0..lists, 0..span)` against a model.
    fn run_random(seed: u64, lists: u64, span: u64) {
        eprintln!("map random test: seed {seed}, {lists} lists x {span}");
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let d = Disk::new();
        let budgets = [0, 8 * PAGE_BYTES, 1 << 20, usize::MAX];
        let mut m = Map::new(FS, budgets[rng.gen_range(0..budgets.len())]);
        let mut model: BTreeMap<Key, MapEntry> = BTreeMap::new();
        let rkey = |rng: &mut ChaCha8Rng| key(rng.gen_range(0..lists), rng.gen_range(0..span));
        for phase in 0..12 {
            for _ in 0..2500 {
                let (bound, dirtied) = (m.change_bound(), m.dirtied_pages());
                let op = rng.gen_range(0..1000);
                match op {
                    0..=449 => {
                        let (k, e) = (rkey(&mut rng), entry(&mut rng));
                        assert_eq!(m.insert(k, e, &d).unwrap(), model.insert(k, e), "{k:?}");
                    }
                    450..=649 => {
                        let k = rkey(&mut rng);
                        assert_eq!(m.remove(k, &d).unwrap(), model.remove(&k), "{k:?}");
                    }
                    650..=799 => {
                        let k = rkey(&mut rng);
                        assert_eq!(m.get(k, &d).unwrap(), model.get(&k).copied(), "{k:?}");
                    }
                    800..=879 => {
                        let k = rkey(&mut rng);
                        let expected = match model.get(&k) {
                            Some(e) if rng.gen_bool(0.7) => *e,
                            _ => entry(&mut rng),
                        };
                        let new = entry(&mut rng);
                        let want = model.get(&k) == Some(&expected);
                        if want {
                            model.insert(k, new);
                        }
                        assert_eq!(m.replace_if(k, &expected, new, &d).unwrap(), want);
                    }
                    880..=949 => {
                        let from = rkey(&mut rng);
                        let to = key(from.list + rng.gen_range(0..2), rng.gen_range(0..span));
                        let limit = rng.gen_range(0..400);
                        let mut got = Vec::new();
                        m.range(from, to, &d, &mut |k, e| {
                            got.push((k, *e));
                            got.len() < limit
                        })
                        .unwrap();
                        let want: Vec<_> = if from < to {
                            model
                                .range(from..to)
                                .take(limit.max(1))
                                .map(|(k, e)| (*k, *e))
                                .collect()
                        } else {
                            Vec::new()
                        };
                        assert_eq!(got, want, "range {from:?}..{to:?} limit {limit}");
                    }
                    950..=989 => {
                        let from = rkey(&mut rng);
                        let to = key(from.list, from.index + rng.gen_range(0..300));
                        let got = m.remove_range(from, to, &d).unwrap();
                        let want: Vec<_> = model.range(from..to).map(|(k, e)| (*k, *e)).collect();
                        for (k, _) in &want {
                            model.remove(k);
                        }
                        assert_eq!(got, want, "remove_range {from:?}..{to:?}");
                    }
                    990..=995 => {
                        let l = rng.gen_range(0..lists + 2);
                        let start = rng.gen_range(0..span);
                        for i in start..start + rng.gen_range(1..6000) {
                            let e = entry(&mut rng);
                            assert_eq!(
                                m.insert(key(l, i), e, &d).unwrap(),
                                model.insert(key(l, i), e)
                            );
                        }
                    }
                    _ => {
                        let l = rng.gen_range(0..lists + 2);
                        let (from, to) = if rng.gen_bool(0.5) {
                            (key(l, 0), key(l + 1, 0))
                        } else {
                            (
                                rkey(&mut rng),
                                key(l + rng.gen_range(0..3), rng.gen_range(0..span)),
                            )
                        };
                        let got = m.remove_range(from, to, &d).unwrap();
                        let want: Vec<_> = if from < to {
                            model.range(from..to).map(|(k, e)| (*k, *e)).collect()
                        } else {
                            Vec::new()
                        };
                        for (k, _) in &want {
                            model.remove(k);
                        }
                        assert_eq!(got, want, "remove_range {from:?}..{to:?}");
                    }
                }
                // One change dirties at most `change_bound` nodes (the bulk
                // insert is thousands of changes).
                let grew = m.dirtied_pages() - dirtied;
                assert!(
                    (990..=995).contains(&op) || grew <= bound,
                    "op {op} dirtied {grew} nodes, bound {bound}"
                );
                assert!(m.dirtied_pages() >= m.dirty_pages());
            }
            m.check();
            let want: Vec<_> = model.iter().map(|(k, e)| (*k, *e)).collect();
            assert_eq!(m.len(), model.len() as u64, "phase {phase}");
            assert_eq!(contents(&mut m, &d), want, "phase {phase}");
            match rng.gen_range(0..10) {
                0..=2 => m.evict(),
                3..=5 => {
                    let root = write(&mut m, &d);
                    assert_eq!(walk_disk(&d, root).0, want, "phase {phase} on disk");
                }
                _ => {
                    let root = write(&mut m, &d);
                    let budget = budgets[rng.gen_range(0..budgets.len())];
                    m = Map::open(FS, budget, root, &d).unwrap();
                    m.check();
                    assert_eq!(m.len(), model.len() as u64);
                    assert_eq!(contents(&mut m, &d), want, "phase {phase} reopened");
                    m.check();
                }
            }
            if m.budget < usize::MAX {
                assert!(m.resident_bytes <= m.budget || m.clock.is_empty() || m.dirty_nodes > 0);
            }
        }
    }

    #[test]
    fn random_ops_match_model() {
        for seed in 0..10 {
            run_random(seed, 6, 5000);
            run_random(seed, 2, 300);
            run_random(seed, 1, 60);
        }
    }

    #[test]
    fn empty_map() {
        let d = Disk::new();
        let mut m = Map::new(FS, 0);
        assert!(m.is_empty());
        assert_eq!(m.get(key(1, 1), &d).unwrap(), None);
        assert_eq!(m.remove(key(1, 1), &d).unwrap(), None);
        assert!(!m
            .replace_if(key(1, 1), &seq_entry(1), seq_entry(2), &d)
            .unwrap());
        assert!(m.remove_range(Key::MIN, Key::MAX, &d).unwrap().is_empty());
        assert!(contents(&mut m, &d).is_empty());
        assert_eq!(write(&mut m, &d), None);
        assert_eq!((m.total_pages(), m.dirty_pages()), (0, 0));

        let mut m = Map::open(FS, 0, None, &d).unwrap();
        m.insert(key(1, 1), seq_entry(1), &d).unwrap();
        assert_eq!(m.dirty_pages(), 1);
        let root = write(&mut m, &d).unwrap();
        assert_eq!((root.height, root.entries), (1, 1));
        let mut m = Map::open(FS, 0, Some(root), &d).unwrap();
        assert_eq!(m.remove(key(1, 1), &d).unwrap(), Some(seq_entry(1)));
        assert!(m.is_empty());
        assert_eq!(m.take_obsolete(), vec![root.ptr]);
        d.drop_pages(&[root.ptr]);
        assert_eq!(write(&mut m, &d), None);
        assert_eq!(m.root(), None);
        assert!(d.pages.borrow().is_empty());
    }

    #[test]
    fn leaves_in_range_counts_the_leaves_a_range_meets() {
        let d = Disk::new();
        let mut m = Map::new(FS, usize::MAX);
        assert_eq!(m.leaves_in_range(Key::MIN, Key::MAX), 0);
        for i in 0..100_000u64 {
            m.insert(key(1, i), seq_entry(i), &d).unwrap();
        }
        assert!(m.height >= 3);
        assert_eq!(m.leaves_in_range(Key::MIN, Key::MAX), m.leaf_count());
        assert_eq!(m.leaves_in_range(key(1, 5), key(1, 6)), 1);
        assert_eq!(m.leaves_in_range(key(1, 6), key(1, 5)), 0);
        // Sequential inserts fill leaves: 127 keys each, and the edges.
        let n = m.leaves_in_range(key(1, 1000), key(1, 60_000));
        assert!((59_000 / 127..=59_000 / 127 + 2).contains(&n), "{n}");
    }

    #[test]
    fn pages_to_dirty_counts_each_clean_page_on_the_paths_once() {
        let d = Disk::new();
        let mut m = Map::new(FS, usize::MAX);
        let n = (LEAF_CAPACITY * 500) as u64;
        for i in 0..n {
            m.insert(key(7, i), seq_entry(i), &d).unwrap();
        }
        write(&mut m, &d);
        assert_eq!((m.height(), m.clean_pages()), (3, 505));
        // Two keys in one leaf: the leaf, its parent and the root.
        let mut seen = DirtySet::default();
        assert_eq!(m.pages_to_dirty(&[key(7, 0), key(7, 1)], &[], &mut seen), 3);
        // A leaf under the same parent adds itself; one under another
        // parent adds the parent too; pages already seen add nothing.
        assert_eq!(m.pages_to_dirty(&[key(7, 200)], &[], &mut seen), 1);
        assert_eq!(m.pages_to_dirty(&[key(7, n - 1)], &[], &mut seen), 2);
        assert_eq!(
            m.pages_to_dirty(&[key(7, 3), key(7, n - 2)], &[], &mut seen),
            0
        );
        assert_eq!(m.path_pages_to_dirty(key(7, 5)), 3);
        // A dirty path costs nothing more, and says so as it is dirtied.
        m.insert(key(7, 5), seq_entry(9), &d).unwrap();
        assert_eq!(m.path_pages_to_dirty(key(7, 6)), 0);
        assert_eq!(m.path_pages_to_dirty(key(7, n - 1)), 2);
        assert_eq!(m.clean_pages(), 502);
        // A page named by its address climbs from its own node.
        let root_addr = m.last_root.unwrap().ptr.addr;
        let mut seen = DirtySet::default();
        assert_eq!(
            m.pages_to_dirty(&[], &[root_addr], &mut seen),
            0,
            "the root is dirty"
        );
        m.check();
    }

    #[test]
    fn sequential_inserts_fill_leaves() {
        let d = Disk::new();
        let mut m = Map::new(FS, usize::MAX);
        let n = (LEAF_CAPACITY * 500) as u64;
        for i in 0..n {
            assert_eq!(m.insert(key(7, i), seq_entry(i), &d).unwrap(), None);
        }
        m.check();
        assert_eq!(m.leaf_count(), 500);
        // 500 leaves under 4 internal nodes (145, 145, 145, 65) under the root.
        assert_eq!(m.total_pages(), 505);
        assert_eq!(m.height, 3);

        // Appending to several lists at once (each append lands past the
        // last key of a leaf that is not the tree's last) fills leaves too.
        let mut m = Map::new(FS, usize::MAX);
        let per_list = (LEAF_CAPACITY * 100) as u64;
        for i in 0..per_list {
            for l in 0..3 {
                m.insert(key(l, i), seq_entry(i), &d).unwrap();
            }
        }
        m.check();
        assert!(m.leaf_count() <= 303, "{} leaves", m.leaf_count());
        let root = write(&mut m, &d).unwrap();
        assert_eq!(root.entries, 3 * per_list);
    }

    #[test]
    fn remove_range_spans_many_leaves() {
        let d = Disk::new();
        let mut m = Map::new(FS, usize::MAX);
        for i in 0..200_000u64 {
            m.insert(key(1, i), seq_entry(i), &d).unwrap();
        }
        for i in 0..1000u64 {
            m.insert(key(0, i), seq_entry(i), &d).unwrap();
            m.insert(key(2, i), seq_entry(i), &d).unwrap();
        }
        let root = write(&mut m, &d);
        let pages_before = m.total_pages();
        let mut m = Map::open(FS, 0, root, &d).unwrap();
        d.reads.set(0);
        let got = m.remove_range(key(1, 1000), key(1, 150_000), &d).unwrap();
        let want: Vec<_> = (1000..150_000u64)
            .map(|i| (key(1, i), seq_entry(i)))
            .collect();
        assert!(got == want);
        // Each covered leaf is read once; a few more for the edges.
        let leaves = 149_000 / LEAF_CAPACITY as u64;
        assert!(d.reads.get() <= leaves + 8, "{} reads", d.reads.get());
        m.check();
        assert_eq!(m.len(), 2000 + 200_000 - 149_000);
        assert!(m.total_pages() < pages_before / 3);
        // Only the two edge paths are dirty.
        assert!(
            m.dirty_pages() <= 2 * m.height as usize,
            "{}",
            m.dirty_pages()
        );
        let root = write(&mut m, &d);
        let (on_disk, _) = walk_disk(&d, root);
        assert_eq!(on_disk.len(), 53_000);
        assert_eq!(on_disk[999], (key(0, 999), seq_entry(999)));
        assert_eq!(on_disk[1000], (key(1, 0), seq_entry(0)));
        assert_eq!(on_disk[2000], (key(1, 150_000), seq_entry(150_000)));

        // A whole list, then everything.
        let got = m.remove_range(key(1, 0), key(2, 0), &d).unwrap();
        assert_eq!(got.len(), 51_000);
        m.check();
        assert_eq!(m.len(), 2000);
        assert!(m.remove_range(key(1, 0), key(2, 0), &d).unwrap().is_empty());
        assert!(m.remove_range(key(2, 5), key(2, 5), &d).unwrap().is_empty());
        write(&mut m, &d);
        assert_eq!(m.remove_range(Key::MIN, Key::MAX, &d).unwrap().len(), 2000);
        assert!(m.is_empty());
        m.check();
        assert_eq!(write(&mut m, &d), None);
        assert!(d.pages.borrow().is_empty(), "every page reported obsolete");
    }

    #[test]
    fn root_collapses_onto_a_clean_child() {
        let d = Disk::new();
        let mut m = Map::new(FS, usize::MAX);
        for i in 0..LEAF_CAPACITY as u64 + 10 {
            m.insert(key(1, i), seq_entry(i), &d).unwrap();
        }
        assert_eq!((m.height, m.total_pages()), (2, 3));
        let root = write(&mut m, &d).unwrap();
        let (_, addrs) = walk_disk(&d, Some(root));
        let removed = m
            .remove_range(key(1, LEAF_CAPACITY as u64), key(2, 0), &d)
            .unwrap();
        assert_eq!(removed.len(), 10);
        // The full leaf is the root now, clean and unchanged.
        assert_eq!((m.height, m.total_pages(), m.dirty_pages()), (1, 1, 0));
        let new_root = write(&mut m, &d).unwrap();
        assert_eq!(
            (new_root.height, new_root.entries),
            (1, LEAF_CAPACITY as u64)
        );
        assert!(addrs.contains(&new_root.ptr.addr));
        assert_eq!(walk_disk(&d, Some(new_root)).0.len(), LEAF_CAPACITY);
    }

    #[test]
    fn removals_merge_leaves() {
        let d = Disk::new();
        let mut m = Map::new(FS, usize::MAX);
        for i in 0..20_000u64 {
            m.insert(key(1, i), seq_entry(i), &d).unwrap();
        }
        write(&mut m, &d);
        for i in (0..20_000u64).filter(|i| i % 10 != 0) {
            assert!(m.remove(key(1, i), &d).unwrap().is_some());
        }
        m.check();
        assert!(m.leaf_count() <= 2000 / 25, "{} leaves", m.leaf_count());

        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let mut keys: Vec<u64> = (0..20_000u64).filter(|i| i % 10 == 0).collect();
        keys.shuffle(&mut rng);
        let root = write(&mut m, &d);
        let mut m = Map::open(FS, 4 * PAGE_BYTES, root, &d).unwrap();
        for (n, &i) in keys.iter().enumerate() {
            assert!(m.remove(key(1, i), &d).unwrap().is_some());
            if n % 100 == 0 {
                m.check();
                assert!(m.leaf_count() <= 1 + 2 * m.len() as usize / LEAF_MIN);
            }
        }
        assert!(m.is_empty());
        m.check();
        assert_eq!(write(&mut m, &d), None);
        assert!(d.pages.borrow().is_empty());
    }

    #[test]
    fn dirty_pages_follow_touched_leaves() {
        let d = Disk::new();
        let mut m = Map::new(FS, 1 << 20);
        let n = 1_000_000u64;
        for i in 0..n {
            m.insert(key(3, i), seq_entry(i), &d).unwrap();
        }
        assert_eq!(m.dirty_pages(), m.total_pages());
        write(&mut m, &d);
        let total = m.total_pages();
        assert_eq!(m.height, 3);
        // 1% of the keys, contiguous: 79 leaves, their parent, the root.
        for i in 500_000..510_000u64 {
            m.insert(key(3, i), seq_entry(i + 1), &d).unwrap();
        }
        let dirty = m.dirty_pages();
        assert!((81..=83).contains(&dirty), "{dirty} dirty of {total}");
        let obsolete_before = m.obsolete.len();
        assert_eq!(obsolete_before, dirty);
        let placed = Cell::new(0);
        let mut place = d.place();
        m.write_dirty(&mut |p| {
            placed.set(placed.get() + 1);
            place(p)
        })
        .unwrap();
        assert_eq!(placed.get(), dirty);
        assert_eq!(m.total_pages(), total);
        let obsolete = m.take_obsolete();
        d.drop_pages(&obsolete);
        m.check();
        assert!(m.resident_bytes <= 1 << 20);
    }

    #[test]
    fn obsolete_pages_reported_once() {
        let d = Disk::new();
        let mut m = Map::new(FS, usize::MAX);
        for i in 0..30_000u64 {
            m.insert(key(1, i), seq_entry(i), &d).unwrap();
        }
        let root = write(&mut m, &d).unwrap();
        assert_eq!(root.height, 3);
        let (_, addrs) = walk_disk(&d, Some(root));
        m.insert(key(1, 5), seq_entry(6), &d).unwrap();
        let obs = m.take_obsolete();
        assert_eq!(obs.len(), 3, "leaf, parent, root");
        assert!(obs.contains(&root.ptr));
        for p in &obs {
            assert!(addrs.contains(&p.addr));
            assert!(!m.page_is_live(p.addr));
        }
        // Already dirty: nothing more becomes obsolete.
        m.insert(key(1, 6), seq_entry(7), &d).unwrap();
        assert!(m.take_obsolete().is_empty());
        // Replacing an entry by an equal one changes nothing.
        m.insert(key(1, 20_000), seq_entry(20_000), &d).unwrap();
        assert!(m.take_obsolete().is_empty());
        d.drop_pages(&obs);
        let root2 = write(&mut m, &d).unwrap();
        assert_ne!(root2.ptr, root.ptr);
        assert!(m.page_is_live(root2.ptr.addr));
        assert!(!m.page_is_live(root.ptr.addr));
    }

    #[test]
    fn mark_page_dirty_moves_pages() {
        let d = Disk::new();
        let mut m = Map::new(FS, usize::MAX);
        for i in 0..30_000u64 {
            m.insert(key(1, i * 2), seq_entry(i), &d).unwrap();
        }
        let root = write(&mut m, &d);
        let want = contents(&mut m, &d);
        let mut m = Map::open(FS, 0, root, &d).unwrap();
        let mut pages = Vec::new();
        m.for_each_page(&mut |p| pages.push(p));
        assert_eq!(pages.len(), m.total_pages());
        assert!(pages.iter().all(|p| m.page_is_live(p.addr)));
        assert!(!m.page_is_live(12345));
        assert!(!m.mark_page_dirty(12345, &d).unwrap());

        // An evicted leaf: loaded, dirtied with its ancestors.
        let leaf = m.nodes[m.find_leaf(key(1, 40_000)) as usize].ptr.unwrap();
        assert!(m.mark_page_dirty(leaf.addr, &d).unwrap());
        assert!(!m.page_is_live(leaf.addr));
        assert_eq!(m.dirty_pages(), 3);
        assert!(!m.mark_page_dirty(leaf.addr, &d).unwrap());
        // An internal page.
        let internal = m.nodes[m.node(m.find_leaf(key(1, 2)) as NodeId).parent as usize]
            .ptr
            .unwrap();
        assert!(m.mark_page_dirty(internal.addr, &d).unwrap());
        assert_eq!(m.dirty_pages(), 4);
        let obs = m.take_obsolete();
        assert_eq!(obs.len(), 4);
        assert!(obs.contains(&leaf) && obs.contains(&internal));
        d.drop_pages(&obs);
        let root = write(&mut m, &d);
        assert!(!m.page_is_live(leaf.addr));
        let mut m = Map::open(FS, 0, root, &d).unwrap();
        assert_eq!(contents(&mut m, &d), want);
    }

    #[test]
    fn eviction_keeps_memory_within_budget() {
        let d = Disk::new();
        let mut m = Map::new(FS, usize::MAX);
        for i in 0..100_000u64 {
            m.insert(key(1, i), seq_entry(i), &d).unwrap();
        }
        let root = write(&mut m, &d);
        // The budget covers the fixed part (nodes, indexes) plus 16 leaves.
        let fixed = Map::open(FS, usize::MAX, root, &d).unwrap().memory_bytes();
        let budget = fixed + 16 * leaf_mem(LEAF_CAPACITY);
        let mut m = Map::open(FS, budget, root, &d).unwrap();
        let base = m.memory_bytes();
        assert_eq!(m.resident_bytes, 0);
        assert_eq!(contents(&mut m, &d).len(), 100_000);
        assert!(m.resident_bytes <= budget);
        assert!(m.memory_bytes() <= base + budget + 64 * 1024);
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        for _ in 0..2000 {
            let i = rng.gen_range(0..100_000);
            assert_eq!(m.get(key(1, i), &d).unwrap(), Some(seq_entry(i)));
            assert!(m.resident_bytes <= budget);
        }
        // Dirty leaves stay, whatever the budget...
        for i in (0..100_000).step_by(1000) {
            m.insert(key(1, i), seq_entry(i + 1), &d).unwrap();
        }
        assert!(m.resident_bytes > budget);
        m.check();
        // ...until written.
        write(&mut m, &d);
        assert!(m.resident_bytes <= budget);
        // A hot leaf survives a sweep of cold ones (CLOCK's referenced bit).
        d.reads.set(0);
        for i in 0..50_000 {
            m.get(key(1, 7), &d).unwrap();
            m.get(key(1, i), &d).unwrap();
        }
        let cold_leaves = 50_000 / LEAF_CAPACITY as u64 + 1;
        assert!(d.reads.get() <= cold_leaves + 10, "{} reads", d.reads.get());
    }

    #[test]
    #[should_panic(expected = "would reach disk")]
    fn buffered_entries_never_reach_disk() {
        let d = Disk::new();
        let mut m = Map::new(FS, usize::MAX);
        let mut e = seq_entry(1);
        e.flags = entry_flags::BUFFERED;
        m.insert(key(1, 1), e, &d).unwrap();
        let _ = m.write_dirty(&mut d.place());
    }

    fn leaf_page(entries: &[(Key, MapEntry)]) -> Vec<u8> {
        let mut p = vec![0u8; PAGE_BYTES];
        encode_leaf(FS, entries, &mut p);
        p
    }

    fn internal_page(level: u8, children: &[(Key, PagePtr)]) -> Vec<u8> {
        let mut p = vec![0u8; PAGE_BYTES];
        encode_internal(FS, level, children, &mut p);
        p
    }

    #[test]
    fn corrupt_pages_are_typed_errors() {
        let d = Disk::new();
        let entries: Vec<_> = (0..10u64).map(|i| (key(1, i), seq_entry(i))).collect();
        let one_leaf = |page: &[u8]| {
            let ptr = d.put(page);
            let root = MapRoot {
                ptr,
                height: 1,
                entries: 10,
            };
            let mut m = Map::open(FS, 0, Some(root), &d).unwrap();
            m.get(key(1, 3), &d).unwrap_err()
        };

        // A flipped byte: the reader's checksum check.
        let good = leaf_page(&entries);
        let ptr = d.put(&good);
        d.pages.borrow_mut().get_mut(&ptr.addr).unwrap()[100] ^= 1;
        let root = MapRoot {
            ptr,
            height: 1,
            entries: 10,
        };
        let mut m = Map::open(FS, 0, Some(root), &d).unwrap();
        let e = m.get(key(1, 3), &d).unwrap_err();
        assert!(matches!(corruption(e), CorruptReason::BadChecksum { .. }));

        let mut p = good.clone();
        p[P_LEVEL] = 1;
        assert!(matches!(
            corruption(one_leaf(&p)),
            CorruptReason::Inconsistent(_)
        ));
        let mut p = good.clone();
        p[P_COUNT] = 200;
        assert!(matches!(
            corruption(one_leaf(&p)),
            CorruptReason::OutOfBounds {
                field: "count",
                value: 200,
                ..
            }
        ));
        let mut p = good.clone();
        p[P_COUNT] = 0;
        assert!(matches!(
            corruption(one_leaf(&p)),
            CorruptReason::Inconsistent(_)
        ));
        let mut p = good.clone();
        p[P_FS_ID] ^= 1;
        assert!(matches!(
            corruption(one_leaf(&p)),
            CorruptReason::WrongFileSystem { .. }
        ));
        let mut p = good.clone();
        p[P_MAGIC] = b'X';
        assert!(matches!(
            corruption(one_leaf(&p)),
            CorruptReason::BadMagic { .. }
        ));
        let mut p = good.clone();
        p[P_ENTRIES + 3 * LEAF_ENTRY_BYTES + 27] = 0x80; // BUFFERED on disk
        assert!(matches!(
            corruption(one_leaf(&p)),
            CorruptReason::Inconsistent(_)
        ));
        let mut p = good.clone();
        put_u64(&mut p, P_ENTRIES + 5 * LEAF_ENTRY_BYTES + 8, 2); // keys out of order
        assert!(matches!(
            corruption(one_leaf(&p)),
            CorruptReason::Inconsistent(_)
        ));

        // Two leaves under an internal root.
        let a = d.put(&leaf_page(&entries[..5]));
        let b = d.put(&leaf_page(&entries[5..]));
        let root_of = |children: &[(Key, PagePtr)]| MapRoot {
            ptr: d.put(&internal_page(1, children)),
            height: 2,
            entries: 10,
        };
        let good_root = root_of(&[(key(1, 0), a), (key(1, 5), b)]);
        let mut m = Map::open(FS, 0, Some(good_root), &d).unwrap();
        assert_eq!(contents(&mut m, &d), entries);
        // The parent's key is not the leaf's first key.
        let r = root_of(&[(key(1, 0), a), (key(1, 6), b)]);
        let mut m = Map::open(FS, 0, Some(r), &d).unwrap();
        assert_eq!(m.get(key(1, 1), &d).unwrap(), Some(seq_entry(1)));
        assert!(matches!(
            corruption(m.get(key(1, 7), &d).unwrap_err()),
            CorruptReason::Inconsistent(_)
        ));
        // A leaf holds keys at or beyond its next sibling's key.
        let r = root_of(&[
            (key(1, 0), a),
            (key(1, 4), d.put(&leaf_page(&entries[4..]))),
        ]);
        let r = MapRoot { entries: 11, ..r };
        let mut m = Map::open(FS, 0, Some(r), &d).unwrap();
        assert_eq!(m.get(key(1, 7), &d).unwrap(), Some(seq_entry(7)));
        assert!(matches!(
            corruption(m.get(key(1, 1), &d).unwrap_err()),
            CorruptReason::Inconsistent(_)
        ));
        // The root at the wrong level, the same page twice, bad heights.
        let r = MapRoot {
            height: 3,
            ..good_root
        };
        assert!(matches!(
            corruption(Map::open(FS, 0, Some(r), &d).err().unwrap()),
            CorruptReason::Inconsistent(_)
        ));
        let r = root_of(&[(key(1, 0), a), (key(1, 5), a)]);
        assert!(matches!(
            corruption(Map::open(FS, 0, Some(r), &d).err().unwrap()),
            CorruptReason::Inconsistent(_)
        ));
        for height in [0, MAX_HEIGHT + 1] {
            let r = MapRoot {
                height,
                ..good_root
            };
            assert!(matches!(
                corruption(Map::open(FS, 0, Some(r), &d).err().unwrap()),
                CorruptReason::OutOfBounds { .. }
            ));
        }
        // A root from another file system.
        assert!(matches!(
            corruption(Map::open(FS + 1, 0, Some(good_root), &d).err().unwrap()),
            CorruptReason::WrongFileSystem { .. }
        ));
    }

    #[test]
    fn every_flipped_byte_is_handled() {
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        let mut k = 0;
        let entries: Vec<_> = (0..LEAF_CAPACITY)
            .map(|_| {
                k += rng.gen_range(1..1000);
                (key(k / 5000, k), entry(&mut rng))
            })
            .collect();
        let children: Vec<_> = entries[..100]
            .iter()
            .map(|(k, e)| {
                (
                    *k,
                    PagePtr {
                        addr: e.addr,
                        crc: e.crc,
                    },
                )
            })
            .collect();
        let pages = [
            (0u8, leaf_page(&entries)),
            (2u8, internal_page(2, &children)),
        ];
        for (level, good) in &pages {
            let used = P_ENTRIES
                + if *level == 0 {
                    LEAF_CAPACITY * LEAF_ENTRY_BYTES
                } else {
                    children.len() * INTERNAL_ENTRY_BYTES
                };
            assert!(decode_page(good, 4096, FS, *level).is_ok());
            assert!(decode_page(good, 4096, FS, level ^ 1).is_err());
            for i in 0..PAGE_BYTES {
                for x in [0x01u8, 0x80, 0xff] {
                    let mut p = good.clone();
                    p[i] ^= x;
                    let res = decode_page(&p, 4096, FS, *level);
                    if i < P_ENTRIES || i >= used {
                        let e = res.expect_err("header and padding flips are caught");
                        assert_eq!((e.what, e.offset), ("map page", 4096));
                    }
                }
            }
        }
        for len in [0, 1, 15, 16, PAGE_BYTES - 1, PAGE_BYTES + 1] {
            assert!(decode_page(&vec![0; len], 0, FS, 0).is_err());
        }
    }

    proptest! {
        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..5000), level in 0u8..4) {
            let _ = decode_page(&bytes, 0, FS, level);
        }

        #[test]
        fn random_bodies_never_panic(
            body in proptest::collection::vec(any::<u8>(), PAGE_BYTES),
            level in 0u8..3,
            count in 0u16..200,
            sorted in any::<bool>(),
        ) {
            let mut p = body;
            put_header(&mut p[..P_ENTRIES], FS, level, 0);
            p[P_COUNT..P_COUNT + 2].copy_from_slice(&count.to_le_bytes());
            if sorted {
                let size = if level == 0 { LEAF_ENTRY_BYTES } else { INTERNAL_ENTRY_BYTES };
                for i in 0..(count as usize).min((PAGE_BYTES - P_ENTRIES) / size) {
                    put_u64(&mut p, P_ENTRIES + i * size, 1);
                    put_u64(&mut p, P_ENTRIES + i * size + 8, i as u64);
                }
            }
            let _ = decode_page(&p, 0, FS, level);
        }
    }

    /// `cargo test --release -p ldfs lld::map::tests::ten_million -- --ignored --nocapture`
    #[test]
    #[ignore]
    fn ten_million_sequential_inserts() {
        let d = Disk::new();
        let mut m = Map::new(FS, 64 << 20);
        let t = Instant::now();
        for i in 0..10_000_000u64 {
            m.insert(key(1, i), seq_entry(i), &d).unwrap();
        }
        let insert = t.elapsed();
        let before = m.memory_bytes();
        let t = Instant::now();
        let mut next = 1u64 << 20;
        m.write_dirty(&mut |_| {
            next += PAGE_BYTES as u64;
            Ok(next)
        })
        .unwrap();
        let written = t.elapsed();
        m.evict();
        println!(
            "10M sequential inserts: {insert:?}; write_dirty of {} pages: {written:?}; \
             leaves {}, height {}; memory {} MiB before write, {} MiB after evict (budget 64 MiB)",
            m.total_pages(),
            m.leaf_count(),
            m.height,
            before >> 20,
            m.memory_bytes() >> 20
        );
        assert!(m.leaf_count() <= 10_000_000 / LEAF_CAPACITY + 1);
        assert!(m.memory_bytes() <= (64 << 20) + (16 << 20));
    }
}
