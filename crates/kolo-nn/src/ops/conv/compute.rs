//! The convolution's arithmetic on raw slices: the forward pass (Winograd or im2col + GEMM chunk
//! by chunk, with the bias and ReLU epilogue) and the backward pass (kernel, bias and input
//! gradients), for [`ConvGemm`]'s custom ops (see the parent module's notes).

use candle_core::{CpuStorage, DType, Layout, Result, WithDType};

use super::super::gemm::{matmul_into, matmul_into_f32, MatRef};
use super::super::im2col::{col2im_into, im2col_into};
use super::super::relu::pos;
use super::super::scratch::keep_vec;
use super::super::tile_conv;
use super::super::winograd;
use super::{ConvGemm, Wanted};

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

/// `s` as the f32 slice it is, where `T` is f32.
fn as_f32<T: WithDType>(s: &[T]) -> Option<&[f32]> {
    // SAFETY: T is f32 (its DTYPE says so): the same memory as the same type.
    (T::DTYPE == DType::F32)
        .then(|| unsafe { std::slice::from_raw_parts(s.as_ptr().cast(), s.len()) })
}

/// `v` as a `Vec<T>`, where `T` is f32 (`None` otherwise).
fn from_f32<T: WithDType>(v: Vec<f32>) -> Option<Vec<T>> {
    if T::DTYPE != DType::F32 {
        return None;
    }
    let mut v = std::mem::ManuallyDrop::new(v);
    // SAFETY: T is f32: the allocation, length and capacity of a Vec<f32> are those of a
    // Vec<T>; `v` is not dropped.
    Some(unsafe { Vec::from_raw_parts(v.as_mut_ptr().cast(), v.len(), v.capacity()) })
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
    let sums = super::super::bn_loops::channel_sums(grad, p, c_out);
    sums[..c_out].iter().map(|&s| T::from_f64(s)).collect()
}

/// Appends one output row: `row (+ bias)`, ReLU'd when `relu` (NaN stays, as in [`pos`]).
fn epilogue<T: WithDType>(out: &mut Vec<T>, row: &[T], bias: Option<T>, relu: bool) {
    let zero = T::zero();
    match (bias, relu) {
        (Some(b), false) => out.extend(row.iter().map(|&v| v + b)),
        (Some(b), true) => out.extend(row.iter().map(|&v| pos(v + b, zero))),
        (None, false) => out.extend_from_slice(row),
        (None, true) => out.extend(row.iter().map(|&v| pos(v, zero))),
    }
}

