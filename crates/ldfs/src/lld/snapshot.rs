//! Snapshots: checkpoints the engine keeps (docs/DESIGN.md "Snapshots",
//! docs/FORMAT.md "Checkpoint slot").
//!
//! A snapshot's record (its checkpoint's map root, next list id, name and
//! pin bit) lives in the checkpoint slot's header page, so the table
//! changes only with a durable checkpoint. The segments its tree needs
//! carry its pin bit in the usage table and are never released or cleaned
//! while it is kept. On an image with the kept table
//! (`INCOMPAT_KEPT_TABLE`), protected checkpoints have compact records in
//! the slot's kept-table pages instead (`encode_kept`), and those of one
//! generation share a pin bit. Invariants (checked by `decode_table` and
//! `decode_kept` on every slot read and asserted before every encode): at
//! most `MAX_SNAPSHOTS` header records and `kept_capacity` table records,
//! each sorted by number, numbers distinct over both, every number at most
//! the slot's serial, a snapshot's pin bit no other record's, protected
//! records' bits distinct too unless the image shares them (kept table),
//! names at most `MAX_NAME_BYTES` of UTF-8.
//!
//! A reader of a snapshot in another process holds an open file description
//! lock on one byte of the image per snapshot (`SnapshotLock`), which a
//! deletion must take exclusively: a mounted snapshot cannot be deleted.

use std::fs::File;
use std::os::fd::AsRawFd;

use super::codec::{get_u32, get_u64, put_u32, put_u64};
use super::types::{PagePtr, PAGE_BYTES};
use super::usage::PIN_BITS;
use crate::ld::{CorruptReason, Corruption};

/// Snapshots one slot can hold: one per pin bit.
pub const MAX_SNAPSHOTS: usize = PIN_BITS as usize;
/// Longest name, in bytes.
pub const MAX_NAME_BYTES: usize = 64;
/// Bytes of one record in the slot.
pub const RECORD_BYTES: usize = 128;
/// Where the count and the records start in the slot's header page.
pub const TABLE_COUNT_AT: usize = 116;
pub const TABLE_AT: usize = 128;

const S_NUMBER: usize = 0;
const S_TIME: usize = 8;
const S_MAP_ADDR: usize = 16;
const S_MAP_CRC: usize = 24;
const S_MAP_HEIGHT: usize = 28;
const S_PIN: usize = 29;
const S_NAME_LEN: usize = 30;
const S_KIND: usize = 31;
const S_MAP_ENTRIES: usize = 32;
const S_NEXT_LIST: usize = 40;
const S_NAME: usize = 56;

/// Bytes of one kept-table record (a protected checkpoint; FORMAT).
pub const KEPT_RECORD_BYTES: usize = 48;
/// Where the kept-table record count is in the slot's header page.
pub const KEPT_COUNT_AT: usize = 120;

const K_NUMBER: usize = 0;
const K_TIME: usize = 8;
const K_MAP_ADDR: usize = 16;
const K_MAP_CRC: usize = 24;
const K_MAP_HEIGHT: usize = 28;
const K_PIN: usize = 29;
const K_ZERO: usize = 30;
const K_MAP_ENTRIES: usize = 32;
const K_NEXT_LIST: usize = 40;

const _: () = assert!(TABLE_AT + MAX_SNAPSHOTS * RECORD_BYTES <= PAGE_BYTES);
const _: () = assert!(K_NEXT_LIST + 8 == KEPT_RECORD_BYTES);

/// Protected-checkpoint records `kept_pages` pages of kept table hold.
pub fn kept_capacity(kept_pages: u32) -> usize {
    kept_pages as usize * PAGE_BYTES / KEPT_RECORD_BYTES
}
const _: () = assert!(S_NAME + MAX_NAME_BYTES <= RECORD_BYTES);

