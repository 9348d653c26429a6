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

pub mod hybrid;
pub mod local;
pub mod shm;
pub mod tcp;

pub use hybrid::HybridTransport;
pub use local::{local_world, LocalTransport};
pub use shm::{shm_world, ShmOptions, ShmTransport};
pub use tcp::{TcpOptions, TcpTransport};
