//! Distributed data parallel: every rank holds a full replica of the model, computes gradients on its
//! own shard of the data, and the gradients are averaged across ranks before each optimizer step.
//!
//! ```no_run
//! # use candle_core::{DType, Device, Tensor};
//! # use candle_nn::VarMap;
//! # use kolo_ddp::ddp::{Ddp, DdpOptions};
//! # fn build(vb: candle_nn::VarBuilder) -> candle_core::Result<candle_nn::Linear> { candle_nn::linear(4, 2, vb) }
//! # fn main() -> kolo_ddp::Result<()> {
//! let comm = kolo::init()?;
//! let varmap = VarMap::new();
//! build(candle_nn::VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu))?; // creates the parameters
//! let ddp = Ddp::new(&comm, &varmap, DdpOptions::default())?;     // checks ranks agree, copies rank 0's values
//! // build the model once from ddp.var_builder() (so gradients are sent while backward runs) ...
//! let model = build(ddp.var_builder(DType::F32, &Device::Cpu))?;
//! # let loss = Tensor::zeros((), DType::F32, &Device::Cpu)?;
//! let grads = ddp.backward(&loss)?; // ... and get gradients averaged over all ranks
//! # Ok(()) }
//! ```
//!
//! - Parameters are ordered by name (never hash-map order). At construction every rank's parameter
//!   names, shapes and types are compared with rank 0's (the first difference is an error on every
//!   rank), then rank 0's values are broadcast.
//! - Gradients travel in buckets (default 25 MiB; the first 1 MiB) filled in reverse parameter order,
//!   each averaged by an asynchronous all-reduce; with overlap on (the default) a bucket leaves as
//!   soon as backward has produced all its gradients, so communication overlaps the rest of
//!   backward. After the first step the buckets are re-laid in the order the gradients arrived
//!   (rank 0's, agreed by a broadcast; [`DdpOptions::rebuild_buckets`]), as PyTorch does: names
//!   that sort as strings (`layers.10` before `layers.2`) then no longer hold a bucket back. On a GPU with the
//!   job on NCCL, buckets stay in GPU memory and are reduced on NCCL's own stream
//!   ([`Ddp::buckets_on_gpu`]).
//! - [`Ddp::set_require_sync`] / [`Ddp::no_sync`] skip communication for gradient accumulation.
//! - A parameter without a gradient on some rank counts as zeros there; every rank sends the same
//!   buckets in the same order.
//! - BatchNorm running statistics (`VarMap` entries whose last name component is `running_mean` or
//!   `running_var`, [`is_buffer_name`]) are buffers: not averaged, broadcast from rank 0 after
//!   every synchronizing backward pass ([`DdpOptions::broadcast_buffers`], PyTorch's default) or
//!   by [`Ddp::sync_buffers`].
//! - Ranks with different numbers of batches: see [`join`] ([`Ddp::set_join`], [`Ddp::join`],
//!   [`Ddp::join_with`]).
//! - What happens to a bucket can be replaced by a communication hook ([`Ddp::register_comm_hook`],
//!   see [`comm_hook`]), e.g. fp16 or bf16 compression ([`Ddp::set_compression`]).

pub mod adasum_hook;
mod agree;
mod bucket;
mod bucket_buf;
pub mod comm_hook;
mod device_buckets;
mod hook;
pub mod join;
mod same_weights;
mod sync;

pub use adasum_hook::{AdasumHook, GradientReduce};
pub use bucket::BucketLayout;
pub use comm_hook::{
    AllReduceHook, BucketFuture, CommHook, CompressHook, Compression, GradBucket, Reduction,
};
pub use hook::{gradient_hooks, OnGradient};
pub use join::JoinReport;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Tensor, Var};
use candle_nn::{VarBuilder, VarMap};
use kolo::Communicator;

use kolo_nn::batch_norm::is_buffer_name;
use kolo_nn::vars::sorted_vars;

use crate::error::{Result, TrainError};
use crate::vars_comm;
use hook::HookedBackend;
use sync::Synchronizer;

