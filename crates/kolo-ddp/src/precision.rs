//! Mixed precision: the model's matrix products compute in a 16-bit type while the optimizer
//! keeps f32 master weights (NVIDIA Apex's `O2` / `torch.autocast` in spirit).
//!
//! [`Precision::Bf16`] computes one of three ways ([`Precision::apply`] picks, [`Precision::tensor_dtype`]
//! says which):
//!
//! - **on a CPU with a bf16 unit faster than its f32 FMAs** (AMX; AVX512-BF16 on AMD EPYC): the
//!   model stays f32 and kolo's convolutions round their matrix products' operands to bf16 as they
//!   pack them, multiplying on that unit and summing in f32
//!   ([`kolo_nn::ops::set_matmul_precision`]) — autocast's arithmetic at the GEMM, with no
//!   conversion passes between layers (which cost more than bf16 saved).
//!   Winograd F(4×4, 3×3) layers keep f32 products: its transforms scale bf16's rounding errors up
//!   (6e-2 of the largest output against 3e-3 elsewhere). Activations stay f32, so memory is not
//!   halved;
//! - **on a CPU whose only bf16 unit is slower than its f32 FMAs** (AVX512-BF16 without AMX on the
//!   Intel Xeons measured: half the f32 rate, [`kolo_nn::ops::bf16_slower_than_f32`]), **or that
//!   has no bf16 unit** (AMD EPYC to Zen 3, Intel Xeons to Ice Lake;
//!   [`kolo_nn::ops::bf16_without_a_unit`]): in f32, as `--precision f32` does — bf16 could only
//!   be slower there
//!   (`KOLO_BF16_GEMM=avx512bf16` takes a slow unit anyway; `KOLO_BF16_GEMM=f32` computes around
//!   bf16 conversions, as below);
//! - **elsewhere** (a GPU, or `KOLO_BF16_GEMM=f32` on a CPU): every step builds the model from
//!   [`Ddp::var_builder_in`]`(BF16)`, so each trainable parameter enters the graph as an f32
//!   master weight cast to bf16; the input is cast to bf16, the logits back to f32 for the loss.
//!   Backward runs through the casts, so gradients reach the master weights (and the gradient
//!   all-reduce) in f32. BatchNorm statistics are computed in f64 and the running statistics stay
//!   f32.
//!
//! Either way the optimizer updates f32 weights, so small updates are not lost to bf16's 8-bit
//! mantissa, and bf16 has f32's exponent range, so no loss scaling is needed.
//!
//! fp16 is not offered: on CPU candle has no faster fp16 kernels than bf16's, and fp16 would need
//! dynamic loss scaling for its narrow exponent range.
//!
//! [`Ddp::var_builder_in`]: crate::ddp::Ddp::var_builder_in

use std::fmt;
use std::str::FromStr;

use candle_core::{DType, Device};
use kolo_nn::ops::{
    bf16_computes_in_f32, matmul_precision, set_matmul_precision, Bf16Path, MatmulPrecision,
};
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

    /// Sets up this precision for a run on `device`, once, before the first step: for
    /// [`Precision::Bf16`] on a CPU, bf16 matrix products on its bf16 unit
    /// ([`kolo_nn::ops::set_matmul_precision`]), returning the unit; `None` where the run computes
    /// otherwise (f32, a GPU, a CPU without a bf16 unit or with one slower than f32). Errors if
    /// `KOLO_BF16_GEMM` names a unit this CPU lacks.
    pub fn apply(self, device: &Device) -> Result<Option<Bf16Path>> {
        let wanted = if self == Precision::Bf16 && device.is_cpu() {
            MatmulPrecision::Bf16
        } else {
            MatmulPrecision::Highest
        };
        set_matmul_precision(wanted).map_err(|e| TrainError::InvalidArgument {
            arg: "precision",
            reason: e.to_string(),
        })
    }

    /// The type of the tensors the model computes on on `device` (`None`: f32): bf16 for
    /// [`Precision::Bf16`] unless kolo's matrix products round to bf16 themselves there
    /// ([`Precision::apply`] set that up on a CPU with a bf16 unit) or the CPU has no bf16 unit
    /// or only one slower than f32 ([`bf16_computes_in_f32`]).
    pub fn tensor_dtype(self, device: &Device) -> Option<DType> {
        match self {
            Precision::F32 => None,
            Precision::Bf16
                if device.is_cpu()
                    && (matmul_precision() == MatmulPrecision::Bf16 || bf16_computes_in_f32()) =>
            {
                None
            }
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
