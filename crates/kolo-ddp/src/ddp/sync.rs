//! The gradient synchronizer: fills bucket buffers from gradients, launches one asynchronous
//! all-reduce (average) per bucket, strictly in bucket order, and writes the averaged gradients back.
//!
//! Buckets are launched in order on every rank, whatever order gradients arrive in: a bucket starts
//! when all its gradients are in *and* every earlier bucket has started. A parameter that gets no
//! gradient on a rank (unused in that step) holds its bucket back until the end of backward, when it
//! is filled with zeros (or with the gradient candle computed, if the model was not built with hooks).
//! So every rank issues the same all-reduces in the same order — never a hang, never mixed buckets.
//! A last, small all-reduce says which parameters some rank used: one that no rank used gets no
//! gradient, not an average of zeros.
//!
//! With a [`CommHook`] registered, the hook replaces the all-reduce of each (f32) bucket: it is
//! called at the moment the bucket would have been launched, and its [`BucketFuture`] is waited on
//! where the all-reduce would have been.
//!
//! Parameters on the GPU of a communicator with device collectives (NCCL) keep their buckets on
//! the GPU ([`DeviceBuckets`]): same order, same launch rule, no host copies.

use std::sync::Arc;
use std::time::Instant;

use candle_core::backprop::GradStore;
use candle_core::{DType, Tensor, Var};
use kolo::{Communicator, ReduceOp, Work};

use super::agree;
use super::bucket::BucketLayout;
use super::bucket_buf::{hand_back, zeros, Buf};
use super::comm_hook::{BucketFuture, BucketParams, CommHook, GradBucket, Reduction};
use super::device_buckets::{DeviceBuckets, InFlight};
use crate::error::{Result, TrainError};
use crate::timeline::{BucketEvent, Timeline};

enum Pending {
    F32(Work<Vec<f32>>),
    F64(Work<Vec<f64>>),
    Hook(BucketFuture),
    /// A bucket reduced on the GPU.
    Device(InFlight),
    /// A bucket that could not be launched: the error surfaces where it is waited on.
    Failed(TrainError),
}

/// Waits for `w`; with the timeline on, also when it ran.
fn wait_work<T>(w: Work<Vec<T>>, timed: bool) -> Result<(Vec<T>, Option<kolo::WorkTimes>)> {
    if timed {
        let (r, t) = w.wait_timed();
        Ok((r?, Some(t)))
    } else {
        Ok((w.wait()?, None))
    }
}

pub(crate) struct Synchronizer {
    comm: Communicator,
    layout: BucketLayout,
    names: Vec<String>,
    dtype: DType,
    /// Whether gradient hooks feed this pass.
    active: bool,
    /// The reduction of this pass: `Avg` normally, `Sum` in join mode (divided by the active ranks in
    /// [`Synchronizer::finish`]).
    op: ReduceOp,
    bufs: Vec<Option<Buf>>,
    have: Vec<bool>,
    missing: Vec<usize>,
    next: usize,
    pending: Vec<Option<Pending>>,
    /// The communication hook (f32 buckets only); `None`: the built-in all-reduce.
    hook: Option<Arc<dyn CommHook>>,
    /// What each bucket holds, for the hook.
    params: Vec<Arc<BucketParams>>,
    /// Where bucket reductions are recorded.
    timeline: Timeline,
    /// When each bucket was launched (timeline on).
    launched: Vec<Option<Instant>>,
    /// Buckets on the GPU, when the parameters and the communicator's engine are there.
    device: Option<DeviceBuckets>,
    /// The parameters (indices) that got no gradient in this pass and count as zeros.
    no_grad: Vec<usize>,
    /// The order gradients arrived in during this pass (while a rebuild is pending).
    arrivals: Vec<usize>,
    /// The bucket rebuild still to do (see [`Synchronizer::plan_rebuild`]).
    rebuild: Option<Rebuild>,
    /// The learning rate the next synchronizing pass checks every rank agrees on ([`agree`]).
    lr: Option<f64>,
}

