//! Collectives on GPU memory ([`Communicator::all_reduce_device`]): where the communicator's engine
//! has them (`KOLO_BACKEND=nccl`), a GPU tensor is reduced where it lies, on the engine's own
//! communication stream, instead of through host memory. The call is checked and fingerprinted as
//! every collective is (the ranks agree on it first), and the wait has the communicator's deadline.

use kolo_core::{Algorithm, DeviceBuffer, DeviceTicket, OpKind, ReduceOp, Result};

use crate::communicator::{Communicator, Inner};

/// A queued collective on GPU memory: [`DeviceWork::wait`] before the buffer is read. Dropped
/// without a wait, it is waited for then (the buffer must outlive the collective).
#[derive(Debug)]
#[must_use = "the buffer holds the result only after wait()"]
pub struct DeviceWork {
    comm: Communicator,
    /// Its sequence number and start: the flight record's entry, completed (or failed) by the
    /// wait.
    seq: u64,
    at: std::time::Instant,
    ticket: Option<DeviceTicket>,
}

impl DeviceWork {
    /// Waits until the collective has completed on the GPU: the buffer then holds the result,
    /// for any stream. An error (a peer that died or stalled: the communicator's timeout; the
    /// engine's own error) poisons the communicator.
    pub fn wait(mut self) -> Result<()> {
        self.finish()
    }

    /// Waits for the GPU and ends the collective's entry in the flight record with the outcome:
    /// a collective stuck on the device (a peer that never queued its part) stays `started` there.
    fn finish(&mut self) -> Result<()> {
        match self.ticket.take() {
            Some(t) => {
                let inner = &*self.comm.inner;
                let r = inner.backend.device_wait(inner, t);
                inner.recorder.end(self.seq, self.at, &r);
                r
            }
            None => Ok(()),
        }
    }
}

impl Drop for DeviceWork {
    fn drop(&mut self) {
        // An error has poisoned the communicator: the next call reports it.
        let _ = self.finish();
    }
}

impl Communicator {
    /// The CUDA device whose memory [`Communicator::all_reduce_device`] takes, when the
    /// communicator's engine has collectives on GPU memory (`KOLO_BACKEND=nccl`); `None` otherwise.
    pub fn device_ordinal(&self) -> Option<usize> {
        self.inner
            .backend
            .engine()
            .and_then(|e| e.device())
            .map(|d| d.device_ordinal())
    }

    /// Reduces GPU memory in place over all ranks with `op`, every rank getting the result: queued
    /// on the engine's communication stream once `buf.ready` (an event on the producer's stream)
    /// has completed, so it overlaps the producer's later work. Returns at once; the buffer holds
    /// the result after [`DeviceWork::wait`]. The buffer must be on
    /// [`Communicator::device_ordinal`] and stay allocated until then. Collective, in order with
    /// the communicator's other collectives; an error where the engine has no device collectives.
    #[track_caller]
    pub fn all_reduce_device(&self, buf: DeviceBuffer, op: ReduceOp) -> Result<DeviceWork> {
        // Refused before it takes a place in the sequence: every rank refuses the same way, and
        // the communicator goes on.
        if self.device_ordinal().is_none() {
            return Err(crate::backend::no_device_collectives(
                self.rank(),
                self.backend(),
            ));
        }
        let seq = self.inner.issue_blocking()?;
        let (ticket, at) = self.inner.all_reduce_device(seq, buf, op)?;
        Ok(DeviceWork {
            comm: self.clone(),
            seq,
            at,
            ticket: Some(ticket),
        })
    }
}

impl Inner {
    /// Queues the collective; its ticket and start.
    fn all_reduce_device(
        &self,
        seq: u64,
        buf: DeviceBuffer,
        op: ReduceOp,
    ) -> Result<(DeviceTicket, std::time::Instant)> {
        let mut call = self.check_args(OpKind::AllReduce, |c| {
            Ok(c.call(buf.dtype, buf.count, Some(op), None))
        })?;
        call.algo = Algorithm::Engine;
        // Started when queued on the device; DeviceWork's wait ends it (a refusal, here).
        let job = self.job(seq, call);
        let at = job.at;
        let r = self.backend.device_all_reduce(job, buf, op);
        if r.is_err() {
            self.recorder.end(seq, at, &r);
        }
        r.map(|t| (t, at))
    }
}
