//! What rank 0 records: the epoch lines, the metrics CSV, TensorBoard events, the plot, the
//! checkpoints and the summary, all in the run directory.

use candle_nn::VarMap;
use kolo_metrics::{MetricsCsv, RunDir, TensorBoardWriter, TrainingSeries, TRAINING_COLUMNS};

use super::config::TrainConfig;
use super::summary::{EpochStats, Summary};
use kolo_ddp::checkpoint::{self, TrainState};
use kolo_ddp::TrainError;
use kolo_nn::vars::sorted_vars;

use crate::error::Result;
use kolo_ddp::optim::StateSnapshot;

/// An epoch's row of the metrics CSV ([`TRAINING_COLUMNS`]).
pub(super) fn row(s: &EpochStats, step: u64, lr: f64) -> Vec<f64> {
    vec![
        s.epoch as f64,
        step as f64,
        s.train_loss,
        s.test_loss,
        s.test_accuracy,
        s.epoch_seconds,
        s.samples_per_second,
        lr,
    ]
}

/// The progress a checkpoint of `kolo train` records after `epoch` epochs and `step` optimizer
/// steps of `world` workers.
pub(super) fn train_state(
    cfg: &TrainConfig,
    epoch: usize,
    step: u64,
    optimizer_steps: u64,
    world: usize,
) -> TrainState {
    TrainState {
        epoch,
        step,
        seed: cfg.seed,
        optimizer_steps,
        model: cfg.model.to_string(),
        dataset: cfg.dataset.to_string(),
        world_size: world,
        batch_size: cfg.batch_size,
    }
}

/// Rank 0's outputs.
pub(super) struct Recorder {
    dir: RunDir,
    csv: MetricsCsv,
    tb: Option<TensorBoardWriter>,
    /// Ranks in the job (the plot's title).
    workers: String,
    /// Whether a plot without text was reported (once per run).
    plot_warned: bool,
}

impl Recorder {
    /// Opens the metrics files of `dir` (appending when the run resumes).
    pub fn open(dir: RunDir, cfg: &TrainConfig, workers: String) -> Result<Recorder> {
        let csv = if cfg.resume {
            MetricsCsv::open_append(&dir.metrics_csv(), &TRAINING_COLUMNS)?
        } else {
            MetricsCsv::create(&dir.metrics_csv(), &TRAINING_COLUMNS)?
        };
        let tb = match TensorBoardWriter::create(&dir.tensorboard_dir()) {
            Ok(tb) => Some(tb),
            Err(e) => {
                eprintln!("kolo train: TensorBoard events disabled: {e}");
                None
            }
        };
        Ok(Recorder {
            dir,
            csv,
            tb,
            workers,
            plot_warned: false,
        })
    }

    /// Writes rows of earlier epochs into the metrics CSV (a fault-tolerant run's new rank 0, which
    /// may be another process than the one that wrote them, rewrites the file from the rows it was
    /// handed).
    pub fn replay(&mut self, rows: &[Vec<f64>]) -> Result<()> {
        for r in rows {
            self.csv.append(r)?;
        }
        Ok(())
    }

    /// Prints the epoch's line and writes its metrics, plot and checkpoint.
    pub fn epoch(
        &mut self,
        cfg: &TrainConfig,
        s: &EpochStats,
        state: &TrainState,
        varmap: &VarMap,
        lr: f64,
        optimizer: &StateSnapshot,
    ) -> Result<()> {
        println!(
            "epoch {:>3}/{}  train loss {:.4}  test loss {:.4}  test acc {:6.2}%  {:6.1} s  {:>8.0} samples/s",
            s.epoch,
            cfg.epochs,
            s.train_loss,
            s.test_loss,
            100.0 * s.test_accuracy,
            s.epoch_seconds,
            s.samples_per_second
        );
        self.csv.append(&row(s, state.step, lr))?;
        if let Some(tb) = self.tb.as_mut() {
            let scalars = [
                ("loss/train", s.train_loss as f32),
                ("loss/test", s.test_loss as f32),
                ("accuracy/test", s.test_accuracy as f32),
                ("throughput/samples_per_second", s.samples_per_second as f32),
            ];
            if let Err(e) = tb
                .add_scalars(s.epoch as i64, &scalars)
                .and_then(|_| tb.flush())
            {
                eprintln!("kolo train: TensorBoard events: {e}");
            }
        }
        let series = TrainingSeries::from_csv(&self.dir.metrics_csv())?;
        let title = format!("{} on {} — {}", cfg.model, cfg.dataset, self.workers);
        if let Some(w) = kolo_metrics::plot_training(&series, &self.dir.plot_png(), &title)? {
            if !self.plot_warned {
                self.plot_warned = true;
                eprintln!("kolo train: plot without text: {w}");
            }
        }
        checkpoint::save(
            &self.dir.checkpoint_dir(),
            &sorted_vars(varmap),
            optimizer,
            state,
        )?;
        Ok(())
    }

    /// Writes `summary.json` and prints the closing line.
    pub fn summary(&self, summary: &Summary) -> Result<()> {
        let path = self.dir.summary_json();
        let json =
            serde_json::to_vec_pretty(summary).map_err(|source| TrainError::CheckpointJson {
                path: path.clone(),
                source,
            })?;
        std::fs::write(&path, json).map_err(|source| TrainError::Io { path, source })?;
        println!(
            "done: {} epochs, final test accuracy {:.2}%, {:.0} samples/s, {:.1} s{}; outputs in {}",
            summary.epochs.len(),
            100.0 * summary.final_accuracy,
            summary.samples_per_second,
            summary.total_seconds,
            summary
                .seconds_to_target
                .map(|s| format!(
                    ", {:.0}% after {s:.1} s",
                    100.0 * summary.config.target_accuracy
                ))
                .unwrap_or_default(),
            self.dir.path().display()
        );
        if let Some(s) = summary.stragglers.as_ref().filter(|s| s.collectives > 0) {
            println!("{}", kolo::flight::analysis::straggler_text(s));
        }
        Ok(())
    }
}
