//! Checkpoints beside operations: the part of a checkpoint that waits for
//! the device, and the thread that runs it.
//!
//! A checkpoint is taken in three phases (docs/DESIGN.md, "Checkpoints"):
//!
//! 1. under the engine lock, when no ARU that logged anything is open (the
//!    *snapshot point*): seal the open partial, place every dirty map page
//!    in the log and hand it to the log writer (`flight`), encode the slot;
//!    the result is a [`PendingCheckpoint`];
//! 2. with no engine lock held ([`PendingCheckpoint::write`]): wait until
//!    the log writer has written everything up to the snapshot point, flush
//!    the device, write the slot, flush again;
//! 3. under the engine lock again (the engine's `apply_checkpoint`): adopt
//!    the serial, release the segments the snapshot found empty, publish
//!    what became durable.
//!
//! Invariants: at most one checkpoint is pending (between phase 1 and phase
//! 3) at a time; phase 2 runs exactly once per checkpoint, whoever asks for
//! it first runs it and the others wait for its result; phase 2 takes no
//! engine lock, so a thread that holds it may wait for phase 2.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use super::flight::Flight;
use super::types::SegmentId;

use crate::device::Device;
use crate::ld::{LdError, LdResult};

/// What phase 1 decided: the slot to write and what to do once it is durable.
pub(crate) struct Plan {
    /// The checkpoint's serial number (its slot is `serial % 2`).
    pub serial: u64,
    /// Log-writer items `1..=ticket` hold everything the slot names.
    pub ticket: u64,
    pub slot_addr: u64,
    pub slot_bytes: Vec<u8>,
    /// Segments the snapshot found empty: Clean once the slot is durable.
    pub released: Vec<SegmentId>,
    /// Segment-hook reports made before the snapshot ([`DurableCheckpoint::segments_told`]).
    ///
    /// [`DurableCheckpoint::segments_told`]: super::engine::DurableCheckpoint::segments_told
    pub segments_told: u64,
    /// Their byte ranges, to discard once the slot is durable and before
    /// they are Clean (nothing writes them in between); empty unless the
    /// engine discards.
    pub discard: Vec<(u64, u64)>,
    /// Operations accepted before the snapshot point: durable with the slot.
    pub op_seq: u64,
    /// Map pages dirtied between the previous checkpoint and the snapshot
    /// (`Map::dirtied_pages` then). Until the slot is durable, a crash
    /// recovers from the previous checkpoint, whose recovery checkpoint
    /// dirties these again as well as those dirtied since: admission keeps
    /// room for both (`Engine::dirtied_for_recovery`).
    pub dirtied: usize,
    /// Told once the slot is durable (`LldOptions::checkpoint_hook`).
    pub hook: Option<super::engine::CheckpointHook>,
}

enum Phase2 {
    Ready,
    Running,
    /// The outcome: `None` when the slot is durable, else why not.
    Done(Option<String>),
}

/// A checkpoint between phase 1 and phase 3.
pub(crate) struct PendingCheckpoint {
    pub plan: Plan,
    state: Mutex<Phase2>,
    cv: Condvar,
    /// Segments phase 2 discarded.
    discarded: AtomicU64,
}

impl PendingCheckpoint {
    pub fn new(plan: Plan) -> Arc<PendingCheckpoint> {
        Arc::new(PendingCheckpoint {
            plan,
            state: Mutex::new(Phase2::Ready),
            cv: Condvar::new(),
            discarded: AtomicU64::new(0),
        })
    }

    /// Phase 2: runs it if nobody has started it, else waits for the thread
    /// that did. The caller that ran it gets the device's own error; the
    /// others a description of it.
    pub fn write(&self, dev: &dyn Device, flight: &Flight) -> LdResult<()> {
        {
            let mut s = self.state.lock().expect("checkpoint state poisoned");
            loop {
                match &*s {
                    Phase2::Ready => {
                        *s = Phase2::Running;
                        break;
                    }
                    Phase2::Running => s = self.cv.wait(s).expect("checkpoint state poisoned"),
                    Phase2::Done(None) => return Ok(()),
                    Phase2::Done(Some(why)) => {
                        return Err(LdError::ReadOnly(format!("checkpoint failed: {why}")))
                    }
                }
            }
        }
        let res = self.write_now(dev, flight);
        *self.state.lock().expect("checkpoint state poisoned") =
            Phase2::Done(res.as_ref().err().map(|e| e.to_string()));
        self.cv.notify_all();
        res
    }

