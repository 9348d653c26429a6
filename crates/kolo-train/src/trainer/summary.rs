//! What a run reports: per epoch ([`EpochStats`]) and at the end ([`Summary`]).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::config::TrainConfig;

/// Per-epoch results.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EpochStats {
    /// Epoch number, from 1.
    pub epoch: usize,
    /// Mean training loss over the epoch (all ranks).
    pub train_loss: f64,
    /// Mean test loss.
    pub test_loss: f64,
    /// Test accuracy in [0, 1].
    pub test_accuracy: f64,
    /// Whether every rank held bit for bit the same buffers (BatchNorm running statistics) at the
    /// end of the epoch's training, before rank 0's are copied to all (as `--sync-bn` keeps them);
    /// `None` for a model without buffers.
    #[serde(default)]
    pub buffers_agreed: Option<bool>,
    /// Seconds of training in the epoch.
    pub epoch_seconds: f64,
    /// Training samples per second, all workers together.
    pub samples_per_second: f64,
}

/// What a run produced.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// The configuration.
    pub config: TrainConfig,
    /// Ranks (worker processes × replicas).
    pub world_size: usize,
    /// Epochs trained in this run (after any resumed ones).
    pub epochs: Vec<EpochStats>,
    /// Final test accuracy.
    pub final_accuracy: f64,
    /// Training samples per second over the run, all workers together.
    pub samples_per_second: f64,
    /// Seconds from the start of the run to the end of the first epoch whose test accuracy reached
    /// [`TrainConfig::target_accuracy`].
    pub seconds_to_target: Option<f64>,
    /// Total seconds.
    pub total_seconds: f64,
    /// The run directory.
    pub run_dir: Option<PathBuf>,
    /// Bytes of optimizer state each rank holds at the end, in rank order (`--shard-optimizer`:
    /// each rank its shard; otherwise every rank all of it).
    #[serde(default)]
    pub optimizer_state_bytes: Vec<u64>,
    /// Which ranks arrived last at the world's collectives (the last 1,000 every rank completed,
    /// from the flight records; `None` with one rank).
    #[serde(default)]
    pub stragglers: Option<kolo::flight::analysis::Stragglers>,
    /// `--fault-tolerant`: one line per reconfiguration (lost and joined workers, and why).
    #[serde(default)]
    pub reconfigurations: Vec<String>,
}
