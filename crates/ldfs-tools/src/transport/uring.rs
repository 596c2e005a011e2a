//! FUSE over io_uring (Linux 6.14+, `Documentation/filesystems/fuse-io-uring.rst`).
//!
//! After INIT granted FUSE_OVER_IO_URING, the daemon registers ring entries
//! with FUSE_IO_URING_CMD_REGISTER on /dev/fuse, one or more per queue, one
//! queue per possible CPU (the kernel's `nr_cpu_ids`): the kernel switches
//! the connection to the ring only when every queue has an entry, and puts
//! each request on the queue of the CPU its caller runs on. An entry is two
//! buffers the kernel writes a request into (the 288-byte
//! `fuse_uring_req_header` and a payload of at least the connection's
//! largest message); the registering command completes when a request is
//! in them, and FUSE_IO_URING_CMD_COMMIT_AND_FETCH hands back the reply and
//! waits for the next request in one system call.
//!
//! Each entry has a thread and a ring of its own, so a request never waits
//! for another one of its queue to be served: with one thread per queue a
//! request assigned to an idle entry waits until that thread is back in
//! `io_uring_enter`, which serialises every queue. Threads are not pinned
//! to their queue's CPU (libfuse pins them): measured on 2 CPUs, pinned
//! threads made ldfs 10-35% slower on metadata phases than unpinned ones,
//! as ldfs's work then always shares the CPU of the caller it answers
//! (and its own engine threads), where the scheduler could move it.
//!
//! Invariants: an entry's buffers are touched by the daemon only between
//! the completion that filled them and the next command for that entry;
//! every request taken from the ring is committed (an error reply for one
//! that does not decode). A completion with an error ends the thread: the
//! kernel tears the queues down at unmount or abort (-ENOTCONN), which is
//! the ring's clean end.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use io_uring::{cqueue, opcode, squeue, types, IoUring};

use super::proto::{self, Answer, InHeader, OUT_HEADER_BYTES};
use super::{Errno, FuseOps};

/// `FUSE_IO_URING_CMD_REGISTER`.
const CMD_REGISTER: u32 = 1;
/// `FUSE_IO_URING_CMD_COMMIT_AND_FETCH`.
const CMD_COMMIT_AND_FETCH: u32 = 2;

/// `struct fuse_uring_req_header`: in_out[128] @0 (fuse_in_header in,
/// fuse_out_header out), op_in[128] @128, fuse_uring_ent_in_out @256
/// (flags u64 @256, commit_id u64 @264, payload_sz u32 @272, padding u32
/// @276, reserved u64 @280).
const HEADER_BYTES: usize = 288;
const OP_IN: usize = 128;
const OP_IN_BYTES: usize = 128;
const PAYLOAD_SZ: usize = 272;

/// `struct fuse_uring_cmd_req` in the SQE's 80 command bytes: flags u64 @0,
/// commit_id u64 @8, qid u16 @16, padding[6].
fn cmd_req(commit_id: u64, qid: u16) -> [u8; 80] {
    let mut c = [0u8; 80];
    c[8..16].copy_from_slice(&commit_id.to_le_bytes());
    c[16..18].copy_from_slice(&qid.to_le_bytes());
    c
}

/// Offsets in the 128-byte SQE (`struct io_uring_sqe`): opcode u8 @0,
/// fd i32 @4, cmd_op u32 @8, addr u64 @16, len u32 @24, user_data u64 @32,
/// cmd[80] @48. io-uring 0.7's `UringCmd80` sets addr but not len, which
/// REGISTER needs (the number of iovecs): it is set on the SQE's bytes.
const SQE_LEN: usize = 24;

fn with_len(e: squeue::Entry128, len: u32) -> squeue::Entry128 {
    // Entry128 is repr(C) over the kernel's 128-byte SQE (asserted in the
    // tests below, with the offsets).
    let mut b: [u8; 128] = unsafe { std::mem::transmute(e) };
    b[SQE_LEN..SQE_LEN + 4].copy_from_slice(&len.to_le_bytes());
    unsafe { std::mem::transmute::<[u8; 128], squeue::Entry128>(b) }
}

/// How the mount's INIT went, told by the /dev/fuse session's `init`.
#[derive(Default)]
pub struct Start {
    granted: Mutex<Option<bool>>,
    cv: Condvar,
}