/// One kept checkpoint, as the slot records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotRecord {
    /// The serial of the checkpoint it keeps.
    pub number: u64,
    /// Seconds since 1970 as the caller gave them (shown, never compared).
    pub time_secs: u64,
    /// Map root, height, entries; `None` for an empty map.
    pub map_root: Option<(PagePtr, u8, u64)>,
    pub next_list: u64,
    /// The usage table's pin bit for this snapshot's segments.
    pub pin: u32,
    pub name: String,
    /// A protected checkpoint (`protect=`): kept like a snapshot, but its
    /// history counts as available and it yields when space runs short.
    pub protected: bool,
}

/// What `Engine::snapshots` reports about one snapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotInfo {
    pub number: u64,
    pub time_secs: u64,
    pub name: String,
    /// Map entries of its tree.
    pub entries: u64,
    /// Bytes its deletion would give back now: the segments pinned by it
    /// alone, less what the live tree still uses in them.
    pub held_alone_bytes: u64,
    /// Its pin bit: protected checkpoints sharing one are a generation,
    /// deleted together when space runs short.
    pub pin: u32,
    /// A protected checkpoint rather than a snapshot.
    pub protected: bool,
}

/// Checks a name given for a new snapshot.
pub fn check_name(name: &str) -> Result<(), String> {
    if name.len() > MAX_NAME_BYTES {
        return Err(format!(
            "snapshot name of {} bytes (at most {MAX_NAME_BYTES})",
            name.len()
        ));
    }
    if name.contains('\0') {
        return Err("snapshot name contains NUL".into());
    }
    Ok(())
}

/// Whether the pin bits of `table` are as the format allows: each below
/// `PIN_BITS`, a snapshot's used by no other record, and a protected
/// record's by no snapshot and, unless `shared` (the kept table's
/// generations), by no other record either.
pub fn pins_ok(table: &[SnapshotRecord], shared: bool) -> Result<(), String> {
    let mut snaps = 0u32;
    let mut protected = 0u32;
    for s in table {
        let bit = 1u32.checked_shl(s.pin).filter(|_| s.pin < PIN_BITS);
        let Some(bit) = bit else {
            return Err(format!("snapshot {}: pin bit {}", s.number, s.pin));
        };
        let taken = if s.protected && shared {
            snaps
        } else {
            snaps | protected
        };
        if taken & bit != 0 || (!s.protected && protected & bit != 0) {
            return Err(format!("snapshot {}: pin bit {} reused", s.number, s.pin));
        }
        if s.protected {
            protected |= bit;
        } else {
            snaps |= bit;
        }
    }
    Ok(())
}

/// Asserts the table's invariants (before encoding); `kept_pages` is the
/// image's kept table (0: every record lives in the header).
pub fn assert_table(table: &[SnapshotRecord], serial: u64, kept_pages: u32) {
    let in_header = table
        .iter()
        .filter(|s| kept_pages == 0 || !s.protected)
        .count();
    assert!(in_header <= MAX_SNAPSHOTS, "{in_header} snapshots");
    assert!(
        table.len() - in_header <= kept_capacity(kept_pages),
        "{} kept-table records",
        table.len() - in_header
    );
    for (i, s) in table.iter().enumerate() {
        assert!(
            s.number <= serial,
            "snapshot {} after serial {serial}",
            s.number
        );
        assert!(
            i == 0 || table[i - 1].number < s.number,
            "snapshots out of order"
        );
        assert!(check_name(&s.name).is_ok(), "bad snapshot name kept");
        assert!(
            kept_pages == 0 || !s.protected || s.name.is_empty(),
            "a named protected checkpoint"
        );
    }
    if let Err(why) = pins_ok(table, kept_pages > 0) {
        panic!("{why}");
    }
}

