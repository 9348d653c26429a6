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

mod csv;
mod error;
mod plot;
mod progress;
mod rundir;
mod tensorboard;

pub use crate::csv::{read_csv, MetricsCsv, TRAINING_COLUMNS};
pub use crate::error::{MetricsError, Result};
pub use crate::plot::{
    plot_csv, plot_scaling, plot_training, plot_training_with, FontSource, PlotOptions,
    PlotWarning, ScalingPoint, TrainingSeries, FONT_CANDIDATES, FONT_ENV,
};
pub use crate::progress::Progress;
pub use crate::rundir::RunDir;
pub use crate::tensorboard::{
    crc32c, encode_tfrecord, masked_crc32c, TensorBoardWriter, FILE_VERSION,
};
