//! Collectives as differentiable tensor operations.
//!
//! [`all_reduce_sum`] sums a tensor over all ranks of a [`Communicator`] and takes part in
//! candle's autograd: its backward pass all-reduces (sums) the incoming gradient. If every rank
//! computes `y = Σ_r x_r` and a loss `L = Σ_r L_r(y)` is spread over the ranks, the gradient
//! each rank needs for its own `x_r` is `∂L/∂y = Σ_r ∂L_r/∂y`: exactly the all-reduce of the
//! gradients the ranks hold locally. This is what makes [`SyncBatchNorm`] train correctly
//! across ranks.
//!
//! Every rank must apply the operation (and run backward through it) in the same order, as for
//! any collective. That holds when all ranks build the same graph, whatever their local batch
//! size — even an empty one.
//!
//! A failed collective surfaces as a candle error carrying kolo's message, on the forward and
//! on the backward pass alike; it never panics.
//!
//! [`SyncBatchNorm`]: crate::batch_norm::BatchNorm

use candle_core::{CpuStorage, CustomOp1, DType, Device, Layout, Shape, Tensor};
use kolo::{Communicator, ReduceOp};

/// `Σ_ranks x`, differentiable: the backward pass is the all-reduce (sum) of the gradient.
///
/// `x` must be f32 or f64 and have the same shape on every rank. Tensors on another device
/// than the CPU travel through the CPU for the collective.
pub fn all_reduce_sum(x: &Tensor, comm: &Communicator) -> candle_core::Result<Tensor> {
    check_dtype(x.dtype())?;
    let op = AllReduceSum { comm: comm.clone() };
    if x.device().is_cpu() {
        x.contiguous()?.apply_op1(op)
    } else {
        x.to_device(&Device::Cpu)?
            .contiguous()?
            .apply_op1(op)?
            .to_device(x.device())
    }
}

/// Sums `buf` over all ranks in place (the collective inside the differentiable ops); the
/// error names the rank and the `pass` ("forward" / "backward").
fn reduce_sum_in_place<T: kolo::Element>(
    comm: &Communicator,
    buf: &mut [T],
    pass: &str,
) -> candle_core::Result<()> {
    comm.all_reduce(buf, ReduceOp::Sum).map_err(|e| {
        candle_core::Error::Msg(format!(
            "kolo all_reduce_sum ({pass} pass) on rank {}: {e}",
            comm.rank()
        ))
    })
}

fn check_dtype(dtype: DType) -> candle_core::Result<()> {
    match dtype {
        DType::F32 | DType::F64 => Ok(()),
        other => {
            candle_core::bail!("kolo all_reduce_sum: tensors must be f32 or f64, not {other:?}")
        }
    }
}

/// The custom op behind [`all_reduce_sum`].
struct AllReduceSum {
    comm: Communicator,
}

impl AllReduceSum {
    fn reduce<T: kolo::Element>(&self, buf: &mut [T], pass: &str) -> candle_core::Result<()> {
        reduce_sum_in_place(&self.comm, buf, pass)
    }
}

/// The elements of a contiguous CPU tensor's storage ([`all_reduce_sum`] makes it so).
fn contiguous<T: Copy>(v: &[T], layout: &Layout) -> candle_core::Result<Vec<T>> {
    match layout.contiguous_offsets() {
        Some((a, b)) => Ok(v[a..b].to_vec()),
        None => candle_core::bail!("kolo all_reduce_sum: the tensor is not contiguous"),
    }
}

impl CustomOp1 for AllReduceSum {
    fn name(&self) -> &'static str {
        "kolo-all-reduce-sum"
    }

    fn cpu_fwd(
        &self,
        storage: &CpuStorage,
        layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let out = match storage {
            CpuStorage::F32(v) => {
                let mut buf = contiguous(v, layout)?;
                self.reduce(&mut buf, "forward")?;
                CpuStorage::F32(buf)
            }
            CpuStorage::F64(v) => {
                let mut buf = contiguous(v, layout)?;
                self.reduce(&mut buf, "forward")?;
                CpuStorage::F64(buf)
            }
            _ => candle_core::bail!("kolo all_reduce_sum: tensors must be f32 or f64"),
        };
        Ok((out, layout.shape().clone()))
    }

    fn bwd(
        &self,
        _arg: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<Option<Tensor>> {
        let flat = grad.flatten_all()?;
        let summed = match grad.dtype() {
            DType::F32 => {
                let mut buf = flat.to_vec1::<f32>()?;
                self.reduce(&mut buf, "backward")?;
                Tensor::from_vec(buf, grad.shape(), grad.device())?
            }
            DType::F64 => {
                let mut buf = flat.to_vec1::<f64>()?;
                self.reduce(&mut buf, "backward")?;
                Tensor::from_vec(buf, grad.shape(), grad.device())?
            }
            other => candle_core::bail!(
                "kolo all_reduce_sum: gradients must be f32 or f64, not {other:?}"
            ),
        };
        Ok(Some(summed))
    }
}