/// Writes the table into a slot's header page `b`: every record, or with
/// a kept table (`kept_pages` > 0) the snapshots only.
pub fn encode_table(b: &mut [u8], table: &[SnapshotRecord], serial: u64, kept_pages: u32) {
    assert_table(table, serial, kept_pages);
    let header: Vec<&SnapshotRecord> = table
        .iter()
        .filter(|s| kept_pages == 0 || !s.protected)
        .collect();
    put_u32(b, TABLE_COUNT_AT, header.len() as u32);
    for (i, s) in header.into_iter().enumerate() {
        let r = &mut b[TABLE_AT + i * RECORD_BYTES..TABLE_AT + (i + 1) * RECORD_BYTES];
        put_u64(r, S_NUMBER, s.number);
        put_u64(r, S_TIME, s.time_secs);
        if let Some((ptr, height, entries)) = s.map_root {
            assert!(ptr.addr != 0 && height >= 1);
            put_u64(r, S_MAP_ADDR, ptr.addr);
            put_u32(r, S_MAP_CRC, ptr.crc);
            r[S_MAP_HEIGHT] = height;
            put_u64(r, S_MAP_ENTRIES, entries);
        }
        r[S_PIN] = s.pin as u8;
        r[S_NAME_LEN] = s.name.len() as u8;
        r[S_KIND] = s.protected as u8;
        put_u64(r, S_NEXT_LIST, s.next_list);
        r[S_NAME..S_NAME + s.name.len()].copy_from_slice(s.name.as_bytes());
    }
}

/// The kept-table records of `table` (its protected checkpoints), as the
/// slot stores them after its usage table; the header's count field is
/// set in `header`.
pub fn encode_kept(header: &mut [u8], table: &[SnapshotRecord]) -> Vec<u8> {
    let kept: Vec<&SnapshotRecord> = table.iter().filter(|s| s.protected).collect();
    put_u32(header, KEPT_COUNT_AT, kept.len() as u32);
    let mut out = vec![0u8; kept.len() * KEPT_RECORD_BYTES];
    for (i, s) in kept.into_iter().enumerate() {
        let r = &mut out[i * KEPT_RECORD_BYTES..(i + 1) * KEPT_RECORD_BYTES];
        put_u64(r, K_NUMBER, s.number);
        put_u64(r, K_TIME, s.time_secs);
        if let Some((ptr, height, entries)) = s.map_root {
            assert!(ptr.addr != 0 && height >= 1);
            put_u64(r, K_MAP_ADDR, ptr.addr);
            put_u32(r, K_MAP_CRC, ptr.crc);
            r[K_MAP_HEIGHT] = height;
            put_u64(r, K_MAP_ENTRIES, entries);
        }
        r[K_PIN] = s.pin as u8;
        put_u64(r, K_NEXT_LIST, s.next_list);
    }
    out
}

/// Pages `records` kept-table records take.
pub fn kept_pages_for(records: usize) -> usize {
    (records * KEPT_RECORD_BYTES).div_ceil(PAGE_BYTES)
}

/// Reads `count` kept-table records from `b` (the slot's pages after its
/// usage table, crc already checked) at device byte `offset`. Every field
/// is bounded; the pin bits are checked with the header's records
/// (`pins_ok`) by the caller.
pub fn decode_kept(
    b: &[u8],
    count: usize,
    offset: u64,
    serial: u64,
    root_ok: impl Fn(u64) -> bool,
) -> Result<Vec<SnapshotRecord>, Corruption> {
    let bad = |at: usize, why: String| Corruption {
        what: "kept-checkpoint table",
        offset: offset + at as u64,
        reason: CorruptReason::Inconsistent(why),
    };
    if count * KEPT_RECORD_BYTES > b.len() {
        return Err(bad(0, format!("{count} records in {} bytes", b.len())));
    }
    let mut out: Vec<SnapshotRecord> = Vec::with_capacity(count);
    for i in 0..count {
        let at = i * KEPT_RECORD_BYTES;
        let r = &b[at..at + KEPT_RECORD_BYTES];
        let number = get_u64(r, K_NUMBER);
        if number == 0 || number > serial || out.last().is_some_and(|p| p.number >= number) {
            return Err(bad(
                at,
                format!("kept checkpoint number {number} (slot serial {serial})"),
            ));
        }
        let pin = r[K_PIN] as u32;
        if pin >= PIN_BITS || r[K_ZERO] != 0 || r[K_ZERO + 1] != 0 {
            return Err(bad(at, format!("kept checkpoint {number}: pin bit {pin}")));
        }
        let map_root = decode_root(
            get_u64(r, K_MAP_ADDR),
            get_u32(r, K_MAP_CRC),
            r[K_MAP_HEIGHT],
            get_u64(r, K_MAP_ENTRIES),
            &root_ok,
        )
        .map_err(|why| bad(at, format!("kept checkpoint {number}: {why}")))?;
        out.push(SnapshotRecord {
            number,
            time_secs: get_u64(r, K_TIME),
            map_root,
            next_list: get_u64(r, K_NEXT_LIST),
            pin,
            name: String::new(),
            protected: true,
        });
    }
    Ok(out)
}

