//! Point-to-point messages: `send`/`recv` with tags, `recv_any` from whichever rank sends first, and
//! `isend`/`irecv` with [`Request`] handles.
//!
//! Messages from one rank to another with one tag arrive in the order they were sent. Sends are
//! buffered: `send` returns once the message is handed to the transport, whether or not the receiver
//! has posted its receive (MPI's eager protocol, for every size), so `isend` completes at once
//! ([`Communicator::send_in_place`] is the rendezvous form, for large messages). A receive checks
//! the element type and length of what arrives.

use std::fmt;
use std::time::{Duration, Instant};

use kolo_core::dtype::{as_bytes, as_bytes_mut, vec_from_bytes};
use kolo_core::{
    Algorithm, Call, Element, Error, Header, LinkFailure, Message, OpKind, Received, RecvError,
    Result, Tag, TagSpace,
};

use crate::communicator::Communicator;

const SEND: &str = "send";
const RECV: &str = "recv";

impl Communicator {
    pub(crate) fn peer(&self, op: &'static str, arg: &'static str, peer: usize) -> Result<usize> {
        self.inner.check()?;
        self.inner
            .members
            .get(peer)
            .copied()
            .ok_or(Error::RankOutOfRange {
                op,
                rank: self.rank(),
                arg,
                value: peer,
                size: self.size(),
            })
    }

    pub(crate) fn p2p_tag(&self, tag: u64) -> Tag {
        Tag {
            group: self.inner.group,
            space: TagSpace::P2p,
            value: tag,
        }
    }

    pub(crate) fn link_error(&self, op: &'static str, f: LinkFailure) -> Error {
        f.into_error(op, self.rank())
    }

    /// Sends `data` to rank `dest` with `tag`, which is below `u64::MAX`, the tag receives use for any tag
    /// ([`TagMatch::Any`](crate::TagMatch::Any)).
    #[track_caller]
    pub fn send<T: Element>(&self, data: &[T], dest: usize, tag: u64) -> Result<()> {
        let rec = self
            .inner
            .recorder
            .p2p(false, Some(dest), T::DTYPE, data.len(), tag);
        let r = (|| -> Result<()> {
            let (to, header) = self.send_header::<T>(data.len(), dest, tag)?;
            self.inner
                .transport
                .send(to, &header, as_bytes(data))
                .map_err(|f| self.link_error(SEND, f))
        })();
        rec.end(&r);
        r
    }

    /// The transport rank of `dest` and the header of a send of `count` `T`s to it with `tag`.
    pub(crate) fn send_header<T: Element>(
        &self,
        count: usize,
        dest: usize,
        tag: u64,
    ) -> Result<(usize, Header)> {
        let to = self.peer(SEND, "dest", dest)?;
        if tag == Tag::ANY_VALUE {
            return Err(Error::InvalidArgument {
                op: SEND,
                rank: self.rank(),
                arg: "tag",
                reason: "u64::MAX is the tag of receives that match any tag (TagMatch::Any); a \
                         message's tag is below it"
                    .into(),
            });
        }
        let header = Header {
            ack: false,
            tag: self.p2p_tag(tag),
            call: Call {
                dtype: Some(T::DTYPE),
                count: count as u64,
                root: Some(self.rank() as u32),
                ..Call::new(OpKind::Send, Algorithm::Direct)
            },
        };
        Ok((to, header))
    }

    /// Non-blocking send. Sends are buffered, so the request is complete when it is returned.
    pub fn isend<T: Element>(&self, data: &[T], dest: usize, tag: u64) -> Request<()> {
        Request::done(self.send(data, dest, tag))
    }

    /// Checks that a message from `src` with `header` is a send of `T`s (`expect`: of that many).
    pub(crate) fn check_sent<T: Element>(
        &self,
        src: usize,
        header: &Header,
        expect: Option<usize>,
    ) -> Result<()> {
        let call = header.call;
        let mine = Call {
            dtype: Some(T::DTYPE),
            count: expect.map_or(call.count, |c| c as u64),
            root: Some(src as u32),
            ..Call::new(OpKind::Send, Algorithm::Direct)
        };
        if call.op != OpKind::Send || call.dtype != Some(T::DTYPE) {
            return Err(Error::Mismatch {
                rank: self.rank(),
                peer: src,
                local: mine,
                remote: call,
                tag: header.tag,
            });
        }
        Ok(())
    }

    pub(crate) fn check_message<T: Element>(
        &self,
        src: usize,
        msg: Message,
        expect: Option<usize>,
    ) -> Result<Vec<T>> {
        self.check_header::<T>(src, &msg.header, msg.payload.len(), expect)?;
        Ok(vec_from_bytes(&msg.payload))
    }

