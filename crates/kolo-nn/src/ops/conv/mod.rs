//! A faster CPU 2-D convolution with a matching backward pass: Winograd F(4×4, 3×3) or F(2×2,
//! 3×3) for the 3×3 stride-1 convolutions where one pays ([`super::winograd`]; the transformed
//! kernel of the forward pass is kept for the backward pass), im2col + GEMM chunk by chunk of
//! samples for the others.
//!
//! candle 0.11's CPU `conv2d` is slow for the small, shallow convolutions of LeNet-style
//! models, and its backward pass is slower still: the input gradient goes through a naive
//! `conv_transpose2d` loop (computed even for the network input, which needs no gradient) and
//! the kernel gradient through a convolution whose "kernel" is the whole output gradient.
//! Here the forward pass lowers a chunk of samples to a `[C·k·k, bc·H'·W']` patch matrix (small
//! enough to stay in cache, large enough for an efficient GEMM, see [`Geom::chunk`]), multiplies
//! it by the kernel (the `gemm` crate, through [`super::gemm`]) and writes the result into the
//! `[B, c_out, H', W']` output. The backward pass recomputes the patch matrices (instead of
//! keeping them alive between forward and backward, which would cost a lot of memory for
//! ResNet) and, in one pass over the chunks, accumulates the kernel gradient
//! (`cols @ gradᵀ`), the bias gradient, and — only when the input needs one — the input
//! gradient: for stride 1 as the convolution of the output gradient with the flipped,
//! transposed kernel (no patch-sized gradient, no scatter), otherwise as `weightᵀ @ grad`
//! plus a col2im scatter. A ReLU that follows the convolution can be fused into it
//! ([`conv2d_relu`]): applied as the output is written, and its mask applied to the output
//! gradient before the backward pass.
//!
//! The arithmetic on raw slices is in `compute`; this module holds the custom ops, their
//! backward plumbing and the public [`conv2d`] / [`conv2d_relu`].
//!
//! Non-CPU tensors and dtypes other than f32 / f64 fall back to candle's `conv2d`.

use std::sync::Mutex;

use candle_core::{CpuStorage, DType, Layout, Result, Shape, Tensor, WithDType};

use super::im2col::{gather, Geom};
use super::low_precision::low_precision;
use super::relu::relu_grad;
use super::scratch::keep_vec;
use super::storage::{slice, typed, Arg, CpuOp, Grads, Kernel, Output};

mod compute;

/// Which gradients the backward pass computes.
#[derive(Debug, Clone, Copy)]
struct Wanted {
    x: bool,
    weight: bool,
    bias: bool,
}

/// The convolution `(x, weight[, bias]) -> y` (or `relu(y)`) with its own backward pass: a
/// [`CustomOp2`](candle_core::CustomOp2) without bias, a [`CustomOp3`](candle_core::CustomOp3) with bias.
struct ConvGemm {
    geom: Geom,
    /// The forward pass's Winograd-transformed kernel, for tracked convolutions.
    cache: Option<KernelCache>,
    /// ReLU fused into the output: `relu(conv(x))` in one pass, and in the backward pass the
    /// output gradient masked by `y > 0` first — no separate ReLU op and output tensor.
    relu: bool,
}

/// The Winograd-transformed kernel a forward pass computed, kept in its op (in candle's graph)
/// for the backward pass, which then does not transform the kernel again: present for tracked
/// convolutions only (`None` in inference), holding a value only after a Winograd forward pass
/// and until the first backward pass takes it. It costs the transformed kernel's memory (4× the
/// kernel for F(4, 3), 16/9× for F(2, 3)) from the forward to the backward pass; after it, the
/// memory goes to the thread's pool of kept buffers (`scratch::keep_vec`) for the next step's
/// forward pass, so a model's transformed kernels stay allocated between steps (ResNet-18: about
/// 150 MB, which every step needs at once anyway) instead of being mapped and zeroed anew.
#[derive(Default)]
struct KernelCache(Mutex<Option<CpuStorage>>);

impl KernelCache {
    fn keep(&self, u: CpuStorage) {
        if let Ok(mut slot) = self.0.lock() {
            *slot = Some(u);
        }
    }

    fn take(&self) -> Option<CpuStorage> {
        self.0.lock().ok()?.take()
    }
}

impl Drop for KernelCache {
    fn drop(&mut self) {
        if let Some(u) = self.take() {
            reuse(u);
        }
    }
}

/// Gives a transformed kernel's memory to the thread's pool for the next forward pass's (the same
/// size, every step), instead of back to the system.
fn reuse(u: CpuStorage) {
    match u {
        CpuStorage::F32(v) => keep_vec(v),
        CpuStorage::F64(v) => keep_vec(v),
        _ => {}
    }
}

