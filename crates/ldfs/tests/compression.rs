//! Per-list compression in the engine: each choice round-trips through
//! writes, reads, read_range, reopen and a crash; incompressible blocks are
//! stored plain; a list's choice changes for new writes only, with the ARU
//! that changed it; a damaged compressed block is an error, never its bytes.

use std::sync::Arc;

use ldfs::device::{CrashDevice, CrashOptions, Device, MemoryDevice};
use ldfs::ld::{Compression, LdError, ListHints, ListId, LogicalDisk};
use ldfs::lld::layout::MkfsOptions;
use ldfs::lld::{Key, Lld, LldOptions};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn mkfs() -> MkfsOptions {
    MkfsOptions {
        segment_bytes: 128 << 10,
        max_block_bytes: 32 << 10,
        reserved_segments: Some(4),
        fs_id: 91,
        max_bytes: None,
        kept_pages: 0,
    }
}

const CHOICES: [Compression; 5] = [
    Compression::Off,
    Compression::Lz4,
    Compression::Zstd { level: 1 },
    Compression::Zstd { level: 3 },
    Compression::Zstd { level: 19 },
];

/// Text-like bytes that compress (a few words in a seeded order).
fn text(seed: u64, len: usize) -> Vec<u8> {
    let words: [&[u8]; 8] = [
        b"segment ",
        b"cleaner ",
        b"block ",
        b"list ",
        b"checkpoint ",
        b"log ",
        b"map ",
        b"\n",
    ];
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut out = Vec::with_capacity(len + 16);
    while out.len() < len {
        out.extend_from_slice(words[rng.gen_range(0..words.len())]);
    }
    out.truncate(len);
    out
}

fn random(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..len).map(|_| rng.gen()).collect()
}

fn list_with(lld: &Lld, c: Compression) -> ListId {
    lld.create_list(
        None,
        ListHints {
            compress: c,
            ..Default::default()
        },
    )
    .unwrap()
}

fn stored_len(lld: &Lld, l: ListId, i: u64) -> u32 {
    lld.map_entry(Key::new(l, i)).unwrap().unwrap().len
}

#[test]
fn each_choice_round_trips_and_survives_reopen() {
    let dev: Arc<dyn Device> = Arc::new(MemoryDevice::new(32 << 20));
    let lld = Lld::create(dev.clone(), &mkfs(), LldOptions::default()).unwrap();
    let lists: Vec<ListId> = CHOICES.iter().map(|&c| list_with(&lld, c)).collect();
    let block = |i: u64| text(i, [4096, 4096, 300, 100, 20_000][i as usize % 5]);
    for (&c, &l) in CHOICES.iter().zip(&lists) {
        for i in 0..40 {
            lld.write(None, l, i, &block(i)).unwrap();
        }
        // Read from the open partial, then from the device.
        assert_eq!(lld.read(l, 7).unwrap().unwrap(), block(7), "{c}");
        lld.flush().unwrap();
        let got = lld.read_range(l, 0..40, 100).unwrap();
        let want: Vec<_> = (0..40).map(|i| (i, block(i))).collect();
        assert!(got == want, "{c}: read_range");
        // 4 KiB of text: stored compressed unless off; 100 bytes: plain.
        let len = stored_len(&lld, l, 0);
        if c.is_off() {
            assert_eq!(len, 4096);
        } else {
            assert!(len < 4096 / 2, "{c}: 4096 bytes stored as {len}");
        }
        assert_eq!(stored_len(&lld, l, 3), 100, "{c}: small block");
    }
    let st = lld.stats();
    // Four compressing lists of 40 blocks each, 8 of them under 256 bytes.
    assert_eq!(
        st.compress_blocks_compressed + st.compress_blocks_plain,
        4 * 40
    );
    assert_eq!(st.compress_blocks_plain, 4 * 8);
    let logical: u64 = (0..40).map(|i| block(i).len() as u64).sum();
    assert_eq!(st.compress_logical_bytes, 4 * logical);
    assert!(st.compress_stored_bytes < st.compress_logical_bytes / 3);
    lld.close().unwrap();
    drop(lld);
    let lld = Lld::open(dev, LldOptions::default()).unwrap();
    for (&c, &l) in CHOICES.iter().zip(&lists) {
        assert_eq!(lld.list_hints(l).unwrap().unwrap().compress, c);
        for i in 0..40 {
            assert_eq!(lld.read(l, i).unwrap().unwrap(), block(i), "{c} {i}");
        }
    }
    // Since open: nothing written yet.
    assert_eq!(lld.stats().compress_logical_bytes, 0);
    assert_eq!(lld.accounting_drift(), 0);
}

