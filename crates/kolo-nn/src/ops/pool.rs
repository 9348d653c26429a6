//! 2×2 / stride-2 pooling with a fused backward pass.
//!
//! candle 0.11 differentiates `max_pool2d` through a chain of full-size tensor ops (upsample,
//! compare, average-pool the mask, multiply, upsample again, multiply) and only supports odd
//! sizes by accident; `avg_pool2d`'s backward is an upsample plus a scale. Here both directions
//! are single passes over the data, with PyTorch's semantics: floor mode (an odd trailing row /
//! column is ignored and gets zero gradient), and max-pooling routes the gradient to the first
//! maximum of each window (NaN counts as the maximum). Second derivatives are not supported.
//!
//! Non-CPU tensors and dtypes other than f32 / f64 fall back to candle's pooling ops.

use candle_core::{DType, Layout, Result, Shape, Tensor, WithDType};

use super::storage::{typed, Arg, CpuOp, Grads, Kernel, Output};

/// Pooling flavour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pool {
    Avg,
    Max,
}

/// Shape, strides and start offset of a rank-4 layout.
fn rank4(layout: &Layout, op: &str) -> Result<([usize; 4], [usize; 4], usize)> {
    match (
        <[usize; 4]>::try_from(layout.dims()),
        <[usize; 4]>::try_from(layout.stride()),
    ) {
        (Ok(d), Ok(s)) => Ok((d, s, layout.start_offset())),
        _ => candle_core::bail!("{op}: expected a rank-4 tensor, got {:?}", layout.shape()),
    }
}

/// Element addressing in a rank-4 strided layout whose planes are enumerated as `b·C + c`.
#[derive(Clone, Copy)]
struct Strided {
    c: usize,
    s: [usize; 4],
    offset: usize,
}

impl Strided {
    /// Index of element `(0, 0)` of `plane`.
    fn plane(&self, plane: usize) -> usize {
        let (b, c) = (plane / self.c, plane % self.c);
        self.offset + b * self.s[0] + c * self.s[1]
    }

    /// Index of element `(y, x)` of the plane starting at `base`.
    fn at(&self, base: usize, y: usize, x: usize) -> usize {
        base + y * self.s[2] + x * self.s[3]
    }
}

/// Position `(dy, dx)` of the maximum of the 2×2 window at `(y, x)` of the plane starting at
/// `base` (first maximum wins, NaN is the maximum).
fn argmax2x2<T: WithDType>(
    src: &[T],
    st: &Strided,
    base: usize,
    y: usize,
    x: usize,
) -> (usize, usize) {
    let mut best = (0, 0);
    let mut best_v = src[st.at(base, y, x)];
    // Only NaN is unordered with itself.
    let is_nan = |v: T| v.partial_cmp(&v).is_none();
    for (dy, dx) in [(0, 1), (1, 0), (1, 1)] {
        if is_nan(best_v) {
            break;
        }
        let v = src[st.at(base, y + dy, x + dx)];
        if v > best_v || is_nan(v) {
            best = (dy, dx);
            best_v = v;
        }
    }
    best
}

/// Average pooling of contiguous planes of `h × w` (`h`, `w` even or not): each output row from
/// two input rows, pairs summed — loops over fixed-size pairs that vectorize, where the general
/// strided loop computes one index per element.
fn avg_fwd_contiguous<T: WithDType>(src: &[T], planes: usize, h: usize, w: usize) -> Vec<T> {
    let (oh, ow) = (h / 2, w / 2);
    let quarter = T::from_f64(0.25);
    let mut dst = Vec::with_capacity(planes * oh * ow);
    for plane in src.chunks_exact(h * w).take(planes) {
        for rows in plane.chunks_exact(2 * w).take(oh) {
            let (r0, r1) = rows.split_at(w);
            let pairs = r0.chunks_exact(2).zip(r1.chunks_exact(2)).take(ow);
            dst.extend(pairs.map(|(a, b)| (a[0] + a[1] + b[0] + b[1]) * quarter));
        }
    }
    dst
}

