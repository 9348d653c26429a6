//! SGD's update written into the parameter and momentum buffers in place, as PyTorch's
//! `torch.optim.SGD` does (`buf.mul_(momentum).add_(d_p, alpha=1 - dampening)`,
//! `param.add_(d_p, alpha=-lr)`): two passes over contiguous memory per variable, no
//! temporaries. The out-of-place form (candle's `affine`, `+`, `-`, then [`Var::set`]) reads and
//! writes every value about six times and allocates four tensors of the variable's size.
//!
//! Both passes are candle in-place ops ([`InplaceOp3`]), which take the destination's storage
//! lock and refuse operands that share its storage. They run on contiguous f32 / f64 tensors of
//! one shape on the CPU; [`applies`] says whether a variable qualifies (the optimizer falls back
//! to the out-of-place form where it does not).
//!
//! [`Var::set`]: candle_core::Var::set

use candle_core::{CpuStorage, DType, InplaceOp3, Layout, Result, Tensor, WithDType};

/// Whether the in-place passes can update `p` (the variable's tensor) from `g` and `buf`.
pub(super) fn applies(p: &Tensor, g: &Tensor, buf: Option<&Tensor>) -> bool {
    let fits = |t: &Tensor| {
        t.device().is_cpu()
            && t.dtype() == p.dtype()
            && t.shape() == p.shape()
            && t.layout().is_contiguous()
    };
    matches!(p.dtype(), DType::F32 | DType::F64) && fits(p) && fits(g) && buf.is_none_or(fits)
}

/// `buf = d` on the first step, `buf = momentum · buf + (1 − dampening) · d` after it, where
/// `d = g + weight_decay · p`. Destination `buf`; operands `[g, p]`.
pub(super) struct MomentumPass {
    pub(super) momentum: f64,
    pub(super) dampening: f64,
    pub(super) weight_decay: f64,
    pub(super) first: bool,
}

/// `p −= lr · step`, where `step` is `d = g + weight_decay · p` without momentum, `buf` with
/// momentum, `d + momentum · buf` with Nesterov momentum. Destination `p`; operands `[g, buf]`
/// (`buf` is not read without momentum: pass `g` again).
pub(super) struct ParamPass {
    pub(super) lr: f64,
    pub(super) weight_decay: f64,
    /// `(momentum, nesterov)`, or `None` without momentum.
    pub(super) momentum: Option<(f64, bool)>,
}

/// The operand slices of an in-place pass: every operand distinct from the destination,
/// contiguous and as long as it (checked again here: [`applies`] is a promise, this the proof).
fn operands<'a, T: WithDType, const N: usize>(
    name: &str,
    dst_len: usize,
    srcs: [(&'a CpuStorage, &Layout); N],
) -> Result<[&'a [T]; N]> {
    let mut out = [&[][..]; N];
    for (i, (s, l)) in srcs.into_iter().enumerate() {
        let v = s.as_slice::<T>()?;
        match l.contiguous_offsets() {
            Some((a, b)) if b - a == dst_len => out[i] = &v[a..b],
            _ => candle_core::bail!("{name}: operand {i} is not a contiguous {dst_len} values"),
        }
    }
    Ok(out)
}

/// The destination's values (contiguous, see [`operands`]).
fn destination<'a, T>(name: &str, v: &'a mut [T], l: &Layout) -> Result<&'a mut [T]> {
    match l.contiguous_offsets() {
        Some((a, b)) if b <= v.len() => Ok(&mut v[a..b]),
        _ => candle_core::bail!("{name}: the destination is not contiguous"),
    }
}

impl MomentumPass {
    fn run<T: WithDType>(&self, buf: &mut [T], srcs: [(&CpuStorage, &Layout); 2]) -> Result<()> {
        let name = self.name();
        let [g, p] = operands::<T, 2>(name, buf.len(), srcs)?;
        let (mu, keep) = (
            T::from_f64(self.momentum),
            T::from_f64(1.0 - self.dampening),
        );
        let wd = T::from_f64(self.weight_decay);
        match (self.first, self.weight_decay != 0.0) {
            (true, false) => buf.copy_from_slice(g),
            (true, true) => {
                for ((b, &g), &p) in buf.iter_mut().zip(g).zip(p) {
                    *b = g + wd * p;
                }
            }
            (false, false) => {
                for (b, &g) in buf.iter_mut().zip(g) {
                    *b = mu * *b + keep * g;
                }
            }
            (false, true) => {
                for ((b, &g), &p) in buf.iter_mut().zip(g).zip(p) {
                    *b = mu * *b + keep * (g + wd * p);
                }
            }
        }
        Ok(())
    }
}

impl ParamPass {
    fn run<T: WithDType>(&self, p: &mut [T], srcs: [(&CpuStorage, &Layout); 2]) -> Result<()> {
        let name = self.name();
        let [g, buf] = operands::<T, 2>(name, p.len(), srcs)?;
        let (lr, wd) = (T::from_f64(self.lr), T::from_f64(self.weight_decay));
        match self.momentum {
            None => {
                for (p, &g) in p.iter_mut().zip(g) {
                    *p -= lr * (g + wd * *p);
                }
            }
            Some((_, false)) => {
                for (p, &b) in p.iter_mut().zip(buf) {
                    *p -= lr * b;
                }
            }
            Some((mu, true)) => {
                let mu = T::from_f64(mu);
                for ((p, &g), &b) in p.iter_mut().zip(g).zip(buf) {
                    *p -= lr * (g + wd * *p + mu * b);
                }
            }
        }
        Ok(())
    }
}

/// The f32 / f64 dispatch, shared by both passes.
macro_rules! in_place_pass {
    ($ty:ty, $name:literal) => {
        impl InplaceOp3 for $ty {
            fn name(&self) -> &'static str {
                $name
            }

            fn cpu_fwd(
                &self,
                dst: &mut CpuStorage,
                l: &Layout,
                s2: &CpuStorage,
                l2: &Layout,
                s3: &CpuStorage,
                l3: &Layout,
            ) -> Result<()> {
                let srcs = [(s2, l2), (s3, l3)];
                match dst {
                    CpuStorage::F32(v) => self.run(destination($name, v, l)?, srcs),
                    CpuStorage::F64(v) => self.run(destination($name, v, l)?, srcs),
                    _ => candle_core::bail!("{}: only f32 and f64 are updated in place", $name),
                }
            }
        }
    };
}

in_place_pass!(MomentumPass, "kolo-sgd-momentum");
in_place_pass!(ParamPass, "kolo-sgd-param");
