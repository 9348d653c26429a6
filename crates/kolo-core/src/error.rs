//! kolo's error type.
//!
//! Every error names the rank that saw it and, where there is one, the peer and the operation. Errors
//! from a collective poison the communicator: later calls return [`Error::Failed`] with the first error,
//! and the peers are told (so that they fail too instead of waiting).

use std::io;
use std::sync::Arc;
use std::time::Duration;

use crate::call::{Call, Tag};
use crate::DType;

/// Result with kolo's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in kolo's communication layer.
#[derive(Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A root, peer or member rank outside the group.
    #[error("{op} on rank {rank}: {arg} = {value} is out of range for a group of {size} ranks")]
    RankOutOfRange {
        /// Operation.
        op: &'static str,
        /// Rank that made the call.
        rank: usize,
        /// Argument name (`root`, `dest`, ...).
        arg: &'static str,
        /// The value passed.
        value: usize,
        /// Group size.
        size: usize,
    },

    /// A buffer of the wrong length for the call on this rank. Its lengths are counted in
    /// elements of `dtype`, and said in bytes for [`DType::U8`] (what kolo.MPI and byte buffers
    /// move).
    #[error(
        "{op} on rank {rank}: buffer `{arg}` has {actual} {unit}, expected {expected}",
        unit = if *.dtype == DType::U8 { "bytes" } else { "elements" }
    )]
    BufferLength {
        /// Operation.
        op: &'static str,
        /// Rank that made the call.
        rank: usize,
        /// Argument name.
        arg: &'static str,
        /// Element type of the buffer.
        dtype: DType,
        /// Elements required.
        expected: usize,
        /// Elements passed.
        actual: usize,
    },

    /// Any other invalid argument.
    #[error("{op} on rank {rank}: invalid argument `{arg}`: {reason}")]
    InvalidArgument {
        /// Operation.
        op: &'static str,
        /// Rank that made the call.
        rank: usize,
        /// Argument name.
        arg: &'static str,
        /// What is wrong with it.
        reason: String,
    },

    /// Two ranks are in different calls at the same point of their sequence (different operation,
    /// element type, count, root, reduce operator or algorithm).
    #[error("{}", mismatch(*.rank, *.peer, .local, .remote, .tag))]
    Mismatch {
        /// Rank that noticed.
        rank: usize,
        /// Rank whose message disagreed.
        peer: usize,
        /// This rank's call.
        local: Call,
        /// The peer's call.
        remote: Call,
        /// Where in the sequence.
        tag: Tag,
    },

    /// A message whose size differs from what the receive expects.
    #[error(
        "{op} on rank {rank}: message from rank {peer} has {actual} bytes, expected {expected}"
    )]
    MessageLength {
        /// Operation.
        op: &'static str,
        /// Receiving rank.
        rank: usize,
        /// Sending rank.
        peer: usize,
        /// Bytes expected.
        expected: usize,
        /// Bytes received.
        actual: usize,
    },

    /// Nothing arrived from a peer before the deadline.
    #[error(
        "{op} on rank {rank}: timed out after {waited:.1?} waiting for rank {peer} (it is late, \
         stopped, or in a different call; raise the communicator's timeout (KOLO_TIMEOUT, or the \
         group's) if it is only slow)"
    )]
    Timeout {
        /// Operation.
        op: &'static str,
        /// Waiting rank.
        rank: usize,
        /// Rank waited for.
        peer: usize,
        /// How long it waited.
        waited: Duration,
    },

    /// A receive from any rank: no message came before the deadline.
    #[error(
        "{op} on rank {rank}: timed out after {waited:.1?} waiting for a message with {what} \
         from any rank (raise the communicator's timeout (KOLO_TIMEOUT, or the group's) if the \
         sender is only slow)",
        what = tag_words(*.tag)
    )]
    TimeoutAnySource {
        /// Operation.
        op: &'static str,
        /// Waiting rank.
        rank: usize,
        /// The receive's tag (`Tag::ANY_VALUE`: any tag).
        tag: u64,
        /// How long it waited.
        waited: Duration,
    },

    /// `monitored_barrier`: some ranks did not arrive in time. The message says so as Gloo's does
    /// (which tools and tests match), rank 0 naming the missing ranks, the others rank 0's report.
    #[error("monitored_barrier on rank {rank}: {}", barrier_timeout(*rank, missing, *waited))]
    BarrierTimeout {
        /// Rank reporting.
        rank: usize,
        /// Ranks that did not arrive, in order.
        missing: Vec<usize>,
        /// The barrier's timeout.
        waited: Duration,
    },

    /// The connection to a peer broke (the peer died or the network failed).
    #[error("{op} on rank {rank}: lost connection to rank {peer}: {reason}")]
    PeerLost {
        /// Operation that noticed.
        op: &'static str,
        /// Rank that noticed.
        rank: usize,
        /// Lost rank.
        peer: usize,
        /// What the transport saw.
        reason: String,
    },

    /// A peer shut its communicator down cleanly and will send nothing more.
    #[error("{op} on rank {rank}: rank {peer} has closed its communicator")]
    PeerClosed {
        /// Operation.
        op: &'static str,
        /// Rank that noticed.
        rank: usize,
        /// Closed rank.
        peer: usize,
    },

    /// Another rank failed and aborted the communicator.
    #[error("{}", aborted(.op, *.rank, *.by, .reason))]
    Aborted {
        /// Operation.
        op: &'static str,
        /// Rank that noticed.
        rank: usize,
        /// Rank that aborted.
        by: usize,
        /// The kind of the aborting rank's error ([`Error::kind`] of it).
        kind: crate::ErrorKind,
        /// The aborting rank's error.
        reason: String,
    },

    /// A peer sent bytes that are not a valid kolo frame.
    #[error("rank {rank}: protocol error on the link to rank {peer}: {reason}")]
    Protocol {
        /// Receiving rank.
        rank: usize,
        /// Sending rank.
        peer: usize,
        /// What was wrong.
        reason: String,
    },

    /// The communicator failed earlier; this is the first error, returned by every later call.
    #[error("rank {rank}: communicator failed earlier: {first}")]
    Failed {
        /// Rank.
        rank: usize,
        /// The first error.
        first: Arc<Error>,
    },

    /// An operating-system I/O error.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The OS error (shared, so that the error can be cloned).
        #[source]
        source: Arc<io::Error>,
    },

    /// The rendezvous store failed. The source is the store's own error (`kolo_store::StoreError`,
    /// which converts into this variant); reach it with `downcast_ref`.
    #[error("rendezvous store: {0}")]
    Store(#[source] Arc<dyn std::error::Error + Send + Sync>),

    /// An environment variable or init option is missing or malformed.
    #[error("init: {var} = {value:?}: {reason}")]
    Config {
        /// Variable or option name.
        var: String,
        /// Its value.
        value: String,
        /// What is wrong with it.
        reason: String,
    },

    /// An object could not be serialized or deserialized.
    #[error("{op} on rank {rank}: object (de)serialization failed: {reason}")]
    Serialize {
        /// Operation.
        op: &'static str,
        /// Rank.
        rank: usize,
        /// Serializer message.
        reason: String,
    },

    /// The request needs something this build or transport does not have.
    #[error("unsupported: {what}")]
    Unsupported {
        /// What was asked for.
        what: String,
    },

    /// Not every rank entered a collective before the timeout, and the engine running it cannot say
    /// which rank is missing (MPI's collectives do not).
    #[error(
        "{op} on rank {rank}: not every rank entered {call} within {waited:.1?} (a rank is late, \
         stopped, or in a different call or point-to-point operation; raise the communicator's \
         timeout (KOLO_TIMEOUT, or the group's) if it is only slow)"
    )]
    Stalled {
        /// Operation.
        op: &'static str,
        /// Rank that waited.
        rank: usize,
        /// The call it waited in.
        call: Call,
        /// How long it waited.
        waited: std::time::Duration,
    },

    /// An operation panicked inside kolo (a bug): the communicator is failed and its peers are
    /// told, instead of the panic leaving them waiting.
    #[error(
        "{op} on rank {rank}: kolo panicked ({message}); this is a bug in kolo, please report it"
    )]
    Panicked {
        /// Operation.
        op: &'static str,
        /// Rank that panicked.
        rank: usize,
        /// The panic's message.
        message: String,
    },

    /// A collective engine (MPI) reported an error.
    #[error("{op} on rank {rank}: {backend} error: {reason}")]
    Backend {
        /// Operation.
        op: &'static str,
        /// Rank that saw it.
        rank: usize,
        /// The engine (`mpi`).
        backend: &'static str,
        /// The engine's message.
        reason: String,
    },

    /// A worker asked to join a fault-tolerant world whose members have all left: the job is
    /// over (a worker restarted as the others finished), or every member died.
    #[error(
        "fault-tolerant world: every member of generation {generation} has left or died, so there \
         is nothing to join (the job is over)"
    )]
    JobOver {
        /// The last generation.
        generation: u64,
    },

    /// A fault-tolerant world cannot go on: fewer live workers than its floor, this worker left
    /// out of the membership the others agreed, or no agreement within the time allowed.
    #[error("fault-tolerant world, generation {generation}: {reason}")]
    Membership {
        /// The generation (membership) that could not be formed.
        generation: u64,
        /// What happened and what to do.
        reason: String,
    },
}

