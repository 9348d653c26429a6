//! What the trainer's tests share: a small, quick run's settings.

use std::path::Path;

use kolo_data::DatasetKind;
use kolo_models::ModelKind;
use kolo_train::trainer::TrainConfig;

/// An MLP on synthetic blobs, `epochs` epochs of batch 32 at lr 0.05, writing into `out`.
pub fn synthetic(out: &Path, epochs: usize) -> TrainConfig {
    TrainConfig {
        model: ModelKind::Mlp,
        dataset: DatasetKind::Synthetic,
        epochs,
        batch_size: 32,
        lr: 0.05,
        out: Some(out.to_path_buf()),
        progress: false,
        seed: 7,
        ..TrainConfig::default()
    }
}
