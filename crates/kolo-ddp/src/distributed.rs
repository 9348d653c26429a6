//! Horovod's shape of data parallelism: a [`DistributedOptimizer`] wrapping any optimizer, plus
//! [`reduce_value`] for metrics, a learning-rate schedule (the linear scaling rule with warm-up, then cosine or step decay: [`LrSchedule`]),
//! and [`check_loss`], which stops every rank together when any rank's loss is not finite.

use candle_core::backprop::GradStore;
use candle_core::Tensor;
use kolo::{Communicator, ReduceOp};

use crate::ddp::{Ddp, JoinReport};
use crate::error::{Result, TrainError};
use crate::optim::DynOptimizer;

pub use crate::lr_schedule::{LrDecay, LrSchedule};

/// What [`DistributedOptimizer`] needs of an optimizer: a step from gradients and a learning rate.
/// Implemented for every `candle_nn::Optimizer` and for kolo's boxed optimizers.
pub trait StepOptimizer {
    /// Applies one update.
    fn step(&mut self, grads: &GradStore) -> candle_core::Result<()>;
    /// The learning rate.
    fn learning_rate(&self) -> f64;
    /// Sets the learning rate.
    fn set_learning_rate(&mut self, lr: f64);
}

impl<O: candle_nn::Optimizer> StepOptimizer for O {
    fn step(&mut self, grads: &GradStore) -> candle_core::Result<()> {
        candle_nn::Optimizer::step(self, grads)
    }
    fn learning_rate(&self) -> f64 {
        candle_nn::Optimizer::learning_rate(self)
    }
    fn set_learning_rate(&mut self, lr: f64) {
        candle_nn::Optimizer::set_learning_rate(self, lr)
    }
}

impl StepOptimizer for Box<dyn DynOptimizer> {
    fn step(&mut self, grads: &GradStore) -> candle_core::Result<()> {
        DynOptimizer::step(self.as_mut(), grads)
    }
    fn learning_rate(&self) -> f64 {
        DynOptimizer::learning_rate(self.as_ref())
    }
    fn set_learning_rate(&mut self, lr: f64) {
        DynOptimizer::set_learning_rate(self.as_mut(), lr)
    }
}

/// Reduces one number over all ranks (e.g. a loss or an accuracy) and returns the result on every rank.
#[track_caller]
pub fn reduce_value(comm: &Communicator, value: f64, op: ReduceOp) -> Result<f64> {
    let mut v = [value];
    comm.all_reduce(&mut v, op)?;
    Ok(v[0])
}

/// Gathers every rank's loss and step; if any loss is NaN or infinite every rank returns
/// [`TrainError::NonFiniteLoss`] naming the ranks, if the ranks passed different steps (one
/// skipped a batch or stepped twice) [`TrainError::StepsDiffer`], otherwise the mean loss.
#[track_caller]
pub fn check_loss(comm: &Communicator, step: u64, loss: f64) -> Result<f64> {
    // The step travels as two exact halves: an f64 holds integers up to 2^53 only.
    let mine = [loss, (step >> 32) as f64, (step & 0xffff_ffff) as f64];
    let mut all = vec![0.0f64; 3 * comm.size()];
    comm.all_gather(&mine, &mut all)?;
    let losses: Vec<f64> = all.chunks_exact(3).map(|c| c[0]).collect();
    let steps: Vec<u64> = all
        .chunks_exact(3)
        .map(|c| ((c[1] as u64) << 32) | c[2] as u64)
        .collect();
    let e = if losses.iter().any(|l| !l.is_finite()) {
        TrainError::NonFiniteLoss { step, losses }
    } else if steps.iter().any(|&s| s != step) {
        TrainError::StepsDiffer { steps }
    } else {
        return Ok(losses.iter().sum::<f64>() / losses.len() as f64);
    };
    comm.dump_flight_record_on_failure(&e.to_string());
    Err(e)
}