/// Settings of [`Ddp`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DdpOptions {
    /// Bytes of gradients per all-reduce (default 25 MiB, PyTorch's default).
    pub bucket_bytes: usize,
    /// Send buckets while backward runs (needs the model built from [`Ddp::var_builder`]).
    pub overlap: bool,
    /// Bytes of the first bucket (default 1 MiB, PyTorch's): the last layers' gradients leave as
    /// soon as they are ready instead of waiting for a full bucket.
    pub first_bucket_bytes: usize,
    /// With overlap, re-lay the buckets after the first synchronizing pass in the order the
    /// gradients arrived (rank 0's order, agreed by a broadcast), as PyTorch's DDP rebuilds its
    /// buckets after the first iteration (default on). Host buckets only.
    pub rebuild_buckets: bool,
    /// After every synchronizing backward pass, copy rank 0's buffers (BatchNorm running
    /// statistics) to every rank, so that all ranks run the next forward pass with the same
    /// buffers (PyTorch's `broadcast_buffers`, default on; it broadcasts before each forward). In
    /// join mode buffers are broadcast once, from the last rank with data, when all have joined.
    pub broadcast_buffers: bool,
}

impl Default for DdpOptions {
    fn default() -> Self {
        DdpOptions {
            bucket_bytes: 25 << 20,
            overlap: true,
            first_bucket_bytes: 1 << 20,
            rebuild_buckets: true,
            broadcast_buffers: true,
        }
    }
}

/// Distributed data parallel over a candle `VarMap`.
pub struct Ddp {
    comm: Communicator,
    varmap: VarMap,
    params: Vec<(String, Var)>,
    buffers: Vec<(String, Var)>,
    opts: DdpOptions,
    require_sync: bool,
    sync: Arc<Mutex<Synchronizer>>,
    index: HashMap<String, usize>,
    join: join::JoinState,
    /// What the latest [`Ddp::var_builder`] handed out, which [`Ddp::refresh`] keeps current.
    handed: Mutex<Arc<Mutex<hook::Handed>>>,
    /// The parameters without a gradient in the last averaged pass, and whether that was said.
    unused: Mutex<(Vec<String>, bool)>,
}

impl std::fmt::Debug for Ddp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ddp")
            .field("rank", &self.comm.rank())
            .field("size", &self.comm.size())
            .field("params", &self.params.len())
            .field("buffers", &self.buffers.len())
            .field("opts", &self.opts)
            .field("comm_hook", &self.comm_hook_name())
            .finish()
    }
}

impl Ddp {
    /// Wraps the parameters of `varmap` (already created by building the model once): checks that every
    /// rank has the same parameters and broadcasts rank 0's values to all.
    pub fn new(comm: &Communicator, varmap: &VarMap, opts: DdpOptions) -> Result<Ddp> {
        let all = sorted_vars(varmap);
        let (buffers, params): (Vec<_>, Vec<_>) =
            all.into_iter().partition(|(n, _)| is_buffer_name(n));
        vars_comm::check_same_vars(comm, &params, "parameter")?;
        if params.is_empty() {
            return Err(TrainError::NoParameters { rank: comm.rank() });
        }
        let dtype = vars_comm::common_float_dtype(&params, "parameter")?;
        let numels: Vec<usize> = params.iter().map(|(_, v)| v.elem_count()).collect();
        let reverse: Vec<usize> = (0..numels.len()).rev().collect();
        let (elem, first) = (dtype.size_in_bytes(), opts.first_bucket_bytes.max(1));
        let layout = BucketLayout::in_order(&reverse, &numels, elem, first, opts.bucket_bytes);
        let names: Vec<String> = params.iter().map(|(n, _)| n.clone()).collect();
        let index = names
            .iter()
            .enumerate()
            .map(|(i, n)| (n.clone(), i))
            .collect();
        let mut sync = Synchronizer::new(comm.clone(), layout, names, dtype);
        if let Some((_, v)) = params.first() {
            sync.set_device_buckets(device_buckets::DeviceBuckets::on(
                comm,
                v.device(),
                params.len(),
            ));
        }
        let host_buckets = params.first().is_none_or(|(_, v)| v.device().is_cpu());
        if opts.overlap && opts.rebuild_buckets && comm.size() > 1 && host_buckets {
            sync.plan_rebuild(numels, elem, first, opts.bucket_bytes);
        }
        let ddp = Ddp {
            comm: comm.clone(),
            varmap: varmap.clone(),
            sync: Arc::new(Mutex::new(sync)),
            params,
            buffers,
            opts,
            require_sync: true,
            index,
            join: join::JoinState::default(),
            handed: Mutex::default(),
            unused: Mutex::default(),
        };
        ddp.broadcast_parameters(0)?;
        Ok(ddp)
    }