impl ConvGemm {
    /// The op for the arithmetic alone (no kernel cache, no ReLU).
    fn plain(geom: Geom) -> Self {
        ConvGemm {
            geom,
            cache: None,
            relu: false,
        }
    }

    fn out_shape(&self, weight: &Layout) -> Shape {
        let g = &self.geom;
        let c_out = weight.dims().first().copied().unwrap_or(0);
        Shape::from((g.b, c_out, g.oh, g.ow))
    }

    /// Forward pass on raw storage (inside the custom op).
    fn cpu_forward<T: WithDType>(
        &self,
        x: Arg<'_>,
        weight: Arg<'_>,
        bias: Option<Arg<'_>>,
    ) -> Output {
        const OP: &str = "kolo-conv2d";
        let shape = self.out_shape(weight.1);
        let w = gather(typed::<T>(weight, OP)?)?;
        let b = match bias {
            Some(b) => Some(gather(typed::<T>(b, OP)?)?),
            None => None,
        };
        let y = self.forward_slices(typed::<T>(x, OP)?, &w, b.as_deref(), Vec::new())?;
        Ok((T::to_cpu_storage_owned(y), shape))
    }

    /// Gradients of `x`, `weight` and `bias` (each only if it is tracked), given the op's
    /// result `res` and its gradient `grad`: masked by `res > 0` first when the op's output went
    /// through its ReLU.
    fn gradients(
        &self,
        x: &Tensor,
        weight: &Tensor,
        bias: Option<&Tensor>,
        (res, grad): (&Tensor, &Tensor),
    ) -> Grads<3> {
        let grad = if self.relu {
            relu_grad(grad, res)?
        } else {
            grad.clone()
        };
        let g = &self.geom;
        let c_out = weight.dim(0)?;
        let want = Wanted {
            x: x.track_op(),
            weight: weight.track_op(),
            bias: bias.is_some_and(Tensor::track_op),
        };
        let u = self.cache.as_ref().and_then(KernelCache::take);
        let all = x.detach().apply_op3_no_bwd(
            &weight.detach(),
            &grad.detach().contiguous()?,
            &CpuOp(ConvBackward(*g, want, u)),
        )?;
        let mut at = 0;
        let mut take = |wanted: bool, len: usize, shape: Shape| -> Result<Option<Tensor>> {
            if !wanted {
                return Ok(None);
            }
            let t = all.narrow(0, at, len)?.reshape(shape)?;
            at += len;
            Ok(Some(t))
        };
        let dx = take(want.x, x.elem_count(), x.shape().clone())?;
        let dw = take(want.weight, weight.elem_count(), weight.shape().clone())?;
        let db = take(want.bias, c_out, Shape::from(c_out))?;
        Ok([dx, dw, db])
    }
}

/// `(x, weight, grad) -> [dx…, dweight…, dbias…]` (the wanted ones), backward-less; with the
/// forward pass's Winograd-transformed kernel if it was kept.
struct ConvBackward(Geom, Wanted, Option<CpuStorage>);

impl Drop for ConvBackward {
    fn drop(&mut self) {
        if let Some(u) = self.2.take() {
            reuse(u);
        }
    }
}

impl Kernel<3> for ConvBackward {
    fn name(&self) -> &'static str {
        "kolo-conv2d-backward"
    }

    const TAKES_BF16: bool = true;

    fn forward<T: WithDType>(&self, [x, w, g]: [Arg<'_>; 3]) -> Output {
        let op = self.name();
        let all = ConvGemm::plain(self.0).backward_slices(
            typed::<T>(x, op)?,
            (&gather(typed::<T>(w, op)?)?, self.2.as_ref()),
            slice::<T>(g, op)?,
            self.1,
        )?;
        let len = all.len();
        Ok((T::to_cpu_storage_owned(all), Shape::from(len)))
    }
}

impl Kernel<2> for ConvGemm {
    fn name(&self) -> &'static str {
        "kolo-conv2d"
    }

    const TAKES_BF16: bool = true;

    fn forward<T: WithDType>(&self, [x, w]: [Arg<'_>; 2]) -> Output {
        self.cpu_forward::<T>(x, w, None)
    }

    fn backward(&self, [x, weight]: [&Tensor; 2], res: &Tensor, grad: &Tensor) -> Grads<2> {
        let [dx, dw, _] = self.gradients(x, weight, None, (res, grad))?;
        Ok([dx, dw])
    }
}

impl Kernel<3> for ConvGemm {
    fn name(&self) -> &'static str {
        "kolo-conv2d-bias"
    }

    const TAKES_BF16: bool = true;

    fn forward<T: WithDType>(&self, [x, w, b]: [Arg<'_>; 3]) -> Output {
        self.cpu_forward::<T>(x, w, Some(b))
    }

    fn backward(&self, [x, weight, bias]: [&Tensor; 3], res: &Tensor, grad: &Tensor) -> Grads<3> {
        self.gradients(x, weight, Some(bias), (res, grad))
    }
}

