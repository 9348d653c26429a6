//! kolo's errors as Python exceptions: one class per kind of failure, each carrying the rank,
//! the operation and (where one is to blame) the peer as attributes.

use kolo::Error;
use pyo3::create_exception;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

create_exception!(
    kolo,
    KoloError,
    PyRuntimeError,
    "A kolo operation failed; `rank`, `op` and `peer` say where, when known."
);
create_exception!(
    kolo,
    MismatchError,
    KoloError,
    "The ranks called different collectives (operation, element type, count or root): the \
     message names the rank that disagreed and both calls."
);
create_exception!(
    kolo,
    PeerError,
    KoloError,
    "A peer died, closed its communicator, aborted the job or broke the protocol: `peer` names it."
);
create_exception!(
    kolo,
    KoloTimeoutError,
    KoloError,
    "A peer did not answer within the communicator's timeout (KOLO_TIMEOUT): `peer` names it."
);
create_exception!(
    kolo,
    ArgumentError,
    PyValueError,
    "An argument kolo cannot use: a rank out of range, a buffer of the wrong length."
);

/// Adds the exception classes to the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("KoloError", py.get_type::<KoloError>())?;
    m.add("MismatchError", py.get_type::<MismatchError>())?;
    m.add("PeerError", py.get_type::<PeerError>())?;
    m.add("KoloTimeoutError", py.get_type::<KoloTimeoutError>())?;
    m.add("ArgumentError", py.get_type::<ArgumentError>())?;
    Ok(())
}

/// The Python exception for a kolo error.
pub(crate) fn to_py(e: Error) -> PyErr {
    let msg = e.to_string();
    let (err, rank, op, peer) = match &e {
        Error::RankOutOfRange { op, rank, .. }
        | Error::BufferLength { op, rank, .. }
        | Error::InvalidArgument { op, rank, .. }
        | Error::MessageLength { op, rank, .. } => (
            ArgumentError::new_err(msg),
            Some(*rank),
            Some(op.to_string()),
            None,
        ),
        Error::Mismatch {
            rank, peer, local, ..
        } => (
            MismatchError::new_err(msg),
            Some(*rank),
            Some(local.to_string()),
            Some(*peer),
        ),
        Error::Timeout { op, rank, peer, .. } => (
            KoloTimeoutError::new_err(msg),
            Some(*rank),
            Some(op.to_string()),
            Some(*peer),
        ),
        Error::BarrierTimeout { rank, missing, .. } => (
            KoloTimeoutError::new_err(msg),
            Some(*rank),
            Some("monitored_barrier".to_string()),
            missing.first().copied(),
        ),
        Error::Stalled { op, rank, .. } | Error::TimeoutAnySource { op, rank, .. } => (
            KoloTimeoutError::new_err(msg),
            Some(*rank),
            Some(op.to_string()),
            None,
        ),
        Error::PeerLost { op, rank, peer, .. } | Error::PeerClosed { op, rank, peer } => (
            PeerError::new_err(msg),
            Some(*rank),
            Some(op.to_string()),
            Some(*peer),
        ),
        // A peer that saw a mismatch aborts the others with it: theirs is a mismatch too (the
        // abort carries the first error's kind).
        Error::Aborted {
            op,
            rank,
            by,
            kind: kolo::ErrorKind::Mismatch,
            ..
        } => (
            MismatchError::new_err(msg),
            Some(*rank),
            Some(op.to_string()),
            Some(*by),
        ),
        Error::Aborted { op, rank, by, .. } => (
            PeerError::new_err(msg),
            Some(*rank),
            Some(op.to_string()),
            Some(*by),
        ),
        Error::Protocol { rank, peer, .. } => {
            (PeerError::new_err(msg), Some(*rank), None, Some(*peer))
        }
        _ => (KoloError::new_err(msg), None, None, None),
    };
    Python::attach(|py| {
        let value = err.value(py);
        // Attributes are a convenience: failing to set one leaves the message, which has all.
        let _ = value.setattr("rank", rank);
        let _ = value.setattr("op", op);
        let _ = value.setattr("peer", peer);
    });
    err
}