#[test]
fn incompressible_blocks_are_stored_plain() {
    let dev: Arc<dyn Device> = Arc::new(MemoryDevice::new(32 << 20));
    let lld = Lld::create(dev, &mkfs(), LldOptions::default()).unwrap();
    for c in [Compression::Lz4, Compression::Zstd { level: 3 }] {
        let l = list_with(&lld, c);
        let before = lld.stats();
        for i in 0..20 {
            lld.write(None, l, i, &random(i, 4096)).unwrap();
        }
        for i in 0..20 {
            assert_eq!(stored_len(&lld, l, i), 4096, "{c}: block {i}");
            assert_eq!(lld.read(l, i).unwrap().unwrap(), random(i, 4096));
        }
        let st = lld.stats();
        assert_eq!(st.compress_blocks_plain - before.compress_blocks_plain, 20);
        assert_eq!(
            st.compress_stored_bytes - before.compress_stored_bytes,
            20 * 4096
        );
    }
}

#[test]
fn a_lists_choice_changes_for_new_writes_only() {
    let dev: Arc<dyn Device> = Arc::new(MemoryDevice::new(32 << 20));
    let lld = Lld::create(dev.clone(), &mkfs(), LldOptions::default()).unwrap();
    let l = list_with(&lld, Compression::Off);
    lld.write(None, l, 0, &text(0, 4096)).unwrap();
    lld.set_compression(None, l, Compression::Zstd { level: 5 })
        .unwrap();
    lld.write(None, l, 1, &text(1, 4096)).unwrap();
    assert_eq!(stored_len(&lld, l, 0), 4096, "an old block was rewritten");
    assert!(stored_len(&lld, l, 1) < 2048);
    // Changed in an ARU that is aborted: back to zstd:5.
    let aru = lld.begin_aru().unwrap();
    lld.set_compression(Some(aru), l, Compression::Off).unwrap();
    assert_eq!(
        lld.list_hints(l).unwrap().unwrap().compress,
        Compression::Off
    );
    lld.abort_aru(aru).unwrap();
    assert_eq!(
        lld.list_hints(l).unwrap().unwrap().compress,
        Compression::Zstd { level: 5 }
    );
    lld.write(None, l, 2, &text(2, 4096)).unwrap();
    assert!(stored_len(&lld, l, 2) < 2048, "the aborted choice stuck");
    assert!(matches!(
        lld.set_compression(None, ListId(999), Compression::Lz4),
        Err(LdError::NoSuchList(_))
    ));
    lld.close().unwrap();
    drop(lld);
    let lld = Lld::open(dev, LldOptions::default()).unwrap();
    assert_eq!(
        lld.list_hints(l).unwrap().unwrap().compress,
        Compression::Zstd { level: 5 }
    );
    for i in 0..3 {
        assert_eq!(lld.read(l, i).unwrap().unwrap(), text(i, 4096));
    }
}

/// A crash keeps every flushed compressed block and the choice set before
/// the flush; what came after is there whole or not at all.
#[test]
fn a_crash_keeps_compressed_blocks_and_choices() {
    for seed in 0..6u64 {
        let dev = Arc::new(CrashDevice::new(32 << 20));
        let lld = Lld::create(dev.clone(), &mkfs(), LldOptions::default()).unwrap();
        let z = list_with(&lld, Compression::Zstd { level: 3 });
        let p = list_with(&lld, Compression::Lz4);
        for i in 0..60 {
            lld.write(None, z, i, &text(i, 4096)).unwrap();
            lld.write(None, p, i, &text(i + 1000, 4096)).unwrap();
        }
        lld.set_compression(None, p, Compression::Zstd { level: 9 })
            .unwrap();
        lld.flush().unwrap();
        for i in 0..60 {
            lld.write(None, z, i, &text(i + 5000, 4096)).unwrap();
        }
        let image = dev.crash_image(seed, &CrashOptions::default());
        lld.abandon();
        let lld = Lld::open(
            Arc::new(MemoryDevice::from_vec(image)),
            LldOptions::default(),
        )
        .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        assert_eq!(
            lld.list_hints(p).unwrap().unwrap().compress,
            Compression::Zstd { level: 9 },
            "seed {seed}"
        );
        for i in 0..60 {
            let got = lld.read(z, i).unwrap().unwrap();
            assert!(
                got == text(i, 4096) || got == text(i + 5000, 4096),
                "seed {seed}: block {i}"
            );
            assert_eq!(
                lld.read(p, i).unwrap().unwrap(),
                text(i + 1000, 4096),
                "seed {seed}: block {i}"
            );
        }
        assert_eq!(lld.accounting_drift(), 0, "seed {seed}");
    }
}

