//! # kolo-train
//!
//! The training loop behind `kolo train` ([`trainer`]): data (kolo-data), the model (kolo-models),
//! DDP and the distributed optimizer (kolo-ddp), metrics, plots and progress in a run directory
//! (kolo-metrics); and the scaling simulator behind `kolo simulate` ([`simulate`]), which profiles
//! kolo's models and prices their gradient all-reduces with kolo-collectives' cost model.
//!
//! The building blocks live in their own crates, usable without this one: kernels and layers in
//! kolo-nn, models in kolo-models, DDP, optimizers and checkpoints in kolo-ddp.
//!
//! ```
//! use kolo_train::trainer::{run, TrainConfig};
//!
//! // `kolo train` as a library: an MLP on seeded Gaussian blobs, two ranks as threads, the run
//! // directory (metrics, plot, checkpoints) in a temporary folder.
//! let out = std::env::temp_dir().join(format!("kolo-train-example-{}", std::process::id()));
//! let cfg = TrainConfig {
//!     model: kolo_models::ModelKind::Mlp,
//!     dataset: kolo_data::DatasetKind::Synthetic,
//!     epochs: 2,
//!     progress: false,
//!     out: Some(out.clone()),
//!     ..TrainConfig::default()
//! };
//! let summaries = kolo::run_local(2, kolo::Config::default(), |comm| run(&comm, &cfg));
//! let s = summaries[0].as_ref().unwrap().as_ref().unwrap();
//! assert_eq!(s.epochs.len(), 2);
//! assert!(s.final_accuracy > 0.8, "{:?}", s.epochs);
//! assert!(out.join("metrics.csv").exists());
//! std::fs::remove_dir_all(&out).unwrap();
//! ```
#![warn(missing_docs)]

mod error;
pub mod simulate;
pub mod trainer;

pub use error::{Result, RunError};