/// A pending rebuild of the buckets in the order gradients arrive (PyTorch's bucket rebuild after
/// the first iteration): what a layout needs, and how many synchronizing passes may still try.
#[derive(Clone, Debug)]
struct Rebuild {
    numels: Vec<usize>,
    elem_bytes: usize,
    first_bytes: usize,
    bucket_bytes: usize,
    tries: u8,
}

impl Synchronizer {
    pub fn new(comm: Communicator, layout: BucketLayout, names: Vec<String>, dtype: DType) -> Self {
        let n = layout.count();
        let bufs = layout.len.iter().map(|&l| Some(zeros(dtype, l))).collect();
        let params = bucket_params(&layout, &names);
        Synchronizer {
            device: None,
            no_grad: Vec::new(),
            arrivals: Vec::new(),
            rebuild: None,
            lr: None,
            timeline: Timeline::disabled(),
            launched: vec![None; n],
            hook: None,
            params,
            comm,
            missing: layout.buckets.iter().map(Vec::len).collect(),
            layout,
            have: vec![false; names.len()],
            names,
            dtype,
            active: false,
            op: ReduceOp::Avg,
            bufs,
            next: 0,
            pending: (0..n).map(|_| None).collect(),
        }
    }

    /// Sets the learning rate the next synchronizing pass checks (see [`agree`]).
    pub fn check_lr(&mut self, lr: f64) {
        self.lr = Some(lr);
    }

    pub fn layout_ref(&self) -> &BucketLayout {
        &self.layout
    }

    /// Re-lays the buckets in the order gradients arrive, at the end of one of the next `tries`
    /// synchronizing passes: the first in which rank 0 saw gradients arrive during backward. Rank
    /// 0's order is broadcast (one small broadcast per pass until then), so every rank builds the
    /// same layout; parameters that did not arrive go last. The first bucket holds at most
    /// `first_bytes`, the others `bucket_bytes`.
    pub fn plan_rebuild(
        &mut self,
        numels: Vec<usize>,
        elem_bytes: usize,
        first_bytes: usize,
        bucket_bytes: usize,
    ) {
        self.rebuild = Some(Rebuild {
            numels,
            elem_bytes,
            first_bytes,
            bucket_bytes,
            tries: 3,
        });
    }

    /// Replaces the layout (between passes).
    fn relayout(&mut self, layout: BucketLayout) {
        let n = layout.count();
        self.params = bucket_params(&layout, &self.names);
        self.bufs = layout
            .len
            .iter()
            .map(|&l| Some(zeros(self.dtype, l)))
            .collect();
        self.missing = layout.buckets.iter().map(Vec::len).collect();
        self.pending = (0..n).map(|_| None).collect();
        self.launched = vec![None; n];
        self.next = 0;
        self.layout = layout;
    }

    /// The rebuild exchange at the end of a synchronizing pass (see [`Synchronizer::plan_rebuild`]).
    fn try_rebuild(&mut self) -> Result<()> {
        let Some(plan) = self.rebuild.as_mut() else {
            return Ok(());
        };
        plan.tries -= 1;
        let p = self.names.len();
        let mut msg = vec![0i64; p + 1];
        if self.comm.rank() == 0 && !self.arrivals.is_empty() {
            let mut seen = vec![false; p];
            let arrived = self.arrivals.iter().copied();
            let order = arrived
                .chain((0..p).rev())
                .filter(|&i| !std::mem::replace(&mut seen[i], true));
            msg[0] = 1;
            for (k, i) in order.enumerate() {
                msg[k + 1] = i as i64;
            }
        }
        self.comm.broadcast(&mut msg, 0)?;
        if msg[0] != 1 {
            if plan.tries == 0 {
                self.rebuild = None;
            }
            return Ok(());
        }
        let order = permutation(&msg[1..]).ok_or_else(|| {
            TrainError::Comm(kolo::Error::Protocol {
                rank: self.comm.rank(),
                peer: 0,
                reason: "the bucket order rank 0 sent is not an order of the parameters".into(),
            })
        })?;
        let layout = BucketLayout::in_order(
            &order,
            &plan.numels,
            plan.elem_bytes,
            plan.first_bytes,
            plan.bucket_bytes,
        );
        self.rebuild = None;
        self.relayout(layout);
        Ok(())
    }

