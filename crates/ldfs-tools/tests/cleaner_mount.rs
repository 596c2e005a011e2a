//! The cleaner through a real mount: `ldfs clean MOUNTPOINT` (clean now,
//! background on/off, stop), `-o cleaner=`, `ldfs stats`, and statfs
//! reporting what a user can still write — also after deletes, when the
//! space comes back only through cleaning.

mod common;

use std::fs::{self, File};
use std::io::Write;
use std::path::Path;

use common::{cstr, fuse_usable, ldfs, mkfs, Mount};

fn run(args: &[&str], target: &Path) -> (bool, String) {
    let out = ldfs().args(args).arg(target).output().unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

fn data(i: usize, len: usize) -> Vec<u8> {
    (0..len).map(|k| (k * 7 + i * 131) as u8).collect()
}

/// The number after `key` in `text` ("cleaned: 3 segments" -> 3).
fn number_after(text: &str, key: &str) -> u64 {
    let at = text
        .find(key)
        .unwrap_or_else(|| panic!("no {key:?} in {text}"))
        + key.len();
    text[at..]
        .trim_start()
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no number after {key:?} in {text}"))
}

fn available_bytes(dir: &Path) -> u64 {
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(cstr(dir).as_ptr(), &mut st) }, 0);
    st.f_bavail * st.f_frsize
}

#[test]
fn clean_a_mount_switch_policies_and_stop() {
    if !fuse_usable() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let img = t.path().join("c.img");
    mkfs(&img, "64M");
    let mnt = t.path().join("mnt");
    let m = Mount::new(&img, &mnt, &["cleaner=off"]);
    let (ok, text) = run(&["stats"], &mnt);
    assert!(ok, "{text}");
    assert!(text.contains("background off"), "{text}");
    assert_eq!(number_after(&text, "cleaned:"), 0, "{text}");
    // 24 files of 1 MiB, then three of every four deleted: segments a
    // quarter full.
    for i in 0..24 {
        let mut f = File::create(m.path(&format!("f{i}"))).unwrap();
        f.write_all(&data(i, 1 << 20)).unwrap();
        f.sync_all().unwrap();
    }
    for i in (0..24).filter(|i| i % 4 != 0) {
        fs::remove_file(m.path(&format!("f{i}"))).unwrap();
    }
    let (ok, text) = run(&["sync"], &mnt);
    assert!(ok, "{text}");

    let (ok, text) = run(
        &["clean", "--policy", "greedy", "--max-utilization", "60"],
        &mnt,
    );
    assert!(ok, "{text}");
    assert!(text.contains("cleaned with greedy:"), "{text}");
    let released = number_after(&text, "cleaned with greedy:");
    assert!(released >= 4, "{text}");
    assert!(number_after(&text, "cleaned:") >= released, "{text}");
    for i in (0..24).step_by(4) {
        assert!(
            fs::read(m.path(&format!("f{i}"))).unwrap() == data(i, 1 << 20),
            "f{i} damaged by cleaning"
        );
    }

    // Background cleaning on with another policy, then stopped.
    let (ok, text) = run(
        &["clean", "--background", "on", "--policy", "cost-benefit"],
        &mnt,
    );
    assert!(ok, "{text}");
    assert!(
        text.contains("policy cost-benefit, background on"),
        "{text}"
    );
    let (ok, text) = run(&["clean", "--stop"], &mnt);
    assert!(ok, "{text}");
    assert!(text.contains("background off"), "{text}");
    // Bad requests are clear errors and change nothing.
    let (ok, text) = run(&["clean", "--policy", "lru"], &mnt);
    assert!(!ok && text.contains("lru"), "{text}");
    let (ok, text) = run(&["clean", "--max-utilization", "120"], &mnt);
    assert!(!ok && text.contains("120"), "{text}");
    m.unmount();

    // --background and --stop need a mount point.
    let (ok, text) = run(&["clean", "--stop"], &img);
    assert!(!ok && text.contains("mount point"), "{text}");
    // A directory that is not an ldfs mount.
    let (ok, text) = run(&["clean"], t.path());
    assert!(!ok && text.contains("not a mounted ldfs"), "{text}");

    // Remounted with a policy: the data is there, the policy is the one asked for.
    let m = Mount::new(&img, &mnt, &["cleaner=greedy,clean_start=6,clean_stop=12"]);
    let (ok, text) = run(&["stats"], &mnt);
    assert!(ok, "{text}");
    assert!(
        text.contains("policy greedy, background on, starts below 6 and stops above 12"),
        "{text}"
    );
    for i in (0..24).step_by(4) {
        assert!(fs::read(m.path(&format!("f{i}"))).unwrap() == data(i, 1 << 20));
    }
    m.unmount();

    // Bad cleaner options refuse the mount with the option named.
    for bad in ["cleaner=lru", "clean_start=8,clean_stop=2"] {
        let out = ldfs()
            .args(["mount", "-o", bad])
            .arg(&img)
            .arg(&mnt)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{bad} mounted");
        let key = bad.split(['=', ',']).next().unwrap();
        assert!(err.contains(key), "{bad}: {err}");
    }
}

