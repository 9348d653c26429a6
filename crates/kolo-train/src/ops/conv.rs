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
//! plus a col2im scatter.
//!
//! Non-CPU tensors and dtypes other than f32 / f64 fall back to candle's `conv2d`.

use std::sync::Mutex;

use candle_core::backend::BackendStorage;
use candle_core::{
    CpuStorage, CustomOp2, CustomOp3, DType, Layout, Result, Shape, Tensor, WithDType,
};

use super::gemm::{matmul_into, MatRef};
use super::im2col::{col2im_into, gather, im2col_into, Geom};
use super::slices::contiguous;
use super::winograd;

/// `[c_out, C, k, k]` -> `[C, c_out, k, k]` flipped in space: the kernel of the input gradient
/// of a stride-1 convolution.
fn flip_transpose<T: WithDType>(w: &[T], c_out: usize, c: usize, k: usize) -> Vec<T> {
    let kk = k * k;
    let mut out = Vec::with_capacity(w.len());
    for ci in 0..c {
        for co in 0..c_out {
            let src = &w[(co * c + ci) * kk..(co * c + ci + 1) * kk];
            out.extend(src.iter().rev());
        }
    }
    out
}

/// Makes `cols` an all-zero patch matrix of `len` values for [`im2col_into`] — unless it already
/// has that length: im2col writes the same (non-padding) positions for every chunk of the same
/// size, so the previous chunk's padding zeros are still in place and the rest is overwritten.
fn refill_zeros<T: WithDType>(cols: &mut Vec<T>, len: usize) {
    if cols.len() != len {
        cols.clear();
        cols.resize(len, T::zero());
    }
}

/// The bias gradient: `grad` (`[B, c_out, p]`) summed over samples and pixels.
fn bias_grad<T: WithDType>(grad: &[T], c_out: usize, p: usize) -> Vec<T> {
    let sums = super::bn_loops::channel_sums(grad, p, c_out);
    sums[..c_out].iter().map(|&s| T::from_f64(s)).collect()
}

/// Which gradients the backward pass computes.
#[derive(Debug, Clone, Copy)]
struct Wanted {
    x: bool,
    weight: bool,
    bias: bool,
}

/// The convolution `(x, weight[, bias]) -> y` with its own backward pass: a [`CustomOp2`]
/// without bias, a [`CustomOp3`] with bias.
struct ConvGemm(Geom, Option<KernelCache>);

/// The Winograd-transformed kernel a forward pass computed, kept in its op (in candle's graph)
/// for the backward pass, which then does not transform the kernel again: present for tracked
/// convolutions only (`None` in inference), holding a value only after a Winograd forward pass
/// and until the first backward pass takes it. It costs the transformed kernel's memory (4× the
/// kernel for F(4, 3), 16/9× for F(2, 3)) from the forward to the backward pass.
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

impl ConvGemm {
    /// `y[b, co] = weight[co] · patches(x[b]) (+ bias[co])` as a contiguous
    /// `[B, c_out, H', W']`, appended to `out` (which the backward pass gives the capacity of all
    /// its gradients, so that appending them does not copy `y`); `w` is the contiguous
    /// `[c_out, C·k·k]` kernel.
    fn forward_slices<T: WithDType>(
        &self,
        x: (&[T], &Layout),
        w: &[T],
        bias: Option<&[T]>,
        mut out: Vec<T>,
    ) -> Result<Vec<T>> {
        let g = &self.0;
        let (rows, p) = (g.rows(), g.pixels());
        let c_out = w.len() / rows.max(1);
        if c_out * rows != w.len() || bias.is_some_and(|b| b.len() != c_out) {
            candle_core::bail!("kolo-conv2d: kernel of {} values for {rows} rows", w.len());
        }
        if let Some(variant) = winograd::eligible(g, c_out) {
            let (y, u) = winograd::forward(x, g, w, bias, variant)?;
            if let Some(cache) = &self.1 {
                cache.keep(T::to_cpu_storage_owned(u));
            }
            if out.is_empty() {
                return Ok(y);
            }
            out.extend_from_slice(&y);
            return Ok(out);
        }
        let w_m = MatRef::row_major(w, c_out, rows);
        out.reserve(g.b * c_out * p);
        let chunk = g.chunk();
        let (mut cols, mut ys) = (Vec::new(), Vec::new());
        for b0 in (0..g.b).step_by(chunk) {
            let bc = chunk.min(g.b - b0);
            let n = bc * p;
            refill_zeros(&mut cols, rows * n);
            im2col_into(x.0, x.1, g, (b0, bc), &mut cols)?;
            ys.resize(c_out * n, T::zero());
            let cols_m = MatRef::row_major(&cols, rows, n);
            matmul_into("kolo-conv2d", &mut ys, (n, 1), w_m, cols_m, false)?;
            for bi in 0..bc {
                for co in 0..c_out {
                    let row = &ys[co * n + bi * p..co * n + (bi + 1) * p];
                    match bias {
                        Some(b) => out.extend(row.iter().map(|&v| v + b[co])),
                        None => out.extend_from_slice(row),
                    }
                }
            }
        }
        Ok(out)
    }

