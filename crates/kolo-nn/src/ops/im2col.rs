//! The patch matrices of the GEMM convolution ([`super::conv`]): geometry, im2col and its
//! adjoint col2im, chunk by chunk of samples.

use std::borrow::Cow;

use candle_core::{Layout, Result, WithDType};

use super::slices::{add_rows, copy_rows};

/// Geometry of one convolution (square kernel, symmetric padding, no dilation or groups).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Geom {
    pub(super) b: usize,
    pub(super) c: usize,
    pub(super) h: usize,
    pub(super) w: usize,
    pub(super) k: usize,
    pub(super) stride: usize,
    pub(super) padding: usize,
    pub(super) oh: usize,
    pub(super) ow: usize,
}

impl Geom {
    /// Rows of the patch matrix.
    pub(super) fn rows(&self) -> usize {
        self.c * self.k * self.k
    }

    /// For a stride-1 convolution, the geometry of its input gradient computed as a convolution
    /// of the output gradient (`[B, c_out, H', W']`) with the flipped, transposed kernel: padding
    /// `k − 1 − p`, output `[B, C, H, W]`. `None` for strides > 1 (or padding ≥ k), which take
    /// the GEMM + col2im path.
    pub(super) fn input_grad(&self, c_out: usize) -> Option<Geom> {
        if self.stride != 1 || self.padding >= self.k {
            return None;
        }
        Some(Geom {
            b: self.b,
            c: c_out,
            h: self.oh,
            w: self.ow,
            k: self.k,
            stride: 1,
            padding: self.k - 1 - self.padding,
            oh: self.h,
            ow: self.w,
        })
    }

    /// Output pixels per sample.
    pub(super) fn pixels(&self) -> usize {
        self.oh * self.ow
    }

    /// Samples per chunk of the patch matrix: enough columns (≥ 512) for an efficient GEMM,
    /// more while the chunk's patch matrix stays within half a core's L2 cache (512 KiB of
    /// f32, of 1 MiB on the machines kolo is measured on; the GEMM's packed operands need the
    /// rest). Working chunk by chunk keeps that matrix in cache between im2col and the GEMM
    /// that reads it. (2 MiB chunks made LeNet's convolutions 11 % slower, 3.9 vs 3.5 ms per
    /// step in `examples/conv_layers --model lenet`; ResNet-18's are not affected.)
    pub(super) fn chunk(&self) -> usize {
        const MIN_COLS: usize = 512;
        const CACHE_BYTES: usize = 512 << 10;
        let p = self.pixels().max(1);
        let by_cols = MIN_COLS.div_ceil(p);
        let by_cache = CACHE_BYTES / (4 * self.rows() * p).max(1);
        by_cols.max(by_cache).clamp(1, self.b.max(1))
    }

    /// For kernel offset `kk` along an axis of input size `size` and output size `out`: the
    /// range `lo..hi` of output positions whose input position `o·stride + kk − padding` lies
    /// inside the input (the others read padding), and the input position of `lo`.
    fn valid(&self, kk: usize, size: usize, out: usize) -> (usize, usize, usize) {
        let lo = if kk >= self.padding {
            0
        } else {
            (self.padding - kk).div_ceil(self.stride)
        };
        let hi = if size + self.padding <= kk {
            0
        } else {
            out.min((size + self.padding - kk - 1) / self.stride + 1)
        };
        let first = (lo * self.stride + kk).saturating_sub(self.padding);
        (lo, hi.max(lo), first)
    }
}

/// Splits `data` into chunks of `chunk` elements and runs `f(chunk_index, chunk)` on them,
/// spread over candle's threads (rayon's pool) where each thread gets enough to copy.
fn par_chunks_mut<T: Send>(data: &mut [T], chunk: usize, f: impl Fn(usize, &mut [T]) + Sync) {
    /// Values a thread copies at the least (a few hundred microseconds).
    const MIN_ELEMS_PER_THREAD: usize = 1 << 18;
    let chunk = chunk.max(1);
    let n_chunks = data.len().div_ceil(chunk);
    let threads = super::threads::for_work(data.len(), MIN_ELEMS_PER_THREAD).min(n_chunks);
    if threads <= 1 {
        for (i, c) in data.chunks_mut(chunk).enumerate() {
            f(i, c);
        }
        return;
    }
    // A task per thread's share of the chunks, on the pool's threads (no thread started here).
    let per_thread = n_chunks.div_ceil(threads);
    use rayon::prelude::*;
    data.par_chunks_mut(per_thread * chunk)
        .enumerate()
        .for_each(|(t, part)| {
            for (i, c) in part.chunks_mut(chunk).enumerate() {
                f(t * per_thread + i, c);
            }
        });
}

