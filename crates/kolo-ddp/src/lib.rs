//! # kolo-ddp
//!
//! Data-parallel training on [candle](https://github.com/huggingface/candle) over a kolo
//! [`Communicator`](kolo::Communicator), for any candle model whose variables live in a
//! `VarMap`:
//!
//! - [`ddp`]: distributed data parallel ([`Ddp`](ddp::Ddp)): gradient buckets all-reduced while
//!   backward runs, communication hooks (fp16/bf16 compression, Adasum), join for uneven inputs;
//! - [`distributed`]: [`DistributedOptimizer`](distributed::DistributedOptimizer), an optimizer
//!   stepped after Ddp's backward, with gradient accumulation, a learning-rate schedule and the
//!   per-step loss check;
//! - [`optim`]: SGD and AdamW as PyTorch has them, and ZeRO stage 1
//!   ([`ShardedOptimizer`](optim::ShardedOptimizer));
//! - [`checkpoint`]: atomic checkpoints of parameters, optimizer state and progress (collectively
//!   for a whole job: `DistributedOptimizer::save_checkpoint` and `resume`, ZeRO's shards included);
//! - [`clip`]: gradient clipping by the global norm (averaged or sharded gradients);
//! - [`timeline`]: a Chrome trace of the job (Horovod's timeline);
//! - [`precision`]: bf16 compute with f32 master weights;
//! - [`replicas`]: single-process data parallel by hand (d2l's building blocks);
//! - [`device`] (and `gpu` with the `cuda` feature: GPU tensors on NCCL): where the tensors live.
//!
//! Everything that is communication of variables goes through one place ([`vars_comm`]): the
//! flat collective over a set of variables and the check that all ranks hold the same ones.
//!
//! The crate knows no model, dataset or run directory: models come from kolo-models or any
//! candle code, the `kolo train` loop (data, metrics, plots, progress) is kolo-train. Its only
//! kolo dependency besides kolo itself is kolo-nn, for which variables are buffers and their
//! order.
//!
//! ```
//! use candle_core::{DType, Device, Module, Tensor};
//! use candle_nn::{VarBuilder, VarMap};
//! use kolo_ddp::ddp::{Ddp, DdpOptions};
//! use kolo_ddp::distributed::DistributedOptimizer;
//! use kolo_ddp::optim::{self, OptimizerConfig};
//!
//! // Two ranks (threads here; processes under `kolo run` or torchrun), each with its own data,
//! // fit y = 2x + 1 together: gradients averaged over the ranks, parameters equal on both.
//! let weights = kolo::run_local(2, kolo::Config::default(), |comm| {
//!     let dev = Device::Cpu;
//!     let varmap = VarMap::new();
//!     candle_nn::linear(1, 1, VarBuilder::from_varmap(&varmap, DType::F32, &dev))?;
//!     let ddp = Ddp::new(&comm, &varmap, DdpOptions::default())?; // rank 0's initial values
//!     let model = candle_nn::linear(1, 1, ddp.var_builder(DType::F32, &dev))?; // built once
//!     let sgd = optim::build(ddp.params(), OptimizerConfig::sgd(0.1, 0.0))?;
//!     let mut opt = DistributedOptimizer::new(ddp, sgd, 1)?;
//!     let x = Tensor::new(&[[comm.rank() as f32], [comm.rank() as f32 + 0.5]], &dev)?;
//!     let y = ((&x * 2.0)? + 1.0)?;
//!     for _ in 0..200 {
//!         let loss = (model.forward(&x)? - &y)?.sqr()?.mean_all()?;
//!         opt.backward_step(&loss)?;
//!     }
//!     let w = varmap.get((1, 1), "weight", candle_nn::Init::Const(0.), DType::F32, &dev)?;
//!     Ok::<f32, kolo_ddp::TrainError>(w.flatten_all()?.to_vec1::<f32>()?[0])
//! });
//! let w: Vec<f32> = weights.into_iter().map(|r| r.unwrap().unwrap()).collect();
//! assert_eq!(w[0], w[1]);
//! assert!((w[0] - 2.0).abs() < 0.05, "{w:?}");
//! ```
#![warn(missing_docs)]

pub mod checkpoint;
pub mod clip;
pub mod ddp;
pub mod device;
pub mod distributed;
pub mod elastic;
mod error;
#[doc(hidden)]
pub mod fuzzing;
#[cfg(feature = "cuda")]
pub mod gpu;
mod lr_schedule;
pub mod optim;
pub mod precision;
pub mod replicas;
mod resume;
pub mod timeline;
pub mod vars_comm;

pub use error::{Result, TrainError};