    /// Keeps the buckets on the GPU from the next pass on (see [`DeviceBuckets`]).
    pub fn set_device_buckets(&mut self, device: Option<DeviceBuckets>) {
        self.device = device;
    }

    /// Whether this pass's buckets stay on the GPU (a communication hook takes host buckets).
    pub fn on_device(&self) -> bool {
        self.device.is_some() && self.hook.is_none()
    }

    /// Sets the communication hook of the next passes (`None`: the built-in all-reduce).
    pub fn set_hook(&mut self, hook: Option<Arc<dyn CommHook>>) {
        self.hook = hook;
    }

    /// Records bucket reductions on `timeline`.
    pub fn set_timeline(&mut self, timeline: Timeline) {
        self.timeline = timeline;
    }

    /// The timeline bucket reductions are recorded on.
    pub fn timeline(&self) -> &Timeline {
        &self.timeline
    }

    /// The name of the communication hook, if one is set.
    pub fn hook_name(&self) -> Option<String> {
        self.hook.as_ref().map(|h| h.name().to_owned())
    }

    /// Starts a pass reducing with `op`; with `hooks`, gradients come from
    /// [`GradHook`](super::hook::GradHook)s.
    pub fn begin_pass(&mut self, hooks: bool, op: ReduceOp) {
        self.active = hooks;
        self.op = op;
        self.have.iter_mut().for_each(|h| *h = false);
        self.no_grad.clear();
        self.arrivals.clear();
        for (b, m) in self.missing.iter_mut().enumerate() {
            *m = self.layout.buckets[b].len();
        }
        self.next = 0;
        for (b, buf) in self.bufs.iter_mut().enumerate() {
            if buf.is_none() {
                *buf = Some(zeros(self.dtype, self.layout.len[b]));
            }
        }
        self.pending.iter_mut().for_each(|p| *p = None);
        if let Some(d) = self.device.as_mut() {
            d.clear();
        }
    }

    /// The names of the parameters that got no gradient in the last finished pass.
    pub fn no_grad_names(&self) -> Vec<String> {
        self.no_grad
            .iter()
            .map(|&p| self.names[p].clone())
            .collect()
    }

    fn copy_in(&mut self, index: usize, grad: Option<&Tensor>) -> Result<()> {
        let (b, range) = self.layout.slot[index].clone();
        if self.on_device() {
            if b < self.next {
                return Err(TrainError::LateGradient {
                    name: self.names[index].clone(),
                });
            }
            if let Some(d) = self.device.as_mut() {
                d.put(index, grad, (range.len(), self.dtype))?;
            }
            self.have[index] = true;
            self.missing[b] -= 1;
            return Ok(());
        }
        let Some(buf) = self.bufs[b].as_mut() else {
            return Err(TrainError::LateGradient {
                name: self.names[index].clone(),
            });
        };
        buf.put(range, grad)?;
        self.have[index] = true;
        self.missing[b] -= 1;
        Ok(())
    }