    /// The wanted gradients, concatenated: `dx` (`[B, C, H, W]`), `dweight` (`[c_out, C·k·k]`),
    /// `dbias` (`[c_out]`). `grad` is the contiguous `[B, c_out, H', W']` output gradient; `u`
    /// the forward pass's Winograd-transformed kernel, if kept.
    fn backward_slices<T: WithDType>(
        &self,
        x: (&[T], &Layout),
        (w, u): (&[T], Option<&CpuStorage>),
        grad: &[T],
        want: Wanted,
    ) -> Result<Vec<T>> {
        let g = &self.0;
        let (rows, p) = (g.rows(), g.pixels());
        let c_out = w.len() / rows.max(1);
        if c_out * rows != w.len() || grad.len() != g.b * c_out * p {
            candle_core::bail!(
                "kolo-conv2d: gradient of {} values does not match",
                grad.len()
            );
        }
        const OP: &str = "kolo-conv2d-backward";
        // The gradients are concatenated into one buffer made with their total size: growing
        // `dx`'s instead would copy all of `dx` once more (into fresh memory) per convolution.
        let dx_len = g.b * g.c * g.h * g.w;
        let total = [
            (want.x, dx_len),
            (want.weight, rows * c_out),
            (want.bias, c_out),
        ]
        .iter()
        .map(|&(wanted, len)| if wanted { len } else { 0 })
        .sum();
        let mut out = Vec::with_capacity(total);
        if let Some(variant) = winograd::eligible(g, c_out) {
            let u = u.map(T::cpu_storage_as_slice).transpose()?;
            let wanted = (want.x, want.weight);
            winograd::backward(x, (w, u), g, grad, wanted, variant, &mut out)?;
            if want.bias {
                out.extend(bias_grad(grad, c_out, p));
            }
            return Ok(out);
        }
        // The input gradient as a convolution of the output gradient with the flipped kernel
        // (stride 1 only) or as GEMM + col2im, whichever has the smaller patch matrix: the
        // flipped convolution's holds `c_out·k²` values per input pixel, the scattered one
        // `C·k²` per output pixel (LeNet's second convolution, 6 -> 16 channels: 5.3× smaller).
        let flipped = match g.input_grad(c_out) {
            Some(gt) if want.x && c_out * g.h * g.w <= g.c * p => Some(gt),
            _ => None,
        };
        let scatter = want.x && flipped.is_none();
        if scatter {
            out.resize(dx_len, T::zero());
        }
        // The kernel gradient accumulated over the chunks: as dweightᵀ (`[C·k·k, c_out]`, made
        // row-major and transposed at the end) when it has at least as many rows as columns,
        // as dweight (`[c_out, C·k·k]`) otherwise. The `gemm` crate's product of these shapes
        // is much faster into the taller layout: LeNet's second convolution (150 × 16), 37 vs
        // 70 µs per chunk; ResNet's 576 × 128, 259 vs 286 µs; 64 × 128 the other way round,
        // 64 vs 70 µs.
        let gemm_dw = want.weight;
        let dw_t = rows >= c_out;
        let (dw_rs, dw_cs) = if dw_t { (c_out, 1) } else { (1, rows) };
        let mut dw = vec![T::zero(); if gemm_dw { rows * c_out } else { 0 }];
        if gemm_dw || scatter {
            let chunk = g.chunk();
            let (mut cols, mut dcols) = (Vec::new(), Vec::new());
            for b0 in (0..g.b).step_by(chunk) {
                let bc = chunk.min(g.b - b0);
                let n = bc * p;
                // This chunk's gradient as [c_out, bc·H'·W'].
                let mut gc = Vec::with_capacity(c_out * n);
                for co in 0..c_out {
                    for bi in 0..bc {
                        let at = ((b0 + bi) * c_out + co) * p;
                        gc.extend_from_slice(&grad[at..at + p]);
                    }
                }
                let gc_m = MatRef::row_major(&gc, c_out, n);
                if gemm_dw {
                    refill_zeros(&mut cols, rows * n);
                    im2col_into(x.0, x.1, g, (b0, bc), &mut cols)?;
                    // dweightᵀ += cols @ gcᵀ: the long reduction runs along the rows of both
                    // operands as stored, which the GEMM packs faster than gc @ colsᵀ.
                    let cols_m = MatRef::row_major(&cols, rows, n);
                    matmul_into(OP, &mut dw, (dw_rs, dw_cs), cols_m, gc_m.t(), true)?;
                }
                if scatter {
                    dcols.resize(rows * n, T::zero());
                    let wt = MatRef::row_major(w, c_out, rows).t();
                    matmul_into(OP, &mut dcols, (n, 1), wt, gc_m, false)?;
                    let plane = g.c * g.h * g.w;
                    col2im_into(&dcols, g, bc, &mut out[b0 * plane..(b0 + bc) * plane]);
                }
            }
        }
        if let Some(gt) = flipped {
            let layout = Layout::contiguous((g.b, c_out, g.oh, g.ow));
            let wf = flip_transpose(w, c_out, g.c, g.k);
            out = ConvGemm(gt, None).forward_slices((grad, &layout), &wf, None, out)?;
        }
        if dw_t {
            // [C·k·k, c_out] -> [c_out, C·k·k].
            out.extend((0..dw.len()).map(|i| dw[(i % rows) * c_out + i / rows]));
        } else {
            out.extend_from_slice(&dw);
        }
        if want.bias {
            out.extend(bias_grad(grad, c_out, p));
        }
        Ok(out)
    }

