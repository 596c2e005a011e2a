//! A device backed by a regular file or a block device.
//!
//! Reads and writes are positioned (pread/pwrite), so `&self` suffices and
//! calls on different ranges may run concurrently; `flush` is fdatasync.
//!
//! With [`FileDeviceOptions::direct`] the file is opened with `O_DIRECT`: every
//! transfer then goes through a bounce buffer aligned to [`DIRECT_ALIGN`], and a
//! request not aligned to it is widened to the enclosing aligned range (a
//! read-modify-write for writes). Invariants in direct mode: the device size is
//! a multiple of [`DIRECT_ALIGN`] (checked when opening, so widening never
//! crosses the end), and a read-modify-write excludes every other write, so a
//! concurrent write to the same aligned block is never overwritten by a stale
//! copy.
//!
//! [`FileDevice::direct_writes`] keeps reads buffered but sends every write
//! that is aligned to [`DIRECT_ALIGN`] through a second descriptor opened with
//! `O_DIRECT` (the log writes whole pages): a flush then has no dirty page cache
//! to write back, only the device cache to empty, and written segments do not
//! crowd the page cache. The kernel keeps the two coherent: a direct write
//! writes back and drops the cached pages of its range, so a later buffered
//! read sees it. Writes that are not aligned stay buffered.

use std::fs::{File, OpenOptions};
use std::io::{self, Seek, SeekFrom};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::RwLock;

use super::{check_range, Device, DeviceError, DeviceOp};

/// Alignment of offsets, lengths and buffers for `O_DIRECT` transfers. 4096 is
/// at least the logical block size of every common device, so it always works.
const DIRECT_ALIGN: u64 = 4096;

/// How to open a [`FileDevice`].
#[derive(Clone, Debug, Default)]
pub struct FileDeviceOptions {
    /// Open with `O_DIRECT`, bypassing the page cache. Not every file system
    /// supports it (tmpfs before Linux 6.6 fails with `EINVAL`).
    pub direct: bool,
}

/// A regular file or block device used as a [`Device`].
pub struct FileDevice {
    file: File,
    path: PathBuf,
    /// Changes only in `resize` (an atomic so `size_bytes` needs no lock).
    size: std::sync::atomic::AtomicU64,
    direct: bool,
    /// `direct_writes`: the same file opened with `O_DIRECT`, for aligned
    /// writes.
    direct_writer: Option<File>,
    /// Direct mode only: aligned writes take it shared, read-modify-writes take
    /// it exclusive, so an RMW never writes back a block another write changed
    /// between its read and its write.
    write_lock: RwLock<()>,
    /// A block device (discard is BLKDISCARD), not a regular file (a hole).
    block: bool,
}

fn open_error(source: io::Error) -> DeviceError {
    DeviceError::Io {
        op: DeviceOp::Open,
        offset: 0,
        len: 0,
        source,
    }
}

fn io_error(op: DeviceOp, offset: u64, len: u64, source: io::Error) -> DeviceError {
    DeviceError::Io {
        op,
        offset,
        len,
        source,
    }
}

fn open_options(opts: &FileDeviceOptions) -> OpenOptions {
    let mut o = OpenOptions::new();
    o.read(true).write(true);
    if opts.direct {
        o.custom_flags(libc::O_DIRECT);
    }
    o
}

fn check_direct_size(size: u64) -> Result<(), DeviceError> {
    if !size.is_multiple_of(DIRECT_ALIGN) {
        return Err(open_error(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("O_DIRECT needs a size that is a multiple of {DIRECT_ALIGN}, got {size}"),
        )));
    }
    Ok(())
}

impl FileDevice {
    /// Opens an existing regular file or block device read-write. Its size is
    /// the file length, or for a block device the position of its end.
    pub fn open(path: &Path, opts: FileDeviceOptions) -> Result<FileDevice, DeviceError> {
        Self::open_existing(path, opts, true)
    }

