//! What the batch-norm op's forward and backward passes share: the statistics and the loops.

use candle_core::{Result, WithDType};

use crate::ops::bn_loops;
use crate::ops::channel_stats::GradLink;

/// Where the statistics come from, which decides what backward returns.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    /// Computed inside from `x`: the full input gradient.
    Local,
    /// Given as the tail of the parameters: their gradient, and the input's unless `link` takes
    /// it to the statistics' backward pass.
    GivenStats,
}

/// What forward and backward share.
pub(super) struct Inner {
    pub(super) c: usize,
    /// Values per channel and sample.
    pub(super) s: usize,
    pub(super) relu: bool,
    /// The global count (1 for an empty global batch).
    pub(super) divisor: f64,
    pub(super) mean: Vec<f64>,
    pub(super) inv_std: Vec<f64>,
    pub(super) mode: Mode,
    /// Where the input gradient goes to the statistics' backward pass (given, tracked statistics
    /// from [`super::batch_norm_stats`]).
    pub(super) link: Option<GradLink>,
}

impl Inner {
    /// Length of the parameters (`[weight…, bias…]`, then the statistics when given).
    pub(super) fn params_len(&self) -> usize {
        match self.mode {
            Mode::Local => 2 * self.c,
            Mode::GivenStats => 4 * self.c + 1,
        }
    }

    /// `act(x·scale + shift [+ r])` with `scale`, `shift` from the statistics and `params`
    /// (`[weight…, bias…, …]`).
    pub(super) fn forward<T: WithDType>(
        &self,
        x: &[T],
        r: Option<&[T]>,
        p: &[f64],
    ) -> Result<Vec<T>> {
        let c = self.c;
        if p.len() != self.params_len() {
            candle_core::bail!("kolo-batch-norm: {} parameters for {c} channels", p.len());
        }
        let scale: Vec<T> = (0..c)
            .map(|ch| T::from_f64(p[ch] * self.inv_std[ch]))
            .collect();
        let shift: Vec<T> = (0..c)
            .map(|ch| T::from_f64(p[c + ch] - self.mean[ch] * self.inv_std[ch] * p[ch]))
            .collect();
        if r.is_some_and(|r| r.len() != x.len()) {
            candle_core::bail!("kolo-batch-norm: residual and input differ in length");
        }
        Ok(bn_loops::normalize(x, r, &scale, &shift, self.s, self.relu))
    }

    /// Per channel `[Σg'…, Σg'·x…]` in f64, `g'` the gradient masked by `y > 0` under ReLU.
    pub(super) fn grad_sums<T: WithDType>(&self, g: &[T], x: &[T], y: &[T]) -> Vec<f64> {
        bn_loops::grad_sums(g, x, y, self.s, self.c, self.relu)
    }

    /// `dx = k1·g' − k2·(x − mean) − k3` per channel (`coef` holds k1, k2, k3 for each).
    pub(super) fn grad_input<T: WithDType>(
        &self,
        g: &[T],
        x: &[T],
        y: &[T],
        coef: &[f64],
    ) -> Vec<T> {
        bn_loops::grad_input(g, x, y, coef, &self.mean, self.s, self.relu)
    }
}
