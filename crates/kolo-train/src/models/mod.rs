//! Models.
//!
//! Image classifiers for `[B, C, H, W]` f32 batches: [`Lenet`], [`SimpleCnn`], [`Mlp`] and the
//! small-image [`Resnet18`]. Every model is built from a [`candle_nn::VarBuilder`] (normally
//! backed by a [`candle_nn::VarMap`]), takes the per-sample input shape `[C, H, W]` and the
//! number of classes, and implements [`Model`].
//!
//! Parameter names are stable and readable (`conv1.weight`, `fc1.bias`,
//! `layer2.0.bn1.weight`, …). BatchNorm running statistics live in the same `VarMap` as
//! candle `Var`s named `…running_mean` / `…running_var` (candle-nn's naming), so they are saved
//! with the parameters; they never receive gradients. Use [`named_parameters`] /
//! [`named_buffers`] to split a `VarMap` into trainable parameters and such buffers.
//!
//! Layers use PyTorch's default initialization (see the `layers` module notes), not
//! candle-nn's.
//!
//! BatchNorm layers are kolo's [`BatchNorm`] (candle-nn's math and names), which can be
//! synchronized over the ranks of a communicator (PyTorch's `SyncBatchNorm`).
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
//! # use kolo_train::ddp::{Ddp, DdpOptions};
//! # use kolo_train::models::{self, ModelKind};
//! # fn main() -> kolo_train::Result<()> {
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

use std::fmt;
use std::str::FromStr;

use candle_core::{Tensor, Var};
use candle_nn::{VarBuilder, VarMap};

mod batch_norm;
mod channel_stats;
mod layers;
mod lenet;
mod mlp;
mod resnet;
mod simple_cnn;
mod sync_bn;

pub use crate::ops::{avg_pool2x2, conv2d, conv2d_relu, max_pool2x2, relu};
pub use batch_norm::{BatchNorm, BatchNormConfig};
pub(crate) use channel_stats::channel_sums_no_grad;
pub use lenet::Lenet;
pub use mlp::{Mlp, DEFAULT_MLP_HIDDEN};
pub use resnet::Resnet18;
pub use simple_cnn::SimpleCnn;
pub use sync_bn::{build_sync_bn, convert_sync_batchnorm};

/// A classifier.
pub trait Model: Send + Sync {
    /// Logits for a batch (input shape [B, C, H, W], f32).
    ///
    /// `train` switches BatchNorm between batch statistics (updating the running statistics)
    /// and the running statistics; models without BatchNorm ignore it.
    fn forward(&self, x: &Tensor, train: bool) -> candle_core::Result<Tensor>;

    /// Calls `f` on each of the model's [`BatchNorm`] layers, in a fixed order (the same on
    /// every rank). Models with BatchNorm must override it (the default visits nothing); it is
    /// what [`convert_sync_batchnorm`] uses.
    fn visit_batch_norms(&mut self, f: &mut dyn FnMut(&mut BatchNorm)) {
        let _ = f;
    }
}

/// The models [`build`] knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ModelKind {
    /// [`Lenet`] (`lenet`).
    Lenet,
    /// [`SimpleCnn`] (`simple-cnn`).
    SimpleCnn,
    /// [`Mlp`] with the default hidden sizes (`mlp`).
    Mlp,
    /// [`Resnet18`] (`resnet18`).
    Resnet18,
}

impl ModelKind {
    /// All kinds, in a fixed order.
    pub const ALL: [ModelKind; 4] = [
        ModelKind::Lenet,
        ModelKind::SimpleCnn,
        ModelKind::Mlp,
        ModelKind::Resnet18,
    ];

    /// The canonical name (`lenet`, `simple-cnn`, `mlp`, `resnet18`).
    pub fn as_str(self) -> &'static str {
        match self {
            ModelKind::Lenet => "lenet",
            ModelKind::SimpleCnn => "simple-cnn",
            ModelKind::Mlp => "mlp",
            ModelKind::Resnet18 => "resnet18",
        }
    }

    /// Whether models of this kind have BatchNorm layers (only those change with
    /// [`convert_sync_batchnorm`]).
    pub fn has_batch_norm(self) -> bool {
        matches!(self, ModelKind::Resnet18)
    }
}

impl fmt::Display for ModelKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Error for an unknown model name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown model `{0}` (expected one of: lenet, simple-cnn, mlp, resnet18)")]
pub struct UnknownModel(pub String);

impl FromStr for ModelKind {
    type Err = UnknownModel;

    /// Parses a canonical name; `simple_cnn`, `simplecnn` and `resnet-18` are accepted too
    /// (case-insensitive).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "lenet" => Ok(ModelKind::Lenet),
            "simple-cnn" | "simple_cnn" | "simplecnn" => Ok(ModelKind::SimpleCnn),
            "mlp" => Ok(ModelKind::Mlp),
            "resnet18" | "resnet-18" | "resnet_18" => Ok(ModelKind::Resnet18),
            _ => Err(UnknownModel(s.to_string())),
        }
    }
}

/// Builds a model of the given kind for per-sample inputs of shape `input_shape` (`[C, H, W]`)
/// and `classes` output classes, creating (or loading) its variables through `vb`.
///
/// Fails with a descriptive error if the input is too small for the model (e.g. LeNet on 8×8).
pub fn build(
    kind: ModelKind,
    vb: VarBuilder,
    input_shape: [usize; 3],
    classes: usize,
) -> candle_core::Result<Box<dyn Model>> {
    Ok(match kind {
        ModelKind::Lenet => Box::new(Lenet::new(vb, input_shape, classes)?),
        ModelKind::SimpleCnn => Box::new(SimpleCnn::new(vb, input_shape, classes)?),
        ModelKind::Mlp => Box::new(Mlp::new(vb, input_shape, classes, &DEFAULT_MLP_HIDDEN)?),
        ModelKind::Resnet18 => Box::new(Resnet18::new(vb, input_shape, classes)?),
    })
}

/// Whether a variable name denotes a non-trainable buffer (BatchNorm running statistics).
pub fn is_buffer_name(name: &str) -> bool {
    let last = name.rsplit('.').next().unwrap_or(name);
    last == "running_mean" || last == "running_var"
}

fn sorted_vars(varmap: &VarMap, keep: impl Fn(&str) -> bool) -> Vec<(String, Var)> {
    let data = match varmap.data().lock() {
        Ok(guard) => guard,
        // A panic while holding the lock cannot leave the map itself inconsistent.
        Err(poisoned) => poisoned.into_inner(),
    };
    let mut vars: Vec<(String, Var)> = data
        .iter()
        .filter(|(name, _)| keep(name))
        .map(|(name, var)| (name.clone(), var.clone()))
        .collect();
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    vars
}

/// The trainable parameters of `varmap` (everything but [`is_buffer_name`] buffers), sorted by
/// name: what an optimizer should be given.
pub fn named_parameters(varmap: &VarMap) -> Vec<(String, Var)> {
    sorted_vars(varmap, |name| !is_buffer_name(name))
}

/// The non-trainable buffers of `varmap` (BatchNorm running statistics), sorted by name.
pub fn named_buffers(varmap: &VarMap) -> Vec<(String, Var)> {
    sorted_vars(varmap, is_buffer_name)
}

/// Total number of scalar elements in the trainable parameters of `varmap` (PyTorch's
/// `sum(p.numel() for p in model.parameters())`).
pub fn parameter_count(varmap: &VarMap) -> usize {
    named_parameters(varmap)
        .iter()
        .map(|(_, var)| var.elem_count())
        .sum()
}
