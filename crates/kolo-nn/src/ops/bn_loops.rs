//! The element loops of batch normalization ([`super::batch_norm`]) and of the channel
//! statistics, compiled for the CPU's vector extension ([`super::simd`]).
//!
//! Arrays are `[B·C, s]`: row `i` belongs to channel `i mod C`. Sums run in f64 over
//! [`LANES`] independent partial sums per row, so that they vectorize (one running sum would be
//! a chain of dependent additions).

use candle_core::WithDType;

use super::simd::vectorized_fn;

/// Independent partial sums per row.
const LANES: usize = 8;

/// `(Σa, Σa·b)` over a row in f64, `a` masked by `mask > 0` when a mask is given.
#[inline(always)]
fn row_sums<T: WithDType>(a: &[T], b: &[T], mask: Option<&[T]>) -> (f64, f64) {
    let zero = T::zero();
    let (mut s, mut sb) = ([0f64; LANES], [0f64; LANES]);
    let len = a.len().min(b.len());
    let (a, b) = (&a[..len], &b[..len]);
    let mut add = |l: usize, v: T, w: T| {
        let v = v.to_f64();
        s[l] += v;
        sb[l] += v * w.to_f64();
    };
    match mask {
        None => {
            let (a8, b8) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
            let tail = a8.remainder().iter().zip(b8.remainder());
            for (a8, b8) in a8.zip(b8) {
                for l in 0..LANES {
                    add(l, a8[l], b8[l]);
                }
            }
            for (&v, &w) in tail {
                add(0, v, w);
            }
        }
        Some(m) => {
            let m = &m[..len];
            let keep = |v: T, m: T| if m > zero { v } else { zero };
            let (a8, b8, m8) = (
                a.chunks_exact(LANES),
                b.chunks_exact(LANES),
                m.chunks_exact(LANES),
            );
            let tail = a8
                .remainder()
                .iter()
                .zip(b8.remainder())
                .zip(m8.remainder());
            for ((a8, b8), m8) in a8.zip(b8).zip(m8) {
                for l in 0..LANES {
                    add(l, keep(a8[l], m8[l]), b8[l]);
                }
            }
            for ((&v, &w), &m) in tail {
                add(0, keep(v, m), w);
            }
        }
    }
    (s.iter().sum(), sb.iter().sum())
}

vectorized_fn! {
    /// Per channel `[Σx…, Σx²…]` (f64) of `x`, `[B·C, s]`.
    pub(crate) fn channel_sums<T: WithDType>(x: &[T], s: usize, c: usize) -> Vec<f64> {
        let mut out = vec![0f64; 2 * c];
        if s == 0 || c == 0 {
            return out;
        }
        for (i, row) in x.chunks_exact(s).enumerate() {
            let (sum, sum_sq) = row_sums(row, row, None);
            out[i % c] += sum;
            out[c + i % c] += sum_sq;
        }
        out
    }
}

vectorized_fn! {
    /// Per channel `[Σg'…, Σg'·x…]` (f64), `g'` the gradient `g` masked by `y > 0` when `relu`.
    pub(super) fn grad_sums<T: WithDType>(
        g: &[T],
        x: &[T],
        y: &[T],
        s: usize,
        c: usize,
        relu: bool,
    ) -> Vec<f64> {
        let mut out = vec![0f64; 2 * c];
        if s == 0 || c == 0 {
            return out;
        }
        for (i, ((g, x), y)) in g
            .chunks_exact(s)
            .zip(x.chunks_exact(s))
            .zip(y.chunks_exact(s))
            .enumerate()
        {
            let (sa, sb) = row_sums(g, x, relu.then_some(y));
            out[i % c] += sa;
            out[c + i % c] += sb;
        }
        out
    }
}

vectorized_fn! {
    /// `act(x·scale[c] + shift[c] [+ r])`, `act` ReLU when `relu` (NaN stays) or the identity.
    pub(super) fn normalize<T: WithDType>(
        x: &[T],
        r: Option<&[T]>,
        scale: &[T],
        shift: &[T],
        s: usize,
        relu: bool,
    ) -> Vec<T> {
        let c = scale.len().max(1);
        let zero = T::zero();
        if s == 0 {
            return vec![zero; x.len()];
        }
        // Written once, value by value (no zeroing pass first: a fresh buffer of an activation's
        // size is a pass of stores, or of page faults, of its own).
        let mut y = Vec::with_capacity(x.len());
        // `<=`: NaN (unordered) stays.
        let act = |v: T| if relu && v <= zero { zero } else { v };
        for (i, row) in x.chunks_exact(s).enumerate() {
            let (a, b) = (scale[i % c], shift[i % c]);
            match r {
                None => y.extend(row.iter().map(|&v| act(v * a + b))),
                Some(r) => {
                    let res = &r[i * s..(i + 1) * s];
                    y.extend(row.iter().zip(res).map(|(&v, &q)| act(v * a + b + q)));
                }
            }
        }
        y
    }
}

vectorized_fn! {
    /// `dx = k1·g' − k2·(x − mean) − k3` per channel (`coef` holds k1, k2, k3 for each), `g'`
    /// the gradient `g` masked by `y > 0` when `relu`.
    pub(super) fn grad_input<T: WithDType>(
        g: &[T],
        x: &[T],
        y: &[T],
        coef: &[f64],
        mean: &[f64],
        s: usize,
        relu: bool,
    ) -> Vec<T> {
        let c = mean.len().max(1);
        let zero = T::zero();
        if s == 0 {
            return vec![zero; x.len()];
        }
        // Grown a row at a time (zeroed in cache, then written; see `normalize`).
        let mut dx = Vec::with_capacity(x.len());
        for (i, ((g, x), y)) in g.chunks_exact(s).zip(x.chunks_exact(s)).zip(y.chunks_exact(s)).enumerate() {
            let ch = i % c;
            let [k1, k2, k3] = [coef[3 * ch], coef[3 * ch + 1], coef[3 * ch + 2]].map(T::from_f64);
            let m = T::from_f64(mean[ch]);
            let at = dx.len();
            dx.resize(at + s, zero);
            for (((o, &g), &x), &y) in dx[at..].iter_mut().zip(g).zip(x).zip(y) {
                let g = if relu && y <= zero { zero } else { g };
                *o = k1 * g - k2 * (x - m) - k3;
            }
        }
        dx
    }
}
