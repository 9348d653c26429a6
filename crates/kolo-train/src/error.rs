//! The error of a `kolo train` run: a training error ([`TrainError`]), or the data or the run
//! directory's outputs failing.

use kolo_ddp::TrainError;

/// Result with [`RunError`].
pub type Result<T, E = RunError> = std::result::Result<T, E>;

/// Why a `kolo train` run ([`crate::trainer::run`]) stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// Training failed: communication, tensors, the model, the optimizer, a checkpoint, a
    /// setting, ….
    #[error(transparent)]
    Train(#[from] TrainError),

    /// Loading data failed.
    #[error(transparent)]
    Data(#[from] kolo_data::DataError),

    /// Writing metrics, plots or progress failed.
    #[error(transparent)]
    Metrics(#[from] kolo_metrics::MetricsError),
}

impl From<kolo::Error> for RunError {
    fn from(e: kolo::Error) -> Self {
        RunError::Train(e.into())
    }
}

impl From<candle_core::Error> for RunError {
    fn from(e: candle_core::Error) -> Self {
        RunError::Train(e.into())
    }
}
