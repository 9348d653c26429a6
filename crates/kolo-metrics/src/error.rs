//! The crate's error type.

use std::io;
use std::path::{Path, PathBuf};

/// Everything that can go wrong while writing or reading run outputs.
///
/// Every variant that concerns a file names it, so a message such as
/// `I/O error on runs/mnist-20250101-120000/metrics.csv: No space left on device`
/// tells the user what failed without a backtrace.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MetricsError {
    /// An operating-system I/O call on `path` failed.
    #[error("I/O error on {}: {source}", path.display())]
    Io {
        /// The file or directory being accessed.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// A CSV file could not be parsed.
    #[error("malformed CSV {} line {line}: {reason}", path.display())]
    Csv {
        /// The CSV file.
        path: PathBuf,
        /// 1-based line number of the offending line.
        line: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// A row had a different number of values than the file has columns.
    #[error("{}: row has {got} values but the file has {expected} columns", path.display())]
    Columns {
        /// The CSV file being appended to.
        path: PathBuf,
        /// Number of columns in the header.
        expected: usize,
        /// Number of values supplied.
        got: usize,
    },
    /// An existing CSV file has a different header than the one requested,
    /// typically because a run is resumed with a different configuration.
    #[error(
        "{} has header `{found}` but `{expected}` was expected; \
         use a new run directory or remove the file",
        path.display()
    )]
    HeaderMismatch {
        /// The existing CSV file.
        path: PathBuf,
        /// The header the caller asked for.
        expected: String,
        /// The header found in the file.
        found: String,
    },
    /// A column name is not usable in a CSV header.
    #[error("invalid CSV column name {name:?}: {reason}")]
    InvalidColumn {
        /// The rejected name.
        name: String,
        /// Why it was rejected.
        reason: String,
    },
    /// The metrics needed for a plot are missing from a CSV table.
    #[error("{}: {reason}", path.display())]
    MissingColumn {
        /// The CSV file (or `<memory>` for an in-memory table).
        path: PathBuf,
        /// Which column is missing.
        reason: String,
    },
    /// Rendering or encoding a plot failed.
    #[error("cannot draw plot {}: {reason}", path.display())]
    Plot {
        /// The PNG file being written.
        path: PathBuf,
        /// What failed.
        reason: String,
    },
    /// No fresh run directory could be created under `base`.
    #[error("cannot create a run directory under {}: {reason}", base.display())]
    RunDir {
        /// The directory holding the runs.
        base: PathBuf,
        /// What failed.
        reason: String,
    },
}

/// Shorthand for results of this crate.
pub type Result<T, E = MetricsError> = std::result::Result<T, E>;

impl MetricsError {
    /// Builds an [`MetricsError::Io`] for `path`.
    pub(crate) fn io(path: &Path, source: io::Error) -> Self {
        MetricsError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}
