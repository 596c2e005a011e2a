//! What the open ARUs changed, kept so that one of them can be taken back
//! (`LogicalDisk::abort_aru`) while every other operation stands.
//!
//! ARUs give recovery atomicity, not isolation: reads see an ARU's changes at
//! once, and other operations (other ARUs, operations outside any) may change
//! the same keys before it ends. An abort makes the map what it would be had
//! the ARU never issued its operations — which is also what recovery makes of
//! an ARU that never ended, since it skips that ARU's records and applies the
//! rest in log order. Every operation sets a key to a version (a map entry,
//! or absent) whatever it held, so for each key that an open ARU changed a
//! *chain* is kept: the version before the first such change (`base`) and
//! every change since, oldest first, each with its ARU (0 for operations
//! outside ARUs and for ARUs that have ended). Aborting drops the ARU's
//! changes; the key's version becomes that of the last change left, or the
//! base. A chain is dropped once no open ARU has a change in it.
//!
//! Range deletions by an open ARU (a truncated or deleted file) may remove
//! millions of blocks nobody else touches. Their removed entries are kept as
//! a *bulk*: a sorted vector, 40 bytes a block (what the removal has
//! materialized anyway), turned into chains only for keys a later operation
//! touches.
//!
//! Invariants:
//! - a chain's current version is the map's entry for its key (the engine
//!   asserts it when it restores one); an untaken bulk entry's key is absent
//!   from the map;
//! - chains and bulks exist only while an ARU that logged something is
//!   open, so no checkpoint is written meanwhile (the engine asserts it):
//!   every segment holding a version they name is still unreleased, since
//!   only checkpoints release segments;
//! - a version in the open partial segment names a record slot whose write
//!   is still there: the writer drops a buffered write only when a write of
//!   no ARU or of the same ARU replaces it, and such a change is never taken
//!   back while the replaced one stays (changes of one ARU in a row collapse
//!   into the last), or at the end of an ARU that replaced it, and then only
//!   for a key no chain names (`touches`). `sealed` turns slots into device
//!   addresses.

use std::collections::{BTreeMap, BTreeSet};

use rustc_hash::FxHashMap;

use super::types::{Key, MapEntry};

/// A key's version: its map entry, or `None` when absent.
pub(crate) type Version = Option<MapEntry>;

/// A key an abort gives back: the map goes from `from` (the aborted ARU's
/// version) to `to`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Restore {
    pub key: Key,
    pub from: Version,
    pub to: Version,
}

struct Chain {
    base: Version,
    /// `(aru, version)`, oldest first; no two neighbours share an ARU.
    changes: Vec<(u64, Version)>,
}

impl Chain {
    fn current(&self) -> Version {
        self.changes.last().map_or(self.base, |c| c.1)
    }

    fn push(&mut self, aru: u64, v: Version) {
        match self.changes.last_mut() {
            Some(last) if last.0 == aru => last.1 = v,
            _ => self.changes.push((aru, v)),
        }
    }

    /// Rewrites `aru`'s changes as `to` (0: ended), or drops them (`None`),
    /// keeping the last of each run of one ARU.
    fn retag(&mut self, aru: u64, to: Option<u64>) {
        let mut out: Vec<(u64, Version)> = Vec::with_capacity(self.changes.len());
        for &(a, v) in &self.changes {
            let a = match (a == aru, to) {
                (true, None) => continue,
                (true, Some(t)) => t,
                (false, _) => a,
            };
            match out.last_mut() {
                Some(last) if last.0 == a => last.1 = v,
                _ => out.push((a, v)),
            }
        }
        self.changes = out;
    }

    /// Folds the leading changes of no open ARU into the base; returns
    /// whether no open ARU is left in the chain.
    fn settle(&mut self) -> bool {
        let k = self.changes.iter().take_while(|c| c.0 == 0).count();
        if k > 0 {
            self.base = self.changes[k - 1].1;
            self.changes.drain(..k);
        }
        self.changes.is_empty()
    }

