//! # kolo-transport
//!
//! Implementations of [`kolo_core::Transport`], one module per flavor:
//!
//! - [`local`]: ranks are threads of one process; a send is a copy into the peer's mailbox.
//! - [`shm`]: ranks are processes of one host sharing a memory segment: a ring per pair of ranks,
//!   and an arena for collectives that read their peers' buffers in place.
//! - [`tcp`]: one TCP connection per pair of ranks, found through the rendezvous store; usable across
//!   hosts.
//! - [`hybrid`]: shared memory to the ranks of this host, TCP to the others.
//!
//! ```
//! use kolo_core::{Algorithm, Call, Header, OpKind, Tag, TagSpace, Transport};
//!
//! // Two ranks in one process; rank 0 sends, rank 1 receives (the TCP and shared-memory
//! // transports are used the same way, one rank per process).
//! let world = kolo_transport::local_world(2);
//! let tag = Tag { group: 0, space: TagSpace::P2p, value: 7 };
//! let header = Header { ack: false, tag, call: Call::new(OpKind::Send, Algorithm::Direct) };
//! world[0].send(1, &header, b"hello").map_err(|f| f.into_error("send", 0))?;
//! let message = world[1].recv(0, &tag, None).map_err(|e| format!("{e:?}"))?;
//! assert_eq!(message.payload, b"hello");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![warn(missing_docs)]

#[doc(hidden)]
pub mod fuzzing;
pub mod hybrid;

/// The error for a failed set-up step, with its context.
pub(crate) fn io_err(context: String) -> impl FnOnce(std::io::Error) -> kolo_core::Error {
    move |source| kolo_core::Error::io(context, source)
}

/// Checks a rank given to a transport's set-up.
pub(crate) fn check_rank(
    op: &'static str,
    rank: usize,
    size: usize,
) -> Result<(), kolo_core::Error> {
    if rank >= size {
        return Err(kolo_core::Error::RankOutOfRange {
            op,
            rank,
            arg: "rank",
            value: rank,
            size,
        });
    }
    Ok(())
}

pub mod local;
mod pool;
pub mod shm;
pub mod tcp;

pub use hybrid::HybridTransport;
pub use local::{local_world, LocalTransport};
pub use shm::{shm_world, ShmOptions, ShmTransport};
pub use tcp::{TcpOptions, TcpTransport};