    fn launch(&mut self, b: usize) {
        self.launched[b] = self.timeline.now();
        if self.on_device() {
            if let Some(d) = self.device.as_mut() {
                let launched = d.launch(&self.comm, &self.layout.buckets[b], self.op);
                self.pending[b] = Some(match launched {
                    Ok(f) => Pending::Device(f),
                    Err(e) => Pending::Failed(e),
                });
            }
            return;
        }
        self.pending[b] = match self.bufs[b].take() {
            Some(Buf::F32(v)) => Some(match &self.hook {
                None => Pending::F32(self.comm.all_reduce_async(v, self.op)),
                Some(hook) => {
                    let bucket = GradBucket {
                        index: b,
                        data: v,
                        params: self.params[b].clone(),
                        reduction: if self.op == ReduceOp::Sum {
                            Reduction::Sum
                        } else {
                            Reduction::Average
                        },
                    };
                    // An error surfaces, typed, where the bucket is waited on.
                    Pending::Hook(
                        hook.reduce(bucket, &self.comm)
                            .unwrap_or_else(|e| BucketFuture::ready(Err(e))),
                    )
                }
            }),
            Some(Buf::F64(v)) => Some(Pending::F64(self.comm.all_reduce_async(v, self.op))),
            None => None,
        };
    }

    fn launch_ready(&mut self) {
        while self.next < self.layout.count() && self.missing[self.next] == 0 {
            self.launch(self.next);
            self.next += 1;
        }
    }

    /// Called by a hook with parameter `index`'s finished gradient. Returns whether it took it
    /// (into its bucket, whose average [`Synchronizer::finish`] puts in the gradients): outside a
    /// synchronizing pass it does not, and the gradient stays the parameter's.
    pub fn on_gradient(&mut self, index: usize, grad: &Tensor) -> Result<bool> {
        if !self.active {
            return Ok(false);
        }
        if self.have[index] {
            return Err(TrainError::LateGradient {
                name: self.names[index].clone(),
            });
        }
        self.copy_in(index, Some(grad))?;
        if self.rebuild.is_some() {
            self.arrivals.push(index);
        }
        self.launch_ready();
        Ok(true)
    }

    /// Completes the pass: fills what the hooks did not deliver from `grads` (zeros where a parameter
    /// has no gradient), launches the remaining buckets in order, waits for all, and replaces each
    /// parameter's gradient in `grads` with the average over ranks. With `divide_by` (join mode, where
    /// the pass reduced with `Sum`), each reduced bucket is divided by that number of active ranks.
    pub fn finish(
        &mut self,
        grads: &mut GradStore,
        vars: &[Var],
        divide_by: Option<usize>,
    ) -> Result<()> {
        self.active = false;
        for b in self.next..self.layout.count() {
            for i in 0..self.layout.buckets[b].len() {
                let p = self.layout.buckets[b][i];
                if !self.have[p] {
                    let g = grads.get(vars[p].as_tensor()).cloned();
                    if g.is_none() {
                        self.no_grad.push(p);
                    }
                    self.copy_in(p, g.as_ref())?;
                }
            }
            self.launch(b);
            self.next = b + 1;
        }
        // Which parameters some rank used: a byte each, the maximum over ranks, behind the buckets;
        // then the learning rate's agreement.
        let mut used = vec![1u8; self.names.len()];
        self.no_grad.iter().for_each(|&p| used[p] = 0);
        let lr = self.lr.take();
        agree::append(&mut used, lr);
        let used = self.comm.all_reduce_async(used, ReduceOp::Max);
        let timed = self.timeline.is_enabled();
        for b in 0..self.layout.count() {
            let (mut done, times) = match self.pending[b].take() {
                Some(Pending::F32(w)) => {
                    let (v, t) = wait_work(w, timed)?;
                    (Buf::F32(v), t)
                }
                Some(Pending::F64(w)) => {
                    let (v, t) = wait_work(w, timed)?;
                    (Buf::F64(v), t)
                }
                Some(Pending::Hook(f)) => {
                    let (v, t) = f.wait_timed(timed);
                    let v = v?;
                    if v.len() != self.layout.len[b] {
                        return Err(TrainError::CommHook {
                            hook: self.hook_name().unwrap_or_default(),
                            bucket: b,
                            reason: format!(
                                "returned {} elements for a bucket of {}",
                                v.len(),
                                self.layout.len[b]
                            ),
                        });
                    }
                    (Buf::F32(v), t)
                }
                Some(Pending::Device(f)) => {
                    let flat = f.wait()?;
                    self.device_done(b, flat, vars, divide_by, grads)?;
                    continue;
                }
                Some(Pending::Failed(e)) => return Err(e),
                None => continue,
            };
            if let Some(launched) = self.launched[b].take() {
                let bytes = self.layout.len[b] * self.dtype.size_in_bytes();
                let hooked = self.hook.as_ref().filter(|_| matches!(done, Buf::F32(_)));
                self.timeline.bucket(BucketEvent {
                    bucket: b,
                    bytes,
                    wire_bytes: match hooked {
                        Some(h) => h.wire_bytes(self.layout.len[b]),
                        None => Some(bytes),
                    },
                    hook: match hooked {
                        Some(h) => h.name().to_owned().into(),
                        None => "allreduce".into(),
                    },
                    launched,
                    times,
                    waited: Instant::now(),
                });
            }
            if let Some(n) = divide_by {
                // The same division `ReduceOp::Avg` makes, so join mode with every rank active
                // gives bit-identical gradients.
                match &mut done {
                    Buf::F32(v) => v.iter_mut().for_each(|x| *x /= n as f32),
                    Buf::F64(v) => v.iter_mut().for_each(|x| *x /= n as f64),
                }
            }
            hand_back(
                done,
                &self.layout.buckets[b],
                &self.layout.slot,
                vars,
                grads,
            )?;
        }
        // A parameter no rank used keeps no gradient, so that no optimizer steps it (weight decay,
        // momentum) — as with one worker, and as PyTorch's DDP leaves it.
        let used = used.wait()?;
        let (used, lr_tail) = used.split_at(used.len() - agree::BYTES);
        if !agree::agreed(lr_tail) {
            return Err(agree::disagreement(&self.comm, lr)?);
        }
        for (p, &u) in used.iter().enumerate() {
            if u == 0 {
                grads.remove(vars[p].as_tensor());
            }
        }
        self.try_rebuild()
    }

