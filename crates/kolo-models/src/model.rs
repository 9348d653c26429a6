//! The [`Model`] trait every model implements.

use candle_core::Tensor;
use kolo_nn::batch_norm::BatchNorm;

/// A classifier.
pub trait Model: Send + Sync {
    /// Logits for a batch (input shape [B, C, H, W], f32).
    ///
    /// `train` switches BatchNorm between batch statistics (updating the running statistics)
    /// and the running statistics; models without BatchNorm ignore it.
    fn forward(&self, x: &Tensor, train: bool) -> candle_core::Result<Tensor>;

    /// Calls `f` on each of the model's [`BatchNorm`] layers, in a fixed order (the same on
    /// every rank). Models with BatchNorm must override it (the default visits nothing); it is
    /// what [`convert_sync_batchnorm`](crate::convert_sync_batchnorm) uses.
    fn visit_batch_norms(&mut self, f: &mut dyn FnMut(&mut BatchNorm)) {
        let _ = f;
    }
}