/// One flipped byte of a compressed block on the device: the read is
/// `Corrupt`, never wrong bytes.
#[test]
fn a_damaged_compressed_block_is_corrupt() {
    for c in [Compression::Lz4, Compression::Zstd { level: 3 }] {
        let dev = Arc::new(MemoryDevice::new(32 << 20));
        let lld = Lld::create(dev.clone(), &mkfs(), LldOptions::default()).unwrap();
        let l = list_with(&lld, c);
        lld.write(None, l, 0, &text(1, 8192)).unwrap();
        lld.close().unwrap();
        let e = lld.map_entry(Key::new(l, 0)).unwrap().unwrap();
        drop(lld);
        let at = e.offset() + e.len as u64 / 2;
        let mut b = [0u8];
        dev.read_at(&mut b, at).unwrap();
        dev.write_at(&[b[0] ^ 0x10], at).unwrap();
        let lld = Lld::open(dev, LldOptions::default()).unwrap();
        match lld.read(l, 0) {
            Err(LdError::Corrupt(_)) => {}
            r => panic!("{c}: {r:?}"),
        }
    }
}

/// LD section 3's suggestion: the cleaner stores cold blocks of a
/// compressing list it moves anew with a stronger zstd level
/// (`recompress_cold`); without the option they move as they are. Either
/// way every block reads back, after a reopen too.
#[test]
fn the_cleaner_recompresses_cold_blocks_it_moves() {
    use ldfs::lld::types::entry_flags;
    use ldfs::lld::{CleanerOptions, PolicyKind};
    let mut results = Vec::new();
    for recompress in [None, Some(19)] {
        let opts = LldOptions {
            cleaner: CleanerOptions {
                recompress_cold: recompress,
                ..Default::default()
            },
            ..Default::default()
        };
        let dev: Arc<dyn Device> = Arc::new(MemoryDevice::new(16 << 20));
        let lld = Lld::create(dev.clone(), &mkfs(), opts.clone()).unwrap();
        let cold = list_with(&lld, Compression::Lz4);
        let junk = list_with(&lld, Compression::Off);
        // Cold blocks share their segments with junk that dies, so the
        // cleaner wants those segments.
        for i in 0..60 {
            lld.write(None, cold, i, &text(i, 4096)).unwrap();
            lld.write(None, junk, i, &random(i, 12_000)).unwrap();
        }
        lld.delete_range(None, junk, 0..u64::MAX).unwrap();
        let lz4_lens: Vec<u32> = (0..60).map(|i| stored_len(&lld, cold, i)).collect();
        // The head moves on through a device and more (overwrites of 64
        // blocks), so the cold blocks' segments are old.
        let hot = list_with(&lld, Compression::Off);
        for round in 0..80u64 {
            for i in 0..64 {
                lld.write(None, hot, i, &text(round * 100 + i, 4096))
                    .unwrap();
            }
        }
        for _ in 0..8 {
            lld.clean(PolicyKind::Greedy, 64).unwrap();
        }
        let entries: Vec<_> = (0..60)
            .map(|i| lld.map_entry(Key::new(cold, i)).unwrap().unwrap())
            .collect();
        let zstd = entries
            .iter()
            .filter(|e| e.flags & entry_flags::ZSTD != 0)
            .count();
        let st = lld.stats();
        if recompress.is_none() {
            assert_eq!(zstd, 0, "recompressed without the option");
            assert_eq!(st.blocks_recompressed, 0);
        } else {
            assert!(zstd >= 30, "only {zstd} of 60 cold blocks recompressed");
            assert_eq!(st.blocks_recompressed as usize, zstd);
            for (e, lz4) in entries.iter().zip(&lz4_lens) {
                if e.flags & entry_flags::ZSTD != 0 {
                    assert!(e.len <= lz4 - lz4 / 16, "{} vs lz4 {lz4}", e.len);
                }
            }
            assert!(st.recompress_bytes_saved > 0);
        }
        // A list with compression off moves as it is, text or not.
        for i in 0..64 {
            if let Some(e) = lld.map_entry(Key::new(hot, i)).unwrap() {
                assert_eq!(e.flags, 0, "hot block {i}");
            }
        }
        for i in 0..60 {
            assert_eq!(lld.read(cold, i).unwrap().unwrap(), text(i, 4096));
        }
        assert_eq!(lld.accounting_drift(), 0);
        lld.close().unwrap();
        drop(lld);
        let lld = Lld::open(dev, opts).unwrap();
        for i in 0..60 {
            assert_eq!(lld.read(cold, i).unwrap().unwrap(), text(i, 4096));
        }
        results.push(zstd);
    }
    eprintln!(
        "cold blocks stored as zstd: without the option {}, with {}",
        results[0], results[1]
    );
}
