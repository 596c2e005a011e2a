//! The fs layer's limits, in-process (no FUSE): link counts, file size,
//! names, xattr sizes, directory cookies — on one log, on the dual layout
//! and over uip (the update-in-place LD): the fs knows only the LogicalDisk
//! trait.

use std::sync::Arc;

use ldfs::device::MemoryDevice;
use ldfs::dual::{Dual, DualMkfsOptions};
use ldfs::fs::{Ctx, Fs, FsError, FsOptions, XattrMode, LINK_MAX, MAX_FILE_BYTES, ROOT_INO};
use ldfs::ld::LogicalDisk;
use ldfs::lld::layout::MkfsOptions;
use ldfs::lld::{Lld, LldOptions};
use ldfs::uip::{Uip, UipOptions};

const CTX: Ctx = Ctx {
    uid: 0,
    gid: 0,
    umask: 0,
};

/// A fresh file system on one log (`dual` false) or on the dual layout:
/// metadata on a log, file data on a device of its own.
fn fresh(dual: bool) -> Fs {
    let ld: Arc<dyn LogicalDisk> = if dual {
        let meta = Arc::new(MemoryDevice::new(64 << 20));
        let data = Arc::new(MemoryDevice::new(256 << 20));
        ldfs::dual::mkfs(meta.clone(), &*data, &DualMkfsOptions::default()).unwrap();
        Arc::new(Dual::open(meta, data, LldOptions::default()).unwrap())
    } else {
        let dev = Arc::new(MemoryDevice::new(256 << 20));
        Arc::new(Lld::create(dev, &MkfsOptions::default(), LldOptions::default()).unwrap())
    };
    Fs::format(&*ld, CTX).unwrap();
    Fs::mount(ld, FsOptions::default()).unwrap()
}

/// Repairs what the check found; a check afterwards finds nothing.
fn repairs_clean(fs: &Fs) {
    let fixed = fs.repair().unwrap();
    assert!(
        fixed.after.problems.is_empty(),
        "{:?}",
        fixed.after.problems
    );
}

/// A fresh file system on the update-in-place Logical Disk.
fn fresh_uip() -> Fs {
    let dev = Arc::new(MemoryDevice::new(256 << 20));
    let uip = Uip::create(dev, UipOptions::default()).unwrap();
    Fs::format(&uip, CTX).unwrap();
    let ld: Arc<dyn LogicalDisk> = Arc::new(uip);
    Fs::mount(ld, FsOptions::default()).unwrap()
}

/// Runs a test body on every layout: one log, dual, and update in place.
macro_rules! on_every_layout {
    ($body:ident, $log:ident, $dual:ident, $uip:ident) => {
        #[test]
        fn $log() {
            $body(fresh(false));
        }
        #[test]
        fn $dual() {
            $body(fresh(true));
        }
        #[test]
        fn $uip() {
            $body(fresh_uip());
        }
    };
}

/// st_blocks counts the 4 KiB blocks a file holds after every write, also
/// when the count is kept up by the writes rather than counted afresh
/// (a stat between writes): random writes against a model of the blocks.
fn st_blocks_follow_writes(fs: Fs) {
    use rand::{Rng, SeedableRng};
    let f = fs.mknod(CTX, ROOT_INO, b"f", 0o100644, 0).unwrap().ino;
    let mut held = std::collections::BTreeSet::new();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    for k in 0..300 {
        let off = rng.gen_range(0..16u64 << 20);
        let len = rng.gen_range(1..20_000u64);
        fs.write(f, off, &vec![k as u8; len as usize]).unwrap();
        held.extend(off / 4096..=(off + len - 1) / 4096);
        let a = fs.getattr(f).unwrap();
        assert_eq!(
            a.blocks,
            held.len() as u64 * 8,
            "after write {k} at {off}+{len}"
        );
    }
}

on_every_layout!(
    st_blocks_follow_writes,
    st_blocks_follow_writes_on_one_log,
    st_blocks_follow_writes_on_dual,
    st_blocks_follow_writes_on_uip
);

on_every_layout!(
    link_count_limit_is_emlink,
    link_count_limit_is_emlink_on_one_log,
    link_count_limit_is_emlink_on_dual,
    link_count_limit_is_emlink_on_uip
);
fn link_count_limit_is_emlink(fs: Fs) {
    let f = fs.mknod(CTX, ROOT_INO, b"f", 0o100644, 0).unwrap();
    let d = fs.mkdir(CTX, ROOT_INO, b"links", 0o755).unwrap();
    for i in 1..LINK_MAX {
        fs.link(f.ino, d.ino, format!("l{i}").as_bytes()).unwrap();
    }
    assert_eq!(fs.getattr(f.ino).unwrap().nlink, LINK_MAX);
    assert!(matches!(
        fs.link(f.ino, d.ino, b"one-too-many"),
        Err(FsError::TooManyLinks)
    ));
    let report = fs.check().unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
}