    /// Replaces the all-reduce of each gradient bucket by `hook` (see [`comm_hook`] for the
    /// contract), from the next pass on. Every rank registers the same hook. Hooks see f32 buckets:
    /// a model with f64 parameters is [`TrainError::Unsupported`].
    pub fn register_comm_hook(&mut self, hook: impl CommHook + 'static) -> Result<()> {
        self.set_comm_hook(Some(Arc::new(hook)))
    }

    /// Sets (`Some`) or removes (`None`: the built-in f32/f64 average) the communication hook,
    /// from the next pass on; see [`Ddp::register_comm_hook`].
    pub fn set_comm_hook(&mut self, hook: Option<Arc<dyn CommHook>>) -> Result<()> {
        if hook.is_some() {
            if let Some((name, v)) = self.params.iter().find(|(_, v)| v.dtype() != DType::F32) {
                return Err(TrainError::Unsupported {
                    what: format!(
                        "communication hooks on {:?} parameters ({name}); hooks reduce f32 buckets",
                        v.dtype()
                    ),
                });
            }
        }
        self.lock().set_hook(hook);
        Ok(())
    }

    /// Compresses the gradient all-reduces to 16 bits ([`Compression::Fp16`],
    /// [`Compression::Bf16`], see [`CompressHook`]), or turns compression off
    /// ([`Compression::None`]: the built-in average). Every rank sets the same compression.
    /// ```no_run
    /// # fn f(ddp: &mut kolo_ddp::ddp::Ddp) -> kolo_ddp::Result<()> {
    /// ddp.set_compression("fp16".parse()?)?;
    /// # Ok(()) }
    /// ```
    pub fn set_compression(&mut self, compression: Compression) -> Result<()> {
        self.set_comm_hook(compression.hook())
    }

    /// The name of the registered communication hook (`None`: the built-in average).
    pub fn comm_hook_name(&self) -> Option<String> {
        self.lock().hook_name()
    }

    /// The communicator.
    pub fn comm(&self) -> &Communicator {
        &self.comm
    }

    /// Trainable parameters, ordered by name (give these to the optimizer).
    pub fn params(&self) -> &[(String, Var)] {
        &self.params
    }

    /// Buffers (BatchNorm running statistics), ordered by name.
    pub fn buffers(&self) -> &[(String, Var)] {
        &self.buffers
    }

    /// Whether the gradient buckets stay on the GPU and go to the communicator's engine from there
    /// (the parameters are on the GPU of a job on NCCL, `KOLO_BACKEND=nccl`, and no communication
    /// hook is set); otherwise they travel through host memory.
    pub fn buckets_on_gpu(&self) -> bool {
        self.lock().on_device()
    }

    /// The bucket layout of the gradients.
    pub fn layout(&self) -> BucketLayout {
        self.lock().layout_clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Synchronizer> {
        self.sync.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn hooks_active(&self) -> bool {
        self.opts.overlap && self.require_sync && self.comm.size() > 1
    }

    /// A `VarBuilder` to build the model from, once (or anew each step: both train alike). With
    /// overlap on (and more than one rank), its parameters report their gradients as backward
    /// produces them; the weights the model holds are then copies, which
    /// [`DistributedOptimizer`](crate::distributed::DistributedOptimizer) refreshes after every step
    /// (with another optimizer, call [`Ddp::refresh`] after its step). A parameter asked for twice
    /// under one name (tied weights) is the same tensor both times.
    ///
    /// A name the `VarMap` did not hold when `Ddp::new` saw it is an error naming it (a layer
    /// added after `Ddp::new` would be neither synchronized nor trained).
    pub fn var_builder(&self, dtype: DType, device: &Device) -> VarBuilder<'static> {
        self.backend(None, dtype, device)
    }

    /// Like [`Ddp::var_builder`] for mixed precision: the trainable parameters come cast to
    /// `compute` (e.g. bf16) so the model computes in it, while the `VarMap` keeps the f32 master
    /// weights, which get the gradients (cast back to f32) and the optimizer's updates. Buffers
    /// (BatchNorm running statistics) stay f32. See [`crate::precision`].
    pub fn var_builder_in(&self, compute: DType, device: &Device) -> VarBuilder<'static> {
        self.backend(Some(compute), DType::F32, device)
    }