    fn rename_version(&mut self, from: &MapEntry, to: MapEntry) {
        if self.base.as_ref() == Some(from) {
            self.base = Some(to);
        }
        for c in &mut self.changes {
            if c.1.as_ref() == Some(from) {
                c.1 = Some(to);
            }
        }
    }
}

/// Blocks one range deletion of an open ARU removed from keys that had no
/// chain, in key order. A taken entry (its key got a chain) has length 0:
/// blocks are at least a byte long.
struct Bulk {
    aru: u64,
    from: Key,
    to: Key,
    entries: Vec<(Key, MapEntry)>,
    /// Entries not yet taken.
    left: usize,
}

impl Bulk {
    fn take(&mut self, key: Key) -> Option<MapEntry> {
        if key < self.from || key >= self.to {
            return None;
        }
        let i = self.entries.binary_search_by_key(&key, |e| e.0).ok()?;
        let e = &mut self.entries[i].1;
        if e.len == 0 {
            return None;
        }
        let found = *e;
        e.len = 0;
        self.left -= 1;
        Some(found)
    }
}

#[derive(Default)]
pub(crate) struct Undo {
    chains: BTreeMap<Key, Chain>,
    bulks: Vec<Bulk>,
    /// Per open ARU: the keys whose chains hold a change of it.
    keys: FxHashMap<u64, BTreeSet<Key>>,
}

impl Undo {
    /// Nothing is kept: no open ARU has changed anything.
    pub fn is_empty(&self) -> bool {
        self.chains.is_empty() && self.bulks.is_empty()
    }

    /// Whether an open ARU changed `key` (the cleaner leaves such keys alone:
    /// a move is logged outside any ARU and would commit the change early).
    pub fn touches(&self, key: Key) -> bool {
        self.chains.contains_key(&key)
    }

    fn note(&mut self, aru: u64, key: Key) {
        if aru != 0 {
            self.keys.entry(aru).or_default().insert(key);
        }
    }

    /// The chain of `key`, made from a bulk entry if one holds it.
    fn chain_mut(&mut self, key: Key) -> Option<&mut Chain> {
        if !self.chains.contains_key(&key) {
            let taken = self
                .bulks
                .iter_mut()
                .find_map(|b| b.take(key).map(|e| (b.aru, e)));
            if let Some((aru, e)) = taken {
                self.bulks.retain(|b| b.left > 0);
                self.chains.insert(
                    key,
                    Chain {
                        base: Some(e),
                        changes: vec![(aru, None)],
                    },
                );
                self.note(aru, key);
            }
        }
        self.chains.get_mut(&key)
    }

    /// `aru` (0: none) changed `key` from `old` to `new`.
    pub fn changed(&mut self, aru: u64, key: Key, old: Version, new: Version) {
        if let Some(c) = self.chain_mut(key) {
            c.push(aru, new);
        } else if aru != 0 && old != new {
            self.chains.insert(
                key,
                Chain {
                    base: old,
                    changes: vec![(aru, new)],
                },
            );
        } else {
            return;
        }
        self.note(aru, key);
    }