/// `conv2d(x, weight) + bias`, with stride and symmetric zero padding, differentiable:
/// im2col + GEMM on CPU for f32 / f64 (see the notes at the top of this module), candle's
/// `conv2d` otherwise. `x` is `[B, C, H, W]`, `weight` `[c_out, C, k, k]` (square kernels, no
/// dilation or groups), `bias` (optional) `[c_out]`; the result is `[B, c_out, H', W']`.
///
/// Errors if the shapes do not match or the input is smaller than the (padded) kernel.
pub fn conv2d(
    x: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    stride: usize,
    padding: usize,
) -> Result<Tensor> {
    conv2d_with(x, weight, bias, (stride, padding), false)
}

/// `relu(conv2d(x, weight) + bias)` as one op on CPU f32 / f64 (the ReLU applied as the output
/// is written, its mask applied to the output gradient in the convolution's backward pass: no
/// ReLU pass and no tensor in between); otherwise [`conv2d`] then [`super::relu()`]. Arguments
/// and errors as for [`conv2d`].
pub fn conv2d_relu(
    x: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    stride: usize,
    padding: usize,
) -> Result<Tensor> {
    conv2d_with(x, weight, bias, (stride, padding), true)
}

fn conv2d_with(
    x: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    (stride, padding): (usize, usize),
    relu: bool,
) -> Result<Tensor> {
    // bf16 where KOLO_BF16_GEMM asks for a bf16 matrix unit: im2col + that unit's GEMM, in
    // bf16 throughout; otherwise 16-bit inputs are computed in f32 (faster so far, see
    // `bf16_path_asked`).
    let bf16_unit = x.dtype() == DType::BF16
        && x.device().is_cpu()
        && super::bf16_gemm::bf16_path_asked()?
            .is_some_and(|p| p != super::bf16_gemm::Bf16Path::F32);
    if !bf16_unit {
        if let Some(y) = low_precision(x, &[Some(weight), bias], |t| {
            conv2d_with(&t[0], &t[1], t.get(2), (stride, padding), relu)
        }) {
            return y;
        }
    }
    let (b, c, h, w) = x.dims4()?;
    let (c_out, c_w, k, k2) = weight.dims4()?;
    if c != c_w || k != k2 {
        candle_core::bail!(
            "conv2d: input {:?} does not match kernel {:?}",
            x.shape(),
            weight.shape()
        );
    }
    if let Some(bias) = bias {
        if bias.dims() != [c_out] {
            candle_core::bail!(
                "conv2d: bias {:?} does not match kernel {:?}",
                bias.shape(),
                weight.shape()
            );
        }
    }
    let out = |size: usize| conv_out(size, k, stride, padding).filter(|&o| o > 0);
    let (Some(oh), Some(ow)) = (out(h), out(w)) else {
        candle_core::bail!(
            "conv2d: input {:?} too small for a {k}x{k} kernel with padding {padding}",
            x.shape()
        );
    };
    let dtype = x.dtype();
    let fast = x.device().is_cpu()
        && weight.device().is_cpu()
        && weight.dtype() == dtype
        && bias.is_none_or(|b| b.device().is_cpu() && b.dtype() == dtype)
        && (matches!(dtype, DType::F32 | DType::F64) || bf16_unit)
        && b > 0;
    if !fast {
        let y = x.conv2d(weight, padding, stride, 1, 1)?;
        let y = match bias {
            Some(bias) => y.broadcast_add(&bias.reshape((1, c_out, 1, 1))?)?,
            None => y,
        };
        return if relu { super::relu::relu(&y) } else { Ok(y) };
    }
    let geom = Geom {
        b,
        c,
        h,
        w,
        k,
        stride,
        padding,
        oh,
        ow,
    };
    let tracked = x.track_op() || weight.track_op() || bias.is_some_and(Tensor::track_op);
    let op = CpuOp(ConvGemm {
        geom,
        cache: tracked.then(KernelCache::default),
        relu,
    });
    match (tracked, bias) {
        // Inference: no graph to record.
        (false, Some(bias)) => x.apply_op3_no_bwd(weight, bias, &op),
        (false, None) => x.apply_op2_no_bwd(weight, &op),
        (true, Some(bias)) => x.apply_op3(weight, bias, op),
        (true, None) => x.apply_op2(weight, op),
    }
}

/// Spatial output size of a convolution / pooling window, or `None` when the window does not
/// fit (PyTorch's floor semantics).
pub fn conv_out(size: usize, kernel: usize, stride: usize, padding: usize) -> Option<usize> {
    let padded = size + 2 * padding;
    if padded < kernel || stride == 0 {
        None
    } else {
        Some((padded - kernel) / stride + 1)
    }
}
