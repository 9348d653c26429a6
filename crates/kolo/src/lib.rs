//! # kolo
//!
//! Distributed data-parallel training for Rust — what `torch.distributed`, Horovod and MPI are to
//! Python. This crate is what programs depend on: [`init`] gives the process its [`Communicator`],
//! which has point-to-point messages and every MPI-style collective over threads ([`run_local`]),
//! shared memory or TCP (processes started by `kolo run`, torchrun, `mpirun` or `srun`), or over an
//! installed MPI library (the `mpi` feature; [`init_mpi`]), or on NVIDIA GPUs through NCCL (the
//! `nccl` feature; [`init_nccl`]).
//!
//! ```
//! use kolo::prelude::*;
//!
//! // Four ranks as threads of this process; with `kolo run -n 4` use `kolo::init()` instead.
//! let results = kolo::run_local(4, Config::default(), |comm| -> kolo::Result<Vec<f32>> {
//!     let mut grads = vec![comm.rank() as f32; 3];
//!     comm.all_reduce(&mut grads, ReduceOp::Sum)?;
//!     Ok(grads)
//! });
//! for r in results {
//!     assert_eq!(r.unwrap().unwrap(), vec![6.0, 6.0, 6.0]);
//! }
//! ```
//!
//! Collectives carry a fingerprint of the call; ranks that disagree (another operation, count, type
//! or root) get [`Error::Mismatch`] instead of a hang. A peer that dies or stops answering is an
//! error naming it, within the communicator's timeout ([`Config::timeout`], `KOLO_TIMEOUT`) at the
//! latest and at once when its connection drops.
#![warn(missing_docs)]

mod adasum;
mod backend;
mod buffer;
mod collectives;
mod communicator;
pub mod config;
pub mod elastic;
pub mod error_file;
pub mod flight;
mod group;
mod init;
mod matching;
mod object;
mod p2p;
mod posted_recv;
mod send_in_place;
mod stop_report;
mod topology;
mod wait;
mod work;

pub use adasum::AdasumFloat;
pub use buffer::CollectiveBuffer;
pub use collectives::device::DeviceWork;
pub use communicator::Communicator;
pub use config::Config;
pub use init::{
    init, init_mpi, init_nccl, init_with, launched_by_mpi, local_communicators, run_local,
    shm_communicators, shm_name_prefix, Backend, InitMethod, InitOptions, SharedStore,
    TransportChoice,
};
pub use kolo_collectives::select::HIERARCHICAL_MIN_BYTES;
pub use kolo_core::gpu::device_ordinal as gpu_ordinal;
/// kolo's settings (`KOLO_*` variables) and where they are read from.
pub use kolo_core::settings;
pub use kolo_core::{
    Algorithm, Call, DType, DeviceBuffer, Element, Error, ErrorKind, OpKind, ReduceOp, Result,
    Transport,
};
/// The rendezvous stores.
pub use kolo_store as store;
/// The transports kolo ships (local threads, TCP), for building communicators by hand.
pub use kolo_transport as transport;
pub use matching::{Source, Status, TagMatch};
pub use p2p::{Completion, Request};
pub use posted_recv::PostedRecv;
pub use send_in_place::InPlaceSend;
pub use work::{Work, WorkTimes};

/// Half-precision element types.
pub use half::{bf16, f16};

/// The names most programs need: `use kolo::prelude::*;`.
pub mod prelude {
    pub use crate::{
        bf16, f16, CollectiveBuffer, Communicator, Config, DType, Element, Error, ReduceOp,
        Request, Work,
    };
}
