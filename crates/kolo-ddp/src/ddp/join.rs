//! Join: training on uneven inputs, where ranks run out of batches at different steps (PyTorch's
//! `DistributedDataParallel.join()`, Horovod's `hvd.join()`).
//!
//! Without join, a rank that finishes its batches early stops taking part in the gradient
//! all-reduces its peers still make: they fail with a collective mismatch, a timeout or a lost peer,
//! naming the ranks. With join:
//!
//! 1. Every rank turns join mode on with [`Ddp::set_join`] before its first step (all ranks alike:
//!    join mode changes the collectives of a step, so a rank without it is reported as a mismatch).
//! 2. While a rank has data it trains as usual. Each synchronizing [`Ddp::backward`] (or
//!    [`Ddp::sync_gradients`]) starts with a one-integer all-reduce (sum) counting the ranks still
//!    active, sent asynchronously ahead of the gradient buckets so communication still overlaps
//!    backward. Gradients are summed and divided by that count: the mean over the ranks that had a
//!    batch at this step, not over the world size.
//! 3. A rank out of data calls [`Ddp::join_with`] (or [`Ddp::join`]). It counts itself out (adds 0)
//!    and, for every step its peers still take, makes exactly the collectives they make: the count,
//!    then every gradient bucket all-reduce, same sizes, same order, contributing zeros. When the
//!    count reaches 0 every rank has joined, and all return together.
//!
//! # Keeping the replicas equal
//!
//! [`Ddp::join_with`] hands the joined rank, at every step it shadows, the same averaged gradients
//! the active ranks receive; the closure steps the optimizer with them. So parameters **and
//! optimizer state** (momentum, Adam moments, step counts, learning-rate schedules) stay identical on
//! every rank without any extra communication, and training can simply go on for the next epoch or
//! be checkpointed from any rank. This is the recommended form. Buffers (BatchNorm running
//! statistics) are not updated by a rank without data, so at the end they are broadcast from a rank
//! that was active at the last step.
//!
//! [`Ddp::join`] is PyTorch's form: the joined rank only shadows; at the end parameters and buffers
//! are broadcast from a rank that was active at the last step. Parameters end equal, but the joined
//! ranks' optimizer state lags behind (it missed the last steps' updates); prefer `join_with` when
//! optimizer state matters (momentum, Adam).
//!
//! Both return a [`JoinReport`]. Afterwards join mode stays on and the next epoch can start.
//!
//! # Gradient accumulation and other collectives
//!
//! Only synchronizing calls are steps: passes under [`Ddp::no_sync`] communicate nothing, so
//! accumulation works unchanged; a joined rank shadows the final [`Ddp::sync_gradients`] (or
//! synchronizing `backward`) of each accumulated step. A rank that runs out of data in the middle
//! of an accumulation should first synchronize what it has accumulated (an active step), then join
//! ([`DistributedOptimizer::join`](crate::distributed::DistributedOptimizer::join) does so). The
//! `pre_step` hook below runs once per synchronizing step, so with accumulation a loop's own
//! collectives must come once per step too (not once per pass) for joined ranks to match them.
//! Collectives other than Ddp's made between steps (metrics, [`Ddp::sync_buffers`],
//! [`check_loss`](crate::distributed::check_loss)) are not shadowed by themselves: a joined rank
//! would be reported as a mismatch. Make them after `join` returns, or have the joined rank make
//! the matching calls in the `pre_step` hook of [`Ddp::join_with_pre_step`]. For the per-step loss
//! check there is [`check_loss_active`](crate::distributed::check_loss_active): active ranks pass
//! their loss, joined ranks `None`, and the mean and the non-finite check cover only the active
//! ranks.
//!
//! # Example
//!
//! ```no_run
//! # use candle_core::{DType, Device, Tensor};
//! # use candle_nn::{Module, Optimizer, VarMap, SGD};
//! # use kolo_ddp::ddp::{Ddp, DdpOptions};
//! # fn main() -> kolo_ddp::Result<()> {
//! # let comm = kolo::init()?;
//! # let varmap = VarMap::new();
//! # candle_nn::linear(4, 2, candle_nn::VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu))?;
//! # let my_batches: Vec<(Tensor, Tensor)> = Vec::new();
//! let mut ddp = Ddp::new(&comm, &varmap, DdpOptions::default())?;
//! let vars = ddp.params().iter().map(|(_, v)| v.clone()).collect();
//! let mut opt = SGD::new(vars, 0.1)?;
//! ddp.set_join(true); // on every rank, before the first step
//! for (x, y) in &my_batches {
//!     // this rank's shard: its length may differ between ranks
//!     let model = candle_nn::linear(4, 2, ddp.var_builder(DType::F32, &Device::Cpu))?;
//!     let loss = candle_nn::loss::mse(&model.forward(x)?, y)?;
//!     let grads = ddp.backward(&loss)?; // averaged over the ranks that still have data
//!     opt.step(&grads)?;
//! }
//! // Out of data: apply the others' averaged gradients until every rank is out.
//! let report = ddp.join_with(|grads| Ok(opt.step(grads)?))?;
//! println!("shadowed {} steps", report.shadowed_steps);
//! # Ok(()) }
//! ```
//!
//! With a per-step loss check (and [`DistributedOptimizer`](crate::distributed::DistributedOptimizer),
//! which has the same `set_join` / `join` / `join_with_pre_step`):
//!
//! ```no_run
//! # use candle_core::Tensor;
//! # use kolo_ddp::distributed::{check_loss_active, DistributedOptimizer};
//! # fn f(comm: &kolo::Communicator, dopt: &mut DistributedOptimizer<kolo_ddp::optim::Sgd>,
//! #      losses: Vec<Tensor>) -> kolo_ddp::Result<()> {
//! dopt.set_join(true);
//! let mut step = 0;
//! for loss in &losses {
//!     let value = f64::from(loss.to_scalar::<f32>()?);
//!     let _mean = check_loss_active(comm, step, Some(value))?; // mean over the active ranks
//!     dopt.backward_step(loss)?;
//!     step += 1;
//! }
//! dopt.join_with_pre_step(|| {
//!     step += 1;
//!     check_loss_active(comm, step - 1, None).map(|_| ())
//! })?;
//! # Ok(()) }
//! ```

