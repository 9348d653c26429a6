//! # kolo-core
//!
//! The vocabulary shared by every kolo crate: the [`Error`] type, element types ([`DType`],
//! [`Element`]), reduce operators and kernels ([`ReduceOp`], [`Reducer`]), message tags and call
//! fingerprints ([`Tag`], [`Call`], [`Header`]) and the [`Transport`] trait with its [`Mailbox`].
//!
//! Most users depend on the `kolo` crate, which re-exports what they need.

pub mod arena;
pub mod call;
pub mod device;
pub mod dtype;
pub mod engine;
pub mod error;
pub mod error_kind;
pub mod gpu;
pub mod host;
pub mod mailbox;
pub mod reduce;
pub mod settings;
pub mod transport;

pub use arena::Arena;
pub use call::{Algorithm, Call, Header, OpKind, Tag, TagSpace, HEADER_LEN};
pub use device::{DeviceBuffer, DeviceCollectives, DeviceTicket};
pub use dtype::{DType, Element};
pub use engine::{disagreement, Engine};
pub use error::{Error, LinkFailure, RecvError, Result};
pub use error_kind::ErrorKind;
pub use mailbox::Mailbox;
pub use reduce::{ReduceOp, Reducer};
pub use transport::{poll_until, recv_each, segment_ranges, Message, Received, Transport};