fn pool_fwd<T: WithDType>(src: &[T], layout: &Layout, pool: Pool) -> Result<(Vec<T>, Shape)> {
    let ([b, c, h, w], s, offset) = rank4(layout, "kolo-pool2x2")?;
    let (oh, ow) = (h / 2, w / 2);
    if pool == Pool::Avg {
        if let Some((start, end)) = layout.contiguous_offsets() {
            if let Some(src) = src.get(start..end) {
                let dst = avg_fwd_contiguous(src, b * c, h, w);
                return Ok((dst, Shape::from((b, c, oh, ow))));
            }
        }
    }
    let st = Strided { c, s, offset };
    let quarter = T::from_f64(0.25);
    let mut dst = Vec::with_capacity(b * c * oh * ow);
    for plane in 0..b * c {
        let base = st.plane(plane);
        for oy in 0..oh {
            for ox in 0..ow {
                let (y, x) = (2 * oy, 2 * ox);
                let v = match pool {
                    Pool::Max => {
                        let (dy, dx) = argmax2x2(src, &st, base, y, x);
                        src[st.at(base, y + dy, x + dx)]
                    }
                    Pool::Avg => {
                        (src[st.at(base, y, x)]
                            + src[st.at(base, y, x + 1)]
                            + src[st.at(base, y + 1, x)]
                            + src[st.at(base, y + 1, x + 1)])
                            * quarter
                    }
                };
                dst.push(v);
            }
        }
    }
    Ok((dst, Shape::from((b, c, oh, ow))))
}

/// Input gradient of a 2×2 pooling: `input` is the pooled input (needed for max pooling), `grad`
/// the gradient of the pooled output.
fn pool_bwd<T: WithDType>(
    input: (&[T], &Layout),
    grad: (&[T], &Layout),
    pool: Pool,
) -> Result<(Vec<T>, Shape)> {
    let ([b, c, h, w], s_in, off_in) = rank4(input.1, "kolo-pool2x2-backward")?;
    let (g_dims, s_g, off_g) = rank4(grad.1, "kolo-pool2x2-backward")?;
    let (oh, ow) = (h / 2, w / 2);
    if g_dims != [b, c, oh, ow] {
        candle_core::bail!(
            "kolo-pool2x2-backward: gradient {:?} does not match input {:?}",
            grad.1.shape(),
            input.1.shape()
        );
    }
    let at_in = Strided {
        c,
        s: s_in,
        offset: off_in,
    };
    let at_g = Strided {
        c,
        s: s_g,
        offset: off_g,
    };
    let quarter = T::from_f64(0.25);
    if pool == Pool::Avg && h % 2 == 0 && w % 2 == 0 && ow > 0 {
        if let Some(g) = grad
            .1
            .contiguous_offsets()
            .and_then(|(a, z)| grad.0.get(a..z))
        {
            // Every input element gets a quarter of its window's gradient: each gradient row
            // widened once (each value to a pair) and written as two input rows — no zero
            // fill, no per-element indexing.
            let mut dst = Vec::with_capacity(b * c * h * w);
            let mut wide = vec![T::zero(); w];
            for row in g.chunks_exact(ow) {
                for (pair, &v) in wide.chunks_exact_mut(2).zip(row) {
                    pair[0] = v * quarter;
                    pair[1] = v * quarter;
                }
                dst.extend_from_slice(&wide);
                dst.extend_from_slice(&wide);
            }
            return Ok((dst, Shape::from((b, c, h, w))));
        }
    }
    let mut dst = vec![T::zero(); b * c * h * w];
    for (plane, out) in dst.chunks_mut(h * w).enumerate() {
        let (base_in, base_g) = (at_in.plane(plane), at_g.plane(plane));
        for oy in 0..oh {
            for ox in 0..ow {
                let (y, x) = (2 * oy, 2 * ox);
                let g = grad.0[at_g.at(base_g, oy, ox)];
                match pool {
                    Pool::Max => {
                        let (dy, dx) = argmax2x2(input.0, &at_in, base_in, y, x);
                        out[(y + dy) * w + x + dx] = g;
                    }
                    Pool::Avg => {
                        let g = g * quarter;
                        out[y * w + x] = g;
                        out[y * w + x + 1] = g;
                        out[(y + 1) * w + x] = g;
                        out[(y + 1) * w + x + 1] = g;
                    }
                }
            }
        }
    }
    Ok((dst, Shape::from((b, c, h, w))))
}