    /// `aru` (0: none) deleted every key in `[from, to)`; `removed` are the
    /// entries that were there, in key order.
    pub fn removed_range(&mut self, aru: u64, from: Key, to: Key, removed: Vec<(Key, MapEntry)>) {
        // Keys an open ARU's earlier range deletion removed: this deletion
        // removes them too, which must stand if that ARU is aborted.
        let mut taken = Vec::new();
        for b in &mut self.bulks {
            if b.to <= from || to <= b.from {
                continue;
            }
            let lo = b.entries.partition_point(|e| e.0 < from);
            for (k, e) in &mut b.entries[lo..] {
                if *k >= to {
                    break;
                }
                if e.len != 0 {
                    taken.push((b.aru, *k, *e));
                    e.len = 0;
                    b.left -= 1;
                }
            }
        }
        for (owner, k, e) in taken {
            self.chains.insert(
                k,
                Chain {
                    base: Some(e),
                    changes: vec![(owner, None)],
                },
            );
            self.note(owner, k);
        }
        let mut chained = Vec::new();
        for (k, c) in self.chains.range_mut(from..to) {
            c.push(aru, None);
            chained.push(*k);
        }
        self.bulks.retain(|b| b.left > 0);
        if aru == 0 {
            return;
        }
        for k in chained {
            self.note(aru, k);
        }
        let fresh: Vec<(Key, MapEntry)> = removed
            .into_iter()
            .filter(|(k, _)| !self.chains.contains_key(k))
            .collect();
        if !fresh.is_empty() {
            self.bulks.push(Bulk {
                aru,
                from,
                to,
                left: fresh.len(),
                entries: fresh,
            });
        }
    }

    /// A buffered version of `key` was written to the device: versions
    /// naming its slot now name its address.
    pub fn sealed(&mut self, key: Key, buffered: &MapEntry, on_disk: MapEntry) {
        if let Some(c) = self.chains.get_mut(&key) {
            c.rename_version(buffered, on_disk);
        }
        for b in &mut self.bulks {
            if key < b.from || key >= b.to {
                continue;
            }
            if let Ok(i) = b.entries.binary_search_by_key(&key, |e| e.0) {
                if b.entries[i].1 == *buffered {
                    b.entries[i].1 = on_disk;
                }
            }
        }
    }

    /// `aru` ended: its changes stand.
    pub fn end(&mut self, aru: u64) {
        self.bulks.retain(|b| b.aru != aru);
        for k in self.keys.remove(&aru).unwrap_or_default() {
            if let Some(c) = self.chains.get_mut(&k) {
                c.retag(aru, Some(0));
                if c.settle() {
                    self.chains.remove(&k);
                }
            }
        }
    }

