//! Formatting: writes both superblock copies and an initial checkpoint that
//! describes an empty log (segment 0 active, segment 1 next, epoch 1).
//! Slot 1 is zeroed so a previous file system's checkpoint there cannot win.

use super::checkpoint::{self, CheckpointHeader};
use super::layout::{Geometry, MkfsOptions};
use super::types::{SegmentId, PAGE_BYTES};
use super::usage::{SegmentState, Usage};
use crate::device::Device;
use crate::ld::LdResult;

/// Formats `dev`. A zero `fs_id` in `opts` picks a random one, so summaries
/// left by an earlier file system on the same device are never replayed.
pub fn mkfs(dev: &dyn Device, opts: &MkfsOptions) -> LdResult<Geometry> {
    let mut opts = *opts;
    if opts.fs_id == 0 {
        opts.fs_id = random_fs_id();
    }
    let g = Geometry::plan(dev.size_bytes(), &opts)?;
    let mut usage = Usage::new(g.segment_count, g.segment_bytes() as u32);
    usage.transition(SegmentId(0), SegmentState::Active);
    usage.transition(SegmentId(1), SegmentState::Next);
    let header = CheckpointHeader {
        serial: 1,
        epoch: 1,
        next_seq: 1,
        log_segment: 0,
        log_page: 0,
        next_segment: 1,
        map_root: None,
        next_list: 1,
        user_bytes: 0,
        moved_bytes: 0,
        snapshots: Vec::new(),
    };
    let slot0 = checkpoint::encode(&g, &header, &usage, &[]);
    dev.write_at(&slot0, g.slot_addr(0))?;
    // The pages a slot of this size covers: with room to grow, the rest of
    // the slot is never read before a resize's slot covers it.
    dev.write_at(
        &vec![0u8; checkpoint::slot_pages_for(&g) * PAGE_BYTES],
        g.slot_addr(1),
    )?;
    // Superblocks last: an interrupted mkfs leaves no valid superblock.
    dev.flush()?;
    let [a0, a1] = g.superblock_addrs();
    dev.write_at(&g.encode_superblock(0), a0)?;
    dev.write_at(&g.encode_superblock(1), a1)?;
    dev.flush()?;
    Ok(g)
}

/// A random nonzero file-system id (0 asks for a fresh one).
pub(crate) fn random_fs_id() -> u64 {
    use rand::RngCore;
    loop {
        let id = rand::rngs::OsRng.next_u64();
        if id != 0 {
            return id;
        }
    }
}

/// Reads the geometry from superblock copy 0, falling back to copy 1.
/// Returns the geometry and, for each copy, the error if it was bad.
pub fn read_superblock(
    dev: &dyn Device,
) -> LdResult<(Geometry, [Option<crate::ld::Corruption>; 2])> {
    let size = dev.size_bytes();
    let mut errs: [Option<crate::ld::Corruption>; 2] = [None, None];
    let mut found = None;
    let last = crate::lld::layout::copy1_addr(size);
    for (i, addr) in [0, last].into_iter().enumerate() {
        let mut b = vec![0u8; PAGE_BYTES];
        dev.read_at(&mut b, addr)?;
        match Geometry::decode_superblock(&b, addr, size) {
            Ok(g) => {
                if found.is_none() {
                    found = Some(g);
                }
            }
            Err(e) => errs[i] = Some(e),
        }
    }
    match found {
        Some(g) => Ok((g, errs)),
        None => Err(crate::ld::LdError::Corrupt(errs[0].clone().unwrap())),
    }
}

/// Reads and decodes both checkpoint slots.
pub fn read_checkpoints(
    dev: &dyn Device,
    g: &Geometry,
) -> LdResult<[Result<(CheckpointHeader, Usage), crate::ld::Corruption>; 2]> {
    let read = |slot: usize| -> LdResult<_> {
        let mut b = vec![0u8; PAGE_BYTES];
        dev.read_at(&mut b, g.slot_addr(slot))?;
        let pages = checkpoint::slot_pages_named(g, &b);
        b.resize(pages * PAGE_BYTES, 0);
        dev.read_at(&mut b[PAGE_BYTES..], g.slot_addr(slot) + PAGE_BYTES as u64)?;
        Ok(checkpoint::decode(g, &b, g.slot_addr(slot)))
    };
    Ok([read(0)?, read(1)?])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::MemoryDevice;

    #[test]
    fn mkfs_then_read_back() {
        let dev = MemoryDevice::new(32 << 20);
        let g = mkfs(&dev, &MkfsOptions::default()).unwrap();
        assert_ne!(g.fs_id, 0);
        let (g2, errs) = read_superblock(&dev).unwrap();
        assert_eq!(g, g2);
        assert!(errs.iter().all(Option::is_none));
        let [s0, s1] = read_checkpoints(&dev, &g).unwrap();
        let (h, usage) = s0.unwrap();
        assert_eq!(
            (h.serial, h.epoch, h.log_segment, h.next_segment),
            (1, 1, 0, 1)
        );
        assert_eq!(usage.clean_count(), g.segment_count - 2);
        assert!(s1.is_err());
    }

    #[test]
    fn damaged_first_superblock_falls_back_to_the_copy() {
        let dev = MemoryDevice::new(32 << 20);
        let g = mkfs(&dev, &MkfsOptions::default()).unwrap();
        dev.write_at(&[0xff; 16], 100).unwrap();
        let (g2, errs) = read_superblock(&dev).unwrap();
        assert_eq!(g, g2);
        assert!(errs[0].is_some() && errs[1].is_none());
        dev.write_at(&[0xff; 16], g.superblock_addrs()[1] + 8)
            .unwrap();
        assert!(matches!(
            read_superblock(&dev),
            Err(crate::ld::LdError::Corrupt(_))
        ));
    }
}
