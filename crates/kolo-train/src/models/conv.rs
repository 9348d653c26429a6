//! A faster CPU 2-D convolution: im2col + one GEMM, with a matching backward pass.
//!
//! candle 0.11's CPU `conv2d` is slow for the small, shallow convolutions of LeNet-style
//! models, and its backward pass is slower still: the input gradient goes through a naive
//! `conv_transpose2d` loop (computed even for the network input, which needs no gradient) and
//! the kernel gradient through a convolution whose "kernel" is the whole output gradient.
//! Here the forward pass lowers the input to a `[C·k·k, B·H'·W']` patch matrix and does a single
//! GEMM (candle's matmul); the backward pass recomputes the patch matrix (instead of keeping it
//! alive between forward and backward, which would cost a lot of memory for ResNet), gets the
//! kernel gradient from one GEMM, and the input gradient — only when the input needs one — from
//! one GEMM plus a col2im scatter.
//!
//! Non-CPU tensors and dtypes other than f32 / f64 fall back to candle's `conv2d`.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp1, CustomOp2, DType, Layout, Module, Result, Shape, Tensor, WithDType};

/// Geometry of one convolution (square kernel, symmetric padding, no dilation or groups).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Geom {
    b: usize,
    c: usize,
    h: usize,
    w: usize,
    k: usize,
    stride: usize,
    padding: usize,
    oh: usize,
    ow: usize,
}

impl Geom {
    /// Rows of the patch matrix.
    fn rows(&self) -> usize {
        self.c * self.k * self.k
    }

    /// Output pixels per sample.
    fn pixels(&self) -> usize {
        self.oh * self.ow
    }

    /// Columns of the patch matrix.
    fn cols(&self) -> usize {
        self.b * self.pixels()
    }

    /// Input row `iy` (or `None` in the padding) for output row `oy` and kernel row `ky`.
    fn src(&self, o: usize, kk: usize, size: usize) -> Option<usize> {
        (o * self.stride + kk)
            .checked_sub(self.padding)
            .filter(|&i| i < size)
    }
}

/// Splits `data` into chunks of `chunk` elements and runs `f(chunk_index, chunk)` on them,
/// spread over up to candle's thread count when there is enough work.
fn par_chunks_mut<T: Send>(data: &mut [T], chunk: usize, f: impl Fn(usize, &mut [T]) + Sync) {
    const MIN_PARALLEL_ELEMS: usize = 1 << 16;
    let chunk = chunk.max(1);
    let n_chunks = data.len().div_ceil(chunk);
    let threads = candle_core::utils::get_num_threads().clamp(1, n_chunks.max(1));
    if threads == 1 || data.len() < MIN_PARALLEL_ELEMS {
        for (i, c) in data.chunks_mut(chunk).enumerate() {
            f(i, c);
        }
        return;
    }
    let per_thread = n_chunks.div_ceil(threads);
    std::thread::scope(|s| {
        for (t, part) in data.chunks_mut(per_thread * chunk).enumerate() {
            let f = &f;
            s.spawn(move || {
                for (i, c) in part.chunks_mut(chunk).enumerate() {
                    f(t * per_thread + i, c);
                }
            });
        }
    });
}

/// `[B, C, H, W]` (any strides) -> patch matrix `[C·k·k, B·H'·W']`, zeros in the padding.
fn im2col<T: WithDType>(src: &[T], layout: &Layout, g: &Geom) -> Result<Vec<T>> {
    let src = &src[layout.start_offset()..];
    let [s0, s1, s2, s3]: [usize; 4] = match layout.stride().try_into() {
        Ok(s) => s,
        Err(_) => candle_core::bail!("im2col: expected a rank-4 input"),
    };
    let n = g.cols();
    let mut dst = vec![T::zero(); g.rows() * n];
    par_chunks_mut(&mut dst, n, |r, row| {
        let (ci, ky, kx) = (r / (g.k * g.k), (r / g.k) % g.k, r % g.k);
        for bi in 0..g.b {
            let out = &mut row[bi * g.pixels()..(bi + 1) * g.pixels()];
            let base = bi * s0 + ci * s1;
            for oy in 0..g.oh {
                let Some(iy) = g.src(oy, ky, g.h) else {
                    continue;
                };
                let line = &mut out[oy * g.ow..(oy + 1) * g.ow];
                for (ox, v) in line.iter_mut().enumerate() {
                    if let Some(ix) = g.src(ox, kx, g.w) {
                        *v = src[base + iy * s2 + ix * s3];
                    }
                }
            }
        }
    });
    Ok(dst)
}

