//! Partial segments on their way to the device.
//!
//! A writer thread writes sealed partial segments in the order they were
//! sealed while the engine goes on accepting operations, so building the
//! next partial segment overlaps writing the last one (how LFS streams small
//! writes at the device's bandwidth). Until its write returns, a partial
//! segment stays here and reads of its blocks are served from memory. After a
//! failed write nothing more is written; what was queued stays readable.
//!
//! Items are numbered as they are submitted (1, 2, ...) and written in that
//! order, so "everything up to item N is written" is one counter: a
//! checkpoint or a group commit waits for the items it needs
//! (`wait_written`) rather than for an empty queue, which under continuous
//! writes might never come.

use std::collections::VecDeque;
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use crate::device::{Device, DeviceError};

/// Bytes queued ahead of the writer before `submit` waits. Counted in
/// bytes, not items: a stream of small partial segments (one per group
/// commit) must not make the sealing thread, which holds the engine lock,
/// wait for the device after a handful of them.
const QUEUE_BYTES: usize = 4 << 20;

pub(crate) struct InFlight {
    pub addr: u64,
    pub bytes: Vec<u8>,
}

#[derive(Default)]
struct State {
    queue: VecDeque<Arc<InFlight>>,
    /// Items submitted so far; the newest's number.
    submitted: u64,
    /// Items written so far (all of `1..=written`).
    written: u64,
    /// Bytes of the queued items.
    queued_bytes: usize,
    /// The write error, handed to the first caller that drains after it.
    error: Option<DeviceError>,
    failed: Option<String>,
}

#[derive(Default)]
pub(crate) struct Flight {
    state: Mutex<State>,
    cv: Condvar,
}

/// The writer thread and the channel to it.
pub(crate) struct Writer {
    tx: Option<Sender<Arc<InFlight>>>,
    handle: Option<JoinHandle<()>>,
}

impl Flight {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().expect("in-flight queue poisoned")
    }

    pub fn start(self: &Arc<Self>, dev: Arc<dyn Device>) -> Writer {
        let (tx, rx) = channel::<Arc<InFlight>>();
        let flight = self.clone();
        let handle = std::thread::Builder::new()
            .name("ldfs-log-writer".into())
            .spawn(move || {
                for item in rx {
                    let res = dev.write_at(&item.bytes, item.addr);
                    let mut s = flight.lock();
                    match res {
                        Ok(()) => {
                            let done = s.queue.pop_front().expect("written item queued");
                            assert!(Arc::ptr_eq(&done, &item), "log writes out of order");
                            s.written += 1;
                            s.queued_bytes -= done.bytes.len();
                        }
                        Err(e) => {
                            s.failed = Some(e.to_string());
                            s.error = Some(e);
                            flight.cv.notify_all();
                            return;
                        }
                    }
                    flight.cv.notify_all();
                }
            })
            .expect("spawn log writer thread");
        Writer {
            tx: Some(tx),
            handle: Some(handle),
        }
    }

    /// Queues a write; returns its number (see `wait_written`). Waits while
    /// `QUEUE_BYTES` are queued already (memory stays bounded). Fails if the
    /// writer stopped after an error.
    pub fn submit(&self, w: &Writer, addr: u64, bytes: Vec<u8>) -> Result<u64, String> {
        let item = Arc::new(InFlight { addr, bytes });
        let ticket = {
            let mut s = self.lock();
            while s.failed.is_none()
                && !s.queue.is_empty()
                && s.queued_bytes + item.bytes.len() > QUEUE_BYTES
            {
                s = self.cv.wait(s).expect("in-flight queue poisoned");
            }
            if let Some(f) = &s.failed {
                return Err(f.clone());
            }
            s.queued_bytes += item.bytes.len();
            s.queue.push_back(item.clone());
            s.submitted += 1;
            s.submitted
        };
        let tx = w.tx.as_ref().expect("writer running");
        if tx.send(item).is_err() {
            let s = self.lock();
            return Err(s
                .failed
                .clone()
                .unwrap_or_else(|| "log writer stopped".into()));
        }
        Ok(ticket)
    }

    /// The number of the newest item submitted (0: none yet).
    pub fn submitted(&self) -> u64 {
        self.lock().submitted
    }

    /// Waits until every queued write has returned. The first call after a
    /// failed write returns its error; later ones a description of it.
    pub fn drain(&self) -> Result<(), Result<DeviceError, String>> {
        let last = self.submitted();
        self.wait_written(last)
    }

    /// Waits until items `1..=ticket` have been written (later ones may
    /// still be queued). Errors as `drain`.
    pub fn wait_written(&self, ticket: u64) -> Result<(), Result<DeviceError, String>> {
        let mut s = self.lock();
        while s.written < ticket && s.failed.is_none() {
            s = self.cv.wait(s).expect("in-flight queue poisoned");
        }
        if let Some(e) = s.error.take() {
            return Err(Ok(e));
        }
        match &s.failed {
            Some(f) => Err(Err(f.clone())),
            None => Ok(()),
        }
    }

    /// Why writing stopped, if it did.
    pub fn failed(&self) -> Option<String> {
        self.lock().failed.clone()
    }

    /// The bytes at `[offset, offset + len)` if a queued write holds them.
    pub fn read(&self, offset: u64, len: usize) -> Option<Vec<u8>> {
        let s = self.lock();
        s.queue.iter().find_map(|it| {
            let start = offset.checked_sub(it.addr)? as usize;
            let end = start.checked_add(len)?;
            (end <= it.bytes.len()).then(|| it.bytes[start..end].to_vec())
        })
    }
}

impl Writer {
    /// Stops the thread once everything queued is written.
    pub fn stop(&mut self) {
        self.tx.take();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.stop();
    }
}