use std::sync::atomic::{AtomicU64, Ordering};

use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Tensor};
use kolo::{ReduceOp, Work};

use super::Ddp;
use crate::error::{Result, TrainError};

/// Join-mode state of a [`Ddp`].
#[derive(Debug, Default)]
pub(super) struct JoinState {
    /// Whether join mode is on.
    enabled: bool,
    /// Synchronizing steps this rank took with data since join mode went on or the last join.
    active_steps: AtomicU64,
}

/// What a finished [`Ddp::join`] / [`Ddp::join_with`] saw.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JoinReport {
    /// Steps this rank shadowed after running out of data (0 on a rank that was active to the end).
    pub shadowed_steps: u64,
    /// Steps this rank took with data since join mode went on (or since the previous join); 0 in a
    /// world of one rank, where steps communicate nothing.
    pub active_steps: u64,
    /// A rank that was active at the last step: parameters (for [`Ddp::join`]) and buffers were
    /// broadcast from it. The highest such rank.
    pub last_active_rank: usize,
}

impl Ddp {
    /// Turns join mode on or off (see [`crate::ddp::join`]). Call it on every rank at the same point,
    /// before the first step of the loop that may run out of data unevenly. Turning it on or off
    /// resets the count of active steps.
    pub fn set_join(&mut self, on: bool) {
        self.join.enabled = on;
        self.join.active_steps.store(0, Ordering::Relaxed);
    }

    /// Whether join mode is on.
    pub fn join_enabled(&self) -> bool {
        self.join.enabled
    }

    /// The reduction of gradient buckets: sums divided by the active ranks in join mode.
    pub(super) fn reduce_op(&self) -> ReduceOp {
        if self.join.enabled {
            ReduceOp::Sum
        } else {
            ReduceOp::Avg
        }
    }

    /// In join mode, launches the count of active ranks (this one counts 1).
    pub(super) fn start_active_count(&self) -> Option<Work<Vec<i64>>> {
        if !self.join.enabled || self.comm.size() <= 1 {
            return None;
        }
        Some(self.comm.all_reduce_async(vec![1i64], ReduceOp::Sum))
    }

    /// `e`, or [`TrainError::JoinModeDiffers`] where it is the mismatch of a rank in join mode
    /// (whose step begins with the count of [`Ddp::start_active_count`]) and one not in it.
    pub(super) fn join_hint(&self, e: TrainError) -> TrainError {
        let TrainError::Comm(source) = e else {
            return e;
        };
        let counts = |c: &kolo::Call| {
            c.op == kolo::OpKind::AllReduce
                && c.dtype == Some(kolo::DType::I64)
                && c.reduce == Some(ReduceOp::Sum)
                && c.count == 1
        };
        let differs = match source.root_cause() {
            kolo::Error::Mismatch {
                rank,
                peer,
                local,
                remote,
                ..
            } if counts(local) != counts(remote) && counts(local) == self.join.enabled => {
                Some((*rank, *peer))
            }
            _ => None,
        };
        match differs {
            Some((rank, peer)) => TrainError::JoinModeDiffers {
                rank,
                peer,
                here: self.join.enabled,
                source,
            },
            None => TrainError::Comm(source),
        }
    }