    /// Opens an existing regular file or block device for reading only: the
    /// operating system refuses every write (fsck -n writes nothing).
    pub fn open_read_only(path: &Path) -> Result<FileDevice, DeviceError> {
        Self::open_read_only_with(path, FileDeviceOptions::default())
    }

    /// As [`FileDevice::open_read_only`], optionally with `O_DIRECT` (fsck
    /// streams the log past the page cache: no copy, no cache to fill).
    pub fn open_read_only_with(
        path: &Path,
        opts: FileDeviceOptions,
    ) -> Result<FileDevice, DeviceError> {
        Self::open_existing(path, opts, false)
    }

    fn open_existing(
        path: &Path,
        opts: FileDeviceOptions,
        write: bool,
    ) -> Result<FileDevice, DeviceError> {
        let mut o = open_options(&opts);
        o.write(write);
        let mut file = o.open(path).map_err(open_error)?;
        let meta = file.metadata().map_err(open_error)?;
        let kind = meta.file_type();
        let size = if kind.is_file() {
            meta.len()
        } else if kind.is_block_device() {
            // A block device's metadata length is 0; seeking to the end asks
            // the driver for the real size (as BLKGETSIZE64 would).
            file.seek(SeekFrom::End(0)).map_err(open_error)?
        } else {
            return Err(open_error(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{} is neither a regular file nor a block device",
                    path.display()
                ),
            )));
        };
        if opts.direct {
            check_direct_size(size)?;
        }
        let mut dev = FileDevice::from_parts(file, path, size, opts.direct);
        dev.block = kind.is_block_device();
        Ok(dev)
    }

    /// Creates a regular file of `size_bytes` (sparse), truncating and resizing
    /// it if it already exists.
    pub fn create(
        path: &Path,
        size_bytes: u64,
        opts: FileDeviceOptions,
    ) -> Result<FileDevice, DeviceError> {
        if opts.direct {
            // Checked first so a refused size leaves no file behind.
            check_direct_size(size_bytes)?;
        }
        let file = open_options(&opts)
            .create(true)
            .truncate(true)
            .open(path)
            .map_err(open_error)?;
        file.set_len(size_bytes).map_err(open_error)?;
        Ok(FileDevice::from_parts(file, path, size_bytes, opts.direct))
    }

    fn from_parts(file: File, path: &Path, size: u64, direct: bool) -> FileDevice {
        FileDevice {
            file,
            path: path.to_path_buf(),
            size: size.into(),
            direct,
            direct_writer: None,
            write_lock: RwLock::new(()),
            block: false,
        }
    }

    /// Sends the device's aligned writes through a second descriptor opened
    /// with `O_DIRECT` (see the module comment); reads stay buffered. Fails
    /// when the file system refuses `O_DIRECT` (older tmpfs: `EINVAL`) or the
    /// device size is not a multiple of [`DIRECT_ALIGN`]; the device then
    /// stays as it was (buffered). A device in direct mode is left as it is.
    pub fn direct_writes(&mut self) -> Result<(), DeviceError> {
        if self.direct {
            return Ok(());
        }
        check_direct_size(self.size_bytes())?;
        let file = OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(&self.path)
            .map_err(open_error)?;
        self.direct_writer = Some(file);
        Ok(())
    }

    /// Whether aligned writes go through `O_DIRECT` ([`FileDevice::direct_writes`]).
    pub fn has_direct_writes(&self) -> bool {
        self.direct || self.direct_writer.is_some()
    }

    /// The path the device was opened with.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the device was opened with `O_DIRECT`.
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    fn read_direct(&self, buf: &mut [u8], offset: u64) -> Result<(), DeviceError> {
        let len = buf.len() as u64;
        let err = |e| io_error(DeviceOp::Read, offset, len, e);
        // An aligned buffer at an aligned offset is read into directly.
        if (buf.as_ptr() as usize).is_multiple_of(DIRECT_ALIGN as usize)
            && offset.is_multiple_of(DIRECT_ALIGN)
            && len.is_multiple_of(DIRECT_ALIGN)
        {
            return self.file.read_exact_at(buf, offset).map_err(err);
        }
        let (start, end) = widen(offset, len);
        let mut bounce = AlignedBuf::new((end - start) as usize).map_err(err)?;
        self.file
            .read_exact_at(bounce.as_mut_slice(), start)
            .map_err(err)?;
        let skip = (offset - start) as usize;
        buf.copy_from_slice(&bounce.as_slice()[skip..skip + buf.len()]);
        Ok(())
    }

    fn write_direct(&self, buf: &[u8], offset: u64) -> Result<(), DeviceError> {
        let len = buf.len() as u64;
        let err = |e| io_error(DeviceOp::Write, offset, len, e);
        let (start, end) = widen(offset, len);
        // A poisoned lock only means another writer panicked; the file is
        // still consistent, so carry on.
        if start == offset && end == offset + len {
            let _shared = self.write_lock.read().unwrap_or_else(|p| p.into_inner());
            return write_aligned(&self.file, buf, offset).map_err(err);
        }
        let mut bounce = AlignedBuf::new((end - start) as usize).map_err(err)?;
        let _exclusive = self.write_lock.write().unwrap_or_else(|p| p.into_inner());
        {
            let b = bounce.as_mut_slice();
            let block = DIRECT_ALIGN as usize;
            // Only the first and last aligned blocks hold bytes we must keep.
            if offset != start {
                self.file
                    .read_exact_at(&mut b[..block], start)
                    .map_err(err)?;
            }
            if offset + len != end && (end - start > DIRECT_ALIGN || offset == start) {
                let last = b.len() - block;
                self.file
                    .read_exact_at(&mut b[last..], end - DIRECT_ALIGN)
                    .map_err(err)?;
            }
        }
        let skip = (offset - start) as usize;
        bounce.as_mut_slice()[skip..skip + buf.len()].copy_from_slice(buf);
        self.file
            .write_all_at(bounce.as_slice(), start)
            .map_err(err)
    }
}

