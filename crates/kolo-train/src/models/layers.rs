//! Layer constructors with PyTorch's default initialization, and small shared helpers.
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

/// `U(-1/√fan_in, 1/√fan_in)`: PyTorch's default for both weights and biases of `nn.Linear`
/// and `nn.Conv2d`.
fn torch_default_init(fan_in: usize) -> Init {
    let bound = 1.0 / (fan_in.max(1) as f64).sqrt();
    Init::Uniform {
        lo: -bound,
        up: bound,
    }
}

/// `nn.Linear(in_dim, out_dim)` with PyTorch's default initialization; parameters are named
/// `weight` (`[out_dim, in_dim]`) and `bias` (`[out_dim]`) under `vb`'s prefix.
/// A fully connected layer (candle-nn's `Linear`), computing in f32 when given 16-bit CPU tensors
/// (see [`crate::ops::low_precision`]).
#[derive(Debug, Clone)]
pub struct Linear(candle_nn::Linear);

impl Linear {
    fn new(weight: Tensor, bias: Option<Tensor>) -> Self {
        Linear(candle_nn::Linear::new(weight, bias))
    }
}

impl Module for Linear {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let params = [Some(self.0.weight()), self.0.bias()];
        match crate::ops::low_precision(x, &params, |t| {
            candle_nn::Linear::new(t[1].clone(), t.get(2).cloned()).forward(&t[0])
        }) {
            Some(y) => y,
            None => self.0.forward(x),
        }
    }
}

pub(crate) fn linear(in_dim: usize, out_dim: usize, vb: VarBuilder) -> Result<Linear> {
    let init = torch_default_init(in_dim);
    let weight = vb.get_with_hints((out_dim, in_dim), "weight", init)?;
    let bias = vb.get_with_hints(out_dim, "bias", init)?;
    Ok(Linear::new(weight, Some(bias)))
}

/// `nn.Conv2d(c_in, c_out, kernel, stride, padding)` (with bias) and PyTorch's default
/// initialization; parameters are named `weight` (`[c_out, c_in, k, k]`) and `bias`. The layer
/// computes with [`super::conv2d`] (im2col + GEMM) rather than candle's slower CPU `conv2d`.
pub(crate) fn conv2d(
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

/// A convolution layer with bias using [`super::conv2d`]; the same parameters as
/// `candle_nn::Conv2d`.
#[derive(Debug, Clone)]
pub(crate) struct Conv2d {
    weight: Tensor,
    bias: Tensor,
    stride: usize,
    padding: usize,
}

impl Conv2d {
    pub(crate) fn new(weight: Tensor, bias: Tensor, stride: usize, padding: usize) -> Self {
        Self {
            weight,
            bias,
            stride,
            padding,
        }
    }
}

impl Conv2d {
    /// `relu(self.forward(x))` as one op ([`crate::ops::conv2d_relu`]).
    pub(crate) fn forward_relu(&self, x: &Tensor) -> Result<Tensor> {
        crate::ops::conv2d_relu(x, &self.weight, Some(&self.bias), self.stride, self.padding)
    }
}

impl Module for Conv2d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        crate::ops::conv2d(x, &self.weight, Some(&self.bias), self.stride, self.padding)
    }
}

/// Error for an input whose spatial size is too small for a model.
pub(crate) fn too_small(model: &str, input_shape: [usize; 3], stage: &str) -> candle_core::Error {
    let [c, h, w] = input_shape;
    candle_core::Error::Msg(format!(
        "{model}: input {c}x{h}x{w} is too small (spatial size drops to zero at {stage})"
    ))
}

/// Checks that constructor arguments are non-degenerate.
pub(crate) fn check_dims(model: &str, input_shape: [usize; 3], classes: usize) -> Result<()> {
    let [c, h, w] = input_shape;
    if c == 0 || h == 0 || w == 0 {
        candle_core::bail!("{model}: input shape {c}x{h}x{w} has a zero dimension");
    }
    if classes == 0 {
        candle_core::bail!("{model}: number of classes must be positive");
    }
    Ok(())
}

/// Checks that `x` is a `[B, C, H, W]` batch matching the model's input shape.
pub(crate) fn check_input(model: &str, x: &Tensor, input_shape: [usize; 3]) -> Result<()> {
    let dims = x.dims();
    if dims.len() != 4 || dims[1..] != input_shape {
        let [c, h, w] = input_shape;
        candle_core::bail!(
            "{model}: expected input of shape [B, {c}, {h}, {w}], got {:?}",
            x.shape()
        );
    }
    Ok(())
}
