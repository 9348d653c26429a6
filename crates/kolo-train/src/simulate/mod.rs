//! Step-time simulation of data-parallel training (`kolo simulate`).
//!
//! - [`profile`]: what one rank's step costs in compute, and when each gradient is ready
//!   (measured on this machine, or [`published`] for Horovod's benchmark models).
//! - [`cluster`]: ranks per node, intra- and inter-node links, algorithm, bucket size, overlap,
//!   threads and cores.
//! - [`overlap`]: event simulation of backward with DDP's buckets sent in order on one channel.
//! - [`predict`](mod@predict): step time, compute / communication / exposed communication and scaling
//!   efficiency at N ranks, with all-reduce costs from [`kolo_collectives::cost`], the α-β model
//!   next to kolo's algorithm selection.

pub mod cluster;
pub mod overlap;
pub mod predict;
pub mod profile;
pub mod published;

pub use cluster::{AlgoChoice, Cluster, RawCluster, RawLink};
pub use predict::{predict, predict_all, Prediction};
pub use profile::{ParamProfile, Profile};

/// What can go wrong in a simulation.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SimError {
    /// A cluster description field is missing or makes no sense.
    #[error("cluster description: `{field}`: {reason}")]
    Cluster {
        /// The field (e.g. `inter_node.bandwidth_gbps`).
        field: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A profile field makes no sense.
    #[error("profile: `{field}`: {reason}")]
    Profile {
        /// The field.
        field: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The failure.
        source: std::io::Error,
    },
    /// A file is not valid JSON of the expected shape (unknown fields included).
    #[error("{path}: {source}")]
    Parse {
        /// The file (or where the text came from).
        path: String,
        /// The failure.
        source: serde_json::Error,
    },
    /// Profiling failed.
    #[error("profiling: {0}")]
    Candle(#[from] candle_core::Error),
    /// Profiling failed.
    #[error("profiling: {0}")]
    Train(#[from] kolo_ddp::TrainError),
}