/// The text of [`Error::Aborted`]: "allreduce on rank 1: aborted by rank 0: <reason>" on the
/// other ranks; on the rank that aborted, "rank 0 aborted: <reason>" (not "abort on rank 0:
/// aborted by rank 0").
fn aborted(op: &str, rank: usize, by: usize, reason: &str) -> String {
    if op == "abort" && rank == by {
        format!("rank {rank} aborted: {reason}")
    } else {
        format!("{op} on rank {rank}: aborted by rank {by}: {reason}")
    }
}

/// A mismatch in words: two collectives, or a receive and the message a send delivered to it.
fn mismatch(rank: usize, peer: usize, local: &Call, remote: &Call, tag: &Tag) -> String {
    if tag.space != crate::call::TagSpace::P2p {
        return format!(
            "collective mismatch: rank {rank} called {local} but rank {peer} called {remote} ({tag})"
        );
    }
    let what = |c: &Call| match c.dtype {
        Some(d) => format!("{d} x {}", c.count),
        None => format!("{} x {}", c.op, c.count),
    };
    format!(
        "point-to-point mismatch: rank {rank} called recv({}) from rank {peer}, but rank {peer} \
         sent {} ({tag})",
        what(local),
        what(remote)
    )
}

/// What [`Error::BarrierTimeout`] says after "monitored_barrier on rank N: ".
fn barrier_timeout(rank: usize, missing: &[usize], waited: Duration) -> String {
    let ms = waited.as_millis();
    let list = missing
        .iter()
        .map(|r| r.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let failed = match missing {
        [one] => format!("Rank {one} failed to pass monitoredBarrier in {ms} ms"),
        _ => format!("Ranks {list} failed to pass monitoredBarrier in {ms} ms"),
    };
    if rank != 0 {
        format!(
            "Rank {rank} successfully reached monitoredBarrier, but received errors while \
             waiting for send/recv from rank 0: {failed}"
        )
    } else if waited.is_zero() {
        format!(
            "Rank 0 timed out in monitoredBarrier after 0 ms (a timeout of 0 passes only the \
             ranks already there); rank(s) {list} had not arrived"
        )
    } else {
        format!("{failed} (late, stopped, or in a different call)")
    }
}

impl Error {
    /// The first error behind [`Error::Failed`] wrappers.
    pub fn root_cause(&self) -> &Error {
        match self {
            Error::Failed { first, .. } => first.root_cause(),
            e => e,
        }
    }

    /// Builds an [`Error::Io`].
    pub fn io(context: impl Into<String>, source: io::Error) -> Error {
        Error::Io {
            context: context.into(),
            source: Arc::new(source),
        }
    }

    /// Builds an [`Error::Store`] from the store's error.
    pub fn store(source: impl std::error::Error + Send + Sync + 'static) -> Error {
        Error::Store(Arc::new(source))
    }
}

/// Why a link (the transport's view of the connection to peers) cannot deliver any more.
///
/// Stored by transports when a link fails and turned into an [`Error`] naming the operation that
/// noticed it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LinkFailure {
    /// The connection to `peer` broke.
    PeerLost {
        /// Lost peer.
        peer: usize,
        /// What was seen.
        reason: String,
    },
    /// `peer` closed cleanly.
    PeerClosed {
        /// Closed peer.
        peer: usize,
    },
    /// Rank `by` aborted the job.
    Aborted {
        /// Aborting rank.
        by: usize,
        /// Its error, with the error's kind in front ([`crate::error_kind::encode_abort`]).
        reason: String,
    },
    /// `peer` sent an invalid frame.
    Protocol {
        /// Offending peer.
        peer: usize,
        /// What was wrong.
        reason: String,
    },
    /// A message of the collective this rank is in came from a different call.
    Mismatch {
        /// The sender.
        peer: usize,
        /// This rank's call.
        local: Call,
        /// The sender's call.
        remote: Call,
        /// The collective's tag.
        tag: Tag,
    },
    /// This rank closed or aborted its own endpoint.
    LocalClosed {
        /// Why.
        reason: String,
    },
}