    fn backend(
        &self,
        compute: Option<DType>,
        dtype: DType,
        device: &Device,
    ) -> VarBuilder<'static> {
        let on_gradient = self.hooks_active().then(|| {
            let sync = self.sync.clone();
            Arc::new(move |index: usize, grad: &Tensor| {
                let mut s = sync.lock().unwrap_or_else(|p| p.into_inner());
                s.on_gradient(index, grad)
                    .map_err(|e| candle_core::Error::Msg(e.to_string()))
            }) as hook::TakeGradient
        });
        let handed = Arc::new(Mutex::new(hook::Handed::default()));
        *self.handed.lock().unwrap_or_else(|p| p.into_inner()) = handed.clone();
        let backend = HookedBackend {
            varmap: self.varmap.clone(),
            index: self.index.clone(),
            on_gradient,
            compute,
            handed,
            known_only: true,
        };
        VarBuilder::from_backend(Box::new(backend), dtype, device.clone())
    }

    /// A `VarBuilder` for evaluating: the parameters and buffers as they are now, detached from
    /// autograd (PyTorch's `torch.no_grad()`; see [`kolo_nn::vars::frozen_var_builder`]). A
    /// model built from it computes as the trained one does but records no graph, so each
    /// layer's activations are freed as the forward pass goes instead of being held to its end;
    /// it shares the weights' storage, so a model built once from it follows the optimizer's
    /// updates. Its forward passes never reach the gradient hooks.
    pub fn eval_var_builder(&self, dtype: DType, device: &Device) -> VarBuilder<'static> {
        kolo_nn::vars::frozen_var_builder(&self.varmap, dtype, device)
    }

    /// Copies the parameters' current values into the weights of the model built from the latest
    /// [`Ddp::var_builder`] (where it holds copies: hooked or cast weights), so that a model built
    /// once computes with the updated parameters. [`DistributedOptimizer`](crate::distributed::DistributedOptimizer)
    /// calls it after every step; call it yourself after stepping another optimizer on
    /// [`Ddp::params`] (or after setting parameters by hand) if you build the model once — a model
    /// that missed it fails its next backward pass with an error saying so.
    pub fn refresh(&self) -> Result<()> {
        let handed = self
            .handed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        hook::refresh(&handed)?;
        Ok(())
    }

    /// Whether the next backward passes average gradients (true by default).
    pub fn set_require_sync(&mut self, on: bool) {
        self.require_sync = on;
    }

    /// Runs `f` with gradient averaging off (gradient accumulation: average only on the last pass).
    pub fn no_sync<R>(&mut self, f: impl FnOnce(&mut Self) -> R) -> R {
        let before = self.require_sync;
        self.require_sync = false;
        let r = f(self);
        self.require_sync = before;
        r
    }

    /// The trainable parameters as candle variables, for a candle optimizer
    /// (`candle_nn::SGD::new(ddp.vars(), lr)`).
    pub fn vars(&self) -> Vec<Var> {
        self.params.iter().map(|(_, v)| v.clone()).collect()
    }

    /// `loss.backward()`, then (unless sync is off) the gradients averaged over all ranks — in join
    /// mode, over the ranks that still have data (see [`join`]).
    pub fn backward(&self, loss: &Tensor) -> Result<GradStore> {
        let sync = self.require_sync && self.comm.size() > 1;
        let hooks = self.hooks_active();
        // In join mode the count of active ranks goes first, ahead of the buckets backward launches.
        let count = if sync {
            self.start_active_count()
        } else {
            None
        };
        let timeline = {
            let mut s = self.lock();
            s.begin_pass(hooks, self.reduce_op());
            s.timeline().clone()
        };
        let mut grads = {
            let _s = timeline.span("backward");
            loss.backward()?
        };
        if sync {
            let _s = timeline.span("gradient sync");
            let divide_by = self
                .finish_active_count(count)
                .map_err(|e| self.join_hint(e))?;
            let mut s = self.lock();
            s.finish(&mut grads, &self.vars(), divide_by)
                .map_err(|e| self.join_hint(e))?;
            let unused = s.no_grad_names();
            drop(s);
            self.note_unused(unused);
            if self.opts.broadcast_buffers && !self.buffers.is_empty() && !self.join_enabled() {
                let _s = timeline.span("buffer broadcast");
                self.sync_buffers_from(0)?;
            }
        }
        Ok(grads)
    }

    /// The learning rate this rank steps with after the next averaged backward pass (or
    /// [`Ddp::sync_gradients`]), which then checks that every rank passed the same one and fails
    /// on every rank with [`TrainError::LearningRatesDiffer`](crate::TrainError) naming each
    /// rank's rate where they differ: replicas stepped with different rates hold different
    /// weights from then on, and nothing else would say so. The check rides on the pass's last
    /// all-reduce (no collective of its own). [`DistributedOptimizer`](crate::distributed::DistributedOptimizer)
    /// calls it before every averaged pass; a loop with its own optimizer calls it with that
    /// optimizer's rate before [`Ddp::backward`].
    pub fn check_learning_rate(&self, lr: f64) {
        self.lock().check_lr(lr);
    }

    /// The parameters that got no gradient on this rank in the last averaged backward pass (or
    /// [`Ddp::sync_gradients`]) and were averaged as zeros: parameters the loss does not depend
    /// on (PyTorch's `find_unused_parameters` finds these). One that no rank used gets no
    /// gradient at all, so no optimizer steps it. The first pass with any says so on stderr,
    /// naming them.
    pub fn unused_parameters(&self) -> Vec<String> {
        self.unused
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .0
            .clone()
    }

    fn note_unused(&self, names: Vec<String>) {
        let mut u = self.unused.lock().unwrap_or_else(|p| p.into_inner());
        if !names.is_empty() && !u.1 {
            u.1 = true;
            let shown: Vec<&str> = names.iter().take(8).map(String::as_str).collect();
            let more = if names.len() > 8 { ", ..." } else { "" };
            eprintln!(
                "kolo-ddp: rank {}: {} of {} parameters got no gradient in this backward pass and \
                 count as zeros in the average, or get no gradient where no rank used them (said \
                 once; Ddp::unused_parameters lists them after each pass): \
                 {}{more}. The loss does not depend on them: a layer the forward pass skipped, or \
                 an operation without a backward pass on the way (candle_nn's LayerNorm on a \
                 contiguous input and ops::softmax_last_dim are fused kernels without one: \
                 ops::layer_norm_slow and ops::softmax have it)",
                self.comm.rank(),
                names.len(),
                self.params.len(),
                shown.join(", ")
            );
        }
        u.0 = names;
    }

    /// Records backward passes, gradient waits and every bucket's reduction on `timeline` (see
    /// [`crate::timeline`]); [`Timeline::disabled`](crate::timeline::Timeline::disabled) stops.
    pub fn set_timeline(&self, timeline: crate::timeline::Timeline) {
        self.lock().set_timeline(timeline);
    }

    /// The timeline set with [`Ddp::set_timeline`] (disabled by default).
    pub fn timeline(&self) -> crate::timeline::Timeline {
        self.lock().timeline().clone()
    }

    /// Averages the gradients in `grads` over all ranks (e.g. gradients accumulated over several
    /// passes), bucket by bucket — in join mode, over the ranks that still have data.
    pub fn sync_gradients(&self, grads: &mut GradStore) -> Result<()> {
        if self.comm.size() <= 1 {
            return Ok(());
        }
        let count = self.start_active_count();
        let divide_by = self
            .finish_active_count(count)
            .map_err(|e| self.join_hint(e))?;
        let mut s = self.lock();
        let timeline = s.timeline().clone();
        let _span = timeline.span("gradient sync");
        s.begin_pass(false, self.reduce_op());
        s.finish(grads, &self.vars(), divide_by)
            .map_err(|e| self.join_hint(e))?;
        let unused = s.no_grad_names();
        drop(s);
        drop(_span);
        self.note_unused(unused);
        Ok(())
    }

    /// Copies `vars` of rank `root` to every rank: one flat broadcast per type.
    fn broadcast_vars(&self, vars: &[(String, Var)], root: usize) -> Result<()> {
        for dtype in [DType::F32, DType::F64] {
            let group: Vec<&Var> = vars
                .iter()
                .map(|(_, v)| v)
                .filter(|v| v.dtype() == dtype)
                .collect();
            match dtype {
                DType::F64 => vars_comm::broadcast_vars::<f64>(&self.comm, &group, root)?,
                _ => vars_comm::broadcast_vars::<f32>(&self.comm, &group, root)?,
            }
        }
        Ok(())
    }

    /// Copies the parameters and buffers of rank `root` to every rank.
    pub fn broadcast_parameters(&self, root: usize) -> Result<()> {
        self.broadcast_vars(&self.params, root)?;
        self.refresh()?;
        self.sync_buffers_from(root)
    }

    /// Copies the buffers (BatchNorm running statistics) of rank 0 to every rank.
    pub fn sync_buffers(&self) -> Result<()> {
        self.sync_buffers_from(0)
    }

    fn sync_buffers_from(&self, root: usize) -> Result<()> {
        self.broadcast_vars(&self.buffers, root)
    }
}

impl Synchronizer {
    fn layout_clone(&self) -> BucketLayout {
        self.layout_ref().clone()
    }
}