/// A record's map root, bounded: address 0 (an empty map) with height 0,
/// else a height of 1..=16 and an address `root_ok` accepts.
fn decode_root(
    addr: u64,
    crc: u32,
    height: u8,
    entries: u64,
    root_ok: &impl Fn(u64) -> bool,
) -> Result<Option<(PagePtr, u8, u64)>, String> {
    if addr == 0 {
        if height != 0 {
            return Err(format!("empty map of height {height}"));
        }
        return Ok(None);
    }
    if height == 0 || height > 16 || !root_ok(addr) {
        return Err(format!("map root at byte {addr}, height {height}"));
    }
    Ok(Some((PagePtr { addr, crc }, height, entries)))
}

/// Reads the table of a slot whose crc already held. `root_ok` checks a
/// map root address against the geometry. Every field is bounded. With a
/// kept table (`kept`), the header holds snapshots only (a protected
/// record there is corrupt) and pin bits are checked by the caller, with
/// the kept table's records.
pub fn decode_table(
    b: &[u8],
    offset: u64,
    serial: u64,
    kept: bool,
    root_ok: impl Fn(u64) -> bool,
) -> Result<Vec<SnapshotRecord>, Corruption> {
    let bad = |at: usize, why: String| Corruption {
        what: "snapshot table",
        offset: offset + at as u64,
        reason: CorruptReason::Inconsistent(why),
    };
    let count = get_u32(b, TABLE_COUNT_AT) as usize;
    if count > MAX_SNAPSHOTS {
        return Err(Corruption {
            what: "snapshot table",
            offset: offset + TABLE_COUNT_AT as u64,
            reason: CorruptReason::OutOfBounds {
                field: "snapshot count",
                value: count as u64,
                limit: MAX_SNAPSHOTS as u64 + 1,
            },
        });
    }
    let mut out: Vec<SnapshotRecord> = Vec::with_capacity(count);
    let mut pins = 0u32;
    for i in 0..count {
        let at = TABLE_AT + i * RECORD_BYTES;
        let r = &b[at..at + RECORD_BYTES];
        let number = get_u64(r, S_NUMBER);
        if number == 0 || number > serial || out.last().is_some_and(|p| p.number >= number) {
            return Err(bad(
                at,
                format!("snapshot number {number} (slot serial {serial})"),
            ));
        }
        let pin = r[S_PIN] as u32;
        if pin >= PIN_BITS || pins & (1 << pin) != 0 {
            return Err(bad(at, format!("snapshot {number}: pin bit {pin}")));
        }
        pins |= 1 << pin;
        let len = r[S_NAME_LEN] as usize;
        if len > MAX_NAME_BYTES {
            return Err(bad(at, format!("snapshot {number}: name of {len} bytes")));
        }
        let protected = match r[S_KIND] {
            0 => false,
            1 if !kept => true,
            k => return Err(bad(at, format!("snapshot {number}: kind {k}"))),
        };
        let Ok(name) = std::str::from_utf8(&r[S_NAME..S_NAME + len]) else {
            return Err(bad(at, format!("snapshot {number}: name is not UTF-8")));
        };
        // What `encode_table` asserts of every kept name (no NUL).
        if let Err(why) = check_name(name) {
            return Err(bad(at, format!("snapshot {number}: {why}")));
        }
        let map_root = decode_root(
            get_u64(r, S_MAP_ADDR),
            get_u32(r, S_MAP_CRC),
            r[S_MAP_HEIGHT],
            get_u64(r, S_MAP_ENTRIES),
            &root_ok,
        )
        .map_err(|why| bad(at, format!("snapshot {number}: {why}")))?;
        out.push(SnapshotRecord {
            number,
            time_secs: get_u64(r, S_TIME),
            map_root,
            next_list: get_u64(r, S_NEXT_LIST),
            pin,
            name: name.to_string(),
            protected,
        });
    }
    Ok(out)
}

