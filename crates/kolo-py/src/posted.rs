//! kolo.MPI's receives posted at `Irecv` (see `kolo::Communicator::post_recv`): the transport
//! writes the message straight into the buffer, which stays held until the receive completes or
//! is withdrawn. `Irecv` returns the receive's request (see `request`).

use pyo3::prelude::*;

use crate::buffer::{hold, Held, Target};
use crate::comm::PyCommunicator;
use crate::request::{Live, PyRequest};
use crate::run::Direction;
use kolo::{CollectiveBuffer, DType};

impl PyCommunicator {
    /// Posts a receive of the next message from `src` with `tag` into the bytes of `buf` where
    /// the transport can: its pending request (holding `buf`), else `None` (nothing posted).
    pub(crate) fn post_bytes<'py>(
        &self,
        py: Python<'py>,
        buf: &Bound<'py, PyAny>,
        src: usize,
        tag: u64,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let h = hold(buf, Some(DType::U8), "buf", true)?;
        self.post_held(py, h, src, tag)
    }

    /// [`Self::post_bytes`] of bytes already held (writable).
    pub(crate) fn post_held<'py>(
        &self,
        py: Python<'py>,
        h: Held,
        src: usize,
        tag: u64,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let mut target = Target::<u8>::new(h)?;
        let posted = self.brief(py, Direction::Recv, move |c| {
            // SAFETY: `target` holds the buffer's export, so its memory stays alive; it is kept
            // until the receive completes or is withdrawn (see `request::Live::end`). The program
            // must not use the buffer meanwhile, as MPI asks of `Irecv`.
            let posted = unsafe { c.post_recv(target.elements_mut(), src, tag) };
            posted.map(|p| p.map(|p| (p, target)))
        })?;
        let Some((posted, target)) = posted else {
            return Ok(None);
        };
        let live = Live::Recv {
            comm: self.comm.clone(),
            posted,
            target,
        };
        PyRequest::issue(py, live, src, tag).map(Some)
    }
}
