//! kolo.MPI's receives posted at `Irecv` (see `kolo::Communicator::post_recv`): the transport
//! writes the message straight into the buffer, which stays held until the receive completes or
//! is withdrawn. A posted receive is a `kolo._kolo.PostedRecv`; kolo.MPI's `Irecv` returns a
//! request around it.

use std::sync::{Arc, Mutex, MutexGuard};

use kolo::{Communicator, PostedRecv};
use pyo3::prelude::*;

use crate::buffer::{hold, Target};
use crate::comm::PyCommunicator;
use crate::errors::to_py;
use crate::run::Direction;
use kolo::{CollectiveBuffer, DType};

type Pending = Option<(PostedRecv<u8>, Target<u8>)>;

/// A posted receive not yet complete, and the buffer it writes (under a lock: Python may call it
/// from several threads).
#[pyclass(module = "kolo._kolo", name = "PostedRecv")]
pub(crate) struct PyPostedRecv {
    comm: Arc<Communicator>,
    /// `None` once complete (or failed).
    pending: Mutex<Pending>,
}

fn lock(m: &Mutex<Pending>) -> MutexGuard<'_, Pending> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl PyCommunicator {
    /// Posts a receive of the next message from `src` with `tag` into the bytes of `buf` where
    /// the transport can: the posting (holding `buf`), else `None` (nothing posted).
    pub(crate) fn post_bytes(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        src: usize,
        tag: u64,
    ) -> PyResult<Option<PyPostedRecv>> {
        let h = hold(buf, Some(DType::U8), "buf", true)?;
        let mut target = Target::<u8>::new(h)?;
        let (posted, target) = self.brief(py, Direction::Recv, move |c| {
            // SAFETY: `target` holds the buffer's export, so its memory stays alive; it is kept
            // until the receive completes or is withdrawn (see `Drop`). The program must not use
            // the buffer meanwhile, as MPI asks of `Irecv`.
            let posted = unsafe { c.post_recv(target.elements_mut(), src, tag) };
            posted.map(|p| (p, target))
        })?;
        Ok(posted.map(|p| PyPostedRecv {
            comm: self.comm.clone(),
            pending: Mutex::new(Some((p, target))),
        }))
    }
}

#[pymethods]
impl PyPostedRecv {
    /// The bytes received once the message has arrived, else `None`; raises if the receive
    /// failed (which completes it).
    fn done(&self) -> PyResult<Option<usize>> {
        let mut pending = lock(&self.pending);
        let Some((posted, _)) = pending.as_ref() else {
            return Ok(None);
        };
        let got = self.comm.test_posted(posted);
        let released = settle(&self.comm, &mut pending, !matches!(got, Ok(None)));
        drop(released);
        got.map_err(to_py)
    }

    /// Waits (up to the communicator's timeout) for the message: the bytes received.
    fn wait(&self, py: Python<'_>) -> PyResult<usize> {
        // Most waits find the message there already: no release of the GIL for those.
        if let Some(n) = self.done()? {
            return Ok(n);
        }
        let comm = &self.comm;
        let pending = &self.pending;
        let (got, released) = py.detach(|| {
            let mut pending = lock(pending);
            let Some((posted, _)) = pending.as_ref() else {
                return (Ok(0), None);
            };
            let got = comm.wait_posted(posted);
            let released = settle(comm, &mut pending, true);
            (got, released)
        });
        drop(released); // with the GIL, which releasing the buffer takes
        got.map_err(to_py)
    }
}

/// A receive that has ended (complete, failed, or timed out: withdrawn then) gives its buffer back.
#[must_use]
fn settle(comm: &Communicator, pending: &mut Pending, ended: bool) -> Option<Target<u8>> {
    if !ended {
        return None;
    }
    let (posted, target) = pending.take()?;
    comm.unpost(posted);
    Some(target)
}

impl Drop for PyPostedRecv {
    /// A request dropped before its receive completed withdraws it: nothing is written into the
    /// buffer once it is released.
    fn drop(&mut self) {
        let pending = self.pending.get_mut().unwrap_or_else(|p| p.into_inner());
        drop(settle(&self.comm, pending, true));
    }
}
