//! Winograd F(4×4, 3×3) and F(2×2, 3×3) for the 3×3 stride-1 convolutions (Lavin & Gray, "Fast
//! Algorithms for Convolutional Neural Networks", 2016): forward pass, input gradient and kernel
//! gradient, taken by [`super::conv`] where [`eligible`]'s cost model says one of them pays.
//!
//! With F(4×4, 3×3), a 4×4 output tile from a 6×6 input tile `d` and a 3×3 kernel `g` is
//! `Aᵀ[(G g Gᵀ) ⊙ (Bᵀ d B)]A`: 36 multiplications per channel pair instead of 144 (F(2×2, 3×3):
//! 16 instead of 36, from 4×4 input tiles). Summed over input channels, the 36 element-wise
//! products become 36 GEMMs `M[e] = U[e] @ V[e]` (`U[e]`: `[c_out, C]` transformed kernels,
//! `V[e]`: `[C, tiles]` transformed input tiles), done chunk by chunk of samples so that `V` and
//! `M` stay in cache. The backward pass transforms the output gradient once, `dM = A dy Aᵀ`; the
//! kernel gradient is `dg = Gᵀ[Σ_tiles dM ⊙ (Bᵀ d B)]G` (36 GEMMs `dU[e] += dM[e] @ V[e]ᵀ`), the
//! input gradient the forward pass's adjoint (`dV[e] = U[e]ᵀ @ dM[e]`, then `B dV Bᵀ` added tile
//! by tile, overlapping tiles summing up).
//!
//! The transforms work on [`LANES`](lanes::LANES) tiles at a time (one SIMD register of f32 per
//! value); both algorithms share every pass, generic over their [`Transforms`].

use std::borrow::Cow;

use candle_core::{Layout, Result, WithDType};

use super::gemm::{matmul_into, MatRef};
use super::im2col::Geom;
use super::matmul_precision::f32_products;
use super::scratch::{keep_vec, Scratch};
use super::slices::copy_row;
use super::threads::for_each_block;

mod f32x8;
mod lanes;
mod passes;
#[cfg(test)]
mod tests;
mod transforms;

use lanes::{Tiles, Transforms};
use passes::{
    grad_transform, input_grad_transform, input_transform, kernel_grad_transform, kernel_transform,
    output_transform, OutChunk,
};
use transforms::{F2, F4};

/// Which Winograd algorithm a convolution takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Variant {
    /// F(4×4, 3×3): 6×6 input tiles, 36 GEMMs.
    F4,
    /// F(2×2, 3×3): 4×4 input tiles, 16 GEMMs.
    F2,
}

impl Variant {
    /// Output tile side.
    fn m(self) -> usize {
        match self {
            Variant::F4 => 4,
            Variant::F2 => 2,
        }
    }

    /// Elements of a transformed tile (`(m + 2)²`): one GEMM each.
    fn e(self) -> usize {
        (self.m() + 2) * (self.m() + 2)
    }
}

/// Which Winograd algorithm, if any, `g` (with `c_out` output channels) takes: 3×3, stride 1,
/// enough channels on both sides for the GEMMs to be efficient, and enough tiles to pay for the
/// kernel transforms.
///
/// The cost model, per pair of channels: the direct (im2col) GEMM does `2·9·B·oh·ow` flops;
/// Winograd `2·E·tiles` (`E` = 36 for F(4, 3), 16 for F(2, 3)) plus the transformed kernels, `E`
/// values written and read again (`E·8` bytes, about 20 flops' time per byte at this class of
/// CPU's GEMM speed and memory bandwidth). With few tiles per kernel — ResNet's 512-channel stage
/// on 4×4 images, one F(4, 3) tile per sample — F(4, 3)'s kernel transforms cost as much as they
/// save, F(2, 3)'s (fewer values per kernel, more and smaller tiles) less. The cheaper algorithm
/// is taken where it is at least 1.25× cheaper than the direct GEMM.
pub(super) fn eligible(g: &Geom, c_out: usize) -> Option<Variant> {
    const MIN_CHANNELS: usize = 8;
    if !(g.k == 3 && g.stride == 1 && g.c >= MIN_CHANNELS && c_out >= MIN_CHANNELS && g.b > 0) {
        return None;
    }
    let direct = 2 * 9 * g.b * g.oh * g.ow;
    let cost = |v: Variant| {
        let tiles = g.b * Tiles::of(g, v.m()).per_sample();
        2 * v.e() * tiles + v.e() * 8 * 20
    };
    let (variant, winograd) = [Variant::F4, Variant::F2]
        .into_iter()
        .map(|v| (v, cost(v)))
        .min_by_key(|&(_, c)| c)?;
    (4 * direct >= 5 * winograd).then_some(variant)
}

