//! kolo.MPI's large sends, in place (see `kolo::Communicator::send_in_place`): the receiver copies
//! the bytes straight out of this process's buffer, which stays held until it has. A send in
//! place is a `kolo._kolo.InPlaceSend`; `Isend` returns a request around it, `Send` waits on it.

use std::sync::{Arc, Mutex, MutexGuard};

use kolo::{Communicator, InPlaceSend};
use pyo3::prelude::*;

use crate::buffer::{hold, Held, Source};
use crate::comm::PyCommunicator;
use crate::errors::to_py;
use crate::run::Direction;
use kolo::{CollectiveBuffer, DType};

/// A send in place not yet known to be done, and the buffer it holds (under a lock: Python may
/// call it from several threads).
#[pyclass(module = "kolo._kolo", name = "InPlaceSend")]
pub(crate) struct PyInPlaceSend {
    comm: Arc<Communicator>,
    /// `None` once done.
    pending: Mutex<Option<(InPlaceSend, Held)>>,
}

type Pending = Option<(InPlaceSend, Held)>;

fn lock(m: &Mutex<Pending>) -> MutexGuard<'_, Pending> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl PyCommunicator {
    /// Sends the bytes of `buf` to `dest` with `tag`, in place where the transport can: the send
    /// (holding `buf`) then, else `None` (sent buffered, done).
    pub(crate) fn send_bytes_in_place(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        dest: usize,
        tag: u64,
    ) -> PyResult<Option<PyInPlaceSend>> {
        let h = hold(buf, Some(DType::U8), "buf", false)?;
        self.send_held_in_place(py, h, dest, tag)
    }

    /// [`Self::send_bytes_in_place`] of bytes already held.
    pub(crate) fn send_held_in_place(
        &self,
        py: Python<'_>,
        h: Held,
        dest: usize,
        tag: u64,
    ) -> PyResult<Option<PyInPlaceSend>> {
        let source = Source::<u8>::alone(h)?;
        let (sent, source) = self.blocking_after(py, Some(Direction::Send), move |c| {
            // SAFETY: `source` holds the buffer's export, so its memory stays alive; it is kept
            // until the send is done (or, should that fail, forever: see `Drop`). kolo never
            // writes into a send buffer; the program must not either until the send is done,
            // as MPI asks of `Isend`.
            let sent = unsafe { c.send_in_place(source.elements(), dest, tag) };
            sent.map(|s| (s, source))
        })?;
        if sent.is_buffered() {
            return Ok(None);
        }
        Ok(Some(PyInPlaceSend {
            comm: self.comm.clone(),
            pending: Mutex::new(Some((sent, source.into_held()))),
        }))
    }
}

#[pymethods]
impl PyInPlaceSend {
    /// Whether the receiver has copied the message (its buffer is free again); raises if the
    /// link to it failed.
    fn done(&self) -> PyResult<bool> {
        let mut pending = lock(&self.pending);
        let Some((send, _)) = pending.as_ref() else {
            return Ok(true);
        };
        let done = self.comm.in_place_done(send);
        let released = settle(&mut pending, matches!(done, Ok(true)), done.is_err());
        drop(released);
        done.map_err(to_py)
    }

    /// Waits (up to the communicator's timeout) until the receiver has copied the message.
    pub(crate) fn wait(&self, py: Python<'_>) -> PyResult<()> {
        // Most waits of a window of sends find them copied already: no release of the GIL then.
        if self.done()? {
            return Ok(());
        }
        let comm = &self.comm;
        let pending = &self.pending;
        let (waited, released) = py.detach(|| {
            let mut pending = lock(pending);
            let Some((send, _)) = pending.as_ref() else {
                return (Ok(()), None);
            };
            let waited = comm.wait_in_place(send);
            let released = settle(&mut pending, waited.is_ok(), waited.is_err());
            (waited, released)
        });
        drop(released); // with the GIL, which releasing the buffer takes
        waited.map_err(to_py)
    }
}

/// A send known `done` gives its buffer back (to be released); one that `failed` keeps it forever
/// (the receiver may still copy it).
#[must_use]
fn settle(pending: &mut Pending, done: bool, failed: bool) -> Option<Held> {
    if done {
        return pending.take().map(|(_, held)| held);
    }
    if failed {
        if let Some((_, held)) = pending.take() {
            std::mem::forget(held);
        }
    }
    None
}

impl Drop for PyInPlaceSend {
    /// A request dropped before its send was done (MPI's `Request.Free`) waits for it first: the
    /// buffer's memory must not go away under the receiver's copy.
    fn drop(&mut self) {
        let comm = self.comm.clone();
        let pending = self.pending.get_mut().unwrap_or_else(|p| p.into_inner());
        let Some((send, _)) = pending.as_ref() else {
            return;
        };
        let waited = Python::try_attach(|py| py.detach(|| comm.wait_in_place(send)))
            .unwrap_or_else(|| comm.wait_in_place(send));
        drop(settle(pending, waited.is_ok(), waited.is_err()));
    }
}
