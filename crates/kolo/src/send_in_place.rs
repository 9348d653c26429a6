//! Sends in place: for a large message to a rank of the same host, the receiver copies the payload
//! once, straight out of the sender's memory (`process_vm_readv`; Open MPI calls it CMA), instead of
//! the sender copying it into the shared ring and the receiver copying it out. Unlike
//! [`Communicator::send`], which is buffered and done when it returns, a send in place is done only
//! once the receiver has copied the message: MPI's `Isend` with its buffer held until `Wait`.
//! kolo.MPI's `Isend` and `Send` of large buffers are built on it.
//!
//! Where the transport cannot (TCP, threads, a peer that may not read this process's memory, a
//! message below `KOLO_SHM_SINGLE_COPY_BYTES`) the send is an ordinary buffered one, done at once.
//! Either way the message keeps its place among the sender's others to that rank.

use kolo_core::dtype::as_bytes;
use kolo_core::{Element, Error, RecvError, Result};

use crate::communicator::Communicator;

const SEND: &str = "send";

/// A send issued by [`Communicator::send_in_place`]; [`Communicator::in_place_done`] and
/// [`Communicator::wait_in_place`] say when its buffer is free again.
#[derive(Debug)]
#[must_use = "the buffer must stay unchanged until the send is done"]
pub struct InPlaceSend {
    /// The receiver, as the transport numbers it and as the caller did.
    to: usize,
    dest: usize,
    /// The transport's ticket; `None`: sent buffered, done.
    ticket: Option<u64>,
}

impl InPlaceSend {
    /// Whether the message went through the transport's buffers (the send was done when issued).
    pub fn is_buffered(&self) -> bool {
        self.ticket.is_none()
    }
}

impl Communicator {
    /// Sends `data` to rank `dest` with `tag` in place where the transport can (see the module
    /// documentation), else buffered as [`Communicator::send`] does.
    ///
    /// # Safety
    ///
    /// Unless the send [`is_buffered`](InPlaceSend::is_buffered), the memory of `data` must stay
    /// alive and unchanged until [`Communicator::in_place_done`] returns `Ok(true)` or
    /// [`Communicator::wait_in_place`] returns `Ok(())` — and, if either fails, for as long as the
    /// process runs (the receiver may still be copying it).
    #[track_caller]
    pub unsafe fn send_in_place<T: Element>(
        &self,
        data: &[T],
        dest: usize,
        tag: u64,
    ) -> Result<InPlaceSend> {
        let rec = self
            .inner
            .recorder
            .p2p(false, Some(dest), T::DTYPE, data.len(), tag);
        let r = (|| -> Result<InPlaceSend> {
            let (to, header) = self.send_header::<T>(data.len(), dest, tag)?;
            // SAFETY: the caller keeps `data` as it is until the ticket is done (this function's
            // contract is the transport's).
            let ticket = unsafe {
                self.inner
                    .transport
                    .send_in_place(to, &header, as_bytes(data))
            }
            .map_err(|f| self.link_error(SEND, f))?;
            Ok(InPlaceSend { to, dest, ticket })
        })();
        rec.end(&r);
        r
    }

    /// The fewest bytes [`Communicator::send_in_place`] may send in place (`None`: it never does
    /// on this communicator's transport).
    pub fn in_place_min(&self) -> Option<usize> {
        self.inner.transport.in_place_min()
    }

    /// Whether the receiver of `send` has copied it (its buffer is free again); a failure of the
    /// link to it is an error.
    pub fn in_place_done(&self, send: &InPlaceSend) -> Result<bool> {
        let Some(ticket) = send.ticket else {
            return Ok(true);
        };
        self.inner
            .transport
            .in_place_done(send.to, ticket)
            .map_err(|f| self.link_error(SEND, f))
    }

    /// Waits, up to the communicator's timeout, until the receiver of `send` has copied it.
    pub fn wait_in_place(&self, send: &InPlaceSend) -> Result<()> {
        let Some(ticket) = send.ticket else {
            return Ok(());
        };
        let started = self.inner.recorder.coarse_instant();
        let deadline = started + self.inner.config.timeout;
        self.inner
            .transport
            .wait_in_place(send.to, ticket, Some(deadline))
            .map_err(|e| match e {
                RecvError::Timeout => Error::Timeout {
                    op: SEND,
                    rank: self.rank(),
                    peer: send.dest,
                    waited: started.elapsed(),
                },
                RecvError::Link(f) => self.link_error(SEND, f),
            })
    }
}