    /// Why phase 2 failed, if it has run and failed (phase 3 may not have
    /// applied that yet).
    pub fn failed(&self) -> Option<String> {
        match &*self.state.lock().expect("checkpoint state poisoned") {
            Phase2::Done(Some(why)) => Some(why.clone()),
            _ => None,
        }
    }

    /// BSD-LFS 3.3: everything the slot names is durable before the slot
    /// is written, and the slot is durable before any segment it frees is
    /// reused (phase 3 releases them).
    fn write_now(&self, dev: &dyn Device, flight: &Flight) -> LdResult<()> {
        flight
            .wait_written(self.plan.ticket)
            .map_err(super::engine::drain_error)?;
        dev.flush()?;
        dev.write_at(&self.plan.slot_bytes, self.plan.slot_addr)?;
        dev.flush()?;
        // Before any released segment is discarded or reused: the store
        // layer must hear of a release before the bytes can change.
        // A hook that panics must not leave this phase running for ever
        // (review 26): its checkpoint counts as failed, which turns the
        // engine read-only.
        if let Some(hook) = &self.plan.hook {
            let told = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                (hook.0)(&super::engine::DurableCheckpoint {
                    serial: self.plan.serial,
                    slot_bytes: &self.plan.slot_bytes,
                    released: &self.plan.released,
                    segments_told: self.plan.segments_told,
                })
            }));
            if told.is_err() {
                return Err(LdError::ReadOnly(
                    "the checkpoint hook panicked: the engine is now read-only".into(),
                ));
            }
        }
        // TRIM is advice: a device that refuses or fails it keeps the
        // bytes, which nothing reads again before writing them.
        for &(offset, len) in &self.plan.discard {
            match dev.discard(offset, len) {
                Ok(true) => {
                    self.discarded.fetch_add(1, Ordering::Relaxed);
                }
                Ok(false) => break,
                Err(e) => {
                    eprintln!("ldfs: discard failed, segments kept as they are: {e}");
                    break;
                }
            }
        }
        Ok(())
    }

    /// Segments phase 2 gave back to the storage.
    pub fn discarded(&self) -> u64 {
        self.discarded.load(Ordering::Relaxed)
    }
}

/// The checkpointer thread: runs phase 2 and then `finish` (phase 3) for
/// checkpoints that operations started while holding locks of their own
/// (the file system's mutex around `end_aru`), so none of them waits for
/// the device.
pub(crate) struct Checkpointer {
    tx: Option<Sender<Arc<PendingCheckpoint>>>,
    handle: Option<JoinHandle<()>>,
}

impl Checkpointer {
    /// `finish` gets each pending checkpoint handed over; it runs phase 2
    /// and 3 (the engine's closure knows the device and the state lock).
    pub fn start(mut finish: impl FnMut(Arc<PendingCheckpoint>) + Send + 'static) -> Checkpointer {
        let (tx, rx) = channel::<Arc<PendingCheckpoint>>();
        let handle = std::thread::Builder::new()
            .name("ldfs-checkpointer".into())
            .spawn(move || {
                for p in rx {
                    finish(p);
                }
            })
            .expect("spawn checkpointer thread");
        Checkpointer {
            tx: Some(tx),
            handle: Some(handle),
        }
    }

    /// Hands a pending checkpoint to the thread; false if it has stopped
    /// (the caller then finishes the checkpoint itself).
    pub fn hand(&self, p: Arc<PendingCheckpoint>) -> bool {
        self.tx.as_ref().is_some_and(|tx| tx.send(p).is_ok())
    }

    /// Stops the thread once what was handed over is finished. Must not be
    /// called while holding the engine lock (phase 3 takes it).
    pub fn stop(&mut self) {
        self.tx.take();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        self.stop();
    }
}