/// statfs says what fits: filling the file system writes about what it
/// reported available; after deletes it reports the freed space at once,
/// and that much can be written again (the cleaner makes the room while
/// writers wait), with every byte intact afterwards.
#[test]
fn statfs_reports_what_a_user_can_write() {
    if !fuse_usable() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let img = t.path().join("s.img");
    mkfs(&img, "64M");
    let mnt = t.path().join("mnt");
    let m = Mount::new(&img, &mnt, &[]);
    let chunk = 256 << 10;
    let fill = |first: usize, m: &Mount| -> usize {
        let mut i = first;
        loop {
            let r = (|| -> std::io::Result<()> {
                let mut f = File::create(m.path(&format!("f{i}")))?;
                f.write_all(&data(i, chunk))?;
                f.sync_all()
            })();
            match r {
                Ok(()) => i += 1,
                Err(e) => {
                    assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
                    let _ = fs::remove_file(m.path(&format!("f{i}")));
                    return i - first;
                }
            }
            assert!(i - first < 1000, "a 64 MiB image never filled");
        }
    };
    let avail0 = available_bytes(&mnt);
    let files = fill(0, &m);
    let written = (files * chunk) as u64;
    // Within a file's worth plus 3% (inodes, names, summary records).
    let slack = chunk as u64 + avail0 * 3 / 100;
    assert!(
        written + slack >= avail0 && written <= avail0 + slack,
        "statfs said {avail0} bytes available, {written} fit"
    );
    assert!(
        available_bytes(&mnt) <= slack,
        "full, yet statfs reports space"
    );

    // Delete every other file: the space is reported free at once.
    for i in (0..files).step_by(2) {
        fs::remove_file(m.path(&format!("f{i}"))).unwrap();
    }
    let freed = (files.div_ceil(2) * chunk) as u64;
    let avail1 = available_bytes(&mnt);
    eprintln!("statfs: {avail0} available at first, {written} written until ENOSPC, {freed} deleted, then {avail1} available");
    assert!(
        avail1 + slack >= freed,
        "{freed} bytes deleted, statfs reports {avail1} available"
    );
    // Writing that much again works: segments are half full, so this
    // needs the cleaner, and writers wait for it rather than fail.
    let again = (avail1 as usize).saturating_sub(slack as usize) / chunk;
    for k in 0..again {
        let i = files + k;
        let mut f = File::create(m.path(&format!("f{i}"))).unwrap();
        f.write_all(&data(i, chunk))
            .and_then(|_| f.sync_all())
            .unwrap_or_else(|e| panic!("file {k} of {again} after deletes: {e}"));
    }
    let (ok, text) = run(&["stats"], &mnt);
    assert!(ok, "{text}");
    assert!(number_after(&text, "cleaned:") > 0, "{text}");
    m.unmount();
    let m = Mount::new(&img, &mnt, &[]);
    for i in (1..files).step_by(2).chain(files..files + again) {
        assert!(
            fs::read(m.path(&format!("f{i}"))).unwrap() == data(i, chunk),
            "f{i} damaged"
        );
    }
    m.unmount();
}