    /// `aru` is taken back: returns every key whose version changes, with
    /// the version it leaves and the one it gets.
    pub fn abort(&mut self, aru: u64) -> Vec<Restore> {
        let mut out = Vec::new();
        let mut kept = Vec::with_capacity(self.bulks.len());
        for b in std::mem::take(&mut self.bulks) {
            if b.aru != aru {
                kept.push(b);
                continue;
            }
            out.extend(
                b.entries
                    .into_iter()
                    .filter(|e| e.1.len != 0)
                    .map(|(key, e)| Restore {
                        key,
                        from: None,
                        to: Some(e),
                    }),
            );
        }
        self.bulks = kept;
        for k in self.keys.remove(&aru).unwrap_or_default() {
            let Some(c) = self.chains.get_mut(&k) else {
                continue;
            };
            let from = c.current();
            c.retag(aru, None);
            let to = c.current();
            if from != to {
                out.push(Restore { key: k, from, to });
            }
            if c.settle() {
                self.chains.remove(&k);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    //! The undo log against a model: random changes by a few ARUs (and by
    //! none), ends and aborts; after each, the map (as the engine would keep
    //! it: the last change applied, restores applied on abort) must equal
    //! replaying the surviving operations in order.

    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    #[derive(Clone, Debug)]
    enum Op {
        Set(Key, Version),
        Range(Key, Key),
    }

    fn key(i: u64) -> Key {
        Key { list: 1, index: i }
    }

    fn entry(n: u64) -> MapEntry {
        MapEntry {
            addr: n,
            len: 1 + n as u32 % 7,
            crc: n as u32,
            flags: 0,
        }
    }

    fn replay(log: &[(u64, Op)]) -> BTreeMap<Key, MapEntry> {
        let mut m = BTreeMap::new();
        for (_, op) in log {
            match op {
                Op::Set(k, Some(e)) => {
                    m.insert(*k, *e);
                }
                Op::Set(k, None) => {
                    m.remove(k);
                }
                Op::Range(a, z) => m.retain(|k, _| !(a..z).contains(&k)),
            }
        }
        m
    }

    #[test]
    fn aborts_leave_what_replaying_the_rest_gives() {
        for seed in 0..300u64 {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let mut undo = Undo::default();
            let mut map: BTreeMap<Key, MapEntry> = BTreeMap::new();
            let mut log: Vec<(u64, Op)> = Vec::new();
            let mut open: Vec<u64> = Vec::new();
            let mut next_aru = 1;
            let mut next_entry = 1;
            for step in 0..200 {
                match rng.gen_range(0..100) {
                    0..=9 if open.len() < 3 => {
                        open.push(next_aru);
                        next_aru += 1;
                    }
                    10..=19 if !open.is_empty() => {
                        let a = open.swap_remove(rng.gen_range(0..open.len()));
                        if rng.gen_bool(0.5) {
                            undo.end(a);
                            for e in log.iter_mut().filter(|e| e.0 == a) {
                                e.0 = 0;
                            }
                        } else {
                            for r in undo.abort(a) {
                                assert_eq!(map.get(&r.key).copied(), r.from, "seed {seed}");
                                match r.to {
                                    Some(e) => map.insert(r.key, e),
                                    None => map.remove(&r.key),
                                };
                            }
                            log.retain(|e| e.0 != a);
                        }
                    }
                    _ => {
                        let aru = if !open.is_empty() && rng.gen_bool(0.7) {
                            open[rng.gen_range(0..open.len())]
                        } else {
                            0
                        };
                        let k = key(rng.gen_range(0..12));
                        match rng.gen_range(0..10) {
                            0..=5 => {
                                let e = entry(next_entry);
                                next_entry += 1;
                                let old = map.insert(k, e);
                                undo.changed(aru, k, old, Some(e));
                                log.push((aru, Op::Set(k, Some(e))));
                            }
                            6..=7 => {
                                let old = map.remove(&k);
                                undo.changed(aru, k, old, None);
                                log.push((aru, Op::Set(k, None)));
                            }
                            _ => {
                                let z = key(k.index + rng.gen_range(1..6));
                                let removed: Vec<(Key, MapEntry)> =
                                    map.range(k..z).map(|(k, e)| (*k, *e)).collect();
                                map.retain(|x, _| !(k..z).contains(x));
                                undo.removed_range(aru, k, z, removed);
                                log.push((aru, Op::Range(k, z)));
                            }
                        }
                    }
                }
                assert_eq!(map, replay(&log), "seed {seed} step {step}");
                if open.is_empty() {
                    assert!(undo.is_empty(), "seed {seed} step {step}");
                }
            }
        }
    }

    #[test]
    fn sealed_versions_are_restored_by_address() {
        let mut undo = Undo::default();
        let buffered = MapEntry {
            addr: 3,
            len: 10,
            crc: 7,
            flags: crate::lld::types::entry_flags::BUFFERED,
        };
        let on_disk = MapEntry {
            addr: 1 << 20,
            len: 10,
            crc: 7,
            flags: 0,
        };
        let mine = entry(9);
        // A block written outside any ARU is still buffered when ARU 1
        // replaces it; then the partial is sealed; then ARU 1 is aborted.
        undo.changed(1, key(0), Some(buffered), Some(mine));
        // ARU 1 also removes a range holding another buffered block.
        undo.removed_range(1, key(5), key(9), vec![(key(6), buffered)]);
        undo.sealed(key(0), &buffered, on_disk);
        undo.sealed(key(6), &buffered, on_disk);
        let mut got = undo.abort(1);
        got.sort_by_key(|r| r.key);
        assert_eq!(
            got,
            vec![
                Restore {
                    key: key(0),
                    from: Some(mine),
                    to: Some(on_disk)
                },
                Restore {
                    key: key(6),
                    from: None,
                    to: Some(on_disk)
                },
            ]
        );
        assert!(undo.is_empty());
    }
}
