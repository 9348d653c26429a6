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
mod error;
pub mod overlap;
pub mod predict;
pub mod profile;
pub mod published;

pub use cluster::{AlgoChoice, Cluster, RawCluster, RawLink};
pub use error::SimError;
pub use predict::{predict, predict_all, Prediction};
pub use profile::{ParamProfile, Profile};
