//! # kolo-models
//!
//! Image classifiers for `[B, C, H, W]` f32 batches: [`Lenet`], [`SimpleCnn`], [`Mlp`] and the
//! small-image [`Resnet18`]. Every model is built from a [`candle_nn::VarBuilder`] (normally
//! backed by a [`candle_nn::VarMap`]), takes the per-sample input shape `[C, H, W]` and the
//! number of classes, and implements [`Model`].
//!
//! Parameter names are stable and readable (`conv1.weight`, `fc1.bias`,
//! `layer2.0.bn1.weight`, …). BatchNorm running statistics live in the same `VarMap` as
//! candle `Var`s named `…running_mean` / `…running_var` (candle-nn's naming), so they are saved
//! with the parameters; they never receive gradients. Use [`kolo_nn::vars::named_parameters`] /
//! [`kolo_nn::vars::named_buffers`] to split a `VarMap` into trainable parameters and such
//! buffers. [`seeded_init`] gives a model's parameters reproducible PyTorch-style values.
//!
//! The models are built from kolo-nn's layers and kernels ([`kolo_nn::layers`],
//! [`kolo_nn::ops`]), with PyTorch's default initialization, not candle-nn's. BatchNorm layers
//! are kolo-nn's [`BatchNorm`] (candle-nn's math and names), which can be synchronized over the
//! ranks of a communicator (PyTorch's `SyncBatchNorm`). This crate holds the models only: it
//! depends on kolo-nn (and kolo-data's seeded random numbers for [`seeded_init`]), not on DDP.
//!
//! # Synchronized BatchNorm
//!
//! With data parallelism each rank's BatchNorm layers normally see only the rank's own local
//! batch. [`convert_sync_batchnorm`] switches every [`BatchNorm`] of a model to statistics of the
//! global batch (one small all-reduce per layer in the forward pass and one in the backward
//! pass); [`build_sync_bn`] builds a [`ModelKind`] that way. A model without BatchNorm is left
//! unchanged and the count is 0, which a caller can report (or ask
//! [`ModelKind::has_batch_norm`] beforehand):
//!
//! ```no_run
//! # use candle_core::{DType, Device};
//! # use candle_nn::VarMap;
//! # use kolo_ddp::ddp::{Ddp, DdpOptions};
//! # use kolo_models::{self as models, ModelKind};
//! # fn main() -> kolo_ddp::Result<()> {
//! let comm = kolo::init()?;
//! let kind = ModelKind::Resnet18;
//! let varmap = VarMap::new();
//! models::build(kind, candle_nn::VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu), [3, 32, 32], 10)?;
//! let ddp = Ddp::new(&comm, &varmap, DdpOptions::default())?;
//! let sync_bn = true; // e.g. `--sync-bn`
//! for step in 0..3 {
//!     // models are rebuilt from the `VarBuilder` every step, and converted every step
//!     let mut model = models::build(kind, ddp.var_builder(DType::F32, &Device::Cpu), [3, 32, 32], 10)?;
//!     if sync_bn {
//!         let converted = models::convert_sync_batchnorm(model.as_mut(), &comm); // 17 for ResNet-18
//!         if converted == 0 && step == 0 {
//!             eprintln!("--sync-bn: model {kind} has no batch norm");
//!         }
//!     }
//!     // or, in one call: models::build_sync_bn(kind, vb, [3, 32, 32], 10, &comm)?
//!     // ... forward (train mode), loss, ddp.backward(&loss)?, optimizer step
//! }
//! # Ok(()) }
//! ```
//!
//! Conversion only changes how training-mode statistics are computed: the parameters, the
//! running statistics (still `…running_mean` / `…running_var` buffers of the `VarMap`) and eval
//! mode are untouched, and it costs nothing to redo on every step. Every rank must convert the
//! same model and run every forward and backward pass through it (an empty local batch is fine
//! for the layer itself; see [`BatchNorm`]).
//!
//! [`BatchNorm`]: kolo_nn::batch_norm::BatchNorm
#![warn(missing_docs)]

mod check;
mod init;
mod kind;
mod lenet;
mod mlp;
mod model;
mod resnet;
mod simple_cnn;
mod sync_bn;

pub use init::seeded_init;
pub use kind::{build, ModelKind, UnknownModel};
pub use lenet::Lenet;
pub use mlp::{Mlp, DEFAULT_MLP_HIDDEN};
pub use model::Model;
pub use resnet::Resnet18;
pub use simple_cnn::SimpleCnn;
pub use sync_bn::{build_sync_bn, convert_sync_batchnorm};
