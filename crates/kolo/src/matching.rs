//! Receives that match any source, any tag or both (MPI's `MPI_ANY_SOURCE` and `MPI_ANY_TAG`), and
//! say what they matched: [`Status`].
//!
//! Messages from one rank keep their order whatever the tags: a receive for any tag from a rank
//! takes the first of that rank's messages still waiting (of this communicator, point-to-point); a
//! receive from any rank takes the message that arrived first among those that match.

use std::time::Instant;

use kolo_core::dtype::as_bytes_mut;
use kolo_core::{Element, Error, Message, RecvError, Result, Tag, TagSpace};

use crate::communicator::Communicator;

const RECV: &str = "recv";

/// The rank a receive takes its message from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Source {
    /// This rank of the communicator.
    Rank(usize),
    /// Whichever rank's message arrived first (MPI's `MPI_ANY_SOURCE`; this rank's own included).
    Any,
}

/// The tag a receive matches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TagMatch {
    /// Messages sent with this tag.
    Value(u64),
    /// Messages with any tag (MPI's `MPI_ANY_TAG`).
    Any,
}

/// What a receive matched (MPI's `MPI_Status`): the sender, the message's tag and its length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Status {
    /// The sender's rank in the communicator.
    pub source: usize,
    /// The tag the message was sent with.
    pub tag: u64,
    /// Elements received.
    pub count: usize,
}

impl Communicator {
    /// Receives the first message that matches `src` and `tag` into the start of `buf` (MPI's
    /// receive: the message may be shorter than `buf`, whose rest is left as it was; a longer one is
    /// an [`Error::InvalidArgument`], MPI's `ERR_TRUNCATE`, and is consumed) and says where it came
    /// from. Waits up to the communicator's timeout.
    ///
    /// ```
    /// use kolo::{Source, TagMatch};
    /// let results = kolo::run_local(2, kolo::Config::default(), |comm| {
    ///     if comm.rank() == 1 {
    ///         comm.send(&[5i32, 6], 0, 9)?;
    ///         return comm.send(&[7i32], 0, 3);
    ///     }
    ///     let mut buf = [0i32; 4];
    ///     let first = comm.recv_matching(&mut buf, Source::Any, TagMatch::Any)?;
    ///     assert_eq!((first.source, first.tag, first.count), (1, 9, 2));
    ///     let second = comm.recv_matching(&mut buf, Source::Rank(1), TagMatch::Any)?;
    ///     assert_eq!((second.tag, second.count, buf), (3, 1, [7, 6, 0, 0]));
    ///     Ok(())
    /// });
    /// assert!(results.iter().all(|r| matches!(r, Ok(Ok(())))));
    /// ```
    pub fn recv_matching<T: Element>(
        &self,
        buf: &mut [T],
        src: Source,
        tag: TagMatch,
    ) -> Result<Status> {
        let (source, msg) = self.take_matching(src, tag)?;
        let tag = msg.header.tag.value;
        let count = self.fill::<T>(as_bytes_mut(buf), source, tag, msg)?;
        Ok(Status { source, tag, count })
    }

    /// [`Communicator::recv_matching`] of a message that has arrived already: `None` at once if
    /// none has.
    pub fn try_recv_matching<T: Element>(
        &self,
        buf: &mut [T],
        src: Source,
        tag: TagMatch,
    ) -> Result<Option<Status>> {
        let Some((source, msg)) = self.try_take_matching(src, tag)? else {
            return Ok(None);
        };
        let tag = msg.header.tag.value;
        let count = self.fill::<T>(as_bytes_mut(buf), source, tag, msg)?;
        Ok(Some(Status { source, tag, count }))
    }

    /// Receives the first message that matches `src` and `tag`, of any length: what it matched and
    /// its elements.
    pub fn recv_vec_matching<T: Element>(
        &self,
        src: Source,
        tag: TagMatch,
    ) -> Result<(Status, Vec<T>)> {
        let (source, msg) = self.take_matching(src, tag)?;
        self.unpack(source, msg)
    }

    /// [`Communicator::recv_vec_matching`] of a message that has arrived already: `None` at once
    /// if none has.
    pub fn try_recv_vec_matching<T: Element>(
        &self,
        src: Source,
        tag: TagMatch,
    ) -> Result<Option<(Status, Vec<T>)>> {
        self.try_take_matching(src, tag)?
            .map(|(source, msg)| self.unpack(source, msg))
            .transpose()
    }

    fn unpack<T: Element>(&self, source: usize, msg: Message) -> Result<(Status, Vec<T>)> {
        let tag = msg.header.tag.value;
        let v: Vec<T> = self.check_message(source, msg, None)?;
        let count = v.len();
        Ok((Status { source, tag, count }, v))
    }

    /// The transport ranks a receive from `src` listens to, and the tag (a pattern for any tag).
    fn pattern(&self, src: Source, tag: TagMatch) -> Result<(Vec<usize>, Tag)> {
        self.inner.check()?;
        let value = match tag {
            TagMatch::Value(Tag::ANY_VALUE) | TagMatch::Any => Tag::ANY_VALUE,
            TagMatch::Value(v) => v,
        };
        let peers = match src {
            Source::Any => self.inner.members.clone(),
            Source::Rank(r) => match self.inner.members.get(r) {
                Some(&m) => vec![m],
                None => {
                    return Err(Error::RankOutOfRange {
                        op: RECV,
                        rank: self.rank(),
                        arg: "src",
                        value: r,
                        size: self.size(),
                    })
                }
            },
        };
        let tag = Tag {
            group: self.inner.group,
            space: TagSpace::P2p,
            value,
        };
        Ok((peers, tag))
    }

    /// The group rank of transport rank `from`.
    fn group_rank(&self, from: usize) -> Result<usize> {
        self.inner
            .members
            .iter()
            .position(|&m| m == from)
            .ok_or_else(|| Error::Protocol {
                rank: self.rank(),
                peer: from,
                reason: "the transport handed over a message from a rank outside the group".into(),
            })
    }

    fn take_matching(&self, src: Source, tag: TagMatch) -> Result<(usize, Message)> {
        let (peers, pattern) = self.pattern(src, tag)?;
        let started = Instant::now();
        let deadline = Some(started + self.inner.config.timeout);
        let (from, msg) = self
            .inner
            .transport
            .recv_any(&peers, &pattern, deadline)
            .map_err(|e| match (e, src) {
                (RecvError::Timeout, Source::Rank(peer)) => Error::Timeout {
                    op: RECV,
                    rank: self.rank(),
                    peer,
                    waited: started.elapsed(),
                },
                (RecvError::Timeout, Source::Any) => Error::TimeoutAnySource {
                    op: RECV,
                    rank: self.rank(),
                    tag: pattern.value,
                    waited: started.elapsed(),
                },
                (RecvError::Link(f), _) => f.into_error(RECV, self.rank()),
            })?;
        Ok((self.group_rank(from)?, msg))
    }

    fn try_take_matching(&self, src: Source, tag: TagMatch) -> Result<Option<(usize, Message)>> {
        let (peers, pattern) = self.pattern(src, tag)?;
        match self.inner.transport.try_recv_any(&peers, &pattern) {
            Ok(Some((from, msg))) => Ok(Some((self.group_rank(from)?, msg))),
            Ok(None) => Ok(None),
            Err(f) => Err(f.into_error(RECV, self.rank())),
        }
    }
}
