//! Synchronized batch normalization for whole models (PyTorch's
//! `nn.SyncBatchNorm.convert_sync_batchnorm`); documented at the crate root.

use candle_nn::VarBuilder;
use kolo::Communicator;

use kolo_nn::batch_norm::BatchNorm;

use crate::kind::{build, ModelKind};
use crate::model::Model;

/// Synchronizes every [`BatchNorm`] layer of `model` over `comm` and returns how many there
/// are (0 for a model without BatchNorm).
pub fn convert_sync_batchnorm(model: &mut dyn Model, comm: &Communicator) -> usize {
    let mut converted = 0;
    model.visit_batch_norms(&mut |bn: &mut BatchNorm| {
        bn.synchronize(comm);
        converted += 1;
    });
    converted
}

/// [`build`], then [`convert_sync_batchnorm`] over `comm`.
pub fn build_sync_bn(
    kind: ModelKind,
    vb: VarBuilder,
    input_shape: [usize; 3],
    classes: usize,
    comm: &Communicator,
) -> candle_core::Result<Box<dyn Model>> {
    let mut model = build(kind, vb, input_shape, classes)?;
    convert_sync_batchnorm(model.as_mut(), comm);
    Ok(model)
}
