//! ReLU with a one-pass backward.
//!
//! candle 0.11 differentiates `relu` through four full-size passes (a zero tensor, a `≥ 0`
//! comparison, a conversion of the mask to floats, a multiplication); here the gradient is one
//! pass over the upstream gradient and the output: `g · [y > 0]` (PyTorch's convention: zero
//! gradient at 0). NaN propagates forward, as in PyTorch (`relu(NaN) = NaN`), so a diverging loss
//! stays visible.
//!
//! Non-CPU tensors and dtypes other than f32 / f64 fall back to candle's `relu`.

use candle_core::{DType, Result, Tensor, WithDType};

use super::storage::{same_len, slice, Arg, CpuOp, Grads, Kernel, Output};

/// `max(x, 0)` (NaN stays NaN), differentiable, with a one-pass backward on CPU f32 / f64.
pub fn relu(x: &Tensor) -> Result<Tensor> {
    if !x.device().is_cpu() || !matches!(x.dtype(), DType::F32 | DType::F64) {
        return x.relu();
    }
    x.contiguous()?.apply_op1(CpuOp(Relu))
}

/// `grad · [y > 0]`: the gradient of ReLU's input from that of its output `y` (CPU, f32 / f64,
/// no gradient of its own).
pub(crate) fn relu_grad(grad: &Tensor, y: &Tensor) -> Result<Tensor> {
    grad.contiguous()?
        .apply_op2_no_bwd(&y.contiguous()?, &CpuOp(ReluGrad))
}

/// `v` if it is positive or NaN, else 0.
#[inline(always)]
pub(super) fn pos<T: WithDType>(v: T, zero: T) -> T {
    // NaN (unordered) stays.
    if v <= zero {
        zero
    } else {
        v
    }
}

struct Relu;

impl Kernel<1> for Relu {
    fn name(&self) -> &'static str {
        "kolo-relu"
    }

    fn forward<T: WithDType>(&self, [x]: [Arg<'_>; 1]) -> Output {
        let y = slice::<T>(x, self.name())?
            .iter()
            .map(|&v| pos(v, T::zero()));
        Ok((T::to_cpu_storage_owned(y.collect()), x.1.shape().clone()))
    }

    fn backward(&self, _: [&Tensor; 1], res: &Tensor, grad: &Tensor) -> Grads<1> {
        Ok([Some(relu_grad(grad, res)?)])
    }
}

/// `(g, y) -> g · [y > 0]`.
struct ReluGrad;

impl Kernel<2> for ReluGrad {
    fn name(&self) -> &'static str {
        "kolo-relu-grad"
    }

    fn forward<T: WithDType>(&self, [g, y]: [Arg<'_>; 2]) -> Output {
        let op = self.name();
        let (gv, yv) = same_len(slice::<T>(g, op)?, slice::<T>(y, op)?, op)?;
        let zero = T::zero();
        let out = gv
            .iter()
            .zip(yv)
            .map(|(&g, &y)| if y > zero { g } else { zero });
        Ok((T::to_cpu_storage_owned(out.collect()), g.1.shape().clone()))
    }
}