impl LinkFailure {
    /// The error an operation `op` on `rank` reports for this failure.
    pub fn into_error(self, op: &'static str, rank: usize) -> Error {
        match self {
            LinkFailure::PeerLost { peer, reason } => Error::PeerLost {
                op,
                rank,
                peer,
                reason,
            },
            LinkFailure::PeerClosed { peer } => Error::PeerClosed { op, rank, peer },
            LinkFailure::Aborted { by, reason } => {
                let (kind, reason) = crate::error_kind::decode_abort(&reason);
                Error::Aborted {
                    op,
                    rank,
                    by,
                    kind,
                    reason,
                }
            }
            LinkFailure::Protocol { peer, reason } => Error::Protocol { rank, peer, reason },
            LinkFailure::Mismatch {
                peer,
                local,
                remote,
                tag,
            } => Error::Mismatch {
                rank,
                peer,
                local,
                remote,
                tag,
            },
            LinkFailure::LocalClosed { reason } => {
                let (kind, reason) = crate::error_kind::decode_abort(&reason);
                Error::Aborted {
                    op,
                    rank,
                    by: rank,
                    kind,
                    reason,
                }
            }
        }
    }
}

/// Why a receive returned without a message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecvError {
    /// The deadline passed.
    Timeout,
    /// The link failed.
    Link(LinkFailure),
}

