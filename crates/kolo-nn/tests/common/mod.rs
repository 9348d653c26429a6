//! Helpers of the kernel tests.
// Each test binary uses some of them.
#![allow(dead_code)]

use candle_core::{DType, Device, Result, Tensor};

/// Largest `|a − b|`.
pub fn max_abs_diff(a: &Tensor, b: &Tensor) -> Result<f64> {
    (a - b)?
        .abs()?
        .flatten_all()?
        .max(0)?
        .to_dtype(DType::F64)?
        .to_scalar::<f64>()
}

/// Largest `|a − b|` relative to the largest `|b|` (at least 1e-12).
pub fn rel_diff(a: &Tensor, b: &Tensor) -> Result<f64> {
    let scale = b
        .abs()?
        .flatten_all()?
        .max(0)?
        .to_dtype(DType::F64)?
        .to_scalar::<f64>()?
        .max(1e-12);
    Ok(max_abs_diff(a, b)? / scale)
}

/// A variable of `shape` and `dtype` with standard normal values.
pub fn var(shape: &[usize], dtype: DType) -> Result<candle_core::Var> {
    candle_core::Var::from_tensor(&Tensor::randn(0f64, 1., shape, &Device::Cpu)?.to_dtype(dtype)?)
}