on_every_layout!(
    size_name_and_xattr_limits,
    size_name_and_xattr_limits_on_one_log,
    size_name_and_xattr_limits_on_dual,
    size_name_and_xattr_limits_on_uip
);
fn size_name_and_xattr_limits(fs: Fs) {
    let f = fs.mknod(CTX, ROOT_INO, b"f", 0o100644, 0).unwrap();
    assert!(matches!(
        fs.write(f.ino, MAX_FILE_BYTES - 2, b"abc"),
        Err(FsError::FileTooBig)
    ));
    fs.write(f.ino, MAX_FILE_BYTES - 3, b"abc").unwrap();
    assert_eq!(fs.getattr(f.ino).unwrap().size, MAX_FILE_BYTES);
    assert_eq!(fs.read(f.ino, MAX_FILE_BYTES - 3, 10).unwrap(), b"abc");
    assert_eq!(
        fs.lseek(f.ino, 0, ldfs::fs::Whence::Data).unwrap(),
        (MAX_FILE_BYTES - 3) / 4096 * 4096
    );
    let long = vec![b'x'; 256];
    assert!(matches!(
        fs.mknod(CTX, ROOT_INO, &long, 0o100644, 0),
        Err(FsError::NameTooLong)
    ));
    assert!(matches!(
        fs.lookup(ROOT_INO, &long),
        Err(FsError::NameTooLong)
    ));
    fs.mknod(CTX, ROOT_INO, &long[..255], 0o100644, 0).unwrap();
    let big = vec![7u8; 30_000];
    fs.setxattr(f.ino, b"user.big", &big, XattrMode::Any)
        .unwrap();
    fs.setxattr(f.ino, b"user.big2", &big, XattrMode::Any)
        .unwrap();
    assert_eq!(fs.getxattr(f.ino, b"user.big").unwrap(), big);
    // Values of up to 4 KiB live in the inode record, which holds 32 KiB
    // of names and such values: past that, ENOSPC (as ext4's block).
    let mut k = 0;
    let full = loop {
        let r = fs.setxattr(
            f.ino,
            format!("user.i{k}").as_bytes(),
            &[1u8; 4096],
            XattrMode::Create,
        );
        if r.is_err() {
            break r;
        }
        k += 1;
    };
    assert!(
        matches!(full, Err(FsError::NoSpace { .. })) && k == 7,
        "{k}: {full:?}"
    );
    let report = fs.check().unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
}

on_every_layout!(
    xattr_values_up_to_64_kib,
    xattr_values_up_to_64_kib_on_one_log,
    xattr_values_up_to_64_kib_on_dual,
    xattr_values_up_to_64_kib_on_uip
);
/// Values up to Linux's XATTR_SIZE_MAX (65536 bytes) are set, read,
/// listed, replaced (by longer, shorter and inline ones) and removed; one
/// byte more is E2BIG. Their lists go with them: the check finds none left.
fn xattr_values_up_to_64_kib(fs: Fs) {
    let f = fs.mknod(CTX, ROOT_INO, b"f", 0o100644, 0).unwrap();
    let value =
        |len: usize, seed: u8| -> Vec<u8> { (0..len).map(|k| (k % 251) as u8 ^ seed).collect() };
    let max = value(65536, 1);
    fs.setxattr(f.ino, b"user.max", &max, XattrMode::Create)
        .unwrap();
    assert_eq!(fs.getxattr(f.ino, b"user.max").unwrap(), max);
    assert!(matches!(
        fs.setxattr(f.ino, b"user.over", &value(65537, 2), XattrMode::Any),
        Err(FsError::ValueTooBig)
    ));
    assert!(matches!(
        fs.setxattr(f.ino, b"user.max", &value(65537, 2), XattrMode::Replace),
        Err(FsError::ValueTooBig)
    ));
    // Twenty of them on one inode.
    for k in 0..20u8 {
        let name = format!("user.v{k:02}");
        fs.setxattr(
            f.ino,
            name.as_bytes(),
            &value(40_000 + k as usize, k),
            XattrMode::Create,
        )
        .unwrap();
    }
    let names = fs.listxattr(f.ino).unwrap();
    assert_eq!(names.len(), 21);
    assert!(names.contains(&b"user.max".to_vec()));
    for k in 0..20u8 {
        let name = format!("user.v{k:02}");
        assert_eq!(
            fs.getxattr(f.ino, name.as_bytes()).unwrap(),
            value(40_000 + k as usize, k),
            "{name}"
        );
    }
    // Replaced by a shorter long value, an inline one, and a long one again.
    for (len, seed) in [(5000, 3), (10, 4), (65536, 5), (4097, 6), (4096, 7)] {
        fs.setxattr(f.ino, b"user.max", &value(len, seed), XattrMode::Replace)
            .unwrap();
        assert_eq!(fs.getxattr(f.ino, b"user.max").unwrap(), value(len, seed));
    }
    for k in 0..10u8 {
        fs.removexattr(f.ino, format!("user.v{k:02}").as_bytes())
            .unwrap();
    }
    assert!(matches!(
        fs.getxattr(f.ino, b"user.v00"),
        Err(FsError::NoAttr)
    ));
    assert_eq!(fs.listxattr(f.ino).unwrap().len(), 11);
    let report = fs.check().unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    // Unlinking the file deletes the lists of the values it still has.
    fs.unlink(ROOT_INO, b"f").unwrap();
    let report = fs.check().unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
}