/// The byte of the image whose lock stands for snapshot `number` (past
/// any device: such locks need no bytes there).
fn lock_byte(number: u64) -> i64 {
    (1i64 << 62) + (number & ((1 << 61) - 1)) as i64
}

/// An open file description lock on a snapshot's byte of the image: shared
/// while a reader has the snapshot open, exclusive while it is deleted.
/// Released when dropped (with the `File` it was taken on).
#[derive(Debug)]
pub struct SnapshotLock {
    file: File,
    number: u64,
}

impl SnapshotLock {
    /// A reader's lock (shared). Fails with `WouldBlock` while the snapshot
    /// is being deleted.
    pub fn shared(file: File, number: u64) -> std::io::Result<SnapshotLock> {
        ofd_lock(&file, number, libc::F_RDLCK as i16)?;
        Ok(SnapshotLock { file, number })
    }

    /// A deleter's lock (exclusive; `file` must be open for writing). Fails
    /// with `WouldBlock` while a reader holds the snapshot.
    pub fn exclusive(file: File, number: u64) -> std::io::Result<SnapshotLock> {
        ofd_lock(&file, number, libc::F_WRLCK as i16)?;
        Ok(SnapshotLock { file, number })
    }

    pub fn number(&self) -> u64 {
        self.number
    }

    /// Whether any snapshot of the image `file` is open in a reader (or
    /// being deleted) now: a repair that may drop snapshots must not run
    /// under one.
    pub fn any_held(file: &File) -> std::io::Result<bool> {
        // SAFETY: as in `ofd_lock`.
        let mut fl: libc::flock = unsafe { std::mem::zeroed() };
        fl.l_type = libc::F_WRLCK as i16;
        fl.l_whence = libc::SEEK_SET as i16;
        fl.l_start = lock_byte(0);
        fl.l_len = 1 << 61;
        // SAFETY: a valid fd and a pointer to a live flock.
        let r = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_GETLK, &mut fl) };
        if r != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(fl.l_type != libc::F_UNLCK as i16)
    }
}

impl Drop for SnapshotLock {
    fn drop(&mut self) {
        // Closing the file releases it too; unlock explicitly anyway, so a
        // `File` cloned elsewhere cannot keep it.
        let _ = ofd_lock(&self.file, self.number, libc::F_UNLCK as i16);
    }
}