/// Patch-matrix gradient `[C·k·k, B·H'·W']` (contiguous) -> input gradient `[B, C, H, W]`
/// (the adjoint of [`im2col`]: overlapping patches add up).
fn col2im<T: WithDType>(cols: &[T], g: &Geom) -> Vec<T> {
    let n = g.cols();
    let mut dst = vec![T::zero(); g.b * g.c * g.h * g.w];
    par_chunks_mut(&mut dst, g.h * g.w, |plane_idx, plane| {
        let (bi, ci) = (plane_idx / g.c, plane_idx % g.c);
        for ky in 0..g.k {
            for kx in 0..g.k {
                let r = (ci * g.k + ky) * g.k + kx;
                let row = &cols[r * n + bi * g.pixels()..r * n + (bi + 1) * g.pixels()];
                for oy in 0..g.oh {
                    let Some(iy) = g.src(oy, ky, g.h) else {
                        continue;
                    };
                    for ox in 0..g.ow {
                        if let Some(ix) = g.src(ox, kx, g.w) {
                            plane[iy * g.w + ix] += row[oy * g.ow + ox];
                        }
                    }
                }
            }
        }
    });
    dst
}

/// `x -> patch matrix` as a (backward-less) custom op.
struct Im2Col(Geom);

impl CustomOp1 for Im2Col {
    fn name(&self) -> &'static str {
        "kolo-im2col"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let g = &self.0;
        let shape = Shape::from((g.rows(), g.cols()));
        Ok(match storage {
            CpuStorage::F32(v) => (CpuStorage::F32(im2col(v, layout, g)?), shape),
            CpuStorage::F64(v) => (CpuStorage::F64(im2col(v, layout, g)?), shape),
            s => candle_core::bail!("kolo-im2col: unsupported dtype {:?}", s.dtype()),
        })
    }
}

/// `patch-matrix gradient -> input gradient` as a (backward-less) custom op.
struct Col2Im(Geom);

impl CustomOp1 for Col2Im {
    fn name(&self) -> &'static str {
        "kolo-col2im"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let g = &self.0;
        let Some((start, end)) = layout.contiguous_offsets() else {
            candle_core::bail!("kolo-col2im: input must be contiguous");
        };
        let shape = Shape::from((g.b, g.c, g.h, g.w));
        Ok(match storage {
            CpuStorage::F32(v) => (CpuStorage::F32(col2im(&v[start..end], g)), shape),
            CpuStorage::F64(v) => (CpuStorage::F64(col2im(&v[start..end], g)), shape),
            s => candle_core::bail!("kolo-col2im: unsupported dtype {:?}", s.dtype()),
        })
    }
}

/// The convolution `(x, weight) -> y` as a custom op with its own backward pass.
struct ConvGemm(Geom);

impl ConvGemm {
    /// `y = weight[c_out, C·k·k] @ im2col(x)`, rearranged to `[B, c_out, H', W']`.
    fn forward_tensors(&self, x: &Tensor, weight: &Tensor) -> Result<Tensor> {
        let g = &self.0;
        let c_out = weight.dim(0)?;
        let cols = x.apply_op1_no_bwd(&Im2Col(*g))?;
        weight
            .reshape((c_out, g.rows()))?
            .matmul(&cols)?
            .reshape((c_out, g.b, g.oh, g.ow))?
            .transpose(0, 1)?
            .contiguous()
    }
}

/// The elements of a rank-4 strided view, in row-major order.
fn gather4<T: WithDType>(src: &[T], layout: &Layout) -> Result<Vec<T>> {
    if let Some((start, end)) = layout.contiguous_offsets() {
        return Ok(src[start..end].to_vec());
    }
    let (Ok([d0, d1, d2, d3]), Ok([s0, s1, s2, s3])) = (
        <[usize; 4]>::try_from(layout.dims()),
        <[usize; 4]>::try_from(layout.stride()),
    ) else {
        candle_core::bail!("kolo-conv2d: expected a rank-4 kernel");
    };
    let src = &src[layout.start_offset()..];
    let mut out = Vec::with_capacity(d0 * d1 * d2 * d3);
    for i0 in 0..d0 {
        for i1 in 0..d1 {
            for i2 in 0..d2 {
                for i3 in 0..d3 {
                    out.push(src[i0 * s0 + i1 * s1 + i2 * s2 + i3 * s3]);
                }
            }
        }
    }
    Ok(out)
}