/// The forward pooling op (with backward).
struct Pool2x2(Pool);

impl Kernel<1> for Pool2x2 {
    fn name(&self) -> &'static str {
        match self.0 {
            Pool::Avg => "kolo-avgpool2x2",
            Pool::Max => "kolo-maxpool2x2",
        }
    }

    fn forward<T: WithDType>(&self, [x]: [Arg<'_>; 1]) -> Output {
        let (x, layout) = typed::<T>(x, self.name())?;
        let (y, shape) = pool_fwd(x, layout, self.0)?;
        Ok((T::to_cpu_storage_owned(y), shape))
    }

    fn backward(&self, [x]: [&Tensor; 1], _: &Tensor, grad: &Tensor) -> Grads<1> {
        let op = CpuOp(Pool2x2Backward(self.0));
        Ok([Some(x.detach().apply_op2_no_bwd(&grad.detach(), &op)?)])
    }
}

/// `(input, output gradient) -> input gradient` (no backward of its own).
struct Pool2x2Backward(Pool);

impl Kernel<2> for Pool2x2Backward {
    fn name(&self) -> &'static str {
        "kolo-pool2x2-backward"
    }

    fn forward<T: WithDType>(&self, [x, g]: [Arg<'_>; 2]) -> Output {
        let op = self.name();
        let (dx, shape) = pool_bwd(typed::<T>(x, op)?, typed::<T>(g, op)?, self.0)?;
        Ok((T::to_cpu_storage_owned(dx), shape))
    }
}

/// `max_pool2d(x, 2)` as PyTorch computes it (floor mode; the gradient goes to the first
/// maximum of each window), differentiable. `x` is `[B, C, H, W]` with `H, W ≥ 2`; the result is
/// `[B, C, H/2, W/2]` (rounded down).
pub fn max_pool2x2(x: &Tensor) -> Result<Tensor> {
    pool2x2(x, Pool::Max)
}

/// `avg_pool2d(x, 2)` as PyTorch computes it (floor mode), differentiable. `x` is
/// `[B, C, H, W]` with `H, W ≥ 2`; the result is `[B, C, H/2, W/2]` (rounded down).
pub fn avg_pool2x2(x: &Tensor) -> Result<Tensor> {
    pool2x2(x, Pool::Avg)
}

/// 2×2 pooling with stride 2 and PyTorch's floor semantics (an odd trailing row / column is
/// dropped). `x` is `[B, C, H, W]` with `H, W ≥ 2`.
pub(crate) fn pool2x2(x: &Tensor, pool: Pool) -> Result<Tensor> {
    let (_, _, h, w) = x.dims4()?;
    if h < 2 || w < 2 {
        candle_core::bail!("pool2x2: input {:?} is smaller than the window", x.shape());
    }
    if x.device().is_cpu() && matches!(x.dtype(), DType::F32 | DType::F64) {
        return x.apply_op1(CpuOp(Pool2x2(pool)));
    }
    // Fallback: crop to even sizes first, which keeps candle's backward pass (it upsamples the
    // gradient back to the pooled input's size) exact.
    let x = x.narrow(2, 0, h - h % 2)?.narrow(3, 0, w - w % 2)?;
    match pool {
        Pool::Avg => x.avg_pool2d(2),
        Pool::Max => x.max_pool2d(2),
    }
}