    /// Checks that a message from `src` with `header` and `len` payload bytes is a send of `T`s (of
    /// exactly `expect` elements, when given).
    fn check_header<T: Element>(
        &self,
        src: usize,
        header: &Header,
        len: usize,
        expect: Option<usize>,
    ) -> Result<()> {
        self.check_sent::<T>(src, header, expect)?;
        let elem = std::mem::size_of::<T>();
        if let Some(n) = expect {
            if len != n * elem {
                return Err(Error::MessageLength {
                    op: RECV,
                    rank: self.rank(),
                    peer: src,
                    expected: n * elem,
                    actual: len,
                });
            }
        }
        if !len.is_multiple_of(elem) {
            return Err(Error::Protocol {
                rank: self.rank(),
                peer: src,
                reason: format!("{len} bytes is not a whole number of {}", T::DTYPE),
            });
        }
        Ok(())
    }

    pub(crate) fn recv_error(&self, src: usize, started: Instant, e: RecvError) -> Error {
        match e {
            RecvError::Timeout => Error::Timeout {
                op: RECV,
                rank: self.rank(),
                peer: src,
                waited: started.elapsed(),
            },
            RecvError::Link(f) => self.link_error(RECV, f),
        }
    }

    fn recv_message(&self, src: usize, tag: u64, deadline: Option<Instant>) -> Result<Message> {
        let from = self.peer(RECV, "src", src)?;
        let started = self.inner.recorder.coarse_instant();
        self.inner
            .transport
            .recv(from, &self.p2p_tag(tag), deadline)
            .map_err(|e| self.recv_error(src, started, e))
    }

    /// The first message with `tag` to arrive from any rank of the group, and its sender's rank.
    fn recv_any_message(&self, tag: u64, deadline: Option<Instant>) -> Result<(usize, Message)> {
        self.inner.check()?;
        let started = self.inner.recorder.coarse_instant();
        let members = &self.inner.members;
        let (from, msg) = self
            .inner
            .transport
            .recv_any(members, &self.p2p_tag(tag), deadline)
            .map_err(|e| match e {
                RecvError::Timeout => Error::TimeoutAnySource {
                    op: RECV,
                    rank: self.rank(),
                    tag,
                    waited: started.elapsed(),
                },
                RecvError::Link(f) => self.link_error(RECV, f),
            })?;
        let src = members
            .iter()
            .position(|&m| m == from)
            .ok_or_else(|| Error::Protocol {
                rank: self.rank(),
                peer: from,
                reason: "the transport handed over a message from a rank outside the group".into(),
            })?;
        Ok((src, msg))
    }

    /// Receives into `buf` the first message with `tag` to arrive from any rank of the group (MPI's
    /// `MPI_ANY_SOURCE`; this rank's own sends included), which must have exactly `buf.len()`
    /// elements, and returns its sender's rank. Messages from one rank still arrive in the order it
    /// sent them. Waits up to the communicator's timeout ([`Error::TimeoutAnySource`]).
    ///
    /// ```
    /// let results = kolo::run_local(3, kolo::Config::default(), |comm| {
    ///     if comm.rank() != 0 {
    ///         return comm.send(&[comm.rank() as i32], 0, 7);
    ///     }
    ///     let mut from = Vec::new();
    ///     for _ in 1..3 {
    ///         let mut v = [0i32];
    ///         let src = comm.recv_any(&mut v, 7)?;
    ///         assert_eq!(v[0] as usize, src);
    ///         from.push(src);
    ///     }
    ///     from.sort();
    ///     assert_eq!(from, [1, 2]);
    ///     Ok(())
    /// });
    /// assert!(results.iter().all(|r| matches!(r, Ok(Ok(())))));
    /// ```
    #[track_caller]
    pub fn recv_any<T: Element>(&self, buf: &mut [T], tag: u64) -> Result<usize> {
        let rec = self
            .inner
            .recorder
            .p2p(true, None, T::DTYPE, buf.len(), tag);
        let r = (|| -> Result<usize> {
            let deadline = self.inner.deadline();
            let (src, msg) = self.recv_any_message(tag, Some(deadline))?;
            let v: Vec<T> = self.check_message(src, msg, Some(buf.len()))?;
            as_bytes_mut(buf).copy_from_slice(as_bytes(&v));
            Ok(src)
        })();
        rec.end(&r);
        r
    }