/// [`check_loss`] for join mode (uneven inputs, see [`crate::ddp::join`]): ranks with a batch pass
/// `Some(loss)`, ranks that have joined pass `None` (from the `pre_step` hook of
/// [`Ddp::join_with_pre_step`]). If any active rank's loss is NaN or infinite every rank returns
/// [`TrainError::NonFiniteLoss`] (joined ranks listed with 0); otherwise the mean over the active
/// ranks, or `None` when no rank is active.
#[track_caller]
pub fn check_loss_active(comm: &Communicator, step: u64, loss: Option<f64>) -> Result<Option<f64>> {
    let mine = [loss.unwrap_or(0.0), f64::from(u8::from(loss.is_some()))];
    let mut all = vec![0.0f64; 2 * comm.size()];
    comm.all_gather(&mine, &mut all)?;
    let active: Vec<f64> = all
        .chunks_exact(2)
        .filter(|c| c[1] != 0.0)
        .map(|c| c[0])
        .collect();
    if active.iter().any(|l| !l.is_finite()) {
        let losses = all.chunks_exact(2).map(|c| c[0]).collect();
        let e = TrainError::NonFiniteLoss { step, losses };
        comm.dump_flight_record_on_failure(&e.to_string());
        return Err(e);
    }
    if active.is_empty() {
        return Ok(None);
    }
    Ok(Some(active.iter().sum::<f64>() / active.len() as f64))
}

/// An optimizer whose steps use gradients averaged over all ranks.
///
/// With `backward_passes_per_step = k`, gradients of k consecutive backward passes are summed locally
/// (no communication) and averaged across ranks on the k-th, which then steps the optimizer — Horovod's
/// `backward_passes_per_step`. Scale the loss by 1/k for the mean over the passes.
pub struct DistributedOptimizer<O> {
    ddp: Ddp,
    opt: O,
    passes_per_step: usize,
    pass: usize,
    acc: Option<GradStore>,
    schedule: Option<LrSchedule>,
    steps: u64,
    max_grad_norm: Option<f64>,
    grad_norm: Option<f64>,
}

impl<O> std::fmt::Debug for DistributedOptimizer<O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DistributedOptimizer")
            .field("ddp", &self.ddp)
            .field("passes_per_step", &self.passes_per_step)
            .field("steps", &self.steps)
            .finish()
    }
}

impl<O: StepOptimizer> DistributedOptimizer<O> {
    /// Wraps `opt` (built over `ddp.params()`).
    pub fn new(ddp: Ddp, opt: O, backward_passes_per_step: usize) -> Result<Self> {
        if backward_passes_per_step == 0 {
            return Err(TrainError::InvalidArgument {
                arg: "backward_passes_per_step",
                reason: "must be at least 1".into(),
            });
        }
        Ok(DistributedOptimizer {
            ddp,
            opt,
            passes_per_step: backward_passes_per_step,
            pass: 0,
            acc: None,
            schedule: None,
            steps: 0,
            max_grad_norm: None,
            grad_norm: None,
        })
    }

    /// Clips the averaged gradients to the global L2 norm `max_norm` before every step (PyTorch's
    /// `clip_grad_norm_` between backward and `optimizer.step()`; see [`crate::clip`]); `None`
    /// turns clipping off. Every rank clips the same averaged gradients alike. A `max_norm` that is
    /// not a finite number above 0 is an error.
    pub fn set_max_grad_norm(&mut self, max_norm: Option<f64>) -> Result<()> {
        crate::clip::check_max_norm(max_norm)?;
        self.max_grad_norm = max_norm;
        Ok(())
    }

    /// The global norm of the averaged gradients of the last step, before clipping (set while
    /// clipping is on).
    pub fn last_grad_norm(&self) -> Option<f64> {
        self.grad_norm
    }

    /// Sets the learning rate from `schedule` before every step.
    pub fn with_schedule(mut self, schedule: LrSchedule) -> Self {
        self.schedule = Some(schedule);
        self
    }

    /// The data-parallel wrapper.
    pub fn ddp(&self) -> &Ddp {
        &self.ddp
    }

    /// The data-parallel wrapper, mutably: communication hooks, compression, timeline after
    /// wrapping.
    pub fn ddp_mut(&mut self) -> &mut Ddp {
        &mut self.ddp
    }

    /// The wrapped optimizer.
    pub fn inner(&self) -> &O {
        &self.opt
    }

    /// The wrapped optimizer, mutably (e.g. to restore its state).
    pub fn inner_mut(&mut self) -> &mut O {
        &mut self.opt
    }

    /// Optimizer steps taken.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// Sets the number of steps taken (when resuming).
    pub fn set_steps(&mut self, steps: u64) {
        self.steps = steps;
    }

    /// Turns join mode on or off on every rank alike (see [`crate::ddp::join`]): each step then
    /// averages over the ranks that still have data, and a rank out of data calls
    /// [`DistributedOptimizer::join`].
    pub fn set_join(&mut self, on: bool) {
        self.ddp.set_join(on);
    }