/// Bytes of a chunk's `V` and `M` (`e` values per tile): about 4 MiB. Smaller chunks measured
/// slower end to end (1 MiB: −25 %, 2 MiB: −9 %), larger ones no faster (8 MiB) or slower.
const CHUNK_BYTES: usize = 4 << 20;

/// Samples per chunk: `V` and `M` of a chunk (`e` values per tile) within `budget` bytes.
fn chunk(g: &Geom, c_out: usize, t: Tiles, e: usize, budget: usize) -> usize {
    let per_sample = e * (g.c + c_out) * t.per_sample() * std::mem::size_of::<f32>();
    (budget / per_sample.max(1)).clamp(1, g.b.max(1))
}

/// Samples `b0..b0 + bc` of `x` (`[B, C, H, W]`, any strides), zero-padded to
/// `[bc, C, m·rows + 2, m·cols + 2]` with `g.padding` rows and columns before the data (every
/// input tile lies inside), written into `out` (that many values; every one of them is written,
/// so it may hold anything before).
fn pad_input<T: WithDType>(
    x: (&[T], &Layout),
    g: &Geom,
    (t, m): (Tiles, usize),
    (b0, bc): (usize, usize),
    out: &mut [T],
) -> Result<()> {
    let [s0, s1, s2, s3]: [usize; 4] = match x.1.stride().try_into() {
        Ok(s) => s,
        Err(_) => candle_core::bail!("kolo-conv2d: expected a rank-4 input"),
    };
    let src = &x.0[x.1.start_offset()..];
    let (ph, pw) = (m * t.rows + 2, m * t.cols + 2);
    // The tiles cover the output, `oh = h + 2·padding − 2 ≤ m·rows`: the data and the padding
    // on both sides fit.
    let (top, left) = (g.padding, g.padding);
    if out.len() != bc * g.c * ph * pw || top + g.h > ph || left + g.w > pw {
        candle_core::bail!(
            "kolo-conv2d: padded chunk of {} values does not fit",
            out.len()
        );
    }
    for (plane_idx, plane) in out.chunks_mut(ph * pw).enumerate() {
        let (bi, c) = (plane_idx / g.c, plane_idx % g.c);
        let (above, rest) = plane.split_at_mut(top * pw);
        let (rows, below) = rest.split_at_mut(g.h * pw);
        above.fill(T::zero());
        below.fill(T::zero());
        for (iy, line) in rows.chunks_exact_mut(pw).enumerate() {
            let at = (b0 + bi) * s0 + c * s1 + iy * s2;
            let (lead, data) = line.split_at_mut(left);
            let (row, trail) = data.split_at_mut(g.w);
            lead.fill(T::zero());
            trail.fill(T::zero());
            if s3 == 1 {
                copy_row(row, &src[at..at + g.w]);
            } else {
                for (ix, v) in row.iter_mut().enumerate() {
                    *v = src[at + ix * s3];
                }
            }
        }
    }
    Ok(())
}

/// For each tile of a chunk, in order (sample, tile row, tile column): the offset of its top-left
/// corner in the chunk's first channel (tiles `step` apart, rows `pw` apart, samples
/// `sample_stride` apart); channel `c` adds `c` planes.
fn tile_offsets(bc: usize, t: Tiles, step: usize, pw: usize, sample_stride: usize) -> Vec<usize> {
    let mut out = Vec::with_capacity(bc * t.per_sample());
    for bi in 0..bc {
        for ty in 0..t.rows {
            for tx in 0..t.cols {
                out.push(bi * sample_stride + step * ty * pw + step * tx);
            }
        }
    }
    out
}