/// Writes `buf` (aligned offset and length) through an O_DIRECT file:
/// straight from `buf` when its memory is aligned too, else through an
/// aligned copy (which costs far less than the transfer).
fn write_aligned(file: &File, buf: &[u8], offset: u64) -> io::Result<()> {
    if (buf.as_ptr() as usize).is_multiple_of(DIRECT_ALIGN as usize) {
        return file.write_all_at(buf, offset);
    }
    let mut bounce = AlignedBuf::new(buf.len())?;
    bounce.as_mut_slice().copy_from_slice(buf);
    file.write_all_at(bounce.as_slice(), offset)
}

/// The smallest `DIRECT_ALIGN`-aligned range holding `[offset, offset+len)`.
/// The caller has range-checked it against a size that is a multiple of
/// `DIRECT_ALIGN`, so neither end overflows.
fn widen(offset: u64, len: u64) -> (u64, u64) {
    let start = offset / DIRECT_ALIGN * DIRECT_ALIGN;
    let end = (offset + len).div_ceil(DIRECT_ALIGN) * DIRECT_ALIGN;
    (start, end)
}

/// A zeroed byte buffer whose start is `DIRECT_ALIGN`-aligned, carved out of an
/// over-allocated `Vec` so no unsafe code is needed.
struct AlignedBuf {
    storage: Vec<u8>,
    skip: usize,
    len: usize,
}

impl AlignedBuf {
    /// Fails (rather than aborting) when the memory is not available.
    fn new(len: usize) -> io::Result<AlignedBuf> {
        let align = DIRECT_ALIGN as usize;
        let total = len
            .checked_add(align - 1)
            .ok_or_else(|| io::Error::new(io::ErrorKind::OutOfMemory, "bounce buffer too large"))?;
        let mut storage = Vec::new();
        storage
            .try_reserve_exact(total)
            .map_err(|e| io::Error::new(io::ErrorKind::OutOfMemory, e))?;
        storage.resize(total, 0);
        let addr = storage.as_ptr() as usize;
        let skip = (align - addr % align) % align;
        Ok(AlignedBuf { storage, skip, len })
    }

