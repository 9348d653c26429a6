//! What `kolo train` writes into its run directory and shows on the terminal.
//!
//! - [`MetricsCsv`] / [`read_csv`]: one row of numbers per epoch, flushed
//!   row by row so a killed job keeps its history.
//! - [`TensorBoardWriter`]: scalar summaries in TensorBoard's event-file
//!   format, encoded by hand (TFRecord framing, CRC32C, protobuf).
//! - [`plot_training`]: a PNG with loss and accuracy per epoch, which
//!   degrades to a text-less plot rather than failing when no font exists.
//! - [`Progress`]: the per-epoch progress bar of rank 0 (plain log lines when
//!   stderr is not a terminal).
//! - [`RunDir`]: the run directory and the names of the files inside it.
//!
//! ```
//! use kolo_metrics::{plot_training, read_csv, MetricsCsv, TrainingSeries, TRAINING_COLUMNS};
//!
//! let dir = tempfile::tempdir()?;
//! let path = dir.path().join("metrics.csv");
//! let mut csv = MetricsCsv::create(&path, &TRAINING_COLUMNS)?;
//! // epoch, step, train loss, test loss, test accuracy, seconds, samples/s, learning rate
//! csv.append(&[1.0, 100.0, 0.9, 0.6, 0.78, 2.5, 25_600.0, 0.05])?;
//! csv.append(&[2.0, 200.0, 0.5, 0.45, 0.84, 2.4, 26_700.0, 0.05])?;
//! let (columns, rows) = read_csv(&path)?;
//! assert_eq!((columns.len(), rows.len()), (8, 2));
//! // The training plot (text needs a font; without one it says so and draws the lines alone).
//! let series = TrainingSeries::from_csv(&path)?;
//! let _warning = plot_training(&series, &dir.path().join("training.png"), "two epochs")?;
//! assert!(dir.path().join("training.png").exists());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![warn(missing_docs)]

mod csv;
mod error;
mod plot;
mod progress;
mod rundir;
mod tensorboard;

pub use crate::csv::{read_csv, MetricsCsv, TRAINING_COLUMNS};
pub use crate::error::{MetricsError, Result};
pub use crate::plot::{
    plot_csv, plot_scaling, plot_series_csv, plot_training, plot_training_with, FontSource,
    PlotOptions, PlotWarning, ScalingPoint, SeriesPlot, TrainingSeries, FONT_CANDIDATES, FONT_ENV,
};
pub use crate::progress::Progress;
pub use crate::rundir::RunDir;
pub use crate::tensorboard::{
    crc32c, encode_tfrecord, masked_crc32c, TensorBoardWriter, FILE_VERSION,
};