    /// Receives the first message with `tag` to arrive from any rank of the group, of any length:
    /// its sender's rank and its elements (see [`Communicator::recv_any`]).
    #[track_caller]
    pub fn recv_vec_any<T: Element>(&self, tag: u64) -> Result<(usize, Vec<T>)> {
        let rec = self.inner.recorder.p2p(true, None, T::DTYPE, 0, tag);
        let r = (|| -> Result<(usize, Vec<T>)> {
            let deadline = self.inner.deadline();
            let (src, msg) = self.recv_any_message(tag, Some(deadline))?;
            Ok((src, self.check_message(src, msg, None)?))
        })();
        rec.end(&r);
        r
    }

    /// Receives a message of exactly `buf.len()` elements from `src` with `tag` into `buf`, waiting up
    /// to the communicator's timeout.
    #[track_caller]
    pub fn recv<T: Element>(&self, buf: &mut [T], src: usize, tag: u64) -> Result<()> {
        let rec = self
            .inner
            .recorder
            .p2p(true, Some(src), T::DTYPE, buf.len(), tag);
        let count = buf.len();
        let r = self.recv_into(as_bytes_mut(buf), src, tag, &mut |dst, got| match got {
            Received::Direct(h) => self.check_header::<T>(src, &h, dst.len(), Some(count)),
            Received::Message(m) => {
                self.check_header::<T>(src, &m.header, m.payload.len(), Some(count))?;
                dst.copy_from_slice(&m.payload);
                self.inner.transport.recycle(m.payload);
                Ok(())
            }
        });
        rec.end(&r);
        r
    }

    /// Receives a message of any length from `src` with `tag`, waiting up to the communicator's timeout.
    #[track_caller]
    pub fn recv_vec<T: Element>(&self, src: usize, tag: u64) -> Result<Vec<T>> {
        let rec = self.inner.recorder.p2p(true, Some(src), T::DTYPE, 0, tag);
        let r = (|| -> Result<Vec<T>> {
            let deadline = self.inner.deadline();
            let msg = self.recv_message(src, tag, Some(deadline))?;
            self.check_message(src, msg, None)
        })();
        rec.end(&r);
        r
    }

    /// Receives the next message from `src` with `tag` into the start of `buf` and returns its length
    /// in elements: MPI's receive, whose buffer bounds the message (the rest of `buf` is left as it
    /// was). A longer message is an [`Error::InvalidArgument`] (MPI's `ERR_TRUNCATE`; the message is
    /// consumed). The payload is copied once, into `buf`. Waits up to the communicator's timeout.
    #[track_caller]
    pub fn recv_upto<T: Element>(&self, buf: &mut [T], src: usize, tag: u64) -> Result<usize> {
        let rec = self
            .inner
            .recorder
            .p2p(true, Some(src), T::DTYPE, buf.len(), tag);
        let mut got = 0;
        let r = self
            .recv_into(as_bytes_mut(buf), src, tag, &mut |dst, r| {
                got = match r {
                    Received::Direct(h) => {
                        self.check_sent::<T>(src, &h, None)?;
                        dst.len() / std::mem::size_of::<T>()
                    }
                    Received::Message(m) => self.fill::<T>(dst, src, tag, m)?,
                };
                Ok(())
            })
            .map(|()| got);
        rec.end(&r);
        r
    }

    /// The next message from `src` with `tag`, posted into `bytes`: a transport that can writes
    /// the payload straight into it (no buffer, no copy), else `each` gets the message to copy.
    /// Waits up to the communicator's timeout.
    fn recv_into(
        &self,
        bytes: &mut [u8],
        src: usize,
        tag: u64,
        each: &mut dyn FnMut(&mut [u8], Received) -> Result<()>,
    ) -> Result<()> {
        let from = self.peer(RECV, "src", src)?;
        let started = self.inner.recorder.coarse_instant();
        let len = bytes.len();
        self.inner.transport.recv_posted(
            from,
            &self.p2p_tag(tag),
            bytes,
            len.max(1),
            None,
            Some(started + self.inner.config.timeout),
            &mut || Ok(()),
            each,
            &|e| self.recv_error(src, started, e),
        )
    }

    /// [`Communicator::recv_upto`] of a message that has arrived already: `None` at once if none has.
    pub fn try_recv_upto<T: Element>(
        &self,
        buf: &mut [T],
        src: usize,
        tag: u64,
    ) -> Result<Option<usize>> {
        let from = self.peer(RECV, "src", src)?;
        let msg = self
            .inner
            .transport
            .try_recv(from, &self.p2p_tag(tag))
            .map_err(|f| self.link_error(RECV, f))?;
        msg.map(|m| self.fill::<T>(as_bytes_mut(buf), src, tag, m))
            .transpose()
    }