/// A receive's tag in words: "tag 7", or "any tag" for [`Tag::ANY_VALUE`](crate::Tag::ANY_VALUE).
fn tag_words(tag: u64) -> String {
    if tag == crate::Tag::ANY_VALUE {
        "any tag".into()
    } else {
        format!("tag {tag}")
    }
}

/// The message, as `Display` writes it, not the fields: a `main` returning this error prints it so,
/// and the message is what names the rank, the call and what to do.
impl std::fmt::Debug for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::call::{Algorithm, OpKind};

    /// Torch's distributed tests (written for Gloo) match a timed-out call's error against
    /// `" (Timed out|closed|timeout) "` and a monitored barrier's against Gloo's sentences.
    #[test]
    fn timeouts_say_so_as_torch_expects() {
        let waited = Duration::from_millis(1500);
        let timeouts = [
            Error::Timeout {
                op: "barrier",
                rank: 0,
                peer: 1,
                waited,
            },
            Error::TimeoutAnySource {
                op: "recv",
                rank: 0,
                tag: 3,
                waited,
            },
            Error::Stalled {
                op: "barrier",
                rank: 0,
                call: Call::new(OpKind::Barrier, Algorithm::Direct),
                waited,
            },
        ];
        for e in &timeouts {
            let text = e.to_string();
            assert!(text.contains(" timeout "), "{text}");
            assert!(
                text.contains("on rank 0") && text.contains("1.5s"),
                "{text}"
            );
            assert_eq!(e.kind(), crate::ErrorKind::Timeout);
        }
        let barrier = |rank, missing: &[usize], ms| {
            Error::BarrierTimeout {
                rank,
                missing: missing.to_vec(),
                waited: Duration::from_millis(ms),
            }
            .to_string()
        };
        assert!(
            barrier(0, &[1], 2000).contains(": Rank 1 failed to pass monitoredBarrier in 2000 ms")
        );
        assert!(barrier(0, &[1, 3], 20)
            .contains(": Ranks 1, 3 failed to pass monitoredBarrier in 20 ms"));
        assert!(barrier(2, &[1], 20).contains(
            ": Rank 2 successfully reached monitoredBarrier, but received errors while waiting for \
             send/recv from rank 0: Rank 1 failed to pass monitoredBarrier in 20 ms"
        ));
        assert!(barrier(0, &[1], 0).contains(": Rank 0 timed out in monitoredBarrier after 0 ms"));
    }
}