    /// Waits for the count of [`Ddp::start_active_count`]: the number to divide the summed
    /// gradients by (None outside join mode).
    pub(super) fn finish_active_count(
        &self,
        count: Option<Work<Vec<i64>>>,
    ) -> Result<Option<usize>> {
        let Some(work) = count else {
            return Ok(None);
        };
        let n = work.wait()?.first().copied().unwrap_or(0);
        let size = self.comm.size();
        if n < 1 || n as u64 > size as u64 {
            return Err(TrainError::JoinCount {
                rank: self.comm.rank(),
                count: n,
                size,
            });
        }
        self.join.active_steps.fetch_add(1, Ordering::Relaxed);
        Ok(Some(n as usize))
    }

    /// Out of data (join mode): shadows the collectives of the ranks still training until every rank
    /// has joined, handing `step` the averaged gradients of each shadowed step — call the optimizer
    /// there, exactly as after [`Ddp::backward`], so parameters and optimizer state stay equal on
    /// every rank. At the end, buffers are broadcast from a rank active at the last step.
    ///
    /// Every rank calls this once it is out of data, including the last one (which returns at once
    /// with 0 shadowed steps). Errors if join mode is off.
    pub fn join_with<F>(&self, step: F) -> Result<JoinReport>
    where
        F: FnMut(&mut GradStore) -> Result<()>,
    {
        self.join_with_pre_step(|| Ok(()), step)
    }

    /// [`Ddp::join_with`] for training loops that make collectives of their own each step before
    /// backward (e.g. [`check_loss_active`](crate::distributed::check_loss_active)): `pre_step`
    /// makes the matching calls on the joined rank, once per step the others take **and once more**
    /// at the final round, where every rank has joined and calls it together. So the active ranks'
    /// loop body `own collectives → backward` meets `pre_step → shadowed backward` here.
    pub fn join_with_pre_step<P, F>(&self, pre_step: P, step: F) -> Result<JoinReport>
    where
        P: FnMut() -> Result<()>,
        F: FnMut(&mut GradStore) -> Result<()>,
    {
        let report = self.shadow(pre_step, Some(step))?;
        self.sync_buffers_from(report.last_active_rank)?;
        // `step` moved the parameters: a model built once computes with them from here on.
        self.refresh()?;
        Ok(report)
    }

    /// Out of data (join mode): like [`Ddp::join_with`] without an optimizer step (PyTorch's join).
    /// The joined rank only shadows; at the end parameters and buffers are broadcast from a rank
    /// active at the last step, so parameters end equal but this rank's optimizer state has missed
    /// the updates of the steps it shadowed.
    pub fn join(&self) -> Result<JoinReport> {
        let report = self.shadow(|| Ok(()), None::<fn(&mut GradStore) -> Result<()>>)?;
        self.broadcast_parameters(report.last_active_rank)?;
        Ok(report)
    }

    fn shadow<P, F>(&self, mut pre_step: P, mut step: Option<F>) -> Result<JoinReport>
    where
        P: FnMut() -> Result<()>,
        F: FnMut(&mut GradStore) -> Result<()>,
    {
        if !self.join.enabled {
            return Err(TrainError::InvalidArgument {
                arg: "join",
                reason: "join mode is off: call Ddp::set_join(true) on every rank before the \
                         first step"
                    .into(),
            });
        }
        let active_steps = self.join.active_steps.swap(0, Ordering::Relaxed);
        let (rank, size) = (self.comm.rank(), self.comm.size());
        let vars = self.vars();
        let (dtype, device) = vars.first().map_or((DType::F32, Device::Cpu), |v| {
            (v.dtype(), v.device().clone())
        });
        let mut shadowed_steps = 0u64;
        loop {
            pre_step()?;
            let mut count = [0i64];
            self.comm.all_reduce(&mut count, ReduceOp::Sum)?;
            let n = count[0];
            if n == 0 {
                break;
            }
            if n < 0 || n as u64 > size as u64 {
                return Err(TrainError::JoinCount {
                    rank,
                    count: n,
                    size,
                });
            }
            // An empty gradient store (candle has no public constructor): every parameter then
            // contributes zeros to the same buckets the active ranks send.
            let seed = Tensor::zeros((), dtype, &device)?;
            let mut grads = seed.backward()?;
            grads.remove(&seed);
            {
                let mut s = self.lock();
                s.begin_pass(false, ReduceOp::Sum);
                s.finish(&mut grads, &vars, Some(n as usize))?;
            }
            shadowed_steps += 1;
            if let Some(f) = step.as_mut() {
                f(&mut grads)?;
            }
        }
        // Every rank took the same number of steps, so the ranks with the most active steps were
        // active at the last one; pick the highest of them.
        let size_i = size as i64;
        let mut key = [active_steps as i64 * size_i + rank as i64];
        self.comm.all_reduce(&mut key, ReduceOp::Max)?;
        let last_active_rank = (key[0].rem_euclid(size_i)) as usize;
        Ok(JoinReport {
            shadowed_steps,
            active_steps,
            last_active_rank,
        })
    }
}
