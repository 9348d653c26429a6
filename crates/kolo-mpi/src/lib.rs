//! # kolo-mpi
//!
//! kolo on an installed MPI library (OpenMPI, MPICH) through the [`mpi`] crate (rsmpi): for clusters
//! that start jobs with `mpirun` or `srun` and have tuned MPI for their network. Programs do not use
//! this crate directly: build `kolo` with the `mpi` feature and `kolo::init()` selects it under
//! `mpirun`/`srun` (or with `KOLO_BACKEND=mpi`).
//!
//! Two pieces, both over duplicates of `MPI_COMM_WORLD` so kolo's traffic never mixes with the
//! program's own MPI calls:
//!
//! - [`MpiEngine`], a [`kolo_core::Engine`]: every collective is MPI's own (`MPI_Allreduce`,
//!   `MPI_Bcast`, `MPI_Reduce_scatter_block`, `MPI_Alltoallv`, ...), for every element type and
//!   operator (f16/bf16 reduce through user-defined MPI operators, or by converting to f32 with
//!   `KOLO_MPI_HALF=convert`); sub-groups through `MPI_Comm_split`. Before each collective the ranks
//!   agree on its fingerprint with a 16-byte non-blocking all-reduce, so a rank in a different call
//!   is an [`kolo_core::Error::Mismatch`] and a rank that aborted is an error naming it, not a hang.
//! - [`MpiTransport`], a [`kolo_core::Transport`]: point-to-point messages as MPI messages
//!   (`MPI_Isend`, matched probes and `MPI_Mrecv`), buffered like every kolo transport, which also
//!   lets kolo's own algorithms run over MPI (`KOLO_ALGO_ALLREDUCE=ring`, say).
//!
//! MPI is initialized with `MPI_THREAD_MULTIPLE` on first use and finalized when the process exits.
//! A process whose communicator failed exits with status 1 without finalizing instead, which mpirun
//! treats as a failed job and ends, so that a rank that gives up never leaves the others waiting
//! inside MPI.
//!
//! ```
//! // The MPI library kolo runs on (MPI may be initialized without mpirun: a world of one).
//! let version = kolo_mpi::library_version()?;
//! assert!(!version.is_empty());
//! # Ok::<(), kolo_core::Error>(())
//! ```
#![warn(missing_docs)]

mod engine;
mod runtime;
mod transport;
mod types;

pub use engine::MpiEngine;
pub use transport::MpiTransport;

use std::sync::Arc;

use kolo_core::{Engine, Result};

/// The world over MPI: the engine for collectives and the transport for point-to-point messages.
#[derive(Debug)]
pub struct MpiWorld {
    /// Collectives over `MPI_COMM_WORLD` (a duplicate of it).
    pub engine: Arc<MpiEngine>,
    /// Point-to-point over another duplicate.
    pub transport: Arc<MpiTransport>,
    /// Node identity of every rank (`KOLO_NODE_ID`, else the MPI processor name).
    pub node_ids: Vec<String>,
}

/// Initializes MPI (once per process) and returns a new world over it.
pub fn world() -> Result<MpiWorld> {
    runtime::start()?;
    let watch = Arc::new(runtime::Watch::default());
    let engine = Arc::new(MpiEngine::world(watch.clone())?);
    let transport = Arc::new(MpiTransport::world(watch)?);
    let node_ids = engine.node_ids()?;
    Ok(MpiWorld {
        engine,
        transport,
        node_ids,
    })
}

/// The MPI library's own description (`MPI_Get_library_version`), once MPI can be initialized.
pub fn library_version() -> Result<String> {
    runtime::start()?;
    mpi::environment::library_version().map_err(|e| kolo_core::Error::Backend {
        op: "init",
        rank: 0,
        backend: "mpi",
        reason: format!("library version is not UTF-8: {e}"),
    })
}
