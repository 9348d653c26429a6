//! [`ErrorKind`]: what kind of failure an [`Error`] is, carried across ranks by an abort, so that a
//! peer that fails because another rank aborted knows what the first error was (a mismatch, a
//! timeout, a lost peer) without reading its message.
//!
//! An abort travels as its reason text on every transport; [`encode_abort`] puts the kind in front
//! of it as a field of its own (a short code and the ASCII unit separator, which no message
//! contains), and [`decode_abort`] takes it off again where the abort becomes an error.

use crate::Error;

/// The kind of a failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// Ranks called different collectives ([`Error::Mismatch`]).
    Mismatch,
    /// A peer did not answer in time ([`Error::Timeout`], [`Error::Stalled`],
    /// [`Error::BarrierTimeout`]).
    Timeout,
    /// A peer died or closed ([`Error::PeerLost`], [`Error::PeerClosed`]).
    PeerLost,
    /// A bad argument ([`Error::RankOutOfRange`], [`Error::BufferLength`],
    /// [`Error::InvalidArgument`], [`Error::MessageLength`], [`Error::Config`]).
    InvalidArgument,
    /// A peer broke the protocol ([`Error::Protocol`]).
    Protocol,
    /// A collective engine failed ([`Error::Backend`]).
    Backend,
    /// Something kolo does not do ([`Error::Unsupported`]).
    Unsupported,
    /// Anything else: I/O, the store, serialization, a user's abort, a panic inside kolo.
    Other,
}

const CODES: &[(ErrorKind, &str)] = &[
    (ErrorKind::Mismatch, "mismatch"),
    (ErrorKind::Timeout, "timeout"),
    (ErrorKind::PeerLost, "peer-lost"),
    (ErrorKind::InvalidArgument, "invalid-argument"),
    (ErrorKind::Protocol, "protocol"),
    (ErrorKind::Backend, "backend"),
    (ErrorKind::Unsupported, "unsupported"),
    (ErrorKind::Other, "other"),
];

/// What separates the kind's code from the reason.
const SEPARATOR: char = '\u{1f}';

impl ErrorKind {
    /// The kind's short name (`mismatch`, `timeout`, `peer-lost`, ...).
    pub fn code(self) -> &'static str {
        CODES
            .iter()
            .find(|(k, _)| *k == self)
            .map_or("other", |(_, c)| c)
    }

    /// The kind named `code`.
    pub fn from_code(code: &str) -> Option<ErrorKind> {
        CODES.iter().find(|(_, c)| *c == code).map(|(k, _)| *k)
    }
}

impl Error {
    /// What kind of failure this is; an abort's is the kind of the aborting rank's error, a
    /// failed communicator's that of its first error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Mismatch { .. } => ErrorKind::Mismatch,
            Error::Timeout { .. }
            | Error::TimeoutAnySource { .. }
            | Error::Stalled { .. }
            | Error::BarrierTimeout { .. } => ErrorKind::Timeout,
            Error::PeerLost { .. } | Error::PeerClosed { .. } => ErrorKind::PeerLost,
            Error::RankOutOfRange { .. }
            | Error::BufferLength { .. }
            | Error::InvalidArgument { .. }
            | Error::MessageLength { .. }
            | Error::Config { .. } => ErrorKind::InvalidArgument,
            Error::Protocol { .. } => ErrorKind::Protocol,
            Error::Backend { .. } => ErrorKind::Backend,
            Error::Unsupported { .. } => ErrorKind::Unsupported,
            Error::Aborted { kind, .. } => *kind,
            Error::Failed { first, .. } => first.kind(),
            Error::Io { .. }
            | Error::Store(_)
            | Error::Serialize { .. }
            | Error::Membership { .. }
            | Error::Panicked { .. }
            | Error::JobOver { .. } => ErrorKind::Other,
        }
    }
}

impl crate::LinkFailure {
    /// The reason a rank sends on when it leaves with this failure (the error `op` on `rank`
    /// reports for it, with its kind): the peers' errors are then of the same kind.
    pub fn forwarded(self, op: &'static str, rank: usize) -> String {
        let e = self.into_error(op, rank);
        encode_abort(e.kind(), &e.to_string())
    }
}

/// The reason an abort sends: `reason` with `kind` in front.
pub fn encode_abort(kind: ErrorKind, reason: &str) -> String {
    format!("{}{SEPARATOR}{reason}", kind.code())
}

/// The kind and the reason of an abort's text ([`ErrorKind::Other`] and the whole text where it
/// has no kind).
pub fn decode_abort(text: &str) -> (ErrorKind, String) {
    match text.split_once(SEPARATOR) {
        Some((code, reason)) => match ErrorKind::from_code(code) {
            Some(kind) => (kind, reason.to_owned()),
            None => (ErrorKind::Other, text.to_owned()),
        },
        None => (ErrorKind::Other, text.to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LinkFailure;

    #[test]
    fn an_abort_carries_its_kind_to_the_peers_error() {
        for &(kind, _) in CODES {
            let text = encode_abort(kind, "all_reduce on rank 1: something: with colons");
            assert_eq!(
                decode_abort(&text),
                (kind, "all_reduce on rank 1: something: with colons".into())
            );
            let e = LinkFailure::Aborted {
                by: 1,
                reason: text,
            }
            .into_error("barrier", 0);
            assert_eq!(e.kind(), kind);
            assert_eq!(
                e.to_string(),
                "barrier on rank 0: aborted by rank 1: all_reduce on rank 1: something: with colons"
            );
        }
        // The rank that aborted says so once, not "abort on rank 0: aborted by rank 0".
        let own = Error::Aborted {
            op: "abort",
            rank: 0,
            by: 0,
            kind: ErrorKind::Other,
            reason: "allreduce: an empty list".into(),
        };
        assert_eq!(own.to_string(), "rank 0 aborted: allreduce: an empty list");
        // A reason without a kind (an older peer, a user's abort) is kept whole.
        assert_eq!(decode_abort("stop"), (ErrorKind::Other, "stop".into()));
        assert_eq!(
            decode_abort("nonsense\u{1f}x"),
            (ErrorKind::Other, "nonsense\u{1f}x".into())
        );
        let first = Error::Timeout {
            op: "barrier",
            rank: 0,
            peer: 1,
            waited: std::time::Duration::from_secs(1),
        };
        let failed = Error::Failed {
            rank: 0,
            first: std::sync::Arc::new(first),
        };
        assert_eq!(failed.kind(), ErrorKind::Timeout);
    }
}