    fn as_slice(&self) -> &[u8] {
        &self.storage[self.skip..self.skip + self.len]
    }

    fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.storage[self.skip..self.skip + self.len]
    }
}

impl Device for FileDevice {
    fn will_need(&self, ranges: &[(u64, u64)]) {
        if self.direct {
            return;
        }
        for &(off, len) in ranges {
            if off >= self.size_bytes() {
                continue;
            }
            let len = len.min(self.size_bytes() - off);
            // Advice only: its result does not matter.
            unsafe {
                libc::posix_fadvise(
                    self.file.as_raw_fd(),
                    off as libc::off_t,
                    len as libc::off_t,
                    libc::POSIX_FADV_WILLNEED,
                );
            }
        }
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), DeviceError> {
        check_range(DeviceOp::Read, offset, buf.len(), self.size_bytes())?;
        if buf.is_empty() {
            return Ok(());
        }
        if self.direct {
            return self.read_direct(buf, offset);
        }
        self.file
            .read_exact_at(buf, offset)
            .map_err(|e| io_error(DeviceOp::Read, offset, buf.len() as u64, e))
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), DeviceError> {
        check_range(DeviceOp::Write, offset, buf.len(), self.size_bytes())?;
        if buf.is_empty() {
            return Ok(());
        }
        if self.direct {
            return self.write_direct(buf, offset);
        }
        if let Some(w) = &self.direct_writer {
            if offset.is_multiple_of(DIRECT_ALIGN)
                && (buf.len() as u64).is_multiple_of(DIRECT_ALIGN)
            {
                return write_aligned(w, buf, offset)
                    .map_err(|e| io_error(DeviceOp::Write, offset, buf.len() as u64, e));
            }
        }
        self.file
            .write_all_at(buf, offset)
            .map_err(|e| io_error(DeviceOp::Write, offset, buf.len() as u64, e))
    }

    fn flush(&self) -> Result<(), DeviceError> {
        self.file
            .sync_data()
            .map_err(|e| io_error(DeviceOp::Flush, 0, 0, e))
    }

    fn size_bytes(&self) -> u64 {
        self.size.load(std::sync::atomic::Ordering::Acquire)
    }

    /// A regular file: `set_len`, then `fsync` (the length and every write
    /// before it durable). A block device: its size is the storage's; the
    /// one it has now is read again (it may have grown) and `false`
    /// returned.
    fn resize(&self, bytes: u64) -> Result<bool, DeviceError> {
        use std::sync::atomic::Ordering;
        if self.block {
            let now = (&self.file)
                .seek(SeekFrom::End(0))
                .map_err(|e| io_error(DeviceOp::Flush, 0, 0, e))?;
            self.size.store(now, Ordering::Release);
            return Ok(false);
        }
        if self.direct {
            check_direct_size(bytes)?;
        }
        self.file
            .set_len(bytes)
            .and_then(|()| self.file.sync_all())
            .map_err(|e| io_error(DeviceOp::Flush, bytes, 0, e))?;
        self.size.store(bytes, Ordering::Release);
        Ok(true)
    }

