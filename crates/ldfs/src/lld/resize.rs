//! Resize (`ldfs resize`, issue 17; docs/DESIGN.md "Resize"): grow an lld
//! log offline or online, shrink it offline.
//!
//! The commit point is a checkpoint slot recording the new segment count
//! (with [`INCOMPAT_RESIZE`] the newest slot's count is the truth, not the
//! superblock's). Around it, in this order, each step durable before the
//! next:
//!
//! 1. both superblock copies carry [`INCOMPAT_RESIZE`] (set once);
//! 2. a grow extends the device;
//! 3. superblock copy 1 with the new geometry at the new last page;
//! 4. the slot with the new count: the commit point (then the same in
//!    the other slot, so neither keeps a count the device may not hold);
//! 5. superblock copy 0 with the new geometry;
//! 6. a shrink truncates the device.
//!
//! Before 4 every slot has the old count and the device holds it (the
//! segments a grow adds are unused, a shrink's were emptied first and are
//! past everything the old slot's log names); from 4 on the newest slot
//! has the new count. A writable open rewrites superblock copies whose
//! count or flag lags the recovered checkpoint (`settle_superblocks`), so
//! a crash between 4 and 5 heals at the next mount; a crash before 6
//! leaves a larger file than the file system uses, which a rerun trims.

use std::sync::Arc;

use super::checkpoint;
use super::engine::Lld;
use super::layout::{Geometry, INCOMPAT_RESIZE, MIN_RESERVED_SEGMENTS};
use super::mkfs::{read_checkpoints, read_superblock};
use super::types::{SegmentId, PAGE_BYTES};
use super::usage::SegmentState;
use super::LldOptions;
use crate::device::Device;
use crate::ld::{LdError, LdResult};

/// What a resize did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResizeReport {
    pub old_segments: u32,
    pub new_segments: u32,
    /// The device's size before and after, in bytes.
    pub old_bytes: u64,
    pub new_bytes: u64,
    pub segment_bytes: u64,
}

impl std::fmt::Display for ResizeReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} -> {} bytes, {} -> {} segments of {} bytes",
            self.old_bytes,
            self.new_bytes,
            self.old_segments,
            self.new_segments,
            self.segment_bytes
        )
    }
}

/// Held by `Lld::grow` for its whole run: grows of engines in this process
/// one at a time (a daemon serves one image; tests may run several).
static GROWING: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn invalid(msg: String) -> LdError {
    LdError::InvalidArgument(msg)
}

/// The segment count a device of `bytes` holds with `g`'s layout, or why
/// it cannot be resized to it: past what the checkpoint slots can describe
/// (set at mkfs: `--max-size`), or too small for the reserve.
pub fn segments_for_size(g: &Geometry, bytes: u64) -> LdResult<u32> {
    let count = g.segments_for(bytes);
    let max = g.max_segments();
    if count > max as u64 {
        let max_bytes =
            (g.first_segment_page + 1) * PAGE_BYTES as u64 + max as u64 * g.segment_bytes();
        return Err(invalid(format!(
            "{bytes} bytes would be {count} segments, but this image's checkpoint slots \
             hold the table of at most {max} ({max_bytes} bytes): room to grow is set at \
             mkfs (--max-size); an image made without it grows only that far"
        )));
    }
    let least = g.reserved_segments.max(MIN_RESERVED_SEGMENTS) + 4;
    if count < least as u64 {
        return Err(invalid(format!(
            "{bytes} bytes would be {count} segments; at least {least} are needed \
             ({} reserved and 4 for data)",
            g.reserved_segments
        )));
    }
    Ok(count as u32)
}

fn device_pages(dev: &dyn Device) -> u64 {
    dev.size_bytes() / PAGE_BYTES as u64
}

/// Writes superblock copy `copy` of `g` where open reads it: copy 0 at
/// page 0, copy 1 at page `g.total_pages - 1`.
fn write_superblock(dev: &dyn Device, g: &Geometry, copy: u32) -> LdResult<()> {
    let addr = if copy == 0 {
        0
    } else {
        (g.total_pages - 1) * PAGE_BYTES as u64
    };
    dev.write_at(&g.encode_superblock(copy), addr)?;
    Ok(())
}

/// Sets [`INCOMPAT_RESIZE`] in both superblock copies (step 1), if not
/// yet: from then on the segment count is the newest slot's and slots
/// cover only their table. Either copy alone, flagged or not, describes
/// the same image (the slots written so far decode either way).
fn set_resize_flag(dev: &dyn Device, g: Geometry) -> LdResult<Geometry> {
    if g.resizable() {
        return Ok(g);
    }
    let f = Geometry {
        incompat: g.incompat | INCOMPAT_RESIZE,
        total_pages: device_pages(dev),
        ..g
    };
    write_superblock(dev, &f, 1)?;
    write_superblock(dev, &f, 0)?;
    dev.flush()?;
    Ok(f)
}