    fn out_shape(&self, weight: &Layout) -> Shape {
        let g = &self.0;
        let c_out = weight.dims().first().copied().unwrap_or(0);
        Shape::from((g.b, c_out, g.oh, g.ow))
    }

    /// Forward pass on raw storage (inside the custom op).
    fn cpu_forward<T: WithDType>(
        &self,
        x: (&[T], &Layout),
        weight: (&[T], &Layout),
        bias: Option<(&[T], &Layout)>,
    ) -> Result<Vec<T>> {
        let w = gather(weight.0, weight.1)?;
        let b = match bias {
            Some((b, l)) => Some(gather(b, l)?),
            None => None,
        };
        self.forward_slices(x, &w, b.as_deref(), Vec::new())
    }

    /// Gradients of `x`, `weight` and `bias` (each only if it is tracked).
    fn backward(
        &self,
        x: &Tensor,
        weight: &Tensor,
        bias: Option<&Tensor>,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let g = &self.0;
        let c_out = weight.dim(0)?;
        let want = Wanted {
            x: x.track_op(),
            weight: weight.track_op(),
            bias: bias.is_some_and(Tensor::track_op),
        };
        let u = self.1.as_ref().and_then(KernelCache::take);
        let all = x.detach().apply_op3_no_bwd(
            &weight.detach(),
            &grad.detach().contiguous()?,
            &ConvBackward(*g, want, u),
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
        Ok((dx, dw, db))
    }
}

/// `(x, weight, grad) -> [dx…, dweight…, dbias…]` (the wanted ones), backward-less; with the
/// forward pass's Winograd-transformed kernel if it was kept.
struct ConvBackward(Geom, Wanted, Option<CpuStorage>);

impl CustomOp3 for ConvBackward {
    fn name(&self) -> &'static str {
        "kolo-conv2d-backward"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        const OP: &str = "kolo-conv2d-backward";
        let out = match (s1, s2, s3) {
            (CpuStorage::F32(x), CpuStorage::F32(w), CpuStorage::F32(g)) => {
                CpuStorage::F32(ConvGemm(self.0, None).backward_slices(
                    (x, l1),
                    (&gather(w, l2)?, self.2.as_ref()),
                    contiguous(g, l3, OP)?,
                    self.1,
                )?)
            }
            (CpuStorage::F64(x), CpuStorage::F64(w), CpuStorage::F64(g)) => {
                CpuStorage::F64(ConvGemm(self.0, None).backward_slices(
                    (x, l1),
                    (&gather(w, l2)?, self.2.as_ref()),
                    contiguous(g, l3, OP)?,
                    self.1,
                )?)
            }
            (x, w, g) => return Err(unsupported(&[x, w, g])),
        };
        let n = out.as_slice::<f32>().map(<[f32]>::len);
        let n = n.or_else(|_| out.as_slice::<f64>().map(<[f64]>::len))?;
        Ok((out, Shape::from(n)))
    }
}

