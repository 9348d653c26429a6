//! Synchronized batch normalization for whole models (PyTorch's
//! `nn.SyncBatchNorm.convert_sync_batchnorm`).
//!
//! With data parallelism each rank's BatchNorm layers normally see only the rank's own local
//! batch. [`convert_sync_batchnorm`] switches every [`BatchNorm`] of a model to statistics of the
//! global batch (one small all-reduce per layer in the forward pass and one in the backward
//! pass); [`build_sync_bn`] builds a [`ModelKind`] that way. A model without BatchNorm is left
//! unchanged and the count is 0, which a caller can report:
//!
//! ```no_run
//! # use candle_core::{DType, Device};
//! # use candle_nn::VarMap;
//! # use kolo_train::ddp::{Ddp, DdpOptions};
//! # use kolo_train::models::{self, ModelKind};
//! # fn main() -> kolo_train::Result<()> {
//! let comm = kolo::init()?;
//! let kind = ModelKind::Resnet18;
//! let varmap = VarMap::new();
//! models::build(kind, candle_nn::VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu), [3, 32, 32], 10)?;
//! let ddp = Ddp::new(&comm, &varmap, DdpOptions::default())?;
//! let sync_bn = true; // e.g. `--sync-bn`
//! if sync_bn && !kind.has_batch_norm() {
//!     eprintln!("--sync-bn: model {kind} has no batch norm");
//! }
//! // each step, as models are rebuilt from the `VarBuilder`:
//! let mut model = models::build(kind, ddp.var_builder(DType::F32, &Device::Cpu), [3, 32, 32], 10)?;
//! if sync_bn {
//!     let converted = models::convert_sync_batchnorm(model.as_mut(), &comm); // 17 for ResNet-18
//! }
//! // or, equivalently: models::build_sync_bn(kind, vb, [3, 32, 32], 10, &comm)?
//! # Ok(()) }
//! ```
//!
//! Conversion only changes how training-mode statistics are computed: the parameters, the
//! running statistics (still `…running_mean` / `…running_var` buffers of the `VarMap`) and eval
//! mode are untouched, and it costs nothing to redo on every step. Every rank must convert the
//! same model and run every forward and backward pass through it (an empty local batch is fine).

use candle_nn::VarBuilder;
use kolo::Communicator;

use super::{build, BatchNorm, Model, ModelKind};

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