/// A 64 KiB value survives a clean remount (what the log holds) and one
/// after the engine is dropped without a checkpoint (rolled forward).
#[test]
fn xattr_values_up_to_64_kib_survive_remounts() {
    let dev = Arc::new(MemoryDevice::new(256 << 20));
    let value: Vec<u8> = (0..65536u32).map(|k| (k * 7 % 256) as u8).collect();
    let ino = {
        let lld = Arc::new(
            Lld::create(dev.clone(), &MkfsOptions::default(), LldOptions::default()).unwrap(),
        );
        Fs::format(&*lld, CTX).unwrap();
        let ld: Arc<dyn LogicalDisk> = lld.clone();
        let fs = Fs::mount(ld, FsOptions::default()).unwrap();
        let f = fs.mknod(CTX, ROOT_INO, b"f", 0o100644, 0).unwrap();
        fs.setxattr(f.ino, b"user.a", &value, XattrMode::Create)
            .unwrap();
        drop(fs);
        match Arc::try_unwrap(lld) {
            Ok(l) => l.close().unwrap(),
            Err(_) => panic!("engine still shared"),
        }
        f.ino
    };
    {
        let lld = Arc::new(Lld::open(dev.clone(), LldOptions::default()).unwrap());
        let ld: Arc<dyn LogicalDisk> = lld.clone();
        let fs = Fs::mount(ld, FsOptions::default()).unwrap();
        assert_eq!(fs.getxattr(ino, b"user.a").unwrap(), value);
        fs.setxattr(ino, b"user.b", &value[1..], XattrMode::Create)
            .unwrap();
        fs.fsync().unwrap();
        drop(fs);
        match Arc::try_unwrap(lld) {
            Ok(l) => l.abandon(),
            Err(_) => panic!("engine still shared"),
        }
    }
    let ld: Arc<dyn LogicalDisk> = Arc::new(Lld::open(dev, LldOptions::default()).unwrap());
    let fs = Fs::mount(ld, FsOptions::default()).unwrap();
    assert_eq!(fs.getxattr(ino, b"user.a").unwrap(), value);
    assert_eq!(fs.getxattr(ino, b"user.b").unwrap(), value[1..]);
    let report = fs.check().unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
}

on_every_layout!(
    readdir_cookies_survive_inserts_and_removals,
    readdir_cookies_survive_inserts_and_removals_on_one_log,
    readdir_cookies_survive_inserts_and_removals_on_dual,
    readdir_cookies_survive_inserts_and_removals_on_uip
);
fn readdir_cookies_survive_inserts_and_removals(fs: Fs) {
    let d = fs.mkdir(CTX, ROOT_INO, b"d", 0o755).unwrap();
    for i in 0..500 {
        fs.mknod(CTX, d.ino, format!("n{i}").as_bytes(), 0o100644, 0)
            .unwrap();
    }
    let first = fs.readdir(d.ino, 0, 100).unwrap();
    let resume = first.last().unwrap().next;
    // Remove some names already returned and add new ones.
    for e in first.iter().skip(2).take(20) {
        fs.unlink(d.ino, &e.name).unwrap();
    }
    for i in 0..50 {
        fs.mknod(CTX, d.ino, format!("m{i}").as_bytes(), 0o100644, 0)
            .unwrap();
    }
    let mut seen: std::collections::HashSet<Vec<u8>> =
        first.iter().map(|e| e.name.clone()).collect();
    let mut off = resume;
    loop {
        let more = fs.readdir(d.ino, off, 64).unwrap();
        if more.is_empty() {
            break;
        }
        for e in &more {
            assert!(seen.insert(e.name.clone()), "{:?} twice", e.name);
            off = e.next;
        }
    }
    for i in 0..500 {
        assert!(seen.contains(format!("n{i}").as_bytes()), "n{i} missed");
    }
}

on_every_layout!(
    open_directory_survives_a_rename_over_its_name,
    open_directory_survives_a_rename_over_its_name_on_one_log,
    open_directory_survives_a_rename_over_its_name_on_dual,
    open_directory_survives_a_rename_over_its_name_on_uip
);
fn open_directory_survives_a_rename_over_its_name(fs: Fs) {
    let a = fs.mkdir(CTX, ROOT_INO, b"a", 0o755).unwrap();
    let b = fs.mkdir(CTX, ROOT_INO, b"b", 0o755).unwrap();
    fs.mknod(CTX, b.ino, b"inside-b", 0o100644, 0).unwrap();
    fs.open(a.ino).unwrap();
    fs.rename(ROOT_INO, b"b", ROOT_INO, b"a", Default::default())
        .unwrap();
    // The old "a" is gone from the tree but its handle still reads.
    let entries = fs.readdir(a.ino, 0, 10).unwrap();
    let names: Vec<&[u8]> = entries.iter().map(|e| e.name.as_slice()).collect();
    assert_eq!(names, vec![&b"."[..], &b".."[..]]);
    assert!(matches!(
        fs.mknod(CTX, a.ino, b"new", 0o100644, 0),
        Err(FsError::NotFound)
    ));
    assert_eq!(fs.lookup(ROOT_INO, b"a").unwrap().ino, b.ino);
    assert!(fs.check().unwrap().problems.is_empty());
    fs.release(a.ino).unwrap();
    // Destroyed with the next batch of released orphans, at the latest at
    // the next flush (DESIGN "The file system").
    fs.fsync().unwrap();
    assert!(matches!(fs.getattr(a.ino), Err(FsError::NotFound)));
    let report = fs.check().unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
}

