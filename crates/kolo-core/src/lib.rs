//! # kolo-core
//!
//! The vocabulary shared by every kolo crate: the [`Error`] type, element types ([`DType`],
//! [`Element`]), reduce operators and kernels ([`ReduceOp`], [`Reducer`]), message tags and call
//! fingerprints ([`Tag`], [`Call`], [`Header`]) and the [`Transport`] trait with its [`Mailbox`].
//!
//! Most users depend on the `kolo` crate, which re-exports what they need.
//!
//! ```
//! use kolo_core::{DType, ReduceOp, Reducer};
//!
//! // Two ranks' contributions, as the bytes a transport carries; averaged as an all-reduce does.
//! let bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
//! let (mut acc, other) = (bytes(&[1.0, 5.0]), bytes(&[3.0, 2.0]));
//! let avg = Reducer::new(DType::F32, ReduceOp::Avg);
//! avg.apply(&mut acc, &other); // combined element-wise (summed, for an average)
//! avg.finish(&mut acc, 2); // then divided by the number of ranks
//! assert_eq!(acc, bytes(&[2.0, 3.5]));
//! ```
#![warn(missing_docs)]

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