/// The zero-padded output gradient of samples `b0..b0 + bc` (`grad`: contiguous
/// `[B, c_out, oh, ow]`) as `[bc, c_out, m·rows, m·cols]`: the chunk of `grad` itself where the
/// tiles cover it exactly, a padded copy otherwise.
fn pad_grad<'a, T: WithDType>(
    grad: &'a [T],
    g: &Geom,
    c_out: usize,
    (t, m): (Tiles, usize),
    (b0, bc): (usize, usize),
) -> Cow<'a, [T]> {
    let (ph, pw) = (m * t.rows, m * t.cols);
    let (oh, ow) = (g.oh, g.ow);
    let src = &grad[b0 * c_out * oh * ow..(b0 + bc) * c_out * oh * ow];
    if (ph, pw) == (oh, ow) {
        return Cow::Borrowed(src);
    }
    let mut out = vec![T::zero(); bc * c_out * ph * pw];
    for (plane, s) in out.chunks_mut(ph * pw).zip(src.chunks(oh * ow)) {
        for (row, s) in plane.chunks_mut(pw).zip(s.chunks(ow)) {
            row[..ow].copy_from_slice(s);
        }
    }
    Cow::Owned(out)
}

/// The output channels of the kernel `w` (`[c_out, C, 3, 3]`, contiguous) of the 3×3 stride-1
/// convolution `g`; `None` if `g` is not one or `w` does not fit it.
fn out_channels<T>(g: &Geom, w: &[T]) -> Option<usize> {
    let c_out = w.len() / (9 * g.c).max(1);
    (g.k == 3 && g.stride == 1 && c_out * 9 * g.c == w.len()).then_some(c_out)
}

/// The forward pass `y = conv(x, w) (+ bias)`, `[B, c_out, oh, ow]`, of an [`eligible`]
/// convolution by the algorithm `variant`; `w` is the contiguous `[c_out, C, 3, 3]` kernel.
/// Returns `y` and the transformed kernel `U`, which [`backward`] can take instead of
/// transforming the kernel again.
pub(super) fn forward<T: WithDType>(
    x: (&[T], &Layout),
    g: &Geom,
    w: &[T],
    bias: Option<&[T]>,
    variant: Variant,
) -> Result<(Vec<T>, Vec<T>)> {
    match variant {
        Variant::F4 => f32_products(|| forward_with::<T, F4, 4, 6>(x, g, w, bias)),
        Variant::F2 => forward_with::<T, F2, 2, 4>(x, g, w, bias),
    }
}

