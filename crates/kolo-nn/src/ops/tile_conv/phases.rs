//! The phases of a strided convolution's input, which put it on the same implicit GEMM as the
//! stride-1 ones ([`super::strided`]).
//!
//! Output `(i, j)` of a stride-`s` convolution reads input `(s·i + kh − p, s·j + kw − p)`. Split
//! the zero-padded input by `(row mod s, column mod s)` into `np²` phase images (`np = min(s,
//! k)`: phases no tap reads are left out); phase `(a, b)` holds padded pixel `(s·u + a, s·v +
//! b)` at `(u, v)`. Tap `(kh, kw)` then reads phase `(kh mod s, kw mod s)` at `(i + kh / s, j +
//! kw / s)`: the same shifted reads as a stride-1 convolution's, on images of `⌈k / s⌉ − 1`
//! more rows and columns than the output. Each input pixel lies in exactly one phase (or in
//! none where no tap reads it), which is how the input gradient comes back.

use std::arch::x86_64::*;

use super::super::im2col::Geom;
use super::layout::transpose16;

/// A strided convolution and its stride-1 form over the phases.
pub(super) struct Phases {
    /// The strided convolution.
    g: Geom,
    /// Phases per side (`min(stride, k)`).
    pub(super) np: usize,
    /// The phase images as a stride-1 convolution's input: `np² · C` channels of `H1 × W1`
    /// (`H' + k' − 1` by `W' + k' − 1`), kernel side `k' = ⌈k / s⌉`, no padding, the same
    /// output.
    pub(super) g1: Geom,
}

impl Phases {
    /// The phase form of `g`, a convolution of stride 2 or more whose output size is the
    /// usual `(H + 2p − k) / s + 1`; `None` otherwise.
    pub(super) fn of(g: &Geom) -> Option<Phases> {
        let s = g.stride;
        if s < 2 || g.k == 0 || g.padding >= g.k {
            return None;
        }
        let oh = (g.h + 2 * g.padding).checked_sub(g.k)? / s + 1;
        let ow = (g.w + 2 * g.padding).checked_sub(g.k)? / s + 1;
        if (oh, ow) != (g.oh, g.ow) {
            return None;
        }
        let (np, kp) = (s.min(g.k), g.k.div_ceil(s));
        let g1 = Geom {
            b: g.b,
            c: np * np * g.c,
            h: g.oh + kp - 1,
            w: g.ow + kp - 1,
            k: kp,
            stride: 1,
            padding: 0,
            oh: g.oh,
            ow: g.ow,
        };
        Some(Phases { g: *g, np, g1 })
    }

    /// Channel `(a, b, ch)` of the phase image: channel `ch` of phase `(a, b)`.
    pub(super) fn channel(&self, a: usize, b: usize, ch: usize) -> usize {
        (a * self.np + b) * self.g.c + ch
    }