/// After recovery, before a writable engine starts: rewrites the
/// superblock copies that lag the recovered geometry `g` — a resize cut
/// between its slot and copy 0 (the count), between its two flag writes,
/// or inside one of its superblock writes (torn), or a device grown with
/// nothing yet at its last page — and any copy that does not decode while
/// the other does (the engine knows the geometry: recovery used it).
/// Returns the geometry to run with (flagged if either copy was).
pub(crate) fn settle_superblocks(dev: &dyn Device, g: Geometry) -> LdResult<Geometry> {
    let last = super::layout::copy1_addr(dev.size_bytes());
    let mut copies = [None, None];
    for (i, addr) in [0, last].into_iter().enumerate() {
        let mut b = vec![0u8; PAGE_BYTES];
        dev.read_at(&mut b, addr)?;
        copies[i] = Geometry::decode_superblock(&b, addr, dev.size_bytes()).ok();
    }
    let flagged = g.resizable() || copies.iter().flatten().any(Geometry::resizable);
    let want = if flagged {
        Geometry {
            incompat: g.incompat | INCOMPAT_RESIZE,
            total_pages: device_pages(dev),
            ..g
        }
    } else {
        g
    };
    let mut wrote = false;
    for (copy, found) in copies.iter().enumerate() {
        let lags = match found {
            Some(c) => flagged && (c.segment_count != want.segment_count || !c.resizable()),
            None => true,
        };
        if lags {
            // Where it was read: copy 1 at the device's last page, which is
            // where every reader looks, also on a device larger than an
            // unflagged file system (review 41 finding 4; `write_superblock`
            // puts it at the geometry's end, which a shrink needs).
            dev.write_at(&want.encode_superblock(copy as u32), [0, last][copy])?;
            wrote = true;
        }
    }
    if wrote {
        dev.flush()?;
    }
    Ok(want)
}

/// Resizes the unmounted image on `dev` to `new_bytes` (rounded down to a
/// page; `None`: the device's size, as a block device the storage grew).
/// Opens the engine (recovery), for a shrink moves every live block out of
/// the segments past the new end, closes it, then commits (module
/// comment). The caller holds the image's lock.
pub fn resize_offline(
    dev: Arc<dyn Device>,
    new_bytes: Option<u64>,
    opts: LldOptions,
) -> LdResult<ResizeReport> {
    let old_bytes = dev.size_bytes();
    // A probe: an image file takes its own length again (and answers
    // true); a block device reads its size again (it may have grown).
    let file_like = dev.resize(old_bytes)?;
    let target = new_bytes.unwrap_or(dev.size_bytes()) / PAGE_BYTES as u64 * PAGE_BYTES as u64;
    if !file_like && target > dev.size_bytes() {
        return Err(invalid(format!(
            "the device holds {} bytes, fewer than {target}: grow the device first",
            dev.size_bytes()
        )));
    }
    let lld = Lld::open(dev.clone(), opts)?;
    let g = lld.geometry();
    let res = segments_for_size(&g, target).and_then(|count| {
        if count == g.segment_count {
            // A shrink cut between its commit and its truncate (steps 5 and
            // 6) left a longer file than the file system uses: a rerun
            // finishes it.
            if file_like && g.resizable() && target < old_bytes {
                return Ok(count);
            }
            return Err(invalid(format!(
                "{target} bytes hold {count} segments of {} bytes, as the file system has now: \
                 nothing to do",
                g.segment_bytes()
            )));
        }
        if count < g.segment_count {
            lld.empty_segments_past(count)?;
        }
        Ok(count)
    });
    // Closed either way: a refused shrink leaves the image as it was (the
    // fence dies with the engine; whatever moved is just moved).
    let closed = lld.close();
    drop(lld);
    let count = res?;
    closed?;
    commit(&*dev, count, target, file_like)?;
    Ok(ResizeReport {
        old_segments: g.segment_count,
        new_segments: count,
        old_bytes,
        new_bytes: dev.size_bytes(),
        segment_bytes: g.segment_bytes(),
    })
}

