//! # kolo-train
//!
//! The training loop behind `kolo train` ([`trainer`]): data (kolo-data), the model (kolo-models),
//! DDP and the distributed optimizer (kolo-ddp), metrics, plots and progress in a run directory
//! (kolo-metrics); and the scaling simulator behind `kolo simulate` ([`simulate`]), which profiles
//! kolo's models and prices their gradient all-reduces with kolo-collectives' cost model.
//!
//! The building blocks live in their own crates, usable without this one: kernels and layers in
//! kolo-nn, models in kolo-models, DDP, optimizers and checkpoints in kolo-ddp.

mod error;
pub mod simulate;
pub mod trainer;

pub use error::{Result, RunError};