impl Start {
    pub fn init_done(&self, granted: bool) {
        *self.granted.lock().expect("start poisoned") = Some(granted);
        self.cv.notify_all();
    }

    /// Whether INIT granted FUSE_OVER_IO_URING; None if INIT did not come
    /// within `timeout`.
    pub fn wait(&self, timeout: Duration) -> Option<bool> {
        let g = self.granted.lock().expect("start poisoned");
        let (g, _) = self
            .cv
            .wait_timeout_while(g, timeout, |g| g.is_none())
            .expect("start poisoned");
        *g
    }
}

/// Whether this process can set up a ring of 128-byte SQEs (io_uring may
/// be disabled: `kernel.io_uring_disabled`, seccomp). Checked before
/// asking for the transport at INIT: once the kernel grants it, requests
/// wait for the ring's queues, so a daemon that cannot make them would
/// leave the mount hanging.
pub fn probe() -> Result<(), String> {
    IoUring::<squeue::Entry128, cqueue::Entry>::builder()
        .build(2)
        .map(|_| ())
        .map_err(|e| format!("io_uring_setup: {e}"))
}

/// The number of queues the kernel expects: one per possible CPU id.
pub fn queue_count() -> usize {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/possible").unwrap_or_default();
    let max = text
        .trim()
        .split([',', '-'])
        .filter_map(|x| x.parse::<usize>().ok())
        .max();
    match max {
        Some(m) => m + 1,
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    }
}

/// The running ring: its threads, and what `ldfs stats` says of it.
pub struct Rings {
    pub threads: Vec<JoinHandle<()>>,
    pub queues: usize,
    pub per_queue: usize,
}

impl Rings {
    pub fn describe(&self) -> String {
        format!(
            "io_uring ({} queues, {} entries each)",
            self.queues, self.per_queue
        )
    }

    pub fn join(self) {
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// Registers `per_queue` entries on every queue of the connection behind
/// `fuse` (the session's /dev/fuse, after INIT granted io_uring), each
/// served by a thread of its own; returns once all are registered.
/// `served` counts the requests served over the ring.
/// `payload_bytes`: at least the connection's largest message (max_write,
/// max_pages pages).
pub fn start<F: FuseOps>(
    fs: Arc<F>,
    fuse: &OwnedFd,
    per_queue: usize,
    payload_bytes: usize,
    served: Arc<AtomicUsize>,
) -> Result<Rings, String> {
    let queues = queue_count();
    let (tx, rx) = std::sync::mpsc::channel::<Result<(), String>>();
    let mut threads = Vec::new();
    for qid in 0..queues {
        for i in 0..per_queue {
            let fd = fuse
                .try_clone()
                .map_err(|e| format!("duplicating /dev/fuse: {e}"))?;
            let (fs, tx, served) = (fs.clone(), tx.clone(), served.clone());
            let t = std::thread::Builder::new()
                .name(format!("ldfs-uring-{qid}.{i}"))
                .spawn(move || {
                    let mut e = match Ent::new(fd, qid as u16, payload_bytes) {
                        Ok(e) => e,
                        Err(err) => {
                            let _ = tx.send(Err(err));
                            return;
                        }
                    };
                    e.run(&*fs, &tx, &served);
                })
                .map_err(|e| format!("starting a ring thread: {e}"))?;
            threads.push(t);
        }
    }
    drop(tx);
    let rings = Rings {
        threads,
        queues,
        per_queue,
    };
    for _ in 0..queues * per_queue {
        match rx.recv_timeout(Duration::from_secs(10)) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err("ring entries not registered within 10 s".into()),
        }
    }
    Ok(rings)
}

/// One ring entry: its buffers, its ring, its queue.
struct Ent {
    fuse: OwnedFd,
    qid: u16,
    ring: IoUring<squeue::Entry128, cqueue::Entry>,
    header: Vec<u8>,
    payload: Vec<u8>,
    /// The two iovecs REGISTER names (header, payload).
    iov: [libc::iovec; 2],
    out: Vec<u8>,
}

impl Ent {
    fn new(fuse: OwnedFd, qid: u16, payload_bytes: usize) -> Result<Ent, String> {
        let ring = IoUring::<squeue::Entry128, cqueue::Entry>::builder()
            .setup_single_issuer()
            .setup_defer_taskrun()
            .build(2)
            .or_else(|_| IoUring::<squeue::Entry128, cqueue::Entry>::builder().build(2))
            .map_err(|e| format!("io_uring_setup: {e}"))?;
        let mut e = Ent {
            fuse,
            qid,
            ring,
            header: vec![0; HEADER_BYTES],
            payload: vec![0; payload_bytes],
            iov: [libc::iovec {
                iov_base: std::ptr::null_mut(),
                iov_len: 0,
            }; 2],
            out: Vec::with_capacity(payload_bytes),
        };
        e.iov = [
            libc::iovec {
                iov_base: e.header.as_mut_ptr().cast(),
                iov_len: e.header.len(),
            },
            libc::iovec {
                iov_base: e.payload.as_mut_ptr().cast(),
                iov_len: e.payload.len(),
            },
        ];
        Ok(e)
    }

