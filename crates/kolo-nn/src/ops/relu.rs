//! ReLU with a one-pass backward.
//!
//! candle 0.11 differentiates `relu` through four full-size passes (a zero tensor, a `≥ 0`
//! comparison, a conversion of the mask to floats, a multiplication); here the gradient is one
//! pass over the upstream gradient and the output: `g · [y > 0]` (PyTorch's convention: zero
//! gradient at 0). NaN propagates forward, as in PyTorch (`relu(NaN) = NaN`), so a diverging loss
//! stays visible.
//!
//! Non-CPU tensors and dtypes other than f32 / f64 fall back to candle's `relu`.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp1, CustomOp2, DType, Layout, Result, Shape, Tensor};

use super::slices::{contiguous, same_len};

/// `max(x, 0)` (NaN stays NaN), differentiable, with a one-pass backward on CPU f32 / f64.
pub fn relu(x: &Tensor) -> Result<Tensor> {
    if !x.device().is_cpu() || !matches!(x.dtype(), DType::F32 | DType::F64) {
        return x.relu();
    }
    x.contiguous()?.apply_op1(Relu)
}

/// `v` if it is positive or NaN, else 0.
#[inline(always)]
pub(super) fn pos<T: candle_core::WithDType>(v: T, zero: T) -> T {
    // NaN (unordered) stays.
    if v <= zero {
        zero
    } else {
        v
    }
}

struct Relu;

impl CustomOp1 for Relu {
    fn name(&self) -> &'static str {
        "kolo-relu"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let out = match storage {
            CpuStorage::F32(v) => CpuStorage::F32(
                contiguous(v, layout, "kolo-relu")?
                    .iter()
                    .map(|&v| pos(v, 0.0))
                    .collect(),
            ),
            CpuStorage::F64(v) => CpuStorage::F64(
                contiguous(v, layout, "kolo-relu")?
                    .iter()
                    .map(|&v| pos(v, 0.0))
                    .collect(),
            ),
            other => candle_core::bail!("kolo-relu: unsupported dtype {:?}", other.dtype()),
        };
        Ok((out, layout.shape().clone()))
    }

    fn bwd(&self, _arg: &Tensor, res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(grad.contiguous()?.apply_op2_no_bwd(res, &ReluGrad)?))
    }
}

/// `(g, y) -> g · [y > 0]`.
pub(crate) struct ReluGrad;

fn relu_grad<T: candle_core::WithDType>(g: &[T], y: &[T]) -> Vec<T> {
    let zero = T::from_f64(0.0);
    g.iter()
        .zip(y)
        .map(|(&g, &y)| if y > zero { g } else { zero })
        .collect()
}

impl CustomOp2 for ReluGrad {
    fn name(&self) -> &'static str {
        "kolo-relu-grad"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        const OP: &str = "kolo-relu-grad";
        let out = match (s1, s2) {
            (CpuStorage::F32(g), CpuStorage::F32(y)) => {
                let (g, y) = same_len(contiguous(g, l1, OP)?, contiguous(y, l2, OP)?, OP)?;
                CpuStorage::F32(relu_grad(g, y))
            }
            (CpuStorage::F64(g), CpuStorage::F64(y)) => {
                let (g, y) = same_len(contiguous(g, l1, OP)?, contiguous(y, l2, OP)?, OP)?;
                CpuStorage::F64(relu_grad(g, y))
            }
            (g, y) => {
                candle_core::bail!("{OP}: unsupported dtypes {:?}, {:?}", g.dtype(), y.dtype())
            }
        };
        Ok((out, l1.shape().clone()))
    }
}