/// [`forward`] by the algorithm `W`.
fn forward_with<T: WithDType, W: Transforms<M, A>, const M: usize, const A: usize>(
    x: (&[T], &Layout),
    g: &Geom,
    w: &[T],
    bias: Option<&[T]>,
) -> Result<(Vec<T>, Vec<T>)> {
    const OP: &str = "kolo-conv2d-winograd";
    let elems = A * A;
    let Some(c_out) = out_channels(g, w).filter(|&c| bias.is_none_or(|b| b.len() == c)) else {
        candle_core::bail!(
            "{OP}: kernel of {} values for {} input channels",
            w.len(),
            g.c
        );
    };
    let u = kernel_transform::<T, W, M, A>(w, c_out, g.c);
    let t = Tiles::of(g, M);
    // Every chunk reads all of `U`: where it is the larger buffer (ResNet's 256- and 512-channel
    // stages), chunks of at least its size, as in [`backward`].
    let chunk = chunk(
        g,
        c_out,
        t,
        A * A,
        CHUNK_BYTES.max(std::mem::size_of_val(&u[..])),
    );
    let mut y = vec![T::zero(); g.b * c_out * g.oh * g.ow];
    // The first chunk is the largest.
    let (ph, pw) = (M * t.rows + 2, M * t.cols + 2);
    let (p_len, tiles) = (chunk * g.c * ph * pw, chunk * t.per_sample());
    let mut p_buf = Scratch::take(p_len);
    let mut v_buf = Scratch::take(elems * g.c * tiles);
    let mut m_buf = Scratch::take(elems * c_out * tiles);
    for b0 in (0..g.b).step_by(chunk) {
        let bc = chunk.min(g.b - b0);
        let p = p_buf.slice(bc * g.c * ph * pw);
        pad_input(x, g, (t, M), (b0, bc), p)?;
        let offsets = tile_offsets(bc, t, M, pw, g.c * ph * pw);
        let tc = offsets.len();
        // Both written in full below (transform, GEMMs without accumulation).
        let v = v_buf.slice(elems * g.c * tc);
        let m = m_buf.slice(elems * c_out * tc);
        input_transform::<T, W, M, A>(p, ph * pw, pw, &offsets, v);
        let v = &*v;
        for_each_block(m, c_out * tc, |e, m_e| {
            matmul_into(
                OP,
                m_e,
                (tc, 1),
                MatRef::row_major(&u[e * c_out * g.c..(e + 1) * c_out * g.c], c_out, g.c),
                MatRef::row_major(&v[e * g.c * tc..(e + 1) * g.c * tc], g.c, tc),
                false,
            )
        })?;
        let out = OutChunk {
            y: &mut y,
            b0,
            c_out,
            oh: g.oh,
            ow: g.ow,
        };
        output_transform::<T, W, M, A>(m, t, bias, out);
    }
    Ok((y, u))
}

/// The wanted gradients of an [`eligible`] convolution: of its input (`[B, C, H, W]`) and of
/// its kernel (`[c_out, C, 3, 3]`, `w`), from the input `x`, the kernel and the output gradient
/// `grad` (contiguous `[B, c_out, oh, ow]`). Both come from the output gradient's transform
/// `dM = A dy Aᵀ`: the kernel gradient as `Gᵀ[Σ_tiles dM ⊙ V]G` (36 GEMMs `dU[e] += dM[e] @
/// V[e]ᵀ`), the input gradient as the adjoint of the forward pass, `dV[e] = U[e]ᵀ @ dM[e]` and
/// `B dV Bᵀ` added tile by tile into the (padded) input gradient. `u` is the transformed kernel
/// [`forward`] returned for `w`, if kept (it is computed again otherwise). The wanted
/// gradients are appended to `out`: the input gradient, then the kernel gradient.
pub(super) fn backward<T: WithDType>(
    x: (&[T], &Layout),
    (w, u): (&[T], Option<&[T]>),
    g: &Geom,
    grad: &[T],
    want: (bool, bool),
    variant: Variant,
    out: &mut Vec<T>,
) -> Result<()> {
    match variant {
        Variant::F4 => f32_products(|| backward_with::<T, F4, 4, 6>(x, (w, u), g, grad, want, out)),
        Variant::F2 => backward_with::<T, F2, 2, 4>(x, (w, u), g, grad, want, out),
    }
}