    fn discard(&self, offset: u64, len: u64) -> Result<bool, DeviceError> {
        check_range(DeviceOp::Discard, offset, len as usize, self.size_bytes())?;
        if len == 0 {
            return Ok(true);
        }
        let fd = self.file.as_raw_fd();
        let r = if self.block {
            // BLKDISCARD = _IO(0x12, 119); its argument is [start, length].
            const BLKDISCARD: libc::c_ulong = (0x12 << 8) | 119;
            let range: [u64; 2] = [offset, len];
            // SAFETY: the ioctl reads two u64 from a live array.
            unsafe { libc::ioctl(fd, BLKDISCARD, range.as_ptr()) }
        } else {
            // SAFETY: plain syscall on an open descriptor.
            unsafe {
                libc::fallocate(
                    fd,
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    offset as libc::off_t,
                    len as libc::off_t,
                )
            }
        };
        if r == 0 {
            return Ok(true);
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EOPNOTSUPP) | Some(libc::ENOTTY) | Some(libc::EINVAL) => Ok(false),
            _ => Err(io_error(DeviceOp::Discard, offset, len, e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// A directory on a disk-backed file system: /tmp may be tmpfs, which
    /// refuses O_DIRECT.
    fn scratch_dir() -> tempfile::TempDir {
        let var_tmp = Path::new("/var/tmp");
        if var_tmp.is_dir() {
            if let Ok(dir) = tempfile::Builder::new()
                .prefix("ldfs-dev-")
                .tempdir_in(var_tmp)
            {
                return dir;
            }
        }
        tempfile::tempdir().unwrap()
    }

    fn direct() -> FileDeviceOptions {
        FileDeviceOptions { direct: true }
    }

    /// Creates a direct-mode device, or `None` (after saying so) when the file
    /// system does not support O_DIRECT.
    fn create_direct(path: &Path, size: u64) -> Option<FileDevice> {
        match FileDevice::create(path, size, direct()) {
            Ok(dev) => Some(dev),
            Err(DeviceError::Io { source, .. }) if source.raw_os_error() == Some(libc::EINVAL) => {
                println!(
                    "skipped: O_DIRECT unsupported on the file system of {}",
                    path.display()
                );
                None
            }
            Err(e) => panic!("create with O_DIRECT failed: {e}"),
        }
    }

    /// Discard punches a hole in an image file: its bytes read as zeros
    /// and the host takes the space back; what is around it stays.
    #[test]
    fn discard_punches_a_hole_in_an_image_file() {
        use std::os::unix::fs::MetadataExt;
        let dir = scratch_dir();
        let path = dir.path().join("dev");
        let dev = FileDevice::create(&path, 4 << 20, FileDeviceOptions::default()).unwrap();
        dev.write_at(&vec![0xab; 4 << 20], 0).unwrap();
        dev.flush().unwrap();
        let before = std::fs::metadata(&path).unwrap().blocks();
        if !dev.discard(1 << 20, 2 << 20).unwrap() {
            println!(
                "skipped: the file system of {} punches no holes",
                path.display()
            );
            return;
        }
        let after = std::fs::metadata(&path).unwrap().blocks();
        assert!(
            after + (2 << 20) / 512 <= before,
            "{before} blocks of 512 bytes before, {after} after"
        );
        let mut buf = vec![1u8; 4 << 20];
        dev.read_at(&mut buf, 0).unwrap();
        assert!(buf[..1 << 20].iter().all(|&b| b == 0xab));
        assert!(buf[1 << 20..3 << 20].iter().all(|&b| b == 0));
        assert!(buf[3 << 20..].iter().all(|&b| b == 0xab));
        assert!(dev.discard(4 << 20, 1).is_err(), "past the end");
    }

    #[test]
    fn create_write_read_flush_round_trip() {
        let dir = scratch_dir();
        let path = dir.path().join("dev");
        let dev = FileDevice::create(&path, 1 << 20, FileDeviceOptions::default()).unwrap();
        assert_eq!(dev.size_bytes(), 1 << 20);
        assert_eq!(dev.path(), path.as_path());
        assert!(!dev.is_direct());
        dev.write_at(b"hello, device", 4000).unwrap();
        dev.flush().unwrap();
        let mut buf = [0u8; 13];
        dev.read_at(&mut buf, 4000).unwrap();
        assert_eq!(&buf, b"hello, device");
        // Untouched bytes of the sparse file read as zero.
        let mut zeros = [1u8; 64];
        dev.read_at(&mut zeros, 100_000).unwrap();
        assert_eq!(zeros, [0u8; 64]);
        drop(dev);

        // Reopening sees the data and the size.
        let dev = FileDevice::open(&path, FileDeviceOptions::default()).unwrap();
        assert_eq!(dev.size_bytes(), 1 << 20);
        let mut buf = [0u8; 13];
        dev.read_at(&mut buf, 4000).unwrap();
        assert_eq!(&buf, b"hello, device");
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 1 << 20);
    }

    #[test]
    fn create_truncates_and_resizes_existing_file() {
        let dir = scratch_dir();
        let path = dir.path().join("dev");
        std::fs::write(&path, vec![7u8; 10_000]).unwrap();
        let dev = FileDevice::create(&path, 8192, FileDeviceOptions::default()).unwrap();
        assert_eq!(dev.size_bytes(), 8192);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 8192);
        let mut buf = [1u8; 16];
        dev.read_at(&mut buf, 0).unwrap();
        assert_eq!(buf, [0u8; 16]);
    }

    #[test]
    fn out_of_range_is_an_error_and_writes_nothing() {
        let dir = scratch_dir();
        let path = dir.path().join("dev");
        let dev = FileDevice::create(&path, 8192, FileDeviceOptions::default()).unwrap();
        let mut buf = [0u8; 16];
        assert!(matches!(
            dev.read_at(&mut buf, 8190),
            Err(DeviceError::OutOfRange {
                op: DeviceOp::Read,
                offset: 8190,
                len: 16,
                size: 8192
            })
        ));
        assert!(matches!(
            dev.write_at(&buf, u64::MAX),
            Err(DeviceError::OutOfRange {
                op: DeviceOp::Write,
                ..
            })
        ));
        assert!(matches!(
            dev.write_at(&buf, 8180),
            Err(DeviceError::OutOfRange { .. })
        ));
        // The file did not grow.
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 8192);
        // Empty requests at the very end are fine.
        dev.read_at(&mut [], 8192).unwrap();
        dev.write_at(&[], 8192).unwrap();
    }