/// Samples `b0..b0 + bc` of `[B, C, H, W]` (any strides) -> patch matrix `[C·k·k, bc·H'·W']`
/// in `dst`, which must hold zeros (the padding is not written).
pub(super) fn im2col_into<T: WithDType>(
    src: &[T],
    layout: &Layout,
    g: &Geom,
    (b0, bc): (usize, usize),
    dst: &mut [T],
) -> Result<()> {
    let src = &src[layout.start_offset()..];
    let [s0, s1, s2, s3]: [usize; 4] = match layout.stride().try_into() {
        Ok(s) => s,
        Err(_) => candle_core::bail!("im2col: expected a rank-4 input"),
    };
    let n = bc * g.pixels();
    if dst.len() != g.rows() * n || b0 + bc > g.b {
        candle_core::bail!("im2col: a chunk of {bc} samples from {b0} does not fit");
    }
    let (stride, pixels) = (g.stride, g.pixels());
    par_chunks_mut(dst, n, |r, row| {
        let (ci, ky, kx) = (r / (g.k * g.k), (r / g.k) % g.k, r % g.k);
        let (y_lo, y_hi, iy_lo) = g.valid(ky, g.h, g.oh);
        let (x_lo, x_hi, ix_lo) = g.valid(kx, g.w, g.ow);
        let len = x_hi - x_lo;
        if len == 0 {
            return;
        }
        for bi in 0..bc {
            let base = (b0 + bi) * s0 + ci * s1 + ix_lo * s3;
            let out = &mut row[bi * pixels..(bi + 1) * pixels];
            let lines = y_hi - y_lo;
            if stride * s3 == 1 && lines > 0 {
                // The common case (stride 1, rows contiguous): row copies, no per-row checks.
                let src_len = (lines - 1) * stride * s2 + len;
                let at = base + iy_lo * s2;
                if let Some(src) = src.get(at..at + src_len) {
                    let dst = &mut out[y_lo * g.ow + x_lo..];
                    copy_rows((dst, g.ow), (src, stride * s2), lines, len);
                    continue;
                }
            }
            for (j, oy) in (y_lo..y_hi).enumerate() {
                let start = base + (iy_lo + j * stride) * s2;
                let line = &mut out[oy * g.ow + x_lo..oy * g.ow + x_hi];
                let step = stride * s3;
                // (Stride-1 contiguous rows took `copy_rows` above.)
                match src.get(start..start + step * len) {
                    // Fixed-step reads as pairs: vectorized (even elements of a run), where the
                    // run-time step of the general case is one load per element.
                    Some(run) if step == 2 => {
                        for (v, pair) in line.iter_mut().zip(run.chunks_exact(2)) {
                            *v = pair[0];
                        }
                    }
                    _ => {
                        for (i, v) in line.iter_mut().enumerate() {
                            *v = src[start + i * step];
                        }
                    }
                }
            }
        }
    });
    Ok(())
}

/// Patch-matrix gradient `[C·k·k, bc·H'·W']` of a chunk of `bc` samples -> their input gradient
/// added into `dst` (`[bc, C, H, W]`; the adjoint of [`im2col_into`]: overlapping patches add up).
pub(super) fn col2im_into<T: WithDType>(cols: &[T], g: &Geom, bc: usize, dst: &mut [T]) {
    let n = bc * g.pixels();
    let (stride, pixels) = (g.stride, g.pixels());
    par_chunks_mut(dst, g.h * g.w, |plane_idx, plane| {
        let (bi, ci) = (plane_idx / g.c, plane_idx % g.c);
        for ky in 0..g.k {
            let (y_lo, y_hi, iy_lo) = g.valid(ky, g.h, g.oh);
            for kx in 0..g.k {
                let (x_lo, x_hi, ix_lo) = g.valid(kx, g.w, g.ow);
                let len = x_hi - x_lo;
                if len == 0 {
                    continue;
                }
                let r = (ci * g.k + ky) * g.k + kx;
                let row = &cols[r * n + bi * pixels..r * n + (bi + 1) * pixels];
                let lines = y_hi - y_lo;
                if stride == 1 && lines > 0 {
                    // The common case: whole rows added, no per-row checks.
                    let at = iy_lo * g.w + ix_lo;
                    let dst = &mut plane[at..at + (lines - 1) * g.w + len];
                    let src = &row[y_lo * g.ow + x_lo..(y_hi - 1) * g.ow + x_hi];
                    add_rows((dst, g.w), (src, g.ow), lines, len);
                    continue;
                }
                for (j, oy) in (y_lo..y_hi).enumerate() {
                    let src = &row[oy * g.ow + x_lo..oy * g.ow + x_hi];
                    let start = (iy_lo + j * stride) * g.w + ix_lo;
                    match plane.get_mut(start..start + stride * len) {
                        // As in im2col: pairs, vectorized.
                        Some(run) if stride == 2 => {
                            for (pair, v) in run.chunks_exact_mut(2).zip(src) {
                                pair[0] += *v;
                            }
                        }
                        _ => {
                            for (i, v) in src.iter().enumerate() {
                                plane[start + i * stride] += *v;
                            }
                        }
                    }
                }
            }
        }
    });
}

/// The elements of a strided view of rank 1 or 4, in row-major order: borrowed where the view
/// is contiguous (a kernel or bias, as a rule: no copy of the weights per pass), gathered into a
/// new buffer otherwise.
pub(super) fn gather<'a, T: WithDType>((src, layout): (&'a [T], &Layout)) -> Result<Cow<'a, [T]>> {
    if let Some((start, end)) = layout.contiguous_offsets() {
        return match src.get(start..end) {
            Some(s) => Ok(Cow::Borrowed(s)),
            None => candle_core::bail!("kolo-conv2d: a view past its storage ({layout:?})"),
        };
    }
    let src = &src[layout.start_offset()..];
    match (layout.dims(), layout.stride()) {
        (&[d0], &[s0]) => Ok(Cow::Owned((0..d0).map(|i| src[i * s0]).collect())),
        (&[d0, d1, d2, d3], &[s0, s1, s2, s3]) => {
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
            Ok(Cow::Owned(out))
        }
        (dims, _) => candle_core::bail!("kolo-conv2d: unexpected operand shape {dims:?}"),
    }
}