fn unsupported(storages: &[&CpuStorage]) -> candle_core::Error {
    let dtypes: Vec<DType> = storages.iter().map(|s| s.dtype()).collect();
    candle_core::Error::Msg(format!("kolo-conv2d: unsupported dtypes {dtypes:?}"))
}

impl CustomOp2 for ConvGemm {
    fn name(&self) -> &'static str {
        "kolo-conv2d"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let shape = self.out_shape(l2);
        let y = match (s1, s2) {
            (CpuStorage::F32(x), CpuStorage::F32(w)) => {
                CpuStorage::F32(self.cpu_forward((x, l1), (w, l2), None)?)
            }
            (CpuStorage::F64(x), CpuStorage::F64(w)) => {
                CpuStorage::F64(self.cpu_forward((x, l1), (w, l2), None)?)
            }
            (x, w) => return Err(unsupported(&[x, w])),
        };
        Ok((y, shape))
    }

    fn bwd(
        &self,
        x: &Tensor,
        weight: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let (gx, gw, _) = self.backward(x, weight, None, grad)?;
        Ok((gx, gw))
    }
}

impl CustomOp3 for ConvGemm {
    fn name(&self) -> &'static str {
        "kolo-conv2d-bias"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let shape = self.out_shape(l2);
        let y = match (s1, s2, s3) {
            (CpuStorage::F32(x), CpuStorage::F32(w), CpuStorage::F32(b)) => {
                CpuStorage::F32(self.cpu_forward((x, l1), (w, l2), Some((b, l3)))?)
            }
            (CpuStorage::F64(x), CpuStorage::F64(w), CpuStorage::F64(b)) => {
                CpuStorage::F64(self.cpu_forward((x, l1), (w, l2), Some((b, l3)))?)
            }
            (x, w, b) => return Err(unsupported(&[x, w, b])),
        };
        Ok((y, shape))
    }

    fn bwd(
        &self,
        x: &Tensor,
        weight: &Tensor,
        bias: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        self.backward(x, weight, Some(bias), grad)
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
    if let Some(y) = low_precision(x, &[Some(weight), bias], |t| {
        conv2d(&t[0], &t[1], t.get(2), stride, padding)
    }) {
        return y;
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
        && matches!(dtype, DType::F32 | DType::F64)
        && b > 0;
    if !fast {
        let y = x.conv2d(weight, padding, stride, 1, 1)?;
        return match bias {
            Some(bias) => y.broadcast_add(&bias.reshape((1, c_out, 1, 1))?),
            None => Ok(y),
        };
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
    let op = ConvGemm(geom, tracked.then(KernelCache::default));
    match (tracked, bias) {
        // Inference: no graph to record.
        (false, Some(bias)) => x.apply_op3_no_bwd(weight, bias, &op),
        (false, None) => x.apply_op2_no_bwd(weight, &op),
        (true, Some(bias)) => x.apply_op3(weight, bias, op),
        (true, None) => x.apply_op2(weight, op),
    }
}

/// Mixed precision on CPU (see `crate::precision`): candle has no bf16/f16 matrix products on CPU,
/// so a layer given 16-bit CPU tensors computes `f` on f32 copies of `x` and `params` (the present
/// ones, in order) and casts the result back; `None` for other inputs. Gradients flow through the
/// casts.
pub(crate) fn low_precision(
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

/// Spatial output size of a convolution / pooling window, or `None` when the window does not
/// fit (PyTorch's floor semantics).
pub(crate) fn conv_out(size: usize, kernel: usize, stride: usize, padding: usize) -> Option<usize> {
    let padded = size + 2 * padding;
    if padded < kernel || stride == 0 {
        None
    } else {
        Some((padded - kernel) / stride + 1)
    }
}