/// [`backward`] by the algorithm `W`.
fn backward_with<T: WithDType, W: Transforms<M, A>, const M: usize, const A: usize>(
    x: (&[T], &Layout),
    (w, u): (&[T], Option<&[T]>),
    g: &Geom,
    grad: &[T],
    (want_x, want_w): (bool, bool),
    out: &mut Vec<T>,
) -> Result<()> {
    const OP: &str = "kolo-conv2d-winograd-backward";
    let elems = A * A;
    let Some(c_out) = out_channels(g, w).filter(|&c| grad.len() == g.b * c * g.oh * g.ow) else {
        candle_core::bail!("{OP}: gradient of {} values does not match", grad.len());
    };
    let (c, t) = (g.c, Tiles::of(g, M));
    // The kernel gradient `dU` is accumulated chunk by chunk: each chunk reads and writes all of
    // it. Where `dU` is the larger buffer (many channels, few tiles: ResNet's 256- and
    // 512-channel stages, 9–17 MB), chunks of at least its size cost less memory traffic than
    // cache-sized ones (256 channels at 7×7: 21.8 -> 19.8 ms per step).
    let du_bytes = if want_w {
        elems * c_out * c * std::mem::size_of::<T>()
    } else {
        0
    };
    let chunk = chunk(g, c_out, t, A * A, CHUNK_BYTES.max(du_bytes));
    let u = match u {
        _ if !want_x => Cow::Owned(Vec::new()),
        None => Cow::Owned(kernel_transform::<T, W, M, A>(w, c_out, c)),
        Some(u) if u.len() == elems * c_out * c => Cow::Borrowed(u),
        Some(u) => candle_core::bail!("{OP}: a transformed kernel of {} values", u.len()),
    };
    // dU: written by the first chunk's GEMMs, accumulated by the others.
    let du_len = if want_w { elems * c_out * c } else { 0 };
    let mut du_buf = Scratch::take(du_len);
    let du = du_buf.slice(du_len);
    out.reserve(
        if want_x { g.b * c * g.h * g.w } else { 0 } + if want_w { 9 * c_out * c } else { 0 },
    );
    let (ph, pw) = (M * t.rows + 2, M * t.cols + 2);
    // The first chunk is the largest.
    let tiles = chunk * t.per_sample();
    let mut dm_buf = Scratch::take(elems * c_out * tiles);
    let mut v_buf = Scratch::take(if want_w { elems * c * tiles } else { 0 });
    let mut p_buf = Scratch::take(if want_w { chunk * c * ph * pw } else { 0 });
    let mut dv_buf = Scratch::take(if want_x { elems * c * tiles } else { 0 });
    let mut pdx = Vec::new();
    let (gh, gw) = (M * t.rows, M * t.cols);
    for b0 in (0..g.b).step_by(chunk) {
        let bc = chunk.min(g.b - b0);
        let offsets = tile_offsets(bc, t, M, pw, c * ph * pw);
        let tc = offsets.len();
        let pg = pad_grad(grad, g, c_out, (t, M), (b0, bc));
        let g_offsets = tile_offsets(bc, t, M, gw, c_out * gh * gw);
        // dM, V and dV are written in full before they are read.
        let dm = dm_buf.slice(elems * c_out * tc);
        grad_transform::<T, W, M, A>(&pg, gh * gw, gw, &g_offsets, dm);
        let dm = &*dm;
        let dm_e =
            |e: usize| MatRef::row_major(&dm[e * c_out * tc..(e + 1) * c_out * tc], c_out, tc);
        if want_w {
            let p = p_buf.slice(bc * c * ph * pw);
            pad_input(x, g, (t, M), (b0, bc), p)?;
            let v = v_buf.slice(elems * c * tc);
            input_transform::<T, W, M, A>(p, ph * pw, pw, &offsets, v);
            let v = &*v;
            for_each_block(&mut du[..], c_out * c, |e, du_e| {
                let v_e = MatRef::row_major(&v[e * c * tc..(e + 1) * c * tc], c, tc);
                matmul_into(OP, du_e, (c, 1), dm_e(e), v_e.t(), b0 > 0)
            })?;
        }
        if want_x {
            let dv = dv_buf.slice(elems * c * tc);
            for_each_block(dv, c * tc, |e, dv_e| {
                let u_e = MatRef::row_major(&u[e * c_out * c..(e + 1) * c_out * c], c_out, c);
                matmul_into(OP, dv_e, (tc, 1), u_e.t(), dm_e(e), false)
            })?;
            pdx.clear();
            pdx.resize(bc * c * ph * pw, T::zero());
            input_grad_transform::<T, W, M, A>(dv, ph * pw, pw, &offsets, &mut pdx);
            // Crop the padding away; the chunks come in order, so `dx` grows by appending.
            for p in pdx.chunks(ph * pw) {
                for iy in 0..g.h {
                    let at = (iy + g.padding) * pw + g.padding;
                    out.extend_from_slice(&p[at..at + g.w]);
                }
            }
        }
    }
    if want_w {
        kernel_grad_transform::<T, W, M, A>(du, c_out, c, out);
    }
    if let Cow::Owned(u) = u {
        keep_vec(u);
    }
    Ok(())
}