/// Deleting on a full file system works while the cleaner runs beside it:
/// the cleaner may use the metadata share of the reserve, and a freeing
/// operation reserves its room up front (waiting for the checkpoint that
/// releases what the cleaner emptied) instead of failing half-way through.
/// Filled to NoSpace, then emptied, 20 times, with the background
/// cleaner on; every delete succeeds and the tree stays consistent.
#[test]
fn deletes_on_a_full_file_system_with_the_cleaner_running() {
    let dev = Arc::new(MemoryDevice::new(48 << 20));
    let mk = MkfsOptions {
        segment_bytes: 512 << 10,
        max_block_bytes: 64 << 10,
        reserved_segments: Some(6),
        fs_id: 11,
        max_bytes: None,
        kept_pages: 0,
    };
    let opts = LldOptions {
        cleaner: ldfs::lld::CleanerOptions {
            background: true,
            idle_ms: 1,
            ..Default::default()
        },
        ..Default::default()
    };
    let lld = Arc::new(Lld::create(dev, &mk, opts).unwrap());
    Fs::format(&*lld, CTX).unwrap();
    let ld: Arc<dyn LogicalDisk> = lld.clone();
    let fs = Fs::mount(ld, FsOptions::default()).unwrap();
    let chunk = vec![0x5au8; 96 << 10];
    for cycle in 0..20 {
        let d = fs
            .mkdir(CTX, ROOT_INO, format!("c{cycle}").as_bytes(), 0o755)
            .unwrap()
            .ino;
        let mut n = 0;
        loop {
            let name = format!("f{n}");
            let f = match fs.mknod(CTX, d, name.as_bytes(), 0o100644, 0) {
                Ok(a) => a.ino,
                Err(FsError::NoSpace { .. }) => break,
                Err(e) => panic!("cycle {cycle}: create {name}: {e:?}"),
            };
            match fs.write(f, 0, &chunk) {
                Ok(_) => n += 1,
                Err(FsError::NoSpace { .. }) => {
                    fs.unlink(d, name.as_bytes()).unwrap_or_else(|e| {
                        panic!("cycle {cycle}: unlink {name} when full: {e:?}")
                    });
                    break;
                }
                Err(e) => panic!("cycle {cycle}: write {name}: {e:?}"),
            }
            assert!(n < 2000, "never filled");
        }
        assert!(n > 100, "cycle {cycle}: only {n} files fit");
        for i in 0..n {
            fs.unlink(d, format!("f{i}").as_bytes())
                .unwrap_or_else(|e| panic!("cycle {cycle}: unlink f{i} of {n}: {e:?}"));
        }
        fs.rmdir(ROOT_INO, format!("c{cycle}").as_bytes()).unwrap();
        let report = fs.check().unwrap();
        assert!(
            report.problems.is_empty(),
            "cycle {cycle}: {:?}",
            report.problems
        );
    }
    let problems = lld.check_usage().unwrap();
    assert!(problems.is_empty(), "{problems:?}");
}

/// The dual layout filled to NoSpace on its data device and emptied, a few
/// times: every write that fails, fails before anything is accepted, every
/// delete works on the full device, and afterwards no data block is leaked
/// or both free and referenced.
#[test]
fn dual_data_device_fills_and_empties_cleanly() {
    let meta = Arc::new(MemoryDevice::new(64 << 20));
    let data = Arc::new(MemoryDevice::new(8 << 20));
    let mk = DualMkfsOptions {
        group_blocks: 512,
        ..Default::default()
    };
    ldfs::dual::mkfs(meta.clone(), &*data, &mk).unwrap();
    let dual = Arc::new(Dual::open(meta, data, LldOptions::default()).unwrap());
    Fs::format(&*dual, CTX).unwrap();
    let ld: Arc<dyn LogicalDisk> = dual.clone();
    let fs = Fs::mount(ld, FsOptions::default()).unwrap();
    let chunk = vec![0xa5u8; 96 << 10];
    for cycle in 0..3 {
        let d = fs
            .mkdir(CTX, ROOT_INO, format!("c{cycle}").as_bytes(), 0o755)
            .unwrap()
            .ino;
        let mut n = 0;
        loop {
            let name = format!("f{n}");
            let f = fs.mknod(CTX, d, name.as_bytes(), 0o100644, 0).unwrap().ino;
            match fs.write(f, 0, &chunk) {
                Ok(_) => n += 1,
                Err(FsError::NoSpace { .. }) => {
                    assert_eq!(fs.getattr(f).unwrap().size, 0, "a failed write left bytes");
                    fs.unlink(d, name.as_bytes()).unwrap();
                    break;
                }
                Err(e) => panic!("cycle {cycle}: write {name}: {e:?}"),
            }
            assert!(n < 200, "never filled");
        }
        assert!(n >= 70, "cycle {cycle}: only {n} files fit in 8 MiB");
        for i in 0..n {
            fs.unlink(d, format!("f{i}").as_bytes()).unwrap();
        }
        fs.rmdir(ROOT_INO, format!("c{cycle}").as_bytes()).unwrap();
        fs.fsync().unwrap();
        let report = fs.check().unwrap();
        assert!(report.problems.is_empty(), "{:?}", report.problems);
        assert_eq!(dual.check_blocks().unwrap(), Vec::<String>::new());
    }
}

