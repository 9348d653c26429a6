//! [`SimError`]: what can go wrong in a simulation.

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