    #[test]
    fn open_missing_file_is_an_open_error() {
        let dir = scratch_dir();
        let err = FileDevice::open(&dir.path().join("absent"), FileDeviceOptions::default())
            .err()
            .unwrap();
        assert!(matches!(
            err,
            DeviceError::Io {
                op: DeviceOp::Open,
                offset: 0,
                len: 0,
                ..
            }
        ));
    }

    #[test]
    fn open_directory_is_an_open_error() {
        let dir = scratch_dir();
        let err = FileDevice::open(dir.path(), FileDeviceOptions::default())
            .err()
            .unwrap();
        assert!(matches!(
            err,
            DeviceError::Io {
                op: DeviceOp::Open,
                ..
            }
        ));
    }

    #[test]
    fn direct_refuses_unaligned_size() {
        let dir = scratch_dir();
        let path = dir.path().join("dev");
        let err = FileDevice::create(&path, 5000, direct()).err().unwrap();
        assert!(matches!(
            err,
            DeviceError::Io {
                op: DeviceOp::Open,
                ..
            }
        ));
        assert!(!path.exists());
        std::fs::write(&path, vec![0u8; 5000]).unwrap();
        assert!(FileDevice::open(&path, direct()).is_err());
    }

    #[test]
    fn direct_round_trip_with_unaligned_requests() {
        let dir = scratch_dir();
        let path = dir.path().join("dev");
        let Some(dev) = create_direct(&path, 64 * 1024) else {
            return;
        };
        assert!(dev.is_direct());

        // Aligned write.
        let aligned: Vec<u8> = (0..8192u32).map(|i| (i % 251) as u8).collect();
        dev.write_at(&aligned, 4096).unwrap();
        // Unaligned writes: inside one block, across a block boundary, and
        // spanning several blocks with both ends ragged.
        dev.write_at(b"abc", 4100).unwrap();
        dev.write_at(&[9u8; 100], 8150).unwrap();
        let long = vec![5u8; 9000];
        dev.write_at(&long, 20_001).unwrap();
        dev.flush().unwrap();

        let mut expect = vec![0u8; 64 * 1024];
        expect[4096..4096 + 8192].copy_from_slice(&aligned);
        expect[4100..4103].copy_from_slice(b"abc");
        expect[8150..8250].fill(9);
        expect[20_001..29_001].fill(5);

        let mut whole = vec![0u8; 64 * 1024];
        dev.read_at(&mut whole, 0).unwrap();
        assert!(
            whole == expect,
            "direct image differs from the expected image"
        );
        // Unaligned reads.
        let mut small = [0u8; 7];
        dev.read_at(&mut small, 4099).unwrap();
        assert_eq!(small[..], expect[4099..4106]);
        let mut span = vec![0u8; 5000];
        dev.read_at(&mut span, 19_999).unwrap();
        assert_eq!(span[..], expect[19_999..24_999]);
        drop(dev);

        // A buffered reopen sees the same bytes.
        let dev = FileDevice::open(&path, FileDeviceOptions::default()).unwrap();
        dev.read_at(&mut whole, 0).unwrap();
        assert!(
            whole == expect,
            "buffered reopen differs from the expected image"
        );
    }

