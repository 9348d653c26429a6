//! Strided convolutions (ResNet's stride-2 layers and their 1×1 shortcuts) on the implicit GEMM,
//! their input split into phases ([`Phases`]) so that every tap is a shifted read again — each
//! of the `k²` taps from its own phase, no product wasted on taps that are not there.
//!
//! - Forward: one product over the phase images' grid, `k = (tap, channel)` as in the stride-1
//!   case, tap `(kh, kw)`'s steps reading phase `(kh mod s, kw mod s)` at `(kh / s, kw / s)`.
//! - Input gradient: one product per phase `(a, b)` over the output gradient's grid (padded by
//!   `k' − 1`), along that phase's taps only, its kernel those taps' slices of `w` transposed;
//!   the phases' gradients then interleave back into the input's.
//! - Kernel gradient: per tap, the phase's planes shifted along the output gradient's grid, as
//!   in the stride-1 case.

use candle_core::{Layout, Result};

use super::super::bf16_gemm::pack_b_gathered;
use super::super::im2col::{gather, Geom};
use super::layout::{Epilogue, Grid};
use super::{
    compact, dw_from_taps, grid_product, grid_product_of, pack_kernel, tap_grads_of, Job, Phases,
};

/// The phase form of `g`, or an error where [`super::eligible`] was not asked first.
fn phases(g: &Geom) -> Result<Phases> {
    match Phases::of(g) {
        Some(ph) => Ok(ph),
        None => candle_core::bail!(
            "kolo-conv2d-tiles: stride {} has no phase form here",
            g.stride
        ),
    }
}

/// The grid of the phase images (all `np² · C` channels, the whole batch).
fn phase_cells(ph: &Phases) -> Grid {
    let g1 = &ph.g1;
    Grid {
        bc: g1.b,
        c: g1.c,
        h: g1.h,
        w: g1.w,
        pad: 0,
    }
}

/// `y = conv(x, w) (+ bias)`, ReLU'd if `relu`, `[B, c_out, H', W']`.
pub(super) fn forward(
    x: (&[f32], &Layout),
    g: &Geom,
    (w, c_out): (&[f32], usize),
    e: Epilogue<'_>,
) -> Result<Vec<f32>> {
    let ph = phases(g)?;
    let x = gather(x)?;
    let (c, k, s) = (g.c, g.k, g.stride);
    let (c1, w1) = (ph.g1.c, ph.g1.w);
    // `pack_kernel`'s order of `k`: (tap, block of 32 channels).
    let a_k = (0..k * k * c / 32)
        .map(|kb| {
            let (t, cb) = (kb * 32 / c, kb * 32 % c);
            let (kh, kw) = (t / k, t % k);
            ((kh / s) * w1 + kw / s) * c1 + ph.channel(kh % s, kw % s, cb)
        })
        .collect();
    let mut job = [Job {
        a_k,
        packed: pack_kernel(w, c_out, c, k),
        c_out,
        dims: (g.oh, g.ow),
        e,
        y: Vec::new(),
    }];
    let lay = |grid: Grid, b0, out: &mut [u16]| ph.to_grid(&x, (b0, grid.bc), out);
    grid_product_of(lay, phase_cells(&ph), (ph.g1.k - 1) * (w1 + 1), &mut job);
    let [job] = job;
    Ok(job.y)
}

/// The input and kernel gradients asked for (`dx` `[B, C, H, W]`, then `dw` `[c_out, C, k, k]`)
/// appended to `out`.
pub(super) fn backward(
    x: (&[f32], &Layout),
    (w, c_out): (&[f32], usize),
    g: &Geom,
    grad: &[f32],
    (want_x, want_w): (bool, bool),
    out: &mut Vec<f32>,
) -> Result<()> {
    let ph = phases(g)?;
    let (c, k, s, np) = (g.c, g.k, g.stride, ph.np);
    let g1 = &ph.g1;
    let (kp, w1) = (g1.k, g1.w);
    if want_x {
        // The output gradient on a grid padded by k' − 1: its cells are the phase images'.
        let cells = Grid {
            bc: g.b,
            c: c_out,
            h: g.oh,
            w: g.ow,
            pad: kp - 1,
        };
        let mut jobs: Vec<Job<'_>> = (0..np * np)
            .map(|phase| {
                let (a, b) = (phase / np, phase % np);
                // This phase's taps (kh, kw) = (s·t1 + a, s·t2 + b).
                let taps: Vec<(usize, usize)> = (0..kp)
                    .flat_map(|t1| (0..kp).map(move |t2| (t1, t2)))
                    .filter(|&(t1, t2)| s * t1 + a < k && s * t2 + b < k)
                    .collect();
                // Phase pixel (u, v) takes dy(u − t1, v − t2): grid row q + (k' − 1 − t1)·w1
                // + (k' − 1 − t2) of the padded output gradient.
                let a_k = taps
                    .iter()
                    .flat_map(|&(t1, t2)| {
                        let off = ((kp - 1 - t1) * w1 + (kp - 1 - t2)) * c_out;
                        (0..c_out / 32).map(move |cb| off + 32 * cb)
                    })
                    .collect();
                // `B`: row (tap, co), column ch: w[co][ch][kh][kw].
                let tap_at: Vec<usize> = taps
                    .iter()
                    .map(|&(t1, t2)| (s * t1 + a) * k + s * t2 + b)
                    .collect();
                let packed = pack_b_gathered(
                    w,
                    (taps.len() * c_out, c),
                    |kk| (kk % c_out) * c * k * k + tap_at[kk / c_out],
                    k * k,
                );
                Job {
                    a_k,
                    packed,
                    c_out: c,
                    dims: (g1.h, w1),
                    e: Epilogue {
                        bias: None,
                        relu: false,
                    },
                    y: Vec::new(),
                }
            })
            .collect();
        grid_product(grad, cells, (kp - 1) * (w1 + 1), &mut jobs);
        let phase_grads: Vec<Vec<f32>> = jobs.into_iter().map(|j| j.y).collect();
        ph.input_grad(&phase_grads, out);
    }
    if want_w {
        let x = gather(x)?;
        if compact::pays_strided(g, g1.h * w1) {
            let acc = compact::tap_grads(&x, g, grad, c_out);
            dw_from_taps(&acc, (c, c_out, k * k), out);
            return Ok(());
        }
        let taps: Vec<(usize, usize)> = (0..k * k)
            .map(|t| {
                let (kh, kw) = (t / k, t % k);
                (ph.channel(kh % s, kw % s, 0), (kh / s) * w1 + kw / s)
            })
            .collect();
        let planes =
            |grid: Grid, b0, stride, out: &mut [u16]| ph.to_planes(&x, (b0, grid.bc), stride, out);
        let dy = (grad, c_out, g.oh, g.ow);
        let acc = tap_grads_of(planes, phase_cells(&ph), dy, &taps, c);
        dw_from_taps(&acc, (c, c_out, k * k), out);
    }
    Ok(())
}