impl ConvGemm {
    /// `y[b, co] = weight[co] · patches(x[b]) (+ bias[co])` (then ReLU'd if the op has its
    /// ReLU) as a contiguous
    /// `[B, c_out, H', W']`, appended to `out` (which the backward pass gives the capacity of all
    /// its gradients, so that appending them does not copy `y`); `w` is the contiguous
    /// `[c_out, C·k·k]` kernel.
    pub(super) fn forward_slices<T: WithDType>(
        &self,
        x: (&[T], &Layout),
        w: &[T],
        bias: Option<&[T]>,
        mut out: Vec<T>,
    ) -> Result<Vec<T>> {
        let g = &self.geom;
        let (rows, p) = (g.rows(), g.pixels());
        let c_out = w.len() / rows.max(1);
        if c_out * rows != w.len() || bias.is_some_and(|b| b.len() != c_out) {
            candle_core::bail!("kolo-conv2d: kernel of {} values for {rows} rows", w.len());
        }
        if let (Some(x32), Some(w32), true) =
            (as_f32(x.0), as_f32(w), tile_conv::eligible(g, c_out))
        {
            let b32 = bias.and_then(as_f32);
            let y = tile_conv::forward((x32, x.1), g, w32, b32, self.relu)?;
            let Some(y) = from_f32::<T>(y) else {
                candle_core::bail!("kolo-conv2d: f32 output of a {:?} convolution", T::DTYPE);
            };
            if out.is_empty() {
                return Ok(y);
            }
            out.extend_from_slice(&y);
            return Ok(out);
        }
        // Winograd's transforms are f32/f64 arithmetic; bf16 goes to the bf16 GEMM.
        let winograd = (T::DTYPE != DType::BF16)
            .then(|| winograd::eligible(g, c_out))
            .flatten();
        if let Some(variant) = winograd {
            let (mut y, u) = winograd::forward(x, g, w, bias, variant)?;
            if self.relu {
                y.iter_mut().for_each(|v| *v = pos(*v, T::zero()));
            }
            match &self.cache {
                Some(cache) => cache.keep(T::to_cpu_storage_owned(u)),
                None => keep_vec(u),
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
                    epilogue(&mut out, row, bias.map(|b| b[co]), self.relu);
                }
            }
        }
        Ok(out)
    }

    /// The wanted gradients, concatenated: `dx` (`[B, C, H, W]`), `dweight` (`[c_out, C·k·k]`),
    /// `dbias` (`[c_out]`). `grad` is the contiguous `[B, c_out, H', W']` output gradient; `u`
    /// the forward pass's Winograd-transformed kernel, if kept.
    pub(super) fn backward_slices<T: WithDType>(
        &self,
        x: (&[T], &Layout),
        (w, u): (&[T], Option<&CpuStorage>),
        grad: &[T],
        want: Wanted,
    ) -> Result<Vec<T>> {
        let g = &self.geom;
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
        if let (Some(x32), Some(w32), Some(g32), true) = (
            as_f32(x.0),
            as_f32(w),
            as_f32(grad),
            tile_conv::eligible(g, c_out),
        ) {
            let mut o32 = Vec::with_capacity(total);
            tile_conv::backward((x32, x.1), w32, g, g32, (want.x, want.weight), &mut o32)?;
            let Some(mut out) = from_f32::<T>(o32) else {
                candle_core::bail!("{OP}: f32 gradients of a {:?} convolution", T::DTYPE);
            };
            if want.bias {
                out.extend(bias_grad(grad, c_out, p));
            }
            return Ok(out);
        }
        let mut out = Vec::with_capacity(total);
        let winograd = (T::DTYPE != DType::BF16)
            .then(|| winograd::eligible(g, c_out))
            .flatten();
        if let Some(variant) = winograd {
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
        // bf16 sums the chunks' products in f32 and rounds once, at the end.
        let bf16 = T::DTYPE == DType::BF16;
        let mut dw = vec![T::zero(); if gemm_dw && !bf16 { rows * c_out } else { 0 }];
        let mut dw32 = vec![0f32; if gemm_dw && bf16 { rows * c_out } else { 0 }];
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
                    if bf16 {
                        matmul_into_f32(OP, &mut dw32, (dw_rs, dw_cs), cols_m, gc_m.t())?;
                    } else {
                        matmul_into(OP, &mut dw, (dw_rs, dw_cs), cols_m, gc_m.t(), true)?;
                    }
                }
                if scatter {
                    let wt = MatRef::row_major(w, c_out, rows).t();
                    let plane = g.c * g.h * g.w;
                    let dx = &mut out[b0 * plane..(b0 + bc) * plane];
                    if bf16 {
                        // The patches' overlaps summed in f32, each input gradient rounded once.
                        let mut dcols32 = vec![0f32; rows * n];
                        matmul_into_f32(OP, &mut dcols32, (n, 1), wt, gc_m)?;
                        let mut dx32 = vec![0f32; dx.len()];
                        col2im_into(&dcols32, g, bc, &mut dx32);
                        for (d, v) in dx.iter_mut().zip(dx32) {
                            *d = T::from_f64(f64::from(v));
                        }
                    } else {
                        dcols.resize(rows * n, T::zero());
                        matmul_into(OP, &mut dcols, (n, 1), wt, gc_m, false)?;
                        col2im_into(&dcols, g, bc, dx);
                    }
                }
            }
        }
        if let Some(gt) = flipped {
            let layout = Layout::contiguous((g.b, c_out, g.oh, g.ow));
            let wf = flip_transpose(w, c_out, g.c, g.k);
            out = ConvGemm::plain(gt).forward_slices((grad, &layout), &wf, None, out)?;
        }
        if bf16 {
            dw = dw32.iter().map(|&v| T::from_f64(f64::from(v))).collect();
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
}