    #[test]
    fn direct_concurrent_unaligned_writes_do_not_lose_data() {
        let dir = scratch_dir();
        let path = dir.path().join("dev");
        let Some(dev) = create_direct(&path, 16 * 1024) else {
            return;
        };
        let dev = Arc::new(dev);
        // Eight threads each own interleaved 100-byte pieces of the same
        // aligned blocks; without the RMW lock some pieces would be reverted.
        let threads: Vec<_> = (0..8u8)
            .map(|t| {
                let dev = Arc::clone(&dev);
                std::thread::spawn(move || {
                    for round in 0..20u64 {
                        let offset = (round * 8 + t as u64) * 100;
                        dev.write_at(&[t + 1; 100], offset).unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let mut buf = vec![0u8; 16_000];
        dev.read_at(&mut buf, 0).unwrap();
        for (i, piece) in buf.chunks(100).enumerate() {
            let t = (i % 8) as u8;
            assert!(
                piece.iter().all(|&b| b == t + 1),
                "piece {i} lost its write"
            );
        }
    }

    #[test]
    fn direct_writes_stay_coherent_with_buffered_reads() {
        let dir = scratch_dir();
        let path = dir.path().join("dev");
        let mut dev = FileDevice::create(&path, 64 * 1024, FileDeviceOptions::default()).unwrap();
        match dev.direct_writes() {
            Ok(()) => {}
            Err(DeviceError::Io { source, .. }) if source.raw_os_error() == Some(libc::EINVAL) => {
                println!("skipped: O_DIRECT unsupported under {}", path.display());
                return;
            }
            Err(e) => panic!("direct_writes failed: {e}"),
        };
        assert!(dev.has_direct_writes() && !dev.is_direct());
        // A buffered read first caches the page; the direct write that
        // follows must not leave that stale copy visible.
        let mut page = vec![0u8; 4096];
        dev.read_at(&mut page, 8192).unwrap();
        assert!(page.iter().all(|&b| b == 0));
        let aligned: Vec<u8> = (0..8192u32).map(|i| (i % 253) as u8).collect();
        dev.write_at(&aligned, 8192).unwrap();
        // Unaligned writes go through the buffered descriptor, also over
        // bytes a direct write wrote.
        dev.write_at(b"ragged", 8190).unwrap();
        dev.write_at(&aligned[..4096], 4096).unwrap();
        dev.flush().unwrap();
        let mut expect = vec![0u8; 64 * 1024];
        expect[8192..16384].copy_from_slice(&aligned);
        expect[8190..8196].copy_from_slice(b"ragged");
        expect[4096..8192].copy_from_slice(&aligned[..4096]);
        // The ragged write sits on the page before and the page the direct
        // write wrote: a later direct write over it must win too.
        dev.write_at(&aligned[4096..], 12288).unwrap();
        expect[12288..16384].copy_from_slice(&aligned[4096..]);
        let mut whole = vec![0u8; 64 * 1024];
        dev.read_at(&mut whole, 0).unwrap();
        assert!(whole == expect, "mixed direct and buffered writes differ");
        drop(dev);
        let dev = FileDevice::open(&path, FileDeviceOptions::default()).unwrap();
        dev.read_at(&mut whole, 0).unwrap();
        assert!(whole == expect, "reopened image differs");
    }

    /// Review probe: with `direct_writes`, a buffered read that starts
    /// after a direct write returned sees that write, also while other
    /// buffered reads of the same page race the direct writes (a read
    /// during a direct write may cache the old page; the kernel must drop
    /// it when the write ends). The log relies on it: a partial segment
    /// leaves the in-flight queue when its write returns, and reads of its
    /// blocks then go to the device.
    #[test]
    fn buffered_reads_racing_direct_writes_never_see_a_stale_page_later() {
        use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
        let dir = scratch_dir();
        let path = dir.path().join("dev");
        let mut dev = FileDevice::create(&path, 1 << 20, FileDeviceOptions::default()).unwrap();
        let dev = match dev.direct_writes() {
            Ok(()) => Arc::new(dev),
            Err(DeviceError::Io { source, .. }) if source.raw_os_error() == Some(libc::EINVAL) => {
                println!("skipped: O_DIRECT unsupported under {}", path.display());
                return;
            }
            Err(e) => panic!("direct_writes failed: {e}"),
        };
        const AT: u64 = 64 << 10;
        const PAGES: usize = 2;
        let published = Arc::new(AtomicU64::new(0));
        let done = Arc::new(AtomicBool::new(false));
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let (dev, published, done) = (dev.clone(), published.clone(), done.clone());
                std::thread::spawn(move || {
                    let mut b = vec![0u8; PAGES * 4096];
                    let mut reads = 0u64;
                    while !done.load(Ordering::SeqCst) {
                        let floor = published.load(Ordering::SeqCst);
                        dev.read_at(&mut b, AT).unwrap();
                        let oldest = b
                            .chunks(8)
                            .map(|w| u64::from_le_bytes(w.try_into().unwrap()))
                            .min()
                            .unwrap();
                        assert!(
                            oldest >= floor,
                            "a read begun after write {floor} returned saw write {oldest}"
                        );
                        reads += 1;
                    }
                    reads
                })
            })
            .collect();
        let mut page = AlignedBuf::new(PAGES * 4096).unwrap();
        for g in 1..=1000u64 {
            for w in page.as_mut_slice().chunks_mut(8) {
                w.copy_from_slice(&g.to_le_bytes());
            }
            dev.write_at(page.as_slice(), AT).unwrap();
            published.store(g, Ordering::SeqCst);
        }
        done.store(true, Ordering::SeqCst);
        for r in readers {
            let reads = r.join().unwrap();
            assert!(reads > 0);
        }
    }

    #[test]
    fn widen_rounds_outward() {
        assert_eq!(widen(0, 4096), (0, 4096));
        assert_eq!(widen(1, 1), (0, 4096));
        assert_eq!(widen(4095, 2), (0, 8192));
        assert_eq!(widen(8192, 4096), (8192, 12288));
    }

    #[test]
    fn aligned_buf_is_aligned() {
        for len in [1, 512, 4096, 10_000] {
            let buf = AlignedBuf::new(len).unwrap();
            assert_eq!(buf.as_slice().as_ptr() as usize % DIRECT_ALIGN as usize, 0);
            assert_eq!(buf.as_slice().len(), len);
        }
    }
}