/// `weight[c_out, rows] @ cols[rows, B·H'·W']`, rearranged to `[B, c_out, H', W']` order.
fn gemm_nchw<T: WithDType>(weight: Vec<T>, cols: Vec<T>, c_out: usize, g: &Geom) -> Result<Vec<T>> {
    let dev = candle_core::Device::Cpu;
    let weight = Tensor::from_vec(weight, (c_out, g.rows()), &dev)?;
    let cols = Tensor::from_vec(cols, (g.rows(), g.cols()), &dev)?;
    weight
        .matmul(&cols)?
        .reshape((c_out, g.b, g.pixels()))?
        .transpose(0, 1)?
        .flatten_all()?
        .to_vec1()
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
        let g = &self.0;
        let c_out = l2.dims().first().copied().unwrap_or(0);
        let shape = Shape::from((g.b, c_out, g.oh, g.ow));
        Ok(match (s1, s2) {
            (CpuStorage::F32(x), CpuStorage::F32(w)) => {
                let y = gemm_nchw(gather4(w, l2)?, im2col(x, l1, g)?, c_out, g)?;
                (CpuStorage::F32(y), shape)
            }
            (CpuStorage::F64(x), CpuStorage::F64(w)) => {
                let y = gemm_nchw(gather4(w, l2)?, im2col(x, l1, g)?, c_out, g)?;
                (CpuStorage::F64(y), shape)
            }
            (x, w) => candle_core::bail!(
                "kolo-conv2d: unsupported dtypes {:?} / {:?}",
                x.dtype(),
                w.dtype()
            ),
        })
    }

    fn bwd(
        &self,
        x: &Tensor,
        weight: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let g = &self.0;
        let c_out = weight.dim(0)?;
        // [B, c_out, H', W'] -> [c_out, B·H'·W'].
        let grad = grad
            .detach()
            .reshape((g.b, c_out, g.pixels()))?
            .transpose(0, 1)?
            .contiguous()?
            .reshape((c_out, g.cols()))?;
        let grad_weight = if weight.track_op() {
            let cols = x.detach().apply_op1_no_bwd(&Im2Col(*g))?;
            Some(grad.matmul(&cols.t()?)?.reshape(weight.shape())?)
        } else {
            None
        };
        let grad_x = if x.track_op() {
            let grad_cols = weight
                .detach()
                .reshape((c_out, g.rows()))?
                .t()?
                .matmul(&grad)?
                .contiguous()?;
            Some(grad_cols.apply_op1_no_bwd(&Col2Im(*g))?)
        } else {
            None
        };
        Ok((grad_x, grad_weight))
    }
}

/// `conv2d(x, weight)` (no bias) with stride and symmetric zero padding, differentiable: im2col
/// + GEMM on CPU for f32 / f64 (see the notes at the top of this module), candle's `conv2d`
/// otherwise. `x` is `[B, C, H, W]`, `weight` `[c_out, C, k, k]` (square kernels, no dilation or
/// groups); the result is `[B, c_out, H', W']`.
///
/// Errors if the shapes do not match or the input is smaller than the (padded) kernel.
pub fn conv2d(x: &Tensor, weight: &Tensor, stride: usize, padding: usize) -> Result<Tensor> {
    let (b, c, h, w) = x.dims4()?;
    let (_c_out, c_w, k, k2) = weight.dims4()?;
    if c != c_w || k != k2 {
        candle_core::bail!(
            "conv2d: input {:?} does not match kernel {:?}",
            x.shape(),
            weight.shape()
        );
    }
    let out = |size: usize| super::layers::conv_out(size, k, stride, padding).filter(|&o| o > 0);
    let (Some(oh), Some(ow)) = (out(h), out(w)) else {
        candle_core::bail!(
            "conv2d: input {:?} too small for a {k}x{k} kernel with padding {padding}",
            x.shape()
        );
    };
    let fast = x.device().is_cpu()
        && weight.device().is_cpu()
        && x.dtype() == weight.dtype()
        && matches!(x.dtype(), DType::F32 | DType::F64);
    if !fast || b == 0 {
        return x.conv2d(weight, padding, stride, 1, 1);
    }
    let g = Geom {
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
    if x.track_op() || weight.track_op() {
        x.apply_op2(weight, ConvGemm(g))
    } else {
        // Inference: no graph to record.
        ConvGemm(g).forward_tensors(x, weight)
    }
}

/// A convolution layer with bias using [`conv2d`]; the same parameters as `candle_nn::Conv2d`.
#[derive(Debug, Clone)]
pub(crate) struct Conv2d {
    weight: Tensor,
    bias: Tensor,
    stride: usize,
    padding: usize,
}

impl Conv2d {
    pub(crate) fn new(weight: Tensor, bias: Tensor, stride: usize, padding: usize) -> Self {
        Self {
            weight,
            bias,
            stride,
            padding,
        }
    }
}

impl Module for Conv2d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = conv2d(x, &self.weight, self.stride, self.padding)?;
        let c_out = self.bias.dim(0)?;
        y.broadcast_add(&self.bias.reshape((1, c_out, 1, 1))?)
    }
}
