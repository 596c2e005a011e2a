//! `ldfs fsck`, `ldfs inspect` and `ldfs clean` given the cache of a store-backed file system
//! (issue 20: "fsck, inspect and clean work on a store-backed file system").
//!
//! A cache is recognised by its note (`PATH.ldfs-store`, [`super::store::note_path`]), which
//! names the store. Checking is read-only and needs nothing more: fsck checks the cache as an
//! image and, with the store's environment set (as for a mount), that every segment object the
//! store's newest checkpoint object names is there with its size. Changing the cache offline
//! (`fsck -y`/`-p`, `clean IMAGE`) is refused: the uploader sends only what a mount's durable
//! checkpoints hand it and the lease guards the one writer, so a change made behind the store's
//! back would be either lost at the next rebuild or uploaded by no one in order; a mount and the
//! online commands do it with the lease held, and a damaged cache is replaced by mounting with
//! an empty one, rebuilt from the store.

use std::collections::BTreeMap;
use std::path::Path;

use ldfs::lld::PAGE_BYTES;
use ldfs::store::segments::{
    newest_checkpoint, newest_checkpoint_key, newest_complete_checkpoint, parse_checkpoint_key,
};
use ldfs::store::ObjectStore;

use super::store::{note_path, StoreUrl, READER};

/// What a store cache's note says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheNote {
    pub url: StoreUrl,
    pub fs_id: u64,
    /// The lease generation of the last read-write mount on the cache; [`READER`] for a cache
    /// only read-only mounts used.
    pub writer: u64,
}

/// The note of `cache` if it is a store cache (its note exists); an error if the note is
/// there but does not read.
pub fn store_cache(cache: &Path) -> Result<Option<CacheNote>, String> {
    if let Some(why) = super::store::ambiguous_note(cache) {
        return Err(why);
    }
    let p = note_path(cache);
    let text = match std::fs::read_to_string(&p) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", p.display())),
    };
    let mut kv = BTreeMap::new();
    for l in text.lines() {
        if let Some((k, v)) = l.split_once('=') {
            kv.insert(k.trim(), v.trim());
        }
    }
    let bad = |what: &str| {
        format!(
            "{}: the note of a store cache without a readable {what}",
            p.display()
        )
    };
    let url = StoreUrl::parse(kv.get("store").ok_or_else(|| bad("store="))?)
        .map_err(|e| format!("{}: {e}", p.display()))?;
    let fs_id = kv
        .get("fs_id")
        .and_then(|v| u64::from_str_radix(v, 16).ok())
        .ok_or_else(|| bad("fs_id="))?;
    let writer = kv
        .get("writer")
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| bad("writer="))?;
    Ok(Some(CacheNote { url, fs_id, writer }))
}

impl CacheNote {
    /// One line saying what the cache is.
    pub fn describe(&self, cache: &Path) -> String {
        format!(
            "{} is the cache of the store-backed file system {} (fs id {:016x}; {}; note {})",
            cache.display(),
            self.url,
            self.fs_id,
            match self.writer {
                READER => "used by read-only mounts only".to_string(),
                w => format!("last mounted read-write as writer {w}"),
            },
            note_path(cache).display()
        )
    }

    /// Why `what` (an offline change) is refused, and what to do instead.
    pub fn refusal(&self, cache: &Path, what: &str) -> String {
        format!(
            "{} is the cache of the store-backed file system {}: {what} would change it behind \
             the store's back (only a mount holding the store's lease uploads changes). Mount it \
             (ldfs mount {} MNT --cache {}) and use the online commands (ldfs clean MNT, ldfs \
             scrub MNT); to replace a damaged cache, move it away and mount with an empty one, \
             which is rebuilt from the store's last checkpoint. `ldfs fsck -n` checks it.",
            cache.display(),
            self.url,
            self.url,
            cache.display()
        )
    }
}

/// What [`check_store`] found.
#[derive(Debug, Default)]
pub struct StoreCheck {
    pub problems: Vec<String>,
    pub notes: Vec<String>,
}

/// Checks the store of a cache: it holds a checkpoint object of the cache's file system, and
/// every segment object the newest one names is there with the size it names (a listing: one
/// request per 1,000 objects, nothing downloaded but the checkpoint object). A missing or
/// short object is a problem naming its key and segment.
///
/// A writer uploading meanwhile deletes what a checkpoint named once two newer ones are up, so
/// problems found about a checkpoint that is no longer the newest when they are found are
/// checked again with the new newest (review 33; `restore` does the same, review 32).
pub fn check_store(store: &dyn ObjectStore, note: &CacheNote) -> Result<StoreCheck, String> {
    let mut tries = 0;
    loop {
        let (c, key) = check_store_once(store, note)?;
        tries += 1;
        if c.problems.is_empty() || tries >= 5 {
            return Ok(c);
        }
        let now = newest_checkpoint_key(store).map_err(|e| format!("{}: {e}", note.url))?;
        if now == key {
            return Ok(c);
        }
    }
}