/// Steps 1 to 6 on a closed image whose newest slot leaves every segment
/// from `count` on Clean (a shrink emptied them).
fn commit(dev: &dyn Device, count: u32, new_bytes: u64, file_like: bool) -> LdResult<()> {
    let (sb, _) = read_superblock(dev)?;
    let sb = set_resize_flag(dev, sb)?;
    let [s0, s1] = read_checkpoints(dev, &sb)?;
    let (slot, h, usage) = match (s0, s1) {
        (Ok(a), Ok(b)) if b.0.serial > a.0.serial => (1, b.0, b.1),
        (Ok(a), _) => (0, a.0, a.1),
        (_, Ok(b)) => (1, b.0, b.1),
        (Err(e), Err(_)) => return Err(LdError::Corrupt(e)),
    };
    let cur = usage.len();
    let shrink = count < cur || (file_like && new_bytes < dev.size_bytes());
    if shrink {
        let busy = (count..cur)
            .find(|&s| {
                let u = usage.get(SegmentId(s));
                u.state != SegmentState::Clean || u.pins != 0 || u.live_bytes != 0
            })
            .or((h.log_segment >= count).then_some(h.log_segment))
            .or((h.next_segment >= count).then_some(h.next_segment));
        if let Some(s) = busy {
            return Err(invalid(format!(
                "segment {s} past the new end ({count}) is still in use"
            )));
        }
    } else if file_like {
        dev.resize(new_bytes)?;
    }
    // A shrink puts copy 1 at the new end even on a device ldfs cannot
    // shrink (a block device): the storage is shrunk to `new_bytes` after
    // this, and that copy must survive it (copy 0's stored total, past the
    // shrunk device, is then no error: `decode_superblock`).
    let final_pages = if file_like || shrink {
        new_bytes / PAGE_BYTES as u64
    } else {
        device_pages(dev)
    };
    let gn = sb.with_segments(count, final_pages).ok_or_else(|| {
        invalid(format!(
            "{count} segments do not fit {final_pages} pages (slots hold {})",
            sb.max_segments()
        ))
    })?;
    // 3: copy 1 where it will be the last page (past the new segments; for
    // a shrink inside a Clean segment cut off, or the slack).
    write_superblock(dev, &gn, 1)?;
    dev.flush()?;
    // 4: the commit point.
    let usage = if count < cur {
        usage.truncated(count)
    } else if count > cur {
        let mut u = usage;
        u.grow(count);
        u
    } else {
        usage
    };
    let header = checkpoint::CheckpointHeader {
        serial: h.serial + 1,
        ..h
    };
    let bytes = checkpoint::encode(&gn, &header, &usage, &[]);
    dev.write_at(&bytes, gn.slot_addr(1 - slot))?;
    dev.flush()?;
    // 4b: the same in the other slot (the next serial), whose old count a
    // shrunk device no longer holds: fsck would call it damaged until the
    // next mount's checkpoint overwrote it.
    let again = checkpoint::CheckpointHeader {
        serial: h.serial + 2,
        ..header
    };
    dev.write_at(
        &checkpoint::encode(&gn, &again, &usage, &[]),
        gn.slot_addr(slot),
    )?;
    dev.flush()?;
    // 5.
    write_superblock(dev, &gn, 0)?;
    dev.flush()?;
    // 6.
    if shrink && file_like {
        dev.resize(new_bytes)?;
    }
    Ok(())
}

impl Lld {
    /// Grows the mounted file system's device to `new_bytes` (`None`: the
    /// device's size, a block device the storage grew) while it runs
    /// (`ldfs resize MNT`, through the daemon): steps 1 to 3 beside the
    /// running engine (they touch no page it uses), 4 by the engine
    /// (`grow_segments`), then 5. Shrinking needs the file system
    /// unmounted (its data must move first).
    pub fn grow(&self, new_bytes: Option<u64>) -> LdResult<ResizeReport> {
        // One grow at a time (review 25: two at once could truncate the
        // device under the segments the larger one committed).
        let _one = GROWING.lock().unwrap_or_else(|p| p.into_inner());
        let dev = self.device();
        let g = self.geometry();
        let old_bytes = dev.size_bytes();
        let file_like = dev.resize(old_bytes)?;
        let target = new_bytes.unwrap_or(dev.size_bytes()) / PAGE_BYTES as u64 * PAGE_BYTES as u64;
        let count = segments_for_size(&g, target)?;
        if count < g.segment_count {
            return Err(invalid(format!(
                "{target} bytes is smaller than the file system ({} segments): \
                 shrink it unmounted (ldfs resize IMAGE SIZE)",
                g.segment_count
            )));
        }
        if count == g.segment_count {
            return Err(invalid(format!(
                "{target} bytes hold {count} segments, as the file system has now: nothing to do"
            )));
        }
        if !file_like && target > dev.size_bytes() {
            return Err(invalid(format!(
                "the device holds {} bytes, fewer than {target}: grow the device first",
                dev.size_bytes()
            )));
        }
        let (sb, _) = read_superblock(dev)?;
        set_resize_flag(dev, sb)?;
        // Never below what the device holds now (segments past `target`
        // may be committed by a grow before this one).
        if file_like && target > dev.size_bytes() {
            dev.resize(target)?;
        }
        let final_pages = device_pages(dev);
        let gn = Geometry {
            incompat: g.incompat | INCOMPAT_RESIZE,
            ..g
        }
        .with_segments(count, final_pages)
        .ok_or_else(|| invalid(format!("{count} segments do not fit {final_pages} pages")))?;
        write_superblock(dev, &gn, 1)?;
        dev.flush()?;
        let gn = self.grow_segments(count)?;
        write_superblock(dev, &gn, 0)?;
        dev.flush()?;
        Ok(ResizeReport {
            old_segments: g.segment_count,
            new_segments: count,
            old_bytes,
            new_bytes: dev.size_bytes(),
            segment_bytes: g.segment_bytes(),
        })
    }
}