/// The check knows a long value's list: one that went missing is found
/// (and the repair drops that attribute, keeping the others); the lists
/// of live values are not reported as leaked.
#[test]
fn a_long_xattr_values_missing_list_is_found_and_repaired() {
    use ldfs::fs::check::Finding;
    use ldfs::fs::inode::XattrValue;
    let fs = fresh(false);
    let f = fs.mknod(CTX, ROOT_INO, b"f", 0o100644, 0).unwrap();
    fs.setxattr(f.ino, b"user.gone", &[1u8; 50_000], XattrMode::Create)
        .unwrap();
    fs.setxattr(f.ino, b"user.kept", &[2u8; 60_000], XattrMode::Create)
        .unwrap();
    fs.setxattr(f.ino, b"user.small", b"s", XattrMode::Create)
        .unwrap();
    let report = fs.check().unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    let record = fs.inode_record(f.ino).unwrap();
    let list = match &record.xattrs[0] {
        (n, XattrValue::List { list, .. }) if n == b"user.gone" => *list,
        other => panic!("user.gone is not in a list: {other:?}"),
    };
    fs.logical_disk()
        .delete_list(None, ldfs::ld::ListId(list))
        .unwrap();
    let report = fs.check().unwrap();
    assert_eq!(
        report.findings,
        [Finding::MissingList { ino: f.ino, list }],
        "{:?}",
        report.problems
    );
    repairs_clean(&fs);
    assert!(matches!(
        fs.getxattr(f.ino, b"user.gone"),
        Err(FsError::NoAttr)
    ));
    assert_eq!(fs.getxattr(f.ino, b"user.kept").unwrap(), vec![2u8; 60_000]);
    assert_eq!(fs.getxattr(f.ino, b"user.small").unwrap(), b"s");
}

/// An inode unlinked while open whose long value's list is gone (a list
/// lost to damage; the check reports it) is still destroyed by the next
/// mount: the list it would delete is already gone. Otherwise the mount
/// fails, and with it fsck's repair, which mounts the same way.
#[test]
fn an_orphan_whose_long_xattr_list_is_missing_does_not_stop_the_mount() {
    use ldfs::fs::inode::XattrValue;
    let dev = Arc::new(MemoryDevice::new(64 << 20));
    let (ino, list) = {
        let lld = Arc::new(
            Lld::create(dev.clone(), &MkfsOptions::default(), LldOptions::default()).unwrap(),
        );
        Fs::format(&*lld, CTX).unwrap();
        let ld: Arc<dyn LogicalDisk> = lld.clone();
        let fs = Fs::mount(ld, FsOptions::default()).unwrap();
        let f = fs.mknod(CTX, ROOT_INO, b"f", 0o100644, 0).unwrap().ino;
        fs.setxattr(f, b"user.long", &[7u8; 40_000], XattrMode::Create)
            .unwrap();
        fs.open(f).unwrap();
        fs.unlink(ROOT_INO, b"f").unwrap();
        let list = match &fs.inode_record(f).unwrap().xattrs[0] {
            (_, XattrValue::List { list, .. }) => *list,
            other => panic!("user.long is not in a list: {other:?}"),
        };
        fs.logical_disk()
            .delete_list(None, ldfs::ld::ListId(list))
            .unwrap();
        fs.fsync().unwrap();
        drop(fs);
        match Arc::try_unwrap(lld) {
            // As a crash with the file still open leaves it.
            Ok(l) => l.abandon(),
            Err(_) => panic!("engine still shared"),
        }
        (f, list)
    };
    let ld: Arc<dyn LogicalDisk> = Arc::new(Lld::open(dev, LldOptions::default()).unwrap());
    let fs = Fs::mount(ld, FsOptions::default())
        .unwrap_or_else(|e| panic!("orphan {ino} (its list {list} gone) stops the mount: {e}"));
    assert!(matches!(fs.inode_record(ino), Err(FsError::NotFound)));
    let report = fs.check().unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
}

