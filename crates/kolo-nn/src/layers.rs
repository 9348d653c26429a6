//! Layers with PyTorch's default initialization: [`linear`] and [`conv2d`], computing with this
//! crate's kernels ([`crate::ops`]).
//!
//! candle-nn's `linear` / `conv2d` initialize weights with Kaiming-*normal* (gain √2), whose
//! standard deviation is √6 ≈ 2.45× larger than PyTorch's default
//! (`kaiming_uniform_(a=√5)`, i.e. `U(-1/√fan_in, 1/√fan_in)`), and `conv2d` draws its bias from
//! `U(-1/√c_in, 1/√c_in)` instead of `U(-1/√fan_in, 1/√fan_in)`. With SGD + momentum at the
//! learning rates used by the PyTorch reference runs, the larger initialization trains
//! noticeably worse, so these constructors reproduce PyTorch's defaults exactly (only the
//! initial values differ; the resulting layers are plain candle-nn layers).

use candle_core::Module;
use candle_core::{Result, Tensor};
use candle_nn::{Init, VarBuilder};

use crate::ops;

/// `U(-1/√fan_in, 1/√fan_in)`: PyTorch's default for both weights and biases of `nn.Linear`
/// and `nn.Conv2d`.
fn torch_default_init(fan_in: usize) -> Init {
    let bound = 1.0 / (fan_in.max(1) as f64).sqrt();
    Init::Uniform {
        lo: -bound,
        up: bound,
    }
}

/// A fully connected layer (candle-nn's `Linear`: `weight` `[out_dim, in_dim]`, optional `bias`),
/// computing with [`ops::linear`]: one op with its own backward pass on kolo's GEMM, whose
/// products run on the CPU's bf16 unit under
/// [`MatmulPrecision::Bf16`](crate::ops::MatmulPrecision::Bf16); 16-bit CPU tensors compute in f32
/// (see [`crate::ops::low_precision`]).
#[derive(Debug, Clone)]
pub struct Linear(candle_nn::Linear);

impl Linear {
    /// A layer over `weight` (`[out_dim, in_dim]`) and an optional `bias` (`[out_dim]`).
    pub fn new(weight: Tensor, bias: Option<Tensor>) -> Self {
        Linear(candle_nn::Linear::new(weight, bias))
    }
}

impl Module for Linear {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        ops::linear(x, self.0.weight(), self.0.bias())
    }
}

/// `nn.Linear(in_dim, out_dim)` with PyTorch's default initialization; parameters are named
/// `weight` (`[out_dim, in_dim]`) and `bias` (`[out_dim]`) under `vb`'s prefix.
pub fn linear(in_dim: usize, out_dim: usize, vb: VarBuilder) -> Result<Linear> {
    let init = torch_default_init(in_dim);
    let weight = vb.get_with_hints((out_dim, in_dim), "weight", init)?;
    let bias = vb.get_with_hints(out_dim, "bias", init)?;
    Ok(Linear::new(weight, Some(bias)))
}

/// `nn.Conv2d(c_in, c_out, kernel, stride, padding)` (with bias) and PyTorch's default
/// initialization; parameters are named `weight` (`[c_out, c_in, k, k]`) and `bias`. The layer
/// computes with [`ops::conv2d`] (Winograd or im2col + GEMM) rather than candle's slower CPU
/// `conv2d`.
pub fn conv2d(
    c_in: usize,
    c_out: usize,
    kernel: usize,
    stride: usize,
    padding: usize,
    vb: VarBuilder,
) -> Result<Conv2d> {
    let init = torch_default_init(c_in * kernel * kernel);
    let weight = vb.get_with_hints((c_out, c_in, kernel, kernel), "weight", init)?;
    let bias = vb.get_with_hints(c_out, "bias", init)?;
    Ok(Conv2d::new(weight, bias, stride, padding))
}

/// A convolution layer with bias using [`ops::conv2d`]; the same parameters as
/// `candle_nn::Conv2d`.
#[derive(Debug, Clone)]
pub struct Conv2d {
    weight: Tensor,
    bias: Tensor,
    stride: usize,
    padding: usize,
}

impl Conv2d {
    /// A layer over `weight` (`[c_out, c_in, k, k]`) and `bias` (`[c_out]`).
    pub fn new(weight: Tensor, bias: Tensor, stride: usize, padding: usize) -> Self {
        Self {
            weight,
            bias,
            stride,
            padding,
        }
    }
}

impl Conv2d {
    /// `relu(self.forward(x))` as one op ([`ops::conv2d_relu`]).
    pub fn forward_relu(&self, x: &Tensor) -> Result<Tensor> {
        ops::conv2d_relu(x, &self.weight, Some(&self.bias), self.stride, self.padding)
    }
}

impl Module for Conv2d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        ops::conv2d(x, &self.weight, Some(&self.bias), self.stride, self.padding)
    }
}
