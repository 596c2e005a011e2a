//! A device-write failure reaches every later write, and writes to lists
//! that are gone are refused (review 21, of 0edec4c: Flight::failed from an atomic flag;
//! Engine::write without the first list lookup).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use ldfs::device::{Device, FaultDevice, FaultPlan, MemoryDevice};
use ldfs::ld::{Compression, LdError, ListHints, ListId, LogicalDisk};
use ldfs::lld::layout::MkfsOptions;
use ldfs::lld::{Lld, LldOptions};

fn small_mkfs() -> MkfsOptions {
    MkfsOptions {
        segment_bytes: 128 << 10,
        max_block_bytes: 32 << 10,
        reserved_segments: Some(4),
        fs_id: 77,
        max_bytes: None,
        kept_pages: 0,
    }
}

/// A list whose hints are cached (created and written in this session)
/// and then deleted, or created in an ARU that aborted: a write to it is
/// NoSuchList and leaves nothing; list 0 is refused.
#[test]
fn writes_to_gone_lists_are_refused_with_cached_hints() {
    let dev: Arc<dyn Device> = Arc::new(MemoryDevice::new(16 << 20));
    let lld = Lld::create(dev, &small_mkfs(), LldOptions::default()).unwrap();
    let compress = ListHints {
        compress: Compression::Lz4,
        ..Default::default()
    };
    let l = lld.create_list(None, compress).unwrap();
    lld.write(None, l, 1, &[7u8; 4096]).unwrap();
    lld.delete_list(None, l).unwrap();
    let r = lld.write(None, l, 2, &[8u8; 4096]);
    assert!(matches!(r, Err(LdError::NoSuchList(_))), "{r:?}");
    assert!(lld.list_hints(l).unwrap().is_none());

    let aru = lld.begin_aru().unwrap();
    let m = lld.create_list(Some(aru), compress).unwrap();
    lld.write(Some(aru), m, 0, &[1u8; 4096]).unwrap();
    lld.abort_aru(aru).unwrap();
    let r = lld.write(None, m, 1, &[2u8; 4096]);
    assert!(matches!(r, Err(LdError::NoSuchList(_))), "{r:?}");
    let r = lld.write(None, ListId(0), 1, b"x");
    assert!(matches!(r, Err(LdError::InvalidArgument(_))), "{r:?}");
    // A later list is untouched by the refusals.
    let n = lld.create_list(None, ListHints::default()).unwrap();
    lld.write(None, n, 0, b"ok").unwrap();
    assert_eq!(lld.read(n, 0).unwrap().unwrap(), b"ok");
}

/// The log writer thread's write fails (no flush asked: partial segments
/// sealed as the writes fill them). Once any writer has seen ReadOnly,
/// every later write, on any thread, is refused; everything accepted
/// stays readable (queued for the device, also after the failure).
#[test]
fn a_writer_thread_failure_reaches_every_later_write() {
    for nth in [3, 20, 60, 150] {
        writer_thread_failure(nth);
    }
}

fn writer_thread_failure(nth: u64) {
    let dev = Arc::new(FaultDevice::new(
        MemoryDevice::new(64 << 20),
        FaultPlan::default(),
    ));
    let lld = Arc::new(Lld::create(dev.clone(), &small_mkfs(), LldOptions::default()).unwrap());
    let l = lld.create_list(None, ListHints::default()).unwrap();
    lld.flush().unwrap();
    dev.set_plan(FaultPlan {
        fail_write_nth: Some(nth),
        sticky: true,
        ..Default::default()
    });
    let seen = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let (lld, seen) = (lld.clone(), seen.clone());
            std::thread::spawn(move || {
                let mut accepted = Vec::new();
                for i in 0..3000u64 {
                    let idx = t * 100_000 + i;
                    // Read before the write: if someone saw ReadOnly
                    // before this write began, it must fail.
                    let before = seen.load(Ordering::SeqCst);
                    match lld.write(None, l, idx, &[(idx % 251) as u8; 4096]) {
                        Ok(()) => {
                            assert!(!before, "write {idx} accepted after ReadOnly was seen");
                            accepted.push(idx);
                        }
                        Err(LdError::ReadOnly(_)) => seen.store(true, Ordering::SeqCst),
                        Err(LdError::NoSpace { .. }) => break,
                        Err(e) => panic!("write {idx}: {e}"),
                    }
                }
                accepted
            })
        })
        .collect();
    let accepted: Vec<u64> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    assert!(
        seen.load(Ordering::SeqCst),
        "the failure never reached a write"
    );
    for idx in accepted {
        let b = lld
            .read(l, idx)
            .unwrap_or_else(|e| panic!("accepted block {idx}: {e}"))
            .unwrap_or_else(|| panic!("accepted block {idx} gone"));
        assert_eq!(b, vec![(idx % 251) as u8; 4096], "block {idx}");
    }
}