    /// Out of data (join mode): steps the optimizer with the averaged gradients of every step the
    /// other ranks still take (learning-rate schedule and step count included), until every rank
    /// has joined, so parameters and optimizer state stay equal on all ranks. Gradients accumulated
    /// by an unfinished step (fewer than `backward_passes_per_step` passes) are first averaged and
    /// applied as a step of their own.
    pub fn join(&mut self) -> Result<JoinReport> {
        self.join_with_pre_step(|| Ok(()))
    }

    /// [`DistributedOptimizer::join`] with a hook making, on the joined rank, the collectives the
    /// training loop makes before each backward (see [`Ddp::join_with_pre_step`]).
    pub fn join_with_pre_step(
        &mut self,
        pre_step: impl FnMut() -> Result<()>,
    ) -> Result<JoinReport> {
        if !self.ddp.join_enabled() {
            return Err(TrainError::InvalidArgument {
                arg: "join",
                reason: "join mode is off: call set_join(true) on every rank before the first step"
                    .into(),
            });
        }
        if let Some(mut acc) = self.acc.take() {
            self.ddp.sync_gradients(&mut acc)?;
            self.apply(&mut acc)?;
        }
        self.pass = 0;
        let (ddp, opt, schedule, steps) =
            (&self.ddp, &mut self.opt, self.schedule, &mut self.steps);
        let (max_norm, norm) = (self.max_grad_norm, &mut self.grad_norm);
        ddp.join_with_pre_step(pre_step, |grads| {
            if let Some(s) = schedule {
                opt.set_learning_rate(s.lr(*steps));
            }
            if let Some(m) = max_norm {
                let vars = ddp.params().iter().map(|(_, v)| v);
                *norm = Some(crate::clip::clip_local(grads, vars, m)?);
            }
            opt.step(grads)?;
            *steps += 1;
            Ok(())
        })
    }

    fn apply(&mut self, grads: &mut GradStore) -> Result<()> {
        if let Some(s) = self.schedule {
            self.opt.set_learning_rate(s.lr(self.steps));
        }
        if let Some(m) = self.max_grad_norm {
            let vars = self.ddp.params().iter().map(|(_, v)| v);
            self.grad_norm = Some(crate::clip::clip_local(grads, vars, m)?);
        }
        let timeline = self.ddp.timeline();
        let span = timeline.span("optimizer step");
        self.opt.step(grads)?;
        // A model built once from the Ddp's builder computes with copies of the weights.
        self.ddp.refresh()?;
        drop(span);
        self.steps += 1;
        self.pass = 0;
        Ok(())
    }

    /// Backward pass for `loss`; on the last pass of a step, averages gradients over ranks and steps
    /// the optimizer. Returns whether it stepped.
    pub fn backward_step(&mut self, loss: &Tensor) -> Result<bool> {
        self.pass += 1;
        if self.pass >= self.passes_per_step {
            // The rate `apply` steps with, checked alike on every rank by the averaged pass.
            let lr = match self.schedule {
                Some(s) => s.lr(self.steps),
                None => self.opt.learning_rate(),
            };
            self.ddp.check_learning_rate(lr);
        }
        let mut grads = if self.passes_per_step == 1 {
            self.ddp.backward(loss)?
        } else {
            let g = self.ddp.no_sync(|d| d.backward(loss))?;
            let acc = match self.acc.take() {
                None => g,
                Some(mut acc) => {
                    for (_, v) in self.ddp.params() {
                        let t = v.as_tensor();
                        let sum = match (acc.get(t), g.get(t)) {
                            (Some(a), Some(b)) => Some((a + b)?),
                            (None, Some(b)) => Some(b.clone()),
                            _ => None,
                        };
                        if let Some(s) = sum {
                            acc.insert(t, s);
                        }
                    }
                    acc
                }
            };
            if self.pass < self.passes_per_step {
                self.acc = Some(acc);
                return Ok(false);
            }
            let mut acc = acc;
            self.ddp.sync_gradients(&mut acc)?;
            acc
        };
        self.apply(&mut grads)?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_finite_loss_stops_every_rank() {
        let res = kolo::run_local(3, kolo::Config::default(), |c| {
            check_loss(&c, 7, if c.rank() == 1 { f64::NAN } else { 1.0 })
        });
        for r in res {
            match r {
                Ok(Err(TrainError::NonFiniteLoss { step: 7, losses })) => {
                    assert!(losses[1].is_nan());
                }
                other => panic!("{other:?}"),
            }
        }
        let ok = kolo::run_local(2, kolo::Config::default(), |c| {
            check_loss(&c, 0, c.rank() as f64)
        });
        for r in ok {
            assert!(matches!(r, Ok(Ok(m)) if (m - 0.5).abs() < 1e-12));
        }
    }
}
