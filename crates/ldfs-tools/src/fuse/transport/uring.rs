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
//! `io_uring_enter`, which serialises every queue. Each thread is pinned to
//! its queue's CPU (as libfuse does), so the thread a request wakes runs on
//! the CPU of the caller that sent it: the caller blocks, the entry's
//! thread takes the CPU, and its reply wakes the caller there again, two
//! context switches and no cross-CPU wake-up per request. Unpinned, the
//! scheduler put the woken thread on the other, idle CPU whenever there was
//! one (an inter-processor interrupt and an idle exit each way, costly in a
//! VM): on an otherwise idle 2-CPU VM memfs served cold stats at 20-30k/s
//! unpinned and 85-88k/s pinned, with 1-2 function-call IPIs per request
//! gone (speed2.log). The kernel takes the most recently committed entry of
//! a queue first (its list of free entries is LIFO), so one thread per
//! queue does the work while requests come one at a time.
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

/// `FUSE_IO_URING_CMD_INVALID`: answered -EAGAIN until the kernel has
/// taken INIT's reply, then -EINVAL, and changes nothing either way.
const CMD_INVALID: u32 = 0;
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
        describe(self.queues, self.per_queue)
    }

    pub fn join(self) {
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// Why `start` failed, and what the connection does now.
/// How `ldfs stats` names a ring of `queues` queues of `per_queue` entries.
pub fn describe(queues: usize, per_queue: usize) -> String {
    format!("io_uring ({queues} queues, {per_queue} entries each)")
}

pub struct StartFailed {
    pub why: String,
    /// The kernel gave the ring up (a REGISTER it refused): requests go
    /// over /dev/fuse. If false, they wait for a ring that will not come,
    /// and the caller must end the connection.
    pub fell_back: bool,
    /// The entries that did register, to join at the end (they serve if
    /// every queue got one before the kernel gave the ring up).
    pub rings: Rings,
}

/// Registers `per_queue` entries on every queue of the connection behind
/// `fuse` (the session's /dev/fuse, after INIT granted io_uring), each
/// served by a thread of its own; returns once all are registered.
/// `served` counts the requests served over the ring.
/// `payload_bytes`: at least the connection's largest message (max_write,
/// max_pages pages).
///
/// Once INIT granted io_uring the kernel holds every request until each
/// queue has an entry, so a start that fails part of the way (a thread,
/// a descriptor or a ring it cannot have) must not just return: it makes
/// the kernel give the ring up, and says whether that worked.
pub fn start<F: FuseOps>(
    fs: Arc<F>,
    fuse: &OwnedFd,
    per_queue: usize,
    payload_bytes: usize,
    served: Arc<AtomicUsize>,
) -> Result<Rings, StartFailed> {
    let queues = queue_count();
    let mut rings = Rings {
        threads: Vec::new(),
        queues,
        per_queue,
    };
    // Made first, so that the descriptor it needs to refuse the ring is
    // had whatever the entries below run out of.
    let mut control = match Control::new(fuse) {
        Ok(c) => c,
        Err(why) => {
            return Err(StartFailed {
                why,
                fell_back: false,
                rings,
            })
        }
    };
    let r = control
        .wait_initialized(Duration::from_secs(10))
        .and_then(|()| {
            spawn_entries(
                fs,
                fuse,
                queues,
                per_queue,
                payload_bytes,
                served,
                &mut rings.threads,
            )
        });
    match r {
        Ok(()) => Ok(rings),
        Err(why) => {
            let fell_back = match control.refuse() {
                Ok(()) => true,
                Err(e) => {
                    eprintln!("ldfs: io_uring: giving the ring up: {e}");
                    false
                }
            };
            Err(StartFailed {
                why,
                fell_back,
                rings,
            })
        }
    }
}

fn spawn_entries<F: FuseOps>(
    fs: Arc<F>,
    fuse: &OwnedFd,
    queues: usize,
    per_queue: usize,
    payload_bytes: usize,
    served: Arc<AtomicUsize>,
    threads: &mut Vec<JoinHandle<()>>,
) -> Result<(), String> {
    let (tx, rx) = std::sync::mpsc::channel::<Result<Registered, String>>();
    for qid in 0..queues {
        for i in 0..per_queue {
            let fd = fuse
                .try_clone()
                .map_err(|e| format!("duplicating /dev/fuse: {e}"))?;
            let (fs, tx, served) = (fs.clone(), tx.clone(), served.clone());
            let t = std::thread::Builder::new()
                .name(format!("ldfs-uring-{qid}.{i}"))
                .spawn(move || {
                    pin_to(qid);
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
    for _ in 0..queues * per_queue {
        match rx.recv_timeout(Duration::from_secs(10)) {
            Ok(Ok(Registered::Serving)) => {}
            // Unmounted (or aborted) while the entries registered: not a
            // failure of the ring. The session ends on its own, and so do
            // the entries, at once or at the teardown.
            Ok(Ok(Registered::Gone)) => return Ok(()),
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err("ring entries not registered within 10 s".into()),
        }
    }
    Ok(())
}

/// What an entry's REGISTER came to, when it did not fail.
enum Registered {
    Serving,
    /// The connection ended first (unmount, abort): the kernel says
    /// ENOTCONN, ECONNABORTED or ENODEV.
    Gone,
}

/// Errors with which the kernel ends an entry's command when the connection
/// is torn down (unmount, abort, the daemon's end).
const CONNECTION_GONE: [i32; 4] = [
    libc::ENOTCONN,
    libc::ECANCELED,
    libc::ENODEV,
    libc::ECONNABORTED,
];

/// Pins the calling thread to `cpu` if the process may run there (a
/// cpuset without it leaves the thread where the scheduler puts it: the
/// queue still serves, only with a cross-CPU wake-up per request).
fn pin_to(cpu: usize) {
    unsafe {
        let mut allowed: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of_val(&allowed), &mut allowed) != 0
            || cpu >= libc::CPU_SETSIZE as usize
            || !libc::CPU_ISSET(cpu, &allowed)
        {
            return;
        }
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set);
    }
}

/// The starting thread's own ring on the connection: it asks whether the
/// kernel has taken INIT's reply, and gives the ring up when start fails.
struct Control {
    fuse: i32,
    ring: IoUring<squeue::Entry128, cqueue::Entry>,
}

impl Control {
    fn new(fuse: &OwnedFd) -> Result<Control, String> {
        let ring = IoUring::<squeue::Entry128, cqueue::Entry>::builder()
            .build(2)
            .map_err(|e| format!("io_uring_setup: {e}"))?;
        Ok(Control {
            fuse: fuse.as_raw_fd(),
            ring,
        })
    }

    /// Runs one command on /dev/fuse: its result.
    fn command(&mut self, sqe: squeue::Entry128) -> Result<i32, String> {
        unsafe { self.ring.submission().push(&sqe) }.expect("control ring full");
        loop {
            if let Some(c) = self.ring.completion().next() {
                return Ok(c.result());
            }
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                Err(e) => return Err(format!("io_uring_enter: {e}")),
            }
        }
    }

    /// Waits until the kernel has taken INIT's reply. Before that a
    /// REGISTER fails with -EAGAIN, and not at once: the kernel retries it
    /// from a worker and completes it later, so the entry's thread would
    /// have taken it as registered and its queue would stay empty.
    fn wait_initialized(&mut self, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        loop {
            let sqe = opcode::UringCmd80::new(types::Fd(self.fuse), CMD_INVALID)
                .cmd(cmd_req(0, 0))
                .build();
            let r = self.command(sqe)?;
            if r != -libc::EAGAIN {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "the kernel had not taken INIT's reply after {} s",
                    timeout.as_secs()
                ));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Makes the kernel give the ring up: a REGISTER it refuses (no
    /// iovecs) turns io_uring off for the connection and wakes the
    /// requests waiting for the ring, which then go over /dev/fuse.
    fn refuse(&mut self) -> Result<(), String> {
        let sqe = opcode::UringCmd80::new(types::Fd(self.fuse), CMD_REGISTER)
            .cmd(cmd_req(0, 0))
            .build();
        match self.command(with_len(sqe, 0))? {
            r if r < 0 => Ok(()),
            r => Err(format!("a REGISTER without buffers was taken ({r})")),
        }
    }
}

/// One ring entry: its buffers, its ring, its queue.
///
/// Fields drop in order: `ring` (its close cancels the entry's command)
/// before the buffers the kernel writes requests into.
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
        registered: &std::sync::mpsc::Sender<Result<Registered, String>>,
        served: &AtomicUsize,
    ) {
        // REGISTER: -EAGAIN until the kernel has taken INIT's reply, which
        // start() waited for; retried here all the same if it comes at once.
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
                    let _ = registered.send(Ok(Registered::Serving));
                    self.serve_and_commit(fs, served);
                    break;
                }
                Some(r) if CONNECTION_GONE.contains(&-r) => {
                    let _ = registered.send(Ok(Registered::Gone));
                    return;
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
            let _ = registered.send(Ok(Registered::Serving));
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
                if !CONNECTION_GONE.contains(&-r) {
                    eprintln!(
                        "ldfs: io_uring queue {}: {}",
                        self.qid,
                        std::io::Error::from_raw_os_error(-r)
                    );
                }
                return;
            }
            self.serve_and_commit(fs, served);
        }
    }

    /// Serves the request in the entry's buffers, writes the reply there
    /// and queues COMMIT_AND_FETCH (submitted by the next wait).
    /// A reply too large for the payload buffer is answered EIO: the
    /// request is committed all the same, and the entry serves on.
    fn serve_and_commit<F: FuseOps>(&mut self, fs: &F, served: &AtomicUsize) {
        served.fetch_add(1, Ordering::Relaxed);
        let commit_id = u64::from_le_bytes(self.header[264..272].try_into().unwrap());
        let payload_sz =
            u32::from_le_bytes(self.header[PAYLOAD_SZ..PAYLOAD_SZ + 4].try_into().unwrap())
                as usize;
        self.out.clear();
        let mut opcode = 0;
        let (unique, mut error) = match InHeader::decode(&self.header[..OP_IN]) {
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
                opcode = h.opcode;
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
        if error.is_none() && self.out.len() > self.payload.len() {
            eprintln!(
                "ldfs: io_uring: opcode {opcode}: a reply of {} bytes for a buffer of {}: EIO",
                self.out.len(),
                self.payload.len()
            );
            error = Some(Errno::from_i32(libc::EIO));
        }
        let data_len = if error.is_some() { 0 } else { self.out.len() };
        self.payload[..data_len].copy_from_slice(&self.out[..data_len]);
        self.header[..OUT_HEADER_BYTES]
            .copy_from_slice(&proto::out_header(unique, error, data_len));
        self.header[PAYLOAD_SZ..PAYLOAD_SZ + 4].copy_from_slice(&(data_len as u32).to_le_bytes());
        // COMMIT names the request by the commit_id the kernel put in
        // ent_in_out (fuse-io-uring.rst; equal to the header's unique on
        // kernels so far, but that is the kernel's to decide).
        let sqe = opcode::UringCmd80::new(types::Fd(self.fuse.as_raw_fd()), CMD_COMMIT_AND_FETCH)
            .cmd(cmd_req(commit_id, self.qid))
            .build();
        self.push(sqe);
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

    // The tests below mount by hand (root, FUSE over io_uring built in):
    // the test answers INIT on /dev/fuse itself, so it decides when the
    // kernel takes that reply, and `start` serves a small file system.

    use std::ffi::CString;
    use std::os::fd::{AsRawFd, FromRawFd};
    use std::os::unix::ffi::OsStrExt;
    use std::sync::mpsc;

    use super::super::{Caller, Entry, FileAttr, FileType, OpResult};

    /// One test at a time switches the kernel's parameter.
    static PARAM: Mutex<()> = Mutex::new(());

    /// A mount whose /dev/fuse the test holds; dropping it aborts the
    /// connection (the ring's threads then end) and detaches the mount.
    struct RawMount {
        dir: tempfile::TempDir,
        fuse: OwnedFd,
        param_was: String,
    }

    impl Drop for RawMount {
        fn drop(&mut self) {
            let c = CString::new(self.dir.path().as_os_str().as_bytes()).unwrap();
            unsafe { libc::umount2(c.as_ptr(), libc::MNT_FORCE | libc::MNT_DETACH) };
            let _ = std::fs::write(super::super::ENABLE_URING, self.param_was.trim());
        }
    }

    fn raw_mount() -> Option<RawMount> {
        let was = std::fs::read_to_string(super::super::ENABLE_URING);
        if unsafe { libc::geteuid() } != 0 || was.is_err() {
            eprintln!("\n*** SKIPPING: mounting by hand over io_uring needs root and CONFIG_FUSE_IO_URING ***\n");
            return None;
        }
        std::fs::write(super::super::ENABLE_URING, "Y").unwrap();
        let fd = unsafe { libc::open(c"/dev/fuse".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
        assert!(fd >= 0, "/dev/fuse: {}", std::io::Error::last_os_error());
        let fuse = unsafe { OwnedFd::from_raw_fd(fd) };
        let dir = tempfile::tempdir().unwrap();
        let target = CString::new(dir.path().as_os_str().as_bytes()).unwrap();
        let data = CString::new(format!("fd={fd},rootmode=40000,user_id=0,group_id=0")).unwrap();
        let r = unsafe {
            libc::mount(
                c"ldfs-uring-test".as_ptr(),
                target.as_ptr(),
                c"fuse.ldfs-uring-test".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV,
                data.as_ptr().cast(),
            )
        };
        assert_eq!(r, 0, "mount: {}", std::io::Error::last_os_error());
        Some(RawMount {
            dir,
            fuse,
            param_was: was.unwrap(),
        })
    }

    /// The connection's largest message with the reply below (no
    /// FUSE_MAX_PAGES: 32 pages).
    const TEST_PAYLOAD: usize = 128 << 10;

    impl RawMount {
        /// Reads INIT from /dev/fuse: its unique.
        fn read_init(&self) -> u64 {
            let mut b = vec![0u8; 1 << 20];
            let n = unsafe { libc::read(self.fuse.as_raw_fd(), b.as_mut_ptr().cast(), b.len()) };
            assert!(n >= 40, "read INIT: {}", std::io::Error::last_os_error());
            let h = InHeader::decode(&b[..n as usize]).unwrap();
            assert_eq!(h.opcode, proto::opcode::INIT);
            h.unique
        }

        /// Answers INIT granting FUSE_OVER_IO_URING.
        fn reply_init(&self, unique: u64) {
            // fuse_init_out: major @0, minor @4, max_readahead @8, flags
            // @12, max_background u16 @16, congestion_threshold u16 @18,
            // max_write @20, time_gran @24, max_pages u16 @28, flags2 @32.
            let mut o = [0u8; 64];
            o[0..4].copy_from_slice(&7u32.to_le_bytes());
            o[4..8].copy_from_slice(&42u32.to_le_bytes());
            o[12..16].copy_from_slice(&(1u32 << 30).to_le_bytes()); // FUSE_INIT_EXT
            o[16..18].copy_from_slice(&16u16.to_le_bytes());
            o[18..20].copy_from_slice(&12u16.to_le_bytes());
            o[20..24].copy_from_slice(&(TEST_PAYLOAD as u32).to_le_bytes());
            o[24..28].copy_from_slice(&1u32.to_le_bytes());
            o[32..36].copy_from_slice(&(1u32 << (41 - 32)).to_le_bytes()); // FUSE_OVER_IO_URING
            let mut msg = proto::out_header(unique, None, o.len()).to_vec();
            msg.extend_from_slice(&o);
            let n = unsafe { libc::write(self.fuse.as_raw_fd(), msg.as_ptr().cast(), msg.len()) };
            assert_eq!(
                n,
                msg.len() as isize,
                "INIT reply: {}",
                std::io::Error::last_os_error()
            );
        }

        /// Runs `f` on a path of the mount in a thread on CPU 0: its result,
        /// or None if it has not returned within 10 s (the mount hangs).
        fn within<T: Send + 'static>(&self, rel: &str, f: fn(&Path) -> T) -> Option<T> {
            let p = self.dir.path().join(rel);
            let (tx, rx) = mpsc::channel();
            std::thread::spawn(move || {
                // On CPU 0: every request goes to queue 0.
                unsafe {
                    let mut set: libc::cpu_set_t = std::mem::zeroed();
                    libc::CPU_SET(0, &mut set);
                    libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set);
                }
                let _ = tx.send(f(&p));
            });
            rx.recv_timeout(Duration::from_secs(10)).ok()
        }
    }

    use std::path::Path;

    /// A file system of one entry: `big`, a symbolic link whose target
    /// does not fit in a ring entry.
    struct Tiny;

    fn tiny_attr(ino: u64, kind: FileType) -> FileAttr {
        let t = std::time::UNIX_EPOCH;
        FileAttr {
            ino: fuser::INodeNo(ino),
            size: 0,
            blocks: 0,
            atime: t,
            mtime: t,
            ctime: t,
            crtime: t,
            kind,
            perm: 0o755,
            nlink: 1,
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        }
    }

    impl FuseOps for Tiny {
        fn lookup(&self, _c: &Caller, _parent: u64, name: &[u8]) -> OpResult<Entry> {
            if name == b"big" {
                return Ok(Entry {
                    attr: tiny_attr(2, FileType::Symlink),
                    generation: 1,
                    ttl: Duration::ZERO,
                    entry_ttl: Duration::ZERO,
                });
            }
            Err(Errno::from_i32(libc::ENOENT))
        }
        fn getattr(&self, ino: u64) -> OpResult<(FileAttr, Duration)> {
            let kind = if ino == 1 {
                FileType::Directory
            } else {
                FileType::Symlink
            };
            Ok((tiny_attr(ino, kind), Duration::ZERO))
        }
        fn readlink(&self, _ino: u64) -> OpResult<Vec<u8>> {
            Ok(vec![b'a'; TEST_PAYLOAD + 4096])
        }
    }

    fn start_tiny(m: &RawMount) -> mpsc::Receiver<Result<Rings, StartFailed>> {
        let fd = m.fuse.try_clone().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let r = start(
                Arc::new(Tiny),
                &fd,
                1,
                TEST_PAYLOAD,
                Arc::new(AtomicUsize::new(0)),
            );
            let _ = tx.send(r);
        });
        rx
    }

    fn started(rx: mpsc::Receiver<Result<Rings, StartFailed>>) -> Rings {
        match rx
            .recv_timeout(Duration::from_secs(20))
            .expect("start hangs")
        {
            Ok(r) => r,
            Err(f) => panic!("start failed: {}", f.why),
        }
    }

    /// Joins the ring's threads, which end with the connection.
    fn joined(rings: Rings) {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            rings.join();
            let _ = tx.send(());
        });
        rx.recv_timeout(Duration::from_secs(10))
            .expect("ring threads still running 10 s after the abort");
    }

    fn lookup_missing(p: &Path) -> Option<i32> {
        std::fs::symlink_metadata(p)
            .err()
            .and_then(|e| e.raw_os_error())
    }

    #[test]
    fn entries_registered_before_init_is_taken_still_serve() {
        let _g = PARAM.lock().unwrap_or_else(|e| e.into_inner());
        let Some(m) = raw_mount() else { return };
        let unique = m.read_init();
        // The queues are registered while INIT waits for its reply (as
        // with fuser, which answers INIT after our init() returned).
        let rx = start_tiny(&m);
        std::thread::sleep(Duration::from_millis(300));
        m.reply_init(unique);
        let rings = started(rx);
        let r = m.within("missing", lookup_missing);
        drop(m);
        joined(rings);
        assert_eq!(r, Some(Some(libc::ENOENT)), "a lookup over the ring hung");
    }

    /// The ring's threads of this process, by queue: (qid, the CPUs each
    /// may run on, as /proc says them). Names cut to 15 bytes are skipped.
    fn ring_thread_cpus() -> Vec<(usize, String)> {
        let mut out = Vec::new();
        for t in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
            let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
            let Some(qid) = comm
                .trim()
                .strip_prefix("ldfs-uring-")
                .and_then(|r| r.split_once('.'))
                .and_then(|(q, _)| q.parse::<usize>().ok())
            else {
                continue;
            };
            let status = std::fs::read_to_string(t.path().join("status")).unwrap_or_default();
            if let Some(l) = status
                .lines()
                .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
            {
                out.push((qid, l.trim().to_string()));
            }
        }
        out
    }

    fn may_run_on(cpu: usize) -> bool {
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set) == 0
                && libc::CPU_ISSET(cpu, &set)
        }
    }

    #[test]
    fn each_ring_thread_runs_on_its_queues_cpu() {
        let _g = PARAM.lock().unwrap_or_else(|e| e.into_inner());
        let Some(m) = raw_mount() else { return };
        let unique = m.read_init();
        m.reply_init(unique);
        let rings = started(start_tiny(&m));
        let cpus = ring_thread_cpus();
        let r = m.within("missing", lookup_missing);
        drop(m);
        joined(rings);
        assert_eq!(r, Some(Some(libc::ENOENT)), "a lookup over the ring hung");
        assert!(cpus.len() >= queue_count(), "ring threads found: {cpus:?}");
        for (qid, allowed) in cpus {
            if may_run_on(qid) {
                assert_eq!(allowed, qid.to_string(), "a thread of queue {qid}");
            }
        }
    }

    #[test]
    fn a_mount_gone_before_its_entries_register_is_a_clean_end() {
        let _g = PARAM.lock().unwrap_or_else(|e| e.into_inner());
        let Some(m) = raw_mount() else { return };
        let unique = m.read_init();
        m.reply_init(unique);
        // Unmounted at once, as `mount; umount` in a script can be while
        // the ring threads wait for a CPU: REGISTER then finds the
        // connection gone (ENOTCONN, ECONNABORTED), which ends the ring as
        // the unmount ends the session, not as a failed start.
        let c = CString::new(m.dir.path().as_os_str().as_bytes()).unwrap();
        assert_eq!(
            unsafe { libc::umount2(c.as_ptr(), libc::MNT_FORCE | libc::MNT_DETACH) },
            0,
            "umount2: {}",
            std::io::Error::last_os_error()
        );
        let rings = started(start_tiny(&m));
        drop(m);
        joined(rings);
    }

    #[test]
    fn a_reply_too_large_for_the_entry_fails_and_the_entry_serves_on() {
        let _g = PARAM.lock().unwrap_or_else(|e| e.into_inner());
        let Some(m) = raw_mount() else { return };
        let unique = m.read_init();
        m.reply_init(unique);
        let rings = started(start_tiny(&m));
        // One entry per queue: the link's reply does not fit, the caller
        // gets an error, and the entry answers the next request.
        let r = m.within("big", |p| {
            std::fs::read_link(p).map_err(|e| e.raw_os_error())
        });
        let next = m.within("missing", lookup_missing);
        drop(m);
        joined(rings);
        assert_eq!(
            r,
            Some(Err(Some(libc::EIO))),
            "readlink of a too-long target"
        );
        assert_eq!(next, Some(Some(libc::ENOENT)), "the entry stopped serving");
    }
}
