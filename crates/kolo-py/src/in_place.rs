//! kolo.MPI's large sends, in place (see `kolo::Communicator::send_in_place`): the receiver copies
//! the bytes straight out of this process's buffer, which stays held until it has. `Isend`
//! returns the send's request (see `request`); `Send` waits for it.

use pyo3::prelude::*;

use crate::buffer::{hold, Held, Source};
use crate::comm::PyCommunicator;
use crate::request::Live;
use crate::run::Direction;
use kolo::{CollectiveBuffer, DType};

impl PyCommunicator {
    /// Sends the bytes of `buf` to `dest` with `tag`, in place where the transport can: the send
    /// (holding `buf`) then, else `None` (sent buffered, done).
    pub(crate) fn send_bytes_in_place(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        dest: usize,
        tag: u64,
    ) -> PyResult<Option<Live>> {
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
    ) -> PyResult<Option<Live>> {
        let source = Source::<u8>::alone(h)?;
        let (sent, source) = self.blocking_after(py, Some(Direction::Send), move |c| {
            // SAFETY: `source` holds the buffer's export, so its memory stays alive; it is kept
            // until the send is done (or, should that fail, forever: see `request::Live::end`).
            // kolo never writes into a send buffer; the program must not either until the send
            // is done, as MPI asks of `Isend`.
            let sent = unsafe { c.send_in_place(source.elements(), dest, tag) };
            sent.map(|s| (s, source))
        })?;
        if sent.is_buffered() {
            return Ok(None);
        }
        Ok(Some(Live::Send {
            comm: self.comm.clone(),
            send: sent,
            held: source.into_held(),
        }))
    }
}
