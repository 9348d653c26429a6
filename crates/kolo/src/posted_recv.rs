//! Receives posted ahead of their messages (MPI's `Irecv` with its buffer given at once): where
//! the transport can, the payload is written straight into the posted buffer by whichever call of
//! this rank next moves incoming messages — a wait for this receive or for anything else — instead
//! of being queued in a buffer of kolo's and copied again when the receive is waited on. The
//! shared-memory transport posts (between processes of one host; for a message sent in place the
//! one copy is straight out of the sender's memory); elsewhere [`Communicator::post_recv`] returns
//! `None` and the caller receives as usual ([`Communicator::recv_upto`]). kolo.MPI's `Irecv` is
//! built on it.
//!
//! As [`Communicator::recv_upto`]: the buffer bounds the message (a shorter one fills its start
//! and leaves the rest as it was; a longer one is consumed, nothing written, and reported as MPI's
//! `ERR_TRUNCATE`). Postings from one rank with one tag take its messages in the order they were
//! posted, before receives issued after them.

use std::marker::PhantomData;

use kolo_core::dtype::as_bytes_mut;
use kolo_core::{Element, Error, Header, RecvError, Result};

use crate::communicator::Communicator;

const RECV: &str = "recv";

/// A receive posted by [`Communicator::post_recv`]; [`Communicator::test_posted`] and
/// [`Communicator::wait_posted`] complete it, [`Communicator::unpost`] withdraws it.
#[derive(Debug)]
#[must_use = "the buffer is written until the receive completes or is withdrawn"]
pub struct PostedRecv<T> {
    src: usize,
    tag: u64,
    posting: u64,
    /// The buffer's length in bytes.
    cap: usize,
    _t: PhantomData<fn() -> T>,
}

impl Communicator {
    /// Posts a receive of the next message from `src` with `tag` into `buf` where the transport
    /// can (see the module documentation); `None` where it cannot (nothing posted).
    ///
    /// # Safety
    ///
    /// With `Ok(Some(posted))`, `buf` must stay alive, and be neither read nor written, until
    /// [`Communicator::test_posted`] or [`Communicator::wait_posted`] returns anything but
    /// `Ok(None)` for it, or [`Communicator::unpost`] returns.
    pub unsafe fn post_recv<T: Element>(
        &self,
        buf: &mut [T],
        src: usize,
        tag: u64,
    ) -> Result<Option<PostedRecv<T>>> {
        let from = self.peer(RECV, "src", src)?;
        let bytes = as_bytes_mut(buf);
        // SAFETY: the caller's contract is the transport's.
        let posting = unsafe {
            self.inner.transport.post_recv(
                from,
                &self.p2p_tag(tag),
                bytes.as_mut_ptr(),
                bytes.len(),
            )
        }
        .map_err(|f| self.link_error(RECV, f))?;
        Ok(posting.map(|posting| PostedRecv {
            src,
            tag,
            posting,
            cap: bytes.len(),
            _t: PhantomData,
        }))
    }

    /// The elements `posted` received, once it has: `None` at once while its message has not
    /// arrived. An error (a link failure, a message of another element type, or too long for the
    /// buffer) completes it too.
    pub fn test_posted<T: Element>(&self, posted: &PostedRecv<T>) -> Result<Option<usize>> {
        let started = self.inner.recorder.coarse_instant();
        let got = self
            .inner
            .transport
            .posted_recv(posted.posting, false, None)
            .map_err(|e| self.recv_error(posted.src, started, e))?;
        got.map(|(h, len)| self.posted_len(posted, &h, len))
            .transpose()
    }

    /// Waits, up to the communicator's timeout, until `posted` has received its message: the
    /// elements received. Should the wait time out, the receive stays posted.
    #[track_caller]
    pub fn wait_posted<T: Element>(&self, posted: &PostedRecv<T>) -> Result<usize> {
        let rec = self.inner.recorder.p2p(
            true,
            Some(posted.src),
            T::DTYPE,
            posted.cap / std::mem::size_of::<T>(),
            posted.tag,
        );
        let started = self.inner.recorder.coarse_instant();
        let deadline = started + self.inner.config.timeout;
        let r = self
            .inner
            .transport
            .posted_recv(posted.posting, true, Some(deadline))
            .and_then(|got| got.ok_or(RecvError::Timeout))
            .map_err(|e| self.recv_error(posted.src, started, e))
            .and_then(|(h, len)| self.posted_len(posted, &h, len));
        rec.end(&r);
        r
    }

    /// Withdraws `posted`: nothing is written into its buffer after this returns. A message it
    /// had begun to take goes whole to the next receive instead.
    pub fn unpost<T>(&self, posted: PostedRecv<T>) {
        self.inner.transport.unpost_recv(posted.posting);
    }

    fn posted_len<T: Element>(&self, p: &PostedRecv<T>, h: &Header, len: usize) -> Result<usize> {
        self.check_sent::<T>(p.src, h, None)?;
        match self.length_error::<T>(p.src, p.tag, len, p.cap) {
            Some(e) => Err(e),
            None => Ok(len / std::mem::size_of::<T>()),
        }
    }

    /// The error of a message of `got` bytes from `src` with `tag` received into `have` bytes of
    /// `T` (longer than them, or not whole elements), if it is one.
    pub(crate) fn length_error<T: Element>(
        &self,
        src: usize,
        tag: u64,
        got: usize,
        have: usize,
    ) -> Option<Error> {
        let reason = if got > have {
            format!(
                "the message from rank {src} with tag {tag} has {got} bytes, more than the \
                 buffer holds ({have} bytes; MPI's ERR_TRUNCATE)"
            )
        } else if !got.is_multiple_of(std::mem::size_of::<T>()) {
            format!(
                "{got} bytes from rank {src} are not a whole number of {}",
                T::DTYPE
            )
        } else {
            return None;
        };
        Some(Error::InvalidArgument {
            op: RECV,
            rank: self.rank(),
            arg: "buf",
            reason,
        })
    }
}