    fn push(&mut self, sqe: squeue::Entry128) {
        // The ring has room: one command in flight at a time.
        unsafe { self.ring.submission().push(&sqe) }.expect("ring full");
    }

    fn register(&mut self) {
        let sqe = opcode::UringCmd80::new(types::Fd(self.fuse.as_raw_fd()), CMD_REGISTER)
            .cmd(cmd_req(0, self.qid))
            .addr(Some(self.iov.as_ptr() as u64))
            .build();
        self.push(with_len(sqe, 2));
    }

    /// Waits for the entry's command to complete: its result.
    fn wait(&mut self) -> Result<i32, std::io::Error> {
        loop {
            if let Some(c) = self.ring.completion().next() {
                return Ok(c.result());
            }
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                Err(e) => return Err(e),
            }
        }
    }

    fn run<F: FuseOps>(
        &mut self,
        fs: &F,
        registered: &std::sync::mpsc::Sender<Result<(), String>>,
        served: &AtomicUsize,
    ) {
        // REGISTER: -EAGAIN until the kernel has processed INIT's reply.
        let deadline = Instant::now() + Duration::from_secs(5);
        self.register();
        let mut told = false;
        loop {
            if let Err(e) = self.ring.submit() {
                let _ = registered.send(Err(format!("io_uring_enter: {e}")));
                return;
            }
            let done = self.ring.completion().next().map(|c| c.result());
            match done {
                None => break,
                Some(r) if r == -libc::EAGAIN && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5));
                    self.register();
                }
                Some(r) if r >= 0 => {
                    // Registered, and already a request: serve it below.
                    told = true;
                    let _ = registered.send(Ok(()));
                    if let Err(e) = self.serve_and_commit(fs, served) {
                        eprintln!("ldfs: io_uring queue {}: {e}", self.qid);
                        return;
                    }
                    break;
                }
                Some(r) => {
                    let _ = registered.send(Err(format!(
                        "FUSE_IO_URING_CMD_REGISTER on queue {}: {}",
                        self.qid,
                        std::io::Error::from_raw_os_error(-r)
                    )));
                    return;
                }
            }
        }
        if !told {
            let _ = registered.send(Ok(()));
        }
        loop {
            let r = match self.wait() {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("ldfs: io_uring queue {}: io_uring_enter: {e}", self.qid);
                    return;
                }
            };
            if r < 0 {
                // The kernel's teardown (unmount, abort): the clean end.
                if ![
                    libc::ENOTCONN,
                    libc::ECANCELED,
                    libc::ENODEV,
                    libc::ECONNABORTED,
                ]
                .contains(&-r)
                {
                    eprintln!(
                        "ldfs: io_uring queue {}: {}",
                        self.qid,
                        std::io::Error::from_raw_os_error(-r)
                    );
                }
                return;
            }
            if let Err(e) = self.serve_and_commit(fs, served) {
                eprintln!("ldfs: io_uring queue {}: {e}", self.qid);
                return;
            }
        }
    }

    /// Serves the request in the entry's buffers, writes the reply there
    /// and queues COMMIT_AND_FETCH (submitted by the next wait).
    fn serve_and_commit<F: FuseOps>(&mut self, fs: &F, served: &AtomicUsize) -> Result<(), String> {
        served.fetch_add(1, Ordering::Relaxed);
        let commit_id = u64::from_le_bytes(self.header[264..272].try_into().unwrap());
        let payload_sz =
            u32::from_le_bytes(self.header[PAYLOAD_SZ..PAYLOAD_SZ + 4].try_into().unwrap())
                as usize;
        self.out.clear();
        let (unique, error) = match InHeader::decode(&self.header[..OP_IN]) {
            Err(m) => {
                eprintln!("ldfs: io_uring: a malformed request header: {}", m.0);
                (commit_id, Some(Errno::from_i32(libc::EINVAL)))
            }
            Ok(h) if payload_sz > self.payload.len() => {
                eprintln!(
                    "ldfs: io_uring: opcode {}: payload of {payload_sz} bytes in a buffer of {}",
                    h.opcode,
                    self.payload.len()
                );
                (h.unique, Some(Errno::from_i32(libc::EINVAL)))
            }
            Ok(h) => {
                let op_in = &self.header[OP_IN..OP_IN + OP_IN_BYTES];
                match proto::decode(&h, op_in, &self.payload[..payload_sz]) {
                    Err(m) => {
                        eprintln!("ldfs: io_uring: opcode {}: {}", h.opcode, m.0);
                        (h.unique, Some(Errno::from_i32(libc::EINVAL)))
                    }
                    Ok(op) => match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        proto::serve(fs, &h, op, &mut self.out)
                    })) {
                        Ok(Answer::Ok) => (h.unique, None),
                        Ok(Answer::Err(e)) => (h.unique, Some(e)),
                        // A broken invariant (the panic is printed): the
                        // caller gets EIO rather than waiting forever for a
                        // reply, and the entry serves on.
                        Err(_) => {
                            eprintln!("ldfs: io_uring: opcode {} panicked: EIO", h.opcode);
                            (h.unique, Some(Errno::from_i32(libc::EIO)))
                        }
                        // Not a request with a reply: the kernel sends
                        // those over /dev/fuse only. Commit anyway (the
                        // entry must go back to the kernel).
                        Ok(Answer::None) => (h.unique, Some(Errno::from_i32(libc::ENOSYS))),
                    },
                }
            }
        };
        let data_len = if error.is_some() { 0 } else { self.out.len() };
        if data_len > self.payload.len() {
            return Err(format!(
                "a reply of {data_len} bytes for a buffer of {}",
                self.payload.len()
            ));
        }
        self.payload[..data_len].copy_from_slice(&self.out[..data_len]);
        self.header[..OUT_HEADER_BYTES]
            .copy_from_slice(&proto::out_header(unique, error, data_len));
        self.header[PAYLOAD_SZ..PAYLOAD_SZ + 4].copy_from_slice(&(data_len as u32).to_le_bytes());
        let sqe = opcode::UringCmd80::new(types::Fd(self.fuse.as_raw_fd()), CMD_COMMIT_AND_FETCH)
            .cmd(cmd_req(unique, self.qid))
            .build();
        self.push(sqe);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqe_offsets_are_the_kernels() {
        assert_eq!(std::mem::size_of::<squeue::Entry128>(), 128);
        let sqe = opcode::UringCmd80::new(types::Fd(7), CMD_REGISTER)
            .cmd(cmd_req(0x1122, 3))
            .addr(Some(0xdead_beef_0000))
            .build()
            .user_data(0x55);
        let sqe = with_len(sqe, 2);
        let b: [u8; 128] = unsafe { std::mem::transmute(sqe) };
        assert_eq!(b[0], 46, "IORING_OP_URING_CMD");
        assert_eq!(i32::from_le_bytes(b[4..8].try_into().unwrap()), 7);
        assert_eq!(
            u32::from_le_bytes(b[8..12].try_into().unwrap()),
            CMD_REGISTER
        );
        assert_eq!(
            u64::from_le_bytes(b[16..24].try_into().unwrap()),
            0xdead_beef_0000
        );
        assert_eq!(u32::from_le_bytes(b[24..28].try_into().unwrap()), 2);
        assert_eq!(u64::from_le_bytes(b[32..40].try_into().unwrap()), 0x55);
        // fuse_uring_cmd_req at cmd (@48): commit_id @8, qid @16.
        assert_eq!(u64::from_le_bytes(b[56..64].try_into().unwrap()), 0x1122);
        assert_eq!(u16::from_le_bytes(b[64..66].try_into().unwrap()), 3);
    }

    #[test]
    fn queue_count_is_at_least_one() {
        assert!(queue_count() >= 1);
    }
}