    /// Copies the payload of `msg` (from `src` with `tag`) into the start of `buf`; its length in
    /// elements.
    pub(crate) fn fill<T: Element>(
        &self,
        buf: &mut [u8],
        src: usize,
        tag: u64,
        msg: Message,
    ) -> Result<usize> {
        self.check_sent::<T>(src, &msg.header, None)?;
        let (have, got) = (buf.len(), msg.payload.len());
        if let Some(e) = self.length_error::<T>(src, tag, got, have) {
            return Err(e);
        }
        buf[..got].copy_from_slice(&msg.payload);
        self.inner.transport.recycle(msg.payload);
        Ok(got / std::mem::size_of::<T>())
    }

    /// Non-blocking receive of a message from `src` with `tag`; with `Some(count)` the message must
    /// have exactly `count` elements.
    pub fn irecv<T: Element>(&self, src: usize, tag: u64, count: Option<usize>) -> Request<Vec<T>> {
        match self.peer(RECV, "src", src) {
            Err(e) => Request::done(Err(e)),
            Ok(_) => Request {
                state: State::Pending {
                    comm: self.clone(),
                    src,
                    tag,
                    count,
                },
            },
        }
    }
}

enum State<R> {
    Pending {
        comm: Communicator,
        src: usize,
        tag: u64,
        count: Option<usize>,
    },
    Done(Result<R>),
    Taken,
}

/// A pending point-to-point operation.
#[must_use = "a request reports its error only through test/wait"]
pub struct Request<R> {
    state: State<R>,
}

impl<R> fmt::Debug for Request<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match &self.state {
            State::Pending { src, tag, .. } => format!("pending recv from {src} tag {tag}"),
            State::Done(_) => "complete".into(),
            State::Taken => "taken".into(),
        };
        f.debug_struct("Request").field("state", &s).finish()
    }
}

/// What a request delivers when it completes.
pub trait Completion: Sized {
    #[doc(hidden)]
    fn finish(comm: &Communicator, src: usize, msg: Message, count: Option<usize>) -> Result<Self>;
}

impl<T: Element> Completion for Vec<T> {
    fn finish(comm: &Communicator, src: usize, msg: Message, count: Option<usize>) -> Result<Self> {
        comm.check_message(src, msg, count)
    }
}

impl Completion for () {
    fn finish(_: &Communicator, _: usize, _: Message, _: Option<usize>) -> Result<Self> {
        Ok(())
    }
}

impl<R: Completion> Request<R> {
    fn done(r: Result<R>) -> Self {
        Request {
            state: State::Done(r),
        }
    }

    fn poll(&mut self, deadline: Option<Option<Instant>>) -> Result<bool> {
        let State::Pending {
            comm,
            src,
            tag,
            count,
        } = &self.state
        else {
            return Ok(true);
        };
        let msg = match deadline {
            None => {
                let from = comm.peer(RECV, "src", *src)?;
                comm.inner
                    .transport
                    .try_recv(from, &comm.p2p_tag(*tag))
                    .map_err(|f| comm.link_error(RECV, f))?
            }
            Some(d) => match comm.recv_message(*src, *tag, d) {
                Ok(m) => Some(m),
                Err(Error::Timeout { .. }) if d.is_some() => None,
                Err(e) => return Err(e),
            },
        };
        match msg {
            None => Ok(false),
            Some(m) => {
                let r = R::finish(comm, *src, m, *count);
                self.state = State::Done(r);
                Ok(true)
            }
        }
    }

    /// Whether the operation has completed (a failed one counts as completed; `wait` returns its error).
    pub fn test(&mut self) -> bool {
        match self.poll(None) {
            Ok(done) => done,
            Err(e) => {
                self.state = State::Done(Err(e));
                true
            }
        }
    }

    /// Waits up to `timeout`; returns whether the operation completed. A request that has not
    /// completed can be waited on again.
    pub fn wait_timeout(&mut self, timeout: Duration) -> bool {
        match self.poll(Some(Some(Instant::now() + timeout))) {
            Ok(done) => done,
            Err(e) => {
                self.state = State::Done(Err(e));
                true
            }
        }
    }

    /// Waits for completion (up to the communicator's timeout) and returns the result.
    pub fn wait(mut self) -> Result<R> {
        if let State::Pending { comm, .. } = &self.state {
            let deadline = comm.inner.deadline();
            self.poll(Some(Some(deadline)))?;
        }
        match std::mem::replace(&mut self.state, State::Taken) {
            State::Done(r) => r,
            State::Pending { comm, src, .. } => Err(Error::Timeout {
                op: RECV,
                rank: comm.rank(),
                peer: src,
                waited: comm.inner.config.timeout,
            }),
            State::Taken => Err(Error::Unsupported {
                what: "waiting twice on one request".into(),
            }),
        }
    }
}
