//! Per-channel `Σx` and `Σx²` of a `[B, C, S]` tensor in one pass, accumulated in f64, as a
//! differentiable op (the statistics batch normalization normalizes with).
//!
//! Composing it from candle ops (convert to f64, square, reduce twice) reads the activations
//! five times forward and about as often backward; this op reads them once forward and its
//! backward, `∂/∂x = g₁[c] + 2·x·g₂[c]`, is one element-wise pass in the input's type on CPU.
//!
//! A consumer of the sums whose own input gradient is one more element-wise pass over the same
//! input (batch normalization's) can leave it in a [`GradLink`]: this op's backward pass then
//! computes the whole input gradient in that one pass, from the sums' gradient, instead of two
//! passes and candle's addition of the two.

use std::sync::{Arc, Mutex};

use candle_core::{CpuStorage, DType, Shape, Tensor, WithDType};

use super::bn_loops;
use super::storage::{slice, Arg, CpuOp, Grads, Kernel, Output};

/// The input gradient of the op, given the input (`[B, C, S]` values) and the gradient of the sums
/// (`[Σx…, Σx²…]` in f64): what a consumer of the sums leaves in a [`GradLink`].
pub(crate) type FinishGrad = Box<dyn FnOnce(&Tensor, &[f64]) -> candle_core::Result<Tensor> + Send>;

/// Where the consumer of a [`channel_sums_linked`] op leaves, during its backward pass (which
/// runs first), how to compute the whole input gradient; the op's backward pass takes it.
#[derive(Clone, Default)]
pub(crate) struct GradLink(Arc<Mutex<Option<FinishGrad>>>);

impl GradLink {
    /// Leaves `finish` for the op's backward pass.
    pub(crate) fn set(&self, finish: FinishGrad) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(finish);
    }

    fn take(&self) -> Option<FinishGrad> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

/// `[Σx over b, s for each c…, Σx² over b, s for each c…]` (`[2C]`, f64) of `x` (`[B, C, S]`,
/// f32 or f64), differentiable.
pub fn channel_sums(x: &Tensor) -> candle_core::Result<Tensor> {
    if x.rank() != 3 {
        candle_core::bail!("channel_sums: expected [B, C, S], got {:?}", x.shape());
    }
    channel_sums_linked(x, x.dims3()?, None)
}

/// [`channel_sums`] of `x` of any shape holding `[B, C, S]` (`dims`) values in order (no reshape:
/// its gradient goes straight to `x`), whose backward pass computes the input gradient the
/// consumer left in `link`, if any (see the module notes).
pub(crate) fn channel_sums_linked(
    x: &Tensor,
    (batch, channels, per_channel): (usize, usize, usize),
    link: Option<GradLink>,
) -> candle_core::Result<Tensor> {
    if x.elem_count() != batch * channels * per_channel {
        candle_core::bail!(
            "channel_sums: {:?} does not hold [{batch}, {channels}, {per_channel}]",
            x.shape()
        );
    }
    let x = x.contiguous()?;
    if x.device().is_cpu() {
        x.apply_op1(CpuOp(ChannelSums {
            batch,
            channels,
            per_channel,
            link,
        }))
    } else {
        // No device kernel: the same math from candle ops.
        let x64 = x
            .reshape((batch, channels, per_channel))?
            .to_dtype(DType::F64)?;
        let sum = x64.sum(2)?.sum(0)?;
        let sum_sq = x64.sqr()?.sum(2)?.sum(0)?;
        Tensor::cat(&[&sum, &sum_sq], 0)
    }
}

/// Per-channel `[Σx…, Σx²…]` (f64) of a `[B, C, S]` tensor, outside the graph.
pub(crate) fn channel_sums_no_grad(x: &Tensor) -> candle_core::Result<Vec<f64>> {
    let (batch, channels, per_channel) = x.dims3()?;
    x.contiguous()?
        .apply_op1_no_bwd(&CpuOp(ChannelSums {
            batch,
            channels,
            per_channel,
            link: None,
        }))?
        .to_vec1()
}

#[derive(Clone)]
struct ChannelSums {
    batch: usize,
    channels: usize,
    per_channel: usize,
    link: Option<GradLink>,
}

impl ChannelSums {
    /// The contiguous input `x` as `T`, checked against the op's shape.
    fn input<'a, T: WithDType>(&self, x: Arg<'a>, op: &str) -> candle_core::Result<&'a [T]> {
        let x = slice::<T>(x, op)?;
        if x.len() != self.batch * self.channels * self.per_channel {
            candle_core::bail!("{op}: the input does not match its shape");
        }
        Ok(x)
    }
}

impl Kernel<1> for ChannelSums {
    fn name(&self) -> &'static str {
        "kolo-channel-sums"
    }

    fn forward<T: WithDType>(&self, [x]: [Arg<'_>; 1]) -> Output {
        let x = self.input::<T>(x, self.name())?;
        let sums = bn_loops::channel_sums(x, self.per_channel, self.channels);
        Ok((CpuStorage::F64(sums), Shape::from(2 * self.channels)))
    }

    fn backward(&self, [arg]: [&Tensor; 1], _res: &Tensor, grad: &Tensor) -> Grads<1> {
        let c = self.channels;
        let dtype = arg.dtype();
        if let Some(finish) = self.link.as_ref().and_then(GradLink::take) {
            let g: Vec<f64> = grad.to_dtype(DType::F64)?.to_vec1()?;
            return Ok([Some(finish(arg, &g)?)]);
        }
        if arg.device().is_cpu() && matches!(dtype, DType::F32 | DType::F64) {
            let grad = grad.to_dtype(DType::F64)?.contiguous()?;
            let dx = arg
                .contiguous()?
                .apply_op2_no_bwd(&grad, &CpuOp(ChannelSumsGrad(self.clone())))?;
            return Ok([Some(dx)]);
        }
        let g_sum = grad.narrow(0, 0, c)?.to_dtype(dtype)?.reshape((1, c, 1))?;
        let g_sum_sq = (grad.narrow(0, c, c)? * 2.0)?
            .to_dtype(dtype)?
            .reshape((1, c, 1))?;
        let x = arg.reshape((self.batch, c, self.per_channel))?;
        let dx = x.broadcast_mul(&g_sum_sq)?.broadcast_add(&g_sum)?;
        Ok([Some(dx.reshape(arg.shape())?)])
    }
}

/// `(x, [g₁…, g₂…]) -> x·(2·g₂[c]) + g₁[c]`: the input gradient of [`ChannelSums`] in one pass.
struct ChannelSumsGrad(ChannelSums);

impl Kernel<2> for ChannelSumsGrad {
    fn name(&self) -> &'static str {
        "kolo-channel-sums-grad"
    }

    fn forward<T: WithDType>(&self, [x, g]: [Arg<'_>; 2]) -> Output {
        let (op, c) = (self.name(), self.0.channels);
        let g = slice::<f64>(g, op)?;
        if g.len() != 2 * c {
            candle_core::bail!("{op}: {} gradient values for {c} channels", g.len());
        }
        let scale: Vec<T> = g[c..].iter().map(|v| T::from_f64(v * 2.0)).collect();
        let shift: Vec<T> = g[..c].iter().map(|&v| T::from_f64(v)).collect();
        let dx = bn_loops::normalize(
            self.0.input(x, op)?,
            None,
            &scale,
            &shift,
            self.0.per_channel,
            false,
        );
        Ok((T::to_cpu_storage_owned(dx), x.1.shape().clone()))
    }
}