    /// Bucket `b`, reduced on the GPU: each parameter's gradient becomes its view of it.
    fn device_done(
        &mut self,
        b: usize,
        flat: Tensor,
        vars: &[Var],
        divide_by: Option<usize>,
        grads: &mut GradStore,
    ) -> Result<()> {
        if let Some(launched) = self.launched[b].take() {
            let bytes = self.layout.len[b] * self.dtype.size_in_bytes();
            self.timeline.bucket(BucketEvent {
                bucket: b,
                bytes,
                wire_bytes: Some(bytes),
                hook: "allreduce".into(),
                launched,
                times: None,
                waited: Instant::now(),
            });
        }
        let flat = match divide_by {
            Some(n) => (flat / n as f64)?,
            None => flat,
        };
        for &p in &self.layout.buckets[b] {
            let range = self.layout.slot[p].1.clone();
            let var = &vars[p];
            let t = flat
                .narrow(0, range.start, range.len())?
                .reshape(var.shape())?;
            let t = if t.dtype() == var.dtype() {
                t
            } else {
                t.to_dtype(var.dtype())?
            };
            grads.insert(var.as_tensor(), t);
        }
        Ok(())
    }
}

/// What each bucket of `layout` holds, for the communication hooks.
fn bucket_params(layout: &BucketLayout, names: &[String]) -> Vec<Arc<BucketParams>> {
    layout
        .buckets
        .iter()
        .map(|b| {
            Arc::new(BucketParams {
                indices: b.clone(),
                lengths: b.iter().map(|&p| layout.slot[p].1.len()).collect(),
                names: b.iter().map(|&p| names[p].clone()).collect(),
            })
        })
        .collect()
}

/// `values` as an order of `0..values.len()` (each index once), or `None`.
fn permutation(values: &[i64]) -> Option<Vec<usize>> {
    let mut seen = vec![false; values.len()];
    values
        .iter()
        .map(|&v| {
            let i = usize::try_from(v).ok().filter(|&i| i < seen.len())?;
            (!std::mem::replace(&mut seen[i], true)).then_some(i)
        })
        .collect()
}
