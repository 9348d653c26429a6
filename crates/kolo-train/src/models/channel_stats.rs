//! Per-channel `Σx` and `Σx²` of a `[B, C, S]` tensor in one pass, accumulated in f64, as a
//! differentiable op (the statistics [`BatchNorm`](super::BatchNorm) normalizes with).
//!
//! Composing it from candle ops (convert to f64, square, reduce twice) reads the activations
//! five times forward and about as often backward; this op reads them once forward and its
//! backward, `∂/∂x = g₁[c] + 2·x·g₂[c]`, is two element-wise passes in the input's type.

use candle_core::{CpuStorage, CustomOp1, DType, Layout, Shape, Tensor};

/// `[Σx over b, s for each c…, Σx² over b, s for each c…]` (`[2C]`, f64) of `x` (`[B, C, S]`,
/// f32 or f64).
pub(crate) fn channel_sums(x: &Tensor) -> candle_core::Result<Tensor> {
    if x.rank() != 3 {
        candle_core::bail!("channel_sums: expected [B, C, S], got {:?}", x.shape());
    }
    let x = x.contiguous()?;
    let (batch, channels, per_channel) = x.dims3()?;
    if x.device().is_cpu() {
        x.apply_op1(ChannelSums {
            batch,
            channels,
            per_channel,
        })
    } else {
        // No device kernel: the same math from candle ops.
        let x64 = x.to_dtype(DType::F64)?;
        let sum = x64.sum(2)?.sum(0)?;
        let sum_sq = x64.sqr()?.sum(2)?.sum(0)?;
        Tensor::cat(&[&sum, &sum_sq], 0)
    }
}

/// Per-channel `[Σx…, Σx²…]` (f64) of a `[B, C, S]` tensor, outside the graph.
pub(crate) fn channel_sums_no_grad(x: &Tensor) -> candle_core::Result<Vec<f64>> {
    let (batch, channels, per_channel) = x.dims3()?;
    x.contiguous()?
        .apply_op1_no_bwd(&ChannelSums {
            batch,
            channels,
            per_channel,
        })?
        .to_vec1()
}

struct ChannelSums {
    batch: usize,
    channels: usize,
    per_channel: usize,
}

impl ChannelSums {
    fn sums<T: candle_core::WithDType>(&self, x: &[T]) -> Vec<f64> {
        crate::ops::channel_sums(x, self.per_channel, self.channels)
    }
}

impl CustomOp1 for ChannelSums {
    fn name(&self) -> &'static str {
        "kolo-channel-sums"
    }

    fn cpu_fwd(
        &self,
        storage: &CpuStorage,
        layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let Some((a, b)) = layout.contiguous_offsets() else {
            candle_core::bail!("channel_sums: the input is not contiguous");
        };
        if b - a != self.batch * self.channels * self.per_channel {
            candle_core::bail!("channel_sums: the input does not match its shape");
        }
        let out = match storage {
            CpuStorage::F32(v) => self.sums(&v[a..b]),
            CpuStorage::F64(v) => self.sums(&v[a..b]),
            _ => candle_core::bail!("channel_sums: the input must be f32 or f64"),
        };
        Ok((CpuStorage::F64(out), Shape::from(2 * self.channels)))
    }

    fn bwd(
        &self,
        arg: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<Option<Tensor>> {
        let c = self.channels;
        let dtype = arg.dtype();
        let g_sum = grad.narrow(0, 0, c)?.to_dtype(dtype)?.reshape((1, c, 1))?;
        let g_sum_sq = (grad.narrow(0, c, c)? * 2.0)?
            .to_dtype(dtype)?
            .reshape((1, c, 1))?;
        Ok(Some(arg.broadcast_mul(&g_sum_sq)?.broadcast_add(&g_sum)?))
    }
}
