//! 16-bit tensors on CPU: candle has no bf16/f16 matrix products there, so the layers compute
//! such inputs in f32 ([`low_precision`]).

use candle_core::{DType, Result, Tensor};

/// Mixed precision on CPU (kolo-ddp's `precision` module): candle has no bf16/f16 matrix products on CPU,
/// so a layer given 16-bit CPU tensors computes `f` on f32 copies of `x` and `params` (the present
/// ones, in order) and casts the result back; `None` for other inputs. Gradients flow through the
/// casts.
pub fn low_precision(
    x: &Tensor,
    params: &[Option<&Tensor>],
    f: impl FnOnce(&[Tensor]) -> Result<Tensor>,
) -> Option<Result<Tensor>> {
    let dtype = x.dtype();
    if !(x.device().is_cpu() && matches!(dtype, DType::BF16 | DType::F16)) {
        return None;
    }
    let run = || {
        let mut ts = vec![x.to_dtype(DType::F32)?];
        for p in params.iter().flatten() {
            ts.push(p.to_dtype(DType::F32)?);
        }
        f(&ts)?.to_dtype(dtype)
    };
    Some(run())
}
