//! Mixed precision: the model computes forward and backward in a 16-bit type while the optimizer
//! keeps f32 master weights (NVIDIA Apex's `O2` / `torch.autocast` in spirit, by casting the
//! parameters rather than per op).
//!
//! [`Precision::Bf16`]: every step builds the model from [`Ddp::var_builder_in`]`(BF16)`, so each
//! trainable parameter enters the graph as an f32 master weight cast to bf16; the input is cast to
//! bf16, the logits back to f32 for the loss. Backward runs through the casts, so gradients reach
//! the master weights (and the gradient all-reduce) in f32, and the optimizer updates f32 weights:
//! small updates are not lost to bf16's 8-bit mantissa. bf16 has f32's exponent range, so no loss
//! scaling is needed. BatchNorm statistics are computed in f64 and the running statistics stay f32.
//!
//! fp16 is not offered: on CPU candle has no faster fp16 kernels than bf16's, and fp16 would need
//! dynamic loss scaling for its narrow exponent range.
//!
//! [`Ddp::var_builder_in`]: crate::ddp::Ddp::var_builder_in

use std::fmt;
use std::str::FromStr;

use candle_core::DType;
use serde::{Deserialize, Serialize};

use crate::error::{Result, TrainError};

/// The type forward and backward compute in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// Everything in f32 (the default).
    #[default]
    F32,
    /// bf16 compute, f32 master weights and gradients.
    Bf16,
}

impl Precision {
    /// The compute type, `None` for plain f32.
    pub fn compute_dtype(self) -> Option<DType> {
        match self {
            Precision::F32 => None,
            Precision::Bf16 => Some(DType::BF16),
        }
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Precision::F32 => "f32",
            Precision::Bf16 => "bf16",
        })
    }
}

impl FromStr for Precision {
    type Err = TrainError;

    /// Parses `f32` (`fp32`, `32`) or `bf16` (case-insensitive); fp16 and anything else are
    /// [`TrainError::InvalidArgument`] saying why.
    fn from_str(s: &str) -> Result<Self> {
        let invalid = |reason: String| TrainError::InvalidArgument {
            arg: "precision",
            reason,
        };
        match s.to_ascii_lowercase().as_str() {
            "f32" | "fp32" | "32" => Ok(Precision::F32),
            "bf16" => Ok(Precision::Bf16),
            "fp16" | "f16" => Err(invalid(
                "fp16 is not supported on CPU (no faster kernels than bf16, and it needs loss \
                 scaling); use bf16"
                    .into(),
            )),
            other => Err(invalid(format!(
                "unknown precision '{other}': expected f32 or bf16"
            ))),
        }
    }
}