    /// Every `(a, b, ch)`.
    fn phase_channels(&self) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
        let (np, c) = (self.np, self.g.c);
        (0..np).flat_map(move |a| (0..np).flat_map(move |b| (0..c).map(move |ch| (a, b, ch))))
    }

    /// The phases' columns `v0..` (16 of them) of row `u` of phase `(a, b)`: the input row they
    /// come from (`None` off the image), the lanes on it, and their input columns.
    fn source(
        &self,
        (a, b): (usize, usize),
        u: usize,
        v0: usize,
    ) -> Option<(usize, __mmask16, __m512i)> {
        let (g, g1) = (&self.g, &self.g1);
        let (s, p) = (g.stride, g.padding);
        let i = (s * u + a).checked_sub(p).filter(|&i| i < g.h)?;
        // Columns v with j = s·v + b − p in 0..W, and v < W1.
        let lo = p.saturating_sub(b).div_ceil(s);
        let hi = (g.w + p).saturating_sub(b).div_ceil(s).min(g1.w);
        // Lanes l with lo ≤ v0 + l < hi.
        let below = |n: usize| if n >= 16 { u16::MAX } else { (1u16 << n) - 1 };
        let on = below(hi.saturating_sub(v0)) & !below(lo.saturating_sub(v0));
        // SAFETY (of the intrinsics): register-only; callers run with AVX-512F.
        let j = unsafe {
            let lanes = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
            let base = (s * v0 + b) as i32 - p as i32;
            _mm512_add_epi32(
                _mm512_mullo_epi32(lanes, _mm512_set1_epi32(s as i32)),
                _mm512_set1_epi32(base),
            )
        };
        Some((i, on, j))
    }

    /// Samples `b0..b0 + bc` of the contiguous `x` (`[B, C, H, W]`) as the phase images' NHWC
    /// bf16 grid (cells `H1 × W1`, a row of all `np² · C` channels per position, no padding:
    /// the phases hold the input's). Positions off the image are not written: `out` must hold
    /// zeros there already, as for [`super::layout::to_nhwc`].
    pub(super) fn to_grid(&self, x: &[f32], (b0, bc): (usize, usize), out: &mut [u16]) {
        let (g, g1) = (&self.g, &self.g1);
        assert!(
            g.c.is_multiple_of(16)
                && x.len() >= (b0 + bc) * g.c * g.h * g.w
                && out.len() >= bc * g1.h * g1.w * g1.c,
            "phase grid: buffers too short"
        );
        // SAFETY: AVX-512F, BF16 and VL (the module's condition); gathers only from lanes on
        // the image (inside `x`), stores of positions inside the chunk's grid (asserted).
        unsafe { self.to_grid_avx512(x, (b0, bc), out) }
    }

    #[target_feature(enable = "avx512f,avx512bf16,avx512vl")]
    fn to_grid_avx512(&self, x: &[f32], (b0, bc): (usize, usize), out: &mut [u16]) {
        let (g, g1) = (&self.g, &self.g1);
        let (c, c1, hw) = (g.c, g1.c, g.h * g.w);
        let mut r = [_mm512_setzero_si512(); 16];
        for b in 0..bc {
            for phase in 0..self.np * self.np {
                let (a, bb) = (phase / self.np, phase % self.np);
                for c0 in (0..c).step_by(16) {
                    let plane = ((b0 + b) * c + c0) * hw;
                    for u in 0..g1.h {
                        for v0 in (0..g1.w).step_by(16) {
                            let Some((i, on, j)) = self.source((a, bb), u, v0) else {
                                continue;
                            };
                            for (ch, v) in r.iter_mut().enumerate() {
                                // SAFETY: lanes `on` read row i of channel c0 + ch at columns
                                // j, all on the image.
                                *v = unsafe {
                                    _mm512_castps_si512(_mm512_mask_i32gather_ps::<4>(
                                        _mm512_setzero_ps(),
                                        on,
                                        j,
                                        x.as_ptr().add(plane + ch * hw + i * g.w),
                                    ))
                                };
                            }
                            transpose16(&mut r);
                            let q = (b * g1.h + u) * g1.w + v0;
                            let at = self.channel(a, bb, c0);
                            for (jj, v) in r.iter().take((g1.w - v0).min(16)).enumerate() {
                                // SAFETY: position q + jj lies in the chunk's grid; 16 channels.
                                unsafe {
                                    let h = _mm512_cvtneps_pbh(_mm512_castsi512_ps(*v));
                                    _mm256_storeu_si256(
                                        out.as_mut_ptr().add((q + jj) * c1 + at).cast(),
                                        std::mem::transmute::<__m256bh, __m256i>(h),
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    /// Samples `b0..b0 + bc` of `x` as bf16 planes of the phase images on their grid, one of
    /// `stride` values per channel `(a, b, ch)`: what [`super::layout::to_planes`] writes for
    /// a stride-1 input. Positions off the image are not written (zeros already).
    pub(super) fn to_planes(
        &self,
        x: &[f32],
        (b0, bc): (usize, usize),
        stride: usize,
        out: &mut [u16],
    ) {
        let (g, g1) = (&self.g, &self.g1);
        assert!(
            x.len() >= (b0 + bc) * g.c * g.h * g.w
                && stride >= bc * g1.h * g1.w
                && out.len() >= g1.c * stride,
            "phase planes: buffers too short"
        );
        // SAFETY: as for `to_grid`; masked stores of the lanes on each plane's row.
        unsafe { self.to_planes_avx512(x, (b0, bc), stride, out) }
    }

    #[target_feature(enable = "avx512f,avx512bf16,avx512vl,avx512bw")]
    fn to_planes_avx512(
        &self,
        x: &[f32],
        (b0, bc): (usize, usize),
        stride: usize,
        out: &mut [u16],
    ) {
        let (g, g1) = (&self.g, &self.g1);
        let hw = g.h * g.w;
        for (a, bb, ch) in self.phase_channels() {
            let dst = self.channel(a, bb, ch) * stride;
            for b in 0..bc {
                let plane = ((b0 + b) * g.c + ch) * hw;
                for u in 0..g1.h {
                    for v0 in (0..g1.w).step_by(16) {
                        let Some((i, on, j)) = self.source((a, bb), u, v0) else {
                            continue;
                        };
                        let q = (b * g1.h + u) * g1.w + v0;
                        // SAFETY: lanes `on` on the image; the store masked to them, inside
                        // the plane (q + lane < bc · H1 · W1 ≤ stride).
                        unsafe {
                            let v = _mm512_mask_i32gather_ps::<4>(
                                _mm512_setzero_ps(),
                                on,
                                j,
                                x.as_ptr().add(plane + i * g.w),
                            );
                            let h = std::mem::transmute::<__m256bh, __m256i>(_mm512_cvtneps_pbh(v));
                            _mm256_mask_storeu_epi16(out.as_mut_ptr().add(dst + q).cast(), on, h);
                        }
                    }
                }
            }
        }
    }

    /// The input gradient `[B, C, H, W]` appended to `out` from the phases' gradients
    /// (`phases[a · np + b]`, `[B, C, H1, W1]` each): each pixel from the one phase that holds
    /// it, zero where none does.
    pub(super) fn input_grad(&self, phases: &[Vec<f32>], out: &mut Vec<f32>) {
        let (g, g1) = (&self.g, &self.g1);
        let (s, p, np) = (g.stride, g.padding, self.np);
        let phase_plane = g1.h * g1.w;
        out.reserve(g.b * g.c * g.h * g.w);
        for plane in 0..g.b * g.c {
            for i in 0..g.h {
                let at = out.len();
                out.resize(at + g.w, 0.0);
                let (a, u) = ((i + p) % s, (i + p) / s);
                if a >= np || u >= g1.h {
                    continue;
                }
                let row = &mut out[at..];
                for bb in 0..np {
                    let src = &phases[a * np + bb][plane * phase_plane + u * g1.w..][..g1.w];
                    // Columns j = s·v + bb − p on the image, v < W1.
                    let lo = p.saturating_sub(bb).div_ceil(s);
                    let hi = (g.w + p).saturating_sub(bb).div_ceil(s).min(g1.w);
                    for (v, &d) in src.iter().enumerate().take(hi).skip(lo) {
                        row[s * v + bb - p] = d;
                    }
                }
            }
        }
    }
}
