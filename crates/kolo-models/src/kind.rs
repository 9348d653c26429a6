//! The models by name: [`ModelKind`] and [`build`].

use std::fmt;
use std::str::FromStr;

use candle_nn::VarBuilder;

use crate::lenet::Lenet;
use crate::mlp::{Mlp, DEFAULT_MLP_HIDDEN};
use crate::model::Model;
use crate::resnet::Resnet18;
use crate::simple_cnn::SimpleCnn;

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
    /// [`convert_sync_batchnorm`](crate::convert_sync_batchnorm)).
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
