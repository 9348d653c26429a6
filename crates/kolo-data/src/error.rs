//! The crate's error type.

use std::fmt::Write as _;
use std::path::PathBuf;

/// Everything that can go wrong while loading, indexing or sampling data.
///
/// Every variant that concerns a file names it, and format errors carry the
/// numbers involved (the magic found, the dimensions, the byte counts).
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum DataError {
    /// A file or directory could not be opened or read.
    #[error("cannot read {}: {source}", path.display())]
    Io {
        /// The file or directory involved.
        path: PathBuf,
        /// The underlying I/O error.
        #[source]
        source: std::io::Error,
    },

    /// A file's contents do not have the expected structure (bad magic
    /// number, impossible dimensions, labels out of range, trailing bytes…).
    #[error("{}: invalid format: {reason}", path.display())]
    Format {
        /// The offending file.
        path: PathBuf,
        /// What is wrong, with the numbers involved.
        reason: String,
    },

    /// A file is shorter than its header says it should be.
    ///
    /// For gzip-compressed files the counts refer to the decompressed data.
    #[error(
        "{}: truncated: expected {expected} bytes of data, found {actual}",
        path.display()
    )]
    Truncated {
        /// The offending file.
        path: PathBuf,
        /// How many bytes the header promises.
        expected: u64,
        /// How many bytes the file actually holds.
        actual: u64,
    },

    /// A line of a text file could not be parsed.
    #[error("{}:{line}: {reason}", path.display())]
    Parse {
        /// The offending file.
        path: PathBuf,
        /// The 1-based line number.
        line: usize,
        /// What is wrong with the line.
        reason: String,
    },

    /// A dataset's files were not found in any of the searched locations.
    #[error(
        "dataset {dataset} not found; searched {}; {hint}",
        fmt_paths(searched)
    )]
    NotFound {
        /// The dataset's name (as accepted by `DatasetKind::from_str`).
        dataset: String,
        /// Every directory or file that was searched, in order.
        searched: Vec<PathBuf>,
        /// How to obtain the dataset.
        hint: String,
    },

    /// A caller-supplied argument is invalid.
    #[error("invalid argument `{arg}`: {reason}")]
    InvalidArgument {
        /// The argument's name.
        arg: String,
        /// Why it is invalid.
        reason: String,
    },

    /// A sample (or partition) index is out of range.
    #[error("index {index} out of range (length {len})")]
    IndexOutOfRange {
        /// The index requested.
        index: usize,
        /// The number of valid indices.
        len: usize,
    },
}

impl DataError {
    /// Shorthand for [`DataError::InvalidArgument`].
    pub(crate) fn invalid(arg: &str, reason: impl Into<String>) -> Self {
        DataError::InvalidArgument {
            arg: arg.to_owned(),
            reason: reason.into(),
        }
    }

    /// Shorthand for [`DataError::Format`].
    pub(crate) fn format(path: impl Into<PathBuf>, reason: impl Into<String>) -> Self {
        DataError::Format {
            path: path.into(),
            reason: reason.into(),
        }
    }
}

fn fmt_paths(paths: &[PathBuf]) -> String {
    if paths.is_empty() {
        return "nothing".to_owned();
    }
    let mut out = String::new();
    for (i, p) in paths.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        let _ = write!(out, "{}", p.display());
    }
    out
}

/// The message, as `Display` writes it, not the fields: a `main` returning this error prints it so,
/// and the message is what names the rank, the call and what to do.
impl std::fmt::Debug for DataError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_found_lists_every_searched_path() {
        let e = DataError::NotFound {
            dataset: "mnist".into(),
            searched: vec![PathBuf::from("/a"), PathBuf::from("b/c")],
            hint: "run scripts/fetch-data.sh".into(),
        };
        let s = e.to_string();
        assert!(s.contains("/a, b/c"), "{s}");
        assert!(s.contains("run scripts/fetch-data.sh"), "{s}");
    }

    #[test]
    fn truncated_names_file_and_counts() {
        let e = DataError::Truncated {
            path: PathBuf::from("x/train-images-idx3-ubyte"),
            expected: 100,
            actual: 42,
        };
        let s = e.to_string();
        assert!(s.contains("x/train-images-idx3-ubyte"), "{s}");
        assert!(s.contains("100") && s.contains("42"), "{s}");
    }
}