fn ofd_lock(file: &File, number: u64, kind: i16) -> std::io::Result<()> {
    // SAFETY: flock is plain data; zeroed is a valid value (l_pid must be 0
    // for OFD locks).
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = kind;
    fl.l_whence = libc::SEEK_SET as i16;
    fl.l_start = lock_byte(number);
    fl.l_len = 1;
    // SAFETY: a valid fd and a pointer to a live flock.
    let r = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLK, &mut fl) };
    if r == 0 {
        return Ok(());
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EAGAIN) | Some(libc::EACCES) => Err(std::io::Error::new(
            std::io::ErrorKind::WouldBlock,
            format!("snapshot {number} is in use"),
        )),
        _ => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(number: u64, pin: u32, name: &str) -> SnapshotRecord {
        SnapshotRecord {
            number,
            time_secs: 1_700_000_000 + number,
            map_root: Some((
                PagePtr {
                    addr: 8192 * number,
                    crc: 7,
                },
                2,
                99,
            )),
            next_list: 40,
            pin,
            name: name.into(),
            protected: number % 2 == 1,
        }
    }

    #[test]
    fn table_roundtrip_and_bounds() {
        let mut t = vec![rec(3, 0, "before upgrade"), rec(9, 5, "")];
        t.push(SnapshotRecord {
            map_root: None,
            ..rec(12, 23, &"x".repeat(MAX_NAME_BYTES))
        });
        let mut b = vec![0u8; PAGE_BYTES];
        encode_table(&mut b, &t, 12, 0);
        assert_eq!(decode_table(&b, 0, 12, false, |_| true).unwrap(), t);
        assert!(
            decode_table(&b, 0, 11, false, |_| true).is_err(),
            "number past the serial"
        );
        assert!(
            decode_table(&b, 0, 12, false, |a| a != 8192 * 9).is_err(),
            "bad root"
        );
        let mut c = b.clone();
        c[TABLE_AT + RECORD_BYTES + S_PIN] = 0;
        assert!(
            decode_table(&c, 0, 12, false, |_| true).is_err(),
            "pin bit twice"
        );
        let mut c = b.clone();
        c[TABLE_AT + S_KIND] = 2;
        assert!(decode_table(&c, 0, 12, false, |_| true).is_err(), "kind");
        let mut c = b.clone();
        c[TABLE_AT + S_NAME_LEN] = MAX_NAME_BYTES as u8 + 1;
        assert!(
            decode_table(&c, 0, 12, false, |_| true).is_err(),
            "long name"
        );
        let mut c = b.clone();
        put_u32(&mut c, TABLE_COUNT_AT, MAX_SNAPSHOTS as u32 + 1);
        assert!(decode_table(&c, 0, 12, false, |_| true).is_err(), "count");
        let mut c = b.clone();
        put_u64(&mut c, TABLE_AT + RECORD_BYTES, 3);
        assert!(decode_table(&c, 0, 12, false, |_| true).is_err(), "order");
        assert!(check_name(&"y".repeat(MAX_NAME_BYTES + 1)).is_err());
    }

    #[test]
    fn a_deletion_waits_for_no_reader_and_a_reader_for_no_deletion() {
        let dir = std::env::temp_dir().join(format!("ldfs-snaplock-{}", std::process::id()));
        std::fs::write(&dir, b"image").unwrap();
        // An exclusive lock needs a file open for writing (fcntl(2)).
        let open = || {
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&dir)
                .unwrap()
        };
        assert!(!SnapshotLock::any_held(&open()).unwrap());
        let r1 = SnapshotLock::shared(open(), 4).unwrap();
        assert!(SnapshotLock::any_held(&open()).unwrap());
        let r2 = SnapshotLock::shared(open(), 4).unwrap();
        let e = SnapshotLock::exclusive(open(), 4).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock);
        // Another snapshot's byte is free.
        drop(SnapshotLock::exclusive(open(), 5).unwrap());
        drop(r1);
        assert!(
            SnapshotLock::exclusive(open(), 4).is_err(),
            "r2 still reads"
        );
        drop(r2);
        let d = SnapshotLock::exclusive(open(), 4).unwrap();
        assert!(
            SnapshotLock::shared(open(), 4).is_err(),
            "deletion under way"
        );
        assert!(SnapshotLock::any_held(&open()).unwrap(), "a deletion");
        drop(d);
        SnapshotLock::shared(open(), 4).unwrap();
        assert!(!SnapshotLock::any_held(&open()).unwrap());
        std::fs::remove_file(&dir).unwrap();
    }
}
