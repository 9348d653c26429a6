//! # kolo-transport
//!
//! Implementations of [`kolo_core::Transport`], one module per flavor:
//!
//! - [`local`]: ranks are threads of one process; a send is a copy into the peer's mailbox.
//! - [`tcp`]: one TCP connection per pair of ranks, found through the rendezvous store; usable across
//!   hosts.

pub mod local;
pub mod tcp;

pub use local::{local_world, LocalTransport};
pub use tcp::{TcpOptions, TcpTransport};
