//! Gradient clipping by the global norm (PyTorch's `clip_grad_norm_`), on Ddp's averaged gradients
//! and on ZeRO's sharded ones.
//!
//! After Ddp's backward every rank holds the same averaged gradients, so every rank computes the
//! same norm with no communication ([`clip_grad_norm`]; [`DistributedOptimizer`] does it before
//! each step with [`DistributedOptimizer::set_max_grad_norm`]). Under ZeRO's own reduce-scatter a
//! rank holds only its shard's gradients: the squares are summed over ranks first
//! ([`ShardedOptimizer::set_max_grad_norm`](crate::optim::ShardedOptimizer::set_max_grad_norm)).
//!
//! [`DistributedOptimizer`]: crate::distributed::DistributedOptimizer
//! [`DistributedOptimizer::set_max_grad_norm`]: crate::distributed::DistributedOptimizer::set_max_grad_norm

use candle_core::backprop::GradStore;
use candle_core::{DType, Var};

use crate::error::{Result, TrainError};

/// Checks a `max_norm` setting: finite and above zero.
pub(crate) fn check_max_norm(max_norm: Option<f64>) -> Result<()> {
    match max_norm {
        Some(m) if !(m.is_finite() && m > 0.0) => Err(TrainError::InvalidArgument {
            arg: "max_grad_norm",
            reason: format!("must be a finite number above 0, got {m}"),
        }),
        _ => Ok(()),
    }
}

/// The sum of the squares of the gradients of `vars` in `grads` (f64 accumulation).
pub(crate) fn squared_norm<'a>(
    grads: &GradStore,
    vars: impl IntoIterator<Item = &'a Var>,
) -> Result<f64> {
    let mut sum = 0.0;
    for v in vars {
        if let Some(g) = grads.get(v.as_tensor()) {
            sum += g
                .to_dtype(DType::F64)?
                .sqr()?
                .sum_all()?
                .to_scalar::<f64>()?;
        }
    }
    Ok(sum)
}

/// Scales the gradients of `vars` in `grads` by `max_norm / (norm + 1e-6)` when that is below 1,
/// `norm` being the L2 norm of all of them together (`squared` its square, summed however the
/// caller's gradients are spread); returns `norm`. A NaN or infinite norm is an error naming it
/// (the step would write NaN into every parameter).
pub(crate) fn scale_to<'a>(
    grads: &mut GradStore,
    vars: impl IntoIterator<Item = &'a Var>,
    squared: f64,
    max_norm: f64,
) -> Result<f64> {
    let norm = squared.sqrt();
    if !norm.is_finite() {
        return Err(TrainError::InvalidArgument {
            arg: "gradients",
            reason: format!(
                "their norm is {norm} (a NaN or infinity in a gradient): the step would make \
                 every parameter {norm}"
            ),
        });
    }
    let factor = max_norm / (norm + 1e-6);
    if factor < 1.0 {
        for v in vars {
            if let Some(g) = grads.get(v.as_tensor()) {
                let scaled = g.affine(factor, 0.0)?;
                grads.insert(v.as_tensor(), scaled);
            }
        }
    }
    Ok(norm)
}

/// Clips the gradients of `vars` in `grads` to the global L2 norm `max_norm`, as PyTorch's
/// `torch.nn.utils.clip_grad_norm_` does (every gradient times `max_norm / (norm + 1e-6)` when that
/// is below 1), and returns the norm before clipping. Call it on Ddp's averaged gradients (the same
/// on every rank, so every rank clips alike). A NaN or infinite norm is an error, as is a
/// `max_norm` that is not a finite number above 0.
///
/// ```
/// # use candle_core::{Device, Tensor, Var};
/// # fn main() -> kolo_ddp::Result<()> {
/// let w = Var::new(&[0.0f32, 0.0], &Device::Cpu)?;
/// let loss = (w.as_tensor() * &Tensor::new(&[3.0f32, 4.0], &Device::Cpu)?)?.sum_all()?;
/// let mut grads = loss.backward()?; // gradient [3, 4]: norm 5
/// let norm = kolo_ddp::clip::clip_grad_norm(&mut grads, &[w.clone()], 1.0)?;
/// assert_eq!(norm, 5.0);
/// let g = grads.get(w.as_tensor()).unwrap().to_vec1::<f32>()?;
/// assert!((g[0] - 0.6).abs() < 1e-5 && (g[1] - 0.8).abs() < 1e-5);
/// # Ok(()) }
/// ```
pub fn clip_grad_norm(grads: &mut GradStore, vars: &[Var], max_norm: f64) -> Result<f64> {
    check_max_norm(Some(max_norm))?;
    clip_local(grads, vars, max_norm)
}

/// [`clip_grad_norm`] of gradients every rank holds whole (no communication), `max_norm` checked.
pub(crate) fn clip_local<'a>(
    grads: &mut GradStore,
    vars: impl IntoIterator<Item = &'a Var> + Clone,
    max_norm: f64,
) -> Result<f64> {
    let squared = squared_norm(grads, vars.clone())?;
    scale_to(grads, vars, squared, max_norm)
}