/// One pass of [`check_store`], and the key of the checkpoint object it checked.
fn check_store_once(
    store: &dyn ObjectStore,
    note: &CacheNote,
) -> Result<(StoreCheck, Option<String>), String> {
    let url = &note.url;
    let mut c = StoreCheck::default();
    let Some((key, obj)) = newest_checkpoint(store).map_err(|e| format!("{url}: {e}"))? else {
        c.problems
            .push(format!("{url} holds no checkpoint object (no file system)"));
        return Ok((c, None));
    };
    if obj.geo.fs_id != note.fs_id {
        c.problems.push(format!(
            "{url} holds file system {:016x} ({key}); the cache is of {:016x}",
            obj.geo.fs_id, note.fs_id
        ));
        return Ok((c, Some(key)));
    }
    let sizes: BTreeMap<String, u64> = store
        .list("seg/")
        .map_err(|e| format!("{url}: {e}"))?
        .into_iter()
        .map(|o| (o.key, o.size_bytes))
        .collect();
    let mut bytes = 0u64;
    for e in &obj.entries {
        let k = e.key();
        let want = e.pages as u64 * PAGE_BYTES as u64;
        bytes += want;
        match sizes.get(&k) {
            None => c.problems.push(format!(
                "segment object {k} (segment {}, {} pages) named by {key} is missing from {url}",
                e.segment, e.pages
            )),
            Some(&n) if n != want => c.problems.push(format!(
                "segment object {k} (segment {}) in {url} holds {n} bytes; {key} names {} pages \
                 ({want} bytes)",
                e.segment, e.pages
            )),
            Some(_) => {}
        }
    }
    if c.problems.is_empty() {
        c.notes.push(format!(
            "{url}: {key} (checkpoint {}) and all {} segment objects it names ({bytes} bytes) are there with their sizes",
            obj.serial,
            obj.entries.len()
        ));
    } else if let Ok(Some((complete, o))) = newest_complete_checkpoint(store) {
        c.notes.push(format!(
            "{url}: the newest checkpoint object whose segment objects are all there is {complete} (checkpoint {}): a cache rebuilt from the store gets it",
            o.serial
        ));
    }
    let (newest_writer, _) = parse_checkpoint_key(&key).expect("newest_checkpoint parsed it");
    if note.writer != READER && newest_writer > note.writer {
        c.notes.push(format!(
            "a later writer (lease generation {newest_writer}) uploaded {key} after this cache \
             was last mounted read-write (as writer {}): a read-write mount refuses it",
            note.writer
        ));
    }
    Ok((c, Some(key)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notes_are_recognised() {
        let d = tempfile::tempdir().unwrap();
        let cache = d.path().join("c.img");
        assert_eq!(store_cache(&cache).unwrap(), None);
        let u = StoreUrl::parse("s3://b/p").unwrap();
        super::super::store::write_note(&cache, &u, 0xabc, 7).unwrap();
        let n = store_cache(&cache).unwrap().unwrap();
        assert_eq!(
            (n.url.to_string().as_str(), n.fs_id, n.writer),
            ("s3://b/p", 0xabc, 7)
        );
        assert!(n.describe(&cache).contains("writer 7"));
        assert!(n
            .refusal(&cache, "a repair")
            .contains("ldfs mount s3://b/p MNT --cache"));
        std::fs::write(note_path(&cache), "fs_id=12\n").unwrap();
        assert!(store_cache(&cache).unwrap_err().contains("store="));
    }

    #[test]
    fn missing_and_short_objects_are_named() {
        use ldfs::device::{Device, MemoryDevice};
        use ldfs::store::{HeldLease, LeaseOptions, MemoryStore, SegmentStore};
        use std::sync::Arc;
        let store = Arc::new(MemoryStore::new());
        let dev: Arc<dyn Device> = Arc::new(MemoryDevice::new(64 << 20));
        ldfs::lld::mkfs::mkfs(&*dev, &Default::default()).unwrap();
        let lease =
            Arc::new(HeldLease::acquire(store.clone(), "h", 1, LeaseOptions::default()).unwrap());
        let seg =
            SegmentStore::start(store.clone(), dev, lease.clone(), Default::default()).unwrap();
        let lld = ldfs::lld::Lld::open(
            seg.device(),
            ldfs::lld::LldOptions {
                checkpoint_hook: Some(seg.hook()),
                segment_hook: Some(seg.segment_hook()),
                ..Default::default()
            },
        )
        .unwrap();
        // Some data, so that the checkpoint names segment objects.
        use ldfs::ld::{ListHints, LogicalDisk};
        let l = lld.create_list(None, ListHints::default()).unwrap();
        for i in 0..64u64 {
            lld.write(None, l, i, &[i as u8; 16 << 10]).unwrap();
        }
        lld.flush().unwrap();
        lld.checkpoint_now().unwrap();
        seg.wait_uploaded(seg.announced(), std::time::Duration::from_secs(10))
            .unwrap();
        let fs_id = lld.geometry().fs_id;
        lld.close().unwrap();
        seg.stop();
        let note = CacheNote {
            url: StoreUrl::parse("s3://b").unwrap(),
            fs_id,
            writer: lease.writer(),
        };
        let c = check_store(&*store, &note).unwrap();
        assert!(c.problems.is_empty(), "{c:?}");
        assert!(c.notes[0].contains("are there with their sizes"), "{c:?}");
        let (_, obj) = newest_checkpoint(&*store).unwrap().unwrap();
        assert!(!obj.entries.is_empty());
        let k = obj.entries[0].key();
        store.put(&k, b"short").unwrap();
        let c = check_store(&*store, &note).unwrap();
        assert!(
            c.problems[0].contains(&k) && c.problems[0].contains("holds 5 bytes"),
            "{c:?}"
        );
        store.delete(&k).unwrap();
        let c = check_store(&*store, &note).unwrap();
        assert!(
            c.problems[0].contains(&format!(
                "segment object {k} (segment {}",
                obj.entries[0].segment
            )) && c.problems[0].contains("is missing"),
            "{c:?}"
        );
        let other = CacheNote { fs_id: 1, ..note };
        let c = check_store(&*store, &other).unwrap();
        assert!(c.problems[0].contains("the cache is of"), "{c:?}");
    }
}