/// ACL attribute values from a user, well formed or not: each is taken or
/// refused with Invalid, never a panic. Whatever was taken keeps the
/// upkeep's invariant: a stored access ACL says the mode's permission
/// bits, after its own setting, after a chmod, and on inodes created under
/// a default ACL (`LDFS_SEED` replays).
#[test]
fn posix_acl_values_from_users_are_taken_or_invalid_never_a_panic() {
    use ldfs::fs::acl::{Acl, ACCESS, DEFAULT};
    use ldfs::fs::SetAttr;
    use rand::{Rng, SeedableRng};
    let seed = std::env::var("LDFS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2026u64);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let fs = fresh(false);
    let d = fs.mkdir(CTX, ROOT_INO, b"d", 0o755).unwrap().ino;
    let f = fs.mknod(CTX, ROOT_INO, b"f", 0o100644, 0).unwrap().ino;
    // The access ACL stored on `ino`, if any, says its mode bits.
    let agrees = |ino: u64, when: &str| {
        let mode = fs.getattr(ino).unwrap().perm as u32 & 0o777;
        match fs.getxattr(ino, ACCESS) {
            Ok(v) => {
                let (bits, extended) = Acl::parse(&v)
                    .and_then(|a| a.mode())
                    .unwrap_or_else(|| panic!("seed {seed} {when}: stored ACL {v:?} unparsable"));
                assert_eq!(bits, mode, "seed {seed} {when}: ACL {v:?} vs mode {mode:o}");
                assert!(
                    extended,
                    "seed {seed} {when}: a minimal ACL {v:?} was stored"
                );
            }
            Err(FsError::NoAttr) => {}
            Err(e) => panic!("seed {seed} {when}: {e}"),
        }
    };
    let tags = [0x01u16, 0x02, 0x04, 0x08, 0x10, 0x20];
    let mut taken = 0;
    for round in 0..3000 {
        let mut v: Vec<u8> = Vec::new();
        match rng.gen_range(0..4) {
            // Any bytes.
            0 => v.extend((0..rng.gen_range(0..40)).map(|_| rng.gen::<u8>())),
            // Entries with known tags, some ACLs: each class once, in order.
            _ => {
                v.extend_from_slice(&2u32.to_le_bytes());
                for (k, &tag) in tags.iter().enumerate() {
                    let times = match (k, rng.gen_range(0..10)) {
                        (_, 0) => 0,
                        (1 | 3, n) => n % 3,
                        (_, 9) => 2,
                        _ => 1,
                    };
                    for _ in 0..times {
                        let tag = if rng.gen_range(0..50) == 0 {
                            rng.gen()
                        } else {
                            tag
                        };
                        let perm: u16 = if rng.gen_range(0..20) == 0 {
                            rng.gen()
                        } else {
                            rng.gen_range(0..8)
                        };
                        v.extend_from_slice(&tag.to_le_bytes());
                        v.extend_from_slice(&perm.to_le_bytes());
                        v.extend_from_slice(&rng.gen_range(0u32..4).to_le_bytes());
                    }
                }
                if rng.gen_range(0..10) == 0 {
                    v.truncate(rng.gen_range(0..v.len() + 1));
                }
            }
        }
        let (ino, name) = if rng.gen_bool(0.5) {
            (f, ACCESS)
        } else {
            (d, DEFAULT)
        };
        let when = format!("round {round} {} {v:?}", String::from_utf8_lossy(name));
        match fs.setxattr(ino, name, &v, XattrMode::Any) {
            Ok(()) => taken += 1,
            Err(FsError::Invalid(_)) => {}
            Err(e) => panic!("seed {seed} {when}: {e:?}"),
        }
        agrees(f, &when);
        let sa = SetAttr {
            mode: Some(rng.gen_range(0..0o1000)),
            ..SetAttr::default()
        };
        fs.setattr(f, &sa).unwrap();
        agrees(f, &format!("{when}, chmod {:o}", sa.mode.unwrap()));
        let name = format!("n{round}");
        let mode = rng.gen_range(0..0o1000);
        let c = if rng.gen_bool(0.5) {
            fs.mknod(CTX, d, name.as_bytes(), 0o100000 | mode, 0)
        } else {
            fs.mkdir(CTX, d, name.as_bytes(), mode)
        }
        .unwrap_or_else(|e| panic!("seed {seed} {when}: create: {e}"));
        agrees(c.ino, &format!("{when}, created {mode:o}"));
        if c.kind == ldfs::fs::inode::Kind::Dir {
            fs.rmdir(d, name.as_bytes()).unwrap();
        } else {
            fs.unlink(d, name.as_bytes()).unwrap();
        }
    }
    assert!(taken >= 100, "seed {seed}: only {taken} ACLs taken");
    let report = fs.check().unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
}

/// A long value's list that lost a block (damage) leaves the value
/// unreadable (EIO); the check says so, as it does for a list that is
/// gone, and the repair drops that attribute with its list, keeping the
/// others.
#[test]
fn a_long_xattr_values_list_short_of_a_block_is_found_by_the_check() {
    use ldfs::fs::check::Finding;
    use ldfs::fs::inode::XattrValue;
    let fs = fresh(false);
    let f = fs.mknod(CTX, ROOT_INO, b"f", 0o100644, 0).unwrap();
    fs.setxattr(f.ino, b"user.v", &[3u8; 40_000], XattrMode::Create)
        .unwrap();
    fs.setxattr(f.ino, b"user.w", &[4u8; 40_000], XattrMode::Create)
        .unwrap();
    let list = match &fs.inode_record(f.ino).unwrap().xattrs[0] {
        (_, XattrValue::List { list, .. }) => *list,
        other => panic!("user.v is not in a list: {other:?}"),
    };
    fs.logical_disk()
        .delete(None, ldfs::ld::ListId(list), 1)
        .unwrap();
    assert!(matches!(fs.getxattr(f.ino, b"user.v"), Err(FsError::Io(_))));
    let report = fs.check().unwrap();
    assert!(
        matches!(
            report.findings.as_slice(),
            [Finding::BadValueList { ino, list: l, .. }] if *ino == f.ino && *l == list
        ),
        "list {list} of inode {} lost block 1: {:?}",
        f.ino,
        report.problems
    );
    repairs_clean(&fs);
    assert!(matches!(
        fs.getxattr(f.ino, b"user.v"),
        Err(FsError::NoAttr)
    ));
    assert_eq!(fs.getxattr(f.ino, b"user.w").unwrap(), vec![4u8; 40_000]);
    // A block of the wrong length is found too.
    let list = match &fs.inode_record(f.ino).unwrap().xattrs[0] {
        (_, XattrValue::List { list, .. }) => *list,
        other => panic!("user.w is not in a list: {other:?}"),
    };
    fs.logical_disk()
        .write(None, ldfs::ld::ListId(list), 1, &[4u8; 100])
        .unwrap();
    let report = fs.check().unwrap();
    assert!(
        matches!(report.findings.as_slice(), [Finding::BadValueList { .. }]),
        "{:?}",
        report.problems
    );
}

/// A record whose long value names a list that is another inode's (a
/// directory's buckets here; a record damaged or written by a bug): the
/// check says so (before, it found nothing, and a removexattr deleted the
/// directory's entries with "its" list), and the repair drops the
/// attribute and keeps the directory whole.
#[test]
fn a_list_named_by_a_long_value_and_a_directory_is_found_by_the_check() {
    use ldfs::fs::check::Finding;
    use ldfs::fs::inode::XattrValue;
    let fs = fresh(false);
    let d = fs.mkdir(CTX, ROOT_INO, b"d", 0o755).unwrap().ino;
    fs.mknod(CTX, d, b"x", 0o100644, 0).unwrap();
    let f = fs.mknod(CTX, ROOT_INO, b"f", 0o100644, 0).unwrap().ino;
    let mut r = fs.inode_record(f).unwrap();
    let list = fs.inode_record(d).unwrap().list;
    r.xattrs
        .push((b"user.v".to_vec(), XattrValue::List { list, len: 5000 }));
    // The inode list (2, docs/FORMAT.md), written past the fs's cache: the
    // check reads the records from the LD.
    fs.logical_disk()
        .write(None, ldfs::ld::ListId(2), f, &r.encode())
        .unwrap();
    let report = fs.check().unwrap();
    assert!(
        matches!(
            report.findings.as_slice(),
            [Finding::SharedValueList { ino, with, .. }] if *ino == f && *with == d
        ),
        "inode {f}'s value and directory {d} both name list {list}: {:?}",
        report.problems
    );
    repairs_clean(&fs);
    assert!(fs.lookup(d, b"x").is_ok(), "the directory lost its entry");
    assert!(fs.inode_record(f).unwrap().xattrs.is_empty());
}

/// ACLs Linux refuses (`posix_acl_valid`: each of the owner, owning group
/// and other entries once, in tag order, a mask exactly when there are
/// named entries, permissions within rwx) are Invalid, as there: what is
/// stored is an ACL the kernel can read back.
#[test]
fn posix_acls_linux_refuses_are_invalid() {
    use ldfs::fs::acl::ACCESS;
    let acl = |entries: &[(u16, u16, u32)]| -> Vec<u8> {
        let mut v = 2u32.to_le_bytes().to_vec();
        for &(tag, perm, id) in entries {
            v.extend_from_slice(&tag.to_le_bytes());
            v.extend_from_slice(&perm.to_le_bytes());
            v.extend_from_slice(&id.to_le_bytes());
        }
        v
    };
    let fs = fresh(false);
    let f = fs.mknod(CTX, ROOT_INO, b"f", 0o100644, 0).unwrap().ino;
    // A mask without named entries is valid (setfacl -m m::rx makes one).
    let masked = acl(&[(1, 6, 0), (4, 4, 0), (0x10, 0, 0), (0x20, 4, 0)]);
    fs.setxattr(f, ACCESS, &masked, XattrMode::Any).unwrap();
    assert_eq!(fs.getattr(f).unwrap().perm & 0o777, 0o604);
    let valid = acl(&[(1, 6, 0), (2, 7, 5), (4, 4, 0), (0x10, 7, 0), (0x20, 4, 0)]);
    fs.setxattr(f, ACCESS, &valid, XattrMode::Any).unwrap();
    // (what, entries as (tag, permissions, id))
    type Case = (&'static str, &'static [(u16, u16, u32)]);
    let refused: [Case; 7] = [
        (
            "owner twice",
            &[(1, 6, 0), (1, 7, 0), (4, 4, 0), (0x20, 4, 0)],
        ),
        (
            "a named user without a mask",
            &[(1, 6, 0), (2, 7, 5), (4, 4, 0), (0x20, 4, 0)],
        ),
        (
            "a mask without the owning group",
            &[(1, 6, 0), (0x10, 7, 0), (0x20, 4, 0)],
        ),
        (
            "other before the owning group",
            &[(1, 6, 0), (0x20, 4, 0), (4, 4, 0)],
        ),
        (
            "permissions past rwx",
            &[(1, 0o16, 0), (4, 4, 0), (0x20, 4, 0)],
        ),
        (
            "other twice",
            &[(1, 6, 0), (4, 4, 0), (0x20, 4, 0), (0x20, 0, 0)],
        ),
        ("no other", &[(1, 6, 0), (4, 4, 0)]),
    ];
    for (what, entries) in refused {
        match fs.setxattr(f, ACCESS, &acl(entries), XattrMode::Any) {
            Err(FsError::Invalid(_)) => {}
            r => panic!("{what}: {r:?}"),
        }
        assert_eq!(fs.getxattr(f, ACCESS).unwrap(), valid, "{what}");
    }
}

on_every_layout!(
    an_inode_with_the_most_long_values,
    an_inode_with_the_most_long_values_on_one_log,
    an_inode_with_the_most_long_values_on_dual,
    an_inode_with_the_most_long_values_on_uip
);
/// An inode holding as many long values as it may (1024, each in a list
/// of its own): its record stays within bounds, one more is refused, the
/// values read back, and an unlink deletes all 1024 lists in one ARU.
fn an_inode_with_the_most_long_values(fs: Fs) {
    let f = fs.mknod(CTX, ROOT_INO, b"f", 0o100644, 0).unwrap().ino;
    let value = |k: usize| vec![(k % 251) as u8; 4097 + k % 7];
    for k in 0..ldfs::fs::inode::XATTR_COUNT_MAX {
        fs.setxattr(
            f,
            format!("user.{k:04}").as_bytes(),
            &value(k),
            XattrMode::Create,
        )
        .unwrap_or_else(|e| panic!("value {k}: {e}"));
    }
    assert!(matches!(
        fs.setxattr(f, b"user.more", &value(0), XattrMode::Create),
        Err(FsError::NoSpace { .. })
    ));
    let r = fs.inode_record(f).unwrap();
    assert!(r.encoded_len() <= 112 + 4096 + 32768 + 5 * 1024);
    for k in [0, 511, 1023] {
        assert_eq!(
            fs.getxattr(f, format!("user.{k:04}").as_bytes()).unwrap(),
            value(k)
        );
    }
    let report = fs.check().unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    fs.unlink(ROOT_INO, b"f").unwrap();
    let report = fs.check().unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
}

/// DualFS 3.1 on the dual layout: a new directory is tied to the emptiest
/// group and the files made in it take their blocks there (the fs gives a
/// file's list its directory's as `near`), so files of two directories
/// written in turns land in two groups, one per directory; each file's
/// blocks lie in a row (a file grown after others were written in the
/// directory continues in a second run); the ties survive a remount.
#[test]
fn dual_directories_keep_their_files_in_their_group() {
    let meta = Arc::new(MemoryDevice::new(64 << 20));
    let data = Arc::new(MemoryDevice::new(16 << 20));
    let mk = DualMkfsOptions {
        group_blocks: 256,
        ..Default::default()
    };
    ldfs::dual::mkfs(meta.clone(), &*data, &mk).unwrap();
    let dual = Arc::new(Dual::open(meta.clone(), data.clone(), LldOptions::default()).unwrap());
    Fs::format(&*dual, CTX).unwrap();
    let ld: Arc<dyn LogicalDisk> = dual.clone();
    let fs = Fs::mount(ld, FsOptions::default()).unwrap();
    let dirs =
        [b"a".as_slice(), b"b".as_slice()].map(|n| fs.mkdir(CTX, ROOT_INO, n, 0o755).unwrap().ino);
    let chunk = |k: usize| vec![k as u8; 40 << 10];
    let mut files = [Vec::new(), Vec::new()];
    for k in 0..3 {
        for (d, &dir) in dirs.iter().enumerate() {
            let f = fs
                .mknod(CTX, dir, format!("f{k}").as_bytes(), 0o100644, 0)
                .unwrap()
                .ino;
            fs.write(f, 0, &chunk(k)).unwrap();
            files[d].push(f);
        }
    }
    // The first file of each directory grows after the others were written.
    for fl in &files {
        fs.write(fl[0], 40 << 10, &chunk(9)).unwrap();
    }
    let geo = dual.stats().geo;
    let blocks_of = |dual: &Dual, fs: &Fs, ino: u64| -> Vec<u64> {
        let list = ldfs::ld::ListId(fs.inode_record(ino).unwrap().list);
        (0..)
            .map_while(|i| dual.data_block(list, i).unwrap())
            .collect()
    };
    let mut groups = Vec::new();
    for (d, fl) in files.iter().enumerate() {
        let mut gs = std::collections::BTreeSet::new();
        for (k, &f) in fl.iter().enumerate() {
            let b = blocks_of(&dual, &fs, f);
            assert_eq!(b.len(), if k == 0 { 20 } else { 10 });
            gs.extend(b.iter().map(|&x| geo.group_of(x)));
            let runs = 1 + b.windows(2).filter(|w| w[1] != w[0] + 1).count();
            assert!(
                runs <= if k == 0 { 2 } else { 1 },
                "dir {d} file {k}: {b:?}"
            );
        }
        assert_eq!(gs.len(), 1, "dir {d}'s files span groups {gs:?}");
        let g = *gs.first().unwrap();
        let dlist = ldfs::ld::ListId(fs.inode_record(dirs[d]).unwrap().list);
        assert_eq!(dual.tie(dlist).unwrap(), Some(g));
        groups.push(g);
    }
    assert_ne!(groups[0], groups[1], "two new directories share a group");
    fs.fsync().unwrap();
    drop(fs);
    dual.close().unwrap();
    drop(dual);
    // After a remount a new file in `b` still goes to b's group.
    let dual = Arc::new(Dual::open(meta, data, LldOptions::default()).unwrap());
    let ld: Arc<dyn LogicalDisk> = dual.clone();
    let fs = Fs::mount(ld, FsOptions::default()).unwrap();
    let f = fs.mknod(CTX, dirs[1], b"late", 0o100644, 0).unwrap().ino;
    fs.write(f, 0, &chunk(7)).unwrap();
    let b = blocks_of(&dual, &fs, f);
    assert!(b.iter().all(|&x| geo.group_of(x) == groups[1]), "{b:?}");
    assert_eq!(dual.check_blocks().unwrap(), Vec::<String>::new());
    assert!(fs.check().unwrap().problems.is_empty());
}
